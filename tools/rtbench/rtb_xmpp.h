/*
 * rtb_xmpp: rtbench's XMPP client-to-server load (RFC 6120/6121 over plain TCP, SASL
 * SCRAM-SHA-256 by OpenSSL's libcrypto). Like tests/bench/xmpp_load.py it parses no XML:
 * each step waits for the end tag it expects in the byte stream, which is enough for a
 * server that answers a well-behaved client and keeps the client's CPU small beside the
 * server it shares the cores with.
 *
 * The commands (rtbench.c parses their flags; see its usage text):
 *   xlogin   login storm: -c connectors log in and out, -L logins in all;
 *   xidle    -c sessions logged in and held for -d seconds (with --go-stdin, a barrier
 *            for sampling the server's memory);
 *   xchat    --pairs P logged-in pairs chatting at --rate messages/s per pair, latency
 *            per second and overall; --storm N adds N logins during the chat;
 *   xroster  set-up: -c accounts each get the 18 neighbours i+-1..9 (mod -c) as contacts
 *            with subscription both, by subscribe/subscribed presences in two passes.
 * A login is: stream, SASL SCRAM-SHA-256, stream restart, bind, roster get, initial
 * presence. The client's salted password is cached per salt (RFC 5802 allows it), in
 * memory and in --salt-cache FILE across runs, so PBKDF2 runs once per account.
 */
#ifndef RTB_XMPP_H
#define RTB_XMPP_H

#include "rtbench.h"

/* 1 for the commands this module runs. */
int rtb_xmpp_cmd(rtb_cmd_t cmd);

/* rtb_worker_run for the XMPP commands; same contract. */
int rtb_xmpp_run(const rtb_opts_t *o, uint32_t proc, int go_fd, rtb_emit_fn emit, void *ctx);

/* The per-second line on stderr, from the merged totals now and a second ago. */
void rtb_xmpp_tick_line(uint64_t second, const rtb_report_t *now, const rtb_report_t *prev,
                        const rtb_hist_t *e2e_second);

/*
 * The final summary on stdout: one JSON line with --json, else text. worst_p99_ns and
 * worst_max_ns are the highest per-second chat p99 and max seen (0 when none).
 */
void rtb_xmpp_summary(const rtb_opts_t *o, const rtb_report_t *m, uint64_t cpu_us,
                      uint64_t worst_p99_ns, uint64_t worst_max_ns);

#endif

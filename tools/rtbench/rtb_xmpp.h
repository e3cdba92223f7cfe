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
 *            with subscription both, by subscribe/subscribed presences in two passes;
 *   xmuc     group chat (XEP-0045): -c occupants join --rooms R rooms (occupant i in room
 *            i % R, nick n<i>); --senders S of them (occupant j < S, in room j % R) send
 *            groupchat messages at --rate in all; every occupant counts what the room
 *            reflects to it (deliveries, latency, per-sender sequence gaps). With --hold
 *            the occupants log in (UP), wait for the go, then join and hold for -d s:
 *            the memory-per-room measurement.
 * A login is: stream, SASL SCRAM-SHA-256, stream restart, bind, roster get, initial
 * presence. The client's salted password is cached per salt (RFC 5802 allows it), in
 * memory and in --salt-cache FILE across runs, so PBKDF2 runs once per account.
 */
#ifndef RTB_XMPP_H
#define RTB_XMPP_H

#include "rtbench.h"

/*
 * xmuc's own options (set by rtbench.c's parser before any fork, so every worker sees them).
 */
typedef struct rtb_xmuc_opts_s {
    uint32_t rooms;       /* --rooms: occupant i joins room i % rooms (1) */
    uint32_t senders;     /* --senders: occupants 0..S-1 send (10; 0 with --hold) */
    int anon;             /* --anon: SASL ANONYMOUS instead of SCRAM (any XMPP command) */
    const char *muc_host; /* --muc-host: the service's domain (conference.<--domain>) */
    const char *room_fmt; /* --room: room name, %i = room index (r%i) */
} rtb_xmuc_opts_t;
extern rtb_xmuc_opts_t rtb_xmuc;

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

/* xmuc's per-second line and summary (the stats fields it uses: rtb_xmpp.c's xmuc part). */
void rtb_xmuc_tick_line(uint64_t second, const rtb_report_t *now, const rtb_report_t *prev,
                        const rtb_hist_t *e2e_second);
void rtb_xmuc_summary(const rtb_opts_t *o, const rtb_report_t *m, uint64_t cpu_us,
                      uint64_t worst_p99_ns, uint64_t worst_max_ns);

#endif

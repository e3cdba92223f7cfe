/*
 * rtbench: an emqtt_bench-style MQTT load generator on libuv, with XMPP commands.
 *
 * rtbench.c parses flags, forks worker processes for --procs and aggregates their
 * reports; rtb_worker.c runs the MQTT clients of one process on one libuv loop, and
 * rtb_xmpp.c the XMPP sessions (rtb_xmpp.h); rtb_loop.c holds what the two share.
 */
#ifndef RTBENCH_H
#define RTBENCH_H

#include <stdint.h>
#include <sys/socket.h>

#include "rtb_hist.h"

/*
 * Every PUBLISH payload starts with this header, little-endian:
 *   u32 publisher index, u32 sequence number (per publisher and target topic),
 *   u64 send time in ns from CLOCK_MONOTONIC.
 * -s is the total payload size, so it can be no smaller than this.
 */
#define RTB_HDR_SIZE 16

#define RTB_MAX_IFADDR 64
#define RTB_MAX_PROCS 64

typedef enum rtb_cmd_e {
    RTB_CMD_CONN,
    RTB_CMD_SUB,
    RTB_CMD_PUB,
    RTB_CMD_FANIN,
    RTB_CMD_FANOUT,
    RTB_CMD_PAIRS,
    RTB_CMD_SEED,
    RTB_CMD_HS,
    RTB_CMD_XLOGIN,  /* XMPP, rtb_xmpp.c: login storm */
    RTB_CMD_XIDLE,   /* held sessions */
    RTB_CMD_XCHAT,   /* pairs chatting, optionally during a storm */
    RTB_CMD_XROSTER, /* set-up: 18-contact rosters */
    RTB_CMD_XMUC,    /* group chat rooms (XEP-0045): fan-out, or rooms held (--hold) */
} rtb_cmd_t;

#define RTB_MAX_PORTS 16

typedef struct rtb_opts_s {
    rtb_cmd_t cmd;
    const char *cmd_name;
    const char *host;                               /* -h */
    int port;                                       /* -p */
    struct sockaddr_storage addr;                   /* host:port, resolved once before any fork */
    struct sockaddr_storage ifaddr[RTB_MAX_IFADDR]; /* --ifaddr, port 0 */
    int nifaddr;
    /* --sub-ports / --pub-ports: subscriber (publisher) i connects to host:ports[i % n] (the
       nodes of a cluster), else to addr. */
    struct sockaddr_storage sub_addr[RTB_MAX_PORTS], pub_addr[RTB_MAX_PORTS];
    int nsub_addr, npub_addr;
    uint32_t count;            /* -c: clients (conn/sub/pub) or the scenario's main count */
    uint32_t start;            /* -n: first client sequence number */
    uint32_t conn_interval_ms; /* -i: between connection starts; 0 = as fast as allowed */
    double pub_interval_ms;    /* -I: between publishes per client; 0 = unpaced */
    const char *topic;         /* -t, with %i and %c */
    int qos;                   /* -q */
    uint32_t size;             /* -s: total payload bytes */
    uint64_t limit;            /* -L: messages per client, 0 = unlimited */
    uint16_t keepalive;        /* -k, seconds */
    int clean;                 /* -C */
    int version;               /* -V: 3, 4 or 5 */
    const char *user;          /* -u */
    const char *pass;          /* -P */
    double duration_s;         /* -d: run phase length */
    uint32_t procs;            /* --procs */
    uint32_t inflight;         /* --inflight: unacked QoS1/2 PUBLISH per publisher */
    uint32_t window;           /* --window: closed loop, messages not yet received */
    uint32_t coalesce_us;      /* --coalesce-us: closed loop, pause of a quiet iteration */
    double rate;               /* --rate: open loop, messages/s over all publishers */
    uint32_t pubs;             /* --pubs (fanin, seed) */
    uint32_t subs;             /* --subs (fanout, seed) */
    uint32_t copies;           /* --copies (seed): subscribers per topic, 1 by default */
    double drain_s;            /* --drain: wait for stragglers after the run */
    double conn_timeout_s;     /* --conn-timeout: CONNACK/SUBACK deadline per client */
    uint32_t conn_parallel;    /* --conn-parallel: connects in flight per process */
    int64_t test_skip_seq;     /* --test-skip-seq: publisher 0 pretends to send this seq */
    int json;                  /* --json */
    int allow_remote;          /* --allow-remote */
    int quiet;                 /* --quiet: no per-second lines */
    int go_stdin;              /* --go-stdin: once connected, publish after a line on stdin */
    int tls;                   /* --tls */
    const char *cafile;        /* --cafile: verify the server; NULL = no verification */
    const char *cert;          /* --cert: client certificate (mutual TLS), with --key */
    const char *key;           /* --key */
    const char *sni;           /* --sni: server name to send and verify */
    int tls_resume;            /* --tls-resume: resume the last session on reconnect */
    const char *ws;            /* --ws PATH: MQTT over WebSocket; NULL = none */
    char prefix[48];           /* client id prefix */
    /* XMPP commands (rtb_xmpp.h); -u is the account name with %i, -P its password. */
    const char *domain;     /* --domain: the XMPP host (localhost) */
    uint32_t accounts;      /* --accounts: xlogin's accounts, xchat's pairs and storm */
    uint32_t pairs;         /* --pairs (xchat) */
    uint32_t storm;         /* --storm (xchat): logins during the chat */
    int hold;               /* --hold: xchat's storm sessions stay logged in */
    int pairs_apart;        /* --pairs-apart: xchat's pairs in process 0, the storm in the rest */
    double leave_at_s;      /* --leave-at: xchat's held storm sessions all drop then (0: never) */
    const char *salt_cache; /* --salt-cache FILE: SCRAM salted passwords across runs */
} rtb_opts_t;

/* Counters of one process; all are summed across processes except where noted. */
typedef struct rtb_stats_s {
    uint64_t clients;        /* clients planned */
    uint64_t conn_ok;        /* CONNACK accepted */
    uint64_t conn_fail;      /* refused, timed out, or CONNACK rejected */
    uint64_t conn_lost;      /* dropped after CONNACK, before we closed */
    uint64_t sub_ok;         /* SUBACK granted */
    uint64_t sub_fail;       /* SUBACK refused or timed out */
    uint64_t sent;           /* PUBLISH written */
    uint64_t acked;          /* PUBACK (QoS1) or PUBCOMP (QoS2) received */
    uint64_t received;       /* PUBLISH delivered to our subscribers, duplicates included */
    uint64_t unique;         /* distinct (publisher, target, seq) deliveries per subscriber */
    uint64_t dups;           /* deliveries seen before */
    uint64_t ooo;            /* deliveries with a seq below one already seen */
    uint64_t gaps;           /* seqs below the highest seen that never arrived */
    uint64_t expected;       /* deliveries the publishers' sends should produce */
    uint64_t expected_known; /* 1 when expected is meaningful (scenarios); max, not sum */
    uint64_t foreign;        /* deliveries too short to carry our header */
    uint64_t proto_err;      /* malformed or unexpected packets, rejected acks */
    uint64_t tls_full;       /* TLS handshakes completed with a full handshake */
    uint64_t tls_resumed;    /* TLS handshakes that resumed a session */
    uint64_t hs_full;        /* hs: cycles up to CONNACK in the run phase, full TLS or none */
    uint64_t hs_resumed;     /* hs: the same with a resumed TLS session */
    uint64_t t_conn_first;   /* ns, first connection start (min) */
    uint64_t t_conn_last;    /* ns, last CONNACK (max) */
    uint64_t t_run_start;    /* ns, publishing began (min) */
    uint64_t t_run_end;      /* ns, publishing ended (max) */
    uint64_t t_recv_last;    /* ns, last delivery (max) */
    uint64_t roster_both;    /* XMPP: roster items with subscription both, at logins */
    uint64_t pbkdf2;         /* XMPP: salted passwords computed (not from the cache) */
    uint64_t cpu_us;         /* user+sys CPU of the process */
    uint64_t tick;           /* seconds elapsed, for the per-second lines */
} rtb_stats_t;

typedef struct rtb_report_s {
    rtb_stats_t s;
    rtb_hist_t e2e;  /* publish-to-delivery latency, ns */
    rtb_hist_t ack;  /* PUBLISH to PUBACK/PUBCOMP, ns */
    rtb_hist_t conn; /* connect start to CONNACK, ns */
} rtb_report_t;

/* Report kinds: once per second, once when connected (with --procs), once at the end. */
enum { RTB_EMIT_TICK = 0, RTB_EMIT_FINAL = 1, RTB_EMIT_READY = 2 };
typedef void (*rtb_emit_fn)(void *ctx, int kind, const rtb_report_t *r);

/*
 * Runs the share of the work that belongs to process `proc` of o->procs and returns
 * 0, or a negative errno when the loop could not be set up. With go_fd >= 0 the worker
 * emits RTB_EMIT_READY once its clients are connected and starts publishing only when
 * a byte (or EOF) arrives on go_fd; the worker takes ownership of go_fd.
 */
int rtb_worker_run(const rtb_opts_t *o, uint32_t proc, int go_fd, uint64_t *fb, rtb_emit_fn emit,
                   void *ctx);

/*
 * Cross-process feedback for fanin and fanout with --procs, where a publisher and the
 * subscribers that receive its messages live in different processes. The parent maps
 * rtb_fb_size() bytes MAP_SHARED before forking and passes the same region to every
 * worker (NULL when not needed). Each process owns one row, which only it writes: its
 * expected and unique delivery counts, a flag set once its publishers are done, and
 * per publisher the deliveries its subscribers saw. Readers sum the rows, so closed
 * loops, the end of the run and the drain all see global counts.
 */
size_t rtb_fb_size(const rtb_opts_t *o);

/* The number of units a scenario's clients split into (the --procs ceiling). */
uint32_t rtb_groups(const rtb_opts_t *o);

#endif

/*
** Inside the cluster layer (cluster.h): its one state, the messages between its actors, the
** NATS headers it writes, and the functions its files call in one another. Each file has one
** job:
**   cluster.c    the NATS connections, the three actors (cluster, cluster_kv, cluster_in),
**                what libnats threads hand them, start, stop and status
**   forward.c    routing across nodes: messages out (headers, subjects), the routes held
**                as NATS subscriptions, messages in (once per origin) and their names
**   retained.c   the retained store replicated in JetStream KV, and subscribers' barriers
**   claims.c     client ids (claims, takeovers), sessions that move, other nodes' questions
**   lease.c      the holder's lease: what keeps a node's claims good, and a holder's lapse
**   sign.c       the nodes' control requests and answers signed with the cluster's secret
**   durable.c    durable mode: the stream, sessions' records, the replay after a crash
**   heartbeat.c  what each node holds, once a second
**   banned_kv.c  the banned list replicated in JetStream KV
**   channel.c    bytes between nodes for a layer above (XMPP sessions)
*/
#ifndef RT_CLUSTER_IMPL_H
#define RT_CLUSTER_IMPL_H

#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "cluster.h"
#include "group.h"
#include "log.h"
#include "message.h"
#include "route.h"
#include "store.h"
#include "subject.h"

enum {
    MSG_FORWARD = RT_MSG_USER, /* to cluster: forward_t and bin, a message routed here */
    MSG_INTEREST,              /* to cluster: interest_t, a filter's first or last subscriber */
    MSG_INBOUND,               /* to cluster_in: inbound_t, what NATS delivered */
    MSG_KV_BIND,               /* to cluster: find or make the retained store's bucket */
    MSG_BARRIER,               /* to cluster: barrier_t, from a subscriber waiting for retained */
    MSG_BARRIER_WAIT,          /* to cluster_in: barrier_t, with the revision to wait for */
    MSG_KV_ENTRY,              /* to cluster_in: kv_entry_t, a change of the retained store */
    MSG_KV_TICK,               /* to cluster_in: once a second while the store is quiet */
    MSG_CLAIM,                 /* to cluster: claim_t, a CONNECT's client id */
    MSG_REPLY,                 /* to cluster: reply_t, an answer to another node's request */
    MSG_HEARTBEAT,             /* to cluster: time to say what this node holds */
    MSG_MOVE_SYNC,             /* to cluster: move_t, make NATS hold an imported session's
                                  subscriptions, then on to cluster_kv as MSG_MOVE_TAIL */
    MSG_MOVE_TAIL,             /* to cluster_kv: move_t, ask the old holder for the rest */
    MSG_SESSION_PUT,           /* to cluster_kv: record_t, a persistent session's record */
    MSG_CONNECTED,             /* to cluster: the connector made both NATS connections */
    MSG_BAN_PUT,               /* to cluster_kv: a ban added or deleted here (banned_kv.c) */
    MSG_CATCH_UP,              /* to cluster_kv: the routes connection is back (durable.c) */
    MSG_CHANNEL,               /* to cluster: channel_t, a layer's bytes for a node or all */
};

typedef struct {
    rt_pid_t reply_to;
    bool want_session;
    bool verify; /* rt_cluster_verify: keep the id if it is still this node's, take nothing */
    bool taken;  /* its create found the key in use: the sequential claim decides */
    uint32_t len;
    char id[];
} claim_t;

/* A session moving here: who waits for the claim, the imported session, its old node. */
typedef struct {
    rt_pid_t reply_to, session;
    uint32_t lease;         /* the claim's lease generation */
    int64_t replay_from_ms; /* the old node is gone: replay the stream from then (wall ms) */
    char holder[RT_CONF_NODE_MAX];
    uint32_t len;
    char id[];
} move_t;

typedef struct {
    uint32_t subject_len, data_len;
    char text[]; /* the subject, then the data */
} reply_t;

/* Who first routed a message, from its Rt-Origin header. */
typedef struct {
    char node[RT_CONF_NODE_MAX];
    uint64_t incarnation, seq;
} origin_name_t;

/* A persistent session's record for the bucket (len 0: the session ended). */
typedef struct {
    uint64_t clear_ms;
    uint32_t id_len, len;
    char data[]; /* the id, then the session's bytes */
} record_t;

typedef struct {
    rt_pid_t ack_pid; /* told RT_STORE_MSG_COMMITTED once the retained store (or with
                         stream_ack, the stream) has it; 0: none */
    uint64_t ack_token;
    bool shared_here; /* its node served the shared groups (out of reach of NATS then) */
    bool stream_ack;  /* durable mode: acknowledged by JetStream's stream */
} forward_t;

/* A subscriber's request: answered with RT_CLUSTER_MSG_RETAINED_READY carrying data back. */
typedef struct {
    rt_pid_t reply_to;
    uint64_t revision; /* MSG_BARRIER_WAIT: the store's last revision when it was asked */
    uint64_t since_ms;
    uint32_t len;
    uint8_t data[];
} barrier_t;

typedef struct {
    uint64_t revision;
    bool put; /* else a delete or purge */
    uint32_t keylen, vallen;
    size_t bytes; /* counted in the inbound backlog */
    char kv[];    /* the key, then the value */
} kv_entry_t;

typedef struct {
    bool on;
    uint32_t len;
    char filter[];
} interest_t;

typedef struct {
    natsMsg *msg;
    const char *share; /* the $share/group/filter it came for; NULL: an ordinary route */
    size_t bytes;      /* counted in the inbound backlog */
    bool late;         /* read from the stream after a cut (durable.c), maybe long after */
} inbound_t;

/* One filter this node holds NATS subscriptions for. */
typedef struct route_s {
    char *filter; /* NULL: a free slot */
    uint32_t len;
    bool removed; /* a tombstone, for open addressing */
    int nsubs;
    natsSubscription *subs[2];
} route_t;

/*
** Whether the caller runs as the cluster's actor whose pid is in the field named (out_pid,
** in_pid, kv_pid): each piece of the cluster's state has one actor that touches it, and
** libnats's threads none; debug builds check it where the state is used.
*/
#define RT_CLUSTER_ON(field)                                                                       \
    (rt_current() &&                                                                               \
     rt_self(rt_current()) == atomic_load_explicit(&rt__cluster.field, memory_order_acquire))

/* inbound_t.share for a request to give up a client id (the node's takeover subject), for
   the second request of a session's move (handover), for another node's administrator's
   question (admin), and for another node's heartbeat. */
extern const char rt__cluster_takeover_request[], rt__cluster_handover_request[],
    rt__cluster_admin_request[], rt__cluster_heartbeat[], rt__cluster_sync_request[],
    rt__cluster_channel[];

/* A layer's bytes on their way out (channel.c): to one node, or to all when to is "". */
typedef struct {
    char to[RT_CONF_NODE_MAX];
    uint8_t data[];
} channel_t;

/* Per origin node: which of its sequence numbers were routed here, in a sliding window. */
#define SEEN_WINDOW 1024
#define MAX_ORIGINS 64

typedef struct {
    char node[RT_CONF_NODE_MAX];
    uint64_t incarnation;
    uint64_t top;                    /* highest sequence number seen */
    uint64_t bits[SEEN_WINDOW / 64]; /* bit (seq % SEEN_WINDOW): seq in (top - SEEN_WINDOW, top] */
} origin_t;

typedef struct {
    origin_t origins[MAX_ORIGINS];
    unsigned norigins;
    rt_msg_t **barriers; /* MSG_BARRIER_WAITs not answered yet (malloc'ed, charged) */
    size_t nbarriers, capbarriers;
} in_state_t;

typedef struct {
    bool on;
    char node[RT_CONF_NODE_MAX];
    char prefix[RT_CONF_NODE_MAX];
    uint64_t incarnation; /* tells this run's sequence numbers from an earlier run's */
    /* Set once, when the connection is first made (NULL until then: cluster.c's connector). */
    _Atomic(natsConnection *) nc; /* publishes and ordinary subscriptions; never hears its own */
    _Atomic(natsConnection *) qc; /* shared groups' queue subscriptions: hears this node too */
    natsOptions *opts[2];         /* of nc and qc until each is made */
    char refusal[2][200];         /* what NATS last answered a try at each (said once) */
    pthread_t connector;          /* retries the first connections (connector_on) */
    bool connector_on;
    rt_pid_t sup;
    _Atomic rt_pid_t out_pid, in_pid, kv_pid;
    /* The routes table: only the cluster actor touches it. */
    route_t *routes;
    size_t routes_cap, routes_used, routes_live;
    _Atomic uint64_t seq; /* of the messages this node publishes */
    /* Inbound backlog: what the delivery thread handed over and cluster_in has not routed. */
    pthread_mutex_t backlog_lock;
    pthread_cond_t backlog_cond;
    _Atomic uint64_t backlog_msgs, backlog_bytes;
    atomic_int backlog_waiters; /* threads waiting for room: only then is a release signalled */
    atomic_int pool_subs;       /* subscriptions on the delivery thread not yet closed through it */
    atomic_bool stopping;
    atomic_bool nc_up, qc_up; /* the two NATS connections, as their callbacks last said */
    long max_packet;          /* max_packet_size at start */
    _Atomic uint64_t forwarded_out, forwarded_in, duplicates, forward_failed, not_forwarded, bad_in,
        dropped_in, reconnects, routes_count;
    /* The retained store replicated in JetStream KV (bucket "<prefix>_retained"). */
    long replicas;
    char bucket[RT_CONF_NODE_MAX + 16];
    jsCtx *js;
    kvStore *kv;
    atomic_bool kv_ready; /* set once, by the cluster actor, after the watcher started */
    bool kv_warned;
    pthread_t watcher;
    _Atomic(kvWatcher *) kv_watcher;
    _Atomic uint64_t kv_applied, kv_put_failed, barrier_timeouts;
    /* Client ids: the bucket "<prefix>_clients" and this node's takeover subject. */
    kvStore *clients;
    char value[RT_CONF_NODE_MAX + 24]; /* what this node writes as an id's holder */
    natsSubscription *takeover_sub, *handover_sub, *admin_sub, *status_sub, *sync_sub;
    natsSubscription *channel_subs[2]; /* the channel's: to all nodes, to this one */
    _Atomic rt_pid_t channel_to;       /* who takes what comes on the channel (0: none) */
    _Atomic uint64_t channel_out, channel_in, channel_failed;
    rt_cluster_admin_fn admin; /* the admin layer's (questions from other nodes) */
    uint64_t node_key;         /* rt_message_set_origin's name of this run of this node */
    /* Durable mode (cluster.durable): the stream "<prefix>_msgs" keeps every message routed
       in the cluster, and the bucket "<prefix>_sessions" each persistent session's record. */
    bool durable;
    int64_t margin_ms, max_age_s;
    char stream[RT_CONF_NODE_MAX + 8];
    jsCtx *pjs; /* the cluster actor's asynchronous publishes to the stream */
    jsCtx *cjs; /* cluster_kv's claims in flight (claims.c) */
    kvStore *sessions;
    /* The banned list (banned_kv.c): the bucket "<prefix>_banned" and its watcher. */
    kvStore *banned;
    pthread_t banned_thread;
    bool banned_watching;
    _Atomic(kvWatcher *) banned_watcher;
    _Atomic uint64_t bans_applied, bans_failed;
    atomic_bool durable_ready; /* set once, by cluster_kv, when both are bound */
    _Atomic uint64_t stream_acked, stream_failed, records_failed, replays, replayed;
    _Atomic int64_t cut_ms; /* wall ms the routes connection was lost, until caught up; 0: not */
    rt_cluster_import_fn import; /* the connection layer's (sessions moving here) */
    _Atomic uint64_t sessions_moved_in, sessions_moved_out, sessions_move_failed;
    _Atomic uint64_t move_syncs_incomplete; /* moves that went on without every node's word */
    /* The nodes heard from: written by cluster_in, read by admin commands. */
    pthread_mutex_t nodes_lock;
    rt_cluster_node_t nodes[RT_CLUSTER_NODES_MAX];
    uint64_t nodes_seen_ms[RT_CLUSTER_NODES_MAX];
    size_t nnodes;
    uint64_t started_ms;
    _Atomic uint64_t claims, claims_taken_over, claims_failed, given_up, claims_pipelined;
    /* The lease (lease.c): written by its thread, read by connections on every scheduler.
       lease_gen goes up before lease_until_ms moves past a lapse, so a reader that sees the
       new deadline sees the new generation too. */
    _Atomic uint64_t lease_until_ms; /* monotonic ms; 0: never held */
    atomic_uint lease_gen;
    atomic_bool lease_lapsed; /* told already (one RT_CLUSTER_MSG_LEASE per lapse) */
    pthread_t lease_thread;
    bool lease_started;
    pthread_mutex_t lease_lock; /* with lease_cond: wakes the thread to stop */
    pthread_cond_t lease_cond;
    _Atomic uint64_t lease_lapses, lease_waits, stale_requests;
    /* Holders whose lease was seen to run out (only cluster_kv touches it): a claim against
       one whose lease key has not changed since takes the id at once. */
    struct {
        char value[RT_CONF_NODE_MAX + 24];
        uint64_t revision;
    } lapsed[8];
    unsigned nlapsed;
} rt__cluster_t;
extern rt__cluster_t rt__cluster;

/* ---- Headers ---- */

#define H_ORIGIN "Rt-Origin" /* "<node> <incarnation, hex> <sequence>" */
#define H_MSG "Rt-Msg"       /* "<qos> <retain> <expiry seconds, or ->" */
#define H_CLIENT "Rt-Client" /* the publisher's client id, %XX-escaped */
#define H_PROPS "Rt-Props"   /* the MQTT 5 property block passed on, hex */
#define H_SHARED "Rt-Shared" /* "here": shared groups were served on the origin node */
#define H_ACK "Rt-Ack"       /* "<pid, hex> <token>": the publisher waiting for the stream */
#define H_AUTH "Rt-Auth"     /* "<sent, wall ms> <nonce> <HMAC or ->": control traffic (sign.c) */

/* A signed request is taken within this long of when it was sent (either way: clocks). */
#define AUTH_WINDOW_MS 10000

/* How long a JetStream request (a claim's read or write, a bucket's revision) may take. */
#define JETSTREAM_WAIT_MS 2000

/* The holder's lease: a renewal sent at t holds until t + LEASE_MS; a node renews every
   LEASE_RENEW_MS (each write waits that long at most); a taker whose holder is silent takes
   the id once the holder's lease key has not changed for LEASE_MS + LEASE_MARGIN_MS. */
#define LEASE_MS 5000
#define LEASE_RENEW_MS 500
#define LEASE_MARGIN_MS 1000

/* ---- cluster.c ---- */
void rt__cluster_backlog_wait(void);
bool rt__cluster_hand_in(rt_msg_t *m, size_t bytes);
void rt__cluster_on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure);
natsStatus rt__cluster_pool_subscribe(natsSubscription **sub, natsConnection *nc,
                                      const char *subject, const char *queue, void *closure,
                                      bool closure_owned);

/* ---- forward.c ---- */
bool rt__cluster_forward(rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token, bool shared_here);
void rt__cluster_stamp(rt_bin_t *bin);
uint64_t rt__cluster_node_key(const char *node, uint64_t incarnation);
void rt__cluster_subscribe(rt_actor_t *self, const char *filter, size_t len);
void rt__cluster_subscribe_held(rt_actor_t *self);
void rt__cluster_unsubscribe(rt_actor_t *self, const char *filter, size_t len);
void rt__cluster_interest_changed(void *arg, const char *filter, size_t len, bool on);
void rt__cluster_forward_one(rt_msg_t *m);
rt_bin_t *rt__cluster_inbound_message(natsMsg *nm, origin_name_t *o);
void rt__cluster_route_inbound(in_state_t *st, const inbound_t *in);

/* ---- retained.c ---- */
natsStatus rt__cluster_kv_open(kvStore **kv, const char *bucket, const char *what,
                               jsStorageType storage);
natsStatus rt__cluster_kv_put(const rt_message_t *msg, rt_bin_t *bin);
void rt__cluster_kv_bind(rt_actor_t *self);
void rt__cluster_barrier_start(rt_msg_t *m);
void rt__cluster_apply_entry(const kv_entry_t *k);
void rt__cluster_barriers_check(rt_actor_t *self, in_state_t *st);
void rt__cluster_barrier_wait(rt_actor_t *self, in_state_t *st, rt_msg_t *m);

/* ---- claims.c ---- */
void rt__cluster_node_subject(const char *holder, const char *what, char *out, size_t cap);
void rt__cluster_claim_one(const claim_t *cl);
natsStatus rt__cluster_read_key(jsCtx *js, const char *key, char *value, size_t cap,
                                uint64_t *revision);
natsStatus rt__cluster_claims_open(void);
void rt__cluster_move_unmerged(const move_t *mv);
void rt__cluster_claims_close(void);
unsigned rt__cluster_claims_in_flight(void);
void rt__cluster_move_tail(const move_t *mv);
void rt__cluster_admin_asked(natsMsg *nm);
void rt__cluster_give_up(natsMsg *nm, uint32_t phase);
void rt__cluster_sync_asked(natsMsg *nm);
void rt__cluster_send_reply(const reply_t *r);

/* ---- durable.c ---- */
void rt__cluster_stream_answer(rt_pid_t ack_pid, uint64_t token, bool kept);
void rt__cluster_unkept(rt_pid_t ack_pid, uint64_t token);
natsStatus rt__cluster_stream_publish(natsMsg **nm);
natsStatus rt__cluster_durable_open(void);
/* banned_kv.c: in cluster_kv, the bucket bound and watched; at stop, closed. */
natsStatus rt__cluster_banned_open(void);
void rt__cluster_banned_close(void);
void rt__cluster_ban_put(const rt_msg_t *m);
uint8_t *rt__cluster_session_record(const char *key, size_t *len, int64_t *from_ms);
void rt__cluster_session_put(const record_t *r);
uint8_t *rt__cluster_replay_bytes(int64_t from_ms, size_t *len, size_t *count);
void rt__cluster_cut(void);
void rt__cluster_catch_up(rt_actor_t *self);

/* ---- lease.c ---- */
void rt__cluster_lease_start(void);
void rt__cluster_lease_stop(void);
void rt__cluster_lease_key(const char *node, char *out, size_t cap);

/* ---- sign.c ---- */
int rt__cluster_secret_load(const rt_conf_t *conf, char *err, size_t errlen);
/* Sets Rt-Auth on m, after every other header and its data. */
natsStatus rt__cluster_sign(natsMsg *m);
/* Whether m's Rt-Auth verifies (always, unsigned); a request (its nonce) is taken once. *age_ms:
   how long ago it was sent, by the two nodes' clocks (0 when it does not say). */
bool rt__cluster_verified(natsMsg *m, const char *what, bool request, int64_t *age_ms);
uint64_t rt__cluster_auth_refused(void);

/* ---- channel.c ---- */
/* In the cluster actor: the channel's subscriptions, once someone takes what comes. */
void rt__cluster_channel_subscribe(void);
/* A message into the turn's batch; flush (at the turn's end) publishes the batch; drop (the
   actor exits) counts it as not sent. */
void rt__cluster_channel_publish(const rt_msg_t *m);
void rt__cluster_channel_flush(void);
void rt__cluster_channel_drop(void);
/* In cluster_in: what another node sent on the channel, on to its taker. */
void rt__cluster_channel_in(natsMsg *nm);

/* ---- heartbeat.c ---- */
void rt__cluster_other_heartbeat(natsMsg *nm);
/* The other nodes heard from within RT_CLUSTER_SILENT_MS, by name (at most max). */
size_t rt__cluster_others_up(char (*names)[RT_CONF_NODE_MAX], size_t max);
void rt__cluster_send_heartbeat(rt_actor_t *self);

#endif

/*
** The cluster over NATS (cluster.h): the NATS connections, the `cluster` actor that makes
** every libnats call (publishes and subscriptions), and the `cluster_in` actor that routes
** what other nodes send.
*/
#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "broker.h"
#include "cluster.h"
#include "group.h"
#include "log.h"
#include "message.h"
#include "route.h"
#include "rule_engine.h"
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
};

typedef struct {
    rt_pid_t reply_to;
    bool want_session;
    uint32_t len;
    char id[];
} claim_t;

/* A session moving here: who waits for the claim, the imported session, its old node. */
typedef struct {
    rt_pid_t reply_to, session;
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

/* inbound_t.share for a request to give up a client id (the node's takeover subject)... */
static const char takeover_request[] = "takeover";
/* ... and for the second request of a session's move (its handover subject)... */
static const char handover_request[] = "handover";
/* ... and for another node's administrator's question (its admin subject). */
static const char admin_request[] = "admin";
/* inbound_t.share for another node's heartbeat. */
static const char heartbeat[] = "heartbeat";

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
} inbound_t;

/* One filter this node holds NATS subscriptions for. */
typedef struct route_s {
    char *filter; /* NULL: a free slot */
    uint32_t len;
    bool removed; /* a tombstone, for open addressing */
    int nsubs;
    natsSubscription *subs[2];
} route_t;

static struct {
    bool on;
    char node[RT_CONF_NODE_MAX];
    char prefix[RT_CONF_NODE_MAX];
    uint64_t incarnation; /* tells this run's sequence numbers from an earlier run's */
    natsConnection *nc;   /* publishes and ordinary subscriptions; never hears its own */
    natsConnection *qc;   /* shared groups' queue subscriptions: hears this node too */
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
    natsSubscription *takeover_sub, *handover_sub, *admin_sub, *status_sub;
    rt_cluster_admin_fn admin; /* the admin layer's (questions from other nodes) */
    uint64_t node_key;         /* rt_message_set_origin's name of this run of this node */
    /* Durable mode (cluster.durable): the stream "<prefix>_msgs" keeps every message routed
       in the cluster, and the bucket "<prefix>_sessions" each persistent session's record. */
    bool durable;
    int64_t margin_ms, max_age_s;
    char stream[RT_CONF_NODE_MAX + 8];
    jsCtx *pjs; /* the cluster actor's asynchronous publishes to the stream */
    kvStore *sessions;
    atomic_bool durable_ready; /* set once, by cluster_kv, when both are bound */
    _Atomic uint64_t stream_acked, stream_failed, records_failed, replays, replayed;
    rt_cluster_import_fn import; /* the connection layer's (sessions moving here) */
    _Atomic uint64_t sessions_moved_in, sessions_moved_out, sessions_move_failed;
    /* The nodes heard from: written by cluster_in, read by admin commands. */
    pthread_mutex_t nodes_lock;
    rt_cluster_node_t nodes[RT_CLUSTER_NODES_MAX];
    uint64_t nodes_seen_ms[RT_CLUSTER_NODES_MAX];
    size_t nnodes;
    uint64_t started_ms;
    _Atomic uint64_t claims, claims_taken_over, claims_failed, given_up;
} C = {.backlog_lock = PTHREAD_MUTEX_INITIALIZER,
       .backlog_cond = PTHREAD_COND_INITIALIZER,
       .nodes_lock = PTHREAD_MUTEX_INITIALIZER};

bool rt_cluster_on(void)
{
    return C.on;
}

const char *rt_cluster_node(void)
{
    return C.on ? C.node : "";
}

/* ---- Headers ---- */

#define H_ORIGIN "Rt-Origin" /* "<node> <incarnation, hex> <sequence>" */
#define H_MSG "Rt-Msg"       /* "<qos> <retain> <expiry seconds, or ->" */
#define H_CLIENT "Rt-Client" /* the publisher's client id, %XX-escaped */
#define H_PROPS "Rt-Props"   /* the MQTT 5 property block passed on, hex */
#define H_SHARED "Rt-Shared" /* "here": shared groups were served on the origin node */
#define H_ACK "Rt-Ack"       /* "<pid, hex> <token>": the publisher waiting for the stream */

/* A header value holds no CR, LF or other control byte: those (and %) are %XX. */
static void escape_text(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t at = 0;
    for (; *s && at + 4 <= cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f || c == '%') {
            out[at++] = '%';
            out[at++] = hex[c >> 4];
            out[at++] = hex[c & 15];
        } else {
            out[at++] = (char)c;
        }
    }
    out[at] = 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Undoes escape_text; false on a malformed escape. */
static bool unescape_text(const char *s, char *out, size_t cap)
{
    size_t at = 0;
    for (; *s; s++) {
        int c = (unsigned char)*s;
        if (c == '%') {
            int hi = hexval(s[1]), lo = hi >= 0 ? hexval(s[2]) : -1;
            if (lo < 0)
                return false;
            c = hi << 4 | lo;
            s += 2;
        }
        if (at + 1 >= cap || c == 0)
            return false;
        out[at++] = (char)c;
    }
    out[at] = 0;
    return true;
}

/* ---- Publishing (the cluster actor) ---- */

static bool forward(rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token, bool shared_here)
{
    rt_message_t msg;
    rt_message_view(bin, &msg);
    /* A retained message's acknowledgement waits for the replicated store: a subscriber
       that comes after it, on any node, gets it. */
    bool kv_ack = ack_pid && msg.retain && atomic_load_explicit(&C.kv_ready, memory_order_acquire);
    /* Durable mode: a QoS 1/2 message is acknowledged once JetStream's stream has it. */
    bool stream_ack = ack_pid && !kv_ack && msg.qos &&
                      atomic_load_explicit(&C.durable_ready, memory_order_acquire);
    bool acks = kv_ack || stream_ack;
    rt_msg_t *m = rt_msg_new(MSG_FORWARD, sizeof(forward_t));
    if (!m) {
        atomic_fetch_add_explicit(&C.forward_failed, 1, memory_order_relaxed);
        return false;
    }
    *(forward_t *)(void *)m->data =
        (forward_t){acks ? ack_pid : 0, ack_token, shared_here, stream_ack};
    m->bin = rt_bin_retain(bin);
    /* A publisher waits (muted) while the cluster actor is behind, as for any overloaded
       receiver: what it routes here goes to the other nodes in its order, none dropped. */
    if (rt_send_msg(atomic_load_explicit(&C.out_pid, memory_order_acquire), m) != 0) {
        atomic_fetch_add_explicit(&C.forward_failed, 1, memory_order_relaxed);
        return false;
    }
    return acks;
}

/* route.h's stamp: every message this node routes first gets its name before anyone here
   holds a copy; the name's number is what Rt-Origin sends. */
static void stamp(rt_bin_t *bin)
{
    uint64_t key, seq;
    if (!rt_message_origin(bin, &key, &seq))
        rt_message_set_origin(bin, C.node_key,
                              atomic_fetch_add_explicit(&C.seq, 1, memory_order_relaxed) + 1);
}

/* A publisher's acknowledgement that waited for the stream. */
static void stream_answer(rt_pid_t ack_pid, uint64_t token, bool kept)
{
    rt_store_committed_t done = {.token = token, .status = kept ? 0 : RT_EAGAIN};
    rt_send(ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
    atomic_fetch_add_explicit(kept ? &C.stream_acked : &C.stream_failed, 1, memory_order_relaxed);
}

/* On a libnats thread: the stream's answer to a publish that carried Rt-Ack. */
static void stream_answered(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    (void)closure;
    const char *ack = NULL;
    uint64_t pid, token;
    if (natsMsgHeader_Get(msg, H_ACK, &ack) == NATS_OK &&
        sscanf(ack, "%" SCNx64 " %" SCNu64, &pid, &token) == 2)
        stream_answer((rt_pid_t)pid, token, pa && !pae);
    natsMsg_Destroy(msg);
}

static void publish(const rt_message_t *msg, const rt_bin_t *bin, const forward_t *f)
{
    char subject[RT_SUBJECT_MAX + 1];
    if (rt_subject_of_topic(C.prefix, (const char *)msg->topic.p, msg->topic.len, subject,
                            sizeof(subject)) < 0) {
        atomic_fetch_add_explicit(&C.not_forwarded, 1, memory_order_relaxed);
        if (f->stream_ack) /* no other node can have it: it is this node's alone */
            stream_answer(f->ack_pid, f->ack_token, true);
        return;
    }
    natsMsg *nm = NULL;
    natsStatus s =
        natsMsg_Create(&nm, subject, NULL, (const char *)msg->payload.p, (int)msg->payload.len);
    char origin[RT_CONF_NODE_MAX + 48], meta[48];
    uint64_t key, seq;
    if (!rt_message_origin(bin, &key, &seq)) /* made before the cluster started */
        seq = atomic_fetch_add_explicit(&C.seq, 1, memory_order_relaxed) + 1;
    snprintf(origin, sizeof(origin), "%s %" PRIx64 " %" PRIu64, C.node, C.incarnation, seq);
    if (msg->has_expiry)
        snprintf(meta, sizeof(meta), "%u %u %" PRIu32, msg->qos, msg->retain, msg->expiry);
    else
        snprintf(meta, sizeof(meta), "%u %u -", msg->qos, msg->retain);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(nm, H_ORIGIN, origin);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(nm, H_MSG, meta);
    if (s == NATS_OK && msg->clientid) {
        char id[3 * RT_CLIENT_TEXT_MAX + 1];
        escape_text(msg->clientid, id, sizeof(id));
        s = natsMsgHeader_Set(nm, H_CLIENT, id);
    }
    if (s == NATS_OK && msg->props.len) {
        char *hex = malloc(2 * (size_t)msg->props.len + 1);
        if (!hex) {
            s = NATS_NO_MEMORY;
        } else {
            for (uint32_t i = 0; i < msg->props.len; i++)
                snprintf(hex + 2 * i, 3, "%02X", msg->props.p[i]);
            s = natsMsgHeader_Set(nm, H_PROPS, hex);
            free(hex);
        }
    }
    if (s == NATS_OK && f->shared_here)
        s = natsMsgHeader_Set(nm, H_SHARED, "here");
    if (f->stream_ack) {
        char ack[48];
        snprintf(ack, sizeof(ack), "%" PRIx64 " %" PRIu64, (uint64_t)f->ack_pid, f->ack_token);
        if (s == NATS_OK)
            s = natsMsgHeader_Set(nm, H_ACK, ack);
        /* The stream answers on a libnats thread (stream_answered). */
        if (s == NATS_OK)
            s = js_PublishMsgAsync(C.pjs, &nm, NULL);
        if (s != NATS_OK)
            stream_answer(f->ack_pid, f->ack_token, false);
    } else if (s == NATS_OK) {
        s = natsConnection_PublishMsg(C.nc, nm);
    }
    natsMsg_Destroy(nm);
    if (s == NATS_OK) {
        atomic_fetch_add_explicit(&C.forwarded_out, 1, memory_order_relaxed);
        return;
    }
    /* Said, not only counted: the first failure, then every 1000th. */
    if (atomic_fetch_add_explicit(&C.forward_failed, 1, memory_order_relaxed) % 1000 == 0)
        rt_log(RT_LOG_WARNING, "cluster.forward_failed",
               "topic=%.*s payload=%u props=%u: %s (nats-server's max_payload is %" PRId64
               " bytes, headers included)",
               (int)(msg->topic.len > 200 ? 200 : msg->topic.len), msg->topic.p, msg->payload.len,
               msg->props.len, natsStatus_GetText(s), natsConnection_GetMaxPayload(C.nc));
}

/* ---- The retained store in JetStream KV (the cluster actor, and a watcher thread) ---- */

/* How long a JetStream request (a claim's read or write, a bucket's revision) may take. */
#define JETSTREAM_WAIT_MS 2000

static void *watch_retained(void *arg);
static void node_subject(const char *holder, const char *what, char *out, size_t cap);
static uint64_t node_key(const char *node, uint64_t incarnation);
static rt_bin_t *inbound_message(natsMsg *nm, origin_name_t *o);
static void admin_asked(natsMsg *nm);
static void on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure);

/* Binds the bucket another node made (whatever its settings), or makes it. */
static natsStatus kv_open(kvStore **kv, const char *bucket, const char *what)
{
    kvConfig cfg;
    kvConfig_Init(&cfg);
    cfg.Bucket = bucket;
    cfg.Description = what;
    cfg.History = 1;
    cfg.Replicas = (int)C.replicas;
    /* Bound first: a create racing another node's waits for JetStream's meta leader. */
    natsStatus s = js_KeyValue(kv, C.js, bucket);
    return s == NATS_OK ? s : js_CreateKeyValue(kv, C.js, &cfg);
}

/*
** Durable mode's stream (every message routed under the prefix, kept as long as a session
** may wait for one: max_session_expiry), the sessions' bucket, and the context whose
** asynchronous publishes the stream answers.
*/
static natsStatus durable_open(void)
{
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, C.js, C.stream, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    if (s == NATS_NOT_FOUND) {
        char subjects[RT_CONF_NODE_MAX + 4];
        snprintf(subjects, sizeof(subjects), "%s.>", C.prefix);
        const char *list[1] = {subjects};
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        cfg.Name = C.stream;
        cfg.Description = "rtd: every message of the cluster (durable mode)";
        cfg.Subjects = list;
        cfg.SubjectsLen = 1;
        cfg.MaxAge = C.max_age_s * 1000000000LL;
        cfg.Replicas = C.replicas;
        cfg.Storage = js_FileStorage;
        s = js_AddStream(NULL, C.js, &cfg, NULL, &jerr);
    }
    char bucket[sizeof(C.bucket)];
    snprintf(bucket, sizeof(bucket), "%s_sessions", C.prefix);
    if (s == NATS_OK && !C.sessions)
        s = kv_open(&C.sessions, bucket, "rtd: persistent sessions, for a resume elsewhere");
    if (s == NATS_OK && !C.pjs) {
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.Wait = JETSTREAM_WAIT_MS;
        jo.PublishAsync.AckHandler = stream_answered;
        jo.PublishAsync.MaxPending = 65536; /* past it the cluster actor waits: publishers too */
        s = natsConnection_JetStream(&C.pjs, C.nc, &jo);
    }
    return s;
}

/* In cluster_kv: the buckets found or made, the watcher started; else again in 1 s. */
static void kv_bind(rt_actor_t *self)
{
    if (atomic_load(&C.kv_ready) || atomic_load(&C.stopping))
        return;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = JETSTREAM_WAIT_MS;
    natsStatus s = C.js ? NATS_OK : natsConnection_JetStream(&C.js, C.nc, &jo);
    if (s == NATS_OK && !C.kv)
        s = kv_open(&C.kv, C.bucket, "rtd: the cluster's retained messages");
    char clients[sizeof(C.bucket)];
    snprintf(clients, sizeof(clients), "%s_clients", C.prefix);
    if (s == NATS_OK && !C.clients)
        s = kv_open(&C.clients, clients, "rtd: which node holds each client id");
    char subject[RT_CONF_NODE_MAX * 2 + 24];
    if (s == NATS_OK && !C.takeover_sub) {
        node_subject(C.node, "takeover", subject, sizeof(subject));
        s = natsConnection_Subscribe(&C.takeover_sub, C.nc, subject, on_message,
                                     (void *)takeover_request);
    }
    if (s == NATS_OK && !C.handover_sub) {
        node_subject(C.node, "handover", subject, sizeof(subject));
        s = natsConnection_Subscribe(&C.handover_sub, C.nc, subject, on_message,
                                     (void *)handover_request);
    }
    if (s == NATS_OK && !C.admin_sub) {
        node_subject(C.node, "admin", subject, sizeof(subject));
        s = natsConnection_Subscribe(&C.admin_sub, C.nc, subject, on_message,
                                     (void *)admin_request);
    }
    /* A bucket just made answers only once its stream has a leader: probe before use,
       so the first claims do not wait out JetStream's timeout. */
    kvEntry *probe = NULL;
    if (s == NATS_OK) {
        s = kvStore_Get(&probe, C.clients, "rt-probe");
        kvEntry_Destroy(probe);
        if (s == NATS_NOT_FOUND)
            s = NATS_OK;
    }
    if (s == NATS_OK && C.durable)
        s = durable_open();
    if (s == NATS_OK && pthread_create(&C.watcher, NULL, watch_retained, NULL) != 0)
        s = NATS_SYS_ERROR;
    if (s != NATS_OK) {
        if (!C.kv_warned)
            rt_log(RT_LOG_WARNING, "cluster.retained_unreplicated",
                   "bucket=%s: %s (%s); retained messages stay on their node until JetStream "
                   "answers (trying every second)",
                   C.bucket, natsStatus_GetText(s), nats_GetLastError(NULL));
        C.kv_warned = true;
        rt_send_after_tag(1000, rt_self(self), MSG_KV_BIND, NULL);
        return;
    }
    atomic_store(&C.kv_ready, true);
    rt_log(RT_LOG_INFO, "cluster.retained_replicated", "bucket=%s replicas=%ld", C.bucket,
           C.replicas);
    if (C.durable) {
        atomic_store(&C.durable_ready, true);
        rt_log(RT_LOG_INFO, "cluster.durable", "stream=%s max_age=%" PRId64 "s replicas=%ld",
               C.stream, C.max_age_s, C.replicas);
    }
}

/* Writes a retained message (or its clearing) to the bucket; NATS_OK once JetStream has it. */
static natsStatus kv_put(const rt_message_t *msg, rt_bin_t *bin)
{
    char key[RT_SUBJECT_MAX + 1];
    if (rt_kv_key_of_topic((const char *)msg->topic.p, msg->topic.len, key, sizeof(key)) < 0)
        return NATS_INVALID_ARG;
    if (!msg->payload.len)
        return kvStore_Delete(C.kv, key);
    /* The value: when it expires (wall clock ms, big-endian; 0: never), then the PUBLISH. */
    size_t len = rt_bin_len(bin);
    uint8_t *v = malloc(8 + len);
    if (!v)
        return NATS_NO_MEMORY;
    uint64_t at = msg->has_expiry && msg->expiry ? rt_wall_ms() + (uint64_t)msg->expiry * 1000 : 0;
    for (int i = 0; i < 8; i++)
        v[i] = (uint8_t)(at >> (56 - 8 * i));
    memcpy(v + 8, rt_bin_data(bin), len);
    natsStatus s = kvStore_Put(NULL, C.kv, key, v, (int)(8 + len));
    free(v);
    return s;
}

/* Hands cluster_in a message from a libnats thread, within the inbound backlog's bound. */
static void backlog_wait(void);
static void backlog_release(size_t bytes);

static bool hand_in(rt_msg_t *m, size_t bytes)
{
    atomic_fetch_add_explicit(&C.backlog_msgs, 1, memory_order_acq_rel);
    atomic_fetch_add_explicit(&C.backlog_bytes, bytes, memory_order_acq_rel);
    if (rt_send_unmuted(atomic_load_explicit(&C.in_pid, memory_order_acquire), m) == 0)
        return true;
    atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
    backlog_release(bytes);
    return false;
}

/* The watcher thread: every change of the bucket, in revision order, to cluster_in. */
static void *watch_retained(void *arg)
{
    (void)arg;
    kvWatcher *w = NULL;
    while (!atomic_load(&C.stopping)) {
        if (!w && kvStore_WatchAll(&w, C.kv, NULL) != NATS_OK) {
            w = NULL;
            nats_Sleep(250);
            continue;
        }
        atomic_store(&C.kv_watcher, w);
        if (atomic_load(&C.stopping))
            break;
        kvEntry *e = NULL;
        natsStatus s = kvWatcher_Next(&e, w, 1000);
        if (s == NATS_TIMEOUT) {
            rt_msg_t *tick = rt_msg_new(MSG_KV_TICK, 0);
            if (tick)
                rt_send_unmuted(atomic_load(&C.in_pid), tick);
            continue;
        }
        if (s != NATS_OK) {
            if (!atomic_load(&C.stopping))
                nats_Sleep(250);
            continue;
        }
        if (!e)
            continue; /* the end of the initial values */
        const char *key = kvEntry_Key(e);
        size_t klen = strlen(key), vlen = (size_t)kvEntry_ValueLen(e);
        bool put = kvEntry_Operation(e) == kvOp_Put;
        if (!put)
            vlen = 0;
        size_t bytes = klen + vlen + 256;
        backlog_wait();
        rt_msg_t *m = rt_msg_new(MSG_KV_ENTRY, sizeof(kv_entry_t) + klen + vlen);
        if (m) {
            kv_entry_t *k = (kv_entry_t *)(void *)m->data;
            *k = (kv_entry_t){.revision = kvEntry_Revision(e),
                              .put = put,
                              .keylen = (uint32_t)klen,
                              .vallen = (uint32_t)vlen,
                              .bytes = bytes};
            memcpy(k->kv, key, klen);
            if (vlen)
                memcpy(k->kv + klen, kvEntry_Value(e), vlen);
            hand_in(m, bytes);
        } else {
            atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
        }
        kvEntry_Destroy(e);
    }
    atomic_store(&C.kv_watcher, NULL);
    if (w)
        kvWatcher_Destroy(w);
    return NULL;
}

/* In the cluster actor: the bucket's last revision now, for a subscriber's barrier. */
static void barrier_start(rt_msg_t *m)
{
    barrier_t *b = (barrier_t *)(void *)m->data;
    char stream[sizeof(C.bucket) + 4];
    snprintf(stream, sizeof(stream), "KV_%s", C.bucket);
    jsStreamInfo *si = NULL;
    b->revision = 0;
    if (js_GetStreamInfo(&si, C.js, stream, NULL, NULL) == NATS_OK && si) {
        b->revision = si->State.LastSeq;
        jsStreamInfo_Destroy(si);
    }
    b->since_ms = rt_mono_ms();
    rt_msg_t *wait = rt_msg_new(MSG_BARRIER_WAIT, m->len);
    if (wait) {
        memcpy(wait->data, m->data, m->len);
        if (rt_send_msg(atomic_load(&C.in_pid), wait) == 0)
            return;
    }
    /* cluster_in cannot wait for it: the subscriber gets what this node has now. */
    rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
    if (r) {
        memcpy(r->data, b->data, b->len);
        rt_send_msg(b->reply_to, r);
    }
}

bool rt_cluster_retained_barrier(rt_pid_t reply_to, const void *data, size_t len)
{
    if (!atomic_load_explicit(&C.kv_ready, memory_order_acquire))
        return false;
    rt_msg_t *m = rt_msg_new(MSG_BARRIER, sizeof(barrier_t) + len);
    if (!m)
        return false;
    barrier_t *b = (barrier_t *)(void *)m->data;
    *b = (barrier_t){.reply_to = reply_to, .len = (uint32_t)len};
    memcpy(b->data, data, len);
    return rt_send_msg(atomic_load_explicit(&C.kv_pid, memory_order_acquire), m) == 0;
}

/* ---- Client ids (the cluster actor claims; cluster_in gives up) ---- */

#define CLAIM_ATTEMPTS 4
#define TAKEOVER_WAIT_MS 2000

#define H_PART "Rt-Part" /* "<i> <n>": part i of an answer in n parts; "0 0": nothing */
#define H_WANT "Rt-Want" /* "session": the claimer resumes the session, which moves */

/*
** Sends subject a request for id and collects the answer's parts (cluster.h, "Sessions that
** move"): *out (malloc'ed) and *len, none when the holder had nothing to move. false when
** no answer came in time (a node gone) or it was not one.
*/
static bool request_parts(const char *subject, const char *id, bool want, uint8_t **out,
                          size_t *len)
{
    *out = NULL;
    *len = 0;
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    natsMsg *req = NULL;
    natsStatus s = natsInbox_Create(&inbox);
    /* On the one connection: NATS has the subscription before the request. */
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, C.nc, inbox);
    if (s == NATS_OK)
        s = natsMsg_Create(&req, subject, inbox, id, (int)strlen(id));
    if (s == NATS_OK && want)
        s = natsMsgHeader_Set(req, H_WANT, "session");
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(C.nc, req);
    natsMsg_Destroy(req);
    uint8_t *buf = NULL;
    size_t have = 0;
    for (unsigned got = 0, parts = 1; s == NATS_OK && got < parts;) {
        natsMsg *part = NULL;
        s = natsSubscription_NextMsg(&part, sub, TAKEOVER_WAIT_MS);
        if (s != NATS_OK)
            break;
        const char *h = NULL;
        unsigned i = 0, n = 0;
        size_t dlen = (size_t)natsMsg_GetDataLength(part);
        if (natsMsgHeader_Get(part, H_PART, &h) != NATS_OK || sscanf(h, "%u %u", &i, &n) != 2 ||
            (n && i != got + 1) || n > RT_CLUSTER_MOVE_MAX / 1024 ||
            have + dlen > RT_CLUSTER_MOVE_MAX) {
            s = NATS_PROTOCOL_ERROR;
        } else if ((parts = n) != 0) {
            uint8_t *more = dlen ? realloc(buf, have + dlen) : buf;
            if (dlen && !more) {
                s = NATS_NO_MEMORY;
            } else {
                buf = more;
                memcpy(buf + have, natsMsg_GetData(part), dlen);
                have += dlen;
                got++;
            }
        }
        natsMsg_Destroy(part);
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    if (s != NATS_OK) {
        free(buf);
        return false;
    }
    *out = buf;
    *len = have;
    return true;
}

/* The holder node's subject for a request about its clients ("takeover", "handover"). */
static void node_subject(const char *holder, const char *what, char *out, size_t cap)
{
    char node[RT_CONF_NODE_MAX] = "";
    sscanf(holder, "%32s", node);
    snprintf(out, cap, "%s_ctl.node.%s.%s", C.prefix, node, what);
}

/* ---- Durable mode: sessions' records and the replay after a node's crash ---- */

/* In cluster_kv: a session's record (its bytes, malloc'ed) and where its replay starts. */
static uint8_t *session_record(const char *key, size_t *len, int64_t *from_ms)
{
    *len = 0;
    kvEntry *e = NULL;
    if (kvStore_Get(&e, C.sessions, key) != NATS_OK)
        return NULL;
    const uint8_t *v = kvEntry_Value(e);
    int vlen = kvEntry_ValueLen(e);
    uint8_t *bytes = vlen > 8 ? malloc((size_t)vlen - 8) : NULL;
    if (bytes) {
        uint64_t clear_ms = 0;
        for (int i = 0; i < 8; i++)
            clear_ms = clear_ms << 8 | v[i];
        memcpy(bytes, v + 8, (size_t)vlen - 8);
        *len = (size_t)vlen - 8;
        *from_ms = (int64_t)clear_ms - C.margin_ms > 0 ? (int64_t)clear_ms - C.margin_ms : 1;
    }
    kvEntry_Destroy(e);
    return bytes;
}

bool rt_cluster_durable(void)
{
    return C.on && C.durable;
}

void rt_cluster_session_record(const char *id, uint64_t clear_ms, const void *bytes, size_t len)
{
    size_t idlen = strlen(id);
    if (!atomic_load_explicit(&C.durable_ready, memory_order_acquire) ||
        idlen >= RT_CLIENT_TEXT_MAX)
        return;
    rt_msg_t *m = rt_msg_new(MSG_SESSION_PUT, sizeof(record_t) + idlen + len);
    if (!m) {
        atomic_fetch_add_explicit(&C.records_failed, 1, memory_order_relaxed);
        return;
    }
    record_t *r = (record_t *)(void *)m->data;
    r->clear_ms = clear_ms;
    r->id_len = (uint32_t)idlen;
    r->len = (uint32_t)len;
    memcpy(r->data, id, idlen);
    if (len)
        memcpy(r->data + idlen, bytes, len);
    rt_send_msg(atomic_load_explicit(&C.kv_pid, memory_order_acquire), m);
}

/* In cluster_kv: a record written (the clear moment, then the bytes) or deleted. */
static void session_put(const record_t *r)
{
    char id[RT_CLIENT_TEXT_MAX], key[3 * RT_CLIENT_TEXT_MAX + 1];
    snprintf(id, sizeof(id), "%.*s", (int)r->id_len, r->data);
    if (rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return;
    natsStatus s;
    if (!r->len) {
        s = kvStore_Delete(C.sessions, key);
    } else {
        uint8_t *v = malloc(8 + (size_t)r->len);
        if (!v) {
            s = NATS_NO_MEMORY;
        } else {
            for (int i = 0; i < 8; i++)
                v[i] = (uint8_t)(r->clear_ms >> (56 - 8 * i));
            memcpy(v + 8, r->data + r->id_len, r->len);
            s = kvStore_Put(NULL, C.sessions, key, v, (int)(8 + r->len));
            free(v);
        }
    }
    if (s != NATS_OK &&
        atomic_fetch_add_explicit(&C.records_failed, 1, memory_order_relaxed) % 1000 == 0)
        rt_log(RT_LOG_WARNING, "cluster.session_record_failed", "client=%s: %s", id,
               natsStatus_GetText(s));
}

static void put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

/*
** In cluster_kv: every message the stream kept from from_ms up to its last one now (after
** NATS holds the session's subscriptions here), as the replay's bytes for
** RT_CLUSTER_MSG_MOVE_IN: "RTR1", then per message its origin key and number (u64 each),
** length (u32) and PUBLISH. The session keeps those its subscriptions match. NULL if the
** stream did not answer.
*/
static uint8_t *replay_bytes(int64_t from_ms, size_t *len, size_t *count)
{
    *len = *count = 0;
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    if (js_GetStreamInfo(&si, C.js, C.stream, NULL, &jerr) != NATS_OK)
        return NULL;
    uint64_t last = si->State.LastSeq;
    bool none = !last || si->State.LastTime < from_ms * 1000000LL;
    jsStreamInfo_Destroy(si);
    size_t cap = 4096, at = 4;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return NULL;
    memcpy(buf, "RTR1", 4);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = C.stream;
    so.Config.DeliverPolicy = js_DeliverByStartTime;
    so.Config.OptStartTime = from_ms * 1000000LL;
    so.Config.AckPolicy = js_AckNone;
    char all[RT_CONF_NODE_MAX + 4];
    snprintf(all, sizeof(all), "%s.>", C.prefix);
    natsStatus s = none ? NATS_OK : js_SubscribeSync(&sub, C.js, all, NULL, &so, &jerr);
    for (uint64_t seq = 0; !none && s == NATS_OK && seq < last;) {
        natsMsg *nm = NULL;
        jsMsgMetaData *meta = NULL;
        s = natsSubscription_NextMsg(&nm, sub, JETSTREAM_WAIT_MS);
        if (s == NATS_OK && natsMsg_GetMetaData(&meta, nm) == NATS_OK) {
            seq = meta->Sequence.Stream;
            jsMsgMetaData_Destroy(meta);
        }
        origin_name_t o;
        rt_bin_t *bin = s == NATS_OK ? inbound_message(nm, &o) : NULL;
        size_t need = bin ? 20 + rt_bin_len(bin) : 0;
        if (bin && at + need > cap) {
            while (cap < at + need)
                cap *= 2;
            uint8_t *more = cap <= RT_CLUSTER_MOVE_MAX ? realloc(buf, cap) : NULL;
            if (!more)
                s = NATS_NO_MEMORY;
            else
                buf = more;
        }
        if (bin && s == NATS_OK) {
            put_be(buf + at, node_key(o.node, o.incarnation), 8);
            put_be(buf + at + 8, o.seq, 8);
            put_be(buf + at + 16, rt_bin_len(bin), 4);
            memcpy(buf + at + 20, rt_bin_data(bin), rt_bin_len(bin));
            at += need;
            ++*count;
        }
        if (bin)
            rt_bin_release(bin);
        natsMsg_Destroy(nm);
    }
    if (sub) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
    if (s != NATS_OK) {
        rt_log(RT_LOG_WARNING, "cluster.replay_failed", "stream=%s after %zu messages: %s",
               C.stream, *count, natsStatus_GetText(s));
        free(buf);
        return NULL;
    }
    *len = at;
    return buf;
}

/* In cluster_kv: the id recorded as this node's, by compare-and-swap. A session that moves
   here (want_session) is imported, and *moving says the claim is answered later. */
static int claim(const claim_t *cl, const char *id, bool *moving)
{
    char key[3 * RT_CLIENT_TEXT_MAX + 1];
    if (rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return RT_EINVAL;
    /* Cut off from NATS: say so now rather than after JetStream's timeout. */
    if (natsConnection_Status(C.nc) != NATS_CONN_STATUS_CONNECTED)
        return RT_EAGAIN;
    for (int attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
        kvEntry *e = NULL;
        natsStatus s = kvStore_Get(&e, C.clients, key);
        uint64_t rev = 0;
        if (s == NATS_NOT_FOUND) {
            s = kvStore_CreateString(&rev, C.clients, key, C.value);
            if (s == NATS_OK)
                return 0;
            continue; /* another node made it first */
        }
        if (s != NATS_OK)
            return RT_EAGAIN;
        char holder[sizeof(C.value)];
        snprintf(holder, sizeof(holder), "%.*s", kvEntry_ValueLen(e),
                 (const char *)kvEntry_Value(e));
        rev = kvEntry_Revision(e);
        kvEntry_Destroy(e);
        if (strcmp(holder, C.value) == 0)
            return 0;
        /* No answer (a node gone) is fine: the id is taken over without its session. */
        char subject[RT_CONF_NODE_MAX * 2 + 24];
        node_subject(holder, "takeover", subject, sizeof(subject));
        uint8_t *session = NULL;
        size_t len = 0;
        bool answered = request_parts(subject, id, cl->want_session, &session, &len);
        if (kvStore_UpdateString(NULL, C.clients, key, C.value, rev) != NATS_OK) {
            if (len)
                rt_log(RT_LOG_WARNING, "cluster.session_lost",
                       "client=%s from=%s: another node claimed the id while its session moved", id,
                       holder);
            free(session);
            continue;
        }
        atomic_fetch_add_explicit(&C.claims_taken_over, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.client_taken_over", "client=%s from=%s session_bytes=%zu", id,
               holder, len);
        /* Its node is gone (no answer): durable mode has the session's record. */
        int64_t replay_from_ms = 0;
        if (!answered && cl->want_session &&
            atomic_load_explicit(&C.durable_ready, memory_order_acquire))
            session = session_record(key, &len, &replay_from_ms);
        rt_pid_t imported = len && C.import ? C.import(id, session, len) : 0;
        free(session);
        if (len && !imported) {
            atomic_fetch_add_explicit(&C.sessions_move_failed, 1, memory_order_relaxed);
            rt_log(RT_LOG_ERROR, "cluster.session_lost",
                   "client=%s from=%s: its session could not be read here", id, holder);
        }
        if (!imported)
            return 0;
        /* Through the cluster actor, after the session's subscriptions (cluster.h). */
        rt_msg_t *m = rt_msg_new(MSG_MOVE_SYNC, sizeof(move_t) + strlen(id));
        if (!m)
            return 0;
        move_t *mv = (move_t *)(void *)m->data;
        mv->reply_to = cl->reply_to;
        mv->session = imported;
        mv->replay_from_ms = replay_from_ms;
        snprintf(mv->holder, sizeof(mv->holder), "%.*s", (int)strcspn(holder, " "), holder);
        mv->len = (uint32_t)strlen(id);
        memcpy(mv->id, id, mv->len);
        *moving = rt_send_msg(atomic_load_explicit(&C.out_pid, memory_order_acquire), m) == 0;
        return 0;
    }
    return RT_EAGAIN;
}

static void claim_one(const claim_t *cl)
{
    char id[RT_CLIENT_TEXT_MAX];
    snprintf(id, sizeof(id), "%.*s", (int)cl->len, cl->id);
    bool moving = false;
    rt_cluster_claimed_t r = {.status = claim(cl, id, &moving)};
    atomic_fetch_add_explicit(r.status ? &C.claims_failed : &C.claims, 1, memory_order_relaxed);
    if (r.status)
        rt_log(RT_LOG_WARNING, "cluster.claim_failed", "client=%s: %s", id,
               r.status == RT_EAGAIN ? "JetStream did not answer, or other nodes kept claiming it"
                                     : "the id cannot be a key");
    if (!moving)
        rt_send(cl->reply_to, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r));
}

/* In cluster_kv: what the old holder queued since phase 1, to the imported session (none
   if the old node is gone); then the CONNECT goes on. */
static void move_tail(const move_t *mv)
{
    char id[RT_CLIENT_TEXT_MAX], subject[RT_CONF_NODE_MAX * 2 + 24];
    snprintf(id, sizeof(id), "%.*s", (int)mv->len, mv->id);
    node_subject(mv->holder, "handover", subject, sizeof(subject));
    uint8_t *tail = NULL;
    size_t len = 0, replayed = 0;
    bool answered;
    if (mv->replay_from_ms) {
        answered = (tail = replay_bytes(mv->replay_from_ms, &len, &replayed)) != NULL;
        atomic_fetch_add_explicit(&C.replays, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&C.replayed, replayed, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.session_replayed",
               "client=%s from=%s since_ms=%" PRId64 " messages=%zu", id, mv->holder,
               mv->replay_from_ms, replayed);
    } else {
        answered = request_parts(subject, id, true, &tail, &len);
    }
    rt_msg_t *m = rt_msg_new(RT_CLUSTER_MSG_MOVE_IN, len);
    if (m) {
        if (len)
            memcpy(m->data, tail, len);
        if (rt_send_msg(mv->session, m) != 0)
            answered = false;
    }
    free(tail);
    atomic_fetch_add_explicit(answered && m ? &C.sessions_moved_in : &C.sessions_move_failed, 1,
                              memory_order_relaxed);
    if (!answered || !m)
        rt_log(RT_LOG_WARNING, "cluster.session_tail_lost",
               "client=%s from=%s: what its old node queued after the move did not arrive", id,
               mv->holder);
    rt_cluster_claimed_t r = {.status = 0};
    rt_send(mv->reply_to, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r));
}

bool rt_cluster_claim(rt_pid_t reply_to, const char *id, size_t len, bool want_session)
{
    if (!C.on)
        return false;
    rt_msg_t *m = rt_msg_new(MSG_CLAIM, sizeof(claim_t) + len);
    /* No registry reachable yet (JetStream not answering since the start): unclaimed. */
    if (!m || len >= RT_CLIENT_TEXT_MAX ||
        !atomic_load_explicit(&C.kv_ready, memory_order_acquire)) {
        rt_msg_free(m);
        atomic_fetch_add_explicit(&C.claims_failed, 1, memory_order_relaxed);
        rt_cluster_claimed_t r = {.status = RT_EAGAIN};
        return rt_send(reply_to, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r)) == 0;
    }
    claim_t *cl = (claim_t *)(void *)m->data;
    cl->reply_to = reply_to;
    cl->want_session = want_session;
    cl->len = (uint32_t)len;
    memcpy(cl->id, id, len);
    return rt_send_msg(atomic_load_explicit(&C.kv_pid, memory_order_acquire), m) == 0;
}

void rt_cluster_set_importer(rt_cluster_import_fn fn)
{
    C.import = fn;
}

/* An answer for the cluster actor to send, in parts (send_reply). */
static void answer(const char *reply, size_t rlen, const void *bytes, size_t len)
{
    rt_msg_t *m = rlen ? rt_msg_new(MSG_REPLY, sizeof(reply_t) + rlen + len) : NULL;
    if (!m)
        return;
    reply_t *r = (reply_t *)(void *)m->data;
    r->subject_len = (uint32_t)rlen;
    r->data_len = (uint32_t)len;
    memcpy(r->text, reply, rlen);
    if (len)
        memcpy(r->text + rlen, bytes, len);
    rt_send_msg(atomic_load_explicit(&C.out_pid, memory_order_acquire), m);
}

void rt_cluster_move_answer(const rt_cluster_move_t *req, const void *bytes, size_t len)
{
    if (len)
        atomic_fetch_add_explicit(&C.sessions_moved_out, req->phase == 1, memory_order_relaxed);
    answer(req->reply, req->reply_len, bytes, len);
}

void rt_cluster_answer(const char *reply, const void *bytes, size_t len)
{
    answer(reply, strlen(reply), bytes, len);
}

void rt_cluster_set_admin(rt_cluster_admin_fn fn)
{
    C.admin = fn;
}

/* In cluster_in: another node's administrator asks this node (a request line). */
static void admin_asked(natsMsg *nm)
{
    const char *reply = natsMsg_GetReply(nm);
    int len = natsMsg_GetDataLength(nm);
    if (!reply || !reply[0])
        return;
    static const char busy[] = "503 this node cannot answer now\n";
    if (!C.admin || len <= 0 || len > 4096 || !C.admin(natsMsg_GetData(nm), (size_t)len, reply))
        answer(reply, strlen(reply), busy, sizeof(busy) - 1);
}

bool rt_cluster_client_holder(const char *id, char *node, size_t cap)
{
    char key[3 * RT_CLIENT_TEXT_MAX + 1];
    if (!atomic_load_explicit(&C.kv_ready, memory_order_acquire) ||
        rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return false;
    kvEntry *e = NULL;
    if (kvStore_Get(&e, C.clients, key) != NATS_OK)
        return false;
    snprintf(node, cap, "%.*s", (int)strcspn(kvEntry_ValueString(e), " "), kvEntry_ValueString(e));
    kvEntry_Destroy(e);
    return node[0] != 0;
}

bool rt_cluster_ask_node(const char *node, const char *line, uint8_t **answer_out, size_t *len)
{
    char subject[RT_CONF_NODE_MAX * 2 + 24];
    node_subject(node, "admin", subject, sizeof(subject));
    return C.on && request_parts(subject, line, false, answer_out, len) && *len;
}

/*
** In cluster_in: another node claims an id (phase 1) or takes the rest of a session that is
** moving (phase 2). A session's holder answers itself (RT_CLUSTER_MSG_MOVE_OUT); otherwise
** a client here ends as a takeover and the answer is "nothing".
*/
static void give_up(natsMsg *nm, uint32_t phase)
{
    char id[RT_CLIENT_TEXT_MAX];
    int len = natsMsg_GetDataLength(nm);
    snprintf(id, sizeof(id), "%.*s", len, natsMsg_GetData(nm));
    rt_pid_t holder = (size_t)len < sizeof(id) ? rt_broker_lookup_client(id) : 0;
    const char *reply = natsMsg_GetReply(nm), *want = NULL;
    size_t rlen = reply ? strlen(reply) : 0;
    if (holder && (phase == 2 || natsMsgHeader_Get(nm, H_WANT, &want) == NATS_OK)) {
        rt_msg_t *m = rt_msg_new(RT_CLUSTER_MSG_MOVE_OUT, sizeof(rt_cluster_move_t) + rlen);
        if (m) {
            rt_cluster_move_t *mv = (rt_cluster_move_t *)(void *)m->data;
            mv->phase = phase;
            mv->reply_len = (uint32_t)rlen;
            memcpy(mv->reply, reply, rlen);
            if (rt_send_msg(holder, m) == 0)
                return;
        }
    }
    if (holder && phase == 1) {
        rt_exit_signal(holder, RT_REASON_TAKEOVER);
        atomic_fetch_add_explicit(&C.given_up, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.client_given_up", "client=%s: claimed by another node", id);
    }
    answer(reply, rlen, NULL, 0);
}

/* In the cluster actor: an answer in parts that fit NATS's max_payload ("0 0": none). */
static void send_reply(const reply_t *r)
{
    char subject[RT_SUBJECT_MAX + 1];
    if (r->subject_len > RT_SUBJECT_MAX)
        return;
    memcpy(subject, r->text, r->subject_len);
    subject[r->subject_len] = 0;
    const char *data = r->text + r->subject_len;
    int64_t max = natsConnection_GetMaxPayload(C.nc);
    size_t part = max > 8192 ? (size_t)max - 4096 : 4096; /* room for the headers */
    unsigned n = (unsigned)((r->data_len + part - 1) / part);
    natsStatus s = NATS_OK;
    for (unsigned i = 0; s == NATS_OK && i < (n ? n : 1); i++) {
        size_t at = (size_t)i * part, len = n ? r->data_len - at : 0;
        char h[32];
        snprintf(h, sizeof(h), "%u %u", n ? i + 1 : 0, n);
        natsMsg *nm = NULL;
        s = natsMsg_Create(&nm, subject, NULL, data + at, (int)(len < part ? len : part));
        if (s == NATS_OK)
            s = natsMsgHeader_Set(nm, H_PART, h);
        if (s == NATS_OK)
            s = natsConnection_PublishMsg(C.nc, nm);
        natsMsg_Destroy(nm);
    }
    if (s != NATS_OK)
        rt_log(RT_LOG_WARNING, "cluster.answer_failed", "subject=%s bytes=%u: %s", subject,
               r->data_len, natsStatus_GetText(s));
}

/* ---- Heartbeats: what each node holds, once a second ---- */

/* A heartbeat's text: "key value" lines, then "rule name matched passed failed rows". */
static size_t heartbeat_text(char *out, size_t cap)
{
    rt_broker_counts_t n;
    rt_broker_counts(&n);
    int at =
        snprintf(out, cap,
                 "node %s\nuptime_s %" PRIu64 "\nconnections %" PRIu64 "\nsessions %" PRIu64
                 "\nroutes %" PRIu64 "\nforwarded_in %" PRIu64 "\nforwarded_out %" PRIu64 "\n",
                 C.node, (rt_mono_ms() - C.started_ms) / 1000, n.connections.count,
                 n.sessions.count, (uint64_t)atomic_load(&C.routes_count),
                 (uint64_t)atomic_load(&C.forwarded_in), (uint64_t)atomic_load(&C.forwarded_out));
    static rt_rule_info_t rules[RT_CLUSTER_RULES_MAX]; /* the cluster actor's own */
    size_t nr = rt_rules_snapshot(rules, RT_CLUSTER_RULES_MAX);
    for (size_t i = 0; i < nr && i < RT_CLUSTER_RULES_MAX && at > 0 && (size_t)at < cap; i++)
        at += snprintf(out + at, cap - (size_t)at,
                       "rule %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", rules[i].name,
                       rules[i].matched, rules[i].passed, rules[i].failed, rules[i].rows_out);
    return at > 0 && (size_t)at < cap ? (size_t)at : 0;
}

static bool parse_heartbeat(const char *text, size_t len, rt_cluster_node_t *n)
{
    memset(n, 0, sizeof(*n));
    char line[256];
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = (size_t)((nl ? nl : end) - p);
        snprintf(line, sizeof(line), "%.*s", (int)(ll < sizeof(line) ? ll : sizeof(line) - 1), p);
        p = nl ? nl + 1 : end;
        char key[24];
        uint64_t v = 0;
        rt_cluster_rule_count_t r;
        if (sscanf(line, "rule %63s %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, r.name,
                   &r.matched, &r.passed, &r.failed, &r.rows_out) == 5) {
            if (n->nrules < RT_CLUSTER_RULES_MAX)
                n->rules[n->nrules++] = r;
        } else if (sscanf(line, "node %32s", n->node) == 1) {
        } else if (sscanf(line, "%23s %" SCNu64, key, &v) == 2) {
            if (!strcmp(key, "uptime_s"))
                n->uptime_s = v;
            else if (!strcmp(key, "connections"))
                n->connections = v;
            else if (!strcmp(key, "sessions"))
                n->sessions = v;
            else if (!strcmp(key, "routes"))
                n->routes = v;
            else if (!strcmp(key, "forwarded_in"))
                n->forwarded_in = v;
            else if (!strcmp(key, "forwarded_out"))
                n->forwarded_out = v;
        }
    }
    return n->node[0] != 0;
}

/* Keeps a node's last heartbeat (this node's own too, without a round trip). */
static void node_heard(const rt_cluster_node_t *n)
{
    pthread_mutex_lock(&C.nodes_lock);
    size_t i = 0, forgotten = C.nnodes;
    uint64_t now = rt_mono_ms();
    while (i < C.nnodes && strcmp(C.nodes[i].node, n->node) != 0) {
        if (now - C.nodes_seen_ms[i] > RT_CLUSTER_FORGET_MS)
            forgotten = i;
        i++;
    }
    if (i == C.nnodes)
        i = forgotten; /* a new node takes a forgotten one's slot, if any */
    if (i == C.nnodes && C.nnodes < RT_CLUSTER_NODES_MAX)
        C.nnodes++;
    if (i < C.nnodes) {
        C.nodes[i] = *n;
        C.nodes_seen_ms[i] = rt_mono_ms();
    }
    pthread_mutex_unlock(&C.nodes_lock);
}

/* In cluster_in: another node's heartbeat (this node's own is kept as it is sent). */
static void other_heartbeat(natsMsg *nm)
{
    rt_cluster_node_t heard;
    if (parse_heartbeat(natsMsg_GetData(nm), (size_t)natsMsg_GetDataLength(nm), &heard) &&
        strcmp(heard.node, C.node) != 0)
        node_heard(&heard);
}

static int node_order(const void *a, const void *b)
{
    return strcmp(((const rt_cluster_node_t *)a)->node, ((const rt_cluster_node_t *)b)->node);
}

size_t rt_cluster_nodes(rt_cluster_node_t *out, size_t max)
{
    pthread_mutex_lock(&C.nodes_lock);
    uint64_t now = rt_mono_ms();
    size_t n = 0;
    for (size_t i = 0; i < C.nnodes && n < max; i++) {
        uint64_t age = now - C.nodes_seen_ms[i];
        if (age > RT_CLUSTER_FORGET_MS)
            continue;
        out[n] = C.nodes[i];
        out[n].age_ms = age;
        out[n++].up = age <= RT_CLUSTER_SILENT_MS;
    }
    pthread_mutex_unlock(&C.nodes_lock);
    qsort(out, n, sizeof(out[0]), node_order);
    return n;
}

/* In the cluster actor, once a second: this node's heartbeat, published and kept. */
static void send_heartbeat(rt_actor_t *self)
{
    if (!C.status_sub) {
        char all[RT_CONF_NODE_MAX + 16];
        snprintf(all, sizeof(all), "%s_ctl.status.*", C.prefix);
        natsConnection_Subscribe(&C.status_sub, C.nc, all, on_message, (void *)heartbeat);
    }
    static char text[RT_CLUSTER_RULES_MAX * 128 + 512];
    size_t len = heartbeat_text(text, sizeof(text));
    rt_cluster_node_t me;
    if (len && parse_heartbeat(text, len, &me)) {
        node_heard(&me);
        char subject[RT_CONF_NODE_MAX * 2 + 16];
        snprintf(subject, sizeof(subject), "%s_ctl.status.%s", C.prefix, C.node);
        natsConnection_Publish(C.nc, subject, text, (int)len);
    }
    if (!atomic_load(&C.stopping))
        rt_send_after_tag(RT_CLUSTER_HEARTBEAT_MS, rt_self(self), MSG_HEARTBEAT, NULL);
}

/* ---- Interest (the cluster actor) ---- */

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* The name of one run of a node in its messages' origins (rt_message_set_origin). */
static uint64_t node_key(const char *node, uint64_t incarnation)
{
    return fnv1a(node, strlen(node)) ^ (incarnation * 0x9E3779B97F4A7C15ull);
}

/* The slot of filter: where it is, or the free slot it would take; NULL when full. */
static route_t *route_slot(const char *filter, size_t len)
{
    if (!C.routes_cap)
        return NULL;
    size_t mask = C.routes_cap - 1, i = fnv1a(filter, len) & mask;
    route_t *tomb = NULL;
    for (size_t n = 0; n < C.routes_cap; n++, i = (i + 1) & mask) {
        route_t *r = &C.routes[i];
        if (!r->filter) {
            if (!r->removed)
                return tomb ? tomb : r;
            if (!tomb)
                tomb = r;
        } else if (r->len == len && memcmp(r->filter, filter, len) == 0) {
            return r;
        }
    }
    return tomb;
}

/* Keeps the table under 3/4 full, tombstones included; the rehash drops them. */
static bool routes_room(rt_actor_t *self)
{
    if ((C.routes_used + 1) * 4 < C.routes_cap * 3)
        return true;
    size_t cap = C.routes_cap ? C.routes_cap : 64;
    while ((C.routes_live + 1) * 2 > cap)
        cap *= 2;
    route_t *old = C.routes, *fresh = calloc(cap, sizeof(route_t));
    if (!fresh)
        return false;
    size_t old_cap = C.routes_cap;
    C.routes = fresh;
    C.routes_cap = cap;
    C.routes_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].filter) {
            *route_slot(old[i].filter, old[i].len) = old[i];
            C.routes_used++;
        }
    rt_charge(self, (ptrdiff_t)((cap - old_cap) * sizeof(route_t)));
    free(old);
    return true;
}

static void shared_done(void *closure)
{
    free(closure);
}

static void subscribe(rt_actor_t *self, const char *filter, size_t len)
{
    const char *group = NULL, *f = filter;
    size_t glen = 0, flen = len;
    if (len > 7 && memcmp(filter, "$share/", 7) == 0) {
        group = filter + 7;
        const char *slash = memchr(group, '/', len - 7);
        if (!slash)
            return;
        glen = (size_t)(slash - group);
        f = slash + 1;
        flen = len - (size_t)(f - filter);
    }
    /* $SYS is each node's own: nothing arrives on it from others. */
    if (flen >= 4 && memcmp(f, "$SYS", 4) == 0)
        return;
    char subjects[2][RT_SUBJECT_MAX + 1];
    int n = rt_subjects_of_filter(C.prefix, f, flen, subjects);
    if (n < 0) {
        rt_log(RT_LOG_WARNING, "cluster.route_too_long",
               "filter=%.*s: longer than a NATS subject can be; other nodes' messages for it "
               "will not arrive",
               (int)(len > 200 ? 200 : len), filter);
        return;
    }
    route_t *r = routes_room(self) ? route_slot(filter, len) : NULL;
    if (r && r->filter)
        return; /* held already: the trie says "on" once per first subscriber */
    char *copy = r ? malloc(len + 1) : NULL;
    if (!copy) {
        rt_log(RT_LOG_ERROR, "cluster.route_failed", "filter=%.*s: out of memory",
               (int)(len > 200 ? 200 : len), filter);
        return;
    }
    memcpy(copy, filter, len);
    copy[len] = 0;
    *r = (route_t){.filter = copy, .len = (uint32_t)len};
    C.routes_used++;
    C.routes_live++;
    rt_charge(self, (ptrdiff_t)len + 1);
    char queue[32];
    snprintf(queue, sizeof(queue), "rtq_%016" PRIx64, fnv1a(filter, len));
    (void)glen;
    for (int i = 0; i < n; i++) {
        natsStatus s;
        if (group) {
            char *closure = strdup(copy);
            s = closure ? natsConnection_QueueSubscribe(&r->subs[r->nsubs], C.qc, subjects[i],
                                                        queue, on_message, closure)
                        : NATS_NO_MEMORY;
            if (s == NATS_OK)
                natsSubscription_SetOnCompleteCB(r->subs[r->nsubs], shared_done, closure);
            else
                free(closure);
        } else {
            s = natsConnection_Subscribe(&r->subs[r->nsubs], C.nc, subjects[i], on_message, NULL);
        }
        if (s == NATS_OK) {
            /* NATS's own bound on what waits for delivery; past it the server's messages
               for this subscription are dropped and counted (a slow consumer). */
            natsSubscription_SetPendingLimits(r->subs[r->nsubs], 65536, 64 * 1024 * 1024);
            r->nsubs++;
        } else {
            rt_log(RT_LOG_ERROR, "cluster.subscribe_failed", "subject=%s: %s", subjects[i],
                   natsStatus_GetText(s));
        }
    }
    atomic_store_explicit(&C.routes_count, C.routes_live, memory_order_relaxed);
}

static void unsubscribe(rt_actor_t *self, const char *filter, size_t len)
{
    route_t *r = route_slot(filter, len);
    if (!r || !r->filter)
        return;
    for (int i = 0; i < r->nsubs; i++) {
        natsSubscription_Unsubscribe(r->subs[i]);
        natsSubscription_Destroy(r->subs[i]);
    }
    rt_charge(self, -(ptrdiff_t)(r->len + 1));
    free(r->filter);
    *r = (route_t){.removed = true};
    C.routes_live--;
    atomic_store_explicit(&C.routes_count, C.routes_live, memory_order_relaxed);
}

/* The trie's hook: under a shard lock, so only a message goes from here. */
static void interest_changed(void *arg, const char *filter, size_t len, bool on)
{
    (void)arg;
    /* Connections unsubscribe as rtd stops, after the cluster has: nobody to tell. */
    if (atomic_load_explicit(&C.stopping, memory_order_relaxed))
        return;
    rt_msg_t *m = rt_msg_new(MSG_INTEREST, sizeof(interest_t) + len);
    if (m) {
        interest_t *in = (interest_t *)(void *)m->data;
        in->on = on;
        in->len = (uint32_t)len;
        memcpy(in->filter, filter, len);
    }
    /* Unmuted: the subscriber holds a trie lock, and must never wait for the cluster. */
    if (!m || rt_send_unmuted(atomic_load_explicit(&C.out_pid, memory_order_acquire), m) != 0)
        rt_log(RT_LOG_ERROR, "cluster.route_lost",
               "filter=%.*s on=%d: the cluster actor could not be told", (int)len, filter, on);
}

static int out_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&C.out_pid, rt_self(self), memory_order_release);
    return rt_send(rt_self(self), MSG_HEARTBEAT, NULL, 0);
}

/* Publishes a routed message; a retained one also goes to the bucket, then its ack. */
static void forward_one(rt_msg_t *m)
{
    rt_message_t msg;
    const forward_t *f = (const forward_t *)(const void *)m->data;
    rt_message_view(m->bin, &msg);
    publish(&msg, m->bin, f);
    if (!msg.retain || !atomic_load(&C.kv_ready))
        return;
    natsStatus s = kv_put(&msg, m->bin);
    if (s != NATS_OK) {
        atomic_fetch_add_explicit(&C.kv_put_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.retained_put_failed", "topic=%.*s: %s",
               (int)(msg.topic.len > 200 ? 200 : msg.topic.len), msg.topic.p,
               natsStatus_GetText(s));
    }
    if (f->ack_pid && !f->stream_ack) {
        rt_store_committed_t done = {.token = f->ack_token, .status = s == NATS_OK ? 0 : RT_EAGAIN};
        rt_send(f->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
    }
}

static void out_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_FORWARD && m->bin) {
        forward_one(m);
    } else if (m->tag == MSG_HEARTBEAT) {
        send_heartbeat(self);
    } else if (m->tag == MSG_REPLY && m->len >= sizeof(reply_t)) {
        send_reply((const reply_t *)(const void *)m->data);
    } else if (m->tag == MSG_MOVE_SYNC && m->len >= sizeof(move_t)) {
        /* The imported session's subscriptions were made before this message was sent:
           once the server has them, whatever the old holder queues after is its tail. */
        natsConnection_FlushTimeout(C.nc, JETSTREAM_WAIT_MS);
        rt_msg_t *tail = rt_msg_new(MSG_MOVE_TAIL, m->len);
        if (tail) {
            memcpy(tail->data, m->data, m->len);
            rt_send_msg(atomic_load_explicit(&C.kv_pid, memory_order_acquire), tail);
        }
    } else if (m->tag == MSG_INTEREST) {
        const interest_t *in = (const interest_t *)(const void *)m->data;
        if (in->on)
            subscribe(self, in->filter, in->len);
        else
            unsubscribe(self, in->filter, in->len);
    }
}

static const rt_actor_type_t out_type = {
    .name = "cluster",
    .init = out_init,
    .handle = out_handle,
    .flags = RT_TYPE_BLOCKING,
};

/*
** Requests that wait for JetStream's answer (claims, the retained store's last revision)
** have an actor of their own, so that a CONNECT being claimed never holds up the messages
** the cluster actor forwards.
*/
static int kv_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&C.kv_pid, rt_self(self), memory_order_release);
    /* Not here: init runs on the spawner's thread, and binding asks JetStream. */
    return rt_send(rt_self(self), MSG_KV_BIND, NULL, 0);
}

static void kv_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_KV_BIND)
        kv_bind(self);
    else if (m->tag == MSG_BARRIER && m->len >= sizeof(barrier_t))
        barrier_start(m);
    else if (m->tag == MSG_CLAIM && m->len >= sizeof(claim_t))
        claim_one((const claim_t *)(const void *)m->data);
    else if (m->tag == MSG_MOVE_TAIL && m->len >= sizeof(move_t))
        move_tail((const move_t *)(const void *)m->data);
    else if (m->tag == MSG_SESSION_PUT && m->len >= sizeof(record_t))
        session_put((const record_t *)(const void *)m->data);
}

static const rt_actor_type_t kv_type = {
    .name = "cluster_kv",
    .init = kv_init,
    .handle = kv_handle,
    .flags = RT_TYPE_BLOCKING,
};

/* ---- What arrives (libnats's delivery thread, then cluster_in) ---- */

static void backlog_release(size_t bytes)
{
    atomic_fetch_sub_explicit(&C.backlog_msgs, 1, memory_order_acq_rel);
    atomic_fetch_sub_explicit(&C.backlog_bytes, bytes, memory_order_acq_rel);
    if (atomic_load_explicit(&C.backlog_waiters, memory_order_acquire)) {
        pthread_mutex_lock(&C.backlog_lock);
        pthread_cond_broadcast(&C.backlog_cond);
        pthread_mutex_unlock(&C.backlog_lock);
    }
}

static bool backlog_full(void)
{
    return atomic_load_explicit(&C.backlog_msgs, memory_order_acquire) >=
               RT_CLUSTER_INBOUND_MAX_MSGS ||
           atomic_load_explicit(&C.backlog_bytes, memory_order_acquire) >=
               RT_CLUSTER_INBOUND_MAX_BYTES;
}

/* The delivery or watcher thread waits for room (never a scheduler): NATS's own pending
   limit, or JetStream's flow control, takes over meanwhile. */
static void backlog_wait(void)
{
    if (!backlog_full())
        return;
    pthread_mutex_lock(&C.backlog_lock);
    atomic_fetch_add_explicit(&C.backlog_waiters, 1, memory_order_acq_rel);
    while (backlog_full() && !atomic_load(&C.stopping)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&C.backlog_cond, &C.backlog_lock, &until);
    }
    atomic_fetch_sub_explicit(&C.backlog_waiters, 1, memory_order_acq_rel);
    pthread_mutex_unlock(&C.backlog_lock);
}

static void on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)nc;
    (void)sub;
    size_t bytes = (size_t)natsMsg_GetDataLength(msg) + 256;
    backlog_wait();
    rt_msg_t *m = rt_msg_new(MSG_INBOUND, sizeof(inbound_t));
    if (!m) {
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
        natsMsg_Destroy(msg);
        return;
    }
    *(inbound_t *)(void *)m->data = (inbound_t){.msg = msg, .share = closure, .bytes = bytes};
    if (!hand_in(m, bytes))
        natsMsg_Destroy(msg);
}

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

/* True the first time a copy of (node, incarnation, seq) is seen. */
static bool first_copy(in_state_t *st, const char *node, uint64_t inc, uint64_t seq)
{
    origin_t *o = NULL;
    for (unsigned i = 0; i < st->norigins && !o; i++)
        if (strcmp(st->origins[i].node, node) == 0)
            o = &st->origins[i];
    if (!o) {
        /* More nodes than slots: the oldest slot's node starts afresh (duplicates possible). */
        o = &st->origins[st->norigins < MAX_ORIGINS ? st->norigins++ : seq % MAX_ORIGINS];
        memset(o, 0, sizeof(*o));
        snprintf(o->node, sizeof(o->node), "%s", node);
        o->incarnation = inc;
    }
    if (o->incarnation != inc) {
        memset(o->bits, 0, sizeof(o->bits));
        o->incarnation = inc;
        o->top = 0;
    }
    if (seq + SEEN_WINDOW <= o->top)
        return false; /* older than the window: its copies have all been through */
    if (seq > o->top) {
        uint64_t shift = seq - o->top;
        if (shift >= SEEN_WINDOW) {
            memset(o->bits, 0, sizeof(o->bits));
        } else {
            for (uint64_t s = o->top + 1; s <= seq; s++)
                o->bits[(s % SEEN_WINDOW) / 64] &= ~(1ull << (s % 64));
        }
        o->top = seq;
    }
    uint64_t bit = 1ull << (seq % 64);
    uint64_t *w = &o->bits[(seq % SEEN_WINDOW) / 64];
    if (*w & bit)
        return false;
    *w |= bit;
    return true;
}

static size_t put_varint(uint8_t *p, uint32_t v)
{
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v);
    return n;
}

/*
** The canonical message of what arrived: an MQTT 5 PUBLISH made from the subject's topic,
** the payload and the headers, decoded as a client's would be. NULL if it is not valid.
*/
static rt_bin_t *message_of(natsMsg *nm, const char *topic, size_t tlen, unsigned qos,
                            unsigned retain, bool has_expiry, uint32_t expiry,
                            const char *props_hex, const char *clientid)
{
    size_t hexlen = props_hex ? strlen(props_hex) : 0;
    if (hexlen % 2 || hexlen / 2 > MQTT_MAX_PACKET)
        return NULL;
    size_t plen = hexlen / 2 + (has_expiry ? 5 : 0);
    size_t dlen = (size_t)natsMsg_GetDataLength(nm);
    uint8_t scratch[4];
    size_t rem = 2 + tlen + (qos ? 2 : 0) + put_varint(scratch, (uint32_t)plen) + plen + dlen;
    if (plen > MQTT_MAX_REMAINING || rem > MQTT_MAX_REMAINING)
        return NULL;
    uint8_t *pkt = malloc(1 + 4 + rem);
    if (!pkt)
        return NULL;
    size_t at = 0;
    pkt[at++] = (uint8_t)(0x30 | qos << 1 | retain);
    at += put_varint(pkt + at, (uint32_t)rem);
    pkt[at++] = (uint8_t)(tlen >> 8);
    pkt[at++] = (uint8_t)tlen;
    memcpy(pkt + at, topic, tlen);
    at += tlen;
    if (qos) {
        pkt[at++] = 0;
        pkt[at++] = 1;
    }
    at += put_varint(pkt + at, (uint32_t)plen);
    if (has_expiry) {
        pkt[at++] = MQTT_PROP_MESSAGE_EXPIRY;
        pkt[at++] = (uint8_t)(expiry >> 24);
        pkt[at++] = (uint8_t)(expiry >> 16);
        pkt[at++] = (uint8_t)(expiry >> 8);
        pkt[at++] = (uint8_t)expiry;
    }
    for (size_t i = 0; i < hexlen; i += 2) {
        int hi = hexval(props_hex[i]), lo = hexval(props_hex[i + 1]);
        if (hi < 0 || lo < 0) {
            free(pkt);
            return NULL;
        }
        pkt[at++] = (uint8_t)(hi << 4 | lo);
    }
    memcpy(pkt + at, natsMsg_GetData(nm), dlen);
    at += dlen;
    rt_bin_t *bin = NULL;
    mqtt_packet_t pk;
    if (mqtt_decode(pkt, at, MQTT_V5, &pk) == 0 && pk.type == MQTT_PUBLISH)
        bin = rt_message_new(&pk, clientid, NULL);
    free(pkt);
    return bin;
}

/* A shared group's message: to one member here (the group was picked on NATS). */
static void deliver_shared(const char *share, rt_bin_t *bin)
{
    rt_pid_t pid;
    rt_trie_opts_t o;
    if (rt_trie_share_pick(rt_broker->trie, share, strlen(share), 0, rt_route_member_alive, NULL,
                           &pid, &o) != 0)
        return; /* the last member left since NATS picked this node */
    rt_message_t msg;
    rt_message_view(bin, &msg);
    rt_delivery_t d = {.qos = o.qos < msg.qos ? o.qos : msg.qos,
                       .retain = o.retain_as_published ? msg.retain : 0,
                       .shared = 1,
                       .acl_check = o.acl_check,
                       .n_sub_ids = o.sub_id ? 1 : 0};
    if (msg.has_expiry && msg.expiry)
        d.expire_at_ms = rt_mono_ms() + (uint64_t)msg.expiry * 1000;
    rt_route_send(pid, bin, &d, &o.sub_id);
}

/*
** The canonical message another node sent (a route, a shared group's copy, or one replayed
** from the stream), named by its origin (rt_message_set_origin); NULL if it is not a valid
** one of rtd's.
*/
static rt_bin_t *inbound_message(natsMsg *nm, origin_name_t *o)
{
    const char *origin = NULL, *meta = NULL, *client = NULL, *props = NULL;
    char exp[16];
    unsigned qos = 0, retain = 0;
    if (natsMsgHeader_Get(nm, H_ORIGIN, &origin) != NATS_OK ||
        natsMsgHeader_Get(nm, H_MSG, &meta) != NATS_OK ||
        sscanf(origin, "%32s %" SCNx64 " %" SCNu64, o->node, &o->incarnation, &o->seq) != 3 ||
        sscanf(meta, "%u %u %15s", &qos, &retain, exp) != 3 || qos > 2 || retain > 1)
        return NULL;
    char topic[RT_SUBJECT_MAX + 1], id[RT_CLIENT_TEXT_MAX];
    const char *subject = natsMsg_GetSubject(nm);
    int tlen = rt_topic_of_subject(C.prefix, subject, strlen(subject), topic, sizeof(topic));
    bool has_id = natsMsgHeader_Get(nm, H_CLIENT, &client) == NATS_OK &&
                  unescape_text(client, id, sizeof(id));
    if (natsMsgHeader_Get(nm, H_PROPS, &props) != NATS_OK)
        props = NULL;
    char *end = NULL;
    unsigned long expiry = exp[0] == '-' ? 0 : strtoul(exp, &end, 10);
    rt_bin_t *bin = tlen > 0 && (exp[0] == '-' || (end && !*end && expiry <= UINT32_MAX))
                        ? message_of(nm, topic, (size_t)tlen, qos, retain, exp[0] != '-',
                                     (uint32_t)expiry, props, has_id ? id : NULL)
                        : NULL;
    if (bin)
        rt_message_set_origin(bin, node_key(o->node, o->incarnation), o->seq);
    return bin;
}

static void route_inbound(in_state_t *st, const inbound_t *in)
{
    natsMsg *nm = in->msg;
    origin_name_t o;
    /* Every copy goes through the same routing: the first one routes it, to everyone. */
    const char *origin = NULL;
    if (!in->share && natsMsgHeader_Get(nm, H_ORIGIN, &origin) == NATS_OK &&
        sscanf(origin, "%32s %" SCNx64 " %" SCNu64, o.node, &o.incarnation, &o.seq) == 3 &&
        !first_copy(st, o.node, o.incarnation, o.seq)) {
        atomic_fetch_add_explicit(&C.duplicates, 1, memory_order_relaxed);
        return;
    }
    rt_bin_t *bin = inbound_message(nm, &o);
    if (!bin) {
        atomic_fetch_add_explicit(&C.bad_in, 1, memory_order_relaxed);
        return;
    }
    const char *shared = NULL;
    if (!in->share)
        rt_route_remote(bin);
    else if (natsMsgHeader_Get(nm, H_SHARED, &shared) != NATS_OK)
        deliver_shared(in->share, bin);
    rt_bin_release(bin);
    atomic_fetch_add_explicit(&C.forwarded_in, 1, memory_order_relaxed);
}

/* A change of the replicated retained store, applied to this node's. */
static void apply_entry(const kv_entry_t *k)
{
    char topic[RT_SUBJECT_MAX + 1];
    int tlen = rt_topic_of_kv_key(k->kv, k->keylen, topic, sizeof(topic));
    if (tlen <= 0) {
        atomic_fetch_add_explicit(&C.bad_in, 1, memory_order_relaxed);
        return;
    }
    if (!k->put) {
        rt_route_retain_remote(topic, (size_t)tlen, NULL, 0);
        return;
    }
    const uint8_t *v = (const uint8_t *)k->kv + k->keylen;
    uint64_t at = 0;
    for (int i = 0; k->vallen > 8 && i < 8; i++)
        at = at << 8 | v[i];
    rt_bin_t *bin = k->vallen > 8 ? rt_message_parse(v + 8, k->vallen - 8) : NULL;
    rt_message_t msg;
    if (bin)
        rt_message_view(bin, &msg);
    if (!bin || msg.topic.len != (uint32_t)tlen || memcmp(msg.topic.p, topic, (size_t)tlen)) {
        atomic_fetch_add_explicit(&C.bad_in, 1, memory_order_relaxed);
        if (bin)
            rt_bin_release(bin);
        return;
    }
    uint64_t now = rt_wall_ms();
    if (at && at <= now) /* expired on its way */
        rt_route_retain_remote(topic, (size_t)tlen, NULL, 0);
    else
        rt_route_retain_remote(topic, (size_t)tlen, bin, at ? rt_mono_ms() + (at - now) : 0);
    rt_bin_release(bin);
}

/* How long a subscriber waits for this node's copy of the store to catch up, at most. */
#define BARRIER_MAX_MS 2000

/* Answers the barriers the applied revision has passed (or that waited too long). */
static void barriers_check(rt_actor_t *self, in_state_t *st)
{
    uint64_t applied = atomic_load(&C.kv_applied), now = rt_mono_ms();
    size_t kept = 0;
    for (size_t i = 0; i < st->nbarriers; i++) {
        rt_msg_t *w = st->barriers[i];
        const barrier_t *b = (const barrier_t *)(const void *)w->data;
        bool late = now - b->since_ms >= BARRIER_MAX_MS;
        if (b->revision > applied && !late) {
            st->barriers[kept++] = w;
            continue;
        }
        if (b->revision > applied)
            atomic_fetch_add_explicit(&C.barrier_timeouts, 1, memory_order_relaxed);
        rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
        if (r) {
            memcpy(r->data, b->data, b->len);
            rt_send_msg(b->reply_to, r);
        }
        rt_charge(self, -(ptrdiff_t)(sizeof(rt_msg_t) + w->len));
        rt_msg_free(w);
    }
    st->nbarriers = kept;
}

static void barrier_wait(rt_actor_t *self, in_state_t *st, rt_msg_t *m)
{
    rt_msg_t *keep = rt_msg_new(MSG_BARRIER_WAIT, m->len);
    if (keep && (st->nbarriers < st->capbarriers ||
                 rt_grow(&st->barriers, &st->capbarriers, st->nbarriers + 1,
                         sizeof(st->barriers[0]), 8) == 0)) {
        memcpy(keep->data, m->data, m->len);
        st->barriers[st->nbarriers++] = keep;
        rt_charge(self, (ptrdiff_t)(sizeof(rt_msg_t) + keep->len));
    } else {
        rt_msg_free(keep);
        /* No room to wait: answered now, with what this node has. */
        const barrier_t *b = (const barrier_t *)(const void *)m->data;
        rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
        if (r) {
            memcpy(r->data, b->data, b->len);
            rt_send_msg(b->reply_to, r);
        }
        return;
    }
    barriers_check(self, st);
}

static int in_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&C.in_pid, rt_self(self), memory_order_release);
    return 0;
}

static void in_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    in_state_t *st = state;
    if (m->tag == MSG_INBOUND) {
        const inbound_t *in = (const inbound_t *)(const void *)m->data;
        if (in->share == takeover_request)
            give_up(in->msg, 1);
        else if (in->share == handover_request)
            give_up(in->msg, 2);
        else if (in->share == admin_request)
            admin_asked(in->msg);
        else if (in->share == heartbeat)
            other_heartbeat(in->msg);
        else
            route_inbound(st, in);
        natsMsg_Destroy(in->msg);
        backlog_release(in->bytes);
    } else if (m->tag == MSG_KV_ENTRY) {
        const kv_entry_t *k = (const kv_entry_t *)(const void *)m->data;
        apply_entry(k);
        atomic_store(&C.kv_applied, k->revision);
        backlog_release(k->bytes);
        barriers_check(self, st);
    } else if (m->tag == MSG_BARRIER_WAIT && m->len >= sizeof(barrier_t)) {
        barrier_wait(self, st, m);
    } else if (m->tag == MSG_KV_TICK) {
        barriers_check(self, st);
    }
}

static void in_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    in_state_t *st = state;
    for (size_t i = 0; i < st->nbarriers; i++)
        rt_msg_free(st->barriers[i]);
    free(st->barriers);
}

/* What cluster_in never routed (it exited): still counted out of the backlog. */
static void in_dead_letter(void *state, rt_msg_t *m)
{
    if (m->tag == MSG_INBOUND) {
        const inbound_t *in = (const inbound_t *)(const void *)m->data;
        natsMsg_Destroy(in->msg);
        backlog_release(in->bytes);
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
    } else if (m->tag == MSG_KV_ENTRY) {
        backlog_release(((const kv_entry_t *)(const void *)m->data)->bytes);
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
    }
}

static const rt_actor_type_t in_type = {
    .name = "cluster_in",
    .state_size = sizeof(in_state_t),
    .init = in_init,
    .handle = in_handle,
    .terminate = in_terminate,
    .dead_letter = in_dead_letter,
};

/* ---- Connections ---- */

/*
** What rtd accepts should fit what NATS takes: a PUBLISH of max_packet_size with its headers
** under the server's max_payload (MQTT 5 properties travel hex-encoded: they count twice).
** Said at each connection; a message that does not fit stays on its node, and that is said
** too (cluster.forward_failed).
*/
static void check_max_payload(natsConnection *nc)
{
    int64_t max = natsConnection_GetMaxPayload(nc);
    if (max > 0 && max < C.max_packet + 4096)
        rt_log(RT_LOG_WARNING, "cluster.max_payload",
               "nats-server takes messages up to %" PRId64 " bytes, headers included, and rtd "
               "accepts packets up to %ld (max_packet_size): larger messages (MQTT 5 properties "
               "count twice) stay on their node. Set max_payload in nats-server to at least %ld "
               "(twice that for messages with large properties).",
               max, C.max_packet, C.max_packet + 4096);
}

/* Shared groups are the cluster's to serve while both connections are up (route.h). */
static void connection_state(const char *role, bool up)
{
    atomic_store(strcmp(role, "shared") == 0 ? &C.qc_up : &C.nc_up, up);
    rt_route_set_shared_by_cluster(atomic_load(&C.nc_up) && atomic_load(&C.qc_up));
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    connection_state(closure, false);
    if (!atomic_load(&C.stopping))
        rt_log(RT_LOG_WARNING, "cluster.disconnected", "connection=%s: NATS connection lost",
               (const char *)closure);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    char url[128] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof(url));
    atomic_fetch_add_explicit(&C.reconnects, 1, memory_order_relaxed);
    connection_state(closure, true);
    rt_log(RT_LOG_INFO, "cluster.reconnected", "connection=%s server=%s", (const char *)closure,
           url);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    if (err == NATS_SLOW_CONSUMER) {
        int64_t dropped = 0;
        if (sub)
            natsSubscription_GetDropped(sub, &dropped);
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.slow_consumer",
               "NATS dropped messages for this node (%" PRId64 " on the subscription so far)",
               dropped);
        return;
    }
    rt_log(RT_LOG_ERROR, "cluster.nats_error", "%s", natsStatus_GetText(err));
}

static void on_connected(natsConnection *nc, void *closure)
{
    connection_state(closure, true);
    if (strcmp(closure, "routes") == 0)
        check_max_payload(nc);
    char url[128] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof(url));
    rt_log(RT_LOG_INFO, "cluster.connected", "connection=%s server=%s", (const char *)closure, url);
}

static natsStatus connect_one(const rt_conf_t *conf, natsConnection **out, bool no_echo,
                              const char *role)
{
    natsOptions *o = NULL;
    const char *servers[RT_CONF_MAX_NATS];
    for (unsigned i = 0; i < conf->cluster.nnats; i++)
        servers[i] = conf->cluster.nats[i];
    char name[64];
    snprintf(name, sizeof(name), "rtd:%s:%s", conf->cluster.node, role);
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, servers, (int)conf->cluster.nnats);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)
        s = natsOptions_SetNoEcho(o, no_echo);
    if (s == NATS_OK)
        s = natsOptions_UseGlobalMessageDelivery(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1); /* a node keeps trying: NATS comes back */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, 250);
    if (s == NATS_OK)
        /* With a callback the connect goes on in the background (NULL would block here). */
        s = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, NULL);
    if (s == NATS_OK && conf->cluster.user[0])
        s = natsOptions_SetUserInfo(o, conf->cluster.user, conf->cluster.password);
    if (s == NATS_OK && conf->cluster.token[0])
        s = natsOptions_SetToken(o, conf->cluster.token);
    if (s == NATS_OK && conf->cluster.tls_ca[0])
        s = natsOptions_LoadCATrustedCertificates(o, conf->cluster.tls_ca);
    if (s == NATS_OK && conf->cluster.tls_cert[0])
        s = natsOptions_LoadCertificatesChain(o, conf->cluster.tls_cert, conf->cluster.tls_key);
    if (s == NATS_OK)
        s = natsConnection_Connect(out, o);
    if (s == NATS_OK) { /* connected in the call: the callback is not called for it */
        connection_state(role, true);
        if (no_echo)
            check_max_payload(*out);
    }
    if (s == NATS_NOT_YET_CONNECTED) {
        rt_log(RT_LOG_WARNING, "cluster.not_connected",
               "connection=%s: no NATS server answers yet; trying in the background", role);
        s = NATS_OK;
    }
    natsOptions_Destroy(o);
    return s;
}

static int out_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&out_type, NULL, opts, out);
}

static int in_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&in_type, NULL, opts, out);
}

static int kv_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&kv_type, NULL, opts, out);
}

/* Wakes a delivery thread waiting for room, for good: what arrives from now on is dropped. */
static void stop_waiting(void)
{
    atomic_store(&C.stopping, true);
    pthread_mutex_lock(&C.backlog_lock);
    pthread_cond_broadcast(&C.backlog_cond);
    pthread_mutex_unlock(&C.backlog_lock);
}

/* Once no actor of the cluster runs: nothing else makes libnats calls then. */
static void close_connections(void)
{
    if (atomic_load(&C.kv_ready)) {
        kvWatcher *w = atomic_load(&C.kv_watcher);
        if (w)
            kvWatcher_Stop(w);
        pthread_join(C.watcher, NULL);
    }
    natsSubscription *own[] = {C.takeover_sub, C.handover_sub, C.admin_sub, C.status_sub};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (own[i]) {
            natsSubscription_Unsubscribe(own[i]);
            natsSubscription_Destroy(own[i]);
        }
    C.takeover_sub = C.handover_sub = C.admin_sub = C.status_sub = NULL;
    kvStore_Destroy(C.clients);
    kvStore_Destroy(C.sessions);
    kvStore_Destroy(C.kv);
    jsCtx_Destroy(C.pjs);
    jsCtx_Destroy(C.js);
    C.sessions = NULL;
    C.pjs = NULL;
    C.clients = NULL;
    C.kv = NULL;
    C.js = NULL;
    natsConnection *conns[2] = {C.qc, C.nc};
    for (int i = 0; i < 2; i++)
        if (conns[i])
            natsConnection_Close(conns[i]);
    for (size_t i = 0; i < C.routes_cap; i++) {
        for (int k = 0; k < C.routes[i].nsubs; k++)
            natsSubscription_Destroy(C.routes[i].subs[k]);
        free(C.routes[i].filter);
    }
    free(C.routes);
    C.routes = NULL;
    C.routes_cap = C.routes_used = C.routes_live = 0;
    for (int i = 0; i < 2; i++)
        if (conns[i])
            natsConnection_Destroy(conns[i]);
    C.nc = C.qc = NULL;
}

int rt_cluster_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen)
{
    if (!conf->cluster.on)
        return 0;
    snprintf(C.node, sizeof(C.node), "%s", conf->cluster.node);
    snprintf(C.prefix, sizeof(C.prefix), "%s", conf->cluster.prefix);
    snprintf(C.bucket, sizeof(C.bucket), "%s_retained", conf->cluster.prefix);
    C.replicas = conf->cluster.replicas;
    C.max_packet = conf->max_packet_size;
    C.started_ms = rt_mono_ms();
    if (getrandom(&C.incarnation, sizeof(C.incarnation), 0) != sizeof(C.incarnation))
        C.incarnation = rt_wall_ms();
    C.sup = sup;
    C.node_key = node_key(C.node, C.incarnation);
    C.durable = conf->cluster.durable;
    C.margin_ms = conf->cluster.replay_margin * 1000;
    C.max_age_s = conf->max_session_expiry;
    snprintf(C.stream, sizeof(C.stream), "%s_msgs", conf->cluster.prefix);
    snprintf(C.value, sizeof(C.value), "%s %016" PRIx64, C.node, C.incarnation);
    /* One delivery thread for every subscription: what NATS sent arrives in its order. */
    natsStatus s = nats_Open(-1);
    if (s == NATS_OK)
        s = nats_SetMessageDeliveryPoolSize(1);
    if (s == NATS_OK)
        s = connect_one(conf, &C.nc, true, "routes");
    if (s == NATS_OK)
        s = connect_one(conf, &C.qc, false, "shared");
    if (s != NATS_OK) {
        snprintf(err, errlen, "cluster: cannot set up the NATS connection: %s",
                 natsStatus_GetText(s));
        stop_waiting();
        close_connections();
        return RT_EINVAL;
    }
    rt_child_spec_t children[] = {
        {.name = "cluster", .start = out_start, .restart = RT_PERMANENT},
        {.name = "cluster_in", .start = in_start, .restart = RT_PERMANENT},
        {.name = "cluster_kv", .start = kv_start, .restart = RT_PERMANENT},
    };
    rt_pid_t group;
    int rc = rt_group_start(sup, RT_CLUSTER_GROUP, RT_PERMANENT, &group);
    for (size_t i = 0; rc == 0 && i < sizeof(children) / sizeof(children[0]); i++)
        rc = rt_supervisor_start_child(group, &children[i], NULL);
    if (rc) {
        snprintf(err, errlen, "cluster: cannot start its actors: %s", rt_strerror(rc));
        stop_waiting();
        rt_group_stop(sup, RT_CLUSTER_GROUP);
        close_connections();
        return rc;
    }
    C.on = true;
    rt_trie_set_interest(rt_broker->trie, interest_changed, NULL);
    rt_message_keep_origins();
    rt_route_set_stamp(stamp);
    rt_route_set_forward(forward);
    char servers[512] = "";
    for (unsigned i = 0; i < conf->cluster.nnats; i++)
        snprintf(servers + strlen(servers), sizeof(servers) - strlen(servers), "%s%s", i ? "," : "",
                 conf->cluster.nats[i]);
    rt_log(RT_LOG_INFO, "cluster.started", "node=%s nats=%s prefix=%s", C.node, servers, C.prefix);
    return 0;
}

void rt_cluster_stop(void)
{
    if (!C.on)
        return;
    stop_waiting();
    rt_group_stop(C.sup, RT_CLUSTER_GROUP);
    close_connections();
    nats_CloseAndWait(2000);
}

bool rt_cluster_status(rt_cluster_status_t *st)
{
    memset(st, 0, sizeof(*st));
    if (!C.on)
        return false;
    snprintf(st->node, sizeof(st->node), "%s", C.node);
    natsConnection *nc = C.nc;
    const char *state = "closed";
    if (nc) {
        switch (natsConnection_Status(nc)) {
        case NATS_CONN_STATUS_CONNECTED:
            state = "connected";
            break;
        case NATS_CONN_STATUS_CONNECTING:
            state = "connecting";
            break;
        case NATS_CONN_STATUS_RECONNECTING:
            state = "reconnecting";
            break;
        default:
            break;
        }
        natsConnection_GetConnectedUrl(nc, st->server, sizeof(st->server));
        char **servers = NULL;
        int n = 0;
        if (natsConnection_GetServers(nc, &servers, &n) == NATS_OK) {
            for (int i = 0; i < n; i++) {
                size_t at = strlen(st->servers);
                snprintf(st->servers + at, sizeof(st->servers) - at, "%s%s", i ? "," : "",
                         servers[i]);
                free(servers[i]);
            }
            free(servers);
        }
    }
    snprintf(st->state, sizeof(st->state), "%s", state);
    st->routes = atomic_load(&C.routes_count);
    st->forwarded_out = atomic_load(&C.forwarded_out);
    st->forwarded_in = atomic_load(&C.forwarded_in);
    st->duplicates = atomic_load(&C.duplicates);
    st->forward_failed = atomic_load(&C.forward_failed);
    st->not_forwarded = atomic_load(&C.not_forwarded);
    st->bad_in = atomic_load(&C.bad_in);
    st->dropped_in = atomic_load(&C.dropped_in);
    st->inbound_backlog = atomic_load(&C.backlog_msgs);
    st->reconnects = atomic_load(&C.reconnects);
    st->retained_replicated = atomic_load(&C.kv_ready);
    st->retained_revision = atomic_load(&C.kv_applied);
    st->retained_put_failed = atomic_load(&C.kv_put_failed);
    st->retained_barrier_timeouts = atomic_load(&C.barrier_timeouts);
    st->claims = atomic_load(&C.claims);
    st->claims_taken_over = atomic_load(&C.claims_taken_over);
    st->claims_failed = atomic_load(&C.claims_failed);
    st->given_up = atomic_load(&C.given_up);
    st->sessions_moved_in = atomic_load(&C.sessions_moved_in);
    st->sessions_moved_out = atomic_load(&C.sessions_moved_out);
    st->sessions_move_failed = atomic_load(&C.sessions_move_failed);
    st->durable = C.durable && atomic_load(&C.durable_ready);
    st->stream_acked = atomic_load(&C.stream_acked);
    st->stream_failed = atomic_load(&C.stream_failed);
    st->session_records_failed = atomic_load(&C.records_failed);
    st->replays = atomic_load(&C.replays);
    st->replayed = atomic_load(&C.replayed);
    return true;
}

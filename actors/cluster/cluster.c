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
#include "subject.h"

enum {
    MSG_FORWARD = RT_MSG_USER, /* to cluster: bin, a message routed here */
    MSG_INTEREST,              /* to cluster: interest_t, a filter's first or last subscriber */
    MSG_INBOUND,               /* to cluster_in: inbound_t, what NATS delivered */
};

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
    _Atomic rt_pid_t out_pid, in_pid;
    /* The routes table: only the cluster actor touches it. */
    route_t *routes;
    size_t routes_cap, routes_used, routes_live;
    _Atomic uint64_t seq; /* of the messages this node publishes */
    /* Inbound backlog: what the delivery thread handed over and cluster_in has not routed. */
    pthread_mutex_t backlog_lock;
    pthread_cond_t backlog_cond;
    _Atomic uint64_t backlog_msgs, backlog_bytes;
    atomic_bool stopping;
    _Atomic uint64_t forwarded_out, forwarded_in, duplicates, forward_failed, not_forwarded, bad_in,
        dropped_in, reconnects, routes_count;
} C = {.backlog_lock = PTHREAD_MUTEX_INITIALIZER, .backlog_cond = PTHREAD_COND_INITIALIZER};

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

static void forward(rt_bin_t *bin)
{
    rt_msg_t *m = rt_msg_new(MSG_FORWARD, 0);
    if (!m) {
        atomic_fetch_add_explicit(&C.forward_failed, 1, memory_order_relaxed);
        return;
    }
    m->bin = rt_bin_retain(bin);
    /* A publisher waits (muted) while the cluster actor is behind, as for any overloaded
       receiver: what it routes here goes to the other nodes in its order, none dropped. */
    if (rt_send_msg(atomic_load_explicit(&C.out_pid, memory_order_acquire), m) != 0)
        atomic_fetch_add_explicit(&C.forward_failed, 1, memory_order_relaxed);
}

static void publish(const rt_message_t *msg)
{
    char subject[RT_SUBJECT_MAX + 1];
    if (rt_subject_of_topic(C.prefix, (const char *)msg->topic.p, msg->topic.len, subject,
                            sizeof(subject)) < 0) {
        atomic_fetch_add_explicit(&C.not_forwarded, 1, memory_order_relaxed);
        return;
    }
    natsMsg *nm = NULL;
    natsStatus s =
        natsMsg_Create(&nm, subject, NULL, (const char *)msg->payload.p, (int)msg->payload.len);
    char origin[RT_CONF_NODE_MAX + 48], meta[48];
    snprintf(origin, sizeof(origin), "%s %" PRIx64 " %" PRIu64, C.node, C.incarnation,
             atomic_fetch_add_explicit(&C.seq, 1, memory_order_relaxed) + 1);
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
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(C.nc, nm);
    natsMsg_Destroy(nm);
    atomic_fetch_add_explicit(s == NATS_OK ? &C.forwarded_out : &C.forward_failed, 1,
                              memory_order_relaxed);
}

/* ---- Interest (the cluster actor) ---- */

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
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

static void on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure);

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
    return 0;
}

static void out_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_FORWARD && m->bin) {
        rt_message_t msg;
        rt_message_view(m->bin, &msg);
        publish(&msg);
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

/* ---- What arrives (libnats's delivery thread, then cluster_in) ---- */

static void backlog_release(size_t bytes)
{
    uint64_t msgs = atomic_fetch_sub_explicit(&C.backlog_msgs, 1, memory_order_acq_rel) - 1;
    uint64_t held =
        atomic_fetch_sub_explicit(&C.backlog_bytes, bytes, memory_order_acq_rel) - bytes;
    if (msgs == RT_CLUSTER_INBOUND_MAX_MSGS / 2 || held < RT_CLUSTER_INBOUND_MAX_BYTES / 2) {
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

static void on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)nc;
    (void)sub;
    size_t bytes = (size_t)natsMsg_GetDataLength(msg) + 256;
    /* The delivery thread waits (never a scheduler): NATS's pending limit takes over. */
    pthread_mutex_lock(&C.backlog_lock);
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
    pthread_mutex_unlock(&C.backlog_lock);
    rt_msg_t *m = rt_msg_new(MSG_INBOUND, sizeof(inbound_t));
    if (!m) {
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
        natsMsg_Destroy(msg);
        return;
    }
    *(inbound_t *)(void *)m->data = (inbound_t){.msg = msg, .share = closure, .bytes = bytes};
    atomic_fetch_add_explicit(&C.backlog_msgs, 1, memory_order_acq_rel);
    atomic_fetch_add_explicit(&C.backlog_bytes, bytes, memory_order_acq_rel);
    if (rt_send_unmuted(atomic_load_explicit(&C.in_pid, memory_order_acquire), m) != 0) {
        atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
        backlog_release(bytes);
        natsMsg_Destroy(msg);
    }
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

static void route_inbound(in_state_t *st, const inbound_t *in)
{
    natsMsg *nm = in->msg;
    const char *origin = NULL, *meta = NULL, *client = NULL, *props = NULL;
    char node[RT_CONF_NODE_MAX], exp[16];
    uint64_t inc = 0, seq = 0;
    unsigned qos = 0, retain = 0;
    if (natsMsgHeader_Get(nm, H_ORIGIN, &origin) != NATS_OK ||
        natsMsgHeader_Get(nm, H_MSG, &meta) != NATS_OK ||
        sscanf(origin, "%32s %" SCNx64 " %" SCNu64, node, &inc, &seq) != 3 ||
        sscanf(meta, "%u %u %15s", &qos, &retain, exp) != 3 || qos > 2 || retain > 1) {
        atomic_fetch_add_explicit(&C.bad_in, 1, memory_order_relaxed);
        return;
    }
    /* Every copy goes through the same routing: the first one routes it, to everyone. */
    if (!in->share && !first_copy(st, node, inc, seq)) {
        atomic_fetch_add_explicit(&C.duplicates, 1, memory_order_relaxed);
        return;
    }
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
    if (!bin) {
        atomic_fetch_add_explicit(&C.bad_in, 1, memory_order_relaxed);
        return;
    }
    if (in->share)
        deliver_shared(in->share, bin);
    else
        rt_route_remote(bin);
    rt_bin_release(bin);
    atomic_fetch_add_explicit(&C.forwarded_in, 1, memory_order_relaxed);
}

static int in_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&C.in_pid, rt_self(self), memory_order_release);
    return 0;
}

static void in_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag != MSG_INBOUND)
        return;
    const inbound_t *in = (const inbound_t *)(const void *)m->data;
    route_inbound(state, in);
    natsMsg_Destroy(in->msg);
    backlog_release(in->bytes);
}

/* What cluster_in never routed (it exited): still counted out of the backlog. */
static void in_dead_letter(void *state, rt_msg_t *m)
{
    if (m->tag != MSG_INBOUND)
        return;
    const inbound_t *in = (const inbound_t *)(const void *)m->data;
    natsMsg_Destroy(in->msg);
    backlog_release(in->bytes);
    atomic_fetch_add_explicit(&C.dropped_in, 1, memory_order_relaxed);
}

static const rt_actor_type_t in_type = {
    .name = "cluster_in",
    .state_size = sizeof(in_state_t),
    .init = in_init,
    .handle = in_handle,
    .dead_letter = in_dead_letter,
};

/* ---- Connections ---- */

static void on_disconnected(natsConnection *nc, void *closure)
{
    rt_log(RT_LOG_WARNING, "cluster.disconnected", "connection=%s: NATS connection lost",
           (const char *)closure);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    char url[128] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof(url));
    atomic_fetch_add_explicit(&C.reconnects, 1, memory_order_relaxed);
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
        s = natsOptions_SetRetryOnFailedConnect(o, true, NULL, NULL);
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
    if (getrandom(&C.incarnation, sizeof(C.incarnation), 0) != sizeof(C.incarnation))
        C.incarnation = rt_wall_ms();
    C.sup = sup;
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
    };
    rt_pid_t group;
    int rc = rt_group_start(sup, RT_CLUSTER_GROUP, RT_PERMANENT, &group);
    for (size_t i = 0; rc == 0 && i < 2; i++)
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
    return true;
}

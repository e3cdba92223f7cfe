/*
** The traces that are on (trace.h): a set of at most RT_TRACE_MAX, published through RCU so a
** connection looks it up without a lock, replaced whole when a trace starts or stops (rare),
** under a mutex that orders those replacements.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mqtt_codec.h"
#include "rcu.h"
#include "topic_trie.h"
#include "trace.h"

struct rt_trace_s {
    uint64_t id;
    rt_pid_t tracer;
    rt_trace_kind_t kind;
    uint32_t payload_max;
    _Atomic size_t queued;    /* bytes sent to the tracer and not yet taken */
    _Atomic uint64_t seen;    /* packets the trace wanted */
    _Atomic uint64_t dropped; /* of those, not sent (the queue was full) */
    size_t len;
    char what[]; /* the client id or filter, NUL-terminated */
};

typedef struct {
    size_t n;
    rt_trace_t *t[RT_TRACE_MAX];
} trace_set_t;

_Atomic unsigned rt__trace_count;
static rt_rcu_t traces; /* trace_set_t *, NULL when none is on */
static pthread_mutex_t traces_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t next_trace_id = 1;

/* ---- A packet ---- */

/* The packet, decoded once for all the traces that want it. */
typedef struct {
    const uint8_t *raw;
    size_t len;
    uint8_t version;
    bool decoded;
    int err;
    mqtt_packet_t pk;
} packet_t;

static const mqtt_packet_t *packet_decode(packet_t *p)
{
    if (!p->decoded) {
        p->decoded = true;
        p->err = mqtt_decode(p->raw, p->len, p->version, &p->pk);
    }
    return p->err ? NULL : &p->pk;
}

/*
** A PUBLISH's topic read straight from its bytes, without decoding the rest: a topic trace
** looks at every PUBLISH and wants few. False for one that names its topic by alias only.
*/
static bool publish_topic(const packet_t *p, const uint8_t **topic, size_t *len)
{
    size_t at = 1;
    while (at < p->len && at < 5 && (p->raw[at] & 0x80))
        at++;
    at++; /* past the Remaining Length's last byte */
    if (at + 2 > p->len)
        return false;
    *len = (size_t)p->raw[at] << 8 | p->raw[at + 1];
    *topic = p->raw + at + 2;
    return *len && at + 2 + *len <= p->len;
}

static bool wants(const rt_trace_t *t, const char *client_id, packet_t *p)
{
    uint8_t type = p->raw[0] >> 4;
    if (t->kind == RT_TRACE_CLIENT) {
        if (client_id)
            return strcmp(client_id, t->what) == 0;
        /* Before the CONNECT is taken the connection has no id: the CONNECT says which. */
        const mqtt_packet_t *pk = type == MQTT_CONNECT ? packet_decode(p) : NULL;
        return pk && pk->connect.client_id.len == t->len &&
               memcmp(pk->connect.client_id.p, t->what, t->len) == 0;
    }
    const uint8_t *topic;
    size_t len;
    return type == MQTT_PUBLISH && publish_topic(p, &topic, &len) &&
           rt_topic_matches(t->what, t->len, (const char *)topic, len);
}

static size_t names_size(const mqtt_packet_t *pk)
{
    if (!pk)
        return 0;
    if (pk->type == MQTT_PUBLISH)
        return pk->publish.topic.len;
    if (pk->type != MQTT_SUBSCRIBE && pk->type != MQTT_UNSUBSCRIBE)
        return 0;
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (mqtt_sub_next(pk, &pos, &s))
        n += s.filter.len + 1;
    return n;
}

/* The event's fixed part and its names (topic, or filters each ended by a NUL). */
static void fill(rt_trace_event_t *ev, uint8_t *names, const packet_t *p, const mqtt_packet_t *pk)
{
    ev->type = p->raw[0] >> 4;
    ev->flags = p->raw[0] & 0x0F;
    ev->size = (uint32_t)p->len;
    ev->version = pk ? pk->version : p->version;
    ev->error = p->err && MQTT_IS_REASON_ERR(p->err) ? MQTT_ERR_REASON(p->err) : p->err ? 0x81 : 0;
    if (!pk)
        return;
    ev->packet_id = pk->packet_id;
    switch (pk->type) {
    case MQTT_CONNECT:
        ev->keepalive = pk->connect.keepalive;
        ev->clean_start = pk->connect.clean_start;
        break;
    case MQTT_CONNACK:
        ev->session_present = pk->connack.session_present;
        ev->has_reason = 1;
        break;
    case MQTT_PUBLISH:
        ev->payload_len = pk->publish.payload.len;
        ev->topic_alias = (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)) != 0;
        memcpy(names, pk->publish.topic.p, pk->publish.topic.len);
        break;
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
    case MQTT_DISCONNECT:
    case MQTT_AUTH:
        ev->has_reason = 1;
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE: {
        size_t pos = 0;
        mqtt_sub_t s;
        while (mqtt_sub_next(pk, &pos, &s)) {
            memcpy(names, s.filter.p, s.filter.len);
            names[s.filter.len] = 0;
            names += s.filter.len + 1;
            if (ev->ncodes < RT_TRACE_CODES_MAX)
                ev->codes[ev->ncodes++] = s.options;
            ev->codes_total += ev->codes_total < 255;
        }
        break;
    }
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        for (uint32_t i = 0; i < pk->codes.len; i++) {
            if (ev->ncodes < RT_TRACE_CODES_MAX)
                ev->codes[ev->ncodes++] = pk->codes.p[i];
            ev->codes_total += ev->codes_total < 255;
        }
        break;
    default:
        break;
    }
    /* Before MQTT 5 only CONNACK has a code (its return code). */
    ev->has_reason = ev->has_reason && (pk->version == MQTT_V5 || pk->type == MQTT_CONNACK);
    if (ev->has_reason)
        ev->reason = pk->reason;
}

/*
** A message for an event of len bytes to t's tracer, counted as one t wanted: NULL when it is
** dropped (t's queue full, or no memory), counted so.
*/
static rt_msg_t *event_new(rt_trace_t *t, size_t len)
{
    atomic_fetch_add_explicit(&t->seen, 1, memory_order_relaxed);
    rt_msg_t *m = NULL;
    if (atomic_fetch_add_explicit(&t->queued, len, memory_order_relaxed) + len <=
        RT_TRACE_QUEUED_MAX)
        m = rt_msg_new(RT_TRACE_MSG_EVENT, len);
    if (!m) {
        atomic_fetch_sub_explicit(&t->queued, len, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
    }
    return m;
}

/* Stamps ev, puts it at the head of m and sends m, or counts it dropped. */
static void event_send(rt_trace_t *t, rt_msg_t *m, rt_trace_event_t *ev)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    ev->unix_us = (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
    memcpy(m->data, ev, sizeof(*ev));
    size_t len = m->len;
    if (rt_send_unmuted(t->tracer, m) != 0) {
        atomic_fetch_sub_explicit(&t->queued, len, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
    }
}

static void send_event(rt_trace_t *t, rt_trace_dir_t dir, const char *client_id, packet_t *p)
{
    const mqtt_packet_t *pk = packet_decode(p);
    size_t client_len = 0;
    if (client_id)
        client_len = strlen(client_id);
    else if (pk && pk->type == MQTT_CONNECT)
        client_len = pk->connect.client_id.len;
    client_len = client_len > UINT16_MAX ? UINT16_MAX : client_len;
    size_t names_len = names_size(pk);
    size_t shown = 0;
    if (pk && pk->type == MQTT_PUBLISH)
        shown = pk->publish.payload.len < t->payload_max ? pk->publish.payload.len : t->payload_max;
    size_t len = sizeof(rt_trace_event_t) + client_len + names_len + shown;
    rt_msg_t *m = event_new(t, len);
    if (!m)
        return;
    rt_trace_event_t ev = {.trace_id = t->id, .dir = (uint8_t)dir};
    uint8_t *tail = (uint8_t *)m->data + sizeof(ev);
    fill(&ev, tail + client_len, p, pk);
    ev.client_len = (uint16_t)client_len;
    ev.names_len = (uint32_t)names_len;
    ev.shown_len = (uint32_t)shown;
    if (client_len)
        memcpy(tail, client_id ? (const uint8_t *)client_id : pk->connect.client_id.p, client_len);
    if (shown)
        memcpy(tail + client_len + names_len, pk->publish.payload.p, shown);
    event_send(t, m, &ev);
}

void rt_trace_packet(rt_trace_dir_t dir, const char *client_id, const uint8_t *raw, size_t len,
                     uint8_t version)
{
    if (!len)
        return;
    packet_t p = {.raw = raw, .len = len, .version = version};
    trace_set_t *set = rt_rcu_enter(&traces);
    for (size_t i = 0; set && i < set->n; i++)
        if (wants(set->t[i], client_id, &p))
            send_event(set->t[i], dir, client_id, &p);
    rt_rcu_leave();
}

static void send_stanza(rt_trace_t *t, rt_trace_dir_t dir, const char *jid, size_t jid_len,
                        const uint8_t *bytes, size_t len)
{
    const uint8_t *gt = memchr(bytes, '>', len < RT_TRACE_TAG_MAX ? len : RT_TRACE_TAG_MAX);
    size_t tag = gt ? (size_t)(gt - bytes) + 1 : (len < RT_TRACE_TAG_MAX ? len : RT_TRACE_TAG_MAX);
    size_t shown = len < t->payload_max ? len : t->payload_max;
    jid_len = jid_len > UINT16_MAX ? UINT16_MAX : jid_len;
    rt_msg_t *m = event_new(t, sizeof(rt_trace_event_t) + jid_len + tag + shown);
    if (!m)
        return;
    rt_trace_event_t ev = {.trace_id = t->id,
                           .dir = (uint8_t)dir,
                           .xmpp = 1,
                           .size = (uint32_t)len,
                           .payload_len = (uint32_t)len,
                           .client_len = (uint16_t)jid_len,
                           .names_len = (uint32_t)tag,
                           .shown_len = (uint32_t)shown};
    uint8_t *tail = (uint8_t *)m->data + sizeof(ev);
    memcpy(tail, jid, jid_len);
    memcpy(tail + jid_len, bytes, tag);
    memcpy(tail + jid_len + tag, bytes, shown);
    event_send(t, m, &ev);
}

void rt_trace_stanza(rt_trace_dir_t dir, const char *jid, size_t jid_len, size_t bare_len,
                     const uint8_t *bytes, size_t len)
{
    if (!len)
        return;
    trace_set_t *set = rt_rcu_enter(&traces);
    for (size_t i = 0; set && i < set->n; i++) {
        const rt_trace_t *w = set->t[i];
        if (w->kind == RT_TRACE_CLIENT && (w->len == jid_len || w->len == bare_len) &&
            memcmp(w->what, jid, w->len) == 0)
            send_stanza(set->t[i], dir, jid, jid_len, bytes, len);
    }
    rt_rcu_leave();
}

/* ---- Starting and stopping ---- */

/*
** Publishes the current set with add added and drop left out; the caller holds the lock. Two
** sets take turns: the one not published was left by every reader when the swap that retired
** it returned, so it can be rewritten, and starting or stopping never needs memory.
*/
static trace_set_t sets[2];

static int replace_set(rt_trace_t *add, const rt_trace_t *drop)
{
    trace_set_t *cur = atomic_load_explicit(&traces.ptr, memory_order_acquire);
    trace_set_t *next = cur == &sets[0] ? &sets[1] : &sets[0];
    next->n = 0;
    for (size_t i = 0; cur && i < cur->n; i++)
        if (cur->t[i] != drop)
            next->t[next->n++] = cur->t[i];
    if (add) {
        if (next->n == RT_TRACE_MAX)
            return RT_EBUSY;
        next->t[next->n++] = add;
        /* Counted on before the set has it (a packet may look a moment early: harmless). */
        atomic_store_explicit(&rt__trace_count, (unsigned)next->n, memory_order_relaxed);
    }
    rt_rcu_swap(&traces, next->n ? next : NULL);
    atomic_store_explicit(&rt__trace_count, (unsigned)next->n, memory_order_relaxed);
    return 0;
}

int rt_trace_start(rt_trace_kind_t kind, const char *what, size_t len, uint32_t payload_max,
                   rt_pid_t tracer, rt_trace_t **out)
{
    if (!len || len > UINT16_MAX || memchr(what, 0, len) ||
        (kind == RT_TRACE_TOPIC && !rt_topic_valid_filter(what, len)) ||
        payload_max > RT_TRACE_PAYLOAD_MAX)
        return RT_EINVAL;
    rt_trace_t *t = calloc(1, sizeof(*t) + len + 1);
    if (!t)
        return RT_ENOMEM;
    t->id = atomic_fetch_add(&next_trace_id, 1);
    t->tracer = tracer;
    t->kind = kind;
    t->payload_max = payload_max;
    t->len = len;
    memcpy(t->what, what, len);
    pthread_mutex_lock(&traces_lock);
    int rc = replace_set(t, NULL);
    pthread_mutex_unlock(&traces_lock);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

uint64_t rt_trace_stop(rt_trace_t *t)
{
    pthread_mutex_lock(&traces_lock);
    replace_set(NULL, t);
    pthread_mutex_unlock(&traces_lock);
    /* replace_set returned after the grace period: no packet still sees t, and its count is final.
     */
    uint64_t seen = atomic_load_explicit(&t->seen, memory_order_relaxed);
    free(t);
    return seen;
}

uint64_t rt_trace_id(const rt_trace_t *t)
{
    return t->id;
}

void rt_trace_taken(rt_trace_t *t, size_t len)
{
    atomic_fetch_sub_explicit(&t->queued, len, memory_order_relaxed);
}

void rt_trace_counts(const rt_trace_t *t, uint64_t *seen, uint64_t *dropped)
{
    *seen = atomic_load_explicit(&t->seen, memory_order_relaxed);
    *dropped = atomic_load_explicit(&t->dropped, memory_order_relaxed);
}

unsigned rt_trace_active(void)
{
    return atomic_load_explicit(&rt__trace_count, memory_order_relaxed);
}

/*
** The connection actor: one per MQTT client socket. It parses whatever bytes
** arrived in the scheduler's scratch buffer and copies only a partial packet
** into its own buffer, so an idle connection holds none. A PUBLISH is routed
** by the publishing connection itself: it matches the shared topic trie and
** sends each subscriber's connection actor a DELIVER message that carries
** topic and payload in one shared binary, so a fan-out copies no payload.
**
** This first cut covers CONNECT (3.1, 3.1.1, 5.0), client id takeover,
** keepalive, PUBLISH in and out at QoS 0/1/2, SUBSCRIBE and
** UNSUBSCRIBE with wildcards, shared subscriptions and subscription
** identifiers, retained messages, wills, PINGREQ and DISCONNECT. Persistent
** sessions (offline queues, retransmission of unacknowledged messages) are
** not here yet.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker.h"
#include "log.h"
#include "mqtt_codec.h"

enum {
    MSG_DELIVER = RT_MSG_USER, /* data: deliver_t; bin: the canonical PUBLISH */
    MSG_KEEPALIVE,
};

#define RT_CONN_MAX_SUB_IDS 8 /* subscription identifiers carried per delivery */

/*
** A delivery. The binary holds the message once, in canonical form: an MQTT 5
** PUBLISH (topic, properties, payload) that each subscriber's connection
** decodes and re-encodes for its own version, QoS, packet id and
** subscription identifiers, so v5 properties pass through to v5 subscribers.
*/
typedef struct {
    uint8_t qos;
    uint8_t retain;
    uint32_t n_sub_ids;
    uint32_t sub_ids[]; /* MQTT 5: the matching subscriptions' identifiers */
} deliver_t;

#define RT_CONN_READS_PER_TURN 16 /* socket reads per turn before yielding */
#define RT_QOS2_PENDING_MAX 65535 /* inbound QoS 2 packet ids awaiting PUBREL */

typedef struct {
    rt_sock_t *sock;
    uint8_t *partial;      /* bytes of an incomplete packet; NULL when none */
    size_t partial_len, partial_cap;
    uint8_t version;       /* 0 until CONNECT */
    uint8_t closing;
    uint16_t keepalive;    /* seconds, 0 = none */
    uint16_t next_packet_id;
    uint64_t last_rx_ms;
    char *client_id;
    char **filters;        /* what this client subscribed, for cleanup */
    size_t *filter_lens;
    size_t nfilters, capfilters;
    rt_bin_t *will;        /* the will as a canonical PUBLISH, or NULL */
    uint8_t discard_will;  /* a normal DISCONNECT came (3.1.2.5) */
    uint32_t will_delay;   /* seconds: min(will delay, session expiry), MQTT 5 3.1.3.2.2 */
    uint32_t peer_max_packet; /* the client's Maximum Packet Size (MQTT 5), 0: none */
    char **aliases;        /* inbound topic aliases (MQTT 5), allocated on first use */
    uint64_t dropped;      /* messages too large for the client's maximum packet size */
    uint16_t *qos2_ids;    /* inbound QoS 2 ids between PUBREC and PUBREL */
    size_t nqos2, capqos2;
} conn_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Encodes pk and queues it on the socket (sent at the end of the turn). */
static void send_packet(conn_t *c, mqtt_packet_t *pk)
{
    pk->version = c->version ? c->version : MQTT_V311;
    size_t len;
    if (mqtt_encode(pk, NULL, 0, c->peer_max_packet, &len, NULL) != 0) {
        /* Over the client's Maximum Packet Size: discarded, as 3.1.2.11.4 says, and counted. */
        c->dropped++;
        return;
    }
    uint8_t stackbuf[512];
    uint8_t *buf = len <= sizeof(stackbuf) ? stackbuf : malloc(len);
    if (!buf)
        return;
    if (mqtt_encode(pk, buf, len, c->peer_max_packet, &len, NULL) == 0)
        rt_sock_write(c->sock, buf, len);
    if (buf != stackbuf)
        free(buf);
}

/* Sends one message from its canonical form, re-encoded for this client. */
static void send_publish(conn_t *c, rt_bin_t *bin, uint8_t qos, uint8_t retain_flag,
                         const uint32_t *sub_ids, uint32_t n_sub_ids)
{
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return;
    pk.publish.qos = qos;
    pk.publish.retain = retain_flag;
    pk.publish.dup = 0;
    pk.packet_id = 0;
    if (qos) {
        if (++c->next_packet_id == 0)
            c->next_packet_id = 1;
        pk.packet_id = c->next_packet_id;
    }
    if (c->version == MQTT_V5 && n_sub_ids) {
        pk.props.sub_ids = sub_ids;
        pk.props.n_sub_ids = (uint16_t)n_sub_ids;
    }
    send_packet(c, &pk);
    atomic_fetch_add_explicit(&rt_broker->stats.msgs_out, 1, memory_order_relaxed);
}

static const char *reason_text(uint8_t reason)
{
    switch (reason) {
    case MQTT_RC_MALFORMED: return "malformed packet";
    case MQTT_RC_PROTOCOL_ERROR: return "protocol error";
    case MQTT_RC_KEEPALIVE_TIMEOUT: return "keep alive timeout";
    case MQTT_RC_SESSION_TAKEN_OVER: return "session taken over";
    case MQTT_RC_SERVER_SHUTTING_DOWN: return "server shutting down";
    case MQTT_RC_PACKET_TOO_LARGE: return "packet too large";
    case MQTT_RC_BAD_AUTH_METHOD: return "bad authentication method";
    default: return "disconnected by the server";
    }
}

/* A v5 DISCONNECT with a reason string (which also lets clients that read the reason only
   when properties follow, such as paho-mqtt 1.6, see it). */
static void send_disconnect(conn_t *c, uint8_t reason)
{
    const char *text = reason_text(reason);
    mqtt_packet_t pk = {.type = MQTT_DISCONNECT, .reason = reason};
    pk.props.present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
    pk.props.reason_string = (mqtt_str_t){(const uint8_t *)text, (uint32_t)strlen(text)};
    send_packet(c, &pk);
}

/* Ends the connection: v5 clients are told why (reason 0 means no DISCONNECT). */
static void close_conn(rt_actor_t *self, conn_t *c, uint8_t reason, rt_reason_t exit_reason)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->version == MQTT_V5 && reason)
        send_disconnect(c, reason);
    rt_exit(self, exit_reason);
}

static void protocol_error(rt_actor_t *self, conn_t *c, int err)
{
    atomic_fetch_add(&rt_broker->stats.bad_packets, 1);
    uint8_t reason = MQTT_IS_REASON_ERR(err) ? MQTT_ERR_REASON(err) : MQTT_RC_PROTOCOL_ERROR;
    rt_log(RT_LOG_INFO, "client.bad_packet", "client=%s reason=0x%02x",
           c->client_id ? c->client_id : "-", reason);
    close_conn(self, c, reason, RT_REASON_NORMAL);
}

static void arm_keepalive(rt_actor_t *self, conn_t *c)
{
    if (!c->keepalive)
        return;
    /* Checked at half the keepalive, closed past 1.5x (MQTT 3.1.2.10). */
    rt_send_after_tag((uint64_t)c->keepalive * 500, rt_self(self), MSG_KEEPALIVE, NULL);
}

static int handle_connect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    c->version = pk->version;
    mqtt_packet_t ack = {.type = MQTT_CONNACK};
    char assigned[40] = "";
    mqtt_str_t id = pk->connect.client_id;
    if (id.len == 0) {
        bool allowed = rt_broker->conf.allow_zero_length_clientid &&
                       (c->version == MQTT_V5 || (c->version == MQTT_V311 && pk->connect.clean_start));
        if (!allowed) {
            ack.reason = c->version == MQTT_V5 ? MQTT_RC_CLIENT_ID_INVALID : 2;
            send_packet(c, &ack);
            close_conn(self, c, 0, RT_REASON_NORMAL);
            return 0;
        }
        snprintf(assigned, sizeof(assigned), "rt-%016llx", (unsigned long long)rt_self(self));
    }
    c->client_id = assigned[0] ? strdup(assigned) : strndup((const char *)id.p, id.len);
    if (!c->client_id)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    /* Counted from here, because terminate uncounts every connection that has a client id. */
    atomic_fetch_add(&rt_broker->stats.connections, 1);
    rt_pid_t old = rt_broker_claim_client(c->client_id, rt_self(self));
    if (old)
        rt_exit_signal(old, RT_REASON_TAKEOVER);
    if (pk->connect.will) {
        mqtt_packet_t w = {.type = MQTT_PUBLISH, .version = pk->version};
        w.publish.topic = pk->connect.will_topic;
        w.publish.payload = pk->connect.will_payload;
        w.publish.qos = pk->connect.will_qos;
        w.publish.retain = pk->connect.will_retain;
        w.props = pk->connect.will_props; /* the will's own properties travel with it */
        c->will = rt_broker_canonical(&w);
        if (!c->will)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        if (c->version == MQTT_V5) {
            uint32_t expiry = pk->props.session_expiry;
            uint32_t delay = pk->connect.will_props.will_delay;
            c->will_delay = delay < expiry ? delay : expiry;
        }
    }
    if (c->version == MQTT_V5 && (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE)))
        c->peer_max_packet = pk->props.maximum_packet_size;
    c->keepalive = pk->connect.keepalive;
    if (c->version == MQTT_V5 && c->keepalive > rt_broker->conf.max_keepalive) {
        c->keepalive = (uint16_t)rt_broker->conf.max_keepalive;
        ack.props.present |= MQTT_PROP_BIT(MQTT_PROP_SERVER_KEEPALIVE);
        ack.props.server_keepalive = c->keepalive;
    }
    if (c->version == MQTT_V5) {
        if (assigned[0]) {
            ack.props.present |= MQTT_PROP_BIT(MQTT_PROP_ASSIGNED_CLIENT_ID);
            ack.props.assigned_client_id = (mqtt_str_t){(const uint8_t *)assigned,
                                                         (uint32_t)strlen(assigned)};
        }
        ack.props.present |= MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE) |
                             MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS_MAXIMUM);
        ack.props.maximum_packet_size = (uint32_t)rt_broker->conf.max_packet_size;
        ack.props.topic_alias_maximum = (uint16_t)rt_broker->conf.max_topic_alias;
    }
    send_packet(c, &ack);
    rt_log(RT_LOG_INFO, "client.connected", "client=%s version=%u keepalive=%u%s", c->client_id,
           c->version, c->keepalive, old ? " takeover=1" : "");
    arm_keepalive(self, c);
    return 0;
}

typedef struct {
    rt_bin_t *bin;
    uint8_t qos;
    uint8_t retain;
} route_t;

static void deliver_one(void *arg, const rt_trie_delivery_t *d)
{
    route_t *r = arg;
    size_t nids = d->n_sub_ids < RT_CONN_MAX_SUB_IDS ? d->n_sub_ids : RT_CONN_MAX_SUB_IDS;
    rt_msg_t *m = rt_msg_new(MSG_DELIVER, sizeof(deliver_t) + nids * sizeof(uint32_t));
    if (!m)
        return;
    deliver_t *dd = (deliver_t *)(void *)m->data;
    dd->qos = d->qos < r->qos ? d->qos : r->qos;
    /* MQTT 3.3.1.3: retain is cleared on ordinary forwarding unless asked to keep it. */
    dd->retain = d->retain_as_published ? r->retain : 0;
    dd->n_sub_ids = (uint32_t)nids;
    memcpy(dd->sub_ids, d->sub_ids, nids * sizeof(uint32_t));
    m->bin = rt_bin_retain(r->bin);
    rt_send_msg(d->pid, m);
}

/* Shared subscriptions skip members whose connection has gone. */
static int member_alive(void *arg, rt_pid_t pid)
{
    (void)arg;
    return rt_alive(pid);
}

rt_bin_t *rt_broker_canonical(const mqtt_packet_t *pk)
{
    mqtt_packet_t c = *pk;
    c.type = MQTT_PUBLISH;
    if (pk->version != MQTT_V5)
        memset(&c.props, 0, sizeof(c.props));
    c.version = MQTT_V5;
    c.packet_id = c.publish.qos ? 1 : 0; /* replaced per subscriber */
    c.publish.dup = 0;
    c.props.present &= ~(MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS) | MQTT_PROP_BIT(MQTT_PROP_WILL_DELAY));
    size_t len;
    if (mqtt_encode(&c, NULL, 0, 0, &len, NULL) != 0)
        return NULL;
    rt_bin_t *bin = rt_bin_alloc(len);
    if (bin && mqtt_encode(&c, rt_bin_data(bin), len, 0, &len, NULL) != 0) {
        rt_bin_release(bin);
        bin = NULL;
    }
    return bin;
}

/*
** Match scratch space, one per thread rather than one per connection: routing
** runs inside a turn, so a thread uses one at a time, and an idle connection
** should cost as little as possible. Freed when the thread exits.
*/
static _Thread_local rt_trie_scratch_t route_scratch;
static _Thread_local bool route_scratch_ready;
static pthread_key_t route_scratch_key;
static pthread_once_t route_scratch_once = PTHREAD_ONCE_INIT;

static void route_scratch_free(void *s)
{
    rt_trie_scratch_destroy(s);
}

static void route_scratch_key_create(void)
{
    pthread_key_create(&route_scratch_key, route_scratch_free);
}

static rt_trie_scratch_t *thread_scratch(void)
{
    if (!route_scratch_ready) {
        pthread_once(&route_scratch_once, route_scratch_key_create);
        rt_trie_scratch_init(&route_scratch);
        pthread_setspecific(route_scratch_key, &route_scratch);
        route_scratch_ready = true;
    }
    return &route_scratch;
}

int rt_broker_route(rt_pid_t publisher, rt_bin_t *bin)
{
    rt_trie_scratch_t *scratch = thread_scratch();
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return RT_EINVAL;
    mqtt_str_t topic = pk.publish.topic;
    route_t r = {.bin = bin, .qos = pk.publish.qos, .retain = pk.publish.retain};
    rt_trie_match(rt_broker->trie, (const char *)topic.p, topic.len, publisher, member_alive,
                  deliver_one, &r, scratch, NULL);
    if (pk.publish.retain) {
        /* A retained PUBLISH replaces the topic's retained message; an empty one clears it. */
        rt_bin_t *keep = pk.publish.payload.len ? rt_bin_retain(bin) : NULL;
        if (rt_retained_set(rt_broker->retained, (const char *)topic.p, topic.len, keep,
                            keep ? rt_bin_len(keep) : 0) != 0 && keep)
            rt_bin_release(keep);
    }
    return 0;
}

int rt_broker_publish(rt_pid_t publisher, const char *topic, size_t topic_len, const void *payload,
                      size_t payload_len, uint8_t qos, uint8_t retain)
{
    if (qos > 2 || topic_len == 0 || topic_len > 65535 ||
        !mqtt_topic_name_valid((const uint8_t *)topic, topic_len) || payload_len > MQTT_MAX_PACKET)
        return RT_EINVAL;
    mqtt_packet_t pk = {.type = MQTT_PUBLISH, .version = MQTT_V5};
    pk.publish.topic = (mqtt_str_t){(const uint8_t *)topic, (uint32_t)topic_len};
    pk.publish.payload = (mqtt_str_t){payload, (uint32_t)payload_len};
    pk.publish.qos = qos;
    pk.publish.retain = retain;
    rt_bin_t *bin = rt_broker_canonical(&pk);
    if (!bin)
        return RT_ENOMEM;
    int rc = rt_broker_route(publisher, bin);
    rt_bin_release(bin);
    return rc;
}

/* MQTT 5 topic aliases (3.3.2.3.4): the alias maps to the last topic sent with it. */
static int resolve_alias(conn_t *c, mqtt_packet_t *pk)
{
    mqtt_str_t *topic = &pk->publish.topic;
    if (!(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
        return topic->len ? 0 : MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
    uint16_t alias = pk->props.topic_alias;
    if (alias == 0 || alias > rt_broker->conf.max_topic_alias)
        return MQTT_ERR(MQTT_RC_TOPIC_ALIAS_INVALID);
    if (!c->aliases) {
        c->aliases = calloc((size_t)rt_broker->conf.max_topic_alias, sizeof(char *));
        if (!c->aliases)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    }
    char **slot = &c->aliases[alias - 1];
    if (topic->len) {
        char *copy = strndup((const char *)topic->p, topic->len);
        if (!copy)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        free(*slot);
        *slot = copy;
        return 0;
    }
    if (!*slot)
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* an alias never set */
    *topic = (mqtt_str_t){(const uint8_t *)*slot, (uint32_t)strlen(*slot)};
    return 0;
}

static int qos2_find(conn_t *c, uint16_t id)
{
    for (size_t i = 0; i < c->nqos2; i++)
        if (c->qos2_ids[i] == id)
            return (int)i;
    return -1;
}

static int handle_publish(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    atomic_fetch_add(&rt_broker->stats.msgs_in, 1);
    if (c->version == MQTT_V5) {
        if (pk->props.sub_id_count)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* only servers send them (3.3.4) */
        int rc = resolve_alias(c, pk);
        if (rc)
            return rc;
    }
    uint8_t qos = pk->publish.qos;
    bool route = true;
    if (qos == 2) {
        /* Exactly once: delivered on the first PUBLISH, a resend before PUBREL is not. */
        if (qos2_find(c, pk->packet_id) >= 0) {
            route = false;
        } else {
            if (c->nqos2 >= RT_QOS2_PENDING_MAX)
                return MQTT_ERR(MQTT_RC_RECEIVE_MAX_EXCEEDED);
            if (c->nqos2 == c->capqos2) {
                size_t cap = c->capqos2 ? c->capqos2 * 2 : 8;
                uint16_t *n = realloc(c->qos2_ids, cap * sizeof(*n));
                if (!n)
                    return MQTT_ERR(MQTT_RC_UNSPECIFIED);
                c->qos2_ids = n;
                c->capqos2 = cap;
            }
            c->qos2_ids[c->nqos2++] = pk->packet_id;
        }
    }
    if (route) {
        rt_bin_t *bin = rt_broker_canonical(pk);
        if (!bin)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        rt_broker_route(rt_self(self), bin);
        rt_bin_release(bin);
    }
    if (qos == 1) {
        mqtt_packet_t ack = {.type = MQTT_PUBACK, .packet_id = pk->packet_id};
        send_packet(c, &ack);
    } else if (qos == 2) {
        mqtt_packet_t rec = {.type = MQTT_PUBREC, .packet_id = pk->packet_id};
        send_packet(c, &rec);
    }
    return 0;
}

static int remember_filter(conn_t *c, const uint8_t *f, size_t len)
{
    for (size_t i = 0; i < c->nfilters; i++)
        if (c->filter_lens[i] == len && memcmp(c->filters[i], f, len) == 0)
            return 0;
    if (c->nfilters == c->capfilters) {
        size_t cap = c->capfilters ? c->capfilters * 2 : 4;
        char **nf = realloc(c->filters, cap * sizeof(*nf));
        if (!nf)
            return RT_ENOMEM;
        c->filters = nf;
        size_t *nl = realloc(c->filter_lens, cap * sizeof(*nl));
        if (!nl)
            return RT_ENOMEM;
        c->filter_lens = nl;
        c->capfilters = cap;
    }
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return RT_ENOMEM;
    memcpy(copy, f, len);
    c->filters[c->nfilters] = copy;
    c->filter_lens[c->nfilters++] = len;
    return 0;
}

static void forget_filter(conn_t *c, const uint8_t *f, size_t len)
{
    for (size_t i = 0; i < c->nfilters; i++) {
        if (c->filter_lens[i] == len && memcmp(c->filters[i], f, len) == 0) {
            free(c->filters[i]);
            c->filters[i] = c->filters[--c->nfilters];
            c->filter_lens[i] = c->filter_lens[c->nfilters];
            return;
        }
    }
}

typedef struct {
    conn_t *c;
    uint8_t qos;           /* granted */
    uint32_t sub_id;
} retained_send_t;

/* Runs under the retained store's read lock: encode and queue at once, keep nothing. */
static void send_retained(void *arg, const char *topic, size_t len, void *msg)
{
    retained_send_t *rs = arg;
    rt_bin_t *bin = msg;
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return;
    uint8_t qos = pk.publish.qos < rs->qos ? pk.publish.qos : rs->qos;
    send_publish(rs->c, bin, qos, 1, &rs->sub_id, rs->sub_id ? 1 : 0);
}

static int handle_subscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    uint8_t codes[256];
    uint8_t send_retained_for[256];
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (n < sizeof(codes) && mqtt_sub_next(pk, &pos, &s)) {
        uint8_t qos = MQTT_SUB_QOS(s.options);
        uint8_t handling = MQTT_SUB_RETAIN_HANDLING(s.options);
        rt_trie_opts_t o = {.qos = qos,
                            .no_local = (s.options & MQTT_SUB_NO_LOCAL) != 0,
                            .retain_as_published = (s.options & MQTT_SUB_RETAIN_AS_PUBLISHED) != 0,
                            .retain_handling = handling,
                            .sub_id = pk->props.sub_id};
        int existed = 0;
        int rc = rt_trie_subscribe(rt_broker->trie, (const char *)s.filter.p, s.filter.len,
                                   rt_self(self), &o, &existed);
        if (rc == 0)
            rc = remember_filter(c, s.filter.p, s.filter.len);
        /* Retained messages on subscribe: always (0), for a new subscription only (1), never
           (2), and never for a shared subscription (MQTT 5 3.8.3.1, 4.8.2). */
        bool shared = s.filter.len > 7 && memcmp(s.filter.p, "$share/", 7) == 0;
        send_retained_for[n] = rc == 0 && !shared && (handling == 0 || (handling == 1 && !existed));
        codes[n++] = rc == 0 ? qos : c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
    }
    mqtt_packet_t ack = {.type = MQTT_SUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    send_packet(c, &ack);
    pos = 0;
    for (size_t i = 0; i < n && mqtt_sub_next(pk, &pos, &s); i++) {
        if (!send_retained_for[i])
            continue;
        retained_send_t rs = {.c = c, .qos = codes[i], .sub_id = pk->props.sub_id};
        rt_retained_match(rt_broker->retained, (const char *)s.filter.p, s.filter.len,
                          send_retained, &rs, NULL);
    }
    return 0;
}

static int handle_unsubscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    uint8_t codes[256];
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (n < sizeof(codes) && mqtt_sub_next(pk, &pos, &s)) {
        int existed = 0;
        rt_trie_unsubscribe(rt_broker->trie, (const char *)s.filter.p, s.filter.len,
                            rt_self(self), &existed);
        forget_filter(c, s.filter.p, s.filter.len);
        codes[n++] = existed ? MQTT_RC_SUCCESS : MQTT_RC_NO_SUBSCRIPTION_EXISTED;
    }
    mqtt_packet_t ack = {.type = MQTT_UNSUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    send_packet(c, &ack);
    return 0;
}

static int handle_packet(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    if (!c->version && pk->type != MQTT_CONNECT)
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* the first packet must be CONNECT */
    switch (pk->type) {
    case MQTT_CONNECT:
        if (c->version)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* a second CONNECT (3.1.0-2) */
        return handle_connect(self, c, pk);
    case MQTT_PUBLISH:
        return handle_publish(self, c, pk);
    case MQTT_PUBREL: {
        int i = qos2_find(c, pk->packet_id);
        if (i >= 0)
            c->qos2_ids[i] = c->qos2_ids[--c->nqos2];
        mqtt_packet_t comp = {.type = MQTT_PUBCOMP, .packet_id = pk->packet_id,
                              .reason = i >= 0 ? 0 : MQTT_RC_PACKET_ID_NOT_FOUND};
        if (c->version != MQTT_V5)
            comp.reason = 0;
        send_packet(c, &comp);
        return 0;
    }
    case MQTT_PUBREC: {
        /* Outbound QoS 2, second step. Without sessions nothing is retransmitted, so no
           state is kept: every PUBREC is answered. */
        mqtt_packet_t rel = {.type = MQTT_PUBREL, .packet_id = pk->packet_id};
        send_packet(c, &rel);
        return 0;
    }
    case MQTT_PUBACK:
    case MQTT_PUBCOMP:
        return 0; /* inflight tracking comes with sessions */
    case MQTT_SUBSCRIBE:
        return handle_subscribe(self, c, pk);
    case MQTT_UNSUBSCRIBE:
        return handle_unsubscribe(self, c, pk);
    case MQTT_PINGREQ: {
        mqtt_packet_t resp = {.type = MQTT_PINGRESP};
        send_packet(c, &resp);
        return 0;
    }
    case MQTT_DISCONNECT:
        /* A normal DISCONNECT discards the will; v5 can ask for it with 0x04. */
        c->discard_will = !(c->version == MQTT_V5 && pk->reason == MQTT_RC_DISCONNECT_WITH_WILL);
        close_conn(self, c, 0, RT_REASON_NORMAL);
        return 0;
    case MQTT_AUTH:
        close_conn(self, c, MQTT_RC_BAD_AUTH_METHOD, RT_REASON_NORMAL);
        return 0;
    default:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* server-to-client packets */
    }
}

/* Parses every complete packet in buf; returns the bytes consumed, or -1 after an error. */
static long parse(rt_actor_t *self, conn_t *c, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len && !c->closing) {
        /* Anything but CONNECT first is refused at its first byte, before it is complete. */
        if (!c->version && buf[off] != (MQTT_CONNECT << 4)) {
            protocol_error(self, c, MQTT_ERR(MQTT_RC_PROTOCOL_ERROR));
            return -1;
        }
        mqtt_frame_t f;
        int rc = mqtt_frame(buf + off, len - off, (uint32_t)rt_broker->conf.max_packet_size, &f);
        if (rc == RT_EAGAIN)
            break;
        mqtt_packet_t pk;
        if (rc == 0)
            rc = mqtt_decode(buf + off, f.size, c->version, &pk);
        if (rc == 0)
            rc = handle_packet(self, c, &pk);
        if (rc) {
            protocol_error(self, c, rc == RT_EAGAIN ? MQTT_ERR(MQTT_RC_MALFORMED) : rc);
            return -1;
        }
        off += f.size;
    }
    return (long)off;
}

static int keep_partial(conn_t *c, const uint8_t *p, size_t n)
{
    if (c->partial_len + n > c->partial_cap) {
        size_t cap = c->partial_cap ? c->partial_cap : 256;
        while (cap < c->partial_len + n)
            cap *= 2;
        uint8_t *nb = realloc(c->partial, cap);
        if (!nb)
            return RT_ENOMEM;
        c->partial = nb;
        c->partial_cap = cap;
    }
    memcpy(c->partial + c->partial_len, p, n);
    c->partial_len += n;
    return 0;
}

static void drop_partial(conn_t *c, size_t used)
{
    if (used >= c->partial_len) {
        free(c->partial);
        c->partial = NULL;
        c->partial_len = c->partial_cap = 0;
        return;
    }
    memmove(c->partial, c->partial + used, c->partial_len - used);
    c->partial_len -= used;
}

static void on_readable(rt_actor_t *self, conn_t *c)
{
    for (int i = 0; i < RT_CONN_READS_PER_TURN && !c->closing; i++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(c->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            close_conn(self, c, 0, RT_REASON_NORMAL);
            return;
        }
        c->last_rx_ms = now_ms();
        const uint8_t *p = data;
        if (c->partial_len) {
            if (keep_partial(c, p, len)) {
                close_conn(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
                return;
            }
            long used = parse(self, c, c->partial, c->partial_len);
            if (used < 0)
                return;
            drop_partial(c, (size_t)used);
        } else {
            long used = parse(self, c, p, len);
            if (used < 0)
                return;
            /* Only the incomplete tail is copied out of the scratch buffer. */
            if ((size_t)used < len && keep_partial(c, p + used, len - (size_t)used)) {
                close_conn(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
                return;
            }
        }
    }
}

static void on_deliver(conn_t *c, rt_msg_t *m)
{
    if (!c->version || c->closing || !m->bin)
        return;
    const deliver_t *d = (const deliver_t *)(const void *)m->data;
    send_publish(c, m->bin, d->qos, d->retain, d->sub_ids, d->n_sub_ids);
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    int rc = rt_sock_adopt(self, (int)(intptr_t)arg, &c->sock);
    if (rc)
        return rc;
    c->last_rx_ms = now_ms();
    atomic_fetch_add(&rt_broker->stats.sockets, 1);
    return 0;
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_t *c = state;
    switch (m->tag) {
    case RT_MSG_SOCKET:
        if (((rt_sock_event_t *)(void *)m->data)->events & RT_SOCK_READABLE)
            on_readable(self, c);
        break;
    case MSG_DELIVER:
        on_deliver(c, m);
        break;
    case MSG_KEEPALIVE:
        if (now_ms() - c->last_rx_ms > (uint64_t)c->keepalive * 1500) {
            rt_log(RT_LOG_INFO, "client.keepalive_timeout", "client=%s", c->client_id);
            close_conn(self, c, MQTT_RC_KEEPALIVE_TIMEOUT, RT_REASON_NORMAL);
        } else {
            arm_keepalive(self, c);
        }
        break;
    }
}

/*
** A delayed will (MQTT 5 will delay) outlives its connection in a small actor
** that holds the client id: a reconnect with that id takes it over, which
** cancels the will; otherwise it publishes when the delay ends.
*/
typedef struct {
    rt_bin_t *bin; /* the will, canonical */
    char *client_id;
    uint32_t delay_s;
} will_t;

enum { MSG_WILL_DUE = RT_MSG_USER + 10 };

static int will_init(rt_actor_t *self, void *state, void *arg)
{
    will_t *w = state;
    *w = *(will_t *)arg;
    rt_broker_claim_client(w->client_id, rt_self(self));
    rt_send_after_tag((uint64_t)w->delay_s * 1000, rt_self(self), MSG_WILL_DUE, NULL);
    return 0;
}

static void will_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    will_t *w = state;
    if (m->tag != MSG_WILL_DUE)
        return;
    rt_broker_route(rt_self(self), w->bin);
    rt_log(RT_LOG_INFO, "client.will", "client=%s delayed=%us", w->client_id, w->delay_s);
    rt_exit(self, RT_REASON_NORMAL);
}

static void will_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    will_t *w = state;
    rt_broker_release_client(w->client_id, rt_self(self));
    rt_bin_release(w->bin);
    free(w->client_id);
}

static const rt_actor_type_t will_type = {
    .name = "mqtt_will",
    .state_size = sizeof(will_t),
    .init = will_init,
    .handle = will_handle,
    .terminate = will_terminate,
};

static void publish_will(rt_actor_t *self, conn_t *c, rt_reason_t reason)
{
    /* A takeover publishes at once: a delayed will would claim the id from the successor. */
    if (c->will_delay && reason != RT_REASON_TAKEOVER && c->client_id) {
        will_t w = {.bin = rt_bin_retain(c->will), .client_id = strdup(c->client_id),
                    .delay_s = c->will_delay};
        rt_pid_t pid;
        if (w.client_id && rt_spawn(&will_type, &w, &pid) == 0)
            return;
        rt_bin_release(w.bin);
        free(w.client_id);
    }
    rt_broker_route(rt_self(self), c->will);
    rt_log(RT_LOG_INFO, "client.will", "client=%s", c->client_id ? c->client_id : "-");
}

static void conn_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    conn_t *c = state;
    if (c->version == MQTT_V5 && !c->closing) {
        if (reason == RT_REASON_TAKEOVER)
            send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        else if (reason == RT_REASON_SHUTDOWN)
            send_disconnect(c, MQTT_RC_SERVER_SHUTTING_DOWN);
    }
    if (c->will) {
        if (!c->discard_will && reason != RT_REASON_SHUTDOWN)
            publish_will(self, c, reason);
        rt_bin_release(c->will);
    }
    if (c->nfilters)
        rt_trie_unsubscribe_all(rt_broker->trie, rt_self(self), (const char *const *)c->filters,
                                c->filter_lens, c->nfilters, NULL);
    for (size_t i = 0; i < c->nfilters; i++)
        free(c->filters[i]);
    free(c->filters);
    free(c->filter_lens);
    free(c->qos2_ids);
    free(c->partial);
    for (long i = 0; c->aliases && i < rt_broker->conf.max_topic_alias; i++)
        free(c->aliases[i]);
    free(c->aliases);
    if (c->client_id) {
        rt_broker_release_client(c->client_id, rt_self(self));
        atomic_fetch_sub(&rt_broker->stats.connections, 1);
        rt_log(RT_LOG_INFO, "client.disconnected", "client=%s reason=%s", c->client_id,
               rt_reason_name(reason));
        free(c->client_id);
    }
    atomic_fetch_sub(&rt_broker->stats.sockets, 1);
}

static const char *conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET: return "socket";
    case MSG_DELIVER: return "deliver";
    case MSG_KEEPALIVE: return "keepalive";
    }
    return NULL;
}

const rt_actor_type_t rt_conn_type = {
    .name = "mqtt_conn",
    .state_size = sizeof(conn_t),
    .init = conn_init,
    .handle = conn_handle,
    .terminate = conn_terminate,
    .tag_name = conn_tag_name,
};

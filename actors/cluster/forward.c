/*
** Routing across nodes (cluster.h): each message routed here goes out on its topic's subject
** with what MQTT needs in headers; each filter held here is a NATS subscription; what comes in
** is routed once per origin, named by it (rt_message_set_origin).
*/
#include "cluster_impl.h"

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

bool rt__cluster_forward(rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token, bool shared_here)
{
    rt_message_t msg;
    rt_message_view(bin, &msg);
    /* A retained message's acknowledgement waits for the replicated store: a subscriber
       that comes after it, on any node, gets it. */
    bool kv_ack =
        ack_pid && msg.retain && atomic_load_explicit(&rt__cluster.kv_ready, memory_order_acquire);
    /* Durable mode: a QoS 1/2 message is acknowledged once JetStream's stream has it. */
    bool stream_ack = ack_pid && !kv_ack && msg.qos &&
                      atomic_load_explicit(&rt__cluster.durable_ready, memory_order_acquire);
    bool acks = kv_ack || stream_ack;
    rt_msg_t *m = rt_msg_new(MSG_FORWARD, sizeof(forward_t));
    if (!m) {
        atomic_fetch_add_explicit(&rt__cluster.forward_failed, 1, memory_order_relaxed);
        return false;
    }
    *(forward_t *)(void *)m->data =
        (forward_t){acks ? ack_pid : 0, ack_token, shared_here, stream_ack};
    m->bin = rt_bin_retain(bin);
    /* A publisher waits (muted) while the cluster actor is behind, as for any overloaded
       receiver: what it routes here goes to the other nodes in its order, none dropped. */
    if (rt_send_msg(atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire), m) != 0) {
        atomic_fetch_add_explicit(&rt__cluster.forward_failed, 1, memory_order_relaxed);
        if (acks)
            rt__cluster_unkept(ack_pid, ack_token);
    }
    return acks;
}

/* route.h's stamp: every message this node routes first gets its name before anyone here
   holds a copy; the name's number is what Rt-Origin sends. */
void rt__cluster_stamp(rt_bin_t *bin)
{
    uint64_t key, seq;
    if (!rt_message_origin(bin, &key, &seq))
        rt_message_set_origin(bin, rt__cluster.node_key,
                              atomic_fetch_add_explicit(&rt__cluster.seq, 1, memory_order_relaxed) +
                                  1);
}

static void publish(const rt_message_t *msg, const rt_bin_t *bin, const forward_t *f)
{
    char subject[RT_SUBJECT_MAX + 1];
    if (rt_subject_of_topic(rt__cluster.prefix, (const char *)msg->topic.p, msg->topic.len, subject,
                            sizeof(subject)) < 0) {
        atomic_fetch_add_explicit(&rt__cluster.not_forwarded, 1, memory_order_relaxed);
        if (f->stream_ack) /* no other node can have it: it is this node's alone */
            rt__cluster_stream_answer(f->ack_pid, f->ack_token, true);
        return;
    }
    if (!rt__cluster.nc) { /* never connected yet: nothing keeps it for the others */
        atomic_fetch_add_explicit(&rt__cluster.forward_failed, 1, memory_order_relaxed);
        return;
    }
    natsMsg *nm = NULL;
    natsStatus s =
        natsMsg_Create(&nm, subject, NULL, (const char *)msg->payload.p, (int)msg->payload.len);
    char origin[RT_CONF_NODE_MAX + 48], meta[48];
    uint64_t key, seq;
    if (!rt_message_origin(bin, &key, &seq)) /* made before the cluster started */
        seq = atomic_fetch_add_explicit(&rt__cluster.seq, 1, memory_order_relaxed) + 1;
    snprintf(origin, sizeof(origin), "%s %" PRIx64 " %" PRIu64, rt__cluster.node,
             rt__cluster.incarnation, seq);
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
            s = rt__cluster_stream_publish(&nm);
        if (s != NATS_OK)
            rt__cluster_stream_answer(f->ack_pid, f->ack_token, false);
    } else if (s == NATS_OK) {
        s = natsConnection_PublishMsg(rt__cluster.nc, nm);
    }
    natsMsg_Destroy(nm);
    if (s == NATS_OK) {
        atomic_fetch_add_explicit(&rt__cluster.forwarded_out, 1, memory_order_relaxed);
        return;
    }
    /* Said, not only counted: the first failure, then every 1000th. */
    if (atomic_fetch_add_explicit(&rt__cluster.forward_failed, 1, memory_order_relaxed) % 1000 == 0)
        rt_log(RT_LOG_WARNING, "cluster.forward_failed",
               "topic=%.*s payload=%u props=%u %s (nats-server's max_payload is %" PRId64
               " bytes, headers included)",
               (int)(msg->topic.len > 200 ? 200 : msg->topic.len), msg->topic.p, msg->payload.len,
               msg->props.len, natsStatus_GetText(s), natsConnection_GetMaxPayload(rt__cluster.nc));
}

/*
** A fixed hash, where every node must compute the same value from the same bytes: a node's run
** key (replayed messages name their origin by it on another node) and a shared group's NATS
** queue name. Never for a table: the routes hash filters clients choose with rt_hash.
*/
static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* The name of one run of a node in its messages' origins (rt_message_set_origin). */
uint64_t rt__cluster_node_key(const char *node, uint64_t incarnation)
{
    return fnv1a(node, strlen(node)) ^ (incarnation * 0x9E3779B97F4A7C15ull);
}

/* The slot of filter: where it is, or the free slot it would take; NULL when full. */
static route_t *route_slot(const char *filter, size_t len)
{
    if (!rt__cluster.routes_cap)
        return NULL;
    RT_ASSERT((rt__cluster.routes_cap & (rt__cluster.routes_cap - 1)) == 0); /* the mask below */
    size_t mask = rt__cluster.routes_cap - 1, i = rt_hash(filter, len) & mask;
    route_t *tomb = NULL;
    for (size_t n = 0; n < rt__cluster.routes_cap; n++, i = (i + 1) & mask) {
        route_t *r = &rt__cluster.routes[i];
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
    if ((rt__cluster.routes_used + 1) * 4 < rt__cluster.routes_cap * 3)
        return true;
    size_t cap = rt__cluster.routes_cap ? rt__cluster.routes_cap : 64;
    while ((rt__cluster.routes_live + 1) * 2 > cap)
        cap *= 2;
    route_t *old = rt__cluster.routes, *fresh = calloc(cap, sizeof(route_t));
    if (!fresh)
        return false;
    size_t old_cap = rt__cluster.routes_cap;
    rt__cluster.routes = fresh;
    rt__cluster.routes_cap = cap;
    rt__cluster.routes_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].filter) {
            *route_slot(old[i].filter, old[i].len) = old[i];
            rt__cluster.routes_used++;
        }
    RT_ASSERT(rt__cluster.routes_used == rt__cluster.routes_live); /* no tombstone moved */
    rt_charge(self, (ptrdiff_t)((cap - old_cap) * sizeof(route_t)));
    free(old);
    return true;
}

/* A filter's NATS subjects, and whether it is a shared group's: 0 for none ($SYS, which is
   each node's own, or not a filter), -1 when too long for a subject. */
static int route_subjects(const char *filter, size_t len, char subjects[2][RT_SUBJECT_MAX + 1],
                          bool *shared)
{
    rt_topic_filter_t sf;
    *shared = false;
    if (rt_topic_parse_filter(filter, len, &sf))
        return 0;
    *shared = sf.group != NULL;
    if (sf.filter_len >= 4 && memcmp(sf.filter, "$SYS", 4) == 0)
        return 0;
    return rt_subjects_of_filter(rt__cluster.prefix, sf.filter, sf.filter_len, subjects);
}

/* Route r's NATS subscriptions; none while the node has never reached NATS (its connector
   makes them then: rt__cluster_subscribe_held). */
static void route_subscribe(route_t *r)
{
    char subjects[2][RT_SUBJECT_MAX + 1];
    bool group;
    int n = route_subjects(r->filter, r->len, subjects, &group);
    RT_ASSERT(r->nsubs == 0 && n <= 2); /* subs[] holds one filter's two subjects at most */
    natsConnection *conn = group ? rt__cluster.qc : rt__cluster.nc;
    if (!conn)
        return;
    char queue[32];
    snprintf(queue, sizeof(queue), "rtq_%016" PRIx64, fnv1a(r->filter, r->len));
    for (int i = 0; i < n; i++) {
        char *closure = group ? strdup(r->filter) : NULL;
        natsStatus s = group && !closure
                           ? NATS_NO_MEMORY
                           : rt__cluster_pool_subscribe(&r->subs[r->nsubs], conn, subjects[i],
                                                        group ? queue : NULL, closure, group);
        if (s == NATS_OK) {
            /* NATS's own bound on what waits for delivery; past it the server's messages
               for this subscription are dropped and counted (a slow consumer). */
            natsSubscription_SetPendingLimits(r->subs[r->nsubs], 65536, 64 * 1024 * 1024);
            r->nsubs++;
        } else {
            rt_log(RT_LOG_ERROR, "cluster.subscribe_failed", "subject=%s %s", subjects[i],
                   natsStatus_GetText(s));
        }
    }
}

void rt__cluster_subscribe(rt_actor_t *self, const char *filter, size_t len)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid)); /* the routes table is the cluster actor's alone */
    char subjects[2][RT_SUBJECT_MAX + 1];
    bool group;
    int n = route_subjects(filter, len, subjects, &group);
    if (n == 0)
        return;
    if (n < 0) {
        rt_log(RT_LOG_WARNING, "cluster.route_too_long",
               "filter=%.*s longer than a NATS subject can be; other nodes' messages for it "
               "will not arrive",
               (int)(len > 200 ? 200 : len), filter);
        return;
    }
    route_t *r = routes_room(self) ? route_slot(filter, len) : NULL;
    if (r && r->filter)
        return; /* held already: the trie says "on" once per first subscriber */
    char *copy = r ? malloc(len + 1) : NULL;
    if (!copy) {
        rt_log(RT_LOG_ERROR, "cluster.route_failed", "filter=%.*s out of memory",
               (int)(len > 200 ? 200 : len), filter);
        return;
    }
    memcpy(copy, filter, len);
    copy[len] = 0;
    *r = (route_t){.filter = copy, .len = (uint32_t)len};
    rt__cluster.routes_used++;
    rt__cluster.routes_live++;
    rt_charge(self, (ptrdiff_t)len + 1);
    route_subscribe(r);
    atomic_store_explicit(&rt__cluster.routes_count, rt__cluster.routes_live, memory_order_relaxed);
}

void rt__cluster_subscribe_held(rt_actor_t *self)
{
    (void)self;
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    for (size_t i = 0; i < rt__cluster.routes_cap; i++)
        if (rt__cluster.routes[i].filter && !rt__cluster.routes[i].nsubs)
            route_subscribe(&rt__cluster.routes[i]);
}

void rt__cluster_unsubscribe(rt_actor_t *self, const char *filter, size_t len)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    route_t *r = route_slot(filter, len);
    if (!r || !r->filter)
        return;
    RT_ASSERT(rt__cluster.routes_live > 0 && r->nsubs <= 2);
    for (int i = 0; i < r->nsubs; i++) {
        natsSubscription_Unsubscribe(r->subs[i]);
        natsSubscription_Destroy(r->subs[i]);
    }
    rt_charge(self, -(ptrdiff_t)(r->len + 1));
    free(r->filter);
    *r = (route_t){.removed = true};
    rt__cluster.routes_live--;
    atomic_store_explicit(&rt__cluster.routes_count, rt__cluster.routes_live, memory_order_relaxed);
}

/* The trie's hook: under a shard lock, so only a message goes from here. */
void rt__cluster_interest_changed(void *arg, const char *filter, size_t len, bool on)
{
    (void)arg;
    /* Connections unsubscribe as rtd stops, after the cluster has: nobody to tell. */
    if (atomic_load_explicit(&rt__cluster.stopping, memory_order_relaxed))
        return;
    rt_msg_t *m = rt_msg_new(MSG_INTEREST, sizeof(interest_t) + len);
    if (m) {
        interest_t *in = (interest_t *)(void *)m->data;
        in->on = on;
        in->len = (uint32_t)len;
        memcpy(in->filter, filter, len);
    }
    /* Unmuted: the subscriber holds a trie lock, and must never wait for the cluster. */
    if (!m ||
        rt_send_unmuted(atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire), m) != 0)
        rt_log(RT_LOG_ERROR, "cluster.route_lost",
               "filter=%.*s on=%d the cluster actor could not be told", (int)len, filter, on);
}

/* Publishes a routed message; a retained one also goes to the bucket, then its ack. */
void rt__cluster_forward_one(rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid) && m->len >= sizeof(forward_t));
    rt_message_t msg;
    const forward_t *f = (const forward_t *)(const void *)m->data;
    rt_message_view(m->bin, &msg);
    publish(&msg, m->bin, f);
    if (!msg.retain || !atomic_load(&rt__cluster.kv_ready))
        return;
    natsStatus s = rt__cluster_kv_put(&msg, m->bin);
    if (s != NATS_OK) {
        atomic_fetch_add_explicit(&rt__cluster.kv_put_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.retained_put_failed", "topic=%.*s %s",
               (int)(msg.topic.len > 200 ? 200 : msg.topic.len), msg.topic.p,
               natsStatus_GetText(s));
    }
    if (f->ack_pid && !f->stream_ack) {
        rt_store_committed_t done = {.token = f->ack_token, .status = s == NATS_OK ? 0 : RT_EAGAIN};
        rt_send(f->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
    }
}

/* True the first time a copy of (node, incarnation, seq) is seen. A late one (a catch-up's)
   older than the window may be one this node never had: it goes on, at least once. */
static bool first_copy(in_state_t *st, const char *node, uint64_t inc, uint64_t seq, bool late)
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
        return late; /* older than the window: its copies from NATS have all been through */
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
rt_bin_t *rt__cluster_inbound_message(natsMsg *nm, origin_name_t *o)
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
    int tlen =
        rt_topic_of_subject(rt__cluster.prefix, subject, strlen(subject), topic, sizeof(topic));
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
        rt_message_set_origin(bin, rt__cluster_node_key(o->node, o->incarnation), o->seq);
    return bin;
}

void rt__cluster_route_inbound(in_state_t *st, const inbound_t *in)
{
    natsMsg *nm = in->msg;
    origin_name_t o;
    /* Every copy goes through the same routing: the first one routes it, to everyone. */
    const char *origin = NULL;
    if (!in->share && natsMsgHeader_Get(nm, H_ORIGIN, &origin) == NATS_OK &&
        sscanf(origin, "%32s %" SCNx64 " %" SCNu64, o.node, &o.incarnation, &o.seq) == 3 &&
        !first_copy(st, o.node, o.incarnation, o.seq, in->late)) {
        atomic_fetch_add_explicit(&rt__cluster.duplicates, 1, memory_order_relaxed);
        return;
    }
    rt_bin_t *bin = rt__cluster_inbound_message(nm, &o);
    if (!bin) {
        atomic_fetch_add_explicit(&rt__cluster.bad_in, 1, memory_order_relaxed);
        return;
    }
    const char *shared = NULL;
    if (!in->share)
        rt_route_remote(bin);
    else if (natsMsgHeader_Get(nm, H_SHARED, &shared) != NATS_OK)
        deliver_shared(in->share, bin);
    rt_bin_release(bin);
    atomic_fetch_add_explicit(&rt__cluster.forwarded_in, 1, memory_order_relaxed);
}

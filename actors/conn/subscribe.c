/*
** The client's subscriptions: SUBSCRIBE and UNSUBSCRIBE, the list the actor keeps of
** them (for the session's end, persistence, administrators and shared groups), the
** retained messages a new subscription gets, the shared groups an offline session
** leaves and rejoins, and the subscriptions auto_subscribe makes at CONNECT.
*/
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "cluster.h"
#include "conn_impl.h"
#include "exclusive.h"
#include "log.h"
#include "rewrite.h"
#include "store.h"

/* session.subscribed / unsubscribed: rules get the filter as a C string. */
static void subscription_rule_event(rt_actor_t *self, conn_t *c, rt_rule_event_kind_t kind,
                                    const uint8_t *f, size_t len, int qos)
{
    char small[256];
    char *copy = len < sizeof(small) ? small : malloc(len + 1);
    if (!copy)
        return;
    memcpy(copy, f, len);
    copy[len] = 0;
    rt__conn_rule_event(self, c, kind, copy, qos, -1, NULL, NULL);
    if (copy != small)
        free(copy);
}

/* The client's subscription with this filter, or -1. */
static long sub_find(const conn_t *c, const uint8_t *f, size_t len)
{
    RT_ASSERT(c->nsubs <= c->capsubs);
    for (size_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].len == len && memcmp(c->subs[i].filter, f, len) == 0)
            return (long)i;
    return -1;
}

/*
** The list starts with room for one: most clients hold one subscription, and one entry
** shares its size class with the client id and the filter, so such a client's heap needs
** no chunk of another class.
*/
int rt__conn_sub_remember(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len,
                          const rt_trie_opts_t *o)
{
    long at = sub_find(c, f, len);
    if (at >= 0) {
        rt__conn_sub_set_opts(&c->subs[at], o);
        return 0;
    }
    if (len > RT_TOPIC_MAX_LEN)
        return RT_EINVAL;
    if (rt__conn_grow(self, &c->subs, &c->capsubs, (size_t)c->nsubs + 1, sizeof(*c->subs), 1,
                      RT_OBJ_SCAN))
        return RT_ENOMEM;
    char *copy = rt_strndup(self, f, len);
    if (!copy)
        return RT_ENOMEM;
    sub_entry_t *e = &c->subs[c->nsubs++];
    *e = (sub_entry_t){.filter = copy, .len = (uint16_t)len};
    rt__conn_sub_set_opts(e, o);
    return 0;
}

/* The filter is freed at once: a client that keeps changing its subscriptions would
   otherwise pile them up until a collection. */
static void sub_forget(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len)
{
    long at = sub_find(c, f, len);
    if (at < 0)
        return;
    rt_free(self, c->subs[at].filter);
    c->subs[at] = c->subs[--c->nsubs];
    if (rt__conn_tenant(c))
        rt_tenant_unsubscribe(rt__conn_tenant(c), 1);
}

/* Gives up this actor's claim on an exclusive subscription's filter (and its bytes). */
static void exclusive_unclaim(rt_actor_t *self, const char *filter, size_t len)
{
    rt_charge(self, -(ptrdiff_t)rt_exclusive_release(filter, len, rt_self(self)));
}

static void exclusive_release(rt_actor_t *self, const sub_entry_t *e)
{
    if (e->exclusive)
        exclusive_unclaim(self, e->filter, e->len);
}

bool rt__conn_sub_drop(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len)
{
    long at = sub_find(c, f, len);
    if (at >= 0)
        exclusive_release(self, &c->subs[at]);
    int existed = 0;
    rt_trie_unsubscribe(rt_broker->trie, (const char *)f, len, rt_self(self), &existed);
    if (c->stored)
        rt_store_unsub(c->client_id, (const char *)f, len);
    if (existed)
        subscription_rule_event(self, c, RT_RULE_EV_SESSION_UNSUBSCRIBED, f, len, -1);
    sub_forget(self, c, f, len);
    return existed;
}

void rt__conn_subs_unhook(rt_actor_t *self, conn_t *c)
{
    for (size_t i = 0; i < c->nsubs; i++) {
        rt_trie_unsubscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                            NULL);
        exclusive_release(self, &c->subs[i]);
    }
}

bool rt__conn_exclusive_claim(rt_actor_t *self, const conn_t *c, const char *filter, size_t len)
{
    size_t bytes;
    int rc = rt_exclusive_claim(filter, len, c->client_id, rt_self(self), &bytes);
    rt_charge(self, (ptrdiff_t)bytes);
    return rc == 0;
}

void rt__conn_leave_shared_groups(rt_actor_t *self, conn_t *c)
{
    bool any = false;
    for (size_t i = 0; i < c->nsubs; i++) {
        if (rt_topic_is_shared(c->subs[i].filter, c->subs[i].len)) {
            rt_trie_unsubscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                                NULL);
            any = true;
        }
    }
    if (any)
        rt__conn_hand_over_shared(self, c);
}

void rt__conn_rejoin_shared_groups(rt_actor_t *self, conn_t *c)
{
    for (size_t i = 0; i < c->nsubs; i++) {
        if (!rt_topic_is_shared(c->subs[i].filter, c->subs[i].len))
            continue;
        rt_trie_opts_t o = rt__conn_sub_opts(&c->subs[i]);
        rt_trie_subscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self), &o,
                          NULL);
    }
}

typedef struct {
    rt_actor_t *self;
    conn_t *c;
    uint8_t qos;       /* granted */
    uint8_t acl_check; /* the subscription's (acl.h) */
    uint32_t sub_id;
} retained_send_t;

/*
** Runs under the retained store's read lock: queues for sending, calls nothing back. The
** messages join the session's queue, so a SUBSCRIBE answered with many retained messages
** makes no more output than the client reads (delivery.c).
*/
static void retained_deliver(void *arg, const char *topic, size_t len, void *msg)
{
    RT_ASSERT(rt_topic_locks_held() == 1);
    retained_send_t *rs = arg;
    rt_retained_msg_t *r = msg;
    rt_message_t m;
    rt_message_view(r->bin, &m);
    rt_delivery_t d = {.expire_at_ms = r->expire_at_ms,
                       .qos = m.qos < rs->qos ? m.qos : rs->qos,
                       .retain = 1,
                       .acl_check = rs->acl_check,
                       .n_sub_ids = rs->sub_id ? 1 : 0};
    rt__conn_deliver_retained(rs->self, rs->c, r->bin, &d, &rs->sub_id);
}

/*
** Why a filter may not be subscribed (a v5 reason code), or 0 if it may; *acl_check is set
** when the ACL grants it only in part (each delivery is then checked, acl.h).
*/
static uint8_t subscribe_refusal(rt_actor_t *self, conn_t *c, const mqtt_sub_t *s, bool *acl_check)
{
    if (!rt__conn_topic_within_limits(s->filter.p, s->filter.len)) {
        atomic_fetch_add(&rt_broker->stats.topic_limit_hits, 1);
        return MQTT_RC_TOPIC_FILTER_INVALID;
    }
    long max = RT_LIVE(max_subscriptions);
    if (max && c->nsubs >= (size_t)max) {
        if (sub_find(c, s->filter.p, s->filter.len) < 0) { /* changing one is not a new one */
            atomic_fetch_add(&rt_broker->stats.subs_limit_hits, 1);
            return MQTT_RC_QUOTA_EXCEEDED;
        }
    }
    int acl = rt__conn_acl(c, s->filter.p, s->filter.len, RT_ACL_SUBSCRIBE);
    *acl_check = acl == RT_ACL_FILTERED;
    if (acl != RT_ACL_DENY)
        return 0;
    rt__conn_acl_denied(self, c, RT_CONN_DENIED_SUBSCRIBE, s->filter.p, s->filter.len);
    return MQTT_RC_NOT_AUTHORIZED;
}

/*
** Starts the reply to a (UN)SUBSCRIBE: room for `per` bytes per filter (the packet's own
** count, which max_packet_size bounds: a filter takes at least three bytes; small packets
** use `small`), after counting an MQTT 3.1 client's flags 0000, which are accepted
** (mqtt_codec.h).
*/
static uint8_t *sub_reply_room(const mqtt_packet_t *pk, size_t per, uint8_t *small,
                               size_t small_len)
{
    if (pk->version == MQTT_V31 && pk->flags == 0)
        atomic_fetch_add_explicit(&rt_broker->stats.v31_sub_flags, 1, memory_order_relaxed);
    size_t need = (size_t)pk->sub.count * per;
    return need <= small_len ? small : malloc(need);
}

/* What a granted filter does after the SUBACK: a byte of these bits. */
enum { THEN_RETAINED = 1, THEN_ACL_CHECK = 2 };

/*
** A SUBSCRIBE's or UNSUBSCRIBE's filter as the rewrite rules make it (rewrite.h), in place: its
** new bytes in *buf, which the caller frees (rt_free). False when the rule that applies makes
** no filter (logged). A shared subscription's filter is left as it is.
*/
static bool rewrite_filter(rt_actor_t *self, const conn_t *c, mqtt_sub_t *s, char **buf)
{
    *buf = NULL;
    if (!rt_rewrite_any() || rt_topic_is_shared((const char *)s->filter.p, s->filter.len))
        return true;
    return rt__conn_rewrite(self, c, RT_REWRITE_SUBSCRIBE, &s->filter, buf);
}

/*
** One filter of a SUBSCRIBE (or of auto_subscribe), rewritten first (its new bytes in
** *rewritten, the caller's to free): its reason code (the QoS granted, or a refusal: v5's
** code, else 0x80) and, in *then, what comes after the SUBACK.
*/
static uint8_t subscribe_one(rt_actor_t *self, conn_t *c, mqtt_sub_t *s, uint32_t sub_id,
                             uint8_t *then, char **rewritten)
{
    uint8_t qos = MQTT_SUB_QOS(s->options);
    uint8_t handling = MQTT_SUB_RETAIN_HANDLING(s->options);
    bool acl_check = false;
    *then = 0;
    *rewritten = NULL;
    /* $exclusive/filter is filter, held by one client: not a shared one, nor nothing. */
    bool exclusive = rt_exclusive_strip(&s->filter);
    if (exclusive && (!rt_topic_valid_filter((const char *)s->filter.p, s->filter.len) ||
                      rt_topic_is_shared((const char *)s->filter.p, s->filter.len)))
        return c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
    if (!rewrite_filter(self, c, s, rewritten))
        return c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
    uint8_t refused = subscribe_refusal(self, c, s, &acl_check);
    if (refused)
        return c->version == MQTT_V5 ? refused : 0x80;
    /* Checked as the client sees it, held under its tenant's mountpoint. */
    if (!rt__conn_mount_filter(self, c, &s->filter, rewritten))
        return c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
    long had = sub_find(c, s->filter.p, s->filter.len);
    bool was_exclusive = had >= 0 && c->subs[had].exclusive;
    if (exclusive && !was_exclusive &&
        !rt__conn_exclusive_claim(self, c, (const char *)s->filter.p, s->filter.len)) {
        rt_log(RT_LOG_INFO, "client.exclusive_refused", "client=%s filter=%.*s", c->client_id,
               (int)s->filter.len, (const char *)s->filter.p);
        return c->version == MQTT_V5 ? MQTT_RC_QUOTA_EXCEEDED : 0x80;
    }
    rt_tenant_t *tenant = rt__conn_tenant(c);
    if (tenant && had < 0 && !rt_tenant_subscribe(tenant)) {
        if (exclusive && !was_exclusive)
            exclusive_unclaim(self, (const char *)s->filter.p, s->filter.len);
        return c->version == MQTT_V5 ? MQTT_RC_QUOTA_EXCEEDED : 0x80;
    }
    if (was_exclusive && !exclusive) /* an ordinary SUBSCRIBE to it gives the claim up */
        exclusive_release(self, &c->subs[had]);
    rt_trie_opts_t o = {.qos = qos,
                        .no_local = (s->options & MQTT_SUB_NO_LOCAL) != 0,
                        .retain_as_published = (s->options & MQTT_SUB_RETAIN_AS_PUBLISHED) != 0,
                        .retain_handling = handling,
                        .persistent = rt__conn_session_is_durable(c),
                        .acl_check = acl_check,
                        .exclusive = exclusive,
                        .sub_id = sub_id};
    int existed = 0;
    int rc = rt_trie_subscribe(rt_broker->trie, (const char *)s->filter.p, s->filter.len,
                               rt_self(self), &o, &existed);
    if (rc == 0)
        rc = rt__conn_sub_remember(self, c, s->filter.p, s->filter.len, &o);
    if (rc && tenant && had < 0)
        rt_tenant_unsubscribe(tenant, 1);
    if (rc && exclusive && !was_exclusive)
        exclusive_unclaim(self, (const char *)s->filter.p, s->filter.len);
    if (rc == 0 && rt__conn_session_is_durable(c))
        rt_store_sub(c->client_id, (const char *)s->filter.p, s->filter.len, &o);
    if (rc == 0)
        subscription_rule_event(self, c, RT_RULE_EV_SESSION_SUBSCRIBED, s->filter.p, s->filter.len,
                                qos);
    /* Retained messages on subscribe: always (0), for a new subscription only (1), never
       (2), and never for a shared subscription (MQTT 5 3.8.3.1, 4.8.2). */
    bool shared = rt_topic_is_shared((const char *)s->filter.p, s->filter.len);
    bool retained = rc == 0 && !shared && (handling == 0 || (handling == 1 && !existed));
    *then = (retained ? THEN_RETAINED : 0) | (acl_check ? THEN_ACL_CHECK : 0);
    return rc == 0 ? qos : c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
}

/* A granted filter's retained messages, as a record for rt__conn_send_retained. */
static void want_retained(rt_buf_t *wanted, const mqtt_sub_t *s, uint8_t code, uint8_t then,
                          uint32_t sub_id)
{
    if (!(then & THEN_RETAINED))
        return;
    uint8_t head[8] = {code, (then & THEN_ACL_CHECK) != 0};
    memcpy(head + 2, &sub_id, 4);
    head[6] = (uint8_t)(s->filter.len >> 8);
    head[7] = (uint8_t)s->filter.len;
    rt_buf_add(wanted, head, sizeof(head));
    rt_buf_add(wanted, s->filter.p, s->filter.len);
}

/* The retained messages each new subscription gets: sent now, or once this node's copy of a
   cluster's retained store has caught up. */
static void send_wanted(rt_actor_t *self, conn_t *c, rt_buf_t *wanted)
{
    if (wanted->len && !wanted->oom &&
        !rt_cluster_retained_barrier(rt_self(self), wanted->data, wanted->len))
        rt__conn_send_retained(self, c, (const uint8_t *)wanted->data, wanted->len);
    rt_buf_free(wanted);
}

int rt__conn_handle_subscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    uint8_t small[512];
    uint8_t *codes = sub_reply_room(pk, 2, small, sizeof(small));
    if (!codes)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    rt_buf_t wanted = {0}; /* sent after the SUBACK */
    while (n < pk->sub.count && mqtt_sub_next(pk, &pos, &s)) {
        uint8_t then;
        char *rewritten;
        codes[n] = subscribe_one(self, c, &s, pk->props.sub_id, &then, &rewritten);
        want_retained(&wanted, &s, codes[n], then, pk->props.sub_id);
        rt_free(self, rewritten);
        n++;
    }
    rt__conn_record_session(self, c, true);
    mqtt_packet_t ack = {.type = MQTT_SUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    rt__conn_send_packet(c, &ack);
    send_wanted(self, c, &wanted);
    if (codes != small)
        free(codes);
    return 0;
}

/*
** filter with auto_subscribe's placeholders filled in (%c the client id, %u the user name, %%
** a %): its length, or 0 when it cannot be made (no user name for %u, a name with a wildcard
** or a NUL, which would widen the filter, or no room).
*/
static size_t fill_placeholders(const conn_t *c, const char *filter, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = filter; *p; p++) {
        const char *add = p;
        size_t len = 1;
        if (*p == '%' && (p[1] == 'c' || p[1] == 'u')) {
            add = p[1] == 'c' ? rt__conn_own_client_id(c) : c->username;
            if (!add || strpbrk(add, "+#"))
                return 0;
            len = strlen(add);
            p++;
        } else if (*p == '%' && p[1] == '%') {
            p++;
        }
        if (n + len >= cap)
            return 0;
        memcpy(out + n, add, len);
        n += len;
    }
    return n;
}

void rt__conn_auto_subscribe(rt_actor_t *self, conn_t *c)
{
    const rt_conf_t *conf = &rt_broker->conf;
    rt_buf_t wanted = {0};
    char filter[RT_TOPIC_MAX_LEN + 1];
    for (unsigned i = 0; i < conf->nauto_subs; i++) {
        const rt_conf_auto_sub_t *a = &conf->auto_subs[i];
        size_t len = fill_placeholders(c, a->topic, filter, sizeof(filter));
        if (!len || !rt_topic_valid_filter(filter, len) ||
            !mqtt_utf8_valid((uint8_t *)filter, len)) {
            rt_log(RT_LOG_DEBUG, "client.auto_subscribe_skipped", "client=%s topic=%s",
                   c->client_id, a->topic);
            continue;
        }
        mqtt_sub_t s = {.filter = {(const uint8_t *)filter, (uint32_t)len},
                        .options =
                            (uint8_t)(a->qos | (a->no_local ? MQTT_SUB_NO_LOCAL : 0) |
                                      (a->retain_as_published ? MQTT_SUB_RETAIN_AS_PUBLISHED : 0) |
                                      a->retain_handling << 4)};
        uint8_t then;
        char *rewritten;
        uint8_t code = subscribe_one(self, c, &s, 0, &then, &rewritten);
        if (code >= 0x80)
            rt_log(RT_LOG_INFO, "client.auto_subscribe_refused", "client=%s filter=%.*s reason=%#x",
                   c->client_id, (int)len, filter, code);
        else
            want_retained(&wanted, &s, code, then, 0);
        rt_free(self, rewritten);
    }
    rt__conn_record_session(self, c, true);
    send_wanted(self, c, &wanted);
}

void rt__conn_send_retained(rt_actor_t *self, conn_t *c, const uint8_t *rec, size_t len)
{
    while (len >= 8) {
        size_t flen = (size_t)rec[6] << 8 | rec[7];
        if (flen > len - 8)
            return;
        retained_send_t rs = {.self = self, .c = c, .qos = rec[0], .acl_check = rec[1]};
        memcpy(&rs.sub_id, rec + 2, 4);
        /* The subscription may have gone while the cluster's store caught up. */
        if (sub_find(c, rec + 8, flen) >= 0)
            rt_retained_match(rt_broker->retained, (const char *)rec + 8, flen, retained_deliver,
                              &rs, NULL);
        rec += 8 + flen;
        len -= 8 + flen;
    }
}

int rt__conn_handle_unsubscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    uint8_t small[256];
    uint8_t *codes = sub_reply_room(pk, 1, small, sizeof(small));
    if (!codes)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (n < pk->sub.count && mqtt_sub_next(pk, &pos, &s)) {
        char *rewritten;
        rt_exclusive_strip(&s.filter); /* the one subscription, by either name */
        bool existed = rewrite_filter(self, c, &s, &rewritten) &&
                       rt__conn_mount_filter(self, c, &s.filter, &rewritten) &&
                       rt__conn_sub_drop(self, c, s.filter.p, s.filter.len);
        rt_free(self, rewritten);
        codes[n++] = existed ? MQTT_RC_SUCCESS : MQTT_RC_NO_SUBSCRIPTION_EXISTED;
    }
    rt__conn_record_session(self, c, true);
    mqtt_packet_t ack = {.type = MQTT_UNSUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    rt__conn_send_packet(c, &ack);
    if (codes != small)
        free(codes);
    return 0;
}

/*
** PUBLISH from the client: the checks before a message is routed (Receive Maximum,
** topic alias, topic limits, $SYS, the ACL), routing it once as a canonical message,
** exactly-once for QoS 2 (the ids between PUBREC and PUBREL), and its acknowledgement,
** which waits for the store to commit what the message changed on disk (durable acks).
*/
#include <string.h>

#include "acl.h"
#include "cluster.h"
#include "conn_impl.h"
#include "delayed.h"
#include "log.h"
#include "rewrite.h"
#include "store.h"

/* MQTT 5 topic aliases (3.3.2.3.4): the alias maps to the last topic sent with it. */
static int resolve_alias(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    mqtt_str_t *topic = &pk->publish.topic;
    if (!(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
        return topic->len ? 0 : MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
    uint16_t alias = pk->props.topic_alias;
    if (alias == 0 || alias > rt_broker->conf.max_topic_alias)
        return MQTT_ERR(MQTT_RC_TOPIC_ALIAS_INVALID);
    conn_aliases_t *a = rt__conn_aliases_get_or_make(self, c);
    if (a && !a->in)
        a->in =
            rt_alloc(self, (size_t)rt_broker->conf.max_topic_alias * sizeof(char *), RT_OBJ_SCAN);
    if (!a || !a->in)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    char **slot = &a->in[alias - 1];
    if (topic->len) {
        char *copy = rt_strndup(self, topic->p, topic->len);
        if (!copy)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        rt_free(self, *slot);
        *slot = copy;
        return 0;
    }
    if (!*slot)
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* an alias never set */
    *topic = (mqtt_str_t){(const uint8_t *)*slot, (uint32_t)strlen(*slot)};
    return 0;
}

static int qos2_find(const conn_t *c, uint16_t id)
{
    const rt_session_t *s = c->sess;
    if (!s)
        return -1;
    RT_ASSERT(s->nqos2 <= s->capqos2 && s->nqos2 <= RT_CONN_QOS2_PENDING_MAX);
    for (size_t i = 0; i < s->nqos2; i++)
        if (s->qos2_ids[i] == id)
            return (int)i;
    return -1;
}

int rt__conn_qos2_add(rt_actor_t *self, conn_t *c, uint16_t packet_id)
{
    RT_ASSERT(qos2_find(c, packet_id) < 0);
    rt_session_t *s = rt__conn_session_get_or_make(self, c);
    if (!s)
        return RT_ENOMEM;
    if (s->nqos2 >= RT_CONN_QOS2_PENDING_MAX)
        return RT_ELIMIT;
    if (rt__conn_grow(self, &s->qos2_ids, &s->capqos2, (size_t)s->nqos2 + 1, sizeof(*s->qos2_ids),
                      8, RT_OBJ_LEAF))
        return RT_ENOMEM;
    s->qos2_ids[s->nqos2++] = packet_id;
    return 0;
}

/* Ends the exactly-once record of an inbound QoS 2 id; false if there was none. */
static bool qos2_forget(conn_t *c, uint16_t packet_id)
{
    int i = qos2_find(c, packet_id);
    if (i < 0)
        return false;
    c->sess->qos2_ids[i] = c->sess->qos2_ids[--c->sess->nqos2];
    if (c->stored)
        rt_store_qos2_in(c->client_id, packet_id, false, 0, 0);
    return true;
}

void rt__conn_on_pubrel(conn_t *c, const mqtt_packet_t *pk)
{
    int i = qos2_forget(c, pk->packet_id) ? 0 : -1;
    mqtt_packet_t comp = {.type = MQTT_PUBCOMP,
                          .packet_id = pk->packet_id,
                          .reason = i >= 0 ? 0 : MQTT_RC_PACKET_ID_NOT_FOUND};
    if (c->version != MQTT_V5)
        comp.reason = 0;
    rt__conn_send_packet(c, &comp);
}

/*
** How many acknowledgements rtd may withhold (waiting for commits) before it stops taking
** the client's PUBLISHes: as many as the client may leave unacknowledged.
*/
static uint32_t withheld_acks_max(const conn_t *c)
{
    return c->version == MQTT_V5 ? c->rx_max : (uint32_t)RT_LIVE(receive_maximum);
}

bool rt__conn_acks_held(const conn_t *c)
{
    return c->sess && c->sess->nacks && c->sess->nacks >= withheld_acks_max(c);
}

/*
** Sends the acknowledgements at the head of the line whose commits have all come. One that
** was not confirmed (the store, JetStream or a sink did not say it kept what the PUBLISH
** left behind) cannot say so to an MQTT 3 client: the connection closes instead,
** unacknowledged from there on, and the client sends those PUBLISHes again (4.4). An MQTT 5
** client is told by the reason code.
*/
static void pending_acks_flush(rt_actor_t *self, conn_t *c)
{
    rt_session_t *s = c->sess;
    RT_ASSERT(s && s->nacks <= s->capacks);
    uint32_t i = 0;
    for (; i < s->nacks && s->acks[i].remaining == 0; i++) {
        if (s->acks[i].unconfirmed && c->version != MQTT_V5) {
            rt_log(RT_LOG_WARNING, "client.ack_unconfirmed",
                   "client=%s packet_id=%u closing, so that the client sends it again",
                   c->client_id ? c->client_id : "-", s->acks[i].packet_id);
            s->nacks = 0;
            rt__conn_close(self, c, 0, RT_REASON_NORMAL);
            return;
        }
        mqtt_packet_t ack = {.type = s->acks[i].type,
                             .packet_id = s->acks[i].packet_id,
                             .reason = s->acks[i].reason};
        rt__conn_send_packet(c, &ack);
    }
    if (i) {
        memmove(s->acks, s->acks + i, (s->nacks - i) * sizeof(*s->acks));
        s->nacks -= i;
    }
}

/* pending_acks_flush for commits that came: input held for them goes on once under. */
static void flush_after_commits(rt_actor_t *self, conn_t *c)
{
    bool held = rt__conn_acks_held(c);
    pending_acks_flush(self, c);
    if (held && !c->closing && !rt__conn_acks_held(c))
        rt__conn_resume_parsing(self, c);
}

/*
** PUBACK or PUBREC for an incoming PUBLISH, once `waits` commits have come; behind any
** earlier one still waiting, so acks keep their order (4.6). There is no time limit: every
** commit waited for is answered, by whoever keeps the copy (the store, a subscriber's
** session, JetStream within its publish wait, a sink), or, if that actor ends first, by its
** dead_letter hook; a success is never sent on a timer.
*/
static void inbound_acknowledge(rt_actor_t *self, conn_t *c, uint8_t type, uint16_t packet_id,
                                uint8_t reason, uint64_t token, uint32_t waits)
{
    RT_ASSERT(type == MQTT_PUBACK || type == MQTT_PUBREC);
    rt_session_t *s = c->sess;
    mqtt_packet_t ack = {.type = type, .packet_id = packet_id, .reason = reason};
    if (!s || (waits == 0 && s->nacks == 0)) {
        rt__conn_send_packet(c, &ack);
        return;
    }
    RT_ASSERT(token); /* a session that holds acks gave this PUBLISH a token */
    if (rt__conn_grow(self, &s->acks, &s->capacks, (size_t)s->nacks + 1, sizeof(*s->acks), 8,
                      RT_OBJ_LEAF)) {
        /* No memory to wait: nothing may be said of this PUBLISH, so the client sends it
           again on another connection. */
        rt_log(RT_LOG_WARNING, "client.ack_unconfirmed",
               "client=%s packet_id=%u out of memory; closing", c->client_id ? c->client_id : "-",
               packet_id);
        rt__conn_close(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
        return;
    }
    s->acks[s->nacks++] = (rt_pending_ack_t){
        .token = token, .remaining = waits, .packet_id = packet_id, .type = type, .reason = reason};
    pending_acks_flush(self, c);
    if (rt__conn_acks_held(c) && c->sock)
        rt_sock_pause_reading(c->sock, true); /* the parse loop stops at the next packet */
}

/*
** A commit came: from the store, a subscriber's session, the cluster (JetStream's stream or
** the retained bucket), or the rule engine for a durable rule. One that failed decides the
** acknowledgement at once. A refusal that sending again cannot change (a sink's byte limit,
** RT_ELIMIT; a row the database rejects, RT_EINVAL) is a negative MQTT 5 reason code and,
** as MQTT 3 has none, an MQTT 3 PUBACK all the same. Anything else (the keeper died, did not
** answer in time, could not write) leaves the PUBLISH unconfirmed: 0x80, or for MQTT 3 the
** connection closes so that the client sends it again.
*/
void rt__conn_on_commit(rt_actor_t *self, conn_t *c, uint64_t token, int32_t status)
{
    if (!c->sess)
        return;
    for (uint32_t i = 0; i < c->sess->nacks; i++) {
        rt_pending_ack_t *a = &c->sess->acks[i];
        if (a->token != token)
            continue;
        if (status >= 0) {
            if (a->remaining)
                a->remaining--;
            break;
        }
        a->remaining = 0; /* decided: the other commits cannot make it a success */
        if (a->failed)
            break;
        a->failed = 1;
        bool refused = status == RT_ELIMIT || status == RT_EINVAL;
        if (c->version == MQTT_V5)
            a->reason = status == RT_ELIMIT ? MQTT_RC_QUOTA_EXCEEDED : MQTT_RC_UNSPECIFIED;
        a->unconfirmed = !refused;
        /* The exchange ends here for a v5 client (a PUBREC of 0x80 or more frees the id:
           4.3.3) and for an MQTT 3 one that will send the PUBLISH again, which must then be
           routed again, not taken for a duplicate. */
        if (a->type == MQTT_PUBREC && (c->version == MQTT_V5 || a->unconfirmed))
            qos2_forget(c, a->packet_id);
        break;
    }
    flush_after_commits(self, c);
}

bool rt__conn_topic_within_limits(const uint8_t *t, size_t len)
{
    long max_len = RT_LIVE(max_topic_length);
    if (max_len && len > (size_t)max_len)
        return false;
    long levels = 1, max_levels = RT_LIVE(max_topic_levels);
    if (!max_levels)
        return true;
    for (const uint8_t *p = t; (p = memchr(p, '/', len - (size_t)(p - t))) != NULL; p++)
        if (++levels > max_levels)
            return false;
    return true;
}

/* A PUBLISH the broker will not route: v5 learns why (reason), v3 gets its ack and no more. */
static void refuse_publish(conn_t *c, mqtt_packet_t *pk, uint8_t reason)
{
    if (!pk->publish.qos)
        return;
    mqtt_packet_t ack = {.type = pk->publish.qos == 1 ? MQTT_PUBACK : MQTT_PUBREC,
                         .packet_id = pk->packet_id,
                         .reason = c->version == MQTT_V5 ? reason : 0};
    rt__conn_send_packet(c, &ack);
}

/*
** The client's QoS 2 PUBLISHes whose PUBREC it has been sent and whose PUBREL has not come:
** what its Receive Maximum holds it to (4.9). Acknowledgements rtd withholds itself (waiting
** for commits) are not the client's doing: they stop its input at the acks gate instead, so
** a client is never disconnected for a quota that rtd's own acks would have refilled.
*/
static uint32_t inbound_awaiting_release(const conn_t *c)
{
    if (!c->sess)
        return 0;
    uint32_t n = c->sess->nqos2;
    for (uint32_t i = 0; i < c->sess->nacks; i++)
        n -= c->sess->acks[i].type == MQTT_PUBREC;
    return n;
}

/* A QoS 1 or 2 PUBLISH past the Receive Maximum rtd gave the client (3.3.4, 4.9). */
static bool over_receive_maximum(const conn_t *c, const mqtt_packet_t *pk)
{
    if (c->version != MQTT_V5 || !pk->publish.qos)
        return false;
    if (pk->publish.qos == 2 && qos2_find(c, pk->packet_id) >= 0)
        return false; /* a resend of one already counted */
    return inbound_awaiting_release(c) >= c->rx_max;
}

/* A tenant's retained message within its tenant_max_retained_bytes (the store counts a
   message's binary). */
static bool retain_fits(const conn_t *c, const mqtt_packet_t *pk, rt_bin_t *bin)
{
    rt_tenant_t *tenant = rt__conn_tenant(c);
    if (!tenant)
        return true;
    size_t held = rt_retained_bytes_of(rt_broker->retained, (const char *)pk->publish.topic.p,
                                       pk->publish.topic.len);
    return rt_tenant_retain_fits(tenant, held, pk->publish.payload.len ? rt_bin_len(bin) : 0);
}

/*
** Routes the message once, as a canonical binary, to its subscribers and the rules; sets
** *waits to the commits its acknowledgement must wait for (with track: the publisher waits)
** and *reason to what a v5 acknowledgement says. Returns 0, or an error that ends the
** connection.
*/
static int route_published(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, bool track,
                           uint64_t token, uint32_t *waits, uint8_t *reason)
{
    rt_bin_t *bin = rt_message_new(pk, c->client_id, c->username);
    if (!bin)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    if (pk->publish.retain && !retain_fits(c, pk, bin)) {
        rt_bin_release(bin);
        if (c->version == MQTT_V5)
            *reason = MQTT_RC_QUOTA_EXCEEDED;
        return 0;
    }
    rt_message_set_read_ns(bin, c->last_rx_ns);
    rt_route_out_t routed = {0};
    int n = rt_route(rt_self(self), bin, track ? rt_self(self) : 0, token, &routed);
    *waits = routed.nacks;
    /* Still a success (3.4.2.1); in a cluster, subscribers elsewhere are not counted here.
       A retained message the store's limits refused was not taken as asked (3.3.4). */
    if (routed.retain_refused && c->version == MQTT_V5)
        *reason = MQTT_RC_QUOTA_EXCEEDED;
    else if (n == 0 && c->version == MQTT_V5 && !rt_cluster_on())
        *reason = MQTT_RC_NO_MATCHING_SUBSCRIBERS;
    rt__conn_routed_this_event += n > 0 ? (uint32_t)n : 1;
    bool promised;
    rt__conn_rules_publish(self, c, bin, track ? rt_self(self) : 0, token, &promised);
    if (promised)
        (*waits)++; /* a durable rule: the ack waits for its rows to be committed */
    rt_bin_release(bin);
    if (pk->publish.qos == 2 && rt__conn_session_is_durable(c)) {
        /* After a restart a resend of this id must still be recognised (exactly once). */
        rt_store_qos2_in(c->client_id, pk->packet_id, true, rt_self(self), token);
        (*waits)++;
    }
    return 0;
}

/*
** A $delayed PUBLISH: held (delayed.h), with persistence its acknowledgement waiting for
** state.db to keep it. Past max_delayed or max_delayed_bytes it is refused: 0x97 for v5,
** and, as MQTT 3 has no negative PUBACK, a logged refusal there.
*/
static void hold_delayed(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, uint32_t delay_s,
                         bool track, uint64_t token, uint32_t *waits, uint8_t *reason)
{
    rt_bin_t *bin = rt_message_new(pk, c->client_id, c->username);
    int rc =
        bin ? rt_delayed_add(bin, delay_s, track ? rt_self(self) : 0, token, waits) : RT_ENOMEM;
    if (bin)
        rt_bin_release(bin);
    if (rc == 0)
        return;
    rt_log(RT_LOG_WARNING, "client.delayed_refused", "client=%s topic=%.*s %s",
           c->client_id ? c->client_id : "-", (int)pk->publish.topic.len,
           (const char *)pk->publish.topic.p,
           rc == RT_ELIMIT ? "max_delayed or max_delayed_bytes reached" : rt_strerror(rc));
    if (c->version == MQTT_V5)
        *reason = rc == RT_ELIMIT ? MQTT_RC_QUOTA_EXCEEDED : MQTT_RC_UNSPECIFIED;
}

bool rt__conn_rewrite(rt_actor_t *self, const conn_t *c, rt_rewrite_action_t action, mqtt_str_t *t,
                      char **buf)
{
    bool publish = action == RT_REWRITE_PUBLISH;
    /* Room for a dest with its groups nine times the original; a longer result is refused. */
    size_t cap = 256 + 9 * (size_t)t->len;
    if (cap > RT_TOPIC_MAX_LEN + 1)
        cap = RT_TOPIC_MAX_LEN + 1;
    if (!(*buf = rt_alloc(self, cap, RT_OBJ_LEAF)))
        return false;
    size_t n = rt_rewrite(action, (const char *)t->p, t->len, *buf, cap);
    if (n == 0)
        return true;
    if (n == RT_REWRITE_BAD ||
        !(publish ? rt_topic_valid_name(*buf, n) : rt_topic_valid_filter(*buf, n))) {
        if (publish)
            rt_log(RT_LOG_WARNING, "client.rewrite_invalid", "client=%s topic=%.*s", c->client_id,
                   (int)t->len, (const char *)t->p);
        else
            rt_log(RT_LOG_WARNING, "client.rewrite_invalid", "client=%s filter=%.*s", c->client_id,
                   (int)t->len, (const char *)t->p);
        return false;
    }
    *t = (mqtt_str_t){(const uint8_t *)*buf, (uint32_t)n};
    return true;
}

static int publish_resolved(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk);

int rt__conn_handle_publish(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    rt__metric_add(RT_METRIC_MSGS_IN, 1);
    if (over_receive_maximum(c, pk))
        return MQTT_ERR(MQTT_RC_RECEIVE_MAX_EXCEEDED);
    if (c->version == MQTT_V5) {
        if (pk->props.sub_id_count)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* only servers send them (3.3.4) */
        int rc = resolve_alias(self, c, pk);
        if (rc)
            return rc;
    }
    if (!rt_rewrite_any())
        return publish_resolved(self, c, pk);
    char *rewritten = NULL;
    int rc = 0;
    if (rt__conn_rewrite(self, c, RT_REWRITE_PUBLISH, &pk->publish.topic, &rewritten))
        rc = publish_resolved(self, c, pk);
    else
        refuse_publish(c, pk, MQTT_RC_TOPIC_NAME_INVALID);
    rt_free(self, rewritten);
    return rc;
}

/*
** A tenant's PUBLISH within its rate: its topic put under the mountpoint, in room (room_len
** bytes) or in *mounted, the caller's to free. False when refused (answered here).
*/
static bool publish_mounted(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, rt_tenant_t *tenant,
                            char *room, size_t room_len, char **mounted)
{
    if (!rt_tenant_publish(tenant)) {
        refuse_publish(c, pk, MQTT_RC_QUOTA_EXCEEDED);
        return false;
    }
    if (rt__conn_mount_name(self, c, &pk->publish.topic, room, room_len, mounted))
        return true;
    rt_free(self, *mounted);
    *mounted = NULL;
    refuse_publish(c, pk, MQTT_RC_TOPIC_NAME_INVALID);
    return false;
}

/* A PUBLISH with its topic as it is routed (alias resolved, rewritten): the checks, then
   routing and the acknowledgement. */
static int publish_resolved(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    /* A delayed message is checked as what it will be: a PUBLISH to its real topic. */
    uint32_t delay_s = 0;
    bool delayed = rt_delayed_wanted(&pk->publish.topic);
    if (delayed && rt_delayed_split(&pk->publish.topic, &delay_s) != 0) {
        rt_delayed_count_invalid();
        rt_log(RT_LOG_WARNING, "client.delayed_invalid", "client=%s topic=%.*s",
               c->client_id ? c->client_id : "-", (int)pk->publish.topic.len,
               (const char *)pk->publish.topic.p);
        refuse_publish(c, pk, MQTT_RC_TOPIC_NAME_INVALID);
        return 0;
    }
    if (!rt__conn_topic_within_limits(pk->publish.topic.p, pk->publish.topic.len)) {
        atomic_fetch_add(&rt_broker->stats.topic_limit_hits, 1);
        refuse_publish(c, pk, MQTT_RC_TOPIC_NAME_INVALID);
        return 0;
    }
    /* $SYS belongs to the broker (as in Mosquitto): a client cannot fake its values. */
    bool sys = pk->publish.topic.len >= 4 && memcmp(pk->publish.topic.p, "$SYS", 4) == 0;
    if (sys) {
        refuse_publish(c, pk, MQTT_RC_NOT_AUTHORIZED);
        return 0;
    }
    if (!rt__conn_acl(c, pk->publish.topic.p, pk->publish.topic.len, RT_ACL_WRITE)) {
        rt__conn_acl_denied(self, c, RT_CONN_DENIED_PUBLISH, pk->publish.topic.p,
                            pk->publish.topic.len);
        refuse_publish(c, pk, MQTT_RC_NOT_AUTHORIZED);
        return 0;
    }
    /* A tenant's PUBLISH: within its rate, and its topic under the mountpoint from here on. */
    char *mounted = NULL, room[256]; /* most topics with their mountpoint fit the room */
    rt_tenant_t *tenant = rt__conn_tenant(c);
    if (tenant && !publish_mounted(self, c, pk, tenant, room, sizeof(room), &mounted))
        return 0;
    int rc = 0;
    uint8_t qos = pk->publish.qos;
    /* Exactly once: delivered on the first PUBLISH, a resend before PUBREL is not. */
    bool forward = qos < 2 || qos2_find(c, pk->packet_id) < 0;
    if (qos == 2 && forward && (rc = rt__conn_qos2_add(self, c, pk->packet_id)) != 0) {
        rc = MQTT_ERR(rc == RT_ELIMIT ? MQTT_RC_RECEIVE_MAX_EXCEEDED : MQTT_RC_UNSPECIFIED);
        goto out;
    }
    uint8_t reason = MQTT_RC_SUCCESS;
    /* With persistence, the acknowledgement waits for what the message left on disk. */
    bool track = qos && rt__conn_session_get_or_make(self, c);
    uint64_t token = track ? ++c->sess->next_token : 0;
    uint32_t waits = 0;
    if (forward && delayed) {
        hold_delayed(self, c, pk, delay_s, track, token, &waits, &reason);
    } else if (forward && (rc = route_published(self, c, pk, track, token, &waits, &reason))) {
        goto out;
    }
    if (qos)
        inbound_acknowledge(self, c, qos == 1 ? MQTT_PUBACK : MQTT_PUBREC, pk->packet_id, reason,
                            token, waits);
out:
    if (mounted)
        rt_free(self, mounted);
    return rc;
}

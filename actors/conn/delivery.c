/*
** Messages to the client: each routed message's fate (sent at once, queued in the
** session, or dropped and counted), the receive window and packet ids of QoS 1 and 2,
** the client's acknowledgements, retransmission on resume, the slow-consumer verdict,
** and the hand-over of shared-subscription messages a leaving member will not
** acknowledge. A subscriber's PUBLISH is written from the canonical message's parts
** (message.h): nothing routed is parsed again here.
*/
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "conn_impl.h"
#include "log.h"
#include "store.h"

/*
** Slow consumers. A client whose socket backs up past the runtime's pressure
** mark first gets backpressure (its publishers are muted), which is lossless
** for a reader that is only behind for a moment (a burst from many
** publishers). If it is still backed up RT_CONN_SLOW_MS later it is a slow
** consumer: it sheds QoS 0 (dropped and counted, at the publishers' end too)
** and stops applying pressure, so it cannot hold everyone else back; its QoS
** 1/2 stay bounded by its receive window and queue. It recovers when its
** socket drains. Whatever the verdict, the client's memory budget bounds what
** it holds (below).
*/
#define RT_CONN_SLOW_MS 1000
#define RT_CONN_SLOW_HIGH_WATER (4u << 20) /* pressure mark while shedding: window traffic only */

#define SENT_DISCARDED 1 /* send_publish: over the client's maximum packet size, dropped */

/* Packet ids run 1..65535, so a session has at most that many messages in flight. */
#define RT_CONN_PACKET_IDS 65535

bool rt__conn_online(const conn_t *c)
{
    return c->sock && c->version && !c->closing;
}

rt_session_t *rt__conn_session_get_or_make(rt_actor_t *self, conn_t *c)
{
    if (!c->sess && (c->sess = rt_alloc(self, sizeof(*c->sess), RT_OBJ_SCAN)))
        c->sess->clear_ms = rt_wall_ms();
    return c->sess;
}

bool rt__conn_session_is_durable(const conn_t *c)
{
    return c->session_expiry && c->client_id && rt_store_enabled();
}

/*
** The memory budget (max_client_memory): one bound per client over what it makes rtd
** hold: its actor's heap (session, subscriptions, queue records, partial packets), the
** messages it holds (their binaries count in its heap's figures) and its unsent output.
** A client at its budget takes no more messages, by client_memory_policy:
**   hold         its publishers are held back (rt_hold_senders: parked, as by socket
**                pressure) while it drains, for at most client_memory_hold_ms; after
**                that, newest messages are dropped until it is under the budget again.
**                The default: a subscriber only briefly behind loses nothing it is owed,
**                and what it costs others (a publisher waiting) is bounded in time.
**   drop_newest  the message that does not fit is dropped;
**   drop_oldest  queued messages are dropped, oldest first, until it fits.
** Every drop is counted, per client too. An offline session cannot drain, so it holds
** no one back: at its budget it drops the newest.
*/
size_t rt__conn_memory(const conn_t *c)
{
    return rt_memory(rt_current()) + (c->sock ? rt_sock_pending(c->sock) : 0) +
           rt_xport_memory(rt__conn_xp(c));
}

static bool over_budget(const conn_t *c, size_t more)
{
    return rt__conn_memory(c) + more > (size_t)RT_LIVE(max_client_memory);
}

static void count_dropped(rt_actor_t *self, conn_t *c, rt_bin_t *bin, uint8_t qos, const char *why);
static void session_release_msg(rt_actor_t *self, conn_t *c, rt_qmsg_t *m);

/* drop_oldest: frees queued messages, oldest first, until more bytes fit; whether they do. */
static bool drop_oldest_for(rt_actor_t *self, conn_t *c, size_t more)
{
    while (c->sess && c->sess->queued.n && over_budget(c, more)) {
        rt_qmsg_t *old = rt_qlist_pop(&c->sess->queued);
        count_dropped(self, c, rt_qmsg_bin(old), old->qos, "memory_budget");
        session_release_msg(self, c, old);
    }
    return !over_budget(c, more);
}

/* Whether a message of bytes may be taken now (false: drop it), by the policy. */
static bool budget_admit(rt_actor_t *self, conn_t *c, size_t bytes)
{
    if (!over_budget(c, bytes))
        return true;
    rt_memory_policy_t policy = rt_broker->memory_policy;
    if (policy == RT_MEMORY_DROP_OLDEST)
        return drop_oldest_for(self, c, bytes);
    if (policy == RT_MEMORY_DROP_NEWEST || !rt__conn_online(c) || c->budget_spent ||
        !RT_LIVE(client_memory_hold_ms))
        return false;
    if (!c->budget_hold) {
        c->budget_hold = 1;
        rt_hold_senders(self, true);
        rt_send_after_tag((uint64_t)RT_LIVE(client_memory_hold_ms), rt_self(self),
                          RT_CONN_MSG_BUDGET_CHECK, NULL);
        rt_log(RT_LOG_INFO, "client.budget_hold", "client=%s memory=%zu holding publishers",
               c->client_id ? c->client_id : "-", rt__conn_memory(c));
    }
    return true; /* it came before the senders were held: the one message past the budget */
}

bool rt__conn_inbound_over_budget(const conn_t *c)
{
    /* Its memory less what is on its way to it: the unsent output (in rt__conn_memory and
       in the outbound share alike, so left out of both) and the session's messages. */
    size_t mem = rt_memory(rt_current());
    size_t outbound = c->sess ? c->sess->queued.bytes + c->sess->inflight.bytes : 0;
    return mem > outbound && mem - outbound > (size_t)RT_LIVE(max_client_memory);
}

void rt__conn_budget_check(conn_t *c, bool hold_expired)
{
    if (!c->budget_hold && !c->budget_spent)
        return;
    bool over = over_budget(c, 0);
    if (c->budget_hold && (hold_expired || !over)) {
        c->budget_hold = 0;
        rt_hold_senders(rt_current(), false);
        if (over) {
            c->budget_spent = 1;
            rt_log(RT_LOG_WARNING, "client.budget_spent",
                   "client=%s memory=%zu still at its budget, dropping the newest",
                   c->client_id ? c->client_id : "-", rt__conn_memory(c));
        }
    }
    if (c->budget_spent && !over)
        c->budget_spent = 0;
}

/* qos: what the message was owed at; a drop at 1 or 2 breaks a promise its publisher was given. */
static void count_dropped(rt_actor_t *self, conn_t *c, rt_bin_t *bin, uint8_t qos, const char *why)
{
    rt__conn_rule_event(self, c, RT_RULE_EV_MESSAGE_DROPPED, NULL, -1, -1, why, bin);
    if (qos && c->sess)
        c->sess->dropped_owed++;
    if (c->dropped++ == 0)
        rt_log(RT_LOG_WARNING, "client.dropping", "client=%s (slow consumer or full queue)",
               c->client_id ? c->client_id : "-");
    atomic_fetch_add_explicit(&rt_broker->stats.msgs_dropped, 1, memory_order_relaxed);
}

/*
** The topic alias to send topic with (3.3.2.3.4), 0 for none: one the client already has, or
** a fresh one (*fresh) while its Topic Alias Maximum leaves room, made known to the client by
** this send. An alias costs three bytes (identifier and value), so shorter topics go as they are.
*/
#define RT_ALIAS_PROPERTY_BYTES 3

static uint16_t out_alias_pick(conn_t *c, mqtt_str_t topic, bool *fresh)
{
    *fresh = false;
    if (!c->aliases || !c->aliases->out || topic.len <= RT_ALIAS_PROPERTY_BYTES)
        return 0;
    return rt_alias_out_lookup(c->aliases->out, topic.p, topic.len, fresh);
}

/*
** Writes the len bytes of m's frame for o: in place when the socket gives room, else through
** room on the scheduler's stack for payloads up to ~4 KB (a 1 KB message malloc'ed and freed
** a frame per delivery: fan-in at 1 KB, ~300,000 a second).
*/
static int write_publish(conn_t *c, const rt_message_t *m, const rt_message_out_t *o, size_t len)
{
    uint8_t stackbuf[4096];
    uint8_t *room = rt__conn_reserve_frame(c, len);
    uint8_t *buf = room ? room : len <= sizeof(stackbuf) ? stackbuf : malloc(len);
    if (!buf)
        return RT_ENOMEM;
    size_t wrote = rt_message_encode(m, o, buf, len);
    RT_ASSERT(wrote == len);
    (void)wrote;
    if (!room) {
        int rc = rt__conn_write_packet(c, MQTT_PUBLISH, buf, len);
        if (buf != stackbuf)
            free(buf);
        return rc;
    }
    int rc = rt_sock_commit(c->sock, len);
    if (rc == 0)
        rt__conn_count_packet_out(MQTT_PUBLISH, len);
    return rc;
}

/*
** Sends one message from its canonical form, written for this client: its
** QoS, packet id and DUP flag, the remaining message expiry (3.3.2.3.3),
** the topic alias and the subscription identifiers. Returns 0, or an error
** if it was not written; a message over the client's Maximum Packet Size is
** discarded and counted (3.1.2.11.4) and reported as SENT_DISCARDED, so it
** is neither retried nor kept inflight.
*/
static int send_publish(rt_actor_t *self, conn_t *c, rt_bin_t *bin, uint8_t qos,
                        uint8_t retain_flag, uint16_t packet_id, uint8_t dup, uint64_t expire_at_ms,
                        const uint32_t *sub_ids, uint32_t n_sub_ids)
{
    RT_ASSERT(c->sock && c->version && bin);
    RT_ASSERT(qos == 0 || packet_id != 0);
    rt_message_t m;
    rt_message_view(bin, &m);
    rt_tenant_t *tenant = rt__conn_tenant(c);
    if (tenant && !rt__conn_unmount(c, &m.topic)) {
        count_dropped(self, c, bin, qos, "outside_mountpoint");
        return SENT_DISCARDED;
    }
    rt_message_out_t o = {.version = c->version,
                          .qos = qos,
                          .retain = retain_flag,
                          .dup = dup,
                          .packet_id = qos ? packet_id : 0,
                          .sub_ids = sub_ids,
                          .n_sub_ids = n_sub_ids};
    if (expire_at_ms) {
        uint64_t now = rt_mono_ms();
        uint64_t left = expire_at_ms > now ? expire_at_ms - now : 0;
        o.expiry_left = (uint32_t)((left + 999) / 1000);
        o.has_expiry_left = true;
    } else if (m.has_expiry) {
        o.expiry_left = m.expiry;
        o.has_expiry_left = true;
    }
    bool fresh_alias = false;
    o.topic_alias = out_alias_pick(c, m.topic, &fresh_alias);
    o.alias_only = o.topic_alias && !fresh_alias;
    size_t len = rt_message_encode(&m, &o, NULL, 0);
    if (len == SIZE_MAX || (c->peer_max_packet && len > c->peer_max_packet)) {
        count_dropped(self, c, bin, qos, "too_large");
        return SENT_DISCARDED;
    }
    int rc = write_publish(c, &m, &o, len);
    if (rc)
        return rc;
    if (fresh_alias) /* unused if it fails: the topic goes in full next time */
        rt_alias_out_commit(c->aliases->out, o.topic_alias, m.topic.p, m.topic.len);
    rt__metric_add(RT_METRIC_MSGS_OUT, 1);
    if (tenant)
        rt_tenant_delivered(tenant);
    rt__conn_rule_event(self, c, RT_RULE_EV_MESSAGE_DELIVERED, NULL, qos, -1, NULL, bin);
    return 0;
}

uint32_t rt__conn_send_window(const conn_t *c)
{
    uint32_t max = (uint32_t)RT_LIVE(max_inflight);
    uint32_t w = c->recv_max < max ? c->recv_max : max;
    return w ? w : 1;
}

/*
** Whether the receive window is full. Beyond its count, the window holds at most half
** the client's memory budget (one message always fits): a client that stops
** acknowledging leaves room for its queue, whatever max_inflight allows.
*/
static bool send_window_full(const conn_t *c)
{
    const rt_qlist_t *f = &c->sess->inflight;
    RT_ASSERT(f->n <= RT_CONN_PACKET_IDS);
    return f->n >= rt__conn_send_window(c) ||
           (f->n && f->bytes >= (uint64_t)RT_LIVE(max_client_memory) / 2);
}

static void answer_store_ack(rt_pid_t pid, uint64_t token, int32_t status)
{
    if (!pid)
        return;
    rt_store_committed_t done = {.token = token, .status = status};
    rt_send(pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
}

rt_stored_msg_t rt__conn_stored_msg(const rt_qmsg_t *m)
{
    rt_stored_msg_t st = {.seq = m->seq,
                          .bin = rt_qmsg_bin(m),
                          .expire_at_ms = m->expire_at_ms,
                          .qos = m->qos,
                          .retain = m->retain,
                          .state = m->state,
                          .shared = m->shared,
                          .packet_id = m->packet_id,
                          .n_sub_ids = m->n_sub_ids};
    memcpy(st.sub_ids, m->sub_ids, m->n_sub_ids * sizeof(uint32_t));
    return st;
}

void rt__conn_store_msg(conn_t *c, rt_qmsg_t *m, rt_pid_t ack_pid, uint64_t token)
{
    RT_ASSERT(c->sess && m->bin && !m->seq && c->client_id);
    m->seq = ++c->sess->next_seq;
    rt_stored_msg_t st = rt__conn_stored_msg(m);
    rt_store_msg_add(c->client_id, &st, ack_pid, token);
}

/* Every session message ends here: its stored row (if any) goes with it. Takes m. */
static void session_release_msg(rt_actor_t *self, conn_t *c, rt_qmsg_t *m)
{
    RT_ASSERT(m && !m->next);
    if (m->seq && c->client_id)
        rt_store_msg_del(c->client_id, m->seq);
    rt_qmsg_free(self, m);
}

/*
** Ids are handed out in sequence and the inflight list keeps sending order, so
** its ids run from its head's up to the last one handed out: the next id can
** only be taken if it wrapped around to the head. Checking that instead of
** scanning the list keeps a send O(1) with a window of a thousand. Once an id
** wraps to the head (the oldest message outlived 65535 sends), the ids that
** follow it in the ring may be taken too: the list is scanned until it empties.
*/
static bool packet_id_taken(rt_session_t *s, uint16_t id)
{
    if (!s || !s->inflight.head)
        return false;
    if (!s->ids_unordered && id != s->inflight.head->packet_id) {
        RT_ASSERT(!rt_qlist_find_id(&s->inflight, id)); /* what the shortcut relies on */
        return false;
    }
    s->ids_unordered = 1;
    return rt_qlist_find_id(&s->inflight, id) != NULL;
}

static uint16_t session_next_packet_id(conn_t *c)
{
    /* A free id exists, so the search ends. */
    RT_ASSERT(!c->sess || c->sess->inflight.n < RT_CONN_PACKET_IDS);
    if (c->sess && !c->sess->inflight.head)
        c->sess->ids_unordered = 0;
    do {
        if (++c->next_packet_id == 0)
            c->next_packet_id = 1;
    } while (packet_id_taken(c->sess, c->next_packet_id));
    return c->next_packet_id;
}

/* Whether a message's expiry interval ran out (counted as expired if so). */
static bool message_expired(uint64_t expire_at_ms)
{
    if (!expire_at_ms || rt_mono_ms() < expire_at_ms)
        return false;
    atomic_fetch_add_explicit(&rt_broker->stats.msgs_expired, 1, memory_order_relaxed);
    return true;
}

/* Past the pressure mark: a check in RT_CONN_SLOW_MS says whether it is a slow consumer. */
void rt__conn_watch_backlog(rt_actor_t *self, conn_t *c)
{
    if (c->slow_check || c->shedding || rt_sock_pending(c->sock) <= RT_SOCK_HIGH_WATER)
        return;
    c->slow_check = 1;
    rt_send_after_tag(RT_CONN_SLOW_MS, rt_self(self), RT_CONN_MSG_SLOW_CHECK, NULL);
}

void rt__conn_on_slow_check(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(c->slow_check);
    c->slow_check = 0;
    if (!rt__conn_online(c) || c->shedding || rt_sock_pending(c->sock) <= RT_SOCK_HIGH_WATER)
        return;
    /* Publishers drop QoS 0 for it at the source from now on: a mailbox of messages that
       would only be dropped here is memory for nothing. */
    c->shedding = 1;
    rt_shed(self, true);
    rt_sock_set_high_water(c->sock, RT_CONN_SLOW_HIGH_WATER);
    rt_log(RT_LOG_WARNING, "client.slow", "client=%s unsent=%zu shedding QoS 0 until it reads",
           c->client_id ? c->client_id : "-", rt_sock_pending(c->sock));
}

/*
** Sends a queued message now. QoS 0 is done once written; QoS 1 and 2 take a
** packet id and wait in the inflight list for their acknowledgement. Takes m.
** Returns whether it was written.
*/
static bool delivery_transmit(rt_actor_t *self, conn_t *c, rt_qmsg_t *m)
{
    RT_ASSERT(rt__conn_online(c) && m->bin && m->state == RT_QMSG_QUEUED && !m->next);
    if (m->qos == 0) {
        int rc = send_publish(self, c, rt_qmsg_bin(m), 0, m->retain, 0, 0, m->expire_at_ms,
                              m->sub_ids, m->n_sub_ids);
        session_release_msg(self, c, m);
        return rc == 0;
    }
    m->packet_id = session_next_packet_id(c);
    m->state = RT_QMSG_WAIT_ACK;
    int rc = send_publish(self, c, rt_qmsg_bin(m), m->qos, m->retain, m->packet_id, 0,
                          m->expire_at_ms, m->sub_ids, m->n_sub_ids);
    if (rc == SENT_DISCARDED) {
        session_release_msg(self, c, m);
        return false;
    }
    /* QoS 2 must resume with the same packet id after a restart, or the client could take
       a resend for a new message; a QoS 1 resend under a new id is only a duplicate. */
    if (m->seq && m->qos == 2)
        rt_store_msg_state(c->client_id, m->seq, RT_QMSG_WAIT_ACK, m->packet_id);
    rt_qlist_push(&c->sess->inflight, m);
    rt__conn_watch_backlog(self, c);
    return rc == 0;
}

/*
** Moves queued messages out while the receive window has room (in order: QoS 0 waits too)
** and the client takes its output: past RT_CONN_OUTPUT_MARK the rest waits here, counted in
** its memory budget, until the socket drains (rt__conn_pump).
*/
static void queue_pump(rt_actor_t *self, conn_t *c)
{
    rt_session_t *s = c->sess;
    if (!s || !rt__conn_online(c))
        return;
    while (s->queued.head) {
        rt_qmsg_t *m = s->queued.head;
        if ((m->qos && send_window_full(c)) || rt__conn_output_backed_up(c))
            break;
        rt_qlist_pop(&s->queued);
        if (message_expired(m->expire_at_ms))
            session_release_msg(self, c, m);
        else
            delivery_transmit(self, c, m);
    }
}

/*
** Decides a delivery's fate: sent at once (QoS 0, online, nothing queued: *written),
** dropped, or returned as a session message to keep (NULL for the first two).
*/
static rt_qmsg_t *delivery_admit(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                                 const uint32_t *sub_ids, bool *written)
{
    bool backlog = c->sess && c->sess->queued.n;
    if (rt__conn_online(c) && !backlog && d->qos == 0) {
        if (c->shedding)
            count_dropped(self, c, bin, 0, "slow_consumer");
        else if (!budget_admit(self, c, rt_bin_len(bin)))
            count_dropped(self, c, bin, 0, "memory_budget");
        else
            *written = send_publish(self, c, bin, 0, d->retain, 0, 0, d->expire_at_ms, sub_ids,
                                    d->n_sub_ids) == 0;
        rt__conn_watch_backlog(self, c);
        return NULL;
    }
    if (!c->sock && d->qos == 0 && !RT_LIVE(queue_qos0)) {
        count_dropped(self, c, bin, 0, "offline_qos0");
        return NULL;
    }
    rt_session_t *s = rt__conn_session_get_or_make(self, c);
    rt_qmsg_t *m = s ? rt_qmsg_new(self, bin, d->qos, d->retain, d->expire_at_ms, d->shared,
                                   sub_ids, d->n_sub_ids)
                     : NULL;
    if (!m)
        count_dropped(self, c, bin, d->qos, "no_memory");
    else if (!s->queued.n && !s->inflight.n && rt_cluster_durable())
        s->clear_ms = rt_wall_ms(); /* owed nothing until this one */
    return m;
}

/*
** A message matched by a subscription the ACL granted in part (acl.h): whether this client
** may read its topic. A session whose user is not known yet (restored from the store, or
** between a resuming socket and its CONNECT) takes none while an ACL is in force.
*/
static bool acl_readable(conn_t *c, rt_bin_t *bin)
{
    if (!c->version)
        return !rt_acl_active();
    rt_message_t m;
    rt_message_view(bin, &m);
    return rt__conn_unmount(c, &m.topic) &&
           rt__conn_acl(c, m.topic.p, m.topic.len, RT_ACL_READ) != RT_ACL_DENY;
}

/*
** Whether m cannot join the session's queue: max_queued_messages (0: no count), or the
** budget's policy. m's own bytes are on the heap already, so it asks for none more.
*/
static const char *session_queue_refusal(rt_actor_t *self, conn_t *c)
{
    long max = RT_LIVE(max_queued_messages);
    if (max && c->sess->queued.n >= (uint64_t)max)
        return "queue_full";
    return budget_admit(self, c, 0) ? NULL : "memory_budget";
}

/*
** The common case (online, nothing queued, QoS 0) is written at once with no allocation;
** everything else becomes a session message: sent now if the window has room, else queued
** within the session's limits (a full queue drops the newest, counted). Offline QoS 0
** messages are queued only with queue_qos0. A persistent session stores what it keeps, and
** the publisher's acknowledgement waits for that.
** Returns whether the message was written to the client now.
*/
static bool deliver_copy(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                         const uint32_t *sub_ids)
{
    RT_ASSERT(d->qos <= 2 && d->n_sub_ids <= RT_DELIVERY_MAX_SUB_IDS);
    if (d->acl_check && !acl_readable(c, bin)) {
        answer_store_ack(d->ack_pid, d->ack_token, 0);
        return false;
    }
    bool written = false;
    rt_qmsg_t *m = message_expired(d->expire_at_ms)
                       ? NULL
                       : delivery_admit(self, c, bin, d, sub_ids, &written);
    bool now = m && rt__conn_online(c) && !c->sess->queued.n && !send_window_full(c);
    const char *refused = m && !now ? session_queue_refusal(self, c) : NULL;
    if (refused) {
        count_dropped(self, c, rt_qmsg_bin(m), m->qos, refused);
        rt_qmsg_free(self, m);
        m = NULL;
    }
    if (m && rt__conn_session_is_durable(c))
        rt__conn_store_msg(c, m, d->ack_pid, d->ack_token);
    else
        answer_store_ack(d->ack_pid, d->ack_token, 0); /* nothing stored: nothing to wait for */
    if (m && now)
        return delivery_transmit(self, c, m);
    if (m)
        rt_qlist_push(&c->sess->queued, m);
    return written;
}

void rt__conn_deliver(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                      const uint32_t *sub_ids)
{
    if (c->sess && c->sess->late && rt__conn_late_copy(self, c, bin)) {
        answer_store_ack(d->ack_pid, d->ack_token, 0); /* it has the message already */
        return;
    }
    if (deliver_copy(self, c, bin, d, sub_ids) && d->timed)
        rt_message_copy_written(bin);
}

void rt__conn_pump(rt_actor_t *self, conn_t *c)
{
    queue_pump(self, c);
}

/*
** No publisher can be held back for a retained message (the subscriber's own SUBSCRIBE asked
** for it), so at the budget it is dropped, or older queued ones make room (drop_oldest).
*/
void rt__conn_deliver_retained(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                               const uint32_t *sub_ids)
{
    RT_ASSERT(d->qos <= 2 && d->n_sub_ids <= RT_DELIVERY_MAX_SUB_IDS);
    if ((d->acl_check && !acl_readable(c, bin)) || message_expired(d->expire_at_ms))
        return;
    if (c->shedding && d->qos == 0) {
        count_dropped(self, c, bin, 0, "slow_consumer");
        return;
    }
    rt_session_t *s = rt__conn_session_get_or_make(self, c);
    rt_qmsg_t *m = s ? rt_qmsg_new(self, bin, d->qos, d->retain, d->expire_at_ms, d->shared,
                                   sub_ids, d->n_sub_ids)
                     : NULL;
    long max = RT_LIVE(max_queued_messages);
    const char *refused =
        !m                                    ? "no_memory"
        : max && s->queued.n >= (uint64_t)max ? "queue_full"
        : over_budget(c, 0) &&
                !(rt_broker->memory_policy == RT_MEMORY_DROP_OLDEST && drop_oldest_for(self, c, 0))
            ? "memory_budget"
            : NULL;
    if (refused) {
        count_dropped(self, c, bin, d->qos, refused);
        rt_qmsg_free(self, m);
        return;
    }
    if (!s->queued.n && !s->inflight.n && rt_cluster_durable())
        s->clear_ms = rt_wall_ms();
    if (rt__conn_session_is_durable(c))
        rt__conn_store_msg(c, m, 0, 0);
    rt_qlist_push(&s->queued, m);
    queue_pump(self, c);
}

/*
** A delivery the actor never took (it exited with the message in its mailbox: a session
** taken over, expired, moved to another node, or ended by its client) still answers a
** publisher that waits for its copy to be stored. The session ended with the actor, in the
** store too, so no session lacks the copy: that is a success (a session that moved away has
** its own copy from NATS on its new node). Only a session the store keeps for rtd's next
** run (the actor ended with the stop: stored still set) would come back without it: not
** confirmed.
*/
void rt__conn_dead_letter(void *state, rt_msg_t *m)
{
    const conn_t *c = state;
    if (m->tag == RT_CLUSTER_MSG_MOVE_IN && m->len >= offsetof(rt_cluster_move_in_t, bytes)) {
        /* A session that moved here ended before it merged the rest: the CONNECT that waits
           for it still holds the id, and goes on without it. */
        const rt_cluster_move_in_t *in = (const rt_cluster_move_in_t *)(const void *)m->data;
        rt_cluster_move_ended(in->claimer, in->lease, c->client_id ? c->client_id : "-");
        return;
    }
    if (m->tag != RT_MSG_DELIVER || m->len < sizeof(rt_delivery_t))
        return;
    const rt_delivery_t *d = (const rt_delivery_t *)(const void *)m->data;
    answer_store_ack(d->ack_pid, d->ack_token, c->stored ? RT_ENOPROC : 0);
}

void rt__conn_retransmit(rt_actor_t *self, conn_t *c)
{
    if (!c->sess)
        return;
    for (rt_qmsg_t *m = c->sess->inflight.head; m; m = m->next) {
        if (m->state == RT_QMSG_WAIT_COMP) {
            RT_ASSERT(!m->bin); /* the client has the message: only its id is left */
            mqtt_packet_t rel = {.type = MQTT_PUBREL, .packet_id = m->packet_id};
            rt__conn_send_packet(c, &rel);
        } else {
            RT_ASSERT(m->state == RT_QMSG_WAIT_ACK && m->bin);
            send_publish(self, c, rt_qmsg_bin(m), m->qos, m->retain, m->packet_id, 1,
                         m->expire_at_ms, m->sub_ids, m->n_sub_ids);
        }
    }
    queue_pump(self, c);
}

/* Takes the inflight message m (found by its id) out of the session and ends it. */
static void inflight_settle(rt_actor_t *self, conn_t *c, rt_qmsg_t *m)
{
    rt_qmsg_t *taken = rt_qlist_take_id(&c->sess->inflight, m->packet_id);
    RT_ASSERT(taken == m); /* ids are unique in the inflight list */
    session_release_msg(self, c, taken);
    queue_pump(self, c);
    if (!c->sess->inflight.n && !c->sess->queued.n && rt_cluster_durable()) {
        c->sess->clear_ms = rt_wall_ms();
        rt__conn_record_session(self, c, false);
    }
}

static void on_puback(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    if (!m || m->state != RT_QMSG_WAIT_ACK || m->qos != 1)
        return; /* unknown ids are ignored: a late ack of a message already settled */
    rt__conn_rule_event(self, c, RT_RULE_EV_MESSAGE_ACKED, NULL, 1, -1, NULL, rt_qmsg_bin(m));
    inflight_settle(self, c, m);
}

static void on_pubrec(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    bool known = m && m->qos == 2;
    if (known && pk->version == MQTT_V5 && pk->reason >= 0x80) {
        /* The client refused it: the exchange ends here, with no PUBREL (4.3.3). */
        inflight_settle(self, c, m);
        return;
    }
    if (known && m->state == RT_QMSG_WAIT_ACK) {
        /* Delivered: only the packet id is needed from here on. */
        RT_ASSERT(m->bin);
        rt__conn_rule_event(self, c, RT_RULE_EV_MESSAGE_ACKED, NULL, 2, -1, NULL, rt_qmsg_bin(m));
        rt_qlist_drop_payload(self, &c->sess->inflight, m);
        m->state = RT_QMSG_WAIT_COMP;
        if (m->seq)
            rt_store_msg_state(c->client_id, m->seq, RT_QMSG_WAIT_COMP, m->packet_id);
    }
    mqtt_packet_t rel = {.type = MQTT_PUBREL, .packet_id = pk->packet_id};
    if (!known && c->version == MQTT_V5)
        rel.reason = MQTT_RC_PACKET_ID_NOT_FOUND;
    rt__conn_send_packet(c, &rel);
}

static void on_pubcomp(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    if (!m || m->state != RT_QMSG_WAIT_COMP)
        return;
    inflight_settle(self, c, m);
}

void rt__conn_on_delivery_ack(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    switch (pk->type) {
    case MQTT_PUBACK:
        on_puback(self, c, pk);
        break;
    case MQTT_PUBREC:
        on_pubrec(self, c, pk);
        break;
    default:
        RT_ASSERT(pk->type == MQTT_PUBCOMP);
        on_pubcomp(self, c, pk);
        break;
    }
}

/*
** A message that came through a shared subscription and that this member will
** not acknowledge (it is leaving) goes to another member of its group
** (MQTT 5 4.8.2 lets the server do so). The group is the member's shared
** subscription whose filter matches the topic. Returns whether it moved.
*/
static bool shared_hand_to_group(rt_actor_t *self, conn_t *c, rt_qmsg_t *m)
{
    if (!m->bin)
        return false;
    rt_message_t msg;
    rt_message_view(rt_qmsg_bin(m), &msg);
    for (size_t i = 0; i < c->nsubs; i++) {
        sub_entry_t *s = &c->subs[i];
        if (!rt_topic_is_shared(s->filter, s->len) ||
            !rt_topic_matches(s->filter, s->len, (const char *)msg.topic.p, msg.topic.len))
            continue;
        rt_pid_t pid;
        rt_trie_opts_t o;
        if (rt_trie_share_pick(rt_broker->trie, s->filter, s->len, rt_self(self),
                               rt_route_member_alive, NULL, &pid, &o) != 0)
            continue;
        rt_delivery_t d = {.expire_at_ms = m->expire_at_ms,
                           .qos = m->qos < o.qos ? m->qos : o.qos,
                           .retain = o.retain_as_published ? m->retain : 0,
                           .shared = 1,
                           .acl_check = o.acl_check,
                           .n_sub_ids = o.sub_id ? 1 : 0};
        rt_route_send(pid, rt_qmsg_bin(m), &d, &o.sub_id);
        return true;
    }
    return false;
}

/* Moves every shared-subscription message not yet acknowledged out of list l. */
static void shared_hand_over_list(rt_actor_t *self, conn_t *c, rt_qlist_t *l)
{
    rt_qlist_t keep = {0};
    rt_qmsg_t *m;
    while ((m = rt_qlist_pop(l)) != NULL) {
        /* After PUBREC the client has the message: it is not handed on. */
        if (m->shared && m->state != RT_QMSG_WAIT_COMP && shared_hand_to_group(self, c, m))
            session_release_msg(self, c, m);
        else
            rt_qlist_push(&keep, m);
    }
    *l = keep;
}

void rt__conn_hand_over_shared(rt_actor_t *self, conn_t *c)
{
    if (!c->sess)
        return;
    shared_hand_over_list(self, c, &c->sess->inflight);
    shared_hand_over_list(self, c, &c->sess->queued);
}

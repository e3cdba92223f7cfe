/*
** A persistent session moving between cluster nodes (cluster.h, "Sessions that move";
** docs/CLUSTER.md): the session as bytes on the node that gives it, an offline session
** actor made from them on the node that takes it, and the merge of what the old node
** queued meanwhile. The bytes themselves are session_bytes.c's.
*/
#include <stdlib.h>
#include <string.h>

#include "conn_impl.h"
#include "log.h"
#include "replay.h"
#include "session_bytes.h"
#include "store.h"

#define MOVE_TIMEOUT_MS 10000 /* phase 1 to phase 2, at most (two NATS round trips) */

/* ---- The session as bytes ---- */

static void put_msgs(rt_moved_writer_t *w, const rt_qlist_t *const *lists, int nlists)
{
    uint32_t n = 0;
    for (int l = 0; l < nlists; l++)
        n += lists[l]->n;
    rt_moved_put_count(w, n);
    uint64_t now = rt_mono_ms();
    for (int l = 0; l < nlists; l++) {
        for (const rt_qmsg_t *m = lists[l]->head; m; m = m->next) {
            rt_stored_msg_t sm = rt__conn_stored_msg(m);
            uint64_t key = 0, seq = 0;
            if (sm.bin)
                rt_message_origin(sm.bin, &key, &seq);
            rt_moved_put_msg(w, &sm, key, seq, now);
        }
    }
}

/* The whole session (phase 1; a record: without its messages), or only its queue (phase
   2's rest). */
static void put_session(rt_moved_writer_t *w, conn_t *c, bool whole, bool msgs)
{
    uint64_t now = rt_mono_ms();
    uint32_t expiry = c->session_expiry;
    if (!c->sock && c->expire_at_ms)
        expiry = (uint32_t)((c->expire_at_ms > now ? c->expire_at_ms - now : 0) / 1000);
    /* Offline, a will still here waits for its delay. */
    rt_bin_t *will = whole && c->will && !c->sock ? rt_heap_bin(c->will) : NULL;
    rt_moved_put_head(w, whole ? expiry : 0, will,
                      will && c->will_at_ms > now ? c->will_at_ms - now : 0);
    rt_moved_put_count(w, whole ? c->nsubs : 0);
    for (uint32_t i = 0; whole && i < c->nsubs; i++) {
        rt_trie_opts_t o = rt__conn_sub_opts(&c->subs[i]);
        rt_moved_put_sub(w, c->subs[i].filter, c->subs[i].len, &o);
    }
    uint32_t nqos2 = whole && c->sess ? c->sess->nqos2 : 0;
    rt_moved_put_count(w, nqos2);
    for (uint32_t i = 0; i < nqos2; i++)
        rt_moved_put_qos2_id(w, c->sess->qos2_ids[i]);
    rt_qlist_t none = {0};
    const rt_qlist_t *lists[2] = {c->sess && msgs ? &c->sess->inflight : &none,
                                  c->sess && msgs ? &c->sess->queued : &none};
    put_msgs(w, whole ? lists : lists + 1, whole ? 2 : 1);
}

/* ---- A session's record, for a resume after its node's crash (durable mode) ---- */

#define RECORD_EVERY_MS 5000 /* a busy session rewrites its clear moment at most this often */

void rt__conn_record_session(rt_actor_t *self, conn_t *c, bool changed)
{
    if (!rt_cluster_durable() || !c->client_id || !c->session_expiry)
        return;
    uint64_t now = rt_wall_ms();
    rt_session_t *s = c->sess;
    if (!changed && s && now - s->record_ms < RECORD_EVERY_MS)
        return;
    bool owes = s && (s->queued.n || s->inflight.n);
    rt_moved_writer_t w = {0};
    put_session(&w, c, true, false);
    if (!w.failed) {
        rt_cluster_session_record(c->client_id, owes ? s->clear_ms : now, w.p, w.len);
        if (s)
            s->record_ms = now;
    }
    rt_moved_writer_free(&w);
}

/* ---- The node giving the session ---- */

static void drop_messages(rt_actor_t *self, rt_qlist_t *l)
{
    for (rt_qmsg_t *m; (m = rt_qlist_pop(l));)
        rt_qmsg_free(self, m);
}

void rt__conn_on_move_out(rt_actor_t *self, conn_t *c, const rt_cluster_move_t *req)
{
    bool moving = c->sess && c->sess->moving == RT_SESSION_MOVED_OUT;
    rt_moved_writer_t w = {0};
    if (req->phase == 2) {
        /* The rest: what came since phase 1. Then the session is the other node's alone. */
        if (moving)
            put_session(&w, c, false, true);
        rt_cluster_move_answer(req, w.failed ? NULL : w.p, w.failed ? 0 : w.len);
        rt_moved_writer_free(&w);
        if (moving)
            rt_exit(self, RT_REASON_TAKEOVER);
        return;
    }
    /* Nothing outlives the connection (or a connection is still being set up): as a node
       alone, a takeover ends it. */
    if (!c->client_id || !c->session_expiry || moving || (c->sock && !rt__conn_online(c))) {
        rt_cluster_move_answer(req, NULL, 0);
        rt_exit(self, RT_REASON_TAKEOVER);
        return;
    }
    if (c->sock)
        rt__conn_close(self, c, MQTT_RC_SESSION_TAKEN_OVER, RT_REASON_NORMAL);
    rt_session_t *s = rt__conn_session_get_or_make(self, c);
    if (s)
        put_session(&w, c, true, true);
    if (!s || w.failed) {
        rt_moved_writer_free(&w);
        rt_log(RT_LOG_ERROR, "cluster.session_move_failed",
               "client=%s out of memory writing the session; it ends here", c->client_id);
        rt_cluster_move_answer(req, NULL, 0);
        rt_exit(self, RT_REASON_TAKEOVER);
        return;
    }
    /* The session is the other node's now; this actor only collects what still comes
       until phase 2 (its subscriptions stay). Its will went with it. */
    drop_messages(self, &s->inflight);
    drop_messages(self, &s->queued);
    s->nqos2 = 0;
    rt__conn_drop_will(self, c);
    s->moving = RT_SESSION_MOVED_OUT;
    rt_send_after_tag(MOVE_TIMEOUT_MS, rt_self(self), RT_CONN_MSG_MOVE_TIMEOUT, NULL);
    rt_log(RT_LOG_INFO, "cluster.session_moved_out", "client=%s bytes=%zu", c->client_id, w.len);
    rt_cluster_move_answer(req, w.p, w.len);
    rt_moved_writer_free(&w);
}

/* ---- A session kept here while the cluster went on without this node ---- */

void rt__conn_verify_kept(rt_actor_t *self, conn_t *c)
{
    if (!c->sock && c->client_id && c->session_expiry && !(c->sess && c->sess->moving))
        rt_cluster_verify(rt_self(self), c->client_id, strlen(c->client_id));
}

void rt__conn_on_verified(rt_actor_t *self, conn_t *c, const rt_cluster_claimed_t *r)
{
    if (r->status != RT_EEXIST || !c->client_id)
        return; /* this node's still; or not known now: the next resume claims it anyway */
    rt_log(RT_LOG_WARNING, "cluster.session_stale",
           "client=%s another node claimed the id since this session was kept here; it ends "
           "(its will and messages are that node's session's now)",
           c->client_id);
    c->discard_will = 1;
    rt__conn_drop_will(self, c);
    rt_exit(self, RT_REASON_TAKEOVER);
}

/* ---- The node taking it ---- */

rt_pid_t rt__conn_import_session(const char *id, const void *bytes, size_t len)
{
    rt_moved_t mv;
    rt_pid_t pid = 0;
    bool read = rt_moved_read_session(id, bytes, len, rt_mono_ms(), &mv) == 0;
    /* Named as on the old node, so that a copy that also reaches this node is kept once. */
    for (size_t i = 0; read && i < mv.ss.nmsgs; i++)
        if (mv.seqs[i])
            rt_message_set_origin(mv.ss.msgs[i].bin, mv.keys[i], mv.seqs[i]);
    if (!read || rt_spawn(&rt__conn_imported_type, &mv, &pid) != 0) {
        rt_log(RT_LOG_ERROR, "cluster.session_unreadable", "client=%s bytes=%zu", id, len);
        pid = 0;
    }
    rt_moved_free(&mv);
    return pid;
}

int rt__conn_imported_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    const rt_moved_t *mv = arg;
    /* First in its mailbox, before any delivery its subscriptions bring. */
    int rc = rt_send(rt_self(self), RT_CONN_MSG_IMPORTED, NULL, 0);
    bool durable = mv->ss.expiry_left_s && rt_store_enabled();
    if (rc == 0)
        rc = rt__conn_session_from_stored(self, c, &mv->ss, durable);
    if (rc == 0 && !rt__conn_session_get_or_make(self, c))
        rc = RT_ENOMEM;
    if (rc)
        return rc;
    c->sess->moving = RT_SESSION_MOVED_IN;
    c->sess->moved_in = c->sess->queued.n;
    if (mv->will && (c->will = rt_hold_bin(self, rt_bin_retain(mv->will)))) {
        c->will_delay = mv->will_left_ms / 1000;
        c->will_at_ms = rt_mono_ms() + mv->will_left_ms;
        rt_send_after_tag(mv->will_left_ms, rt_self(self), RT_CONN_MSG_WILL_DUE, NULL);
    }
    return 0;
}

void rt__conn_on_imported(rt_actor_t *self, conn_t *c)
{
    rt__conn_record_session(self, c, true);
    if (!rt__conn_session_is_durable(c))
        return;
    rt_store_session(c->client_id, c->session_expiry, false, true);
    rt__conn_session_persist_all(c);
    for (uint32_t i = 0; c->sess && i < c->sess->nqos2; i++)
        rt_store_qos2_in(c->client_id, c->sess->qos2_ids[i], true, 0, 0);
}

typedef rt_origin_name_t origin_t;

static int origin_cmp(const void *a, const void *b)
{
    const origin_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
** The names of the messages the session has from its old node, sorted: the rest's, and those
** that came with phase 1 (inflight, and the first moved_in queued). A message NATS delivered
** there and here both (another server may hand it to this node after the subscription came,
** though the old node had it first) is kept once. NULL: none named, or no memory.
*/
static origin_t *known_origins(const rt_moved_t *rest, const rt_session_t *s, size_t *n)
{
    size_t cap = rest->ss.nmsgs + s->inflight.n + s->moved_in;
    origin_t *o = cap ? malloc(cap * sizeof(*o)) : NULL;
    *n = 0;
    for (size_t i = 0; o && i < rest->ss.nmsgs; i++)
        if (rest->seqs[i])
            o[(*n)++] = (origin_t){rest->keys[i], rest->seqs[i]};
    const rt_qmsg_t *lists[2] = {s->inflight.head, s->queued.head};
    uint32_t counts[2] = {s->inflight.n, s->moved_in};
    for (int l = 0; o && l < 2; l++) {
        uint32_t k = 0;
        for (const rt_qmsg_t *m = lists[l]; m && k < counts[l]; m = m->next, k++)
            if (m->bin && rt_message_origin(m->bin, &o[*n].key, &o[*n].seq))
                (*n)++;
    }
    if (o)
        qsort(o, *n, sizeof(*o), origin_cmp);
    return o;
}

/* Queues m last; a durable session writes it again so the store keeps the queue's order. */
static void requeue(conn_t *c, rt_qmsg_t *m)
{
    if (m->seq && c->stored) {
        rt_store_msg_del(c->client_id, m->seq);
        m->seq = 0;
    }
    rt_qlist_push(&c->sess->queued, m);
    if (c->stored && m->bin)
        rt__conn_store_msg(c, m, 0, 0);
}

void rt__conn_on_move_in(rt_actor_t *self, conn_t *c, const uint8_t *bytes, size_t len)
{
    rt_session_t *s = c->sess;
    if (!s || s->moving != RT_SESSION_MOVED_IN)
        return;
    s->moving = 0;
    /* Bytes refused merge nothing, but what the reader made of them before it stopped is
       freed all the same. */
    rt_moved_t rest = {0};
    if (len >= RT_REPLAY_HEAD && memcmp(bytes, RT_REPLAY_MAGIC, RT_REPLAY_HEAD) == 0) {
        if (rt_moved_read_replay(bytes, len, c->subs, c->nsubs, RT_LIVE(queue_qos0), rt_mono_ms(),
                                 &rest) != 0) {
            rt_log(RT_LOG_ERROR, "cluster.replay_unreadable", "client=%s bytes=%zu", c->client_id,
                   len);
            rt_moved_free(&rest);
        }
    } else if (len && rt_moved_read_session(c->client_id, bytes, len, rt_mono_ms(), &rest) != 0) {
        rt_log(RT_LOG_ERROR, "cluster.session_tail_unreadable", "client=%s bytes=%zu", c->client_id,
               len);
        rt_moved_free(&rest);
    }
    size_t from_rest = 0, duplicates = 0, nnamed;
    origin_t *named = known_origins(&rest, s, &nnamed);
    /* In order: what came with the session, what its old node queued since, then what
       came here directly that the old node did not have too. */
    rt_qlist_t direct = s->queued;
    s->queued = (rt_qlist_t){0};
    for (uint32_t i = 0; i < s->moved_in; i++) {
        rt_qmsg_t *m = rt_qlist_pop(&direct);
        if (!m)
            break;
        rt_qlist_push(&s->queued, m);
    }
    for (size_t i = 0; i < rest.ss.nmsgs; i++) {
        const rt_stored_msg_t *sm = &rest.ss.msgs[i];
        rt_qmsg_t *m = rt_qmsg_new(self, sm->bin, sm->qos, sm->retain, sm->expire_at_ms, sm->shared,
                                   sm->sub_ids, sm->n_sub_ids);
        if (!m)
            break;
        requeue(c, m);
        from_rest++;
    }
    for (rt_qmsg_t *m; (m = rt_qlist_pop(&direct));) {
        origin_t o;
        if (nnamed && m->bin && rt_message_origin(m->bin, &o.key, &o.seq) &&
            bsearch(&o, named, nnamed, sizeof(o), origin_cmp)) {
            if (m->seq && c->stored)
                rt_store_msg_del(c->client_id, m->seq);
            rt_qmsg_free(self, m);
            duplicates++;
            continue;
        }
        requeue(c, m);
    }
    /* Kept for the copies still on their way. */
    if (nnamed && (s->late = rt_alloc(self, sizeof(rt_late_names_t) + nnamed * sizeof(origin_t),
                                      RT_OBJ_LEAF))) {
        s->late->n = (uint32_t)nnamed;
        memcpy(s->late->names, named, nnamed * sizeof(origin_t));
    }
    free(named);
    s->moved_in = 0;
    rt_log(RT_LOG_INFO, "cluster.session_moved_in",
           "client=%s queued=%u inflight=%u from_old_node_after=%zu both_had=%zu", c->client_id,
           s->queued.n, s->inflight.n, from_rest, duplicates);
    rt_moved_free(&rest);
}

/* The first name not below o. */
static uint32_t lower_bound(const rt_late_names_t *l, const origin_t *o)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (origin_cmp(&l->names[mid], o) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool rt__conn_late_copy(rt_actor_t *self, conn_t *c, rt_bin_t *bin)
{
    rt_late_names_t *l = c->sess->late;
    origin_t o;
    if (!rt_message_origin(bin, &o.key, &o.seq))
        return false;
    uint32_t at = lower_bound(l, &o);
    if (at < l->n && origin_cmp(&l->names[at], &o) == 0)
        return true;
    origin_t first_of_node = {o.key, 0}, past_node = {o.key, UINT64_MAX};
    uint32_t first = lower_bound(l, &first_of_node), last = lower_bound(l, &past_node);
    if (first == last || at < last)
        return false;
    /* Past its node's last name: no copy of those can come any more. */
    memmove(&l->names[first], &l->names[last], (l->n - last) * sizeof(origin_t));
    l->n -= last - first;
    if (!l->n) {
        rt_free(self, l);
        c->sess->late = NULL;
    }
    return false;
}

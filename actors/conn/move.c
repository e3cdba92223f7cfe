/*
** A persistent session moving between cluster nodes (cluster.h, "Sessions that move";
** docs/CLUSTER.md): the session as bytes on the node that gives it, an offline session
** actor made from them on the node that takes it, and the merge of what the old node
** queued meanwhile.
**
** The bytes (all integers big-endian):
**   "RTS1", expiry left (s, u32), will delay left + 1 (ms, u32; 0: no will) and the
**   will's PUBLISH (u32 length, bytes), subscriptions (u32 count; each: u16 length,
**   filter, u32 subscription id, u8 QoS, u8 flags), inbound QoS 2 ids (u32 count, u16
**   each), messages (u32 count; each: u8 state, QoS, retain, shared; u16 packet id; u32
**   expiry left + 1 (ms; 0: none); u8 count and u32 subscription ids; u64 origin key,
**   u64 origin number (rt_message_origin; 0: none); u32 length and the PUBLISH, none
**   for a QoS 2 message past PUBREC).
** Phase 2's rest is the same with only messages. Another rtd wrote them, but they came over
** the network: every count and length is checked against what is there.
*/
#include <stdlib.h>
#include <string.h>

#include "conn_impl.h"
#include "log.h"
#include "store.h"

#define MOVE_MAGIC "RTS1"
#define REPLAY_MAGIC "RTR1"
#define MOVE_TIMEOUT_MS 10000 /* phase 1 to phase 2, at most (two NATS round trips) */

enum {
    SUB_NO_LOCAL = 1,
    SUB_RETAIN_AS_PUBLISHED = 2,
    SUB_ACL_CHECK = 4,
    SUB_RETAIN_HANDLING_SHIFT = 3,
};

/* ---- Writing ---- */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} wbuf_t;

static void put(wbuf_t *w, const void *d, size_t n)
{
    if (w->failed || !n)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = cap <= RT_CLUSTER_MOVE_MAX ? realloc(w->p, cap) : NULL;
        if (!p) {
            w->failed = true;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, d, n);
    w->len += n;
}

static void put_uint(wbuf_t *w, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(w, b, (size_t)bytes);
}

/* What remains of a monotonic deadline, + 1 so that 0 can mean "none". */
static uint32_t left_plus_one(uint64_t at_ms, uint64_t now)
{
    if (!at_ms)
        return 0;
    uint64_t left = at_ms > now ? at_ms - now : 0;
    return left >= UINT32_MAX - 1 ? UINT32_MAX : (uint32_t)left + 1;
}

static void put_msgs(wbuf_t *w, const rt_qlist_t *const *lists, int nlists)
{
    uint32_t n = 0;
    for (int l = 0; l < nlists; l++)
        n += lists[l]->n;
    put_uint(w, n, 4);
    uint64_t now = rt_mono_ms();
    for (int l = 0; l < nlists; l++) {
        for (const rt_qmsg_t *m = lists[l]->head; m; m = m->next) {
            uint8_t head[4] = {m->state, m->qos, m->retain, m->shared};
            put(w, head, 4);
            put_uint(w, m->packet_id, 2);
            put_uint(w, left_plus_one(m->expire_at_ms, now), 4);
            put_uint(w, m->n_sub_ids, 1);
            for (uint8_t i = 0; i < m->n_sub_ids; i++)
                put_uint(w, m->sub_ids[i], 4);
            rt_bin_t *bin = rt_qmsg_bin(m);
            uint64_t key = 0, seq = 0;
            if (bin)
                rt_message_origin(bin, &key, &seq);
            put_uint(w, key, 8);
            put_uint(w, seq, 8);
            size_t len = bin ? rt_bin_len(bin) : 0;
            put_uint(w, len, 4);
            put(w, bin ? rt_bin_data(bin) : NULL, len);
        }
    }
}

/* The whole session (phase 1; a record: without its messages), or only its queue (phase
   2's rest). */
static void put_session(wbuf_t *w, rt_actor_t *self, conn_t *c, bool whole, bool msgs)
{
    (void)self;
    put(w, MOVE_MAGIC, 4);
    uint64_t now = rt_mono_ms();
    uint32_t expiry = c->session_expiry;
    if (!c->sock && c->expire_at_ms)
        expiry = (uint32_t)((c->expire_at_ms > now ? c->expire_at_ms - now : 0) / 1000);
    put_uint(w, whole ? expiry : 0, 4);
    /* Offline, a will still here waits for its delay. */
    rt_bin_t *will = whole && c->will && !c->sock ? rt_heap_bin(c->will) : NULL;
    put_uint(w, will ? left_plus_one(c->will_at_ms, now) : 0, 4);
    if (will) {
        put_uint(w, rt_bin_len(will), 4);
        put(w, rt_bin_data(will), rt_bin_len(will));
    }
    put_uint(w, whole ? c->nsubs : 0, 4);
    for (uint32_t i = 0; whole && i < c->nsubs; i++) {
        const sub_entry_t *e = &c->subs[i];
        put_uint(w, e->len, 2);
        put(w, e->filter, e->len);
        put_uint(w, e->sub_id, 4);
        uint8_t flags = (uint8_t)((e->no_local ? SUB_NO_LOCAL : 0) |
                                  (e->retain_as_published ? SUB_RETAIN_AS_PUBLISHED : 0) |
                                  (e->acl_check ? SUB_ACL_CHECK : 0) |
                                  e->retain_handling << SUB_RETAIN_HANDLING_SHIFT);
        uint8_t qf[2] = {e->qos, flags};
        put(w, qf, 2);
    }
    uint32_t nqos2 = whole && c->sess ? c->sess->nqos2 : 0;
    put_uint(w, nqos2, 4);
    for (uint32_t i = 0; i < nqos2; i++)
        put_uint(w, c->sess->qos2_ids[i], 2);
    rt_qlist_t none = {0};
    const rt_qlist_t *lists[2] = {c->sess && msgs ? &c->sess->inflight : &none,
                                  c->sess && msgs ? &c->sess->queued : &none};
    put_msgs(w, whole ? lists : lists + 1, whole ? 2 : 1);
}

/* ---- Reading ---- */

typedef struct {
    const uint8_t *p;
    size_t len, at;
    bool bad;
} rbuf_t;

static const uint8_t *take(rbuf_t *r, size_t n)
{
    if (r->bad || n > r->len - r->at) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->at;
    r->at += n;
    return p;
}

static uint64_t get_uint(rbuf_t *r, int bytes)
{
    const uint8_t *p = take(r, (size_t)bytes);
    uint64_t v = 0;
    for (int i = 0; p && i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* What the bytes said: a stored session's shape, the will, and each message's origin. */
typedef struct {
    rt_stored_session_t ss;
    rt_bin_t *will;
    uint32_t will_left_ms;
    uint64_t *keys, *seqs; /* per message */
} moved_t;

static void moved_free(moved_t *mv)
{
    for (size_t i = 0; i < mv->ss.nsubs; i++)
        free(mv->ss.subs[i].filter);
    for (size_t i = 0; i < mv->ss.nmsgs; i++)
        rt_bin_release(mv->ss.msgs[i].bin);
    free(mv->ss.subs);
    free(mv->ss.msgs);
    free(mv->ss.qos2_in);
    free(mv->keys);
    free(mv->seqs);
    if (mv->will)
        rt_bin_release(mv->will);
    memset(mv, 0, sizeof(*mv));
}

/* A QoS 2 message past PUBREC carries no PUBLISH; the session record needs one, dropped at
   once (start.c), so a one-byte topic stands in. */
static rt_bin_t *released_placeholder(void)
{
    static const uint8_t publish[] = {0x34, 0x06, 0x00, 0x01, 'x', 0x00, 0x01, 0x00};
    return rt_message_parse(publish, sizeof(publish));
}

static bool read_msgs(rbuf_t *r, moved_t *mv)
{
    uint32_t n = (uint32_t)get_uint(r, 4);
    if (r->bad || n > (r->len - r->at) / 31) /* a message takes 31 bytes at least */
        return false;
    mv->ss.msgs = calloc(n ? n : 1, sizeof(*mv->ss.msgs));
    mv->keys = calloc(n ? n : 1, sizeof(uint64_t));
    mv->seqs = calloc(n ? n : 1, sizeof(uint64_t));
    if (!mv->ss.msgs || !mv->keys || !mv->seqs)
        return false;
    uint64_t now = rt_mono_ms();
    for (uint32_t i = 0; i < n; i++) {
        rt_stored_msg_t *m = &mv->ss.msgs[i];
        const uint8_t *head = take(r, 4);
        if (!head)
            return false;
        m->state = head[0];
        m->qos = head[1];
        m->retain = head[2];
        m->shared = head[3];
        m->packet_id = (uint16_t)get_uint(r, 2);
        uint32_t left = (uint32_t)get_uint(r, 4);
        m->expire_at_ms = left ? now + left - 1 + (left == 1) : 0;
        m->n_sub_ids = (uint32_t)get_uint(r, 1);
        if (m->n_sub_ids > RT_QMSG_MAX_SUB_IDS || m->state > RT_QMSG_WAIT_COMP || m->qos > 2)
            return false;
        for (uint32_t k = 0; k < m->n_sub_ids; k++)
            m->sub_ids[k] = (uint32_t)get_uint(r, 4);
        mv->keys[i] = get_uint(r, 8);
        mv->seqs[i] = get_uint(r, 8);
        uint32_t len = (uint32_t)get_uint(r, 4);
        const uint8_t *pkt = take(r, len);
        if (r->bad)
            return false;
        m->bin = len                             ? rt_message_parse(pkt, len)
                 : m->state == RT_QMSG_WAIT_COMP ? released_placeholder()
                                                 : NULL;
        if (!m->bin)
            return false;
        mv->ss.nmsgs = i + 1;
    }
    return true;
}

/* Reads the bytes into *mv (for id); false if they are not a session's. */
static bool read_session(const char *id, const void *bytes, size_t len, moved_t *mv)
{
    memset(mv, 0, sizeof(*mv));
    rbuf_t r = {.p = bytes, .len = len};
    const uint8_t *magic = take(&r, 4);
    if (!magic || memcmp(magic, MOVE_MAGIC, 4) != 0)
        return false;
    mv->ss.client_id = id;
    mv->ss.expiry_left_s = (uint32_t)get_uint(&r, 4);
    uint32_t will_left = (uint32_t)get_uint(&r, 4);
    if (will_left) {
        uint32_t wlen = (uint32_t)get_uint(&r, 4);
        const uint8_t *w = take(&r, wlen);
        if (!w || !(mv->will = rt_message_parse(w, wlen)))
            return false;
        mv->will_left_ms = will_left - 1;
    }
    uint32_t nsubs = (uint32_t)get_uint(&r, 4);
    if (r.bad || nsubs > (r.len - r.at) / 8)
        return false;
    mv->ss.subs = calloc(nsubs ? nsubs : 1, sizeof(*mv->ss.subs));
    if (!mv->ss.subs)
        return false;
    for (uint32_t i = 0; i < nsubs; i++) {
        uint32_t flen = (uint32_t)get_uint(&r, 2);
        const uint8_t *f = take(&r, flen);
        uint32_t sub_id = (uint32_t)get_uint(&r, 4);
        const uint8_t *qf = take(&r, 2);
        if (!qf || !flen || flen > RT_TRIE_MAX_LEN || !mqtt_topic_filter_valid(f, flen) ||
            qf[0] > 2)
            return false;
        rt_stored_sub_t *sub = &mv->ss.subs[i];
        if (!(sub->filter = malloc(flen + 1)))
            return false;
        memcpy(sub->filter, f, flen);
        sub->filter[flen] = 0;
        sub->len = flen;
        sub->opts = (rt_trie_opts_t){.sub_id = sub_id,
                                     .qos = qf[0],
                                     .no_local = !!(qf[1] & SUB_NO_LOCAL),
                                     .retain_as_published = !!(qf[1] & SUB_RETAIN_AS_PUBLISHED),
                                     .retain_handling = (qf[1] >> SUB_RETAIN_HANDLING_SHIFT) & 3,
                                     .acl_check = !!(qf[1] & SUB_ACL_CHECK)};
        mv->ss.nsubs = i + 1;
    }
    uint32_t nqos2 = (uint32_t)get_uint(&r, 4);
    if (r.bad || nqos2 > (r.len - r.at) / 2 || nqos2 > RT_CONN_QOS2_PENDING_MAX)
        return false;
    mv->ss.qos2_in = calloc(nqos2 ? nqos2 : 1, sizeof(uint16_t));
    if (!mv->ss.qos2_in)
        return false;
    for (uint32_t i = 0; i < nqos2; i++)
        mv->ss.qos2_in[i] = (uint16_t)get_uint(&r, 2);
    mv->ss.nqos2_in = nqos2;
    return read_msgs(&r, mv) && r.at == r.len;
}

/*
** A replay after the session's old node crashed (cluster.h, durable mode): "RTR1", then per
** message its origin (u64 key, u64 number), u32 length and PUBLISH, every message the
** stream kept since; the session keeps those its subscriptions match, as routing would
** have delivered them (the highest QoS granted, every matching subscription's id).
*/
static bool read_replay(const conn_t *c, const uint8_t *bytes, size_t len, moved_t *mv)
{
    memset(mv, 0, sizeof(*mv));
    rbuf_t r = {.p = bytes, .len = len, .at = 4};
    size_t cap = (len - 4) / 20;
    mv->ss.msgs = calloc(cap ? cap : 1, sizeof(*mv->ss.msgs));
    mv->keys = calloc(cap ? cap : 1, sizeof(uint64_t));
    mv->seqs = calloc(cap ? cap : 1, sizeof(uint64_t));
    if (!mv->ss.msgs || !mv->keys || !mv->seqs)
        return false;
    uint64_t now = rt_mono_ms();
    while (r.at < r.len) {
        uint64_t key = get_uint(&r, 8), seq = get_uint(&r, 8);
        uint32_t plen = (uint32_t)get_uint(&r, 4);
        const uint8_t *pkt = take(&r, plen);
        rt_bin_t *bin = pkt ? rt_message_parse(pkt, plen) : NULL;
        if (!bin)
            return false;
        rt_message_t msg;
        rt_message_view(bin, &msg);
        rt_stored_msg_t m = {.bin = bin};
        bool matched = false;
        for (uint32_t i = 0; i < c->nsubs; i++) {
            const sub_entry_t *e = &c->subs[i];
            const char *f = e->filter;
            size_t flen = e->len;
            if (rt__conn_filter_is_shared(f, flen)) { /* $share/group/filter */
                const char *slash = memchr(f + 7, '/', flen - 7);
                flen -= slash ? (size_t)(slash + 1 - f) : flen;
                f = slash ? slash + 1 : f;
            }
            if (!flen || !rt_topic_matches(f, flen, (const char *)msg.topic.p, msg.topic.len))
                continue;
            uint8_t qos = e->qos < msg.qos ? e->qos : msg.qos;
            m.qos = matched && m.qos > qos ? m.qos : qos;
            m.retain = m.retain || (e->retain_as_published && msg.retain);
            if (e->sub_id && m.n_sub_ids < RT_QMSG_MAX_SUB_IDS)
                m.sub_ids[m.n_sub_ids++] = e->sub_id;
            matched = true;
        }
        if (!matched || (!m.qos && !RT_LIVE(queue_qos0))) {
            rt_bin_release(bin);
            continue;
        }
        if (msg.has_expiry && msg.expiry)
            m.expire_at_ms = now + (uint64_t)msg.expiry * 1000;
        size_t i = mv->ss.nmsgs++;
        mv->ss.msgs[i] = m;
        mv->keys[i] = key;
        mv->seqs[i] = seq;
    }
    return !r.bad;
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
    wbuf_t w = {0};
    put_session(&w, self, c, true, false);
    if (!w.failed) {
        rt_cluster_session_record(c->client_id, owes ? s->clear_ms : now, w.p, w.len);
        if (s)
            s->record_ms = now;
    }
    free(w.p);
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
    wbuf_t w = {0};
    if (req->phase == 2) {
        /* The rest: what came since phase 1. Then the session is the other node's alone. */
        if (moving)
            put_session(&w, self, c, false, true);
        rt_cluster_move_answer(req, w.failed ? NULL : w.p, w.failed ? 0 : w.len);
        free(w.p);
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
        put_session(&w, self, c, true, true);
    if (!s || w.failed) {
        free(w.p);
        rt_log(RT_LOG_ERROR, "cluster.session_move_failed",
               "client=%s: out of memory writing the session; it ends here", c->client_id);
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
    free(w.p);
}

/* ---- The node taking it ---- */

rt_pid_t rt__conn_import_session(const char *id, const void *bytes, size_t len)
{
    moved_t mv;
    rt_pid_t pid = 0;
    bool read = read_session(id, bytes, len, &mv);
    /* Named as on the old node, so that a copy that also reaches this node is kept once. */
    for (size_t i = 0; read && i < mv.ss.nmsgs; i++)
        if (mv.seqs[i])
            rt_message_set_origin(mv.ss.msgs[i].bin, mv.keys[i], mv.seqs[i]);
    if (!read || rt_spawn(&rt__conn_imported_type, &mv, &pid) != 0) {
        rt_log(RT_LOG_ERROR, "cluster.session_unreadable", "client=%s bytes=%zu", id, len);
        pid = 0;
    }
    moved_free(&mv);
    return pid;
}

int rt__conn_imported_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    const moved_t *mv = arg;
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

typedef struct {
    uint64_t key, seq;
} origin_t;

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
static origin_t *known_origins(const moved_t *rest, const rt_session_t *s, size_t *n)
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
    moved_t rest;
    if (len >= 4 && memcmp(bytes, REPLAY_MAGIC, 4) == 0) {
        if (!read_replay(c, bytes, len, &rest)) {
            rt_log(RT_LOG_ERROR, "cluster.replay_unreadable", "client=%s bytes=%zu", c->client_id,
                   len);
            len = 0;
        }
    } else if (len && !read_session(c->client_id, bytes, len, &rest)) {
        rt_log(RT_LOG_ERROR, "cluster.session_tail_unreadable", "client=%s bytes=%zu", c->client_id,
               len);
        len = 0;
    }
    if (!len)
        memset(&rest, 0, sizeof(rest));
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
    free(named);
    s->moved_in = 0;
    rt_log(RT_LOG_INFO, "cluster.session_moved_in",
           "client=%s queued=%u inflight=%u from_old_node_after=%zu both_had=%zu", c->client_id,
           s->queued.n, s->inflight.n, from_rest, duplicates);
    moved_free(&rest);
}

/*
** The bytes of a session moving between cluster nodes: written, and read back (the format is
** in session_bytes.h).
*/
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "replay.h"
#include "session_bytes.h"
#include "topic_trie.h"

enum {
    SUB_NO_LOCAL = 1,
    SUB_RETAIN_AS_PUBLISHED = 2,
    SUB_ACL_CHECK = 4,
    SUB_RETAIN_HANDLING_SHIFT = 3,
    SUB_EXCLUSIVE = 32,
};

/* ---- Writing ---- */

static void put(rt_moved_writer_t *w, const void *d, size_t n)
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

static void put_uint(rt_moved_writer_t *w, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(w, b, (size_t)bytes);
}

/* A time left, + 1 so that 0 can mean "none". */
static void put_left_plus_one(rt_moved_writer_t *w, uint64_t left_ms)
{
    put_uint(w, left_ms >= UINT32_MAX - 1 ? UINT32_MAX : left_ms + 1, 4);
}

void rt_moved_writer_free(rt_moved_writer_t *w)
{
    free(w->p);
    memset(w, 0, sizeof(*w));
}

void rt_moved_put_head(rt_moved_writer_t *w, uint32_t expiry_left_s, const rt_bin_t *will,
                       uint64_t will_left_ms)
{
    put(w, RT_MOVED_SESSION_MAGIC, 4);
    put_uint(w, expiry_left_s, 4);
    if (!will) {
        put_uint(w, 0, 4);
        return;
    }
    put_left_plus_one(w, will_left_ms);
    put_uint(w, rt_bin_len(will), 4);
    put(w, rt_bin_data((rt_bin_t *)will), rt_bin_len(will));
}

void rt_moved_put_count(rt_moved_writer_t *w, uint32_t n)
{
    put_uint(w, n, 4);
}

void rt_moved_put_sub(rt_moved_writer_t *w, const char *filter, uint16_t len,
                      const rt_trie_opts_t *o)
{
    put_uint(w, len, 2);
    put(w, filter, len);
    put_uint(w, o->sub_id, 4);
    uint8_t flags =
        (uint8_t)((o->no_local ? SUB_NO_LOCAL : 0) |
                  (o->retain_as_published ? SUB_RETAIN_AS_PUBLISHED : 0) |
                  (o->acl_check ? SUB_ACL_CHECK : 0) | (o->exclusive ? SUB_EXCLUSIVE : 0) |
                  o->retain_handling << SUB_RETAIN_HANDLING_SHIFT);
    uint8_t qf[2] = {o->qos, flags};
    put(w, qf, 2);
}

void rt_moved_put_qos2_id(rt_moved_writer_t *w, uint16_t packet_id)
{
    put_uint(w, packet_id, 2);
}

void rt_moved_put_msg(rt_moved_writer_t *w, const rt_stored_msg_t *m, uint64_t origin_key,
                      uint64_t origin_seq, uint64_t now)
{
    uint8_t head[4] = {m->state, m->qos, m->retain, m->shared};
    put(w, head, 4);
    put_uint(w, m->packet_id, 2);
    if (m->expire_at_ms)
        put_left_plus_one(w, m->expire_at_ms > now ? m->expire_at_ms - now : 0);
    else
        put_uint(w, 0, 4);
    put_uint(w, m->n_sub_ids, 1);
    for (uint32_t i = 0; i < m->n_sub_ids; i++)
        put_uint(w, m->sub_ids[i], 4);
    put_uint(w, origin_key, 8);
    put_uint(w, origin_seq, 8);
    size_t len = m->bin ? rt_bin_len(m->bin) : 0;
    put_uint(w, len, 4);
    put(w, m->bin ? rt_bin_data(m->bin) : NULL, len);
}

/* ---- Reading ---- */

void rt_moved_free(rt_moved_t *mv)
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

/* Room for n messages and their origins. */
static int alloc_msgs(rt_moved_t *mv, size_t n)
{
    mv->ss.msgs = calloc(n ? n : 1, sizeof(*mv->ss.msgs));
    mv->keys = calloc(n ? n : 1, sizeof(uint64_t));
    mv->seqs = calloc(n ? n : 1, sizeof(uint64_t));
    return mv->ss.msgs && mv->keys && mv->seqs ? 0 : RT_ENOMEM;
}

/* A QoS 2 message past PUBREC carries no PUBLISH; the session record needs one, dropped at
   once (start.c), so a one-byte topic stands in. */
static rt_bin_t *released_placeholder(void)
{
    static const uint8_t publish[] = {0x34, 0x06, 0x00, 0x01, 'x', 0x00, 0x01, 0x00};
    return rt_message_parse(publish, sizeof(publish));
}

static int read_msgs(rt_reader_t *r, uint64_t now, rt_moved_t *mv)
{
    uint32_t n = (uint32_t)rt_reader_uint(r, 4);
    if (r->bad || n > (r->len - r->at) / 31) /* a message takes 31 bytes at least */
        return RT_EPROTO;
    if (alloc_msgs(mv, n))
        return RT_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        rt_stored_msg_t *m = &mv->ss.msgs[i];
        const uint8_t *head = rt_reader_take(r, 4);
        if (!head)
            return RT_EPROTO;
        m->state = head[0];
        m->qos = head[1];
        m->retain = head[2];
        m->shared = head[3];
        m->packet_id = (uint16_t)rt_reader_uint(r, 2);
        uint32_t left = (uint32_t)rt_reader_uint(r, 4);
        m->expire_at_ms = left ? now + left - 1 + (left == 1) : 0;
        m->n_sub_ids = (uint32_t)rt_reader_uint(r, 1);
        if (m->n_sub_ids > RT_QMSG_MAX_SUB_IDS || m->state > RT_QMSG_WAIT_COMP || m->qos > 2)
            return RT_EPROTO;
        for (uint32_t k = 0; k < m->n_sub_ids; k++)
            m->sub_ids[k] = (uint32_t)rt_reader_uint(r, 4);
        mv->keys[i] = rt_reader_uint(r, 8);
        mv->seqs[i] = rt_reader_uint(r, 8);
        uint32_t len = (uint32_t)rt_reader_uint(r, 4);
        const uint8_t *pkt = rt_reader_take(r, len);
        if (r->bad)
            return RT_EPROTO;
        m->bin = len                             ? rt_message_parse(pkt, len)
                 : m->state == RT_QMSG_WAIT_COMP ? released_placeholder()
                                                 : NULL;
        if (!m->bin)
            return RT_EPROTO;
        mv->ss.nmsgs = i + 1;
    }
    return 0;
}

static int read_subs(rt_reader_t *r, rt_moved_t *mv)
{
    uint32_t nsubs = (uint32_t)rt_reader_uint(r, 4);
    if (r->bad || nsubs > (r->len - r->at) / 8)
        return RT_EPROTO;
    mv->ss.subs = calloc(nsubs ? nsubs : 1, sizeof(*mv->ss.subs));
    if (!mv->ss.subs)
        return RT_ENOMEM;
    for (uint32_t i = 0; i < nsubs; i++) {
        uint32_t flen = (uint32_t)rt_reader_uint(r, 2);
        const uint8_t *f = rt_reader_take(r, flen);
        uint32_t sub_id = (uint32_t)rt_reader_uint(r, 4);
        const uint8_t *qf = rt_reader_take(r, 2);
        /* As a SUBSCRIBE's would be: the filter is also a C string of its length. */
        if (!qf || !mqtt_utf8_valid(f, flen) || !rt_topic_valid_filter((const char *)f, flen) ||
            qf[0] > 2)
            return RT_EPROTO;
        rt_stored_sub_t *sub = &mv->ss.subs[i];
        if (!(sub->filter = malloc(flen + 1)))
            return RT_ENOMEM;
        memcpy(sub->filter, f, flen);
        sub->filter[flen] = 0;
        sub->len = flen;
        sub->opts = (rt_trie_opts_t){.sub_id = sub_id,
                                     .qos = qf[0],
                                     .no_local = !!(qf[1] & SUB_NO_LOCAL),
                                     .retain_as_published = !!(qf[1] & SUB_RETAIN_AS_PUBLISHED),
                                     .retain_handling = (qf[1] >> SUB_RETAIN_HANDLING_SHIFT) & 3,
                                     .acl_check = !!(qf[1] & SUB_ACL_CHECK),
                                     .exclusive = !!(qf[1] & SUB_EXCLUSIVE)};
        mv->ss.nsubs = i + 1;
    }
    return 0;
}

int rt_moved_read_session(const char *id, const void *bytes, size_t len, uint64_t now,
                          rt_moved_t *mv)
{
    memset(mv, 0, sizeof(*mv));
    rt_reader_t r = {.p = bytes, .len = len};
    const uint8_t *magic = rt_reader_take(&r, 4);
    if (!magic || memcmp(magic, RT_MOVED_SESSION_MAGIC, 4) != 0)
        return RT_EPROTO;
    mv->ss.client_id = id;
    mv->ss.expiry_left_s = (uint32_t)rt_reader_uint(&r, 4);
    uint32_t will_left = (uint32_t)rt_reader_uint(&r, 4);
    if (will_left) {
        uint32_t wlen = (uint32_t)rt_reader_uint(&r, 4);
        const uint8_t *w = rt_reader_take(&r, wlen);
        if (!w || !(mv->will = rt_message_parse(w, wlen)))
            return RT_EPROTO;
        mv->will_left_ms = will_left - 1;
    }
    int rc = read_subs(&r, mv);
    if (rc)
        return rc;
    uint32_t nqos2 = (uint32_t)rt_reader_uint(&r, 4);
    if (r.bad || nqos2 > (r.len - r.at) / 2 || nqos2 > RT_CONN_QOS2_PENDING_MAX)
        return RT_EPROTO;
    mv->ss.qos2_in = calloc(nqos2 ? nqos2 : 1, sizeof(uint16_t));
    if (!mv->ss.qos2_in)
        return RT_ENOMEM;
    for (uint32_t i = 0; i < nqos2; i++)
        mv->ss.qos2_in[i] = (uint16_t)rt_reader_uint(&r, 2);
    mv->ss.nqos2_in = nqos2;
    rc = read_msgs(&r, now, mv);
    if (rc)
        return rc;
    return r.at == r.len ? 0 : RT_EPROTO;
}

/*
** Fills m's delivery from the subscriptions msg matches, as routing would have; false if
** none does.
*/
static bool match(const sub_entry_t *subs, uint32_t nsubs, const rt_message_t *msg,
                  rt_stored_msg_t *m)
{
    bool matched = false;
    for (uint32_t i = 0; i < nsubs; i++) {
        const sub_entry_t *e = &subs[i];
        if (!rt_topic_matches(e->filter, e->len, (const char *)msg->topic.p, msg->topic.len))
            continue;
        uint8_t qos = e->qos < msg->qos ? e->qos : msg->qos;
        m->qos = matched && m->qos > qos ? m->qos : qos;
        m->retain = m->retain || (e->retain_as_published && msg->retain);
        if (e->sub_id && m->n_sub_ids < RT_QMSG_MAX_SUB_IDS)
            m->sub_ids[m->n_sub_ids++] = e->sub_id;
        matched = true;
    }
    return matched;
}

int rt_moved_read_replay(const void *bytes, size_t len, const sub_entry_t *subs, uint32_t nsubs,
                         bool keep_qos0, uint64_t now, rt_moved_t *mv)
{
    memset(mv, 0, sizeof(*mv));
    size_t at = 0;
    rt_replay_entry_t e;
    int more = rt_replay_next(bytes, len, &at, &e);
    if (more < 0)
        return RT_EPROTO;
    if (alloc_msgs(mv, (len - RT_REPLAY_HEAD) / RT_REPLAY_ENTRY_MIN))
        return RT_ENOMEM;
    for (; more > 0; more = rt_replay_next(bytes, len, &at, &e)) {
        rt_bin_t *bin = rt_message_parse(e.publish, e.len);
        if (!bin)
            return RT_EPROTO;
        rt_message_t msg;
        rt_message_view(bin, &msg);
        rt_stored_msg_t m = {.bin = bin};
        if (!match(subs, nsubs, &msg, &m) || (!m.qos && !keep_qos0)) {
            rt_bin_release(bin);
            continue;
        }
        if (msg.has_expiry && msg.expiry)
            m.expire_at_ms = now + (uint64_t)msg.expiry * 1000;
        size_t i = mv->ss.nmsgs++;
        mv->ss.msgs[i] = m;
        mv->keys[i] = e.origin_key;
        mv->seqs[i] = e.origin_seq;
    }
    return more < 0 ? RT_EPROTO : 0;
}

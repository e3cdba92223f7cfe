/*
** The bytes a cluster node reads about a persistent session moving to it
** (actors/conn/session_bytes.c): they come over NATS, so whatever they hold is refused
** cleanly or read whole.
**
** The input is what follows the magic, and both readers get it behind theirs. "RTS1": a
** session read is written again, and those bytes must read back to the same session (its
** subscriptions, QoS 2 ids, will, messages with their deadlines, origins and PUBLISHes); no
** list may hold more entries than the input has room for, and each filter is a C string of
** its length. "RTR1": the replay is matched
** against a fixed set of subscriptions (wildcards, shared ones, more than a message can
** name), once keeping QoS 0 messages and once not; the second keeps a subset, none at QoS 0.
** The clock is read once per input, so deadlines compare exactly. Every binary a reader made
** is released by the end (rt_bin_totals).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "replay.h"
#include "session_bytes.h"

#define SUB(f, q, id, rap)                                                                         \
    {                                                                                              \
        .filter = (char *)(f), .len = sizeof(f) - 1, .qos = (q), .sub_id = (id),                   \
        .retain_as_published = (rap)                                                               \
    }

/* "a/b" matches ten of them, more than the RT_QMSG_MAX_SUB_IDS a message names. */
static const sub_entry_t subs[] = {
    SUB("#", 0, 1, 0),       SUB("+/#", 1, 0, 1),          SUB("a/#", 2, 3, 0),
    SUB("a/+", 1, 4, 1),     SUB("+/b", 2, 5, 0),          SUB("a/b", 0, 6, 0),
    SUB("+/+", 1, 7, 0),     SUB("$share/g/a/b", 2, 8, 1), SUB("$share/g/#", 1, 9, 0),
    SUB("a/b/#", 1, 10, 0),  SUB("$share/x", 2, 11, 0),    SUB("$SYS/#", 1, 12, 1),
    SUB("+/+/+/+", 2, 0, 0),
};
#define NSUBS (sizeof subs / sizeof *subs)

#define MIN_SUB 9     /* bytes: u16 length, a one-byte filter, u32 id, QoS and flags */
#define MIN_MSG 31    /* bytes: its fixed fields, no subscription id, no PUBLISH */
#define MIN_RECORD 20 /* bytes: a replayed message's origin and length */

static void write_session(const rt_moved_t *mv, uint64_t now, rt_moved_writer_t *w)
{
    rt_moved_put_head(w, mv->ss.expiry_left_s, mv->will, mv->will_left_ms);
    rt_moved_put_count(w, (uint32_t)mv->ss.nsubs);
    for (size_t i = 0; i < mv->ss.nsubs; i++)
        rt_moved_put_sub(w, mv->ss.subs[i].filter, (uint16_t)mv->ss.subs[i].len,
                         &mv->ss.subs[i].opts);
    rt_moved_put_count(w, (uint32_t)mv->ss.nqos2_in);
    for (size_t i = 0; i < mv->ss.nqos2_in; i++)
        rt_moved_put_qos2_id(w, mv->ss.qos2_in[i]);
    rt_moved_put_count(w, (uint32_t)mv->ss.nmsgs);
    for (size_t i = 0; i < mv->ss.nmsgs; i++)
        rt_moved_put_msg(w, &mv->ss.msgs[i], mv->keys[i], mv->seqs[i], now);
}

static bool same_bin(const rt_bin_t *a, const rt_bin_t *b)
{
    if (!a || !b)
        return a == b;
    return rt_bin_len(a) == rt_bin_len(b) &&
           memcmp(rt_bin_data((rt_bin_t *)a), rt_bin_data((rt_bin_t *)b), rt_bin_len(a)) == 0;
}

static bool same_opts(const rt_trie_opts_t *a, const rt_trie_opts_t *b)
{
    return a->sub_id == b->sub_id && a->qos == b->qos && a->no_local == b->no_local &&
           a->retain_as_published == b->retain_as_published &&
           a->retain_handling == b->retain_handling && a->acl_check == b->acl_check;
}

static bool same_msg(const rt_stored_msg_t *a, const rt_stored_msg_t *b)
{
    return a->state == b->state && a->qos == b->qos && a->retain == b->retain &&
           a->shared == b->shared && a->packet_id == b->packet_id &&
           a->expire_at_ms == b->expire_at_ms && a->n_sub_ids == b->n_sub_ids &&
           memcmp(a->sub_ids, b->sub_ids, a->n_sub_ids * sizeof(uint32_t)) == 0 &&
           same_bin(a->bin, b->bin);
}

static bool same_session(const rt_moved_t *a, const rt_moved_t *b)
{
    if (a->ss.expiry_left_s != b->ss.expiry_left_s || !same_bin(a->will, b->will) ||
        a->will_left_ms != b->will_left_ms || a->ss.nsubs != b->ss.nsubs ||
        a->ss.nqos2_in != b->ss.nqos2_in || a->ss.nmsgs != b->ss.nmsgs)
        return false;
    for (size_t i = 0; i < a->ss.nsubs; i++)
        if (a->ss.subs[i].len != b->ss.subs[i].len ||
            memcmp(a->ss.subs[i].filter, b->ss.subs[i].filter, a->ss.subs[i].len + 1) != 0 ||
            !same_opts(&a->ss.subs[i].opts, &b->ss.subs[i].opts))
            return false;
    if (memcmp(a->ss.qos2_in, b->ss.qos2_in, a->ss.nqos2_in * sizeof(uint16_t)) != 0)
        return false;
    for (size_t i = 0; i < a->ss.nmsgs; i++)
        if (!same_msg(&a->ss.msgs[i], &b->ss.msgs[i]) || a->keys[i] != b->keys[i] ||
            a->seqs[i] != b->seqs[i])
            return false;
    return true;
}

static void session(const uint8_t *bytes, size_t len, uint64_t now)
{
    rt_moved_t mv;
    int rc = rt_moved_read_session("c", bytes, len, now, &mv);
    if (rc != 0 && rc != RT_EPROTO)
        abort();
    if (rc != 0) {
        rt_moved_free(&mv);
        return;
    }
    if (mv.ss.nsubs > len / MIN_SUB || mv.ss.nqos2_in > len / 2 || mv.ss.nmsgs > len / MIN_MSG)
        abort();
    for (size_t i = 0; i < mv.ss.nsubs; i++)
        if (strlen(mv.ss.subs[i].filter) != mv.ss.subs[i].len)
            abort();
    for (size_t i = 0; i < mv.ss.nmsgs; i++)
        if (!mv.ss.msgs[i].bin || mv.ss.msgs[i].n_sub_ids > RT_QMSG_MAX_SUB_IDS)
            abort();
    rt_moved_writer_t w = {0};
    write_session(&mv, now, &w);
    rt_moved_t again;
    if (w.failed || rt_moved_read_session("c", w.p, w.len, now, &again) != 0 ||
        !same_session(&mv, &again))
        abort();
    rt_moved_free(&again);
    rt_moved_writer_free(&w);
    rt_moved_free(&mv);
}

static void replay(const uint8_t *bytes, size_t len, uint64_t now)
{
    rt_moved_t all, some;
    int rc = rt_moved_read_replay(bytes, len, subs, NSUBS, true, now, &all);
    int rc_some = rt_moved_read_replay(bytes, len, subs, NSUBS, false, now, &some);
    if ((rc != 0 && rc != RT_EPROTO) || rc_some != rc)
        abort();
    if (rc == 0) {
        if (all.ss.nmsgs > len / MIN_RECORD || some.ss.nmsgs > all.ss.nmsgs)
            abort();
        size_t j = 0;
        for (size_t i = 0; i < all.ss.nmsgs; i++) {
            const rt_stored_msg_t *m = &all.ss.msgs[i];
            rt_message_t msg;
            rt_message_view(m->bin, &msg);
            if (m->qos > msg.qos || m->n_sub_ids > RT_QMSG_MAX_SUB_IDS)
                abort();
            if (!m->qos)
                continue;
            if (j == some.ss.nmsgs || !same_msg(m, &some.ss.msgs[j]) ||
                all.keys[i] != some.keys[j] || all.seqs[i] != some.seqs[j])
                abort();
            j++;
        }
        if (j != some.ss.nmsgs)
            abort();
    }
    rt_moved_free(&all);
    rt_moved_free(&some);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    if (!started) {
        rt_message_keep_origins(); /* as a clustered rtd does: every binary has origin room */
        started = true;
    }
    size_t bins_before, bins_after;
    rt_bin_totals(&bins_before, NULL);
    uint8_t *bytes = malloc(size + 4);
    memcpy(bytes + 4, data, size);
    uint64_t now = rt_mono_ms();

    memcpy(bytes, RT_MOVED_SESSION_MAGIC, 4);
    session(bytes, size + 4, now);
    memcpy(bytes, RT_REPLAY_MAGIC, RT_REPLAY_HEAD);
    replay(bytes, size + 4, now);

    free(bytes);
    rt_bin_totals(&bins_after, NULL);
    if (bins_after != bins_before)
        abort();
    return 0;
}

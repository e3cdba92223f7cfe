/*
** Session message lists: singly linked FIFOs with a tail pointer. Lookups by
** packet id scan the inflight list from its head: clients acknowledge in the
** order of sending (4.6), so the id sought is almost always the oldest, and a
** scan beats keeping an index per session.
*/
#include <string.h>

#include "session.h"

rt_qmsg_t *rt_qmsg_new(rt_actor_t *self, rt_bin_t *bin, uint8_t qos, uint8_t retain,
                       uint64_t expire_at_ms, uint8_t shared, const uint32_t *sub_ids,
                       uint32_t n_sub_ids)
{
    if (n_sub_ids > RT_QMSG_MAX_SUB_IDS)
        n_sub_ids = RT_QMSG_MAX_SUB_IDS;
    rt_qmsg_t *m = rt_alloc_bin(self, sizeof(*m) + n_sub_ids * sizeof(uint32_t), RT_OBJ_SCAN,
                                rt_bin_retain(bin));
    if (!m)
        return NULL;
    m->expire_at_ms = expire_at_ms;
    m->qos = qos;
    m->retain = retain;
    m->state = RT_QMSG_QUEUED;
    m->shared = shared;
    m->n_sub_ids = (uint8_t)n_sub_ids;
    if (n_sub_ids)
        memcpy(m->sub_ids, sub_ids, n_sub_ids * sizeof(uint32_t));
    return m;
}

void rt_qmsg_free(rt_actor_t *self, rt_qmsg_t *m)
{
    rt_free(self, m);
}

size_t rt_qmsg_bytes(const rt_qmsg_t *m)
{
    rt_bin_t *bin = rt_qmsg_bin(m);
    return bin ? rt_bin_len(bin) : 0;
}

/* The list's ends and counts agree: empty means no head, no tail, no bytes. */
static inline bool qlist_consistent(const rt_qlist_t *l)
{
    return (l->n == 0) == (l->head == NULL) && (l->head == NULL) == (l->tail == NULL) &&
           (l->n || l->bytes == 0) && (!l->tail || !l->tail->next);
}

void rt_qlist_push(rt_qlist_t *l, rt_qmsg_t *m)
{
    RT_ASSERT(qlist_consistent(l) && m != l->tail);
    m->next = NULL;
    if (l->tail)
        l->tail->next = m;
    else
        l->head = m;
    l->tail = m;
    l->n++;
    l->bytes += rt_qmsg_bytes(m);
}

/* Unlinks m, whose predecessor is prev (NULL at the head). */
static void unlink_after(rt_qlist_t *l, rt_qmsg_t *prev, rt_qmsg_t *m)
{
    RT_ASSERT(qlist_consistent(l) && l->n && l->bytes >= rt_qmsg_bytes(m));
    RT_ASSERT(prev ? prev->next == m : l->head == m);
    if (prev)
        prev->next = m->next;
    else
        l->head = m->next;
    if (l->tail == m)
        l->tail = prev;
    m->next = NULL;
    l->n--;
    l->bytes -= rt_qmsg_bytes(m);
}

rt_qmsg_t *rt_qlist_pop(rt_qlist_t *l)
{
    rt_qmsg_t *m = l->head;
    if (m)
        unlink_after(l, NULL, m);
    return m;
}

rt_qmsg_t *rt_qlist_find_id(const rt_qlist_t *l, uint16_t packet_id)
{
    for (rt_qmsg_t *m = l->head; m; m = m->next)
        if (m->packet_id == packet_id)
            return m;
    return NULL;
}

rt_qmsg_t *rt_qlist_take_id(rt_qlist_t *l, uint16_t packet_id)
{
    for (rt_qmsg_t *prev = NULL, *m = l->head; m; prev = m, m = m->next) {
        if (m->packet_id == packet_id) {
            unlink_after(l, prev, m);
            return m;
        }
    }
    return NULL;
}

void rt_qlist_drop_payload(rt_actor_t *self, rt_qlist_t *l, rt_qmsg_t *m)
{
    RT_ASSERT(l->n && l->bytes >= rt_qmsg_bytes(m));
    l->bytes -= rt_qmsg_bytes(m);
    rt_drop_bin(self, m);
}

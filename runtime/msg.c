/*
** Message envelopes come from a pool (pool.c) in 64-byte classes, so the hot
** path of a send is a free-list pop with no lock. Envelopes are plain malloc
** memory; the depot keeps at most RT_MSG_DEPOT_MAX batches per class, so a
** burst of queued messages goes back to malloc once it has been handled.
*/
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pool.h"

#define RT_MSG_STEP 64      /* bytes between envelope classes; the smallest is one step */
#define RT_MSG_DEPOT_MAX 32 /* batches kept per class */

static rt_pool_t envelopes =
    RT_POOL_OF_MALLOC(0, RT_MSG_STEP, RT_MSG_DEPOT_MAX, 256, RT_POOL_CACHE_HIGH);

rt_msg_t *rt_msg_new(uint32_t tag, size_t len)
{
    if (len > UINT32_MAX - sizeof(rt_msg_t))
        return NULL;
    uint8_t cls;
    rt_msg_t *m = rt__pool_alloc(&envelopes, sizeof(rt_msg_t) + len, &cls);
    if (!m)
        return NULL;
    atomic_store_explicit(&m->next, NULL, memory_order_relaxed);
    m->size_class = cls;
    m->tag = tag;
    m->len = (uint32_t)len;
    m->from = 0;
    m->bin = NULL;
    m->flags = 0;
    return m;
}

void rt_msg_free(rt_msg_t *m)
{
    if (!m)
        return;
    if (m->bin)
        rt_bin_release(m->bin);
    /* What rides with the fd goes before it closes: whoever sees the close (the peer, a
       test) may count on it being gone. */
    if (m->flags & RT_MSGF_OWNED) {
        rt_msg_owned_t *o = (rt_msg_owned_t *)(void *)m->data;
        o->drop(o->obj);
    }
    if (m->flags & RT_MSGF_FD)
        close((int)m->reserved2);
    if (m->size_class != RT_POOL_TOO_BIG)
        RT_POISON(m->data, (size_t)m->size_class * RT_MSG_STEP - sizeof(rt_msg_t));
    rt__pool_free(&envelopes, m, m->size_class);
}

rt_bin_t *rt_msg_take_bin(rt_msg_t *m)
{
    rt_bin_t *b = m->bin;
    m->bin = NULL;
    return b;
}

rt_msg_t *rt_msg_new_fd(uint32_t tag, int fd, size_t len)
{
    rt_msg_t *m = rt_msg_new(tag, len);
    if (!m)
        return NULL;
    m->flags = RT_MSGF_FD;
    m->reserved2 = (uint32_t)fd;
    return m;
}

int rt_msg_take_fd(rt_msg_t *m)
{
    if (!(m->flags & RT_MSGF_FD))
        return -1;
    m->flags &= (uint8_t)~RT_MSGF_FD;
    return (int)m->reserved2;
}

void rt_msg_own(rt_msg_t *m, void *obj, void (*drop)(void *obj))
{
    RT_ASSERT(m->len >= sizeof(rt_msg_owned_t) && !(m->flags & RT_MSGF_OWNED));
    rt_msg_owned_t *o = (rt_msg_owned_t *)(void *)m->data;
    o->obj = obj;
    o->drop = drop;
    m->flags |= RT_MSGF_OWNED;
}

void *rt_msg_take_owned(rt_msg_t *m)
{
    if (!(m->flags & RT_MSGF_OWNED))
        return NULL;
    m->flags &= (uint8_t)~RT_MSGF_OWNED;
    return ((rt_msg_owned_t *)(void *)m->data)->obj;
}

void rt__msg_pool_stats(size_t *in_use, size_t *held)
{
    *in_use = (size_t)rt_striped_sum(&envelopes.bytes_in_use);
    *held = atomic_load_explicit(&envelopes.bytes_held, memory_order_relaxed);
}

void rt__msg_pool_destroy(void)
{
    rt__pool_reset(&envelopes);
}

void rt__msg_trim(void)
{
    rt__pool_trim(&envelopes);
}

/*
** Epoch-based reclamation (Fraser). A thread inside a critical region has
** published the global epoch it saw. An object is tagged, when retired, with
** the global epoch read after it became unreachable: anyone still holding it
** entered at that epoch or earlier. The epoch advances only when every active
** thread has seen the current one, so once it reaches tag + 2 every such
** holder has left, and the object can go. Scheduler threads enter once per
** batch of turns (their quiescent point) rather than once per message.
*/
#include <stdlib.h>

#include "internal.h"

static rt_ebr_thread_t threads[RT_EBR_MAX_THREADS];
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t global_epoch = 1;
static atomic_uint nthreads_hw; /* high-water mark of used entries */
static rt_retired_t *orphans;   /* retired by threads that left (reg_lock) */

rt_ebr_thread_t *rt__ebr_register(void)
{
    pthread_mutex_lock(&reg_lock);
    rt_ebr_thread_t *t = NULL;
    for (unsigned i = 0; i < RT_EBR_MAX_THREADS; i++) {
        if (!threads[i].in_use) {
            t = &threads[i];
            t->in_use = true;
            atomic_store(&t->local, 0);
            t->limbo_head = t->limbo_tail = NULL;
            if (i + 1 > atomic_load(&nthreads_hw))
                atomic_store(&nthreads_hw, i + 1);
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
    return t;
}

static void try_advance(uint64_t epoch)
{
    unsigned n = atomic_load_explicit(&nthreads_hw, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        uint64_t l = atomic_load_explicit(&threads[i].local, memory_order_seq_cst);
        if ((l & 1) && (l >> 1) != epoch)
            return;
    }
    uint64_t expect = epoch;
    atomic_compare_exchange_strong(&global_epoch, &expect, epoch + 1);
}

#ifndef NDEBUG
/* Whether t is inside a critical region; only t's own thread asks. */
static bool inside(const rt_ebr_thread_t *t)
{
    return atomic_load_explicit(&t->local, memory_order_relaxed) & 1;
}
#endif

/*
** Entering while inside is allowed: it publishes a newer epoch (a quiescent point
** between batches of turns), so regions do not nest and one leave ends them.
*/
void rt__ebr_enter(rt_ebr_thread_t *t)
{
    RT_ASSERT(t->in_use); /* a record is entered only between register and unregister */
    uint64_t epoch = atomic_load_explicit(&global_epoch, memory_order_seq_cst);
    atomic_store_explicit(&t->local, epoch << 1 | 1, memory_order_seq_cst);
    if (!t->limbo_head)
        return;
    try_advance(epoch);
    epoch = atomic_load_explicit(&global_epoch, memory_order_seq_cst);
    while (t->limbo_head && t->limbo_head->epoch + 2 <= epoch) {
        rt_retired_t *r = t->limbo_head;
        t->limbo_head = r->next;
        if (!t->limbo_head)
            t->limbo_tail = NULL;
        r->reclaim(r);
    }
}

void rt__ebr_leave(rt_ebr_thread_t *t)
{
    RT_ASSERT(inside(t)); /* a leave ends a region its enter began */
    atomic_store_explicit(&t->local, 0, memory_order_release);
}

void rt__ebr_retire(rt_ebr_thread_t *t, rt_retired_t *r)
{
    /* Retired inside a region, after the object was unlinked: the tag read now is one
       that every later reader will have entered at or after. */
    RT_ASSERT(inside(t));
    RT_ASSERT(!t->limbo_head == !t->limbo_tail);
    r->epoch = atomic_load_explicit(&global_epoch, memory_order_seq_cst);
    r->next = NULL;
    /* The limbo list stays in epoch order, so enter frees from its head and stops at the
       first object still too young. */
    RT_ASSERT(!t->limbo_tail || t->limbo_tail->epoch <= r->epoch);
    if (t->limbo_tail)
        t->limbo_tail->next = r;
    else
        t->limbo_head = r;
    t->limbo_tail = r;
}

void rt__ebr_unregister(rt_ebr_thread_t *t)
{
    RT_ASSERT(!inside(t)); /* a thread leaves its region before it gives the record up */
    pthread_mutex_lock(&reg_lock);
    if (t->limbo_tail) {
        t->limbo_tail->next = orphans;
        orphans = t->limbo_head;
    }
    t->limbo_head = t->limbo_tail = NULL;
    atomic_store(&t->local, 0);
    t->in_use = false;
    pthread_mutex_unlock(&reg_lock);
}

/* Shutdown only: no other runtime thread runs, so everything retired can go. */
void rt__ebr_drain_all(void)
{
    for (;;) {
        pthread_mutex_lock(&reg_lock);
        rt_retired_t *r = orphans;
        orphans = NULL;
        for (unsigned i = 0; i < RT_EBR_MAX_THREADS; i++) {
            rt_ebr_thread_t *t = &threads[i];
            if (t->limbo_tail) {
                t->limbo_tail->next = r;
                r = t->limbo_head;
                t->limbo_head = t->limbo_tail = NULL;
            }
        }
        pthread_mutex_unlock(&reg_lock);
        if (!r)
            return;
        while (r) {
            rt_retired_t *next = r->next;
            r->reclaim(r);
            r = next;
        }
    }
}

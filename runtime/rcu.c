/*
** Each reader thread owns a slot whose sequence number is odd while the thread
** is inside a read section. A swap exchanges the pointer and then, for every
** slot it finds odd, waits until that slot's number changes. All of it is
** sequentially consistent, which gives the invariant: a reader whose entry
** (the increment to odd) comes after the swap's look at its slot loads the
** pointer after the exchange, so it sees the new object; a reader whose entry
** came before is seen as odd and waited for. Either way, when rt_rcu_swap
** returns nobody holds the old pointer.
*/
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common.h"
#include "rcu.h"

typedef struct slot_s {
    _Alignas(RT_CACHE_LINE) atomic_uint_fast64_t seq; /* odd inside a section; owner writes */
    atomic_bool used;                                 /* claimed by a live thread */
} slot_t;

static slot_t slots[RT_RCU_SLOTS];
static atomic_uint slots_hw;                /* slots ever claimed: a swap scans these */
static atomic_uint_fast64_t shared_readers; /* sections of threads without a slot */
static pthread_mutex_t swap_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t slot_key;

/* The calling thread's slot: NULL before the first section, &overflow without one. */
static _Thread_local slot_t *my_slot;
static _Thread_local unsigned my_depth;
static slot_t overflow; /* marker only: its fields are never used */

static void release_slot(void *p)
{
    slot_t *s = p;
    atomic_store(&s->used, false);
}

static void make_key(void)
{
    pthread_key_create(&slot_key, release_slot);
}

static slot_t *claim_slot(void)
{
    pthread_once(&key_once, make_key);
    for (unsigned i = 0; i < RT_RCU_SLOTS; i++) {
        bool expect = false;
        if (atomic_load(&slots[i].used) ||
            !atomic_compare_exchange_strong(&slots[i].used, &expect, true))
            continue;
        unsigned hw = atomic_load(&slots_hw);
        while (hw < i + 1 && !atomic_compare_exchange_weak(&slots_hw, &hw, i + 1))
            ;
        pthread_setspecific(slot_key, &slots[i]);
        return &slots[i];
    }
    return &overflow;
}

void *rt_rcu_enter(rt_rcu_t *r)
{
    if (my_depth++ == 0) {
        if (RT_UNLIKELY(!my_slot))
            my_slot = claim_slot();
        if (my_slot != &overflow)
            atomic_fetch_add(&my_slot->seq, 1);
        else
            atomic_fetch_add(&shared_readers, 1);
    }
    return atomic_load(&r->ptr);
}

void rt_rcu_leave(void)
{
    RT_ASSERT(my_depth > 0);
    if (--my_depth > 0)
        return;
    if (my_slot != &overflow)
        atomic_fetch_add_explicit(&my_slot->seq, 1, memory_order_release);
    else
        atomic_fetch_sub_explicit(&shared_readers, 1, memory_order_release);
}

static void pause_briefly(unsigned *spins)
{
    if (++*spins < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000}; /* 50 us: a reader is in a long section */
    nanosleep(&ts, NULL);
}

void *rt_rcu_swap(rt_rcu_t *r, void *p)
{
    RT_ASSERT(my_depth == 0);
    pthread_mutex_lock(&swap_lock);
    void *old = atomic_exchange(&r->ptr, p);
    unsigned n = atomic_load(&slots_hw);
    for (unsigned i = 0; i < n; i++) {
        uint_fast64_t s = atomic_load(&slots[i].seq);
        unsigned spins = 0;
        while ((s & 1) && atomic_load(&slots[i].seq) == s)
            pause_briefly(&spins);
    }
    unsigned spins = 0;
    while (atomic_load(&shared_readers) != 0)
        pause_briefly(&spins);
    pthread_mutex_unlock(&swap_lock);
    return old;
}

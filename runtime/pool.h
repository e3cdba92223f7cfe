/*
** Size-class object pools with per-thread free lists and a shared depot
** (Pony's pool, simplified): the hot path of an allocation or a free is a
** list push or pop with no lock. Objects are often freed on another thread
** than the one that allocated them, so lists drift: a thread whose list grows
** past its pool's cache_high hands a batch to the depot, and a thread that runs
** dry takes a batch from it before carving new memory.
**
** Three pools use this: message envelopes and binaries (malloc-backed; a depot past
** its cap gives memory back to malloc) and actor structs (slab-backed; see slab.c).
*/
#ifndef RT_POOL_H
#define RT_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

#define RT_POOL_CLASSES 33     /* class c holds objects of c * step bytes, 1 <= c < 33 */
#define RT_POOL_MAX_POOLS 4    /* pools in the process (each has a per-thread cache) */
#define RT_POOL_TOO_BIG 0      /* class of objects past the largest class: plain malloc */
#define RT_POOL_CACHE_HIGH 1024 /* the most any pool lets a thread keep per class */

typedef struct rt_pool_s rt_pool_t;

struct rt_pool_s {
    /* Set before first use, constant after. */
    unsigned id;       /* which per-thread cache this pool uses, < RT_POOL_MAX_POOLS */
    size_t step;       /* bytes between classes (a multiple of 16) */
    unsigned depot_max;/* batches kept per class; 0 keeps everything */
    unsigned batch;    /* objects moved between a thread and the depot at once */
    unsigned cache_high; /* objects a thread keeps per class before giving back, <= the
                            RT_POOL_CACHE_HIGH, > batch */
    /* Fresh memory for an object of size bytes, or NULL. */
    void *(*carve)(rt_pool_t *p, size_t size);
    /* Gives an object's memory back (past the depot cap, and at reset); NULL: never. */
    void (*release)(void *obj);

    pthread_mutex_t lock;
    void *depot[RT_POOL_CLASSES];  /* batches, chained through word 1 of their first object */
    unsigned depot_batches[RT_POOL_CLASSES];
    atomic_uint_fast64_t gen;      /* bumped by reset: older per-thread lists are stale */
    rt_striped_t bytes_in_use; /* changed by every thread's allocs and frees */
    atomic_size_t bytes_held; /* carved and not released: in use or on a free list */
};

void *rt__pool_alloc(rt_pool_t *p, size_t size, uint8_t *cls);
void *rt__pool_carve_malloc(rt_pool_t *p, size_t size);
/* The initializer of a pool of plain malloc memory (envelopes, binaries). */
#define RT_POOL_OF_MALLOC(id_, step_, depot_max_, batch_, cache_high_)                             \
    {                                                                                              \
        .id = (id_), .step = (step_), .depot_max = (depot_max_), .batch = (batch_),                \
        .cache_high = (cache_high_), .carve = rt__pool_carve_malloc, .release = free,              \
        .lock = PTHREAD_MUTEX_INITIALIZER,                                                         \
    }
void rt__pool_free(rt_pool_t *p, void *obj, uint8_t cls);
/*
** Empties the depot and the calling thread's lists and makes every other
** thread's lists stale (they are released, or dropped when release is NULL,
** on that thread's next use). Only when no other thread uses the pool.
*/
void rt__pool_reset(rt_pool_t *p);
/* Moves the calling thread's lists to the depot (a thread going idle). */
void rt__pool_flush_thread(rt_pool_t *p);
/*
** Gives the calling thread's lists and the whole depot back through release: an idle
** scheduler's trim. Other threads' lists stay theirs.
*/
void rt__pool_trim(rt_pool_t *p);
/*
** Takes every object the depot holds of class k as one list (linked through word 0)
** and gives a list back, re-batched: for a pass that drops objects whose memory goes
** back to the OS (slab.c).
*/
void *rt__pool_take_depot(rt_pool_t *p, int k);
void rt__pool_give_depot(rt_pool_t *p, int k, void *list);

#endif

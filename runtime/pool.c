/*
** Size-class object pools (pool.h): per-thread free lists over a shared depot, and the
** flush of a thread's lists to the depot when the thread exits.
*/
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pool.h"

typedef struct {
    void *free[RT_POOL_CLASSES];
    uint32_t count[RT_POOL_CLASSES];
    uint64_t gen;
    rt_pool_t *pool; /* for the thread-exit flush */
} thread_cache_t;

static _Thread_local thread_cache_t caches[RT_POOL_MAX_POOLS];
static _Thread_local bool thread_registered;
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static inline void *link_of(void *o)
{
    return *(void **)o;
}

static inline void set_link(void *o, void *next)
{
    *(void **)o = next;
}

static inline void **batch_next(void *first)
{
    return (void **)first + 1;
}

/*
** A batch's length, in word 2 of its first object: a thread taking the batch learns it
** without walking the list, whose objects were last written on other cores (that walk
** was a third of the pool's cost in fan-in at 1 KB).
*/
static inline uintptr_t *batch_len(void *first)
{
    return (uintptr_t *)first + 2;
}

/* Puts a list of n objects of class k on the depot; the caller holds the lock. */
static void depot_push(rt_pool_t *p, int k, void *first, uint32_t n)
{
    RT_ASSERT(first && n >= 1 && n <= RT_POOL_CACHE_HIGH);
    *batch_next(first) = p->depot[k];
    *batch_len(first) = n;
    p->depot[k] = first;
    p->depot_batches[k]++;
}

/* Releases the objects of class k on list o. */
static void release_list(rt_pool_t *p, void *o, int k)
{
    while (o) {
        void *next = link_of(o);
        p->release(o);
        atomic_fetch_sub_explicit(&p->bytes_held, (size_t)k * p->step, memory_order_relaxed);
        o = next;
    }
}

/* Moves a thread's lists to the depot, or lets go of them if the pool was reset since. */
static void flush(thread_cache_t *c)
{
    rt_pool_t *p = c->pool;
    if (!p)
        return;
    bool stale = c->gen != atomic_load(&p->gen);
    if (!stale)
        pthread_mutex_lock(&p->lock);
    for (int k = 1; k < RT_POOL_CLASSES; k++) {
        void *first = c->free[k];
        uint32_t n = c->count[k];
        c->free[k] = NULL;
        c->count[k] = 0;
        if (!first)
            continue;
        if (stale) {
            /* Reset while this thread held them: malloc'd memory is still ours to free;
               slab memory is unmapped and must not be touched. */
            if (p->release)
                release_list(p, first, k);
        } else {
            depot_push(p, k, first, n);
        }
    }
    if (!stale)
        pthread_mutex_unlock(&p->lock);
    c->gen = atomic_load(&p->gen);
}

/* A thread's list of class k and its count agree on emptiness (the count is its length). */
#define RT_POOL_LIST_OK(c, k) (!(c)->free[(k)] == !(c)->count[(k)])

static void thread_exit(void *unused)
{
    (void)unused;
    for (int i = 0; i < RT_POOL_MAX_POOLS; i++)
        flush(&caches[i]);
}

static void exit_key_create(void)
{
    pthread_key_create(&exit_key, thread_exit);
}

static thread_cache_t *cache_of(rt_pool_t *p)
{
    RT_ASSERT(p->id < RT_POOL_MAX_POOLS);
    thread_cache_t *c = &caches[p->id];
    if (RT_UNLIKELY(!thread_registered)) {
        pthread_once(&exit_key_once, exit_key_create);
        pthread_setspecific(exit_key, caches);
        thread_registered = true;
    }
    if (RT_UNLIKELY(c->pool != p)) {
        RT_ASSERT(p->batch >= 1 && p->batch < p->cache_high && p->cache_high <= RT_POOL_CACHE_HIGH);
        c->pool = p;
        c->gen = atomic_load(&p->gen);
    }
    if (RT_UNLIKELY(c->gen != atomic_load_explicit(&p->gen, memory_order_relaxed)))
        flush(c);
    return c;
}

/* Fills an empty list: a batch from the depot, else freshly carved objects. */
static void refill(rt_pool_t *p, thread_cache_t *c, int k)
{
    RT_ASSERT(!c->free[k] && !c->count[k]); /* only an empty list is refilled */
    pthread_mutex_lock(&p->lock);
    void *b = p->depot[k];
    if (b) {
        RT_ASSERT(p->depot_batches[k] > 0); /* the count covers every batch on the chain */
        p->depot[k] = *batch_next(b);
        p->depot_batches[k]--;
    }
    pthread_mutex_unlock(&p->lock);
    if (b) {
        uint32_t n = (uint32_t)*batch_len(b);
        /* A batch is at most a thread's whole list, which spill keeps to the high mark. */
        RT_ASSERT(n >= 1 && n <= RT_POOL_CACHE_HIGH);
        c->free[k] = b;
        c->count[k] = n;
        return;
    }
    size_t size = (size_t)k * p->step;
    for (unsigned i = 0; i < p->batch; i++) {
        void *o = p->carve(p, size);
        if (!o)
            break;
        atomic_fetch_add_explicit(&p->bytes_held, size, memory_order_relaxed);
        set_link(o, c->free[k]);
        c->free[k] = o;
        c->count[k]++;
    }
}

static void spill(rt_pool_t *p, thread_cache_t *c, int k)
{
    RT_ASSERT(c->count[k] > p->batch); /* a batch goes and some stay */
    void *first = c->free[k], *last = first;
    for (unsigned i = 1; i < p->batch; i++)
        last = link_of(last);
    c->free[k] = link_of(last);
    c->count[k] -= p->batch;
    set_link(last, NULL);
    pthread_mutex_lock(&p->lock);
    bool keep = !p->release || !p->depot_max || p->depot_batches[k] < p->depot_max;
    if (keep)
        depot_push(p, k, first, p->batch);
    pthread_mutex_unlock(&p->lock);
    if (!keep)
        release_list(p, first, k);
}

void *rt__pool_carve_malloc(rt_pool_t *p, size_t size)
{
    (void)p;
    return malloc(size);
}

void *rt__pool_alloc(rt_pool_t *p, size_t size, uint8_t *cls)
{
    size_t k = (size + p->step - 1) / p->step;
    if (k >= RT_POOL_CLASSES) {
        *cls = RT_POOL_TOO_BIG;
        return malloc(size);
    }
    if (k == 0)
        k = 1;
    thread_cache_t *c = cache_of(p);
    if (!c->free[k])
        refill(p, c, (int)k);
    void *o = c->free[k];
    if (!o)
        return NULL;
    RT_ASSERT(RT_POOL_LIST_OK(c, k));
    c->free[k] = link_of(o);
    c->count[k]--;
    RT_ASSERT(RT_POOL_LIST_OK(c, k));
    /* The next object is most often one another core freed: its line is on the way
       by the next alloc of the class, which reads its link. */
    __builtin_prefetch(c->free[k], 1);
    *cls = (uint8_t)k;
    rt_striped_add(&p->bytes_in_use, (int64_t)(k * p->step));
    return o;
}

void rt__pool_free(rt_pool_t *p, void *obj, uint8_t cls)
{
    if (cls == RT_POOL_TOO_BIG) {
        free(obj);
        return;
    }
    RT_ASSERT(cls < RT_POOL_CLASSES); /* a class rt__pool_alloc gave out */
    thread_cache_t *c = cache_of(p);
    rt_striped_add(&p->bytes_in_use, -(int64_t)(cls * p->step));
    set_link(obj, c->free[cls]);
    c->free[cls] = obj;
    if (++c->count[cls] > p->cache_high)
        spill(p, c, cls);
    RT_ASSERT(RT_POOL_LIST_OK(c, cls) && c->count[cls] <= p->cache_high);
}

void rt__pool_flush_thread(rt_pool_t *p)
{
    flush(cache_of(p));
}

void rt__pool_trim(rt_pool_t *p)
{
    RT_ASSERT(p->release); /* slab memory goes back by pages, not objects (slab.c) */
    rt__pool_flush_thread(p);
    for (int k = 1; k < RT_POOL_CLASSES; k++)
        release_list(p, rt__pool_take_depot(p, k), k);
}

void *rt__pool_take_depot(rt_pool_t *p, int k)
{
    pthread_mutex_lock(&p->lock);
    void *b = p->depot[k], *list = NULL;
    p->depot[k] = NULL;
    p->depot_batches[k] = 0;
    pthread_mutex_unlock(&p->lock);
    while (b) {
        void *next_batch = *batch_next(b), *last = b;
        while (link_of(last))
            last = link_of(last);
        set_link(last, list);
        list = b;
        b = next_batch;
    }
    return list;
}

void rt__pool_give_depot(rt_pool_t *p, int k, void *list)
{
    while (list) {
        void *first = list, *last = list;
        uint32_t n = 1;
        for (; n < p->batch && link_of(last); n++)
            last = link_of(last);
        list = link_of(last);
        set_link(last, NULL);
        pthread_mutex_lock(&p->lock);
        depot_push(p, k, first, n);
        pthread_mutex_unlock(&p->lock);
    }
}

void rt__pool_reset(rt_pool_t *p)
{
    thread_cache_t *c = cache_of(p);
    flush(c);
    pthread_mutex_lock(&p->lock);
    for (int k = 1; k < RT_POOL_CLASSES; k++) {
        void *b = p->depot[k];
        while (b) {
            void *next_batch = *batch_next(b);
            if (p->release)
                release_list(p, b, k);
            b = next_batch;
        }
        p->depot[k] = NULL;
        p->depot_batches[k] = 0;
    }
    atomic_fetch_add(&p->gen, 1);
    pthread_mutex_unlock(&p->lock);
    c->gen = atomic_load(&p->gen);
}

/*
** Memory for actor structs. Spawning a million actors touches hundreds of
** megabytes for the first time. glibc grows a thread's arena one page (and one
** mprotect) at a time, and a first-touch 4 KiB fault costs ~18 us on the VMs
** we measure on, which made fresh memory most of the cost of a spawn. Actor
** structs therefore come from 2 MiB-aligned regions advised for transparent
** huge pages, in 32-byte size classes with no per-object header, through
** per-thread free lists and a shared depot.
**
** Slab memory is reused for later actors, not returned to the OS, until
** rt_shutdown unmaps it; rt_stats reports both what is mapped and what is in
** use, so a burst that has gone shows as mapped, not in use.
*/
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define RT_SLAB_STEP 32                       /* bytes between size classes */
#define RT_SLAB_CLASSES 33                    /* classes 1..32: up to 1 KiB */
#define RT_SLAB_MAX (RT_SLAB_STEP * (RT_SLAB_CLASSES - 1))
#define RT_SLAB_REGION (32u << 20)            /* bytes mapped at a time */
#define RT_SLAB_HUGE (2u << 20)               /* huge page size and region alignment */
#define RT_SLAB_MAX_REGIONS 4096              /* 128 GiB of actors */
#define RT_SLAB_CACHE_HIGH 1024               /* objects a thread keeps per class */
#define RT_SLAB_BATCH 256                     /* objects moved between thread and depot */
#define RT_SLAB_MALLOC 0                      /* class of objects too big for the slab */

typedef struct {
    void *free[RT_SLAB_CLASSES];
    uint32_t count[RT_SLAB_CLASSES];
    uint64_t gen; /* the slab generation these lists belong to */
} slab_cache_t;

static _Thread_local slab_cache_t cache;
static _Thread_local bool cache_registered;

static pthread_mutex_t slab_lock = PTHREAD_MUTEX_INITIALIZER;
static void *depot[RT_SLAB_CLASSES]; /* batches, chained through each batch's word 1 */
static char *bump, *bump_end;
static void *regions[RT_SLAB_MAX_REGIONS];
static unsigned nregions;
static atomic_uint_fast64_t slab_gen = 1; /* bumped when the slab is unmapped */
static atomic_size_t bytes_in_use, bytes_mapped;
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;

static inline void *link_of(void *p)
{
    return *(void **)p;
}

static inline void set_link(void *p, void *next)
{
    *(void **)p = next;
}

static inline void **batch_next(void *first)
{
    return (void **)first + 1;
}

/* Gives a thread's lists back to the depot (thread exit). */
static void cache_flush(void)
{
    if (cache.gen != atomic_load(&slab_gen)) {
        memset(&cache, 0, sizeof(cache)); /* that memory was unmapped: forget, never touch */
        cache.gen = atomic_load(&slab_gen);
        return;
    }
    pthread_mutex_lock(&slab_lock);
    for (int c = 1; c < RT_SLAB_CLASSES; c++) {
        if (cache.free[c]) {
            *batch_next(cache.free[c]) = depot[c];
            depot[c] = cache.free[c];
        }
        cache.free[c] = NULL;
        cache.count[c] = 0;
    }
    pthread_mutex_unlock(&slab_lock);
}

static void cache_thread_exit(void *unused)
{
    (void)unused;
    cache_flush();
}

static void cache_key_create(void)
{
    pthread_key_create(&cache_key, cache_thread_exit);
}

static void cache_check(void)
{
    if (RT_UNLIKELY(!cache_registered)) {
        pthread_once(&cache_key_once, cache_key_create);
        pthread_setspecific(cache_key, &cache);
        cache_registered = true;
        cache.gen = atomic_load(&slab_gen);
    }
    if (RT_UNLIKELY(cache.gen != atomic_load_explicit(&slab_gen, memory_order_relaxed)))
        cache_flush();
}

/* Caller holds slab_lock. */
static bool grow(void)
{
    if (nregions == RT_SLAB_MAX_REGIONS)
        return false;
    size_t len = RT_SLAB_REGION + RT_SLAB_HUGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    /* Trimmed to 2 MiB alignment so every huge page is whole. */
    char *aligned = (char *)(((uintptr_t)p + RT_SLAB_HUGE - 1) & ~(uintptr_t)(RT_SLAB_HUGE - 1));
    if (aligned > p)
        munmap(p, (size_t)(aligned - p));
    munmap(aligned + RT_SLAB_REGION, (size_t)(p + len - (aligned + RT_SLAB_REGION)));
    madvise(aligned, RT_SLAB_REGION, MADV_HUGEPAGE);
    regions[nregions++] = aligned;
    bump = aligned;
    bump_end = aligned + RT_SLAB_REGION;
    atomic_fetch_add(&bytes_mapped, RT_SLAB_REGION);
    return true;
}

/* Fills a thread's empty list: a batch from the depot, else carved from the region. */
static void refill(int c)
{
    size_t size = (size_t)c * RT_SLAB_STEP;
    pthread_mutex_lock(&slab_lock);
    void *b = depot[c];
    if (b) {
        depot[c] = *batch_next(b);
        pthread_mutex_unlock(&slab_lock);
        uint32_t n = 0;
        for (void *p = b; p; p = link_of(p))
            n++;
        cache.free[c] = b;
        cache.count[c] = n;
        return;
    }
    void *head = NULL;
    uint32_t n = 0;
    for (; n < RT_SLAB_BATCH; n++) {
        if ((size_t)(bump_end - bump) < size && !grow())
            break;
        void *p = bump;
        bump += size;
        set_link(p, head);
        head = p;
    }
    pthread_mutex_unlock(&slab_lock);
    cache.free[c] = head;
    cache.count[c] = n;
}

static void spill(int c)
{
    void *first = cache.free[c], *last = first;
    for (int i = 1; i < RT_SLAB_BATCH; i++)
        last = link_of(last);
    cache.free[c] = link_of(last);
    cache.count[c] -= RT_SLAB_BATCH;
    set_link(last, NULL);
    pthread_mutex_lock(&slab_lock);
    *batch_next(first) = depot[c];
    depot[c] = first;
    pthread_mutex_unlock(&slab_lock);
}

void *rt__slab_alloc(size_t size, uint8_t *cls)
{
    if (size > RT_SLAB_MAX) {
        *cls = RT_SLAB_MALLOC;
        return malloc(size);
    }
    int c = (int)((size + RT_SLAB_STEP - 1) / RT_SLAB_STEP);
    cache_check();
    if (!cache.free[c])
        refill(c);
    void *p = cache.free[c];
    if (!p)
        return NULL;
    cache.free[c] = link_of(p);
    cache.count[c]--;
    *cls = (uint8_t)c;
    atomic_fetch_add_explicit(&bytes_in_use, (size_t)c * RT_SLAB_STEP, memory_order_relaxed);
    return p;
}

void rt__slab_free(void *p, uint8_t cls)
{
    if (cls == RT_SLAB_MALLOC) {
        free(p);
        return;
    }
    cache_check();
    atomic_fetch_sub_explicit(&bytes_in_use, (size_t)cls * RT_SLAB_STEP, memory_order_relaxed);
    set_link(p, cache.free[cls]);
    cache.free[cls] = p;
    if (++cache.count[cls] > RT_SLAB_CACHE_HIGH)
        spill(cls);
}

void rt__slab_stats(size_t *mapped, size_t *in_use)
{
    *mapped = atomic_load(&bytes_mapped);
    *in_use = atomic_load(&bytes_in_use);
}

/* Shutdown only, when no other runtime thread is left: unmaps everything. */
void rt__slab_destroy(void)
{
    pthread_mutex_lock(&slab_lock);
    for (unsigned i = 0; i < nregions; i++)
        munmap(regions[i], RT_SLAB_REGION);
    nregions = 0;
    bump = bump_end = NULL;
    memset(depot, 0, sizeof(depot));
    atomic_store(&bytes_mapped, 0);
    atomic_fetch_add(&slab_gen, 1); /* every thread's lists are now stale */
    pthread_mutex_unlock(&slab_lock);
    memset(&cache, 0, sizeof(cache));
    cache.gen = atomic_load(&slab_gen);
}

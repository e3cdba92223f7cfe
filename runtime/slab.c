/*
** Memory for actor structs. Spawning a million actors touches hundreds of
** megabytes for the first time. glibc grows a thread's arena one page (and one
** mprotect) at a time, and a first-touch 4 KiB fault costs ~18 us on the VMs
** we measure on, which made fresh memory most of the cost of a spawn. Actor
** structs therefore come from a pool (pool.c) in 32-byte classes with no
** per-object header, carved from 2 MiB-aligned regions advised for
** transparent huge pages (one fault per 2 MiB).
**
** Slab memory is reused for later actors, not returned to the OS, until
** rt_shutdown unmaps it; rt_stats reports both what is mapped and what is in
** use, so a burst that has gone shows as mapped, not in use.
*/
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "pool.h"

#define RT_SLAB_STEP 32             /* bytes between size classes */
#define RT_SLAB_REGION (32u << 20)  /* bytes mapped at a time */
#define RT_SLAB_HUGE (2u << 20)     /* huge page size and region alignment */
#define RT_SLAB_MAX_REGIONS 4096    /* 128 GiB of actors */

static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static char *bump, *bump_end;
static void *regions[RT_SLAB_MAX_REGIONS];
static unsigned nregions;
static atomic_size_t bytes_mapped;

/* Caller holds region_lock. */
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

static void *carve(rt_pool_t *p, size_t size)
{
    (void)p;
    pthread_mutex_lock(&region_lock);
    void *o = NULL;
    if ((size_t)(bump_end - bump) >= size || grow()) {
        o = bump;
        bump += size;
    }
    pthread_mutex_unlock(&region_lock);
    return o;
}

static rt_pool_t actors = {
    .id = 1,
    .step = RT_SLAB_STEP,
    .carve = carve,
    .release = NULL,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

void *rt__slab_alloc(size_t size, uint8_t *cls)
{
    return rt__pool_alloc(&actors, size, cls);
}

void rt__slab_free(void *p, uint8_t cls)
{
    rt__pool_free(&actors, p, cls);
}

void rt__slab_stats(size_t *mapped, size_t *in_use)
{
    *mapped = atomic_load(&bytes_mapped);
    *in_use = atomic_load(&actors.bytes_in_use);
}

/* Shutdown only, when no other runtime thread is left: unmaps everything. */
void rt__slab_destroy(void)
{
    rt__pool_reset(&actors);
    pthread_mutex_lock(&region_lock);
    for (unsigned i = 0; i < nregions; i++)
        munmap(regions[i], RT_SLAB_REGION);
    nregions = 0;
    bump = bump_end = NULL;
    atomic_store(&bytes_mapped, 0);
    pthread_mutex_unlock(&region_lock);
}

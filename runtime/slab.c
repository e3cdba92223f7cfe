/*
** Memory for actor structs. Spawning a million actors touches hundreds of
** megabytes for the first time. glibc grows a thread's arena one page (and one
** mprotect) at a time, and a first-touch 4 KiB fault costs ~18 us on the VMs
** we measure on, which made fresh memory most of the cost of a spawn. Actor
** structs therefore come from a pool (pool.c) in 32-byte classes with no
** per-object header, carved from 2 MiB-aligned regions advised for
** transparent huge pages (one fault per 2 MiB).
**
** Memory goes back to the OS a huge page at a time. Objects are carved one page
** after another and never across a page's end (the few bytes left at a page's
** end are skipped), so a page whose carved bytes are all on free lists holds
** no live actor: rt__slab_trim finds such pages from the depot's lists, drops
** their objects from the lists, gives the pages back (MADV_DONTNEED) and
** carves them again, first, when actors come back. An idle scheduler calls it
** after a burst of actors has gone (sched.c), so rtd's RSS follows its
** connections down as well as up.
*/
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "pool.h"

#define RT_SLAB_STEP 32                               /* bytes between size classes */
#define RT_SLAB_REGION (32u << 20)                    /* bytes mapped at a time */
#define RT_SLAB_PAGE (2u << 20)                       /* huge page size and region alignment */
#define RT_SLAB_PAGES (RT_SLAB_REGION / RT_SLAB_PAGE) /* pages per region */
#define RT_SLAB_MAX_REGIONS 4096                      /* 128 GiB of actors */
#define RT_SLAB_MAX_PAGES (RT_SLAB_MAX_REGIONS * RT_SLAB_PAGES)

/* Everything below is guarded by region_lock. Pages are numbered region * RT_SLAB_PAGES + i. */
static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static char *regions[RT_SLAB_MAX_REGIONS];
static unsigned nregions;
static uint32_t next_fresh;                  /* pages below it have been carved at least once */
static uint32_t carved[RT_SLAB_MAX_PAGES];   /* bytes carved from each page since it was fresh */
static uint32_t released[RT_SLAB_MAX_PAGES]; /* pages given back, carved again first */
static uint32_t nreleased;
static char *bump, *bump_end;
static uint32_t bump_page; /* the page being carved; valid while bump_end != NULL */
static atomic_size_t bytes_mapped;
static atomic_size_t bytes_released;

static inline char *page_addr(uint32_t page)
{
    return regions[page / RT_SLAB_PAGES] + (size_t)(page % RT_SLAB_PAGES) * RT_SLAB_PAGE;
}

static bool grow(void)
{
    if (nregions == RT_SLAB_MAX_REGIONS)
        return false;
    size_t len = RT_SLAB_REGION + RT_SLAB_PAGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    /* Trimmed to 2 MiB alignment so every huge page is whole. */
    char *aligned = (char *)(((uintptr_t)p + RT_SLAB_PAGE - 1) & ~(uintptr_t)(RT_SLAB_PAGE - 1));
    if (aligned > p)
        munmap(p, (size_t)(aligned - p));
    munmap(aligned + RT_SLAB_REGION, (size_t)(p + len - (aligned + RT_SLAB_REGION)));
    madvise(aligned, RT_SLAB_REGION, MADV_HUGEPAGE);
    regions[nregions++] = aligned;
    atomic_fetch_add(&bytes_mapped, RT_SLAB_REGION);
    return true;
}

/* Moves the bump range to the next page: one given back, else a fresh one. */
static bool next_page(void)
{
    uint32_t page;
    if (nreleased) {
        page = released[--nreleased];
        atomic_fetch_sub(&bytes_released, RT_SLAB_PAGE);
    } else {
        if (next_fresh == nregions * RT_SLAB_PAGES && !grow())
            return false;
        page = next_fresh++;
    }
    bump_page = page;
    bump = page_addr(page);
    bump_end = bump + RT_SLAB_PAGE;
    return true;
}

static void *carve(rt_pool_t *p, size_t size)
{
    (void)p;
    pthread_mutex_lock(&region_lock);
    void *o = NULL;
    if ((size_t)(bump_end - bump) >= size || next_page()) {
        o = bump;
        bump += size;
        carved[bump_page] += (uint32_t)size;
    }
    pthread_mutex_unlock(&region_lock);
    return o;
}

static rt_pool_t actors = {
    .id = 1,
    .step = RT_SLAB_STEP,
    .batch = 256,
    .cache_high = RT_POOL_CACHE_HIGH,
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
    /* Pages given back stay mapped (as address space) but hold no memory. */
    *mapped = atomic_load(&bytes_mapped) - atomic_load(&bytes_released);
    *in_use = (size_t)rt_striped_sum(&actors.bytes_in_use);
}

size_t rt__slab_idle_bytes(void)
{
    size_t mapped, in_use;
    rt__slab_stats(&mapped, &in_use);
    size_t untouched = 0;
    pthread_mutex_lock(&region_lock);
    untouched =
        (size_t)(nregions * RT_SLAB_PAGES - next_fresh) * RT_SLAB_PAGE + (size_t)(bump_end - bump);
    pthread_mutex_unlock(&region_lock);
    size_t held = mapped > untouched ? mapped - untouched : 0;
    return held > in_use ? held - in_use : 0;
}

typedef struct {
    char *base;
    uint32_t region;
} region_ref_t;

static int cmp_region(const void *a, const void *b)
{
    const region_ref_t *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* The page holding o, from regions sorted by address (the first n, which stay put). */
static uint32_t page_of(const region_ref_t *sorted, unsigned n, const char *o)
{
    unsigned lo = 0, hi = n;
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (sorted[mid].base <= o)
            lo = mid;
        else
            hi = mid;
    }
    RT_ASSERT(o >= sorted[lo].base && o < sorted[lo].base + RT_SLAB_REGION);
    return sorted[lo].region * RT_SLAB_PAGES +
           (uint32_t)((size_t)(o - sorted[lo].base) / RT_SLAB_PAGE);
}

void rt__slab_flush_thread(void)
{
    rt__pool_flush_thread(&actors);
}

/*
** The lock is held only to read the regions and to pick the pages: the trimmer runs at a low
** priority, and a scheduler carving an actor waited up to 54 ms while the trimmer, preempted,
** held it through the count of 19,000 free objects. A picked page is reachable by no carve
** (carved 0, not yet in released) and its objects are in our lists, so it is given back
** without the lock and published afterwards.
*/
size_t rt__slab_trim(void)
{
    rt__pool_flush_thread(&actors);
    void *lists[RT_POOL_CLASSES] = {0};
    for (int k = 1; k < RT_POOL_CLASSES; k++)
        lists[k] = rt__pool_take_depot(&actors, k);

    /* Regions are only appended, so the first n stay as they are without the lock. */
    pthread_mutex_lock(&region_lock);
    unsigned n = nregions;
    uint32_t pages = next_fresh;
    pthread_mutex_unlock(&region_lock);
    size_t given_back = 0;
    region_ref_t *sorted = malloc(n * sizeof(*sorted));
    uint32_t *free_bytes = calloc((size_t)n * RT_SLAB_PAGES, sizeof(*free_bytes));
    if (n && sorted && free_bytes) {
        for (unsigned i = 0; i < n; i++)
            sorted[i] = (region_ref_t){regions[i], i};
        qsort(sorted, n, sizeof(*sorted), cmp_region);
        for (int k = 1; k < RT_POOL_CLASSES; k++)
            for (void *o = lists[k]; o; o = *(void **)o)
                free_bytes[page_of(sorted, n, o)] += (uint32_t)(k * RT_SLAB_STEP);
        pthread_mutex_lock(&region_lock);
        for (uint32_t page = 0; page < pages; page++) {
            if (!carved[page] || free_bytes[page] != carved[page]) {
                free_bytes[page] = 0; /* from here on: nonzero marks a page to give back */
                continue;
            }
            if (bump_end && page == bump_page)
                bump = bump_end = NULL; /* the page being carved: the next carve moves on */
            carved[page] = 0;
            given_back += RT_SLAB_PAGE;
        }
        pthread_mutex_unlock(&region_lock);
    }
    if (given_back) {
        /* Off the lists first: the lists run through the objects, and a page given back
           reads as zeros. */
        for (int k = 1; k < RT_POOL_CLASSES; k++) {
            void **link = &lists[k];
            while (*link) {
                void *o = *link;
                if (free_bytes[page_of(sorted, n, o)])
                    *link = *(void **)o;
                else
                    link = (void **)o;
            }
        }
        for (uint32_t page = 0; page < pages; page++)
            if (free_bytes[page])
                madvise(page_addr(page), RT_SLAB_PAGE, MADV_DONTNEED);
        pthread_mutex_lock(&region_lock);
        for (uint32_t page = 0; page < pages; page++)
            if (free_bytes[page])
                released[nreleased++] = page;
        atomic_fetch_add(&bytes_released, given_back);
        pthread_mutex_unlock(&region_lock);
    }
    free(sorted);
    free(free_bytes);
    for (int k = 1; k < RT_POOL_CLASSES; k++)
        rt__pool_give_depot(&actors, k, lists[k]);
    return given_back;
}

/* Regions are advised for huge pages: a touched one may be in memory 2 MiB at a time. */
size_t rt__slab_resident(void)
{
    size_t in = 0;
    pthread_mutex_lock(&region_lock);
    for (unsigned i = 0; i < nregions; i++)
        in += rt__resident(regions[i], RT_SLAB_REGION);
    pthread_mutex_unlock(&region_lock);
    return in;
}

/* Shutdown only, when no other runtime thread is left: unmaps everything. */
void rt__slab_destroy(void)
{
    rt__pool_reset(&actors);
    pthread_mutex_lock(&region_lock);
    for (unsigned i = 0; i < nregions; i++)
        munmap(regions[i], RT_SLAB_REGION);
    nregions = 0;
    memset(carved, 0, (size_t)next_fresh * sizeof(carved[0]));
    next_fresh = nreleased = 0;
    bump = bump_end = NULL;
    atomic_store(&bytes_mapped, 0);
    atomic_store(&bytes_released, 0);
    pthread_mutex_unlock(&region_lock);
}

/*
** Per-actor heaps, the process-wide chunk pool under them, and shared binaries.
** The contract is in heap.h; this comment describes the layout.
**
** Memory comes from the OS in arenas of RT_HEAP_ARENA_SIZE bytes, aligned to
** their size. An arena is cut into chunks of RT_HEAP_CHUNK_SIZE bytes; the
** first RT_HEAP_META_CHUNKS chunks hold a 64-byte descriptor (chunk_t) for
** every chunk of the arena, and descriptor 0 is the arena header. So from any
** address inside an arena, align-down gives the arena and the offset gives
** the chunk and its descriptor: owner heap, size class and slot bitmaps.
** Object memory carries no header at all; a slot is allocated, marked, to be
** scanned or a binary handle when its bit is set in the descriptor.
**
** A chunk holds objects of one size class and belongs to one heap. Heaps get
** and return chunks through a per-thread cache (no lock) that exchanges
** batches with the global pool (one mutex). An arena whose chunks are all free
** is unmapped, except for one spare kept to absorb churn; rt_heap_pool_trim()
** unmaps the spare too and gives back the pages of free chunks in the other
** arenas. A process-wide bitmap of our arenas tells rt_heap_free a small
** object from a large one.
**
** Large objects (above the largest class) are calloc'ed one by one with a
** header that links them on their heap's list.
**
** Before a class has a chunk, its objects go to the first block in the heap
** header (heap.h), 16-byte granules with their bitmaps in the header; the
** collector tells its addresses apart by range, before any arena lookup.
**
** Collection marks from the roots with an explicit, thread-local stack and
** sweeps chunk by chunk with bitmap operations. To decide whether a word
** points into this heap without ever reading memory that may be unmapped, a
** collection first lists the arenas holding this heap's chunks (sorted) and
** its large objects (sorted by address): a candidate word is looked up in
** those lists before any descriptor is read. An arena listed there cannot be
** unmapped during the collection, because this heap owns a chunk in it, and a
** descriptor's owner field is atomic because other threads write it while
** their heaps take and give back chunks of the same arena.
*/
#define _GNU_SOURCE
#include "heap.h"
#include "internal.h"
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/*
** Under AddressSanitizer, free slots and pooled chunks are poisoned so that
** actor code touching a freed object is caught, as it would be with malloc.
** Anything about to be memset, handed to munmap or reused must be unpoisoned
** first.
*/
#if defined(__SANITIZE_ADDRESS__)
#define RT_HEAP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RT_HEAP_ASAN 1
#endif
#endif
#ifdef RT_HEAP_ASAN
#include <sanitizer/asan_interface.h>
#define RT_HEAP_NOACCESS(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define RT_HEAP_ACCESS(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define RT_HEAP_NOACCESS(p, n) ((void)(p), (void)(n))
#define RT_HEAP_ACCESS(p, n) ((void)(p), (void)(n))
#endif

/*
** Chunks are 1 KiB. One chunk exists per (actor, size class) that outgrew the
** first block and there may be a million actors, so the chunk is the unit a
** busy actor pays for; 1 KiB still holds 64 of the smallest objects, so one 64-bit word is a whole
** slot bitmap, and it keeps slot waste in the larger classes small (Pony's
** heap uses 1 KiB chunks for the same reasons).
*/
#define RT_HEAP_CHUNK_SHIFT 10
_Static_assert(RT_HEAP_CHUNK_SIZE == (size_t)1 << RT_HEAP_CHUNK_SHIFT, "heap.h has the chunk size");

/*
** Arenas are 1 MiB: big enough that mmap calls and the pool lock are rare
** (960 chunks per arena), small enough that a spare arena costs little and
** that emptied arenas actually occur and can be unmapped.
*/
#define RT_HEAP_ARENA_SHIFT 20
#define RT_HEAP_ARENA_SIZE ((size_t)1 << RT_HEAP_ARENA_SHIFT)
#define RT_HEAP_ARENA_CHUNKS (RT_HEAP_ARENA_SIZE / RT_HEAP_CHUNK_SIZE)
#define RT_HEAP_META_SIZE 64 /* bytes of descriptor per chunk */
#define RT_HEAP_META_CHUNKS (RT_HEAP_ARENA_CHUNKS * RT_HEAP_META_SIZE / RT_HEAP_CHUNK_SIZE)
#define RT_HEAP_DATA_CHUNKS (RT_HEAP_ARENA_CHUNKS - RT_HEAP_META_CHUNKS)

/* Per-thread chunk cache: at most this many chunks, exchanged with the pool this many at a time. */
#define RT_HEAP_CACHE_MAX 64
#define RT_HEAP_CACHE_BATCH 32

/* User-space addresses have at most this many bits (x86-64 and arm64 with 4-level tables). */
#define RT_HEAP_ADDR_BITS 47

/*
** The footprint rule collects once heap_bytes + bin bytes come within 1/16
** of the trigger: the runtime only checks between messages, and this leaves
** room for what one message allocates before the footprint passes gc_factor x live.
*/
#define RT_HEAP_HEADROOM_SHIFT 4

#define RT_HEAP_NCLASSES 10
#define RT_HEAP_MAX_SMALL 1024

_Static_assert(sizeof(rt_heap_t) <= 176 + RT_HEAP_FIRST,
               "rt_heap_t is made for every actor that allocates");
_Static_assert(RT_HEAP_FIRST / RT_HEAP_GRANULE <= 16, "first block bitmaps are 16 bits");
_Static_assert(RT_HEAP_NCLASSES == sizeof(((rt_heap_t *)0)->avail) / sizeof(void *),
               "one avail list per size class");
_Static_assert(_Alignof(max_align_t) >= 16, "calloc must return 16-byte aligned memory");

/*
** Size classes in object bytes. Every size is a multiple of 16 so every slot
** is 16-byte aligned; a chunk holds 64, 32, 21, 16, 10, 8, 5, 4, 2 and 1 of
** them, leaving at most 64 bytes of a chunk unused.
*/
static const uint16_t class_size[RT_HEAP_NCLASSES] = {16, 32, 48, 64, 96, 128, 192, 256, 512, 1024};

/*
** Slot index of a chunk offset without a division: (off * magic) >> 22 equals
** off / size for every off < 1024 and size < 4096 (the error term stays below
** 1024 / 2^22 < 1 / size); debug builds check every offset of every class
** when the first arena is mapped.
*/
#define RT_HEAP_MAGIC_SHIFT 22
#define RT_HEAP_MAGIC(s) ((((uint32_t)1 << RT_HEAP_MAGIC_SHIFT) + (s)-1) / (s))
static const uint32_t class_magic[RT_HEAP_NCLASSES] = {
    RT_HEAP_MAGIC(16),  RT_HEAP_MAGIC(32),   RT_HEAP_MAGIC(48),  RT_HEAP_MAGIC(64),
    RT_HEAP_MAGIC(96),  RT_HEAP_MAGIC(128),  RT_HEAP_MAGIC(192), RT_HEAP_MAGIC(256),
    RT_HEAP_MAGIC(512), RT_HEAP_MAGIC(1024),
};

/* Size class of a size, indexed by (size + 15) / 16. */
static const uint8_t class_of[RT_HEAP_MAX_SMALL / 16 + 1] = {
    [0 ... 1] = 0, [2] = 1,        [3] = 2,         [4] = 3,         [5 ... 6] = 4,
    [7 ... 8] = 5, [9 ... 12] = 6, [13 ... 16] = 7, [17 ... 32] = 8, [33 ... 64] = 9,
};

/*
** Chunk descriptor. owner is written by the thread of the heap taking or
** giving back the chunk and read by any collection whose candidate word falls
** in the chunk, hence atomic; a collection reads the other fields only once
** owner says the chunk is its own. next/prev link the chunk on its heap's
** lists, or next on its arena's free list while it is in the pool (under the
** pool lock).
*/
typedef struct chunk_s {
    _Atomic(rt_heap_t *) owner; /* heap owning the chunk; NULL while free */
    struct chunk_s *next;
    struct chunk_s *prev;
    uint64_t alloc; /* slots holding an object */
    uint64_t mark;  /* slots reached by the running collection; 0 outside one */
    uint64_t scan;  /* RT_OBJ_SCAN slots, a subset of alloc */
    uint64_t bin;   /* binary handle slots, a subset of alloc */
    uint8_t cls;    /* size class */
    uint8_t full;   /* on the heap's full list rather than avail[cls] */
} chunk_t;

/* Arena header, in descriptor 0. Every field is guarded by the pool lock. */
typedef struct arena_s {
    struct arena_s *next; /* partial list: arenas with free and used chunks */
    struct arena_s *prev;
    chunk_t *free;  /* chunks given back, linked by next */
    uint32_t nfree; /* free chunks, never-used ones included */
    uint32_t fresh; /* index of the first never-used chunk */
} arena_t;

_Static_assert(sizeof(chunk_t) <= RT_HEAP_META_SIZE, "chunk descriptor too big");
_Static_assert(sizeof(arena_t) <= RT_HEAP_META_SIZE, "arena header too big");

/* Large object header; the object follows it, 16-byte aligned. */
typedef struct large_s {
    struct large_s *next;
    struct large_s *prev;
    size_t size;   /* object bytes, a multiple of 16 */
    uint32_t scan; /* RT_OBJ_SCAN */
    uint32_t mark; /* reached by the running collection */
} large_t;

_Static_assert(sizeof(large_t) % 16 == 0, "large objects must stay 16-byte aligned");

struct rt_bin_s {
    atomic_uint refs;
    uint32_t tail_len; /* bytes after data[len] (rt_bin_alloc_tail); in the header's padding */
    size_t len;
    uint8_t data[]; /* 16-byte aligned: the header is 16 bytes and malloc aligns to 16 */
};

_Static_assert(sizeof(struct rt_bin_s) == 16, "binary data must stay 16-byte aligned");

/*
** Heap counters belong to the owner's thread, but rt_heap_stats may read them
** from any thread (rtctl sampling every actor). The owner writes them with
** relaxed single-word stores and readers load them the same way: that costs
** nothing over plain moves and keeps the sampling race-free. The owner's own
** reads stay plain, since no other thread writes these fields.
*/
#define RT_HEAP_SET(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELAXED)
#define RT_HEAP_GET(f) __atomic_load_n(&(f), __ATOMIC_RELAXED)
#define RT_HEAP_ADD(f, v) RT_HEAP_SET(f, (f) + (v))
#define RT_HEAP_SUB(f, v) RT_HEAP_SET(f, (f) - (v))

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */

/* Written by rt_heap_configure before any actor runs, read-only afterwards. */
static size_t cfg_min_heap = RT_HEAP_MIN_HEAP_DEFAULT;
static double cfg_gc_factor = RT_HEAP_GC_FACTOR_DEFAULT;

void rt_heap_configure(const rt_heap_config_t *cfg)
{
    if (cfg->min_heap > 0)
        cfg_min_heap = cfg->min_heap;
    if (cfg->gc_factor > 1.0)
        cfg_gc_factor = cfg->gc_factor;
}

/* ------------------------------------------------------------------------ */
/* Descriptor arithmetic                                                    */

static inline uintptr_t arena_base(const void *p)
{
    return (uintptr_t)p & ~(RT_HEAP_ARENA_SIZE - 1);
}

static inline chunk_t *chunk_meta(uintptr_t arena, size_t idx)
{
    return (chunk_t *)(arena + idx * RT_HEAP_META_SIZE);
}

static inline size_t chunk_index(const chunk_t *c)
{
    return ((uintptr_t)c & (RT_HEAP_ARENA_SIZE - 1)) / RT_HEAP_META_SIZE;
}

static inline char *chunk_data(const chunk_t *c)
{
    return (char *)(arena_base(c) + chunk_index(c) * RT_HEAP_CHUNK_SIZE);
}

static inline chunk_t *chunk_of(const void *p)
{
    uintptr_t a = arena_base(p);
    return chunk_meta(a, ((uintptr_t)p - a) >> RT_HEAP_CHUNK_SHIFT);
}

static inline unsigned slot_of(unsigned cls, uintptr_t p)
{
    uint32_t off = (uint32_t)(p & (RT_HEAP_CHUNK_SIZE - 1));
    return (off * class_magic[cls]) >> RT_HEAP_MAGIC_SHIFT;
}

/* Slot bits in use per class: all slots allocated means alloc == this mask. */
#define RT_HEAP_MASK(n) ((n) == 64 ? ~(uint64_t)0 : ((uint64_t)1 << ((n) % 64)) - 1)
static const uint64_t class_masks[RT_HEAP_NCLASSES] = {
    RT_HEAP_MASK(64), RT_HEAP_MASK(32), RT_HEAP_MASK(21), RT_HEAP_MASK(16), RT_HEAP_MASK(10),
    RT_HEAP_MASK(8),  RT_HEAP_MASK(5),  RT_HEAP_MASK(4),  RT_HEAP_MASK(2),  RT_HEAP_MASK(1),
};

static inline uint64_t class_mask(unsigned cls)
{
    return class_masks[cls];
}

/* ------------------------------------------------------------------------ */
/* Arena map                                                                */

/*
** One bit per arena-sized stretch of the address space says "this is one of
** our arenas". rt_heap_free uses it to tell a small object from a large one:
** for a live object the answer cannot change under it, since the object's
** arena stays mapped while it holds the object. The bitmap is 16 MiB of
** MAP_NORESERVE address space of which only the pages covering our arenas are
** ever written (untouched pages read as zero).
*/
#define RT_HEAP_MAP_WORDS (((size_t)1 << (RT_HEAP_ADDR_BITS - RT_HEAP_ARENA_SHIFT)) / 64)

static _Atomic(uint64_t *) arena_map;
static pthread_once_t arena_map_once = PTHREAD_ONCE_INIT;

static void arena_map_init(void)
{
#ifndef NDEBUG
    for (unsigned k = 0; k < RT_HEAP_NCLASSES; k++) {
        size_t slots = RT_HEAP_CHUNK_SIZE / class_size[k];
        RT_ASSERT(class_masks[k] == (slots == 64 ? ~(uint64_t)0 : ((uint64_t)1 << slots) - 1));
        RT_ASSERT(class_of[(class_size[k] + 15) >> 4] == k);
        for (uint32_t off = 0; off < RT_HEAP_CHUNK_SIZE; off++)
            RT_ASSERT(slot_of(k, off) == off / class_size[k]);
    }
#endif
    void *p = mmap(NULL, RT_HEAP_MAP_WORDS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED)
        atomic_store_explicit(&arena_map, p, memory_order_release);
}

static void arena_map_set(uintptr_t a, bool on)
{
    uint64_t *map = atomic_load_explicit(&arena_map, memory_order_acquire);
    size_t i = a >> RT_HEAP_ARENA_SHIFT;
    uint64_t bit = (uint64_t)1 << (i & 63);
    if (on)
        __atomic_fetch_or(&map[i / 64], bit, __ATOMIC_RELAXED);
    else
        __atomic_fetch_and(&map[i / 64], ~bit, __ATOMIC_RELAXED);
}

static bool arena_map_has(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint64_t *map = atomic_load_explicit(&arena_map, memory_order_acquire);
    if (!map || (a >> RT_HEAP_ADDR_BITS))
        return false;
    size_t i = a >> RT_HEAP_ARENA_SHIFT;
    return (__atomic_load_n(&map[i / 64], __ATOMIC_RELAXED) >> (i & 63)) & 1;
}

/* ------------------------------------------------------------------------ */
/* Global chunk pool                                                        */

static struct {
    pthread_mutex_t lock;
    arena_t partial; /* sentinel of a circular list of arenas with free and used chunks */
    arena_t *spare;  /* one arena with every chunk free, kept to absorb churn */
    size_t arenas;   /* arenas mapped */
    size_t out;      /* chunks handed to thread caches and heaps */
    _Atomic uint64_t returned; /* chunks given back, ever: read without the lock */
} pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .partial = {.next = &pool.partial, .prev = &pool.partial},
};

static void partial_add_tail(arena_t *a)
{
    a->prev = pool.partial.prev;
    a->next = &pool.partial;
    a->prev->next = a;
    pool.partial.prev = a;
}

static void partial_del(arena_t *a)
{
    a->prev->next = a->next;
    a->next->prev = a->prev;
    a->next = a->prev = NULL;
}

static void arena_reset(arena_t *a)
{
    a->free = NULL;
    a->nfree = RT_HEAP_DATA_CHUNKS;
    a->fresh = RT_HEAP_META_CHUNKS;
}

/* Maps a new arena aligned to its size, outside the pool lock. */
static arena_t *arena_new(void)
{
    pthread_once(&arena_map_once, arena_map_init);
    if (!atomic_load_explicit(&arena_map, memory_order_acquire))
        return NULL;
    size_t len = 2 * RT_HEAP_ARENA_SIZE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + RT_HEAP_ARENA_SIZE - 1) & ~(RT_HEAP_ARENA_SIZE - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (p + len > a + RT_HEAP_ARENA_SIZE)
        munmap(a + RT_HEAP_ARENA_SIZE, (size_t)(p + len - (a + RT_HEAP_ARENA_SIZE)));
    if ((uintptr_t)a >> RT_HEAP_ADDR_BITS) {
        munmap(a, RT_HEAP_ARENA_SIZE);
        return NULL;
    }
    arena_t *ar = (arena_t *)a;
    arena_reset(ar);
    arena_map_set((uintptr_t)a, true);
    return ar;
}

static chunk_t *arena_take(arena_t *a)
{
    chunk_t *c = a->free;
    if (c)
        a->free = c->next;
    else
        c = chunk_meta((uintptr_t)a, a->fresh++);
    a->nfree--;
    return c;
}

/* Takes up to n chunks from the pool into out; returns how many (0 only when out of memory). */
static size_t pool_get(chunk_t **out, size_t n)
{
    size_t got = 0;
    pthread_mutex_lock(&pool.lock);
    while (got < n) {
        arena_t *a = pool.partial.next;
        if (a == &pool.partial) {
            a = pool.spare;
            if (a) {
                pool.spare = NULL;
            } else {
                /* The lock is not held across mmap; another thread may add arenas meanwhile. */
                pthread_mutex_unlock(&pool.lock);
                a = arena_new();
                pthread_mutex_lock(&pool.lock);
                if (!a)
                    break;
                pool.arenas++;
            }
            partial_add_tail(a);
        }
        while (got < n && a->nfree)
            out[got++] = arena_take(a);
        if (!a->nfree)
            partial_del(a);
    }
    pool.out += got;
    pthread_mutex_unlock(&pool.lock);
    return got;
}

/* An arena with every chunk free leaves the partial list: it becomes the spare, or (true)
   the caller unmaps it outside the lock. Called with the lock held. */
static bool arena_retire(arena_t *a)
{
    RT_ASSERT(a->nfree == RT_HEAP_DATA_CHUNKS);
    partial_del(a);
    arena_reset(a);
    if (!pool.spare) {
        pool.spare = a;
        return false;
    }
    arena_map_set((uintptr_t)a, false);
    pool.arenas--;
    return true;
}

/* Gives n free chunks back; arenas left completely free beyond one spare are unmapped. */
static void pool_put(chunk_t **chunks, size_t n)
{
    arena_t *unmap[RT_HEAP_CACHE_MAX];
    size_t nunmap = 0;
    RT_ASSERT(n <= RT_HEAP_CACHE_MAX);
    pthread_mutex_lock(&pool.lock);
    for (size_t i = 0; i < n; i++) {
        chunk_t *c = chunks[i];
        arena_t *a = (arena_t *)arena_base(c);
        c->next = a->free;
        a->free = c;
        if (++a->nfree == 1)
            partial_add_tail(a);
        if (a->nfree == RT_HEAP_DATA_CHUNKS && arena_retire(a))
            unmap[nunmap++] = a;
    }
    pool.out -= n;
    atomic_fetch_add_explicit(&pool.returned, n, memory_order_relaxed);
    pthread_mutex_unlock(&pool.lock);
    for (size_t i = 0; i < nunmap; i++) {
        RT_HEAP_ACCESS(unmap[i], RT_HEAP_ARENA_SIZE);
        munmap(unmap[i], RT_HEAP_ARENA_SIZE);
    }
}

uint64_t rt_heap_pool_returned(void)
{
    return atomic_load_explicit(&pool.returned, memory_order_relaxed);
}

void rt_heap_pool_stats(size_t *mapped_bytes, size_t *in_use_bytes)
{
    pthread_mutex_lock(&pool.lock);
    size_t mapped = pool.arenas * RT_HEAP_ARENA_SIZE;
    size_t in_use = pool.out * RT_HEAP_CHUNK_SIZE;
    pthread_mutex_unlock(&pool.lock);
    if (mapped_bytes)
        *mapped_bytes = mapped;
    if (in_use_bytes)
        *in_use_bytes = in_use;
}

/*
** The map says where the arenas are: only its pages in memory can hold a set bit, and
** mincore tells those apart, so the walk reads a few pages, not 16 MiB. An arena
** unmapped meanwhile counts as not in memory (mincore fails on it, and faults nothing).
*/
void rt_heap_pool_resident(size_t *arenas, size_t *map_mapped, size_t *map_resident)
{
    enum { RUN = 4096 };
    *arenas = *map_mapped = *map_resident = 0;
    uint64_t *map = atomic_load_explicit(&arena_map, memory_order_acquire);
    if (!map)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), words = page / sizeof(uint64_t);
    size_t pages = RT_HEAP_MAP_WORDS / words;
    unsigned char vec[RUN];
    *map_mapped = RT_HEAP_MAP_WORDS * sizeof(uint64_t);
    for (size_t p0 = 0; p0 < pages; p0 += RUN) {
        size_t n = pages - p0 < RUN ? pages - p0 : RUN;
        if (mincore(map + p0 * words, n * page, vec) != 0)
            return;
        for (size_t i = 0; i < n; i++) {
            if (!(vec[i] & 1))
                continue;
            *map_resident += page;
            for (size_t w = (p0 + i) * words; w < (p0 + i + 1) * words; w++)
                for (uint64_t bits = __atomic_load_n(&map[w], __ATOMIC_RELAXED); bits;
                     bits &= bits - 1) {
                    uintptr_t a = (uintptr_t)(w * 64 + (size_t)__builtin_ctzll(bits))
                                  << RT_HEAP_ARENA_SHIFT;
                    *arenas += rt__resident((void *)a, RT_HEAP_ARENA_SIZE);
                }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Per-thread state: chunk cache and collector buffers                      */

/*
** A collection's working set. It lives in thread-local storage and keeps its
** buffers between collections, so a steady-state collection allocates nothing.
*/
typedef struct mark_item_s {
    const char *p;
    size_t n;
} mark_item_t;

struct rt_gc_s {
    rt_heap_t *heap;      /* heap being collected; NULL outside a collection */
    uintptr_t first;      /* heap->first */
    uintptr_t arena_lo;   /* lowest arena holding a chunk of heap */
    uintptr_t arena_span; /* bytes from arena_lo to the end of the highest such arena */
    uintptr_t last_arena; /* arena of the last hit, a one-entry cache */
    uintptr_t *arenas;    /* sorted, distinct arenas holding chunks of heap */
    size_t narenas, arenas_cap;
    large_t **large; /* heap's large objects sorted by address */
    size_t nlarge, large_cap;
    uintptr_t large_lo, large_span;
    mark_item_t *stack; /* SCAN objects marked but not yet scanned */
    size_t sp, stack_cap;
    bool failed; /* a buffer could not grow: nothing may be freed */
};

typedef struct tcache_s {
    size_t n;
    bool armed; /* the exit destructor is registered for this thread */
    chunk_t *c[RT_HEAP_CACHE_MAX];
} tcache_t;

static __thread tcache_t tcache;
static __thread rt_gc_t tgc;
static pthread_key_t tkey;
static pthread_once_t tkey_once = PTHREAD_ONCE_INIT;

static void thread_exit(void *unused)
{
    (void)unused;
    /* Disarmed so that a later use by another destructor registers this one again. */
    tcache.armed = false;
    rt_heap_thread_flush();
}

static void tkey_init(void)
{
    pthread_key_create(&tkey, thread_exit);
}

static void tcache_arm(void)
{
    pthread_once(&tkey_once, tkey_init);
    pthread_setspecific(tkey, &tcache);
    tcache.armed = true;
}

static chunk_t *chunk_get(void)
{
    tcache_t *tc = &tcache;
    if (RT_UNLIKELY(tc->n == 0)) {
        if (!tc->armed)
            tcache_arm();
        tc->n = pool_get(tc->c, RT_HEAP_CACHE_BATCH);
        if (!tc->n)
            return NULL;
    }
    return tc->c[--tc->n];
}

/* The chunk's owner must already be NULL. The oldest cached chunks go back first. */
static void chunk_put(chunk_t *c)
{
    tcache_t *tc = &tcache;
    if (RT_UNLIKELY(!tc->armed))
        tcache_arm();
    if (RT_UNLIKELY(tc->n == RT_HEAP_CACHE_MAX)) {
        pool_put(tc->c, RT_HEAP_CACHE_BATCH);
        memmove(tc->c, tc->c + RT_HEAP_CACHE_BATCH,
                (RT_HEAP_CACHE_MAX - RT_HEAP_CACHE_BATCH) * sizeof(chunk_t *));
        tc->n -= RT_HEAP_CACHE_BATCH;
    }
    tc->c[tc->n++] = c;
}

void rt_heap_thread_flush(void)
{
    tcache_t *tc = &tcache;
    if (tc->n)
        pool_put(tc->c, tc->n);
    tc->n = 0;
    rt_gc_t *gc = &tgc;
    RT_ASSERT(!gc->heap);
    free(gc->arenas);
    free(gc->large);
    free(gc->stack);
    memset(gc, 0, sizeof *gc);
}

/*
** Gives the OS back the pages of an arena's free chunks, so a pool left
** fragmented by actors that exited in random order still shrinks in RSS. The
** free list lives in the descriptors, so free chunk memory is not needed.
*/
/*
** The pages of an arena's free chunks back to the OS. The chunks are taken off the arena
** (free list and never-used tail) under the lock and the madvise runs without it: the
** trimmer runs at a low priority, and a scheduler that wanted a chunk while the trimmer,
** preempted, held the lock through one arena's madvise waited 2-47 ms at a time (measured
** after 19,000 XMPP sessions hibernated during a login storm). Meanwhile the arena offers
** only chunks given back since; none of the detached ones can be handed out.
*/
static void arena_release_pages(arena_t *a, const chunk_t *free, uint32_t fresh, size_t page)
{
    uint64_t freemap[RT_HEAP_ARENA_CHUNKS / 64] = {0};
    for (const chunk_t *c = free; c; c = c->next) {
        size_t i = chunk_index(c);
        freemap[i / 64] |= (uint64_t)1 << (i % 64);
    }
    for (size_t i = fresh; i < RT_HEAP_ARENA_CHUNKS; i++)
        freemap[i / 64] |= (uint64_t)1 << (i % 64);
    /* Descriptors end on a page boundary for pages up to 64 KiB (the caller checks). */
    size_t per_page = page / RT_HEAP_CHUNK_SIZE, run = 0;
    for (size_t first = RT_HEAP_META_CHUNKS; first < RT_HEAP_ARENA_CHUNKS; first += per_page) {
        bool all = true;
        for (size_t j = first; j < first + per_page && all; j++)
            all = (freemap[j / 64] >> (j % 64)) & 1;
        if (all) {
            if (!run)
                run = first;
            continue;
        }
        if (run)
            madvise((char *)a + run * RT_HEAP_CHUNK_SIZE, (first - run) * RT_HEAP_CHUNK_SIZE,
                    MADV_DONTNEED);
        run = 0;
    }
    if (run)
        madvise((char *)a + run * RT_HEAP_CHUNK_SIZE,
                (RT_HEAP_ARENA_CHUNKS - run) * RT_HEAP_CHUNK_SIZE, MADV_DONTNEED);
}

void rt_heap_pool_trim(void)
{
    rt_heap_thread_flush();
    long page = sysconf(_SC_PAGESIZE);
    bool pages_ok =
        page > 0 && (size_t)page >= RT_HEAP_CHUNK_SIZE && (size_t)page <= RT_HEAP_ARENA_SIZE / 16;
    size_t arenas = 0;
    pthread_mutex_lock(&pool.lock);
    for (arena_t *p = pool.partial.next; p != &pool.partial; p = p->next)
        arenas++;
    pthread_mutex_unlock(&pool.lock);
    /* One arena at a time, from the head: a trimmed arena goes back at the tail, so the list's
       first `arenas` are each seen once (one that fills up and comes back meanwhile may be
       seen twice: harmless). */
    for (size_t k = 0; pages_ok && k < arenas; k++) {
        pthread_mutex_lock(&pool.lock);
        arena_t *p = pool.partial.next;
        if (p == &pool.partial) {
            pthread_mutex_unlock(&pool.lock);
            break;
        }
        chunk_t *free = p->free;
        uint32_t fresh = p->fresh;
        RT_ASSERT(fresh <= RT_HEAP_ARENA_CHUNKS && p->nfree >= RT_HEAP_ARENA_CHUNKS - fresh);
        p->free = NULL;
        p->fresh = RT_HEAP_ARENA_CHUNKS;
        uint32_t detached = p->nfree;
        p->nfree = 0;
        partial_del(p);
        pthread_mutex_unlock(&pool.lock);

        arena_release_pages(p, free, fresh, (size_t)page);

        arena_t *unmap = NULL;
        pthread_mutex_lock(&pool.lock);
        if (free) {
            chunk_t *tail = free;
            while (tail->next)
                tail = tail->next;
            tail->next = p->free;
            p->free = free;
        }
        p->fresh = fresh;
        if (!p->nfree) /* no chunk came back meanwhile: it left the partial list */
            partial_add_tail(p);
        p->nfree += detached;
        if (p->nfree == RT_HEAP_DATA_CHUNKS && arena_retire(p))
            unmap = p;
        pthread_mutex_unlock(&pool.lock);
        if (unmap) {
            RT_HEAP_ACCESS(unmap, RT_HEAP_ARENA_SIZE);
            munmap(unmap, RT_HEAP_ARENA_SIZE);
        }
    }
    pthread_mutex_lock(&pool.lock);
    arena_t *a = pool.spare;
    pool.spare = NULL;
    if (a) {
        arena_map_set((uintptr_t)a, false);
        pool.arenas--;
    }
    pthread_mutex_unlock(&pool.lock);
    if (a) {
        RT_HEAP_ACCESS(a, RT_HEAP_ARENA_SIZE);
        munmap(a, RT_HEAP_ARENA_SIZE);
    }
}

/* ------------------------------------------------------------------------ */
/* Heap lists                                                               */

static inline void list_push(void **head, chunk_t *c)
{
    chunk_t *h = *head;
    c->prev = NULL;
    c->next = h;
    if (h)
        h->prev = c;
    *head = c;
}

static inline void list_remove(void **head, chunk_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
}

/* ------------------------------------------------------------------------ */
/* Allocation                                                               */

/* used + bin_bytes below which a heap with trigger t and live bytes needs no collection. */
static uint32_t quiet_mark(size_t t, size_t live)
{
    /* Both rules need 2 * (used + bin_bytes) >= t + live (live <= t, gc_factor > 1). */
    size_t q = t / 2 + live / 2;
    return q > UINT32_MAX ? UINT32_MAX : (uint32_t)q;
}

void rt_heap_init(rt_heap_t *h)
{
    memset(h, 0, sizeof *h);
    h->quiet = quiet_mark(cfg_min_heap, 0);
}

/* ------------------------------------------------------------------------ */
/* The first block                                                          */

#define FIRST_GRANULES (RT_HEAP_FIRST / RT_HEAP_GRANULE)

static inline bool in_first(const rt_heap_t *h, const void *p)
{
    return (uintptr_t)p - (uintptr_t)h->first < RT_HEAP_FIRST;
}

static inline unsigned first_index(const rt_heap_t *h, const void *p)
{
    return (unsigned)(((uintptr_t)p - (uintptr_t)h->first) / RT_HEAP_GRANULE);
}

static inline unsigned first_extent(const rt_heap_t *h, unsigned i)
{
    return rt__granules_extent(h->first_used, h->first_start, FIRST_GRANULES, i);
}

/* With bin, the object is marked as a binary handle, which the caller fills in. */
static void *first_alloc(rt_heap_t *h, size_t size, rt_obj_kind_t kind, bool bin)
{
    unsigned n = size ? (unsigned)((size + RT_HEAP_GRANULE - 1) / RT_HEAP_GRANULE) : 1;
    int at = rt__granules_fit(~(uint32_t)h->first_used & ((1u << FIRST_GRANULES) - 1), n);
    if (at < 0)
        return NULL;
    unsigned i = (unsigned)at;
    h->first_used |= (uint16_t)(((1u << n) - 1) << i);
    h->first_start |= (uint16_t)(1u << i);
    if (kind == RT_OBJ_SCAN)
        h->first_scan |= (uint16_t)(1u << i);
    if (bin)
        h->first_bin |= (uint16_t)(1u << i);
    size_t bytes = (size_t)n * RT_HEAP_GRANULE;
    RT_HEAP_ADD(h->used, bytes);
    unsigned char *p = h->first + (size_t)i * RT_HEAP_GRANULE;
    RT_HEAP_ACCESS(p, bytes);
    memset(p, 0, bytes);
    return p;
}

static chunk_t *heap_new_chunk(rt_heap_t *h, unsigned cls)
{
    chunk_t *c = chunk_get();
    if (!c)
        return NULL;
    atomic_store_explicit(&c->owner, h, memory_order_relaxed);
    c->alloc = c->mark = c->scan = c->bin = 0;
    c->cls = (uint8_t)cls;
    c->full = 0;
    RT_HEAP_NOACCESS(chunk_data(c), RT_HEAP_CHUNK_SIZE);
    list_push(&h->avail[cls], c);
    RT_HEAP_ADD(h->chunks, 1);
    return c;
}

/* Gives an empty chunk back to the pool; the caller has unlinked it. */
static void heap_drop_chunk(rt_heap_t *h, chunk_t *c)
{
    RT_HEAP_ACCESS(chunk_data(c), RT_HEAP_CHUNK_SIZE);
    RT_POISON(chunk_data(c), RT_HEAP_CHUNK_SIZE);
    RT_HEAP_NOACCESS(chunk_data(c), RT_HEAP_CHUNK_SIZE);
    atomic_store_explicit(&c->owner, NULL, memory_order_relaxed);
    chunk_put(c);
    RT_HEAP_SUB(h->chunks, 1);
}

static void *alloc_large(rt_heap_t *h, size_t size, rt_obj_kind_t kind)
{
    if (size > SIZE_MAX / 2)
        return NULL;
    size = (size + 15) & ~(size_t)15;
    large_t *l = calloc(1, sizeof(large_t) + size);
    if (!l)
        return NULL;
    l->size = size;
    l->scan = kind == RT_OBJ_SCAN;
    l->prev = NULL;
    l->next = h->large;
    if (l->next)
        l->next->prev = l;
    h->large = l;
    RT_HEAP_ADD(h->large_bytes, sizeof(large_t) + size);
    RT_HEAP_ADD(h->used, size);
    return l + 1;
}

/*
** The slow paths of allocation and free stay out of line, so that the common
** ones keep few registers to save.
*/
static RT_NOINLINE void chunk_now_full(rt_heap_t *h, chunk_t *c, unsigned cls)
{
    list_remove(&h->avail[cls], c);
    list_push(&h->full, c);
    c->full = 1;
}

/* The next free slot of c, a chunk of class cls with one. */
static inline void *alloc_in(rt_heap_t *h, chunk_t *c, unsigned cls, rt_obj_kind_t kind, bool bin)
{
    uint64_t mask = class_mask(cls);
    unsigned i = (unsigned)__builtin_ctzll(~c->alloc & mask);
    uint64_t bit = (uint64_t)1 << i;
    c->alloc |= bit;
    c->scan |= kind == RT_OBJ_SCAN ? bit : 0;
    c->bin |= bin ? bit : 0;
    if (RT_UNLIKELY(c->alloc == mask))
        chunk_now_full(h, c, cls);
    size_t n = class_size[cls];
    RT_HEAP_ADD(h->used, n);
    char *p = chunk_data(c) + i * n;
    RT_HEAP_ACCESS(p, n);
    memset(p, 0, n);
    return p;
}

static RT_NOINLINE void *alloc_without_chunk(rt_heap_t *h, size_t size, unsigned cls,
                                             rt_obj_kind_t kind, bool bin)
{
    /* A class without a chunk uses the first block while objects fit there. */
    if (size <= RT_HEAP_FIRST) {
        void *p = first_alloc(h, size, kind, bin);
        if (p)
            return p;
    }
    chunk_t *c = heap_new_chunk(h, cls);
    return c ? alloc_in(h, c, cls, kind, bin) : NULL;
}

/* An object of at most RT_HEAP_MAX_SMALL bytes; bin as for first_alloc. */
static inline void *alloc_small(rt_heap_t *h, size_t size, rt_obj_kind_t kind, bool bin)
{
    unsigned cls = class_of[(size + 15) >> 4];
    chunk_t *c = h->avail[cls];
    if (RT_UNLIKELY(!c))
        return alloc_without_chunk(h, size, cls, kind, bin);
    return alloc_in(h, c, cls, kind, bin);
}

void *rt_heap_alloc(rt_heap_t *h, size_t size, rt_obj_kind_t kind)
{
    if (RT_UNLIKELY(size > RT_HEAP_MAX_SMALL))
        return alloc_large(h, size, kind);
    return alloc_small(h, size, kind, false);
}

/* ------------------------------------------------------------------------ */
/* Binaries                                                                 */

static rt_striped_t bin_live_count, bin_live_bytes; /* changed by every thread */

/* Every byte a binary holds past its header: what the totals and a holder's heap count. */
static size_t bin_bytes(const rt_bin_t *b)
{
    return b->len + b->tail_len;
}

/*
** Binaries come from a pool (pool.c) in 64-byte classes up to 2 KiB, larger ones from
** malloc. A binary is mostly freed on another core than the one that made it (the
** publisher's scheduler allocates, the last subscriber's frees): through malloc, those
** frees took the allocating arena's lock and, past 1 KB, kept moving the arena's top
** across its trim threshold, an madvise and a TLB shootdown on every core each time
** (fan-in at 1 KB). The pool's lists move between threads in batches instead. Its class
** follows from the binary's size, so nothing is stored. Its batches are small (32, a
** thread keeping at most 128 a class): sizes vary, and every class a thread touches holds
** a batch or more (with the envelopes' 256, a soak of mixed sizes kept 5.8 MB free). Off
** under ASan (RT_REUSE_FREED).
*/

static rt_pool_t bin_pool =
    RT_POOL_OF_MALLOC(2, RT_BIN_STEP, RT_BIN_DEPOT_MAX, RT_BIN_BATCH, RT_BIN_CACHE_HIGH);

static uint8_t bin_class(size_t size)
{
    size_t k = (size + RT_BIN_STEP - 1) / RT_BIN_STEP;
    return k < RT_POOL_CLASSES ? (uint8_t)k : RT_POOL_TOO_BIG;
}

static void *bin_block_alloc(size_t size)
{
    if (!RT_REUSE_FREED)
        return malloc(size);
    uint8_t cls;
    void *p = rt__pool_alloc(&bin_pool, size, &cls);
    RT_ASSERT(!p || cls == bin_class(size)); /* what the free will compute */
    return p;
}

static void bin_block_free(void *p, size_t size)
{
    if (!RT_REUSE_FREED) {
        free(p);
        return;
    }
    rt__pool_free(&bin_pool, p, bin_class(size));
}

void rt__bin_pool_trim(void)
{
    if (RT_REUSE_FREED)
        rt__pool_trim(&bin_pool);
}

size_t rt__bin_pool_free_bytes(void)
{
    size_t held = atomic_load_explicit(&bin_pool.bytes_held, memory_order_relaxed);
    size_t in_use = (size_t)rt_striped_sum(&bin_pool.bytes_in_use);
    return held > in_use ? held - in_use : 0;
}

rt_bin_t *rt_bin_alloc_tail(size_t len, size_t tail_len)
{
    if (tail_len > UINT32_MAX || len > SIZE_MAX - sizeof(rt_bin_t) - tail_len)
        return NULL;
    rt_bin_t *b = bin_block_alloc(sizeof(rt_bin_t) + len + tail_len);
    if (!b)
        return NULL;
    atomic_init(&b->refs, 1);
    b->tail_len = (uint32_t)tail_len;
    b->len = len;
    rt_striped_add(&bin_live_count, 1);
    rt_striped_add(&bin_live_bytes, (int64_t)(len + tail_len));
    return b;
}

rt_bin_t *rt_bin_alloc(size_t len)
{
    return rt_bin_alloc_tail(len, 0);
}

rt_bin_t *rt_bin_new(const void *data, size_t len)
{
    rt_bin_t *b = rt_bin_alloc(len);
    if (b && len)
        memcpy(b->data, data, len);
    return b;
}

rt_bin_t *rt_bin_retain(rt_bin_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void rt_bin_release(rt_bin_t *b)
{
    if (!b)
        return;
    /* acq_rel: every holder's reads of the contents happen before the free. */
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    rt_striped_add(&bin_live_count, -1);
    rt_striped_add(&bin_live_bytes, -(int64_t)bin_bytes(b));
    size_t size = sizeof *b + bin_bytes(b);
    RT_POISON(b, size);
    bin_block_free(b, size);
}

uint8_t *rt_bin_data(rt_bin_t *b)
{
    return b->data;
}

size_t rt_bin_len(const rt_bin_t *b)
{
    return b->len;
}

const uint8_t *rt_bin_tail(const rt_bin_t *b, size_t *tail_len)
{
    *tail_len = b->tail_len;
    return b->data + b->len;
}

uint32_t rt_bin_refs(const rt_bin_t *b)
{
    return atomic_load_explicit(&((rt_bin_t *)b)->refs, memory_order_relaxed);
}

void rt_bin_totals(size_t *count, size_t *bytes)
{
    if (count)
        *count = (size_t)rt_striped_sum(&bin_live_count);
    if (bytes)
        *bytes = (size_t)rt_striped_sum(&bin_live_bytes);
}

void *rt_heap_alloc_bin(rt_heap_t *h, size_t size, rt_obj_kind_t kind, rt_bin_t *bin)
{
    RT_ASSERT(bin && size >= sizeof(rt_bin_t *) && size <= RT_HEAP_MAX_SMALL);
    rt_bin_t **p = alloc_small(h, size, kind, true);
    if (!p) {
        rt_bin_release(bin);
        return NULL;
    }
    *p = bin;
    RT_HEAP_ADD(h->bin_bytes, bin_bytes(bin));
    return p;
}

void *rt_heap_hold_bin(rt_heap_t *h, rt_bin_t *bin)
{
    return rt_heap_alloc_bin(h, sizeof(rt_bin_t *), RT_OBJ_LEAF, bin);
}

rt_bin_t *rt_heap_bin(const void *handle)
{
    return *(rt_bin_t *const *)handle;
}

/* Drops the reference a handle's first word holds; a handle whose binary was dropped holds none. */
static void release_bin(rt_heap_t *h, void *handle)
{
    rt_bin_t *b = *(rt_bin_t **)handle;
    if (!b)
        return;
    RT_HEAP_SUB(h->bin_bytes, bin_bytes(b));
    rt_bin_release(b);
}

/* Drops the binary references held by the handle slots in bits of chunk c. */
static void release_bins(rt_heap_t *h, chunk_t *c, uint64_t bits)
{
    char *base = chunk_data(c);
    for (; bits; bits &= bits - 1)
        release_bin(h, base + (unsigned)__builtin_ctzll(bits) * class_size[c->cls]);
}

void rt_heap_drop_bin(rt_heap_t *h, void *obj)
{
    release_bin(h, obj);
    *(rt_bin_t **)obj = NULL;
}

/* ------------------------------------------------------------------------ */
/* Explicit free and destroy                                                */

/* A slot that no longer holds an object: poisoned in debug builds, out of bounds under ASan. */
static inline void slot_free(void *p, size_t n)
{
    RT_POISON(p, n);
    RT_HEAP_NOACCESS(p, n);
}

static void free_large(rt_heap_t *h, large_t *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        h->large = l->next;
    if (l->next)
        l->next->prev = l->prev;
    RT_HEAP_SUB(h->large_bytes, sizeof(large_t) + l->size);
    RT_HEAP_SUB(h->used, l->size);
    RT_POISON(l, sizeof *l + l->size);
    free(l);
}

/* A slot of c, full or not current, was freed: the chunk's lists and the pool may change. */
static RT_NOINLINE void chunk_freed(rt_heap_t *h, chunk_t *c, unsigned cls)
{
    if (c->full) {
        /* c becomes the current chunk; the one it replaces goes if it is empty, so that at
           most one empty chunk per class stays (freeing a whole queue one object at a time
           would otherwise keep every chunk it emptied until a collection). */
        chunk_t *prev = h->avail[cls];
        list_remove(&h->full, c);
        list_push(&h->avail[cls], c);
        c->full = 0;
        if (prev && !prev->alloc) {
            list_remove(&h->avail[cls], prev);
            heap_drop_chunk(h, prev);
        }
        return;
    }
    /* An empty chunk that is not current goes; the current one stays even when empty, so
       that alloc/free pairs do not churn the pool. */
    list_remove(&h->avail[cls], c);
    heap_drop_chunk(h, c);
}

static RT_NOINLINE void first_free(rt_heap_t *h, void *p)
{
    unsigned i = first_index(h, p), n = first_extent(h, i);
    uint16_t bit = (uint16_t)(1u << i);
    RT_ASSERT(p == h->first + (size_t)i * RT_HEAP_GRANULE && (h->first_start & bit));
    if (h->first_bin & bit)
        release_bin(h, p);
    h->first_used &= (uint16_t) ~(((1u << n) - 1) << i);
    h->first_start &= (uint16_t)~bit;
    h->first_scan &= (uint16_t)~bit;
    h->first_bin &= (uint16_t)~bit;
    RT_HEAP_SUB(h->used, (size_t)n * RT_HEAP_GRANULE);
    slot_free(p, (size_t)n * RT_HEAP_GRANULE);
}

void rt_heap_free(rt_heap_t *h, void *p)
{
    if (!p)
        return;
    if (in_first(h, p)) {
        first_free(h, p);
        return;
    }
    if (!arena_map_has(p)) {
        free_large(h, (large_t *)p - 1);
        return;
    }
    chunk_t *c = chunk_of(p);
    unsigned cls = c->cls;
    unsigned i = slot_of(cls, (uintptr_t)p);
    uint64_t bit = (uint64_t)1 << i;
    RT_ASSERT(atomic_load_explicit(&c->owner, memory_order_relaxed) == h);
    RT_ASSERT(c->alloc & bit);
    RT_ASSERT((char *)p == chunk_data(c) + i * class_size[cls]);
    if (c->bin & bit)
        release_bin(h, p);
    c->alloc &= ~bit;
    c->scan &= ~bit;
    c->bin &= ~bit;
    RT_HEAP_SUB(h->used, class_size[cls]);
    slot_free(p, class_size[cls]);
    if (RT_UNLIKELY(c->full || (!c->alloc && h->avail[cls] != c)))
        chunk_freed(h, c, cls);
}

size_t rt_heap_obj_size(const rt_heap_t *h, const void *p)
{
    if (in_first(h, p))
        return (size_t)first_extent(h, first_index(h, p)) * RT_HEAP_GRANULE;
    if (!arena_map_has(p))
        return ((const large_t *)p - 1)->size;
    const chunk_t *c = chunk_of(p);
    RT_ASSERT(atomic_load_explicit(&c->owner, memory_order_relaxed) == h);
    return class_size[c->cls];
}

void rt_heap_charge(rt_heap_t *h, ptrdiff_t delta)
{
    RT_ASSERT(delta >= 0 || (size_t)-delta <= h->ext_bytes);
    RT_HEAP_SET(h->ext_bytes, h->ext_bytes + (size_t)delta);
}

/* Empties one chunk list, dropping the binaries its objects hold. */
static void destroy_chunks(rt_heap_t *h, void **head)
{
    chunk_t *c = *head;
    while (c) {
        chunk_t *next = c->next;
        if (c->bin)
            release_bins(h, c, c->bin);
        heap_drop_chunk(h, c);
        c = next;
    }
    *head = NULL;
}

void rt_heap_destroy(rt_heap_t *h)
{
    for (uint32_t bins = h->first_bin; bins; bins &= bins - 1)
        release_bin(h, h->first + (size_t)__builtin_ctz(bins) * RT_HEAP_GRANULE);
    h->first_used = h->first_start = h->first_scan = h->first_bin = h->first_mark = 0;
    /* Free granules are poisoned; the header may go back to malloc or be a stack variable. */
    RT_HEAP_ACCESS(h->first, RT_HEAP_FIRST);
    for (unsigned k = 0; k < RT_HEAP_NCLASSES; k++)
        destroy_chunks(h, &h->avail[k]);
    destroy_chunks(h, &h->full);
    while (h->large)
        free_large(h, h->large);
    RT_ASSERT(h->chunks == 0 && h->bin_bytes == 0 && h->large_bytes == 0);
    /* Back to the all-zero empty heap, field by field for concurrent rt_heap_stats readers. */
    RT_HEAP_SET(h->used, 0);
    RT_HEAP_SET(h->next_gc, 0);
    RT_HEAP_SET(h->live, 0);
    RT_HEAP_SET(h->gc_count, 0);
    RT_HEAP_SET(h->last_pause_us, 0);
    RT_HEAP_SET(h->max_pause_us, 0);
    RT_HEAP_SET(h->ext_bytes, 0);
    h->quiet = quiet_mark(cfg_min_heap, 0);
}

/* ------------------------------------------------------------------------ */
/* Marking                                                                  */

static bool grow(void **buf, size_t *cap, size_t elem)
{
    size_t n = *cap ? *cap * 2 : 256;
    void *p = realloc(*buf, n * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = n;
    return true;
}

static inline void push(rt_gc_t *gc, const char *p, size_t n)
{
    if (RT_UNLIKELY(gc->sp == gc->stack_cap) &&
        !grow((void **)&gc->stack, &gc->stack_cap, sizeof(mark_item_t))) {
        gc->failed = true;
        return;
    }
    gc->stack[gc->sp].p = p;
    gc->stack[gc->sp].n = n;
    gc->sp++;
}

/* Few arenas is the common case (a heap's chunks come from few arenas); scan those. */
#define RT_HEAP_FEW_ARENAS 8

static inline bool arena_listed(const rt_gc_t *gc, uintptr_t a)
{
    if (gc->narenas <= RT_HEAP_FEW_ARENAS) {
        for (size_t i = 0; i < gc->narenas; i++)
            if (gc->arenas[i] == a)
                return true;
        return false;
    }
    size_t lo = 0, hi = gc->narenas;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (gc->arenas[mid] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < gc->narenas && gc->arenas[lo] == a;
}

static void mark_large(rt_gc_t *gc, uintptr_t w)
{
    /* Find the last object starting at or below w. */
    size_t lo = 0, hi = gc->nlarge;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)(gc->large[mid] + 1) <= w)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return;
    large_t *l = gc->large[lo - 1];
    uintptr_t start = (uintptr_t)(l + 1);
    if (w - start >= l->size || l->mark)
        return;
    l->mark = 1;
    if (l->scan)
        push(gc, (const char *)start, l->size);
}

static void mark_first(rt_gc_t *gc, uintptr_t w)
{
    rt_heap_t *h = gc->heap;
    unsigned g = (unsigned)((w - gc->first) / RT_HEAP_GRANULE);
    if (!(h->first_used >> g & 1))
        return;
    /* A used granule belongs to the object of the nearest start at or below it. */
    uint32_t starts = h->first_start & ((2u << g) - 1);
    RT_ASSERT(starts);
    unsigned i = 31 - (unsigned)__builtin_clz(starts);
    uint16_t bit = (uint16_t)(1u << i);
    if (h->first_mark & bit)
        return;
    h->first_mark |= bit;
    if (h->first_scan & bit)
        push(gc, (const char *)h->first + (size_t)i * RT_HEAP_GRANULE,
             (size_t)first_extent(h, i) * RT_HEAP_GRANULE);
}

/*
** The heart of the collector: marks the object of this heap that w points
** into or at, if any. Every test before the descriptor read only looks at the
** collector's own lists, so any word value is safe. The first block is tested
** first: it is malloc'ed memory, which may lie between two of the heap's arenas.
*/
static inline void mark_word(rt_gc_t *gc, uintptr_t w)
{
    if (RT_UNLIKELY(w - gc->first < RT_HEAP_FIRST)) {
        mark_first(gc, w);
        return;
    }
    /* A word between the heap's lowest and highest arena may point into none of them: the
       heap's large objects are calloc'ed, and a thread's malloc arena (mmap'ed, as the chunk
       arenas are) can lie between two chunk arenas in the address space. Such a word is a
       large object's or nothing; returning here swept a live large object (a MUC service's
       list of rooms, 16 KiB, overwritten by the stanzas malloc gave its memory to). */
    uintptr_t a = w & ~(RT_HEAP_ARENA_SIZE - 1);
    if (w - gc->arena_lo < gc->arena_span && (a == gc->last_arena || arena_listed(gc, a))) {
        gc->last_arena = a;
        size_t idx = (w - a) >> RT_HEAP_CHUNK_SHIFT;
        if (idx < RT_HEAP_META_CHUNKS)
            return;
        chunk_t *c = chunk_meta(a, idx);
        if (atomic_load_explicit(&c->owner, memory_order_relaxed) != gc->heap)
            return;
        unsigned cls = c->cls;
        unsigned i = slot_of(cls, w);
        uint64_t bit = (uint64_t)1 << i;
        if (!(c->alloc & bit) || (c->mark & bit))
            return;
        c->mark |= bit;
        if (c->scan & bit) {
            size_t n = class_size[cls];
            push(gc, (const char *)(w & ~(RT_HEAP_CHUNK_SIZE - 1)) + i * n, n);
        }
        return;
    }
    if (w - gc->large_lo < gc->large_span)
        mark_large(gc, w);
}

static void scan_range(rt_gc_t *gc, const char *p, size_t n)
{
    uintptr_t s = ((uintptr_t)p + sizeof(uintptr_t) - 1) & ~(uintptr_t)(sizeof(uintptr_t) - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)(sizeof(uintptr_t) - 1);
    for (const uintptr_t *w = (const uintptr_t *)s; (uintptr_t)w < e; w++)
        mark_word(gc, *w);
}

void rt_gc_mark(rt_gc_t *gc, const void *p)
{
    mark_word(gc, (uintptr_t)p);
}

void rt_gc_scan(rt_gc_t *gc, const void *start, size_t len)
{
    scan_range(gc, start, len);
}

/*
** Marking is bound by cache misses on the objects it scans, so objects pass
** through a small FIFO after leaving the stack: each is prefetched when it
** enters and scanned RT_HEAP_PREFETCH - 1 objects later (prefetch on grey).
*/
#define RT_HEAP_PREFETCH 8 /* objects in flight; a power of two */

static void drain(rt_gc_t *gc)
{
    mark_item_t ring[RT_HEAP_PREFETCH];
    unsigned head = 0, count = 0;
    for (;;) {
        while (count < RT_HEAP_PREFETCH && gc->sp) {
            mark_item_t it = gc->stack[--gc->sp];
            __builtin_prefetch(it.p);
            ring[(head + count++) & (RT_HEAP_PREFETCH - 1)] = it;
        }
        if (!count)
            return;
        mark_item_t it = ring[head];
        head = (head + 1) & (RT_HEAP_PREFETCH - 1);
        count--;
        scan_range(gc, it.p, it.n);
    }
}

static int cmp_uintptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/* Lists the distinct arenas holding chunks of the heap; false when out of memory. */
static bool list_arenas(rt_gc_t *gc, chunk_t *c)
{
    uintptr_t prev = 0;
    for (; c; c = c->next) {
        uintptr_t a = arena_base(c);
        if (a == prev)
            continue;
        prev = a;
        if (gc->narenas <= RT_HEAP_FEW_ARENAS && arena_listed(gc, a))
            continue;
        if (gc->narenas == gc->arenas_cap &&
            !grow((void **)&gc->arenas, &gc->arenas_cap, sizeof(uintptr_t)))
            return false;
        gc->arenas[gc->narenas++] = a;
    }
    return true;
}

static bool prepare(rt_gc_t *gc, rt_heap_t *h)
{
    gc->heap = h;
    gc->first = (uintptr_t)h->first;
    gc->narenas = gc->nlarge = gc->sp = 0;
    gc->last_arena = 0;
    gc->arena_lo = gc->arena_span = gc->large_lo = gc->large_span = 0;
    gc->failed = false;
    for (unsigned k = 0; k < RT_HEAP_NCLASSES; k++)
        if (!list_arenas(gc, h->avail[k]))
            return false;
    if (!list_arenas(gc, h->full))
        return false;
    if (gc->narenas) {
        qsort(gc->arenas, gc->narenas, sizeof(uintptr_t), cmp_uintptr);
        size_t n = 1;
        for (size_t i = 1; i < gc->narenas; i++)
            if (gc->arenas[i] != gc->arenas[n - 1])
                gc->arenas[n++] = gc->arenas[i];
        gc->narenas = n;
        gc->arena_lo = gc->arenas[0];
        gc->arena_span = gc->arenas[n - 1] + RT_HEAP_ARENA_SIZE - gc->arena_lo;
    }
    for (large_t *l = h->large; l; l = l->next) {
        if (gc->nlarge == gc->large_cap &&
            !grow((void **)&gc->large, &gc->large_cap, sizeof(large_t *)))
            return false;
        gc->large[gc->nlarge++] = l;
    }
    if (gc->nlarge) {
        qsort(gc->large, gc->nlarge, sizeof(large_t *), cmp_uintptr);
        large_t *last = gc->large[gc->nlarge - 1];
        gc->large_lo = (uintptr_t)(gc->large[0] + 1);
        gc->large_span = (uintptr_t)(last + 1) + last->size - gc->large_lo;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Sweeping                                                                 */

static void sweep_chunk(rt_heap_t *h, chunk_t *c)
{
    unsigned cls = c->cls;
    uint64_t dead = c->alloc & ~c->mark;
    if (dead) {
        if (dead & c->bin)
            release_bins(h, c, dead & c->bin);
        RT_HEAP_SUB(h->used, (size_t)__builtin_popcountll(dead) * class_size[cls]);
#if !defined(NDEBUG) || defined(RT_HEAP_ASAN)
        /* A chunk left empty is poisoned whole when dropped. */
        for (uint64_t d = c->mark ? dead : 0; d; d &= d - 1)
            slot_free(chunk_data(c) + (unsigned)__builtin_ctzll(d) * class_size[cls],
                      class_size[cls]);
#endif
        c->alloc = c->mark;
        c->scan &= c->alloc;
        c->bin &= c->alloc;
    }
    c->mark = 0;
    if (!c->alloc) {
        heap_drop_chunk(h, c);
    } else if (c->alloc == class_mask(cls)) {
        list_push(&h->full, c);
        c->full = 1;
    } else {
        list_push(&h->avail[cls], c);
        c->full = 0;
    }
}

static void sweep(rt_heap_t *h)
{
    for (uint32_t dead = h->first_start & ~h->first_mark; dead; dead &= dead - 1)
        first_free(h, h->first + (size_t)__builtin_ctz(dead) * RT_HEAP_GRANULE);
    h->first_mark = 0;
    chunk_t *lists[RT_HEAP_NCLASSES + 1];
    for (unsigned k = 0; k < RT_HEAP_NCLASSES; k++) {
        lists[k] = h->avail[k];
        h->avail[k] = NULL;
    }
    lists[RT_HEAP_NCLASSES] = h->full;
    h->full = NULL;
    for (unsigned k = 0; k <= RT_HEAP_NCLASSES; k++) {
        chunk_t *c = lists[k];
        while (c) {
            chunk_t *next = c->next;
            sweep_chunk(h, c);
            c = next;
        }
    }
    large_t *l = h->large;
    while (l) {
        large_t *next = l->next;
        if (l->mark)
            l->mark = 0;
        else
            free_large(h, l);
        l = next;
    }
}

/* After a failed mark nothing can be freed; only the marks are cleared. */
static void unmark(rt_heap_t *h)
{
    h->first_mark = 0;
    for (unsigned k = 0; k < RT_HEAP_NCLASSES; k++)
        for (chunk_t *c = h->avail[k]; c; c = c->next)
            c->mark = 0;
    for (chunk_t *c = h->full; c; c = c->next)
        c->mark = 0;
    for (large_t *l = h->large; l; l = l->next)
        l->mark = 0;
}

/* ------------------------------------------------------------------------ */
/* Collection                                                               */

static inline size_t heap_bytes(const rt_heap_t *h)
{
    return (size_t)RT_HEAP_GET(h->chunks) * RT_HEAP_CHUNK_SIZE + RT_HEAP_GET(h->large_bytes);
}

bool rt__heap_collect_due(const rt_heap_t *h)
{
    size_t t = h->next_gc ? h->next_gc : cfg_min_heap;
    size_t v = h->used + h->bin_bytes;
    if (v >= t)
        return true;
    /* Footprint rule (see heap.h), with headroom for what the next message allocates. */
    size_t foot = heap_bytes(h) + h->bin_bytes;
    return foot > t - (t >> RT_HEAP_HEADROOM_SHIFT) && 2 * v >= t + h->live;
}

/* Every collection's pause, all heaps: the collector has one kind (a full mark-sweep). */
static rt_hist_t pauses;

const rt_hist_t *rt_heap_pauses(void)
{
    return &pauses;
}

void rt_heap_collect(rt_heap_t *h, rt_trace_fn trace, void *ctx)
{
    uint64_t t0 = rt_mono_ns();
    rt_gc_t *gc = &tgc;
    RT_ASSERT(!gc->heap); /* collections do not nest */
    if (RT_UNLIKELY(!tcache.armed))
        tcache_arm(); /* so the buffers below are freed at thread exit */
    if (prepare(gc, h)) {
        if (trace)
            trace(ctx, gc);
        drain(gc);
    } else {
        gc->failed = true;
    }
    if (gc->failed)
        unmark(h);
    else
        sweep(h);
    gc->heap = NULL;

    RT_HEAP_SET(h->live, h->used);
    double t = cfg_gc_factor * (double)(h->live + h->bin_bytes);
    RT_HEAP_SET(h->next_gc, t > (double)cfg_min_heap ? (size_t)t : cfg_min_heap);
    h->quiet = quiet_mark(h->next_gc, h->live);
    RT_HEAP_ADD(h->gc_count, 1);
    uint64_t ns = rt_mono_ns() - t0;
    rt_hist_record(&pauses, ns);
    uint64_t us = ns / 1000;
    RT_HEAP_SET(h->last_pause_us, us > UINT32_MAX ? UINT32_MAX : (uint32_t)us);
    if (h->last_pause_us > h->max_pause_us)
        RT_HEAP_SET(h->max_pause_us, h->last_pause_us);
}

void rt_heap_stats(const rt_heap_t *h, rt_heap_stats_t *out)
{
    out->heap_bytes = heap_bytes(h);
    out->used_bytes = RT_HEAP_GET(h->used);
    out->live_bytes = RT_HEAP_GET(h->live);
    out->bin_bytes = RT_HEAP_GET(h->bin_bytes);
    out->ext_bytes = RT_HEAP_GET(h->ext_bytes);
    size_t next = RT_HEAP_GET(h->next_gc);
    out->next_gc = next ? next : cfg_min_heap;
    out->gc_count = RT_HEAP_GET(h->gc_count);
    out->last_pause_us = RT_HEAP_GET(h->last_pause_us);
    out->max_pause_us = RT_HEAP_GET(h->max_pause_us);
}

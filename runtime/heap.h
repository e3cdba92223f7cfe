/*
** Per-actor garbage-collected heaps (BEAM's private process heaps, Pony's
** per-actor heaps) and shared reference-counted binaries.
**
** Every allocation an actor makes comes from its own rt_heap_t. A heap's first
** small objects share a small block in its header; past that, small objects
** live in size-class slabs carved out of small chunks that come from a global,
** thread-safe chunk pool; large objects are allocated one by one. Collection
** is a non-moving mark-sweep that runs only between messages, so the only
** roots are what the owner says through its trace callback; pointers held by C
** code stay valid across a collection. One heap is only ever touched by the
** thread currently running its actor, so nothing here locks, except the chunk
** pool underneath; a heap may move to another thread with its actor, given
** the usual happens-before of the hand-over.
**
** Object kinds:
**   RT_OBJ_LEAF  holds no pointers to heap objects; never scanned.
**   RT_OBJ_SCAN  scanned conservatively: every aligned word that points at
**                or inside an object of the same heap (small or large) keeps
**                that object alive; other words are ignored, never followed.
** A binary handle (rt_heap_alloc_bin) is a heap object whose first word owns
** one reference to a shared binary; sweeping it releases that reference.
**
** Accounting: heap_bytes counts bytes of chunks and large objects owned; the
** bytes of binaries held through handles count toward the GC trigger ("virtual
** binary heap"), so an idle actor holding big payloads still gets collected.
** After a collection the trigger is next_gc = max(min_heap, gc_factor * (live +
** bin bytes)). The next collection is due when used + bin bytes reach it, or
** earlier when heap_bytes + bin bytes come within 1/16 of it and at least half
** of the allocation budget (next_gc - live) has been spent: the second rule
** keeps the footprint, not just the object bytes, under gc_factor x live when
** slots or chunks are partly empty, and the budget floor keeps a fragmented
** heap from collecting after every message.
*/
#ifndef RT_HEAP_H
#define RT_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "hist.h"

typedef struct rt_gc_s rt_gc_t;
typedef struct rt_bin_s rt_bin_t;

typedef enum rt_obj_kind_e {
    RT_OBJ_LEAF = 0,
    RT_OBJ_SCAN = 1,
} rt_obj_kind_t;

/* Tunables with their defaults; rt_heap_configure() changes them process-wide. */
#define RT_HEAP_MIN_HEAP_DEFAULT (16 * 1024) /* bytes before the first GC */
#define RT_HEAP_GC_FACTOR_DEFAULT 2.0        /* next GC at factor x live */

typedef struct rt_heap_config_s {
    size_t min_heap;  /* bytes; a collection never triggers below this */
    double gc_factor; /* > 1.0 */
} rt_heap_config_t;

/* Process-wide defaults for every heap; call before any actor runs. */
void rt_heap_configure(const rt_heap_config_t *cfg);

/* Small chunks are 1 KiB (heap.c says why); exported for rt_heap_footprint. */
#define RT_HEAP_CHUNK_SIZE ((size_t)1024)

/*
** The first block: RT_HEAP_FIRST bytes in the heap header, cut into 16-byte
** granules and shared by objects of every size up to its own. A heap takes a
** class's first 1 KiB chunk only once an object of that class no longer fits
** there, so an actor that holds a few small objects (a session and one message
** in flight) costs the header and nothing more, as a BEAM process starts with
** a small heap and grows it when it fills.
*/
#define RT_HEAP_GRANULE 16
#define RT_HEAP_FIRST 256

/*
** The heap header must stay small: one exists per actor that ever allocated
** past its inline region. An all-zero rt_heap_t is a valid empty heap
** (rt_heap_init also sets the threshold of the collection check), and a heap
** takes no memory beyond its header until its first block is full. A heap must
** not move (be copied) while it holds objects: the first block is part of it.
** Fields are private to heap.c and the inline functions below.
*/
typedef struct rt_heap_s {
    void *avail[10];        /* per size class: chunks with a free slot; the head is current */
    void *full;             /* chunks with no free slot, any class (intrusive list) */
    void *large;            /* large objects (intrusive list) */
    size_t used;            /* bytes in live-or-unswept objects (slot, granules or object size) */
    size_t bin_bytes;       /* bytes of binaries held through handles */
    size_t next_gc;         /* trigger set by the last collection; 0 = min_heap */
    size_t live;            /* used after the last collection */
    size_t large_bytes;     /* bytes of large objects owned, headers included */
    size_t ext_bytes;       /* memory held outside the heap on the owner's behalf (rt_heap_charge) */
    uint32_t chunks;        /* chunks owned */
    uint32_t quiet;         /* used + bin_bytes below this: no collection can be due */
    uint32_t gc_count;      /* collections so far */
    uint32_t last_pause_us; /* duration of the last collection */
    uint32_t max_pause_us;  /* longest collection */
    /* The first block, one bit per granule. An object runs from its start granule over
       the used ones up to the next start; the last three bitmaps use start bits only. */
    uint16_t first_used;  /* granules in an object */
    uint16_t first_start; /* granules that begin an object */
    uint16_t first_scan;  /* RT_OBJ_SCAN objects */
    uint16_t first_bin;   /* binary handles (rt_heap_alloc_bin) */
    uint16_t first_mark;  /* reached by the running collection */
    _Alignas(16) unsigned char first[RT_HEAP_FIRST];
} rt_heap_t;

/*
** Granule bitmaps, shared by the first block and the actor's inline region
** (bit i = granule i, at most 32). The first of n free granules in a row, or
** -1 when there is no such run.
*/
static inline int rt__granules_fit(uint32_t free_bits, unsigned n)
{
    /* Bit i of free_bits ends up set when granules i .. i + n - 1 are all free. */
    for (unsigned k = 1; k < n && free_bits; k++)
        free_bits &= free_bits >> 1;
    return free_bits ? __builtin_ctz(free_bits) : -1;
}

/* Granules of the object starting at granule i: used ones up to the next start or the end. */
static inline unsigned rt__granules_extent(uint32_t used, uint32_t start, unsigned total,
                                           unsigned i)
{
    uint32_t stop = (~used | start | (uint32_t)1 << total) >> (i + 1);
    return (unsigned)__builtin_ctz(stop) + 1;
}

typedef struct rt_heap_stats_s {
    size_t heap_bytes; /* chunks + large objects owned (what the heap costs) */
    size_t large_bytes; /* of heap_bytes: large objects, headers included (from malloc) */
    size_t used_bytes; /* allocated object bytes, live or not yet swept */
    size_t live_bytes; /* used after the last collection */
    size_t bin_bytes;  /* bytes of binaries held */
    size_t ext_bytes;  /* bytes charged from outside the heap (rt_heap_charge) */
    size_t next_gc;    /* trigger for the next collection */
    uint32_t gc_count;
    uint32_t last_pause_us;
    uint32_t max_pause_us;
} rt_heap_stats_t;

/* A trace callback marks the roots: rt_gc_mark for pointers, rt_gc_scan for ranges. */
typedef void (*rt_trace_fn)(void *ctx, rt_gc_t *gc);

void rt_heap_init(rt_heap_t *h);

/* Releases every object and chunk at once and drops every binary reference held. */
void rt_heap_destroy(rt_heap_t *h);

/* Returns zeroed memory of at least size bytes, 16-byte aligned, or NULL. */
void *rt_heap_alloc(rt_heap_t *h, size_t size, rt_obj_kind_t kind);

/*
** Frees an object now, without waiting for a collection (an optimisation for
** code that knows an object is garbage; the GC stays correct without it).
** p is NULL or a pointer rt_heap_alloc (or rt_heap_alloc_bin) returned for h.
*/
void rt_heap_free(rt_heap_t *h, void *p);

/*
** Makes a heap object of size bytes (at least a pointer's) whose first word owns
** one reference to bin (the caller's reference is transferred): collecting or
** freeing the object releases it. The rest of the object is the caller's, so a
** record and the binary it carries are one object. rt_heap_bin() reads the
** binary back. Returns NULL (and releases bin) on OOM.
*/
void *rt_heap_alloc_bin(rt_heap_t *h, size_t size, rt_obj_kind_t kind, rt_bin_t *bin);
/* A handle alone: rt_heap_alloc_bin of one pointer, not scanned. */
void *rt_heap_hold_bin(rt_heap_t *h, rt_bin_t *bin);
rt_bin_t *rt_heap_bin(const void *handle);
/* Releases the binary of an rt_heap_alloc_bin object now; the object stays, its first word NULL. */
void rt_heap_drop_bin(rt_heap_t *h, void *obj);

/* Bytes usable at p (an object of h): its granules, its slot's size class or its large size. */
size_t rt_heap_obj_size(const rt_heap_t *h, const void *p);

/*
** Counts memory held outside the heap for its owner (a library's allocations: a
** Lua state, a database connection) as the heap's own: in ext_bytes, the actor's
** memory and its max_heap, never in the GC trigger (collection cannot free it).
** delta < 0 gives back what was charged.
*/
void rt_heap_charge(rt_heap_t *h, ptrdiff_t delta);

bool rt__heap_collect_due(const rt_heap_t *h);

/*
** Owner only. Below the quiet mark neither rule of the trigger can hold, so the
** common answer between messages costs one addition and one comparison.
*/
static inline bool rt_heap_quiet(const rt_heap_t *h)
{
    return h->used + h->bin_bytes < h->quiet;
}

static inline bool rt_heap_should_collect(const rt_heap_t *h)
{
    return !rt_heap_quiet(h) && rt__heap_collect_due(h);
}

/*
** Owner only: heap_bytes + bin_bytes + ext_bytes of rt_heap_stats, the figure
** max_heap and memory budgets bound, read without the cross-thread loads.
*/
static inline size_t rt_heap_footprint(const rt_heap_t *h)
{
    return (size_t)h->chunks * RT_HEAP_CHUNK_SIZE + h->large_bytes + h->bin_bytes + h->ext_bytes;
}

/* Marks from the roots given by trace(ctx, gc), sweeps, and sets the next trigger. */
void rt_heap_collect(rt_heap_t *h, rt_trace_fn trace, void *ctx);

/* In a trace callback: keeps the object p points into alive; ignores NULL and foreign pointers. */
void rt_gc_mark(rt_gc_t *gc, const void *p);

/* In a trace callback: scan a memory range (such as the actor's state) conservatively. */
void rt_gc_scan(rt_gc_t *gc, const void *start, size_t len);

/*
** May be called from any thread (introspection samples every actor without
** stopping it): each counter is read atomically, but counters are not
** consistent with one another while the owner runs.
*/
void rt_heap_stats(const rt_heap_t *h, rt_heap_stats_t *out);
/* The pauses of every collection so far, all heaps (recorded by rt_heap_collect). */
const rt_hist_t *rt_heap_pauses(void);

/*
** Bytes of arenas mapped by the process-wide chunk pool, and bytes of chunks
** handed out of it (owned by heaps or sitting in per-thread caches), for rtctl vm.
*/
void rt_heap_pool_stats(size_t *mapped_bytes, size_t *in_use_bytes);

/*
** For rtctl vm: bytes of the pool's arenas in memory (chunks never handed out, and the
** pages trimming gave back, are not), and the arena map's reservation and pages in memory.
*/
void rt_heap_pool_resident(size_t *arenas, size_t *map_mapped, size_t *map_resident);

/*
** Returns the calling thread's cached chunks to the pool, then every fully free
** arena to the OS, and the pages of free chunks in the other arenas (used at
** shutdown, by rtctl and by tests). Other threads' caches stay where they are
** until those threads call rt_heap_thread_flush().
*/
void rt_heap_pool_trim(void);
/*
** Chunks given back to the pool so far (it only grows), for the schedulers' idle trim: a
** wave of heaps shrinking (sessions hibernating after a login storm) frees chunks with no
** actor exiting.
*/
uint64_t rt_heap_pool_returned(void);

/*
** Each thread keeps a small cache of free chunks (at most 64 KiB) so that the
** common path takes no lock. A thread calls this before it exits to give its
** cache and its collector buffers back; threads made with pthread_create also
** do it automatically at exit, but the main thread never does.
*/
void rt_heap_thread_flush(void);

/*
** Shared immutable binaries (BEAM refc binaries): created once, then read by
** any number of actors and messages; the last release frees them. Reference
** counts are atomic; contents must not change after the binary is shared.
*/
rt_bin_t *rt_bin_new(const void *data, size_t len); /* copies data; NULL on OOM */
rt_bin_t *rt_bin_alloc(size_t len);                 /* contents to be filled before sharing */
rt_bin_t *rt_bin_retain(rt_bin_t *b);               /* returns b */
void rt_bin_release(rt_bin_t *b);                   /* NULL is ignored */
uint8_t *rt_bin_data(rt_bin_t *b);
size_t rt_bin_len(const rt_bin_t *b);
uint32_t rt_bin_refs(const rt_bin_t *b);
/*
** A binary with a tail: len bytes of data (all that rt_bin_data and rt_bin_len
** show) followed by tail_len bytes about them, filled with the data before the
** binary is shared (at rt_bin_data(b) + len). The tail travels with every
** reference at no cost to the holders (its length sits in the header's
** padding) and counts in rt_bin_totals and heap bin_bytes like the data. Copies
** of the data alone (rt_bin_new) do not carry it. NULL on OOM or a tail of 4 GiB.
*/
rt_bin_t *rt_bin_alloc_tail(size_t len, size_t tail_len);
/* The tail and its length (0 for a binary made without one). */
const uint8_t *rt_bin_tail(const rt_bin_t *b, size_t *tail_len);

/* Process-wide count and bytes of live binaries (for accounting and leak tests). */
void rt_bin_totals(size_t *count, size_t *bytes);

#endif

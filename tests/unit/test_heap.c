/*
** Tests for the per-actor heaps, the chunk pool and shared binaries
** (runtime/heap.c). The pause, garbage and allocation-speed tests print their
** figures on stderr; they assert memory bounds but only a generous bound on
** time, since timed tests flake on shared machines.
*/
#include "heap.h"
#include "internal.h"
#include "pool.h"

#include "check.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define CHUNK 1024u
#define ARENA (1024u * 1024u)

/* A small deterministic generator so runs are repeatable. */

typedef struct roots_s {
    const void *p[64];
    int n;
} roots_t;

static void trace_roots(void *ctx, rt_gc_t *gc)
{
    roots_t *r = ctx;
    for (int i = 0; i < r->n; i++)
        rt_gc_mark(gc, r->p[i]);
}

static size_t used_of(const rt_heap_t *h)
{
    rt_heap_stats_t st;
    rt_heap_stats(h, &st);
    return st.used_bytes;
}

static size_t heap_bytes_of(const rt_heap_t *h)
{
    rt_heap_stats_t st;
    rt_heap_stats(h, &st);
    return st.heap_bytes;
}

static size_t pool_in_use(void)
{
    size_t in_use;
    rt_heap_pool_stats(NULL, &in_use);
    return in_use;
}

static void test_layout(void)
{
    rt_heap_t zero;
    memset(&zero, 0, sizeof zero);
    CHECK(sizeof(rt_heap_t) <= 176 + RT_HEAP_FIRST);
    /* An all-zero heap is usable as is: allocate, collect and destroy without rt_heap_init. */
    void *p = rt_heap_alloc(&zero, 10, RT_OBJ_LEAF);
    CHECK(p != NULL);
    rt_heap_collect(&zero, NULL, NULL);
    CHECK_EQ(used_of(&zero), 0);
    rt_heap_destroy(&zero);
}

static bool inside(const void *p, const void *base, size_t len)
{
    return (uintptr_t)p - (uintptr_t)base < len;
}

/*
** Growth: a heap's first objects, of any class, share the first block in its
** header and take no chunk; a class gets its first chunk only when an object
** of it no longer fits there, and every class can grow past the block.
*/
static void test_first_block_growth(void)
{
    rt_heap_pool_trim();
    size_t in_use0 = pool_in_use();
    rt_heap_t h;
    rt_heap_init(&h);
    /* A session-sized record, a queued message and a handle: the QoS 1 subscriber's heap. */
    static const size_t sizes[] = {120, 40, 8, 1, 32, 16};
    unsigned char *ps[6];
    size_t granules = 0;
    for (int i = 0; i < 6; i++) {
        ps[i] = rt_heap_alloc(&h, sizes[i], i % 2 ? RT_OBJ_LEAF : RT_OBJ_SCAN);
        CHECK(inside(ps[i], h.first, RT_HEAP_FIRST));
        CHECK_EQ((uintptr_t)ps[i] % 16, 0);
        CHECK_EQ(rt_heap_obj_size(&h, ps[i]), (sizes[i] + 15) / 16 * 16);
        memset(ps[i], i + 1, sizes[i]);
        granules += (sizes[i] + 15) / 16;
    }
    CHECK_EQ(granules, 16); /* the block is exactly full */
    CHECK_EQ(used_of(&h), RT_HEAP_FIRST);
    CHECK_EQ(heap_bytes_of(&h), 0);
    for (int i = 0; i < 6; i++)
        for (size_t k = 0; k < sizes[i]; k++)
            CHECK_EQ(ps[i][k], i + 1);

    /* The next object takes its class's first chunk; later ones of that class follow it. */
    void *c1 = rt_heap_alloc(&h, 40, RT_OBJ_LEAF);
    CHECK(!inside(c1, h.first, RT_HEAP_FIRST));
    CHECK_EQ(heap_bytes_of(&h), CHUNK);
    rt_heap_free(&h, ps[3]); /* a free granule in the block... */
    void *c2 = rt_heap_alloc(&h, 40, RT_OBJ_LEAF);
    CHECK(!inside(c2, h.first, RT_HEAP_FIRST)); /* ...is not for a class with a chunk */
    CHECK_EQ(heap_bytes_of(&h), CHUNK);
    void *f = rt_heap_alloc(&h, 10, RT_OBJ_LEAF); /* but is for a class without one */
    CHECK(f == ps[3]);

    /* Past the block, every class grows into a chunk of its own. */
    static const size_t classes[] = {16, 32, 48, 64, 96, 128, 192, 256, 512, 1024};
    for (int k = 0; k < 10; k++) {
        unsigned char *p = rt_heap_alloc(&h, classes[k], RT_OBJ_LEAF);
        CHECK(p && !inside(p, h.first, RT_HEAP_FIRST));
        CHECK_EQ(rt_heap_obj_size(&h, p), classes[k]);
        memset(p, 0xee, classes[k]);
    }
    CHECK_EQ(heap_bytes_of(&h), 10 * CHUNK); /* the 48 class already had its chunk */
    CHECK_EQ(ps[0][0], 1);
    CHECK_EQ(ps[5][15], 6);

    /* A collection that empties the chunks gives them back, and the block serves again. */
    rt_heap_collect(&h, NULL, NULL);
    CHECK_EQ(used_of(&h), 0);
    CHECK_EQ(heap_bytes_of(&h), 0);
    void *again = rt_heap_alloc(&h, 40, RT_OBJ_LEAF);
    CHECK(inside(again, h.first, RT_HEAP_FIRST));
    CHECK(rt_heap_alloc(&h, RT_HEAP_FIRST, RT_OBJ_LEAF) != NULL); /* no room left: a chunk */
    CHECK_EQ(heap_bytes_of(&h), CHUNK);
    rt_heap_destroy(&h);
    rt_heap_pool_trim(); /* this thread's cache counts as in use */
    CHECK_EQ(pool_in_use(), in_use0);
}

/* The collector treats first-block objects like any other: roots, interior pointers, scans. */
static void test_first_block_gc(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    void **a = rt_heap_alloc(&h, 48, RT_OBJ_SCAN);   /* block */
    void **b = rt_heap_alloc(&h, 32, RT_OBJ_SCAN);   /* block, reached from a's middle word */
    char *c = rt_heap_alloc(&h, 96, RT_OBJ_LEAF);    /* block, reached through b's interior */
    char *dead = rt_heap_alloc(&h, 16, RT_OBJ_LEAF); /* block, unreachable */
    void **d = rt_heap_alloc(&h, 600, RT_OBJ_SCAN);  /* chunk, points back into the block */
    char *e = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);    /* block, reached only from the chunk */
    CHECK(inside(a, h.first, RT_HEAP_FIRST) && inside(b, h.first, RT_HEAP_FIRST));
    CHECK(inside(c, h.first, RT_HEAP_FIRST) && inside(dead, h.first, RT_HEAP_FIRST));
    CHECK(inside(e, h.first, RT_HEAP_FIRST) && !inside(d, h.first, RT_HEAP_FIRST));
    a[2] = b;
    b[1] = c + 95;
    a[0] = d;
    d[70] = e + 17;
    memset(c, 'c', 96);
    memset(e, 'e', 64);
    roots_t r = {.p = {(char *)a + 40}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 48 + 32 + 96 + 1024 + 64);
    CHECK(c[0] == 'c' && c[95] == 'c' && e[63] == 'e');
    /* The dead object's granule is free again, and is reused first-fit. */
    CHECK(rt_heap_alloc(&h, 16, RT_OBJ_LEAF) == dead);
    r.n = 0;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 0);
    rt_heap_destroy(&h);
}

/*
** A record carrying its binary (rt_heap_alloc_bin) is one object: scanned, holding the
** reference in its first word, releasing it when freed, swept or dropped early.
*/
static void test_alloc_bin(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    rt_bin_t *b = rt_bin_new("payload", 7);
    void **next = rt_heap_alloc(&h, 16, RT_OBJ_LEAF);
    void **rec = rt_heap_alloc_bin(&h, 40, RT_OBJ_SCAN, rt_bin_retain(b));
    CHECK(rec && rt_heap_bin(rec) == b && rt_bin_refs(b) == 2);
    CHECK(inside(rec, h.first, RT_HEAP_FIRST));
    rec[1] = next; /* the rest of the record is the caller's, and scanned */
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.bin_bytes, 7);
    CHECK_EQ(rt_heap_footprint(&h), 7);
    roots_t r = {.p = {rec}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 48 + 16);
    CHECK_EQ(rt_bin_refs(b), 2);
    /* Dropped early, the binary goes while the record stays; freeing it drops nothing more. */
    rt_heap_drop_bin(&h, rec);
    CHECK(rt_heap_bin(rec) == NULL && rt_bin_refs(b) == 1);
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.bin_bytes, 0);
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_heap_free(&h, rec);
    CHECK_EQ(rt_bin_refs(b), 1);
    /* Swept from a chunk, freed from the block, or destroyed: each releases its reference. */
    void *big = rt_heap_alloc(&h, RT_HEAP_FIRST, RT_OBJ_LEAF);
    void *in_chunk = rt_heap_alloc_bin(&h, 200, RT_OBJ_SCAN, rt_bin_retain(b));
    CHECK(!inside(big, h.first, RT_HEAP_FIRST) && !inside(in_chunk, h.first, RT_HEAP_FIRST));
    r.n = 0;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(rt_bin_refs(b), 1);
    void *in_block = rt_heap_alloc_bin(&h, 24, RT_OBJ_LEAF, rt_bin_retain(b));
    CHECK(inside(in_block, h.first, RT_HEAP_FIRST));
    rt_heap_free(&h, in_block);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_heap_alloc_bin(&h, 24, RT_OBJ_LEAF, rt_bin_retain(b));
    rt_heap_destroy(&h);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.bin_bytes, 0);
    rt_bin_release(b);
}

/* The quiet mark answers "no" cheaply, and never where the full rules say "yes". */
static void test_collect_check(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    CHECK(!rt_heap_should_collect(&h));
    size_t n = 0;
    while (!rt_heap_should_collect(&h)) {
        CHECK(rt_heap_alloc(&h, 1000, RT_OBJ_LEAF) != NULL);
        n++;
    }
    /* 1 KiB chunks of one 1000-byte object each: due once their footprint nears min_heap. */
    CHECK(n * 1024 > RT_HEAP_MIN_HEAP_DEFAULT - RT_HEAP_MIN_HEAP_DEFAULT / 16);
    CHECK(n * 1024 <= RT_HEAP_MIN_HEAP_DEFAULT);
    CHECK_EQ(rt_heap_footprint(&h), n * CHUNK);
    rt_heap_collect(&h, NULL, NULL);
    CHECK(!rt_heap_should_collect(&h));
    rt_heap_destroy(&h);
}

static void test_alloc_sizes(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    /* Dirty every slot first, free it all, then check new objects come back zeroed. */
    static const size_t sizes[] = {0,   1,    15,   16,   17,   32,   33,   48,    49,     64,
                                   65,  96,   97,   128,  129,  192,  193,  256,   257,    512,
                                   513, 1000, 1024, 1025, 2000, 4096, 4097, 65536, 1 << 20};
    const size_t ns = sizeof sizes / sizeof sizes[0];
    for (int round = 0; round < 2; round++) {
        void *ps[sizeof sizes / sizeof sizes[0]][8];
        size_t expect = 0;
        for (size_t i = 0; i < ns; i++) {
            for (int j = 0; j < 8; j++) {
                unsigned char *p = rt_heap_alloc(&h, sizes[i], j & 1 ? RT_OBJ_SCAN : RT_OBJ_LEAF);
                CHECK(p != NULL);
                CHECK_EQ((uintptr_t)p % 16, 0);
                size_t nonzero = 0;
                for (size_t k = 0; k < sizes[i]; k++)
                    nonzero += p[k] != 0;
                CHECK_EQ(nonzero, 0);
                memset(p, (int)(i * 8 + j + 1), sizes[i]);
                ps[i][j] = p;
                expect += sizes[i] <= 16 ? 16 : sizes[i];
            }
        }
        /* No two objects overlap: every one still holds its own pattern. */
        size_t bad = 0;
        for (size_t i = 0; i < ns; i++)
            for (int j = 0; j < 8; j++)
                for (size_t k = 0; k < sizes[i]; k++)
                    bad += ((unsigned char *)ps[i][j])[k] != (unsigned char)(i * 8 + j + 1);
        CHECK_EQ(bad, 0);
        CHECK(used_of(&h) >= expect);
        rt_heap_collect(&h, NULL, NULL);
        CHECK_EQ(used_of(&h), 0);
        CHECK_EQ(heap_bytes_of(&h), 0);
    }
    rt_heap_destroy(&h);
}

static void test_roots(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    roots_t r = {.n = 0};
    char *keep = rt_heap_alloc(&h, 100, RT_OBJ_LEAF);
    char *drop = rt_heap_alloc(&h, 100, RT_OBJ_LEAF);
    char *big = rt_heap_alloc(&h, 5000, RT_OBJ_LEAF);
    memset(keep, 'k', 100);
    memset(big, 'b', 5000);
    (void)drop;
    r.p[r.n++] = keep;
    r.p[r.n++] = big;
    r.p[r.n++] = NULL;
    rt_heap_collect(&h, trace_roots, &r);
    /* keep is in the first block: 7 granules of 16 bytes, not a 128-byte slot. */
    CHECK_EQ(used_of(&h), 112 + 5008);
    CHECK(keep[0] == 'k' && keep[99] == 'k');
    CHECK(big[0] == 'b' && big[4999] == 'b');
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.live_bytes, 112 + 5008);
    CHECK_EQ(st.gc_count, 1);
    CHECK(st.next_gc >= RT_HEAP_MIN_HEAP_DEFAULT);
    r.n = 0;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 0);
    rt_heap_destroy(&h);
}

typedef struct node_s {
    struct node_s *next;
    uint64_t noise[5]; /* integers that must not be taken for pointers */
    void *payload;
    uint64_t id;
} node_t; /* 64 bytes: one size class */

static void test_scan_chains_cycles(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    node_t *head = NULL;
    for (int i = 0; i < 1000; i++) {
        node_t *n = rt_heap_alloc(&h, sizeof *n, RT_OBJ_SCAN);
        n->next = head;
        n->id = (uint64_t)i;
        for (int k = 0; k < 5; k++)
            n->noise[k] = rnd();
        head = n;
    }
    /* A ring of 500 nodes with no root. */
    node_t *first = rt_heap_alloc(&h, sizeof *first, RT_OBJ_SCAN), *prev = first;
    for (int i = 1; i < 500; i++) {
        node_t *n = rt_heap_alloc(&h, sizeof *n, RT_OBJ_SCAN);
        prev->next = n;
        prev = n;
    }
    prev->next = first;
    roots_t r = {.p = {head}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 1000 * 64);
    uint64_t expect = 999;
    int count = 0;
    for (node_t *n = head; n; n = n->next, expect--, count++)
        if (n->id != expect)
            break;
    CHECK_EQ(count, 1000);

    /* A rooted ring survives whole; cut loose, it goes. */
    node_t *ring = rt_heap_alloc(&h, sizeof *ring, RT_OBJ_SCAN);
    prev = ring;
    for (int i = 1; i < 300; i++) {
        node_t *n = rt_heap_alloc(&h, sizeof *n, RT_OBJ_SCAN);
        prev->next = n;
        prev = n;
    }
    prev->next = ring;
    r.p[0] = ring;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 300 * 64);
    r.n = 0;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 0);
    rt_heap_destroy(&h);
}

static void test_interior_pointers(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    roots_t r = {.n = 0};
    /* An interior pointer at every 8-byte offset of a small object of each class keeps it. */
    static const size_t sizes[] = {16, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 3000};
    size_t expect = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t off = 0; off < sizes[i]; off += 8 * (sizes[i] / 256 + 1)) {
            char *p = rt_heap_alloc(&h, sizes[i], RT_OBJ_LEAF);
            rt_heap_alloc(&h, sizes[i], RT_OBJ_LEAF); /* a neighbour that must go */
            r.p[0] = p + off;
            r.n = 1;
            rt_heap_collect(&h, trace_roots, &r);
            expect += sizes[i];
            CHECK_EQ(used_of(&h), (sizes[i] + 15) & ~(size_t)15);
            r.n = 0;
            rt_heap_collect(&h, trace_roots, &r);
            CHECK_EQ(used_of(&h), 0);
        }
    }
    CHECK(expect > 0);
    /* A SCAN object holding only an interior pointer to another keeps it. */
    node_t *a = rt_heap_alloc(&h, sizeof *a, RT_OBJ_SCAN);
    char *b = rt_heap_alloc(&h, 200, RT_OBJ_LEAF);
    a->payload = b + 150;
    r.p[0] = (char *)a + 63;
    r.n = 1;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 64 + 256);
    rt_heap_destroy(&h);
}

static void test_leaf_not_scanned(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    void **leaf = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    void *target = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    void **big_leaf = rt_heap_alloc(&h, 4096, RT_OBJ_LEAF);
    void *target2 = rt_heap_alloc(&h, 32, RT_OBJ_SCAN);
    leaf[0] = target;
    big_leaf[7] = target2;
    roots_t r = {.p = {leaf, big_leaf}, .n = 2};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 64 + 4096);
    /* The same pointers from SCAN objects keep their targets. */
    void **scan = rt_heap_alloc(&h, 64, RT_OBJ_SCAN);
    void **big_scan = rt_heap_alloc(&h, 4096, RT_OBJ_SCAN);
    scan[1] = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    big_scan[500] = rt_heap_alloc(&h, 32, RT_OBJ_LEAF);
    r.p[0] = scan;
    r.p[1] = big_scan;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 64 + 4096 + 64 + 32);
    rt_heap_destroy(&h);
}

typedef struct scan_ctx_s {
    const void *start;
    size_t len;
} scan_ctx_t;

static void scan_state(void *ctx, rt_gc_t *gc)
{
    scan_ctx_t *sc = ctx;
    rt_gc_scan(gc, sc->start, sc->len);
}

static void test_foreign_pointers(void)
{
    rt_heap_t a, b;
    rt_heap_init(&a);
    rt_heap_init(&b);
    /* a's object is referenced from b; collecting b must not mark it in a. */
    char *in_a = rt_heap_alloc(&a, 64, RT_OBJ_LEAF);
    char *big_a = rt_heap_alloc(&a, 5000, RT_OBJ_LEAF);
    uint64_t on_stack[4] = {1, 2, 3, 4};
    uintptr_t *sb = rt_heap_alloc(&b, 1024, RT_OBJ_SCAN);
    size_t k = 0;
    sb[k++] = (uintptr_t)in_a;
    sb[k++] = (uintptr_t)(in_a + 8);
    sb[k++] = (uintptr_t)big_a;
    sb[k++] = (uintptr_t)(big_a + 100);
    sb[k++] = (uintptr_t)on_stack;
    sb[k++] = (uintptr_t)&k;
    sb[k++] = (uintptr_t)test_foreign_pointers;
    sb[k++] = (uintptr_t)&check_rng_state;
    sb[k++] = ~(uintptr_t)0;
    sb[k++] = (uintptr_t)1 << 63;
    sb[k++] = (uintptr_t)sb & ~(uintptr_t)(ARENA - 1);                /* b's arena header */
    sb[k++] = ((uintptr_t)sb & ~(uintptr_t)(ARENA - 1)) + 4096;       /* descriptors */
    sb[k++] = ((uintptr_t)sb & ~(uintptr_t)(ARENA - 1)) + ARENA - 16; /* maybe a free chunk */
    /* The next arena, maybe unmapped. */
    sb[k++] = ((uintptr_t)sb & ~(uintptr_t)(ARENA - 1)) + ARENA;
    sb[k++] = ((uintptr_t)sb & ~(uintptr_t)(ARENA - 1)) - 8;
    while (k < 128)
        sb[k++] = (uintptr_t)rnd();
    roots_t r = {.p = {sb, on_stack, &k, (void *)12345, (void *)~(uintptr_t)0}, .n = 5};
    rt_heap_collect(&b, trace_roots, &r);
    CHECK_EQ(used_of(&b), 1024);
    /* Nothing of a was marked by b's collection, so a's objects, unrooted, go. */
    rt_heap_collect(&a, NULL, NULL);
    CHECK_EQ(used_of(&a), 0);
    CHECK_EQ(heap_bytes_of(&a), 0);

    /* A conservative range scan (as of an actor's state) sees stack and heap words alike. */
    void *obj = rt_heap_alloc(&a, 48, RT_OBJ_LEAF);
    struct {
        uint64_t n;
        void *p;
        uint32_t x, y;
        void *q;
    } state = {.n = 7, .p = obj, .x = 1, .y = 2, .q = on_stack};
    rt_heap_alloc(&a, 48, RT_OBJ_LEAF);
    r.n = 0;
    rt_heap_collect(&a, (rt_trace_fn)NULL, NULL);
    CHECK_EQ(used_of(&a), 0);
    obj = rt_heap_alloc(&a, 48, RT_OBJ_LEAF);
    state.p = obj;
    rt_heap_alloc(&a, 48, RT_OBJ_LEAF);
    scan_ctx_t sc = {&state, sizeof state};
    rt_heap_collect(&a, scan_state, &sc);
    CHECK_EQ(used_of(&a), 48);
    rt_heap_destroy(&a);
    rt_heap_destroy(&b);
}

static void test_binaries(void)
{
    size_t count0, bytes0, count, bytes;
    rt_bin_totals(&count0, &bytes0);
    rt_bin_t *b = rt_bin_new("hello", 5);
    CHECK(b != NULL);
    CHECK_EQ(rt_bin_len(b), 5);
    CHECK(memcmp(rt_bin_data(b), "hello", 5) == 0);
    CHECK_EQ((uintptr_t)rt_bin_data(b) % 16, 0);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0 + 1);
    CHECK_EQ(bytes, bytes0 + 5);

    rt_heap_t h1, h2;
    rt_heap_init(&h1);
    rt_heap_init(&h2);
    void *hd1 = rt_heap_hold_bin(&h1, rt_bin_retain(b));
    void *hd2 = rt_heap_hold_bin(&h2, rt_bin_retain(b));
    CHECK_EQ(rt_bin_refs(b), 3);
    CHECK(rt_heap_bin(hd1) == b && rt_heap_bin(hd2) == b);
    rt_heap_stats_t st;
    rt_heap_stats(&h1, &st);
    CHECK_EQ(st.bin_bytes, 5);

    /* Rooted handles keep their reference; a swept handle drops it. */
    roots_t r = {.p = {hd1}, .n = 1};
    rt_heap_collect(&h1, trace_roots, &r);
    CHECK_EQ(rt_bin_refs(b), 3);
    r.n = 0;
    rt_heap_collect(&h1, trace_roots, &r);
    CHECK_EQ(rt_bin_refs(b), 2);
    rt_heap_stats(&h1, &st);
    CHECK_EQ(st.bin_bytes, 0);
    /* A handle reached through a SCAN object stays. */
    void **holder = rt_heap_alloc(&h2, 32, RT_OBJ_SCAN);
    holder[1] = hd2;
    r.p[0] = holder;
    r.n = 1;
    rt_heap_collect(&h2, trace_roots, &r);
    CHECK_EQ(rt_bin_refs(b), 2);
    /* Destroy drops the handles' references. */
    rt_heap_destroy(&h2);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_bin_release(b);
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0);
    CHECK_EQ(bytes, bytes0);

    /* rt_heap_free of a handle drops its reference too. */
    b = rt_bin_alloc(100);
    void *hd = rt_heap_hold_bin(&h1, rt_bin_retain(b));
    rt_heap_free(&h1, hd);
    CHECK_EQ(rt_bin_refs(b), 1);
    rt_bin_release(b);

    /* Held binary bytes count toward the trigger: an actor with few objects still collects. */
    rt_heap_destroy(&h1);
    CHECK(!rt_heap_should_collect(&h1));
    void *handles[8];
    for (int i = 0; i < 8; i++)
        handles[i] = rt_heap_hold_bin(&h1, rt_bin_alloc(4096));
    CHECK(used_of(&h1) < 1024);
    CHECK(rt_heap_should_collect(&h1));
    r.p[0] = handles[0];
    rt_heap_collect(&h1, trace_roots, &r);
    rt_heap_stats(&h1, &st);
    CHECK_EQ(st.bin_bytes, 4096);
    CHECK(!rt_heap_should_collect(&h1));
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0 + 1);
    rt_heap_destroy(&h1);
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0);
    CHECK_EQ(bytes, bytes0);
}

/* A tail rides after the data: invisible to rt_bin_len, counted wherever bytes are. */
static void test_binary_tail(void)
{
    size_t count0, bytes0, count, bytes, n;
    rt_bin_totals(&count0, &bytes0);
    rt_bin_t *b = rt_bin_alloc_tail(5, 4);
    CHECK(b != NULL);
    memcpy(rt_bin_data(b), "hello", 5);
    memcpy(rt_bin_data(b) + 5, "pub", 4);
    CHECK_EQ(rt_bin_len(b), 5);
    CHECK_EQ((uintptr_t)rt_bin_data(b) % 16, 0);
    CHECK(memcmp(rt_bin_tail(b, &n), "pub", 4) == 0);
    CHECK_EQ(n, 4);
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0 + 1);
    CHECK_EQ(bytes, bytes0 + 9);
    rt_heap_t h;
    rt_heap_init(&h);
    rt_heap_hold_bin(&h, rt_bin_retain(b));
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.bin_bytes, 9);
    rt_heap_destroy(&h);
    rt_bin_release(b);
    rt_bin_totals(&count, &bytes);
    CHECK_EQ(count, count0);
    CHECK_EQ(bytes, bytes0);

    /* Made without one: an empty tail, and a copy of the data alone carries none. */
    b = rt_bin_new("hello", 5);
    rt_bin_tail(b, &n);
    CHECK_EQ(n, 0);
    rt_bin_release(b);
    CHECK(rt_bin_alloc_tail(1, (size_t)UINT32_MAX + 1) == NULL);
}

static void test_large(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    size_t big = 3u << 20;
    uintptr_t *l = rt_heap_alloc(&h, big, RT_OBJ_SCAN);
    CHECK(l != NULL);
    CHECK_EQ((uintptr_t)l % 16, 0);
    CHECK_EQ(l[big / 8 - 1], 0);
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK(st.heap_bytes >= big && st.heap_bytes < big + 64);
    /* Pointers anywhere in a large SCAN object are found, including at its very end. */
    void *s1 = rt_heap_alloc(&h, 16, RT_OBJ_LEAF);
    void *s2 = rt_heap_alloc(&h, 2000, RT_OBJ_LEAF);
    void *s3 = rt_heap_alloc(&h, 2000, RT_OBJ_LEAF); /* garbage */
    (void)s3;
    l[0] = (uintptr_t)s1;
    l[big / 8 - 1] = (uintptr_t)s2 + 1999;
    roots_t r = {.p = {(char *)l + big / 2}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), big + 16 + 2000);
    /* A pointer one past the end of a large object does not keep it. */
    r.p[0] = (char *)s2 + 2000;
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), 0);
    CHECK_EQ(heap_bytes_of(&h), 0);
    rt_heap_destroy(&h);
}

/*
** A large object that lies between two of the heap's arenas in the address space is found by
** the collector. Past glibc's mmap threshold each large object (calloc'ed) is a mapping of its
** own, and Linux places mappings top-down: one made while the heap's first arena fills lies
** below it, and the heap's next arena below that. The collector took a word in that stretch for
** one of an arena the heap does not have, and swept the object while it was still held.
*/
static void test_large_between_arenas(void)
{
#ifdef RT_SANITIZED
    /* The sanitizers' allocators place large objects themselves: no such layout to make. */
    fprintf(stderr, "  (not under a sanitizer: its allocator ignores the mmap threshold)\n");
#else
    enum { BIG = 256 * 1024, EVERY = 256, MOST = 8 * 1024 };
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    rt_heap_t h;
    rt_heap_init(&h);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    unsigned char *bigs[MOST / EVERY] = {0}, *big = NULL;
    /* Chunks (an object of 1000 bytes each) fill arena after arena, a large object made every
       EVERY of them, until one of those lies between the lowest and the highest chunk. */
    for (int k = 0; k < MOST && !big; k++) {
        uintptr_t p = (uintptr_t)rt_heap_alloc(&h, 1000, RT_OBJ_LEAF);
        CHECK(p != 0);
        lo = p < lo ? p : lo;
        hi = p > hi ? p : hi;
        if (k % EVERY == 0 && (bigs[k / EVERY] = rt_heap_alloc(&h, BIG, RT_OBJ_LEAF)) != NULL)
            memset(bigs[k / EVERY], 0x5a, BIG);
        for (int i = 0; i <= k / EVERY && !big; i++)
            if (bigs[i] && lo < (uintptr_t)bigs[i] && (uintptr_t)bigs[i] < hi)
                big = bigs[i];
    }
    CHECK(big != NULL); /* the layout this test is about */
    roots_t r = {.p = {big + BIG / 2}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK_EQ(used_of(&h), BIG); /* it alone is kept: the chunks' objects and other big ones go */
    CHECK(big && big[0] == 0x5a && big[BIG - 1] == 0x5a);
    rt_heap_destroy(&h);
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
}

static void test_free(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    void *ps[200];
    for (int i = 0; i < 200; i++)
        ps[i] = rt_heap_alloc(&h, 64, RT_OBJ_SCAN);
    CHECK_EQ(used_of(&h), 200 * 64);
    size_t before = heap_bytes_of(&h);
    CHECK_EQ(before, 13 * CHUNK);
    for (int i = 0; i < 200; i += 2)
        rt_heap_free(&h, ps[i]);
    CHECK_EQ(used_of(&h), 100 * 64);
    /* Freed slots in full chunks are reused before any new chunk is taken. */
    for (int i = 0; i < 200; i += 2)
        ps[i] = rt_heap_alloc(&h, 64, RT_OBJ_SCAN);
    CHECK_EQ(heap_bytes_of(&h), before);
    for (int i = 0; i < 200; i++)
        rt_heap_free(&h, ps[i]);
    CHECK_EQ(used_of(&h), 0);
    CHECK(heap_bytes_of(&h) <= CHUNK); /* only the current chunk stays */
    void *big = rt_heap_alloc(&h, 10000, RT_OBJ_LEAF);
    rt_heap_free(&h, big);
    rt_heap_free(&h, NULL);
    CHECK_EQ(used_of(&h), 0);
    CHECK(heap_bytes_of(&h) <= CHUNK);
    rt_heap_destroy(&h);
}

/*
** A queue freed one message at a time, oldest first or newest first (acknowledged, or
** dropped), gives its chunks back as they empty: one empty chunk per class at most stays.
*/
static void test_free_whole_queue(void)
{
    enum { N = 2000 };
    static void *ps[N];
    for (int order = 0; order < 2; order++) {
        rt_heap_t h;
        rt_heap_init(&h);
        for (int i = 0; i < N; i++)
            ps[i] = rt_heap_alloc(&h, i % 2 ? 48 : 16, i % 2 ? RT_OBJ_SCAN : RT_OBJ_LEAF);
        CHECK(heap_bytes_of(&h) >= N / 2 * (48 + 16));
        for (int i = 0; i < N; i++)
            rt_heap_free(&h, ps[order ? N - 1 - i : i]);
        CHECK_EQ(used_of(&h), 0);
        CHECK(heap_bytes_of(&h) <= 2 * CHUNK);
        rt_heap_destroy(&h);
    }
}

static void test_configure(void)
{
    rt_heap_config_t cfg = {.min_heap = 64 * 1024, .gc_factor = 3.0};
    rt_heap_configure(&cfg);
    rt_heap_t h;
    rt_heap_init(&h);
    void *big = rt_heap_alloc(&h, 40000, RT_OBJ_LEAF);
    roots_t r = {.p = {big}, .n = 1};
    CHECK(!rt_heap_should_collect(&h)); /* 40000 < 64 KiB */
    rt_heap_collect(&h, trace_roots, &r);
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.next_gc, 3 * 40000);
    r.n = 0;
    rt_heap_collect(&h, trace_roots, &r);
    rt_heap_stats(&h, &st);
    CHECK_EQ(st.next_gc, 64 * 1024);
    rt_heap_destroy(&h);
    cfg.min_heap = RT_HEAP_MIN_HEAP_DEFAULT;
    cfg.gc_factor = RT_HEAP_GC_FACTOR_DEFAULT;
    rt_heap_configure(&cfg);
}

/* Debug builds fill freed objects with 0xaa (sanitizer builds forbid reading them at all). */
static void test_poison(void)
{
#if !defined(NDEBUG) && !defined(RT_SANITIZED)
    rt_heap_t h;
    rt_heap_init(&h);
    unsigned char *a = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    unsigned char *b = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    unsigned char *c = rt_heap_alloc(&h, 64, RT_OBJ_LEAF);
    rt_heap_free(&h, a);
    CHECK(a[0] == 0xaa && a[63] == 0xaa);
    roots_t r = {.p = {c}, .n = 1};
    rt_heap_collect(&h, trace_roots, &r);
    CHECK(b[0] == 0xaa && b[63] == 0xaa);
    CHECK(c[0] == 0 && c[63] == 0);
    rt_heap_destroy(&h);
#endif
}

static void test_destroy_returns_chunks(void)
{
    rt_heap_pool_trim();
    size_t base = pool_in_use();
    rt_heap_t h;
    rt_heap_init(&h);
    for (int i = 0; i < 5000; i++)
        rt_heap_alloc(&h, (size_t)(rnd() % 1100), i & 1 ? RT_OBJ_SCAN : RT_OBJ_LEAF);
    CHECK(heap_bytes_of(&h) > 1000 * CHUNK);
    CHECK(pool_in_use() > base);
    rt_heap_destroy(&h);
    CHECK_EQ(heap_bytes_of(&h), 0);
    rt_heap_pool_trim();
    CHECK_EQ(pool_in_use(), base);
    /* A destroyed heap is a valid empty heap again. */
    CHECK(rt_heap_alloc(&h, 8, RT_OBJ_LEAF) != NULL);
    rt_heap_destroy(&h);
}

static void test_million_heaps(void)
{
    rt_heap_pool_trim();
    size_t mapped, in_use;
    rt_heap_pool_stats(&mapped, &in_use);
    CHECK_EQ(in_use, 0);
    long n = check_scale(1000000);
    rt_heap_t *hs = calloc((size_t)n, sizeof *hs);
    CHECK(hs != NULL);
    if (!hs)
        return;
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        rt_heap_t *h = &hs[i];
        rt_heap_init(h);
        void **a = rt_heap_alloc(h, 24, RT_OBJ_SCAN);
        a[1] = rt_heap_alloc(h, RT_HEAP_FIRST + 1, RT_OBJ_LEAF); /* too big for the first block */
        if (i % 16 == 0)
            rt_heap_collect(h, NULL, NULL);
    }
    double t1 = now_s();
    rt_heap_pool_stats(&mapped, &in_use);
    size_t peak_mapped = mapped;
    CHECK(in_use >= (size_t)n * 15 / 16 * CHUNK); /* every 16th heap collected its object */
    for (long i = 0; i < n; i++)
        rt_heap_destroy(&hs[i]);
    double t2 = now_s();
    rt_heap_pool_stats(&mapped, &in_use);
    /* Left: this thread's cache (64 chunks at most, in one or two arenas) and one spare. */
    CHECK(in_use <= 64 * CHUNK);
    CHECK(mapped <= 3 * ARENA);
    rt_heap_pool_trim();
    rt_heap_pool_stats(&mapped, &in_use);
    CHECK_EQ(in_use, 0);
    CHECK(mapped <= ARENA);
    fprintf(stderr,
            "  %ld heaps: peak mapped %.0f MiB, spawn %.0f ns/heap, exit %.0f ns/heap, "
            "after trim mapped %zu in use %zu\n",
            n, peak_mapped / 1048576.0, (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, mapped, in_use);
    free(hs);
}

static size_t rss_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * 4096;
}

/* Actors exiting in random order leave arenas part-free; trim still gives their pages back. */
static void test_trim_releases_pages(void)
{
    rt_heap_pool_trim();
    long n = 8000;
    rt_heap_t *hs = calloc((size_t)n, sizeof *hs);
    for (long i = 0; i < n; i++)
        memset(rt_heap_alloc(&hs[i], 1000, RT_OBJ_LEAF), 1, 1000); /* one chunk each */
    size_t mapped0, mapped1, rss0 = rss_bytes();
    rt_heap_pool_stats(&mapped0, NULL);
    for (long i = 0; i < n; i++)
        if (i % 16)
            rt_heap_destroy(&hs[i]);
    rt_heap_pool_trim();
    size_t rss1 = rss_bytes();
    rt_heap_pool_stats(&mapped1, NULL);
    CHECK_EQ(mapped1, mapped0); /* every arena still holds a live chunk */
    fprintf(stderr, "  15/16 of %ld one-chunk heaps gone: RSS %.1f -> %.1f MB, mapped %.1f MB\n", n,
            rss0 / 1e6, rss1 / 1e6, mapped1 / 1e6);
    /* Pages hold 4 chunks, so about 3/4 of the freed chunks' memory can go back. */
    CHECK(rss1 + (size_t)n / 2 * 1024 < rss0);
    for (long i = 0; i < n; i += 16)
        rt_heap_destroy(&hs[i]);
    free(hs);
    rt_heap_pool_trim();
    rt_heap_pool_stats(&mapped1, NULL);
    CHECK_EQ(mapped1, 0);
}

/* ------------------------------------------------------------------------ */
/* Threads: each with its own heaps, sharing binaries, returning chunks at exit. */

#define NTHREADS 4
static rt_bin_t *shared_bins[16];

/* Heaps left by the threads, as actors that migrate; main destroys them after the joins. */
static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_heap_t *handoff[NTHREADS * 4]; /* a heap holding objects cannot move */
static int handoff_n;

/* Each thread's heaps, read meanwhile by a sampler thread as rtctl would, while a trimmer
   thread gives free chunks' pages back as rtd's does: a page of a chunk in use given back
   reads as zeros, which the lists' checks below see. */
static rt_heap_t thread_heaps[NTHREADS][8];
static atomic_bool sampler_stop;
static atomic_long lists_broken;
#define NODE_TAG 0x5bd1e9955bd1e995ull

static void *trimmer_main(void *arg)
{
    long *trims = arg;
    while (!atomic_load(&sampler_stop)) {
        rt_heap_pool_trim();
        ++*trims;
    }
    return NULL;
}

static void *sampler_main(void *arg)
{
    size_t *samples = arg;
    while (!atomic_load(&sampler_stop)) {
        for (int t = 0; t < NTHREADS; t++) {
            for (int i = 0; i < 8; i++) {
                rt_heap_stats_t st;
                rt_heap_stats(&thread_heaps[t][i], &st);
                *samples += st.heap_bytes > 0;
            }
        }
    }
    return NULL;
}

static void *thread_main(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    /* Static and all-zero, so already valid empty heaps (rt_heap_init would race with the sampler).
     */
    rt_heap_t *heaps = thread_heaps[(uintptr_t)arg - 1];
    node_t *heads[8] = {0};
    int lens[8] = {0};
    long iters = check_scale(200000);
    for (long it = 0; it < iters; it++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        int k = (int)(seed % 8);
        rt_heap_t *h = &heaps[k];
        node_t *n = rt_heap_alloc(h, sizeof *n, RT_OBJ_SCAN);
        if (!n)
            continue;
        n->id = (uint64_t)it;
        n->noise[0] = n->id ^ NODE_TAG;
        n->payload = rt_heap_alloc(h, (size_t)(seed >> 32) % 1500, RT_OBJ_LEAF);
        if (seed % 7 == 0)
            n->payload = rt_heap_hold_bin(h, rt_bin_retain(shared_bins[seed % 16]));
        /* Keep lists short: drop the tail beyond 51 nodes, checking every node on the way. */
        n->next = heads[k];
        heads[k] = n;
        node_t *p = n;
        int len = 1;
        for (; p->next && len < 51; len++) {
            p = p->next;
            if (p->noise[0] != (p->id ^ NODE_TAG))
                atomic_fetch_add(&lists_broken, 1);
        }
        p->next = NULL;
        if (len != (lens[k] < 51 ? lens[k] + 1 : 51))
            atomic_fetch_add(&lists_broken, 1);
        lens[k] = len;
        if (rt_heap_should_collect(h)) {
            roots_t r = {.p = {heads[k]}, .n = 1};
            rt_heap_collect(h, trace_roots, &r);
        }
        if (seed % 50000 == 0) {
            rt_heap_destroy(h);
            heads[k] = NULL;
            lens[k] = 0;
        }
        if (it % 256 == 0)
            rt_heap_thread_flush(); /* chunks through the pool, where the trimmer works */
    }
    for (int i = 0; i < 4; i++)
        rt_heap_destroy(&heaps[i]);
    pthread_mutex_lock(&handoff_lock);
    for (int i = 4; i < 8; i++)
        handoff[handoff_n++] = &heaps[i];
    pthread_mutex_unlock(&handoff_lock);
    /* No rt_heap_thread_flush here: the exit destructor must do it. */
    return NULL;
}

static void test_threads(void)
{
    size_t count0;
    rt_bin_totals(&count0, NULL);
    for (int i = 0; i < 16; i++)
        shared_bins[i] = rt_bin_alloc((size_t)(i + 1) * 100);
    pthread_t t[NTHREADS], sampler, trimmer;
    size_t samples = 0;
    long trims = 0;
    CHECK_EQ(pthread_create(&sampler, NULL, sampler_main, &samples), 0);
    CHECK_EQ(pthread_create(&trimmer, NULL, trimmer_main, &trims), 0);
    for (int i = 0; i < NTHREADS; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, thread_main, (void *)(uintptr_t)(i + 1)), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    atomic_store(&sampler_stop, true);
    pthread_join(sampler, NULL);
    pthread_join(trimmer, NULL);
    CHECK(samples > 0);
    CHECK(trims > 0);
    CHECK_EQ(atomic_load(&lists_broken), 0);
    CHECK_EQ(handoff_n, NTHREADS * 4);
    for (int i = 0; i < handoff_n; i++) {
        rt_heap_collect(handoff[i], NULL, NULL);
        rt_heap_destroy(handoff[i]);
    }
    for (int i = 0; i < 16; i++) {
        CHECK_EQ(rt_bin_refs(shared_bins[i]), 1);
        rt_bin_release(shared_bins[i]);
    }
    size_t count;
    rt_bin_totals(&count, NULL);
    CHECK_EQ(count, count0);
    rt_heap_pool_trim();
    size_t mapped, in_use;
    rt_heap_pool_stats(&mapped, &in_use);
    CHECK_EQ(in_use, 0);
    CHECK_EQ(mapped, 0);
}

/*
** Pool churn: threads make and drop heaps big enough that arenas fill, empty
** and get unmapped while other threads collect. Every SCAN object holds
** addresses published by other threads, whose chunks may meanwhile have gone
** back to the pool or to the OS: a collection must ignore them without
** reading those arenas (a crash or a sanitizer report otherwise).
*/
static _Atomic uintptr_t published[64];

static void *churn_main(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x2545f4914f6cdd1dull + 7;
    long rounds = check_scale(300);
    for (long it = 0; it < rounds; it++) {
        rt_heap_t h;
        rt_heap_init(&h);
        int n = 200 + (int)(seed % 3000);
        void *first = NULL;
        for (int i = 0; i < n; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            size_t sz = 16 + (size_t)(seed >> 40) % (i % 50 == 0 ? 3000 : 600);
            uintptr_t *o = rt_heap_alloc(&h, sz, RT_OBJ_SCAN);
            if (!o)
                continue;
            o[0] = (uintptr_t)first;
            o[1] = atomic_load_explicit(&published[seed % 64], memory_order_relaxed);
            o[1] += (seed >> 8) % 2048; /* also somewhere past it, maybe a free chunk */
            if (sz >= 32)
                o[2] = (uintptr_t)seed;
            if (i % 3 == 0)
                first = o;
            atomic_store_explicit(&published[(seed >> 16) % 64], (uintptr_t)o,
                                  memory_order_relaxed);
        }
        roots_t r = {.p = {first}, .n = 1};
        rt_heap_collect(&h, trace_roots, &r);
        rt_heap_destroy(&h);
        if (it % 4 == 0)
            rt_heap_thread_flush(); /* chunks back to the pool, so arenas empty and unmap */
    }
    return NULL;
}

static void test_pool_churn(void)
{
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, churn_main, (void *)(uintptr_t)(i + 1)), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    rt_heap_pool_trim();
    size_t mapped, in_use;
    rt_heap_pool_stats(&mapped, &in_use);
    CHECK_EQ(in_use, 0);
    CHECK_EQ(mapped, 0);
}

/*
** Binaries made on one thread and released on another, as a publisher's scheduler makes
** them and a subscriber's lets them go, are reused through the pool: over 300,000 of
** them the pool's free memory stays within what its lists and depot can hold (both
** threads' lists at their high mark, the depot full, one batch just carved), where
** malloc'd anew each would be 300,000 blocks; a trim gives it all back. Each payload is
** checked by the releasing thread, so a block handed out twice shows.
*/
#define BIN_ROUNDS 200
#define BIN_PER_ROUND 1500
#define BIN_LEN 1024
#define BIN_TAIL 40

static rt_bin_t *bin_handoff[BIN_PER_ROUND];
static pthread_barrier_t bins_made, bins_released;
static atomic_int bins_corrupt;

static void *bin_release_main(void *arg)
{
    (void)arg;
    for (int r = 0; r < BIN_ROUNDS; r++) {
        pthread_barrier_wait(&bins_made);
        for (int i = 0; i < BIN_PER_ROUND; i++) {
            const uint8_t *d = rt_bin_data(bin_handoff[i]);
            if (d[0] != (uint8_t)(r + i) || d[BIN_LEN - 1] != (uint8_t)(r + i))
                atomic_fetch_add(&bins_corrupt, 1);
            rt_bin_release(bin_handoff[i]);
        }
        pthread_barrier_wait(&bins_released);
    }
    return NULL; /* its lists go to the depot as it exits (pool.c) */
}

static void test_binary_pool_across_threads(void)
{
    rt__bin_pool_trim();
    CHECK_EQ(rt__bin_pool_free_bytes(), 0);
    size_t header = 16; /* a binary's header (heap.c) */
    size_t block = (header + BIN_LEN + BIN_TAIL + RT_BIN_STEP - 1) / RT_BIN_STEP * RT_BIN_STEP;
    size_t bound = (2 * RT_BIN_CACHE_HIGH + (RT_BIN_DEPOT_MAX + 1) * RT_BIN_BATCH) * block;
    size_t free_max = 0;
    pthread_barrier_init(&bins_made, NULL, 2);
    pthread_barrier_init(&bins_released, NULL, 2);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, bin_release_main, NULL), 0);
    for (int r = 0; r < BIN_ROUNDS; r++) {
        for (int i = 0; i < BIN_PER_ROUND; i++) {
            rt_bin_t *b = rt_bin_alloc_tail(BIN_LEN, BIN_TAIL);
            CHECK(b != NULL);
            memset(rt_bin_data(b), (uint8_t)(r + i), BIN_LEN + BIN_TAIL);
            bin_handoff[i] = b;
        }
        pthread_barrier_wait(&bins_made);
        pthread_barrier_wait(&bins_released);
        size_t f = rt__bin_pool_free_bytes();
        free_max = f > free_max ? f : free_max;
    }
    pthread_join(t, NULL);
    pthread_barrier_destroy(&bins_made);
    pthread_barrier_destroy(&bins_released);
    fprintf(stderr, "binary pool: at most %zu bytes free (bound %zu)\n", free_max, bound);
    CHECK_EQ(atomic_load(&bins_corrupt), 0);
    CHECK(free_max <= bound);
#if !defined(RT_SANITIZED) || defined(RT_TSAN) /* under ASan binaries are plain malloc */
    CHECK(free_max > 0);
#endif
    rt__bin_pool_trim();
    CHECK_EQ(rt__bin_pool_free_bytes(), 0);
}

/* ------------------------------------------------------------------------ */
/* GC pause with about 1 MB live under steady allocation. */

#define BUCKETS 1024
#define CHAIN 10

typedef struct world_s {
    node_t **table; /* BUCKETS list heads: a large SCAN object */
} world_t;

static void trace_world(void *ctx, rt_gc_t *gc)
{
    world_t *w = ctx;
    rt_gc_mark(gc, w->table);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One "message": a new node at the head of a random bucket, maybe with a payload; the 11th goes. */
static long world_step(rt_heap_t *h, world_t *w, uint64_t id)
{
    uint64_t x = rnd();
    node_t **b = &w->table[x % BUCKETS];
    node_t *n = rt_heap_alloc(h, sizeof *n, RT_OBJ_SCAN);
    long allocs = 1;
    n->id = id;
    for (int k = 0; k < 5; k++)
        n->noise[k] = x * (uint64_t)(k + 3);
    if ((x >> 20) % 8 == 0) {
        n->payload = rt_heap_alloc(h, 192, RT_OBJ_LEAF);
        allocs++;
    } else if ((x >> 20) % 64 == 1) {
        n->payload = rt_heap_alloc(h, 1500, RT_OBJ_LEAF);
        allocs++;
    }
    n->next = *b;
    *b = n;
    node_t *p = n;
    for (int d = 1; p && d < CHAIN; d++)
        p = p->next;
    if (p)
        p->next = NULL;
    return allocs;
}

static void test_gc_pause_1mb_live(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    world_t w = {.table = rt_heap_alloc(&h, BUCKETS * sizeof(node_t *), RT_OBJ_SCAN)};
    uint64_t id = 0;
    for (long i = 0; i < BUCKETS * CHAIN * 3; i++) {
        world_step(&h, &w, id++);
        if (rt_heap_should_collect(&h))
            rt_heap_collect(&h, trace_world, &w);
    }
    long steps = check_scale(3000000), allocs = 0;
    size_t maxp = 4096, np = 0;
    double *pauses = malloc(maxp * sizeof *pauses), *cpus = malloc(maxp * sizeof *cpus);
    double worst_ratio = 0, tgc = 0;
    size_t min_live = SIZE_MAX, max_live = 0, max_heap = 0;
    int over = 0;
    double t0 = now_s();
    for (long i = 0; i < steps; i++) {
        allocs += world_step(&h, &w, id++);
        rt_heap_stats_t st;
        rt_heap_stats(&h, &st);
        if (st.heap_bytes > 2 * st.live_bytes + RT_HEAP_MIN_HEAP_DEFAULT)
            over++;
        if (st.heap_bytes > max_heap)
            max_heap = st.heap_bytes;
        if ((double)st.heap_bytes / st.live_bytes > worst_ratio)
            worst_ratio = (double)st.heap_bytes / st.live_bytes;
        if (!rt_heap_should_collect(&h))
            continue;
        double g0 = now_s(), c0 = thread_cpu_s();
        rt_heap_collect(&h, trace_world, &w);
        double g = now_s() - g0, c = thread_cpu_s() - c0;
        tgc += g;
        if (np == maxp) {
            maxp *= 2;
            pauses = realloc(pauses, maxp * sizeof *pauses);
            cpus = realloc(cpus, maxp * sizeof *cpus);
        }
        cpus[np] = c * 1e6;
        pauses[np++] = g * 1e6;
        rt_heap_stats(&h, &st);
        if (st.live_bytes < min_live)
            min_live = st.live_bytes;
        if (st.live_bytes > max_live)
            max_live = st.live_bytes;
    }
    double t = now_s() - t0;
    qsort(pauses, np, sizeof *pauses, cmp_double);
    qsort(cpus, np, sizeof *cpus, cmp_double);
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    CHECK(np > 0);
    CHECK_EQ(over, 0);
    CHECK(max_live > 900 * 1024 && min_live > 900 * 1024);
    double p50 = np ? pauses[np / 2] : 0, p99 = np ? pauses[np * 99 / 100] : 0;
    double pmax = np ? pauses[np - 1] : 0;
    fprintf(stderr,
            "  live %.2f-%.2f MB, %zu GCs, pause p50 %.0f us p99 %.0f us max %.0f us "
            "(heap max_pause_us %u; thread CPU p50 %.0f p99 %.0f max %.0f us)\n"
            "  heap max %.2f MB, worst heap/live %.3f; %.1f ns per alloc incl. GC "
            "(GC %.0f%% of time)\n",
            min_live / 1e6, max_live / 1e6, np, p50, p99, pmax, st.max_pause_us,
            np ? cpus[np / 2] : 0, np ? cpus[np * 99 / 100] : 0, np ? cpus[np - 1] : 0,
            max_heap / 1e6, worst_ratio, t / allocs * 1e9, tgc / t * 100);
#ifndef RT_SANITIZED
    /* The collector's own CPU time, not the wall clock: a busy machine preempts the thread
       mid-collection (wall p99 38 ms with both cores busy, CPU p99 under 1 ms). Generous:
       the target is 1 ms. */
    CHECK(np && cpus[np * 99 / 100] < 20000);
#endif
    free(pauses);
    free(cpus);
    rt_heap_destroy(&h);
}

/* ------------------------------------------------------------------------ */
/* An actor-like loop making 1 GB of garbage around a stable live set. */

typedef struct actor_s {
    node_t **state; /* 4096 session records, SCAN */
} actor_t;

static void trace_actor(void *ctx, rt_gc_t *gc)
{
    actor_t *a = ctx;
    rt_gc_mark(gc, a->state);
}

static void test_garbage_1gb(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    actor_t a = {.state = rt_heap_alloc(&h, 4096 * sizeof(node_t *), RT_OBJ_SCAN)};
    for (int i = 0; i < 4096; i++) {
        a.state[i] = rt_heap_alloc(&h, sizeof(node_t), RT_OBJ_SCAN);
        a.state[i]->payload = rt_heap_alloc(&h, 40, RT_OBJ_LEAF);
    }
    rt_heap_collect(&h, trace_actor, &a);
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    size_t live0 = st.live_bytes;
    size_t goal = (size_t)check_scale(1L << 30), made = 0, max_heap = 0;
    double worst = 0;
    long msgs = 0, allocs = 0;
    double t0 = now_s();
    while (made < goal) {
        /* A message: parse into temporaries, update one record, answer. */
        uint64_t x = rnd();
        int n = 1 + (int)(x % 6);
        void *tmp = NULL;
        for (int k = 0; k < n; k++) {
            size_t sz = 16 + (size_t)((x >> (8 * k)) % 480);
            void **o = rt_heap_alloc(&h, sz, RT_OBJ_SCAN);
            o[0] = tmp;
            tmp = o;
            made += sz;
            allocs++;
        }
        if (x % 97 == 0) {
            rt_heap_alloc(&h, 6000, RT_OBJ_LEAF);
            made += 6000;
            allocs++;
        }
        if (x % 5 == 0) {
            node_t *rec = a.state[(x >> 32) % 4096];
            rec->payload = rt_heap_alloc(&h, 40, RT_OBJ_LEAF);
            made += 40;
            allocs++;
        }
        msgs++;
        rt_heap_stats(&h, &st);
        if (st.heap_bytes > max_heap)
            max_heap = st.heap_bytes;
        if ((double)st.heap_bytes / st.live_bytes > worst)
            worst = (double)st.heap_bytes / st.live_bytes;
        if (rt_heap_should_collect(&h))
            rt_heap_collect(&h, trace_actor, &a);
    }
    double t = now_s() - t0;
    rt_heap_stats(&h, &st);
    fprintf(stderr,
            "  %.0f MB garbage in %ld messages, %u GCs, live %zu KB, heap max %zu KB, "
            "worst heap/live %.3f, GC pause max %u us, %.1f ns per alloc\n",
            made / 1e6, msgs, st.gc_count, st.live_bytes / 1024, max_heap / 1024, worst,
            st.max_pause_us, t / allocs * 1e9);
    CHECK(st.live_bytes >= live0 - 1024 && st.live_bytes <= live0 + 1024);
    CHECK(worst < 2.0);
    rt_heap_destroy(&h);
}

/* Raw allocation speed: small objects that all die, with the GC that implies. */
static void test_alloc_speed(void)
{
    rt_heap_t h;
    rt_heap_init(&h);
    void *keep = rt_heap_alloc(&h, 64, RT_OBJ_SCAN);
    roots_t r = {.p = {keep}, .n = 1};
    long n = check_scale(20000000);
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        void **p = rt_heap_alloc(&h, 32 + (size_t)(i & 3) * 16, RT_OBJ_SCAN);
        p[0] = keep;
        if ((i & 15) == 0 && rt_heap_should_collect(&h))
            rt_heap_collect(&h, trace_roots, &r);
    }
    double t = now_s() - t0;
    rt_heap_stats_t st;
    rt_heap_stats(&h, &st);
    fprintf(stderr, "  %ld allocs of 32-80 bytes: %.1f ns per alloc incl. %u GCs\n", n, t / n * 1e9,
            st.gc_count);
    rt_heap_destroy(&h);
}

/* An optional argument runs only the tests whose names contain it (for profiling one). */
#define RUN_IF(fn)                                                                                 \
    do {                                                                                           \
        if (!only || strstr(#fn, only))                                                            \
            RUN(fn);                                                                               \
    } while (0)

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    RUN_IF(test_layout);
    RUN_IF(test_alloc_sizes);
    RUN_IF(test_first_block_growth);
    RUN_IF(test_first_block_gc);
    RUN_IF(test_alloc_bin);
    RUN_IF(test_collect_check);
    RUN_IF(test_roots);
    RUN_IF(test_scan_chains_cycles);
    RUN_IF(test_interior_pointers);
    RUN_IF(test_leaf_not_scanned);
    RUN_IF(test_foreign_pointers);
    RUN_IF(test_binaries);
    RUN_IF(test_binary_tail);
    RUN_IF(test_large);
    RUN_IF(test_large_between_arenas);
    RUN_IF(test_free);
    RUN_IF(test_free_whole_queue);
    RUN_IF(test_configure);
    RUN_IF(test_poison);
    RUN_IF(test_destroy_returns_chunks);
    RUN_IF(test_million_heaps);
    RUN_IF(test_trim_releases_pages);
    RUN_IF(test_threads);
    RUN_IF(test_pool_churn);
    RUN_IF(test_binary_pool_across_threads);
    RUN_IF(test_gc_pause_1mb_live);
    RUN_IF(test_garbage_1gb);
    RUN_IF(test_alloc_speed);
    rt_heap_thread_flush();
    rt_heap_pool_trim();
    return CHECK_SUMMARY();
}

/*
** libbson's allocator, wrapped to count (bson_mem.h). It keeps malloc underneath, as
** libbson's own does, and reads sizes back with malloc_usable_size, so a block allocated
** before the wrapper was installed is still freed by the same allocator.
*/
#include <bson/bson.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>

#include "bson_mem.h"

static _Thread_local int64_t thread_bytes; /* net bytes allocated on this thread */
static _Atomic int64_t total;              /* ... and in the whole process */

static int64_t bson_thread_bytes(void)
{
    return thread_bytes;
}

rt_meter_lib_t rt_bson_lib = {.thread_bytes = bson_thread_bytes};

static void count(int64_t d)
{
    thread_bytes += d;
    atomic_fetch_add_explicit(&total, d, memory_order_relaxed);
}

static void *mem_malloc(size_t n)
{
    void *p = malloc(n);
    if (p)
        count((int64_t)malloc_usable_size(p));
    return p;
}

static void *mem_calloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (p)
        count((int64_t)malloc_usable_size(p));
    return p;
}

static void *mem_realloc(void *p, size_t n)
{
    int64_t before = p ? (int64_t)malloc_usable_size(p) : 0;
    void *q = realloc(p, n);
    if (q)
        count((int64_t)malloc_usable_size(q) - before);
    else if (!n)
        count(-before); /* realloc(p, 0) freed p */
    return q;
}

static void mem_free(void *p)
{
    if (p)
        count(-(int64_t)malloc_usable_size(p));
    free(p);
}

static void *mem_aligned_alloc(size_t alignment, size_t n)
{
    void *p = aligned_alloc(alignment, n);
    if (p)
        count((int64_t)malloc_usable_size(p));
    return p;
}

static void install(void)
{
    static const bson_mem_vtable_t wrapped = {.malloc = mem_malloc,
                                              .calloc = mem_calloc,
                                              .realloc = mem_realloc,
                                              .free = mem_free,
                                              .aligned_alloc = mem_aligned_alloc};
    bson_mem_set_vtable(&wrapped);
}

void rt_bson_mem_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}

void rt_bson_mem_stats(size_t *used, size_t *charged)
{
    int64_t u = atomic_load_explicit(&total, memory_order_relaxed);
    int64_t c = atomic_load_explicit(&rt_bson_lib.charged, memory_order_relaxed);
    *used = u > 0 ? (size_t)u : 0;
    *charged = c > 0 ? (size_t)c : 0;
}

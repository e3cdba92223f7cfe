/*
** SQLite's allocator, wrapped to count per thread (sqlite_mem.h). The wrapper keeps SQLite's
** own allocator underneath, and SQLite keeps its process-wide figures above it
** (sqlite3_memory_used), so nothing changes but the count.
*/
#include <pthread.h>
#include <sqlite3.h>

#include "sqlite_mem.h"

static sqlite3_mem_methods base;           /* SQLite's own allocator */
static _Thread_local int64_t thread_bytes; /* net bytes allocated on this thread */

static int64_t sqlite_thread_bytes(void)
{
    return thread_bytes;
}

rt_meter_lib_t rt_sqlite_lib = {.thread_bytes = sqlite_thread_bytes};

static void *mem_malloc(int n)
{
    void *p = base.xMalloc(n);
    if (p)
        thread_bytes += base.xSize(p);
    return p;
}

static void mem_free(void *p)
{
    if (p)
        thread_bytes -= base.xSize(p);
    base.xFree(p);
}

static void *mem_realloc(void *p, int n)
{
    int before = base.xSize(p);
    void *q = base.xRealloc(p, n);
    if (q)
        thread_bytes += base.xSize(q) - before;
    return q;
}

static int mem_size(void *p)
{
    return base.xSize(p);
}

static int mem_roundup(int n)
{
    return base.xRoundup(n);
}

static int mem_init(void *app)
{
    (void)app;
    return base.xInit(base.pAppData);
}

static void mem_shutdown(void *app)
{
    (void)app;
    base.xShutdown(base.pAppData);
}

static void install(void)
{
    static const sqlite3_mem_methods wrapped = {mem_malloc,  mem_free, mem_realloc,  mem_size,
                                                mem_roundup, mem_init, mem_shutdown, NULL};
    /* Both fail (SQLITE_MISUSE) once SQLite is initialised: it keeps its allocator then. */
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &base) == SQLITE_OK)
        sqlite3_config(SQLITE_CONFIG_MALLOC, &wrapped);
    /* Its global state (mutexes, page cache groups) is allocated here, in no actor's window. */
    sqlite3_initialize();
}

void rt_sqlite_mem_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}

void rt_sqlite_mem_stats(size_t *used, size_t *charged)
{
    *used = (size_t)sqlite3_memory_used();
    int64_t c = atomic_load_explicit(&rt_sqlite_lib.charged, memory_order_relaxed);
    *charged = c > 0 ? (size_t)c : 0;
}

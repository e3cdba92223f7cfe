/* Stress: a million actors come and go and give everything back; a garbage-heavy actor
   keeps its heap near its live set. */
#include <malloc.h>

#include "rt_test.h"

enum { MSG_CHURN = RT_MSG_USER };

static int idle_init(rt_actor_t *self, void *state, void *arg)
{
    /* Some actors allocate, so their heaps and chunks are part of what must come back. */
    if (arg)
        return rt_alloc(self, 48, RT_OBJ_LEAF) ? 0 : RT_ENOMEM;
    return 0;
}

static void idle_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
}

static const rt_actor_type_t idle_type = {
    .name = "idle", .state_size = 8, .init = idle_init, .handle = idle_handle};

static void test_million_actors_memory_returned(void)
{
    long n = check_scale(1000000);
    malloc_trim(0);
    long rss0 = rss_bytes();
    size_t malloc0 = mallinfo2().uordblks;
    size_t mapped0, inuse0;
    rt_heap_pool_stats(&mapped0, &inuse0);
    rt_pid_t *pids = malloc((size_t)n * sizeof(rt_pid_t));
    uint64_t t0 = test_now_ms();
    long failed = 0;
    for (long i = 0; i < n; i++)
        failed += rt_spawn(&idle_type, (void *)(intptr_t)(i % 10 == 0), &pids[i]) != 0;
    CHECK_EQ(failed, 0);
    uint64_t t1 = test_now_ms();
    long rss1 = rss_bytes();
    rt_stats_t st;
    rt_stats(&st);
    CHECK_EQ(st.alive, (uint64_t)n);
    for (long i = 0; i < n; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    uint64_t t2 = test_now_ms();
    free(pids);
    /* Exited actors are freed after a grace period, idle schedulers included. */
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        test_sleep_ms(10);
        rt_stats(&st);
    } while (st.actor_bytes_in_use && test_now_ms() < end);
    rt_heap_pool_trim();
    malloc_trim(0);
    long rss2 = rss_bytes();
    size_t malloc2 = mallinfo2().uordblks;
    size_t mapped2, inuse2;
    rt_heap_pool_stats(&mapped2, &inuse2);
    rt_stats(&st);
    fprintf(stderr,
            "  %ld actors: spawn %.0f/ms, %ld B each while alive, exit %.0f/ms; after all exited: "
            "RSS +%ld KB, malloc in use %+ld KB, actor slab in use %zu B (mapped %zu KB), "
            "heap pool in use %zu B (mapped %zu KB)\n",
            n, (double)n / (double)(t1 - t0 + 1), (rss1 - rss0) / n,
            (double)n / (double)(t2 - t1 + 1), (rss2 - rss0) / 1024,
            ((long)malloc2 - (long)malloc0) / 1024, st.actor_bytes_in_use,
            st.actor_bytes_mapped / 1024, inuse2, mapped2 / 1024);
    CHECK_EQ(st.actor_bytes_in_use, 0);
    /* At most what the scheduler threads cache (64 KiB each), which is capped. */
    CHECK(inuse2 <= inuse0 + 3 * 64 * 1024);
    /* Every malloc'd byte is back, but for the capped envelope pools (a few MB at most). */
    CHECK((long)malloc2 - (long)malloc0 < 8 * 1024 * 1024);
#ifndef RT_SANITIZED
    /* RSS keeps the touched pid table (16 B per slot ever used), the actor slab (kept for
       reuse until shutdown) and what glibc retains. Sanitizer shadow memory makes RSS
       meaningless there. */
    CHECK(rss2 - rss0 < (long)st.actor_bytes_mapped + 16 * n + 64 * 1024 * 1024);
#endif
}

/* 1 GB of garbage over an actor's life; its heap stays under 2x its live set. */
#define LIVE_SLOTS 4096
typedef struct {
    void *live[LIVE_SLOTS]; /* 4096 x 64 B = 256 KB live */
    unsigned next;
    uint64_t max_heap;
    uint64_t garbage;
} churn_state_t;

static atomic_long churn_done;
static atomic_long churn_max_heap;
static atomic_long churn_gcs;

static void churn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    churn_state_t *st = state;
    rt_actor_info_t info;
    if (rt_actor_info(rt_self(self), &info) == 0 && (long)info.heap_bytes > atomic_load(&churn_max_heap))
        atomic_store(&churn_max_heap, (long)info.heap_bytes);
    for (int i = 0; i < 1000; i++) {
        void *p = rt_alloc(self, 64, RT_OBJ_LEAF);
        if (i % 8 == 0) {
            st->live[st->next] = p; /* replaces a live object, which becomes garbage */
            st->next = (st->next + 1) % LIVE_SLOTS;
        }
        st->garbage += 64;
    }
    atomic_store(&churn_gcs, info.gc_count);
    atomic_fetch_add(&churn_done, 1);
}

static int churn_init(rt_actor_t *self, void *state, void *arg)
{
    churn_state_t *st = state;
    for (int i = 0; i < LIVE_SLOTS; i++)
        st->live[i] = rt_alloc(self, 64, RT_OBJ_LEAF);
    return 0;
}

static const rt_actor_type_t churn_type = {.name = "churn", .state_size = sizeof(churn_state_t),
                                           .init = churn_init, .handle = churn_handle};

static void test_garbage_heavy_actor(void)
{
    long msgs = check_scale(16384); /* 16384 x 1000 x 64 B = 1 GB of allocation */
    atomic_store(&churn_done, 0);
    atomic_store(&churn_max_heap, 0);
    rt_pid_t p;
    rt_spawn(&churn_type, NULL, &p);
    /* Sent in slices so the mailbox stays small. */
    for (long sent = 0; sent < msgs; sent += 256) {
        for (long i = sent; i < msgs && i < sent + 256; i++)
            rt_send(p, MSG_CHURN, NULL, 0);
        CHECK(wait_at_least(&churn_done, sent + 256 < msgs ? sent + 256 : msgs));
    }
    long live = LIVE_SLOTS * 64;
    fprintf(stderr, "  %.2f GB of garbage: heap peaked at %ld KB for %ld KB live, %ld GCs\n",
            (double)msgs * 64000 / 1e9, atomic_load(&churn_max_heap) / 1024, live / 1024,
            atomic_load(&churn_gcs));
    CHECK(atomic_load(&churn_max_heap) < 2 * live);
    CHECK(atomic_load(&churn_gcs) > 100);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

int main(void)
{
    test_start(2);
    RUN(test_million_actors_memory_returned);
    RUN(test_garbage_heavy_actor);
    rt_shutdown();
    return CHECK_SUMMARY();
}

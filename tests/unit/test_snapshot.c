/* Introspection: per-actor and per-scheduler snapshots, taken while actors run. */
#include <pthread.h>

#include "rt_test.h"

enum { MSG_WORK = RT_MSG_USER, MSG_HOLD, MSG_BLOCK };

static atomic_long worked;
static atomic_long unblocked; /* MSG_BLOCK's handler returns once the test has looked */

static const char *busy_tag_name(uint32_t tag)
{
    switch (tag) {
    case MSG_WORK: return "work";
    case MSG_HOLD: return "hold";
    case MSG_BLOCK: return "block";
    }
    return NULL;
}

typedef struct {
    void *held;
} busy_state_t;

static void busy_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    busy_state_t *st = state;
    if (m->tag == MSG_HOLD) {
        st->held = rt_alloc(self, 64 * 1024, RT_OBJ_LEAF);
        rt_bin_t *b = rt_bin_new("payload-bytes", 13);
        /* Bigger than the heap's first block, so that the heap takes a chunk. */
        void **pair = rt_alloc(self, RT_HEAP_FIRST + 16, RT_OBJ_SCAN);
        pair[0] = st->held;
        pair[1] = rt_hold_bin(self, b);
        st->held = pair;
    } else if (m->tag == MSG_BLOCK) {
        CHECK(wait_at_least(&unblocked, 1));
    }
    atomic_fetch_add(&worked, 1);
}

static const rt_actor_type_t busy_type = {.name = "busy", .state_size = sizeof(busy_state_t),
                                          .handle = busy_handle, .tag_name = busy_tag_name};

typedef struct {
    long count;
    rt_pid_t want;
    rt_actor_info_t found;
    bool seen;
} scan_t;

static void scan_cb(const rt_actor_info_t *info, void *ud)
{
    scan_t *s = ud;
    s->count++;
    if (info->pid == s->want) {
        s->found = *info;
        s->seen = true;
    }
}

static void test_actor_fields(void)
{
    atomic_store(&worked, 0);
    rt_pid_t p;
    rt_spawn_opts_t o = {.name = "busy-one"};
    CHECK_EQ(rt_spawn_opt(&busy_type, NULL, &o, &p), 0);
    for (int i = 0; i < 10; i++)
        rt_send(p, MSG_WORK, NULL, 0);
    rt_send(p, MSG_HOLD, NULL, 0);
    CHECK(wait_at_least(&worked, 11));
    rt_actor_info_t info;
    /* Counters are published when the turn ends, a moment after the last handler. */
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        CHECK_EQ(rt_actor_info(p, &info), 0);
    } while (info.status != RT_STATUS_WAITING && test_now_ms() < end);
    CHECK_EQ(info.pid, p);
    CHECK(strcmp(info.type, "busy") == 0);
    CHECK(strcmp(info.name, "busy-one") == 0);
    CHECK_EQ(info.reductions, 11);
    CHECK(info.heap_bytes >= 64 * 1024);
    CHECK_EQ(info.bin_bytes, 13);
    CHECK(strcmp(info.current_handler, "hold") == 0);
    CHECK(info.cpu_ns > 0);
    CHECK_EQ(info.mailbox_len, 0);

    /* While the handler blocks, the mailbox length is visible and the status is running. */
    atomic_store(&unblocked, 0);
    rt_send(p, MSG_BLOCK, NULL, 0);
    for (int i = 0; i < 5; i++)
        rt_send(p, MSG_WORK, NULL, 0);
    end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        test_sleep_ms(5);
        CHECK_EQ(rt_actor_info(p, &info), 0);
    } while ((info.status != RT_STATUS_RUNNING || info.mailbox_len != 5) && test_now_ms() < end);
    CHECK_EQ(info.status, RT_STATUS_RUNNING);
    CHECK(strcmp(info.current_handler, "block") == 0);
    CHECK_EQ(info.mailbox_len, 5);
    atomic_store(&unblocked, 1);
    CHECK(wait_at_least(&worked, 17));
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
    CHECK_EQ(rt_actor_info(p, &info), RT_ENOPROC);
}

/* 20,000 actors, a snapshot walk while they work: the count is right and it is cheap. */
static atomic_bool stop_churn;

static void *churn_main(void *arg)
{
    rt_pid_t *pids = arg;
    long i = 0;
    while (!atomic_load(&stop_churn)) {
        rt_send(pids[i % 20000], MSG_WORK, NULL, 0);
        i++;
    }
    return NULL;
}

static void test_many_actors(void)
{
    long n = 20000;
    rt_pid_t *pids = calloc((size_t)n, sizeof(rt_pid_t));
    for (long i = 0; i < n; i++)
        rt_spawn(&busy_type, NULL, &pids[i]);
    atomic_store(&stop_churn, false);
    pthread_t th;
    pthread_create(&th, NULL, churn_main, pids);
    scan_t s = {.want = pids[n / 2]};
    uint64_t t0 = test_now_ms();
    int rounds = 10;
    for (int r = 0; r < rounds; r++) {
        s.count = 0;
        rt_snapshot_actors(scan_cb, &s);
        CHECK_EQ(s.count, n);
    }
    double ms = (double)(test_now_ms() - t0) / rounds;
    fprintf(stderr, "  snapshot of %ld actors under load: %.2f ms each\n", n, ms);
    CHECK(s.seen);
    atomic_store(&stop_churn, true);
    pthread_join(th, NULL);

    rt_sched_info_t si[8];
    size_t k = rt_snapshot_schedulers(si, 8);
    CHECK_EQ(k, 3); /* two schedulers and the blocking pool */
    CHECK(si[0].turns + si[1].turns > 0);
    CHECK(si[0].busy_ns <= si[0].wall_ns);
    CHECK(si[2].blocking_pool);
    for (long i = 0; i < n; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    free(pids);
}

/*
** The runtime's own memory: what it maps is resident only where touched, and what it
** holds grows with what it is given (actor structs, pid slots, queued envelopes).
*/
static void test_mem_stats(void)
{
    rt_mem_stats_t m0, m1;
    rt_mem_stats(&m0);
    CHECK(m0.slab_resident <= m0.slab_mapped && m0.tables_resident <= m0.tables_mapped);
    CHECK(m0.tables_resident < m0.tables_mapped / 100); /* reserved, barely touched */
    CHECK(m0.chunks_resident <= m0.chunks_mapped && m0.schedulers > 0);

    enum { N = 4000, QUEUED = 200, LEN = 200 };
    rt_pid_t *pids = calloc(N, sizeof(rt_pid_t));
    for (long i = 0; i < N; i++)
        CHECK_EQ(rt_spawn(&busy_type, NULL, &pids[i]), 0);
    atomic_store(&worked, 0);
    atomic_store(&unblocked, 0);
    rt_send(pids[0], MSG_HOLD, NULL, 0);
    rt_send(pids[1], MSG_BLOCK, NULL, 0);
    char payload[LEN] = {0};
    for (int i = 0; i < QUEUED; i++)
        rt_send(pids[1], MSG_WORK, payload, sizeof(payload));
    CHECK(wait_at_least(&worked, 1));
    rt_mem_stats(&m1);
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(pids[2], &info), 0);
    CHECK(m1.slab_in_use >= m0.slab_in_use + N * info.state_bytes);
    /* Every struct in use was written, so its pages are in memory. */
    CHECK(m1.slab_resident >= m1.slab_in_use && m1.slab_resident <= m1.slab_mapped);
    CHECK(m1.tables_resident > m0.tables_resident);
    CHECK(m1.chunks_resident > 0 && m1.chunks_resident <= m1.chunks_mapped);
    /* The blocked actor's mailbox holds QUEUED envelopes of LEN bytes each. */
    CHECK(m1.envelopes_in_use >= QUEUED * (sizeof(rt_msg_t) + LEN));
    atomic_store(&unblocked, 1);
    CHECK(wait_at_least(&worked, 2 + QUEUED));
    for (long i = 0; i < N; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    free(pids);
}

int main(void)
{
    test_start(2);
    RUN(test_mem_stats); /* first: no exited actor waits for reclamation, no pid slot is used */
    RUN(test_actor_fields);
    RUN(test_many_actors);
    rt_shutdown();
    return CHECK_SUMMARY();
}

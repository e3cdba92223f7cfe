/*
** A connection's heap under the shapes rtd gives it (actors/conn, session.h): how long its
** collections pause with a queue of 10,000 messages of 1 KB, and how often it collects
** while busy. One actor plays the connection, one message per handler call as the runtime
** delivers them, so every collection is one the runtime chose (or rt_gc, timed):
**
**   fill    QUEUED messages join the session's queue, one per message (a record and a
**           binary handle each, on the heap; the binary is the message's): the collections
**           the runtime runs meanwhile, their pauses as the heap records them (us).
**   full    rt_gc with the whole queue live, one per message, timed around the call (ns):
**           wall clock, and the thread's CPU time, which preemption on a busy machine does
**           not inflate.
**   churn   an acknowledged message leaves (freed at once) and a new one joins, per
**           message: the collections that causes (the mechanism says none: nothing grows).
**   partial with the queue gone, a publisher's partial-packet buffer grows to 32 KiB and
**           stays between two messages, then to 64 KiB and is freed (min_heap 16 KiB): the
**           collections per pair.
**
**   bench_conn_heap [--quick] [--json]
*/
#include <semaphore.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

#define QUEUED 10000
#define PAYLOAD 1024
#define FULL_GCS 400
#define CHURN 100000
#define PAIRS 2000
#define PARTIAL_SMALL (32 * 1024)
#define PARTIAL_BIG (64 * 1024)

enum { TAG_STEP = RT_MSG_USER };
enum { FILL, FULL, CHURN_PHASE, DRAIN, PARTIAL, DONE };

typedef struct {
    rt_session_t *sess;
    uint8_t *partial;
    size_t partial_cap;
    int phase;
    long step;
    uint32_t seen_gc;
} conn_state_t;

static struct {
    bool quick;
    long full_gcs, churn, pairs;
    uint32_t *fill_pauses; /* us, as the heap recorded them */
    long nfill;
    uint64_t *full_ns, *full_cpu_ns;
    long nfull;
    long churn_gcs, partial_gcs;
    size_t heap_bytes, bin_bytes;
    int rc;
    sem_t done;
} b;

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void conn_trace(void *state, rt_gc_t *gc)
{
    const conn_state_t *st = state;
    rt_gc_mark(gc, st->sess);
    rt_gc_mark(gc, st->partial);
}

/* A message as routing hands it over: its own binary, about the size of a 1 KB PUBLISH. */
static int deliver(rt_actor_t *self, conn_state_t *st)
{
    rt_bin_t *bin = rt_bin_alloc(PAYLOAD + 32);
    if (!bin)
        return RT_ENOMEM;
    memset(rt_bin_data(bin), 'x', rt_bin_len(bin));
    rt_qmsg_t *m = rt_qmsg_new(self, bin, 1, 0, 0, 0, (uint32_t[1]){1}, 1);
    rt_bin_release(bin);
    if (!m)
        return RT_ENOMEM;
    rt_qlist_push(&st->sess->queued, m);
    return 0;
}

/* Collections the runtime ran since the last look: at most one between two messages. */
static uint32_t new_gcs(rt_actor_t *self, conn_state_t *st, uint32_t *pause_us)
{
    rt_actor_info_t info;
    if (rt_actor_info(rt_self(self), &info) != 0)
        return 0;
    uint32_t n = info.gc_count - st->seen_gc;
    st->seen_gc = info.gc_count;
    *pause_us = info.gc_last_pause_us;
    b.heap_bytes = info.heap_bytes;
    b.bin_bytes = info.bin_bytes > b.bin_bytes ? info.bin_bytes : b.bin_bytes;
    return n;
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    (void)arg;
    conn_state_t *st = state;
    st->sess = rt_alloc(self, sizeof(*st->sess), RT_OBJ_SCAN);
    return st->sess ? 0 : RT_ENOMEM;
}

static int step(rt_actor_t *self, conn_state_t *st)
{
    uint32_t pause;
    uint32_t gcs = new_gcs(self, st, &pause);
    switch (st->phase) {
    case FILL:
        if (gcs)
            b.fill_pauses[b.nfill++] = pause;
        if (st->step == QUEUED)
            break;
        return deliver(self, st);
    case FULL: {
        if (st->step == b.full_gcs)
            break;
        uint64_t t0 = rt_mono_ns(), c0 = thread_cpu_ns();
        rt_gc(self);
        b.full_cpu_ns[b.nfull] = thread_cpu_ns() - c0;
        b.full_ns[b.nfull++] = rt_mono_ns() - t0;
        return 0;
    }
    case CHURN_PHASE:
        if (st->step)
            b.churn_gcs += gcs;
        if (st->step == b.churn)
            break;
        rt_qmsg_free(self, rt_qlist_pop(&st->sess->queued));
        return deliver(self, st);
    case DRAIN:
        while (st->sess->queued.head)
            rt_qmsg_free(self, rt_qlist_pop(&st->sess->queued));
        rt_gc(self); /* what is left is a connection with nothing queued */
        new_gcs(self, st, &pause);
        break;
    case PARTIAL:
        if (st->step)
            b.partial_gcs += gcs;
        if (st->step == 2 * b.pairs)
            break;
        if (st->step % 2 == 0)
            return rt_grow_on(self, &st->partial, &st->partial_cap, PARTIAL_SMALL, 1, 256,
                              RT_OBJ_LEAF);
        if (rt_grow_on(self, &st->partial, &st->partial_cap, PARTIAL_BIG, 1, 256, RT_OBJ_LEAF))
            return RT_ENOMEM;
        rt_free(self, st->partial);
        st->partial = NULL;
        st->partial_cap = 0;
        return 0;
    }
    st->phase++;
    st->step = -1;
    return 0;
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_state_t *st = state;
    if (m->tag != TAG_STEP)
        return;
    int rc = step(self, st);
    st->step++;
    if (rc || st->phase == DONE) {
        b.rc = rc;
        sem_post(&b.done);
        rt_exit(self, rc ? RT_REASON_ERROR : RT_REASON_NORMAL);
        return;
    }
    rt_send(rt_self(self), TAG_STEP, NULL, 0);
}

static const rt_actor_type_t conn_type = {
    .name = "bench_conn",
    .state_size = sizeof(conn_state_t),
    .init = conn_init,
    .handle = conn_handle,
    .trace = conn_trace,
};

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, c = *(const uint64_t *)y;
    return (a > c) - (a < c);
}

/* Nearest-rank percentile of a sorted array. */
static uint64_t pct(const uint64_t *v, long n, double p)
{
    long k = (long)(p / 100 * (double)n + 0.999999);
    return v[k < 1 ? 0 : k > n ? n - 1 : k - 1];
}

int main(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            b.quick = true;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else {
            fprintf(stderr, "usage: bench_conn_heap [--quick] [--json]\n");
            return 2;
        }
    }
    b.full_gcs = b.quick ? FULL_GCS / 10 : FULL_GCS;
    b.churn = b.quick ? CHURN / 10 : CHURN;
    b.pairs = b.quick ? PAIRS / 10 : PAIRS;
    b.fill_pauses = calloc(QUEUED, sizeof(uint32_t));
    b.full_ns = calloc((size_t)b.full_gcs, sizeof(uint64_t));
    b.full_cpu_ns = calloc((size_t)b.full_gcs, sizeof(uint64_t));
    sem_init(&b.done, 0, 0);
    rt_config_t cfg;
    rt_config_defaults(&cfg);
    cfg.schedulers = 1;
    int rc = rt_init(&cfg);
    rt_pid_t pid;
    if (rc == 0)
        rc = rt_spawn(&conn_type, NULL, &pid);
    if (rc) {
        fprintf(stderr, "bench_conn_heap: %s\n", rt_strerror(rc));
        return 1;
    }
    rt_send(pid, TAG_STEP, NULL, 0);
    sem_wait(&b.done);
    rt_wait_idle(10000);
    rt_shutdown();
    if (b.rc || !b.nfull) {
        fprintf(stderr, "bench_conn_heap: %s\n", b.rc ? rt_strerror(b.rc) : "no collection");
        return 1;
    }
    uint64_t fill[QUEUED];
    for (long i = 0; i < b.nfill; i++)
        fill[i] = b.fill_pauses[i];
    qsort(fill, (size_t)b.nfill, sizeof(uint64_t), cmp_u64);
    qsort(b.full_ns, (size_t)b.nfull, sizeof(uint64_t), cmp_u64);
    qsort(b.full_cpu_ns, (size_t)b.nfull, sizeof(uint64_t), cmp_u64);
    double wall[3] = {pct(b.full_ns, b.nfull, 50) / 1e3, pct(b.full_ns, b.nfull, 99) / 1e3,
                      b.full_ns[b.nfull - 1] / 1e3};
    double cpu[3] = {pct(b.full_cpu_ns, b.nfull, 50) / 1e3, pct(b.full_cpu_ns, b.nfull, 99) / 1e3,
                     b.full_cpu_ns[b.nfull - 1] / 1e3};
    uint64_t fill_max = b.nfill ? fill[b.nfill - 1] : 0;
    if (json) {
        printf(
            "{\"queued\": %d, \"bin_bytes\": %zu, \"fill_gcs\": %ld, \"fill_pause_max_us\": %llu, "
            "\"full_gcs\": %ld, \"full_pause_p50_us\": %.1f, \"full_pause_p99_us\": %.1f, "
            "\"full_pause_max_us\": %.1f, \"full_cpu_p50_us\": %.1f, \"full_cpu_p99_us\": %.1f, "
            "\"full_cpu_max_us\": %.1f, \"churn_msgs\": %ld, \"churn_gcs\": %ld, "
            "\"partial_pairs\": %ld, \"partial_gcs\": %ld}\n",
            QUEUED, b.bin_bytes, b.nfill, (unsigned long long)fill_max, b.nfull, wall[0], wall[1],
            wall[2], cpu[0], cpu[1], cpu[2], b.churn, b.churn_gcs, b.pairs, b.partial_gcs);
        return 0;
    }
    printf("a connection's heap with %d queued messages of %d bytes (%zu bytes of binaries)\n",
           QUEUED, PAYLOAD, b.bin_bytes);
    printf("  fill:    %ld collections, pauses (us)", b.nfill);
    for (long i = 0; i < b.nfill; i++)
        printf(" %llu", (unsigned long long)b.fill_pauses[i]);
    printf("\n  full:    %ld collections, pause p50 %.1f us, p99 %.1f us, max %.1f us "
           "(CPU: %.1f, %.1f, %.1f)\n",
           b.nfull, wall[0], wall[1], wall[2], cpu[0], cpu[1], cpu[2]);
    printf("  churn:   %ld collections in %ld messages (one acknowledged, one queued each)\n",
           b.churn_gcs, b.churn);
    printf("  partial: %ld collections in %ld pairs (%d KiB kept between messages, then %d KiB)\n",
           b.partial_gcs, b.pairs, PARTIAL_SMALL / 1024, PARTIAL_BIG / 1024);
    return 0;
}

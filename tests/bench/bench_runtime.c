/*
** bench_runtime: the runtime's headline numbers, defined to match
** bench_runtime.erl so the two can be compared side by side.
**
**   spawn_per_s               N idle actors spawned one after another from inside one
**                             actor (BEAM's figure is spawns from one process), timed
**                             in that actor around the spawn loop.
**   bytes_per_idle_actor      RSS (/proc/self/statm) after those N spawns minus RSS before,
**                             divided by N. The pid array the spawner fills is allocated
**                             and touched before the first reading, so it is not counted.
**                             Afterwards every actor is stopped and rt_wait_idle must see
**                             none alive, or the run fails.
**   ring_hops_per_s           1,000 actors, each knowing the next pid; one token message
**                             carrying a hop counter goes round until the counter runs out.
**   ring_parallel_msgs_per_s  the same ring with 1,000 tokens in flight at once (one
**                             injected at every actor), hops shared between them.
**   gc_pause_*_us             one actor keeps ~1 MB live (a ring buffer of pointers to
**                             64-128 B RT_OBJ_SCAN nodes, each pointing to a 64-256 B
**                             RT_OBJ_LEAF payload) and replaces entries continuously, one
**                             self-sent message per batch; every collection's pause is
**                             recorded.
**
** Ring figures are the median of RING_REPEATS runs. Spawn and memory come from the first
** spawn round only, because a second round may reuse pages the first one faulted in (its
** rate is printed as a diagnostic). Everything printed is measured in this run; nothing is
** a constant. Keys other than the seven above are diagnostics.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"

#define RING_SIZE 1000           /* actors in the ring, as in the issue */
#define RING_TOKENS 1000         /* tokens in flight for the parallel figure */
#define RING_REPEATS 3           /* ring runs per figure; the median is reported */
#define GC_LIVE_BYTES (1u << 20) /* live data the GC actor keeps reachable */
#define GC_ENTRY_BYTES 256       /* mean node (96 B) + payload (160 B) requested */
#define GC_BATCH 256             /* entries replaced per message (~64 KB allocated) */
#define GC_WARMUP 3              /* collections ignored after the live set is built */
#define WAIT_MS 300000           /* ms to give up on a phase after; RT_BENCH_WAIT_MS overrides */

#define FULL_ACTORS 1000000L
#define FULL_HOPS 10000000L
#define FULL_GC_PAUSES 1000L
#define QUICK_ACTORS 20000L
#define QUICK_HOPS 200000L
#define QUICK_GC_PAUSES 30L

enum {
    TAG_STOP = RT_MSG_USER, /* idle and ring actors: exit normally */
    TAG_SPAWN,              /* spawner: spawn opts.actors idle actors */
    TAG_STOP_ALL,           /* spawner: stop every actor spawned, then itself */
    TAG_NEXT,               /* ring: data is the next pid */
    TAG_TOKEN,              /* ring: data is the hops still to go */
    TAG_WORK,               /* gc: replace one batch of entries */
};

typedef struct bench_opts_s {
    bool quick;
    bool json;
    long actors;
    long hops;
    long gc_pauses;
    unsigned schedulers;
} bench_opts_t;

/*
** What actors report to main. An actor writes its fields, then posts done; main
** reads them only after sem_wait returns, which orders the accesses.
*/
typedef struct bench_ctx_s {
    sem_t done;
    rt_pid_t *pids; /* spawner's idle actors, allocated by main */
    long nspawned;
    int spawn_rc;
    uint64_t spawn_ns;
    atomic_long tokens_left; /* ring: tokens that have not finished yet */
    uint64_t ring_end_ns;
    uint32_t *pauses; /* gc: one entry per collection, microseconds */
    long npauses;
    uint32_t *cpu_pauses; /* gc: thread CPU time around a collection, nanoseconds */
    long ncpu_pauses;
    size_t gc_heap_bytes; /* gc: heap footprint at the end */
    size_t gc_live_bytes; /* gc: bytes the ring buffer keeps reachable at the end */
    int gc_rc;
} bench_ctx_t;

static bench_ctx_t ctx;
static bench_opts_t opts;
static long wait_ms = WAIT_MS;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * sysconf(_SC_PAGESIZE);
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_runtime: %s: %s\n", what, rc ? rt_strerror(rc) : "failed");
    exit(1);
}

static void count_status(const rt_actor_info_t *info, void *ud)
{
    long *counts = ud;
    counts[info->status]++;
    if (info->mailbox_len)
        counts[RT_STATUS_EXITING + 1]++;
}

/* Says where a hung phase is stuck, so the report is useful to whoever fixes it. */
static void dump_stuck(void)
{
    long counts[RT_STATUS_EXITING + 2] = {0};
    rt_stats_t st;
    rt_stats(&st);
    rt_snapshot_actors(count_status, counts);
    fprintf(stderr,
            "  alive %" PRIu64 ", turns %" PRIu64 ", dead letters %" PRIu64
            ", tokens left %ld\n  actors waiting %ld, runnable %ld, running %ld, muted %ld, "
            "exiting %ld; with mail %ld\n",
            st.alive, st.turns, st.dead_letters, atomic_load(&ctx.tokens_left), counts[0],
            counts[1], counts[2], counts[3], counts[4], counts[5]);
    rt_sched_info_t si[16];
    size_t n = rt_snapshot_schedulers(si, 16);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  scheduler %u%s: run queue %" PRIu64 ", turns %" PRIu64 "\n", si[i].index,
                si[i].blocking_pool ? " (blocking)" : "", si[i].run_queue, si[i].turns);
}

/* Waits for an actor to post ctx.done; a benchmark that hangs is a failure, not a number. */
static void wait_done(const char *phase)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += wait_ms / 1000;
    dl.tv_nsec += (wait_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    while (sem_timedwait(&ctx.done, &dl) != 0) {
        if (errno == EINTR)
            continue;
        fprintf(stderr, "bench_runtime: %s did not finish within %ld ms\n", phase, wait_ms);
        dump_stuck();
        exit(1);
    }
}

/* Every phase must leave no actor behind; the spawn phase's check is part of the issue. */
static void wait_all_gone(const char *phase)
{
    int rc = rt_wait_idle((uint64_t)wait_ms);
    rt_stats_t st;
    rt_stats(&st);
    if (rc || st.alive != 0 || st.exited != st.spawned) {
        fprintf(stderr,
                "bench_runtime: %s: actors left behind (alive %" PRIu64 ", spawned %" PRIu64
                ", exited %" PRIu64 ")\n",
                phase, st.alive, st.spawned, st.exited);
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static uint32_t percentile(const uint32_t *v, long n, double p)
{
    long rank = (long)ceil(p / 100.0 * (double)n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

/* ---- Spawn and idle memory ---- */

static void idle_handle(rt_actor_t *self, void *state, rt_msg_t *msg)
{
    if (msg->tag == TAG_STOP)
        rt_exit(self, RT_REASON_NORMAL);
}

/* The smallest actor a program can have: no state, nothing allocated, waiting for a message. */
static const rt_actor_type_t idle_type = {
    .name = "idle",
    .state_size = 0,
    .handle = idle_handle,
};

static void spawner_handle(rt_actor_t *self, void *state, rt_msg_t *msg)
{
    if (msg->tag == TAG_SPAWN) {
        long n = opts.actors, i;
        int rc = 0;
        uint64_t t0 = now_ns();
        for (i = 0; i < n; i++) {
            if ((rc = rt_spawn(&idle_type, NULL, &ctx.pids[i])) != 0)
                break;
        }
        ctx.spawn_ns = now_ns() - t0;
        ctx.nspawned = i;
        ctx.spawn_rc = rc;
        sem_post(&ctx.done);
    } else if (msg->tag == TAG_STOP_ALL) {
        for (long i = 0; i < ctx.nspawned; i++)
            rt_send(ctx.pids[i], TAG_STOP, NULL, 0);
        rt_exit(self, RT_REASON_NORMAL);
    }
}

static const rt_actor_type_t spawner_type = {
    .name = "spawner",
    .state_size = 0,
    .handle = spawner_handle,
};

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* One round: spawn opts.actors idle actors from a fresh spawner, then stop them all. */
static double spawn_round(long *rss_delta, double *faults_per_spawn)
{
    /* RSS is read before the spawner exists: the runtime may carve actors from pages
       (2 MiB ones, with transparent huge pages) that the spawner's own struct faults in,
       and those pages belong to the idle actors' cost. The spawner adds ~1/N of an actor. */
    long before = rss_bytes();
    rt_pid_t spawner;
    int rc = rt_spawn(&spawner_type, NULL, &spawner);
    if (rc)
        die("spawn spawner", rc);
    long flt = minor_faults();
    rt_send(spawner, TAG_SPAWN, NULL, 0);
    wait_done("spawn");
    *faults_per_spawn = (double)(minor_faults() - flt) / (double)opts.actors;
    long after = rss_bytes();
    if (ctx.spawn_rc || ctx.nspawned != opts.actors)
        die("spawning idle actors", ctx.spawn_rc);
    *rss_delta = after - before;
    rt_send(spawner, TAG_STOP_ALL, NULL, 0);
    wait_all_gone("spawn");
    return (double)opts.actors / ((double)ctx.spawn_ns / 1e9);
}

/*
** The headline figures come from the first round, on memory the process has never
** touched, as a server sees its first million connections. A second round reuses the
** memory the first one freed; its rate (spawn_warm_per_s, a diagnostic) separates the
** runtime's own cost from page faults, which are expensive on virtual machines.
*/
static double spawn_faults[2]; /* page faults per spawn in each round, for the text output */

static void bench_spawn(double *spawn_per_s, double *warm_per_s, double *bytes_per_actor)
{
    long n = opts.actors, delta;
    ctx.pids = malloc((size_t)n * sizeof(rt_pid_t));
    if (!ctx.pids)
        die("pid array", RT_ENOMEM);
    memset(ctx.pids, 0, (size_t)n * sizeof(rt_pid_t));

    *spawn_per_s = spawn_round(&delta, &spawn_faults[0]);
    *bytes_per_actor = (double)delta / (double)n;
    *warm_per_s = spawn_round(&delta, &spawn_faults[1]);
    free(ctx.pids);
    ctx.pids = NULL;
}

/* ---- Ring ---- */

typedef struct ring_state_s {
    rt_pid_t next;
} ring_state_t;

static int ring_init(rt_actor_t *self, void *state, void *arg)
{
    ((ring_state_t *)state)->next = (rt_pid_t)(uintptr_t)arg;
    return 0;
}

static void ring_handle(rt_actor_t *self, void *state, rt_msg_t *msg)
{
    ring_state_t *st = state;
    uint64_t left;
    switch (msg->tag) {
    case TAG_TOKEN:
        memcpy(&left, msg->data, sizeof(left));
        if (left > 0) {
            left--;
            rt_send(st->next, TAG_TOKEN, &left, sizeof(left));
        } else if (atomic_fetch_sub_explicit(&ctx.tokens_left, 1, memory_order_acq_rel) == 1) {
            ctx.ring_end_ns = now_ns();
            sem_post(&ctx.done);
        }
        break;
    case TAG_NEXT:
        memcpy(&st->next, msg->data, sizeof(st->next));
        break;
    case TAG_STOP:
        rt_exit(self, RT_REASON_NORMAL);
        break;
    }
}

static const rt_actor_type_t ring_type = {
    .name = "ring",
    .state_size = sizeof(ring_state_t),
    .init = ring_init,
    .handle = ring_handle,
};

/* Hops per second for one run: tokens injected at evenly spaced actors, hops split evenly. */
static double ring_run(const rt_pid_t *ring, long tokens, long hops)
{
    uint64_t per = (uint64_t)(hops / tokens);
    atomic_store(&ctx.tokens_left, tokens);
    uint64_t t0 = now_ns();
    for (long i = 0; i < tokens; i++)
        rt_send(ring[(i * RING_SIZE) / tokens], TAG_TOKEN, &per, sizeof(per));
    wait_done("ring");
    return (double)(per * (uint64_t)tokens) / ((double)(ctx.ring_end_ns - t0) / 1e9);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void bench_ring(double *hops_per_s, double *parallel_per_s)
{
    rt_pid_t ring[RING_SIZE];
    /* Built back to front so each actor gets its successor at spawn; the last one learns
       the first by message. */
    rt_pid_t next = 0;
    for (int i = RING_SIZE - 1; i >= 0; i--) {
        int rc = rt_spawn(&ring_type, (void *)(uintptr_t)next, &ring[i]);
        if (rc)
            die("spawn ring", rc);
        next = ring[i];
    }
    rt_send(ring[RING_SIZE - 1], TAG_NEXT, &ring[0], sizeof(ring[0]));

    double one[RING_REPEATS], par[RING_REPEATS];
    for (int r = 0; r < RING_REPEATS; r++) {
        one[r] = ring_run(ring, 1, opts.hops);
        par[r] = ring_run(ring, RING_TOKENS, opts.hops);
    }
    *hops_per_s = median(one, RING_REPEATS);
    *parallel_per_s = median(par, RING_REPEATS);

    for (int i = 0; i < RING_SIZE; i++)
        rt_send(ring[i], TAG_STOP, NULL, 0);
    wait_all_gone("ring");
}

/* ---- GC pauses ----
** Pauses come from the heap's own accounting (rt_actor_info's gc_count and
** gc_last_pause_us, timed by rt_heap_collect around mark and sweep), read by the actor
** at the start of each message: collections run between messages, when the runtime
** decides they are due, and that is the pause an actor really sees. Timing rt_gc()
** ourselves would measure forced collections at moments of our choosing instead. The
** cost is microsecond resolution, which is fine against a 1 ms target.
**
** That pause is wall-clock time, so on a loaded machine it includes time the thread
** spent preempted. As a diagnostic (extra keys gc_cpu_*_us, not a target) the actor also
** measures the thread CPU time between the end of one handler and the start of the
** next when a collection ran in between: the collection plus one mailbox pop. Samples
** where the actor changed threads in between are dropped.
*/

typedef struct gc_state_s {
    void **ring; /* RT_OBJ_SCAN array of node pointers: the only root */
    uint32_t nslots;
    uint32_t pos; /* next slot to replace */
    uint64_t rng;
    size_t live;      /* bytes requested for the entries the ring holds now */
    uint32_t seen_gc; /* gc_count at the previous message */
    uint32_t warmup;  /* collections still to ignore */
    uint64_t end_cpu; /* thread CPU time when the previous handler ended, or 0 */
    pthread_t end_thread;
    rt_pid_t self;
} gc_state_t;

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* One ring entry: a scanned node pointing to a leaf payload, with data in both. */
static size_t entry_new(rt_actor_t *self, gc_state_t *st, void **out)
{
    uint64_t r = xorshift(&st->rng);
    size_t node_size = 64 + (size_t)(r % 65);         /* 64..128 B */
    size_t leaf_size = 64 + (size_t)((r >> 8) % 193); /* 64..256 B */
    uint64_t *node = rt_alloc(self, node_size, RT_OBJ_SCAN);
    unsigned char *leaf = rt_alloc(self, leaf_size, RT_OBJ_LEAF);
    if (!node || !leaf)
        return 0;
    node[0] = (uint64_t)(uintptr_t)leaf;
    node[1] = node_size + leaf_size;
    /* Odd words never look like 16-byte-aligned heap pointers, but are still scanned. */
    for (size_t i = 2; i < node_size / sizeof(uint64_t); i++)
        node[i] = (r + i) | 1;
    memset(leaf, (int)(r & 0xff), leaf_size);
    *out = node;
    return node_size + leaf_size;
}

/* Bytes requested for an entry, kept in the node's second word (a small integer, so the
   conservative scan never takes it for a pointer). */
static size_t entry_size(const void *node)
{
    return (size_t)((const uint64_t *)node)[1];
}

static int gc_init(rt_actor_t *self, void *state, void *arg)
{
    gc_state_t *st = state;
    st->self = rt_self(self);
    st->rng = 0x9e3779b97f4a7c15ull;
    st->nslots = GC_LIVE_BYTES / GC_ENTRY_BYTES;
    st->ring = rt_alloc(self, st->nslots * sizeof(void *), RT_OBJ_SCAN);
    if (!st->ring)
        return RT_ENOMEM;
    for (uint32_t i = 0; i < st->nslots; i++) {
        size_t n = entry_new(self, st, &st->ring[i]);
        if (!n)
            return RT_ENOMEM;
        st->live += n;
    }
    st->warmup = GC_WARMUP;
    return 0;
}

static void gc_trace(void *state, rt_gc_t *gc)
{
    rt_gc_mark(gc, ((gc_state_t *)state)->ring);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void gc_handle(rt_actor_t *self, void *state, rt_msg_t *msg)
{
    gc_state_t *st = state;
    if (msg->tag != TAG_WORK)
        return;
    uint64_t start_cpu = thread_cpu_ns();
    bool same_thread = st->end_cpu && pthread_equal(st->end_thread, pthread_self());

    rt_actor_info_t info;
    memset(&info, 0, sizeof(info));
    if (rt_actor_info(st->self, &info) == 0 && info.gc_count != st->seen_gc) {
        /* At most one collection runs between two messages, so last_pause is its pause. */
        if (st->warmup) {
            st->warmup--;
        } else {
            ctx.pauses[ctx.npauses++] = info.gc_last_pause_us;
            if (same_thread) {
                uint64_t d = start_cpu - st->end_cpu;
                ctx.cpu_pauses[ctx.ncpu_pauses++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
            }
        }
        st->seen_gc = info.gc_count;
    }
    if (ctx.npauses >= opts.gc_pauses) {
        ctx.gc_heap_bytes = info.heap_bytes;
        ctx.gc_live_bytes = st->live;
        sem_post(&ctx.done);
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }

    for (int i = 0; i < GC_BATCH; i++) {
        void *node;
        size_t n = entry_new(self, st, &node);
        if (!n) {
            ctx.gc_rc = RT_ENOMEM;
            sem_post(&ctx.done);
            rt_exit(self, RT_REASON_ERROR);
            return;
        }
        st->live += n;
        st->live -= entry_size(st->ring[st->pos]);
        st->ring[st->pos] = node;
        st->pos = (st->pos + 1) % st->nslots;
    }
    rt_send(st->self, TAG_WORK, NULL, 0);
    st->end_thread = pthread_self();
    st->end_cpu = thread_cpu_ns();
}

static const rt_actor_type_t gc_type = {
    .name = "gc",
    .state_size = sizeof(gc_state_t),
    .init = gc_init,
    .handle = gc_handle,
    .trace = gc_trace,
};

static void bench_gc(double *p50, double *p99, double *max, double cpu[3])
{
    ctx.pauses = calloc((size_t)opts.gc_pauses, sizeof(uint32_t));
    ctx.cpu_pauses = calloc((size_t)opts.gc_pauses, sizeof(uint32_t));
    if (!ctx.pauses || !ctx.cpu_pauses)
        die("pause array", RT_ENOMEM);
    rt_pid_t pid;
    int rc = rt_spawn(&gc_type, NULL, &pid);
    if (rc)
        die("spawn gc actor", rc);
    rt_send(pid, TAG_WORK, NULL, 0);
    wait_done("gc");
    if (ctx.gc_rc)
        die("gc actor", ctx.gc_rc);
    qsort(ctx.pauses, (size_t)ctx.npauses, sizeof(uint32_t), cmp_u32);
    *p50 = percentile(ctx.pauses, ctx.npauses, 50);
    *p99 = percentile(ctx.pauses, ctx.npauses, 99);
    *max = ctx.pauses[ctx.npauses - 1];
    cpu[0] = cpu[1] = cpu[2] = 0;
    if (ctx.ncpu_pauses) {
        qsort(ctx.cpu_pauses, (size_t)ctx.ncpu_pauses, sizeof(uint32_t), cmp_u32);
        cpu[0] = percentile(ctx.cpu_pauses, ctx.ncpu_pauses, 50) / 1e3;
        cpu[1] = percentile(ctx.cpu_pauses, ctx.ncpu_pauses, 99) / 1e3;
        cpu[2] = ctx.cpu_pauses[ctx.ncpu_pauses - 1] / 1e3;
    }
    wait_all_gone("gc");
    free(ctx.pauses);
    free(ctx.cpu_pauses);
    ctx.pauses = ctx.cpu_pauses = NULL;
}

/* ---- Main ---- */

static void usage(void)
{
    fprintf(stderr, "usage: bench_runtime [--quick] [--json] [--actors N] [--hops N] "
                    "[--gc-pauses N] [--schedulers N]\n");
    exit(2);
}

static long arg_long(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        usage();
    char *end;
    long v = strtol(argv[++*i], &end, 10);
    if (*end || v <= 0)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    long actors = 0, hops = 0, gc_pauses = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            opts.quick = true;
        else if (!strcmp(argv[i], "--json"))
            opts.json = true;
        else if (!strcmp(argv[i], "--actors"))
            actors = arg_long(argc, argv, &i);
        else if (!strcmp(argv[i], "--hops"))
            hops = arg_long(argc, argv, &i);
        else if (!strcmp(argv[i], "--gc-pauses"))
            gc_pauses = arg_long(argc, argv, &i);
        else if (!strcmp(argv[i], "--schedulers"))
            opts.schedulers = (unsigned)arg_long(argc, argv, &i);
        else
            usage();
    }
    opts.actors = actors ? actors : opts.quick ? QUICK_ACTORS : FULL_ACTORS;
    opts.hops = hops ? hops : opts.quick ? QUICK_HOPS : FULL_HOPS;
    opts.gc_pauses = gc_pauses ? gc_pauses : opts.quick ? QUICK_GC_PAUSES : FULL_GC_PAUSES;
    if (opts.hops < RING_TOKENS)
        opts.hops = RING_TOKENS;

    const char *w = getenv("RT_BENCH_WAIT_MS");
    if (w && atol(w) > 0)
        wait_ms = atol(w);
    sem_init(&ctx.done, 0, 0);
    rt_config_t cfg;
    rt_config_defaults(&cfg);
    cfg.schedulers = opts.schedulers;
    if ((unsigned long)opts.actors + RING_SIZE + 16 > cfg.max_actors)
        cfg.max_actors = (uint32_t)(opts.actors + RING_SIZE + 16);
    int rc = rt_init(&cfg);
    if (rc)
        die("rt_init", rc);
    rt_stats_t st;
    rt_stats(&st);

    double spawn_per_s, warm_per_s, bytes_per_actor, hops_per_s, parallel_per_s, p50, p99, pmax;
    double cpu[3];
    bench_spawn(&spawn_per_s, &warm_per_s, &bytes_per_actor);
    bench_ring(&hops_per_s, &parallel_per_s);
    bench_gc(&p50, &p99, &pmax, cpu);
    rt_shutdown();
    sem_destroy(&ctx.done);

    if (opts.json) {
        printf("{\"spawn_per_s\": %.0f, \"bytes_per_idle_actor\": %.1f, "
               "\"ring_hops_per_s\": %.0f, \"ring_parallel_msgs_per_s\": %.0f, "
               "\"gc_pause_p50_us\": %.0f, \"gc_pause_p99_us\": %.0f, "
               "\"gc_pause_max_us\": %.0f, \"gc_cpu_p50_us\": %.1f, \"gc_cpu_p99_us\": %.1f, "
               "\"gc_cpu_max_us\": %.1f, \"gc_cpu_samples\": %ld, \"spawn_warm_per_s\": %.0f, "
               "\"actors\": %ld, "
               "\"hops\": %ld, \"gc_pauses\": %ld, \"schedulers\": %u}\n",
               spawn_per_s, bytes_per_actor, hops_per_s, parallel_per_s, p50, p99, pmax, cpu[0],
               cpu[1], cpu[2], ctx.ncpu_pauses, warm_per_s, opts.actors, opts.hops, ctx.npauses,
               st.schedulers);
        return 0;
    }
    printf("rt runtime benchmark (%u schedulers%s)\n", st.schedulers, opts.quick ? ", quick" : "");
    printf("  spawn_per_s               %12.0f  (%ld idle actors spawned from one actor)\n",
           spawn_per_s, opts.actors);
    printf("  (page faults per spawn %.3f; second round, on memory the first one freed: "
           "%.0f spawns/s, %.3f faults per spawn)\n",
           spawn_faults[0], warm_per_s, spawn_faults[1]);
    printf("  bytes_per_idle_actor      %12.1f  (RSS delta / %ld)\n", bytes_per_actor, opts.actors);
    printf("  ring_hops_per_s           %12.0f  (%d actors, 1 token, %ld hops, median of %d)\n",
           hops_per_s, RING_SIZE, opts.hops, RING_REPEATS);
    printf("  ring_parallel_msgs_per_s  %12.0f  (%d tokens, %ld hops in all, median of %d)\n",
           parallel_per_s, RING_TOKENS, opts.hops, RING_REPEATS);
    printf("  gc_pause_p50_us           %12.0f  (%ld collections at ~%zu KB live,\n", p50,
           ctx.npauses, ctx.gc_live_bytes / 1024);
    printf("  gc_pause_p99_us           %12.0f   heap footprint %zu KB at the end)\n", p99,
           ctx.gc_heap_bytes / 1024);
    printf("  gc_pause_max_us           %12.0f\n", pmax);
    printf("  (thread CPU time per collection: p50 %.1f us, p99 %.1f us, max %.1f us, "
           "%ld samples)\n",
           cpu[0], cpu[1], cpu[2], ctx.ncpu_pauses);
    return 0;
}

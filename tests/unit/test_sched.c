/* Schedulers: rings, migration under concurrent senders, backpressure, blocking pool, idling,
   rt_yield, priorities. */
#include <limits.h>
#include <pthread.h>
#include <sys/resource.h>

#include "heap.h"
#include "rt_test.h"

enum { MSG_TOKEN = RT_MSG_USER, MSG_SEQ, MSG_SPIN, MSG_WORK, MSG_GO, MSG_SLEEP };

/* ---- Ring ---- */
typedef struct {
    rt_pid_t next;
} ring_state_t;

static atomic_long ring_done;
static atomic_long ring_hops;

static void ring_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    ring_state_t *st = state;
    if (m->tag == MSG_GO) {
        st->next = *(rt_pid_t *)(void *)m->data;
        return;
    }
    long left = *(long *)(void *)m->data;
    atomic_fetch_add_explicit(&ring_hops, 1, memory_order_relaxed);
    if (left == 0) {
        atomic_fetch_add(&ring_done, 1);
        return;
    }
    left--;
    rt_send(st->next, MSG_TOKEN, &left, sizeof(left));
}

static const rt_actor_type_t ring_type = {
    .name = "ring", .state_size = sizeof(ring_state_t), .handle = ring_handle};

static int ring_low_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state, (void)arg;
    rt_set_priority(self, RT_PRIORITY_LOW);
    return 0;
}

static const rt_actor_type_t ring_low_type = {.name = "ring_low",
                                              .state_size = sizeof(ring_state_t),
                                              .init = ring_low_init,
                                              .handle = ring_handle};

/* mixed: every other actor is low, so both lanes fill, are stolen from and drain. */
static void run_ring(int n, int tokens, long hops_each, bool mixed)
{
    rt_pid_t *pids = calloc((size_t)n, sizeof(rt_pid_t));
    for (int i = 0; i < n; i++)
        CHECK_EQ(rt_spawn(mixed && i % 2 ? &ring_low_type : &ring_type, NULL, &pids[i]), 0);
    for (int i = 0; i < n; i++)
        rt_send(pids[i], MSG_GO, &pids[(i + 1) % n], sizeof(rt_pid_t));
    atomic_store(&ring_done, 0);
    atomic_store(&ring_hops, 0);
    for (int t = 0; t < tokens; t++)
        rt_send(pids[(t * (n / tokens)) % n], MSG_TOKEN, &hops_each, sizeof(hops_each));
    CHECK(wait_at_least(&ring_done, tokens));
    CHECK_EQ(atomic_load(&ring_hops), (long)tokens * (hops_each + 1));
    for (int i = 0; i < n; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    free(pids);
}

static void test_ring_one_token(void)
{
    run_ring(1000, 1, check_scale(200000), false);
}

static void test_ring_many_tokens(void)
{
    run_ring(1000, 1000, check_scale(1000), false);
}

static void test_ring_mixed_priorities(void)
{
    run_ring(1000, 1000, check_scale(1000), true);
}

/* ---- Eight threads sending to one actor while it moves between schedulers ---- */
#define SENDERS 8
typedef struct {
    long next_seq[SENDERS];
    long out_of_order;
    pthread_t threads[4];
    int nthreads;
} seq_state_t;

static atomic_long seq_received;
static atomic_long seq_out_of_order;
static atomic_long seq_threads_seen;

static void seq_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    seq_state_t *st = state;
    long *d = (long *)(void *)m->data;
    long sender = d[0], seq = d[1];
    if (seq != st->next_seq[sender])
        atomic_fetch_add(&seq_out_of_order, 1);
    st->next_seq[sender] = seq + 1;
    pthread_t me = pthread_self();
    bool known = false;
    for (int i = 0; i < st->nthreads; i++)
        known |= pthread_equal(st->threads[i], me);
    if (!known && st->nthreads < 4) {
        st->threads[st->nthreads++] = me;
        atomic_store(&seq_threads_seen, st->nthreads);
    }
    atomic_fetch_add(&seq_received, 1);
}

static const rt_actor_type_t seq_type = {
    .name = "seq", .state_size = sizeof(seq_state_t), .handle = seq_handle};

typedef struct {
    rt_pid_t target;
    long index;
    long count;
} sender_arg_t;

static pthread_barrier_t pause_barrier;

static void *sender_main(void *p)
{
    sender_arg_t *a = p;
    for (long i = 0; i < a->count; i++) {
        long d[2] = {a->index, i};
        rt_send(a->target, MSG_SEQ, d, sizeof(d));
        /* All senders pause together now and then: the mailbox runs dry, and the next
           wake-up may land on the other scheduler. */
        if (i % 500 == 499) {
            pthread_barrier_wait(&pause_barrier);
            test_sleep_ms(2);
        }
    }
    return NULL;
}

static void test_concurrent_senders_migration(void)
{
    atomic_store(&seq_received, 0);
    atomic_store(&seq_out_of_order, 0);
    rt_pid_t target;
    rt_spawn(&seq_type, NULL, &target);
    long per = check_scale(20000);
    pthread_t th[SENDERS];
    sender_arg_t args[SENDERS];
    pthread_barrier_init(&pause_barrier, NULL, SENDERS);
    for (int i = 0; i < SENDERS; i++) {
        args[i] = (sender_arg_t){.target = target, .index = i, .count = per};
        pthread_create(&th[i], NULL, sender_main, &args[i]);
    }
    for (int i = 0; i < SENDERS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&pause_barrier);
    CHECK(wait_at_least(&seq_received, SENDERS * per));
    CHECK_EQ(atomic_load(&seq_received), SENDERS * per);
    CHECK_EQ(atomic_load(&seq_out_of_order), 0);
    CHECK(atomic_load(&seq_threads_seen) >= 2); /* it did run on more than one scheduler */
    rt_exit_signal(target, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- Backpressure: a fast producer cannot grow a slow consumer's mailbox without bound ---- */
static atomic_long consumed;
static atomic_long produced;

static void slow_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    volatile unsigned x = 0;
    for (unsigned i = 0; i < 20000; i++)
        x += i;
    atomic_fetch_add(&consumed, 1);
}

static const rt_actor_type_t slow_type = {.name = "slow", .state_size = 8, .handle = slow_handle};

typedef struct {
    rt_pid_t consumer;
    long total;
} producer_state_t;

/* Sends the next 50 with send, then asks itself for more; true once all are sent. */
static bool produce(rt_actor_t *self, producer_state_t *st, rt_msg_t *m,
                    int (*send)(rt_pid_t, rt_msg_t *))
{
    if (m->tag == MSG_GO) {
        st->consumer = ((rt_pid_t *)(void *)m->data)[0];
        st->total = (long)((rt_pid_t *)(void *)m->data)[1];
    }
    for (int i = 0; i < 50 && atomic_load(&produced) < st->total; i++) {
        send(st->consumer, rt_msg_new(MSG_WORK, 0));
        atomic_fetch_add(&produced, 1);
    }
    if (atomic_load(&produced) >= st->total)
        return true;
    rt_send(rt_self(self), MSG_SPIN, NULL, 0);
    return false;
}

static void producer_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    produce(self, state, m, rt_send_msg);
}

static const rt_actor_type_t producer_type = {
    .name = "producer", .state_size = sizeof(producer_state_t), .handle = producer_handle};

/* Runs total messages from a producer of type to a slow consumer; the consumer's peak mailbox. */
static uint64_t produce_to_slow(const rt_actor_type_t *type, long total)
{
    atomic_store(&consumed, 0);
    atomic_store(&produced, 0);
    rt_pid_t c, p;
    rt_spawn(&slow_type, NULL, &c);
    rt_spawn(type, NULL, &p);
    rt_pid_t go[2] = {c, (rt_pid_t)total};
    rt_send(p, MSG_GO, go, sizeof(go));
    uint64_t max_len = 0;
    uint64_t end = test_now_ms() + 120000;
    while (atomic_load(&consumed) < total && test_now_ms() < end) {
        rt_actor_info_t info;
        if (rt_actor_info(c, &info) == 0 && info.mailbox_len > max_len)
            max_len = info.mailbox_len;
        test_sleep_ms(1);
    }
    CHECK_EQ(atomic_load(&consumed), total);
    fprintf(stderr, "  %s: %ld messages, consumer mailbox peaked at %llu\n", type->name, total,
            (unsigned long long)max_len);
    rt_exit_signal(c, RT_REASON_KILL);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
    return max_len;
}

static void test_backpressure(void)
{
    /* Without muting it reaches a large fraction of total. */
    CHECK(produce_to_slow(&producer_type, check_scale(200000)) < 5000);
}

/*
** A producer under socket pressure of its own (here rt_hold_senders: the same flag without a
** socket) is muted by its overloaded consumer like any other: the consumer runs and drains
** without it. Before, such a producer was never muted (a publisher whose client reads no
** PUBACKs filled its rule worker's mailbox with millions of messages).
*/
static void pressured_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_GO)
        rt_hold_senders(self, true);
    produce(self, state, m, rt_send_msg);
}

static const rt_actor_type_t pressured_type = {
    .name = "pressured", .state_size = sizeof(producer_state_t), .handle = pressured_handle};

static void test_pressured_sender_muted(void)
{
    CHECK(produce_to_slow(&pressured_type, check_scale(50000)) < 5000); /* as test_backpressure */
}

/*
** A pressured producer parked under its consumer goes free when the consumer parks in turn:
** here the consumer parks under a gate that holds its senders until the producer has sent
** everything. Were the producer left parked, none of the three would ever run again.
*/
static atomic_long gate_open;

static void gate_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    long total = *(long *)state;
    if (m->tag == MSG_GO) {
        memcpy(state, m->data, sizeof(long));
        rt_hold_senders(self, true);
    } else if (m->tag == MSG_SPIN && atomic_load(&produced) >= total) {
        rt_hold_senders(self, false);
        atomic_store(&gate_open, 1);
        return;
    }
    if (m->tag != MSG_WORK)
        rt_send_after(1, rt_self(self), rt_msg_new(MSG_SPIN, 0), NULL);
}

static const rt_actor_type_t gate_type = {
    .name = "gate", .state_size = sizeof(long), .handle = gate_handle};

static rt_pid_t gate_pid;

/* Slow, and every 100th message also goes to the gate (which parks it while it holds). */
static void forwarder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    slow_handle(self, state, m);
    if (atomic_load(&consumed) % 100 == 0)
        rt_send(gate_pid, MSG_WORK, NULL, 0);
}

static const rt_actor_type_t forwarder_type = {
    .name = "forwarder", .state_size = 8, .handle = forwarder_handle};

static void test_pressured_sender_let_go(void)
{
    atomic_store(&consumed, 0);
    atomic_store(&produced, 0);
    atomic_store(&gate_open, 0);
    long total = check_scale(20000);
    rt_pid_t c, p;
    rt_spawn(&gate_type, NULL, &gate_pid);
    rt_send(gate_pid, MSG_GO, &total, sizeof(total));
    rt_spawn(&forwarder_type, NULL, &c);
    rt_spawn(&pressured_type, NULL, &p);
    rt_pid_t go[2] = {c, (rt_pid_t)total};
    rt_send(p, MSG_GO, go, sizeof(go));
    CHECK(wait_at_least(&gate_open, 1));
    CHECK(wait_at_least(&consumed, total));
    rt_exit_signal(gate_pid, RT_REASON_KILL);
    rt_exit_signal(c, RT_REASON_KILL);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/*
** The same when the (slow, so overloaded) consumer comes under pressure itself: a quarter of
** the way through it holds its senders until the producer has sent everything.
*/
static void holder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    long *total = state;
    if (m->tag == MSG_GO) {
        memcpy(total, m->data, sizeof(long));
        return;
    }
    if (m->tag == MSG_SPIN && atomic_load(&produced) >= *total) {
        rt_hold_senders(self, false);
        atomic_store(&gate_open, 1);
        return;
    }
    if (m->tag == MSG_WORK) {
        slow_handle(self, state, m);
        if (atomic_load(&consumed) != *total / 4)
            return;
    }
    rt_hold_senders(self, true);
    rt_send_after(1, rt_self(self), rt_msg_new(MSG_SPIN, 0), NULL);
}

static const rt_actor_type_t holder_type = {
    .name = "holder", .state_size = sizeof(long), .handle = holder_handle};

static void test_pressured_sender_let_go_by_pressure(void)
{
    atomic_store(&consumed, 0);
    atomic_store(&produced, 0);
    atomic_store(&gate_open, 0);
    long total = check_scale(20000);
    rt_pid_t c, p;
    rt_spawn(&holder_type, NULL, &c);
    rt_send(c, MSG_GO, &total, sizeof(total));
    rt_spawn(&pressured_type, NULL, &p);
    rt_pid_t go[2] = {c, (rt_pid_t)total};
    rt_send(p, MSG_GO, go, sizeof(go));
    CHECK(wait_at_least(&gate_open, 1));
    CHECK(wait_at_least(&consumed, total));
    rt_exit_signal(c, RT_REASON_KILL);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/*
** rt_send_unmuted: a producer whose consumer is overloaded is not parked. The consumer's
** first message holds its scheduler until the producer has sent everything; a producer that
** were muted (its sends pass RT_MAILBOX_HIGH queued) would wait for the consumer for good and
** never get there. The wait is bounded, so a broken rt_send_unmuted fails, not hangs.
*/
static atomic_bool unmuted_all_sent;

static void held_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    uint64_t until = test_now_ms() + 20000;
    while (!atomic_load(&unmuted_all_sent) && test_now_ms() < until)
        test_sleep_ms(1);
    atomic_fetch_add(&consumed, 1);
}

static const rt_actor_type_t held_type = {.name = "held", .state_size = 8, .handle = held_handle};

static void unmuted_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (produce(self, state, m, rt_send_unmuted))
        atomic_store(&unmuted_all_sent, true);
}

static const rt_actor_type_t unmuted_type = {
    .name = "unmuted", .state_size = sizeof(producer_state_t), .handle = unmuted_handle};

static void test_send_unmuted(void)
{
    atomic_store(&consumed, 0);
    atomic_store(&produced, 0);
    atomic_store(&unmuted_all_sent, false);
    long total = 20000; /* 20 times RT_MAILBOX_HIGH: muting would have parked it long before */
    rt_pid_t c, p;
    rt_spawn(&held_type, NULL, &c);
    rt_send(c, MSG_WORK, NULL, 0);
    rt_spawn(&unmuted_type, NULL, &p);
    rt_pid_t go[2] = {c, (rt_pid_t)total};
    rt_send(p, MSG_GO, go, sizeof(go));
    CHECK(wait_at_least(&consumed, total + 1));
    CHECK(atomic_load(&unmuted_all_sent));
    rt_exit_signal(c, RT_REASON_KILL);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- Blocking actors never stall schedulers ---- */
static atomic_long sleepers_started;
static atomic_long sleepers_done;
static atomic_long quick_done;

static void sleeper_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    atomic_fetch_add(&sleepers_started, 1);
    test_sleep_ms(1000);
    atomic_fetch_add(&sleepers_done, 1);
}

static const rt_actor_type_t sleeper_type = {
    .name = "sleeper", .state_size = 8, .handle = sleeper_handle, .flags = RT_TYPE_BLOCKING};

static void quick_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    atomic_fetch_add(&quick_done, 1);
}

static const rt_actor_type_t quick_type = {
    .name = "quick", .state_size = 8, .handle = quick_handle};

static void test_blocking_pool(void)
{
    atomic_store(&sleepers_started, 0);
    atomic_store(&sleepers_done, 0);
    atomic_store(&quick_done, 0);
    rt_pid_t s1, s2, q;
    rt_spawn(&sleeper_type, NULL, &s1);
    rt_spawn(&sleeper_type, NULL, &s2);
    rt_spawn(&quick_type, NULL, &q);
    rt_send(s1, MSG_SLEEP, NULL, 0);
    rt_send(s2, MSG_SLEEP, NULL, 0);
    CHECK(wait_at_least(&sleepers_started, 2)); /* both blocking threads are taken */
    for (int i = 0; i < 100; i++)
        rt_send(q, MSG_WORK, NULL, 0);
    CHECK(wait_at_least(&quick_done, 100));
    CHECK_EQ(atomic_load(&sleepers_done), 0); /* schedulers ran while both sleepers blocked */
    CHECK(wait_at_least(&sleepers_done, 2));
    rt_exit_signal(s1, RT_REASON_KILL);
    rt_exit_signal(s2, RT_REASON_KILL);
    rt_exit_signal(q, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- An idle runtime uses no CPU ---- */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void test_idle_uses_no_cpu(void)
{
    rt_pid_t q;
    rt_spawn(&quick_type, NULL, &q);
    /* The earlier tests' actors are gone: 200 ms (RT_TRIM_QUIET_MS) after the last exit the
       schedulers give memory back once (sched.c idle_trim), then wait 1 s or more before
       another look. That is work after a burst, not idling: the window starts after it. */
    test_sleep_ms(400);
    double c0 = cpu_seconds();
    test_sleep_ms(500);
    double used = cpu_seconds() - c0;
    fprintf(stderr, "  idle: %.1f ms CPU over 500 ms\n", used * 1e3);
    CHECK(used < 0.025);
    rt_exit_signal(q, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- Heaps that shrink without exiting give their chunks back to the OS ---- */
/*
** 16 MiB of 512-byte objects (two a 1 KiB chunk), then all freed but one in every 32: a
** chunk kept in every 16, so each arena stays in use (nothing is unmapped as a whole) while
** three pages in four hold only free chunks, which only a trim gives back.
*/
enum { SHRINK_OBJS = 32768, SHRINK_OBJ_BYTES = 512, SHRINK_KEEP_EVERY = 32 };

static atomic_long shrunk; /* the shrinker freed what it meant to */

typedef struct {
    void *kept; /* the kept objects, chained through their first words: live to collections */
} shrinker_state_t;

static void shrinker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    shrinker_state_t *st = state;
    (void)m;
    void **objs = malloc(SHRINK_OBJS * sizeof(*objs));
    CHECK(objs != NULL);
    for (int i = 0; objs && i < SHRINK_OBJS; i++)
        CHECK((objs[i] = rt_alloc(self, SHRINK_OBJ_BYTES, RT_OBJ_SCAN)) != NULL);
    for (int i = 0; objs && i < SHRINK_OBJS; i++) {
        if (i % SHRINK_KEEP_EVERY) {
            rt_free(self, objs[i]);
        } else {
            *(void **)objs[i] = st->kept;
            st->kept = objs[i];
        }
    }
    free(objs);
    atomic_store(&shrunk, 1);
}

static const rt_actor_type_t shrinker_type = {
    .name = "shrinker", .state_size = sizeof(shrinker_state_t), .handle = shrinker_handle};

static size_t pool_resident(void)
{
    size_t arenas, map_mapped, map_resident;
    rt_heap_pool_resident(&arenas, &map_mapped, &map_resident);
    return arenas;
}

/*
** Sessions hibernating after a login storm free most of their heaps' chunks with no actor
** exiting; the idle trim (sched.c) must give those pages back too. It now starts on chunks
** coming back as on exits; before, only its periodic retry (1 s doubling to 64 s, reset by
** exits alone) found them, and 19,000 idle XMPP sessions kept 41 MB of free chunks resident
** for a minute or more, which this run on a fresh runtime cannot tell apart. The bound is
** the trim's own: quiet for RT_TRIM_QUIET_MS, then one trim; 10 s turns none into a failure.
*/
static void test_shrunk_heaps_trimmed(void)
{
    rt_pid_t p;
    CHECK_EQ(rt_spawn(&shrinker_type, NULL, &p), 0);
    rt_send(p, MSG_GO, NULL, 0);
    CHECK(wait_at_least(&shrunk, 1));
    /* After a trim each chunk in use keeps at most its page, and each arena its descriptors
       (1/16 of it); the free pages are not resident. Without one, all of it is. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE), mapped, out, resident = pool_resident(), bound;
    rt_heap_pool_stats(&mapped, &out);
    bound = out / RT_HEAP_CHUNK_SIZE * page + mapped / 16;
    uint64_t deadline = test_now_ms() + RT_TEST_WAIT_MS;
    while (resident > bound && test_now_ms() < deadline) {
        test_sleep_ms(10);
        resident = pool_resident();
        rt_heap_pool_stats(&mapped, &out);
        bound = out / RT_HEAP_CHUNK_SIZE * page + mapped / 16;
    }
    fprintf(stderr, "  chunk pool: %zu KiB mapped, %zu KiB in use, %zu KiB resident (bound %zu)\n",
            mapped >> 10, out >> 10, resident >> 10, bound >> 10);
    /* The kept chunks hold their arenas (none unmapped whole), and the bound is below them. */
    CHECK(mapped >= (size_t)SHRINK_OBJS * SHRINK_OBJ_BYTES / 2);
    CHECK(bound < mapped / 2);
    CHECK(resident <= bound);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- rt_yield: a yielding actor lets the others on its scheduler run between its messages ---- */
enum { YIELD_N = 50 }; /* < RT_BATCH_DEFAULT: without yielding, one turn takes them all */

typedef struct {
    rt_pid_t other;
    bool yield;
    long next; /* sequence number expected next */
} yielder_state_t;

static atomic_long y_handled; /* messages the yielder handled */
static atomic_long y_out_of_order;
static atomic_long o_handled;     /* pings the other actor handled */
static atomic_long o_interleaved; /* pings handled before the yielder's next message */
static atomic_long y_turn_ok;     /* rt_turn_us counted a 2 ms busy wait; rt_turn_mono_ns */

static void yielder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    yielder_state_t *st = state;
    if (m->tag == MSG_GO) {
        memcpy(&st->other, m->data, sizeof(st->other));
        memcpy(&st->yield, m->data + sizeof(st->other), sizeof(st->yield));
        return;
    }
    long seq;
    memcpy(&seq, m->data, sizeof(seq));
    if (seq != st->next++)
        atomic_fetch_add(&y_out_of_order, 1);
    if (seq == 0) {
        uint64_t first = rt_turn_mono_ns(0);
        uint64_t t0 = test_now_ms();
        while (test_now_ms() < t0 + 3)
            ;
        /* The turn's clock is the reading its first call made, unless asked for a later one. */
        uint64_t later = rt_mono_ns();
        if (rt_turn_us(self) >= 2000 && rt_turn_mono_ns(0) == first &&
            rt_turn_mono_ns(later) >= later && rt_turn_mono_ns(0) > first)
            atomic_fetch_add(&y_turn_ok, 1);
    }
    long done = atomic_fetch_add(&y_handled, 1) + 1;
    rt_send(st->other, MSG_WORK, &done, sizeof(done));
    if (st->yield)
        rt_yield(self);
}

static const rt_actor_type_t yielder_type = {
    .name = "yielder", .state_size = sizeof(yielder_state_t), .handle = yielder_handle};

/* Counts a ping as interleaved when the yielder has not moved on since it sent it. */
static void other_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    long done;
    memcpy(&done, m->data, sizeof(done));
    if (atomic_load(&y_handled) == done)
        atomic_fetch_add(&o_interleaved, 1);
    atomic_fetch_add(&o_handled, 1);
}

static const rt_actor_type_t other_type = {
    .name = "other", .state_size = 8, .handle = other_handle};

/* Sends the yielder its whole batch from inside a turn, so all of it is queued before it runs. */
static void starter_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    rt_pid_t y;
    memcpy(&y, m->data, sizeof(y));
    rt_send(y, MSG_GO, m->data + sizeof(y), m->len - sizeof(y));
    for (long i = 0; i < YIELD_N; i++)
        rt_send(y, MSG_SEQ, &i, sizeof(i));
}

static const rt_actor_type_t starter_type = {
    .name = "starter", .state_size = 8, .handle = starter_handle};

/*
** One scheduler, so "the same scheduler" is certain and the order is exact. The
** yielder gets YIELD_N messages at once and pings the other actor from each: a
** yielding one lets the other run after every message; one that does not runs
** all YIELD_N in one turn (the control, which shows the check can fail).
*/
static void run_yield(bool yield)
{
    atomic_store(&y_handled, 0);
    atomic_store(&y_out_of_order, 0);
    atomic_store(&o_handled, 0);
    atomic_store(&o_interleaved, 0);
    atomic_store(&y_turn_ok, 0);
    rt_pid_t y, o, s;
    CHECK_EQ(rt_spawn(&yielder_type, NULL, &y), 0);
    CHECK_EQ(rt_spawn(&other_type, NULL, &o), 0);
    CHECK_EQ(rt_spawn(&starter_type, NULL, &s), 0);
    unsigned char go[2 * sizeof(rt_pid_t) + sizeof(bool)];
    memcpy(go, &y, sizeof(y));
    memcpy(go + sizeof(y), &o, sizeof(o));
    memcpy(go + 2 * sizeof(y), &yield, sizeof(yield));
    rt_send(s, MSG_GO, go, sizeof(go));
    CHECK(wait_at_least(&o_handled, YIELD_N));
    CHECK_EQ(atomic_load(&y_handled), YIELD_N);
    CHECK_EQ(atomic_load(&y_out_of_order), 0);
    CHECK_EQ(atomic_load(&y_turn_ok), 1);
    fprintf(stderr, "  %s: the other actor ran between %ld of %d messages\n",
            yield ? "rt_yield" : "no yield", atomic_load(&o_interleaved), YIELD_N);
    if (yield)
        CHECK_EQ(atomic_load(&o_interleaved), YIELD_N);
    else
        CHECK_EQ(atomic_load(&o_interleaved), 1); /* only the last ping, after the batch */
    rt_exit_signal(y, RT_REASON_KILL);
    rt_exit_signal(o, RT_REASON_KILL);
    rt_exit_signal(s, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_yield(void)
{
    run_yield(true);
    run_yield(false);
}

/* ---- Priorities ---- */
/*
** One scheduler, so that turns follow one another in an exact order and counting them
** says what ran before what. Every actor here handles one message a turn: it sends
** itself the next and yields, so it is queued again at its lane's tail.
*/
static atomic_bool prio_stop;
static atomic_long spin_turns[2]; /* turns of the spinners, by rt_priority_t */

static int spinner_init(rt_actor_t *self, void *state, void *arg)
{
    rt_priority_t prio = *(const rt_priority_t *)arg;
    *(rt_priority_t *)state = prio;
    rt_set_priority(self, prio);
    return 0;
}

static void spinner_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)m;
    atomic_fetch_add(&spin_turns[*(rt_priority_t *)state], 1);
    if (atomic_load(&prio_stop))
        return;
    rt_send(rt_self(self), MSG_SPIN, NULL, 0);
    rt_yield(self);
}

static const rt_actor_type_t spinner_type = {.name = "spinner",
                                             .state_size = sizeof(rt_priority_t),
                                             .init = spinner_init,
                                             .handle = spinner_handle};

static rt_pid_t *spawn_spinners(int n, rt_priority_t prio)
{
    rt_pid_t *pids = calloc((size_t)n, sizeof(rt_pid_t));
    for (int i = 0; i < n; i++) {
        CHECK_EQ(rt_spawn(&spinner_type, &prio, &pids[i]), 0);
        rt_send(pids[i], MSG_SPIN, NULL, 0);
    }
    return pids;
}

static void stop_all(rt_pid_t *pids, int n)
{
    atomic_store(&prio_stop, true);
    for (int i = 0; i < n; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    free(pids);
    atomic_store(&prio_stop, false);
}

static atomic_long probe_at; /* spinner turns (both lanes) when the probe ran; -1 before */

static long spin_total(void)
{
    return atomic_load(&spin_turns[RT_PRIORITY_LOW]) + atomic_load(&spin_turns[RT_PRIORITY_NORMAL]);
}

static void probe_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state, (void)m;
    atomic_store(&probe_at, spin_total());
}

static const rt_actor_type_t probe_type = {
    .name = "probe", .state_size = 8, .handle = probe_handle};

/*
** PRIO_CROWD spinners are runnable all the time, and a normal actor gets a message. Once it
** is queued, the turn running then is the only one before it when the crowd is low: normal
** goes first. The control, a crowd of normal actors, shows the check can fail: the message
** waits for the turns of the crowd queued ahead of it.
*/
#define PRIO_CROWD 200

/* The crowd's turns that ran between the probe's message being queued and its turn. */
static long probe_wait(rt_priority_t crowd_prio)
{
    atomic_store(&spin_turns[RT_PRIORITY_LOW], 0);
    atomic_store(&spin_turns[RT_PRIORITY_NORMAL], 0);
    atomic_store(&probe_at, -1);
    rt_pid_t *pids = spawn_spinners(PRIO_CROWD, crowd_prio);
    CHECK(wait_at_least(&spin_turns[crowd_prio], 4 * PRIO_CROWD)); /* all of them spin */
    rt_pid_t probe;
    CHECK_EQ(rt_spawn(&probe_type, NULL, &probe), 0);
    rt_send(probe, MSG_GO, NULL, 0);
    long queued = spin_total();
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (atomic_load(&probe_at) < 0 && test_now_ms() < end)
        test_sleep_ms(1);
    CHECK(atomic_load(&probe_at) >= 0);
    rt_exit_signal(probe, RT_REASON_KILL);
    stop_all(pids, PRIO_CROWD);
    return atomic_load(&probe_at) - queued;
}

static void test_priority_normal_first(void)
{
    long low = probe_wait(RT_PRIORITY_LOW);
    long normal = probe_wait(RT_PRIORITY_NORMAL);
    fprintf(stderr,
            "  a normal actor's message waited %ld turns of %d low actors, %ld of %d normal\n", low,
            PRIO_CROWD, normal, PRIO_CROWD);
    CHECK(low <= 1);
    CHECK(normal >= PRIO_CROWD / 2);
}

/*
** Normal spinners keep the normal lane full; one turn of a normal actor then queues
** PRIO_LOWS low actors a message each. All of them run, one after every RT_LOW_EVERY normal
** turns, and no sooner: normal turns go first, low ones are not starved.
*/
#define PRIO_SPINNERS 4
#define PRIO_LOWS 50

static atomic_long low_done;    /* low actors that ran */
static atomic_long gap_min;     /* fewest normal turns between two low ones (or the first) */
static atomic_long gap_max;     /* most */
static atomic_long last_normal; /* spinner turns at the latest low turn, or at the queueing */

static int low_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state, (void)arg;
    rt_set_priority(self, RT_PRIORITY_LOW);
    return 0;
}

static void low_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state, (void)m;
    long now = atomic_load(&spin_turns[RT_PRIORITY_NORMAL]);
    long gap = now - atomic_exchange(&last_normal, now);
    if (gap < atomic_load(&gap_min))
        atomic_store(&gap_min, gap);
    if (gap > atomic_load(&gap_max))
        atomic_store(&gap_max, gap);
    atomic_fetch_add(&low_done, 1);
}

static const rt_actor_type_t low_type = {
    .name = "low", .state_size = 8, .init = low_init, .handle = low_handle};

static void queue_lows_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state;
    atomic_store(&last_normal, atomic_load(&spin_turns[RT_PRIORITY_NORMAL]));
    const rt_pid_t *lows = (const rt_pid_t *)(const void *)m->data;
    for (size_t i = 0; i < m->len / sizeof(rt_pid_t); i++)
        rt_send(lows[i], MSG_WORK, NULL, 0);
}

static const rt_actor_type_t queue_lows_type = {
    .name = "queue_lows", .state_size = 8, .handle = queue_lows_handle};

static void test_priority_low_not_starved(void)
{
    atomic_store(&spin_turns[RT_PRIORITY_NORMAL], 0);
    atomic_store(&low_done, 0);
    atomic_store(&gap_min, LONG_MAX);
    atomic_store(&gap_max, 0);
    rt_pid_t *pids = spawn_spinners(PRIO_SPINNERS, RT_PRIORITY_NORMAL);
    CHECK(wait_at_least(&spin_turns[RT_PRIORITY_NORMAL], 4 * PRIO_SPINNERS));
    rt_pid_t lows[PRIO_LOWS], q;
    for (int i = 0; i < PRIO_LOWS; i++)
        CHECK_EQ(rt_spawn(&low_type, NULL, &lows[i]), 0);
    CHECK_EQ(rt_spawn(&queue_lows_type, NULL, &q), 0);
    rt_send(q, MSG_GO, lows, sizeof(lows));
    CHECK(wait_at_least(&low_done, PRIO_LOWS));
    fprintf(stderr, "  %d low actors ran %ld to %ld normal turns apart (RT_LOW_EVERY %d)\n",
            PRIO_LOWS, atomic_load(&gap_min), atomic_load(&gap_max), RT_LOW_EVERY);
    CHECK(atomic_load(&gap_min) >= 1);
    CHECK(atomic_load(&gap_max) <= RT_LOW_EVERY);
    for (int i = 0; i < PRIO_LOWS; i++)
        rt_exit_signal(lows[i], RT_REASON_KILL);
    rt_exit_signal(q, RT_REASON_KILL);
    stop_all(pids, PRIO_SPINNERS);
}

int main(void)
{
    test_start(2);
    RUN(test_shrunk_heaps_trimmed);
    RUN(test_ring_one_token);
    RUN(test_ring_many_tokens);
    RUN(test_ring_mixed_priorities);
    RUN(test_concurrent_senders_migration);
    RUN(test_backpressure);
    RUN(test_pressured_sender_muted);
    RUN(test_pressured_sender_let_go);
    RUN(test_pressured_sender_let_go_by_pressure);
    RUN(test_send_unmuted);
    RUN(test_blocking_pool);
    RUN(test_idle_uses_no_cpu);
    rt_shutdown();
    test_start(1);
    RUN(test_yield);
    RUN(test_priority_normal_first);
    RUN(test_priority_low_not_starved);
    rt_shutdown();
    return CHECK_SUMMARY();
}

/* Actors: spawn, send, exit, dead letters (and their hook), registry, links, monitors, trap_exit,
   heap limits, a message passed on keeping its first sender (rt_forward). */
#include "rt_test.h"

enum {
    MSG_ADD = RT_MSG_USER,
    MSG_EXIT_WITH,
    MSG_LINK_TO,
    MSG_MONITOR,
    MSG_DEMONITOR,
    MSG_ALLOC,
    MSG_PING
};

/* A general-purpose probe: counts what it receives into shared counters. */
typedef struct {
    atomic_long received;
    atomic_long exits_seen;
    atomic_long downs_seen;
    atomic_long terminated;
    atomic_int last_reason;
    atomic_long last_from;
    atomic_long last_ref;
} probe_t;

typedef struct {
    probe_t *probe;
    bool trap;
    void **keep; /* heap objects kept reachable through the state */
    size_t nkeep;
} probe_state_t;

static int probe_init(rt_actor_t *self, void *state, void *arg)
{
    probe_state_t *st = state;
    st->probe = arg;
    return 0;
}

static void probe_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    probe_state_t *st = state;
    probe_t *p = st->probe;
    switch (m->tag) {
    case RT_MSG_EXIT: {
        rt_exit_msg_t *e = (rt_exit_msg_t *)(void *)m->data;
        atomic_store(&p->last_reason, e->reason);
        atomic_store(&p->last_from, (long)e->from);
        atomic_fetch_add(&p->exits_seen, 1);
        break;
    }
    case RT_MSG_DOWN: {
        rt_down_msg_t *d = (rt_down_msg_t *)(void *)m->data;
        atomic_store(&p->last_reason, d->reason);
        atomic_store(&p->last_from, (long)d->pid);
        atomic_store(&p->last_ref, (long)d->ref);
        atomic_fetch_add(&p->downs_seen, 1);
        break;
    }
    case MSG_EXIT_WITH:
        rt_exit(self, *(rt_reason_t *)(void *)m->data);
        break;
    case MSG_LINK_TO:
        rt_link(self, *(rt_pid_t *)(void *)m->data);
        atomic_fetch_add(&p->received, 1);
        break;
    case MSG_MONITOR: {
        rt_ref_t ref = 0;
        rt_monitor(self, *(rt_pid_t *)(void *)m->data, &ref);
        atomic_store(&p->last_ref, (long)ref);
        atomic_fetch_add(&p->received, 1);
        break;
    }
    case MSG_DEMONITOR:
        rt_demonitor(self, *(rt_ref_t *)(void *)m->data);
        atomic_fetch_add(&p->received, 1);
        break;
    case MSG_ALLOC: {
        /* Allocate and keep: grows the live heap by the requested amount. */
        size_t n = *(size_t *)(void *)m->data;
        void **keep = rt_alloc(self, (st->nkeep + 1) * sizeof(void *), RT_OBJ_SCAN);
        if (keep && st->keep)
            memcpy(keep, st->keep, st->nkeep * sizeof(void *));
        if (keep) {
            keep[st->nkeep] = rt_alloc(self, n, RT_OBJ_LEAF);
            st->keep = keep;
            st->nkeep++;
        }
        atomic_fetch_add(&p->received, 1);
        break;
    }
    default:
        atomic_fetch_add(&p->received, 1);
    }
}

static void probe_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    probe_state_t *st = state;
    atomic_store(&st->probe->last_reason, reason);
    atomic_fetch_add(&st->probe->terminated, 1);
}

static const rt_actor_type_t probe_type = {
    .name = "probe",
    .state_size = sizeof(probe_state_t),
    .init = probe_init,
    .handle = probe_handle,
    .terminate = probe_terminate,
};

static int trapper_init(rt_actor_t *self, void *state, void *arg)
{
    rt_trap_exit(self, true);
    return probe_init(self, state, arg);
}

static const rt_actor_type_t trapper_type = {
    .name = "trapper",
    .state_size = sizeof(probe_state_t),
    .init = trapper_init,
    .handle = probe_handle,
    .terminate = probe_terminate,
};

static void send_reason(rt_pid_t to, rt_reason_t r)
{
    rt_send(to, MSG_EXIT_WITH, &r, sizeof(r));
}

static void test_spawn_send(void)
{
    probe_t p = {0};
    rt_pid_t pid = 0;
    CHECK_EQ(rt_spawn(&probe_type, &p, &pid), 0);
    CHECK(pid != 0);
    for (int i = 0; i < 1000; i++)
        CHECK_EQ(rt_send(pid, MSG_ADD, &i, sizeof(i)), 0);
    CHECK(wait_at_least(&p.received, 1000));
    CHECK_EQ(atomic_load(&p.received), 1000);
    send_reason(pid, RT_REASON_NORMAL);
    CHECK(wait_at_least(&p.terminated, 1));
    CHECK_EQ(atomic_load(&p.last_reason), RT_REASON_NORMAL);
}

/* Passes each message on twice, to the pid it carries: kept as its first sender's
   (rt_forward), and as its own (rt_send_msg). */
enum { MSG_RELAY = RT_MSG_USER + 50, MSG_RELAYED };
static _Atomic rt_pid_t relayed_from[2];
static atomic_long relayed, relay_failed; /* counted here: CHECK is the main thread's */

static void relay_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self;
    (void)state;
    if (m->tag == MSG_RELAYED) {
        atomic_store(&relayed_from[m->data[0]], m->from);
        atomic_fetch_add(&relayed, 1);
        return;
    }
    rt_pid_t to;
    memcpy(&to, m->data, sizeof(to));
    for (uint8_t way = 0; way < 2; way++) {
        rt_msg_t *c = rt_msg_new(MSG_RELAYED, 1);
        if (c) {
            c->data[0] = way;
            c->from = m->from;
        }
        if (!c || (way ? rt_send_msg(to, c) : rt_forward(to, c)) != 0)
            atomic_fetch_add(&relay_failed, 1);
    }
}

static const rt_actor_type_t relay_type = {.name = "relay", .handle = relay_handle};

static void test_forward_keeps_the_sender(void)
{
    atomic_store(&relayed, 0);
    rt_pid_t relay, sink;
    CHECK_EQ(rt_spawn(&relay_type, NULL, &relay), 0);
    CHECK_EQ(rt_spawn(&relay_type, NULL, &sink), 0);
    rt_msg_t *m = rt_msg_new(MSG_RELAY, sizeof(sink));
    memcpy(m->data, &sink, sizeof(sink));
    m->from = 777; /* outside any actor, as a timer's sender stays */
    CHECK_EQ(rt_send_msg(relay, m), 0);
    CHECK(wait_at_least(&relayed, 2));
    CHECK_EQ(atomic_load(&relay_failed), 0);
    CHECK_EQ(atomic_load(&relayed_from[0]), 777);   /* rt_forward: the first sender */
    CHECK_EQ(atomic_load(&relayed_from[1]), relay); /* rt_send_msg: the relay itself */
    CHECK_EQ(rt_exit_signal(relay, RT_REASON_KILL), 0);
    CHECK_EQ(rt_exit_signal(sink, RT_REASON_KILL), 0);
    CHECK(wait_alive(0));
}

static void test_dead_letters(void)
{
    probe_t p = {0};
    rt_pid_t pid;
    rt_spawn(&probe_type, &p, &pid);
    send_reason(pid, RT_REASON_NORMAL);
    CHECK(wait_at_least(&p.terminated, 1));
    rt_stats_t before, after;
    rt_stats(&before);
    CHECK_EQ(rt_send(pid, MSG_ADD, NULL, 0), RT_ENOPROC);
    CHECK_EQ(rt_send(pid, MSG_ADD, NULL, 0), RT_ENOPROC);
    rt_stats(&after);
    CHECK_EQ(after.dead_letters - before.dead_letters, 2);
    /* A pid whose slot was reused by a new actor must still be dead (generation check). */
    probe_t q = {0};
    rt_pid_t pid2;
    rt_spawn(&probe_type, &q, &pid2);
    CHECK(pid2 != pid);
    CHECK_EQ(rt_send(pid, MSG_ADD, NULL, 0), RT_ENOPROC);
    CHECK_EQ(atomic_load(&q.received), 0);
    rt_exit_signal(pid2, RT_REASON_KILL);
    CHECK(wait_at_least(&q.terminated, 1));
    CHECK_EQ(atomic_load(&q.last_reason), RT_REASON_KILLED);
}

static void test_registry(void)
{
    probe_t p = {0};
    rt_pid_t pid;
    rt_spawn_opts_t o = {.name = "probe-1"};
    CHECK_EQ(rt_spawn_opt(&probe_type, &p, &o, &pid), 0);
    CHECK_EQ(rt_whereis("probe-1"), pid);
    probe_t q = {0};
    rt_pid_t pid2 = 0;
    CHECK_EQ(rt_spawn_opt(&probe_type, &q, &o, &pid2), RT_EEXIST);
    CHECK_EQ(pid2, 0);
    send_reason(pid, RT_REASON_NORMAL);
    CHECK(wait_at_least(&p.terminated, 1));
    CHECK(wait_alive(0));
    CHECK_EQ(rt_whereis("probe-1"), 0);
    CHECK_EQ(rt_spawn_opt(&probe_type, &q, &o, &pid2), 0);
    CHECK_EQ(rt_whereis("probe-1"), pid2);
    CHECK_EQ(rt_unregister("probe-1"), 0);
    CHECK_EQ(rt_whereis("probe-1"), 0);
    rt_exit_signal(pid2, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/*
** Once a message sent after gone's exit has been handled by to, everything that exit
** sent to to has been seen: its links' signals and monitors' DOWNs go out before its pid
** stops being alive, and an actor takes its signals before its next message.
*/
static bool exit_settled(rt_pid_t gone, rt_pid_t to, probe_t *p)
{
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (rt_alive(gone)) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
    long before = atomic_load(&p->received);
    rt_send(to, MSG_PING, NULL, 0);
    return wait_at_least(&p->received, before + 1);
}

static void test_links(void)
{
    /* An abnormal exit takes a linked, non-trapping actor down with the same reason. */
    probe_t a = {0}, b = {0};
    rt_pid_t pa, pb;
    rt_spawn(&probe_type, &a, &pa);
    rt_spawn(&probe_type, &b, &pb);
    rt_send(pa, MSG_LINK_TO, &pb, sizeof(pb));
    CHECK(wait_at_least(&a.received, 1));
    send_reason(pb, RT_REASON_USER + 1);
    CHECK(wait_at_least(&a.terminated, 1));
    CHECK_EQ(atomic_load(&a.last_reason), RT_REASON_USER + 1);

    /* A normal exit does not. */
    probe_t c = {0}, d = {0};
    rt_pid_t pc, pd;
    rt_spawn(&probe_type, &c, &pc);
    rt_spawn(&probe_type, &d, &pd);
    rt_send(pc, MSG_LINK_TO, &pd, sizeof(pd));
    CHECK(wait_at_least(&c.received, 1));
    send_reason(pd, RT_REASON_NORMAL);
    CHECK(wait_at_least(&d.terminated, 1));
    CHECK(exit_settled(pd, pc, &c));
    CHECK_EQ(atomic_load(&c.terminated), 0);

    /* A trapping actor gets the exit as a message and lives on. */
    probe_t t = {0}, e = {0};
    rt_pid_t pt, pe;
    rt_spawn(&trapper_type, &t, &pt);
    rt_spawn(&probe_type, &e, &pe);
    rt_send(pt, MSG_LINK_TO, &pe, sizeof(pe));
    CHECK(wait_at_least(&t.received, 1));
    send_reason(pe, RT_REASON_USER + 2);
    CHECK(wait_at_least(&t.exits_seen, 1));
    CHECK_EQ(atomic_load(&t.last_reason), RT_REASON_USER + 2);
    CHECK_EQ((rt_pid_t)atomic_load(&t.last_from), pe);
    CHECK_EQ(atomic_load(&t.terminated), 0);

    /* kill cannot be trapped; a link to a dead pid delivers noproc. */
    rt_send(pt, MSG_LINK_TO, &pe, sizeof(pe));
    CHECK(wait_at_least(&t.exits_seen, 2));
    CHECK_EQ(atomic_load(&t.last_reason), RT_REASON_NOPROC);
    rt_exit_signal(pt, RT_REASON_KILL);
    CHECK(wait_at_least(&t.terminated, 1));
    CHECK_EQ(atomic_load(&t.last_reason), RT_REASON_KILLED);
    rt_exit_signal(pc, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_monitors(void)
{
    probe_t w = {0}, x = {0};
    rt_pid_t pw, px;
    rt_spawn(&probe_type, &w, &pw);
    rt_spawn(&probe_type, &x, &px);
    rt_send(pw, MSG_MONITOR, &px, sizeof(px));
    CHECK(wait_at_least(&w.received, 1));
    rt_ref_t ref = (rt_ref_t)atomic_load(&w.last_ref);
    send_reason(px, RT_REASON_USER + 7);
    CHECK(wait_at_least(&w.downs_seen, 1));
    CHECK_EQ(atomic_load(&w.last_reason), RT_REASON_USER + 7);
    CHECK_EQ((rt_pid_t)atomic_load(&w.last_from), px);
    CHECK_EQ((rt_ref_t)atomic_load(&w.last_ref), ref);
    CHECK_EQ(atomic_load(&w.terminated), 0); /* monitors never kill */

    /* Monitoring a dead pid: DOWN noproc at once. */
    rt_send(pw, MSG_MONITOR, &px, sizeof(px));
    CHECK(wait_at_least(&w.downs_seen, 2));
    CHECK_EQ(atomic_load(&w.last_reason), RT_REASON_NOPROC);

    /* Demonitor: no DOWN afterwards. */
    probe_t y = {0};
    rt_pid_t py;
    rt_spawn(&probe_type, &y, &py);
    long before = atomic_load(&w.received);
    rt_send(pw, MSG_MONITOR, &py, sizeof(py));
    CHECK(wait_at_least(&w.received, before + 1));
    rt_ref_t ref2 = (rt_ref_t)atomic_load(&w.last_ref);
    rt_send(pw, MSG_DEMONITOR, &ref2, sizeof(ref2));
    CHECK(wait_at_least(&w.received, before + 2));
    send_reason(py, RT_REASON_USER);
    CHECK(wait_at_least(&y.terminated, 1));
    CHECK(exit_settled(py, pw, &w));
    CHECK_EQ(atomic_load(&w.downs_seen), 2);
    rt_exit_signal(pw, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* max_heap kills with heap_limit, and the reason reaches links and monitors. */
static void test_heap_limit(void)
{
    probe_t v = {0}, linked = {0}, watcher = {0};
    rt_pid_t pv, pl, pw;
    rt_spawn_opts_t o = {.max_heap = 256 * 1024};
    CHECK_EQ(rt_spawn_opt(&probe_type, &v, &o, &pv), 0);
    rt_spawn(&trapper_type, &linked, &pl);
    rt_spawn(&probe_type, &watcher, &pw);
    rt_send(pl, MSG_LINK_TO, &pv, sizeof(pv));
    rt_send(pw, MSG_MONITOR, &pv, sizeof(pv));
    CHECK(wait_at_least(&linked.received, 1));
    CHECK(wait_at_least(&watcher.received, 1));
    rt_stats_t before;
    rt_stats(&before);
    for (int i = 0; i < 64; i++) {
        size_t n = 16 * 1024;
        rt_send(pv, MSG_ALLOC, &n, sizeof(n));
    }
    CHECK(wait_at_least(&v.terminated, 1));
    CHECK_EQ(atomic_load(&v.last_reason), RT_REASON_HEAP_LIMIT);
    CHECK(atomic_load(&v.received) < 64);
    CHECK(wait_at_least(&linked.exits_seen, 1));
    CHECK_EQ(atomic_load(&linked.last_reason), RT_REASON_HEAP_LIMIT);
    CHECK(wait_at_least(&watcher.downs_seen, 1));
    CHECK_EQ(atomic_load(&watcher.last_reason), RT_REASON_HEAP_LIMIT);
    rt_stats_t after;
    rt_stats(&after);
    CHECK_EQ(after.heap_limit_kills - before.heap_limit_kills, 1);
    rt_exit_signal(pl, RT_REASON_KILL);
    rt_exit_signal(pw, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* A chain of 10,000 linked actors: killing one end takes all of them down. */
typedef struct {
    rt_pid_t next_link;
    long depth;
    atomic_long *built;
} chain_state_t;

static int chain_init(rt_actor_t *self, void *state, void *arg)
{
    chain_state_t *st = state;
    st->depth = (long)(intptr_t)arg;
    return 0;
}

static atomic_long chain_built;
static _Atomic rt_pid_t chain_tail;

static void chain_handle(rt_actor_t *self, void *state, rt_msg_t *m);

static const rt_actor_type_t chain_type = {
    .name = "chain",
    .state_size = sizeof(chain_state_t),
    .init = chain_init,
    .handle = chain_handle,
    .terminate = NULL,
};

static void chain_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    chain_state_t *st = state;
    if (m->tag != MSG_PING)
        return;
    /* The tail is published before it is counted: the test reads chain_tail as soon as
       the count is complete. */
    if (st->depth <= 1) {
        chain_tail = rt_self(self);
        atomic_fetch_add(&chain_built, 1);
        return;
    }
    atomic_fetch_add(&chain_built, 1);
    rt_spawn_opts_t o = {.link = true};
    rt_pid_t child;
    if (rt_spawn_opt(&chain_type, (void *)(intptr_t)(st->depth - 1), &o, &child) == 0)
        rt_send(child, MSG_PING, NULL, 0);
}

static void test_link_cascade(void)
{
    long n = 10000;
    atomic_store(&chain_built, 0);
    rt_pid_t head;
    CHECK_EQ(rt_spawn(&chain_type, (void *)(intptr_t)n, &head), 0);
    rt_send(head, MSG_PING, NULL, 0);
    CHECK(wait_at_least(&chain_built, n));
    rt_stats_t st;
    rt_stats(&st);
    CHECK_EQ(st.alive, (uint64_t)n);
    /* Kill the far end: the exit travels back through every link. */
    rt_exit_signal(chain_tail, RT_REASON_USER + 3);
    CHECK(wait_alive(0));
}

static void test_spawn_options(void)
{
    /* link and monitor need a calling actor */
    probe_t p = {0};
    rt_pid_t pid;
    rt_ref_t ref;
    rt_spawn_opts_t o = {.link = true};
    CHECK_EQ(rt_spawn_opt(&probe_type, &p, &o, &pid), RT_EINVAL);
    rt_spawn_opts_t o2 = {.monitor = &ref};
    CHECK_EQ(rt_spawn_opt(&probe_type, &p, &o2, &pid), RT_EINVAL);
    CHECK_EQ(rt_spawn(NULL, NULL, &pid), RT_EINVAL);
    CHECK(wait_alive(0));
}

static int failing_init(rt_actor_t *self, void *state, void *arg)
{
    return RT_ELIMIT;
}

static const rt_actor_type_t failing_type = {
    .name = "failing", .state_size = 8, .init = failing_init, .handle = probe_handle};

static void test_init_failure(void)
{
    rt_pid_t pid = 0;
    rt_spawn_opts_t o = {.name = "never"};
    CHECK_EQ(rt_spawn_opt(&failing_type, NULL, &o, &pid), RT_ELIMIT);
    CHECK_EQ(pid, 0);
    CHECK_EQ(rt_whereis("never"), 0);
    CHECK(wait_alive(0));
}

/*
** Messages an actor never handled go to its type's dead_letter, with its state: the
** nine left in the mailbox by an actor that exits on the first of ten, with their
** binaries. A send after the exit is refused, so its sender knows at once.
*/
enum { MSG_LETTER = RT_MSG_USER + 50 };
static atomic_long letters_handled, letters_dead;

static int letters_init(rt_actor_t *self, void *state, void *arg)
{
    *(int *)state = 42;
    for (int i = 0; i < 10; i++) {
        rt_msg_t *m = rt_msg_new(MSG_LETTER, sizeof(int));
        memcpy(m->data, &i, sizeof(i));
        m->bin = rt_bin_new("payload", 7);
        rt_send_msg(rt_self(self), m);
    }
    return 0;
}

static void letters_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    atomic_fetch_add(&letters_handled, 1);
    rt_exit(self, RT_REASON_NORMAL);
}

/* Counts only what it was meant to get; the main thread checks the count. */
static void letters_dead_letter(void *state, rt_msg_t *m)
{
    bool whole = *(int *)state == 42 && m->tag == MSG_LETTER && m->bin && rt_bin_len(m->bin) == 7;
    rt_bin_release(rt_msg_take_bin(m));
    if (whole)
        atomic_fetch_add(&letters_dead, 1);
}

static const rt_actor_type_t letters_type = {.name = "letters",
                                             .state_size = sizeof(int),
                                             .init = letters_init,
                                             .handle = letters_handle,
                                             .dead_letter = letters_dead_letter};

static void test_dead_letter_hook(void)
{
    atomic_store(&letters_handled, 0);
    atomic_store(&letters_dead, 0);
    rt_pid_t pid;
    CHECK_EQ(rt_spawn(&letters_type, NULL, &pid), 0);
    CHECK(wait_alive(0));
    CHECK_EQ(atomic_load(&letters_handled), 1);
    CHECK_EQ(atomic_load(&letters_dead), 9);
    CHECK_EQ(rt_send(pid, MSG_LETTER, NULL, 0), RT_ENOPROC); /* refused: the sender knows */
}

/* One binary, many receivers: every actor holds the same bytes, none is copied. */
enum { MSG_BIN = RT_MSG_USER + 100 };
static atomic_long bins_held;
static const uint8_t *_Atomic bin_seen[100];

typedef struct {
    void *held; /* heap handle keeping the binary */
    int index;
} binholder_state_t;

static int binholder_init(rt_actor_t *self, void *state, void *arg)
{
    ((binholder_state_t *)state)->index = (int)(intptr_t)arg;
    return 0;
}

static void binholder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    binholder_state_t *st = state;
    if (m->tag != MSG_BIN)
        return;
    st->held = rt_hold_bin(self, rt_msg_take_bin(m));
    atomic_store(&bin_seen[st->index], rt_bin_data(rt_heap_bin(st->held)));
    atomic_fetch_add(&bins_held, 1);
}

static const rt_actor_type_t binholder_type = {.name = "binholder",
                                               .state_size = sizeof(binholder_state_t),
                                               .init = binholder_init,
                                               .handle = binholder_handle};

static void test_shared_binaries(void)
{
    size_t count0, bytes0;
    rt_bin_totals(&count0, &bytes0);
    rt_bin_t *b = rt_bin_alloc(1 << 20);
    memset(rt_bin_data(b), 'p', 1 << 20);
    rt_pid_t pids[100];
    atomic_store(&bins_held, 0);
    for (int i = 0; i < 100; i++) {
        rt_spawn(&binholder_type, (void *)(intptr_t)i, &pids[i]);
        rt_msg_t *m = rt_msg_new(MSG_BIN, 0);
        m->bin = rt_bin_retain(b);
        rt_send_msg(pids[i], m);
    }
    CHECK(wait_at_least(&bins_held, 100));
    size_t count1, bytes1;
    rt_bin_totals(&count1, &bytes1);
    CHECK_EQ(count1 - count0, 1);       /* one binary ... */
    CHECK_EQ(bytes1 - bytes0, 1 << 20); /* ... of 1 MB, whatever the number of holders */
    CHECK_EQ(rt_bin_refs(b), 101);
    int same = 0;
    for (int i = 0; i < 100; i++)
        same += atomic_load(&bin_seen[i]) == rt_bin_data(b);
    CHECK_EQ(same, 100);
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(pids[7], &info), 0);
    CHECK_EQ(info.bin_bytes, 1 << 20); /* held bytes count toward the holder's GC trigger */
    for (int i = 0; i < 100; i++)
        rt_exit_signal(pids[i], RT_REASON_KILL);
    CHECK(wait_alive(0));
    CHECK_EQ(rt_bin_refs(b), 1); /* every holder's heap let go of it */
    rt_bin_release(b);
    rt_bin_totals(&count1, &bytes1);
    CHECK_EQ(count1, count0);
}

/*
** The inline heap and the heap API around it, exercised from inside an actor (the API
** acts on the calling actor): first-fit in 16-byte granules, reuse after rt_free,
** growth that moves from the inline region to the heap, inline objects as GC roots.
*/
typedef struct {
    char pad[40]; /* an odd state size: the inline region starts at the next 16 bytes */
    void *root;   /* a heap object reachable only through an inline RT_OBJ_SCAN object */
} inline_state_t;

static atomic_long inline_done;

static bool in_region(void *state, const void *p)
{
    const char *base = (const char *)state + 48;
    return (const char *)p >= base && (const char *)p < base + 64;
}

static int inline_init(rt_actor_t *self, void *state, void *arg)
{
    (void)arg;
    char *a = rt_alloc(self, 20, RT_OBJ_LEAF); /* 2 granules */
    CHECK(in_region(state, a));
    CHECK_EQ((uintptr_t)a % 16, 0);
    char *b = rt_alloc(self, 40, RT_OBJ_LEAF); /* 3 granules: only 2 left, so the heap */
    CHECK(b && !in_region(state, b));
    char *c = rt_strndup(self, "abc", 3);
    CHECK(in_region(state, c) && c == a + 32 && strcmp(c, "abc") == 0);
    rt_free(self, a);
    char *d = rt_alloc(self, 32, RT_OBJ_LEAF); /* first fit: where a was */
    CHECK(d == a);
    rt_free(self, d);
    /* Grows in place while it fits its granules, then moves out, keeping its contents. */
    c = rt_realloc(self, c, 16, RT_OBJ_LEAF);
    CHECK(in_region(state, c) && strcmp(c, "abc") == 0);
    c = rt_realloc(self, c, 100, RT_OBJ_LEAF);
    CHECK(c && !in_region(state, c) && strcmp(c, "abc") == 0 && c[99] == 0);
    uint32_t *arr = NULL;
    size_t cap = 0;
    for (uint32_t i = 0; i < 100; i++) {
        CHECK_EQ(rt_grow_on(self, &arr, &cap, i + 1, sizeof(*arr), 4, RT_OBJ_LEAF), 0);
        arr[i] = i;
    }
    CHECK(cap >= 100 && arr[0] == 0 && arr[99] == 99);
    void **holder = rt_alloc(self, 16, RT_OBJ_SCAN);
    CHECK(in_region(state, holder));
    holder[0] = rt_alloc(self, 200, RT_OBJ_LEAF);
    memset(holder[0], 'r', 200);
    ((inline_state_t *)state)->root = holder;
    rt_gc(self);
    CHECK(((char *)holder[0])[199] == 'r'); /* kept: the inline object is a root */
    rt_charge(self, 5000);
    atomic_store(&inline_done, 1);
    return 0;
}

static void inline_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)state;
    (void)m;
    rt_charge(self, -5000);
    atomic_store(&inline_done, 2);
}

static void test_inline_heap(void)
{
    static const rt_actor_type_t inline_type = {.name = "inline",
                                                .state_size = 40,
                                                .init = inline_init,
                                                .handle = inline_handle,
                                                .heap_inline = 64};
    static const rt_actor_type_t bad_type = {
        .name = "bad", .handle = inline_handle, .heap_inline = 24};
    CHECK_EQ(rt_spawn(&bad_type, NULL, NULL), RT_EINVAL); /* not a multiple of 16 */
    atomic_store(&inline_done, 0);
    rt_pid_t pid;
    CHECK_EQ(rt_spawn(&inline_type, NULL, &pid), 0);
    CHECK_EQ(atomic_load(&inline_done), 1);
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(pid, &info), 0);
    CHECK_EQ(info.ext_bytes, 5000);
    CHECK(info.state_bytes >= 48 + 64); /* the inline region is part of the actor's block */
    CHECK(info.heap_bytes > 0);
    rt_send(pid, RT_MSG_USER, NULL, 0);
    CHECK(wait_at_least(&inline_done, 2));
    CHECK_EQ(rt_actor_info(pid, &info), 0);
    CHECK_EQ(info.ext_bytes, 0);
    rt_exit_signal(pid, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

int main(void)
{
    test_start(2);
    RUN(test_shared_binaries);
    RUN(test_spawn_send);
    RUN(test_forward_keeps_the_sender);
    RUN(test_dead_letters);
    RUN(test_registry);
    RUN(test_links);
    RUN(test_monitors);
    RUN(test_heap_limit);
    RUN(test_link_cascade);
    RUN(test_spawn_options);
    RUN(test_init_failure);
    RUN(test_inline_heap);
    RUN(test_dead_letter_hook);
    rt_shutdown();
    return CHECK_SUMMARY();
}

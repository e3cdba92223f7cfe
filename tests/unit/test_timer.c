/* Timers: accuracy, cancellation, 100,000 at once, from inside and outside actors. */
#include <stdlib.h>

#include "rt_test.h"

enum {
    MSG_FIRE = RT_MSG_USER,
    MSG_ARM,
    MSG_ARM_MANY,
    MSG_ARM_CANCEL,
    MSG_ARM_TAG,
    MSG_TAGGED,
    MSG_HOLD,
    MSG_SYNC
};

static atomic_long tagged_fired, tagged_wrong;
static atomic_long held, let_go, synced;

static atomic_long fired;
static atomic_long late_sum_ms, late_max_ms, early, wrong_sender;

typedef struct {
    uint64_t armed_ms;
    uint64_t delay_ms;
    bool armed_by_self;
} fire_t;

static void timer_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    switch (m->tag) {
    case MSG_FIRE: {
        fire_t *f = (fire_t *)(void *)m->data;
        if (f->armed_by_self && m->from != rt_self(self))
            atomic_fetch_add(&wrong_sender, 1); /* a timer's message comes from who armed it */
        long late = (long)(test_now_ms() - f->armed_ms) - (long)f->delay_ms;
        if (late < 0)
            atomic_fetch_add(&early, 1);
        atomic_fetch_add(&late_sum_ms, late);
        long mx = atomic_load(&late_max_ms);
        while (late > mx && !atomic_compare_exchange_weak(&late_max_ms, &mx, late))
            ;
        atomic_fetch_add(&fired, 1);
        break;
    }
    case MSG_ARM: {
        uint64_t delay = *(uint64_t *)(void *)m->data;
        rt_msg_t *f = rt_msg_new(MSG_FIRE, sizeof(fire_t));
        *(fire_t *)(void *)f->data = (fire_t){test_now_ms(), delay, true};
        rt_send_after(delay, rt_self(self), f, NULL);
        break;
    }
    case MSG_ARM_MANY: {
        long n = *(long *)(void *)m->data;
        unsigned seed = 42;
        for (long i = 0; i < n; i++) {
            uint64_t delay = 1 + (uint64_t)(rand_r(&seed) % 500);
            rt_msg_t *f = rt_msg_new(MSG_FIRE, sizeof(fire_t));
            *(fire_t *)(void *)f->data = (fire_t){test_now_ms(), delay, true};
            rt_send_after(delay, rt_self(self), f, NULL);
        }
        break;
    }
    case MSG_ARM_TAG: {
        rt_ref_t cancel_me;
        rt_send_after_tag(20, rt_self(self), MSG_TAGGED, NULL);
        rt_send_after_tag(20, rt_self(self), MSG_TAGGED, &cancel_me);
        if (rt_cancel_timer(cancel_me) != 0)
            atomic_fetch_add(&tagged_wrong, 1);
        break;
    }
    case MSG_TAGGED:
        if (m->len != 0 || m->from != rt_self(self))
            atomic_fetch_add(&tagged_wrong, 1);
        atomic_fetch_add(&tagged_fired, 1);
        break;
    case MSG_HOLD:
        /* Keeps this scheduler in a turn, where it fires no timer, until the test says. */
        atomic_fetch_add(&held, 1);
        while (!atomic_load(&let_go))
            test_sleep_ms(1);
        break;
    case MSG_SYNC:
        atomic_fetch_add(&synced, 1);
        break;
    case MSG_ARM_CANCEL: {
        long n = *(long *)(void *)m->data;
        for (long i = 0; i < n; i++) {
            rt_ref_t ref;
            rt_msg_t *f = rt_msg_new(MSG_FIRE, sizeof(fire_t));
            *(fire_t *)(void *)f->data = (fire_t){test_now_ms(), 50, true};
            rt_send_after(50 + (uint64_t)(i % 100), rt_self(self), f, &ref);
            if (rt_cancel_timer(ref) != 0)
                atomic_fetch_add(&early, 1000000);
        }
        break;
    }
    }
}

static const rt_actor_type_t timer_type = {
    .name = "timer", .state_size = 8, .handle = timer_handle};

static void reset(void)
{
    atomic_store(&fired, 0);
    atomic_store(&late_sum_ms, 0);
    atomic_store(&late_max_ms, 0);
    atomic_store(&early, 0);
}

/*
** Returns once every timer armed so far has left its heap (fired, or dropped if cancelled)
** and p has handled every message a firing sent it: a fired timer is sent before its entry
** is released, so the MSG_SYNC sent after that comes behind it in p's mailbox. What p has
** not counted by then never came.
*/
static bool settle(rt_pid_t p)
{
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    rt_stats_t st;
    for (rt_stats(&st); st.timers_pending; rt_stats(&st)) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
    long want = atomic_load(&synced) + 1;
    return rt_send(p, MSG_SYNC, NULL, 0) == 0 && wait_at_least(&synced, want);
}

/*
** Holds both schedulers (test_start(2)) in a turn each: timers fire only between turns, so
** until release_schedulers nothing armed can fire, however slowly this thread runs
** (valgrind). Two holds running at once are on two schedulers: one runs a turn at a time.
*/
static void hold_schedulers(rt_pid_t holders[2])
{
    atomic_store(&held, 0);
    atomic_store(&let_go, 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(rt_spawn(&timer_type, NULL, &holders[i]), 0);
        rt_send(holders[i], MSG_HOLD, NULL, 0);
    }
    CHECK(wait_at_least(&held, 2));
}

static void release_schedulers(rt_pid_t holders[2])
{
    atomic_store(&let_go, 1);
    for (int i = 0; i < 2; i++)
        rt_exit_signal(holders[i], RT_REASON_KILL);
}

static void test_accuracy(void)
{
    reset();
    rt_pid_t p;
    rt_spawn(&timer_type, NULL, &p);
    const uint64_t delays[] = {1, 5, 10, 20, 50, 100, 200, 300};
    int n = (int)(sizeof(delays) / sizeof(delays[0]));
    for (int i = 0; i < n; i++)
        rt_send(p, MSG_ARM, &delays[i], sizeof(delays[i]));
    CHECK(wait_at_least(&fired, n));
    fprintf(stderr, "  accuracy: %d timers, mean lateness %.1f ms, max %ld ms\n", n,
            (double)atomic_load(&late_sum_ms) / n, atomic_load(&late_max_ms));
    CHECK_EQ(atomic_load(&early), 0); /* never before its time */
    CHECK_EQ(atomic_load(&wrong_sender), 0);
    /* Lateness is printed, not bounded: a timer fires when its loop next gets a core, which
       only the machine's load decides. Never early is what timers guarantee. */
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_cancel(void)
{
    reset();
    rt_pid_t p, holders[2];
    rt_spawn(&timer_type, NULL, &p);
    hold_schedulers(holders); /* the cancel below cannot lose a race with the firing */
    rt_ref_t ref;
    rt_msg_t *f = rt_msg_new(MSG_FIRE, sizeof(fire_t));
    *(fire_t *)(void *)f->data = (fire_t){test_now_ms(), 30, false};
    CHECK_EQ(rt_send_after(30, p, f, &ref), 0); /* from outside any actor */
    CHECK_EQ(rt_cancel_timer(ref), 0);
    CHECK_EQ(rt_cancel_timer(ref), RT_ENOTFOUND); /* only once */
    rt_ref_t ref2;
    rt_msg_t *g = rt_msg_new(MSG_FIRE, sizeof(fire_t));
    *(fire_t *)(void *)g->data = (fire_t){test_now_ms(), 10, false};
    CHECK_EQ(rt_send_after(10, p, g, &ref2), 0);
    release_schedulers(holders);
    CHECK(wait_at_least(&fired, 1));
    CHECK(settle(p));
    CHECK_EQ(atomic_load(&fired), 1);              /* the cancelled one never came */
    CHECK_EQ(rt_cancel_timer(ref2), RT_ENOTFOUND); /* too late: it fired */
    CHECK_EQ(rt_cancel_timer(0), RT_ENOTFOUND);

    /* Many armed and cancelled at once: nothing fires and the heaps empty out. */
    long n = check_scale(100000);
    rt_send(p, MSG_ARM_CANCEL, &n, sizeof(n));
    CHECK(settle(p)); /* every cancelled timer was dropped */
    CHECK_EQ(atomic_load(&fired), 1);
    CHECK_EQ(atomic_load(&early), 0);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_hundred_thousand(void)
{
    reset();
    rt_pid_t p;
    rt_spawn(&timer_type, NULL, &p);
    long n = check_scale(100000);
    long rss0 = rss_bytes();
    rt_send(p, MSG_ARM_MANY, &n, sizeof(n));
    rt_stats_t st;
    uint64_t end = test_now_ms() + 2000;
    long peak_pending = 0;
    while (atomic_load(&fired) < n && test_now_ms() < end) {
        rt_stats(&st);
        if ((long)st.timers_pending > peak_pending)
            peak_pending = (long)st.timers_pending;
        test_sleep_ms(5);
    }
    long rss1 = rss_bytes();
    CHECK(wait_at_least(&fired, n));
    CHECK_EQ(atomic_load(&early), 0);
    rt_stats(&st);
    CHECK_EQ(st.timers_pending, 0);
    fprintf(stderr, "  %ld timers: peak pending %ld, max lateness %ld ms, RSS +%ld KB\n", n,
            peak_pending, atomic_load(&late_max_ms), (rss1 - rss0) / 1024);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_timer_to_dead_actor(void)
{
    reset();
    rt_pid_t p;
    rt_spawn(&timer_type, NULL, &p);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
    rt_stats_t before, after;
    rt_stats(&before);
    rt_msg_t *f = rt_msg_new(MSG_FIRE, sizeof(fire_t));
    CHECK_EQ(rt_send_after(5, p, f, NULL), 0);
    /* Its entry is released after the send that counts the dead letter. */
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        test_sleep_ms(1);
        rt_stats(&after);
    } while (after.timers_pending && test_now_ms() < end);
    CHECK_EQ(after.dead_letters - before.dead_letters, 1);
    CHECK_EQ(after.timers_pending, 0);
}

/* A tag-only timer: no envelope while pending, the tag and sender when it fires. */
static void test_tag_timer(void)
{
    rt_pid_t p;
    rt_spawn(&timer_type, NULL, &p);
    rt_send(p, MSG_ARM_TAG, NULL, 0);
    CHECK(wait_at_least(&tagged_fired, 1));
    CHECK(settle(p));
    CHECK_EQ(atomic_load(&tagged_fired), 1); /* the cancelled one never came */
    CHECK_EQ(atomic_load(&tagged_wrong), 0);
    rt_exit_signal(p, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

int main(void)
{
    test_start(2);
    RUN(test_accuracy);
    RUN(test_cancel);
    RUN(test_hundred_thousand);
    RUN(test_timer_to_dead_actor);
    RUN(test_tag_timer);
    rt_shutdown();
    return CHECK_SUMMARY();
}

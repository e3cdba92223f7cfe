/* Supervisors: one_for_one, one_for_all, restart types, intensity, shutdown. */
#include "rt_test.h"

enum { MSG_DIE = RT_MSG_USER, MSG_WATCH };

static atomic_long starts;

static int worker_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_fetch_add(&starts, 1);
    return 0;
}

static void worker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_DIE)
        rt_exit(self, *(rt_reason_t *)(void *)m->data);
}

static const rt_actor_type_t worker_type = {
    .name = "worker", .state_size = 8, .init = worker_init, .handle = worker_handle};

/* Watches the supervisor and records how it went down. */
static atomic_long watcher_downs;
static atomic_int watcher_reason;

static void watcher_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == MSG_WATCH) {
        rt_monitor(self, *(rt_pid_t *)(void *)m->data, NULL);
    } else if (m->tag == RT_MSG_DOWN) {
        atomic_store(&watcher_reason, ((rt_down_msg_t *)(void *)m->data)->reason);
        atomic_fetch_add(&watcher_downs, 1);
    }
}

static const rt_actor_type_t watcher_type = {
    .name = "watcher", .state_size = 8, .handle = watcher_handle};

static void kill_with(const char *name, rt_reason_t r)
{
    rt_send(rt_whereis(name), MSG_DIE, &r, sizeof(r));
}

/* Waits until name is registered to a pid other than old. */
static rt_pid_t wait_new_pid(const char *name, rt_pid_t old)
{
    uint64_t end = test_now_ms() + 5000;
    while (test_now_ms() < end) {
        rt_pid_t p = rt_whereis(name);
        if (p && p != old)
            return p;
        test_sleep_ms(1);
    }
    return 0;
}

static bool wait_unregistered(const char *name)
{
    uint64_t end = test_now_ms() + 5000;
    while (rt_whereis(name)) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
    return true;
}

static const rt_child_spec_t children[] = {
    {.name = "w.perm", .type = &worker_type, .restart = RT_PERMANENT},
    {.name = "w.trans", .type = &worker_type, .restart = RT_TRANSIENT},
    {.name = "w.temp", .type = &worker_type, .restart = RT_TEMPORARY},
};

static rt_pid_t start_sup(rt_strategy_t strategy, unsigned intensity, rt_pid_t *watcher)
{
    static rt_sup_spec_t spec;
    spec = (rt_sup_spec_t){.strategy = strategy, .intensity = intensity, .period_ms = 5000,
                           .nchildren = 3, .children = children};
    rt_pid_t sup;
    CHECK_EQ(rt_spawn(&rt_supervisor_type, &spec, &sup), 0);
    rt_spawn(&watcher_type, NULL, watcher);
    rt_send(*watcher, MSG_WATCH, &sup, sizeof(sup));
    return sup;
}

static void test_one_for_one(void)
{
    atomic_store(&starts, 0);
    atomic_store(&watcher_downs, 0);
    rt_pid_t w;
    rt_pid_t sup = start_sup(RT_ONE_FOR_ONE, 10, &w);
    CHECK_EQ(atomic_load(&starts), 3);
    rt_pid_t perm = rt_whereis("w.perm"), trans = rt_whereis("w.trans"),
             temp = rt_whereis("w.temp");
    CHECK(perm && trans && temp);

    /* permanent: restarted after any exit, the others untouched */
    kill_with("w.perm", RT_REASON_NORMAL);
    rt_pid_t perm2 = wait_new_pid("w.perm", perm);
    CHECK(perm2 != 0);
    CHECK_EQ(rt_whereis("w.trans"), trans);
    CHECK_EQ(rt_whereis("w.temp"), temp);

    /* transient: restarted after an abnormal exit only */
    kill_with("w.trans", RT_REASON_USER);
    rt_pid_t trans2 = wait_new_pid("w.trans", trans);
    CHECK(trans2 != 0);
    kill_with("w.trans", RT_REASON_NORMAL);
    CHECK(wait_unregistered("w.trans"));

    /* temporary: never restarted */
    kill_with("w.temp", RT_REASON_USER);
    CHECK(wait_unregistered("w.temp"));
    test_sleep_ms(50); /* time for a (wrong) restart to show */
    CHECK_EQ(rt_whereis("w.temp"), 0);
    CHECK_EQ(rt_whereis("w.trans"), 0);
    CHECK_EQ(atomic_load(&starts), 5);

    /* Stopping the supervisor stops what is left. */
    rt_exit_signal(sup, RT_REASON_SHUTDOWN);
    CHECK(wait_at_least(&watcher_downs, 1, 5000));
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(wait_alive(1, 5000)); /* only the watcher */
    CHECK_EQ(rt_whereis("w.perm"), 0);
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
}

static void test_one_for_all(void)
{
    atomic_store(&starts, 0);
    atomic_store(&watcher_downs, 0);
    rt_pid_t w;
    rt_pid_t sup = start_sup(RT_ONE_FOR_ALL, 10, &w);
    rt_pid_t perm = rt_whereis("w.perm"), trans = rt_whereis("w.trans");
    kill_with("w.trans", RT_REASON_USER);
    rt_pid_t perm2 = wait_new_pid("w.perm", perm);
    rt_pid_t trans2 = wait_new_pid("w.trans", trans);
    CHECK(perm2 != 0 && trans2 != 0);
    /* As in OTP, the temporary child is stopped with the others but not started again. */
    CHECK(wait_at_least(&starts, 5, 5000));
    test_sleep_ms(20);
    CHECK_EQ(atomic_load(&starts), 5);
    CHECK_EQ(rt_whereis("w.temp"), 0);
    rt_exit_signal(sup, RT_REASON_SHUTDOWN);
    CHECK(wait_at_least(&watcher_downs, 1, 5000));
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
}

static void test_intensity(void)
{
    atomic_store(&starts, 0);
    atomic_store(&watcher_downs, 0);
    rt_pid_t w;
    start_sup(RT_ONE_FOR_ONE, 3, &w);
    rt_pid_t cur = rt_whereis("w.perm");
    for (int i = 0; i < 3; i++) {
        kill_with("w.perm", RT_REASON_USER);
        cur = wait_new_pid("w.perm", cur);
        CHECK(cur != 0);
    }
    CHECK_EQ(atomic_load(&watcher_downs), 0);
    /* The fourth restart within the period is one too many: the supervisor gives up. */
    kill_with("w.perm", RT_REASON_USER);
    CHECK(wait_at_least(&watcher_downs, 1, 5000));
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(wait_alive(1, 5000));
    CHECK_EQ(rt_whereis("w.perm"), 0);
    CHECK_EQ(rt_whereis("w.trans"), 0);
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
}

static void test_bad_spec(void)
{
    rt_pid_t sup = 0;
    rt_sup_spec_t empty = {.strategy = RT_ONE_FOR_ONE, .intensity = 1, .period_ms = 1000};
    CHECK_EQ(rt_spawn(&rt_supervisor_type, &empty, &sup), RT_EINVAL);
    CHECK_EQ(rt_spawn(&rt_supervisor_type, NULL, &sup), RT_EINVAL);
    CHECK(wait_alive(0, 5000));
}

int main(void)
{
    test_start(2);
    RUN(test_one_for_one);
    RUN(test_one_for_all);
    RUN(test_intensity);
    RUN(test_bad_spec);
    rt_shutdown();
    return CHECK_SUMMARY();
}

/*
** Supervisors: one_for_one, one_for_all, restart types, intensity, shutdown; start
** functions, per-child counts and events, children added and stopped from outside,
** ordered stops with a kill for a child that will not stop, escalation; reason words.
*/
#include <pthread.h>

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
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
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
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
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
    CHECK(wait_at_least(&watcher_downs, 1));
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(wait_alive(1)); /* only the watcher */
    CHECK_EQ(rt_whereis("w.perm"), 0);
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0));
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
    CHECK(wait_at_least(&starts, 5));
    test_sleep_ms(20);
    CHECK_EQ(atomic_load(&starts), 5);
    CHECK_EQ(rt_whereis("w.temp"), 0);
    rt_exit_signal(sup, RT_REASON_SHUTDOWN);
    CHECK(wait_at_least(&watcher_downs, 1));
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0));
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
    CHECK(wait_at_least(&watcher_downs, 1));
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(wait_alive(1));
    CHECK_EQ(rt_whereis("w.perm"), 0);
    CHECK_EQ(rt_whereis("w.trans"), 0);
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

static void test_bad_spec(void)
{
    rt_pid_t sup = 0;
    rt_child_spec_t none = {.name = "w.none"};
    rt_sup_spec_t bad = {.strategy = RT_ONE_FOR_ONE, .intensity = 1, .nchildren = 1};
    CHECK_EQ(rt_spawn(&rt_supervisor_type, &bad, &sup), RT_EINVAL); /* children missing */
    CHECK_EQ(rt_spawn(&rt_supervisor_type, NULL, &sup), RT_EINVAL);
    CHECK_EQ(rt_supervisor_start_child(0, &none, NULL), RT_EINVAL); /* neither type nor start */
    rt_sup_info_t info;
    CHECK_EQ(rt_supervisor_info(0, &info, NULL, 0), RT_ENOPROC);
    CHECK(wait_alive(0));
}

/* ---- Events, counts, start functions, dynamic children, ordered stops ---- */

/* The events a supervisor reported, kept as text ("restarted w.perm killed 1"). */
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static char ev_log[4096];
static atomic_long ev_count;

static const char *const ev_names[] = {"restarted", "exited", "start_failed", "gave_up", "stopped"};

static void on_event(const rt_sup_event_t *e, void *ud)
{
    (void)ud;
    pthread_mutex_lock(&ev_lock);
    size_t n = strlen(ev_log);
    snprintf(ev_log + n, sizeof(ev_log) - n, "%s %s %s %llu;", ev_names[e->kind], e->child,
             rt_reason_name(e->reason), (unsigned long long)e->restarts);
    pthread_mutex_unlock(&ev_lock);
    atomic_fetch_add(&ev_count, 1);
}

static bool events_have(const char *what)
{
    pthread_mutex_lock(&ev_lock);
    bool has = strstr(ev_log, what) != NULL;
    pthread_mutex_unlock(&ev_lock);
    return has;
}

static void events_reset(void)
{
    pthread_mutex_lock(&ev_lock);
    ev_log[0] = 0;
    pthread_mutex_unlock(&ev_lock);
    atomic_store(&ev_count, 0);
}

/* A start function: what a child that must do more than spawn (bind, rebuild) looks like. */
static atomic_long started_by_fn;

static int start_fn(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    atomic_fetch_add(&started_by_fn, 1);
    CHECK(opts->link && opts->name && strcmp(opts->name, "w.fn") == 0);
    CHECK_EQ(opts->max_heap, (size_t)1 << 20);
    return rt_spawn_opt(&worker_type, arg, opts, out);
}

static bool child_info(rt_pid_t sup, const char *name, rt_sup_child_info_t *out)
{
    rt_sup_info_t info;
    rt_sup_child_info_t kids[8];
    if (rt_supervisor_info(sup, &info, kids, 8) != 0)
        return false;
    for (size_t i = 0; i < info.nchildren && i < 8; i++) {
        if (strcmp(kids[i].name, name) == 0) {
            *out = kids[i];
            return true;
        }
    }
    return false;
}

static void test_counts_and_events(void)
{
    events_reset();
    atomic_store(&starts, 0);
    static const rt_child_spec_t kids[] = {
        {.name = "w.fn", .start = start_fn, .restart = RT_PERMANENT, .max_heap = 1 << 20},
        {.name = "w.temp", .type = &worker_type, .restart = RT_TEMPORARY},
    };
    static const rt_sup_spec_t spec = {.strategy = RT_ONE_FOR_ONE,
                                       .intensity = 10,
                                       .period_ms = 5000,
                                       .nchildren = 2,
                                       .children = kids,
                                       .on_event = on_event};
    rt_pid_t sup;
    CHECK_EQ(rt_spawn_opt(&rt_supervisor_type, (void *)&spec,
                          &(rt_spawn_opts_t){.name = "sup.counts"}, &sup),
             0);
    rt_pid_t fn = rt_whereis("w.fn");
    CHECK(fn && atomic_load(&started_by_fn) >= 1);
    rt_actor_info_t ai;
    CHECK_EQ(rt_actor_info(fn, &ai), 0);

    /* Each restart is counted per child, with its reason, and reported. */
    rt_exit_signal(fn, RT_REASON_KILL);
    rt_pid_t fn2 = wait_new_pid("w.fn", fn);
    CHECK(fn2 != 0);
    rt_reason_t crash;
    CHECK_EQ(rt_reason_parse("crash", &crash), 0);
    rt_exit_signal(fn2, crash);
    rt_pid_t fn3 = wait_new_pid("w.fn", fn2);
    CHECK(fn3 != 0);
    rt_sup_child_info_t ci;
    CHECK(child_info(sup, "w.fn", &ci));
    CHECK_EQ(ci.pid, fn3);
    CHECK_EQ(ci.restarts, 2);
    CHECK_EQ(ci.last_reason, crash);
    CHECK(ci.last_exit_ms > 0 && !ci.supervisor);
    CHECK(events_have("restarted w.fn killed 1;restarted w.fn crash 2;"));
    rt_sup_info_t info;
    CHECK_EQ(rt_supervisor_info(sup, &info, NULL, 0), 0);
    CHECK_EQ(info.restarts, 2);
    CHECK_EQ(info.nchildren, 2);
    CHECK_EQ(info.intensity, 10);

    /* A temporary child that ends stays down, reported as exited. */
    rt_exit_signal(rt_whereis("w.temp"), crash);
    CHECK(wait_unregistered("w.temp"));
    CHECK(wait_at_least(&ev_count, 3));
    CHECK(events_have("exited w.temp crash 0;"));
    CHECK(child_info(sup, "w.temp", &ci));
    CHECK_EQ(ci.pid, 0);

    /* Not a supervisor, or not there at all. */
    CHECK_EQ(rt_supervisor_info(fn3, &info, NULL, 0), RT_EINVAL);
    rt_exit_signal(sup, RT_REASON_SHUTDOWN);
    CHECK(wait_alive(0));
    CHECK_EQ(rt_supervisor_info(sup, &info, NULL, 0), RT_ENOPROC);
    CHECK(events_have("stopped  shutdown 0;"));
}

/* Traps exits and ignores shutdown: only the stop's kill ends it. */
static int stubborn_init(rt_actor_t *self, void *state, void *arg)
{
    rt_trap_exit(self, true);
    return 0;
}

static void stubborn_handle(rt_actor_t *self, void *state, rt_msg_t *m) {}

static const rt_actor_type_t stubborn_type = {
    .name = "stubborn", .state_size = 8, .init = stubborn_init, .handle = stubborn_handle};

static void test_dynamic_children_and_stops(void)
{
    events_reset();
    atomic_store(&watcher_downs, 0);
    static const rt_sup_spec_t empty = {
        .strategy = RT_ONE_FOR_ONE, .intensity = 5, .period_ms = 5000, .on_event = on_event};
    rt_pid_t sup, w;
    CHECK_EQ(rt_spawn(&rt_supervisor_type, (void *)&empty, &sup), 0);
    rt_spawn(&watcher_type, NULL, &w);
    rt_send(w, MSG_WATCH, &sup, sizeof(sup));

    /* Children added from outside the runtime, in order; a failed start is not added. */
    static const rt_child_spec_t first = {.name = "d.first", .type = &worker_type};
    static const rt_child_spec_t stubborn = {
        .name = "d.stubborn", .type = &stubborn_type, .shutdown_ms = 50};
    static const rt_child_spec_t taken = {.name = "d.first", .type = &worker_type};
    rt_pid_t a, b;
    CHECK_EQ(rt_supervisor_start_child(sup, &first, &a), 0);
    CHECK_EQ(rt_supervisor_start_child(sup, &stubborn, &b), 0);
    CHECK_EQ(rt_supervisor_start_child(sup, &taken, NULL), RT_EEXIST);
    CHECK_EQ(rt_whereis("d.first"), a);
    rt_sup_info_t info;
    rt_sup_child_info_t kids[4];
    CHECK_EQ(rt_supervisor_info(sup, &info, kids, 4), 0);
    CHECK_EQ(info.nchildren, 2);
    CHECK(strcmp(kids[0].name, "d.first") == 0 && strcmp(kids[1].name, "d.stubborn") == 0);

    /* terminate_child stops a permanent child for good. */
    CHECK_EQ(rt_supervisor_terminate_child(sup, a), 0);
    CHECK_EQ(rt_wait_exit(a, 5000), 0);
    CHECK(wait_at_least(&ev_count, 1));
    test_sleep_ms(20); /* time for a (wrong) restart to show */
    CHECK_EQ(rt_whereis("d.first"), 0);
    CHECK(events_have("exited d.first shutdown 0;"));

    /* A nested supervisor is listed as one. */
    static const rt_sup_spec_t inner = {
        .strategy = RT_ONE_FOR_ONE, .intensity = 1, .period_ms = 5000};
    static const rt_child_spec_t nested = {
        .name = "d.inner", .type = &rt_supervisor_type, .arg = (void *)&inner};
    CHECK_EQ(rt_supervisor_start_child(sup, &nested, NULL), 0);
    CHECK_EQ(rt_supervisor_info(sup, &info, kids, 4), 0);
    CHECK(kids[2].supervisor && kids[2].pid == rt_whereis("d.inner"));

    /* A stop goes child by child from the back; the one that ignores shutdown is killed
       once its 50 ms pass, and only then does the supervisor exit. */
    uint64_t t0 = test_now_ms();
    rt_exit_signal(sup, RT_REASON_SHUTDOWN);
    CHECK(wait_at_least(&watcher_downs, 1));
    CHECK(test_now_ms() - t0 >= 50);
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(!rt_alive(b));
    CHECK_EQ(rt_supervisor_start_child(sup, &first, NULL), RT_ENOPROC);
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* A child supervisor that gives up is restarted by its parent, which has no intensity to
   spare here: it gives up in turn and the whole tree goes. */
static void test_escalation(void)
{
    events_reset();
    atomic_store(&watcher_downs, 0);
    static const rt_child_spec_t leaf[] = {{.name = "e.leaf", .type = &worker_type}};
    static const rt_sup_spec_t group = {.strategy = RT_ONE_FOR_ONE,
                                        .intensity = 1,
                                        .period_ms = 5000,
                                        .nchildren = 1,
                                        .children = leaf,
                                        .on_event = on_event};
    static const rt_child_spec_t groups[] = {
        {.name = "e.group", .type = &rt_supervisor_type, .arg = (void *)&group}};
    static const rt_sup_spec_t top = {.strategy = RT_ONE_FOR_ONE,
                                      .intensity = 0,
                                      .period_ms = 1000,
                                      .nchildren = 1,
                                      .children = groups,
                                      .on_event = on_event};
    rt_pid_t sup, w;
    CHECK_EQ(rt_spawn(&rt_supervisor_type, (void *)&top, &sup), 0);
    rt_spawn(&watcher_type, NULL, &w);
    rt_send(w, MSG_WATCH, &sup, sizeof(sup));
    rt_pid_t cur = rt_whereis("e.leaf");
    kill_with("e.leaf", RT_REASON_USER);
    cur = wait_new_pid("e.leaf", cur);
    CHECK(cur != 0);
    kill_with("e.leaf", RT_REASON_USER);
    CHECK(wait_at_least(&watcher_downs, 1));
    CHECK_EQ(atomic_load(&watcher_reason), RT_REASON_SHUTDOWN);
    CHECK(events_have("gave_up e.leaf user 1;"));
    CHECK(events_have("gave_up e.group shutdown 0;"));
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* Words become reasons of their own, and names come back. */
static void test_reason_words(void)
{
    rt_reason_t r, again, k;
    CHECK_EQ(rt_reason_parse("kill", &k), 0);
    CHECK_EQ(k, RT_REASON_KILL);
    CHECK_EQ(rt_reason_parse("shutdown", &k), 0);
    CHECK_EQ(k, RT_REASON_SHUTDOWN);
    CHECK_EQ(rt_reason_parse("operator_test", &r), 0);
    CHECK_EQ(rt_reason_parse("operator_test", &again), 0);
    CHECK_EQ(r, again);
    CHECK(r >= RT_REASON_USER && strcmp(rt_reason_name(r), "operator_test") == 0);
    CHECK_EQ(rt_reason_parse("", &r), RT_EINVAL);
    CHECK_EQ(rt_reason_parse("9lives", &r), RT_EINVAL);
    CHECK_EQ(rt_reason_parse("bad word", &r), RT_EINVAL);
    CHECK_EQ(rt_reason_parse("a_word_that_is_far_too_long_for_it", &r), RT_EINVAL);
    CHECK(strcmp(rt_reason_name(RT_REASON_USER + 5), "user") == 0);
}

int main(void)
{
    test_start(2);
    RUN(test_one_for_one);
    RUN(test_one_for_all);
    RUN(test_intensity);
    RUN(test_bad_spec);
    RUN(test_counts_and_events);
    RUN(test_dynamic_children_and_stops);
    RUN(test_escalation);
    RUN(test_reason_words);
    rt_shutdown();
    return CHECK_SUMMARY();
}

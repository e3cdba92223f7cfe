/*
** The rule engine's lifecycle (rule_engine.h): start, stop and reload, the swap of the
** current rule set, and the locks that guard it.
*/
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "group.h"
#include "rule_internal.h"

rt_rules_engine_t rt__rules = {.admin = PTHREAD_MUTEX_INITIALIZER};

/*
** What this thread holds of the engine's locks, for the asserts of debug builds. Neither
** lock can say who holds it; both are taken only through the functions below.
*/
#ifndef NDEBUG
static _Thread_local int holds_read, holds_write, holds_admin;
#define HOLD(x, d) ((x) += (d))
#else
#define HOLD(x, d) ((void)0)
#endif

static pthread_once_t lock_once = PTHREAD_ONCE_INIT;

static void lock_init(void)
{
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&rt__rules.lock, &a);
    pthread_rwlockattr_destroy(&a);
}

void rt__rules_admin_lock(void)
{
    pthread_once(&lock_once, lock_init);
    RT_ASSERT(!rt__rules_holds_admin());
    pthread_mutex_lock(&rt__rules.admin);
    HOLD(holds_admin, 1);
}

void rt__rules_admin_unlock(void)
{
    RT_ASSERT(rt__rules_holds_admin());
    HOLD(holds_admin, -1);
    pthread_mutex_unlock(&rt__rules.admin);
}

void rt__rules_lock_read(void)
{
    /* Once per thread: behind a waiting writer a second read lock would never come. */
    RT_ASSERT(!rt__rules_holds_read() && !rt__rules_holds_write());
    pthread_rwlock_rdlock(&rt__rules.lock);
    HOLD(holds_read, 1);
}

void rt__rules_lock_write(void)
{
    RT_ASSERT(!rt__rules_holds_read() && !rt__rules_holds_write());
    pthread_rwlock_wrlock(&rt__rules.lock);
    HOLD(holds_write, 1);
}

void rt__rules_unlock(void)
{
    RT_ASSERT(rt__rules_holds_read() != rt__rules_holds_write());
    HOLD(holds_read, -holds_read);
    HOLD(holds_write, -holds_write);
    pthread_rwlock_unlock(&rt__rules.lock);
}

#ifndef NDEBUG
bool rt__rules_holds_admin(void)
{
    return holds_admin > 0;
}

bool rt__rules_holds_read(void)
{
    return holds_read > 0;
}

bool rt__rules_holds_write(void)
{
    return holds_write > 0;
}
#endif

rt_rule_set_t *rt__rules_lock_current(void)
{
    if (!atomic_load_explicit(&rt__rules.running, memory_order_acquire))
        return NULL;
    rt__rules_lock_read();
    if (!rt__rules.cur) {
        rt__rules_unlock();
        return NULL;
    }
    return rt__rules.cur;
}

rt_rule_set_t *rt__rules_current(void)
{
    rt_rule_set_t *s = rt__rules_lock_current();
    if (!s)
        return NULL;
    rt__rule_set_retain(s);
    rt__rules_unlock();
    return s;
}

/*
** An operator's enable or disable (rt_rules_enable) outlives a reload that leaves the rule's
** file saying what it said before; when the file's own enabled changes, the file's new word
** wins and the operator's is dropped (someone edited the rule on purpose). A rule that
** cannot be enabled (a missing sink) stays disabled.
*/
static void apply_overrides(rt_rule_set_t *s)
{
    RT_ASSERT(rt__rules_holds_write() && rt__rules_holds_admin());
    for (uint32_t i = 0; i < s->nrules; i++) {
        rt_rule_t *r = &s->rules[i];
        rt_rule_metrics_t *m = r->m;
        int ov = atomic_load(&m->override);
        if ((m->installed && m->file_enabled != r->file_enabled) || (ov == 1 && r->missing_sink[0]))
            ov = -1;
        atomic_store(&m->override, ov);
        m->file_enabled = r->file_enabled;
        m->installed = true;
        if (ov >= 0)
            atomic_store(&r->enabled, ov == 1);
    }
}

/* Makes s the current set (the engine's reference passes to it) and retires the old one. */
static void install_set(rt_rule_set_t *s)
{
    RT_ASSERT(rt__rules_holds_admin());
    RT_ASSERT(s->nvms == rt__rules.nworkers);
    s->version = ++rt__rules.version;
    rt__rules_lock_write();
    apply_overrides(s);
    rt_rule_set_t *old = rt__rules.cur;
    rt__rules.cur = s;
    atomic_store(&rt__rules.wants, s->wants);
    rt__rules_unlock();
    rt__rule_set_release(old);
}

/*
** Stops the workers and, once they are gone, frees every set and their counters. Each
** worker hears its supervisor's stop after what was handed to it, and submits its
** last rows before it goes.
*/
static void stop_workers(void)
{
    RT_ASSERT(rt__rules_holds_admin());
    atomic_store(&rt__rules.running, false);
    rt__rules_lock_write();
    rt_rule_set_t *cur = rt__rules.cur;
    rt__rules.cur = NULL;
    atomic_store(&rt__rules.wants, 0);
    rt__rules_unlock();
    rt_group_stop(rt__rules.sup, RT_RULES_GROUP);
    bool all_gone = true;
    for (unsigned i = 0; i < rt__rules.nworkers; i++)
        all_gone &= !rt_alive(atomic_load(&rt__rules.workers[i].pid));
    rt__rule_set_release(cur);
    /*
    ** What is left is held by messages that never reached a worker (sent as it
    ** stopped); with every worker gone nothing can read them, so they go too. If
    ** a worker is somehow still alive, its sets are left rather than pulled away.
    */
    if (!all_gone)
        return;
    rt__rule_set_free_all();
    free(rt__rules.workers);
    rt__rules.workers = NULL;
    rt__rules.nworkers = 0;
}

/* The engine's settings from conf, before a start or a check builds a set with them. */
static void configure(const rt_conf_t *conf)
{
    RT_ASSERT(rt__rules_holds_admin() && !atomic_load(&rt__rules.running));
    rt__rules.nworkers = (unsigned)(conf->rule_workers > 0 ? conf->rule_workers : 1);
    rt__rules.memory = (size_t)conf->rule_memory;
    rt__rules.instructions = conf->rule_instructions;
    rt__rules.call_ms = conf->rule_call_ms;
    rt__rules.output_rows = conf->rule_output_rows;
    rt__rules.output_bytes = (size_t)conf->rule_output_bytes;
    rt__rules.flush_ms = conf->rule_flush_ms > 0 ? (uint64_t)conf->rule_flush_ms : 0;
    rt__rules.turn_us =
        conf->rule_turn_us > 0 ? (uint64_t)conf->rule_turn_us : RT_CONF_RULE_TURN_US;
    snprintf(rt__rules.dir, sizeof(rt__rules.dir), "%s", conf->rules_dir);
    rt__rules.version = 0;
}

int rt_rules_check(const rt_conf_t *conf, size_t *nrules, char *err, size_t errlen)
{
    rt__rules_admin_lock();
    int rc = RT_EEXIST;
    if (atomic_load(&rt__rules.running)) {
        snprintf(err, errlen, "the rule engine is running");
        goto out;
    }
    configure(conf);
    rt__rules.checking = conf;
    rt_rule_set_t *s;
    rc = rt__rule_set_build(rt__rules.dir, NULL, &s, err, errlen);
    rt__rules.checking = NULL;
    if (rc == 0) {
        *nrules = s->nrules;
        rt__rule_set_release(s);
    }
out:
    rt__rules_admin_unlock();
    return rc;
}

int rt_rules_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen)
{
    rt__rules_admin_lock();
    int rc = 0;
    if (atomic_load(&rt__rules.running)) {
        snprintf(err, errlen, "the rule engine is already running");
        rc = RT_EEXIST;
        goto out;
    }
    configure(conf);
    /* Cache-line aligned: each worker's counters sit on their own line. */
    size_t wbytes = rt__rules.nworkers * sizeof(rt_rule_worker_stats_t);
    rt__rules.workers = aligned_alloc(RT_CACHE_LINE, wbytes);
    if (!rt__rules.workers) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
        goto out;
    }
    memset(rt__rules.workers, 0, wbytes);
    rt_rule_set_t *s;
    if ((rc = rt__rule_set_build(rt__rules.dir, NULL, &s, err, errlen))) {
        free(rt__rules.workers);
        rt__rules.workers = NULL;
        goto out;
    }
    rt__rules.sup = sup;
    rt_pid_t group = 0;
    rc = rt_group_start(sup, RT_RULES_GROUP, RT_PERMANENT, &group);
    for (unsigned i = 0; rc == 0 && i < rt__rules.nworkers; i++) {
        char *name = rt__rules.workers[i].name;
        snprintf(name, sizeof(rt__rules.workers[i].name), "rule_worker:%u", i);
        /* A worker is charged for its Lua state, which rule_memory bounds (a rule past it
           fails, the worker goes on): the runtime's default per-actor limit must not kill
           it for what that cap allows. */
        rt_child_spec_t c = {.name = name,
                             .type = &rt__rule_worker_type,
                             .arg = (void *)(uintptr_t)i,
                             .restart = RT_PERMANENT,
                             .max_heap = (size_t)1 << 62,
                             .shutdown_ms = RT_RULES_STOP_WAIT_MS};
        rc = rt_supervisor_start_child(group, &c, NULL);
    }
    if (rc) {
        snprintf(err, errlen, "cannot start rule worker: %s", rt_strerror(rc));
        rt__rule_set_release(s);
        stop_workers();
        goto out;
    }
    install_set(s);
    atomic_store(&rt__rules.running, true);
out:
    rt__rules_admin_unlock();
    return rc;
}

void rt_rules_stop(void)
{
    rt__rules_admin_lock();
    if (rt__rules.workers)
        stop_workers();
    rt__rules_admin_unlock();
}

int rt_rules_reload(char *err, size_t errlen)
{
    rt__rules_admin_lock();
    int rc = RT_ESHUTDOWN;
    if (!atomic_load(&rt__rules.running)) {
        snprintf(err, errlen, "the rule engine is not running");
        goto out;
    }
    /* Only a thread holding admin replaces cur, so reading it here needs no lock. */
    rt_rule_set_t *s;
    if ((rc = rt__rule_set_build(rt__rules.dir, rt__rules.cur, &s, err, errlen)) == 0)
        install_set(s);
out:
    rt__rules_admin_unlock();
    return rc;
}

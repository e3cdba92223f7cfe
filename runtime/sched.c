/*
** Schedulers: one thread per core, each owning a libuv loop (timers, socket
** events, the doorbell) and a run queue of actors.
**
** Placement: an actor woken by a send on a scheduler thread goes into that
** scheduler's runnext slot (Go's runnext), so a chain of sends runs hot on one
** core without touching the shared queue; the previous runnext goes to the
** queue's tail. An actor that used its whole batch goes to the tail. Actors
** that own sockets are pinned to the loop that polls them and are only ever
** queued there. An idle scheduler steals half of a peer's unpinned queue;
** with nothing to steal it parks in uv_run until the doorbell (uv_async),
** a timer or a socket wakes it, so an idle runtime uses no CPU.
*/
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

rt_runtime_t *rt__rt;

#define RT_POLL_NS 100000   /* a busy scheduler polls its loop (sockets, timers) this often */
#define RT_RUNNEXT_MAX 64   /* runnext picks in a row before the queue gets a turn */

/* ---- Run queues ---- */

static void q_append(rt_sched_t *s, rt_actor_t *a)
{
    a->runq_next = NULL;
    if (s->qtail)
        s->qtail->runq_next = a;
    else
        s->qhead = a;
    s->qtail = a;
    atomic_fetch_add_explicit(&s->qlen, 1, memory_order_seq_cst);
}

static void wake(rt_sched_t *s)
{
    if (atomic_load_explicit(&s->sleeping, memory_order_seq_cst))
        uv_async_send(&s->doorbell);
}

/* A peer that sleeps while this queue holds spare work should come and steal it. */
static void wake_a_thief(rt_sched_t *self)
{
    rt_runtime_t *rt = rt__rt;
    for (unsigned i = 1; i < rt->nsched; i++) {
        rt_sched_t *p = &rt->sched[(self->index + i) % rt->nsched];
        if (atomic_load_explicit(&p->sleeping, memory_order_relaxed)) {
            uv_async_send(&p->doorbell);
            return;
        }
    }
}

static void push_tail(rt_sched_t *s, rt_actor_t *a)
{
    rt__spin_lock(&s->qlock);
    q_append(s, a);
    size_t len = atomic_load_explicit(&s->qlen, memory_order_relaxed);
    rt__spin_unlock(&s->qlock);
    if (s == rt__tls.sched) {
        if (len >= 2)
            wake_a_thief(s);
    } else {
        wake(s);
    }
}

static void push_next(rt_sched_t *s, rt_actor_t *a)
{
    rt_actor_t *old = s->runnext;
    s->runnext = a;
    if (old)
        push_tail(s, old);
}

static rt_actor_t *q_pop(rt_sched_t *s)
{
    if (!atomic_load_explicit(&s->qlen, memory_order_relaxed))
        return NULL;
    rt__spin_lock(&s->qlock);
    rt_actor_t *a = s->qhead;
    if (a) {
        s->qhead = a->runq_next;
        if (!s->qhead)
            s->qtail = NULL;
        a->runq_next = NULL;
        atomic_fetch_sub_explicit(&s->qlen, 1, memory_order_relaxed);
    }
    rt__spin_unlock(&s->qlock);
    return a;
}

static rt_actor_t *next_local(rt_sched_t *s)
{
    rt_actor_t *a = s->runnext;
    if (a) {
        if (s->runnext_streak < RT_RUNNEXT_MAX ||
            !atomic_load_explicit(&s->qlen, memory_order_relaxed)) {
            s->runnext = NULL;
            s->runnext_streak++;
            return a;
        }
        s->runnext = NULL;
        push_tail(s, a);
    }
    s->runnext_streak = 0;
    return q_pop(s);
}

/* Takes up to half of a peer's unpinned queue; returns one to run, queues the rest here. */
static rt_actor_t *steal(rt_sched_t *s)
{
    rt_runtime_t *rt = rt__rt;
    for (unsigned i = 1; i < rt->nsched; i++) {
        rt_sched_t *v = &rt->sched[(s->index + i) % rt->nsched];
        size_t len = atomic_load_explicit(&v->qlen, memory_order_relaxed);
        if (!len)
            continue;
        size_t want = (len + 1) / 2;
        rt_actor_t *got = NULL, *got_tail = NULL;
        size_t n = 0;
        rt__spin_lock(&v->qlock);
        rt_actor_t **pp = &v->qhead, *prev = NULL;
        while (*pp && n < want) {
            rt_actor_t *a = *pp;
            if (a->home >= 0) {
                prev = a;
                pp = &a->runq_next;
                continue;
            }
            *pp = a->runq_next;
            if (v->qtail == a)
                v->qtail = prev;
            a->runq_next = NULL;
            if (got_tail)
                got_tail->runq_next = a;
            else
                got = a;
            got_tail = a;
            n++;
        }
        if (n)
            atomic_fetch_sub_explicit(&v->qlen, n, memory_order_relaxed);
        rt__spin_unlock(&v->qlock);
        if (!got)
            continue;
        atomic_fetch_add_explicit(&s->steals, n, memory_order_relaxed);
        rt_actor_t *rest = got->runq_next;
        got->runq_next = NULL;
        if (rest) {
            rt__spin_lock(&s->qlock);
            while (rest) {
                rt_actor_t *next = rest->runq_next;
                q_append(s, rest);
                rest = next;
            }
            rt__spin_unlock(&s->qlock);
        }
        return got;
    }
    return NULL;
}

/* ---- Placement ---- */

static void place(rt_actor_t *a, bool woken)
{
    rt_runtime_t *rt = rt__rt;
    atomic_store_explicit(&a->status, RT_STATUS_RUNNABLE, memory_order_relaxed);
    if (a->type->flags & RT_TYPE_BLOCKING) {
        rt__blocking_push(a);
        return;
    }
    rt_sched_t *me = rt__tls.sched;
    rt_sched_t *target = a->home >= 0 ? &rt->sched[a->home] : me;
    if (!target)
        target = &rt->sched[atomic_fetch_add_explicit(&rt->rr, 1, memory_order_relaxed) %
                            rt->nsched];
    if (target == me && woken)
        push_next(me, a);
    else
        push_tail(target, a);
}

void rt__schedule(rt_actor_t *a)
{
    place(a, true);
}

void rt__requeue(rt_actor_t *a)
{
    place(a, false);
}

/* ---- Blocking pool ---- */

void rt__blocking_push(rt_actor_t *a)
{
    rt_blocking_pool_t *b = &rt__rt->blocking;
    pthread_mutex_lock(&b->lock);
    a->runq_next = NULL;
    if (b->tail)
        b->tail->runq_next = a;
    else
        b->head = a;
    b->tail = a;
    b->len++;
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

static void *blocking_main(void *arg)
{
    rt_blocking_pool_t *b = arg;
    rt_ebr_thread_t *ebr = rt__ebr_register();
    rt__tls.ebr = ebr;
    rt__tls.blocking_thread = true;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stopping)
            pthread_cond_wait(&b->cond, &b->lock);
        if (!b->head)
            break;
        rt_actor_t *a = b->head;
        b->head = a->runq_next;
        if (!b->head)
            b->tail = NULL;
        b->len--;
        pthread_mutex_unlock(&b->lock);
        uint64_t t0 = rt__ticks();
        rt__ebr_enter(ebr);
        uint64_t t1 = rt__run_turn(a, rt__rt->cfg.batch, t0);
        rt__ebr_leave(ebr);
        atomic_fetch_add_explicit(&b->busy_ticks, t1 - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->turns, 1, memory_order_relaxed);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    rt__ebr_unregister(ebr);
    rt__tls.ebr = NULL;
    rt_heap_thread_flush();
    return NULL;
}

/* ---- Scheduler threads ---- */

static void ensure_active(rt_sched_t *s)
{
    if (!(atomic_load_explicit(&s->ebr->local, memory_order_relaxed) & 1))
        rt__ebr_enter(s->ebr);
}

static void on_doorbell(uv_async_t *h)
{
    rt_sched_t *s = h->data;
    ensure_active(s);
    if (atomic_load(&s->stopping))
        uv_stop(&s->loop);
}

void rt__sched_on_tick(uv_timer_t *h)
{
    rt_sched_t *s = h->data;
    ensure_active(s);
    s->timer_due_ns = 0;
    rt__timers_run(s);
}

/* An idle scheduler with retired actors wakes now and then until they are freed. */
#define RT_RECLAIM_RETRY_MS 2

static void on_reclaim(uv_timer_t *h)
{
    rt_sched_t *s = h->data;
    ensure_active(s);
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

static void *sched_main(void *arg)
{
    rt_sched_t *s = arg;
    rt_runtime_t *rt = rt__rt;
    rt__tls.sched = s;
    rt__tls.ebr = s->ebr;
    rt__ebr_enter(s->ebr);
    unsigned batch = rt->cfg.batch;
    uint64_t poll_every = rt__ns_to_ticks(RT_POLL_NS);
    uint64_t now = rt__ticks(), last_poll = now;
    while (!atomic_load_explicit(&s->stopping, memory_order_relaxed)) {
        rt_actor_t *a = next_local(s);
        if (!a)
            a = steal(s);
        if (a) {
            /* One clock read a turn: a turn starts where the previous one ended. */
            uint64_t end = rt__run_turn(a, batch, now);
            atomic_store_explicit(&s->busy_ticks,
                                  atomic_load_explicit(&s->busy_ticks, memory_order_relaxed) +
                                      (end - now),
                                  memory_order_relaxed);
            atomic_store_explicit(&s->turns,
                                  atomic_load_explicit(&s->turns, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            now = end;
            if (now - last_poll >= poll_every) {
                rt__ebr_enter(s->ebr); /* a quiescent point: lets retired actors go */
                uv_run(&s->loop, UV_RUN_NOWAIT);
                rt__timers_run(s);
                now = last_poll = rt__ticks();
            }
            continue;
        }
        /* Nothing to run: poll once, then park unless work arrived meanwhile. */
        uv_run(&s->loop, UV_RUN_NOWAIT);
        rt__timers_run(s);
        now = last_poll = rt__ticks();
        if (s->runnext || atomic_load(&s->qlen))
            continue;
        if (s->ebr->limbo_head)
            uv_timer_start(&s->reclaim, on_reclaim, RT_RECLAIM_RETRY_MS, 0);
        rt__ebr_leave(s->ebr);
        atomic_store_explicit(&s->sleeping, true, memory_order_seq_cst);
        if (atomic_load_explicit(&s->qlen, memory_order_seq_cst) ||
            atomic_load_explicit(&s->stopping, memory_order_seq_cst)) {
            atomic_store(&s->sleeping, false);
            rt__ebr_enter(s->ebr);
            continue;
        }
        uv_run(&s->loop, UV_RUN_ONCE);
        atomic_store_explicit(&s->sleeping, false, memory_order_seq_cst);
        ensure_active(s);
        now = last_poll = rt__ticks();
    }
    rt__ebr_leave(s->ebr);
    rt_heap_thread_flush();
    return NULL;
}

static int sched_init(rt_sched_t *s, unsigned index)
{
    memset(s, 0, sizeof(*s));
    s->index = index;
    s->epfd = -1;
    int rc = uv_loop_init(&s->loop);
    if (rc)
        return RT_ENOMEM;
    uv_async_init(&s->loop, &s->doorbell, on_doorbell);
    s->doorbell.data = s;
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_init(&s->loop, &s->reclaim);
    s->reclaim.data = s;
    s->scratch = malloc(RT_SCRATCH_BYTES);
    s->ebr = rt__ebr_register();
    if (!s->scratch || !s->ebr)
        return RT_ENOMEM;
    rt__timers_init(s);
    rc = rt__sock_sched_init(s);
    if (rc)
        return rc;
    s->started_ns = rt__now_ns();
    return 0;
}

static void sched_destroy(rt_sched_t *s)
{
    rt__sock_sched_close(s);
    rt__timers_destroy(s);
    uv_close((uv_handle_t *)&s->doorbell, close_cb);
    uv_close((uv_handle_t *)&s->tick, close_cb);
    uv_close((uv_handle_t *)&s->reclaim, close_cb);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    free(s->scratch);
    if (s->ebr)
        rt__ebr_unregister(s->ebr);
}

/* ---- Runtime lifecycle ---- */

void rt_config_defaults(rt_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->schedulers = RT_SCHEDULERS_DEFAULT;
    cfg->blocking_threads = RT_BLOCKING_THREADS_DEFAULT;
    cfg->batch = RT_BATCH_DEFAULT;
    cfg->max_actors = RT_MAX_ACTORS_DEFAULT;
    cfg->min_heap = RT_HEAP_MIN_HEAP_DEFAULT;
    cfg->gc_factor = RT_HEAP_GC_FACTOR_DEFAULT;
    cfg->max_heap = 0;
}

int rt_init(const rt_config_t *cfg_in)
{
    if (rt__rt)
        return RT_EEXIST;
    rt_config_t cfg;
    if (cfg_in)
        cfg = *cfg_in;
    else
        rt_config_defaults(&cfg);
    if (!cfg.schedulers) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cfg.schedulers = n > 0 ? (unsigned)n : 1;
    }
    if (!cfg.batch)
        cfg.batch = RT_BATCH_DEFAULT;
    if (cfg.max_actors < 16)
        cfg.max_actors = RT_MAX_ACTORS_DEFAULT;
    if (cfg.schedulers > RT_EBR_MAX_THREADS / 2 || cfg.blocking_threads > RT_EBR_MAX_THREADS / 4 ||
        (cfg.gc_factor && cfg.gc_factor <= 1.0))
        return RT_EINVAL;
    rt_heap_config_t hc = {.min_heap = cfg.min_heap ? cfg.min_heap : RT_HEAP_MIN_HEAP_DEFAULT,
                           .gc_factor = cfg.gc_factor ? cfg.gc_factor : RT_HEAP_GC_FACTOR_DEFAULT};
    rt_heap_configure(&hc);

    rt_runtime_t *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return RT_ENOMEM;
    rt->cfg = cfg;
    rt__rt = rt;
    rt__ticks_to_ns(1); /* calibrate the cycle clock before any thread needs it */
    pthread_mutex_init(&rt->idle_lock, NULL);
    pthread_cond_init(&rt->idle_cond, NULL);
    rt__registry_init(rt);
    int rc = rt__slots_init(rt);
    if (!rc)
        rc = rt__timers_slots_init();
    rt->nsched = cfg.schedulers;
    rt->sched = aligned_alloc(RT_CACHE_LINE, sizeof(rt_sched_t) * rt->nsched);
    if (!rt->sched)
        rc = RT_ENOMEM;
    for (unsigned i = 0; !rc && i < rt->nsched; i++)
        rc = sched_init(&rt->sched[i], i);
    if (rc) {
        /* Partial start-up failures leave threads unstarted; the process is expected to exit. */
        return rc;
    }
    rt_blocking_pool_t *b = &rt->blocking;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    b->nthreads = cfg.blocking_threads;
    b->threads = calloc(b->nthreads ? b->nthreads : 1, sizeof(pthread_t));
    b->started_ns = rt__now_ns();
    for (unsigned i = 0; i < rt->nsched; i++)
        pthread_create(&rt->sched[i].thread, NULL, sched_main, &rt->sched[i]);
    for (unsigned i = 0; i < b->nthreads; i++)
        pthread_create(&b->threads[i], NULL, blocking_main, b);
    return 0;
}

int rt_wait_idle(uint64_t timeout_ms)
{
    rt_runtime_t *rt = rt__rt;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += (time_t)(timeout_ms / 1000);
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&rt->idle_lock);
    while (atomic_load(&rt->alive) > 0) {
        if (pthread_cond_timedwait(&rt->idle_cond, &rt->idle_lock, &deadline)) {
            rc = atomic_load(&rt->alive) > 0 ? RT_EAGAIN : 0;
            break;
        }
    }
    pthread_mutex_unlock(&rt->idle_lock);
    return rc;
}

void rt_shutdown(void)
{
    rt_runtime_t *rt = rt__rt;
    if (!rt)
        return;
    atomic_store(&rt->stopping, true);
    /* Actors may still be starting children when the first signal lands: repeat until none. */
    for (int round = 0; round < 100 && atomic_load(&rt->alive) > 0; round++) {
        rt__shutdown_actors();
        rt_wait_idle(100);
    }
    for (unsigned i = 0; i < rt->nsched; i++) {
        atomic_store(&rt->sched[i].stopping, true);
        uv_async_send(&rt->sched[i].doorbell);
    }
    for (unsigned i = 0; i < rt->nsched; i++)
        pthread_join(rt->sched[i].thread, NULL);
    pthread_mutex_lock(&rt->blocking.lock);
    rt->blocking.stopping = true;
    pthread_cond_broadcast(&rt->blocking.cond);
    pthread_mutex_unlock(&rt->blocking.lock);
    for (unsigned i = 0; i < rt->blocking.nthreads; i++)
        pthread_join(rt->blocking.threads[i], NULL);
    free(rt->blocking.threads);
    pthread_mutex_destroy(&rt->blocking.lock);
    pthread_cond_destroy(&rt->blocking.cond);

    /* Scheduler threads are gone: what they cached or retired is freed from here. */
    for (unsigned i = 0; i < rt->nsched; i++)
        sched_destroy(&rt->sched[i]);
    rt__actors_release_external();
    rt__ebr_drain_all();
    free(rt->sched);
    rt__timers_slots_destroy();
    rt__registry_destroy(rt);
    rt__slots_destroy(rt);
    pthread_mutex_destroy(&rt->idle_lock);
    pthread_cond_destroy(&rt->idle_cond);
    rt__msg_pool_destroy();
    rt__slab_destroy();
    rt_heap_thread_flush();
    rt_heap_pool_trim();
    free(rt);
    rt__rt = NULL;
}

void rt_stats(rt_stats_t *out)
{
    rt_runtime_t *rt = rt__rt;
    memset(out, 0, sizeof(*out));
    if (!rt)
        return;
    out->spawned = atomic_load(&rt->spawned);
    out->exited = atomic_load(&rt->exited);
    out->alive = atomic_load(&rt->alive);
    out->dead_letters = atomic_load(&rt->dead_letters);
    out->shed = atomic_load(&rt->shed);
    out->gcs = atomic_load(&rt->gcs);
    out->heap_limit_kills = atomic_load(&rt->heap_limit_kills);
    out->timers_pending = atomic_load(&rt->timers_pending);
    out->schedulers = rt->nsched;
    out->max_actors = rt->cfg.max_actors;
    rt__slab_stats(&out->actor_bytes_mapped, &out->actor_bytes_in_use);
    for (unsigned i = 0; i < rt->nsched; i++)
        out->turns += atomic_load(&rt->sched[i].turns);
}

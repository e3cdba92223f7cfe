/*
** Schedulers: one thread per core, each with a run queue of actors and a heap
** of timers. Sockets are not a scheduler's: all of them are in one epoll set.
**
** Placement: an actor woken by a send on a scheduler thread goes into that
** scheduler's runnext slot (Go's runnext), so a chain of sends runs hot on one
** core without touching the shared queue; the previous runnext goes to the
** queue's tail. Not one woken by another actor than last time while others are
** queued (a subscriber of many publishers): it waits behind them and takes their
** messages in one turn and one socket send, where runnext ran it after each
** publisher (fan-in 16 B: ~15 messages a send, 0.87x the CPU a message this way;
** pairs and fan-out, one waker each, unchanged). An actor that used its whole
** batch goes to the tail. An idle scheduler steals half of a peer's queue.
**
** Priority (BEAM's low processes): the queue has two lanes, normal and low. A
** low actor never takes runnext and runs when no normal one is queued, or after
** RT_LOW_EVERY normal turns in a row while it waited, so logins
** by the thousand queue behind a chat's hops without being starved by them.
** qlen counts both lanes, so sleep, wake-ups and stats see all queued work.
**
** Sleep (Go's netpoller, in small): a scheduler with nothing to run or steal
** becomes the poller if nobody is, and sleeps in epoll_wait on the socket set
** (whose kick_fd wakes it for other work); otherwise it sleeps on its own
** eventfd (a deep sleep). A socket event wakes the poller,
** whose thread then runs the socket's owner, and what that owner sends runs
** next on the same thread. So at light load one thread carries a message from
** the publisher's socket to the subscriber's with no cross-thread wake-up:
** with sockets pinned to schedulers, a delivery to a socket of the other one
** cost a doorbell and a second thread's wake-up, and rtd spent 1.4x
** Mosquitto's CPU per message at 4,000 msg/s. A queue that holds spare work
** rings a sleeping peer (wake_a_thief), so load spreads as it grows. Timers
** bound every sleep, so an idle runtime uses no CPU.
*/
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

rt_runtime_t *rt__rt;

#define RT_POLL_NS 100000 /* a busy scheduler looks at sockets and timers this often */
#define RT_RUNNEXT_MAX 64 /* runnext picks in a row before the queue gets a turn */
/*
** When a scheduler calls a sleeping peer to steal from its queue. A wake-up
** costs both threads more than a few short turns do, and at light load the
** events of one poll make a short queue that one thread clears at once:
** waking a peer for every queue of two made both threads wake for every
** message. A peer comes when the queue is long, or when this thread has been
** busy for a while with work still queued (checked between turns). At 4,000
** msg/s over 19,000 connections, calling one after 50 us of work cost 0.15
** wake-ups per message and 20% more CPU than after 300 us, which called none.
*/
#define RT_THIEF_QUEUE 16        /* queued actors that call a sleeping peer at once */
#define RT_THIEF_AFTER_NS 300000 /* busy this long with actors queued: call one */

/* ---- Run queues ---- */

static rt_priority_t lane_of(const rt_actor_t *a)
{
    return atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_LOW
               ? RT_PRIORITY_LOW
               : RT_PRIORITY_NORMAL;
}

#ifndef NDEBUG
/*
** A lane's ends agree (both set or both NULL, the tail last) and qlen counts both lanes,
** qlen_low the low one; qlock held, so no count moves meanwhile.
*/
static bool lanes_ok(rt_sched_t *s)
{
    for (int l = 0; l < RT_PRIORITY_LANES; l++)
        if (!s->qhead[l] != !s->qtail[l] || (s->qtail[l] && s->qtail[l]->runq_next))
            return false;
    size_t len = atomic_load_explicit(&s->qlen, memory_order_relaxed);
    size_t low = atomic_load_explicit(&s->qlen_low, memory_order_relaxed);
    return low <= len &&
           (len == 0) == (!s->qhead[RT_PRIORITY_NORMAL] && !s->qhead[RT_PRIORITY_LOW]) &&
           (low == 0) == !s->qhead[RT_PRIORITY_LOW];
}

/* Whether the scheduler's thread is inside its EBR region; asked by that thread. */
static bool in_region(const rt_sched_t *s)
{
    return atomic_load_explicit(&s->ebr->local, memory_order_relaxed) & 1;
}
#endif

/* Queues a at the tail of its lane; qlock held. */
static void q_append(rt_sched_t *s, rt_actor_t *a)
{
    RT_ASSERT(lanes_ok(s));
    rt_priority_t l = lane_of(a);
    a->runq_next = NULL;
    if (s->qtail[l])
        s->qtail[l]->runq_next = a;
    else
        s->qhead[l] = a;
    s->qtail[l] = a;
    if (l == RT_PRIORITY_LOW)
        atomic_fetch_add_explicit(&s->qlen_low, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->qlen, 1, memory_order_seq_cst);
    RT_ASSERT(lanes_ok(s));
}

/* Takes the head of lane l, NULL if it is empty; qlock held. */
static rt_actor_t *q_take(rt_sched_t *s, rt_priority_t l)
{
    rt_actor_t *a = s->qhead[l];
    if (!a)
        return NULL;
    s->qhead[l] = a->runq_next;
    if (!s->qhead[l])
        s->qtail[l] = NULL;
    a->runq_next = NULL;
    if (l == RT_PRIORITY_LOW)
        atomic_fetch_sub_explicit(&s->qlen_low, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->qlen, 1, memory_order_relaxed);
    RT_ASSERT(lanes_ok(s));
    return a;
}

/* The head of lane first, else of the other lane; qlock held. */
static rt_actor_t *q_take_either(rt_sched_t *s, rt_priority_t first)
{
    rt_actor_t *a = q_take(s, first);
    return a ? a : q_take(s, first == RT_PRIORITY_LOW ? RT_PRIORITY_NORMAL : RT_PRIORITY_LOW);
}

static void bell(int fd)
{
    uint64_t one = 1;
    while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void bell_clear(int fd)
{
    uint64_t n;
    while (read(fd, &n, sizeof(n)) < 0 && errno == EINTR)
        ;
}

/*
** The waker's half of the sleep handshake: whoever takes the sleep state back
** to AWAKE rings the bell that sleep waits on, so one write wakes one sleep and
** further wakers pay a load. The sleeper publishes its state before it looks
** at its queues one last time (both seq_cst), and a waker pushes before it
** loads the state, so either the sleeper sees the work or the waker sees it
** asleep.
*/
void rt__sched_wake(rt_sched_t *s)
{
    if (atomic_load_explicit(&s->sleeping, memory_order_seq_cst) == RT_SLEEP_AWAKE)
        return;
    int was = atomic_exchange_explicit(&s->sleeping, RT_SLEEP_AWAKE, memory_order_seq_cst);
    if (was == RT_SLEEP_DEEP)
        bell(s->wake_fd);
    else if (was == RT_SLEEP_POLL)
        bell(rt__rt->kick_fd);
}

/* A peer that sleeps while this queue holds spare work should come and steal it. */
static void wake_a_thief(rt_sched_t *self)
{
    rt_runtime_t *rt = rt__rt;
    for (unsigned i = 1; i < rt->nsched; i++) {
        rt_sched_t *p = &rt->sched[(self->index + i) % rt->nsched];
        if (atomic_load_explicit(&p->sleeping, memory_order_relaxed) != RT_SLEEP_AWAKE) {
            rt__sched_wake(p);
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
        if (len >= RT_THIEF_QUEUE)
            wake_a_thief(s);
    } else {
        rt__sched_wake(s);
    }
}

static void push_next(rt_sched_t *s, rt_actor_t *a)
{
    RT_ASSERT(s == rt__tls.sched); /* runnext is its scheduler's alone: no lock guards it */
    RT_ASSERT(a != s->runnext);
    rt_actor_t *old = s->runnext;
    s->runnext = a;
    if (old)
        push_tail(s, old);
}

static rt_actor_t *q_pop(rt_sched_t *s, rt_priority_t first)
{
    if (!atomic_load_explicit(&s->qlen, memory_order_relaxed))
        return NULL;
    rt__spin_lock(&s->qlock);
    rt_actor_t *a = q_take_either(s, first);
    rt__spin_unlock(&s->qlock);
    return a;
}

/* runnext, or the queue's normal lane, or its low lane; see "Priority" above. */
static rt_actor_t *pick_normal(rt_sched_t *s)
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
    return q_pop(s, RT_PRIORITY_NORMAL);
}

static rt_actor_t *next_local(rt_sched_t *s)
{
    RT_ASSERT(s == rt__tls.sched); /* runnext and the low-lane counters are the owner's */
    bool low_waits = atomic_load_explicit(&s->qlen_low, memory_order_relaxed);
    /* A low actor's turn comes after RT_LOW_EVERY normal ones; runnext keeps its actor. */
    rt_actor_t *a =
        low_waits && s->low_passed >= RT_LOW_EVERY ? q_pop(s, RT_PRIORITY_LOW) : pick_normal(s);
    if (a && lane_of(a) == RT_PRIORITY_NORMAL && low_waits)
        s->low_passed++;
    else
        s->low_passed = 0;
    return a;
}

/* Takes up to half of a peer's queue; returns one to run, queues the rest here. */
static rt_actor_t *steal(rt_sched_t *s)
{
    rt_runtime_t *rt = rt__rt;
    for (unsigned i = 1; i < rt->nsched; i++) {
        rt_sched_t *v = &rt->sched[(s->index + i) % rt->nsched];
        size_t len = atomic_load_explicit(&v->qlen, memory_order_relaxed);
        if (!len)
            continue;
        size_t want = (len + 1) / 2;
        rt_actor_t *got = NULL, *got_tail = NULL, *a;
        size_t n = 0;
        rt__spin_lock(&v->qlock);
        /* Normal actors first: the thief runs them sooner than their own scheduler would. */
        while (n < want && (a = q_take_either(v, RT_PRIORITY_NORMAL))) {
            if (got_tail)
                got_tail->runq_next = a;
            else
                got = a;
            got_tail = a;
            n++;
        }
        rt__spin_unlock(&v->qlock);
        RT_ASSERT(n <= want && !got_tail == !got && (!got_tail || !got_tail->runq_next));
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
    /* Queued once: a second placement before it ran would run it on two threads. */
    RT_ASSERT(atomic_load_explicit(&a->status, memory_order_relaxed) != RT_STATUS_RUNNABLE);
    rt_runtime_t *rt = rt__rt;
    atomic_store_explicit(&a->status, RT_STATUS_RUNNABLE, memory_order_relaxed);
    if (a->type->flags & RT_TYPE_BLOCKING) {
        rt__blocking_push(a);
        return;
    }
    rt_sched_t *me = rt__tls.sched;
    rt_sched_t *target = me;
    /* Where it ran last, if that scheduler is awake: under load an actor stays on one
       core with its state in that core's cache, and connections stay spread as they
       were (waking everything where the event was taken cost up to 30% more CPU per
       message at saturation). A sleeping one is not woken for it: at light load the
       actor runs here, so a message crosses no thread. */
    int16_t last = __atomic_load_n(&a->last_sched, __ATOMIC_RELAXED);
    if (woken && me && last >= 0 && (unsigned)last != me->index &&
        atomic_load_explicit(&rt->sched[last].sleeping, memory_order_relaxed) == RT_SLEEP_AWAKE)
        target = &rt->sched[last];
    if (!target)
        target =
            &rt->sched[atomic_fetch_add_explicit(&rt->rr, 1, memory_order_relaxed) % rt->nsched];
    bool chain = true;
    rt_actor_t *waker = rt__tls.current;
    if (woken && waker) {
        uint8_t tag = (uint8_t)((waker->pid * 0x9E3779B97F4A7C15ull) >> 56) | 1;
        chain =
            tag == a->last_waker || (me && !atomic_load_explicit(&me->qlen, memory_order_relaxed));
        a->last_waker = tag;
    }
    if (target == me && woken && lane_of(a) == RT_PRIORITY_NORMAL && chain)
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
    pthread_mutex_unlock(&b->lock);
    /* After the unlock: a thread woken under it would block at once on the lock we hold (a
       futex wait and wake more per push). It finds the actor queued either way. */
    pthread_cond_signal(&b->cond);
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
        RT_ASSERT(b->len > 0); /* len counts the list: a queued actor is in it */
        b->head = a->runq_next;
        if (!b->head)
            b->tail = NULL;
        b->len--;
        RT_ASSERT(!b->head == !b->len);
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

/*
** Memory back to the OS. When a burst of actors has gone (connections that left), or a
** wave of heaps has shrunk (sessions hibernating after a login storm: 19,000 XMPP sessions
** left 41 MB of free chunks resident, 2.2 KB a session, with no actor exiting), an idle
** scheduler gives back the slab pages, heap chunks and malloc memory they held. It waits
** until no actor has exited and no chunk come back for RT_TRIM_QUIET_MS (the burst is over
** and its actors reclaimed: a page is given back only when every actor or chunk on it is
** free) and at least RT_TRIM_MIN_BYTES sit idle in the slab or the chunk pool. A trim walks
** the free lists (a few ms for 100,000 free actors); one that gave nothing back (free
** actors spread over pages that live ones still use) doubles the wait before the next, up
** to RT_TRIM_MAX_WAIT_MS.
**
** The shared pools' trim (slab pages, heap chunks a 1 MiB arena at a time, malloc_trim) runs
** on a thread of its own at a lower priority, asked by the idle scheduler: on the scheduler
** it took tens of ms after 19,000 sessions hibernated (madvise of 40 MB, malloc_trim's walk),
** and both schedulers trimming at once stalled every session for ~100 ms, the worst chat
** latency of the login-storm benchmark. A scheduler keeps only what it alone owns: its
** timers and its caches.
*/
#define RT_TRIM_MIN_BYTES (2u << 20) /* one slab page */
#define RT_TRIM_QUIET_MS 200
#define RT_TRIM_WAIT_MS 1000
#define RT_TRIM_MAX_WAIT_MS 64000

static void idle_trim(rt_sched_t *s)
{
    RT_ASSERT(in_region(s)); /* the timer trim looks actors up */
    if (s->ebr->limbo_head)
        return;
    uint64_t now = rt_mono_ms();
    uint64_t exited = atomic_load_explicit(&rt__rt->exited, memory_order_relaxed);
    uint64_t returned = rt_heap_pool_returned();
    if (exited != s->trim_exited || returned != s->trim_returned) {
        s->trim_exited = exited;
        s->trim_returned = returned;
        s->trim_after_ms = now + RT_TRIM_QUIET_MS;
        s->trim_backoff_ms = 0;
        s->trim_own = 1;
        return;
    }
    if (now < s->trim_after_ms)
        return;
    rt_runtime_t *rt = rt__rt;
    if (s->trim_own) {
        /* The burst is over: every scheduler trims what it alone holds. A peer asleep
           since before the exits never saw them, so it is told and woken. */
        s->trim_own = 0;
        atomic_fetch_add_explicit(&rt->trim_epoch, 1, memory_order_relaxed);
        for (unsigned i = 0; i < rt->nsched; i++)
            if (&rt->sched[i] != s)
                rt__sched_wake(&rt->sched[i]);
    }
    uint64_t epoch = atomic_load_explicit(&rt->trim_epoch, memory_order_relaxed);
    if (epoch != s->trim_epoch_seen) {
        /* What this scheduler alone holds: its timers, and the free actors and heap
           chunks in its caches, which go to the shared pools so that a trim sees them
           all (one actor left in a cache keeps its whole page). */
        s->trim_epoch_seen = epoch;
        rt__timers_trim(s);
        rt__slab_flush_thread();
        rt_heap_thread_flush();
        rt__msg_trim();
        rt__bin_pool_trim();
        rt__sock_out_trim();
    }
    size_t chunks_mapped, chunks_out;
    rt_heap_pool_stats(&chunks_mapped, &chunks_out);
    if (rt__slab_idle_bytes() < RT_TRIM_MIN_BYTES &&
        chunks_mapped - chunks_out < RT_TRIM_MIN_BYTES) {
        s->trim_backoff_ms = 0; /* nothing to wait for: sleep as long as the timers allow */
        return;
    }
    /* The latest trim's result decides the wait: this one runs after we return. */
    size_t given_back = atomic_load_explicit(&rt->trim_given_back, memory_order_relaxed);
    pthread_mutex_lock(&rt->trim_lock);
    rt->trim_asked = true;
    pthread_mutex_unlock(&rt->trim_lock);
    pthread_cond_signal(&rt->trim_cond);
    if (given_back || !s->trim_backoff_ms)
        s->trim_backoff_ms = RT_TRIM_WAIT_MS;
    else if (s->trim_backoff_ms < RT_TRIM_MAX_WAIT_MS)
        s->trim_backoff_ms *= 2;
    s->trim_after_ms = now + s->trim_backoff_ms;
}

#define RT_TRIMMER_NICE 10 /* below the schedulers: the trim waits while they have work */

static void *trimmer_main(void *arg)
{
    rt_runtime_t *rt = arg;
    /* Linux's nice is per thread. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), RT_TRIMMER_NICE);
    pthread_mutex_lock(&rt->trim_lock);
    for (;;) {
        while (!rt->trim_asked && !rt->trim_stopping)
            pthread_cond_wait(&rt->trim_cond, &rt->trim_lock);
        if (rt->trim_stopping)
            break;
        rt->trim_asked = false;
        pthread_mutex_unlock(&rt->trim_lock);
        atomic_store_explicit(&rt->trim_given_back, rt__slab_trim(), memory_order_relaxed);
        rt_heap_pool_trim();
#ifndef RT_SANITIZED
        /* Under a sanitizer malloc is the sanitizer's, and glibc's arenas that malloc_trim
           walks were never set up (ASan: a SEGV in mtrim once a heap's shrinking started
           trims). */
        malloc_trim(0);
#endif
        pthread_mutex_lock(&rt->trim_lock);
    }
    pthread_mutex_unlock(&rt->trim_lock);
    rt_heap_thread_flush();
    return NULL;
}

/* An idle scheduler with retired actors wakes now and then until they are freed. */
#define RT_RECLAIM_RETRY_MS 2

/* How long a sleep may last: until the earliest timer, or the next reclaim attempt. */
static int sleep_timeout_ms(const rt_sched_t *s)
{
    int64_t ms = -1;
    if (s->timer_due_ns) {
        uint64_t now = rt_mono_ns();
        /* Rounded up: a timer never fires early. */
        ms = s->timer_due_ns > now ? (int64_t)((s->timer_due_ns - now + 999999) / 1000000) : 0;
    }
    if (s->ebr->limbo_head && (ms < 0 || ms > RT_RECLAIM_RETRY_MS))
        ms = RT_RECLAIM_RETRY_MS;
    if (s->trim_own || s->trim_backoff_ms) {
        /* A trim is due (idle_trim): wake for it. */
        uint64_t now = rt_mono_ms();
        int64_t t = s->trim_after_ms > now ? (int64_t)(s->trim_after_ms - now) : 0;
        if (ms < 0 || ms > t)
            ms = t;
    }
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static bool has_work(rt_sched_t *s)
{
    return atomic_load_explicit(&s->qlen, memory_order_seq_cst) ||
           atomic_load_explicit(&s->timer_inbox, memory_order_seq_cst) ||
           atomic_load_explicit(&s->stopping, memory_order_seq_cst);
}

/*
** Parks the calling scheduler until a bell, a socket event (if it is the
** poller) or its next timer. Called outside the EBR region: a sleeping thread
** must not hold back reclamation.
*/
static void park(rt_sched_t *s)
{
    RT_ASSERT(!in_region(s)); /* a sleeper holds no epoch back */
    RT_ASSERT(!s->runnext);   /* nor an actor that only it would run */
    rt_runtime_t *rt = rt__rt;
    bool poller = !atomic_exchange_explicit(&rt->poller_taken, true, memory_order_acq_rel);
    int timeout = sleep_timeout_ms(s);
    struct epoll_event evs[RT_SOCK_BATCH];
    int n = 0;
    atomic_store_explicit(&s->sleeping, poller ? RT_SLEEP_POLL : RT_SLEEP_DEEP,
                          memory_order_seq_cst);
    if (!has_work(s)) {
        struct pollfd p = {.fd = s->wake_fd, .events = POLLIN};
        if (poller)
            n = rt__sock_wait(evs, timeout);
        else if (poll(&p, 1, timeout) > 0)
            bell_clear(s->wake_fd);
    }
    /* A waker may have rung already (its bell is then left for the next sleep, which
       returns at once: harmless). */
    atomic_store_explicit(&s->sleeping, RT_SLEEP_AWAKE, memory_order_seq_cst);
    ensure_active(s);
    if (poller) {
        rt__sock_dispatch(evs, n, true);
        atomic_store_explicit(&rt->poller_taken, false, memory_order_release);
    }
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
    uint64_t thief_after = rt__ns_to_ticks(RT_THIEF_AFTER_NS);
    uint64_t now = rt__ticks(), last_poll = now, busy_since = now;
    while (!atomic_load_explicit(&s->stopping, memory_order_relaxed)) {
        rt_actor_t *a = next_local(s);
        if (!a)
            a = steal(s);
        if (a) {
            RT_ASSERT(in_region(s)); /* a turn looks actors up */
            __atomic_store_n(&a->last_sched, (int16_t)s->index, __ATOMIC_RELAXED);
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
            if (now - busy_since >= thief_after &&
                atomic_load_explicit(&s->qlen, memory_order_relaxed))
                wake_a_thief(s);
            if (now - last_poll >= poll_every) {
                rt__ebr_enter(s->ebr); /* a quiescent point: lets retired actors go */
                /* While a poller sleeps on the sockets, their events are its to take. */
                if (!atomic_load_explicit(&rt->poller_taken, memory_order_relaxed)) {
                    struct epoll_event evs[RT_SOCK_BATCH];
                    rt__sock_dispatch(evs, rt__sock_wait(evs, 0), false);
                }
                rt__timers_run(s);
                now = last_poll = rt__ticks();
            }
            continue;
        }
        /* Nothing to run: fire due timers, then park unless that made work. */
        rt__timers_run(s);
        if (s->runnext || atomic_load(&s->qlen)) {
            now = last_poll = rt__ticks();
            continue;
        }
        idle_trim(s); /* in the EBR region: it looks actors up */
        rt__ebr_leave(s->ebr);
        park(s);
        now = last_poll = busy_since = rt__ticks();
    }
    rt__ebr_leave(s->ebr);
    rt_heap_thread_flush();
    rt__sock_out_trim();
    return NULL;
}

static int sched_init(rt_sched_t *s, unsigned index)
{
    memset(s, 0, sizeof(*s));
    s->index = index;
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->scratch = malloc(RT_SCRATCH_BYTES);
    s->ebr = rt__ebr_register();
    if (s->wake_fd < 0 || !s->scratch || !s->ebr)
        return RT_ENOMEM;
    rt__timers_init(s);
    s->started_ns = rt_mono_ns();
    return 0;
}

static void sched_destroy(rt_sched_t *s)
{
    rt__timers_destroy(s);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
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

#define RT_MMAP_THRESHOLD (256 * 1024) /* bytes from which malloc maps (glibc: 128 KiB, rising) */

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
    /* Fixed, so that a big buffer (an admin answer about every actor) is mapped and
       unmapped each time: glibc otherwise raises the threshold past a freed mapping's size,
       and the next buffers of that size land in its arenas, where the holes they leave
       between longer-lived allocations stay resident. */
    mallopt(M_MMAP_THRESHOLD, RT_MMAP_THRESHOLD);
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
    if (!rc)
        rc = rt__sock_init(rt);
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
    b->started_ns = rt_mono_ns();
    for (unsigned i = 0; i < rt->nsched; i++)
        pthread_create(&rt->sched[i].thread, NULL, sched_main, &rt->sched[i]);
    for (unsigned i = 0; i < b->nthreads; i++)
        pthread_create(&b->threads[i], NULL, blocking_main, b);
    pthread_mutex_init(&rt->trim_lock, NULL);
    pthread_cond_init(&rt->trim_cond, NULL);
    pthread_create(&rt->trimmer, NULL, trimmer_main, rt);
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

int rt_wait_exit(rt_pid_t pid, uint64_t timeout_ms)
{
    RT_ASSERT(!rt_current()); /* an actor waiting here would hold up its scheduler */
    /* Exits are not announced to outsiders: poll, at 1 ms, which is rtd's stop pace. */
    for (uint64_t waited = 0; rt_alive(pid); waited++) {
        if (waited >= timeout_ms)
            return RT_EAGAIN;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return 0;
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
        rt__sched_wake(&rt->sched[i]);
    }
    for (unsigned i = 0; i < rt->nsched; i++)
        pthread_join(rt->sched[i].thread, NULL);
    pthread_mutex_lock(&rt->blocking.lock);
    rt->blocking.stopping = true;
    pthread_cond_broadcast(&rt->blocking.cond);
    pthread_mutex_unlock(&rt->blocking.lock);
    for (unsigned i = 0; i < rt->blocking.nthreads; i++)
        pthread_join(rt->blocking.threads[i], NULL);
    pthread_mutex_lock(&rt->trim_lock);
    rt->trim_stopping = true;
    pthread_mutex_unlock(&rt->trim_lock);
    pthread_cond_signal(&rt->trim_cond);
    pthread_join(rt->trimmer, NULL);
    pthread_mutex_destroy(&rt->trim_lock);
    pthread_cond_destroy(&rt->trim_cond);
    free(rt->blocking.threads);
    pthread_mutex_destroy(&rt->blocking.lock);
    pthread_cond_destroy(&rt->blocking.cond);

    /* Scheduler threads are gone: what they cached or retired is freed from here. */
    for (unsigned i = 0; i < rt->nsched; i++)
        sched_destroy(&rt->sched[i]);
    rt__sock_destroy(rt);
    rt__actors_release_external();
    rt__ebr_drain_all();
    free(rt->sched);
    rt__timers_slots_destroy();
    rt__registry_destroy(rt);
    rt__slots_destroy(rt);
    pthread_mutex_destroy(&rt->idle_lock);
    pthread_cond_destroy(&rt->idle_cond);
    rt__msg_pool_destroy();
    rt__bin_pool_trim();
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

/*
** The wall-clock deadline of a rule call, fired from outside the thread that runs it
** (rule_vm.h, "CPU"). A thread cannot look at the clock while it is inside one long C call
** (Lua's own `<` on two strings full of NUL bytes, a library loop), and a hook that looks
** every so many instructions sees nothing of a loop whose each instruction takes a
** millisecond. So one watchdog thread per process sleeps until the earliest deadline of the
** calls running and, at it, sends the running thread RT_RULE_SIGNAL; the handler, on that
** thread, sets the state's count hook to 1 with lua_sethook (which Lua documents as safe to
** call from a signal handler) and raises the call's `fired` flag. The next VM instruction
** then runs the hook, which ends the call; the library's own C loops and the allocator read
** the flag as they go.
**
** A signal must never reach a thread outside its armed call: it would interrupt whatever
** system call the thread made next (EINTR in a scheduler's epoll_wait, a sink's database
** driver). So each thread's slot goes ARMED -> FIRING (the watchdog, by compare-and-swap,
** before it signals) -> FIRED (the handler), and a disarm that finds FIRING waits in
** nanosleep, a system call whose return delivers the pending signal, until the handler has
** run. The slot's word carries the call's generation, so a watchdog that read an earlier
** call's state can never fire a later one.
**
** Cost per call: a few atomic stores and one compare-and-swap, no system call. The watchdog
** sleeps until the earliest deadline (every call_ms or so while calls run) and not at all
** when none has run since its last look.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rule_vm_internal.h"

enum { IDLE, ARMED, FIRING, FIRED };
#define STATE(w) ((unsigned)((w)&3u))
#define GEN(w) ((w) >> 2)

typedef struct slot_s {
    struct slot_s *next; /* every thread's slot (list_lock) */
    pthread_t thread;
    _Atomic uint64_t word;        /* generation << 2 | state; written by the owner, but FIRING
                                     by the watchdog and FIRED by the handler */
    _Atomic uint64_t deadline_ns; /* of the armed call; written by the owner before word */
    uint64_t seen;                /* the generation the watchdog saw last (list_lock) */
    lua_State *L;                 /* the armed call's state: owner and its signal handler only */
    lua_Hook hook;
    atomic_bool *fired;
    uint64_t fired_cpu_ns; /* the thread's CPU time when its armed call's deadline fired (set
                              by the handler on the thread itself; 0: not fired) */
} slot_t;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int start_rc; /* what the first start returned; set once */
static pthread_key_t slot_key;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t list_cond;         /* the watchdog waits on it (CLOCK_MONOTONIC) */
static slot_t *slots;                    /* list_lock */
static atomic_bool idle;                 /* the watchdog waits for the next call with no timeout */
static _Atomic long shortest_ms = 60000; /* the shortest call_ms any call has had */
static _Thread_local slot_t *here;

static int signal_number(void)
{
    return SIGRTMIN + 3;
}

/* On the thread the watchdog signalled: its armed call runs out of time at once. */
static void on_signal(int sig)
{
    (void)sig;
    int saved = errno;
    slot_t *s = here;
    uint64_t w = s ? atomic_load(&s->word) : 0;
    if (s && STATE(w) == FIRING) {
        struct timespec cpu; /* clock_gettime is async-signal-safe */
        if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
            s->fired_cpu_ns = (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec;
        atomic_store(s->fired, true);
        lua_sethook(s->L, s->hook, LUA_MASKCOUNT | LUA_MASKCALL, 1);
        atomic_store(&s->word, (w & ~(uint64_t)3) | FIRED);
    }
    errno = saved;
}

static bool any_new_call(void)
{
    for (slot_t *s = slots; s; s = s->next)
        if (GEN(atomic_load(&s->word)) != s->seen)
            return true;
    return false;
}

static void wait_until(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    pthread_cond_timedwait(&list_cond, &list_lock, &ts);
}

static void *watchdog(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&list_lock);
    for (;;) {
        uint64_t now = rt_mono_ns(), next = UINT64_MAX;
        bool ran = false;
        for (slot_t *s = slots; s; s = s->next) {
            uint64_t w = atomic_load(&s->word);
            ran |= GEN(w) != s->seen;
            s->seen = GEN(w);
            if (STATE(w) != ARMED)
                continue;
            uint64_t d = atomic_load(&s->deadline_ns);
            if (d > now) {
                next = d < next ? d : next;
            } else if (atomic_compare_exchange_strong(&s->word, &w, (w & ~(uint64_t)3) | FIRING)) {
                pthread_kill(s->thread, signal_number());
            }
        }
        if (next == UINT64_MAX && !ran) {
            /* Nothing ran since the last look: wait for the next arm, which wakes us. The arm
               stores its word before it reads idle, we store idle before reading the words
               again (both sequentially consistent), so one of us sees the other. */
            atomic_store(&idle, true);
            if (!any_new_call())
                pthread_cond_wait(&list_cond, &list_lock);
            atomic_store(&idle, false);
            continue;
        }
        /* A call armed after now ends no earlier than now + the shortest call_ms. */
        uint64_t soon = now + (uint64_t)atomic_load(&shortest_ms) * 1000000u;
        wait_until(next < soon ? next : soon);
    }
    return NULL;
}

static void slot_free(void *p)
{
    slot_t *s = p;
    RT_ASSERT(STATE(atomic_load(&s->word)) == IDLE);
    pthread_mutex_lock(&list_lock);
    slot_t **pp = &slots;
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&list_lock);
    free(s);
}

static void start(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&list_cond, &ca);
    pthread_condattr_destroy(&ca);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&ta, 64 * 1024);
    if (pthread_key_create(&slot_key, slot_free) || sigaction(signal_number(), &sa, NULL) ||
        pthread_create(&t, &ta, watchdog, NULL))
        start_rc = RT_ENOMEM;
    pthread_attr_destroy(&ta);
}

int rt__rule_deadline_start(void)
{
    pthread_once(&once, start);
    return start_rc;
}

static void let_signal_through(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signal_number());
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/*
** This thread's slot, made (and the signal let through) at its first call; NULL without
** memory for it, and then this thread's calls have no deadline (the budget still holds).
*/
static slot_t *my_slot(void)
{
    if (here)
        return here;
    slot_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->thread = pthread_self();
    let_signal_through();
    pthread_setspecific(slot_key, s);
    pthread_mutex_lock(&list_lock);
    s->next = slots;
    slots = s;
    pthread_mutex_unlock(&list_lock);
    return here = s;
}

void rt__rule_deadline_arm(lua_State *L, lua_Hook hook, atomic_bool *fired, long call_ms)
{
    slot_t *s = my_slot();
    if (!s)
        return;
    uint64_t w = atomic_load_explicit(&s->word, memory_order_relaxed);
    RT_ASSERT(STATE(w) == IDLE); /* one armed call per thread: calls are never nested */
    s->L = L;
    s->hook = hook;
    s->fired = fired;
    s->fired_cpu_ns = 0;
    atomic_store_explicit(fired, false, memory_order_relaxed);
    atomic_store(&s->deadline_ns, rt_mono_ns() + (uint64_t)call_ms * 1000000u);
    atomic_store(&s->word, (GEN(w) + 1) << 2 | ARMED);
    if (call_ms < atomic_load_explicit(&shortest_ms, memory_order_relaxed)) {
        /* A deadline nearer than the watchdog plans for: tell it now. */
        pthread_mutex_lock(&list_lock);
        if (call_ms < atomic_load(&shortest_ms))
            atomic_store(&shortest_ms, call_ms);
        pthread_cond_signal(&list_cond);
        pthread_mutex_unlock(&list_lock);
    } else if (atomic_load(&idle)) {
        pthread_mutex_lock(&list_lock);
        pthread_cond_signal(&list_cond);
        pthread_mutex_unlock(&list_lock);
    }
}

uint64_t rt__rule_deadline_fired_cpu_ns(void)
{
    return here ? here->fired_cpu_ns : 0;
}

void rt__rule_deadline_disarm(void)
{
    slot_t *s = here;
    if (!s)
        return;
    uint64_t w = atomic_load(&s->word);
    RT_ASSERT(STATE(w) != IDLE);
    if (STATE(w) == ARMED && atomic_compare_exchange_strong(&s->word, &w, w & ~(uint64_t)3))
        return;
    /* The watchdog fired: its signal is on its way to this thread (or was handled). Were the
       rule's C code to have blocked it, it is let through again, to be delivered now. */
    let_signal_through();
    while (STATE(w = atomic_load(&s->word)) != FIRED) {
        struct timespec tick = {0, 1000};
        nanosleep(&tick, NULL);
    }
    atomic_store(&s->word, w & ~(uint64_t)3);
}

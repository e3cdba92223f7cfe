/*
** Small shared services: error names, exit reason names, the spinlock, the clocks
** (rt.h), per-thread exit hooks and the cycle clock used for per-turn CPU accounting.
*/
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define RT_HAVE_TSC 1
#endif

const char *rt_strerror(int code)
{
    switch (code) {
    case RT_EOK:
        return "ok";
    case RT_ENOMEM:
        return "out of memory";
    case RT_EINVAL:
        return "invalid argument";
    case RT_ENOPROC:
        return "no such actor";
    case RT_EEXIST:
        return "name already registered";
    case RT_EAGAIN:
        return "try again";
    case RT_ELIMIT:
        return "limit reached";
    case RT_ESHUTDOWN:
        return "runtime shutting down";
    case RT_ECLOSED:
        return "socket closed";
    case RT_ENOTFOUND:
        return "not found";
    case RT_EBUSY:
        return "needs a restart";
    default:
        return "unknown error";
    }
}

const char *rt_reason_name(rt_reason_t reason)
{
    switch (reason) {
    case RT_REASON_NORMAL:
        return "normal";
    case RT_REASON_KILL:
        return "kill";
    case RT_REASON_KILLED:
        return "killed";
    case RT_REASON_SHUTDOWN:
        return "shutdown";
    case RT_REASON_HEAP_LIMIT:
        return "heap_limit";
    case RT_REASON_NOPROC:
        return "noproc";
    case RT_REASON_INIT:
        return "init_failed";
    case RT_REASON_ERROR:
        return "error";
    default:
        return reason >= RT_REASON_USER ? "user" : "unknown";
    }
}

const char *rt_status_name(rt_actor_status_t s)
{
    switch (s) {
    case RT_STATUS_WAITING:
        return "waiting";
    case RT_STATUS_RUNNABLE:
        return "runnable";
    case RT_STATUS_RUNNING:
        return "running";
    case RT_STATUS_MUTED:
        return "muted";
    case RT_STATUS_EXITING:
        return "exiting";
    }
    return "unknown";
}

/*
** Spins briefly, then yields: on a 2-core machine shared with load generators
** the holder may be preempted, and spinning against it only burns its core.
*/
void rt__spin_lock(rt_spinlock_t *l)
{
    for (unsigned i = 0;; i++) {
        if (!atomic_load_explicit(&l->locked, memory_order_relaxed) &&
            !atomic_exchange_explicit(&l->locked, 1, memory_order_acquire))
            return;
        if (i < 64) {
#if RT_HAVE_TSC
            _mm_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

uint64_t rt_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t rt_mono_ms(void)
{
    return rt_mono_ns() / 1000000u;
}

uint64_t rt_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#if RT_HAVE_TSC
static double ns_per_tick;

static void calibrate(void)
{
    uint64_t n0 = rt_mono_ns(), t0 = __rdtsc();
    struct timespec d = {0, 2000000};
    nanosleep(&d, NULL);
    uint64_t n1 = rt_mono_ns(), t1 = __rdtsc();
    ns_per_tick = t1 > t0 ? (double)(n1 - n0) / (double)(t1 - t0) : 1.0;
}

uint64_t rt__ticks(void)
{
    return __rdtsc();
}

static pthread_once_t calibrated = PTHREAD_ONCE_INIT;

uint64_t rt__ticks_to_ns(uint64_t ticks)
{
    pthread_once(&calibrated, calibrate);
    return (uint64_t)((double)ticks * ns_per_tick);
}

uint64_t rt__ns_to_ticks(uint64_t ns)
{
    pthread_once(&calibrated, calibrate);
    return (uint64_t)((double)ns / ns_per_tick);
}
#else
uint64_t rt__ticks(void)
{
    return rt_mono_ns();
}

uint64_t rt__ticks_to_ns(uint64_t ticks)
{
    return ticks;
}

uint64_t rt__ns_to_ticks(uint64_t ns)
{
    return ns;
}
#endif

/* One key for every rt_thread_at_exit: its value is the thread's list of hooks. */
typedef struct exit_hook_s {
    struct exit_hook_s *next;
    void (*fini)(void *obj);
    void *obj;
} exit_hook_t;

static pthread_key_t exit_hooks_key;
static pthread_once_t exit_hooks_once = PTHREAD_ONCE_INIT;

static void run_exit_hooks(void *list)
{
    for (exit_hook_t *h = list, *next; h; h = next) {
        next = h->next;
        h->fini(h->obj);
        free(h);
    }
}

static void exit_hooks_key_create(void)
{
    pthread_key_create(&exit_hooks_key, run_exit_hooks);
}

int rt_thread_at_exit(void (*fini)(void *obj), void *obj)
{
    pthread_once(&exit_hooks_once, exit_hooks_key_create);
    exit_hook_t *h = malloc(sizeof(*h));
    if (!h)
        return RT_ENOMEM;
    *h = (exit_hook_t){.next = pthread_getspecific(exit_hooks_key), .fini = fini, .obj = obj};
    pthread_setspecific(exit_hooks_key, h);
    return 0;
}

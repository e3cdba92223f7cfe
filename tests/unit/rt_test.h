/*
** Helpers for runtime tests: start and stop a runtime, wait for a counter
** with a deadline (tests never sleep a fixed time and hope), read RSS.
*/
#ifndef RT_TEST_H
#define RT_TEST_H

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rt.h"

static inline uint64_t test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
** The bound of every wait for something that will happen (a message handled, an actor gone, a
** row written): each wait ends as soon as it has, so this only turns a hang into a failure
** before ctest's TIMEOUT (300 s). Not a speed: the sanitizer passes share two cores with the
** rest of the suite, and a 5 s bound once failed a sink test there that was only slow.
*/
#define RT_TEST_WAIT_MS 120000

static inline void test_sleep_ms(unsigned ms)
{
    struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
}

/* Waits until *v >= target; false if it did not within RT_TEST_WAIT_MS. */
static inline bool wait_at_least(atomic_long *v, long target)
{
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (atomic_load(v) < target) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
    return true;
}

/* Waits until exactly target actors are alive; false if not within RT_TEST_WAIT_MS. */
static inline bool wait_alive(uint64_t target)
{
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    rt_stats_t st;
    for (;;) {
        rt_stats(&st);
        if (st.alive == target)
            return true;
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
}

static inline long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * sysconf(_SC_PAGESIZE);
}

static inline void test_start(unsigned schedulers)
{
    rt_config_t cfg;
    rt_config_defaults(&cfg);
    cfg.schedulers = schedulers;
    int rc = rt_init(&cfg);
    if (rc) {
        fprintf(stderr, "rt_init: %s\n", rt_strerror(rc));
        exit(2);
    }
}

/*
** Runs fn(self) inside an actor (its init callback), for code that allocates from the
** calling actor's heap, and waits for that actor to exit. No collection runs while fn
** does, and the heap goes whole when the actor exits. Needs a started runtime with no
** other live actor.
*/
typedef struct {
    void (*fn)(rt_actor_t *self);
} test_in_actor_t;

static inline int test_in_actor_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state;
    ((const test_in_actor_t *)arg)->fn(self);
    rt_exit(self, RT_REASON_NORMAL);
    return 0;
}

static inline void test_in_actor_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state, (void)m;
}

static inline void test_in_actor(void (*fn)(rt_actor_t *self))
{
    static const rt_actor_type_t type = {
        .name = "test_in_actor", .init = test_in_actor_init, .handle = test_in_actor_handle};
    test_in_actor_t box = {fn};
    CHECK_EQ(rt_spawn(&type, &box, NULL), 0);
    CHECK(wait_alive(0));
}

#endif

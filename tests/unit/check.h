/*
** A minimal test harness: CHECK records a failure and goes on, so one run
** shows every broken expectation; RUN runs a test function by name; the
** summary line is the plain "N passed, N failed" that CI reads.
*/
#ifndef RT_CHECK_H
#define RT_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>

static int check_failures;
static int check_passes;
static int check_tests_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passes++;                                                                        \
        } else {                                                                                   \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        if (check_a_ == check_b_) {                                                                \
            check_passes++;                                                                        \
        } else {                                                                                   \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, check_a_, check_b_);                                         \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        int check_before_ = check_failures;                                                        \
        struct timespec check_t0_, check_t1_;                                                      \
        clock_gettime(CLOCK_MONOTONIC, &check_t0_);                                                \
        fn();                                                                                      \
        clock_gettime(CLOCK_MONOTONIC, &check_t1_);                                                \
        double check_ms_ = (check_t1_.tv_sec - check_t0_.tv_sec) * 1e3 +                           \
                           (check_t1_.tv_nsec - check_t0_.tv_nsec) / 1e6;                          \
        if (check_failures != check_before_)                                                       \
            check_tests_failed++;                                                                  \
        fprintf(stderr, "%-44s %s (%.0f ms)\n", #fn,                                               \
                check_failures == check_before_ ? "ok" : "FAILED", check_ms_);                     \
    } while (0)

#define CHECK_SUMMARY()                                                                            \
    (printf("%d passed, %d failed\n", check_passes, check_failures), check_failures ? 1 : 0)

/* A small deterministic generator (xorshift64), so randomized tests repeat exactly. */
static uint64_t check_rng_state = 88172645463325252ull;
static inline uint64_t rnd(void)
{
    check_rng_state ^= check_rng_state << 13;
    check_rng_state ^= check_rng_state >> 7;
    check_rng_state ^= check_rng_state << 17;
    return check_rng_state;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* CPU time of the calling thread: costs compared in one run hold on a loaded machine. */
static inline double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Stress sizes shrink under sanitizers, which are 5-20x slower; RT_STRESS_SCALE overrides. */
static inline long check_scale(long n)
{
    const char *s = getenv("RT_STRESS_SCALE");
    double f = s ? atof(s) : 1.0;
#ifdef RT_SANITIZED
    if (!s)
        f = 0.1;
#endif
    long v = (long)(n * f);
    return v > 0 ? v : 1;
}

#endif

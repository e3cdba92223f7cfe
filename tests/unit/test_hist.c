/*
** Latency histograms (runtime/hist.h): a value lands in the first bucket whose bound holds
** it (bounds inclusive, as Prometheus's le), snapshots are cumulative with the count in the
** last bucket, and threads recording at once (more threads than shards, so some share one)
** lose nothing, while a reader's snapshots stay cumulative and only grow.
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "hist.h"

static void test_bounds_are_log_spaced_seconds(void)
{
    CHECK_EQ(rt_hist_bounds_ns[0], 1000);
    CHECK_EQ(rt_hist_bounds_ns[RT_HIST_BOUNDS - 1], 10000000000ull);
    for (unsigned i = 1; i < RT_HIST_BOUNDS; i++) {
        CHECK(rt_hist_bounds_ns[i] > rt_hist_bounds_ns[i - 1]);
        CHECK(rt_hist_bounds_ns[i] <= rt_hist_bounds_ns[i - 1] * 5 / 2);
    }
}

/* The bucket a lone record landed in: the first whose cumulative count is 1. */
static unsigned bucket_of_one(uint64_t ns)
{
    static rt_hist_t h;
    memset(&h, 0, sizeof(h));
    rt_hist_record(&h, ns);
    rt_hist_snap_t s;
    rt_hist_snapshot(&h, &s);
    CHECK_EQ(s.le[RT_HIST_BOUNDS], 1);
    CHECK_EQ(s.sum_ns, ns);
    unsigned b = 0;
    while (s.le[b] == 0)
        b++;
    return b;
}

static void test_buckets_take_values_up_to_their_bound(void)
{
    CHECK_EQ(bucket_of_one(0), 0);
    for (unsigned i = 0; i < RT_HIST_BOUNDS; i++) {
        CHECK_EQ(bucket_of_one(rt_hist_bounds_ns[i]), i);
        CHECK_EQ(bucket_of_one(rt_hist_bounds_ns[i] + 1), i + 1);
    }
    CHECK_EQ(bucket_of_one(UINT64_MAX / 2), RT_HIST_BOUNDS);
}

#define THREADS 12 /* more than RT_HIST_SHARDS: some threads share a shard */
#define PER_THREAD 20000

static rt_hist_t shared_hist;
static atomic_bool recording;

static void *recorder(void *arg)
{
    uint64_t seed = (uintptr_t)arg;
    for (long i = 0; i < check_scale(PER_THREAD); i++)
        rt_hist_record(&shared_hist, (seed * 7919 + (uint64_t)i * 104729) % 20000000000ull);
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    uint64_t last = 0;
    bool ok = true;
    while (atomic_load(&recording)) {
        rt_hist_snap_t s;
        rt_hist_snapshot(&shared_hist, &s);
        for (unsigned b = 1; b <= RT_HIST_BOUNDS; b++)
            ok &= s.le[b] >= s.le[b - 1];
        ok &= s.le[RT_HIST_BOUNDS] >= last;
        last = s.le[RT_HIST_BOUNDS];
    }
    return ok ? &recording : NULL;
}

static void test_threads_record_at_once(void)
{
    pthread_t t[THREADS], r;
    atomic_store(&recording, true);
    pthread_create(&r, NULL, reader, NULL);
    uint64_t sum = 0;
    long n = check_scale(PER_THREAD);
    for (uintptr_t i = 0; i < THREADS; i++) {
        pthread_create(&t[i], NULL, recorder, (void *)i);
        for (long k = 0; k < n; k++)
            sum += (i * 7919 + (uint64_t)k * 104729) % 20000000000ull;
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    atomic_store(&recording, false);
    void *reader_ok;
    pthread_join(r, &reader_ok);
    CHECK(reader_ok != NULL);
    rt_hist_snap_t s;
    rt_hist_snapshot(&shared_hist, &s);
    CHECK_EQ(s.le[RT_HIST_BOUNDS], THREADS * n);
    CHECK(s.sum_ns == sum);
}

int main(void)
{
    RUN(test_bounds_are_log_spaced_seconds);
    RUN(test_buckets_take_values_up_to_their_bound);
    RUN(test_threads_record_at_once);
    return CHECK_SUMMARY();
}

/*
** Latency histograms (hist.h): per-thread shards of bucket counters, summed when read.
*/
#include "hist.h"

const uint64_t rt_hist_bounds_ns[RT_HIST_BOUNDS] = {
    1000,      2500,      5000,       10000,      25000,      50000,       100000,   250000,
    500000,    1000000,   2500000,    5000000,    10000000,   25000000,    50000000, 100000000,
    250000000, 500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};

/* The first bucket whose bound is at least ns (RT_HIST_BOUNDS: over the last bound). */
static unsigned bucket_of(uint64_t ns)
{
    unsigned lo = 0, hi = RT_HIST_BOUNDS;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (rt_hist_bounds_ns[mid] < ns)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void rt_hist_record(rt_hist_t *h, uint64_t ns)
{
    rt_hist_shard_t *s = &h->shard[rt_thread_ordinal() % RT_HIST_SHARDS]; /* threads in turn */
    atomic_fetch_add_explicit(&s->n[bucket_of(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->sum_ns, ns, memory_order_relaxed);
}

void rt_hist_snapshot(const rt_hist_t *h, rt_hist_snap_t *out)
{
    uint64_t n[RT_HIST_BOUNDS + 1] = {0};
    out->sum_ns = 0;
    for (unsigned i = 0; i < RT_HIST_SHARDS; i++) {
        const rt_hist_shard_t *s = &h->shard[i];
        for (unsigned b = 0; b <= RT_HIST_BOUNDS; b++)
            n[b] += atomic_load_explicit(&s->n[b], memory_order_relaxed);
        out->sum_ns += atomic_load_explicit(&s->sum_ns, memory_order_relaxed);
    }
    uint64_t run = 0;
    for (unsigned b = 0; b <= RT_HIST_BOUNDS; b++)
        out->le[b] = run += n[b];
}

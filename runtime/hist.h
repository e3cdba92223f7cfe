/*
** Latency histograms for metrics: a fixed set of log-spaced buckets (Prometheus
** "le" bounds, in seconds), recorded from any thread with no lock and summed only
** when read. Recording picks its thread's shard (threads take shards round robin
** at their first record) and adds to one bucket and the sum with relaxed atomics:
** threads that share a shard stay correct, only slower, and a reader may see one
** record's bucket before its sum (the bucket counts are always consistent among
** themselves, so a snapshot's +Inf bucket is its count).
*/
#ifndef RT_HIST_H
#define RT_HIST_H

#include <stdint.h>

#include "common.h"

/* Finite upper bounds, 1 us to 10 s in 1-2.5-5 steps; one more bucket takes the rest. */
#define RT_HIST_BOUNDS 22
#define RT_HIST_SHARDS 8 /* a power of two: shards a histogram keeps */

/* The bounds in nanoseconds, ascending. */
extern const uint64_t rt_hist_bounds_ns[RT_HIST_BOUNDS];

typedef struct rt_hist_shard_s {
    /* Written by whichever threads took this shard, read by any reader. */
    _Alignas(RT_CACHE_LINE) atomic_uint_fast64_t n[RT_HIST_BOUNDS + 1]; /* per bucket, not summed */
    atomic_uint_fast64_t sum_ns;
} rt_hist_shard_t;

/* All-zero is an empty histogram (static storage, or calloc'd inside its owner). */
typedef struct rt_hist_s {
    rt_hist_shard_t shard[RT_HIST_SHARDS];
} rt_hist_t;

typedef struct rt_hist_snap_s {
    uint64_t le[RT_HIST_BOUNDS + 1]; /* cumulative: records <= bound i; the last: all */
    uint64_t sum_ns;
} rt_hist_snap_t;

/* Records one duration. Any thread; no lock, no allocation. */
void rt_hist_record(rt_hist_t *h, uint64_t ns);
/* Sums the shards into *out (cumulative buckets). Any thread, while others record. */
void rt_hist_snapshot(const rt_hist_t *h, rt_hist_snap_t *out);

#endif

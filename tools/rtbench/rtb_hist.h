/*
 * rtb_hist: a small HDR-style log-bucket histogram of nanosecond values.
 *
 * Values below 32 are exact; above that, each power of two is split into 32 linear
 * sub-buckets, so any reported percentile is within 1/32 (about 3%) of a recorded
 * value. Recording is O(1) with no allocation; histograms merge and subtract by
 * adding bucket counts, which is how per-process results are aggregated exactly.
 */
#ifndef RTB_HIST_H
#define RTB_HIST_H

#include <stdint.h>

#define RTB_HIST_SUB_BITS 5
#define RTB_HIST_SUB (1u << RTB_HIST_SUB_BITS)
#define RTB_HIST_BUCKETS ((64 - RTB_HIST_SUB_BITS + 1) * RTB_HIST_SUB)

typedef struct rtb_hist_s {
    uint64_t count;                    /* number of recorded values */
    uint64_t max;                      /* exact largest value */
    uint64_t min;                      /* exact smallest value, UINT64_MAX when empty */
    uint64_t sum;                      /* sum of values, for the mean */
    uint64_t bucket[RTB_HIST_BUCKETS]; /* counts per log-linear bucket */
} rtb_hist_t;

void rtb_hist_init(rtb_hist_t *h);
void rtb_hist_record(rtb_hist_t *h, uint64_t v);
/* Adds every count of src into dst. */
void rtb_hist_merge(rtb_hist_t *dst, const rtb_hist_t *src);
/* dst = a - b, where b is an earlier snapshot of the same cumulative histogram. */
void rtb_hist_diff(rtb_hist_t *dst, const rtb_hist_t *a, const rtb_hist_t *b);
/*
 * Returns the value at quantile q (0..1): the upper edge of the bucket holding it,
 * capped at the exact max, or 0 for an empty histogram.
 */
uint64_t rtb_hist_quantile(const rtb_hist_t *h, double q);

#endif

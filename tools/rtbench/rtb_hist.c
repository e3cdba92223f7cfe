#include "rtb_hist.h"

#include <string.h>

static unsigned bucket_of(uint64_t v)
{
    if (v < RTB_HIST_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = e - RTB_HIST_SUB_BITS;
    unsigned mant = (unsigned)(v >> shift) & (RTB_HIST_SUB - 1);
    return (e - RTB_HIST_SUB_BITS + 1) * RTB_HIST_SUB + mant;
}

static uint64_t bucket_high(unsigned idx)
{
    if (idx < RTB_HIST_SUB)
        return idx;
    unsigned e = idx / RTB_HIST_SUB + RTB_HIST_SUB_BITS - 1;
    unsigned mant = idx % RTB_HIST_SUB;
    unsigned shift = e - RTB_HIST_SUB_BITS;
    uint64_t low = ((uint64_t)(RTB_HIST_SUB + mant)) << shift;
    return low + ((uint64_t)1 << shift) - 1;
}

void rtb_hist_init(rtb_hist_t *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

void rtb_hist_record(rtb_hist_t *h, uint64_t v)
{
    h->bucket[bucket_of(v)]++;
    h->count++;
    h->sum += v;
    if (v > h->max)
        h->max = v;
    if (v < h->min)
        h->min = v;
}

void rtb_hist_merge(rtb_hist_t *dst, const rtb_hist_t *src)
{
    for (unsigned i = 0; i < RTB_HIST_BUCKETS; i++)
        dst->bucket[i] += src->bucket[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->max > dst->max)
        dst->max = src->max;
    if (src->min < dst->min)
        dst->min = src->min;
}

void rtb_hist_diff(rtb_hist_t *dst, const rtb_hist_t *a, const rtb_hist_t *b)
{
    rtb_hist_init(dst);
    unsigned top = 0;
    for (unsigned i = 0; i < RTB_HIST_BUCKETS; i++) {
        dst->bucket[i] = a->bucket[i] - b->bucket[i];
        if (dst->bucket[i])
            top = i;
    }
    dst->count = a->count - b->count;
    dst->sum = a->sum - b->sum;
    /* The exact max of an interval is unknown; the bucket edge is the honest bound. */
    dst->max = dst->count ? (bucket_high(top) < a->max ? bucket_high(top) : a->max) : 0;
}

uint64_t rtb_hist_quantile(const rtb_hist_t *h, double q)
{
    if (h->count == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.5);
    if (rank < 1)
        rank = 1;
    if (rank > h->count)
        rank = h->count;
    uint64_t seen = 0;
    for (unsigned i = 0; i < RTB_HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= rank) {
            uint64_t v = bucket_high(i);
            return v < h->max ? v : h->max;
        }
    }
    return h->max;
}

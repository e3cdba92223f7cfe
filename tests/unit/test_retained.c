/*
** Tests for the retained-message store (actors/mqtt/retained.c): reverse matching of filters
** against stored topics ('+', '#' and the '$' rule), replacing and clearing, limits and
** peaks, memory returning to baseline, and setters racing readers (run under TSan too).
*/
#include "topic_trie.h"

#include "check.h"
#include "common.h"
#include "heap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char topics[32][64];
    int n;
} found_t;

static void found_cb(void *arg, const char *topic, size_t len, void *msg)
{
    found_t *f = arg;
    if (f->n < 32 && len < 64) {
        memcpy(f->topics[f->n], topic, len);
        f->topics[f->n][len] = 0;
        /* The payload must be the topic's own (tests store the topic as payload). */
        rt_bin_t *b = msg;
        if (rt_bin_len(b) != len || memcmp(rt_bin_data(b), topic, len) != 0)
            f->topics[f->n][0] = '!';
        f->n++;
    }
}

static int found_has(const found_t *f, const char *t)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->topics[i], t) == 0)
            return 1;
    return 0;
}

static int rset(rt_retained_t *r, const char *topic)
{
    rt_bin_t *b = rt_bin_new(topic, strlen(topic));
    int rc = rt_retained_set(r, topic, strlen(topic), b, rt_bin_len(b));
    if (rc != 0)
        rt_bin_release(b);
    return rc;
}

static int rfind(rt_retained_t *r, const char *filter, found_t *f)
{
    size_t n = 0;
    memset(f, 0, sizeof(*f));
    int rc = rt_retained_match(r, filter, strlen(filter), found_cb, f, &n);
    return rc ? rc : (int)n;
}

static void test_retained(void)
{
    size_t bins0, binbytes0;
    rt_bin_totals(&bins0, &binbytes0);
    rt_retained_t *r;
    CHECK_EQ(rt_retained_new(&r, (rt_retained_release_fn)rt_bin_release, 0, 0), 0);
    size_t count, mb, mem0, mem;
    rt_retained_stats(r, &count, &mb, &mem0);
    const char *topics[] = {"a", "a/b", "a/b/c", "a//c", "/x", "$SYS/up", "b/$x", "a/c"};
    for (size_t i = 0; i < sizeof(topics) / sizeof(*topics); i++)
        CHECK_EQ(rset(r, topics[i]), 0);
    CHECK_EQ(rset(r, "a/b"), 0); /* replace: the old binary is released */
    rt_retained_stats(r, &count, &mb, &mem);
    CHECK_EQ(count, 8);
    CHECK_EQ(mb, 1 + 3 + 5 + 4 + 2 + 7 + 4 + 3);
    found_t f;
    CHECK_EQ(rfind(r, "#", &f), 7); /* all but $SYS/up */
    CHECK(!found_has(&f, "$SYS/up") && found_has(&f, "/x") && found_has(&f, "b/$x"));
    for (int i = 0; i < f.n; i++)
        CHECK(f.topics[i][0] != '!');
    CHECK_EQ(rfind(r, "a/#", &f), 5);
    CHECK(found_has(&f, "a") && found_has(&f, "a//c") && found_has(&f, "a/b/c"));
    CHECK_EQ(rfind(r, "a/+", &f), 2);
    CHECK(found_has(&f, "a/b") && found_has(&f, "a/c"));
    CHECK_EQ(rfind(r, "a/+/c", &f), 2);
    CHECK(found_has(&f, "a/b/c") && found_has(&f, "a//c"));
    CHECK_EQ(rfind(r, "+", &f), 1);
    CHECK_EQ(rfind(r, "+/+", &f), 4); /* a/b a/c /x b/$x; not $SYS/up */
    CHECK_EQ(rfind(r, "$SYS/#", &f), 1);
    CHECK_EQ(rfind(r, "$SYS/+", &f), 1);
    CHECK_EQ(rfind(r, "+/$x", &f), 1);
    CHECK_EQ(rfind(r, "a/b", &f), 1);
    CHECK_EQ(rfind(r, "a/b/c/d", &f), 0);
    CHECK_EQ(rfind(r, "a/#/c", &f), RT_EINVAL);
    CHECK_EQ(rfind(r, "$share/g/a", &f), RT_EINVAL);

    /* Clear with an empty payload (NULL), including topics that hold nothing. */
    CHECK_EQ(rt_retained_set(r, "a", 1, NULL, 0), 0);
    CHECK_EQ(rt_retained_set(r, "nothing/here", 12, NULL, 0), 0);
    CHECK_EQ(rfind(r, "a/#", &f), 4);
    CHECK(!found_has(&f, "a"));
    for (size_t i = 0; i < sizeof(topics) / sizeof(*topics); i++)
        CHECK_EQ(rt_retained_set(r, topics[i], strlen(topics[i]), NULL, 0), 0);
    rt_retained_stats(r, &count, &mb, &mem);
    CHECK_EQ(count, 0);
    CHECK_EQ(mb, 0);
    CHECK_EQ(mem, mem0);
    CHECK_EQ(rfind(r, "#", &f), 0);
    rt_retained_free(r);

    /* Limits: the message beyond them is refused and the old ones stay. */
    CHECK_EQ(rt_retained_new(&r, (rt_retained_release_fn)rt_bin_release, 2, 10), 0);
    CHECK_EQ(rset(r, "abcd"), 0);
    CHECK_EQ(rset(r, "efgh"), 0);
    CHECK_EQ(rset(r, "ijkl"), RT_ELIMIT);
    CHECK_EQ(rset(r, "abcd"), 0); /* replacing does not count twice */
    CHECK_EQ(rt_retained_set(r, "efgh", 4, NULL, 0), 0);
    CHECK_EQ(rset(r, "ijklmnop"), RT_ELIMIT); /* 4 + 8 > 10 bytes */
    CHECK_EQ(rset(r, "ijklmn"), 0);
    rt_retained_stats(r, &count, &mb, &mem);
    CHECK_EQ(count, 2);
    CHECK_EQ(mb, 10);
    rt_retained_free(r); /* releases what is left */
    size_t bins, binbytes;
    rt_bin_totals(&bins, &binbytes);
    CHECK_EQ(bins, bins0);
}

/* Setters replace and clear retained messages while readers reverse-match (run under TSan). */
typedef struct {
    rt_retained_t *r;
    long iters;
    int id;
    atomic_long *errors;
} rstress_t;

static void rcount(void *arg, const char *topic, size_t len, void *msg)
{
    rt_bin_t *b = msg;
    if (rt_bin_len(b) != len || memcmp(rt_bin_data(b), topic, len) != 0)
        atomic_fetch_add((atomic_long *)arg, 1);
}

static void *rsetter(void *p)
{
    rstress_t *a = p;
    char topic[32];
    for (long i = 0; i < a->iters; i++) {
        snprintf(topic, sizeof(topic), "r/%d/%ld", a->id, i % 50);
        if (i % 3 == 2) {
            rt_retained_set(a->r, topic, strlen(topic), NULL, 0);
            continue;
        }
        rt_bin_t *b = rt_bin_new(topic, strlen(topic));
        if (rt_retained_set(a->r, topic, strlen(topic), b, rt_bin_len(b)) != 0) {
            rt_bin_release(b);
            atomic_fetch_add(a->errors, 1);
        }
    }
    return NULL;
}

static void *rreader(void *p)
{
    rstress_t *a = p;
    static const char *filters[] = {"#", "r/+/#", "r/0/+", "+/1/7", "r/#"};
    for (long i = 0; i < a->iters; i++) {
        const char *f = filters[i % 5];
        if (rt_retained_match(a->r, f, strlen(f), rcount, a->errors, NULL) != 0)
            atomic_fetch_add(a->errors, 1);
    }
    return NULL;
}

static void test_retained_concurrency(void)
{
    size_t bins0, bb;
    rt_bin_totals(&bins0, &bb);
    rt_retained_t *r;
    CHECK_EQ(rt_retained_new(&r, (rt_retained_release_fn)rt_bin_release, 0, 0), 0);
    atomic_long errors = 0;
    pthread_t th[4];
    rstress_t a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (rstress_t){r, i < 2 ? check_scale(20000) : check_scale(2000), i, &errors};
        pthread_create(&th[i], NULL, i < 2 ? rsetter : rreader, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&errors), 0);
    size_t count, mb, mem;
    rt_retained_stats(r, &count, &mb, &mem);
    CHECK(count <= 100);
    rt_retained_free(r);
    size_t bins;
    rt_bin_totals(&bins, &bb);
    CHECK_EQ(bins, bins0);
}

/* Retained peaks, and limits changed on a live store (what is held stays). */
static void test_retained_peaks_and_limits(void)
{
    rt_retained_t *r;
    CHECK_EQ(rt_retained_new(&r, (rt_retained_release_fn)rt_bin_release, 0, 0), 0);
    CHECK_EQ(rset(r, "p/1"), 0);
    CHECK_EQ(rset(r, "p/22"), 0);
    CHECK_EQ(rt_retained_set(r, "p/1", 3, NULL, 0), 0); /* cleared */
    size_t count, mb, cmax, bmax;
    rt_retained_stats(r, &count, &mb, NULL);
    rt_retained_peaks(r, &cmax, &bmax);
    CHECK(count == 1 && mb == 4 && cmax == 2 && bmax == 7);
    rt_retained_set_limits(r, 1, 0);
    CHECK_EQ(rset(r, "p/3"), RT_ELIMIT);
    CHECK_EQ(rset(r, "p/22"), 0); /* a replacement does not add one */
    rt_retained_set_limits(r, 0, 5);
    CHECK_EQ(rset(r, "p/333"), RT_ELIMIT); /* 4 + 5 bytes > 5 */
    rt_retained_set_limits(r, 0, 0);
    CHECK_EQ(rset(r, "p/333"), 0);
    rt_retained_peaks(r, &cmax, &bmax);
    CHECK(cmax == 2 && bmax == 9);
    rt_retained_free(r);
}

int main(void)
{
    RUN(test_retained);
    RUN(test_retained_concurrency);
    RUN(test_retained_peaks_and_limits);
    return CHECK_SUMMARY();
}

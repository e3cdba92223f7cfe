/*
** The rule set's topic index (rules/rule_index.c): MQTT wildcards, topics starting with
** '$', one filter in two rules and two filters in one rule, 1,000 rules, random filters
** and topics against topic.h's matcher, and threads matching one index at
** once.
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "rt.h"
#include "rule_index.h"
#include "topic.h"

/* An index of filters[i] for rule i, sealed. */
static rt_rule_index_t *index_of(const char *const *filters, size_t n)
{
    rt_rule_index_t *ix = NULL;
    CHECK_EQ(rt_rule_index_new(&ix), 0);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(rt_rule_index_add(ix, filters[i], strlen(filters[i]), (uint32_t)i), 0);
    CHECK_EQ(rt_rule_index_seal(ix), 0);
    return ix;
}

/* The rules that match topic as "0,3,5". */
static const char *matches(const rt_rule_index_t *ix, const char *topic, rt_rule_hits_t *h)
{
    static char out[256];
    size_t k = 0;
    out[0] = 0;
    CHECK_EQ(rt_rule_index_match(ix, topic, strlen(topic), h), 0);
    for (size_t i = 0; i < h->n && k + 12 < sizeof(out); i++)
        k += (size_t)snprintf(out + k, sizeof(out) - k, "%s%u", i ? "," : "", h->rules[i]);
    return out;
}

static bool one_matches(const char *filter, const char *topic)
{
    rt_rule_index_t *ix = index_of(&filter, 1);
    rt_rule_hits_t h = {0};
    bool hit = strcmp(matches(ix, topic, &h), "0") == 0;
    rt_rule_hits_free(&h);
    rt_rule_index_free(ix);
    return hit;
}

static void test_wildcards(void)
{
    static const struct {
        const char *filter, *topic;
        bool hit;
    } cases[] = {
        {"a/b", "a/b", true},        {"a/b", "a/c", false},
        {"a/b", "a/b/c", false},     {"a/b", "a", false},
        {"a/+", "a/b", true},        {"a/+", "a/", true},
        {"a/+", "a", false},         {"a/+", "a/b/c", false},
        {"+/b", "a/b", true},        {"+", "a", true},
        {"+", "a/b", false},         {"+", "/", false},
        {"+/+", "/", true},          {"/+", "/a", true},
        {"/+", "a", false},          {"#", "a", true},
        {"#", "a/b/c", true},        {"#", "/", true},
        {"a/#", "a", true},          {"a/#", "a/b", true},
        {"a/#", "a/b/c", true},      {"a/#", "ab", false},
        {"a/#", "b/a", false},       {"a/+/#", "a/b", true},
        {"a/+/#", "a", false},       {"a/+/c", "a/b/c", true},
        {"a/+/c", "a/b/d", false},   {"+/+/#", "a", false},
        {"+/#", "a", true},          {"a//b", "a//b", true},
        {"a//b", "a/b", false},      {"a/b/", "a/b/", true},
        {"a/b/", "a/b", false},      {"sport/tennis/#", "sport/tennis", true},
        {"sport/+", "sport", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool hit = one_matches(cases[i].filter, cases[i].topic);
        if (hit != cases[i].hit)
            fprintf(stderr, "  \"%s\" on \"%s\": %d\n", cases[i].filter, cases[i].topic, hit);
        CHECK(hit == cases[i].hit);
    }
    /* Bad filters are refused, not indexed. */
    static const char *const bad[] = {"a/#/b", "a+", "a/b#", "#/", "++"};
    rt_rule_index_t *ix = NULL;
    CHECK_EQ(rt_rule_index_new(&ix), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ(rt_rule_index_add(ix, bad[i], strlen(bad[i]), 0), RT_EINVAL);
    rt_rule_index_free(ix);
}

static void test_dollar_topics(void)
{
    /* 4.7.2: a wildcard first level never takes a '$' topic; a literal '$SYS' level does. */
    CHECK(!one_matches("#", "$SYS/x"));
    CHECK(!one_matches("+/x", "$SYS/x"));
    CHECK(!one_matches("+", "$x"));
    CHECK(!one_matches("+/#", "$SYS"));
    CHECK(one_matches("$SYS/#", "$SYS/x"));
    CHECK(one_matches("$SYS/#", "$SYS"));
    CHECK(one_matches("$SYS/+", "$SYS/x"));
    CHECK(one_matches("$SYS/x", "$SYS/x"));
    /* Only the first level: '$' further on is an ordinary byte. */
    CHECK(one_matches("a/+", "a/$x"));
    CHECK(one_matches("a/#", "a/$x/y"));
    CHECK(one_matches("#", "a$"));
}

static void test_duplicates(void)
{
    /* One filter in two rules: both; two filters of one rule matching: that rule once;
       one rule naming a filter twice: once. Results ascend whatever the order of adding. */
    rt_rule_index_t *ix = NULL;
    CHECK_EQ(rt_rule_index_new(&ix), 0);
    static const struct {
        const char *filter;
        uint32_t rule;
    } adds[] = {{"s/+", 7}, {"s/#", 2}, {"s/+", 2}, {"s/x", 2}, {"s/x", 2},
                {"#", 5},   {"s/x", 0}, {"t", 9},   {"s/x", 7}};
    for (size_t i = 0; i < sizeof(adds) / sizeof(adds[0]); i++)
        CHECK_EQ(rt_rule_index_add(ix, adds[i].filter, strlen(adds[i].filter), adds[i].rule), 0);
    CHECK_EQ(rt_rule_index_seal(ix), 0);
    rt_rule_hits_t h = {0};
    CHECK(strcmp(matches(ix, "s/x", &h), "0,2,5,7") == 0);
    CHECK(strcmp(matches(ix, "s/y", &h), "2,5,7") == 0);
    CHECK(strcmp(matches(ix, "s", &h), "2,5") == 0);
    CHECK(strcmp(matches(ix, "t", &h), "5,9") == 0);
    CHECK(strcmp(matches(ix, "$t", &h), "") == 0);
    rt_rule_hits_free(&h);
    rt_rule_index_free(ix);
    /* An empty index matches nothing. */
    ix = index_of(NULL, 0);
    CHECK(strcmp(matches(ix, "a/b", &h), "") == 0);
    rt_rule_hits_free(&h);
    rt_rule_index_free(ix);
}

static void test_1000_rules(void)
{
    rt_rule_index_t *ix = NULL;
    CHECK_EQ(rt_rule_index_new(&ix), 0);
    char f[64];
    for (uint32_t i = 0; i < 1000; i++) {
        snprintf(f, sizeof(f), "dev/%u/+", i);
        CHECK_EQ(rt_rule_index_add(ix, f, strlen(f), i), 0);
        snprintf(f, sizeof(f), "dev/%u/x/#", i);
        CHECK_EQ(rt_rule_index_add(ix, f, strlen(f), i), 0);
    }
    CHECK_EQ(rt_rule_index_add(ix, "dev/+/alarm", 11, 1000), 0);
    CHECK_EQ(rt_rule_index_seal(ix), 0);
    rt_rule_hits_t h = {0};
    CHECK(strcmp(matches(ix, "dev/500/a", &h), "500") == 0);
    CHECK(strcmp(matches(ix, "dev/500/x", &h), "500") == 0); /* both of its filters: once */
    CHECK(strcmp(matches(ix, "dev/500/x/y/z", &h), "500") == 0);
    CHECK(strcmp(matches(ix, "dev/500/alarm", &h), "500,1000") == 0);
    CHECK(strcmp(matches(ix, "dev/5000/alarm", &h), "1000") == 0);
    CHECK(strcmp(matches(ix, "dev/5000/a", &h), "") == 0);
    CHECK(strcmp(matches(ix, "dev/500", &h), "") == 0);
    CHECK(rt_rule_index_bytes(ix) > 2000 * sizeof(uint32_t));
    long n = check_scale(1000000);
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        rt_rule_index_match(ix, "dev/nomatch/a", 13, &h);
    double dt = now_s() - t0;
    printf("rule index: 1001 rules, %zu bytes; a miss costs %.0f ns\n", rt_rule_index_bytes(ix),
           dt / (double)n * 1e9);
    rt_rule_hits_free(&h);
    rt_rule_index_free(ix);
}

/*
** A random filter or topic over a small alphabet of levels, so that they meet often; never
** empty, which is neither (a topic's levels come from a valid PUBLISH).
*/
static void random_levels(char *out, size_t cap, bool filter)
{
    static const char *const levels[] = {"a", "b", "$s", "", "c"};
    size_t k = 0, n = 1 + rnd() % 4;
    for (size_t i = 0; i < n && k + 8 < cap; i++) {
        if (i)
            out[k++] = '/';
        uint64_t r = rnd() % 8;
        const char *l = filter && r == 6 ? "+" : filter && r == 7 ? "#" : levels[r % 5];
        k += (size_t)snprintf(out + k, cap - k, "%s", l);
        if (l[0] == '#')
            break;
    }
    if (k == 0)
        out[k++] = 'c';
    out[k] = 0;
}

/* Random filters and topics: the index agrees with a plain matcher on every pair. */
static void test_against_plain_matcher(void)
{
    enum { FILTERS = 200, TOPICS = 2000 };
    static char filters[FILTERS][64];
    const char *fs[FILTERS];
    for (int i = 0; i < FILTERS; i++) {
        random_levels(filters[i], sizeof(filters[i]), true);
        fs[i] = filters[i];
    }
    rt_rule_index_t *ix = index_of(fs, FILTERS);
    rt_rule_hits_t h = {0};
    int wrong = 0;
    for (int t = 0; t < TOPICS; t++) {
        char topic[64];
        random_levels(topic, sizeof(topic), false);
        CHECK_EQ(rt_rule_index_match(ix, topic, strlen(topic), &h), 0);
        size_t k = 0;
        for (uint32_t i = 0; i < FILTERS; i++) {
            bool want = rt_topic_matches(fs[i], strlen(fs[i]), topic, strlen(topic));
            bool got = k < h.n && h.rules[k] == i;
            k += got;
            if (want != got && wrong++ < 10)
                fprintf(stderr, "  \"%s\" on \"%s\": index %d, plain %d\n", fs[i], topic, got,
                        want);
        }
        CHECK_EQ(k, h.n);
    }
    CHECK_EQ(wrong, 0);
    rt_rule_hits_free(&h);
    rt_rule_index_free(ix);
}

static rt_rule_index_t *shared_ix;
static atomic_long shared_wrong;

static void *match_a_lot(void *arg)
{
    rt_rule_hits_t h = {0};
    long n = check_scale(100000);
    char topic[32];
    for (long i = 0; i < n; i++) {
        unsigned dev = (unsigned)((i * 7 + (long)(uintptr_t)arg) % 150);
        snprintf(topic, sizeof(topic), "dev/%u/x/y", dev);
        /* dev/N/x/# for N < 100, plus "#" (rule 100). */
        size_t want = dev < 100 ? 2 : 1;
        if (rt_rule_index_match(shared_ix, topic, strlen(topic), &h) != 0 || h.n != want ||
            (want == 2 && h.rules[0] != dev) || h.rules[want - 1] != 100)
            atomic_fetch_add(&shared_wrong, 1);
    }
    rt_rule_hits_free(&h);
    return NULL;
}

/* The index is read without locks: threads matching at once all get the right rules. */
static void test_threads(void)
{
    CHECK_EQ(rt_rule_index_new(&shared_ix), 0);
    char f[32];
    for (uint32_t i = 0; i < 100; i++) {
        snprintf(f, sizeof(f), "dev/%u/x/#", i);
        CHECK_EQ(rt_rule_index_add(shared_ix, f, strlen(f), i), 0);
    }
    CHECK_EQ(rt_rule_index_add(shared_ix, "#", 1, 100), 0);
    CHECK_EQ(rt_rule_index_seal(shared_ix), 0);
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, match_a_lot, (void *)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&shared_wrong), 0);
    rt_rule_index_free(shared_ix);
}

int main(void)
{
    RUN(test_wildcards);
    RUN(test_dollar_topics);
    RUN(test_duplicates);
    RUN(test_1000_rules);
    RUN(test_against_plain_matcher);
    RUN(test_threads);
    return CHECK_SUMMARY();
}

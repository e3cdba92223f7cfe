/*
** The query semantics of rt_mongo_test (mt_match.c) on their own: MongoDB's
** equality across numeric types, arrays and missing fields, type bracketing
** of ranges, logical operators, refused operators, sort order, canonical _id
** keys and projections.
*/
#include <bson/bson.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "mt_match.h"

static bson_t *J(const char *json)
{
    bson_error_t err;
    bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &err);
    if (!b)
        fprintf(stderr, "bad JSON in test: %s: %s\n", json, err.message);
    return b;
}

/* Whether doc matches filter; a filter the checker refuses counts as no match. */
static bool m(const char *filter, const char *doc)
{
    char err[256];
    bson_t *f = J(filter), *d = J(doc);
    bool ok = f && d && mt_filter_check(f, err, sizeof err) == 0 && mt_filter_match(f, d);
    bson_destroy(f);
    bson_destroy(d);
    return ok;
}

static bool refused(const char *filter)
{
    char err[256] = "";
    bson_t *f = J(filter);
    bool r = f && mt_filter_check(f, err, sizeof err) == RT_EINVAL && err[0];
    bson_destroy(f);
    return r;
}

static void test_equality(void)
{
    CHECK(m("{\"a\": 1}", "{\"a\": 1.0}"));
    CHECK(m("{\"a\": 1}", "{\"a\": {\"$numberLong\": \"1\"}}"));
    CHECK(!m("{\"a\": 1}", "{\"a\": \"1\"}"));
    CHECK(!m("{\"a\": 1}", "{\"a\": 1.5}"));
    CHECK(m("{\"a\": 2}", "{\"a\": [1, 2, 3]}"));
    CHECK(m("{\"a\": [1, 2]}", "{\"a\": [1, 2]}"));
    CHECK(!m("{\"a\": [2, 1]}", "{\"a\": [1, 2]}"));
    CHECK(m("{\"a\": null}", "{\"b\": 1}"));
    CHECK(m("{\"a\": null}", "{\"a\": null}"));
    CHECK(!m("{\"a\": null}", "{\"a\": 0}"));
    CHECK(m("{\"a.b\": 5}", "{\"a\": {\"b\": 5}}"));
    CHECK(m("{\"a\": {\"x\": 1, \"y\": 2}}", "{\"a\": {\"x\": 1, \"y\": 2.0}}"));
    CHECK(!m("{\"a\": {\"x\": 1}}", "{\"a\": {\"x\": 1, \"y\": 2}}"));
    CHECK(m("{\"s\": \"abc\", \"n\": 3}", "{\"n\": 3, \"s\": \"abc\"}"));
    CHECK(!m("{\"s\": \"abc\", \"n\": 4}", "{\"n\": 3, \"s\": \"abc\"}"));
    CHECK(m("{}", "{\"anything\": true}"));
    CHECK(m("{\"_id\": {\"$oid\": \"0123456789abcdef01234567\"}}",
            "{\"_id\": {\"$oid\": \"0123456789abcdef01234567\"}}"));
    CHECK(m("{\"x\": {\"$numberDouble\": \"NaN\"}}", "{\"x\": {\"$numberDouble\": \"NaN\"}}"));
}

static void test_operators(void)
{
    CHECK(m("{\"a\": {\"$gt\": 1}}", "{\"a\": 2}"));
    CHECK(!m("{\"a\": {\"$gt\": 1}}", "{\"a\": 1}"));
    CHECK(m("{\"a\": {\"$gte\": 1}}", "{\"a\": 1.0}"));
    CHECK(!m("{\"a\": {\"$gt\": 1}}", "{\"a\": \"z\"}")); /* no comparison across types */
    CHECK(!m("{\"a\": {\"$lt\": 1}}", "{\"b\": 0}"));
    CHECK(m("{\"a\": {\"$gt\": 1, \"$lt\": 3}}", "{\"a\": 2.5}"));
    CHECK(!m("{\"a\": {\"$gt\": 1, \"$lt\": 3}}", "{\"a\": 3}"));
    CHECK(m("{\"a\": {\"$lte\": 0}}", "{\"a\": [5, 0]}"));
    CHECK(m("{\"s\": {\"$gt\": \"abc\"}}", "{\"s\": \"abd\"}"));
    CHECK(m("{\"t\": {\"$lt\": {\"$date\": \"2024-01-02T00:00:00Z\"}}}",
            "{\"t\": {\"$date\": \"2024-01-01T00:00:00Z\"}}"));
    CHECK(m("{\"a\": {\"$in\": [5, \"x\"]}}", "{\"a\": \"x\"}"));
    CHECK(!m("{\"a\": {\"$in\": [5, \"x\"]}}", "{\"a\": 6}"));
    CHECK(m("{\"a\": {\"$in\": [null]}}", "{}"));
    CHECK(!m("{\"a\": {\"$nin\": [5, \"x\"]}}", "{\"a\": \"x\"}"));
    CHECK(m("{\"a\": {\"$ne\": 1}}", "{\"b\": 1}"));
    CHECK(!m("{\"a\": {\"$ne\": 1}}", "{\"a\": [0, 1]}"));
    CHECK(m("{\"a\": {\"$eq\": 1}}", "{\"a\": 1}"));
    CHECK(m("{\"a\": {\"$exists\": false}}", "{\"b\": 1}"));
    CHECK(m("{\"a\": {\"$exists\": true}}", "{\"a\": null}"));
    CHECK(m("{\"$or\": [{\"a\": 1}, {\"b\": 2}]}", "{\"b\": 2}"));
    CHECK(!m("{\"$nor\": [{\"a\": 1}, {\"b\": 2}]}", "{\"b\": 2}"));
    CHECK(m("{\"$and\": [{\"a\": 1}, {\"b\": {\"$gt\": 1}}]}", "{\"a\": 1, \"b\": 2}"));
    CHECK(!m("{\"$and\": [{\"a\": 1}, {\"b\": {\"$gt\": 1}}]}", "{\"a\": 1, \"b\": 1}"));
}

static void test_refused(void)
{
    CHECK(refused("{\"$where\": \"1\"}"));
    CHECK(refused("{\"a\": {\"$regex\": \"x\"}}"));
    CHECK(refused("{\"a\": {\"$regularExpression\": {\"pattern\": \"x\", \"options\": \"\"}}}"));
    CHECK(refused("{\"a\": {\"$foo\": 1}}"));
    CHECK(refused("{\"a\": {\"$gt\": 1, \"b\": 2}}"));
    CHECK(refused("{\"$or\": []}"));
    CHECK(refused("{\"$or\": [1]}"));
    CHECK(refused("{\"a\": {\"$in\": 5}}"));
    char deep[2048] = "";
    for (int i = 0; i < 40; i++)
        strcat(deep, "{\"$or\": [");
    strcat(deep, "{}");
    for (int i = 0; i < 40; i++)
        strcat(deep, "]}");
    CHECK(refused(deep));
}

static int cmp_json(const char *a, const char *b)
{
    bson_t *x = J(a), *y = J(b);
    bson_iter_t ix, iy;
    int c = 99;
    if (x && y && bson_iter_init(&ix, x) && bson_iter_next(&ix) && bson_iter_init(&iy, y) &&
        bson_iter_next(&iy))
        c = mt_value_cmp(&ix, &iy);
    bson_destroy(x);
    bson_destroy(y);
    return c < 0 ? -1 : c > 0;
}

static void test_order(void)
{
    /* MinKey < null < numbers < strings < objects < arrays < ObjectId < bool < date < MaxKey */
    const char *order[] = {"{\"v\": {\"$minKey\": 1}}",
                           "{\"v\": null}",
                           "{\"v\": -5}",
                           "{\"v\": 2.5}",
                           "{\"v\": {\"$numberLong\": \"3\"}}",
                           "{\"v\": \"\"}",
                           "{\"v\": \"a\"}",
                           "{\"v\": \"ab\"}",
                           "{\"v\": {}}",
                           "{\"v\": {\"a\": 1}}",
                           "{\"v\": []}",
                           "{\"v\": {\"$oid\": \"000000000000000000000001\"}}",
                           "{\"v\": false}",
                           "{\"v\": true}",
                           "{\"v\": {\"$date\": \"2024-01-01T00:00:00Z\"}}",
                           "{\"v\": {\"$maxKey\": 1}}"};
    int n = sizeof order / sizeof order[0];
    bool sorted = true;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            sorted &= cmp_json(order[i], order[j]) == (i < j ? -1 : i > j);
    CHECK(sorted);
    CHECK_EQ(cmp_json("{\"v\": {\"$numberDouble\": \"NaN\"}}", "{\"v\": -1e308}"), -1);
    CHECK_EQ(
        cmp_json("{\"v\": {\"$numberLong\": \"9007199254740993\"}}", "{\"v\": 9007199254740992.0}"),
        1);
}

static void test_sort(void)
{
    char err[256];
    int natural;
    bson_t *s = J("{\"a\": -1, \"b\": 1}"), *nat = J("{\"$natural\": -1}"), *bad = J("{\"a\": 2}");
    bson_t *x = J("{\"a\": 1, \"b\": 1}"), *y = J("{\"a\": 1, \"b\": 2}"), *z = J("{\"b\": 0}");
    CHECK_EQ(mt_sort_check(s, &natural, err, sizeof err), 0);
    CHECK_EQ(natural, 0);
    CHECK_EQ(mt_sort_check(nat, &natural, err, sizeof err), 0);
    CHECK_EQ(natural, -1);
    CHECK_EQ(mt_sort_check(bad, &natural, err, sizeof err), RT_EINVAL);
    CHECK(mt_sort_cmp(s, x, y) < 0); /* a ties, b ascending */
    CHECK(mt_sort_cmp(s, z, x) > 0); /* missing a sorts as null, last when descending */
    bson_destroy(s);
    bson_destroy(nat);
    bson_destroy(bad);
    bson_destroy(x);
    bson_destroy(y);
    bson_destroy(z);
}

/* The canonical _id key of the first value of json, as a string of hex for comparison. */
static void key_of(const char *json, char *hex)
{
    uint8_t key[MT_KEY_MAX];
    size_t len = 0;
    bson_t *b = J(json);
    bson_iter_t it;
    hex[0] = 0;
    if (b && bson_iter_init(&it, b) && bson_iter_next(&it) && !mt_id_key(&it, key, &len))
        for (size_t i = 0; i < len; i++)
            sprintf(hex + 2 * i, "%02x", key[i]);
    bson_destroy(b);
}

static void test_id_key(void)
{
    static char a[2 * MT_KEY_MAX + 1], b[2 * MT_KEY_MAX + 1];
    key_of("{\"_id\": 1}", a);
    key_of("{\"_id\": 1.0}", b);
    CHECK(a[0] && !strcmp(a, b));
    key_of("{\"_id\": {\"$numberLong\": \"1\"}}", b);
    CHECK(!strcmp(a, b));
    key_of("{\"_id\": 1.5}", b);
    CHECK(b[0] && strcmp(a, b));
    key_of("{\"_id\": \"1\"}", b);
    CHECK(b[0] && strcmp(a, b));
    key_of("{\"_id\": {\"$oid\": \"000000000000000000000001\"}}", a);
    key_of("{\"_id\": {\"$oid\": \"000000000000000000000002\"}}", b);
    CHECK(a[0] && b[0] && strcmp(a, b));

    char big[2100] = "{\"_id\": \"";
    memset(big + 9, 'x', 2000);
    strcpy(big + 2009, "\"}");
    key_of(big, a);
    CHECK(a[0] == 0); /* too long for a key */

    uint8_t key[MT_KEY_MAX];
    size_t len;
    bson_t *f = J("{\"_id\": 7}"), *g = J("{\"_id\": {\"$gt\": 7}}"),
           *h = J("{\"_id\": 7, \"x\": 1}");
    CHECK(mt_filter_id_key(f, key, &len));
    CHECK(!mt_filter_id_key(g, key, &len));
    CHECK(!mt_filter_id_key(h, key, &len));
    bson_destroy(f);
    bson_destroy(g);
    bson_destroy(h);
}

/* The projection of doc as relaxed JSON without spaces, or "refused". */
static void project(const char *proj, const char *doc, char *out, size_t cap)
{
    char err[256];
    bson_t *p = J(proj), *d = J(doc), r = BSON_INITIALIZER;
    if (mt_projection_check(p, err, sizeof err)) {
        snprintf(out, cap, "refused");
    } else {
        mt_project(p, d, &r);
        char *json = bson_as_relaxed_extended_json(&r, NULL);
        size_t k = 0;
        for (const char *c = json; *c && k + 1 < cap; c++)
            if (*c != ' ')
                out[k++] = *c;
        out[k] = 0;
        bson_free(json);
    }
    bson_destroy(&r);
    bson_destroy(p);
    bson_destroy(d);
}

static void test_projection(void)
{
    char out[256];
    const char *doc = "{\"_id\": 1, \"a\": 2, \"b\": 3}";
    project("{\"a\": 1}", doc, out, sizeof out);
    CHECK(!strcmp(out, "{\"_id\":1,\"a\":2}"));
    project("{\"_id\": 0, \"a\": true}", doc, out, sizeof out);
    CHECK(!strcmp(out, "{\"a\":2}"));
    project("{\"b\": 0}", doc, out, sizeof out);
    CHECK(!strcmp(out, "{\"_id\":1,\"a\":2}"));
    project("{\"_id\": 0}", doc, out, sizeof out);
    CHECK(!strcmp(out, "{\"a\":2,\"b\":3}"));
    project("{\"_id\": 1}", doc, out, sizeof out);
    CHECK(!strcmp(out, "{\"_id\":1}"));
    project("{\"a\": 1, \"b\": 0}", doc, out, sizeof out);
    CHECK(!strcmp(out, "refused"));
    project("{\"a.b\": 1}", doc, out, sizeof out);
    CHECK(!strcmp(out, "refused"));
    project("{\"a\": {\"$slice\": 1}}", doc, out, sizeof out);
    CHECK(!strcmp(out, "refused"));
}

int main(void)
{
    RUN(test_equality);
    RUN(test_operators);
    RUN(test_refused);
    RUN(test_order);
    RUN(test_sort);
    RUN(test_id_key);
    RUN(test_projection);
    return CHECK_SUMMARY();
}

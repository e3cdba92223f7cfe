/*
** Topic syntax (actors/mqtt/topic.h) against an oracle written here from the MQTT 5 text
** alone (§1.5.4, §4.7, §4.8.2), built differently on purpose: strings are cut into arrays of
** levels first, and matching is the spec's recursive definition over those arrays. The two
** are run over generated names and filters (wildcards in and around levels, '$' levels,
** empty levels, '/' at the ends, NUL, bytes that are not UTF-8, "$share/" forms, long
** strings) from a fixed seed, over the spec's own examples, and through the decoder, whose
** SUBSCRIBE and PUBLISH must refuse exactly what the oracle (plus its own UTF-8 reading of
** RFC 3629) refuses.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mqtt_codec.h"
#include "topic.h"

/* ---------------------------------------------------------------- the oracle */

#define O_MAX_LEVELS 64
#define O_MAX_LEN 65535

typedef struct {
    const char *p[O_MAX_LEVELS];
    size_t n[O_MAX_LEVELS];
    int count;
} levels_t;

/* §4.7.1.1: '/' separates levels; "a//b" and "/a" have empty ones. */
static bool o_split(const char *s, size_t len, levels_t *l)
{
    l->count = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '/')
            continue;
        if (l->count == O_MAX_LEVELS)
            return false;
        l->p[l->count] = s + start;
        l->n[l->count++] = i - start;
        start = i + 1;
    }
    return true;
}

static bool o_has(const char *s, size_t n, char c)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == c)
            return true;
    return false;
}

static bool o_level_is(const levels_t *l, int i, const char *w)
{
    return l->n[i] == strlen(w) && memcmp(l->p[i], w, l->n[i]) == 0;
}

/* §4.7.3: at least one character, at most 65535 bytes, no U+0000 (§1.5.4). */
static bool o_string_ok(const char *s, size_t len)
{
    return len >= 1 && len <= O_MAX_LEN && !o_has(s, len, '\0');
}

/* §3.3.2.1, §4.7.1: a Topic Name holds no wildcard characters. */
static bool o_name(const char *s, size_t len)
{
    return o_string_ok(s, len) && !o_has(s, len, '+') && !o_has(s, len, '#');
}

/* §4.7.1.2, §4.7.1.3: '#' alone as the last level, '+' alone as any level. */
static bool o_plain_filter(const char *s, size_t len)
{
    levels_t l;
    if (!o_string_ok(s, len) || !o_split(s, len, &l))
        return false;
    for (int i = 0; i < l.count; i++) {
        bool wild = o_has(l.p[i], l.n[i], '+') || o_has(l.p[i], l.n[i], '#');
        if (wild && !o_level_is(&l, i, "+") && !o_level_is(&l, i, "#"))
            return false;
        if (o_level_is(&l, i, "#") && i != l.count - 1)
            return false;
    }
    return true;
}

/*
** §4.8.2: "$share/{ShareName}/{filter}": the ShareName is at least one character and holds no
** '/', '+' or '#'; a '/' and a Topic Filter follow it. Sets *group (NULL if not shared) and
** *filter.
*/
static bool o_filter(const char *s, size_t len, const char **group, size_t *glen,
                     const char **filter, size_t *flen)
{
    *group = NULL;
    *glen = 0;
    *filter = s;
    *flen = len;
    if (len > O_MAX_LEN)
        return false;
    if (len >= 7 && strncmp(s, "$share/", 7) == 0) {
        size_t end = 7;
        while (end < len && s[end] != '/')
            end++;
        if (end == 7 || end == len)
            return false;
        if (o_has(s + 7, end - 7, '+') || o_has(s + 7, end - 7, '#') || o_has(s + 7, end - 7, '\0'))
            return false;
        *group = s + 7;
        *glen = end - 7;
        *filter = s + end + 1;
        *flen = len - end - 1;
    }
    return o_plain_filter(*filter, *flen);
}

/* §4.7.1: the filter's levels from fi on match the topic's from ti on. */
static bool o_match_levels(const levels_t *f, int fi, const levels_t *t, int ti)
{
    if (fi == f->count)
        return ti == t->count;
    if (o_level_is(f, fi, "#")) /* the rest, none included: "a/#" matches "a" */
        return true;
    if (ti == t->count)
        return false;
    if (!o_level_is(f, fi, "+") &&
        (f->n[fi] != t->n[ti] || memcmp(f->p[fi], t->p[ti], f->n[fi]) != 0))
        return false;
    return o_match_levels(f, fi + 1, t, ti + 1);
}

static bool o_matches(const char *f, size_t flen, const char *t, size_t tlen)
{
    const char *g, *pf;
    size_t glen, plen;
    levels_t fl, tl;
    if (!o_filter(f, flen, &g, &glen, &pf, &plen) || !o_name(t, tlen) || !o_split(pf, plen, &fl) ||
        !o_split(t, tlen, &tl))
        return false;
    /* §4.7.2: a filter starting with a wildcard matches no topic starting with '$'. */
    if (t[0] == '$' && (o_level_is(&fl, 0, "+") || o_level_is(&fl, 0, "#")))
        return false;
    return o_match_levels(&fl, 0, &tl, 0);
}

/* RFC 3629 §4 (the syntax of UTF-8 sequences), as §1.5.4 requires, U+0000 excluded. */
static bool o_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        uint8_t lo = 0x80, hi = 0xBF;
        size_t more;
        if (c == 0)
            return false;
        if (c < 0x80)
            more = 0;
        else if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return false;
        if (n - i - 1 < more)
            return false;
        for (size_t k = 1; k <= more; k++) {
            uint8_t b = s[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
                return false;
        }
        i += more + 1;
    }
    return true;
}

/* ---------------------------------------------------------------- generated strings */

/* Levels a generated string is made of: plain, wildcards, '$', empty, NUL, not UTF-8. */
static const char *const pieces[] = {
    "a",  "b",  "ab",  "",         "+",    "#",    "$SYS",   "$x", "a+",           "#b",
    "+#", "++", "x y", "\xc3\xa9", "\xff", "\xc3", "$share", "g",  "\xed\xa0\x80", "$"};
#define NPIECES (sizeof(pieces) / sizeof(*pieces))

/* Appends 1..6 random levels to buf at *n (with a NUL piece now and then). */
static void gen_levels(char *buf, size_t *n, size_t cap)
{
    int levels = 1 + (int)(rnd() % 6);
    for (int i = 0; i < levels && *n + 16 < cap; i++) {
        if (i)
            buf[(*n)++] = '/';
        if (rnd() % 97 == 0) {
            buf[(*n)++] = '\0';
            continue;
        }
        const char *p = pieces[rnd() % NPIECES];
        memcpy(buf + *n, p, strlen(p));
        *n += strlen(p);
    }
}

/* A filter: plain, or one of the "$share/" forms, well made or not. */
static size_t gen_filter(char *buf, size_t cap)
{
    size_t n = 0;
    switch (rnd() % 8) {
    case 0:
    case 1: { /* a shared subscription; the group may be empty or hold a wildcard */
        static const char *const groups[] = {"g", "grp", "", "g+", "#", "$g", "g h"};
        const char *g = groups[rnd() % (sizeof(groups) / sizeof(*groups))];
        n = (size_t)snprintf(buf, cap, "$share/%s", g);
        if (rnd() % 8)
            buf[n++] = '/';
        if (rnd() % 8)
            gen_levels(buf, &n, cap);
        return n;
    }
    case 2: /* "$share" as an ordinary level, or a near miss */
        n = (size_t)snprintf(buf, cap, "%s", rnd() % 2 ? "$share" : "$sharex/g");
        if (rnd() % 2) {
            buf[n++] = '/';
            gen_levels(buf, &n, cap);
        }
        return n;
    default:
        if (rnd() % 16 == 0)
            buf[n++] = '/';
        gen_levels(buf, &n, cap);
        if (rnd() % 16 == 0)
            buf[n++] = '/';
        return n;
    }
}

/* A topic that the plain filter f[0..flen) is meant to match: wildcards filled in. */
static size_t gen_topic_for(const char *f, size_t flen, char *buf, size_t cap)
{
    levels_t l;
    size_t n = 0;
    if (!o_split(f, flen, &l))
        return 0;
    for (int i = 0; i < l.count && n + 32 < cap; i++) {
        if (i)
            buf[n++] = '/';
        if (o_level_is(&l, i, "+") || o_level_is(&l, i, "#")) {
            int k = o_level_is(&l, i, "#") ? (int)(rnd() % 3) : 1;
            if (k == 0 && n) /* '#' taking no level: "a/#" -> "a" */
                n--;
            for (int j = 0; j < k; j++) {
                const char *p = j == 0 && rnd() % 4 == 0 ? "$y" : pieces[rnd() % 4];
                n += (size_t)snprintf(buf + n, cap - n, "%s%s", j ? "/" : "", p);
            }
        } else {
            memcpy(buf + n, l.p[i], l.n[i]);
            n += l.n[i];
        }
    }
    return n;
}

/* ---------------------------------------------------------------- the comparisons */

static long mismatches;

static void report(const char *what, const char *a, size_t an, const char *b, size_t bn)
{
    if (mismatches++ < 10)
        fprintf(stderr, "  %s: \"%.*s\" (%zu) \"%.*s\" (%zu)\n", what, (int)an, a, an, (int)bn, b,
                bn);
}

static void compare_filter(const char *f, size_t n)
{
    const char *g, *pf;
    size_t glen, plen;
    bool want = o_filter(f, n, &g, &glen, &pf, &plen);
    rt_topic_filter_t sf = {0};
    bool got = rt_topic_parse_filter(f, n, &sf) == NULL;
    if (got != want || rt_topic_valid_filter(f, n) != want) {
        report(want ? "filter refused" : "filter accepted", f, n, "", 0);
        return;
    }
    if (want && (sf.group != g || sf.group_len != glen || sf.filter != pf || sf.filter_len != plen))
        report("filter split", f, n, "", 0);
    if (want && rt_topic_is_shared(f, n) != (g != NULL))
        report("is_shared", f, n, "", 0);
    /* A plain filter reading: what the ACL and rule index ask. */
    if ((rt_topic_filter_error(f, n) == NULL) != o_plain_filter(f, n))
        report("plain filter", f, n, "", 0);
}

static void compare_match(const char *f, size_t fn, const char *t, size_t tn)
{
    if (rt_topic_valid_name(t, tn) != o_name(t, tn))
        report("name", t, tn, "", 0);
    if (rt_topic_matches(f, fn, t, tn) != o_matches(f, fn, t, tn))
        report("match", f, fn, t, tn);
}

static void test_generated(void)
{
    long rounds = check_scale(200000), positives = 0, valid = 0;
    char f[256], t[256];
    mismatches = 0;
    for (long r = 0; r < rounds; r++) {
        size_t fn = gen_filter(f, sizeof(f));
        compare_filter(f, fn);
        const char *g, *pf;
        size_t glen, plen;
        bool fvalid = o_filter(f, fn, &g, &glen, &pf, &plen);
        valid += fvalid;
        /* Half the topics are built to match (when the filter is valid), half are random. */
        size_t tn = 0;
        if (fvalid && rnd() % 2)
            tn = gen_topic_for(pf, plen, t, sizeof(t));
        else
            gen_levels(t, &tn, sizeof(t));
        compare_match(f, fn, t, tn);
        positives += o_matches(f, fn, t, tn);
        /* The topic read as a filter too, and a filter against itself. */
        compare_filter(t, tn);
        compare_match(f, fn, f, fn);
    }
    CHECK_EQ(mismatches, 0);
    /* The generator reaches both sides of every question. */
    CHECK(valid > rounds / 10 && valid < rounds - rounds / 10);
    CHECK(positives > rounds / 10);
}

/* Lengths at the edge of MQTT's two-byte string length, and levels beyond the edges. */
static void test_long(void)
{
    size_t cap = 70000;
    char *s = malloc(cap);
    CHECK(s != NULL);
    if (!s)
        return;
    memset(s, 'a', cap);
    for (size_t i = 1; i < cap; i += 2000) /* levels of 2 KB, so the oracle can hold them */
        s[i] = '/';
    mismatches = 0;
    static const size_t lens[] = {1, 2, 65533, 65534, 65535, 65536, 69999};
    for (size_t i = 0; i < sizeof(lens) / sizeof(*lens); i++) {
        size_t n = lens[i];
        compare_filter(s, n);
        if (rt_topic_valid_name(s, n) != o_name(s, n))
            report("long name", s, 8, "", 0);
        /* An exact match of the longest name, and '#' under it. */
        if (rt_topic_matches(s, n, s, n) != (n <= O_MAX_LEN))
            report("long self match", s, 8, "", 0);
    }
    s[65533] = '/';
    s[65534] = '#';
    CHECK(rt_topic_valid_filter(s, 65535));
    CHECK(rt_topic_matches(s, 65535, s, 65533));
    CHECK(!rt_topic_valid_name(s, 65535));
    CHECK_EQ(mismatches, 0);
    free(s);
}

/* A forbidden byte at every position of names of every length up to 100 (blocks and tails). */
static void test_every_position(void)
{
    char s[100];
    mismatches = 0;
    for (size_t n = 1; n <= sizeof(s); n++) {
        for (size_t p = 0; p < n; p++) {
            for (const char *c = "+#\0/$"; c < "+#\0/$" + 5; c++) {
                memset(s, 'a', n);
                s[p] = *c;
                if (rt_topic_valid_name(s, n) != o_name(s, n))
                    report("name", s, n, "", 0);
            }
        }
    }
    CHECK_EQ(mismatches, 0);
}

typedef struct {
    const char *filter, *topic;
    bool match;
} example_t;

/* The examples of MQTT 5 §4.7.1.2, §4.7.1.3, §4.7.2 and §4.8.2, each asked of both. */
static void test_spec_examples(void)
{
    static const example_t ex[] = {
        {"sport/tennis/player1/#", "sport/tennis/player1", true},
        {"sport/tennis/player1/#", "sport/tennis/player1/ranking", true},
        {"sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", true},
        {"sport/#", "sport", true},
        {"#", "sport/tennis", true},
        {"sport/tennis/+", "sport/tennis/player1", true},
        {"sport/tennis/+", "sport/tennis/player2", true},
        {"sport/tennis/+", "sport/tennis/player1/ranking", false},
        {"sport/+", "sport", false},
        {"sport/+", "sport/", true},
        {"+/+", "/finance", true},
        {"/+", "/finance", true},
        {"+", "/finance", false},
        {"#", "$SYS/monitor/Clients", false},
        {"+/monitor/Clients", "$SYS/monitor/Clients", false},
        {"$SYS/#", "$SYS/monitor/Clients", true},
        {"$SYS/monitor/+", "$SYS/monitor/Clients", true},
        {"$share/consumer1/sport/tennis/+", "sport/tennis/player1", true},
        {"$share/consumer2/sport/tennis/+", "sport/tennis/player1/ranking", false},
        {"$share/g/#", "$SYS/x", false},
        {"$share/g/$SYS/#", "$SYS/x", true},
        {"ACCOUNTS", "Accounts", false}, /* §4.7.3: case sensitive */
        {"a/+", "a/+", false},           /* not a topic name */
    };
    for (size_t i = 0; i < sizeof(ex) / sizeof(*ex); i++) {
        const example_t *e = &ex[i];
        size_t fn = strlen(e->filter), tn = strlen(e->topic);
        CHECK_EQ(rt_topic_matches(e->filter, fn, e->topic, tn), e->match);
        CHECK_EQ(o_matches(e->filter, fn, e->topic, tn), e->match);
    }
    static const char *const good[] = {
        "#",  "sport/tennis/#", "+",      "+/tennis/#", "sport/+/player1",
        "/+", "$SYS/#",         "$share", "$sharex/g",  "$share/g/#"};
    static const char *const bad[] = {"sport/tennis#", "sport/tennis/#/ranking",
                                      "sport+",        "",
                                      "$share/g",      "$share//a",
                                      "$share/g/",     "$share/g+/a",
                                      "$share/g#/a",   "$share/g/a#"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        CHECK(rt_topic_valid_filter(good[i], strlen(good[i])));
        compare_filter(good[i], strlen(good[i]));
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        CHECK(!rt_topic_valid_filter(bad[i], strlen(bad[i])));
        compare_filter(bad[i], strlen(bad[i]));
    }
    CHECK(rt_topic_valid_name("/", 1));
    CHECK(rt_topic_valid_name("a//b", 4));
    CHECK(!rt_topic_valid_name("", 0));
    CHECK(!rt_topic_valid_name("a\0b", 3));
    CHECK(!rt_topic_valid_name(NULL, 0));
    CHECK(!rt_topic_valid_filter(NULL, 0));
}

/* A SUBSCRIBE (v5, one filter) or PUBLISH (v5, QoS 0) of s[0..n); the packet's length. */
static size_t packet(uint8_t *out, bool subscribe, const char *s, size_t n)
{
    size_t body = 2 + n + (subscribe ? 2 + 1 + 1 : 1);
    size_t k = 0;
    out[k++] = subscribe ? 0x82 : 0x30;
    for (size_t v = body;; v >>= 7) { /* Variable Byte Integer (§1.5.5) */
        out[k++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        if (v <= 0x7F)
            break;
    }
    if (subscribe) { /* packet id, no properties, the filter and its options (QoS 1) */
        out[k++] = 0;
        out[k++] = 1;
        out[k++] = 0;
    }
    out[k++] = (uint8_t)(n >> 8);
    out[k++] = (uint8_t)n;
    memcpy(out + k, s, n);
    k += n;
    out[k++] = subscribe ? 0x01 : 0; /* PUBLISH: no properties, an empty payload */
    return k;
}

/* The decoder refuses exactly the filters and names that are not UTF-8 or not valid syntax. */
static void test_decoder(void)
{
    long rounds = check_scale(50000), refused = 0;
    char s[256];
    uint8_t pkt[300];
    mismatches = 0;
    for (long r = 0; r < rounds; r++) {
        size_t n = rnd() % 2 ? gen_filter(s, sizeof(s)) : 0;
        if (!n)
            gen_levels(s, &n, sizeof(s));
        bool utf8 = o_utf8((const uint8_t *)s, n);
        const char *g, *pf;
        size_t glen, plen;
        mqtt_packet_t pk;
        size_t len = packet(pkt, true, s, n);
        bool want = utf8 && o_filter(s, n, &g, &glen, &pf, &plen);
        if ((mqtt_decode(pkt, len, MQTT_V5, &pk) == 0) != want)
            report(want ? "SUBSCRIBE refused" : "SUBSCRIBE accepted", s, n, "", 0);
        refused += !want;
        len = packet(pkt, false, s, n);
        want = utf8 && o_name(s, n);
        if ((mqtt_decode(pkt, len, MQTT_V5, &pk) == 0) != want)
            report(want ? "PUBLISH refused" : "PUBLISH accepted", s, n, "", 0);
    }
    CHECK_EQ(mismatches, 0);
    CHECK(refused > rounds / 10 && refused < rounds - rounds / 10);
}

int main(void)
{
    RUN(test_spec_examples);
    RUN(test_generated);
    RUN(test_long);
    RUN(test_every_position);
    RUN(test_decoder);
    return CHECK_SUMMARY();
}

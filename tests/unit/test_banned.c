/*
** The banned list (actors/broker/banned.c) on its own: each kind of ban matching what it
** names and nothing else, address ranges kept as ranges, replacing and deleting, bans that
** ran out, the max_banned bound, a list grown past its first buckets, and flapping detection
** banning the client id whose connect makes flapping_max_connects.
*/
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h"
#include "broker.h"
#include "check.h"
#include "config.h"

static rt_ban_t ban(rt_ban_kind_t kind, const char *value, int64_t until_s)
{
    return (rt_ban_t){.kind = kind,
                      .value = value,
                      .len = strlen(value),
                      .by = "test",
                      .reason = "because",
                      .at_s = (int64_t)time(NULL),
                      .until_s = until_s};
}

static int add(rt_ban_kind_t kind, const char *value, int64_t until_s)
{
    char err[128];
    rt_ban_t b = ban(kind, value, until_s);
    return rt_banned_add(&b, err, sizeof(err));
}

static rt_auth_addr_t addr(const char *text)
{
    rt_auth_addr_t a;
    CHECK_EQ(rt_auth_addr_parse(text, &a), 0);
    return a;
}

/* The kind of the ban that matches (-1: none). */
static int matched(const char *cid, const char *user, const char *peer)
{
    rt_ban_t hit;
    char buf[128];
    rt_auth_addr_t a = peer ? addr(peer) : (rt_auth_addr_t){{0}};
    if (!rt_banned_match(cid, strlen(cid), user, user ? strlen(user) : 0, peer ? &a : NULL, &hit,
                         buf, sizeof(buf)))
        return -1;
    CHECK(strcmp(hit.reason, "because") == 0 && hit.len == strlen(hit.value));
    return (int)hit.kind;
}

static void set_live(_Atomic long *field, long v)
{
    atomic_store(field, v);
}

static void test_each_kind_matches_its_own(void)
{
    CHECK_EQ(matched("c1", "u1", "10.1.2.3"), -1); /* empty: nothing is banned */
    CHECK_EQ(add(RT_BAN_CLIENTID, "c1", 0), 0);
    CHECK_EQ(add(RT_BAN_USERNAME, "u1", 0), 0);
    CHECK_EQ(add(RT_BAN_ADDRESS, "10.1.0.0/16", 0), 0);
    CHECK_EQ(add(RT_BAN_ADDRESS, "2001:db8::/32", 0), 0);
    CHECK_EQ(matched("c1", NULL, NULL), RT_BAN_CLIENTID);
    CHECK_EQ(matched("c2", "u1", NULL), RT_BAN_USERNAME);
    CHECK_EQ(matched("c2", "u2", "10.1.200.7"), RT_BAN_ADDRESS);
    CHECK_EQ(matched("c2", "u2", "2001:db8:1::5"), RT_BAN_ADDRESS);
    CHECK_EQ(matched("c2", "u2", "10.2.0.1"), -1);
    CHECK_EQ(matched("c2", "u2", "2001:db9::1"), -1);
    /* A client id is not a user name, nor the other way round. */
    CHECK_EQ(matched("u1", "c1", NULL), -1);
    CHECK_EQ(rt_banned_count(), 4u);
    rt_banned_free();
    CHECK_EQ(rt_banned_count(), 0u);
}

static void keep_value(const rt_ban_t *b, void *arg)
{
    snprintf(arg, 64, "%.*s %s", (int)b->len, b->value, b->reason);
}

static void test_ranges_replacing_and_deleting(void)
{
    char seen[64] = "";
    CHECK_EQ(add(RT_BAN_ADDRESS, "10.1.2.3/16", 0), 0);
    rt_banned_each(keep_value, seen);
    CHECK(strcmp(seen, "10.1.0.0/16 because") == 0);    /* a range, as it reads */
    CHECK_EQ(add(RT_BAN_ADDRESS, "10.1.9.9/16", 0), 0); /* the same range: replaced */
    CHECK_EQ(rt_banned_count(), 1u);
    CHECK_EQ(rt_banned_del(RT_BAN_ADDRESS, "10.1.0.0/16", 11), 0);
    CHECK_EQ(rt_banned_del(RT_BAN_ADDRESS, "10.1.0.0/16", 11), RT_ENOTFOUND);
    CHECK_EQ(add(RT_BAN_ADDRESS, "10.1.2.300", 0), RT_EINVAL);
    CHECK_EQ(add(RT_BAN_ADDRESS, "10.1.2.3/33", 0), RT_EINVAL);
    CHECK_EQ(rt_banned_del(RT_BAN_ADDRESS, "nope", 4), RT_EINVAL);
    CHECK_EQ(add(RT_BAN_CLIENTID, "", 0), RT_EINVAL);
    char err[128];
    rt_ban_t b = ban(RT_BAN_CLIENTID, "x", 0);
    b.len = 3; /* a NUL inside: no MQTT string has one */
    b.value = "x\0y";
    CHECK_EQ(rt_banned_add(&b, err, sizeof(err)), RT_EINVAL);
    /* A second add of one client id replaces the first (its reason, its expiry). */
    CHECK_EQ(add(RT_BAN_CLIENTID, "same", 0), 0);
    b = ban(RT_BAN_CLIENTID, "same", 0);
    b.reason = "again";
    CHECK_EQ(rt_banned_add(&b, err, sizeof(err)), 0);
    CHECK_EQ(rt_banned_count(), 1u);
    rt_banned_each(keep_value, seen);
    CHECK(strcmp(seen, "same again") == 0);
    rt_banned_free();
}

static void test_ran_out_and_the_bound(void)
{
    int64_t now = (int64_t)time(NULL);
    set_live(&rt_broker->live.max_banned, 3);
    CHECK_EQ(add(RT_BAN_CLIENTID, "old1", now - 1), 0);
    CHECK_EQ(add(RT_BAN_CLIENTID, "old2", now - 1), 0);
    CHECK_EQ(add(RT_BAN_CLIENTID, "live1", now + 3600), 0);
    /* Bans that ran out neither match nor list, and make room when the list is full. */
    CHECK_EQ(matched("old1", NULL, NULL), -1);
    CHECK_EQ(matched("live1", NULL, NULL), RT_BAN_CLIENTID);
    CHECK_EQ(rt_banned_count(), 1u);
    CHECK_EQ(add(RT_BAN_CLIENTID, "live2", 0), 0);
    CHECK_EQ(add(RT_BAN_CLIENTID, "live3", 0), 0);
    char err[128];
    rt_ban_t b = ban(RT_BAN_CLIENTID, "live4", 0);
    CHECK_EQ(rt_banned_add(&b, err, sizeof(err)), RT_ELIMIT);
    CHECK(strstr(err, "max_banned") != NULL);
    CHECK_EQ(add(RT_BAN_CLIENTID, "live3", 0), 0); /* a replacement needs no room */
    CHECK_EQ(rt_banned_del(RT_BAN_CLIENTID, "old1", 4), RT_ENOTFOUND); /* ran out, and gone */
    set_live(&rt_broker->live.max_banned, 0);
    rt_banned_free();
}

static void test_many(void)
{
    enum { N = 5000 };
    char id[32];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "dev-%d", i * 2);
        CHECK_EQ(add(i % 2 ? RT_BAN_USERNAME : RT_BAN_CLIENTID, id, 0), 0);
    }
    int wrong = 0;
    for (int i = 0; i < 2 * N; i++) {
        snprintf(id, sizeof(id), "dev-%d", i);
        int want = i % 2 ? -1 : (i / 2) % 2 ? RT_BAN_USERNAME : RT_BAN_CLIENTID;
        wrong += matched(id, id, NULL) != want;
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(rt_banned_count(), (size_t)N);
    rt_banned_free();
}

static void test_flapping(void)
{
    CHECK(!rt_banned_flapping("f", 1)); /* off by default */
    set_live(&rt_broker->live.flapping_max_connects, 3);
    set_live(&rt_broker->live.flapping_window_s, 3600);
    set_live(&rt_broker->live.flapping_ban_s, 600);
    CHECK(!rt_banned_flapping("f", 1));
    CHECK(!rt_banned_flapping("g", 1));
    CHECK(!rt_banned_flapping("f", 1));
    CHECK(rt_banned_flapping("f", 1)); /* the third within the window */
    rt_ban_t hit;
    char buf[128];
    CHECK(rt_banned_match("f", 1, NULL, 0, NULL, &hit, buf, sizeof(buf)));
    CHECK(hit.kind == RT_BAN_CLIENTID && strstr(hit.reason, "flapping") &&
          hit.until_s >= (int64_t)time(NULL) + 599);
    CHECK(!rt_banned_match("g", 1, NULL, 0, NULL, &hit, buf, sizeof(buf)));
    /* Counted afresh after a ban; an empty id is never counted. */
    CHECK(!rt_banned_flapping("f", 1));
    CHECK(!rt_banned_flapping("", 0));
    rt_banned_stats_t st;
    rt_banned_stats(&st);
    CHECK_EQ(st.flapping_bans, 1u);
    CHECK(st.refused[RT_BAN_CLIENTID] >= 1);
    set_live(&rt_broker->live.flapping_max_connects, 0);
    rt_banned_free();
}

int main(void)
{
    rt_conf_t *c = calloc(1, sizeof(*c));
    rt_conf_defaults(c);
    CHECK_EQ(rt_broker_init(c), 0);
    free(c);
    RUN(test_each_kind_matches_its_own);
    RUN(test_ranges_replacing_and_deleting);
    RUN(test_ran_out_and_the_bound);
    RUN(test_many);
    RUN(test_flapping);
    rt_broker_free();
    return CHECK_SUMMARY();
}

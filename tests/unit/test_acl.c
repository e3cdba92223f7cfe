/*
** The ACL: sections, patterns with %u/%c, deny rules, read against write,
** subscription filter coverage, '$' topics, injection through names,
** malformed files, and the reload swap under concurrent checks.
*/
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acl.h"
#include "check.h"
#include "tmpdir.h"

static rt_acl_t *acl;

static int chk(const char *user, const char *client, const char *topic, unsigned access)
{
    return rt_acl_check(acl, user, client, topic, strlen(topic), access);
}

#define R RT_ACL_READ
#define W RT_ACL_WRITE
#define S RT_ACL_SUBSCRIBE
#define ALLOW(u, c, t, a) CHECK_EQ(chk(u, c, t, a), RT_ACL_ALLOW)
#define DENY(u, c, t, a) CHECK_EQ(chk(u, c, t, a), RT_ACL_DENY)
#define FILTERED(u, c, t) CHECK_EQ(chk(u, c, t, S), RT_ACL_FILTERED)

static const char *const file = "# Anonymous clients.\n"
                                "topic read public/#\n"
                                "  topic write public/anon/+\n"
                                "\n"
                                "user alice\n"
                                "topic readwrite alice/#\n"
                                "topic read shared/+/status\n"
                                "topic deny alice/secret/#\n"
                                "topic $SYS/broker/#\n"
                                "\n"
                                "user bob smith\n"
                                "topic write bob/x\n"
                                "user root\n"
                                "topic read #\n"
                                "topic write cmd/#\n"
                                "\n"
                                "pattern read devices/%c/#\n"
                                "pattern write users/%u/out\n"
                                "pattern deny users/%u/locked\n"
                                "pattern readwrite home/%u-%c/x\n";

static void load(const char *text)
{
    char err[512];
    rt_acl_free(acl);
    acl = NULL;
    CHECK_EQ(rt_acl_load(tmpdir_put("t.acl", text), &acl, err, sizeof(err)), 0);
    if (!acl)
        fprintf(stderr, "  %s\n", err);
}

static void test_anonymous_section(void)
{
    load(file);
    ALLOW(NULL, "c", "public/a", R);
    ALLOW(NULL, "c", "public/a/b", R);
    ALLOW(NULL, "c", "public", R); /* public/# matches its parent */
    DENY(NULL, "c", "public/a", W);
    ALLOW(NULL, "c", "public/anon/x", W);
    DENY(NULL, "c", "public/anon/x/y", W);
    ALLOW(NULL, "c", "public/anon/x", R); /* by public/# */
    DENY(NULL, "c", "alice/a", R);
    DENY(NULL, "c", "other", W);
    /* Named users do not get the anonymous section. */
    DENY("alice", "c", "public/a", R);
    DENY("carol", "c", "public/a", R);
}

static void test_user_sections(void)
{
    load(file);
    ALLOW("alice", "c", "alice/a", W);
    ALLOW("alice", "c", "alice/a/b", R);
    ALLOW("alice", "c", "alice", W);
    DENY("alice", "c", "alicex", W);
    DENY("alice", "c", "bob/x", W);
    ALLOW("bob smith", "c", "bob/x", W); /* names may hold spaces */
    DENY("bob smith", "c", "bob/x", R);
    DENY("bob", "c", "bob/x", W);
    DENY("Alice", "c", "alice/a", W); /* names are case-sensitive */
    /* Read against write. */
    ALLOW("alice", "c", "shared/a/status", R);
    DENY("alice", "c", "shared/a/status", W);
    ALLOW("root", "c", "cmd/x", W);
    DENY("root", "c", "other/x", W);
    ALLOW("root", "c", "other/x", R);
}

static void test_deny_rules(void)
{
    load(file);
    DENY("alice", "c", "alice/secret", W);
    DENY("alice", "c", "alice/secret/x", R);
    ALLOW("alice", "c", "alice/secrets", W);
    /* A subscription a deny rule covers is refused; one that could also match a denied
       topic is granted, its deliveries checked one by one. */
    FILTERED("alice", "c", "alice/#");
    FILTERED("alice", "c", "alice/+/x");
    DENY("alice", "c", "alice/secret/+", S);
    DENY("alice", "c", "alice/secret/#", S);
    DENY("alice", "c", "alice/secret", S);
    ALLOW("alice", "c", "alice/public/+", S);
    ALLOW("alice", "c", "alice/public/#", S);
    /* A deny pattern applies on top of a user's own allow rules. */
    load("user alice\ntopic readwrite users/#\npattern deny users/%u/locked\n");
    ALLOW("alice", "c", "users/bob/locked", W);
    DENY("alice", "c", "users/alice/locked", W);
    FILTERED("alice", "c", "users/+/locked");
    DENY("alice", "c", "users/alice/locked", S);
    ALLOW("alice", "c", "users/+/open", S);
    /* The ACL of the MQTT interoperability suite's tests: every topic but one. */
    load("topic readwrite #\ntopic readwrite $SYS/#\ntopic deny test/nosubscribe\n");
    FILTERED(NULL, "c", "#");
    FILTERED(NULL, "c", "+/+");
    FILTERED(NULL, "c", "test/#");
    DENY(NULL, "c", "test/nosubscribe", S);
    ALLOW(NULL, "c", "test/other", S);
    ALLOW(NULL, "c", "+/+/+", S); /* three levels: the two-level deny cannot match */
    ALLOW(NULL, "c", "$SYS/#", S);
    DENY(NULL, "c", "test/nosubscribe", R);
    ALLOW(NULL, "c", "test/other", R);
    /* Two deny rules that only together cover a filter leave it granted in part. */
    load("topic read #\ntopic deny a\ntopic deny a/+/#\n");
    FILTERED(NULL, "c", "a/#");
    DENY(NULL, "c", "a/+", S);
    load("topic read a/#\ntopic deny a/+\n");
    DENY(NULL, "c", "a/x", S);
    FILTERED(NULL, "c", "a/#"); /* a and a/x/y stay readable */
    load(file);
}

static void test_subscribe_coverage(void)
{
    load("user u\ntopic read a/#\ntopic read b/+/c\ntopic write w/#\ntopic read x\n");
    ALLOW("u", "c", "a/#", S);
    ALLOW("u", "c", "a/b/+", S);
    ALLOW("u", "c", "a/+/+/#", S);
    ALLOW("u", "c", "a", S);
    FILTERED("u", "c", "#"); /* a read rule overlaps: granted, deliveries checked */
    FILTERED("u", "c", "+/b");
    FILTERED("u", "c", "b/#");
    ALLOW("u", "c", "b/+/c", S);
    ALLOW("u", "c", "b/x/c", S);
    FILTERED("u", "c", "b/+/#");
    DENY("u", "c", "b/x/c/d", S);
    DENY("u", "c", "b/x", S);
    DENY("u", "c", "w/x", S); /* write rules give no subscription */
    ALLOW("u", "c", "x", S);
    DENY("u", "c", "x/y", S);
    FILTERED("u", "c", "x/#");
    /* Shared subscriptions are checked on the filter after the group. */
    ALLOW("u", "c", "$share/g/a/b/+", S);
    FILTERED("u", "c", "$share/g/#");
    DENY("u", "c", "$share/g", S);
    DENY("u", "c", "$share//a/b", S);
    DENY("u", "c", "", S);
}

static void test_dollar_topics(void)
{
    load("user root\ntopic read #\nuser alice\ntopic read $SYS/broker/#\n");
    /* Wildcards at the first level do not reach '$' topics. */
    ALLOW("root", "c", "#", S);
    ALLOW("root", "c", "+/x", S);
    ALLOW("root", "c", "a/b", R);
    DENY("root", "c", "$SYS/broker/load", R);
    DENY("root", "c", "$SYS/#", S);
    DENY("root", "c", "$SYS/broker/+", S);
    ALLOW("alice", "c", "$SYS/broker/clients", R);
    ALLOW("alice", "c", "$SYS/broker/+", S);
    ALLOW("alice", "c", "$SYS/broker/#", S);
    FILTERED("alice", "c", "$SYS/#");
    DENY("alice", "c", "$SYS/other", R);
    /* A deny of '#' does not block '$' topics, and '+' deny does not either. */
    load("user u\ntopic read $SYS/#\ntopic deny #\n");
    ALLOW("u", "c", "$SYS/x", R);
    ALLOW("u", "c", "$SYS/#", S);
    DENY("u", "c", "a", R);
    load(file);
}

static void test_patterns(void)
{
    load(file);
    /* %c for every client, named or not. */
    ALLOW("carol", "dev1", "devices/dev1/temp", R);
    ALLOW(NULL, "dev1", "devices/dev1/temp", R);
    ALLOW("carol", "dev1", "devices/dev1/+", S);
    ALLOW("carol", "dev1", "devices/dev1/#", S);
    DENY("carol", "dev1", "devices/dev2/temp", R);
    FILTERED("carol", "dev1", "devices/+/temp");
    FILTERED("carol", "dev1", "devices/#");
    DENY("carol", "dev1", "devices/dev2/#", S);
    DENY("carol", "dev1", "devices/dev1/temp", W);
    /* %u. */
    ALLOW("carol", "c", "users/carol/out", W);
    DENY("carol", "c", "users/dave/out", W);
    DENY("carol", "c", "users/carol/outx", W);
    DENY(NULL, "c", "users//out", W); /* anonymous clients get no %u pattern */
    DENY("carol", "c", "users/carol/locked", W);
    /* Both in one level. */
    ALLOW("carol", "c9", "home/carol-c9/x", W);
    ALLOW("carol", "c9", "home/carol-c9/x", R);
    DENY("carol", "c8", "home/carol-c9/x", W);
    DENY("carol", "c9", "home/carol-c9x/x", W);
    DENY("carol", "c9", "home/carolc9/x", W);
    /* topic lines do not substitute. */
    load("user u\ntopic write lit/%u\n");
    ALLOW("u", "c", "lit/%u", W);
    DENY("u", "c", "lit/u", W);
    load(file);
}

static void test_injection(void)
{
    load(file);
    /* A user name or client id with '/', '+' or '#' must not widen an allow pattern. */
    DENY("a/b", "c", "users/a/b/out", W);
    DENY("+", "c", "users/x/out", W);
    DENY("#", "c", "users/x/out", W);
    DENY("x#", "c", "users/x#/out", W);
    DENY("c", "+", "devices/x/temp", R);
    DENY("c", "#", "devices/anything/at/all", R);
    DENY("c", "a/b", "devices/a/b/t", R);
    DENY("c", "+", "devices/+/#", S);
    /* ... and a deny pattern it could not apply safely denies everything. */
    DENY("a/b", "dev1", "devices/dev1/temp", R);
    DENY("", "dev1", "devices/dev1/temp", R);
    /* Without the deny pattern the same client keeps its %c grants. */
    load("pattern read devices/%c/#\npattern write users/%u/out\n");
    ALLOW("a/b", "dev1", "devices/dev1/temp", R);
    DENY("a/b", "dev1", "users/a/b/out", W);
    DENY("u", "", "devices//x", R); /* empty client id */
    load(file);
}

static void test_malformed(void)
{
    static const struct {
        const char *line, *reason;
    } bad[] = {
        {"topic", "the topic is empty"},
        {"topic   ", "the topic is empty"},
        {"topic raed foo", "unknown access \"raed\""},
        {"user", "user needs a name"},
        {"topic read a/#/b", "'#' must be the last level"},
        {"topic read a+/b", "must stand alone"},
        {"pattern write x/%u#", "must stand alone"},
        {"frobnicate x", "unknown keyword \"frobnicate\""},
        {"Topic read x", "unknown keyword"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[256], want[160], err[512] = "";
        snprintf(text, sizeof(text), "# c\ntopic read ok\n\n%s\ntopic read later\n", bad[i].line);
        const char *path = tmpdir_put("bad.acl", text);
        rt_acl_t *a = NULL;
        CHECK_EQ(rt_acl_load(path, &a, err, sizeof(err)), RT_EINVAL);
        CHECK(a == NULL);
        snprintf(want, sizeof(want), "%s:4: ", path);
        bool ok = strncmp(err, want, strlen(want)) == 0 && strstr(err, bad[i].reason);
        if (!ok)
            fprintf(stderr, "  case %zu: got \"%s\"\n", i, err);
        CHECK(ok);
    }
    char err[512];
    rt_acl_t *a = NULL;
    CHECK_EQ(rt_acl_load("/nonexistent.acl", &a, err, sizeof(err)), RT_ENOTFOUND);
    /* An empty file denies everything; the access word may be left out. */
    load("");
    DENY(NULL, "c", "a", R);
    CHECK_EQ(rt_acl_load(tmpdir_put("abc.acl", "topic a b c\n"), &a, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "abc.acl:1: unknown access \"a\"") != NULL);
    load("topic #\n");
    ALLOW(NULL, "c", "x", W);
    ALLOW(NULL, "c", "x", R);
    /* Topics may hold spaces; trailing blanks and CRLF are ignored. */
    load("topic read with space/x \r\n");
    ALLOW(NULL, "c", "with space/x", R);
    /* A user named twice gets both sections' rules. */
    load("user u\ntopic read a\nuser v\ntopic read b\nuser u\ntopic read c\n");
    ALLOW("u", "c", "a", R);
    ALLOW("u", "c", "c", R);
    DENY("u", "c", "b", R);
    ALLOW("v", "c", "b", R);
    /* Many users: found by hash, each with its own rule. */
    size_t cap = 64 * 1024, n = 0;
    char *big = malloc(cap);
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(big + n, cap - n, "user u%d\ntopic write t/%d\n", i, i);
    load(big);
    free(big);
    ALLOW("u0", "c", "t/0", W);
    ALLOW("u1999", "c", "t/1999", W);
    DENY("u1999", "c", "t/1998", W);
    DENY("u2000", "c", "t/2000", W);
    load(file);
}

/* Random files of ACL-ish words and characters: loaded or refused with a line, never a crash. */
static void test_random_files(void)
{
    static const char *const words[] = {
        "topic", "pattern", "user", "read", "write", "readwrite", "deny", "#",     "+",   "/", "a",
        "%u",    "%c",      "$SYS", " ",    "\t",    "\n",        "\r\n", "x/+/y", "a/#", "#c"};
    const size_t nwords = sizeof(words) / sizeof(words[0]);
    long files = check_scale(1000), loaded = 0;
    for (long f = 0; f < files; f++) {
        char text[512] = "";
        size_t len = 0;
        for (int w = (int)(rnd() % 40); w > 0; w--) {
            const char *word = words[rnd() % nwords];
            size_t n = strlen(word);
            if (len + n + 1 >= sizeof(text))
                break;
            memcpy(text + len, word, n + 1);
            len += n;
        }
        char err[512] = "";
        rt_acl_t *a = NULL;
        int rc = rt_acl_load(tmpdir_put("fuzz.acl", text), &a, err, sizeof(err));
        CHECK(rc == 0 || (rc == RT_EINVAL && strstr(err, "fuzz.acl:")));
        if (a) {
            loaded++;
            static const char *const topics[] = {"a", "a/b", "#", "+/+", "$SYS/x", "x/q/y"};
            for (int t = 0; t < 6; t++)
                for (unsigned acc = 1; acc <= 4; acc <<= 1)
                    rt_acl_check(a, rnd() & 1 ? "a" : NULL, "c", topics[t], strlen(topics[t]), acc);
        }
        rt_acl_free(a);
    }
    CHECK(loaded > 0);
}

/* ---- The process-wide ACL swapped under concurrent checks ---- */

static atomic_bool checkers_stop;
static atomic_long checkers_running; /* checkers that have made a check */

static void *checker(void *p)
{
    (void)p;
    long checks = 0, bad = 0;
    while (!atomic_load(&checkers_stop)) {
        int r = rt_acl_permit("u", "c", "a/b", 3, RT_ACL_WRITE);
        bad += r != RT_ACL_ALLOW && r != RT_ACL_DENY;
        if (checks++ == 0)
            atomic_fetch_add(&checkers_running, 1);
    }
    return (void *)(bad ? -1 : checks);
}

static void test_reload_under_checks(void)
{
    char p1[128], p2[128], err[512];
    snprintf(p1, sizeof(p1), "%s", tmpdir_put("one.acl", "user u\ntopic write a/#\n"));
    snprintf(p2, sizeof(p2), "%s",
             tmpdir_put("two.acl", "user u\ntopic deny a/#\ntopic write #\n"));
    CHECK_EQ(rt_acl_reload(p1, err, sizeof(err)), 0);
    CHECK_EQ(rt_acl_permit("u", "c", "a/b", 3, RT_ACL_WRITE), RT_ACL_ALLOW);
    CHECK_EQ(rt_acl_reload(p2, err, sizeof(err)), 0);
    CHECK_EQ(rt_acl_permit("u", "c", "a/b", 3, RT_ACL_WRITE), RT_ACL_DENY);
    enum { THREADS = 3 };
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, checker, NULL);
    while (atomic_load(&checkers_running) < THREADS) /* every checker is busy first */
        sched_yield();
    long swaps = check_scale(1000);
    for (long i = 0; i < swaps; i++)
        CHECK_EQ(rt_acl_reload(i % 3 == 2 ? "" : i % 3 ? p2 : p1, err, sizeof(err)), 0);
    CHECK_EQ(rt_acl_reload(tmpdir_put("bad.acl", "nonsense\n"), err, sizeof(err)), RT_EINVAL);
    atomic_store(&checkers_stop, true);
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK((long)r > 0);
    }
    rt_acl_stats_t s;
    rt_acl_stats(&s);
    CHECK(s.denied_publish > 0);
    CHECK_EQ(rt_acl_reload(NULL, err, sizeof(err)), 0);
    CHECK_EQ(rt_acl_permit("u", "c", "a/b", 3, RT_ACL_WRITE), RT_ACL_ALLOW);
}

/* Publish-path cost: one check against a user section and a few patterns. */
static void test_check_cost(void)
{
    load(file);
    long n = check_scale(1000000);
    double t0 = now_s();
    long allowed = 0;
    for (long i = 0; i < n; i++)
        allowed += chk("alice", "client-1", "alice/sensors/temp", W);
    double ns = (now_s() - t0) / n * 1e9;
    CHECK_EQ(allowed, n);
    fprintf(stderr, "  %.0f ns per publish check\n", ns);
}

int main(void)
{
    if (tmpdir_make("rt_test_acl") != 0)
        return 1;
    RUN(test_anonymous_section);
    RUN(test_user_sections);
    RUN(test_deny_rules);
    RUN(test_subscribe_coverage);
    RUN(test_dollar_topics);
    RUN(test_patterns);
    RUN(test_injection);
    RUN(test_malformed);
    RUN(test_random_files);
    RUN(test_reload_under_checks);
    RUN(test_check_cost);
    rt_acl_free(acl);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

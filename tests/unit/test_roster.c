/*
** Rosters and offline messages in xmpp.db (actors/xmpp/roster.c): items round trip with
** groups and every state bit, versions, the bounds on a roster and on what an item holds,
** offline messages in order with their count and byte bounds and a take that stops midway,
** an account's deletion taking everything of it, the migration of a schema 1 file, and two
** handles on one file. Prints what a login's roster read and an offline push and take cost.
*/
#include <glob.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "accounts.h"
#include "check.h"
#include "jid.h"
#include "roster.h"
#include "rt.h"
#include "accounts_test.h"
#include "sqlite_test.h"
#include "tmpdir.h"

#define ROUNDS 4096 /* the least the accounts take: the tests stay quick */
#define H ACCOUNTS_TEST_HOST

static char dir[128], file[160];

/* ---- Items seen by a callback, copied ---- */

typedef struct {
    char jid[64], name[64], groups[RT_ROSTER_GROUPS_MAX][32];
    unsigned ngroups, state;
} item_copy_t;

typedef struct {
    item_copy_t it[24];
    int n, stop_at;
} seen_t;

static int collect(const rt_roster_item_t *it, void *arg)
{
    seen_t *s = arg;
    if (s->n < 24) {
        item_copy_t *c = &s->it[s->n];
        snprintf(c->jid, sizeof(c->jid), "%s", it->jid);
        snprintf(c->name, sizeof(c->name), "%s", it->name);
        c->ngroups = it->ngroups;
        for (unsigned i = 0; i < it->ngroups && i < RT_ROSTER_GROUPS_MAX; i++)
            snprintf(c->groups[i], sizeof(c->groups[i]), "%s", it->groups[i]);
        c->state = it->state;
    }
    return ++s->n == s->stop_at ? 7 : 0;
}

static int put(rt_accounts_t *a, const char *user, const char *jid, const char *name,
               unsigned state, uint32_t max, uint64_t *version)
{
    rt_roster_item_t it = {.jid = jid, .name = name, .state = state};
    char err[RT_ACCOUNTS_ERR_LEN];
    return rt_roster_put(a, H, user, &it, max, version, err, sizeof(err));
}

/* Item i's name: none for one of them. */
static void contact_name(char *name, size_t size, unsigned i)
{
    if (i == 2)
        name[0] = 0;
    else
        snprintf(name, size, "Contact «%u»", i);
}

static void test_items_round_trip(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "juliet");
    uint64_t v = 99;
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "juliet", collect, &s, &v), 0);
    CHECK_EQ(s.n, 0);
    CHECK_EQ(v, 0); /* never changed */

    /* Every state bit alone, and all of them, each item with groups of its own. */
    static const unsigned states[] = {RT_ROSTER_TO,
                                      RT_ROSTER_FROM,
                                      RT_ROSTER_ASK_OUT,
                                      RT_ROSTER_PENDING_IN,
                                      RT_ROSTER_PREAPPROVED,
                                      RT_ROSTER_STATES,
                                      0};
    char err[RT_ACCOUNTS_ERR_LEN];
    for (unsigned i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        char jid[32], name[32], g1[32];
        snprintf(jid, sizeof(jid), "c%u@example.net", 6 - i); /* put in reverse jid order */
        contact_name(name, sizeof(name), i);
        snprintf(g1, sizeof(g1), "Group %u", i);
        rt_roster_item_t it = {.jid = jid, .name = name, .state = states[i]};
        it.groups[it.ngroups++] = g1;
        if (i % 2)
            it.groups[it.ngroups++] = "Friends";
        CHECK_EQ(rt_roster_put(a, H, "Juliet", &it, 100, &v, err, sizeof(err)), 0);
        CHECK_EQ(v, i + 1);
    }
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, "EXAMPLE.com", "juliet", collect, &s, &v), 0);
    CHECK_EQ(s.n, 7);
    CHECK_EQ(v, 7);
    for (int k = 0; k < 7 && k < s.n; k++) {
        unsigned i = 6 - (unsigned)k; /* ordered by jid: c0 first, put last */
        char jid[32], name[32], g1[32];
        snprintf(jid, sizeof(jid), "c%d@example.net", k);
        contact_name(name, sizeof(name), i);
        snprintf(g1, sizeof(g1), "Group %u", i);
        CHECK(strcmp(s.it[k].jid, jid) == 0);
        CHECK(strcmp(s.it[k].name, name) == 0);
        CHECK_EQ(s.it[k].state, states[i]);
        CHECK_EQ(s.it[k].ngroups, i % 2 ? 2 : 1);
        CHECK(strcmp(s.it[k].groups[0], g1) == 0);
        if (i % 2)
            CHECK(strcmp(s.it[k].groups[1], "Friends") == 0);
    }
    /* fn stops the walk with its own return. */
    s = (seen_t){.stop_at = 3};
    CHECK_EQ(rt_roster_get(a, H, "juliet", collect, &s, NULL), 7);
    CHECK_EQ(s.n, 3);

    /* A put replaces everything: name, groups (none now), state. */
    CHECK_EQ(put(a, "juliet", "c3@example.net", "Romeo", RT_ROSTER_TO | RT_ROSTER_FROM, 100, &v),
             0);
    CHECK_EQ(v, 8);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_item(a, H, "juliet", "c3@example.net", collect, &s), 0);
    CHECK_EQ(s.n, 1);
    CHECK(strcmp(s.it[0].name, "Romeo") == 0 && s.it[0].ngroups == 0);
    CHECK_EQ(s.it[0].state, RT_ROSTER_TO | RT_ROSTER_FROM);
    CHECK_EQ(rt_roster_item(a, H, "juliet", "c9@example.net", collect, &s), RT_ENOTFOUND);
    CHECK_EQ(s.n, 1);

    /* Removal; the version goes on counting, and only a change counts. */
    CHECK_EQ(rt_roster_del(a, H, "juliet", "c3@example.net", &v), 0);
    CHECK_EQ(v, 9);
    CHECK_EQ(rt_roster_del(a, H, "juliet", "c3@example.net", &v), RT_ENOTFOUND);
    CHECK_EQ(rt_roster_item(a, H, "juliet", "c3@example.net", collect, &s), RT_ENOTFOUND);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "juliet", collect, &s, &v), 0);
    CHECK_EQ(s.n, 6);
    CHECK_EQ(v, 9);

    /* Another user's roster is apart; an account that does not exist has none to put to. */
    add_user(a, "romeo");
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "romeo", collect, &s, &v), 0);
    CHECK(s.n == 0 && v == 0);
    CHECK_EQ(put(a, "tybalt", "c1@example.net", "", 0, 100, &v), RT_ENOTFOUND);
    CHECK_EQ(rt_roster_get(a, H, "no body", collect, &s, &v), RT_EINVAL);
    CHECK_EQ(rt_roster_del(a, "exa mple.com", "juliet", "c1@example.net", &v), RT_EINVAL);
    rt_accounts_close(a);

    /* All of it is in the file. */
    a = open_in(dir);
    if (a) {
        s = (seen_t){.stop_at = -1};
        CHECK_EQ(rt_roster_get(a, H, "juliet", collect, &s, &v), 0);
        CHECK(s.n == 6 && v == 9);
        rt_accounts_close(a);
    }
}

static void test_item_bounds(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "bounds");
    char err[RT_ACCOUNTS_ERR_LEN];
    static char text[RT_ROSTER_TEXT_MAX + 2], jid[2 * RT_JID_PART_MAX + 3];
    memset(text, 'n', RT_ROSTER_TEXT_MAX);
    uint64_t v = 0;
    rt_roster_item_t it = {.jid = "a@example.net", .name = text};
    /* At the bounds: a name and a group of RT_ROSTER_TEXT_MAX bytes, RT_ROSTER_GROUPS_MAX groups.
     */
    char groups[RT_ROSTER_GROUPS_MAX][8];
    for (int i = 0; i < RT_ROSTER_GROUPS_MAX; i++) {
        snprintf(groups[i], sizeof(groups[i]), "g%d", i);
        it.groups[i] = groups[i];
    }
    it.ngroups = RT_ROSTER_GROUPS_MAX;
    it.groups[0] = text;
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), 0);
    CHECK_EQ(v, 1);
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_item(a, H, "bounds", "a@example.net", collect, &s), 0);
    CHECK_EQ(s.it[0].ngroups, RT_ROSTER_GROUPS_MAX);
    CHECK(strcmp(s.it[0].groups[RT_ROSTER_GROUPS_MAX - 1], "g15") == 0);

    /* One past each bound, and what is never a field: refused, nothing written. */
    text[RT_ROSTER_TEXT_MAX] = 'n';
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "the name is over 1023 bytes"));
    it.name = "ok";
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "a group is over 1023 bytes"));
    text[RT_ROSTER_TEXT_MAX] = 0;
    it.ngroups = RT_ROSTER_GROUPS_MAX + 1;
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "17 groups, at most 16"));
    it.ngroups = 2;
    it.groups[1] = "";
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "a group is empty"));
    it.groups[1] = text;
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "a group is named twice"));
    it.groups[1] = "bad \xc0\xaf utf-8";
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "a group is not UTF-8 text"));
    it.ngroups = 0;
    it.name = "\xed\xa0\x80"; /* a UTF-16 surrogate */
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "the name is not UTF-8 text"));
    it.name = NULL; /* none, as "" */
    it.state = 32;
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "unknown state bits 0x20"));
    it.state = 0;
    const char *bad_jids[] = {"", "a@example.net/phone", NULL};
    for (int i = 0; i < 3; i++) {
        it.jid = bad_jids[i];
        CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    }
    memset(jid, 'j', sizeof(jid) - 1);
    jid[RT_JID_PART_MAX] = '@';
    it.jid = jid;
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    jid[sizeof(jid) - 2] = 0; /* 2 * RT_JID_PART_MAX + 1 bytes: the longest bare JID */
    CHECK_EQ(rt_roster_put(a, H, "bounds", &it, 10, &v, err, sizeof(err)), 0);
    CHECK_EQ(v, 2); /* the refusals changed nothing */
    it.jid = "b@example.net";
    CHECK_EQ(rt_roster_put(a, "exa mple.com", "bounds", &it, 10, &v, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "domainpart"));
    rt_accounts_close(a);
}

static void test_roster_size_bound(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "full");
    uint64_t v = 0;
    char jid[32];
    for (int i = 0; i < 3; i++) {
        snprintf(jid, sizeof(jid), "c%d@example.net", i);
        CHECK_EQ(put(a, "full", jid, "", RT_ROSTER_TO, 3, &v), 0);
    }
    CHECK_EQ(put(a, "full", "c3@example.net", "", 0, 3, &v), RT_ELIMIT);
    CHECK_EQ(v, 3);
    CHECK_EQ(put(a, "full", "c1@example.net", "now named", RT_ROSTER_FROM, 3, &v), 0); /* replace */
    CHECK_EQ(v, 4);
    CHECK_EQ(put(a, "full", "c3@example.net", "", 0, 0, &v), RT_ELIMIT);
    CHECK_EQ(rt_roster_del(a, H, "full", "c0@example.net", &v), 0);
    CHECK_EQ(put(a, "full", "c3@example.net", "", 0, 3, &v), 0);
    CHECK_EQ(v, 6);
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "full", collect, &s, &v), 0);
    CHECK_EQ(s.n, 3);
    rt_accounts_close(a);
}

/* ---- Offline messages ---- */

typedef struct {
    char msgs[16][64];
    int64_t stamps[16];
    int n, stop_at;
} took_t;

static int take(const void *stanza, size_t len, int64_t stamp_ms, void *arg)
{
    took_t *t = arg;
    if (t->n == t->stop_at)
        return 1;
    if (t->n < 16) {
        snprintf(t->msgs[t->n], sizeof(t->msgs[0]), "%.*s", (int)len, (const char *)stanza);
        t->stamps[t->n] = stamp_ms;
    }
    t->n++;
    return 0;
}

static int push(rt_accounts_t *a, const char *user, int i, uint32_t max_count, uint64_t max_bytes)
{
    char m[64];
    int n =
        snprintf(m, sizeof(m), "<message to='%s@example.com'><body>%d</body></message>", user, i);
    return rt_offline_push(a, H, user, m, (size_t)n, 1700000000000LL + i, max_count, max_bytes);
}

static void test_offline_messages(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "nurse");
    uint32_t count = 9;
    uint64_t bytes = 9;
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK(count == 0 && bytes == 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(push(a, "nurse", i, 100, 1 << 20), 0);
    const size_t one = strlen("<message to='nurse@example.com'><body>0</body></message>");
    CHECK_EQ(rt_offline_count(a, H, "Nurse", &count, &bytes), 0);
    CHECK(count == 5 && bytes == 5 * one);

    /* fn stops at the third: two are taken, it and the rest are kept, in order. */
    took_t t = {.stop_at = 2};
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &t), 2);
    CHECK(strstr(t.msgs[0], "<body>0</body>") && strstr(t.msgs[1], "<body>1</body>"));
    CHECK(t.stamps[0] == 1700000000000LL && t.stamps[1] == 1700000000001LL);
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK(count == 3 && bytes == 3 * one);
    /* Up to max, then the rest; a new one goes after those kept. */
    CHECK_EQ(push(a, "nurse", 5, 100, 1 << 20), 0);
    t = (took_t){.stop_at = -1};
    CHECK_EQ(rt_offline_take(a, H, "nurse", 2, take, &t), 2);
    CHECK(strstr(t.msgs[0], "<body>2</body>") && strstr(t.msgs[1], "<body>3</body>"));
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &t), 2);
    CHECK(strstr(t.msgs[2], "<body>4</body>") && strstr(t.msgs[3], "<body>5</body>"));
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &t), 0);
    CHECK_EQ(t.n, 4);
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK(count == 0 && bytes == 0);
    t = (took_t){.stop_at = 0};
    CHECK_EQ(push(a, "nurse", 6, 100, 1 << 20), 0);
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &t), 0); /* fn refused the first */
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK_EQ(count, 1);
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &(took_t){.stop_at = -1}), 1);

    /* The count bound: the fourth of three is refused and nothing of it stored. */
    for (int i = 0; i < 3; i++)
        CHECK_EQ(push(a, "nurse", i, 3, 1 << 20), 0);
    CHECK_EQ(push(a, "nurse", 3, 3, 1 << 20), RT_ELIMIT);
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK(count == 3 && bytes == 3 * one);
    /* The byte bound: up to it exactly, not one byte past it. */
    CHECK_EQ(push(a, "nurse", 3, 100, 4 * one - 1), RT_ELIMIT);
    CHECK_EQ(push(a, "nurse", 3, 100, 4 * one), 0);
    CHECK_EQ(push(a, "nurse", 4, 100, 5 * one - 1), RT_ELIMIT);
    CHECK_EQ(push(a, "nurse", 4, 0, 1 << 20), RT_ELIMIT);
    CHECK_EQ(rt_offline_count(a, H, "nurse", &count, &bytes), 0);
    CHECK(count == 4 && bytes == 4 * one);
    t = (took_t){.stop_at = -1};
    CHECK_EQ(rt_offline_take(a, H, "nurse", 100, take, &t), 4);
    for (int i = 0; i < 4 && i < t.n; i++) {
        char body[32];
        snprintf(body, sizeof(body), "<body>%d</body>", i);
        CHECK(strstr(t.msgs[i], body));
    }
    /* Refused: no stanza, no account, a name that is none. */
    CHECK_EQ(rt_offline_push(a, H, "nurse", "", 0, 0, 100, 100), RT_EINVAL);
    CHECK_EQ(push(a, "tybalt", 0, 100, 1 << 20), RT_ENOTFOUND);
    CHECK_EQ(rt_offline_count(a, H, "tybalt", &count, &bytes), RT_ENOTFOUND);
    CHECK_EQ(rt_offline_take(a, H, "tybalt", 100, take, &t), 0);
    CHECK_EQ(push(a, "ty balt", 0, 100, 1 << 20), RT_EINVAL);
    rt_accounts_close(a);
}

/* ---- An account's deletion ---- */

static long long rows_of(const char *table, const char *user)
{
    sqlite3 *db = open_db(file);
    char q[160];
    snprintf(q, sizeof(q), "SELECT count(*) FROM %s WHERE username = '%s'", table, user);
    long long n = sql_int(db, q);
    sqlite3_close(db);
    return n;
}

static void test_delete_account(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "mercutio");
    add_user(a, "benvolio");
    uint64_t v;
    rt_roster_item_t it = {.jid = "romeo@example.com",
                           .name = "R",
                           .groups = {"Montagues"},
                           .ngroups = 1,
                           .state = RT_ROSTER_TO};
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_roster_put(a, H, "mercutio", &it, 10, &v, err, sizeof(err)), 0);
    CHECK_EQ(rt_roster_put(a, H, "benvolio", &it, 10, &v, err, sizeof(err)), 0);
    CHECK_EQ(push(a, "mercutio", 0, 10, 1 << 20), 0);
    CHECK_EQ(push(a, "mercutio", 1, 10, 1 << 20), 0);
    CHECK_EQ(push(a, "benvolio", 0, 10, 1 << 20), 0);
    CHECK_EQ(rows_of("roster", "mercutio"), 1);
    CHECK_EQ(rows_of("offline", "mercutio"), 2);
    CHECK_EQ(rows_of("account_counts", "mercutio"), 1);
    seen_t s = {.stop_at = -1};
    uint64_t before = 0;
    CHECK_EQ(rt_roster_get(a, H, "mercutio", collect, &s, &before), 0);
    CHECK(before > 0);
    CHECK_EQ(rt_accounts_del(a, H, "mercutio", NULL, NULL, err, sizeof(err)), 0);
    CHECK_EQ(rows_of("roster", "mercutio"), 0);
    CHECK_EQ(rows_of("offline", "mercutio"), 0);
    CHECK_EQ(rows_of("roster", "benvolio"), 1); /* the others' are kept */
    CHECK_EQ(rows_of("offline", "benvolio"), 1);
    /* Made again, the account starts with nothing, its roster version past the old one's: a
       client's cached version of the old roster is not current. */
    add_user(a, "mercutio");
    s = (seen_t){.stop_at = -1};
    v = 9;
    CHECK_EQ(rt_roster_get(a, H, "mercutio", collect, &s, &v), 0);
    CHECK(s.n == 0 && v == before + 1);
    uint32_t count = 9;
    uint64_t bytes = 9;
    CHECK_EQ(rt_offline_count(a, H, "mercutio", &count, &bytes), 0);
    CHECK(count == 0 && bytes == 0);
    CHECK_EQ(rt_accounts_del(a, H, "mercutio", NULL, NULL, err, sizeof(err)), 0);
    CHECK_EQ(rt_accounts_del(a, H, "mercutio", NULL, NULL, err, sizeof(err)), RT_ENOTFOUND);
    CHECK(strstr(err, "no account mercutio@example.com"));
    rt_accounts_close(a);
}

typedef struct {
    char owner[8][32];
    uint64_t version[8];
    int n;
} forgot_seen_t;

static void forgot(const char *host, const char *user, const char *jid, uint64_t version,
                   void *arg)
{
    forgot_seen_t *f = arg;
    CHECK(strcmp(host, H) == 0 && strcmp(jid, "gone@" H) == 0);
    if (f->n < 8) {
        snprintf(f->owner[f->n], sizeof(f->owner[0]), "%s", user);
        f->version[f->n] = version;
    }
    f->n++;
}

/* The state of user's item for jid, or -1 when there is none. */
static int state_of(rt_accounts_t *a, const char *user, const char *jid)
{
    seen_t s = {.stop_at = -1};
    uint64_t v;
    CHECK_EQ(rt_roster_get(a, H, user, collect, &s, &v), 0);
    for (int i = 0; i < s.n; i++)
        if (strcmp(s.it[i].jid, jid) == 0)
            return (int)s.it[i].state;
    return -1;
}

/* A removed account's contacts keep their items for it with no subscription, or lose one that
   held only its request: a new account of the name is granted nothing the old one was. */
static void test_delete_account_forgets_subscriptions(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    const char *names[] = {"gone", "aunt", "maid", "monk"};
    for (int i = 0; i < 4; i++)
        add_user(a, names[i]);
    const char *t = "gone@" H;
    uint64_t v;
    CHECK_EQ(put(a, "gone", "aunt@" H, "", RT_ROSTER_TO | RT_ROSTER_FROM, 10, &v), 0);
    CHECK_EQ(put(a, "gone", "maid@" H, "", RT_ROSTER_ASK_OUT, 10, &v), 0);
    CHECK_EQ(put(a, "gone", "monk@" H, "", RT_ROSTER_TO, 10, &v), 0);
    CHECK_EQ(put(a, "gone", "romeo@elsewhere.example", "", RT_ROSTER_TO, 10, &v), 0);
    CHECK_EQ(put(a, "aunt", t, "Cousin", RT_ROSTER_TO | RT_ROSTER_FROM, 10, &v), 0);
    CHECK_EQ(put(a, "maid", t, "", RT_ROSTER_PENDING_IN, 10, &v), 0); /* his request alone */
    uint64_t monk_before;
    CHECK_EQ(put(a, "monk", t, "", RT_ROSTER_FROM | RT_ROSTER_PREAPPROVED, 10, &monk_before),
             0);
    char err[RT_ACCOUNTS_ERR_LEN];
    forgot_seen_t f = {0};
    CHECK_EQ(rt_accounts_del(a, H, "gone", forgot, &f, err, sizeof(err)), 0);
    CHECK_EQ(f.n, 3);
    CHECK_EQ(state_of(a, "aunt", t), 0); /* kept, with its name, subscription none */
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "aunt", collect, &s, &v), 0);
    CHECK(s.n == 1 && strcmp(s.it[0].name, "Cousin") == 0);
    CHECK_EQ(state_of(a, "maid", t), -1);
    CHECK_EQ(state_of(a, "monk", t), 0);
    for (int i = 0; i < f.n && i < 8; i++)
        if (strcmp(f.owner[i], "monk") == 0)
            CHECK_EQ(f.version[i], monk_before + 1);
    /* Made again, nobody's item grants it anything. */
    add_user(a, "gone");
    CHECK_EQ(state_of(a, "aunt", t), 0);
    CHECK_EQ(state_of(a, "monk", t), 0);
    rt_accounts_close(a);
}

/* ---- Migration from schema 1 ---- */

/* The version 1 file as the code before rosters made it, word for word. */
static const char v1_schema[] =
    "CREATE TABLE accounts(host TEXT NOT NULL, username TEXT NOT NULL, "
    "  created INTEGER NOT NULL, "
    "  sha1_salt BLOB NOT NULL, sha1_iterations INTEGER NOT NULL, "
    "  sha1_stored_key BLOB NOT NULL, sha1_server_key BLOB NOT NULL, "
    "  sha256_salt BLOB NOT NULL, sha256_iterations INTEGER NOT NULL, "
    "  sha256_stored_key BLOB NOT NULL, sha256_server_key BLOB NOT NULL, "
    "  PRIMARY KEY(host, username)) WITHOUT ROWID;";

static void bind_cred(sqlite3_stmt *st, int at, rt_scram_hash_t hash)
{
    rt_scram_cred_t c;
    const char *why;
    CHECK_EQ(rt_scram_cred_make(hash, "balcony", 7, ROUNDS, &c, &why), 0);
    int klen = (int)rt_scram_key_len(hash);
    sqlite3_bind_blob(st, at, c.salt, c.salt_len, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, at + 1, c.iterations);
    sqlite3_bind_blob(st, at + 2, c.stored_key, klen, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, at + 3, c.server_key, klen, SQLITE_TRANSIENT);
}

static void test_migration_from_schema_1(void)
{
    static const char tables[] = "SELECT count(*) FROM sqlite_master WHERE name IN ('accounts', "
                                 "'roster', 'account_counts', 'offline', 'offline_by_user')";
    char d[200], path[260];
    snprintf(d, sizeof(d), "%s/v1", tmpdir_path);
    mkdir(d, 0700);
    snprintf(path, sizeof(path), "%s/%s", d, RT_ACCOUNTS_FILE);
    sqlite3 *db = open_db(path);
    char pragmas[128];
    snprintf(pragmas, sizeof(pragmas), "PRAGMA application_id = %d; PRAGMA user_version = 1;",
             0x7274584D);
    CHECK_EQ(sqlite3_exec(db, pragmas, NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_exec(db, v1_schema, NULL, NULL, NULL), SQLITE_OK);
    const char *users[] = {"juliet", "romeo"};
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *st;
        CHECK_EQ(sqlite3_prepare_v2(db,
                                    "INSERT INTO accounts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                                    "?9, ?10, ?11)",
                                    -1, &st, NULL),
                 SQLITE_OK);
        sqlite3_bind_text(st, 1, H, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, users[i], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, 1700000000000LL);
        bind_cred(st, 4, RT_SCRAM_SHA1);
        bind_cred(st, 8, RT_SCRAM_SHA256);
        CHECK_EQ(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);

    rt_accounts_t *a = open_in(d);
    if (!a)
        return;
    /* The accounts are kept, with their credentials; the new tables work. */
    CHECK_EQ(rt_accounts_count(a), 2);
    CHECK_EQ(rt_accounts_check_password(a, H, "romeo", "balcony", 7), 0);
    uint64_t v;
    CHECK_EQ(put(a, "juliet", "romeo@example.com", "Romeo", RT_ROSTER_TO | RT_ROSTER_FROM, 10, &v),
             0);
    CHECK_EQ(v, 1);
    CHECK_EQ(push(a, "romeo", 0, 10, 1 << 20), 0);
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_get(a, H, "juliet", collect, &s, &v), 0);
    CHECK(s.n == 1 && v == 1 && strcmp(s.it[0].name, "Romeo") == 0);
    rt_accounts_close(a);
    db = open_db(path);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), RT_ACCOUNTS_SCHEMA);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM offline"), 1);
    CHECK_EQ(sql_int(db, tables), 5);
    sqlite3_close(db);
    /* The copy taken first is the version 1 file, as it was. */
    char pattern[300];
    snprintf(pattern, sizeof(pattern), "%s/%s.v1-*.bak", d, RT_ACCOUNTS_FILE);
    glob_t g;
    CHECK_EQ(glob(pattern, 0, NULL, &g), 0);
    CHECK_EQ(g.gl_pathc, 1);
    char bak[300] = "";
    if (g.gl_pathc == 1)
        snprintf(bak, sizeof(bak), "%s", g.gl_pathv[0]);
    globfree(&g);
    db = open_db(bak);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), 1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM accounts"), 2);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'roster'"), 0);
    sqlite3_close(db);
    /* A new file has the same tables. */
    db = open_db(file);
    CHECK_EQ(sql_int(db, tables), 5);
    sqlite3_close(db);
}

/* ---- Two handles on one file ---- */

typedef struct {
    rt_accounts_t *writer;
    int puts;
} meanwhile_t;

/* While the reader walks its snapshot, the other handle writes. */
static int write_meanwhile(const rt_roster_item_t *it, void *arg)
{
    (void)it;
    meanwhile_t *m = arg;
    char jid[32];
    snprintf(jid, sizeof(jid), "new%d@example.net", m->puts);
    uint64_t v;
    CHECK_EQ(put(m->writer, "paris", jid, "", 0, 100, &v), 0);
    m->puts++;
    return 0;
}

static void test_two_handles(void)
{
    rt_accounts_t *a = open_in(dir), *b = open_in(dir);
    if (!a || !b) {
        rt_accounts_close(a);
        rt_accounts_close(b);
        return;
    }
    add_user(a, "paris");
    uint64_t va, vb;
    CHECK_EQ(put(a, "paris", "juliet@example.com", "J", RT_ROSTER_ASK_OUT, 100, &va), 0);
    CHECK_EQ(put(a, "paris", "nurse@example.com", "N", 0, 100, &va), 0);
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_roster_get(b, H, "paris", collect, &s, &vb), 0);
    CHECK(s.n == 2 && vb == va && s.it[0].state == RT_ROSTER_ASK_OUT);
    /* b's read is one snapshot: a's puts during it are not in it, and are not held up. */
    meanwhile_t m = {.writer = a};
    CHECK_EQ(rt_roster_get(b, H, "paris", write_meanwhile, &m, &vb), 0);
    CHECK_EQ(m.puts, 2);
    CHECK_EQ(vb, 2);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(b, H, "paris", collect, &s, &vb), 0);
    CHECK(s.n == 4 && vb == 4);
    /* Offline messages pushed by one handle are taken by the other. */
    CHECK_EQ(push(b, "paris", 0, 10, 1 << 20), 0);
    CHECK_EQ(push(a, "paris", 1, 10, 1 << 20), 0);
    took_t t = {.stop_at = -1};
    CHECK_EQ(rt_offline_take(a, H, "paris", 10, take, &t), 2);
    CHECK(strstr(t.msgs[0], "<body>0</body>") && strstr(t.msgs[1], "<body>1</body>"));
    uint32_t count;
    uint64_t bytes;
    CHECK_EQ(rt_offline_count(b, H, "paris", &count, &bytes), 0);
    CHECK(count == 0 && bytes == 0);
    /* b's snapshot: its reads do not see a's put during it; a take that finds messages ends
       it and writes in a transaction of its own; reads after the end see everything. */
    CHECK_EQ(rt_accounts_snapshot(b), 0);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(b, H, "paris", collect, &s, &vb), 0);
    CHECK_EQ(vb, 4);
    CHECK_EQ(put(a, "paris", "tybalt@example.com", "T", 0, 100, &va), 0);
    CHECK_EQ(push(a, "paris", 2, 10, 1 << 20), 0);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(b, H, "paris", collect, &s, &vb), 0);
    CHECK(s.n == 4 && vb == 4);
    CHECK_EQ(rt_offline_take(b, H, "paris", 10, take, &(took_t){.stop_at = -1}), 0);
    rt_accounts_snapshot_end(b);
    CHECK_EQ(rt_offline_take(b, H, "paris", 10, take, &(took_t){.stop_at = -1}), 1);
    CHECK_EQ(rt_accounts_snapshot(b), 0);
    CHECK_EQ(push(a, "paris", 3, 10, 1 << 20), 0);
    CHECK_EQ(rt_offline_take(b, H, "paris", 10, take, &(took_t){.stop_at = -1}), 1);
    rt_accounts_snapshot_end(b);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_roster_get(b, H, "paris", collect, &s, &vb), 0);
    CHECK(s.n == 5 && vb == va);
    /* A deletion by one is seen by the other. */
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_del(b, H, "paris", NULL, NULL, err, sizeof(err)), 0);
    CHECK_EQ(rt_roster_item(a, H, "paris", "juliet@example.com", collect, &s), RT_ENOTFOUND);
    rt_accounts_close(a);
    rt_accounts_close(b);
}

/* ---- What it costs (printed, not asserted: a figure, not a bound) ---- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int count_items(const rt_roster_item_t *it, void *arg)
{
    (void)it;
    ++*(int *)arg;
    return 0;
}

static int drop_it(const void *stanza, size_t len, int64_t stamp_ms, void *arg)
{
    (void)stanza, (void)stamp_ms;
    *(size_t *)arg += len;
    return 0;
}

static void test_costs(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "user1");
    char err[RT_ACCOUNTS_ERR_LEN];
    for (int i = 0; i < 18; i++) {
        char jid[48], name[32];
        snprintf(jid, sizeof(jid), "user%d@example.com", 100 + i);
        snprintf(name, sizeof(name), "Contact %d", i);
        rt_roster_item_t it = {.jid = jid,
                               .name = name,
                               .groups = {"Friends"},
                               .ngroups = 1,
                               .state = RT_ROSTER_TO | RT_ROSTER_FROM};
        CHECK_EQ(rt_roster_put(a, H, "user1", &it, 100, NULL, err, sizeof(err)), 0);
    }
    enum { GETS = 2000, MSGS = 1000 };
    int seen = 0;
    double t0 = now_us();
    for (int i = 0; i < GETS; i++)
        CHECK_EQ(rt_roster_get(a, H, "user1", count_items, &seen, NULL), 0);
    double get_us = (now_us() - t0) / GETS;
    CHECK_EQ(seen, 18 * GETS);

    char stanza[200];
    memset(stanza, 'x', sizeof(stanza));
    t0 = now_us();
    for (int i = 0; i < MSGS; i++)
        CHECK_EQ(rt_offline_push(a, H, "user1", stanza, sizeof(stanza), i, MSGS, 1 << 20), 0);
    double push_us = (now_us() - t0) / MSGS;
    size_t taken_bytes = 0;
    t0 = now_us();
    for (int i = 0; i < MSGS / 2; i++)
        CHECK_EQ(rt_offline_take(a, H, "user1", 1, drop_it, &taken_bytes), 1);
    double take1_us = (now_us() - t0) / (MSGS / 2);
    t0 = now_us();
    CHECK_EQ(rt_offline_take(a, H, "user1", MSGS, drop_it, &taken_bytes), MSGS / 2);
    double take_all_us = (now_us() - t0) / (MSGS / 2);
    CHECK_EQ(taken_bytes, (size_t)MSGS * sizeof(stanza));
    t0 = now_us();
    for (int i = 0; i < GETS; i++)
        CHECK_EQ(rt_offline_take(a, H, "user1", 100, drop_it, &taken_bytes), 0);
    double take_none_us = (now_us() - t0) / GETS;
    printf("  rt_roster_get, 18 items: %.1f us/call; rt_offline_push (200 B): %.1f us/call; "
           "rt_offline_take: %.1f us/call of 1, %.1f us/message in one call of %d, "
           "%.1f us/call with none waiting\n",
           get_us, push_us, take1_us, take_all_us, MSGS / 2, take_none_us);
    rt_accounts_close(a);
}

int main(void)
{
    if (tmpdir_make("test_roster") != 0)
        return 2;
    snprintf(dir, sizeof(dir), "%s/data", tmpdir_path);
    snprintf(file, sizeof(file), "%s/%s", dir, RT_ACCOUNTS_FILE);
    RUN(test_items_round_trip);
    RUN(test_item_bounds);
    RUN(test_roster_size_bound);
    RUN(test_offline_messages);
    RUN(test_delete_account);
    RUN(test_delete_account_forgets_subscriptions);
    RUN(test_migration_from_schema_1);
    RUN(test_two_handles);
    RUN(test_costs);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

/*
** What xmpp.db keeps for the XEPs (actors/xmpp/xeps.c, archive.c): blocklists with their bound,
** vCards set, replaced and deleted, the message archive's pages forwards and backwards (after,
** before, the last page, with, stamps) and its retention bound, an account's deletion taking
** all of it, PEP's nodes and items (their bounds, publish-options' preconditions, each node's
** last item), FAST tokens (the one before, expiry, the client and mechanism they are bound
** to, a password change ending them), and a schema 2 file migrated with its accounts kept.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "accounts.h"
#include "check.h"
#include "rt.h"
#include "accounts_test.h"
#include "sqlite_test.h"
#include "tmpdir.h"
#include "xeps.h"

#define H ACCOUNTS_TEST_HOST

static char dir[128];

/* ---- Blocklist ---- */

typedef struct {
    char all[512];
    int n;
} list_t;

static int gather(const char *jid, size_t len, void *arg)
{
    list_t *l = arg;
    size_t at = strlen(l->all);
    snprintf(l->all + at, sizeof(l->all) - at, "%s%.*s", l->n ? " " : "", (int)len, jid);
    l->n++;
    return 0;
}

static const char *blocked(rt_accounts_t *a, const char *user, list_t *l)
{
    memset(l, 0, sizeof(*l));
    CHECK_EQ(rt_block_list(a, H, user, gather, l), 0);
    return l->all;
}

static void test_blocklist(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "juliet");
    add_user(a, "romeo");
    list_t l;
    CHECK_EQ(strcmp(blocked(a, "juliet", &l), ""), 0);
    const char *two[] = {"tybalt@example.com", "evil.example"};
    CHECK_EQ(rt_block_add(a, H, "juliet", two, 2, 3), 0);
    CHECK_EQ(strcmp(blocked(a, "juliet", &l), "evil.example tybalt@example.com"), 0);
    /* Blocking again, or twice in one call, changes nothing and passes no bound. */
    const char *again[] = {"tybalt@example.com", "paris@example.com/x", "paris@example.com/x"};
    CHECK_EQ(rt_block_add(a, H, "juliet", again, 3, 3), 0);
    CHECK_EQ(l.n, 2);
    CHECK_EQ(
        strcmp(blocked(a, "juliet", &l), "evil.example paris@example.com/x tybalt@example.com"), 0);
    /* Past the bound: nothing of the call is kept. */
    const char *more[] = {"a@example.net", "b@example.net"};
    CHECK_EQ(rt_block_add(a, H, "juliet", more, 2, 4), RT_ELIMIT);
    CHECK_EQ(blocked(a, "juliet", &l)[0] != 0 && l.n == 3, 1);
    /* Each account has its own. */
    CHECK_EQ(strcmp(blocked(a, "romeo", &l), ""), 0);
    const char *one[] = {"tybalt@example.com"};
    CHECK_EQ(rt_block_del(a, H, "juliet", one, 1), 0);
    CHECK_EQ(strcmp(blocked(a, "juliet", &l), "evil.example paris@example.com/x"), 0);
    CHECK_EQ(rt_block_del(a, H, "juliet", NULL, 0), 0);
    CHECK_EQ(strcmp(blocked(a, "juliet", &l), ""), 0);
    /* No such account; a JID that cannot be one; a name that is no account's. */
    CHECK_EQ(rt_block_add(a, H, "nobody", one, 1, 10), RT_ENOTFOUND);
    const char *empty[] = {""};
    CHECK_EQ(rt_block_add(a, H, "juliet", empty, 1, 10), RT_EINVAL);
    CHECK_EQ(rt_block_add(a, H, "bad@name", one, 1, 10), RT_EINVAL);
    rt_accounts_close(a);
}

/* ---- vCard ---- */

typedef struct {
    char bytes[128];
    size_t len;
} card_t;

static void got_card(const void *v, size_t len, void *arg)
{
    card_t *c = arg;
    c->len = len;
    memcpy(c->bytes, v, len < sizeof(c->bytes) ? len : sizeof(c->bytes));
}

static void test_vcard(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    card_t c = {0};
    CHECK_EQ(rt_vcard_get(a, H, "juliet", got_card, &c), RT_ENOTFOUND);
    static const char v1[] = "<vCard xmlns='vcard-temp'><FN>Juliet</FN></vCard>";
    static const char v2[] = "<vCard xmlns='vcard-temp'><FN>J. Capulet</FN></vCard>";
    CHECK_EQ(rt_vcard_set(a, H, "juliet", v1, sizeof(v1) - 1), 0);
    CHECK_EQ(rt_vcard_get(a, H, "Juliet", got_card, &c), 0);
    CHECK(c.len == sizeof(v1) - 1 && memcmp(c.bytes, v1, c.len) == 0);
    CHECK_EQ(rt_vcard_set(a, H, "juliet", v2, sizeof(v2) - 1), 0);
    CHECK_EQ(rt_vcard_get(a, H, "juliet", got_card, &c), 0);
    CHECK(c.len == sizeof(v2) - 1 && memcmp(c.bytes, v2, c.len) == 0);
    CHECK_EQ(rt_vcard_get(a, H, "romeo", got_card, &c), RT_ENOTFOUND);
    CHECK_EQ(rt_vcard_set(a, H, "juliet", NULL, 0), 0);
    CHECK_EQ(rt_vcard_get(a, H, "juliet", got_card, &c), RT_ENOTFOUND);
    CHECK_EQ(rt_vcard_set(a, H, "nobody", v1, sizeof(v1) - 1), RT_ENOTFOUND);
    rt_accounts_close(a);
}

/* ---- Archive ---- */

typedef struct {
    int64_t ids[64];
    char bodies[64][16];
    int n;
} page_t;

static int got_row(int64_t id, int64_t stamp_ms, const void *stanza, size_t len, void *arg)
{
    (void)stamp_ms;
    page_t *p = arg;
    if (p->n < 64) {
        p->ids[p->n] = id;
        snprintf(p->bodies[p->n], sizeof(p->bodies[0]), "%.*s", (int)len, (const char *)stanza);
        p->n++;
    }
    return 0;
}

static bool query(rt_accounts_t *a, const char *user, rt_archive_query_t q, page_t *p)
{
    bool complete = false;
    memset(p, 0, sizeof(*p));
    CHECK_EQ(rt_archive_query(a, H, user, &q, got_row, p, &complete), 0);
    return complete;
}

/* juliet and romeo chat: m0..m9, each archived for both; m at stamp 1000 + i. */
static void chat(rt_accounts_t *a, int from, int to, uint32_t keep)
{
    for (int i = from; i < to; i++) {
        char body[16];
        int len = snprintf(body, sizeof(body), "m%d", i);
        rt_archive_entry_t e[2] = {
            {H, "juliet", "romeo@example.com", body, (size_t)len, 0, 0, false},
            {H, "romeo", "juliet@example.com", body, (size_t)len, 0, 0, false},
        };
        int64_t ids[2] = {0, 0};
        CHECK_EQ(rt_archive_put(a, e, 2, 1000 + i, keep, ids), 0);
        CHECK(ids[0] > 0 && ids[1] > ids[0]);
    }
}

static void test_archive(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    chat(a, 0, 10, 100);
    /* An anonymous user (no account) gets no copy; the other party does. */
    rt_archive_entry_t anon[2] = {{H, "juliet", "guest@example.com", "hi", 2, 0, 0, false},
                                  {H, "guest", "juliet@example.com", "hi", 2, 0, 0, false}};
    int64_t ids[2];
    CHECK_EQ(rt_archive_put(a, anon, 2, 2000, 100, ids), 0);
    /* A room (XEP-0045) has no account: its copies are kept all the same. */
    rt_archive_entry_t room = {
        "conference." H, "lobby", "lobby@conference." H "/nurse", "hey", 3, 0, 0, true};
    int64_t room_id = 0;
    CHECK_EQ(rt_archive_put(a, &room, 1, 2500, 100, &room_id), 0);
    CHECK(room_id > 0);
    room.room = false; /* as an account's, the same copy is dropped: no such account */
    CHECK_EQ(rt_archive_put(a, &room, 1, 2500, 100, &room_id), 0);
    CHECK_EQ(room_id, 0);
    CHECK(ids[0] > 0 && ids[1] == 0);
    page_t p;
    /* Forwards, three at a time, then after the last one seen. */
    CHECK(!query(a, "juliet", (rt_archive_query_t){.max = 3}, &p));
    CHECK(p.n == 3 && strcmp(p.bodies[0], "m0") == 0 && strcmp(p.bodies[2], "m2") == 0);
    CHECK(!query(a, "juliet", (rt_archive_query_t){.max = 3, .after = p.ids[2]}, &p));
    CHECK(p.n == 3 && strcmp(p.bodies[0], "m3") == 0);
    /* With: only romeo's; the whole rest is complete. */
    CHECK(query(a, "juliet",
                (rt_archive_query_t){.max = 20, .with = "romeo@example.com", .after = p.ids[2]},
                &p));
    CHECK(p.n == 4 && strcmp(p.bodies[3], "m9") == 0);
    /* The last page, then before its first: oldest first within each. */
    CHECK(!query(a, "juliet", (rt_archive_query_t){.max = 4, .last = true}, &p));
    CHECK(p.n == 4 && strcmp(p.bodies[0], "m7") == 0 && strcmp(p.bodies[3], "hi") == 0);
    CHECK(!query(a, "juliet", (rt_archive_query_t){.max = 4, .before = p.ids[0]}, &p));
    CHECK(p.n == 4 && strcmp(p.bodies[0], "m3") == 0 && strcmp(p.bodies[3], "m6") == 0);
    CHECK(query(a, "juliet", (rt_archive_query_t){.max = 4, .before = p.ids[0]}, &p));
    CHECK(p.n == 3 && strcmp(p.bodies[0], "m0") == 0);
    /* Stamps, inclusive. */
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 10, .start_ms = 1002, .end_ms = 1004}, &p));
    CHECK(p.n == 3 && strcmp(p.bodies[0], "m2") == 0 && strcmp(p.bodies[2], "m4") == 0);
    CHECK_EQ(query(a, "romeo", (rt_archive_query_t){.max = 10, .with = "x@example.com"}, &p), 1);
    CHECK_EQ(p.n, 0);
    bool complete;
    CHECK_EQ(
        rt_archive_query(a, H, "romeo", &(rt_archive_query_t){.max = 0}, got_row, &p, &complete),
        RT_EINVAL);
    /* Retention: at 12 kept, the oldest go, for each account by its own count. */
    chat(a, 10, 14, 12);
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 50}, &p));
    CHECK(p.n == 12 && strcmp(p.bodies[0], "m2") == 0 && strcmp(p.bodies[11], "m13") == 0);
    CHECK(query(a, "juliet", (rt_archive_query_t){.max = 50}, &p));
    CHECK(p.n == 12 && strcmp(p.bodies[0], "m3") == 0);
    chat(a, 14, 15, 12);
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 50}, &p));
    CHECK(p.n == 12 && strcmp(p.bodies[0], "m3") == 0);
    /* Counts by the filters, not the paging. */
    uint64_t count = 0;
    CHECK_EQ(rt_archive_count(a, H, "romeo", &(rt_archive_query_t){.max = 1}, &count), 0);
    CHECK_EQ(count, 12);
    CHECK_EQ(rt_archive_count(a, H, "romeo",
                              &(rt_archive_query_t){.start_ms = 1010, .end_ms = 1011}, &count),
             0);
    CHECK_EQ(count, 2);
    CHECK_EQ(rt_archive_count(a, H, "juliet", &(rt_archive_query_t){.with = "guest@example.com"},
                              &count),
             0);
    CHECK_EQ(count, 1);
    rt_accounts_close(a);
}

/* Ids the caller chose (the stanza-id a receiver was told), stamps of each entry; a taken id
   makes way for the next free one rather than losing the message. */
static void test_archive_ids(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    int64_t last = 0;
    CHECK_EQ(rt_archive_last_id(a, &last), 0);
    int64_t big = last + 1000000;
    rt_archive_entry_t e[2] = {
        {H, "juliet", "nurse@example.com", "a", 1, big, 5000, false},
        {H, "romeo", "nurse@example.com", "b", 1, big + 1, 0, false},
    };
    int64_t ids[2] = {0, 0};
    CHECK_EQ(rt_archive_put(a, e, 2, 6000, 100, ids), 0);
    CHECK(ids[0] == big && ids[1] == big + 1);
    CHECK_EQ(rt_archive_last_id(a, &last), 0);
    CHECK_EQ(last, big + 1);
    page_t p;
    CHECK(query(a, "juliet",
                (rt_archive_query_t){.max = 5, .with = "nurse@example.com", .end_ms = 5000}, &p));
    CHECK(p.n == 1 && p.ids[0] == big);
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 5, .start_ms = 6000}, &p));
    CHECK(p.n == 1 && p.ids[0] == big + 1);
    rt_archive_entry_t again = {H, "juliet", "nurse@example.com", "c", 1, big, 0, false};
    CHECK_EQ(rt_archive_put(a, &again, 1, 7000, 100, ids), 0);
    CHECK_EQ(ids[0], big + 2);
    rt_accounts_close(a);
}

/* ---- Deletion and migration ---- */

static void test_delete_account(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    const char *one[] = {"tybalt@example.com"};
    CHECK_EQ(rt_block_add(a, H, "romeo", one, 1, 10), 0);
    CHECK_EQ(rt_vcard_set(a, H, "romeo", "<vCard/>", 8), 0);
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_del(a, H, "romeo", NULL, NULL, err, sizeof(err)), 0);
    add_user(a, "romeo");
    list_t l;
    CHECK_EQ(strcmp(blocked(a, "romeo", &l), ""), 0);
    card_t c;
    CHECK_EQ(rt_vcard_get(a, H, "romeo", got_card, &c), RT_ENOTFOUND);
    page_t p;
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 50}, &p));
    CHECK_EQ(p.n, 0);
    chat(a, 0, 1, 12); /* the count started again: nothing of juliet's goes */
    CHECK(query(a, "romeo", (rt_archive_query_t){.max = 50}, &p));
    CHECK_EQ(p.n, 1);
    rt_accounts_close(a);
}

/* ---- PEP (XEP-0163) ---- */

typedef struct {
    char all[1024];
    int n;
} items_t;

static void gather_item(const char *id, const void *payload, size_t len, void *arg)
{
    items_t *it = arg;
    size_t at = strlen(it->all);
    snprintf(it->all + at, sizeof(it->all) - at, "%s%s=%.*s", it->n++ ? " " : "", id, (int)len,
             (const char *)payload);
}

static void gather_last(const char *node, uint32_t access, const char *id, const void *payload,
                        size_t len, void *arg)
{
    items_t *it = arg;
    size_t at = strlen(it->all);
    snprintf(it->all + at, sizeof(it->all) - at, "%s%s/%u/%s=%.*s", it->n++ ? " " : "", node,
             access, id, (int)len, (const char *)payload);
}

static const char *items_of(rt_accounts_t *a, const char *user, const char *node, const char *item,
                            uint32_t max, items_t *it)
{
    memset(it, 0, sizeof(*it));
    int rc = rt_pep_items(a, H, user, node, item, max, gather_item, it);
    if (rc)
        snprintf(it->all, sizeof(it->all), "error %d", rc);
    return it->all;
}

static int publish(rt_accounts_t *a, const char *user, const char *node, const char *item,
                   const char *payload, const rt_pep_node_t *want, const rt_pep_bounds_t *b)
{
    rt_pep_node_t got;
    return rt_pep_publish(a, H, user, node, item, payload, strlen(payload), want, b, &got);
}

static void test_pep(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "pepper");
    rt_pep_bounds_t b = {.nodes = 3, .items = 4, .bytes = 64};
    items_t it;
    /* Auto-create with the defaults: presence access, one item kept (the newest). */
    CHECK_EQ(publish(a, "pepper", "nick", "current", "<n>a</n>", NULL, &b), 0);
    CHECK_EQ(publish(a, "pepper", "nick", "other", "<n>b</n>", NULL, &b), 0);
    CHECK(strcmp(items_of(a, "pepper", "nick", NULL, 10, &it), "other=<n>b</n>") == 0);
    rt_pep_node_t cfg;
    CHECK_EQ(rt_pep_node(a, H, "pepper", "nick", &cfg), 0);
    CHECK_EQ(cfg.access, RT_PEP_PRESENCE);
    CHECK_EQ(cfg.max_items, 1);
    /* Options: max_items above the bound is the bound; a republished id is the newest. */
    rt_pep_node_t list = {.access = RT_PEP_WHITELIST, .max_items = 1000};
    CHECK_EQ(publish(a, "pepper", "marks", "1", "one", &list, &b), 0);
    CHECK_EQ(publish(a, "pepper", "marks", "2", "two", &list, &b), 0);
    CHECK_EQ(publish(a, "pepper", "marks", "1", "uno", &list, &b), 0);
    CHECK(strcmp(items_of(a, "pepper", "marks", NULL, 10, &it), "2=two 1=uno") == 0);
    CHECK(strcmp(items_of(a, "pepper", "marks", NULL, 1, &it), "1=uno") == 0);
    CHECK(strcmp(items_of(a, "pepper", "marks", "2", 0, &it), "2=two") == 0);
    CHECK_EQ(rt_pep_node(a, H, "pepper", "marks", &cfg), 0);
    CHECK_EQ(cfg.max_items, 4);
    for (int i = 3; i <= 5; i++) {
        char id[8];
        snprintf(id, sizeof(id), "%d", i);
        CHECK_EQ(publish(a, "pepper", "marks", id, "x", &list, &b), 0);
    }
    CHECK(strcmp(items_of(a, "pepper", "marks", NULL, 10, &it), "1=uno 3=x 4=x 5=x") == 0);
    /* What the options do not say is not checked; what they say must match (7.1.5). */
    rt_pep_node_t only_access = {.access = RT_PEP_WHITELIST, .max_items = 0};
    CHECK_EQ(publish(a, "pepper", "marks", "6", "y", &only_access, &b), 0);
    rt_pep_node_t open = {.access = RT_PEP_OPEN, .max_items = 0};
    CHECK_EQ(publish(a, "pepper", "marks", "7", "z", &open, &b), RT_EEXIST);
    CHECK(strcmp(items_of(a, "pepper", "marks", "7", 0, &it), "") == 0);
    /* Bounds: a third node fits, a fourth does not; bytes count what is kept after a publish
       (the 4 newest of marks: 1+1+1+1; nick's 8; 64 in all). */
    CHECK_EQ(publish(a, "pepper", "third", "i", "t", NULL, &b), 0);
    CHECK_EQ(publish(a, "pepper", "fourth", "i", "t", NULL, &b), RT_ELIMIT);
    char big[60];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    CHECK_EQ(publish(a, "pepper", "third", "i", big, NULL, &b), RT_ELIMIT);
    CHECK(strcmp(items_of(a, "pepper", "third", NULL, 10, &it), "i=t") == 0);
    big[40] = 0;
    CHECK_EQ(publish(a, "pepper", "third", "i", big, NULL, &b), 0);
    /* Each node's newest item, with its access model. */
    items_t last = {0};
    CHECK_EQ(rt_pep_last(a, H, "pepper", gather_last, &last), 0);
    CHECK_EQ(last.n, 3);
    CHECK(strstr(last.all, "marks/2/6=y") != NULL);
    CHECK(strstr(last.all, "nick/0/other=<n>b</n>") != NULL);
    /* Retract, delete, and no account. */
    CHECK_EQ(rt_pep_delete(a, H, "pepper", "marks", "6"), 0);
    CHECK_EQ(rt_pep_delete(a, H, "pepper", "marks", "6"), RT_ENOTFOUND);
    CHECK_EQ(rt_pep_delete(a, H, "pepper", "nick", NULL), 0);
    CHECK(strcmp(items_of(a, "pepper", "nick", NULL, 10, &it), "error -2") == 0);
    CHECK_EQ(rt_pep_delete(a, H, "pepper", "nick", NULL), RT_ENOTFOUND);
    CHECK_EQ(publish(a, "nobody", "nick", "i", "x", NULL, &b), RT_ENOTFOUND);
    CHECK_EQ(publish(a, "pepper", "", "i", "x", NULL, &b), RT_EINVAL);
    /* The account's deletion takes its nodes. */
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_del(a, H, "pepper", NULL, NULL, err, sizeof(err)), 0);
    add_user(a, "pepper");
    memset(&last, 0, sizeof(last));
    CHECK_EQ(rt_pep_last(a, H, "pepper", gather_last, &last), 0);
    CHECK_EQ(last.n, 0);
    CHECK(strcmp(items_of(a, "pepper", "marks", NULL, 10, &it), "error -2") == 0);
    rt_accounts_close(a);
}

/* ---- FAST tokens (XEP-0484) ---- */

static void gather_token(const void *token, size_t len, void *arg)
{
    items_t *it = arg;
    size_t at = strlen(it->all);
    snprintf(it->all + at, sizeof(it->all) - at, "%s%.*s", it->n++ ? " " : "", (int)len,
             (const char *)token);
}

static const char *tokens_of(rt_accounts_t *a, const char *user, const char *agent,
                             const char *mech, int64_t now, items_t *it)
{
    memset(it, 0, sizeof(*it));
    int rc = rt_fast_get(a, H, user, agent, mech, now, gather_token, it);
    if (rc)
        snprintf(it->all, sizeof(it->all), "error %d", rc);
    return it->all;
}

static void test_fast_tokens(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "quick");
    static const char m[] = "HT-SHA-256-NONE";
    items_t it;
    CHECK_EQ(rt_fast_put(a, H, "quick", "phone", m, "t1", 2, 1000, 4), 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", m, 500, &it), "t1") == 0);
    /* A new token keeps the one before it valid until its own expiry. */
    CHECK_EQ(rt_fast_put(a, H, "quick", "phone", m, "t2", 2, 2000, 4), 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", m, 500, &it), "t2 t1") == 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", m, 1500, &it), "t2") == 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", m, 2000, &it), "error -2") == 0);
    /* Bound to its client and its mechanism. */
    CHECK(strcmp(tokens_of(a, "quick", "laptop", m, 500, &it), "error -2") == 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", "HT-SHA-256-ENDP", 500, &it), "error -2") == 0);
    /* Past max_agents clients, those expiring first lose theirs. */
    CHECK_EQ(rt_fast_put(a, H, "quick", "a", m, "ta", 2, 3000, 2), 0);
    CHECK_EQ(rt_fast_put(a, H, "quick", "b", m, "tb", 2, 4000, 2), 0);
    CHECK(strcmp(tokens_of(a, "quick", "phone", m, 500, &it), "error -2") == 0);
    CHECK(strcmp(tokens_of(a, "quick", "a", m, 500, &it), "ta") == 0);
    /* Forgotten one client at a time or all at once; and with the account. */
    CHECK_EQ(rt_fast_del(a, H, "quick", "a"), 0);
    CHECK(strcmp(tokens_of(a, "quick", "a", m, 500, &it), "error -2") == 0);
    CHECK(strcmp(tokens_of(a, "quick", "b", m, 500, &it), "tb") == 0);
    CHECK_EQ(rt_fast_del(a, H, "quick", NULL), 0);
    CHECK(strcmp(tokens_of(a, "quick", "b", m, 500, &it), "error -2") == 0);
    CHECK_EQ(rt_fast_put(a, H, "quick", "b", m, "tb", 2, 4000, 2), 0);
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_passwd(a, H, "quick", "other", 5, 4096, err, sizeof(err)), 0);
    CHECK(strcmp(tokens_of(a, "quick", "b", m, 500, &it), "error -2") == 0);
    CHECK_EQ(rt_fast_put(a, H, "nobody", "b", m, "tb", 2, 4000, 2), RT_ENOTFOUND);
    CHECK_EQ(rt_fast_put(a, H, "quick", "b", m, "", 0, 4000, 2), RT_EINVAL);
    rt_accounts_close(a);
}

/* ---- Push registrations (XEP-0357) ---- */

static void gather_push(const char *jid, const char *node, const void *options, size_t len,
                        void *arg)
{
    items_t *it = arg;
    size_t at = strlen(it->all);
    snprintf(it->all + at, sizeof(it->all) - at, "%s%s/%s=%.*s", it->n++ ? " " : "", jid, node,
             (int)len, (const char *)options);
}

static const char *pushes_of(rt_accounts_t *a, const char *user, items_t *it)
{
    memset(it, 0, sizeof(*it));
    int rc = rt_push_each(a, H, user, gather_push, it);
    if (rc)
        snprintf(it->all, sizeof(it->all), "error %d", rc);
    return it->all;
}

static void test_push_registrations(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    add_user(a, "pusher");
    items_t it;
    CHECK_EQ(rt_push_put(a, H, "pusher", "app.example", "n1", "<x/>", 4, 1000, 3), 0);
    CHECK_EQ(rt_push_put(a, H, "pusher", "app.example", "n2", NULL, 0, 2000, 3), 0);
    CHECK(strcmp(pushes_of(a, "pusher", &it), "app.example/n1=<x/> app.example/n2=") == 0);
    /* Enabled again: its options replaced, now the newest. */
    CHECK_EQ(rt_push_put(a, H, "pusher", "app.example", "n1", "<y/>", 4, 3000, 3), 0);
    CHECK(strcmp(pushes_of(a, "pusher", &it), "app.example/n2= app.example/n1=<y/>") == 0);
    /* Past max for the account, the oldest goes. */
    CHECK_EQ(rt_push_put(a, H, "pusher", "other.example", "n3", NULL, 0, 4000, 2), 0);
    CHECK(strcmp(pushes_of(a, "pusher", &it), "app.example/n1=<y/> other.example/n3=") == 0);
    /* Disabled at one node, or at all of a JID's. */
    CHECK_EQ(rt_push_put(a, H, "pusher", "app.example", "n4", NULL, 0, 5000, 3), 0);
    CHECK_EQ(rt_push_del(a, H, "pusher", "app.example", "n1"), 0);
    CHECK(strcmp(pushes_of(a, "pusher", &it), "other.example/n3= app.example/n4=") == 0);
    CHECK_EQ(rt_push_del(a, H, "pusher", "app.example", NULL), 0);
    CHECK(strcmp(pushes_of(a, "pusher", &it), "other.example/n3=") == 0);
    /* Bounds and unknown accounts; and they go with the account. */
    char big[RT_PUSH_OPTIONS_MAX + 1];
    memset(big, 'x', sizeof(big));
    CHECK_EQ(rt_push_put(a, H, "pusher", "app.example", "n", big, sizeof(big), 1, 3), RT_EINVAL);
    CHECK_EQ(rt_push_put(a, H, "pusher", "", "n", NULL, 0, 1, 3), RT_EINVAL);
    CHECK_EQ(rt_push_put(a, H, "nobody", "app.example", "n", NULL, 0, 1, 3), RT_ENOTFOUND);
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_del(a, H, "pusher", NULL, NULL, err, sizeof(err)), 0);
    add_user(a, "pusher");
    CHECK(strcmp(pushes_of(a, "pusher", &it), "") == 0);
    rt_accounts_close(a);
}

/* ---- Persistent rooms (XEP-0045) ---- */

typedef struct {
    char all[512];
    int n;
} rooms_t;

static void gather_room(const char *service, const char *room, const void *state, size_t len,
                        void *arg)
{
    rooms_t *r = arg;
    size_t at = strlen(r->all);
    snprintf(r->all + at, sizeof(r->all) - at, "%s%s@%s=%.*s", r->n++ ? " " : "", room, service,
             (int)len, (const char *)state);
}

static void test_muc_rooms(void)
{
    rt_accounts_t *a = open_in(dir);
    if (!a)
        return;
    rooms_t r = {0};
    CHECK_EQ(rt_muc_rooms_each(a, gather_room, &r), 0);
    CHECK_EQ(r.n, 0);
    /* Keyed as accounts are: the service's domain and the room's prepared localpart. */
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "Lobby", "v1", 2), 0);
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "attic", "x", 1), 0);
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "lobby", "v2", 2), 0); /* replaces */
    CHECK_EQ(rt_muc_rooms_each(a, gather_room, &r), 0);
    CHECK(strcmp(r.all, "attic@conference." H "=x lobby@conference." H "=v2") == 0);
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "attic", NULL, 0), 0); /* forgotten */
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "nowhere", NULL, 0), 0);
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "bad@room", "x", 1), RT_EINVAL);
    memset(&r, 0, sizeof(r));
    CHECK_EQ(rt_muc_rooms_each(a, gather_room, &r), 0);
    CHECK(strcmp(r.all, "lobby@conference." H "=v2") == 0);
    rt_accounts_close(a);
    /* Kept across opens: what a restart reads. */
    a = open_in(dir);
    if (!a)
        return;
    memset(&r, 0, sizeof(r));
    CHECK_EQ(rt_muc_rooms_each(a, gather_room, &r), 0);
    CHECK_EQ(r.n, 1);
    /* A put while the store's read snapshot is open (the logins' reads share one, for some
       ms) is a write of its own, committed at once: left inside the snapshot, it was lost
       when rtd stopped before the snapshot's end (the store closes the file then). */
    CHECK_EQ(rt_accounts_snapshot(a), 0);
    CHECK_EQ(rt_muc_room_put(a, "conference." H, "lobby", NULL, 0), 0);
    rt_accounts_close(a);
    a = open_in(dir);
    if (!a)
        return;
    memset(&r, 0, sizeof(r));
    CHECK_EQ(rt_muc_rooms_each(a, gather_room, &r), 0);
    CHECK_EQ(r.n, 0);
    rt_accounts_close(a);
}

static void test_migration_from_schema_2(void)
{
    char d[200], path[260];
    snprintf(d, sizeof(d), "%s/v2", tmpdir_path);
    snprintf(path, sizeof(path), "%s/%s", d, RT_ACCOUNTS_FILE);
    rt_accounts_t *a = open_in(d);
    if (!a)
        return;
    add_user(a, "juliet");
    rt_accounts_close(a);
    /* A version 2 file is this one without the tables of versions 3 to 7. */
    sqlite3 *db = open_db(path);
    CHECK_EQ(sqlite3_exec(db,
                          "DROP TABLE blocklist; DROP TABLE vcard; DROP TABLE archive; "
                          "DROP TABLE archive_counts; DROP TABLE muc_rooms; "
                          "DROP TABLE pep_nodes; DROP TABLE pep_items; DROP TABLE fast_tokens; "
                          "DROP TABLE push; "
                          "PRAGMA user_version = 2;",
                          NULL, NULL, NULL),
             SQLITE_OK);
    sqlite3_close(db);
    a = open_in(d);
    if (!a)
        return;
    CHECK_EQ(rt_accounts_check_password(a, H, "juliet", "pencil", 6), 0);
    CHECK_EQ(rt_vcard_set(a, H, "juliet", "<vCard/>", 8), 0);
    rt_accounts_close(a);
    db = open_db(path);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), RT_ACCOUNTS_SCHEMA);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM vcard"), 1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM muc_rooms"), 0); /* version 4's table */
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM pep_items"), 0); /* and 5's */
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM push"), 0);      /* and 7's */
    sqlite3_close(db);
}

/*
** What archiving costs the store (a figure, not a bound): 100 accounts chatting in pairs, each
** chat archived for both, written in batches as the store actor writes them. Most of it is
** SQLite writing each index page a transaction touches to the WAL whole: a batch with more
** copies for each account shares those pages among more of them.
*/
static void archive_cost(rt_accounts_t *a, int batch, int64_t *id)
{
    static const char msg[] = "<message xmlns='jabber:client' from='u0@example.com/r1' "
                              "to='u1@example.com' type='chat'><body>hello there</body></message>";
#ifdef NDEBUG
    enum { CHATS = 2000 };
#else
    enum { CHATS = 500 }; /* debug and sanitizer builds: the figure means little there */
#endif
    char users[100][8], withs[100][24];
    for (int i = 0; i < 100; i++) {
        snprintf(users[i], sizeof(users[i]), "u%d", i);
        snprintf(withs[i], sizeof(withs[i]), "u%d@" H, i ^ 1);
    }
    rt_archive_entry_t *e = malloc(sizeof(*e) * 2 * (size_t)batch);
    if (!e)
        return;
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    for (int c = 0; c < CHATS; c += batch) {
        for (int k = 0; k < batch; k++) {
            int from = (c + k) % 100;
            e[2 * k] = (rt_archive_entry_t){H,       users[from], withs[from], msg, sizeof(msg) - 1,
                                            (*id)++, 1000,        false};
            e[2 * k + 1] = (rt_archive_entry_t){
                H, users[from ^ 1], withs[from ^ 1], msg, sizeof(msg) - 1, (*id)++, 1000, false};
        }
        CHECK_EQ(rt_archive_put(a, e, 2 * (size_t)batch, 1000, 10000, NULL), 0);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double us = ((double)(c1.tv_sec - c0.tv_sec) * 1e6 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e3) /
                (2.0 * CHATS);
    printf("  archive: %.1f us of CPU a copy in batches of %d chats (100 accounts)\n", us, batch);
    free(e);
}

static void test_archive_cost(void)
{
    char d[200];
    snprintf(d, sizeof(d), "%s/cost", tmpdir_path);
    rt_accounts_t *a = open_in(d);
    if (!a)
        return;
    for (int i = 0; i < 100; i++) {
        char u[8];
        snprintf(u, sizeof(u), "u%d", i);
        add_user(a, u);
    }
    int64_t id = 1;
    archive_cost(a, 1, &id);
    archive_cost(a, 50, &id);
    archive_cost(a, 500, &id);
    rt_accounts_close(a);
}

int main(void)
{
    if (tmpdir_make("test_xeps_store") != 0)
        return 2;
    snprintf(dir, sizeof(dir), "%s/data", tmpdir_path);
    RUN(test_blocklist);
    RUN(test_vcard);
    RUN(test_archive);
    RUN(test_archive_ids);
    RUN(test_delete_account);
    RUN(test_muc_rooms);
    RUN(test_pep);
    RUN(test_fast_tokens);
    RUN(test_push_registrations);
    RUN(test_migration_from_schema_2);
    RUN(test_archive_cost);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

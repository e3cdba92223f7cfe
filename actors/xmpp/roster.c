/*
** Rosters and offline messages in xmpp.db (roster.h): what a put may hold, and the
** statements, each call one transaction on the accounts handle's connection (the tables
** are accounts.c's schema version 2).
*/
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounts_impl.h"
#include "roster.h"
#include "rt.h"

#define BARE_JID_MAX (2 * RT_JID_PART_MAX + 1) /* bytes of local@domain */
#define GROUPS_BLOB_MAX (RT_ROSTER_GROUPS_MAX * (RT_ROSTER_TEXT_MAX + 1))

enum {
    R_ACCOUNT, /* the account's counts (NULLs before its first roster or offline change) */
    R_VERSION,
    R_ITEMS,
    R_ITEM,
    R_PUT,
    R_DEL,
    R_STATE,  /* an item's subscription state alone */
    R_COUNTS, /* adds to an account's counts; the new roster version */
    O_PUSH,
    O_LIST,
    O_TAKEN,
    D_ROSTER,
    D_OFFLINE,
    D_COUNTS,
    R_N
};
_Static_assert(R_N <= RT__ROSTER_STMTS, "accounts_impl.h: room for roster.c's statements");

#define ITEM_COLUMNS "SELECT jid, name, groups, state FROM roster WHERE host = ?1 AND username = ?2"

static const char *const sql[R_N] = {
    [R_ACCOUNT] = "SELECT c.roster_items, c.offline_count, c.offline_bytes FROM accounts a "
                  "LEFT JOIN account_counts c ON c.host = a.host AND c.username = a.username "
                  "WHERE a.host = ?1 AND a.username = ?2",
    [R_VERSION] = "SELECT roster_version FROM account_counts WHERE host = ?1 AND username = ?2",
    [R_ITEMS] = ITEM_COLUMNS " ORDER BY jid",
    [R_ITEM] = ITEM_COLUMNS " AND jid = ?3",
    [R_PUT] = "INSERT OR REPLACE INTO roster VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [R_DEL] = "DELETE FROM roster WHERE host = ?1 AND username = ?2 AND jid = ?3",
    [R_STATE] = "UPDATE roster SET state = ?4 WHERE host = ?1 AND username = ?2 AND jid = ?3",
    [R_COUNTS] = "INSERT INTO account_counts VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                 "ON CONFLICT(host, username) DO UPDATE SET "
                 "roster_version = roster_version + excluded.roster_version, "
                 "roster_items = roster_items + excluded.roster_items, "
                 "offline_count = offline_count + excluded.offline_count, "
                 "offline_bytes = offline_bytes + excluded.offline_bytes "
                 "RETURNING roster_version",
    [O_PUSH] = "INSERT INTO offline(host, username, stamp, stanza) VALUES (?1, ?2, ?3, ?4)",
    [O_LIST] = ("SELECT seq, stamp, stanza FROM offline WHERE host = ?1 AND username = ?2 "
                "ORDER BY seq LIMIT ?3"), /* one string: clang asks for the parentheses */
    [O_TAKEN] = "DELETE FROM offline WHERE host = ?1 AND username = ?2 AND seq <= ?3",
    [D_ROSTER] = "DELETE FROM roster WHERE host = ?1 AND username = ?2",
    [D_OFFLINE] = "DELETE FROM offline WHERE host = ?1 AND username = ?2",
    /* The row stays, its roster version one past the last: a new account of the name goes on
       from there, so a client's cached version of the old roster never reads as current. */
    [D_COUNTS] = "UPDATE account_counts SET roster_version = roster_version + 1, "
                 "roster_items = 0, offline_count = 0, offline_bytes = 0 "
                 "WHERE host = ?1 AND username = ?2",
};

int rt__roster_prepare(rt_accounts_t *a)
{
    for (int i = 0; i < R_N; i++)
        if (sqlite3_prepare_v3(a->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &a->rst[i], NULL) !=
            SQLITE_OK)
            return RT_EAGAIN;
    return 0;
}

/* Runs a statement that returns no row to its end, and resets it. */
static int run(sqlite3_stmt *st)
{
    int s = sqlite3_step(st);
    sqlite3_reset(st);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

static sqlite3_stmt *keyed(rt_accounts_t *a, int which, const rt__names_t *n)
{
    return rt__accounts_keyed(a->rst[which], n);
}

static int add_counts(rt_accounts_t *a, const rt__names_t *n, int64_t version, int64_t items,
                      int64_t count, int64_t bytes, uint64_t *out);

int rt__roster_forget(rt_accounts_t *a, const rt__names_t *n, rt__forgot_t **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    char bare[BARE_JID_MAX + 1];
    snprintf(bare, sizeof(bare), "%s@%s", n->user, n->host);
    /* The roster's JIDs first: the loop below writes the table this statement reads. */
    rt_buf_t jids = {0};
    size_t count = 0;
    sqlite3_stmt *st = keyed(a, R_ITEMS, n);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        const char *j = (const char *)sqlite3_column_text(st, 0);
        rt_buf_add(&jids, j ? j : "", j ? strlen(j) + 1 : 1);
        count++;
    }
    sqlite3_reset(st);
    int rc = s != SQLITE_DONE ? RT_EAGAIN : jids.oom ? RT_ENOMEM : 0;
    rt__forgot_t *changed = count ? calloc(count, sizeof(*changed)) : NULL;
    if (count && !changed)
        rc = RT_ENOMEM;
    for (size_t at = 0; rc == 0 && at < jids.len; at += strlen(jids.data + at) + 1) {
        const char *j = jids.data + at, *sep = strchr(j, '@');
        rt__names_t cn;
        char user[RT_JID_PART_MAX + 1], err[RT_ACCOUNTS_ERR_LEN];
        if (!sep || (size_t)(sep - j) > RT_JID_PART_MAX)
            continue; /* a server's JID, or another domain's too long a name: no roster here */
        memcpy(user, j, (size_t)(sep - j));
        user[sep - j] = 0;
        if (rt__accounts_names(sep + 1, user, &cn, err, sizeof(err)) != 0)
            continue;
        st = keyed(a, R_ITEM, &cn);
        sqlite3_bind_text(st, 3, bare, -1, SQLITE_STATIC);
        s = sqlite3_step(st);
        unsigned state =
            s == SQLITE_ROW ? (unsigned)sqlite3_column_int64(st, 3) & RT_ROSTER_STATES : 0;
        sqlite3_reset(st);
        if (s != SQLITE_ROW && s != SQLITE_DONE)
            rc = RT_EAGAIN;
        if (rc || !state)
            continue;
        /* An item that held only the account's request goes; another keeps its name and
           groups, with no subscription either way. */
        bool hidden = state == RT_ROSTER_PENDING_IN;
        st = keyed(a, hidden ? R_DEL : R_STATE, &cn);
        sqlite3_bind_text(st, 3, bare, -1, SQLITE_STATIC);
        if (!hidden)
            sqlite3_bind_int64(st, 4, 0);
        rc = run(st);
        rt__forgot_t *f = &changed[(*nout)];
        f->owner = cn;
        if (rc == 0)
            rc = add_counts(a, &cn, 1, hidden ? -1 : 0, 0, 0, &f->version);
        if (rc == 0)
            (*nout)++;
    }
    rt_buf_free(&jids);
    if (rc) {
        free(changed);
        *nout = 0;
        return rc;
    }
    *out = changed;
    return 0;
}

int rt__roster_drop(rt_accounts_t *a, const rt__names_t *n)
{
    if (run(keyed(a, D_ROSTER, n)) || run(keyed(a, D_OFFLINE, n)) || run(keyed(a, D_COUNTS, n)))
        return RT_EAGAIN;
    return 0;
}

/* Names as keys; a name that does not prepare is RT_EINVAL (no account can have it). */
static int names(const char *host, const char *user, rt__names_t *n)
{
    char err[RT_ACCOUNTS_ERR_LEN];
    return rt__accounts_names(host, user, n, err, sizeof(err));
}

/* ---- Rosters ---- */

/*
** The row the statement is on as an item: strings and group pointers into SQLite's copy of
** the row, valid until the statement moves. groups is a blob of names each followed by a
** NUL; read as text, SQLite adds one more NUL, so even a damaged blob ends in one.
*/
static void row_item(sqlite3_stmt *st, rt_roster_item_t *it)
{
    const char *jid = (const char *)sqlite3_column_text(st, 0);
    const char *name = (const char *)sqlite3_column_text(st, 1);
    it->jid = jid ? jid : "";
    it->name = name ? name : "";
    const char *g = (const char *)sqlite3_column_text(st, 2); /* NULL for an empty blob */
    size_t glen = g ? (size_t)sqlite3_column_bytes(st, 2) : 0;
    it->ngroups = 0;
    for (size_t at = 0; at < glen && it->ngroups < RT_ROSTER_GROUPS_MAX; at += strlen(g + at) + 1)
        it->groups[it->ngroups++] = g + at;
    it->state = (unsigned)sqlite3_column_int64(st, 3) & RT_ROSTER_STATES;
}

int rt_roster_get(rt_accounts_t *a, const char *host, const char *user,
                  int (*fn)(const rt_roster_item_t *it, void *arg), void *arg, uint64_t *version)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    /* One snapshot: the version is the one of the items read. */
    if (rt__accounts_begin(a, false) != 0)
        return RT_EAGAIN;
    sqlite3_stmt *st = keyed(a, R_VERSION, &n);
    int s = sqlite3_step(st);
    uint64_t v = s == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (s != SQLITE_ROW && s != SQLITE_DONE)
        return rt__accounts_end(a, RT_EAGAIN);
    st = keyed(a, R_ITEMS, &n);
    rt_roster_item_t it;
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
        row_item(st, &it);
        rc = fn(&it, arg);
    }
    if (rc == 0 && s != SQLITE_DONE)
        rc = RT_EAGAIN;
    sqlite3_reset(st);
    int end = rt__accounts_end(a, rc == RT_EAGAIN ? rc : 0); /* fn's stop is no failure */
    if (end < 0)
        return end;
    if (version)
        *version = v;
    return rc;
}

int rt_roster_item(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                   int (*fn)(const rt_roster_item_t *it, void *arg), void *arg)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    sqlite3_stmt *st = keyed(a, R_ITEM, &n);
    sqlite3_bind_text(st, 3, jid, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        rt_roster_item_t it;
        row_item(st, &it);
        fn(&it, arg);
    }
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 0 : s == SQLITE_DONE ? RT_ENOTFOUND : RT_EAGAIN;
}

static int refuse(char *err, size_t errlen, const char *why, const char *what)
{
    snprintf(err, errlen, "%s%s", why, what);
    return RT_EINVAL;
}

/* A name or group: 0 or RT_EINVAL with err (what: "the name", "a group"). */
static int check_text(const char *s, size_t len, const char *what, char *err, size_t errlen)
{
    if (len > RT_ROSTER_TEXT_MAX) {
        snprintf(err, errlen, "%s is over %d bytes", what, RT_ROSTER_TEXT_MAX);
        return RT_EINVAL;
    }
    if (!rt_utf8_text(s, len))
        return refuse(err, errlen, what, " is not UTF-8 text");
    return 0;
}

/*
** What rt_roster_put would store of it: 0 with the groups' blob in groups (*glen bytes), or
** RT_EINVAL with err. Nothing past a bound gets as far as the database.
*/
static int check_item(const rt_roster_item_t *it, char *groups, size_t *glen, char *err,
                      size_t errlen)
{
    size_t jlen = it->jid ? strlen(it->jid) : 0;
    if (jlen == 0 || jlen > BARE_JID_MAX || memchr(it->jid, '/', jlen))
        return refuse(err, errlen, "the jid is not a bare JID", "");
    if (!rt_utf8_text(it->jid, jlen))
        return refuse(err, errlen, "the jid", " is not UTF-8 text");
    const char *name = it->name ? it->name : "";
    int rc = check_text(name, strlen(name), "the name", err, errlen);
    if (rc)
        return rc;
    if (it->state & ~RT_ROSTER_STATES) {
        snprintf(err, errlen, "unknown state bits 0x%x", it->state & ~RT_ROSTER_STATES);
        return RT_EINVAL;
    }
    if (it->ngroups > RT_ROSTER_GROUPS_MAX) {
        snprintf(err, errlen, "%u groups, at most %d", it->ngroups, RT_ROSTER_GROUPS_MAX);
        return RT_EINVAL;
    }
    /* RFC 6121 2.3.3: an empty group is not-acceptable and a repeated one bad-request. */
    *glen = 0;
    for (unsigned i = 0; i < it->ngroups; i++) {
        const char *g = it->groups[i];
        size_t len = g ? strlen(g) : 0;
        if (len == 0)
            return refuse(err, errlen, "a group is empty", "");
        if ((rc = check_text(g, len, "a group", err, errlen)) != 0)
            return rc;
        for (unsigned j = 0; j < i; j++)
            if (strcmp(it->groups[j], g) == 0)
                return refuse(err, errlen, "a group is named twice: ", g);
        memcpy(groups + *glen, g, len + 1);
        *glen += len + 1;
    }
    return 0;
}

/*
** Adds to n's counts (a row made at the first change) in the caller's transaction; the new
** roster version into *version (if set). 0 or RT_EAGAIN.
*/
static int add_counts(rt_accounts_t *a, const rt__names_t *n, int64_t version, int64_t items,
                      int64_t count, int64_t bytes, uint64_t *out)
{
    sqlite3_stmt *st = keyed(a, R_COUNTS, n);
    sqlite3_bind_int64(st, 3, version);
    sqlite3_bind_int64(st, 4, items);
    sqlite3_bind_int64(st, 5, count);
    sqlite3_bind_int64(st, 6, bytes);
    /* With RETURNING the change is made by the first step. */
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW && out)
        *out = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 0 : RT_EAGAIN;
}

/* The account's counts: 0, RT_ENOTFOUND (no account) or RT_EAGAIN. */
static int account(rt_accounts_t *a, const rt__names_t *n, int64_t *items, int64_t *count,
                   int64_t *bytes)
{
    sqlite3_stmt *st = keyed(a, R_ACCOUNT, n);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *items = sqlite3_column_int64(st, 0); /* NULL reads as 0 */
        *count = sqlite3_column_int64(st, 1);
        *bytes = sqlite3_column_int64(st, 2);
    }
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 0 : s == SQLITE_DONE ? RT_ENOTFOUND : RT_EAGAIN;
}

/* Whether n's roster has jid: 1, 0, or RT_EAGAIN. */
static int has_item(rt_accounts_t *a, const rt__names_t *n, const char *jid)
{
    sqlite3_stmt *st = keyed(a, R_ITEM, n);
    sqlite3_bind_text(st, 3, jid, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 1 : s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

int rt_roster_put(rt_accounts_t *a, const char *host, const char *user, const rt_roster_item_t *it,
                  uint32_t max_items, uint64_t *version, char *err, size_t errlen)
{
    rt__names_t n;
    int rc = rt__accounts_names(host, user, &n, err, errlen);
    if (rc)
        return rc;
    char groups[GROUPS_BLOB_MAX];
    size_t glen;
    if ((rc = check_item(it, groups, &glen, err, errlen)) != 0)
        return rc;
    if (rt__accounts_begin(a, true) != 0)
        return rt__accounts_db_error(a, err, errlen);
    int64_t items, count, bytes;
    int had = 0;
    rc = account(a, &n, &items, &count, &bytes);
    if (rc == RT_ENOTFOUND)
        snprintf(err, errlen, "no account %s@%s", n.user, n.host);
    if (rc == 0 && (had = has_item(a, &n, it->jid)) < 0)
        rc = had;
    if (rc == 0 && !had && items >= (int64_t)max_items) {
        snprintf(err, errlen, "the roster has %lld items, at most %u", (long long)items, max_items);
        rc = RT_ELIMIT;
    }
    if (rc == 0) {
        sqlite3_stmt *st = keyed(a, R_PUT, &n);
        sqlite3_bind_text(st, 3, it->jid, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, it->name ? it->name : "", -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 5, groups, (int)glen, SQLITE_STATIC);
        sqlite3_bind_int64(st, 6, it->state);
        rc = run(st);
        sqlite3_clear_bindings(st); /* groups is on this stack */
    }
    if (rc == 0)
        rc = add_counts(a, &n, 1, had ? 0 : 1, 0, 0, version);
    if (rc == RT_EAGAIN)
        rt__accounts_db_error(a, err, errlen);
    int end = rt__accounts_end(a, rc);
    if (end == RT_EAGAIN && rc != RT_EAGAIN)
        rt__accounts_db_error(a, err, errlen);
    return end;
}

int rt_roster_del(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                  uint64_t *version)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    sqlite3_stmt *st = keyed(a, R_DEL, &n);
    sqlite3_bind_text(st, 3, jid, -1, SQLITE_STATIC);
    rc = run(st);
    if (rc == 0 && sqlite3_changes(a->db) == 0)
        rc = RT_ENOTFOUND;
    if (rc == 0)
        rc = add_counts(a, &n, 1, -1, 0, 0, version);
    return rt__accounts_end(a, rc);
}

/* ---- Offline messages ---- */

int rt_offline_push(rt_accounts_t *a, const char *host, const char *user, const void *stanza,
                    size_t len, int64_t stamp_ms, uint32_t max_count, uint64_t max_bytes)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    if (len == 0)
        return RT_EINVAL;
    if (len > max_bytes || max_count == 0)
        return RT_ELIMIT; /* would pass the bound whatever is stored */
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    int64_t items, count, bytes;
    rc = account(a, &n, &items, &count, &bytes);
    if (rc == 0 && ((uint64_t)count >= max_count || (uint64_t)bytes > max_bytes - len))
        rc = RT_ELIMIT;
    if (rc == 0) {
        sqlite3_stmt *st = keyed(a, O_PUSH, &n);
        sqlite3_bind_int64(st, 3, stamp_ms);
        sqlite3_bind_blob64(st, 4, stanza, len, SQLITE_STATIC);
        rc = run(st);
        sqlite3_clear_bindings(st); /* the stanza is the caller's */
    }
    if (rc == 0)
        rc = add_counts(a, &n, 0, 0, 1, (int64_t)len, NULL);
    return rt__accounts_end(a, rc);
}

int rt_offline_take(rt_accounts_t *a, const char *host, const char *user, uint32_t max,
                    int (*fn)(const void *stanza, size_t len, int64_t stamp_ms, void *arg),
                    void *arg)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    /* Most logins find nothing waiting: they read, and take no write lock. */
    int64_t items, waiting, waiting_bytes;
    rc = account(a, &n, &items, &waiting, &waiting_bytes);
    if (rc == RT_ENOTFOUND || (rc == 0 && waiting == 0))
        return 0;
    if (rc)
        return rc;
    if (max > INT32_MAX)
        max = INT32_MAX; /* the count taken is returned as an int */
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    /* fn takes a prefix of the list: the taken ones are those up to the last seq taken. */
    sqlite3_stmt *st = keyed(a, O_LIST, &n);
    sqlite3_bind_int64(st, 3, max);
    int64_t taken = 0, bytes = 0, last = 0;
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        const void *p = sqlite3_column_blob(st, 2);
        size_t len = (size_t)sqlite3_column_bytes(st, 2);
        if (fn(p, len, sqlite3_column_int64(st, 1), arg) != 0)
            break;
        last = sqlite3_column_int64(st, 0);
        taken++;
        bytes += (int64_t)len;
    }
    rc = s == SQLITE_ROW || s == SQLITE_DONE ? 0 : RT_EAGAIN;
    sqlite3_reset(st);
    if (rc == 0 && taken > 0) {
        st = keyed(a, O_TAKEN, &n);
        sqlite3_bind_int64(st, 3, last);
        if ((rc = run(st)) == 0)
            rc = add_counts(a, &n, 0, 0, -taken, -bytes, NULL);
    }
    rc = rt__accounts_end(a, rc);
    return rc < 0 ? rc : (int)taken;
}

int rt_offline_count(rt_accounts_t *a, const char *host, const char *user, uint32_t *count,
                     uint64_t *bytes)
{
    rt__names_t n;
    int rc = names(host, user, &n);
    if (rc)
        return rc;
    int64_t items, c, b;
    if ((rc = account(a, &n, &items, &c, &b)) != 0)
        return rc;
    *count = (uint32_t)c;
    *bytes = (uint64_t)b;
    return 0;
}

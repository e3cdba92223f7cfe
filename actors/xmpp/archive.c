/*
** The message archive (XEP-0313) in xmpp.db (xeps.h): each account's copy of a chat message
** is one row; its rowid is the archive id (XEP-0359 stanza-id, XEP-0059 paging), so ids only
** grow and paging is a range of the index by account (and the other party). Retention: an
** account's count is kept in archive_counts, and a put past the bound drops the oldest.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "accounts_impl.h"
#include "xeps.h"

static sqlite3_stmt *keyed(rt_accounts_t *a, int which, const rt__names_t *n)
{
    return rt__accounts_keyed(a->xst[which], n);
}

/* One entry in the open transaction: its id (0: no such account) or a negative RT_E*. */
static int64_t put_one(rt_accounts_t *a, const rt_archive_entry_t *e, int64_t stamp_ms,
                       uint32_t max_count)
{
    rt__names_t n;
    if (rt__xeps_names(e->host, e->user, &n) || !e->with || !*e->with || !e->len ||
        e->len > INT32_MAX)
        return RT_EINVAL;
    int rc = e->room ? 1 : rt__xeps_account(a, &n);
    if (rc <= 0)
        return rc;
    sqlite3_stmt *st = keyed(a, XST_ARCH_PUT, &n);
    sqlite3_bind_text(st, 3, e->with, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, e->stamp_ms ? e->stamp_ms : stamp_ms);
    sqlite3_bind_blob(st, 5, e->stanza, (int)e->len, SQLITE_STATIC);
    if (e->id > 0)
        sqlite3_bind_int64(st, 6, e->id);
    int s = sqlite3_step(st);
    sqlite3_reset(st);
    if (s == SQLITE_CONSTRAINT && e->id > 0) { /* the id is taken: the next one, kept anyway */
        sqlite3_bind_null(st, 6);
        s = sqlite3_step(st);
        sqlite3_reset(st);
    }
    if (s != SQLITE_DONE)
        return RT_EAGAIN;
    int64_t id = sqlite3_last_insert_rowid(a->db);
    st = keyed(a, XST_ARCH_COUNT_ADD, &n);
    int64_t count = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    if (count < 0)
        return RT_EAGAIN;
    if (count > (int64_t)max_count) { /* the oldest go, and the count with them */
        st = keyed(a, XST_ARCH_TRIM, &n);
        sqlite3_bind_int64(st, 3, count - (int64_t)max_count);
        if (rt__xeps_run(st))
            return RT_EAGAIN;
        int64_t gone = sqlite3_changes(a->db);
        st = keyed(a, XST_ARCH_COUNT_SUB, &n);
        sqlite3_bind_int64(st, 3, gone);
        if (rt__xeps_run(st))
            return RT_EAGAIN;
    }
    return id;
}

int rt_archive_put(rt_accounts_t *a, const rt_archive_entry_t *e, size_t n, int64_t stamp_ms,
                   uint32_t max_count, int64_t *ids)
{
    if (max_count < 1)
        return RT_EINVAL;
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t id = put_one(a, &e[i], stamp_ms, max_count);
        if (id < 0)
            rc = (int)id;
        else if (ids)
            ids[i] = id;
    }
    return rt__accounts_end(a, rc);
}

int rt_archive_query(rt_accounts_t *a, const char *host, const char *user,
                     const rt_archive_query_t *q,
                     int (*fn)(int64_t id, int64_t stamp_ms, const void *stanza, size_t len,
                               void *arg),
                     void *arg, bool *complete)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    if (q->max < 1 || q->max > 100000)
        return RT_EINVAL;
    /* Backwards for a page that ends somewhere (before, or the last page), else forwards;
       one row more than the page says whether it is complete. */
    bool back = q->before || q->last;
    int which = q->with ? (back ? XST_ARCH_WITH_BACK : XST_ARCH_WITH_FWD)
                        : (back ? XST_ARCH_BACK : XST_ARCH_FWD);
    sqlite3_stmt *st = keyed(a, which, &n);
    sqlite3_bind_int64(st, 3, q->start_ms);
    sqlite3_bind_int64(st, 4, q->end_ms ? q->end_ms : INT64_MAX);
    sqlite3_bind_int64(st, 5, q->after);
    sqlite3_bind_int64(st, 6, q->before ? q->before : INT64_MAX);
    sqlite3_bind_int64(st, 7, (int64_t)q->max + 1);
    if (q->with)
        sqlite3_bind_text(st, 8, q->with, -1, SQLITE_STATIC);
    /* A backward page is found newest first and handed oldest first: its oldest id is
       found, then the page read forwards from there, both in one snapshot. */
    if (rt__accounts_begin(a, false) != 0) {
        sqlite3_reset(st);
        return RT_EAGAIN;
    }
    uint32_t got = 0;
    int s;
    *complete = true;
    if (!back) {
        while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
            if (got++ == q->max) {
                *complete = false;
                break;
            }
            rc = fn(sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                    sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), arg);
        }
        if (rc == 0 && *complete && s != SQLITE_DONE)
            rc = RT_EAGAIN;
        sqlite3_reset(st);
        return rt__accounts_end(a, rc);
    }
    /* Backwards: find where the page starts (its oldest id), then read it forwards. */
    int64_t oldest = 0;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        if (got++ == q->max) {
            *complete = false;
            break;
        }
        oldest = sqlite3_column_int64(st, 0);
    }
    bool failed = *complete && s != SQLITE_DONE;
    sqlite3_reset(st);
    if (failed)
        return rt__accounts_end(a, RT_EAGAIN);
    if (!oldest)
        return rt__accounts_end(a, 0);
    st = keyed(a, q->with ? XST_ARCH_WITH_FWD : XST_ARCH_FWD, &n);
    sqlite3_bind_int64(st, 3, q->start_ms);
    sqlite3_bind_int64(st, 4, q->end_ms ? q->end_ms : INT64_MAX);
    sqlite3_bind_int64(st, 5, oldest - 1);
    sqlite3_bind_int64(st, 6, q->before ? q->before : INT64_MAX);
    sqlite3_bind_int64(st, 7, (int64_t)q->max);
    if (q->with)
        sqlite3_bind_text(st, 8, q->with, -1, SQLITE_STATIC);
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW)
        rc = fn(sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), arg);
    if (rc == 0 && s != SQLITE_DONE)
        rc = RT_EAGAIN;
    sqlite3_reset(st);
    return rt__accounts_end(a, rc);
}

int rt_archive_count(rt_accounts_t *a, const char *host, const char *user,
                     const rt_archive_query_t *q, uint64_t *count)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    sqlite3_stmt *st = keyed(a, q->with ? XST_ARCH_WITH_COUNT : XST_ARCH_COUNT, &n);
    sqlite3_bind_int64(st, 3, q->start_ms);
    sqlite3_bind_int64(st, 4, q->end_ms ? q->end_ms : INT64_MAX);
    if (q->with)
        sqlite3_bind_text(st, 8, q->with, -1, SQLITE_STATIC);
    rc = sqlite3_step(st) == SQLITE_ROW ? 0 : RT_EAGAIN;
    *count = rc ? 0 : (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

int rt_archive_last_id(rt_accounts_t *a, int64_t *id)
{
    sqlite3_stmt *st = a->xst[XST_ARCH_LAST];
    sqlite3_reset(st);
    int rc = sqlite3_step(st) == SQLITE_ROW ? 0 : RT_EAGAIN;
    *id = rc ? 0 : sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

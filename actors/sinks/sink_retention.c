/*
** The SQLite sink's retention: which rows its database no longer keeps, and their
** deletion in small steps of their own, between the sink's insert batches.
**
** Rows are ordered by rowid, which for the tables the sink makes is the order they were
** written in. Age needs a time per row without a column in the operator's table: the sink
** keeps marks in a table of its own, rt_retention(tbl, upto, at_ms), "every row of tbl up
** to rowid upto was written by at_ms", written in each batch's own transaction: the newest
** mark of a table moves up to the batch's last row, or once it is max_age/1000 old (at
** least 1 s, at most 1 h) a new one starts. Rows older than max_age are then those up to
** the newest mark older than max_age: a row goes between max_age and max_age plus one mark
** interval after it was written. Every row has a mark at or above its rowid, so a table
** with rows has marks: the marks also say which tables the sink writes, and those alone
** are ever deleted from. A deletion takes the marks its rows had; a table it empties has
** none left, so the rowids SQLite hands out again from 1 meet no old mark.
**
** A step looks at one table at a time (in turn), works out the last rowid that has to go
** (max_rows: all but the newest max_rows; max_age: as above; max_bytes: while the pages
** in use pass it, the oldest chunk), and deletes at most `chunk` rows from the oldest in
** one transaction, with the marks they cover. That transaction commits without an fsync
** (synchronous=NORMAL for it alone): a deletion lost in a power cut is simply made again,
** and the next insert batch's fsync makes it durable anyway, since the WAL is one file
** written in order.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "sink_impl.h"

#define RETENTION_TABLE "rt_retention"
#define MARK_MIN_MS 1000ull    /* marks are at least this far apart... */
#define MARK_MAX_MS 3600000ull /* ...and at most this, whatever max_age is */
#define MARK_PARTS 1000        /* max_age / this: how late past max_age a row may go */

/* Statements on the registry of marks: prepared once per connection. */
enum {
    RS_NEXT_TABLE, /* the first table after ?1 (in name order) that has marks */
    RS_AGED,       /* the last rowid of ?1 written by ?2 (ms) */
    RS_NEWEST,     /* the newest mark's rowid of ?1 */
    RS_UNMARK,     /* marks of ?1 up to rowid ?2 (their rows are gone) */
    RS_STALE,      /* marks of ?1 past rowid ?2 (rows deleted by someone else) */
    RS_MARK,       /* a new mark */
    RS_MOVE,       /* the mark ?4 of ?1 moved up to ?2, at ?3 */
    RS_PAGES,      /* pages in use */
    RS_COUNT
};

static const char *const registry_sql[RS_COUNT] = {
    [RS_NEXT_TABLE] = "SELECT tbl FROM " RETENTION_TABLE " WHERE tbl > ?1 ORDER BY tbl LIMIT 1",
    [RS_AGED] = "SELECT max(upto) FROM " RETENTION_TABLE " WHERE tbl = ?1 AND at_ms <= ?2",
    [RS_NEWEST] = "SELECT max(upto) FROM " RETENTION_TABLE " WHERE tbl = ?1",
    [RS_UNMARK] = "DELETE FROM " RETENTION_TABLE " WHERE tbl = ?1 AND upto <= ?2",
    [RS_STALE] = "DELETE FROM " RETENTION_TABLE " WHERE tbl = ?1 AND upto > ?2",
    [RS_MARK] = "INSERT OR REPLACE INTO " RETENTION_TABLE "(tbl, upto, at_ms) VALUES (?1, ?2, ?3)",
    /* Parenthesized: clang takes adjacent literals in an array initializer for a lost comma. */
    [RS_MOVE] = ("UPDATE OR REPLACE " RETENTION_TABLE " SET upto = ?2, at_ms = ?3 "
                 "WHERE tbl = ?1 AND upto = ?4"),
    [RS_PAGES] = ("SELECT (SELECT page_count FROM pragma_page_count) - "
                  "(SELECT freelist_count FROM pragma_freelist_count)"),
};

_Static_assert(RS_COUNT <= sizeof(((sq_retention_t *)0)->st) / sizeof(sqlite3_stmt *),
               "sq_retention_t.st holds every registry statement");

bool rt__retention_on(const sq_retention_t *r)
{
    return r->max_rows || r->max_age_ms || r->max_bytes;
}

void rt__retention_configure(sq_retention_t *r, const rt_conf_section_t *sec)
{
    memset(r, 0, sizeof(*r));
    const rt_conf_kv_t *kv;
    if ((kv = rt__sink_kv(sec, "retention.max_rows")))
        r->max_rows = (uint64_t)kv->num;
    if ((kv = rt__sink_kv(sec, "retention.max_age")))
        r->max_age_ms = (uint64_t)kv->num * 1000;
    if ((kv = rt__sink_kv(sec, "retention.max_bytes")))
        r->max_bytes = (uint64_t)kv->num;
    /* Without max_age a table's one mark (moved up by every batch) only lists the table. */
    uint64_t every = r->max_age_ms / MARK_PARTS;
    r->mark_every_ms = !r->max_age_ms        ? UINT64_MAX
                       : every < MARK_MIN_MS ? MARK_MIN_MS
                       : every > MARK_MAX_MS ? MARK_MAX_MS
                                             : every;
}

/* A duration in the largest unit that keeps it whole ("7d", "90m", "45s"). */
static void duration_text(uint64_t ms, char *out, size_t n)
{
    uint64_t s = ms / 1000;
    if (s % 86400 == 0)
        snprintf(out, n, "%llud", (unsigned long long)(s / 86400));
    else if (s % 3600 == 0)
        snprintf(out, n, "%lluh", (unsigned long long)(s / 3600));
    else if (s % 60 == 0)
        snprintf(out, n, "%llum", (unsigned long long)(s / 60));
    else
        snprintf(out, n, "%llus", (unsigned long long)s);
}

/* Bytes in the largest binary unit that keeps them whole ("1GiB", "1536KiB"). */
static void bytes_text(uint64_t b, char *out, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    while (u < 4 && b >= 1024 && b % 1024 == 0)
        b /= 1024, u++;
    snprintf(out, n, "%llu%s", (unsigned long long)b, units[u]);
}

void rt__retention_text(const sq_retention_t *r, char *out, size_t n)
{
    if (!rt__retention_on(r)) {
        snprintf(out, n, "no retention: every row is kept (the database grows without bound)");
        return;
    }
    char age[32] = "", bytes[32] = "";
    duration_text(r->max_age_ms, age, sizeof(age));
    bytes_text(r->max_bytes, bytes, sizeof(bytes));
    int k = snprintf(out, n, "rows deleted");
    const char *sep = "";
    if (r->max_age_ms && k > 0 && (size_t)k < n)
        k += snprintf(out + k, n - (size_t)k, " %s%s after they were written", sep, age),
            sep = "or ";
    if (r->max_rows && k > 0 && (size_t)k < n)
        k += snprintf(out + k, n - (size_t)k, " %sbeyond the newest %llu of a table", sep,
                      (unsigned long long)r->max_rows),
            sep = "or ";
    if (r->max_bytes && k > 0 && (size_t)k < n)
        snprintf(out + k, n - (size_t)k, " %swhile the database's pages in use pass %s", sep,
                 bytes);
}

void rt__retention_keeps(const sq_retention_t *r, rt_sink_keeps_t *out)
{
    out->max_rows = r->max_rows;
    out->max_age_s = r->max_age_ms / 1000;
    out->max_bytes = r->max_bytes;
}

static void forget_table(sq_retention_t *r)
{
    sqlite3_finalize(r->bounds);
    sqlite3_finalize(r->del);
    r->bounds = r->del = NULL;
    r->cur[0] = 0;
}

void rt__retention_close(sq_retention_t *r)
{
    forget_table(r);
    for (int i = 0; i < RS_COUNT; i++) {
        sqlite3_finalize(r->st[i]);
        r->st[i] = NULL;
    }
    r->after[0] = 0;
}

int rt__retention_open(sq_retention_t *r, sqlite3 *db, char *why, size_t n)
{
    if (!rt__retention_on(r))
        return 0;
    static const char create[] =
        "CREATE TABLE IF NOT EXISTS " RETENTION_TABLE "(tbl TEXT NOT NULL, upto INTEGER NOT NULL, "
        "at_ms INTEGER NOT NULL, PRIMARY KEY (tbl, upto)) WITHOUT ROWID";
    if (sqlite3_exec(db, create, NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(why, n, "%s", sqlite3_errmsg(db));
        return RT_EAGAIN;
    }
    for (int i = 0; i < RS_COUNT; i++)
        if (sqlite3_prepare_v3(db, registry_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &r->st[i],
                               NULL) != SQLITE_OK) {
            snprintf(why, n, "%s", sqlite3_errmsg(db));
            rt__retention_close(r);
            return RT_EAGAIN;
        }
    int64_t size = 0;
    sqlite3_stmt *ps = NULL;
    if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &ps, NULL) == SQLITE_OK &&
        sqlite3_step(ps) == SQLITE_ROW)
        size = sqlite3_column_int64(ps, 0);
    sqlite3_finalize(ps);
    r->page_size = size > 0 ? (uint64_t)size : 4096;
    return 0;
}

bool rt__retention_reserved(const char *table, size_t len)
{
    return len == sizeof(RETENTION_TABLE) - 1 && memcmp(table, RETENTION_TABLE, len) == 0;
}

int rt__retention_mark(sq_retention_t *r, sqlite3 *db, const char *table, int64_t upto,
                       uint64_t now_ms, sq_mark_t *mark)
{
    bool move = mark->since_ms && now_ms - mark->since_ms < r->mark_every_ms;
    sqlite3_stmt *st = r->st[move ? RS_MOVE : RS_MARK];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, upto);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)now_ms);
    if (move)
        sqlite3_bind_int64(st, 4, mark->upto);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE)
        return RT_EAGAIN;
    if (move && sqlite3_changes(db) == 0) {
        /* A deletion took it (its rows are gone): a new one. */
        mark->since_ms = 0;
        return rt__retention_mark(r, db, table, upto, now_ms, mark);
    }
    mark->upto = upto;
    if (!move)
        mark->since_ms = now_ms;
    return 0;
}

/* Runs st (bound by the caller) for one integer: *out, or leaves it when NULL. */
static int step_int(sqlite3_stmt *st, int col, int64_t *out, bool *null)
{
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *null = sqlite3_column_type(st, col) == SQLITE_NULL;
        if (!*null)
            *out = sqlite3_column_int64(st, col);
        rc = SQLITE_OK;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_OK || rc == SQLITE_DONE ? 0 : rc;
}

/* Prepares the statement sql (made with sqlite3_mprintf, freed here) into *st. */
static int prepare_owned(sqlite3 *db, char *sql, sqlite3_stmt **st)
{
    int rc =
        sql ? sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    return rc;
}

/* The statements for table, kept while the steps stay on it (one table: always). */
static int use_table(sq_retention_t *r, sqlite3 *db, const char *table)
{
    if (r->bounds && strcmp(r->cur, table) == 0)
        return SQLITE_OK;
    forget_table(r);
    /* Two subqueries: SQLite answers min() and max() from the b-tree's ends only when each
       is alone in its query. */
    int rc = prepare_owned(
        db,
        sqlite3_mprintf("SELECT (SELECT min(rowid) FROM \"%w\"), (SELECT max(rowid) FROM \"%w\")",
                        table, table),
        &r->bounds);
    if (rc == SQLITE_OK)
        rc = prepare_owned(
            db, sqlite3_mprintf("DELETE FROM \"%w\" WHERE rowid BETWEEN ?1 AND ?2", table),
            &r->del);
    if (rc != SQLITE_OK) {
        forget_table(r);
        return rc;
    }
    snprintf(r->cur, sizeof(r->cur), "%s", table);
    return SQLITE_OK;
}

/* Bytes of the database's pages in use (not on the free list). */
static int pages_in_use(sq_retention_t *r, uint64_t *bytes)
{
    int64_t pages = 0;
    bool null = true;
    int rc = step_int(r->st[RS_PAGES], 0, &pages, &null);
    *bytes = null || pages < 0 ? 0 : (uint64_t)pages * r->page_size;
    return rc;
}

/*
** The last rowid of table that has to go now (*upto < lo: none), from its bounds [lo, hi]
** and the settings. Marks past hi are dropped first: someone else deleted rows, and
** their rowids may be handed out again.
*/
static int target(sq_retention_t *r, const char *table, int64_t lo, int64_t hi, uint64_t now_ms,
                  int64_t *upto)
{
    *upto = lo - 1;
    int64_t v = 0;
    bool null = true;
    sqlite3_stmt *st = r->st[RS_NEWEST];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc = step_int(st, 0, &v, &null);
    if (rc == 0 && !null && v > hi) {
        st = r->st[RS_STALE];
        sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, hi);
        rc = step_int(st, 0, &v, &null);
    }
    if (rc)
        return rc;
    if (r->max_rows && hi - lo + 1 > (int64_t)r->max_rows)
        *upto = hi - (int64_t)r->max_rows;
    if (r->max_age_ms && now_ms > r->max_age_ms) {
        st = r->st[RS_AGED];
        sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)(now_ms - r->max_age_ms));
        null = true;
        if ((rc = step_int(st, 0, &v, &null)))
            return rc;
        if (!null && v > *upto)
            *upto = v;
    }
    if (r->max_bytes && *upto < lo) {
        uint64_t used = 0;
        if ((rc = pages_in_use(r, &used)))
            return rc;
        /* As many of the oldest rows as the excess holds at this table's bytes per row
           (taken as the whole database's), and again while it is over. */
        if (used > r->max_bytes) {
            uint64_t rows = (uint64_t)(hi - lo + 1);
            uint64_t per_row = used / rows ? used / rows : 1;
            uint64_t excess = (used - r->max_bytes + per_row - 1) / per_row;
            *upto = lo - 1 + (int64_t)(excess < rows ? excess : rows);
        }
    }
    return 0;
}

/* The first table with marks after `after` in name order into out; *found false if none. */
static int next_table(sq_retention_t *r, const char *after, char *out, size_t n, bool *found)
{
    sqlite3_stmt *st = r->st[RS_NEXT_TABLE];
    sqlite3_bind_text(st, 1, after, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    *found = rc == SQLITE_ROW;
    if (*found)
        snprintf(out, n, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : rc;
}

/* Deletes rows [lo, end] of r->cur and the marks they cover, in one transaction. */
static int delete_chunk(sq_retention_t *r, sqlite3 *db, bool sync_full, int64_t lo, int64_t end,
                        uint64_t *rows)
{
    if (sync_full)
        sqlite3_exec(db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(r->del, 1, lo);
        sqlite3_bind_int64(r->del, 2, end);
        rc = sqlite3_step(r->del);
        sqlite3_reset(r->del);
        *rows = rc == SQLITE_DONE ? (uint64_t)sqlite3_changes(db) : 0;
        if (rc == SQLITE_DONE) {
            int64_t unused = 0;
            bool null;
            sqlite3_stmt *st = r->st[RS_UNMARK];
            sqlite3_bind_text(st, 1, r->cur, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, end);
            rc = step_int(st, 0, &unused, &null);
        }
        if (rc == SQLITE_OK || rc == SQLITE_DONE)
            rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    }
    if (sync_full)
        sqlite3_exec(db, "PRAGMA synchronous=FULL", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        *rows = 0;
    return rc;
}

int rt__retention_step(rt_sink_t *s, sq_retention_t *r, sqlite3 *db, bool sync_full, uint64_t chunk,
                       uint64_t now_ms, uint64_t *rows, bool *more)
{
    *rows = 0;
    *more = false;
    if (!rt__retention_on(r) || !r->st[0])
        return 0;
    /*
    ** Each table at most once, until one has rows to delete: those after the one the last
    ** step looked at, in name order, then from the first up to that one again. Names only
    ** grow within each half, so a registry that changes meanwhile cannot make it loop.
    */
    char start[sizeof(r->after)], table[sizeof(r->after)];
    snprintf(start, sizeof(start), "%s", r->after);
    bool wrapped = !start[0]; /* from the first table: one half is all of them */
    int rc = 0;
    for (;;) {
        bool found = false;
        if ((rc = next_table(r, r->after, table, sizeof(table), &found)))
            break;
        if (!found && !wrapped) {
            wrapped = true;
            r->after[0] = 0;
            continue;
        }
        if (!found || (wrapped && start[0] && strcmp(table, start) > 0))
            break;
        snprintf(r->after, sizeof(r->after), "%s", table);
        if ((rc = use_table(r, db, table))) {
            /* Gone, or not a rowid table: nothing of it can be ordered; its marks go. */
            if ((rc & 0xff) != SQLITE_ERROR)
                break;
            sqlite3_stmt *st = r->st[RS_STALE];
            sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, INT64_MIN);
            int64_t unused;
            bool null;
            step_int(st, 0, &unused, &null);
            rt_log(RT_LOG_WARNING, "sink.retention_skipped", "sink=%s table=%s reason=%s", s->name,
                   table, sqlite3_errmsg(db));
            rc = 0;
            continue;
        }
        int64_t lo = 0, hi = 0, upto;
        bool null = true;
        if ((rc = sqlite3_step(r->bounds)) == SQLITE_ROW) {
            null = sqlite3_column_type(r->bounds, 0) == SQLITE_NULL;
            lo = sqlite3_column_int64(r->bounds, 0);
            hi = sqlite3_column_int64(r->bounds, 1);
            rc = 0;
        }
        sqlite3_reset(r->bounds);
        if (rc)
            break;
        if (null)
            continue; /* empty */
        if ((rc = target(r, table, lo, hi, now_ms, &upto)))
            break;
        if (upto < lo)
            continue;
        int64_t end = upto - lo + 1 > (int64_t)chunk ? lo + (int64_t)chunk - 1 : upto;
        rc = delete_chunk(r, db, sync_full, lo, end, rows);
        /* Another step checks again: this table may have more, another table some. */
        *more = rc == 0 && *rows > 0;
        break;
    }
    if (rc) {
        rt__sink_error(s, "retention: %s", sqlite3_errmsg(db));
        return RT_EAGAIN;
    }
    return 0;
}

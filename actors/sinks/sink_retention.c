/*
** The SQLite sink's retention: tables kept as partitions, the oldest dropped whole.
**
** Deleting rows one by one costs about what writing them did: each leaf page is rewritten
** (and Debian builds SQLite with secure_delete on, which zeroes every byte deleted). At a
** table's bound every row written meant one deleted, 9-16% more CPU per message in
** compare.sh's fan-in cells. So with retention on, a table T the sink writes is kept as
** partitions, plain tables T_p1, T_p2, ... with T's columns, under a view T (SELECT * FROM
** T_p1 UNION ALL SELECT * FROM T_p2 ...), and what goes is a whole partition: DROP TABLE
** hands its pages to the free list without looking at its rows, and new rows reuse them.
**
** The registry rt_partitions(tbl, part, first_ms, last_ms, rows) lists T's partitions; the
** newest is the one written. first_ms is when its first batch was written, last_ms its
** latest (set in each batch's own transaction), rows its count, set when it is closed.
** The sink closes it and begins the next, in a batch's transaction before a row, once it
** holds its share of a limit: max_rows/16 rows, max_age/16 of time (1 s at least), or
** max_bytes/16 of the pages in use (at T's share of the rows). A step between batches then
** drops T's oldest partition while T holds more than max_rows rows, that partition's newest
** row is older than max_age, or the database's pages in use pass max_bytes. So a table keeps
** between 15/16 of max_rows and max_rows, and a row goes between max_age and max_age plus
** its partition's span after it was written. A newest partition that is the only one and
** must go (no writes came to close it) is emptied when only age says so, or closed (the
** next step drops it) when rows or bytes do.
**
** A plain table T found when retention is on (written before retention was set) becomes
** T_p1 with its indexes and constraints; the partitions after it take its columns (name,
** type, NOT NULL, default), not its indexes. The sink's connection runs with secure_delete
** off unless zero_deleted is set: zeroing a dropped partition's pages costs as much as
** writing them, and they are overwritten by the rows that reuse them.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "sink_impl.h"

#define REGISTRY "rt_partitions"
#define OLD_MARKS "rt_retention" /* the registry of row marks before partitions */
#define PARTS_PER_LIMIT 16       /* a partition holds this share of a limit */
#define PARTS_MAX 64             /* past this many a table's newest grows instead */
#define ROLL_MIN_MS 1000ull      /* a partition spans at least this long (max_age's share) */

enum {
    RS_NEXT_TABLE, /* the first table after ?1 (in name order) that has partitions */
    RS_PARTS,      /* ?1's partitions, oldest first */
    RS_ADD,        /* a new newest partition ?2 of ?1, begun at ?3 */
    RS_CLOSE,      /* partition ?2 of ?1 holds ?3 rows and is written no more */
    RS_TOUCH,      /* partition ?2 of ?1 was written at ?3 */
    RS_FORGET,     /* partition ?2 of ?1 is gone */
    RS_PAGES,      /* pages in use */
    RS_COUNT
};

static const char *const registry_sql[RS_COUNT] = {
    [RS_NEXT_TABLE] = "SELECT tbl FROM " REGISTRY " WHERE tbl > ?1 ORDER BY tbl LIMIT 1",
    [RS_PARTS] =
        ("SELECT part, first_ms, last_ms, rows FROM " REGISTRY " WHERE tbl = ?1 ORDER BY part"),
    [RS_ADD] = ("INSERT INTO " REGISTRY "(tbl, part, first_ms, last_ms) "
                "VALUES (?1, ?2, ?3, ?3)"),
    [RS_CLOSE] = "UPDATE " REGISTRY " SET rows = ?3 WHERE tbl = ?1 AND part = ?2",
    [RS_TOUCH] = "UPDATE " REGISTRY " SET last_ms = ?3 WHERE tbl = ?1 AND part = ?2",
    [RS_FORGET] = "DELETE FROM " REGISTRY " WHERE tbl = ?1 AND part = ?2",
    /* Parenthesized: clang takes adjacent literals in an array initializer for a lost comma. */
    [RS_PAGES] = ("SELECT (SELECT page_count FROM pragma_page_count) - "
                  "(SELECT freelist_count FROM pragma_freelist_count)"),
};

_Static_assert(RS_COUNT <= sizeof(((sq_retention_t *)0)->st) / sizeof(sqlite3_stmt *),
               "sq_retention_t.st holds every registry statement");

/* One partition as the registry has it. */
typedef struct part_row_s {
    int64_t part;
    uint64_t first_ms, last_ms;
    int64_t rows; /* -1: the newest, not counted yet */
} part_row_t;

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
    if ((kv = rt__sink_kv(sec, "retention.zero_deleted")))
        r->zero_deleted = kv->num != 0;
    uint64_t share = r->max_age_ms / PARTS_PER_LIMIT;
    r->roll_ms = !r->max_age_ms ? UINT64_MAX : share < ROLL_MIN_MS ? ROLL_MIN_MS : share;
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

void rt__retention_close(sq_retention_t *r)
{
    for (int i = 0; i < RS_COUNT; i++) {
        sqlite3_finalize(r->st[i]);
        r->st[i] = NULL;
    }
    r->registry = false;
    r->after[0] = 0;
}

/* Whether db has a table (or view, index) named name; its type into type (or ""). */
static int schema_type(sqlite3 *db, const char *name, char *type, size_t n)
{
    sqlite3_stmt *st = NULL;
    type[0] = 0;
    int rc =
        sqlite3_prepare_v2(db, "SELECT type FROM sqlite_schema WHERE name = ?1", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        snprintf(type, n, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int rt__retention_open(sq_retention_t *r, sqlite3 *db, char *why, size_t n)
{
    /* Partitions made while retention was on are written (and never dropped) after it is
       turned off, so the registry is read whenever it is there. */
    char type[16];
    int rc = schema_type(db, REGISTRY, type, sizeof(type));
    if (rc == SQLITE_OK && !r->zero_deleted)
        rc = sqlite3_exec(db, "PRAGMA secure_delete=OFF", NULL, NULL, NULL);
    if (rc == SQLITE_OK && rt__retention_on(r) && !type[0]) {
        static const char create[] =
            "CREATE TABLE " REGISTRY "(tbl TEXT NOT NULL, part INTEGER NOT NULL, "
            "first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL, rows INTEGER, "
            "PRIMARY KEY (tbl, part)) WITHOUT ROWID; DROP TABLE IF EXISTS " OLD_MARKS;
        rc = sqlite3_exec(db, create, NULL, NULL, NULL);
        snprintf(type, sizeof(type), "table");
    }
    if (rc != SQLITE_OK) {
        snprintf(why, n, "%s", sqlite3_errmsg(db));
        return RT_EAGAIN;
    }
    if (!type[0])
        return 0;
    for (int i = 0; i < RS_COUNT; i++)
        if (sqlite3_prepare_v3(db, registry_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &r->st[i],
                               NULL) != SQLITE_OK) {
            snprintf(why, n, "%s", sqlite3_errmsg(db));
            rt__retention_close(r);
            return RT_EAGAIN;
        }
    r->registry = true;
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
    return (len == sizeof(REGISTRY) - 1 && memcmp(table, REGISTRY, len) == 0) ||
           (len == sizeof(OLD_MARKS) - 1 && memcmp(table, OLD_MARKS, len) == 0);
}

static void part_name(const char *table, int64_t part, char *out, size_t n)
{
    snprintf(out, n, "%s_p%lld", table, (long long)part);
}

/* Runs sql (made with sqlite3_mprintf, freed here). */
static int exec_owned(sqlite3 *db, char *sql)
{
    int rc = sql ? sqlite3_exec(db, sql, NULL, NULL, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    return rc;
}

/* Runs st (bound by the caller) to its end, then resets it; SQLITE_OK or the error. */
static int run(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Runs a statement on the registry about partition part of table, with one more number. */
static int registry_set(sq_retention_t *r, int which, const char *table, int64_t part,
                        int64_t value, bool has_value)
{
    sqlite3_stmt *st = r->st[which];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, part);
    if (has_value)
        sqlite3_bind_int64(st, 3, value);
    return run(st);
}

/*
** table's partitions, oldest first, into rows (at most max; *n how many the registry has,
** which may be more). Partitions past max are not read: only the oldest and the newest
** matter to a step, and the newest is found again by the caller from *n when it is past.
*/
static int load_parts(sq_retention_t *r, const char *table, part_row_t *rows, size_t max, size_t *n,
                      part_row_t *newest)
{
    *n = 0;
    sqlite3_stmt *st = r->st[RS_PARTS];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        part_row_t p = {
            .part = sqlite3_column_int64(st, 0),
            .first_ms = (uint64_t)sqlite3_column_int64(st, 1),
            .last_ms = (uint64_t)sqlite3_column_int64(st, 2),
            .rows = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 3),
        };
        if (*n < max)
            rows[*n] = p;
        *newest = p;
        ++*n;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* The rows in table's closed partitions, as counted when each was closed. */
static int closed_rows(sq_retention_t *r, const char *table, int64_t *sum)
{
    *sum = 0;
    sqlite3_stmt *st = r->st[RS_PARTS];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (sqlite3_column_type(st, 3) != SQLITE_NULL)
            *sum += sqlite3_column_int64(st, 3);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* The rows of a table the sink writes in order: its rowid span (count(*) without rowids). */
static int count_rows(sqlite3 *db, const char *name, int64_t *rows)
{
    sqlite3_stmt *st = NULL;
    /* Two subqueries: SQLite answers min() and max() from the b-tree's ends only when each
       is alone in its query. */
    char *sql = sqlite3_mprintf("SELECT (SELECT max(rowid) FROM \"%w\") - "
                                "(SELECT min(rowid) FROM \"%w\") + 1",
                                name, name);
    int rc = sql ? sqlite3_prepare_v2(db, sql, -1, &st, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    if (rc == SQLITE_ERROR) {
        sql = sqlite3_mprintf("SELECT count(*) FROM \"%w\"", name);
        rc = sql ? sqlite3_prepare_v2(db, sql, -1, &st, NULL) : SQLITE_NOMEM;
        sqlite3_free(sql);
    }
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(st);
    *rows = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0; /* NULL (empty): 0 */
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* View table over its partitions, made again after they changed. */
static int make_view(sq_retention_t *r, sqlite3 *db, const char *table)
{
    sqlite3_str *sql = sqlite3_str_new(db);
    sqlite3_str_appendf(sql, "DROP VIEW IF EXISTS \"%w\"; CREATE VIEW \"%w\" AS ", table, table);
    sqlite3_stmt *st = r->st[RS_PARTS];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc, n = 0;
    char name[RT_SQ_PART_LEN];
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        part_name(table, sqlite3_column_int64(st, 0), name, sizeof(name));
        sqlite3_str_appendf(sql, "%sSELECT * FROM \"%w\"", n++ ? " UNION ALL " : "", name);
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    char *text = sqlite3_str_finish(sql);
    if (rc == SQLITE_DONE)
        rc = !text ? SQLITE_NOMEM : n ? sqlite3_exec(db, text, NULL, NULL, NULL) : SQLITE_OK;
    sqlite3_free(text);
    return rc;
}

/* A new newest partition of table after p->part, with its columns; p is then the new one. */
static int roll(sq_retention_t *r, sqlite3 *db, const char *table, sq_part_t *p, uint64_t now)
{
    int rc = registry_set(r, RS_CLOSE, table, p->part, p->rows, true);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(
        db, "SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info(?1)", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(st, 1, p->name, -1, SQLITE_STATIC);
    char next[RT_SQ_PART_LEN];
    part_name(table, p->part + 1, next, sizeof(next));
    sqlite3_str *sql = sqlite3_str_new(db);
    sqlite3_str_appendf(sql, "CREATE TABLE \"%w\" (", next);
    int n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *dflt = (const char *)sqlite3_column_text(st, 3);
        /* The type and the default are SQL as the table's schema has them. */
        sqlite3_str_appendf(
            sql, "%s\"%w\" %s%s%s%s", n++ ? ", " : "", (const char *)sqlite3_column_text(st, 0),
            (const char *)sqlite3_column_text(st, 1), sqlite3_column_int(st, 2) ? " NOT NULL" : "",
            dflt ? " DEFAULT " : "", dflt ? dflt : "");
    }
    sqlite3_finalize(st);
    sqlite3_str_appendf(sql, ")");
    char *text = sqlite3_str_finish(sql);
    if (rc == SQLITE_DONE)
        rc = !text ? SQLITE_NOMEM : n ? sqlite3_exec(db, text, NULL, NULL, NULL) : SQLITE_ERROR;
    sqlite3_free(text);
    if (rc == SQLITE_OK)
        rc = registry_set(r, RS_ADD, table, p->part + 1, (int64_t)now, true);
    if (rc == SQLITE_OK)
        rc = make_view(r, db, table);
    if (rc != SQLITE_OK)
        return rc;
    p->part++;
    snprintf(p->name, sizeof(p->name), "%s", next);
    p->rows_closed += p->rows;
    p->rows = 0;
    p->first_ms = now;
    p->nparts++;
    return SQLITE_OK;
}

int rt__retention_resolve(sq_retention_t *r, sqlite3 *db, const char *table, uint64_t now,
                          sq_part_t *p, bool *create)
{
    memset(p, 0, sizeof(*p));
    *create = false;
    p->roll_at = INT64_MAX;
    if (r->registry) {
        part_row_t oldest, newest;
        size_t n = 0;
        int rc = load_parts(r, table, &oldest, 1, &n, &newest);
        if (rc != SQLITE_OK)
            return rc;
        if (n > 0) {
            if ((rc = closed_rows(r, table, &p->rows_closed)) != SQLITE_OK)
                return rc;
            p->part = newest.part;
            p->first_ms = newest.first_ms;
            p->nparts = (unsigned)n;
            part_name(table, p->part, p->name, sizeof(p->name));
            return count_rows(db, p->name, &p->rows);
        }
    }
    if (!rt__retention_on(r)) {
        snprintf(p->name, sizeof(p->name), "%s", table);
        return SQLITE_OK;
    }
    char type[16];
    int rc = schema_type(db, table, type, sizeof(type));
    if (rc != SQLITE_OK)
        return rc;
    p->part = 1;
    p->first_ms = now;
    p->nparts = 1;
    part_name(table, 1, p->name, sizeof(p->name));
    if (!type[0]) {
        *create = true; /* the caller makes p->name, then calls rt__retention_made */
        return SQLITE_OK;
    }
    if (strcmp(type, "table") != 0)
        return SQLITE_MISMATCH; /* a view or an index of someone else's */
    /* Written before retention was set: it becomes the first partition. */
    rc = exec_owned(db, sqlite3_mprintf("ALTER TABLE \"%w\" RENAME TO \"%w\"", table, p->name));
    if (rc == SQLITE_OK)
        rc = rt__retention_made(r, db, table, p, now);
    if (rc == SQLITE_OK)
        rc = count_rows(db, p->name, &p->rows);
    return rc;
}

int rt__retention_alter(sq_retention_t *r, sqlite3 *db, const char *table, const sq_part_t *p,
                        const char *change)
{
    if (p->part == 0)
        return exec_owned(db, sqlite3_mprintf("ALTER TABLE \"%w\" %s", table, change));
    sqlite3_stmt *st = r->st[RS_PARTS];
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc = SQLITE_DONE, done = SQLITE_OK;
    char name[RT_SQ_PART_LEN];
    while (done == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        part_name(table, sqlite3_column_int64(st, 0), name, sizeof(name));
        done = exec_owned(db, sqlite3_mprintf("ALTER TABLE \"%w\" %s", name, change));
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return done != SQLITE_OK ? done : rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int rt__retention_made(sq_retention_t *r, sqlite3 *db, const char *table, const sq_part_t *p,
                       uint64_t now)
{
    int rc = registry_set(r, RS_ADD, table, p->part, (int64_t)now, true);
    return rc == SQLITE_OK ? make_view(r, db, table) : rc;
}

/* Bytes of the database's pages in use (not on the free list). */
static int pages_in_use(sq_retention_t *r, uint64_t *bytes)
{
    sqlite3_stmt *st = r->st[RS_PAGES];
    int rc = sqlite3_step(st);
    int64_t pages = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    *bytes = pages > 0 ? (uint64_t)pages * r->page_size : 0;
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

int rt__retention_batch(sq_retention_t *r, sqlite3 *db, const char *table, uint64_t now,
                        sq_part_t *p, bool *rolled)
{
    *rolled = false;
    if (!rt__retention_on(r) || p->part == 0)
        return SQLITE_OK;
    int rc;
    if (p->rows > 0 && now - p->first_ms >= r->roll_ms && p->nparts < PARTS_MAX) {
        if ((rc = roll(r, db, table, p, now)) != SQLITE_OK)
            return rc;
        *rolled = true;
    }
    p->roll_at = INT64_MAX;
    if (r->max_rows)
        p->roll_at = (int64_t)((r->max_rows + PARTS_PER_LIMIT - 1) / PARTS_PER_LIMIT);
    if (r->max_bytes && p->rows + p->rows_closed > 0) {
        uint64_t used = 0;
        if ((rc = pages_in_use(r, &used)) != SQLITE_OK)
            return rc;
        /* At this table's bytes per row (taken as the whole database's). */
        uint64_t per_row = used / (uint64_t)(p->rows + p->rows_closed);
        int64_t rows = (int64_t)(r->max_bytes / PARTS_PER_LIMIT / (per_row ? per_row : 1));
        if (rows < p->roll_at)
            p->roll_at = rows > 0 ? rows : 1;
    }
    return registry_set(r, RS_TOUCH, table, p->part, (int64_t)now, true);
}

int rt__retention_row(sq_retention_t *r, sqlite3 *db, const char *table, uint64_t now, sq_part_t *p,
                      bool *rolled)
{
    *rolled = false;
    if (p->rows < p->roll_at || p->nparts >= PARTS_MAX)
        return SQLITE_OK;
    int rc = roll(r, db, table, p, now);
    *rolled = rc == SQLITE_OK;
    return rc;
}

/* The first table with partitions after `after` in name order; *found false if none. */
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
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/*
** What one step does to table, in a transaction of its own: drops its oldest partition,
** empties its only one, or closes its only one (the next step drops it). *rows: rows gone.
*/
static int step_table(sq_retention_t *r, sqlite3 *db, const char *table, uint64_t now,
                      uint64_t *rows, bool *changed)
{
    part_row_t oldest, newest;
    size_t n = 0;
    int rc = load_parts(r, table, &oldest, 1, &n, &newest);
    if (rc != SQLITE_OK || n == 0)
        return rc;
    sq_part_t cur = {.part = newest.part, .first_ms = newest.first_ms, .nparts = (unsigned)n};
    part_name(table, cur.part, cur.name, sizeof(cur.name));
    if ((rc = count_rows(db, cur.name, &cur.rows)) != SQLITE_OK)
        return rc;
    if ((rc = closed_rows(r, table, &cur.rows_closed)) != SQLITE_OK)
        return rc;
    int64_t total = cur.rows + cur.rows_closed; /* what max_rows weighs */
    uint64_t used = 0;
    if (r->max_bytes && (rc = pages_in_use(r, &used)) != SQLITE_OK)
        return rc;
    bool over =
        (r->max_rows && total > (int64_t)r->max_rows) || (r->max_bytes && used > r->max_bytes);
    char name[RT_SQ_PART_LEN];
    enum { NOTHING, DROP, EMPTY, CLOSE } what = NOTHING;
    if (n > 1 && (over || (r->max_age_ms && oldest.last_ms + r->max_age_ms <= now)))
        what = DROP;
    else if (n == 1 && cur.rows > 0 && r->max_age_ms && newest.last_ms + r->max_age_ms <= now)
        what = EMPTY;
    else if (n == 1 && cur.rows > 0 && over)
        what = CLOSE;
    if (what == NOTHING)
        return SQLITE_OK;
    if ((rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL)) != SQLITE_OK)
        return rc;
    int64_t gone = 0;
    if (what == DROP) {
        part_name(table, oldest.part, name, sizeof(name));
        gone = oldest.rows;
        if (gone < 0)
            rc = count_rows(db, name, &gone);
        if (rc == SQLITE_OK)
            rc = exec_owned(db, sqlite3_mprintf("DROP TABLE \"%w\"", name));
        if (rc == SQLITE_OK)
            rc = registry_set(r, RS_FORGET, table, oldest.part, 0, false);
        if (rc == SQLITE_OK)
            rc = make_view(r, db, table);
    } else if (what == EMPTY) {
        gone = cur.rows;
        rc = exec_owned(db, sqlite3_mprintf("DELETE FROM \"%w\"", cur.name));
    } else {
        rc = roll(r, db, table, &cur, now);
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        if (!sqlite3_get_autocommit(db))
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return rc;
    }
    *rows = (uint64_t)(gone > 0 ? gone : 0);
    *changed = true;
    return SQLITE_OK;
}

int rt__retention_step(rt_sink_t *s, sq_retention_t *r, sqlite3 *db, uint64_t now_ms,
                       uint64_t *rows, bool *more)
{
    *rows = 0;
    *more = false;
    if (!rt__retention_on(r) || !r->registry)
        return 0;
    /*
    ** Each table at most once, until one has something to do: those after the one the last
    ** step looked at, in name order, then from the first up to that one again. Names only
    ** grow within each half, so a registry that changes meanwhile cannot make it loop.
    */
    char start[sizeof(r->after)], table[sizeof(r->after)];
    snprintf(start, sizeof(start), "%s", r->after);
    bool wrapped = !start[0]; /* from the first table: one half is all of them */
    int rc = SQLITE_OK;
    for (;;) {
        bool found = false, changed = false;
        if ((rc = next_table(r, r->after, table, sizeof(table), &found)) != SQLITE_OK)
            break;
        if (!found && !wrapped) {
            wrapped = true;
            r->after[0] = 0;
            continue;
        }
        if (!found || (wrapped && start[0] && strcmp(table, start) > 0))
            break;
        snprintf(r->after, sizeof(r->after), "%s", table);
        if ((rc = step_table(r, db, table, now_ms, rows, &changed)) != SQLITE_OK || changed) {
            /* Another step checks again: this table may have more, another table some. */
            *more = changed;
            r->gen += changed;
            break;
        }
    }
    if (rc != SQLITE_OK) {
        rt__sink_error(s, "retention: %s", sqlite3_errmsg(db));
        return RT_EAGAIN;
    }
    return 0;
}

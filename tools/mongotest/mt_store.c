#include "mt_store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct mt_coll {
    mt_coll_t *next;
    int64_t id;           /* row in mt_collections; the documents are in table c<id> */
    char *db;             /* database name */
    char *name;           /* collection name */
    sqlite3_stmt *insert; /* prepared INSERT into c<id> */
};

struct mt_store {
    sqlite3 *db;
    mt_coll_t *colls; /* cache of collections looked up since the last rollback */
    char err[256];    /* message of the last failure */
};

/* Page cache, in KiB: enough to keep the _id index of a few million documents in memory. */
#define MT_STORE_CACHE_KIB "65536"

static char open_err[512];

static int fail(mt_store_t *st)
{
    snprintf(st->err, sizeof st->err, "sqlite: %s", sqlite3_errmsg(st->db));
    return MT_ESTORE;
}

static int exec(mt_store_t *st, const char *sql)
{
    return sqlite3_exec(st->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : fail(st);
}

int mt_store_open(mt_store_t **out, const char *path)
{
    mt_store_t *st = calloc(1, sizeof *st);
    if (!st)
        return RT_ENOMEM;
    if (sqlite3_open(path ? path : ":memory:", &st->db) != SQLITE_OK) {
        snprintf(open_err, sizeof open_err, "%s: %s",
                 path ? path : ":memory:", st->db ? sqlite3_errmsg(st->db) : "out of memory");
        sqlite3_close(st->db);
        free(st);
        return MT_ESTORE;
    }
    /*
    ** WAL without syncs: a committed insert is in the kernel's page cache, so it
    ** survives a killed server (the outage test), though not a power cut, which
    ** a test server need not survive; syncs would cost most of the insert rate.
    ** Large pages mean fewer writes per committed batch; page_size only takes
    ** effect on a new file, before WAL is switched on. The exclusive lock keeps
    ** a second server off the same file and spares the shared-memory WAL index.
    */
    int rc = exec(st, "PRAGMA page_size=65536; PRAGMA locking_mode=EXCLUSIVE;"
                      "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;"
                      "PRAGMA wal_autocheckpoint=256; PRAGMA cache_size=-" MT_STORE_CACHE_KIB ";"
                      "CREATE TABLE IF NOT EXISTS mt_collections(id INTEGER PRIMARY KEY,"
                      " db TEXT NOT NULL, name TEXT NOT NULL, UNIQUE(db, name));");
    if (rc) {
        snprintf(open_err, sizeof open_err, "%s: %s", path ? path : ":memory:", st->err);
        sqlite3_close(st->db);
        free(st);
        return rc;
    }
    sqlite3_busy_timeout(st->db, 1000);
    *out = st;
    return 0;
}

static void coll_free(mt_coll_t *c)
{
    sqlite3_finalize(c->insert);
    free(c->db);
    free(c->name);
    free(c);
}

static void forget_colls(mt_store_t *st)
{
    while (st->colls) {
        mt_coll_t *c = st->colls;
        st->colls = c->next;
        coll_free(c);
    }
}

void mt_store_close(mt_store_t *st)
{
    if (!st)
        return;
    forget_colls(st);
    sqlite3_close(st->db);
    free(st);
}

const char *mt_store_errmsg(const mt_store_t *st)
{
    return st ? st->err : open_err;
}

int mt_store_begin(mt_store_t *st)
{
    return exec(st, "BEGIN");
}

int mt_store_commit(mt_store_t *st)
{
    int rc = exec(st, "COMMIT");
    if (rc)
        mt_store_rollback(st);
    return rc;
}

void mt_store_rollback(mt_store_t *st)
{
    if (!sqlite3_get_autocommit(st->db))
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    forget_colls(st);
}

static int prepare(mt_store_t *st, const char *sql, sqlite3_stmt **stmt)
{
    return sqlite3_prepare_v2(st->db, sql, -1, stmt, NULL) == SQLITE_OK ? 0 : fail(st);
}

static int lookup(mt_store_t *st, const char *db, const char *name, int64_t *id)
{
    sqlite3_stmt *s;
    int rc = prepare(st, "SELECT id FROM mt_collections WHERE db=?1 AND name=?2", &s);
    if (rc)
        return rc;
    sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
    int step = sqlite3_step(s);
    if (step == SQLITE_ROW)
        *id = sqlite3_column_int64(s, 0);
    rc = step == SQLITE_ROW ? 0 : step == SQLITE_DONE ? RT_ENOTFOUND : fail(st);
    sqlite3_finalize(s);
    return rc;
}

static int create(mt_store_t *st, const char *db, const char *name, int64_t *id)
{
    sqlite3_stmt *s;
    char sql[160];
    int rc = prepare(st, "INSERT INTO mt_collections(db, name) VALUES(?1, ?2)", &s);
    if (rc)
        return rc;
    sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
    rc = sqlite3_step(s) == SQLITE_DONE ? 0 : fail(st);
    sqlite3_finalize(s);
    if (rc)
        return rc;
    *id = sqlite3_last_insert_rowid(st->db);
    snprintf(sql, sizeof sql,
             "CREATE TABLE c%lld(seq INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE,"
             " doc BLOB NOT NULL)",
             (long long)*id);
    return exec(st, sql);
}

int mt_store_coll(mt_store_t *st, const char *db, const char *name, bool create_it, mt_coll_t **out)
{
    for (mt_coll_t *c = st->colls; c; c = c->next) {
        if (!strcmp(c->db, db) && !strcmp(c->name, name)) {
            *out = c;
            return 0;
        }
    }
    int64_t id;
    int rc = lookup(st, db, name, &id);
    if (rc == RT_ENOTFOUND && create_it)
        rc = create(st, db, name, &id);
    if (rc)
        return rc;
    mt_coll_t *c = calloc(1, sizeof *c);
    if (!c || !(c->db = strdup(db)) || !(c->name = strdup(name))) {
        if (c)
            coll_free(c);
        return RT_ENOMEM;
    }
    c->id = id;
    c->next = st->colls;
    st->colls = c;
    *out = c;
    return 0;
}

int mt_store_insert(mt_store_t *st, mt_coll_t *c, const uint8_t *key, size_t klen,
                    const uint8_t *doc, size_t len)
{
    if (!c->insert) {
        char sql[80];
        snprintf(sql, sizeof sql, "INSERT INTO c%lld(key, doc) VALUES(?1, ?2)", (long long)c->id);
        int rc = prepare(st, sql, &c->insert);
        if (rc)
            return rc;
    }
    sqlite3_bind_blob(c->insert, 1, key, (int)klen, SQLITE_STATIC);
    sqlite3_bind_blob(c->insert, 2, doc, (int)len, SQLITE_STATIC);
    int step = sqlite3_step(c->insert);
    int rc = step == SQLITE_DONE ? 0 : step == SQLITE_CONSTRAINT ? RT_EEXIST : fail(st);
    sqlite3_reset(c->insert);
    return rc;
}

int mt_store_scan(mt_store_t *st, mt_coll_t *c, const uint8_t *key, size_t klen, bool reverse,
                  mt_scan_fn fn, void *ctx)
{
    char sql[120];
    sqlite3_stmt *s;
    snprintf(sql, sizeof sql, "SELECT seq, doc FROM c%lld%s ORDER BY seq%s", (long long)c->id,
             key ? " WHERE key=?1" : "", reverse ? " DESC" : "");
    int rc = prepare(st, sql, &s);
    if (rc)
        return rc;
    if (key)
        sqlite3_bind_blob(s, 1, key, (int)klen, SQLITE_STATIC);
    int step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) {
        const uint8_t *doc = sqlite3_column_blob(s, 1);
        size_t len = (size_t)sqlite3_column_bytes(s, 1);
        rc = fn(ctx, sqlite3_column_int64(s, 0), doc, len);
        if (rc)
            break;
    }
    if (!rc && step != SQLITE_DONE)
        rc = fail(st);
    sqlite3_finalize(s);
    return rc < 0 ? rc : 0;
}

int mt_store_delete(mt_store_t *st, mt_coll_t *c, int64_t seq)
{
    char sql[80];
    sqlite3_stmt *s;
    snprintf(sql, sizeof sql, "DELETE FROM c%lld WHERE seq=?1", (long long)c->id);
    int rc = prepare(st, sql, &s);
    if (rc)
        return rc;
    sqlite3_bind_int64(s, 1, seq);
    rc = sqlite3_step(s) == SQLITE_DONE ? 0 : fail(st);
    sqlite3_finalize(s);
    return rc;
}

int mt_store_drop(mt_store_t *st, mt_coll_t *c)
{
    char sql[120];
    /* SQLite refuses to drop a table while a statement on it is open. */
    sqlite3_finalize(c->insert);
    c->insert = NULL;
    snprintf(sql, sizeof sql, "DROP TABLE c%lld; DELETE FROM mt_collections WHERE id=%lld",
             (long long)c->id, (long long)c->id);
    int rc = exec(st, sql);
    for (mt_coll_t **p = &st->colls; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            coll_free(c);
            break;
        }
    }
    return rc;
}

int mt_store_names(mt_store_t *st, const char *db, mt_name_fn fn, void *ctx)
{
    sqlite3_stmt *s;
    int rc = prepare(st,
                     db ? "SELECT name FROM mt_collections WHERE db=?1 ORDER BY name"
                        : "SELECT DISTINCT db FROM mt_collections ORDER BY db",
                     &s);
    if (rc)
        return rc;
    if (db)
        sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
    int step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) {
        rc = fn(ctx, (const char *)sqlite3_column_text(s, 0));
        if (rc)
            break;
    }
    if (!rc && step != SQLITE_DONE)
        rc = fail(st);
    sqlite3_finalize(s);
    return rc < 0 ? rc : 0;
}

/*
** state.db's schema versions. The file's PRAGMA user_version says which schema it holds;
** rtd reads RT_STORE_SCHEMA. A file of an older version is brought up to date at start by
** the steps below, all of them in one transaction with the new user_version (a failure
** leaves the file as it was), after a copy of the old file is taken with the online backup
** API (state.db.v<old>-<unix time>.bak beside it: what an older rtd can still start on). A
** newer file is refused: this rtd cannot know what it would lose. rt__sqlite_check_file is
** that check at open, for state.db and for any other file of rtd's with a schema of its own
** (the XMPP accounts' xmpp.db).
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "store.h"

/*
** rtd's steps, oldest first; the last one's version is RT_STORE_SCHEMA. Version 1 is the
** first schema. A step is added when the schema changes, never edited after release (files
** out there went through it as it was).
*/
const rt_store_step_t rt__store_steps[] = {
    {2, RT_STORE_BANNED_TABLE},  /* the banned list (issue 31) */
    {3, RT_STORE_DELAYED_TABLE}, /* delayed publish (issue 31) */
    {0, NULL},
};

int rt__store_migrate(struct sqlite3 *db, const char *path, int from, int to,
                      const rt_store_step_t *steps, char *backup, size_t backuplen, char *err,
                      size_t errlen)
{
    RT_ASSERT(from < to);
    int have = from;
    for (const rt_store_step_t *s = steps; s->sql; s++)
        if (s->version == have + 1 && have < to)
            have = s->version;
    if (have != to) {
        snprintf(err, errlen, "no way from schema version %d to %d (a step is missing)", from, to);
        return RT_EINVAL;
    }
    snprintf(backup, backuplen, "%s.v%d-%llu.bak", path, from,
             (unsigned long long)(rt_wall_ms() / 1000));
    char why[512];
    int rc = rt_sqlite_backup(db, path, backup, NULL, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen,
                 "no copy of the version %d file could be made, so it was not "
                 "migrated: %s",
                 from, why);
        return RT_EINVAL;
    }
    char *msg = NULL;
    rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &msg);
    int at = from;
    for (const rt_store_step_t *s = steps; rc == SQLITE_OK && s->sql; s++) {
        if (s->version <= from || s->version > to)
            continue;
        rc = sqlite3_exec(db, s->sql, NULL, NULL, &msg);
        at = s->version;
    }
    if (rc == SQLITE_OK) {
        char set[64];
        snprintf(set, sizeof(set), "PRAGMA user_version = %d", to);
        rc = sqlite3_exec(db, set, NULL, NULL, &msg);
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen,
                 "migration from schema version %d failed at version %d, nothing changed "
                 "(the copy: %s): %s",
                 from, at, backup, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        if (!sqlite3_get_autocommit(db))
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return RT_EINVAL;
    }
    rt_log(RT_LOG_INFO, "store.migrated", "file=%s from=%d to=%d copy=%s", path, from, to, backup);
    return 0;
}

static int64_t pragma_int(sqlite3 *db, const char *q)
{
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, q, -1, &s, NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/*
** A new file's id, version and tables, in one write transaction: processes opening the
** same new file at once (`rtd xmpp user add` run in parallel) wait for each other (the busy
** timeout) instead of one reading another's half-made schema. 0 made; 1 another process
** made it meanwhile (the caller checks what it made); RT_EAGAIN with why.
*/
static int create(sqlite3 *db, const rt_sqlite_kind_t *kind, char *why, size_t whylen)
{
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(why, whylen, "%s", sqlite3_errmsg(db));
        return RT_EAGAIN;
    }
    if (pragma_int(db, "SELECT count(*) FROM sqlite_master") != 0) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return 1;
    }
    char set[128];
    snprintf(set, sizeof(set), "PRAGMA application_id = %d; PRAGMA user_version = %d;",
             (int)kind->app_id, kind->version);
    if (sqlite3_exec(db, set, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, kind->schema, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(why, whylen, "%s", sqlite3_errmsg(db));
        if (!sqlite3_get_autocommit(db))
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return RT_EAGAIN;
    }
    return 0;
}

/* The three facts that tell a file's kind, read in one transaction: read one by one, they
   once straddled another process's create (application_id 0 read before its commit, its 11
   tables after), and a file being made looked like someone else's. */
static void header_read(sqlite3 *db, int64_t *app, int64_t *version, int64_t *tables)
{
    bool snapshot = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK;
    *app = pragma_int(db, "PRAGMA application_id");
    *version = pragma_int(db, "PRAGMA user_version");
    *tables = pragma_int(db, "SELECT count(*) FROM sqlite_master");
    if (snapshot)
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
}

int rt__sqlite_check_file(struct sqlite3 *db, const char *path, const rt_sqlite_kind_t *kind,
                          char *why, size_t whylen)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &s, NULL) != SQLITE_OK) {
        snprintf(why, whylen, "not an SQLite database (left untouched)");
        return RT_EINVAL;
    }
    int rc = sqlite3_step(s);
    bool ok = rc == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(s, 0), "ok") == 0;
    if (!ok)
        snprintf(why, whylen, "damaged database (quick_check: %s); left untouched",
                 rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : sqlite3_errmsg(db));
    sqlite3_finalize(s);
    if (!ok)
        return RT_EINVAL;
    int64_t app, version, tables;
    header_read(db, &app, &version, &tables);
    if (app == 0 && version == 0 && tables == 0) {
        int rc = create(db, kind, why, whylen);
        if (rc <= 0)
            return rc;
        header_read(db, &app, &version, &tables); /* another process made it first */
    }
    if (app != kind->app_id) {
        snprintf(why, whylen, "not an %s (application_id %lld, %lld tables); left untouched",
                 kind->what, (long long)app, (long long)tables);
        return RT_EINVAL;
    }
    if (version > kind->version || version < 1) {
        snprintf(why, whylen, "schema version %lld, this rtd reads %d and older%s; left untouched",
                 (long long)version, kind->version,
                 version > kind->version ? " (a newer rtd wrote it: run that one, or this one "
                                           "on the copy the newer one made when it migrated)"
                                         : "");
        return RT_EINVAL;
    }
    if (version < kind->version) {
        char backup[600];
        if (rt__store_migrate(db, path, (int)version, kind->version, kind->steps, backup,
                              sizeof(backup), why, whylen) != 0)
            return RT_EINVAL;
    }
    return 0;
}

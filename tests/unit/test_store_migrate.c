/*
** state.db's migrations and SQLite's online copies (actors/store/migrate.c, backup.c): a
** version-1 file (tests/data/state-v1.db) brought to a newer schema by a step list of the
** test's own, after a copy that holds the old file as it was; a failing step leaves the
** file untouched; a missing step is refused before anything; and a copy taken while
** another connection commits is one consistent snapshot that holds everything committed
** before it began.
*/
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sqlite_test.h"
#include "sqlite_mem.h"
#include "store.h"
#include "tmpdir.h"

#define V1 "tests/data/state-v1.db"

/* A fresh copy of the version-1 file at dir/name, opened. */
static sqlite3 *copy_v1(const char *name, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", tmpdir_path, name);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cp %s %s", V1, path);
    CHECK_EQ(system(cmd), 0);
    sqlite3 *db = NULL;
    CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
    return db;
}

/* Every row of rtd's tables as one text (the file's content, whatever its pages). */
static void dump(sqlite3 *db, char *out, size_t n)
{
    static const char *const q[] = {
        "SELECT group_concat(client_id || ':' || expiry || ':' || offline_since, ',') FROM "
        "(SELECT * FROM sessions ORDER BY client_id)",
        "SELECT group_concat(client_id || ':' || hex(filter) || ':' || qos || ':' || flags || "
        "':' || sub_id, ',') FROM (SELECT * FROM subs ORDER BY client_id, filter)",
        "SELECT group_concat(client_id || ':' || seq || ':' || hex(msg) || ':' || qos || ':' || "
        "hex(sub_ids), ',') FROM (SELECT * FROM msgs ORDER BY client_id, seq)",
        "SELECT group_concat(client_id || ':' || packet_id, ',') FROM (SELECT * FROM qos2_in "
        "ORDER BY client_id, packet_id)",
        "SELECT group_concat(hex(topic) || ':' || hex(msg), ',') FROM (SELECT * FROM retained "
        "ORDER BY topic)",
    };
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof(q) / sizeof(q[0]) && k < n; i++) {
        sqlite3_stmt *st;
        CHECK_EQ(sqlite3_prepare_v2(db, q[i], -1, &st, NULL), SQLITE_OK);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            k += (size_t)snprintf(out + k, n - k, "%s|", sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
}

static void test_migration_after_a_copy(void)
{
    char path[256], backup[600], err[1024];
    static char before[1 << 16], after[1 << 16];
    sqlite3 *db = copy_v1("ok.db", path, sizeof(path));
    dump(db, before, sizeof(before));
    CHECK(strstr(before, "v1-qos2:7") != NULL); /* the file is what the test thinks it is */
    static const rt_store_step_t steps[] = {
        {2, "ALTER TABLE sessions ADD COLUMN note TEXT DEFAULT 'two'"},
        {3, "CREATE TABLE extra(x); INSERT INTO extra VALUES (3)"},
        {0, NULL},
    };
    CHECK_EQ(rt__store_migrate(db, path, 1, 3, steps, backup, sizeof(backup), err, sizeof(err)), 0);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), 3);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM sessions WHERE note = 'two'"),
             sql_int(db, "SELECT count(*) FROM sessions"));
    CHECK_EQ(sql_int(db, "SELECT x FROM extra"), 3);
    dump(db, after, sizeof(after));
    CHECK(strcmp(before, after) == 0); /* what was there is all there */
    sqlite3_close(db);
    /* The copy is the version-1 file as it was. */
    char want[700];
    snprintf(want, sizeof(want), "%s.v1-", path);
    CHECK(strncmp(backup, want, strlen(want)) == 0);
    struct stat st;
    CHECK(stat(backup, &st) == 0 && (st.st_mode & 0777) == 0600);
    sqlite3 *copy = NULL;
    CHECK_EQ(sqlite3_open(backup, &copy), SQLITE_OK);
    CHECK_EQ(sql_int(copy, "PRAGMA user_version"), 1);
    CHECK_EQ(sql_int(copy, "SELECT count(*) FROM pragma_table_info('sessions') WHERE name = "
                           "'note'"),
             0);
    dump(copy, after, sizeof(after));
    CHECK(strcmp(before, after) == 0);
    sqlite3_close(copy);
}

static void test_failed_step_changes_nothing(void)
{
    char path[256], backup[600], err[1024];
    sqlite3 *db = copy_v1("bad.db", path, sizeof(path));
    static const rt_store_step_t steps[] = {
        {2, "ALTER TABLE sessions ADD COLUMN note TEXT"},
        {3, "THIS IS NOT SQL"},
        {0, NULL},
    };
    CHECK_EQ(rt__store_migrate(db, path, 1, 3, steps, backup, sizeof(backup), err, sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "failed at version 3") && strstr(err, "nothing changed"));
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), 1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM pragma_table_info('sessions') WHERE name = "
                         "'note'"),
             0);
    CHECK(access(backup, F_OK) == 0);
    /* A step missing on the way: refused before a copy or a change. */
    static const rt_store_step_t gap[] = {{3, "CREATE TABLE t(x)"}, {0, NULL}};
    backup[0] = 0;
    CHECK_EQ(rt__store_migrate(db, path, 1, 3, gap, backup, sizeof(backup), err, sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "a step is missing") != NULL);
    CHECK(backup[0] == 0);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), 1);
    sqlite3_close(db);
    /* rtd's own list ends at its schema, one step a version from 2. */
    int v = 1;
    for (const rt_store_step_t *s = rt__store_steps; s->sql; s++)
        CHECK_EQ(s->version, ++v);
    CHECK_EQ(v, RT_STORE_SCHEMA);
}

/* A writer committing one row at a time until told to stop. A row counts as begun before its
 * commit starts and as committed after the commit returns, so a snapshot taken between two
 * reads holds at least the first read's committed rows and at most the second read's begun. */
static atomic_bool writing;
static atomic_long committed;
static atomic_long begun;
static char live_path[256];

static void *writer(void *arg)
{
    (void)arg;
    sqlite3 *db = NULL;
    sqlite3_open(live_path, &db);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *ins;
    sqlite3_prepare_v2(db, "INSERT INTO t(v) VALUES (?)", -1, &ins, NULL);
    for (long i = 1; atomic_load(&writing); i++) {
        sqlite3_bind_int64(ins, 1, i);
        atomic_store(&begun, i);
        if (sqlite3_step(ins) == SQLITE_DONE)
            atomic_store(&committed, i);
        sqlite3_reset(ins);
    }
    sqlite3_finalize(ins);
    sqlite3_close(db);
    return NULL;
}

static void test_copy_under_writes(void)
{
    snprintf(live_path, sizeof(live_path), "%s/live.db", tmpdir_path);
    sqlite3 *db = NULL;
    CHECK_EQ(sqlite3_open(live_path, &db), SQLITE_OK);
    CHECK_EQ(sqlite3_exec(db,
                          "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v, "
                          "pad BLOB DEFAULT (randomblob(200)))",
                          NULL, NULL, NULL),
             SQLITE_OK);
    sqlite3_close(db);
    atomic_store(&writing, true);
    pthread_t th;
    pthread_create(&th, NULL, writer, NULL);
    while (atomic_load(&committed) < 20000)
        usleep(1000);
    char dst[300], err[512];
    snprintf(dst, sizeof(dst), "%s/copy.db", tmpdir_path);
    long before = atomic_load(&committed);
    uint64_t bytes = 0;
    CHECK_EQ(rt_sqlite_backup(NULL, live_path, dst, &bytes, err, sizeof(err)), 0);
    long after = atomic_load(&begun);
    atomic_store(&writing, false);
    pthread_join(th, NULL);
    CHECK(bytes > 20000 * 200);
    sqlite3 *copy = NULL;
    CHECK_EQ(sqlite3_open(dst, &copy), SQLITE_OK);
    sqlite3_stmt *ic;
    CHECK_EQ(sqlite3_prepare_v2(copy, "PRAGMA integrity_check", -1, &ic, NULL), SQLITE_OK);
    CHECK(sqlite3_step(ic) == SQLITE_ROW &&
          strcmp((const char *)sqlite3_column_text(ic, 0), "ok") == 0);
    sqlite3_finalize(ic);
    long long n = sql_int(copy, "SELECT count(*) FROM t");
    /* One snapshot: rows 1..n exactly, every one committed before the copy began there. */
    CHECK(n >= before && n <= after);
    CHECK_EQ(sql_int(copy, "SELECT max(v) FROM t"), n);
    CHECK_EQ(sql_int(copy, "SELECT count(DISTINCT v) FROM t"), n);
    fprintf(stderr,
            "  copy of %llu bytes: %lld rows (%ld committed before it, %ld begun by its end)\n",
            (unsigned long long)bytes, n, before, after);
    sqlite3_close(copy);
    /* Never over an existing file. */
    CHECK_EQ(rt_sqlite_backup(NULL, live_path, dst, NULL, err, sizeof(err)), RT_EEXIST);
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/none.db", tmpdir_path);
    snprintf(dst, sizeof(dst), "%s/copy2.db", tmpdir_path);
    CHECK_EQ(rt_sqlite_backup(NULL, missing, dst, NULL, err, sizeof(err)), RT_EINVAL);
    CHECK(access(missing, F_OK) != 0 && access(dst, F_OK) != 0);
}

int main(void)
{
    rt_sqlite_mem_init();
    if (tmpdir_make("rt-test-migrate") != 0)
        return 2;
    RUN(test_migration_after_a_copy);
    RUN(test_failed_step_changes_nothing);
    RUN(test_copy_under_writes);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

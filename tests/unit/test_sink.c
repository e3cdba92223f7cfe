/*
** Sinks: config checks, SQLite batching, schema creation and alteration, durable
** acks, metrics arithmetic, the byte limit, spill and replay (database locked by
** another connection; a spill left by an earlier run), and MongoDB against
** rt_mongo_test (or RT_TEST_MONGO_URI) including an outage under load.
*/
#include <bson/bson.h>
#include <errno.h>
#include <mongoc/mongoc.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "conn.h"
#include "config.h"
#include "rt_test.h"
#include "bson_mem.h"
#include "sink.h"
#include "sqlite_mem.h"
#include "sink_test.h"
#include "test_mqtt.h"

/* Whether table t of db holds seq 0..n-1 exactly once each, in insertion (rowid) order. */
static bool in_order(sqlite3 *db, const char *table, long long n)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT seq FROM \"%s\" ORDER BY rowid", table);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return false;
    long long want = 0;
    bool ok = true;
    while (sqlite3_step(st) == SQLITE_ROW)
        if (sqlite3_column_int64(st, 0) != want++)
            ok = false;
    sqlite3_finalize(st);
    if (want != n || !ok)
        fprintf(stderr, "  %s: %lld rows, wanted %lld in order (order ok: %d)\n", table, want, n,
                ok);
    return ok && want == n;
}

/* ---- An actor that collects acks, checking each against the database ---- */

static atomic_long acks, acks_bad, acks_early;
static sqlite3 *ack_db; /* if set, each ack's rows must already be there */
static uint32_t ack_rows_per_sub;

static void acker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag != RT_SINK_MSG_COMMITTED)
        return;
    rt_sink_committed_t c;
    memcpy(&c, m->data, sizeof(c));
    if (c.status != 0)
        atomic_fetch_add(&acks_bad, 1);
    if (ack_db && c.token % 25 == 0) {
        char sql[96];
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM messages WHERE sub = %llu",
                 (unsigned long long)c.token);
        if (sql_int(ack_db, sql) != ack_rows_per_sub)
            atomic_fetch_add(&acks_early, 1);
    }
    atomic_fetch_add(&acks, 1);
}

static const rt_actor_type_t acker_type = {
    .name = "acker", .state_size = 8, .handle = acker_handle};

static rt_pid_t start_acker(void)
{
    atomic_store(&acks, 0);
    atomic_store(&acks_bad, 0);
    atomic_store(&acks_early, 0);
    rt_pid_t pid = 0;
    rt_spawn(&acker_type, NULL, &pid);
    return pid;
}

/* ---- Tests ---- */

static void test_config_errors(void)
{
    char path[160], err[RT_CONF_ERR_LEN];
    snprintf(path, sizeof(path), "%s/rtd.conf", dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "log_level = \"info\"\n\nsinks = {\n  a = { type = \"sqlite\", tabel = \"x\" },\n}\n");
    fclose(f);
    rt_conf_t *c = malloc(sizeof(*c));
    rt_conf_defaults(c);
    CHECK_EQ(rt_conf_load(c, path, err, sizeof(err)), 0);
    CHECK_EQ(c->sinks.n, 1);
    CHECK_EQ(c->sinks.line, 5); /* Lua reports the line the assignment ends on */
    test_start(1);
    CHECK_EQ(rt_sinks_start(c, 0, err, sizeof(err)), RT_EINVAL);
    char want[200];
    snprintf(want, sizeof(want), "%s:4: sinks.a: unknown key tabel", path);
    CHECK(strncmp(err, want, strlen(want)) == 0);
    if (strncmp(err, want, strlen(want)) != 0)
        fprintf(stderr, "  got: %s\n", err);
    static const struct {
        const char *sinks, *needle;
    } bad[] = {
        {"{a = {table = 'x'}}", "type is required"},
        {"{a = {type = 'oracle'}}", "unknown type \"oracle\""},
        {"{a = {type = 'sqlite', batch = 0}}", "batch must be a whole number from 1"},
        {"{a = {type = 'sqlite', batch = 'many'}}", "batch must be a whole number"},
        {"{a = {type = 'sqlite', enabled = 1}}", "enabled must be true or false"},
        {"{a = {type = 'sqlite', columns = {ts = 'date'}}}", "columns.ts"},
        {"{a = {type = 'sqlite', synchronous = 'off'}}", "synchronous must be"},
        {"{a = {type = 'sqlite', retention = {max_rows = 0}}}",
         "retention.max_rows must be a whole number from 1"},
        {"{a = {type = 'sqlite', retention = {max_age = 'week'}}}",
         "retention.max_age must be a whole number"},
        {"{a = {type = 'sqlite', retention = {max_age = 1.5}}}",
         "retention.max_age must be a whole number"},
        {"{a = {type = 'sqlite', retention = {max_bytes = 1000}}}",
         "retention.max_bytes must be a whole number from"},
        {"{a = {type = 'sqlite', retention = {max_row = 5}}}", "unknown key retention.max_row"},
        {"{a = {type = 'mongodb', uri = 'http://x'}}", "uri \"http://x\""},
        {"{a = {type = 'mongodb', enabled = false, uri = 'x'}}", "uri \"x\""},
        {"{a = {type = 'mongodb', w = -1}}", "w must be a whole number"},
        {"{a = {type = 'republish'}}", "topic is required"},
        {"{a = {type = 'republish', topic = 'a/${x'}}", "topic is required"},
        {"{a = {type = 'republish', topic = 'a', qos = 3}}", "qos must be"},
        {"{a = {type = 'http'}}", "url is required"},
        {"{a = {type = 'http', url = 'ftp://x/'}}", "not an http:// or https:// URL"},
        {"{a = {type = 'http', url = 'http://h:0/'}}", "the port must be 1 to 65535"},
        {"{a = {type = 'http', url = 'http://u:p@h/'}}", "without user@"},
        {"{a = {type = 'http', url = 'http://h/', per_request = 'all'}}", "per_request must be"},
        {"{a = {type = 'http', url = 'http://h/', headers = {['A B'] = 'x'}}}", "header A B"},
        {"{a = {type = 'http', url = 'http://h/', headers = {A = 'x\\r\\nB: y'}}}",
         "control character"},
        {"{a = {type = 'http', url = 'http://h/', headers = {'A: x'}}}",
         "headers are name = \"value\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        make_conf(c, bad[i].sinks);
        err[0] = 0;
        int rc = rt_sinks_start(c, 0, err, sizeof(err));
        bool ok = rc != 0 && strstr(err, bad[i].needle) && strstr(err, "sinks.a:");
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  %s: rc %d, got \"%s\", wanted \"%s\"\n", bad[i].sinks, rc, err,
                    bad[i].needle);
        /* rtd --check finds the same, without starting anything. */
        CHECK(rt_sink_describe(c, &c->sinks.s[0], err, sizeof(err)) != 0 &&
              strstr(err, bad[i].needle));
    }
    /* A disabled sink is checked but not started. */
    make_conf(c, "{a = {type = 'sqlite', enabled = false}}");
    CHECK_EQ(rt_sinks_start(c, 0, err, sizeof(err)), 0);
    CHECK(rt_sink_find("a") == NULL);
    rt_sinks_stop();
    rt_sinks_free();
    /* Shape errors are the config loader's, with the line. */
    rt_conf_defaults(c);
    CHECK(rt_conf_set(c, "sinks={a=5}", err, sizeof(err)) != 0 && strstr(err, "sinks"));
    CHECK(rt_conf_set(c, "sinks={a={f=print}}", err, sizeof(err)) != 0);
    rt_shutdown();
    free(c);
}

static void test_sqlite_batches_and_acks(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 500, flush_ms = 20", false, sinks, sizeof(sinks));
    CHECK(s != NULL);
    CHECK(rt_sink_find("nope") == NULL);
    ack_db = open_db(dbfile);
    ack_rows_per_sub = 10;
    rt_pid_t acker = start_acker();
    const uint32_t subs = (uint32_t)check_scale(5000), per = 10, n = subs * per;
    double t0 = now_s();
    for (uint32_t i = 0; i < subs; i++)
        CHECK_EQ(rt_sink_submit(s, make_rows(i * per, per, i, 16), per, NULL, acker, i), 0);
    CHECK(WAIT_FOR("archive", written, n));
    double dt = now_s() - t0;
    CHECK(wait_at_least(&acks, subs));
    CHECK_EQ(atomic_load(&acks_bad), 0);
    CHECK_EQ(atomic_load(&acks_early), 0);
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.written, n);
    CHECK_EQ(i.in, n);
    CHECK(i.batches > 0 && i.batches < n / 50);
    CHECK_EQ(i.dropped, 0);
    CHECK_EQ(i.bytes, 0);
    CHECK(strcmp(i.state, "connected") == 0);
    CHECK(strcmp(i.type, "sqlite") == 0);
    CHECK(books_balance(&i));
    CHECK_EQ(sql_int(ack_db, "SELECT count(*) FROM messages"), n);
    CHECK(in_order(ack_db, "messages", n));
    CHECK_EQ(sql_int(ack_db, "SELECT count(*) FROM pragma_journal_mode WHERE journal_mode='wal'"),
             1);
    fprintf(stderr, "  sqlite: %u rows of ~60 bytes in %llu batches, %.0f rows/s\n", n,
            (unsigned long long)i.batches, n / dt);
    sqlite3_close(ack_db);
    ack_db = NULL;
    stop_all();
}

static void test_sqlite_columns(void)
{
    clean_dir();
    test_start(2);
    char sinks[512];
    snprintf(sinks, sizeof(sinks),
             "{ db = { type = 'sqlite', file = '%s', flush_ms = 1, "
             "columns = { ts = 'integer', note = 'json' } } }",
             dbfile);
    CHECK_EQ(start(sinks), 0);
    rt_sink_t *s = rt_sink_find("db");
    rt_pid_t acker = start_acker();
    bson_t r1 = BSON_INITIALIZER, r2 = BSON_INITIALIZER, r3 = BSON_INITIALIZER;
    BSON_APPEND_INT32(&r1, "a", 1);
    BSON_APPEND_UTF8(&r1, "b", "one");
    BSON_APPEND_INT32(&r2, "a", 2);
    BSON_APPEND_DOUBLE(&r2, "c", 2.5);
    bson_t sub;
    BSON_APPEND_DOCUMENT_BEGIN(&r2, "d", &sub);
    BSON_APPEND_UTF8(&sub, "x", "y");
    BSON_APPEND_INT32(&sub, "n", 3);
    bson_append_document_end(&r2, &sub);
    BSON_APPEND_BINARY(&r2, "e", BSON_SUBTYPE_BINARY, (const uint8_t *)"\x00\x01\x02", 3);
    BSON_APPEND_BOOL(&r2, "f", true);
    BSON_APPEND_NULL(&r2, "g");
    BSON_APPEND_INT32(&r3, "z", 7); /* to another table, by the rule's options */
    bson_t o3 = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&o3, "table", "other");
    CHECK_EQ(rt_sink_submit(s, bin_of(&r1), 1, NULL, acker, 1), 0);
    CHECK_EQ(rt_sink_submit(s, bin_of(&r2), 1, NULL, acker, 2), 0);
    CHECK_EQ(rt_sink_submit(s, bin_of(&r3), 1, bin_of(&o3), acker, 3), 0);
    CHECK(wait_at_least(&acks, 3));
    CHECK_EQ(atomic_load(&acks_bad), 0);
    sqlite3 *db = open_db(dbfile);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), 2);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM other WHERE z = 7"), 1);
    /* Declared columns first (by name), then the first row's keys, then added ones. */
    CHECK_EQ(sql_int(db, "SELECT cid FROM pragma_table_info('messages') WHERE name = 'note'"), 0);
    CHECK_EQ(sql_int(db, "SELECT cid FROM pragma_table_info('messages') WHERE name = 'ts' AND "
                         "upper(type) = 'INTEGER'"),
             1);
    CHECK_EQ(sql_int(db, "SELECT cid FROM pragma_table_info('messages') WHERE name = 'a'"), 2);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM pragma_table_info('messages')"), 9);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM pragma_table_info('messages') WHERE "
                         "(name='c' AND type='REAL') OR (name='e' AND type='BLOB') OR "
                         "(name='f' AND type='INTEGER') OR (name='b' AND type='TEXT')"),
             4);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages WHERE a = 2 AND c = 2.5 AND "
                         "json_extract(d, '$.x') = 'y' AND json_extract(d, '$.n') = 3 AND "
                         "e = x'000102' AND f = 1 AND g IS NULL AND typeof(a) = 'integer'"),
             1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages WHERE a = 1 AND b = 'one' AND c IS NULL"),
             1);
    /* A row the database refuses for its data is dropped, counted, acked with an error,
       and the rows around it are written. */
    CHECK_EQ(sqlite3_exec(db, "CREATE TABLE strict_t (v INTEGER NOT NULL)", NULL, NULL, NULL),
             SQLITE_OK);
    bson_t bad = BSON_INITIALIZER, good = BSON_INITIALIZER, ob = BSON_INITIALIZER;
    BSON_APPEND_NULL(&bad, "v");
    BSON_APPEND_INT32(&good, "v", 5);
    BSON_APPEND_UTF8(&ob, "table", "strict_t");
    uint8_t two[256];
    memcpy(two, bson_get_data(&bad), bad.len);
    memcpy(two + bad.len, bson_get_data(&good), good.len);
    CHECK_EQ(rt_sink_submit(s, rt_bin_new(two, bad.len + good.len), 2, bin_of(&ob), acker, 4), 0);
    CHECK(wait_at_least(&acks, 4));
    CHECK_EQ(atomic_load(&acks_bad), 1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM strict_t WHERE v = 5"), 1);
    rt_sink_info_t i = info("db");
    CHECK_EQ(i.dropped, 1);
    CHECK_EQ(i.written, 4);
    CHECK(strstr(i.last_error, "NOT NULL") != NULL);
    CHECK(books_balance(&i));
    /* A table dropped behind the sink's back is made again (its cached schema is stale);
       a row SQLite cannot take (more columns than SQLITE_MAX_COLUMN) is dropped alone. */
    CHECK_EQ(sqlite3_exec(db, "DROP TABLE other", NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ(rt_sink_submit(s, bin_of(&r3), 1, bin_of(&o3), acker, 5), 0);
    CHECK(wait_at_least(&acks, 5));
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM other WHERE z = 7"), 1);
    bson_t wide = BSON_INITIALIZER, ow = BSON_INITIALIZER;
    for (int k = 0; k < 2100; k++) {
        char key[16];
        snprintf(key, sizeof(key), "c%d", k);
        BSON_APPEND_INT32(&wide, key, k);
    }
    BSON_APPEND_UTF8(&ow, "table", "wide");
    uint8_t *pair = malloc(wide.len + good.len);
    memcpy(pair, bson_get_data(&wide), wide.len);
    memcpy(pair + wide.len, bson_get_data(&good), good.len);
    CHECK_EQ(rt_sink_submit(s, rt_bin_new(pair, wide.len + good.len), 2, bin_of(&ow), acker, 6), 0);
    free(pair);
    CHECK(wait_at_least(&acks, 6));
    CHECK_EQ(atomic_load(&acks_bad), 2);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM wide WHERE v = 5"), 1);
    i = info("db");
    CHECK_EQ(i.dropped, 2);
    CHECK_EQ(i.written, 6);
    CHECK(strstr(i.last_error, "row rejected") && strstr(i.last_error, "too many columns"));
    CHECK(books_balance(&i));
    bson_destroy(&wide);
    bson_destroy(&ow);
    /* Malformed rows are refused at the door. */
    CHECK_EQ(rt_sink_submit(s, rt_bin_new("\x05\x00\x00\x00\x00\x07", 6), 1, NULL, 0, 0),
             RT_EINVAL);
    CHECK_EQ(rt_sink_submit(s, bin_of(&good), 2, NULL, 0, 0), RT_EINVAL);
    i = info("db");
    CHECK_EQ(i.dropped, 5); /* 2 refused by the database, 1 + 2 refused at the door */
    CHECK(books_balance(&i));
    sqlite3_close(db);
    bson_destroy(&r1);
    bson_destroy(&r2);
    bson_destroy(&r3);
    bson_destroy(&o3);
    bson_destroy(&bad);
    bson_destroy(&good);
    bson_destroy(&ob);
    stop_all();
}

/* Holds an exclusive lock on the database from another connection. */
static sqlite3 *lock_db(void)
{
    sqlite3 *db = open_db(dbfile);
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS messages (seq INTEGER)",
                 NULL, NULL, NULL);
    int rc = sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL);
    CHECK_EQ(rc, SQLITE_OK);
    return db;
}

static void unlock_db(sqlite3 *db)
{
    CHECK_EQ(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

static void test_sqlite_spill_and_replay(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100, flush_ms = 5, busy_ms = 10, backoff_ms = 20, "
                                 "backoff_max_ms = 200",
                                 false, sinks, sizeof(sinks));
    sqlite3 *lock = lock_db();
    rt_pid_t acker = start_acker();
    const uint32_t n = (uint32_t)check_scale(3000);
    for (uint32_t i = 0; i < n; i += 10)
        CHECK_EQ(rt_sink_submit(s, make_rows(i, 10, i / 10, 8), 10, NULL, acker, i / 10), 0);
    /* All of it lands in the spill and is acked there (durable), none in the database. */
    CHECK(WAIT_FOR("archive", spilled, n));
    CHECK(wait_at_least(&acks, n / 10));
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.written, 0);
    CHECK(i.failed > 0);
    CHECK(strcmp(i.state, "connected") != 0);
    CHECK(strstr(i.last_error, "locked") != NULL);
    CHECK(books_balance(&i));
    char spill[256];
    snprintf(spill, sizeof(spill), "%s/spill-archive.db", dir);
    struct stat st;
    CHECK(stat(spill, &st) == 0 && (st.st_mode & 0777) == 0600); /* its rows are payloads */
    sqlite3 *sp = open_db(spill);
    CHECK_EQ(sql_int(sp, "SELECT count(*) FROM spill"), n);
    sqlite3_close(sp);
    /* The database comes back: everything is replayed in order, nothing lost. */
    unlock_db(lock);
    CHECK(WAIT_FOR("archive", written, n));
    i = info("archive");
    CHECK_EQ(i.written, n);
    CHECK_EQ(i.spilled, 0);
    CHECK_EQ(i.retried, n);
    CHECK_EQ(i.dropped, 0);
    CHECK(strcmp(i.state, "connected") == 0);
    CHECK(books_balance(&i));
    sqlite3 *db = open_db(dbfile);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), n);
    CHECK(in_order(db, "messages", n));
    sqlite3_close(db);
    CHECK_EQ(atomic_load(&acks_bad), 0);
    stop_all();
}

static void test_sqlite_restart_replays_spill(void)
{
    char sinks[512];
    const char *keys = "batch = 50, flush_ms = 5, busy_ms = 10, backoff_ms = 20, "
                       "backoff_max_ms = 100";
    rt_sink_t *s = start_archive(keys, false, sinks, sizeof(sinks));
    sqlite3 *lock = lock_db();
    const uint32_t n = 1000;
    for (uint32_t k = 0; k < n; k += 100)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 100, k, 8), 100, NULL, 0, 0), 0);
    rt_sink_info_t i;
    /* Stopping with the database still locked: the rows stay in the spill file. */
    rt_sinks_stop();
    CHECK_EQ(rt_sink_submit(s, make_rows(0, 1, 0, 8), 1, NULL, 0, 0), RT_ESHUTDOWN);
    CHECK(rt_sink_find("archive") == NULL);
    i = info("archive");
    CHECK_EQ(i.spilled, n);
    CHECK_EQ(i.dropped, 1);
    CHECK(books_balance(&i));
    rt_shutdown();
    rt_sinks_free();
    unlock_db(lock);
    start_archive(keys, true, sinks, sizeof(sinks));
    CHECK(WAIT_FOR("archive", written, n));
    i = info("archive");
    CHECK_EQ(i.recovered, n);
    CHECK_EQ(i.in, n);
    CHECK_EQ(i.written, n);
    CHECK_EQ(i.spilled, 0);
    CHECK(books_balance(&i));
    sqlite3 *db = open_db(dbfile);
    CHECK(in_order(db, "messages", n));
    sqlite3_close(db);
    stop_all();
}

/* A spill file that is not one (garbage left behind) is set aside; the sink works on. */
static void test_foreign_spill_set_aside(void)
{
    clean_dir();
    char spill[256], sinks[512];
    snprintf(spill, sizeof(spill), "%s/spill-archive.db", dir);
    FILE *f = fopen(spill, "w");
    for (int k = 0; k < 200; k++)
        fputs("this is not an SQLite database\n", f);
    fclose(f);
    rt_sink_t *s = start_archive("flush_ms = 5", true, sinks, sizeof(sinks));
    CHECK_EQ(rt_sink_submit(s, make_rows(0, 10, 0, 8), 10, NULL, 0, 0), 0);
    CHECK(WAIT_FOR("archive", written, 10));
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.recovered, 0);
    CHECK(books_balance(&i));
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "ls %s/spill-archive.db.bad-* >/dev/null 2>&1", dir);
    CHECK_EQ(system(cmd), 0);
    stop_all();
}

static void test_byte_limit(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 10, flush_ms = 5, busy_ms = 10, backoff_ms = 10, "
                                 "backoff_max_ms = 50, max_bytes = 20000",
                                 false, sinks, sizeof(sinks));
    sqlite3 *lock = lock_db();
    rt_pid_t acker = start_acker();
    uint32_t ok = 0, refused = 0;
    for (uint32_t i = 0; i < 100; i++) {
        int rc = rt_sink_submit(s, make_rows(ok, 1, i, 300), 1, NULL, acker, i);
        if (rc == 0)
            ok++;
        else if (rc == RT_ELIMIT)
            refused++;
    }
    CHECK(ok > 10 && ok < 100);
    CHECK_EQ(ok + refused, 100);
    CHECK(wait_at_least(&acks, 100));
    CHECK_EQ(atomic_load(&acks_bad), refused);
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.dropped, refused);
    CHECK(i.bytes <= 20000);
    CHECK(WAIT_FOR("archive", spilled, ok));
    i = info("archive");
    CHECK(books_balance(&i));
    unlock_db(lock);
    CHECK(WAIT_FOR("archive", written, ok));
    i = info("archive");
    CHECK_EQ(i.bytes, 0);
    CHECK(books_balance(&i));
    sqlite3 *db = open_db(dbfile);
    CHECK(in_order(db, "messages", ok));
    sqlite3_close(db);
    stop_all();
}

/*
** The memory bound: with batches that never fill and a flush that never comes, rows
** past queue_bytes go to the spill even though the database is up, and reach the
** database from there, in order.
*/
static void test_queue_bytes_bound(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100000, flush_ms = 3600000, queue_bytes = 2048", false,
                                 sinks, sizeof(sinks));
    const uint32_t n = 200;
    for (uint32_t k = 0; k < n; k += 10)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 10, k, 100), 10, NULL, 0, 0), 0);
    CHECK(WAIT_FOR("archive", retried, n - 30));
    /* Quiescent: every submission handled, nothing more to drain. */
    rt_actor_info_t ai;
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (rt_actor_info(rt_whereis("sink:archive"), &ai) == 0 &&
           (ai.mailbox_len > 0 || ai.status != RT_STATUS_WAITING) && test_now_ms() < end)
        test_sleep_ms(2);
    rt_sink_info_t i = info("archive");
    CHECK(i.written >= n - 30 && i.written == i.retried);
    CHECK_EQ(i.failed, 0);
    /* What stays in memory is within the bound (~150 B a row)... */
    CHECK(i.queued > 0 && i.queued * 150 <= 2048);
    /* ...and lives in the sink actor's heap: its binaries show there (for rtctl). */
    CHECK(ai.bin_bytes >= i.queued * 100);
    CHECK(books_balance(&i));
    rt_sinks_stop(); /* the rest is written at stop: the database is up */
    i = info("archive");
    CHECK_EQ(i.written, n);
    CHECK(books_balance(&i));
    sqlite3 *db = open_db(dbfile);
    CHECK(in_order(db, "messages", n));
    sqlite3_close(db);
    rt_shutdown();
    rt_sinks_free();
}

/* A runtime-wide max_heap smaller than a sink's queue does not kill the sink. */
static void test_runtime_max_heap_spares_sinks(void)
{
    clean_dir();
    rt_config_t cfg;
    rt_config_defaults(&cfg);
    cfg.schedulers = 2;
    cfg.max_heap = 32 * 1024;
    CHECK_EQ(rt_init(&cfg), 0);
    char sinks[512];
    snprintf(sinks, sizeof(sinks),
             "{ archive = { type = 'sqlite', file = '%s', batch = 100000, flush_ms = 3600000, "
             "queue_bytes = 1048576 } }",
             dbfile);
    CHECK_EQ(start(sinks), 0);
    rt_sink_t *s = rt_sink_find("archive");
    const uint32_t n = 2000; /* ~300 KB, held in memory */
    for (uint32_t k = 0; k < n; k += 100)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 100, k, 100), 100, NULL, 0, 0), 0);
    rt_actor_info_t ai;
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (rt_actor_info(rt_whereis("sink:archive"), &ai) == 0 && ai.mailbox_len > 0 &&
           test_now_ms() < end)
        test_sleep_ms(2);
    CHECK(rt_alive(rt_whereis("sink:archive")));
    CHECK(ai.bin_bytes > cfg.max_heap);
    rt_sinks_stop();
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.written, n);
    CHECK(books_balance(&i));
    rt_shutdown();
    rt_sinks_free();
}

/*
** A SQLite sink's actor is charged for what SQLite holds for it (its database and spill
** connections, their page caches and statements) and for its batch buffer: with no other
** connection in the process, what SQLite holds beyond what it held before the sink started
** is exactly what actors are charged for, since every allocation for the sink happens in
** its actor's turns. When the sink stops, the charge goes with it.
*/
static void test_sink_memory(void)
{
    clean_dir();
    size_t used0, charged0, used, charged;
    rt_sqlite_mem_stats(&used0, &charged0);
    CHECK_EQ(charged0, 0);
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 200, flush_ms = 5", true, sinks, sizeof(sinks));
    const uint32_t n = 4000;
    for (uint32_t k = 0; k < n; k += 100)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 100, k, 200), 100, NULL, 0, 0), 0);
    CHECK(WAIT_FOR("archive", written, n));
    rt_actor_info_t ai;
    /* The last write is charged when its turn ends, a moment after `written` moves. */
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        test_sleep_ms(5);
        rt_sqlite_mem_stats(&used, &charged);
        CHECK_EQ(rt_actor_info(rt_whereis("sink:archive"), &ai), 0);
    } while (charged != used - used0 && test_now_ms() < end);
    fprintf(stderr, "  sqlite sink: SQLite holds %zu bytes for it, actor ext_bytes %llu\n",
            used - used0, (unsigned long long)ai.ext_bytes);
    CHECK(used > used0 && charged == used - used0);
    CHECK(ai.ext_bytes >= charged + 200 * sizeof(void *)); /* and its batch buffer */
    rt_sinks_stop();
    rt_sqlite_mem_stats(&used, &charged);
    CHECK_EQ(charged, 0);
    CHECK(used <= used0 + (used0 >> 4)); /* the connections are closed */
    rt_shutdown();
    rt_sinks_free();
}

/* ---- Republish: through a real broker to a raw MQTT 3.1.1 subscriber ---- */

/* Connects to port and subscribes to filter at QoS 0; returns the socket or -1. */
static int mqtt_subscriber(int port, const char *filter)
{
    int fd = tcp_connect(port);
    if (fd < 0)
        return -1;
    static const uint8_t conn[] = {0x10, 15, 0,  4, 'M', 'Q', 'T', 'T', 4,
                                   2,    0,  60, 0, 3,   's', 'u', 'b'};
    uint8_t sub[128], body[64];
    size_t fl = strlen(filter), len;
    size_t n = 0;
    sub[n++] = 0x82;
    sub[n++] = (uint8_t)(2 + 2 + fl + 1);
    sub[n++] = 0;
    sub[n++] = 1;
    sub[n++] = 0;
    sub[n++] = (uint8_t)fl;
    memcpy(sub + n, filter, fl);
    n += fl;
    sub[n++] = 0;
    if (write(fd, conn, sizeof(conn)) != (ssize_t)sizeof(conn) ||
        read_packet(fd, body, sizeof(body), &len) != 0x20 || body[1] != 0 ||
        write(fd, sub, n) != (ssize_t)n || read_packet(fd, body, sizeof(body), &len) != 0x90) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads one PUBLISH; topic and payload as strings. */
static bool next_publish(int fd, char *topic, size_t tcap, char *payload, size_t pcap)
{
    uint8_t body[4096];
    size_t len;
    int h = read_packet(fd, body, sizeof(body), &len);
    if ((h & 0xf0) != 0x30 || len < 2)
        return false;
    size_t tl = (size_t)body[0] << 8 | body[1];
    size_t off = 2 + tl + ((h & 6) ? 2 : 0);
    if (tl >= tcap || off > len || len - off >= pcap)
        return false;
    memcpy(topic, body + 2, tl);
    topic[tl] = 0;
    memcpy(payload, body + off, len - off);
    payload[len - off] = 0;
    return true;
}

static void test_republish(void)
{
    clean_dir();
    test_start(2);
    rt_conf_t *c = malloc(sizeof(*c));
    int port = free_port();
    char err[RT_CONF_ERR_LEN], sinks[512];
    snprintf(sinks, sizeof(sinks),
             "{ rp = { type = 'republish', topic = 'out/${key}/${meta.site}', "
             "payload = '${payload} from ${key} (${missing})' }, "
             "rpjson = { type = 'republish', topic = 'json/${key}' } }");
    make_conf(c, sinks);
    c->nlisteners = 1;
    snprintf(c->listeners[0].host, sizeof(c->listeners[0].host), "127.0.0.1");
    c->listeners[0].port = port;
    CHECK_EQ(rt_mqtt_start(c, err, sizeof(err)), 0);
    CHECK_EQ(rt_sinks_start(c, 0, err, sizeof(err)), 0);
    free(c);
    int fd = mqtt_subscriber(port, "#");
    CHECK(fd >= 0);
    if (fd < 0) {
        stop_all();
        rt_broker_free();
        return;
    }
    rt_pid_t acker = start_acker();
    bson_t r = BSON_INITIALIZER, meta;
    BSON_APPEND_UTF8(&r, "key", "k1");
    BSON_APPEND_BINARY(&r, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *)"hello", 5);
    BSON_APPEND_DOCUMENT_BEGIN(&r, "meta", &meta);
    BSON_APPEND_UTF8(&meta, "site", "s1");
    bson_append_document_end(&r, &meta);
    CHECK_EQ(rt_sink_submit(rt_sink_find("rp"), bin_of(&r), 1, NULL, acker, 1), 0);
    char topic[256], payload[1024];
    CHECK(next_publish(fd, topic, sizeof(topic), payload, sizeof(payload)));
    CHECK(strcmp(topic, "out/k1/s1") == 0);
    CHECK(strcmp(payload, "hello from k1 ()") == 0);
    /* No payload template: the row as JSON. */
    CHECK_EQ(rt_sink_submit(rt_sink_find("rpjson"), bin_of(&r), 1, NULL, acker, 2), 0);
    CHECK(next_publish(fd, topic, sizeof(topic), payload, sizeof(payload)));
    CHECK(strcmp(topic, "json/k1") == 0);
    CHECK(strstr(payload, "\"site\" : \"s1\"") != NULL);
    /* The rule's options win; a topic that renders invalid is dropped and counted. */
    bson_t o = BSON_INITIALIZER, bad = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&o, "topic", "alt/${key}");
    BSON_APPEND_UTF8(&o, "payload", "v=${meta}");
    CHECK_EQ(rt_sink_submit(rt_sink_find("rp"), bin_of(&r), 1, bin_of(&o), acker, 3), 0);
    CHECK(next_publish(fd, topic, sizeof(topic), payload, sizeof(payload)));
    CHECK(strcmp(topic, "alt/k1") == 0);
    CHECK(strstr(payload, "v={") == payload && strstr(payload, "s1"));
    /* ${payload.x} reaches into a payload of JSON text. */
    bson_t js = BSON_INITIALIZER, oj = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&js, "key", "k2");
    const char *json = "{\"sensor\": {\"t\": 21.5}}";
    BSON_APPEND_BINARY(&js, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *)json,
                       (uint32_t)strlen(json));
    BSON_APPEND_UTF8(&oj, "payload", "t=${payload.sensor.t}");
    CHECK_EQ(rt_sink_submit(rt_sink_find("rp"), bin_of(&js), 1, bin_of(&oj), acker, 5), 0);
    CHECK(next_publish(fd, topic, sizeof(topic), payload, sizeof(payload)));
    CHECK(strcmp(topic, "out/k2/") == 0);
    CHECK(strcmp(payload, "t=21.5") == 0);
    bson_destroy(&js);
    bson_destroy(&oj);
    BSON_APPEND_UTF8(&bad, "key", "+");
    CHECK_EQ(rt_sink_submit(rt_sink_find("rpjson"), bin_of(&bad), 1, NULL, acker, 4), 0);
    CHECK(wait_at_least(&acks, 5));
    CHECK_EQ(atomic_load(&acks_bad), 1);
    rt_sink_info_t i = info("rp"), j = info("rpjson");
    CHECK_EQ(i.written, 3);
    CHECK_EQ(j.written, 1);
    CHECK_EQ(j.dropped, 1);
    CHECK(strstr(j.last_error, "json/+") != NULL);
    CHECK(strcmp(i.state, "connected") == 0 && strcmp(i.type, "republish") == 0);
    CHECK(books_balance(&i) && books_balance(&j));
    close(fd);
    bson_destroy(&r);
    bson_destroy(&o);
    bson_destroy(&bad);
    stop_all();
    rt_broker_free();
}

/* ---- MongoDB ---- */

static pid_t mongo_pid;
static int mongo_port;

/* Starts rt_mongo_test on db file; returns false if the binary is absent. */
static bool mongo_start(const char *bin, const char *file, int port)
{
    int out[2];
    if (pipe(out) != 0)
        return false;
    char portbuf[16];
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    mongo_pid = fork();
    if (mongo_pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl(bin, bin, "--port", portbuf, "--db", file, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    char line[128] = {0};
    size_t len = 0;
    while (len < sizeof(line) - 1 && read(out[0], line + len, 1) == 1 && line[len] != '\n')
        len++;
    close(out[0]);
    line[len] = 0;
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening 127.0.0.1:", 20) != 0 || !colon) {
        fprintf(stderr, "  rt_mongo_test said \"%s\"\n", line);
        return false;
    }
    mongo_port = atoi(colon + 1);
    return true;
}

static void mongo_kill(void)
{
    if (mongo_pid > 0) {
        kill(mongo_pid, SIGKILL);
        waitpid(mongo_pid, NULL, 0);
    }
    mongo_pid = 0;
}

static bool mongo_cmd(const char *uri, const char *db, const bson_t *cmd, bson_t *reply)
{
    mongoc_client_t *c = mongoc_client_new(uri);
    bson_error_t e;
    bool ok = mongoc_client_command_simple(c, db, cmd, NULL, reply, &e);
    if (!ok)
        fprintf(stderr, "  mongo %s: %s\n", db, e.message);
    mongoc_client_destroy(c);
    return ok;
}

static long long mongo_count(const char *uri, const char *coll)
{
    mongoc_client_t *c = mongoc_client_new(uri);
    mongoc_collection_t *col = mongoc_client_get_collection(c, "rt_sink_test", coll);
    bson_t q = BSON_INITIALIZER;
    bson_error_t e;
    long long n = mongoc_collection_count_documents(col, &q, NULL, NULL, NULL, &e);
    bson_destroy(&q);
    mongoc_collection_destroy(col);
    mongoc_client_destroy(c);
    return n;
}

/* Whether coll holds seq 0..n-1 each exactly once, and per key in increasing _id order. */
static bool mongo_all_in_order(const char *uri, const char *coll, long long n)
{
    mongoc_client_t *c = mongoc_client_new(uri);
    mongoc_collection_t *col = mongoc_client_get_collection(c, "rt_sink_test", coll);
    bson_t q = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort;
    BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
    BSON_APPEND_INT32(&sort, "_id", 1);
    bson_append_document_end(&opts, &sort);
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(col, &q, &opts, NULL);
    const bson_t *doc;
    char *seen = calloc((size_t)n, 1);
    long long last_per_key[7], count = 0, dups = 0, disorder = 0;
    for (int k = 0; k < 7; k++)
        last_per_key[k] = -1;
    while (mongoc_cursor_next(cur, &doc)) {
        bson_iter_t it;
        if (!bson_iter_init_find(&it, doc, "seq"))
            continue;
        long long seq = bson_iter_as_int64(&it);
        count++;
        if (seq < 0 || seq >= n || seen[seq]++)
            dups++;
        else if (seq <= last_per_key[seq % 7])
            disorder++;
        else
            last_per_key[seq % 7] = seq;
    }
    bson_error_t e;
    bool err = mongoc_cursor_error(cur, &e);
    mongoc_cursor_destroy(cur);
    bson_destroy(&q);
    bson_destroy(&opts);
    mongoc_collection_destroy(col);
    mongoc_client_destroy(c);
    free(seen);
    if (err || count != n || dups || disorder)
        fprintf(stderr, "  %s: %lld docs (want %lld), %lld duplicates, %lld out of order%s\n", coll,
                count, n, dups, disorder, err ? ", cursor error" : "");
    return !err && count == n && !dups && !disorder;
}

static void fault(const char *uri, const char *kind, const char *arg, int v)
{
    bson_t cmd = BSON_INITIALIZER, reply;
    BSON_APPEND_UTF8(&cmd, "rtFault", kind);
    if (arg)
        BSON_APPEND_INT32(&cmd, arg, v);
    CHECK(mongo_cmd(uri, "admin", &cmd, &reply));
    bson_destroy(&reply);
    bson_destroy(&cmd);
}

static const char *mongo_binary(char *buf, size_t cap)
{
    const char *env = getenv("RT_MONGO_TEST_BIN");
    if (env)
        return access(env, X_OK) == 0 ? env : NULL;
    char exe[256];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(buf, cap, "%s/tools/mongotest/rt_mongo_test", exe);
    return access(buf, X_OK) == 0 ? buf : NULL;
}

static void test_mongo(void)
{
    const char *ext = getenv("RT_TEST_MONGO_URI");
    char binbuf[300], uri[128], file[192];
    const char *bin = ext ? NULL : mongo_binary(binbuf, sizeof(binbuf));
    if (!ext && !bin) {
        fprintf(stderr, "  SKIPPED: rt_mongo_test not built (tools/mongotest) and "
                        "RT_TEST_MONGO_URI not set\n");
        return;
    }
    clean_dir();
    snprintf(file, sizeof(file), "%s/mongo.db", dir);
    if (ext) {
        snprintf(uri, sizeof(uri), "%s", ext);
    } else {
        if (!mongo_start(bin, file, 0)) {
            CHECK(!"rt_mongo_test did not start");
            return;
        }
        snprintf(uri, sizeof(uri), "mongodb://127.0.0.1:%d", mongo_port);
    }
    mongoc_init();
    /* Start from empty collections (a real server keeps them between runs). */
    const char *colls[] = {"basic", "other", "outage"};
    for (size_t k = 0; k < 3; k++) {
        bson_t cmd = BSON_INITIALIZER, reply;
        BSON_APPEND_UTF8(&cmd, "drop", colls[k]);
        mongoc_client_t *c = mongoc_client_new(uri);
        mongoc_client_command_simple(c, "rt_sink_test", &cmd, NULL, &reply, NULL);
        mongoc_client_destroy(c);
        bson_destroy(&reply);
        bson_destroy(&cmd);
    }
    test_start(2);
    char sinks[512];
    snprintf(sinks, sizeof(sinks),
             "{ mongo = { type = 'mongodb', uri = '%s', database = 'rt_sink_test', "
             "collection = 'basic', batch = 200, flush_ms = 10, timeout_ms = 500, "
             "backoff_ms = 20, backoff_max_ms = 300 } }",
             uri);
    CHECK_EQ(start(sinks), 0);
    rt_sink_t *s = rt_sink_find("mongo");
    rt_pid_t acker = start_acker();
    const uint32_t n = 2000;
    for (uint32_t i = 0; i < n; i += 20)
        CHECK_EQ(rt_sink_submit(s, make_rows(i, 20, i / 20, 16), 20, NULL, acker, i / 20), 0);
    CHECK(WAIT_FOR("mongo", written, n));
    CHECK(wait_at_least(&acks, n / 20));
    CHECK_EQ(atomic_load(&acks_bad), 0);
    rt_sink_info_t i = info("mongo");
    CHECK(i.batches < n / 20);
    CHECK(strcmp(i.state, "connected") == 0);
    CHECK(books_balance(&i));
    CHECK(mongo_all_in_order(uri, "basic", n));
    /* What mongo-c-driver allocated in the sink's turns (a client, its buffers) is charged
       to the sink's actor (only actor here that drives it). */
    rt_actor_info_t ai;
    size_t bused, bcharged;
    rt_bson_mem_stats(&bused, &bcharged);
    CHECK_EQ(rt_actor_info(rt_whereis("sink:mongo"), &ai), 0);
    CHECK(bcharged > 0 && bcharged <= bused && ai.ext_bytes >= bcharged);
    /* The rule's options pick the collection. */
    bson_t r = BSON_INITIALIZER, o = BSON_INITIALIZER;
    BSON_APPEND_INT64(&r, "seq", 0);
    BSON_APPEND_UTF8(&o, "collection", "other");
    CHECK_EQ(rt_sink_submit(s, bin_of(&r), 1, bin_of(&o), 0, 0), 0);
    CHECK(WAIT_FOR("mongo", written, n + 1));
    CHECK_EQ(mongo_count(uri, "other"), 1);
    /* A collection name MongoDB cannot take rejects that row alone. */
    bson_t ob = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&ob, "collection", "bad$name");
    CHECK_EQ(rt_sink_submit(s, bin_of(&r), 1, bin_of(&ob), acker, 1000), 0);
    CHECK_EQ(rt_sink_submit(s, bin_of(&r), 1, bin_of(&o), acker, 1001), 0);
    CHECK(wait_at_least(&acks, n / 20 + 2));
    CHECK_EQ(atomic_load(&acks_bad), 1);
    CHECK_EQ(mongo_count(uri, "other"), 2);
    i = info("mongo");
    CHECK_EQ(i.dropped, 1);
    CHECK(strstr(i.last_error, "bad$name") != NULL);
    CHECK(books_balance(&i));
    bson_destroy(&ob);
    bson_destroy(&r);
    bson_destroy(&o);
    rt_sinks_stop();
    rt_shutdown();
    rt_sinks_free();
    if (ext) {
        fprintf(stderr, "  RT_TEST_MONGO_URI set: fault and outage parts skipped\n");
        return;
    }

    /* Faults, then an outage under load: kill the server mid-stream, restart it on the
       same file; every row arrives once, in order per key. */
    test_start(2);
    snprintf(sinks, sizeof(sinks),
             "{ mongo = { type = 'mongodb', uri = '%s', database = 'rt_sink_test', "
             "collection = 'outage', batch = 100, flush_ms = 5, timeout_ms = 300, "
             "backoff_ms = 20, backoff_max_ms = 300 } }",
             uri);
    CHECK_EQ(start(sinks), 0);
    s = rt_sink_find("mongo");
    fault(uri, "failWrites", "n", 3);
    const uint32_t m = 6000;
    uint32_t sent = 0;
    for (; sent < m / 3; sent += 20)
        CHECK_EQ(rt_sink_submit(s, make_rows(sent, 20, sent / 20, 16), 20, NULL, 0, 0), 0);
    CHECK(WAIT_FOR("mongo", written, sent));
    CHECK(info("mongo").failed >= 3);
    /* A server that stalls past the socket timeout, then one that refuses connections:
       rows wait in the spill and arrive once it recovers. */
    static const struct {
        const char *kind;
        int ms;
    } faults[] = {{"stall", 1000}, {"refuse", 600}};
    for (size_t f = 0; f < 2; f++) {
        uint64_t failed = info("mongo").failed;
        fault(uri, faults[f].kind, "ms", faults[f].ms);
        uint32_t end = sent + 200;
        for (; sent < end; sent += 20)
            CHECK_EQ(rt_sink_submit(s, make_rows(sent, 20, sent / 20, 16), 20, NULL, 0, 0), 0);
        CHECK(WAIT_FOR("mongo", failed, failed + 1));
        if (f == 0)
            fault(uri, "clear", NULL, 0);
        CHECK(WAIT_FOR("mongo", written, sent));
        rt_sink_info_t fi = info("mongo");
        CHECK(books_balance(&fi));
    }
    int port = mongo_port;
    for (; sent < 2 * m / 3; sent += 20) {
        CHECK_EQ(rt_sink_submit(s, make_rows(sent, 20, sent / 20, 16), 20, NULL, 0, 0), 0);
        if (sent == m / 2)
            mongo_kill();
        test_sleep_ms(sent % 200 == 0 ? 1 : 0);
    }
    if (mongo_pid)
        mongo_kill();
    for (; sent < m; sent += 20)
        CHECK_EQ(rt_sink_submit(s, make_rows(sent, 20, sent / 20, 16), 20, NULL, 0, 0), 0);
    CHECK(WAIT_FOR("mongo", spilled, 1));
    i = info("mongo");
    CHECK(strcmp(i.state, "connected") != 0);
    CHECK(books_balance(&i));
    CHECK(mongo_start(bin, file, port));
    CHECK(WAIT_FOR("mongo", written, m));
    i = info("mongo");
    CHECK_EQ(i.written, m);
    CHECK_EQ(i.spilled, 0);
    CHECK_EQ(i.dropped, 0);
    CHECK(i.retried > 0);
    CHECK(books_balance(&i));
    CHECK(mongo_all_in_order(uri, "outage", m));
    rt_sinks_stop();
    rt_shutdown();
    rt_sinks_free();
    mongo_kill();
}

/* ---- Throughput (only with RT_SINK_BENCH=N) ---- */

/* N small rows ({seq, v, s}, ~40 bytes) as binaries of 100 rows each. */
static rt_bin_t **small_rows(uint32_t n)
{
    rt_bin_t **bins = malloc(n / 100 * sizeof(*bins));
    for (uint32_t i = 0; i < n; i += 100) {
        uint8_t buf[100 * 64];
        size_t len = 0;
        for (uint32_t k = 0; k < 100; k++) {
            bson_t row = BSON_INITIALIZER;
            BSON_APPEND_INT64(&row, "seq", i + k);
            BSON_APPEND_DOUBLE(&row, "v", (i + k) * 0.5);
            BSON_APPEND_UTF8(&row, "s", "abc");
            memcpy(buf + len, bson_get_data(&row), row.len);
            len += row.len;
            bson_destroy(&row);
        }
        bins[i / 100] = rt_bin_new(buf, len);
    }
    return bins;
}

/* Starts sinks (one named name), submits n small rows 100 at a time, times the commits. */
static void bench_one(const char *label, const char *sinks, const char *name, uint32_t n)
{
    rt_bin_t **bins = small_rows(n);
    test_start(2);
    CHECK_EQ(start(sinks), 0);
    rt_sink_t *s = rt_sink_find(name);
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i += 100)
        rt_sink_submit(s, bins[i / 100], 100, NULL, 0, 0);
    CHECK(WAIT_FOR(name, written, n));
    double dt = now_s() - t0;
    rt_sink_info_t i = info(name);
    fprintf(stderr, "  bench %-40s %u rows in %.2f s: %.0f rows/s, %llu batches\n", label, n, dt,
            n / dt, (unsigned long long)i.batches);
    stop_all();
    free(bins);
}

/*
** Throughput for small rows, submitted 100 at a time (binaries made beforehand),
** timed from the first submission to the last commit: SQLite with batch 500 and 2000,
** synchronous full and normal; MongoDB (rt_mongo_test) with batch 500 and 2000.
*/
static void bench_sinks(void)
{
    uint32_t n = (uint32_t)atol(getenv("RT_SINK_BENCH")) / 100 * 100;
    static const char *const variants[] = {
        "batch = 500, synchronous = 'full'", "batch = 500, synchronous = 'normal'",
        "batch = 2000, synchronous = 'full'", "batch = 2000, synchronous = 'normal'"};
    char sinks[512], label[96];
    for (size_t v = 0; v < 4; v++) {
        clean_dir();
        snprintf(sinks, sizeof(sinks),
                 "{ archive = { type = 'sqlite', file = '%s', %s, "
                 "flush_ms = 20, queue_bytes = 1e9 } }",
                 dbfile, variants[v]);
        snprintf(label, sizeof(label), "sqlite %s", variants[v]);
        bench_one(label, sinks, "archive", n);
    }
    char binbuf[300], file[192];
    const char *bin = mongo_binary(binbuf, sizeof(binbuf));
    for (int batch = 500; bin && batch <= 2000; batch *= 4) {
        clean_dir();
        snprintf(file, sizeof(file), "%s/mongo.db", dir);
        if (!mongo_start(bin, file, 0))
            break;
        snprintf(sinks, sizeof(sinks),
                 "{ mongo = { type = 'mongodb', uri = "
                 "'mongodb://127.0.0.1:%d', database = 'bench', batch = %d, flush_ms = 20, "
                 "queue_bytes = 1e9 } }",
                 mongo_port, batch);
        snprintf(label, sizeof(label), "mongodb (rt_mongo_test) batch = %d", batch);
        bench_one(label, sinks, "mongo", n);
        mongo_kill();
    }
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/rt-test-sink-%d", (int)getpid());
    snprintf(dbfile, sizeof(dbfile), "%s/rt.db", dir);
    umask(022); /* a shell's: a file found 0600 was made so by the sink, not by the umask */
    rt_sqlite_mem_init(); /* as rtd's first SQLite user does; this test opens databases too */
    clean_dir();
    RUN(test_config_errors);
    RUN(test_sqlite_batches_and_acks);
    RUN(test_sqlite_columns);
    RUN(test_sqlite_spill_and_replay);
    RUN(test_sqlite_restart_replays_spill);
    RUN(test_foreign_spill_set_aside);
    RUN(test_byte_limit);
    RUN(test_queue_bytes_bound);
    RUN(test_runtime_max_heap_spares_sinks);
    RUN(test_sink_memory);
    RUN(test_republish);
    RUN(test_mongo);
    if (getenv("RT_SINK_BENCH"))
        RUN(bench_sinks);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return CHECK_SUMMARY();
}

/*
** The SQLite sink's retention (retention = { max_rows, max_age, max_bytes }; test_sink.c has
** their errors): what a sink is said to keep; tables kept as partitions under a view, the
** oldest dropped whole: the newest rows up to max_rows kept per table, rows gone after
** max_age and not before (across a restart), pages in use brought under max_bytes, a
** tightened limit that drops a backlog in one step, and partitions that outlive the
** settings that made them (columns added to each, written after retention is turned off).
*/
#include <bson/bson.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "rt_test.h"
#include "sink.h"
#include "sink_test.h"
#include "sqlite_mem.h"

/* Whether the view messages holds exactly seq first..last, in the order it reads them
   (partitions oldest first, each in rowid order: the order they were written in). */
static bool holds_range(sqlite3 *db, long long first, long long last)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT seq FROM messages", -1, &st, NULL))
        return false;
    long long want = first;
    bool ok = true;
    while (sqlite3_step(st) == SQLITE_ROW)
        ok &= sqlite3_column_int64(st, 0) == want++;
    sqlite3_finalize(st);
    if (!ok || want != last + 1)
        fprintf(stderr, "  messages: wanted seq %lld..%lld in order, got up to %lld (order %d)\n",
                first, last, want - 1, ok);
    return ok && want == last + 1;
}

/* Submits rows first..first+n-1 in submissions of per rows; true once all are written. */
static bool write_rows(rt_sink_t *s, uint32_t first, uint32_t n, uint32_t per, int payload)
{
    uint64_t before = info("archive").written;
    for (uint32_t i = 0; i < n; i += per)
        CHECK_EQ(rt_sink_submit(s, make_rows(first + i, per, first + i, payload), per, NULL, 0, 0),
                 0);
    return WAIT_FOR("archive", written, before + n);
}

/*
** Waits until table holds at most max rows and every one of the n written is either there
** or counted expired: the steps that bring it there have all run. *kept: its rows.
*/
static bool settles(sqlite3 *db, const char *table, long long max, uint64_t n, long long *kept)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM \"%s\"", table);
    uint64_t end = test_now_ms() + 30000;
    for (;;) {
        uint64_t expired = info("archive").expired;
        *kept = sql_int(db, sql);
        if ((*kept <= max && expired + (uint64_t)*kept == n) || test_now_ms() > end)
            break;
        test_sleep_ms(5);
    }
    bool ok = *kept <= max && info("archive").expired + (uint64_t)*kept == n;
    if (!ok)
        fprintf(stderr, "  %s: %lld rows, %llu expired, of %llu written (at most %lld kept)\n",
                table, *kept, (unsigned long long)info("archive").expired, (unsigned long long)n,
                max);
    return ok;
}

static void test_described(void)
{
    clean_dir();
    test_start(1);
    char err[RT_CONF_ERR_LEN];
    rt_conf_t *c = malloc(sizeof(*c));
    /* What rtd --check and the start log say a sink keeps. */
    static const struct {
        const char *sinks, *says;
    } described[] = {
        {"{ a = { type = 'sqlite', retention = { max_age = 7 * 86400, max_bytes = 1024 * 1024 * "
         "1024 } } }",
         "rows deleted 7d after they were written or while the database's pages in use pass "
         "1GiB"},
        {"{ a = { type = 'sqlite', retention = { max_rows = 1000000, max_age = 5400 } } }",
         "rows deleted 90m after they were written or beyond the newest 1000000 of a table"},
        {"{ a = { type = 'sqlite' } }", "no retention: every row is kept"},
        {"{ a = { type = 'sqlite', enabled = false } }", "disabled"},
        {"{ a = { type = 'mongodb' } }", "rtd deletes nothing"},
        {"{ a = { type = 'republish', topic = 't' } }", "keeps nothing"},
    };
    for (size_t i = 0; i < sizeof(described) / sizeof(described[0]); i++) {
        make_conf(c, described[i].sinks);
        int rc = rt_sink_describe(c, &c->sinks.s[0], err, sizeof(err));
        bool ok = rc == 0 && strncmp(err, described[i].says, strlen(described[i].says)) == 0;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  %s: rc %d, \"%s\", wanted \"%s\"\n", described[i].sinks, rc, err,
                    described[i].says);
    }
    rt_shutdown();
    free(c);
}

/*
** Each table keeps between 15/16 of max_rows and max_rows, its newest, in order; the rest
** are counted expired; the registry lists the partitions there are, and is not a table
** rules may write to.
*/
static void test_max_rows(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100, flush_ms = 5, retention = { max_rows = 1000 }",
                                 false, sinks, sizeof(sinks));
    CHECK(s != NULL);
    const uint32_t n = 5000;
    CHECK(write_rows(s, 0, n, 50, 16));
    sqlite3 *db = open_db(dbfile);
    long long kept = 0;
    CHECK(settles(db, "messages", 1000, n, &kept));
    CHECK(kept > 1000 - 1000 / 16 - 1);
    CHECK(holds_range(db, n - kept, n - 1));
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.written, n);
    CHECK(books_balance(&i));
    CHECK(strstr(i.retention, "beyond the newest 1000 of a table") != NULL);
    /* The registry's partitions are the view's: each exists and holds what it says. */
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM rt_partitions WHERE tbl = 'messages' AND "
                         "tbl || '_p' || part NOT IN (SELECT name FROM sqlite_schema)"),
             0);
    CHECK(sql_int(db, "SELECT count(*) FROM rt_partitions WHERE tbl = 'messages'") <= 17);
    CHECK_EQ(sql_int(db, "SELECT type = 'view' FROM sqlite_schema WHERE name = 'messages'"), 1);
    /* Each table the sink writes is kept to max_rows, in turn. */
    bson_t opts = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&opts, "table", "other");
    for (uint32_t k = 0; k < 3000; k += 100)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 100, 0, 4), 100, bin_of(&opts), 0, 0), 0);
    CHECK(WAIT_FOR("archive", written, n + 3000));
    long long other = 0;
    CHECK(settles(db, "other", 1000, n + 3000 - (uint64_t)kept, &other));
    CHECK(other > 1000 - 1000 / 16 - 1);
    CHECK_EQ(sql_int(db, "SELECT min(seq) FROM other"), 3000 - other);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), kept);
    bson_reinit(&opts);
    BSON_APPEND_UTF8(&opts, "table", "rt_partitions");
    CHECK_EQ(rt_sink_submit(s, make_rows(n, 1, 0, 4), 1, bin_of(&opts), 0, 0), 0);
    CHECK(WAIT_FOR("archive", dropped, 1));
    bson_destroy(&opts);
    sqlite3_close(db);
    stop_all();
}

/*
** Rows go after max_age and never before: each batch's rows are gone only once max_age has
** passed since it was submitted (its partition's last write cannot be older). The
** registry outlives a restart, and the last partition, emptied by age, takes new rows that
** are young whatever rowids they get.
*/
static void test_max_age(void)
{
    const uint64_t age_ms = 2000;
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100, flush_ms = 5, retention = { max_age = 2 }", false,
                                 sinks, sizeof(sinks));
    uint64_t t_a = rt_wall_ms();
    CHECK(write_rows(s, 0, 300, 100, 8));
    uint64_t none_yet = info("archive").expired; /* read before the clock */
    if (rt_wall_ms() < t_a + age_ms)
        CHECK_EQ(none_yet, 0);
    /* B must begin a partition of its own: A's is a partition's span old (1 s here). */
    while (rt_wall_ms() < t_a + 1500)
        test_sleep_ms(10);
    uint64_t t_b = rt_wall_ms();
    CHECK(write_rows(s, 300, 200, 100, 8));
    /* A restart in between: the partitions are in the database. */
    stop_all();
    test_start(2);
    CHECK_EQ(start(sinks), 0);
    CHECK(WAIT_FOR("archive", expired, 300));
    uint64_t t_gone_a = rt_wall_ms();
    sqlite3 *db = open_db(dbfile);
    long long left = sql_int(db, "SELECT count(*) FROM messages");
    bool b_due = rt_wall_ms() >= t_b + age_ms; /* read after the count */
    CHECK(t_gone_a >= t_a + age_ms);
    if (!b_due)
        CHECK(holds_range(db, 300, 499));
    else
        fprintf(stderr, "  late: B was due when counted (%lld rows left)\n", left);
    CHECK(WAIT_FOR("archive", expired, 500));
    CHECK(rt_wall_ms() >= t_b + age_ms);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), 0);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM rt_partitions"), 1);
    uint64_t t_c = rt_wall_ms();
    CHECK(write_rows(rt_sink_find("archive"), 500, 100, 100, 8));
    long long c_rows = sql_int(db, "SELECT count(*) FROM messages");
    if (rt_wall_ms() < t_c + age_ms)
        CHECK_EQ(c_rows, 100);
    CHECK(WAIT_FOR("archive", expired, 600));
    CHECK(rt_wall_ms() >= t_c + age_ms);
    sqlite3_close(db);
    stop_all();
}

/* Pages in use come down under max_bytes, by the oldest rows; the newest stay. */
static void test_max_bytes(void)
{
    const long long limit = 1 << 20;
    char sinks[512], extra[128];
    snprintf(extra, sizeof(extra), "batch = 200, flush_ms = 5, retention = { max_bytes = %lld }",
             limit);
    rt_sink_t *s = start_archive(extra, false, sinks, sizeof(sinks));
    const uint32_t n = 6000; /* rows of ~1 KiB: ~6 MiB */
    CHECK(write_rows(s, 0, n, 100, 1000));
    sqlite3 *db = open_db(dbfile);
    const char *used = "SELECT (SELECT page_count FROM pragma_page_count) - "
                       "(SELECT freelist_count FROM pragma_freelist_count)";
    uint64_t end = test_now_ms() + 20000;
    long long pages = 0, size = sql_int(db, "PRAGMA page_size");
    while ((pages = sql_int(db, used)) * size > limit && test_now_ms() < end)
        test_sleep_ms(5);
    CHECK(pages * size <= limit);
    long long kept = 0;
    CHECK(settles(db, "messages", n, n, &kept));
    CHECK(kept > 0 && kept < n);
    CHECK(holds_range(db, n - kept, n - 1));
    fprintf(stderr, "  max_bytes %lld: %lld of %u rows kept, %lld pages of %lld bytes in use\n",
            limit, kept, n, pages, size);
    sqlite3_close(db);
    stop_all();
}

/* A collector of acks. */
static atomic_long acked;

static void ack_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state;
    if (m->tag == RT_SINK_MSG_COMMITTED)
        atomic_fetch_add(&acked, 1);
}

static const rt_actor_type_t ack_type = {.name = "acks", .state_size = 8, .handle = ack_handle};

/*
** A database far over its limit (retention tightened over a big table): the backlog is one
** partition, closed and dropped whole in two steps, and the rows submitted meanwhile are
** committed and kept.
*/
static void test_tightened_limit_drops_the_backlog(void)
{
    char sinks[512];
    /* Written under a loose limit: one partition. */
    rt_sink_t *s = start_archive("batch = 500, flush_ms = 0, retention = { max_rows = 1e9 }", false,
                                 sinks, sizeof(sinks));
    const uint32_t backlog = (uint32_t)check_scale(200000) / 1000 * 1000;
    CHECK(write_rows(s, 0, backlog, 1000, 8));
    stop_all();
    snprintf(sinks, sizeof(sinks),
             "{ archive = { type = 'sqlite', file = '%s', batch = 500, flush_ms = 0, "
             "retention = { max_rows = 100 } } }",
             dbfile);
    test_start(2);
    CHECK_EQ(start(sinks), 0);
    atomic_store(&acked, 0);
    rt_pid_t acker = 0;
    rt_spawn(&ack_type, NULL, &acker);
    CHECK_EQ(
        rt_sink_submit(rt_sink_find("archive"), make_rows(backlog, 10, 0, 8), 10, NULL, acker, 1),
        0);
    CHECK(wait_at_least(&acked, 1));
    sqlite3 *db = open_db(dbfile);
    long long kept = 0;
    CHECK(settles(db, "messages", 100, backlog + 10, &kept));
    CHECK(holds_range(db, backlog, backlog + 9));
    sqlite3_close(db);
    stop_all();
}

/*
** Partitions outlive the settings that made them: a plain table written before retention
** becomes the first partition (its index with it); a new key adds a column to every
** partition, and the view shows it; with retention off again, rows go to the newest
** partition and nothing is dropped; a view rtd did not make is not written to.
*/
static void test_partitions_across_settings(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100, flush_ms = 5", false, sinks, sizeof(sinks));
    CHECK(write_rows(s, 0, 300, 100, 8));
    stop_all();
    sqlite3 *db = open_db(dbfile);
    CHECK_EQ(sqlite3_exec(db, "CREATE INDEX by_seq ON messages(seq)", NULL, NULL, NULL), SQLITE_OK);
    s = start_archive("batch = 100, flush_ms = 5, retention = { max_rows = 320 }", true, sinks,
                      sizeof(sinks));
    CHECK(write_rows(s, 300, 100, 100, 8));
    bson_t row = BSON_INITIALIZER;
    BSON_APPEND_INT64(&row, "seq", 400);
    BSON_APPEND_UTF8(&row, "note", "new key");
    CHECK_EQ(rt_sink_submit(s, bin_of(&row), 1, NULL, 0, 0), 0);
    bson_destroy(&row);
    CHECK(WAIT_FOR("archive", written, 101)); /* counted since this start */
    long long kept = 0;
    CHECK(settles(db, "messages", 320, 401, &kept));
    /* The old table was the first partition: it went whole, its index with it. */
    CHECK_EQ(kept, 101);
    CHECK(holds_range(db, 300, 400));
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages WHERE note = 'new key'"), 1);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'by_seq'"), 0);
    stop_all();
    long long parts = sql_int(db, "SELECT count(*) FROM rt_partitions");
    s = start_archive("batch = 100, flush_ms = 5", true, sinks, sizeof(sinks));
    CHECK(write_rows(s, 401, 200, 100, 8));
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), kept + 200);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM rt_partitions"), parts);
    CHECK_EQ(info("archive").expired, 0);
    stop_all();
    CHECK_EQ(sqlite3_exec(db, "CREATE TABLE base(seq); CREATE VIEW theirs AS SELECT * FROM base",
                          NULL, NULL, NULL),
             SQLITE_OK);
    s = start_archive("batch = 100, flush_ms = 5, retention = { max_rows = 320 }", true, sinks,
                      sizeof(sinks));
    bson_t opts = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&opts, "table", "theirs");
    CHECK_EQ(rt_sink_submit(s, make_rows(0, 1, 0, 4), 1, bin_of(&opts), 0, 0), 0);
    CHECK(WAIT_FOR("archive", dropped, 1));
    CHECK(strstr(info("archive").last_error, "theirs is not a table") != NULL);
    bson_destroy(&opts);
    sqlite3_close(db);
    stop_all();
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/rt-test-retention-%d", (int)getpid());
    snprintf(dbfile, sizeof(dbfile), "%s/rt.db", dir);
    rt_sqlite_mem_init();
    RUN(test_described);
    RUN(test_max_rows);
    RUN(test_max_age);
    RUN(test_max_bytes);
    RUN(test_tightened_limit_drops_the_backlog);
    RUN(test_partitions_across_settings);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return CHECK_SUMMARY();
}

/*
** The SQLite sink's retention (retention = { max_rows, max_age, max_bytes }; test_sink.c has
** their errors): what a sink is said to keep, the newest max_rows kept per table, rows gone after
*max_age and not
** before (marks kept across a restart, rowids handed out again once a table is empty),
** pages in use brought under max_bytes, and inserts that go on while a backlog of
** deletions is worked off.
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

/* Whether table messages holds exactly seq first..last, in rowid order. */
static bool holds_range(sqlite3 *db, long long first, long long last)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT seq FROM messages ORDER BY rowid", -1, &st, NULL))
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
    return WAIT_FOR("archive", written, before + n, 30000);
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

/* The newest max_rows of each table stay, in order; the rest are counted expired;
   rt_retention is not a table rules may write to. */
static void test_max_rows(void)
{
    char sinks[512];
    rt_sink_t *s = start_archive("batch = 100, flush_ms = 5, retention = { max_rows = 1000 }",
                                 false, sinks, sizeof(sinks));
    CHECK(s != NULL);
    const uint32_t n = 5000;
    CHECK(write_rows(s, 0, n, 50, 16));
    CHECK(WAIT_FOR("archive", expired, n - 1000, 20000));
    sqlite3 *db = open_db(dbfile);
    CHECK(holds_range(db, n - 1000, n - 1));
    rt_sink_info_t i = info("archive");
    CHECK_EQ(i.expired, n - 1000);
    CHECK_EQ(i.written, n);
    CHECK(books_balance(&i));
    CHECK(strstr(i.retention, "beyond the newest 1000 of a table") != NULL);
    /* Marks of deleted rows went with them. */
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM rt_retention WHERE upto < (SELECT min(rowid) "
                         "FROM messages)"),
             0);
    /* Each table the sink writes is kept to max_rows, in turn. */
    bson_t opts = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&opts, "table", "other");
    for (uint32_t k = 0; k < 3000; k += 100)
        CHECK_EQ(rt_sink_submit(s, make_rows(k, 100, 0, 4), 100, bin_of(&opts), 0, 0), 0);
    CHECK(WAIT_FOR("archive", expired, n - 1000 + 2000, 20000));
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM other"), 1000);
    CHECK_EQ(sql_int(db, "SELECT min(seq) FROM other"), 2000);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), 1000);
    bson_reinit(&opts);
    BSON_APPEND_UTF8(&opts, "table", "rt_retention");
    CHECK_EQ(rt_sink_submit(s, make_rows(n, 1, 0, 4), 1, bin_of(&opts), 0, 0), 0);
    CHECK(WAIT_FOR("archive", dropped, 1, 5000));
    bson_destroy(&opts);
    sqlite3_close(db);
    stop_all();
}

/*
** Rows go after max_age and never before: each batch's rows are gone only once max_age has
** passed since it was submitted (its mark cannot be older). The marks outlive a restart,
** and a table emptied by age hands out rowid 1 again without its new rows being taken for
** old ones.
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
    /* B must be younger than A by more than a mark's interval (1 s at this max_age). */
    while (rt_wall_ms() < t_a + 1500)
        test_sleep_ms(10);
    uint64_t t_b = rt_wall_ms();
    CHECK(write_rows(s, 300, 200, 100, 8));
    /* A restart in between: the marks are in the database. */
    stop_all();
    test_start(2);
    CHECK_EQ(start(sinks), 0);
    CHECK(WAIT_FOR("archive", expired, 300, 20000));
    uint64_t t_gone_a = rt_wall_ms();
    sqlite3 *db = open_db(dbfile);
    long long left = sql_int(db, "SELECT count(*) FROM messages");
    bool b_due = rt_wall_ms() >= t_b + age_ms; /* read after the count */
    CHECK(t_gone_a >= t_a + age_ms);
    if (!b_due)
        CHECK(holds_range(db, 300, 499));
    else
        fprintf(stderr, "  late: B was due when counted (%lld rows left)\n", left);
    CHECK(WAIT_FOR("archive", expired, 500, 20000));
    CHECK(rt_wall_ms() >= t_b + age_ms);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM messages"), 0);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM rt_retention"), 0);
    /* The table is empty: rowids start at 1 again; C's rows are young whatever their ids. */
    uint64_t t_c = rt_wall_ms();
    CHECK(write_rows(rt_sink_find("archive"), 500, 100, 100, 8));
    long long c_rows = sql_int(db, "SELECT count(*) FROM messages WHERE rowid <= 100");
    if (rt_wall_ms() < t_c + age_ms)
        CHECK_EQ(c_rows, 100);
    CHECK(WAIT_FOR("archive", expired, 600, 20000));
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
    rt_sink_info_t i = info("archive");
    long long kept = sql_int(db, "SELECT count(*) FROM messages");
    CHECK(kept > 0 && kept < n);
    CHECK_EQ((long long)i.expired + kept, n);
    CHECK(holds_range(db, n - kept, n - 1));
    fprintf(stderr, "  max_bytes %lld: %lld of %u rows kept, %lld pages of %lld bytes in use\n",
            limit, kept, n, pages, size);
    sqlite3_close(db);
    stop_all();
}

/* A collector of acks: the expired count when each came. */
static atomic_long acked;
static _Atomic uint64_t expired_at_ack;

static void ack_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state;
    if (m->tag != RT_SINK_MSG_COMMITTED)
        return;
    if (atomic_load(&acked) == 0)
        atomic_store(&expired_at_ack, info("archive").expired);
    atomic_fetch_add(&acked, 1);
}

static const rt_actor_type_t ack_type = {.name = "acks", .state_size = 8, .handle = ack_handle};

/*
** A database far over its limit (retention turned on over a big table): the deletions come
** in steps between batches, so a row submitted at once is committed (acked) while most of
** the backlog is still there, not after it.
*/
static void test_backlog_does_not_hold_inserts(void)
{
    char sinks[512];
    /* Written under a loose limit, so the sink knows the table (its marks) when it tightens. */
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
    CHECK(wait_at_least(&acked, 1, 10000));
    uint64_t at_ack = atomic_load(&expired_at_ack);
    CHECK(at_ack < backlog / 2);
    CHECK(WAIT_FOR("archive", expired, backlog + 10 - 100, 60000));
    sqlite3 *db = open_db(dbfile);
    CHECK(holds_range(db, backlog + 10 - 100, backlog + 9));
    fprintf(stderr, "  backlog of %u rows: the new row acked after %llu deletions\n", backlog,
            (unsigned long long)at_ack);
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
    RUN(test_backlog_does_not_hold_inserts);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return CHECK_SUMMARY();
}

/*
** What the sink tests share (test_sink.c, test_sink_retention.c): a data directory of their
** own, sinks started from a Lua `sinks` table, their metrics, rows made as BSON, and SQLite
** read back.
*/
#ifndef RT_SINK_TEST_H
#define RT_SINK_TEST_H

#include <bson/bson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "rt_test.h"
#include "sink.h"
#include "sqlite_test.h"

static char dir[128];
static char dbfile[192];

/* ---- Helpers ---- */

static inline void clean_dir(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    mkdir(dir, 0755);
}

/* A config with data_dir = dir and the given sinks table (Lua). */
static inline void make_conf(rt_conf_t *c, const char *sinks)
{
    rt_conf_defaults(c);
    snprintf(c->data_dir, sizeof(c->data_dir), "%s", dir);
    char err[RT_CONF_ERR_LEN], a[1024];
    snprintf(a, sizeof(a), "sinks=%s", sinks);
    if (rt_conf_set(c, a, err, sizeof(err)) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(2);
    }
}

static inline int start(const char *sinks)
{
    rt_conf_t *c = malloc(sizeof(*c));
    make_conf(c, sinks);
    char err[RT_CONF_ERR_LEN];
    int rc = rt_sinks_start(c, 0, err, sizeof(err));
    if (rc)
        fprintf(stderr, "rt_sinks_start: %s\n", err);
    free(c);
    return rc;
}

static inline void stop_all(void)
{
    rt_sinks_stop();
    rt_shutdown();
    rt_sinks_free();
}

static inline rt_sink_info_t info(const char *name)
{
    rt_sink_info_t all[8], none = {0};
    size_t n = rt_sinks_snapshot(all, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(all[i].name, name) == 0)
            return all[i];
    return none;
}

static inline bool books_balance(const rt_sink_info_t *i)
{
    bool ok = i->in == i->written + i->queued + i->inflight + i->spilled + i->dropped;
    if (!ok)
        fprintf(stderr,
                "  books: in %llu != written %llu + queued %llu + inflight %llu + "
                "spilled %llu + dropped %llu\n",
                (unsigned long long)i->in, (unsigned long long)i->written,
                (unsigned long long)i->queued, (unsigned long long)i->inflight,
                (unsigned long long)i->spilled, (unsigned long long)i->dropped);
    return ok;
}

/*
** Starts a runtime with one SQLite sink "archive" on dbfile (extra: more keys, Lua) in
** a fresh directory unless keep_dir; sinks gets the table used, for a restart.
*/
static inline rt_sink_t *start_archive(const char *extra, bool keep_dir, char *sinks, size_t cap)
{
    if (!keep_dir)
        clean_dir();
    test_start(2);
    snprintf(sinks, cap, "{ archive = { type = 'sqlite', file = '%s', %s } }", dbfile, extra);
    CHECK_EQ(start(sinks), 0);
    return rt_sink_find("archive");
}

/* Whether field of sink name reached want (within RT_TEST_WAIT_MS). Read once per round: a
   gauge such as spilled may fall again right after (rows moved back for a retry), and a
   second read would miss it. */
#define WAIT_FOR(name, field, want)                                                                \
    ({                                                                                             \
        uint64_t end_ = test_now_ms() + RT_TEST_WAIT_MS;                                           \
        bool reached_;                                                                             \
        while (!(reached_ = info(name).field >= (uint64_t)(want)) && test_now_ms() < end_)         \
            test_sleep_ms(2);                                                                      \
        reached_;                                                                                  \
    })

/* n rows {seq, sub, key, payload} as one binary, seq from first. */
static inline rt_bin_t *make_rows(uint32_t first, uint32_t n, uint32_t sub, int payload_bytes)
{
    bson_t all = BSON_INITIALIZER; /* just a buffer: documents are appended raw */
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    char payload[4096];
    memset(payload, 'x', sizeof(payload));
    for (uint32_t i = 0; i < n; i++) {
        bson_t row = BSON_INITIALIZER;
        BSON_APPEND_INT64(&row, "seq", first + i);
        BSON_APPEND_INT32(&row, "sub", (int32_t)sub);
        char key[16];
        snprintf(key, sizeof(key), "k%u", (first + i) % 7);
        BSON_APPEND_UTF8(&row, "key", key);
        bson_append_utf8(&row, "payload", -1, payload, payload_bytes);
        if (len + row.len > cap) {
            cap = (len + row.len) * 2;
            buf = realloc(buf, cap);
        }
        memcpy(buf + len, bson_get_data(&row), row.len);
        len += row.len;
        bson_destroy(&row);
    }
    bson_destroy(&all);
    rt_bin_t *b = rt_bin_new(buf, len);
    free(buf);
    return b;
}

static inline rt_bin_t *bin_of(const bson_t *doc)
{
    return rt_bin_new(bson_get_data(doc), doc->len);
}

#endif

/*
** The spill queue (spill.h): an SQLite file per sink (data_dir/spill-<name>.db) or bridge with
** one table, spill(seq INTEGER PRIMARY KEY, row BLOB, opts BLOB): the row as the BSON
** document it was submitted as (a bridge's: the message), its per-rule options (a bridge's: its
** topic there), and seq giving the order (rowid order: appends only ever go at the end). WAL
** mode; a sink's with synchronous=FULL, so an append that returned 0 survives a crash or power
** loss; that is what lets a sink ack rows once they are here.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spill.h"
#include "sqlite_mem.h"
#include "store.h"

static int spill_failed(rt_spill_t *sp, const char *what, char *why, size_t whylen)
{
    snprintf(why, whylen, "%s: %s: %s", sp->path, what, sp->db ? sqlite3_errmsg(sp->db) : "");
    return RT_EAGAIN;
}

int rt_spill_open(rt_spill_t *sp, const char *path, bool each_durable, char *why, size_t whylen)
{
    memset(sp, 0, sizeof(*sp));
    snprintf(sp->path, sizeof(sp->path), "%s", path);
    rt_store_create_private(path);
    rt_sqlite_mem_init();
    if (sqlite3_open_v2(path, &sp->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        spill_failed(sp, "open", why, whylen);
        rt_spill_close(sp);
        return RT_EAGAIN;
    }
    sqlite3_busy_timeout(sp->db, 1000);
    sqlite3_stmt *count = NULL;
    const char *what = "setup";
    if (sqlite3_exec(sp->db,
                     each_durable ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                  : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                     NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(sp->db,
                     "CREATE TABLE IF NOT EXISTS spill(seq INTEGER PRIMARY KEY, row BLOB NOT NULL,"
                     " opts BLOB)",
                     NULL, NULL, NULL) != SQLITE_OK ||
        (what = "prepare",
         sqlite3_prepare_v2(sp->db, "INSERT INTO spill(row, opts) VALUES (?, ?)", -1, &sp->ins,
                            NULL) != SQLITE_OK ||
             sqlite3_prepare_v2(
                 sp->db, "SELECT seq, row, opts FROM spill WHERE seq > ? ORDER BY seq LIMIT ?", -1,
                 &sp->sel, NULL) != SQLITE_OK ||
             sqlite3_prepare_v2(sp->db, "DELETE FROM spill WHERE seq <= ?", -1, &sp->del, NULL) !=
                 SQLITE_OK ||
             sqlite3_prepare_v2(sp->db, "SELECT count(*), coalesce(sum(length(row)), 0) FROM spill",
                                -1, &count, NULL) != SQLITE_OK) ||
        (what = "count", sqlite3_step(count) != SQLITE_ROW)) {
        spill_failed(sp, what, why, whylen);
        /* Not a database, a damaged one, or one without our table's shape. */
        int ec = sqlite3_errcode(sp->db) & 0xff;
        sqlite3_finalize(count);
        rt_spill_close(sp);
        return ec == SQLITE_NOTADB || ec == SQLITE_CORRUPT || ec == SQLITE_ERROR ? RT_EINVAL
                                                                                 : RT_EAGAIN;
    }
    sp->rows = (uint64_t)sqlite3_column_int64(count, 0);
    sp->bytes = (uint64_t)sqlite3_column_int64(count, 1);
    sqlite3_finalize(count);
    return 0;
}

int rt_spill_append(rt_spill_t *sp, const sink_row_t *rows, size_t n, char *why, size_t whylen)
{
    if (sqlite3_exec(sp->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return spill_failed(sp, "begin", why, whylen);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        sqlite3_bind_blob(sp->ins, 1, rows[i].doc, (int)rows[i].len, SQLITE_STATIC);
        if (rows[i].opts_len)
            sqlite3_bind_blob(sp->ins, 2, rows[i].opts, (int)rows[i].opts_len, SQLITE_STATIC);
        else
            sqlite3_bind_null(sp->ins, 2);
        int rc = sqlite3_step(sp->ins);
        sqlite3_reset(sp->ins);
        if (rc != SQLITE_DONE) {
            spill_failed(sp, "insert", why, whylen);
            sqlite3_exec(sp->db, "ROLLBACK", NULL, NULL, NULL);
            return RT_EAGAIN;
        }
        bytes += rows[i].len;
    }
    sqlite3_clear_bindings(sp->ins);
    if (sqlite3_exec(sp->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        spill_failed(sp, "commit", why, whylen);
        sqlite3_exec(sp->db, "ROLLBACK", NULL, NULL, NULL);
        return RT_EAGAIN;
    }
    sp->rows += n;
    sp->bytes += bytes;
    return 0;
}

int rt_spill_peek(rt_spill_t *sp, int64_t after, sink_row_t *rows, size_t max, uint8_t **buf,
                  int64_t *last, uint64_t *bytes, char *why, size_t whylen)
{
    *buf = NULL;
    *bytes = 0;
    /* Two passes over one statement would race nothing (one connection), but copying
       each row as it comes is simpler: grow one buffer, then point rows into it. */
    size_t n = 0;
    rt_buf_t b = {0};
    size_t *offs = malloc(max * 2 * sizeof(size_t));
    if (!offs) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    sqlite3_bind_int64(sp->sel, 1, after > sp->done ? after : sp->done);
    sqlite3_bind_int64(sp->sel, 2, (sqlite3_int64)max);
    int rc;
    while ((rc = sqlite3_step(sp->sel)) == SQLITE_ROW) {
        RT_ASSERT(n < max); /* the LIMIT */
        int rl = sqlite3_column_bytes(sp->sel, 1), ol = sqlite3_column_bytes(sp->sel, 2);
        offs[2 * n] = b.len;
        rt_buf_add(&b, sqlite3_column_blob(sp->sel, 1), (size_t)rl);
        offs[2 * n + 1] = b.len;
        if (ol) /* no options: SQLite gives NULL, which memcpy must not see */
            rt_buf_add(&b, sqlite3_column_blob(sp->sel, 2), (size_t)ol);
        if (b.oom) {
            rc = SQLITE_NOMEM;
            break;
        }
        rows[n] = (sink_row_t){.len = (uint32_t)rl, .opts_len = (uint32_t)ol};
        *last = sqlite3_column_int64(sp->sel, 0);
        *bytes += (uint64_t)rl;
        n++;
    }
    sqlite3_reset(sp->sel);
    if (rc != SQLITE_DONE) {
        free(offs);
        rt_buf_free(&b);
        return spill_failed(sp, "read", why, whylen);
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].doc = (const uint8_t *)b.data + offs[2 * i];
        rows[i].opts = rows[i].opts_len ? (const uint8_t *)b.data + offs[2 * i + 1] : NULL;
    }
    free(offs);
    *buf = (uint8_t *)b.data;
    return (int)n;
}

int rt_spill_pop(rt_spill_t *sp, int64_t last, uint64_t n, uint64_t bytes, char *why, size_t whylen)
{
    /* Written rows are gone from the queue at once (peek starts after done), whether or
       not the delete below works; one that fails is retried by the next pop. */
    sp->done = last;
    sp->rows -= n;
    sp->bytes -= bytes;
    sqlite3_bind_int64(sp->del, 1, last);
    int rc = sqlite3_step(sp->del);
    sqlite3_reset(sp->del);
    if (rc != SQLITE_DONE)
        return spill_failed(sp, "delete", why, whylen);
    /* Empty now: the next append takes seq 1 again (rowids restart in an empty table),
       and the file gives its pages back, so a long outage leaves no big file behind. */
    if (sp->rows == 0) {
        sp->done = 0;
        sqlite3_exec(sp->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    }
    return 0;
}

void rt_spill_close(rt_spill_t *sp)
{
    sqlite3_finalize(sp->ins);
    sqlite3_finalize(sp->sel);
    sqlite3_finalize(sp->del);
    if (sp->db)
        sqlite3_close(sp->db);
    sp->ins = sp->sel = sp->del = NULL;
    sp->db = NULL;
}

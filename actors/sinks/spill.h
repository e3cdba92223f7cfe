/*
** The spill queue (sink_spill.c): rows in order in an SQLite file, (seq, row, opts), for
** whatever must outlive memory while its destination is away: the sinks (sink.c) and the
** bridges (actors/bridge). Appends go at the end and are durable on return (see
** rt_spill_open); peek reads the oldest not yet popped; pop forgets them.
*/
#ifndef RT_SPILL_H
#define RT_SPILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/*
** One row of a sink's batch (a BSON document and the per-rule options it came with) or of a
** spill (any bytes and their options: a bridge keeps a message and its topic).
*/
typedef struct sink_row_s {
    const uint8_t *doc;
    uint32_t len;
    uint32_t opts_len; /* 0: no options */
    const uint8_t *opts;
    int32_t status;             /* set by the driver: 0 written, < 0 rejected for good (with why) */
    struct sink_entry_s *entry; /* the submission it belongs to; NULL if read from the spill */
} sink_row_t;

typedef struct rt_spill_s {
    struct sqlite3 *db;
    struct sqlite3_stmt *ins, *sel, *del;
    uint64_t rows;  /* rows waiting in the file */
    uint64_t bytes; /* their row bytes */
    int64_t done;   /* rows up to this seq are written (deleted, or to be: see pop) */
    char path[512];
} rt_spill_t;

/*
** Opens (creating) path and counts what it holds. each_durable: every append is on disk
** when it returns (synchronous=FULL, an fsync each); else it survives a crash of rtd but not
** of the machine (NORMAL: no fsync, for an owner on a scheduler). 0, or RT_EINVAL if the file
** is not a spill (not a database, damaged, another schema), or RT_EAGAIN; why is set.
*/
int rt_spill_open(rt_spill_t *sp, const char *path, bool each_durable, char *why, size_t whylen);
/* Appends n rows in one durable transaction; 0 or RT_E* (nothing appended). */
int rt_spill_append(rt_spill_t *sp, const sink_row_t *rows, size_t n, char *why, size_t whylen);
/*
** Reads up to max of the oldest rows after seq after (sp->done: the oldest not popped) into
** rows[] (their bytes in *buf, malloc'd, the caller frees) and the seq of the last one into
** *last. Returns the count or RT_E*.
*/
int rt_spill_peek(rt_spill_t *sp, int64_t after, sink_row_t *rows, size_t max, uint8_t **buf,
                  int64_t *last, uint64_t *bytes, char *why, size_t whylen);
/*
** Marks every row up to seq last (n rows of bytes) written: peek skips them from now
** on, and they are deleted; if the delete fails (an error is returned) the next pop
** deletes them too, and a restart before that would replay them (at least once).
*/
int rt_spill_pop(rt_spill_t *sp, int64_t last, uint64_t n, uint64_t bytes, char *why,
                 size_t whylen);
void rt_spill_close(rt_spill_t *sp);

#endif

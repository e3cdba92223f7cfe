/*
** Sinks: where rule rows go. Each configured sink (the `sinks` table of
** rtd.conf) is one actor: SQLite and MongoDB sinks run on the blocking pool
** (RT_TYPE_BLOCKING), the republish sink on a scheduler. A sink batches rows by
** count and time, writes them with the real driver, retries with exponential
** backoff, and keeps a bounded in-memory queue that spills, in order, to an
** on-disk queue (an SQLite file per sink in data_dir) while its database is down
** or failing; the spill is replayed in order when the database comes back, and
** at start if a previous run left one. A row is dropped only when the sink's byte
** limit (max_bytes: memory + spill) is reached at submission, or when the database
** refuses that row itself for good (a constraint, a name it cannot take: retrying
** would hold up every row behind it); dropped rows are counted and logged.
** See docs/SINKS.md for the config keys and the spill format.
**
** Metrics invariant, at any quiescent moment:
**   rows in = written + queued + inflight + spilled (still on disk) + dropped.
*/
#ifndef RT_SINK_H
#define RT_SINK_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "rt.h"

typedef struct rt_sink_s rt_sink_t; /* lives until rt_sinks_stop */

/* The message a sink sends to ack_pid: data is rt_sink_committed_t. */
#define RT_SINK_MSG_COMMITTED (RT_MSG_USER + 0x5100)

typedef struct rt_sink_committed_s {
    uint64_t token; /* the ack_token given to rt_sink_submit */
    int32_t status; /* 0: committed; < 0 (RT_E*): definitively dropped */
} rt_sink_committed_t;

/*
** Validates every sink in conf (errors name the config file, line and reason:
** "etc/rtd.conf:42: sinks.archive: unknown key tabel") and starts one actor per
** enabled sink, each a permanent child of the group supervisor "sinks_sup" (group.h),
** itself a child of sup (0: of nobody). A sink's actor that dies is started again
** and replays its spill, where the one before left what it held. Call after
** rt_init, from outside any actor, before anything submits. Returns 0 or an RT_E*
** code with err set; on error no sink is left running.
*/
int rt_sinks_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen);
/* Adds the sinks' keys (common and each driver's) to the settings schema (config.h). */
void rt_sinks_schema(void);
/*
** What rt_sinks_start checks, alone (`rtd --check`): every sink's keys and its driver's
** settings, with the same errors; nothing is opened, connected or started. Not while
** the sinks run (RT_EEXIST).
*/
int rt_sinks_check(const rt_conf_t *conf, char *err, size_t errlen);
/* Whether conf has a sink named name that is enabled (rt_sink_find's answer once started). */
bool rt_sinks_enabled(const rt_conf_t *conf, const char *name);
/*
** Stops every sink: each writes what it holds in memory if its database is up;
** rows it cannot write stay in (or go to) its spill file for the next start. Later
** submissions are refused with RT_ESHUTDOWN (counted as dropped); rt_sink_find
** returns NULL. The rt_sink_t records stay valid until rt_sinks_free. Call before
** rt_shutdown, from outside any actor.
*/
void rt_sinks_stop(void);
/* The sink named name, or NULL if there is none (or it is disabled). Any thread. */
rt_sink_t *rt_sink_find(const char *name);

/*
** Hands nrows rows to the sink: `rows` is a binary holding nrows BSON documents
** back to back (reference transferred, also on error). opts: NULL or one BSON
** document of per-rule options for this sink (reference transferred), e.g.
** {table: "x"} for sqlite, {collection: "y"} for mongodb, {topic: "...",
** payload: "...", qos: 1, retain: false} for republish. If ack_pid != 0 the sink
** sends ack_pid one RT_SINK_MSG_COMMITTED message once all these rows are
** durable (status 0): committed to the database, or to the sink's spill file
** (fsynced, replayed at the next start) while the database is down, whichever
** comes first; a republish row counts once published. Status < 0: at least one
** row was dropped for good (the first such code), except RT_ENOPROC: the sink's
** actor died before it took these rows (they are not counted): submit them again.
** Returns 0; RT_ELIMIT if the sink's byte limit is reached; RT_EINVAL if rows is
** not nrows well-formed BSON documents; RT_ESHUTDOWN after rt_sinks_stop. On an
** error the rows are dropped, counted (in and dropped) and logged, and the ack, if
** asked for, still comes, with that code. RT_ENOPROC alone is different: the sink's
** actor is being restarted, nothing was taken or counted and no ack comes; a caller
** that keeps a reference of its own to rows and opts submits them again. Safe from
** any thread.
*/
int rt_sink_submit(rt_sink_t *s, rt_bin_t *rows, uint32_t nrows, rt_bin_t *opts, rt_pid_t ack_pid,
                   uint64_t ack_token);

/* After rt_shutdown: frees what rt_sinks_start made (rt_sink_t pointers die here). */
void rt_sinks_free(void);

/*
** What the sink of config section sec (one of conf->sinks) keeps, as one sentence for
** people (rtd --check, rtctl sinks show): "rows deleted 7d after they were written or while
** the database's pages in use pass 1GiB", "no retention: every row is kept (...)",
** "disabled (...)". Checks the section as rt_sinks_start does, and starts nothing: 0, or
** RT_EINVAL with the reason in out. Any thread, runtime or not.
*/
int rt_sink_describe(const rt_conf_t *conf, const rt_conf_section_t *sec, char *out, size_t n);

/* A running sink's local files (for backups). */
typedef struct rt_sink_files_s {
    char name[64];
    char db[512];    /* its SQLite database (sqlite sinks), else "" */
    char spill[512]; /* its spill file (database sinks), else ""; it may not exist */
} rt_sink_files_t;

/* Copies up to max running sinks' files into out; returns how many sinks there are. */
size_t rt_sinks_files(rt_sink_files_t *out, size_t max);

/* Metrics snapshot for rtctl and tests. */
typedef struct rt_sink_info_s {
    char name[64];
    const char *type;  /* "sqlite", "mongodb", "republish", "http" */
    const char *state; /* "connected", "connecting", "disconnected" */
    uint64_t queued;   /* rows in memory waiting for a batch */
    uint64_t inflight; /* rows in the batch being written */
    uint64_t written;  /* rows committed to the database (or published) */
    uint64_t failed;   /* failed write attempts (batches) */
    uint64_t retried;  /* rows written after waiting in the spill (replayed) */
    uint64_t spilled;  /* rows on disk in the spill queue now */
    uint64_t dropped;  /* rows refused (byte limit, malformed) */
    uint64_t batches;  /* successful write transactions / bulk operations */
    char last_error[256];
    uint64_t in;        /* rows accepted (or refused: those count as dropped), plus recovered */
    uint64_t recovered; /* rows found in a spill file left by an earlier run */
    uint64_t bytes;     /* row bytes in memory, inflight and spill (max_bytes bounds it) */
    rt_hist_snap_t write_seconds; /* each batch write's duration (a failed one too) */
    uint64_t expired;             /* rows written, later deleted by the sink's retention */
    char retention[192];          /* what it keeps (rt_sink_describe's sentence); "" if n/a */
} rt_sink_info_t;

/* Copies up to max sinks' metrics into out; returns how many sinks there are. */
size_t rt_sinks_snapshot(rt_sink_info_t *out, size_t max);

/*
** The xmpp sink's way to the XMPP server, which sits above the sinks (actors/c2s): it sets
** this at its start. A message from `from` (a JID; for a room, nick is the occupant name it
** comes from) of type `type` with the body, to `to`: a user (its available sessions, else
** offline storage) or a room (a groupchat to its occupants). 0, or RT_ENOTFOUND (no such
** room, a domain not served), RT_EINVAL (a JID that does not prepare), RT_ENOMEM, RT_ENOPROC.
*/
typedef int (*rt_sink_xmpp_fn)(const char *to, const char *from, const char *nick, const char *type,
                               const char *body, size_t len);
void rt_sinks_set_xmpp(rt_sink_xmpp_fn fn);

#endif

/*
** Inside the sinks: the sink record shared by the submitting threads and the
** sink's actor (sink.c), the driver interface each sink type implements
** (sink_sqlite.c, sink_mongo.c, sink_republish.c, sink_http.c), the on-disk spill queue
** (sink_spill.c), what drivers read out of rows (sink_rows.c) and the config
** lookups they share with the set of sinks (sink_set.c). Only sink*.c include
** this.
*/
#ifndef RT_SINK_IMPL_H
#define RT_SINK_IMPL_H

#include <bson/bson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "sink.h"
#include "spill.h"

/* Tunables (every one can be set per sink in the config; these are the defaults). */
#define RT_SINK_BATCH_DEFAULT 500                /* rows per write transaction */
#define RT_SINK_FLUSH_MS_DEFAULT 50              /* ms before a partial batch is written */
#define RT_SINK_QUEUE_BYTES_DEFAULT (8u << 20)   /* bytes of rows kept in memory */
#define RT_SINK_MAX_BYTES_DEFAULT (256ull << 20) /* bytes in memory + spill, then drop */
#define RT_SINK_BACKOFF_MS_DEFAULT 100           /* first retry delay after a failure */
#define RT_SINK_BACKOFF_MAX_MS_DEFAULT 3000      /* retry delay cap (doubling) */
#define RT_SINK_STOP_WAIT_MS 10000               /* rt_sinks_stop waits this long per sink */
#define RT_SINK_STOP_FLUSH_MS 2000               /* a stopping sink writes for this long */
#define RT_SINK_EXPIRE_CHECK_MS 1000             /* a sink with retention looks this often */

typedef struct sink_driver_s sink_driver_t;

/* What a sink keeps, for the start log: 0 is no limit. */
typedef struct {
    uint64_t max_rows, max_age_s, max_bytes;
} rt_sink_keeps_t;

/*
** A driver's config keys are settings of the schema (config.h), named
** "sinks.<name>(TYPE).KEY"; an RT_SET_PREFIX key "sinks.<name>(sqlite).columns.<column>"
** takes any key that starts with "columns.".
*/
#define RT_SINK_KEY_SCOPE "sinks.<name>"

struct sink_driver_s {
    const char *type;
    bool blocking;            /* runs on the blocking pool (database drivers) */
    bool spills;              /* has a spill queue (database drivers) */
    const rt_setting_t *keys; /* NULL-terminated; the common keys are always accepted, and a
                                 driver's key of the same name (its own default) wins */
    /* Reads the sink's config (already checked against keys); no I/O. why: the reason. */
    int (*configure)(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen);
    /*
    ** Optional: rewrites a submission's rows as they enter the sink's memory queue
    ** (reference transferred; returns the binary to keep, the same one if unchanged).
    */
    rt_bin_t *(*admit)(rt_sink_t *s, rt_bin_t *rows, uint32_t nrows);
    /* Connects (or reconnects); 0 or an RT_E* code with s's last error set. */
    int (*open)(rt_sink_t *s);
    /*
    ** Writes n rows in order as one unit. Returns 0 when every row is either committed
    ** (status 0) or rejected for good (status < 0, with sink_error set: bad data that no
    ** retry can fix); returns < 0 if nothing can be said to be committed (transient: the
    ** whole batch is retried later, so drivers keep retries idempotent where they can).
    */
    int (*write)(rt_sink_t *s, sink_row_t *rows, size_t n);
    /*
    ** Optional, for a sink with retention (s->retains): deletes one part of what the sink
    ** no longer keeps, in a transaction of its own, between writes. *rows: how many rows
    ** went; *more: call again soon (it did something: there may be more). 0, or an RT_E*
    ** code with s's last error set (the next check tries again).
    */
    int (*expire)(rt_sink_t *s, uint64_t *rows, bool *more);
    /* Optional: the local database file the sink writes (rt_sinks_files). */
    const char *(*file)(const rt_sink_t *s);
    /* Optional: what the sink keeps, as a sentence (rt_sink_describe; text NULL: none) and
       as limits for the start log (0: no limit). */
    void (*retention)(const rt_sink_t *s, char *text, size_t textlen, rt_sink_keeps_t *keeps);
    void (*close)(rt_sink_t *s); /* disconnects; open may be called again */
    void (*free)(rt_sink_t *s);  /* frees what configure made */
    /*
    ** Bytes the driver holds itself (what configure made, its caches and scratch; not what
    ** SQLite or libbson hold, which sink.c measures): charged to the sink's actor.
    */
    size_t (*held)(const rt_sink_t *s);
};

/* sink_template.c: whether every ${ in t (len bytes) is closed by a }; t rendered for doc,
   appended to out (check out->oom after). */
bool rt__sink_template_ok(const char *t, size_t len);
void rt__sink_render(rt_buf_t *out, const char *t, size_t tlen, const bson_t *doc);

extern const sink_driver_t rt_sink_sqlite_driver;
extern const sink_driver_t rt_sink_mongo_driver;
extern const sink_driver_t rt_sink_republish_driver;
extern const sink_driver_t rt_sink_http_driver;
extern const sink_driver_t rt_sink_xmpp_driver;

/* ---- The sink record ---- */
typedef enum { SINK_CONNECTED = 0, SINK_CONNECTING, SINK_DISCONNECTED } sink_state_t;

/* One rt_sink_submit call waiting in memory (an object of the sink actor's heap). */
typedef struct sink_entry_s {
    struct sink_entry_s *next;
    rt_bin_t *rows; /* kept alive by rows_h */
    rt_bin_t *opts; /* kept alive by opts_h; NULL: none */
    void *rows_h;   /* heap handles owning one reference each (rt_hold_bin) */
    void *opts_h;
    uint32_t nrows;
    uint32_t taken;   /* rows already moved to a batch or the spill */
    uint32_t off;     /* byte offset of the first row not taken */
    uint32_t pending; /* rows not yet durable (database or spill): ack when 0 */
    int32_t status;   /* first failure among its rows, or 0 */
    rt_pid_t ack_pid;
    uint64_t ack_token;
} sink_entry_t;

struct rt_sink_s {
    char name[64];
    const sink_driver_t *drv;
    void *drv_state; /* the driver's (configure makes it) */

    /* Settings. */
    uint32_t batch;
    uint32_t flush_ms;
    uint64_t queue_bytes;
    uint64_t max_bytes;
    uint32_t backoff_ms, backoff_max_ms;
    char spill_path[512];
    char regname[80]; /* "sink:<name>", its actor's registered name */
    bool retains;     /* the driver deletes what its retention settings no longer keep */

    _Atomic rt_pid_t pid; /* its actor's current incarnation (set by each start) */

    /* Touched by submitting threads and read by rt_sinks_snapshot: atomics. */
    _Alignas(RT_CACHE_LINE) atomic_uint_fast64_t in;
    atomic_uint_fast64_t queued, inflight, written, failed, retried, spilled, dropped, batches;
    atomic_uint_fast64_t recovered; /* rows found in the spill at start (part of in) */
    atomic_uint_fast64_t expired;   /* rows written, then deleted by the sink's retention */
    atomic_uint_fast64_t bytes;     /* row bytes accepted and not yet written or dropped */
    atomic_int state;               /* sink_state_t */
    atomic_int submitting;          /* rt_sink_submit calls between their check and send */
    atomic_bool closing;            /* rt_sinks_stop has begun: submissions are refused */
    pthread_mutex_t err_lock;
    char last_error[256];
    rt_hist_t write_hist; /* each write call's duration, failed ones too */

    /* Owned by the sink's actor alone. */
    _Alignas(RT_CACHE_LINE) sink_entry_t *head, *tail; /* in-memory queue, oldest first */
    uint64_t mem_rows, mem_bytes;                      /* rows in the queue not yet taken */
    rt_spill_t spill;
    bool spill_open;
    bool flush_timer, retry_timer; /* a timer of that kind is pending */
    bool drain_sent;               /* a drain message is in the mailbox */
    bool opened;                   /* the driver is connected */
    uint32_t backoff;              /* current retry delay, ms */
    bool after_failure;            /* the next write is a retry */
    bool expire_due;               /* a deletion step is to run between writes */
    sink_row_t *batch_rows;        /* batch buffer: batch entries */
    uint32_t starts;               /* incarnations of its actor so far */
};

/* Records why the last operation failed (any thread; shown by rtctl). */
void rt__sink_error(rt_sink_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "connected", "connecting" or "disconnected" for a sink_state_t. */
const char *rt__sink_state_name(int state);

/* ---- The sink actor (sink.c), for the set of sinks (sink_set.c) ---- */
/*
** Starts s's actor as a permanent child of the supervisor group, registered as
** "sink:<name>": 0 or its start error. A restarted actor replays s's spill, where the
** last one left what it held.
*/
int rt__sink_start(rt_pid_t group, rt_sink_t *s);
/*
** Refuses submissions to s from now on; returns once none is under way, so that a stop
** of its actor (exit shutdown: handled after what is in its mailbox) comes last.
*/
void rt__sink_close(rt_sink_t *s);

/* A per-row option or config string: the UTF-8 value of key in opts (NULL if absent). */
const char *rt__sink_opt_str(const sink_row_t *r, const char *key, uint32_t *len);
/*
** The text form of the BSON value at it: strings as they are; numbers, booleans and
** dates in decimal; object ids in hex; documents, arrays and anything else as JSON.
** Returns a pointer into the document, into num (64 bytes), or into *tmp (allocated
** with bson_malloc: the caller bson_free()s it; NULL when unused). Null is "".
*/
const char *rt__sink_text(const bson_iter_t *it, uint32_t *len, char **tmp, char *num);
/* The length of the BSON document at p (its little-endian int32 prefix). */
static inline uint32_t rt__sink_doc_len(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Config lookups in a checked section. */
const rt_conf_kv_t *rt__sink_kv(const rt_conf_section_t *sec, const char *key);

/* ---- The SQLite sink's retention (sink_retention.c) ---- */
#define RT_SQ_PART_LEN 160 /* bytes in a partition's name: the table's (< 128), "_p", a number */

typedef struct sq_retention_s {
    /* Settings (retention = { max_rows, max_age, max_bytes, zero_deleted }); 0: no limit. */
    uint64_t max_rows;   /* rows kept per table */
    uint64_t max_age_ms; /* how long a row is kept after it was written */
    uint64_t max_bytes;  /* bytes of the database's pages in use */
    bool zero_deleted;   /* SQLite's secure_delete: dropped pages are zeroed */
    uint64_t roll_ms;    /* a partition is closed once it is this old (max_age's share) */
    /* The open connection's (rt__retention_open to rt__retention_close). */
    bool registry;              /* the database has one (its statements are prepared) */
    struct sqlite3_stmt *st[8]; /* statements on the registry */
    uint64_t page_size;
    uint64_t gen;    /* steps that changed a table's partitions: the writer reads them again */
    char after[128]; /* the table the last step looked at: the next starts after it */
} sq_retention_t;

/* Where a table's rows go, as the connection that writes it knows it. */
typedef struct sq_part_s {
    int64_t part;              /* the newest partition; 0: the table itself, not partitioned */
    char name[RT_SQ_PART_LEN]; /* the table rows are inserted into */
    uint64_t first_ms;         /* when the newest partition was begun */
    int64_t rows;              /* in it */
    int64_t rows_closed;       /* in the table's other partitions */
    int64_t roll_at;           /* rows at which it is closed (set per batch) */
    unsigned nparts;
} sq_part_t;

void rt__retention_configure(sq_retention_t *r, const rt_conf_section_t *sec);
bool rt__retention_on(const sq_retention_t *r);
/* A sentence for people (rtd --check) and the limits for the start log. */
void rt__retention_text(const sq_retention_t *r, char *out, size_t n);
void rt__retention_keeps(const sq_retention_t *r, rt_sink_keeps_t *out);
/* On a new connection: reads (or, retention on, makes) the registry; 0 or RT_EAGAIN with why. */
int rt__retention_open(sq_retention_t *r, struct sqlite3 *db, char *why, size_t n);
void rt__retention_close(sq_retention_t *r);
/* Whether a rule may not write to table (the registry's own name). */
bool rt__retention_reserved(const char *table, size_t len);
/*
** In a batch's transaction, for a table the connection has not written yet: where its rows
** go. A plain table becomes the first partition when retention is on; *create: p->name
** does not exist, and the caller makes it and then calls rt__retention_made. SQLite's code;
** SQLITE_MISMATCH: table is a view or an index rtd did not make.
*/
int rt__retention_resolve(sq_retention_t *r, struct sqlite3 *db, const char *table, uint64_t now_ms,
                          sq_part_t *p, bool *create);
int rt__retention_made(sq_retention_t *r, struct sqlite3 *db, const char *table, const sq_part_t *p,
                       uint64_t now_ms);
/* ALTER TABLE table <change> on the table, or on each of its partitions. SQLite's code. */
int rt__retention_alter(sq_retention_t *r, struct sqlite3 *db, const char *table,
                        const sq_part_t *p, const char *change);
/* Before a batch's first row of table, and before each row: the partition is closed and
   the next begun when it is due (*rolled). SQLite's code. */
int rt__retention_batch(sq_retention_t *r, struct sqlite3 *db, const char *table, uint64_t now_ms,
                        sq_part_t *p, bool *rolled);
int rt__retention_row(sq_retention_t *r, struct sqlite3 *db, const char *table, uint64_t now_ms,
                      sq_part_t *p, bool *rolled);
/* One step (the driver's expire): see the driver hook. */
int rt__retention_step(rt_sink_t *s, sq_retention_t *r, struct sqlite3 *db, uint64_t now_ms,
                       uint64_t *rows, bool *more);

#endif

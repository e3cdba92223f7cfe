/*
** The sink actor, shared by every sink type: accepts rows (rt_sink_submit, any
** thread), queues them in memory, cuts batches by count (batch) and time
** (flush_ms), hands each batch to its driver, and on a transient failure
** retries with exponential backoff while the rows wait, in order, in the spill
** file. Order is kept by one rule: every row in the spill is older than every
** row in memory, so the writer drains the spill before memory, and memory only
** ever moves to the spill's tail.
**
** Durable acks: a submission's ack goes out when its last row is durable, either
** committed to the database or committed to the spill file (synchronous=FULL),
** whichever comes first. The spill is replayed at the next start, so a row there
** survives a crash of rtd as surely as one in the database; acking only at the
** database would turn a database outage into a publisher outage (PUBACKs stall,
** inflight windows fill) while the spill exists precisely to ride one out.
*/
#include <bson/bson.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bson_mem.h"
#include "log.h"
#include "sink_impl.h"
#include "sqlite_mem.h"

enum {
    MSG_ROWS = RT_SINK_MSG_COMMITTED + 1, /* data: submit_t, bin: the rows */
    MSG_FLUSH,                            /* flush_ms timer: write a partial batch */
    MSG_RETRY,                            /* backoff timer: try the database again */
    MSG_DRAIN,                            /* more batches are ready: write the next */
    MSG_EXPIRE,                           /* retention's tick: look for rows to delete */
};

typedef struct submit_s {
    uint32_t nrows;
    rt_bin_t *opts;
    rt_pid_t ack_pid;
    uint64_t ack_token;
} submit_t;

/*
** The queue, the spill and the batch buffer are the sink actor's alone (sink_impl.h):
** debug builds check that whatever touches them runs in its turn.
*/
#define SINK_IN_ACTOR(s) (rt_current() && rt_self(rt_current()) == atomic_load(&(s)->pid))

static const char *const state_names[] = {"connected", "connecting", "disconnected"};

void rt__sink_error(rt_sink_t *s, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&s->err_lock);
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof(s->last_error), fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&s->err_lock);
}

const char *rt__sink_state_name(int state)
{
    return state_names[state];
}

static void set_state(rt_sink_t *s, sink_state_t st)
{
    int old = atomic_exchange(&s->state, (int)st);
    if (old != (int)st)
        rt_log(st == SINK_DISCONNECTED ? RT_LOG_WARNING : RT_LOG_INFO, "sink.state",
               "sink=%s state=%s", s->name, state_names[st]);
}

/* ---- Acks and the in-memory queue ---- */

static void send_ack(rt_pid_t to, uint64_t token, int32_t status)
{
    if (!to)
        return;
    rt_sink_committed_t c = {.token = token, .status = status};
    rt_send(to, RT_SINK_MSG_COMMITTED, &c, sizeof(c));
}

/* One row of entry e reached its final place (status 0: durable; < 0: dropped). */
static void settle_row(rt_sink_t *s, sink_entry_t *e, int32_t status)
{
    if (status < 0 && e->status == 0)
        e->status = status;
    RT_ASSERT(e->pending > 0);
    e->pending--;
}

/* Frees the entries at the head whose rows have all settled, acking each. */
static void pop_settled(rt_sink_t *s)
{
    while (s->head && s->head->pending == 0) {
        sink_entry_t *e = s->head;
        s->head = e->next;
        if (!s->head)
            s->tail = NULL;
        send_ack(e->ack_pid, e->ack_token, e->status);
        /* Unreachable now: the next collection frees it and releases its binaries. */
    }
}

/*
** Takes up to max of the oldest untaken rows of the memory queue into rows[].
** They stay counted in mem_* until the caller commits to where they went.
*/
static size_t take_rows(rt_sink_t *s, sink_row_t *rows, size_t max)
{
    RT_ASSERT(SINK_IN_ACTOR(s) && max <= s->batch);
    size_t n = 0;
    for (sink_entry_t *e = s->head; e && n < max; e = e->next) {
        uint32_t taken = e->taken, off = e->off;
        const uint8_t *data = rt_bin_data(e->rows);
        const uint8_t *opts = e->opts ? rt_bin_data(e->opts) : NULL;
        uint32_t opts_len = e->opts ? (uint32_t)rt_bin_len(e->opts) : 0;
        while (taken < e->nrows && n < max) {
            uint32_t len = rt__sink_doc_len(data + off);
            rows[n++] = (sink_row_t){
                .doc = data + off, .len = len, .opts = opts, .opts_len = opts_len, .entry = e};
            off += len;
            taken++;
        }
    }
    return n;
}

/* Marks rows[0..n) (just taken by take_rows) as gone from the memory queue. */
static void consume_rows(rt_sink_t *s, const sink_row_t *rows, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        rows[i].entry->taken++;
        rows[i].entry->off += rows[i].len;
        bytes += rows[i].len;
    }
    s->mem_rows -= n;
    s->mem_bytes -= bytes;
}

static bool ensure_spill(rt_sink_t *s)
{
    if (s->spill_open)
        return true;
    char why[256];
    int rc = rt_spill_open(&s->spill, s->spill_path, true, why, sizeof(why));
    if (rc == RT_EINVAL) {
        /* A file that is not a spill cannot be replayed; it is set aside, not deleted (it
           may be worth a look), and a fresh spill takes its place. */
        char aside[sizeof(s->spill_path) + 32];
        snprintf(aside, sizeof(aside), "%s.bad-%lld", s->spill_path,
                 (long long)(rt_wall_ms() / 1000));
        if (rename(s->spill_path, aside) == 0) {
            rt_log(RT_LOG_ERROR, "sink.spill_set_aside", "sink=%s moved=%s reason=%s", s->name,
                   aside, why);
            rc = rt_spill_open(&s->spill, s->spill_path, true, why, sizeof(why));
        }
    }
    if (rc != 0) {
        rt__sink_error(s, "spill: %s", why);
        rt_log(RT_LOG_ERROR, "sink.spill_failed", "sink=%s error=%s", s->name, why);
        return false;
    }
    s->spill_open = true;
    return true;
}

/*
** Moves the oldest memory rows to the spill's tail until at most keep_bytes stay
** in memory. Rows that reach the spill are durable: their entries may be acked.
** If the spill fails the rows stay in memory (the byte limit still bounds them).
*/
static void spill_memory(rt_sink_t *s, uint64_t keep_bytes)
{
    RT_ASSERT(SINK_IN_ACTOR(s));
    if (!s->drv->spills || s->mem_bytes <= keep_bytes || !ensure_spill(s))
        return;
    while (s->mem_rows > 0 && s->mem_bytes > keep_bytes) {
        size_t n = take_rows(s, s->batch_rows, s->batch), k = 0;
        /* Only the oldest rows that bring memory down to keep_bytes go. */
        for (uint64_t left = s->mem_bytes; k < n && left > keep_bytes; k++)
            left -= s->batch_rows[k].len;
        n = k;
        char why[256];
        if (rt_spill_append(&s->spill, s->batch_rows, n, why, sizeof(why)) != 0) {
            rt__sink_error(s, "spill: %s", why);
            rt_log(RT_LOG_ERROR, "sink.spill_failed", "sink=%s rows=%zu error=%s", s->name, n, why);
            return;
        }
        consume_rows(s, s->batch_rows, n);
        for (size_t i = 0; i < n; i++)
            settle_row(s, s->batch_rows[i].entry, 0);
        atomic_fetch_sub(&s->queued, n);
        atomic_fetch_add(&s->spilled, n);
        pop_settled(s);
    }
}

/* ---- Writing ---- */

static void schedule_retry(rt_sink_t *s)
{
    if (s->retry_timer)
        return;
    s->retry_timer = true;
    rt_send_after_tag(s->backoff, atomic_load(&s->pid), MSG_RETRY, NULL);
    s->backoff = s->backoff * 2 > s->backoff_max_ms ? s->backoff_max_ms : s->backoff * 2;
}

static void ensure_flush_timer(rt_sink_t *s)
{
    if (s->mem_rows == 0 || s->flush_timer)
        return;
    s->flush_timer = true;
    rt_send_after_tag(s->flush_ms, atomic_load(&s->pid), MSG_FLUSH, NULL);
}

/* Opens the driver if needed and writes the batch; < 0 on a transient failure. */
static int write_batch(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    if (!s->opened) {
        if (s->drv->open) {
            set_state(s, SINK_CONNECTING);
            if (s->drv->open(s) != 0)
                return RT_EAGAIN;
        }
        s->opened = true;
    }
    for (size_t i = 0; i < n; i++)
        rows[i].status = 0;
    uint64_t t0 = rt_mono_ns();
    int rc = s->drv->write(s, rows, n);
    rt_hist_record(&s->write_hist, rt_mono_ns() - t0);
    if (rc < 0) {
        if (s->drv->close)
            s->drv->close(s);
        s->opened = false;
    }
    return rc;
}

/* After a driver returned 0: counts each row written or dropped, for good. */
static void count_outcome(rt_sink_t *s, const sink_row_t *rows, size_t n, bool replay)
{
    uint64_t ok = 0, bad = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += rows[i].len;
        if (rows[i].status == 0) {
            ok++;
        } else {
            if (bad++ == 0) {
                pthread_mutex_lock(&s->err_lock);
                rt_log(RT_LOG_ERROR, "sink.row_rejected", "sink=%s error=%s", s->name,
                       s->last_error);
                pthread_mutex_unlock(&s->err_lock);
            }
        }
        if (rows[i].entry)
            settle_row(s, rows[i].entry, rows[i].status);
    }
    atomic_fetch_sub(&s->inflight, n);
    atomic_fetch_add(&s->written, ok);
    atomic_fetch_add(&s->dropped, bad);
    atomic_fetch_add(&s->batches, 1);
    if (replay)
        atomic_fetch_add(&s->retried, ok);
    atomic_fetch_sub(&s->bytes, bytes);
    set_state(s, SINK_CONNECTED);
    s->backoff = s->backoff_ms;
    pop_settled(s);
}

static void on_failure(rt_sink_t *s, size_t n)
{
    atomic_fetch_add(&s->failed, 1);
    set_state(s, SINK_DISCONNECTED);
    pthread_mutex_lock(&s->err_lock);
    rt_log(RT_LOG_WARNING, n ? "sink.write_failed" : "sink.connect_failed",
           "sink=%s rows=%zu retry_in_ms=%u error=%s", s->name, n, s->backoff, s->last_error);
    pthread_mutex_unlock(&s->err_lock);
    schedule_retry(s);
}

/* Writes the oldest batch of the spill. Returns true if it was written. */
static bool write_from_spill(rt_sink_t *s)
{
    RT_ASSERT(SINK_IN_ACTOR(s) && s->spill_open);
    uint8_t *buf = NULL;
    int64_t last = 0;
    uint64_t bytes = 0;
    char why[256];
    int n =
        rt_spill_peek(&s->spill, 0, s->batch_rows, s->batch, &buf, &last, &bytes, why, sizeof(why));
    if (n < 0) {
        rt__sink_error(s, "spill: %s", why);
        free(buf);
        on_failure(s, 0);
        return false;
    }
    atomic_fetch_sub(&s->spilled, (uint64_t)n);
    atomic_fetch_add(&s->inflight, (uint64_t)n);
    if (write_batch(s, s->batch_rows, (size_t)n) < 0) {
        atomic_fetch_sub(&s->inflight, (uint64_t)n);
        atomic_fetch_add(&s->spilled, (uint64_t)n);
        free(buf);
        on_failure(s, (size_t)n);
        return false;
    }
    /* The rows are in the database now; if they cannot be removed from the spill they
       would be written twice after a restart, so say so loudly. */
    if (rt_spill_pop(&s->spill, last, (uint64_t)n, bytes, why, sizeof(why)) != 0)
        rt_log(RT_LOG_ERROR, "sink.spill_failed",
               "sink=%s rows=%d error=%s written but not removed from the spill (duplicates on "
               "replay)",
               s->name, n, why);
    count_outcome(s, s->batch_rows, (size_t)n, true);
    free(buf);
    return true;
}

/* Writes the oldest batch in memory (up to batch rows). Returns true if it was written. */
static bool write_from_memory(rt_sink_t *s)
{
    size_t n = take_rows(s, s->batch_rows, s->batch);
    if (n == 0)
        return true;
    consume_rows(s, s->batch_rows, n);
    atomic_fetch_sub(&s->queued, n);
    atomic_fetch_add(&s->inflight, n);
    if (write_batch(s, s->batch_rows, n) == 0) {
        count_outcome(s, s->batch_rows, n, false);
        return true;
    }
    /* Put the batch back at the head of memory (it was a prefix of what was untaken),
       then move all of memory behind the spill so the retry finds it in order. */
    for (size_t i = n; i-- > 0;) {
        s->batch_rows[i].entry->taken--;
        s->batch_rows[i].entry->off -= s->batch_rows[i].len;
        s->mem_bytes += s->batch_rows[i].len;
    }
    s->mem_rows += n;
    atomic_fetch_sub(&s->inflight, n);
    atomic_fetch_add(&s->queued, n);
    on_failure(s, n);
    return false;
}

/*
** Connects when there is nothing to write, so the state shows the truth while idle
** (and a database file exists from the start); a failure retries with backoff.
*/
static void try_connect(rt_sink_t *s)
{
    if (s->opened)
        return;
    if (!s->drv->open) { /* nothing to connect to (republish) */
        s->opened = true;
        set_state(s, SINK_CONNECTED);
        return;
    }
    set_state(s, SINK_CONNECTING);
    if (s->drv->open(s) == 0) {
        s->opened = true;
        s->backoff = s->backoff_ms;
        set_state(s, SINK_CONNECTED);
        return;
    }
    on_failure(s, 0);
}

static bool spill_pending(const rt_sink_t *s)
{
    return s->spill_open && s->spill.rows > 0;
}

/*
** Retention: one step (for SQLite, one partition dropped: a bounded share of a limit), in
** a transaction of its own, when one is due and the database is up, so a batch waits for
** at most one step.
*/
static void expire_step(rt_sink_t *s)
{
    if (!s->expire_due || !s->opened || s->retry_timer)
        return;
    uint64_t rows = 0;
    bool more = false;
    if (s->drv->expire(s, &rows, &more) != 0) {
        pthread_mutex_lock(&s->err_lock);
        rt_log(RT_LOG_WARNING, "sink.expire_failed", "sink=%s retry_in_ms=%u %s", s->name,
               RT_SINK_EXPIRE_CHECK_MS, s->last_error);
        pthread_mutex_unlock(&s->err_lock);
    }
    atomic_fetch_add(&s->expired, rows);
    s->expire_due = more;
}

/*
** Does the next piece of work: one batch from the spill if it holds any, else one
** from memory if a full batch is there (or any rows, when forced by the flush
** timer). Asks for another turn (MSG_DRAIN) when more is ready, so submissions
** interleave with a long replay. While waiting out a backoff, memory only spills.
*/
static void pump_sink(rt_sink_t *s, bool force)
{
    RT_ASSERT(SINK_IN_ACTOR(s));
    if (s->retry_timer) {
        if (force || s->mem_rows >= s->batch || s->mem_bytes > s->queue_bytes)
            spill_memory(s, 0);
        ensure_flush_timer(s);
        return;
    }
    bool ok;
    if (spill_pending(s))
        ok = write_from_spill(s);
    else if (s->mem_rows >= s->batch || (force && s->mem_rows > 0))
        ok = write_from_memory(s);
    else
        try_connect(s), ok = true;
    if (!ok)
        spill_memory(s, 0); /* behind the spill, in order, until the retry */
    else
        expire_step(s);
    if (ok && !s->drain_sent && (spill_pending(s) || s->mem_rows >= s->batch || s->expire_due)) {
        s->drain_sent = true;
        rt_send(atomic_load(&s->pid), MSG_DRAIN, NULL, 0);
    }
    /* Memory past its bound goes to the spill even while the database keeps up slowly. */
    if (s->mem_bytes > s->queue_bytes)
        spill_memory(s, s->queue_bytes / 2);
    ensure_flush_timer(s);
}

/* ---- The actor ---- */

/*
** The actor's memory outside its heap is charged to it: what SQLite (the database, the spill)
** and libbson (mongo-c-driver) allocate in its turns, measured around each callback
** (meter.h), and what it holds itself, the batch buffer and the driver's own (settled at
** the end of each callback). The queue is on its heap (on_rows).
*/
typedef struct sink_actor_s {
    rt_sink_t *s;
    rt_meter_t sqlite, bson;
    size_t own; /* charged for the batch buffer and the driver's held() */
} sink_actor_t;

static void mem_begin(sink_actor_t *st)
{
    rt_meter_begin(&st->sqlite, &rt_sqlite_lib);
    rt_meter_begin(&st->bson, &rt_bson_lib);
}

static void mem_end(rt_actor_t *self, sink_actor_t *st)
{
    rt_meter_end(&st->sqlite, &rt_sqlite_lib, self);
    rt_meter_end(&st->bson, &rt_bson_lib, self);
    rt_sink_t *s = st->s;
    size_t own = s->batch * sizeof(sink_row_t) + (s->drv->held ? s->drv->held(s) : 0);
    if (own != st->own)
        rt_charge(self, (ptrdiff_t)own - (ptrdiff_t)st->own);
    st->own = own;
}

/*
** Each start of the actor: the first replays a spill left by an earlier run; a restart
** takes over from the incarnation before, whose terminate left every row it held either
** written or in the spill (its timers died with it), and replays that spill.
*/
static int sink_init(rt_actor_t *self, void *state, void *arg)
{
    sink_actor_t *st = state;
    rt_sink_t *s = arg;
    st->s = s;
    mem_begin(st);
    RT_ASSERT(!s->head && s->mem_rows == 0 && !s->spill_open);
    s->flush_timer = s->retry_timer = s->opened = false;
    s->backoff = s->backoff_ms;
    /* A sink with retention checks at once (the first turn) and then every tick. */
    s->expire_due = s->retains;
    if (s->retains)
        rt_send_after_tag(RT_SINK_EXPIRE_CHECK_MS, rt_self(self), MSG_EXPIRE, NULL);
    /* Exit signals from its supervisor come as messages, after what was sent before. */
    rt_trap_exit(self, true);
    struct stat sb;
    if (s->drv->spills && stat(s->spill_path, &sb) == 0 && ensure_spill(s) && s->spill.rows > 0 &&
        s->starts == 0) {
        /* Those rows were accepted by the earlier run. */
        atomic_fetch_add(&s->in, s->spill.rows);
        atomic_fetch_add(&s->recovered, s->spill.rows);
        atomic_fetch_add(&s->spilled, s->spill.rows);
        atomic_fetch_add(&s->bytes, s->spill.bytes);
        rt_log(RT_LOG_INFO, "sink.recovered", "sink=%s rows=%llu file=%s", s->name,
               (unsigned long long)s->spill.rows, s->spill_path);
    }
    s->starts++;
    /* The first turn connects (and replays what the spill holds). Sent before the pid is
       published, so it comes before anything submitted to this incarnation. */
    s->drain_sent = true;
    rt_send(rt_self(self), MSG_DRAIN, NULL, 0);
    atomic_store(&s->pid, rt_self(self));
    mem_end(self, st);
    return 0;
}

/*
** A submission becomes an entry in the actor's own heap, its binaries held through
** handles there, so rtctl shows the queue as the sink actor's heap and binary bytes;
** sink_trace keeps the queued entries alive.
*/
static void on_rows(rt_actor_t *self, rt_sink_t *s, rt_msg_t *m)
{
    submit_t sub;
    memcpy(&sub, m->data, sizeof(sub));
    rt_bin_t *rows = rt_msg_take_bin(m);
    if (s->drv->admit) {
        size_t before = rt_bin_len(rows);
        rows = s->drv->admit(s, rows, sub.nrows);
        atomic_fetch_add(&s->bytes, rt_bin_len(rows) - before);
    }
    size_t len = rt_bin_len(rows);
    sink_entry_t *e = rt_alloc(self, sizeof(*e), RT_OBJ_LEAF);
    if (e) {
        e->rows = rows;
        e->opts = sub.opts;
        e->rows_h = rt_hold_bin(self, rows); /* releases rows if it fails */
        e->opts_h = sub.opts ? rt_hold_bin(self, sub.opts) : NULL;
        rows = sub.opts = NULL;
        if (!e->rows_h || (e->opts && !e->opts_h))
            e = NULL; /* what was held is the collector's now */
    }
    if (!e) {
        /* Out of memory: the rows cannot be kept; say so like any other drop. */
        atomic_fetch_sub(&s->queued, sub.nrows);
        atomic_fetch_add(&s->dropped, sub.nrows);
        atomic_fetch_sub(&s->bytes, len);
        rt_log(RT_LOG_ERROR, "sink.dropped", "sink=%s rows=%u reason=%s", s->name, sub.nrows,
               "out of memory");
        send_ack(sub.ack_pid, sub.ack_token, RT_ENOMEM);
        rt_bin_release(rows);
        rt_bin_release(sub.opts);
        return;
    }
    e->nrows = e->pending = sub.nrows;
    e->ack_pid = sub.ack_pid;
    e->ack_token = sub.ack_token;
    if (s->tail)
        s->tail->next = e;
    else
        s->head = e;
    s->tail = e;
    s->mem_rows += sub.nrows;
    s->mem_bytes += len;
    pump_sink(s, s->flush_ms == 0);
}

static void sink_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    rt_sink_t *s = ((sink_actor_t *)state)->s;
    mem_begin(state);
    switch (m->tag) {
    case MSG_ROWS:
        on_rows(self, s, m);
        break;
    case MSG_FLUSH:
        s->flush_timer = false;
        pump_sink(s, true);
        break;
    case MSG_RETRY:
        s->retry_timer = false;
        pump_sink(s, true);
        break;
    case MSG_DRAIN:
        s->drain_sent = false;
        pump_sink(s, false);
        break;
    case MSG_EXPIRE:
        s->expire_due = true;
        pump_sink(s, false);
        rt_send_after_tag(RT_SINK_EXPIRE_CHECK_MS, rt_self(self), MSG_EXPIRE, NULL);
        break;
    case RT_MSG_EXIT: {
        /* Its supervisor's stop, or exit/2 from anyone: as an actor that does not trap
           exits would take it, once what came before it is handled. */
        const rt_exit_msg_t *e = (const rt_exit_msg_t *)(const void *)m->data;
        if (e->reason != RT_REASON_NORMAL)
            rt_exit(self, e->reason);
        break;
    }
    default:
        break;
    }
    mem_end(self, state);
}

/*
** Last words, whatever the reason: if the database is up, write what the spill and
** memory hold (in that order, for up to RT_SINK_STOP_FLUSH_MS), spill the rest,
** close. Rows that could not even be spilled are lost: counted as dropped, logged.
*/
static void sink_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    rt_sink_t *s = ((sink_actor_t *)state)->s;
    mem_begin(state);
    if (s->drv->spills) {
        /* In order: the spill first, then memory, for a bounded time. */
        bool up = !s->retry_timer && atomic_load(&s->state) == SINK_CONNECTED;
        uint64_t t0 = rt_mono_ms();
        while (up && (spill_pending(s) || s->mem_rows > 0)) {
            up = spill_pending(s) ? write_from_spill(s) : write_from_memory(s);
            if (rt_mono_ms() - t0 > RT_SINK_STOP_FLUSH_MS)
                break;
        }
        spill_memory(s, 0);
    } else {
        while (s->mem_rows > 0 && write_from_memory(s)) {
        }
    }
    if (s->mem_rows > 0) {
        rt_log(RT_LOG_ERROR, "sink.dropped",
               "sink=%s rows=%llu reason=stopped neither written nor spilled", s->name,
               (unsigned long long)s->mem_rows);
        while (s->mem_rows > 0) {
            size_t n = take_rows(s, s->batch_rows, s->batch);
            consume_rows(s, s->batch_rows, n);
            uint64_t bytes = 0;
            for (size_t i = 0; i < n; i++) {
                bytes += s->batch_rows[i].len;
                settle_row(s, s->batch_rows[i].entry, RT_ESHUTDOWN);
            }
            atomic_fetch_sub(&s->queued, n);
            atomic_fetch_add(&s->dropped, n);
            atomic_fetch_sub(&s->bytes, bytes);
        }
        pop_settled(s);
    }
    if (s->opened && s->drv->close)
        s->drv->close(s);
    s->opened = false;
    if (s->spill_open) {
        bool empty = s->spill.rows == 0;
        rt_spill_close(&s->spill);
        if (empty) /* nothing to replay: leave no file behind */
            unlink(s->spill_path);
    }
    s->spill_open = false;
    atomic_store(&s->state, SINK_DISCONNECTED); /* stopped: not worth a warning */
    sink_actor_t *st = state;
    mem_end(self, st);
    rt_meter_release(&st->sqlite, &rt_sqlite_lib, self);
    rt_meter_release(&st->bson, &rt_bson_lib, self);
}

static const char *sink_tag_name(uint32_t tag)
{
    switch (tag) {
    case MSG_ROWS:
        return "rows";
    case MSG_FLUSH:
        return "flush";
    case MSG_RETRY:
        return "retry";
    case MSG_DRAIN:
        return "drain";
    case MSG_EXPIRE:
        return "expire";
    case RT_MSG_EXIT:
        return "exit";
    default:
        return "";
    }
}

/* The heap's roots: the queued entries and the handles holding their binaries. */
static void sink_trace(void *state, rt_gc_t *gc)
{
    for (sink_entry_t *e = ((sink_actor_t *)state)->s->head; e; e = e->next) {
        rt_gc_mark(gc, e);
        rt_gc_mark(gc, e->rows_h);
        rt_gc_mark(gc, e->opts_h);
    }
}

/*
** Rows the actor never took (in its mailbox when it died) were counted in at submission:
** they are taken back out, and the submitter hears RT_ENOPROC, which means "submit
** them again" (to the next incarnation), so a sink's restart loses none of them.
*/
static void sink_dead_letter(void *state, rt_msg_t *m)
{
    rt_sink_t *s = ((sink_actor_t *)state)->s;
    if (m->tag != MSG_ROWS)
        return;
    submit_t sub;
    memcpy(&sub, m->data, sizeof(sub));
    atomic_fetch_sub(&s->in, sub.nrows);
    atomic_fetch_sub(&s->queued, sub.nrows);
    atomic_fetch_sub(&s->bytes, m->bin ? rt_bin_len(m->bin) : 0);
    rt_bin_release(sub.opts);
    send_ack(sub.ack_pid, sub.ack_token, RT_ENOPROC);
}

/* Database sinks run on the blocking pool, the republish sink on a scheduler. */
#define SINK_TYPE(flags_)                                                                          \
    {                                                                                              \
        .name = "sink", .state_size = sizeof(sink_actor_t), .init = sink_init,                     \
        .handle = sink_handle, .trace = sink_trace, .terminate = sink_terminate,                   \
        .tag_name = sink_tag_name, .dead_letter = sink_dead_letter, .flags = (flags_),             \
    }
static const rt_actor_type_t sink_type = SINK_TYPE(0);
static const rt_actor_type_t sink_blocking_type = SINK_TYPE(RT_TYPE_BLOCKING);

int rt__sink_start(rt_pid_t group, rt_sink_t *s)
{
    snprintf(s->regname, sizeof(s->regname), "sink:%s", s->name);
    /* The queue is bounded by queue_bytes and max_bytes, not by the runtime's default
       per-actor limit: a sink killed for its heap would lose what it holds. */
    rt_child_spec_t c = {.name = s->regname,
                         .type = s->drv->blocking ? &sink_blocking_type : &sink_type,
                         .arg = s,
                         .restart = RT_PERMANENT,
                         .max_heap = (size_t)1 << 62,
                         .shutdown_ms = RT_SINK_STOP_WAIT_MS};
    return rt_supervisor_start_child(group, &c, NULL);
}

void rt__sink_close(rt_sink_t *s)
{
    atomic_store(&s->closing, true);
    /* Submissions that passed the closing check before it was set finish sending first. */
    while (atomic_load(&s->submitting) > 0)
        sched_yield();
}

/* ---- Submission (any thread) ---- */

/* Whether b holds exactly n BSON documents back to back (lengths and terminators). */
static bool docs_wellformed(const uint8_t *p, size_t len, uint32_t n)
{
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (len - off < 5)
            return false;
        uint32_t dl = rt__sink_doc_len(p + off);
        if (dl < 5 || dl > len - off || p[off + dl - 1] != 0)
            return false;
        off += dl;
    }
    return off == len;
}

int rt_sink_submit(rt_sink_t *s, rt_bin_t *rows, uint32_t nrows, rt_bin_t *opts, rt_pid_t ack_pid,
                   uint64_t ack_token)
{
    if (!s || !rows) {
        rt_bin_release(rows);
        rt_bin_release(opts);
        return RT_EINVAL;
    }
    size_t len = rt_bin_len(rows);
    int rc = 0;
    atomic_fetch_add(&s->submitting, 1);
    if (atomic_load(&s->closing)) {
        rc = RT_ESHUTDOWN;
    } else if (nrows == 0 || !docs_wellformed(rt_bin_data(rows), len, nrows) ||
               (opts && !docs_wellformed(rt_bin_data(opts), rt_bin_len(opts), 1))) {
        rc = RT_EINVAL;
    } else if (atomic_fetch_add(&s->bytes, len) + len > s->max_bytes) {
        atomic_fetch_sub(&s->bytes, len);
        rc = RT_ELIMIT;
    } else {
        atomic_fetch_add(&s->in, nrows);
        atomic_fetch_add(&s->queued, nrows);
        rt_msg_t *m = rt_msg_new(MSG_ROWS, sizeof(submit_t));
        if (m) {
            submit_t sub = {
                .nrows = nrows, .opts = opts, .ack_pid = ack_pid, .ack_token = ack_token};
            memcpy(m->data, &sub, sizeof(sub));
            m->bin = rows;
            rows = NULL;
            rc = rt_send_msg(atomic_load(&s->pid), m);
            if (rc == 0)
                opts = NULL; /* the message holds it; a refused one was freed without it */
        } else {
            rc = RT_ENOMEM;
        }
        if (rc != 0) {
            /* The actor is gone (or no envelope): these rows were never taken in. */
            atomic_fetch_sub(&s->in, nrows);
            atomic_fetch_sub(&s->queued, nrows);
            atomic_fetch_sub(&s->bytes, len);
        }
    }
    atomic_fetch_sub(&s->submitting, 1);
    if (rc == 0)
        return 0;
    if (rc == RT_ENOPROC) { /* its actor is being restarted: nothing taken, nothing counted */
        rt_bin_release(opts);
        return rc;
    }
    /* Refused: counted in and dropped, so the books still balance. */
    atomic_fetch_add(&s->in, nrows);
    uint64_t before = atomic_fetch_add(&s->dropped, nrows);
    if (before == 0 || before / 10000 != (before + nrows) / 10000)
        rt_log(RT_LOG_WARNING, "sink.dropped", "sink=%s rows=%u dropped_total=%llu reason=%s",
               s->name, nrows, (unsigned long long)(before + nrows),
               rc == RT_ELIMIT ? "max_bytes reached" : rt_strerror(rc));
    if (rc == RT_ELIMIT)
        rt__sink_error(s, "max_bytes (%llu) reached: rows dropped",
                       (unsigned long long)s->max_bytes);
    send_ack(ack_pid, ack_token, rc);
    rt_bin_release(rows);
    rt_bin_release(opts);
    return rc;
}

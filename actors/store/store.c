/*
** The store actor and its SQLite schema. Every change names the session it
** belongs to by client id and epoch (the pid of the actor that owns the
** session): a change from an actor whose session has since been replaced (a
** takeover with clean start, racing with the old actor's last changes) finds
** no session row with its epoch and is ignored, so it can never leak into the
** successor's state.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "group.h"
#include "log.h"
#include "sqlite_mem.h"
#include "store.h"

#define RT_STORE_APP_ID 0x72744D51 /* "rtMQ": PRAGMA application_id of our files */
#define RT_STORE_MAX_TX 5000       /* changes in one transaction before a commit regardless */
#define RT_STORE_MAX_SUB_IDS 8

enum {
    OP_SESSION = RT_MSG_USER + 0x5301,
    OP_SESSION_END,
    OP_SUB,
    OP_UNSUB,
    OP_MSG_ADD,
    OP_MSG_STATE,
    OP_MSG_DEL,
    OP_QOS2_ADD,
    OP_QOS2_DEL,
    OP_RETAIN,
    OP_BAN,
    OP_UNBAN,
    OP_DELAYED_ADD,
    OP_DELAYED_DEL,
    OP_FLUSH,
    OP_SYNC, /* data: a sync_t *; commits and signals it */
};

/* One change; key1 is the client id (or the retained topic), key2 a filter. */
typedef struct {
    rt_pid_t epoch;   /* the sending actor: owner of the session */
    rt_pid_t ack_pid; /* answered with RT_STORE_MSG_COMMITTED after the commit; 0: none */
    uint64_t token;
    uint64_t seq;
    int64_t expire_wall_ms; /* 0: never */
    uint32_t value;         /* session expiry, subscription id */
    uint16_t packet_id;
    uint8_t qos, retain, state, shared, flags;
    uint8_t n_sub_ids;
    uint32_t sub_ids[RT_STORE_MAX_SUB_IDS];
    uint32_t len1, len2;
    char text[]; /* key1 then key2 */
} op_t;

typedef struct {
    rt_pid_t pid;
    uint64_t token;
    int32_t status; /* RT_EAGAIN: its change failed (the commit cannot make it kept) */
} ack_t;

enum {
    ST_SESSION_UPSERT,
    ST_SESSION_CLEAR_SUBS,
    ST_SESSION_CLEAR_MSGS,
    ST_SESSION_CLEAR_QOS2,
    ST_SESSION_DELETE,
    ST_SUB,
    ST_UNSUB,
    ST_MSG_ADD,
    ST_MSG_STATE,
    ST_MSG_DEL,
    ST_QOS2_ADD,
    ST_QOS2_DEL,
    ST_RETAIN_SET,
    ST_RETAIN_DEL,
    ST_BAN_SET,
    ST_BAN_DEL,
    ST_DELAYED_SET,
    ST_DELAYED_DEL,
    ST_COUNT
};

/* ?E is the epoch: a change applies only while its sender owns the session. */
#define OWNED " AND EXISTS (SELECT 1 FROM sessions WHERE client_id = ?1 AND epoch = ?9)"

static const char *const sql[ST_COUNT] = {
    [ST_SESSION_UPSERT] = "INSERT INTO sessions(client_id, epoch, expiry, offline_since) "
                          "VALUES (?1, ?9, ?2, ?3) ON CONFLICT(client_id) DO UPDATE SET "
                          "epoch = ?9, expiry = ?2, offline_since = ?3",
    [ST_SESSION_CLEAR_SUBS] = "DELETE FROM subs WHERE client_id = ?1",
    [ST_SESSION_CLEAR_MSGS] = "DELETE FROM msgs WHERE client_id = ?1",
    [ST_SESSION_CLEAR_QOS2] = "DELETE FROM qos2_in WHERE client_id = ?1",
    [ST_SESSION_DELETE] = "DELETE FROM sessions WHERE client_id = ?1 AND epoch = ?9",
    [ST_SUB] = "INSERT OR REPLACE INTO subs(client_id, filter, qos, flags, sub_id) "
               "SELECT ?1, ?2, ?3, ?4, ?5 WHERE 1" OWNED,
    [ST_UNSUB] = "DELETE FROM subs WHERE client_id = ?1 AND filter = ?2" OWNED,
    [ST_MSG_ADD] = "INSERT OR REPLACE INTO msgs(client_id, seq, msg, qos, retain, state, "
                   "packet_id, shared, expire_at, sub_ids) "
                   "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?10, ?11 WHERE 1" OWNED,
    [ST_MSG_STATE] = "UPDATE msgs SET state = ?3, packet_id = ?4 WHERE client_id = ?1 AND "
                     "seq = ?2" OWNED,
    [ST_MSG_DEL] = "DELETE FROM msgs WHERE client_id = ?1 AND seq = ?2" OWNED,
    [ST_QOS2_ADD] =
        "INSERT OR IGNORE INTO qos2_in(client_id, packet_id) SELECT ?1, ?2 WHERE 1" OWNED,
    [ST_QOS2_DEL] = "DELETE FROM qos2_in WHERE client_id = ?1 AND packet_id = ?2" OWNED,
    [ST_RETAIN_SET] = "INSERT OR REPLACE INTO retained(topic, msg, expire_at) VALUES (?1, ?2, ?3)",
    [ST_RETAIN_DEL] = "DELETE FROM retained WHERE topic = ?1",
    [ST_BAN_SET] = "INSERT OR REPLACE INTO banned(kind, value, by, reason, at, until) "
                   "VALUES (?2, ?1, ?3, ?4, ?5, ?6)",
    [ST_BAN_DEL] = "DELETE FROM banned WHERE kind = ?2 AND value = ?1",
    [ST_DELAYED_SET] = "INSERT OR REPLACE INTO delayed(id, due, msg) VALUES (?2, ?3, ?4)",
    [ST_DELAYED_DEL] = "DELETE FROM delayed WHERE id = ?2",
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS retained(topic BLOB PRIMARY KEY, msg BLOB NOT NULL, "
    "  expire_at INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS sessions(client_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL, "
    "  expiry INTEGER NOT NULL, offline_since INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS subs(client_id TEXT, filter BLOB, qos INTEGER, flags INTEGER, "
    "  sub_id INTEGER, PRIMARY KEY(client_id, filter)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS msgs(client_id TEXT, seq INTEGER, msg BLOB, qos INTEGER, "
    "  retain INTEGER, state INTEGER, packet_id INTEGER, shared INTEGER, expire_at INTEGER, "
    "  sub_ids BLOB, PRIMARY KEY(client_id, seq)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS qos2_in(client_id TEXT, packet_id INTEGER, "
    "  PRIMARY KEY(client_id, packet_id)) WITHOUT ROWID;" RT_STORE_BANNED_TABLE
        RT_STORE_DELAYED_TABLE;

typedef struct {
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    _Atomic rt_pid_t pid; /* the store actor's current incarnation (each start sets it) */
    _Atomic uint64_t changes, commits, failures;
    _Atomic uint64_t lost; /* changes sent to a store actor that died before applying them */
    uint64_t lost_logged;  /* lost as of the last restart's log line (the actor's) */
    /* What SQLite holds for db, charged to the store actor: measured in its turns, and
       while db is opened and loaded at start, outside it. */
    rt_meter_t mem;
} store_t;

static store_t store;

typedef struct {
    bool in_tx;
    bool flush_sent;
    uint32_t tx_changes;
    ack_t *acks; /* on the actor's heap (kept by the scan of this state) */
    size_t nacks, capacks;
} actor_state_t;

/* Stored rows hold wall-clock ms as SQLite integers. */
static int64_t wall_ms(void)
{
    return (int64_t)rt_wall_ms();
}

/* Expiry instants cross restarts as wall-clock time; in memory they are monotonic. */
static int64_t mono_to_wall(uint64_t mono)
{
    return mono ? (int64_t)mono - (int64_t)rt_mono_ms() + wall_ms() : 0;
}

static uint64_t wall_to_mono(int64_t wall)
{
    if (!wall)
        return 0;
    int64_t m = wall - wall_ms() + (int64_t)rt_mono_ms();
    return m > 0 ? (uint64_t)m : 1; /* already past: expires at once, but is not "never" */
}

bool rt_store_enabled(void)
{
    return atomic_load(&store.pid) != 0;
}

/* ---- The actor ---- */

static bool exec_logged(sqlite3 *db, const char *what)
{
    char *msg = NULL;
    bool ok = sqlite3_exec(db, what, NULL, NULL, &msg) == SQLITE_OK;
    if (!ok) {
        store.failures++;
        rt_log(RT_LOG_ERROR, "store.error", "%s: %s", what, msg ? msg : "?");
    }
    sqlite3_free(msg);
    return ok;
}

static void answer(rt_pid_t pid, uint64_t token, int32_t status)
{
    rt_store_committed_t c = {.token = token, .status = status};
    rt_send(pid, RT_STORE_MSG_COMMITTED, &c, sizeof(c));
}

/* The statements and the open transaction belong to the store actor's turns alone. */
#define RT_STORE_IN_ACTOR() (rt_current() && rt_self(rt_current()) == atomic_load(&store.pid))

/*
** Commits the transaction and answers whoever waits for its changes: kept only if the commit
** succeeded and their own change did (a failed COMMIT leaves nothing of the transaction, so
** each of them is told RT_EAGAIN: not kept, send again). Returns whether it committed.
*/
static bool commit_tx(actor_state_t *a)
{
    RT_ASSERT(RT_STORE_IN_ACTOR());
    bool committed = true;
    if (a->in_tx) {
        committed = exec_logged(store.db, "COMMIT");
        if (!committed && !sqlite3_get_autocommit(store.db))
            exec_logged(store.db, "ROLLBACK");
        store.commits += committed;
        a->in_tx = false;
    }
    a->tx_changes = 0;
    for (size_t i = 0; i < a->nacks; i++)
        answer(a->acks[i].pid, a->acks[i].token, committed ? a->acks[i].status : RT_EAGAIN);
    a->nacks = 0;
    return committed;
}

static void bind_key(sqlite3_stmt *s, int idx, const char *p, uint32_t len, bool blob)
{
    if (blob)
        sqlite3_bind_blob(s, idx, p, (int)len, SQLITE_TRANSIENT);
    else
        sqlite3_bind_text(s, idx, p, (int)len, SQLITE_TRANSIENT);
}

/* Runs one prepared statement with the common parameters of op bound; false if it failed. */
static bool run_statement(int which, const op_t *op, rt_bin_t *bin)
{
    RT_ASSERT(RT_STORE_IN_ACTOR());
    sqlite3_stmt *s = store.st[which];
    bool topic_key = which == ST_RETAIN_SET || which == ST_RETAIN_DEL || which == ST_BAN_SET ||
                     which == ST_BAN_DEL;
    bind_key(s, 1, op->text, op->len1, topic_key);
    if (sqlite3_bind_parameter_count(s) >= 9)
        sqlite3_bind_int64(s, 9, (sqlite3_int64)op->epoch);
    switch (which) {
    case ST_SESSION_UPSERT:
        sqlite3_bind_int64(s, 2, op->value);
        sqlite3_bind_int64(s, 3, op->flags ? 0 : wall_ms());
        break;
    case ST_SUB:
        sqlite3_bind_blob(s, 2, op->text + op->len1, (int)op->len2, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 3, op->qos);
        sqlite3_bind_int(s, 4, op->flags);
        sqlite3_bind_int64(s, 5, op->value);
        break;
    case ST_UNSUB:
        sqlite3_bind_blob(s, 2, op->text + op->len1, (int)op->len2, SQLITE_TRANSIENT);
        break;
    case ST_MSG_ADD:
        sqlite3_bind_int64(s, 2, (sqlite3_int64)op->seq);
        sqlite3_bind_blob(s, 3, rt_bin_data(bin), (int)rt_bin_len(bin), SQLITE_STATIC);
        sqlite3_bind_int(s, 4, op->qos);
        sqlite3_bind_int(s, 5, op->retain);
        sqlite3_bind_int(s, 6, op->state);
        sqlite3_bind_int(s, 7, op->packet_id);
        sqlite3_bind_int(s, 8, op->shared);
        sqlite3_bind_int64(s, 10, op->expire_wall_ms);
        sqlite3_bind_blob(s, 11, op->sub_ids, (int)(op->n_sub_ids * sizeof(uint32_t)),
                          SQLITE_TRANSIENT);
        break;
    case ST_MSG_STATE:
        sqlite3_bind_int64(s, 2, (sqlite3_int64)op->seq);
        sqlite3_bind_int(s, 3, op->state);
        sqlite3_bind_int(s, 4, op->packet_id);
        break;
    case ST_MSG_DEL:
        sqlite3_bind_int64(s, 2, (sqlite3_int64)op->seq);
        break;
    case ST_QOS2_ADD:
    case ST_QOS2_DEL:
        sqlite3_bind_int(s, 2, op->packet_id);
        break;
    case ST_RETAIN_SET:
        sqlite3_bind_blob(s, 2, rt_bin_data(bin), (int)rt_bin_len(bin), SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, op->expire_wall_ms);
        break;
    case ST_BAN_SET: { /* key2: who banned it, a NUL, the reason */
        const char *by = op->text + op->len1;
        size_t bylen = strnlen(by, op->len2);
        sqlite3_bind_int(s, 2, op->flags);
        sqlite3_bind_text(s, 3, by, (int)bylen, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 4, bylen < op->len2 ? by + bylen + 1 : "",
                          bylen < op->len2 ? (int)(op->len2 - bylen - 1) : 0, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)op->seq);
        sqlite3_bind_int64(s, 6, op->expire_wall_ms);
        break;
    }
    case ST_BAN_DEL:
        sqlite3_bind_int(s, 2, op->flags);
        break;
    case ST_DELAYED_SET:
        sqlite3_bind_int64(s, 2, (sqlite3_int64)op->seq);
        sqlite3_bind_int64(s, 3, op->expire_wall_ms);
        sqlite3_bind_blob(s, 4, rt_bin_data(bin), (int)rt_bin_len(bin), SQLITE_STATIC);
        break;
    case ST_DELAYED_DEL:
        sqlite3_bind_int64(s, 2, (sqlite3_int64)op->seq);
        break;
    }
    int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
        store.failures++;
        rt_log(RT_LOG_ERROR, "store.error", "%s", sqlite3_errmsg(store.db));
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc == SQLITE_DONE;
}

/* Deletes what the session under op's client id holds: subscriptions and messages. */
static void clear_session(const op_t *op)
{
    run_statement(ST_SESSION_CLEAR_SUBS, op, NULL);
    run_statement(ST_SESSION_CLEAR_MSGS, op, NULL);
    run_statement(ST_SESSION_CLEAR_QOS2, op, NULL);
}

/* Applies one change in the open transaction; false if a statement failed. The changes a
   publisher waits for (a message row, an inbound QoS 2 id, a retained message) are one
   statement each. */
static bool apply_op(const op_t *op, uint32_t tag, rt_bin_t *bin)
{
    bool ok = true;
    switch (tag) {
    case OP_SESSION:
        if (op->retain) /* fresh: a new session under this id keeps nothing of the old one */
            clear_session(op);
        run_statement(ST_SESSION_UPSERT, op, NULL);
        break;
    case OP_SESSION_END:
        /* Only the owner ends it; its rows go only if it still owned it. */
        run_statement(ST_SESSION_DELETE, op, NULL);
        if (sqlite3_changes(store.db))
            clear_session(op);
        break;
    case OP_SUB:
        run_statement(ST_SUB, op, NULL);
        break;
    case OP_UNSUB:
        run_statement(ST_UNSUB, op, NULL);
        break;
    case OP_MSG_ADD:
        ok = run_statement(ST_MSG_ADD, op, bin);
        break;
    case OP_MSG_STATE:
        run_statement(ST_MSG_STATE, op, NULL);
        break;
    case OP_MSG_DEL:
        run_statement(ST_MSG_DEL, op, NULL);
        break;
    case OP_QOS2_ADD:
        ok = run_statement(ST_QOS2_ADD, op, NULL);
        break;
    case OP_QOS2_DEL:
        run_statement(ST_QOS2_DEL, op, NULL);
        break;
    case OP_RETAIN:
        ok = run_statement(bin ? ST_RETAIN_SET : ST_RETAIN_DEL, op, bin);
        break;
    case OP_BAN:
        run_statement(ST_BAN_SET, op, NULL);
        break;
    case OP_UNBAN:
        run_statement(ST_BAN_DEL, op, NULL);
        break;
    case OP_DELAYED_ADD:
        ok = run_statement(ST_DELAYED_SET, op, bin);
        break;
    case OP_DELAYED_DEL:
        run_statement(ST_DELAYED_DEL, op, NULL);
        break;
    }
    store.changes++;
    return ok;
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
} sync_t;

/* Wakes the rt_store_sync whose request m is. */
static void answer_sync(const rt_msg_t *m)
{
    sync_t *sy;
    memcpy(&sy, m->data, sizeof(sy));
    pthread_mutex_lock(&sy->lock);
    sy->done = true;
    pthread_cond_signal(&sy->cond);
    pthread_mutex_unlock(&sy->lock);
}

/* The change m carries, or NULL if m is not one. */
static const op_t *op_of(const rt_msg_t *m)
{
    if (m->tag < OP_SESSION || m->tag > OP_DELAYED_DEL || m->len < sizeof(op_t))
        return NULL;
    return (const op_t *)(const void *)m->data;
}

static void apply_msg(rt_actor_t *self, actor_state_t *a, rt_msg_t *m)
{
    if (m->tag == OP_FLUSH) {
        a->flush_sent = false;
        commit_tx(a);
        return;
    }
    if (m->tag == OP_SYNC) {
        commit_tx(a);
        answer_sync(m);
        return;
    }
    const op_t *op = op_of(m);
    if (!op)
        return;
    RT_ASSERT(m->len == sizeof(op_t) + op->len1 + op->len2); /* as send_op made it */
    if (!a->in_tx) {
        exec_logged(store.db, "BEGIN");
        a->in_tx = true;
    }
    int32_t status = apply_op(op, m->tag, m->bin) ? 0 : RT_EAGAIN;
    if (op->ack_pid) {
        if (rt_grow_on(self, &a->acks, &a->capacks, a->nacks + 1, sizeof(ack_t), 64, RT_OBJ_LEAF) ==
            0) {
            a->acks[a->nacks++] = (ack_t){op->ack_pid, op->token, status};
        } else { /* no memory to remember it: the commit comes now, then its answer */
            answer(op->ack_pid, op->token, commit_tx(a) ? status : RT_EAGAIN);
            return;
        }
    }
    /* Group commit: FLUSH queues behind everything already waiting, so the commit it
       triggers covers all of it. */
    if (++a->tx_changes >= RT_STORE_MAX_TX) {
        commit_tx(a);
    } else if (!a->flush_sent) {
        a->flush_sent = true;
        rt_send(rt_self(self), OP_FLUSH, NULL, 0);
    }
}

static void store_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    rt_meter_begin(&store.mem, &rt_sqlite_lib);
    apply_msg(self, state, m);
    rt_meter_end(&store.mem, &rt_sqlite_lib, self);
}

/*
** Each start of the store actor publishes its pid. A restart says how many changes the
** one before lost (sent, never applied): each that a publisher waited for was answered
** RT_ENOPROC, so no acknowledgement rests on them.
*/
static int store_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state;
    (void)arg;
    uint64_t lost = atomic_load(&store.lost);
    if (atomic_load(&store.pid))
        rt_log(RT_LOG_WARNING, "store.restarted", "lost_changes=%llu",
               (unsigned long long)(lost - store.lost_logged));
    store.lost_logged = lost;
    atomic_store(&store.pid, rt_self(self));
    return 0;
}

/* What was applied is committed and answered, whatever ends the actor. */
static void store_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    actor_state_t *a = state;
    rt_meter_begin(&store.mem, &rt_sqlite_lib);
    commit_tx(a);
    rt_meter_end(&store.mem, &rt_sqlite_lib, self);
    rt_meter_release(&store.mem, &rt_sqlite_lib, self);
}

/* A change the store never applied: counted lost, and whoever waits for it told so. */
static void store_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag == OP_SYNC) {
        answer_sync(m);
        return;
    }
    const op_t *op = op_of(m);
    if (!op)
        return;
    atomic_fetch_add(&store.lost, 1);
    if (op->ack_pid)
        answer(op->ack_pid, op->token, RT_ENOPROC);
}

static const rt_actor_type_t store_type = {
    .name = "store",
    .state_size = sizeof(actor_state_t),
    .init = store_init,
    .handle = store_handle,
    .terminate = store_terminate,
    .dead_letter = store_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

/* ---- Sending changes ---- */

static void send_op(uint32_t tag, op_t *op, const char *k1, size_t l1, const char *k2, size_t l2,
                    rt_bin_t *bin)
{
    rt_pid_t pid = atomic_load(&store.pid);
    if (!pid)
        return;
    rt_msg_t *m = rt_msg_new(tag, sizeof(op_t) + l1 + l2);
    if (!m) { /* no memory for the change: whoever waits for it is told so */
        store.failures++;
        if (op->ack_pid)
            answer(op->ack_pid, op->token, RT_ENOMEM);
        return;
    }
    op_t *o = (op_t *)(void *)m->data;
    *o = *op;
    o->epoch = rt_current() ? rt_self(rt_current()) : 0;
    o->len1 = (uint32_t)l1;
    o->len2 = (uint32_t)l2;
    if (l1)
        memcpy(o->text, k1, l1);
    if (l2)
        memcpy(o->text + l1, k2, l2);
    m->bin = bin ? rt_bin_retain(bin) : NULL;
    /* The store actor is being restarted: the change is lost, and said to be. */
    if (rt_send_msg(pid, m) != 0) {
        atomic_fetch_add(&store.lost, 1);
        if (op->ack_pid)
            answer(op->ack_pid, op->token, RT_ENOPROC);
    }
}

void rt_store_session(const char *client_id, uint32_t expiry_s, bool online, bool fresh)
{
    op_t op = {.value = expiry_s, .flags = online, .retain = fresh};
    send_op(OP_SESSION, &op, client_id, strlen(client_id), NULL, 0, NULL);
}

void rt_store_session_end(const char *client_id)
{
    op_t op = {0};
    send_op(OP_SESSION_END, &op, client_id, strlen(client_id), NULL, 0, NULL);
}

void rt_store_sub(const char *client_id, const char *filter, size_t len, const rt_trie_opts_t *o)
{
    op_t op = {.qos = o->qos,
               .value = o->sub_id,
               .flags = (uint8_t)(o->no_local | o->retain_as_published << 1 |
                                  o->retain_handling << 2 | o->acl_check << 4 | o->exclusive << 5)};
    send_op(OP_SUB, &op, client_id, strlen(client_id), filter, len, NULL);
}

void rt_store_unsub(const char *client_id, const char *filter, size_t len)
{
    op_t op = {0};
    send_op(OP_UNSUB, &op, client_id, strlen(client_id), filter, len, NULL);
}

void rt_store_msg_add(const char *client_id, const rt_stored_msg_t *m, rt_pid_t ack_pid,
                      uint64_t token)
{
    op_t op = {.ack_pid = ack_pid,
               .token = token,
               .seq = m->seq,
               .expire_wall_ms = mono_to_wall(m->expire_at_ms),
               .packet_id = m->packet_id,
               .qos = m->qos,
               .retain = m->retain,
               .state = m->state,
               .shared = m->shared};
    op.n_sub_ids =
        (uint8_t)(m->n_sub_ids < RT_STORE_MAX_SUB_IDS ? m->n_sub_ids : RT_STORE_MAX_SUB_IDS);
    memcpy(op.sub_ids, m->sub_ids, op.n_sub_ids * sizeof(uint32_t));
    send_op(OP_MSG_ADD, &op, client_id, strlen(client_id), NULL, 0, m->bin);
}

void rt_store_msg_state(const char *client_id, uint64_t seq, uint8_t state, uint16_t packet_id)
{
    op_t op = {.seq = seq, .state = state, .packet_id = packet_id};
    send_op(OP_MSG_STATE, &op, client_id, strlen(client_id), NULL, 0, NULL);
}

void rt_store_msg_del(const char *client_id, uint64_t seq)
{
    op_t op = {.seq = seq};
    send_op(OP_MSG_DEL, &op, client_id, strlen(client_id), NULL, 0, NULL);
}

void rt_store_qos2_in(const char *client_id, uint16_t packet_id, bool add, rt_pid_t ack_pid,
                      uint64_t token)
{
    op_t op = {.packet_id = packet_id, .ack_pid = ack_pid, .token = token};
    send_op(add ? OP_QOS2_ADD : OP_QOS2_DEL, &op, client_id, strlen(client_id), NULL, 0, NULL);
}

void rt_store_retain(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms,
                     rt_pid_t ack_pid, uint64_t token)
{
    op_t op = {.ack_pid = ack_pid, .token = token, .expire_wall_ms = mono_to_wall(expire_at_ms)};
    send_op(OP_RETAIN, &op, topic, len, NULL, 0, bin);
}

void rt_store_ban(int kind, const char *value, size_t len, const char *by, const char *reason,
                  int64_t at_s, int64_t until_s)
{
    /* Seconds, as the ban list keeps them: at in seq, until in expire_wall_ms. */
    op_t op = {.flags = (uint8_t)kind, .seq = (uint64_t)at_s, .expire_wall_ms = until_s};
    size_t bylen = strlen(by), rlen = strlen(reason);
    char *k2 = malloc(bylen + 1 + rlen);
    if (!k2) {
        store.failures++;
        return;
    }
    memcpy(k2, by, bylen + 1);
    memcpy(k2 + bylen + 1, reason, rlen);
    send_op(OP_BAN, &op, value, len, k2, bylen + 1 + rlen, NULL);
    free(k2);
}

void rt_store_unban(int kind, const char *value, size_t len)
{
    op_t op = {.flags = (uint8_t)kind};
    send_op(OP_UNBAN, &op, value, len, NULL, 0, NULL);
}

void rt_store_delayed_add(uint64_t id, int64_t due_ms, rt_bin_t *bin, rt_pid_t ack_pid,
                          uint64_t token)
{
    op_t op = {.ack_pid = ack_pid, .token = token, .seq = id, .expire_wall_ms = due_ms};
    send_op(OP_DELAYED_ADD, &op, NULL, 0, NULL, 0, bin);
}

void rt_store_delayed_del(uint64_t id)
{
    op_t op = {.seq = id};
    send_op(OP_DELAYED_DEL, &op, NULL, 0, NULL, 0, NULL);
}

int rt_store_load_delayed(void (*fn)(uint64_t id, int64_t due_ms, const void *packet, size_t len,
                                     void *arg),
                          void *arg)
{
    if (!store.db)
        return 0;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(store.db, "SELECT id, due, msg FROM delayed ORDER BY due, id", -1, &s,
                           NULL))
        return RT_EINVAL;
    size_t n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        fn((uint64_t)sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
           sqlite3_column_blob(s, 2), (size_t)sqlite3_column_bytes(s, 2), arg);
        n++;
    }
    sqlite3_finalize(s);
    rt_log(RT_LOG_INFO, "store.delayed_loaded", "messages=%zu", n);
    return 0;
}

int rt_store_load_bans(void (*fn)(int kind, const char *value, size_t len, const char *by,
                                  const char *reason, int64_t at_s, int64_t until_s, void *arg),
                       void *arg)
{
    if (!store.db)
        return 0;
    int64_t now_s = wall_ms() / 1000;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(store.db, "SELECT kind, value, by, reason, at, until FROM banned", -1,
                           &s, NULL))
        return RT_EINVAL;
    size_t n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        int64_t until = sqlite3_column_int64(s, 5);
        if (until && until <= now_s)
            continue; /* ran out while rtd was down: deleted below */
        const char *by = (const char *)sqlite3_column_text(s, 2);
        const char *reason = (const char *)sqlite3_column_text(s, 3);
        fn(sqlite3_column_int(s, 0), sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1),
           by ? by : "", reason ? reason : "", sqlite3_column_int64(s, 4), until, arg);
        n++;
    }
    sqlite3_finalize(s);
    char q[128];
    snprintf(q, sizeof(q), "DELETE FROM banned WHERE until > 0 AND until <= %lld",
             (long long)now_s);
    exec_logged(store.db, q);
    rt_log(RT_LOG_INFO, "store.banned_loaded", "bans=%zu", n);
    return 0;
}

void rt_store_stats(rt_store_stats_t *out)
{
    out->changes = store.changes;
    out->commits = store.commits;
    out->failures = store.failures;
    out->lost = store.lost;
}

/* ---- Opening and loading ---- */

/* The file's path once open (rt_store_path). */
static char store_path[512];

/* Closes the database and says why: RT_EINVAL (the file is refused) or RT_EAGAIN. */
static int open_failed(char *err, size_t errlen, const char *path, const char *why, int code)
{
    snprintf(err, errlen, "%s: %s", path, why);
    if (store.db)
        sqlite3_close(store.db);
    store.db = NULL;
    return code;
}

/*
** Refuses anything that is not our own healthy file: not a database, another
** application's, a newer schema, or damaged; migrates an older one. A new empty file is
** initialised.
*/
static int check_file(const char *path, char *err, size_t errlen)
{
    static const rt_sqlite_kind_t kind = {
        .what = "rtd state file",
        .app_id = RT_STORE_APP_ID,
        .version = RT_STORE_SCHEMA,
        .schema = schema,
        .steps = rt__store_steps,
    };
    char why[700];
    int rc = rt__sqlite_check_file(store.db, path, &kind, why, sizeof(why));
    return rc ? open_failed(err, errlen, path, why, rc) : 0;
}

int rt_store_create_private(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return errno;
    close(fd);
    return 0;
}

int rt_store_open(const char *dir, rt_pid_t sup, char *err, size_t errlen)
{
    char path[512];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create the data directory: %s", dir, strerror(errno));
        return RT_EINVAL;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, RT_STORE_FILE);
    rt_store_create_private(path);
    rt_sqlite_mem_init();
    int64_t mark = rt_sqlite_lib.thread_bytes();
    if (sqlite3_open_v2(path, &store.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK)
        return open_failed(err, errlen, path, store.db ? sqlite3_errmsg(store.db) : "cannot open",
                           RT_EINVAL);
    int rc = check_file(path, err, errlen);
    if (rc)
        return rc;
    if (sqlite3_exec(store.db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", NULL,
                     NULL, NULL) != SQLITE_OK)
        return open_failed(err, errlen, path, sqlite3_errmsg(store.db), RT_EAGAIN);
    for (int i = 0; i < ST_COUNT; i++)
        if (sqlite3_prepare_v3(store.db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &store.st[i],
                               NULL) != SQLITE_OK)
            return open_failed(err, errlen, path, sqlite3_errmsg(store.db), RT_EAGAIN);
    rt_meter_add(&store.mem, &rt_sqlite_lib, mark); /* charged in the actor's first turn */
    rt_pid_t group;
    rt_child_spec_t c = {.name = RT_STORE_NAME, .type = &store_type, .restart = RT_PERMANENT};
    if (rt_group_start(sup, RT_STORE_GROUP, RT_PERMANENT, &group) ||
        rt_supervisor_start_child(group, &c, NULL))
        return open_failed(err, errlen, path, "cannot start the store actor", RT_EAGAIN);
    snprintf(store_path, sizeof(store_path), "%s", path);
    return 0;
}

const char *rt_store_path(void)
{
    return atomic_load(&store.pid) ? store_path : "";
}

int rt_store_sync(void)
{
    RT_ASSERT(!rt_current()); /* an actor waiting here could hold up the store's own turn */
    rt_pid_t pid = atomic_load(&store.pid);
    if (!pid)
        return 0;
    sync_t sy = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    sync_t *p = &sy;
    int rc = rt_send(pid, OP_SYNC, &p, sizeof(p));
    pthread_mutex_lock(&sy.lock);
    while (rc == 0 && !sy.done)
        pthread_cond_wait(&sy.cond, &sy.lock);
    pthread_mutex_unlock(&sy.lock);
    return rc;
}

void rt_store_close(void)
{
    int64_t mark = rt_sqlite_lib.thread_bytes();
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(store.st[i]);
        store.st[i] = NULL;
    }
    if (store.db)
        sqlite3_close(store.db);
    rt_meter_add(&store.mem, &rt_sqlite_lib, mark);
    store.db = NULL;
    atomic_store(&store.pid, 0);
}

/* How a stored PUBLISH becomes a message again (rt_store_load's make_bin), while loading. */
static rt_bin_t *(*make_bin)(const void *packet, size_t len);

static rt_bin_t *load_packet(sqlite3_stmt *s, int col)
{
    rt_bin_t *bin = make_bin(sqlite3_column_blob(s, col), (size_t)sqlite3_column_bytes(s, col));
    if (!bin)
        rt_log(RT_LOG_ERROR, "store.bad_message", "a stored message could not be read: skipped");
    return bin;
}

static int load_retained(void (*fn)(const char *, size_t, rt_bin_t *, uint64_t, void *), void *arg)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(store.db, "SELECT topic, msg, expire_at FROM retained", -1, &s, NULL))
        return RT_EINVAL;
    int64_t now = wall_ms();
    while (sqlite3_step(s) == SQLITE_ROW) {
        int64_t exp = sqlite3_column_int64(s, 2);
        if (exp && exp <= now)
            continue; /* expired while the broker was down */
        rt_bin_t *bin = load_packet(s, 1);
        if (!bin)
            continue;
        fn(sqlite3_column_blob(s, 0), (size_t)sqlite3_column_bytes(s, 0), bin, wall_to_mono(exp),
           arg);
    }
    sqlite3_finalize(s);
    return 0;
}

static void load_subs(rt_stored_session_t *ss, sqlite3_stmt *q)
{
    size_t cap = 0;
    sqlite3_bind_text(q, 1, ss->client_id, -1, SQLITE_STATIC);
    while (sqlite3_step(q) == SQLITE_ROW) {
        if (rt_grow(&ss->subs, &cap, ss->nsubs + 1, sizeof(*ss->subs), 8) != 0)
            break;
        rt_stored_sub_t *sub = &ss->subs[ss->nsubs];
        size_t len = (size_t)sqlite3_column_bytes(q, 0);
        sub->filter = malloc(len + 1);
        if (!sub->filter)
            break;
        memcpy(sub->filter, sqlite3_column_blob(q, 0), len);
        sub->filter[len] = 0;
        sub->len = len;
        int flags = sqlite3_column_int(q, 2);
        sub->opts = (rt_trie_opts_t){.qos = (uint8_t)sqlite3_column_int(q, 1),
                                     .no_local = flags & 1,
                                     .retain_as_published = (flags >> 1) & 1,
                                     .retain_handling = (flags >> 2) & 3,
                                     .acl_check = (flags >> 4) & 1,
                                     .exclusive = (flags >> 5) & 1,
                                     .sub_id = (uint32_t)sqlite3_column_int64(q, 3)};
        ss->nsubs++;
    }
    sqlite3_reset(q);
}

static void load_msgs(rt_stored_session_t *ss, sqlite3_stmt *q)
{
    size_t cap = 0;
    sqlite3_bind_text(q, 1, ss->client_id, -1, SQLITE_STATIC);
    while (sqlite3_step(q) == SQLITE_ROW) {
        if (rt_grow(&ss->msgs, &cap, ss->nmsgs + 1, sizeof(*ss->msgs), 8) != 0)
            break;
        rt_stored_msg_t *m = &ss->msgs[ss->nmsgs];
        memset(m, 0, sizeof(*m));
        m->seq = (uint64_t)sqlite3_column_int64(q, 0);
        m->bin = load_packet(q, 1);
        if (!m->bin)
            continue;
        m->qos = (uint8_t)sqlite3_column_int(q, 2);
        m->retain = (uint8_t)sqlite3_column_int(q, 3);
        m->state = (uint8_t)sqlite3_column_int(q, 4);
        m->packet_id = (uint16_t)sqlite3_column_int(q, 5);
        m->shared = (uint8_t)sqlite3_column_int(q, 6);
        m->expire_at_ms = wall_to_mono(sqlite3_column_int64(q, 7));
        size_t idbytes = (size_t)sqlite3_column_bytes(q, 8);
        m->n_sub_ids = (uint32_t)(idbytes / sizeof(uint32_t));
        if (m->n_sub_ids > RT_STORE_MAX_SUB_IDS)
            m->n_sub_ids = RT_STORE_MAX_SUB_IDS;
        if (m->n_sub_ids)
            memcpy(m->sub_ids, sqlite3_column_blob(q, 8), m->n_sub_ids * sizeof(uint32_t));
        ss->nmsgs++;
    }
    sqlite3_reset(q);
}

static void load_qos2(rt_stored_session_t *ss, sqlite3_stmt *q)
{
    size_t cap = 0;
    sqlite3_bind_text(q, 1, ss->client_id, -1, SQLITE_STATIC);
    while (sqlite3_step(q) == SQLITE_ROW) {
        if (rt_grow(&ss->qos2_in, &cap, ss->nqos2_in + 1, sizeof(*ss->qos2_in), 8) != 0)
            break;
        ss->qos2_in[ss->nqos2_in++] = (uint16_t)sqlite3_column_int(q, 0);
    }
    sqlite3_reset(q);
}

static void free_loaded(rt_stored_session_t *ss)
{
    for (size_t i = 0; i < ss->nsubs; i++)
        free(ss->subs[i].filter);
    free(ss->subs);
    for (size_t i = 0; i < ss->nmsgs; i++)
        rt_bin_release(ss->msgs[i].bin);
    free(ss->msgs);
    free(ss->qos2_in);
}

/* Sessions whose expiry ran out while the broker was down, and everything they held. */
static void delete_expired(int64_t now)
{
    static const char *const tables[] = {"subs", "msgs", "qos2_in", "sessions"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char q[256];
        snprintf(q, sizeof(q),
                 "DELETE FROM %s WHERE client_id IN (SELECT client_id FROM sessions WHERE "
                 "offline_since > 0 AND (%lld - offline_since) / 1000 >= expiry)",
                 tables[i], (long long)now);
        exec_logged(store.db, q);
    }
}

static int load_all(void (*on_retained)(const char *topic, size_t len, rt_bin_t *bin,
                                        uint64_t expire_at_ms, void *arg),
                    void (*on_session)(const rt_stored_session_t *s, void *arg), void *arg,
                    char *err, size_t errlen)
{
    if (load_retained(on_retained, arg)) {
        snprintf(err, errlen, "loading retained messages: %s", sqlite3_errmsg(store.db));
        return RT_EINVAL;
    }
    sqlite3_stmt *sessions, *subs, *msgs, *qos2;
    int rc = 0;
    rc |= sqlite3_prepare_v2(store.db, "SELECT client_id, expiry, offline_since FROM sessions", -1,
                             &sessions, NULL);
    rc |= sqlite3_prepare_v2(store.db,
                             "SELECT filter, qos, flags, sub_id FROM subs WHERE "
                             "client_id = ?1",
                             -1, &subs, NULL);
    rc |= sqlite3_prepare_v2(store.db,
                             "SELECT seq, msg, qos, retain, state, packet_id, shared, "
                             "expire_at, sub_ids FROM msgs WHERE client_id = ?1 ORDER BY seq",
                             -1, &msgs, NULL);
    rc |= sqlite3_prepare_v2(store.db, "SELECT packet_id FROM qos2_in WHERE client_id = ?1", -1,
                             &qos2, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "loading sessions: %s", sqlite3_errmsg(store.db));
        return RT_EINVAL;
    }
    int64_t now = wall_ms();
    size_t nsessions = 0, nexpired = 0;
    while (sqlite3_step(sessions) == SQLITE_ROW) {
        rt_stored_session_t ss = {.client_id = (const char *)sqlite3_column_text(sessions, 0)};
        int64_t expiry = sqlite3_column_int64(sessions, 1);
        int64_t since = sqlite3_column_int64(sessions, 2);
        /* A session online when the broker stopped counts as disconnected from now. */
        int64_t gone_s = since ? (now - since) / 1000 : 0;
        if (gone_s >= expiry) {
            nexpired++;
            continue; /* its rows go when a client with that id next starts a session */
        }
        ss.expiry_left_s = (uint32_t)(expiry - gone_s);
        load_subs(&ss, subs);
        load_msgs(&ss, msgs);
        load_qos2(&ss, qos2);
        on_session(&ss, arg);
        free_loaded(&ss);
        nsessions++;
    }
    sqlite3_finalize(sessions);
    if (nexpired)
        delete_expired(now);
    sqlite3_finalize(subs);
    sqlite3_finalize(msgs);
    sqlite3_finalize(qos2);
    rt_log(RT_LOG_INFO, "store.loaded", "sessions=%zu expired=%zu", nsessions, nexpired);
    return 0;
}

int rt_store_load(rt_bin_t *(*packet_to_bin)(const void *packet, size_t len),
                  void (*on_retained)(const char *topic, size_t len, rt_bin_t *bin,
                                      uint64_t expire_at_ms, void *arg),
                  void (*on_session)(const rt_stored_session_t *s, void *arg), void *arg, char *err,
                  size_t errlen)
{
    if (!store.db)
        return 0;
    make_bin = packet_to_bin;
    /* Reading the whole file fills the page cache: the store actor's from its next turn.
       Restored sessions already write to it meanwhile: this window is not the actor's. */
    int64_t mark = rt_sqlite_lib.thread_bytes();
    int rc = load_all(on_retained, on_session, arg, err, errlen);
    rt_meter_add(&store.mem, &rt_sqlite_lib, mark);
    /* A turn now, so the store is charged for it without waiting for the first change. */
    rt_send(atomic_load(&store.pid), OP_FLUSH, NULL, 0);
    return rc;
}

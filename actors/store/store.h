/*
** The broker's durable state in SQLite (WAL) under data_dir: retained
** messages and persistent sessions (subscriptions, queued and inflight
** messages, inbound QoS 2 packet ids), so they survive a restart, kill -9
** included.
**
** One store actor on the blocking pool applies the changes connections send
** it, in order per sender, inside one open transaction, and commits when the
** changes that were waiting have all been applied (a self-sent FLUSH marks the
** end of what was queued): group commit, so a busy broker pays one commit for
** many changes. A change sent with an ack pid is answered with
** RT_STORE_MSG_COMMITTED once committed; a publisher's PUBACK/PUBREC waits for
** that, which is what makes "acknowledged" mean "on disk". WAL with
** synchronous=NORMAL survives a killed process (not a power cut).
**
** The file carries an application id and a schema version: a file that is
** not SQLite, belongs to something else, fails quick_check or holds a newer
** schema is refused with a clear error and never touched; an older schema is
** migrated at start, after a copy of it is taken (migrate.c).
*/
#ifndef RT_STORE_H
#define RT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"
#include "topic_trie.h"

#define RT_STORE_FILE "state.db"

struct sqlite3;

/*
** Creates path with mode 0600 unless it exists, before SQLite opens it: the
** databases under data_dir hold payloads, and SQLite gives a database's -wal and
** -shm files the database's own mode. 0, or an errno (the caller's open reports it).
** rtd's umask (077) makes the same true of anything else it creates.
*/
int rt_store_create_private(const char *path);
#define RT_STORE_MSG_COMMITTED (RT_MSG_USER + 0x5300) /* data: rt_store_committed_t */

typedef struct {
    uint64_t token;
    int32_t status; /* 0: committed; RT_ENOPROC: lost, the store actor died before applying it */
} rt_store_committed_t;

#define RT_STORE_GROUP "store_sup" /* the store actor's supervisor (group.h) */
#define RT_STORE_NAME "store"      /* ... and the actor's registered name */

/* One stored message of a session (queued, or inflight with its state). */
typedef struct {
    uint64_t seq;          /* order within the session */
    rt_bin_t *bin;         /* canonical PUBLISH (reference owned by the loader's caller) */
    uint64_t expire_at_ms; /* CLOCK_MONOTONIC, converted from the stored wall clock; 0: never */
    uint8_t qos, retain, state, shared;
    uint16_t packet_id;
    uint32_t n_sub_ids;
    uint32_t sub_ids[8];
} rt_stored_msg_t;

typedef struct {
    char *filter;
    size_t len;
    rt_trie_opts_t opts;
} rt_stored_sub_t;

typedef struct {
    const char *client_id;
    uint32_t expiry_left_s; /* what remains of the session expiry, counted from its disconnect */
    rt_stored_sub_t *subs;
    size_t nsubs;
    rt_stored_msg_t *msgs; /* by seq */
    size_t nmsgs;
    uint16_t *qos2_in; /* inbound QoS 2 ids awaiting PUBREL */
    size_t nqos2_in;
} rt_stored_session_t;

/*
** Opens (creating if needed) dir/state.db and starts the store actor, the permanent
** child of the group supervisor RT_STORE_GROUP (group.h) under sup (0: of nobody);
** err says why not. A store actor that dies commits and answers what it applied; the
** changes still queued to it are lost, and those sent with an ack pid are answered
** RT_ENOPROC, as are changes sent before the next one runs. The database stays open.
*/
int rt_store_open(const char *dir, rt_pid_t sup, char *err, size_t errlen);
/*
** From outside the runtime (rtd's main thread) before rt_shutdown: waits until
** every change sent so far is committed, so a clean stop loses nothing.
*/
int rt_store_sync(void);
/* After rt_shutdown: closes the database. */
void rt_store_close(void);
bool rt_store_enabled(void);

/*
** Loads what the last run left. Each stored PUBLISH becomes a binary through
** packet_to_bin (the broker's canonical form; NULL: unreadable, skipped and logged).
** Retained messages are passed to on_retained
** (topic, bin with a reference for the callee, monotonic expiry) and each
** session to on_session (valid during the call). Runs before listeners open.
*/
int rt_store_load(rt_bin_t *(*packet_to_bin)(const void *packet, size_t len),
                  void (*on_retained)(const char *topic, size_t len, rt_bin_t *bin,
                                      uint64_t expire_at_ms, void *arg),
                  void (*on_session)(const rt_stored_session_t *s, void *arg), void *arg, char *err,
                  size_t errlen);

/* Changes. Each is one message to the store actor; ack_pid 0 asks for no answer. */
/* fresh: a new session under this id (the old one's rows go); online: its client is connected. */
void rt_store_session(const char *client_id, uint32_t expiry_s, bool online, bool fresh);
void rt_store_session_end(const char *client_id);
void rt_store_sub(const char *client_id, const char *filter, size_t len, const rt_trie_opts_t *o);
void rt_store_unsub(const char *client_id, const char *filter, size_t len);
void rt_store_msg_add(const char *client_id, const rt_stored_msg_t *m, rt_pid_t ack_pid,
                      uint64_t token);
void rt_store_msg_state(const char *client_id, uint64_t seq, uint8_t state, uint16_t packet_id);
void rt_store_msg_del(const char *client_id, uint64_t seq);
void rt_store_qos2_in(const char *client_id, uint16_t packet_id, bool add, rt_pid_t ack_pid,
                      uint64_t token);
/* bin NULL clears the topic. */
void rt_store_retain(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms,
                     rt_pid_t ack_pid, uint64_t token);
/* A ban (broker/banned.h) kept or replaced, by its kind and value; and dropped. Seconds. */
void rt_store_ban(int kind, const char *value, size_t len, const char *by, const char *reason,
                  int64_t at_s, int64_t until_s);
void rt_store_unban(int kind, const char *value, size_t len);
/* Each ban kept that has not run out, to fn, at start (those that ran out are deleted). */
int rt_store_load_bans(void (*fn)(int kind, const char *value, size_t len, const char *by,
                                  const char *reason, int64_t at_s, int64_t until_s, void *arg),
                       void *arg);

/*
** A delayed message (conn/delayed.h): kept under its id until due_ms (Unix milliseconds),
** the canonical PUBLISH bin with its real topic; ack_pid (0: none) is told of the commit.
** And dropped, once published or deleted.
*/
void rt_store_delayed_add(uint64_t id, int64_t due_ms, rt_bin_t *bin, rt_pid_t ack_pid,
                          uint64_t token);
void rt_store_delayed_del(uint64_t id);
/* Each delayed message kept, to fn, earliest first, at start. */
int rt_store_load_delayed(void (*fn)(uint64_t id, int64_t due_ms, const void *packet, size_t len,
                                     void *arg),
                          void *arg);

/* The open state.db's path ("" when persistence is off), for backups. */
const char *rt_store_path(void);

/*
** Copies the SQLite database at src_path to the new file dst (mode 0600; written as
** dst.tmp, fsynced, renamed), online: one snapshot of what was committed when the copy
** began, WAL included, while writers carry on. src: a connection of the caller's on that
** file, or NULL to open one of its own (read only). *bytes (if set): the copy's size.
** 0, RT_EEXIST if dst exists (never written over), RT_EINVAL with err. Blocking: call
** from the blocking pool or outside the runtime.
*/
int rt_sqlite_backup(struct sqlite3 *src, const char *src_path, const char *dst, uint64_t *bytes,
                     char *err, size_t errlen);

/* ---- Schema versions (migrate.c) ---- */
#define RT_STORE_SCHEMA 3 /* the PRAGMA user_version this rtd reads and writes */
/* Version 2's table: the banned list (broker/banned.h), kind and value its key. */
#define RT_STORE_BANNED_TABLE                                                                      \
    "CREATE TABLE IF NOT EXISTS banned(kind INTEGER, value BLOB, by TEXT, reason TEXT, "           \
    "  at INTEGER, until INTEGER, PRIMARY KEY(kind, value)) WITHOUT ROWID;"

/* Version 3's: delayed messages (conn/delayed.h), due in Unix milliseconds. */
#define RT_STORE_DELAYED_TABLE                                                                     \
    "CREATE TABLE IF NOT EXISTS delayed(id INTEGER PRIMARY KEY, due INTEGER NOT NULL, "            \
    "  msg BLOB NOT NULL);"

typedef struct rt_store_step_s {
    int version;     /* the schema version the step brings a file to */
    const char *sql; /* its statements; NULL ends a list */
} rt_store_step_t;

/* rtd's steps, oldest first, ending with {0, NULL}; the last one's version is the schema's. */
extern const rt_store_step_t rt__store_steps[];

/*
** Brings the open database db (the file path, at schema version from) to version to with
** the steps of that list from from + 1 on, in one transaction, after a copy of the file
** (its path into backup) is taken. 0, or RT_EINVAL with err: the file is as it was.
*/
int rt__store_migrate(struct sqlite3 *db, const char *path, int from, int to,
                      const rt_store_step_t *steps, char *backup, size_t backuplen, char *err,
                      size_t errlen);

/* An SQLite file of rtd's: what rt__sqlite_check_file expects of it. */
typedef struct rt_sqlite_kind_s {
    const char *what;             /* "rtd state file": what a refusal says the file is not */
    int32_t app_id;               /* its PRAGMA application_id */
    int version;                  /* the schema version (PRAGMA user_version) this rtd writes */
    const char *schema;           /* the statements that make a new file's tables */
    const rt_store_step_t *steps; /* from older versions, as rt__store_steps */
} rt_sqlite_kind_t;

/*
** Refuses an open database db (the file path) that is not kind's healthy file: not a
** database, another application's, damaged (quick_check), or of a newer schema. A new
** empty file gets the application id, the schema version and the tables; an older schema
** is migrated (rt__store_migrate, a copy taken first). 0, or RT_EINVAL / RT_EAGAIN (a new
** file could not be initialised) with why (no path in it). The file is never changed
** otherwise.
*/
int rt__sqlite_check_file(struct sqlite3 *db, const char *path, const rt_sqlite_kind_t *kind,
                          char *why, size_t whylen);

/* Counters for $SYS and rtctl. */
typedef struct {
    uint64_t changes; /* applied */
    uint64_t commits;
    uint64_t failures; /* changes SQLite refused (logged) */
    uint64_t lost;     /* changes sent to a store actor that died before applying them */
} rt_store_stats_t;
void rt_store_stats(rt_store_stats_t *out);

#endif

/*
** XMPP accounts in data_dir/xmpp.db (accounts.h): the file, its schema and versions, and
** the rows' statements.
*/
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "accounts_impl.h"
#include "jid.h"
#include "sqlite_mem.h"
#include "store.h"
#include "xeps.h"

#define ACCOUNTS_APP_ID 0x7274584D /* "rtXM": PRAGMA application_id of xmpp.db */

/* Version 1: the accounts. Never edited: files out there were made by it. */
#define SCHEMA_V1                                                                                  \
    "CREATE TABLE accounts(host TEXT NOT NULL, username TEXT NOT NULL, "                           \
    "  created INTEGER NOT NULL, "                                                                 \
    "  sha1_salt BLOB NOT NULL, sha1_iterations INTEGER NOT NULL, "                                \
    "  sha1_stored_key BLOB NOT NULL, sha1_server_key BLOB NOT NULL, "                             \
    "  sha256_salt BLOB NOT NULL, sha256_iterations INTEGER NOT NULL, "                            \
    "  sha256_stored_key BLOB NOT NULL, sha256_server_key BLOB NOT NULL, "                         \
    "  PRIMARY KEY(host, username)) WITHOUT ROWID;"

/*
** Version 2: rosters and offline messages (roster.c). A roster item's groups are one blob,
** each name followed by a NUL: an item is one row, and a login reads its roster in one
** range of one table. account_counts holds, per account that has had either, the roster's
** version and size and the offline messages' count and bytes, so the bounds are checked
** without counting rows. Offline messages are in order of arrival by seq (a rowid: a new
** one is above every one kept), found by user through offline_by_user.
*/
#define SCHEMA_V2                                                                                  \
    "CREATE TABLE roster(host TEXT NOT NULL, username TEXT NOT NULL, jid TEXT NOT NULL, "          \
    "  name TEXT NOT NULL, groups BLOB NOT NULL, state INTEGER NOT NULL, "                         \
    "  PRIMARY KEY(host, username, jid)) WITHOUT ROWID;"                                           \
    "CREATE TABLE account_counts(host TEXT NOT NULL, username TEXT NOT NULL, "                     \
    "  roster_version INTEGER NOT NULL, roster_items INTEGER NOT NULL, "                           \
    "  offline_count INTEGER NOT NULL, offline_bytes INTEGER NOT NULL, "                           \
    "  PRIMARY KEY(host, username)) WITHOUT ROWID;"                                                \
    "CREATE TABLE offline(seq INTEGER PRIMARY KEY, host TEXT NOT NULL, "                           \
    "  username TEXT NOT NULL, stamp INTEGER NOT NULL, stanza BLOB NOT NULL);"                     \
    "CREATE INDEX offline_by_user ON offline(host, username);"

/*
** Version 3: what XEPs keep per account (xeps.h): the blocklist (XEP-0191), one row per
** blocked JID; the vCard (XEP-0054) as the bytes of its element; the message archive
** (XEP-0313), one row per message and account, its rowid the archive id clients page by,
** found through the account (and the other party's bare JID), and the count each account
** holds, so the retention bound costs one lookup.
*/
#define SCHEMA_V3                                                                                  \
    "CREATE TABLE blocklist(host TEXT NOT NULL, username TEXT NOT NULL, jid TEXT NOT NULL, "       \
    "  PRIMARY KEY(host, username, jid)) WITHOUT ROWID;"                                           \
    "CREATE TABLE vcard(host TEXT NOT NULL, username TEXT NOT NULL, vcard BLOB NOT NULL, "         \
    "  PRIMARY KEY(host, username)) WITHOUT ROWID;"                                                \
    "CREATE TABLE archive(id INTEGER PRIMARY KEY, host TEXT NOT NULL, username TEXT NOT NULL, "    \
    "  with_jid TEXT NOT NULL, stamp INTEGER NOT NULL, stanza BLOB NOT NULL);"                     \
    "CREATE INDEX archive_by_user ON archive(host, username, id);"                                 \
    "CREATE INDEX archive_by_with ON archive(host, username, with_jid, id);"                       \
    "CREATE TABLE archive_counts(host TEXT NOT NULL, username TEXT NOT NULL, "                     \
    "  count INTEGER NOT NULL, PRIMARY KEY(host, username)) WITHOUT ROWID;"

/*
** Version 4: persistent group chat rooms (XEP-0045), keyed as accounts are: the service's
** domain as host, the room's localpart as username. A room's configuration, subject and
** affiliations are one blob the room writes and reads (c2s_muc_room.c): the file only keeps
** it across restarts.
*/
#define SCHEMA_V4                                                                                  \
    "CREATE TABLE muc_rooms(host TEXT NOT NULL, username TEXT NOT NULL, state BLOB NOT NULL, "     \
    "  PRIMARY KEY(host, username)) WITHOUT ROWID;"

/*
** Version 5: PEP (XEP-0163, pep.c). Each account's nodes with their access model and item
** bound, and their items in order of publication (seq, a rowid: a republished id is deleted
** and inserted again, so it is the newest), found by node through pep_items_by_node and by id
** through pep_items_by_id.
*/
#define SCHEMA_V5                                                                                  \
    "CREATE TABLE pep_nodes(host TEXT NOT NULL, username TEXT NOT NULL, node TEXT NOT NULL, "      \
    "  access INTEGER NOT NULL, max_items INTEGER NOT NULL, "                                      \
    "  PRIMARY KEY(host, username, node)) WITHOUT ROWID;"                                          \
    "CREATE TABLE pep_items(seq INTEGER PRIMARY KEY, host TEXT NOT NULL, "                         \
    "  username TEXT NOT NULL, node TEXT NOT NULL, item TEXT NOT NULL, payload BLOB NOT NULL);"    \
    "CREATE UNIQUE INDEX pep_items_by_id ON pep_items(host, username, node, item);"                \
    "CREATE INDEX pep_items_by_node ON pep_items(host, username, node, seq);"

/*
** Version 6: FAST tokens (XEP-0484, fast.c): per account and client (its user-agent id), the
** token in force and the one before it (a client that missed its new token's success still
** has the old one), each with its expiry. The token is the HT mechanism's HMAC key, so it is
** kept as issued (as a password would not be): it is random, bounded in time, one client's
** only, and deleted with a password change.
*/
#define SCHEMA_V6                                                                                  \
    "CREATE TABLE fast_tokens(host TEXT NOT NULL, username TEXT NOT NULL, agent TEXT NOT NULL, "   \
    "  mechanism TEXT NOT NULL, token BLOB NOT NULL, expiry INTEGER NOT NULL, "                    \
    "  prev_token BLOB, prev_expiry INTEGER, "                                                     \
    "  PRIMARY KEY(host, username, agent)) WITHOUT ROWID;"

/*
** Version 7: push notifications (XEP-0357, push.c): the app servers (JID and node) each
** account's clients enabled, with the publish options they gave (the form's bytes, sent back
** with every notification: they carry the app server's secret).
*/
#define SCHEMA_V7                                                                                  \
    "CREATE TABLE push(host TEXT NOT NULL, username TEXT NOT NULL, jid TEXT NOT NULL, "            \
    "  node TEXT NOT NULL, options BLOB, created INTEGER NOT NULL, "                               \
    "  PRIMARY KEY(host, username, jid, node)) WITHOUT ROWID;"

/* A new file's tables: every version's, as a file migrated from version 1 has them. */
static const char schema[] = SCHEMA_V1 SCHEMA_V2 SCHEMA_V3 SCHEMA_V4 SCHEMA_V5 SCHEMA_V6 SCHEMA_V7;

/*
** xmpp.db's steps from older schema versions, oldest first, as actors/store/migrate.c's
** for state.db. Added when the schema changes, never edited after a release.
*/
static const rt_store_step_t steps[] = {
    {2, SCHEMA_V2}, {3, SCHEMA_V3}, {4, SCHEMA_V4}, {5, SCHEMA_V5},
    {6, SCHEMA_V6}, {7, SCHEMA_V7}, {0, NULL},
};

enum {
    ST_ADD,
    ST_PASSWD,
    ST_DEL,
    ST_LIST,
    ST_LIST_HOST,
    ST_GET1,
    ST_GET256,
    ST_COUNT_ROWS,
    ST_BEGIN_WRITE,
    ST_BEGIN_READ,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_N
};
_Static_assert(ST_N <= RT__ACCOUNTS_STMTS, "accounts_impl.h: room for accounts.c's statements");

static const char *const sql[ST_N] = {
    [ST_ADD] = "INSERT INTO accounts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [ST_PASSWD] = "UPDATE accounts SET sha1_salt = ?4, sha1_iterations = ?5, "
                  "sha1_stored_key = ?6, sha1_server_key = ?7, sha256_salt = ?8, "
                  "sha256_iterations = ?9, sha256_stored_key = ?10, sha256_server_key = ?11 "
                  "WHERE host = ?1 AND username = ?2",
    [ST_DEL] = "DELETE FROM accounts WHERE host = ?1 AND username = ?2",
    [ST_LIST] = "SELECT host, username, created FROM accounts ORDER BY host, username",
    [ST_LIST_HOST] = "SELECT host, username, created FROM accounts WHERE host = ?1 "
                     "ORDER BY username",
    [ST_GET1] = "SELECT sha1_salt, sha1_iterations, sha1_stored_key, sha1_server_key "
                "FROM accounts WHERE host = ?1 AND username = ?2",
    [ST_GET256] = "SELECT sha256_salt, sha256_iterations, sha256_stored_key, sha256_server_key "
                  "FROM accounts WHERE host = ?1 AND username = ?2",
    [ST_COUNT_ROWS] = "SELECT count(*) FROM accounts",
    [ST_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [ST_BEGIN_READ] = "BEGIN",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
};

int rt__accounts_db_error(rt_accounts_t *a, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", a->path, sqlite3_errmsg(a->db));
    return RT_EAGAIN;
}

void rt_accounts_close(rt_accounts_t *a)
{
    if (!a)
        return;
    for (int i = 0; i < ST_N; i++)
        sqlite3_finalize(a->st[i]);
    for (int i = 0; i < RT__ROSTER_STMTS; i++)
        sqlite3_finalize(a->rst[i]);
    for (int i = 0; i < RT__XEPS_STMTS; i++)
        sqlite3_finalize(a->xst[i]);
    sqlite3_close(a->db);
    free(a);
}

/*
** A file root creates (`rtd xmpp user` run as root) goes to whoever owns the data
** directory, the user rtd runs as, or rtd could not open it. SQLite gives the -wal and -shm
** files the database's owner.
*/
static void owner_of_dir(const char *dir, const char *path)
{
    struct stat d, f;
    if (geteuid() != 0 || stat(dir, &d) != 0 || stat(path, &f) != 0 || f.st_uid == d.st_uid)
        return;
    if (chown(path, d.st_uid, d.st_gid) != 0)
        return; /* the open below then tells whoever cannot read it */
}

/* Asks for WAL: whether the file is in it now. */
static bool wal_asked(sqlite3 *db)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &s, NULL) != SQLITE_OK)
        return false;
    bool on = sqlite3_step(s) == SQLITE_ROW &&
              sqlite3_stricmp((const char *)sqlite3_column_text(s, 0), "wal") == 0;
    sqlite3_finalize(s);
    return on;
}

/*
** WAL, set once in the file's life (the file keeps the mode). Switching a new file needs it
** alone, and SQLite answers "database is locked" at once, without the busy handler, while
** another process reads it (several `rtd xmpp user add` at once on a new file): asked again
** every WAL_RETRY_MS, for RT_ACCOUNTS_BUSY_MS at most, as the busy handler would wait.
*/
#define WAL_RETRY_MS 5
static int wal_on(sqlite3 *db)
{
    for (int waited = 0; !wal_asked(db); waited += WAL_RETRY_MS) {
        if (waited >= RT_ACCOUNTS_BUSY_MS)
            return RT_EAGAIN;
        sqlite3_sleep(WAL_RETRY_MS);
    }
    return 0;
}

int rt_accounts_open(const char *dir, rt_accounts_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create the data directory: %s", dir, strerror(errno));
        return RT_EINVAL;
    }
    rt_accounts_t *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    if ((size_t)snprintf(a->path, sizeof(a->path), "%s/%s", dir, RT_ACCOUNTS_FILE) >=
        sizeof(a->path)) {
        snprintf(err, errlen, "%s: the data directory's path is too long", dir);
        free(a);
        return RT_EINVAL;
    }
    rt_store_create_private(a->path);
    owner_of_dir(dir, a->path);
    rt_sqlite_mem_init();
    int rc = RT_EINVAL;
    if (sqlite3_open_v2(a->path, &a->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", a->path, a->db ? sqlite3_errmsg(a->db) : "cannot open");
        goto fail;
    }
    sqlite3_busy_timeout(a->db, RT_ACCOUNTS_BUSY_MS);
    static const rt_sqlite_kind_t kind = {
        .what = "rtd XMPP accounts file",
        .app_id = ACCOUNTS_APP_ID,
        .version = RT_ACCOUNTS_SCHEMA,
        .schema = schema,
        .steps = steps,
    };
    char why[700];
    if ((rc = rt__sqlite_check_file(a->db, a->path, &kind, why, sizeof(why))) != 0) {
        snprintf(err, errlen, "%s: %s", a->path, why);
        goto fail;
    }
    rc = RT_EAGAIN;
    if (wal_on(a->db) != 0 ||
        sqlite3_exec(a->db, "PRAGMA synchronous = NORMAL;", NULL, NULL, NULL) != SQLITE_OK) {
        rt__accounts_db_error(a, err, errlen);
        goto fail;
    }
    for (int i = 0; i < ST_N; i++)
        if (sqlite3_prepare_v3(a->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &a->st[i], NULL) !=
            SQLITE_OK) {
            rt__accounts_db_error(a, err, errlen);
            goto fail;
        }
    if (rt__roster_prepare(a) != 0 || rt__xeps_prepare(a) != 0) {
        rt__accounts_db_error(a, err, errlen);
        goto fail;
    }
    *out = a;
    return 0;
fail:
    rt_accounts_close(a);
    return rc;
}

int rt__accounts_names(const char *host, const char *user, rt__names_t *n, char *err, size_t errlen)
{
    const char *why;
    if (rt_jid_prep_part(RT_JID_DOMAIN, host, strlen(host), n->host, &n->host_len, &why) ||
        rt_jid_prep_part(RT_JID_LOCAL, user, strlen(user), n->user, &n->user_len, &why)) {
        snprintf(err, errlen, "%s", why);
        return RT_EINVAL;
    }
    return 0;
}

sqlite3_stmt *rt__accounts_keyed(sqlite3_stmt *st, const rt__names_t *n)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    sqlite3_bind_text(st, 1, n->host, (int)n->host_len, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, n->user, (int)n->user_len, SQLITE_STATIC);
    return st;
}

static void bind_cred(sqlite3_stmt *st, int at, const rt_scram_cred_t *c)
{
    int klen = (int)rt_scram_key_len(c->hash);
    sqlite3_bind_blob(st, at, c->salt, c->salt_len, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, at + 1, c->iterations);
    sqlite3_bind_blob(st, at + 2, c->stored_key, klen, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, at + 3, c->server_key, klen, SQLITE_TRANSIENT);
}

/*
** add and passwd: new credentials for both hashes (the slow part, before the database is
** touched), then one statement. changed: the statement changed a row.
*/
static int write_creds(rt_accounts_t *a, int which, const char *host, const char *user,
                       const char *pw, size_t pwlen, uint32_t iterations, bool *changed, char *err,
                       size_t errlen)
{
    rt__names_t n;
    int rc = rt__accounts_names(host, user, &n, err, errlen);
    if (rc)
        return rc;
    if (pwlen > RT_ACCOUNTS_PASSWORD_MAX) {
        snprintf(err, errlen, "the password is over %d bytes", RT_ACCOUNTS_PASSWORD_MAX);
        return RT_EINVAL;
    }
    rt_scram_cred_t c1, c256;
    const char *why = "";
    uint32_t it = iterations ? iterations : RT_SCRAM_ITERATIONS;
    rc = rt_scram_cred_make(RT_SCRAM_SHA1, pw, pwlen, it, &c1, &why);
    if (rc == 0)
        rc = rt_scram_cred_make(RT_SCRAM_SHA256, pw, pwlen, it, &c256, &why);
    if (rc) {
        snprintf(err, errlen, "%s", rc == RT_ENOMEM ? "out of memory" : why);
        return rc;
    }
    sqlite3_stmt *st = rt__accounts_keyed(a->st[which], &n);
    if (which == ST_ADD)
        sqlite3_bind_int64(st, 3, (sqlite3_int64)rt_wall_ms());
    bind_cred(st, 4, &c1);
    bind_cred(st, 8, &c256);
    OPENSSL_cleanse(&c1, sizeof(c1));
    OPENSSL_cleanse(&c256, sizeof(c256));
    int s = sqlite3_step(st);
    *changed = sqlite3_changes(a->db) > 0;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (s == SQLITE_CONSTRAINT) {
        snprintf(err, errlen, "%s@%s exists", n.user, n.host);
        return RT_EEXIST;
    }
    return s == SQLITE_DONE ? 0 : rt__accounts_db_error(a, err, errlen);
}

int rt_accounts_add(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                    size_t pwlen, uint32_t iterations, char *err, size_t errlen)
{
    bool changed;
    return write_creds(a, ST_ADD, host, user, pw, pwlen, iterations, &changed, err, errlen);
}

int rt_accounts_passwd(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                       size_t pwlen, uint32_t iterations, char *err, size_t errlen)
{
    bool changed = false;
    int rc = write_creds(a, ST_PASSWD, host, user, pw, pwlen, iterations, &changed, err, errlen);
    if (rc == 0 && !changed) {
        snprintf(err, errlen, "no account %s@%s", user, host);
        return RT_ENOTFOUND;
    }
    /* What the old password let clients keep goes with it (a failure here leaves tokens to
       their expiry; the password has changed all the same). */
    if (rc == 0)
        rt_fast_del(a, host, user, NULL);
    return rc;
}

int rt_accounts_del(rt_accounts_t *a, const char *host, const char *user,
                    rt_accounts_forgot_fn forgot, void *arg, char *err, size_t errlen)
{
    rt__names_t n;
    int rc = rt__accounts_names(host, user, &n, err, errlen);
    if (rc)
        return rc;
    /* The account and what roster.c keeps for it go together or not at all. */
    if (rt__accounts_begin(a, true) != 0)
        return rt__accounts_db_error(a, err, errlen);
    sqlite3_stmt *st = rt__accounts_keyed(a->st[ST_DEL], &n);
    int s = sqlite3_step(st);
    bool changed = sqlite3_changes(a->db) > 0;
    sqlite3_reset(st);
    if (s != SQLITE_DONE)
        rc = RT_EAGAIN;
    else if (!changed) {
        snprintf(err, errlen, "no account %s@%s", n.user, n.host);
        rc = RT_ENOTFOUND;
    }
    rt__forgot_t *forgotten = NULL;
    size_t nforgotten = 0;
    if (rc == 0 && (rc = rt__roster_forget(a, &n, &forgotten, &nforgotten)) == 0 &&
        (rc = rt__roster_drop(a, &n)) == 0)
        rc = rt__xeps_drop(a, &n);
    if (rc == RT_EAGAIN)
        rt__accounts_db_error(a, err,
                              errlen); /* SQLite's message, before the rollback replaces it */
    int end = rt__accounts_end(a, rc);
    if (end == RT_EAGAIN && rc != RT_EAGAIN)
        rt__accounts_db_error(a, err, errlen);
    if (end == 0 && forgot) {
        char jid[2 * RT_JID_PART_MAX + 2];
        snprintf(jid, sizeof(jid), "%s@%s", n.user, n.host);
        for (size_t i = 0; i < nforgotten; i++)
            forgot(forgotten[i].owner.host, forgotten[i].owner.user, jid, forgotten[i].version,
                   arg);
    }
    free(forgotten);
    return end;
}

/* One of the transaction statements, run to its end and reset. */
static int run(rt_accounts_t *a, int which)
{
    int s = sqlite3_step(a->st[which]);
    sqlite3_reset(a->st[which]);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

int rt_accounts_snapshot(rt_accounts_t *a)
{
    if (a->snapshot)
        return 0;
    a->snapshot = run(a, ST_BEGIN_READ) == 0;
    return a->snapshot ? 0 : RT_EAGAIN;
}

/* Ends the snapshot's read transaction, if a failed statement has not already. */
static void snapshot_close(rt_accounts_t *a)
{
    if (a->snapshot && !sqlite3_get_autocommit(a->db))
        run(a, ST_COMMIT);
    a->snapshot = false;
}

void rt_accounts_snapshot_end(rt_accounts_t *a)
{
    RT_ASSERT(a->reads == 0);
    snapshot_close(a);
}

int rt__accounts_begin(rt_accounts_t *a, bool write)
{
    if (a->snapshot && !write) {
        a->reads++;
        return 0;
    }
    if (a->snapshot)
        snapshot_close(a);
    return run(a, write ? ST_BEGIN_WRITE : ST_BEGIN_READ);
}

int rt__accounts_end(rt_accounts_t *a, int rc)
{
    if (a->reads) { /* a read inside the snapshot: it ends with the snapshot */
        a->reads--;
        return rc;
    }
    if (rc >= 0 && run(a, ST_COMMIT) == 0)
        return rc;
    /* A failed statement may have rolled back already (SQLITE_FULL, SQLITE_IOERR...). */
    if (!sqlite3_get_autocommit(a->db))
        run(a, ST_ROLLBACK);
    return rc >= 0 ? RT_EAGAIN : rc;
}

int rt_accounts_list(rt_accounts_t *a, const char *host,
                     int (*fn)(const char *host, const char *user, int64_t created_ms, void *arg),
                     void *arg, char *err, size_t errlen)
{
    sqlite3_stmt *st = a->st[host ? ST_LIST_HOST : ST_LIST];
    char h[RT_JID_PART_MAX + 1];
    size_t hlen;
    const char *why;
    if (host && rt_jid_prep_part(RT_JID_DOMAIN, host, strlen(host), h, &hlen, &why)) {
        snprintf(err, errlen, "%s", why);
        return RT_EINVAL;
    }
    sqlite3_reset(st);
    if (host)
        sqlite3_bind_text(st, 1, h, (int)hlen, SQLITE_STATIC);
    int s = SQLITE_DONE, rc = 0;
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW)
        rc = fn((const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
                sqlite3_column_int64(st, 2), arg);
    if (rc == 0 && s != SQLITE_DONE)
        rc = rt__accounts_db_error(a, err, errlen);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc;
}

/* The four credential columns of a row into out: false if they do not make credentials. */
static bool read_cred(sqlite3_stmt *st, rt_scram_hash_t hash, rt_scram_cred_t *out)
{
    size_t klen = rt_scram_key_len(hash);
    int salt_len = sqlite3_column_bytes(st, 0);
    sqlite3_int64 it = sqlite3_column_int64(st, 1);
    if (salt_len < 1 || salt_len > RT_SCRAM_SALT_MAX || it < RT_SCRAM_MIN_ITERATIONS ||
        it > RT_SCRAM_MAX_ITERATIONS || (size_t)sqlite3_column_bytes(st, 2) != klen ||
        (size_t)sqlite3_column_bytes(st, 3) != klen)
        return false;
    memset(out, 0, sizeof(*out));
    out->hash = (uint8_t)hash;
    out->salt_len = (uint8_t)salt_len;
    out->iterations = (uint32_t)it;
    memcpy(out->salt, sqlite3_column_blob(st, 0), (size_t)salt_len);
    memcpy(out->stored_key, sqlite3_column_blob(st, 2), klen);
    memcpy(out->server_key, sqlite3_column_blob(st, 3), klen);
    return true;
}

int rt_accounts_get(rt_accounts_t *a, const char *host, const char *user, rt_scram_hash_t hash,
                    rt_scram_cred_t *out)
{
    rt__names_t n;
    char err[RT_ACCOUNTS_ERR_LEN];
    if (rt__accounts_names(host, user, &n, err, sizeof(err)))
        return RT_ENOTFOUND;
    sqlite3_stmt *st = rt__accounts_keyed(a->st[hash == RT_SCRAM_SHA1 ? ST_GET1 : ST_GET256], &n);
    int s = sqlite3_step(st);
    int rc = s == SQLITE_ROW    ? (read_cred(st, hash, out) ? 0 : RT_EINVAL)
             : s == SQLITE_DONE ? RT_ENOTFOUND
                                : RT_EAGAIN;
    sqlite3_reset(st);
    return rc;
}

int rt_accounts_check_password(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                               size_t pwlen)
{
    rt_scram_cred_t c;
    int rc = rt_accounts_get(a, host, user, RT_SCRAM_SHA256, &c);
    if (rc)
        return rc;
    rc = rt_scram_check_password(&c, pw, pwlen);
    return rc == RT_EINVAL ? RT_EACCES : rc; /* no stored password can be one SASLprep refuses */
}

int64_t rt_accounts_count(rt_accounts_t *a)
{
    sqlite3_stmt *st = a->st[ST_COUNT_ROWS];
    sqlite3_reset(st);
    int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    return n;
}

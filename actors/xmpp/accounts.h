/*
** XMPP accounts: one SQLite file of their own, data_dir/xmpp.db (WAL), apart from the
** broker's state.db so that a busy store and a login never wait on each other. One row per
** account: host (a prepared domainpart), username (a prepared localpart), the
** SCRAM-SHA-1 and SCRAM-SHA-256 credentials (scram.h: salt, count, StoredKey, ServerKey;
** never a password) and when it was created; the accounts' rosters and offline messages
** too (roster.h, schema version 2). The file carries an application id and a schema
** version; an older one is migrated at open after a copy is taken, a newer or foreign one
** refused untouched (rt__sqlite_check_file, as state.db).
**
** BLOCKING: every call here does file I/O, and add and passwd also run PBKDF2 twice
** (milliseconds). Call them from an RT_TYPE_BLOCKING actor, a worker thread or outside the
** runtime (`rtd xmpp user`), never from an actor on a scheduler. One rt_accounts_t is
** used by one thread at a time; several (several processes too) may have the file open:
** writers wait for each other up to RT_ACCOUNTS_BUSY_MS.
**
** Names are prepared here (jid.h) whatever the caller passed: "Juliet" and "juliet" are one
** account, as they are one JID.
*/
#ifndef RT_XMPP_ACCOUNTS_H
#define RT_XMPP_ACCOUNTS_H

#include <stddef.h>
#include <stdint.h>

#include "scram.h"

#define RT_ACCOUNTS_FILE "xmpp.db"
#define RT_ACCOUNTS_SCHEMA 7          /* the PRAGMA user_version this rtd reads and writes */
#define RT_ACCOUNTS_BUSY_MS 5000      /* how long a write waits for another writer */
#define RT_ACCOUNTS_PASSWORD_MAX 1023 /* bytes of a password */
#define RT_ACCOUNTS_ERR_LEN 512       /* bytes for an error message */

typedef struct rt_accounts_s rt_accounts_t;

/*
** Opens dir/xmpp.db, creating dir (0700) and the file (0600) if needed. 0 with *out (close
** with rt_accounts_close), or RT_EINVAL / RT_EAGAIN with err ("path: why").
*/
int rt_accounts_open(const char *dir, rt_accounts_t **out, char *err, size_t errlen);
void rt_accounts_close(rt_accounts_t *a);

/*
** Adds user@host with credentials for both hashes, iterations PBKDF2 rounds each (0:
** RT_SCRAM_ITERATIONS). 0; RT_EEXIST; RT_EINVAL (a name that does not prepare, a password
** SASLprep refuses or over RT_ACCOUNTS_PASSWORD_MAX: err says which); RT_EAGAIN (the
** database failed or stayed busy: err).
*/
int rt_accounts_add(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                    size_t pwlen, uint32_t iterations, char *err, size_t errlen);
/* New credentials for an existing account (new salts too): as add, RT_ENOTFOUND for none. */
int rt_accounts_passwd(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                       size_t pwlen, uint32_t iterations, char *err, size_t errlen);
/*
** Told, once rt_accounts_del has committed, of each item of another account of this file
** (host, user) that named the removed account (jid): it has no subscription left, or is gone
** (it held only the removed account's request); version is that roster's new version.
*/
typedef void (*rt_accounts_forgot_fn)(const char *host, const char *user, const char *jid,
                                      uint64_t version, void *arg);
/* 0, RT_ENOTFOUND, RT_EINVAL, RT_EAGAIN as above; forgot (may be NULL) as said above. */
int rt_accounts_del(rt_accounts_t *a, const char *host, const char *user,
                    rt_accounts_forgot_fn forgot, void *arg, char *err, size_t errlen);

/*
** Calls fn for each account of host (NULL: of every host), by host then user name; fn
** returns 0 to go on, anything else to stop (rt_accounts_list then returns it). created_ms:
** unix milliseconds. 0, RT_EINVAL, RT_EAGAIN.
*/
int rt_accounts_list(rt_accounts_t *a, const char *host,
                     int (*fn)(const char *host, const char *user, int64_t created_ms, void *arg),
                     void *arg, char *err, size_t errlen);

/*
** A login's credentials: user@host's for hash. 0; RT_ENOTFOUND (no such account, or a
** name that cannot be one's: both are "no such user" to a client); RT_EINVAL (the row
** holds no usable credentials: a damaged or hand-edited file); RT_EAGAIN (database).
*/
int rt_accounts_get(rt_accounts_t *a, const char *host, const char *user, rt_scram_hash_t hash,
                    rt_scram_cred_t *out);

/*
** A PLAIN login: whether pw is user@host's password (rt_scram_check_password on the
** SHA-256 credentials: PBKDF2 again). 0, RT_EACCES (wrong password), or as
** rt_accounts_get.
*/
int rt_accounts_check_password(rt_accounts_t *a, const char *host, const char *user, const char *pw,
                               size_t pwlen);

/* Accounts in the file. */
int64_t rt_accounts_count(rt_accounts_t *a);

/*
** One read transaction for the calls made until rt_accounts_snapshot_end: the reads inside it
** share one snapshot and one WAL read lock (a pair of fcntl calls per transaction), and a call
** that writes ends the snapshot first and takes its own transaction, as it would without.
** Not nested: with one open already, that one goes on. 0, or RT_EAGAIN (then the calls run as
** they would without).
*/
int rt_accounts_snapshot(rt_accounts_t *a);
void rt_accounts_snapshot_end(rt_accounts_t *a);

/*
** `rtd xmpp user add|passwd|del|list ...`: argv[0] is "xmpp". The data directory is -d DIR,
** or the data_dir of the configuration file -c FILE (default_config without -c), or
** default_data_dir when that file does not set it (NULL: the settings' default). Returns
** the exit status.
*/
int rt_xmpp_main(int argc, char **argv, const char *default_config, const char *default_data_dir);

#endif

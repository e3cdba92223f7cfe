/*
** Document storage of rt_mongo_test in SQLite. The catalog table
** mt_collections names each (db, collection) pair; documents of collection n
** live in table c<n> as BSON blobs, ordered by rowid (insertion order), with
** the canonical _id key (mt_id_key) under a UNIQUE index.
*/
#ifndef MT_STORE_H
#define MT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT_ESTORE (-5) /* SQLite failed; mt_store_errmsg says why */

typedef struct mt_store mt_store_t;
typedef struct mt_coll mt_coll_t; /* owned by the store; valid until dropped or closed */

/* Opens (creating if needed) the database at path, or an in-memory one if path is NULL. */
int mt_store_open(mt_store_t **out, const char *path);
void mt_store_close(mt_store_t *st);
/* The last SQLite error message, or the reason mt_store_open failed if st is NULL. */
const char *mt_store_errmsg(const mt_store_t *st);

int mt_store_begin(mt_store_t *st);
int mt_store_commit(mt_store_t *st);
/* Rolls back and forgets cached collections, since a rolled-back CREATE TABLE is gone. */
void mt_store_rollback(mt_store_t *st);

/* Finds a collection: 0, or RT_ENOTFOUND when it does not exist and create is false. */
int mt_store_coll(mt_store_t *st, const char *db, const char *name, bool create, mt_coll_t **out);

/* Stores one document; RT_EEXIST if its _id key is taken. */
int mt_store_insert(mt_store_t *st, mt_coll_t *c, const uint8_t *key, size_t klen,
                    const uint8_t *doc, size_t len);

/*
** Calls fn for each document (only the one with this key if key is not NULL)
** in insertion order, or in reverse if reverse. fn returns 0 to go on, 1 to
** stop, or a negative code that the scan returns. doc is valid during the call.
*/
typedef int (*mt_scan_fn)(void *ctx, int64_t seq, const uint8_t *doc, size_t len);
int mt_store_scan(mt_store_t *st, mt_coll_t *c, const uint8_t *key, size_t klen, bool reverse,
                  mt_scan_fn fn, void *ctx);

int mt_store_delete(mt_store_t *st, mt_coll_t *c, int64_t seq);
/* Drops the collection; c is invalid afterwards. */
int mt_store_drop(mt_store_t *st, mt_coll_t *c);

/* Calls fn with each collection name of db (each database name if db is NULL), sorted. */
typedef int (*mt_name_fn)(void *ctx, const char *name);
int mt_store_names(mt_store_t *st, const char *db, mt_name_fn fn, void *ctx);

#endif

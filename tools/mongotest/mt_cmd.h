/*
** The commands of rt_mongo_test: the CRUD subset mongo-c-driver 1.23 needs,
** plus the fault injection and statistics commands the sink's tests drive.
** Everything runs on the server's one thread, so the state needs no locks.
*/
#ifndef MT_CMD_H
#define MT_CMD_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_store.h"

#define MT_WIRE_VERSION 13        /* maxWireVersion: MongoDB 5.0 */
#define MT_MAX_WRITE_BATCH 100000 /* maxWriteBatchSize */
#define MT_SESSION_TIMEOUT_MIN 30 /* logicalSessionTimeoutMinutes */
#define MT_DEFAULT_BATCH 101      /* documents in a first batch when batchSize is not given */
#define MT_CURSORS_MAX 1024       /* open cursors; beyond it the least recently used is closed */
#define MT_FAIL_WRITES_CODE 1     /* error code of injected insert failures (InternalError) */

typedef struct mt_cursor mt_cursor_t;

typedef struct mt_state {
    mt_store_t *store;
    mt_cursor_t *cursors; /* open cursors, most recently used first */
    int ncursors;
    int64_t next_cursor_id;

    /* Faults, set by rtFault. */
    int64_t fail_writes;  /* insert commands still to fail */
    int32_t fail_code;    /* error code they fail with */
    int64_t stall_ms;     /* delay of every reply; 0 = none */
    int64_t refuse_until; /* mt_now_ms() before which connections are closed at once */

    /* Counters, reported by rtStats. */
    int64_t conns_current;
    int64_t conns_total;
    int64_t conns_refused;
    int64_t commands;
    int64_t inserted;
    int64_t deleted;
    int64_t writes_failed;
    int64_t protocol_errors;
} mt_state_t;

/* One command's context: what the connection tells the command, and back. */
typedef struct mt_call {
    const char *db;  /* database the command runs against */
    int64_t conn_id; /* connectionId reported by hello */
    bool control;    /* out: this was a fault command; the connection is exempt from refuse */
    bool refuse;     /* out: close every other connection now */
} mt_call_t;

void mt_state_init(mt_state_t *st, mt_store_t *store);
void mt_state_destroy(mt_state_t *st);

/* Runs cmd and writes its reply (ok:1 or ok:0 with errmsg and code) to the empty reply. */
void mt_cmd_run(mt_state_t *st, mt_call_t *call, const bson_t *cmd, bson_t *reply);

/* Monotonic milliseconds. */
int64_t mt_now_ms(void);

#endif

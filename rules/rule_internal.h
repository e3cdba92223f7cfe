/*
** What the rule engine's files share, and nothing outside rules/ sees: the rule set
** (rule_set.c), the hand-over from connections (rule_handover.c), the worker actor
** (rule_worker.c), start, stop and reload (rule_engine.c) and the operator's calls
** (rule_admin.c).
**
** Locks, outermost first: admin (start, reload, stop), then lock (the current set; read
** by every hand-over and admin call, written only to swap sets), then the set list's and
** a rule's metrics' own. Debug builds check who holds the first two
** (rt__rules_holds_admin, rt__rules_holds_read, rt__rules_holds_write).
*/
#ifndef RT_RULE_INTERNAL_H
#define RT_RULE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common.h"
#include "rule_engine.h"
#include "rule_index.h"
#include "sink.h"

/* Worker message tags. */
#define RT_RULES_TAG_WORK (RT_MSG_USER + 0x5210)  /* a message or event to run: rt_rule_work_t */
#define RT_RULES_TAG_FLUSH (RT_MSG_USER + 0x5211) /* submit batches (end of a turn or timer) */
#define RT_RULES_TAG_RESUBMIT (RT_MSG_USER + 0x5212) /* submit again what a dead sink lost */
#define RT_RULES_TAG_FRESH (RT_MSG_USER + 0x5213)    /* a restarted worker's first: a new state */

#define RT_RULES_NONE UINT32_MAX /* no index: no durable entry, no flight slot, no target */
#define RT_RULES_GROUP "rules_sup" /* the workers' supervisor (group.h) */

/* A rule's metrics, shared by the versions of the rule with one name. */
typedef struct rt_rule_metrics_s {
    atomic_uint refs;
    atomic_uint_fast64_t matched, passed, filtered, rows_out;
    atomic_uint_fast64_t failed[3]; /* exception, budget, memory */
    pthread_mutex_t lock;           /* guards last_error */
    char last_error[256];
    /* The operator's word on enabled (rt_rules_enable), kept over reloads by name: -1 none,
       else 0 or 1. Written with the engine's lock read-held, applied by the install with it
       write-held, so an enable and a reload never miss each other. */
    atomic_int override;
    bool file_enabled; /* the file's enabled in the last installed set (admin lock) */
    bool installed;    /* a set holding this rule has been installed (admin lock) */
} rt_rule_metrics_t;

/* Where a rule's rows go: a sink and the options the rule gave it. */
typedef struct rt_rule_target_s {
    rt_sink_t *sink;
    char name[RT_RULE_NAME_MAX];
    rt_bin_t *opts; /* BSON options, or NULL; a reference is handed over per submit */
} rt_rule_target_t;

typedef struct rt_rule_s {
    char name[RT_RULE_NAME_MAX];
    char *path, *text; /* the file, owned (the vms read it) */
    size_t len;
    atomic_bool enabled;
    bool file_enabled; /* what the file says; enabled may differ by the operator's word */
    bool durable;
    char from[256], to[256]; /* for the snapshot */
    uint32_t targets[RT_RULE_MAX_TO];
    uint32_t ntargets;
    char missing_sink[RT_RULE_NAME_MAX]; /* a disabled rule's sink that is not running */
    rt_rule_metrics_t *m;
} rt_rule_t;

/*
** One version of the rule set. Immutable once installed but for each rule's enabled; shared by
** reference: the engine's current pointer, each message in flight and each worker hold one.
*/
typedef struct rt_rule_set_s {
    atomic_uint refs;
    uint64_t version;
    rt_rule_t *rules;
    uint32_t nrules;
    rt_rule_index_t *topics;           /* topic filter -> rule indices */
    uint32_t *events[RT_RULE_NEVENTS]; /* per event kind: rule indices */
    uint32_t nevents[RT_RULE_NEVENTS];
    rt_rule_target_t *targets;
    uint32_t ntargets;
    uint32_t wants;     /* bit 0: some rule reads topics; bit k: some rule reads event k */
    rt_rule_vm_t **vms; /* one per worker */
    unsigned nvms;
    struct rt_rule_set_s *next, *prev; /* every live set, for the final cleanup */
} rt_rule_set_t;

/* A worker's counters, read by the admin from any thread; each on its own cache line. */
typedef struct rt_rule_worker_stats_s {
    _Alignas(RT_CACHE_LINE) _Atomic rt_pid_t pid; /* its current incarnation (each start sets) */
    atomic_uint_fast64_t messages, batches, pending_durable;
    _Atomic size_t c_bytes;
    char name[24]; /* "rule_worker:<i>", its registered name (its supervisor keeps it) */
    _Atomic size_t lua_bytes; /* of the state it holds, as last charged to it */
} rt_rule_worker_stats_t;

/* The strings of a hand-over, in this order after the rule indices. */
enum {
    RT_RULE_STR_CLIENTID,
    RT_RULE_STR_USERNAME,
    RT_RULE_STR_PEER,
    RT_RULE_STR_TOPIC,
    RT_RULE_STR_REASON,
    RT_RULE_STR_FROM_CLIENTID,
    RT_RULE_STR_FROM_USERNAME,
    RT_RULE_STR_PROTOCOL,
    RT_RULE_STR_FROM,
    RT_RULE_STR_TO,
    RT_RULE_STR_TYPE,
    RT_RULE_STR_BODY,
    RT_RULE_NSTRS
};

/* A RT_RULES_TAG_WORK message's data: the matched rules and what an event carries. */
typedef struct rt_rule_work_s {
    rt_rule_set_t *set; /* a reference, released by the worker */
    rt_pid_t ack_pid;   /* durable acknowledgement to, or 0 */
    uint64_t ack_token;
    uint64_t ts_ms;
    int32_t reason_code;
    int16_t event; /* 0: a PUBLISH; else rt_rule_event_kind_t */
    int8_t qos, proto_ver, clean_start;
    int32_t keepalive;
    uint32_t nrules;
    uint32_t slen[RT_RULE_NSTRS]; /* UINT32_MAX: NULL */
    uint32_t rules[];             /* then the strings, each NUL-terminated */
} rt_rule_work_t;

/* The engine: one per process (rule_engine.c). */
typedef struct rt_rules_engine_s {
    atomic_bool running;
    atomic_uint wants; /* the current set's wants: lets publish skip the lock when no rule cares */
    pthread_rwlock_t lock; /* guards cur and workers; writers preferred, so a reload is not
                              starved by traffic; take it with rt__rules_lock_* */
    rt_rule_set_t *cur;    /* current set (one reference), or NULL */
    pthread_mutex_t admin; /* serialises start, reload, stop; take it with rt__rules_admin_* */
    uint64_t version;
    unsigned nworkers;
    rt_rule_worker_stats_t *workers;
    rt_pid_t sup; /* the supervisor the workers' group runs under (0: none) */
    size_t memory;
    long instructions;
    long call_ms;        /* rule_call_ms */
    long output_rows;    /* rule_output_rows */
    size_t output_bytes; /* rule_output_bytes */
    uint64_t flush_ms;   /* rule_flush_ms: how long a partial batch waits; 0 = end of turn */
    uint64_t turn_us;    /* rule_turn_us: a worker's turn ends once it has run this long */
    char dir[256];
    const rt_conf_t *checking; /* rt_rules_check: sinks are the enabled ones of this config,
                                  none of which runs; NULL otherwise */
} rt_rules_engine_t;

extern rt_rules_engine_t rt__rules;

/* rule_engine.c: the engine's locks. A thread takes the read lock at most once (the lock
   prefers writers: a second read lock behind a waiting writer would never be granted). */
void rt__rules_admin_lock(void);
void rt__rules_admin_unlock(void);
void rt__rules_lock_read(void);
void rt__rules_lock_write(void);
void rt__rules_unlock(void);
#ifndef NDEBUG
/* Whether this thread holds that lock: for RT_ASSERT, so debug builds only. */
bool rt__rules_holds_admin(void);
bool rt__rules_holds_read(void);
bool rt__rules_holds_write(void);
#endif
/* The current set with the lock read-held (release it with rt__rules_unlock), or NULL and
   unlocked when the engine is not running. */
rt_rule_set_t *rt__rules_lock_current(void);
/* The current set with a reference of the caller's, or NULL. */
rt_rule_set_t *rt__rules_current(void);

/* rule_set.c */
/* Loads every rule file of dir into a new set; prev (NULL at start) lends its metrics by
   name, and only at start may dir be missing. Called with admin held. */
int rt__rule_set_build(const char *dir, rt_rule_set_t *prev, rt_rule_set_t **out, char *err,
                       size_t errlen);
rt_rule_set_t *rt__rule_set_retain(rt_rule_set_t *s);
void rt__rule_set_release(rt_rule_set_t *s); /* NULL is fine */
/* Frees every set still alive; only once no worker is left to read one. */
void rt__rule_set_free_all(void);
/* Bytes held by the Lua states of every set alive; called with the engine's lock held (a
   restarted worker replaces its state in the current set under it). */
size_t rt__rule_sets_lua_bytes(void);
rt_rule_t *rt__rule_set_find(rt_rule_set_t *s, const char *name);
/* A Lua state with rtd.conf's limits. */
int rt__rule_vm_configured(rt_rule_vm_t **out);
/* A fresh Lua state holding every rule of s (from the texts kept in s): 0 or RT_E*, err set. */
int rt__rule_set_vm(const rt_rule_set_t *s, rt_rule_vm_t **out, char *err, size_t errlen);

/* rule_handover.c: answers a durable publish (RT_RULES_MSG_DURABLE). */
void rt__rules_ack_durable(rt_pid_t pid, uint64_t token, int32_t status);

/* rule_worker.c */
extern const rt_actor_type_t rt__rule_worker_type; /* arg: the worker's index */

#endif

/*
** The rule engine: Lua rules that pick MQTT messages and broker events, reshape
** them into rows and hand the rows to sinks (actors/sink.h).
**
** A rule is a file in rules_dir (etc/rules/NAME.lua) that returns a table:
**
**   return {
**     name = "archive",                     -- unique; A-Z a-z 0-9 _ - . (63 max)
**     from = { "sensors/#", "client.connected" },  -- topic filters and/or events
**     select = function(msg, ctx)           -- nil: filtered out; a row (table);
**       return { topic = msg.topic, payload = msg.payload }  -- or a list of rows
**     end,
**     to = { "archive", mongo = { collection = "x" } },  -- sinks, with per-sink options
**     enabled = true,                       -- default true
**     durable = false,                      -- publisher's ack waits for the rows' commit
**     description = "...",                  -- optional
**     sample = { topic = "sensors/1", payload = "{}" },  -- optional, for the dry run
**   }
**
** msg: topic, payload (bytes), qos, retain, clientid, username (if any), peer
** ("ip:port"), timestamp (ms), props (MQTT 5 user properties, name -> value).
** An event: event (its name), clientid, username, peer, timestamp, plus what
** fits: client.connected proto_ver, keepalive, clean_start;
** client.disconnected reason_code, reason; session.subscribed topic (the
** filter), qos; session.unsubscribed topic; message.delivered / acked /
** dropped topic, payload, qos, retain, props, from_clientid, from_username
** (dropped also reason). ctx: a table per rule ({rule = name}) kept between
** calls. Each worker has its own Lua state, so what a rule keeps between calls
** (ctx, its file's locals and globals) exists once per worker: a client's
** messages always reach the same one, but counts across clients are split.
** The sandbox, budgets and library are described in rule_vm.h.
**
** What select returns: nil or false (filtered out), a row, or a list of rows
** (a table whose keys are 1..n and whose first element is a table; {} is an
** empty list: filtered). A row becomes one BSON document: keys are strings
** (integer keys are written as strings); integers are int64, floats double,
** booleans bool, strings UTF-8 strings or, when not valid UTF-8 or holding a NUL, binary;
** json.null is null; a table is an array if its keys are exactly 1..n, else a
** document ({} is an empty document). Anything else (functions, cycles, keys
** of other types) fails the rule with the field named.
**
** Execution: rule_workers (rtd.conf) worker actors, each with one Lua state per
** rule-set version holding every rule; a message goes to the worker picked by a
** hash of its client id, so one client's messages stay in order. A worker
** batches rows per sink (and per-sink options) over its turn and submits each
** batch once. A worker's turn ends early once it has run rules for
** rule_turn_us (rt_yield), so a rule that burns its budget on every message
** delays the connections sharing its scheduler by a few ms, not a whole batch.
** A worker's mailbox is bounded by the runtime's muting (README, "Design
** notes"): past 1,000 messages the worker is overloaded and each connection
** handing it work is parked at the end of the socket event that did (at most
** RT_CONN_ROUTE_BUDGET hand-overs), whatever the connection's own state, a
** client that reads nothing, not even its PUBACKs, included; nothing is
** dropped. The worker itself never waits for a connection (its durable acks go
** unmuted), so it always drains.
** Rules are found through the rule set's own topic index (rule_index.h: one
** walk of the topic's levels whatever the number of rules) and a per-event
** list.
**
** Metrics per rule (carried over reload by name): matched = passed + filtered
** + failed, failed = exception + budget + memory; rows out; the last error.
**
** Threads: rt_rules_publish and rt_rules_event are called by connection actors
** on any scheduler; the admin calls (reload, test, enable, snapshot) from any
** thread, outside or inside actors; start and stop from the main thread.
** rt_rules_reload and rt_rules_test build Lua states (a reload of 1,000 rules
** takes a few hundred ms): call them from a blocking actor (RT_TYPE_BLOCKING) or
** a plain thread, not from an actor on a scheduler.
**
** What rules/ reads of the broker, and all it includes from outside itself:
** the runtime (rt.h, common.h), settings (config.h), the canonical message
** (message.h: a message's topic, properties, payload, QoS, retain and publisher
** are read through rt_message_view, never parsed again; the codec's types come
** with it, and of the codec rules call only mqtt_props_user_next to walk user
** properties), topic syntax (topic.h: a rule's filters, topic.match) and the sink
** interface (sink.h: rt_sink_find, rt_sink_submit and the commit message).
** Nothing from the connection, the admin socket or the broker's routing (no
** topic trie) is included; those layers call in through this header.
**
** Files: rule_set.c (loading a rule set), rule_index.c (its topic index),
** rule_handover.c (rt_rules_publish and rt_rules_event), rule_worker.c (the
** worker actor), rule_engine.c (start, stop, reload), rule_admin.c (enable,
** metrics, test); rule_internal.h is what they share. The Lua side is
** rule_vm.h.
*/
#ifndef RT_RULE_ENGINE_H
#define RT_RULE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "rt.h"
#include "rule_vm.h"

/* Message a durable publish's ack_pid receives: data is rt_rules_durable_t. */
#define RT_RULES_MSG_DURABLE (RT_MSG_USER + 0x5200)

typedef struct rt_rules_durable_s {
    uint64_t token; /* the ack_token given to rt_rules_publish */
    int32_t status; /* 0: every row committed; < 0: a row was dropped (RT_E* from the sink)
                       or a durable rule failed on the message (RT_EINVAL) */
} rt_rules_durable_t;

/* Tunables (defaults; rtd.conf sets rule_workers, rule_instructions, rule_memory,
   rule_flush_ms and rule_turn_us: their defaults, RT_CONF_RULE_FLUSH_MS and
   RT_CONF_RULE_TURN_US, are in config.h). */
#define RT_RULES_BATCH_ROWS 1000           /* rows per sink batch before it is submitted */
#define RT_RULES_BATCH_BYTES (1u << 20)    /* bytes per sink batch before it is submitted */
#define RT_RULES_MAX_FILES 10000           /* rule files in rules_dir */
#define RT_RULES_MAX_FILE_BYTES (1u << 20) /* bytes of one rule file */
#define RT_RULES_STOP_WAIT_MS 2000         /* a stopping worker's time, then it is killed */
/*
** A batch whose sink died before taking it is submitted again every RT_RULES_RESUBMIT_MS
** until the sink's next incarnation takes it (its supervisor restarts it within
** milliseconds), for up to RT_RULES_RESUBMIT_MAX_MS: a sink not back by then is not
** coming (its supervisor gave up, and rtd is stopping), and the rows fail.
*/
#define RT_RULES_RESUBMIT_MS 10
#define RT_RULES_RESUBMIT_MAX_MS 10000

/*
** Loads and validates every *.lua in conf->rules_dir (a missing directory is an
** empty rule set), then starts the workers, permanent children of the group
** supervisor "rules_sup" (group.h) under sup (0: of nobody). A worker that dies is
** started again with a fresh Lua state of the current rule set; a durable
** publish it had not finished is answered RT_ENOPROC, and a batch a dead sink
** never took is submitted again. Call after rt_init and rt_sinks_start, outside
** any actor. Returns 0 or RT_E* with err naming the file and line.
*/
int rt_rules_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen);
/*
** Stops accepting messages, lets the workers finish what they hold (their last
** rows are submitted) and frees everything. Call before rt_sinks_stop and
** rt_shutdown, outside any actor. Safe to call when not started.
*/
void rt_rules_stop(void);
/*
** What rt_rules_start checks of conf's rules, alone (`rtd --check`): every file of
** rules_dir loaded and dry-run with conf's limits, each rule's sinks among conf's enabled
** ones (rt_sinks_check them first); no worker starts. Not while the engine runs
** (RT_EEXIST). Returns 0 with *nrules set, or RT_E* with err as rt_rules_reload's.
*/
int rt_rules_check(const rt_conf_t *conf, size_t *nrules, char *err, size_t errlen);

typedef struct rt_rule_origin_s {
    const char *clientid;
    const char *username; /* may be NULL */
    const char *peer;     /* "ip:port"; may be NULL */
    uint64_t ts_ms;       /* wall clock, ms since the epoch */
} rt_rule_origin_t;

/*
** For every PUBLISH the broker accepts. canonical is its canonical binary (message.h:
** rt_message_new; the engine takes its own reference, the caller keeps its own).
** Returns 0 when no enabled rule matches (one index lookup, no allocation), 1
** when handed to a worker. *promised (if not NULL) says whether a matching rule is
** durable and ack_pid != 0: ack_pid then later receives exactly one
** RT_RULES_MSG_DURABLE with ack_token, once every row made from this message is
** committed (or at once if none was made); if the message could not be handed
** over, that answer comes at once, with the code (RT_ENOPROC: the client's worker
** is being restarted), and 1 is returned all the same. RT_E* (< 0) if a message
** for no durable rule could not be handed over (no memory; the worker is being
** restarted): nothing will be sent.
*/
int rt_rules_publish(const rt_rule_origin_t *o, rt_bin_t *canonical, rt_pid_t ack_pid,
                     uint64_t ack_token, bool *promised);

typedef enum {
    RT_RULE_EV_CLIENT_CONNECTED = 1,
    RT_RULE_EV_CLIENT_DISCONNECTED,
    RT_RULE_EV_SESSION_SUBSCRIBED,
    RT_RULE_EV_SESSION_UNSUBSCRIBED,
    RT_RULE_EV_MESSAGE_DELIVERED,
    RT_RULE_EV_MESSAGE_ACKED,
    RT_RULE_EV_MESSAGE_DROPPED,
    RT_RULE_EV_XMPP_MESSAGE,  /* a message stanza routed (actors/c2s): from, to, type, body */
    RT_RULE_EV_XMPP_PRESENCE, /* a presence broadcast: from, type, status */
} rt_rule_event_kind_t;

/*
** A broker event. The origin is the client the event is about (for message.*
** the receiving client). Fields that do not fit the kind are ignored.
*/
typedef struct rt_rule_event_s {
    rt_rule_event_kind_t kind;
    const char *topic;         /* session.(un)subscribed: the filter */
    int qos;                   /* session.subscribed: granted QoS (-1: none) */
    int reason_code;           /* client.disconnected, message.dropped: MQTT reason code (-1) */
    const char *reason;        /* client.disconnected, message.dropped: short text, or NULL */
    int proto_ver;             /* client.connected: 3, 4 or 5 (-1: none) */
    int keepalive;             /* client.connected: seconds (-1: none) */
    int clean_start;           /* client.connected: 0 or 1 (-1: none) */
    rt_bin_t *canonical;       /* message.*: the message (borrowed; the engine retains it) */
    const char *from_clientid; /* message.*: the publisher, or NULL */
    const char *from_username; /* message.*: or NULL */
    const char *protocol;      /* the client's protocol: NULL for MQTT, "xmpp" */
    const char *from, *to;     /* xmpp.*: JIDs (to may be NULL) */
    const char *type;          /* xmpp.*: the stanza's type, or NULL */
    const char *body;          /* xmpp.message: the body; xmpp.presence: the status; or NULL */
} rt_rule_event_t;

/* Whether some enabled rule takes events of this kind (one atomic load): lets a caller skip
   building the origin and event at all. */
bool rt_rules_wants_event(rt_rule_event_kind_t kind);
/* The same for published messages (rt_rules_publish). */
bool rt_rules_wants_publish(void);
/* Returns 0 when no enabled rule takes this event (no allocation), 1 when handed over. */
int rt_rules_event(const rt_rule_origin_t *o, const rt_rule_event_t *e);

/*
** Loads and validates the whole rule set again (syntax, fields, sinks exist, a
** dry run of every rule) and swaps it in atomically; messages in flight finish
** on the version that took them (rows a worker still batches for the old set
** are submitted to the sinks first, and durable acks still pending are sent
** when their rows commit, whatever the version); metrics carry over by rule
** name. enabled: a rule the operator switched with rt_rules_enable keeps that
** state while its file's `enabled` stays as it was at the last load; a file
** whose `enabled` changed wins (see rt_rules_enable). On error nothing changes
** and err is "path:line: reason" for every kind of failure (syntax, a bad or
** missing field, an unknown sink, a failed dry run); "path: reason" only when
** the file cannot be read.
*/
int rt_rules_reload(char *err, size_t errlen);

/*
** Runs rule `name` of the current set on one sample message (client id
** "rt_rules_test") in a fresh state and returns the rows it would produce as a
** JSON array of documents (MongoDB relaxed extended JSON, which shows exactly
** what the sinks would store: binaries as $binary, and so on) in *json_out
** (free() it). Writes nothing and counts nothing. RT_ENOTFOUND for no such
** rule; RT_EINVAL with err when the rule fails.
*/
int rt_rules_test(const char *name, const char *topic, const void *payload, size_t len, int qos,
                  char **json_out, char *err, size_t errlen);
/* rt_rules_test on an input of the caller's: an event (an XMPP message, say) as the rule
   would get it. */
int rt_rules_test_input(const char *name, const rt_rule_input_t *in, char **json_out, char *err,
                        size_t errlen);

/*
** Enables or disables a rule of the current set; RT_ENOTFOUND if there is none,
** RT_EINVAL to enable a rule whose file disables it and names a sink that is not
** running (such a rule loads, as examples for disabled sinks do; a real error
** for an enabled rule). The switch is the operator's word over the file's: it
** lasts across reloads until the rule's file changes its own `enabled` (then
** the file wins) or rtd restarts (the files are the configuration; nothing is
** written to them), as an EMQX operator who disables a misbehaving rule expects
** it to stay off when someone reloads to deploy another rule.
*/
int rt_rules_enable(const char *name, bool on);

typedef struct rt_rule_info_s {
    char name[RT_RULE_NAME_MAX];
    uint64_t version; /* the rule-set version (1 at start, +1 per reload) */
    bool enabled;
    bool durable;
    bool overridden; /* enabled differs from the file's, by rt_rules_enable */
    char from[256];  /* entries joined by ", " (cut if longer) */
    char to[256];
    uint64_t matched, passed, filtered, failed;
    uint64_t failed_exception, failed_budget, failed_memory;
    uint64_t rows_out;
    char last_error[256];
} rt_rule_info_t;

/* Copies up to max rules' metrics (file name order) into out; returns how many rules there are. */
size_t rt_rules_snapshot(rt_rule_info_t *out, size_t max);

typedef struct rt_rules_worker_info_s {
    rt_pid_t pid;
    uint64_t messages;        /* messages and events handled */
    uint64_t batches;         /* sink submissions */
    uint64_t lua_bytes;       /* bytes held by its Lua state for the current version */
    uint64_t c_bytes;         /* bytes of its row buffers and durable-ack tables */
    uint64_t pending_durable; /* messages waiting for their rows' commit */
} rt_rules_worker_info_t;

/* Copies up to max workers' counters; returns the number of workers. */
size_t rt_rules_workers(rt_rules_worker_info_t *out, size_t max);

/*
** Lua memory: every state of every rule set alive (*all), and of it what the rule workers
** hold and are charged for (*in_workers, part of their ext_bytes); the rest is in sets no
** worker has taken yet, or old ones messages still hold. (The short-lived states that load,
** validate and test rules are in neither.)
*/
void rt_rules_lua_memory(uint64_t *all, uint64_t *in_workers);

/* The current rule set's size and memory (its Lua states, index and file texts). */
typedef struct rt_rules_stats_s {
    uint64_t version;
    uint32_t rules;
    uint32_t workers;
    uint64_t lua_bytes;   /* every Lua state of the set (one per worker) */
    uint64_t index_bytes; /* topic index, event lists, rule and target tables */
    uint64_t text_bytes;  /* rule files kept to rebuild a rule after a memory failure */
} rt_rules_stats_t;

/* 0, or RT_ESHUTDOWN when the engine is not running. */
int rt_rules_stats(rt_rules_stats_t *out);

#endif

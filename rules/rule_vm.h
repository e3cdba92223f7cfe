/*
** One sandboxed Lua 5.4 state holding a whole rule set (rule_set.c makes one
** per rule worker per rule-set version, plus short-lived ones to validate and
** to test). Used by one thread at a time and never re-entered; nothing here
** locks (debug builds check both). The state and its budget are rule_vm.c, the
** sandbox rule_sandbox.c, rows rule_rows.c, loading rule_load.c and the dry run
** rule_dry_run.c.
**
** Memory. The state's lua_Alloc counts every byte it holds (rt_rule_vm_bytes,
** shown per worker in the metrics) and refuses an allocation that would pass
** the cap: the running rule then fails with "not enough memory" and is counted
** as a memory failure. After one, a full collection runs; if the state still
** holds more than half its cap, the failing rule's environment is rebuilt from
** its file (it loses what it kept between calls), so a rule that hoards memory
** cannot starve the others. These bytes come from malloc, not the worker's
** actor heap: that heap is a mark-sweep GC over roots the actor traces, and
** Lua's objects are managed by Lua's own collector, reachable from Lua's
** internals alone. The rule worker holding a state is charged for them
** (rule_worker.c).
**
** CPU. Every call (and every file's top level at load) runs under a hook on
** instruction counts and on function calls: the budget is charged
** RT_RULE_HOOK_SLICE at a time for instructions and RT_RULE_CALL_COST for each
** call, Lua or C (every metamethod or comparator a C function calls is a call).
** The loops of the C libraries rules get (json, topic, string patterns, the
** table functions: lua_lib.h) charge what they touch, in steps, of which
** RT_RULE_STEPS_PER_INSTRUCTION make an instruction. Past the budget the rule
** fails ("instruction budget exceeded", counted as a budget failure).
** The call also has a wall-clock deadline (rt_rule_vm_set_limits) that fires
** from outside the thread (rule_deadline.c): a watchdog thread signals the
** thread at the deadline and the signal sets the hook's count to 1, so the call
** fails ("time limit exceeded", a budget failure too) at its next VM instruction,
** or at the next step a library loop charges, or the next allocation, whatever
** C code it was in. A call ends within RT_RULE_DEADLINE_SLACK_MS of its deadline
** plus the one VM instruction or C call running then; the costliest known is
** Lua's own `<` on two long strings full of NUL bytes (it calls strcoll once per
** NUL: ~8 ms a MiB, so ~0.5 s at the 64 MiB default cap for the pair), which is
** why the table functions compare strings themselves (lua_table.h). Once
** tripped the hook keeps firing every RT_RULE_HOOK_AFTER_BUDGET instructions (1
** after the deadline) and at every call, the allocator refuses to grow
** anything, and the sandbox's pcall and xpcall re-raise budget and memory
** errors, so a rule cannot catch its way out.
**
** Output. The rows of one call are bounded in count and in BSON bytes
** (rt_rule_vm_set_limits); the bytes also count against the memory cap, less
** what the state holds. A call past either fails as a memory failure, so one
** small table repeated in a long list cannot make rows the cap never saw.
**
** Sandbox. Rule code sees only: assert error ipairs next pairs select tonumber
** tostring type rawequal rawget rawlen getmetatable setmetatable rawset pcall
** xpcall _VERSION, the string (without dump), table, math and utf8 libraries,
** json, topic, time (lua_json.h, lua_lib.h) and the Lua library in lua/
** (template). No io, os, require, package, debug, load, loadstring, dofile,
** loadfile, collectgarbage, print or coroutine. Every library table is a
** read-only proxy (writes raise an error; rawset refuses them; getmetatable
** gives false), the string metatable is locked the same way, string.find,
** match, gmatch and gsub are budgeted versions (lua_pattern.h), string.rep is
** guarded against a loop that makes nothing, table.insert, remove, sort and
** concat are rules' own and table.move and unpack are guarded (lua_table.h:
** #t read once, at most RT_LUA_TABLE_OP_MAX elements a call, every element
** charged), json.encode refuses cycles (lua_json.h), setmetatable
** refuses __gc (a finalizer would run outside any budget, in another rule's
** call), and each rule file runs in its own environment table whose reads fall
** through to the shared read-only base, so rules cannot see or break each
** other. _G in a rule is its own environment. Each rule has its own math
** table whose random generator is seeded from the kernel, so one rule's
** math.randomseed says nothing about another's math.random. No value prints
** as an address: tostring (and string.format's %s) of a table, function,
** userdata or thread without __tostring gives its type name, and
** string.format refuses %p.
*/
#ifndef RT_RULE_VM_H
#define RT_RULE_VM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "message.h"
#include "rt.h"

/* Instructions between hook calls once a call's budget is spent (see above). */
#define RT_RULE_HOOK_AFTER_BUDGET 1000
/* Instructions between hook calls while the budget lasts: a call overshoots it by less. */
#define RT_RULE_HOOK_SLICE 1000
/*
** Budget charged per function call. A call into C costs about as much time as
** ten VM instructions, and a C loop calling a C function runs no instruction.
*/
#define RT_RULE_CALL_COST 10
/*
** How late after its deadline a call may end, besides the instruction running then: the
** watchdog thread's wake-up and the signal's delivery, under 5 ms measured with both cores
** busy. On a machine with more runnable threads than cores, add the time the kernel keeps
** either thread waiting for one (no part of the mechanism; the tests bound CPU time).
*/
#define RT_RULE_DEADLINE_SLACK_MS 50
#define RT_RULE_NAME_MAX 64  /* bytes of a rule name, NUL included */
#define RT_RULE_MAX_FROM 64  /* entries in a rule's from */
#define RT_RULE_MAX_TO 16    /* entries in a rule's to */
#define RT_RULE_ROW_DEPTH 32 /* nesting of tables inside a row */
/* Steps charged by C library loops (lua_lib.h) that cost one instruction of the budget. */
#define RT_RULE_STEPS_PER_INSTRUCTION 4

/* The Lua library (the .lua files of lua/), embedded at build time by lua/embed.cmake. */
typedef struct rt_lua_source_s {
    const char *name; /* global it becomes: lua/NAME.lua returns the value of NAME */
    const unsigned char *text;
    size_t len;
} rt_lua_source_t;
extern const rt_lua_source_t rt_lua_sources[];
extern const size_t rt_lua_nsources;

/* The broker events a rule's from can name (index = rt_rule_event_kind_t - 1). */
#define RT_RULE_EVENT_NAMES                                                                        \
    "client.connected", "client.disconnected", "session.subscribed", "session.unsubscribed",       \
        "message.delivered", "message.acked", "message.dropped", "xmpp.message", "xmpp.presence"
#define RT_RULE_NEVENTS 9
/* 1..RT_RULE_NEVENTS for an event name, 0 otherwise. */
int rt_rule_event_kind(const char *name);
const char *rt_rule_event_name(int kind);

/* What a rule's select sees: a message (event NULL) or a broker event. */
typedef struct rt_rule_input_s {
    const char *event; /* NULL for a PUBLISH; the event name otherwise */
    const char *topic; /* may be NULL (events without a topic) */
    size_t topic_len;
    const uint8_t *payload; /* NULL: no payload field */
    size_t payload_len;
    int qos;              /* -1: none */
    int retain;           /* -1: none */
    const char *clientid; /* NULL: none */
    const char *username; /* NULL: none */
    const char *peer;     /* NULL: none */
    uint64_t ts_ms;
    mqtt_str_t props;          /* a message's MQTT 5 property block (rt_message_t.props),
                                  read for its user properties; empty: none */
    int reason_code;           /* -1: none */
    const char *reason;        /* NULL: none */
    const char *from_clientid; /* message.* events: the publisher; NULL: none */
    const char *from_username; /* message.* events; NULL: none */
    int proto_ver;             /* client.connected; -1: none */
    int keepalive;             /* client.connected; -1: none */
    int clean_start;           /* client.connected; -1: none */
    /* The protocol-neutral part: who sent what to whom, for a protocol whose messages are not
       MQTT PUBLISHes (XMPP: JIDs, the stanza's type; its body or status is the payload). */
    const char *protocol;   /* "mqtt" (NULL reads as it), "xmpp" */
    const char *from;       /* xmpp.*: the sender's JID; NULL: none */
    const char *to;         /* xmpp.*: the addressee's JID; NULL: none */
    const char *type;       /* xmpp.*: the stanza's type ("chat", "unavailable"...); NULL: none */
} rt_rule_input_t;

/* A rule file's declarations, as parsed at load. Strings are owned (malloc). */
typedef struct rt_rule_to_s {
    char *sink;
    uint8_t *opts; /* one BSON document, or NULL */
    size_t opts_len;
} rt_rule_to_t;

typedef struct rt_rule_spec_s {
    char name[RT_RULE_NAME_MAX];
    char *from[RT_RULE_MAX_FROM];
    size_t nfrom;
    rt_rule_to_t to[RT_RULE_MAX_TO];
    size_t nto;
    bool enabled;
    bool durable;
} rt_rule_spec_t;

void rt_rule_spec_free(rt_rule_spec_t *s);

typedef enum {
    RT_RULE_PASSED = 0,     /* produced one or more rows */
    RT_RULE_FILTERED,       /* returned nil, false or an empty list */
    RT_RULE_FAIL_EXCEPTION, /* a Lua error, or rows that cannot be stored */
    RT_RULE_FAIL_BUDGET,    /* ran past the instruction budget */
    RT_RULE_FAIL_MEMORY,    /* the state hit its memory cap */
} rt_rule_outcome_t;

typedef struct rt_rule_vm_s rt_rule_vm_t;

/* memory: bytes the state may hold; instructions: budget per call. */
int rt_rule_vm_new(size_t memory, long instructions, rt_rule_vm_t **out);
void rt_rule_vm_free(rt_rule_vm_t *vm);
/*
** What one call may spend besides the budget and the cap: wall-clock ms, rows
** and BSON bytes of rows. A new vm has the rtd.conf defaults (rules/config.h).
*/
void rt_rule_vm_set_limits(rt_rule_vm_t *vm, long call_ms, long output_rows, size_t output_bytes);
size_t rt_rule_vm_bytes(const rt_rule_vm_t *vm); /* any thread */
uint32_t rt_rule_vm_nrules(const rt_rule_vm_t *vm);

/*
** Loads a rule file as the vm's next rule (index rt_rule_vm_nrules() before
** the call) and fills spec. text must outlive the vm (a memory failure reloads
** from it). Returns 0, or RT_EINVAL with err "path:line: reason" (the line
** where Lua or the offending field says; "path: reason" if none is known).
*/
int rt_rule_vm_load(rt_rule_vm_t *vm, const char *path, const char *text, size_t len,
                    rt_rule_spec_t *spec, char *err, size_t errlen);

/*
** Runs rule idx on in and appends the rows it makes to out, as BSON documents
** back to back (*nrows of them). On a failure out is left as it was (without
** oom, which it must not have on entry either) and err says why. Metrics are
** the caller's.
*/
rt_rule_outcome_t rt_rule_vm_run(rt_rule_vm_t *vm, uint32_t idx, const rt_rule_input_t *in,
                                 rt_buf_t *out, uint32_t *nrows, char *err, size_t errlen);

/*
** The load-time dry run: runs rule idx on the sample its file declares
** (`sample = { topic=, payload=, qos=, clientid=, username= }`), where any
** failure is an error, or else on a made-up message (or event) for its first
** from entry with {} as payload, where a Lua error is accepted (the made-up
** message may lack what the rule expects) but running past the budget, the
** memory cap and rows that cannot be stored are errors. Errors name the file
** and line.
*/
int rt_rule_vm_dry_run(rt_rule_vm_t *vm, uint32_t idx, char *err, size_t errlen);

/*
** The line of `field =` in a rule file's text (the first one at a word
** boundary), or 0; for errors about fields that Lua itself cannot place.
*/
int rt_rule_field_line(const char *text, size_t len, const char *field);

#endif

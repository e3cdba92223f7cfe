/*
** What the files of one rule Lua state share (rule_vm.h): the state itself and the budget
** (rule_vm.c), the sandbox (rule_sandbox.c), rows as BSON (rule_rows.c), loading a rule
** file (rule_load.c) and the dry run (rule_dry_run.c). Nothing outside them includes this.
*/
#ifndef RT_RULE_VM_INTERNAL_H
#define RT_RULE_VM_INTERNAL_H

#include <bson/bson.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdatomic.h>

#include "common.h"
#include "rule_vm.h"

/* A rule file a state loaded: its text is kept to rebuild the rule after a memory failure. */
typedef struct rt_rule_file_s {
    const char *path;
    const char *text;
    size_t len;
    char name[RT_RULE_NAME_MAX];
} rt_rule_file_t;

struct rt_rule_vm_s {
    lua_State *L;
    _Atomic size_t bytes;  /* held by L; written by the owning thread only, read by any */
    size_t cap;            /* memory cap, bytes */
    long instructions;     /* budget per call */
    long used;             /* budget spent by the current call: instructions and calls */
    bool armed;            /* a budgeted call is running: the deadline applies */
    atomic_bool fired;     /* its deadline passed (set by the deadline's signal handler) */
    long call_ms;          /* wall-clock limit of a call */
    size_t max_rows;       /* rows one call may return */
    size_t max_bytes;      /* BSON bytes one call's rows may make */
    size_t out_left;       /* BSON bytes the rows being converted may still take */
    bool budget_hit;       /* the budget or the deadline ran out during the current call */
    bool timed_out;        /* it was the deadline */
    bool oom;              /* the allocator refused something during the current call */
    bool row_error;        /* the last failure was in the rows select returned, not in Lua */
    const char *line_of;   /* dry run: the rule file whose failing line to note, or NULL */
    int err_line;          /* dry run: that line (0: none known) */
    size_t steps;          /* string-pattern steps charged during the current call */
    atomic_bool busy;      /* debug builds: a caller is inside (one at a time, not re-entered) */
    rt_rule_file_t *files; /* per rule */
    uint32_t nrules;
    size_t capfiles;
    int rules_ref;   /* registry: i -> the table the rule file returned */
    int selects_ref; /* registry: i -> select function (false once the rule is lost) */
    int ctxs_ref;    /* registry: i -> the rule's ctx table */
    int base_ref;    /* registry: the read-only base environment */
    int frozen_ref;  /* registry: the set of read-only proxies (weak keys) */
    bson_t *row;     /* reused for every row */
};

#define RT_RULE_VM(L) (*(rt_rule_vm_t **)lua_getextraspace(L))

/* rule_vm.c */
/* Marks the state in use: one caller at a time, never re-entered (checked in debug builds);
   its stack is empty between calls. */
void rt__rule_vm_enter(rt_rule_vm_t *vm);
void rt__rule_vm_leave(rt_rule_vm_t *vm);
void rt__rule_vm_arm(rt_rule_vm_t *vm); /* starts a budgeted call: budget, deadline, hook */
void rt__rule_vm_disarm(rt_rule_vm_t *vm);
/* Charges a C library loop's steps (lua_lib.h) to the call's budget; raises past it or once
   the call is out of time. */
void rt__rule_vm_charge(lua_State *L, size_t steps);
/* An error status the sandbox's pcall must not swallow: budget or memory. */
bool rt__rule_vm_must_propagate(lua_State *L, int status);
/* The message on top of the stack is Lua's "not enough memory". */
bool rt__rule_vm_oom_message(lua_State *L, int idx);

/* rule_deadline.c: the wall-clock deadline of a budgeted call, fired from outside. */
/* Starts the watchdog thread and the signal handler once per process: 0 or RT_ENOMEM. */
int rt__rule_deadline_start(void);
/*
** Arms the calling thread's deadline, call_ms from now: at it, L's hook becomes hook with a
** count of 1 and *fired turns true, whatever the thread is running. One armed call per thread.
*/
void rt__rule_deadline_arm(lua_State *L, lua_Hook hook, atomic_bool *fired, long call_ms);
/* Ends it; once this returns, the deadline will not touch the thread. */
void rt__rule_deadline_disarm(void);
/* The calling thread's CPU time (ns) when its last call's deadline fired; 0: it did not. What
   the call ran after it is the mechanism's latency, apart from the watchdog's own wake-up. */
uint64_t rt__rule_deadline_fired_cpu_ns(void);

/* rule_sandbox.c */
/* Builds the read-only base environment; run under lua_pcall (raises on failure). */
int rt__rule_sandbox_open(lua_State *L);
/*
** Gives the environment on top of the stack its own read-only math table, seeded from the
** kernel. Returns a lua_pcall status; on error its message is on top instead.
*/
int rt__rule_sandbox_own_math(lua_State *L);

/* rule_rows.c */
/* Array length if the table at idx has exactly the keys 1..n (n > 0), else 0. */
lua_Integer rt__rule_array_len(lua_State *L, int idx);
/* Appends the table at idx to doc (as an array: keys 0..n-1); false with err set. */
bool rt__rule_bson_table(lua_State *L, int idx, bson_t *doc, bool array, int depth, char *err,
                         size_t errlen);
/* Converts select's result at idx into rows appended to out; none means filtered. */
rt_rule_outcome_t rt__rule_rows_collect(rt_rule_vm_t *vm, int idx, rt_buf_t *out, uint32_t *nrows,
                                        char *err, size_t errlen);

/* rule_load.c */
/*
** Runs rule file idx's chunk in a fresh environment and stores the rule's table, select
** and ctx at idx; spec (may be NULL) gets its declarations. Nonzero with err on error.
*/
int rt__rule_file_run(rt_rule_vm_t *vm, uint32_t idx, rt_rule_spec_t *spec, char *err,
                      size_t errlen);
/*
** Where a Lua message that starts with path ends: at the ':' after it, or NULL when it
** does not start with path ("...<its tail>", Lua's shortening of a long source, counts).
*/
const char *rt__rule_after_path(const char *e, const char *path);

#endif

#include <bson/bson.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common.h"
#include "config.h"
#include "lua_json.h"
#include "lua_lib.h"
#include "lua_pattern.h"
#include "rule_vm.h"

static const char *const event_names[] = {RT_RULE_EVENT_NAMES};

int rt_rule_event_kind(const char *name)
{
    for (int i = 0; i < RT_RULE_NEVENTS; i++)
        if (strcmp(event_names[i], name) == 0)
            return i + 1;
    return 0;
}

const char *rt_rule_event_name(int kind)
{
    return kind >= 1 && kind <= RT_RULE_NEVENTS ? event_names[kind - 1] : NULL;
}

/* ---- Buffers ---- */

int rt_rule_buf_reserve(rt_rule_buf_t *b, size_t n)
{
    if (b->cap - b->len >= n)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap - b->len < n)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return RT_ENOMEM;
    if (b->acct)
        atomic_fetch_add_explicit(b->acct, cap - b->cap, memory_order_relaxed);
    b->p = p;
    b->cap = cap;
    return 0;
}

int rt_rule_buf_append(rt_rule_buf_t *b, const void *p, size_t n)
{
    if (rt_rule_buf_reserve(b, n))
        return RT_ENOMEM;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

void rt_rule_buf_free(rt_rule_buf_t *b)
{
    if (b->acct)
        atomic_fetch_sub_explicit(b->acct, b->cap, memory_order_relaxed);
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void rt_rule_spec_free(rt_rule_spec_t *s)
{
    for (size_t i = 0; i < s->nfrom; i++)
        free(s->from[i]);
    for (size_t i = 0; i < s->nto; i++) {
        free(s->to[i].sink);
        free(s->to[i].opts);
    }
    memset(s, 0, sizeof(*s));
}

/* ---- The state ---- */

typedef struct rule_file_s {
    const char *path;
    const char *text;
    size_t len;
    char name[RT_RULE_NAME_MAX];
} rule_file_t;

struct rt_rule_vm_s {
    lua_State *L;
    _Atomic size_t bytes; /* held by L; written by the owning thread only, read by any */
    size_t cap;           /* memory cap, bytes */
    long instructions;    /* budget per call */
    long used;            /* budget spent by the current call: instructions and calls */
    uint32_t ticks;       /* calls and growing allocations since the clock was last read */
    bool armed;           /* a budgeted call is running: the deadline applies */
    uint64_t deadline_ns; /* CLOCK_MONOTONIC time the current call must end by */
    long call_ms;         /* wall-clock limit of a call */
    size_t max_rows;      /* rows one call may return */
    size_t max_bytes;     /* BSON bytes one call's rows may make */
    size_t out_left;      /* BSON bytes the rows being converted may still take */
    bool budget_hit;      /* the budget or the deadline ran out during the current call */
    bool timed_out;       /* it was the deadline */
    bool oom;             /* the allocator refused something during the current call */
    bool row_error;       /* the last failure was in the rows select returned, not in Lua */
    const char *line_of;  /* dry run: the rule file whose failing line to note, or NULL */
    int err_line;         /* dry run: that line (0: none known) */
    size_t steps;         /* string-pattern steps charged during the current call */
    rule_file_t *files;   /* per rule */
    uint32_t nrules, capfiles;
    int rules_ref;   /* registry: i -> the table the rule file returned */
    int selects_ref; /* registry: i -> select function (false once the rule is lost) */
    int ctxs_ref;    /* registry: i -> the rule's ctx table */
    int base_ref;    /* registry: the read-only base environment */
    int frozen_ref;  /* registry: the set of read-only proxies (weak keys) */
    bson_t *row;     /* reused for every row */
};

#define VM(L) (*(rt_rule_vm_t **)lua_getextraspace(L))

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether the current call's deadline has passed; reads the clock every RT_RULE_CLOCK_EVERY. */
static bool past_deadline(rt_rule_vm_t *vm)
{
    if (++vm->ticks < RT_RULE_CLOCK_EVERY)
        return false;
    vm->ticks = 0;
    if (monotonic_ns() < vm->deadline_ns)
        return false;
    vm->timed_out = vm->budget_hit = true;
    return true;
}

static void *vm_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    rt_rule_vm_t *vm = ud;
    size_t used = atomic_load_explicit(&vm->bytes, memory_order_relaxed);
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        atomic_store_explicit(&vm->bytes, used - old, memory_order_relaxed);
        return NULL;
    }
    if (nsize > old && used - old + nsize > vm->cap) {
        vm->oom = true;
        return NULL;
    }
    /* A C loop that only allocates runs no hook: the clock is read here too. Once the call is
       out of time nothing grows, or Lua's emergency collection would retry and succeed. */
    if (nsize > old && vm->armed && (vm->timed_out || past_deadline(vm)))
        return NULL;
    void *p = realloc(ptr, nsize);
    if (!p) {
        vm->oom = true;
        return NULL;
    }
    atomic_store_explicit(&vm->bytes, used - old + nsize, memory_order_relaxed);
    return p;
}

static void vm_hook(lua_State *L, lua_Debug *ar);
static int note_line(lua_State *L);

/* Starts a budgeted call: its budget, its deadline and the hook. */
static void arm(rt_rule_vm_t *vm)
{
    vm->used = 0;
    vm->ticks = 0;
    vm->budget_hit = vm->timed_out = false;
    vm->deadline_ns = monotonic_ns() + (uint64_t)vm->call_ms * 1000000u;
    vm->armed = true;
    int slice = vm->instructions < RT_RULE_HOOK_SLICE ? (int)vm->instructions : RT_RULE_HOOK_SLICE;
    lua_sethook(vm->L, vm_hook, LUA_MASKCOUNT | LUA_MASKCALL, slice);
}

static void disarm(rt_rule_vm_t *vm)
{
    lua_sethook(vm->L, NULL, 0, 0);
    vm->armed = false;
}

static void vm_hook(lua_State *L, lua_Debug *ar)
{
    rt_rule_vm_t *vm = VM(L);
    if (!vm->budget_hit) {
        if (ar->event == LUA_HOOKCOUNT)
            vm->used +=
                vm->instructions < RT_RULE_HOOK_SLICE ? vm->instructions : RT_RULE_HOOK_SLICE;
        else
            vm->used += RT_RULE_CALL_COST;
        if (vm->used < vm->instructions && !past_deadline(vm))
            return;
        vm->budget_hit = true;
        lua_sethook(L, vm_hook, LUA_MASKCOUNT | LUA_MASKCALL, RT_RULE_HOOK_AFTER_BUDGET);
    } else if (ar->event != LUA_HOOKCOUNT && lua_getinfo(L, "f", ar)) {
        /* The dry run's message handler is called for the very error raised here. */
        bool handler = lua_tocfunction(L, -1) == note_line;
        lua_pop(L, 1);
        if (handler)
            return;
    }
    /* The message is made with the allocator's deadline off: it must not fail for time. */
    vm->armed = false;
    /* Level 0 is the Lua function the hook interrupted; at a call, level 1 is the caller. */
    luaL_where(L, ar->event == LUA_HOOKCOUNT ? 0 : 1);
    if (vm->timed_out)
        lua_pushfstring(L, "time limit of %d ms exceeded", (int)vm->call_ms);
    else
        lua_pushfstring(L, "instruction budget of %d exceeded", (int)vm->instructions);
    lua_concat(L, 2);
    vm->armed = true;
    lua_error(L);
}

/* Charges string-pattern work (lua_pattern.h) to the call's instruction budget. */
static void vm_charge(lua_State *L, size_t steps)
{
    rt_rule_vm_t *vm = VM(L);
    vm->steps += steps;
    if (vm->steps / RT_RULE_STEPS_PER_INSTRUCTION <= (size_t)vm->instructions)
        return;
    vm->budget_hit = true;
    lua_sethook(L, vm_hook, LUA_MASKCOUNT | LUA_MASKCALL, RT_RULE_HOOK_AFTER_BUDGET);
    luaL_error(L, "instruction budget of %d exceeded (in a string pattern)", (int)vm->instructions);
}

static bool is_oom_message(lua_State *L, int idx)
{
    const char *m = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
    return m && strncmp(m, "not enough memory", 17) == 0;
}

/* An error that the sandbox's pcall must not swallow: budget or memory. */
static bool must_propagate(lua_State *L, int status)
{
    rt_rule_vm_t *vm = VM(L);
    return vm->budget_hit || status == LUA_ERRMEM || (vm->oom && is_oom_message(L, -1));
}

static int sb_pcall(lua_State *L)
{
    luaL_checkany(L, 1);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (status != LUA_OK && must_propagate(L, status))
        return lua_error(L);
    lua_pushboolean(L, status == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

static int sb_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 1); /* f */
    lua_copy(L, 2, 1);   /* handler at 1 */
    lua_replace(L, 2);   /* f at 2 */
    int status = lua_pcall(L, n - 2, LUA_MULTRET, 1);
    if (status != LUA_OK && must_propagate(L, status))
        return lua_error(L);
    lua_pushboolean(L, status == LUA_OK);
    lua_replace(L, 1);
    return lua_gettop(L);
}

static bool is_frozen(lua_State *L, int idx)
{
    if (lua_type(L, idx) != LUA_TTABLE)
        return false;
    lua_pushvalue(L, idx);
    bool frozen = lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL;
    lua_pop(L, 1);
    return frozen;
}

static int sb_rawset(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checkany(L, 2);
    luaL_checkany(L, 3);
    if (is_frozen(L, 1))
        return luaL_error(L, "rawset: this table is read-only");
    lua_settop(L, 3);
    lua_rawset(L, 1);
    return 1;
}

static int sb_setmetatable(lua_State *L)
{
    int t = lua_type(L, 2);
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
    if (is_frozen(L, 1))
        return luaL_error(L, "setmetatable: this table is read-only");
    if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
        return luaL_error(L, "cannot change a protected metatable");
    if (t == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: __gc metamethods are not allowed in rules");
        lua_pop(L, 1);
    }
    lua_settop(L, 2);
    lua_setmetatable(L, 1);
    return 1;
}

static int sb_readonly(lua_State *L)
{
    return luaL_error(L, "attempt to change a read-only table");
}

/*
** Replaces the table on top of the stack with a read-only proxy of it: an empty
** table whose reads fall through to the original and whose writes raise; its
** metatable is hidden; sb_rawset and sb_setmetatable refuse it (frozen set at
** registry index `frozen`).
*/
static void freeze(lua_State *L, int frozen)
{
    lua_newtable(L); /* proxy */
    lua_createtable(L, 0, 3);
    lua_pushvalue(L, -3); /* the original */
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, sb_readonly);
    lua_setfield(L, -2, "__newindex");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_remove(L, -2);
    lua_pushvalue(L, -1);
    lua_pushboolean(L, 1);
    lua_rawset(L, frozen);
}

/* Calls the library function in upvalue 1 with every argument; returns what it returns. */
static int call_original(lua_State *L)
{
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

/*
** Library functions whose C loops run a count the caller picks, without
** allocating: the instruction hook never sees them and the memory cap does not
** stop them. string.rep of an empty string loops n times for nothing;
** table.move loops e - f + 1 times; table.insert(t, pos, v) and
** table.remove(t, pos) shift #t - pos elements, and #t may come from __len.
*/
static int sb_rep(lua_State *L)
{
    size_t l, lsep = 0;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || l + lsep == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    return call_original(L);
}

static void check_span(lua_State *L, lua_Integer from, lua_Integer to, const char *fn)
{
    if (to > from && (lua_Unsigned)to - (lua_Unsigned)from >= RT_RULE_TABLE_OP_MAX)
        luaL_error(L, "%s: more than %d elements in one call", fn, RT_RULE_TABLE_OP_MAX);
}

static int sb_move(lua_State *L)
{
    check_span(L, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3), "table.move");
    return call_original(L);
}

static int sb_insert(lua_State *L)
{
    if (lua_gettop(L) == 3)
        check_span(L, luaL_checkinteger(L, 2), luaL_len(L, 1), "table.insert");
    return call_original(L);
}

static int sb_remove(lua_State *L)
{
    if (lua_gettop(L) >= 2 && !lua_isnil(L, 2))
        check_span(L, luaL_checkinteger(L, 2), luaL_len(L, 1), "table.remove");
    return call_original(L);
}

/*
** table.concat(t, sep, i, j) and table.unpack(t, i, j) loop over i..j, and table.sort over
** 1..#t, in C; each element may come from __index (a C function such as rawlen runs no
** instruction) and #t from __len.
*/
static int sb_concat(lua_State *L)
{
    lua_Integer i = luaL_optinteger(L, 3, 1);
    check_span(L, i, lua_isnoneornil(L, 4) ? luaL_len(L, 1) : luaL_checkinteger(L, 4),
               "table.concat");
    return call_original(L);
}

static int sb_unpack(lua_State *L)
{
    lua_Integer i = luaL_optinteger(L, 2, 1);
    check_span(L, i, lua_isnoneornil(L, 3) ? luaL_len(L, 1) : luaL_checkinteger(L, 3),
               "table.unpack");
    return call_original(L);
}

static int sb_sort(lua_State *L)
{
    check_span(L, 1, luaL_len(L, 1), "table.sort");
    return call_original(L);
}

/* The type name, or __tostring's result: luaL_tolstring would print an address. */
static const char *safe_tostring(lua_State *L, int idx)
{
    switch (lua_type(L, idx)) {
    case LUA_TTABLE:
    case LUA_TFUNCTION:
    case LUA_TUSERDATA:
    case LUA_TLIGHTUSERDATA:
    case LUA_TTHREAD:
        if (luaL_getmetafield(L, idx, "__tostring") == LUA_TNIL)
            return lua_pushstring(L, luaL_typename(L, idx));
        lua_pop(L, 1);
    }
    return luaL_tolstring(L, idx, NULL);
}

static int sb_tostring(lua_State *L)
{
    luaL_checkany(L, 1);
    safe_tostring(L, 1);
    return 1;
}

/*
** string.format without addresses: %p is refused, and every argument %s would print through
** luaL_tolstring is converted here first. The directives are walked as lstrlib.c does.
*/
static int sb_format(lua_State *L)
{
    size_t n;
    const char *f = luaL_checklstring(L, 1, &n);
    int arg = 1;
    for (size_t i = 0; i < n; i++) {
        if (f[i] != '%')
            continue;
        if (++i < n && f[i] == '%')
            continue;
        while (i < n && strchr("-+ #0123456789.", f[i]))
            i++;
        if (i == n)
            break; /* the original reports the invalid conversion */
        arg++;
        if (f[i] == 'p')
            return luaL_error(L, "string.format: %%p is not available in rules");
        if (f[i] == 's' && arg <= lua_gettop(L)) {
            safe_tostring(L, arg);
            lua_replace(L, arg);
        }
    }
    return call_original(L);
}

typedef struct {
    const char *lib, *name;
    lua_CFunction fn;
} guard_t;

static const guard_t guards[] = {
    {LUA_STRLIBNAME, "rep", sb_rep},       {LUA_TABLIBNAME, "move", sb_move},
    {LUA_TABLIBNAME, "insert", sb_insert}, {LUA_TABLIBNAME, "remove", sb_remove},
    {LUA_TABLIBNAME, "concat", sb_concat}, {LUA_TABLIBNAME, "unpack", sb_unpack},
    {LUA_TABLIBNAME, "sort", sb_sort},     {LUA_STRLIBNAME, "format", sb_format},
};

/*
** Copies library `name` from the real globals into hidden (at idx), minus
** `except`, with the guards above in place of the originals, frozen.
*/
static void copy_lib(lua_State *L, int hidden, int frozen, const char *name, const char *except)
{
    lua_getglobal(L, name);
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, -3)) {
        if (except && lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), except) == 0) {
            lua_pop(L, 1);
            continue;
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -4);
    }
    for (size_t i = 0; i < sizeof(guards) / sizeof(guards[0]); i++) {
        if (strcmp(guards[i].lib, name) != 0)
            continue;
        lua_getfield(L, -1, guards[i].name);
        lua_pushcclosure(L, guards[i].fn, 1);
        lua_setfield(L, -2, guards[i].name);
    }
    if (strcmp(name, LUA_STRLIBNAME) == 0)
        rt_lua_pattern_install(L, -1, vm_charge);
    freeze(L, frozen);
    lua_setfield(L, hidden, name);
    lua_pop(L, 1);
}

/* Builds the read-only base environment; runs under lua_pcall (raises on failure). */
static int build_base(lua_State *L)
{
    rt_rule_vm_t *vm = VM(L);
    luaL_requiref(L, "_G", luaopen_base, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    lua_settop(L, 0);

    lua_newtable(L); /* 1: the frozen set; weak, as a rule's own math goes with its rule */
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_newtable(L); /* 2: hidden: what the base proxy reads through to */
    int frozen = 1, hidden = 2;
    static const char *const keep[] = {"assert", "error",        "ipairs",   "next",     "pairs",
                                       "select", "tonumber",     "type",     "rawequal", "rawget",
                                       "rawlen", "getmetatable", "_VERSION", NULL};
    for (const char *const *k = keep; *k; k++) {
        lua_getglobal(L, *k);
        lua_setfield(L, hidden, *k);
    }
    lua_pushcfunction(L, sb_tostring);
    lua_setfield(L, hidden, "tostring");
    lua_pushcfunction(L, sb_pcall);
    lua_setfield(L, hidden, "pcall");
    lua_pushcfunction(L, sb_xpcall);
    lua_setfield(L, hidden, "xpcall");
    lua_pushvalue(L, frozen);
    lua_pushcclosure(L, sb_rawset, 1);
    lua_setfield(L, hidden, "rawset");
    lua_pushvalue(L, frozen);
    lua_pushcclosure(L, sb_setmetatable, 1);
    lua_setfield(L, hidden, "setmetatable");
    copy_lib(L, hidden, frozen, LUA_STRLIBNAME, "dump");
    copy_lib(L, hidden, frozen, LUA_TABLIBNAME, NULL);
    copy_lib(L, hidden, frozen, LUA_MATHLIBNAME, NULL);
    copy_lib(L, hidden, frozen, LUA_UTF8LIBNAME, NULL);
    rt_lua_json_open(L);
    freeze(L, frozen);
    lua_setfield(L, hidden, "json");
    rt_lua_topic_open(L);
    freeze(L, frozen);
    lua_setfield(L, hidden, "topic");
    rt_lua_time_open(L);
    freeze(L, frozen);
    lua_setfield(L, hidden, "time");

    /* Strings' methods come from the read-only string proxy; getmetatable("") gives false. */
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    lua_getfield(L, hidden, LUA_STRLIBNAME);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 2);

    /* The Lua library, in name order; each file sees the C libraries and the earlier files. */
    for (size_t i = 0; i < rt_lua_nsources; i++) {
        const rt_lua_source_t *src = &rt_lua_sources[i];
        char chunk[96];
        snprintf(chunk, sizeof(chunk), "=lua/%s.lua", src->name);
        if (luaL_loadbufferx(L, (const char *)src->text, src->len, chunk, "t") != LUA_OK)
            return lua_error(L);
        lua_newtable(L);
        lua_newtable(L);
        lua_pushvalue(L, hidden);
        lua_setfield(L, -2, "__index");
        lua_setmetatable(L, -2);
        lua_setupvalue(L, -2, 1);
        arm(vm);
        lua_call(L, 0, 1);
        disarm(vm);
        if (lua_type(L, -1) == LUA_TTABLE)
            freeze(L, frozen);
        lua_setfield(L, hidden, src->name);
    }

    lua_pushvalue(L, hidden);
    freeze(L, frozen);
    vm->base_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    vm->rules_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    vm->selects_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    vm->ctxs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, frozen);
    vm->frozen_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    return 0;
}

int rt_rule_vm_new(size_t memory, long instructions, rt_rule_vm_t **out)
{
    rt_rule_vm_t *vm = calloc(1, sizeof(*vm));
    if (!vm)
        return RT_ENOMEM;
    vm->cap = memory;
    vm->instructions = instructions > 0 ? instructions : 1;
    rt_rule_vm_set_limits(vm, RT_CONF_RULE_CALL_MS, RT_CONF_RULE_OUTPUT_ROWS,
                          RT_CONF_RULE_OUTPUT_BYTES);
    vm->row = bson_new();
    vm->L = lua_newstate(vm_alloc, vm);
    if (!vm->L || !vm->row) {
        rt_rule_vm_free(vm);
        return RT_ENOMEM;
    }
    VM(vm->L) = vm;
    /* Generational mode suits the workload: one short-lived message table per call. */
    lua_gc(vm->L, LUA_GCGEN, 0, 0);
    lua_pushcfunction(vm->L, build_base);
    if (lua_pcall(vm->L, 0, 0, 0) != LUA_OK) {
        rt_rule_vm_free(vm);
        return RT_ENOMEM;
    }
    *out = vm;
    return 0;
}

void rt_rule_vm_free(rt_rule_vm_t *vm)
{
    if (!vm)
        return;
    if (vm->L)
        lua_close(vm->L);
    if (vm->row)
        bson_destroy(vm->row);
    free(vm->files);
    free(vm);
}

void rt_rule_vm_set_limits(rt_rule_vm_t *vm, long call_ms, long output_rows, size_t output_bytes)
{
    vm->call_ms = call_ms > 0 ? call_ms : 1;
    vm->max_rows = output_rows > 0 ? (size_t)output_rows : 1;
    vm->max_bytes = output_bytes;
}

size_t rt_rule_vm_bytes(const rt_rule_vm_t *vm)
{
    return atomic_load_explicit(&((rt_rule_vm_t *)vm)->bytes, memory_order_relaxed);
}

uint32_t rt_rule_vm_nrules(const rt_rule_vm_t *vm)
{
    return vm->nrules;
}

/* ---- Lua values to BSON ---- */

/* Array length if the table at idx has exactly the keys 1..n (n > 0), else 0. */
static lua_Integer array_len(lua_State *L, int idx)
{
    lua_Integer count = 0, max = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
            lua_pop(L, 1);
            return 0;
        }
        if (lua_tointeger(L, -1) > max)
            max = lua_tointeger(L, -1);
        count++;
    }
    return count > 0 && max == count ? count : 0;
}

static bool bson_table(lua_State *L, int idx, bson_t *doc, bool array, int depth, char *err,
                       size_t errlen);

/*
** Takes n bytes of what the rows may still make (a little more than the BSON they become:
** a value's type, key and fixed part are charged as klen + 16). False with err set once
** they would pass it; out_left is then 0.
*/
static bool take_out(lua_State *L, size_t n, char *err, size_t errlen)
{
    rt_rule_vm_t *vm = VM(L);
    if (n < vm->out_left) {
        vm->out_left -= n;
        return true;
    }
    vm->out_left = 0;
    snprintf(err, errlen,
             "rows larger than rule_output_bytes (%zu) or than what rule_memory has left",
             vm->max_bytes);
    return false;
}

/* Appends the value at idx under key; false with err set if it cannot be stored. */
static bool bson_value(lua_State *L, int idx, bson_t *doc, const char *key, int klen, int depth,
                       char *err, size_t errlen)
{
    idx = lua_absindex(L, idx);
    if (!take_out(L, (size_t)klen + 16, err, errlen))
        return false;
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            return bson_append_int64(doc, key, klen, (int64_t)lua_tointeger(L, idx));
        return bson_append_double(doc, key, klen, lua_tonumber(L, idx));
    case LUA_TBOOLEAN:
        return bson_append_bool(doc, key, klen, lua_toboolean(L, idx));
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (n > INT32_MAX - 64) {
            snprintf(err, errlen, "field \"%s\": string too long", key);
            return false;
        }
        if (!take_out(L, n, err, errlen))
            return false;
        /* Text is UTF-8 without NUL: BSON readers (bson_validate in the sinks, MongoDB)
           refuse a string holding a NUL, so such bytes go as binary, like non-UTF-8. */
        if (rt_utf8_valid(s, n) && !memchr(s, 0, n))
            return bson_append_utf8(doc, key, klen, s, (int)n);
        return bson_append_binary(doc, key, klen, BSON_SUBTYPE_BINARY, (const uint8_t *)s,
                                  (uint32_t)n);
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL)
            return bson_append_null(doc, key, klen);
        break;
    case LUA_TTABLE: {
        if (depth >= RT_RULE_ROW_DEPTH) {
            snprintf(err, errlen, "field \"%s\": nested too deeply (or a cycle)", key);
            return false;
        }
        bool array = array_len(L, idx) > 0;
        bson_t child;
        bool ok = array ? bson_append_array_begin(doc, key, klen, &child)
                        : bson_append_document_begin(doc, key, klen, &child);
        if (!ok) {
            snprintf(err, errlen, "field \"%s\": document too large", key);
            return false;
        }
        ok = bson_table(L, idx, &child, array, depth + 1, err, errlen);
        if (array)
            bson_append_array_end(doc, &child);
        else
            bson_append_document_end(doc, &child);
        return ok;
    }
    }
    snprintf(err, errlen, "field \"%s\": cannot store a %s", key, luaL_typename(L, idx));
    return false;
}

static bool bson_table(lua_State *L, int idx, bson_t *doc, bool array, int depth, char *err,
                       size_t errlen)
{
    idx = lua_absindex(L, idx);
    if (!lua_checkstack(L, 4)) {
        snprintf(err, errlen, "nested too deeply");
        return false;
    }
    if (array) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
        for (lua_Integer i = 1; i <= n; i++) {
            char key[24];
            int klen = snprintf(key, sizeof(key), "%lld", (long long)(i - 1));
            lua_rawgeti(L, idx, i);
            bool ok = bson_value(L, -1, doc, key, klen, depth, err, errlen);
            lua_pop(L, 1);
            if (!ok)
                return false;
        }
        return true;
    }
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        char num[24];
        const char *key;
        size_t klen;
        if (lua_type(L, -2) == LUA_TSTRING) {
            key = lua_tolstring(L, -2, &klen);
            if (klen == 0 || memchr(key, 0, klen) || !rt_utf8_valid(key, klen) || klen > 1024) {
                snprintf(err, errlen, "a field name must be 1-1024 bytes of UTF-8 without NUL");
                lua_pop(L, 2);
                return false;
            }
        } else if (lua_isinteger(L, -2)) {
            klen = (size_t)snprintf(num, sizeof(num), "%lld", (long long)lua_tointeger(L, -2));
            key = num;
        } else {
            snprintf(err, errlen, "field names must be strings (got a %s)", luaL_typename(L, -2));
            lua_pop(L, 2);
            return false;
        }
        if (!bson_value(L, -1, doc, key, (int)klen, depth, err, errlen)) {
            if (!*err)
                snprintf(err, errlen, "field \"%s\": document too large", key);
            lua_pop(L, 2);
            return false;
        }
        lua_pop(L, 1);
    }
    return true;
}

/* Converts the row table at idx into BSON appended to out. */
static bool row_to_bson(rt_rule_vm_t *vm, int idx, rt_rule_buf_t *out, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    if (lua_type(L, idx) != LUA_TTABLE) {
        snprintf(err, errlen, "a row must be a table (got a %s)", luaL_typename(L, idx));
        return false;
    }
    bson_reinit(vm->row);
    err[0] = 0;
    if (!bson_table(L, idx, vm->row, false, 0, err, errlen)) {
        if (!err[0])
            snprintf(err, errlen, "row too large");
        return false;
    }
    if (rt_rule_buf_append(out, bson_get_data(vm->row), vm->row->len)) {
        snprintf(err, errlen, "out of memory for rows");
        return false;
    }
    return true;
}

/* ---- Loading ---- */

int rt_rule_field_line(const char *text, size_t len, const char *field)
{
    size_t fl = strlen(field);
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\n') {
            line++;
            continue;
        }
        if (i + fl > len || memcmp(text + i, field, fl) != 0)
            continue;
        bool left = i == 0 || !(text[i - 1] == '_' || text[i - 1] == '.' ||
                                (text[i - 1] >= 'a' && text[i - 1] <= 'z') ||
                                (text[i - 1] >= 'A' && text[i - 1] <= 'Z') ||
                                (text[i - 1] >= '0' && text[i - 1] <= '9'));
        size_t j = i + fl;
        while (j < len && (text[j] == ' ' || text[j] == '\t'))
            j++;
        if (left && j < len && text[j] == '=' && (j + 1 >= len || text[j + 1] != '='))
            return line;
    }
    return 0;
}

/*
** The line of the file's last `return` that starts a line (the rule table's own, in a file
** written the usual way), or 1: where an error about a field the table lacks points.
*/
static int return_line(const char *text, size_t len)
{
    int line = 1, found = 1;
    for (size_t i = 0; i < len; i++) {
        bool start = i == 0 || text[i - 1] == '\n';
        if (start && i + 6 <= len && memcmp(text + i, "return", 6) == 0 &&
            (i + 6 == len || !(text[i + 6] == '_' || (text[i + 6] >= 'a' && text[i + 6] <= 'z') ||
                               (text[i + 6] >= 'A' && text[i + 6] <= 'Z') ||
                               (text[i + 6] >= '0' && text[i + 6] <= '9'))))
            found = line;
        if (text[i] == '\n')
            line++;
    }
    return found;
}

/* Writes "path:line: " and the reason; the line of `field =`, or of the table's return. */
static int field_error(const rule_file_t *f, const char *field, char *err, size_t errlen,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int field_error(const rule_file_t *f, const char *field, char *err, size_t errlen,
                       const char *fmt, ...)
{
    int line = field ? rt_rule_field_line(f->text, f->len, field) : 0;
    if (!line)
        line = return_line(f->text, f->len);
    int n = snprintf(err, errlen, "%s:%d: ", f->path, line);
    if (n < 0 || (size_t)n >= errlen)
        return RT_EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return RT_EINVAL;
}

static bool valid_name(const char *s, size_t n)
{
    if (n == 0 || n >= RT_RULE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Parses one `from` entry at the top of the stack into spec. */
static int parse_from_entry(lua_State *L, const rule_file_t *f, rt_rule_spec_t *spec, char *err,
                            size_t errlen)
{
    if (lua_type(L, -1) != LUA_TSTRING)
        return field_error(f, "from", err, errlen, "from: entries must be strings (got a %s)",
                           luaL_typename(L, -1));
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (!rt_rule_event_kind(s)) {
        /* A dotted name under an event prefix is a mistyped event, not a topic. */
        if (!strchr(s, '/') && (strncmp(s, "client.", 7) == 0 || strncmp(s, "session.", 8) == 0 ||
                                strncmp(s, "message.", 8) == 0))
            return field_error(f, "from", err, errlen, "from: \"%s\" is not an event (%s)", s,
                               "client.connected, client.disconnected, session.subscribed, "
                               "session.unsubscribed, message.delivered, message.acked, "
                               "message.dropped");
        if (!mqtt_topic_filter_valid((const uint8_t *)s, n) || memchr(s, 0, n))
            return field_error(f, "from", err, errlen,
                               "from: \"%s\" is neither a topic filter nor an event (%s)", s,
                               "client.connected, client.disconnected, session.subscribed, "
                               "session.unsubscribed, message.delivered, message.acked, "
                               "message.dropped");
        if (n >= 7 && memcmp(s, "$share/", 7) == 0)
            return field_error(f, "from", err, errlen,
                               "from: \"%s\": shared subscriptions mean nothing to a rule", s);
    }
    if (spec->nfrom == RT_RULE_MAX_FROM)
        return field_error(f, "from", err, errlen, "from: at most %d entries", RT_RULE_MAX_FROM);
    spec->from[spec->nfrom] = strdup(s);
    if (!spec->from[spec->nfrom])
        return RT_ENOMEM;
    spec->nfrom++;
    return 0;
}

static int add_to(lua_State *L, const rule_file_t *f, rt_rule_spec_t *spec, const char *sink,
                  int opts_idx, char *err, size_t errlen)
{
    if (spec->nto == RT_RULE_MAX_TO)
        return field_error(f, "to", err, errlen, "to: at most %d sinks", RT_RULE_MAX_TO);
    if (!valid_name(sink, strlen(sink)))
        return field_error(f, "to", err, errlen, "to: \"%s\" is not a sink name", sink);
    for (size_t i = 0; i < spec->nto; i++)
        if (strcmp(spec->to[i].sink, sink) == 0)
            return field_error(f, "to", err, errlen, "to: sink \"%s\" named twice", sink);
    rt_rule_to_t *t = &spec->to[spec->nto];
    t->sink = strdup(sink);
    if (!t->sink)
        return RT_ENOMEM;
    spec->nto++;
    if (opts_idx == 0)
        return 0;
    rt_rule_vm_t *vm = VM(L);
    char why[256] = "";
    vm->out_left = vm->max_bytes;
    bson_reinit(vm->row);
    if (!bson_table(L, opts_idx, vm->row, false, 0, why, sizeof(why)))
        return field_error(f, "to", err, errlen, "to.%s: %s", sink, why[0] ? why : "too large");
    t->opts = malloc(vm->row->len);
    if (!t->opts)
        return RT_ENOMEM;
    memcpy(t->opts, bson_get_data(vm->row), vm->row->len);
    t->opts_len = vm->row->len;
    return 0;
}

/* Checks the rule table at the top of the stack and fills spec. */
static int parse_spec(lua_State *L, const rule_file_t *f, rt_rule_spec_t *spec, char *err,
                      size_t errlen)
{
    static const char *const known[] = {"name",    "from",        "to",     "select", "enabled",
                                        "durable", "description", "sample", NULL};
    int t = lua_gettop(L);
    if (lua_type(L, t) != LUA_TTABLE)
        return field_error(f, NULL, err, errlen,
                           "a rule file must return a table (name, from, select, to)");
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        bool ok = false;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (const char *const *k = known; *k && !ok; k++)
                ok = strcmp(*k, lua_tostring(L, -1)) == 0;
        if (!ok) {
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
            return field_error(f, k, err, errlen,
                               "unknown field \"%s\" (a rule has name, from, select, to, "
                               "enabled, durable, description, sample)",
                               k);
        }
    }
    /* name */
    size_t n;
    lua_getfield(L, t, "name");
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
    if (!name || !valid_name(name, n))
        return field_error(f, "name", err, errlen,
                           "name must be 1-%d characters of A-Z a-z 0-9 _ - .",
                           RT_RULE_NAME_MAX - 1);
    memcpy(spec->name, name, n + 1);
    lua_pop(L, 1);
    /* from */
    int rc;
    lua_getfield(L, t, "from");
    if (lua_type(L, -1) == LUA_TSTRING) {
        if ((rc = parse_from_entry(L, f, spec, err, errlen)))
            return rc;
    } else if (lua_type(L, -1) == LUA_TTABLE) {
        lua_Integer len = array_len(L, lua_gettop(L));
        if (len == 0)
            return field_error(f, "from", err, errlen,
                               "from must be a topic filter, an event name or a list of them");
        for (lua_Integer i = 1; i <= len; i++) {
            lua_rawgeti(L, -1, i);
            if ((rc = parse_from_entry(L, f, spec, err, errlen)))
                return rc;
            lua_pop(L, 1);
        }
    } else {
        return field_error(f, "from", err, errlen,
                           "from is required: a topic filter, an event name or a list of them");
    }
    lua_pop(L, 1);
    /* select */
    lua_getfield(L, t, "select");
    if (lua_type(L, -1) != LUA_TFUNCTION)
        return field_error(f, "select", err, errlen,
                           "select must be a function(msg, ctx) returning nil, a row or a list "
                           "of rows");
    lua_pop(L, 1);
    /* to: { "sink", sink = { options } } */
    lua_getfield(L, t, "to");
    int to = lua_gettop(L);
    if (lua_type(L, to) == LUA_TSTRING) {
        if ((rc = add_to(L, f, spec, lua_tostring(L, to), 0, err, errlen)))
            return rc;
    } else if (lua_type(L, to) == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, to)) {
            int kt = lua_type(L, -2), vt = lua_type(L, -1);
            if (kt == LUA_TNUMBER && vt == LUA_TSTRING)
                rc = add_to(L, f, spec, lua_tostring(L, -1), 0, err, errlen);
            else if (kt == LUA_TSTRING && vt == LUA_TTABLE)
                rc = add_to(L, f, spec, lua_tostring(L, -2), lua_gettop(L), err, errlen);
            else if (kt == LUA_TSTRING && vt == LUA_TBOOLEAN && lua_toboolean(L, -1))
                rc = add_to(L, f, spec, lua_tostring(L, -2), 0, err, errlen);
            else
                rc = field_error(f, "to", err, errlen,
                                 "to: entries are sink names, or name = { options }");
            if (rc)
                return rc;
            lua_pop(L, 1);
        }
    } else if (lua_type(L, to) != LUA_TNIL) {
        return field_error(f, "to", err, errlen,
                           "to must be a sink name or a list { \"sink\", sink = { options } }");
    }
    lua_pop(L, 1);
    /* flags */
    static const char *const flags[] = {"enabled", "durable"};
    for (int i = 0; i < 2; i++) {
        int ty = lua_getfield(L, t, flags[i]);
        if (ty != LUA_TNIL && ty != LUA_TBOOLEAN)
            return field_error(f, flags[i], err, errlen, "%s must be true or false", flags[i]);
        bool v = ty == LUA_TNIL ? i == 0 : lua_toboolean(L, -1);
        if (i == 0)
            spec->enabled = v;
        else
            spec->durable = v;
        lua_pop(L, 1);
    }
    int ty = lua_getfield(L, t, "sample");
    if (ty != LUA_TNIL && ty != LUA_TTABLE)
        return field_error(f, "sample", err, errlen,
                           "sample must be a table { topic =, payload =, qos = }");
    lua_pop(L, 1);
    return 0;
}

/*
** Where a Lua message that starts with path ends: at the ':' after it, or NULL when it does not
** start with path. Lua shortens a source name longer than LUA_IDSIZE to "...<its tail>"; that
** counts as the path too.
*/
static const char *after_path(const char *e, const char *path)
{
    size_t pl = strlen(path);
    if (strncmp(e, path, pl) == 0 && e[pl] == ':')
        return e + pl;
    if (strncmp(e, "...", 3) != 0)
        return NULL;
    for (const char *c = e + 3; *c; c++) {
        size_t k = (size_t)(c - (e + 3));
        if (*c == ':' && k <= pl && memcmp(path + pl - k, e + 3, k) == 0)
            return c;
    }
    return NULL;
}

/* The load error on top of the stack as "path:line: reason", with the whole path. */
static void load_error(lua_State *L, const rule_file_t *f, char *err, size_t errlen)
{
    const char *e = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "error (not a string)";
    const char *rest = after_path(e, f->path);
    if (rest)
        snprintf(err, errlen, "%s%s", f->path, rest);
    else
        snprintf(err, errlen, "%s: %s", f->path, e);
}

/* Error text on top of the stack, without calling any metamethod. */
static const char *error_text(lua_State *L)
{
    if (lua_type(L, -1) == LUA_TSTRING)
        return lua_tostring(L, -1);
    return lua_type(L, -1) == LUA_TNIL ? "error (nil)" : "error (not a string)";
}

/* Fresh math library functions, their generator seeded from the kernel; under lua_pcall. */
static int fresh_math(lua_State *L)
{
    /* Not luaL_requiref: that would give back the one already loaded. */
    lua_pushcfunction(L, luaopen_math);
    lua_call(L, 0, 1);
    uint64_t seed[2];
    if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        return luaL_error(L, "no random seed for math.random");
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, (lua_Integer)seed[0]);
    lua_pushinteger(L, (lua_Integer)seed[1]);
    lua_call(L, 2, 0);
    return 1;
}

/*
** Gives the environment on top of the stack its own read-only math table, so no rule can seed
** or read another's random sequence (luaopen_math seeds from the time and the state's address,
** which every rule of a state shares). Returns a lua_pcall status; on error its message is on
** top instead.
*/
static int own_math(lua_State *L)
{
    rt_rule_vm_t *vm = VM(L);
    lua_pushcfunction(L, fresh_math);
    int status = lua_pcall(L, 0, 1, 0);
    if (status != LUA_OK)
        return status;
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->frozen_ref);
    lua_insert(L, -2);
    freeze(L, lua_absindex(L, -2));
    lua_setfield(L, -3, "math");
    lua_pop(L, 1);
    return LUA_OK;
}

/*
** Runs rule file idx's chunk in a fresh environment and stores the rule's
** table, select and ctx at idx. On error, err has the reason; returns nonzero.
*/
static int load_file(rt_rule_vm_t *vm, uint32_t idx, rt_rule_spec_t *spec, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    const rule_file_t *f = &vm->files[idx];
    int top = lua_gettop(L);
    char chunk[300];
    snprintf(chunk, sizeof(chunk), "@%s", f->path);
    vm->budget_hit = vm->oom = false;
    vm->steps = 0;
    if (luaL_loadbufferx(L, f->text, f->len, chunk, "t") != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_EINVAL;
    }
    /* The rule's environment: its own table, reading through to the base. */
    lua_newtable(L);
    lua_createtable(L, 0, 2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->base_ref);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, -2, "_G");
    int status = own_math(L);
    if (status != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_ENOMEM;
    }
    lua_setupvalue(L, -2, 1);
    arm(vm);
    status = lua_pcall(L, 0, 1, 0);
    disarm(vm);
    if (status != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_EINVAL;
    }
    rt_rule_spec_t local;
    memset(&local, 0, sizeof(local));
    rt_rule_spec_t *s = spec ? spec : &local;
    int rc = parse_spec(L, f, s, err, errlen);
    if (rc == RT_ENOMEM)
        snprintf(err, errlen, "%s: out of memory", f->path);
    if (rc == 0 && f->name[0] && strcmp(f->name, s->name) != 0)
        rc = field_error(f, "name", err, errlen, "name changed while reloading");
    if (!spec)
        rt_rule_spec_free(&local);
    if (rc) {
        lua_settop(L, top);
        return rc;
    }
    int rule = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_pushvalue(L, rule);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    lua_getfield(L, rule, "select");
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->ctxs_ref);
    lua_createtable(L, 0, 1);
    lua_getfield(L, rule, "name");
    lua_setfield(L, -2, "rule");
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_settop(L, top);
    return 0;
}

int rt_rule_vm_load(rt_rule_vm_t *vm, const char *path, const char *text, size_t len,
                    rt_rule_spec_t *spec, char *err, size_t errlen)
{
    memset(spec, 0, sizeof(*spec));
    if (vm->nrules == vm->capfiles) {
        uint32_t cap = vm->capfiles ? vm->capfiles * 2 : 16;
        rule_file_t *files = realloc(vm->files, cap * sizeof(*files));
        if (!files) {
            snprintf(err, errlen, "%s: out of memory", path);
            return RT_ENOMEM;
        }
        vm->files = files;
        vm->capfiles = cap;
    }
    rule_file_t *f = &vm->files[vm->nrules];
    f->path = path;
    f->text = text;
    f->len = len;
    f->name[0] = 0;
    int rc = load_file(vm, vm->nrules, spec, err, errlen);
    if (rc) {
        rt_rule_spec_free(spec);
        return rc;
    }
    snprintf(f->name, sizeof(f->name), "%s", spec->name);
    vm->nrules++;
    return 0;
}

/* ---- Running ---- */

static void set_str(lua_State *L, const char *k, const void *s, size_t n)
{
    lua_pushlstring(L, s, n);
    lua_setfield(L, -2, k);
}

static void set_cstr(lua_State *L, const char *k, const char *s)
{
    if (!s)
        return;
    lua_pushstring(L, s);
    lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

/* Pushes the msg (or event) table a select function receives. */
static int push_input(lua_State *L)
{
    const rt_rule_input_t *in = lua_touserdata(L, 1);
    lua_createtable(L, 0, 12);
    if (in->event)
        set_cstr(L, "event", in->event);
    if (in->topic)
        set_str(L, "topic", in->topic, in->topic_len);
    if (in->payload)
        set_str(L, "payload", in->payload, in->payload_len);
    if (in->qos >= 0)
        set_int(L, "qos", in->qos);
    if (in->retain >= 0) {
        lua_pushboolean(L, in->retain);
        lua_setfield(L, -2, "retain");
    }
    set_cstr(L, "clientid", in->clientid);
    set_cstr(L, "username", in->username);
    set_cstr(L, "peer", in->peer);
    set_int(L, "timestamp", (lua_Integer)in->ts_ms);
    if (in->reason_code >= 0)
        set_int(L, "reason_code", in->reason_code);
    set_cstr(L, "reason", in->reason);
    set_cstr(L, "from_clientid", in->from_clientid);
    set_cstr(L, "from_username", in->from_username);
    if (in->proto_ver >= 0)
        set_int(L, "proto_ver", in->proto_ver);
    if (in->keepalive >= 0)
        set_int(L, "keepalive", in->keepalive);
    if (in->clean_start >= 0) {
        lua_pushboolean(L, in->clean_start);
        lua_setfield(L, -2, "clean_start");
    }
    if (!in->event || in->topic) {
        /* User properties (MQTT 5); a repeated key keeps its last value. */
        uint32_t nusers = in->props ? in->props->user_count : 0;
        lua_createtable(L, 0, (int)nusers);
        if (nusers) {
            size_t pos = 0;
            mqtt_str_t k, v;
            while (mqtt_props_user_next(in->props, &pos, &k, &v)) {
                lua_pushlstring(L, (const char *)k.p, k.len);
                lua_pushlstring(L, (const char *)v.p, v.len);
                lua_rawset(L, -3);
            }
        }
        lua_setfield(L, -2, "props");
    }
    return 1;
}

/* After a memory failure: collect, and if the state is still over half full, rebuild idx. */
static void recover_memory(rt_rule_vm_t *vm, uint32_t idx)
{
    lua_State *L = vm->L;
    lua_gc(L, LUA_GCCOLLECT, 0);
    if (rt_rule_vm_bytes(vm) <= vm->cap / 2)
        return;
    /* Drop the rule's environment first so the collection can take what it hoarded. */
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_pop(L, 2);
    lua_gc(L, LUA_GCCOLLECT, 0);
    char err[128];
    if (load_file(vm, idx, NULL, err, sizeof(err)) != 0)
        lua_gc(L, LUA_GCCOLLECT, 0); /* stays lost: later calls fail with a clear error */
}

static rt_rule_outcome_t classify(rt_rule_vm_t *vm, int status)
{
    if (vm->budget_hit)
        return RT_RULE_FAIL_BUDGET;
    if (status == LUA_ERRMEM || (vm->oom && is_oom_message(vm->L, -1)))
        return RT_RULE_FAIL_MEMORY;
    return RT_RULE_FAIL_EXCEPTION;
}

/* Converts the select result at idx into rows; 0 rows means filtered. */
static rt_rule_outcome_t collect_rows(rt_rule_vm_t *vm, int idx, rt_rule_buf_t *out,
                                      uint32_t *nrows, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    int ty = lua_type(L, idx);
    if (ty == LUA_TNIL || (ty == LUA_TBOOLEAN && !lua_toboolean(L, idx)))
        return RT_RULE_FILTERED;
    if (ty != LUA_TTABLE) {
        snprintf(err, errlen, "select must return nil, a row or a list of rows (got a %s)",
                 luaL_typename(L, idx));
        return RT_RULE_FAIL_EXCEPTION;
    }
    size_t mark = out->len;
    /* The rows' BSON counts against the memory cap, next to what the state holds. */
    size_t held = rt_rule_vm_bytes(vm);
    size_t room = held < vm->cap ? vm->cap - held : 0;
    vm->out_left = room < vm->max_bytes ? room : vm->max_bytes;
    lua_Integer n = array_len(L, idx);
    bool list = false;
    if (n > 0) {
        lua_rawgeti(L, idx, 1);
        list = lua_type(L, -1) == LUA_TTABLE;
        lua_pop(L, 1);
    } else {
        lua_pushnil(L);
        if (!lua_next(L, idx))
            return RT_RULE_FILTERED; /* {}: an empty list of rows */
        lua_pop(L, 2);
    }
    char why[200];
    if (!list) {
        if (!row_to_bson(vm, idx, out, why, sizeof(why))) {
            snprintf(err, errlen, "row: %s", why);
            return vm->out_left ? RT_RULE_FAIL_EXCEPTION : RT_RULE_FAIL_MEMORY;
        }
        *nrows = 1;
        return RT_RULE_PASSED;
    }
    if ((size_t)n > vm->max_rows) {
        snprintf(err, errlen, "select returned %lld rows, more than the %zu of rule_output_rows",
                 (long long)n, vm->max_rows);
        return RT_RULE_FAIL_MEMORY;
    }
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        bool ok = row_to_bson(vm, lua_gettop(L), out, why, sizeof(why));
        lua_pop(L, 1);
        if (!ok) {
            out->len = mark;
            snprintf(err, errlen, "row %lld: %s", (long long)i, why);
            return vm->out_left ? RT_RULE_FAIL_EXCEPTION : RT_RULE_FAIL_MEMORY;
        }
    }
    *nrows = (uint32_t)n;
    return RT_RULE_PASSED;
}

/*
** The dry run's message handler: notes the line the innermost frame of the rule's own file
** was running when the error was raised (a C function such as json.decode gives its message
** no position) and leaves the error as it was. C, so it runs no budgeted instructions.
*/
static int note_line(lua_State *L)
{
    rt_rule_vm_t *vm = VM(L);
    lua_Debug ar;
    for (int level = 0; vm->line_of && lua_getstack(L, level, &ar); level++)
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && ar.source[0] == '@' &&
            strcmp(ar.source + 1, vm->line_of) == 0) {
            vm->err_line = ar.currentline;
            break;
        }
    return 1;
}

rt_rule_outcome_t rt_rule_vm_run(rt_rule_vm_t *vm, uint32_t idx, const rt_rule_input_t *in,
                                 rt_rule_buf_t *out, uint32_t *nrows, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    *nrows = 0;
    lua_settop(L, 0);
    vm->budget_hit = vm->timed_out = vm->oom = false;
    vm->steps = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    if (lua_rawgeti(L, 1, (lua_Integer)idx + 1) != LUA_TFUNCTION) {
        lua_settop(L, 0);
        snprintf(err, errlen,
                 "the rule's state was lost after a memory failure and could not "
                 "be rebuilt; reload the rules");
        return RT_RULE_FAIL_MEMORY;
    }
    /* Building msg can hit the memory cap too, so it runs protected, inside the budget. */
    lua_pushcfunction(L, push_input);
    lua_pushlightuserdata(L, (void *)in);
    int status = lua_pcall(L, 1, 1, 0);
    if (status == LUA_OK) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, vm->ctxs_ref);
        lua_rawgeti(L, -1, (lua_Integer)idx + 1);
        lua_remove(L, -2);
        int msgh = 0;
        if (vm->line_of) {
            lua_pushcfunction(L, note_line); /* below select and its two arguments */
            lua_insert(L, -4);
            msgh = lua_gettop(L) - 3;
        }
        arm(vm);
        status = lua_pcall(L, 2, 1, msgh);
        disarm(vm);
    }
    rt_rule_outcome_t r;
    vm->row_error = false;
    if (status != LUA_OK) {
        r = classify(vm, status);
        /* Out of time in the allocator: Lua's message says memory. */
        if (vm->timed_out && is_oom_message(L, -1))
            snprintf(err, errlen, "time limit of %d ms exceeded (in a C function)",
                     (int)vm->call_ms);
        else
            snprintf(err, errlen, "%s", error_text(L));
    } else {
        r = collect_rows(vm, lua_gettop(L), out, nrows, err, errlen);
        vm->row_error = r != RT_RULE_PASSED && r != RT_RULE_FILTERED;
    }
    lua_settop(L, 0);
    if (r == RT_RULE_FAIL_MEMORY)
        recover_memory(vm, idx);
    return r;
}

/* ---- Dry run ---- */

static const char *opt_field(lua_State *L, int t, const char *k, size_t *n)
{
    lua_getfield(L, t, k);
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, n) : NULL;
    lua_pop(L, 1); /* the string stays alive: it is referenced by the sample table */
    return s;
}

int rt_rule_vm_dry_run(rt_rule_vm_t *vm, uint32_t idx, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    const rule_file_t *f = &vm->files[idx];
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_rawgeti(L, 1, (lua_Integer)idx + 1); /* 2: the rule table */
    lua_getfield(L, 2, "from");
    if (lua_type(L, -1) == LUA_TTABLE)
        lua_rawgeti(L, -1, 1);
    const char *from = lua_tostring(L, -1); /* 3 or 4 */
    lua_getfield(L, 2, "sample");
    int sample = lua_type(L, -1) == LUA_TTABLE ? lua_gettop(L) : 0;
    bool sample_given = sample != 0;

    rt_rule_input_t in = {.qos = 1,
                          .retain = 0,
                          .clientid = "sample-client",
                          .username = "sample-user",
                          .peer = "127.0.0.1:50000",
                          .reason_code = -1,
                          .proto_ver = -1,
                          .keepalive = -1,
                          .clean_start = -1};
    in.ts_ms = 1700000000000ull;
    char topic[512];
    int ev = rt_rule_event_kind(from);
    if (ev) {
        in.event = from;
        in.qos = -1;
        in.retain = -1;
        if (ev == 1) {
            in.proto_ver = 5, in.keepalive = 60, in.clean_start = 1;
        } else if (ev == 2) {
            in.reason_code = 0, in.reason = "normal";
        } else if (ev == 3 || ev == 4) {
            in.topic = "sample/topic", in.topic_len = 12, in.qos = ev == 3 ? 1 : -1;
        } else {
            in.topic = "sample/topic", in.topic_len = 12, in.qos = 1, in.retain = 0;
            in.payload = (const uint8_t *)"{}", in.payload_len = 2;
            in.from_clientid = "sample-publisher";
            if (ev == 7)
                in.reason = "queue_full";
        }
    } else {
        /* A topic the first filter matches: each wildcard level becomes "sample". */
        size_t k = 0, n = strlen(from);
        for (size_t i = 0; i < n && k + 8 < sizeof(topic); i++)
            if (from[i] == '+' || from[i] == '#')
                k += (size_t)snprintf(topic + k, sizeof(topic) - k, "sample");
            else
                topic[k++] = from[i];
        topic[k] = 0;
        in.topic = topic;
        in.topic_len = k;
        in.payload = (const uint8_t *)"{}";
        in.payload_len = 2;
    }
    if (sample) {
        size_t n;
        const char *s;
        if ((s = opt_field(L, sample, "topic", &n)))
            in.topic = s, in.topic_len = n;
        if ((s = opt_field(L, sample, "payload", &n)))
            in.payload = (const uint8_t *)s, in.payload_len = n;
        if ((s = opt_field(L, sample, "clientid", &n)))
            in.clientid = s;
        if ((s = opt_field(L, sample, "username", &n)))
            in.username = s;
        lua_getfield(L, sample, "qos");
        if (lua_isinteger(L, -1))
            in.qos = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    /* The strings above live in the rule and sample tables, which the registry keeps. */
    lua_settop(L, 0);
    rt_rule_buf_t out = {0};
    uint32_t nrows;
    char why[400];
    vm->line_of = f->path;
    vm->err_line = 0;
    rt_rule_outcome_t r = rt_rule_vm_run(vm, idx, &in, &out, &nrows, why, sizeof(why));
    vm->line_of = NULL;
    rt_rule_buf_free(&out);
    /* A made-up message may not fit what the rule expects (a missing JSON field): a Lua
       error on it is the rule's business. Runaways, memory bombs and rows that cannot be
       stored are not; with the file's own sample every failure counts. */
    if (r == RT_RULE_PASSED || r == RT_RULE_FILTERED ||
        (!sample_given && r == RT_RULE_FAIL_EXCEPTION && !vm->row_error))
        return 0;
    /* "path:line: ...": the position Lua gave the message if it is in this file, else the
       line the rule's code was running, else its select (rows that cannot be stored). */
    const char *reason = why;
    int line = 0;
    const char *rest = after_path(why, f->path);
    if (rest && rest[1] >= '0' && rest[1] <= '9') {
        char *end;
        line = (int)strtol(rest + 1, &end, 10);
        reason = *end == ':' ? end + 1 + (end[1] == ' ') : why;
    }
    if (!line)
        line = vm->err_line;
    if (!line)
        line = rt_rule_field_line(f->text, f->len, "select");
    snprintf(err, errlen, "%s:%d: dry run on %s %s failed: %s", f->path, line,
             sample_given ? "its sample" : "a made-up", ev ? "event" : "message", reason);
    return RT_EINVAL;
}

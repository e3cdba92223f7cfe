/*
** The sandbox of a rule Lua state (rule_vm.h, "Sandbox"): the read-only base environment
** rule files read through to, with the library guarded against loops that neither the
** budget nor the memory cap would stop, and a math library of each rule's own.
*/
#include <lualib.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "lua_json.h"
#include "lua_lib.h"
#include "lua_pattern.h"
#include "lua_table.h"
#include "rule_vm_internal.h"

static int sb_pcall(lua_State *L)
{
    luaL_checkany(L, 1);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (status != LUA_OK && rt__rule_vm_must_propagate(L, status))
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
    if (status != LUA_OK && rt__rule_vm_must_propagate(L, status))
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

/*
** string.rep of an empty string (with an empty separator) loops n times for nothing, in C,
** without allocating: neither the hook nor the memory cap would stop it.
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
    return rt_lua_call_guarded(L);
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
    return rt_lua_call_guarded(L);
}

typedef struct {
    const char *lib, *name;
    lua_CFunction fn;
} guard_t;

static const guard_t guards[] = {
    {LUA_STRLIBNAME, "rep", sb_rep},
    {LUA_STRLIBNAME, "format", sb_format},
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
        rt_lua_pattern_install(L, -1, rt__rule_vm_charge);
    if (strcmp(name, LUA_TABLIBNAME) == 0)
        rt_lua_table_install(L, -1, rt__rule_vm_charge);
    freeze(L, frozen);
    lua_setfield(L, hidden, name);
    lua_pop(L, 1);
}

int rt__rule_sandbox_open(lua_State *L)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
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
    rt_lua_json_open(L, rt__rule_vm_charge);
    freeze(L, frozen);
    lua_setfield(L, hidden, "json");
    rt_lua_topic_open(L, rt__rule_vm_charge);
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
        /* Protected, so the deadline is let go whatever the chunk does. */
        rt__rule_vm_arm(vm);
        int status = lua_pcall(L, 0, 1, 0);
        rt__rule_vm_disarm(vm);
        if (status != LUA_OK)
            return lua_error(L);
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
** Why each rule has a math of its own: luaopen_math seeds from the time and the state's
** address, which every rule of a state shares, so one rule could seed or read another's
** random sequence.
*/
int rt__rule_sandbox_own_math(lua_State *L)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
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

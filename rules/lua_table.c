/* The table library's looping functions for rules, bounded and charged (lua_table.h). */
#include <lauxlib.h>
#include <lua.h>
#include <stdbool.h>
#include <string.h>

#include "lua_table.h"

#define CHARGE_BOX 2      /* upvalue of each function here; upvalue 1 is Lua's own, for guards */
#define COMPARE_CHUNK 256 /* bytes compared between two looks at the difference */
#define COMPARE_CHARGE_EVERY 65536 /* bytes compared between two charges (and deadline looks) */

static void charge(lua_State *L, size_t steps)
{
    rt_lua_charge(L, lua_upvalueindex(CHARGE_BOX), steps);
}

/* Refuses a loop over from..to of more than RT_LUA_TABLE_OP_MAX elements; charges it. */
static void take_span(lua_State *L, lua_Integer from, lua_Integer to, const char *fn)
{
    if (to < from)
        return;
    lua_Unsigned n = (lua_Unsigned)to - (lua_Unsigned)from;
    if (n >= RT_LUA_TABLE_OP_MAX)
        luaL_error(L, "%s: more than %d elements in one call", fn, RT_LUA_TABLE_OP_MAX);
    charge(L, (size_t)n + 1);
}

static int t_insert(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer e = (lua_Integer)((lua_Unsigned)luaL_len(L, 1) + 1u); /* first empty slot */
    lua_Integer pos = e;
    switch (lua_gettop(L)) {
    case 2:
        break;
    case 3:
        pos = luaL_checkinteger(L, 2);
        luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)e, 2, "position out of bounds");
        take_span(L, pos, e, "table.insert");
        for (lua_Integer i = e; i > pos; i--) {
            lua_geti(L, 1, i - 1);
            lua_seti(L, 1, i);
        }
        break;
    default:
        return luaL_error(L, "wrong number of arguments to 'insert'");
    }
    lua_seti(L, 1, pos);
    return 0;
}

static int t_remove(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer size = luaL_len(L, 1);
    lua_Integer pos = luaL_optinteger(L, 2, size);
    if (pos != size)
        luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 2, "position out of bounds");
    take_span(L, pos, size, "table.remove");
    lua_geti(L, 1, pos);
    for (; pos < size; pos++) {
        lua_geti(L, 1, pos + 1);
        lua_seti(L, 1, pos);
    }
    lua_pushnil(L);
    lua_seti(L, 1, pos);
    return 1;
}

/* Whether the value at b sorts before the one at a (absolute indices), for t_sort. */
static bool sorts_before(lua_State *L, bool comp, int b, int a)
{
    if (comp) {
        lua_pushvalue(L, 2);
        lua_pushvalue(L, b);
        lua_pushvalue(L, a);
        lua_call(L, 2, 1);
        bool less = lua_toboolean(L, -1);
        lua_pop(L, 1);
        return less;
    }
    if (lua_type(L, a) != LUA_TSTRING || lua_type(L, b) != LUA_TSTRING)
        return lua_compare(L, b, a, LUA_OPLT);
    size_t la, lb;
    const char *x = lua_tolstring(L, b, &lb), *y = lua_tolstring(L, a, &la);
    size_t n = la < lb ? la : lb, at = 0, charged = 0;
    int c = 0;
    while (c == 0 && at < n) {
        size_t k = n - at < COMPARE_CHUNK ? n - at : COMPARE_CHUNK;
        c = memcmp(x + at, y + at, k);
        at += k;
        if (at - charged >= COMPARE_CHARGE_EVERY) {
            charge(L, (at - charged) / RT_LUA_BYTES_PER_STEP);
            charged = at;
        }
    }
    charge(L, (at - charged) / RT_LUA_BYTES_PER_STEP);
    return c < 0 || (c == 0 && lb < la);
}

/*
** A bottom-up merge sort between two scratch tables (3 and 4) that the elements are read into
** once and written back from once, through __index and __newindex as Lua's own sort does.
*/
static int t_sort(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 1);
    bool comp = !lua_isnoneornil(L, 2);
    if (comp)
        luaL_checktype(L, 2, LUA_TFUNCTION);
    if (n < 2)
        return 0;
    take_span(L, 1, n, "table.sort");
    lua_settop(L, 2);
    lua_createtable(L, (int)n, 0);
    lua_createtable(L, (int)n, 0);
    int src = 3, dst = 4;
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        lua_rawseti(L, src, i);
    }
    for (lua_Integer width = 1; width < n; width *= 2) {
        for (lua_Integer lo = 1; lo <= n; lo += 2 * width) {
            lua_Integer mid = lo + width <= n ? lo + width : n + 1;
            lua_Integer hi = lo + 2 * width <= n ? lo + 2 * width : n + 1;
            lua_Integer i = lo, j = mid, k = lo;
            /* Two reads and a write per element merged; the rest of a run is copied. */
            charge(L, 3 * (size_t)(hi - lo));
            while (i < mid && j < hi) {
                lua_rawgeti(L, src, i);
                lua_rawgeti(L, src, j);
                int top = lua_gettop(L);
                if (sorts_before(L, comp, top, top - 1)) {
                    lua_rawseti(L, dst, k++);
                    lua_pop(L, 1);
                    j++;
                } else {
                    lua_pop(L, 1);
                    lua_rawseti(L, dst, k++);
                    i++;
                }
            }
            for (; i < mid; i++) {
                lua_rawgeti(L, src, i);
                lua_rawseti(L, dst, k++);
            }
            for (; j < hi; j++) {
                lua_rawgeti(L, src, j);
                lua_rawseti(L, dst, k++);
            }
        }
        int tmp = src;
        src = dst;
        dst = tmp;
    }
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, src, i);
        lua_seti(L, 1, i);
    }
    return 0;
}

/* table.move(a1, f, e, t [, a2]): Lua's own, for a range of the caller's. */
static int g_move(lua_State *L)
{
    take_span(L, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3), "table.move");
    return rt_lua_call_guarded(L);
}

/* table.concat(t [, sep [, i [, j]]]), as Lua's, which reads #t even when j is given. */
static int t_concat(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t lsep;
    const char *sep = luaL_optlstring(L, 2, "", &lsep);
    lua_Integer i = luaL_optinteger(L, 3, 1);
    lua_Integer last = lua_isnoneornil(L, 4) ? luaL_len(L, 1) : luaL_checkinteger(L, 4);
    take_span(L, i, last, "table.concat");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (; i <= last; i++) {
        lua_geti(L, 1, i);
        if (!lua_isstring(L, -1))
            return luaL_error(L, "invalid value (%s) at index %I in table for 'concat'",
                              luaL_typename(L, -1), (lua_Integer)i);
        luaL_addvalue(&b);
        if (i == last)
            break; /* before i++ could pass the largest integer */
        luaL_addlstring(&b, sep, lsep);
    }
    luaL_pushresult(&b);
    return 1;
}

/* table.unpack(t [, i [, j]]): Lua's own, given the j that #t gave here. */
static int g_unpack(lua_State *L)
{
    lua_settop(L, 3);
    lua_Integer i = luaL_optinteger(L, 2, 1);
    lua_Integer j = lua_isnil(L, 3) ? luaL_len(L, 1) : luaL_checkinteger(L, 3);
    take_span(L, i, j, "table.unpack");
    lua_pushinteger(L, i);
    lua_replace(L, 2);
    lua_pushinteger(L, j);
    lua_replace(L, 3);
    return rt_lua_call_guarded(L);
}

void rt_lua_table_install(lua_State *L, int idx, rt_lua_charge_fn charge_fn)
{
    static const luaL_Reg fns[] = {{"insert", t_insert}, {"remove", t_remove},
                                   {"sort", t_sort},     {"move", g_move},
                                   {"concat", t_concat}, {"unpack", g_unpack}};
    idx = lua_absindex(L, idx);
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        lua_getfield(L, idx, fns[i].name); /* upvalue 1: Lua's own (unused by our own three) */
        rt_lua_charge_push(L, charge_fn);
        lua_pushcclosure(L, fns[i].func, 2);
        lua_setfield(L, idx, fns[i].name);
    }
}

/*
** json.decode (rules/lua_json.c) on any text. What decodes is encoded again, and when that
** succeeds (infinities may not) the text it gives must decode to an equal value: the same
** types (integer or float too), strings, numbers and table contents. Key order is not
** compared: an object's keys come out in the table's order.
*/
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lua_json.h"

static lua_State *L;

/* Calls json.<fn> on the value at idx: 1 with the result pushed, 0 after an error. */
static int call(const char *fn, int idx)
{
    idx = lua_absindex(L, idx);
    lua_getfield(L, 1, fn);
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK)
        return 1;
    if (lua_type(L, -1) != LUA_TSTRING)
        abort();
    lua_pop(L, 1);
    return 0;
}

static int equal(int a, int b, int depth);

static size_t count(int t)
{
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        n++;
    }
    return n;
}

/* Tables a and b have as many keys, and each key of a is in b with an equal value. */
static int same_table(int a, int b, int depth)
{
    if (count(a) != count(b))
        return 0;
    lua_pushnil(L);
    while (lua_next(L, a)) {
        lua_pushvalue(L, -2);
        lua_rawget(L, b);
        int same = equal(lua_gettop(L) - 1, lua_gettop(L), depth + 1);
        lua_pop(L, 2);
        if (!same) {
            lua_pop(L, 1);
            return 0;
        }
    }
    return 1;
}

static int equal(int a, int b, int depth)
{
    a = lua_absindex(L, a);
    b = lua_absindex(L, b);
    if (depth > RT_JSON_MAX_DEPTH + 1)
        abort();
    luaL_checkstack(L, 8, "equal");
    if (lua_type(L, a) != lua_type(L, b))
        return 0;
    if (lua_type(L, a) == LUA_TNUMBER && lua_isinteger(L, a) != lua_isinteger(L, b))
        return 0;
    if (lua_type(L, a) != LUA_TTABLE)
        return lua_rawequal(L, a, b);
    return same_table(a, b, depth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!L) {
        L = luaL_newstate();
        rt_lua_json_open(L, NULL);
    }
    lua_settop(L, 1);
    lua_pushlstring(L, (const char *)data, size); /* 2 */
    if (call("decode", 2) && call("encode", 3)) {
        if (!call("decode", 4) || !equal(3, 5, 0))
            abort();
    }
    lua_settop(L, 1);
    return 0;
}

/*
** json.decode (rules/lua_json.c) on any text. What decodes is encoded again, and when that
** succeeds (infinities and NaN may not) the text it gives must decode and encode to itself.
*/
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lua_json.h"

static lua_State *L;

/* decode(text) then encode(result): 1 with the encoding on the stack, 0 after an error. */
static int decode_encode(const char *text, size_t len, int *decoded)
{
    *decoded = 0;
    lua_getfield(L, 1, "decode");
    lua_pushlstring(L, text, len);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        if (lua_type(L, -1) != LUA_TSTRING)
            abort();
        lua_pop(L, 1);
        return 0;
    }
    *decoded = 1;
    lua_getfield(L, 1, "encode");
    lua_insert(L, -2);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!L) {
        L = luaL_newstate();
        rt_lua_json_open(L);
    }
    lua_settop(L, 1);
    int decoded;
    if (decode_encode((const char *)data, size, &decoded)) {
        size_t n1, n2;
        const char *once = lua_tolstring(L, -1, &n1);
        if (!decode_encode(once, n1, &decoded))
            abort();
        const char *twice = lua_tolstring(L, -1, &n2);
        if (n1 != n2 || memcmp(once, twice, n1) != 0)
            abort();
    }
    lua_settop(L, 1);
    return 0;
}

/*
** JSON for rules: json.encode(value) and json.decode(text), plus json.null, the
** sentinel that stands for JSON null inside tables (Lua tables cannot hold nil).
**
** Written here in C rather than taken from lua-cjson: Debian does not ship a
** lua-cjson built for Lua 5.4 everywhere we run, and rules decode a payload on
** nearly every message at 40,000 messages/s, so this sits on the hot path.
** Every byte it allocates goes through the state's lua_Alloc (so it is counted
** and capped like the rule's own memory), and every error is a Lua error that
** names the reason and the byte offset, never a crash.
**
** Mapping. Objects become tables with string keys; arrays become sequences
** 1..n; null becomes json.null; numbers without a fraction or exponent that fit
** in 64 bits become integers, the others floats. Encoding: a table whose keys
** are exactly 1..n (n > 0) is an array, any other table an object (integer keys
** written as strings, other key types refused); the empty table is {}. Floats
** are written in the shortest form that reads back to the same double, with
** ".0" kept on whole floats so integer/float survives a round trip; NaN and
** infinities are refused (JSON has none). Strings must be UTF-8.
*/
#ifndef RT_LUA_JSON_H
#define RT_LUA_JSON_H

#include <lua.h>

#include "lua_lib.h"

/* Nesting deeper than this is refused. */
#define RT_JSON_MAX_DEPTH 128

/*
** Pushes the json library table {encode, decode, null}. Both functions charge their walk
** (lua_lib.h: a step per value and per table key, and per RT_LUA_BYTES_PER_STEP bytes of
** strings); json.encode refuses a table that contains itself when it meets it the second
** time on one path, so a cycle costs one walk of what came before it, not one per level.
*/
int rt_lua_json_open(lua_State *L, rt_lua_charge_fn charge);

/*
** A growable byte buffer allocated through the state's lua_Alloc and owned by a
** userdata on the stack, so a Lua error anywhere (memory cap, budget) frees it
** with the userdata instead of leaking it. Shared with the row encoder.
*/
typedef struct rt_lua_buf_s {
    char *p;
    size_t len, cap;
} rt_lua_buf_t;

/* Pushes a new empty buffer userdata and returns it. */
rt_lua_buf_t *rt_lua_buf_push(lua_State *L);
/* Makes room for n more bytes (raises a memory error when the cap refuses). */
char *rt_lua_buf_reserve(lua_State *L, rt_lua_buf_t *b, size_t n);
void rt_lua_buf_add(lua_State *L, rt_lua_buf_t *b, const void *p, size_t n);

/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int rt_utf8_valid(const void *s, size_t n);

#endif

/*
** Rows (rule_vm.h, "What select returns"): what a rule's select returns, converted to
** BSON documents within the call's row and byte limits.
*/
#include <stdio.h>
#include <string.h>

#include "lua_json.h"
#include "rule_vm_internal.h"

lua_Integer rt__rule_array_len(lua_State *L, int idx)
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

/*
** Takes n bytes of what the rows may still make (a little more than the BSON they become:
** a value's type, key and fixed part are charged as klen + 16). False with err set once
** they would pass it; out_left is then 0.
*/
static bool take_out(lua_State *L, size_t n, char *err, size_t errlen)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
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
        bool array = rt__rule_array_len(L, idx) > 0;
        bson_t child;
        bool ok = array ? bson_append_array_begin(doc, key, klen, &child)
                        : bson_append_document_begin(doc, key, klen, &child);
        if (!ok) {
            snprintf(err, errlen, "field \"%s\": document too large", key);
            return false;
        }
        ok = rt__rule_bson_table(L, idx, &child, array, depth + 1, err, errlen);
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

bool rt__rule_bson_table(lua_State *L, int idx, bson_t *doc, bool array, int depth, char *err,
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
static bool row_to_bson(rt_rule_vm_t *vm, int idx, rt_buf_t *out, char *err, size_t errlen)
{
    lua_State *L = vm->L;
    if (lua_type(L, idx) != LUA_TTABLE) {
        snprintf(err, errlen, "a row must be a table (got a %s)", luaL_typename(L, idx));
        return false;
    }
    bson_reinit(vm->row);
    err[0] = 0;
    if (!rt__rule_bson_table(L, idx, vm->row, false, 0, err, errlen)) {
        if (!err[0])
            snprintf(err, errlen, "row too large");
        return false;
    }
    rt_buf_add(out, bson_get_data(vm->row), vm->row->len);
    if (out->oom) {
        snprintf(err, errlen, "out of memory for rows");
        return false;
    }
    return true;
}

rt_rule_outcome_t rt__rule_rows_collect(rt_rule_vm_t *vm, int idx, rt_buf_t *out, uint32_t *nrows,
                                        char *err, size_t errlen)
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
    lua_Integer n = rt__rule_array_len(L, idx);
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
            rt_buf_truncate(out, mark);
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
            rt_buf_truncate(out, mark);
            snprintf(err, errlen, "row %lld: %s", (long long)i, why);
            return vm->out_left ? RT_RULE_FAIL_EXCEPTION : RT_RULE_FAIL_MEMORY;
        }
    }
    *nrows = (uint32_t)n;
    return RT_RULE_PASSED;
}

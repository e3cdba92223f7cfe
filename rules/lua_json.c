/* JSON for rules (lua_json.h): json.encode, json.decode and json.null, in C. */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua_json.h"
#include "lua_lib.h"

/* ---- Buffers owned by a userdata (freed by its __gc through the state's allocator) ---- */

static const char BUF_MT[] = "rt.buf";

static int buf_gc(lua_State *L)
{
    rt_lua_buf_t *b = lua_touserdata(L, 1);
    void *ud;
    lua_Alloc f = lua_getallocf(L, &ud);
    if (b && b->p)
        f(ud, b->p, b->cap, 0);
    if (b)
        memset(b, 0, sizeof(*b));
    return 0;
}

rt_lua_buf_t *rt_lua_buf_push(lua_State *L)
{
    rt_lua_buf_t *b = lua_newuserdatauv(L, sizeof(*b), 0);
    memset(b, 0, sizeof(*b));
    if (luaL_newmetatable(L, BUF_MT)) {
        lua_pushcfunction(L, buf_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
    }
    lua_setmetatable(L, -2);
    return b;
}

char *rt_lua_buf_reserve(lua_State *L, rt_lua_buf_t *b, size_t n)
{
    if (b->cap - b->len >= n)
        return b->p + b->len;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
        if (cap > SIZE_MAX / 2)
            luaL_error(L, "buffer too large");
        cap *= 2;
    }
    void *ud;
    lua_Alloc f = lua_getallocf(L, &ud);
    char *p = f(ud, b->p, b->p ? b->cap : 0, cap);
    if (!p) {
        /* The rule engine classifies errors starting "not enough memory" as memory failures. */
        luaL_error(L, "not enough memory (buffer of %I bytes)", (lua_Integer)cap);
    }
    b->p = p;
    b->cap = cap;
    return b->p + b->len;
}

void rt_lua_buf_add(lua_State *L, rt_lua_buf_t *b, const void *p, size_t n)
{
    memcpy(rt_lua_buf_reserve(L, b, n), p, n);
    b->len += n;
}

static void buf_addc(lua_State *L, rt_lua_buf_t *b, char c)
{
    if (b->len == b->cap)
        rt_lua_buf_reserve(L, b, 1);
    b->p[b->len++] = c;
}

/* ---- UTF-8 ---- */

int rt_utf8_valid(const void *s, size_t n)
{
    const unsigned char *p = s, *end = p + n;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t need;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if ((size_t)(end - p) <= need)
            return 0;
        for (size_t i = 1; i <= need; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i] & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        p += need + 1;
    }
    return 1;
}

/* ---- Encoding ---- */

/* The functions here run in the frame of json.encode or json.decode: upvalue 1 is the box of
   the charge function (lua_lib.h). */
static void charge(lua_State *L, size_t steps)
{
    rt_lua_charge(L, lua_upvalueindex(1), steps);
}

typedef struct {
    lua_State *L;
    rt_lua_buf_t *b;
    const void *path[RT_JSON_MAX_DEPTH]; /* the tables being written, outermost first */
} enc_t;

static void enc_string(enc_t *e, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    lua_State *L = e->L;
    charge(L, n / RT_LUA_BYTES_PER_STEP);
    if (!rt_utf8_valid(s, n))
        luaL_error(L, "json.encode: string is not valid UTF-8");
    /* Worst case 6 bytes per input byte plus the quotes: reserve once. */
    char *o = rt_lua_buf_reserve(L, e->b, n * 6 + 2);
    size_t k = 0;
    o[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            o[k++] = (char)c;
            continue;
        }
        o[k++] = '\\';
        switch (c) {
        case '"':
            o[k++] = '"';
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '\n':
            o[k++] = 'n';
            break;
        case '\r':
            o[k++] = 'r';
            break;
        case '\t':
            o[k++] = 't';
            break;
        case '\b':
            o[k++] = 'b';
            break;
        case '\f':
            o[k++] = 'f';
            break;
        default:
            o[k++] = 'u';
            o[k++] = '0';
            o[k++] = '0';
            o[k++] = hex[c >> 4];
            o[k++] = hex[c & 15];
        }
    }
    o[k++] = '"';
    e->b->len += k;
}

/* Shortest %.Ng that reads back to the same double, keeping ".0" on whole values. */
static int format_double(double d, char *out, size_t cap)
{
    int n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(out, cap, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
    if (!strpbrk(out, ".eEn"))
        n += snprintf(out + n, cap - (size_t)n, ".0");
    return n;
}

static void enc_value(enc_t *e, int idx, int depth);

/*
** Classifies the table at idx: returns n > 0 if its keys are exactly 1..n (an
** array), 0 otherwise (an object). Raw access: metatables are not consulted.
*/
static lua_Integer table_array_len(lua_State *L, int idx)
{
    lua_Integer count = 0, max = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TNUMBER || !lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
            lua_pop(L, 1);
            return 0;
        }
        lua_Integer k = lua_tointeger(L, -1);
        if (k > max)
            max = k;
        count++;
    }
    charge(L, (size_t)count);
    return count > 0 && max == count ? count : 0;
}

static void enc_table(enc_t *e, int idx, int depth)
{
    lua_State *L = e->L;
    const void *self = lua_topointer(L, idx);
    for (int i = 0; i < depth && i < RT_JSON_MAX_DEPTH; i++)
        if (e->path[i] == self)
            luaL_error(L, "json.encode: a table that contains itself (a cycle) has no JSON form");
    if (depth >= RT_JSON_MAX_DEPTH)
        luaL_error(L, "json.encode: nested too deeply");
    e->path[depth] = self;
    luaL_checkstack(L, 4, "json.encode");
    lua_Integer n = table_array_len(L, idx);
    if (n > 0) {
        buf_addc(L, e->b, '[');
        for (lua_Integer i = 1; i <= n; i++) {
            if (i > 1)
                buf_addc(L, e->b, ',');
            lua_rawgeti(L, idx, i);
            enc_value(e, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
        }
        buf_addc(L, e->b, ']');
        return;
    }
    buf_addc(L, e->b, '{');
    bool first = true;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (!first)
            buf_addc(L, e->b, ',');
        first = false;
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING) {
            size_t kl;
            const char *k = lua_tolstring(L, -2, &kl);
            enc_string(e, k, kl);
        } else if (kt == LUA_TNUMBER && lua_isinteger(L, -2)) {
            char num[32];
            int kl = snprintf(num, sizeof(num), "\"%lld\"", (long long)lua_tointeger(L, -2));
            rt_lua_buf_add(L, e->b, num, (size_t)kl);
        } else {
            luaL_error(L, "json.encode: object keys must be strings (got a %s)",
                       lua_typename(L, kt));
        }
        buf_addc(L, e->b, ':');
        enc_value(e, lua_gettop(L), depth + 1);
        lua_pop(L, 1);
    }
    buf_addc(L, e->b, '}');
}

static void enc_value(enc_t *e, int idx, int depth)
{
    lua_State *L = e->L;
    char num[40];
    int n;
    charge(L, 1);
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        rt_lua_buf_add(L, e->b, "null", 4);
        return;
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) != NULL)
            break;
        rt_lua_buf_add(L, e->b, "null", 4);
        return;
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, idx))
            rt_lua_buf_add(L, e->b, "true", 4);
        else
            rt_lua_buf_add(L, e->b, "false", 5);
        return;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            n = snprintf(num, sizeof(num), "%lld", (long long)lua_tointeger(L, idx));
        } else {
            double d = lua_tonumber(L, idx);
            if (!isfinite(d))
                luaL_error(L, "json.encode: %s cannot be written in JSON",
                           isnan(d) ? "NaN" : "inf");
            n = format_double(d, num, sizeof(num));
        }
        rt_lua_buf_add(L, e->b, num, (size_t)n);
        return;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        enc_string(e, s, len);
        return;
    }
    case LUA_TTABLE:
        enc_table(e, idx, depth);
        return;
    }
    luaL_error(L, "json.encode: cannot encode a %s", luaL_typename(L, idx));
}

static int l_encode(lua_State *L)
{
    luaL_checkany(L, 1);
    lua_settop(L, 1);
    enc_t e = {.L = L, .b = rt_lua_buf_push(L)};
    enc_value(&e, 1, 0);
    lua_pushlstring(L, e.b->p ? e.b->p : "", e.b->len);
    return 1; /* the buffer below it goes with the call; its __gc frees the bytes */
}

/* ---- Decoding ---- */

typedef struct {
    lua_State *L;
    const char *s, *p, *end;
    rt_lua_buf_t *scratch; /* unescaped string bytes */
} dec_t;

static int dec_error(dec_t *d, const char *what)
{
    return luaL_error(d->L, "json.decode: %s at byte %d", what, (int)(d->p - d->s) + 1);
}

static void skip_ws(dec_t *d)
{
    while (d->p < d->end && (*d->p == ' ' || *d->p == '\t' || *d->p == '\n' || *d->p == '\r'))
        d->p++;
}

static int hex4(dec_t *d, const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return dec_error(d, "bad \\u escape");
    }
    return v;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Pushes the string starting at the opening quote d->p. */
static void dec_string(dec_t *d)
{
    const char *start = ++d->p;
    bool escaped = false;
    const char *q = start;
    while (q < d->end && *q != '"') {
        if ((unsigned char)*q < 0x20) {
            d->p = q;
            dec_error(d, "control character in string");
        }
        if (*q == '\\') {
            escaped = true;
            q++;
        }
        q++;
    }
    if (q >= d->end) {
        d->p = d->end;
        dec_error(d, "unterminated string");
    }
    charge(d->L, (size_t)(q - start) / RT_LUA_BYTES_PER_STEP);
    if (!escaped) {
        if (!rt_utf8_valid(start, (size_t)(q - start)))
            dec_error(d, "string is not valid UTF-8");
        lua_pushlstring(d->L, start, (size_t)(q - start));
        d->p = q + 1;
        return;
    }
    rt_lua_buf_t *b = d->scratch;
    b->len = 0;
    char *o = rt_lua_buf_reserve(d->L, b, (size_t)(q - start));
    size_t k = 0;
    const char *p = start;
    while (p < q) {
        if (*p != '\\') {
            o[k++] = *p++;
            continue;
        }
        d->p = p;
        p++;
        switch (*p++) {
        case '"':
            o[k++] = '"';
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '/':
            o[k++] = '/';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'n':
            o[k++] = '\n';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'u': {
            if (q - p < 4)
                dec_error(d, "bad \\u escape");
            unsigned cp = (unsigned)hex4(d, p);
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                dec_error(d, "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - p < 6 || p[0] != '\\' || p[1] != 'u')
                    dec_error(d, "lone high surrogate");
                unsigned lo = (unsigned)hex4(d, p + 2);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    dec_error(d, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            /* An escape is at least 6 input bytes and makes at most 4: always fits. */
            k += put_utf8(o + k, cp);
            break;
        }
        default:
            dec_error(d, "bad escape");
        }
    }
    if (!rt_utf8_valid(o, k))
        dec_error(d, "string is not valid UTF-8");
    lua_pushlstring(d->L, o, k);
    d->p = q + 1;
}

static void dec_number(dec_t *d)
{
    const char *p = d->p;
    bool is_float = false;
    if (p < d->end && *p == '-')
        p++;
    if (p >= d->end || *p < '0' || *p > '9')
        dec_error(d, "bad number");
    if (*p == '0') {
        p++;
    } else {
        while (p < d->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < d->end && *p == '.') {
        is_float = true;
        p++;
        if (p >= d->end || *p < '0' || *p > '9')
            dec_error(d, "bad number");
        while (p < d->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < d->end && (*p == 'e' || *p == 'E')) {
        is_float = true;
        p++;
        if (p < d->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= d->end || *p < '0' || *p > '9')
            dec_error(d, "bad number");
        while (p < d->end && *p >= '0' && *p <= '9')
            p++;
    }
    char tmp[64];
    size_t n = (size_t)(p - d->p);
    if (n >= sizeof(tmp))
        dec_error(d, "number too long");
    memcpy(tmp, d->p, n);
    tmp[n] = 0;
    d->p = p;
    if (!is_float) {
        /* Integers that do not fit in 64 bits become floats, as in Lua itself. */
        char *endp;
        errno = 0;
        long long v = strtoll(tmp, &endp, 10);
        if (errno == 0) {
            lua_pushinteger(d->L, (lua_Integer)v);
            return;
        }
    }
    double v = strtod(tmp, NULL);
    if (!isfinite(v))
        dec_error(d, "number out of range");
    lua_pushnumber(d->L, v);
}

static void dec_value(dec_t *d, int depth);

static void dec_literal(dec_t *d, const char *lit, size_t n)
{
    if ((size_t)(d->end - d->p) < n || memcmp(d->p, lit, n) != 0)
        dec_error(d, "unexpected character");
    d->p += n;
}

/* After an opening bracket: consumes the closing one and returns true if the container is empty. */
static bool dec_empty(dec_t *d, char close)
{
    skip_ws(d);
    if (d->p < d->end && *d->p == close) {
        d->p++;
        return true;
    }
    return false;
}

/* After an element: true if a ',' announces another, false at the closing bracket. */
static bool dec_more(dec_t *d, char close)
{
    skip_ws(d);
    if (d->p < d->end && *d->p == ',') {
        d->p++;
        return true;
    }
    if (d->p < d->end && *d->p == close) {
        d->p++;
        return false;
    }
    dec_error(d, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    return false;
}

static void dec_value(dec_t *d, int depth)
{
    lua_State *L = d->L;
    skip_ws(d);
    if (d->p >= d->end)
        dec_error(d, "unexpected end of input");
    if (depth >= RT_JSON_MAX_DEPTH)
        dec_error(d, "nested too deeply");
    charge(L, 1);
    luaL_checkstack(L, 3, "json.decode");
    switch (*d->p) {
    case '{':
        d->p++;
        lua_newtable(L);
        if (dec_empty(d, '}'))
            return;
        do {
            skip_ws(d);
            if (d->p >= d->end || *d->p != '"')
                dec_error(d, "expected a string key");
            dec_string(d);
            skip_ws(d);
            if (d->p >= d->end || *d->p != ':')
                dec_error(d, "expected ':'");
            d->p++;
            dec_value(d, depth + 1);
            lua_rawset(L, -3);
        } while (dec_more(d, '}'));
        return;
    case '[': {
        d->p++;
        lua_newtable(L);
        if (dec_empty(d, ']'))
            return;
        lua_Integer i = 1;
        do {
            dec_value(d, depth + 1);
            lua_rawseti(L, -2, i++);
        } while (dec_more(d, ']'));
        return;
    }
    case '"':
        dec_string(d);
        return;
    case 't':
        dec_literal(d, "true", 4);
        lua_pushboolean(L, 1);
        return;
    case 'f':
        dec_literal(d, "false", 5);
        lua_pushboolean(L, 0);
        return;
    case 'n':
        dec_literal(d, "null", 4);
        lua_pushlightuserdata(L, NULL);
        return;
    default:
        if (*d->p == '-' || (*d->p >= '0' && *d->p <= '9')) {
            dec_number(d);
            return;
        }
        dec_error(d, "unexpected character");
    }
}

static int l_decode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    lua_settop(L, 1);
    dec_t d = {L, s, s, s + len, rt_lua_buf_push(L)};
    dec_value(&d, 0);
    skip_ws(&d);
    if (d.p != d.end)
        dec_error(&d, "trailing characters");
    return 1;
}

int rt_lua_json_open(lua_State *L, rt_lua_charge_fn charge_fn)
{
    static const luaL_Reg fns[] = {{"encode", l_encode}, {"decode", l_decode}, {NULL, NULL}};
    luaL_newlibtable(L, fns);
    rt_lua_charge_push(L, charge_fn);
    luaL_setfuncs(L, fns, 1);
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
    return 1;
}

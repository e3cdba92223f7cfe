/* Lua 5.4's string patterns with a step budget, for rules (lua_pattern.h). */
#include <ctype.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <string.h>

#include "lua_lib.h"
#include "lua_pattern.h"

#define MAX_CAPTURES 32
#define MAX_DEPTH 200     /* nested calls of do_match before "pattern too complex" */
#define CAP_OPEN (-1)     /* a capture still open */
#define CAP_POSITION (-2) /* a position capture () */
#define SPECIALS "^$*+?.([%-"

typedef struct {
    const char *init; /* start of the capture */
    ptrdiff_t len;    /* its length, CAP_OPEN or CAP_POSITION */
} capture_t;

/* One match in progress over a subject and a pattern (both NUL-terminated Lua strings). */
typedef struct {
    const char *src, *src_end; /* the subject */
    const char *pat_end;
    lua_State *L;
    rt_lua_charge_fn charge;
    size_t steps; /* not charged yet */
    int depth;    /* do_match calls left */
    int level;    /* captures started */
    capture_t cap[MAX_CAPTURES];
} ms_t;

static inline void step(ms_t *m, size_t n)
{
    m->steps += n;
    if (m->steps >= RT_PATTERN_CHARGE_EVERY) {
        size_t s = m->steps;
        m->steps = 0;
        m->charge(m->L, s);
    }
}

static void settle(ms_t *m)
{
    size_t s = m->steps;
    m->steps = 0;
    if (s)
        m->charge(m->L, s);
}

static void ms_init(ms_t *m, lua_State *L, rt_lua_charge_fn charge, const char *s, size_t ls,
                    const char *p, size_t lp)
{
    m->L = L;
    m->charge = charge;
    m->src = s;
    m->src_end = s + ls;
    m->pat_end = p + lp;
    m->steps = 0;
}

static void ms_reset(ms_t *m)
{
    m->level = 0;
    m->depth = MAX_DEPTH;
}

/* The end of the single-character class starting at p ('x', '%a', '[...]', '.'). */
static const char *class_end(ms_t *m, const char *p)
{
    char c = *p++;
    if (c == '%') {
        if (p == m->pat_end)
            luaL_error(m->L, "malformed pattern (ends with '%%')");
        return p + 1;
    }
    if (c != '[')
        return p;
    if (*p == '^')
        p++;
    /* The first character of a set may be ']' itself; '%]' never closes it. */
    do {
        if (p == m->pat_end)
            luaL_error(m->L, "malformed pattern (missing ']')");
        if (*p++ == '%' && p < m->pat_end)
            p++;
    } while (*p != ']');
    return p + 1;
}

/* Whether c is in the class %cl (a letter class, or cl itself for any other character). */
static int in_class(int c, int cl)
{
    int r;
    switch (tolower(cl)) {
    case 'a':
        r = isalpha(c);
        break;
    case 'c':
        r = iscntrl(c);
        break;
    case 'd':
        r = isdigit(c);
        break;
    case 'g':
        r = isgraph(c);
        break;
    case 'l':
        r = islower(c);
        break;
    case 'p':
        r = ispunct(c);
        break;
    case 's':
        r = isspace(c);
        break;
    case 'u':
        r = isupper(c);
        break;
    case 'w':
        r = isalnum(c);
        break;
    case 'x':
        r = isxdigit(c);
        break;
    default:
        return cl == c;
    }
    r = r != 0;
    return isupper(cl) ? !r : r;
}

/* Whether c is in the set [...] from p (at '[') to close (at ']'). */
static int in_set(int c, const char *p, const char *close)
{
    int yes = 1;
    if (p[1] == '^') {
        yes = 0;
        p++;
    }
    while (++p < close) {
        if (*p == '%') {
            p++;
            if (in_class(c, (unsigned char)*p))
                return yes;
        } else if (p[1] == '-' && p + 2 < close) {
            if ((unsigned char)p[0] <= c && c <= (unsigned char)p[2])
                return yes;
            p += 2;
        } else if ((unsigned char)*p == c) {
            return yes;
        }
    }
    return !yes;
}

/* Whether the character at s (if any) matches the class from p to ep. */
static int one_char(ms_t *m, const char *s, const char *p, const char *ep)
{
    if (s >= m->src_end)
        return 0;
    int c = (unsigned char)*s;
    switch (*p) {
    case '.':
        return 1;
    case '%':
        return in_class(c, (unsigned char)p[1]);
    case '[':
        return in_set(c, p, ep - 1);
    default:
        return (unsigned char)*p == c;
    }
}

static const char *do_match(ms_t *m, const char *s, const char *p);

/* %bxy at s (p points at x). */
static const char *balanced(ms_t *m, const char *s, const char *p)
{
    if (p >= m->pat_end - 1)
        luaL_error(m->L, "malformed pattern (missing arguments to '%%b')");
    if (s >= m->src_end || *s != *p)
        return NULL;
    char open = p[0], close = p[1];
    int depth = 1;
    while (++s < m->src_end) {
        step(m, 1);
        if (*s == close) {
            if (--depth == 0)
                return s + 1;
        } else if (*s == open) {
            depth++;
        }
    }
    return NULL;
}

/* x* / x+ (greedy): take as many as possible, then give back one at a time. */
static const char *greedy(ms_t *m, const char *s, const char *p, const char *ep)
{
    ptrdiff_t i = 0;
    while (one_char(m, s + i, p, ep))
        i++;
    step(m, (size_t)i);
    for (; i >= 0; i--) {
        const char *r = do_match(m, s + i, ep + 1);
        if (r)
            return r;
        step(m, 1);
    }
    return NULL;
}

/* x- (lazy): try the rest first, then take one more. */
static const char *lazy(ms_t *m, const char *s, const char *p, const char *ep)
{
    for (;;) {
        const char *r = do_match(m, s, ep + 1);
        if (r)
            return r;
        if (!one_char(m, s, p, ep))
            return NULL;
        s++;
        step(m, 1);
    }
}

static const char *open_capture(ms_t *m, const char *s, const char *p, ptrdiff_t what)
{
    if (m->level >= MAX_CAPTURES)
        luaL_error(m->L, "too many captures");
    m->cap[m->level].init = s;
    m->cap[m->level].len = what;
    m->level++;
    const char *r = do_match(m, s, p);
    if (!r)
        m->level--;
    return r;
}

static const char *close_capture(ms_t *m, const char *s, const char *p)
{
    int l = m->level - 1;
    while (l >= 0 && m->cap[l].len != CAP_OPEN)
        l--;
    if (l < 0)
        luaL_error(m->L, "invalid pattern capture");
    m->cap[l].len = s - m->cap[l].init;
    const char *r = do_match(m, s, p);
    if (!r)
        m->cap[l].len = CAP_OPEN;
    return r;
}

/* %1..%9: the text of an earlier capture again. */
static const char *back_reference(ms_t *m, const char *s, int digit)
{
    int l = digit - '1';
    if (l < 0 || l >= m->level || m->cap[l].len == CAP_OPEN)
        luaL_error(m->L, "invalid capture index %%%d", l + 1);
    size_t len = (size_t)m->cap[l].len;
    step(m, m->cap[l].len > 0 ? len : 0);
    if ((size_t)(m->src_end - s) >= len && memcmp(m->cap[l].init, s, len) == 0)
        return s + len;
    return NULL;
}

/* Matches pattern p at subject s: the end of the match, or NULL. */
static const char *do_match(ms_t *m, const char *s, const char *p)
{
    if (m->depth-- == 0)
        luaL_error(m->L, "pattern too complex");
    for (;;) {
        step(m, 1);
        if (p == m->pat_end)
            break;
        const char *ep;
        switch (*p) {
        case '(':
            s = p[1] == ')' ? open_capture(m, s, p + 2, CAP_POSITION)
                            : open_capture(m, s, p + 1, CAP_OPEN);
            goto done;
        case ')':
            s = close_capture(m, s, p + 1);
            goto done;
        case '$':
            if (p + 1 != m->pat_end)
                break; /* an ordinary character */
            s = s == m->src_end ? s : NULL;
            goto done;
        case '%':
            if (p[1] == 'b') {
                s = balanced(m, s, p + 2);
                if (!s)
                    goto done;
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                p += 2;
                if (*p != '[')
                    luaL_error(m->L, "missing '[' after '%%f' in pattern");
                ep = class_end(m, p);
                int prev = s == m->src ? 0 : (unsigned char)s[-1];
                int cur = s < m->src_end ? (unsigned char)*s : 0;
                if (!in_set(prev, p, ep - 1) && in_set(cur, p, ep - 1)) {
                    p = ep;
                    continue;
                }
                s = NULL;
                goto done;
            }
            if (isdigit((unsigned char)p[1])) {
                s = back_reference(m, s, (unsigned char)p[1]);
                if (!s)
                    goto done;
                p += 2;
                continue;
            }
            break; /* an escaped character or class */
        }
        /* A single-character class, maybe with a quantifier. */
        ep = class_end(m, p);
        if (!one_char(m, s, p, ep)) {
            if (*ep == '*' || *ep == '?' || *ep == '-') {
                p = ep + 1; /* zero occurrences are fine */
                continue;
            }
            s = NULL;
            goto done;
        }
        switch (*ep) {
        case '?': {
            const char *r = do_match(m, s + 1, ep + 1);
            if (r) {
                s = r;
                goto done;
            }
            p = ep + 1;
            continue;
        }
        case '+':
            s = greedy(m, s + 1, p, ep);
            goto done;
        case '*':
            s = greedy(m, s, p, ep);
            goto done;
        case '-':
            s = lazy(m, s, p, ep);
            goto done;
        default:
            s++;
            p = ep;
            continue;
        }
    }
done:
    m->depth++;
    return s;
}

/* Pushes capture i (the whole match s..e when there are none). */
static void push_capture(ms_t *m, int i, const char *s, const char *e)
{
    if (i >= m->level) {
        if (i != 0)
            luaL_error(m->L, "invalid capture index %%%d", i + 1);
        lua_pushlstring(m->L, s, (size_t)(e - s));
        return;
    }
    ptrdiff_t l = m->cap[i].len;
    if (l == CAP_OPEN)
        luaL_error(m->L, "unfinished capture");
    if (l == CAP_POSITION)
        lua_pushinteger(m->L, (m->cap[i].init - m->src) + 1);
    else
        lua_pushlstring(m->L, m->cap[i].init, (size_t)l);
}

/* Pushes every capture (or the whole match when s is not NULL and there are none). */
static int push_captures(ms_t *m, const char *s, const char *e)
{
    int n = m->level == 0 && s ? 1 : m->level;
    luaL_checkstack(m->L, n, "too many captures");
    for (int i = 0; i < n; i++)
        push_capture(m, i, s, e);
    return n;
}

/* A 1-based position, negative from the end, clipped to [1, len + 1) like string.find. */
static size_t start_index(lua_Integer pos, size_t len)
{
    if (pos > 0)
        return (size_t)pos;
    if (pos == 0 || pos < -(lua_Integer)len)
        return 1;
    return len + (size_t)pos + 1;
}

static int has_specials(const char *p, size_t lp)
{
    for (size_t i = 0; i < lp; i++)
        if (p[i] && strchr(SPECIALS, p[i]))
            return 1;
    return 0;
}

/* Plain search, charging one step per byte compared. */
static const char *find_plain(ms_t *m, const char *s, size_t ls, const char *p, size_t lp)
{
    if (lp == 0)
        return s;
    if (lp > ls)
        return NULL;
    const char *end = s + ls - lp + 1;
    while (s < end) {
        const char *hit = memchr(s, *p, (size_t)(end - s));
        step(m, (size_t)((hit ? hit : end) - s) / 16 + 1);
        if (!hit)
            return NULL;
        step(m, lp);
        if (memcmp(hit + 1, p + 1, lp - 1) == 0)
            return hit;
        s = hit + 1;
    }
    return NULL;
}

static rt_lua_charge_fn charge_of(lua_State *L)
{
    return *(rt_lua_charge_fn *)lua_touserdata(L, lua_upvalueindex(1));
}

static int find_or_match(lua_State *L, int find)
{
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    if (init > ls) {
        luaL_pushfail(L);
        return 1;
    }
    ms_t m;
    ms_init(&m, L, charge_of(L), s, ls, p, lp);
    if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
        const char *hit = find_plain(&m, s + init, ls - init, p, lp);
        settle(&m);
        if (hit) {
            lua_pushinteger(L, (hit - s) + 1);
            lua_pushinteger(L, (lua_Integer)((size_t)(hit - s) + lp));
            return 2;
        }
        luaL_pushfail(L);
        return 1;
    }
    int anchor = *p == '^';
    if (anchor)
        p++, lp--;
    m.pat_end = p + lp;
    const char *s1 = s + init;
    do {
        ms_reset(&m);
        const char *e = do_match(&m, s1, p);
        if (e) {
            settle(&m);
            if (find) {
                lua_pushinteger(L, (s1 - s) + 1);
                lua_pushinteger(L, e - s);
                return push_captures(&m, NULL, NULL) + 2;
            }
            return push_captures(&m, s1, e);
        }
    } while (s1++ < m.src_end && !anchor);
    settle(&m);
    luaL_pushfail(L);
    return 1;
}

static int p_find(lua_State *L)
{
    return find_or_match(L, 1);
}

static int p_match(lua_State *L)
{
    return find_or_match(L, 0);
}

typedef struct {
    const char *src;       /* where the next search starts */
    const char *p;         /* the pattern */
    const char *lastmatch; /* end of the last match: an empty match there is skipped */
    ms_t m;
} gmatch_t;

static int gmatch_next(lua_State *L)
{
    gmatch_t *g = lua_touserdata(L, lua_upvalueindex(3));
    g->m.L = L;
    for (const char *s = g->src; s <= g->m.src_end; s++) {
        ms_reset(&g->m);
        const char *e = do_match(&g->m, s, g->p);
        if (e && e != g->lastmatch) {
            g->src = g->lastmatch = e;
            settle(&g->m);
            return push_captures(&g->m, s, e);
        }
    }
    settle(&g->m);
    return 0;
}

static int p_gmatch(lua_State *L)
{
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    rt_lua_charge_fn charge = charge_of(L);
    lua_settop(L, 2); /* the closure keeps subject and pattern alive */
    gmatch_t *g = lua_newuserdatauv(L, sizeof(*g), 0);
    if (init > ls)
        init = ls + 1;
    ms_init(&g->m, L, charge, s, ls, p, lp);
    g->src = s + init;
    g->p = p;
    g->lastmatch = NULL;
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/* Appends the replacement string (argument 3) with %0-%9 filled in. */
static void add_template(ms_t *m, luaL_Buffer *b, const char *s, const char *e)
{
    lua_State *L = m->L;
    size_t l;
    const char *r = lua_tolstring(L, 3, &l);
    const char *end = r + l;
    step(m, l);
    while (r < end) {
        const char *pct = memchr(r, '%', (size_t)(end - r));
        if (!pct) {
            luaL_addlstring(b, r, (size_t)(end - r));
            return;
        }
        luaL_addlstring(b, r, (size_t)(pct - r));
        r = pct + 1;
        if (r < end && *r == '%') {
            luaL_addchar(b, '%');
        } else if (r < end && isdigit((unsigned char)*r)) {
            if (*r == '0') {
                luaL_addlstring(b, s, (size_t)(e - s));
            } else {
                push_capture(m, *r - '1', s, e);
                luaL_tolstring(L, -1, NULL);
                lua_remove(L, -2);
                luaL_addvalue(b);
            }
        } else {
            luaL_error(L, "invalid use of '%%' in replacement string");
        }
        r++;
    }
}

/* Appends the replacement for the match s..e; returns whether it changed anything. */
static int add_replacement(ms_t *m, luaL_Buffer *b, const char *s, const char *e, int how)
{
    lua_State *L = m->L;
    if (how == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        int n = push_captures(m, s, e);
        lua_call(L, n, 1);
    } else if (how == LUA_TTABLE) {
        push_capture(m, 0, s, e);
        lua_gettable(L, 3);
    } else {
        add_template(m, b, s, e);
        return 1;
    }
    if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        luaL_addlstring(b, s, (size_t)(e - s)); /* nil or false: keep the match */
        return 0;
    }
    if (!lua_isstring(L, -1))
        return luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    luaL_addvalue(b);
    return 1;
}

static int p_gsub(lua_State *L)
{
    size_t ls, lp;
    const char *src = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int how = lua_type(L, 3);
    lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
    luaL_argexpected(
        L, how == LUA_TNUMBER || how == LUA_TSTRING || how == LUA_TFUNCTION || how == LUA_TTABLE, 3,
        "string/function/table");
    rt_lua_charge_fn charge = charge_of(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int anchor = *p == '^';
    if (anchor)
        p++, lp--;
    ms_t m;
    ms_init(&m, L, charge, src, ls, p, lp);
    const char *lastmatch = NULL;
    lua_Integer n = 0;
    int changed = 0;
    while (n < max) {
        ms_reset(&m);
        const char *e = do_match(&m, src, p);
        if (e && e != lastmatch) {
            n++;
            changed |= add_replacement(&m, &b, src, e, how);
            src = lastmatch = e;
        } else if (src < m.src_end) {
            luaL_addchar(&b, *src++);
        } else {
            break;
        }
        if (anchor)
            break;
    }
    settle(&m);
    if (!changed) {
        lua_pushvalue(L, 1);
    } else {
        luaL_addlstring(&b, src, (size_t)(m.src_end - src));
        luaL_pushresult(&b);
    }
    lua_pushinteger(L, n);
    return 2;
}

void rt_lua_pattern_install(lua_State *L, int idx, rt_lua_charge_fn charge)
{
    static const luaL_Reg fns[] = {
        {"find", p_find}, {"match", p_match}, {"gmatch", p_gmatch}, {"gsub", p_gsub}};
    idx = lua_absindex(L, idx);
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        rt_lua_charge_push(L, charge);
        lua_pushcclosure(L, fns[i].func, 1);
        lua_setfield(L, idx, fns[i].name);
    }
}

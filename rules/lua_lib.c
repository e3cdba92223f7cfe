/* The topic and time libraries of rules, and the charge box the C libraries share (lua_lib.h). */
#include <lauxlib.h>
#include <lua.h>
#include <string.h>
#include <time.h>

#include "lua_lib.h"
#include "rt.h"
#include "topic.h"

void rt_lua_charge_push(lua_State *L, rt_lua_charge_fn charge)
{
    rt_lua_charge_fn *box = lua_newuserdatauv(L, sizeof(*box), 0);
    *box = charge;
}

void rt_lua_charge(lua_State *L, int idx, size_t steps)
{
    rt_lua_charge_fn charge = *(rt_lua_charge_fn *)lua_touserdata(L, idx);
    if (charge && steps)
        charge(L, steps);
}

int rt_lua_call_guarded(lua_State *L)
{
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

static int l_match(lua_State *L)
{
    size_t fl, tl;
    const char *f = luaL_checklstring(L, 1, &fl);
    const char *t = luaL_checklstring(L, 2, &tl);
    const char *why = rt_topic_parse_filter(f, fl, NULL);
    if (why)
        return luaL_error(L, "topic.match: \"%s\" is not a valid topic filter (%s)", f, why);
    rt_lua_charge(L, lua_upvalueindex(1), (fl + tl) / RT_LUA_BYTES_PER_STEP);
    lua_pushboolean(L, rt_topic_matches(f, fl, t, tl));
    return 1;
}

static int l_split(lua_State *L)
{
    size_t n;
    const char *t = luaL_checklstring(L, 1, &n);
    rt_lua_charge(L, lua_upvalueindex(1), n / RT_LUA_BYTES_PER_STEP);
    lua_newtable(L);
    lua_Integer k = 1;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || t[i] == '/') {
            lua_pushlstring(L, t + start, i - start);
            lua_rawseti(L, -2, k++);
            rt_lua_charge(L, lua_upvalueindex(1), 1);
            start = i + 1;
        }
    }
    return 1;
}

int rt_lua_topic_open(lua_State *L, rt_lua_charge_fn charge)
{
    static const luaL_Reg fns[] = {{"match", l_match}, {"split", l_split}, {NULL, NULL}};
    luaL_newlibtable(L, fns);
    rt_lua_charge_push(L, charge);
    luaL_setfuncs(L, fns, 1);
    return 1;
}

static int l_now_ms(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)rt_wall_ms());
    return 1;
}

static int l_format(lua_State *L)
{
    lua_Integer ms = luaL_checkinteger(L, 1);
    size_t flen;
    const char *fmt = luaL_optlstring(L, 2, RT_TIME_ISO8601, &flen);
    if (flen >= RT_TIME_FMT_MAX)
        return luaL_error(L, "time.format: format longer than %d bytes", RT_TIME_FMT_MAX - 1);
    /* Floor division, so times before 1970 keep a non-negative millisecond part. */
    time_t secs = (time_t)(ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000));
    int millis = (int)(ms - (lua_Integer)secs * 1000);
    char f2[RT_TIME_FMT_MAX * 2];
    size_t k = 0;
    for (size_t i = 0; i < flen; i++) {
        if (fmt[i] == '%' && i + 1 < flen && fmt[i + 1] == 'L') {
            k += (size_t)snprintf(f2 + k, sizeof(f2) - k, "%03d", millis);
            i++;
        } else if (fmt[i] == '%' && i + 1 < flen && fmt[i + 1] == '%') {
            f2[k++] = '%';
            f2[k++] = '%';
            i++;
        } else {
            f2[k++] = fmt[i];
        }
    }
    f2[k] = 0;
    struct tm tm;
    if (!gmtime_r(&secs, &tm))
        return luaL_error(L, "time.format: %lld is out of range", (long long)ms);
    char out[512];
    size_t n = strftime(out, sizeof(out), f2, &tm);
    if (n == 0 && k > 0)
        return luaL_error(L, "time.format: the result would be longer than %d bytes",
                          (int)sizeof(out) - 1);
    lua_pushlstring(L, out, n);
    return 1;
}

int rt_lua_time_open(lua_State *L)
{
    static const luaL_Reg fns[] = {{"now_ms", l_now_ms}, {"format", l_format}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}

/*
** The budgeted string patterns (rules/lua_pattern.c): the same results and
** errors as Lua's own string.find/match/gmatch/gsub on random patterns and
** subjects, and a runaway pattern stopped by the rule's budget.
*/
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "lua_pattern.h"
#include "rule_vm.h"
#include "test_rule_util.h"

static size_t charged;

static void count_steps(lua_State *L, size_t steps)
{
    (void)L;
    charged += steps;
}

/*
** Compares P.find/match/gmatch/gsub with string.* on n random cases; returns
** the number of mismatches (each printed) and sets *errors to the cases where
** both raised the same error.
*/
static const char differential[] =
    "local n, P = ...\n"
    "math.randomseed(7)\n"
    "local pieces = { 'a', 'b', 'c', '.', '%a', '%d', '%s', '%w', '%A', '%p', '[abc]', '[^a]',\n"
    "  '[a-c]', '[%d ]', '[]]', '[^]a]', '*', '+', '-', '?', '*', '+', '-', '?', '(', ')', '()',\n"
    "  '%b()', '%f[%w]', '%f[%W]', '%1', '%2', '%%', '%.', '$', '^', ' ', '1', 'x', '%', '[' }\n"
    "local chars = { 'a', 'b', 'c', '1', ' ', '(', ')', '.', 'x', '%', ']' }\n"
    "local function pattern()\n"
    "  local t = {}\n"
    "  if math.random(4) == 1 then t[1] = '^' end\n"
    "  for i = 1, math.random(0, 6) do t[#t + 1] = pieces[math.random(#pieces)] end\n"
    "  return table.concat(t)\n"
    "end\n"
    "local function subject()\n"
    "  local t = {}\n"
    "  for i = 1, math.random(0, 16) do t[i] = chars[math.random(#chars)] end\n"
    "  return table.concat(t)\n"
    "end\n"
    "local function pack(ok, ...)\n"
    "  local r = { ok = ok, n = select('#', ...), ... }\n"
    "  if not ok then r[1] = tostring(r[1]):gsub('^[^:]*:%d+: ', '') end\n"
    "  return r\n"
    "end\n"
    "local function same(a, b)\n"
    "  if a.ok ~= b.ok or a.n ~= b.n then return false end\n"
    "  for i = 1, a.n do if a[i] ~= b[i] then return false end end\n"
    "  return true\n"
    "end\n"
    "local function show(r)\n"
    "  local t = { tostring(r.ok) }\n"
    "  for i = 1, r.n do t[#t + 1] = tostring(r[i]) end\n"
    "  return table.concat(t, ' ')\n"
    "end\n"
    "local function all(gmatch, s, p, init)\n"
    "  local out, k = {}, 0\n"
    "  for a, b in gmatch(s, p, init) do\n"
    "    k = k + 1\n"
    "    out[#out + 1] = tostring(a) .. '|' .. tostring(b)\n"
    "    if k > 100 then break end\n"
    "  end\n"
    "  return table.concat(out, ',')\n"
    "end\n"
    "local repls = { '<%0>', '%1-%1', '%%', '%', 'x%2', function(a, b) return b and a .. b or nil "
    "end,\n"
    "  { a = 'A', ['1'] = 1, b = false }, 7 }\n"
    "local bad, errors = 0, 0\n"
    "for i = 1, n do\n"
    "  local s, p, init = subject(), pattern(), math.random(-4, 20)\n"
    "  local r = repls[math.random(#repls)]\n"
    "  local max = math.random(0, 3) == 0 and math.random(0, 2) or nil\n"
    "  local cases = {\n"
    "    { 'find', pack(pcall(string.find, s, p, init)), pack(pcall(P.find, s, p, init)) },\n"
    "    { 'find plain', pack(pcall(string.find, s, p, init, true)),\n"
    "      pack(pcall(P.find, s, p, init, true)) },\n"
    "    { 'match', pack(pcall(string.match, s, p, init)), pack(pcall(P.match, s, p, init)) },\n"
    "    { 'gmatch', pack(pcall(all, string.gmatch, s, p, init)),\n"
    "      pack(pcall(all, P.gmatch, s, p, init)) },\n"
    "    { 'gsub', pack(pcall(string.gsub, s, p, r, max)), pack(pcall(P.gsub, s, p, r, max)) },\n"
    "  }\n"
    "  for _, c in ipairs(cases) do\n"
    "    if not same(c[2], c[3]) then\n"
    "      bad = bad + 1\n"
    "      if bad <= 10 then\n"
    "        print(string.format('%s(%q, %q, %s): lua %s / ours %s', c[1], s, p, tostring(init),\n"
    "          show(c[2]), show(c[3])))\n"
    "      end\n"
    "    elseif not c[2].ok then\n"
    "      errors = errors + 1\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return bad, errors\n";

static void test_same_as_lua(void)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    CHECK_EQ(luaL_loadstring(L, differential), LUA_OK);
    long n = check_scale(40000);
    lua_pushinteger(L, n);
    lua_newtable(L);
    rt_lua_pattern_install(L, -1, count_steps);
    charged = 0;
    int rc = lua_pcall(L, 2, 2, 0);
    CHECK_EQ(rc, LUA_OK);
    if (rc)
        fprintf(stderr, "  %s\n", lua_tostring(L, -1));
    else {
        CHECK_EQ(lua_tointeger(L, -2), 0);
        CHECK(lua_tointeger(L, -1) > 100); /* errors were exercised too, and agreed */
        printf("patterns: %ld random cases x 5 functions, %lld agreeing errors, %zu steps\n", n,
               (long long)lua_tointeger(L, -1), charged);
    }
    CHECK(charged > 0);
    lua_close(L);
}

/* In a rule, a runaway pattern is a budget failure that pcall cannot hide. */
static void test_budget(void)
{
    static const char *const bodies[] = {
        "return { v = tostring(string.find(string.rep('a', 3000), '.-.-.-b')) }",
        "local s = string.rep('a', 3000) return { v = tostring(s:match('(.-)(.-)(.-)b')) }",
        "local ok = pcall(string.gsub, string.rep('a', 3000), '.-.-.-b', '') return { v = 'x' }",
        "for w in string.gmatch(string.rep('a', 3000), '.-.-.-b') do end",
        "local s = string.rep('a', 1 << 20) for i = 1, 100 do s:find(string.rep('a', 1000) .. 'b', "
        "1, true) end",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        char text[600];
        snprintf(text, sizeof(text),
                 "return { name = 'p', from = '#', select = function(msg)\n%s\nend }\n", bodies[i]);
        rt_rule_vm_t *vm;
        rt_rule_spec_t spec;
        char err[300];
        if (rt_rule_vm_new(64u << 20, 1000000, &vm))
            continue;
        CHECK_EQ(rt_rule_vm_load(vm, "p.lua", text, strlen(text), &spec, err, sizeof(err)), 0);
        rt_rule_spec_free(&spec);
        rt_rule_input_t in = msg_in("a", "");
        rt_buf_t out = {0};
        uint32_t n;
        rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, &in, &out, &n, err, sizeof(err));
        CHECK_EQ(o, RT_RULE_FAIL_BUDGET);
        /* The instruction budget, which a C function's work is charged to, so it ends inside
           the C function; or on a slow machine (TSan, a loaded one) the wall-clock limit,
           which ends the run wherever the thread is when the watchdog fires: inside a find,
           or between two in the last case's loop. */
        bool ended = (strstr(err, "instruction budget of 1000000") &&
                      strstr(err, "exceeded (in a C function)")) ||
                     strstr(err, "time limit of 1000 ms exceeded");
        CHECK(ended);
        if (o != RT_RULE_FAIL_BUDGET || !ended)
            fprintf(stderr, "  case %zu: outcome %d: %s\n", i, o, err);
        rt_buf_free(&out);
        rt_rule_vm_free(vm);
    }
}

int main(void)
{
    RUN(test_same_as_lua);
    RUN(test_budget);
    return CHECK_SUMMARY();
}

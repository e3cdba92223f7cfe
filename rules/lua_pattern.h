/*
** string.find, string.match, string.gmatch and string.gsub for rules, with the
** semantics of Lua 5.4's patterns, but budgeted. Lua's own matcher is a
** backtracking C loop that the instruction hook never sees, and a pattern such
** as ".-.-.-x" over a payload of a few kilobytes runs for minutes: one rule
** would stall its scheduler thread. These versions count their steps (one per
** pattern position tried, per character scanned or compared) and hand them to
** a charge function every RT_PATTERN_CHARGE_EVERY steps and when they return;
** the rule engine charges them to the call's instruction budget, so a runaway
** pattern fails the rule like a runaway loop.
*/
#ifndef RT_LUA_PATTERN_H
#define RT_LUA_PATTERN_H

#include <stddef.h>

#include <lua.h>

#include "lua_lib.h"

#define RT_PATTERN_CHARGE_EVERY 4096 /* steps between two charges */

/* Sets find, match, gmatch and gsub in the table at idx to the budgeted versions. */
void rt_lua_pattern_install(lua_State *L, int idx, rt_lua_charge_fn charge);

#endif

/*
** The small C libraries rules get besides json (lua_json.h):
**   topic.match(filter, topic) -> boolean   MQTT matching (topic.h): '+' one level, '#' the
**                                           rest (and the parent: "a/#" matches "a"); a
**                                           wildcard first level never matches a '$' topic;
**                                           "$share/g/f" matches what f does; what is not a
**                                           topic name (empty, '+', '#', NUL) matches nothing;
**                                           an invalid filter raises an error.
**   topic.split(topic) -> { level, ... }    every level, empty ones included
**   time.now_ms() -> integer                wall clock, milliseconds since the epoch
**   time.format(ms [, fmt]) -> string       UTC, strftime(3) conversions plus %L for
**                                           milliseconds; fmt defaults to RT_TIME_ISO8601
*/
#ifndef RT_LUA_LIB_H
#define RT_LUA_LIB_H

#include <lua.h>

#define RT_TIME_ISO8601 "%Y-%m-%dT%H:%M:%S.%LZ"
#define RT_TIME_FMT_MAX 128 /* bytes of a time.format format string */

/*
** What the C loops of these libraries (and of lua_json.h, lua_pattern.h, lua_table.h) do
** without running a Lua instruction is charged as steps: one per value or table element
** read or written, per pattern position tried, and per RT_LUA_BYTES_PER_STEP bytes scanned,
** compared or escaped. The charge function takes them; the rule engine turns them into
** instructions of the call's budget (rule_vm.h) and raises a Lua error, without returning,
** once the call is over its budget or out of time. Each library gets it when it is opened
** and keeps it in a box (rt_lua_charge_push) as an upvalue of its functions.
*/
typedef void (*rt_lua_charge_fn)(lua_State *L, size_t steps);
#define RT_LUA_BYTES_PER_STEP 16

/* Pushes a box holding charge (NULL: nothing is charged). */
void rt_lua_charge_push(lua_State *L, rt_lua_charge_fn charge);
/* Charges steps through the box at idx (an upvalue index, usually). */
void rt_lua_charge(lua_State *L, int idx, size_t steps);

/* Calls the function in upvalue 1 with the call's arguments and returns what it returns:
   the body of a guard that checks arguments and then runs the library's own function. */
int rt_lua_call_guarded(lua_State *L);

/* Push the topic and time tables; the topic functions charge their scans. */
int rt_lua_topic_open(lua_State *L, rt_lua_charge_fn charge);
int rt_lua_time_open(lua_State *L);

#endif

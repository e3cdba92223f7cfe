/*
** The small C libraries rules get besides json (lua_json.h):
**   topic.match(filter, topic) -> boolean   MQTT matching: '+' one level, '#' the rest
**                                           (and the parent: "a/#" matches "a"); a
**                                           wildcard first level never matches a '$' topic.
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

int rt_lua_topic_open(lua_State *L); /* pushes the topic table */
int rt_lua_time_open(lua_State *L);  /* pushes the time table */

/* MQTT topic filter matching on byte ranges; 1 if filter matches topic. */
int rt_topic_match(const char *filter, size_t flen, const char *topic, size_t tlen);

#endif

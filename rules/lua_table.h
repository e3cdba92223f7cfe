/*
** The table library's functions whose C loops run a count the rule picks, for rules. Lua's
** own run them unhooked: table.insert(t, pos, v) and table.remove(t, pos) shift #t - pos
** slots, table.sort compares #t elements n log n times (and `<` on two long strings is one C
** call of any length), table.move, concat and unpack loop over the range given or over #t.
** A guard that checked #t and then called Lua's own function let a __len that answers
** differently the second time choose the count after the check.
**
** So: insert, remove, sort and concat are written here, each reading #t once (Lua's
** concat reads it even when given the range); move and unpack keep Lua's code behind a
** guard that reads #t once and passes the range on explicitly. Each refuses more than
** RT_LUA_TABLE_OP_MAX elements in one call and charges what it touches (lua_lib.h: one
** step per element read or written, one per RT_LUA_BYTES_PER_STEP bytes of strings
** compared). sort is a merge sort (stable, which
** Lua's is not; no "invalid order function" error, since an inconsistent comparator cannot
** make it loop); strings compare byte by byte, as Lua's `<` does in the C locale rtd runs in.
*/
#ifndef RT_LUA_TABLE_H
#define RT_LUA_TABLE_H

#include <lua.h>

#include "lua_lib.h"

#define RT_LUA_TABLE_OP_MAX (1 << 20) /* elements one call may loop over */

/* Sets insert, remove, sort, move, concat and unpack in the table library at idx. */
void rt_lua_table_install(lua_State *L, int idx, rt_lua_charge_fn charge);

#endif

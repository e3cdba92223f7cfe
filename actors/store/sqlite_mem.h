/*
** SQLite's memory, by actor (meter.h). rt_sqlite_mem_init wraps SQLite's allocator to count
** per thread what SQLite allocates there; it must run before SQLite's first use in the
** process, so every place that opens a database calls it first (later calls do nothing). If
** SQLite was initialised before (a program that used it first), nothing is counted per
** thread and all of SQLite's memory shows as not attributed.
*/
#ifndef RT_SQLITE_MEM_H
#define RT_SQLITE_MEM_H

#include <stddef.h>

#include "meter.h"

extern rt_meter_lib_t rt_sqlite_lib;

void rt_sqlite_mem_init(void);

/* Bytes SQLite holds in the whole process, and of those what actors are charged for. */
void rt_sqlite_mem_stats(size_t *used, size_t *charged);

#endif

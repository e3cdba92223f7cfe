/*
** libbson's memory, which mongo-c-driver allocates through too, by actor (meter.h).
** rt_bson_mem_init wraps libbson's allocator to count what it holds, per thread and in all;
** rt_sinks_start calls it before the sinks make anything. Memory libbson allocated before
** (with plain malloc, as the wrapper does) is freed correctly and counted as far as it can be.
*/
#ifndef RT_BSON_MEM_H
#define RT_BSON_MEM_H

#include <stddef.h>

#include "meter.h"

extern rt_meter_lib_t rt_bson_lib;

void rt_bson_mem_init(void);

/* Bytes libbson holds in the whole process (since rt_bson_mem_init), and what actors are
   charged for. */
void rt_bson_mem_stats(size_t *used, size_t *charged);

#endif

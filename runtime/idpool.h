/*
** A lock-free allocator of small integer ids in [1, capacity): a Treiber stack
** of freed ids whose head carries a tag against ABA, over a lazily touched
** mmap'd array, plus a bump counter for ids never used. Pids and timer
** references are built from these ids and a per-id generation.
*/
#ifndef RT_IDPOOL_H
#define RT_IDPOOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_idpool_s {
    atomic_uint_fast64_t head; /* tag << 32 | first free id (0: none) */
    atomic_uint fresh;         /* ids below this have been handed out at least once */
    uint32_t capacity;
    atomic_uint *next;         /* next[id]: the free id below id on the stack */
    atomic_uint *gen;          /* gen[id]: bumped on every allocation of id */
} rt_idpool_t;

int rt_idpool_init(rt_idpool_t *p, uint32_t capacity);
void rt_idpool_destroy(rt_idpool_t *p);
/* Returns 0 and the id with its new generation, or RT_ELIMIT when all are in use. */
int rt_idpool_alloc(rt_idpool_t *p, uint32_t *id, uint32_t *gen);
void rt_idpool_free(rt_idpool_t *p, uint32_t id);
/* Bytes its arrays reserve, and of those the pages in memory. */
void rt_idpool_mem(const rt_idpool_t *p, size_t *mapped, size_t *resident);

#endif

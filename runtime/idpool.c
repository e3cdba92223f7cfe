/*
** The id allocator (idpool.h): its arrays are reserved once and touched only as ids are
** first handed out, so a capacity of millions costs nothing until used.
*/
#include <sys/mman.h>

#include "internal.h"

static void *reserve(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int rt_idpool_init(rt_idpool_t *p, uint32_t capacity)
{
    p->capacity = capacity;
    p->next = reserve((size_t)capacity * sizeof(atomic_uint));
    p->gen = reserve((size_t)capacity * sizeof(atomic_uint));
    if (!p->next || !p->gen) {
        rt_idpool_destroy(p);
        return RT_ENOMEM;
    }
    atomic_store(&p->head, 0);
    atomic_store(&p->fresh, 1); /* id 0 is never handed out, so 0 can mean "none" */
    return 0;
}

void rt_idpool_destroy(rt_idpool_t *p)
{
    if (p->next)
        munmap(p->next, (size_t)p->capacity * sizeof(atomic_uint));
    if (p->gen)
        munmap(p->gen, (size_t)p->capacity * sizeof(atomic_uint));
    p->next = p->gen = NULL;
}

int rt_idpool_alloc(rt_idpool_t *p, uint32_t *id, uint32_t *gen)
{
    uint64_t head = atomic_load_explicit(&p->head, memory_order_acquire);
    uint32_t got = 0;
    while ((uint32_t)head != 0) {
        uint32_t top = (uint32_t)head;
        uint32_t below = atomic_load_explicit(&p->next[top], memory_order_relaxed);
        uint64_t want = ((head >> 32) + 1) << 32 | below;
        if (atomic_compare_exchange_weak_explicit(&p->head, &head, want, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            got = top;
            break;
        }
    }
    if (!got) {
        got = atomic_fetch_add_explicit(&p->fresh, 1, memory_order_relaxed);
        if (got >= p->capacity) {
            atomic_fetch_sub_explicit(&p->fresh, 1, memory_order_relaxed);
            return RT_ELIMIT;
        }
    }
    *id = got;
    *gen = atomic_fetch_add_explicit(&p->gen[got], 1, memory_order_relaxed) + 1;
    return 0;
}

void rt_idpool_free(rt_idpool_t *p, uint32_t id)
{
    uint64_t head = atomic_load_explicit(&p->head, memory_order_acquire);
    for (;;) {
        atomic_store_explicit(&p->next[id], (uint32_t)head, memory_order_relaxed);
        uint64_t want = ((head >> 32) + 1) << 32 | id;
        if (atomic_compare_exchange_weak_explicit(&p->head, &head, want, memory_order_acq_rel,
                                                  memory_order_acquire))
            return;
    }
}

void rt_idpool_mem(const rt_idpool_t *p, size_t *mapped, size_t *resident)
{
    size_t bytes = (size_t)p->capacity * sizeof(atomic_uint);
    *mapped = p->next ? 2 * bytes : 0;
    *resident = p->next ? rt__resident(p->next, bytes) + rt__resident(p->gen, bytes) : 0;
}

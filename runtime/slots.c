/*
** The pid table. A pid is (generation << 32 | slot index). The slot array is
** reserved for max_actors entries with MAP_NORESERVE and touched lazily, so
** unused capacity costs address space only. A slot is only reused after its
** actor has been reclaimed (see ebr.c), and each reuse bumps the generation,
** so a stale pid never reaches a new actor.
*/
#include <sys/mman.h>

#include "internal.h"

int rt__slots_init(rt_runtime_t *rt)
{
    size_t bytes = (size_t)rt->cfg.max_actors * sizeof(rt_slot_t);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return RT_ENOMEM;
    rt->slots = p;
    int rc = rt_idpool_init(&rt->ids, rt->cfg.max_actors);
    if (rc) {
        munmap(p, bytes);
        rt->slots = NULL;
    }
    return rc;
}

void rt__slots_destroy(rt_runtime_t *rt)
{
    if (rt->slots)
        munmap(rt->slots, (size_t)rt->cfg.max_actors * sizeof(rt_slot_t));
    rt->slots = NULL;
    rt_idpool_destroy(&rt->ids);
}

rt_actor_t *rt__lookup(rt_pid_t pid)
{
    rt_runtime_t *rt = rt__rt;
    uint32_t idx = (uint32_t)pid;
    if (idx == 0 || idx >= atomic_load_explicit(&rt->ids.fresh, memory_order_relaxed))
        return NULL;
    rt_actor_t *a = atomic_load_explicit(&rt->slots[idx].actor, memory_order_acquire);
    if (!a || a->pid != pid)
        return NULL;
    if (atomic_load_explicit(&a->sync_flags, memory_order_acquire) & RT_AF_DEAD)
        return NULL;
    return a;
}

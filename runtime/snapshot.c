/*
** Introspection. A snapshot walks the pid table inside an EBR region, so
** every actor it reads stays allocated, and copies counters that owners
** publish with relaxed atomic stores: no actor is stopped or locked, memory
** use is constant, and the cost is O(actors). The copy is consistent per
** counter, not across counters, which is what a live view needs.
*/
#include <string.h>

#include "internal.h"

static void fill(rt_actor_t *a, rt_actor_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->pid = a->pid;
    out->type = a->type->name ? a->type->name : "";
    char *name = atomic_load_explicit(&a->name, memory_order_acquire);
    if (name) {
        strncpy(out->name, name, sizeof(out->name) - 1);
    }
    out->status = (rt_actor_status_t)atomic_load_explicit(&a->status, memory_order_relaxed);
    out->reductions = atomic_load_explicit(&a->reductions, memory_order_relaxed);
    uint64_t sent = atomic_load_explicit(&a->sent, memory_order_relaxed);
    uint64_t recv = atomic_load_explicit(&a->received, memory_order_relaxed);
    out->mailbox_len = sent > recv ? sent - recv : 0;
    /* The heap is the owner's; its counters are single words, read racily for display. */
    rt_heap_stats_t hs = {0};
    rt_heap_t *heap = atomic_load_explicit(&a->heap, memory_order_acquire);
    if (heap)
        rt_heap_stats(heap, &hs);
    out->state_bytes = sizeof(rt_actor_t) + rt__inline_offset(a->type) + a->type->heap_inline;
    /* The header is malloc'd by the first allocation: the actor's too. */
    out->heap_bytes = hs.heap_bytes + (heap ? sizeof(*heap) : 0);
    out->heap_malloc_bytes = hs.large_bytes + (heap ? sizeof(*heap) : 0);
    out->bin_bytes = hs.bin_bytes;
    out->ext_bytes = hs.ext_bytes;
    out->live_bytes = hs.live_bytes;
    out->next_gc = hs.next_gc;
    out->gc_count = hs.gc_count;
    out->gc_last_pause_us = hs.last_pause_us;
    out->gc_max_pause_us = hs.max_pause_us;
    out->cpu_ns = rt__ticks_to_ns(atomic_load_explicit(&a->cpu_ticks, memory_order_relaxed));
    out->current_tag = atomic_load_explicit(&a->current_tag, memory_order_relaxed);
    const char *hn = a->type->tag_name ? a->type->tag_name(out->current_tag) : NULL;
    out->current_handler = hn ? hn : "";
    out->scheduler = __atomic_load_n(&a->last_sched, __ATOMIC_RELAXED); /* set at each turn */
}

size_t rt_snapshot_actors(void (*fn)(const rt_actor_info_t *info, void *ud), void *ud)
{
    rt_runtime_t *rt = rt__rt;
    if (!rt)
        return 0;
    bool ext = rt__tls.ebr == NULL;
    if (ext)
        rt__external_enter();
    size_t visited = 0;
    uint32_t fresh = atomic_load(&rt->ids.fresh);
    rt_actor_info_t info;
    for (uint32_t i = 1; i < fresh && i < rt->cfg.max_actors; i++) {
        rt_actor_t *a = atomic_load_explicit(&rt->slots[i].actor, memory_order_acquire);
        if (!a || (atomic_load_explicit(&a->sync_flags, memory_order_acquire) & RT_AF_DEAD))
            continue;
        fill(a, &info);
        fn(&info, ud);
        visited++;
    }
    if (ext)
        rt__external_leave();
    return visited;
}

int rt_actor_info(rt_pid_t pid, rt_actor_info_t *out)
{
    if (!rt__rt)
        return RT_ENOPROC;
    bool ext = rt__tls.ebr == NULL;
    if (ext)
        rt__external_enter();
    rt_actor_t *a = rt__lookup(pid);
    if (a)
        fill(a, out);
    if (ext)
        rt__external_leave();
    return a ? 0 : RT_ENOPROC;
}

size_t rt_snapshot_schedulers(rt_sched_info_t *out, size_t max)
{
    rt_runtime_t *rt = rt__rt;
    if (!rt)
        return 0;
    uint64_t now = rt_mono_ns();
    size_t n = 0;
    for (unsigned i = 0; i < rt->nsched && n < max; i++, n++) {
        rt_sched_t *s = &rt->sched[i];
        out[n] = (rt_sched_info_t){
            .index = i,
            .busy_ns = rt__ticks_to_ns(atomic_load(&s->busy_ticks)),
            .wall_ns = now - s->started_ns,
            .run_queue = atomic_load(&s->qlen),
            .turns = atomic_load(&s->turns),
            .steals = atomic_load(&s->steals),
        };
    }
    if (n < max) {
        rt_blocking_pool_t *b = &rt->blocking;
        pthread_mutex_lock(&b->lock);
        size_t len = b->len;
        pthread_mutex_unlock(&b->lock);
        out[n++] = (rt_sched_info_t){
            .index = rt->nsched,
            .blocking_pool = true,
            .busy_ns = rt__ticks_to_ns(atomic_load(&b->busy_ticks)),
            .wall_ns = (now - b->started_ns) * (b->nthreads ? b->nthreads : 1),
            .run_queue = len,
            .turns = atomic_load(&b->turns),
        };
    }
    return n;
}

void rt_mem_stats(rt_mem_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    rt_runtime_t *rt = rt__rt;
    if (!rt)
        return;
    rt__slab_stats(&out->slab_mapped, &out->slab_in_use);
    out->slab_resident = rt__slab_resident();
    rt_heap_pool_stats(&out->chunks_mapped, &out->chunks_in_use);
    size_t map_mapped, map_resident, ids_mapped, ids_resident, t_mapped, t_resident;
    rt_heap_pool_resident(&out->chunks_resident, &map_mapped, &map_resident);
    rt_idpool_mem(&rt->ids, &ids_mapped, &ids_resident);
    rt__timers_slots_mem(&t_mapped, &t_resident);
    size_t slots = (size_t)rt->cfg.max_actors * sizeof(rt_slot_t);
    size_t by_fd = rt->by_fd_len * sizeof(*rt->by_fd);
    out->tables_mapped = map_mapped + ids_mapped + t_mapped + slots + by_fd;
    out->tables_resident = map_resident + ids_resident + t_resident +
                           rt__resident(rt->slots, slots) +
                           (rt->by_fd ? rt__resident((void *)rt->by_fd, by_fd) : 0);
    size_t held;
    rt__msg_pool_stats(&out->envelopes_in_use, &held);
    out->envelopes_free = held > out->envelopes_in_use ? held - out->envelopes_in_use : 0;
    out->sockets = atomic_load_explicit(&rt->sock_bytes, memory_order_relaxed);
    out->sockets_cached = atomic_load_explicit(&rt->sock_cached_bytes, memory_order_relaxed);
    out->binaries_free = rt__bin_pool_free_bytes();
    out->schedulers = sizeof(*rt) + rt->nsched * (sizeof(rt_sched_t) + RT_SCRATCH_BYTES);
}

/*
** Timers: send_after and cancel, cheap enough for one keepalive timer per
** connection. Each scheduler keeps its timers in a binary min-heap of plain
** structs, and its sleeps end by the earliest one (timer_due_ns), so 100,000
** timers cost 100,000 heap entries and no kernel object.
**
** A timer reference is (generation << 32 | id). The per-id state word
** (generation << 2 | state) decides, with one CAS, whether the firing
** scheduler or a canceller on any thread wins. Cancelled entries stay in the
** heap until they surface or the heap is compacted, which happens when it has
** doubled since the last compaction, so the cost stays amortised O(log n).
*/
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define T_FREE 0u
#define T_PENDING 1u
#define T_CANCELLED 2u
#define T_FIRED 3u
#define RT_TIMERS_MAX (1u << 22) /* timers pending at once, process-wide */
#define RT_TIMER_MIN_COMPACT 1024

static rt_idpool_t timer_ids;
static atomic_uint_fast64_t *timer_state; /* by id: gen << 2 | state */

/*
** The state table is reserved like the id pool's arrays and touched as ids are first
** used: from calloc, malloc would count all 32 MiB as its own while a few pages are in
** memory, and rtctl vm reads malloc's figures.
*/
int rt__timers_slots_init(void)
{
    int rc = rt_idpool_init(&timer_ids, RT_TIMERS_MAX);
    if (rc)
        return rc;
    void *p = mmap(NULL, RT_TIMERS_MAX * sizeof(*timer_state), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    timer_state = p == MAP_FAILED ? NULL : p;
    return timer_state ? 0 : RT_ENOMEM;
}

void rt__timers_slots_destroy(void)
{
    rt_idpool_destroy(&timer_ids);
    if (timer_state)
        munmap(timer_state, RT_TIMERS_MAX * sizeof(*timer_state));
    timer_state = NULL;
}

void rt__timers_slots_mem(size_t *mapped, size_t *resident)
{
    rt_idpool_mem(&timer_ids, mapped, resident);
    if (!timer_state)
        return;
    *mapped += RT_TIMERS_MAX * sizeof(*timer_state);
    *resident += rt__resident(timer_state, RT_TIMERS_MAX * sizeof(*timer_state));
}

void rt__timers_init(rt_sched_t *s)
{
    memset(&s->timers, 0, sizeof(s->timers));
    s->timers.compact_at = RT_TIMER_MIN_COMPACT;
    atomic_store(&s->timer_inbox, NULL);
}

/* A node's message, if it carries one (a tag-only timer's is made when it fires). */
static inline rt_msg_t *node_msg(const rt_timer_node_t *n)
{
    return n->tag ? NULL : n->msg;
}

/*
** A node in a heap owns its id until release: nobody else changes its state but a
** cancel, from pending to cancelled with the same generation. So the generation is
** read back from the state rather than kept in every node.
*/
static inline uint64_t state_as(const rt_timer_node_t *n, unsigned st)
{
    return (atomic_load_explicit(&timer_state[n->id], memory_order_relaxed) & ~(uint64_t)3) | st;
}

#ifndef NDEBUG
static unsigned state_of(const rt_timer_node_t *n)
{
    return (unsigned)(atomic_load_explicit(&timer_state[n->id], memory_order_relaxed) & 3);
}

/* Heap order below node i: neither child is due before it. */
static bool children_ok(const rt_timer_heap_t *h, size_t i)
{
    size_t c = 2 * i + 1;
    return (c >= h->len || h->nodes[c].due_ns >= h->nodes[i].due_ns) &&
           (c + 1 >= h->len || h->nodes[c + 1].due_ns >= h->nodes[i].due_ns);
}
#endif

/* Pending to fired; false when it was cancelled. */
static bool claim(const rt_timer_node_t *n)
{
    RT_ASSERT(state_of(n) != T_FREE); /* a node in a heap owns its id until release */
    uint64_t expect = state_as(n, T_PENDING);
    return atomic_compare_exchange_strong(&timer_state[n->id], &expect, state_as(n, T_FIRED));
}

static void release(rt_timer_node_t *n)
{
    RT_ASSERT(n->id != 0 && n->id < RT_TIMERS_MAX);
    RT_ASSERT(state_of(n) != T_FREE); /* released once: the id may be someone else's after */
    atomic_store_explicit(&timer_state[n->id], state_as(n, T_FREE), memory_order_release);
    rt_idpool_free(&timer_ids, n->id);
    atomic_fetch_sub_explicit(&rt__rt->timers_pending, 1, memory_order_relaxed);
}

void rt__timers_destroy(rt_sched_t *s)
{
    rt_timer_handoff_t *h = atomic_exchange(&s->timer_inbox, NULL);
    while (h) {
        rt_timer_handoff_t *next = h->next;
        rt_msg_free(node_msg(&h->node));
        release(&h->node);
        free(h);
        h = next;
    }
    for (size_t i = 0; i < s->timers.len; i++) {
        rt_msg_free(node_msg(&s->timers.nodes[i]));
        release(&s->timers.nodes[i]);
    }
    free(s->timers.nodes);
    memset(&s->timers, 0, sizeof(s->timers));
}

static void sift_up(rt_timer_heap_t *h, size_t i)
{
    rt_timer_node_t n = h->nodes[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->nodes[p].due_ns <= n.due_ns)
            break;
        h->nodes[i] = h->nodes[p];
        i = p;
    }
    h->nodes[i] = n;
    /* Only a new leaf is sifted up, so the heap is in order around where it stopped. */
    RT_ASSERT(i == 0 || h->nodes[(i - 1) / 2].due_ns <= n.due_ns);
    RT_ASSERT(children_ok(h, i));
}

static void sift_down(rt_timer_heap_t *h, size_t i)
{
    rt_timer_node_t n = h->nodes[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->len)
            break;
        if (c + 1 < h->len && h->nodes[c + 1].due_ns < h->nodes[c].due_ns)
            c++;
        if (h->nodes[c].due_ns >= n.due_ns)
            break;
        h->nodes[i] = h->nodes[c];
        i = c;
    }
    h->nodes[i] = n;
    /* Not the parent: compact's bottom-up rebuild has not ordered the levels above yet. */
    RT_ASSERT(children_ok(h, i));
}

static bool is_pending(const rt_timer_node_t *n)
{
    return (atomic_load_explicit(&timer_state[n->id], memory_order_acquire) & 3) == T_PENDING;
}

/* Drops cancelled timers; rebuilding the heap bottom-up is O(n). */
static void compact(rt_timer_heap_t *h)
{
    size_t kept = 0;
    for (size_t i = 0; i < h->len; i++) {
        rt_timer_node_t *n = &h->nodes[i];
        if (is_pending(n)) {
            h->nodes[kept++] = *n;
        } else {
            rt_msg_free(node_msg(n));
            release(n);
        }
    }
    h->len = kept;
    for (size_t i = kept / 2; i-- > 0;)
        sift_down(h, i);
    h->compact_at = kept * 2 > RT_TIMER_MIN_COMPACT ? kept * 2 : RT_TIMER_MIN_COMPACT;
}

static void arm(rt_sched_t *s);

static int heap_insert(rt_timer_heap_t *h, const rt_timer_node_t *n)
{
    RT_ASSERT(n->tag || n->msg); /* a node carries a message or a tag: firing needs one */
    /* Nobody has claimed it yet; a canceller may have got there first. */
    RT_ASSERT((1u << state_of(n)) & (1u << T_PENDING | 1u << T_CANCELLED));
    if (h->len >= h->compact_at)
        compact(h);
    if (rt_grow(&h->nodes, &h->cap, h->len + 1, sizeof(*h->nodes), 64))
        return RT_ENOMEM;
    h->nodes[h->len] = *n;
    sift_up(h, h->len++);
    RT_ASSERT(h->len <= h->cap);
    return 0;
}

void rt__timers_trim(rt_sched_t *s)
{
    RT_ASSERT(s == rt__tls.sched); /* a heap is its scheduler's alone */
    rt_timer_heap_t *h = &s->timers;
    /* A timer whose actor has exited would only make a dead letter when it fires (a
       keepalive, minutes away): it is dropped now, with the room it takes. */
    for (size_t i = 0; i < h->len; i++) {
        if (!rt__lookup(h->nodes[i].to))
            claim(&h->nodes[i]);
    }
    compact(h);
    /* Cancelled timers of actors that left are gone; so is the room they took. */
    size_t want = h->len * 2 > 64 ? h->len * 2 : 64;
    if (h->cap > 2 * want) {
        rt_timer_node_t *n = realloc(h->nodes, want * sizeof(*n));
        if (n) {
            h->nodes = n;
            h->cap = want;
        }
    }
    arm(s);
}

/* Tells the scheduler's sleep when the earliest timer is due. */
static void arm(rt_sched_t *s)
{
    s->timer_due_ns = s->timers.len ? s->timers.nodes[0].due_ns : 0;
}

void rt__timers_run(rt_sched_t *s)
{
    RT_ASSERT(s == rt__tls.sched); /* a heap is its scheduler's alone */
    rt_timer_handoff_t *h = atomic_exchange_explicit(&s->timer_inbox, NULL, memory_order_acquire);
    while (h) {
        rt_timer_handoff_t *next = h->next;
        if (heap_insert(&s->timers, &h->node)) {
            rt_msg_free(node_msg(&h->node));
            release(&h->node);
        }
        free(h);
        h = next;
    }
    rt_timer_heap_t *th = &s->timers;
    uint64_t now = th->len ? rt_mono_ns() : 0;
    while (th->len && th->nodes[0].due_ns <= now) {
        rt_timer_node_t n = th->nodes[0];
        th->nodes[0] = th->nodes[--th->len];
        if (th->len)
            sift_down(th, 0);
        if (claim(&n)) {
            rt_msg_t *m = node_msg(&n);
            if (!m && (m = rt_msg_new(n.tag, 0)) != NULL)
                m->from = n.from;
            rt_send_msg(n.to, m);
        } else {
            rt_msg_free(node_msg(&n));
        }
        release(&n);
    }
    arm(s);
}

/* Arms a timer for node n (due, to, msg or tag filled in); ownership of n.msg passes here. */
static int start_timer(rt_timer_node_t n, rt_ref_t *ref)
{
    rt_runtime_t *rt = rt__rt;
    uint32_t id, gen;
    int rc = rt_idpool_alloc(&timer_ids, &id, &gen);
    if (rc) {
        rt_msg_free(node_msg(&n));
        return rc;
    }
    n.id = id;
    atomic_store_explicit(&timer_state[id], (uint64_t)gen << 2 | T_PENDING, memory_order_release);
    atomic_fetch_add_explicit(&rt->timers_pending, 1, memory_order_relaxed);
    if (ref)
        *ref = (rt_ref_t)gen << 32 | id;
    rt_sched_t *s = rt__tls.sched;
    if (s) {
        rc = heap_insert(&s->timers, &n);
        if (!rc)
            arm(s);
    } else {
        /* Not a scheduler thread: hand the timer to one, which adopts it on its next poll. */
        rt_timer_handoff_t *h = malloc(sizeof(*h));
        if (!h) {
            rc = RT_ENOMEM;
        } else {
            h->node = n;
            s = &rt->sched[atomic_fetch_add_explicit(&rt->rr, 1, memory_order_relaxed) %
                           rt->nsched];
            rt_timer_handoff_t *head = atomic_load(&s->timer_inbox);
            do {
                h->next = head;
            } while (!atomic_compare_exchange_weak(&s->timer_inbox, &head, h));
            rt__sched_wake(s);
        }
    }
    if (rc) {
        rt_msg_free(node_msg(&n));
        release(&n);
    }
    return rc;
}

int rt_send_after(uint64_t ms, rt_pid_t to, rt_msg_t *m, rt_ref_t *ref)
{
    if (!m)
        return RT_ENOMEM;
    rt_actor_t *cur = rt__tls.current;
    m->from = cur ? cur->pid : 0;
    return start_timer(
        (rt_timer_node_t){.due_ns = rt_mono_ns() + ms * 1000000u, .to = to, .msg = m}, ref);
}

int rt_send_after_tag(uint64_t ms, rt_pid_t to, uint32_t tag, rt_ref_t *ref)
{
    if (!tag)
        return RT_EINVAL; /* no message has tag 0, and a node tells its kind by it */
    rt_actor_t *cur = rt__tls.current;
    return start_timer((rt_timer_node_t){.due_ns = rt_mono_ns() + ms * 1000000u,
                                         .to = to,
                                         .tag = tag,
                                         .from = cur ? cur->pid : 0},
                       ref);
}

int rt_cancel_timer(rt_ref_t ref)
{
    uint32_t id = (uint32_t)ref, gen = (uint32_t)(ref >> 32);
    if (id == 0 || id >= RT_TIMERS_MAX)
        return RT_ENOTFOUND;
    uint64_t expect = (uint64_t)gen << 2 | T_PENDING;
    if (atomic_compare_exchange_strong(&timer_state[id], &expect, (uint64_t)gen << 2 | T_CANCELLED))
        return 0;
    return RT_ENOTFOUND;
}

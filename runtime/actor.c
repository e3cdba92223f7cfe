/*
** Actors: spawn, mailboxes, sends, turns, exit signals, links, monitors and
** the name registry.
**
** Mailbox: Vyukov's intrusive MPSC queue with a stub node, so a popped
** message is fully detached and freed right after its handler. Pony's trick
** makes scheduling free: the low bit of the head means "empty and not
** scheduled", so the push that finds it set is the one that schedules the
** actor, and the end of a turn clears it only if the queue is still empty.
**
** Signals (link, unlink, exit, monitor, demonitor) go on a separate stack
** that the owner drains before any user message, so they overtake the
** mailbox; a WAKE marker pushed into the mailbox gets a sleeping actor
** scheduled to look at them. Everything about an actor's links and monitors is
** touched only by the thread running it.
*/
#include <stdlib.h>
#include <string.h>

#include "internal.h"

_Thread_local rt_tls_t rt__tls;

#define EMPTY_BIT ((uintptr_t)1)

static inline rt_msg_t *stub_of(rt_actor_t *a)
{
    return (rt_msg_t *)(void *)&a->stub_next;
}

static inline rt_msg_t *msg_next(rt_msg_t *m)
{
    return atomic_load_explicit(&m->next, memory_order_acquire);
}

#ifndef NDEBUG
#define RT_CHAIN_CHECK_MAX 64 /* mailbox nodes a debug check walks, from the consumer's end */

/*
** Owner only, in the spirit of Pony's well_formed_msg_chain: the first nodes from the
** consumer's end form a list with no cycle (Floyd's two pointers, bounded), in which the
** stub appears at most once. Producers only append past the last node, so the walk sees
** a list that only grows; no node on it is freed but by the owner's pop.
*/
static bool mbox_well_formed(rt_actor_t *a)
{
    rt_msg_t *stub = stub_of(a), *slow = a->mbox_tail, *fast = slow;
    unsigned stubs = slow == stub;
    for (int i = 0; i < RT_CHAIN_CHECK_MAX; i++) {
        rt_msg_t *next = msg_next(fast);
        if (!next)
            return stubs <= 1;
        stubs += next == stub;
        fast = next;
        if (i & 1) {
            slow = msg_next(slow);
            if (slow == fast)
                return false;
        }
    }
    return stubs <= 1;
}
#endif

/* Returns true when the mailbox was empty and unscheduled: the caller schedules. */
static bool mbox_push(rt_actor_t *a, rt_msg_t *m)
{
    RT_ASSERT(m != stub_of(a)); /* only the owner re-queues the stub (mbox_pop) */
    atomic_store_explicit(&m->next, NULL, memory_order_relaxed);
    rt_msg_t *prev = atomic_exchange_explicit(&a->mbox_head, m, memory_order_acq_rel);
    bool was_empty = ((uintptr_t)prev & EMPTY_BIT) != 0;
    prev = (rt_msg_t *)((uintptr_t)prev & ~EMPTY_BIT);
    atomic_store_explicit(&prev->next, m, memory_order_release);
    return was_empty;
}

/* Owner only. NULL when empty, or when a push is halfway done (seen again next turn). */
static rt_msg_t *mbox_pop(rt_actor_t *a)
{
    rt_msg_t *stub = stub_of(a);
    rt_msg_t *tail = a->mbox_tail;
    RT_ASSERT(tail); /* never NULL: the stub stands in for an empty queue */
    rt_msg_t *next = msg_next(tail);
    if (tail == stub) {
        if (!next)
            return NULL;
        a->mbox_tail = next;
        tail = next;
        next = msg_next(next);
    }
    if (next) {
        a->mbox_tail = next;
        return tail;
    }
    rt_msg_t *head =
        (rt_msg_t *)((uintptr_t)atomic_load_explicit(&a->mbox_head, memory_order_acquire) &
                     ~EMPTY_BIT);
    if (tail != head)
        return NULL;
    /* tail is the last node: put the stub behind it so tail can be detached. */
    atomic_store_explicit(&stub->next, NULL, memory_order_relaxed);
    rt_msg_t *prev = atomic_exchange_explicit(&a->mbox_head, stub, memory_order_acq_rel);
    prev = (rt_msg_t *)((uintptr_t)prev & ~EMPTY_BIT);
    atomic_store_explicit(&prev->next, stub, memory_order_release);
    next = msg_next(tail);
    if (next) {
        a->mbox_tail = next;
        return tail;
    }
    return NULL;
}

/* Owner only: marks the mailbox empty and unscheduled if it still is empty. */
static bool mbox_markempty(rt_actor_t *a)
{
    rt_msg_t *stub = stub_of(a);
    if (a->mbox_tail != stub || msg_next(stub))
        return false;
    rt_msg_t *expect = stub;
    return atomic_compare_exchange_strong_explicit(&a->mbox_head, &expect,
                                                   (rt_msg_t *)((uintptr_t)stub | EMPTY_BIT),
                                                   memory_order_acq_rel, memory_order_relaxed);
}

/* ---- Entering the runtime from threads it does not own ---- */

static pthread_mutex_t external_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_ebr_thread_t *external_ebr;

void rt__external_enter(void)
{
    RT_ASSERT(!rt__tls.ebr); /* not a runtime thread, nor one already inside */
    pthread_mutex_lock(&external_lock);
    if (!external_ebr)
        external_ebr = rt__ebr_register();
    rt__tls.ebr = external_ebr;
    rt__ebr_enter(external_ebr);
}

void rt__external_leave(void)
{
    RT_ASSERT(rt__tls.ebr == external_ebr); /* pairs with rt__external_enter */
    rt__ebr_leave(external_ebr);
    rt__tls.ebr = NULL;
    pthread_mutex_unlock(&external_lock);
}

/* Releases the shared record at shutdown; its leftovers become orphans. */
static void external_release(void)
{
    pthread_mutex_lock(&external_lock);
    if (external_ebr)
        rt__ebr_unregister(external_ebr);
    external_ebr = NULL;
    pthread_mutex_unlock(&external_lock);
}

/* True when this call had to enter as an external thread (and must leave). */
static inline bool enter_any(void)
{
    if (RT_LIKELY(rt__tls.ebr != NULL))
        return false;
    rt__external_enter();
    return true;
}

static inline void leave_any(bool external)
{
    if (external)
        rt__external_leave();
}

/* ---- Relations (links and monitors) ---- */

static int rel_find(rt_actor_t *a, uint32_t kind, rt_pid_t pid, rt_ref_t ref)
{
    for (uint32_t i = 0; i < a->nrels; i++) {
        rt_rel_t *r = &a->rels[i];
        if (r->kind == kind && (ref ? r->ref == ref : r->pid == pid))
            return (int)i;
    }
    return -1;
}

static int rel_add(rt_actor_t *a, uint32_t kind, rt_pid_t pid, rt_ref_t ref)
{
    size_t cap = a->caprels; /* uint32_t in the actor: links and monitors are few */
    if (a->nrels == UINT32_MAX || rt_grow(&a->rels, &cap, a->nrels + 1, sizeof(*a->rels), 4))
        return RT_ENOMEM;
    a->caprels = (uint32_t)(cap < UINT32_MAX ? cap : UINT32_MAX);
    a->rels[a->nrels++] = (rt_rel_t){.pid = pid, .ref = ref, .kind = kind};
    RT_ASSERT(a->nrels <= a->caprels);
    return 0;
}

static void rel_remove_at(rt_actor_t *a, int i)
{
    RT_ASSERT(i >= 0 && (uint32_t)i < a->nrels);
    a->rels[i] = a->rels[--a->nrels];
}

/* ---- Sending ---- */

/*
** Whether a sender under socket pressure may wait for target (flags tf): only for an
** overloaded target that is neither under pressure nor parked itself, so runs and drains
** without it. Such a sender must run to flush its socket and lift its own pressure, so it
** never waits for an actor that waits: a target that parks, or comes under pressure, first
** lets go of the pressured senders parked under it (release_pressured), and no cycle of
** parked actors can hold one.
*/
static bool pressured_may_wait(const rt_actor_t *target, unsigned tf)
{
    return (tf & RT_AF_OVERLOADED) && !(tf & RT_AF_BACKPRESSURE) &&
           atomic_load_explicit(&target->status, memory_order_relaxed) != RT_STATUS_MUTED;
}

/*
** Decides whether the current actor gets muted for sending to target.
** Overload (Pony's rule): an overloaded sender is never muted, or two overloaded
** actors feeding each other would park each other for good.
** Socket pressure: any sender is muted, even an overloaded one, except an actor
** that is under socket pressure itself; such actors always run, so they flush
** and lift their own pressure, and no cycle of muted actors can form.
** A sender under socket pressure still waits for an overloaded target that runs
** (pressured_may_wait): a publisher whose client reads nothing, not even its acks,
** must not fill a rule worker's mailbox for being under pressure.
*/
static void mute_check(rt_actor_t *target)
{
    rt_actor_t *cur = rt__tls.current;
    if (!cur || cur == target || cur->mute_target)
        return;
    /* seq_cst, against the owner's seq_cst raising of pressure: a message whose send did
       not see the pressure was pushed before it was raised (rt.h's bound counts on it). */
    unsigned tf = atomic_load_explicit(&target->sync_flags, memory_order_seq_cst);
    if (!(tf & (RT_AF_OVERLOADED | RT_AF_BACKPRESSURE)))
        return;
    unsigned cf = atomic_load_explicit(&cur->sync_flags, memory_order_relaxed);
    if ((cf & RT_AF_BACKPRESSURE) && !pressured_may_wait(target, tf))
        return;
    if (!(cf & RT_AF_BACKPRESSURE) && !(tf & RT_AF_BACKPRESSURE) && (cf & RT_AF_OVERLOADED))
        return;
    cur->mute_target = target;
}

#define RT_MAILBOX_HIGH 1000 /* queued messages that count as overload, turns aside */
#define RT_MAILBOX_CHECK 63  /* look at the length every 64 sends: it costs a cache miss */

static void deliver_to(rt_actor_t *a, rt_msg_t *m)
{
    uint64_t sent = atomic_fetch_add_explicit(&a->sent, 1, memory_order_relaxed) + 1;
    if (RT_UNLIKELY((sent & RT_MAILBOX_CHECK) == 0) &&
        sent - atomic_load_explicit(&a->received, memory_order_relaxed) > RT_MAILBOX_HIGH) {
        /* A fast producer outruns turn-based detection by a wide margin; a long mailbox
           is overload now, and the receiver clears it on its first turn that drains. */
        atomic_fetch_or_explicit(&a->sync_flags, RT_AF_OVERLOADED, memory_order_relaxed);
    }
    if (mbox_push(a, m))
        rt__schedule(a);
}

static int send_msg(rt_pid_t to, rt_msg_t *m, bool may_mute, bool keep_from)
{
    if (!m)
        return RT_ENOMEM;
    bool ext = enter_any();
    rt_actor_t *cur = rt__tls.current;
    if (cur && !keep_from)
        m->from = cur->pid; /* outside actors (timers firing) the sender set at arming stays */
    rt_actor_t *a = rt__lookup(to);
    int rc = 0;
    if (RT_UNLIKELY(!a)) {
        atomic_fetch_add_explicit(&rt__rt->dead_letters, 1, memory_order_relaxed);
        rt_msg_free(m);
        rc = RT_ENOPROC;
    } else {
        deliver_to(a, m);
        if (may_mute)
            mute_check(a);
    }
    leave_any(ext);
    return rc;
}

int rt_send_msg(rt_pid_t to, rt_msg_t *m)
{
    return send_msg(to, m, true, false);
}

int rt_send_unmuted(rt_pid_t to, rt_msg_t *m)
{
    return send_msg(to, m, false, false);
}

int rt_forward(rt_pid_t to, rt_msg_t *m)
{
    return send_msg(to, m, true, true);
}

int rt_send_optional(rt_pid_t to, rt_msg_t *m)
{
    if (!m)
        return RT_ENOMEM;
    bool ext = enter_any();
    rt_actor_t *a = rt__lookup(to);
    int rc = RT_ELIMIT;
    if (a && (atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_SHEDDING)) {
        atomic_fetch_add_explicit(&rt__rt->shed, 1, memory_order_relaxed);
        rt_msg_free(m);
    } else {
        rc = -1; /* sent below, outside this region */
    }
    leave_any(ext);
    return rc == -1 ? rt_send_msg(to, m) : rc;
}

void rt_shed(rt_actor_t *self, bool on)
{
    if (on)
        atomic_fetch_or_explicit(&self->sync_flags, RT_AF_SHEDDING, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&self->sync_flags, ~RT_AF_SHEDDING, memory_order_relaxed);
}

int rt_send(rt_pid_t to, uint32_t tag, const void *data, size_t len)
{
    rt_msg_t *m = rt_msg_new(tag, len);
    if (!m)
        return RT_ENOMEM;
    if (len)
        memcpy(m->data, data, len);
    return rt_send_msg(to, m);
}

/* Caller is inside an EBR region. */
static int send_signal(rt_pid_t to, uint32_t tag, rt_pid_t from, rt_reason_t reason, rt_ref_t ref,
                       uint8_t flags)
{
    rt_actor_t *a = rt__lookup(to);
    if (!a)
        return RT_ENOPROC;
    rt_msg_t *s = rt_msg_new(tag, sizeof(rt_sig_t));
    rt_msg_t *wake = rt_msg_new(RT_SIG_WAKE, 0);
    if (!s || !wake) {
        rt_msg_free(s);
        rt_msg_free(wake);
        return RT_ENOMEM;
    }
    s->flags = flags;
    s->from = from;
    rt_sig_t *sig = (rt_sig_t *)(void *)s->data;
    sig->from = from;
    sig->reason = reason;
    sig->ref = ref;
    rt_msg_t *head = atomic_load_explicit(&a->sigs, memory_order_relaxed);
    do {
        atomic_store_explicit(&s->next, head, memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(&a->sigs, &head, s, memory_order_release,
                                                    memory_order_relaxed));
    deliver_to(a, wake);
    return 0;
}

static void send_down(rt_pid_t watcher, rt_ref_t ref, rt_pid_t pid, rt_reason_t reason)
{
    rt_msg_t *m = rt_msg_new(RT_MSG_DOWN, sizeof(rt_down_msg_t));
    if (!m)
        return;
    rt_down_msg_t *d = (rt_down_msg_t *)(void *)m->data;
    d->ref = ref;
    d->pid = pid;
    d->reason = reason;
    rt_actor_t *w = rt__lookup(watcher);
    if (!w) {
        atomic_fetch_add_explicit(&rt__rt->dead_letters, 1, memory_order_relaxed);
        rt_msg_free(m);
        return;
    }
    m->from = pid;
    deliver_to(w, m);
}

/* Owner only: a message to oneself that keeps mailbox order (trapped exits). */
static void push_self(rt_actor_t *a, rt_msg_t *m)
{
    m->from = a->pid;
    deliver_to(a, m);
}

/* ---- Exits ---- */

static void begin_exit(rt_actor_t *a, rt_reason_t reason)
{
    if (!a->exiting) {
        a->exiting = 1;
        a->exit_reason = reason;
    }
}

static void handle_signal(rt_actor_t *a, rt_msg_t *s)
{
    rt_sig_t *sig = (rt_sig_t *)(void *)s->data;
    int i;
    switch (s->tag) {
    case RT_SIG_LINK:
        if (rel_find(a, RT_REL_LINK, sig->from, 0) < 0 && rel_add(a, RT_REL_LINK, sig->from, 0))
            begin_exit(a, RT_REASON_ERROR);
        break;
    case RT_SIG_UNLINK:
        if ((i = rel_find(a, RT_REL_LINK, sig->from, 0)) >= 0)
            rel_remove_at(a, i);
        break;
    case RT_SIG_MONITOR:
        if (rel_add(a, RT_REL_MONITORED_BY, sig->from, sig->ref))
            begin_exit(a, RT_REASON_ERROR);
        break;
    case RT_SIG_DEMONITOR:
        if ((i = rel_find(a, RT_REL_MONITORED_BY, 0, sig->ref)) >= 0)
            rel_remove_at(a, i);
        break;
    case RT_SIG_EXIT: {
        bool linked = s->flags & RT_MSGF_LINKED;
        if (a->exiting)
            break;
        if (linked) {
            /* A link removed in the meantime means the signal must be ignored (unlink's
               guarantee). */
            if ((i = rel_find(a, RT_REL_LINK, sig->from, 0)) < 0)
                break;
            rel_remove_at(a, i);
        }
        if (s->flags & RT_MSGF_FORCE) {
            begin_exit(a, sig->reason);
        } else if (!linked && sig->reason == RT_REASON_KILL) {
            begin_exit(a, RT_REASON_KILLED);
        } else if (a->trap_exit) {
            rt_msg_t *m = rt_msg_new(RT_MSG_EXIT, sizeof(rt_exit_msg_t));
            if (!m) {
                begin_exit(a, RT_REASON_ERROR);
                break;
            }
            rt_exit_msg_t *e = (rt_exit_msg_t *)(void *)m->data;
            e->from = sig->from;
            e->reason = sig->reason;
            push_self(a, m);
        } else if (sig->reason != RT_REASON_NORMAL || sig->from == a->pid) {
            begin_exit(a, sig->reason == RT_REASON_KILL ? RT_REASON_KILLED : sig->reason);
        }
        break;
    }
    }
}

static void process_signals(rt_actor_t *a)
{
    rt_msg_t *s = atomic_exchange_explicit(&a->sigs, NULL, memory_order_acquire);
    rt_msg_t *fifo = NULL;
    while (s) {
        rt_msg_t *next = atomic_load_explicit(&s->next, memory_order_relaxed);
        atomic_store_explicit(&s->next, fifo, memory_order_relaxed);
        fifo = s;
        s = next;
    }
    while (fifo) {
        rt_msg_t *next = atomic_load_explicit(&fifo->next, memory_order_relaxed);
        handle_signal(a, fifo);
        rt_msg_free(fifo);
        fifo = next;
    }
}

/* Requeues a list of parked actors (linked by runq_next, taken off their mute list). */
static void requeue_parked(rt_actor_t *w)
{
    while (w) {
        rt_actor_t *next = w->runq_next;
        w->runq_next = NULL;
        rt__requeue(w);
        w = next;
    }
}

/* Clears a reason for muting; the waiters go free only when no reason is left. */
static void unmute_waiters(rt_actor_t *a, unsigned clear)
{
    rt__spin_lock(&a->mute_lock);
    unsigned left =
        atomic_fetch_and_explicit(&a->sync_flags, ~clear, memory_order_release) & ~clear;
    rt_actor_t *w = NULL;
    if (!(left & (RT_AF_OVERLOADED | RT_AF_BACKPRESSURE)) || (left & RT_AF_DEAD)) {
        w = a->muted;
        a->muted = NULL;
    }
    rt__spin_unlock(&a->mute_lock);
    requeue_parked(w);
}

/* Owner only: no other thread raises or lifts an actor's pressure. */
static bool under_pressure(const rt_actor_t *a)
{
    return atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_BACKPRESSURE;
}

/*
** Lets go of the senders under socket pressure parked under a, which has just parked itself
** or come under pressure (pressured_may_wait). A sender that looks at a's status or flags
** under its lock after this sees them; one that parked before is in the list.
*/
static void release_pressured(rt_actor_t *a)
{
    rt_actor_t *out = NULL;
    rt__spin_lock(&a->mute_lock);
    for (rt_actor_t **pp = &a->muted; *pp;) {
        rt_actor_t *w = *pp;
        if (atomic_load_explicit(&w->sync_flags, memory_order_relaxed) & RT_AF_BACKPRESSURE) {
            *pp = w->runq_next;
            w->runq_next = out;
            out = w;
        } else {
            pp = &w->runq_next;
        }
    }
    rt__spin_unlock(&a->mute_lock);
    requeue_parked(out);
}

static void set_flag_pressure(rt_actor_t *a, unsigned flag, bool on)
{
    bool now = atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & flag;
    if (on == now)
        return;
    if (on) {
        atomic_fetch_or_explicit(&a->sync_flags, flag, memory_order_seq_cst);
        release_pressured(a);
    } else {
        unmute_waiters(a, flag);
    }
}

void rt__set_pressure(rt_actor_t *a, bool on)
{
    set_flag_pressure(a, RT_AF_PRESSURE, on);
}

void rt_hold_senders(rt_actor_t *self, bool on)
{
    RT_ASSERT(self == rt__tls.current);
    set_flag_pressure(self, RT_AF_HOLD, on);
}

bool rt_holding_senders(const rt_actor_t *self)
{
    return atomic_load_explicit(&self->sync_flags, memory_order_relaxed) & RT_AF_HOLD;
}

/*
** Under socket pressure the owner handles its socket events and its own
** messages (its timers among them), and holds back every other message, in
** order, until the pressure lifts: what its feeders queued before being muted
** waits in memory it was already taking, instead of growing the socket's
** buffer (rt.h states the bound). Exits and monitors' DOWNs wait with the rest,
** so they still arrive after what their sender sent before them.
*/
static bool held_back(const rt_actor_t *a, const rt_msg_t *m)
{
    return m->tag != RT_MSG_SOCKET && m->from != a->pid && under_pressure(a);
}

static void hold(rt_actor_t *a, rt_msg_t *m)
{
    rt_msg_t *last = a->held;
    atomic_store_explicit(&m->next, last ? msg_next(last) : m, memory_order_relaxed);
    if (last)
        atomic_store_explicit(&last->next, m, memory_order_relaxed);
    a->held = m;
}

static rt_msg_t *unhold(rt_actor_t *a)
{
    rt_msg_t *last = a->held;
    RT_ASSERT(last && msg_next(last)); /* the held messages form a ring: last links to first */
    rt_msg_t *first = msg_next(last);
    if (first == last)
        a->held = NULL;
    else
        atomic_store_explicit(&last->next, msg_next(first), memory_order_relaxed);
    return first;
}

/* Held messages that may run now: the pressure that held them back has lifted. */
static bool held_ready(const rt_actor_t *a)
{
    return a->held && !under_pressure(a);
}

/*
** A message a will never handle: a user message goes to its type's dead_letter
** (unless the runtime is stopping: nobody waits for answers then), then it is
** freed. Returns 1 for a dead letter, 0 for a wake-up marker.
*/
static uint64_t drop_unhandled(rt_actor_t *a, rt_msg_t *m)
{
    if (m->tag == RT_SIG_WAKE) {
        rt_msg_free(m);
        return 0;
    }
    if (m->tag == RT_MSG_SOCKET)
        rt__sock_msg_dropped(m);
    else if (m->tag >= RT_MSG_USER && a->type->dead_letter &&
             !atomic_load_explicit(&rt__rt->stopping, memory_order_relaxed))
        a->type->dead_letter(a->state, m);
    rt_msg_free(m);
    return 1;
}

/* Owner only, once a is dead: what is in its mailbox now. */
static void drain_mailbox(rt_actor_t *a)
{
    uint64_t dead = 0;
    rt_msg_t *m;
    while ((m = mbox_pop(a)) != NULL)
        dead += drop_unhandled(a, m);
    if (dead)
        atomic_fetch_add_explicit(&rt__rt->dead_letters, dead, memory_order_relaxed);
}

/*
** Runs after the thread has left every other reference to a: drains what was
** sent to it between its exit and the end of the grace period. A link or a
** monitor that raced with the exit is answered with noproc, as in Erlang.
*/
static void reclaim_actor(rt_retired_t *r)
{
    rt_actor_t *a = RT_CONTAINER_OF(r, rt_actor_t, retired);
    RT_ASSERT(atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_DEAD);
    rt_msg_t *s = atomic_exchange_explicit(&a->sigs, NULL, memory_order_acquire);
    while (s) {
        rt_msg_t *next = atomic_load_explicit(&s->next, memory_order_relaxed);
        rt_sig_t *sig = (rt_sig_t *)(void *)s->data;
        if (s->tag == RT_SIG_LINK)
            send_signal(sig->from, RT_SIG_EXIT, a->pid, RT_REASON_NOPROC, 0, RT_MSGF_LINKED);
        else if (s->tag == RT_SIG_MONITOR)
            send_down(sig->from, sig->ref, a->pid, RT_REASON_NOPROC);
        rt_msg_free(s);
        s = next;
    }
    drain_mailbox(a);
    /* Unlinked from the pid table before it was retired (actor_exit); its index is still
       ours until the idpool has it back, so nobody else can have filled the slot. */
    RT_ASSERT(!atomic_load_explicit(&rt__rt->slots[(uint32_t)a->pid].actor, memory_order_relaxed));
    free(atomic_load_explicit(&a->heap, memory_order_relaxed));
    rt_idpool_free(&rt__rt->ids, (uint32_t)a->pid);
    uint8_t slab_class = a->slab_class;
    RT_POISON(a, sizeof(*a));
    rt__slab_free(a, slab_class);
}

/* The actor is gone for everyone once this returns; its memory waits for a grace period. */
static void actor_exit(rt_actor_t *a)
{
    rt_runtime_t *rt = rt__rt;
    rt_reason_t reason = a->exit_reason;
    /* Once, and outside any turn: terminate below runs as a's own. */
    RT_ASSERT(!(atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_DEAD));
    RT_ASSERT(!rt__tls.current);
    atomic_store_explicit(&a->status, RT_STATUS_EXITING, memory_order_relaxed);
    if (a->init_done && a->type->terminate) {
        rt__tls.current = a;
        a->type->terminate(a, a->state, reason);
        rt__tls.current = NULL;
    }
    rt__sock_close_all(a);
    uint64_t held = 0;
    while (a->held)
        held += drop_unhandled(a, unhold(a));
    if (held)
        atomic_fetch_add_explicit(&rt->dead_letters, held, memory_order_relaxed);
    /* Released before links hear of the exit, so a restarted child can take the name. */
    rt__registry_remove_actor(a);
    atomic_fetch_or_explicit(&a->sync_flags, RT_AF_DEAD, memory_order_seq_cst);
    /* Signals that arrived before DEAD was visible still count (a link made just now must
       hear about this exit); later ones are answered by reclaim_actor. */
    process_signals(a);
    /* The mailbox's lost messages are reported before links hear of the exit, so a
       supervisor restarts the actor after its senders were told; what a sender pushes
       from here on (it found the actor before DEAD) is reported by reclaim_actor. */
    drain_mailbox(a);
    for (uint32_t i = 0; i < a->nrels; i++) {
        rt_rel_t *r = &a->rels[i];
        switch (r->kind) {
        case RT_REL_LINK:
            send_signal(r->pid, RT_SIG_EXIT, a->pid, reason, 0, RT_MSGF_LINKED);
            break;
        case RT_REL_MONITORED_BY:
            send_down(r->pid, r->ref, a->pid, reason);
            break;
        case RT_REL_MONITORING:
            send_signal(r->pid, RT_SIG_DEMONITOR, a->pid, 0, r->ref, 0);
            break;
        }
    }
    free(a->rels);
    a->rels = NULL;
    a->nrels = a->caprels = 0;
    rt_heap_t *heap = atomic_load_explicit(&a->heap, memory_order_relaxed);
    if (heap)
        rt_heap_destroy(heap);
    unmute_waiters(a, RT_AF_OVERLOADED | RT_AF_BACKPRESSURE);
    if (reason == RT_REASON_HEAP_LIMIT)
        atomic_fetch_add_explicit(&rt->heap_limit_kills, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt->exited, 1, memory_order_relaxed);
    if (atomic_fetch_sub_explicit(&rt->alive, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&rt->idle_lock);
        pthread_cond_broadcast(&rt->idle_cond);
        pthread_mutex_unlock(&rt->idle_lock);
    }
    /*
     * Unlinked before it is retired, as EBR requires: a thread that still found it in the
     * pid table did so inside a region that the grace period waits for. (Unlinking at
     * reclaim time let a snapshot or a lookup that had just read the slot touch the
     * struct while it was being freed; TSan caught `rtctl vm` doing it.) The slot index
     * itself is reused only after reclaim, so the pid cannot name another actor meanwhile.
     */
    atomic_store_explicit(&rt->slots[(uint32_t)a->pid].actor, NULL, memory_order_release);
    a->retired.reclaim = reclaim_actor;
    rt__ebr_retire(rt__tls.ebr, &a->retired);
}

/* ---- Heap ---- */

/*
** The inline heap: at most 16 granules of 16 bytes after the state, found first-fit
** from three bitmaps in the actor. An object's extent is its start granule and the
** used granules after it up to the next start.
*/
#define INLINE_GRANULE 16

static inline char *inline_base(rt_actor_t *a)
{
    return (char *)a->state + rt__inline_offset(a->type);
}

static inline bool in_inline(rt_actor_t *a, const void *p)
{
    const char *b = inline_base(a);
    return (const char *)p >= b && (const char *)p < b + a->type->heap_inline;
}

/* free_bits: the inline granules not in use, which the caller found not all taken. */
static void *inline_alloc(rt_actor_t *a, uint32_t free_bits, size_t size, rt_obj_kind_t kind)
{
    size_t n = size ? (size + INLINE_GRANULE - 1) / INLINE_GRANULE : 1;
    int at = rt__granules_fit(free_bits, (unsigned)n);
    if (at < 0)
        return NULL;
    unsigned i = (unsigned)at;
    uint16_t mask = (uint16_t)(((1u << n) - 1) << i);
    /* First-fit found n free granules inside the region. */
    RT_ASSERT(i + n <= a->type->heap_inline / INLINE_GRANULE && !(a->inline_used & mask));
    a->inline_used |= mask;
    a->inline_start |= (uint16_t)(1u << i);
    if (kind == RT_OBJ_SCAN)
        a->inline_scan |= mask;
    char *p = inline_base(a) + (size_t)i * INLINE_GRANULE;
    memset(p, 0, n * INLINE_GRANULE);
    return p;
}

/* Granules of the inline object starting at granule i. */
static unsigned inline_extent(const rt_actor_t *a, unsigned i)
{
    return rt__granules_extent(a->inline_used, a->inline_start,
                               a->type->heap_inline / INLINE_GRANULE, i);
}

static unsigned inline_index(rt_actor_t *a, const void *p)
{
    size_t off = (size_t)((const char *)p - inline_base(a));
    RT_ASSERT(off % INLINE_GRANULE == 0);
    unsigned i = (unsigned)(off / INLINE_GRANULE);
    RT_ASSERT(a->inline_start >> i & 1);
    return i;
}

static void inline_free(rt_actor_t *a, void *p)
{
    unsigned i = inline_index(a, p);
    uint16_t mask = (uint16_t)(((1u << inline_extent(a, i)) - 1) << i);
    /* The poison below stays inside the region. */
    RT_ASSERT(i + inline_extent(a, i) <= a->type->heap_inline / INLINE_GRANULE);
    RT_POISON(p, (size_t)inline_extent(a, i) * INLINE_GRANULE);
    a->inline_used &= (uint16_t)~mask;
    a->inline_scan &= (uint16_t)~mask;
    a->inline_start &= (uint16_t) ~(1u << i);
}

static void trace_actor(void *ctx, rt_gc_t *gc)
{
    rt_actor_t *a = ctx;
    if (a->type->trace)
        a->type->trace(a->state, gc);
    else
        rt_gc_scan(gc, a->state, a->type->state_size);
    for (uint32_t scan = a->inline_scan; scan; scan &= scan - 1)
        rt_gc_scan(gc, inline_base(a) + (size_t)__builtin_ctz(scan) * INLINE_GRANULE,
                   INLINE_GRANULE);
}

/* The actor's heap, created on first use; NULL only when memory is exhausted. */
static rt_heap_t *heap_of(rt_actor_t *a)
{
    rt_heap_t *h = atomic_load_explicit(&a->heap, memory_order_relaxed);
    if (RT_LIKELY(h != NULL))
        return h;
    h = malloc(sizeof(*h));
    if (!h)
        return NULL;
    rt_heap_init(h);
    atomic_store_explicit(&a->heap, h, memory_order_release);
    return h;
}

static void collect(rt_actor_t *a, rt_heap_t *h)
{
    rt_heap_collect(h, trace_actor, a);
    atomic_fetch_add_explicit(&rt__rt->gcs, 1, memory_order_relaxed);
}

static inline size_t max_heap_bytes(const rt_actor_t *a)
{
    return (size_t)a->max_heap_kib << 10;
}

/* Collects when due, and enforces max_heap (BEAM's max_heap_size). */
static RT_NOINLINE void heap_enforce(rt_actor_t *a, rt_heap_t *h)
{
    bool collected = false;
    if (rt_heap_should_collect(h)) {
        collect(a, h);
        collected = true;
    }
    if (!a->max_heap_kib)
        return;
    if (rt_heap_footprint(h) <= max_heap_bytes(a))
        return;
    if (!collected)
        collect(a, h);
    if (rt_heap_footprint(h) > max_heap_bytes(a))
        begin_exit(a, RT_REASON_HEAP_LIMIT);
}

/* Between messages; the common answer (nothing due, under max_heap) stays in the turn loop. */
static inline void heap_check(rt_actor_t *a)
{
    rt_heap_t *h = atomic_load_explicit(&a->heap, memory_order_relaxed);
    if (h && (!rt_heap_quiet(h) || (a->max_heap_kib && rt_heap_footprint(h) > max_heap_bytes(a))))
        heap_enforce(a, h);
}

void *rt_alloc(rt_actor_t *self, size_t size, rt_obj_kind_t kind)
{
    unsigned inline_bytes = self->type->heap_inline;
    /* A full inline region (the usual case for a busy actor) costs one test. */
    uint32_t free_bits = ~(uint32_t)self->inline_used & ((1u << inline_bytes / INLINE_GRANULE) - 1);
    if (free_bits && size <= inline_bytes) {
        void *p = inline_alloc(self, free_bits, size, kind);
        if (p)
            return p;
    }
    rt_heap_t *h = heap_of(self);
    return h ? rt_heap_alloc(h, size, kind) : NULL;
}

void rt_free(rt_actor_t *self, void *p)
{
    if (!p)
        return;
    if (in_inline(self, p))
        inline_free(self, p);
    else
        rt_heap_free(atomic_load_explicit(&self->heap, memory_order_relaxed), p);
}

void *rt_realloc(rt_actor_t *self, void *p, size_t size, rt_obj_kind_t kind)
{
    if (!p)
        return rt_alloc(self, size, kind);
    size_t old = in_inline(self, p)
                     ? (size_t)inline_extent(self, inline_index(self, p)) * INLINE_GRANULE
                     : rt_heap_obj_size(atomic_load_explicit(&self->heap, memory_order_relaxed), p);
    if (size <= old && size > old / 2) {
        memset((char *)p + size, 0, old - size);
        return p;
    }
    void *n = rt_alloc(self, size, kind);
    if (!n)
        return NULL;
    memcpy(n, p, size < old ? size : old);
    rt_free(self, p);
    return n;
}

char *rt_strndup(rt_actor_t *self, const void *s, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *d = rt_alloc(self, n + 1, RT_OBJ_LEAF);
    if (d && n)
        memcpy(d, s, n);
    return d;
}

size_t rt_memory(const rt_actor_t *self)
{
    rt_heap_t *h = atomic_load_explicit(&((rt_actor_t *)self)->heap, memory_order_relaxed);
    return h ? rt_heap_footprint(h) : 0;
}

void rt_charge(rt_actor_t *self, ptrdiff_t delta)
{
    rt_heap_t *h = heap_of(self);
    if (h)
        rt_heap_charge(h, delta);
}

void *rt_alloc_bin(rt_actor_t *self, size_t size, rt_obj_kind_t kind, rt_bin_t *bin)
{
    rt_heap_t *h = heap_of(self);
    if (!h) {
        rt_bin_release(bin);
        return NULL;
    }
    return rt_heap_alloc_bin(h, size, kind, bin);
}

void *rt_hold_bin(rt_actor_t *self, rt_bin_t *bin)
{
    return rt_alloc_bin(self, sizeof(rt_bin_t *), RT_OBJ_LEAF, bin);
}

void rt_drop_bin(rt_actor_t *self, void *obj)
{
    rt_heap_drop_bin(atomic_load_explicit(&self->heap, memory_order_relaxed), obj);
}

void rt_gc(rt_actor_t *self)
{
    rt_heap_t *h = atomic_load_explicit(&self->heap, memory_order_relaxed);
    if (h)
        collect(self, h);
}

void rt_consume(rt_actor_t *self, uint32_t n)
{
    atomic_store_explicit(&self->reductions,
                          atomic_load_explicit(&self->reductions, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

void rt_yield(rt_actor_t *self)
{
    RT_ASSERT(self == rt__tls.current);
    self->yielded = 1;
}

void rt_set_priority(rt_actor_t *self, rt_priority_t prio)
{
    RT_ASSERT(self == rt__tls.current);
    if (prio == RT_PRIORITY_LOW)
        atomic_fetch_or_explicit(&self->sync_flags, RT_AF_LOW, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&self->sync_flags, ~RT_AF_LOW, memory_order_relaxed);
}

uint64_t rt_turn_us(const rt_actor_t *self)
{
    RT_ASSERT(self == rt__tls.current);
    (void)self;
    return rt__ticks_to_ns(rt__ticks() - rt__tls.turn_start) / 1000;
}

uint64_t rt_turn_mono_ns(uint64_t not_before)
{
    if (!rt__tls.current)
        return rt_mono_ns();
    if (rt__tls.turn_mono_ns < not_before || !rt__tls.turn_mono_ns)
        rt__tls.turn_mono_ns = rt_mono_ns();
    return rt__tls.turn_mono_ns;
}

/* ---- Turns ---- */

static void deliver(rt_actor_t *a, rt_msg_t *m)
{
    if (m->tag == RT_MSG_DOWN) {
        /* A demonitor means no DOWN for that ref arrives afterwards, even if already queued. */
        rt_down_msg_t *d = (rt_down_msg_t *)(void *)m->data;
        int i = rel_find(a, RT_REL_MONITORING, 0, d->ref);
        if (i < 0)
            return;
        rel_remove_at(a, i);
    } else if (m->tag == RT_MSG_SOCKET && !rt__sock_event_deliver(a, m)) {
        return;
    }
    atomic_store_explicit(&a->current_tag, m->tag, memory_order_relaxed);
    a->type->handle(a, a->state, m);
    if (m->tag == RT_MSG_SOCKET)
        rt__sock_after_event(m);
}

static inline void add_relaxed(atomic_uint_fast64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Parks a under the actor it sent to while that one is overloaded (Pony's muting). */
static bool park_muted(rt_actor_t *a)
{
    rt_actor_t *t = a->mute_target;
    RT_ASSERT(t != a); /* mute_check never mutes an actor for its own mailbox */
    a->mute_target = NULL;
    rt__spin_lock(&t->mute_lock);
    unsigned tf = atomic_load_explicit(&t->sync_flags, memory_order_acquire);
    bool park = (tf & (RT_AF_OVERLOADED | RT_AF_BACKPRESSURE)) && !(tf & RT_AF_DEAD);
    if (park && under_pressure(a))
        park = pressured_may_wait(t, tf);
    if (park) {
        atomic_store_explicit(&a->status, RT_STATUS_MUTED, memory_order_relaxed);
        a->runq_next = t->muted;
        t->muted = a;
    }
    rt__spin_unlock(&t->mute_lock);
    return park;
}

#define RT_OVERLOAD_TURNS 2 /* consecutive full batches before senders get muted */

uint64_t rt__run_turn(rt_actor_t *a, unsigned batch, uint64_t start)
{
    /* One turn at a time on a thread, inside its EBR region (a turn looks actors up). */
    RT_ASSERT(!rt__tls.current && batch > 0);
    RT_ASSERT(atomic_load_explicit(&rt__tls.ebr->local, memory_order_relaxed) & 1);
    /* Only a scheduled actor runs: the push that scheduled it cleared the empty bit, and
       only this owner sets it again (mbox_markempty, at the end of a turn). */
    RT_ASSERT(!((uintptr_t)atomic_load_explicit(&a->mbox_head, memory_order_relaxed) & EMPTY_BIT));
    RT_ASSERT(mbox_well_formed(a));
    rt__tls.current = a;
    rt__tls.turn_start = start;
    rt__tls.turn_mono_ns = 0;
    atomic_store_explicit(&a->status, RT_STATUS_RUNNING, memory_order_relaxed);
    unsigned n = 0;
    if (atomic_load_explicit(&a->sigs, memory_order_relaxed))
        process_signals(a);
    while (!a->exiting && n < batch) {
        bool was_held = held_ready(a);
        rt_msg_t *m = was_held ? unhold(a) : mbox_pop(a);
        if (!m)
            break;
        if (m->tag == RT_SIG_WAKE) {
            add_relaxed(&a->received, 1);
            rt_msg_free(m);
            process_signals(a);
            continue;
        }
        if (!was_held && held_back(a, m)) {
            hold(a, m); /* still counted in the mailbox: received only when handled */
            continue;
        }
        add_relaxed(&a->received, 1);
        n++;
        deliver(a, m);
        rt_msg_free(m);
        if (atomic_load_explicit(&a->sigs, memory_order_relaxed))
            process_signals(a);
        heap_check(a);
        /* Sent to an overloaded actor, or asked to yield: stop here rather than after the
           batch. */
        if (a->mute_target || a->yielded)
            break;
    }
    bool yielded = a->yielded;
    a->yielded = 0;
    add_relaxed(&a->reductions, n);
    if (n && !a->exiting && a->type->turn_end)
        a->type->turn_end(a, a->state);
    if (a->socks)
        rt__sock_flush_turn(a);
    uint64_t end = rt__ticks();
    add_relaxed(&a->cpu_ticks, end - start);
    rt__tls.current = NULL;
    if (a->exiting) {
        a->mute_target = NULL;
        actor_exit(a);
        return end;
    }

    /* Overloaded: the batch (or the actor's own budget, when it yielded) ran out with
       messages left, turn after turn. It ends as soon as a turn leaves the mailbox empty,
       however full that turn was. */
    rt_msg_t *stub = stub_of(a);
    bool drained = a->mbox_tail == stub && !msg_next(stub) && !held_ready(a);
    if ((n >= batch || yielded) && !drained) {
        if (a->overload_turns < RT_OVERLOAD_TURNS && ++a->overload_turns == RT_OVERLOAD_TURNS)
            atomic_fetch_or_explicit(&a->sync_flags, RT_AF_OVERLOADED, memory_order_release);
    } else {
        a->overload_turns = 0;
        if (atomic_load_explicit(&a->sync_flags, memory_order_relaxed) & RT_AF_OVERLOADED)
            unmute_waiters(a, RT_AF_OVERLOADED);
    }

    if (a->mute_target && park_muted(a)) {
        release_pressured(a);
        return end;
    }
    /* Held messages wait for a socket event (which lifts the pressure) unless it lifted
       already, at the turn's flush: then they need a turn of their own. */
    if (!held_ready(a) && mbox_markempty(a)) {
        atomic_store_explicit(&a->status, RT_STATUS_WAITING, memory_order_relaxed);
        return end;
    }
    rt__requeue(a);
    return end;
}

/* ---- Spawning ---- */

static rt_ref_t new_ref(void)
{
    return atomic_fetch_add_explicit(&rt__rt->next_ref, 1, memory_order_relaxed) + 1;
}

/* Undoes a spawn whose init failed: the caller gets the error, links and monitors nothing. */
static void discard_spawn(rt_actor_t *a, rt_actor_t *parent)
{
    if (parent) {
        int i;
        if ((i = rel_find(parent, RT_REL_LINK, a->pid, 0)) >= 0)
            rel_remove_at(parent, i);
        if ((i = rel_find(parent, RT_REL_MONITORING, a->pid, 0)) >= 0)
            rel_remove_at(parent, i);
    }
    a->nrels = 0;
    a->init_done = 0;
    a->exit_reason = RT_REASON_INIT;
    actor_exit(a);
}

/* A byte limit as the actor keeps it: whole KiB rounded up, 4 TiB at most. */
static uint32_t heap_limit_kib(size_t bytes)
{
    size_t kib = bytes / 1024 + (bytes % 1024 != 0);
    return kib > UINT32_MAX ? UINT32_MAX : (uint32_t)kib;
}

int rt_spawn_opt(const rt_actor_type_t *type, void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    rt_runtime_t *rt = rt__rt;
    static const rt_spawn_opts_t no_opts;
    if (!opts)
        opts = &no_opts;
    if (!rt || atomic_load_explicit(&rt->stopping, memory_order_relaxed))
        return RT_ESHUTDOWN;
    if (!type || !type->handle)
        return RT_EINVAL;
    rt_actor_t *parent = rt__tls.current;
    if ((opts->link || opts->monitor) && !parent)
        return RT_EINVAL;

    if (type->heap_inline % 16 || type->heap_inline > RT_HEAP_INLINE_MAX)
        return RT_EINVAL;
    uint8_t slab_class;
    size_t size = sizeof(rt_actor_t) + rt__inline_offset(type) + type->heap_inline;
    rt_actor_t *a = rt__slab_alloc(size, &slab_class);
    if (!a)
        return RT_ENOMEM;
    memset(a, 0, size);
    a->slab_class = slab_class;
    uint32_t idx, gen;
    int rc = rt_idpool_alloc(&rt->ids, &idx, &gen);
    if (rc) {
        rt__slab_free(a, slab_class);
        return rc;
    }
    a->pid = (rt_pid_t)gen << 32 | idx;
    a->type = type;
    a->last_sched = -1;
    a->max_heap_kib = heap_limit_kib(opts->max_heap ? opts->max_heap : rt->cfg.max_heap);
    /* Born "scheduled", so messages sent during init cannot start it elsewhere. */
    atomic_store_explicit(&a->mbox_head, stub_of(a), memory_order_relaxed);
    a->mbox_tail = stub_of(a);

    bool ext = enter_any();
    atomic_store_explicit(&rt->slots[idx].actor, a, memory_order_release);
    atomic_fetch_add_explicit(&rt->spawned, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt->alive, 1, memory_order_relaxed);

    if (opts->name && (rc = rt_register(a, opts->name)) != 0)
        goto fail;
    if (opts->link && ((rc = rel_add(parent, RT_REL_LINK, a->pid, 0)) ||
                       (rc = rel_add(a, RT_REL_LINK, parent->pid, 0))))
        goto fail;
    if (opts->monitor) {
        rt_ref_t ref = new_ref();
        if ((rc = rel_add(parent, RT_REL_MONITORING, a->pid, ref)) ||
            (rc = rel_add(a, RT_REL_MONITORED_BY, parent->pid, ref)))
            goto fail;
        *opts->monitor = ref;
    }

    rt__tls.current = a;
    rc = type->init ? type->init(a, a->state, arg) : 0;
    rt__tls.current = parent;
    if (rc)
        goto fail;
    a->init_done = 1;
    heap_check(a);
    if (out)
        *out = a->pid;
    if (a->exiting || !mbox_markempty(a))
        rt__schedule(a);
    leave_any(ext);
    return 0;

fail:
    rt__tls.current = NULL;
    discard_spawn(a, parent);
    rt__tls.current = parent;
    leave_any(ext);
    return rc < 0 ? rc : RT_EINVAL;
}

int rt_spawn(const rt_actor_type_t *type, void *arg, rt_pid_t *out)
{
    return rt_spawn_opt(type, arg, NULL, out);
}

/* ---- Identity, exits, links, monitors ---- */

bool rt_alive(rt_pid_t pid)
{
    bool ext = enter_any();
    bool alive = rt__lookup(pid) != NULL;
    leave_any(ext);
    return alive;
}

bool rt__is_type(rt_pid_t pid, const rt_actor_type_t *type)
{
    bool ext = enter_any();
    rt_actor_t *a = rt__lookup(pid);
    bool is = a && a->type == type;
    leave_any(ext);
    return is;
}

int rt__pin_state(rt_pid_t pid, const rt_actor_type_t *type, void **state, bool *external)
{
    *external = enter_any();
    rt_actor_t *a = rt__lookup(pid);
    if (a && a->type == type) {
        *state = a->state;
        return 0;
    }
    leave_any(*external);
    return a ? RT_EINVAL : RT_ENOPROC;
}

void rt__unpin_state(bool external)
{
    leave_any(external);
}

rt_actor_t *rt_current(void)
{
    return rt__tls.current;
}

rt_pid_t rt_self(const rt_actor_t *self)
{
    return self->pid;
}

void *rt_state(rt_actor_t *self)
{
    return self->state;
}

void rt_exit(rt_actor_t *self, rt_reason_t reason)
{
    begin_exit(self, reason);
}

void rt_trap_exit(rt_actor_t *self, bool on)
{
    self->trap_exit = on;
}

int rt_exit_signal(rt_pid_t pid, rt_reason_t reason)
{
    bool ext = enter_any();
    rt_actor_t *cur = rt__tls.current;
    int rc = send_signal(pid, RT_SIG_EXIT, cur ? cur->pid : 0, reason, 0, 0);
    leave_any(ext);
    return rc;
}

int rt_link(rt_actor_t *self, rt_pid_t pid)
{
    if (pid == self->pid || rel_find(self, RT_REL_LINK, pid, 0) >= 0)
        return 0;
    int rc = rel_add(self, RT_REL_LINK, pid, 0);
    if (rc)
        return rc;
    if (send_signal(pid, RT_SIG_LINK, self->pid, 0, 0, 0) == RT_ENOPROC) {
        /* Erlang: linking to a process that does not exist sends us exit noproc. */
        send_signal(self->pid, RT_SIG_EXIT, pid, RT_REASON_NOPROC, 0, RT_MSGF_LINKED);
        return RT_ENOPROC;
    }
    return 0;
}

int rt_unlink(rt_actor_t *self, rt_pid_t pid)
{
    int i = rel_find(self, RT_REL_LINK, pid, 0);
    if (i < 0)
        return 0;
    rel_remove_at(self, i);
    send_signal(pid, RT_SIG_UNLINK, self->pid, 0, 0, 0);
    return 0;
}

int rt_monitor(rt_actor_t *self, rt_pid_t pid, rt_ref_t *ref)
{
    rt_ref_t r = new_ref();
    int rc = rel_add(self, RT_REL_MONITORING, pid, r);
    if (rc)
        return rc;
    if (ref)
        *ref = r;
    if (send_signal(pid, RT_SIG_MONITOR, self->pid, 0, r, 0) == RT_ENOPROC)
        send_down(self->pid, r, pid, RT_REASON_NOPROC);
    return 0;
}

int rt_demonitor(rt_actor_t *self, rt_ref_t ref)
{
    int i = rel_find(self, RT_REL_MONITORING, 0, ref);
    if (i < 0)
        return RT_ENOTFOUND;
    rt_pid_t pid = self->rels[i].pid;
    rel_remove_at(self, i);
    send_signal(pid, RT_SIG_DEMONITOR, self->pid, 0, ref, 0);
    return 0;
}

/* ---- Shutdown ---- */

/* Sends every live actor an untrappable shutdown exit, in pid-table order. */
void rt__shutdown_actors(void)
{
    rt_runtime_t *rt = rt__rt;
    bool ext = enter_any();
    uint32_t fresh = atomic_load(&rt->ids.fresh);
    for (uint32_t i = 1; i < fresh; i++) {
        rt_actor_t *a = atomic_load_explicit(&rt->slots[i].actor, memory_order_acquire);
        if (a && !(atomic_load(&a->sync_flags) & RT_AF_DEAD))
            send_signal(a->pid, RT_SIG_EXIT, 0, RT_REASON_SHUTDOWN, 0, RT_MSGF_FORCE);
    }
    leave_any(ext);
}

void rt__actors_release_external(void)
{
    external_release();
}

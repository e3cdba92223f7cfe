/*
** A supervisor actor with Erlang/OTP semantics (rt.h): it traps exits, starts its
** children in order (linked), restarts them by strategy and restart type, and gives
** up when more than intensity restarts happen within period_ms. one_for_all waits for
** the other children's exits before starting them again, so a restarted child can
** take back its registered name. A stop, asked or after giving up, stops the children
** in reverse start order, each in turn, killing one that outlives its shutdown_ms.
**
** The children's table is the supervisor's, written only in its turns; the spinlock
** lets rt_supervisor_info copy it from any thread while the supervisor runs.
*/
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum {
    SUP_MSG_START_CHILD = RT_MSG_USER + 0x7e00, /* data: start_req_t * */
    SUP_MSG_TERMINATE_CHILD,                    /* data: the child's pid */
    SUP_MSG_STOP_TIMEOUT,                       /* data: the child's pid, due to be killed */
};

typedef struct child_s {
    rt_child_spec_t spec;
    rt_pid_t pid; /* 0: not running */
    uint64_t restarts;
    uint64_t last_exit_ms; /* wall clock; 0: never exited */
    rt_reason_t last_reason;
    bool supervisor; /* its actor is a supervisor (for the tree) */
    bool stopping;   /* asked to stop: its exit is expected and keeps it down */
} child_t;

typedef struct sup_state_s {
    rt_spinlock_t lock; /* children, nchildren, restarts_total: written under it */
    rt_sup_spec_t spec; /* children and nchildren unused once started */
    child_t *children;
    size_t nchildren, capchildren;
    uint64_t restarts_total;
    uint64_t *ring; /* restart times (ms), intensity + 1 entries */
    unsigned nring; /* restarts recorded, capped at the ring size */
    unsigned ring_pos;
    unsigned awaiting; /* one_for_all: children still to exit before the restart */
    bool stopping;     /* stopping every child, then itself */
    size_t stop_next;  /* stopping: children [0, stop_next) are still to be stopped */
    rt_reason_t stop_reason;
} sup_state_t;

/* A start_child request from a thread outside the runtime, answered under lock. */
typedef struct start_req_s {
    rt_child_spec_t spec;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int rc;
    rt_pid_t pid;
} start_req_t;

static void answer(start_req_t *q, int rc, rt_pid_t pid)
{
    pthread_mutex_lock(&q->lock);
    q->rc = rc;
    q->pid = pid;
    q->done = true;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

/* Starts what spec describes; linked to the calling actor when link. */
static int spawn_child(const rt_child_spec_t *spec, bool link, rt_pid_t *out)
{
    rt_spawn_opts_t o = {.link = link, .name = spec->name, .max_heap = spec->max_heap};
    if (spec->start)
        return spec->start(spec->arg, &o, out);
    return rt_spawn_opt(spec->type, spec->arg, &o, out);
}

static void report(rt_actor_t *self, sup_state_t *st, rt_sup_event_kind_t kind, const child_t *c,
                   rt_pid_t old_pid, rt_reason_t reason, int error)
{
    if (!st->spec.on_event)
        return;
    const char *name = atomic_load_explicit(&self->name, memory_order_acquire);
    rt_sup_event_t e = {.kind = kind,
                        .sup = rt_self(self),
                        .sup_name = name ? name : "",
                        .child = c && c->spec.name ? c->spec.name : "",
                        .old_pid = old_pid,
                        .pid = c ? c->pid : 0,
                        .reason = reason,
                        .restarts = c ? c->restarts : 0,
                        .error = error,
                        .intensity = st->spec.intensity,
                        .period_ms = st->spec.period_ms};
    st->spec.on_event(&e, st->spec.ud);
}

/* Starts child c (again when restart): 0, or the start's error. */
static int start_child(sup_state_t *st, child_t *c, bool restart)
{
    rt_pid_t pid = 0;
    int rc = spawn_child(&c->spec, true, &pid);
    if (rc)
        return rc;
    bool sup = rt__is_type(pid, &rt_supervisor_type);
    rt__spin_lock(&st->lock);
    c->pid = pid;
    c->supervisor = sup;
    if (restart) {
        c->restarts++;
        st->restarts_total++;
    }
    rt__spin_unlock(&st->lock);
    return 0;
}

static size_t find_child(const sup_state_t *st, rt_pid_t pid)
{
    size_t i = 0;
    while (pid && i < st->nchildren && st->children[i].pid != pid)
        i++;
    return pid ? i : st->nchildren;
}

/* Asks c to exit (shutdown), with a kill due once its shutdown_ms pass. */
static void stop_child(rt_actor_t *self, child_t *c)
{
    c->stopping = true;
    rt_exit_signal(c->pid, RT_REASON_SHUTDOWN);
    rt_msg_t *m = rt_msg_new(SUP_MSG_STOP_TIMEOUT, sizeof(rt_pid_t));
    if (m) {
        memcpy(m->data, &c->pid, sizeof(c->pid));
        uint32_t ms = c->spec.shutdown_ms ? c->spec.shutdown_ms : RT_SUP_SHUTDOWN_MS_DEFAULT;
        rt_send_after(ms, rt_self(self), m, NULL);
    }
}

/*
** The ordered stop: children [0, stop_next) are not known to be down yet; the last
** of them that runs is asked to stop, and when none is left the supervisor exits.
*/
static void stop_next(rt_actor_t *self, sup_state_t *st)
{
    for (; st->stop_next > 0; st->stop_next--) {
        child_t *c = &st->children[st->stop_next - 1];
        if (c->pid) {
            if (!c->stopping)
                stop_child(self, c);
            return;
        }
    }
    rt_exit(self, st->stop_reason);
}

static void stop_all(rt_actor_t *self, sup_state_t *st, rt_reason_t reason)
{
    if (st->stopping)
        return;
    st->stopping = true;
    st->stop_reason = reason;
    st->stop_next = st->nchildren;
    stop_next(self, st);
}

/* Records a restart; false when the intensity is exceeded within the period. */
static bool allow_restart(sup_state_t *st)
{
    unsigned ring = st->spec.intensity + 1;
    uint64_t now = rt_mono_ms();
    st->ring[st->ring_pos] = now;
    st->ring_pos = (st->ring_pos + 1) % ring;
    if (st->nring < ring)
        st->nring++;
    if (st->nring < ring)
        return true;
    /* The ring is full: the oldest of the last intensity+1 restarts is at ring_pos. */
    return now - st->ring[st->ring_pos] > st->spec.period_ms;
}

static void give_up(rt_actor_t *self, sup_state_t *st)
{
    stop_all(self, st, RT_REASON_SHUTDOWN);
}

/* Starts child c again after its exit (reason), or gives up if that fails. */
static bool restart(rt_actor_t *self, sup_state_t *st, child_t *c, rt_pid_t old, rt_reason_t why)
{
    int rc = start_child(st, c, true);
    if (rc == RT_ESHUTDOWN) { /* the runtime is stopping: nothing to report */
        give_up(self, st);
        return false;
    }
    if (rc) {
        report(self, st, RT_SUP_START_FAILED, c, old, why, rc);
        give_up(self, st);
        return false;
    }
    report(self, st, RT_SUP_RESTARTED, c, old, why, 0);
    return true;
}

static void restart_all(rt_actor_t *self, sup_state_t *st)
{
    for (size_t i = 0; i < st->nchildren; i++) {
        child_t *c = &st->children[i];
        /* OTP: a temporary child is never restarted, not even by one_for_all; one stopped
           on request stays down. */
        if (c->spec.restart == RT_TEMPORARY || c->stopping)
            continue;
        if (!restart(self, st, c, 0, c->last_reason))
            return;
    }
}

static bool should_restart(rt_restart_t r, rt_reason_t reason)
{
    switch (r) {
    case RT_PERMANENT:
        return true;
    case RT_TRANSIENT:
        return reason != RT_REASON_NORMAL && reason != RT_REASON_SHUTDOWN;
    case RT_TEMPORARY:
        return false;
    }
    return false;
}

static void child_exited(rt_actor_t *self, sup_state_t *st, child_t *c, rt_reason_t reason)
{
    rt_pid_t old = c->pid;
    rt__spin_lock(&st->lock);
    c->pid = 0;
    c->last_reason = reason;
    c->last_exit_ms = rt_wall_ms();
    rt__spin_unlock(&st->lock);
    if (st->stopping) {
        if (st->stop_next > 0 && c == &st->children[st->stop_next - 1]) /* the one stopping */
            stop_next(self, st);
        return;
    }
    if (st->awaiting) {
        if (--st->awaiting == 0)
            restart_all(self, st);
        return;
    }
    if (c->stopping || !should_restart(c->spec.restart, reason)) {
        report(self, st, RT_SUP_EXITED, c, old, reason, 0);
        return;
    }
    if (!allow_restart(st)) {
        report(self, st, RT_SUP_GAVE_UP, c, old, reason, 0);
        give_up(self, st);
        return;
    }
    if (st->spec.strategy == RT_ONE_FOR_ONE) {
        restart(self, st, c, old, reason);
        return;
    }
    for (size_t k = 0; k < st->nchildren; k++) {
        if (st->children[k].pid) {
            st->awaiting++;
            rt_exit_signal(st->children[k].pid, RT_REASON_SHUTDOWN);
        }
    }
    if (!st->awaiting)
        restart_all(self, st);
}

/* Appends a child to the table (not started): its index, or RT_ENOMEM. */
static int add_child(sup_state_t *st, const rt_child_spec_t *spec)
{
    rt__spin_lock(&st->lock);
    int rc = rt_grow(&st->children, &st->capchildren, st->nchildren + 1, sizeof(child_t), 4);
    if (rc == 0)
        st->children[st->nchildren++] = (child_t){.spec = *spec};
    rt__spin_unlock(&st->lock);
    return rc ? rc : (int)(st->nchildren - 1);
}

static void drop_last_child(sup_state_t *st)
{
    rt__spin_lock(&st->lock);
    st->nchildren--;
    rt__spin_unlock(&st->lock);
}

static void free_children(sup_state_t *st)
{
    rt__spin_lock(&st->lock);
    free(st->children);
    st->children = NULL;
    st->nchildren = st->capchildren = 0;
    rt__spin_unlock(&st->lock);
}

static int sup_init(rt_actor_t *self, void *state, void *arg)
{
    sup_state_t *st = state;
    const rt_sup_spec_t *spec = arg;
    if (!spec || (spec->nchildren && !spec->children))
        return RT_EINVAL;
    rt__spin_lock(&st->lock); /* rt_supervisor_info may look already */
    st->spec = *spec;
    rt__spin_unlock(&st->lock);
    st->ring = calloc(spec->intensity + 1, sizeof(*st->ring));
    if (!st->ring)
        return RT_ENOMEM;
    rt_trap_exit(self, true);
    for (size_t i = 0; i < spec->nchildren; i++) {
        int rc = add_child(st, &spec->children[i]);
        if (rc >= 0)
            rc = start_child(st, &st->children[i], false);
        if (rc < 0) {
            /* Those started go down, as OTP's failed start takes them; no terminate runs
               after a failed init, so what it made goes here. */
            for (size_t k = i; k-- > 0;)
                rt_exit_signal(st->children[k].pid, RT_REASON_SHUTDOWN);
            free_children(st);
            free(st->ring);
            return rc;
        }
    }
    return 0;
}

static void on_start_request(rt_actor_t *self, sup_state_t *st, start_req_t *q)
{
    if (st->stopping) {
        answer(q, RT_ESHUTDOWN, 0);
        return;
    }
    int i = add_child(st, &q->spec);
    int rc = i < 0 ? i : start_child(st, &st->children[i], false);
    if (rc && i >= 0)
        drop_last_child(st);
    answer(q, rc, rc ? 0 : st->children[i].pid);
}

static void on_exit_signal(rt_actor_t *self, sup_state_t *st, const rt_exit_msg_t *e)
{
    size_t i = find_child(st, e->from);
    if (i < st->nchildren) {
        child_exited(self, st, &st->children[i], e->reason);
        return;
    }
    /* An exit from outside the tree (the parent, or exit/2): stop, as a non-trapping actor
       would, but children first. */
    if (e->reason != RT_REASON_NORMAL)
        stop_all(self, st, e->reason);
}

static void sup_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    sup_state_t *st = state;
    rt_pid_t pid;
    switch (m->tag) {
    case RT_MSG_EXIT:
        on_exit_signal(self, st, (const rt_exit_msg_t *)(const void *)m->data);
        break;
    case SUP_MSG_START_CHILD: {
        start_req_t *q;
        memcpy(&q, m->data, sizeof(q));
        on_start_request(self, st, q);
        break;
    }
    case SUP_MSG_TERMINATE_CHILD: {
        memcpy(&pid, m->data, sizeof(pid));
        size_t i = find_child(st, pid);
        if (i < st->nchildren && !st->children[i].stopping)
            stop_child(self, &st->children[i]);
        break;
    }
    case SUP_MSG_STOP_TIMEOUT: {
        memcpy(&pid, m->data, sizeof(pid));
        size_t i = find_child(st, pid);
        if (i < st->nchildren && st->children[i].stopping)
            rt_exit_signal(pid, RT_REASON_KILL);
        break;
    }
    }
}

static void sup_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    sup_state_t *st = state;
    /* Killed, or stopped by the runtime: the children are told at once (reverse order). */
    for (size_t i = st->nchildren; i-- > 0;)
        if (st->children[i].pid)
            rt_exit_signal(st->children[i].pid, RT_REASON_SHUTDOWN);
    report(self, st, RT_SUP_STOPPED, NULL, 0, reason, 0);
    free_children(st);
    free(st->ring);
}

/* A start request that reached a supervisor only as it exited is answered here. */
static void sup_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != SUP_MSG_START_CHILD)
        return;
    start_req_t *q;
    memcpy(&q, m->data, sizeof(q));
    answer(q, RT_ENOPROC, 0);
}

static const char *sup_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_EXIT:
        return "child_exit";
    case SUP_MSG_START_CHILD:
        return "start_child";
    case SUP_MSG_TERMINATE_CHILD:
        return "terminate_child";
    case SUP_MSG_STOP_TIMEOUT:
        return "stop_timeout";
    }
    return NULL;
}

const rt_actor_type_t rt_supervisor_type = {
    .name = "supervisor",
    .state_size = sizeof(sup_state_t),
    .init = sup_init,
    .handle = sup_handle,
    .terminate = sup_terminate,
    .tag_name = sup_tag_name,
    .dead_letter = sup_dead_letter,
};

int rt_supervisor_start_child(rt_pid_t sup, const rt_child_spec_t *spec, rt_pid_t *out)
{
    if (!spec || (!spec->type && !spec->start))
        return RT_EINVAL;
    rt_pid_t pid = 0;
    int rc;
    if (!sup) {
        rc = spawn_child(spec, false, &pid);
    } else {
        RT_ASSERT(!rt_current()); /* it waits for the supervisor's turn */
        start_req_t q = {
            .spec = *spec, .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        start_req_t *p = &q;
        rc = rt__is_type(sup, &rt_supervisor_type)
                 ? rt_send(sup, SUP_MSG_START_CHILD, &p, sizeof(p))
                 : RT_ENOPROC;
        /* Answered by the supervisor's turn, or by its dead_letter if it exits first. */
        pthread_mutex_lock(&q.lock);
        while (rc == 0 && !q.done)
            pthread_cond_wait(&q.cond, &q.lock);
        pthread_mutex_unlock(&q.lock);
        if (rc == 0)
            rc = q.rc, pid = q.pid;
        pthread_cond_destroy(&q.cond);
        pthread_mutex_destroy(&q.lock);
    }
    if (rc == 0 && out)
        *out = pid;
    return rc;
}

int rt_supervisor_terminate_child(rt_pid_t sup, rt_pid_t child)
{
    if (!sup)
        return rt_exit_signal(child, RT_REASON_SHUTDOWN);
    return rt_send(sup, SUP_MSG_TERMINATE_CHILD, &child, sizeof(child));
}

int rt_supervisor_info(rt_pid_t sup, rt_sup_info_t *info, rt_sup_child_info_t *children, size_t max)
{
    void *state;
    bool ext;
    int rc = rt__pin_state(sup, &rt_supervisor_type, &state, &ext);
    if (rc)
        return rc;
    sup_state_t *st = state;
    rt__spin_lock(&st->lock);
    *info = (rt_sup_info_t){.strategy = st->spec.strategy,
                            .intensity = st->spec.intensity,
                            .period_ms = st->spec.period_ms,
                            .restarts = st->restarts_total,
                            .nchildren = st->nchildren};
    for (size_t i = 0; i < st->nchildren && i < max; i++) {
        const child_t *c = &st->children[i];
        rt_sup_child_info_t *o = &children[i];
        memset(o, 0, sizeof(*o));
        if (c->spec.name)
            strncpy(o->name, c->spec.name, sizeof(o->name) - 1);
        o->pid = c->pid;
        o->restart = c->spec.restart;
        o->supervisor = c->supervisor;
        o->restarts = c->restarts;
        o->last_reason = c->last_reason;
        o->last_exit_ms = c->last_exit_ms;
    }
    rt__spin_unlock(&st->lock);
    rt__unpin_state(ext);
    return 0;
}

/*
** A supervisor actor with Erlang/OTP semantics: it traps exits, starts its
** children in order (linked), restarts them by strategy and restart type, and
** gives up, taking its children down and exiting with shutdown, when more
** than intensity restarts happen within period_ms. one_for_all waits for the
** other children's exits before starting them again, so a restarted child can
** take back its registered name.
*/
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef struct sup_state_s {
    rt_sup_spec_t spec;
    rt_child_spec_t *children;
    rt_pid_t *pids;
    uint64_t *restarts;  /* ring of restart times (ms), intensity + 1 entries */
    unsigned nrestarts;  /* restarts recorded, capped at the ring size */
    unsigned ring_pos;
    unsigned awaiting;   /* one_for_all: children still to exit before the restart */
    bool giving_up;
} sup_state_t;

static int start_child(rt_actor_t *self, sup_state_t *st, size_t i)
{
    rt_spawn_opts_t o = {.link = true, .name = st->children[i].name};
    return rt_spawn_opt(st->children[i].type, st->children[i].arg, &o, &st->pids[i]);
}

static void stop_children(sup_state_t *st, rt_reason_t reason)
{
    /* Erlang stops children in reverse start order. */
    for (size_t i = st->spec.nchildren; i-- > 0;) {
        if (st->pids[i])
            rt_exit_signal(st->pids[i], reason);
    }
}

static void give_up(rt_actor_t *self, sup_state_t *st)
{
    st->giving_up = true;
    stop_children(st, RT_REASON_SHUTDOWN);
    rt_exit(self, RT_REASON_SHUTDOWN);
}

/* Records a restart; false when the intensity is exceeded within the period. */
static bool allow_restart(sup_state_t *st)
{
    unsigned ring = st->spec.intensity + 1;
    uint64_t now = rt_mono_ms();
    st->restarts[st->ring_pos] = now;
    st->ring_pos = (st->ring_pos + 1) % ring;
    if (st->nrestarts < ring)
        st->nrestarts++;
    if (st->nrestarts < ring)
        return true;
    /* The ring is full: the oldest of the last intensity+1 restarts is at ring_pos. */
    return now - st->restarts[st->ring_pos] > st->spec.period_ms;
}

static void restart_all(rt_actor_t *self, sup_state_t *st)
{
    for (size_t i = 0; i < st->spec.nchildren; i++) {
        /* OTP: a temporary child is never restarted, not even by one_for_all. */
        if (st->children[i].restart == RT_TEMPORARY)
            continue;
        if (start_child(self, st, i) != 0) {
            give_up(self, st);
            return;
        }
    }
}

static int sup_init(rt_actor_t *self, void *state, void *arg)
{
    sup_state_t *st = state;
    const rt_sup_spec_t *spec = arg;
    if (!spec || !spec->children || !spec->nchildren)
        return RT_EINVAL;
    st->spec = *spec;
    st->children = malloc(spec->nchildren * sizeof(*st->children));
    st->pids = calloc(spec->nchildren, sizeof(*st->pids));
    st->restarts = calloc(spec->intensity + 1, sizeof(*st->restarts));
    if (!st->children || !st->pids || !st->restarts)
        return RT_ENOMEM;
    memcpy(st->children, spec->children, spec->nchildren * sizeof(*st->children));
    rt_trap_exit(self, true);
    for (size_t i = 0; i < spec->nchildren; i++) {
        int rc = start_child(self, st, i);
        if (rc) {
            stop_children(st, RT_REASON_SHUTDOWN);
            return rc;
        }
    }
    return 0;
}

static bool should_restart(rt_restart_t r, rt_reason_t reason)
{
    switch (r) {
    case RT_PERMANENT: return true;
    case RT_TRANSIENT: return reason != RT_REASON_NORMAL && reason != RT_REASON_SHUTDOWN;
    case RT_TEMPORARY: return false;
    }
    return false;
}

static void child_exited(rt_actor_t *self, sup_state_t *st, size_t i, rt_reason_t reason)
{
    st->pids[i] = 0;
    if (st->giving_up)
        return;
    if (st->awaiting) {
        if (--st->awaiting == 0)
            restart_all(self, st);
        return;
    }
    if (!should_restart(st->children[i].restart, reason))
        return;
    if (!allow_restart(st)) {
        give_up(self, st);
        return;
    }
    if (st->spec.strategy == RT_ONE_FOR_ONE) {
        if (start_child(self, st, i) != 0)
            give_up(self, st);
        return;
    }
    for (size_t k = 0; k < st->spec.nchildren; k++) {
        if (st->pids[k]) {
            st->awaiting++;
            rt_exit_signal(st->pids[k], RT_REASON_SHUTDOWN);
        }
    }
    if (!st->awaiting)
        restart_all(self, st);
}

static void sup_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    sup_state_t *st = state;
    if (m->tag != RT_MSG_EXIT)
        return;
    const rt_exit_msg_t *e = (const rt_exit_msg_t *)(const void *)m->data;
    for (size_t i = 0; e->from && i < st->spec.nchildren; i++) {
        if (st->pids[i] == e->from) {
            child_exited(self, st, i, e->reason);
            return;
        }
    }
    /* An exit from outside the tree (the parent, or exit/2): stop, as a non-trapping actor would. */
    if (e->reason != RT_REASON_NORMAL) {
        st->giving_up = true;
        stop_children(st, RT_REASON_SHUTDOWN);
        rt_exit(self, e->reason);
    }
}

static void sup_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    sup_state_t *st = state;
    if (st->pids)
        stop_children(st, RT_REASON_SHUTDOWN);
    free(st->children);
    free(st->pids);
    free(st->restarts);
}

static const char *sup_tag_name(uint32_t tag)
{
    return tag == RT_MSG_EXIT ? "child_exit" : NULL;
}

const rt_actor_type_t rt_supervisor_type = {
    .name = "supervisor",
    .state_size = sizeof(sup_state_t),
    .init = sup_init,
    .handle = sup_handle,
    .terminate = sup_terminate,
    .tag_name = sup_tag_name,
};

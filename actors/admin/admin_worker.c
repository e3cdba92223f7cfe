/*
** The admin workers: actors on the blocking pool that run the commands that
** block (file I/O, Lua loading, walks over every actor) for the admin
** connections, which hand them the request line and wait for the answer. Two of
** them: `admin_worker` for every such command, and `admin_rule_tester` for
** `rules test` (RT_ADMIN_OWN_WORKER), whose run time the caller's payload can
** stretch to rule_call_ms, and `backup`, which copies whole databases: a
** /metrics scrape must not wait behind either.
*/
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"

/*
** The worker keeps each admin connection's previous `top` sample, so sampling
** 20,000 actors (and rendering them) happens on the blocking pool, never on a
** scheduler: a connection only forwards the request. A sample whose connection
** has gone is dropped at the next job.
*/
typedef struct {
    rt_pid_t conn;
    rt_admin_top_t *top;
} worker_top_t;

typedef struct {
    worker_top_t *tops; /* on the worker's heap, kept by the scan of this state */
    size_t ntops, captops;
} worker_t;

/*
** Written by each start of a worker, the first before the listener (and so any
** connection) starts. A request sent while it is dead is refused, and its connection
** answers 503; one it never got to is answered 503 by worker_dead_letter.
*/
static _Atomic rt_pid_t worker_pid[2]; /* admin_worker, admin_rule_tester */

/* The previous sample's slot for conn (a new empty one if none), or NULL on OOM. */
static rt_admin_top_t **worker_top(rt_actor_t *self, worker_t *w, rt_pid_t conn)
{
    size_t keep = 0;
    rt_admin_top_t **found = NULL;
    for (size_t i = 0; i < w->ntops; i++) {
        if (w->tops[i].conn != conn && !rt_alive(w->tops[i].conn)) {
            rt__admin_top_free(w->tops[i].top);
            continue;
        }
        w->tops[keep++] = w->tops[i];
    }
    w->ntops = keep;
    for (size_t i = 0; i < w->ntops && !found; i++)
        if (w->tops[i].conn == conn)
            found = &w->tops[i].top;
    if (found)
        return found;
    if (rt_grow_on(self, &w->tops, &w->captops, w->ntops + 1, sizeof(*w->tops), 8, RT_OBJ_LEAF))
        return NULL;
    w->tops[w->ntops] = (worker_top_t){conn, NULL};
    return &w->tops[w->ntops++].top;
}

static void worker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    worker_t *w = state;
    if (m->tag != RT_ADMIN_MSG_JOB || m->len < sizeof(uint64_t) + 1)
        return;
    uint64_t cookie;
    memcpy(&cookie, m->data, sizeof(cookie));
    rt_admin_cmd_t *c = rt__admin_cmd_new(self);
    rt_buf_t body = {0};
    int code = 500;
    if (c) {
        c->top = worker_top(self, w, m->from);
        const rt_admin_command_t *k =
            rt__admin_parse(c, (char *)m->data + sizeof(cookie), m->len - sizeof(cookie) - 1);
        if (k)
            rt__admin_run(c, k);
        rt__admin_render(c, &body);
        code = c->code;
        rt__admin_cmd_free(c);
    }
    rt_msg_t *r = rt_msg_new(RT_ADMIN_MSG_JOB_DONE, sizeof(rt_admin_job_done_t) + body.len);
    if (r) {
        rt_admin_job_done_t a = {cookie, body.oom ? 500 : code};
        memcpy(r->data, &a, sizeof(a));
        if (body.len)
            memcpy(r->data + sizeof(a), body.data, body.len);
        rt_send_msg(m->from, r);
    }
    rt_buf_free(&body);
}

static int worker_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state;
    atomic_store(&worker_pid[(uintptr_t)arg], rt_self(self));
    return 0;
}

/* A job the worker died before running: its connection gets an answer, not silence. */
static void worker_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_ADMIN_MSG_JOB || m->len < sizeof(uint64_t))
        return;
    static const char why[] = "the admin worker stopped before running the command\n";
    rt_msg_t *r = rt_msg_new(RT_ADMIN_MSG_JOB_DONE, sizeof(rt_admin_job_done_t) + sizeof(why) - 1);
    if (!r)
        return;
    rt_admin_job_done_t a = {.code = 503};
    memcpy(&a.cookie, m->data, sizeof(a.cookie));
    memcpy(r->data, &a, sizeof(a));
    memcpy(r->data + sizeof(a), why, sizeof(why) - 1);
    rt_send_msg(m->from, r);
}

static void worker_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    worker_t *w = state;
    for (size_t i = 0; i < w->ntops; i++)
        rt__admin_top_free(w->tops[i].top);
}

static const char *worker_tag_name(uint32_t tag)
{
    return tag == RT_ADMIN_MSG_JOB ? "job" : "";
}

static const rt_actor_type_t worker_type = {
    .name = "admin_worker",
    .state_size = sizeof(worker_t),
    .init = worker_init,
    .handle = worker_handle,
    .terminate = worker_terminate,
    .tag_name = worker_tag_name,
    .dead_letter = worker_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

int rt__admin_worker_start(rt_pid_t group)
{
    static const char *const names[] = {"admin_worker", "admin_rule_tester"};
    int rc = 0;
    for (uintptr_t i = 0; rc == 0 && i < 2; i++) {
        rt_child_spec_t c = {
            .name = names[i], .type = &worker_type, .arg = (void *)i, .restart = RT_PERMANENT};
        rc = rt_supervisor_start_child(group, &c, NULL);
    }
    return rc;
}

int rt__admin_worker_ask(uint64_t cookie, const char *line, size_t len, bool own_worker)
{
    /* One byte more than the line: splitting ends the last word there. */
    rt_msg_t *m = rt_msg_new(RT_ADMIN_MSG_JOB, sizeof(cookie) + len + 1);
    if (!m)
        return RT_ENOMEM;
    memcpy(m->data, &cookie, sizeof(cookie));
    memcpy(m->data + sizeof(cookie), line, len);
    m->data[sizeof(cookie) + len] = 0;
    return rt_send_msg(atomic_load(&worker_pid[own_worker]), m);
}

bool rt__admin_on_worker(const rt_actor_t *self)
{
    return self && (rt_self(self) == atomic_load(&worker_pid[0]) ||
                    rt_self(self) == atomic_load(&worker_pid[1]));
}

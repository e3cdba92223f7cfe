/*
** Answering one request line for whichever front end read it (the admin socket's
** connections, the HTTP API): here and now, on the worker (blocking commands), or from
** the replies of connection actors (gathering commands). The front end frames the
** answer; this file only decides when it is ready.
*/
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "cluster.h"
#include "log.h"

/*
** A request that changes rtd (RT_ADMIN_CHANGES), answered or refused, in the log with who
** asked: the rtctl user's uid, the API key's name, or another node (which may only look).
*/
static void log_change(rt_admin_exec_t *x, int code)
{
    if (!x->change[0])
        return;
    rt_log_level_t level = code >= 200 && code < 300 ? RT_LOG_INFO : RT_LOG_WARNING;
    if (x->via == RT_ADMIN_VIA_RTCTL)
        rt_log(level, "admin.change", "via=rtctl uid=%ld pid=%ld command=%s status=%d", x->uid,
               x->pid, x->change, code);
    else if (x->via == RT_ADMIN_VIA_HTTP)
        rt_log(level, "admin.change", "via=http api_key=%s peer=%s command=%s status=%d",
               x->who[0] ? x->who : "-", x->peer, x->change, code);
    else
        rt_log(level, "admin.change", "via=node command=%s status=%d", x->change, code);
    x->change[0] = 0;
}

/* The changing request's words, for log_change: "config set max_connections 5000". */
static void note_change(rt_admin_exec_t *x, const rt_admin_cmd_t *c)
{
    size_t at = 0, cap = sizeof(x->change) - 1;
    for (int i = 0; i < c->argc && at < cap; i++) {
        if (i)
            x->change[at++] = ' ';
        size_t n = c->arglen[i] < cap - at ? c->arglen[i] : cap - at;
        memcpy(x->change + at, c->argv[i], n); /* a NUL in a word ends the value logged */
        at += n;
    }
    x->change[at] = 0;
}

static void answer_cmd(rt_admin_cmd_t *c, rt_admin_answer_fn fn, void *ctx)
{
    rt_buf_t body = {0};
    rt__admin_render(c, &body);
    if (body.oom)
        fn(ctx, 500, "out of memory\n", 14);
    else
        fn(ctx, c->code, body.data, body.len);
    rt_buf_free(&body);
}

static void finish_gather(rt_admin_exec_t *x, rt_admin_answer_fn fn, void *ctx)
{
    if (x->timer) {
        rt_cancel_timer(x->timer);
        x->timer = 0;
    }
    rt__admin_gather_finish(x->waiting);
    log_change(x, x->waiting->code);
    answer_cmd(x->waiting, fn, ctx);
    rt__admin_cmd_free(x->waiting);
    x->waiting = NULL;
    x->cookie = 0;
}

/* A command about a client this node does not hold (RT_ADMIN_HOLDER): the node that does is
   asked, from the worker (admin_remote.c). Whether the worker took it. */
static bool ask_holder_node(const rt_admin_cmd_t *c, const rt_admin_command_t *cmd,
                            uint64_t cookie)
{
    if (c->argc < 3)
        return false;
    rt_buf_t line = {0};
    rt_buf_add(&line, "cluster client ", 15);
    rt__admin_quote_word(&line, c->argv[2]);
    rt_buf_printf(&line, " --command \"%s %s\"", cmd->word, cmd->sub);
    if (c->json)
        rt_buf_add(&line, " --json", 7);
    bool asked = !line.oom && rt__admin_worker_ask(cookie, line.data, line.len, false) == 0;
    rt_buf_free(&line);
    return asked;
}

bool rt_admin_exec_start(rt_actor_t *self, rt_admin_exec_t *x, char *line, size_t len,
                         unsigned refuse, rt_admin_answer_fn fn, void *ctx)
{
    static _Atomic uint64_t next_cookie = 1;
    RT_ASSERT(!x->cookie);
    rt_admin_cmd_t *c = rt__admin_cmd_new(self);
    if (!c) {
        fn(ctx, 500, "out of memory\n", 14);
        return true;
    }
    /* The worker splits its own copy: keep the line whole for it. */
    char *raw = malloc(len);
    if (raw)
        memcpy(raw, line, len);
    const rt_admin_command_t *cmd = rt__admin_parse(c, line, len);
    if (cmd && (cmd->flags & RT_ADMIN_CHANGES))
        note_change(x, c);
    if (cmd && (cmd->flags & refuse)) {
        rt__admin_fail(c, 403, "\"%s%s%s\" %s: it needs the admin role", cmd->word,
                       cmd->sub ? " " : "", cmd->sub ? cmd->sub : "",
                       cmd->flags & refuse & RT_ADMIN_CHANGES ? "changes rtd"
                       : strcmp(cmd->word, "trace") == 0      ? "shows clients' traffic"
                       : strcmp(cmd->word, "apikey") == 0     ? "shows the API keys"
                       : strcmp(cmd->word, "xmpp") == 0       ? "shows the XMPP accounts"
                                                              : "runs rules on a payload");
    } else if (cmd && (cmd->flags & RT_ADMIN_BLOCKING)) {
        uint64_t cookie = next_cookie++;
        if (raw && rt__admin_worker_ask(cookie, raw, len, cmd->flags & RT_ADMIN_OWN_WORKER) == 0)
            x->cookie = cookie;
        else
            rt__admin_fail(c, 503, "the admin worker is not running");
    } else if (cmd) {
        rt__admin_run(c, cmd);
        if (c->code == 404 && (cmd->flags & RT_ADMIN_HOLDER) && rt_cluster_on()) {
            uint64_t cookie = next_cookie++;
            if (ask_holder_node(c, cmd, cookie))
                x->cookie = cookie;
        } else if (c->trace) { /* streaming: its parts come with the trace's messages */
            x->trace = c->trace;
            c->trace = NULL;
            x->cookie = next_cookie++;
            fn(ctx, 206, c->text.data, c->text.len);
            rt__admin_trace_begin(x);
        } else if (c->code == 0) { /* gathering: answered by finish_gather */
            x->waiting = c;
            x->cookie = next_cookie++;
            rt_send_after_tag(RT_ADMIN_GATHER_MS, rt_self(self), RT_ADMIN_MSG_GATHER_TIMEOUT,
                              &x->timer);
            c = NULL;
        }
    }
    free(raw);
    bool answered = !x->cookie;
    if (c && answered) {
        log_change(x, c->code);
        answer_cmd(c, fn, ctx);
    }
    if (c)
        rt__admin_cmd_free(c);
    return answered;
}

bool rt_admin_exec_message(rt_admin_exec_t *x, rt_msg_t *m, rt_admin_answer_fn fn, void *ctx)
{
    if (!x->cookie)
        return false;
    if (x->trace)
        return rt__admin_trace_message(x, m, fn, ctx);
    if (m->tag == RT_ADMIN_MSG_JOB_DONE) {
        rt_admin_job_done_t a;
        if (m->len < sizeof(a))
            return false;
        memcpy(&a, m->data, sizeof(a));
        if (a.cookie != x->cookie)
            return false;
        x->cookie = 0;
        log_change(x, a.code);
        fn(ctx, a.code, (const char *)m->data + sizeof(a), m->len - sizeof(a));
        return true;
    }
    if (!x->waiting)
        return false;
    if (m->tag == RT_ADMIN_MSG_GATHER_TIMEOUT) {
        x->timer = 0;
        finish_gather(x, fn, ctx);
        return true;
    }
    if (rt__admin_gather_reply(x->waiting, m)) {
        finish_gather(x, fn, ctx);
        return true;
    }
    return false;
}

void rt_admin_exec_free(rt_admin_exec_t *x)
{
    if (x->timer)
        rt_cancel_timer(x->timer);
    if (x->waiting)
        rt__admin_cmd_free(x->waiting);
    rt__admin_trace_end(x);
    rt_admin_exec_t kept = *x;
    memset(x, 0, sizeof(*x));
    x->sock = kept.sock;
    x->via = kept.via;
    x->uid = kept.uid;
    x->pid = kept.pid;
    memcpy(x->who, kept.who, sizeof(x->who));
    memcpy(x->peer, kept.peer, sizeof(x->peer));
}

/*
** Administrators across a cluster's nodes (cluster.h): `cluster client ID` asks the node that
** holds a client for its `clients show` (or `subscriptions show`, --command; and a command
** flagged RT_ADMIN_HOLDER asks it when this node does not hold the client), and each question from another node is answered here by a short-lived
** actor that runs the read-only request line through the admin engine, as an rtctl
** connection would, and sends "<code> <body>" back over NATS.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "cluster.h"

#define MSG_DONE (RT_MSG_USER + 0x40) /* to itself: answered, exit */

typedef struct {
    size_t len;
    char reply[RT_CLUSTER_REPLY_MAX];
    char line[]; /* len bytes */
} question_t;

typedef struct {
    rt_admin_exec_t exec;
    char reply[RT_CLUSTER_REPLY_MAX];
    char *line; /* the request line, split in place by the engine (its words point into it) */
} remote_t;

static void remote_answer(void *ctx, int code, const char *body, size_t len)
{
    remote_t *r = ctx;
    char head[16];
    int n = snprintf(head, sizeof(head), "%d ", code);
    char *out = malloc((size_t)n + len);
    if (out) {
        memcpy(out, head, (size_t)n);
        memcpy(out + n, body, len);
        rt_cluster_answer(r->reply, out, (size_t)n + len);
        free(out);
    }
}

static int remote_init(rt_actor_t *self, void *state, void *arg)
{
    remote_t *r = state;
    const question_t *q = arg;
    snprintf(r->reply, sizeof(r->reply), "%s", q->reply);
    if (!(r->line = malloc(q->len + 1)))
        return RT_ENOMEM;
    memcpy(r->line, q->line, q->len);
    r->line[q->len] = 0;
    /* Read-only, and no clients' traffic: another node's administrator may only look. */
    r->exec.via = RT_ADMIN_VIA_NODE;
    if (rt_admin_exec_start(self, &r->exec, r->line, q->len, RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE,
                            remote_answer, r))
        return rt_send(rt_self(self), MSG_DONE, NULL, 0);
    return 0;
}

static void remote_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    remote_t *r = state;
    if (m->tag == MSG_DONE || rt_admin_exec_message(&r->exec, m, remote_answer, r))
        rt_exit(self, RT_REASON_NORMAL);
}

static void remote_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    remote_t *r = state;
    rt_admin_exec_free(&r->exec);
    free(r->line);
}

static const rt_actor_type_t remote_type = {
    .name = "admin_remote",
    .state_size = sizeof(remote_t),
    .init = remote_init,
    .handle = remote_handle,
    .terminate = remote_terminate,
};

/* The cluster's hook, on cluster_in: one actor per question. */
static bool remote_asked(const char *line, size_t len, const char *reply)
{
    if (strlen(reply) >= RT_CLUSTER_REPLY_MAX)
        return false;
    question_t *q = malloc(sizeof(*q) + len);
    if (!q)
        return false;
    q->len = len;
    snprintf(q->reply, sizeof(q->reply), "%s", reply);
    memcpy(q->line, line, len);
    rt_pid_t pid;
    int rc = rt_spawn(&remote_type, q, &pid);
    free(q);
    return rc == 0;
}

void rt__admin_remote_start(void)
{
    rt_cluster_set_admin(remote_asked);
}

void rt__admin_quote_word(rt_buf_t *out, const char *w)
{
    rt_buf_add(out, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)w; *p; p++) {
        if (*p == '"' || *p == '\\')
            rt_buf_printf(out, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            rt_buf_printf(out, "\\x%02X", *p);
        else
            rt_buf_add(out, (const char *)p, 1);
    }
    rt_buf_add(out, "\"", 1);
}

/*
** A JSON answer from node into out with the node named: first in an object; in each row (each
** object inside the array) of an array, so the rows read as this node's own rows would.
*/
static void put_named(rt_buf_t *out, const char *node, const char *body, size_t len)
{
    rt_buf_t name = {0};
    rt_buf_add(&name, "\"node\":", 7);
    rt_buf_json_str(&name, node, strlen(node));
    int depth = 0, rows_at = body[0] == '[' ? 1 : 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        rt_buf_add(out, &ch, 1);
        if (in_string) {
            if (ch == '\\' && i + 1 < len)
                rt_buf_add(out, &body[++i], 1);
            else if (ch == '"')
                in_string = false;
            continue;
        }
        if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            if (ch == '{' && depth == rows_at) {
                rt_buf_add(out, name.data, name.len);
                if (i + 1 < len && body[i + 1] != '}')
                    rt_buf_add(out, ",", 1);
            }
            depth++;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    rt_buf_free(&name);
}

/* The command --command names ("clients show" when none): one flagged RT_ADMIN_HOLDER. */
static const rt_admin_command_t *holder_command(const rt_admin_cmd_t *c)
{
    size_t len = 0;
    const char *want = rt__admin_opt(c, "command", &len);
    if (!want) {
        want = "clients show";
        len = strlen(want);
    }
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++) {
        size_t w = strlen(k->word);
        if ((k->flags & RT_ADMIN_HOLDER) && k->sub && len == w + 1 + strlen(k->sub) &&
            memcmp(want, k->word, w) == 0 && want[w] == ' ' &&
            memcmp(want + w + 1, k->sub, len - w - 1) == 0)
            return k;
    }
    return NULL;
}

int rt__admin_cluster_client(rt_admin_cmd_t *c)
{
    const rt_admin_command_t *cmd = holder_command(c);
    if (c->argc < 3 || !cmd)
        return rt__admin_fail(c, 400, "usage: cluster client CLIENT_ID [--command \"clients "
                                      "show\" or \"subscriptions show\"]");
    const char *id = c->argv[2];
    if (!rt_cluster_on())
        return rt__admin_fail(c, 404, "this node is in no cluster (no cluster table in rtd.conf)");
    char node[RT_CONF_NODE_MAX];
    if (!rt_cluster_client_holder(id, node, sizeof(node)))
        return rt__admin_fail(c, 404, "no client \"%s\" on any node", id);
    if (strcmp(node, rt_cluster_node()) == 0)
        return rt__admin_fail(c, 404, "no client \"%s\" (this node holds its id, no session)", id);
    rt_buf_t line = {0};
    rt_buf_printf(&line, "%s %s ", cmd->word, cmd->sub);
    rt__admin_quote_word(&line, id);
    if (c->json)
        rt_buf_add(&line, " --json", 7);
    rt_buf_add(&line, "", 1); /* NUL */
    uint8_t *answer = NULL;
    size_t len = 0;
    bool asked = !line.oom && rt_cluster_ask_node(node, line.data, &answer, &len);
    rt_buf_free(&line);
    if (!asked)
        return rt__admin_fail(c, 504, "node %s holds client \"%s\" but did not answer", node, id);
    char *end = NULL;
    long code = strtol((const char *)answer, &end, 10);
    const char *body = end && *end == ' ' ? end + 1 : "";
    size_t blen = len - (size_t)(body - (const char *)answer);
    if (!body[0] || code < 100 || code > 599) {
        free(answer);
        return rt__admin_fail(c, 502, "node %s answered something else", node);
    }
    if (code != 200) {
        rt__admin_fail(c, (int)code, "node %s: %.*s", node, (int)strcspn(body, "\n"), body);
        free(answer);
        return c->code;
    }
    /* Its answer as it gave it, with the node named first. */
    if (c->json && (body[0] == '{' || body[0] == '[')) {
        put_named(&c->text, node, body, blen);
    } else {
        rt_buf_printf(&c->text, "node  %s\n", node);
        rt_buf_add(&c->text, body, blen);
    }
    free(answer);
    return 200;
}

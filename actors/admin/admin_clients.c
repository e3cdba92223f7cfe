/*
** Commands answered by the connection actors themselves: `clients list|show`,
** `subscriptions` and `topics`. A session's state lives only in its actor, so
** the admin connection asks each one (rt_client_query, Erlang's
** sys:get_state done by message) and builds the answer from the replies as
** they come, or from those that came within RT_ADMIN_GATHER_MS. Asking
** 20,000 clients is 20,000 small messages; nobody stops.
** `clients kick` needs no answer and is done at once.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "conn.h"

#define CLIENTS_LIMIT_DEFAULT 10000
#define CLIENTS_LIMIT_MAX 10000000

typedef enum { G_LIST, G_SHOW, G_SUBS, G_TOPICS } gather_kind_t;

typedef struct {
    char *filter; /* "$share/group/filter" for shared subscriptions */
    uint64_t subscribers;
} topic_t;

struct rt_admin_gather_s {
    gather_kind_t kind;
    uint64_t cookie;
    size_t asked, answered;
    rt_doc_t *rows;  /* the answer's array (list, subs), or the one client (show) */
    topic_t *topics; /* G_TOPICS: every subscription's filter, counted at the end */
    size_t ntopics, captopics;
    bool oom;
    char who[RT_CLIENT_TEXT_MAX]; /* G_SHOW: the client id asked for */
};

static uint64_t next_cookie(void)
{
    static _Atomic uint64_t cookie = 1;
    return cookie++;
}

/* Starts a gather over pids; 0 with c->code 0 (pending), or an answer set now. */
static int gather_start(rt_admin_cmd_t *c, gather_kind_t kind, const rt_pid_t *pids, size_t n)
{
    struct rt_admin_gather_s *g = calloc(1, sizeof(*g));
    if (!g || !(g->rows = kind == G_SHOW ? rt_doc_object() : rt_doc_array())) {
        free(g);
        return rt__admin_fail(c, 500, "out of memory");
    }
    g->kind = kind;
    g->cookie = next_cookie();
    c->gather = g;
    for (size_t i = 0; i < n; i++)
        if (rt_client_query(pids[i], rt_self(c->self), g->cookie, kind != G_LIST) == 0)
            g->asked++;
    if (!g->asked) { /* every actor went away meanwhile: answer now */
        rt__admin_gather_finish(c);
        return c->code;
    }
    c->code = 0;
    return 0;
}

static int ask_all(rt_admin_cmd_t *c, gather_kind_t kind)
{
    long limit;
    if (rt__admin_opt_long(c, "limit", CLIENTS_LIMIT_DEFAULT, 1, CLIENTS_LIMIT_MAX, &limit))
        return c->code;
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    rt_pid_t *pids;
    size_t n;
    /* --after ID and --prefix P page through the table in id order (the HTTP API's lists,
       20,000 clients a page at a time); without them, the first `limit` in table order. */
    const char *after = rt__admin_opt(c, "after", NULL);
    const char *prefix = rt__admin_opt(c, "prefix", NULL);
    int rc = (after || prefix) ? rt_broker_client_page(prefix, after, (size_t)limit, &pids, &n)
                               : rt_broker_client_pids((size_t)limit, &pids, &n);
    rc = rc != 0 ? rt__admin_fail(c, 500, "out of memory") : gather_start(c, kind, pids, n);
    free(pids);
    return rc;
}

static int ask_one(rt_admin_cmd_t *c, gather_kind_t kind, const char *usage)
{
    if (c->argc < 3)
        return rt__admin_fail(c, 400, "usage: %s", usage);
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    rt_pid_t pid = rt_broker_lookup_client(c->argv[2]);
    if (!pid)
        return rt__admin_fail(c, 404, "no client \"%s\" (connected or with a session)", c->argv[2]);
    int rc = gather_start(c, kind, &pid, 1);
    if (c->gather)
        snprintf(c->gather->who, sizeof(c->gather->who), "%s", c->argv[2]);
    return rc;
}

int rt__admin_clients_list(rt_admin_cmd_t *c)
{
    return ask_all(c, G_LIST);
}
int rt__admin_subscriptions(rt_admin_cmd_t *c)
{
    if (c->argc >= 2 && strcmp(c->argv[1], "show") == 0)
        return ask_one(c, G_SUBS, "subscriptions show CLIENT_ID");
    return ask_all(c, G_SUBS);
}
int rt__admin_topics(rt_admin_cmd_t *c)
{
    return ask_all(c, G_TOPICS);
}

int rt__admin_clients_show(rt_admin_cmd_t *c)
{
    return ask_one(c, G_SHOW, "clients show CLIENT_ID");
}

int rt__admin_clients_kick(rt_admin_cmd_t *c)
{
    if (c->argc < 3)
        return rt__admin_fail(c, 400, "usage: clients kick CLIENT_ID");
    rt_pid_t pid = rt_broker ? rt_broker_lookup_client(c->argv[2]) : 0;
    if (!pid || rt_client_kick(pid) != 0)
        return rt__admin_fail(c, 404, "no client \"%s\" (connected or with a session)", c->argv[2]);
    if (!c->json) {
        rt_buf_printf(&c->text, "client %s kicked\n", c->argv[2]);
        return 200;
    }
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "client_id", c->argv[2]);
    rt_doc_add_bool(c->doc, "kicked", true);
    return 200;
}

static const char *version_name(uint8_t v)
{
    return v == 5 ? "5.0" : v == 4 ? "3.1.1" : v == 3 ? "3.1" : "-";
}

/*
** What the client's actor holds, read when its answer is handled (an actor that exited since
** shows 0): the session's queue and inflight messages are in its binaries, its subscriptions
** and the rest of its state in its heap.
*/
void rt__admin_actor_memory_doc(rt_doc_t *o, rt_pid_t pid, bool full)
{
    rt_actor_info_t ai = {0};
    (void)rt_actor_info(pid, &ai);
    rt_doc_add_bytes(o, "memory", rt__admin_actor_memory(&ai));
    if (!full)
        return;
    rt_doc_add_bytes(o, "state_bytes", ai.state_bytes);
    rt_doc_add_bytes(o, "heap_bytes", ai.heap_bytes);
    rt_doc_add_bytes(o, "bin_bytes", ai.bin_bytes);
    rt_doc_add_bytes(o, "ext_bytes", ai.ext_bytes);
}

static void client_doc(rt_doc_t *o, const rt_client_info_t *ci, bool full)
{
    char pid[32], when[32] = "-";
    rt_doc_add_str(o, "client_id", ci->client_id);
    rt_doc_add_str(o, "username", ci->has_username ? ci->username : "");
    rt_doc_add_str(o, "peer", ci->peer);
    rt_doc_add_str(o, "state", ci->connected ? "connected" : "offline");
    rt_doc_add_str(o, "protocol", version_name(ci->version));
    if (ci->connected_at_ms)
        rt__admin_iso_time(ci->connected_at_ms, when, sizeof(when));
    rt_doc_add_str(o, "connected_at", when);
    rt_doc_add_u64(o, "keepalive", ci->keepalive);
    rt_doc_add_u64(o, "subscriptions", ci->subscriptions);
    rt_doc_add_u64(o, "inflight", ci->inflight);
    rt_doc_add_u64(o, "queued", ci->queued);
    rt_doc_add_u64(o, "dropped", ci->dropped);
    rt_doc_add_u64(o, "dropped_qos12", ci->dropped_owed);
    rt_doc_add_u64(o, "acl_denied_publish", ci->acl_denied_publish);
    rt_doc_add_u64(o, "acl_denied_subscribe", ci->acl_denied_subscribe);
    rt_doc_add_u64(o, "rate_limited", ci->rate_limited);
    rt_doc_add_str(o, "transport", ci->transport);
    rt__admin_actor_memory_doc(o, ci->pid, full);
    if (!full)
        return;
    rt__admin_pid_text(ci->pid, pid, sizeof(pid));
    rt_doc_add_str(o, "pid", pid);
    rt_doc_add_bool(o, "clean_start", ci->clean_start);
    rt_doc_add_duration(o, "session_expiry_s", ci->session_expiry, 1);
    rt_doc_add_duration(o, "expires_in_s", ci->expires_in_ms / 1000, 1);
    rt_doc_add_u64(o, "inflight_window", ci->inflight_window);
    rt_doc_add_bytes(o, "queued_bytes", ci->queued_bytes);
    rt_doc_add_u64(o, "mailbox", ci->mailbox_len);
}

/* "$share/group/filter" for a shared subscription, the filter alone otherwise. */
static void full_filter(const rt_client_sub_t *s, char *out, size_t n)
{
    if (s->group)
        snprintf(out, n, RT_TOPIC_SHARE "%.*s/%.*s", (int)s->group_len, s->group,
                 (int)s->filter_len, s->filter);
    else
        snprintf(out, n, "%.*s", (int)s->filter_len, s->filter);
}

static void sub_doc(rt_doc_t *o, const rt_client_info_t *ci, const rt_client_sub_t *s,
                    const char *filter)
{
    if (ci)
        rt_doc_add_str(o, "client_id", ci->client_id);
    rt_doc_add_str(o, "topic", filter);
    rt_doc_add_u64(o, "qos", s->qos);
    rt_doc_add_bool(o, "no_local", s->no_local);
    rt_doc_add_bool(o, "retain_as_published", s->retain_as_published);
    rt_doc_add_u64(o, "retain_handling", s->retain_handling);
    rt_doc_add_bool(o, "exclusive", s->exclusive);
    rt_doc_add_u64(o, "subscription_id", s->sub_id);
}

static void add_topic(struct rt_admin_gather_s *g, const char *filter)
{
    if (rt_grow(&g->topics, &g->captopics, g->ntopics + 1, sizeof(*g->topics), 256) != 0 ||
        !(g->topics[g->ntopics].filter = strdup(filter))) {
        g->oom = true;
        return;
    }
    g->topics[g->ntopics++].subscribers = 1;
}

bool rt__admin_gather_reply(rt_admin_cmd_t *c, rt_msg_t *m)
{
    if (c->xgather)
        return rt__admin_xmpp_gather_reply(c, m);
    struct rt_admin_gather_s *g = c->gather;
    const rt_client_info_t *ci = rt_client_info_of(m);
    if (!g || !ci || ci->cookie != g->cookie)
        return false;
    g->answered++;
    char filter[RT_CLIENT_TEXT_MAX * 2];
    rt_client_sub_t s;
    size_t pos = 0;
    switch (g->kind) {
    case G_LIST:
        client_doc(rt_doc_add_object(g->rows, NULL), ci, false);
        break;
    case G_SHOW: {
        client_doc(g->rows, ci, true);
        rt_doc_t *subs = rt_doc_add_array(g->rows, "subscription_list");
        while (rt_client_info_subs_next(m, &pos, &s)) {
            full_filter(&s, filter, sizeof(filter));
            sub_doc(rt_doc_add_object(subs, NULL), NULL, &s, filter);
        }
        break;
    }
    case G_SUBS:
        while (rt_client_info_subs_next(m, &pos, &s)) {
            full_filter(&s, filter, sizeof(filter));
            sub_doc(rt_doc_add_object(g->rows, NULL), ci, &s, filter);
        }
        break;
    case G_TOPICS:
        while (rt_client_info_subs_next(m, &pos, &s)) {
            full_filter(&s, filter, sizeof(filter));
            add_topic(g, filter);
        }
        break;
    }
    return g->answered == g->asked;
}

static int cmp_topic(const void *a, const void *b)
{
    return strcmp(((const topic_t *)a)->filter, ((const topic_t *)b)->filter);
}

void rt__admin_gather_finish(rt_admin_cmd_t *c)
{
    if (c->xgather) {
        rt__admin_xmpp_gather_finish(c);
        return;
    }
    struct rt_admin_gather_s *g = c->gather;
    c->code = 200;
    if (g->kind == G_SHOW && !g->answered) {
        rt__admin_fail(c, 504, "client \"%s\" did not answer within %d ms", g->who,
                       RT_ADMIN_GATHER_MS);
        return;
    }
    if (g->kind == G_TOPICS) {
        /* Filters sorted, runs of the same one counted: a subscriber count per topic. */
        qsort(g->topics, g->ntopics, sizeof(topic_t), cmp_topic);
        for (size_t i = 0; i < g->ntopics;) {
            size_t j = i + 1;
            while (j < g->ntopics && strcmp(g->topics[j].filter, g->topics[i].filter) == 0)
                j++;
            rt_doc_t *o = rt_doc_add_object(g->rows, NULL);
            rt_doc_add_str(o, "topic", g->topics[i].filter);
            rt_doc_add_u64(o, "subscribers", j - i);
            i = j;
        }
    }
    if (g->oom) {
        rt__admin_fail(c, 500, "out of memory");
        return;
    }
    c->doc = g->rows;
    g->rows = NULL;
}

void rt__admin_gather_free(rt_admin_cmd_t *c)
{
    rt__admin_xmpp_gather_free(c);
    struct rt_admin_gather_s *g = c->gather;
    if (!g)
        return;
    rt_doc_free(g->rows);
    for (size_t i = 0; i < g->ntopics; i++)
        free(g->topics[i].filter);
    free(g->topics);
    free(g);
    c->gather = NULL;
}

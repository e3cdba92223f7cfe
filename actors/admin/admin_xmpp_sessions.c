/*
** `xmpp servers`: the server-to-server streams, from c2s's list of them (rt_c2s_s2s_each).
** `xmpp sessions [HOST]`, `xmpp show JID` and `xmpp kick JID`: the bound XMPP sessions, as
** `clients list|show|kick` are for MQTT. Who is bound is the c2s registry's (rt_c2s_sessions);
** what a session holds only its actor knows, so each one found is asked (rt_c2s_query) and
** the answer is built from the replies that came within RT_ADMIN_GATHER_MS, sorted by JID.
** A session that ended meanwhile is left out. The registry's walk keeps the first --limit
** JIDs in byte order in a bounded heap, so a node with a million sessions costs the asker
** the limit, not the million.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "broker.h"
#include "c2s.h"
#include "conn.h"
#include "jid.h"

#define SESSIONS_LIMIT_DEFAULT 10000
#define SESSIONS_LIMIT_MAX 1000000

typedef enum { X_LIST, X_SHOW_FULL, X_SHOW_BARE } xkind_t;

/* A session found in the registry: its full JID (malloc'ed) and actor. */
typedef struct {
    char *jid;
    rt_pid_t pid;
} found_t;

/* One answer: the session's account of itself, its texts copied (malloc'ed). */
typedef struct {
    rt_c2s_info_t info; /* without its text */
    char *jid, *stream_id;
} answer_t;

struct rt_admin_xgather_s {
    xkind_t kind;
    uint64_t cookie;
    size_t asked, answered;
    answer_t *answers;
    size_t nanswers, capanswers;
    bool oom;
    char who[RT_JID_TEXT_MAX + 1]; /* the JID asked for (show) */
};

/* What the registry's walk looks for, and what it keeps. */
typedef struct {
    const char *bare, *res; /* show, kick: this bare JID's sessions (res's alone if res_len) */
    size_t bare_len, res_len;
    const char *domain; /* sessions HOST: those of this domain; NULL: all */
    size_t domain_len;
    rt_admin_heap_t heap; /* of found_t: the first heap.cap JIDs in byte order */
    bool oom;
} walk_t;

static bool later_jid(const void *a, const void *b)
{
    return strcmp(((const found_t *)a)->jid, ((const found_t *)b)->jid) > 0;
}

static bool wanted(const walk_t *w, const rt_c2s_session_t *s)
{
    if (w->bare)
        return s->bare_len == w->bare_len && memcmp(s->bare, w->bare, w->bare_len) == 0 &&
               (!w->res_len ||
                (s->res_len == w->res_len && memcmp(s->resource, w->res, w->res_len) == 0));
    if (!w->domain)
        return true;
    const char *at = memchr(s->bare, '@', s->bare_len);
    const char *dom = at ? at + 1 : s->bare;
    size_t len = s->bare_len - (size_t)(dom - s->bare);
    return len == w->domain_len && memcmp(dom, w->domain, len) == 0;
}

/* Under a registry lock: copies what it keeps and returns, sending nothing. */
static void on_session(const rt_c2s_session_t *s, void *arg)
{
    walk_t *w = arg;
    if (!wanted(w, s))
        return;
    char jid[RT_JID_TEXT_MAX + 1];
    snprintf(jid, sizeof(jid), "%.*s/%.*s", (int)s->bare_len, s->bare, (int)s->res_len,
             s->resource);
    found_t f = {.jid = jid, .pid = s->pid}, dropped = {0};
    if (!rt__admin_heap_wants(&w->heap, &f))
        return;
    if (!(f.jid = strdup(jid))) {
        w->oom = true;
        return;
    }
    rt__admin_heap_put(&w->heap, &f, &dropped);
    free(dropped.jid);
}

/* Walks the registry into w's heap of cap entries: 0, or an answer set (503, 500). */
static int find_sessions(rt_admin_cmd_t *c, walk_t *w, size_t cap)
{
    if (!rt_broker || !rt_broker->conf.xmpp.on)
        return rt__admin_fail(c, 503, "XMPP is off (rtd.conf has no xmpp table)");
    w->heap = (rt_admin_heap_t){.size = sizeof(found_t), .cap = cap, .worse = later_jid};
    if (!(w->heap.base = calloc(cap ? cap : 1, sizeof(found_t))))
        return rt__admin_fail(c, 500, "out of memory");
    rt_c2s_sessions(on_session, w);
    return 0;
}

static void found_free(walk_t *w)
{
    found_t *f = w->heap.base;
    for (size_t i = 0; i < w->heap.n; i++)
        free(f[i].jid);
    free(w->heap.base);
}

/* Asks every session found; 0 with c->code 0 (answers pending), or an answer set now. */
static int gather_start(rt_admin_cmd_t *c, xkind_t kind, walk_t *w)
{
    static _Atomic uint64_t next_cookie = 1;
    struct rt_admin_xgather_s *g = calloc(1, sizeof(*g));
    if (!g || w->oom) {
        free(g);
        return rt__admin_fail(c, 500, "out of memory");
    }
    g->kind = kind;
    g->cookie = next_cookie++;
    c->xgather = g;
    if (kind != X_LIST)
        snprintf(g->who, sizeof(g->who), "%s", c->argv[2]);
    const found_t *f = w->heap.base;
    for (size_t i = 0; i < w->heap.n; i++)
        g->asked += rt_c2s_query(f[i].pid, rt_self(c->self), g->cookie) == 0;
    if (!g->asked) { /* none, or every one ended meanwhile: answered now */
        rt__admin_xmpp_gather_finish(c);
        return c->code;
    }
    c->code = 0;
    return 0;
}

/*
** The sessions of the JID at c->argv[2] (prepared into jb) into w: a full JID's, or each of a
** bare JID's (at most max_resources). 0, or an answer set (400, 503, 500).
*/
static int find_jid(rt_admin_cmd_t *c, const char *usage, rt_jid_buf_t *jb, walk_t *w)
{
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: %s", usage);
    const char *why = "";
    if (rt_jid_prep(c->argv[2], c->arglen[2], jb, &why) != 0)
        return rt__admin_fail(c, 400, "%s: not a JID: %s", c->argv[2], why);
    if (!jb->jid.local)
        return rt__admin_fail(c, 400, "%s: a user's JID is needed (USER@HOST[/RESOURCE])",
                              c->argv[2]);
    w->bare = jb->jid.s;
    w->bare_len = rt_jid_bare_len(&jb->jid);
    w->res = rt_jid_resource(&jb->jid);
    w->res_len = jb->jid.resource;
    return find_sessions(c, w, rt_broker ? (size_t)rt_broker->conf.xmpp.max_resources : 0);
}

int rt__admin_xmpp_sessions(rt_admin_cmd_t *c)
{
    long limit;
    if (c->argc > 3)
        return rt__admin_fail(c, 400, "usage: xmpp sessions [HOST] [--limit N]");
    if (rt__admin_opt_long(c, "limit", SESSIONS_LIMIT_DEFAULT, 1, SESSIONS_LIMIT_MAX, &limit))
        return c->code;
    walk_t w = {0};
    rt_jid_buf_t host;
    if (c->argc == 3) {
        const char *why = "";
        if (rt_jid_prep(c->argv[2], c->arglen[2], &host, &why) != 0 || host.jid.local ||
            host.jid.resource)
            return rt__admin_fail(c, 400, "%s: not a host name%s%s", c->argv[2], why[0] ? ": " : "",
                                  why);
        w.domain = rt_jid_domain(&host.jid);
        w.domain_len = host.jid.domain;
    }
    int rc = find_sessions(c, &w, (size_t)limit);
    if (!rc)
        rc = gather_start(c, X_LIST, &w);
    found_free(&w);
    return rc;
}

int rt__admin_xmpp_show(rt_admin_cmd_t *c)
{
    rt_jid_buf_t jb;
    walk_t w = {0};
    int rc = find_jid(c, "xmpp show JID", &jb, &w);
    if (!rc && !w.heap.n)
        rc = rt__admin_fail(c, 404, "no session of %s", jb.jid.s);
    if (!rc)
        rc = gather_start(c, jb.jid.resource ? X_SHOW_FULL : X_SHOW_BARE, &w);
    found_free(&w);
    return rc;
}

int rt__admin_xmpp_kick(rt_admin_cmd_t *c)
{
    rt_jid_buf_t jb;
    walk_t w = {0};
    int rc = find_jid(c, "xmpp kick JID", &jb, &w);
    size_t kicked = 0;
    const found_t *f = w.heap.base;
    for (size_t i = 0; !rc && i < w.heap.n; i++)
        kicked += rt_c2s_kick(f[i].pid) == 0;
    found_free(&w);
    if (rc)
        return rc;
    if (!kicked)
        return rt__admin_fail(c, 404, "no session of %s", jb.jid.s);
    if (!c->json) {
        rt_buf_printf(&c->text, "%zu session%s of %s kicked\n", kicked, kicked == 1 ? "" : "s",
                      jb.jid.s);
        return 200;
    }
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "jid", jb.jid.s);
    rt_doc_add_u64(c->doc, "kicked", kicked);
    return 200;
}

static void server_doc(const rt_c2s_s2s_info_t *s, void *arg)
{
    rt_doc_t *o = rt_doc_add_object(arg, NULL);
    rt_doc_add_str(o, "direction", s->incoming ? "in" : "out");
    rt_doc_add_str(o, "local", s->local);
    rt_doc_add_str(o, "remote", s->remote);
    rt_doc_add_str(o, "state", s->state);
    rt_doc_add_bool(o, "tls", s->tls);
    rt_doc_add_str(o, "auth", s->auth);
    rt_doc_add_str(o, "peer", s->peer);
    char pid[32];
    rt__admin_pid_text(s->pid, pid, sizeof(pid));
    rt_doc_add_str(o, "pid", pid);
    rt_doc_add_duration(o, "up_ms", rt_mono_ms() - s->since_ms, 1000);
    rt_doc_add_u64(o, "domains", s->incoming ? s->domains : 1); /* pairs it carries */
    rt_doc_add_bytes(o, "queued", s->queued_bytes);             /* out: held until ready */
}

int rt__admin_xmpp_servers(rt_admin_cmd_t *c)
{
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_c2s_s2s_each(server_doc, c->doc);
    return 200;
}

bool rt__admin_xmpp_gather_reply(rt_admin_cmd_t *c, rt_msg_t *m)
{
    struct rt_admin_xgather_s *g = c->xgather;
    const rt_c2s_info_t *i = rt_c2s_info_of(m);
    if (!g || !i || i->cookie != g->cookie)
        return false;
    g->answered++;
    answer_t a = {.info = *i,
                  .jid = strdup(rt_c2s_info_jid(i)),
                  .stream_id = strdup(rt_c2s_info_stream_id(i))};
    if (!a.jid || !a.stream_id ||
        rt_grow(&g->answers, &g->capanswers, g->nanswers + 1, sizeof(answer_t), 64) != 0) {
        free(a.jid);
        free(a.stream_id);
        g->oom = true;
    } else {
        g->answers[g->nanswers++] = a;
    }
    return g->answered == g->asked;
}

static int by_jid(const void *a, const void *b)
{
    return strcmp(((const answer_t *)a)->jid, ((const answer_t *)b)->jid);
}

/* "host:port" of the listener of index (bound port), and its kind. */
static void listener_doc(rt_doc_t *o, unsigned index)
{
    const rt_listen_t *l = rt_conf_listener(&rt_broker->conf, index);
    if (!l)
        return;
    char where[128];
    rt__admin_listener_text(l->host, atomic_load(&rt_broker->listener_stats[index].port), where,
                            sizeof(where));
    rt_doc_add_str(o, "listener", where);
    rt_doc_add_str(o, "kind", rt_listener_kind(index));
}

static void session_doc(rt_doc_t *o, const answer_t *a, bool full)
{
    const rt_c2s_info_t *i = &a->info;
    char pid[32];
    rt__admin_pid_text(i->pid, pid, sizeof(pid));
    rt_doc_add_str(o, "jid", a->jid);
    rt_doc_add_str(o, "pid", pid);
    rt_doc_add_bool(o, "available", i->available);
    rt_doc_add_i64(o, "priority", i->priority);
    rt_doc_add_str(o, "peer", i->peer);
    rt__admin_actor_memory_doc(o, i->pid, full);
    if (!full)
        return;
    listener_doc(o, i->listener);
    rt_doc_add_bool(o, "tls", i->secure);
    rt_doc_add_bool(o, "detached", i->detached);
    rt_doc_add_str(o, "stream_id", a->stream_id);
    rt_doc_add_u64(o, "roster_items", i->roster_items);
    rt_doc_add_bytes(o, "roster_bytes", i->roster_bytes);
    rt_doc_add_bool(o, "roster_loaded", i->roster_loaded);
    rt_doc_add_bool(o, "roster_pushes", i->interested);
    rt_doc_add_u64(o, "mailbox", i->mailbox_len);
    rt_doc_add_duration(o, "idle_s", i->idle_ms / 1000, 1);
}

void rt__admin_xmpp_gather_finish(rt_admin_cmd_t *c)
{
    struct rt_admin_xgather_s *g = c->xgather;
    c->code = 200;
    if (g->oom) {
        rt__admin_fail(c, 500, "out of memory");
        return;
    }
    if (g->kind != X_LIST && !g->nanswers) {
        if (g->asked)
            rt__admin_fail(c, 504, "no session of %s answered within %d ms", g->who,
                           RT_ADMIN_GATHER_MS);
        else
            rt__admin_fail(c, 404, "no session of %s (it ended)", g->who);
        return;
    }
    if (g->nanswers) /* qsort takes no NULL, even for none */
        qsort(g->answers, g->nanswers, sizeof(answer_t), by_jid);
    if (g->kind == X_SHOW_FULL) {
        if ((c->doc = rt_doc_object()))
            session_doc(c->doc, &g->answers[0], true);
    } else if ((c->doc = rt_doc_array())) {
        for (size_t i = 0; i < g->nanswers; i++)
            session_doc(rt_doc_add_object(c->doc, NULL), &g->answers[i], g->kind != X_LIST);
    }
    if (!c->doc)
        rt__admin_fail(c, 500, "out of memory");
}

void rt__admin_xmpp_gather_free(rt_admin_cmd_t *c)
{
    struct rt_admin_xgather_s *g = c->xgather;
    if (!g)
        return;
    for (size_t i = 0; i < g->nanswers; i++) {
        free(g->answers[i].jid);
        free(g->answers[i].stream_id);
    }
    free(g->answers);
    free(g);
    c->xgather = NULL;
}

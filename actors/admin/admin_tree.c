/*
** Supervision from the admin socket: `tree` draws every supervision tree in the node
** (rtd has one, under rtd_sup) with each child's pid, restart count and last exit,
** and `actors kill PID [REASON]` sends an exit signal, Erlang's exit/2. Both run on
** the admin worker: `tree` walks every actor, and a signal sent from there never
** comes from one of the admin listener's own connections (whose exits it ignores).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"

#define TREE_DEPTH_MAX 16 /* nesting drawn at most (rtd's is 3) */

static const char *const restart_names[] = {"permanent", "transient", "temporary"};
static const char *const strategy_names[] = {"one_for_one", "one_for_all"};

/* A supervisor's children (malloc'd; NULL when it has none or is gone), and its settings. */
static rt_sup_child_info_t *children_of(rt_pid_t sup, rt_sup_info_t *info)
{
    rt_sup_child_info_t *kids = NULL;
    size_t cap = 0;
    /* Children may be added between the calls: ask again until they all fit. */
    for (int tries = 0; tries < 4; tries++) {
        if (rt_supervisor_info(sup, info, kids, cap) != 0) {
            free(kids);
            info->nchildren = 0;
            return NULL;
        }
        if (info->nchildren <= cap)
            return kids;
        free(kids);
        cap = info->nchildren + 4;
        if (!(kids = calloc(cap, sizeof(*kids))))
            break;
    }
    free(kids);
    info->nchildren = 0;
    return NULL;
}

typedef struct {
    rt_pid_t *sups; /* every supervisor alive */
    size_t n, cap;
    bool oom;
} sups_t;

static void collect_sup(const rt_actor_info_t *a, void *ud)
{
    sups_t *s = ud;
    if (strcmp(a->type, rt_supervisor_type.name) != 0)
        return;
    if (rt_grow(&s->sups, &s->cap, s->n + 1, sizeof(*s->sups), 8) != 0) {
        s->oom = true;
        return;
    }
    s->sups[s->n++] = a->pid;
}

/* The supervisors that are nobody's child: the roots of the trees. */
static size_t find_roots(sups_t *s)
{
    size_t roots = s->n;
    for (size_t i = 0; i < s->n; i++) {
        rt_sup_info_t info;
        rt_sup_child_info_t *kids = children_of(s->sups[i], &info);
        for (size_t k = 0; k < info.nchildren; k++)
            for (size_t j = 0; j < roots; j++)
                if (kids[k].supervisor && s->sups[j] == kids[k].pid) {
                    s->sups[j] = s->sups[--roots];
                    s->sups[roots] = kids[k].pid;
                    break;
                }
        free(kids);
    }
    return roots;
}

/* "killed, 12 s ago" for a child's last exit; "" when it never exited. */
static void last_exit_text(const rt_sup_child_info_t *k, uint64_t now_ms, char *out, size_t n)
{
    if (!k->last_exit_ms) {
        out[0] = 0;
        return;
    }
    uint64_t ago = now_ms > k->last_exit_ms ? (now_ms - k->last_exit_ms) / 1000 : 0;
    snprintf(out, n, "%s, %llus ago", rt_reason_name(k->last_reason), (unsigned long long)ago);
}

/* One node of the tree: the supervisor or worker pid, and what its parent knows of it. */
static void node_doc(rt_doc_t *parent, const char *name, rt_pid_t pid,
                     const rt_sup_child_info_t *as_child, uint64_t now_ms, int depth)
{
    rt_doc_t *o = rt_doc_add_object(parent, NULL);
    char text[64];
    rt_doc_add_str(o, "name", name);
    if (pid) {
        rt__admin_pid_text(pid, text, sizeof(text));
        rt_doc_add_str(o, "pid", text);
    } else {
        rt_doc_add_null(o, "pid");
    }
    rt_actor_info_t ai;
    rt_doc_add_str(o, "type", pid && rt_actor_info(pid, &ai) == 0 ? ai.type : "");
    if (as_child) {
        rt_doc_add_str(o, "restart", restart_names[as_child->restart]);
        rt_doc_add_u64(o, "restarts", as_child->restarts);
        if (as_child->last_exit_ms) {
            rt_doc_t *e = rt_doc_add_object(o, "last_exit");
            rt_doc_add_str(e, "reason", rt_reason_name(as_child->last_reason));
            rt__admin_iso_time(as_child->last_exit_ms, text, sizeof(text));
            rt_doc_add_str(e, "at", text);
            rt_doc_add_u64(e, "ms_ago",
                           now_ms > as_child->last_exit_ms ? now_ms - as_child->last_exit_ms : 0);
        } else {
            rt_doc_add_null(o, "last_exit");
        }
    }
    rt_sup_info_t info;
    if (!pid || depth >= TREE_DEPTH_MAX || rt_supervisor_info(pid, &info, NULL, 0) != 0)
        return;
    rt_sup_child_info_t *kids = children_of(pid, &info);
    rt_doc_add_str(o, "strategy", strategy_names[info.strategy]);
    rt_doc_add_u64(o, "intensity", info.intensity);
    rt_doc_add_duration(o, "period_ms", info.period_ms, 1000);
    rt_doc_add_u64(o, "child_restarts", info.restarts);
    rt_doc_t *list = rt_doc_add_array(o, "children");
    for (size_t i = 0; kids && i < info.nchildren; i++)
        node_doc(list, kids[i].name, kids[i].pid, &kids[i], now_ms, depth + 1);
    free(kids);
}

/* The text form: one line per node, children indented under their supervisor. */
static void node_text(rt_buf_t *out, const char *name, rt_pid_t pid,
                      const rt_sup_child_info_t *as_child, uint64_t now_ms, int depth)
{
    char pidtext[32] = "-", restarts[24] = "-", last[64] = "", what[96];
    if (pid)
        rt__admin_pid_text(pid, pidtext, sizeof(pidtext));
    if (as_child) {
        snprintf(restarts, sizeof(restarts), "%llu", (unsigned long long)as_child->restarts);
        last_exit_text(as_child, now_ms, last, sizeof(last));
    }
    rt_sup_info_t info;
    rt_actor_info_t ai;
    bool sup = pid && depth < TREE_DEPTH_MAX && rt_supervisor_info(pid, &info, NULL, 0) == 0;
    rt_sup_child_info_t *kids = sup ? children_of(pid, &info) : NULL;
    if (sup)
        snprintf(what, sizeof(what), "supervisor %s %u/%gs", strategy_names[info.strategy],
                 info.intensity, info.period_ms / 1000.0);
    else
        snprintf(what, sizeof(what), "%s",
                 !pid                           ? "not running"
                 : rt_actor_info(pid, &ai) == 0 ? ai.type
                                                : "exited");
    int indent = depth * 2, width = 30 - indent > 10 ? 30 - indent : 10;
    rt_buf_printf(out, "%*s%-*s %-12s %-30s %-10s %8s  %s\n", indent, "", width, name, pidtext,
                  what, as_child ? restart_names[as_child->restart] : "-", restarts, last);
    for (size_t i = 0; sup && kids && i < info.nchildren; i++)
        node_text(out, kids[i].name, kids[i].pid, &kids[i], now_ms, depth + 1);
    free(kids);
}

/* A root's name: its registered one, or its pid. */
static void root_name(rt_pid_t pid, char *out, size_t n)
{
    rt_actor_info_t ai;
    if (rt_actor_info(pid, &ai) == 0 && ai.name[0])
        snprintf(out, n, "%s", ai.name);
    else
        rt__admin_pid_text(pid, out, n);
}

int rt__admin_tree(rt_admin_cmd_t *c)
{
    sups_t s = {0};
    rt_snapshot_actors(collect_sup, &s);
    if (s.oom) {
        free(s.sups);
        return rt__admin_fail(c, 500, "out of memory");
    }
    size_t roots = find_roots(&s);
    uint64_t now = rt_wall_ms();
    char name[64];
    if (c->json) {
        if (!(c->doc = rt_doc_array())) {
            free(s.sups);
            return rt__admin_fail(c, 500, "out of memory");
        }
        for (size_t i = 0; i < roots; i++) {
            root_name(s.sups[i], name, sizeof(name));
            node_doc(c->doc, name, s.sups[i], NULL, now, 0);
        }
    } else {
        rt_buf_printf(&c->text, "%-30s %-12s %-30s %-10s %8s  %s\n", "NAME", "PID", "WHAT",
                      "RESTART", "RESTARTS", "LAST EXIT");
        for (size_t i = 0; i < roots; i++) {
            root_name(s.sups[i], name, sizeof(name));
            node_text(&c->text, name, s.sups[i], NULL, now, 0);
        }
        if (!roots)
            rt_buf_printf(&c->text, "no supervisor is running\n");
    }
    free(s.sups);
    return 200;
}

int rt__admin_actors_kill(rt_admin_cmd_t *c)
{
    rt_pid_t pid;
    if (c->argc < 3 || c->argc > 4)
        return rt__admin_fail(c, 400, "usage: actors kill PID [REASON]");
    if (rt__admin_parse_pid(c->argv[2], &pid) != 0)
        return rt__admin_fail(c, 400,
                              "bad pid \"%s\": give it as <slot.gen> (rtctl tree, actors "
                              "list) or as a number",
                              c->argv[2]);
    const char *word = c->argc == 4 ? c->argv[3] : "kill";
    rt_reason_t reason;
    int rc = rt_reason_parse(word, &reason);
    if (rc == RT_ELIMIT)
        return rt__admin_fail(c, 409,
                              "too many distinct exit reasons (%d) already: use kill, "
                              "shutdown or a word used before",
                              RT_REASON_WORDS_MAX);
    if (rc)
        return rt__admin_fail(c, 400,
                              "bad reason \"%s\": kill (untrappable), normal, shutdown, "
                              "or a word of letters, digits and _ (at most %d)",
                              word, RT_REASON_WORD_MAX - 1);
    rt_actor_info_t ai;
    char text[32];
    rt__admin_pid_text(pid, text, sizeof(text));
    if (rt_actor_info(pid, &ai) != 0 || rt_exit_signal(pid, reason) != 0)
        return rt__admin_fail(c, 404, "no actor %s (it is not running)", text);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "pid", text);
    rt_doc_add_str(c->doc, "type", ai.type);
    rt_doc_add_str(c->doc, "name", ai.name);
    rt_doc_add_str(c->doc, "reason", rt_reason_name(reason));
    /* exit/2 semantics, said where they surprise: normal ends only an actor trapping exits
       (as a message), and other reasons become a message for one that traps them. */
    rt_doc_add_str(c->doc, "sent",
                   reason == RT_REASON_KILL ? "untrappable: the actor ends"
                   : reason == RT_REASON_NORMAL
                       ? "an actor that does not trap exits ignores it"
                       : "the actor ends, or handles it if it traps exits");
    return 200;
}

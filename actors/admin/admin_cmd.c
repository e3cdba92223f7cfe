/*
** The admin socket's commands (docs/ADMIN.md), except those that ask
** connection actors (admin_clients.c) and sample actors (admin_top.c). Each
** builds a doc that admin_request.c renders as text or JSON.
*/
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "acl.h"
#include "admin_impl.h"
#include "cluster.h"
#include "conn.h"
#include "log.h"
#include "rule_engine.h"
#include "sink.h"
#include "tls.h"
#include "trace.h"

#define RULES_MAX 1024
#define SINKS_MAX 64

static void uptime_text(uint64_t ms, char *out, size_t n)
{
    uint64_t s = ms / 1000;
    if (s >= 86400)
        snprintf(out, n, "%llud %02lluh %02llum %02llus", (unsigned long long)(s / 86400),
                 (unsigned long long)(s / 3600 % 24), (unsigned long long)(s / 60 % 60),
                 (unsigned long long)(s % 60));
    else
        snprintf(out, n, "%02lluh %02llum %02llus", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
}

/* The positional word at i (after the command's words), or NULL. */
static const char *word_at(const rt_admin_cmd_t *c, int i)
{
    return i < c->argc ? c->argv[i] : NULL;
}

static int need_object(rt_admin_cmd_t *c)
{
    c->doc = rt_doc_object();
    return c->doc ? 0 : rt__admin_fail(c, 500, "out of memory");
}

/* ---- status, broker ---- */

static void add_tls(rt_doc_t *o, const rt_listen_t *l, unsigned index);

/* The HTTP listener, when there is one ("host:port" into where); NULL when none. */
static const rt_listen_t *http_listener(char *where, size_t len)
{
    const rt_listen_t *h =
        rt_broker && rt_broker->conf.http.on ? &rt_broker->conf.http.where : NULL;
    if (h)
        rt__admin_listener_text(h->host, h->port, where, len);
    return h;
}

static int cmd_status(rt_admin_cmd_t *c)
{
    char up[32], where[128];
    rt_doc_seconds_text((double)(rt__admin_uptime_ms() / 1000), up, sizeof(up));
    /* The HTTP listener is none of the MQTT listeners `listeners` shows: it is shown here. */
    const rt_listen_t *h = http_listener(where, sizeof(where));
    if (!c->json) {
        rt_buf_printf(&c->text, "rtd %s is running (pid %d, up %s)\n", rt__admin_version(),
                      (int)getpid(), up);
        if (h)
            rt_buf_printf(&c->text, "http listener %s (%s)\n", where, h->tls_on ? "https" : "http");
        if (rt_trace_active())
            rt_buf_printf(&c->text, "packet traces on: %u\n", rt_trace_active());
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_str(c->doc, "status", "running");
    rt_doc_add_str(c->doc, "version", rt__admin_version());
    rt_doc_add_i64(c->doc, "pid", getpid());
    rt_doc_add_duration(c->doc, "uptime_s", rt__admin_uptime_ms() / 1000, 1);
    rt_doc_add_u64(c->doc, "traces", rt_trace_active());
    if (h) {
        rt_doc_t *o = rt_doc_add_object(c->doc, "http");
        rt_doc_add_str(o, "listener", where);
        rt_doc_add_str(o, "kind", h->tls_on ? "https" : "http");
        add_tls(o, h, RT_TLS_HTTP);
    }
    return 200;
}

static int cmd_broker(rt_admin_cmd_t *c)
{
    if (need_object(c))
        return c->code;
    char up[64], now[32], started[32];
    uint64_t uptime = rt__admin_uptime_ms(), wall = rt_wall_ms();
    uptime_text(uptime, up, sizeof(up));
    rt__admin_iso_time(wall, now, sizeof(now));
    rt__admin_iso_time(wall - uptime, started, sizeof(started));
    rt_doc_add_str(c->doc, "sysdescr",
                   "rtd: an MQTT 3.1/3.1.1/5.0 broker on Erlang-style C actors");
    rt_doc_add_str(c->doc, "version", rt__admin_version());
    if (c->json) /* EMQX's form, for scripts that read it; text has uptime_s alone */
        rt_doc_add_str(c->doc, "uptime", up);
    rt_doc_add_duration(c->doc, "uptime_s", uptime / 1000, 1);
    rt_doc_add_str(c->doc, "started_at", started);
    rt_doc_add_str(c->doc, "datetime", now);
    rt_doc_add_i64(c->doc, "pid", getpid());
    return 200;
}

/* ---- broker stats, metrics ---- */

static void count_doc(rt_doc_t *parent, const char *key, const rt_count_t *n)
{
    rt_doc_t *o = rt_doc_add_object(parent, key);
    rt_doc_add_u64(o, "count", n->count);
    rt_doc_add_u64(o, "max", n->max);
}

/* Refusals an operator watches for: logins by reason, requests the ACL refused. */
static void refusals(rt_admin_cmd_t *c)
{
    static const char *const acl_names[3] = {"publish", "subscribe", "deliver"};
    rt_acl_stats_t a;
    rt_acl_stats(&a);
    uint64_t auth[RT_AUTH_FAILED_REASONS],
        acl[3] = {a.denied_publish, a.denied_subscribe, a.denied_read};
    for (int r = 0; r < RT_AUTH_FAILED_REASONS; r++)
        auth[r] = atomic_load_explicit(&rt_broker->stats.auth_failed[r], memory_order_relaxed);
    if (!c->json) {
        for (int r = 0; r < RT_AUTH_FAILED_REASONS; r++)
            rt_buf_printf(&c->text, "auth_failures/%s%*s: %llu\n", rt_auth_failed_names[r],
                          (int)(23 - strlen(rt_auth_failed_names[r])), "",
                          (unsigned long long)auth[r]);
        for (int k = 0; k < 3; k++)
            rt_buf_printf(&c->text, "acl_denied/%s%*s: %llu\n", acl_names[k],
                          (int)(27 - strlen(acl_names[k])), "", (unsigned long long)acl[k]);
        return;
    }
    rt_doc_t *o = rt_doc_add_object(c->doc, "auth_failures");
    for (int r = 0; r < RT_AUTH_FAILED_REASONS; r++)
        rt_doc_add_u64(o, rt_auth_failed_names[r], auth[r]);
    o = rt_doc_add_object(c->doc, "acl_denied");
    for (int k = 0; k < 3; k++)
        rt_doc_add_u64(o, acl_names[k], acl[k]);
}

static int cmd_broker_stats(rt_admin_cmd_t *c)
{
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    rt_broker_counts_t n;
    rt_broker_counts(&n);
    if (!c->json) {
        /* emqttd_ctl's shape: one "name/count" and "name/max" per line. */
        static const char *const names[] = {"connections",   "sessions", "topics",
                                            "subscriptions", "retained", "retained_bytes"};
        const rt_count_t *v[] = {&n.connections,   &n.sessions, &n.topics,
                                 &n.subscriptions, &n.retained, &n.retained_bytes};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            char count[32], max[32];
            bool bytes = strcmp(names[i], "retained_bytes") == 0;
            snprintf(count, sizeof(count), "%llu", (unsigned long long)v[i]->count);
            snprintf(max, sizeof(max), "%llu", (unsigned long long)v[i]->max);
            if (bytes) {
                rt_doc_bytes_text((int64_t)v[i]->count, count, sizeof(count));
                rt_doc_bytes_text((int64_t)v[i]->max, max, sizeof(max));
            }
            rt_buf_printf(&c->text, "%s/count%*s: %s\n", names[i], (int)(15 - strlen(names[i])),
                          "", count);
            rt_buf_printf(&c->text, "%s/max%*s: %s\n", names[i], (int)(17 - strlen(names[i])), "",
                          max);
        }
        refusals(c);
        return 200;
    }
    if (need_object(c))
        return c->code;
    count_doc(c->doc, "connections", &n.connections);
    count_doc(c->doc, "sessions", &n.sessions);
    count_doc(c->doc, "topics", &n.topics);
    count_doc(c->doc, "subscriptions", &n.subscriptions);
    count_doc(c->doc, "retained", &n.retained);
    count_doc(c->doc, "retained_bytes", &n.retained_bytes);
    rt_doc_add_u64(c->doc, "shared_groups", n.shared_groups);
    refusals(c);
    return 200;
}

static int cmd_broker_metrics(rt_admin_cmd_t *c)
{
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    rt_broker_metrics_t m;
    rt_broker_metrics(&m);
    if (need_object(c))
        return c->code;
    rt_doc_t *in = rt_doc_add_object(c->doc, "packets_in");
    rt_doc_t *out = rt_doc_add_object(c->doc, "packets_out");
    uint64_t total_in = 0, total_out = 0;
    for (unsigned t = 1; t < RT_MQTT_PACKET_TYPES; t++) {
        total_in += m.packets_in[t];
        total_out += m.packets_out[t];
    }
    rt_doc_add_u64(in, "total", total_in);
    rt_doc_add_u64(out, "total", total_out);
    for (unsigned t = 1; t < RT_MQTT_PACKET_TYPES; t++) {
        char name[32];
        snprintf(name, sizeof(name), "%s", rt_mqtt_packet_name(t));
        for (char *p = name; *p; p++)
            *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
        rt_doc_add_u64(in, name, m.packets_in[t]);
        rt_doc_add_u64(out, name, m.packets_out[t]);
    }
    rt_doc_t *bytes = rt_doc_add_object(c->doc, "bytes");
    rt_doc_add_bytes(bytes, "in", (int64_t)m.bytes_in);
    rt_doc_add_bytes(bytes, "out", (int64_t)m.bytes_out);
    rt_doc_t *msgs = rt_doc_add_object(c->doc, "messages");
    rt_doc_add_u64(msgs, "in", m.msgs_in);
    rt_doc_add_u64(msgs, "out", m.msgs_out);
    rt_doc_add_u64(msgs, "dropped", m.msgs_dropped);
    rt_doc_add_u64(msgs, "expired", m.msgs_expired);
    /* Packets the spec would refuse that rtd accepts from clients known to send them. */
    rt_doc_t *tolerated = rt_doc_add_object(c->doc, "tolerated");
    rt_doc_add_u64(tolerated, "v31_subscribe_flags",
                   atomic_load_explicit(&rt_broker->stats.v31_sub_flags, memory_order_relaxed));
    return 200;
}

/* ---- listeners ---- */

#define LISTENERS_MAX RT_CONF_ALL_LISTENERS

/* A TLS listener's settings and certificate as served now (index: rt_tls_info's). */
static void add_tls(rt_doc_t *o, const rt_listen_t *l, unsigned index)
{
    rt_tls_info_t info;
    if (!rt_tls_info(index, &info))
        return;
    rt_doc_t *t = rt_doc_add_object(o, "tls");
    rt_doc_add_str(t, "cert", l->tls.cert);
    rt_doc_add_str(t, "subject", info.subject);
    rt_doc_add_str(t, "not_after", info.not_after);
    rt_doc_add_i64(t, "days_left", info.days_left);
    rt_doc_add_str(t, "verify", rt_conf_tls_verify_names[l->tls.verify]);
    if (l->tls.ca[0])
        rt_doc_add_str(t, "ca", l->tls.ca);
    if (l->tls.crl[0])
        rt_doc_add_str(t, "crl", l->tls.crl);
    rt_doc_add_bool(t, "identity_as_username", l->tls.identity_as_username);
    rt_doc_add_str(t, "min_version", l->tls.min_version == RT_TLS_1_3 ? "1.3" : "1.2");
    if (l->tls.nsni) {
        rt_doc_t *names = rt_doc_add_array(t, "sni");
        for (unsigned i = 0; i < l->tls.nsni; i++)
            rt_doc_add_str(names, NULL, l->tls.sni[i].name);
    }
    rt_doc_add_u64(t, "reloads", info.reloads);
    if (info.last_error[0])
        rt_doc_add_str(t, "last_reload_error", info.last_error);
}

/* A listener's transport: its kind, its TLS settings and certificate, its proxy (index:
   among all listeners, rt_listener_info_t.index). */
static void add_transport(rt_doc_t *o, unsigned index)
{
    const rt_listen_t *l = rt_conf_listener(&rt_broker->conf, index);
    if (!l)
        return;
    rt_doc_add_str(o, "kind", rt_listener_kind(index));
    rt_doc_add_bool(o, "proxy_protocol", l->proxy_protocol);
    if (l->websocket[0])
        rt_doc_add_str(o, "websocket_path", l->websocket);
    if (l->rate_limit.messages > 0 || l->rate_limit.bytes > 0) {
        rt_doc_t *r = rt_doc_add_object(o, "rate_limit");
        rt_doc_add_double(r, "messages", l->rate_limit.messages, 1);
        rt_doc_add_double(r, "bytes", l->rate_limit.bytes, 0);
    }
    add_tls(o, l, index);
}

static int cmd_listeners(rt_admin_cmd_t *c)
{
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    rt_listener_info_t ls[LISTENERS_MAX];
    size_t n = rt_broker_listeners(ls, LISTENERS_MAX);
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    for (size_t i = 0; i < n && i < LISTENERS_MAX; i++) {
        rt_doc_t *o = rt_doc_add_object(c->doc, NULL);
        char where[128];
        rt__admin_listener_text(ls[i].address, ls[i].port, where, sizeof(where));
        rt_doc_add_str(o, "listener", where);
        rt_doc_add_str(o, "protocol", ls[i].protocol);
        rt_doc_add_str(o, "state", ls[i].running ? "running" : "stopped");
        rt_doc_add_u64(o, "connections", ls[i].connections);
        rt_doc_add_i64(o, "max_connections", ls[i].max_connections);
        rt_doc_add_u64(o, "accepted", ls[i].accepted);
        rt_doc_add_u64(o, "refused", ls[i].refused);
        rt_doc_add_u64(o, "refused_max_conns", ls[i].refused_max_connections);
        rt_doc_add_u64(o, "refused_per_ip", ls[i].refused_per_ip);
        rt_doc_add_u64(o, "refused_rate", ls[i].refused_rate);
        rt_doc_add_u64(o, "refused_error", ls[i].refused_error);
        rt_doc_add_u64(o, "refused_untrusted_proxy", ls[i].refused_untrusted);
        rt_doc_add_u64(o, "refused_fd_reserve", ls[i].refused_fds);
        rt_doc_add_u64(o, "acl_denied_publish", ls[i].acl_denied_publish);
        rt_doc_add_u64(o, "acl_denied_subscribe", ls[i].acl_denied_subscribe);
        add_transport(o, ls[i].index);
    }
    return 200;
}

static int cmd_tls_reload(rt_admin_cmd_t *c)
{
    char report[RT_ADMIN_ERR_MAX];
    int rc = rt_admin_reload_tls(report, sizeof(report));
    size_t len = strlen(report);
    if (len && report[len - 1] == '\n')
        report[len - 1] = 0;
    if (rc != 0)
        return rt__admin_fail(c, 409,
                              "not every listener reloaded; those that failed keep their "
                              "certificates: %s",
                              report);
    if (!c->json) {
        rt_buf_printf(&c->text, "%s\n", report[0] ? report : "no TLS listener");
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_bool(c->doc, "reloaded", true);
    rt_doc_add_str(c->doc, "report", report);
    return 200;
}

/* ---- vm ---- */

static uint64_t open_files(void)
{
    DIR *d = opendir("/proc/self/fd");
    uint64_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}

typedef struct {
    uint64_t heap, bin, mailbox, actors;
} actor_totals_t;

static void add_actor(const rt_actor_info_t *info, void *ud)
{
    actor_totals_t *t = ud;
    t->heap += info->heap_bytes;
    t->bin += info->bin_bytes;
    t->mailbox += info->mailbox_len;
    t->actors++;
}

static int cmd_vm(rt_admin_cmd_t *c)
{
    if (need_object(c))
        return c->code;
    actor_totals_t t = {0};
    rt_snapshot_actors(add_actor, &t);
    rt_admin_mem_t mem;
    rt__admin_memory(&mem, t.heap, t.bin);
    rt__admin_memory_doc(c->doc, &mem);
    rt__admin_memory_kinds(c->doc);

    rt_sched_info_t info[256];
    size_t n = rt_snapshot_schedulers(info, 256);
    double util[256];
    size_t nutil = rt__admin_sched_util(util, 256);
    rt_doc_t *scheds = rt_doc_add_array(c->doc, "schedulers");
    for (size_t i = 0; i < n; i++) {
        rt_doc_t *s = rt_doc_add_object(scheds, NULL);
        rt_doc_add_u64(s, "id", info[i].index);
        rt_doc_add_str(s, "kind", info[i].blocking_pool ? "blocking" : "scheduler");
        rt_doc_add_double(s, "utilisation", i < nutil ? util[i] : 0, 3);
        rt_doc_add_double(s, "utilisation_since_start",
                          info[i].wall_ns ? (double)info[i].busy_ns / (double)info[i].wall_ns : 0,
                          3);
        rt_doc_add_u64(s, "run_queue", info[i].run_queue);
        rt_doc_add_u64(s, "turns", info[i].turns);
        rt_doc_add_u64(s, "steals", info[i].steals);
    }
    rt_stats_t rs;
    rt_stats(&rs);
    rt_doc_t *a = rt_doc_add_object(c->doc, "actors");
    rt_doc_add_u64(a, "count", rs.alive);
    rt_doc_add_u64(a, "limit", rs.max_actors);
    rt_doc_add_u64(a, "mailboxes", t.mailbox);
    rt_doc_add_u64(a, "spawned", rs.spawned);
    rt_doc_add_u64(a, "exited", rs.exited);
    rt_doc_add_u64(a, "dead_letters", rs.dead_letters);
    rt_doc_add_u64(a, "shed", rs.shed);
    rt_doc_add_u64(a, "heap_limit_kills", rs.heap_limit_kills);
    rt_doc_add_u64(a, "gcs", rs.gcs);
    rt_doc_add_u64(a, "timers_pending", rs.timers_pending);
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    rt_doc_t *f = rt_doc_add_object(c->doc, "files");
    rt_doc_add_u64(f, "used", open_files());
    rt_doc_add_u64(f, "limit", rl.rlim_cur == RLIM_INFINITY ? 0 : (uint64_t)rl.rlim_cur);
    return 200;
}

/* ---- rules ---- */

static rt_rule_info_t *rules_snapshot(rt_admin_cmd_t *c, size_t *n)
{
    rt_rule_info_t *rules = malloc(RULES_MAX * sizeof(*rules));
    if (!rules) {
        rt__admin_fail(c, 500, "out of memory");
        return NULL;
    }
    *n = rt_rules_snapshot(rules, RULES_MAX);
    if (*n > RULES_MAX)
        *n = RULES_MAX;
    return rules;
}

static void rule_doc(rt_doc_t *o, const rt_rule_info_t *r, bool full)
{
    rt_doc_add_str(o, "name", r->name);
    rt_doc_add_str(o, "state", r->enabled ? "enabled" : "disabled");
    if (full) /* rtctl: set by `rules enable/disable`, kept over reloads (rt_rules_enable) */
        rt_doc_add_str(o, "state_set_by", r->overridden ? "rtctl" : "file");
    rt_doc_add_u64(o, "version", r->version);
    rt_doc_add_str(o, "from", r->from);
    rt_doc_add_str(o, "to", r->to);
    if (full)
        rt_doc_add_bool(o, "durable", r->durable);
    rt_doc_add_u64(o, "matched", r->matched);
    rt_doc_add_u64(o, "passed", r->passed);
    rt_doc_add_u64(o, "filtered", r->filtered);
    rt_doc_add_u64(o, "failed", r->failed);
    if (!full)
        return;
    rt_doc_add_u64(o, "failed_exception", r->failed_exception);
    rt_doc_add_u64(o, "failed_budget", r->failed_budget);
    rt_doc_add_u64(o, "failed_memory", r->failed_memory);
    rt_doc_add_u64(o, "rows_out", r->rows_out);
    rt_doc_add_str(o, "last_error", r->last_error);
}

static const rt_rule_info_t *find_rule(rt_admin_cmd_t *c, const rt_rule_info_t *rules, size_t n,
                                       const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rules[i].name, name) == 0)
            return &rules[i];
    rt__admin_fail(c, 404, "no rule named \"%s\" (rtctl rules list)", name);
    return NULL;
}

/* `rules list`, `rules metrics [NAME]` and `rules show NAME`. */
/* A rule's counts summed over the cluster's nodes up, as their last heartbeats said. */
static void add_cluster_counts(rt_doc_t *o, const char *rule)
{
    rt_cluster_node_t *nodes = calloc(RT_CLUSTER_NODES_MAX, sizeof(*nodes));
    size_t n = nodes ? rt_cluster_nodes(nodes, RT_CLUSTER_NODES_MAX) : 0;
    rt_cluster_rule_count_t sum = {0};
    for (size_t i = 0; i < n; i++)
        for (unsigned k = 0; nodes[i].up && k < nodes[i].nrules; k++)
            if (strcmp(nodes[i].rules[k].name, rule) == 0) {
                sum.matched += nodes[i].rules[k].matched;
                sum.passed += nodes[i].rules[k].passed;
                sum.failed += nodes[i].rules[k].failed;
                sum.rows_out += nodes[i].rules[k].rows_out;
            }
    rt_doc_add_u64(o, "cluster_matched", sum.matched);
    rt_doc_add_u64(o, "cluster_passed", sum.passed);
    rt_doc_add_u64(o, "cluster_failed", sum.failed);
    rt_doc_add_u64(o, "cluster_rows_out", sum.rows_out);
    free(nodes);
}

static int rules_table(rt_admin_cmd_t *c, bool metrics_only)
{
    rt_rules_stats_t st;
    if (rt_rules_stats(&st) != 0)
        return rt__admin_fail(c, 503, "the rule engine is not running");
    size_t n;
    rt_rule_info_t *rules = rules_snapshot(c, &n);
    if (!rules)
        return c->code;
    const char *name = word_at(c, 2);
    const rt_rule_info_t *one = name ? find_rule(c, rules, n, name) : NULL;
    if (name && !one) {
        free(rules);
        return c->code;
    }
    if (one && !metrics_only) {
        c->doc = rt_doc_object();
        rule_doc(c->doc, one, true);
    } else {
        c->doc = rt_doc_array();
        for (size_t i = 0; i < n; i++) {
            if (one && one != &rules[i])
                continue;
            rt_doc_t *o = rt_doc_add_object(c->doc, NULL);
            if (!metrics_only) {
                rule_doc(o, &rules[i], false);
                continue;
            }
            rt_doc_add_str(o, "name", rules[i].name);
            rt_doc_add_u64(o, "matched", rules[i].matched);
            rt_doc_add_u64(o, "passed", rules[i].passed);
            rt_doc_add_u64(o, "filtered", rules[i].filtered);
            rt_doc_add_u64(o, "failed", rules[i].failed);
            rt_doc_add_u64(o, "exception", rules[i].failed_exception);
            rt_doc_add_u64(o, "budget", rules[i].failed_budget);
            rt_doc_add_u64(o, "memory", rules[i].failed_memory);
            rt_doc_add_u64(o, "rows_out", rules[i].rows_out);
            if (rt_cluster_on())
                add_cluster_counts(o, rules[i].name);
        }
    }
    free(rules);
    return 200;
}

static int cmd_rules_list(rt_admin_cmd_t *c)
{
    return rules_table(c, false);
}
static int cmd_rules_metrics(rt_admin_cmd_t *c)
{
    return rules_table(c, true);
}

static int cmd_rules_show(rt_admin_cmd_t *c)
{
    if (!word_at(c, 2))
        return rt__admin_fail(c, 400, "usage: rules show NAME");
    return rules_table(c, false);
}

static int cmd_rules_reload(rt_admin_cmd_t *c)
{
    char err[RT_ADMIN_ERR_MAX];
    if (rt_admin_reload_rules(err, sizeof(err)) != 0)
        return rt__admin_fail(c, 409, "rules not reloaded, the running set is unchanged: %s", err);
    rt_rules_stats_t st = {0};
    rt_rules_stats(&st);
    if (!c->json) {
        rt_buf_printf(&c->text, "rules reloaded: version %llu, %u rule%s\n",
                      (unsigned long long)st.version, st.rules, st.rules == 1 ? "" : "s");
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_bool(c->doc, "reloaded", true);
    rt_doc_add_u64(c->doc, "version", st.version);
    rt_doc_add_u64(c->doc, "rules", st.rules);
    return 200;
}

static int rules_switch(rt_admin_cmd_t *c, bool on)
{
    const char *name = word_at(c, 2);
    if (!name)
        return rt__admin_fail(c, 400, "usage: rules %s NAME", on ? "enable" : "disable");
    int rc = rt_rules_enable(name, on);
    if (rc == RT_ENOTFOUND)
        return rt__admin_fail(c, 404, "no rule named \"%s\" (rtctl rules list)", name);
    if (rc == RT_EINVAL)
        return rt__admin_fail(c, 409, "rule \"%s\" names a sink that is not running", name);
    if (rc)
        return rt__admin_fail(c, 503, "the rule engine is not running");
    rt_log(RT_LOG_INFO, on ? "rules.enabled" : "rules.disabled", "rule=%s", name);
    if (!c->json) {
        rt_buf_printf(&c->text, "rule %s %s\n", name, on ? "enabled" : "disabled");
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_str(c->doc, "rule", name);
    rt_doc_add_bool(c->doc, "enabled", on);
    return 200;
}

static int cmd_rules_enable(rt_admin_cmd_t *c)
{
    return rules_switch(c, true);
}
static int cmd_rules_disable(rt_admin_cmd_t *c)
{
    return rules_switch(c, false);
}

static int cmd_rules_test(rt_admin_cmd_t *c)
{
    const char *name = word_at(c, 2);
    size_t topic_len = 0, payload_len = 0;
    const char *topic = rt__admin_opt(c, "topic", &topic_len);
    const char *payload = rt__admin_opt(c, "payload", &payload_len);
    const char *event = rt__admin_opt(c, "event", NULL);
    long qos;
    if (!name || (!topic && !event) || (event && !rt_rule_event_kind(event)))
        return rt__admin_fail(c, 400,
                              "usage: rules test NAME --topic T [--payload P] [--qos 0|1|2], or "
                              "rules test NAME --event E [--from JID --to JID --type T "
                              "--payload P] (E: client.connected, xmpp.message, ...)");
    if (rt__admin_opt_long(c, "qos", 0, 0, 2, &qos))
        return c->code;
    if (!payload)
        payload = "";
    char *json = NULL;
    char err[RT_ADMIN_ERR_MAX];
    int rc;
    if (event) {
        /* An event as a client's session would raise it (XMPP's are made to look real). */
        bool xmpp = strncmp(event, "xmpp.", 5) == 0;
        const char *from = rt__admin_opt(c, "from", NULL);
        rt_rule_input_t in = {.event = event,
                              .payload = (const uint8_t *)payload,
                              .payload_len = payload_len,
                              .qos = -1,
                              .retain = -1,
                              .clientid = from ? from : "rt_rules_test",
                              .peer = "127.0.0.1:0",
                              .reason_code = -1,
                              .proto_ver = -1,
                              .keepalive = -1,
                              .clean_start = -1,
                              .ts_ms = rt_wall_ms(),
                              .protocol = xmpp ? "xmpp" : NULL,
                              .from = from,
                              .to = rt__admin_opt(c, "to", NULL),
                              .type = rt__admin_opt(c, "type", NULL)};
        rc = rt_rules_test_input(name, &in, &json, err, sizeof(err));
    } else {
        rc = rt_rules_test(name, topic, payload, payload_len, (int)qos, &json, err, sizeof(err));
    }
    if (rc == RT_ENOTFOUND)
        return rt__admin_fail(c, 404, "no rule named \"%s\" (rtctl rules list)", name);
    if (rc == RT_ESHUTDOWN)
        return rt__admin_fail(c, 503, "the rule engine is not running");
    if (rc)
        return rt__admin_fail(c, 409, "rule %s failed on this message: %s", name, err);
    if (need_object(c)) {
        free(json);
        return c->code;
    }
    rt_doc_add_str(c->doc, "rule", name);
    rt_doc_add_str(c->doc, event ? "event" : "topic", event ? event : topic);
    rt_doc_add_json(c->doc, "rows", json);
    free(json);
    return 200;
}

/* ---- sinks ---- */

static void sink_doc(rt_doc_t *o, const rt_sink_info_t *s, bool full)
{
    rt_doc_add_str(o, "name", s->name);
    rt_doc_add_str(o, "type", s->type);
    rt_doc_add_str(o, "state", s->state);
    rt_doc_add_u64(o, "in", s->in);
    rt_doc_add_u64(o, "written", s->written);
    rt_doc_add_u64(o, "queued", s->queued);
    rt_doc_add_u64(o, "inflight", s->inflight);
    rt_doc_add_u64(o, "spilled", s->spilled);
    rt_doc_add_u64(o, "dropped", s->dropped);
    rt_doc_add_u64(o, "failed", s->failed);
    if (!full)
        return;
    rt_doc_add_u64(o, "retried", s->retried);
    rt_doc_add_u64(o, "recovered", s->recovered);
    rt_doc_add_u64(o, "batches", s->batches);
    rt_doc_add_bytes(o, "bytes", (int64_t)s->bytes);
    rt_doc_add_u64(o, "expired", s->expired);
    rt_doc_add_str(o, "retention", s->retention);
    rt_doc_add_str(o, "last_error", s->last_error);
}

/* A section's value of key (NULL: none). */
static const rt_conf_kv_t *section_kv(const rt_conf_section_t *sec, const char *key)
{
    for (unsigned k = 0; k < sec->nkeys; k++)
        if (strcmp(sec->keys[k].key, key) == 0)
            return &sec->keys[k];
    return NULL;
}

/*
** The sinks rtd.conf declares but does not start (enabled = false), as sink rows with no
** counts: into out (max), their number. rtd checked them at start like the others.
*/
static size_t disabled_sinks(rt_sink_info_t *out, size_t max)
{
    const rt_conf_sections_t *all = &rt__admin_conf()->sinks;
    size_t n = 0;
    for (unsigned i = 0; i < all->n && n < max; i++) {
        const rt_conf_kv_t *en = section_kv(&all->s[i], "enabled");
        const rt_conf_kv_t *type = section_kv(&all->s[i], "type");
        if (!en || en->type != RT_CONF_V_BOOL || en->b)
            continue;
        memset(&out[n], 0, sizeof(out[n]));
        snprintf(out[n].name, sizeof(out[n].name), "%s", all->s[i].name);
        out[n].type = type ? type->str : "";
        out[n].state = "disabled";
        n++;
    }
    return n;
}

static int sinks_cmd(rt_admin_cmd_t *c, const char *name)
{
    rt_sink_info_t sinks[SINKS_MAX];
    size_t n = rt_sinks_snapshot(sinks, SINKS_MAX);
    if (n > SINKS_MAX)
        n = SINKS_MAX;
    size_t running = n;
    n += disabled_sinks(sinks + n, SINKS_MAX - n);
    if (name) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(sinks[i].name, name) != 0)
                continue;
            if (need_object(c))
                return c->code;
            if (i < running) {
                sink_doc(c->doc, &sinks[i], true);
                return 200;
            }
            rt_doc_add_str(c->doc, "name", sinks[i].name);
            rt_doc_add_str(c->doc, "type", sinks[i].type);
            rt_doc_add_str(c->doc, "state", "disabled");
            rt_doc_add_str(c->doc, "note", "enabled = false in rtd.conf: checked when rtd "
                                           "started, not started (enabled = true and a "
                                           "restart run it)");
            return 200;
        }
        return rt__admin_fail(c, 404, "no sink named \"%s\" (rtctl sinks list)", name);
    }
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    for (size_t i = 0; i < n; i++)
        sink_doc(rt_doc_add_object(c->doc, NULL), &sinks[i], false);
    return 200;
}

static int cmd_sinks_list(rt_admin_cmd_t *c)
{
    return sinks_cmd(c, NULL);
}

static int cmd_sinks_show(rt_admin_cmd_t *c)
{
    if (!word_at(c, 2))
        return rt__admin_fail(c, 400, "usage: sinks show NAME");
    return sinks_cmd(c, word_at(c, 2));
}

/* ---- log, auth ---- */

static int cmd_log_level(rt_admin_cmd_t *c)
{
    const char *name = word_at(c, 2);
    rt_log_level_t level;
    if (name) {
        char err[RT_ADMIN_ERR_MAX];
        if (rt_log_parse_level(name, &level) != 0)
            return rt__admin_fail(c, 400, "log level must be error, warning, info or debug");
        if (rt__admin_conf_set("log_level", name, err, sizeof(err)) != 200)
            return rt__admin_fail(c, 500, "%s", err);
    }
    if (!c->json) {
        rt_buf_printf(&c->text, "log level %s\n", rt_log_level_name(rt_log_get_level()));
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_str(c->doc, "level", rt_log_level_name(rt_log_get_level()));
    return 200;
}

static int cmd_auth_reload(rt_admin_cmd_t *c)
{
    char err[RT_ADMIN_ERR_MAX];
    if (rt_admin_reload_auth(err, sizeof(err)) != 0)
        return rt__admin_fail(c, 409, "not reloaded, the old files stay in force: %s", err);
    const rt_conf_t *conf = rt__admin_conf();
    if (need_object(c))
        return c->code;
    rt_doc_add_bool(c->doc, "reloaded", true);
    rt_doc_add_str(c->doc, "password_file", conf->password_file);
    rt_doc_add_str(c->doc, "acl_file", conf->acl_file);
    return 200;
}

/* ---- config ---- */

static void add_setting(const rt_conf_value_t *v, void *ud)
{
    rt_doc_t *o = rt_doc_add_object(ud, NULL);
    rt_doc_add_str(o, "setting", v->name);
    rt_doc_add_str(o, "value", v->value);
    rt_doc_add_str(o, "default", v->dflt);
    rt_doc_add_str(o, "from", v->from);
    const char *applies;
    rt_doc_add_str(o, "unit", v->setting->unit ? v->setting->unit : "");
    rt_doc_add_str(o, "changes", rt__admin_conf_live(v->name, &applies) ? "live" : "restart");
    rt_doc_add_str(o, "about", v->setting->doc);
    rt_doc_add_str(o, "a_change_applies_to", applies);
}

static int cmd_config_show(rt_admin_cmd_t *c)
{
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    rt__admin_conf_each(add_setting, c->doc);
    return 200;
}

static int cmd_config_set(rt_admin_cmd_t *c)
{
    if (c->argc != 4)
        return rt__admin_fail(c, 400, "usage: config set SETTING VALUE");
    char err[RT_ADMIN_ERR_MAX];
    int code = rt__admin_conf_set(c->argv[2], c->argv[3], err, sizeof(err));
    if (code != 200)
        return rt__admin_fail(c, code, "%s", err);
    if (!c->json) {
        rt_buf_printf(&c->text, "%s = %s (in force now)\n", c->argv[2], c->argv[3]);
        return 200;
    }
    if (need_object(c))
        return c->code;
    rt_doc_add_str(c->doc, "setting", c->argv[2]);
    rt_doc_add_str(c->doc, "value", c->argv[3]);
    rt_doc_add_bool(c->doc, "applied", true);
    return 200;
}

/*
** The commands: words, function, flags, usage (`help`), and what they do (`COMMAND --help`).
** An entry without a usage is an alias (a word alone that lists), described by its command.
*/
const rt_admin_command_t rt__admin_commands[] = {
    {"help", NULL, rt__admin_help, 0, "help [COMMAND]",
     "Lists the commands, or describes one (the same as COMMAND --help)."},
    {"status", NULL, cmd_status, 0, "status",
     "Says rtd is running: version, pid, uptime, the HTTP listener and traces on."},
    {"broker", NULL, cmd_broker, 0, "broker",
     "rtd's version, description, uptime, start time and clock."},
    {"broker", "stats", cmd_broker_stats, 0, "broker stats",
     "Connections, sessions, topics, subscriptions and retained messages (and their bytes): "
     "now and the most since start."},
    {"broker", "metrics", cmd_broker_metrics, 0, "broker metrics",
     "MQTT packets in and out by type, bytes, messages in, out, dropped and expired, and the "
     "packets tolerated."},
    {"listeners", NULL, cmd_listeners, 0, "listeners",
     "Each MQTT and XMPP listener: address, protocol, transport, state, connections, and those "
     "refused by reason."},
    {"cluster", "status", rt__admin_cluster_status, RT_ADMIN_BLOCKING, "cluster status",
     "The cluster as this node sees it: NATS, nodes, forwarding, retained messages, client "
     "ids and moved sessions (docs/CLUSTER.md)."},
    {"cluster", "nodes", rt__admin_cluster_nodes, 0, "cluster nodes",
     "Every node heard from, as its last heartbeat said."},
    {"cluster", "rules", rt__admin_cluster_rules, 0, "cluster rules",
     "Each node's counts for each rule, as its last heartbeat said."},
    {"cluster", "client", rt__admin_cluster_client, RT_ADMIN_BLOCKING,
     "cluster client CLIENT_ID [--command \"subscriptions show\"]",
     "Which node holds the client id, and that node's `clients show` of it (or the command "
     "--command names)."},
    {"cluster", NULL, rt__admin_cluster_status, RT_ADMIN_BLOCKING, NULL, NULL},
    {"vm", NULL, cmd_vm, RT_ADMIN_BLOCKING, "vm",
     "Memory (RSS told apart by kind), schedulers, actors and open files."},
    {"metrics", "prometheus", rt__admin_metrics_prometheus, RT_ADMIN_BLOCKING, "metrics prometheus",
     "Every figure in the Prometheus text format, as GET /metrics answers (text only)."},
    {"clients", "list", rt__admin_clients_list, RT_ADMIN_GATHER,
     "clients list [--limit N] [--prefix P] [--after ID]",
     "Connected and offline sessions. --after ID (\"\": the first page) and --prefix P page "
     "through ids in byte order, N at a time."},
    {"clients", NULL, rt__admin_clients_list, RT_ADMIN_GATHER, NULL, NULL},
    {"clients", "show", rt__admin_clients_show, RT_ADMIN_GATHER | RT_ADMIN_HOLDER,
     "clients show CLIENT_ID",
     "One client: its connection, session, windows, queue and subscriptions."},
    {"clients", "kick", rt__admin_clients_kick, RT_ADMIN_CHANGES, "clients kick CLIENT_ID",
     "Disconnects the client (MQTT 5 reason 0x98), ends its session and publishes its will."},
    {"subscriptions", "list", rt__admin_subscriptions, RT_ADMIN_GATHER,
     "subscriptions list [--limit N]", "Every subscription: client id, filter, QoS, options."},
    {"subscriptions", NULL, rt__admin_subscriptions, RT_ADMIN_GATHER, NULL, NULL},
    {"subscriptions", "show", rt__admin_subscriptions, RT_ADMIN_GATHER | RT_ADMIN_HOLDER,
     "subscriptions show CLIENT_ID", "One client's subscriptions."},
    {"topics", NULL, rt__admin_topics, RT_ADMIN_GATHER, "topics [--limit N]",
     "The filters subscribed to, with their subscriber counts."},
    {"retained", "list", rt__admin_retained_list, RT_ADMIN_BLOCKING,
     "retained list [--filter F] [--limit N] [--after TOPIC]",
     "Retained messages whose topics F matches (an MQTT filter, # by default), N at a time "
     "(100; at most 1000) in topic byte order, after TOPIC."},
    {"retained", NULL, rt__admin_retained_list, RT_ADMIN_BLOCKING, NULL, NULL},
    {"retained", "show", rt__admin_retained_show, 0, "retained show TOPIC",
     "One topic's retained message: QoS, publisher, expiry, payload (as text when it is "
     "UTF-8, else in hex)."},
    {"retained", "delete", rt__admin_retained_delete, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "retained delete TOPIC",
     "Deletes one topic's retained message (here, on disk and, in a cluster, on every node), "
     "delivering nothing to subscribers."},
    {"banned", "list", rt__admin_banned_list, RT_ADMIN_BLOCKING, "banned list [--limit N]",
     "Banned client ids, user names and address ranges, with who banned them, why and until "
     "when (flapping detection's bans among them)."},
    {"banned", NULL, rt__admin_banned_list, RT_ADMIN_BLOCKING, NULL, NULL},
    {"banned", "add", rt__admin_banned_add, RT_ADMIN_CHANGES,
     "banned add KIND VALUE [--duration SECONDS] [--reason TEXT]",
     "Refuses CONNECTs from now on (MQTT 5 reason 0x8A, 3.1.1 code 5) by KIND clientid, "
     "username or address (an address or range: 10.0.0.0/8); for SECONDS, or until deleted. "
     "Open connections stay."},
    {"banned", "del", rt__admin_banned_del, RT_ADMIN_CHANGES, "banned del KIND VALUE",
     "Deletes a ban (KIND clientid, username or address)."},
    {"delayed", "list", rt__admin_delayed_list, RT_ADMIN_BLOCKING, "delayed list [--limit N]",
     "Messages published to $delayed/SECONDS/topic and held until due, earliest first: id, "
     "topic, when due, QoS, size and publisher."},
    {"delayed", NULL, rt__admin_delayed_list, RT_ADMIN_BLOCKING, NULL, NULL},
    {"delayed", "del", rt__admin_delayed_del, RT_ADMIN_CHANGES, "delayed del ID",
     "Deletes a held delayed message (here and in state.db); it is never published."},
    {"bridges", "list", rt__admin_bridges_list, 0, "bridges list",
     "Bridges to other brokers: remote, state, messages queued and in flight, sent, "
     "acknowledged, received and dropped, and the last error."},
    {"bridges", NULL, rt__admin_bridges_list, 0, NULL, NULL},
    {"tenants", "list", rt__admin_tenants_list, 0, "tenants list",
     "Tenants with a session now (their mountpoints): connections, subscriptions, retained "
     "bytes, messages in and out, refusals by their quotas, and the quotas in force."},
    {"tenants", NULL, rt__admin_tenants_list, 0, NULL, NULL},
    {"bridges", "show", rt__admin_bridges_show, 0, "bridges show NAME",
     "One bridge whole: its maps, version, QoS, connects and failures besides list's."},
    {"bridges", "restart", rt__admin_bridges_restart, RT_ADMIN_CHANGES, "bridges restart NAME",
     "Drops the bridge's connection and connects again at once; its queue is kept and what "
     "was in flight is sent again."},
    {"actors", NULL, rt__admin_actors_list, RT_ADMIN_BLOCKING, NULL, NULL},
    {"actors", "list", rt__admin_actors_list, RT_ADMIN_BLOCKING,
     "actors list [--limit N] [--sort KEY]",
     "Actors with their state, reductions, mailbox, memory and CPU; KEY as top's."},
    {"actors", "info", rt__admin_actors_info, 0, "actors info PID",
     "Every counter of one actor (PID as <slot.gen> or its number)."},
    {"actors", "kill", rt__admin_actors_kill, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "actors kill PID [REASON]",
     "Sends an exit signal, as Erlang's exit(Pid, Reason): kill (the default) cannot be "
     "trapped."},
    {"tree", NULL, rt__admin_tree, RT_ADMIN_BLOCKING, "tree",
     "The supervision tree: supervisors, children, restarts and last exits."},
    {"rules", NULL, cmd_rules_list, 0, NULL, NULL},
    {"rules", "list", cmd_rules_list, 0, "rules list", "The rule set, with each rule's counts."},
    {"rules", "show", cmd_rules_show, 0, "rules show NAME",
     "One rule: its filters, sinks, state, counts and last error."},
    {"rules", "metrics", cmd_rules_metrics, 0, "rules metrics [NAME]",
     "Each rule's counts (in a cluster, summed over the nodes too)."},
    {"rules", "reload", cmd_rules_reload, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES, "rules reload",
     "Loads, checks and swaps in the whole rule set, as SIGHUP does; a bad file keeps the set "
     "running."},
    {"rules", "enable", cmd_rules_enable, RT_ADMIN_CHANGES, "rules enable NAME",
     "Switches a rule on (kept over reloads until its file changes `enabled`)."},
    {"rules", "disable", cmd_rules_disable, RT_ADMIN_CHANGES, "rules disable NAME",
     "Switches a rule off (kept over reloads until its file changes `enabled`)."},
    /* Admin only: whoever runs it runs a payload of theirs through the rules, for up to
       rule_call_ms (a read key of the HTTP API must not). */
    {"rules", "test", cmd_rules_test, RT_ADMIN_BLOCKING | RT_ADMIN_OWN_WORKER | RT_ADMIN_SENSITIVE,
     "rules test NAME --topic T [--payload P] [--qos Q] | --event E [--from J --to J --type T]",
     "The rows the rule would make of this message; nothing is written."},
    {"sinks", NULL, cmd_sinks_list, 0, NULL, NULL},
    {"sinks", "list", cmd_sinks_list, 0, "sinks list",
     "Every sink in rtd.conf: state (disabled ones too) and counts."},
    {"sinks", "show", cmd_sinks_show, 0, "sinks show NAME",
     "One sink: state, counts, retries, batches and last error."},
    {"log", NULL, cmd_log_level, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES, NULL, NULL},
    {"log", "level", cmd_log_level, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "log level [error|warning|info|debug]", "Shows or sets the log level."},
    {"config", "show", cmd_config_show, 0, "config show",
     "Every setting, its value, and whether a change applies live or needs a restart."},
    {"config", NULL, cmd_config_show, 0, NULL, NULL},
    {"config", "set", cmd_config_set, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "config set SETTING VALUE",
     "Changes a live setting now (VALUE as in rtd.conf); not written back to the file."},
    {"auth", "reload", cmd_auth_reload, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES, "auth reload",
     "Reads the password and ACL files again, as SIGHUP does; a bad file keeps the old one."},
    {"tls", "reload", cmd_tls_reload, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES, "tls reload",
     "Reads the TLS certificates, keys, CAs and CRLs again, as SIGHUP does."},
    /* The key list is for the admin role: a read key learns nothing of the others. */
    {"apikey", "list", rt__admin_apikey_list, RT_ADMIN_SENSITIVE, "apikey list",
     "The HTTP API's keys: name, role, created, last used (since rtd started); never a key."},
    {"apikey", NULL, rt__admin_apikey_list, RT_ADMIN_SENSITIVE, NULL, NULL},
    {"apikey", "add", rt__admin_apikey_add, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "apikey add NAME ROLE",
     "Makes a key with ROLE (read or admin), prints it once and keeps its SHA-256 in "
     "http.api_keys_file; it works at once."},
    {"apikey", "revoke", rt__admin_apikey_revoke, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "apikey revoke NAME", "Removes the key from http.api_keys_file; it stops working at once."},
    {"apikey", "reload", rt__admin_apikey_reload, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "apikey reload",
     "Reads http.api_keys_file again, as SIGHUP does; a bad file keeps the keys in force."},
    /* Whole files read and written: on the second worker, as `rules test`, so that a scrape
       waits for neither; it writes where rtd may, so admin only. */
    {"backup", NULL, rt__admin_backup,
     RT_ADMIN_BLOCKING | RT_ADMIN_OWN_WORKER | RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE, "backup DIR",
     "Copies state.db, every running sink's database and spill and every bridge's spill into "
     "DIR (a data_dir to restore from), while rtd runs."},
    /* Account names are for the admin role; add, passwd and del change them. All read or
       write xmpp.db, and add and passwd run PBKDF2 (milliseconds). */
    {"xmpp", "user list", rt__admin_xmpp_user, RT_ADMIN_BLOCKING | RT_ADMIN_SENSITIVE,
     "xmpp user list [HOST]", "The XMPP accounts in data_dir/xmpp.db, of HOST or of all."},
    {"xmpp", "user add", rt__admin_xmpp_user, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "xmpp user add USER@HOST [--password P]",
     "Makes an XMPP account; only its SCRAM keys are kept (rtctl asks for the password twice "
     "when --password is not given)."},
    {"xmpp", "user passwd", rt__admin_xmpp_user, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "xmpp user passwd USER@HOST [--password P]",
     "Gives an XMPP account a new password (new salts and keys)."},
    {"xmpp", "user del", rt__admin_xmpp_user, RT_ADMIN_BLOCKING | RT_ADMIN_CHANGES,
     "xmpp user del USER@HOST", "Deletes an XMPP account."},
    /* The sessions are asked as the MQTT clients are (gathering), which the read role may;
       kick is the admin's. The roster is read from xmpp.db, on the worker. */
    {"xmpp", "sessions", rt__admin_xmpp_sessions, RT_ADMIN_GATHER,
     "xmpp sessions [HOST] [--limit N]",
     "The bound XMPP sessions (of HOST's users, or all), by JID: pid, presence, priority, peer "
     "and memory; the first N JIDs (10000) in byte order."},
    {"xmpp", "show", rt__admin_xmpp_show, RT_ADMIN_GATHER, "xmpp show JID",
     "A session (USER@HOST/RESOURCE) or each of an account's (USER@HOST): as `xmpp sessions`, "
     "with its listener, TLS, stream id, roster held, mailbox and memory by part."},
    {"xmpp", "kick", rt__admin_xmpp_kick, RT_ADMIN_CHANGES, "xmpp kick JID",
     "Ends the session (USER@HOST/RESOURCE) or all of the account's (USER@HOST) with a "
     "policy-violation stream error; says how many."},
    {"xmpp", "servers", rt__admin_xmpp_servers, 0, "xmpp servers",
     "The server-to-server streams (federation), each way: domains, state, TLS, how the other "
     "server proved itself (dialback, external), peer address, age; held bytes (out)."},
    {"xmpp", "roster", rt__admin_xmpp_roster, RT_ADMIN_BLOCKING, "xmpp roster USER@HOST",
     "The account's stored roster: contact, name, groups, subscription (none, to, from, both), "
     "ask, pending in, pre-approved."},
    {"trace", "client", rt__admin_trace, RT_ADMIN_SENSITIVE,
     "trace client CLIENT_ID|JID [--duration S] [--payload N]",
     "The client's packets (an XMPP session's stanzas, by full or bare JID) as they pass, for "
     "S seconds (60), with N payload bytes each."},
    {"trace", "topic", rt__admin_trace, RT_ADMIN_SENSITIVE,
     "trace topic FILTER [--duration S] [--payload N]",
     "The PUBLISH packets on the topics FILTER matches, from every client, for S seconds."},
    {"top", NULL, rt__admin_top, RT_ADMIN_BLOCKING,
     "top [-n N] [--sort reductions|reductions_total|memory|mailbox|cpu|cpu_total|gc_pause] "
     "[--width W] [--height H]",
     "One `rtctl top` screen: the node panel over the N busiest actors by the sort."},
    {NULL, NULL, NULL, 0, NULL, NULL},
};

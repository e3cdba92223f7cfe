/*
** rtd's figures in the Prometheus text exposition format, version 0.0.4 (docs/HTTP.md,
** "Metrics"): for `rtctl metrics prometheus` now and for the HTTP listener's GET /metrics.
** It reads the sources the other admin commands read (broker stats and metrics, listeners,
** rules, sinks, the runtime's snapshots, memory by kind) and adds no counter of its own.
**
** The format wants every sample of a metric together, under its # HELP and # TYPE lines, so
** each per-listener, per-rule or per-sink metric is one loop over the things it labels.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "acl.h"
#include "admin_impl.h"
#include "banned.h"
#include "delayed.h"
#include "exclusive.h"
#include "c2s.h"
#include "cluster.h"
#include "conn.h"
#include "rule_engine.h"
#include "sink.h"
#include "bridge.h"
#include "tenant.h"
#include "tls.h"

#define LISTENERS_MAX RT_CONF_ALL_LISTENERS
#define RULES_MAX 1024
#define SINKS_MAX 64
#define SCHEDS_MAX 256
#define CERTS_MAX (RT_TLS_SERVERS * (1 + RT_CONF_MAX_SNI))

/* What one scrape reads, gathered before anything is written. */
typedef struct {
    rt_broker_counts_t counts;
    rt_broker_metrics_t metrics;
    rt_listener_info_t listeners[LISTENERS_MAX];
    size_t nlisteners;
    rt_rule_info_t *rules; /* RULES_MAX of them, malloc'd */
    size_t nrules;
    bool rules_running;
    rt_rules_stats_t rules_stats;
    rt_sink_info_t sinks[SINKS_MAX];
    size_t nsinks;
    rt_bridge_info_t bridges[RT_CONF_MAX_BRIDGES];
    size_t nbridges;
    rt_sched_info_t scheds[SCHEDS_MAX];
    size_t nscheds;
    double util[SCHEDS_MAX];
    size_t nutil;
    rt_stats_t rs;
    rt_admin_kinds_t kinds;
    rt_hist_snap_t gc_pauses, delivery;
    rt_acl_stats_t acl;
    rt_tls_cert_t certs[CERTS_MAX];
    size_t ncerts;
} scrape_t;

/* ---- The format ---- */

/*
** A label value as the format quotes it: backslash, double quote and newline escaped.
** Everything else, UTF-8 included, goes as it is.
*/
static void add_escaped(rt_buf_t *b, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            rt_buf_add(b, "\\\\", 2);
        else if (*p == '"')
            rt_buf_add(b, "\\\"", 2);
        else if (*p == '\n')
            rt_buf_add(b, "\\n", 2);
        else
            rt_buf_add(b, p, 1);
    }
}

static void family(rt_buf_t *b, const char *name, const char *type, const char *help)
{
    rt_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
** Starts a sample: the name and, when key is not NULL, labels from the pairs that follow
** (key, value, ..., NULL). The caller writes the value and the newline.
*/
static void sample_start(rt_buf_t *b, const char *name, const char *key, va_list ap)
{
    rt_buf_printf(b, "%s", name);
    if (!key)
        return;
    rt_buf_add(b, "{", 1);
    for (bool first = true; key; key = va_arg(ap, const char *), first = false) {
        rt_buf_printf(b, "%s%s=\"", first ? "" : ",", key);
        add_escaped(b, va_arg(ap, const char *));
        rt_buf_add(b, "\"", 1);
    }
    rt_buf_add(b, "}", 1);
}

static void u64(rt_buf_t *b, const char *name, uint64_t v, const char *key, ...)
{
    va_list ap;
    va_start(ap, key);
    sample_start(b, name, key, ap);
    va_end(ap);
    rt_buf_printf(b, " %llu\n", (unsigned long long)v);
}

static void i64(rt_buf_t *b, const char *name, int64_t v, const char *key, ...)
{
    va_list ap;
    va_start(ap, key);
    sample_start(b, name, key, ap);
    va_end(ap);
    rt_buf_printf(b, " %lld\n", (long long)v);
}

static void dbl(rt_buf_t *b, const char *name, double v, const char *key, ...)
{
    va_list ap;
    va_start(ap, key);
    sample_start(b, name, key, ap);
    va_end(ap);
    rt_buf_printf(b, " %.15g\n", v);
}

/* A metric with one unlabelled sample. */
static void one_u64(rt_buf_t *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    u64(b, name, v, NULL);
}

/* Label pairs (key, value; n pairs) inside a sample's braces. */
static void pairs(rt_buf_t *b, const char *const *kv, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rt_buf_printf(b, "%s%s=\"", i ? "," : "", kv[2 * i]);
        add_escaped(b, kv[2 * i + 1]);
        rt_buf_add(b, "\"", 1);
    }
}

/*
** A histogram's samples under the family the caller wrote: the cumulative buckets by their
** le bounds in seconds (+Inf holds the count), then _sum and _count; kv holds n label pairs.
*/
static void histogram(rt_buf_t *b, const char *name, const rt_hist_snap_t *h, const char *const *kv,
                      size_t n)
{
    for (unsigned i = 0; i <= RT_HIST_BOUNDS; i++) {
        rt_buf_printf(b, "%s_bucket{", name);
        pairs(b, kv, n);
        if (i < RT_HIST_BOUNDS)
            rt_buf_printf(b, "%sle=\"%.9g\"} %llu\n", n ? "," : "",
                          (double)rt_hist_bounds_ns[i] / 1e9, (unsigned long long)h->le[i]);
        else
            rt_buf_printf(b, "%sle=\"+Inf\"} %llu\n", n ? "," : "", (unsigned long long)h->le[i]);
    }
    static const char *const part[2] = {"sum", "count"};
    for (int p = 0; p < 2; p++) {
        rt_buf_printf(b, "%s_%s%s", name, part[p], n ? "{" : "");
        pairs(b, kv, n);
        if (p == 0)
            rt_buf_printf(b, "%s %.9g\n", n ? "}" : "", (double)h->sum_ns / 1e9);
        else
            rt_buf_printf(b, "%s %llu\n", n ? "}" : "", (unsigned long long)h->le[RT_HIST_BOUNDS]);
    }
}

static uint64_t load(const atomic_uint_fast64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* ---- Sections ---- */

static void process_section(rt_buf_t *b)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    family(b, "process_cpu_seconds_total", "counter", "User and system CPU time rtd spent.");
    dbl(b, "process_cpu_seconds_total",
        (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
        NULL);
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur != RLIM_INFINITY)
        one_u64(b, "process_max_fds", "gauge", "The open-file limit (RLIMIT_NOFILE, soft).",
                (uint64_t)rl.rlim_cur);
    uint64_t up = rt__admin_uptime_ms();
    family(b, "process_start_time_seconds", "gauge", "When rtd started, in seconds since 1970.");
    dbl(b, "process_start_time_seconds", (double)(rt_wall_ms() - up) / 1e3, NULL);
    family(b, "rt_build_info", "gauge",
           "Always 1; the version (and a cluster node's name) are labels.");
    if (rt_cluster_on())
        u64(b, "rt_build_info", 1, "version", rt__admin_version(), "node", rt_cluster_node(),
            NULL);
    else
        u64(b, "rt_build_info", 1, "version", rt__admin_version(), NULL);
}

/* A cluster node's traffic over NATS (docs/CLUSTER.md), each sample labelled with the node. */
static void cluster_section(rt_buf_t *b)
{
    rt_cluster_status_t st;
    if (!rt_cluster_status(&st))
        return;
    const char *n = st.node;
    family(b, "rt_cluster_nats_connected", "gauge", "1 while the node's NATS connection is up.");
    u64(b, "rt_cluster_nats_connected", strcmp(st.state, "connected") == 0, "node", n, NULL);
    family(b, "rt_cluster_routes", "gauge", "Filters the node holds NATS subscriptions for.");
    u64(b, "rt_cluster_routes", st.routes, "node", n, NULL);
    family(b, "rt_cluster_forwarded_total", "counter",
           "Messages published on NATS (out) and routed from other nodes (in).");
    u64(b, "rt_cluster_forwarded_total", st.forwarded_out, "node", n, "direction", "out", NULL);
    u64(b, "rt_cluster_forwarded_total", st.forwarded_in, "node", n, "direction", "in", NULL);
    family(b, "rt_cluster_duplicates_dropped_total", "counter",
           "Extra copies of a message a node received through overlapping filters.");
    u64(b, "rt_cluster_duplicates_dropped_total", st.duplicates, "node", n, NULL);
    family(b, "rt_cluster_lost_total", "counter",
           "Messages that did not cross: refused by NATS (forward), too long a subject, not an "
           "rtd node's (bad_in), dropped for a slow node (dropped_in).");
    u64(b, "rt_cluster_lost_total", st.forward_failed, "node", n, "reason", "forward", NULL);
    u64(b, "rt_cluster_lost_total", st.not_forwarded, "node", n, "reason", "too_long", NULL);
    u64(b, "rt_cluster_lost_total", st.bad_in, "node", n, "reason", "bad_in", NULL);
    u64(b, "rt_cluster_lost_total", st.dropped_in, "node", n, "reason", "dropped_in", NULL);
    family(b, "rt_cluster_inbound_backlog", "gauge", "Messages arrived from NATS, not routed yet.");
    u64(b, "rt_cluster_inbound_backlog", st.inbound_backlog, "node", n, NULL);
    family(b, "rt_cluster_reconnects_total", "counter", "NATS reconnections.");
    u64(b, "rt_cluster_reconnects_total", st.reconnects, "node", n, NULL);
}

static void broker_section(rt_buf_t *b, const scrape_t *s)
{
    const rt_broker_counts_t *n = &s->counts;
    const rt_broker_metrics_t *m = &s->metrics;
    const rt_broker_stats_t *st = &rt_broker->stats;

    one_u64(b, "rt_connections", "gauge", "Clients connected now (CONNACK sent).",
            n->connections.count);
    one_u64(b, "rt_connections_max", "gauge", "Most clients connected at once since start.",
            n->connections.max);
    one_u64(b, "rt_sockets", "gauge", "Connection actors alive: sockets, connected or not yet.",
            load(&st->sockets));
    one_u64(b, "rt_sessions", "gauge", "Sessions alive: connected plus offline.",
            n->sessions.count);
    one_u64(b, "rt_sessions_max", "gauge", "Most sessions alive at once since start.",
            n->sessions.max);
    one_u64(b, "rt_connects_total", "counter", "CONNECTs accepted (CONNACK 0).",
            load(&st->connects));
    one_u64(b, "rt_subscriptions", "gauge",
            "Subscriptions: ordinary ones plus shared-group memberships.", n->subscriptions.count);
    one_u64(b, "rt_subscribed_filters", "gauge",
            "Distinct subscribed filters; a $share group counts as one.", n->topics.count);
    one_u64(b, "rt_shared_groups", "gauge", "Shared subscription groups.", n->shared_groups);
    one_u64(b, "rt_retained_messages", "gauge", "Retained messages held.", n->retained.count);
    one_u64(b, "rt_retained_bytes", "gauge",
            "Bytes of the retained messages, as max_retained_bytes counts them.",
            n->retained_bytes.count);

    one_u64(b, "rt_messages_received_total", "counter", "PUBLISH packets received from clients.",
            m->msgs_in);
    one_u64(b, "rt_messages_sent_total", "counter", "PUBLISH packets sent to clients.",
            m->msgs_out);
    family(b, "rt_messages_dropped_total", "counter",
           "Messages not delivered to a session, by reason: queue_full (its queue was full, or "
           "QoS 0 to an offline session), expired (its expiry interval ran out first).");
    u64(b, "rt_messages_dropped_total", m->msgs_dropped, "reason", "queue_full", NULL);
    u64(b, "rt_messages_dropped_total", m->msgs_expired, "reason", "expired", NULL);
    one_u64(b, "rt_received_bytes_total", "counter", "Bytes read from client sockets.",
            m->bytes_in);
    one_u64(b, "rt_sent_bytes_total", "counter", "Bytes written (or buffered) to client sockets.",
            m->bytes_out);

    static const char *const dir_name[2] = {"rt_packets_received_total", "rt_packets_sent_total"};
    static const char *const dir_help[2] = {"MQTT packets received, by type.",
                                            "MQTT packets sent, by type."};
    for (int d = 0; d < 2; d++) {
        const uint64_t *v = d ? m->packets_out : m->packets_in;
        family(b, dir_name[d], "counter", dir_help[d]);
        for (unsigned t = 1; t < RT_MQTT_PACKET_TYPES; t++) {
            char type[16];
            snprintf(type, sizeof(type), "%s", rt_mqtt_packet_name(t));
            for (char *p = type; *p; p++)
                *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
            u64(b, dir_name[d], v[t], "type", type, NULL);
        }
    }

    one_u64(b, "rt_bad_packets_total", "counter", "Malformed packets and protocol errors.",
            load(&st->bad_packets));
    one_u64(b, "rt_tolerated_v31_subscribe_flags_total", "counter",
            "MQTT 3.1 (UN)SUBSCRIBEs with flags 0000, accepted though the spec refuses them.",
            load(&st->v31_sub_flags));
    family(b, "rt_limit_refusals_total", "counter",
           "Requests the broker's limits refused, by limit: topic (max_topic_levels/length), "
           "subscriptions (max_subscriptions), retained (the retained store's limits).");
    u64(b, "rt_limit_refusals_total", load(&st->topic_limit_hits), "limit", "topic", NULL);
    u64(b, "rt_limit_refusals_total", load(&st->subs_limit_hits), "limit", "subscriptions", NULL);
    u64(b, "rt_limit_refusals_total", load(&st->retained_limit_hits), "limit", "retained", NULL);
    /* Per listener these are not counted: a transport's state does not know its listener. */
    one_u64(b, "rt_tls_handshake_failures_total", "counter",
            "TLS handshakes that failed, all listeners.", load(&st->tls_failed));
    one_u64(b, "rt_connect_timeouts_total", "counter",
            "Connections ended for no CONNECT (or handshake) within connect_timeout.",
            load(&st->connect_timeouts));
    one_u64(b, "rt_rate_limited_pauses_total", "counter",
            "Times a client's rate limit paused reading its socket.", load(&st->rate_limited));
    one_u64(b, "rt_output_holds_total", "counter",
            "Times a client's unsent output stopped rtd reading its input until it drained.",
            load(&st->output_holds));
    int64_t preauth = atomic_load_explicit(&st->preauth_bytes, memory_order_relaxed);
    one_u64(b, "rt_preauth_bytes", "gauge",
            "Bytes held for connections not authenticated yet (max_preauth_memory).",
            preauth > 0 ? (uint64_t)preauth : 0);
    one_u64(b, "rt_preauth_refusals_total", "counter",
            "Connections ended because max_preauth_memory was spent.",
            load(&st->preauth_refused));
    one_u64(b, "rt_connect_too_large_total", "counter",
            "Connections ended for a CONNECT past max_connect_size.",
            load(&st->connect_too_large));
    family(b, "rt_auth_failures_total", "counter",
           "CONNECTs whose login was refused, by reason: bad_password, unknown_user, "
           "anonymous_refused (anonymous where anonymous clients may not connect), "
           "no_certificate_identity (identity_as_username, a certificate that names no one), "
           "unavailable (an HTTP authenticator's service did not answer).");
    for (int r = 0; r < RT_AUTH_FAILED_REASONS; r++)
        u64(b, "rt_auth_failures_total", load(&st->auth_failed[r]), "reason",
            rt_auth_failed_names[r], NULL);
    rt_auth_stats_t as;
    rt_auth_stats(&as);
    family(b, "rt_auth_http_answers_total", "counter",
           "The HTTP authenticators' answers, cached ones included, by result: allow, deny, "
           "ignore; error: no usable answer (on_error decided).");
    u64(b, "rt_auth_http_answers_total", as.http_allowed, "result", "allow", NULL);
    u64(b, "rt_auth_http_answers_total", as.http_denied, "result", "deny", NULL);
    u64(b, "rt_auth_http_answers_total", as.http_ignored, "result", "ignore", NULL);
    u64(b, "rt_auth_http_answers_total", as.http_errors, "result", "error", NULL);
    one_u64(b, "rt_auth_http_calls_total", "counter",
            "Calls the HTTP authenticators made to their services.", as.http_calls);
    family(b, "rt_auth_http_cache_total", "counter",
           "HTTP authenticator logins answered from the cache (hit) or not (miss).");
    u64(b, "rt_auth_http_cache_total", as.http_cache_hits, "outcome", "hit", NULL);
    u64(b, "rt_auth_http_cache_total", as.http_cache_misses, "outcome", "miss", NULL);
    one_u64(b, "rt_auth_http_cache_entries", "gauge", "Answers the HTTP authenticators cache.",
            as.http_cache_entries);
    one_u64(b, "rt_auth_http_connections_total", "counter",
            "Connections the HTTP authenticators opened (keep-alive reuses them).",
            as.http_connects);
    rt_banned_stats_t bs;
    rt_banned_stats(&bs);
    family(b, "rt_banned_refusals_total", "counter",
           "CONNECTs refused as banned (reason 0x8A), by the kind of ban that matched: clientid, "
           "username, address.");
    for (int k = 0; k < RT_BAN_KINDS; k++)
        u64(b, "rt_banned_refusals_total", bs.refused[k], "kind", rt_ban_kind_names[k], NULL);
    one_u64(b, "rt_flapping_bans_total", "counter",
            "Client ids flapping detection banned (flapping_max_connects).", bs.flapping_bans);
    one_u64(b, "rt_banned", "gauge", "Bans in force (rtctl banned list).", rt_banned_count());
    rt_exclusive_stats_t xs;
    rt_exclusive_stats(&xs);
    one_u64(b, "rt_exclusive_subscriptions", "gauge",
            "Filters held by an exclusive subscription ($exclusive/).", xs.held);
    one_u64(b, "rt_exclusive_refused_total", "counter",
            "Exclusive subscriptions refused (0x97): another client held the filter.", xs.refused);
    rt_delayed_stats_t ds;
    rt_delayed_stats(&ds);
    one_u64(b, "rt_delayed", "gauge", "Delayed messages held (rtctl delayed list).", ds.held);
    one_u64(b, "rt_delayed_bytes", "gauge", "Bytes of the delayed messages held.", ds.bytes);
    one_u64(b, "rt_delayed_published_total", "counter",
            "Delayed messages that came due and were published.", ds.published);
    one_u64(b, "rt_delayed_deleted_total", "counter",
            "Delayed messages deleted before they came due (rtctl delayed del).", ds.deleted);
    family(b, "rt_delayed_refused_total", "counter",
           "$delayed PUBLISHes refused, by reason: limit (max_delayed or max_delayed_bytes), "
           "invalid (no whole number of seconds, or no topic after it).");
    u64(b, "rt_delayed_refused_total", ds.refused_limit, "reason", "limit", NULL);
    u64(b, "rt_delayed_refused_total", ds.refused_invalid, "reason", "invalid", NULL);
    family(b, "rt_acl_denied_total", "counter",
           "Requests the ACL refused, by action: publish (PUBLISH and wills), subscribe "
           "(SUBSCRIBE filters), deliver (messages withheld from a subscription it filters).");
    u64(b, "rt_acl_denied_total", s->acl.denied_publish, "action", "publish", NULL);
    u64(b, "rt_acl_denied_total", s->acl.denied_subscribe, "action", "subscribe", NULL);
    u64(b, "rt_acl_denied_total", s->acl.denied_read, "action", "deliver", NULL);
    one_u64(b, "rt_max_connections", "gauge",
            "The max_connections limit, all listeners together (0: none).",
            (uint64_t)(RT_LIVE(max_connections) > 0 ? RT_LIVE(max_connections) : 0));
    family(b, "rt_delivery_latency_seconds", "histogram",
           "From reading a client's PUBLISH to writing a routed copy of it to a subscriber, "
           "per copy written as the subscriber took it (queued copies are not timed).");
    histogram(b, "rt_delivery_latency_seconds", &s->delivery, NULL, 0);
}

static void listeners_section(rt_buf_t *b, const scrape_t *s)
{
    char where[LISTENERS_MAX][128];
    for (size_t i = 0; i < s->nlisteners; i++) {
        rt__admin_listener_text(s->listeners[i].address, s->listeners[i].port, where[i],
                                sizeof(where[i]));
    }
#define EACH_LISTENER(metric, expr)                                                                \
    for (size_t i = 0; i < s->nlisteners; i++)                                                     \
    u64(b, metric, (expr), "listener", where[i], "kind", rt_listener_kind(s->listeners[i].index),  \
        NULL)
    family(b, "rt_listener_up", "gauge", "1 while the listener accepts connections.");
    EACH_LISTENER("rt_listener_up", s->listeners[i].running ? 1 : 0);
    family(b, "rt_listener_connections", "gauge", "Sockets open now that came in through it.");
    EACH_LISTENER("rt_listener_connections", s->listeners[i].connections);
    family(b, "rt_listener_accepted_total", "counter", "Sockets accepted.");
    EACH_LISTENER("rt_listener_accepted_total", s->listeners[i].accepted);
#undef EACH_LISTENER
    family(b, "rt_listener_refused_total", "counter",
           "Connections refused at accept, by reason: max_connections, per_ip "
           "(max_connections_per_ip), rate (max_connection_rate), error (the connection could "
           "not start), untrusted_proxy (PROXY protocol from an untrusted address), fd_reserve (the "
           "file descriptors kept for rtctl and HTTP).");
    for (size_t i = 0; i < s->nlisteners; i++) {
        const rt_listener_info_t *l = &s->listeners[i];
        const char *kind = rt_listener_kind(l->index);
        const struct {
            const char *reason;
            uint64_t v;
        } r[] = {{"max_connections", l->refused_max_connections},
                 {"per_ip", l->refused_per_ip},
                 {"rate", l->refused_rate},
                 {"error", l->refused_error},
                 {"untrusted_proxy", l->refused_untrusted},
                 {"fd_reserve", l->refused_fds}};
        for (size_t j = 0; j < sizeof(r) / sizeof(r[0]); j++)
            u64(b, "rt_listener_refused_total", r[j].v, "listener", where[i], "kind", kind,
                "reason", r[j].reason, NULL);
    }
    family(b, "rt_listener_acl_denied_total", "counter",
           "Its clients' requests the ACL refused, by action: publish (PUBLISH and wills), "
           "subscribe.");
    for (size_t i = 0; i < s->nlisteners; i++) {
        const char *kind = rt_listener_kind(s->listeners[i].index);
        u64(b, "rt_listener_acl_denied_total", s->listeners[i].acl_denied_publish, "listener",
            where[i], "kind", kind, "action", "publish", NULL);
        u64(b, "rt_listener_acl_denied_total", s->listeners[i].acl_denied_subscribe, "listener",
            where[i], "kind", kind, "action", "subscribe", NULL);
    }
}

/* Each certificate a TLS listener serves (an SNI name's too): when it expires. */
static void tls_section(rt_buf_t *b, const scrape_t *s)
{
    if (!s->ncerts)
        return;
    family(b, "rt_tls_certificate_not_after_seconds", "gauge",
           "When the certificate expires (its notAfter), in seconds since 1970: alert on "
           "rt_tls_certificate_not_after_seconds - time() < 14 * 86400.");
    for (size_t i = 0; i < s->ncerts; i++) {
        const rt_tls_cert_t *c = &s->certs[i];
        const rt_listen_t *l = rt_conf_listener(&rt_broker->conf, c->listener);
        if (!l)
            continue;
        /* The bound port (a configured 0 is the kernel's pick); the HTTP listener's as
           configured, as `status` shows it. */
        int port = l->port;
        for (size_t k = 0; k < s->nlisteners; k++)
            if (s->listeners[k].index == c->listener)
                port = s->listeners[k].port;
        char where[128];
        rt__admin_listener_text(l->host, port, where, sizeof(where));
        const char *kind = rt_listener_kind(c->listener);
        i64(b, "rt_tls_certificate_not_after_seconds", c->not_after_s, "listener", where, "kind",
            kind, "sni", c->sni, "subject", c->subject, NULL);
    }
}

/* XMPP sessions (actors/c2s), when rtd.conf has an xmpp table. */
static void xmpp_section(rt_buf_t *b)
{
    if (!rt_broker || !rt_broker->conf.xmpp.on)
        return;
    const rt_c2s_stats_t *x = &rt_c2s_stats;
    one_u64(b, "rt_xmpp_streams", "gauge", "XMPP streams open now (c2s actors).",
            atomic_load(&x->sessions));
    one_u64(b, "rt_xmpp_sessions", "gauge", "XMPP sessions with a resource bound now.",
            atomic_load(&x->bound));
    one_u64(b, "rt_xmpp_logins_total", "counter", "Successful SASL logins.",
            atomic_load(&x->logins));
    one_u64(b, "rt_xmpp_login_failures_total", "counter", "SASL failures sent.",
            atomic_load(&x->login_failures));
    one_u64(b, "rt_xmpp_stanzas_in_total", "counter", "Stanzas received from bound sessions.",
            atomic_load(&x->stanzas_in));
    one_u64(b, "rt_xmpp_stanzas_routed_total", "counter",
            "Stanzas sent on to another session.", atomic_load(&x->stanzas_routed));
    one_u64(b, "rt_xmpp_stream_errors_total", "counter", "Streams ended by a stream error.",
            atomic_load(&x->stream_errors));
    one_u64(b, "rt_xmpp_offline_stored_total", "counter",
            "Messages kept for a user with no available session (XEP-0160).",
            atomic_load(&x->offline_stored));
    one_u64(b, "rt_xmpp_offline_refused_total", "counter",
            "Messages refused for a user whose offline store is full.",
            atomic_load(&x->offline_refused));
    one_u64(b, "rt_xmpp_s2s_in_streams", "gauge",
            "Open server-to-server streams other servers made to this one.",
            atomic_load(&x->s2s_in));
    one_u64(b, "rt_xmpp_s2s_out_streams", "gauge",
            "Outgoing server-to-server streams (each pair of domains), set up or being.",
            atomic_load(&x->s2s_out));
    one_u64(b, "rt_xmpp_s2s_stanzas_in_total", "counter", "Stanzas other servers delivered here.",
            atomic_load(&x->s2s_stanzas_in));
    one_u64(b, "rt_xmpp_s2s_stanzas_out_total", "counter", "Stanzas written to other servers.",
            atomic_load(&x->s2s_stanzas_out));
    one_u64(b, "rt_xmpp_s2s_bounced_total", "counter",
            "Stanzas for another server sent back to their senders as errors.",
            atomic_load(&x->s2s_bounced));
    one_u64(b, "rt_xmpp_s2s_errors_out_total", "counter",
            "Errors sent back to other servers' senders.", atomic_load(&x->s2s_errors_out));
    one_u64(b, "rt_xmpp_s2s_dialback_failed_total", "counter",
            "Dialback keys that did not verify, either way.", atomic_load(&x->s2s_dialback_failed));
    one_u64(b, "rt_xmpp_s2s_external_total", "counter",
            "Server-to-server streams proved by SASL EXTERNAL (certificates), either way.",
            atomic_load(&x->s2s_external_ok));
    one_u64(b, "rt_xmpp_s2s_external_failed_total", "counter",
            "SASL EXTERNAL between servers refused, either way (dialback is tried next).",
            atomic_load(&x->s2s_external_failed));
    one_u64(b, "rt_xmpp_s2s_stream_errors_total", "counter",
            "Server-to-server streams this server ended with a stream error.",
            atomic_load(&x->s2s_stream_errors));
    one_u64(b, "rt_xmpp_cluster_resources", "gauge",
            "Resources bound on the cluster's other nodes, as this node knows them.",
            atomic_load(&x->cluster_resources));
    one_u64(b, "rt_xmpp_cluster_available", "gauge",
            "Of them, those available (their initial presence sent, not unavailable since).",
            atomic_load(&x->cluster_available));
    one_u64(b, "rt_xmpp_cluster_nodes", "gauge",
            "Other nodes whose bound resources this node has whole (it asked, they told).",
            atomic_load(&x->cluster_nodes));
    one_u64(b, "rt_xmpp_cluster_sent_total", "counter",
            "Messages to other nodes: bindings told, stanzas for their sessions.",
            atomic_load(&x->cluster_sent));
    one_u64(b, "rt_xmpp_cluster_received_total", "counter", "Messages from other nodes taken.",
            atomic_load(&x->cluster_received));
    one_u64(b, "rt_xmpp_cluster_refused_total", "counter",
            "Messages from other nodes that were not an rtd's (malformed).",
            atomic_load(&x->cluster_refused));
    one_u64(b, "rt_xmpp_cluster_not_sent_total", "counter",
            "Messages for other nodes the cluster did not take (no connection, out of memory).",
            atomic_load(&x->cluster_not_sent));
    one_u64(b, "rt_xmpp_cluster_dropped_total", "counter",
            "Other nodes' bindings dropped: their node went silent or restarted.",
            atomic_load(&x->cluster_dropped));
    one_u64(b, "rt_xmpp_push_enabled_total", "counter",
            "Push app servers enabled by clients (XEP-0357).", atomic_load(&x->push_enabled));
    one_u64(b, "rt_xmpp_push_disabled_total", "counter",
            "Push app servers disabled by clients (XEP-0357).", atomic_load(&x->push_disabled));
    one_u64(b, "rt_xmpp_push_sent_total", "counter", "Push notifications sent to an app server.",
            atomic_load(&x->push_sent));
    one_u64(b, "rt_xmpp_push_undeliverable_total", "counter",
            "Push notifications whose app server this server cannot reach.",
            atomic_load(&x->push_undeliverable));
    one_u64(b, "rt_xmpp_orphans_rerouted_total", "counter",
            "Messages left in the mailbox of a session that ended, sent on to the user's other "
            "sessions or to offline storage.",
            atomic_load(&x->orphans_rerouted));
    one_u64(b, "rt_xmpp_orphan_iqs_answered_total", "counter",
            "iq requests a session that ended never took (left in its mailbox, come after its "
            "stream, held by stream management past its time), answered service-unavailable.",
            atomic_load(&x->orphan_iqs));
    one_u64(b, "rt_xmpp_replaced_total", "counter",
            "Sessions ended by a newer one binding their resource.", atomic_load(&x->replaced));
    one_u64(b, "rt_xmpp_connect_timeouts_total", "counter",
            "Streams not authenticated within connect_timeout.",
            atomic_load(&x->connect_timeouts));
    one_u64(b, "rt_xmpp_registrations_total", "counter",
            "Accounts made by their clients in-band (XEP-0077).", atomic_load(&x->registrations));
    one_u64(b, "rt_xmpp_registrations_limited_total", "counter",
            "In-band registrations refused past xmpp.register_rate.",
            atomic_load(&x->registrations_limited));
    one_u64(b, "rt_xmpp_archived_total", "counter",
            "Message copies written to the archive (XEP-0313), sender's and receiver's.",
            atomic_load(&x->archived));
    one_u64(b, "rt_xmpp_archive_dropped_total", "counter",
            "Message copies not archived: the store fell behind or could not write.",
            atomic_load(&x->archive_dropped));
    one_u64(b, "rt_xmpp_muc_rooms", "gauge", "Group chat rooms open now (XEP-0045).",
            atomic_load(&x->muc_rooms));
    one_u64(b, "rt_xmpp_muc_rooms_refused_total", "counter",
            "Joins refused because they would have made a room past xmpp.muc_max_rooms.",
            atomic_load(&x->muc_rooms_refused));
    one_u64(b, "rt_xmpp_muc_messages_total", "counter",
            "Groupchat messages rooms took and sent to their occupants.",
            atomic_load(&x->muc_messages));
    one_u64(b, "rt_xmpp_muc_limited_total", "counter",
            "Groupchat messages refused past xmpp.muc_message_rate.", atomic_load(&x->muc_limited));
    one_u64(b, "rt_xmpp_muc_dropped_total", "counter",
            "Messages to a room that ended as they reached it (a join makes the room again; "
            "an iq is answered).",
            atomic_load(&x->muc_dropped));
    one_u64(b, "rt_xmpp_muc_occupants_dropped_total", "counter",
            "Occupants removed from their rooms (status 333) because their client stopped reading.",
            atomic_load(&x->muc_lagging));
    if (!rt_broker->conf.xmpp.upload_host[0])
        return;
    one_u64(b, "rt_xmpp_upload_slots_total", "counter", "HTTP upload slots handed out (XEP-0363).",
            atomic_load(&x->upload_slots));
    one_u64(b, "rt_xmpp_upload_refused_total", "counter",
            "Upload slots refused: past xmpp.upload_max_size or the user's xmpp.upload_quota.",
            atomic_load(&x->upload_refused));
    one_u64(b, "rt_xmpp_upload_stored_total", "counter",
            "Uploaded files whose PUT came whole and was kept.", atomic_load(&x->upload_stored));
    one_u64(b, "rt_xmpp_upload_stored_bytes_total", "counter", "Bytes of the files kept.",
            atomic_load(&x->upload_bytes));
    one_u64(b, "rt_xmpp_upload_served_total", "counter",
            "GETs (and HEADs) of uploaded files answered with the file.",
            atomic_load(&x->upload_served));
    one_u64(b, "rt_xmpp_upload_expired_total", "counter",
            "Uploaded files past xmpp.upload_expire and abandoned slots the sweep removed.",
            atomic_load(&x->upload_expired));
}

static void rules_section(rt_buf_t *b, const scrape_t *s)
{
    if (!s->rules_running)
        return;
    one_u64(b, "rt_rules", "gauge", "Rules in the current rule set.", s->rules_stats.rules);
    one_u64(b, "rt_rules_version", "gauge", "The rule set's version: 1 at start, +1 per reload.",
            s->rules_stats.version);
    const rt_rule_info_t *r = s->rules;
#define EACH_RULE(metric, expr)                                                                    \
    for (size_t i = 0; i < s->nrules; i++)                                                         \
    u64(b, metric, (expr), "rule", r[i].name, NULL)
    family(b, "rt_rule_enabled", "gauge", "1 while the rule runs.");
    EACH_RULE("rt_rule_enabled", r[i].enabled ? 1 : 0);
    family(b, "rt_rule_matched_total", "counter", "Messages whose topic the rule's from matched.");
    EACH_RULE("rt_rule_matched_total", r[i].matched);
    family(b, "rt_rule_passed_total", "counter", "Matched messages the rule passed on.");
    EACH_RULE("rt_rule_passed_total", r[i].passed);
    family(b, "rt_rule_filtered_total", "counter",
           "Matched messages the rule's code filtered out.");
    EACH_RULE("rt_rule_filtered_total", r[i].filtered);
    family(b, "rt_rule_rows_total", "counter", "Rows the rule sent to its sinks.");
    EACH_RULE("rt_rule_rows_total", r[i].rows_out);
#undef EACH_RULE
    family(b, "rt_rule_failed_total", "counter",
           "Matched messages the rule failed on, by reason: exception (its code raised), budget "
           "(it ran out of instructions), memory (it ran out of memory).");
    for (size_t i = 0; i < s->nrules; i++) {
        u64(b, "rt_rule_failed_total", r[i].failed_exception, "rule", r[i].name, "reason",
            "exception", NULL);
        u64(b, "rt_rule_failed_total", r[i].failed_budget, "rule", r[i].name, "reason", "budget",
            NULL);
        u64(b, "rt_rule_failed_total", r[i].failed_memory, "rule", r[i].name, "reason", "memory",
            NULL);
    }
}

static void sinks_section(rt_buf_t *b, const scrape_t *s)
{
    const rt_sink_info_t *k = s->sinks;
#define EACH_SINK(metric, expr)                                                                    \
    for (size_t i = 0; i < s->nsinks; i++)                                                         \
    u64(b, metric, (expr), "sink", k[i].name, "type", k[i].type, NULL)
    family(b, "rt_sink_connected", "gauge", "1 while the sink is connected to its database.");
    EACH_SINK("rt_sink_connected", strcmp(k[i].state, "connected") == 0 ? 1 : 0);
    family(b, "rt_sink_rows_in_total", "counter",
           "Rows handed to the sink (refused ones included), and rows recovered from an "
           "earlier run's spill.");
    EACH_SINK("rt_sink_rows_in_total", k[i].in);
    family(b, "rt_sink_rows_written_total", "counter",
           "Rows committed to the database (or published).");
    EACH_SINK("rt_sink_rows_written_total", k[i].written);
    family(b, "rt_sink_rows_dropped_total", "counter",
           "Rows dropped: the byte limit reached, or refused by the database for good.");
    EACH_SINK("rt_sink_rows_dropped_total", k[i].dropped);
    family(b, "rt_sink_rows_replayed_total", "counter", "Rows written after waiting in the spill.");
    EACH_SINK("rt_sink_rows_replayed_total", k[i].retried);
    family(b, "rt_sink_rows_recovered_total", "counter",
           "Rows found in a spill file left by an earlier run.");
    EACH_SINK("rt_sink_rows_recovered_total", k[i].recovered);
    family(b, "rt_sink_rows_expired_total", "counter",
           "Rows written, then deleted by the sink's retention (max_rows, max_age, max_bytes).");
    EACH_SINK("rt_sink_rows_expired_total", k[i].expired);
    family(b, "rt_sink_batches_total", "counter", "Write transactions or bulk operations done.");
    EACH_SINK("rt_sink_batches_total", k[i].batches);
    family(b, "rt_sink_write_failures_total", "counter", "Write attempts (batches) that failed.");
    EACH_SINK("rt_sink_write_failures_total", k[i].failed);
    family(b, "rt_sink_queued_rows", "gauge", "Rows in memory waiting for a batch.");
    EACH_SINK("rt_sink_queued_rows", k[i].queued);
    family(b, "rt_sink_inflight_rows", "gauge", "Rows in the batch being written.");
    EACH_SINK("rt_sink_inflight_rows", k[i].inflight);
    family(b, "rt_sink_spilled_rows", "gauge", "Rows waiting in the on-disk spill queue.");
    EACH_SINK("rt_sink_spilled_rows", k[i].spilled);
    family(b, "rt_sink_queue_bytes", "gauge",
           "Row bytes in memory, in flight and spilled (what max_bytes bounds).");
    EACH_SINK("rt_sink_queue_bytes", k[i].bytes);
#undef EACH_SINK
    family(b, "rt_sink_write_duration_seconds", "histogram",
           "Time of each batch write (a transaction, a bulk operation, a batch published), "
           "failed ones included.");
    for (size_t i = 0; i < s->nsinks; i++) {
        const char *kv[] = {"sink", k[i].name, "type", k[i].type};
        histogram(b, "rt_sink_write_duration_seconds", &k[i].write_seconds, kv, 2);
    }
}

/* The tenants, copied out of their table (each family's samples come together). */
#define TENANTS_MAX 10000 /* a scrape's series stay bounded when every user is a tenant */
typedef struct {
    rt_tenant_info_t *all;
    size_t n, cap;
} tenants_t;

static void copy_tenant(const rt_tenant_info_t *t, void *arg)
{
    tenants_t *ts = arg;
    if (ts->n == TENANTS_MAX || rt_grow(&ts->all, &ts->cap, ts->n + 1, sizeof(*ts->all), 16))
        return;
    rt_tenant_info_t *c = &ts->all[ts->n];
    *c = *t;
    if ((c->mount = strdup(t->mount)))
        ts->n++;
}

static void tenants_section(rt_buf_t *b)
{
    tenants_t ts = {0};
    rt_tenant_each(copy_tenant, &ts);
    static const struct {
        const char *name, *type, *help;
        size_t offset; /* of a uint64_t in rt_tenant_info_t */
    } families[] = {
        {"rt_tenant_connections", "gauge", "The tenant's clients connected now.",
         offsetof(rt_tenant_info_t, connections)},
        {"rt_tenant_subscriptions", "gauge", "Subscriptions the tenant's sessions hold.",
         offsetof(rt_tenant_info_t, subscriptions)},
        {"rt_tenant_retained_bytes", "gauge",
         "Bytes of retained messages under the tenant's mountpoint.",
         offsetof(rt_tenant_info_t, retained_bytes)},
        {"rt_tenant_messages_in_total", "counter", "PUBLISHes the tenant's clients sent.",
         offsetof(rt_tenant_info_t, messages_in)},
        {"rt_tenant_messages_out_total", "counter", "Messages delivered to the tenant's clients.",
         offsetof(rt_tenant_info_t, messages_out)},
    };
    for (size_t f = 0; ts.n && f < sizeof(families) / sizeof(families[0]); f++) {
        family(b, families[f].name, families[f].type, families[f].help);
        for (size_t i = 0; i < ts.n; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&ts.all[i] + families[f].offset, sizeof(v));
            u64(b, families[f].name, v, "tenant", ts.all[i].mount, NULL);
        }
    }
    if (ts.n)
        family(b, "rt_tenant_refused_total", "counter",
               "What the tenant's quotas refused, by quota (tenant_max_*).");
    for (size_t i = 0; i < ts.n; i++)
        for (int q = 0; q < RT_TENANT_QUOTAS; q++)
            u64(b, "rt_tenant_refused_total", ts.all[i].refused[q], "tenant", ts.all[i].mount,
                "quota", rt_tenant_quota_names[q], NULL);
    for (size_t i = 0; i < ts.n; i++)
        free((char *)ts.all[i].mount);
    free(ts.all);
}

static void bridges_section(rt_buf_t *b, const scrape_t *s)
{
    const rt_bridge_info_t *k = s->bridges;
#define EACH_BRIDGE(metric, expr)                                                                  \
    for (size_t i = 0; i < s->nbridges; i++)                                                       \
    u64(b, metric, (expr), "bridge", k[i].name, NULL)
    if (!s->nbridges)
        return;
    family(b, "rt_bridge_up", "gauge", "1 while the bridge is connected to its remote.");
    EACH_BRIDGE("rt_bridge_up", strcmp(k[i].state, "connected") == 0 ? 1 : 0);
    family(b, "rt_bridge_connects_total", "counter", "Connects the remote accepted.");
    EACH_BRIDGE("rt_bridge_connects_total", k[i].connects);
    family(b, "rt_bridge_connect_failures_total", "counter",
           "Connects that failed or connections that broke (refused, no answer, closed).");
    EACH_BRIDGE("rt_bridge_connect_failures_total", k[i].failures);
    family(b, "rt_bridge_messages_out_total", "counter",
           "PUBLISHes written to the remote, those sent again included.");
    EACH_BRIDGE("rt_bridge_messages_out_total", k[i].sent);
    family(b, "rt_bridge_messages_acked_total", "counter",
           "QoS 1 PUBLISHes the remote acknowledged.");
    EACH_BRIDGE("rt_bridge_messages_acked_total", k[i].acked);
    family(b, "rt_bridge_messages_resent_total", "counter",
           "PUBLISHes sent again after a connection dropped before their PUBACK.");
    EACH_BRIDGE("rt_bridge_messages_resent_total", k[i].resent);
    family(b, "rt_bridge_messages_in_total", "counter", "PUBLISHes from the remote routed here.");
    EACH_BRIDGE("rt_bridge_messages_in_total", k[i].received);
    family(b, "rt_bridge_messages_dropped_total", "counter",
           "Messages out dropped: the queue at max_queue_bytes, or over the remote's packet size.");
    EACH_BRIDGE("rt_bridge_messages_dropped_total", k[i].dropped);
    family(b, "rt_bridge_queued_messages", "gauge",
           "Messages out held in memory, in flight included.");
    EACH_BRIDGE("rt_bridge_queued_messages", k[i].queued);
    family(b, "rt_bridge_queued_bytes", "gauge",
           "Bytes they hold (max_memory_bytes bounds it; with the spill's, max_queue_bytes).");
    EACH_BRIDGE("rt_bridge_queued_bytes", k[i].queued_bytes);
    family(b, "rt_bridge_spilled_messages", "gauge",
           "QoS 1 messages out waiting in the spill file (past max_memory_bytes).");
    EACH_BRIDGE("rt_bridge_spilled_messages", k[i].spilled);
    family(b, "rt_bridge_spilled_bytes", "gauge", "Bytes of the messages in the spill file.");
    EACH_BRIDGE("rt_bridge_spilled_bytes", k[i].spilled_bytes);
#undef EACH_BRIDGE
}

static void runtime_section(rt_buf_t *b, const scrape_t *s)
{
    const rt_stats_t *rs = &s->rs;
    const rt_admin_kinds_t *k = &s->kinds;
    family(b, "rt_actors", "gauge", "Actors alive, by type.");
    for (size_t i = 0; i <= RT_ADMIN_TYPES_MAX; i++)
        if (k->type[i].count)
            u64(b, "rt_actors", k->type[i].count, "type", k->type[i].type, NULL);
    family(b, "rt_actor_mailbox_messages", "gauge",
           "Messages waiting in actors' mailboxes, by actor type.");
    for (size_t i = 0; i <= RT_ADMIN_TYPES_MAX; i++)
        if (k->type[i].count)
            u64(b, "rt_actor_mailbox_messages", k->type[i].mailbox, "type", k->type[i].type, NULL);
    one_u64(b, "rt_actors_limit", "gauge", "The pid table's capacity (max_actors).",
            rs->max_actors);
    one_u64(b, "rt_actors_spawned_total", "counter", "Actors spawned.", rs->spawned);
    one_u64(b, "rt_actors_exited_total", "counter", "Actors that exited.", rs->exited);
    one_u64(b, "rt_actor_turns_total", "counter", "Actor turns the schedulers ran.", rs->turns);
    one_u64(b, "rt_dead_letters_total", "counter", "Messages sent to actors no longer alive.",
            rs->dead_letters);
    one_u64(b, "rt_shed_messages_total", "counter",
            "Optional messages dropped at the source (a full mailbox).", rs->shed);
    one_u64(b, "rt_heap_limit_kills_total", "counter", "Actors ended for passing their max_heap.",
            rs->heap_limit_kills);
    one_u64(b, "rt_gc_collections_total", "counter", "Heap collections in all actors.", rs->gcs);
    family(b, "rt_gc_pause_seconds", "histogram",
           "Pause of each actor heap collection (a full mark-sweep between two messages).");
    histogram(b, "rt_gc_pause_seconds", &s->gc_pauses, NULL, 0);
    one_u64(b, "rt_timers_pending", "gauge", "Timers set and not yet fired.", rs->timers_pending);

    char id[SCHEDS_MAX][12];
    for (size_t i = 0; i < s->nscheds; i++)
        snprintf(id[i], sizeof(id[i]), "%u", s->scheds[i].index);
#define POOL(i) (s->scheds[i].blocking_pool ? "blocking" : "scheduler")
    family(b, "rt_scheduler_busy_seconds_total", "counter",
           "Time the thread spent running actors (a scheduler, or a blocking pool thread).");
    for (size_t i = 0; i < s->nscheds; i++)
        dbl(b, "rt_scheduler_busy_seconds_total", (double)s->scheds[i].busy_ns / 1e9, "scheduler",
            id[i], "pool", POOL(i), NULL);
    family(b, "rt_scheduler_utilisation_ratio", "gauge",
           "Share of the last whole second the thread spent running actors (0 to 1).");
    for (size_t i = 0; i < s->nscheds; i++)
        dbl(b, "rt_scheduler_utilisation_ratio", i < s->nutil ? s->util[i] : 0, "scheduler", id[i],
            "pool", POOL(i), NULL);
    family(b, "rt_scheduler_run_queue", "gauge", "Actors queued to run on the thread.");
    for (size_t i = 0; i < s->nscheds; i++)
        u64(b, "rt_scheduler_run_queue", s->scheds[i].run_queue, "scheduler", id[i], "pool",
            POOL(i), NULL);
    family(b, "rt_scheduler_turns_total", "counter", "Actor turns the thread ran.");
    for (size_t i = 0; i < s->nscheds; i++)
        u64(b, "rt_scheduler_turns_total", s->scheds[i].turns, "scheduler", id[i], "pool", POOL(i),
            NULL);
    family(b, "rt_scheduler_steals_total", "counter",
           "Actors the thread took from another's queue.");
    for (size_t i = 0; i < s->nscheds; i++)
        u64(b, "rt_scheduler_steals_total", s->scheds[i].steals, "scheduler", id[i], "pool",
            POOL(i), NULL);
#undef POOL

    one_u64(b, "rt_resident_memory_bytes", "gauge", "The process's resident set (VmRSS).", k->rss);
    family(b, "rt_memory_bytes", "gauge",
           "The resident set told apart by kind (docs/ADMIN.md, \"Memory by kind\"): the kinds "
           "add up to rt_resident_memory_bytes; \"unexplained\" is the rest and may be negative.");
    for (size_t i = 0; i < k->nkinds; i++)
        i64(b, "rt_memory_bytes", k->kind[i].bytes, "kind", k->kind[i].name, NULL);
}

/* ---- The scrape ---- */

static void gather(scrape_t *s)
{
    if (rt_broker) {
        rt_broker_counts(&s->counts);
        rt_broker_metrics(&s->metrics);
        s->nlisteners = rt_broker_listeners(s->listeners, LISTENERS_MAX);
        if (s->nlisteners > LISTENERS_MAX)
            s->nlisteners = LISTENERS_MAX;
        s->ncerts = rt_tls_certificates(s->certs, CERTS_MAX);
        if (s->ncerts > CERTS_MAX)
            s->ncerts = CERTS_MAX;
    }
    rt_acl_stats(&s->acl);
    s->rules_running = rt_rules_stats(&s->rules_stats) == 0;
    if (s->rules_running && s->rules) {
        s->nrules = rt_rules_snapshot(s->rules, RULES_MAX);
        if (s->nrules > RULES_MAX)
            s->nrules = RULES_MAX;
    }
    s->nsinks = rt_sinks_snapshot(s->sinks, SINKS_MAX);
    s->nbridges = rt_bridges_snapshot(s->bridges, RT_CONF_MAX_BRIDGES);
    if (s->nsinks > SINKS_MAX)
        s->nsinks = SINKS_MAX;
    s->nscheds = rt_snapshot_schedulers(s->scheds, SCHEDS_MAX);
    if (s->nscheds > SCHEDS_MAX)
        s->nscheds = SCHEDS_MAX;
    s->nutil = rt__admin_sched_util(s->util, SCHEDS_MAX);
    rt_stats(&s->rs);
    rt__admin_memory_kinds_read(&s->kinds);
    rt_hist_snapshot(rt_heap_pauses(), &s->gc_pauses);
    rt_hist_snapshot(rt_message_delivery_hist(), &s->delivery);
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
** Its own cost, last, so the lines above are in it: what a scrape costs is a question that
** grows with the number of actors (one walk of them), and this answers it on the live rtd.
*/
static void scrape_cost(rt_buf_t *b, double cpu0, double wall0)
{
    double cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0, wall = clock_s(CLOCK_MONOTONIC) - wall0;
    family(b, "rt_scrape_cpu_seconds", "gauge",
           "CPU time this scrape took to gather and write the lines above (one thread's).");
    dbl(b, "rt_scrape_cpu_seconds", cpu, NULL);
    family(b, "rt_scrape_duration_seconds", "gauge",
           "Wall-clock time this scrape took to gather and write the lines above.");
    dbl(b, "rt_scrape_duration_seconds", wall, NULL);
}

int rt_admin_metrics_text(rt_buf_t *out)
{
    double cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), wall0 = clock_s(CLOCK_MONOTONIC);
    scrape_t *s = calloc(1, sizeof(*s));
    if (!s)
        return RT_ENOMEM;
    s->rules = malloc(RULES_MAX * sizeof(*s->rules));
    if (!s->rules) {
        free(s);
        return RT_ENOMEM;
    }
    gather(s);
    process_section(out);
    if (rt_broker) {
        broker_section(out, s);
        listeners_section(out, s);
        tls_section(out, s);
    }
    cluster_section(out);
    xmpp_section(out);
    rules_section(out, s);
    sinks_section(out, s);
    bridges_section(out, s);
    tenants_section(out);
    runtime_section(out, s);
    scrape_cost(out, cpu0, wall0);
    free(s->rules);
    free(s);
    return out->oom ? RT_ENOMEM : 0;
}

/* `metrics prometheus`: the scrape as a text body, on the admin worker (it walks every actor). */
int rt__admin_metrics_prometheus(rt_admin_cmd_t *c)
{
    if (c->json)
        return rt__admin_fail(c, 400,
                              "metrics prometheus has no JSON form: it is the "
                              "Prometheus text format");
    if (rt_admin_metrics_text(&c->text) != 0) {
        rt_buf_free(&c->text);
        return rt__admin_fail(c, 500, "out of memory");
    }
    return 200;
}

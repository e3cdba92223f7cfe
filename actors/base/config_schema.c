/*
** The settings schema: every setting rtd reads, with its type, default, unit, range or
** choices, whether `rtctl config set` changes it live, and one line of documentation
** (config.h). The loader (config.c) checks and applies values by it; `rtctl config show`,
** docs/CONFIG.md and rtd.conf(5) are printed from it (rtd --print-schema=markdown|man).
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "config_schema.h"

static const char *const log_levels[] = {"error", "warning", "info", "debug", NULL};
static const char *const log_formats[] = {"logfmt", "json", NULL};
static const char *const log_journal_modes[] = {"auto", "on", "off", NULL};
static const char *const memory_policies[] = {"hold", "drop_newest", "drop_oldest", NULL};
static const char *const rewrite_actions[] = {"publish", "subscribe", "all", NULL};
static const char *const authn_kinds[] = {"file", "jwt", "http", NULL};
static const char *const authn_on_errors[] = {"deny", "ignore", "cache", NULL};

#define OFF(f) offsetof(rt_conf_t, f)
#define SIZE(f) sizeof(((rt_conf_t *)0)->f)
#define LIVE true
#define RESTART false
#define INT(f, d, lo, hi, u, lv, h)                                                                \
    {                                                                                              \
        .name = #f, .type = RT_SET_INT, .num = d, .unit = u, .min = lo, .max = hi, .live = lv,     \
        .doc = h, .offset = OFF(f)                                                                 \
    }
#define BOOL(f, d, lv, h)                                                                          \
    {                                                                                              \
        .name = #f, .type = RT_SET_BOOL, .num = d, .live = lv, .doc = h, .offset = OFF(f)          \
    }
#define STRING(f, type_, d, ch, lv, h)                                                             \
    {                                                                                              \
        .name = #f, .type = type_, .text = d, .choices = ch, .live = lv, .doc = h,                 \
        .offset = OFF(f), .size = SIZE(f)                                                          \
    }
#define CLUSTER(f, type_, h)                                                                       \
    {                                                                                              \
        .name = "cluster." #f, .type = type_, .text = "", .doc = h, .offset = OFF(cluster.f),      \
        .size = SIZE(cluster.f)                                                                    \
    }
#define KIB 1024.0
#define MIB (1024.0 * 1024)

/*
** The top-level settings, in the order config show lists them, then the keys of the cluster
** table (read by the same code through this table).
*/
const rt_setting_t rt__conf_settings[] = {
    {.name = "listeners",
     .type = RT_SET_LIST,
     .text = "\"0.0.0.0:1883\"",
     .doc = "MQTT listeners: \"host:port\", a listener's table { bind = \"host:port\", tls = "
            "{...}, websocket = \"/path\", ... } or a list of them (docs/TRANSPORTS.md)"},
    {.name = "http",
     .type = RT_SET_TABLE,
     .doc = "the HTTP listener: health, /metrics and the API (docs/HTTP.md); none by default"},
    {.name = "cluster",
     .type = RT_SET_TABLE,
     .doc = "join a cluster of rtd nodes over NATS (docs/CLUSTER.md); none by default"},
    {.name = "xmpp",
     .type = RT_SET_TABLE,
     .doc = "the XMPP server: its domains, listeners and limits (docs/XMPP.md); none by default"},
    {.name = "auto_subscribe",
     .type = RT_SET_TABLE,
     .doc = "{ { topic = \"devices/%c/cmd\", qos = 1 }, ... }: subscriptions made for every client "
            "at CONNECT; %c is its client id, %u its user name (docs/AUTH.md)"},
    {.name = "auth",
     .type = RT_SET_TABLE,
     .doc = "{ { kind = \"file\" }, { kind = \"jwt\", ... } }: the login chain, in order, each "
            "allowing, refusing or passing to the next (docs/AUTH.md); none: the password file"},
    {.name = "rewrite",
     .type = RT_SET_TABLE,
     .doc = "{ { action = \"publish\", source = \"x/#\", re = \"^x/(.+)$\", dest = \"y/$1\" }, "
            "... }: topics rewritten before the ACL and routing, the first rule that applies "
            "(docs/AUTH.md)"},
    {.name = "bridges",
     .type = RT_SET_MAP,
     .doc =
         "name = { remote = \"mqtt://host:port\", out = { \"a/# -> b/#\" }, [\"in\"] = { ... } }: "
         "bridges to other brokers (docs/BRIDGES.md); none by default",
     .offset = OFF(bridges)},
    {.name = "tenants",
     .type = RT_SET_MAP,
     .doc = "{ [\"acme/\"] = { max_connections = n, ... } }: a tenant's own quotas, by its "
            "mountpoint, in place of the tenant_max_* settings (docs/TENANTS.md); none by default"},
    {.name = "user_rate_limits",
     .type = RT_SET_MAP,
     .doc = "{ user = { messages = n, bytes = n, ... } }: a user's own rate limit, in place of "
            "its listener's"},
    INT(connect_timeout, 10, 1, 3600, "seconds", RESTART,
        "from accept to CONNECT (TLS, WebSocket and PROXY header included)"),
    INT(max_connections, 1000000, 1, 10000000, "connections", LIVE, "connections at once"),
    INT(max_connections_per_ip, 1000, 0, 10000000, "connections", LIVE,
        "connections at once per address; 0 = unlimited"),
    INT(max_connection_rate, 1000, 0, 10000000, "connections/s", LIVE,
        "new connections a second per listener; 0 = any"),
    INT(max_connect_size, 64 * KIB, 64, 268435455, "bytes", LIVE,
        "a CONNECT may have (before authentication, nothing else is read)"),
    INT(max_preauth_memory, 64 * MIB, 64 * KIB, 1e12, "bytes", LIVE,
        "all connections not authenticated yet may hold; past it they are ended"),
    INT(max_packet_size, 1 * MIB, 64, 268435455, "bytes", LIVE, "a packet, both directions"),
    INT(max_inflight, 1024, 1, 65535, "messages", LIVE,
        "QoS 1/2 messages in flight to a client, per session"),
    INT(receive_maximum, RT_CONF_RECEIVE_MAXIMUM, 1, 65000, "messages", LIVE,
        "QoS 1/2 PUBLISHes an MQTT 5 client may leave unacknowledged (its Receive Maximum)"),
    INT(max_queued_messages, 0, 0, 100000000, "messages", LIVE,
        "queued per session; 0 = no count (max_client_memory bounds them)"),
    INT(max_client_memory, 16 * MIB, 64 * KIB, 1e12, "bytes", LIVE,
        "one client may make rtd hold: heap, queued and in-flight messages, output"),
    INT(client_memory_hold_ms, 1000, 0, 60000, "ms", LIVE,
        "a client at its budget holds its publishers back before dropping (policy hold)"),
    STRING(client_memory_policy, RT_SET_STRING, "hold", memory_policies, RESTART,
           "at the budget: hold (publishers wait, then drop_newest), drop_newest or drop_oldest"),
    INT(max_topic_alias, 64, 0, 65535, "aliases", RESTART,
        "inbound topic aliases per connection (MQTT 5)"),
    INT(max_topic_levels, 0, 0, 65535, "levels", LIVE, "in a topic name or filter; 0 = unlimited"),
    INT(max_topic_length, 0, 0, 65535, "bytes", LIVE, "of a topic name or filter; 0 = unlimited"),
    INT(max_subscriptions, 0, 0, 10000000, "subscriptions", LIVE, "per client; 0 = unlimited"),
    INT(max_retained_messages, 1000000, 0, 1e9, "messages", LIVE,
        "retained messages in all; 0 = unlimited"),
    INT(max_retained_bytes, 512 * MIB, 0, 1e12, "bytes", LIVE,
        "of retained messages in all; 0 = unlimited"),
    INT(max_keepalive, 65535, 0, 65535, "seconds", LIVE,
        "longer keepalives MQTT 5 clients ask for are lowered to it"),
    INT(max_session_expiry, 7 * 24 * 3600, 0, 4294967295.0, "seconds", LIVE,
        "longer session expiry intervals are lowered to it"),
    BOOL(queue_qos0, false, LIVE, "queue QoS 0 messages for offline sessions"),
    BOOL(persistence, false, RESTART,
         "keep retained messages and persistent sessions in data_dir/state.db"),
    BOOL(allow_zero_length_clientid, true, LIVE, "accept an empty client id (and assign one)"),
    BOOL(delayed_publish, true, LIVE,
         "hold a PUBLISH to $delayed/SECONDS/topic and publish it to topic SECONDS later"),
    INT(max_delayed, 100000, 1, 100000000, "messages", LIVE, "delayed messages held at once"),
    INT(max_delayed_bytes, 64 * MIB, 1024, 1e12, "bytes", LIVE, "of delayed messages held at once"),
    INT(max_banned, 100000, 0, 100000000, "bans", LIVE,
        "bans held at once (rtctl banned; flapping detection adds them); 0 = unlimited"),
    INT(tenant_max_connections, 0, 0, 100000000, "connections", LIVE,
        "connections at once of each tenant (a mountpoint, docs/TENANTS.md); 0 = unlimited"),
    INT(tenant_max_subscriptions, 0, 0, 1e12, "subscriptions", LIVE,
        "subscriptions held by each tenant's sessions; 0 = unlimited"),
    INT(tenant_max_publish_rate, 0, 0, 1e9, "messages/s", LIVE,
        "PUBLISHes a second of each tenant, all its clients together (a second's worth at "
        "once); 0 = unlimited"),
    INT(tenant_max_retained_bytes, 0, 0, 1e12, "bytes", LIVE,
        "bytes of retained messages (topic and payload) under each tenant's mountpoint; 0 = "
        "unlimited"),
    INT(flapping_max_connects, 0, 0, 1000000, "connects", LIVE,
        "connects of one client id within flapping_window_s that ban it for flapping_ban_s; "
        "0 = no flapping detection"),
    INT(flapping_window_s, 60, 1, 86400, "seconds", LIVE, "flapping detection's window"),
    INT(flapping_ban_s, 300, 1, 31536000, "seconds", LIVE,
        "how long a flapping client id is banned"),
    BOOL(allow_anonymous, true, LIVE,
         "accept anonymous clients: no user name, or one no password_file vouches for (from "
         "anonymous_from)"),
    {.name = "anonymous_from",
     .type = RT_SET_NETS,
     .text = "{ \"127.0.0.0/8\", \"::1/128\" }",
     .live = LIVE,
     .doc = "addresses anonymous clients may come from: \"a.b.c.d/n\", \"v6/n\" or a list"},
    STRING(password_file, RT_SET_PATH, "", NULL, LIVE,
           "user:hash lines (rtd passwd); \"\" = none: user names are anonymous"),
    STRING(acl_file, RT_SET_PATH, "", NULL, LIVE, "Mosquitto-format ACL; \"\" = allow every topic"),
    INT(auth_max_delay_ms, 5000, 0, 60000, "ms", RESTART,
        "cap of the delay before a refused CONNACK"),
    INT(schedulers, 0, 0, 64, "threads", RESTART, "scheduler threads; 0 = one per core"),
    INT(blocking_threads, 2, 1, 32, "threads", RESTART,
        "threads for blocking actors (database sinks)"),
    INT(batch, 100, 1, 100000, "messages", RESTART, "messages per actor turn"),
    INT(min_heap, 16 * KIB, 1024, 1e12, "bytes", RESTART, "before an actor's first collection"),
    {.name = "gc_factor",
     .type = RT_SET_NUMBER,
     .num = 2.0,
     .min = 1.01,
     .max = 100,
     .doc = "an actor's next collection comes at this factor times its live bytes",
     .offset = OFF(gc_factor)},
    INT(max_heap, 0, 0, 1e12, "bytes", RESTART, "per actor heap; 0 = unlimited"),
    STRING(rules_dir, RT_SET_PATH, "rules", NULL, RESTART, "directory of rule files (*.lua)"),
    INT(rule_workers, 2, 1, 64, "actors", RESTART, "rule worker actors (one Lua state each)"),
    INT(rule_instructions, 1000000, 1000, 1e9, "instructions", RESTART,
        "Lua instructions one rule call may run"),
    INT(rule_flush_ms, RT_CONF_RULE_FLUSH_MS, 0, 1000, "ms", RESTART,
        "a rule worker holds a partial sink batch; 0 = one per turn"),
    INT(rule_turn_us, RT_CONF_RULE_TURN_US, 100, 1e6, "microseconds", RESTART,
        "of rules a worker runs before it yields a turn"),
    INT(rule_memory, 64 * MIB, 1 * MIB, 1e11, "bytes", RESTART,
        "one rule worker's Lua state may hold"),
    INT(rule_call_ms, RT_CONF_RULE_CALL_MS, 1, 60000, "ms", RESTART,
        "wall-clock time one rule call may run"),
    INT(rule_output_rows, RT_CONF_RULE_OUTPUT_ROWS, 1, 1e7, "rows", RESTART,
        "one rule call may return"),
    INT(rule_output_bytes, RT_CONF_RULE_OUTPUT_BYTES, 1024, 1e11, "bytes", RESTART,
        "BSON bytes of the rows one rule call may return"),
    INT(sys_interval, 10, 0, 86400, "seconds", RESTART, "between $SYS/broker updates; 0 = none"),
    INT(restart_intensity, RT_CONF_RESTART_INTENSITY, 0, 1000, "restarts", RESTART,
        "a supervisor allows within restart_period"),
    INT(restart_period, RT_CONF_RESTART_PERIOD, 1, 3600, "seconds", RESTART,
        "a supervisor past its intensity in it gives up"),
    STRING(data_dir, RT_SET_PATH, "data", NULL, RESTART,
           "directory for persistent state (mode 0700, its files 0600)"),
    STRING(admin_socket, RT_SET_PATH, "", NULL, RESTART,
           "unix socket for rtctl (mode 0600); \"\" = data_dir/rtd.sock"),
    STRING(log_level, RT_SET_STRING, "info", log_levels, LIVE, "error, warning, info or debug"),
    STRING(log_format, RT_SET_STRING, "logfmt", log_formats, RESTART,
           "logfmt or json: key=value pairs (quoted when needed), or a JSON object a line"),
    STRING(log_file, RT_SET_PATH, "", NULL, RESTART,
           "\"\" = stderr (the journal under systemd); else a file, reopened on SIGHUP"),
    STRING(log_journal, RT_SET_STRING, "auto", log_journal_modes, RESTART,
           "auto, on or off: priority prefixes (<3> error ... <7> debug) on stderr; auto: when "
           "stderr is the journal's"),
    {.name = "sinks",
     .type = RT_SET_MAP,
     .doc = "name = { type = \"sqlite\", ... }: where rules write rows (docs/SINKS.md)",
     .offset = OFF(sinks)},
    {.name = NULL},
};

#define L_OFF(f) offsetof(rt_listen_t, f)
#define T_OFF(f) offsetof(rt_conf_tls_t, f)
#define R_OFF(f) offsetof(rt_conf_rate_t, f)
#define S_OFF(f) offsetof(rt_conf_sni_t, f)
#define H_OFF(f) (offsetof(rt_conf_t, http.f) - offsetof(rt_conf_t, http))
#define FIELD(type_, f, off, sz, d, h)                                                             \
    {                                                                                              \
        .name = f, .type = type_, .text = d, .doc = h, .offset = off, .size = sz                   \
    }
#define RATE(f, u, h)                                                                              \
    {                                                                                              \
        .name = "listeners[].rate_limit." #f, .type = RT_SET_NUMBER, .unit = u, .min = 0,          \
        .max = 1e15, .doc = h, .offset = R_OFF(f)                                                  \
    }
#define X_OFF(f) offsetof(rt_conf_xmpp_t, f)
#define A_OFF(f) offsetof(rt_conf_auto_sub_t, f)
#define W_OFF(f) offsetof(rt_conf_rewrite_t, f)
#define AU_OFF(f) offsetof(rt_conf_auth_t, f)
#define AUTH_INT(f, d, lo, hi, u, h)                                                               \
    {                                                                                              \
        .name = "auth[]." #f, .type = RT_SET_INT, .offset = AU_OFF(f), .num = d, .min = lo,        \
        .max = hi, .unit = u, .doc = h                                                             \
    }
#define AUTH_TEXT(f, d, h)                                                                         \
    {                                                                                              \
        .name = "auth[]." #f, .type = RT_SET_STRING, .offset = AU_OFF(f),                          \
        .size = sizeof(((rt_conf_auth_t *)0)->f), .text = d, .doc = h                              \
    }
#define BR_OFF(f) offsetof(rt_conf_bridge_t, f)
#define BRIDGE_INT(f, d, lo, hi, u, h)                                                             \
    {                                                                                              \
        .name = "bridges.<name>." #f, .type = RT_SET_INT, .offset = BR_OFF(f), .num = d,           \
        .min = lo, .max = hi, .unit = u, .doc = h                                                  \
    }
#define BRIDGE_TEXT(f, d, h)                                                                       \
    {                                                                                              \
        .name = "bridges.<name>." #f, .type = RT_SET_STRING, .offset = BR_OFF(f),                  \
        .size = sizeof(((rt_conf_bridge_t *)0)->f), .text = d, .doc = h                            \
    }
#define TENANT_INT(f, u, h)                                                                        \
    {                                                                                              \
        .name = "tenants.<mountpoint>." #f, .type = RT_SET_INT,                                    \
        .offset = offsetof(rt_conf_tenant_t, f), .num = -1, .min = -1, .max = 1e12, .unit = u,     \
        .doc = h                                                                                   \
    }
#define XMPP_INT(f, d, lo, hi, u, h)                                                               \
    {                                                                                              \
        .name = "xmpp." #f, .type = RT_SET_INT, .num = d, .unit = u, .min = lo, .max = hi,         \
        .doc = h, .offset = X_OFF(f)                                                               \
    }
static const char *const resource_conflicts[] = {"replace", "refuse", NULL};
const char *const rt_conf_tls_verify_names[] = {"none", "optional", "required", "request", NULL};
static const char *const tls_versions[] = {"1.2", "1.3", NULL};

/*
** The keys of the tables: a listener's (its tls and rate_limit tables), http's (its tls is a
** listener's), a user's rate limit (a listener's rate_limit), the cluster's, xmpp's (its
** listeners are listeners[] tables). Offsets are in the struct the table fills: rt_listen_t,
** rt_conf_tls_t, rt_conf_sni_t, rt_conf_rate_t, the http struct of rt_conf_t, rt_conf_t for
** the cluster, rt_conf_xmpp_t.
*/
const rt_setting_t rt__conf_table_settings[] = {
    {.name = "listeners[].bind",
     .type = RT_SET_ADDRESS,
     .offset = L_OFF(host),
     .doc = "\"host:port\" with a numeric host, \"[v6]:port\" for IPv6 (required in a table)"},
    {.name = "listeners[].tls",
     .type = RT_SET_TABLE,
     .offset = L_OFF(tls),
     .doc = "TLS on this listener: the listeners[].tls keys (docs/TRANSPORTS.md)"},
    FIELD(RT_SET_STRING, "listeners[].websocket", L_OFF(websocket),
          sizeof(((rt_listen_t *)0)->websocket), "",
          "WebSocket on this path (it starts with /): MQTT, or XMPP on xmpp.listeners (RFC "
          "7395); \"\": none"),
    FIELD(RT_SET_STRING, "listeners[].mountpoint", L_OFF(mountpoint),
          sizeof(((rt_listen_t *)0)->mountpoint), "",
          "a tenant's prefix: its clients' topics, filters and client ids live under it, %u "
          "and %c the user name and client id (it ends with /; docs/TENANTS.md); \"\": none"),
    {.name = "listeners[].proxy_protocol",
     .type = RT_SET_BOOL,
     .offset = L_OFF(proxy_protocol),
     .doc = "a PROXY protocol header (v1 or v2) comes first on every connection (needs "
            "trusted_proxies)"},
    {.name = "listeners[].starttls",
     .type = RT_SET_BOOL,
     .offset = L_OFF(starttls),
     .doc = "TLS starts when the client asks (XMPP STARTTLS, RFC 6120 5) instead of at accept; "
            "xmpp.listeners only, needs tls (its certificate)"},
    {.name = "listeners[].s2s",
     .type = RT_SET_BOOL,
     .offset = L_OFF(s2s),
     .doc = "other XMPP servers' streams (federation, RFC 6120 server-to-server; port 5269) "
            "instead of clients'; xmpp.listeners only, not WebSocket"},
    {.name = "listeners[].trusted_proxies",
     .type = RT_SET_NETS,
     .text = "{}",
     .offset = L_OFF(trusted_proxies),
     .doc = "the load balancers: PROXY headers and X-Forwarded-For are taken from these only"},
    {.name = "listeners[].rate_limit",
     .type = RT_SET_TABLE,
     .offset = L_OFF(rate_limit),
     .doc = "per client: token buckets of PUBLISH packets and bytes read (the "
            "listeners[].rate_limit keys); none by default"},
    RATE(messages, "messages/s", "PUBLISH packets a second; 0 = no limit"),
    RATE(bytes, "bytes/s", "bytes read a second; 0 = no limit"),
    RATE(burst_messages, "messages", "the bucket's size; 0 = one second's worth"),
    RATE(burst_bytes, "bytes", "the bucket's size; 0 = one second's worth"),
    FIELD(RT_SET_PATH, "listeners[].tls.cert", T_OFF(cert), RT_CONF_PATH_MAX, NULL,
          "the certificate chain served without a matching SNI name (PEM; required)"),
    FIELD(RT_SET_PATH, "listeners[].tls.key", T_OFF(key), RT_CONF_PATH_MAX, NULL,
          "the private key of cert (PEM; required)"),
    FIELD(RT_SET_PATH, "listeners[].tls.ca", T_OFF(ca), RT_CONF_PATH_MAX, "",
          "client certificates are verified against it; \"\": none"),
    FIELD(RT_SET_PATH, "listeners[].tls.crl", T_OFF(crl), RT_CONF_PATH_MAX, "",
          "revoked client certificates; \"\": no revocation check"),
    {.name = "listeners[].tls.verify",
     .type = RT_SET_STRING,
     .text = "none",
     .choices = rt_conf_tls_verify_names,
     .offset = T_OFF(verify),
     .doc = "client certificates asked for: none, optional, required, or request (asked for "
            "and verified but never refused: an XMPP s2s listener's, where a verified one "
            "allows SASL EXTERNAL and any other means dialback); all but none need ca"},
    {.name = "listeners[].tls.identity_as_username",
     .type = RT_SET_BOOL,
     .offset = T_OFF(identity_as_username),
     .doc = "the client certificate's subject CN is the user name (needs verify = \"required\"; "
            "not for http.tls)"},
    {.name = "listeners[].tls.min_version",
     .type = RT_SET_STRING,
     .text = "1.2",
     .choices = tls_versions,
     .offset = T_OFF(min_version),
     .doc = "the oldest TLS version accepted"},
    {.name = "listeners[].tls.sni",
     .type = RT_SET_LIST,
     .offset = T_OFF(sni),
     .doc = "up to 4 { name = ..., cert = ..., key = ... }: a certificate for the clients that ask "
            "for name"},
    FIELD(RT_SET_STRING, "listeners[].tls.sni[].name", S_OFF(name),
          sizeof(((rt_conf_sni_t *)0)->name), NULL,
          "a host name, or \"*.domain\" for any one label in front of domain (required)"),
    FIELD(RT_SET_PATH, "listeners[].tls.sni[].cert", S_OFF(cert), RT_CONF_PATH_MAX, NULL,
          "the certificate chain served to name (PEM; required)"),
    FIELD(RT_SET_PATH, "listeners[].tls.sni[].key", S_OFF(key), RT_CONF_PATH_MAX, NULL,
          "its private key (PEM; required)"),
    {.name = "http.bind",
     .type = RT_SET_ADDRESS,
     .offset = H_OFF(where),
     .doc = "\"host:port\" of the HTTP listener (required)"},
    {.name = "http.tls",
     .type = RT_SET_TABLE,
     .offset = H_OFF(where.tls),
     .doc = "HTTPS: the listeners[].tls keys but identity_as_username (an API client is named by "
            "its key)"},
    FIELD(RT_SET_PATH, "http.api_keys_file", H_OFF(api_keys_file), RT_CONF_PATH_MAX, "",
          "name role sha256 lines (rtd apikey, rtctl apikey); \"\": no API, health and /metrics "
          "only"),
    {.name = "http.metrics_public",
     .type = RT_SET_BOOL,
     .offset = H_OFF(metrics_public),
     .doc = "/metrics without an API key"},
    {.name = "http.request_timeout",
     .type = RT_SET_INT,
     .num = RT_CONF_HTTP_REQUEST_TIMEOUT,
     .unit = "seconds",
     .min = 1,
     .max = RT_CONF_HTTP_REQUEST_TIMEOUT_MAX,
     .offset = H_OFF(request_timeout),
     .doc = "a request must arrive whole within it of its first byte (slowloris); the first, TLS "
            "handshake included, within it of accept; an upload's body (xmpp.upload_host) must "
            "bring 16 KiB within each, and a download's reader take as much"},
    {.name = "auto_subscribe[].topic",
     .type = RT_SET_STRING,
     .offset = A_OFF(topic),
     .size = sizeof(((rt_conf_auto_sub_t *)0)->topic),
     .text = "",
     .doc = "a topic filter; %c: the client id, %u: the user name (a client without one is not "
            "subscribed to it), %%: a %"},
    {.name = "auto_subscribe[].qos",
     .type = RT_SET_INT,
     .offset = A_OFF(qos),
     .min = 0,
     .max = 2,
     .doc = "the subscription's QoS"},
    {.name = "auto_subscribe[].no_local",
     .type = RT_SET_BOOL,
     .offset = A_OFF(no_local),
     .doc = "not the client's own messages (MQTT 5's No Local)"},
    {.name = "auto_subscribe[].retain_as_published",
     .type = RT_SET_BOOL,
     .offset = A_OFF(retain_as_published),
     .doc = "the retain flag as published (MQTT 5's Retain As Published)"},
    {.name = "auto_subscribe[].retain_handling",
     .type = RT_SET_INT,
     .offset = A_OFF(retain_handling),
     .min = 0,
     .max = 2,
     .doc = "retained messages: 0 at every CONNECT, 1 when the subscription is new, 2 never"},
    {.name = "auth[].kind",
     .type = RT_SET_STRING,
     .offset = AU_OFF(kind),
     .text = "file",
     .choices = authn_kinds,
     .doc = "file: password_file's users; jwt: a JSON Web Token in the password; http: a "
            "call to a service, cached"},
    AUTH_TEXT(secret_file, "", "jwt: a file holding HS256's shared secret"),
    AUTH_TEXT(public_key, "", "jwt: a PEM public key, RSA (RS256) or P-256 (ES256)"),
    AUTH_TEXT(jwks_file, "", "jwt: a JWKS file of RSA and P-256 keys, picked by the token's kid"),
    AUTH_TEXT(audience, "", "jwt: the aud the token must name; \"\": not checked"),
    AUTH_TEXT(issuer, "", "jwt: the iss the token must carry; \"\": not checked"),
    AUTH_TEXT(username_claim, "", "jwt: a claim that must equal the user name; \"\": none"),
    AUTH_TEXT(client_id_claim, "", "jwt: a claim that must equal the client id; \"\": none"),
    AUTH_TEXT(acl_claim, "acl",
              "jwt: a claim {pub = [...], sub = [...], all = [...]} of topics (%u, %c) that "
              "is the client's ACL"),
    AUTH_TEXT(mountpoint_claim, "mountpoint",
              "jwt: a claim that is the client's mountpoint, in place of its listener's "
              "(docs/TENANTS.md)"),
    {.name = "auth[].disconnect_after_expire",
     .type = RT_SET_BOOL,
     .offset = AU_OFF(disconnect_after_expire),
     .num = 1,
     .doc = "jwt: the connection ends when the token expires, http: at the answer's "
            "expire_at (MQTT 5 reason 0xA0)"},
    AUTH_TEXT(url, "", "http: the http:// or https:// URL logins are POSTed to, as JSON"),
    AUTH_TEXT(ca_file, "",
              "http: the CA an https URL's certificate is verified against; "
              "\"\": the system's"),
    AUTH_INT(timeout_ms, 5000, 100, 60000, "ms",
             "http: a call's whole time (connect, TLS, answer); past it the service is down"),
    AUTH_INT(pool_size, 8, 1, 64, "calls",
             "http: calls at once: threads of their own, and kept-alive connections"),
    AUTH_INT(cache_ttl_s, 60, 0, 86400, "seconds",
             "http: how long an answer, a refusal too, is reused for the same user name and "
             "password; 0: every login calls"),
    AUTH_INT(cache_max, 100000, 8, 10000000, "answers",
             "http: answers cached (about 100 bytes each, and an ACL's text)"),
    {.name = "auth[].on_error",
     .type = RT_SET_STRING,
     .offset = AU_OFF(on_error),
     .text = "deny",
     .choices = authn_on_errors,
     .doc = "http: the service cannot answer: deny (0x88), ignore (the next authenticator "
            "judges), or cache (admit users whose answer is cached, even past its TTL)"},
    {.name = "auth[].send_password_hash",
     .type = RT_SET_BOOL,
     .offset = AU_OFF(send_password_hash),
     .doc = "http: send the password's SHA-256 (hex) instead of the password"},
    {.name = "rewrite[].action",
     .type = RT_SET_STRING,
     .offset = W_OFF(action),
     .text = "all",
     .choices = rewrite_actions,
     .doc = "what it rewrites: PUBLISH topics, SUBSCRIBE and UNSUBSCRIBE filters, or all"},
    {.name = "rewrite[].source",
     .type = RT_SET_STRING,
     .offset = W_OFF(source),
     .size = sizeof(((rt_conf_rewrite_t *)0)->source),
     .text = "",
     .doc = "a topic filter: the topics (or filters, level by level) it applies to"},
    {.name = "rewrite[].re",
     .type = RT_SET_STRING,
     .offset = W_OFF(re),
     .size = sizeof(((rt_conf_rewrite_t *)0)->re),
     .text = "",
     .doc = "a POSIX extended regular expression the whole topic must match"},
    {.name = "rewrite[].dest",
     .type = RT_SET_STRING,
     .offset = W_OFF(dest),
     .size = sizeof(((rt_conf_rewrite_t *)0)->dest),
     .text = "",
     .doc = "the new topic: $1 to $9 are re's groups"},
    BRIDGE_TEXT(remote, "",
                "the other broker: mqtt://host:port, or mqtts://host:port over TLS "
                "(required)"),
    {.name = "bridges.<name>.out",
     .type = RT_SET_LIST,
     .offset = BR_OFF(out),
     .doc = "what goes to the remote: \"local/filter -> remote/topic\" or a filter kept as it is, "
            "a list of up to 8"},
    {.name = "bridges.<name>.in",
     .type = RT_SET_LIST,
     .offset = BR_OFF(in),
     .doc = "what comes from the remote: \"remote/filter -> local/topic\" or a filter, up to 8"},
    BRIDGE_INT(version, 5, 4, 5, NULL, "MQTT version spoken to the remote: 4 (3.1.1) or 5"),
    BRIDGE_INT(qos, 1, 0, 1, NULL,
               "QoS of the subscriptions on both sides and of the PUBLISHes sent (0 or 1)"),
    BRIDGE_TEXT(client_id, "", "the client id at the remote; \"\": rtd-bridge-<name>"),
    BRIDGE_TEXT(username, "", "user name at the remote; \"\": none"),
    {.name = "bridges.<name>.password",
     .type = RT_SET_STRING,
     .offset = BR_OFF(password),
     .size = sizeof(((rt_conf_bridge_t *)0)->password),
     .text = "",
     .secret = true,
     .doc = "password at the remote; \"\": none"},
    {.name = "bridges.<name>.clean_start",
     .type = RT_SET_BOOL,
     .offset = BR_OFF(clean_start),
     .doc = "start a new session at the remote at each connect (false: resume it)"},
    BRIDGE_INT(session_expiry_s, 3600, 0, 4294967295.0, "seconds",
               "MQTT 5: how long the remote keeps the bridge's session while it is away"),
    BRIDGE_INT(keepalive_s, 60, 5, 65535, "seconds", "the keep-alive the bridge asks for"),
    BRIDGE_INT(max_inflight, 32, 1, 65535, "messages",
               "QoS 1 PUBLISHes out waiting for the remote's PUBACK"),
    BRIDGE_INT(max_queue_bytes, 256 << 20, 4096, 1e12, "bytes",
               "of messages out held while the remote is away or slow, memory and spill file "
               "together; past it the newest are dropped, counted"),
    BRIDGE_INT(max_memory_bytes, 8 << 20, 4096, 1e12, "bytes",
               "of messages out held in memory; past it QoS 1 ones wait in the spill file "
               "(data_dir/bridge-<name>.db), QoS 0 ones are dropped"),
    {.name = "bridges.<name>.spill",
     .type = RT_SET_BOOL,
     .offset = BR_OFF(spill),
     .num = 1,
     .doc = "keep QoS 1 messages out past max_memory_bytes in the spill file, where a restart "
            "finds them (false: drop them, counted)"},
    BRIDGE_INT(connect_timeout_ms, 5000, 100, 600000, "ms", "TCP connect and CONNACK"),
    BRIDGE_INT(reconnect_min_ms, 200, 10, 600000, "ms", "first wait before reconnecting"),
    BRIDGE_INT(reconnect_max_ms, 10000, 10, 3600000, "ms", "the wait's cap (it doubles)"),
#define BRIDGE_PATH(f, h)                                                                          \
    {                                                                                              \
        .name = "bridges.<name>." #f, .type = RT_SET_PATH, .offset = BR_OFF(f),                    \
        .size = sizeof(((rt_conf_bridge_t *)0)->f), .text = "", .doc = h                           \
    }
    BRIDGE_PATH(ca_file, "mqtts: the CAs the remote's certificate is verified against; \"\": the "
                         "system's"),
    BRIDGE_PATH(cert_file, "mqtts: a client certificate (PEM) for a remote that asks for one"),
    BRIDGE_PATH(key_file, "mqtts: its private key (PEM)"),
    BRIDGE_TEXT(server_name, "",
                "mqtts: the name the remote's certificate must carry, sent as SNI; \"\": the "
                "remote's host"),
    {.name = "bridges.<name>.tls_verify",
     .type = RT_SET_BOOL,
     .offset = BR_OFF(tls_verify),
     .num = 1,
     .doc = "mqtts: verify the remote's certificate and name (false: any certificate; for "
            "tests)"},
    {.name = "bridges.<name>.durable",
     .type = RT_SET_BOOL,
     .offset = BR_OFF(durable),
     .doc = "a local QoS 1 PUBLISH bridged out is acknowledged only once the remote has it"},
    {.name = "tenants.<mountpoint>",
     .type = RT_SET_TABLE,
     .doc = "the tenant's quotas: max_connections, max_subscriptions, max_publish_rate, "
            "max_retained_bytes (-1, the default: the tenant_max_* setting; 0: unlimited)"},
    TENANT_INT(max_connections, "connections", "connections at once"),
    TENANT_INT(max_subscriptions, "subscriptions", "subscriptions its sessions hold"),
    TENANT_INT(max_publish_rate, "messages/s", "PUBLISHes a second, its clients together"),
    TENANT_INT(max_retained_bytes, "bytes", "bytes of retained messages under its mountpoint"),
    {.name = "user_rate_limits.<user>",
     .type = RT_SET_TABLE,
     .doc = "the user's rate limit, in place of its listener's: the listeners[].rate_limit keys"},
    {.name = "cluster.node",
     .offset = OFF(cluster.node),
     .size = SIZE(cluster.node),
     .type = RT_SET_STRING,
     .doc = "this node's name: 1 to 32 of A-Z a-z 0-9 _ -, unique in the cluster (required)"},
    {.name = "cluster.nats",
     .offset = OFF(cluster.nats),
     .type = RT_SET_LIST,
     .doc = "the NATS servers: a nats:// or tls:// URL or a list of up to 8 (required)"},
    {.name = "cluster.prefix",
     .offset = OFF(cluster.prefix),
     .size = SIZE(cluster.prefix),
     .type = RT_SET_STRING,
     .text = "rt",
     .doc = "first token of every NATS subject rtd uses (A-Z a-z 0-9 _ -)"},
    {.name = "cluster.replicas",
     .type = RT_SET_INT,
     .text = "min(3, NATS URLs)",
     .min = 1,
     .max = 5,
     .unit = "copies",
     .doc = "JetStream keeps of the buckets and the stream",
     .offset = OFF(cluster.replicas)},
    {.name = "cluster.durable",
     .type = RT_SET_BOOL,
     .num = false,
     .doc = "true: a QoS 1/2 PUBLISH is acknowledged once JetStream's stream has it",
     .offset = OFF(cluster.durable)},
    {.name = "cluster.replay_margin",
     .type = RT_SET_INT,
     .num = RT_CONF_REPLAY_MARGIN,
     .min = 0,
     .max = 3600,
     .unit = "seconds",
     .doc = "a resume after a node's crash replays from before the session's last clear moment",
     .offset = OFF(cluster.replay_margin)},
    CLUSTER(user, RT_SET_STRING, "NATS user name (with password)"),
    {.name = "cluster.password",
     .type = RT_SET_STRING,
     .text = "",
     .secret = true,
     .doc = "NATS password of user",
     .offset = OFF(cluster.password),
     .size = SIZE(cluster.password)},
    {.name = "cluster.token",
     .type = RT_SET_STRING,
     .text = "",
     .secret = true,
     .doc = "NATS authorization token",
     .offset = OFF(cluster.token),
     .size = SIZE(cluster.token)},
    CLUSTER(creds, RT_SET_PATH, "NATS credentials file (a user JWT and its nkey seed)"),
    CLUSTER(nkey, RT_SET_STRING, "NATS user nkey (public, U...), signed with nkey_seed"),
    CLUSTER(nkey_seed, RT_SET_PATH, "file holding the seed (SU...) of nkey"),
    CLUSTER(tls_ca, RT_SET_PATH, "CA the NATS servers' certificates are verified against (TLS)"),
    CLUSTER(tls_cert, RT_SET_PATH, "client certificate for NATS (with tls_key)"),
    CLUSTER(tls_key, RT_SET_PATH, "private key of tls_cert"),
    {.name = "cluster.nats_without_credentials",
     .type = RT_SET_BOOL,
     .num = false,
     .doc = "true: NATS servers off this host are reached with no credentials (rtd refuses to "
            "start so otherwise): whoever reaches them can read every message and steer the "
            "cluster",
     .offset = OFF(cluster.nats_without_credentials)},
    CLUSTER(secret_file, RT_SET_PATH,
            "the nodes' shared secret, signing their control requests and answers; false: "
            "unsigned (docs/CLUSTER.md \"Security\"; required)"),
    {.name = "xmpp.hosts",
     .type = RT_SET_LIST,
     .offset = X_OFF(hosts),
     .doc = "the domains served: a name or a list of up to 16, ASCII letters, digits, - and . "
            "(an IDN as its A-label, xn--...; required)"},
    {.name = "xmpp.anonymous",
     .type = RT_SET_LIST,
     .text = "{}",
     .offset = X_OFF(anonymous),
     .doc = "the hosts (of hosts) where SASL ANONYMOUS logs in"},
    {.name = "xmpp.register",
     .type = RT_SET_LIST,
     .text = "{}",
     .offset = X_OFF(registration),
     .doc = "the hosts (of hosts) where clients may create, change and cancel their own "
            "accounts in-band (XEP-0077), inside TLS or from plaintext_from"},
    XMPP_INT(register_rate, 6, 1, 100000, "per hour",
             "registrations one address may try (an IPv6 address: its /64): as many at once, "
             "then one each 3600/rate seconds; past it resource-constraint"),
    {.name = "xmpp.listeners",
     .type = RT_SET_LIST,
     .text = "\"0.0.0.0:5222\"",
     .offset = X_OFF(listeners),
     .doc = "XMPP listeners, up to 8: \"host:port\" or a table of the listeners[] keys; tls "
            "without starttls is direct TLS (XEP-0368), websocket is RFC 7395"},
    {.name = "xmpp.plaintext_from",
     .type = RT_SET_NETS,
     .text = "{ \"127.0.0.0/8\", \"::1/128\" }",
     .offset = X_OFF(plaintext_from),
     .doc = "addresses that may authenticate without TLS: \"a.b.c.d/n\", \"v6/n\" or a list"},
    XMPP_INT(max_stanza_size, 256 * KIB, 1024, 64 * MIB, "bytes",
             "one stanza may have; a bigger one ends the stream"),
    {.name = "xmpp.resource_conflict",
     .type = RT_SET_STRING,
     .text = "replace",
     .choices = resource_conflicts,
     .offset = X_OFF(resource_conflict),
     .size = sizeof(((rt_conf_xmpp_t *)0)->resource_conflict),
     .doc = "a bind to a resource in use: replace (the older session is ended, as ejabberd does) "
            "or refuse (conflict)"},
    XMPP_INT(max_resources, 16, 1, 1000, "sessions", "of one account at once"),
    XMPP_INT(max_roster_items, 1000, 1, 100000, "items", "in one account's roster"),
    XMPP_INT(max_offline_messages, 1000, 0, 1000000, "messages",
             "kept for an account while it is offline; 0 = none"),
    XMPP_INT(max_offline_bytes, 1 * MIB, 0, 1e9, "bytes",
             "of the messages kept for an account while it is offline"),
    XMPP_INT(idle_timeout, 300, 0, 86400, "seconds",
             "without a byte from a client before it is pinged (XEP-0199), and as long again "
             "before it is dropped; 0 = never"),
    {.name = "xmpp.channel_binding",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(channel_binding),
     .doc = "offer SCRAM-*-PLUS inside TLS (tls-exporter on TLS 1.3, tls-server-end-point); "
            "false serves clients that only bind with tls-unique (slixmpp before 1.8.5)"},
    XMPP_INT(resume_timeout, 300, 0, 86400, "seconds",
             "a session whose connection dropped waits this long to be resumed (XEP-0198); "
             "0 = no resumption"),
    XMPP_INT(max_vcard_size, 64 * KIB, 256, 1 * MIB, "bytes",
             "of one account's vCard (XEP-0054); a bigger one is refused with not-acceptable"),
    {.name = "xmpp.archive",
     .type = RT_SET_BOOL,
     .num = 0,
     .offset = X_OFF(archive),
     .doc = "keep each account's chats in xmpp.db for XEP-0313 queries (Message Archive "
            "Management); false: nothing archived, the feature not offered"},
    XMPP_INT(max_archive_messages, 10000, 1, 10000000, "messages",
             "archived for one account; past it the oldest are dropped"),
    {.name = "xmpp.muc_host",
     .type = RT_SET_STRING,
     .text = "",
     .offset = X_OFF(muc_host),
     .size = sizeof(((rt_conf_xmpp_t *)0)->muc_host),
     .doc = "the group chat service's domain (XEP-0045), @HOST@ standing for each of hosts: "
            "\"conference.@HOST@\" serves rooms at room@conference.example.org; \"\": none"},
    XMPP_INT(muc_max_occupants, 200, 1, 100000, "occupants",
             "in one room; a join past it is refused with service-unavailable"),
    XMPP_INT(muc_history, 20, 0, 1000, "messages",
             "a room keeps and sends to each occupant joining it"),
    XMPP_INT(muc_history_bytes, 256 * KIB, 1024, 64 * MIB, "bytes",
             "of the history one room keeps: past it the oldest go (a message bigger than this "
             "is sent on and not kept)"),
    XMPP_INT(muc_max_rooms_per_user, 100, 1, 10000000, "rooms",
             "one user (a bare JID) has made and that still exist; a join that would make one "
             "more is refused with not-allowed (a temporary room ends with its last occupant)"),
    XMPP_INT(muc_max_rooms, 10000, 1, 10000000, "rooms",
             "on this node at once; a join that would make one more is refused with "
             "resource-constraint"),
    XMPP_INT(muc_message_rate, 50, 0, 1000000, "per second",
             "groupchat messages one occupant may send (as many at once); past it "
             "resource-constraint; 0 = no limit"),
    {.name = "xmpp.muc_room_locking",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(muc_room_locking),
     .doc = "a room made by a join lets nobody else in (item-not-found) until its owner "
            "configures it, the instant-room form or the full one (XEP-0045 7.2.10, as "
            "Prosody); false: open at once (as ejabberd)"},
    {.name = "xmpp.sasl2",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(sasl2),
     .doc = "offer SASL2 (XEP-0388) beside RFC 6120's SASL, with Bind2 (XEP-0386) and stream "
            "management inline: a login in one round trip fewer, bound with no stream restart; "
            "false: RFC 6120's alone"},
    {.name = "xmpp.fast",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(fast),
     .doc = "offer FAST (XEP-0484) inside SASL2: a client that logged in with its password may "
            "ask for a token (HT-SHA-256-NONE) and log in with it later, without the password "
            "or SCRAM's cost; false: none issued or taken"},
    XMPP_INT(fast_token_lifetime, 14 * 86400, 60, 365 * 86400, "seconds",
             "a FAST token is good for from its issue; a password change ends every token of "
             "the account"),
    {.name = "xmpp.pep",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(pep),
     .doc = "each account is a pubsub service of its own (PEP, XEP-0163: avatars, nicknames, "
            "OMEMO keys, bookmarks), kept in xmpp.db; false: not offered"},
    XMPP_INT(pep_max_nodes, 64, 1, 100000, "nodes",
             "of one account's PEP service; a publish that would make one more is refused "
             "with not-acceptable"),
    XMPP_INT(pep_max_items, 256, 1, 100000, "items",
             "one PEP node keeps at most, whatever its pubsub#max_items asks (\"max\" is this)"),
    XMPP_INT(pep_max_bytes, 1 * MIB, 1024, 1e9, "bytes",
             "of all the items one account's PEP nodes keep; a publish past it is refused "
             "with not-acceptable"),
    {.name = "xmpp.upload_host",
     .type = RT_SET_STRING,
     .text = "",
     .offset = X_OFF(upload_host),
     .size = sizeof(((rt_conf_xmpp_t *)0)->upload_host),
     .doc = "the HTTP file upload service's domain (XEP-0363), @HOST@ standing for each of "
            "hosts as in muc_host: \"upload.@HOST@\" hands out slots whose files the http "
            "listener takes and serves (it must be on); \"\": none"},
    {.name = "xmpp.upload_url",
     .type = RT_SET_STRING,
     .text = "",
     .offset = X_OFF(upload_url),
     .size = sizeof(((rt_conf_xmpp_t *)0)->upload_url),
     .doc = "the URL clients reach the http listener at, @HOST@ standing for the uploader's "
            "host, as \"https://@HOST@:5443\" (a proxy's in front of rtd); \"\": http or "
            "https (http.tls) at the host's domain and the listener's port"},
    XMPP_INT(upload_max_size, 10 * MIB, 1, 1e11, "bytes",
             "of one uploaded file; a bigger slot is refused with file-too-large"),
    XMPP_INT(upload_quota, 100 * MIB, 0, 1e13, "bytes",
             "of one account's uploaded files and open slots; a slot past it is refused with "
             "resource-constraint; 0 = no limit"),
    XMPP_INT(upload_expire, 7 * 86400, 0, 10 * 365 * 86400.0, "seconds",
             "an uploaded file is served for, from its upload; then it is deleted; 0 = kept"),
    XMPP_INT(upload_slot_timeout, 300, 1, 86400, "seconds",
             "a slot waits for its PUT; a PUT after it is refused (403)"),
    {.name = "xmpp.s2s_peers",
     .type = RT_SET_LIST,
     .text = "{}",
     .offset = X_OFF(s2s_peers),
     .doc = "where other servers' domains are reached for federation, \"domain=host:port\" "
            "with a numeric host, in place of DNS (a private deployment, a test)"},
    {.name = "xmpp.s2s_dns",
     .type = RT_SET_BOOL,
     .num = 1,
     .offset = X_OFF(s2s_dns),
     .doc = "a domain not in s2s_peers is looked up in DNS, as RFC 6120 3.2 says: the SRV "
            "records of _xmpp-server._tcp.DOMAIN, else the domain's own addresses on 5269 "
            "(the system's resolver: /etc/resolv.conf, /etc/hosts); false: only s2s_peers' "
            "domains are reached"},
    {.name = "xmpp.s2s_secure",
     .type = RT_SET_BOOL,
     .offset = X_OFF(s2s_secure),
     .doc = "federate only with servers whose certificates prove their domains (as Prosody's "
            "s2s_secure_auth): incoming streams must use SASL EXTERNAL (dialback is refused), "
            "outgoing ones verify the other server's certificate against the s2s listener's ca "
            "(the system's store without one) and its name, and use EXTERNAL; false: "
            "dialback where certificates do not prove it"},
    {.name = "xmpp.cluster_home",
     .type = RT_SET_STRING,
     .text = "",
     .offset = X_OFF(cluster_home),
     .size = sizeof(((rt_conf_xmpp_t *)0)->cluster_home),
     .doc = "in a cluster, the node (its cluster.node) whose xmpp.db keeps every node's "
            "accounts, rosters, offline messages and archive, and whose rooms every node's "
            "users join: the other nodes ask it (docs/CLUSTER.md, \"XMPP across the nodes\"); "
            "the same on every node; \"\": each node keeps its own"},
    XMPP_INT(s2s_queue_bytes, 1 * MIB, 1024, 64 * MIB, "bytes",
             "of stanzas waiting for one outgoing server-to-server stream to be set up; past "
             "it they are bounced with resource-constraint"),
    {.name = NULL},
};

static const rt_setting_t *tables[RT_CONF_MAX_TABLES] = {rt__conf_settings,
                                                         rt__conf_table_settings};
static unsigned ntables = 2;

void rt_conf_schema_add(const rt_setting_t *table)
{
    for (unsigned i = 0; i < ntables; i++)
        if (tables[i] == table)
            return; /* added by an earlier start (the tests start the sinks many times) */
    RT_ASSERT(ntables < RT_CONF_MAX_TABLES);
    tables[ntables++] = table;
}

void rt_conf_schema_each(void (*fn)(const rt_setting_t *s, void *ud), void *ud)
{
    for (unsigned t = 0; t < ntables; t++)
        for (const rt_setting_t *s = tables[t]; s->name; s++)
            fn(s, ud);
}

size_t rt__conf_nsettings(void)
{
    size_t n = 0;
    while (rt__conf_settings[n].name)
        n++;
    return n;
}

void rt_conf_choices_text(const char *const *choices, char *out, size_t n)
{
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; choices[i] && at < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%s%s",
                               i == 0           ? ""
                               : choices[i + 1] ? ", "
                                                : " or ",
                               choices[i]);
}

void rt__conf_scalar_default(const rt_setting_t *s, void *field)
{
    if (s->type == RT_SET_INT && !s->text)
        *(long *)field = (long)s->num;
    else if (s->type == RT_SET_NUMBER)
        *(double *)field = s->num;
    else if (s->type == RT_SET_BOOL)
        *(bool *)field = s->num != 0;
    else if ((s->type == RT_SET_STRING || s->type == RT_SET_PATH) && s->size && s->text)
        snprintf(field, s->size, "%s", s->text);
    else if (s->type == RT_SET_STRING && s->choices && s->text)
        for (int i = 0; s->choices[i]; i++)
            if (strcmp(s->choices[i], s->text) == 0)
                *(int *)field = i;
}

bool rt__conf_scalar_text(const rt_setting_t *s, const void *field, char *out, size_t n)
{
    switch (s->type) {
    case RT_SET_INT:
        snprintf(out, n, "%ld", *(const long *)field);
        return true;
    case RT_SET_NUMBER:
        snprintf(out, n, "%g", *(const double *)field);
        return true;
    case RT_SET_BOOL:
        snprintf(out, n, "%s", *(const bool *)field ? "true" : "false");
        return true;
    case RT_SET_STRING:
    case RT_SET_PATH:
        if (s->size)
            snprintf(out, n, "%s", (const char *)field);
        else if (s->choices)
            snprintf(out, n, "%s", s->choices[*(const int *)field]);
        else
            return false;
        return true;
    default:
        return false;
    }
}

/* A number as rtd.conf would best write it: 16 MiB as 16 * 1024 * 1024. */
static void format_number(double v, char *out, size_t n)
{
    if (v >= 1024 * 1024 && fmod(v, 1024 * 1024) == 0)
        snprintf(out, n, "%.0f * 1024 * 1024", v / (1024 * 1024));
    else if (v >= 64 * 1024 && fmod(v, 1024) == 0)
        snprintf(out, n, "%.0f * 1024", v / 1024);
    else
        snprintf(out, n, "%.15g", v);
}

void rt_conf_default_text(const rt_setting_t *s, char *out, size_t n)
{
    switch (s->type) {
    case RT_SET_INT:
    case RT_SET_NUMBER:
        if (s->text)
            snprintf(out, n, "%s", s->text); /* a default the loader works out */
        else
            format_number(s->num, out, n);
        break;
    case RT_SET_BOOL:
        snprintf(out, n, "%s", s->num ? "true" : "false");
        break;
    case RT_SET_STRING:
    case RT_SET_PATH:
        snprintf(out, n, s->text ? "\"%s\"" : "%s", s->text ? s->text : "");
        break;
    default:
        snprintf(out, n, "%s", s->text ? s->text : "");
    }
}

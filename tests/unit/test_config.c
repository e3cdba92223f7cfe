/* rtd's config loader: defaults, the shipped file, every kind of error with file and line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "config.h"

static char path[64];

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        if (strcmp((a), (b)) != 0)                                                                 \
            fprintf(stderr, "  \"%s\" != \"%s\"\n", (a), (b));                                     \
        CHECK(strcmp((a), (b)) == 0);                                                              \
    } while (0)

static void write_conf(const char *text)
{
    snprintf(path, sizeof(path), "/tmp/rt-test-config-%d.conf", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Loads text; returns the rc and leaves the error in err. */
static int load(const char *text, rt_conf_t *c, char *err)
{
    rt_conf_defaults(c);
    write_conf(text);
    err[0] = 0;
    return rt_conf_load(c, path, err, RT_CONF_ERR_LEN);
}

static bool err_is(const char *err, int line, const char *needle)
{
    char want[128];
    snprintf(want, sizeof(want), "%s:%d: ", path, line);
    bool ok = strncmp(err, want, strlen(want)) == 0 && strstr(err, needle);
    if (!ok)
        fprintf(stderr, "  unexpected error: %s (wanted line %d, \"%s\")\n", err, line, needle);
    return ok;
}

static bool conf_equal(const rt_conf_t *a, const rt_conf_t *b)
{
    bool same = a->nlisteners == b->nlisteners;
    for (unsigned i = 0; same && i < a->nlisteners; i++)
        same = strcmp(a->listeners[i].host, b->listeners[i].host) == 0 &&
               a->listeners[i].port == b->listeners[i].port;
    return same && a->max_connections == b->max_connections &&
           a->max_packet_size == b->max_packet_size && a->max_inflight == b->max_inflight &&
           a->max_queued_messages == b->max_queued_messages &&
           a->max_client_memory == b->max_client_memory &&
           a->max_topic_alias == b->max_topic_alias && a->max_keepalive == b->max_keepalive &&
           a->max_session_expiry == b->max_session_expiry && a->queue_qos0 == b->queue_qos0 &&
           a->allow_zero_length_clientid == b->allow_zero_length_clientid &&
           a->schedulers == b->schedulers && a->blocking_threads == b->blocking_threads &&
           a->batch == b->batch && a->min_heap == b->min_heap && a->gc_factor == b->gc_factor &&
           a->max_heap == b->max_heap && strcmp(a->data_dir, b->data_dir) == 0 &&
           strcmp(a->log_level, b->log_level) == 0;
}

static void test_shipped_file(void)
{
    rt_conf_t c, d;
    char err[RT_CONF_ERR_LEN] = "";
    rt_conf_defaults(&d);
    rt_conf_defaults(&c);
    /* The example documents the defaults: loading it changes nothing but the paths, which
       are made absolute against etc/ (and data_dir is the checkout's data/). */
    CHECK_EQ(rt_conf_load(&c, "etc/rtd.conf", err, sizeof(err)), 0);
    if (err[0])
        fprintf(stderr, "  %s\n", err);
    char cwd[512], want[600];
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(want, sizeof(want), "%s/etc/rules", cwd);
    CHECK(strcmp(c.rules_dir, want) == 0);
    snprintf(want, sizeof(want), "%s/data", cwd);
    CHECK(strcmp(c.data_dir, want) == 0);
    memcpy(d.data_dir, c.data_dir, sizeof(d.data_dir));
    CHECK(conf_equal(&c, &d));
    CHECK_EQ(c.allow_anonymous, true);
    CHECK_EQ(c.nanonymous_from, RT_CONF_NLOOPBACK);
    CHECK_EQ(c.nlisteners, 1);
    CHECK(strcmp(c.listeners[0].host, "0.0.0.0") == 0);
    CHECK_EQ(c.listeners[0].port, 1883);
    CHECK(!c.xmpp.on); /* the example's xmpp block is commented out */
}

/* The shipped file's commented-out xmpp block, uncommented, is a valid xmpp table. */
static void test_shipped_xmpp_example(void)
{
    FILE *f = fopen("etc/rtd.conf", "r");
    CHECK(f != NULL);
    if (!f)
        return;
    char line[256], text[4096] = "";
    size_t used = 0;
    bool in = false;
    while (fgets(line, sizeof(line), f) && used < sizeof(text)) {
        in = in || strncmp(line, "-- xmpp = {", 11) == 0;
        if (in)
            used += (size_t)snprintf(text + used, sizeof(text) - used, "%s", line + 3);
        if (in && strncmp(line, "-- }", 4) == 0)
            break;
    }
    fclose(f);
    CHECK(used > 0 && used < sizeof(text));
    rt_conf_t *c = malloc(sizeof(*c));
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(load(text, c, err), 0);
    if (err[0])
        fprintf(stderr, "  %s\n", err);
    CHECK(c->xmpp.on && c->xmpp.nhosts == 1 && c->xmpp.nlisteners == 4);
    CHECK(c->xmpp.listeners[0].starttls && c->xmpp.listeners[0].tls_on);
    CHECK(c->xmpp.listeners[1].tls_on && !c->xmpp.listeners[1].starttls);
    CHECK(c->xmpp.listeners[2].websocket[0] == '/');
    CHECK(c->xmpp.listeners[3].s2s && c->xmpp.listeners[3].starttls);
    CHECK(c->xmpp.s2s_dns && c->xmpp.ns2s_peers == 1 &&
          strcmp(c->xmpp.s2s_peers[0], "example.net=192.0.2.10:5269") == 0);
    free(c);
}

static void test_values(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(load("listeners = { \"127.0.0.1:1883\", \"[::1]:8883\" }\n"
                  "max_packet_size = 64 * 1024\n"
                  "max_client_memory = max_packet_size * 10 -- earlier settings can be used\n"
                  "queue_qos0 = true\n"
                  "gc_factor = 1.5\n"
                  "log_level = \"debug\"\n",
                  &c, err),
             0);
    CHECK_EQ(c.nlisteners, 2);
    CHECK(strcmp(c.listeners[1].host, "::1") == 0);
    CHECK_EQ(c.listeners[1].port, 8883);
    CHECK_EQ(c.max_packet_size, 65536);
    CHECK_EQ(c.max_client_memory, 655360);
    CHECK(c.queue_qos0);
    CHECK(c.gc_factor == 1.5);
    CHECK(strcmp(c.log_level, "debug") == 0);
    CHECK_EQ(load("listeners = \"0.0.0.0:0\"\n", &c, err), 0); /* one string is fine too */
    CHECK_EQ(c.nlisteners, 1);
}

static void test_errors(void)
{
    rt_conf_t c, d;
    char err[RT_CONF_ERR_LEN];
    rt_conf_defaults(&d);
    CHECK_EQ(load("\n\nmax_conections = 10\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 3, "unknown setting max_conections"));
    CHECK_EQ(load("max_connections = -5\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "whole number from 1 to 10000000 connections (got -5)"));
    CHECK_EQ(load("batch = 1.5\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "whole number"));
    CHECK_EQ(load("queue_qos0 = 1\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "true or false"));
    CHECK_EQ(load("log_level = \"loud\"\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "one of"));
    /* Found by tests/fuzz: doubling a string 40 times asked for 8 GB. */
    CHECK_EQ(load("local s = \"xxxxxxxx\"\nfor i = 1, 40 do s = s .. s end\n", &c, err), RT_EINVAL);
    CHECK(strstr(err, "not enough memory") != NULL);
    CHECK_EQ(load("listeners = { \"localhost:1883\" }\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "localhost")); /* hosts must be numeric */
    CHECK_EQ(load("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "unknown setting a")); /* the first error by line */
    CHECK_EQ(load("listeners = \"1.2.3.4:99999\"\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "host:port"));
    CHECK_EQ(load("batch = 10\nbatch = 20\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 2, "set twice (first on line 1)"));
    CHECK_EQ(load("batch = = 3\n", &c, err), RT_EINVAL); /* syntax */
    CHECK(err_is(err, 1, "unexpected symbol"));
    CHECK_EQ(load("batch = os.time()\n", &c, err), RT_EINVAL); /* no libraries */
    CHECK(err_is(err, 1, "os is not defined"));
    CHECK_EQ(load("while true do end\n", &c, err), RT_EINVAL); /* bounded */
    CHECK(strstr(err, "too long") != NULL);
    CHECK_EQ(load("\x1bLua", &c, err), RT_EINVAL); /* no precompiled chunks */
    /* A refused file changes nothing. */
    load("batch = 7\nmax_connections = 0\n", &c, err);
    CHECK(conf_equal(&c, &d));
    char err2[RT_CONF_ERR_LEN];
    CHECK_EQ(rt_conf_load(&c, "/nonexistent/rtd.conf", err2, sizeof(err2)), RT_ENOTFOUND);
    CHECK(strstr(err2, "/nonexistent/rtd.conf: cannot open") != NULL);
}

static void test_overrides(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN];
    rt_conf_defaults(&c);
    CHECK_EQ(rt_conf_set(&c, "log_level=debug", err, sizeof(err)), 0);
    CHECK(strcmp(c.log_level, "debug") == 0);
    CHECK_EQ(rt_conf_set(&c, "listeners=127.0.0.1:1884", err, sizeof(err)), 0);
    CHECK_EQ(c.listeners[0].port, 1884);
    CHECK_EQ(rt_conf_set(&c, "schedulers=2", err, sizeof(err)), 0);
    CHECK_EQ(c.schedulers, 2);
    CHECK_EQ(rt_conf_set(&c, "gc_factor=1.5", err, sizeof(err)), 0);
    CHECK(c.gc_factor == 1.5);
    CHECK_EQ(rt_conf_set(&c, "queue_qos0=true", err, sizeof(err)), 0);
    CHECK(c.queue_qos0);
    CHECK_EQ(rt_conf_set(&c, "listeners={\"127.0.0.1:1\",\"127.0.0.2:2\"}", err, sizeof(err)), 0);
    CHECK_EQ(c.nlisteners, 2);
    CHECK_EQ(rt_conf_set(&c, "schedulers=lots", err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "command line: schedulers must be a whole number") != NULL);
    CHECK_EQ(rt_conf_set(&c, "nonsense", err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "key=value") != NULL);
    /* A number too long for the chunk would have been cut to another number. */
    char longnum[4200] = "schedulers=";
    memset(longnum + 11, '1', sizeof(longnum) - 12);
    CHECK_EQ(rt_conf_set(&c, longnum, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "command line: the assignment to \"schedulers\" is too long") != NULL);
    CHECK_EQ(c.schedulers, 2); /* unchanged by the refused ones */
}

/* Listeners as tables: each transport's settings, checked where they are set. */
typedef struct {
    const char *set, *why; /* an override, and what its refusal must say */
} refusal_t;

static void refused(rt_conf_t *c, const refusal_t *bad, size_t n)
{
    char err[RT_CONF_ERR_LEN];
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(rt_conf_set(c, bad[i].set, err, sizeof(err)), RT_EINVAL);
        CHECK(strstr(err, bad[i].why) != NULL);
        if (!strstr(err, bad[i].why))
            fprintf(stderr, "  %s: %s\n", bad[i].set, err);
    }
}

static void test_listener_tables(void)
{
    rt_conf_t c;
    rt_conf_defaults(&c);
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(
        rt_conf_set(&c,
                    "listeners={\"127.0.0.1:1883\", {bind=\"127.0.0.1:8883\", tls={cert=\"s.pem\", "
                    "key=\"s.key\", ca=\"/etc/ca.pem\", verify=\"required\", "
                    "identity_as_username=true, min_version=\"1.3\"}}, {bind=\"[::1]:8083\", "
                    "websocket=\"/mqtt\", trusted_proxies={\"10.0.0.0/8\"}}, "
                    "{bind=\"127.0.0.1:1885\", proxy_protocol=true, trusted_proxies=\"127.0.0.1\", "
                    "rate_limit={messages=10, bytes=1000, burst_messages=20}}}",
                    err, sizeof(err)),
        0);
    CHECK_EQ(c.nlisteners, 4);
    CHECK(!c.listeners[0].tls_on && !c.listeners[0].websocket[0]);
    CHECK(c.listeners[1].tls_on && c.listeners[1].port == 8883);
    CHECK(c.listeners[1].tls.cert[0] == '/'); /* made absolute against the current directory */
    CHECK(strcmp(c.listeners[1].tls.ca, "/etc/ca.pem") == 0);
    CHECK_EQ(c.listeners[1].tls.verify, RT_TLS_VERIFY_REQUIRED);
    CHECK(c.listeners[1].tls.identity_as_username);
    CHECK_EQ(c.listeners[1].tls.min_version, RT_TLS_1_3);
    CHECK(strcmp(c.listeners[2].host, "::1") == 0 &&
          strcmp(c.listeners[2].websocket, "/mqtt") == 0);
    CHECK_EQ(c.listeners[2].ntrusted, 1);
    CHECK(c.listeners[3].proxy_protocol && c.listeners[3].ntrusted == 1);
    CHECK(c.listeners[3].rate_limit.messages == 10 && c.listeners[3].rate_limit.bytes == 1000);
    CHECK(c.listeners[3].rate_limit.burst_messages == 20);
    /* One listener as a table, not in a list. */
    CHECK_EQ(rt_conf_set(&c, "listeners={bind=\"127.0.0.1:9\", websocket=\"/\"}", err, sizeof(err)),
             0);
    CHECK_EQ(c.nlisteners, 1);
    CHECK(strcmp(c.listeners[0].websocket, "/") == 0);
    static const refusal_t bad[] = {
        {"listeners={{bind=\"127.0.0.1:1\", tls={cert=\"a\"}}}", "needs cert and key"},
        {"listeners={{bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", verify=\"required\"}}}",
         "needs ca"},
        {"listeners={{bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", verify=\"request\"}}}",
         "verify = \"request\" needs ca"},
        {"listeners={{bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", verify=\"maybe\"}}}",
         "verify must be"},
        {"listeners={{bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", "
         "identity_as_username=true}}}",
         "needs verify"},
        {"listeners={{bind=\"127.0.0.1:1\", proxy_protocol=true}}", "needs trusted_proxies"},
        {"listeners={{bind=\"127.0.0.1:1\", websocket=\"mqtt\"}}", "starting with /"},
        {"listeners={{bind=\"127.0.0.1:1\", colour=\"red\"}}", "unknown key \"colour\""},
        {"listeners={{tls={cert=\"a\", key=\"b\"}}}", "needs bind"},
        {"listeners={{bind=\"127.0.0.1:1\", rate_limit={messages=-1}}}", "must be a number >= 0"},
        {"listeners={{bind=\"127.0.0.1:1\", trusted_proxies={\"nowhere\"}}}",
         "not a numeric address"},
    };
    refused(&c, bad, sizeof(bad) / sizeof(bad[0]));
    CHECK_EQ(c.nlisteners, 1); /* unchanged by the refused ones */
    CHECK_EQ(rt_conf_set(&c,
                         "listeners={bind=\"127.0.0.1:9\", tls={cert=\"d.pem\", key=\"d.key\", "
                         "sni={{name=\"a.example\", cert=\"a.pem\", key=\"a.key\"}}}}",
                         err, sizeof(err)),
             0);
    CHECK_EQ(c.listeners[0].tls.nsni, 1);
    CHECK(strcmp(c.listeners[0].tls.sni[0].name, "a.example") == 0);
    CHECK(c.listeners[0].tls.sni[0].key[0] == '/'); /* resolved like the listener's own files */
    CHECK_EQ(rt_conf_set(&c,
                         "listeners={bind=\"127.0.0.1:9\", tls={cert=\"d.pem\", key=\"d.key\", "
                         "sni={{name=\"a.example\", cert=\"a.pem\"}}}}",
                         err, sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "sni[1].key") != NULL);
    CHECK_EQ(
        rt_conf_set(&c, "user_rate_limits={alice={messages=5}, bob={bytes=100}}", err, sizeof(err)),
        0);
    CHECK_EQ(c.nuser_rates, 2);
    CHECK_EQ(rt_conf_set(&c, "user_rate_limits={alice={speed=5}}", err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "unknown key \"speed\"") != NULL);
}

/* http.tls is a listener's tls table, its files resolved like theirs; identity_as_username is
   MQTT's alone. http.request_timeout: whole seconds in range, 10 when not given. */
static void test_http_tls(void)
{
    rt_conf_t c;
    rt_conf_defaults(&c);
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(rt_conf_set(&c, "http={bind=\"127.0.0.1:8081\"}", err, sizeof(err)), 0);
    CHECK(c.http.on && !c.http.where.tls_on);
    CHECK_EQ(c.http.request_timeout, RT_CONF_HTTP_REQUEST_TIMEOUT);
    CHECK_EQ(rt_conf_set(&c, "http={bind=\"127.0.0.1:8081\", request_timeout=2}", err, sizeof(err)),
             0);
    CHECK_EQ(c.http.request_timeout, 2);
    CHECK_EQ(rt_conf_set(&c,
                         "http={bind=\"127.0.0.1:8081\", tls={cert=\"h.pem\", key=\"h.key\", "
                         "min_version=\"1.3\"}, metrics_public=true}",
                         err, sizeof(err)),
             0);
    CHECK(c.http.where.tls_on && c.http.metrics_public);
    CHECK(c.http.where.tls.cert[0] == '/' && c.http.where.tls.key[0] == '/');
    CHECK_EQ(c.http.where.tls.min_version, RT_TLS_1_3);
    static const refusal_t bad[] = {
        {"http={bind=\"127.0.0.1:1\", tls={cert=\"a\"}}", "http.tls needs cert and key"},
        {"http={bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", colour=1}}",
         "http.tls: unknown key \"colour\""},
        {"http={bind=\"127.0.0.1:1\", tls={cert=\"a\", key=\"b\", ca=\"c\", "
         "verify=\"required\", identity_as_username=true}}",
         "identity_as_username is for MQTT listeners"},
        {"http={bind=\"127.0.0.1:1\", tls=true}", "http.tls must be a table"},
        {"http={bind=\"127.0.0.1:1\", request_timeout=0}", "http.request_timeout must be"},
        {"http={bind=\"127.0.0.1:1\", request_timeout=3601}", "from 1 to 3600 seconds"},
        {"http={bind=\"127.0.0.1:1\", request_timeout=1.5}", "whole number from 1 to 3600"},
        {"http={bind=\"127.0.0.1:1\", request_timeout=\"2\"}", "http.request_timeout must be"},
    };
    refused(&c, bad, sizeof(bad) / sizeof(bad[0]));
}

/* cluster: a node name and NATS URLs, replicas defaulting to min(3, URLs), TLS files and the
   secret resolved like the listeners' files, a secret file required unless refused outright;
   every wrong value named. */
static void test_cluster(void)
{
    rt_conf_t c;
    rt_conf_defaults(&c);
    char err[RT_CONF_ERR_LEN];
    CHECK(!c.cluster.on);
    CHECK_EQ(
        rt_conf_set(&c, "cluster={node=\"rt1\", nats=\"nats://127.0.0.1:4222\", secret_file=false}",
                    err, sizeof(err)),
        0);
    CHECK(c.cluster.on && strcmp(c.cluster.node, "rt1") == 0 && c.cluster.nnats == 1);
    CHECK(c.cluster.unsigned_control && !c.cluster.secret_file[0]);
    CHECK(strcmp(c.cluster.prefix, "rt") == 0 && c.cluster.replicas == 1);
    CHECK_EQ(rt_conf_set(&c,
                         "cluster={node=\"n-2_b\", nats={\"nats://a:1\", \"nats://b:2\", "
                         "\"nats://c:3\", \"nats://d:4\"}, prefix=\"mq\", tls_ca=\"ca.pem\", "
                         "secret_file=\"c.secret\"}",
                         err, sizeof(err)),
             0);
    CHECK(c.cluster.nnats == 4 && c.cluster.replicas == 3 && strcmp(c.cluster.prefix, "mq") == 0);
    CHECK(c.cluster.tls_ca[0] == '/' && c.cluster.secret_file[0] == '/');
    CHECK(!c.cluster.unsigned_control);
    CHECK_EQ(rt_conf_set(&c,
                         "cluster={node=\"x\", nats=\"nats://a:1\", replicas=5, secret_file=\"s\"}",
                         err, sizeof(err)),
             0);
    CHECK_EQ(c.cluster.replicas, 5);
    CHECK(!c.cluster.durable && c.cluster.replay_margin == RT_CONF_REPLAY_MARGIN);
    CHECK_EQ(rt_conf_set(&c,
                         "cluster={node=\"x\", nats=\"nats://a:1\", durable=true, "
                         "replay_margin=30, secret_file=\"s\"}",
                         err, sizeof(err)),
             0);
    CHECK(c.cluster.durable && c.cluster.replay_margin == 30);
    /* NATS credentials: a creds file or an nkey's seed file resolved as the TLS files are. */
    CHECK_EQ(rt_conf_set(&c,
                         "cluster={node=\"x\", nats=\"nats://a:1\", nkey=\"UABC\", "
                         "nkey_seed=\"n.seed\", nats_without_credentials=true, secret_file=\"s\"}",
                         err, sizeof(err)),
             0);
    CHECK(strcmp(c.cluster.nkey, "UABC") == 0 && c.cluster.nkey_seed[0] == '/');
    CHECK(c.cluster.nats_without_credentials && !c.cluster.creds[0]);
    CHECK_EQ(rt_conf_set(&c,
                         "cluster={node=\"x\", nats=\"nats://a:1\", creds=\"rt.creds\", "
                         "secret_file=\"s\"}",
                         err, sizeof(err)),
             0);
    CHECK(c.cluster.creds[0] == '/' && !c.cluster.nkey[0] && !c.cluster.nats_without_credentials);
    static const refusal_t bad[] = {
        {"cluster={node=\"a\", nats=\"nats://a:1\", nkey=\"U\"}", "nkey and nkey_seed go together"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", creds=\"c\", nkey=\"U\", nkey_seed=\"s\"}",
         "give one"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", nats_without_credentials=1}",
         "cluster.nats_without_credentials must be true or false"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", token=true}", "cluster.token must be"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", durable=1}", "cluster.durable must be"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", replay_margin=-1}",
         "cluster.replay_margin must be"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", replay_margin=3601}",
         "cluster.replay_margin must be"},
        {"cluster={nats=\"nats://a:1\"}", "cluster needs node"},
        {"cluster={node=\"a\"}", "cluster needs node"},
        {"cluster={node=\"a.b\", nats=\"nats://a:1\"}", "cluster.node must be"},
        {"cluster={node=\"\", nats=\"nats://a:1\"}", "cluster.node must be"},
        {"cluster={node=\"a\", nats={}}", "cluster.nats must be"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", replicas=6}", "cluster.replicas must be"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", tls_cert=\"c\"}", "go together"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", colour=1}", "unknown key \"colour\""},
        {"cluster=true", "cluster must be a table"},
        {"cluster={node=\"a\", nats=\"nats://a:1\"}", "cluster needs secret_file"},
        {"cluster={node=\"a\", nats=\"nats://a:1\", secret_file=true}",
         "cluster.secret_file must be a path, or false"},
    };
    refused(&c, bad, sizeof(bad) / sizeof(bad[0]));
}

/*
** xmpp: every key read back from a file (the listeners' TLS files resolved against its
** directory, host names folded to lowercase, line numbers kept for the listeners).
*/
static void test_xmpp(void)
{
    rt_conf_t *c = malloc(sizeof(*c));
    char err[RT_CONF_ERR_LEN];
    rt_conf_defaults(c);
    CHECK(!c->xmpp.on); /* no table, no XMPP */
    CHECK_EQ(
        load("listeners = \"127.0.0.1:1883\"\n"
             "xmpp = {\n"
             "    hosts = { \"Example.ORG\", \"chat.example.net\", \"xn--bcher-kva.example\" },\n"
             "    anonymous = { \"chat.example.net\" },\n"
             "    register = { \"Example.org\" },\n"
             "    register_rate = 20,\n"
             "    listeners = { \"127.0.0.1:5222\",\n"
             "        { bind = \"0.0.0.0:5223\", tls = { cert = \"x.pem\", key = \"x.key\" } },\n"
             "        { bind = \"[::1]:5224\", starttls = true,\n"
             "          tls = { cert = \"/etc/x.pem\", key = \"/etc/x.key\" } },\n"
             "        { bind = \"127.0.0.1:5280\", websocket = \"/xmpp-websocket\",\n"
             "          proxy_protocol = true, trusted_proxies = \"10.0.0.0/8\" } },\n"
             "    plaintext_from = { \"10.1.0.0/16\" },\n"
             "    max_stanza_size = 64 * 1024,\n"
             "    resource_conflict = \"refuse\",\n"
             "    max_resources = 3,\n"
             "    max_roster_items = 250,\n"
             "    max_offline_messages = 0,\n"
             "    max_offline_bytes = 4096,\n"
             "    idle_timeout = 0,\n"
             "    max_vcard_size = 2048,\n"
             "}\n",
             c, err),
        0);
    if (err[0])
        fprintf(stderr, "  %s\n", err);
    const rt_conf_xmpp_t *x = &c->xmpp;
    CHECK(x->on);
    CHECK_EQ(x->nhosts, 3);
    CHECK_STR(x->hosts[0], "example.org");
    CHECK_STR(x->hosts[1], "chat.example.net");
    CHECK_STR(x->hosts[2], "xn--bcher-kva.example");
    CHECK_EQ(x->nanonymous, 1);
    CHECK_STR(x->anonymous[0], "chat.example.net");
    CHECK_EQ(x->nregistration, 1);
    CHECK_STR(x->registration[0], "example.org");
    CHECK_EQ(x->register_rate, 20);
    CHECK_EQ(x->nlisteners, 4);
    CHECK_STR(x->listeners[0].host, "127.0.0.1");
    CHECK_EQ(x->listeners[0].port, 5222);
    CHECK(!x->listeners[0].tls_on && !x->listeners[0].starttls);
    CHECK_EQ(x->listeners[0].line, 22); /* where the assignment ends (Lua's line), for a port
                                           in use */
    CHECK(x->listeners[1].tls_on && !x->listeners[1].starttls); /* direct TLS, XEP-0368 */
    CHECK_STR(x->listeners[1].tls.cert, "/tmp/x.pem");          /* the file's directory */
    CHECK_STR(x->listeners[1].tls.key, "/tmp/x.key");
    CHECK_STR(x->listeners[2].host, "::1");
    CHECK(x->listeners[2].tls_on && x->listeners[2].starttls);
    CHECK_STR(x->listeners[2].tls.cert, "/etc/x.pem");
    CHECK_STR(x->listeners[3].websocket, "/xmpp-websocket");
    CHECK(x->listeners[3].proxy_protocol && x->listeners[3].ntrusted == 1);
    const unsigned char in[16] = {[10] = 0xff, [11] = 0xff, 10, 1, 200, 3};
    const unsigned char out[16] = {[10] = 0xff, [11] = 0xff, 10, 2, 0, 1};
    CHECK_EQ(x->nplaintext_from, 1);
    CHECK(rt_conf_net_match(x->plaintext_from, x->nplaintext_from, in));
    CHECK(!rt_conf_net_match(x->plaintext_from, x->nplaintext_from, out));
    CHECK_EQ(x->max_stanza_size, 65536);
    CHECK_STR(x->resource_conflict, "refuse");
    CHECK_EQ(x->max_resources, 3);
    CHECK_EQ(x->max_roster_items, 250);
    CHECK_EQ(x->max_offline_messages, 0);
    CHECK_EQ(x->max_offline_bytes, 4096);
    CHECK_EQ(x->idle_timeout, 0);
    CHECK_EQ(x->max_vcard_size, 2048);
    CHECK_EQ(c->nlisteners, 1); /* MQTT's own, untouched */
    /* Each listener by its index among all (rt_conf_listener): MQTT's, HTTP's, XMPP's. */
    CHECK(rt_conf_listener(c, 0) == &c->listeners[0]);
    CHECK(rt_conf_listener(c, 1) == NULL); /* one MQTT listener */
    CHECK(rt_conf_listener(c, RT_CONF_HTTP_LISTENER) == NULL);
    for (unsigned i = 0; i < 4; i++)
        CHECK(rt_conf_listener(c, RT_CONF_XMPP_LISTENER(i)) == &x->listeners[i]);
    CHECK(rt_conf_listener(c, RT_CONF_XMPP_LISTENER(4)) == NULL);
    CHECK(rt_conf_listener(c, RT_CONF_ALL_LISTENERS) == NULL);

    /* Only hosts: one plain listener on 5222, plaintext from loopback, the declared numbers. */
    CHECK_EQ(rt_conf_set(c, "xmpp={hosts=\"Solo.Example\"}", err, sizeof(err)), 0);
    CHECK(x->on && x->nhosts == 1 && x->nanonymous == 0);
    CHECK_STR(x->hosts[0], "solo.example");
    CHECK_EQ(x->nlisteners, 1);
    CHECK_STR(x->listeners[0].host, "0.0.0.0");
    CHECK_EQ(x->listeners[0].port, 5222);
    CHECK(!x->listeners[0].tls_on && !x->listeners[0].starttls && !x->listeners[0].websocket[0]);
    CHECK_EQ(x->nplaintext_from, RT_CONF_NLOOPBACK);
    CHECK(memcmp(x->plaintext_from, rt_conf_loopback, sizeof(rt_conf_loopback)) == 0);
    CHECK_EQ(x->max_stanza_size, 262144);
    CHECK_STR(x->resource_conflict, "replace");
    CHECK_EQ(x->max_resources, 16);
    CHECK_EQ(x->max_roster_items, 1000);
    CHECK_EQ(x->max_offline_messages, 1000);
    CHECK_EQ(x->max_offline_bytes, 1024 * 1024);
    CHECK_EQ(x->idle_timeout, 300);
    /* An empty plaintext_from: TLS before authentication for everyone. */
    CHECK_EQ(rt_conf_set(c, "xmpp={hosts={\"a.example\"}, plaintext_from={}}", err, sizeof(err)),
             0);
    CHECK_EQ(x->nplaintext_from, 0);

    char host255[300], host256[300];
    memset(host255, 'a', sizeof(host255));
    for (int i = 63; i < 255; i += 64)
        host255[i] = '.'; /* labels of 63 bytes */
    memcpy(host256, host255, sizeof(host256));
    snprintf(host255 + 255, sizeof(host255) - 255, "\"}");
    host256[255] = 'a';
    snprintf(host256 + 256, sizeof(host256) - 256, "\"}");
    char set255[340], set256[340];
    snprintf(set255, sizeof(set255), "xmpp={hosts=\"%s", host255);
    snprintf(set256, sizeof(set256), "xmpp={hosts=\"%s", host256);
    CHECK_EQ(rt_conf_set(c, set255, err, sizeof(err)), 0); /* 255 bytes: the most there is */
    CHECK_EQ(strlen(x->hosts[0]), 255);
    static const refusal_t bad[] = {
        {"xmpp=true", "xmpp must be a table"},
        {"xmpp={}", "xmpp needs hosts"},
        {"xmpp={hosts={}}", "xmpp.hosts must be a host name or a list of 1 to 16"},
        {"xmpp={hosts={\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\","
         "\"m\",\"n\",\"o\",\"p\",\"q\"}}",
         "xmpp.hosts must be a host name or a list of 1 to 16"},
        {"xmpp={hosts=5}", "xmpp.hosts must be"},
        {"xmpp={hosts={\"\"}}", "xmpp.hosts[1] must be a host name of 1 to 255 bytes"},
        {"xmpp={hosts={\"a.example\", \"ex\xc3\xa4"
         "mple.org\"}}",
         "xmpp.hosts[2]: \"ex\xc3\xa4"
         "mple.org\" is not ASCII: give an internationalized name "
         "as its A-label (xn--...)"},
        {"xmpp={hosts=\"exa_mple.org\"}", "may have only ASCII letters, digits, - and ."},
        {"xmpp={hosts=\"a..example\"}", "is not a DNS name"},
        {"xmpp={hosts=\"example.org.\"}", "is not a DNS name"},
        {"xmpp={hosts=\"-a.example\"}", "is not a DNS name"},
        {"xmpp={hosts=\"a-.example\"}", "is not a DNS name"},
        {"xmpp={hosts={\"a.example\", \"b.example\", \"A.Example\"}}",
         "xmpp.hosts[3]: \"a.example\" is given twice"},
        {"xmpp={hosts=\"a.example\", anonymous=\"b.example\"}",
         "xmpp.anonymous[1]: \"b.example\" is not one of xmpp.hosts"},
        {"xmpp={hosts=\"a.example\", anonymous={\"A.example\", \"a.example\"}}",
         "xmpp.anonymous[2]: \"a.example\" is given twice"},
        {"xmpp={hosts=\"a.example\", register={\"a.example\", \"b.example\"}}",
         "xmpp.register[2]: \"b.example\" is not one of xmpp.hosts"},
        {"xmpp={hosts=\"a.example\", register_rate=0}", "xmpp.register_rate"},
        {"xmpp={hosts=\"a.example\", colour=1}", "xmpp: unknown key \"colour\" (hosts, "},
        {"xmpp={hosts=\"a.example\", listeners={}}", "xmpp.listeners: between 1 and 8"},
        {"xmpp={hosts=\"a.example\", listeners=\"localhost:5222\"}",
         "xmpp.listeners: \"localhost:5222\" is not host:port"},
        {"xmpp={hosts=\"a.example\", listeners={\"127.0.0.1:1\", {bind=\"127.0.0.1:2\", "
         "starttls=true}}}",
         "xmpp.listeners[2]: starttls needs a tls table"},
        {"xmpp={hosts=\"a.example\", listeners={{bind=\"127.0.0.1:2\", starttls=true, "
         "websocket=\"/x\", tls={cert=\"a\", key=\"b\"}}}}",
         "xmpp.listeners[1]: starttls is not for WebSocket"},
        {"xmpp={hosts=\"a.example\", listeners={{bind=\"127.0.0.1:2\", tls={cert=\"a\"}}}}",
         "xmpp.listeners[1].tls needs cert and key"},
        {"xmpp={hosts=\"a.example\", listeners={{bind=\"127.0.0.1:2\", starttls=1}}}",
         "xmpp.listeners[1].starttls must be true or false"},
        {"xmpp={hosts=\"a.example\", listeners={\"127.0.0.1:5\", \"0.0.0.0:5\"}}",
         "xmpp.listeners[1] (127.0.0.1:5) and xmpp.listeners[2] (0.0.0.0:5) take one address"},
        {"xmpp={hosts=\"a.example\", plaintext_from=\"everyone\"}",
         "xmpp.plaintext_from[1]: \"everyone\" is not a numeric address"},
        {"xmpp={hosts=\"a.example\", max_stanza_size=1023}",
         "xmpp.max_stanza_size must be a whole number from 1024 to 67108864 bytes"},
        {"xmpp={hosts=\"a.example\", max_stanza_size=64*1024*1024+1}", "xmpp.max_stanza_size"},
        {"xmpp={hosts=\"a.example\", resource_conflict=\"kick\"}",
         "xmpp.resource_conflict must be one of: replace or refuse (got \"kick\")"},
        {"xmpp={hosts=\"a.example\", max_resources=0}", "xmpp.max_resources must be"},
        {"xmpp={hosts=\"a.example\", max_resources=1001}", "from 1 to 1000 sessions"},
        {"xmpp={hosts=\"a.example\", max_roster_items=100001}", "xmpp.max_roster_items must be"},
        {"xmpp={hosts=\"a.example\", max_offline_messages=-1}",
         "xmpp.max_offline_messages must be"},
        {"xmpp={hosts=\"a.example\", max_offline_bytes=1e9+1}", "xmpp.max_offline_bytes must be"},
        {"xmpp={hosts=\"a.example\", idle_timeout=86401}", "xmpp.idle_timeout must be"},
        {"xmpp={hosts=\"a.example\", idle_timeout=1.5}", "xmpp.idle_timeout must be a whole"},
        {"xmpp={hosts=\"a.example\", s2s_peers={\"b.example=localhost:5269\"}}",
         "xmpp.s2s_peers[1]: \"b.example=localhost:5269\" is not \"domain=host:port\""},
        {"xmpp={hosts=\"a.example\", s2s_peers={\"b.example=127.0.0.1:1\", "
         "\"b.example=127.0.0.2:2\"}}",
         "xmpp.s2s_peers[2]: \"b.example=127.0.0.2:2\" is not \"domain=host:port\" with a "
         "numeric host (at most 255 bytes), or names its domain twice"},
        {"xmpp={hosts=\"a.example\", s2s_peers=\"b.example=127.0.0.1:1\"}",
         "xmpp.s2s_peers must be a list"},
        {"xmpp={hosts=\"a.example\", listeners={{bind=\"127.0.0.1:2\", s2s=true, "
         "websocket=\"/x\"}}}",
         "xmpp.listeners[1]: s2s is for xmpp.listeners, and not on WebSocket"},
        {"listeners={{bind=\"127.0.0.1:1\", s2s=true}}", "listeners[1]: s2s is for xmpp"},
        /* starttls is XMPP's: refused on MQTT listeners and http, with why. */
        {"listeners={{bind=\"127.0.0.1:1\", starttls=true, tls={cert=\"a\", key=\"b\"}}}",
         "listeners[1]: starttls is for xmpp.listeners"},
        {"listeners={bind=\"127.0.0.1:1\", starttls=true}",
         "listeners: starttls is for xmpp.listeners"},
        {"http={bind=\"127.0.0.1:8080\", starttls=true}", "http: starttls is for xmpp.listeners"},
    };
    refused(c, bad, sizeof(bad) / sizeof(bad[0]));
    CHECK_EQ(rt_conf_set(c, set256, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "xmpp.hosts must be a host name of 1 to 255 bytes") != NULL);
    CHECK_EQ(strlen(x->hosts[0]), 255); /* unchanged by the refused ones */
    free(c);
}

/* No two listeners of any kind on one address: MQTT's, xmpp's and http's, both named. */
static void test_listeners_apart(void)
{
    rt_conf_t *c = malloc(sizeof(*c));
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(load("listeners = { \"127.0.0.1:1883\", \"0.0.0.0:5222\" }\n"
                  "\n"
                  "xmpp = { hosts = \"a.example\" }\n",
                  c, err),
             RT_EINVAL);
    CHECK(err_is(err, 3,
                 "listeners[2] (0.0.0.0:5222) and xmpp.listeners[1] (0.0.0.0:5222) take one "
                 "address"));
    CHECK_EQ(load("xmpp = { hosts = \"a.example\", listeners = { \"127.0.0.1:5222\", "
                  "\"127.0.0.1:1883\" } }\n"
                  "listeners = \"127.0.0.2:1883\"\n",
                  c, err),
             0); /* one port on two addresses */
    CHECK_EQ(load("xmpp = { hosts = \"a.example\", listeners = { \"127.0.0.1:5222\", "
                  "\"127.0.0.1:1883\" } }\n"
                  "listeners = \"0.0.0.0:1883\"\n",
                  c, err),
             RT_EINVAL); /* the wildcard takes it on every address */
    CHECK(err_is(err, 2,
                 "listeners[1] (0.0.0.0:1883) and xmpp.listeners[2] (127.0.0.1:1883) take one "
                 "address"));
    CHECK_EQ(load("http = { bind = \"127.0.0.1:5280\" }\n"
                  "xmpp = { hosts = \"a.example\", listeners = { { bind = \"127.0.0.1:5280\", "
                  "websocket = \"/ws\" } } }\n",
                  c, err),
             RT_EINVAL);
    CHECK(err_is(err, 2, "xmpp.listeners[1] (127.0.0.1:5280) and http.bind (127.0.0.1:5280)"));
    CHECK_EQ(load("listeners = { \"127.0.0.1:1\", \"127.0.0.1:1\" }\n", c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "listeners[1] (127.0.0.1:1) and listeners[2] (127.0.0.1:1)"));
    CHECK_EQ(load("listeners = \"127.0.0.1:8080\"\nhttp = { bind = \"0.0.0.0:8080\" }\n", c, err),
             RT_EINVAL);
    CHECK(err_is(err, 2, "listeners[1] (127.0.0.1:8080) and http.bind (0.0.0.0:8080)"));
    /* An override meets the file's listeners too. */
    CHECK_EQ(load("listeners = \"127.0.0.1:1883\"\n", c, err), 0);
    CHECK_EQ(rt_conf_set(c, "xmpp={hosts=\"a.example\", listeners=\"127.0.0.1:1883\"}", err,
                         sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "command line: listeners[1] (127.0.0.1:1883) and xmpp.listeners[1]") != NULL);
    CHECK(!c->xmpp.on); /* refused: nothing changed */
    /* Port 0 (the kernel picks one) clashes with nothing. */
    CHECK_EQ(rt_conf_set(c, "xmpp={hosts=\"a.example\", listeners={\"0.0.0.0:0\", \"0.0.0.0:0\"}}",
                         err, sizeof(err)),
             0);
    free(c);
}

/* Relative paths: the file's directory for the file's values and defaults, cwd for -o. */
static void test_paths(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN], want[600], cwd[512];
    CHECK_EQ(load("rules_dir = \"r/./x/../rules\"\n"
                  "password_file = \"/etc/abs.pw\"\n"
                  "acl_file = \"../acl\"\n",
                  &c, err),
             0);
    CHECK(strcmp(c.rules_dir, "/tmp/r/rules") == 0);
    CHECK(strcmp(c.data_dir, "/tmp/data") == 0); /* the default, next to the file too */
    CHECK(strcmp(c.password_file, "/etc/abs.pw") == 0);
    CHECK(strcmp(c.acl_file, "/acl") == 0);
    CHECK(c.admin_socket[0] == 0); /* "" stays "": data_dir/rtd.sock */
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    CHECK_EQ(rt_conf_set(&c, "data_dir=here", err, sizeof(err)), 0);
    snprintf(want, sizeof(want), "%s/here", cwd);
    CHECK(strcmp(c.data_dir, want) == 0);
    CHECK_EQ(rt_conf_set(&c, "admin_socket='s/rtd.sock'", err, sizeof(err)), 0);
    snprintf(want, sizeof(want), "%s/s/rtd.sock", cwd);
    CHECK(strcmp(c.admin_socket, want) == 0);
    char longer[300];
    memset(longer, 'a', 252); /* fits as written; not once "/tmp/" is put before it */
    snprintf(longer + 252, sizeof(longer) - 252, "\"\n");
    char text[320];
    snprintf(text, sizeof(text), "data_dir = \"%s", longer);
    CHECK_EQ(load(text, &c, err), RT_EINVAL);
    CHECK(strstr(err, "data_dir") && strstr(err, "longer than 255 bytes"));
}

static void test_anonymous_from(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN];
    const unsigned char v4_10_1_2_3[16] = {[10] = 0xff, [11] = 0xff, 10, 1, 2, 3};
    const unsigned char v4_10_2_0_1[16] = {[10] = 0xff, [11] = 0xff, 10, 2, 0, 1};
    const unsigned char v4_127_9[16] = {[10] = 0xff, [11] = 0xff, 127, 0, 0, 9};
    const unsigned char v6_loop[16] = {[15] = 1};
    const unsigned char v6_doc[16] = {0x20, 0x01, 0x0d, 0xb8, [15] = 7};
    rt_conf_defaults(&c);
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_127_9));
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v6_loop));
    CHECK(!rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_10_1_2_3));
    CHECK(!rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v6_doc));

    CHECK_EQ(load("anonymous_from = { \"10.1.0.0/15\", \"2001:db8::/32\" }\n", &c, err), 0);
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_10_1_2_3));
    CHECK(!rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_10_2_0_1));
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v6_doc));
    CHECK(!rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_127_9));
    CHECK_EQ(rt_conf_set(&c, "anonymous_from=127.0.0.9", err, sizeof(err)), 0);
    CHECK_EQ(c.nanonymous_from, 1);
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_127_9));
    CHECK_EQ(rt_conf_set(&c, "anonymous_from={'0.0.0.0/0', '::/0'}", err, sizeof(err)), 0);
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_10_2_0_1));
    CHECK(rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v6_doc));
    CHECK_EQ(rt_conf_set(&c, "anonymous_from={}", err, sizeof(err)), 0);
    CHECK(!rt_conf_net_match(c.anonymous_from, c.nanonymous_from, v4_127_9));

    CHECK_EQ(load("\nanonymous_from = { \"127.0.0.0/33\" }\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 2, "anonymous_from[1]: \"127.0.0.0/33\" is not a numeric address"));
    CHECK_EQ(load("anonymous_from = { \"::1\", \"localhost\" }\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "anonymous_from[2]: \"localhost\""));
    CHECK_EQ(load("anonymous_from = true\n", &c, err), RT_EINVAL);
    CHECK(err_is(err, 1, "anonymous_from must be"));
}

/* Each setting's value as config show gives it: a defaults conf's, then c's. */
typedef struct {
    char name[64], value[256], dflt[256], from[256];
} shown_t;

static shown_t shown[RT_CONF_MAX_SETTINGS * 2];
static size_t nshown;

static void collect(const rt_conf_value_t *v, void *ud)
{
    (void)ud;
    if (nshown == sizeof(shown) / sizeof(shown[0]))
        return;
    shown_t *s = &shown[nshown++];
    snprintf(s->name, sizeof(s->name), "%s", v->name);
    snprintf(s->value, sizeof(s->value), "%s", v->value);
    snprintf(s->dflt, sizeof(s->dflt), "%s", v->dflt);
    snprintf(s->from, sizeof(s->from), "%s", v->from);
}

static const shown_t *show(const rt_conf_t *c, const char *name)
{
    nshown = 0;
    rt_conf_each(c, collect, NULL);
    for (size_t i = 0; i < nshown; i++)
        if (strcmp(shown[i].name, name) == 0)
            return &shown[i];
    return NULL;
}

/*
** The default the schema declares (docs/CONFIG.md, rtd.conf(5)) is the one rtd starts with:
** assigning each declared default to a defaults conf changes no value config show gives.
*/
static void test_schema_defaults_are_the_defaults(void)
{
    rt_conf_t *c = malloc(sizeof(*c));
    char err[RT_CONF_ERR_LEN];
    size_t checked = 0;
    for (size_t i = 0;; i++) {
        rt_conf_defaults(c);
        nshown = 0;
        rt_conf_each(c, collect, NULL);
        if (i >= nshown)
            break;
        shown_t before = shown[i];
        const rt_setting_t *s = rt_conf_setting(before.name);
        if (strpbrk(before.name, ".["))
            continue; /* a key of the default listener's table: test_table_keys_shown */
        CHECK(s != NULL);
        CHECK_STR(before.value, before.dflt);
        CHECK_STR(before.from, "default");
        char text[256], assignment[320];
        rt_conf_default_text(s, text, sizeof(text));
        if (!text[0])
            continue; /* a table none is given by default (http, cluster, sinks) */
        snprintf(assignment, sizeof(assignment), "%s = %s\n", s->name, text);
        int rc = load(assignment, c, err);
        if (rc)
            fprintf(stderr, "  %s: %s\n", assignment, err);
        CHECK_EQ(rc, 0);
        const shown_t *after = show(c, before.name);
        const char *tail = strrchr(after->value, '/');
        /* A relative path is made absolute against the file's directory. */
        bool same = strcmp(after->value, before.value) == 0 ||
                    (s->type == RT_SET_PATH && tail && strcmp(tail + 1, before.value) == 0);
        if (!same)
            fprintf(stderr, "  %s: declared %s, built in %s\n", s->name, after->value,
                    before.value);
        CHECK(same);
        CHECK(strncmp(after->from, path, strlen(path)) == 0);
        checked++;
    }
    CHECK(checked > 50);
    free(c);
}

/* config show says where each value came from: the file's line, -o, config set or default. */
static void test_origins(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN], want[128];
    CHECK_EQ(load("-- limits\nmax_connections = 5\n", &c, err), 0);
    snprintf(want, sizeof(want), "%s:2", path);
    CHECK_STR(show(&c, "max_connections")->from, want);
    CHECK_STR(show(&c, "max_connections")->value, "5");
    CHECK_STR(show(&c, "max_connections")->dflt, "1000000");
    CHECK_STR(show(&c, "max_inflight")->from, "default");
    CHECK_EQ(rt_conf_set(&c, "max_inflight=7", err, sizeof(err)), 0);
    CHECK_STR(show(&c, "max_inflight")->from, "-o");
    CHECK_EQ(rt_conf_set_from(&c, "rtctl", "max_connections=6", err, sizeof(err)), 0);
    CHECK_STR(show(&c, "max_connections")->from, "config set");
    /* A refused value leaves the origin as it was. */
    CHECK(rt_conf_set(&c, "max_connections=0", err, sizeof(err)) != 0);
    CHECK_STR(show(&c, "max_connections")->from, "config set");
}

/* config show gives each key of the tables a row: its value, default and the table's origin. */
static void test_table_keys_shown(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN], want[128];
    CHECK_EQ(
        load("listeners = { \"127.0.0.1:1\", { bind = \"[::1]:2\", tls = { cert = \"c\", "
             "key = \"k\", min_version = \"1.3\" }, trusted_proxies = \"10.0.0.0/8\" } }\n"
             "http = { bind = \"127.0.0.1:3\", request_timeout = 30 }\n"
             "cluster = { node = \"n1\", nats = \"nats://127.0.0.1:4222\", password = \"hush\", "
             "secret_file = false }\n",
             &c, err),
        0);
    if (err[0])
        fprintf(stderr, "  %s\n", err);
    snprintf(want, sizeof(want), "%s:2", path);
    const shown_t *r = show(&c, "http.request_timeout");
    CHECK(r != NULL);
    if (r) {
        CHECK_STR(r->value, "30");
        CHECK_STR(r->dflt, "10");
        CHECK_STR(r->from, want);
    }
    CHECK((r = show(&c, "listeners[2].bind")) && strcmp(r->value, "[::1]:2") == 0);
    CHECK((r = show(&c, "listeners[2].tls.min_version")) && strcmp(r->value, "1.3") == 0 &&
          strcmp(r->dflt, "1.2") == 0);
    CHECK((r = show(&c, "listeners[2].trusted_proxies")) && strcmp(r->value, "10.0.0.0/8") == 0);
    CHECK((r = show(&c, "listeners[2].rate_limit.messages")) && strcmp(r->value, "0") == 0);
    CHECK(show(&c, "listeners[1].tls.cert") == NULL); /* no TLS on it */
    CHECK((r = show(&c, "cluster.node")) && strcmp(r->value, "n1") == 0);
    CHECK((r = show(&c, "cluster.password")) && strcmp(r->value, "(set)") == 0); /* never shown */
    CHECK((r = show(&c, "cluster.token")) && strcmp(r->value, "") == 0);
    CHECK(show(&c, "xmpp.hosts") == NULL); /* no xmpp table: no rows of its keys */
    CHECK((r = show(&c, "xmpp")) && strcmp(r->value, "-") == 0 && strcmp(r->dflt, "-") == 0);
    CHECK_EQ(load("\nxmpp = { hosts = { \"a.example\", \"b.example\" }, anonymous = \"b.example\", "
                  "listeners = { \"127.0.0.1:5222\", { bind = \"127.0.0.1:5223\", starttls = true, "
                  "tls = { cert = \"c\", key = \"k\" } } }, idle_timeout = 60 }\n",
                  &c, err),
             0);
    snprintf(want, sizeof(want), "%s:2", path);
    CHECK((r = show(&c, "xmpp")) &&
          strcmp(r->value, "a.example, b.example on 127.0.0.1:5222, 127.0.0.1:5223 tls starttls") ==
              0 &&
          strcmp(r->from, want) == 0);
    CHECK((r = show(&c, "xmpp.hosts")) && strcmp(r->value, "a.example, b.example") == 0 &&
          strcmp(r->from, want) == 0);
    CHECK((r = show(&c, "xmpp.anonymous")) && strcmp(r->value, "b.example") == 0 &&
          strcmp(r->dflt, "") == 0);
    CHECK((r = show(&c, "xmpp.plaintext_from")) && strcmp(r->value, "127.0.0.0/8, ::1/128") == 0);
    CHECK((r = show(&c, "xmpp.idle_timeout")) && strcmp(r->value, "60") == 0 &&
          strcmp(r->dflt, "300") == 0);
    CHECK((r = show(&c, "xmpp.resource_conflict")) && strcmp(r->value, "replace") == 0);
    CHECK((r = show(&c, "xmpp.listeners[2].bind")) && strcmp(r->value, "127.0.0.1:5223") == 0);
    CHECK((r = show(&c, "xmpp.listeners[2].starttls")) && strcmp(r->value, "true") == 0 &&
          strcmp(r->dflt, "false") == 0);
    CHECK((r = show(&c, "xmpp.listeners[2].tls.cert")) && strcmp(r->value, "/tmp/c") == 0);
    CHECK(show(&c, "xmpp.listeners[1].tls.cert") == NULL); /* no TLS on it */
    CHECK((r = show(&c, "listeners[1].starttls")) && strcmp(r->value, "false") == 0);
}

/* A table of section keys as a layer above adds it (the sinks' in rtd). */
static const rt_setting_t sink_keys[] = {
    {.name = "sinks.<name>.batch",
     .type = RT_SET_INT,
     .num = 500,
     .min = 1,
     .max = 100000,
     .doc = "rows per write"},
    {.name = "sinks.<name>(sqlite).file",
     .type = RT_SET_PATH,
     .text = "<name>.db",
     .doc = "the database"},
    {.name = "sinks.<name>(mongodb).uri", .type = RT_SET_STRING, .doc = "the server"},
    {.name = "sinks.<name>(republish).batch", .type = RT_SET_INT, .num = 100, .min = 1,
     .max = 100000, .doc = "rows per write, its own default"},
    {.name = NULL},
};

/* A sink's keys have rows: those set with the sinks' origin, the others with their default. */
static void test_section_keys_shown(void)
{
    rt_conf_t c;
    char err[RT_CONF_ERR_LEN], want[128];
    rt_conf_schema_add(sink_keys);
    CHECK_EQ(load("\nsinks = { archive = { type = \"sqlite\", batch = 50 } }\n", &c, err), 0);
    snprintf(want, sizeof(want), "%s:2", path);
    const shown_t *r = show(&c, "sinks.archive.batch");
    CHECK(r && strcmp(r->value, "50") == 0 && strcmp(r->dflt, "500") == 0 &&
          strcmp(r->from, want) == 0);
    r = show(&c, "sinks.archive.file");
    CHECK(r && strcmp(r->value, "archive.db") == 0 && strcmp(r->from, "default") == 0);
    CHECK(show(&c, "sinks.archive.uri") == NULL); /* a mongodb sink's key */
    CHECK_EQ(load("sinks = { out = { type = \"republish\" } }\n", &c, err), 0);
    r = show(&c, "sinks.out.batch"); /* its type's own default, one row */
    CHECK(r && strcmp(r->value, "100") == 0 && strcmp(r->dflt, "100") == 0);
    size_t rows = 0;
    for (size_t i = 0; i < nshown; i++)
        rows += strcmp(shown[i].name, "sinks.out.batch") == 0;
    CHECK_EQ(rows, 1);
}

int main(void)
{
    RUN(test_shipped_file);
    RUN(test_shipped_xmpp_example);
    RUN(test_values);
    RUN(test_errors);
    RUN(test_overrides);
    RUN(test_listener_tables);
    RUN(test_http_tls);
    RUN(test_cluster);
    RUN(test_xmpp);
    RUN(test_listeners_apart);
    RUN(test_paths);
    RUN(test_anonymous_from);
    RUN(test_schema_defaults_are_the_defaults);
    RUN(test_origins);
    RUN(test_table_keys_shown);
    RUN(test_section_keys_shown);
    unlink(path);
    return CHECK_SUMMARY();
}

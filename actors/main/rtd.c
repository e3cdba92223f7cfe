/*
** rtd: the MQTT broker daemon. Reads RTD_CONFIG_FILE (or -c FILE), applies -o
** overrides, starts the broker as a list of stages, tells systemd it is ready
** (notify.h), and runs until SIGTERM or SIGINT; then, as when a stage fails to
** start, the started stages stop in reverse order (MQTT 5 clients get DISCONNECT
** 0x8B). `rtd --check` runs the stages' checks alone (check.h).
**
** The actors the stages start are a supervision tree, as an OTP application's:
** each stage's long-lived actors are the children of one group supervisor
** (group.h), and the groups are the children of rtd's top supervisor, which
** allows no restarts. A group that gives up (more restarts than
** restart_intensity in restart_period) therefore takes rtd down, as an
** application's top supervisor takes its node: logged as rtd.failed, the stages
** stop as at SIGTERM, and rtd exits with status 3, for systemd to start it clean.
** $SYS alone is a temporary group: the broker serves without it.
*/
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "auth.h"
#include "bridge.h"
#include "check.h"
#include "conn.h"
#include "delayed.h"
#include "config.h"
#include "group.h"
#include "cluster.h"
#include "http.h"
#include "log.h"
#include "notify.h"
#include "rule_engine.h"
#include "sink.h"
#include "store.h"
#include "sys.h"
#include "tls.h"
#include "accounts.h"

/*
** Compile-time defaults (CMakeLists.txt). The rtd of the build tree reads the checkout's
** etc/rtd.conf from the current directory, as `make run` and the tests do, and takes
** data_dir's built-in default; the installed one (rtd_installed) is built with
** RTD_CONFIG_FILE=/etc/rt/rtd.conf and RTD_DATA_DIR=/var/lib/rt, the FHS paths its
** package and systemd unit use. RTD_VERSION is the project's.
*/
#ifndef RTD_CONFIG_FILE
#define RTD_CONFIG_FILE "etc/rtd.conf"
#endif

/*
** One line per rule and per rule worker with their counters at stop, as sinks log
** theirs: a run can check published == passed == written from the log alone.
*/
static void log_rules(void)
{
    size_t n = rt_rules_snapshot(NULL, 0);
    rt_rule_info_t *info = n ? calloc(n, sizeof(*info)) : NULL;
    if (!info)
        return;
    size_t got = rt_rules_snapshot(info, n); /* a reload may have changed the count */
    n = got < n ? got : n;
    for (size_t i = 0; i < n; i++) {
        const rt_rule_info_t *r = &info[i];
        rt_log(RT_LOG_INFO, "rule.stopped",
               "rule=%s matched=%llu passed=%llu filtered=%llu exception=%llu budget=%llu "
               "memory=%llu rows=%llu last_error=%s",
               r->name, (unsigned long long)r->matched, (unsigned long long)r->passed,
               (unsigned long long)r->filtered, (unsigned long long)r->failed_exception,
               (unsigned long long)r->failed_budget, (unsigned long long)r->failed_memory,
               (unsigned long long)r->rows_out, r->last_error);
    }
    free(info);
    rt_rules_worker_info_t wi[64];
    n = rt_rules_workers(wi, 64);
    for (size_t i = 0; i < n && i < 64; i++)
        rt_log(RT_LOG_INFO, "rule.worker", "worker=%zu messages=%llu batches=%llu", i,
               (unsigned long long)wi[i].messages, (unsigned long long)wi[i].batches);
}

/* One line per listener: who may connect where (check.h). */
static void log_access(const rt_conf_t *c)
{
    for (unsigned i = 0; i < c->nlisteners; i++) {
        rtd_access_t a;
        rtd_access(c, i, &a);
        rt_log(RT_LOG_INFO, "listener.access", "listener=%s anonymous=%s users=%s", a.listener,
               a.anonymous, a.users);
    }
}

/* `rtd apikey` finds the key file through the config an rtd without -c reads. */
static int apikey_main(int argc, char **argv)
{
    return rt_http_apikey_main(argc, argv, RTD_CONFIG_FILE);
}

/* `rtd xmpp` finds xmpp.db where an rtd without -c keeps its state. */
static int xmpp_main(int argc, char **argv)
{
#ifdef RTD_DATA_DIR
    return rt_xmpp_main(argc, argv, RTD_CONFIG_FILE, RTD_DATA_DIR);
#else
    return rt_xmpp_main(argc, argv, RTD_CONFIG_FILE, NULL);
#endif
}

/* rtd's subcommands, each with its own options (`rtd SUBCOMMAND --help`). */
static const struct {
    const char *name, *synopsis, *what;
    int (*main)(int argc, char **argv);
} subcommands[] = {
    {"passwd", "[-c] [-D] [-b] [-I ROUNDS] FILE USER [PASSWORD]",
     "add, change or delete a user of a password file (mosquitto_passwd's)", rt_auth_passwd_main},
    {"apikey", "NAME read|admin [-c CONFIG | -f FILE]",
     "make an API key for the HTTP API (docs/HTTP.md)", apikey_main},
    {"xmpp", "user add|passwd|del|list [-c FILE | -d DIR] [USER@HOST | HOST]",
     "add, change, delete or list XMPP accounts (xmpp.db in data_dir)", xmpp_main},
};

#define NSUBCOMMANDS (sizeof(subcommands) / sizeof(subcommands[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: rtd [-c FILE] [-o name=value]... [--check]\n");
    for (size_t i = 0; i < NSUBCOMMANDS; i++)
        fprintf(out, "       rtd %s %s\n", subcommands[i].name, subcommands[i].synopsis);
    fprintf(out,
            "       rtd -v | --version\n"
            "       rtd --print-schema=markdown|man\n"
            "  -c FILE          configuration file (default %s)\n"
            "  -o name=value    override one setting of the file (repeatable)\n"
            "  --check          load the configuration, every rule and every TLS, password,\n"
            "                   ACL and key file it names; print what would listen where and\n"
            "                   for whom; exit 0 if rtd would start, 2 if not. Binds, starts\n"
            "                   and creates nothing\n"
            "  -v, --version    print rtd's version\n"
            "  --print-schema=markdown|man\n"
            "                   print the settings reference (docs/CONFIG.md, rtd.conf(5))\n"
            "subcommands (rtd SUBCOMMAND --help for their options):\n",
            RTD_CONFIG_FILE);
    for (size_t i = 0; i < NSUBCOMMANDS; i++)
        fprintf(out, "  %-16s %s\n", subcommands[i].name, subcommands[i].what);
}

/* What the stages share. */
typedef struct {
    const char *conf_path;
    rt_conf_t conf;   /* the admin socket keeps a pointer to it */
    sigset_t signals; /* the ones main waits for, blocked in every thread */
    rt_pid_t top;     /* the top supervisor: every stage's group runs under it */
    char err[RT_CONF_ERR_LEN];
} rtd_t;

#define RTD_TOP_NAME "rtd_sup"
#define RTD_EXIT_GAVE_UP 3         /* the exit status when the tree gave up */
#define RTD_SIGNAL_GAVE_UP SIGUSR1 /* what the top supervisor sends main when it goes */

/*
** The top supervisor's end, told to main: set once by the top's last event (from its
** turn), read by main after the signal.
*/
static struct {
    pthread_t main;
    atomic_bool stopping; /* main is stopping rtd: the tree's end is expected */
    atomic_bool gave_up;
} node;

/* The top supervisor logs like the groups; its own end, unless rtd is stopping, ends rtd. */
static void top_event(const rt_sup_event_t *e, void *ud)
{
    rt_group_log_event(e, ud);
    if (e->kind != RT_SUP_STOPPED || atomic_load(&node.stopping) ||
        atomic_exchange(&node.gave_up, true))
        return;
    rt_log(RT_LOG_ERROR, "rtd.failed",
           "supervisor=%s reason=%s the supervision tree gave up; stopping (exit status %d)",
           e->sup_name, rt_reason_name(e->reason), RTD_EXIT_GAVE_UP);
    pthread_kill(node.main, RTD_SIGNAL_GAVE_UP);
}

/* No restarts: its children are the groups, and one that gave up is not started again. */
static const rt_sup_spec_t top_spec = {
    .strategy = RT_ONE_FOR_ONE, .intensity = 0, .period_ms = 1000, .on_event = top_event};

/* A wrong setting or file: said on stderr, exit status 2. */
static int config_error(const rtd_t *d)
{
    fprintf(stderr, "rtd: %s\n", d->err);
    return 2;
}

/*
** The log as the settings say: level, format and file. Under systemd (stderr is the
** journal's stream, or log_journal = "on") each line on stderr carries its priority.
*/
static int open_log(rtd_t *d)
{
    const rt_conf_t *c = &d->conf;
    rt_log_level_t level = RT_LOG_INFO;
    rt_log_parse_level(c->log_level, &level);
    if (rt_log_open(c->log_file[0] ? c->log_file : NULL, level,
                    strcmp(c->log_format, "json") == 0) != 0) {
        snprintf(d->err, sizeof(d->err), "log_file %s: %s", c->log_file, strerror(errno));
        return RT_EINVAL;
    }
    rt_log_set_priority_prefix(strcmp(c->log_journal, "on") == 0 ||
                               (strcmp(c->log_journal, "auto") == 0 && rt_log_stderr_is_journal()));
    return 0;
}

/* A stage that checks its own settings as it starts: RT_EINVAL is a wrong one, RT_EACCES a
   file it names that others could change (rt_file_trusted). */
static int stage_error(const rtd_t *d, int rc)
{
    fprintf(stderr, "rtd: %s\n", d->err);
    return rc == RT_EINVAL || rc == RT_EACCES ? 2 : 1;
}

/* The MQTT stages fail alike: logged, exit status 1. */
static int mqtt_error(const rtd_t *d)
{
    rt_log(RT_LOG_ERROR, "listener.failed", "%s", d->err);
    return 1;
}

static int start_dirs(rtd_t *d)
{
    const rt_conf_t *c = &d->conf;
    char note[8];
    if (rtd_check_rules_dir(c->rules_dir, d->err, sizeof(d->err)) ||
        rtd_check_data_dir(c->data_dir, true, note, sizeof(note), d->err, sizeof(d->err)))
        return config_error(d);
    rt_log(RT_LOG_INFO, "config.paths",
           "config=%s rules_dir=%s data_dir=%s password_file=%s acl_file=%s admin_socket=%s%s",
           RTD_PATHS_ARGS(c, d->conf_path));
    if (geteuid() == 0)
        rt_log(RT_LOG_WARNING, "rtd.root",
               "running as root: a hole in rtd or a rule would be root's; run it as its own user "
               "(the port below 1024 needs only CAP_NET_BIND_SERVICE)");
    return 0;
}

static int start_auth(rtd_t *d)
{
    return rt_auth_configure(&d->conf, d->err, sizeof(d->err)) ? config_error(d) : 0;
}

static int start_runtime(rtd_t *d)
{
    /* Signals are taken by main's thread alone: blocked before any thread starts. */
    sigemptyset(&d->signals);
    sigaddset(&d->signals, SIGTERM);
    sigaddset(&d->signals, SIGINT);
    sigaddset(&d->signals, SIGHUP);
    sigaddset(&d->signals, RTD_SIGNAL_GAVE_UP);
    pthread_sigmask(SIG_BLOCK, &d->signals, NULL);
    node.main = pthread_self();
    signal(SIGPIPE, SIG_IGN);
    rt_config_t rc;
    rt_config_defaults(&rc);
    rc.schedulers = (unsigned)d->conf.schedulers;
    rc.blocking_threads = (unsigned)d->conf.blocking_threads;
    rc.batch = (unsigned)d->conf.batch;
    rc.min_heap = (size_t)d->conf.min_heap;
    rc.gc_factor = d->conf.gc_factor;
    rc.max_heap = (size_t)d->conf.max_heap;
    int r = rt_init(&rc);
    if (r) {
        rt_log(RT_LOG_ERROR, "runtime.failed", "%s", rt_strerror(r));
        return 1;
    }
    rt_groups_configure(&d->conf);
    rt_spawn_opts_t top = {.name = RTD_TOP_NAME};
    if ((r = rt_spawn_opt(&rt_supervisor_type, (void *)&top_spec, &top, &d->top))) {
        rt_log(RT_LOG_ERROR, "runtime.failed", "cannot start the top supervisor: %s",
               rt_strerror(r));
        rt_shutdown();
        return 1;
    }
    return 0;
}

/*
** Every stage started later has stopped by now, but for the connections, which
** end with the runtime: the store commits what it was sent (rows that a
** republish sink published at its stop included), then every actor ends.
*/
static void stop_runtime(void)
{
    rt_store_sync();
    rt_shutdown();
}

/* Sinks start before anything that makes rows (the rule engine). */
static int start_sinks(rtd_t *d)
{
    int r = rt_sinks_start(&d->conf, d->top, d->err, sizeof(d->err));
    return r ? stage_error(d, r) : 0;
}

/* The rule engine feeds the sinks and is fed by connections: between the two. */
static int start_rules(rtd_t *d)
{
    int r = rt_rules_start(&d->conf, d->top, d->err, sizeof(d->err));
    if (r)
        return stage_error(d, r);
    rt_log(RT_LOG_INFO, "rules.started", "rules=%zu rules_dir=%s", rt_rules_snapshot(NULL, 0),
           d->conf.rules_dir);
    return 0;
}

/* Rule workers hand their last rows to the sinks, which stop next. */
static void stop_rules(void)
{
    log_rules();
    rt_rules_stop();
}

static int start_broker(rtd_t *d)
{
    int r = rt_broker_init(&d->conf);
    if (r) {
        snprintf(d->err, sizeof(d->err), "cannot make the broker's state: %s", rt_strerror(r));
        return mqtt_error(d);
    }
    return 0;
}

/* The rules' counts for the cluster's heartbeats (cluster.h: the cluster sits below them). */
static size_t rule_counts(rt_cluster_rule_count_t *out, size_t max)
{
    static rt_rule_info_t rules[RT_CLUSTER_RULES_MAX]; /* the cluster actor's alone */
    size_t room = max < RT_CLUSTER_RULES_MAX ? max : RT_CLUSTER_RULES_MAX;
    size_t n = rt_rules_snapshot(rules, room); /* how many rules there are: room were copied */
    if (n > room)
        n = room;
    for (size_t i = 0; i < n; i++) {
        size_t len = strnlen(rules[i].name, sizeof(out[i].name) - 1); /* a heartbeat's width */
        memcpy(out[i].name, rules[i].name, len);
        out[i].name[len] = 0;
        out[i].matched = rules[i].matched;
        out[i].passed = rules[i].passed;
        out[i].failed = rules[i].failed;
        out[i].rows_out = rules[i].rows_out;
    }
    return n;
}

/* The cluster's NATS connections and actors, before the first subscription is made: each
   subscription's filter, the restored sessions' among them, becomes a route on NATS. */
static int start_cluster(rtd_t *d)
{
    rt_cluster_set_rule_counts(rule_counts);
    int r = rt_cluster_start(&d->conf, d->top, d->err, sizeof(d->err));
    if (r == 0)
        return 0;
    rt_log(RT_LOG_ERROR, "cluster.failed", "%s", d->err);
    return r == RT_EINVAL ? 2 : 1;
}

/* What the store kept (persistence on): retained messages, and sessions offline until
   their clients return. */
static int start_sessions(rtd_t *d)
{
    int r = rt_sessions_restore(d->top, d->err, sizeof(d->err));
    if (r != RT_EINVAL)
        return r ? mqtt_error(d) : 0;
    /* state.db refused (not ours, damaged, a newer schema, a migration that failed): the
       operator's to look at, as a wrong setting is; restarting would not change it. */
    rt_log(RT_LOG_ERROR, "store.refused", "%s", d->err);
    return config_error(d);
}

/* Once no actor is left: the delayed messages held (state.db keeps them), then the store. */
static void free_sessions(void)
{
    rt_delayed_free();
    rt_store_close();
}

/* The TLS listeners' certificates and keys: a file that does not load stops the start. */
static int start_tls(rtd_t *d)
{
    return rt_tls_open(&d->conf, d->err, sizeof(d->err)) ? config_error(d) : 0;
}

/*
** A socket rtd serves that it cannot bind, named by its setting and the config line that
** set it: the operator's to change, so exit status 2 (no restart would help). Logged, as an
** error under the journal (`journalctl -p err`) or in log_file.
*/
static int bind_error(rtd_t *d, const char *event, const char *setting, const rt_listen_t *l,
                      int rc)
{
    char line[RT_CONF_PATH_MAX + 16] = "";
    if (l->line)
        snprintf(line, sizeof(line), "%s:%d: ", d->conf_path, l->line);
    rt_log(RT_LOG_ERROR, event, "%s%s %s:%d: cannot listen: %s", line, setting, l->host, l->port,
           rt_tcp_listen_strerror(rc));
    return 2;
}

/*
** Every socket rtd serves, bound and listening before anything starts, so a port in use
** fails the start in milliseconds, not after the store, the sinks, the rules and the
** cluster; the kernel queues connections until the listeners take their sockets and
** accept, last. Who may connect is logged here, before the admin socket opens: from
** then on `config set` may be changing what log_access reads.
*/
static int start_sockets(rtd_t *d)
{
    const rt_conf_t *c = &d->conf;
    for (unsigned i = 0; i < c->nlisteners; i++) {
        const rt_listen_t *l = &c->listeners[i];
        int r = rt_tcp_bind_early(l->host, l->port);
        if (r) {
            char setting[32];
            snprintf(setting, sizeof(setting), "listeners[%u]", i + 1);
            return bind_error(d, "listener.failed", setting, l, r);
        }
    }
    int r = c->http.on ? rt_tcp_bind_early(c->http.where.host, c->http.where.port) : 0;
    if (r)
        return bind_error(d, "http.failed", "http.bind", &c->http.where, r);
    if (rt_admin_bind(c, d->err, sizeof(d->err))) {
        rt_log(RT_LOG_ERROR, "admin.failed", "%s", d->err);
        return 2;
    }
    log_access(c);
    return 0;
}

/* Those no listener took: rtd did not start, or a listener's start failed. */
static void close_sockets(void)
{
    rt_tcp_close_early();
    rt_admin_unbind();
}

/* Before the listeners: the first CONNECT may need a full password hash. */
static int start_verifier(rtd_t *d)
{
    int r = rt_auth_verifier_start(d->top);
    if (r) {
        snprintf(d->err, sizeof(d->err), "cannot start the login verifier: %s", rt_strerror(r));
        return mqtt_error(d);
    }
    return 0;
}

/* Before the listeners, after the cluster and the rules: what came due while rtd was
   down is published at once, and reaches them. */
static int start_delayed(rtd_t *d)
{
    int r = rt_delayed_start(d->top);
    if (r) {
        snprintf(d->err, sizeof(d->err), "cannot start delayed publish: %s", rt_strerror(r));
        return mqtt_error(d);
    }
    return 0;
}

/* After the broker and the cluster: what a bridge routes in reaches every subscriber. A
   remote that is down is no start error: the bridge connects when it is back. */
static int start_bridges(rtd_t *d)
{
    int r = rt_bridges_start(&d->conf, d->top, d->err, sizeof(d->err));
    if (r == RT_EINVAL)
        return config_error(d);
    if (r)
        rt_log(RT_LOG_ERROR, "bridge.failed", "%s", d->err);
    return r ? 1 : 0;
}

/* Last: a client is accepted once everything it may reach runs. */
static int start_listeners(rtd_t *d)
{
    return rt_listeners_start(d->top, d->err, sizeof(d->err)) ? mqtt_error(d) : 0;
}

/* $SYS/broker/...: the broker serves without it. */
static int start_sys(rtd_t *d)
{
    int r = rt_sys_start(&d->conf, RTD_VERSION, d->top);
    if (r)
        rt_log(RT_LOG_ERROR, "sys.failed", "no $SYS tree: %s", rt_strerror(r));
    return 0;
}

/* The admin socket accepts once what rtctl reads all runs (its socket is bound early). */
static int start_admin(rtd_t *d)
{
    if (rt_admin_start(&d->conf, RTD_VERSION, d->top, d->err, sizeof(d->err)) == 0)
        return 0;
    rt_log(RT_LOG_ERROR, "admin.failed", "%s", d->err);
    return 1;
}

/* The HTTP listener, when an http table is set: metrics, health and the API. */
static int start_http(rtd_t *d)
{
    if (rt_http_start(&d->conf, d->top, d->err, sizeof(d->err)) == 0)
        return 0;
    rt_log(RT_LOG_ERROR, "http.failed", "%s", d->err);
    return 2;
}

/*
** One stage of rtd's start. start returns 0, or rtd's exit status once it has
** said why it failed (2: a wrong setting or file, 1: anything else); a start that
** fails undoes itself, unless undoing needs the runtime stopped first: then
** `partial` has the failed stage unwound with the started ones. stop runs while
** the runtime still runs and hands on what the stage holds; free runs once no
** actor is left to reach what it frees. Either may be NULL: the actors a stage
** spawned end with the runtime.
*/
typedef struct {
    const char *name; /* of a stage that stops: the log names a slow stop */
    int (*start)(rtd_t *d);
    void (*stop)(void);
    void (*free)(void);
    bool partial;
} stage_t;

/* In the order rtd starts them. */
static const stage_t stages[] = {
    /* rules_dir exists, data_dir is private */
    {.start = start_dirs},
    /* the password and ACL files */
    {.start = start_auth, .free = rt_auth_shutdown},
    {.start = start_tls, .free = rt_tls_close},
    /* every port and the admin socket, bound; accepting starts with the last stages */
    {.start = start_sockets, .free = close_sockets},
    {.name = "runtime", .start = start_runtime, .stop = stop_runtime},
    /* they write or spill what they hold at stop */
    {.name = "sinks", .start = start_sinks, .stop = rt_sinks_stop, .free = rt_sinks_free},
    {.name = "rules", .start = start_rules, .stop = stop_rules},
    /* MQTT: the trie, the retained store and the client table, */
    {.start = start_broker, .free = rt_broker_free},
    {.name = "cluster", .start = start_cluster, .stop = rt_cluster_stop},
    /* then what the store kept (a load that fails has it open and actors running), */
    {.start = start_sessions, .free = free_sessions, .partial = true},
    /* the login verifier, before any CONNECT */
    {.name = "auth pool", .start = start_verifier, .stop = rt_auth_stop_pool},
    {.start = start_delayed},
    {.start = start_bridges, .free = rt_bridges_free},
    {.start = start_sys},
    {.name = "admin", .start = start_admin, .stop = rt_admin_stop},
    /* the HTTP API answers through the admin command layer */
    {.name = "http", .start = start_http, .stop = rt_http_stop},
    {.start = start_listeners},
};

#define NSTAGES (sizeof(stages) / sizeof(stages[0]))
#define RTD_SLOW_STOP_MS 1000

/*
** Stops the first n stages in reverse order, in two passes: every stop (so the
** runtime's, which ends every actor, comes after those of the stages started
** after it), then every free.
*/
static void unwind(size_t n)
{
    for (size_t i = n; i-- > 0;) {
        if (!stages[i].stop)
            continue;
        uint64_t t0 = rt_mono_ms();
        stages[i].stop();
        /* A stop waits for actors to hand on what they hold (rows to their databases): one
           that takes long says where, for the operator whose service manager ran out of
           patience. */
        uint64_t took = rt_mono_ms() - t0;
        if (took >= RTD_SLOW_STOP_MS)
            rt_log(RT_LOG_WARNING, "rtd.slow_stop", "stage=%s ms=%llu", stages[i].name,
                   (unsigned long long)took);
    }
    for (size_t i = n; i-- > 0;)
        if (stages[i].free)
            stages[i].free();
}

/* SIGHUP reloads; SIGTERM or SIGINT returns, as does the end of the tree. */
static void serve(rtd_t *d)
{
    for (;;) {
        int sig = 0;
        if (sigwait(&d->signals, &sig) != 0)
            continue;
        if (sig == RTD_SIGNAL_GAVE_UP)
            return;
        if (sig != SIGHUP) {
            rt_log(RT_LOG_INFO, "rtd.stopping", "signal=%d", sig);
            return;
        }
        /* logrotate's postrotate: the log file moved away, lines go to a new one. */
        if (rt_log_reopen() != 0)
            rt_log(RT_LOG_ERROR, "log.reopen_failed", "log_file=%s error=%s", d->conf.log_file,
                   strerror(errno));
        /* What `rtctl auth|rules|tls|apikey reload` do; a bad file leaves the running one
           in force (logged by the reload). */
        rt_admin_reload_auth(d->err, sizeof(d->err));
        rt_admin_reload_rules(d->err, sizeof(d->err));
        rt_admin_reload_tls(d->err, sizeof(d->err));
        rt_http_keys_reload(d->err, sizeof(d->err));
    }
}

/* Tells systemd (notify.h); a unit that waits for READY=1 in vain would time out and kill
   rtd, so a failure is logged. */
static void notify(const char *state)
{
    int r = rtd_notify(state);
    if (r)
        rt_log(RT_LOG_WARNING, "rtd.notify", "cannot tell systemd %s: %s", state,
               r == RT_EINVAL ? "NOTIFY_SOCKET is not a socket address" : strerror(-r));
}

int main(int argc, char **argv)
{
    static rtd_t d = {.conf_path = RTD_CONFIG_FILE};
    const char *overrides[64];
    int noverrides = 0;
    bool check = false;
    rt_sinks_schema(); /* before anything reads the schema: the loader, config show, the docs */
    for (size_t i = 0; argc > 1 && i < NSUBCOMMANDS; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0)
            return subcommands[i].main(argc - 1, argv + 1);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            d.conf_path = argv[++i];
        } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc && noverrides < 64) {
            overrides[noverrides++] = argv[++i];
        } else if (strcmp(argv[i], "--check") == 0) {
            check = true;
        } else if (strncmp(argv[i], "--print-schema=", 15) == 0) {
            if (rt_conf_schema_print(argv[i] + 15, stdout) != 0) {
                fprintf(stderr, "rtd: --print-schema=markdown or --print-schema=man\n");
                return 2;
            }
            return fflush(stdout) == 0 ? 0 : 1;
        } else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-v") == 0) {
            printf("rtd %s\n", RTD_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "rtd: unknown argument %s\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    rt_conf_defaults(&d.conf);
#ifdef RTD_DATA_DIR
    snprintf(d.conf.data_dir, sizeof(d.conf.data_dir), "%s", RTD_DATA_DIR);
#endif
    /* The file names every other file and key: others who could change it own rtd. */
    if (rt_file_trusted(-1, d.conf_path, "config file", d.err, sizeof(d.err)) == RT_EACCES ||
        rt_conf_load(&d.conf, d.conf_path, d.err, sizeof(d.err)) != 0)
        return config_error(&d);
    for (int i = 0; i < noverrides; i++)
        if (rt_conf_set(&d.conf, overrides[i], d.err, sizeof(d.err)) != 0)
            return config_error(&d);
    if (check) {
        rt_log_level_t level = RT_LOG_INFO;
        rt_log_parse_level(d.conf.log_level, &level);
        rt_log_open(NULL, level, false);
        return rtd_check(&d.conf, d.conf_path);
    }
    /* Everything rtd creates (databases, their -wal and -shm, spills, its log) is its own
       alone. */
    umask(077);
    if (open_log(&d) != 0)
        return config_error(&d);
    size_t started = 0;
    int status = 0;
    while (started < NSTAGES && (status = stages[started].start(&d)) == 0)
        started++;
    if (status) {
        atomic_store(&node.stopping, true);
        unwind(started + stages[started].partial);
        return status;
    }
    rt_log(RT_LOG_INFO, "rtd.started", "version=%s config=%s", RTD_VERSION, d.conf_path);
    notify("READY=1");
    serve(&d);
    notify("STOPPING=1");
    atomic_store(&node.stopping, true);
    bool gave_up = atomic_load(&node.gave_up);
    unwind(NSTAGES);
    if (gave_up) {
        rt_log(RT_LOG_ERROR, "rtd.stopped", "the supervision tree gave up (rtctl tree, log)");
        return RTD_EXIT_GAVE_UP;
    }
    rt_log(RT_LOG_INFO, "rtd.stopped", "clean shutdown");
    return 0;
}

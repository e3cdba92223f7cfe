/*
** rtd: the MQTT broker daemon. Reads etc/rtd.conf (or -c FILE), applies -o
** overrides, starts the runtime and the listeners, and runs until SIGTERM or
** SIGINT, then shuts down cleanly (MQTT 5 clients get DISCONNECT 0x8B).
*/
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "admin.h"
#include "auth.h"
#include "conn.h"
#include "config.h"
#include "log.h"
#include "rule_engine.h"
#include "sink.h"
#include "store.h"
#include "sys.h"

#define RTD_VERSION "0.1.0"

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
               "memory=%llu rows=%llu%s%s",
               r->name, (unsigned long long)r->matched, (unsigned long long)r->passed,
               (unsigned long long)r->filtered, (unsigned long long)r->failed_exception,
               (unsigned long long)r->failed_budget, (unsigned long long)r->failed_memory,
               (unsigned long long)r->rows_out, r->last_error[0] ? " last_error=" : "",
               r->last_error);
    }
    free(info);
    rt_rules_worker_info_t wi[64];
    n = rt_rules_workers(wi, 64);
    for (size_t i = 0; i < n && i < 64; i++)
        rt_log(RT_LOG_INFO, "rule.worker", "worker=%zu messages=%llu batches=%llu", i,
               (unsigned long long)wi[i].messages, (unsigned long long)wi[i].batches);
}

/* Why `stat(path, st) == 0 && S_ISDIR` failed; st is zeroed before the call. */
static const char *describe_stat_failure(const struct stat *st)
{
    return st->st_mode ? "not a directory" : strerror(errno);
}

/*
** data_dir holds stored payloads (state.db, sink databases, spills) and the admin
** socket: made 0700 if missing, and refused if group or others may write it (they
** could swap the files under rtd). One readable by them is made 0700, as an older
** rtd left it 0755. Its files are 0600 through the umask rtd runs with.
*/
static int prepare_data_dir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "data_dir %s: cannot create: %s", dir, strerror(errno));
        return 1;
    }
    struct stat st = {0};
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "data_dir %s: %s", dir, describe_stat_failure(&st));
        return 1;
    }
    unsigned mode = (unsigned)st.st_mode & 07777;
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(err, errlen,
                 "data_dir %s is writable by %s (mode %04o): others could replace the databases; "
                 "chmod 0700 it or name another",
                 dir, st.st_mode & S_IWOTH ? "every user" : "its group", mode);
        return 1;
    }
    if (st.st_mode & 077) {
        if (chmod(dir, 0700) != 0) {
            snprintf(err, errlen,
                     "data_dir %s is readable by others (mode %04o) and cannot be "
                     "made 0700: %s",
                     dir, mode, strerror(errno));
            return 1;
        }
        rt_log(RT_LOG_WARNING, "data_dir.mode", "data_dir=%s was=%04o now=0700", dir, mode);
    }
    return 0;
}

/* rules_dir must exist at start: a mistyped one would run with no rules at all. */
static int check_rules_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st = {0};
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "rules_dir %s: %s", dir, describe_stat_failure(&st));
        return 1;
    }
    return 0;
}

typedef struct {
    const char *key;
    char value[RT_CONF_VALUE_LEN * 2];
} conf_value_t;

static void pick_value(const char *key, const char *value, const char *help, void *ud)
{
    (void)help;
    conf_value_t *v = ud;
    if (strcmp(key, v->key) == 0)
        snprintf(v->value, sizeof(v->value), "%s", value);
}

/*
** What is open to whom, one line per listener: where it listens, who may connect
** without a user name, and which user names are accepted.
*/
static void log_access(const rt_conf_t *c)
{
    conf_value_t from = {.key = "anonymous_from"};
    rt_conf_each(c, pick_value, &from);
    char anonymous[sizeof(from.value) + 8];
    if (c->allow_anonymous && c->nanonymous_from)
        snprintf(anonymous, sizeof(anonymous), "from %s", from.value);
    else
        snprintf(anonymous, sizeof(anonymous), "nobody");
    char users[300];
    if (c->password_file[0])
        snprintf(users, sizeof(users), "users in %s", c->password_file);
    else
        snprintf(users, sizeof(users), "any user name, no password checked");
    for (unsigned i = 0; i < c->nlisteners; i++) {
        const rt_listen_t *l = &c->listeners[i];
        bool v6 = strchr(l->host, ':') != NULL;
        rt_log(RT_LOG_INFO, "listener.access", "listener=%s%s%s:%d anonymous=\"%s\" users=\"%s\"",
               v6 ? "[" : "", l->host, v6 ? "]" : "", l->port, anonymous, users);
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: rtd [-c FILE] [-o name=value]... [--version]\n"
                 "       rtd passwd [-c] [-D] [-b] [-I ROUNDS] FILE USER [PASSWORD]\n"
                 "  -c FILE          configuration file (default etc/rtd.conf)\n"
                 "  -o name=value    override one setting of the file\n"
                 "  passwd           add, change (-c: new file) or delete (-D) a user of a\n"
                 "                   password file, like mosquitto_passwd\n");
}

/*
** Once everything runs: rule workers hand over their last rows, then sinks write
** or spill what they hold, before the runtime stops every actor; what sessions
** changed is on disk first.
*/
static void stop_all(void)
{
    rt_rules_stop();
    rt_sinks_stop();
    rt_store_sync();
    rt_shutdown();
    rt_broker_free();
    rt_sinks_free();
    rt_auth_shutdown();
}

int main(int argc, char **argv)
{
    const char *conf_path = "etc/rtd.conf";
    const char *overrides[64];
    int noverrides = 0;
    if (argc > 1 && strcmp(argv[1], "passwd") == 0)
        return rt_auth_passwd_main(argc - 1, argv + 1);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            conf_path = argv[++i];
        } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc && noverrides < 64) {
            overrides[noverrides++] = argv[++i];
        } else if (strcmp(argv[i], "--version") == 0) {
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
    rt_conf_t conf;
    char err[RT_CONF_ERR_LEN];
    rt_conf_defaults(&conf);
    if (rt_conf_load(&conf, conf_path, err, sizeof(err)) != 0) {
        fprintf(stderr, "rtd: %s\n", err);
        return 2;
    }
    for (int i = 0; i < noverrides; i++) {
        if (rt_conf_set(&conf, overrides[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "rtd: %s\n", err);
            return 2;
        }
    }
    rt_log_level_t level = RT_LOG_INFO;
    rt_log_parse_level(conf.log_level, &level);
    rt_log_open(NULL, level, false);
    /* Everything rtd creates (databases, their -wal and -shm, spills) is its own alone. */
    umask(077);
    if (check_rules_dir(conf.rules_dir, err, sizeof(err)) ||
        prepare_data_dir(conf.data_dir, err, sizeof(err))) {
        fprintf(stderr, "rtd: %s\n", err);
        return 2;
    }
    rt_log(RT_LOG_INFO, "config.paths",
           "config=%s rules_dir=%s data_dir=%s password_file=%s acl_file=%s admin_socket=%s%s",
           conf_path, conf.rules_dir, conf.data_dir,
           conf.password_file[0] ? conf.password_file : "-", conf.acl_file[0] ? conf.acl_file : "-",
           conf.admin_socket[0] ? conf.admin_socket : conf.data_dir,
           conf.admin_socket[0] ? "" : "/rtd.sock");
    /* The password and ACL files, checked before anything starts. */
    if (rt_auth_configure(&conf, err, sizeof(err)) != 0) {
        fprintf(stderr, "rtd: %s\n", err);
        return 2;
    }

    /* Signals are taken by this thread alone: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    rt_config_t rc;
    rt_config_defaults(&rc);
    rc.schedulers = (unsigned)conf.schedulers;
    rc.blocking_threads = (unsigned)conf.blocking_threads;
    rc.batch = (unsigned)conf.batch;
    rc.min_heap = (size_t)conf.min_heap;
    rc.gc_factor = conf.gc_factor;
    rc.max_heap = (size_t)conf.max_heap;
    int r = rt_init(&rc);
    if (r) {
        rt_log(RT_LOG_ERROR, "runtime.failed", "%s", rt_strerror(r));
        rt_auth_shutdown();
        return 1;
    }
    /* Sinks start before anything that makes rows (the rule engine); their keys are
       checked here, so a bad sinks table is a config error (exit 2) like any other. */
    r = rt_sinks_start(&conf, err, sizeof(err));
    if (r != 0) {
        fprintf(stderr, "rtd: %s\n", err);
        rt_shutdown();
        rt_sinks_free();
        return r == RT_EINVAL ? 2 : 1;
    }
    /* The rule engine feeds the sinks and is fed by connections: between the two. */
    r = rt_rules_start(&conf, err, sizeof(err));
    if (r != 0) {
        fprintf(stderr, "rtd: %s\n", err);
        rt_sinks_stop();
        rt_shutdown();
        rt_sinks_free();
        rt_auth_shutdown();
        return r == RT_EINVAL ? 2 : 1;
    }
    rt_log(RT_LOG_INFO, "rules.started", "rules=%zu rules_dir=%s", rt_rules_snapshot(NULL, 0),
           conf.rules_dir);
    if (rt_mqtt_start(&conf, err, sizeof(err)) != 0) {
        rt_log(RT_LOG_ERROR, "listener.failed", "%s", err);
        rt_rules_stop();
        rt_sinks_stop();
        rt_shutdown();
        rt_broker_free();
        rt_sinks_free();
        rt_auth_shutdown();
        return 1;
    }
    /* $SYS/broker/...: stopped by rt_shutdown with every other actor. */
    if ((r = rt_sys_start(&conf, RTD_VERSION)) != 0)
        rt_log(RT_LOG_ERROR, "sys.failed", "no $SYS tree: %s", rt_strerror(r));
    /* The admin socket last: what rtctl reads is all running by then. */
    if (rt_admin_start(&conf, RTD_VERSION, err, sizeof(err)) != 0) {
        rt_log(RT_LOG_ERROR, "admin.failed", "%s", err);
        stop_all();
        return 1;
    }
    log_access(&conf);
    rt_log(RT_LOG_INFO, "rtd.started", "version=%s config=%s", RTD_VERSION, conf_path);
    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            /* What `rtctl auth reload` and `rtctl rules reload` do; a bad file leaves the
               running one in force (logged by the reload). */
            rt_admin_reload_auth(err, sizeof(err));
            rt_admin_reload_rules(err, sizeof(err));
            continue;
        }
        rt_log(RT_LOG_INFO, "rtd.stopping", "signal=%d", sig);
        break;
    }
    rt_admin_stop();
    log_rules();
    stop_all();
    rt_log(RT_LOG_INFO, "rtd.stopped", "clean shutdown");
    return 0;
}

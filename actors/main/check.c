/*
** rtd's checks of its settings and files before it starts (check.h), and `rtd --check`,
** which runs every one of them with nothing started: the same loaders the start uses, so
** a file that --check passes is one the start reads.
*/
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "auth.h"
#include "bridge.h"
#include "check.h"
#include "cluster.h"
#include "http.h"
#include "log.h"
#include "rule_engine.h"
#include "sink.h"
#include "tls.h"

/* Why `stat(path, st) == 0 && S_ISDIR` failed; st is zeroed before the call. */
static const char *describe_stat_failure(const struct stat *st)
{
    return st->st_mode ? "not a directory" : strerror(errno);
}

int rtd_check_rules_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st = {0};
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "rules_dir %s: %s", dir, describe_stat_failure(&st));
        return 1;
    }
    return 0;
}

/* A data_dir that does not exist yet: whether the start could make it (its parent is a
   directory). */
static int check_missing_data_dir(const char *dir, char *note, size_t notelen, char *err,
                                  size_t errlen)
{
    char parent[RT_CONF_PATH_MAX];
    const char *slash = strrchr(dir, '/');
    snprintf(parent, sizeof(parent), "%.*s", slash && slash != dir ? (int)(slash - dir) : 1,
             slash ? dir : ".");
    struct stat st = {0};
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "data_dir %s: cannot be made: %s: %s", dir, parent,
                 describe_stat_failure(&st));
        return 1;
    }
    snprintf(note, notelen, "missing: made 0700 at start");
    return 0;
}

int rtd_check_data_dir(const char *dir, bool make, char *note, size_t notelen, char *err,
                       size_t errlen)
{
    note[0] = 0;
    if (make && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "data_dir %s: cannot create: %s", dir, strerror(errno));
        return 1;
    }
    struct stat st = {0};
    if (!make && stat(dir, &st) != 0 && errno == ENOENT)
        return check_missing_data_dir(dir, note, notelen, err, errlen);
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
    if (!(st.st_mode & 077))
        return 0;
    if (!make) {
        snprintf(note, notelen, "mode %04o: made 0700 at start", mode);
        return 0;
    }
    if (chmod(dir, 0700) != 0) {
        snprintf(err, errlen,
                 "data_dir %s is readable by others (mode %04o) and cannot be made 0700: %s", dir,
                 mode, strerror(errno));
        return 1;
    }
    rt_log(RT_LOG_WARNING, "data_dir.mode", "data_dir=%s was=%04o now=0700", dir, mode);
    return 0;
}

typedef struct {
    const char *key;
    char value[RT_CONF_VALUE_LEN * 2];
} conf_value_t;

static void pick_value(const rt_conf_value_t *cv, void *ud)
{
    conf_value_t *v = ud;
    if (strcmp(cv->name, v->key) == 0)
        snprintf(v->value, sizeof(v->value), "%s", cv->value);
}

void rtd_access(const rt_conf_t *c, unsigned i, rtd_access_t *out)
{
    conf_value_t from = {.key = "anonymous_from"};
    rt_conf_each(c, pick_value, &from);
    if (c->allow_anonymous && c->nanonymous_from)
        snprintf(out->anonymous, sizeof(out->anonymous), "from %s", from.value);
    else
        snprintf(out->anonymous, sizeof(out->anonymous), "nobody");
    if (c->password_file[0])
        snprintf(out->users, sizeof(out->users), "users in %s", c->password_file);
    else
        snprintf(out->users, sizeof(out->users), "none: no password_file, a user name is anonymous");
    const rt_listen_t *l = &c->listeners[i];
    bool v6 = strchr(l->host, ':') != NULL;
    snprintf(out->listener, sizeof(out->listener), "%s%s%s:%d", v6 ? "[" : "", l->host,
             v6 ? "]" : "", l->port);
}

/*
** What a listener speaks (kind: mqtt, websocket or http, with what it is layered on) and,
** with TLS, the certificate it serves (loaded by rt_tls_open).
*/
static void transport_line(const rt_listen_t *l, const char *kind, unsigned tls_index, char *out,
                           size_t len)
{
    int n = snprintf(out, len, "transport=%s%s%s", l->proxy_protocol ? "proxy+" : "", kind,
                     l->tls_on ? "+tls" : "");
    if (l->websocket[0] && n > 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, " path=%s", l->websocket);
    rt_tls_info_t info;
    if (n > 0 && (size_t)n < len && rt_tls_info(tls_index, &info))
        snprintf(out + n, len - (size_t)n, " cert=\"%s\" not_after=%s days_left=%ld", info.subject,
                 info.not_after, info.days_left);
}

/* The sinks of c by name, enabled ones first: "archive; disabled: mongo republish". */
static void sinks_line(const rt_conf_t *c, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int enabled = 1; enabled >= 0; enabled--) {
        int count = 0;
        for (unsigned i = 0; i < c->sinks.n && n < len; i++) {
            if (rt_sinks_enabled(c, c->sinks.s[i].name) != (enabled == 1))
                continue;
            int w = snprintf(out + n, len - n, "%s%s",
                             count++   ? ","
                             : enabled ? ""
                                       : " disabled=",
                             c->sinks.s[i].name);
            n += w > 0 ? (size_t)w : 0;
        }
        if (enabled && count == 0 && n < len)
            n += (size_t)snprintf(out + n, len - n, "-");
    }
}

/* Each check in the start's order; the first that fails is the answer. */
static int check_all(const rt_conf_t *c, size_t *nrules, char *note, size_t notelen, char *err,
                     size_t errlen)
{
    if (rtd_check_rules_dir(c->rules_dir, err, errlen) ||
        rtd_check_data_dir(c->data_dir, false, note, notelen, err, errlen))
        return 1;
    if (rt_auth_configure(c, err, errlen) || rt_tls_open(c, err, errlen))
        return 1;
    if (c->http.on && c->http.api_keys_file[0] &&
        rt_http_keys_load(c->http.api_keys_file, err, errlen))
        return 1;
    return rt_cluster_check(c, err, errlen) || rt_sinks_check(c, err, errlen) ||
           rt_bridges_check(c, err, errlen) || rt_rules_check(c, nrules, err, errlen);
}

int rtd_check(const rt_conf_t *c, const char *conf_path)
{
    char err[RT_CONF_ERR_LEN], note[128], line[RT_LOG_LINE_MAX];
    size_t nrules = 0;
    int failed = check_all(c, &nrules, note, sizeof(note), err, sizeof(err));
    if (failed) {
        fprintf(stderr, "rtd: %s\n", err);
        rt_tls_close();
        rt_auth_shutdown();
        return 2;
    }
    printf("config.paths config=%s rules_dir=%s data_dir=%s password_file=%s acl_file=%s "
           "admin_socket=%s%s\n",
           RTD_PATHS_ARGS(c, conf_path));
    if (note[0])
        printf("data_dir %s %s\n", c->data_dir, note);
    for (unsigned i = 0; i < c->nlisteners; i++) {
        char transport[512];
        rtd_access_t a;
        rtd_access(c, i, &a);
        const rt_listen_t *l = &c->listeners[i];
        transport_line(l, l->websocket[0] ? "websocket" : "mqtt", i, transport, sizeof(transport));
        printf("listener.access listener=%s anonymous=\"%s\" users=\"%s\" %s\n", a.listener,
               a.anonymous, a.users, transport);
    }
    if (c->http.on) {
        char transport[512];
        transport_line(&c->http.where, "http", RT_TLS_HTTP, transport, sizeof(transport));
        printf("http listener=%s:%d %s api_keys_file=%s metrics_public=%s\n", c->http.where.host,
               c->http.where.port, transport,
               c->http.api_keys_file[0] ? c->http.api_keys_file : "-",
               c->http.metrics_public ? "true" : "false");
    }
    if (c->cluster.on)
        printf("cluster node=%s nats=%s%s\n", c->cluster.node, c->cluster.nats[0],
               c->cluster.nnats > 1 ? ",..." : "");
    sinks_line(c, line, sizeof(line));
    printf("sinks enabled=%s\n", line);
    printf("rules rules=%zu rules_dir=%s\n", nrules, c->rules_dir);
    printf("rtd --check: %s would start (nothing was bound, started or created)\n", conf_path);
    rt_tls_close();
    rt_auth_shutdown();
    return 0;
}

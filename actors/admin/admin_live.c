/*
** What changes in a running rtd through the admin socket or SIGHUP: its settings
** (`config set`, `log level`) and the files it reads again (`auth reload`,
** `rules reload`), one change at a time.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "auth.h"
#include "c2s.h"
#include "conn.h"
#include "log.h"
#include "rule_engine.h"
#include "tls.h"

static struct {
    rt_conf_t *conf;             /* rtd's settings; `config set` changes them (conf_lock) */
    pthread_mutex_t reload_lock; /* one change at a time: SIGHUP, rtctl, or both */
    pthread_mutex_t conf_lock;   /* conf's text: `config show` reads it while `config set` writes */
} live = {.reload_lock = PTHREAD_MUTEX_INITIALIZER, .conf_lock = PTHREAD_MUTEX_INITIALIZER};

void rt__admin_live_init(rt_conf_t *conf)
{
    live.conf = conf;
}

const rt_conf_t *rt__admin_conf(void)
{
    return live.conf;
}

/*
** After an ACL was loaded from conf: the subscriptions made under the old one
** are checked against it too (conn.c), not only the next SUBSCRIBE. Without an
** ACL file everything is allowed, so there is nothing to take back.
*/
static void recheck_subscriptions(const rt_conf_t *conf)
{
    if (!conf->acl_file[0])
        return;
    size_t asked = 0;
    if (rt_broker_recheck_acl(&asked) != 0)
        rt_log(RT_LOG_WARNING, "acl.recheck_incomplete", "asked=%zu (out of memory)", asked);
}

int rt_admin_reload_auth(char *err, size_t errlen)
{
    RT_ASSERT(live.conf); /* from rt_admin_start */
    pthread_mutex_lock(&live.reload_lock);
    pthread_mutex_lock(&live.conf_lock);
    int rc = rt_auth_configure(live.conf, err, errlen);
    if (rc == 0)
        recheck_subscriptions(live.conf);
    pthread_mutex_unlock(&live.conf_lock);
    pthread_mutex_unlock(&live.reload_lock);
    if (rc)
        rt_log(RT_LOG_ERROR, "rtd.reload_failed", "%s", err);
    else
        rt_log(RT_LOG_INFO, "rtd.reloaded", "password_file=%s acl_file=%s",
               live.conf->password_file[0] ? live.conf->password_file : "-",
               live.conf->acl_file[0] ? live.conf->acl_file : "-");
    return rc;
}

int rt_admin_reload_rules(char *err, size_t errlen)
{
    RT_ASSERT(live.conf); /* from rt_admin_start */
    pthread_mutex_lock(&live.reload_lock);
    uint64_t t0 = rt_mono_ns();
    int rc = rt_rules_reload(err, errlen);
    double ms = (double)(rt_mono_ns() - t0) / 1e6;
    pthread_mutex_unlock(&live.reload_lock);
    rt_rules_stats_t st = {0};
    if (rc)
        rt_log(RT_LOG_ERROR, "rules.reload_failed", "ms=%.1f error=%s", ms, err);
    else if (rt_rules_stats(&st) == 0)
        rt_log(RT_LOG_INFO, "rules.reloaded", "version=%llu rules=%u ms=%.1f rules_dir=%s",
               (unsigned long long)st.version, st.rules, ms, live.conf->rules_dir);
    return rc;
}

int rt_admin_reload_tls(char *err, size_t errlen)
{
    pthread_mutex_lock(&live.reload_lock);
    int rc = rt_tls_reload(err, errlen); /* logs each listener's outcome */
    char s2s_err[256];
    int s2s = rt_c2s_s2s_reload_tls(s2s_err, sizeof(s2s_err)); /* federation's outgoing side */
    if (s2s && !rc) {
        snprintf(err, errlen, "%s", s2s_err);
        rc = s2s;
    }
    pthread_mutex_unlock(&live.reload_lock);
    return rc;
}

void rt__admin_conf_each(void (*fn)(const rt_conf_value_t *v, void *ud), void *ud)
{
    pthread_mutex_lock(&live.conf_lock);
    rt_conf_each(live.conf, fn, ud);
    pthread_mutex_unlock(&live.conf_lock);
}

/* The settings that can change while rtd runs, besides the broker's (rt_broker_set_limit):
   the login policy's files and addresses, applied together by rt_auth_configure. */
static bool auth_setting(const char *key)
{
    return strcmp(key, "password_file") == 0 || strcmp(key, "acl_file") == 0 ||
           strcmp(key, "anonymous_from") == 0;
}

#define LIMITS_MAX 64

/*
** Whether the broker can change key live (false for settings it does not own),
** and what a change applies to (*affects, static text, when the broker owns it).
*/
static bool broker_live_affects(const char *key, const char **affects)
{
    rt_limit_info_t limits[LIMITS_MAX];
    size_t n = rt_broker ? rt_broker_limits(limits, LIMITS_MAX) : 0;
    for (size_t i = 0; i < n && i < LIMITS_MAX; i++)
        if (strcmp(limits[i].key, key) == 0) {
            *affects = limits[i].affects;
            return limits[i].live;
        }
    return false;
}

static bool broker_live(const char *key)
{
    const char *affects;
    return broker_live_affects(key, &affects);
}

/* What rt__admin_conf_set can change live: the schema's live flag is checked against it. */
static bool changes_live(const char *key, const char **applies)
{
    *applies = "";
    if (strcmp(key, "log_level") == 0)
        return (*applies = "at once"), true;
    if (auth_setting(key))
        return (*applies = "CONNECTs from now on; a bad file changes nothing"), true;
    return broker_live_affects(key, applies);
}

bool rt__admin_conf_live(const char *key, const char **applies)
{
    const rt_setting_t *s = rt_conf_setting(key);
    bool live = changes_live(key, applies);
    RT_ASSERT(!s || !rt_broker || s->live == live);
    (void)live; /* release builds check nothing */
    return s && s->live;
}

int rt__admin_conf_set(const char *key, const char *value, char *err, size_t errlen)
{
    char assignment[RT_ADMIN_LINE_MAX];
    snprintf(assignment, sizeof(assignment), "%s=%s", key, value);
    /* Checked on a copy first: the config loader knows every setting's type and range. */
    rt_conf_t *scratch = malloc(sizeof(*scratch));
    if (!scratch) {
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    pthread_mutex_lock(&live.conf_lock);
    *scratch = *live.conf;
    pthread_mutex_unlock(&live.conf_lock);
    int rc = rt_conf_set_from(scratch, "rtctl", assignment, err, errlen);
    if (rc) {
        free(scratch);
        return strstr(err, "unknown setting") ? 404 : 400;
    }
    int code = 200;
    pthread_mutex_lock(&live.reload_lock);
    if (strcmp(key, "log_level") == 0) {
        rt_log_level_t level;
        rt_log_parse_level(scratch->log_level, &level);
        rt_log_set_level(level);
    } else if (auth_setting(key)) {
        /* The files are read before anything changes: a bad one leaves both as they were. */
        if (rt_auth_configure(scratch, err, errlen) != 0)
            code = 409;
        else
            recheck_subscriptions(scratch);
    } else if (broker_live(key)) {
        rc = rt_broker_set_limit(key, value, err, errlen);
        code = rc == 0 ? 200 : rc == RT_EBUSY ? 409 : rc == RT_ENOTFOUND ? 404 : 400;
    } else {
        snprintf(err, errlen,
                 "%s cannot change while rtd runs: set it in the config file (or rtd -o) and "
                 "restart rtd",
                 key);
        code = 409;
    }
    if (code == 200) {
        pthread_mutex_lock(&live.conf_lock);
        *live.conf = *scratch;
        pthread_mutex_unlock(&live.conf_lock);
        /* The broker logs its own settings' changes, with the value they had. */
        if (!broker_live(key))
            rt_log(RT_LOG_WARNING, "config.set", "setting=%s value=%s", key, value);
    }
    pthread_mutex_unlock(&live.reload_lock);
    free(scratch);
    return code;
}

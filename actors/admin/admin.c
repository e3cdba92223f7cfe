/*
** The admin socket's transport: the socket file, the listener, one actor per
** client, the worker on the blocking pool, request parsing and dispatch.
** The commands themselves are in admin_cmd.c, admin_top.c and admin_clients.c.
*/
#define _GNU_SOURCE /* O_PATH */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "acl.h"
#include "admin_impl.h"
#include "auth.h"
#include "conn.h"
#include "log.h"
#include "rule_engine.h"

#define RT_ADMIN_SAMPLE_MS 1000 /* the listener's tick: scheduler utilisation for `vm` */
#define RT_ADMIN_SCHED_MAX 256

enum {
    MSG_TICK = RT_MSG_USER,  /* listener: sample the schedulers */
    MSG_JOB,                 /* worker: data is a request line; reply MSG_JOB_DONE */
    MSG_JOB_DONE,            /* connection: data is job_done_t and the body */
    MSG_GATHER_TIMEOUT,      /* connection: stop waiting for connection actors */
};

typedef struct {
    uint64_t cookie;
    int code;
} job_done_t;

/* ---- process-wide facts ---- */

static struct {
    rt_conf_t *conf;         /* rtd's settings; `config set` changes them (conf_lock) */
    const char *version;
    char path[PATH_MAX];     /* the socket file */
    dev_t dev;               /* its inode, so a stop never removes another rtd's socket */
    ino_t ino;
    uint64_t started_ms;     /* CLOCK_MONOTONIC */
    rt_pid_t listener, worker;
    pthread_mutex_t reload_lock; /* one reload at a time: SIGHUP, rtctl, or both */
    pthread_mutex_t conf_lock;   /* conf's text: `config show` reads it while `config set` writes */
    pthread_mutex_t util_lock;
    size_t nutil;
    double util[RT_ADMIN_SCHED_MAX];
} A = {.reload_lock = PTHREAD_MUTEX_INITIALIZER,
       .conf_lock = PTHREAD_MUTEX_INITIALIZER,
       .util_lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

const rt_conf_t *rt__admin_conf(void) { return A.conf; }
const char *rt__admin_version(void) { return A.version; }
uint64_t rt__admin_uptime_ms(void) { return mono_ms() - A.started_ms; }

void rt__admin_pid_text(rt_pid_t pid, char *out, size_t n)
{
    snprintf(out, n, "<%u.%u>", (unsigned)(uint32_t)pid, (unsigned)(pid >> 32));
}

int rt__admin_parse_pid(const char *s, rt_pid_t *out)
{
    unsigned long slot, gen;
    char end;
    if (sscanf(s, "<%lu.%lu%c", &slot, &gen, &end) == 3 && end == '>' && slot <= UINT32_MAX &&
        gen <= UINT32_MAX) {
        *out = (rt_pid_t)gen << 32 | slot;
        return 0;
    }
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno || e == s || *e || !v)
        return RT_EINVAL;
    *out = v;
    return 0;
}

size_t rt__admin_sched_util(double *util, size_t max)
{
    pthread_mutex_lock(&A.util_lock);
    size_t n = A.nutil < max ? A.nutil : max;
    memcpy(util, A.util, n * sizeof(double));
    pthread_mutex_unlock(&A.util_lock);
    return n;
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
    pthread_mutex_lock(&A.reload_lock);
    pthread_mutex_lock(&A.conf_lock);
    int rc = rt_auth_configure(A.conf, err, errlen);
    if (rc == 0)
        recheck_subscriptions(A.conf);
    pthread_mutex_unlock(&A.conf_lock);
    pthread_mutex_unlock(&A.reload_lock);
    if (rc)
        rt_log(RT_LOG_ERROR, "rtd.reload_failed", "%s", err);
    else
        rt_log(RT_LOG_INFO, "rtd.reloaded", "password_file=%s acl_file=%s",
               A.conf->password_file[0] ? A.conf->password_file : "-",
               A.conf->acl_file[0] ? A.conf->acl_file : "-");
    return rc;
}

int rt_admin_reload_rules(char *err, size_t errlen)
{
    pthread_mutex_lock(&A.reload_lock);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = rt_rules_reload(err, errlen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_unlock(&A.reload_lock);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    rt_rules_stats_t st = {0};
    if (rc)
        rt_log(RT_LOG_ERROR, "rules.reload_failed", "ms=%.1f %s", ms, err);
    else if (rt_rules_stats(&st) == 0)
        rt_log(RT_LOG_INFO, "rules.reloaded", "version=%llu rules=%u ms=%.1f rules_dir=%s",
               (unsigned long long)st.version, st.rules, ms, A.conf->rules_dir);
    return rc;
}

void rt__admin_conf_each(void (*fn)(const char *key, const char *value, const char *help,
                                    void *ud),
                         void *ud)
{
    pthread_mutex_lock(&A.conf_lock);
    rt_conf_each(A.conf, fn, ud);
    pthread_mutex_unlock(&A.conf_lock);
}

/* The settings that can change while rtd runs, besides the broker's (rt_broker_set_limit). */
static bool auth_setting(const char *key)
{
    return strcmp(key, "password_file") == 0 || strcmp(key, "acl_file") == 0;
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

bool rt__admin_conf_live(const char *key, const char **applies)
{
    *applies = "";
    if (strcmp(key, "log_level") == 0)
        return (*applies = "at once"), true;
    if (auth_setting(key))
        return (*applies = "CONNECTs from now on; a bad file changes nothing"), true;
    return broker_live_affects(key, applies);
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
    pthread_mutex_lock(&A.conf_lock);
    *scratch = *A.conf;
    pthread_mutex_unlock(&A.conf_lock);
    int rc = rt_conf_set(scratch, assignment, err, errlen);
    if (rc) {
        free(scratch);
        return strstr(err, "unknown setting") ? 404 : 400;
    }
    int code = 200;
    pthread_mutex_lock(&A.reload_lock);
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
        pthread_mutex_lock(&A.conf_lock);
        *A.conf = *scratch;
        pthread_mutex_unlock(&A.conf_lock);
        rt_log(RT_LOG_WARNING, "config.set", "%s (rtctl)", assignment);
    }
    pthread_mutex_unlock(&A.reload_lock);
    free(scratch);
    return code;
}

/* ---- request parsing ---- */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                 : -1;
}

int rt_admin_split(char *line, size_t len, char **argv, size_t *arglen, int max, int *argc,
                   char *err, size_t errlen)
{
    size_t i = 0;
    int n = 0;
    while (i < len) {
        if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
            i++;
            continue;
        }
        if (n == max) {
            snprintf(err, errlen, "more than %d words", max);
            return RT_EINVAL;
        }
        char *out = line + i; /* decoded bytes are never longer than their encoding */
        size_t o = 0;
        if (line[i] != '"') {
            while (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
                out[o++] = line[i++];
        } else {
            i++;
            for (;;) {
                if (i >= len) {
                    snprintf(err, errlen, "word %d: no closing quote", n + 1);
                    return RT_EINVAL;
                }
                char ch = line[i++];
                if (ch == '"')
                    break;
                if (ch != '\\') {
                    out[o++] = ch;
                    continue;
                }
                if (i >= len) {
                    snprintf(err, errlen, "word %d: a backslash ends the line", n + 1);
                    return RT_EINVAL;
                }
                char e = line[i++];
                if (e == 'n') {
                    out[o++] = '\n';
                } else if (e == 't') {
                    out[o++] = '\t';
                } else if (e == '"' || e == '\\') {
                    out[o++] = e;
                } else if (e == 'x' && i + 1 < len && hexval(line[i]) >= 0 &&
                           hexval(line[i + 1]) >= 0) {
                    out[o++] = (char)(hexval(line[i]) << 4 | hexval(line[i + 1]));
                    i += 2;
                } else {
                    snprintf(err, errlen, "word %d: unknown escape \\%c", n + 1, e);
                    return RT_EINVAL;
                }
            }
            if (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
                snprintf(err, errlen, "word %d: text right after the closing quote", n + 1);
                return RT_EINVAL;
            }
        }
        /* The terminator lands on the separator (or past the decoded bytes). */
        argv[n] = out;
        arglen[n] = o;
        if (i < len)
            i++;
        out[o] = 0;
        n++;
    }
    *argc = n;
    return 0;
}

/*
** Splits a request into c: positional words, "--name value" options and --json.
** Returns 0 or 400 with the error set.
*/
int rt__admin_parse_request(rt_admin_cmd_t *c, char *line, size_t len)
{
    char *words[RT_ADMIN_ARGS_MAX];
    size_t lens[RT_ADMIN_ARGS_MAX];
    int n = 0;
    /* A line that does not split still asked for its error as JSON if it says --json. */
    bool json_hint = false;
    for (const char *p = line; (p = memmem(p, len - (size_t)(p - line), "--json", 6)); p++)
        if ((p == line || p[-1] == ' ') && (p + 6 == line + len || p[6] == ' '))
            json_hint = true;
    if (rt_admin_split(line, len, words, lens, RT_ADMIN_ARGS_MAX, &n, c->error,
                       sizeof(c->error)) != 0) {
        c->json = json_hint;
        return c->code = 400;
    }
    bool options_end = false;
    for (int i = 0; i < n; i++) {
        const char *w = words[i];
        if (!options_end && strcmp(w, "--json") == 0) {
            c->json = true;
        } else if (!options_end && strcmp(w, "--") == 0) {
            options_end = true;
        } else if (!options_end && w[0] == '-' && w[1] && !(w[1] >= '0' && w[1] <= '9') &&
                   lens[i] == strlen(w)) { /* "-5" is a value, not an option */
            if (i + 1 == n)
                return rt__admin_fail(c, 400, "option %s needs a value", w);
            if (c->nopts == RT_ADMIN_OPTS_MAX)
                return rt__admin_fail(c, 400, "too many options");
            c->opt_name[c->nopts] = w + (w[1] == '-' ? 2 : 1);
            c->opt_value[c->nopts] = words[i + 1];
            c->opt_len[c->nopts] = lens[i + 1];
            c->nopts++;
            i++;
        } else {
            c->argv[c->argc] = words[i];
            c->arglen[c->argc] = lens[i];
            c->argc++;
        }
    }
    if (!c->argc)
        return rt__admin_fail(c, 400, "empty command; try: help");
    return 0;
}

int rt__admin_fail(rt_admin_cmd_t *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof(c->error), fmt, ap);
    va_end(ap);
    return c->code = code;
}

const char *rt__admin_opt(const rt_admin_cmd_t *c, const char *name, size_t *len)
{
    for (int i = c->nopts - 1; i >= 0; i--)
        if (strcmp(c->opt_name[i], name) == 0) {
            if (len)
                *len = c->opt_len[i];
            return c->opt_value[i];
        }
    return NULL;
}

int rt__admin_opt_long(rt_admin_cmd_t *c, const char *name, long def, long lo, long hi, long *out)
{
    const char *v = rt__admin_opt(c, name, NULL);
    *out = def;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        return rt__admin_fail(c, 400, "%s%s must be a whole number from %ld to %ld",
                              strlen(name) > 1 ? "--" : "-", name, lo, hi);
    *out = n;
    return 0;
}

/*
** "rules reload" names its sub-command; "rules" alone means "rules list"; but
** "rules relaod" is an error, not a list: a word alone takes more words only
** when it has no sub-commands ("top -n 5" is options, which are not words).
*/
const rt_admin_command_t *rt__admin_find(const rt_admin_cmd_t *c)
{
    const rt_admin_command_t *alone = NULL;
    bool has_subs = false;
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++) {
        if (strcmp(k->word, c->argv[0]) != 0)
            continue;
        if (!k->sub)
            alone = k;
        else if (c->argc > 1 && strcmp(k->sub, c->argv[1]) == 0)
            return k;
        else
            has_subs = true;
    }
    return c->argc == 1 || !has_subs ? alone : NULL;
}

void rt__admin_render(rt_admin_cmd_t *c, rt_buf_t *out)
{
    if (c->code >= 400) {
        if (c->json) {
            rt_buf_add(out, "{\"error\":", 9);
            rt_buf_json_str(out, c->error, strlen(c->error));
            rt_buf_add(out, "}\n", 2);
        } else {
            rt_buf_printf(out, "%s\n", c->error);
        }
        return;
    }
    if (c->text.len) {
        rt_buf_add(out, c->text.data, c->text.len);
        if (c->text.oom)
            out->oom = true;
        return;
    }
    int rc = c->json ? rt_doc_render_json(c->doc, out) : rt_doc_render_text(c->doc, out);
    if (rc) {
        rt_buf_free(out);
        c->json ? rt_buf_printf(out, "{\"error\":\"out of memory\"}\n")
                : rt_buf_printf(out, "out of memory\n");
        c->code = 500;
    }
}

static void cmd_free(rt_admin_cmd_t *c)
{
    rt__admin_gather_free(c);
    rt_doc_free(c->doc);
    rt_buf_free(&c->text);
    free(c);
}

/* Runs a parsed request here and now (the caller checked its flags). */
static void run_command(rt_admin_cmd_t *c, const rt_admin_command_t *k)
{
    c->code = 200;
    int rc = k->run(c);
    if (rc >= 400 && c->code < 400)
        c->code = rc;
    if (c->code && c->code < 400 && !c->doc && !c->text.len)
        rt_buf_printf(&c->text, c->json ? "{}\n" : "ok\n");
}

/* ---- the worker (blocking pool) ---- */

/*
** The worker keeps each admin connection's previous `top` sample, so sampling
** 20,000 actors (and rendering them) happens on the blocking pool, never on a
** scheduler: a connection only forwards the request. A sample whose connection
** has gone is dropped at the next job.
*/
typedef struct {
    rt_pid_t conn;
    rt_admin_top_t *top;
} worker_top_t;

typedef struct {
    worker_top_t *tops;
    size_t ntops, captops;
} worker_t;

/* The previous sample's slot for conn (a new empty one if none), or NULL on OOM. */
static rt_admin_top_t **worker_top(worker_t *w, rt_pid_t conn)
{
    size_t keep = 0;
    rt_admin_top_t **found = NULL;
    for (size_t i = 0; i < w->ntops; i++) {
        if (w->tops[i].conn != conn && !rt_alive(w->tops[i].conn)) {
            rt__admin_top_free(w->tops[i].top);
            continue;
        }
        w->tops[keep++] = w->tops[i];
    }
    w->ntops = keep;
    for (size_t i = 0; i < w->ntops && !found; i++)
        if (w->tops[i].conn == conn)
            found = &w->tops[i].top;
    if (found)
        return found;
    if (w->ntops == w->captops) {
        size_t cap = w->captops ? w->captops * 2 : 8;
        worker_top_t *t = realloc(w->tops, cap * sizeof(*t));
        if (!t)
            return NULL;
        w->tops = t;
        w->captops = cap;
    }
    w->tops[w->ntops] = (worker_top_t){conn, NULL};
    return &w->tops[w->ntops++].top;
}

static void worker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    worker_t *w = state;
    if (m->tag != MSG_JOB || m->len < sizeof(uint64_t) + 1)
        return;
    uint64_t cookie;
    memcpy(&cookie, m->data, sizeof(cookie));
    rt_admin_cmd_t *c = calloc(1, sizeof(*c));
    rt_buf_t body = {0};
    int code = 500;
    if (c) {
        c->self = self;
        c->top = worker_top(w, m->from);
        if (rt__admin_parse_request(c, (char *)m->data + sizeof(cookie),
                                    m->len - sizeof(cookie) - 1) == 0) {
            const rt_admin_command_t *k = rt__admin_find(c);
            if (k)
                run_command(c, k);
            else
                rt__admin_fail(c, 400, "unknown command");
        }
        rt__admin_render(c, &body);
        code = c->code;
        cmd_free(c);
    }
    rt_msg_t *r = rt_msg_new(MSG_JOB_DONE, sizeof(job_done_t) + body.len);
    if (r) {
        job_done_t d = {cookie, body.oom ? 500 : code};
        memcpy(r->data, &d, sizeof(d));
        if (body.len)
            memcpy(r->data + sizeof(d), body.data, body.len);
        rt_send_msg(m->from, r);
    }
    rt_buf_free(&body);
}

static void worker_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    worker_t *w = state;
    for (size_t i = 0; i < w->ntops; i++)
        rt__admin_top_free(w->tops[i].top);
    free(w->tops);
}

static const char *worker_tag_name(uint32_t tag) { return tag == MSG_JOB ? "job" : ""; }

static const rt_actor_type_t worker_type = {
    .name = "admin_worker",
    .state_size = sizeof(worker_t),
    .handle = worker_handle,
    .terminate = worker_terminate,
    .tag_name = worker_tag_name,
    .flags = RT_TYPE_BLOCKING,
};

/* ---- one client of the socket ---- */

typedef struct {
    rt_sock_t *sock;
    rt_buf_t in;            /* bytes read and not yet answered */
    uint64_t cookie;        /* of the request waiting for an answer; 0: none */
    rt_admin_cmd_t *waiting; /* a gathering request (admin_clients.c), or NULL */
    rt_ref_t timer;
    bool held;              /* unsent replies passed RT_ADMIN_OUT_MAX: not reading */
} conn_t;

static void respond(conn_t *k, int code, const char *body, size_t len)
{
    char head[48];
    int n = snprintf(head, sizeof(head), "%d %zu\n", code, len);
    rt_sock_write(k->sock, head, (size_t)n);
    if (len)
        rt_sock_write(k->sock, body, len);
}

static void respond_cmd(conn_t *k, rt_admin_cmd_t *c)
{
    rt_buf_t body = {0};
    rt__admin_render(c, &body);
    if (body.oom)
        respond(k, 500, "out of memory\n", 14);
    else
        respond(k, c->code, body.data, body.len);
    rt_buf_free(&body);
}

static void process(rt_actor_t *self, conn_t *k);

static void finish_gather(rt_actor_t *self, conn_t *k)
{
    if (k->timer) {
        rt_cancel_timer(k->timer);
        k->timer = 0;
    }
    rt__admin_gather_finish(k->waiting);
    respond_cmd(k, k->waiting);
    cmd_free(k->waiting);
    k->waiting = NULL;
    k->cookie = 0;
    process(self, k);
}

/*
** Whether the client's unsent replies are past RT_ADMIN_OUT_MAX: if so its socket stops
** being read (its requests wait in the kernel, then in the client) until they drain.
** Output past the cap (which is at least RT_SOCK_FLUSH_AT) means the kernel refused a
** send, so an RT_SOCK_WRITABLE event will say when it drains.
*/
_Static_assert(RT_ADMIN_OUT_MAX >= RT_SOCK_FLUSH_AT, "held output must mean a blocked socket");
static bool hold_output(conn_t *k)
{
    if (rt_sock_pending(k->sock) <= RT_ADMIN_OUT_MAX)
        return false;
    if (!k->held) {
        k->held = true;
        rt_sock_pause_reading(k->sock, true);
    }
    return true;
}

/* Answers complete request lines until one has to wait (worker, gathering, unsent replies). */
static void process(rt_actor_t *self, conn_t *k)
{
    while (!k->cookie && k->sock && !hold_output(k)) {
        char *nl = k->in.len ? memchr(k->in.data, '\n', k->in.len) : NULL;
        if (!nl) {
            if (k->in.len > RT_ADMIN_LINE_MAX) {
                respond(k, 400, "request line too long\n", 22);
                rt_exit(self, RT_REASON_NORMAL);
            }
            return;
        }
        size_t linelen = (size_t)(nl - k->in.data);
        size_t consumed = linelen + 1;
        static _Atomic uint64_t next_cookie = 1;
        rt_admin_cmd_t *c = calloc(1, sizeof(*c));
        if (!c) {
            respond(k, 500, "out of memory\n", 14);
        } else {
            c->self = self;
            /* The worker re-parses its own copy, so keep the raw line before splitting. */
            char *raw = malloc(linelen + 1);
            if (raw)
                memcpy(raw, k->in.data, linelen);
            const rt_admin_command_t *cmd = NULL;
            if (rt__admin_parse_request(c, k->in.data, linelen) == 0 &&
                !(cmd = rt__admin_find(c)))
                rt__admin_fail(c, 400, "unknown command \"%s%s%s\"; try: help", c->argv[0],
                               c->argc > 1 ? " " : "", c->argc > 1 ? c->argv[1] : "");
            if (cmd && (cmd->flags & RT_ADMIN_BLOCKING)) {
                uint64_t cookie = next_cookie++;
                /* One byte more than the line: splitting ends the last word there. */
                rt_msg_t *m = raw ? rt_msg_new(MSG_JOB, sizeof(cookie) + linelen + 1) : NULL;
                if (m) {
                    memcpy(m->data, &cookie, sizeof(cookie));
                    memcpy(m->data + sizeof(cookie), raw, linelen);
                    m->data[sizeof(cookie) + linelen] = 0;
                    if (rt_send_msg(A.worker, m) == 0)
                        k->cookie = cookie;
                }
                if (!k->cookie)
                    rt__admin_fail(c, 503, "the admin worker is not running");
            } else if (cmd) {
                run_command(c, cmd);
                if (c->code == 0) { /* gathering: answered by finish_gather */
                    k->waiting = c;
                    k->cookie = next_cookie++;
                    rt_send_after_tag(RT_ADMIN_GATHER_MS, rt_self(self), MSG_GATHER_TIMEOUT,
                                      &k->timer);
                    c = NULL;
                }
            }
            free(raw);
            if (c && !k->cookie)
                respond_cmd(k, c);
            if (c)
                cmd_free(c);
        }
        memmove(k->in.data, k->in.data + consumed, k->in.len - consumed);
        k->in.len -= consumed;
    }
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *k = state;
    int fd = (int)(intptr_t)arg;
    if (rt_sock_adopt(self, fd, &k->sock) != 0) {
        close(fd);
        return RT_EINVAL;
    }
    return 0;
}

static void on_readable(rt_actor_t *self, conn_t *k)
{
    for (int reads = 0; reads < 16; reads++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(k->sock, &data, &len);
        if (rc == RT_EAGAIN)
            break;
        if (rc != 0) {
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        rt_buf_add(&k->in, data, len);
        if (k->in.oom || k->in.len > 2 * RT_ADMIN_LINE_MAX) {
            respond(k, 400, "request line too long\n", 22);
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
    }
    process(self, k);
}

/* The held replies drained: answer what is buffered, then read again. */
static void resume(rt_actor_t *self, conn_t *k)
{
    k->held = false;
    process(self, k);
    if (!k->held)
        rt_sock_pause_reading(k->sock, false);
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_t *k = state;
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        const rt_sock_event_t *ev = (const rt_sock_event_t *)m->data;
        if ((ev->events & RT_SOCK_WRITABLE) && k->held)
            resume(self, k);
        if (ev->events & RT_SOCK_READABLE)
            on_readable(self, k);
        break;
    }
    case MSG_JOB_DONE: {
        job_done_t d;
        if (m->len < sizeof(d))
            break;
        memcpy(&d, m->data, sizeof(d));
        if (d.cookie != k->cookie)
            break;
        respond(k, d.code, (const char *)m->data + sizeof(d), m->len - sizeof(d));
        k->cookie = 0;
        process(self, k);
        break;
    }
    case MSG_GATHER_TIMEOUT:
        k->timer = 0;
        if (k->waiting)
            finish_gather(self, k);
        break;
    default:
        if (k->waiting && rt__admin_gather_reply(k->waiting, m))
            finish_gather(self, k);
        break;
    }
}

static void conn_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    conn_t *k = state;
    if (k->timer)
        rt_cancel_timer(k->timer);
    if (k->waiting)
        cmd_free(k->waiting);
    rt_buf_free(&k->in);
}

static const char *conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case MSG_JOB_DONE:
        return "job_done";
    case MSG_GATHER_TIMEOUT:
        return "gather_timeout";
    default:
        return "gather_reply";
    }
}

static const rt_actor_type_t conn_type = {
    .name = "admin_conn",
    .state_size = sizeof(conn_t),
    .init = conn_init,
    .handle = conn_handle,
    .terminate = conn_terminate,
    .tag_name = conn_tag_name,
};

/* ---- the listener ---- */

typedef struct {
    rt_sock_t *sock;
    uint64_t prev_busy[RT_ADMIN_SCHED_MAX], prev_wall[RT_ADMIN_SCHED_MAX];
} listener_t;

static void sample_schedulers(listener_t *l)
{
    rt_sched_info_t info[RT_ADMIN_SCHED_MAX];
    size_t n = rt_snapshot_schedulers(info, RT_ADMIN_SCHED_MAX);
    double util[RT_ADMIN_SCHED_MAX];
    for (size_t i = 0; i < n; i++) {
        uint64_t dbusy = info[i].busy_ns - l->prev_busy[i];
        uint64_t dwall = info[i].wall_ns - l->prev_wall[i];
        util[i] = dwall ? (double)dbusy / (double)dwall : 0;
        if (util[i] > 1)
            util[i] = 1;
        l->prev_busy[i] = info[i].busy_ns;
        l->prev_wall[i] = info[i].wall_ns;
    }
    pthread_mutex_lock(&A.util_lock);
    memcpy(A.util, util, n * sizeof(double));
    A.nutil = n;
    pthread_mutex_unlock(&A.util_lock);
}

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    listener_t *l = state;
    int fd = (int)(intptr_t)arg;
    if (rt_sock_adopt_listener(self, fd, &l->sock) != 0)
        return RT_EINVAL;
    /* Connections are linked so that stopping the listener ends them; one of them
       ending (even abnormally) must not end the listener. */
    rt_trap_exit(self, true);
    sample_schedulers(l);
    rt_send_after_tag(RT_ADMIN_SAMPLE_MS, rt_self(self), MSG_TICK, NULL);
    return 0;
}

static void listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    listener_t *l = state;
    if (m->tag == MSG_TICK) {
        sample_schedulers(l);
        rt_send_after_tag(RT_ADMIN_SAMPLE_MS, rt_self(self), MSG_TICK, NULL);
        return;
    }
    if (m->tag != RT_MSG_SOCKET)
        return;
    for (;;) {
        int fd;
        int rc = rt_sock_accept(l->sock, &fd);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            rt_log(RT_LOG_WARNING, "admin.accept", "%s", rt_strerror(rc));
            return;
        }
        rt_pid_t pid;
        rt_spawn_opts_t opts = {.link = true};
        if (rt_spawn_opt(&conn_type, (void *)(intptr_t)fd, &opts, &pid) != 0)
            rt_log(RT_LOG_WARNING, "admin.refused", "cannot start an admin connection");
    }
}

static void listener_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)state;
    (void)reason;
    struct stat st;
    if (lstat(A.path, &st) == 0 && st.st_dev == A.dev && st.st_ino == A.ino)
        unlink(A.path);
}

static const char *listener_tag_name(uint32_t tag)
{
    return tag == MSG_TICK ? "tick" : tag == RT_MSG_SOCKET ? "accept" : "";
}

static const rt_actor_type_t listener_type = {
    .name = "admin",
    .state_size = sizeof(listener_t),
    .init = listener_init,
    .handle = listener_handle,
    .terminate = listener_terminate,
    .tag_name = listener_tag_name,
};

/* ---- the socket file ---- */

/*
** A sockaddr for path. sun_path holds 107 bytes; a longer path (deep test
** directories) goes through /proc/self/fd/N/ of its directory, opened here and
** closed by the caller (*dirfd).
*/
static int make_addr(const char *path, struct sockaddr_un *sa, int *dirfd)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    *dirfd = -1;
    if (strlen(path) < sizeof(sa->sun_path)) {
        memcpy(sa->sun_path, path, strlen(path));
        return 0;
    }
    const char *slash = strrchr(path, '/');
    if (!slash)
        return RT_EINVAL;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    *dirfd = open(dir[0] ? dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*dirfd < 0)
        return RT_EINVAL;
    int n = snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", *dirfd, slash + 1);
    if (n < 0 || (size_t)n >= sizeof(sa->sun_path)) {
        close(*dirfd);
        *dirfd = -1;
        return RT_EINVAL;
    }
    return 0;
}

/* Whether a live process accepts connections on path. */
static bool answers(const char *path)
{
    struct sockaddr_un sa;
    int dirfd;
    if (make_addr(path, &sa, &dirfd) != 0)
        return false;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
        close(fd);
    if (dirfd >= 0)
        close(dirfd);
    return live;
}

static int bind_socket(const char *path, int *out, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "admin socket %s: exists and is not a socket", path);
            return RT_EEXIST;
        }
        if (answers(path)) {
            snprintf(err, errlen, "admin socket %s: another rtd is running there", path);
            return RT_EEXIST;
        }
        unlink(path); /* left by an rtd that did not stop cleanly */
    }
    struct sockaddr_un sa;
    int dirfd;
    if (make_addr(path, &sa, &dirfd) != 0) {
        snprintf(err, errlen, "admin socket %s: bad path", path);
        return RT_EINVAL;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "admin socket: %s", strerror(errno));
        if (dirfd >= 0)
            close(dirfd);
        return RT_ELIMIT;
    }
    /* 0600 from the start: a socket created wider and chmod-ed later would leave a window. */
    fchmod(fd, 0600);
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int bind_errno = errno;
    umask(old);
    if (dirfd >= 0)
        close(dirfd);
    if (rc == 0 && (chmod(path, 0600) != 0 || lstat(path, &st) != 0))
        rc = -1, bind_errno = errno;
    if (rc == 0 && listen(fd, 64) != 0)
        rc = -1, bind_errno = errno;
    if (rc != 0) {
        snprintf(err, errlen, "admin socket %s: %s", path, strerror(bind_errno));
        close(fd);
        return RT_EINVAL;
    }
    A.dev = st.st_dev;
    A.ino = st.st_ino;
    *out = fd;
    return 0;
}

int rt_admin_start(rt_conf_t *conf, const char *version, char *err, size_t errlen)
{
    A.conf = conf;
    A.version = version;
    A.started_ms = mono_ms();
    if (conf->admin_socket[0])
        snprintf(A.path, sizeof(A.path), "%s", conf->admin_socket);
    else
        snprintf(A.path, sizeof(A.path), "%s/rtd.sock", conf->data_dir);
    int fd;
    int rc = bind_socket(A.path, &fd, err, errlen);
    if (rc)
        return rc;
    if ((rc = rt_spawn(&worker_type, NULL, &A.worker)) != 0 ||
        (rc = rt_spawn(&listener_type, (void *)(intptr_t)fd, &A.listener)) != 0) {
        snprintf(err, errlen, "admin socket %s: cannot start its actors: %s", A.path,
                 rt_strerror(rc));
        if (A.worker)
            rt_exit_signal(A.worker, RT_REASON_KILL);
        close(fd);
        unlink(A.path);
        return rc;
    }
    rt_log(RT_LOG_INFO, "admin.started", "socket=%s", A.path);
    return 0;
}

void rt_admin_stop(void)
{
    if (A.listener)
        rt_exit_signal(A.listener, RT_REASON_SHUTDOWN);
    /* The pids stay as they are: connection actors still read A.worker until they exit,
       and a request sent to the dead worker is a counted dead letter, answered 503. */
    if (A.worker)
        rt_exit_signal(A.worker, RT_REASON_SHUTDOWN);
}

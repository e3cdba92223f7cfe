#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <bson/bson.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rule_engine.h"
#include "sink.h"
#include "topic_trie.h"

/* Worker message tags. */
#define TAG_WORK (RT_MSG_USER + 0x5210)  /* a message or event to run rules on: work_t */
#define TAG_FLUSH (RT_MSG_USER + 0x5211) /* submit batches (end of a turn, or flush_ms after the first row) */
#define TAG_STOP (RT_MSG_USER + 0x5212)  /* submit what is buffered and exit */

#define NONE UINT32_MAX

/* ---- Metrics, shared by the versions of a rule with the same name ---- */

typedef struct metrics_s {
    atomic_uint refs;
    atomic_uint_fast64_t matched, passed, filtered, rows_out;
    atomic_uint_fast64_t failed[3]; /* exception, budget, memory */
    pthread_mutex_t lock;           /* guards last_error */
    char last_error[256];
    /* The operator's word on enabled (rt_rules_enable), kept over reloads by name: -1 none,
       else 0 or 1. Written with the engine's lock read-held, applied by install() with it
       write-held, so an enable and a reload never miss each other. */
    atomic_int override;
    bool file_enabled; /* the file's enabled in the last installed set (admin lock) */
    bool installed;    /* a set holding this rule has been installed (admin lock) */
} metrics_t;

static metrics_t *metrics_new(void)
{
    metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    atomic_init(&m->refs, 1);
    atomic_init(&m->override, -1);
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

static void metrics_release(metrics_t *m)
{
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        pthread_mutex_destroy(&m->lock);
        free(m);
    }
}

/* ---- Rule-set versions ---- */

typedef struct target_s {
    rt_sink_t *sink;
    char name[RT_RULE_NAME_MAX];
    rt_bin_t *opts; /* BSON options, or NULL; a reference is handed over per submit */
} target_t;

typedef struct rule_s {
    char name[RT_RULE_NAME_MAX];
    char *path, *text; /* the file, owned (the vms read it) */
    size_t len;
    atomic_bool enabled;
    bool file_enabled; /* what the file says; enabled may differ by the operator's word */
    bool durable;
    char from[256], to[256]; /* for the snapshot */
    uint32_t targets[RT_RULE_MAX_TO];
    uint32_t ntargets;
    char missing_sink[RT_RULE_NAME_MAX]; /* a disabled rule's sink that is not running */
    metrics_t *m;
} rule_t;

typedef struct rule_set_s {
    atomic_uint refs; /* the engine's current pointer, each message in flight, each worker */
    uint64_t version;
    rule_t *rules;
    uint32_t nrules;
    rt_trie_t *trie;                   /* topic filter -> rule index + 1 */
    uint32_t *events[RT_RULE_NEVENTS]; /* per event kind: rule indices */
    uint32_t nevents[RT_RULE_NEVENTS];
    target_t *targets;
    uint32_t ntargets;
    uint32_t wants;     /* bit 0: some rule reads topics; bit k: some rule reads event k */
    rt_rule_vm_t **vms; /* one per worker */
    unsigned nvms;
    struct rule_set_s *next, *prev; /* every live set, for the final cleanup */
} rule_set_t;

/* ---- Workers ---- */

typedef struct worker_stats_s {
    _Alignas(RT_CACHE_LINE) rt_pid_t pid;
    atomic_uint_fast64_t messages, batches, pending_durable;
    _Atomic size_t c_bytes;
} worker_stats_t;

/* ---- The engine ---- */

static struct {
    atomic_bool running;
    atomic_uint wants; /* the current set's wants: lets publish skip the lock when no rule cares */
    pthread_rwlock_t lock; /* guards cur and workers; publishers read-lock it (writers
                              preferred, so a reload is not starved by traffic) */
    rule_set_t *cur;       /* current set (one reference), or NULL */
    pthread_mutex_t admin; /* serialises start, reload, stop */
    pthread_mutex_t sets_lock;
    rule_set_t *sets; /* every set still alive */
    uint64_t version;
    unsigned nworkers;
    worker_stats_t *workers;
    size_t memory;
    long instructions;
    long call_ms;        /* rule_call_ms */
    long output_rows;    /* rule_output_rows */
    size_t output_bytes; /* rule_output_bytes */
    uint64_t flush_ms; /* rule_flush_ms: how long a partial batch waits; 0 = end of turn */
    uint64_t turn_us;  /* rule_turn_us: a worker's turn ends once it has run this long */
    char dir[256];
} E = {.admin = PTHREAD_MUTEX_INITIALIZER, .sets_lock = PTHREAD_MUTEX_INITIALIZER};

/* A rule state with the configured limits. */
static int new_vm(rt_rule_vm_t **out)
{
    int rc = rt_rule_vm_new(E.memory, E.instructions, out);
    if (rc == 0)
        rt_rule_vm_set_limits(*out, E.call_ms, E.output_rows, E.output_bytes);
    return rc;
}

static void set_free(rule_set_t *s)
{
    for (uint32_t i = 0; i < s->nrules; i++) {
        metrics_release(s->rules[i].m);
        free(s->rules[i].path);
        free(s->rules[i].text);
    }
    for (unsigned i = 0; i < s->nvms; i++)
        rt_rule_vm_free(s->vms[i]);
    free(s->vms);
    free(s->rules);
    for (int k = 0; k < RT_RULE_NEVENTS; k++)
        free(s->events[k]);
    for (uint32_t i = 0; i < s->ntargets; i++)
        rt_bin_release(s->targets[i].opts);
    free(s->targets);
    if (s->trie)
        rt_trie_free(s->trie);
    free(s);
}

static rule_set_t *set_retain(rule_set_t *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

static void set_release(rule_set_t *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_lock(&E.sets_lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        E.sets = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&E.sets_lock);
    set_free(s);
}

/* ---- Loading a rule set ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads path into a new NUL-terminated buffer. */
static int read_file(const char *path, char **text, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    char *buf = malloc(RT_RULES_MAX_FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, RT_RULES_MAX_FILE_BYTES + 1, f) : 0;
    bool bad = ferror(f);
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    if (bad || n > RT_RULES_MAX_FILE_BYTES) {
        free(buf);
        snprintf(err, errlen, "%s: %s", path,
                 bad ? "read error" : "larger than RT_RULES_MAX_FILE_BYTES");
        return RT_EINVAL;
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return 0;
}

/*
** The sorted *.lua names of dir; none if dir does not exist and missing_ok (at start), an error
** if not (on a reload: a directory that is gone for a moment, mid-deploy, must not silently
** empty the rule set; an empty directory does that on purpose).
*/
static int list_rules(const char *dir, bool missing_ok, char ***names, size_t *n, char *err,
                      size_t errlen)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT && missing_ok)
            return 0;
        snprintf(err, errlen, "%s: cannot open: %s", dir, strerror(errno));
        return RT_EINVAL;
    }
    size_t cap = 0;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".lua") != 0 || de->d_name[0] == '.')
            continue;
        if (*n == RT_RULES_MAX_FILES) {
            snprintf(err, errlen, "%s: more than %d rule files", dir, RT_RULES_MAX_FILES);
            rc = RT_ELIMIT;
            break;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 32;
            char **nn = realloc(*names, cap * sizeof(*nn));
            if (!nn) {
                rc = RT_ENOMEM;
                break;
            }
            *names = nn;
        }
        if (!((*names)[*n] = strdup(de->d_name))) {
            rc = RT_ENOMEM;
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == RT_ENOMEM)
        snprintf(err, errlen, "%s: out of memory", dir);
    if (*n)
        qsort(*names, *n, sizeof(char *), cmp_str);
    return rc;
}

static void join(char *out, size_t cap, const char *const *items, size_t n)
{
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? ", " : "", items[i]);
}

static metrics_t *carry_metrics(rule_set_t *prev, const char *name)
{
    for (uint32_t i = 0; prev && i < prev->nrules; i++) {
        if (strcmp(prev->rules[i].name, name) == 0) {
            atomic_fetch_add(&prev->rules[i].m->refs, 1);
            return prev->rules[i].m;
        }
    }
    return metrics_new();
}

/* Finds or adds the (sink, options) target; returns its index or NONE on failure. */
static uint32_t add_target(rule_set_t *s, rt_sink_t *sink, const rt_rule_to_t *to)
{
    for (uint32_t i = 0; i < s->ntargets; i++) {
        target_t *t = &s->targets[i];
        size_t ol = t->opts ? rt_bin_len(t->opts) : 0;
        if (t->sink == sink && ol == to->opts_len &&
            (ol == 0 || memcmp(rt_bin_data(t->opts), to->opts, ol) == 0))
            return i;
    }
    target_t *nt = realloc(s->targets, (s->ntargets + 1) * sizeof(*nt));
    if (!nt)
        return NONE;
    s->targets = nt;
    target_t *t = &nt[s->ntargets];
    memset(t, 0, sizeof(*t));
    t->sink = sink;
    snprintf(t->name, sizeof(t->name), "%s", to->sink);
    if (to->opts && !(t->opts = rt_bin_new(to->opts, to->opts_len)))
        return NONE;
    return s->ntargets++;
}

/* Takes spec's declarations into rule r of s; checks sinks and name clashes. */
static int adopt_spec(rule_set_t *s, uint32_t idx, rt_rule_spec_t *spec, rule_set_t *prev,
                      char *err, size_t errlen)
{
    rule_t *r = &s->rules[idx];
    for (uint32_t i = 0; i < idx; i++)
        if (strcmp(s->rules[i].name, spec->name) == 0) {
            int line = rt_rule_field_line(r->text, r->len, "name");
            snprintf(err, errlen, "%s:%d: name \"%s\" is already used by %s", r->path, line,
                     spec->name, s->rules[i].path);
            return RT_EINVAL;
        }
    snprintf(r->name, sizeof(r->name), "%s", spec->name);
    atomic_init(&r->enabled, spec->enabled);
    r->file_enabled = spec->enabled;
    r->durable = spec->durable;
    join(r->from, sizeof(r->from), (const char *const *)spec->from, spec->nfrom);
    const char *tos[RT_RULE_MAX_TO];
    for (size_t i = 0; i < spec->nto; i++) {
        tos[i] = spec->to[i].sink;
        rt_sink_t *sink = rt_sink_find(spec->to[i].sink);
        if (!sink && !spec->enabled) {
            /* A disabled rule may name a sink that is not running (disabled in rtd.conf);
               it cannot be enabled until a reload finds the sink. */
            if (!r->missing_sink[0])
                snprintf(r->missing_sink, sizeof(r->missing_sink), "%s", spec->to[i].sink);
            continue;
        }
        if (!sink) {
            int line = rt_rule_field_line(r->text, r->len, "to");
            snprintf(err, errlen,
                     "%s:%d: to: no sink named \"%s\" (sinks are configured in "
                     "the sinks table of rtd.conf)",
                     r->path, line, spec->to[i].sink);
            return RT_EINVAL;
        }
        uint32_t t = add_target(s, sink, &spec->to[i]);
        if (t == NONE) {
            snprintf(err, errlen, "%s: out of memory", r->path);
            return RT_ENOMEM;
        }
        r->targets[r->ntargets++] = t;
    }
    join(r->to, sizeof(r->to), tos, spec->nto);
    if (!(r->m = carry_metrics(prev, r->name))) {
        snprintf(err, errlen, "%s: out of memory", r->path);
        return RT_ENOMEM;
    }
    /* The index: events in per-kind lists, topic filters in the trie. */
    for (size_t i = 0; i < spec->nfrom; i++) {
        int ev = rt_rule_event_kind(spec->from[i]);
        if (ev) {
            uint32_t *l = realloc(s->events[ev - 1], (s->nevents[ev - 1] + 1) * sizeof(*l));
            if (!l)
                return RT_ENOMEM;
            s->events[ev - 1] = l;
            l[s->nevents[ev - 1]++] = idx;
            s->wants |= 1u << ev;
            continue;
        }
        s->wants |= 1u;
        rt_trie_opts_t o = {0};
        int rc = rt_trie_subscribe(s->trie, spec->from[i], strlen(spec->from[i]), (rt_pid_t)idx + 1,
                                   &o, NULL);
        if (rc) {
            snprintf(err, errlen, "%s:%d: from: \"%s\": %s", r->path,
                     rt_rule_field_line(r->text, r->len, "from"), spec->from[i], rt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/*
** Loads every rule file of dir into a new set: a validation state parses,
** checks and dry-runs each rule, then one state per worker loads them all.
** prev (NULL at start, the current set on a reload) lends its metrics by name;
** only at start may dir be missing.
*/
static int build_set(const char *dir, rule_set_t *prev, rule_set_t **out, char *err, size_t errlen)
{
    char **names = NULL;
    size_t nnames = 0;
    rt_rule_vm_t *check = NULL;
    rt_rule_spec_t spec;
    memset(&spec, 0, sizeof(spec));
    int rc = list_rules(dir, prev == NULL, &names, &nnames, err, errlen);
    rule_set_t *s = calloc(1, sizeof(*s));
    if (!s && !rc) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
    }
    if (rc)
        goto fail;
    atomic_init(&s->refs, 1);
    s->rules = calloc(nnames ? nnames : 1, sizeof(rule_t));
    s->vms = calloc(E.nworkers, sizeof(*s->vms));
    if (!s->rules || !s->vms || rt_trie_new(&s->trie) ||
        new_vm(&check)) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < nnames; i++) {
        rule_t *r = &s->rules[i];
        size_t pl = strlen(dir) + strlen(names[i]) + 2;
        if (!(r->path = malloc(pl))) {
            rc = RT_ENOMEM;
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        snprintf(r->path, pl, "%s/%s", dir, names[i]);
        s->nrules++;
        if ((rc = read_file(r->path, &r->text, &r->len, err, errlen)))
            goto fail;
        if ((rc = rt_rule_vm_load(check, r->path, r->text, r->len, &spec, err, errlen)))
            goto fail;
        rc = adopt_spec(s, (uint32_t)i, &spec, prev, err, errlen);
        rt_rule_spec_free(&spec);
        if (rc)
            goto fail;
    }
    for (uint32_t i = 0; i < s->nrules; i++)
        if ((rc = rt_rule_vm_dry_run(check, i, err, errlen)))
            goto fail;
    rt_rule_vm_free(check);
    check = NULL;
    for (unsigned w = 0; w < E.nworkers; w++) {
        if ((rc = new_vm(&s->vms[w]))) {
            snprintf(err, errlen, "out of memory for a rule state");
            goto fail;
        }
        s->nvms = w + 1;
        for (uint32_t i = 0; i < s->nrules; i++) {
            rc = rt_rule_vm_load(s->vms[w], s->rules[i].path, s->rules[i].text, s->rules[i].len,
                                 &spec, err, errlen);
            rt_rule_spec_free(&spec);
            if (rc)
                goto fail;
        }
    }
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    *out = s;
    return 0;
fail:
    rt_rule_vm_free(check);
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    if (s)
        set_free(s);
    return rc ? rc : RT_EINVAL;
}

/*
** An operator's enable or disable (rt_rules_enable) outlives a reload that leaves the rule's
** file saying what it said before; when the file's own enabled changes, the file's new word
** wins and the operator's is dropped (someone edited the rule on purpose). A rule that
** cannot be enabled (a missing sink) stays disabled. Called with E.lock write-held.
*/
static void apply_overrides(rule_set_t *s)
{
    for (uint32_t i = 0; i < s->nrules; i++) {
        rule_t *r = &s->rules[i];
        metrics_t *m = r->m;
        int ov = atomic_load(&m->override);
        if ((m->installed && m->file_enabled != r->file_enabled) ||
            (ov == 1 && r->missing_sink[0]))
            ov = -1;
        atomic_store(&m->override, ov);
        m->file_enabled = r->file_enabled;
        m->installed = true;
        if (ov >= 0)
            atomic_store(&r->enabled, ov == 1);
    }
}

/* Makes s the current set (the engine's reference passes to it) and retires the old one. */
static void install(rule_set_t *s)
{
    s->version = ++E.version;
    pthread_mutex_lock(&E.sets_lock);
    s->next = E.sets;
    if (E.sets)
        E.sets->prev = s;
    E.sets = s;
    pthread_mutex_unlock(&E.sets_lock);
    pthread_rwlock_wrlock(&E.lock);
    apply_overrides(s);
    rule_set_t *old = E.cur;
    E.cur = s;
    atomic_store(&E.wants, s->wants);
    pthread_rwlock_unlock(&E.lock);
    set_release(old);
}

/* ---- The hand-over from connections ---- */

/* Per thread: the trie's match scratch and the matched rule indices. */
typedef struct match_tls_s {
    rt_trie_scratch_t scratch;
    uint32_t *idx;
    size_t n, cap;
    bool oom;
    rule_set_t *set;
} match_tls_t;

static _Thread_local match_tls_t tls;
static _Thread_local bool tls_ready;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p)
{
    match_tls_t *t = p;
    rt_trie_scratch_destroy(&t->scratch);
    free(t->idx);
    t->idx = NULL;
    t->cap = 0;
}

static void tls_key_create(void)
{
    pthread_key_create(&tls_key, tls_free);
}

static match_tls_t *thread_tls(void)
{
    if (!tls_ready) {
        pthread_once(&tls_once, tls_key_create);
        rt_trie_scratch_init(&tls.scratch);
        pthread_setspecific(tls_key, &tls);
        tls_ready = true;
    }
    tls.n = 0;
    tls.oom = false;
    return &tls;
}

static void add_match(match_tls_t *t, uint32_t idx)
{
    if (!atomic_load_explicit(&t->set->rules[idx].enabled, memory_order_relaxed))
        return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        uint32_t *p = realloc(t->idx, cap * sizeof(*p));
        if (!p) {
            t->oom = true;
            return;
        }
        t->idx = p;
        t->cap = cap;
    }
    t->idx[t->n++] = idx;
}

static void on_trie_hit(void *arg, const rt_trie_delivery_t *d)
{
    add_match(arg, (uint32_t)(d->pid - 1));
}

/* Where the topic of a canonical PUBLISH is, without a full decode. */
static bool peek_topic(const uint8_t *p, size_t n, const char **topic, size_t *len)
{
    if (n < 2 || (p[0] >> 4) != MQTT_PUBLISH)
        return false;
    size_t i = 1;
    while (i < n && i < 5 && (p[i] & 0x80))
        i++;
    i++;
    if (i + 2 > n)
        return false;
    size_t tl = (size_t)p[i] << 8 | p[i + 1];
    if (i + 2 + tl > n)
        return false;
    *topic = (const char *)p + i + 2;
    *len = tl;
    return true;
}

typedef struct work_s {
    rule_set_t *set;  /* a reference, released by the worker */
    rt_pid_t ack_pid; /* durable acknowledgement to, or 0 */
    uint64_t ack_token;
    uint64_t ts_ms;
    int32_t reason_code;
    int16_t event; /* 0: a PUBLISH; else rt_rule_event_kind_t */
    int8_t qos, proto_ver, clean_start;
    int32_t keepalive;
    uint32_t nrules;
    uint32_t slen[7]; /* strings after the rule indices; UINT32_MAX: NULL */
    uint32_t rules[];
} work_t;

enum { S_CLIENTID, S_USERNAME, S_PEER, S_TOPIC, S_REASON, S_FROM_CLIENTID, S_FROM_USERNAME };

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; s && *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/*
** Sends the matched rules (tls->idx, set retained by the caller) and the
** strings to the client's worker. The message owns one reference to set.
** Called with E.lock read-held, so rt_rules_stop (which write-locks it) knows
** that no hand-over is under way once it holds the lock.
*/
static int hand_over(match_tls_t *t, const rt_rule_origin_t *o, const rt_rule_event_t *e,
                     rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token)
{
    const char *strs[7] = {o->clientid,
                           o->username,
                           o->peer,
                           e ? e->topic : NULL,
                           e ? e->reason : NULL,
                           e ? e->from_clientid : NULL,
                           e ? e->from_username : NULL};
    size_t size = sizeof(work_t) + t->n * sizeof(uint32_t);
    uint32_t lens[7];
    for (int i = 0; i < 7; i++) {
        lens[i] = strs[i] ? (uint32_t)strlen(strs[i]) : UINT32_MAX;
        size += strs[i] ? lens[i] + 1 : 0;
    }
    rt_msg_t *m = rt_msg_new(TAG_WORK, size);
    if (!m) {
        set_release(t->set);
        return RT_ENOMEM;
    }
    work_t *w = (work_t *)(void *)m->data;
    memset(w, 0, sizeof(*w));
    w->set = t->set;
    w->ack_pid = ack_pid;
    w->ack_token = ack_token;
    w->ts_ms = o->ts_ms;
    w->event = e ? (int16_t)e->kind : 0;
    w->qos = (int8_t)(e ? e->qos : -1);
    w->reason_code = e ? e->reason_code : -1;
    w->proto_ver = (int8_t)(e ? e->proto_ver : -1);
    w->keepalive = e ? e->keepalive : -1;
    w->clean_start = (int8_t)(e ? e->clean_start : -1);
    w->nrules = (uint32_t)t->n;
    memcpy(w->rules, t->idx, t->n * sizeof(uint32_t));
    char *p = (char *)(w->rules + t->n);
    for (int i = 0; i < 7; i++) {
        w->slen[i] = lens[i];
        if (strs[i]) {
            memcpy(p, strs[i], lens[i] + 1);
            p += lens[i] + 1;
        }
    }
    if (bin)
        m->bin = rt_bin_retain(bin);
    rt_pid_t to = E.workers[fnv1a(o->clientid) % E.nworkers].pid;
    int rc = rt_send_msg(to, m);
    if (rc)
        set_release(w->set); /* the runtime freed the message: nobody else will */
    return rc;
}

/* Read-locks the current set; NULL (unlocked) if the engine is not running. */
static rule_set_t *lock_current(void)
{
    if (!atomic_load_explicit(&E.running, memory_order_acquire))
        return NULL;
    pthread_rwlock_rdlock(&E.lock);
    if (!E.cur) {
        pthread_rwlock_unlock(&E.lock);
        return NULL;
    }
    return E.cur;
}

int rt_rules_publish(const rt_rule_origin_t *o, rt_bin_t *canonical, rt_pid_t ack_pid,
                     uint64_t ack_token)
{
    const char *topic;
    size_t tlen;
    if (!(atomic_load_explicit(&E.wants, memory_order_relaxed) & 1u))
        return 0;
    if (!peek_topic(rt_bin_data(canonical), rt_bin_len(canonical), &topic, &tlen))
        return RT_EINVAL;
    rule_set_t *s = lock_current();
    if (!s)
        return 0;
    match_tls_t *t = thread_tls();
    t->set = s;
    int rc = rt_trie_match(s->trie, topic, tlen, 0, NULL, on_trie_hit, t, &t->scratch, NULL);
    if (rc || t->n == 0 || t->oom) {
        pthread_rwlock_unlock(&E.lock);
        return rc ? rc : t->oom ? RT_ENOMEM : 0;
    }
    bool durable = false;
    for (size_t i = 0; i < t->n && ack_pid; i++)
        durable |= s->rules[t->idx[i]].durable;
    set_retain(s);
    rc = hand_over(t, o, NULL, canonical, durable ? ack_pid : 0, ack_token);
    pthread_rwlock_unlock(&E.lock);
    if (rc)
        return rc;
    return durable ? 2 : 1;
}

bool rt_rules_wants_event(rt_rule_event_kind_t kind)
{
    return kind >= 1 && kind <= RT_RULE_NEVENTS &&
           (atomic_load_explicit(&E.wants, memory_order_relaxed) & (1u << kind));
}

int rt_rules_event(const rt_rule_origin_t *o, const rt_rule_event_t *e)
{
    if (e->kind < 1 || e->kind > RT_RULE_NEVENTS)
        return RT_EINVAL;
    /* Called for every delivery and ack: without a rule for this kind, touch nothing shared. */
    if (!(atomic_load_explicit(&E.wants, memory_order_relaxed) & (1u << e->kind)))
        return 0;
    rule_set_t *s = lock_current();
    if (!s)
        return 0;
    match_tls_t *t = thread_tls();
    t->set = s;
    for (uint32_t i = 0; i < s->nevents[e->kind - 1]; i++)
        add_match(t, s->events[e->kind - 1][i]);
    if (t->n == 0 || t->oom) {
        pthread_rwlock_unlock(&E.lock);
        return t->oom ? RT_ENOMEM : 0;
    }
    set_retain(s);
    bool with_msg = e->kind >= RT_RULE_EV_MESSAGE_DELIVERED && e->canonical;
    int rc = hand_over(t, o, e, with_msg ? e->canonical : NULL, 0, 0);
    pthread_rwlock_unlock(&E.lock);
    return rc ? rc : 1;
}

/* ---- The worker actor ---- */

typedef struct batch_s {
    rt_rule_buf_t rows; /* BSON documents back to back */
    uint32_t nrows;
    uint32_t *durs; /* durable entries with rows in this batch */
    uint32_t ndurs, capdurs;
} batch_t;

typedef struct dur_s {
    rt_pid_t pid;
    uint64_t token;
    uint32_t remaining; /* holds: one while the message runs, one per batch holding its rows */
    int32_t status;
    uint32_t next_free;
} dur_t;

typedef struct flight_s {
    uint32_t gen;
    bool used;
    uint32_t *durs;
    uint32_t ndurs, capdurs;
    uint32_t next_free;
} flight_t;

typedef struct worker_s {
    unsigned index;
    rt_pid_t self;
    worker_stats_t *st;
    rule_set_t *set;  /* the set the batches belong to (a reference), or NULL */
    batch_t *batches; /* one per target of set */
    uint32_t nbatches;
    bool flush_pending; /* a TAG_FLUSH is on its way */
    rt_rule_buf_t stage;
    dur_t *durs;
    uint32_t ndurs, dur_free;
    flight_t *flights;
    uint32_t nflights, flight_free;
    char err[512];
} worker_t;

/* Grows *arr (elements of size) to hold at least n + 1; counts bytes in c_bytes. */
static bool grow(worker_t *w, void **arr, uint32_t *cap, uint32_t n, size_t size)
{
    if (n < *cap)
        return true;
    uint32_t nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, nc * size);
    if (!p)
        return false;
    atomic_fetch_add_explicit(&w->st->c_bytes, (nc - *cap) * size, memory_order_relaxed);
    *arr = p;
    *cap = nc;
    return true;
}

static void dur_done(worker_t *w, uint32_t d)
{
    dur_t *e = &w->durs[d];
    rt_rules_durable_t ack = {e->token, e->status};
    rt_send(e->pid, RT_RULES_MSG_DURABLE, &ack, sizeof(ack));
    e->pid = 0;
    e->next_free = w->dur_free;
    w->dur_free = d;
    atomic_fetch_sub_explicit(&w->st->pending_durable, 1, memory_order_relaxed);
}

static void dur_put(worker_t *w, uint32_t d, int32_t status)
{
    dur_t *e = &w->durs[d];
    if (status < 0 && e->status == 0)
        e->status = status;
    if (--e->remaining == 0)
        dur_done(w, d);
}

/* A new durable entry (remaining 1), or NONE if out of memory (then no ack can be promised). */
static uint32_t dur_new(worker_t *w, rt_pid_t pid, uint64_t token)
{
    if (w->dur_free == NONE) {
        uint32_t cap = w->ndurs;
        if (!grow(w, (void **)&w->durs, &cap, w->ndurs, sizeof(dur_t)))
            return NONE;
        for (uint32_t i = cap; i-- > w->ndurs;) {
            w->durs[i].next_free = w->dur_free;
            w->dur_free = i;
        }
        w->ndurs = cap;
    }
    uint32_t d = w->dur_free;
    w->dur_free = w->durs[d].next_free;
    w->durs[d] = (dur_t){pid, token, 1, 0, NONE};
    atomic_fetch_add_explicit(&w->st->pending_durable, 1, memory_order_relaxed);
    return d;
}

static void flight_resolve(worker_t *w, uint32_t slot, int32_t status)
{
    flight_t *f = &w->flights[slot];
    for (uint32_t i = 0; i < f->ndurs; i++)
        dur_put(w, f->durs[i], status);
    f->ndurs = 0;
    f->used = false;
    f->gen++;
    f->next_free = w->flight_free;
    w->flight_free = slot;
}

/* Submits target t's batch. Its durable entries wait on the sink's ack. */
static void flush_batch(worker_t *w, uint32_t t)
{
    batch_t *b = &w->batches[t];
    if (b->nrows == 0)
        return;
    target_t *tg = &w->set->targets[t];
    uint32_t slot = NONE;
    if (b->ndurs) {
        if (w->flight_free == NONE) {
            uint32_t cap = w->nflights;
            if (grow(w, (void **)&w->flights, &cap, w->nflights, sizeof(flight_t))) {
                for (uint32_t i = cap; i-- > w->nflights;) {
                    memset(&w->flights[i], 0, sizeof(flight_t));
                    w->flights[i].next_free = w->flight_free;
                    w->flight_free = i;
                }
                w->nflights = cap;
            }
        }
        if (w->flight_free != NONE) {
            slot = w->flight_free;
            flight_t *f = &w->flights[slot];
            w->flight_free = f->next_free;
            f->used = true;
            /* The batch's list moves to the flight; the flight's (empty) one comes back. */
            uint32_t *tmp = f->durs, tc = f->capdurs;
            f->durs = b->durs, f->capdurs = b->capdurs, f->ndurs = b->ndurs;
            b->durs = tmp, b->capdurs = tc;
        } else {
            for (uint32_t i = 0; i < b->ndurs; i++)
                dur_put(w, b->durs[i], RT_ENOMEM);
        }
        b->ndurs = 0;
    }
    rt_bin_t *rows = rt_bin_new(b->rows.p, b->rows.len);
    uint32_t nrows = b->nrows;
    b->rows.len = 0;
    b->nrows = 0;
    int rc = RT_ENOMEM;
    if (rows) {
        uint64_t token = slot == NONE ? 0 : (uint64_t)w->flights[slot].gen << 32 | slot;
        rc = rt_sink_submit(tg->sink, rows, nrows, tg->opts ? rt_bin_retain(tg->opts) : NULL,
                            slot == NONE ? 0 : w->self, token);
        atomic_fetch_add_explicit(&w->st->batches, 1, memory_order_relaxed);
    }
    /* On any refusal the rows are gone; a late ack for the token finds the slot reused. */
    if (rc && slot != NONE)
        flight_resolve(w, slot, rc);
}

static void flush_all(worker_t *w)
{
    for (uint32_t t = 0; t < w->nbatches; t++)
        flush_batch(w, t);
}

static void free_batches(worker_t *w)
{
    for (uint32_t t = 0; t < w->nbatches; t++) {
        rt_rule_buf_free(&w->batches[t].rows);
        free(w->batches[t].durs);
        atomic_fetch_sub_explicit(&w->st->c_bytes, w->batches[t].capdurs * sizeof(uint32_t),
                                  memory_order_relaxed);
    }
    free(w->batches);
    atomic_fetch_sub_explicit(&w->st->c_bytes, w->nbatches * sizeof(batch_t), memory_order_relaxed);
    w->batches = NULL;
    w->nbatches = 0;
}

/* Moves the worker to set s: what was buffered for the old set is submitted first. */
static bool switch_set(worker_t *w, rule_set_t *s)
{
    flush_all(w);
    free_batches(w);
    set_release(w->set);
    w->set = NULL;
    if (s->ntargets) {
        w->batches = calloc(s->ntargets, sizeof(batch_t));
        if (!w->batches)
            return false;
        atomic_fetch_add_explicit(&w->st->c_bytes, s->ntargets * sizeof(batch_t),
                                  memory_order_relaxed);
        for (uint32_t t = 0; t < s->ntargets; t++)
            w->batches[t].rows.acct = &w->st->c_bytes;
    }
    w->nbatches = s->ntargets;
    w->set = set_retain(s);
    return true;
}

static void record_failure(rule_t *r, rt_rule_outcome_t o, const char *err)
{
    atomic_fetch_add_explicit(&r->m->failed[o - RT_RULE_FAIL_EXCEPTION], 1, memory_order_relaxed);
    pthread_mutex_lock(&r->m->lock);
    size_t n = strnlen(err, sizeof(r->m->last_error) - 1);
    memcpy(r->m->last_error, err, n); /* cut to fit */
    r->m->last_error[n] = 0;
    pthread_mutex_unlock(&r->m->lock);
}

/* Adds the staged rows of rule r to its targets' batches, for durable entry d (or NONE). */
static void route_rows(worker_t *w, rule_t *r, uint32_t nrows, uint32_t d)
{
    for (uint32_t i = 0; i < r->ntargets; i++) {
        uint32_t t = r->targets[i];
        batch_t *b = &w->batches[t];
        if (rt_rule_buf_append(&b->rows, w->stage.p, w->stage.len)) {
            if (d != NONE)
                w->durs[d].status = RT_ENOMEM;
            continue;
        }
        b->nrows += nrows;
        if (d != NONE && (b->ndurs == 0 || b->durs[b->ndurs - 1] != d)) {
            if (grow(w, (void **)&b->durs, &b->capdurs, b->ndurs, sizeof(uint32_t))) {
                b->durs[b->ndurs++] = d;
                w->durs[d].remaining++;
            } else {
                w->durs[d].status = RT_ENOMEM;
            }
        }
        if (b->nrows >= RT_RULES_BATCH_ROWS || b->rows.len >= RT_RULES_BATCH_BYTES)
            flush_batch(w, t);
    }
}

static void run_work(worker_t *w, rt_msg_t *m)
{
    work_t *wk = (work_t *)(void *)m->data;
    rule_set_t *s = wk->set;
    atomic_fetch_add_explicit(&w->st->messages, 1, memory_order_relaxed);
    const char *strs[7];
    const char *p = (const char *)(wk->rules + wk->nrules);
    for (int i = 0; i < 7; i++) {
        strs[i] = wk->slen[i] == UINT32_MAX ? NULL : p;
        p += wk->slen[i] == UINT32_MAX ? 0 : wk->slen[i] + 1;
    }
    rt_rule_input_t in = {
        .event = wk->event ? rt_rule_event_name(wk->event) : NULL,
        .topic = strs[S_TOPIC],
        .topic_len = strs[S_TOPIC] ? wk->slen[S_TOPIC] : 0,
        .qos = wk->qos,
        .retain = -1,
        .clientid = strs[S_CLIENTID],
        .username = strs[S_USERNAME],
        .peer = strs[S_PEER],
        .ts_ms = wk->ts_ms,
        .reason_code = wk->reason_code,
        .reason = strs[S_REASON],
        .from_clientid = strs[S_FROM_CLIENTID],
        .from_username = strs[S_FROM_USERNAME],
        .proto_ver = wk->proto_ver,
        .keepalive = wk->keepalive,
        .clean_start = wk->clean_start,
    };
    mqtt_packet_t pk;
    if (m->bin && mqtt_decode(rt_bin_data(m->bin), rt_bin_len(m->bin), MQTT_V5, &pk) == 0 &&
        pk.type == MQTT_PUBLISH) {
        in.topic = (const char *)pk.publish.topic.p;
        in.topic_len = pk.publish.topic.len;
        in.payload = pk.publish.payload.p ? pk.publish.payload.p : (const uint8_t *)"";
        in.payload_len = pk.publish.payload.len;
        in.qos = pk.publish.qos;
        in.retain = pk.publish.retain;
        in.props = &pk.props;
    }
    if (w->set != s && !switch_set(w, s)) {
        /* No memory for the batches: every rule on this message fails. */
        for (uint32_t i = 0; i < wk->nrules; i++)
            record_failure(&s->rules[wk->rules[i]], RT_RULE_FAIL_MEMORY, "out of memory");
        if (wk->ack_pid) {
            rt_rules_durable_t ack = {wk->ack_token, RT_ENOMEM};
            rt_send(wk->ack_pid, RT_RULES_MSG_DURABLE, &ack, sizeof(ack));
        }
        set_release(s);
        return;
    }
    uint32_t d = NONE;
    int32_t early = 0;
    if (wk->ack_pid && (d = dur_new(w, wk->ack_pid, wk->ack_token)) == NONE)
        early = RT_ENOMEM;
    rt_rule_vm_t *vm = s->vms[w->index];
    for (uint32_t i = 0; i < wk->nrules; i++) {
        rule_t *r = &s->rules[wk->rules[i]];
        uint32_t nrows = 0;
        w->stage.len = 0;
        rt_rule_outcome_t o =
            rt_rule_vm_run(vm, wk->rules[i], &in, &w->stage, &nrows, w->err, sizeof(w->err));
        switch (o) {
        case RT_RULE_PASSED:
            atomic_fetch_add_explicit(&r->m->passed, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&r->m->rows_out, nrows, memory_order_relaxed);
            route_rows(w, r, nrows, d);
            break;
        case RT_RULE_FILTERED:
            atomic_fetch_add_explicit(&r->m->filtered, 1, memory_order_relaxed);
            break;
        default:
            record_failure(r, o, w->err);
            if (d != NONE && r->durable && w->durs[d].status == 0)
                w->durs[d].status = RT_EINVAL;
        }
        /* Counted last, so whoever sees matched move also sees the outcome and its error. */
        atomic_fetch_add_explicit(&r->m->matched, 1, memory_order_release);
    }
    if (d != NONE)
        dur_put(w, d, 0);
    else if (early) {
        rt_rules_durable_t ack = {wk->ack_token, early};
        rt_send(wk->ack_pid, RT_RULES_MSG_DURABLE, &ack, sizeof(ack));
    }
    set_release(s);
    bool buffered = false;
    for (uint32_t t = 0; t < w->nbatches && !buffered; t++)
        buffered = w->batches[t].nrows > 0;
    /* With flush_ms 0 the flush message queues behind what is already in the mailbox:
       one submit per turn. Otherwise a timer: rows gather for flush_ms (or until a batch
       is full) so the sink gets a few large submissions, not one per message. */
    if (buffered && !w->flush_pending &&
        (E.flush_ms ? rt_send_after_tag(E.flush_ms, w->self, TAG_FLUSH, NULL)
                    : rt_send(w->self, TAG_FLUSH, NULL, 0)) == 0)
        w->flush_pending = true;
}

static int worker_init(rt_actor_t *self, void *state, void *arg)
{
    worker_t *w = state;
    memset(w, 0, sizeof(*w));
    w->index = (unsigned)(uintptr_t)arg;
    w->self = rt_self(self);
    w->st = &E.workers[w->index];
    w->stage.acct = &w->st->c_bytes;
    w->dur_free = w->flight_free = NONE;
    return 0;
}

static void worker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    worker_t *w = state;
    switch (m->tag) {
    case TAG_WORK:
        run_work(w, m);
        break;
    case TAG_FLUSH:
        w->flush_pending = false;
        flush_all(w);
        break;
    case RT_SINK_MSG_COMMITTED: {
        rt_sink_committed_t c;
        if (m->len < sizeof(c))
            break;
        memcpy(&c, m->data, sizeof(c));
        uint32_t slot = (uint32_t)c.token;
        if (slot < w->nflights && w->flights[slot].used &&
            w->flights[slot].gen == (uint32_t)(c.token >> 32))
            flight_resolve(w, slot, c.status);
        break;
    }
    case TAG_STOP:
        flush_all(w);
        rt_exit(self, RT_REASON_NORMAL);
        break;
    }
    /*
    ** Past its time the worker lets the other actors on its scheduler run (a rule
    ** that burns its instruction budget takes ms a call). Nothing here depends on
    ** where a turn ends: rows wait for TAG_FLUSH (a message or a timer), durable
    ** acks for the sink's commit, and both stay queued in order across turns.
    */
    if (rt_turn_us(self) >= E.turn_us)
        rt_yield(self);
}

static void worker_trace(void *state, rt_gc_t *gc)
{
    /* Everything the worker holds comes from malloc (counted in c_bytes), not its heap. */
    (void)state;
    (void)gc;
}

static void worker_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    worker_t *w = state;
    /* Every promised ack is sent, even now: the publisher must not wait forever. */
    for (uint32_t i = 0; i < w->ndurs; i++)
        if (w->durs[i].pid) {
            w->durs[i].status = RT_ESHUTDOWN;
            w->durs[i].remaining = 1;
            dur_put(w, i, RT_ESHUTDOWN);
        }
    free_batches(w);
    for (uint32_t i = 0; i < w->nflights; i++)
        free(w->flights[i].durs);
    free(w->flights);
    free(w->durs);
    rt_rule_buf_free(&w->stage);
    set_release(w->set);
    atomic_store(&w->st->c_bytes, 0);
    w->set = NULL;
}

static const char *worker_tag_name(uint32_t tag)
{
    switch (tag) {
    case TAG_WORK:
        return "rule_work";
    case TAG_FLUSH:
        return "rule_flush";
    case TAG_STOP:
        return "rule_stop";
    case RT_SINK_MSG_COMMITTED:
        return "sink_committed";
    }
    return "";
}

static const rt_actor_type_t worker_type = {
    .name = "rule_worker",
    .state_size = sizeof(worker_t),
    .init = worker_init,
    .handle = worker_handle,
    .trace = worker_trace,
    .terminate = worker_terminate,
    .tag_name = worker_tag_name,
};

/* ---- Start, stop, reload ---- */

static void stop_locked(void)
{
    atomic_store(&E.running, false);
    pthread_rwlock_wrlock(&E.lock);
    rule_set_t *cur = E.cur;
    E.cur = NULL;
    atomic_store(&E.wants, 0);
    pthread_rwlock_unlock(&E.lock);
    bool all_gone = true;
    for (unsigned i = 0; i < E.nworkers; i++)
        if (E.workers[i].pid)
            rt_send(E.workers[i].pid, TAG_STOP, NULL, 0);
    for (unsigned i = 0; i < E.nworkers; i++) {
        struct timespec ts = {0, 1000000};
        for (int k = 0; k < RT_RULES_STOP_WAIT_MS && rt_alive(E.workers[i].pid); k++)
            nanosleep(&ts, NULL);
        all_gone &= !rt_alive(E.workers[i].pid);
    }
    set_release(cur);
    /*
    ** What is left is held by messages that never reached a worker (sent as it
    ** stopped); with every worker gone nothing can read them, so they go too. If
    ** a worker is somehow still alive, its sets are left rather than pulled away.
    */
    pthread_mutex_lock(&E.sets_lock);
    rule_set_t *s = all_gone ? E.sets : NULL;
    if (all_gone)
        E.sets = NULL;
    pthread_mutex_unlock(&E.sets_lock);
    while (s) {
        rule_set_t *next = s->next;
        set_free(s);
        s = next;
    }
    if (all_gone) {
        free(E.workers);
        E.workers = NULL;
        E.nworkers = 0;
    }
}

static pthread_once_t lock_once = PTHREAD_ONCE_INIT;

static void lock_init(void)
{
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&E.lock, &a);
    pthread_rwlockattr_destroy(&a);
}

int rt_rules_start(const rt_conf_t *conf, char *err, size_t errlen)
{
    pthread_once(&lock_once, lock_init);
    pthread_mutex_lock(&E.admin);
    int rc = 0;
    if (atomic_load(&E.running)) {
        snprintf(err, errlen, "the rule engine is already running");
        rc = RT_EEXIST;
        goto out;
    }
    E.nworkers = (unsigned)(conf->rule_workers > 0 ? conf->rule_workers : 1);
    E.memory = (size_t)conf->rule_memory;
    E.instructions = conf->rule_instructions;
    E.call_ms = conf->rule_call_ms;
    E.output_rows = conf->rule_output_rows;
    E.output_bytes = (size_t)conf->rule_output_bytes;
    E.flush_ms = conf->rule_flush_ms > 0 ? (uint64_t)conf->rule_flush_ms : 0;
    E.turn_us = conf->rule_turn_us > 0 ? (uint64_t)conf->rule_turn_us : RT_CONF_RULE_TURN_US;
    snprintf(E.dir, sizeof(E.dir), "%s", conf->rules_dir);
    E.version = 0;
    /* Cache-line aligned: each worker's counters sit on their own line. */
    E.workers = aligned_alloc(RT_CACHE_LINE, E.nworkers * sizeof(worker_stats_t));
    if (E.workers)
        memset(E.workers, 0, E.nworkers * sizeof(worker_stats_t));
    if (!E.workers) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
        goto out;
    }
    rule_set_t *s;
    if ((rc = build_set(E.dir, NULL, &s, err, errlen))) {
        free(E.workers);
        E.workers = NULL;
        goto out;
    }
    for (unsigned i = 0; i < E.nworkers; i++) {
        if ((rc = rt_spawn(&worker_type, (void *)(uintptr_t)i, &E.workers[i].pid))) {
            snprintf(err, errlen, "cannot start rule worker: %s", rt_strerror(rc));
            set_free(s);
            stop_locked();
            goto out;
        }
    }
    install(s);
    atomic_store(&E.running, true);
out:
    pthread_mutex_unlock(&E.admin);
    return rc;
}

void rt_rules_stop(void)
{
    pthread_once(&lock_once, lock_init);
    pthread_mutex_lock(&E.admin);
    if (E.workers)
        stop_locked();
    pthread_mutex_unlock(&E.admin);
}

int rt_rules_reload(char *err, size_t errlen)
{
    pthread_mutex_lock(&E.admin);
    int rc = RT_ESHUTDOWN;
    if (!atomic_load(&E.running)) {
        snprintf(err, errlen, "the rule engine is not running");
        goto out;
    }
    /* Only this thread (holding admin) replaces cur, so reading it here needs no lock. */
    rule_set_t *s;
    if ((rc = build_set(E.dir, E.cur, &s, err, errlen)) == 0)
        install(s);
out:
    pthread_mutex_unlock(&E.admin);
    return rc;
}

/* The current set with a reference, or NULL. */
static rule_set_t *current(void)
{
    rule_set_t *s = lock_current();
    if (!s)
        return NULL;
    set_retain(s);
    pthread_rwlock_unlock(&E.lock);
    return s;
}

static rule_t *find_rule(rule_set_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->nrules; i++)
        if (strcmp(s->rules[i].name, name) == 0)
            return &s->rules[i];
    return NULL;
}

int rt_rules_enable(const char *name, bool on)
{
    /* The read lock is held throughout, so a reload installs either before (this finds the
       new set) or after (apply_overrides sees the override). */
    rule_set_t *s = lock_current();
    rule_t *r = s ? find_rule(s, name) : NULL;
    int rc = r ? 0 : RT_ENOTFOUND;
    if (r && on && r->missing_sink[0]) {
        rc = RT_EINVAL;
    } else if (r) {
        atomic_store(&r->m->override, on == r->file_enabled ? -1 : (int)on);
        atomic_store(&r->enabled, on);
    }
    if (s)
        pthread_rwlock_unlock(&E.lock);
    return rc;
}

size_t rt_rules_snapshot(rt_rule_info_t *out, size_t max)
{
    rule_set_t *s = current();
    if (!s)
        return 0;
    for (uint32_t i = 0; i < s->nrules && i < max; i++) {
        rule_t *r = &s->rules[i];
        rt_rule_info_t *o = &out[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", r->name);
        o->version = s->version;
        o->enabled = atomic_load(&r->enabled);
        o->overridden = o->enabled != r->file_enabled;
        o->durable = r->durable;
        snprintf(o->from, sizeof(o->from), "%s", r->from);
        snprintf(o->to, sizeof(o->to), "%s", r->to);
        o->matched = atomic_load(&r->m->matched);
        o->passed = atomic_load(&r->m->passed);
        o->filtered = atomic_load(&r->m->filtered);
        o->failed_exception = atomic_load(&r->m->failed[0]);
        o->failed_budget = atomic_load(&r->m->failed[1]);
        o->failed_memory = atomic_load(&r->m->failed[2]);
        o->failed = o->failed_exception + o->failed_budget + o->failed_memory;
        o->rows_out = atomic_load(&r->m->rows_out);
        pthread_mutex_lock(&r->m->lock);
        snprintf(o->last_error, sizeof(o->last_error), "%s", r->m->last_error);
        pthread_mutex_unlock(&r->m->lock);
    }
    size_t n = s->nrules;
    set_release(s);
    return n;
}

size_t rt_rules_workers(rt_rules_worker_info_t *out, size_t max)
{
    rule_set_t *s = current();
    if (!s)
        return 0;
    for (unsigned i = 0; i < E.nworkers && i < max; i++) {
        worker_stats_t *st = &E.workers[i];
        out[i] = (rt_rules_worker_info_t){
            .pid = st->pid,
            .messages = atomic_load(&st->messages),
            .batches = atomic_load(&st->batches),
            .lua_bytes = i < s->nvms ? rt_rule_vm_bytes(s->vms[i]) : 0,
            .c_bytes = atomic_load(&st->c_bytes),
            .pending_durable = atomic_load(&st->pending_durable),
        };
    }
    size_t n = E.nworkers;
    set_release(s);
    return n;
}

int rt_rules_stats(rt_rules_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    rule_set_t *s = current();
    if (!s)
        return RT_ESHUTDOWN;
    out->version = s->version;
    out->rules = s->nrules;
    out->workers = s->nvms;
    rt_trie_stats_t ts;
    rt_trie_stats(s->trie, &ts);
    out->index_bytes = ts.bytes + sizeof(*s) + s->nrules * sizeof(rule_t) +
                       s->ntargets * sizeof(target_t) + s->nvms * sizeof(*s->vms);
    for (int k = 0; k < RT_RULE_NEVENTS; k++)
        out->index_bytes += s->nevents[k] * sizeof(uint32_t);
    for (uint32_t i = 0; i < s->nrules; i++)
        out->text_bytes += s->rules[i].len + 1 + strlen(s->rules[i].path) + 1;
    for (unsigned i = 0; i < s->nvms; i++)
        out->lua_bytes += rt_rule_vm_bytes(s->vms[i]);
    set_release(s);
    return 0;
}

/* Renders the BSON documents in rows as a JSON array (relaxed extended JSON). */
static char *rows_json(const rt_rule_buf_t *rows, uint32_t nrows)
{
    rt_rule_buf_t out = {0};
    bool ok = rt_rule_buf_append(&out, "[", 1) == 0;
    size_t off = 0;
    for (uint32_t i = 0; i < nrows && ok; i++) {
        int32_t len;
        memcpy(&len, rows->p + off, 4);
        bson_t doc;
        ok = bson_init_static(&doc, rows->p + off, (size_t)len);
        size_t jl = 0;
        char *j = ok ? bson_as_relaxed_extended_json(&doc, &jl) : NULL;
        ok = j && (i == 0 || rt_rule_buf_append(&out, ",", 1) == 0) &&
             rt_rule_buf_append(&out, j, jl) == 0;
        bson_free(j);
        off += (size_t)len;
    }
    ok = ok && rt_rule_buf_append(&out, "]", 2) == 0;
    if (!ok) {
        rt_rule_buf_free(&out);
        return NULL;
    }
    return (char *)out.p;
}

int rt_rules_test(const char *name, const char *topic, const void *payload, size_t len, int qos,
                  char **json_out, char *err, size_t errlen)
{
    *json_out = NULL;
    rule_set_t *s = current();
    if (!s) {
        snprintf(err, errlen, "the rule engine is not running");
        return RT_ESHUTDOWN;
    }
    rule_t *r = find_rule(s, name);
    if (!r) {
        set_release(s);
        snprintf(err, errlen, "no rule named \"%s\"", name);
        return RT_ENOTFOUND;
    }
    rt_rule_vm_t *vm;
    rt_rule_spec_t spec;
    int rc = new_vm(&vm);
    if (rc) {
        set_release(s);
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    if ((rc = rt_rule_vm_load(vm, r->path, r->text, r->len, &spec, err, errlen)) == 0) {
        rt_rule_spec_free(&spec);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rt_rule_input_t in = {
            .topic = topic,
            .topic_len = strlen(topic),
            .payload = payload,
            .payload_len = len,
            .qos = qos,
            .retain = 0,
            .clientid = "rt_rules_test",
            .peer = "127.0.0.1:0",
            .reason_code = -1,
            .proto_ver = -1,
            .keepalive = -1,
            .clean_start = -1,
            .ts_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000,
        };
        if (!in.payload)
            in.payload = (const uint8_t *)"";
        rt_rule_buf_t rows = {0};
        uint32_t nrows = 0;
        rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, &in, &rows, &nrows, err, errlen);
        if (o == RT_RULE_PASSED || o == RT_RULE_FILTERED) {
            if (!(*json_out = rows_json(&rows, nrows))) {
                snprintf(err, errlen, "out of memory");
                rc = RT_ENOMEM;
            }
        } else {
            rc = RT_EINVAL;
        }
        rt_rule_buf_free(&rows);
    }
    rt_rule_vm_free(vm);
    set_release(s);
    return rc;
}

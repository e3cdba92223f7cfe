/*
** Rule sets (rule_internal.h): loading every rule file of rules_dir into one immutable
** version (its rules, topic index, event lists, sink targets and one Lua state per
** worker), and the version's lifetime by reference.
*/
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rule_internal.h"

/* Every set still alive, for the final cleanup. */
static pthread_mutex_t sets_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_rule_set_t *sets;

static rt_rule_metrics_t *metrics_new(void)
{
    rt_rule_metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    atomic_init(&m->refs, 1);
    atomic_init(&m->override, -1);
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

static void metrics_release(rt_rule_metrics_t *m)
{
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        pthread_mutex_destroy(&m->lock);
        free(m);
    }
}

int rt__rule_vm_configured(rt_rule_vm_t **out)
{
    int rc = rt_rule_vm_new(rt__rules.memory, rt__rules.instructions, out);
    if (rc == 0)
        rt_rule_vm_set_limits(*out, rt__rules.call_ms, rt__rules.output_rows,
                              rt__rules.output_bytes);
    return rc;
}

static void set_free(rt_rule_set_t *s)
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
    rt_rule_index_free(s->topics);
    free(s);
}

rt_rule_set_t *rt__rule_set_retain(rt_rule_set_t *s)
{
    RT_ASSERT(atomic_load_explicit(&s->refs, memory_order_relaxed) > 0);
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void rt__rule_set_release(rt_rule_set_t *s)
{
    if (!s)
        return;
    unsigned before = atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel);
    RT_ASSERT(before > 0);
    if (before != 1)
        return;
    pthread_mutex_lock(&sets_lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        sets = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&sets_lock);
    set_free(s);
}

size_t rt__rule_sets_lua_bytes(void)
{
    RT_ASSERT(rt__rules_holds_read() || rt__rules_holds_write());
    size_t n = 0;
    pthread_mutex_lock(&sets_lock);
    for (rt_rule_set_t *s = sets; s; s = s->next)
        for (unsigned i = 0; i < s->nvms; i++)
            n += rt_rule_vm_bytes(s->vms[i]);
    pthread_mutex_unlock(&sets_lock);
    return n;
}

void rt__rule_set_free_all(void)
{
    pthread_mutex_lock(&sets_lock);
    rt_rule_set_t *s = sets;
    sets = NULL;
    pthread_mutex_unlock(&sets_lock);
    while (s) {
        rt_rule_set_t *next = s->next;
        set_free(s);
        s = next;
    }
}

rt_rule_t *rt__rule_set_find(rt_rule_set_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->nrules; i++)
        if (strcmp(s->rules[i].name, name) == 0)
            return &s->rules[i];
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads path into a new NUL-terminated buffer. */
static int read_rule_file(const char *path, char **text, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    int trusted = rt_file_trusted(fileno(f), path, "rule file", err, errlen);
    if (trusted) {
        fclose(f);
        return trusted;
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
    /* The text is kept with the set: not in a block sized for the largest file allowed. */
    char *fit = realloc(buf, n + 1);
    *text = fit ? fit : buf;
    *len = n;
    return 0;
}

/*
** The sorted *.lua names of dir; none if dir does not exist and missing_ok (at start), an error
** if not (on a reload: a directory that is gone for a moment, mid-deploy, must not silently
** empty the rule set; an empty directory does that on purpose).
*/
static int list_rule_files(const char *dir, bool missing_ok, char ***names, size_t *n, char *err,
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
    /* Anyone who could add a file here could run Lua in rtd (rt_file_trusted). */
    int trusted = rt_file_trusted(dirfd(d), dir, "rules_dir", err, errlen);
    if (trusted) {
        closedir(d);
        return trusted;
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
        if ((rc = rt_grow(names, &cap, *n + 1, sizeof(char *), 32)))
            break;
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

/* items joined by ", " into out, cut to fit. */
static void join_names(char *out, size_t cap, const char *const *items, size_t n)
{
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? ", " : "", items[i]);
}

/* The metrics of prev's rule of this name (another reference), or new ones. */
static rt_rule_metrics_t *carry_metrics(rt_rule_set_t *prev, const char *name)
{
    rt_rule_t *r = prev ? rt__rule_set_find(prev, name) : NULL;
    if (!r)
        return metrics_new();
    atomic_fetch_add(&r->m->refs, 1);
    return r->m;
}

/* Finds or adds the (sink, options) target; returns its index or RT_RULES_NONE on failure. */
static uint32_t add_target(rt_rule_set_t *s, rt_sink_t *sink, const rt_rule_to_t *to)
{
    for (uint32_t i = 0; i < s->ntargets; i++) {
        rt_rule_target_t *t = &s->targets[i];
        size_t ol = t->opts ? rt_bin_len(t->opts) : 0;
        if (t->sink == sink && ol == to->opts_len &&
            (ol == 0 || memcmp(rt_bin_data(t->opts), to->opts, ol) == 0))
            return i;
    }
    rt_rule_target_t *nt = realloc(s->targets, (s->ntargets + 1) * sizeof(*nt));
    if (!nt)
        return RT_RULES_NONE;
    s->targets = nt;
    rt_rule_target_t *t = &nt[s->ntargets];
    memset(t, 0, sizeof(*t));
    t->sink = sink;
    snprintf(t->name, sizeof(t->name), "%s", to->sink);
    if (to->opts && !(t->opts = rt_bin_new(to->opts, to->opts_len)))
        return RT_RULES_NONE;
    return s->ntargets++;
}

/* Rule idx's from entries into the set's index: events in per-kind lists, filters in topics. */
static int index_rule(rt_rule_set_t *s, uint32_t idx, const rt_rule_spec_t *spec, char *err,
                      size_t errlen)
{
    const rt_rule_t *r = &s->rules[idx];
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
        int rc = rt_rule_index_add(s->topics, spec->from[i], strlen(spec->from[i]), idx);
        if (rc) {
            snprintf(err, errlen, "%s:%d: from: \"%s\": %s", r->path,
                     rt_rule_field_line(r->text, r->len, "from"), spec->from[i], rt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* Takes spec's declarations into rule idx of s; checks sinks and name clashes. */
static int adopt_spec(rt_rule_set_t *s, uint32_t idx, rt_rule_spec_t *spec, rt_rule_set_t *prev,
                      char *err, size_t errlen)
{
    rt_rule_t *r = &s->rules[idx];
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
    join_names(r->from, sizeof(r->from), (const char *const *)spec->from, spec->nfrom);
    const char *tos[RT_RULE_MAX_TO];
    for (size_t i = 0; i < spec->nto; i++) {
        tos[i] = spec->to[i].sink;
        rt_sink_t *sink = rt_sink_find(spec->to[i].sink);
        bool known =
            sink || (rt__rules.checking && rt_sinks_enabled(rt__rules.checking, spec->to[i].sink));
        if (!known && !spec->enabled) {
            /* A disabled rule may name a sink that is not running (disabled in rtd.conf);
               it cannot be enabled until a reload finds the sink. */
            if (!r->missing_sink[0])
                snprintf(r->missing_sink, sizeof(r->missing_sink), "%s", spec->to[i].sink);
            continue;
        }
        if (!known) {
            int line = rt_rule_field_line(r->text, r->len, "to");
            snprintf(err, errlen,
                     "%s:%d: to: no sink named \"%s\" (sinks are configured in "
                     "the sinks table of rtd.conf)",
                     r->path, line, spec->to[i].sink);
            return RT_EINVAL;
        }
        if (!sink) /* a check: no sink runs, so there is nothing to send to */
            continue;
        uint32_t t = add_target(s, sink, &spec->to[i]);
        if (t == RT_RULES_NONE) {
            snprintf(err, errlen, "%s: out of memory", r->path);
            return RT_ENOMEM;
        }
        r->targets[r->ntargets++] = t;
    }
    join_names(r->to, sizeof(r->to), tos, spec->nto);
    if (!(r->m = carry_metrics(prev, r->name))) {
        snprintf(err, errlen, "%s: out of memory", r->path);
        return RT_ENOMEM;
    }
    return index_rule(s, idx, spec, err, errlen);
}

int rt__rule_set_vm(const rt_rule_set_t *s, rt_rule_vm_t **out, char *err, size_t errlen)
{
    rt_rule_vm_t *vm;
    if (rt__rule_vm_configured(&vm)) {
        snprintf(err, errlen, "out of memory for a rule state");
        return RT_ENOMEM;
    }
    for (uint32_t i = 0; i < s->nrules; i++) {
        rt_rule_spec_t spec;
        memset(&spec, 0, sizeof(spec));
        int rc = rt_rule_vm_load(vm, s->rules[i].path, s->rules[i].text, s->rules[i].len, &spec,
                                 err, errlen);
        rt_rule_spec_free(&spec);
        if (rc) {
            rt_rule_vm_free(vm);
            return rc;
        }
    }
    RT_ASSERT(rt_rule_vm_nrules(vm) == s->nrules);
    *out = vm;
    return 0;
}

/*
** Loads every rule file of dir into a new set: a validation state parses,
** checks and dry-runs each rule, then one state per worker loads them all.
*/
int rt__rule_set_build(const char *dir, rt_rule_set_t *prev, rt_rule_set_t **out, char *err,
                       size_t errlen)
{
    RT_ASSERT(rt__rules_holds_admin());
    char **names = NULL;
    size_t nnames = 0;
    rt_rule_vm_t *check = NULL;
    rt_rule_spec_t spec;
    memset(&spec, 0, sizeof(spec));
    int rc = list_rule_files(dir, prev == NULL, &names, &nnames, err, errlen);
    rt_rule_set_t *s = calloc(1, sizeof(*s));
    if (!s && !rc) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
    }
    if (rc)
        goto fail;
    atomic_init(&s->refs, 1);
    s->rules = calloc(nnames ? nnames : 1, sizeof(rt_rule_t));
    s->vms = calloc(rt__rules.nworkers, sizeof(*s->vms));
    if (!s->rules || !s->vms || rt_rule_index_new(&s->topics) || rt__rule_vm_configured(&check)) {
        snprintf(err, errlen, "out of memory");
        rc = RT_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < nnames; i++) {
        rt_rule_t *r = &s->rules[i];
        size_t pl = strlen(dir) + strlen(names[i]) + 2;
        if (!(r->path = malloc(pl))) {
            rc = RT_ENOMEM;
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        snprintf(r->path, pl, "%s/%s", dir, names[i]);
        s->nrules++;
        if ((rc = read_rule_file(r->path, &r->text, &r->len, err, errlen)))
            goto fail;
        if ((rc = rt_rule_vm_load(check, r->path, r->text, r->len, &spec, err, errlen)))
            goto fail;
        rc = adopt_spec(s, (uint32_t)i, &spec, prev, err, errlen);
        rt_rule_spec_free(&spec);
        if (rc)
            goto fail;
    }
    if ((rc = rt_rule_index_seal(s->topics))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < s->nrules; i++)
        if ((rc = rt_rule_vm_dry_run(check, i, err, errlen)))
            goto fail;
    rt_rule_vm_free(check);
    check = NULL;
    for (unsigned w = 0; w < rt__rules.nworkers; w++) {
        if ((rc = rt__rule_set_vm(s, &s->vms[w], err, errlen)))
            goto fail;
        s->nvms = w + 1;
    }
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    pthread_mutex_lock(&sets_lock);
    s->next = sets;
    if (sets)
        sets->prev = s;
    sets = s;
    pthread_mutex_unlock(&sets_lock);
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

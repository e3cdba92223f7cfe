/*
** The configured sinks as a set: each `sinks` section checked against its driver's keys
** and made into a sink record, their actors started and stopped together, and lookup by
** name and metrics for whoever asks (any thread).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "group.h"
#include "log.h"
#include "bson_mem.h"
#include "sink_impl.h"

static rt_sink_t *g_sinks[RT_CONF_MAX_SECTIONS];
static unsigned g_nsinks;
static atomic_bool g_running;
static rt_pid_t g_sup; /* the supervisor the sinks' group runs under (0: none) */

#define RT_SINKS_GROUP "sinks_sup"

static const sink_driver_t *const drivers[] = {&rt_sink_sqlite_driver, &rt_sink_mongo_driver,
                                               &rt_sink_republish_driver, &rt_sink_http_driver,
                                               &rt_sink_xmpp_driver};

const rt_conf_kv_t *rt__sink_kv(const rt_conf_section_t *sec, const char *key)
{
    for (unsigned i = 0; i < sec->nkeys; i++)
        if (strcmp(sec->keys[i].key, key) == 0)
            return &sec->keys[i];
    return NULL;
}

static const char *const sink_types[] = {"sqlite", "mongodb", "republish", "http", "xmpp", NULL};

/* The keys every sink takes, whatever its type. */
static const rt_setting_t common_keys[] = {
    {.name = "sinks.<name>.type",
     .type = RT_SET_STRING,
     .choices = sink_types,
     .doc = "the driver (required)"},
    {.name = "sinks.<name>.enabled",
     .type = RT_SET_BOOL,
     .num = true,
     .doc = "false keeps the sink configured (and checked) but not started"},
    {.name = "sinks.<name>.batch",
     .type = RT_SET_INT,
     .num = RT_SINK_BATCH_DEFAULT,
     .unit = "rows",
     .min = 1,
     .max = 100000,
     .doc = "per write"},
    {.name = "sinks.<name>.flush_ms",
     .type = RT_SET_INT,
     .num = RT_SINK_FLUSH_MS_DEFAULT,
     .unit = "ms",
     .min = 0,
     .max = 3600000,
     .doc = "before a partial batch is written"},
    {.name = "sinks.<name>.queue_bytes",
     .type = RT_SET_INT,
     .num = RT_SINK_QUEUE_BYTES_DEFAULT,
     .unit = "bytes",
     .min = 1024,
     .max = 1e12,
     .doc = "of rows kept in memory before they are spilled to disk"},
    {.name = "sinks.<name>.max_bytes",
     .type = RT_SET_INT,
     .num = RT_SINK_MAX_BYTES_DEFAULT,
     .unit = "bytes",
     .min = 1024,
     .max = 1e15,
     .doc = "in memory and spill; beyond, rows are dropped"},
    {.name = "sinks.<name>.backoff_ms",
     .type = RT_SET_INT,
     .num = RT_SINK_BACKOFF_MS_DEFAULT,
     .unit = "ms",
     .min = 1,
     .max = 60000,
     .doc = "the first retry delay after a failure"},
    {.name = "sinks.<name>.backoff_max_ms",
     .type = RT_SET_INT,
     .num = RT_SINK_BACKOFF_MAX_MS_DEFAULT,
     .unit = "ms",
     .min = 1,
     .max = 600000,
     .doc = "the longest retry delay (the delay doubles)"},
    {.name = NULL},
};

void rt_sinks_schema(void)
{
    rt_conf_schema_add(common_keys);
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        rt_conf_schema_add(drivers[i]->keys);
}

/* A key's name in the section: what its schema name has after "sinks.<name>." or
   "sinks.<name>(TYPE)."; for a prefix, up to its "<...>". */
static const char *key_of(const rt_setting_t *k, size_t *len)
{
    const char *p = k->name + strlen(RT_SINK_KEY_SCOPE);
    if (*p == '(')
        p = strchr(p, ')') + 1;
    p++; /* the dot */
    *len = k->type == RT_SET_PREFIX ? strcspn(p, "<") : strlen(p);
    return p;
}

static const rt_setting_t *find_key(const rt_setting_t *keys, const char *name)
{
    for (; keys && keys->name; keys++) {
        size_t n;
        const char *key = key_of(keys, &n);
        if (keys->type == RT_SET_PREFIX ? strncmp(key, name, n) == 0 && name[n]
                                        : strcmp(key, name) == 0)
            return keys;
    }
    return NULL;
}

/* A number key of a sink: as set, else its driver's default, else every sink's. */
static double num_or(const rt_conf_section_t *sec, const sink_driver_t *drv, const char *key)
{
    const rt_conf_kv_t *kv = rt__sink_kv(sec, key);
    const rt_setting_t *k = find_key(drv->keys, key);
    if (!k)
        k = find_key(common_keys, key);
    RT_ASSERT(k && k->type == RT_SET_INT);
    return kv ? kv->num : k->num;
}

static void sink_free(rt_sink_t *s)
{
    if (s->drv && s->drv->free)
        s->drv->free(s);
    pthread_mutex_destroy(&s->err_lock);
    free(s->batch_rows);
    free(s);
}

/*
** Checks one section and makes its sink (not started). Returns 0 with *out NULL
** for a disabled sink.
*/
static int make_sink(const rt_conf_t *conf, const rt_conf_section_t *sec, rt_sink_t **out,
                     char *why, size_t whylen)
{
    *out = NULL;
    const rt_conf_kv_t *type = rt__sink_kv(sec, "type");
    if (!type || type->type != RT_CONF_V_STRING) {
        char types[64];
        rt_conf_choices_text(sink_types, types, sizeof(types));
        snprintf(why, whylen, "type is required (%s)", types);
        return RT_EINVAL;
    }
    const sink_driver_t *drv = NULL;
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (strcmp(drivers[i]->type, type->str) == 0)
            drv = drivers[i];
    if (!drv) {
        char types[64];
        rt_conf_choices_text(sink_types, types, sizeof(types));
        snprintf(why, whylen, "unknown type \"%.40s\" (%.60s)", type->str, types);
        return RT_EINVAL;
    }
    for (unsigned i = 0; i < sec->nkeys; i++) {
        const rt_setting_t *k = find_key(drv->keys, sec->keys[i].key); /* it may override */
        if (!k)
            k = find_key(common_keys, sec->keys[i].key);
        if (!k) {
            int n = snprintf(why, whylen, "unknown key %s (%s sinks take:", sec->keys[i].key,
                             drv->type);
            for (const rt_setting_t *kk = common_keys + 1; kk->name && n > 0 && (size_t)n < whylen;
                 kk++) {
                size_t len;
                const char *key = key_of(kk, &len);
                n += snprintf(why + n, whylen - (size_t)n, " %.*s", (int)len, key);
            }
            for (const rt_setting_t *kk = drv->keys; kk->name && n > 0 && (size_t)n < whylen;
                 kk++) {
                size_t len;
                const char *key = key_of(kk, &len);
                n += snprintf(why + n, whylen - (size_t)n, " %.*s%s", (int)len, key,
                              kk->type == RT_SET_PREFIX ? "*" : "");
            }
            if (n > 0 && (size_t)n < whylen)
                snprintf(why + n, whylen - (size_t)n, ")");
            return RT_EINVAL;
        }
        int rc = rt_conf_check_kv(k, &sec->keys[i], why, whylen);
        if (rc)
            return rc;
    }
    rt_sink_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    pthread_mutex_init(&s->err_lock, NULL);
    snprintf(s->name, sizeof(s->name), "%s", sec->name);
    s->drv = drv;
    s->batch = (uint32_t)num_or(sec, drv, "batch");
    s->flush_ms = (uint32_t)num_or(sec, drv, "flush_ms");
    s->queue_bytes = (uint64_t)num_or(sec, drv, "queue_bytes");
    s->max_bytes = (uint64_t)num_or(sec, drv, "max_bytes");
    s->backoff_ms = (uint32_t)num_or(sec, drv, "backoff_ms");
    s->backoff_max_ms = (uint32_t)num_or(sec, drv, "backoff_max_ms");
    if (s->backoff_max_ms < s->backoff_ms)
        s->backoff_max_ms = s->backoff_ms;
    atomic_store(&s->state, SINK_CONNECTING);
    int n =
        snprintf(s->spill_path, sizeof(s->spill_path), "%s/spill-%s.db", conf->data_dir, s->name);
    s->batch_rows = calloc(s->batch, sizeof(sink_row_t));
    int rc = 0;
    if (n < 0 || (size_t)n >= sizeof(s->spill_path)) {
        snprintf(why, whylen, "data_dir is too long for the spill file");
        rc = RT_EINVAL;
    } else if (!s->batch_rows) {
        snprintf(why, whylen, "out of memory");
        rc = RT_ENOMEM;
    } else {
        rc = drv->configure(s, sec, why, whylen);
    }
    if (rc)
        s->drv = NULL; /* configure cleans up after itself on error */
    /* A disabled sink is checked like the others (a bad uri is an error now, not the
       day someone enables it), then set aside. */
    const rt_conf_kv_t *en = rt__sink_kv(sec, "enabled");
    if (rc || (en && !en->b)) {
        sink_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Whether line (one line of Lua) starts with `word =` (or `["word"] =`), after blanks. */
static bool assigns(const char *line, const char *word)
{
    line += strspn(line, " \t");
    size_t n = strlen(word);
    if (strncmp(line, "[\"", 2) == 0 && strncmp(line + 2, word, n) == 0 && line[n + 2] == '"' &&
        line[n + 3] == ']')
        line += n + 4;
    else if (strncmp(line, word, n) == 0)
        line += n;
    else
        return false;
    line += strspn(line, " \t");
    return line[0] == '=' && line[1] != '=';
}

/*
** Lua reports the line an assignment ends on; for a sink's error the line of its own
** `name = {` inside the `sinks` table is more use. Looks for it in path between the
** `sinks =` line and end; falls back to end.
*/
static int entry_line(const char *path, int end, const char *name)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return end;
    char line[512];
    int no = 0, found = 0;
    bool in_sinks = false;
    while (no < end && fgets(line, sizeof(line), f)) {
        no++;
        if (assigns(line, "sinks")) {
            in_sinks = true;
            found = 0;
        } else if (in_sinks && !found && assigns(line, name)) {
            found = no;
        }
    }
    fclose(f);
    return found ? found : end;
}

static void free_all(void)
{
    for (unsigned i = 0; i < g_nsinks; i++)
        sink_free(g_sinks[i]);
    g_nsinks = 0;
}

/*
** Checks every section of conf and makes its enabled sinks (not started) into
** g_sinks, which must be empty. On error err names the file, line and sink, and
** g_sinks is left empty.
*/
static int make_all(const rt_conf_t *conf, char *err, size_t errlen)
{
    RT_ASSERT(g_nsinks == 0);
    rt_bson_mem_init(); /* before the drivers make anything */
    const rt_conf_sections_t *secs = &conf->sinks;
    for (unsigned i = 0; i < secs->n; i++) {
        char why[RT_CONF_ERR_LEN / 2];
        rt_sink_t *s = NULL;
        int rc = make_sink(conf, &secs->s[i], &s, why, sizeof(why));
        if (rc) {
            if (secs->line > 0)
                snprintf(err, errlen, "%s:%d: sinks.%s: %s", secs->where,
                         entry_line(secs->where, secs->line, secs->s[i].name), secs->s[i].name,
                         why);
            else
                snprintf(err, errlen, "%s: sinks.%s: %s", secs->where[0] ? secs->where : "config",
                         secs->s[i].name, why);
            free_all();
            return rc;
        }
        if (s)
            g_sinks[g_nsinks++] = s;
    }
    return 0;
}

int rt_sinks_check(const rt_conf_t *conf, char *err, size_t errlen)
{
    if (atomic_load(&g_running)) {
        snprintf(err, errlen, "sinks are already running");
        return RT_EEXIST;
    }
    free_all(); /* a previous, stopped set */
    int rc = make_all(conf, err, errlen);
    free_all();
    return rc;
}

bool rt_sinks_enabled(const rt_conf_t *conf, const char *name)
{
    for (unsigned i = 0; i < conf->sinks.n; i++) {
        const rt_conf_section_t *sec = &conf->sinks.s[i];
        const rt_conf_kv_t *en = rt__sink_kv(sec, "enabled");
        if (strcmp(sec->name, name) == 0)
            return !en || en->b;
    }
    return false;
}

int rt_sinks_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen)
{
    if (atomic_load(&g_running)) {
        snprintf(err, errlen, "sinks are already running");
        return RT_EEXIST;
    }
    free_all(); /* a previous, stopped set */
    int rc = make_all(conf, err, errlen);
    if (rc)
        return rc;
    bool spills = false;
    for (unsigned i = 0; i < g_nsinks; i++)
        spills |= g_sinks[i]->drv->spills;
    if (spills && mkdir(conf->data_dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "data_dir %s: cannot create: %s", conf->data_dir, strerror(errno));
        free_all();
        return RT_EINVAL;
    }
    g_sup = sup;
    rt_pid_t group;
    rc = rt_group_start(sup, RT_SINKS_GROUP, RT_PERMANENT, &group);
    if (rc) {
        snprintf(err, errlen, "sinks: cannot start their supervisor: %s", rt_strerror(rc));
        free_all();
        return rc;
    }
    for (unsigned i = 0; i < g_nsinks; i++) {
        rt_sink_t *s = g_sinks[i];
        if ((rc = rt__sink_start(group, s))) {
            snprintf(err, errlen, "sinks.%s: cannot start: %s", s->name, rt_strerror(rc));
            /* Stop the ones already running, then free them all. */
            unsigned all = g_nsinks;
            g_nsinks = i;
            atomic_store(&g_running, true);
            rt_sinks_stop();
            g_nsinks = all;
            free_all();
            return rc;
        }
        rt_sink_keeps_t keeps = {0};
        if (s->drv->retention)
            s->drv->retention(s, NULL, 0, &keeps);
        rt_log(RT_LOG_INFO, "sink.started",
               "sink=%s type=%s batch=%u flush_ms=%u retention_max_rows=%llu "
               "retention_max_age_s=%llu retention_max_bytes=%llu",
               s->name, s->drv->type, s->batch, s->flush_ms, (unsigned long long)keeps.max_rows,
               (unsigned long long)keeps.max_age_s, (unsigned long long)keeps.max_bytes);
    }
    atomic_store(&g_running, true);
    return 0;
}

void rt_sinks_stop(void)
{
    RT_ASSERT(!rt_current()); /* it waits for the sink actors to exit */
    if (!atomic_exchange(&g_running, false))
        return;
    for (unsigned i = 0; i < g_nsinks; i++)
        rt__sink_close(g_sinks[i]);
    /* Each sink handles what it was sent, then writes or spills what it holds. */
    rt_group_stop(g_sup, RT_SINKS_GROUP);
    for (unsigned i = 0; i < g_nsinks; i++) {
        rt_sink_t *s = g_sinks[i];
        rt_log(RT_LOG_INFO, "sink.stopped",
               "sink=%s in=%llu written=%llu spilled=%llu dropped=%llu expired=%llu", s->name,
               (unsigned long long)atomic_load(&s->in),
               (unsigned long long)atomic_load(&s->written),
               (unsigned long long)atomic_load(&s->spilled),
               (unsigned long long)atomic_load(&s->dropped),
               (unsigned long long)atomic_load(&s->expired));
    }
}

int rt_sink_describe(const rt_conf_t *conf, const rt_conf_section_t *sec, char *out, size_t n)
{
    rt_bson_mem_init(); /* configure may make BSON (the republish templates) */
    rt_sink_t *s = NULL;
    char why[RT_CONF_ERR_LEN / 2];
    int rc = make_sink(conf, sec, &s, why, sizeof(why));
    if (rc) {
        snprintf(out, n, "%s", why);
        return rc;
    }
    if (!s) {
        snprintf(out, n, "disabled (checked, not started)");
        return 0;
    }
    if (s->drv->retention)
        s->drv->retention(s, out, n, NULL);
    else if (s->drv->spills)
        snprintf(out, n, "rtd deletes nothing: the database keeps what it is given");
    else
        snprintf(out, n, "keeps nothing: rows are passed on");
    sink_free(s);
    return 0;
}

void rt_sinks_free(void)
{
    if (atomic_load(&g_running))
        return;
    free_all();
}

rt_sink_t *rt_sink_find(const char *name)
{
    if (!atomic_load(&g_running) || !name)
        return NULL;
    for (unsigned i = 0; i < g_nsinks; i++)
        if (strcmp(g_sinks[i]->name, name) == 0)
            return g_sinks[i];
    return NULL;
}

size_t rt_sinks_files(rt_sink_files_t *out, size_t max)
{
    if (!atomic_load(&g_running))
        return 0;
    for (unsigned i = 0; i < g_nsinks && i < max; i++) {
        const rt_sink_t *s = g_sinks[i];
        snprintf(out[i].name, sizeof(out[i].name), "%s", s->name);
        snprintf(out[i].db, sizeof(out[i].db), "%s", s->drv->file ? s->drv->file(s) : "");
        snprintf(out[i].spill, sizeof(out[i].spill), "%s", s->drv->spills ? s->spill_path : "");
    }
    return g_nsinks;
}

size_t rt_sinks_snapshot(rt_sink_info_t *out, size_t max)
{
    for (unsigned i = 0; i < g_nsinks && i < max; i++) {
        rt_sink_t *s = g_sinks[i];
        rt_sink_info_t *o = &out[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", s->name);
        o->type = s->drv->type;
        o->state = rt__sink_state_name(atomic_load(&s->state));
        o->in = atomic_load(&s->in);
        o->recovered = atomic_load(&s->recovered);
        o->queued = atomic_load(&s->queued);
        o->inflight = atomic_load(&s->inflight);
        o->written = atomic_load(&s->written);
        o->failed = atomic_load(&s->failed);
        o->retried = atomic_load(&s->retried);
        o->spilled = atomic_load(&s->spilled);
        o->dropped = atomic_load(&s->dropped);
        o->batches = atomic_load(&s->batches);
        o->expired = atomic_load(&s->expired);
        if (s->drv->retention)
            s->drv->retention(s, o->retention, sizeof(o->retention), NULL);
        o->bytes = atomic_load(&s->bytes);
        rt_hist_snapshot(&s->write_hist, &o->write_seconds);
        pthread_mutex_lock(&s->err_lock);
        snprintf(o->last_error, sizeof(o->last_error), "%s", s->last_error);
        pthread_mutex_unlock(&s->err_lock);
    }
    return g_nsinks;
}

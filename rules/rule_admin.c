/*
** What the operator asks of a running rule engine (rule_engine.h): switch a rule on or
** off, read the rules' and workers' metrics and the set's size, and try a rule on a
** sample message.
*/
#include <bson/bson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rule_internal.h"

int rt_rules_enable(const char *name, bool on)
{
    /* The read lock is held throughout, so a reload installs either before (this finds the
       new set) or after (the install sees the override). */
    rt_rule_set_t *s = rt__rules_lock_current();
    rt_rule_t *r = s ? rt__rule_set_find(s, name) : NULL;
    int rc = r ? 0 : RT_ENOTFOUND;
    if (r && on && r->missing_sink[0]) {
        rc = RT_EINVAL;
    } else if (r) {
        atomic_store(&r->m->override, on == r->file_enabled ? -1 : (int)on);
        atomic_store(&r->enabled, on);
    }
    if (s)
        rt__rules_unlock();
    return rc;
}

size_t rt_rules_snapshot(rt_rule_info_t *out, size_t max)
{
    rt_rule_set_t *s = rt__rules_current();
    if (!s)
        return 0;
    for (uint32_t i = 0; i < s->nrules && i < max; i++) {
        rt_rule_t *r = &s->rules[i];
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
    rt__rule_set_release(s);
    return n;
}

/* These read the workers' Lua states, which a restarted worker replaces under the write lock. */
size_t rt_rules_workers(rt_rules_worker_info_t *out, size_t max)
{
    rt_rule_set_t *s = rt__rules_lock_current();
    if (!s)
        return 0;
    for (unsigned i = 0; i < rt__rules.nworkers && i < max; i++) {
        rt_rule_worker_stats_t *st = &rt__rules.workers[i];
        out[i] = (rt_rules_worker_info_t){
            .pid = atomic_load(&st->pid),
            .messages = atomic_load(&st->messages),
            .batches = atomic_load(&st->batches),
            .lua_bytes = i < s->nvms ? rt_rule_vm_bytes(s->vms[i]) : 0,
            .c_bytes = atomic_load(&st->c_bytes),
            .pending_durable = atomic_load(&st->pending_durable),
        };
    }
    size_t n = rt__rules.nworkers;
    rt__rules_unlock();
    return n;
}

void rt_rules_lua_memory(uint64_t *all, uint64_t *in_workers)
{
    *all = *in_workers = 0;
    /* The workers' counters stay while a set is current (stop frees them after). */
    if (!rt__rules_lock_current())
        return;
    for (unsigned i = 0; i < rt__rules.nworkers; i++)
        *in_workers += atomic_load(&rt__rules.workers[i].lua_bytes);
    *all = rt__rule_sets_lua_bytes();
    rt__rules_unlock();
}

int rt_rules_stats(rt_rules_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    rt_rule_set_t *s = rt__rules_lock_current();
    if (!s)
        return RT_ESHUTDOWN;
    out->version = s->version;
    out->rules = s->nrules;
    out->workers = s->nvms;
    out->index_bytes = rt_rule_index_bytes(s->topics) + sizeof(*s) + s->nrules * sizeof(rt_rule_t) +
                       s->ntargets * sizeof(rt_rule_target_t) + s->nvms * sizeof(*s->vms);
    for (int k = 0; k < RT_RULE_NEVENTS; k++)
        out->index_bytes += s->nevents[k] * sizeof(uint32_t);
    for (uint32_t i = 0; i < s->nrules; i++)
        out->text_bytes += s->rules[i].len + 1 + strlen(s->rules[i].path) + 1;
    for (unsigned i = 0; i < s->nvms; i++)
        out->lua_bytes += rt_rule_vm_bytes(s->vms[i]);
    rt__rules_unlock();
    return 0;
}

/* Renders the BSON documents in rows as a JSON array (relaxed extended JSON). */
static char *rows_json(const rt_buf_t *rows, uint32_t nrows)
{
    rt_buf_t out = {0};
    bool ok = true;
    rt_buf_add(&out, "[", 1);
    const uint8_t *p = (const uint8_t *)rows->data;
    for (uint32_t i = 0; i < nrows && ok; i++) {
        int32_t len;
        memcpy(&len, p, 4);
        bson_t doc;
        size_t jl = 0;
        char *j = bson_init_static(&doc, p, (size_t)len) ? bson_as_relaxed_extended_json(&doc, &jl)
                                                         : NULL;
        ok = j != NULL;
        if (ok && i)
            rt_buf_add(&out, ",", 1);
        if (ok)
            rt_buf_add(&out, j, jl);
        bson_free(j);
        p += len;
    }
    rt_buf_add(&out, "]", 1);
    if (!ok || out.oom) {
        rt_buf_free(&out);
        return NULL;
    }
    return out.data;
}

int rt_rules_test_input(const char *name, const rt_rule_input_t *in, char **json_out, char *err,
                        size_t errlen)
{
    *json_out = NULL;
    rt_rule_set_t *s = rt__rules_current();
    if (!s) {
        snprintf(err, errlen, "the rule engine is not running");
        return RT_ESHUTDOWN;
    }
    rt_rule_t *r = rt__rule_set_find(s, name);
    if (!r) {
        rt__rule_set_release(s);
        snprintf(err, errlen, "no rule named \"%s\"", name);
        return RT_ENOTFOUND;
    }
    rt_rule_vm_t *vm;
    rt_rule_spec_t spec;
    int rc = rt__rule_vm_configured(&vm);
    if (rc) {
        rt__rule_set_release(s);
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    if ((rc = rt_rule_vm_load(vm, r->path, r->text, r->len, &spec, err, errlen)) == 0) {
        rt_rule_spec_free(&spec);
        rt_buf_t rows = {0};
        uint32_t nrows = 0;
        rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, in, &rows, &nrows, err, errlen);
        if (o == RT_RULE_PASSED || o == RT_RULE_FILTERED) {
            if (!(*json_out = rows_json(&rows, nrows))) {
                snprintf(err, errlen, "out of memory");
                rc = RT_ENOMEM;
            }
        } else {
            rc = RT_EINVAL;
        }
        rt_buf_free(&rows);
    }
    rt_rule_vm_free(vm);
    rt__rule_set_release(s);
    return rc;
}

int rt_rules_test(const char *name, const char *topic, const void *payload, size_t len, int qos,
                  char **json_out, char *err, size_t errlen)
{
    rt_rule_input_t in = {
        .topic = topic,
        .topic_len = strlen(topic),
        .payload = payload ? payload : (const uint8_t *)"",
        .payload_len = len,
        .qos = qos,
        .retain = 0,
        .clientid = "rt_rules_test",
        .peer = "127.0.0.1:0",
        .reason_code = -1,
        .proto_ver = -1,
        .keepalive = -1,
        .clean_start = -1,
        .ts_ms = rt_wall_ms(),
    };
    return rt_rules_test_input(name, &in, json_out, err, errlen);
}

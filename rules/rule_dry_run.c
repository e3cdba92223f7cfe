/*
** The load-time dry run of a rule (rt_rule_vm_dry_run): the rule on its file's sample, or
** on a made-up message or event for its first from entry.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rule_vm_internal.h"

static const char *opt_field(lua_State *L, int t, const char *k, size_t *n)
{
    lua_getfield(L, t, k);
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, n) : NULL;
    lua_pop(L, 1); /* the string stays alive: it is referenced by the sample table */
    return s;
}

int rt_rule_vm_dry_run(rt_rule_vm_t *vm, uint32_t idx, char *err, size_t errlen)
{
    RT_ASSERT(idx < vm->nrules);
    lua_State *L = vm->L;
    const rt_rule_file_t *f = &vm->files[idx];
    RT_ASSERT(lua_gettop(L) == 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_rawgeti(L, 1, (lua_Integer)idx + 1); /* 2: the rule table */
    lua_getfield(L, 2, "from");
    if (lua_type(L, -1) == LUA_TTABLE)
        lua_rawgeti(L, -1, 1);
    const char *from = lua_tostring(L, -1); /* 3 or 4 */
    lua_getfield(L, 2, "sample");
    int sample = lua_type(L, -1) == LUA_TTABLE ? lua_gettop(L) : 0;
    bool sample_given = sample != 0;

    rt_rule_input_t in = {.qos = 1,
                          .retain = 0,
                          .clientid = "sample-client",
                          .username = "sample-user",
                          .peer = "127.0.0.1:50000",
                          .reason_code = -1,
                          .proto_ver = -1,
                          .keepalive = -1,
                          .clean_start = -1};
    in.ts_ms = 1700000000000ull;
    char topic[512];
    int ev = rt_rule_event_kind(from);
    if (ev) {
        in.event = from;
        in.qos = -1;
        in.retain = -1;
        if (ev == 1) {
            in.proto_ver = 5, in.keepalive = 60, in.clean_start = 1;
        } else if (ev == 2) {
            in.reason_code = 0, in.reason = "normal";
        } else if (ev == 8 || ev == 9) { /* xmpp.message, xmpp.presence */
            bool m = ev == 8;
            in.protocol = "xmpp";
            in.clientid = "juliet@example.com/balcony", in.username = "juliet@example.com";
            in.from = in.clientid;
            in.to = m ? "romeo@example.net" : NULL;
            in.type = m ? "chat" : "available";
            in.payload = (const uint8_t *)(m ? "Art thou not Romeo?" : "on the balcony");
            in.payload_len = strlen((const char *)in.payload);
        } else if (ev == 3 || ev == 4) {
            in.topic = "sample/topic", in.topic_len = 12, in.qos = ev == 3 ? 1 : -1;
        } else {
            in.topic = "sample/topic", in.topic_len = 12, in.qos = 1, in.retain = 0;
            in.payload = (const uint8_t *)"{}", in.payload_len = 2;
            in.from_clientid = "sample-publisher";
            if (ev == 7)
                in.reason = "queue_full";
        }
    } else {
        /* A topic the first filter matches: each wildcard level becomes "sample". */
        size_t k = 0, n = strlen(from);
        for (size_t i = 0; i < n && k + 8 < sizeof(topic); i++)
            if (from[i] == '+' || from[i] == '#')
                k += (size_t)snprintf(topic + k, sizeof(topic) - k, "sample");
            else
                topic[k++] = from[i];
        topic[k] = 0;
        in.topic = topic;
        in.topic_len = k;
        in.payload = (const uint8_t *)"{}";
        in.payload_len = 2;
    }
    if (sample) {
        size_t n;
        const char *s;
        if ((s = opt_field(L, sample, "topic", &n)))
            in.topic = s, in.topic_len = n;
        if ((s = opt_field(L, sample, "payload", &n)))
            in.payload = (const uint8_t *)s, in.payload_len = n;
        if ((s = opt_field(L, sample, "clientid", &n)))
            in.clientid = s;
        if ((s = opt_field(L, sample, "username", &n)))
            in.username = s;
        lua_getfield(L, sample, "qos");
        if (lua_isinteger(L, -1))
            in.qos = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    /* The strings above live in the rule and sample tables, which the registry keeps. */
    lua_settop(L, 0);
    rt_buf_t out = {0};
    uint32_t nrows;
    char why[400];
    vm->line_of = f->path;
    vm->err_line = 0;
    rt_rule_outcome_t r = rt_rule_vm_run(vm, idx, &in, &out, &nrows, why, sizeof(why));
    vm->line_of = NULL;
    rt_buf_free(&out);
    /* A made-up message may not fit what the rule expects (a missing JSON field): a Lua
       error on it is the rule's business. Runaways, memory bombs and rows that cannot be
       stored are not; with the file's own sample every failure counts. */
    if (r == RT_RULE_PASSED || r == RT_RULE_FILTERED ||
        (!sample_given && r == RT_RULE_FAIL_EXCEPTION && !vm->row_error))
        return 0;
    /* "path:line: ...": the position Lua gave the message if it is in this file, else the
       line the rule's code was running, else its select (rows that cannot be stored). */
    const char *reason = why;
    int line = 0;
    const char *rest = rt__rule_after_path(why, f->path);
    if (rest && rest[1] >= '0' && rest[1] <= '9') {
        char *end;
        line = (int)strtol(rest + 1, &end, 10);
        reason = *end == ':' ? end + 1 + (end[1] == ' ') : why;
    }
    if (!line)
        line = vm->err_line;
    if (!line)
        line = rt_rule_field_line(f->text, f->len, "select");
    snprintf(err, errlen, "%s:%d: dry run on %s %s failed: %s", f->path, line,
             sample_given ? "its sample" : "a made-up", ev ? "event" : "message", reason);
    return RT_EINVAL;
}

/*
** Loading a rule file into a rule Lua state: running its chunk in an environment of its
** own and checking the table it returns (rule_engine.h describes the fields), with errors
** that name the file and line.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "rule_vm_internal.h"
#include "topic.h"

int rt_rule_field_line(const char *text, size_t len, const char *field)
{
    size_t fl = strlen(field);
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\n') {
            line++;
            continue;
        }
        if (i + fl > len || memcmp(text + i, field, fl) != 0)
            continue;
        bool left = i == 0 || !(text[i - 1] == '_' || text[i - 1] == '.' ||
                                (text[i - 1] >= 'a' && text[i - 1] <= 'z') ||
                                (text[i - 1] >= 'A' && text[i - 1] <= 'Z') ||
                                (text[i - 1] >= '0' && text[i - 1] <= '9'));
        size_t j = i + fl;
        while (j < len && (text[j] == ' ' || text[j] == '\t'))
            j++;
        if (left && j < len && text[j] == '=' && (j + 1 >= len || text[j + 1] != '='))
            return line;
    }
    return 0;
}

/*
** The line of the file's last `return` that starts a line (the rule table's own, in a file
** written the usual way), or 1: where an error about a field the table lacks points.
*/
static int return_line(const char *text, size_t len)
{
    int line = 1, found = 1;
    for (size_t i = 0; i < len; i++) {
        bool start = i == 0 || text[i - 1] == '\n';
        if (start && i + 6 <= len && memcmp(text + i, "return", 6) == 0 &&
            (i + 6 == len || !(text[i + 6] == '_' || (text[i + 6] >= 'a' && text[i + 6] <= 'z') ||
                               (text[i + 6] >= 'A' && text[i + 6] <= 'Z') ||
                               (text[i + 6] >= '0' && text[i + 6] <= '9'))))
            found = line;
        if (text[i] == '\n')
            line++;
    }
    return found;
}

/* Writes "path:line: " and the reason; the line of `field =`, or of the table's return. */
static int field_error(const rt_rule_file_t *f, const char *field, char *err, size_t errlen,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int field_error(const rt_rule_file_t *f, const char *field, char *err, size_t errlen,
                       const char *fmt, ...)
{
    int line = field ? rt_rule_field_line(f->text, f->len, field) : 0;
    if (!line)
        line = return_line(f->text, f->len);
    int n = snprintf(err, errlen, "%s:%d: ", f->path, line);
    if (n < 0 || (size_t)n >= errlen)
        return RT_EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return RT_EINVAL;
}

static bool valid_name(const char *s, size_t n)
{
    if (n == 0 || n >= RT_RULE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Parses one `from` entry at the top of the stack into spec. */
static int parse_from_entry(lua_State *L, const rt_rule_file_t *f, rt_rule_spec_t *spec, char *err,
                            size_t errlen)
{
    if (lua_type(L, -1) != LUA_TSTRING)
        return field_error(f, "from", err, errlen, "from: entries must be strings (got a %s)",
                           luaL_typename(L, -1));
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (!rt_rule_event_kind(s)) {
        /* A dotted name under an event prefix is a mistyped event, not a topic. */
        if (!strchr(s, '/') && (strncmp(s, "client.", 7) == 0 || strncmp(s, "session.", 8) == 0 ||
                                strncmp(s, "message.", 8) == 0))
            return field_error(f, "from", err, errlen, "from: \"%s\" is not an event (%s)", s,
                               "client.connected, client.disconnected, session.subscribed, "
                               "session.unsubscribed, message.delivered, message.acked, "
                               "message.dropped");
        rt_topic_filter_t sf;
        if (rt_topic_parse_filter(s, n, &sf))
            return field_error(f, "from", err, errlen,
                               "from: \"%s\" is neither a topic filter nor an event (%s)", s,
                               "client.connected, client.disconnected, session.subscribed, "
                               "session.unsubscribed, message.delivered, message.acked, "
                               "message.dropped");
        if (sf.group)
            return field_error(f, "from", err, errlen,
                               "from: \"%s\": shared subscriptions mean nothing to a rule", s);
    }
    if (spec->nfrom == RT_RULE_MAX_FROM)
        return field_error(f, "from", err, errlen, "from: at most %d entries", RT_RULE_MAX_FROM);
    spec->from[spec->nfrom] = strdup(s);
    if (!spec->from[spec->nfrom])
        return RT_ENOMEM;
    spec->nfrom++;
    return 0;
}

static int add_to(lua_State *L, const rt_rule_file_t *f, rt_rule_spec_t *spec, const char *sink,
                  int opts_idx, char *err, size_t errlen)
{
    if (spec->nto == RT_RULE_MAX_TO)
        return field_error(f, "to", err, errlen, "to: at most %d sinks", RT_RULE_MAX_TO);
    if (!valid_name(sink, strlen(sink)))
        return field_error(f, "to", err, errlen, "to: \"%s\" is not a sink name", sink);
    for (size_t i = 0; i < spec->nto; i++)
        if (strcmp(spec->to[i].sink, sink) == 0)
            return field_error(f, "to", err, errlen, "to: sink \"%s\" named twice", sink);
    rt_rule_to_t *t = &spec->to[spec->nto];
    t->sink = strdup(sink);
    if (!t->sink)
        return RT_ENOMEM;
    spec->nto++;
    if (opts_idx == 0)
        return 0;
    rt_rule_vm_t *vm = RT_RULE_VM(L);
    char why[256] = "";
    vm->out_left = vm->max_bytes;
    bson_reinit(vm->row);
    if (!rt__rule_bson_table(L, opts_idx, vm->row, false, 0, why, sizeof(why)))
        return field_error(f, "to", err, errlen, "to.%s: %s", sink, why[0] ? why : "too large");
    t->opts = malloc(vm->row->len);
    if (!t->opts)
        return RT_ENOMEM;
    memcpy(t->opts, bson_get_data(vm->row), vm->row->len);
    t->opts_len = vm->row->len;
    return 0;
}

/* Checks the rule table at the top of the stack and fills spec. */
static int parse_spec(lua_State *L, const rt_rule_file_t *f, rt_rule_spec_t *spec, char *err,
                      size_t errlen)
{
    static const char *const known[] = {"name",    "from",        "to",     "select", "enabled",
                                        "durable", "description", "sample", NULL};
    int t = lua_gettop(L);
    if (lua_type(L, t) != LUA_TTABLE)
        return field_error(f, NULL, err, errlen,
                           "a rule file must return a table (name, from, select, to)");
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        bool ok = false;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (const char *const *k = known; *k && !ok; k++)
                ok = strcmp(*k, lua_tostring(L, -1)) == 0;
        if (!ok) {
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
            return field_error(f, k, err, errlen,
                               "unknown field \"%s\" (a rule has name, from, select, to, "
                               "enabled, durable, description, sample)",
                               k);
        }
    }
    /* name */
    size_t n;
    lua_getfield(L, t, "name");
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
    if (!name || !valid_name(name, n))
        return field_error(f, "name", err, errlen,
                           "name must be 1-%d characters of A-Z a-z 0-9 _ - .",
                           RT_RULE_NAME_MAX - 1);
    memcpy(spec->name, name, n + 1);
    lua_pop(L, 1);
    /* from */
    int rc;
    lua_getfield(L, t, "from");
    if (lua_type(L, -1) == LUA_TSTRING) {
        if ((rc = parse_from_entry(L, f, spec, err, errlen)))
            return rc;
    } else if (lua_type(L, -1) == LUA_TTABLE) {
        lua_Integer len = rt__rule_array_len(L, lua_gettop(L));
        if (len == 0)
            return field_error(f, "from", err, errlen,
                               "from must be a topic filter, an event name or a list of them");
        for (lua_Integer i = 1; i <= len; i++) {
            lua_rawgeti(L, -1, i);
            if ((rc = parse_from_entry(L, f, spec, err, errlen)))
                return rc;
            lua_pop(L, 1);
        }
    } else {
        return field_error(f, "from", err, errlen,
                           "from is required: a topic filter, an event name or a list of them");
    }
    lua_pop(L, 1);
    /* select */
    lua_getfield(L, t, "select");
    if (lua_type(L, -1) != LUA_TFUNCTION)
        return field_error(f, "select", err, errlen,
                           "select must be a function(msg, ctx) returning nil, a row or a list "
                           "of rows");
    lua_pop(L, 1);
    /* to: { "sink", sink = { options } } */
    lua_getfield(L, t, "to");
    int to = lua_gettop(L);
    if (lua_type(L, to) == LUA_TSTRING) {
        if ((rc = add_to(L, f, spec, lua_tostring(L, to), 0, err, errlen)))
            return rc;
    } else if (lua_type(L, to) == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, to)) {
            int kt = lua_type(L, -2), vt = lua_type(L, -1);
            if (kt == LUA_TNUMBER && vt == LUA_TSTRING)
                rc = add_to(L, f, spec, lua_tostring(L, -1), 0, err, errlen);
            else if (kt == LUA_TSTRING && vt == LUA_TTABLE)
                rc = add_to(L, f, spec, lua_tostring(L, -2), lua_gettop(L), err, errlen);
            else if (kt == LUA_TSTRING && vt == LUA_TBOOLEAN && lua_toboolean(L, -1))
                rc = add_to(L, f, spec, lua_tostring(L, -2), 0, err, errlen);
            else
                rc = field_error(f, "to", err, errlen,
                                 "to: entries are sink names, or name = { options }");
            if (rc)
                return rc;
            lua_pop(L, 1);
        }
    } else if (lua_type(L, to) != LUA_TNIL) {
        return field_error(f, "to", err, errlen,
                           "to must be a sink name or a list { \"sink\", sink = { options } }");
    }
    lua_pop(L, 1);
    /* flags */
    static const char *const flags[] = {"enabled", "durable"};
    for (int i = 0; i < 2; i++) {
        int ty = lua_getfield(L, t, flags[i]);
        if (ty != LUA_TNIL && ty != LUA_TBOOLEAN)
            return field_error(f, flags[i], err, errlen, "%s must be true or false", flags[i]);
        bool v = ty == LUA_TNIL ? i == 0 : lua_toboolean(L, -1);
        if (i == 0)
            spec->enabled = v;
        else
            spec->durable = v;
        lua_pop(L, 1);
    }
    int ty = lua_getfield(L, t, "sample");
    if (ty != LUA_TNIL && ty != LUA_TTABLE)
        return field_error(f, "sample", err, errlen,
                           "sample must be a table { topic =, payload =, qos = }");
    lua_pop(L, 1);
    return 0;
}

const char *rt__rule_after_path(const char *e, const char *path)
{
    size_t pl = strlen(path);
    if (strncmp(e, path, pl) == 0 && e[pl] == ':')
        return e + pl;
    if (strncmp(e, "...", 3) != 0)
        return NULL;
    for (const char *c = e + 3; *c; c++) {
        size_t k = (size_t)(c - (e + 3));
        if (*c == ':' && k <= pl && memcmp(path + pl - k, e + 3, k) == 0)
            return c;
    }
    return NULL;
}

/* The load error on top of the stack as "path:line: reason", with the whole path. */
static void load_error(lua_State *L, const rt_rule_file_t *f, char *err, size_t errlen)
{
    const char *e = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "error (not a string)";
    const char *rest = rt__rule_after_path(e, f->path);
    if (rest)
        snprintf(err, errlen, "%s%s", f->path, rest);
    else
        snprintf(err, errlen, "%s: %s", f->path, e);
}

int rt__rule_file_run(rt_rule_vm_t *vm, uint32_t idx, rt_rule_spec_t *spec, char *err,
                      size_t errlen)
{
    RT_ASSERT(idx <= vm->nrules && idx < vm->capfiles);
    lua_State *L = vm->L;
    const rt_rule_file_t *f = &vm->files[idx];
    int top = lua_gettop(L);
    char chunk[300];
    snprintf(chunk, sizeof(chunk), "@%s", f->path);
    vm->budget_hit = vm->oom = false;
    vm->steps = 0;
    if (luaL_loadbufferx(L, f->text, f->len, chunk, "t") != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_EINVAL;
    }
    /* The rule's environment: its own table, reading through to the base. */
    lua_newtable(L);
    lua_createtable(L, 0, 2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->base_ref);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, -2, "_G");
    int status = rt__rule_sandbox_own_math(L);
    if (status != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_ENOMEM;
    }
    lua_setupvalue(L, -2, 1);
    rt__rule_vm_arm(vm);
    status = lua_pcall(L, 0, 1, 0);
    rt__rule_vm_disarm(vm);
    if (status != LUA_OK) {
        load_error(L, f, err, errlen);
        lua_settop(L, top);
        return RT_EINVAL;
    }
    rt_rule_spec_t local;
    memset(&local, 0, sizeof(local));
    rt_rule_spec_t *s = spec ? spec : &local;
    int rc = parse_spec(L, f, s, err, errlen);
    if (rc == RT_ENOMEM)
        snprintf(err, errlen, "%s: out of memory", f->path);
    if (rc == 0 && f->name[0] && strcmp(f->name, s->name) != 0)
        rc = field_error(f, "name", err, errlen, "name changed while reloading");
    if (!spec)
        rt_rule_spec_free(&local);
    if (rc) {
        lua_settop(L, top);
        return rc;
    }
    int rule = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_pushvalue(L, rule);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    lua_getfield(L, rule, "select");
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->ctxs_ref);
    lua_createtable(L, 0, 1);
    lua_getfield(L, rule, "name");
    lua_setfield(L, -2, "rule");
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_settop(L, top);
    return 0;
}

int rt_rule_vm_load(rt_rule_vm_t *vm, const char *path, const char *text, size_t len,
                    rt_rule_spec_t *spec, char *err, size_t errlen)
{
    memset(spec, 0, sizeof(*spec));
    if (rt_grow(&vm->files, &vm->capfiles, vm->nrules + 1, sizeof(rt_rule_file_t), 16)) {
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    rt__rule_vm_enter(vm);
    rt_rule_file_t *f = &vm->files[vm->nrules];
    *f = (rt_rule_file_t){.path = path, .text = text, .len = len};
    int rc = rt__rule_file_run(vm, vm->nrules, spec, err, errlen);
    if (rc) {
        rt_rule_spec_free(spec);
    } else {
        snprintf(f->name, sizeof(f->name), "%s", spec->name);
        vm->nrules++;
    }
    rt__rule_vm_leave(vm);
    return rc;
}

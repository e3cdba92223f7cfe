/*
** The rtd.conf loader: runs the file's Lua in an empty, budgeted state, records where each
** key was assigned, and checks every value against the one table of settings (names, kinds,
** ranges, help) into an rt_conf_t; overrides go through the same checks (config.h).
*/
#include <arpa/inet.h>
#include <limits.h>
#include <pthread.h>
#include <errno.h>
#include <stdlib.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "config_schema.h"

#define RT_CONF_INSTRUCTION_LIMIT 10000000 /* a config file that runs longer is a bug */
#define RT_CONF_MEMORY_LIMIT (64u << 20)   /* and so is one that builds more (s = s .. s) */

/* What the config's Lua state holds, and how much its chunk may make it hold. */
typedef struct conf_mem_s {
    size_t used, limit;
} conf_mem_t;

/* Lua's allocator with that limit: a runaway config gets "not enough memory". */
static void *conf_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    conf_mem_t *m = ud;
    if (!ptr)
        osize = 0; /* then osize is the kind of object */
    if (nsize == 0) {
        free(ptr);
        m->used -= osize;
        return NULL;
    }
    if (nsize > osize && nsize - osize > m->limit - m->used)
        return NULL;
    void *p = realloc(ptr, nsize);
    if (p)
        m->used = m->used - osize + nsize;
    return p;
}

/* An error outside a protected call is a bug in the loader: say what it was before Lua aborts. */
static int conf_panic(lua_State *L)
{
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "rtd: config loader: unprotected Lua error: %s\n", msg ? msg : "?");
    return 0;
}

static lua_State *new_state(conf_mem_t *m)
{
    *m = (conf_mem_t){0, RT_CONF_MEMORY_LIMIT};
    lua_State *L = lua_newstate(conf_alloc, m);
    if (L)
        lua_atpanic(L, conf_panic);
    return L;
}

/* What the loader does with a setting: its schema type, or the composite it is. */
typedef enum {
    K_INT,
    K_DOUBLE,
    K_BOOL,
    K_STRING,
    K_PATH, /* a K_STRING naming a file or directory, made absolute at load (config.h) */
    K_LISTENERS,
    K_NETS,
    K_SECTIONS,
    K_USER_RATES,
    K_BRIDGES,
    K_TENANTS,
    K_AUTO_SUBS,
    K_REWRITES,
    K_AUTH,
    K_HTTP,
    K_CLUSTER,
    K_XMPP
} kind_t;

typedef rt_setting_t setting_t;

static kind_t kind_of(const setting_t *s)
{
    switch (s->type) {
    case RT_SET_INT:
        return K_INT;
    case RT_SET_NUMBER:
        return K_DOUBLE;
    case RT_SET_BOOL:
        return K_BOOL;
    case RT_SET_PATH:
        return K_PATH;
    case RT_SET_NETS:
        return K_NETS;
    case RT_SET_LIST:
        return K_LISTENERS;
    default:
        break;
    }
    if (strcmp(s->name, "http") == 0)
        return K_HTTP;
    if (strcmp(s->name, "cluster") == 0)
        return K_CLUSTER;
    if (strcmp(s->name, "xmpp") == 0)
        return K_XMPP;
    if (strcmp(s->name, "user_rate_limits") == 0)
        return K_USER_RATES;
    if (strcmp(s->name, "bridges") == 0)
        return K_BRIDGES;
    if (strcmp(s->name, "tenants") == 0)
        return K_TENANTS;
    if (strcmp(s->name, "auto_subscribe") == 0)
        return K_AUTO_SUBS;
    if (strcmp(s->name, "rewrite") == 0)
        return K_REWRITES;
    if (strcmp(s->name, "auth") == 0)
        return K_AUTH;
    if (strcmp(s->name, "sinks") == 0)
        return K_SECTIONS;
    return K_STRING;
}

#define settings rt__conf_settings
#define NSETTINGS rt__conf_nsettings()

const rt_conf_net_t rt_conf_loopback[RT_CONF_NLOOPBACK] = {
    {.addr = {[10] = 0xff, [11] = 0xff, [12] = 127}, .bits = 96 + 8}, /* 127.0.0.0/8 */
    {.addr = {[15] = 1}, .bits = 128},                                /* ::1 */
};

int rt_conf_admin_socket(const rt_conf_t *c, char *out, size_t n)
{
    int len = c->admin_socket[0] ? snprintf(out, n, "%s", c->admin_socket)
                                 : snprintf(out, n, "%s/rtd.sock", c->data_dir);
    return len >= 0 && (size_t)len < n ? 0 : RT_EINVAL;
}

/*
** The schema's defaults: numbers, booleans and strings from the table; the composite ones
** here (their text in the schema says the same, and test_config checks that it does).
*/
void rt_conf_defaults(rt_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    RT_ASSERT(NSETTINGS <= RT_CONF_MAX_SETTINGS);
    for (const setting_t *s = settings; s->name; s++)
        rt__conf_scalar_default(s, (char *)c + s->offset);
    c->nlisteners = 1;
    snprintf(c->listeners[0].host, sizeof(c->listeners[0].host), "0.0.0.0");
    c->listeners[0].port = 1883;
    /* Loopback only: an rtd on a public address takes no anonymous client from outside
       unless the operator says so (Mosquitto 2 does the same). */
    c->nanonymous_from = RT_CONF_NLOOPBACK;
    memcpy(c->anonymous_from, rt_conf_loopback, sizeof(rt_conf_loopback));
    c->http.request_timeout = RT_CONF_HTTP_REQUEST_TIMEOUT;
    rt__conf_xmpp_defaults(&c->xmpp); /* off: no xmpp table */
}

static rt_conf_t the_defaults; /* config show's default column; made once, never changed */

static void fill_defaults(void)
{
    rt_conf_defaults(&the_defaults);
}

static const setting_t *find_setting(const char *name)
{
    for (const setting_t *s = settings; s->name; s++)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static const unsigned char v4_mapped[12] = {[10] = 0xff, [11] = 0xff};

bool rt_conf_net_parse(const char *s, rt_conf_net_t *out)
{
    char host[64];
    const char *slash = strchr(s, '/');
    size_t hostlen = slash ? (size_t)(slash - s) : strlen(s);
    if (hostlen == 0 || hostlen >= sizeof(host))
        return false;
    memcpy(host, s, hostlen);
    host[hostlen] = 0;
    memset(out, 0, sizeof(*out));
    unsigned width;
    if (inet_pton(AF_INET, host, out->addr + 12) == 1) {
        memcpy(out->addr, v4_mapped, sizeof(v4_mapped));
        width = 32;
    } else if (inet_pton(AF_INET6, host, out->addr) == 1) {
        width = 128;
    } else {
        return false;
    }
    long bits = width;
    if (slash) {
        char *end;
        bits = strtol(slash + 1, &end, 10);
        if (end == slash + 1 || *end || bits < 0 || bits > (long)width)
            return false;
    }
    out->bits = 128 - width + (unsigned)bits;
    /* Host bits cleared, so "127.0.0.1/8" means 127.0.0.0/8 as it reads. */
    for (unsigned i = out->bits; i < 128; i++)
        out->addr[i / 8] &= (unsigned char)~(0x80u >> (i % 8));
    return true;
}

void rt_conf_net_format(const rt_conf_net_t *n, char *buf, size_t len)
{
    char text[INET6_ADDRSTRLEN];
    bool v4 = n->bits >= 96 && memcmp(n->addr, v4_mapped, sizeof(v4_mapped)) == 0;
    inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? n->addr + 12 : n->addr, text, sizeof(text));
    snprintf(buf, len, "%s/%u", text, v4 ? n->bits - 96 : n->bits);
}

void rt__conf_nets_text(const rt_conf_net_t *nets, unsigned n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (unsigned i = 0; i < n && used < len; i++) {
        char text[64];
        rt_conf_net_format(&nets[i], text, sizeof(text));
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? ", " : "", text);
    }
}

bool rt_conf_net_match(const rt_conf_net_t *nets, unsigned n, const unsigned char addr[16])
{
    for (unsigned k = 0; k < n; k++) {
        unsigned bits = nets[k].bits, whole = bits / 8;
        if (memcmp(nets[k].addr, addr, whole) != 0)
            continue;
        unsigned char mask = (unsigned char)(0xff00u >> (bits % 8));
        if (bits % 8 == 0 || (addr[whole] & mask) == nets[k].addr[whole])
            return true;
    }
    return false;
}

const rt_listen_t *rt_conf_listener(const rt_conf_t *c, unsigned i)
{
    if (i == RT_CONF_HTTP_LISTENER)
        return c->http.on ? &c->http.where : NULL;
    if (i < RT_CONF_MAX_LISTENERS)
        return i < c->nlisteners ? &c->listeners[i] : NULL;
    unsigned x = i - RT_CONF_XMPP_LISTENER(0);
    return c->xmpp.on && x < c->xmpp.nlisteners ? &c->xmpp.listeners[x] : NULL;
}

/* Listeners as "host:port tls websocket /path proxy, ..." from out + used; the new used. */
static size_t listeners_text(const rt_listen_t *ls, unsigned n, char *out, size_t used, size_t len)
{
    for (unsigned l = 0; l < n && used < len; l++) {
        const rt_listen_t *li = &ls[l];
        bool v6 = strchr(li->host, ':') != NULL;
        used += (size_t)snprintf(out + used, len - used, "%s%s%s%s:%d%s%s%s%s", l ? ", " : "",
                                 v6 ? "[" : "", li->host, v6 ? "]" : "", li->port,
                                 li->tls_on ? " tls" : "", li->starttls ? " starttls" : "",
                                 li->websocket[0] ? " websocket " : "", li->websocket);
        if (li->proxy_protocol && used < len)
            used += (size_t)snprintf(out + used, len - used, " proxy");
    }
    return used;
}

/* The names (char arrays at offset) of n elements stride bytes apart, joined by ", ". */
static void join_names(char *value, size_t vlen, const void *base, size_t n, size_t stride,
                       size_t offset)
{
    size_t used = 0;
    value[0] = 0;
    for (size_t i = 0; i < n && used < vlen; i++)
        used += (size_t)snprintf(value + used, vlen - used, "%s%s", i ? ", " : "",
                                 (const char *)base + i * stride + offset);
}

/* A top-level setting's value in c as text, as config show and rtd --check write it. */
static void value_text(const rt_conf_t *c, const setting_t *s, char *value, size_t vlen)
{
    const char *field = (const char *)c + s->offset;
    size_t used = 0;
    if (rt__conf_scalar_text(s, field, value, vlen))
        return;
    switch (kind_of(s)) {
    case K_NETS:
        rt__conf_nets_text(c->anonymous_from, c->nanonymous_from, value, vlen);
        break;
    case K_LISTENERS:
        value[0] = 0;
        listeners_text(c->listeners, c->nlisteners, value, 0, vlen);
        break;
    case K_XMPP:
        snprintf(value, vlen, "%s", c->xmpp.on ? "" : "-");
        for (unsigned n = 0; c->xmpp.on && n < c->xmpp.nhosts && used < vlen; n++)
            used += (size_t)snprintf(value + used, vlen - used, "%s%s", n ? ", " : "",
                                     c->xmpp.hosts[n]);
        if (c->xmpp.on && used < vlen) {
            used += (size_t)snprintf(value + used, vlen - used, " on ");
            listeners_text(c->xmpp.listeners, c->xmpp.nlisteners, value, used, vlen);
        }
        break;
    case K_HTTP:
        snprintf(value, vlen, "%s", c->http.on ? c->http.where.host : "-");
        if (c->http.on)
            snprintf(value + strlen(value), vlen - strlen(value), ":%d%s", c->http.where.port,
                     c->http.where.tls_on ? " tls" : "");
        break;
    case K_CLUSTER:
        snprintf(value, vlen, "%s", c->cluster.on ? c->cluster.node : "-");
        for (unsigned n = 0; c->cluster.on && n < c->cluster.nnats; n++)
            snprintf(value + strlen(value), vlen - strlen(value), "%s%s", n ? ", " : " via ",
                     c->cluster.nats[n]);
        break;
    case K_USER_RATES:
        join_names(value, vlen, c->user_rates, c->nuser_rates, sizeof(c->user_rates[0]),
                   offsetof(rt_conf_user_rate_t, user));
        break;
    case K_BRIDGES:
        join_names(value, vlen, c->bridges, c->nbridges, sizeof(c->bridges[0]),
                   offsetof(rt_conf_bridge_t, name));
        break;
    case K_TENANTS:
        join_names(value, vlen, c->tenants, c->ntenants, sizeof(c->tenants[0]),
                   offsetof(rt_conf_tenant_t, mount));
        break;
    case K_AUTO_SUBS:
        join_names(value, vlen, c->auto_subs, c->nauto_subs, sizeof(c->auto_subs[0]),
                   offsetof(rt_conf_auto_sub_t, topic));
        break;
    case K_REWRITES:
        join_names(value, vlen, c->rewrites, c->nrewrites, sizeof(c->rewrites[0]),
                   offsetof(rt_conf_rewrite_t, source));
        break;
    case K_AUTH:
        value[0] = 0;
        for (unsigned i = 0; i < c->nauth; i++)
            snprintf(value + strlen(value), vlen - strlen(value), "%s%s", i ? ", " : "",
                     c->auth[i].kind == RT_AUTHN_JWT    ? "jwt"
                     : c->auth[i].kind == RT_AUTHN_HTTP ? "http"
                                                        : "file");
        break;
    case K_SECTIONS:
        join_names(value, vlen, c->sinks.s, c->sinks.n, sizeof(c->sinks.s[0]),
                   offsetof(rt_conf_section_t, name));
        break;
    default:
        break;
    }
}

void rt_conf_each(const rt_conf_t *c, void (*fn)(const rt_conf_value_t *v, void *ud), void *ud)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_defaults);
    char value[RT_CONF_VALUE_LEN * 2], dflt[RT_CONF_VALUE_LEN * 2], from[RT_CONF_PATH_MAX + 16];
    for (size_t i = 0; i < NSETTINGS; i++) {
        const setting_t *s = &settings[i];
        value_text(c, s, value, sizeof(value));
        value_text(&the_defaults, s, dflt, sizeof(dflt));
        const rt_conf_origin_t *o = &c->origin[i];
        if (o->from == RT_FROM_FILE)
            snprintf(from, sizeof(from), "%s:%d", c->file, o->line);
        else
            snprintf(from, sizeof(from), "%s",
                     o->from == RT_FROM_OPTION ? "-o"
                     : o->from == RT_FROM_SET  ? "config set"
                                               : "default");
        fn(
            &(rt_conf_value_t){
                .setting = s, .name = s->name, .value = value, .dflt = dflt, .from = from},
            ud);
        rt__conf_each_key(c, s->name, from, fn, ud);
    }
}

/* The value on top of the stack as "address/bits" or a list of them, into nets. */
bool rt__conf_parse_nets(lua_State *L, const char *name, rt_conf_net_t *out, unsigned *nout,
                         char *why, size_t whylen)
{
    rt_conf_net_t nets[RT_CONF_MAX_NETS];
    unsigned n = 0;
    bool one = lua_type(L, -1) == LUA_TSTRING;
    if (!one && lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be \"address/bits\" or a list of them", name);
        return false;
    }
    lua_Integer len = one ? 1 : luaL_len(L, -1);
    if (len > RT_CONF_MAX_NETS) {
        snprintf(why, whylen, "%s: at most %d networks", name, RT_CONF_MAX_NETS);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        if (!one)
            lua_geti(L, -1, i);
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        bool ok = v && rt_conf_net_parse(v, &nets[n]);
        if (!ok)
            snprintf(why, whylen, "%s[%lld]: %s%s%s", name, (long long)i, v ? "\"" : "not a string",
                     v ? v : "", v ? "\" is not a numeric address with an optional /bits" : "");
        if (!one)
            lua_pop(L, 1);
        if (!ok)
            return false;
        n++;
    }
    memcpy(out, nets, n * sizeof(nets[0]));
    *nout = n;
    return true;
}

/*
** Flattens the table on top of the stack into sec's keys, prefixing nested keys
** with prefix ("columns."). Keys are strings (or array indexes in nested tables).
*/
static bool flatten_section(lua_State *L, rt_conf_section_t *sec, const char *prefix, int depth,
                            char *why, size_t whylen)
{
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        char key[RT_CONF_KEY_LEN];
        int n;
        if (lua_type(L, -2) == LUA_TSTRING)
            n = snprintf(key, sizeof(key), "%s%s", prefix, lua_tostring(L, -2));
        else if (depth > 0 && lua_isinteger(L, -2))
            n = snprintf(key, sizeof(key), "%s%lld", prefix, (long long)lua_tointeger(L, -2));
        else
            n = -1;
        if (n < 0 || (size_t)n >= sizeof(key)) {
            snprintf(why, whylen, "sinks.%s: keys must be names of at most %d bytes", sec->name,
                     RT_CONF_KEY_LEN - 1);
            lua_pop(L, 2);
            return false;
        }
        int t = lua_type(L, -1);
        if (t == LUA_TTABLE && depth < 2) {
            char sub[RT_CONF_KEY_LEN + 1];
            snprintf(sub, sizeof(sub), "%s.", key);
            if (!flatten_section(L, sec, sub, depth + 1, why, whylen)) {
                lua_pop(L, 2);
                return false;
            }
            lua_pop(L, 1);
            continue;
        }
        if (t != LUA_TSTRING && t != LUA_TNUMBER && t != LUA_TBOOLEAN) {
            snprintf(why, whylen, "sinks.%s.%s must be a string, a number, a boolean or a table",
                     sec->name, key);
            lua_pop(L, 2);
            return false;
        }
        if (sec->nkeys == RT_CONF_MAX_SECTION_KEYS) {
            snprintf(why, whylen, "sinks.%s: at most %d keys", sec->name, RT_CONF_MAX_SECTION_KEYS);
            lua_pop(L, 2);
            return false;
        }
        rt_conf_kv_t *kv = &sec->keys[sec->nkeys++];
        memcpy(kv->key, key, (size_t)n + 1);
        size_t len = 0;
        const char *v;
        if (t == LUA_TBOOLEAN) {
            kv->type = RT_CONF_V_BOOL;
            kv->b = lua_toboolean(L, -1);
            v = kv->b ? "true" : "false";
            len = strlen(v);
        } else {
            kv->type = t == LUA_TNUMBER ? RT_CONF_V_NUMBER : RT_CONF_V_STRING;
            kv->num = t == LUA_TNUMBER ? lua_tonumber(L, -1) : 0;
            lua_pushvalue(L, -1); /* tolstring converts numbers in place: keep the key intact */
            v = lua_tolstring(L, -1, &len);
            lua_pop(L, 1);
        }
        if (len >= sizeof(kv->str)) {
            snprintf(why, whylen, "sinks.%s.%s: at most %d bytes", sec->name, key,
                     RT_CONF_VALUE_LEN - 1);
            lua_pop(L, 2);
            return false;
        }
        memcpy(kv->str, v, len);
        kv->str[len] = 0;
        lua_pop(L, 1);
    }
    return true;
}

static int section_cmp(const void *a, const void *b)
{
    return strcmp(((const rt_conf_section_t *)a)->name, ((const rt_conf_section_t *)b)->name);
}

/* A table of name = { key = value, ... } into out, sorted by name. */
static bool apply_sections(lua_State *L, const char *what, rt_conf_sections_t *out, char *why,
                           size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table of name = { ... }", what);
        return false;
    }
    out->n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        size_t len = 0;
        const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
        bool plain = name && len > 0 && len < sizeof(out->s[0].name);
        for (size_t i = 0; plain && i < len; i++)
            plain = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
                    (name[i] >= '0' && name[i] <= '9') || name[i] == '_' || name[i] == '-';
        if (!plain || lua_type(L, -1) != LUA_TTABLE) {
            snprintf(why, whylen,
                     "%s: each entry must be name = { ... } with a plain name "
                     "(letters, digits, _ and -)",
                     what);
            lua_pop(L, 2);
            return false;
        }
        if (out->n == RT_CONF_MAX_SECTIONS) {
            snprintf(why, whylen, "%s: at most %d entries", what, RT_CONF_MAX_SECTIONS);
            lua_pop(L, 2);
            return false;
        }
        rt_conf_section_t *sec = &out->s[out->n++];
        memset(sec, 0, sizeof(*sec));
        memcpy(sec->name, name, len + 1);
        if (!flatten_section(L, sec, "", 0, why, whylen)) {
            lua_pop(L, 2);
            return false;
        }
        lua_pop(L, 1);
    }
    qsort(out->s, out->n, sizeof(out->s[0]), section_cmp);
    return true;
}

/* "NAME must be a whole number from MIN to MAX UNIT (got V)", or (DOC) when not a number. */
static void whole_number_error(const rt_setting_t *s, const char *name, const double *got,
                               char *why, size_t whylen)
{
    const char *unit = s->unit ? s->unit : "";
    char tail[RT_CONF_ERR_LEN / 2];
    if (got)
        snprintf(tail, sizeof(tail), "got %.0f", *got);
    else
        snprintf(tail, sizeof(tail), "%s", s->doc);
    snprintf(why, whylen, "%s must be a whole number from %.0f to %.0f%s%s (%s)", name, s->min,
             s->max, *unit ? " " : "", unit, tail);
}

int rt_conf_check_kv(const rt_setting_t *s, const rt_conf_kv_t *kv, char *why, size_t whylen)
{
    switch (s->type) {
    case RT_SET_INT: {
        bool whole = kv->type == RT_CONF_V_NUMBER && kv->num == floor(kv->num);
        if (whole && kv->num >= s->min && kv->num <= s->max)
            return 0;
        whole_number_error(s, kv->key, whole ? &kv->num : NULL, why, whylen);
        return RT_EINVAL;
    }
    case RT_SET_BOOL:
        if (kv->type == RT_CONF_V_BOOL)
            return 0;
        snprintf(why, whylen, "%s must be true or false", kv->key);
        return RT_EINVAL;
    case RT_SET_STRING:
    case RT_SET_PATH:
    case RT_SET_PREFIX: {
        if (kv->type != RT_CONF_V_STRING) {
            snprintf(why, whylen, "%s must be a string (%s)", kv->key, s->doc);
            return RT_EINVAL;
        }
        int choice = 0;
        while (s->choices && s->choices[choice] && strcmp(s->choices[choice], kv->str) != 0)
            choice++;
        if (!s->choices || s->choices[choice])
            return 0;
        char list[128];
        rt_conf_choices_text(s->choices, list, sizeof(list));
        snprintf(why, whylen, "%s must be one of: %s (got \"%s\")", kv->key, list, kv->str);
        return RT_EINVAL;
    }
    default:
        snprintf(why, whylen, "%s: not a value a section holds", kv->key);
        return RT_EINVAL;
    }
}

bool rt__conf_read_scalar(lua_State *L, const rt_setting_t *s, const char *name, void *field,
                          char *why, size_t whylen)
{
    switch (s->type) {
    case RT_SET_INT: {
        int isnum;
        lua_Number n = lua_tonumberx(L, -1, &isnum);
        bool whole = isnum && lua_type(L, -1) == LUA_TNUMBER && n == floor(n);
        if (whole && n >= s->min && n <= s->max) {
            *(long *)field = (long)n;
            return true;
        }
        whole_number_error(s, name, whole ? &n : NULL, why, whylen);
        return false;
    }
    case RT_SET_NUMBER: {
        if (lua_type(L, -1) != LUA_TNUMBER) {
            snprintf(why, whylen, "%s must be a number (%s)", name, s->doc);
            return false;
        }
        double d = lua_tonumber(L, -1);
        if ((d < s->min || d > s->max) && s->max >= 1e15)
            snprintf(why, whylen, "%s must be a number >= %g (got %g)", name, s->min, d);
        else if (d < s->min || d > s->max)
            snprintf(why, whylen, "%s must be between %g and %g (got %g)", name, s->min, s->max, d);
        else
            *(double *)field = d;
        return d >= s->min && d <= s->max;
    }
    case RT_SET_BOOL:
        if (!lua_isboolean(L, -1)) {
            snprintf(why, whylen, "%s must be true or false", name);
            return false;
        }
        *(bool *)field = lua_toboolean(L, -1);
        return true;
    case RT_SET_STRING:
    case RT_SET_PATH: {
        size_t len = 0;
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!v || (s->size && len >= s->size)) {
            snprintf(why, whylen, "%s must be a string of at most %zu bytes (%s)", name,
                     s->size ? s->size - 1 : (size_t)RT_CONF_VALUE_LEN, s->doc);
            return false;
        }
        int choice = 0;
        while (s->choices && s->choices[choice] && strcmp(s->choices[choice], v) != 0)
            choice++;
        if (s->choices && !s->choices[choice]) {
            char list[128];
            rt_conf_choices_text(s->choices, list, sizeof(list));
            snprintf(why, whylen, "%s must be one of: %s (got \"%s\")", name, list, v);
            return false;
        }
        if (s->size)
            memcpy(field, v, len + 1);
        else
            *(int *)field = choice; /* the choice's index: an enum in the choices' order */
        return true;
    }
    default:
        RT_ASSERT(!"not a scalar");
        return false;
    }
}

/* Checks and stores the value on top of the stack; on error writes the reason to why. */
static bool apply_setting(lua_State *L, rt_conf_t *c, const setting_t *s, char *why, size_t whylen)
{
    switch (kind_of(s)) {
    case K_LISTENERS:
        return rt__conf_read_listeners(L, c, why, whylen);
    case K_USER_RATES:
        return rt__conf_read_user_rates(L, c, why, whylen);
    case K_BRIDGES:
        return rt__conf_read_bridges(L, c, why, whylen);
    case K_TENANTS:
        return rt__conf_read_tenants(L, c, why, whylen);
    case K_AUTO_SUBS:
        return rt__conf_read_auto_subs(L, c, why, whylen);
    case K_REWRITES:
        return rt__conf_read_rewrites(L, c, why, whylen);
    case K_AUTH:
        return rt__conf_read_auth(L, c, why, whylen);
    case K_HTTP:
        return rt__conf_read_http(L, c, why, whylen);
    case K_CLUSTER:
        return rt__conf_read_cluster(L, c, why, whylen);
    case K_XMPP:
        return rt__conf_read_xmpp(L, c, why, whylen);
    case K_NETS:
        return rt__conf_parse_nets(L, s->name, c->anonymous_from, &c->nanonymous_from, why, whylen);
    case K_SECTIONS:
        return apply_sections(L, s->name, (rt_conf_sections_t *)(void *)((char *)c + s->offset),
                              why, whylen);
    default:
        return rt__conf_read_scalar(L, s, s->name, (char *)c + s->offset, why, whylen);
    }
}

/*
** The environment's __newindex: keeps each assignment in the values table
** (upvalue 1) with its line (upvalue 2), and refuses a second assignment.
*/
static int on_assign(lua_State *L)
{
    lua_Debug ar;
    int line = 0;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar))
        line = ar.currentline;
    if (lua_type(L, 2) != LUA_TSTRING)
        return luaL_error(L, "settings are named by plain words");
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL)
        return luaL_error(L, "%s is set twice (first on line %d)", lua_tostring(L, 2),
                          (int)lua_tointeger(L, -1));
    lua_pop(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_rawset(L, lua_upvalueindex(1));
    lua_pushvalue(L, 2);
    lua_pushinteger(L, line);
    lua_rawset(L, lua_upvalueindex(2));
    return 0;
}

/* The environment's __index: earlier settings can be used; anything else is a typo. */
static int on_read(lua_State *L)
{
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) == LUA_TNIL)
        return luaL_error(L, "%s is not defined here (the config has no functions or globals)",
                          lua_tostring(L, 2));
    return 1;
}

static void on_budget(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    luaL_error(L, "the config runs for too long");
}

/* "where:line: why", or "where: why" without a line. */
static void error_at(char *err, size_t errlen, const char *where, int line, const char *why)
{
    if (line > 0)
        snprintf(err, errlen, "%s:%d: %s", where, line, why);
    else
        snprintf(err, errlen, "%s: %s", where, why);
}

/*
** Runs the chunk on top of the stack in the sandbox, then applies every
** setting it made. where names the source in messages ("etc/rtd.conf").
*/
static int run_and_apply(lua_State *L, rt_conf_t *c, const char *where, rt_conf_from_t from,
                         char *err, size_t errlen)
{
    bool with_lines = from == RT_FROM_FILE;
    lua_newtable(L); /* values */
    lua_newtable(L); /* lines */
    int values = lua_absindex(L, -2), lines = lua_absindex(L, -1);
    lua_newtable(L); /* environment */
    lua_newtable(L); /* its metatable */
    lua_pushvalue(L, values);
    lua_pushvalue(L, lines);
    lua_pushcclosure(L, on_assign, 2);
    lua_setfield(L, -2, "__newindex");
    lua_pushvalue(L, values);
    lua_pushcclosure(L, on_read, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    /* Stack: chunk, values, lines, env. The chunk's first upvalue is _ENV. */
    lua_setupvalue(L, values - 1, 1);
    lua_pushvalue(L, values - 1);
    lua_sethook(L, on_budget, LUA_MASKCOUNT, RT_CONF_INSTRUCTION_LIMIT);
    if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        return RT_EINVAL;
    }
    lua_sethook(L, NULL, 0, 0);
    /* The limit is for the chunk: reading back what it made must not fail outside a pcall. */
    conf_mem_t *mem;
    lua_getallocf(L, (void **)&mem);
    mem->limit = SIZE_MAX;
    /* Every setting is checked; the error reported is the first by line, whatever order
       the table iterates in. */
    rt_conf_t next = *c;
    int bad_line = -1;
    lua_pushnil(L);
    while (lua_next(L, values)) {
        const char *name = lua_tostring(L, -2);
        lua_pushvalue(L, -2);
        lua_rawget(L, lines);
        int line = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
        const setting_t *s = find_setting(name);
        char why[RT_CONF_ERR_LEN / 2];
        bool ok = s && apply_setting(L, &next, s, why, sizeof(why));
        if (ok && kind_of(s) == K_SECTIONS) {
            rt_conf_sections_t *secs = (rt_conf_sections_t *)(void *)((char *)&next + s->offset);
            snprintf(secs->where, sizeof(secs->where), "%s", where);
            secs->line = with_lines ? line : 0;
        }
        for (unsigned l = 0; ok && with_lines && kind_of(s) == K_LISTENERS && l < next.nlisteners;
             l++)
            next.listeners[l].line = line; /* a port in use names it at start */
        if (ok && with_lines && kind_of(s) == K_HTTP)
            next.http.where.line = line;
        for (unsigned l = 0; ok && with_lines && kind_of(s) == K_XMPP && l < next.xmpp.nlisteners;
             l++)
            next.xmpp.listeners[l].line = line;
        if (ok)
            next.origin[s - settings] =
                (rt_conf_origin_t){.from = (unsigned char)from, .line = line};
        if (!s)
            snprintf(why, sizeof(why), "unknown setting %s", name);
        lua_pop(L, 1);
        if (ok || (bad_line >= 0 && bad_line <= line))
            continue;
        bad_line = line;
        error_at(err, errlen, where, with_lines ? line : 0, why);
    }
    /* Across tables, once all are read: MQTT's, xmpp's and http's listeners. */
    char why[RT_CONF_ERR_LEN / 2];
    int line = 0;
    if (bad_line < 0 && !rt__conf_listeners_apart(&next, why, sizeof(why), &line)) {
        error_at(err, errlen, where, with_lines ? line : 0, why);
        bad_line = line;
    }
    if (bad_line >= 0)
        return RT_EINVAL;
    *c = next;
    return 0;
}

/*
** Drops "." and "x/.." from an absolute path in place, as the kernel would read it
** without symlinks, so the paths logged at start read plainly ("/srv/rt/data", not
** "/srv/rt/etc/../data").
*/
static void normalize_path(char *path)
{
    char *out = path; /* writes never pass the reads */
    const char *in = path;
    while (*in) {
        while (*in == '/')
            in++;
        const char *end = in + strcspn(in, "/");
        size_t len = (size_t)(end - in);
        if (len == 1 && in[0] == '.') {
            /* nothing */
        } else if (len == 2 && in[0] == '.' && in[1] == '.') {
            while (out > path && *--out != '/')
                ;
        } else if (len) {
            *out++ = '/';
            memmove(out, in, len);
            out += len;
        }
        in = end;
    }
    if (out == path)
        *out++ = '/';
    *out = 0;
}

/* Makes the path in field (size bytes) absolute against the directory base; "" stays "". */
int rt__conf_resolve_field(char *field, size_t size, const char *name, const char *base,
                           const char *where, char *err, size_t errlen)
{
    if (!field[0] || field[0] == '/')
        return 0;
    char joined[2 * PATH_MAX];
    int n = snprintf(joined, sizeof(joined), "%s/%s", base, field);
    if (n < 0 || (size_t)n >= size) {
        snprintf(err, errlen, "%s: %s \"%s\" in %s is longer than %zu bytes", where, name, field,
                 base, size - 1);
        return RT_EINVAL;
    }
    normalize_path(joined);
    memcpy(field, joined, strlen(joined) + 1);
    return 0;
}

/* Settings whose value names files, relative to the config file (or the command line's cwd). */
static bool names_files(kind_t k)
{
    return k == K_PATH || k == K_LISTENERS || k == K_HTTP || k == K_CLUSTER || k == K_XMPP;
}

/* Makes the path setting s of c absolute against base (the listeners' TLS files too). */
static int resolve_path(rt_conf_t *c, const setting_t *s, const char *base, const char *where,
                        char *err, size_t errlen)
{
    if (kind_of(s) != K_PATH)
        return rt__conf_resolve_table(c, s->name, base, where, err, errlen);
    return rt__conf_resolve_field((char *)c + s->offset, s->size, s->name, base, where, err,
                                  errlen);
}

int rt_conf_load(rt_conf_t *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    fclose(f);
    conf_mem_t mem;
    lua_State *L = new_state(&mem);
    if (!L) {
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    int rc;
    /* Text only: a precompiled chunk could do what the sandbox forbids. */
    if (luaL_loadfilex(L, path, "t") != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        rc = RT_EINVAL;
    } else {
        rc = run_and_apply(L, c, path, RT_FROM_FILE, err, errlen);
        if (rc == 0)
            snprintf(c->file, sizeof(c->file), "%s", path);
    }
    lua_close(L);
    if (rc)
        return rc;
    /* The file's directory, absolute: relative paths in the file are the file's. */
    char dir[PATH_MAX], base[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    if (!realpath(dir, base)) {
        snprintf(err, errlen, "%s: cannot resolve its directory: %s", path, strerror(errno));
        return RT_EINVAL;
    }
    for (size_t i = 0; i < NSETTINGS && rc == 0; i++)
        if (names_files(kind_of(&settings[i])))
            rc = resolve_path(c, &settings[i], base, path, err, errlen);
    return rc;
}

bool rt_conf_known(const char *key)
{
    return find_setting(key) != NULL;
}

const rt_setting_t *rt_conf_setting(const char *key)
{
    return find_setting(key);
}

static int set_assignment(rt_conf_t *c, const char *where, rt_conf_from_t from,
                          const char *assignment, char *err, size_t errlen);

int rt_conf_set(rt_conf_t *c, const char *assignment, char *err, size_t errlen)
{
    return set_assignment(c, "command line", RT_FROM_OPTION, assignment, err, errlen);
}

int rt_conf_set_from(rt_conf_t *c, const char *where, const char *assignment, char *err,
                     size_t errlen)
{
    return set_assignment(c, where, RT_FROM_SET, assignment, err, errlen);
}

static int set_assignment(rt_conf_t *c, const char *where, rt_conf_from_t from,
                          const char *assignment, char *err, size_t errlen)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        snprintf(err, errlen, "%s: \"%s\" is not key=value", where, assignment);
        return RT_EINVAL;
    }
    conf_mem_t mem;
    lua_State *L = new_state(&mem);
    if (!L) {
        snprintf(err, errlen, "%s: out of memory", where);
        return RT_ENOMEM;
    }
    /* A value that is not a number, a boolean, a quoted string or a table is taken as a
       string, so `-o log_level=debug` and `-o listeners=0.0.0.0:1883` need no quotes. */
    const char *value = eq + 1;
    char *num_end;
    strtod(value, &num_end);
    bool expression = (*value && !*num_end) || strcmp(value, "true") == 0 ||
                      strcmp(value, "false") == 0 || strchr("{\"'", *value);
    if (!expression && strstr(value, "]]")) {
        snprintf(err, errlen, "%s: cannot read the value of \"%s\"", where, assignment);
        lua_close(L);
        return RT_EINVAL;
    }
    char chunk[4096]; /* a listeners table with its TLS files fits */
    int n = snprintf(chunk, sizeof(chunk), expression ? "%.*s = %s" : "%.*s = [[%s]]",
                     (int)(eq - assignment), assignment, value);
    if (n < 0 || (size_t)n >= sizeof(chunk)) { /* cut short, it could mean something else */
        snprintf(err, errlen, "%s: the assignment to \"%.*s\" is too long", where,
                 (int)(eq - assignment > 64 ? 64 : eq - assignment), assignment);
        lua_close(L);
        return RT_EINVAL;
    }
    int rc;
    char name[64];
    snprintf(name, sizeof(name), "=%s", where);
    if (luaL_loadbufferx(L, chunk, strlen(chunk), name, "t") != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        rc = RT_EINVAL;
    } else {
        rc = run_and_apply(L, c, where, from, err, errlen);
    }
    lua_close(L);
    char key[64], cwd[PATH_MAX];
    const char *k = assignment, *kend = eq;
    while (k < kend && (*k == ' ' || *k == '\t'))
        k++;
    while (kend > k && (kend[-1] == ' ' || kend[-1] == '\t'))
        kend--;
    snprintf(key, sizeof(key), "%.*s", (int)(kend - k), k);
    const setting_t *s = find_setting(key);
    if (rc == 0 && s && names_files(kind_of(s))) {
        if (!getcwd(cwd, sizeof(cwd))) {
            snprintf(err, errlen, "%s: %s: cannot read the current directory: %s", where, key,
                     strerror(errno));
            return RT_EINVAL;
        }
        rc = resolve_path(c, s, cwd, where, err, errlen);
    }
    return rc;
}

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
    K_HTTP,
    K_CLUSTER
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
    if (strcmp(s->name, "user_rate_limits") == 0)
        return K_USER_RATES;
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
    for (const setting_t *s = settings; s->name; s++) {
        char *field = (char *)c + s->offset;
        switch (kind_of(s)) {
        case K_INT:
            *(long *)(void *)field = (long)s->num;
            break;
        case K_DOUBLE:
            *(double *)(void *)field = s->num;
            break;
        case K_BOOL:
            *(bool *)(void *)field = s->num != 0;
            break;
        case K_STRING:
        case K_PATH:
            RT_ASSERT(strlen(s->text) < s->size);
            snprintf(field, s->size, "%s", s->text);
            break;
        default:
            break;
        }
    }
    c->nlisteners = 1;
    snprintf(c->listeners[0].host, sizeof(c->listeners[0].host), "0.0.0.0");
    c->listeners[0].port = 1883;
    /* Loopback only: an rtd on a public address takes no anonymous client from outside
       unless the operator says so (Mosquitto 2 does the same). */
    c->nanonymous_from = RT_CONF_NLOOPBACK;
    memcpy(c->anonymous_from, rt_conf_loopback, sizeof(rt_conf_loopback));
    c->http.request_timeout = RT_CONF_HTTP_REQUEST_TIMEOUT;
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

/* "a.b.c.d/n" (IPv4 as v4-mapped IPv6) or "v6/n"; no "/n": one address. */
static bool parse_net(const char *s, rt_conf_net_t *out)
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

static void format_net(const rt_conf_net_t *n, char *buf, size_t len)
{
    char text[INET6_ADDRSTRLEN];
    bool v4 = n->bits >= 96 && memcmp(n->addr, v4_mapped, sizeof(v4_mapped)) == 0;
    inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? n->addr + 12 : n->addr, text, sizeof(text));
    snprintf(buf, len, "%s/%u", text, v4 ? n->bits - 96 : n->bits);
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

/* A top-level setting's value in c as text, as config show and rtd --check write it. */
static void value_text(const rt_conf_t *c, const setting_t *s, char *value, size_t vlen)
{
    const char *field = (const char *)c + s->offset;
    size_t used = 0;
    switch (kind_of(s)) {
    case K_INT:
        snprintf(value, vlen, "%ld", *(const long *)field);
        break;
    case K_DOUBLE:
        snprintf(value, vlen, "%g", *(const double *)field);
        break;
    case K_BOOL:
        snprintf(value, vlen, "%s", *(const bool *)field ? "true" : "false");
        break;
    case K_STRING:
    case K_PATH:
        snprintf(value, vlen, "%s", field);
        break;
    case K_NETS:
        value[0] = 0;
        for (unsigned n = 0; n < c->nanonymous_from && used < vlen; n++) {
            char text[64];
            format_net(&c->anonymous_from[n], text, sizeof(text));
            used += (size_t)snprintf(value + used, vlen - used, "%s%s", n ? ", " : "", text);
        }
        break;
    case K_LISTENERS:
        value[0] = 0;
        for (unsigned l = 0; l < c->nlisteners && used < vlen; l++) {
            const rt_listen_t *li = &c->listeners[l];
            bool v6 = strchr(li->host, ':') != NULL;
            used += (size_t)snprintf(value + used, vlen - used, "%s%s%s%s:%d%s%s%s", l ? ", " : "",
                                     v6 ? "[" : "", li->host, v6 ? "]" : "", li->port,
                                     li->tls_on ? " tls" : "",
                                     li->websocket[0] ? " websocket " : "", li->websocket);
            if (li->proxy_protocol && used < vlen)
                used += (size_t)snprintf(value + used, vlen - used, " proxy");
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
        value[0] = 0;
        for (unsigned n = 0; n < c->nuser_rates && used < vlen; n++)
            used += (size_t)snprintf(value + used, vlen - used, "%s%s", n ? ", " : "",
                                     c->user_rates[n].user);
        break;
    case K_SECTIONS:
        value[0] = 0;
        for (unsigned n = 0; n < c->sinks.n && used < vlen; n++)
            used += (size_t)snprintf(value + used, vlen - used, "%s%s", n ? ", " : "",
                                     c->sinks.s[n].name);
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
        fn(&(rt_conf_value_t){.setting = s, .value = value, .dflt = dflt, .from = from}, ud);
    }
}

/* Parses "host:port" or "[v6]:port" with a numeric host. */
static bool parse_listener(const char *s, rt_listen_t *out)
{
    const char *colon;
    size_t hostlen;
    const char *host = s;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return false;
        host = s + 1;
        hostlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return false;
        hostlen = (size_t)(colon - s);
    }
    if (hostlen == 0 || hostlen >= sizeof(out->host))
        return false;
    memcpy(out->host, host, hostlen);
    out->host[hostlen] = 0;
    unsigned char buf[16];
    if (inet_pton(AF_INET, out->host, buf) != 1 && inet_pton(AF_INET6, out->host, buf) != 1)
        return false;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535)
        return false;
    out->port = (int)port;
    return true;
}

/* The value on top of the stack as "address/bits" or a list of them, into nets. */
static bool parse_nets(lua_State *L, const char *name, rt_conf_net_t *out, unsigned *nout,
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
        bool ok = v && parse_net(v, &nets[n]);
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

/* A string field of a listener's table into a buffer of size bytes. */
static bool table_string(lua_State *L, const char *where, const char *key, char *out, size_t size,
                         char *why, size_t whylen)
{
    size_t len;
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!v || len == 0 || len >= size) {
        snprintf(why, whylen, "%s.%s must be a string of 1 to %zu bytes", where, key, size - 1);
        return false;
    }
    memcpy(out, v, len + 1);
    return true;
}

static bool table_number(lua_State *L, const char *where, const char *key, double *out, char *why,
                         size_t whylen)
{
    if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 0 || lua_tonumber(L, -1) > 1e15) {
        snprintf(why, whylen, "%s.%s must be a number >= 0", where, key);
        return false;
    }
    *out = lua_tonumber(L, -1);
    return true;
}

/* rate_limit = { messages, bytes, burst_messages, burst_bytes }, on top of the stack. */
static bool parse_rate(lua_State *L, const char *where, rt_conf_rate_t *out, char *why,
                       size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table { messages = n, bytes = n, ... }", where);
        return false;
    }
    static const char *const keys[] = {"messages", "bytes", "burst_messages", "burst_bytes"};
    double *fields[] = {&out->messages, &out->bytes, &out->burst_messages, &out->burst_bytes};
    memset(out, 0, sizeof(*out));
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        size_t i = 0;
        while (i < 4 && strcmp(k, keys[i]) != 0)
            i++;
        if (i == 4) {
            snprintf(why, whylen,
                     "%s: unknown key \"%s\" (messages, bytes, burst_messages, "
                     "burst_bytes)",
                     where, k);
            lua_pop(L, 2);
            return false;
        }
        if (!table_number(L, where, k, fields[i], why, whylen)) {
            lua_pop(L, 2);
            return false;
        }
        lua_pop(L, 1);
    }
    return true;
}

/* tls.sni = { { name = "host", cert = "...", key = "..." }, ... }, on top of the stack. */
static bool parse_sni(lua_State *L, const char *where, rt_conf_tls_t *t, char *why, size_t whylen)
{
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? luaL_len(L, -1) : -1;
    if (len < 1 || len > RT_CONF_MAX_SNI) {
        snprintf(why, whylen, "%s must be a list of 1 to %d { name = ..., cert = ..., key = ... }",
                 where, RT_CONF_MAX_SNI);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        rt_conf_sni_t *e = &t->sni[i - 1];
        memset(e, 0, sizeof(*e));
        char at[128];
        snprintf(at, sizeof(at), "%.100s[%lld]", where, (long long)i);
        lua_geti(L, -1, i);
        bool ok = lua_type(L, -1) == LUA_TTABLE;
        const char *keys[] = {"name", "cert", "key"};
        char *fields[] = {e->name, e->cert, e->key};
        size_t sizes[] = {sizeof(e->name), sizeof(e->cert), sizeof(e->key)};
        for (size_t k = 0; ok && k < 3; k++) {
            lua_getfield(L, -1, keys[k]);
            ok = table_string(L, at, keys[k], fields[k], sizes[k], why, whylen);
            lua_pop(L, 1);
        }
        if (!ok && lua_type(L, -1) != LUA_TTABLE)
            snprintf(why, whylen, "%s must be { name = ..., cert = ..., key = ... }", at);
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    t->nsni = (unsigned)len;
    return true;
}

static bool parse_tls(lua_State *L, const char *where, rt_conf_tls_t *t, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table { cert = ..., key = ... }", where);
        return false;
    }
    memset(t, 0, sizeof(*t));
    t->min_version = 12;
    bool ok = true;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        if (strcmp(k, "cert") == 0 || strcmp(k, "key") == 0 || strcmp(k, "ca") == 0 ||
            strcmp(k, "crl") == 0) {
            char *field = k[0] == 'k'   ? t->key
                          : k[1] == 'e' ? t->cert
                          : k[1] == 'a' ? t->ca
                                        : t->crl;
            ok = table_string(L, where, k, field, RT_CONF_PATH_MAX, why, whylen);
        } else if (strcmp(k, "verify") == 0) {
            const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
            t->verify = strcmp(v, "required") == 0   ? RT_TLS_VERIFY_REQUIRED
                        : strcmp(v, "optional") == 0 ? RT_TLS_VERIFY_OPTIONAL
                                                     : RT_TLS_VERIFY_NONE;
            ok = strcmp(v, "none") == 0 || t->verify != RT_TLS_VERIFY_NONE;
            if (!ok)
                snprintf(why, whylen, "%s.verify must be \"none\", \"optional\" or \"required\"",
                         where);
        } else if (strcmp(k, "identity_as_username") == 0) {
            ok = lua_type(L, -1) == LUA_TBOOLEAN;
            t->identity_as_username = ok && lua_toboolean(L, -1);
            if (!ok)
                snprintf(why, whylen, "%s.identity_as_username must be true or false", where);
        } else if (strcmp(k, "sni") == 0) {
            char at[128];
            snprintf(at, sizeof(at), "%.100s.sni", where);
            ok = parse_sni(L, at, t, why, whylen);
        } else if (strcmp(k, "min_version") == 0) {
            const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
            t->min_version = strcmp(v, "1.3") == 0 ? 13 : 12;
            ok = strcmp(v, "1.2") == 0 || strcmp(v, "1.3") == 0;
            if (!ok)
                snprintf(why, whylen, "%s.min_version must be \"1.2\" or \"1.3\"", where);
        } else {
            snprintf(why, whylen,
                     "%s: unknown key \"%s\" (cert, key, ca, crl, verify, "
                     "identity_as_username, min_version, sni)",
                     where, k);
            ok = false;
        }
        lua_pop(L, 1);
    }
    if (!ok) {
        lua_pop(L, 1); /* the key lua_next left */
        return false;
    }
    if (!t->cert[0] || !t->key[0]) {
        snprintf(why, whylen, "%s needs cert and key", where);
        return false;
    }
    if (t->verify != RT_TLS_VERIFY_NONE && !t->ca[0]) {
        snprintf(why, whylen, "%s: verify = \"%s\" needs ca (the clients' certificate authority)",
                 where, t->verify == RT_TLS_VERIFY_REQUIRED ? "required" : "optional");
        return false;
    }
    if (t->identity_as_username && t->verify != RT_TLS_VERIFY_REQUIRED) {
        snprintf(why, whylen, "%s: identity_as_username needs verify = \"required\"", where);
        return false;
    }
    return true;
}

/* One listener's table (on top of the stack): bind and its transport's settings. */
static bool parse_listener_table(lua_State *L, const char *where, rt_listen_t *out, char *why,
                                 size_t whylen)
{
    char sub[96];
    bool ok = true, bound = false;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        snprintf(sub, sizeof(sub), "%s.%s", where, k);
        if (strcmp(k, "bind") == 0) {
            const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
            ok = bound = parse_listener(v, out);
            if (!ok)
                snprintf(why, whylen, "%s: \"%s\" is not host:port with a numeric host", sub, v);
        } else if (strcmp(k, "tls") == 0) {
            ok = out->tls_on = parse_tls(L, sub, &out->tls, why, whylen);
        } else if (strcmp(k, "websocket") == 0) {
            ok = table_string(L, where, k, out->websocket, sizeof(out->websocket), why, whylen);
            if (ok && out->websocket[0] != '/') {
                snprintf(why, whylen, "%s must be a path starting with /", sub);
                ok = false;
            }
        } else if (strcmp(k, "proxy_protocol") == 0) {
            ok = lua_type(L, -1) == LUA_TBOOLEAN;
            out->proxy_protocol = ok && lua_toboolean(L, -1);
            if (!ok)
                snprintf(why, whylen, "%s must be true or false", sub);
        } else if (strcmp(k, "trusted_proxies") == 0) {
            ok = parse_nets(L, sub, out->trusted_proxies, &out->ntrusted, why, whylen);
        } else if (strcmp(k, "rate_limit") == 0) {
            ok = parse_rate(L, sub, &out->rate_limit, why, whylen);
        } else {
            snprintf(why, whylen,
                     "%s: unknown key \"%s\" (bind, tls, websocket, proxy_protocol, "
                     "trusted_proxies, rate_limit)",
                     where, k);
            ok = false;
        }
        lua_pop(L, 1);
    }
    if (!ok) {
        lua_pop(L, 1);
        return false;
    }
    if (!bound) {
        snprintf(why, whylen, "%s needs bind = \"host:port\"", where);
        return false;
    }
    if (out->proxy_protocol && !out->ntrusted) {
        snprintf(why, whylen,
                 "%s: proxy_protocol needs trusted_proxies (the load balancers' "
                 "addresses)",
                 where);
        return false;
    }
    return true;
}

/* A listener: "host:port" or a table (on top of the stack). */
static bool parse_listener_value(lua_State *L, const char *where, rt_listen_t *out, char *why,
                                 size_t whylen)
{
    if (lua_type(L, -1) == LUA_TTABLE)
        return parse_listener_table(L, where, out, why, whylen);
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (v && parse_listener(v, out))
        return true;
    snprintf(why, whylen, "%s: %s%s%s", where, v ? "\"" : "not a string or a table", v ? v : "",
             v ? "\" is not host:port with a numeric host" : "");
    return false;
}

/* A node's name or the subject prefix: it goes into NATS subjects and headers as it is. */
static bool cluster_name(lua_State *L, const char *key, char *out, char *why, size_t whylen)
{
    size_t len;
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    bool ok = v && len > 0 && len < RT_CONF_NODE_MAX;
    for (size_t i = 0; ok && i < len; i++)
        ok = (v[i] >= 'a' && v[i] <= 'z') || (v[i] >= 'A' && v[i] <= 'Z') ||
             (v[i] >= '0' && v[i] <= '9') || v[i] == '_' || v[i] == '-';
    if (!ok) {
        snprintf(why, whylen, "cluster.%s must be 1 to %d of A-Z a-z 0-9 _ -", key,
                 RT_CONF_NODE_MAX - 1);
        return false;
    }
    memcpy(out, v, len + 1);
    return true;
}

/* cluster.nats: one URL or a list of them. */
static bool cluster_servers(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) == LUA_TSTRING)
        return table_string(L, "cluster", "nats", c->cluster.nats[c->cluster.nnats++],
                            RT_CONF_URL_MAX, why, whylen);
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, -1) : 0;
    if (len < 1 || len > RT_CONF_MAX_NATS) {
        snprintf(why, whylen, "cluster.nats must be a URL or a list of 1 to %d URLs",
                 RT_CONF_MAX_NATS);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        lua_geti(L, -1, i);
        bool ok = table_string(L, "cluster", "nats[]", c->cluster.nats[c->cluster.nnats++],
                               RT_CONF_URL_MAX, why, whylen);
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    return true;
}

static bool apply_setting(lua_State *L, rt_conf_t *c, const setting_t *s, char *why, size_t whylen);

#define cluster_settings rt__conf_cluster_settings

/* A wildcard address takes its port on every address of the machine. */
static bool any_address(const char *host)
{
    return !host[0] || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/*
** Two listeners on one address would fail only at start, after everything else had started
** (EADDRINUSE): refused here instead, naming both.
*/
static bool listeners_apart(const rt_listen_t *ls, unsigned n, char *why, size_t whylen)
{
    for (unsigned i = 0; i < n; i++)
        for (unsigned j = i + 1; j < n; j++) {
            if (!ls[i].port || ls[i].port != ls[j].port)
                continue;
            if (strcmp(ls[i].host, ls[j].host) != 0 && !any_address(ls[i].host) &&
                !any_address(ls[j].host))
                continue;
            snprintf(why, whylen,
                     "listeners[%u] (%.64s:%d) and listeners[%u] (%.64s:%d) take one address",
                     i + 1, ls[i].host, ls[i].port, j + 1, ls[j].host, ls[j].port);
            return false;
        }
    return true;
}

/* cluster = { node = "rt1", nats = { "nats://127.0.0.1:4222", ... }, prefix = "rt", ... } */
static bool parse_cluster(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "cluster must be a table { node = \"name\", nats = {...} }");
        return false;
    }
    memset(&c->cluster, 0, sizeof(c->cluster));
    strcpy(c->cluster.prefix, "rt");
    c->cluster.replay_margin = RT_CONF_REPLAY_MARGIN;
    bool ok = true;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        const setting_t *s = NULL;
        for (size_t i = 0; cluster_settings[i].name && !s; i++)
            if (strcmp(k, cluster_settings[i].name + strlen("cluster.")) == 0)
                s = &cluster_settings[i];
        if (strcmp(k, "node") == 0) {
            ok = cluster_name(L, k, c->cluster.node, why, whylen);
        } else if (strcmp(k, "prefix") == 0) {
            ok = cluster_name(L, k, c->cluster.prefix, why, whylen);
        } else if (strcmp(k, "nats") == 0) {
            ok = cluster_servers(L, c, why, whylen);
        } else if (strcmp(k, "secret_file") == 0 && lua_type(L, -1) == LUA_TBOOLEAN) {
            ok = !lua_toboolean(L, -1);
            c->cluster.unsigned_control = ok;
            if (!ok)
                snprintf(why, whylen, "cluster.secret_file must be a path, or false");
        } else if (s) {
            ok = apply_setting(L, c, s, why, whylen);
        } else {
            size_t at = (size_t)snprintf(why, whylen, "cluster: unknown key \"%s\" (", k);
            for (size_t i = 0; cluster_settings[i].name && at < whylen; i++)
                at += (size_t)snprintf(why + at, whylen - at, "%s%s", i ? ", " : "",
                                       cluster_settings[i].name + strlen("cluster."));
            if (at < whylen)
                snprintf(why + at, whylen - at, ")");
            ok = false;
        }
        lua_pop(L, 1);
    }
    if (!ok) {
        lua_pop(L, 1);
        return false;
    }
    if (!c->cluster.node[0] || !c->cluster.nnats) {
        snprintf(why, whylen, "cluster needs node = \"name\" and nats = { \"nats://host:port\" }");
        return false;
    }
    if (!c->cluster.tls_cert[0] != !c->cluster.tls_key[0]) {
        snprintf(why, whylen, "cluster: tls_cert and tls_key go together");
        return false;
    }
    if (!c->cluster.nkey[0] != !c->cluster.nkey_seed[0]) {
        snprintf(why, whylen, "cluster: nkey and nkey_seed go together");
        return false;
    }
    if (c->cluster.creds[0] && c->cluster.nkey[0]) {
        snprintf(why, whylen, "cluster: creds and nkey are two ways to sign in; give one");
        return false;
    }
    if (!c->cluster.secret_file[0] && !c->cluster.unsigned_control) {
        snprintf(why, whylen,
                 "cluster needs secret_file = \"path\" (a file only rtd reads, the nodes' "
                 "shared secret: head -c 32 /dev/urandom | base64), or secret_file = false to "
                 "let anyone who can publish on NATS end clients and move sessions");
        return false;
    }
    if (!c->cluster.replicas)
        c->cluster.replicas = c->cluster.nnats < 3 ? (long)c->cluster.nnats : 3;
    c->cluster.on = true;
    return true;
}

/* http = { bind = "host:port", tls = {...}, api_keys_file = "...", metrics_public = true,
            request_timeout = s } */
static bool parse_http(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "http must be a table { bind = \"host:port\", ... }");
        return false;
    }
    memset(&c->http, 0, sizeof(c->http));
    c->http.request_timeout = RT_CONF_HTTP_REQUEST_TIMEOUT;
    bool ok = true, bound = false;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        if (strcmp(k, "bind") == 0) {
            const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
            ok = bound = parse_listener(v, &c->http.where);
            if (!ok)
                snprintf(why, whylen, "http.bind: \"%s\" is not host:port with a numeric host", v);
        } else if (strcmp(k, "tls") == 0) {
            rt_conf_tls_t *t = &c->http.where.tls;
            ok = c->http.where.tls_on = parse_tls(L, "http.tls", t, why, whylen);
            if (ok && t->identity_as_username) {
                snprintf(why, whylen,
                         "http.tls: identity_as_username is for MQTT listeners (an "
                         "HTTP client is named by its API key)");
                ok = false;
            }
        } else if (strcmp(k, "api_keys_file") == 0) {
            ok = table_string(L, "http", k, c->http.api_keys_file, sizeof(c->http.api_keys_file),
                              why, whylen);
        } else if (strcmp(k, "metrics_public") == 0) {
            ok = lua_type(L, -1) == LUA_TBOOLEAN;
            c->http.metrics_public = ok && lua_toboolean(L, -1);
            if (!ok)
                snprintf(why, whylen, "http.metrics_public must be true or false");
        } else if (strcmp(k, "request_timeout") == 0) {
            lua_Integer v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
            ok = v >= 1 && v <= RT_CONF_HTTP_REQUEST_TIMEOUT_MAX;
            c->http.request_timeout = (long)v;
            if (!ok)
                snprintf(why, whylen, "http.request_timeout must be whole seconds from 1 to %d",
                         RT_CONF_HTTP_REQUEST_TIMEOUT_MAX);
        } else {
            snprintf(why, whylen,
                     "http: unknown key \"%s\" (bind, tls, api_keys_file, metrics_public, "
                     "request_timeout)",
                     k);
            ok = false;
        }
        lua_pop(L, 1);
    }
    if (!ok) {
        lua_pop(L, 1);
        return false;
    }
    if (!bound) {
        snprintf(why, whylen, "http needs bind = \"host:port\"");
        return false;
    }
    c->http.on = true;
    return true;
}

/* user_rate_limits = { name = { messages = n, ... }, ... } */
static bool parse_user_rates(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "user_rate_limits must be a table { user = { messages = n } }");
        return false;
    }
    rt_conf_user_rate_t rates[RT_CONF_MAX_USER_RATES];
    unsigned n = 0;
    bool ok = true;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        size_t len = 0;
        const char *user = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
        char where[96];
        snprintf(where, sizeof(where), "user_rate_limits.%s", user ? user : "?");
        if (!user || len == 0 || len >= sizeof(rates[0].user)) {
            snprintf(why, whylen, "user_rate_limits: keys are user names of 1 to %zu bytes",
                     sizeof(rates[0].user) - 1);
            ok = false;
        } else if (n == RT_CONF_MAX_USER_RATES) {
            snprintf(why, whylen, "user_rate_limits: at most %d users", RT_CONF_MAX_USER_RATES);
            ok = false;
        } else {
            memcpy(rates[n].user, user, len + 1);
            ok = parse_rate(L, where, &rates[n].rate, why, whylen);
            n += ok;
        }
        lua_pop(L, 1);
    }
    if (!ok) {
        lua_pop(L, 1);
        return false;
    }
    memcpy(c->user_rates, rates, n * sizeof(rates[0]));
    c->nuser_rates = n;
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

/* Checks and stores the value on top of the stack; on error writes the reason to why. */
static bool apply_setting(lua_State *L, rt_conf_t *c, const setting_t *s, char *why, size_t whylen)
{
    char *field = (char *)c + s->offset;
    switch (kind_of(s)) {
    case K_INT: {
        int isnum;
        lua_Number n = lua_tonumberx(L, -1, &isnum);
        if (!isnum || lua_type(L, -1) != LUA_TNUMBER || n != floor(n)) {
            snprintf(why, whylen, "%s must be a whole number (%s)", s->name, s->doc);
            return false;
        }
        if (n < s->min || n > s->max) {
            snprintf(why, whylen, "%s must be between %.0f and %.0f (got %.0f)", s->name, s->min,
                     s->max, n);
            return false;
        }
        *(long *)(void *)field = (long)n;
        return true;
    }
    case K_DOUBLE: {
        if (lua_type(L, -1) != LUA_TNUMBER) {
            snprintf(why, whylen, "%s must be a number (%s)", s->name, s->doc);
            return false;
        }
        double d = lua_tonumber(L, -1);
        if (d < s->min || d > s->max) {
            snprintf(why, whylen, "%s must be between %g and %g (got %g)", s->name, s->min, s->max,
                     d);
            return false;
        }
        *(double *)(void *)field = d;
        return true;
    }
    case K_BOOL:
        if (!lua_isboolean(L, -1)) {
            snprintf(why, whylen, "%s must be true or false", s->name);
            return false;
        }
        *(bool *)(void *)field = lua_toboolean(L, -1);
        return true;
    case K_STRING:
    case K_PATH: {
        size_t len;
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!v || len >= s->size) {
            snprintf(why, whylen, "%s must be a string of at most %zu bytes (%s)", s->name,
                     s->size - 1, s->doc);
            return false;
        }
        if (s->choices) {
            bool ok = false;
            for (const char *const *ch = s->choices; *ch; ch++)
                ok |= strcmp(*ch, v) == 0;
            if (!ok) {
                char list[128];
                rt__conf_choices_text(s->choices, list, sizeof(list));
                snprintf(why, whylen, "%s must be one of: %s (got \"%s\")", s->name, list, v);
                return false;
            }
        }
        memcpy(field, v, len + 1);
        return true;
    }
    case K_LISTENERS: {
        static rt_listen_t ls[RT_CONF_MAX_LISTENERS]; /* 16 KiB: not on the stack; one loader */
        memset(ls, 0, sizeof(ls));
        unsigned n = 0;
        /* One listener: a string, or a table with bind (a list's first entry is not bind). */
        bool one = lua_type(L, -1) == LUA_TSTRING;
        if (lua_type(L, -1) == LUA_TTABLE) {
            lua_getfield(L, -1, "bind");
            one = !lua_isnil(L, -1);
            lua_pop(L, 1);
        }
        if (one) {
            if (!parse_listener_value(L, "listeners", &ls[0], why, whylen))
                return false;
            n = 1;
        } else if (lua_type(L, -1) == LUA_TTABLE) {
            lua_Integer len = luaL_len(L, -1);
            if (len < 1 || len > RT_CONF_MAX_LISTENERS) {
                snprintf(why, whylen, "listeners: between 1 and %d are allowed",
                         RT_CONF_MAX_LISTENERS);
                return false;
            }
            for (lua_Integer i = 1; i <= len; i++) {
                char where[32];
                snprintf(where, sizeof(where), "listeners[%lld]", (long long)i);
                lua_geti(L, -1, i);
                bool ok = parse_listener_value(L, where, &ls[n], why, whylen);
                lua_pop(L, 1);
                if (!ok)
                    return false;
                n++;
            }
        } else {
            snprintf(why, whylen,
                     "listeners must be \"host:port\", a listener's table or a list "
                     "of them");
            return false;
        }
        if (!listeners_apart(ls, n, why, whylen))
            return false;
        memcpy(c->listeners, ls, n * sizeof(ls[0]));
        c->nlisteners = n;
        return true;
    }
    case K_USER_RATES:
        return parse_user_rates(L, c, why, whylen);
    case K_HTTP:
        return parse_http(L, c, why, whylen);
    case K_CLUSTER:
        return parse_cluster(L, c, why, whylen);
    case K_NETS:
        return parse_nets(L, s->name, c->anonymous_from, &c->nanonymous_from, why, whylen);
    case K_SECTIONS:
        return apply_sections(L, s->name, (rt_conf_sections_t *)(void *)field, why, whylen);
    }
    return false;
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
        if (ok)
            next.origin[s - settings] =
                (rt_conf_origin_t){.from = (unsigned char)from, .line = line};
        if (!s)
            snprintf(why, sizeof(why), "unknown setting %s", name);
        lua_pop(L, 1);
        if (ok || (bad_line >= 0 && bad_line <= line))
            continue;
        bad_line = line;
        if (with_lines && line > 0)
            snprintf(err, errlen, "%s:%d: %s", where, line, why);
        else
            snprintf(err, errlen, "%s: %s", where, why);
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
static int resolve_field(char *field, size_t size, const char *name, const char *base,
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

/* Makes a listener's TLS files absolute against base. */
static int resolve_tls(rt_conf_tls_t *t, const char *name, const char *base, const char *where,
                       char *err, size_t errlen)
{
    char *files[4 + 2 * RT_CONF_MAX_SNI] = {t->cert, t->key, t->ca, t->crl};
    size_t n = 4;
    for (unsigned i = 0; i < t->nsni; i++) {
        files[n++] = t->sni[i].cert;
        files[n++] = t->sni[i].key;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = resolve_field(files[i], RT_CONF_PATH_MAX, name, base, where, err, errlen);
    return rc;
}

/* Settings whose value names files, relative to the config file (or the command line's cwd). */
static bool names_files(kind_t k)
{
    return k == K_PATH || k == K_LISTENERS || k == K_HTTP || k == K_CLUSTER;
}

/* Makes the path setting s of c absolute against base (the listeners' TLS files too). */
static int resolve_path(rt_conf_t *c, const setting_t *s, const char *base, const char *where,
                        char *err, size_t errlen)
{
    if (kind_of(s) == K_HTTP) {
        int rc = resolve_field(c->http.api_keys_file, sizeof(c->http.api_keys_file),
                               "http.api_keys_file", base, where, err, errlen);
        return rc ? rc : resolve_tls(&c->http.where.tls, "http.tls file", base, where, err, errlen);
    }
    if (kind_of(s) == K_CLUSTER) {
        int rc = 0;
        for (size_t i = 0; cluster_settings[i].name && rc == 0; i++)
            if (cluster_settings[i].type == RT_SET_PATH)
                rc = resolve_field((char *)c + cluster_settings[i].offset, cluster_settings[i].size,
                                   cluster_settings[i].name, base, where, err, errlen);
        return rc;
    }
    if (kind_of(s) == K_LISTENERS) {
        int rc = 0;
        for (unsigned l = 0; l < c->nlisteners && rc == 0; l++)
            rc = resolve_tls(&c->listeners[l].tls, "listeners' tls file", base, where, err, errlen);
        return rc;
    }
    return resolve_field((char *)c + s->offset, s->size, s->name, base, where, err, errlen);
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

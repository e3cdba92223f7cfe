/*
** The loader's tables: a listener's (with its tls and rate_limit), http, the cluster, xmpp and
** the users' rate limits. Their keys, types, defaults and ranges are the schema's (config_schema.c:
** "listeners[].tls.cert"...); one walker reads a table by them, and what is checked across keys
** (cert needs key, verify needs ca, ...) is here with the table.
*/
#include <arpa/inet.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "config_schema.h"

/* The schema's entry for key of the table prefix ("listeners[].tls" and "cert"). */
static const rt_setting_t *entry(const char *prefix, const char *key)
{
    size_t n = strlen(prefix);
    for (const rt_setting_t *s = rt__conf_table_settings; s->name; s++)
        if (strncmp(s->name, prefix, n) == 0 && s->name[n] == '.' &&
            strcmp(s->name + n + 1, key) == 0)
            return s;
    return NULL;
}

/* The keys directly under prefix (a, b, c), for an unknown key's error. */
static void keys_text(const char *prefix, char *out, size_t len)
{
    size_t n = strlen(prefix), at = 0;
    out[0] = 0;
    for (const rt_setting_t *s = rt__conf_table_settings; s->name && at < len; s++)
        if (strncmp(s->name, prefix, n) == 0 && s->name[n] == '.' &&
            !strpbrk(s->name + n + 1, ".["))
            at += (size_t)snprintf(out + at, len - at, "%s%s", at ? ", " : "", s->name + n + 1);
}

/* The schema's defaults of the scalars directly under prefix into base. */
static void table_defaults(const char *prefix, void *base)
{
    size_t n = strlen(prefix);
    for (const rt_setting_t *s = rt__conf_table_settings; s->name; s++) {
        if (strncmp(s->name, prefix, n) != 0 || s->name[n] != '.' || strpbrk(s->name + n + 1, ".["))
            continue;
        rt__conf_scalar_default(s, (char *)base + s->offset);
    }
}

/* What a key with more than a scalar reads: the value on top of the stack into field. */
typedef bool (*reader_t)(lua_State *L, const char *where, void *field, char *why, size_t whylen);

typedef struct {
    const char *name; /* the key's schema name */
    reader_t read;
} reader_entry_t;

static const reader_entry_t *find_reader(const char *name);

/*
** The table on top of the stack by the schema's keys under prefix into base: each key's value
** checked by its type (or its reader), an unknown key named with the ones there are. where
** names the table in errors ("listeners[2].tls").
*/
static bool read_table(lua_State *L, const char *where, const char *prefix, void *base, char *why,
                       size_t whylen)
{
    bool ok = true;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        const rt_setting_t *s = entry(prefix, k);
        char sub[128];
        snprintf(sub, sizeof(sub), "%.90s.%.30s", where, k);
        if (!s) {
            char keys[256];
            keys_text(prefix, keys, sizeof(keys));
            snprintf(why, whylen, "%s: unknown key \"%s\" (%s)", where, k, keys);
            ok = false;
        } else if (find_reader(s->name)) {
            ok = find_reader(s->name)->read(L, sub, (char *)base + s->offset, why, whylen);
        } else {
            ok = rt__conf_read_scalar(L, s, sub, (char *)base + s->offset, why, whylen);
        }
        lua_pop(L, 1);
    }
    if (!ok)
        lua_pop(L, 1); /* the key lua_next left */
    return ok;
}

/* Parses "host:port" or "[v6]:port" with a numeric host. */
static bool parse_address(const char *s, rt_listen_t *out)
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

/* bind: field is the rt_listen_t. */
static bool read_bind(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
    if (parse_address(v, field))
        return true;
    snprintf(why, whylen, "%s: \"%s\" is not host:port with a numeric host", where, v);
    return false;
}

/* tls = { ... }: field is the rt_conf_tls_t. */
static bool read_tls(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_tls_t *t = field;
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table { cert = ..., key = ... }", where);
        return false;
    }
    memset(t, 0, sizeof(*t));
    table_defaults("listeners[].tls", t);
    if (!read_table(L, where, "listeners[].tls", t, why, whylen))
        return false;
    if (!t->cert[0] || !t->key[0]) {
        snprintf(why, whylen, "%s needs cert and key", where);
        return false;
    }
    if (t->verify != RT_TLS_VERIFY_NONE && !t->ca[0]) {
        snprintf(why, whylen, "%s: verify = \"%s\" needs ca (the clients' certificate authority)",
                 where, rt_conf_tls_verify_names[t->verify]);
        return false;
    }
    if (t->identity_as_username && t->verify != RT_TLS_VERIFY_REQUIRED) {
        snprintf(why, whylen, "%s: identity_as_username needs verify = \"required\"", where);
        return false;
    }
    return true;
}

/* tls.sni = { { name = "host", cert = "...", key = "..." }, ... }: field is the sni array. */
static bool read_sni(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_sni_t *sni = field;
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? luaL_len(L, -1) : -1;
    if (len < 1 || len > RT_CONF_MAX_SNI) {
        snprintf(why, whylen, "%s must be a list of 1 to %d { name = ..., cert = ..., key = ... }",
                 where, RT_CONF_MAX_SNI);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        rt_conf_sni_t *e = &sni[i - 1];
        char at[128];
        snprintf(at, sizeof(at), "%.100s[%lld]", where, (long long)i);
        lua_geti(L, -1, i);
        bool ok = lua_type(L, -1) == LUA_TTABLE;
        if (!ok)
            snprintf(why, whylen, "%s must be { name = ..., cert = ..., key = ... }", at);
        memset(e, 0, sizeof(*e));
        table_defaults("listeners[].tls.sni[]", e);
        ok = ok && read_table(L, at, "listeners[].tls.sni[]", e, why, whylen);
        const char *missing = !ok           ? NULL
                              : !e->name[0] ? "name"
                              : !e->cert[0] ? "cert"
                              : !e->key[0]  ? "key"
                                            : NULL;
        if (missing) {
            snprintf(why, whylen, "%s.%s must be a string of 1 to %d bytes", at, missing,
                     RT_CONF_PATH_MAX - 1);
            ok = false;
        }
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    rt_conf_tls_t *t = (rt_conf_tls_t *)(void *)((char *)field - offsetof(rt_conf_tls_t, sni));
    t->nsni = (unsigned)len;
    return true;
}

/* websocket: a path. */
static bool read_websocket(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    if (!rt__conf_read_scalar(L, entry("listeners[]", "websocket"), where, field, why, whylen))
        return false;
    if (((const char *)field)[0] == '/')
        return true;
    snprintf(why, whylen, "%s must be a path starting with /", where);
    return false;
}

/* trusted_proxies: field is the listener's array, its count beside it. */
static bool read_trusted(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_listen_t *l =
        (rt_listen_t *)(void *)((char *)field - offsetof(rt_listen_t, trusted_proxies));
    return rt__conf_parse_nets(L, where, l->trusted_proxies, &l->ntrusted, why, whylen);
}

/* rate_limit = { messages, bytes, burst_messages, burst_bytes }: field is the rt_conf_rate_t. */
static bool read_rate(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table { messages = n, bytes = n, ... }", where);
        return false;
    }
    memset(field, 0, sizeof(rt_conf_rate_t));
    table_defaults("listeners[].rate_limit", field);
    return read_table(L, where, "listeners[].rate_limit", field, why, whylen);
}

/* A node's name or the subject prefix: it goes into NATS subjects and headers as it is. */
/* Names that go into subjects, client ids and metric labels as they are. */
#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"

static bool read_cluster_name(lua_State *L, const char *where, void *field, char *why,
                              size_t whylen)
{
    size_t len;
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!v || len == 0 || len >= RT_CONF_NODE_MAX || strspn(v, NAME_CHARS) != len) {
        snprintf(why, whylen, "%s must be 1 to %d of A-Z a-z 0-9 _ -", where, RT_CONF_NODE_MAX - 1);
        return false;
    }
    memcpy(field, v, len + 1);
    return true;
}

/* One NATS URL into the next free slot of the cluster's list. */
static bool add_nats(lua_State *L, rt_conf_t *c, const char *where, char *why, size_t whylen)
{
    size_t len;
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!v || len == 0 || len >= RT_CONF_URL_MAX) {
        snprintf(why, whylen, "%s must be a string of 1 to %d bytes", where, RT_CONF_URL_MAX - 1);
        return false;
    }
    memcpy(c->cluster.nats[c->cluster.nnats++], v, len + 1);
    return true;
}

/* cluster.nats: one URL or a list of them; field is the cluster's list in rt_conf_t. */
static bool read_nats(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_t *c = (rt_conf_t *)(void *)((char *)field - offsetof(rt_conf_t, cluster.nats));
    c->cluster.nnats = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
        return add_nats(L, c, where, why, whylen);
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, -1) : 0;
    if (len < 1 || len > RT_CONF_MAX_NATS) {
        snprintf(why, whylen, "%s must be a URL or a list of 1 to %d URLs", where,
                 RT_CONF_MAX_NATS);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        lua_geti(L, -1, i);
        bool ok = add_nats(L, c, "cluster.nats[]", why, whylen);
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    return true;
}

/* cluster.secret_file: a path, or false for unsigned control requests. */
static bool read_secret_file(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_t *c = (rt_conf_t *)(void *)((char *)field - offsetof(rt_conf_t, cluster.secret_file));
    if (lua_type(L, -1) != LUA_TBOOLEAN)
        return rt__conf_read_scalar(L, entry("cluster", "secret_file"), where, field, why, whylen);
    c->cluster.unsigned_control = !lua_toboolean(L, -1);
    if (!c->cluster.unsigned_control)
        snprintf(why, whylen, "%s must be a path, or false", where);
    return c->cluster.unsigned_control;
}

/*
** One XMPP host name (on top of the stack) into out, folded to lowercase: the domainpart of
** every JID served, compared bytewise from here on. ASCII only (letters, digits, - and .,
** labels of 1 to 63 bytes with no - at either end): an IDN is given as its A-label, so the
** settings never need IDNA to say which names are one.
*/
static bool read_host(lua_State *L, const char *where, char *out, char *why, size_t whylen)
{
    size_t len = 0;
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!v || len == 0 || len >= RT_CONF_XMPP_HOST_MAX) {
        snprintf(why, whylen, "%s must be a host name of 1 to %d bytes", where,
                 RT_CONF_XMPP_HOST_MAX - 1);
        return false;
    }
    size_t label = 0; /* bytes of the label so far */
    for (size_t i = 0; i <= len; i++) {
        unsigned char ch = i < len ? (unsigned char)v[i] : '.';
        if (ch >= 0x80) {
            snprintf(why, whylen,
                     "%s: \"%.100s\" is not ASCII: give an internationalized name as its A-label "
                     "(xn--...)",
                     where, v);
            return false;
        }
        bool ldh = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '-';
        if (!ldh && ch != '.') {
            snprintf(why, whylen, "%s: \"%.100s\" may have only ASCII letters, digits, - and .",
                     where, v);
            return false;
        }
        bool bad_end = ch == '.' && (label == 0 || label > 63 || v[i - 1] == '-');
        if (bad_end || (ch == '-' && label == 0)) {
            snprintf(why, whylen,
                     "%s: \"%.100s\" is not a DNS name (labels of 1 to 63 bytes between dots, "
                     "no - at either end)",
                     where, v);
            return false;
        }
        label = ch == '.' ? 0 : label + 1;
        if (i < len)
            out[i] = (char)(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    }
    out[len] = 0;
    return true;
}

/* xmpp.hosts, anonymous or register: a name or a list of names, none twice, at least min. */
static bool read_hosts(lua_State *L, const char *where, char (*names)[RT_CONF_XMPP_HOST_MAX],
                       unsigned *n, unsigned min, char *why, size_t whylen)
{
    *n = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
        *n = read_host(L, where, names[0], why, whylen);
        return *n == 1;
    }
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, -1) : -1;
    if (len < (lua_Integer)min || len > RT_CONF_MAX_XMPP_HOSTS) {
        snprintf(why, whylen, "%s must be a host name or a list of %u to %d of them", where, min,
                 RT_CONF_MAX_XMPP_HOSTS);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        char at[64];
        snprintf(at, sizeof(at), "%.30s[%lld]", where, (long long)i);
        lua_geti(L, -1, i);
        bool ok = read_host(L, at, names[i - 1], why, whylen);
        lua_pop(L, 1);
        if (!ok)
            return false;
        for (lua_Integer j = 1; j < i; j++)
            if (strcmp(names[j - 1], names[i - 1]) == 0) {
                snprintf(why, whylen,
                         "%s: \"%.100s\" is given twice (names are folded to lowercase)", at,
                         names[i - 1]);
                return false;
            }
    }
    *n = (unsigned)len;
    return true;
}

/* The xmpp struct a reader's field (at offset in it) is in: its count is beside the field. */
static rt_conf_xmpp_t *xmpp_of(void *field, size_t offset)
{
    return (rt_conf_xmpp_t *)(void *)((char *)field - offset);
}

static bool read_xmpp_hosts(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, hosts));
    return read_hosts(L, where, x->hosts, &x->nhosts, 1, why, whylen);
}

static bool read_xmpp_anonymous(lua_State *L, const char *where, void *field, char *why,
                                size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, anonymous));
    return read_hosts(L, where, x->anonymous, &x->nanonymous, 0, why, whylen);
}

static bool read_xmpp_register(lua_State *L, const char *where, void *field, char *why,
                               size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, registration));
    return read_hosts(L, where, x->registration, &x->nregistration, 0, why, whylen);
}

static bool read_listener_list(lua_State *L, const char *what, bool xmpp, rt_listen_t *ls,
                               unsigned max, unsigned *nout, char *why, size_t whylen);

/* xmpp.s2s_peers: "domain=host:port" each, the address numeric, no domain twice. */
static bool read_xmpp_s2s_peers(lua_State *L, const char *where, void *field, char *why,
                                size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, s2s_peers));
    lua_Integer len = lua_type(L, -1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, -1) : -1;
    if (len < 0 || len > RT_CONF_MAX_XMPP_HOSTS) {
        snprintf(why, whylen, "%s must be a list of up to %d \"domain=host:port\"", where,
                 RT_CONF_MAX_XMPP_HOSTS);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        lua_geti(L, -1, i);
        size_t n = 0;
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
        const char *eq = v ? memchr(v, '=', n) : NULL;
        rt_listen_t a;
        bool ok = eq && eq > v && n < RT_CONF_XMPP_HOST_MAX && parse_address(eq + 1, &a);
        for (unsigned j = 0; ok && j < x->ns2s_peers; j++)
            ok = strncmp(x->s2s_peers[j], v, (size_t)(eq - v) + 1) != 0;
        if (ok)
            memcpy(x->s2s_peers[x->ns2s_peers++], v, n + 1);
        else
            snprintf(why, whylen,
                     "%s[%lld]: \"%.100s\" is not \"domain=host:port\" with a numeric host "
                     "(at most %d bytes), or names its domain twice",
                     where, (long long)i, v ? v : "", RT_CONF_XMPP_HOST_MAX - 1);
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    return true;
}

static bool read_xmpp_listeners(lua_State *L, const char *where, void *field, char *why,
                                size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, listeners));
    return read_listener_list(L, where, true, x->listeners, RT_CONF_MAX_XMPP_LISTENERS,
                              &x->nlisteners, why, whylen);
}

static bool read_xmpp_plaintext(lua_State *L, const char *where, void *field, char *why,
                                size_t whylen)
{
    rt_conf_xmpp_t *x = xmpp_of(field, offsetof(rt_conf_xmpp_t, plaintext_from));
    return rt__conf_parse_nets(L, where, x->plaintext_from, &x->nplaintext_from, why, whylen);
}

/* A bridge's out or in: one string or a list of them (their form is the bridge's to check). */
static bool read_bridge_maps(lua_State *L, const char *where, void *field, char *why, size_t whylen)
{
    rt_conf_bridge_maps_t *m = field;
    bool one = lua_type(L, -1) == LUA_TSTRING;
    size_t n = one ? 1 : lua_type(L, -1) == LUA_TTABLE ? lua_rawlen(L, -1) : 0;
    if (!one && lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a string or a list of them: { \"a/# -> b/#\", ... }",
                 where);
        return false;
    }
    if (n > RT_CONF_MAX_BRIDGE_MAPS) {
        snprintf(why, whylen, "%s: at most %d", where, RT_CONF_MAX_BRIDGE_MAPS);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!one)
            lua_rawgeti(L, -1, (lua_Integer)i + 1);
        size_t len = 0;
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!one)
            lua_pop(L, 1);
        if (!v || len == 0 || len >= RT_CONF_BRIDGE_MAP_LEN) {
            snprintf(why, whylen, "%s[%zu]: a string of 1 to %d bytes", where, i + 1,
                     RT_CONF_BRIDGE_MAP_LEN - 1);
            return false;
        }
        memcpy(m->map[i], v, len + 1);
    }
    m->n = (unsigned)n;
    return true;
}

/* The keys whose value is more than a scalar, by their schema name. */
static const reader_entry_t readers[] = {
    {"listeners[].bind", read_bind},
    {"listeners[].tls", read_tls},
    {"listeners[].websocket", read_websocket},
    {"listeners[].trusted_proxies", read_trusted},
    {"listeners[].rate_limit", read_rate},
    {"listeners[].tls.sni", read_sni},
    {"http.bind", read_bind},
    {"http.tls", read_tls},
    {"cluster.node", read_cluster_name},
    {"cluster.prefix", read_cluster_name},
    {"cluster.nats", read_nats},
    {"cluster.secret_file", read_secret_file},
    {"xmpp.hosts", read_xmpp_hosts},
    {"xmpp.anonymous", read_xmpp_anonymous},
    {"xmpp.register", read_xmpp_register},
    {"xmpp.listeners", read_xmpp_listeners},
    {"xmpp.plaintext_from", read_xmpp_plaintext},
    {"xmpp.s2s_peers", read_xmpp_s2s_peers},
    {"bridges.<name>.out", read_bridge_maps},
    {"bridges.<name>.in", read_bridge_maps},
};

static const reader_entry_t *find_reader(const char *name)
{
    for (size_t i = 0; i < sizeof(readers) / sizeof(readers[0]); i++)
        if (strcmp(readers[i].name, name) == 0)
            return &readers[i];
    return NULL;
}

/*
** A mountpoint as written (before %u and %c are expanded): it ends with / so that one tenant's
** prefix is never the start of another's level ("acme" would hold "acme2/..."), and holds no
** wildcard, as it becomes part of topic names.
*/
static bool mountpoint_ok(const char *m, const char *where, char *why, size_t whylen)
{
    size_t len = strlen(m);
    for (size_t i = 0; i < len; i++)
        if (m[i] == '+' || m[i] == '#' || (m[i] == '%' && m[i + 1] != 'u' && m[i + 1] != 'c')) {
            snprintf(why, whylen,
                     "%s.mountpoint: \"%s\" holds a wildcard or a %% other than %%u "
                     "and %%c",
                     where, m);
            return false;
        }
    if (len && (m[len - 1] != '/' || m[0] == '$')) {
        snprintf(why, whylen, "%s.mountpoint: \"%s\" must end with / (and not start with $)", where,
                 m);
        return false;
    }
    return true;
}

/*
** One listener's table (on top of the stack): bind and its transport's settings. xmpp: one of
** xmpp.listeners, where STARTTLS is a thing (MQTT and HTTP start TLS at accept).
*/
static bool read_listener_table(lua_State *L, const char *where, bool xmpp, rt_listen_t *out,
                                char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    table_defaults("listeners[]", out);
    if (!read_table(L, where, "listeners[]", out, why, whylen))
        return false;
    out->tls_on = out->tls.cert[0] != 0; /* read_tls refuses a tls table without one */
    if (!out->host[0]) {
        snprintf(why, whylen, "%s needs bind = \"host:port\"", where);
        return false;
    }
    if (out->proxy_protocol && !out->ntrusted) {
        snprintf(why, whylen,
                 "%s: proxy_protocol needs trusted_proxies (the load balancers' addresses)", where);
        return false;
    }
    if (xmpp && out->mountpoint[0]) {
        snprintf(why, whylen, "%s: mountpoint is for MQTT listeners", where);
        return false;
    }
    if (!mountpoint_ok(out->mountpoint, where, why, whylen))
        return false;
    if (out->s2s && (!xmpp || out->websocket[0])) {
        snprintf(why, whylen, "%s: s2s is for xmpp.listeners, and not on WebSocket", where);
        return false;
    }
    if (!out->starttls)
        return true;
    if (!xmpp)
        snprintf(why, whylen, "%s: starttls is for xmpp.listeners (MQTT starts TLS at accept)",
                 where);
    else if (!out->tls_on)
        snprintf(why, whylen, "%s: starttls needs a tls table (the certificate it starts with)",
                 where);
    else if (out->websocket[0])
        snprintf(why, whylen, "%s: starttls is not for WebSocket (RFC 7395: wss://)", where);
    return xmpp && out->tls_on && !out->websocket[0];
}

/* A listener: "host:port" or a table (on top of the stack). */
static bool read_listener(lua_State *L, const char *where, bool xmpp, rt_listen_t *out, char *why,
                          size_t whylen)
{
    if (lua_type(L, -1) == LUA_TTABLE)
        return read_listener_table(L, where, xmpp, out, why, whylen);
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    memset(out, 0, sizeof(*out));
    if (v && parse_address(v, out))
        return true;
    snprintf(why, whylen, "%s: %s%s%s", where, v ? "\"" : "not a string or a table", v ? v : "",
             v ? "\" is not host:port with a numeric host" : "");
    return false;
}

/* A wildcard address takes its port on every address of the machine. */
static bool any_address(const char *host)
{
    return !host[0] || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/*
** A listener, a list of them or one table (on top of the stack) into ls (max of them), named
** what in errors ("xmpp.listeners[2]").
*/
static bool read_listener_list(lua_State *L, const char *what, bool xmpp, rt_listen_t *ls,
                               unsigned max, unsigned *nout, char *why, size_t whylen)
{
    /* One listener: a string, or a table with bind (a list's first entry is not bind). */
    bool one = lua_type(L, -1) == LUA_TSTRING;
    if (lua_type(L, -1) == LUA_TTABLE) {
        lua_getfield(L, -1, "bind");
        one = !lua_isnil(L, -1);
        lua_pop(L, 1);
    }
    if (one) {
        *nout = read_listener(L, what, xmpp, &ls[0], why, whylen);
        return *nout == 1;
    }
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be \"host:port\", a listener's table or a list of them",
                 what);
        return false;
    }
    lua_Integer len = luaL_len(L, -1);
    if (len < 1 || len > (lua_Integer)max) {
        snprintf(why, whylen, "%s: between 1 and %u are allowed", what, max);
        return false;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        char where[64];
        snprintf(where, sizeof(where), "%.30s[%lld]", what, (long long)i);
        lua_geti(L, -1, i);
        bool ok = read_listener(L, where, xmpp, &ls[i - 1], why, whylen);
        lua_pop(L, 1);
        if (!ok)
            return false;
    }
    *nout = (unsigned)len;
    return true;
}

bool rt__conf_read_listeners(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    static rt_listen_t ls[RT_CONF_MAX_LISTENERS]; /* 16 KiB: not on the stack; one loader */
    memset(ls, 0, sizeof(ls));
    unsigned n = 0;
    if (!read_listener_list(L, "listeners", false, ls, RT_CONF_MAX_LISTENERS, &n, why, whylen))
        return false;
    memcpy(c->listeners, ls, n * sizeof(ls[0]));
    c->nlisteners = n;
    return true;
}

/* A listener with the name errors give it ("xmpp.listeners[2]", "http.bind"). */
typedef struct {
    const rt_listen_t *l;
    char name[32];
} placed_t;

static unsigned place(placed_t *p, const rt_listen_t *ls, unsigned n, const char *table)
{
    for (unsigned i = 0; i < n; i++) {
        p[i].l = &ls[i];
        snprintf(p[i].name, sizeof(p[i].name), "%s[%u]", table, i + 1);
    }
    return n;
}

/*
** Two listeners on one address would fail only at start, after everything else had started
** (EADDRINUSE): refused here instead, naming both, whichever tables they are in.
*/
bool rt__conf_listeners_apart(const rt_conf_t *c, char *why, size_t whylen, int *line)
{
    placed_t p[RT_CONF_MAX_LISTENERS + RT_CONF_MAX_XMPP_LISTENERS + 1];
    unsigned n = place(p, c->listeners, c->nlisteners, "listeners");
    if (c->xmpp.on)
        n += place(p + n, c->xmpp.listeners, c->xmpp.nlisteners, "xmpp.listeners");
    if (c->http.on) {
        p[n].l = &c->http.where;
        snprintf(p[n++].name, sizeof(p[0].name), "http.bind");
    }
    for (unsigned i = 0; i < n; i++)
        for (unsigned j = i + 1; j < n; j++) {
            const rt_listen_t *a = p[i].l, *b = p[j].l;
            if (!a->port || a->port != b->port)
                continue;
            if (strcmp(a->host, b->host) != 0 && !any_address(a->host) && !any_address(b->host))
                continue;
            snprintf(why, whylen, "%s (%.64s:%d) and %s (%.64s:%d) take one address", p[i].name,
                     a->host, a->port, p[j].name, b->host, b->port);
            *line = a->line > b->line ? a->line : b->line;
            return false;
        }
    return true;
}

bool rt__conf_read_http(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "http must be a table { bind = \"host:port\", ... }");
        return false;
    }
    lua_getfield(L, -1, "starttls"); /* a listener's key, not http's: say why */
    bool starttls = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (starttls) {
        snprintf(why, whylen, "http: starttls is for xmpp.listeners (HTTPS starts TLS at accept)");
        return false;
    }
    memset(&c->http, 0, sizeof(c->http));
    table_defaults("http", &c->http);
    if (!read_table(L, "http", "http", &c->http, why, whylen))
        return false;
    c->http.where.tls_on = c->http.where.tls.cert[0] != 0;
    if (c->http.where.tls.identity_as_username) {
        snprintf(why, whylen,
                 "http.tls: identity_as_username is for MQTT listeners (an HTTP client is named "
                 "by its API key)");
        return false;
    }
    if (!c->http.where.host[0]) {
        snprintf(why, whylen, "http needs bind = \"host:port\"");
        return false;
    }
    c->http.on = true;
    return true;
}

bool rt__conf_read_cluster(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "cluster must be a table { node = \"name\", nats = {...} }");
        return false;
    }
    memset(&c->cluster, 0, sizeof(c->cluster));
    table_defaults("cluster", c); /* the cluster's offsets are rt_conf_t's */
    if (!read_table(L, "cluster", "cluster", c, why, whylen))
        return false;
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

void rt__conf_xmpp_defaults(rt_conf_xmpp_t *x)
{
    memset(x, 0, sizeof(*x));
    table_defaults("xmpp", x);
    x->nlisteners = 1;
    snprintf(x->listeners[0].host, sizeof(x->listeners[0].host), "0.0.0.0");
    x->listeners[0].port = RT_CONF_XMPP_PORT;
    /* Loopback only, as anonymous_from: elsewhere a client starts TLS before it authenticates
       (RFC 6120 13.8 makes STARTTLS mandatory to implement; PLAIN goes only inside TLS). */
    x->nplaintext_from = RT_CONF_NLOOPBACK;
    memcpy(x->plaintext_from, rt_conf_loopback, sizeof(rt_conf_loopback));
}

/* Each of names (the list xmpp.<key>) is one of xmpp.hosts. */
static bool hosts_of_hosts(const rt_conf_xmpp_t *x, const char *key,
                           const char (*names)[RT_CONF_XMPP_HOST_MAX], unsigned n, char *why,
                           size_t whylen)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned h = 0;
        while (h < x->nhosts && strcmp(x->hosts[h], names[i]) != 0)
            h++;
        if (h == x->nhosts) {
            snprintf(why, whylen, "xmpp.%s[%u]: \"%.100s\" is not one of xmpp.hosts", key, i + 1,
                     names[i]);
            return false;
        }
    }
    return true;
}

bool rt__conf_read_xmpp(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "xmpp must be a table { hosts = { \"example.org\" }, ... }");
        return false;
    }
    rt_conf_xmpp_t *x = &c->xmpp;
    rt__conf_xmpp_defaults(x);
    if (!read_table(L, "xmpp", "xmpp", x, why, whylen))
        return false;
    if (!x->nhosts) {
        snprintf(why, whylen, "xmpp needs hosts = { \"example.org\" } (the domains it serves)");
        return false;
    }
    if (!hosts_of_hosts(x, "anonymous", x->anonymous, x->nanonymous, why, whylen) ||
        !hosts_of_hosts(x, "register", x->registration, x->nregistration, why, whylen))
        return false;
    x->on = true;
    return true;
}

/* One bridge's table: what is checked across its keys. */
static bool bridge_ok(const void *elem, const char *where, char *why, size_t whylen)
{
    const rt_conf_bridge_t *b = elem;
    if (strncmp(b->remote, "mqtt://", 7) != 0 && strncmp(b->remote, "mqtts://", 8) != 0) {
        snprintf(why, whylen, "%s.remote: mqtt://host:port or mqtts://host:port is required",
                 where);
        return false;
    }
    if (!b->key_file[0] != !b->cert_file[0]) {
        snprintf(why, whylen, "%s: cert_file and key_file go together", where);
        return false;
    }
    if (!b->out.n && !b->in.n) {
        snprintf(why, whylen, "%s: out, in or both are required", where);
        return false;
    }
    if (b->reconnect_min_ms > b->reconnect_max_ms) {
        snprintf(why, whylen, "%s: reconnect_min_ms is more than reconnect_max_ms", where);
        return false;
    }
    return true;
}

/* What an element of a list of tables must also be: false with why set when it is not. */
typedef bool (*element_check_t)(const void *elem, const char *where, char *why, size_t whylen);

/*
** A list of up to max tables (on top of the stack), each read by the schema's keys under
** prefix into base (stride bytes apart) and checked; *n gets how many. shape names the
** setting's form in the error for a value that is no list.
*/
static bool read_list(lua_State *L, const char *name, const char *shape, const char *prefix,
                      void *base, size_t stride, size_t max, unsigned *n, element_check_t check,
                      char *why, size_t whylen)
{
    size_t len = lua_type(L, -1) == LUA_TTABLE ? lua_rawlen(L, -1) : 0, keys = 0;
    if (lua_type(L, -1) == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            keys++;
            lua_pop(L, 1);
        }
    }
    if (lua_type(L, -1) != LUA_TTABLE || keys != len) {
        snprintf(why, whylen, "%s must be a list: %s", name, shape);
        return false;
    }
    if (len > max) {
        snprintf(why, whylen, "%s: at most %zu", name, max);
        return false;
    }
    unsigned char *elems = calloc(len ? len : 1, stride);
    if (!elems) {
        snprintf(why, whylen, "%s: out of memory", name);
        return false;
    }
    bool ok = true;
    for (size_t i = 0; ok && i < len; i++) {
        char where[48];
        snprintf(where, sizeof(where), "%s[%zu]", name, i + 1);
        void *elem = elems + i * stride;
        table_defaults(prefix, elem);
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        if (lua_type(L, -1) != LUA_TTABLE) {
            snprintf(why, whylen, "%s: a table, as in %s", where, shape);
            ok = false;
        } else {
            ok = read_table(L, where, prefix, elem, why, whylen) && check(elem, where, why, whylen);
        }
        lua_pop(L, 1);
    }
    if (ok) {
        memcpy(base, elems, len * stride);
        *n = (unsigned)len;
    }
    free(elems);
    return ok;
}

/*
** A map of up to max tables by name (on top of the stack), as { name = { ... }, ... }: each
** element's name is its first name_size bytes, the schema's keys under prefix fill it from
** keys_off on, and check (may be NULL) looks at it whole.
*/
typedef struct {
    const char *name;       /* the setting, "bridges" */
    const char *shape;      /* its form, for errors */
    const char *prefix;     /* the schema's keys of an element */
    const char *name_chars; /* the bytes a name may have; NULL: any */
    size_t stride, name_size, keys_off, max;
    element_check_t check;
} map_spec_t;

static bool read_map(lua_State *L, const map_spec_t *m, void *base, unsigned *n, char *why,
                     size_t whylen)
{
    if (lua_type(L, -1) != LUA_TTABLE) {
        snprintf(why, whylen, "%s must be a table %s", m->name, m->shape);
        return false;
    }
    unsigned char *elems = calloc(m->max, m->stride);
    if (!elems) {
        snprintf(why, whylen, "%s: out of memory", m->name);
        return false;
    }
    size_t count = 0;
    bool ok = true;
    lua_pushnil(L);
    while (ok && lua_next(L, -2)) {
        size_t len = 0;
        const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
        char where[160];
        snprintf(where, sizeof(where), "%s.%.128s", m->name, name ? name : "?");
        unsigned char *elem = elems + count * m->stride;
        if (!name || len == 0 || len >= m->name_size || strlen(name) != len ||
            (m->name_chars && strspn(name, m->name_chars) != len)) {
            snprintf(why, whylen, "%s: names are 1 to %zu %s", m->name, m->name_size - 1,
                     m->name_chars ? "of A-Z a-z 0-9 _ -" : "bytes");
            ok = false;
        } else if (count == m->max) {
            snprintf(why, whylen, "%s: at most %zu", m->name, m->max);
            ok = false;
        } else if (lua_type(L, -1) != LUA_TTABLE) {
            snprintf(why, whylen, "%s must be a table, as in %s", where, m->shape);
            ok = false;
        } else {
            table_defaults(m->prefix, elem + m->keys_off);
            memcpy(elem, name, len + 1);
            ok = read_table(L, where, m->prefix, elem + m->keys_off, why, whylen) &&
                 (!m->check || m->check(elem, where, why, whylen));
            count += ok;
        }
        lua_pop(L, 1);
    }
    if (ok) {
        memcpy(base, elems, count * m->stride);
        *n = (unsigned)count;
    } else {
        lua_pop(L, 1);
    }
    free(elems);
    return ok;
}

bool rt__conf_read_user_rates(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    static const map_spec_t m = {.name = "user_rate_limits",
                                 .shape = "{ user = { messages = n } }",
                                 .prefix = "listeners[].rate_limit",
                                 .stride = sizeof(rt_conf_user_rate_t),
                                 .name_size = sizeof(((rt_conf_user_rate_t *)0)->user),
                                 .keys_off = offsetof(rt_conf_user_rate_t, rate),
                                 .max = RT_CONF_MAX_USER_RATES};
    return read_map(L, &m, c->user_rates, &c->nuser_rates, why, whylen);
}

bool rt__conf_read_bridges(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    static const map_spec_t m = {.name = "bridges",
                                 .shape = "{ name = { remote = \"mqtt://host:port\", ... } }",
                                 .prefix = "bridges.<name>",
                                 .name_chars = NAME_CHARS,
                                 .stride = sizeof(rt_conf_bridge_t),
                                 .name_size = sizeof(((rt_conf_bridge_t *)0)->name),
                                 .max = RT_CONF_MAX_BRIDGES,
                                 .check = bridge_ok};
    return read_map(L, &m, c->bridges, &c->nbridges, why, whylen);
}

/* A tenant's own quotas are named by its mountpoint as clients get it (%u and %c filled). */
static bool tenant_ok(const void *elem, const char *where, char *why, size_t whylen)
{
    const char *mount = ((const rt_conf_tenant_t *)elem)->mount;
    size_t len = strlen(mount);
    if (mount[len - 1] == '/' && mount[0] != '$' && !strpbrk(mount, "+#%"))
        return true;
    snprintf(why, whylen,
             "%s: a tenant is named by its mountpoint, which ends with / and holds "
             "no wildcard or %%",
             where);
    return false;
}

bool rt__conf_read_tenants(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    static const map_spec_t m = {.name = "tenants",
                                 .shape = "{ [\"acme/\"] = { max_connections = n, ... } }",
                                 .prefix = "tenants.<mountpoint>",
                                 .stride = sizeof(rt_conf_tenant_t),
                                 .name_size = sizeof(((rt_conf_tenant_t *)0)->mount),
                                 .max = RT_CONF_MAX_TENANTS,
                                 .check = tenant_ok};
    return read_map(L, &m, c->tenants, &c->ntenants, why, whylen);
}

/* %c, %u and %% are auto_subscribe's placeholders: any other % is a mistake. */
static bool auto_sub_ok(const void *elem, const char *where, char *why, size_t whylen)
{
    const char *topic = ((const rt_conf_auto_sub_t *)elem)->topic;
    if (!topic[0]) {
        snprintf(why, whylen, "%s: topic is required", where);
        return false;
    }
    for (const char *p = strchr(topic, '%'); p; p = strchr(p + 2, '%'))
        if (p[1] != 'c' && p[1] != 'u' && p[1] != '%') {
            snprintf(why, whylen, "%s.topic: %%c, %%u and %%%% are its placeholders", where);
            return false;
        }
    return true;
}

bool rt__conf_read_auto_subs(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    return read_list(L, "auto_subscribe", "{ { topic = \"a/%c\", qos = 1 }, ... }",
                     "auto_subscribe[]", c->auto_subs, sizeof(c->auto_subs[0]),
                     RT_CONF_MAX_AUTO_SUBS, &c->nauto_subs, auto_sub_ok, why, whylen);
}

/* A rule's three strings given, and its expression one regcomp takes (the broker compiles it
   again when it starts). */
static bool rewrite_ok(const void *elem, const char *where, char *why, size_t whylen)
{
    const rt_conf_rewrite_t *r = elem;
    if (!r->source[0] || !r->re[0] || !r->dest[0]) {
        snprintf(why, whylen, "%s: source, re and dest are required", where);
        return false;
    }
    regex_t re;
    int rc = regcomp(&re, r->re, REG_EXTENDED);
    if (rc) {
        char err[128];
        regerror(rc, &re, err, sizeof(err));
        snprintf(why, whylen, "%s.re: %s", where, err);
        return false;
    }
    regfree(&re);
    return true;
}

/* A JWT authenticator needs its keys: one of the secret, a public key or a JWKS. */
static bool auth_ok(const void *elem, const char *where, char *why, size_t whylen)
{
    const rt_conf_auth_t *a = elem;
    int keys = !!a->secret_file[0] + !!a->public_key[0] + !!a->jwks_file[0];
    if (a->kind == RT_AUTHN_JWT && keys != 1) {
        snprintf(why, whylen,
                 "%s: a jwt authenticator takes one of secret_file, public_key and "
                 "jwks_file",
                 where);
        return false;
    }
    if (a->kind == RT_AUTHN_HTTP && (keys || strncmp(a->url, "http", 4) != 0)) {
        snprintf(why, whylen,
                 "%s: an http authenticator takes a url (http:// or https://) and "
                 "no keys",
                 where);
        return false;
    }
    if (a->kind == RT_AUTHN_FILE && keys) {
        snprintf(why, whylen, "%s: kind \"file\" reads password_file and takes no keys", where);
        return false;
    }
    return true;
}

bool rt__conf_read_auth(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    return read_list(L, "auth", "{ { kind = \"file\" }, { kind = \"jwt\", public_key = \"...\" } }",
                     "auth[]", c->auth, sizeof(c->auth[0]), RT_CONF_MAX_AUTH, &c->nauth, auth_ok,
                     why, whylen);
}

bool rt__conf_read_rewrites(lua_State *L, rt_conf_t *c, char *why, size_t whylen)
{
    return read_list(L, "rewrite",
                     "{ { action = \"publish\", source = \"x/#\", re = \"^x/(.+)$\", dest = "
                     "\"y/$1\" }, ... }",
                     "rewrite[]", c->rewrites, sizeof(c->rewrites[0]), RT_CONF_MAX_REWRITES,
                     &c->nrewrites, rewrite_ok, why, whylen);
}

/* The path keys directly under prefix, in the struct at base, made absolute against dir. */
static int resolve_keys(const char *prefix, void *base, const char *dir, const char *where,
                        char *err, size_t errlen)
{
    size_t n = strlen(prefix);
    int rc = 0;
    for (const rt_setting_t *s = rt__conf_table_settings; s->name && rc == 0; s++)
        if (s->type == RT_SET_PATH && strncmp(s->name, prefix, n) == 0 && s->name[n] == '.' &&
            !strpbrk(s->name + n + 1, ".["))
            rc = rt__conf_resolve_field((char *)base + s->offset, s->size, s->name, dir, where, err,
                                        errlen);
    return rc;
}

/* A TLS table's files, its SNI certificates' too. */
static int resolve_tls(rt_conf_tls_t *t, const char *dir, const char *where, char *err,
                       size_t errlen)
{
    int rc = resolve_keys("listeners[].tls", t, dir, where, err, errlen);
    for (unsigned i = 0; i < t->nsni && rc == 0; i++)
        rc = resolve_keys("listeners[].tls.sni[]", &t->sni[i], dir, where, err, errlen);
    return rc;
}

int rt__conf_resolve_table(rt_conf_t *c, const char *name, const char *dir, const char *where,
                           char *err, size_t errlen)
{
    int rc = 0;
    if (strcmp(name, "listeners") == 0)
        for (unsigned l = 0; l < c->nlisteners && rc == 0; l++)
            rc = resolve_tls(&c->listeners[l].tls, dir, where, err, errlen);
    if (strcmp(name, "http") == 0) {
        rc = resolve_keys("http", &c->http, dir, where, err, errlen);
        if (rc == 0)
            rc = resolve_tls(&c->http.where.tls, dir, where, err, errlen);
    }
    if (strcmp(name, "cluster") == 0)
        rc = resolve_keys("cluster", c, dir, where, err, errlen);
    if (strcmp(name, "xmpp") == 0)
        for (unsigned l = 0; l < c->xmpp.nlisteners && rc == 0; l++)
            rc = resolve_tls(&c->xmpp.listeners[l].tls, dir, where, err, errlen);
    if (strcmp(name, "bridges") == 0)
        for (unsigned b = 0; b < c->nbridges && rc == 0; b++)
            rc = resolve_keys("bridges.<name>", &c->bridges[b], dir, where, err, errlen);
    return rc;
}

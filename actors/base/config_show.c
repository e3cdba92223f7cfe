/*
** The rows `rtctl config show` gives the keys of the tables (rt_conf_each): each listener's,
** http's, the cluster's, xmpp's, each user's rate limit and each sink's, named by their place
** ("listeners[2].tls.cert", "xmpp.listeners[1].bind", "sinks.archive.batch"), with the
** schema's default.
*/
#include <string.h>

#include "common.h"
#include "config.h"
#include "config_schema.h"

/*
** s's default as config show writes values: a number in digits, a string without its quotes,
** an empty list as nothing.
*/
static void shown_default(const rt_setting_t *s, char *out, size_t n)
{
    if ((s->type == RT_SET_INT || s->type == RT_SET_NUMBER) && !s->text) {
        snprintf(out, n, "%.15g", s->num);
        return;
    }
    rt_conf_default_text(s, out, n);
    size_t len = strlen(out);
    if (len >= 2 && out[0] == '"' && out[len - 1] == '"') {
        memmove(out, out + 1, len - 2);
        out[len - 2] = 0;
    } else if (strcmp(out, "{}") == 0) {
        out[0] = 0;
    }
}

typedef struct {
    void (*fn)(const rt_conf_value_t *v, void *ud);
    void *ud;
    const char *from;   /* where the table came from */
    const rt_conf_t *c; /* whose keys */
} shower_t;

/* Names as "a, b, c". */
static void names_text(const char (*names)[RT_CONF_XMPP_HOST_MAX], unsigned n, char *out,
                       size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (unsigned i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i]);
}

/*
** A list's or networks' value at field as text, with the count beside it in its struct: a
** listener's trusted_proxies (l), xmpp's hosts, anonymous, register, plaintext_from and s2s_peers.
** false: not
*one.
*/
static bool list_text(const shower_t *sh, const char *field, const rt_listen_t *l, char *out,
                      size_t len)
{
    const rt_conf_xmpp_t *x = &sh->c->xmpp;
    if (l && field == (const char *)l->trusted_proxies)
        rt__conf_nets_text(l->trusted_proxies, l->ntrusted, out, len);
    else if (field == (const char *)x->plaintext_from)
        rt__conf_nets_text(x->plaintext_from, x->nplaintext_from, out, len);
    else if (field == (const char *)x->hosts)
        names_text(x->hosts, x->nhosts, out, len);
    else if (field == (const char *)x->anonymous)
        names_text(x->anonymous, x->nanonymous, out, len);
    else if (field == (const char *)x->registration)
        names_text(x->registration, x->nregistration, out, len);
    else if (field == (const char *)x->s2s_peers)
        names_text(x->s2s_peers, x->ns2s_peers, out, len);
    else
        return false;
    return true;
}

/*
** One row per key directly under prefix ("listeners[].tls") of the struct at base, named under
** shown ("listeners[2].tls"); l: the listener, for its trusted_proxies' count.
*/
static void show_keys(const shower_t *sh, const char *prefix, const char *shown, const void *base,
                      const rt_listen_t *l)
{
    size_t n = strlen(prefix);
    for (const rt_setting_t *s = rt__conf_table_settings; s->name; s++) {
        if (strncmp(s->name, prefix, n) != 0 || s->name[n] != '.' || strpbrk(s->name + n + 1, ".["))
            continue;
        const char *field = (const char *)base + s->offset;
        char name[128], value[RT_CONF_VALUE_LEN * 2], dflt[RT_CONF_VALUE_LEN];
        if (s->type == RT_SET_ADDRESS) {
            const rt_listen_t *at = (const rt_listen_t *)(const void *)field;
            bool v6 = strchr(at->host, ':') != NULL;
            snprintf(value, sizeof(value), "%s%s%s:%d", v6 ? "[" : "", at->host, v6 ? "]" : "",
                     at->port);
        } else if (!rt__conf_scalar_text(s, field, value, sizeof(value)) &&
                   !list_text(sh, field, l, value, sizeof(value))) {
            RT_ASSERT(s->type != RT_SET_NETS);
            continue; /* a table or a list of tables: its keys have rows of their own */
        }
        if (s->secret && value[0])
            snprintf(value, sizeof(value), "(set)");
        shown_default(s, dflt, sizeof(dflt));
        snprintf(name, sizeof(name), "%s.%s", shown, s->name + n + 1);
        sh->fn(
            &(rt_conf_value_t){
                .setting = s, .name = name, .value = value, .dflt = dflt, .from = sh->from},
            sh->ud);
    }
}

/* A sink's section and what show_sink_key needs to name its keys' rows. */
typedef struct {
    const shower_t *sh;
    const rt_conf_section_t *sec;
    char common[32], typed[64]; /* "sinks.<name>." and "sinks.<name>(TYPE)." */
} sink_rows_t;

typedef struct {
    const char *name; /* "sinks.<name>(TYPE).KEY" */
    bool found;
} lookup_t;

static void find_name(const rt_setting_t *s, void *ud)
{
    lookup_t *l = ud;
    l->found |= strcmp(s->name, l->name) == 0;
}

/* Whether the sink's type declares key itself (with its own default). */
static bool overridden(const sink_rows_t *sr, const char *key)
{
    char name[128];
    snprintf(name, sizeof(name), "%s%s", sr->typed, key);
    lookup_t l = {.name = name};
    rt_conf_schema_each(find_name, &l);
    return l.found;
}

/* The row of one key a sink of sec's type takes: set in the file, or its default. */
static void show_sink_key(const rt_setting_t *s, void *ud)
{
    const sink_rows_t *sr = ud;
    size_t n = strlen(sr->common);
    if (strncmp(s->name, sr->common, n) != 0) {
        n = strlen(sr->typed);
        if (strncmp(s->name, sr->typed, n) != 0)
            return;
    }
    const char *key = s->name + n;
    if (n == strlen(sr->common) && overridden(sr, key))
        return; /* the sink's type has a default of its own: its row is the one */
    size_t keylen = s->type == RT_SET_PREFIX ? strcspn(key, "<") : strlen(key);
    char name[RT_CONF_KEY_LEN + 80], text[RT_CONF_VALUE_LEN], dflt[RT_CONF_VALUE_LEN];
    shown_default(s, text, sizeof(text));
    const char *at = strstr(text, "<name>"); /* "<name>.db": this sink's */
    snprintf(dflt, sizeof(dflt), "%.*s%s%s", at ? (int)(at - text) : (int)strlen(text), text,
             at ? sr->sec->name : "", at ? at + strlen("<name>") : "");
    bool found = false;
    for (unsigned i = 0; i < sr->sec->nkeys; i++) {
        const rt_conf_kv_t *kv = &sr->sec->keys[i];
        bool match = s->type == RT_SET_PREFIX
                         ? strncmp(kv->key, key, keylen) == 0 && kv->key[keylen]
                         : strcmp(kv->key, key) == 0;
        if (!match)
            continue;
        found = true;
        snprintf(name, sizeof(name), "sinks.%s.%s", sr->sec->name, kv->key);
        sr->sh->fn(
            &(rt_conf_value_t){
                .setting = s, .name = name, .value = kv->str, .dflt = dflt, .from = sr->sh->from},
            sr->sh->ud);
    }
    if (found || s->type == RT_SET_PREFIX)
        return;
    snprintf(name, sizeof(name), "sinks.%s.%s", sr->sec->name, key);
    sr->sh->fn(
        &(rt_conf_value_t){
            .setting = s, .name = name, .value = dflt, .dflt = dflt, .from = "default"},
        sr->sh->ud);
}

/*
** One row per key a sink takes: its type's and the common ones (rt_sinks_schema added them to
** the schema; without them, only the rows of the keys set).
*/
static void show_section(const shower_t *sh, const rt_conf_section_t *sec)
{
    const char *type = "";
    for (unsigned i = 0; i < sec->nkeys; i++)
        if (strcmp(sec->keys[i].key, "type") == 0)
            type = sec->keys[i].str;
    sink_rows_t sr = {.sh = sh, .sec = sec};
    snprintf(sr.common, sizeof(sr.common), "sinks.<name>.");
    snprintf(sr.typed, sizeof(sr.typed), "sinks.<name>(%.40s).", type);
    rt_conf_schema_each(show_sink_key, &sr);
}

/* Each listener's keys, named under table ("xmpp.listeners[2].tls.cert"). */
static void show_listeners(const shower_t *sh, const char *table, const rt_listen_t *ls, unsigned n)
{
    char shown[64];
    for (unsigned i = 0; i < n; i++) {
        const rt_listen_t *l = &ls[i];
        snprintf(shown, sizeof(shown), "%s[%u]", table, i + 1);
        show_keys(sh, "listeners[]", shown, l, l);
        snprintf(shown, sizeof(shown), "%s[%u].rate_limit", table, i + 1);
        show_keys(sh, "listeners[].rate_limit", shown, &l->rate_limit, NULL);
        snprintf(shown, sizeof(shown), "%s[%u].tls", table, i + 1);
        if (l->tls_on)
            show_keys(sh, "listeners[].tls", shown, &l->tls, NULL);
    }
}

void rt__conf_each_key(const rt_conf_t *c, const char *table, const char *from,
                       void (*fn)(const rt_conf_value_t *v, void *ud), void *ud)
{
    shower_t sh = {fn, ud, from, c};
    char shown[160]; /* "user_rate_limits." and a user name, "tenants." and a mountpoint */
    if (strcmp(table, "listeners") == 0) {
        show_listeners(&sh, "listeners", c->listeners, c->nlisteners);
    } else if (strcmp(table, "xmpp") == 0 && c->xmpp.on) {
        show_keys(&sh, "xmpp", "xmpp", &c->xmpp, NULL);
        show_listeners(&sh, "xmpp.listeners", c->xmpp.listeners, c->xmpp.nlisteners);
    } else if (strcmp(table, "http") == 0 && c->http.on) {
        show_keys(&sh, "http", "http", &c->http, NULL);
        if (c->http.where.tls_on)
            show_keys(&sh, "listeners[].tls", "http.tls", &c->http.where.tls, NULL);
    } else if (strcmp(table, "cluster") == 0 && c->cluster.on) {
        show_keys(&sh, "cluster", "cluster", c, NULL);
    } else if (strcmp(table, "user_rate_limits") == 0) {
        for (unsigned i = 0; i < c->nuser_rates; i++) {
            snprintf(shown, sizeof(shown), "user_rate_limits.%s", c->user_rates[i].user);
            show_keys(&sh, "listeners[].rate_limit", shown, &c->user_rates[i].rate, NULL);
        }
    } else if (strcmp(table, "tenants") == 0) {
        for (unsigned i = 0; i < c->ntenants; i++) {
            snprintf(shown, sizeof(shown), "tenants.%s", c->tenants[i].mount);
            show_keys(&sh, "tenants.<mountpoint>", shown, &c->tenants[i], NULL);
        }
    } else if (strcmp(table, "auto_subscribe") == 0) {
        for (unsigned i = 0; i < c->nauto_subs; i++) {
            snprintf(shown, sizeof(shown), "auto_subscribe[%u]", i + 1);
            show_keys(&sh, "auto_subscribe[]", shown, &c->auto_subs[i], NULL);
        }
    } else if (strcmp(table, "auth") == 0) {
        for (unsigned i = 0; i < c->nauth; i++) {
            snprintf(shown, sizeof(shown), "auth[%u]", i + 1);
            show_keys(&sh, "auth[]", shown, &c->auth[i], NULL);
        }
    } else if (strcmp(table, "rewrite") == 0) {
        for (unsigned i = 0; i < c->nrewrites; i++) {
            snprintf(shown, sizeof(shown), "rewrite[%u]", i + 1);
            show_keys(&sh, "rewrite[]", shown, &c->rewrites[i], NULL);
        }
    } else if (strcmp(table, "sinks") == 0) {
        for (unsigned i = 0; i < c->sinks.n; i++)
            show_section(&sh, &c->sinks.s[i]);
    }
}

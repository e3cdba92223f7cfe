/*
** Inside the settings: the schema's tables as the loader (config.c) reads them. Only
** actors/base/config*.c include this.
*/
#ifndef RT_CONFIG_SCHEMA_H
#define RT_CONFIG_SCHEMA_H

#include <lua.h>

#include "config.h"

/* The top-level settings, NULL-terminated; a setting's index is its origin's (rt_conf_t). */
extern const rt_setting_t rt__conf_settings[];
/* The keys of the tables ("listeners[].tls.cert", "cluster.replicas"), NULL-terminated. */
extern const rt_setting_t rt__conf_table_settings[];
size_t rt__conf_nsettings(void);

/*
** Sets field to s's default when s is a scalar with one the loader need not work out (a
** string: when it has a size); leaves it alone otherwise.
*/
void rt__conf_scalar_default(const rt_setting_t *s, void *field);
/* A scalar's value at field as config show writes it; false (out untouched) for the others. */
bool rt__conf_scalar_text(const rt_setting_t *s, const void *field, char *out, size_t n);
/* Calls fn for each key of the table setting table ("listeners", "http", "xmpp"...) in c. */
void rt__conf_each_key(const rt_conf_t *c, const char *table, const char *from,
                       void (*fn)(const rt_conf_value_t *v, void *ud), void *ud);
/* Networks as "address/bits, ..." (IPv4 without its v4-mapped prefix). */
void rt__conf_nets_text(const rt_conf_net_t *nets, unsigned n, char *out, size_t len);

/* ---- The loader's parts, shared by config.c and config_tables.c ---- */
/*
** The scalar on top of the stack (s: an int, number, bool or string setting) into field, named
** name in errors ("listeners[2].tls.cert"). A string with choices and no size is stored as the
** choice's index (an int). false with why set when it is not a value of s.
*/
bool rt__conf_read_scalar(lua_State *L, const rt_setting_t *s, const char *name, void *field,
                          char *why, size_t whylen);
/* "address/bits" or a list of them (on top of the stack) into out. */
bool rt__conf_parse_nets(lua_State *L, const char *name, rt_conf_net_t *out, unsigned *nout,
                         char *why, size_t whylen);
/* The tables' values on top of the stack into c (config_tables.c). */
bool rt__conf_read_listeners(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_http(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_cluster(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_xmpp(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_user_rates(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_tenants(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_auto_subs(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_rewrites(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_auth(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
bool rt__conf_read_bridges(lua_State *L, rt_conf_t *c, char *why, size_t whylen);
/* xmpp's defaults (the table's keys not given), also what rt_conf_defaults leaves, off. */
void rt__conf_xmpp_defaults(rt_conf_xmpp_t *x);
/*
** Whether every listener (MQTT's, xmpp's, http's) has an address of its own; else why names
** both and line is the later of their lines (0: not from the file).
*/
bool rt__conf_listeners_apart(const rt_conf_t *c, char *why, size_t whylen, int *line);
/* Makes the path in field (size bytes) absolute against the directory base; "" stays "". */
int rt__conf_resolve_field(char *field, size_t size, const char *name, const char *base,
                           const char *where, char *err, size_t errlen);
/* Makes the files the table setting name (listeners, http, cluster, xmpp) names absolute. */
int rt__conf_resolve_table(rt_conf_t *c, const char *name, const char *base, const char *where,
                           char *err, size_t errlen);

#endif

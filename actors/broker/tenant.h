/*
** Tenants (docs/TENANTS.md): several teams on one broker, each under a mountpoint, a prefix
** such as "acme/" that a client's topics, filters and client id are put under on the way in
** and taken off on the way out (conn/ does that), so that one tenant sees nothing of
** another's. The mountpoint comes from the client's listener or from its login's answer,
** with %u and %c filled in. Here: that filling in, and what the broker keeps per tenant
** while any of its sessions lives: its quotas (tenant_max_connections, _subscriptions,
** _publish_rate, _retained_bytes) and its figures for the metrics and rtctl tenants.
** Safe from any thread.
*/
#ifndef RT_TENANT_H
#define RT_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum {
    RT_TENANT_CONNECTIONS,
    RT_TENANT_SUBSCRIPTIONS,
    RT_TENANT_PUBLISH_RATE,
    RT_TENANT_RETAINED_BYTES,
    RT_TENANT_QUOTAS
} rt_tenant_quota_t;
extern const char *const rt_tenant_quota_names[RT_TENANT_QUOTAS]; /* "connections", ... */

/*
** A client's mountpoint: tmpl with %u the user name (NULL: none) and %c the client id, into
** out (RT_CONF_MOUNT_MAX bytes). A name put in must be one level (no /, +, #, nor NUL), since
** "%u/" for a user "a/b" would land inside tenant "a/"'s topics. 0, or RT_EINVAL with *why.
*/
int rt_mount_expand(const char *tmpl, const char *user, const char *cid, size_t cidlen,
                    char out[RT_CONF_MOUNT_MAX], const char **why);

typedef struct rt_tenant_s rt_tenant_t;

/*
** The tenant of mountpoint mount, made when it has no session yet: a reference the caller
** gives back with rt_tenant_put. NULL when out of memory.
*/
rt_tenant_t *rt_tenant_get(const char *mount);
void rt_tenant_put(rt_tenant_t *t);
const char *rt_tenant_mount(const rt_tenant_t *t);
size_t rt_tenant_mount_len(const rt_tenant_t *t);

/*
** The quotas: each admits (and counts) one more, or refuses (false, the refusal counted).
** A connection and a subscription are given back with the calls after them. A connection
** that takes another's place (the same client id) is admitted whatever the count.
*/
bool rt_tenant_connect(rt_tenant_t *t, bool replacing);
void rt_tenant_disconnect(rt_tenant_t *t);
bool rt_tenant_subscribe(rt_tenant_t *t);
void rt_tenant_unsubscribe(rt_tenant_t *t, uint32_t n);
/* Subscriptions a session brings along when it joins its tenant (they are not refused). */
void rt_tenant_add_subscriptions(rt_tenant_t *t, uint32_t n);
/* A PUBLISH of the tenant's clients (the rate, and the count of messages in). */
bool rt_tenant_publish(rt_tenant_t *t);
/* A retained message replacing one of old_bytes with one of new_bytes under the mountpoint. */
bool rt_tenant_retain_fits(rt_tenant_t *t, size_t old_bytes, size_t new_bytes);
void rt_tenant_delivered(rt_tenant_t *t);

/* The retained store's watch (retained.h): a topic's retained bytes changed by delta. */
void rt_tenant_retained_changed(const char *topic, size_t len, ptrdiff_t delta);

/* A tenant's figures, as the metrics and rtctl tenants list them. */
typedef struct rt_tenant_info_s {
    const char *mount;
    uint64_t connections, subscriptions, retained_bytes;
    uint64_t messages_in, messages_out;
    uint64_t refused[RT_TENANT_QUOTAS];
    long limits[RT_TENANT_QUOTAS]; /* the quotas in force for it now; 0: none */
} rt_tenant_info_t;

/* Calls fn for each tenant under the table's lock (fn must not call in here); how many. */
size_t rt_tenant_each(void (*fn)(const rt_tenant_info_t *info, void *arg), void *arg);

#endif

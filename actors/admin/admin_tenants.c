/*
** `tenants list`: the tenants that have a session now (broker/tenant.h), with their
** mountpoint, what they hold against their quotas and the quotas, their messages and their
** refusals.
*/
#include "admin_impl.h"
#include "tenant.h"

static void add_tenant(const rt_tenant_info_t *t, void *arg)
{
    rt_doc_t *o = rt_doc_add_object(arg, NULL);
    if (!o)
        return;
    rt_doc_add_str(o, "tenant", t->mount);
    rt_doc_add_u64(o, "connections", t->connections);
    rt_doc_add_u64(o, "subscriptions", t->subscriptions);
    rt_doc_add_bytes(o, "retained_bytes", (int64_t)t->retained_bytes);
    rt_doc_add_u64(o, "messages_in", t->messages_in);
    rt_doc_add_u64(o, "messages_out", t->messages_out);
    uint64_t refused = 0;
    for (int q = 0; q < RT_TENANT_QUOTAS; q++)
        refused += t->refused[q];
    rt_doc_add_u64(o, "refused", refused);
    /* What it is held to now (its own quotas, else the tenant_max_* settings; 0: none). */
    rt_doc_add_i64(o, "max_connections", t->limits[RT_TENANT_CONNECTIONS]);
    rt_doc_add_i64(o, "max_subscriptions", t->limits[RT_TENANT_SUBSCRIPTIONS]);
    rt_doc_add_i64(o, "max_publish_rate", t->limits[RT_TENANT_PUBLISH_RATE]);
    rt_doc_add_i64(o, "max_retained_bytes", t->limits[RT_TENANT_RETAINED_BYTES]);
}

int rt__admin_tenants_list(rt_admin_cmd_t *c)
{
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_tenant_each(add_tenant, c->doc);
    return 200;
}

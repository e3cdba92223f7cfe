/*
** `bridges list|show|restart`: the bridges to other brokers (bridge.h), their connection,
** queue and counters, as EMQX's bridge API shows them.
*/
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "bridge.h"

static void add_bridge(rt_doc_t *o, const rt_bridge_info_t *b, bool whole)
{
    rt_doc_add_str(o, "name", b->name);
    rt_doc_add_str(o, "remote", b->remote);
    rt_doc_add_str(o, "state", b->state);
    rt_doc_add_u64(o, "queued", b->queued);
    rt_doc_add_bytes(o, "queued_bytes", (int64_t)b->queued_bytes);
    rt_doc_add_u64(o, "inflight", b->inflight);
    rt_doc_add_u64(o, "spilled", b->spilled);
    rt_doc_add_u64(o, "sent", b->sent);
    rt_doc_add_u64(o, "acked", b->acked);
    rt_doc_add_u64(o, "received", b->received);
    rt_doc_add_u64(o, "dropped", b->dropped);
    rt_doc_add_str(o, "last_error", b->last_error);
    if (!whole)
        return;
    rt_doc_add_u64(o, "version", b->version);
    rt_doc_add_u64(o, "qos", b->qos);
    rt_doc_add_bool(o, "durable", b->durable);
    rt_doc_add_u64(o, "connects", b->connects);
    rt_doc_add_u64(o, "failures", b->failures);
    rt_doc_add_u64(o, "resent", b->resent);
    rt_doc_add_u64(o, "ignored", b->ignored);
    rt_doc_add_bytes(o, "spilled_bytes", (int64_t)b->spilled_bytes);
    if (b->up_since_ms)
        rt_doc_add_i64(o, "up_since_ms", (int64_t)b->up_since_ms);
    else
        rt_doc_add_null(o, "up_since_ms");
    rt_doc_t *out = rt_doc_add_array(o, "out");
    for (unsigned i = 0; out && i < b->nout; i++)
        rt_doc_add_str(out, NULL, b->out[i]);
    rt_doc_t *in = rt_doc_add_array(o, "in");
    for (unsigned i = 0; in && i < b->nin; i++)
        rt_doc_add_str(in, NULL, b->in[i]);
}

static int snapshot(rt_admin_cmd_t *c, rt_bridge_info_t **out, size_t *n)
{
    *out = calloc(RT_CONF_MAX_BRIDGES, sizeof(**out));
    if (!*out)
        return rt__admin_fail(c, 500, "out of memory");
    *n = rt_bridges_snapshot(*out, RT_CONF_MAX_BRIDGES);
    return 0;
}

int rt__admin_bridges_list(rt_admin_cmd_t *c)
{
    rt_bridge_info_t *all;
    size_t n = 0;
    if (snapshot(c, &all, &n))
        return c->code;
    if ((c->doc = rt_doc_array()))
        for (size_t i = 0; i < n; i++)
            add_bridge(rt_doc_add_object(c->doc, NULL), &all[i], false);
    free(all);
    return c->doc ? 200 : rt__admin_fail(c, 500, "out of memory");
}

int rt__admin_bridges_show(rt_admin_cmd_t *c)
{
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: bridges show NAME");
    rt_bridge_info_t *all;
    size_t n = 0;
    if (snapshot(c, &all, &n))
        return c->code;
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i].name, c->argv[2]) == 0 && (c->doc = rt_doc_object()))
            add_bridge(c->doc, &all[i], true);
    free(all);
    return c->doc ? 200 : rt__admin_fail(c, 404, "no bridge %s", c->argv[2]);
}

int rt__admin_bridges_restart(rt_admin_cmd_t *c)
{
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: bridges restart NAME");
    if (rt_bridge_reconnect(c->argv[2]) != 0)
        return rt__admin_fail(c, 404, "no bridge %s running", c->argv[2]);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "restarted", c->argv[2]);
    return 200;
}

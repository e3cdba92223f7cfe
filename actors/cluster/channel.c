/*
** The channel (cluster.h): a layer's bytes between nodes. Out, through the cluster actor (every
** libnats call is its), on `<prefix>_ctl.all.ch` or `<prefix>_ctl.node.<name>.ch`, the sender's
*name in
** front of the bytes; in, through cluster_in to the taker. A node subscribes both subjects at
** the first heartbeat or connection after a taker is set, and before the heartbeat that tells
** the others it is up: a node heard from hears the channel too.
*/
#include "cluster_impl.h"

const char rt__cluster_channel[] = "channel";

void rt_cluster_set_channel(rt_pid_t taker)
{
    atomic_store_explicit(&rt__cluster.channel_to, taker, memory_order_release);
}

int rt_cluster_channel_send(const char *node, const void *p, size_t n)
{
    rt_pid_t out = atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire);
    if (!rt__cluster.on || !out)
        return RT_ENOPROC;
    if (n > RT_CLUSTER_CHANNEL_MAX || (node && strlen(node) >= RT_CONF_NODE_MAX))
        return RT_EINVAL;
    rt_msg_t *m = rt_msg_new(MSG_CHANNEL, sizeof(channel_t) + n);
    if (!m)
        return RT_ENOMEM;
    channel_t *c = (channel_t *)(void *)m->data;
    memset(c->to, 0, sizeof(c->to));
    if (node)
        memcpy(c->to, node, strlen(node));
    memcpy(c->data, p, n);
    int rc = rt_send_msg(out, m);
    if (rc)
        atomic_fetch_add_explicit(&rt__cluster.channel_failed, 1, memory_order_relaxed);
    return rc;
}

void rt__cluster_channel_subscribe(void)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    if (!atomic_load_explicit(&rt__cluster.channel_to, memory_order_acquire) || !rt__cluster.nc)
        return;
    for (int i = 0; i < 2; i++) {
        if (rt__cluster.channel_subs[i])
            continue;
        char subject[2 * RT_CONF_NODE_MAX + 16];
        if (i == 0)
            snprintf(subject, sizeof(subject), "%s_ctl.all.ch", rt__cluster.prefix);
        else
            snprintf(subject, sizeof(subject), "%s_ctl.node.%s.ch", rt__cluster.prefix,
                     rt__cluster.node);
        if (rt__cluster_pool_subscribe(&rt__cluster.channel_subs[i], rt__cluster.nc, subject, NULL,
                                       (void *)rt__cluster_channel, false) != NATS_OK)
            rt__cluster.channel_subs[i] = NULL; /* tried again at the next heartbeat */
    }
}

void rt__cluster_channel_publish(const rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    RT_ASSERT(m->len >= sizeof(channel_t));
    const channel_t *c = (const channel_t *)(const void *)m->data;
    size_t n = m->len - sizeof(channel_t), name = strlen(rt__cluster.node);
    char subject[2 * RT_CONF_NODE_MAX + 16];
    if (c->to[0])
        snprintf(subject, sizeof(subject), "%s_ctl.node.%.*s.ch", rt__cluster.prefix,
                 RT_CONF_NODE_MAX - 1, c->to);
    else
        snprintf(subject, sizeof(subject), "%s_ctl.all.ch", rt__cluster.prefix);
    /* The sender's name, then the bytes: one buffer, as NATS takes one. */
    char *p = malloc(1 + name + n);
    natsStatus s = NATS_NO_MEMORY;
    if (p && rt__cluster.nc) {
        p[0] = (char)name;
        memcpy(p + 1, rt__cluster.node, name);
        memcpy(p + 1 + name, c->data, n);
        s = natsConnection_Publish(rt__cluster.nc, subject, p, (int)(1 + name + n));
    }
    free(p);
    atomic_fetch_add_explicit(s == NATS_OK ? &rt__cluster.channel_out : &rt__cluster.channel_failed,
                              1, memory_order_relaxed);
}

void rt__cluster_channel_in(natsMsg *nm)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    const uint8_t *p = (const uint8_t *)natsMsg_GetData(nm);
    size_t len = (size_t)natsMsg_GetDataLength(nm);
    rt_pid_t taker = atomic_load_explicit(&rt__cluster.channel_to, memory_order_acquire);
    if (!p || !len || (size_t)p[0] >= RT_CONF_NODE_MAX || 1 + (size_t)p[0] > len) {
        atomic_fetch_add_explicit(&rt__cluster.bad_in, 1, memory_order_relaxed);
        return;
    }
    size_t name = p[0], n = len - 1 - name;
    rt_msg_t *m =
        taker ? rt_msg_new(RT_CLUSTER_MSG_CHANNEL, sizeof(rt_cluster_channel_in_t) + n) : NULL;
    if (m) {
        rt_cluster_channel_in_t *in = (rt_cluster_channel_in_t *)(void *)m->data;
        memset(in->node, 0, sizeof(in->node));
        memcpy(in->node, p + 1, name);
        memcpy(in->data, p + 1 + name, n);
    }
    if (!m || rt_send_msg(taker, m) != 0)
        atomic_fetch_add_explicit(&rt__cluster.channel_failed, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&rt__cluster.channel_in, 1, memory_order_relaxed);
}

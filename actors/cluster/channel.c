/*
** The channel (cluster.h): a layer's bytes between nodes. Out, through the cluster actor (every
** libnats call is its), on `<prefix>_ctl.all.ch` or `<prefix>_ctl.node.<name>.ch`, the sender's
*name in
** front of the bytes; in, through cluster_in to the taker. A node subscribes both subjects at
** the first heartbeat or connection after a taker is set, and before the heartbeat that tells
** the others it is up: a node heard from hears the channel too.
*/
#include "cluster_impl.h"

#define CHANNEL_BATCH_BYTES (256u << 10)

const char rt__cluster_channel[] = "channel";

/* The batch being gathered (the cluster actor's alone): its place ("" all), its messages. */
static struct {
    rt_buf_t buf; /* the sender's name, then the messages */
    char to[RT_CONF_NODE_MAX];
    size_t count;
} batch;

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

void rt__cluster_channel_flush(void)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    if (!batch.count)
        return;
    char subject[2 * RT_CONF_NODE_MAX + 16];
    if (batch.to[0])
        snprintf(subject, sizeof(subject), "%s_ctl.node.%s.ch", rt__cluster.prefix, batch.to);
    else
        snprintf(subject, sizeof(subject), "%s_ctl.all.ch", rt__cluster.prefix);
    natsStatus s =
        batch.buf.oom || !rt__cluster.nc
            ? NATS_NO_MEMORY
            : natsConnection_Publish(rt__cluster.nc, subject, batch.buf.data, (int)batch.buf.len);
    atomic_fetch_add_explicit(s == NATS_OK ? &rt__cluster.channel_out : &rt__cluster.channel_failed,
                              batch.count, memory_order_relaxed);
    rt_buf_free(&batch.buf);
    batch.count = 0;
}

void rt__cluster_channel_publish(const rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    RT_ASSERT(m->len >= sizeof(channel_t));
    const channel_t *c = (const channel_t *)(const void *)m->data;
    size_t n = m->len - sizeof(channel_t);
    if (batch.count && (strncmp(batch.to, c->to, sizeof(batch.to)) != 0 ||
                        batch.buf.len + 4 + n > CHANNEL_BATCH_BYTES))
        rt__cluster_channel_flush();
    if (!batch.count) {
        size_t name = strlen(rt__cluster.node);
        rt_buf_put_uint(&batch.buf, name, 1);
        rt_buf_add(&batch.buf, rt__cluster.node, name);
        memcpy(batch.to, c->to, sizeof(batch.to));
        batch.to[sizeof(batch.to) - 1] = 0;
    }
    rt_buf_put_bytes(&batch.buf, c->data, n);
    batch.count++;
}

void rt__cluster_channel_drop(void)
{
    atomic_fetch_add_explicit(&rt__cluster.channel_failed, batch.count, memory_order_relaxed);
    rt_buf_free(&batch.buf);
    batch.count = 0;
}

void rt__cluster_channel_in(natsMsg *nm)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    rt_reader_t r = {.p = (const uint8_t *)natsMsg_GetData(nm),
                     .len = (size_t)natsMsg_GetDataLength(nm)};
    size_t name = (size_t)rt_reader_uint(&r, 1), count = 0, n;
    const uint8_t *node = rt_reader_take(&r, name);
    size_t first = r.at;
    while (!r.bad && r.at < r.len && rt_reader_bytes(&r, &n, RT_CLUSTER_CHANNEL_MAX))
        count++;
    if (!r.p || r.bad || !count || name >= RT_CONF_NODE_MAX) {
        atomic_fetch_add_explicit(&rt__cluster.bad_in, 1, memory_order_relaxed);
        return;
    }
    rt_pid_t taker = atomic_load_explicit(&rt__cluster.channel_to, memory_order_acquire);
    rt_msg_t *m =
        taker ? rt_msg_new(RT_CLUSTER_MSG_CHANNEL, sizeof(rt_cluster_channel_in_t) + r.len - first)
              : NULL;
    if (m) {
        rt_cluster_channel_in_t *in = (rt_cluster_channel_in_t *)(void *)m->data;
        memset(in->node, 0, sizeof(in->node));
        memcpy(in->node, node, name);
        memcpy(in->data, r.p + first, r.len - first);
    }
    atomic_fetch_add_explicit(!m || rt_send_msg(taker, m) != 0 ? &rt__cluster.channel_failed
                                                               : &rt__cluster.channel_in,
                              count, memory_order_relaxed);
}

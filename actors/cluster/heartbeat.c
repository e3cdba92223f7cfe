/*
** Heartbeats (cluster.h): every node says what it holds and what its rules did once a second,
** and keeps the last word of every other node.
*/
#include "cluster_impl.h"

static rt_cluster_rule_counts_fn rule_counts;

void rt_cluster_set_rule_counts(rt_cluster_rule_counts_fn fn)
{
    rule_counts = fn;
}

/* A heartbeat's text: "key value" lines, then "rule name matched passed failed rows". */
static size_t heartbeat_text(char *out, size_t cap)
{
    rt_broker_counts_t n;
    rt_broker_counts(&n);
    int at = snprintf(out, cap,
                      "node %s\nuptime_s %" PRIu64 "\nconnections %" PRIu64 "\nsessions %" PRIu64
                      "\nroutes %" PRIu64 "\nforwarded_in %" PRIu64 "\nforwarded_out %" PRIu64 "\n",
                      rt__cluster.node, (rt_mono_ms() - rt__cluster.started_ms) / 1000,
                      n.connections.count, n.sessions.count,
                      (uint64_t)atomic_load(&rt__cluster.routes_count),
                      (uint64_t)atomic_load(&rt__cluster.forwarded_in),
                      (uint64_t)atomic_load(&rt__cluster.forwarded_out));
    static rt_cluster_rule_count_t rules[RT_CLUSTER_RULES_MAX]; /* the cluster actor's own */
    size_t nr = rule_counts ? rule_counts(rules, RT_CLUSTER_RULES_MAX) : 0;
    for (size_t i = 0; i < nr && i < RT_CLUSTER_RULES_MAX && at > 0 && (size_t)at < cap; i++)
        at += snprintf(out + at, cap - (size_t)at,
                       "rule %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", rules[i].name,
                       rules[i].matched, rules[i].passed, rules[i].failed, rules[i].rows_out);
    return at > 0 && (size_t)at < cap ? (size_t)at : 0;
}

static bool parse_heartbeat(const char *text, size_t len, rt_cluster_node_t *n)
{
    memset(n, 0, sizeof(*n));
    char line[256];
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = (size_t)((nl ? nl : end) - p);
        snprintf(line, sizeof(line), "%.*s", (int)(ll < sizeof(line) ? ll : sizeof(line) - 1), p);
        p = nl ? nl + 1 : end;
        char key[24];
        uint64_t v = 0;
        rt_cluster_rule_count_t r;
        if (sscanf(line, "rule %63s %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, r.name,
                   &r.matched, &r.passed, &r.failed, &r.rows_out) == 5) {
            if (n->nrules < RT_CLUSTER_RULES_MAX)
                n->rules[n->nrules++] = r;
        } else if (sscanf(line, "node %32s", n->node) == 1) {
        } else if (sscanf(line, "%23s %" SCNu64, key, &v) == 2) {
            if (!strcmp(key, "uptime_s"))
                n->uptime_s = v;
            else if (!strcmp(key, "connections"))
                n->connections = v;
            else if (!strcmp(key, "sessions"))
                n->sessions = v;
            else if (!strcmp(key, "routes"))
                n->routes = v;
            else if (!strcmp(key, "forwarded_in"))
                n->forwarded_in = v;
            else if (!strcmp(key, "forwarded_out"))
                n->forwarded_out = v;
        }
    }
    return n->node[0] != 0;
}

/* Keeps a node's last heartbeat (this node's own too, without a round trip). */
static void node_heard(const rt_cluster_node_t *n)
{
    pthread_mutex_lock(&rt__cluster.nodes_lock);
    size_t i = 0, forgotten = rt__cluster.nnodes;
    uint64_t now = rt_mono_ms();
    while (i < rt__cluster.nnodes && strcmp(rt__cluster.nodes[i].node, n->node) != 0) {
        if (now - rt__cluster.nodes_seen_ms[i] > RT_CLUSTER_FORGET_MS)
            forgotten = i;
        i++;
    }
    if (i == rt__cluster.nnodes)
        i = forgotten; /* a new node takes a forgotten one's slot, if any */
    if (i == rt__cluster.nnodes && rt__cluster.nnodes < RT_CLUSTER_NODES_MAX)
        rt__cluster.nnodes++;
    RT_ASSERT(rt__cluster.nnodes <= RT_CLUSTER_NODES_MAX);
    if (i < rt__cluster.nnodes) {
        rt__cluster.nodes[i] = *n;
        rt__cluster.nodes_seen_ms[i] = rt_mono_ms();
    }
    pthread_mutex_unlock(&rt__cluster.nodes_lock);
}

/* In cluster_in: another node's heartbeat (this node's own is kept as it is sent). */
void rt__cluster_other_heartbeat(natsMsg *nm)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    rt_cluster_node_t heard;
    if (parse_heartbeat(natsMsg_GetData(nm), (size_t)natsMsg_GetDataLength(nm), &heard) &&
        strcmp(heard.node, rt__cluster.node) != 0)
        node_heard(&heard);
}

static int node_order(const void *a, const void *b)
{
    return strcmp(((const rt_cluster_node_t *)a)->node, ((const rt_cluster_node_t *)b)->node);
}

size_t rt_cluster_nodes(rt_cluster_node_t *out, size_t max)
{
    pthread_mutex_lock(&rt__cluster.nodes_lock);
    uint64_t now = rt_mono_ms();
    size_t n = 0;
    for (size_t i = 0; i < rt__cluster.nnodes && n < max; i++) {
        uint64_t age = now - rt__cluster.nodes_seen_ms[i];
        if (age > RT_CLUSTER_FORGET_MS)
            continue;
        out[n] = rt__cluster.nodes[i];
        out[n].age_ms = age;
        out[n++].up = age <= RT_CLUSTER_SILENT_MS;
    }
    pthread_mutex_unlock(&rt__cluster.nodes_lock);
    qsort(out, n, sizeof(out[0]), node_order);
    return n;
}

size_t rt__cluster_others_up(char (*names)[RT_CONF_NODE_MAX], size_t max)
{
    pthread_mutex_lock(&rt__cluster.nodes_lock);
    uint64_t now = rt_mono_ms();
    size_t n = 0;
    for (size_t i = 0; i < rt__cluster.nnodes && n < max; i++)
        if (now - rt__cluster.nodes_seen_ms[i] <= RT_CLUSTER_SILENT_MS &&
            strcmp(rt__cluster.nodes[i].node, rt__cluster.node) != 0)
            snprintf(names[n++], RT_CONF_NODE_MAX, "%s", rt__cluster.nodes[i].node);
    pthread_mutex_unlock(&rt__cluster.nodes_lock);
    return n;
}

/* In the cluster actor, once a second: this node's heartbeat, published and kept. */
void rt__cluster_send_heartbeat(rt_actor_t *self)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid)); /* text[] below is its own */
    if (!rt__cluster.status_sub) {
        char all[RT_CONF_NODE_MAX + 16];
        snprintf(all, sizeof(all), "%s_ctl.status.*", rt__cluster.prefix);
        rt__cluster_pool_subscribe(&rt__cluster.status_sub, rt__cluster.nc, all, NULL,
                                   (void *)rt__cluster_heartbeat, false);
    }
    rt__cluster_channel_subscribe(); /* before the others hear this node is up */
    static char text[RT_CLUSTER_RULES_MAX * 128 + 512];
    size_t len = heartbeat_text(text, sizeof(text));
    rt_cluster_node_t me;
    if (len && parse_heartbeat(text, len, &me)) {
        node_heard(&me);
        char subject[RT_CONF_NODE_MAX * 2 + 16];
        snprintf(subject, sizeof(subject), "%s_ctl.status.%s", rt__cluster.prefix,
                 rt__cluster.node);
        natsConnection_Publish(rt__cluster.nc, subject, text, (int)len);
    }
    if (!atomic_load(&rt__cluster.stopping))
        rt_send_after_tag(RT_CLUSTER_HEARTBEAT_MS, rt_self(self), MSG_HEARTBEAT, NULL);
}

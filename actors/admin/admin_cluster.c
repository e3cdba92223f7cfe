/*
** `cluster status|nodes|rules`: the cluster as this node sees it (docs/CLUSTER.md,
** "Operating"); `cluster client` is admin_remote.c's.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "cluster.h"

/* On the blocking pool: it asks libnats, whose calls take its connection's lock. */
int rt__admin_cluster_status(rt_admin_cmd_t *c)
{
    rt_cluster_status_t st;
    if (!rt_cluster_status(&st))
        return rt__admin_fail(c, 404, "this node is in no cluster (no cluster table in rtd.conf)");
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_cluster_node_t *heard = calloc(RT_CLUSTER_NODES_MAX, sizeof(*heard));
    size_t nodes = heard ? rt_cluster_nodes(heard, RT_CLUSTER_NODES_MAX) : 0;
    free(heard);
    rt_doc_add_str(c->doc, "node", st.node);
    rt_doc_add_u64(c->doc, "nodes", nodes);
    rt_doc_add_str(c->doc, "nats", st.state);
    rt_doc_add_str(c->doc, "nats_server", st.server);
    rt_doc_add_str(c->doc, "nats_servers", st.servers);
    rt_doc_add_u64(c->doc, "routes", st.routes);
    rt_doc_add_u64(c->doc, "forwarded_out", st.forwarded_out);
    rt_doc_add_u64(c->doc, "forwarded_in", st.forwarded_in);
    rt_doc_add_u64(c->doc, "duplicates_dropped", st.duplicates);
    rt_doc_add_u64(c->doc, "forward_failed", st.forward_failed);
    rt_doc_add_u64(c->doc, "not_forwarded_too_long", st.not_forwarded);
    rt_doc_add_u64(c->doc, "bad_in", st.bad_in);
    rt_doc_add_u64(c->doc, "dropped_in", st.dropped_in);
    rt_doc_add_u64(c->doc, "inbound_backlog", st.inbound_backlog);
    rt_doc_add_u64(c->doc, "reconnects", st.reconnects);
    rt_doc_add_str(c->doc, "retained", st.retained_replicated ? "replicated" : "this node only");
    rt_doc_add_u64(c->doc, "retained_revision", st.retained_revision);
    rt_doc_add_u64(c->doc, "retained_put_failed", st.retained_put_failed);
    rt_doc_add_u64(c->doc, "retained_barrier_timeouts", st.retained_barrier_timeouts);
    rt_doc_add_u64(c->doc, "client_ids_claimed", st.claims);
    rt_doc_add_u64(c->doc, "client_ids_taken_over", st.claims_taken_over);
    rt_doc_add_u64(c->doc, "client_ids_claimed_at_once", st.claims_pipelined);
    rt_doc_add_u64(c->doc, "client_id_claims_in_flight", st.claims_in_flight);
    rt_doc_add_u64(c->doc, "client_ids_given_up", st.given_up);
    rt_doc_add_u64(c->doc, "sessions_moved_in", st.sessions_moved_in);
    rt_doc_add_u64(c->doc, "sessions_moved_out", st.sessions_moved_out);
    rt_doc_add_u64(c->doc, "sessions_move_failed", st.sessions_move_failed);
    rt_doc_add_u64(c->doc, "move_syncs_incomplete", st.move_syncs_incomplete);
    rt_doc_add_str(c->doc, "durable", st.durable ? "on" : "off");
    rt_doc_add_u64(c->doc, "stream_acked", st.stream_acked);
    rt_doc_add_u64(c->doc, "stream_failed", st.stream_failed);
    rt_doc_add_u64(c->doc, "session_records_failed", st.session_records_failed);
    rt_doc_add_u64(c->doc, "sessions_replayed", st.replays);
    rt_doc_add_u64(c->doc, "messages_replayed", st.replayed);
    rt_doc_add_u64(c->doc, "bans_applied", st.bans_applied);
    rt_doc_add_u64(c->doc, "bans_unreplicated", st.bans_failed);
    rt_doc_add_u64(c->doc, "client_id_claims_failed", st.claims_failed);
    rt_doc_add_str(c->doc, "lease", st.lease_held ? "held" : "lost");
    rt_doc_add_u64(c->doc, "lease_lapses", st.lease_lapses);
    rt_doc_add_u64(c->doc, "lease_waits", st.lease_waits);
    rt_doc_add_u64(c->doc, "stale_takeovers", st.stale_takeovers);
    rt_doc_add_u64(c->doc, "control_refused", st.control_refused);
    rt_doc_add_u64(c->doc, "channel_out", st.channel_out);
    rt_doc_add_u64(c->doc, "channel_in", st.channel_in);
    rt_doc_add_u64(c->doc, "channel_failed", st.channel_failed);
    return 200;
}

/* A row of `cluster nodes`: one node as its last heartbeat said. */
static void node_row(rt_doc_t *list, const rt_cluster_node_t *n)
{
    rt_doc_t *o = rt_doc_add_object(list, NULL);
    rt_doc_add_str(o, "node", n->node);
    rt_doc_add_bool(o, "self", strcmp(n->node, rt_cluster_node()) == 0);
    rt_doc_add_str(o, "state", n->up ? "up" : "silent");
    rt_doc_add_duration(o, "heard_ms_ago", n->age_ms, 1000);
    rt_doc_add_duration(o, "uptime_s", n->uptime_s, 1);
    rt_doc_add_u64(o, "connections", n->connections);
    rt_doc_add_u64(o, "sessions", n->sessions);
    rt_doc_add_u64(o, "routes", n->routes);
    rt_doc_add_u64(o, "forwarded_in", n->forwarded_in);
    rt_doc_add_u64(o, "forwarded_out", n->forwarded_out);
}

/* Rows of `cluster rules`: each rule's counts on one node. */
static void node_rule_rows(rt_doc_t *list, const rt_cluster_node_t *n)
{
    for (unsigned k = 0; k < n->nrules; k++) {
        const rt_cluster_rule_count_t *r = &n->rules[k];
        rt_doc_t *o = rt_doc_add_object(list, NULL);
        rt_doc_add_str(o, "node", n->node);
        rt_doc_add_str(o, "rule", r->name);
        rt_doc_add_u64(o, "matched", r->matched);
        rt_doc_add_u64(o, "passed", r->passed);
        rt_doc_add_u64(o, "failed", r->failed);
        rt_doc_add_u64(o, "rows_out", r->rows_out);
    }
}

/* A list made from every node heard from (their last heartbeats), by rows(). */
static int nodes_list(rt_admin_cmd_t *c, void (*rows)(rt_doc_t *, const rt_cluster_node_t *))
{
    if (!rt_cluster_on())
        return rt__admin_fail(c, 404, "this node is in no cluster (no cluster table in rtd.conf)");
    rt_cluster_node_t *nodes = calloc(RT_CLUSTER_NODES_MAX, sizeof(*nodes));
    if (!nodes || !(c->doc = rt_doc_array())) {
        free(nodes);
        return rt__admin_fail(c, 500, "out of memory");
    }
    size_t n = rt_cluster_nodes(nodes, RT_CLUSTER_NODES_MAX);
    for (size_t i = 0; i < n; i++)
        rows(c->doc, &nodes[i]);
    free(nodes);
    return 200;
}

int rt__admin_cluster_nodes(rt_admin_cmd_t *c)
{
    return nodes_list(c, node_row);
}

int rt__admin_cluster_rules(rt_admin_cmd_t *c)
{
    return nodes_list(c, node_rule_rows);
}

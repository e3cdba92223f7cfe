/*
** Routing: a canonical message (message.h) to every subscriber whose filter matches
** its topic, and into the retained store. The publishing connection routes its own
** PUBLISH inside its turn: it matches the shared topic trie and sends each subscriber's
** actor an RT_MSG_DELIVER carrying the one shared binary, so a fan-out copies no payload.
*/
#ifndef RT_ROUTE_H
#define RT_ROUTE_H

#include "broker.h"
#include "message.h"

/* To a subscriber's actor: data is an rt_delivery_t, bin the canonical message. */
#define RT_MSG_DELIVER (RT_BROKER_MSG_BASE + 1)

/* Subscription identifiers one delivery carries (and a session keeps per message). */
#define RT_DELIVERY_MAX_SUB_IDS 8

/* How one subscriber gets one message (the options of the subscription it matched). */
typedef struct rt_delivery_s {
    uint64_t expire_at_ms; /* when the message expiry interval runs out (monotonic); 0: never */
    rt_pid_t ack_pid;      /* the publisher waiting for this copy to be stored; 0: none */
    uint64_t ack_token;
    uint8_t qos;
    uint8_t retain;
    uint8_t shared : 1;    /* through a shared subscription */
    uint8_t acl_check : 1; /* through a subscription the ACL granted in part: check the topic */
    uint8_t timed : 1;     /* routed from a client's PUBLISH: its latency is recorded if written */
    uint32_t n_sub_ids;
    uint32_t sub_ids[]; /* MQTT 5: the matching subscriptions' identifiers */
} rt_delivery_t;

_Static_assert(sizeof(rt_delivery_t) == 32, "every copy of a message pays for its delivery");

/* Sends one delivery (at most RT_DELIVERY_MAX_SUB_IDS identifiers); QoS 0 copies without an
   ack are optional: a subscriber that is shedding (rt_shed) refuses them, counted. */
void rt_route_send(rt_pid_t to, rt_bin_t *bin, const rt_delivery_t *d, const uint32_t *sub_ids);

/* Shared subscriptions skip members whose connection has gone (rt_trie_match's alive). */
int rt_route_member_alive(void *arg, rt_pid_t pid);

/* What routing tells the publisher's acknowledgement (rt_route). */
typedef struct rt_route_out_s {
    uint32_t nacks;      /* commits ack_pid will be told of (RT_STORE_MSG_COMMITTED) */
    bool retain_refused; /* a retained message the retained store's limits refused */
} rt_route_out_t;

/*
** Routes bin from publisher (0: the broker itself). With ack_pid set, copies that
** persistent sessions keep (and a retained message) are stored first, and out (if not
** NULL) tells how many commits ack_pid will be told of (with ack_token) and whether the
** message's retained part was refused. Returns how many subscribers got it, or an RT_E*
** error.
*/
int rt_route(rt_pid_t publisher, rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token,
             rt_route_out_t *out);
/*
** A cluster (actors/cluster) sees every message rt_route routes here, but $SYS ones, once
** they are routed (fn takes its own reference to bin), and picks shared groups' members
** itself (rt_route_set_shared_by_cluster). fn returns true when it will tell
** ack_pid (not 0) of one more commit (RT_STORE_MSG_COMMITTED with ack_token): a retained
** message replicated to the other nodes. Set before any message is routed.
*/
typedef bool (*rt_route_forward_fn)(rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token,
                                    bool shared_here);
void rt_route_set_forward(rt_route_forward_fn fn);
/* The cluster names each message it will forward before any subscriber here gets it
   (rt_message_set_origin), so every node's copies carry one name. */
void rt_route_set_stamp(void (*fn)(rt_bin_t *bin));
/*
** Whether the cluster picks shared groups' members now (its NATS connections are up): then
** routing here skips them; when not, they are served here as on a node alone, and the hook
** is told (shared_here) so that no other node serves them the same message again.
*/
void rt_route_set_shared_by_cluster(bool on);
/* Routes a message another node of the cluster sent: to ordinary subscriptions and the
   retained store here, forwarded nowhere. Returns as rt_route. */
int rt_route_remote(rt_bin_t *bin);
/* Sets (bin) or clears (NULL) a topic's retained message here, as another node's
   replicated store says (expire_at_ms monotonic, 0: never); written to no disk. */
void rt_route_retain_remote(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms);
/*
** Deletes topic's retained message here, in memory and on disk, and delivers nothing (an
** empty retained PUBLISH would reach the subscribers): `rtctl retained delete`. 0, or
** RT_ENOTFOUND when none is held, RT_EINVAL for a topic that is no topic name.
*/
int rt_route_retained_delete(const char *topic, size_t len);
/* 1 if some subscriber got the message, 0 if none, or an RT_E* error. */
int rt_broker_route(rt_pid_t publisher, rt_bin_t *bin);
/*
** Publishes a message made inside the broker (republish sinks, $SYS): builds its
** canonical form and routes it as if publisher (0: none) had sent it. RT_EINVAL for
** an invalid topic name (a filter, bad UTF-8, empty) or qos > 2.
*/
int rt_broker_publish(rt_pid_t publisher, const char *topic, size_t topic_len, const void *payload,
                      size_t payload_len, uint8_t qos, uint8_t retain);

#endif

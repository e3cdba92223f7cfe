/*
** Routing (route.h): the trie match, one delivery message per matching subscriber, the
** retained store, and the broker's own publishes.
*/
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "store.h"

/* A message on its way through rt_trie_match's callback. */
typedef struct {
    rt_bin_t *bin;
    uint64_t expire_at_ms;
    rt_pid_t ack_pid; /* the publisher, when its acknowledgement waits for the store */
    uint64_t ack_token;
    uint32_t nacks; /* commits it waits for */
    uint8_t qos;
    uint8_t retain;
    uint8_t timed;            /* rt_message_timed */
    uint8_t shared_elsewhere; /* shared groups' members are picked by the cluster */
} route_t;

/* The copy for a publisher that waits for it went nowhere: it is told so (status). */
static void answer_copy(const rt_delivery_t *d, int32_t status)
{
    rt_store_committed_t done = {.token = d->ack_token, .status = status};
    if (d->ack_pid)
        rt_send(d->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
}

void rt_route_send(rt_pid_t to, rt_bin_t *bin, const rt_delivery_t *d, const uint32_t *sub_ids)
{
    size_t n = d->n_sub_ids < RT_DELIVERY_MAX_SUB_IDS ? d->n_sub_ids : RT_DELIVERY_MAX_SUB_IDS;
    rt_msg_t *m = rt_msg_new(RT_MSG_DELIVER, sizeof(rt_delivery_t) + n * sizeof(uint32_t));
    if (!m) {
        answer_copy(d, RT_ENOMEM);
        return;
    }
    rt_delivery_t *dd = (rt_delivery_t *)(void *)m->data;
    *dd = *d;
    dd->n_sub_ids = (uint32_t)n;
    memcpy(dd->sub_ids, sub_ids, n * sizeof(uint32_t));
    m->bin = rt_bin_retain(bin);
    if (d->qos == 0 && !d->ack_pid) {
        if (rt_send_optional(to, m) == RT_ELIMIT)
            atomic_fetch_add_explicit(&rt_broker->stats.msgs_dropped, 1, memory_order_relaxed);
        return;
    }
    /* A subscriber that ended since the match ended its session with it: no session lacks
       the copy (the connection layer's dead_letter answers those that arrive as it ends). */
    if (rt_send_msg(to, m) == RT_ENOPROC)
        answer_copy(d, 0);
}

/* The cluster's hand-off (rt_route_set_forward); NULL on a node alone. */
static rt_route_forward_fn forward_hook;
static void (*stamp_hook)(rt_bin_t *bin);
static atomic_bool shared_by_cluster;

void rt_route_set_stamp(void (*fn)(rt_bin_t *bin))
{
    stamp_hook = fn;
}

void rt_route_set_forward(rt_route_forward_fn fn)
{
    forward_hook = fn;
}

void rt_route_set_shared_by_cluster(bool on)
{
    atomic_store_explicit(&shared_by_cluster, on, memory_order_release);
}

static void deliver_to_subscriber(void *arg, const rt_trie_delivery_t *d)
{
    route_t *r = arg;
    /* A cluster in reach picks a shared group's member among every node's members (the
       cluster layer hands it the message), never here as well. */
    if (d->shared && r->shared_elsewhere)
        return;
    rt_delivery_t dd = {.expire_at_ms = r->expire_at_ms,
                        .qos = d->qos < r->qos ? d->qos : r->qos,
                        /* MQTT 3.3.1.3: retain is cleared on forwarding unless asked to keep it. */
                        .retain = d->retain_as_published ? r->retain : 0,
                        .shared = d->shared,
                        .acl_check = d->acl_check,
                        .timed = r->timed,
                        .n_sub_ids = (uint32_t)d->n_sub_ids};
    if (d->persistent && dd.qos && r->ack_pid) {
        dd.ack_pid = r->ack_pid;
        dd.ack_token = r->ack_token;
        r->nacks++;
    }
    rt_route_send(d->pid, r->bin, &dd, d->sub_ids);
}

int rt_route_member_alive(void *arg, rt_pid_t pid)
{
    RT_ASSERT(rt_topic_locks_held() == 1); /* the trie calls it under its lock: no calls back */
    (void)arg;
    return rt_alive(pid);
}

/*
** Match scratch space, one per thread rather than one per connection: routing
** runs inside a turn, so a thread uses one at a time, and an idle connection
** should cost as little as possible. Freed when the thread exits.
*/
static _Thread_local rt_trie_scratch_t route_scratch;
static _Thread_local bool route_scratch_ready;

static void route_scratch_free(void *s)
{
    rt_trie_scratch_destroy(s);
}

static rt_trie_scratch_t *thread_scratch(void)
{
    if (!route_scratch_ready) {
        rt_trie_scratch_init(&route_scratch);
        /* Without the hook a thread's scratch leaks at its exit; matching works either way. */
        (void)rt_thread_at_exit(route_scratch_free, &route_scratch);
        route_scratch_ready = true;
    }
    return &route_scratch;
}

/* $SYS topics are each node's own (and not worth a disk write). */
static bool node_local(const rt_message_t *msg)
{
    return msg->topic.len >= 5 && memcmp(msg->topic.p, "$SYS/", 5) == 0;
}

/* Sets (bin) or clears (NULL) topic's retained message in memory; false when refused. */
static bool set_retained(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms)
{
    rt_retained_msg_t *keep = NULL;
    if (bin) {
        keep = malloc(sizeof(*keep));
        if (!keep)
            return false;
        keep->bin = rt_bin_retain(bin);
        keep->expire_at_ms = expire_at_ms;
    }
    if (rt_retained_set(rt_broker->retained, topic, len, keep, keep ? rt_bin_len(bin) : 0) != 0) {
        atomic_fetch_add(&rt_broker->stats.retained_limit_hits, 1);
        rt_broker_retained_release(keep);
        return false;
    }
    return true;
}

void rt_route_retain_remote(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms)
{
    set_retained(topic, len, bin, expire_at_ms);
}

static void count_match(void *arg, const char *topic, size_t len, void *msg)
{
    (void)topic;
    (void)len;
    (void)msg;
    ++*(size_t *)arg;
}

int rt_route_retained_delete(const char *topic, size_t len)
{
    size_t held = 0;
    /* A topic name is a filter that matches itself alone. */
    if (!rt_topic_valid_name(topic, len))
        return RT_EINVAL;
    rt_retained_match(rt_broker->retained, topic, len, count_match, &held, NULL);
    if (!held)
        return RT_ENOTFOUND;
    set_retained(topic, len, NULL, 0);
    if (rt_store_enabled() && !(len >= 5 && memcmp(topic, "$SYS/", 5) == 0))
        rt_store_retain(topic, len, NULL, 0, 0, 0);
    return 0;
}

/*
** A retained PUBLISH replaces the topic's retained message; an empty one clears
** it. What the store accepted in memory is written to disk too ($SYS values,
** remade every interval, are not worth a disk write). Returns RT_ELIMIT when the
** retained store's limits refused it, else whether the publisher's acknowledgement waits
** for that write.
*/
static int keep_retained(const rt_message_t *msg, const route_t *r)
{
    mqtt_str_t topic = msg->topic;
    bool clear = msg->payload.len == 0;
    if (!set_retained((const char *)topic.p, topic.len, clear ? NULL : r->bin, r->expire_at_ms))
        return RT_ELIMIT;
    if (!rt_store_enabled() || node_local(msg))
        return 0;
    rt_store_retain((const char *)topic.p, topic.len, clear ? NULL : r->bin, r->expire_at_ms,
                    r->ack_pid, r->ack_token);
    return r->ack_pid != 0;
}

static int route_here(rt_pid_t publisher, rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token,
                      rt_route_out_t *out, bool forward)
{
    rt_message_t msg;
    rt_message_view(bin, &msg);
    route_t r = {.bin = bin,
                 .qos = msg.qos,
                 .retain = msg.retain,
                 .ack_pid = ack_pid,
                 .ack_token = ack_token,
                 .timed = rt_message_timed(bin),
                 /* Another node's message reached this node's shared groups through
                    NATS's queue groups, or was served on its own node: never here too. */
                 .shared_elsewhere =
                     !forward || atomic_load_explicit(&shared_by_cluster, memory_order_acquire)};
    /* The expiry interval counts from here; each subscriber sends what is left (3.3.2.3.3). */
    if (msg.has_expiry && msg.expiry)
        r.expire_at_ms = rt_mono_ms() + (uint64_t)msg.expiry * 1000;
    if (forward && stamp_hook && !node_local(&msg))
        stamp_hook(bin);
    size_t delivered = 0;
    rt_trie_match(rt_broker->trie, (const char *)msg.topic.p, msg.topic.len, publisher,
                  rt_route_member_alive, deliver_to_subscriber, &r, thread_scratch(), &delivered);
    int kept = msg.retain ? keep_retained(&msg, &r) : 0;
    if (kept > 0)
        r.nacks++;
    if (forward && forward_hook && !node_local(&msg) &&
        forward_hook(bin, ack_pid, ack_token, !r.shared_elsewhere))
        r.nacks++;
    if (out)
        *out = (rt_route_out_t){.nacks = r.nacks, .retain_refused = kept == RT_ELIMIT};
    return (int)(delivered < INT32_MAX ? delivered : INT32_MAX);
}

int rt_route(rt_pid_t publisher, rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token,
             rt_route_out_t *out)
{
    return route_here(publisher, bin, ack_pid, ack_token, out, true);
}

int rt_route_remote(rt_bin_t *bin)
{
    return route_here(0, bin, 0, 0, NULL, false);
}

int rt_broker_route(rt_pid_t publisher, rt_bin_t *bin)
{
    int n = rt_route(publisher, bin, 0, 0, NULL);
    return n < 0 ? n : n > 0;
}

int rt_broker_publish(rt_pid_t publisher, const char *topic, size_t topic_len, const void *payload,
                      size_t payload_len, uint8_t qos, uint8_t retain)
{
    if (qos > 2 || !rt_topic_valid_name(topic, topic_len) || payload_len > MQTT_MAX_PACKET)
        return RT_EINVAL;
    mqtt_packet_t pk = {.type = MQTT_PUBLISH, .version = MQTT_V5};
    pk.publish.topic = (mqtt_str_t){(const uint8_t *)topic, (uint32_t)topic_len};
    pk.publish.payload = (mqtt_str_t){payload, (uint32_t)payload_len};
    pk.publish.qos = qos;
    pk.publish.retain = retain;
    rt_bin_t *bin = rt_message_new(&pk, NULL, NULL); /* the broker's own: no client */
    if (!bin)
        return RT_ENOMEM;
    int rc = rt_broker_route(publisher, bin);
    rt_bin_release(bin);
    return rc < 0 ? rc : 0;
}

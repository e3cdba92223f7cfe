/*
** The $SYS actor (sys.h): each tick it reads the broker's counters and publishes
** those that changed as retained messages under $SYS/broker/.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "group.h"
#include "route.h"
#include "sys.h"

#define SYS_PREFIX "$SYS/broker/"
#define SYS_PAYLOAD_MAX 48 /* bytes of one value ("18446744073709551615 seconds" fits) */
#define SYS_SLOTS 64       /* topics the tree can hold (47 now); publish_changed() asserts it */
#define MSG_SYS_TICK (RT_MSG_USER + 1)

/*
** Counters with a load average (Mosquitto's $SYS/broker/load/<name>/1min|5min|15min:
** the per-minute rate over each interval, decayed exponentially with a time
** constant of 1, 5 and 15 minutes).
*/
enum { C_MSGS_IN, C_MSGS_OUT, C_BYTES_IN, C_BYTES_OUT, C_CONNECTS, C_ACCEPTED, NCOUNTERS };

typedef struct {
    const char *total; /* topic of the running total, or NULL */
    const char *load;  /* load/<load>/... */
} counter_t;

static const counter_t counters[NCOUNTERS] = {
    [C_MSGS_IN] = {"messages/received", "messages/received"},
    [C_MSGS_OUT] = {"messages/sent", "messages/sent"},
    [C_BYTES_IN] = {"bytes/received", "bytes/received"},
    [C_BYTES_OUT] = {"bytes/sent", "bytes/sent"},
    [C_CONNECTS] = {NULL, "connections"},
    [C_ACCEPTED] = {"connections/accepted", "sockets"},
};

static const double load_minutes[3] = {1, 5, 15};
static const char *const load_names[3] = {"1min", "5min", "15min"};

typedef struct {
    const char *version;
    uint64_t interval_ms;
    uint64_t start_ms; /* CLOCK_MONOTONIC when the actor started */
    uint64_t last_ms;  /* the previous tick */
    uint64_t max_heap;
    uint64_t prev[NCOUNTERS];  /* counter values at the previous tick */
    double load[NCOUNTERS][3]; /* decayed messages (or bytes, connections) per minute */
    bool ticked;               /* prev and last_ms hold a previous tick */
    unsigned slot;             /* publish_changed()'s cursor through last[] during a tick */
    char last[SYS_SLOTS][SYS_PAYLOAD_MAX]; /* payload last published per topic; "" none */
} sys_t;

/* What each start of the actor reads: kept for restarts, so uptime counts from the first. */
typedef struct {
    const char *version;
    long interval_s;
    uint64_t start_ms; /* CLOCK_MONOTONIC when rt_sys_start ran */
} sys_arg_t;

static sys_arg_t sys_arg;

/*
** Publishes payload (NULL: skip) under $SYS/broker/suffix if it differs from what
** this topic last carried. Each tick calls it for the same topics in the same
** order, so the call's position names the topic's slot.
*/
static void publish_changed(sys_t *s, const char *suffix, const char *payload)
{
    unsigned slot = s->slot++;
    RT_ASSERT(slot < SYS_SLOTS); /* a topic added without raising SYS_SLOTS */
    if (slot >= SYS_SLOTS || !payload || strcmp(s->last[slot], payload) == 0)
        return;
    char topic[128];
    int n = snprintf(topic, sizeof(topic), SYS_PREFIX "%s", suffix);
    RT_ASSERT(n > 0 && (size_t)n < sizeof(topic));
    if (rt_broker_publish(0, topic, (size_t)n, payload, strlen(payload), 0, 1) == 0)
        snprintf(s->last[slot], sizeof(s->last[slot]), "%s", payload);
}

static void publish_changed_u64(sys_t *s, const char *suffix, uint64_t v)
{
    char buf[SYS_PAYLOAD_MAX];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    publish_changed(s, suffix, buf);
}

static uint64_t stat_value(atomic_uint_fast64_t *v)
{
    return (uint64_t)atomic_load_explicit(v, memory_order_relaxed);
}

/*
** Bytes the broker holds that are accounted somewhere: actor structs and
** states, heap chunks handed to actors, shared binaries (messages), the topic
** trie and the retained store. Memory connection actors malloc themselves
** (subscription lists, partial packets) and large heap objects are not counted.
*/
static uint64_t heap_bytes(void)
{
    rt_stats_t rs;
    rt_stats(&rs);
    size_t mapped, chunks, bins, retained;
    rt_heap_pool_stats(&mapped, &chunks);
    rt_bin_totals(NULL, &bins);
    rt_trie_stats_t ts;
    rt_trie_stats(rt_broker->trie, &ts);
    rt_retained_stats(rt_broker->retained, NULL, NULL, &retained);
    return (uint64_t)rs.actor_bytes_in_use + chunks + bins + ts.bytes + retained;
}

/* Folds the interval's rates into the load averages and publishes them. */
static void publish_loads(sys_t *s, const uint64_t now[NCOUNTERS], double dt_s)
{
    char buf[SYS_PAYLOAD_MAX];
    char suffix[96];
    for (int c = 0; c < NCOUNTERS; c++) {
        double per_min = dt_s > 0 ? (double)(now[c] - s->prev[c]) * 60.0 / dt_s : 0;
        for (int k = 0; k < 3; k++) {
            double decay = exp(-dt_s / (60.0 * load_minutes[k]));
            s->load[c][k] = per_min + decay * (s->load[c][k] - per_min);
            snprintf(buf, sizeof(buf), "%.2f", s->load[c][k]);
            snprintf(suffix, sizeof(suffix), "load/%s/%s", counters[c].load, load_names[k]);
            publish_changed(s, suffix, s->ticked ? buf : NULL);
        }
    }
}

static void sys_tick(sys_t *s)
{
    rt_broker_stats_t *st = &rt_broker->stats;
    uint64_t now_ms = rt_mono_ms();
    s->slot = 0;

    char buf[SYS_PAYLOAD_MAX];
    snprintf(buf, sizeof(buf), "rtd version %s", s->version);
    publish_changed(s, "version", buf);
    /* A cluster's node: each node's $SYS tree is its own (docs/CLUSTER.md). */
    publish_changed(s, "node", rt_broker->conf.cluster.on ? rt_broker->conf.cluster.node : NULL);
    snprintf(buf, sizeof(buf), "%llu seconds", (unsigned long long)((now_ms - s->start_ms) / 1000));
    publish_changed(s, "uptime", buf);

    rt_broker_counts_t bc;
    rt_broker_counts(&bc);
    uint64_t connected = bc.connections.count, sessions = bc.sessions.count;
    publish_changed_u64(s, "clients/connected", connected);
    /* Read apart, the two may disagree for a moment while a client connects. */
    publish_changed_u64(s, "clients/disconnected", sessions > connected ? sessions - connected : 0);
    publish_changed_u64(s, "clients/maximum", bc.connections.max);
    publish_changed_u64(s, "clients/total", sessions);

    rt_broker_metrics_t bm;
    rt_broker_metrics(&bm);
    uint64_t now[NCOUNTERS] = {
        [C_MSGS_IN] = bm.msgs_in,
        [C_MSGS_OUT] = bm.msgs_out,
        [C_BYTES_IN] = bm.bytes_in,
        [C_BYTES_OUT] = bm.bytes_out,
        [C_CONNECTS] = stat_value(&st->connects),
        [C_ACCEPTED] = stat_value(&st->accepted),
    };
    for (int c = 0; c < NCOUNTERS; c++)
        if (counters[c].total)
            publish_changed_u64(s, counters[c].total, now[c]);
    publish_changed_u64(s, "messages/dropped", bm.msgs_dropped);
    publish_changed_u64(s, "messages/expired", bm.msgs_expired);
    publish_changed_u64(s, "bad_packets", stat_value(&st->bad_packets));
    publish_changed_u64(s, "tolerated/v31_subscribe_flags", stat_value(&st->v31_sub_flags));
    /* Limits the connection actors enforce: how often each refused something. */
    publish_changed_u64(s, "limits/topic", stat_value(&st->topic_limit_hits));
    publish_changed_u64(s, "limits/subscriptions", stat_value(&st->subs_limit_hits));
    publish_changed_u64(s, "limits/retained", stat_value(&st->retained_limit_hits));

    publish_changed_u64(s, "subscriptions/count", bc.subscriptions.count);
    publish_changed_u64(s, "shared_subscriptions/count", bc.shared_groups);
    publish_changed_u64(s, "retained messages/count", bc.retained.count);

    uint64_t heap = heap_bytes();
    if (heap > s->max_heap)
        s->max_heap = heap;
    publish_changed_u64(s, "heap/current", heap);
    publish_changed_u64(s, "heap/maximum", s->max_heap);

    publish_changed_u64(s, "connections/sockets", stat_value(&st->sockets));
    publish_changed_u64(s, "connections/refused/total", stat_value(&st->refused));
    publish_changed_u64(s, "connections/refused/max_connections",
                        stat_value(&st->refused_max_conns));
    publish_changed_u64(s, "connections/refused/per_ip", stat_value(&st->refused_per_ip));
    publish_changed_u64(s, "connections/refused/rate", stat_value(&st->refused_rate));
    publish_changed_u64(s, "connections/refused/error", stat_value(&st->refused_error));
    publish_changed_u64(s, "connections/refused/untrusted_proxy",
                        stat_value(&st->refused_untrusted));
    publish_changed_u64(s, "connections/refused/fd_reserve", stat_value(&st->refused_fds));
    publish_changed_u64(s, "connections/tls_failed", stat_value(&st->tls_failed));
    publish_changed_u64(s, "connections/connect_timeouts", stat_value(&st->connect_timeouts));
    publish_changed_u64(s, "clients/rate_limited", stat_value(&st->rate_limited));

    publish_loads(s, now, s->ticked ? (double)(now_ms - s->last_ms) / 1000.0 : 0);
    memcpy(s->prev, now, sizeof(now));
    s->last_ms = now_ms;
    s->ticked = true;
}

static int sys_init(rt_actor_t *self, void *state, void *arg)
{
    sys_t *s = state;
    const sys_arg_t *a = arg;
    s->version = a->version;
    s->interval_ms = (uint64_t)a->interval_s * 1000;
    s->start_ms = a->start_ms;
    /* The tree appears at once; the loads start after the first interval. */
    return rt_send(rt_self(self), MSG_SYS_TICK, NULL, 0);
}

static void sys_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    sys_t *s = state;
    if (m->tag != MSG_SYS_TICK)
        return;
    sys_tick(s);
    rt_send_after_tag(s->interval_ms, rt_self(self), MSG_SYS_TICK, NULL);
}

static const char *sys_tag_name(uint32_t tag)
{
    return tag == MSG_SYS_TICK ? "tick" : NULL;
}

static const rt_actor_type_t sys_type = {
    .name = "sys",
    .state_size = sizeof(sys_t),
    .init = sys_init,
    .handle = sys_handle,
    .tag_name = sys_tag_name,
};

int rt_sys_start(const rt_conf_t *conf, const char *version, rt_pid_t sup)
{
    RT_ASSERT(rt_broker); /* its ticks read the broker's state */
    if (conf->sys_interval <= 0)
        return 0;
    sys_arg = (sys_arg_t){version, conf->sys_interval, rt_mono_ms()};
    rt_child_spec_t c = {
        .name = RT_SYS_NAME, .type = &sys_type, .arg = &sys_arg, .restart = RT_PERMANENT};
    return rt_group_start_one(sup, RT_SYS_GROUP, RT_TEMPORARY, &c);
}

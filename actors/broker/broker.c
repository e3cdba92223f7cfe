/*
** The broker's shared state (broker.h): made at start and freed after the
** runtime stops; the client table that maps client ids to their actors; the
** per-thread traffic metrics; the limits an administrator changes live.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "banned.h"
#include "broker.h"
#include "rewrite.h"
#include "tenant.h"
#include "log.h"

rt_broker_t *rt_broker;

#define CLIENTS_CAP_MIN 1024 /* the client table's first slot count (a power of 2) */

/*
** One client table slot: 16 bytes and no allocation per client. The id is the holder's
** own string (broker.h says for how long it must stay), so the table copies nothing.
*/
typedef struct rt_client_slot_s {
    const char *id; /* NULL: the slot is free */
    rt_pid_t pid;
} rt_client_slot_t;

static void live_init(rt_broker_t *b);
static void metrics_reset(void);

/* Whether no actor runs that could reach the broker's state. */
static inline bool no_actor_alive(void)
{
    rt_stats_t st;
    rt_stats(&st);
    return st.alive == 0;
}

/* ---- State ---- */

int rt_broker_init(const rt_conf_t *conf)
{
    /* One broker at a time: no connection counts while metrics_reset clears the blocks. */
    RT_ASSERT(!rt_broker);
    rt_broker_t *b = calloc(1, sizeof(*b));
    if (!b)
        return RT_ENOMEM;
    b->conf = *conf;
    const char *policy = conf->client_memory_policy;
    b->memory_policy = !strcmp(policy, "drop_oldest")   ? RT_MEMORY_DROP_OLDEST
                       : !strcmp(policy, "drop_newest") ? RT_MEMORY_DROP_NEWEST
                                                        : RT_MEMORY_HOLD;
    pthread_mutex_init(&b->clients_lock, NULL);
    b->clients_cap = CLIENTS_CAP_MIN;
    b->clients = calloc(b->clients_cap, sizeof(*b->clients));
    if (!b->clients || rt_trie_new(&b->trie) ||
        rt_retained_new(&b->retained, rt_broker_retained_release,
                        (size_t)conf->max_retained_messages, (size_t)conf->max_retained_bytes)) {
        rt_trie_free(b->trie);
        free(b->clients);
        free(b);
        return RT_ENOMEM;
    }
    rt_retained_watch(b->retained, rt_tenant_retained_changed);
    char err[256];
    int rc = rt_rewrite_init(&b->conf, err, sizeof(err)); /* its rules point into b->conf */
    if (rc) {
        rt_log(RT_LOG_ERROR, "broker.rewrite_refused", "%s", err);
        rt_retained_free(b->retained);
        rt_trie_free(b->trie);
        free(b->clients);
        free(b);
        return rc;
    }
    rt_broker = b;
    live_init(b);
    metrics_reset();
    return 0;
}

void rt_broker_free(void)
{
    rt_broker_t *b = rt_broker;
    if (!b)
        return;
    RT_ASSERT(no_actor_alive());
    rt_banned_free();
    rt_rewrite_free();
    free(b->clients);
    rt_trie_free(b->trie);
    rt_retained_free(b->retained);
    pthread_mutex_destroy(&b->clients_lock);
    free(b);
    rt_broker = NULL;
}

void rt_broker_retained_release(void *msg)
{
    rt_retained_msg_t *r = msg;
    if (!r)
        return;
    rt_bin_release(r->bin);
    free(r);
}

/* ---- Counts ---- */

void rt_broker_counts(rt_broker_counts_t *out)
{
    rt_broker_stats_t *st = &rt_broker->stats;
    rt_trie_stats_t ts;
    rt_trie_stats(rt_broker->trie, &ts);
    size_t retained, bytes, retained_max, bytes_max;
    rt_retained_stats(rt_broker->retained, &retained, &bytes, NULL);
    rt_retained_peaks(rt_broker->retained, &retained_max, &bytes_max);
    *out = (rt_broker_counts_t){
        .connections = {atomic_load_explicit(&st->connections, memory_order_relaxed),
                        atomic_load_explicit(&st->connections_max, memory_order_relaxed)},
        .sessions = {atomic_load_explicit(&st->sessions, memory_order_relaxed),
                     atomic_load_explicit(&st->sessions_max, memory_order_relaxed)},
        .topics = {ts.filters, ts.filters_max},
        .subscriptions = {ts.subs, ts.subs_max},
        .retained = {retained, retained_max},
        .retained_bytes = {bytes, bytes_max},
        .shared_groups = ts.groups,
    };
}

void rt__broker_count_socket(unsigned listener, int delta)
{
    rt_broker_t *b = rt_broker;
    RT_ASSERT(listener < RT_CONF_ALL_LISTENERS);
    if (delta > 0) {
        atomic_fetch_add(&b->stats.sockets, 1);
        atomic_fetch_add(&b->listener_stats[listener].connections, 1);
    } else {
        atomic_fetch_sub(&b->stats.sockets, 1);
        atomic_fetch_sub(&b->listener_stats[listener].connections, 1);
    }
}

bool rt_broker_preauth_charge(int64_t bytes)
{
    _Atomic int64_t *held = &rt_broker->stats.preauth_bytes;
    int64_t was = atomic_fetch_add_explicit(held, bytes, memory_order_relaxed);
    if (bytes < 0 || was + bytes <= RT_LIVE(max_preauth_memory))
        return true;
    atomic_fetch_sub_explicit(held, bytes, memory_order_relaxed);
    return false;
}

const char *const rt_auth_failed_names[RT_AUTH_FAILED_REASONS] = {
    [RT_AUTH_FAILED_BAD_PASSWORD] = "bad_password",
    [RT_AUTH_FAILED_UNKNOWN_USER] = "unknown_user",
    [RT_AUTH_FAILED_ANONYMOUS] = "anonymous_refused",
    [RT_AUTH_FAILED_NO_CERT_NAME] = "no_certificate_identity",
    [RT_AUTH_FAILED_UNAVAILABLE] = "unavailable",
};

const char *rt_broker_listener_protocol(unsigned index)
{
    const rt_listen_t *l = rt_conf_listener(&rt_broker->conf, index);
    if (!l)
        return "";
    if (index == RT_CONF_HTTP_LISTENER)
        return l->tls_on ? "https" : "http";
    bool xmpp = index >= RT_CONF_XMPP_LISTENER(0);
    if (xmpp && l->starttls)
        return "xmpp/starttls";
    static const char *const names[2][4] = {{"mqtt/tcp", "mqtt/tls", "mqtt/ws", "mqtt/wss"},
                                            {"xmpp/tcp", "xmpp/tls", "xmpp/ws", "xmpp/wss"}};
    return names[xmpp][(l->websocket[0] ? 2 : 0) + (l->tls_on ? 1 : 0)];
}

static void listener_info(unsigned index, const rt_listen_t *l, rt_listener_info_t *o)
{
    rt_listener_stats_t *st = &rt_broker->listener_stats[index];
    memset(o, 0, sizeof(*o));
    o->index = index;
    snprintf(o->address, sizeof(o->address), "%s", l->host);
    o->port = atomic_load(&st->port);
    o->protocol = rt_broker_listener_protocol(index);
    o->proxy_protocol = l->proxy_protocol;
    o->running = atomic_load(&st->running);
    o->connections = atomic_load(&st->connections);
    o->accepted = atomic_load(&st->accepted);
    o->refused = atomic_load(&st->refused[RT_REFUSED_ALL]);
    o->refused_max_connections = atomic_load(&st->refused[RT_REFUSED_MAX_CONNS]);
    o->refused_per_ip = atomic_load(&st->refused[RT_REFUSED_PER_IP]);
    o->refused_rate = atomic_load(&st->refused[RT_REFUSED_RATE]);
    o->refused_error = atomic_load(&st->refused[RT_REFUSED_ERROR]);
    o->refused_untrusted = atomic_load(&st->refused[RT_REFUSED_UNTRUSTED]);
    o->refused_fds = atomic_load(&st->refused[RT_REFUSED_FDS]);
    o->acl_denied_publish = atomic_load(&st->acl_denied[RT_ACL_DENIED_PUBLISH]);
    o->acl_denied_subscribe = atomic_load(&st->acl_denied[RT_ACL_DENIED_SUBSCRIBE]);
    o->max_connections = RT_LIVE(max_connections);
}

size_t rt_broker_listeners(rt_listener_info_t *out, size_t max)
{
    const rt_conf_t *conf = &rt_broker->conf;
    size_t n = 0;
    for (unsigned i = 0; i < RT_CONF_ALL_LISTENERS; i++) {
        const rt_listen_t *l = i == RT_CONF_HTTP_LISTENER ? NULL : rt_conf_listener(conf, i);
        if (l && n < max)
            listener_info(i, l, &out[n]);
        n += l != NULL;
    }
    return n;
}

/* ---- Client table ---- */

/*
** clients_lock, with its holder noted in debug builds: the table's helpers check
** that their caller holds it, and its entry points that theirs does not (an fn of
** rt_broker_clients_each calling one would deadlock on the non-recursive lock).
*/
#ifndef NDEBUG
static _Thread_local char this_thread; /* its address names the calling thread */
#define CLIENTS_HELD(b)                                                                            \
    (atomic_load_explicit(&(b)->clients_holder, memory_order_relaxed) == &this_thread)
#endif

static void clients_lock(rt_broker_t *b)
{
    RT_ASSERT(!CLIENTS_HELD(b));
    pthread_mutex_lock(&b->clients_lock);
#ifndef NDEBUG
    atomic_store_explicit(&b->clients_holder, &this_thread, memory_order_relaxed);
#endif
}

static void clients_unlock(rt_broker_t *b)
{
    RT_ASSERT(CLIENTS_HELD(b));
#ifndef NDEBUG
    atomic_store_explicit(&b->clients_holder, NULL, memory_order_relaxed);
#endif
    pthread_mutex_unlock(&b->clients_lock);
}

/* Client ids are the client's choice: the keyed hash keeps their collisions unplannable. */
static size_t client_home(const char *id, size_t cap)
{
    return (size_t)rt_hash(id, strlen(id)) & (cap - 1);
}

/* The slot holding id, or the free slot where it would go (the table is never full). */
static rt_client_slot_t *find_slot(rt_broker_t *b, const char *id)
{
    RT_ASSERT(CLIENTS_HELD(b));
    size_t mask = b->clients_cap - 1;
    for (size_t i = client_home(id, b->clients_cap);; i = (i + 1) & mask) {
        rt_client_slot_t *s = &b->clients[i];
        if (!s->id || strcmp(s->id, id) == 0)
            return s;
    }
}

/*
** Rehashes into cap slots: doubled once three quarters are full, halved once fewer than an
** eighth are (so 19,000 clients gone give back their 512 KiB); a failed resize keeps the
** old slots.
*/
static void resize_clients(rt_broker_t *b, size_t cap)
{
    RT_ASSERT(CLIENTS_HELD(b));
    size_t mask = cap - 1;
    rt_client_slot_t *ns = calloc(cap, sizeof(*ns));
    if (!ns)
        return;
    for (size_t i = 0; i < b->clients_cap; i++) {
        const rt_client_slot_t *s = &b->clients[i];
        if (!s->id)
            continue;
        size_t k = client_home(s->id, cap);
        while (ns[k].id)
            k = (k + 1) & mask;
        ns[k] = *s;
    }
    free(b->clients);
    b->clients = ns;
    b->clients_cap = cap;
}

/*
** Empties slot i, then moves later entries of its probe run back into the hole where
** their probe from home would otherwise stop short of them (no tombstones).
*/
static void delete_slot(rt_broker_t *b, size_t i)
{
    RT_ASSERT(CLIENTS_HELD(b));
    size_t mask = b->clients_cap - 1;
    for (size_t j = (i + 1) & mask; b->clients[j].id; j = (j + 1) & mask) {
        size_t home = client_home(b->clients[j].id, b->clients_cap);
        /* j's entry may fill the hole at i unless its home lies cyclically in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            b->clients[i] = b->clients[j];
            i = j;
        }
    }
    b->clients[i] = (rt_client_slot_t){NULL, 0};
}

rt_pid_t rt_broker_claim_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    rt_pid_t old = 0;
    clients_lock(b);
    if ((b->clients_len + 1) * 4 > b->clients_cap * 3)
        resize_clients(b, b->clients_cap * 2);
    rt_client_slot_t *s = find_slot(b, id);
    if (s->id) {
        old = s->pid;
        *s = (rt_client_slot_t){id, pid};             /* the old holder may free its string now */
    } else if (b->clients_len + 1 < b->clients_cap) { /* a free slot must stay to end probes */
        *s = (rt_client_slot_t){id, pid};
        b->clients_len++;
    }
    clients_unlock(b);
    return old;
}

rt_pid_t rt_broker_lookup_client(const char *id)
{
    rt_broker_t *b = rt_broker;
    clients_lock(b);
    rt_pid_t pid = find_slot(b, id)->pid;
    clients_unlock(b);
    return pid;
}

void rt_broker_release_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    clients_lock(b);
    rt_client_slot_t *s = find_slot(b, id);
    if (s->id && s->pid == pid) {
        delete_slot(b, (size_t)(s - b->clients));
        b->clients_len--;
        if (b->clients_cap > CLIENTS_CAP_MIN && b->clients_len * 8 < b->clients_cap)
            resize_clients(b, b->clients_cap / 2);
    }
    clients_unlock(b);
}

size_t rt_broker_clients_each(void (*fn)(const char *id, rt_pid_t pid, void *ud), void *ud)
{
    rt_broker_t *b = rt_broker;
    size_t n = 0;
    clients_lock(b);
    for (size_t i = 0; i < b->clients_cap; i++) {
        if (b->clients[i].id) {
            fn(b->clients[i].id, b->clients[i].pid, ud);
            n++;
        }
    }
    clients_unlock(b);
    return n;
}

typedef struct {
    rt_pid_t *pids;
    size_t n, cap, limit;
    bool oom;
} pids_t;

static void collect_pid(const char *id, rt_pid_t pid, void *ud)
{
    (void)id;
    pids_t *p = ud;
    if (p->n == p->limit || p->oom)
        return;
    if (rt_grow(&p->pids, &p->cap, p->n + 1, sizeof(*p->pids), 256) != 0) {
        p->oom = true;
        return;
    }
    p->pids[p->n++] = pid;
}

/*
** A page of the client table: the `limit` smallest ids after `after` that start with prefix,
** kept in a max-heap by id (the largest on top, replaced by a smaller one), so a walk under
** the lock is one comparison per client and a few for each kept one.
*/
typedef struct {
    char *id; /* malloc */
    rt_pid_t pid;
} page_entry_t;

typedef struct {
    page_entry_t *heap;
    size_t n, limit;
    const char *prefix, *after;
    size_t prefix_len;
    bool oom;
} page_t;

static void page_sift_down(page_t *p, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < p->n && strcmp(p->heap[l].id, p->heap[top].id) > 0)
            top = l;
        if (r < p->n && strcmp(p->heap[r].id, p->heap[top].id) > 0)
            top = r;
        if (top == i)
            return;
        page_entry_t t = p->heap[i];
        p->heap[i] = p->heap[top];
        p->heap[top] = t;
        i = top;
    }
}

static void collect_page(const char *id, rt_pid_t pid, void *ud)
{
    page_t *p = ud;
    if (p->oom || strncmp(id, p->prefix, p->prefix_len) != 0 ||
        (p->after && strcmp(id, p->after) <= 0))
        return;
    if (p->n == p->limit) {
        if (strcmp(id, p->heap[0].id) >= 0)
            return;
        char *copy = strdup(id);
        if (!copy) {
            p->oom = true;
            return;
        }
        free(p->heap[0].id);
        p->heap[0] = (page_entry_t){copy, pid};
        page_sift_down(p, 0);
        return;
    }
    char *copy = strdup(id);
    if (!copy) {
        p->oom = true;
        return;
    }
    size_t i = p->n++;
    p->heap[i] = (page_entry_t){copy, pid};
    while (i && strcmp(p->heap[(i - 1) / 2].id, p->heap[i].id) < 0) {
        page_entry_t t = p->heap[i];
        p->heap[i] = p->heap[(i - 1) / 2];
        p->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

int rt_broker_client_page(const char *prefix, const char *after, size_t limit, rt_pid_t **pids,
                          size_t *n)
{
    page_t p = {.limit = limit, .prefix = prefix ? prefix : "", .after = after};
    p.prefix_len = strlen(p.prefix);
    p.heap = limit ? malloc(limit * sizeof(*p.heap)) : NULL;
    *pids = limit ? malloc(limit * sizeof(**pids)) : NULL;
    if (limit && (!p.heap || !*pids)) {
        free(p.heap);
        free(*pids);
        *pids = NULL;
        *n = 0;
        return RT_ENOMEM;
    }
    rt_broker_clients_each(collect_page, &p);
    for (size_t i = 0; i < p.n; i++) {
        (*pids)[i] = p.heap[i].pid;
        free(p.heap[i].id);
    }
    free(p.heap);
    *n = p.oom ? 0 : p.n;
    return p.oom ? RT_ENOMEM : 0;
}

int rt_broker_client_pids(size_t limit, rt_pid_t **pids, size_t *n)
{
    pids_t p = {.limit = limit ? limit : SIZE_MAX};
    rt_broker_clients_each(collect_pid, &p);
    if (p.oom) {
        free(p.pids);
        *pids = NULL;
        *n = 0;
        return RT_ENOMEM;
    }
    *pids = p.pids;
    *n = p.n;
    return 0;
}

/* ---- Metrics: one block per thread, summed on read ---- */

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_metrics_block_t *metrics_all;  /* every block made, for the lifetime of the process */
static rt_metrics_block_t *metrics_free; /* blocks waiting for a thread (theirs ended) */
_Thread_local rt_metrics_block_t *rt__metrics_mine;

/* A thread ends: its block, counts and all, waits for the next thread that counts. */
static void metrics_thread_end(void *block)
{
    rt_metrics_block_t *b = block;
    pthread_mutex_lock(&metrics_lock);
    b->next_free = metrics_free;
    metrics_free = b;
    pthread_mutex_unlock(&metrics_lock);
}

rt_metrics_block_t *rt__metrics_attach(void)
{
    pthread_mutex_lock(&metrics_lock);
    rt_metrics_block_t *b = metrics_free;
    if (b) {
        metrics_free = b->next_free;
    } else if ((b = calloc(1, sizeof(*b))) != NULL) {
        b->next = metrics_all;
        metrics_all = b;
    }
    pthread_mutex_unlock(&metrics_lock);
    if (b && rt_thread_at_exit(metrics_thread_end, b) != 0) {
        metrics_thread_end(b); /* a block no exit would give back is not taken */
        b = NULL;
    }
    rt__metrics_mine = b;
    return b;
}

/* Sums metric which over every block. */
static uint64_t metric_sum(unsigned which)
{
    uint64_t sum = 0;
    for (rt_metrics_block_t *b = metrics_all; b; b = b->next)
        sum += atomic_load_explicit(&b->v[which], memory_order_relaxed);
    return sum;
}

/* Counts start again with each broker (tests start several in one process); no thread
   counts while it starts. */
static void metrics_reset(void)
{
    pthread_mutex_lock(&metrics_lock);
    for (rt_metrics_block_t *b = metrics_all; b; b = b->next)
        for (unsigned i = 0; i < RT_METRICS; i++)
            atomic_store_explicit(&b->v[i], 0, memory_order_relaxed);
    pthread_mutex_unlock(&metrics_lock);
}

void rt_broker_metrics(rt_broker_metrics_t *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&metrics_lock);
    for (unsigned t = 1; t < RT_MQTT_PACKET_TYPES; t++) {
        out->packets_in[t] = metric_sum(RT_METRIC_PKT_IN + t);
        out->packets_out[t] = metric_sum(RT_METRIC_PKT_OUT + t);
    }
    out->bytes_in = metric_sum(RT_METRIC_BYTES_IN);
    out->bytes_out = metric_sum(RT_METRIC_BYTES_OUT);
    out->msgs_in = metric_sum(RT_METRIC_MSGS_IN);
    out->msgs_out = metric_sum(RT_METRIC_MSGS_OUT);
    pthread_mutex_unlock(&metrics_lock);
    out->msgs_dropped = atomic_load_explicit(&rt_broker->stats.msgs_dropped, memory_order_relaxed);
    out->msgs_expired = atomic_load_explicit(&rt_broker->stats.msgs_expired, memory_order_relaxed);
}

const char *rt_mqtt_packet_name(unsigned type)
{
    static const char *const names[RT_MQTT_PACKET_TYPES] = {
        NULL,      "CONNECT",  "CONNACK",    "PUBLISH", "PUBACK",      "PUBREC",
        "PUBREL",  "PUBCOMP",  "SUBSCRIBE",  "SUBACK",  "UNSUBSCRIBE", "UNSUBACK",
        "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH"};
    return type < RT_MQTT_PACKET_TYPES ? names[type] : NULL;
}

/* ---- Live limits ---- */

#define NOT_LIVE SIZE_MAX

typedef struct {
    const char *key;
    size_t live;         /* offset in rt_broker_live_t; NOT_LIVE: kept elsewhere or fixed */
    size_t conf;         /* offset in rt_conf_t */
    bool is_bool;        /* the rt_conf_t field is a bool (else a long) */
    long (*get)(void);   /* a limit another module keeps: its value, */
    void (*set)(long v); /* and how to change it (or, with live, what else to tell) */
    const char *affects;
} limit_t;

#define CONF_IS_BOOL(k) _Generic(((rt_conf_t *)0)->k, bool : true, default : false)
#define LIVE(k, then, what)                                                                        \
    {                                                                                              \
#k, offsetof(rt_broker_live_t, k), offsetof(rt_conf_t, k), CONF_IS_BOOL(k), NULL, then,    \
            what                                                                                   \
    }
#define ELSEWHERE(k, get, set, what)                                                               \
    {                                                                                              \
#k, NOT_LIVE, offsetof(rt_conf_t, k), CONF_IS_BOOL(k), get, set, what                      \
    }
#define FIXED(k, why)                                                                              \
    {                                                                                              \
#k, NOT_LIVE, offsetof(rt_conf_t, k), CONF_IS_BOOL(k), NULL, NULL, why                     \
    }

static void retained_limits_changed(long v)
{
    (void)v;
    rt_retained_set_limits(rt_broker->retained, (size_t)RT_LIVE(max_retained_messages),
                           (size_t)RT_LIVE(max_retained_bytes));
}

static long anonymous_get(void)
{
    return rt_auth_allow_anonymous();
}

static void anonymous_set(long v)
{
    rt_auth_set_allow_anonymous(v != 0);
}

/*
** Each limit with what a change applies to. The rule: a change is taken at the
** next place the limit is checked, and nothing already admitted is undone
** (open connections stay open, longer queues are not cut, held retained
** messages stay); what a connection was told at CONNECT holds for its life.
*/
static const limit_t limits[] = {
    LIVE(max_connections, NULL, "new connections; open ones stay"),
    LIVE(max_connections_per_ip, NULL,
         "new connections; only those accepted while it is on count against it"),
    LIVE(max_connection_rate, NULL, "new connections; each listener refills at the new rate"),
    LIVE(max_connect_size, NULL, "CONNECTs read from now on"),
    LIVE(max_preauth_memory, NULL, "bytes taken from now on; what is held stays"),
    LIVE(max_packet_size, NULL,
         "connections from now on; open ones keep theirs (MQTT 5 clients were told it)"),
    LIVE(max_inflight, NULL, "every session from its next send"),
    LIVE(receive_maximum, NULL, "CONNECTs from now on (MQTT 5 clients are told it)"),
    LIVE(max_queued_messages, NULL, "the next message queued; longer queues are not cut"),
    LIVE(max_client_memory, NULL, "every client from its next message; what it holds stays"),
    LIVE(client_memory_hold_ms, NULL, "the next client to reach its budget"),
    LIVE(max_topic_levels, NULL, "the next PUBLISH or SUBSCRIBE"),
    LIVE(max_topic_length, NULL, "the next PUBLISH or SUBSCRIBE"),
    LIVE(max_subscriptions, NULL, "the next SUBSCRIBE; clients over it keep theirs"),
    LIVE(max_retained_messages, retained_limits_changed,
         "the next retained message; those held stay"),
    LIVE(max_retained_bytes, retained_limits_changed, "the next retained message; those held stay"),
    LIVE(max_keepalive, NULL, "CONNECTs from now on"),
    LIVE(max_session_expiry, NULL, "CONNECTs and DISCONNECTs from now on"),
    LIVE(queue_qos0, NULL, "the next QoS 0 message for an offline session"),
    LIVE(allow_zero_length_clientid, NULL, "CONNECTs from now on"),
    LIVE(delayed_publish, NULL, "PUBLISHes from now on; held messages stay held"),
    LIVE(max_delayed, NULL, "the next delayed PUBLISH; a list over it keeps its messages"),
    LIVE(max_delayed_bytes, NULL, "the next delayed PUBLISH; a list over it keeps its messages"),
    LIVE(max_banned, NULL, "the next ban; a list over it keeps its bans"),
    LIVE(tenant_max_connections, NULL, "CONNECTs from now on; open connections stay"),
    LIVE(tenant_max_subscriptions, NULL, "the next SUBSCRIBE; tenants over it keep theirs"),
    LIVE(tenant_max_publish_rate, NULL, "the next PUBLISH"),
    LIVE(tenant_max_retained_bytes, NULL, "the next retained message; those held stay"),
    LIVE(flapping_max_connects, NULL, "CONNECTs from now on"),
    LIVE(flapping_window_s, NULL, "CONNECTs from now on"),
    LIVE(flapping_ban_s, NULL, "the next ban flapping detection makes"),
    ELSEWHERE(allow_anonymous, anonymous_get, anonymous_set,
              "CONNECTs from now on; a reload (SIGHUP) sets it from the file again"),
    FIXED(max_topic_alias, "needs a restart: each connection sizes its alias table by it"),
    FIXED(persistence, "needs a restart: the store opens at start"),
};

#define NLIMITS (sizeof(limits) / sizeof(limits[0]))

static _Atomic long *live_field(const limit_t *l)
{
    return (_Atomic long *)(void *)((char *)&rt_broker->live + l->live);
}

static long conf_setting(const rt_conf_t *c, const limit_t *l)
{
    const char *f = (const char *)c + l->conf;
    return l->is_bool ? *(const bool *)(const void *)f : *(const long *)(const void *)f;
}

static void live_init(rt_broker_t *b)
{
    for (size_t i = 0; i < NLIMITS; i++)
        if (limits[i].live != NOT_LIVE)
            atomic_init((_Atomic long *)(void *)((char *)&b->live + limits[i].live),
                        conf_setting(&b->conf, &limits[i]));
}

static long limit_value(const limit_t *l)
{
    if (l->get)
        return l->get();
    if (l->live != NOT_LIVE)
        return atomic_load_explicit(live_field(l), memory_order_relaxed);
    return conf_setting(&rt_broker->conf, l);
}

static bool limit_is_live(const limit_t *l)
{
    return l->live != NOT_LIVE || l->set;
}

/* v as rtd.conf writes it. */
static void format_limit(const limit_t *l, long v, char *buf, size_t len)
{
    if (l->is_bool)
        snprintf(buf, len, "%s", v ? "true" : "false");
    else
        snprintf(buf, len, "%ld", v);
}

size_t rt_broker_limits(rt_limit_info_t *out, size_t max)
{
    for (size_t i = 0; i < NLIMITS && i < max; i++) {
        const limit_t *l = &limits[i];
        out[i] = (rt_limit_info_t){.key = l->key, .live = limit_is_live(l), .affects = l->affects};
        format_limit(l, limit_value(l), out[i].value, sizeof(out[i].value));
    }
    return NLIMITS;
}

int rt_broker_set_limit(const char *key, const char *value, char *err, size_t errlen)
{
    const limit_t *l = NULL;
    for (size_t i = 0; i < NLIMITS && !l; i++)
        if (strcmp(limits[i].key, key) == 0)
            l = &limits[i];
    if (!l && !rt_conf_known(key)) {
        snprintf(err, errlen, "unknown setting %s", key);
        return RT_ENOTFOUND;
    }
    if (!l || !limit_is_live(l)) {
        snprintf(err, errlen, "%s needs a restart", key);
        return RT_EBUSY;
    }
    /* The config loader checks the value (syntax, type, range) on a copy of the settings. */
    rt_conf_t *copy = malloc(sizeof(*copy));
    char *assignment = malloc(strlen(key) + strlen(value) + 2);
    if (!copy || !assignment) {
        free(copy);
        free(assignment);
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    *copy = rt_broker->conf;
    snprintf(assignment, strlen(key) + strlen(value) + 2, "%s=%s", key, value);
    int rc = rt_conf_set_from(copy, "rtctl", assignment, err, errlen);
    long v = rc == 0 ? conf_setting(copy, l) : 0;
    free(copy);
    free(assignment);
    if (rc)
        return rc;
    char was[32], now[32];
    format_limit(l, limit_value(l), was, sizeof(was));
    format_limit(l, v, now, sizeof(now));
    if (l->live != NOT_LIVE)
        atomic_store_explicit(live_field(l), v, memory_order_relaxed);
    if (l->set)
        l->set(v);
    rt_log(RT_LOG_INFO, "config.set", "setting=%s value=%s was=%s", key, now, was);
    return 0;
}

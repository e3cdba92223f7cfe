#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "broker.h"
#include "log.h"
#include "store.h"

rt_broker_t *rt_broker;

/* ---- Metrics (see broker.h): one block per thread, summed on read ---- */

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_metrics_block_t *metrics_all;  /* every block made, for the lifetime of the process */
static rt_metrics_block_t *metrics_free; /* blocks waiting for a thread (theirs ended) */
static pthread_key_t metrics_key;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;
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

static void metrics_key_create(void)
{
    pthread_key_create(&metrics_key, metrics_thread_end);
}

rt_metrics_block_t *rt__metrics_attach(void)
{
    pthread_once(&metrics_once, metrics_key_create);
    pthread_mutex_lock(&metrics_lock);
    rt_metrics_block_t *b = metrics_free;
    if (b) {
        metrics_free = b->next_free;
    } else if ((b = calloc(1, sizeof(*b))) != NULL) {
        b->next = metrics_all;
        metrics_all = b;
    }
    pthread_mutex_unlock(&metrics_lock);
    if (b) {
        pthread_setspecific(metrics_key, b);
        rt__metrics_mine = b;
    }
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
        NULL,      "CONNECT", "CONNACK",     "PUBLISH",   "PUBACK",   "PUBREC",
        "PUBREL",  "PUBCOMP", "SUBSCRIBE",   "SUBACK",    "UNSUBSCRIBE", "UNSUBACK",
        "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH"};
    return type < RT_MQTT_PACKET_TYPES ? names[type] : NULL;
}

typedef struct rt_client_entry_s {
    struct rt_client_entry_s *next;
    rt_pid_t pid;
    char id[];
} rt_client_entry_t;

/* Client ids are the client's choice: the keyed hash keeps their collisions unplannable. */
static uint64_t hash_id(const char *s)
{
    return rt_hash(s, strlen(s));
}

void rt_broker_retained_release(void *msg)
{
    rt_retained_msg_t *r = msg;
    if (!r)
        return;
    rt_bin_release(r->bin);
    free(r);
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

#define CONF_IS_BOOL(k) _Generic(((rt_conf_t *)0)->k, bool: true, default: false)
#define LIVE(k, then, what)                                                                        \
    {#k, offsetof(rt_broker_live_t, k), offsetof(rt_conf_t, k), CONF_IS_BOOL(k), NULL, then, what}
#define ELSEWHERE(k, get, set, what)                                                               \
    {#k, NOT_LIVE, offsetof(rt_conf_t, k), CONF_IS_BOOL(k), get, set, what}
#define FIXED(k, why) {#k, NOT_LIVE, offsetof(rt_conf_t, k), CONF_IS_BOOL(k), NULL, NULL, why}

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
    LIVE(max_packet_size, NULL,
         "connections from now on; open ones keep theirs (MQTT 5 clients were told it)"),
    LIVE(max_inflight, NULL, "every session from its next send"),
    LIVE(max_queued_messages, NULL, "the next message queued; longer queues are not cut"),
    LIVE(max_queued_bytes, NULL, "the next message queued; longer queues are not cut"),
    LIVE(max_topic_levels, NULL, "the next PUBLISH or SUBSCRIBE"),
    LIVE(max_topic_length, NULL, "the next PUBLISH or SUBSCRIBE"),
    LIVE(max_subscriptions, NULL, "the next SUBSCRIBE; clients over it keep theirs"),
    LIVE(max_retained_messages, retained_limits_changed,
         "the next retained message; those held stay"),
    LIVE(max_retained_bytes, retained_limits_changed,
         "the next retained message; those held stay"),
    LIVE(max_keepalive, NULL, "CONNECTs from now on"),
    LIVE(max_session_expiry, NULL, "CONNECTs and DISCONNECTs from now on"),
    LIVE(queue_qos0, NULL, "the next QoS 0 message for an offline session"),
    LIVE(allow_zero_length_clientid, NULL, "CONNECTs from now on"),
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

static long conf_value(const rt_conf_t *c, const limit_t *l)
{
    const char *f = (const char *)c + l->conf;
    return l->is_bool ? *(const bool *)(const void *)f : *(const long *)(const void *)f;
}

static void live_init(rt_broker_t *b)
{
    for (size_t i = 0; i < NLIMITS; i++)
        if (limits[i].live != NOT_LIVE)
            atomic_init((_Atomic long *)(void *)((char *)&b->live + limits[i].live),
                        conf_value(&b->conf, &limits[i]));
}

static long limit_value(const limit_t *l)
{
    if (l->get)
        return l->get();
    if (l->live != NOT_LIVE)
        return atomic_load_explicit(live_field(l), memory_order_relaxed);
    return conf_value(&rt_broker->conf, l);
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
    long v = rc == 0 ? conf_value(copy, l) : 0;
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
    rt_log(RT_LOG_INFO, "config.set", "%s=%s was=%s", key, now, was);
    return 0;
}

int rt_broker_start(const rt_conf_t *conf, char *err, size_t errlen)
{
    rt_broker_t *b = calloc(1, sizeof(*b));
    if (!b)
        return RT_ENOMEM;
    b->conf = *conf;
    pthread_mutex_init(&b->clients_lock, NULL);
    b->clients_cap = 1024;
    b->clients = calloc(b->clients_cap, sizeof(*b->clients));
    if (!b->clients || rt_trie_new(&b->trie) ||
        rt_retained_new(&b->retained, rt_broker_retained_release,
                        (size_t)conf->max_retained_messages, (size_t)conf->max_retained_bytes)) {
        rt_trie_free(b->trie);
        free(b->clients);
        free(b);
        return RT_ENOMEM;
    }
    rt_broker = b;
    live_init(b);
    metrics_reset();
    int restored = rt_broker_restore(err, errlen);
    if (restored)
        return restored;
    /* Before the listeners: the first CONNECT may need a full password hash. */
    int vrc = rt_auth_verifier_start();
    if (vrc && vrc != RT_EEXIST) { /* EEXIST: one runs already, from an earlier start */
        snprintf(err, errlen, "cannot start the login verifier: %s", rt_strerror(vrc));
        return vrc;
    }
    for (unsigned i = 0; i < conf->nlisteners; i++) {
        rt_pid_t pid;
        int rc = rt_spawn(&rt_listener_type, (void *)&rt_broker->conf.listeners[i], &pid);
        if (rc) {
            snprintf(err, errlen, "cannot listen on %s:%d: %s", conf->listeners[i].host,
                     conf->listeners[i].port,
                     rc == RT_EEXIST ? "address already in use" : rt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

void rt_broker_free(void)
{
    rt_broker_t *b = rt_broker;
    if (!b)
        return;
    for (size_t i = 0; i < b->clients_cap; i++) {
        rt_client_entry_t *e = b->clients[i];
        while (e) {
            rt_client_entry_t *next = e->next;
            free(e);
            e = next;
        }
    }
    free(b->clients);
    rt_trie_free(b->trie);
    rt_retained_free(b->retained);
    rt_store_close();
    pthread_mutex_destroy(&b->clients_lock);
    free(b);
    rt_broker = NULL;
}

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

/* Finds id's entry in its bucket; call with clients_lock held. */
static rt_client_entry_t *find_client(rt_broker_t *b, const char *id)
{
    rt_client_entry_t *e = b->clients[hash_id(id) & (b->clients_cap - 1)];
    while (e && strcmp(e->id, id) != 0)
        e = e->next;
    return e;
}

/* Doubles the bucket array once entries outnumber buckets; a failed grow keeps the old one. */
static void grow_clients(rt_broker_t *b)
{
    size_t cap = b->clients_cap * 2;
    rt_client_entry_t **nb = calloc(cap, sizeof(*nb));
    if (!nb)
        return;
    for (size_t i = 0; i < b->clients_cap; i++) {
        rt_client_entry_t *e = b->clients[i];
        while (e) {
            rt_client_entry_t *next = e->next;
            size_t k = hash_id(e->id) & (cap - 1);
            e->next = nb[k];
            nb[k] = e;
            e = next;
        }
    }
    free(b->clients);
    b->clients = nb;
    b->clients_cap = cap;
}

rt_pid_t rt_broker_claim_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    rt_pid_t old = 0;
    pthread_mutex_lock(&b->clients_lock);
    rt_client_entry_t *e = find_client(b, id);
    if (e) {
        old = e->pid;
        e->pid = pid;
    } else {
        if (b->clients_len >= b->clients_cap)
            grow_clients(b);
        size_t len = strlen(id);
        e = malloc(sizeof(*e) + len + 1);
        if (e) {
            size_t bucket = hash_id(id) & (b->clients_cap - 1);
            memcpy(e->id, id, len + 1);
            e->pid = pid;
            e->next = b->clients[bucket];
            b->clients[bucket] = e;
            b->clients_len++;
        }
    }
    pthread_mutex_unlock(&b->clients_lock);
    return old;
}

rt_pid_t rt_broker_lookup_client(const char *id)
{
    rt_broker_t *b = rt_broker;
    pthread_mutex_lock(&b->clients_lock);
    rt_client_entry_t *e = find_client(b, id);
    rt_pid_t pid = e ? e->pid : 0;
    pthread_mutex_unlock(&b->clients_lock);
    return pid;
}

void rt_broker_release_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    size_t bucket = hash_id(id) & (b->clients_cap - 1);
    pthread_mutex_lock(&b->clients_lock);
    for (rt_client_entry_t **pp = &b->clients[bucket]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, id) == 0) {
            rt_client_entry_t *e = *pp;
            if (e->pid == pid) {
                *pp = e->next;
                free(e);
                b->clients_len--;
            }
            break;
        }
    }
    pthread_mutex_unlock(&b->clients_lock);
}

size_t rt_broker_clients_each(void (*fn)(const char *id, rt_pid_t pid, void *ud), void *ud)
{
    rt_broker_t *b = rt_broker;
    size_t n = 0;
    pthread_mutex_lock(&b->clients_lock);
    for (size_t i = 0; i < b->clients_cap; i++)
        for (rt_client_entry_t *e = b->clients[i]; e; e = e->next, n++)
            fn(e->id, e->pid, ud);
    pthread_mutex_unlock(&b->clients_lock);
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
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        rt_pid_t *np = realloc(p->pids, cap * sizeof(*np));
        if (!np) {
            p->oom = true;
            return;
        }
        p->pids = np;
        p->cap = cap;
    }
    p->pids[p->n++] = pid;
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

/* ---- Listener ----
** Limits are applied at accept, before a connection costs an actor:
**   max_connections         sockets open in the broker (stats.sockets);
**   max_connections_per_ip  sockets open from one address, all listeners together;
**   max_connection_rate     new connections a second per listener: a token bucket
**                           holding one second's worth, refilled continuously.
** A refused socket is closed at once (the client sees the connection end before
** any CONNACK), counted in stats.refused and in its reason's counter, and logged
** at most once a second per listener with the counts since the last line.
**
** Per-address counting needs to know when a socket ends without any call from
** the connection actor: the table records each counted socket by fd number and
** socket cookie (SO_COOKIE, unique for the kernel's lifetime). A socket keeps its
** fd while it lives (also when a session hands it to another actor), so an entry
** whose fd no longer names that cookie is a closed connection.
** Entries are checked lazily: an fd number returned by accept proves its old
** entry closed, and an address at its limit has its entries checked (at most
** every RT_PEER_SWEEP_MS) before a connection from it is refused.
*/
#define RT_LISTEN_BACKLOG 4096        /* pending connections the kernel queues */
#define RT_LISTEN_ACCEPTS_PER_TURN 64 /* accepts per turn; the runtime posts another event */
#define RT_LISTEN_LOG_MS 1000         /* at most one refusal line per listener per this */
#define RT_PEER_SWEEP_MS 100          /* an address at its limit is re-checked at most this often */
#define RT_LISTEN_RETRY_MS 100        /* pause after accept fails (no descriptors left) */

#define MSG_LISTENER_LOG (RT_MSG_USER + 1)    /* the refusal log may write its next line */
#define MSG_LISTENER_RESUME (RT_MSG_USER + 2) /* accept again after a failure */

/* Why a connection was refused; indexes listener_t.unlogged and rt_listener_stats_t.refused. */
enum {
    REFUSE_NONE = RT_REFUSED_ALL,
    REFUSE_MAX = RT_REFUSED_MAX_CONNS,
    REFUSE_PER_IP = RT_REFUSED_PER_IP,
    REFUSE_RATE = RT_REFUSED_RATE,
    REFUSE_ERROR = RT_REFUSED_ERROR,
    REFUSE_REASONS
};

/* One address with open sockets; freed when its count drops to 0. */
typedef struct peer_addr_s {
    struct peer_addr_s *next; /* hash chain */
    rt_auth_addr_t addr;      /* IPv4 as v4-mapped IPv6 */
    uint32_t count;           /* sockets counted for addr */
    int head;                 /* first fd of addr's list; -1: none */
    uint64_t swept_ms;        /* last time its entries were checked */
} peer_addr_t;

/* One counted socket, indexed by fd number. */
typedef struct {
    uint64_t cookie;   /* the socket's SO_COOKIE, which names it and no other, ever */
    peer_addr_t *peer; /* NULL: no socket counted under this fd */
    int prev, next;    /* peer's other fds; -1 ends the list */
} peer_fd_t;

/*
** Shared by every listener (one lock, held for a table update, never across a
** system call other than the fstat of a sweep); the connection actors never
** touch it. Created by the first listener with a per-address limit and freed
** by the last one to stop.
*/
static struct {
    pthread_mutex_t lock;
    unsigned users; /* listeners using the table */
    peer_addr_t **buckets;
    size_t cap, len; /* buckets (a power of 2), addresses */
    peer_fd_t *fds;
    size_t nfds; /* entries in fds */
} peers = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
** The cookie of the socket fd names now (SO_COOKIE: 64 bits the kernel gives each
** socket and never gives again), or 0 if fd is closed or not a socket. Another
** thread may be closing fd meanwhile: the kernel answers for the socket before
** or after, never for a half-closed one.
*/
static uint64_t sock_cookie(int fd)
{
    uint64_t cookie = 0;
    socklen_t len = sizeof(cookie);
    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0 || len != sizeof(cookie))
        return 0;
    return cookie;
}

static size_t peer_bucket(const rt_auth_addr_t *a, size_t cap)
{
    return (size_t)rt_hash(a->b, sizeof(a->b)) & (cap - 1);
}

static peer_addr_t *peer_find(const rt_auth_addr_t *a)
{
    if (!peers.cap)
        return NULL;
    peer_addr_t *p = peers.buckets[peer_bucket(a, peers.cap)];
    while (p && memcmp(&p->addr, a, sizeof(*a)) != 0)
        p = p->next;
    return p;
}

/* Adds a for counting (doubling the buckets first when full); NULL on OOM. */
static peer_addr_t *peer_add(const rt_auth_addr_t *a)
{
    if (peers.len >= peers.cap) {
        size_t cap = peers.cap ? peers.cap * 2 : 256;
        peer_addr_t **nb = calloc(cap, sizeof(*nb));
        if (!nb)
            return NULL;
        for (size_t i = 0; i < peers.cap; i++) {
            for (peer_addr_t *p = peers.buckets[i], *next; p; p = next) {
                next = p->next;
                size_t k = peer_bucket(&p->addr, cap);
                p->next = nb[k];
                nb[k] = p;
            }
        }
        free(peers.buckets);
        peers.buckets = nb;
        peers.cap = cap;
    }
    peer_addr_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->addr = *a;
    p->head = -1;
    size_t k = peer_bucket(a, peers.cap);
    p->next = peers.buckets[k];
    peers.buckets[k] = p;
    peers.len++;
    return p;
}

static void peer_remove(peer_addr_t *p)
{
    for (peer_addr_t **pp = &peers.buckets[peer_bucket(&p->addr, peers.cap)]; *pp;
         pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            peers.len--;
            free(p);
            return;
        }
    }
}

/* Stops counting whatever socket was recorded under fd (its connection has ended). */
static void peer_forget(int fd)
{
    if (fd < 0 || (size_t)fd >= peers.nfds || !peers.fds[fd].peer)
        return;
    peer_fd_t *e = &peers.fds[fd];
    peer_addr_t *p = e->peer;
    if (e->prev >= 0)
        peers.fds[e->prev].next = e->next;
    else
        p->head = e->next;
    if (e->next >= 0)
        peers.fds[e->next].prev = e->prev;
    e->peer = NULL;
    if (--p->count == 0)
        peer_remove(p);
}

/* Counts the socket fd (SO_COOKIE cookie) for p; RT_ENOMEM if the fd table cannot grow. */
static int peer_count(peer_addr_t *p, int fd, uint64_t cookie)
{
    if ((size_t)fd >= peers.nfds) {
        size_t n = peers.nfds ? peers.nfds * 2 : 1024;
        while (n <= (size_t)fd)
            n *= 2;
        peer_fd_t *nf = realloc(peers.fds, n * sizeof(*nf));
        if (!nf)
            return RT_ENOMEM;
        memset(nf + peers.nfds, 0, (n - peers.nfds) * sizeof(*nf));
        peers.fds = nf;
        peers.nfds = n;
    }
    peer_fd_t *e = &peers.fds[fd];
    *e = (peer_fd_t){.cookie = cookie, .peer = p, .prev = -1, .next = p->head};
    if (p->head >= 0)
        peers.fds[p->head].prev = fd;
    p->head = fd;
    p->count++;
    return 0;
}

/* Drops p's entries whose sockets have closed; p is freed if none is left (returns false). */
static bool peer_sweep(peer_addr_t *p, uint64_t now)
{
    p->swept_ms = now;
    for (int fd = p->head; fd >= 0;) {
        int next = peers.fds[fd].next;
        if (sock_cookie(fd) != peers.fds[fd].cookie) {
            bool last = p->count == 1;
            peer_forget(fd); /* frees p with its last entry */
            if (last)
                return false;
        }
        fd = next;
    }
    return true;
}

static void peers_use(void)
{
    pthread_mutex_lock(&peers.lock);
    peers.users++;
    pthread_mutex_unlock(&peers.lock);
}

static void peers_unuse(void)
{
    pthread_mutex_lock(&peers.lock);
    if (--peers.users == 0) {
        for (size_t i = 0; i < peers.cap; i++) {
            for (peer_addr_t *p = peers.buckets[i], *next; p; p = next) {
                next = p->next;
                free(p);
            }
        }
        free(peers.buckets);
        free(peers.fds);
        peers.buckets = NULL;
        peers.fds = NULL;
        peers.cap = peers.len = peers.nfds = 0;
    }
    pthread_mutex_unlock(&peers.lock);
}

typedef struct {
    rt_sock_t *sock;
    const rt_listen_t *where;
    unsigned index;     /* in conf.listeners */
    rt_listener_stats_t *stats;
    int port;           /* the bound port (where->port may be 0) */
    double tokens;      /* max_connection_rate bucket: connections that may start now */
    uint64_t refill_ms; /* when tokens was last brought up to date */
    uint32_t unlogged[REFUSE_REASONS]; /* refusals since the last log line */
    rt_auth_addr_t last_refused;       /* address of the last per-address refusal */
    bool log_armed;                    /* a log line was written less than RT_LISTEN_LOG_MS ago */
    uint64_t error_logged_ms;          /* when an accept failure was last logged */
} listener_t;

/* Takes a token from the listener's bucket; false when max_connection_rate is spent. */
static bool take_token(listener_t *l)
{
    long rate = RT_LIVE(max_connection_rate);
    if (rate <= 0)
        return true;
    uint64_t now = mono_ms();
    l->tokens += (double)(now - l->refill_ms) * (double)rate / 1000.0;
    if (l->tokens > (double)rate)
        l->tokens = (double)rate;
    l->refill_ms = now;
    if (l->tokens < 1.0)
        return false;
    l->tokens -= 1.0;
    return true;
}

/*
** Decides whether the socket fd just accepted may start a connection and, with
** a per-address limit, counts it for its address. Returns REFUSE_NONE or why not.
*/
static int admit(listener_t *l, int fd, rt_auth_addr_t *addr)
{
    if ((long)atomic_load(&rt_broker->stats.sockets) >= RT_LIVE(max_connections))
        return REFUSE_MAX;
    long per_ip = RT_LIVE(max_connections_per_ip);
    if (per_ip <= 0)
        return take_token(l) ? REFUSE_NONE : REFUSE_RATE;
    bool known = rt_auth_addr_from_fd(fd, addr) == 0;
    uint64_t cookie = sock_cookie(fd);
    int why = REFUSE_NONE;
    pthread_mutex_lock(&peers.lock);
    peer_forget(fd); /* accept returned this number: the socket once under it has closed */
    peer_addr_t *p = known && cookie ? peer_find(addr) : NULL;
    if (p && p->count >= (uint64_t)per_ip) {
        uint64_t now = mono_ms();
        if (now - p->swept_ms >= RT_PEER_SWEEP_MS && !peer_sweep(p, now))
            p = NULL;
        if (p && p->count >= (uint64_t)per_ip)
            why = REFUSE_PER_IP;
    }
    if (why == REFUSE_NONE && !take_token(l))
        why = REFUSE_RATE;
    if (why == REFUSE_NONE && known && cookie) {
        if (!p)
            p = peer_add(addr);
        if (!p || peer_count(p, fd, cookie) != 0) {
            if (p && p->count == 0)
                peer_remove(p);
            why = REFUSE_ERROR;
        }
    }
    pthread_mutex_unlock(&peers.lock);
    return why;
}

/*
** Undoes admit's count for a socket that did not become a connection. Not
** skipped when max_connections_per_ip is 0 now: it may have been on at admit.
*/
static void unadmit(int fd)
{
    pthread_mutex_lock(&peers.lock);
    peer_forget(fd);
    pthread_mutex_unlock(&peers.lock);
}

static void format_addr(const rt_auth_addr_t *a, char *out, size_t len)
{
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    bool v4 = memcmp(a->b, v4_mapped, sizeof(v4_mapped)) == 0;
    if (!inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? a->b + 12 : a->b, out, (socklen_t)len))
        snprintf(out, len, "?");
}

/*
** Writes one line with the refusals counted since the last one, if there were
** any, and then holds the next line back for RT_LISTEN_LOG_MS.
*/
static void log_refusals(rt_actor_t *self, listener_t *l)
{
    uint32_t *u = l->unlogged;
    uint32_t total = u[REFUSE_MAX] + u[REFUSE_PER_IP] + u[REFUSE_RATE] + u[REFUSE_ERROR];
    if (total == 0)
        return;
    char last[INET6_ADDRSTRLEN] = "-";
    if (u[REFUSE_PER_IP])
        format_addr(&l->last_refused, last, sizeof(last));
    rt_log(RT_LOG_WARNING, "listener.refused",
           "%s:%d: %u connections refused (max_connections=%u max_connections_per_ip=%u "
           "max_connection_rate=%u error=%u) last_per_ip=%s",
           l->where->host, l->port, total, u[REFUSE_MAX], u[REFUSE_PER_IP], u[REFUSE_RATE],
           u[REFUSE_ERROR], last);
    memset(l->unlogged, 0, sizeof(l->unlogged));
    if (self)
        l->log_armed =
            rt_send_after_tag(RT_LISTEN_LOG_MS, rt_self(self), MSG_LISTENER_LOG, NULL) == 0;
}

/*
** Closes a refused socket and counts it. The first refusal after a quiet second
** is logged at once; later ones are summed into one line a second.
*/
static void refuse(rt_actor_t *self, listener_t *l, int fd, int why, const rt_auth_addr_t *addr)
{
    rt_broker_stats_t *st = &rt_broker->stats;
    atomic_uint_fast64_t *reason[REFUSE_REASONS] = {[REFUSE_MAX] = &st->refused_max_conns,
                                                    [REFUSE_PER_IP] = &st->refused_per_ip,
                                                    [REFUSE_RATE] = &st->refused_rate,
                                                    [REFUSE_ERROR] = &st->refused_error};
    atomic_fetch_add_explicit(&st->refused, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(reason[why], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats->refused[RT_REFUSED_ALL], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats->refused[why], 1, memory_order_relaxed);
    close(fd); /* after counting: a client that sees the close finds it counted */
    l->unlogged[why]++;
    if (why == REFUSE_PER_IP)
        l->last_refused = *addr;
    if (!l->log_armed)
        log_refusals(self, l);
}

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    listener_t *l = state;
    l->where = arg;
    l->index = (unsigned)(l->where - rt_broker->conf.listeners);
    l->stats = &rt_broker->listener_stats[l->index];
    int rc = rt_tcp_listen(self, l->where->host, l->where->port, RT_LISTEN_BACKLOG, &l->sock);
    if (rc)
        return rc;
    l->port = rt_sock_local_port(l->sock);
    atomic_store(&l->stats->port, l->port);
    atomic_store(&l->stats->running, true);
    l->tokens = (double)RT_LIVE(max_connection_rate);
    l->refill_ms = mono_ms();
    /* Also with no per-address limit: it may be switched on live (the table stays empty,
       unallocated, until then). */
    peers_use();
    rt_log(RT_LOG_INFO, "listener.started", "%s:%d", l->where->host, l->port);
    return 0;
}

static void on_acceptable(rt_actor_t *self, listener_t *l)
{
    for (int i = 0; i < RT_LISTEN_ACCEPTS_PER_TURN; i++) {
        int fd;
        int rc = rt_sock_accept(l->sock, &fd);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            /* Out of descriptors, most likely: the connection waits in the backlog. Retrying at
               once would spin (the socket stays readable), so accepting pauses for a moment. */
            uint64_t now = mono_ms();
            if (now - l->error_logged_ms >= RT_LISTEN_LOG_MS) {
                rt_log(RT_LOG_WARNING, "listener.accept", "%s:%d: %s (accepting again in %d ms)",
                       l->where->host, l->port, rt_strerror(rc), RT_LISTEN_RETRY_MS);
                l->error_logged_ms = now;
            }
            rt_sock_pause_reading(l->sock, true);
            if (rt_send_after_tag(RT_LISTEN_RETRY_MS, rt_self(self), MSG_LISTENER_RESUME, NULL))
                rt_sock_pause_reading(l->sock, false);
            return;
        }
        rt_auth_addr_t addr;
        int why = admit(l, fd, &addr);
        if (why != REFUSE_NONE) {
            refuse(self, l, fd, why, &addr);
            continue;
        }
        rt_pid_t pid;
        rt_conn_arg_t arg = {.fd = fd, .listener = l->index};
        if (rt_spawn(&rt_conn_type, &arg, &pid) != 0) {
            unadmit(fd);
            refuse(self, l, fd, REFUSE_ERROR, &addr);
            continue;
        }
        atomic_fetch_add_explicit(&rt_broker->stats.accepted, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&l->stats->accepted, 1, memory_order_relaxed);
    }
}

static void listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    listener_t *l = state;
    switch (m->tag) {
    case RT_MSG_SOCKET:
        on_acceptable(self, l);
        break;
    case MSG_LISTENER_LOG:
        l->log_armed = false;
        log_refusals(self, l);
        break;
    case MSG_LISTENER_RESUME:
        rt_sock_pause_reading(l->sock, false);
        break;
    }
}

static void listener_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    listener_t *l = state;
    atomic_store(&l->stats->running, false);
    log_refusals(NULL, l); /* the last counts; no timer for an actor that is ending */
    peers_unuse();
}

static const char *listener_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "accept";
    case MSG_LISTENER_LOG:
        return "refusal_log";
    case MSG_LISTENER_RESUME:
        return "resume_accept";
    }
    return NULL;
}

const rt_actor_type_t rt_listener_type = {
    .name = "listener",
    .state_size = sizeof(listener_t),
    .init = listener_init,
    .handle = listener_handle,
    .terminate = listener_terminate,
    .tag_name = listener_tag_name,
};

void rt__broker_count_socket(unsigned listener, int delta)
{
    rt_broker_t *b = rt_broker;
    RT_ASSERT(listener < RT_CONF_MAX_LISTENERS);
    if (delta > 0) {
        atomic_fetch_add(&b->stats.sockets, 1);
        atomic_fetch_add(&b->listener_stats[listener].connections, 1);
    } else {
        atomic_fetch_sub(&b->stats.sockets, 1);
        atomic_fetch_sub(&b->listener_stats[listener].connections, 1);
    }
}

size_t rt_broker_listeners(rt_listener_info_t *out, size_t max)
{
    const rt_conf_t *conf = &rt_broker->conf;
    for (unsigned i = 0; i < conf->nlisteners && i < max; i++) {
        rt_listener_stats_t *st = &rt_broker->listener_stats[i];
        rt_listener_info_t *o = &out[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->address, sizeof(o->address), "%s", conf->listeners[i].host);
        o->port = atomic_load(&st->port);
        o->protocol = "mqtt/tcp";
        o->running = atomic_load(&st->running);
        o->connections = atomic_load(&st->connections);
        o->accepted = atomic_load(&st->accepted);
        o->refused = atomic_load(&st->refused[RT_REFUSED_ALL]);
        o->refused_max_connections = atomic_load(&st->refused[RT_REFUSED_MAX_CONNS]);
        o->refused_per_ip = atomic_load(&st->refused[RT_REFUSED_PER_IP]);
        o->refused_rate = atomic_load(&st->refused[RT_REFUSED_RATE]);
        o->refused_error = atomic_load(&st->refused[RT_REFUSED_ERROR]);
        o->max_connections = RT_LIVE(max_connections);
    }
    return conf->nlisteners;
}

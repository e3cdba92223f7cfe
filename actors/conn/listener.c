/*
** The listener actors, one per configured address: each accepts sockets and starts
** a connection actor (conn.c) for every one it admits. Admission limits apply at
** accept, before a connection costs an actor:
**   max_connections         sockets open in the broker (stats.sockets);
**   max_connections_per_ip  sockets open from one address, all listeners together;
**   max_connection_rate     new connections a second per listener: a token bucket
**                           holding one second's worth, refilled continuously;
**   RT_LISTEN_FD_RESERVE    file descriptors MQTT clients may not take, so that a flood
**                           of sockets leaves rtctl (the admin socket) and HTTP (/healthz)
**                           some to accept with.
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
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "c2s.h"
#include "conn.h"
#include "log.h"

#define RT_LISTEN_BACKLOG 4096        /* pending connections the kernel queues */
#define RT_LISTEN_ACCEPTS_PER_TURN 64 /* accepts per turn; the runtime posts another event */
#define RT_LISTEN_LOG_MS 1000         /* at most one refusal line per listener per this */
#define RT_PEER_SWEEP_MS 100          /* an address at its limit is re-checked at most this often */
#define RT_LISTEN_RETRY_MS 100        /* pause after accept fails (no descriptors left) */
#define RT_LISTEN_FD_RESERVE 64       /* descriptors below the limit kept from MQTT clients */

#define MSG_LISTENER_LOG (RT_MSG_USER + 1)    /* the refusal log may write its next line */
#define MSG_LISTENER_RESUME (RT_MSG_USER + 2) /* accept again after a failure */

/* Why a connection was refused; indexes listener_t.unlogged and rt_listener_stats_t.refused. */
enum {
    REFUSE_NONE = RT_REFUSED_ALL,
    REFUSE_MAX = RT_REFUSED_MAX_CONNS,
    REFUSE_PER_IP = RT_REFUSED_PER_IP,
    REFUSE_RATE = RT_REFUSED_RATE,
    REFUSE_ERROR = RT_REFUSED_ERROR,
    REFUSE_UNTRUSTED = RT_REFUSED_UNTRUSTED,
    REFUSE_FDS = RT_REFUSED_FDS,
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
    pthread_t holder; /* the thread holding lock, while held is set */
    bool held;
    unsigned users; /* listeners using the table */
    peer_addr_t **buckets;
    size_t cap, len; /* buckets (a power of 2), addresses */
    peer_fd_t *fds;
    size_t nfds; /* entries in fds */
} peers = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void peers_lock(void)
{
    pthread_mutex_lock(&peers.lock);
    peers.holder = pthread_self();
    peers.held = true;
}

static void peers_unlock(void)
{
    peers.held = false;
    pthread_mutex_unlock(&peers.lock);
}

/* Whether this thread holds the table's lock, which every peer_* function needs. */
static inline bool peers_locked(void)
{
    return peers.held && pthread_equal(peers.holder, pthread_self());
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
    RT_ASSERT(peers_locked());
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
    RT_ASSERT(peers_locked());
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
    RT_ASSERT(peers_locked());
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
    RT_ASSERT(peers_locked());
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
    RT_ASSERT(peers_locked());
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
    RT_ASSERT(peers_locked());
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
    peers_lock();
    peers.users++;
    peers_unlock();
}

static void peers_unuse(void)
{
    peers_lock();
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
    peers_unlock();
}

typedef struct {
    rt_sock_t *sock;
    const rt_listen_t *where;
    unsigned index; /* among every listener's (config.h: RT_CONF_XMPP_LISTENER) */
    int xmpp;       /* the index in conf.xmpp.listeners of an XMPP listener; -1: MQTT */
    rt_listener_stats_t *stats;
    int port;           /* the bound port (where->port may be 0) */
    double tokens;      /* max_connection_rate bucket: connections that may start now */
    uint64_t refill_ms; /* when tokens was last brought up to date */
    uint32_t unlogged[REFUSE_REASONS]; /* refusals since the last log line */
    rt_auth_addr_t last_refused;       /* address of the last per-address refusal */
    rt_auth_addr_t last_untrusted;     /* of the last PROXY protocol connection refused */
    bool log_armed;                    /* a log line was written less than RT_LISTEN_LOG_MS ago */
    uint64_t error_logged_ms;          /* when an accept failure was last logged */
    uint32_t errors_unlogged;          /* accept failures since that line */
} listener_t;

/* Takes a token from the listener's bucket; false when max_connection_rate is spent. */
static bool rate_take_token(listener_t *l)
{
    long rate = RT_LIVE(max_connection_rate);
    if (rate <= 0)
        return true;
    uint64_t now = rt_mono_ms();
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
static int admit_socket(listener_t *l, int fd, const struct sockaddr_storage *peer,
                        rt_auth_addr_t *addr)
{
    bool known = rt_auth_addr_from_sockaddr(peer, addr) == 0;
    if (rt_fd_in_reserve(fd, RT_LISTEN_FD_RESERVE))
        return REFUSE_FDS;
    if ((long)atomic_load(&rt_broker->stats.sockets) >= RT_LIVE(max_connections))
        return REFUSE_MAX;
    const rt_listen_t *w = l->where;
    bool trusted = known && w->ntrusted && rt_conf_net_match(w->trusted_proxies, w->ntrusted,
                                                             addr->b);
    if (w->proxy_protocol && !trusted)
        return REFUSE_UNTRUSTED;
    long per_ip = RT_LIVE(max_connections_per_ip);
    /* Behind a trusted proxy the client's own address counts, once the connection reads it
       (rt__listener_admit_peer); the proxy's would put every client under one limit. */
    if (per_ip <= 0 || trusted)
        return rate_take_token(l) ? REFUSE_NONE : REFUSE_RATE;
    uint64_t cookie = sock_cookie(fd);
    int why = REFUSE_NONE;
    peers_lock();
    peer_forget(fd); /* accept returned this number: the socket once under it has closed */
    peer_addr_t *p = known && cookie ? peer_find(addr) : NULL;
    if (p && p->count >= (uint64_t)per_ip) {
        uint64_t now = rt_mono_ms();
        if (now - p->swept_ms >= RT_PEER_SWEEP_MS && !peer_sweep(p, now))
            p = NULL;
        if (p && p->count >= (uint64_t)per_ip)
            why = REFUSE_PER_IP;
    }
    if (why == REFUSE_NONE && !rate_take_token(l))
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
    peers_unlock();
    return why;
}

bool rt__listener_admit_peer(int fd, const rt_auth_addr_t *addr)
{
    long per_ip = RT_LIVE(max_connections_per_ip);
    uint64_t cookie = sock_cookie(fd);
    if (per_ip <= 0 || !cookie)
        return true;
    bool ok = true;
    peers_lock();
    peer_forget(fd);
    peer_addr_t *p = peer_find(addr);
    if (p && p->count >= (uint64_t)per_ip) {
        uint64_t now = rt_mono_ms();
        if (now - p->swept_ms >= RT_PEER_SWEEP_MS && !peer_sweep(p, now))
            p = NULL;
        ok = !p || p->count < (uint64_t)per_ip;
    }
    if (ok) {
        if (!p)
            p = peer_add(addr);
        if (!p || peer_count(p, fd, cookie) != 0) {
            if (p && p->count == 0)
                peer_remove(p);
        }
    }
    peers_unlock();
    if (!ok)
        atomic_fetch_add_explicit(&rt_broker->stats.refused_per_ip, 1, memory_order_relaxed);
    return ok;
}

const char *rt_listener_kind(unsigned listener)
{
    const char *p = rt_broker_listener_protocol(listener);
    return strncmp(p, "mqtt/", 5) == 0 ? p + 5 : p;
}

/*
** Undoes admit_socket's count for a socket that did not become a connection. Not
** skipped when max_connections_per_ip is 0 now: it may have been on at admission.
*/
static void unadmit_socket(int fd)
{
    peers_lock();
    peer_forget(fd);
    peers_unlock();
}

/*
** Writes one line with the refusals counted since the last one, if there were
** any, and then holds the next line back for RT_LISTEN_LOG_MS.
*/
static void log_refusals(rt_actor_t *self, listener_t *l)
{
    uint32_t *u = l->unlogged;
    if (u[REFUSE_UNTRUSTED]) {
        char from[INET6_ADDRSTRLEN];
        rt_auth_addr_format(&l->last_untrusted, from, sizeof(from));
        rt_log(RT_LOG_WARNING, "proxy.refused", "peer=%s:0 reason=untrusted count=%u listener=%s:%d",
               from, u[REFUSE_UNTRUSTED], l->where->host, l->port);
        u[REFUSE_UNTRUSTED] = 0;
    }
    uint32_t total =
        u[REFUSE_MAX] + u[REFUSE_PER_IP] + u[REFUSE_RATE] + u[REFUSE_ERROR] + u[REFUSE_FDS];
    if (total == 0) {
        if (self && !l->log_armed)
            l->log_armed =
                rt_send_after_tag(RT_LISTEN_LOG_MS, rt_self(self), MSG_LISTENER_LOG, NULL) == 0;
        return;
    }
    char last[INET6_ADDRSTRLEN] = "-";
    if (u[REFUSE_PER_IP])
        rt_auth_addr_format(&l->last_refused, last, sizeof(last));
    rt_log(RT_LOG_WARNING, "listener.refused",
           "listener=%s:%d refused=%u max_connections=%u max_connections_per_ip=%u "
           "max_connection_rate=%u fd_reserve=%u error=%u last_per_ip=%s sockets=%llu "
           "fd_limit=%ld",
           l->where->host, l->port, total, u[REFUSE_MAX], u[REFUSE_PER_IP], u[REFUSE_RATE],
           u[REFUSE_FDS], u[REFUSE_ERROR], last,
           (unsigned long long)atomic_load(&rt_broker->stats.sockets), rt_fd_limit());
    memset(l->unlogged, 0, sizeof(l->unlogged));
    if (self)
        l->log_armed =
            rt_send_after_tag(RT_LISTEN_LOG_MS, rt_self(self), MSG_LISTENER_LOG, NULL) == 0;
}

/*
** Closes a refused socket and counts it. The first refusal after a quiet second
** is logged at once; later ones are summed into one line a second.
*/
static void refuse_socket(rt_actor_t *self, listener_t *l, int fd, int why,
                          const rt_auth_addr_t *addr)
{
    rt_broker_stats_t *st = &rt_broker->stats;
    atomic_uint_fast64_t *reason[REFUSE_REASONS] = {[REFUSE_MAX] = &st->refused_max_conns,
                                                    [REFUSE_PER_IP] = &st->refused_per_ip,
                                                    [REFUSE_RATE] = &st->refused_rate,
                                                    [REFUSE_ERROR] = &st->refused_error,
                                                    [REFUSE_UNTRUSTED] = &st->refused_untrusted,
                                                    [REFUSE_FDS] = &st->refused_fds};
    atomic_fetch_add_explicit(&st->refused, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(reason[why], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats->refused[RT_REFUSED_ALL], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->stats->refused[why], 1, memory_order_relaxed);
    close(fd); /* after counting: a client that sees the close finds it counted */
    l->unlogged[why]++;
    if (why == REFUSE_PER_IP)
        l->last_refused = *addr;
    if (why == REFUSE_UNTRUSTED)
        l->last_untrusted = *addr;
    if (!l->log_armed)
        log_refusals(self, l);
}

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    listener_t *l = state;
    l->where = arg;
    const rt_conf_t *conf = &rt_broker->conf;
    bool xmpp = l->where >= conf->xmpp.listeners &&
                l->where < conf->xmpp.listeners + RT_CONF_MAX_XMPP_LISTENERS;
    l->xmpp = xmpp ? (int)(l->where - conf->xmpp.listeners) : -1;
    l->index = xmpp ? RT_CONF_XMPP_LISTENER((unsigned)l->xmpp)
                    : (unsigned)(l->where - conf->listeners);
    l->stats = &rt_broker->listener_stats[l->index];
    int rc = rt_tcp_listen(self, l->where->host, l->where->port, RT_LISTEN_BACKLOG, &l->sock);
    if (rc)
        return rc;
    l->port = rt_sock_local_port(l->sock);
    atomic_store(&l->stats->port, l->port);
    atomic_store(&l->stats->running, true);
    l->tokens = (double)RT_LIVE(max_connection_rate);
    l->refill_ms = rt_mono_ms();
    /* Also with no per-address limit: it may be switched on live (the table stays empty,
       unallocated, until then). */
    peers_use();
    rt_log(RT_LOG_INFO, "listener.started", "listener=%s:%d protocol=%s", l->where->host, l->port,
           l->xmpp >= 0 ? "xmpp" : "mqtt");
    return 0;
}

static void on_acceptable(rt_actor_t *self, listener_t *l)
{
    for (int i = 0; i < RT_LISTEN_ACCEPTS_PER_TURN; i++) {
        int fd;
        struct sockaddr_storage peer;
        int rc = rt_sock_accept(l->sock, &fd, &peer);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            /* Out of descriptors, most likely: the connection waits in the backlog. Retrying at
               once would spin (the socket stays readable), so accepting pauses for a moment. */
            uint64_t now = rt_mono_ms();
            l->errors_unlogged++;
            if (now - l->error_logged_ms >= RT_LISTEN_LOG_MS) {
                rt_log(RT_LOG_WARNING, "listener.accept",
                       "listener=%s:%d error=%s reason=%s failures=%u sockets=%llu "
                       "fd_limit=%ld retry_in_ms=%d",
                       l->where->host, l->port,
                       rc == RT_ELIMIT ? "no file descriptor left" : "accept failed",
                       rt_strerror(rc), l->errors_unlogged,
                       (unsigned long long)atomic_load(&rt_broker->stats.sockets), rt_fd_limit(),
                       RT_LISTEN_RETRY_MS);
                l->error_logged_ms = now;
                l->errors_unlogged = 0;
            }
            rt_sock_pause_reading(l->sock, true);
            if (rt_send_after_tag(RT_LISTEN_RETRY_MS, rt_self(self), MSG_LISTENER_RESUME, NULL))
                rt_sock_pause_reading(l->sock, false);
            return;
        }
        rt_auth_addr_t addr;
        int why = admit_socket(l, fd, &peer, &addr);
        if (why != REFUSE_NONE) {
            refuse_socket(self, l, fd, why, &addr);
            continue;
        }
        rt_pid_t pid;
        rt_conn_arg_t arg = {.fd = fd, .listener = l->index};
        bool ip = peer.ss_family == AF_INET || peer.ss_family == AF_INET6;
        rt_c2s_arg_t xarg = {.fd = fd, .listener = (unsigned)l->xmpp, .peer = ip ? &addr : NULL};
        int src = l->xmpp < 0     ? rt_spawn(&rt_conn_type, &arg, &pid)
                  : l->where->s2s ? rt_spawn(&rt_c2s_s2s_in_type, &xarg, &pid)
                                  : rt_spawn(&rt_c2s_type, &xarg, &pid);
        if (src != 0) {
            unadmit_socket(fd);
            refuse_socket(self, l, fd, REFUSE_ERROR, &addr);
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

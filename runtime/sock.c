/*
** Actor-owned TCP sockets, all in one edge-triggered epoll set, so a
** connection costs an fd and this small struct rather than a 250-byte
** uv_tcp_t. Whichever scheduler polls the set (the poller when it wakes, or a
** busy scheduler between turns: see sched.c) posts each event to the socket's
** owner, which then runs on that scheduler: an owner is not pinned to a thread.
**
** Threading: a socket's fields belong to its owner's turn, except the atomics
** below, which pollers on other threads touch too. Pollers set revents and
** readable, read paused, blocked and closed, and claim msg_pending before
** they post; only the claimant of msg_pending may post, and whoever finds it
** closed while holding it frees the struct (sock_drop_claim).
**
** Events carry the fd, not a pointer: the poller sleeps in epoll_wait outside
** its EBR region (a sleeping thread must not hold back reclamation), so a
** pointer it got there could name a socket freed before it woke. It enters
** its region first and then looks the fd up in rt->by_fd, which a close
** clears before the socket is retired; a registered socket is freed through
** EBR, after every poller that could have looked it up has moved on. An event
** for a closed fd that was reused reaches the new socket as a spurious one
** (its read then says EAGAIN).
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

/* Buffered output, allocated only while there is some: idle sockets stay small. */
typedef struct rt_sock_out_s {
    size_t len, off, cap; /* data[off, len) is still to send; off <= len <= cap */
    size_t reserved;      /* data[len, len + reserved) is rt_sock_reserve's, not yet committed */
    unsigned char data[];
} rt_sock_out_t;

#define RT_SOCK_OUT_OK(o) ((o)->off <= (o)->len && (o)->len <= (o)->cap)

struct rt_sock_s {
    int fd;
    uint32_t high_water; /* pending bytes that mean pressure; 0: RT_SOCK_HIGH_WATER */
    /* Shared with pollers. */
    _Atomic uint32_t revents; /* events seen by a poller, not yet delivered */
    atomic_uchar readable;    /* data may wait: set by pollers, cleared by the read */
    atomic_uchar paused;      /* the owner stopped reading (input backpressure) */
    atomic_uchar blocked;     /* output waits for the kernel: an EPOLLOUT is news */
    atomic_uchar msg_pending; /* claimed: an RT_MSG_SOCKET for it is (being) posted */
    atomic_uchar closed;
    atomic_uchar low_at_hangup; /* rt_sock_low_at_hangup */
    /* Owner only. */
    uint8_t registered; /* in the epoll set */
    uint8_t listening;
    uint8_t broken; /* a send failed for good; the next read reports it */
    uint8_t took;   /* the kernel took output since rt_sock_output_taken last asked */
    uint8_t eof;    /* a read found the peer's end (or an error): nothing more will come */
    rt_actor_t *owner;
    union {
        struct {
            rt_sock_t *next;           /* the owner's list */
            struct rt_sock_out_s *out; /* output the kernel has not taken; NULL when empty */
        };
        rt_retired_t retired; /* once closed and unlinked */
    };
};

#define LOAD(field) atomic_load_explicit(&(field), memory_order_relaxed)

int rt__sock_init(rt_runtime_t *rt)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max == RLIM_INFINITY)
        rl.rlim_max = 1u << 20;
    rt->by_fd_len = (size_t)rl.rlim_max;
    void *table = mmap(NULL, rt->by_fd_len * sizeof(*rt->by_fd), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    rt->by_fd = table == MAP_FAILED ? NULL : table;
    rt->epfd = epoll_create1(EPOLL_CLOEXEC);
    rt->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!rt->by_fd || rt->epfd < 0 || rt->kick_fd < 0)
        return RT_ENOMEM;
    struct epoll_event kick = {.events = EPOLLIN, .data.fd = rt->kick_fd};
    return epoll_ctl(rt->epfd, EPOLL_CTL_ADD, rt->kick_fd, &kick) < 0 ? RT_ENOMEM : 0;
}

void rt__sock_destroy(rt_runtime_t *rt)
{
    if (rt->epfd >= 0)
        close(rt->epfd);
    if (rt->kick_fd >= 0)
        close(rt->kick_fd);
    if (rt->by_fd)
        munmap((void *)rt->by_fd, rt->by_fd_len * sizeof(*rt->by_fd));
    rt->epfd = rt->kick_fd = -1;
    rt->by_fd = NULL;
}

static void sock_reclaim(rt_retired_t *r)
{
    rt_sock_t *s = RT_CONTAINER_OF(r, rt_sock_t, retired);
    /* The claim is taken for good (by the close, or before a failed registration). */
    RT_ASSERT(atomic_load(&s->msg_pending) || !s->registered);
    RT_POISON(s, sizeof(*s));
    free(s);
    atomic_fetch_sub_explicit(&rt__rt->sock_bytes, sizeof(*s), memory_order_relaxed);
}

/*
** Output buffers that drained sockets gave back, kept by their scheduler thread for the next
** socket that writes. Freed after every flush and malloc'd again the next turn, a buffer of
** 64 KiB and up cost glibc's arena trims (each an madvise, so a TLB shootdown on every
** core) and the page faults of touching it again: in fan-in at 1 KB, where one subscriber
** takes ~300 MB/s, 4.73 CPU-s per million messages against 4.09 with the cache. Idle
** sockets still hold none: a scheduler keeps at most RT_SOCK_OUT_CACHED buffers of at most
** RT_SOCK_OUT_CACHE_CAP bytes, counted in sock_bytes as before and in sock_cached_bytes too
** (rtctl vm shows them as free: an RSS check must not take them for growth), and gives them
** back when it trims and when it stops.
*/
#define RT_SOCK_OUT_CACHED 4
#define RT_SOCK_OUT_CACHE_CAP (1u << 20)

static _Thread_local struct {
    rt_sock_out_t *b[RT_SOCK_OUT_CACHED];
    unsigned n;
} out_cache;

/* Takes entry i out of this thread's cache (the last entry fills its place). */
static rt_sock_out_t *cache_take(unsigned i)
{
    RT_ASSERT(i < out_cache.n);
    rt_sock_out_t *o = out_cache.b[i];
    out_cache.b[i] = out_cache.b[--out_cache.n];
    atomic_fetch_sub_explicit(&rt__rt->sock_cached_bytes, sizeof(*o) + o->cap,
                              memory_order_relaxed);
    return o;
}

/* Gives an output buffer back to malloc, taking it off the sockets' byte count. */
static void out_release(rt_sock_out_t *o)
{
    atomic_fetch_sub_explicit(&rt__rt->sock_bytes, sizeof(*o) + o->cap, memory_order_relaxed);
    free(o);
}

/*
** Gives back a buffer no socket points to any more: to this scheduler's cache if it fits.
** A full cache keeps its largest buffers: a socket that outgrew the cached ones would
** otherwise get each larger buffer from malloc and hand it back to malloc when it drains.
*/
static void out_free(rt_sock_out_t *o)
{
    if (!o)
        return;
    if (!RT_REUSE_FREED || !rt__tls.sched || o->cap > RT_SOCK_OUT_CACHE_CAP) {
        out_release(o);
        return;
    }
    RT_POISON(o->data, o->len);
    if (out_cache.n == RT_SOCK_OUT_CACHED) {
        unsigned smallest = 0;
        for (unsigned i = 1; i < out_cache.n; i++)
            if (out_cache.b[i]->cap < out_cache.b[smallest]->cap)
                smallest = i;
        if (out_cache.b[smallest]->cap >= o->cap) {
            out_release(o);
            return;
        }
        out_release(cache_take(smallest));
    }
    out_cache.b[out_cache.n++] = o;
    atomic_fetch_add_explicit(&rt__rt->sock_cached_bytes, sizeof(*o) + o->cap,
                              memory_order_relaxed);
}

/* A buffer of at least cap bytes: the largest this thread has cached if it is big enough. */
static rt_sock_out_t *out_alloc(size_t cap)
{
    unsigned best = out_cache.n;
    for (unsigned i = 0; i < out_cache.n; i++)
        if (out_cache.b[i]->cap >= cap &&
            (best == out_cache.n || out_cache.b[i]->cap > out_cache.b[best]->cap))
            best = i;
    if (best < out_cache.n) {
        RT_ASSERT(rt__tls.sched); /* only schedulers cache */
        return cache_take(best);
    }
    rt_sock_out_t *o = malloc(sizeof(*o) + cap);
    if (!o)
        return NULL;
    atomic_fetch_add_explicit(&rt__rt->sock_bytes, sizeof(*o) + cap, memory_order_relaxed);
    o->cap = cap;
    return o;
}

void rt__sock_out_trim(void)
{
    while (out_cache.n)
        out_release(cache_take(out_cache.n - 1));
}

/* Frees a closed, unlinked socket once no poller can still be looking at it. */
static void sock_free(rt_sock_t *s)
{
    RT_ASSERT(LOAD(s->closed)); /* only a closed socket is unlinked from every table */
    if (s->registered && rt__tls.ebr) {
        s->retired.reclaim = sock_reclaim;
        rt__ebr_retire(rt__tls.ebr, &s->retired);
        return;
    }
    /* Never in the set, or the runtime is stopping (no poller runs). */
    sock_reclaim(&s->retired);
}

/* The owner is dead or the post failed: gives the claim back, or frees a closed socket. */
static void sock_drop_claim(rt_sock_t *s)
{
    atomic_store(&s->msg_pending, 0);
    if (atomic_load(&s->closed) && !atomic_exchange(&s->msg_pending, 1))
        sock_free(s);
}

/* Posts one RT_MSG_SOCKET to the owner unless one is already waiting. */
static void post_event(rt_sock_t *s)
{
    if (atomic_load(&s->closed) || atomic_exchange(&s->msg_pending, 1))
        return;
    rt_msg_t *m = rt_msg_new(RT_MSG_SOCKET, sizeof(rt_sock_event_t));
    if (!m) {
        sock_drop_claim(s);
        return;
    }
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    ev->sock = s;
    ev->events = 0;
    if (rt_send_msg(s->owner->pid, m) != 0)
        sock_drop_claim(s); /* the owner is exiting; its exit closes the socket */
}

/* Whether what pollers saw is worth a message to the owner. */
static bool has_news(rt_sock_t *s)
{
    uint32_t ev = atomic_load(&s->revents);
    if (ev & RT_SOCK_WRITABLE)
        return true;
    return (ev || atomic_load(&s->readable)) && !LOAD(s->paused);
}

/*
** The owner is done with its event message: gives the claim back and posts
** again if a poller saw something meanwhile (it could not post while the
** claim was held, so without this look its event would be lost).
*/
static void sock_end_claim(rt_sock_t *s)
{
    RT_ASSERT(atomic_load(&s->msg_pending)); /* the event message ending here held the claim */
    if (LOAD(s->closed)) {
        sock_free(s); /* closed while the claim was held: the claim's holder frees */
        return;
    }
    atomic_store(&s->msg_pending, 0);
    if (has_news(s))
        post_event(s);
}

int rt__sock_wait(struct epoll_event *evs, int timeout_ms)
{
    int n = epoll_wait(rt__rt->epfd, evs, RT_SOCK_BATCH, timeout_ms);
    return n < 0 ? 0 : n;
}

void rt__sock_dispatch(const struct epoll_event *evs, int n, bool poller)
{
    rt_runtime_t *rt = rt__rt;
    for (int i = 0; i < n; i++) {
        int fd = evs[i].data.fd;
        if (fd == rt->kick_fd) {
            uint64_t rung;
            if (poller)
                (void)!read(fd, &rung, sizeof(rung));
            continue;
        }
        rt_sock_t *s = atomic_load_explicit(&rt->by_fd[fd], memory_order_acquire);
        uint32_t e = evs[i].events, add = 0;
        if (!s || atomic_load(&s->closed))
            continue;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            atomic_store(&s->readable, 1);
            add |= RT_SOCK_READABLE;
        }
        if ((e & EPOLLOUT) && atomic_load(&s->blocked))
            add |= RT_SOCK_WRITABLE;
        if (!add)
            continue;
        if ((e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && LOAD(s->low_at_hangup))
            atomic_fetch_or_explicit(&s->owner->sync_flags, RT_AF_LOW, memory_order_relaxed);
        uint32_t now = atomic_fetch_or(&s->revents, add) | add;
        if (LOAD(s->paused) && !(now & RT_SOCK_WRITABLE))
            continue;
        post_event(s);
    }
}

static int epoll_add(rt_sock_t *s)
{
    RT_ASSERT(!s->registered);
    rt_runtime_t *rt = rt__rt;
    if (s->fd < 0 || (size_t)s->fd >= rt->by_fd_len)
        return RT_ELIMIT;
    atomic_store_explicit(&rt->by_fd[s->fd], s, memory_order_release);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.fd = s->fd};
    if (epoll_ctl(rt->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
        atomic_store_explicit(&rt->by_fd[s->fd], NULL, memory_order_relaxed);
        return RT_EINVAL;
    }
    s->registered = 1;
    return 0;
}

/*
** Registration is at once, from whatever thread the owner runs on (its init
** included): an event posted before init returns waits in the mailbox, since
** an actor is born scheduled and runs only after its init.
*/
static int attach(rt_actor_t *self, int fd, bool listening, rt_sock_t **out)
{
    if (self->type->flags & RT_TYPE_BLOCKING)
        return RT_EINVAL;
    rt_sock_t *s = calloc(1, sizeof(*s));
    if (!s)
        return RT_ENOMEM;
    atomic_fetch_add_explicit(&rt__rt->sock_bytes, sizeof(*s), memory_order_relaxed);
    s->fd = fd;
    s->owner = self;
    s->listening = listening;
    int rc = epoll_add(s);
    if (rc) {
        sock_reclaim(&s->retired);
        return rc;
    }
    s->next = self->socks;
    self->socks = s;
    *out = s;
    return 0;
}

/* socket, bind and listen for host:port: 0 with *out set, or an RT_E* code (rt.h). */
/*
** On the listening socket: Linux's accepted sockets inherit TCP_NODELAY from it, which saves
** each connection a setsockopt. Fails harmlessly on a unix socket.
*/
static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int tcp_bind(const char *host, int port, int backlog, int *out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res)
        return RT_EINVAL;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return RT_ELIMIT;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    no_delay(fd);
    int rc = 0;
    if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, backlog > 0 ? backlog : 1024) < 0)
        rc = errno == EADDRINUSE      ? RT_EEXIST
             : errno == EADDRNOTAVAIL ? RT_ENOTFOUND
             : errno == EACCES        ? RT_EACCES
                                      : RT_EINVAL;
    freeaddrinfo(res);
    if (rc)
        close(fd);
    else
        *out = fd;
    return rc;
}

/*
** Sockets bound before their actors start (rt_tcp_bind_early), each waiting for the
** rt_tcp_listen that asks for its address. Filled and emptied by the thread that starts
** and stops the process, taken by listeners' inits on schedulers: under the lock.
*/
#define RT_EARLY_MAX 64 /* sockets bound early at once */
static struct {
    pthread_mutex_t lock;
    unsigned n;
    struct {
        char host[64];
        int port, fd;
    } s[RT_EARLY_MAX];
} early = {.lock = PTHREAD_MUTEX_INITIALIZER};

int rt_tcp_bind_early(const char *host, int port)
{
    if (strlen(host) >= sizeof(early.s[0].host))
        return RT_EINVAL;
    pthread_mutex_lock(&early.lock);
    int fd = -1;
    int rc = early.n == RT_EARLY_MAX ? RT_ELIMIT : tcp_bind(host, port, 0, &fd);
    if (rc == 0) {
        snprintf(early.s[early.n].host, sizeof(early.s[0].host), "%s", host);
        early.s[early.n].port = port;
        early.s[early.n].fd = fd;
        early.n++;
    }
    pthread_mutex_unlock(&early.lock);
    return rc;
}

/* The socket bound early for host:port, taken out of the list; -1 if none waits. */
static int take_early(const char *host, int port)
{
    int fd = -1;
    pthread_mutex_lock(&early.lock);
    for (unsigned i = 0; i < early.n && fd < 0; i++)
        if (early.s[i].port == port && strcmp(early.s[i].host, host) == 0) {
            fd = early.s[i].fd;
            early.s[i] = early.s[--early.n];
        }
    pthread_mutex_unlock(&early.lock);
    return fd;
}

void rt_tcp_close_early(void)
{
    pthread_mutex_lock(&early.lock);
    while (early.n)
        close(early.s[--early.n].fd);
    pthread_mutex_unlock(&early.lock);
}

const char *rt_tcp_listen_strerror(int rc)
{
    return rc == RT_EEXIST      ? "address already in use"
           : rc == RT_ENOTFOUND ? "address not on this machine"
           : rc == RT_EACCES    ? "permission denied (a port below 1024 needs "
                                  "CAP_NET_BIND_SERVICE)"
                                : rt_strerror(rc);
}

int rt_tcp_listen(rt_actor_t *self, const char *host, int port, int backlog, rt_sock_t **out)
{
    int fd = take_early(host, port);
    int rc = 0;
    /* On Linux a second listen() sets the backlog of a listening socket. */
    if (fd >= 0 && backlog > 0 && listen(fd, backlog) < 0)
        rc = RT_EINVAL;
    else if (fd < 0)
        rc = tcp_bind(host, port, backlog, &fd);
    if (!rc && (rc = attach(self, fd, true, out)))
        close(fd);
    return rc;
}

int rt_sock_accept(rt_sock_t *l, int *fd, struct sockaddr_storage *peer)
{
    if (LOAD(l->closed) || !l->listening)
        return RT_ECLOSED;
    for (;;) {
        socklen_t peer_len = sizeof(*peer);
        if (peer)
            peer->ss_family = AF_UNSPEC; /* a unix socket's peer may have no address */
        int c = accept4(l->fd, (struct sockaddr *)peer, peer ? &peer_len : NULL,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c >= 0) {
            *fd = c;
            return 0;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            atomic_store(&l->readable, 0);
            return RT_EAGAIN;
        }
        /* EMFILE and friends: report, and let the owner retry on a later event. */
        return errno == EMFILE || errno == ENFILE ? RT_ELIMIT : RT_EINVAL;
    }
}

/* Asked on every accept: a syscall each (prlimit64), a measurable share of a short login. */
long rt_fd_limit(void)
{
    static _Atomic long limit;
    static _Atomic uint64_t read_ms;
    uint64_t now = rt_mono_ms();
    long l = atomic_load_explicit(&limit, memory_order_relaxed);
    if (l && now - atomic_load_explicit(&read_ms, memory_order_relaxed) < 1000)
        return l;
    struct rlimit rl;
    l = getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > LONG_MAX
            ? LONG_MAX
            : (long)rl.rlim_cur;
    atomic_store_explicit(&limit, l, memory_order_relaxed);
    atomic_store_explicit(&read_ms, now, memory_order_relaxed);
    return l;
}

bool rt_fd_in_reserve(int fd, long reserve)
{
    return (long)fd >= rt_fd_limit() - reserve;
}

int rt_sock_adopt_listener(rt_actor_t *self, int fd, rt_sock_t **out)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return RT_EINVAL;
    no_delay(fd);
    return attach(self, fd, true, out);
}

int rt_sock_adopt(rt_actor_t *self, int fd, rt_sock_t **out)
{
    /* Two fcntl calls a connection saved: every caller's fd is non-blocking already. */
    RT_ASSERT(fcntl(fd, F_GETFL) & O_NONBLOCK);
    return attach(self, fd, false, out);
}

int rt_sock_read(rt_sock_t *s, const void **data, size_t *len)
{
    rt_sched_t *sch = rt__tls.sched;
    if (LOAD(s->closed) || s->broken)
        return RT_ECLOSED;
    if (!sch)
        return RT_EINVAL;
    /* A read shorter than the buffer emptied the socket: with edge-triggered epoll, data
       that arrives later raises a new event, so the read that would only say EAGAIN is
       skipped (it was half of all reads under load). Cleared before the read, so an
       event that lands after it is never lost. */
    if (!atomic_exchange(&s->readable, 0))
        return RT_EAGAIN;
    for (;;) {
        ssize_t n = read(s->fd, sch->scratch, RT_SCRATCH_BYTES);
        if (n > 0) {
            if ((size_t)n == RT_SCRATCH_BYTES)
                atomic_store(&s->readable, 1);
            *data = sch->scratch;
            *len = (size_t)n;
            return 0;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RT_EAGAIN;
        s->eof = 1;
        return RT_ECLOSED;
    }
}

void rt_sock_low_at_hangup(rt_sock_t *s)
{
    atomic_store_explicit(&s->low_at_hangup, 1, memory_order_relaxed);
}

void rt_sock_pause_reading(rt_sock_t *s, bool paused)
{
    atomic_store(&s->paused, paused);
    if (!paused && atomic_load(&s->readable))
        post_event(s);
}

static size_t high_water(const rt_sock_t *s)
{
    return s->high_water ? s->high_water : RT_SOCK_HIGH_WATER;
}

/* An owner is under pressure while any of its sockets holds more than its mark. */
static void update_pressure(rt_actor_t *a)
{
    bool over = false;
    for (rt_sock_t *s = a->socks; s && !over; s = s->next)
        over = rt_sock_pending(s) > high_water(s);
    rt__set_pressure(a, over);
}

/* Sends what is buffered; drained, the buffer is freed (an idle connection keeps none). */
static int flush(rt_sock_t *s)
{
    rt_sock_out_t *o = s->out;
    /* Set before the send, so a poller that sees the EPOLLOUT following a refusal sees it
       too (set after, that edge could come in between and be the last one). */
    atomic_store(&s->blocked, 1);
    RT_ASSERT(o && RT_SOCK_OUT_OK(o)); /* callers flush only a socket with output */
    RT_ASSERT(!o->reserved);           /* draining frees the buffer a reservation points into */
    while (o && o->off < o->len) {
        ssize_t n = send(s->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL);
        if (n > 0) {
            o->off += (size_t)n;
            RT_ASSERT(o->off <= o->len); /* the kernel took no more than it was offered */
            s->took = 1;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RT_EAGAIN;
        s->broken = 1;
        return RT_ECLOSED;
    }
    atomic_store_explicit(&s->blocked, 0, memory_order_relaxed);
    out_free(s->out);
    s->out = NULL;
    update_pressure(s->owner);
    return 0;
}

/*
** Output is buffered and sent once at the end of the owner's turn (or as soon as
** RT_SOCK_FLUSH_AT bytes wait), so an actor that writes a hundred packets in a
** turn makes one system call, not a hundred. A write is a reserve, a copy and a
** commit, so both ways of writing grow, count and flush the buffer alike.
*/
void *rt_sock_reserve(rt_sock_t *s, size_t len)
{
    /* Output is the owner's: its turn, its init or terminate, or a thread outside actors. */
    RT_ASSERT(!rt__tls.current || rt__tls.current == s->owner);
    RT_ASSERT(!s->out || !s->out->reserved); /* one reservation at a time */
    if (LOAD(s->closed) || s->broken)
        return NULL;
    rt_sock_out_t *o = s->out;
    size_t live = o ? o->len - o->off : 0;
    if (o && o->len + len > o->cap && live + len <= o->cap) {
        /* What the kernel took left room at the front: the rest moves down in place. A
           new buffer would cost the same copy, and past the cache's 1 MiB a malloc whose
           pages fault in and a free that trims the arena (fan-in at 1 KB). */
        memmove(o->data, o->data + o->off, live);
        o->len = live;
        o->off = 0;
    }
    if (!o || o->len + len > o->cap) {
        size_t cap = o && o->cap ? o->cap : 4096;
        while (cap < live + len)
            cap *= 2;
        rt_sock_out_t *n = out_alloc(cap);
        if (!n)
            return NULL;
        if (live)
            memcpy(n->data, o->data + o->off, live);
        out_free(o);
        n->len = live;
        n->off = 0;
        n->reserved = 0;
        s->out = o = n;
    }
    RT_ASSERT(RT_SOCK_OUT_OK(o) && len <= o->cap - o->len); /* room for the bytes */
    /* Marks a reservation even for len 0, so a commit always follows one. */
    o->reserved = len ? len : SIZE_MAX;
    return o->data + o->len;
}

int rt_sock_commit(rt_sock_t *s, size_t len)
{
    RT_ASSERT(!rt__tls.current || rt__tls.current == s->owner);
    rt_sock_out_t *o = s->out;
    RT_ASSERT(o && o->reserved); /* only after a reserve */
    RT_ASSERT(len <= o->reserved && len <= o->cap - o->len);
    o->reserved = 0;
    o->len += len;
    RT_ASSERT(RT_SOCK_OUT_OK(o));
    if (o->len - o->off >= RT_SOCK_FLUSH_AT && !LOAD(s->blocked) && flush(s) == RT_ECLOSED)
        return RT_ECLOSED;
    if (rt_sock_pending(s) > high_water(s))
        rt__set_pressure(s->owner, true);
    return 0;
}

int rt_sock_write(rt_sock_t *s, const void *data, size_t len)
{
    if (LOAD(s->closed) || s->broken)
        return RT_ECLOSED;
    void *room = rt_sock_reserve(s, len);
    if (!room)
        return RT_ENOMEM;
    if (len)
        memcpy(room, data, len);
    return rt_sock_commit(s, len);
}

int rt_sock_flush(rt_sock_t *s)
{
    if (LOAD(s->closed) || s->broken)
        return RT_ECLOSED;
    return s->out ? flush(s) : 0;
}

bool rt_sock_output_taken(rt_sock_t *s)
{
    bool took = s->took;
    s->took = 0;
    return took;
}

void rt_sock_set_high_water(rt_sock_t *s, size_t bytes)
{
    s->high_water = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
    update_pressure(s->owner);
}

/* End of the owner's turn: send what its handlers wrote. */
void rt__sock_flush_turn(rt_actor_t *a)
{
    for (rt_sock_t *s = a->socks; s; s = s->next) {
        if (s->out && !LOAD(s->blocked) && flush(s) == RT_ECLOSED) {
            /* The owner learns of it from its next read. */
            atomic_store(&s->readable, 1);
            post_event(s);
        }
    }
}

size_t rt_sock_pending(const rt_sock_t *s)
{
    RT_ASSERT(!s->out || RT_SOCK_OUT_OK(s->out));
    return s->out ? s->out->len - s->out->off : 0;
}

int rt_sock_fd(const rt_sock_t *s)
{
    return s->fd;
}

int rt_sock_local_port(const rt_sock_t *s)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(s->fd, (struct sockaddr *)&ss, &sl) < 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

/* Takes s out of its owner's list and the epoll set; closing: the caller closes the fd next. */
static void unlink_sock(rt_sock_t *s, bool closing)
{
    rt_actor_t *a = s->owner;
    RT_ASSERT(!LOAD(s->closed)); /* unlinked once: every caller looks at closed first */
    rt_sock_t **pp = &a->socks;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    RT_ASSERT(*pp == s); /* an open socket is on its owner's list */
    if (*pp)
        *pp = s->next;
    if (s->registered) {
        /* Closing the fd drops it from the epoll set (no socket of ours is dup'ed or
           inherited: accept4 gives them CLOEXEC), so only a socket handed on pays the call. */
        if (!closing)
            epoll_ctl(rt__rt->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        atomic_store_explicit(&rt__rt->by_fd[s->fd], NULL, memory_order_release);
    }
    out_free(s->out);
    s->out = NULL;
    update_pressure(a);
    atomic_store(&s->closed, 1);
    /* The claim is taken for good: no poller posts from now on. If an event message
       held it, that message still names this socket, and whoever consumes it frees it. */
    if (!atomic_exchange(&s->msg_pending, 1))
        sock_free(s);
}

void rt_sock_close(rt_sock_t *s)
{
    if (LOAD(s->closed))
        return;
    /* Last words (a DISCONNECT written by a terminate callback) get one try. */
    if (s->out && !LOAD(s->blocked) && !s->broken)
        flush(s);
    int fd = s->fd;
    unlink_sock(s, true);
    close(fd);
}

void rt_sock_close_lingering(rt_sock_t *s)
{
    if (LOAD(s->closed))
        return;
    if (s->eof || s->broken) {
        rt_sock_close(s); /* the peer writes nothing more: nothing to wait for */
        return;
    }
    if (s->out && !LOAD(s->blocked))
        flush(s);
    int fd = s->fd;
    unlink_sock(s, false); /* the fd stays open a while: out of the set now */
    rt__fd_linger(fd);
}

int rt_sock_detach(rt_sock_t *s)
{
    if (LOAD(s->closed))
        return -1;
    /* What was written belongs before anything the next owner writes (a TLS record
       missing from the stream would break it): it goes now, or the socket stays. */
    if (s->out && (s->broken || LOAD(s->blocked) || flush(s) != 0))
        return RT_EAGAIN;
    int fd = s->fd;
    unlink_sock(s, false);
    return fd;
}

void rt__sock_close_all(rt_actor_t *a)
{
    while (a->socks)
        rt_sock_close(a->socks);
}

/*
** Before the handler. The claim (msg_pending) stays with the message while the
** handler runs, so a close inside it leaves the struct to rt__sock_after_event.
*/
bool rt__sock_event_deliver(rt_actor_t *a, rt_msg_t *m)
{
    (void)a;
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    rt_sock_t *s = ev->sock;
    /* The message holds the socket's claim, which keeps the struct alive, and went to the
       owner: a socket never changes hands in place (a detach makes a new one). */
    RT_ASSERT(atomic_load(&s->msg_pending) && s->owner == a);
    if (LOAD(s->closed)) {
        sock_free(s);
        return false;
    }
    uint32_t events = atomic_exchange(&s->revents, 0);
    if (atomic_load(&s->readable) && !LOAD(s->paused))
        events |= RT_SOCK_READABLE;
    if ((events & RT_SOCK_WRITABLE) || s->out) {
        int rc = s->out ? flush(s) : 0;
        if (rc == RT_ECLOSED)
            events |= RT_SOCK_READABLE; /* the read reports the closed peer */
        events = rc == 0 ? events | RT_SOCK_WRITABLE : events & ~RT_SOCK_WRITABLE;
    }
    ev->events = events;
    if (!events)
        sock_end_claim(s);
    return events != 0;
}

/* After the handler: a socket still readable gets another event, so one turn stays bounded. */
void rt__sock_after_event(rt_msg_t *m)
{
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    sock_end_claim(ev->sock);
}

void rt__sock_msg_dropped(rt_msg_t *m)
{
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    RT_ASSERT(atomic_load(&ev->sock->msg_pending)); /* the dropped message held the claim */
    sock_drop_claim(ev->sock);
}

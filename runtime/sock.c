/*
** Actor-owned TCP sockets. Each scheduler has its own edge-triggered epoll
** set, nested into its libuv loop through one uv_poll_t, so a connection costs
** an fd and this small struct rather than a 250-byte uv_tcp_t.
**
** Threading: the poller and the owner's turns both run on the home scheduler's
** thread, so socket fields need no atomics. The one exception is an actor that
** adopts a socket while running elsewhere (its init on the spawning thread):
** the socket is then registered with epoll at the start of its first turn on
** the home thread, which the runtime schedules by waking the actor.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

#define RT_EPOLL_BATCH 256      /* events taken per epoll_wait */

/* Buffered output, allocated only while there is some: idle sockets stay small. */
typedef struct rt_sock_out_s {
    size_t len, off, cap; /* data[off, len) is still to send */
    unsigned char data[];
} rt_sock_out_t;

struct rt_sock_s {
    int fd;
    uint32_t revents;      /* events seen by the poller, not yet delivered */
    uint8_t msg_pending;   /* an RT_MSG_SOCKET for this socket is in the mailbox */
    uint8_t closed;
    uint8_t registered;    /* in the home scheduler's epoll set */
    uint8_t readable;      /* the last read did not reach EAGAIN */
    uint8_t paused;        /* the owner stopped reading (input backpressure) */
    uint8_t listening;
    uint8_t blocked;       /* the kernel refused output; waiting for EPOLLOUT */
    uint8_t broken;        /* a send failed for good; the next read reports it */
    uint32_t high_water;   /* pending bytes that mean pressure; 0: RT_SOCK_HIGH_WATER */
    rt_actor_t *owner;
    rt_sock_t *next;       /* the owner's list */
    struct rt_sock_out_s *out; /* output the kernel has not taken; NULL when empty */
};

static void on_epoll(uv_poll_t *h, int status, int events);

int rt__sock_sched_init(rt_sched_t *s)
{
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0)
        return RT_ENOMEM;
    if (uv_poll_init(&s->loop, &s->epoll_watch, s->epfd))
        return RT_ENOMEM;
    s->epoll_watch.data = s;
    uv_poll_start(&s->epoll_watch, UV_READABLE, on_epoll);
    return 0;
}

static void noop_close(uv_handle_t *h)
{
    (void)h;
}

void rt__sock_sched_close(rt_sched_t *s)
{
    if (s->epfd >= 0) {
        uv_poll_stop(&s->epoll_watch);
        uv_close((uv_handle_t *)&s->epoll_watch, noop_close);
        close(s->epfd);
        s->epfd = -1;
    }
}

static void sock_free(rt_sock_t *s)
{
    free(s->out);
    RT_POISON(s, sizeof(*s));
    free(s);
}

/* Posts one RT_MSG_SOCKET to the owner unless one is already waiting. */
static void post_event(rt_sock_t *s)
{
    if (s->msg_pending || s->closed)
        return;
    rt_msg_t *m = rt_msg_new(RT_MSG_SOCKET, sizeof(rt_sock_event_t));
    if (!m)
        return;
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    ev->sock = s;
    ev->events = 0;
    s->msg_pending = 1;
    if (rt_send_msg(s->owner->pid, m) != 0)
        s->msg_pending = 0; /* the owner is exiting; its exit closes the socket */
}

static void on_epoll(uv_poll_t *h, int status, int events)
{
    rt_sched_t *sch = h->data;
    if (!(atomic_load_explicit(&sch->ebr->local, memory_order_relaxed) & 1))
        rt__ebr_enter(sch->ebr);
    struct epoll_event evs[RT_EPOLL_BATCH];
    int n = epoll_wait(sch->epfd, evs, RT_EPOLL_BATCH, 0);
    for (int i = 0; i < n; i++) {
        rt_sock_t *s = evs[i].data.ptr;
        uint32_t e = evs[i].events;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            s->revents |= RT_SOCK_READABLE;
            s->readable = 1;
        }
        if ((e & EPOLLOUT) && s->out)
            s->revents |= RT_SOCK_WRITABLE;
        if (s->revents && !(s->paused && !(s->revents & RT_SOCK_WRITABLE)))
            post_event(s);
    }
}

static int epoll_add(rt_sock_t *s)
{
    rt_sched_t *home = &rt__rt->sched[s->owner->home];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = s};
    if (epoll_ctl(home->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0)
        return RT_EINVAL;
    s->registered = 1;
    return 0;
}

void rt__sock_register_pending(rt_actor_t *a)
{
    a->socks_unregistered = 0;
    for (rt_sock_t *s = a->socks; s; s = s->next) {
        if (!s->registered && !s->closed && epoll_add(s) == 0) {
            /* Data may have arrived before the registration: look once. */
            s->readable = 1;
            s->revents |= RT_SOCK_READABLE;
            post_event(s);
        }
    }
}

/* Picks the home of an actor's first socket: the scheduler with the fewest sockets. */
static void pin(rt_actor_t *a)
{
    rt_runtime_t *rt = rt__rt;
    if (a->home >= 0)
        return;
    unsigned best = 0, best_n = UINT32_MAX;
    unsigned start = atomic_fetch_add_explicit(&rt->rr, 1, memory_order_relaxed);
    for (unsigned k = 0; k < rt->nsched; k++) {
        unsigned i = (start + k) % rt->nsched;
        unsigned n = atomic_load_explicit(&rt->sched[i].sockets, memory_order_relaxed);
        if (n < best_n) {
            best = i;
            best_n = n;
        }
    }
    /* Atomic only for rtctl's snapshot, which reads it from other threads at any time;
       schedulers read it when the actor is made runnable, which the turn happens-before. */
    __atomic_store_n(&a->home, (int16_t)best, __ATOMIC_RELAXED);
}

static int attach(rt_actor_t *self, int fd, bool listening, rt_sock_t **out)
{
    if (self->type->flags & RT_TYPE_BLOCKING)
        return RT_EINVAL;
    rt_sock_t *s = calloc(1, sizeof(*s));
    if (!s)
        return RT_ENOMEM;
    s->fd = fd;
    s->owner = self;
    s->listening = listening;
    pin(self);
    atomic_fetch_add_explicit(&rt__rt->sched[self->home].sockets, 1, memory_order_relaxed);
    s->next = self->socks;
    self->socks = s;
    rt_sched_t *me = rt__tls.sched;
    if (me && me->index == (unsigned)self->home) {
        int rc = epoll_add(s);
        if (rc) {
            self->socks = s->next;
            atomic_fetch_sub_explicit(&rt__rt->sched[self->home].sockets, 1, memory_order_relaxed);
            free(s);
            return rc;
        }
    } else if (!self->socks_unregistered) {
        /* A wake-up gets the actor a turn on its home thread, which registers the socket. */
        self->socks_unregistered = 1;
        rt_msg_t *m = rt_msg_new(RT_SIG_WAKE, 0);
        if (m)
            rt_send_msg(self->pid, m);
    }
    *out = s;
    return 0;
}

int rt_tcp_listen(rt_actor_t *self, const char *host, int port, int backlog, rt_sock_t **out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
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
    int rc = 0;
    if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, backlog > 0 ? backlog : 1024) < 0)
        rc = errno == EADDRINUSE ? RT_EEXIST : RT_EINVAL;
    freeaddrinfo(res);
    if (!rc)
        rc = attach(self, fd, true, out);
    if (rc)
        close(fd);
    return rc;
}

int rt_sock_accept(rt_sock_t *l, int *fd)
{
    if (l->closed || !l->listening)
        return RT_ECLOSED;
    for (;;) {
        int c = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c >= 0) {
            *fd = c;
            return 0;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            l->readable = 0;
            return RT_EAGAIN;
        }
        /* EMFILE and friends: report, and let the owner retry on a later event. */
        return errno == EMFILE || errno == ENFILE ? RT_ELIMIT : RT_EINVAL;
    }
}

int rt_sock_adopt_listener(rt_actor_t *self, int fd, rt_sock_t **out)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return RT_EINVAL;
    return attach(self, fd, true, out);
}

int rt_sock_adopt(rt_actor_t *self, int fd, rt_sock_t **out)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return RT_EINVAL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return attach(self, fd, false, out);
}

int rt_sock_read(rt_sock_t *s, const void **data, size_t *len)
{
    rt_sched_t *sch = rt__tls.sched;
    if (s->closed || s->broken)
        return RT_ECLOSED;
    if (!sch)
        return RT_EINVAL;
    /* A read shorter than the buffer emptied the socket: with edge-triggered epoll, data
       that arrives later raises a new event, so the read that would only say EAGAIN is
       skipped (it was half of all reads under load). */
    if (!s->readable)
        return RT_EAGAIN;
    /* Cleared before the read, so an event that lands after it is never lost. */
    s->readable = 0;
    for (;;) {
        ssize_t n = read(s->fd, sch->scratch, RT_SCRATCH_BYTES);
        if (n > 0) {
            s->readable = (size_t)n == RT_SCRATCH_BYTES;
            *data = sch->scratch;
            *len = (size_t)n;
            return 0;
        }
        if (n == 0)
            return RT_ECLOSED;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return RT_EAGAIN;
        return RT_ECLOSED;
    }
}

void rt_sock_pause_reading(rt_sock_t *s, bool paused)
{
    s->paused = paused;
    if (!paused && s->readable)
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
    while (o && o->off < o->len) {
        ssize_t n = send(s->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL);
        if (n > 0) {
            o->off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            s->blocked = 1;
            return RT_EAGAIN;
        }
        s->broken = 1;
        return RT_ECLOSED;
    }
    s->blocked = 0;
    free(s->out);
    s->out = NULL;
    update_pressure(s->owner);
    return 0;
}

/*
** Output is buffered and sent once at the end of the owner's turn (or as soon as
** RT_SOCK_FLUSH_AT bytes wait), so an actor that writes a hundred packets in a
** turn makes one system call, not a hundred.
*/
int rt_sock_write(rt_sock_t *s, const void *data, size_t len)
{
    if (s->closed || s->broken)
        return RT_ECLOSED;
    rt_sock_out_t *o = s->out;
    size_t live = o ? o->len - o->off : 0;
    if (!o || o->len + len > o->cap) {
        size_t cap = o && o->cap ? o->cap : 4096;
        while (cap < live + len)
            cap *= 2;
        rt_sock_out_t *n = malloc(sizeof(*n) + cap);
        if (!n)
            return RT_ENOMEM;
        if (live)
            memcpy(n->data, o->data + o->off, live);
        free(o);
        n->len = live;
        n->off = 0;
        n->cap = cap;
        s->out = o = n;
    }
    memcpy(o->data + o->len, data, len);
    o->len += len;
    if (o->len - o->off >= RT_SOCK_FLUSH_AT && !s->blocked && flush(s) == RT_ECLOSED)
        return RT_ECLOSED;
    if (rt_sock_pending(s) > high_water(s))
        rt__set_pressure(s->owner, true);
    return 0;
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
        if (s->out && !s->blocked && flush(s) == RT_ECLOSED) {
            /* The owner learns of it from its next read. */
            s->readable = 1;
            post_event(s);
        }
    }
}

size_t rt_sock_pending(const rt_sock_t *s)
{
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

/* Takes s out of its owner's list and the epoll set; the caller decides about the fd. */
static void unlink_sock(rt_sock_t *s)
{
    rt_actor_t *a = s->owner;
    for (rt_sock_t **pp = &a->socks; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    if (s->registered)
        epoll_ctl(rt__rt->sched[a->home].epfd, EPOLL_CTL_DEL, s->fd, NULL);
    atomic_fetch_sub_explicit(&rt__rt->sched[a->home].sockets, 1, memory_order_relaxed);
    s->closed = 1;
    free(s->out);
    s->out = NULL;
    update_pressure(a);
    /* A queued event still names this socket; whoever consumes it frees it. */
    if (!s->msg_pending)
        sock_free(s);
}

void rt_sock_close(rt_sock_t *s)
{
    if (s->closed)
        return;
    /* Last words (a DISCONNECT written by a terminate callback) get one try. */
    if (s->out && !s->blocked && !s->broken)
        flush(s);
    int fd = s->fd;
    unlink_sock(s);
    close(fd);
}

int rt_sock_detach(rt_sock_t *s)
{
    if (s->closed)
        return -1;
    int fd = s->fd;
    unlink_sock(s);
    return fd;
}

void rt__sock_close_all(rt_actor_t *a)
{
    while (a->socks)
        rt_sock_close(a->socks);
}

/*
** Before the handler. msg_pending stays set while the handler runs, so a close
** inside it leaves the struct to rt__sock_after_event.
*/
bool rt__sock_event_deliver(rt_actor_t *a, rt_msg_t *m)
{
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    rt_sock_t *s = ev->sock;
    if (s->closed) {
        sock_free(s);
        return false;
    }
    uint32_t events = s->revents;
    s->revents = 0;
    if (s->readable && !s->paused)
        events |= RT_SOCK_READABLE;
    if ((events & RT_SOCK_WRITABLE) || s->out) {
        int rc = s->out ? flush(s) : 0;
        if (rc == RT_ECLOSED)
            events |= RT_SOCK_READABLE; /* the read reports the closed peer */
        events = rc == 0 ? events | RT_SOCK_WRITABLE : events & ~RT_SOCK_WRITABLE;
    }
    ev->events = events;
    if (!events)
        s->msg_pending = 0;
    return events != 0;
}

/* After the handler: a socket still readable gets another event, so one turn stays bounded. */
void rt__sock_after_event(rt_msg_t *m)
{
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    rt_sock_t *s = ev->sock;
    s->msg_pending = 0;
    if (s->closed)
        sock_free(s);
    else if (s->readable && !s->paused)
        post_event(s);
}

void rt__sock_msg_dropped(rt_msg_t *m)
{
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    rt_sock_t *s = ev->sock;
    s->msg_pending = 0;
    if (s->closed)
        sock_free(s);
}

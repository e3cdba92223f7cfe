#define _GNU_SOURCE /* accept4 */
#include "mt_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "mt_wire.h"

#define MT_READ_CHUNK 65536     /* bytes asked of each recv */
#define MT_READ_BATCH (1 << 20) /* bytes read from one connection before handling them */

typedef struct mt_conn {
    struct mt_conn *next;
    struct mt_conn *prev;
    int fd;
    int64_t id;         /* connectionId reported by hello */
    mt_buf_t in;        /* received bytes not yet handled */
    mt_buf_t out;       /* reply bytes not yet sent */
    int64_t hold_until; /* mt_now_ms() before which out is not sent (stall); 0 = none */
    uint32_t events;    /* epoll interest currently registered */
    bool control;       /* sent rtFault: exempt from refuse, so the test can clear it */
} mt_conn_t;

typedef struct server {
    mt_state_t *st;
    int ep;
    int listen_fd;
    int stop_fd;
    int spare_fd; /* held open so that out of descriptors, a waiting client can still be shut out */
    mt_conn_t *conns;
    mt_conn_t *dead; /* closed this loop turn; freed after its events, which may name them */
    int32_t next_request_id;
} server_t;

/* epoll data for the two non-connection descriptors; connections use their mt_conn_t. */
static char listen_tag, stop_tag;

int mt_listen(const char *host, int port, int *fd, int *bound_port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t len = sizeof sa;
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        (ntohl(sa.sin_addr.s_addr) >> 24) != 127)
        return RT_EINVAL;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -errno;
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 128) ||
        getsockname(s, (struct sockaddr *)&sa, &len)) {
        int rc = -errno;
        close(s);
        return rc;
    }
    *fd = s;
    *bound_port = ntohs(sa.sin_port);
    return 0;
}

/* Closes c at once; its memory lives on (fd -1) until free_dead, after the event batch. */
static void conn_close(server_t *sv, mt_conn_t *c)
{
    epoll_ctl(sv->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        sv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = sv->dead;
    sv->dead = c;
    sv->st->conns_current--;
}

static void free_dead(server_t *sv)
{
    while (sv->dead) {
        mt_conn_t *c = sv->dead;
        sv->dead = c->next;
        mt_buf_free(&c->in);
        mt_buf_free(&c->out);
        free(c);
    }
}

static bool conn_blocked(const mt_conn_t *c)
{
    return c->hold_until || c->out.len - c->out.off > MT_OUT_HIGH;
}

/*
** Reads while the connection can take requests; writes while replies wait and
** are not held. Returns 0, or RT_ECLOSED if c had to be closed.
*/
static int conn_update(server_t *sv, mt_conn_t *c)
{
    uint32_t ev = 0;
    if (!conn_blocked(c))
        ev |= EPOLLIN;
    if (!c->hold_until && c->out.len > c->out.off)
        ev |= EPOLLOUT;
    if (ev == c->events)
        return 0;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    c->events = ev;
    if (!epoll_ctl(sv->ep, EPOLL_CTL_MOD, c->fd, &e))
        return 0;
    /* A connection the loop cannot watch would hang its client: drop it. */
    conn_close(sv, c);
    return RT_ECLOSED;
}

/* Sends what is due; RT_ECLOSED (connection freed) if the peer is gone. */
static int conn_flush(server_t *sv, mt_conn_t *c)
{
    while (!c->hold_until && c->out.off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        conn_close(sv, c);
        return RT_ECLOSED;
    }
    if (c->out.off == c->out.len)
        c->out.off = c->out.len = 0;
    return 0;
}

/* Closes every connection but the control ones, for rtFault refuse. */
static void refuse_all(server_t *sv)
{
    mt_conn_t *c = sv->conns;
    while (c) {
        mt_conn_t *next = c->next;
        if (!c->control)
            conn_close(sv, c);
        c = next;
    }
}

/* Handles one complete message; RT_ECLOSED if it ended the connection. */
static int conn_message(server_t *sv, mt_conn_t *c, const uint8_t *msg, const mt_header_t *h)
{
    mt_request_t req;
    char err[128];
    if (mt_wire_parse(msg, h, &req, err, sizeof err)) {
        /* A malformed message leaves the stream unframed: only closing is safe. */
        mt_request_destroy(&req);
        sv->st->protocol_errors++;
        conn_close(sv, c);
        return RT_ECLOSED;
    }
    mt_call_t call = {.db = req.db, .conn_id = c->id};
    bson_t reply = BSON_INITIALIZER;
    if (req.legacy_failure) {
        BSON_APPEND_UTF8(&reply, "$err", "rt_mongo_test answers only commands (<db>.$cmd)");
        BSON_APPEND_INT32(&reply, "code", 59);
    } else {
        mt_cmd_run(sv->st, &call, &req.cmd, &reply);
    }
    int rc = 0;
    if (!req.more_to_come) {
        /* A stall set by this very command starts with the next reply. */
        int64_t stall = call.control ? 0 : sv->st->stall_ms;
        rc = mt_wire_reply(&c->out, &req, ++sv->next_request_id, &reply);
        if (!rc && stall)
            c->hold_until = mt_now_ms() + stall;
    }
    bson_destroy(&reply);
    mt_request_destroy(&req);
    if (rc) {
        conn_close(sv, c);
        return RT_ECLOSED;
    }
    c->control |= call.control;
    if (call.refuse)
        refuse_all(sv);
    return 0;
}

/* Handles the complete messages buffered while the connection is not blocked. */
static int conn_process(server_t *sv, mt_conn_t *c)
{
    int rc = 0;
    while (!conn_blocked(c) && c->in.len - c->in.off >= MT_HEADER_LEN) {
        mt_header_t h;
        mt_wire_header(c->in.p + c->in.off, &h);
        if (h.len < MT_HEADER_LEN || h.len > MT_MAX_MESSAGE) {
            sv->st->protocol_errors++;
            conn_close(sv, c);
            return RT_ECLOSED;
        }
        if (c->in.len - c->in.off < (size_t)h.len)
            break;
        size_t off = c->in.off;
        c->in.off += (size_t)h.len;
        rc = conn_message(sv, c, c->in.p + off, &h);
        if (rc)
            return rc;
    }
    mt_buf_compact(&c->in);
    rc = conn_flush(sv, c);
    return rc ? rc : conn_update(sv, c);
}

static int conn_read(server_t *sv, mt_conn_t *c)
{
    for (;;) {
        if (mt_buf_reserve(&c->in, MT_READ_CHUNK)) {
            conn_close(sv, c);
            return RT_ECLOSED;
        }
        ssize_t n = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
        if (n > 0) {
            c->in.len += (size_t)n;
            /*
            ** Handle what has come before reading on, so a client that sends
            ** without pause neither monopolises the loop nor grows the buffer
            ** beyond one message plus MT_READ_BATCH.
            */
            if (c->in.len - c->in.off >= MT_READ_BATCH)
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        /*
        ** At end of stream the requests already received still run: a client may
        ** send unacknowledged (moreToCome) writes and close at once.
        */
        if (n == 0 && !conn_process(sv, c))
            conn_close(sv, c);
        else if (n != 0)
            conn_close(sv, c);
        return RT_ECLOSED;
    }
    return conn_process(sv, c);
}

static void do_accept(server_t *sv)
{
    for (;;) {
        int fd = accept4(sv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && sv->spare_fd >= 0) {
            /*
            ** Left pending, the connection would keep the listener readable and
            ** spin the loop; so free a descriptor, take it and close it (libuv's
            ** trick).
            */
            close(sv->spare_fd);
            fd = accept4(sv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                close(fd);
            sv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            sv->st->conns_refused++;
            if (fd >= 0)
                continue;
        }
        if (fd < 0)
            return;
        sv->st->conns_total++;
        if (mt_now_ms() < sv->st->refuse_until || sv->st->conns_current >= MT_CONNS_MAX) {
            sv->st->conns_refused++;
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        mt_conn_t *c = calloc(1, sizeof *c);
        struct epoll_event e = {.events = EPOLLIN};
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->id = sv->st->conns_total;
        c->events = EPOLLIN;
        e.data.ptr = c;
        if (epoll_ctl(sv->ep, EPOLL_CTL_ADD, fd, &e)) {
            close(fd);
            free(c);
            continue;
        }
        c->next = sv->conns;
        if (sv->conns)
            sv->conns->prev = c;
        sv->conns = c;
        sv->st->conns_current++;
    }
}

/*
** Releases replies whose stall is over; returns ms until the next one is due,
** or -1. The scan restarts after each release, since handling the requests
** behind a reply may close other connections (rtFault refuse).
*/
static int release_held(server_t *sv)
{
    for (;;) {
        int64_t now = mt_now_ms(), next = -1;
        mt_conn_t *due = NULL;
        for (mt_conn_t *c = sv->conns; c && !due; c = c->next) {
            if (c->hold_until && c->hold_until <= now)
                due = c;
            else if (c->hold_until && (next < 0 || c->hold_until - now < next))
                next = c->hold_until - now;
        }
        if (!due)
            return (int)next;
        due->hold_until = 0;
        conn_process(sv, due);
    }
}

int mt_server_run(mt_state_t *st, int listen_fd, int stop_fd)
{
    server_t sv = {.st = st, .listen_fd = listen_fd, .stop_fd = stop_fd};
    sv.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN}, evs[64];
    int rc = 0;
    sv.ep = epoll_create1(EPOLL_CLOEXEC);
    if (sv.ep < 0)
        return -errno;
    e.data.ptr = &listen_tag;
    if (epoll_ctl(sv.ep, EPOLL_CTL_ADD, listen_fd, &e))
        rc = -errno;
    e.data.ptr = &stop_tag;
    if (!rc && epoll_ctl(sv.ep, EPOLL_CTL_ADD, stop_fd, &e))
        rc = -errno;
    for (bool stop = false; !rc && !stop;) {
        int timeout = release_held(&sv);
        int n = epoll_wait(sv.ep, evs, 64, timeout);
        if (n < 0 && errno != EINTR)
            rc = -errno;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p != &stop_tag && p != &listen_tag && ((mt_conn_t *)p)->fd < 0)
                continue;
            if (p == &stop_tag) {
                stop = true;
            } else if (p == &listen_tag) {
                do_accept(&sv);
            } else if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                /* Reading also notices a closed peer; the flush happens in conn_process. */
                conn_read(&sv, p);
            } else if (evs[i].events & EPOLLOUT) {
                mt_conn_t *c = p;
                if (!conn_flush(&sv, c))
                    conn_process(&sv, c);
            }
        }
        free_dead(&sv);
    }
    while (sv.conns)
        conn_close(&sv, sv.conns);
    free_dead(&sv);
    if (sv.spare_fd >= 0)
        close(sv.spare_fd);
    close(sv.ep);
    return rc;
}

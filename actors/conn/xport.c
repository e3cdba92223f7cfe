/*
** The transport between a connection's socket and its MQTT parser, for listeners that are
** more than plain TCP: a PROXY protocol header first, then TLS, then WebSocket, any of
** them; and the per-client rate limit. All of it runs in the connection actor's turns.
**
** Input climbs the layers in place: the PROXY header is cut from the front of what was
** read, TLS decrypts into a per-thread buffer (rt_tls_conn_t, actors/transport/tls_conn.h,
** which the HTTP listener's connections run too), WebSocket frames are unmasked where they
** lie, and MQTT's bytes go to rt__conn_input. Everything read from the socket is taken
** through every layer before the handler returns: a layer keeps only what it cannot use yet
** (a split frame header, an incomplete HTTP head or PROXY header, in `stash`; a partial TLS
** record, inside OpenSSL).
** Output goes down the same way: a packet becomes a binary frame, the frame a TLS record,
** and the record goes to the socket's buffer.
**
** Memory. The state is malloc'ed beside the socket it extends (like rt_sock_t), counted
** in xport_bytes and in the client's memory; TLS's stage for a turn's output is counted by
** tls_conn.c. An idle connection keeps its state and its SSL, without record buffers
** (SSL_MODE_RELEASE_BUFFERS) and without a stash.
**
** A connection that hands its socket to the actor holding its session (a resumed session,
** connect.c) hands this state with it: the SSL and whatever the layers kept belong to the
** byte stream, not to the actor.
*/
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_impl.h"
#include "log.h"
#include "proxy.h"
#include "tls.h"
#include "tls_conn.h"
#include "ws.h"

typedef enum {
    STAGE_PROXY, /* waiting for the PROXY protocol header */
    STAGE_TLS,   /* the TLS handshake */
    STAGE_HTTP,  /* the WebSocket upgrade request */
    STAGE_OPEN,  /* MQTT flows */
} stage_t;

/* The client behind a proxy. */
typedef struct xport_peer_s {
    rt_auth_addr_t addr;
    uint16_t port;
} xport_peer_t;

/* A client's rate limit: two token buckets, refilled continuously. */
typedef struct xport_rate_s {
    const rt_conf_rate_t *limit; /* the listener's or the user's; rt_broker->conf lives on */
    double messages, bytes;      /* tokens; below 0 after a read that overdrew them */
    uint64_t refill_ms;
    uint32_t limited; /* times the client was slowed */
    bool waiting;     /* reading paused until the refill timer */
} xport_rate_t;

struct rt_xport_s {
    rt_tls_conn_t tls;   /* tls.ssl NULL: no TLS */
    uint8_t *stash;      /* malloc: bytes the current layer cannot use yet; NULL when none */
    xport_rate_t *rate;  /* malloc; NULL: no limit */
    struct xport_peer_s *real; /* malloc: the client's address from a PROXY header or
                                  X-Forwarded-For; NULL: the socket's peer is the client */
    uint32_t stash_len;
    rt_ws_in_t ws;
    uint8_t stage;
    uint8_t listener;
    uint8_t websocket : 1;
    uint8_t ws_closing : 1; /* our close frame went out */
    uint8_t preauth : 1;    /* before authentication: the stash counts in max_preauth_memory */
    uint8_t pong_out : 1;   /* a pong was written and output may still wait (ws_pong) */
    uint8_t held : 1;       /* the stash is input held back until output drains (a ping
                               whose pong must wait, and what followed it) */
};

/* An idle WebSocket connection's whole transport cost: one 80-byte malloc chunk. */
_Static_assert(sizeof(struct rt_xport_s) <= 72, "rt_xport_t outgrew its malloc chunk");

static atomic_size_t xport_bytes; /* all connections' states and stashes */

static const rt_listen_t *listener_of(const rt_xport_t *xp)
{
    return &rt_broker->conf.listeners[xp->listener];
}

/* ---- Memory ---- */

static void stash_clear(rt_xport_t *xp)
{
    free(xp->stash);
    atomic_fetch_sub_explicit(&xport_bytes, xp->stash_len, memory_order_relaxed);
    if (xp->preauth)
        rt__conn_preauth_charge(-(int64_t)xp->stash_len);
    xp->stash = NULL;
    xp->stash_len = 0;
}

/* Takes the stash out (the caller frees it): a layer decodes from it, keeping a new tail. */
static uint8_t *stash_take(rt_xport_t *xp, size_t *len)
{
    uint8_t *b = xp->stash;
    *len = xp->stash_len;
    atomic_fetch_sub_explicit(&xport_bytes, xp->stash_len, memory_order_relaxed);
    if (xp->preauth)
        rt__conn_preauth_charge(-(int64_t)xp->stash_len);
    xp->stash = NULL;
    xp->stash_len = 0;
    return b;
}

/*
** Appends to the stash; false when out of memory, or when the pre-auth budget has no room
** (then the connection is ended here, logged).
*/
static bool stash_append(rt_actor_t *self, conn_t *c, rt_xport_t *xp, const uint8_t *p, size_t n)
{
    if (xp->preauth && !rt__conn_preauth_charge((int64_t)n)) {
        rt__conn_preauth_refused(self, c, (size_t)xp->stash_len + n);
        return false;
    }
    uint8_t *s = realloc(xp->stash, (size_t)xp->stash_len + n);
    if (!s) {
        if (xp->preauth)
            rt__conn_preauth_charge(-(int64_t)n);
        return false;
    }
    memcpy(s + xp->stash_len, p, n);
    xp->stash = s;
    xp->stash_len += (uint32_t)n;
    atomic_fetch_add_explicit(&xport_bytes, n, memory_order_relaxed);
    return true;
}

size_t rt__xport_memory(const conn_t *c)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp)
        return 0;
    return sizeof(*xp) + xp->stash_len + (xp->rate ? sizeof(*xp->rate) : 0) +
           (xp->real ? sizeof(*xp->real) : 0) + rt_tls_conn_memory(&xp->tls);
}

size_t rt__xport_unsent(const conn_t *c)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    return xp ? xp->tls.out_len : 0;
}

void rt__xport_preauth_end(conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp || !xp->preauth)
        return;
    rt__conn_preauth_charge(-(int64_t)xp->stash_len);
    xp->preauth = 0;
}

size_t rt_xport_total_memory(void)
{
    return atomic_load_explicit(&xport_bytes, memory_order_relaxed) + rt_tls_conn_total_memory();
}

/* ---- Start and end ---- */

static bool rate_configured(const rt_conf_rate_t *r)
{
    return r->messages > 0 || r->bytes > 0;
}

static void rate_free(rt_xport_t *xp)
{
    if (!xp->rate)
        return;
    free(xp->rate);
    xp->rate = NULL;
    atomic_fetch_sub_explicit(&xport_bytes, sizeof(*xp->rate), memory_order_relaxed);
}

static void rate_use(rt_xport_t *xp, const rt_conf_rate_t *limit)
{
    if (!rate_configured(limit)) {
        rate_free(xp);
        return;
    }
    if (!xp->rate) {
        xp->rate = calloc(1, sizeof(*xp->rate));
        if (!xp->rate)
            return; /* unlimited rather than refused: the limit is a courtesy to others */
        atomic_fetch_add_explicit(&xport_bytes, sizeof(*xp->rate), memory_order_relaxed);
    }
    xp->rate->limit = limit;
    xp->rate->messages = limit->burst_messages > 0 ? limit->burst_messages : limit->messages;
    xp->rate->bytes = limit->burst_bytes > 0 ? limit->burst_bytes : limit->bytes;
    xp->rate->refill_ms = rt_mono_ms();
}

int rt__xport_start(conn_t *c)
{
    const rt_listen_t *l = &rt_broker->conf.listeners[c->listener];
    bool any_user_rate = rt_broker->conf.nuser_rates > 0;
    if (!l->tls_on && !l->websocket[0] && !l->proxy_protocol && !rate_configured(&l->rate_limit) &&
        !any_user_rate)
        return 0; /* plain TCP: conn.c reads and writes the socket itself */
    rt_xport_t *xp = calloc(1, sizeof(*xp));
    if (!xp)
        return RT_ENOMEM;
    atomic_fetch_add_explicit(&xport_bytes, sizeof(*xp), memory_order_relaxed);
    xp->listener = c->listener;
    xp->websocket = l->websocket[0] != 0;
    xp->preauth = 1;
    xp->stage = l->proxy_protocol ? STAGE_PROXY
                : l->tls_on       ? STAGE_TLS
                : xp->websocket   ? STAGE_HTTP
                                  : STAGE_OPEN;
    if (l->tls_on && rt_tls_conn_attach(&xp->tls, rt_tls_accept(xp->listener), c->sock) != 0) {
        rt__xport_free(xp);
        return RT_ENOMEM;
    }
    rate_use(xp, &l->rate_limit);
    c->xp = xp;
    return 0;
}

void rt__xport_free(void *obj)
{
    rt_xport_t *xp = obj;
    if (!xp)
        return;
    rt_tls_conn_free(&xp->tls);
    stash_clear(xp);
    rate_free(xp);
    if (xp->real) {
        free(xp->real);
        atomic_fetch_sub_explicit(&xport_bytes, sizeof(*xp->real), memory_order_relaxed);
    }
    atomic_fetch_sub_explicit(&xport_bytes, sizeof(*xp), memory_order_relaxed);
    free(xp);
}

void rt__xport_adopt(conn_t *c, rt_xport_t *xp)
{
    c->xp = xp;
    if (xp)
        rt_tls_conn_move(&xp->tls, c->sock);
}

/* ---- Output ---- */

void rt__xport_flush(conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (xp && xp->tls.ssl)
        rt_tls_conn_flush(&xp->tls);
}

static int lower_write(rt_xport_t *xp, rt_sock_t *sock, const uint8_t *p, size_t n)
{
    return xp->tls.ssl ? rt_tls_conn_write(&xp->tls, p, n) : rt_sock_write(sock, p, n);
}

/* Header and payload go down apart: over TLS they are gathered into the turn's record anyway. */
static int ws_send(rt_xport_t *xp, rt_sock_t *sock, int opcode, const uint8_t *p, size_t n)
{
    uint8_t head[10];
    size_t h = rt_ws_frame_header(head, opcode, n);
    int rc = lower_write(xp, sock, head, h);
    return rc || !n ? rc : lower_write(xp, sock, p, n);
}

int rt__xport_write(conn_t *c, const uint8_t *p, size_t n)
{
    rt_xport_t *xp = c->xp;
    return xp->websocket ? ws_send(xp, c->sock, RT_WS_OP_BINARY, p, n)
                         : lower_write(xp, c->sock, p, n);
}

static void ws_send_close(rt_xport_t *xp, rt_sock_t *sock, uint16_t code)
{
    if (xp->ws_closing)
        return;
    xp->ws_closing = 1;
    uint8_t body[2] = {(uint8_t)(code >> 8), (uint8_t)code};
    ws_send(xp, sock, RT_WS_OP_CLOSE, body, sizeof(body));
}

void rt__xport_close(conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp)
        return;
    if (xp->stage == STAGE_OPEN && xp->websocket)
        ws_send_close(xp, c->sock, RT_WS_CLOSE_NORMAL);
    rt_tls_conn_close(&xp->tls);
    c->xp = NULL;
    rt__xport_free(xp);
}

/* ---- Input ---- */

/*
** A hand-over decided inside rt__xport_input (a CONNECT resuming a session another actor
** holds) waits until every layer has taken what was read: the bytes after the CONNECT are
** collected here, for the holder, instead of being parsed. One connection per thread at a
** time is inside its input.
*/
static _Thread_local struct {
    const conn_t *c; /* the connection handing over; NULL: none */
    rt_pid_t holder;
    uint8_t *bytes; /* malloc */
    size_t len;
    bool lost; /* out of memory collecting: the connection ends instead */
} handover;
static _Thread_local const conn_t *inputting;

bool rt__xport_collect(const conn_t *c, const uint8_t *p, size_t n)
{
    if (handover.c != c)
        return false;
    uint8_t *b = realloc(handover.bytes, handover.len + n);
    if (!b) {
        handover.lost = true;
        return true;
    }
    memcpy(b + handover.len, p, n);
    handover.bytes = b;
    handover.len += n;
    return true;
}

static void hand_over_now(rt_actor_t *self, conn_t *c)
{
    uint8_t *bytes = handover.bytes;
    size_t len = handover.len;
    rt_pid_t holder = handover.holder;
    bool lost = handover.lost;
    memset(&handover, 0, sizeof(handover));
    if (lost)
        rt_exit(self, RT_REASON_NORMAL); /* c->closing is set: the client reconnects */
    else
        rt__conn_send_socket(self, c, holder, bytes, len);
    free(bytes);
}

void rt__xport_hand_over(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                         size_t len)
{
    RT_ASSERT(!handover.c);
    handover.c = c;
    handover.holder = holder;
    c->closing = 1;
    rt__xport_collect(c, bytes, len);
    if (inputting != c)
        hand_over_now(self, c);
}

/* Whether input should go on through the layers: not once the connection ends, unless
   what follows is collected for a hand-over. */
static bool flowing(const conn_t *c)
{
    return c->sock && (!c->closing || handover.c == c);
}

/* The connection ends over a transport fault, already logged; nothing more is read. */
static void fail(rt_actor_t *self, conn_t *c)
{
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
}

static void ws_frames(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *buf, size_t len);
static void layers_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n);

/* Bytes above TLS (or raw, without it): the WebSocket layer or MQTT itself. */
static void plain_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n);

/* A transport event in the log: the client's address, then what happened. */
static void log_peer(const char *event, const conn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void log_peer(const char *event, const conn_t *c, const char *fmt, ...)
{
    char peer[INET6_ADDRSTRLEN + 8];
    rt__conn_peer_format(c, peer, sizeof(peer));
    va_list ap;
    va_start(ap, fmt);
    rt_logv(RT_LOG_INFO, event, "peer", peer, fmt, ap);
    va_end(ap);
}

/* What follows the handshake: the WebSocket upgrade or MQTT. */
static void tls_opened(rt_xport_t *xp)
{
    if (xp->stage == STAGE_TLS && rt_tls_conn_established(&xp->tls))
        xp->stage = xp->websocket ? STAGE_HTTP : STAGE_OPEN;
}

typedef struct {
    rt_actor_t *self;
    conn_t *c;
    rt_xport_t *xp;
} tls_reader_t;

static bool tls_plain(void *ctx, uint8_t *p, size_t n)
{
    tls_reader_t *r = ctx;
    tls_opened(r->xp);
    plain_input(r->self, r->c, r->xp, p, n);
    return flowing(r->c);
}

static void tls_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, const uint8_t *p, size_t n)
{
    tls_reader_t reader = {self, c, xp};
    char why[RT_TLS_WHY_LEN];
    int rc = rt_tls_conn_input(&xp->tls, p, n, tls_plain, &reader, why, sizeof(why));
    if (rc == RT_EPROTO && !rt_tls_conn_established(&xp->tls)) {
        log_peer("tls.handshake_failed", c, "reason=%s", why);
        atomic_fetch_add_explicit(&rt_broker->stats.tls_failed, 1, memory_order_relaxed);
    } else if (rc == RT_EPROTO) {
        log_peer("tls.error", c, "reason=%s", why);
    }
    if (rc)
        fail(self, c);
    else if (flowing(c)) /* else the layers above may have closed the connection, and xp */
        tls_opened(xp);
}

/* The client's address behind its proxy counts from here on: logs, limits, ACL, rules. */
static bool take_real_address(rt_actor_t *self, conn_t *c, rt_xport_t *xp,
                              const rt_auth_addr_t *a, uint16_t port)
{
    if (!xp->real) {
        xp->real = malloc(sizeof(*xp->real));
        if (!xp->real)
            return false;
        atomic_fetch_add_explicit(&xport_bytes, sizeof(*xp->real), memory_order_relaxed);
    }
    xp->real->addr = *a;
    xp->real->port = port;
    rt_free(self, c->peer); /* made from the socket's peer, if it was */
    c->peer = NULL;
    if (!rt__listener_admit_peer(rt_sock_fd(c->sock), a)) {
        log_peer("proxy.refused", c, "reason=max_connections_per_ip");
        return false;
    }
    return true;
}

static void proxy_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n)
{
    uint8_t *own = NULL; /* the stash with what came joined to it */
    if (xp->stash_len) {
        if (!stash_append(self, c, xp, p, n)) {
            fail(self, c);
            return;
        }
        p = own = stash_take(xp, &n);
    }
    size_t used;
    rt_proxy_info_t info;
    const char *why = "malformed";
    int rc = rt_proxy_parse(p, n, &used, &info, &why);
    if (rc == RT_EAGAIN) { /* a prefix of a header within RT_PROXY_MAX: more must come */
        if (!stash_append(self, c, xp, p, n))
            fail(self, c);
    } else if (rc != 0) {
        log_peer("proxy.refused", c, "reason=malformed detail=%s", why);
        fail(self, c);
    } else if (!info.has_addr || take_real_address(self, c, xp, &info.src, info.src_port)) {
        xp->stage = xp->tls.ssl ? STAGE_TLS : xp->websocket ? STAGE_HTTP : STAGE_OPEN;
        if (used < n)
            layers_input(self, c, xp, p + used, n - used);
    } else {
        fail(self, c);
    }
    free(own);
}

static void ws_upgrade(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n)
{
    if (!stash_append(self, c, xp, p, n)) {
        fail(self, c);
        return;
    }
    const rt_listen_t *l = listener_of(xp);
    size_t head_len;
    rt_ws_upgrade_t u;
    const char *why = "bad request";
    int rc = rt_ws_parse_upgrade(xp->stash, xp->stash_len, l->websocket, &head_len, &u, &why);
    if (rc == RT_EAGAIN)
        return; /* the parser refuses a head past RT_WS_HEAD_MAX, so the stash is bounded */
    char answer[512];
    if (rc != 0) {
        log_peer("ws.refused", c, "status=%d reason=%s", rc, why);
        size_t len = rt_ws_error_response(rc, answer, sizeof(answer));
        lower_write(xp, c->sock, (const uint8_t *)answer, len);
        fail(self, c);
        return;
    }
    rt_auth_addr_t sock_addr, client;
    if (l->ntrusted && u.forwarded_for[0] &&
        rt_auth_addr_from_fd(rt_sock_fd(c->sock), &sock_addr) == 0 &&
        rt_conf_net_match(l->trusted_proxies, l->ntrusted, sock_addr.b) &&
        rt_forwarded_client(u.forwarded_for, l->trusted_proxies, l->ntrusted, &client) &&
        !take_real_address(self, c, xp, &client, 0)) {
        fail(self, c);
        return;
    }
    size_t answer_len = rt_ws_upgrade_response(&u, answer, sizeof(answer));
    if (lower_write(xp, c->sock, (const uint8_t *)answer, answer_len) != 0) {
        fail(self, c);
        return;
    }
    xp->stage = STAGE_OPEN;
    /* Frames that came with the head are decoded from the stash's copy. */
    size_t len;
    uint8_t *b = stash_take(xp, &len);
    if (len > head_len)
        ws_frames(self, c, xp, b + head_len, len - head_len);
    free(b);
}

static void ws_fail(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint16_t code, const char *why)
{
    log_peer("ws.closed", c, "code=%d reason=%s", code, why);
    ws_send_close(xp, c->sock, code);
    fail(self, c);
}

/*
** Whether a pong written earlier may still wait in rtd's output, after sending what can go
** now: the client has not read it.
*/
static bool pong_waiting(conn_t *c, rt_xport_t *xp)
{
    if (!xp->pong_out)
        return false;
    int rc = 0;
    if (rt_sock_pending(c->sock) + xp->tls.out_len) {
        rt__xport_flush(c);
        rc = rt_sock_flush(c->sock);
    }
    xp->pong_out = rc == RT_EAGAIN; /* then RT_SOCK_WRITABLE comes once it has drained */
    return xp->pong_out;
}

/*
** Answers the latest ping of a read (RFC 6455 5.5.3 lets the others go unanswered), with
** at most one pong waiting in rtd's output: while the last one has not gone, the ping is
** kept as a frame (unmasked: a zero mask) at the front of the stash, with what came after
** it, and the client's input waits until the output drains (rt__xport_resume). So a client
** that sends pings and never reads makes rtd write one pong, not one per ping.
** Returns false when the connection ended.
*/
static bool ws_pong(rt_actor_t *self, conn_t *c, rt_xport_t *xp, const rt_ws_event_t *ping,
                    const uint8_t *rest, size_t rest_len)
{
    if (!pong_waiting(c, xp)) {
        xp->pong_out = ws_send(xp, c->sock, RT_WS_OP_PONG, ping->data, ping->len) == 0;
        return rest_len == 0 || stash_append(self, c, xp, rest, rest_len);
    }
    RT_ASSERT(ping->len <= RT_WS_CONTROL_MAX && !xp->stash_len);
    uint8_t frame[6 + RT_WS_CONTROL_MAX] = {0x80 | RT_WS_OP_PING, 0x80 | (uint8_t)ping->len};
    memcpy(frame + 6, ping->data, ping->len);
    if (!stash_append(self, c, xp, frame, 6 + ping->len) ||
        (rest_len && !stash_append(self, c, xp, rest, rest_len)))
        return false;
    xp->held = 1;
    rt__conn_hold_input(c);
    return true;
}

/* Decodes frames from buf; a split frame head stays in the stash for the next read. */
static void ws_frames(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *buf, size_t len)
{
    size_t off = 0;
    rt_ws_event_t ping = {.kind = 0};
    while (off < len && flowing(c)) {
        size_t used = 0;
        rt_ws_event_t ev;
        uint16_t code = RT_WS_CLOSE_PROTOCOL;
        int rc = rt_ws_decode(&xp->ws, buf + off, len - off, c->max_packet, &used, &ev, &code);
        off += used;
        if (rc == RT_EAGAIN)
            break;
        if (rc < 0) {
            ws_fail(self, c, xp, code,
                    code == RT_WS_CLOSE_TOO_BIG     ? "message too big"
                    : code == RT_WS_CLOSE_UNSUPPORTED ? "text frame"
                                                      : "protocol error");
            return;
        }
        switch (ev.kind) {
        case RT_WS_EV_DATA:
            rt__conn_input(self, c, ev.data, ev.len);
            break;
        case RT_WS_EV_PING:
            ping = ev; /* answered after the loop: pings that came together get one pong */
            break;
        case RT_WS_EV_PONG:
            break;
        case RT_WS_EV_CLOSE:
            /* The client ends the stream: answered with its code, as 5.5.1 asks. */
            ws_send_close(xp, c->sock,
                          ev.close_code == RT_WS_CLOSE_NO_STATUS ? RT_WS_CLOSE_NORMAL
                                                                 : ev.close_code);
            fail(self, c);
            return;
        }
    }
    if (!flowing(c) || c->xp != xp)
        return;
    bool ok = ping.kind ? ws_pong(self, c, xp, &ping, buf + off, len - off)
                        : off == len || stash_append(self, c, xp, buf + off, len - off);
    if (!ok)
        fail(self, c);
}

void rt__xport_resume(rt_actor_t *self, conn_t *c)
{
    rt_xport_t *xp = c->xp;
    if (!xp->held)
        return;
    xp->held = 0;
    size_t len;
    uint8_t *b = stash_take(xp, &len);
    inputting = c;
    ws_frames(self, c, xp, b, len);
    inputting = NULL;
    free(b);
    if (handover.c == c)
        hand_over_now(self, c);
}

static void ws_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n)
{
    if (xp->stage == STAGE_HTTP) {
        ws_upgrade(self, c, xp, p, n);
        return;
    }
    if (xp->held) { /* waits behind the held ping (more records of one TLS read) */
        if (!stash_append(self, c, xp, p, n))
            fail(self, c);
        return;
    }
    if (!xp->stash_len) {
        ws_frames(self, c, xp, p, n);
        return;
    }
    /* A frame head was split: the stash (at most a header and a control frame) joins what
       came, and is decoded from its own copy. */
    if (!stash_append(self, c, xp, p, n)) {
        fail(self, c);
        return;
    }
    size_t len;
    uint8_t *b = stash_take(xp, &len);
    ws_frames(self, c, xp, b, len);
    free(b);
}

static void plain_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n)
{
    if (xp->websocket)
        ws_input(self, c, xp, p, n);
    else
        rt__conn_input(self, c, p, n);
}

static void layers_input(rt_actor_t *self, conn_t *c, rt_xport_t *xp, uint8_t *p, size_t n)
{
    if (xp->stage == STAGE_PROXY)
        proxy_input(self, c, xp, p, n);
    else if (xp->tls.ssl)
        tls_input(self, c, xp, p, n);
    else
        plain_input(self, c, xp, p, n);
}

void rt__xport_input(rt_actor_t *self, conn_t *c, uint8_t *p, size_t n)
{
    rt_xport_t *xp = c->xp;
    inputting = c;
    layers_input(self, c, xp, p, n);
    inputting = NULL;
    if (handover.c == c)
        hand_over_now(self, c);
}

/* ---- Rate limits ---- */

void rt__xport_connected(conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp || !c->username)
        return;
    const rt_conf_t *conf = &rt_broker->conf;
    for (unsigned i = 0; i < conf->nuser_rates; i++)
        if (strcmp(conf->user_rates[i].user, c->username) == 0) {
            rate_use(xp, &conf->user_rates[i].rate);
            return;
        }
}

void rt__xport_rate_take(conn_t *c, size_t bytes, bool publish)
{
    xport_rate_t *r = c->xp->rate;
    if (r->limit->bytes > 0) /* an unlimited kind's bucket stays full */
        r->bytes -= (double)bytes;
    if (r->limit->messages > 0)
        r->messages -= publish;
}

/* Tokens come back at the limit's rate, up to its burst. */
static void rate_refill(xport_rate_t *r, uint64_t now)
{
    double secs = (double)(now - r->refill_ms) / 1000.0;
    const rt_conf_rate_t *l = r->limit;
    double mcap = l->burst_messages > 0 ? l->burst_messages : l->messages;
    double bcap = l->burst_bytes > 0 ? l->burst_bytes : l->bytes;
    if (l->messages > 0)
        r->messages = r->messages + secs * l->messages > mcap ? mcap
                                                              : r->messages + secs * l->messages;
    if (l->bytes > 0)
        r->bytes = r->bytes + secs * l->bytes > bcap ? bcap : r->bytes + secs * l->bytes;
    r->refill_ms = now;
}

bool rt__xport_rate_on(const conn_t *c)
{
    return c->xp->rate != NULL;
}

bool rt__xport_rate_spent(conn_t *c)
{
    xport_rate_t *r = c->xp->rate;
    if (!r)
        return false;
    if (r->waiting)
        return true;
    if (r->messages >= 0 && r->bytes >= 0)
        return false;
    rate_refill(r, rt_mono_ms());
    return r->messages < 0 || r->bytes < 0;
}

bool rt__xport_rate_hold(rt_actor_t *self, conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    xport_rate_t *r = xp ? xp->rate : NULL;
    if (!r)
        return false;
    if (r->waiting) { /* reading was let go on by another hold's end (parse_more, verdict) */
        rt_sock_pause_reading(c->sock, true);
        return true;
    }
    uint64_t now = rt_mono_ms();
    rate_refill(r, now);
    const rt_conf_rate_t *l = r->limit;
    /* Parsing stops at the packet that overdraws a bucket (the rest waits in the partial
       buffer), and reading until the bucket is back at 0: one packet past the limit at most. */
    double wait_s = 0;
    if (l->messages > 0 && r->messages < 0)
        wait_s = -r->messages / l->messages;
    if (l->bytes > 0 && r->bytes < 0 && -r->bytes / l->bytes > wait_s)
        wait_s = -r->bytes / l->bytes;
    if (wait_s <= 0)
        return false;
    uint64_t ms = (uint64_t)(wait_s * 1000.0) + 1;
    if (rt_send_after_tag(ms, rt_self(self), RT_CONN_MSG_RATE_RESUME, NULL) != 0)
        return false; /* no timer: reading goes on rather than stalling for good */
    r->waiting = true;
    r->limited++;
    atomic_fetch_add_explicit(&rt_broker->stats.rate_limited, 1, memory_order_relaxed);
    rt_sock_pause_reading(c->sock, true);
    if (r->limited == 1 || r->limited % 1000 == 0)
        rt_log(RT_LOG_INFO, "client.rate_limited", "client=%s times=%u wait_ms=%llu",
               c->client_id ? c->client_id : "-", r->limited, (unsigned long long)ms);
    return true;
}

bool rt__xport_rate_resume(conn_t *c)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp || !xp->rate || !xp->rate->waiting)
        return false;
    xp->rate->waiting = false;
    /* The pause was rtd's doing: its time does not count as the client's silence. */
    c->last_rx_ns = rt_mono_ns();
    return true;
}

bool rt__xport_rate_waiting(const conn_t *c)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    return xp && xp->rate && xp->rate->waiting;
}

uint32_t rt__xport_rate_limited(const conn_t *c)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    return xp && xp->rate ? xp->rate->limited : 0;
}

/* ---- The client's identity and address ---- */

bool rt__xport_identity(conn_t *c, char *out, size_t len)
{
    rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp || !xp->tls.ssl || !listener_of(xp)->tls.identity_as_username)
        return false;
    return rt_tls_peer_identity(xp->tls.ssl, out, len);
}

bool rt__xport_identity_required(const conn_t *c)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    return xp && xp->tls.ssl && listener_of(xp)->tls.identity_as_username;
}

int rt__conn_peer_addr(const conn_t *c, rt_auth_addr_t *out)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (xp && xp->real) {
        *out = xp->real->addr;
        return 0;
    }
    return c->sock ? rt_auth_addr_from_fd(rt_sock_fd(c->sock), out) : RT_ENOTFOUND;
}

void rt__conn_peer_format(const conn_t *c, char *buf, size_t len)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    if (!xp || !xp->real) {
        rt_conn_format_peer(c->sock ? rt_sock_fd(c->sock) : -1, buf, len);
        return;
    }
    char host[INET6_ADDRSTRLEN];
    rt__conn_format_addr(&xp->real->addr, host, sizeof(host));
    snprintf(buf, len, "%s:%u", host, xp->real->port);
}

void rt__xport_log_timeout(const conn_t *c, long after_s)
{
    const rt_xport_t *xp = c->sock ? c->xp : NULL;
    switch (xp ? (stage_t)xp->stage : STAGE_OPEN) {
    case STAGE_PROXY:
        log_peer("proxy.refused", c, "reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_TLS:
        log_peer("tls.handshake_failed", c, "reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_HTTP:
        log_peer("ws.refused", c, "status=408 reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_OPEN:
        log_peer("client.connect_timeout", c, "after_s=%ld", after_s);
        return;
    }
}

/*
** The transport between a socket and a protocol's parser (xport.h): PROXY header, TLS,
** WebSocket and the per-client rate limit, run in the owning actor's turns.
**
** Input climbs the layers in place: the PROXY header is cut from the front of what was
** read, TLS decrypts into a per-thread buffer (rt_tls_conn_t, tls_conn.h, which the HTTP
** listener's connections run too), WebSocket frames are unmasked where they lie, and the
** protocol's bytes go to the owner's input. Everything read from the socket is taken
** through every layer before the handler returns: a layer keeps only what it cannot use yet
** (a split frame header, an incomplete HTTP head or PROXY header, in `stash`; a partial TLS
** record, inside OpenSSL).
** Output goes down the same way: the protocol's bytes become a frame, the frame a TLS
** record, and the record goes to the socket's buffer.
**
** Memory. The state is malloc'ed beside the socket it extends (like rt_sock_t), counted
** in xport_bytes and in the client's memory; TLS's stage for a turn's output is counted by
** tls_conn.c. An idle connection keeps its state and its SSL, without record buffers
** (SSL_MODE_RELEASE_BUFFERS) and without a stash.
*/
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "proxy.h"
#include "tls.h"
#include "tls_conn.h"
#include "xport.h"

typedef enum {
    STAGE_PROXY, /* waiting for the PROXY protocol header */
    STAGE_TLS,   /* the TLS handshake (from accept, or from STARTTLS on) */
    STAGE_HTTP,  /* the WebSocket upgrade request */
    STAGE_OPEN,  /* the protocol's bytes flow */
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
    rt_tls_conn_t tls;         /* tls.ssl NULL: no TLS (yet) */
    uint8_t *stash;            /* malloc: bytes the current layer cannot use yet; NULL when none */
    xport_rate_t *rate;        /* malloc; NULL: no limit */
    struct xport_peer_s *real; /* malloc: the client's address from a PROXY header or
                                  X-Forwarded-For; NULL: the socket's peer is the client */
    uint32_t stash_len;
    rt_ws_in_t ws; /* ws.text: the protocol's messages are text frames, both ways */
    uint8_t stage;
    uint8_t listener; /* the listener's index (its TLS context) */
    uint8_t websocket : 1;
    uint8_t ws_closing : 1; /* our close frame went out */
    uint8_t preauth : 1;    /* before authentication: the stash counts in the pre-auth budget */
    uint8_t pong_out : 1;   /* a pong was written and output may still wait (ws_pong) */
    uint8_t held : 1;       /* the stash is input held back until output drains (a ping
                               whose pong must wait, and what followed it) */
};

/* An idle WebSocket connection's whole transport cost: one 80-byte malloc chunk. */
_Static_assert(sizeof(struct rt_xport_s) <= 72, "rt_xport_t outgrew its malloc chunk");

static atomic_size_t xport_bytes; /* all transports' states and stashes */

/* The pre-auth budget's charge (rt_xport_preauth_budget); NULL: none is kept. */
static bool (*_Atomic preauth_charge)(int64_t bytes);

void rt_xport_preauth_budget(bool (*charge)(int64_t bytes))
{
    atomic_store_explicit(&preauth_charge, charge, memory_order_relaxed);
}

static bool preauth(int64_t bytes)
{
    bool (*charge)(int64_t) = atomic_load_explicit(&preauth_charge, memory_order_relaxed);
    return !charge || charge(bytes);
}

/* ---- Memory ---- */

static void stash_clear(rt_xport_t *xp)
{
    free(xp->stash);
    atomic_fetch_sub_explicit(&xport_bytes, xp->stash_len, memory_order_relaxed);
    if (xp->preauth)
        preauth(-(int64_t)xp->stash_len);
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
        preauth(-(int64_t)xp->stash_len);
    xp->stash = NULL;
    xp->stash_len = 0;
    return b;
}

/*
** Appends to the stash; false when out of memory, or when the pre-auth budget has no room
** (then the owner ended the stream, and logged it).
*/
static bool stash_append(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp,
                         const uint8_t *p, size_t n)
{
    if (xp->preauth && !preauth((int64_t)n)) {
        o->ops->preauth_refused(self, o->state, (size_t)xp->stash_len + n);
        return false;
    }
    uint8_t *s = realloc(xp->stash, (size_t)xp->stash_len + n);
    if (!s) {
        if (xp->preauth)
            preauth(-(int64_t)n);
        return false;
    }
    memcpy(s + xp->stash_len, p, n);
    xp->stash = s;
    xp->stash_len += (uint32_t)n;
    atomic_fetch_add_explicit(&xport_bytes, n, memory_order_relaxed);
    return true;
}

size_t rt_xport_memory(const rt_xport_t *xp)
{
    if (!xp)
        return 0;
    return sizeof(*xp) + xp->stash_len + (xp->rate ? sizeof(*xp->rate) : 0) +
           (xp->real ? sizeof(*xp->real) : 0) + rt_tls_conn_memory(&xp->tls);
}

size_t rt_xport_unsent(const rt_xport_t *xp)
{
    return xp ? xp->tls.out_len : 0;
}

void rt_xport_preauth_end(rt_xport_t *xp)
{
    if (!xp || !xp->preauth)
        return;
    preauth(-(int64_t)xp->stash_len);
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

void rt_xport_rate_set(rt_xport_t *xp, const rt_conf_rate_t *limit)
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

bool rt_xport_wanted(const rt_listen_t *l)
{
    return l->tls_on || l->websocket[0] || l->proxy_protocol || rate_configured(&l->rate_limit);
}

int rt_xport_start(const rt_xport_ops_t *ops, const rt_listen_t *l, unsigned listener,
                   rt_sock_t *sock, unsigned flags, rt_xport_t **out)
{
    RT_ASSERT(listener <= UINT8_MAX);
    /* Every callback but message_end is called unguarded, each on a path a peer can force (a
       failed handshake, a PROXY header, the pre-auth budget): an owner without one crashes. */
    RT_ASSERT(ops->input && ops->taking && ops->fail && ops->hold_input && ops->peer &&
              ops->peer_named && ops->preauth_refused && ops->tls_failed);
    *out = NULL;
    rt_xport_t *xp = calloc(1, sizeof(*xp));
    if (!xp)
        return RT_ENOMEM;
    atomic_fetch_add_explicit(&xport_bytes, sizeof(*xp), memory_order_relaxed);
    bool tls_now = l->tls_on && !(flags & RT_XPORT_STARTTLS);
    xp->listener = (uint8_t)listener;
    xp->websocket = l->websocket[0] != 0;
    xp->ws.text = ops->ws_text;
    xp->preauth = 1;
    xp->stage = l->proxy_protocol ? STAGE_PROXY
                : tls_now         ? STAGE_TLS
                : xp->websocket   ? STAGE_HTTP
                                  : STAGE_OPEN;
    if (tls_now && rt_tls_conn_attach(&xp->tls, rt_tls_accept(listener), sock) != 0) {
        rt_xport_free(xp);
        return RT_ENOMEM;
    }
    rt_xport_rate_set(xp, &l->rate_limit);
    *out = xp;
    return 0;
}

void rt_xport_free(void *obj)
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

void rt_xport_adopt(rt_xport_t *xp, rt_sock_t *sock)
{
    if (xp)
        rt_tls_conn_move(&xp->tls, sock);
}

/* ---- Output ---- */

void rt_xport_flush(rt_xport_t *xp)
{
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

int rt_xport_write(rt_xport_t *xp, rt_sock_t *sock, const uint8_t *p, size_t n)
{
    if (!xp->websocket)
        return lower_write(xp, sock, p, n);
    return ws_send(xp, sock, xp->ws.text ? RT_WS_OP_TEXT : RT_WS_OP_BINARY, p, n);
}

static void ws_send_close(rt_xport_t *xp, rt_sock_t *sock, uint16_t code)
{
    if (xp->ws_closing)
        return;
    xp->ws_closing = 1;
    uint8_t body[2] = {(uint8_t)(code >> 8), (uint8_t)code};
    ws_send(xp, sock, RT_WS_OP_CLOSE, body, sizeof(body));
}

void rt_xport_close(rt_xport_t *xp, rt_sock_t *sock)
{
    if (!xp)
        return;
    if (xp->stage == STAGE_OPEN && xp->websocket)
        ws_send_close(xp, sock, RT_WS_CLOSE_NORMAL);
    rt_tls_conn_close(&xp->tls);
    rt_xport_free(xp);
}

/* ---- Input ---- */

/* Whether input should go on through the layers (the owner may have ended the stream). */
static bool taking(const rt_xport_owner_t *o)
{
    return o->ops->taking(o->state);
}

/* The stream ends over a transport fault, already logged; nothing more is read. */
static void fail(rt_actor_t *self, const rt_xport_owner_t *o)
{
    o->ops->fail(self, o->state);
}

static void ws_frames(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *buf,
                      size_t len);
static void layers_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                         size_t n);

/* Bytes above TLS (or raw, without it): the WebSocket layer or the protocol itself. */
static void plain_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                        size_t n);

/* A transport event in the log: the client's address, then what happened. */
static void log_peer(const char *event, const rt_xport_owner_t *o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void log_peer(const char *event, const rt_xport_owner_t *o, const char *fmt, ...)
{
    char peer[64];
    o->ops->peer(o->state, peer, sizeof(peer));
    va_list ap;
    va_start(ap, fmt);
    rt_logv(RT_LOG_INFO, event, "peer", peer, fmt, ap);
    va_end(ap);
}

/* What follows the handshake: the WebSocket upgrade or the protocol. */
static void tls_opened(rt_xport_t *xp)
{
    if (xp->stage == STAGE_TLS && rt_tls_conn_established(&xp->tls))
        xp->stage = xp->websocket ? STAGE_HTTP : STAGE_OPEN;
}

typedef struct {
    rt_actor_t *self;
    const rt_xport_owner_t *o;
    rt_xport_t *xp;
} tls_reader_t;

static bool tls_plain(void *ctx, uint8_t *p, size_t n)
{
    tls_reader_t *r = ctx;
    tls_opened(r->xp);
    plain_input(r->self, r->o, r->xp, p, n);
    return taking(r->o);
}

static void tls_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, const uint8_t *p,
                      size_t n)
{
    tls_reader_t reader = {self, o, xp};
    char why[RT_TLS_WHY_LEN];
    int rc = rt_tls_conn_input(&xp->tls, p, n, tls_plain, &reader, why, sizeof(why));
    if (rc == RT_EPROTO && !rt_tls_conn_established(&xp->tls)) {
        log_peer("tls.handshake_failed", o, "reason=%s", why);
        o->ops->tls_failed(o->state);
    } else if (rc == RT_EPROTO) {
        log_peer("tls.error", o, "reason=%s", why);
    }
    if (rc)
        fail(self, o);
    else if (taking(o)) /* else the layers above may have closed the connection, and xp */
        tls_opened(xp);
}

/* The client's address behind its proxy counts from here on: logs, limits, ACL, rules. */
static bool take_real_address(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp,
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
    if (!o->ops->peer_named(self, o->state, a)) {
        log_peer("proxy.refused", o, "reason=max_connections_per_ip");
        return false;
    }
    return true;
}

static void proxy_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                        size_t n)
{
    uint8_t *own = NULL; /* the stash with what came joined to it */
    if (xp->stash_len) {
        if (!stash_append(self, o, xp, p, n)) {
            fail(self, o);
            return;
        }
        p = own = stash_take(xp, &n);
    }
    size_t used;
    rt_proxy_info_t info;
    const char *why = "malformed";
    int rc = rt_proxy_parse(p, n, &used, &info, &why);
    if (rc == RT_EAGAIN) { /* a prefix of a header within RT_PROXY_MAX: more must come */
        if (!stash_append(self, o, xp, p, n))
            fail(self, o);
    } else if (rc != 0) {
        log_peer("proxy.refused", o, "reason=malformed detail=%s", why);
        fail(self, o);
    } else if (!info.has_addr || take_real_address(self, o, xp, &info.src, info.src_port)) {
        xp->stage = xp->tls.ssl ? STAGE_TLS : xp->websocket ? STAGE_HTTP : STAGE_OPEN;
        if (used < n)
            layers_input(self, o, xp, p + used, n - used);
    } else {
        fail(self, o);
    }
    free(own);
}

static void ws_upgrade(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                       size_t n)
{
    if (!stash_append(self, o, xp, p, n)) {
        fail(self, o);
        return;
    }
    const rt_listen_t *l = o->listen;
    size_t head_len;
    rt_ws_upgrade_t u;
    const char *why = "bad request";
    int rc = rt_ws_parse_upgrade(xp->stash, xp->stash_len, l->websocket, o->ops->ws_protocols,
                                 &head_len, &u, &why);
    if (rc == RT_EAGAIN)
        return; /* the parser refuses a head past RT_WS_HEAD_MAX, so the stash is bounded */
    char answer[512];
    if (rc != 0) {
        log_peer("ws.refused", o, "status=%d reason=%s", rc, why);
        size_t len = rt_ws_error_response(rc, answer, sizeof(answer));
        lower_write(xp, o->sock, (const uint8_t *)answer, len);
        fail(self, o);
        return;
    }
    rt_auth_addr_t sock_addr, client;
    if (l->ntrusted && u.forwarded_for[0] &&
        rt_auth_addr_from_fd(rt_sock_fd(o->sock), &sock_addr, NULL) == 0 &&
        rt_conf_net_match(l->trusted_proxies, l->ntrusted, sock_addr.b) &&
        rt_forwarded_client(u.forwarded_for, l->trusted_proxies, l->ntrusted, &client) &&
        !take_real_address(self, o, xp, &client, 0)) {
        fail(self, o);
        return;
    }
    size_t answer_len = rt_ws_upgrade_response(&u, answer, sizeof(answer));
    if (lower_write(xp, o->sock, (const uint8_t *)answer, answer_len) != 0) {
        fail(self, o);
        return;
    }
    xp->stage = STAGE_OPEN;
    /* Frames that came with the head are decoded from the stash's copy. */
    size_t len;
    uint8_t *b = stash_take(xp, &len);
    if (len > head_len)
        ws_frames(self, o, xp, b + head_len, len - head_len);
    free(b);
}

static void ws_fail(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint16_t code,
                    const char *why)
{
    log_peer("ws.closed", o, "code=%d reason=%s", code, why);
    ws_send_close(xp, o->sock, code);
    fail(self, o);
}

/*
** Whether a pong written earlier may still wait in rtd's output, after sending what can go
** now: the client has not read it.
*/
static bool pong_waiting(const rt_xport_owner_t *o, rt_xport_t *xp)
{
    if (!xp->pong_out)
        return false;
    int rc = 0;
    if (rt_sock_pending(o->sock) + xp->tls.out_len) {
        rt_xport_flush(xp);
        rc = rt_sock_flush(o->sock);
    }
    xp->pong_out = rc == RT_EAGAIN; /* then RT_SOCK_WRITABLE comes once it has drained */
    return xp->pong_out;
}

/*
** Answers the latest ping of a read (RFC 6455 5.5.3 lets the others go unanswered), with
** at most one pong waiting in rtd's output: while the last one has not gone, the ping is
** kept as a frame (unmasked: a zero mask) at the front of the stash, with what came after
** it, and the client's input waits until the output drains (rt_xport_resume). So a client
** that sends pings and never reads makes rtd write one pong, not one per ping.
** Returns false when the connection ended.
*/
static bool ws_pong(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp,
                    const rt_ws_event_t *ping, const uint8_t *rest, size_t rest_len)
{
    if (!pong_waiting(o, xp)) {
        xp->pong_out = ws_send(xp, o->sock, RT_WS_OP_PONG, ping->data, ping->len) == 0;
        return rest_len == 0 || stash_append(self, o, xp, rest, rest_len);
    }
    RT_ASSERT(ping->len <= RT_WS_CONTROL_MAX && !xp->stash_len);
    uint8_t frame[6 + RT_WS_CONTROL_MAX] = {0x80 | RT_WS_OP_PING, 0x80 | (uint8_t)ping->len};
    memcpy(frame + 6, ping->data, ping->len);
    if (!stash_append(self, o, xp, frame, 6 + ping->len) ||
        (rest_len && !stash_append(self, o, xp, rest, rest_len)))
        return false;
    xp->held = 1;
    o->ops->hold_input(o->state);
    return true;
}

/* Decodes frames from buf; a split frame head stays in the stash for the next read. */
static void ws_frames(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *buf,
                      size_t len)
{
    size_t off = 0;
    rt_ws_event_t ping = {.kind = 0};
    while (off < len && taking(o)) {
        size_t used = 0;
        rt_ws_event_t ev;
        uint16_t code = RT_WS_CLOSE_PROTOCOL;
        int rc = rt_ws_decode(&xp->ws, buf + off, len - off, o->max_message, &used, &ev, &code);
        off += used;
        if (rc == RT_EAGAIN)
            break;
        if (rc < 0) {
            ws_fail(self, o, xp, code,
                    code == RT_WS_CLOSE_TOO_BIG ? "message too big"
                    : code == RT_WS_CLOSE_UNSUPPORTED
                        ? (xp->ws.text ? "binary frame" : "text frame")
                        : "protocol error");
            return;
        }
        switch (ev.kind) {
        case RT_WS_EV_DATA:
            if (ev.len)
                o->ops->input(self, o->state, ev.data, ev.len);
            if (ev.last && o->ops->message_end && taking(o))
                o->ops->message_end(self, o->state);
            break;
        case RT_WS_EV_PING:
            ping = ev; /* answered after the loop: pings that came together get one pong */
            break;
        case RT_WS_EV_PONG:
            break;
        case RT_WS_EV_CLOSE:
            /* The client ends the stream: answered with its code, as 5.5.1 asks. */
            ws_send_close(xp, o->sock,
                          ev.close_code == RT_WS_CLOSE_NO_STATUS ? RT_WS_CLOSE_NORMAL
                                                                 : ev.close_code);
            fail(self, o);
            return;
        }
    }
    if (!taking(o))
        return;
    bool ok = ping.kind ? ws_pong(self, o, xp, &ping, buf + off, len - off)
                        : off == len || stash_append(self, o, xp, buf + off, len - off);
    if (!ok)
        fail(self, o);
}

/* Decodes the frames the stash holds, from its own copy (the stash may fill again). */
static void stash_frames(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp)
{
    size_t len;
    uint8_t *b = stash_take(xp, &len);
    ws_frames(self, o, xp, b, len);
    free(b);
}

void rt_xport_resume(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o)
{
    if (!xp->held)
        return;
    xp->held = 0;
    stash_frames(self, o, xp);
}

static void ws_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                     size_t n)
{
    if (xp->stage == STAGE_HTTP) {
        ws_upgrade(self, o, xp, p, n);
        return;
    }
    if (xp->held) { /* waits behind the held ping (more records of one TLS read) */
        if (!stash_append(self, o, xp, p, n))
            fail(self, o);
        return;
    }
    if (!xp->stash_len) {
        ws_frames(self, o, xp, p, n);
        return;
    }
    /* A frame head was split: the stash (at most a header and a control frame) joins what
       came. */
    if (stash_append(self, o, xp, p, n))
        stash_frames(self, o, xp);
    else
        fail(self, o);
}

static void plain_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                        size_t n)
{
    if (xp->websocket)
        ws_input(self, o, xp, p, n);
    else
        o->ops->input(self, o->state, p, n);
}

static void layers_input(rt_actor_t *self, const rt_xport_owner_t *o, rt_xport_t *xp, uint8_t *p,
                         size_t n)
{
    if (xp->stage == STAGE_PROXY)
        proxy_input(self, o, xp, p, n);
    else if (xp->tls.ssl)
        tls_input(self, o, xp, p, n);
    else
        plain_input(self, o, xp, p, n);
}

void rt_xport_input(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o, uint8_t *p,
                    size_t n)
{
    layers_input(self, o, xp, p, n);
}

/*
** TLS from the next byte. Called from the owner's input (it parsed the request there) or
** later; either way no plaintext of this read is left below the owner: the layers under
** it hand up all they decode at once, and without TLS or WebSocket the stash is empty once
** the stream is open. The next read goes to tls_input, as ciphertext. The go-ahead goes
** straight to the socket, ahead of anything TLS writes (it writes nothing before the
** client's hello).
*/
int rt_xport_starttls(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o,
                      const void *go_ahead, size_t go_ahead_len, size_t unread)
{
    if (xp->tls.ssl || xp->websocket || xp->stage != STAGE_OPEN)
        return RT_EINVAL;
    RT_ASSERT(!xp->stash_len);
    SSL *ssl = rt_tls_accept(xp->listener);
    if (!ssl)
        return RT_EINVAL; /* no STARTTLS here: what follows the request is the stream's */
    if (unread) {
        SSL_free(ssl);
        log_peer("tls.starttls_refused", o, "reason=pipelined bytes=%zu", unread);
        fail(self, o);
        return RT_EPROTO;
    }
    int rc = rt_tls_conn_attach(&xp->tls, ssl, o->sock);
    if (rc)
        return rc;
    rc = rt_sock_write(o->sock, go_ahead, go_ahead_len);
    if (rc) {
        rt_tls_conn_free(&xp->tls);
        return rc;
    }
    xp->stage = STAGE_TLS;
    return 0;
}

/* ---- Rate limits ---- */

void rt_xport_rate_take(rt_xport_t *xp, size_t bytes, bool message)
{
    xport_rate_t *r = xp->rate;
    if (r->limit->bytes > 0) /* an unlimited kind's bucket stays full */
        r->bytes -= (double)bytes;
    if (r->limit->messages > 0)
        r->messages -= message;
}

/* Tokens come back at the limit's rate, up to its burst. */
static void rate_refill(xport_rate_t *r, uint64_t now)
{
    double secs = (double)(now - r->refill_ms) / 1000.0;
    const rt_conf_rate_t *l = r->limit;
    double mcap = l->burst_messages > 0 ? l->burst_messages : l->messages;
    double bcap = l->burst_bytes > 0 ? l->burst_bytes : l->bytes;
    if (l->messages > 0)
        r->messages =
            r->messages + secs * l->messages > mcap ? mcap : r->messages + secs * l->messages;
    if (l->bytes > 0)
        r->bytes = r->bytes + secs * l->bytes > bcap ? bcap : r->bytes + secs * l->bytes;
    r->refill_ms = now;
}

bool rt_xport_rate_on(const rt_xport_t *xp)
{
    return xp && xp->rate != NULL;
}

bool rt_xport_rate_spent(rt_xport_t *xp)
{
    xport_rate_t *r = xp ? xp->rate : NULL;
    if (!r)
        return false;
    if (r->waiting)
        return true;
    if (r->messages >= 0 && r->bytes >= 0)
        return false;
    rate_refill(r, rt_mono_ms());
    return r->messages < 0 || r->bytes < 0;
}

bool rt_xport_rate_hold(rt_actor_t *self, rt_xport_t *xp, rt_sock_t *sock, uint32_t resume_tag,
                        uint64_t *paused_ms)
{
    *paused_ms = 0;
    xport_rate_t *r = xp ? xp->rate : NULL;
    if (!r)
        return false;
    if (r->waiting) { /* reading was let go on by another hold's end (parse_more, verdict) */
        rt_sock_pause_reading(sock, true);
        return true;
    }
    uint64_t now = rt_mono_ms();
    rate_refill(r, now);
    const rt_conf_rate_t *l = r->limit;
    /* Parsing stops at the unit that overdraws a bucket (the rest waits with the owner), and
       reading until the bucket is back at 0: one unit past the limit at most. */
    double wait_s = 0;
    if (l->messages > 0 && r->messages < 0)
        wait_s = -r->messages / l->messages;
    if (l->bytes > 0 && r->bytes < 0 && -r->bytes / l->bytes > wait_s)
        wait_s = -r->bytes / l->bytes;
    if (wait_s <= 0)
        return false;
    uint64_t ms = (uint64_t)(wait_s * 1000.0) + 1;
    if (rt_send_after_tag(ms, rt_self(self), resume_tag, NULL) != 0)
        return false; /* no timer: reading goes on rather than stalling for good */
    r->waiting = true;
    r->limited++;
    rt_sock_pause_reading(sock, true);
    *paused_ms = ms;
    return true;
}

bool rt_xport_rate_resume(rt_xport_t *xp)
{
    if (!xp || !xp->rate || !xp->rate->waiting)
        return false;
    xp->rate->waiting = false;
    return true;
}

bool rt_xport_rate_waiting(const rt_xport_t *xp)
{
    return xp && xp->rate && xp->rate->waiting;
}

uint32_t rt_xport_rate_limited(const rt_xport_t *xp)
{
    return xp && xp->rate ? xp->rate->limited : 0;
}

/* ---- The client ---- */

bool rt_xport_tls_on(const rt_xport_t *xp)
{
    return xp && xp->tls.ssl;
}

unsigned rt_xport_bindings(const rt_xport_t *xp)
{
    return rt_xport_tls_on(xp) ? rt_tls_bindings(xp->tls.ssl) : 0;
}

size_t rt_xport_binding(const rt_xport_t *xp, unsigned type, uint8_t *out, size_t cap)
{
    return rt_xport_tls_on(xp) ? rt_tls_binding(xp->tls.ssl, type, out, cap) : 0;
}

bool rt_xport_tls_identity(const rt_xport_t *xp, char *out, size_t len)
{
    return rt_xport_tls_on(xp) && rt_tls_peer_identity(xp->tls.ssl, out, len);
}

bool rt_xport_tls_cert(const rt_xport_t *xp, rt_auth_tls_t *out)
{
    return rt_xport_tls_on(xp) && rt_tls_peer_cert(xp->tls.ssl, out->cn, sizeof(out->cn),
                                                   out->subject, sizeof(out->subject), out->sha256);
}

int rt_xport_tls_other_names(const rt_xport_t *xp, const char *oid,
                             bool (*fn)(const char *value, size_t len, void *arg), void *arg)
{
    return rt_xport_tls_on(xp) ? rt_tls_peer_other_names(xp->tls.ssl, oid, fn, arg) : -1;
}

bool rt_xport_tls_names_domain(const rt_xport_t *xp, const char *domain)
{
    return rt_xport_tls_on(xp) && rt_tls_peer_names_domain(xp->tls.ssl, domain);
}

bool rt_xport_real_peer(const rt_xport_t *xp, rt_auth_addr_t *addr, uint16_t *port)
{
    if (!xp || !xp->real)
        return false;
    *addr = xp->real->addr;
    if (port)
        *port = xp->real->port;
    return true;
}

void rt_xport_peer_format(const rt_xport_t *xp, int fd, char *buf, size_t len)
{
    rt_auth_addr_t a;
    uint16_t port = 0;
    char host[INET6_ADDRSTRLEN];
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    if (rt_xport_real_peer(xp, &a, &port)) {
        rt_auth_addr_format(&a, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, port);
    } else {
        if (fd >= 0)
            getpeername(fd, (struct sockaddr *)&ss, &sl); /* a failure leaves no family: "?:0" */
        rt_auth_sockaddr_format(&ss, buf, len);
    }
}

/* A transport event in the log for a peer already written out. */
static void log_at(const char *event, const char *peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void log_at(const char *event, const char *peer, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_logv(RT_LOG_INFO, event, "peer", peer, fmt, ap);
    va_end(ap);
}

void rt_xport_log_timeout(const rt_xport_t *xp, const char *peer, long after_s,
                          const char *open_event)
{
    switch (xp ? (stage_t)xp->stage : STAGE_OPEN) {
    case STAGE_PROXY:
        log_at("proxy.refused", peer, "reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_TLS:
        log_at("tls.handshake_failed", peer, "reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_HTTP:
        log_at("ws.refused", peer, "status=408 reason=timeout after_s=%ld", after_s);
        return;
    case STAGE_OPEN:
        log_at(open_event, peer, "after_s=%ld", after_s);
        return;
    }
}

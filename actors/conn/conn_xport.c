/*
** The MQTT connection as the owner of its transport (actors/transport/xport.h): the callbacks
** the transport's input side makes, and what of the transport is MQTT's: the hand-over of a
** CONNECT's socket to the actor holding its session, user rate limits by MQTT user name,
** identity_as_username, the client's address as logs, limits and rules see it.
*/
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_impl.h"
#include "log.h"

/* MQTT over WebSocket: binary frames, under "mqtt" (3.1.1 and 5.0) or "mqttv3.1" (6.0 of
   each spec); a client that names none is served too. */
static const rt_ws_protocols_t mqtt_ws = {.names = {"mqtt", "mqttv3.1"}};

/*
** A hand-over decided inside the transport's input (a CONNECT resuming a session another
** actor holds) waits until every layer has taken what was read: the bytes after the CONNECT
** are collected here, for the holder, instead of being parsed. One connection per thread at
** a time is inside its input.
*/
static _Thread_local struct {
    const conn_t *c; /* the connection handing over; NULL: none */
    rt_pid_t holder;
    uint8_t *bytes; /* malloc */
    size_t len;
    bool lost; /* out of memory collecting: the connection ends instead */
} handover;
static _Thread_local const conn_t *inputting;

bool rt__conn_collect(const conn_t *c, const uint8_t *p, size_t n)
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

void rt__conn_hand_over(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                        size_t len)
{
    RT_ASSERT(!handover.c);
    handover.c = c;
    handover.holder = holder;
    c->closing = 1;
    rt__conn_collect(c, bytes, len);
    if (inputting != c)
        hand_over_now(self, c);
}

/* ---- The callbacks ---- */

static void on_input(rt_actor_t *self, void *owner, const uint8_t *p, size_t n)
{
    rt__conn_input(self, owner, p, n);
}

/* Input goes on through the layers until the connection ends, unless what follows is
   collected for a hand-over. */
static bool taking(const void *owner)
{
    const conn_t *c = owner;
    return c->sock && (!c->closing || handover.c == c);
}

static void on_fail(rt_actor_t *self, void *owner)
{
    rt__conn_close(self, owner, 0, RT_REASON_NORMAL);
}

static void hold_input(void *owner)
{
    rt__conn_hold_input(owner);
}

static void peer_text(const void *owner, char *buf, size_t len)
{
    rt__conn_peer_format(owner, buf, len);
}

/* The address behind the proxy counts under max_connections_per_ip from here on. */
static bool peer_named(rt_actor_t *self, void *owner, const rt_auth_addr_t *addr)
{
    conn_t *c = owner;
    rt__conn_forget_peer(self, c); /* made from the socket's peer, if it was */
    return rt__listener_admit_peer(rt_sock_fd(c->sock), addr);
}

static void preauth_refused(rt_actor_t *self, void *owner, size_t wanted)
{
    rt__conn_preauth_refused(self, owner, wanted);
}

static void tls_failed(void *owner)
{
    (void)owner;
    atomic_fetch_add_explicit(&rt_broker->stats.tls_failed, 1, memory_order_relaxed);
}

static const rt_xport_ops_t conn_xport_ops = {
    .ws_protocols = &mqtt_ws,
    .ws_text = false, /* MQTT is binary: a text frame closes the stream with 1003 */
    .input = on_input,
    .message_end = NULL, /* MQTT frames its own packets */
    .taking = taking,
    .fail = on_fail,
    .hold_input = hold_input,
    .peer = peer_text,
    .peer_named = peer_named,
    .preauth_refused = preauth_refused,
    .tls_failed = tls_failed,
};

static rt_xport_owner_t owner_of(conn_t *c)
{
    return (rt_xport_owner_t){.ops = &conn_xport_ops,
                              .state = c,
                              .sock = c->sock,
                              .listen = &rt_broker->conf.listeners[c->listener],
                              .max_message = c->max_packet};
}

/* ---- Start and input ---- */

int rt__conn_xport_start(conn_t *c)
{
    const rt_listen_t *l = &rt_broker->conf.listeners[c->listener];
    c->xp = NULL;
    /* A user's own rate limit may come at CONNECT, so any of them needs a transport. */
    if (!rt_xport_wanted(l) && rt_broker->conf.nuser_rates == 0)
        return 0; /* plain TCP: conn.c reads and writes the socket itself */
    return rt_xport_start(&conn_xport_ops, l, c->listener, c->sock, 0, &c->xp);
}

void rt__conn_xport_input(rt_actor_t *self, conn_t *c, uint8_t *p, size_t n)
{
    rt_xport_owner_t o = owner_of(c);
    inputting = c;
    rt_xport_input(self, c->xp, &o, p, n);
    inputting = NULL;
    if (handover.c == c)
        hand_over_now(self, c);
}

void rt__conn_xport_resume(rt_actor_t *self, conn_t *c)
{
    rt_xport_owner_t o = owner_of(c);
    inputting = c;
    rt_xport_resume(self, c->xp, &o);
    inputting = NULL;
    if (handover.c == c)
        hand_over_now(self, c);
}

/* ---- Rate limits ---- */

void rt__conn_user_rate(conn_t *c)
{
    rt_xport_t *xp = rt__conn_xp(c);
    if (!xp || !c->username)
        return;
    const rt_conf_t *conf = &rt_broker->conf;
    for (unsigned i = 0; i < conf->nuser_rates; i++)
        if (strcmp(conf->user_rates[i].user, c->username) == 0) {
            rt_xport_rate_set(xp, &conf->user_rates[i].rate);
            return;
        }
}

bool rt__conn_rate_hold(rt_actor_t *self, conn_t *c)
{
    rt_xport_t *xp = rt__conn_xp(c);
    uint64_t ms;
    if (!rt_xport_rate_hold(self, xp, c->sock, RT_CONN_MSG_RATE_RESUME, &ms))
        return false;
    if (!ms)
        return true; /* waiting already */
    atomic_fetch_add_explicit(&rt_broker->stats.rate_limited, 1, memory_order_relaxed);
    uint32_t times = rt_xport_rate_limited(xp);
    if (times == 1 || times % 1000 == 0)
        rt_log(RT_LOG_INFO, "client.rate_limited", "client=%s times=%u wait_ms=%llu",
               c->client_id ? c->client_id : "-", times, (unsigned long long)ms);
    return true;
}

/* ---- The client's identity and address ---- */

bool rt__conn_identity_required(const conn_t *c)
{
    return rt_xport_tls_on(rt__conn_xp(c)) &&
           rt_broker->conf.listeners[c->listener].tls.identity_as_username;
}

bool rt__conn_identity(conn_t *c, char *out, size_t len)
{
    return rt__conn_identity_required(c) && rt_xport_tls_identity(rt__conn_xp(c), out, len);
}

const conn_peer_t *rt__conn_peer(const conn_t *c, conn_peer_t *p)
{
    if (p->known)
        return p;
    bool known = rt_xport_real_peer(rt__conn_xp(c), &p->addr, &p->port) ||
                 (c->sock && rt_auth_addr_from_fd(rt_sock_fd(c->sock), &p->addr, &p->port) == 0);
    p->known = known ? 1 : -1;
    return p;
}

void rt__conn_peer_text(const conn_peer_t *p, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (p->known > 0)
        rt_auth_addr_format(&p->addr, host, sizeof(host));
    snprintf(buf, len, "%s:%u", host, p->known > 0 ? p->port : 0u);
}

void rt__conn_peer_format(const conn_t *c, char *buf, size_t len)
{
    conn_peer_t p = {0};
    rt__conn_peer_text(rt__conn_peer(c, &p), buf, len);
}

void rt__conn_log_timeout(const conn_t *c, long after_s)
{
    char peer[INET6_ADDRSTRLEN + 8];
    rt__conn_peer_format(c, peer, sizeof(peer));
    rt_xport_log_timeout(rt__conn_xp(c), peer, after_s, "client.connect_timeout");
}

/*
** The connection actor: one per MQTT client socket, and the client's session.
** This file is the actor itself, and nothing else (conn_base.c is the floor it and
** every handler call): its start, reading and parsing the socket, handing each packet
** to the file for its job, the keepalive check, and the end of a connection. It parses whatever bytes arrived in the scheduler's scratch buffer
** and copies only a partial packet into its own buffer, so an idle connection
** holds none.
**
** Sessions. A session that outlives its connection (clean start 0 with a
** session expiry, or a 3.1.1 clean session 0) stays in the same actor after
** the socket closes: it keeps its subscriptions, queues what arrives (bounded
** in messages and bytes) and ends when its expiry runs out. A reconnect hands
** its socket to that actor (RESUME, the fd travels in the message) instead of
** moving the session to the new connection: the subscriptions never change
** owner, so no message routed in between can overtake another, and a resumed
** session retransmits its unacknowledged messages (DUP) and then its queue in
** order. A takeover with clean start 1 ends the old session instead.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "acl.h"
#include "cluster.h"
#include "conn_impl.h"
#include "log.h"
#include "store.h"
#include "trace.h"

#define RT_CONN_READS_PER_TURN 16 /* socket reads per turn before yielding */
/*
** Deliveries one socket event may make before the connection yields: a
** publisher with a buffer full of PUBLISHes to thousands of subscribers would
** otherwise queue millions of envelopes in one turn (and keep them as memory),
** before muting or shedding could act.
*/
#define RT_CONN_ROUTE_BUDGET 8192

_Thread_local uint32_t rt__conn_routed_this_event;

#define RT_PEER_TEXT_MAX (INET6_ADDRSTRLEN + 8) /* "ip:port" */

static void close_on_protocol_error(rt_actor_t *self, conn_t *c, int err)
{
    uint8_t reason = rt__conn_error_reason(err);
    rt__conn_log_bad_packet(self, c, (mqtt_str_t){0}, reason);
    rt__conn_close(self, c, reason, RT_REASON_NORMAL);
}

static void on_keepalive(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(c->keepalive_armed);
    c->keepalive_armed = 0;
    if (!rt__conn_online(c) || !c->keepalive)
        return;
    /* Input rtd holds back (a rate limit's pause, what waits in the partial buffer for it)
       is not the client's silence. */
    if (rt_xport_rate_waiting(rt__conn_xp(c)))
        c->last_rx_ns = rt_mono_ns();
    /* Nor is input waiting for output the client reads, however slowly; one that reads
       nothing at all is closed like a silent one. */
    if (c->out_muted && rt_sock_output_taken(c->sock))
        c->last_rx_ns = rt_mono_ns();
    if (rt_mono_ns() - c->last_rx_ns > (uint64_t)c->keepalive * 1500000000u) {
        rt_log(RT_LOG_INFO, "client.keepalive_timeout", "client=%s", c->client_id);
        rt__conn_close(self, c, MQTT_RC_KEEPALIVE_TIMEOUT, RT_REASON_NORMAL);
        return;
    }
    rt__conn_arm_keepalive(self, c);
}

static int handle_disconnect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    if (c->version == MQTT_V5 && (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY))) {
        /* A session that was to end with its connection cannot be made to outlive it
           (3.14.2.2.2). */
        if (c->session_expiry == 0 && pk->props.session_expiry != 0)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
        c->session_expiry = rt__conn_clamp_session_expiry(pk->props.session_expiry);
        if (c->will_delay > c->session_expiry)
            c->will_delay = c->session_expiry;
        if (c->stored)
            rt_store_session(c->client_id, c->session_expiry, true, false);
    }
    /* A normal DISCONNECT discards the will; v5 can ask for it with 0x04. */
    c->discard_will = !(c->version == MQTT_V5 && pk->reason == MQTT_RC_DISCONNECT_WITH_WILL);
    c->disc_rc = (uint8_t)(1 + (c->version == MQTT_V5 ? pk->reason : 0));
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
    return 0;
}

static int dispatch_packet_to(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk);

static bool output_holds_input(conn_t *c)
{
    if (!rt__conn_output_backed_up(c))
        return false;
    rt__conn_hold_input(c);
    return true;
}

/*
** A packet after CONNECT, to the file for its job. A client whose own packets (its
** subscriptions, QoS 2 ids, acknowledgements waiting for the store) make it hold more than
** its memory budget is told 0x97 (quota exceeded) and disconnected.
*/
static int dispatch_packet(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    int rc = dispatch_packet_to(self, c, pk);
    if (rc == 0 && !c->closing && rt__conn_inbound_over_budget(c)) {
        rt_log(RT_LOG_WARNING, "client.over_budget", "client=%s memory=%zu quota exceeded",
               c->client_id ? c->client_id : "-", rt__conn_memory(c));
        rt__conn_close(self, c, MQTT_RC_QUOTA_EXCEEDED, RT_REASON_NORMAL);
    }
    return rc;
}

static int dispatch_packet_to(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    RT_ASSERT(c->version && !c->closing);
    switch (pk->type) {
    case MQTT_CONNECT:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* a second CONNECT (3.1.0-2) */
    case MQTT_PUBLISH:
        return rt__conn_handle_publish(self, c, pk);
    case MQTT_PUBREL:
        rt__conn_on_pubrel(c, pk);
        return 0;
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBCOMP:
        rt__conn_on_delivery_ack(self, c, pk);
        return 0;
    case MQTT_SUBSCRIBE:
        return rt__conn_handle_subscribe(self, c, pk);
    case MQTT_UNSUBSCRIBE:
        return rt__conn_handle_unsubscribe(self, c, pk);
    case MQTT_PINGREQ: {
        mqtt_packet_t resp = {.type = MQTT_PINGRESP};
        rt__conn_send_packet(c, &resp);
        return 0;
    }
    case MQTT_DISCONNECT:
        return handle_disconnect(self, c, pk);
    case MQTT_AUTH:
        rt__conn_close(self, c, MQTT_RC_BAD_AUTH_METHOD, RT_REASON_NORMAL);
        return 0;
    default:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* server-to-client packets */
    }
}

/*
** A CONNECT the decoder refused. Where the spec gives the reason a CONNACK code, the client
** gets it before the close: unacceptable protocol version for a level (or name and level)
** rtd does not speak [MQTT-3.1.2-2], identifier rejected for an empty 3.1.1 client id without
** clean session [MQTT-3.1.3-8] or a 3.1 id past 23 characters. An MQTT 5 client gets the
** reason code itself, which the spec allows for any refused CONNECT (3.2.2.2, 4.13.1). The
** CONNACK has the format of the level asked for, and a level rtd does not know is answered
** as 3.1.1, which is what clients of every version read there (3.1.2.2). A CONNECT whose
** protocol name and level could not be read gets no CONNACK.
*/
static void refuse_connect(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk, int err)
{
    RT_ASSERT(!c->version);
    uint8_t reason = rt__conn_error_reason(err);
    rt__conn_log_bad_packet(self, c, pk->connect.client_id, reason);
    mqtt_packet_t ack = {.type = MQTT_CONNACK};
    if (reason == MQTT_RC_UNSUPPORTED_VERSION) {
        c->version = MQTT_V311;
        ack.reason = mqtt_v3_connack_code(reason);
    } else if (pk->version == MQTT_V5) {
        c->version = MQTT_V5;
        ack.reason = reason;
    } else if (pk->version == MQTT_V31 || pk->version == MQTT_V311) {
        c->version = pk->version;
        ack.reason = mqtt_v3_connack_code(reason);
    }
    if (ack.reason)
        rt__conn_send_packet(c, &ack);
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
}

/*
** Before authentication a client may send a CONNECT and nothing else, so what it may make
** rtd hold is bounded by what a CONNECT needs (max_connect_size), not by max_packet_size.
*/
static uint32_t connect_max(const conn_t *c)
{
    long most = RT_LIVE(max_connect_size);
    return most < (long)c->max_packet ? (uint32_t)most : c->max_packet;
}

/*
** Parses every complete packet in buf; returns the bytes consumed, or -1 once
** the connection is closing (after an error, a DISCONNECT or a handover).
*/
static long parse_packets(rt_actor_t *self, conn_t *c, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    /* Behind a rate limit, each packet is taken from its buckets; the one that overdraws
       them is the last parsed until they refill (rt__conn_rate_hold). */
    bool limited = rt_xport_rate_on(rt__conn_xp(c));
    while (off < len && !c->closing && !rt__conn_acks_held(c) &&
           rt__conn_routed_this_event < RT_CONN_ROUTE_BUDGET &&
           !(limited && rt_xport_rate_spent(c->xp)) && !output_holds_input(c)) {
        /* Anything but CONNECT first is refused at its first byte, before it is complete. */
        if (!c->version && buf[off] != (MQTT_CONNECT << 4)) {
            close_on_protocol_error(self, c, MQTT_ERR(MQTT_RC_PROTOCOL_ERROR));
            return -1;
        }
        mqtt_frame_t f;
        int rc = mqtt_frame(buf + off, len - off, c->version ? c->max_packet : connect_max(c), &f);
        if (!c->version && rc == MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE))
            atomic_fetch_add_explicit(&rt_broker->stats.connect_too_large, 1,
                                      memory_order_relaxed);
        if (rc == RT_EAGAIN)
            break;
        if (rc == 0) {
            rt__metric_add(RT_METRIC_PKT_IN + (buf[off] >> 4), 1);
            if (rt_tracing() && (c->version || !rt__conn_connect_parsed_before(c)))
                rt_trace_packet(RT_TRACE_IN, c->client_id, buf + off, f.size, c->version);
        }
        mqtt_packet_t pk;
        if (rc == 0 && (rc = mqtt_decode(buf + off, f.size, c->version, &pk)) != 0 && !c->version) {
            refuse_connect(self, c, &pk, rc);
            return -1;
        }
        if (rc == 0)
            rc = c->version ? dispatch_packet(self, c, &pk)
                            : rt__conn_handle_connect(self, c, &pk, buf + off, len - off);
        if (rc) {
            close_on_protocol_error(self, c, rc == RT_EAGAIN ? MQTT_ERR(MQTT_RC_MALFORMED) : rc);
            return -1;
        }
        if (c->verifying)
            break; /* the CONNECT stays unconsumed: it is parsed again with the verdict */
        RT_ASSERT(f.size <= len - off);
        if (limited && c->sock)
            rt_xport_rate_take(c->xp, f.size, buf[off] >> 4 == MQTT_PUBLISH);
        off += f.size;
    }
    return c->closing ? -1 : (long)off;
}

/* RT_ENOMEM, or RT_ELIMIT when the pre-auth budget has no room for it (the caller closes). */
static int partial_append(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t n)
{
    RT_ASSERT(c->partial_len <= c->partial_cap);
    uint32_t was = c->partial_cap;
    if (rt__conn_grow(self, &c->partial, &c->partial_cap, (size_t)c->partial_len + n, 1, 256,
                      RT_OBJ_LEAF))
        return RT_ENOMEM;
    if (!rt__conn_preauth_take(c, (int64_t)c->partial_cap - was)) {
        c->partial_cap = was; /* what the budget holds; freed with the connection */
        return RT_ELIMIT;
    }
    memcpy(c->partial + c->partial_len, p, n);
    c->partial_len += (uint32_t)n;
    return 0;
}

/*
** Drops the partial buffer's first used bytes (parsed), freeing it once empty: at once, since
** it may be as big as a packet, and a connection that goes quiet may not collect for long.
*/
static void partial_consume(rt_actor_t *self, conn_t *c, size_t used)
{
    RT_ASSERT(used <= c->partial_len);
    if (used == c->partial_len) {
        rt__conn_preauth_take(c, -(int64_t)c->partial_cap);
        rt_free(self, c->partial);
        c->partial = NULL;
        c->partial_len = c->partial_cap = 0;
        return;
    }
    memmove(c->partial, c->partial + used, c->partial_len - used);
    c->partial_len -= (uint32_t)used;
}

/* Keeps bytes for later; false (and the connection ends) when they cannot be kept. */
static bool partial_keep(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t n)
{
    int rc = partial_append(self, c, p, n);
    if (rc == RT_ELIMIT)
        rt__conn_preauth_refused(self, c, (size_t)c->partial_len + n);
    else if (rc)
        rt__conn_close(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
    return rc == 0;
}

/* Parses bytes that arrived (or were handed over); only an incomplete tail is kept. */
static void parse_input(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t len)
{
    if (c->partial_len) {
        if (!partial_keep(self, c, p, len))
            return;
        long used = parse_packets(self, c, c->partial, c->partial_len);
        if (used >= 0)
            partial_consume(self, c, (size_t)used);
        return;
    }
    long used = parse_packets(self, c, p, len);
    if (used >= 0 && (size_t)used < len)
        partial_keep(self, c, p + used, len - (size_t)used);
}

/* The route budget ran out: the rest of what was read is parsed in a later turn. */
static void yield_parsing(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(!c->parse_pending);
    c->parse_pending = 1;
    rt_sock_pause_reading(c->sock, true);
    rt_send(rt_self(self), RT_CONN_MSG_PARSE_MORE, NULL, 0);
}

void rt__conn_resume_parsing(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(!rt__conn_acks_held(c));
    if (c->sock && !c->closing && !c->parse_pending && !c->verifying && !c->out_muted)
        yield_parsing(self, c); /* (input held for output goes on once it drains) */
}

void rt__conn_input(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t n)
{
    if (c->closing) {
        rt__conn_collect(c, p, n); /* for the session's holder, if handing over */
        return;
    }
    /* Parsing waits (for the verifier's verdict, or for the next turn once the route budget is
       spent): the transport's layers still take all that was read, so it waits as MQTT bytes. */
    if (c->verifying || c->parse_pending || c->out_muted || rt__conn_acks_held(c) ||
        rt__conn_routed_this_event >= RT_CONN_ROUTE_BUDGET || rt_xport_rate_spent(rt__conn_xp(c))) {
        partial_keep(self, c, p, n);
        return;
    }
    parse_input(self, c, p, n);
}

static void on_readable(rt_actor_t *self, conn_t *c)
{
    rt__conn_routed_this_event = 0;
    if (c->parse_pending || rt__conn_acks_held(c))
        return; /* buffered packets go first */
    for (int i = 0; i < RT_CONN_READS_PER_TURN && !c->closing; i++) {
        if (rt__conn_rate_hold(self, c) || output_holds_input(c))
            return;
        const void *data;
        size_t len;
        int rc = rt_sock_read(c->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            rt__conn_close(self, c, 0, RT_REASON_NORMAL);
            return;
        }
        c->last_rx_ns = rt_mono_ns();
        rt__metric_add(RT_METRIC_BYTES_IN, len);
        if (c->xp) /* the scheduler's read buffer: the transport may unmask frames in place */
            rt__conn_xport_input(self, c, (uint8_t *)(uintptr_t)data, len);
        else
            parse_input(self, c, data, len);
        if (!c->sock)
            return; /* handed over, or gone offline */
        if (c->verifying || rt__conn_acks_held(c))
            return; /* reading paused until the verdict or the acks: what came after waits */
        if (!c->closing && rt__conn_routed_this_event >= RT_CONN_ROUTE_BUDGET) {
            yield_parsing(self, c);
            return;
        }
    }
}

void rt__conn_parse_more(rt_actor_t *self, conn_t *c)
{
    c->parse_pending = 0;
    if (!c->sock || c->closing || rt__conn_acks_held(c))
        return; /* the gate opening parses on (rt__conn_resume_parsing) */
    rt_sock_pause_reading(c->sock, false);
    rt__conn_routed_this_event = 0;
    long used = parse_packets(self, c, c->partial, c->partial_len);
    if (used < 0)
        return;
    partial_consume(self, c, (size_t)used);
    if (rt__conn_routed_this_event >= RT_CONN_ROUTE_BUDGET) {
        yield_parsing(self, c);
        return;
    }
    if (!c->out_muted && c->xp)
        rt__conn_xport_resume(self, c);
    if (c->sock && !c->closing && !c->parse_pending)
        on_readable(self, c);
}

/*
** The socket's output drained: queued messages go on out, and input held back for it is
** parsed, then reading goes on (unless something else holds it: parsing that yielded, the
** verifier).
*/
static void on_output_drained(rt_actor_t *self, conn_t *c)
{
    rt__conn_pump(self, c);
    if (!c->out_muted || !c->sock || c->closing)
        return;
    c->out_muted = 0;
    if (!c->parse_pending && !c->verifying)
        rt__conn_parse_more(self, c);
}

/*
** A reconnect with clean start 0 handed this session its socket. A connection
** still open here is taken over (v5: DISCONNECT 0x8E); its will goes out unless
** the session continues with a will delay (3.1.3.2.2) — which it does here.
** Then the handed bytes (CONNECT and whatever followed) are parsed as ours.
*/
static void on_resume(rt_actor_t *self, conn_t *c, rt_msg_t *m)
{
    if (c->sock && c->closing)
        return; /* exiting already: the message's fd (and transport) are freed with it */
    int fd = rt_msg_take_fd(m);
    rt_xport_t *xp = rt_msg_take_owned(m);
    const uint8_t *data = m->data + sizeof(rt_msg_owned_t);
    size_t len = m->len - sizeof(rt_msg_owned_t);
    if (c->sock) {
        if (c->version == MQTT_V5)
            rt__conn_send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        if (c->will && !c->will_delay)
            rt__conn_publish_will(self, c);
        rt__conn_close_socket(c);
        rt__conn_reset_connection_state(self, c);
        rt__conn_rule_event(self, c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1,
                            MQTT_RC_SESSION_TAKEN_OVER, "takeover", NULL);
        rt__conn_count_connected(c, false);
        rt_log(RT_LOG_INFO, "client.disconnected", "client=%s reason=takeover session=kept",
               c->client_id);
    } else {
        rt__conn_rejoin_shared_groups(self, c);
    }
    rt__conn_drop_will(self, c); /* back in time: a pending delayed will is cancelled */
    rt_free(self, c->username);  /* the new CONNECT names its own user */
    c->username = NULL;
    rt__conn_forget_peer(self, c); /* and comes from its own address */
    if (rt_sock_adopt(self, fd, &c->sock) != 0) {
        rt_log(RT_LOG_ERROR, "client.resume_failed", "client=%s", c->client_id);
        close(fd);
        rt_xport_free(xp);
        c->closing = 1;
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    c->xp = xp; /* after drop_will: the transport shares will_at_ms's word */
    rt_xport_adopt(xp, c->sock);
    rt_sock_low_at_hangup(c->sock);
    /* Its last connection's end put it in the low lane (conn_init); connected, it is not. */
    rt_set_priority(self, RT_PRIORITY_NORMAL);
    c->listener = data[0] & 15;
    c->claimed = data[0] >> 4 & 1; /* the connection that handed it over claimed the id */
    c->lease = data[0] >> 5 & 3;
    c->name_unvouched = (data[0] & RT_CONN_RESUME_UNVOUCHED) != 0;
    rt__broker_count_socket(c->listener, +1);
    c->max_packet = (uint32_t)RT_LIVE(max_packet_size);
    c->version = 0;
    c->closing = 0;
    c->resuming = 1;
    c->discard_will = 0;
    c->disc_rc = 0;
    c->will_delay = 0;
    c->peer_max_packet = 0;
    c->last_rx_ns = rt_mono_ns();
    /* What the login that made this CONNECT granted (grant.c), then the CONNECT. */
    size_t grant = rt__conn_read_grant(self, c, data + 1, len - 1);
    if (!grant) {
        rt__conn_close(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
        return;
    }
    parse_input(self, c, data + 1 + grant, len - 1 - grant);
    if (!c->closing)
        on_readable(self, c);
}

void rt__conn_send_socket(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                          size_t len)
{
    c->closing = 1;
    rt_xport_flush(c->xp);
    int fd = rt_sock_detach(c->sock);
    if (fd < 0) { /* output the kernel would not take yet: the client will connect again */
        rt_log(RT_LOG_INFO, "client.resume_failed", "reason=%s", "socket busy");
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    c->sock = NULL;
    rt__broker_count_socket(c->listener, -1);
    /* The message owns the fd and the transport until the holder takes them: if the holder
       exits first, freeing the message closes the fd and the client reconnects afresh. */
    size_t grant = rt__conn_grant_size(c);
    rt_msg_t *m = rt_msg_new_fd(RT_CONN_MSG_RESUME, fd, sizeof(rt_msg_owned_t) + 1 + grant + len);
    if (!m) {
        close(fd);
        rt_xport_free(c->xp);
        c->xp = NULL;
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    memset(m->data, 0, sizeof(rt_msg_owned_t));
    if (c->xp)
        rt_msg_own(m, c->xp, rt_xport_free);
    c->xp = NULL;
    m->data[sizeof(rt_msg_owned_t)] = (uint8_t)(c->listener | c->claimed << 4 | c->lease << 5 |
                                                 (c->name_unvouched ? RT_CONN_RESUME_UNVOUCHED : 0));
    rt__conn_write_grant(c, m->data + sizeof(rt_msg_owned_t) + 1);
    memcpy(m->data + sizeof(rt_msg_owned_t) + 1 + grant, bytes, len);
    rt_send_msg(holder, m);
    rt_exit(self, RT_REASON_NORMAL);
}

/*
** A connection that has not sent its CONNECT (or finished its TLS handshake, WebSocket
** upgrade or PROXY header) within connect_timeout of its accept is closed: else each
** silent socket would hold an actor, and a TLS one its handshake state, for good.
*/
static void on_connect_timeout(rt_actor_t *self, conn_t *c)
{
    c->accept_tick_pending = 0;
    if (c->keepalive_rides_accept_tick) {
        c->keepalive_rides_accept_tick = 0;
        on_keepalive(self, c);
        return;
    }
    if (!c->sock || c->closing || c->version || c->verifying || c->client_id)
        return;
    rt__conn_log_timeout(c, rt_broker->conf.connect_timeout);
    atomic_fetch_add_explicit(&rt_broker->stats.connect_timeouts, 1, memory_order_relaxed);
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    const rt_conn_arg_t *a = arg;
    RT_ASSERT(a->listener < RT_CONF_MAX_LISTENERS);
    int rc = rt_sock_adopt(self, a->fd, &c->sock);
    if (rc)
        return rc;
    /* A lost connection's end (its will, its subscriptions or its session's detaching, the
       close) waits behind the connected clients' traffic: 19,000 dropping at once held the
       others' messages up ~100 ms in the one queue (docs/BENCHMARKS.md, "A mass
       disconnect"). A session kept after it stays low until a connection takes it up. */
    rt_sock_low_at_hangup(c->sock);
    c->last_rx_ns = rt_mono_ns();
    c->listener = a->listener & 15;
    rc = rt__conn_xport_start(c);
    if (rc)
        return rc; /* the runtime closes the socket with the actor */
    rt__broker_count_socket(c->listener, +1);
    c->max_packet = (uint32_t)RT_LIVE(max_packet_size);
    c->preauth = 1;
    c->accept_tick_pending = 1;
    rt_send_after_tag((uint64_t)rt_broker->conf.connect_timeout * 1000, rt_self(self),
                      RT_CONN_MSG_CONNECT_TIMEOUT, NULL);
    return 0;
}

/* The client caught up with what it was sent: its publishers stop dropping QoS 0 for it. */
static void on_writable(rt_actor_t *self, conn_t *c)
{
    c->shedding = 0;
    rt_shed(self, false);
    rt_sock_set_high_water(c->sock, 0);
    rt_log(RT_LOG_INFO, "client.caught_up", "client=%s dropped=%u", c->client_id, c->dropped);
}

/*
** This node's lease ran out since the id was claimed (cluster.h): another node may hold the id
** now, so nothing more is served on this connection; its client is told to go elsewhere.
*/
static void lease_lost(rt_actor_t *self, conn_t *c)
{
    c->claimed = 0;
    rt_log(RT_LOG_INFO, "client.lease_lost",
           "client=%s this node's cluster lease ran out; the connection ends", c->client_id);
    rt__conn_close(self, c, MQTT_RC_USE_ANOTHER_SERVER, RT_REASON_NORMAL);
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_t *c = state;
    RT_ASSERT(rt_current() == self);
    /* Before anything is served: a node resumed after a freeze may run this first. */
    if (c->claimed && c->sock && !c->closing && !rt_cluster_lease_holds(c->lease))
        lease_lost(self, c);
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        uint32_t events = ((rt_sock_event_t *)(void *)m->data)->events;
        if (c->shedding && (events & RT_SOCK_WRITABLE) && c->sock)
            on_writable(self, c);
        if ((events & RT_SOCK_WRITABLE) && c->sock)
            on_output_drained(self, c);
        if (c->sock && (events & RT_SOCK_READABLE))
            on_readable(self, c);
        rt__conn_budget_check(c, false); /* acknowledgements and drained output free memory */
        break;
    }
    case RT_MSG_DELIVER:
        if (m->bin)
            rt__conn_deliver(self, c, m->bin, (const rt_delivery_t *)(const void *)m->data,
                             ((const rt_delivery_t *)(const void *)m->data)->sub_ids);
        break;
    case RT_CONN_MSG_KEEPALIVE:
        on_keepalive(self, c);
        break;
    case RT_CONN_MSG_RESUME:
        if (m->len > sizeof(rt_msg_owned_t))
            on_resume(self, c, m);
        break;
    case RT_CONN_MSG_SESSION_EXPIRED:
        if (!c->sock && c->client_id && rt_mono_ms() >= c->expire_at_ms) {
            rt_log(RT_LOG_INFO, "session.expired", "client=%s", c->client_id);
            rt_exit(self, RT_REASON_NORMAL);
        }
        break;
    case RT_CONN_MSG_WILL_DUE:
        if (!c->sock && c->will && rt_mono_ms() >= c->will_at_ms)
            rt__conn_publish_will(self, c);
        break;
    case RT_STORE_MSG_COMMITTED:
        if (m->len >= sizeof(rt_store_committed_t)) {
            const rt_store_committed_t *d = (const rt_store_committed_t *)(const void *)m->data;
            rt__conn_on_commit(self, c, d->token, d->status);
        }
        break;
    case RT_CLUSTER_MSG_RETAINED_READY:
        if (c->sock)
            rt__conn_send_retained(self, c, m->data, m->len);
        break;
    case RT_CLUSTER_MSG_CLAIMED:
        if (m->len < sizeof(rt_cluster_claimed_t))
            break;
        if (c->sock)
            rt__conn_on_claimed(self, c, (const rt_cluster_claimed_t *)(const void *)m->data);
        else
            rt__conn_on_verified(self, c, (const rt_cluster_claimed_t *)(const void *)m->data);
        break;
    case RT_CLUSTER_MSG_LEASE:
        if (m->len >= sizeof(rt_cluster_lease_t) &&
            ((const rt_cluster_lease_t *)(const void *)m->data)->held)
            rt__conn_verify_kept(self, c);
        break;
    case RT_RULES_MSG_DURABLE:
        if (m->len >= sizeof(rt_rules_durable_t)) {
            const rt_rules_durable_t *d = (const rt_rules_durable_t *)(const void *)m->data;
            rt__conn_on_commit(self, c, d->token, d->status);
        }
        break;
    case RT_CONN_MSG_AUTH_REFUSED:
        rt__conn_send_login_refusal(self, c);
        break;
    case RT_CONN_MSG_TOKEN_EXPIRY:
        rt__conn_on_token_expiry(self, c);
        break;
    case RT_CONN_MSG_PARSE_MORE:
        rt__conn_parse_more(self, c);
        break;
    case RT_CONN_MSG_LOGIN_VERDICT:
        if (m->len >= sizeof(rt_auth_verdict_t) &&
            m->len - sizeof(rt_auth_verdict_t) >=
                ((const rt_auth_verdict_t *)(const void *)m->data)->acl_len)
            rt__conn_on_login_verdict(self, c, (const rt_auth_verdict_t *)(const void *)m->data);
        break;
    case RT_CONN_MSG_SLOW_CHECK:
        rt__conn_on_slow_check(self, c);
        break;
    case RT_CONN_MSG_CONNECT_TIMEOUT:
        on_connect_timeout(self, c);
        break;
    case RT_CONN_MSG_RATE_RESUME:
        if (!rt_xport_rate_resume(rt__conn_xp(c)))
            break;
        /* The pause was rtd's doing: its time does not count as the client's silence. */
        c->last_rx_ns = rt_mono_ns();
        if (!c->parse_pending && !c->verifying)
            rt__conn_parse_more(self, c); /* what waits in the partial buffer, then reading */
        break;
    case RT_CONN_MSG_BUDGET_CHECK:
        rt__conn_budget_check(c, true);
        break;
    case RT_CONN_MSG_ACL_LOG:
        rt__conn_acl_log_due(c);
        break;
    case RT_CONN_MSG_RESTORED:
        /* From its own turn, so the store learns the session's new owner (epoch). */
        rt_store_session(c->client_id, c->session_expiry, false, false);
        /* In a cluster another node may have claimed the id since: checked now if the lease
           is held already, else when it is taken (RT_CLUSTER_MSG_LEASE). */
        if (rt_cluster_on())
            rt__conn_verify_kept(self, c);
        break;
    case RT_CONN_MSG_IMPORTED:
        rt__conn_on_imported(self, c);
        break;
    case RT_CLUSTER_MSG_MOVE_OUT:
        if (m->len >= sizeof(rt_cluster_move_t) &&
            m->len - sizeof(rt_cluster_move_t) >=
                ((const rt_cluster_move_t *)(const void *)m->data)->reply_len)
            rt__conn_on_move_out(self, c, (const rt_cluster_move_t *)(const void *)m->data);
        break;
    case RT_CLUSTER_MSG_MOVE_IN:
        if (m->len >= offsetof(rt_cluster_move_in_t, bytes)) {
            const rt_cluster_move_in_t *in = (const rt_cluster_move_in_t *)(const void *)m->data;
            rt__conn_on_move_in(self, c, in->bytes, m->len - offsetof(rt_cluster_move_in_t, bytes));
            rt_cluster_claimed_t done = {.status = 0, .lease = in->lease};
            rt_send(in->claimer, RT_CLUSTER_MSG_CLAIMED, &done, sizeof(done));
        }
        break;
    case RT_CONN_MSG_MOVE_TIMEOUT:
        if (c->sess && c->sess->moving == RT_SESSION_MOVED_OUT) {
            rt_log(RT_LOG_WARNING, "cluster.session_move_abandoned",
                   "client=%s the node taking it did not ask for the rest", c->client_id);
            rt_exit(self, RT_REASON_TAKEOVER);
        }
        break;
    case RT_CONN_MSG_QUERY:
        rt__conn_on_query(self, c, m);
        break;
    case RT_CONN_MSG_KICK:
        rt__conn_on_kick(self, c);
        break;
    case RT_CONN_MSG_ACL_RECHECK:
        rt__conn_on_acl_recheck(self, c);
        break;
    }
}

/* The runtime names only its own reasons; RT_REASON_TAKEOVER would read "user". */
static const char *exit_reason_name(rt_reason_t reason)
{
    if (reason == RT_REASON_KICKED)
        return "kicked";
    return reason == RT_REASON_TAKEOVER ? "takeover" : rt_reason_name(reason);
}

static void conn_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    rt_xport_flush(rt__conn_xp(state));
}

static void conn_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    conn_t *c = state;
    if (!c->disc_rc && reason == RT_REASON_TAKEOVER)
        c->disc_rc = 1 + MQTT_RC_SESSION_TAKEN_OVER;
    else if (!c->disc_rc && reason == RT_REASON_SHUTDOWN)
        c->disc_rc = 1 + MQTT_RC_SERVER_SHUTTING_DOWN;
    if (c->sock && c->version == MQTT_V5 && !c->closing) {
        if (reason == RT_REASON_TAKEOVER)
            rt__conn_send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        else if (reason == RT_REASON_SHUTDOWN)
            rt__conn_send_disconnect(c, MQTT_RC_SERVER_SHUTTING_DOWN);
    }
    /* The session ends: its will goes now unless the client asked otherwise (3.1.2.5). */
    if (!c->discard_will && reason != RT_REASON_SHUTDOWN)
        rt__conn_publish_will(self, c);
    /* While the client still counts as connected and its username and peer are there. */
    if (c->client_id && c->connected)
        rt__conn_rule_event(self, c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1,
                            rt__conn_disc_reason_code(c), exit_reason_name(reason), NULL);
    rt__conn_preauth_end(c); /* the partial buffer goes with the heap */
    rt__conn_hand_over_shared(self, c);
    rt__conn_subs_unhook(self, c);
    rt__conn_drop_grant(self, c); /* its parsed ACL is outside the heap */
    /* What conn_t points to goes with the heap, right after this returns (the will, the
       session's messages and their binaries included); only shared tables need word. */
    if (c->sock)
        rt__conn_close_socket(c); /* lingering: not left to the runtime's plain close */
    rt__conn_count_connected(c, false);
    rt__conn_set_tenant(self, c, NULL);
    /* The session ends, unless the broker is only stopping: then it is kept for the restart
       (stored stays set: the dead_letter hook tells the copies it never took from that). */
    if (c->stored && reason != RT_REASON_SHUTDOWN) {
        rt_store_session_end(c->client_id);
        c->stored = 0;
    }
    /* Its record too, unless another node took it over (and writes its own). */
    if (c->client_id && c->session_expiry && reason != RT_REASON_SHUTDOWN &&
        reason != RT_REASON_TAKEOVER && rt_cluster_durable())
        rt_cluster_session_record(c->client_id, 0, NULL, 0);
    rt__conn_acl_log_due(c); /* the denials the timer would have told */
    if (c->client_id) {
        rt_broker_release_client(c->client_id, rt_self(self));
        atomic_fetch_sub(&rt_broker->stats.sessions, 1);
        rt_log(RT_LOG_INFO, "client.disconnected", "client=%s reason=%s", c->client_id,
               exit_reason_name(reason));
    }
}

/*
** The heap's roots: every pointer conn_t holds into it. The rest is reached through
** RT_OBJ_SCAN objects (conn_impl.h says which).
*/
static void conn_trace(void *state, rt_gc_t *gc)
{
    const conn_t *c = state;
    rt_gc_mark(gc, c->partial);
    rt_gc_mark(gc, c->client_id);
    rt_gc_mark(gc, c->username);
    rt_gc_mark(gc, c->extra);
    rt_gc_mark(gc, c->subs);
    rt_gc_mark(gc, c->sess);
    rt_gc_mark(gc, c->will);
    rt_gc_mark(gc, c->aliases);
}

static const char *conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case RT_MSG_DELIVER:
        return "deliver";
    case RT_CONN_MSG_KEEPALIVE:
        return "keepalive";
    case RT_CONN_MSG_RESUME:
        return "resume";
    case RT_CONN_MSG_SESSION_EXPIRED:
        return "session_expired";
    case RT_CONN_MSG_WILL_DUE:
        return "will_due";
    case RT_STORE_MSG_COMMITTED:
        return "store_committed";
    case RT_CLUSTER_MSG_RETAINED_READY:
        return "retained_ready";
    case RT_CLUSTER_MSG_CLAIMED:
        return "claimed";
    case RT_CLUSTER_MSG_LEASE:
        return "cluster_lease";
    case RT_RULES_MSG_DURABLE:
        return "rules_durable";
    case RT_CONN_MSG_RESTORED:
        return "restored";
    case RT_CONN_MSG_AUTH_REFUSED:
        return "auth_refused";
    case RT_CONN_MSG_TOKEN_EXPIRY:
        return "token_expiry";
    case RT_CONN_MSG_ACL_RECHECK:
        return "acl_recheck";
    case RT_CONN_MSG_LOGIN_VERDICT:
        return "login_verdict";
    case RT_CONN_MSG_PARSE_MORE:
        return "parse_more";
    case RT_CONN_MSG_SLOW_CHECK:
        return "slow_check";
    case RT_CONN_MSG_BUDGET_CHECK:
        return "budget_check";
    case RT_CONN_MSG_ACL_LOG:
        return "acl_log";
    case RT_CONN_MSG_CONNECT_TIMEOUT:
        return "connect_timeout";
    case RT_CONN_MSG_RATE_RESUME:
        return "rate_resume";
    case RT_CONN_MSG_IMPORTED:
        return "imported";
    case RT_CLUSTER_MSG_MOVE_OUT:
        return "move_out";
    case RT_CLUSTER_MSG_MOVE_IN:
        return "move_in";
    case RT_CONN_MSG_MOVE_TIMEOUT:
        return "move_timeout";
    case RT_CONN_MSG_QUERY:
        return "client_query";
    case RT_CONN_MSG_KICK:
        return "client_kick";
    }
    return NULL;
}

/*
** One actor type entered three ways: a socket a listener accepted, a session the store kept
** (start.c), or a session that moved here from another node (move.c).
*/
#define CONN_ACTOR_TYPE(init_fn)                                                                   \
    {                                                                                              \
        .name = "mqtt_conn", .state_size = sizeof(conn_t), .init = init_fn, .handle = conn_handle, \
        .trace = conn_trace, .terminate = conn_terminate, .turn_end = conn_turn_end,               \
        .tag_name = conn_tag_name, .dead_letter = rt__conn_dead_letter,                            \
        .heap_inline = RT_CONN_HEAP_INLINE,                                                        \
    }

const rt_actor_type_t rt_conn_type = CONN_ACTOR_TYPE(conn_init);
const rt_actor_type_t rt__conn_restored_type = CONN_ACTOR_TYPE(rt__conn_restored_init);
const rt_actor_type_t rt__conn_imported_type = CONN_ACTOR_TYPE(rt__conn_imported_init);

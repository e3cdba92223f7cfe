/*
** The connection actor: one per MQTT client socket, and the client's session.
** This file is the actor itself: its start, reading and parsing the socket,
** handing each packet to the file for its job, keepalive, and the end of a
** connection. It parses whatever bytes arrived in the scheduler's scratch buffer
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

void rt_conn_format_peer(int fd, char *buf, size_t len)
{
    rt_xport_peer_format(NULL, fd, buf, len);
}

/* The client's address as rules see it for messages; kept once a client publishes. */
static const char *peer_text(rt_actor_t *self, conn_t *c)
{
    if (c->peer || !c->sock)
        return c->peer;
    char buf[RT_PEER_TEXT_MAX];
    rt__conn_peer_format(c, buf, sizeof(buf));
    c->peer = rt_strndup(self, buf, strlen(buf));
    return c->peer;
}

rt_rule_origin_t rt__conn_rule_origin(rt_actor_t *self, conn_t *c)
{
    return (rt_rule_origin_t){.clientid = c->client_id ? c->client_id : "",
                              .username = c->username,
                              .peer = peer_text(self, c),
                              .ts_ms = rt_wall_ms()};
}

void rt__conn_rule_event(rt_actor_t *self, conn_t *c, rt_rule_event_kind_t kind, const char *topic,
                         int qos, int reason_code, const char *reason, rt_bin_t *canonical)
{
    /* Most events have no rule: then no origin is built (the peer text would cost every
       connection its bytes, and every delivery a look at them). */
    if (!rt_rules_wants_event(kind))
        return;
    rt_rule_origin_t o = rt__conn_rule_origin(self, c);
    rt_rule_event_t e = {.kind = kind,
                         .topic = topic,
                         .qos = qos,
                         .reason_code = reason_code,
                         .reason = reason,
                         .proto_ver = -1,
                         .keepalive = -1,
                         .clean_start = -1,
                         .canonical = canonical};
    if (canonical) {
        rt_message_t msg;
        rt_message_view(canonical, &msg);
        e.from_clientid = msg.clientid;
        e.from_username = msg.username;
    }
    rt_rules_event(&o, &e);
}

/* client.disconnected: the MQTT reason code the connection ended with, or -1 (none). */
static int disc_reason_code(const conn_t *c)
{
    return c->disc_rc ? c->disc_rc - 1 : -1;
}

int rt__conn_write_packet(conn_t *c, uint8_t type, const uint8_t *buf, size_t len)
{
    RT_ASSERT(c->sock);
    int rc = c->xp ? rt_xport_write(c->xp, c->sock, buf, len) : rt_sock_write(c->sock, buf, len);
    if (rc == 0 && rt_tracing())
        rt_trace_packet(RT_TRACE_OUT, c->client_id, buf, len, c->version);
    if (rc == 0) {
        rt__metric_add(RT_METRIC_BYTES_OUT, len);
        rt__metric_add(RT_METRIC_PKT_OUT + type, 1);
    }
    return rc;
}

int rt__conn_send_packet(conn_t *c, mqtt_packet_t *pk)
{
    if (!c->sock)
        return RT_ECLOSED;
    pk->version = c->version ? c->version : MQTT_V311;
    size_t len;
    if (mqtt_encode(pk, NULL, 0, c->peer_max_packet, &len, NULL) != 0)
        return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
    uint8_t stackbuf[512];
    uint8_t *buf = len <= sizeof(stackbuf) ? stackbuf : malloc(len);
    if (!buf)
        return RT_ENOMEM;
    int rc = mqtt_encode(pk, buf, len, c->peer_max_packet, &len, NULL);
    if (rc == 0)
        rc = rt__conn_write_packet(c, pk->type, buf, len);
    if (buf != stackbuf)
        free(buf);
    return rc;
}

static const char *disconnect_reason_text(uint8_t reason)
{
    switch (reason) {
    case MQTT_RC_MALFORMED:
        return "malformed packet";
    case MQTT_RC_PROTOCOL_ERROR:
        return "protocol error";
    case MQTT_RC_KEEPALIVE_TIMEOUT:
        return "keep alive timeout";
    case MQTT_RC_SESSION_TAKEN_OVER:
        return "session taken over";
    case MQTT_RC_SERVER_SHUTTING_DOWN:
        return "server shutting down";
    case MQTT_RC_PACKET_TOO_LARGE:
        return "packet too large";
    case MQTT_RC_RECEIVE_MAX_EXCEEDED:
        return "receive maximum exceeded";
    case MQTT_RC_BAD_AUTH_METHOD:
        return "bad authentication method";
    case MQTT_RC_ADMIN_ACTION:
        return "administrative action";
    default:
        return "disconnected by the server";
    }
}

/* A v5 DISCONNECT with a reason string (which also lets clients that read the reason only
   when properties follow, such as paho-mqtt 1.6, see it). */
static void send_disconnect(conn_t *c, uint8_t reason)
{
    RT_ASSERT(c->version == MQTT_V5);
    const char *text = disconnect_reason_text(reason);
    mqtt_packet_t pk = {.type = MQTT_DISCONNECT, .reason = reason};
    pk.props.present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
    pk.props.reason_string = (mqtt_str_t){(const uint8_t *)text, (uint32_t)strlen(text)};
    rt__conn_send_packet(c, &pk);
}

conn_aliases_t *rt__conn_aliases_get_or_make(rt_actor_t *self, conn_t *c)
{
    if (!c->aliases)
        c->aliases = rt_alloc(self, sizeof(*c->aliases), RT_OBJ_SCAN);
    return c->aliases;
}

/*
** Aliases last as long as the network connection (3.3.2.3.4). Freed at once rather than left
** to a collection: an offline session may allocate nothing more for a long time, and would
** show (and hold) a connection's worth of topics it can no longer use.
*/
static void aliases_free(rt_actor_t *self, conn_t *c)
{
    if (!c->aliases)
        return;
    for (long i = 0; c->aliases->in && i < rt_broker->conf.max_topic_alias; i++)
        rt_free(self, c->aliases->in[i]);
    rt_free(self, c->aliases->in);
    rt_alias_out_free(c->aliases->out);
    rt_free(self, c->aliases);
    c->aliases = NULL;
}

/*
** The pre-auth budget (rt_broker_preauth_charge): a connection counts its partial packet
** (partial_cap, while c->preauth) and its transport's stash (xport.h, which charges the same
** budget: rt_listeners_start says so). A connection that was accepted stops counting when
** its CONNECT is.
*/
static bool preauth_take(const conn_t *c, int64_t bytes)
{
    return !c->preauth || bytes == 0 || rt_broker_preauth_charge(bytes);
}

/* The connection authenticated (or is ending): its bytes no longer count as pre-auth. */
static void preauth_end(conn_t *c)
{
    rt_xport_preauth_end(rt__conn_xp(c)); /* a handed-over transport may have counted without
                                             us */
    if (!c->preauth)
        return;
    preauth_take(c, -(int64_t)c->partial_cap);
    c->preauth = 0;
}

void rt__conn_preauth_refused(rt_actor_t *self, conn_t *c, size_t wanted)
{
    static _Atomic uint64_t logged_ms;
    static atomic_uint unlogged;
    atomic_fetch_add_explicit(&rt_broker->stats.preauth_refused, 1, memory_order_relaxed);
    unsigned n = atomic_fetch_add_explicit(&unlogged, 1, memory_order_relaxed) + 1;
    uint64_t now = rt_mono_ms(), last = atomic_load_explicit(&logged_ms, memory_order_relaxed);
    if (now - last >= 1000 &&
        atomic_compare_exchange_strong_explicit(&logged_ms, &last, now, memory_order_relaxed,
                                                memory_order_relaxed)) {
        atomic_fetch_sub_explicit(&unlogged, n, memory_order_relaxed);
        char peer[RT_PEER_TEXT_MAX];
        rt__conn_peer_format(c, peer, sizeof(peer));
        rt_log(RT_LOG_WARNING, "client.preauth_refused",
               "peer=%s wanted=%zu held=%lld max_preauth_memory=%ld count=%u", peer, wanted,
               (long long)atomic_load(&rt_broker->stats.preauth_bytes),
               RT_LIVE(max_preauth_memory), n);
    }
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
}

void rt__conn_count_connected(conn_t *c, bool on)
{
    if (on)
        preauth_end(c);
    if (c->connected == on)
        return;
    c->connected = on;
    if (on)
        rt_atomic_raise(&rt_broker->stats.connections_max,
                        atomic_fetch_add(&rt_broker->stats.connections, 1) + 1);
    else
        atomic_fetch_sub(&rt_broker->stats.connections, 1);
}

/* Closes the client's socket (flushing what is buffered, such as a DISCONNECT). */
static void close_socket(conn_t *c)
{
    RT_ASSERT(c->sock);
    rt_xport_close(c->xp, c->sock);
    c->xp = NULL;
    rt_sock_close_lingering(c->sock); /* the client reads rtd's last packet, not a reset */
    c->sock = NULL;
    rt__broker_count_socket(c->listener, -1);
}

/* Released at once: a will can be as big as any message, and an offline session may wait
   long for the collection that would find it. */
void rt__conn_drop_will(rt_actor_t *self, conn_t *c)
{
    rt_free(self, c->will);
    c->will = NULL;
}

static void publish_will(rt_actor_t *self, conn_t *c)
{
    if (!c->will)
        return;
    rt_bin_t *will = rt_heap_bin(c->will);
    rt_message_t w;
    rt_message_view(will, &w);
    if (rt_acl_permit(c->username, c->client_id, (const char *)w.topic.p, w.topic.len,
                      RT_ACL_WRITE)) {
        rt_broker_route(rt_self(self), will);
        rt_rule_origin_t o = rt__conn_rule_origin(self, c);
        rt_rules_publish(&o, will, 0, 0);
    } else {
        rt__conn_acl_denied(self, c, RT_CONN_DENIED_WILL, w.topic.p, w.topic.len);
    }
    rt_log(RT_LOG_INFO, "client.will", "client=%s", c->client_id ? c->client_id : "-");
    rt__conn_drop_will(self, c);
}

/* Frees what belongs to one network connection, not to the session. */
static void reset_connection_state(rt_actor_t *self, conn_t *c)
{
    preauth_end(c);
    c->out_muted = 0; /* held for output that went with the socket */
    rt_free(self, c->partial);
    c->partial = NULL;
    c->partial_len = c->partial_cap = 0;
    aliases_free(self, c);
    if (c->sess)
        c->sess->nacks = 0; /* acks for a connection that is gone: the client resends */
}

void rt__conn_arm_session_expiry(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(!c->sock && !c->connected); /* expire_at_ms shares its word with connected_at_ms */
    uint64_t ms = (uint64_t)c->session_expiry * 1000;
    c->expire_at_ms = rt_mono_ms() + ms;
    rt_send_after_tag(ms, rt_self(self), RT_CONN_MSG_SESSION_EXPIRED, NULL);
}

/*
** The socket is gone but the session lives on (session expiry > 0): the actor
** stays, holding subscriptions and queueing, until the client resumes or the
** expiry runs out. The will goes now, or after its delay if the client does
** not come back first (MQTT 5 3.1.2.5).
*/
static void go_offline(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(c->client_id && c->session_expiry);
    close_socket(c);
    c->closing = 1;
    reset_connection_state(self, c);
    rt__conn_count_connected(c, false);
    if (c->discard_will)
        rt__conn_drop_will(self, c);
    if (c->will && c->will_delay) {
        c->will_at_ms = rt_mono_ms() + (uint64_t)c->will_delay * 1000;
        rt_send_after_tag((uint64_t)c->will_delay * 1000, rt_self(self), RT_CONN_MSG_WILL_DUE,
                          NULL);
    } else {
        publish_will(self, c);
    }
    rt__conn_leave_shared_groups(self, c);
    rt__conn_arm_session_expiry(self, c);
    if (c->stored)
        rt_store_session(c->client_id, c->session_expiry, false, false);
    rt_log(RT_LOG_INFO, "client.disconnected", "client=%s session=kept expiry=%us", c->client_id,
           c->session_expiry);
    rt__conn_rule_event(self, c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1, disc_reason_code(c),
                        "offline", NULL);
}

void rt__conn_close(rt_actor_t *self, conn_t *c, uint8_t reason, rt_reason_t exit_reason)
{
    if (c->closing)
        return;
    if (!c->disc_rc && reason)
        c->disc_rc = (uint8_t)(1 + reason);
    if (c->version == MQTT_V5 && reason)
        send_disconnect(c, reason);
    if (c->session_expiry && c->client_id && exit_reason == RT_REASON_NORMAL) {
        go_offline(self, c);
        return;
    }
    c->closing = 1;
    rt_exit(self, exit_reason);
}

uint8_t rt__conn_error_reason(int err)
{
    return MQTT_IS_REASON_ERR(err) ? MQTT_ERR_REASON(err) : MQTT_RC_PROTOCOL_ERROR;
}

/*
** The client is named by its id once it has one, or by the id its refused CONNECT carried
** (when that was read as valid UTF-8), and always by its address, so even a client that
** never got as far as an id can be found.
*/
void rt__conn_log_bad_packet(rt_actor_t *self, conn_t *c, mqtt_str_t connect_id, uint8_t reason)
{
    atomic_fetch_add(&rt_broker->stats.bad_packets, 1);
    const char *id = c->client_id;
    int idlen = id ? (int)strlen(id) : 0;
    if (!id && connect_id.len && mqtt_utf8_valid(connect_id.p, connect_id.len)) {
        id = (const char *)connect_id.p;
        idlen = (int)connect_id.len;
    }
    const char *peer = peer_text(self, c);
    rt_log(RT_LOG_INFO, "client.bad_packet", "client=%.*s peer=%s reason=0x%02x", id ? idlen : 1,
           id ? id : "-", peer ? peer : "-", reason);
}

static void close_on_protocol_error(rt_actor_t *self, conn_t *c, int err)
{
    uint8_t reason = rt__conn_error_reason(err);
    rt__conn_log_bad_packet(self, c, (mqtt_str_t){0}, reason);
    rt__conn_close(self, c, reason, RT_REASON_NORMAL);
}

void rt__conn_arm_keepalive(rt_actor_t *self, conn_t *c)
{
    if (!c->keepalive || c->keepalive_armed)
        return;
    c->keepalive_armed = 1;
    /* Checked at half the keepalive, closed past 1.5x (MQTT 3.1.2.10). */
    rt_send_after_tag((uint64_t)c->keepalive * 500, rt_self(self), RT_CONN_MSG_KEEPALIVE, NULL);
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

bool rt__conn_output_backed_up(conn_t *c)
{
    if (!c->sock || rt_sock_pending(c->sock) + rt_xport_unsent(c->xp) <= RT_CONN_OUTPUT_MARK)
        return false;
    rt_xport_flush(c->xp); /* TLS's stage becomes records in the socket's output */
    int rc = rt_sock_flush(c->sock);
    return rc == RT_EAGAIN && rt_sock_pending(c->sock) > RT_CONN_OUTPUT_MARK;
}

/*
** Whether the client's input must wait for its output (RT_CONN_OUTPUT_MARK): then reading
** pauses until the socket drains (on_output_drained). The keepalive and connect_timeout
** still run, so a client that never reads is closed in the end.
*/
void rt__conn_hold_input(conn_t *c)
{
    if (c->out_muted)
        return;
    c->out_muted = 1;
    rt_sock_pause_reading(c->sock, true);
    rt_sock_output_taken(c->sock); /* from here on, whether the client reads at all */
    atomic_fetch_add_explicit(&rt_broker->stats.output_holds, 1, memory_order_relaxed);
    /* Its socket's pressure holds back all but its socket events, administrators' queries
       too: a client that goes on not reading is a slow consumer (delivery.c), which lifts
       the pressure; its input stays held (and its output bounded) all the same. */
    if (rt__conn_online(c))
        rt__conn_watch_backlog(rt_current(), c);
}

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
    if (!preauth_take(c, (int64_t)c->partial_cap - was)) {
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
        preauth_take(c, -(int64_t)c->partial_cap);
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
            send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        if (c->will && !c->will_delay)
            publish_will(self, c);
        close_socket(c);
        reset_connection_state(self, c);
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
    rt_free(self, c->peer); /* and comes from its own address */
    c->peer = NULL;
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
    parse_input(self, c, data + 1, len - 1);
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
    rt_msg_t *m = rt_msg_new_fd(RT_CONN_MSG_RESUME, fd, sizeof(rt_msg_owned_t) + 1 + len);
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
    memcpy(m->data + sizeof(rt_msg_owned_t) + 1, bytes, len);
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
    c->last_rx_ns = rt_mono_ns();
    c->listener = a->listener & 15;
    rc = rt__conn_xport_start(c);
    if (rc)
        return rc; /* the runtime closes the socket with the actor */
    rt__broker_count_socket(c->listener, +1);
    c->max_packet = (uint32_t)RT_LIVE(max_packet_size);
    c->preauth = 1;
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
            publish_will(self, c);
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
    case RT_CONN_MSG_PARSE_MORE:
        rt__conn_parse_more(self, c);
        break;
    case RT_CONN_MSG_LOGIN_VERDICT:
        if (m->len >= sizeof(rt_auth_verdict_t))
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
            send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        else if (reason == RT_REASON_SHUTDOWN)
            send_disconnect(c, MQTT_RC_SERVER_SHUTTING_DOWN);
    }
    /* The session ends: its will goes now unless the client asked otherwise (3.1.2.5). */
    if (!c->discard_will && reason != RT_REASON_SHUTDOWN)
        publish_will(self, c);
    /* While the client still counts as connected and its username and peer are there. */
    if (c->client_id && c->connected)
        rt__conn_rule_event(self, c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1, disc_reason_code(c),
                            exit_reason_name(reason), NULL);
    preauth_end(c); /* the partial buffer goes with the heap */
    rt__conn_hand_over_shared(self, c);
    rt__conn_subs_unhook(self, c);
    /* What conn_t points to goes with the heap, right after this returns (the will, the
       session's messages and their binaries included); only shared tables need word. */
    if (c->sock)
        close_socket(c); /* lingering: not left to the runtime's plain close */
    rt__conn_count_connected(c, false);
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
    rt_gc_mark(gc, c->peer);
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

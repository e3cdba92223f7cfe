/*
** The connection's ground floor: what every handler of a connection (connect.c, publish.c,
** subscribe.c, delivery.c, move.c...) and the actor itself (conn.c) call: writing packets,
** the rule events, topic aliases, the will, the session's expiry and keepalive timers,
** counting, and closing. It calls none of them, and none of the actor's own code.
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

#define RT_PEER_TEXT_MAX (INET6_ADDRSTRLEN + 8) /* "ip:port" */

void rt_conn_format_peer(int fd, char *buf, size_t len)
{
    rt_xport_peer_format(NULL, fd, buf, len);
}

/* The client's address as rules see it for messages; kept once a client publishes. */
static const char *peer_text(rt_actor_t *self, conn_t *c)
{
    if ((c->extra && c->extra->peer) || !c->sock)
        return c->extra ? c->extra->peer : NULL;
    char buf[RT_PEER_TEXT_MAX];
    rt__conn_peer_format(c, buf, sizeof(buf));
    conn_extra_t *x = rt__conn_extra(self, c);
    if (x)
        x->peer = rt_strndup(self, buf, strlen(buf));
    return x ? x->peer : NULL;
}

void rt__conn_forget_peer(rt_actor_t *self, conn_t *c)
{
    if (!c->extra)
        return;
    rt_free(self, c->extra->peer);
    c->extra->peer = NULL;
}

rt_rule_origin_t rt__conn_rule_origin(rt_actor_t *self, conn_t *c)
{
    return (rt_rule_origin_t){.clientid = c->client_id ? c->client_id : "",
                              .username = c->username,
                              .peer = peer_text(self, c),
                              .ts_ms = rt_wall_ms()};
}

int rt__conn_rules_publish(rt_actor_t *self, conn_t *c, rt_bin_t *bin, rt_pid_t ack_pid,
                           uint64_t ack_token, bool *promised)
{
    /* Without a publish rule no origin is built: its clock read was ~1% of a 16 B fan-in's
       CPU, and its peer text would cost every publisher's heap its bytes. */
    if (!rt_rules_wants_publish()) {
        if (promised)
            *promised = false;
        return 0;
    }
    rt_rule_origin_t o = rt__conn_rule_origin(self, c);
    return rt_rules_publish(&o, bin, ack_pid, ack_token, promised);
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
int rt__conn_disc_reason_code(const conn_t *c)
{
    return c->disc_rc ? c->disc_rc - 1 : -1;
}

void rt__conn_count_packet_out(uint8_t type, size_t len)
{
    rt__metric_add(RT_METRIC_BYTES_OUT, len);
    rt__metric_add(RT_METRIC_PKT_OUT + type, 1);
}

uint8_t *rt__conn_reserve_frame(conn_t *c, size_t len)
{
    RT_ASSERT(c->sock);
    return len >= RT_CONN_IN_PLACE_MIN && !c->xp && !rt_tracing() ? rt_sock_reserve(c->sock, len)
                                                                  : NULL;
}

int rt__conn_write_packet(conn_t *c, uint8_t type, const uint8_t *buf, size_t len)
{
    RT_ASSERT(c->sock);
    int rc = c->xp ? rt_xport_write(c->xp, c->sock, buf, len) : rt_sock_write(c->sock, buf, len);
    if (rc == 0 && rt_tracing())
        rt_trace_packet(RT_TRACE_OUT, c->client_id, buf, len, c->version);
    if (rc == 0)
        rt__conn_count_packet_out(type, len);
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
void rt__conn_send_disconnect(conn_t *c, uint8_t reason)
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
bool rt__conn_preauth_take(const conn_t *c, int64_t bytes)
{
    return !c->preauth || bytes == 0 || rt_broker_preauth_charge(bytes);
}

/* The connection authenticated (or is ending): its bytes no longer count as pre-auth. */
void rt__conn_preauth_end(conn_t *c)
{
    rt_xport_preauth_end(rt__conn_xp(c)); /* a handed-over transport may have counted without
                                             us */
    if (!c->preauth)
        return;
    rt__conn_preauth_take(c, -(int64_t)c->partial_cap);
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
        rt__conn_preauth_end(c);
    if (c->connected == on)
        return;
    c->connected = on;
    if (on)
        rt_atomic_raise(&rt_broker->stats.connections_max,
                        atomic_fetch_add(&rt_broker->stats.connections, 1) + 1);
    else
        atomic_fetch_sub(&rt_broker->stats.connections, 1);
    /* Its tenant counted it when it was admitted (connect.c), just before this. */
    if (!on && rt__conn_tenant(c))
        rt_tenant_disconnect(rt__conn_tenant(c));
}

/* Closes the client's socket (flushing what is buffered, such as a DISCONNECT). */
void rt__conn_close_socket(conn_t *c)
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

void rt__conn_publish_will(rt_actor_t *self, conn_t *c)
{
    if (!c->will)
        return;
    rt_bin_t *will = rt_heap_bin(c->will);
    rt_message_t w;
    rt_message_view(will, &w);
    mqtt_str_t seen = w.topic; /* the ACL judges the client's own view */
    if (rt__conn_unmount(c, &seen) && rt__conn_acl(c, seen.p, seen.len, RT_ACL_WRITE)) {
        rt_broker_route(rt_self(self), will);
        rt__conn_rules_publish(self, c, will, 0, 0, NULL);
    } else {
        rt__conn_acl_denied(self, c, RT_CONN_DENIED_WILL, w.topic.p, w.topic.len);
    }
    rt_log(RT_LOG_INFO, "client.will", "client=%s", c->client_id ? c->client_id : "-");
    rt__conn_drop_will(self, c);
}

/* Frees what belongs to one network connection, not to the session. */
void rt__conn_reset_connection_state(rt_actor_t *self, conn_t *c)
{
    rt__conn_preauth_end(c);
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
    rt__conn_close_socket(c);
    c->closing = 1;
    rt__conn_reset_connection_state(self, c);
    rt__conn_count_connected(c, false);
    if (c->discard_will)
        rt__conn_drop_will(self, c);
    if (c->will && c->will_delay) {
        c->will_at_ms = rt_mono_ms() + (uint64_t)c->will_delay * 1000;
        rt_send_after_tag((uint64_t)c->will_delay * 1000, rt_self(self), RT_CONN_MSG_WILL_DUE,
                          NULL);
    } else {
        rt__conn_publish_will(self, c);
    }
    rt__conn_leave_shared_groups(self, c);
    rt__conn_arm_session_expiry(self, c);
    if (c->stored)
        rt_store_session(c->client_id, c->session_expiry, false, false);
    rt_log(RT_LOG_INFO, "client.disconnected", "client=%s session=kept expiry=%us", c->client_id,
           c->session_expiry);
    rt__conn_rule_event(self, c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1,
                        rt__conn_disc_reason_code(c), "offline", NULL);
}

void rt__conn_close(rt_actor_t *self, conn_t *c, uint8_t reason, rt_reason_t exit_reason)
{
    if (c->closing)
        return;
    if (!c->disc_rc && reason)
        c->disc_rc = (uint8_t)(1 + reason);
    if (c->version == MQTT_V5 && reason)
        rt__conn_send_disconnect(c, reason);
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

void rt__conn_arm_keepalive(rt_actor_t *self, conn_t *c)
{
    if (!c->keepalive || c->keepalive_armed)
        return;
    c->keepalive_armed = 1;
    /* Checked at half the keepalive, closed past 1.5x (MQTT 3.1.2.10). The accept's
       connect_timeout timer fires within connect_timeout from now: when that is soon
       enough, it makes the first check, and an idle connection holds one timer, not two. */
    if (c->accept_tick_pending &&
        (uint64_t)c->keepalive * 500 >= (uint64_t)rt_broker->conf.connect_timeout * 1000) {
        c->keepalive_rides_accept_tick = 1;
        return;
    }
    rt_send_after_tag((uint64_t)c->keepalive * 500, rt_self(self), RT_CONN_MSG_KEEPALIVE, NULL);
}

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

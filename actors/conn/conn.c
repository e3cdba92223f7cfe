/*
** The connection actor: one per MQTT client socket, and the client's session.
** It parses whatever bytes arrived in the scheduler's scratch buffer and copies
** only a partial packet into its own buffer, so an idle connection holds none.
** A PUBLISH is routed by the publishing connection itself: it matches the
** shared topic trie and sends each subscriber's actor a DELIVER message that
** carries the message in one shared binary, so a fan-out copies no payload.
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
#include <time.h>
#include <unistd.h>

#include "acl.h"
#include "auth.h"
#include "conn.h"
#include "log.h"
#include "mqtt_codec.h"
#include "rule_engine.h"
#include "session.h"
#include "store.h"
#include "topic_alias.h"
#include "route.h"

enum {
    MSG_KEEPALIVE = RT_MSG_USER, /* tag timer: check the keepalive */
    MSG_RESUME,                /* fd: a new connection's socket; data: its listener (one byte),
                                  then its bytes from CONNECT on */
    MSG_SESSION_EXPIRED,       /* tag timer: an offline session may have run out */
    MSG_WILL_DUE,              /* tag timer: a delayed will may be due */
    MSG_ACK_CHECK,             /* tag timer: acknowledgements waiting too long for the store */
    MSG_RESTORED,              /* first turn of a session loaded from the store */
    MSG_AUTH_REFUSED,          /* tag timer: the held-back negative CONNACK is due */
    MSG_PARSE_MORE,            /* complete packets wait in the partial buffer (budget ran out) */
    MSG_SLOW_CHECK,            /* tag timer: is the client still not reading? */
    MSG_LOGIN_VERDICT,         /* data: rt_auth_verdict_t, the verifier's answer (auth.h) */
    /* From administrators (broker.h), in the broker's block so no other actor can mean them. */
    MSG_QUERY = RT_BROKER_MSG_BASE + 0x10, /* data: query_t; answer RT_MSG_CLIENT_INFO */
    MSG_KICK,                              /* end the connection and the session */
    MSG_ACL_RECHECK,                       /* the ACL changed: drop what it no longer allows */
};

typedef struct {
    rt_pid_t reply_to;
    uint64_t cookie;
    bool with_subs;
} query_t;

#define RT_ACK_WAIT_MAX_MS 5000 /* a durable ack not confirmed by then is sent anyway (logged) */

#define RT_CONN_READS_PER_TURN 16 /* socket reads per turn before yielding */
/*
** Deliveries one socket event may make before the connection yields: a
** publisher with a buffer full of PUBLISHes to thousands of subscribers would
** otherwise queue millions of envelopes in one turn (and keep them as memory),
** before muting or shedding could act.
*/
#define RT_CONN_ROUTE_BUDGET 8192

/* Deliveries made while handling the current socket event (one actor per thread at a time). */
static _Thread_local uint32_t routed_this_event;
#define RT_QOS2_PENDING_MAX 65535 /* inbound QoS 2 packet ids awaiting PUBREL */
/*
** Slow consumers. A client whose socket backs up past the runtime's pressure
** mark first gets backpressure (its publishers are muted), which is lossless
** for a reader that is only behind for a moment (a burst from many
** publishers). If it is still backed up RT_CONN_SLOW_MS later it is a slow
** consumer: it sheds QoS 0 (dropped and counted, at the publishers' end too)
** and stops applying pressure, so it cannot hold everyone else back; its QoS
** 1/2 stay bounded by its receive window and queue. It recovers when its
** socket drains. Until the verdict, at most RT_CONN_MAX_BACKLOG waits unsent:
** enough for a burst from a hundred publishers, and the memory bound per client.
*/
#define RT_CONN_SLOW_MS 1000
#define RT_CONN_MAX_BACKLOG (1u << 20) /* unsent bytes past which QoS 0 is dropped regardless */
#define RT_CONN_SLOW_HIGH_WATER (4u << 20) /* pressure mark while shedding: window traffic only */
#define RT_SHARE_PREFIX "$share/"

/* One of the client's subscriptions, kept for session end, shared-group moves and persistence. */
typedef struct {
    char *filter;
    size_t len;
    rt_trie_opts_t opts;
} sub_entry_t;

/* A connection's topic aliases in both directions (MQTT 5 3.3.2.3.4). */
typedef struct {
    char **in;           /* the client's: alias - 1 -> topic, max_topic_alias of them, or NULL */
    rt_alias_out_t *out; /* ours: NULL when the client's Topic Alias Maximum allows none */
} conn_aliases_t;

typedef struct conn_s conn_t;
struct conn_s {
    rt_sock_t *sock;       /* NULL while an offline session waits for its client */
    uint8_t *partial;      /* bytes of an incomplete packet; NULL when none */
    char *client_id;
    char *username;        /* from CONNECT, for the ACL; NULL when anonymous */
    char *peer;            /* "ip:port" for rules, made on first use (publishers pay, not idlers) */
    sub_entry_t *subs;
    rt_session_t *sess;    /* inflight and queued messages; NULL until the first one */
    rt_bin_t *will;        /* the will as a canonical PUBLISH, or NULL */
    conn_aliases_t *aliases; /* topic aliases (MQTT 5): made at CONNECT if the client allows
                                some, else on its first alias; NULL for none */
    uint16_t *qos2_ids;    /* inbound QoS 2 ids between PUBREC and PUBREL (session state) */
    uint64_t last_rx_ms;
    /* One word for two times that never both matter: the session's end exists only offline,
       the CONNECT's time only while connected (this struct is an idle connection's memory). */
    union {
        uint64_t expire_at_ms;    /* offline: when the session ends (monotonic ms) */
        uint64_t connected_at_ms; /* connected: when its CONNECT was accepted (unix ms) */
    };
    uint64_t will_at_ms;   /* offline with a delayed will: when it is published */
    uint32_t partial_len, partial_cap; /* a packet is at most max_packet_size */
    uint32_t nsubs, capsubs;
    uint32_t nqos2, capqos2;
    uint32_t session_expiry; /* seconds the session outlives its connection; 0: ends with it */
    uint32_t will_delay;   /* seconds: min(will delay, session expiry), MQTT 5 3.1.3.2.2 */
    uint32_t peer_max_packet; /* the client's Maximum Packet Size (MQTT 5), 0: none */
    uint32_t dropped;      /* messages not delivered: too large for the client, or queue full */
    uint32_t max_packet;   /* max_packet_size when the socket came: what CONNACK tells, kept
                              for the connection's life though the limit may change */
    uint16_t keepalive;    /* seconds, 0 = none */
    uint16_t next_packet_id;
    uint16_t recv_max;     /* the client's Receive Maximum (MQTT 5), 65535 when absent */
    union {
        uint16_t rx_max;   /* connected (MQTT 5): the Receive Maximum its CONNACK told */
        uint8_t refusal;   /* CONNACK code held back while a failed login waits out its delay */
    };
    uint8_t version;       /* 0 until CONNECT */
    uint8_t disc_rc;       /* 1 + the reason code the connection ended with (DISCONNECT from
                              either side, or the server's reason to close); 0: none yet */
    /* Flags as bits: this struct is most of an idle connection's memory. */
    uint8_t closing : 1;   /* the connection is ending: read and deliver nothing more on it */
    uint8_t resuming : 1;  /* the CONNECT being handled continues this actor's session */
    uint8_t connected : 1; /* counted in stats.connections */
    uint8_t keepalive_armed : 1; /* a keepalive timer is pending (one chain per actor) */
    uint8_t discard_will : 1; /* a normal DISCONNECT came (3.1.2.5) */
    uint8_t stored : 1;    /* the store has (or had) this session: its end must be written */
    uint8_t shedding : 1;  /* its client stopped reading: publishers drop QoS 0 for it (rt_shed) */
    uint8_t parse_pending : 1; /* MSG_PARSE_MORE is queued; socket reading is paused meanwhile */
    uint8_t slow_check : 1; /* MSG_SLOW_CHECK is pending */
    uint8_t clean_start : 1; /* of the last CONNECT (for administrators) */
    uint8_t verifying : 1;   /* the verifier is deciding the CONNECT at the front of partial */
    uint8_t listener : 4;  /* the socket's listener (conf.listeners index, < 16) */
};

/* Most of an idle connection's memory: with the actor header it must stay in a 384-byte slab. */
_Static_assert(sizeof(conn_t) <= 160, "conn_t outgrew its slab class");

#define SENT_DISCARDED 1 /* send_publish: over the client's maximum packet size, dropped */

static void count_dropped(conn_t *c, rt_bin_t *bin, const char *why);

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define RT_PEER_TEXT_MAX (INET6_ADDRSTRLEN + 8) /* "ip:port" */

/* "ip:port" of the socket's peer into buf ("?:0" if unknown). */
static void format_peer(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
            port = ntohs(a->sin6_port);
        } else if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
            port = ntohs(a->sin_port);
        }
    }
    snprintf(buf, len, "%s:%d", host, port);
}

/* The client's address as rules see it for messages; kept once a client publishes. */
static const char *peer_text(conn_t *c)
{
    if (c->peer || !c->sock)
        return c->peer;
    char buf[RT_PEER_TEXT_MAX];
    format_peer(rt_sock_fd(c->sock), buf, sizeof(buf));
    c->peer = strdup(buf);
    return c->peer;
}

static rt_rule_origin_t origin_of(conn_t *c)
{
    return (rt_rule_origin_t){.clientid = c->client_id ? c->client_id : "",
                              .username = c->username,
                              .peer = peer_text(c),
                              .ts_ms = wall_ms()};
}


/* A broker event for rules: the fields that do not apply stay -1 / NULL. */
static void rule_event(conn_t *c, rt_rule_event_kind_t kind, const char *topic, int qos,
                       int reason_code, const char *reason, rt_bin_t *canonical)
{
    /* Most events have no rule: then no origin is built (the peer text would cost every
       connection its bytes, and every delivery a look at them). */
    if (!rt_rules_wants_event(kind))
        return;
    rt_rule_origin_t o = origin_of(c);
    rt_rule_event_t e = {.kind = kind, .topic = topic, .qos = qos, .reason_code = reason_code,
                         .reason = reason, .proto_ver = -1, .keepalive = -1, .clean_start = -1,
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

/* session.subscribed / unsubscribed: rules get the filter as a C string. */
static void filter_event(conn_t *c, rt_rule_event_kind_t kind, const uint8_t *f, size_t len,
                         int qos)
{
    char small[256];
    char *copy = len < sizeof(small) ? small : malloc(len + 1);
    if (!copy)
        return;
    memcpy(copy, f, len);
    copy[len] = 0;
    rule_event(c, kind, copy, qos, -1, NULL, NULL);
    if (copy != small)
        free(copy);
}

/* Encodes pk and queues it on the socket (sent at the end of the turn). */
static int send_packet(conn_t *c, mqtt_packet_t *pk)
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
        rc = rt_sock_write(c->sock, buf, len);
    if (rc == 0) {
        rt__metric_add(RT_METRIC_BYTES_OUT, len);
        rt__metric_add(RT_METRIC_PKT_OUT + pk->type, 1);
    }
    if (buf != stackbuf)
        free(buf);
    return rc;
}

/*
** The topic alias to send topic with (3.3.2.3.4), 0 for none: one the client already has, or
** a fresh one (*fresh) while its Topic Alias Maximum leaves room, made known to the client by
** this send. An alias costs three bytes (identifier and value), so shorter topics go as they are.
*/
#define RT_ALIAS_PROPERTY_BYTES 3

static uint16_t out_alias(conn_t *c, mqtt_str_t topic, bool *fresh)
{
    *fresh = false;
    if (!c->aliases || !c->aliases->out || topic.len <= RT_ALIAS_PROPERTY_BYTES)
        return 0;
    return rt_alias_out_lookup(c->aliases->out, topic.p, topic.len, fresh);
}

/* The connection's alias tables, made on first use; NULL when out of memory. */
static conn_aliases_t *aliases(conn_t *c)
{
    if (!c->aliases)
        c->aliases = calloc(1, sizeof(*c->aliases));
    return c->aliases;
}

/*
** Sends one message from its canonical form, re-encoded for this client: its
** QoS, packet id and DUP flag, the remaining message expiry (3.3.2.3.3) and
** the subscription identifiers. Returns 0, or an error if it was not written;
** a message over the client's Maximum Packet Size is discarded and counted
** (3.1.2.11.4) and reported as SENT_DISCARDED, so it is neither retried nor
** kept inflight.
*/
static int send_publish(conn_t *c, rt_bin_t *bin, uint8_t qos, uint8_t retain_flag,
                        uint16_t packet_id, uint8_t dup, uint64_t expire_at_ms,
                        const uint32_t *sub_ids, uint32_t n_sub_ids)
{
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return RT_EINVAL;
    pk.publish.qos = qos;
    pk.publish.retain = retain_flag;
    pk.publish.dup = dup;
    pk.packet_id = qos ? packet_id : 0;
    rt_message_t msg;
    rt_message_view(bin, &msg);
    if (expire_at_ms) {
        uint64_t now = now_ms();
        uint64_t left = expire_at_ms > now ? expire_at_ms - now : 0;
        pk.props.message_expiry = (uint32_t)((left + 999) / 1000);
        pk.props.present |= MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY);
    } else if (msg.has_expiry) {
        pk.props.message_expiry = msg.expiry;
        pk.props.present |= MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY);
    }
    if (c->version == MQTT_V5 && n_sub_ids) {
        pk.props.sub_ids = sub_ids;
        pk.props.n_sub_ids = (uint16_t)n_sub_ids;
    }
    mqtt_str_t topic = pk.publish.topic;
    bool fresh_alias = false;
    uint16_t alias = out_alias(c, topic, &fresh_alias);
    if (alias) {
        pk.props.present |= MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS);
        pk.props.topic_alias = alias;
        if (!fresh_alias)
            pk.publish.topic = (mqtt_str_t){NULL, 0}; /* the client knows it by its alias */
    }
    int rc = send_packet(c, &pk);
    if (rc == 0 && fresh_alias)
        rt_alias_out_commit(c->aliases->out, alias, topic.p, topic.len); /* unused if it fails */
    if (rc == MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE)) {
        count_dropped(c, bin, "too_large");
        return SENT_DISCARDED;
    }
    if (rc == 0) {
        rt__metric_add(RT_METRIC_MSGS_OUT, 1);
        rule_event(c, RT_RULE_EV_MESSAGE_DELIVERED, NULL, qos, -1, NULL, bin);
    }
    return rc;
}

static const char *reason_text(uint8_t reason)
{
    switch (reason) {
    case MQTT_RC_MALFORMED: return "malformed packet";
    case MQTT_RC_PROTOCOL_ERROR: return "protocol error";
    case MQTT_RC_KEEPALIVE_TIMEOUT: return "keep alive timeout";
    case MQTT_RC_SESSION_TAKEN_OVER: return "session taken over";
    case MQTT_RC_SERVER_SHUTTING_DOWN: return "server shutting down";
    case MQTT_RC_PACKET_TOO_LARGE: return "packet too large";
    case MQTT_RC_RECEIVE_MAX_EXCEEDED: return "receive maximum exceeded";
    case MQTT_RC_BAD_AUTH_METHOD: return "bad authentication method";
    case MQTT_RC_ADMIN_ACTION: return "administrative action";
    default: return "disconnected by the server";
    }
}

/* A v5 DISCONNECT with a reason string (which also lets clients that read the reason only
   when properties follow, such as paho-mqtt 1.6, see it). */
static void send_disconnect(conn_t *c, uint8_t reason)
{
    const char *text = reason_text(reason);
    mqtt_packet_t pk = {.type = MQTT_DISCONNECT, .reason = reason};
    pk.props.present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
    pk.props.reason_string = (mqtt_str_t){(const uint8_t *)text, (uint32_t)strlen(text)};
    send_packet(c, &pk);
}


/* The client's receive window for QoS 1 and 2 (MQTT 5 receive maximum, 4.9). */
static uint32_t send_window(const conn_t *c)
{
    uint32_t max = (uint32_t)RT_LIVE(max_inflight);
    uint32_t w = c->recv_max < max ? c->recv_max : max;
    return w ? w : 1;
}

/*
** Whether the receive window is full. Beyond its count, the window holds at most
** max_queued_bytes (one message always fits): a client that stops acknowledging
** pins no more in flight than in its queue, whatever max_inflight allows.
*/
static bool window_full(const conn_t *c)
{
    const rt_qlist_t *f = &c->sess->inflight;
    return f->n >= send_window(c) || (f->n && f->bytes >= (uint64_t)RT_LIVE(max_queued_bytes));
}

static rt_session_t *session(conn_t *c)
{
    if (!c->sess)
        c->sess = calloc(1, sizeof(*c->sess));
    return c->sess;
}

/* A session the store keeps: it outlives its connection and persistence is on. */
static bool durable(const conn_t *c)
{
    return c->session_expiry && c->client_id && rt_store_enabled();
}

static void answer_store_ack(rt_pid_t pid, uint64_t token)
{
    if (!pid)
        return;
    rt_store_committed_t done = {.token = token};
    rt_send(pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
}

/* Saves a message that joined a persistent session; the publisher's ack waits for it. */
static void store_msg(conn_t *c, rt_qmsg_t *m, rt_pid_t ack_pid, uint64_t token)
{
    m->seq = ++c->sess->next_seq;
    rt_stored_msg_t st = {.seq = m->seq, .bin = m->bin, .expire_at_ms = m->expire_at_ms,
                          .qos = m->qos, .retain = m->retain, .state = m->state,
                          .shared = m->shared, .packet_id = m->packet_id,
                          .n_sub_ids = m->n_sub_ids};
    memcpy(st.sub_ids, m->sub_ids, m->n_sub_ids * sizeof(uint32_t));
    rt_store_msg_add(c->client_id, &st, ack_pid, token);
}

/* Every session message ends here: its stored row (if any) goes with it. */
static void release_msg(conn_t *c, rt_qmsg_t *m)
{
    if (m->seq && c->client_id)
        rt_store_msg_del(c->client_id, m->seq);
    rt_qmsg_free(m);
}

/*
** Ids are handed out in sequence and the inflight list keeps sending order, so
** its ids run from its head's up to the last one handed out: the next id can
** only be taken if it wrapped around to the head. Checking that instead of
** scanning the list keeps a send O(1) with a window of a thousand. Once an id
** wraps to the head (the oldest message outlived 65535 sends), the ids that
** follow it in the ring may be taken too: the list is scanned until it empties.
*/
static bool packet_id_taken(rt_session_t *s, uint16_t id)
{
    if (!s || !s->inflight.head)
        return false;
    if (!s->ids_unordered && id != s->inflight.head->packet_id)
        return false;
    s->ids_unordered = 1;
    return rt_qlist_find_id(&s->inflight, id) != NULL;
}

static uint16_t next_packet_id(conn_t *c)
{
    if (c->sess && !c->sess->inflight.head)
        c->sess->ids_unordered = 0;
    do {
        if (++c->next_packet_id == 0)
            c->next_packet_id = 1;
    } while (packet_id_taken(c->sess, c->next_packet_id));
    return c->next_packet_id;
}

static void count_dropped(conn_t *c, rt_bin_t *bin, const char *why)
{
    rule_event(c, RT_RULE_EV_MESSAGE_DROPPED, NULL, -1, -1, why, bin);
    if (c->dropped++ == 0)
        rt_log(RT_LOG_WARNING, "client.dropping", "client=%s (slow consumer or full queue)",
               c->client_id ? c->client_id : "-");
    atomic_fetch_add_explicit(&rt_broker->stats.msgs_dropped, 1, memory_order_relaxed);
}

static bool expired(conn_t *c, uint64_t expire_at_ms)
{
    if (!expire_at_ms || now_ms() < expire_at_ms)
        return false;
    if (c->sess)
        c->sess->expired++;
    atomic_fetch_add_explicit(&rt_broker->stats.msgs_expired, 1, memory_order_relaxed);
    return true;
}

/* Whether the client is connected and past CONNECT, so messages can go out now. */
static bool online(const conn_t *c)
{
    return c->sock && c->version && !c->closing;
}

static void watch_backlog(conn_t *c);

/*
** Sends a queued message now. QoS 0 is done once written; QoS 1 and 2 take a
** packet id and wait in the inflight list for their acknowledgement. Takes m.
*/
static void transmit(conn_t *c, rt_qmsg_t *m)
{
    if (m->qos == 0) {
        send_publish(c, m->bin, 0, m->retain, 0, 0, m->expire_at_ms, m->sub_ids, m->n_sub_ids);
        release_msg(c, m);
        return;
    }
    m->packet_id = next_packet_id(c);
    m->state = RT_QMSG_WAIT_ACK;
    int rc = send_publish(c, m->bin, m->qos, m->retain, m->packet_id, 0, m->expire_at_ms,
                          m->sub_ids, m->n_sub_ids);
    if (rc == SENT_DISCARDED) {
        release_msg(c, m);
        return;
    }
    /* QoS 2 must resume with the same packet id after a restart, or the client could take
       a resend for a new message; a QoS 1 resend under a new id is only a duplicate. */
    if (m->seq && m->qos == 2)
        rt_store_msg_state(c->client_id, m->seq, RT_QMSG_WAIT_ACK, m->packet_id);
    rt_qlist_push(&c->sess->inflight, m);
    watch_backlog(c);
}

/* Moves queued messages out while the receive window has room (in order: QoS 0 waits too). */
static void pump(conn_t *c)
{
    rt_session_t *s = c->sess;
    if (!s || !online(c))
        return;
    while (s->queued.head) {
        rt_qmsg_t *m = s->queued.head;
        if (m->qos && window_full(c))
            break;
        rt_qlist_pop(&s->queued);
        if (expired(c, m->expire_at_ms))
            release_msg(c, m);
        else
            transmit(c, m);
    }
}

/* Past the pressure mark: a check in RT_CONN_SLOW_MS says whether it is a slow consumer. */
static void watch_backlog(conn_t *c)
{
    if (c->slow_check || c->shedding || rt_sock_pending(c->sock) <= RT_SOCK_HIGH_WATER)
        return;
    c->slow_check = 1;
    rt_send_after_tag(RT_CONN_SLOW_MS, rt_self(rt_current()), MSG_SLOW_CHECK, NULL);
}

static void on_slow_check(rt_actor_t *self, conn_t *c)
{
    c->slow_check = 0;
    if (!online(c) || c->shedding || rt_sock_pending(c->sock) <= RT_SOCK_HIGH_WATER)
        return;
    /* Publishers drop QoS 0 for it at the source from now on: a mailbox of messages that
       would only be dropped here is memory for nothing. */
    c->shedding = 1;
    rt_shed(self, true);
    rt_sock_set_high_water(c->sock, RT_CONN_SLOW_HIGH_WATER);
    rt_log(RT_LOG_WARNING, "client.slow", "client=%s unsent=%zu: shedding QoS 0 until it reads",
           c->client_id ? c->client_id : "-", rt_sock_pending(c->sock));
}

/*
** Decides a delivery's fate: sent at once (QoS 0, online, nothing queued), dropped, or
** returned as a session message to keep (NULL for the first two).
*/
static rt_qmsg_t *admit(conn_t *c, rt_bin_t *bin, const rt_delivery_t *d, const uint32_t *sub_ids)
{
    bool backlog = c->sess && c->sess->queued.n;
    if (online(c) && !backlog && d->qos == 0) {
        if (c->shedding || rt_sock_pending(c->sock) >= RT_CONN_MAX_BACKLOG)
            count_dropped(c, bin, "slow_consumer");
        else
            send_publish(c, bin, 0, d->retain, 0, 0, d->expire_at_ms, sub_ids, d->n_sub_ids);
        watch_backlog(c);
        return NULL;
    }
    if (!c->sock && d->qos == 0 && !RT_LIVE(queue_qos0)) {
        count_dropped(c, bin, "offline_qos0");
        return NULL;
    }
    rt_qmsg_t *m = session(c) ? rt_qmsg_new(bin, d->qos, d->retain, d->expire_at_ms, d->shared,
                                            sub_ids, d->n_sub_ids)
                              : NULL;
    if (!m)
        count_dropped(c, bin, "no_memory");
    return m;
}

/*
** A message matched by a subscription the ACL granted in part (acl.h): whether this client
** may read its topic. A session whose user is not known yet (restored from the store, or
** between a resuming socket and its CONNECT) takes none while an ACL is in force.
*/
static bool acl_readable(conn_t *c, rt_bin_t *bin)
{
    if (!c->version)
        return !rt_acl_active();
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return false;
    return rt_acl_permit(c->username, c->client_id, (const char *)pk.publish.topic.p,
                         pk.publish.topic.len, RT_ACL_READ) != RT_ACL_DENY;
}

/* Whether m would overflow the session's queue (max_queued_messages / max_queued_bytes). */
static bool queue_full(const conn_t *c, const rt_qmsg_t *m)
{
    const rt_qlist_t *q = &c->sess->queued;
    return q->n >= (uint64_t)RT_LIVE(max_queued_messages) ||
           q->bytes + rt_qmsg_bytes(m) > (uint64_t)RT_LIVE(max_queued_bytes);
}

/*
** A message routed to this session. The common case (online, nothing queued,
** QoS 0) is written at once with no allocation; everything else becomes a
** session message: sent now if the window has room, else queued within the
** session's limits (a full queue drops the newest, counted). Offline QoS 0
** messages are queued only with queue_qos0. A persistent session stores what
** it keeps, and the publisher's acknowledgement waits for that.
*/
static void deliver(conn_t *c, rt_bin_t *bin, const rt_delivery_t *d, const uint32_t *sub_ids)
{
    if (d->acl_check && !acl_readable(c, bin)) {
        answer_store_ack(d->ack_pid, d->ack_token);
        return;
    }
    rt_qmsg_t *m = expired(c, d->expire_at_ms) ? NULL : admit(c, bin, d, sub_ids);
    bool now = m && online(c) && !c->sess->queued.n && !window_full(c);
    if (m && !now && queue_full(c, m)) {
        c->sess->dropped++;
        count_dropped(c, m->bin, "queue_full");
        rt_qmsg_free(m);
        m = NULL;
    }
    if (m && durable(c))
        store_msg(c, m, d->ack_pid, d->ack_token);
    else
        answer_store_ack(d->ack_pid, d->ack_token); /* nothing stored: nothing to wait for */
    if (!m)
        return;
    if (now)
        transmit(c, m);
    else
        rt_qlist_push(&c->sess->queued, m);
}

/* After CONNACK on a resumed session: unacknowledged messages again, in order, then the queue. */
static void retransmit(conn_t *c)
{
    if (!c->sess)
        return;
    for (rt_qmsg_t *m = c->sess->inflight.head; m; m = m->next) {
        if (m->state == RT_QMSG_WAIT_COMP) {
            mqtt_packet_t rel = {.type = MQTT_PUBREL, .packet_id = m->packet_id};
            send_packet(c, &rel);
        } else {
            send_publish(c, m->bin, m->qos, m->retain, m->packet_id, 1, m->expire_at_ms,
                         m->sub_ids, m->n_sub_ids);
        }
    }
    pump(c);
}

static void on_puback(conn_t *c, mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    if (!m || m->state != RT_QMSG_WAIT_ACK || m->qos != 1)
        return; /* unknown ids are ignored: a late ack of a message already settled */
    rule_event(c, RT_RULE_EV_MESSAGE_ACKED, NULL, 1, -1, NULL, m->bin);
    release_msg(c, rt_qlist_take_id(&c->sess->inflight, pk->packet_id));
    pump(c);
}

static void on_pubrec(conn_t *c, mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    bool known = m && m->qos == 2;
    if (known && pk->version == MQTT_V5 && pk->reason >= 0x80) {
        /* The client refused it: the exchange ends here, with no PUBREL (4.3.3). */
        release_msg(c, rt_qlist_take_id(&c->sess->inflight, pk->packet_id));
        pump(c);
        return;
    }
    if (known && m->state == RT_QMSG_WAIT_ACK) {
        /* Delivered: only the packet id is needed from here on. */
        rule_event(c, RT_RULE_EV_MESSAGE_ACKED, NULL, 2, -1, NULL, m->bin);
        rt_qlist_drop_payload(&c->sess->inflight, m);
        m->state = RT_QMSG_WAIT_COMP;
        if (m->seq)
            rt_store_msg_state(c->client_id, m->seq, RT_QMSG_WAIT_COMP, m->packet_id);
    }
    mqtt_packet_t rel = {.type = MQTT_PUBREL, .packet_id = pk->packet_id};
    if (!known && c->version == MQTT_V5)
        rel.reason = MQTT_RC_PACKET_ID_NOT_FOUND;
    send_packet(c, &rel);
}

static void on_pubcomp(conn_t *c, mqtt_packet_t *pk)
{
    rt_qmsg_t *m = c->sess ? rt_qlist_find_id(&c->sess->inflight, pk->packet_id) : NULL;
    if (!m || m->state != RT_QMSG_WAIT_COMP)
        return;
    release_msg(c, rt_qlist_take_id(&c->sess->inflight, pk->packet_id));
    pump(c);
}

static bool is_shared(const char *f, size_t len)
{
    return len > sizeof(RT_SHARE_PREFIX) - 1 && memcmp(f, RT_SHARE_PREFIX, sizeof(RT_SHARE_PREFIX) - 1) == 0;
}

/*
** A message that came through a shared subscription and that this member will
** not acknowledge (it is leaving) goes to another member of its group
** (MQTT 5 4.8.2 lets the server do so). The group is the member's shared
** subscription whose filter matches the topic. Returns whether it moved.
*/
static bool hand_to_group(rt_actor_t *self, conn_t *c, rt_qmsg_t *m)
{
    mqtt_packet_t pk;
    if (!m->bin || mqtt_decode(rt_bin_data(m->bin), rt_bin_len(m->bin), MQTT_V5, &pk) != 0)
        return false;
    const char *topic = (const char *)pk.publish.topic.p;
    for (size_t i = 0; i < c->nsubs; i++) {
        sub_entry_t *s = &c->subs[i];
        if (!is_shared(s->filter, s->len) ||
            !rt_topic_matches(s->filter, s->len, topic, pk.publish.topic.len))
            continue;
        rt_pid_t pid;
        rt_trie_opts_t o;
        if (rt_trie_share_pick(rt_broker->trie, s->filter, s->len, rt_self(self), rt_route_member_alive,
                               NULL, &pid, &o) != 0)
            continue;
        rt_delivery_t d = {.expire_at_ms = m->expire_at_ms,
                       .qos = m->qos < o.qos ? m->qos : o.qos,
                       .retain = o.retain_as_published ? m->retain : 0,
                       .shared = 1,
                       .acl_check = o.acl_check,
                       .n_sub_ids = o.sub_id ? 1 : 0};
        rt_route_send(pid, m->bin, &d, &o.sub_id);
        return true;
    }
    return false;
}

/* Moves every shared-subscription message not yet acknowledged out of list l. */
static void hand_over_shared(rt_actor_t *self, conn_t *c, rt_qlist_t *l)
{
    rt_qlist_t keep = {0};
    rt_qmsg_t *m;
    while ((m = rt_qlist_pop(l)) != NULL) {
        /* After PUBREC the client has the message: it is not handed on. */
        if (m->shared && m->state != RT_QMSG_WAIT_COMP && hand_to_group(self, c, m))
            release_msg(c, m);
        else
            rt_qlist_push(&keep, m);
    }
    *l = keep;
}

/* A member leaving its shared groups: out of the groups, and its pending messages to the others. */
static void leave_shared_groups(rt_actor_t *self, conn_t *c)
{
    bool any = false;
    for (size_t i = 0; i < c->nsubs; i++) {
        if (is_shared(c->subs[i].filter, c->subs[i].len)) {
            rt_trie_unsubscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                                NULL);
            any = true;
        }
    }
    if (any && c->sess) {
        hand_over_shared(self, c, &c->sess->inflight);
        hand_over_shared(self, c, &c->sess->queued);
    }
}

static void rejoin_shared_groups(rt_actor_t *self, conn_t *c)
{
    for (size_t i = 0; i < c->nsubs; i++)
        if (is_shared(c->subs[i].filter, c->subs[i].len))
            rt_trie_subscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                              &c->subs[i].opts, NULL);
}

/* Writes the whole session: it has just become persistent (or was never stored). */
static void persist_all(conn_t *c)
{
    c->stored = 1;
    for (size_t i = 0; i < c->nsubs; i++)
        rt_store_sub(c->client_id, c->subs[i].filter, c->subs[i].len, &c->subs[i].opts);
    if (!c->sess)
        return;
    rt_qlist_t *lists[2] = {&c->sess->inflight, &c->sess->queued};
    for (int l = 0; l < 2; l++)
        for (rt_qmsg_t *m = lists[l]->head; m; m = m->next)
            if (!m->seq && m->bin)
                store_msg(c, m, 0, 0);
}

/* Subscriptions carry whether the session is persistent: publishers ask such ones for a
   durable ack. Re-subscribing updates that in the trie. */
static void resubscribe_all(rt_actor_t *self, conn_t *c)
{
    for (size_t i = 0; i < c->nsubs; i++) {
        c->subs[i].opts.persistent = durable(c);
        rt_trie_subscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                          &c->subs[i].opts, NULL);
    }
}

/* A session begins (it ends in conn_terminate). */
static void count_session(void)
{
    rt_atomic_raise(&rt_broker->stats.sessions_max,
                    atomic_fetch_add(&rt_broker->stats.sessions, 1) + 1);
}

static void count_connected(conn_t *c, bool on)
{
    if (c->connected == on)
        return;
    c->connected = on;
    if (on)
        rt_atomic_raise(&rt_broker->stats.connections_max,
                        atomic_fetch_add(&rt_broker->stats.connections, 1) + 1);
    else
        atomic_fetch_sub(&rt_broker->stats.connections, 1);
}

_Static_assert(RT_CONF_MAX_LISTENERS <= 16, "conn_t.listener is 4 bits");

/* Closes the client's socket (flushing what is buffered, such as a DISCONNECT). */
static void close_socket(conn_t *c)
{
    rt_sock_close(c->sock);
    c->sock = NULL;
    rt__broker_count_socket(c->listener, -1);
}

static void publish_will(rt_actor_t *self, conn_t *c)
{
    if (!c->will)
        return;
    mqtt_packet_t w;
    if (mqtt_decode(rt_bin_data(c->will), rt_bin_len(c->will), MQTT_V5, &w) == 0 &&
        rt_acl_permit(c->username, c->client_id, (const char *)w.publish.topic.p,
                      w.publish.topic.len, RT_ACL_WRITE)) {
        rt_broker_route(rt_self(self), c->will);
        rt_rule_origin_t o = origin_of(c);
        rt_rules_publish(&o, c->will, 0, 0);
    }
    rt_log(RT_LOG_INFO, "client.will", "client=%s", c->client_id ? c->client_id : "-");
    rt_bin_release(c->will);
    c->will = NULL;
}

static void drop_will(conn_t *c)
{
    rt_bin_release(c->will);
    c->will = NULL;
}

/* Frees what belongs to one network connection, not to the session. */
static void reset_connection_state(conn_t *c)
{
    free(c->partial);
    c->partial = NULL;
    c->partial_len = c->partial_cap = 0;
    /* Aliases last as long as the network connection (3.3.2.3.4). */
    if (c->aliases) {
        for (long i = 0; c->aliases->in && i < rt_broker->conf.max_topic_alias; i++)
            free(c->aliases->in[i]);
        free(c->aliases->in);
        rt_alias_out_free(c->aliases->out);
        free(c->aliases);
        c->aliases = NULL;
    }
    if (c->sess)
        c->sess->nacks = 0; /* acks for a connection that is gone: the client resends */
}

/*
** The socket is gone but the session lives on (session expiry > 0): the actor
** stays, holding subscriptions and queueing, until the client resumes or the
** expiry runs out. The will goes now, or after its delay if the client does
** not come back first (MQTT 5 3.1.2.5).
*/
static void go_offline(rt_actor_t *self, conn_t *c)
{
    close_socket(c);
    c->closing = 1;
    reset_connection_state(c);
    count_connected(c, false);
    if (c->discard_will)
        drop_will(c);
    if (c->will && c->will_delay) {
        c->will_at_ms = now_ms() + (uint64_t)c->will_delay * 1000;
        rt_send_after_tag((uint64_t)c->will_delay * 1000, rt_self(self), MSG_WILL_DUE, NULL);
    } else {
        publish_will(self, c);
    }
    leave_shared_groups(self, c);
    c->expire_at_ms = now_ms() + (uint64_t)c->session_expiry * 1000;
    rt_send_after_tag((uint64_t)c->session_expiry * 1000, rt_self(self), MSG_SESSION_EXPIRED, NULL);
    if (c->stored)
        rt_store_session(c->client_id, c->session_expiry, false, false);
    rt_log(RT_LOG_INFO, "client.disconnected", "client=%s session=kept expiry=%us", c->client_id,
           c->session_expiry);
    rule_event(c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1, disc_reason_code(c), "offline", NULL);
}

/*
** Ends the connection: v5 clients are told why (reason 0 means no DISCONNECT).
** A persistent session goes offline; otherwise the actor exits.
*/
static void close_conn(rt_actor_t *self, conn_t *c, uint8_t reason, rt_reason_t exit_reason)
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

static uint8_t error_reason(int err)
{
    return MQTT_IS_REASON_ERR(err) ? MQTT_ERR_REASON(err) : MQTT_RC_PROTOCOL_ERROR;
}

/*
** Counts and logs a packet that ends the connection. The client is named by its id once it
** has one, or by the id its refused CONNECT carried (when that was read as valid UTF-8), and
** always by its address, so even a client that never got as far as an id can be found.
*/
static void log_bad_packet(conn_t *c, mqtt_str_t connect_id, uint8_t reason)
{
    atomic_fetch_add(&rt_broker->stats.bad_packets, 1);
    const char *id = c->client_id;
    int idlen = id ? (int)strlen(id) : 0;
    if (!id && connect_id.len && mqtt_utf8_valid(connect_id.p, connect_id.len)) {
        id = (const char *)connect_id.p;
        idlen = (int)connect_id.len;
    }
    const char *peer = peer_text(c);
    rt_log(RT_LOG_INFO, "client.bad_packet", "client=%.*s peer=%s reason=0x%02x", id ? idlen : 1,
           id ? id : "-", peer ? peer : "-", reason);
}

static void protocol_error(rt_actor_t *self, conn_t *c, int err)
{
    uint8_t reason = error_reason(err);
    log_bad_packet(c, (mqtt_str_t){0}, reason);
    close_conn(self, c, reason, RT_REASON_NORMAL);
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
    uint8_t reason = error_reason(err);
    log_bad_packet(c, pk->connect.client_id, reason);
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
        send_packet(c, &ack);
    close_conn(self, c, 0, RT_REASON_NORMAL);
}

static void arm_keepalive(rt_actor_t *self, conn_t *c)
{
    if (!c->keepalive || c->keepalive_armed)
        return;
    c->keepalive_armed = 1;
    /* Checked at half the keepalive, closed past 1.5x (MQTT 3.1.2.10). */
    rt_send_after_tag((uint64_t)c->keepalive * 500, rt_self(self), MSG_KEEPALIVE, NULL);
}

/* Session Expiry Interval from CONNECT (or DISCONNECT), within max_session_expiry. */
static uint32_t clamp_expiry(uint64_t requested)
{
    uint64_t max = (uint64_t)RT_LIVE(max_session_expiry);
    return (uint32_t)(requested < max ? requested : max);
}

/*
** clean start 0 for a client id another actor holds: that actor keeps the
** session, so this connection hands it the socket and the bytes read from the
** CONNECT on (it parses them as its own), then exits. Returns false (and keeps
** the socket) when the holder is already gone: the session ended, start fresh.
*/
static bool hand_socket_to(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                           size_t len)
{
    if (!rt_alive(holder))
        return false;
    int fd = rt_sock_detach(c->sock);
    c->sock = NULL;
    rt__broker_count_socket(c->listener, -1);
    rt_msg_t *m = rt_msg_new_fd(MSG_RESUME, fd, 1 + len);
    if (!m) {
        close(fd);
        c->closing = 1;
        rt_exit(self, RT_REASON_NORMAL);
        return true;
    }
    m->data[0] = c->listener;
    memcpy(m->data + 1, bytes, len);
    /* If the holder exits before it reads this, freeing the message closes the fd and the
       client reconnects to a fresh session. */
    rt_send_msg(holder, m);
    c->closing = 1;
    rt_exit(self, RT_REASON_NORMAL);
    return true;
}

/*
** The verifier's answer for the CONNECT being parsed again (on_login_verdict):
** set only around that parse, and one actor runs on a thread at a time.
*/
static _Thread_local const rt_auth_verdict_t *verdict_now;

/*
** The password file and allow_anonymous decide. A decision that needs a full
** hash (a user's first login, or any wrong password) goes to the verifier
** (auth.h) instead of costing this scheduler milliseconds: the connection then
** reads nothing (the CONNECT and whatever followed it wait in the partial
** buffer, and version is 0 again) until the answer comes, and the CONNECT is
** parsed again with it. A refused client gets its negative CONNACK only after
** the delay the failed-login table asks for (so guessing costs time per source
** address), and reads nothing meanwhile.
*/
static bool authenticate(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    rt_auth_addr_t addr;
    bool have_addr = rt_auth_addr_from_fd(rt_sock_fd(c->sock), &addr) == 0;
    char *user = pk->connect.has_username
                     ? strndup((const char *)pk->connect.username.p, pk->connect.username.len)
                     : NULL;
    if (pk->connect.has_username && !user)
        return false;
    const uint8_t *pw = pk->connect.has_password ? pk->connect.password.p : NULL;
    uint32_t delay_ms = 0;
    int rc;
    const rt_auth_verdict_t *v = verdict_now;
    verdict_now = NULL;
    if (v) {
        rc = v->result;
        delay_ms = v->delay_ms;
    } else {
        rc = rt_auth_login_quick(have_addr ? &addr : NULL, user, pw, pk->connect.password.len,
                                 &delay_ms);
    }
    if (rc == RT_AUTH_PENDING && rt_auth_login_async(MSG_LOGIN_VERDICT, have_addr ? &addr : NULL,
                                                     user, pw, pk->connect.password.len) == 0) {
        free(user);
        c->verifying = 1;
        c->version = 0;
        rt_sock_pause_reading(c->sock, true);
        return false;
    }
    if (rc == RT_AUTH_PENDING) /* no verifier (it is not running): decide here after all */
        rc = rt_auth_login(have_addr ? &addr : NULL, user, pw, pk->connect.password.len, &delay_ms);
    if (rc == RT_AUTH_OK) {
        c->username = user;
        return true;
    }
    rt_log(RT_LOG_INFO, "client.auth_failed", "user=%s reason=%s delay_ms=%u", user ? user : "-",
           rc == RT_AUTH_BAD_PASSWORD ? "bad_password"
           : rc == RT_AUTH_UNKNOWN_USER ? "unknown_user" : "anonymous_refused",
           delay_ms);
    free(user);
    bool anonymous = rc == RT_AUTH_ANONYMOUS_REFUSED;
    if (c->version == MQTT_V5)
        c->refusal = anonymous ? MQTT_RC_NOT_AUTHORIZED : MQTT_RC_BAD_CREDENTIALS;
    else
        c->refusal = anonymous ? 5 : 4;
    c->closing = 1;
    rt_sock_pause_reading(c->sock, true);
    if (delay_ms)
        rt_send_after_tag(delay_ms, rt_self(self), MSG_AUTH_REFUSED, NULL);
    else
        rt_send(rt_self(self), MSG_AUTH_REFUSED, NULL, 0);
    return false;
}

static void send_refusal(rt_actor_t *self, conn_t *c)
{
    mqtt_packet_t ack = {.type = MQTT_CONNACK, .reason = c->refusal};
    send_packet(c, &ack);
    rt_exit(self, RT_REASON_NORMAL);
}

/* CONNACK properties that tell an MQTT 5 client how this server differs from the defaults. */
#define RT_RESPONSE_INFO_MAX (16 + 65536) /* "rt/response/" and a client id */

static void connack_props(conn_t *c, mqtt_packet_t *pk, mqtt_packet_t *ack, const char *assigned,
                          bool expiry_clamped, char *response)
{
    mqtt_props_t *p = &ack->props;
    if (assigned[0]) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_ASSIGNED_CLIENT_ID);
        p->assigned_client_id = (mqtt_str_t){(const uint8_t *)assigned, (uint32_t)strlen(assigned)};
    }
    if (expiry_clamped) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY);
        p->session_expiry = c->session_expiry;
    }
    if (pk->connect.keepalive != c->keepalive) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_SERVER_KEEPALIVE);
        p->server_keepalive = c->keepalive;
    }
    if (pk->props.request_response_info) {
        /* Request/response (4.10): a topic prefix only this client id is told about. */
        snprintf(response, RT_RESPONSE_INFO_MAX, "rt/response/%s", c->client_id);
        p->present |= MQTT_PROP_BIT(MQTT_PROP_RESPONSE_INFO);
        p->response_info = (mqtt_str_t){(const uint8_t *)response, (uint32_t)strlen(response)};
    }
    p->present |= MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE) |
                  MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS_MAXIMUM);
    if (c->rx_max < 65535) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM);
        p->receive_maximum = c->rx_max;
    }
    p->maximum_packet_size = c->max_packet;
    p->topic_alias_maximum = (uint16_t)rt_broker->conf.max_topic_alias;
}

static int handle_connect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, const uint8_t *bytes,
                          size_t len)
{
    c->version = pk->version;
    mqtt_packet_t ack = {.type = MQTT_CONNACK};
    char assigned[40] = "";
    mqtt_str_t id = pk->connect.client_id;
    bool clean = pk->connect.clean_start;
    if (id.len == 0) {
        bool allowed = RT_LIVE(allow_zero_length_clientid) &&
                       (c->version == MQTT_V5 || (c->version == MQTT_V311 && clean));
        if (!allowed) {
            ack.reason = c->version == MQTT_V5 ? MQTT_RC_CLIENT_ID_INVALID : 2;
            send_packet(c, &ack);
            close_conn(self, c, 0, RT_REASON_NORMAL);
            return 0;
        }
        snprintf(assigned, sizeof(assigned), "rt-%016llx", (unsigned long long)rt_self(self));
    }
    if (c->version == MQTT_V5 && (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD))) {
        /* Enhanced authentication is not configured: refuse the method (4.12). */
        ack.reason = MQTT_RC_BAD_AUTH_METHOD;
        send_packet(c, &ack);
        close_conn(self, c, 0, RT_REASON_NORMAL);
        return 0;
    }
    bool resumed = c->resuming;
    c->resuming = 0;
    /* A resumed session's CONNECT was checked by the connection that handed it over. */
    if (!resumed && !authenticate(self, c, pk))
        return 0;
    if (pk->connect.has_username && !c->username) {
        c->username = strndup((const char *)pk->connect.username.p, pk->connect.username.len);
        if (!c->username)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    }
    rt_pid_t old = 0;
    if (!resumed) {
        char *cid = assigned[0] ? strdup(assigned) : strndup((const char *)id.p, id.len);
        if (!cid)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        if (!clean && !assigned[0]) {
            rt_pid_t holder = rt_broker_lookup_client(cid);
            if (holder && hand_socket_to(self, c, holder, bytes, len)) {
                free(cid);
                return 0;
            }
        }
        c->client_id = cid;
        count_session();
        old = rt_broker_claim_client(c->client_id, rt_self(self));
        if (old)
            rt_exit_signal(old, RT_REASON_TAKEOVER);
    }
    count_connected(c, true);
    c->connected_at_ms = wall_ms();
    c->clean_start = clean;
    uint64_t expiry = 0;
    if (c->version == MQTT_V5)
        expiry = (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY)) ? pk->props.session_expiry : 0;
    else if (!clean)
        expiry = (uint64_t)RT_LIVE(max_session_expiry); /* 3.1.1: until the client cleans it */
    bool was_durable = resumed && durable(c);
    c->session_expiry = clamp_expiry(expiry);
    if (rt_store_enabled() && (durable(c) || c->stored)) {
        rt_store_session(c->client_id, c->session_expiry, true, !resumed);
        if (durable(c) && !was_durable)
            persist_all(c);
    }
    if (durable(c) != was_durable && c->nsubs)
        resubscribe_all(self, c);
    if (pk->connect.will) {
        mqtt_packet_t w = {.type = MQTT_PUBLISH, .version = pk->version};
        w.publish.topic = pk->connect.will_topic;
        w.publish.payload = pk->connect.will_payload;
        w.publish.qos = pk->connect.will_qos;
        w.publish.retain = pk->connect.will_retain;
        w.props = pk->connect.will_props; /* the will's own properties travel with it */
        c->will = rt_message_new(&w, c->client_id, c->username);
        if (!c->will)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        if (c->version == MQTT_V5) {
            uint32_t delay = pk->connect.will_props.will_delay;
            c->will_delay = delay < c->session_expiry ? delay : c->session_expiry;
        }
    }
    c->recv_max = 65535;
    if (c->version == MQTT_V5) {
        if (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE))
            c->peer_max_packet = pk->props.maximum_packet_size;
        if (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM))
            c->recv_max = pk->props.receive_maximum;
        long most = rt_broker->conf.max_topic_alias;
        uint16_t out =
            pk->props.topic_alias_maximum < most ? pk->props.topic_alias_maximum : (uint16_t)most;
        if (out && aliases(c) && !c->aliases->out)
            rt_alias_out_new(out, &c->aliases->out); /* none if it fails: topics go in full */
        c->rx_max = (uint16_t)RT_LIVE(max_inflight);
    }
    c->keepalive = pk->connect.keepalive;
    long max_keepalive = RT_LIVE(max_keepalive);
    if (c->version == MQTT_V5 && c->keepalive > max_keepalive)
        c->keepalive = (uint16_t)max_keepalive;
    /* A session is present only if clean start was 0 and one was kept (3.2.2.1.1). */
    ack.connack.session_present = resumed && !clean;
    char *response = NULL;
    if (c->version == MQTT_V5) {
        if (pk->props.request_response_info && !(response = malloc(RT_RESPONSE_INFO_MAX)))
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        connack_props(c, pk, &ack, assigned, c->session_expiry < expiry, response);
    }
    send_packet(c, &ack);
    free(response);
    atomic_fetch_add_explicit(&rt_broker->stats.connects, 1, memory_order_relaxed);
    if (rt_rules_wants_event(RT_RULE_EV_CLIENT_CONNECTED)) {
        rt_rule_origin_t o = origin_of(c);
        rt_rule_event_t ev = {.kind = RT_RULE_EV_CLIENT_CONNECTED, .qos = -1, .reason_code = -1,
                              .proto_ver = c->version, .keepalive = c->keepalive,
                              .clean_start = clean};
        rt_rules_event(&o, &ev);
    }
    rt_log(RT_LOG_INFO, "client.connected", "client=%s version=%u keepalive=%u%s%s", c->client_id,
           c->version, c->keepalive, old ? " takeover=1" : "", resumed ? " resumed=1" : "");
    arm_keepalive(self, c);
    if (resumed)
        retransmit(c);
    return 0;
}

/* MQTT 5 topic aliases (3.3.2.3.4): the alias maps to the last topic sent with it. */
static int resolve_alias(conn_t *c, mqtt_packet_t *pk)
{
    mqtt_str_t *topic = &pk->publish.topic;
    if (!(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
        return topic->len ? 0 : MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
    uint16_t alias = pk->props.topic_alias;
    if (alias == 0 || alias > rt_broker->conf.max_topic_alias)
        return MQTT_ERR(MQTT_RC_TOPIC_ALIAS_INVALID);
    conn_aliases_t *a = aliases(c);
    if (a && !a->in)
        a->in = calloc((size_t)rt_broker->conf.max_topic_alias, sizeof(char *));
    if (!a || !a->in)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    char **slot = &a->in[alias - 1];
    if (topic->len) {
        char *copy = strndup((const char *)topic->p, topic->len);
        if (!copy)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        free(*slot);
        *slot = copy;
        return 0;
    }
    if (!*slot)
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* an alias never set */
    *topic = (mqtt_str_t){(const uint8_t *)*slot, (uint32_t)strlen(*slot)};
    return 0;
}

static int qos2_find(const conn_t *c, uint16_t id)
{
    for (size_t i = 0; i < c->nqos2; i++)
        if (c->qos2_ids[i] == id)
            return (int)i;
    return -1;
}

/* Sends the acknowledgements at the head of the line whose commits have all come. */
static void flush_acks(conn_t *c)
{
    rt_session_t *s = c->sess;
    uint32_t i = 0;
    for (; i < s->nacks && s->acks[i].remaining == 0; i++) {
        mqtt_packet_t ack = {.type = s->acks[i].type, .packet_id = s->acks[i].packet_id,
                             .reason = s->acks[i].reason};
        send_packet(c, &ack);
    }
    if (i) {
        memmove(s->acks, s->acks + i, (s->nacks - i) * sizeof(*s->acks));
        s->nacks -= i;
    }
}

/*
** PUBACK or PUBREC for an incoming PUBLISH, once `waits` store commits have
** come; behind any earlier one still waiting, so acks keep their order (4.6).
*/
static void acknowledge(rt_actor_t *self, conn_t *c, uint8_t type, uint16_t packet_id,
                        uint8_t reason, uint64_t token, uint32_t waits)
{
    rt_session_t *s = c->sess;
    mqtt_packet_t ack = {.type = type, .packet_id = packet_id, .reason = reason};
    if (!s || (waits == 0 && s->nacks == 0)) {
        send_packet(c, &ack);
        return;
    }
    if (s->nacks == s->capacks) {
        uint32_t cap = s->capacks ? s->capacks * 2 : 8;
        rt_pending_ack_t *n = realloc(s->acks, cap * sizeof(*n));
        if (!n) {
            send_packet(c, &ack); /* out of memory: early rather than never */
            return;
        }
        s->acks = n;
        s->capacks = cap;
    }
    s->acks[s->nacks++] = (rt_pending_ack_t){.token = token, .since_ms = now_ms(),
                                             .remaining = waits, .packet_id = packet_id,
                                             .type = type, .reason = reason};
    flush_acks(c);
    if (s->nacks && !s->ack_timer) {
        s->ack_timer = 1;
        rt_send_after_tag(RT_ACK_WAIT_MAX_MS, rt_self(self), MSG_ACK_CHECK, NULL);
    }
}

/*
** One of the commits an acknowledgement waits for came (the store's, or the
** rule engine's for a durable rule). A failed one turns a v5 ack negative:
** quota exceeded when a sink's byte limit dropped a row, unspecified otherwise.
*/
static void on_commit(conn_t *c, uint64_t token, int32_t status)
{
    if (!c->sess)
        return;
    for (uint32_t i = 0; i < c->sess->nacks; i++) {
        rt_pending_ack_t *a = &c->sess->acks[i];
        if (a->token != token)
            continue;
        if (a->remaining)
            a->remaining--;
        if (status < 0 && c->version == MQTT_V5)
            a->reason = status == RT_ELIMIT ? MQTT_RC_QUOTA_EXCEEDED : MQTT_RC_UNSPECIFIED;
        break;
    }
    flush_acks(c);
}

/*
** A copy whose subscriber exited before storing it is never confirmed: past
** RT_ACK_WAIT_MAX_MS the acknowledgement goes anyway, logged, rather than
** stalling the publisher for good.
*/
static void on_ack_check(rt_actor_t *self, conn_t *c)
{
    rt_session_t *s = c->sess;
    if (!s)
        return;
    s->ack_timer = 0;
    uint64_t now = now_ms();
    for (uint32_t i = 0; i < s->nacks; i++) {
        if (s->acks[i].remaining && now - s->acks[i].since_ms >= RT_ACK_WAIT_MAX_MS) {
            rt_log(RT_LOG_WARNING, "store.ack_timeout", "client=%s packet_id=%u",
                   c->client_id ? c->client_id : "-", s->acks[i].packet_id);
            s->acks[i].remaining = 0;
        }
    }
    flush_acks(c);
    if (s->nacks) {
        s->ack_timer = 1;
        rt_send_after_tag(RT_ACK_WAIT_MAX_MS, rt_self(self), MSG_ACK_CHECK, NULL);
    }
}

/* max_topic_length and max_topic_levels (0: no limit), for topic names and filters alike. */
static bool topic_within_limits(const uint8_t *t, size_t len)
{
    long max_len = RT_LIVE(max_topic_length);
    if (max_len && len > (size_t)max_len)
        return false;
    long levels = 1, max_levels = RT_LIVE(max_topic_levels);
    if (!max_levels)
        return true;
    for (const uint8_t *p = t; (p = memchr(p, '/', len - (size_t)(p - t))) != NULL; p++)
        if (++levels > max_levels)
            return false;
    return true;
}

/* A PUBLISH the broker will not route: v5 learns why (reason), v3 gets its ack and no more. */
static void refuse_publish(conn_t *c, mqtt_packet_t *pk, uint8_t reason)
{
    if (!pk->publish.qos)
        return;
    mqtt_packet_t ack = {.type = pk->publish.qos == 1 ? MQTT_PUBACK : MQTT_PUBREC,
                         .packet_id = pk->packet_id,
                         .reason = c->version == MQTT_V5 ? reason : 0};
    send_packet(c, &ack);
}

/*
** The client's QoS 1 and 2 PUBLISHes not yet acknowledged to it, which its Receive Maximum
** counts (4.9): PUBACKs waiting for the store, and QoS 2 ids until PUBREL (PUBCOMP goes at
** once then). A PUBREC waiting for the store is for an id among the QoS 2 ones.
*/
static uint32_t inbound_unacked(const conn_t *c)
{
    uint32_t n = c->nqos2;
    for (uint32_t i = 0; c->sess && i < c->sess->nacks; i++)
        n += c->sess->acks[i].type == MQTT_PUBACK;
    return n;
}

/* A QoS 1 or 2 PUBLISH past the Receive Maximum rtd gave the client (3.3.4, 4.9). */
static bool over_receive_maximum(const conn_t *c, const mqtt_packet_t *pk)
{
    if (c->version != MQTT_V5 || !pk->publish.qos)
        return false;
    if (pk->publish.qos == 2 && qos2_find(c, pk->packet_id) >= 0)
        return false; /* a resend of one already counted */
    return inbound_unacked(c) >= c->rx_max;
}

static int handle_publish(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    rt__metric_add(RT_METRIC_MSGS_IN, 1);
    if (over_receive_maximum(c, pk))
        return MQTT_ERR(MQTT_RC_RECEIVE_MAX_EXCEEDED);
    if (c->version == MQTT_V5) {
        if (pk->props.sub_id_count)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* only servers send them (3.3.4) */
        int rc = resolve_alias(c, pk);
        if (rc)
            return rc;
    }
    uint8_t qos = pk->publish.qos;
    if (!topic_within_limits(pk->publish.topic.p, pk->publish.topic.len)) {
        atomic_fetch_add(&rt_broker->stats.topic_limit_hits, 1);
        refuse_publish(c, pk, MQTT_RC_TOPIC_NAME_INVALID);
        return 0;
    }
    /* $SYS belongs to the broker (as in Mosquitto): a client cannot fake its values. */
    bool sys = pk->publish.topic.len >= 4 && memcmp(pk->publish.topic.p, "$SYS", 4) == 0;
    if (sys || !rt_acl_permit(c->username, c->client_id, (const char *)pk->publish.topic.p,
                              pk->publish.topic.len, RT_ACL_WRITE)) {
        refuse_publish(c, pk, MQTT_RC_NOT_AUTHORIZED);
        return 0;
    }
    bool forward = true;
    if (qos == 2) {
        /* Exactly once: delivered on the first PUBLISH, a resend before PUBREL is not. */
        if (qos2_find(c, pk->packet_id) >= 0) {
            forward = false;
        } else {
            if (c->nqos2 >= RT_QOS2_PENDING_MAX)
                return MQTT_ERR(MQTT_RC_RECEIVE_MAX_EXCEEDED);
            if (c->nqos2 == c->capqos2) {
                size_t cap = c->capqos2 ? c->capqos2 * 2 : 8;
                uint16_t *n = realloc(c->qos2_ids, cap * sizeof(*n));
                if (!n)
                    return MQTT_ERR(MQTT_RC_UNSPECIFIED);
                c->qos2_ids = n;
                c->capqos2 = cap;
            }
            c->qos2_ids[c->nqos2++] = pk->packet_id;
        }
    }
    uint8_t reason = MQTT_RC_SUCCESS;
    /* With persistence, the acknowledgement waits for what the message left on disk. */
    bool track = qos && session(c);
    uint64_t token = track ? ++c->sess->next_token : 0;
    uint32_t waits = 0;
    if (forward) {
        rt_bin_t *bin = rt_message_new(pk, c->client_id, c->username);
        if (!bin)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        int n = rt_route(rt_self(self), bin, track ? rt_self(self) : 0, token, &waits);
        if (n == 0 && c->version == MQTT_V5)
            reason = MQTT_RC_NO_MATCHING_SUBSCRIBERS; /* still a success (3.4.2.1) */
        routed_this_event += n > 0 ? (uint32_t)n : 1;
        rt_rule_origin_t o = origin_of(c);
        if (rt_rules_publish(&o, bin, track ? rt_self(self) : 0, token) == 2)
            waits++; /* a durable rule: the ack waits for its rows to be committed */
        rt_bin_release(bin);
        if (qos == 2 && durable(c)) {
            /* After a restart a resend of this id must still be recognised (exactly once). */
            rt_store_qos2_in(c->client_id, pk->packet_id, true, rt_self(self), token);
            waits++;
        }
    }
    if (qos)
        acknowledge(self, c, qos == 1 ? MQTT_PUBACK : MQTT_PUBREC, pk->packet_id, reason, token,
                    waits);
    return 0;
}

/* The client's subscription with this filter, or -1. */
static long find_sub(const conn_t *c, const uint8_t *f, size_t len)
{
    for (size_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].len == len && memcmp(c->subs[i].filter, f, len) == 0)
            return (long)i;
    return -1;
}

static int remember_sub(conn_t *c, const uint8_t *f, size_t len, const rt_trie_opts_t *o)
{
    long at = find_sub(c, f, len);
    if (at >= 0) {
        c->subs[at].opts = *o;
        return 0;
    }
    if (c->nsubs == c->capsubs) {
        size_t cap = c->capsubs ? c->capsubs * 2 : 2;
        sub_entry_t *ns = realloc(c->subs, cap * sizeof(*ns));
        if (!ns)
            return RT_ENOMEM;
        c->subs = ns;
        c->capsubs = cap;
    }
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return RT_ENOMEM;
    memcpy(copy, f, len);
    c->subs[c->nsubs++] = (sub_entry_t){.filter = copy, .len = len, .opts = *o};
    return 0;
}

static void forget_sub(conn_t *c, const uint8_t *f, size_t len)
{
    long at = find_sub(c, f, len);
    if (at < 0)
        return;
    free(c->subs[at].filter);
    c->subs[at] = c->subs[--c->nsubs];
}

typedef struct {
    conn_t *c;
    uint8_t qos;       /* granted */
    uint8_t acl_check; /* the subscription's (acl.h) */
    uint32_t sub_id;
} retained_send_t;

/* Runs under the retained store's read lock: queue for sending at once, call nothing back. */
static void send_retained(void *arg, const char *topic, size_t len, void *msg)
{
    retained_send_t *rs = arg;
    rt_retained_msg_t *r = msg;
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(r->bin), rt_bin_len(r->bin), MQTT_V5, &pk) != 0)
        return;
    rt_delivery_t d = {.expire_at_ms = r->expire_at_ms,
                   .qos = pk.publish.qos < rs->qos ? pk.publish.qos : rs->qos,
                   .retain = 1,
                   .acl_check = rs->acl_check,
                   .n_sub_ids = rs->sub_id ? 1 : 0};
    deliver(rs->c, r->bin, &d, &rs->sub_id);
}

/*
** Why a filter may not be subscribed (a v5 reason code), or 0 if it may; *acl_check is set
** when the ACL grants it only in part (each delivery is then checked, acl.h).
*/
static uint8_t subscribe_refusal(conn_t *c, const mqtt_sub_t *s, bool *acl_check)
{
    if (!topic_within_limits(s->filter.p, s->filter.len)) {
        atomic_fetch_add(&rt_broker->stats.topic_limit_hits, 1);
        return MQTT_RC_TOPIC_FILTER_INVALID;
    }
    long max = RT_LIVE(max_subscriptions);
    if (max && c->nsubs >= (size_t)max) {
        if (find_sub(c, s->filter.p, s->filter.len) < 0) { /* changing one is not a new one */
            atomic_fetch_add(&rt_broker->stats.subs_limit_hits, 1);
            return MQTT_RC_QUOTA_EXCEEDED;
        }
    }
    int acl = rt_acl_permit(c->username, c->client_id, (const char *)s->filter.p, s->filter.len,
                            RT_ACL_SUBSCRIBE);
    *acl_check = acl == RT_ACL_FILTERED;
    return acl == RT_ACL_DENY ? MQTT_RC_NOT_AUTHORIZED : 0;
}

/*
** Room for one byte per filter of a (UN)SUBSCRIBE, times `per`: the packet's own count, which
** max_packet_size bounds (a filter takes at least three bytes). Small packets use `small`.
*/
static uint8_t *per_filter_bytes(const mqtt_packet_t *pk, size_t per, uint8_t *small,
                                 size_t small_len)
{
    size_t need = (size_t)pk->sub.count * per;
    return need <= small_len ? small : malloc(need);
}

/* An MQTT 3.1 client's (UN)SUBSCRIBE with fixed-header flags 0000, accepted (mqtt_codec.h). */
static void count_v31_sub_flags(const mqtt_packet_t *pk)
{
    if (pk->version == MQTT_V31 && pk->flags == 0)
        atomic_fetch_add_explicit(&rt_broker->stats.v31_sub_flags, 1, memory_order_relaxed);
}

static int handle_subscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    count_v31_sub_flags(pk);
    uint8_t small[512];
    uint8_t *codes = per_filter_bytes(pk, 2, small, sizeof(small));
    if (!codes)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    /* What each granted filter does after the SUBACK: a byte of THEN_* bits. */
    enum { THEN_RETAINED = 1, THEN_ACL_CHECK = 2 };
    uint8_t *then = codes + pk->sub.count;
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (n < pk->sub.count && mqtt_sub_next(pk, &pos, &s)) {
        uint8_t qos = MQTT_SUB_QOS(s.options);
        uint8_t handling = MQTT_SUB_RETAIN_HANDLING(s.options);
        bool acl_check = false;
        uint8_t refused = subscribe_refusal(c, &s, &acl_check);
        rt_trie_opts_t o = {.qos = qos,
                            .no_local = (s.options & MQTT_SUB_NO_LOCAL) != 0,
                            .retain_as_published = (s.options & MQTT_SUB_RETAIN_AS_PUBLISHED) != 0,
                            .retain_handling = handling,
                            .persistent = durable(c),
                            .acl_check = acl_check,
                            .sub_id = pk->props.sub_id};
        int existed = 0;
        if (refused) {
            then[n] = 0;
            codes[n++] = c->version == MQTT_V5 ? refused : 0x80;
            continue;
        }
        int rc = rt_trie_subscribe(rt_broker->trie, (const char *)s.filter.p, s.filter.len,
                                   rt_self(self), &o, &existed);
        if (rc == 0)
            rc = remember_sub(c, s.filter.p, s.filter.len, &o);
        if (rc == 0 && durable(c))
            rt_store_sub(c->client_id, (const char *)s.filter.p, s.filter.len, &o);
        if (rc == 0)
            filter_event(c, RT_RULE_EV_SESSION_SUBSCRIBED, s.filter.p, s.filter.len, qos);
        /* Retained messages on subscribe: always (0), for a new subscription only (1), never
           (2), and never for a shared subscription (MQTT 5 3.8.3.1, 4.8.2). */
        bool shared = is_shared((const char *)s.filter.p, s.filter.len);
        bool retained = rc == 0 && !shared && (handling == 0 || (handling == 1 && !existed));
        then[n] = (retained ? THEN_RETAINED : 0) | (acl_check ? THEN_ACL_CHECK : 0);
        codes[n++] = rc == 0 ? qos : c->version == MQTT_V5 ? MQTT_RC_TOPIC_FILTER_INVALID : 0x80;
    }
    mqtt_packet_t ack = {.type = MQTT_SUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    send_packet(c, &ack);
    pos = 0;
    for (size_t i = 0; i < n && mqtt_sub_next(pk, &pos, &s); i++) {
        if (!(then[i] & THEN_RETAINED))
            continue;
        retained_send_t rs = {.c = c,
                              .qos = codes[i],
                              .acl_check = (then[i] & THEN_ACL_CHECK) != 0,
                              .sub_id = pk->props.sub_id};
        rt_retained_match(rt_broker->retained, (const char *)s.filter.p, s.filter.len,
                          send_retained, &rs, NULL);
    }
    if (codes != small)
        free(codes);
    return 0;
}

/*
** Ends one subscription everywhere it is kept: the trie (no more deliveries),
** the store and the client's list; rules hear of it. f may be the list's own
** copy (it is forgotten last). Returns whether the trie had it.
*/
static bool drop_sub(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len)
{
    int existed = 0;
    rt_trie_unsubscribe(rt_broker->trie, (const char *)f, len, rt_self(self), &existed);
    if (c->stored)
        rt_store_unsub(c->client_id, (const char *)f, len);
    if (existed)
        filter_event(c, RT_RULE_EV_SESSION_UNSUBSCRIBED, f, len, -1);
    forget_sub(c, f, len);
    return existed;
}

static int handle_unsubscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    count_v31_sub_flags(pk);
    uint8_t small[256];
    uint8_t *codes = per_filter_bytes(pk, 1, small, sizeof(small));
    if (!codes)
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    size_t n = 0, pos = 0;
    mqtt_sub_t s;
    while (n < pk->sub.count && mqtt_sub_next(pk, &pos, &s)) {
        bool existed = drop_sub(self, c, s.filter.p, s.filter.len);
        codes[n++] = existed ? MQTT_RC_SUCCESS : MQTT_RC_NO_SUBSCRIPTION_EXISTED;
    }
    mqtt_packet_t ack = {.type = MQTT_UNSUBACK, .packet_id = pk->packet_id};
    ack.codes = (mqtt_str_t){codes, (uint32_t)n};
    send_packet(c, &ack);
    if (codes != small)
        free(codes);
    return 0;
}

static int handle_disconnect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    if (c->version == MQTT_V5 && (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY))) {
        /* A session that was to end with its connection cannot be made to outlive it (3.14.2.2.2). */
        if (c->session_expiry == 0 && pk->props.session_expiry != 0)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
        c->session_expiry = clamp_expiry(pk->props.session_expiry);
        if (c->will_delay > c->session_expiry)
            c->will_delay = c->session_expiry;
        if (c->stored)
            rt_store_session(c->client_id, c->session_expiry, true, false);
    }
    /* A normal DISCONNECT discards the will; v5 can ask for it with 0x04. */
    c->discard_will = !(c->version == MQTT_V5 && pk->reason == MQTT_RC_DISCONNECT_WITH_WILL);
    c->disc_rc = (uint8_t)(1 + (c->version == MQTT_V5 ? pk->reason : 0));
    close_conn(self, c, 0, RT_REASON_NORMAL);
    return 0;
}

static int handle_packet(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk)
{
    switch (pk->type) {
    case MQTT_CONNECT:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* a second CONNECT (3.1.0-2) */
    case MQTT_PUBLISH:
        return handle_publish(self, c, pk);
    case MQTT_PUBREL: {
        int i = qos2_find(c, pk->packet_id);
        if (i >= 0) {
            c->qos2_ids[i] = c->qos2_ids[--c->nqos2];
            if (c->stored)
                rt_store_qos2_in(c->client_id, pk->packet_id, false, 0, 0);
        }
        mqtt_packet_t comp = {.type = MQTT_PUBCOMP, .packet_id = pk->packet_id,
                              .reason = i >= 0 ? 0 : MQTT_RC_PACKET_ID_NOT_FOUND};
        if (c->version != MQTT_V5)
            comp.reason = 0;
        send_packet(c, &comp);
        return 0;
    }
    case MQTT_PUBACK:
        on_puback(c, pk);
        return 0;
    case MQTT_PUBREC:
        on_pubrec(c, pk);
        return 0;
    case MQTT_PUBCOMP:
        on_pubcomp(c, pk);
        return 0;
    case MQTT_SUBSCRIBE:
        return handle_subscribe(self, c, pk);
    case MQTT_UNSUBSCRIBE:
        return handle_unsubscribe(self, c, pk);
    case MQTT_PINGREQ: {
        mqtt_packet_t resp = {.type = MQTT_PINGRESP};
        send_packet(c, &resp);
        return 0;
    }
    case MQTT_DISCONNECT:
        return handle_disconnect(self, c, pk);
    case MQTT_AUTH:
        close_conn(self, c, MQTT_RC_BAD_AUTH_METHOD, RT_REASON_NORMAL);
        return 0;
    default:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* server-to-client packets */
    }
}

/*
** Parses every complete packet in buf; returns the bytes consumed, or -1 once
** the connection is closing (after an error, a DISCONNECT or a handover).
*/
static long parse(rt_actor_t *self, conn_t *c, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len && !c->closing && routed_this_event < RT_CONN_ROUTE_BUDGET) {
        /* Anything but CONNECT first is refused at its first byte, before it is complete. */
        if (!c->version && buf[off] != (MQTT_CONNECT << 4)) {
            protocol_error(self, c, MQTT_ERR(MQTT_RC_PROTOCOL_ERROR));
            return -1;
        }
        mqtt_frame_t f;
        int rc = mqtt_frame(buf + off, len - off, c->max_packet, &f);
        if (rc == RT_EAGAIN)
            break;
        if (rc == 0)
            rt__metric_add(RT_METRIC_PKT_IN + (buf[off] >> 4), 1);
        mqtt_packet_t pk;
        if (rc == 0 && (rc = mqtt_decode(buf + off, f.size, c->version, &pk)) != 0 &&
            !c->version) {
            refuse_connect(self, c, &pk, rc);
            return -1;
        }
        if (rc == 0)
            rc = c->version ? handle_packet(self, c, &pk)
                            : handle_connect(self, c, &pk, buf + off, len - off);
        if (rc) {
            protocol_error(self, c, rc == RT_EAGAIN ? MQTT_ERR(MQTT_RC_MALFORMED) : rc);
            return -1;
        }
        if (c->verifying)
            break; /* the CONNECT stays unconsumed: it is parsed again with the verdict */
        off += f.size;
    }
    return c->closing ? -1 : (long)off;
}

static int keep_partial(conn_t *c, const uint8_t *p, size_t n)
{
    if (c->partial_len + n > c->partial_cap) {
        size_t cap = c->partial_cap ? c->partial_cap : 256;
        while (cap < c->partial_len + n)
            cap *= 2;
        uint8_t *nb = realloc(c->partial, cap);
        if (!nb)
            return RT_ENOMEM;
        c->partial = nb;
        c->partial_cap = cap;
    }
    memcpy(c->partial + c->partial_len, p, n);
    c->partial_len += n;
    return 0;
}

static void drop_partial(conn_t *c, size_t used)
{
    if (used >= c->partial_len) {
        free(c->partial);
        c->partial = NULL;
        c->partial_len = c->partial_cap = 0;
        return;
    }
    memmove(c->partial, c->partial + used, c->partial_len - used);
    c->partial_len -= used;
}

/* Parses bytes that arrived (or were handed over); only an incomplete tail is kept. */
static void feed(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t len)
{
    if (c->partial_len) {
        if (keep_partial(c, p, len)) {
            close_conn(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
            return;
        }
        long used = parse(self, c, c->partial, c->partial_len);
        if (used >= 0)
            drop_partial(c, (size_t)used);
        return;
    }
    long used = parse(self, c, p, len);
    if (used >= 0 && (size_t)used < len && keep_partial(c, p + used, len - (size_t)used))
        close_conn(self, c, MQTT_RC_UNSPECIFIED, RT_REASON_NORMAL);
}

/* The route budget ran out: the rest of what was read is parsed in a later turn. */
static void yield_parsing(rt_actor_t *self, conn_t *c)
{
    c->parse_pending = 1;
    rt_sock_pause_reading(c->sock, true);
    rt_send(rt_self(self), MSG_PARSE_MORE, NULL, 0);
}

static void on_readable(rt_actor_t *self, conn_t *c);

static void on_parse_more(rt_actor_t *self, conn_t *c)
{
    c->parse_pending = 0;
    if (!c->sock || c->closing)
        return;
    rt_sock_pause_reading(c->sock, false);
    routed_this_event = 0;
    long used = parse(self, c, c->partial, c->partial_len);
    if (used < 0)
        return;
    drop_partial(c, (size_t)used);
    if (routed_this_event >= RT_CONN_ROUTE_BUDGET)
        yield_parsing(self, c);
    else
        on_readable(self, c);
}

/*
** The verifier decided this connection's CONNECT: parse it again (authenticate
** takes the verdict), then whatever the client sent after it, then read on.
*/
static void on_login_verdict(rt_actor_t *self, conn_t *c, const rt_auth_verdict_t *v)
{
    if (!c->verifying)
        return;
    c->verifying = 0;
    verdict_now = v;
    on_parse_more(self, c);
    verdict_now = NULL;
}

static void on_readable(rt_actor_t *self, conn_t *c)
{
    routed_this_event = 0;
    if (c->parse_pending)
        return; /* buffered packets go first */
    for (int i = 0; i < RT_CONN_READS_PER_TURN && !c->closing; i++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(c->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            close_conn(self, c, 0, RT_REASON_NORMAL);
            return;
        }
        c->last_rx_ms = now_ms();
        rt__metric_add(RT_METRIC_BYTES_IN, len);
        feed(self, c, data, len);
        if (c->verifying)
            return; /* reading paused until the verdict: what came after CONNECT waits */
        if (!c->closing && routed_this_event >= RT_CONN_ROUTE_BUDGET) {
            yield_parsing(self, c);
            return;
        }
    }
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
        return; /* exiting already: the message's fd is closed with it */
    int fd = rt_msg_take_fd(m);
    if (c->sock) {
        if (c->version == MQTT_V5)
            send_disconnect(c, MQTT_RC_SESSION_TAKEN_OVER);
        if (c->will && !c->will_delay)
            publish_will(self, c);
        close_socket(c);
        reset_connection_state(c);
        rule_event(c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1, MQTT_RC_SESSION_TAKEN_OVER,
                   "takeover", NULL);
        count_connected(c, false);
        rt_log(RT_LOG_INFO, "client.disconnected", "client=%s reason=takeover session=kept",
               c->client_id);
    } else {
        rejoin_shared_groups(self, c);
    }
    drop_will(c); /* back in time: a pending delayed will is cancelled */
    free(c->username); /* the new CONNECT names its own user */
    c->username = NULL;
    free(c->peer); /* and comes from its own address */
    c->peer = NULL;
    if (rt_sock_adopt(self, fd, &c->sock) != 0) {
        rt_log(RT_LOG_ERROR, "client.resume_failed", "client=%s", c->client_id);
        close(fd);
        c->closing = 1;
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    c->listener = m->data[0] & 15;
    rt__broker_count_socket(c->listener, +1);
    c->max_packet = (uint32_t)RT_LIVE(max_packet_size);
    c->version = 0;
    c->closing = 0;
    c->resuming = 1;
    c->discard_will = 0;
    c->disc_rc = 0;
    c->will_delay = 0;
    c->peer_max_packet = 0;
    c->last_rx_ms = now_ms();
    feed(self, c, m->data + 1, m->len - 1);
    if (!c->closing)
        on_readable(self, c);
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    const rt_conn_arg_t *a = arg;
    int rc = rt_sock_adopt(self, a->fd, &c->sock);
    if (rc)
        return rc;
    c->last_rx_ms = now_ms();
    c->listener = a->listener & 15;
    rt__broker_count_socket(c->listener, +1);
    c->max_packet = (uint32_t)RT_LIVE(max_packet_size);
    return 0;
}

static void on_keepalive(rt_actor_t *self, conn_t *c)
{
    c->keepalive_armed = 0;
    if (!online(c) || !c->keepalive)
        return;
    if (now_ms() - c->last_rx_ms > (uint64_t)c->keepalive * 1500) {
        rt_log(RT_LOG_INFO, "client.keepalive_timeout", "client=%s", c->client_id);
        close_conn(self, c, MQTT_RC_KEEPALIVE_TIMEOUT, RT_REASON_NORMAL);
        return;
    }
    arm_keepalive(self, c);
}

/* ---- Administration (broker.h): queries and kicks ---- */

#define SUB_ENTRY_HEAD 8 /* uint32 sub_id, uint16 filter_len, uint8 qos, uint8 flags */
#define SUB_FLAG_NO_LOCAL 1u
#define SUB_FLAG_RAP 2u
#define SUB_RH_SHIFT 2

static size_t sub_entry_size(const sub_entry_t *e)
{
    return SUB_ENTRY_HEAD + e->len + 1;
}

static void copy_text(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void fill_info(rt_actor_t *self, const conn_t *c, rt_client_info_t *ci)
{
    ci->pid = rt_self(self);
    ci->version = c->version;
    ci->connected = c->connected;
    ci->clean_start = c->clean_start;
    ci->keepalive = c->keepalive;
    ci->session_expiry = c->session_expiry;
    if (c->connected) {
        ci->connected_at_ms = c->connected_at_ms;
    } else if (!c->sock && c->client_id) {
        uint64_t now = now_ms();
        ci->expires_in_ms = c->expire_at_ms > now ? c->expire_at_ms - now : 0;
    }
    ci->subscriptions = c->nsubs;
    ci->inflight_window = send_window(c);
    if (c->sess) {
        ci->inflight = c->sess->inflight.n;
        ci->queued = c->sess->queued.n;
        ci->queued_bytes = c->sess->queued.bytes;
    }
    ci->dropped = c->dropped;
    rt_actor_info_t ai;
    if (rt_actor_info(rt_self(self), &ai) == 0)
        ci->mailbox_len = ai.mailbox_len;
    ci->has_username = c->username != NULL;
    size_t idlen = c->client_id ? strlen(c->client_id) : 0;
    ci->client_id_len = (uint16_t)(idlen < UINT16_MAX ? idlen : UINT16_MAX);
    copy_text(ci->client_id, sizeof(ci->client_id), c->client_id);
    copy_text(ci->username, sizeof(ci->username), c->username);
    /* Formatted here, not through peer_text: that would keep the text for the connection's
       lifetime, and one look by an administrator should not cost the client memory. */
    if (c->sock && c->connected)
        format_peer(rt_sock_fd(c->sock), ci->peer, sizeof(ci->peer));
}

/* Answers with the counters and, if asked, the subscriptions (layout in broker.h). */
static void on_query(rt_actor_t *self, conn_t *c, const query_t *q)
{
    size_t nsubs = 0, bytes = 0;
    while (q->with_subs && nsubs < c->nsubs &&
           bytes + sub_entry_size(&c->subs[nsubs]) <= RT_CLIENT_INFO_SUBS_MAX)
        bytes += sub_entry_size(&c->subs[nsubs++]);
    rt_msg_t *m = rt_msg_new(RT_MSG_CLIENT_INFO, sizeof(rt_client_info_t) + bytes);
    if (!m)
        return; /* the asker times out, as if this actor had gone */
    rt_client_info_t *ci = (rt_client_info_t *)(void *)m->data;
    memset(ci, 0, sizeof(*ci));
    ci->cookie = q->cookie;
    fill_info(self, c, ci);
    ci->subs_included = (uint32_t)nsubs;
    uint8_t *p = m->data + sizeof(*ci);
    for (size_t i = 0; i < nsubs; i++) {
        const sub_entry_t *e = &c->subs[i];
        uint16_t flen = (uint16_t)e->len;
        uint8_t flags = (uint8_t)((e->opts.no_local ? SUB_FLAG_NO_LOCAL : 0) |
                                  (e->opts.retain_as_published ? SUB_FLAG_RAP : 0) |
                                  (e->opts.retain_handling << SUB_RH_SHIFT));
        memcpy(p, &e->opts.sub_id, 4);
        memcpy(p + 4, &flen, 2);
        p[6] = e->opts.qos;
        p[7] = flags;
        memcpy(p + SUB_ENTRY_HEAD, e->filter, e->len);
        p[SUB_ENTRY_HEAD + e->len] = 0;
        p += sub_entry_size(e);
    }
    rt_send_msg(q->reply_to, m);
}

/*
** The session ends here whatever its expiry: the exit runs conn_terminate, which
** publishes the will, removes the subscriptions and deletes the stored session,
** as for any session that ends (a non-normal reason keeps close_conn from
** taking the session offline).
*/
static void on_kick(rt_actor_t *self, conn_t *c)
{
    rt_log(RT_LOG_INFO, "client.kicked", "client=%s state=%s", c->client_id ? c->client_id : "-",
           c->connected ? "connected" : c->sock ? "connecting" : "offline");
    if (c->sock && !c->closing) {
        close_conn(self, c, MQTT_RC_ADMIN_ACTION, RT_REASON_KICKED);
        return;
    }
    c->closing = 1;
    rt_exit(self, RT_REASON_KICKED);
}

/*
** The ACL was replaced (a reload, or acl_file set): subscriptions it no longer
** allows end here, as if the client had unsubscribed, without telling the
** client (MQTT has no server-side UNSUBSCRIBE), and the others learn whether
** their deliveries must be checked now (acl.h). Checked once per reload, so a
** subscription the ACL allows whole takes no ACL lookup per delivery. What
** was queued for the session before stays queued. A session restored from the
** store whose client has not come back (version 0) is skipped: which user it
** logged in as is not kept, and its client's next SUBSCRIBE is checked anyway.
*/
static void on_acl_recheck(rt_actor_t *self, conn_t *c)
{
    if (!c->version || !c->client_id)
        return;
    for (size_t i = 0; i < c->nsubs;) {
        sub_entry_t *e = &c->subs[i];
        int acl = rt_acl_permit(c->username, c->client_id, e->filter, e->len, RT_ACL_SUBSCRIBE);
        if (acl == RT_ACL_DENY) {
            rt_log(RT_LOG_INFO, "client.acl_revoked", "client=%s filter=%.*s", c->client_id,
                   (int)e->len, e->filter);
            drop_sub(self, c, (const uint8_t *)e->filter, e->len); /* moves the last entry to i */
            continue;
        }
        bool check = acl == RT_ACL_FILTERED;
        if (e->opts.acl_check != check) {
            e->opts.acl_check = check;
            /* An offline member is out of its shared groups; it rejoins with these options. */
            if (c->sock || !is_shared(e->filter, e->len))
                rt_trie_subscribe(rt_broker->trie, e->filter, e->len, rt_self(self), &e->opts,
                                  NULL);
            if (c->stored)
                rt_store_sub(c->client_id, e->filter, e->len, &e->opts);
        }
        i++;
    }
}

int rt_broker_recheck_acl(size_t *asked)
{
    if (asked)
        *asked = 0;
    if (!rt_broker)
        return 0; /* no broker, no clients */
    rt_pid_t *pids;
    size_t n;
    int rc = rt_broker_client_pids(0, &pids, &n);
    if (rc)
        return rc;
    size_t sent = 0;
    for (size_t i = 0; i < n; i++)
        sent += rt_send(pids[i], MSG_ACL_RECHECK, NULL, 0) == 0;
    free(pids);
    if (asked)
        *asked = sent;
    return 0;
}

int rt_client_query(rt_pid_t conn, rt_pid_t reply_to, uint64_t cookie, bool with_subs)
{
    query_t q = {.reply_to = reply_to, .cookie = cookie, .with_subs = with_subs};
    return rt_send(conn, MSG_QUERY, &q, sizeof(q));
}

int rt_client_kick(rt_pid_t conn)
{
    return rt_send(conn, MSG_KICK, NULL, 0);
}

const rt_client_info_t *rt_client_info_of(const rt_msg_t *m)
{
    if (!m || m->tag != RT_MSG_CLIENT_INFO || m->len < sizeof(rt_client_info_t))
        return NULL;
    return (const rt_client_info_t *)(const void *)m->data;
}

bool rt_client_info_subs_next(const rt_msg_t *m, size_t *pos, rt_client_sub_t *out)
{
    if (!rt_client_info_of(m))
        return false;
    size_t off = sizeof(rt_client_info_t) + *pos;
    if (off + SUB_ENTRY_HEAD > m->len)
        return false;
    const uint8_t *p = m->data + off;
    uint16_t flen;
    memcpy(&flen, p + 4, 2);
    if (off + SUB_ENTRY_HEAD + flen + 1 > m->len || p[SUB_ENTRY_HEAD + flen] != 0)
        return false;
    memset(out, 0, sizeof(*out));
    memcpy(&out->sub_id, p, 4);
    out->qos = p[6];
    out->no_local = (p[7] & SUB_FLAG_NO_LOCAL) != 0;
    out->retain_as_published = (p[7] & SUB_FLAG_RAP) != 0;
    out->retain_handling = (uint8_t)((p[7] >> SUB_RH_SHIFT) & 3);
    const char *f = (const char *)p + SUB_ENTRY_HEAD;
    out->filter = f;
    out->filter_len = flen;
    if (is_shared(f, flen)) {
        const char *g = f + sizeof(RT_SHARE_PREFIX) - 1;
        const char *slash = memchr(g, '/', (size_t)(f + flen - g));
        if (!slash)
            return false;
        out->group = g;
        out->group_len = (size_t)(slash - g);
        out->filter = slash + 1;
        out->filter_len = (size_t)(f + flen - out->filter);
    }
    *pos += SUB_ENTRY_HEAD + flen + 1u;
    return true;
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_t *c = state;
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        uint32_t events = ((rt_sock_event_t *)(void *)m->data)->events;
        if (c->shedding && (events & RT_SOCK_WRITABLE) && c->sock) {
            c->shedding = 0; /* the client caught up */
            rt_shed(self, false);
            rt_sock_set_high_water(c->sock, 0);
            rt_log(RT_LOG_INFO, "client.caught_up", "client=%s dropped=%u", c->client_id,
                   c->dropped);
        }
        if (c->sock && (events & RT_SOCK_READABLE))
            on_readable(self, c);
        break;
    }
    case RT_MSG_DELIVER:
        if (m->bin)
            deliver(c, m->bin, (const rt_delivery_t *)(const void *)m->data,
                    ((const rt_delivery_t *)(const void *)m->data)->sub_ids);
        break;
    case MSG_KEEPALIVE:
        on_keepalive(self, c);
        break;
    case MSG_RESUME:
        if (m->len >= 1)
            on_resume(self, c, m);
        break;
    case MSG_SESSION_EXPIRED:
        if (!c->sock && c->client_id && now_ms() >= c->expire_at_ms) {
            rt_log(RT_LOG_INFO, "session.expired", "client=%s", c->client_id);
            rt_exit(self, RT_REASON_NORMAL);
        }
        break;
    case MSG_WILL_DUE:
        if (!c->sock && c->will && now_ms() >= c->will_at_ms)
            publish_will(self, c);
        break;
    case RT_STORE_MSG_COMMITTED:
        if (m->len >= sizeof(rt_store_committed_t))
            on_commit(c, ((const rt_store_committed_t *)(const void *)m->data)->token, 0);
        break;
    case RT_RULES_MSG_DURABLE:
        if (m->len >= sizeof(rt_rules_durable_t)) {
            const rt_rules_durable_t *d = (const rt_rules_durable_t *)(const void *)m->data;
            on_commit(c, d->token, d->status);
        }
        break;
    case MSG_ACK_CHECK:
        on_ack_check(self, c);
        break;
    case MSG_AUTH_REFUSED:
        send_refusal(self, c);
        break;
    case MSG_PARSE_MORE:
        on_parse_more(self, c);
        break;
    case MSG_LOGIN_VERDICT:
        if (m->len >= sizeof(rt_auth_verdict_t))
            on_login_verdict(self, c, (const rt_auth_verdict_t *)(const void *)m->data);
        break;
    case MSG_SLOW_CHECK:
        on_slow_check(self, c);
        break;
    case MSG_RESTORED:
        /* From its own turn, so the store learns the session's new owner (epoch). */
        rt_store_session(c->client_id, c->session_expiry, false, false);
        break;
    case MSG_QUERY:
        if (m->len >= sizeof(query_t))
            on_query(self, c, (const query_t *)(const void *)m->data);
        break;
    case MSG_KICK:
        on_kick(self, c);
        break;
    case MSG_ACL_RECHECK:
        on_acl_recheck(self, c);
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
    drop_will(c);
    /* While the client still counts as connected and its username and peer are there. */
    if (c->client_id && c->connected)
        rule_event(c, RT_RULE_EV_CLIENT_DISCONNECTED, NULL, -1, disc_reason_code(c),
                   exit_reason_name(reason), NULL);
    if (c->sess) {
        hand_over_shared(self, c, &c->sess->inflight);
        hand_over_shared(self, c, &c->sess->queued);
    }
    for (size_t i = 0; i < c->nsubs; i++) {
        rt_trie_unsubscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self),
                            NULL);
        free(c->subs[i].filter);
    }
    free(c->subs);
    reset_connection_state(c); /* before the session goes: it clears the session's acks */
    rt_session_free(c->sess);
    c->sess = NULL;
    free(c->qos2_ids);
    free(c->username);
    free(c->peer);
    if (c->sock)
        rt__broker_count_socket(c->listener, -1);
    count_connected(c, false);
    /* The session ends, unless the broker is only stopping: then it is kept for the restart. */
    if (c->stored && reason != RT_REASON_SHUTDOWN)
        rt_store_session_end(c->client_id);
    if (c->client_id) {
        rt_broker_release_client(c->client_id, rt_self(self));
        atomic_fetch_sub(&rt_broker->stats.sessions, 1);
        rt_log(RT_LOG_INFO, "client.disconnected", "client=%s reason=%s", c->client_id,
               exit_reason_name(reason));
        free(c->client_id);
    }
}

static const char *conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET: return "socket";
    case RT_MSG_DELIVER: return "deliver";
    case MSG_KEEPALIVE: return "keepalive";
    case MSG_RESUME: return "resume";
    case MSG_SESSION_EXPIRED: return "session_expired";
    case MSG_WILL_DUE: return "will_due";
    case RT_STORE_MSG_COMMITTED: return "store_committed";
    case RT_RULES_MSG_DURABLE: return "rules_durable";
    case MSG_ACK_CHECK: return "ack_check";
    case MSG_RESTORED: return "restored";
    case MSG_AUTH_REFUSED: return "auth_refused";
    case MSG_ACL_RECHECK: return "acl_recheck";
    case MSG_LOGIN_VERDICT: return "login_verdict";
    case MSG_PARSE_MORE: return "parse_more";
    case MSG_SLOW_CHECK: return "slow_check";
    case MSG_QUERY: return "client_query";
    case MSG_KICK: return "client_kick";
    }
    return NULL;
}

const rt_actor_type_t rt_conn_type = {
    .name = "mqtt_conn",
    .state_size = sizeof(conn_t),
    .init = conn_init,
    .handle = conn_handle,
    .terminate = conn_terminate,
    .tag_name = conn_tag_name,
};

/* ---- Sessions loaded from the store at start ---- */

/*
** A persistent session as the last run left it, offline until its client
** resumes it: subscriptions (shared ones rejoin on resume), queued and
** inflight messages in their order, inbound QoS 2 ids, and what remains of
** its expiry.
*/
static int restored_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    const rt_stored_session_t *ss = arg;
    c->client_id = strdup(ss->client_id);
    if (!c->client_id)
        return RT_ENOMEM;
    c->closing = 1;
    c->stored = 1;
    c->session_expiry = ss->expiry_left_s;
    for (size_t i = 0; i < ss->nsubs; i++) {
        rt_trie_opts_t o = ss->subs[i].opts;
        o.persistent = 1;
        if (remember_sub(c, (const uint8_t *)ss->subs[i].filter, ss->subs[i].len, &o) == 0 &&
            !is_shared(ss->subs[i].filter, ss->subs[i].len))
            rt_trie_subscribe(rt_broker->trie, ss->subs[i].filter, ss->subs[i].len, rt_self(self),
                              &o, NULL);
    }
    for (size_t i = 0; i < ss->nmsgs && session(c); i++) {
        const rt_stored_msg_t *sm = &ss->msgs[i];
        rt_qmsg_t *m = rt_qmsg_new(sm->bin, sm->qos, sm->retain, sm->expire_at_ms, sm->shared,
                                   sm->sub_ids, sm->n_sub_ids);
        if (!m)
            break;
        m->seq = sm->seq;
        m->state = sm->state;
        m->packet_id = sm->packet_id;
        if (c->sess->next_seq < m->seq)
            c->sess->next_seq = m->seq;
        rt_qlist_t *l = m->state == RT_QMSG_QUEUED ? &c->sess->queued : &c->sess->inflight;
        if (l == &c->sess->inflight)
            c->sess->ids_unordered = 1;
        rt_qlist_push(l, m);
        if (m->state == RT_QMSG_WAIT_COMP)
            rt_qlist_drop_payload(l, m);
    }
    for (size_t i = 0; i < ss->nqos2_in; i++) {
        uint16_t *n = realloc(c->qos2_ids, (c->nqos2 + 1) * sizeof(*n));
        if (!n)
            break;
        c->qos2_ids = n;
        c->qos2_ids[c->nqos2++] = ss->qos2_in[i];
        c->capqos2 = c->nqos2;
    }
    rt_broker_claim_client(c->client_id, rt_self(self));
    count_session();
    c->expire_at_ms = now_ms() + (uint64_t)c->session_expiry * 1000;
    rt_send_after_tag((uint64_t)c->session_expiry * 1000, rt_self(self), MSG_SESSION_EXPIRED, NULL);
    rt_send(rt_self(self), MSG_RESTORED, NULL, 0);
    return 0;
}

static const rt_actor_type_t restored_type = {
    .name = "mqtt_conn",
    .state_size = sizeof(conn_t),
    .init = restored_init,
    .handle = conn_handle,
    .terminate = conn_terminate,
    .tag_name = conn_tag_name,
};

static void restore_retained(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms,
                             void *arg)
{
    rt_retained_msg_t *r = malloc(sizeof(*r));
    if (!r) {
        rt_bin_release(bin);
        return;
    }
    *r = (rt_retained_msg_t){.bin = bin, .expire_at_ms = expire_at_ms};
    if (rt_retained_set(rt_broker->retained, topic, len, r, rt_bin_len(bin)) != 0)
        rt_broker_retained_release(r);
}

static void restore_session(const rt_stored_session_t *ss, void *arg)
{
    rt_pid_t pid;
    if (rt_spawn(&restored_type, (void *)ss, &pid) != 0)
        rt_log(RT_LOG_ERROR, "store.restore_failed", "client=%s", ss->client_id);
}

int rt_sessions_restore(char *err, size_t errlen)
{
    if (!rt_broker->conf.persistence)
        return 0;
    int rc = rt_store_open(rt_broker->conf.data_dir, err, errlen);
    if (rc == 0)
        rc = rt_store_load(rt_message_parse, restore_retained, restore_session, NULL, err, errlen);
    return rc;
}

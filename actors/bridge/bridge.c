/*
** The bridge actor (bridge.h): one MQTT client connection to a remote broker, its queue of
** messages out, and what comes in. It runs on a scheduler: the connect is non-blocking and
** the socket is the runtime's, so the remote's pace never holds a thread.
**
** Every message out is an entry of one FIFO: the sent part (inflight, waiting for PUBACKs)
** at its head, the unsent after. A connection that drops puts the sent part back to be
** sent again, in order, with DUP when the remote kept the session. A durable bridge's
** entries carry the local publisher's wait (ack_pid), answered exactly once: by the remote's
** PUBACK, by a drop (the queue full, RT_ELIMIT), or by the actor's end (RT_ENOPROC: the
** publisher's client sends it again).
*/
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bridge_impl.h"
#include "broker.h"
#include "log.h"
#include "message.h"
#include "route.h"
#include "spill.h"
#include "store.h"
#include "tls.h"
#include "tls_conn.h"

enum {
    BRIDGE_RECONNECT = RT_MSG_USER + 0x5A00, /* the backoff ran out: connect */
    BRIDGE_CONNECT_TIMEOUT,                  /* no CONNACK in connect_timeout_ms */
    BRIDGE_KEEPALIVE,                        /* half a keep-alive passed */
    BRIDGE_RESTART,                          /* rtctl bridges restart */
};

#define BRIDGE_IN_MAX (1u << 20)    /* bytes of one packet from the remote */
#define BRIDGE_OUT_SLACK (64 << 10) /* socket output past which the queue waits */
#define BRIDGE_REFILL 256           /* rows read back from the spill at a time */

typedef struct out_s {
    struct out_s *next;
    rt_bin_t *bin;     /* the canonical message */
    int64_t spill_seq; /* read back from the spill: its row, deleted once the remote has it */
    rt_pid_t ack_pid;
    uint64_t ack_token;
    uint32_t bytes; /* charged to the actor */
    uint16_t packet_id;
    uint8_t qos, retain, sent;
    uint16_t tlen;
    char topic[]; /* the remote's topic */
} out_t;

typedef struct {
    rt_bridge_t *b;
    rt_sock_t *sock;
    int state;                            /* rt_bridge_state_t */
    out_t *inflight_head, *inflight_tail; /* written, waiting for their PUBACK, oldest first */
    out_t *queue, *queue_tail;            /* not written on this connection yet */
    uint32_t inflight, window;
    bool full_said;             /* the queue's being full was logged; reset once one fits again */
    uint32_t remote_max_packet; /* 0: no limit */
    uint16_t next_id;
    bool session_present;
    bool ping_out; /* a PINGREQ waits for its PINGRESP */
    bool reconnect_timer;
    rt_ref_t connect_timer, keepalive_timer;
    uint32_t backoff_ms;
    uint8_t *in;
    size_t inlen, incap;
    rt_tls_conn_t tls; /* mqtts://: the connection's TLS; tls.ssl NULL otherwise */
    bool connect_sent; /* the CONNECT went (after the TLS handshake, on mqtts://) */
    char tls_why[200]; /* why TLS failed (OpenSSL's or the certificate check's reason) */
    uint8_t *scratch;  /* mqtts://: a PUBLISH is encoded here, then encrypted */
    size_t scratch_cap;
    /* The spill (spill = true): QoS 1 messages out past max_memory_bytes, oldest first. */
    rt_spill_t spill;
    bool spill_open, spill_said;
    out_t *to_spill, *to_spill_tail; /* appended at the turn's end, in one transaction */
    int64_t loaded;                  /* the newest row read back into the queue */
} bridge_t;

static void set_state(bridge_t *st, int state)
{
    st->state = state;
    atomic_store(&st->b->state, state);
}

/* Answers a durable entry's publisher once. */
static void answer(out_t *e, int32_t status)
{
    if (!e->ack_pid)
        return;
    rt_store_committed_t done = {.token = e->ack_token, .status = status};
    rt_send(e->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
    e->ack_pid = 0;
}

static void free_entry(rt_actor_t *self, bridge_t *st, out_t *e)
{
    atomic_fetch_sub(&st->b->queued, 1);
    atomic_fetch_sub(&st->b->queued_bytes, e->bytes);
    rt_charge(self, -(ptrdiff_t)e->bytes);
    rt_bin_release(e->bin);
    free(e);
}

/*
** Room for len bytes of output: in the socket's buffer (plain TCP, no copy), or in the scratch
** buffer that out_commit encrypts (mqtts://). NULL when the socket is gone or memory short.
*/
static uint8_t *out_reserve(rt_actor_t *self, bridge_t *st, size_t len)
{
    if (!st->sock)
        return NULL;
    if (!st->tls.ssl)
        return rt_sock_reserve(st->sock, len);
    if (len > st->scratch_cap) {
        uint8_t *p = realloc(st->scratch, len);
        if (!p)
            return NULL;
        rt_charge(self, (ptrdiff_t)(len - st->scratch_cap));
        st->scratch = p;
        st->scratch_cap = len;
    }
    return st->scratch;
}

static bool out_commit(bridge_t *st, size_t len)
{
    return st->tls.ssl ? rt_tls_conn_write(&st->tls, st->scratch, len) == 0
                       : rt_sock_commit(st->sock, len) == 0;
}

/* Writes one packet; false when the socket is gone (the close event follows). */
static bool send_packet(rt_actor_t *self, bridge_t *st, const mqtt_packet_t *pk)
{
    size_t len = 0;
    if (!st->sock || mqtt_encode(pk, NULL, 0, 0, &len, NULL) != 0)
        return false;
    uint8_t *p = out_reserve(self, st, len);
    if (!p)
        return false;
    mqtt_encode(pk, p, len, 0, &len, NULL);
    return out_commit(st, len);
}

static uint16_t take_packet_id(bridge_t *st)
{
    /* Ids are handed out in turn and at most 65535 wait: the next one after the newest
       in use is free unless the window wrapped into the oldest, which max_inflight's
       bound (65535) excludes. */
    if (++st->next_id == 0)
        st->next_id = 1;
    return st->next_id;
}

/* Unlinks the oldest entry of a list (head and tail pointers). */
static out_t *pop(out_t **head, out_t **tail)
{
    out_t *e = *head;
    *head = e->next;
    if (!*head)
        *tail = NULL;
    e->next = NULL;
    return e;
}

static void push(out_t **head, out_t **tail, out_t *e)
{
    if (*tail)
        (*tail)->next = e;
    else
        *head = e;
    *tail = e;
}

/* A spilled row: the message's PUBLISH as the store keeps it; its options: QoS, retain and
   the topic at the remote. */
#define SPILL_OPTS_HEAD 2

static void spill_failed(bridge_t *st, const char *what, const char *why)
{
    if (st->spill_said)
        return;
    st->spill_said = true;
    rt__bridge_error(st->b, "spill: %s", why);
    rt_log(RT_LOG_ERROR, "bridge.spill_failed", "bridge=%s step=%s error=%s", st->b->conf.name,
           what, why);
}

/* The turn's messages for the spill, in one transaction; what cannot go stays in memory. */
static void spill_flush(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    size_t n = 0, opts_len = 0;
    for (out_t *e = st->to_spill; e; e = e->next, n++)
        opts_len += SPILL_OPTS_HEAD + e->tlen;
    sink_row_t *rows = malloc(n * sizeof(*rows) + opts_len);
    uint8_t *o = rows ? (uint8_t *)(rows + n) : NULL;
    char why[256] = "out of memory";
    size_t i = 0;
    uint64_t bytes = 0;
    for (out_t *e = st->to_spill; rows && e; e = e->next, i++) {
        o[0] = e->qos;
        o[1] = e->retain;
        memcpy(o + SPILL_OPTS_HEAD, e->topic, e->tlen);
        rows[i] = (sink_row_t){.doc = rt_bin_data(e->bin),
                               .len = (uint32_t)rt_bin_len(e->bin),
                               .opts = o,
                               .opts_len = SPILL_OPTS_HEAD + e->tlen};
        o += rows[i].opts_len;
        bytes += rows[i].len;
    }
    if (rows && rt_spill_append(&st->spill, rows, n, why, sizeof(why)) == 0) {
        atomic_fetch_add(&b->spilled, n);
        atomic_fetch_add(&b->spilled_bytes, bytes);
        st->spill_said = false;
        /* Kept: a durable bridge's publisher is answered, as a sink answers once its rows are
           in its spill. */
        while (st->to_spill) {
            out_t *e = pop(&st->to_spill, &st->to_spill_tail);
            answer(e, 0);
            free_entry(self, st, e);
        }
    } else {
        spill_failed(st, "append", why);
        while (st->to_spill)
            push(&st->queue, &st->queue_tail, pop(&st->to_spill, &st->to_spill_tail));
    }
    free(rows);
}

/* Reads the spill's oldest rows not in memory yet into the queue, once it runs low. */
static void spill_refill(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    if (!st->spill_open || st->to_spill || st->queue ||
        atomic_load(&b->spilled) <= (uint64_t)(st->loaded - st->spill.done))
        return;
    sink_row_t rows[BRIDGE_REFILL];
    uint8_t *buf = NULL;
    int64_t last = 0;
    uint64_t bytes = 0;
    char why[256];
    int n = rt_spill_peek(&st->spill, st->loaded, rows, BRIDGE_REFILL, &buf, &last, &bytes, why,
                          sizeof(why));
    if (n < 0) {
        spill_failed(st, "read", why);
        return;
    }
    /* Rows are appended at the end and deleted from the front: their seqs run on. */
    for (int i = 0; i < n; i++) {
        const sink_row_t *r = &rows[i];
        size_t tlen = r->opts_len - SPILL_OPTS_HEAD;
        rt_bin_t *bin = rt_message_parse(r->doc, r->len);
        out_t *e = bin ? malloc(sizeof(out_t) + tlen) : NULL;
        if (!e) {
            rt_bin_release(bin);
            spill_failed(st, "read", bin ? "out of memory" : "an unreadable row");
            break;
        }
        size_t eb = sizeof(out_t) + tlen + rt_bin_len(bin);
        *e = (out_t){.bin = bin,
                     .spill_seq = last - (n - 1 - i),
                     .bytes = (uint32_t)eb,
                     .qos = r->opts[0],
                     .retain = r->opts[1],
                     .tlen = (uint16_t)tlen};
        memcpy(e->topic, r->opts + SPILL_OPTS_HEAD, tlen);
        rt_charge(self, (ptrdiff_t)eb);
        atomic_fetch_add(&b->queued, 1);
        atomic_fetch_add(&b->queued_bytes, eb);
        push(&st->queue, &st->queue_tail, e);
        st->loaded = e->spill_seq;
    }
    free(buf);
}

/* The remote has a message read back from the spill: its row goes (PUBACKs come in order,
   4.6, so every older row went before it). */
static void spill_done(bridge_t *st, const out_t *e)
{
    char why[256];
    uint64_t row = rt_bin_len(e->bin);
    if (rt_spill_pop(&st->spill, e->spill_seq, 1, row, why, sizeof(why)) != 0)
        spill_failed(st, "delete", why);
    atomic_fetch_sub(&st->b->spilled, 1);
    atomic_fetch_sub(&st->b->spilled_bytes, row);
    if (st->spill.rows == 0)
        st->loaded = 0; /* an empty table starts its seqs again */
}

/* Writes the queued entries while the window and the socket allow. */
static void pump(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    if (st->state == RT_BRIDGE_UP && !st->queue)
        spill_refill(self, st);
    while (st->state == RT_BRIDGE_UP && st->queue && rt_sock_pending(st->sock) < BRIDGE_OUT_SLACK) {
        out_t *e = st->queue;
        if (e->qos && st->inflight >= st->window)
            return;
        rt_message_t m;
        rt_message_view(e->bin, &m);
        m.topic = (mqtt_str_t){.p = (const uint8_t *)e->topic, .len = e->tlen};
        bool again = e->sent;
        if (e->qos && !again)
            e->packet_id = take_packet_id(st);
        rt_message_out_t o = {.version = (uint8_t)b->conf.version,
                              .qos = e->qos,
                              .retain = e->retain,
                              .dup = again && st->session_present,
                              .packet_id = e->packet_id};
        size_t len = rt_message_encode(&m, &o, NULL, 0);
        if (st->remote_max_packet && len > st->remote_max_packet) {
            /* The remote would close the connection for it (3.1.2.24): dropped, said. */
            rt__bridge_error(b,
                             "a message of %zu bytes is over the remote's maximum packet size "
                             "(%u): dropped",
                             len, st->remote_max_packet);
            atomic_fetch_add(&b->dropped, 1);
            e = pop(&st->queue, &st->queue_tail);
            answer(e, RT_EINVAL);
            free_entry(self, st, e);
            continue;
        }
        uint8_t *p = out_reserve(self, st, len);
        if (!p)
            return;
        rt_message_encode(&m, &o, p, len);
        if (!out_commit(st, len))
            return;
        atomic_fetch_add(&b->sent, 1);
        if (again)
            atomic_fetch_add(&b->resent, 1);
        e = pop(&st->queue, &st->queue_tail);
        if (e->qos) {
            e->sent = 1;
            push(&st->inflight_head, &st->inflight_tail, e);
            st->inflight++;
            atomic_fetch_add(&b->inflight, 1);
        } else {
            answer(e, 0);
            free_entry(self, st, e);
        }
        if (!st->queue)
            spill_refill(self, st);
    }
}

/* A message out from a local subscription: queued (or dropped, the queue full). */
static void on_deliver(rt_actor_t *self, bridge_t *st, rt_msg_t *msg)
{
    const rt_delivery_t *d = (const rt_delivery_t *)(const void *)msg->data;
    rt_bridge_t *b = st->b;
    rt_message_t m;
    rt_message_view(msg->bin, &m);
    char topic[RT_CONF_BRIDGE_MAP_LEN + 1024];
    long tlen = -1;
    for (unsigned i = 0; i < b->nout && tlen < 0; i++)
        tlen = rt_bridge_map_apply(&b->out[i], (const char *)m.topic.p, m.topic.len, topic,
                                   sizeof(topic));
    rt_store_committed_t done = {.token = d->ack_token, .status = 0};
    if (tlen < 0 || (size_t)tlen > sizeof(topic) || tlen > UINT16_MAX) {
        /* A message matched by no map (the trie and the maps agree but on a topic too long
           for the mapped one): not bridged. */
        if (tlen >= 0)
            rt__bridge_error(b, "a mapped topic of %ld bytes is too long: dropped", tlen);
        atomic_fetch_add(&b->dropped, tlen >= 0);
        done.status = RT_EINVAL;
        if (d->ack_pid)
            rt_send(d->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
        return;
    }
    size_t bytes = sizeof(out_t) + (size_t)tlen + rt_bin_len(msg->bin);
    uint8_t qos = d->qos < b->conf.qos ? d->qos : (uint8_t)b->conf.qos;
    uint64_t held = atomic_load(&b->queued_bytes);
    /* Past max_memory_bytes a QoS 1 message waits in the spill, and so does every one after
       it while the spill holds any (order); a QoS 0 one is dropped there. */
    bool to_spill = st->spill_open && (st->spill.rows || st->to_spill ||
                                       held + bytes > (uint64_t)b->conf.max_memory_bytes);
    out_t *e = NULL;
    if (held + atomic_load(&b->spilled_bytes) + bytes > (uint64_t)b->conf.max_queue_bytes ||
        (!st->spill_open && held + bytes > (uint64_t)b->conf.max_memory_bytes) ||
        (to_spill && qos == 0) || !(e = malloc(sizeof(out_t) + (size_t)tlen))) {
        atomic_fetch_add(&b->dropped, 1);
        if (!st->full_said) {
            rt__bridge_error(b, "the queue holds max_queue_bytes (%ld): new messages are dropped",
                             b->conf.max_queue_bytes);
            rt_log(RT_LOG_WARNING, "bridge.queue_full", "bridge=%s max_queue_bytes=%ld",
                   b->conf.name, b->conf.max_queue_bytes);
            st->full_said = true;
        }
        done.status = RT_ELIMIT;
        if (d->ack_pid)
            rt_send(d->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
        return;
    }
    st->full_said = false;
    *e = (out_t){.bin = rt_msg_take_bin(msg),
                 .ack_pid = d->ack_pid,
                 .ack_token = d->ack_token,
                 .bytes = (uint32_t)bytes,
                 .qos = qos,
                 .retain = d->retain,
                 .tlen = (uint16_t)tlen};
    memcpy(e->topic, topic, (size_t)tlen);
    rt_charge(self, (ptrdiff_t)bytes);
    atomic_fetch_add(&b->queued, 1);
    atomic_fetch_add(&b->queued_bytes, bytes);
    if (to_spill) {
        push(&st->to_spill, &st->to_spill_tail, e);
        return;
    }
    push(&st->queue, &st->queue_tail, e);
    pump(self, st);
}

/* The remote acknowledged packet_id: the entry is done. */
static void on_puback(rt_actor_t *self, bridge_t *st, uint16_t packet_id)
{
    out_t **pp = &st->inflight_head, *prev = NULL;
    /* Acks come in order (4.6): the head is the usual match. */
    while (*pp && (*pp)->packet_id != packet_id) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    out_t *e = *pp;
    if (!e)
        return; /* an id not in flight: a duplicate ack after a resend */
    *pp = e->next;
    if (st->inflight_tail == e)
        st->inflight_tail = prev;
    st->inflight--;
    atomic_fetch_sub(&st->b->inflight, 1);
    atomic_fetch_add(&st->b->acked, 1);
    if (e->spill_seq)
        spill_done(st, e);
    answer(e, 0);
    free_entry(self, st, e);
    pump(self, st);
}

static void arm_reconnect(rt_actor_t *self, bridge_t *st)
{
    if (st->reconnect_timer)
        return;
    st->reconnect_timer = true;
    rt_send_after_tag(st->backoff_ms, rt_self(self), BRIDGE_RECONNECT, NULL);
    uint32_t next = st->backoff_ms * 2;
    st->backoff_ms = next > (uint32_t)st->b->conf.reconnect_max_ms
                         ? (uint32_t)st->b->conf.reconnect_max_ms
                         : next;
}

/* The connection is gone (or never came): what was sent goes again on the next one. */
static void disconnected(rt_actor_t *self, bridge_t *st, bool failed)
{
    rt_bridge_t *b = st->b;
    if (st->tls.ssl)
        rt_tls_conn_close(&st->tls);
    if (st->sock) {
        rt_sock_close(st->sock);
        st->sock = NULL;
    }
    if (st->connect_timer) {
        rt_cancel_timer(st->connect_timer);
        st->connect_timer = 0;
    }
    if (st->keepalive_timer) {
        rt_cancel_timer(st->keepalive_timer);
        st->keepalive_timer = 0;
    }
    if (st->state == RT_BRIDGE_UP)
        rt_log(RT_LOG_WARNING, "bridge.down", "bridge=%s remote=%s", b->conf.name, b->conf.remote);
    if (failed)
        atomic_fetch_add(&b->failures, 1);
    set_state(st, RT_BRIDGE_DOWN);
    atomic_store(&b->up_since_ms, 0);
    /* The sent part goes back before the rest, in order. */
    if (st->inflight_head) {
        st->inflight_tail->next = st->queue;
        if (!st->queue)
            st->queue_tail = st->inflight_tail;
        st->queue = st->inflight_head;
        st->inflight_head = st->inflight_tail = NULL;
    }
    st->inflight = 0;
    atomic_store(&b->inflight, 0);
    st->inlen = 0;
    st->ping_out = false;
    arm_reconnect(self, st);
}

static void fail(rt_actor_t *self, bridge_t *st, const char *fmt, const char *detail)
{
    rt__bridge_error(st->b, fmt, detail);
    if (st->state != RT_BRIDGE_DOWN || st->sock)
        rt_log(RT_LOG_DEBUG, "bridge.connect_failed", "bridge=%s remote=%s error=%s",
               st->b->conf.name, st->b->conf.remote, st->b->last_error);
    disconnected(self, st, true);
}

static void send_connect(rt_actor_t *self, bridge_t *st)
{
    const rt_conf_bridge_t *c = &st->b->conf;
    mqtt_packet_t pk = {.type = MQTT_CONNECT, .version = (uint8_t)c->version};
    pk.connect.clean_start = c->clean_start;
    pk.connect.keepalive = (uint16_t)c->keepalive_s;
    pk.connect.client_id = (mqtt_str_t){.p = (const uint8_t *)st->b->client_id,
                                        .len = (uint32_t)strlen(st->b->client_id)};
    if (c->username[0]) {
        pk.connect.has_username = 1;
        pk.connect.username =
            (mqtt_str_t){.p = (const uint8_t *)c->username, .len = (uint32_t)strlen(c->username)};
    }
    if (c->password[0]) {
        pk.connect.has_password = 1;
        pk.connect.password =
            (mqtt_str_t){.p = (const uint8_t *)c->password, .len = (uint32_t)strlen(c->password)};
    }
    if (c->version == MQTT_V5) {
        pk.props.present =
            MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY) | MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE);
        pk.props.session_expiry = (uint32_t)c->session_expiry_s;
        pk.props.maximum_packet_size = BRIDGE_IN_MAX;
    }
    st->connect_sent = true;
    send_packet(self, st, &pk);
}

/* mqtts://: the client side of TLS on the new socket; the CONNECT follows its handshake. */
static bool start_tls(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    SSL *ssl = SSL_new(b->tls);
    bool ok = ssl && SSL_set_tlsext_host_name(ssl, b->tls_name) == 1;
    if (ok && b->conf.tls_verify) {
        /* An address is checked against the certificate's IP entries, a name its DNS ones. */
        X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
        ok = X509_VERIFY_PARAM_set1_ip_asc(vp, b->tls_name) == 1 ||
             SSL_set1_host(ssl, b->tls_name) == 1;
    }
    if (!ok || rt_tls_conn_attach(&st->tls, ok ? ssl : NULL, st->sock) != 0) {
        if (!ok)
            SSL_free(ssl);
        fail(self, st, "%s", "TLS: out of memory");
        return false;
    }
    char why[256] = "";
    if (rt_tls_conn_input(&st->tls, NULL, 0, NULL, NULL, why, sizeof(why)) != 0) {
        fail(self, st, "TLS: %s", why);
        return false;
    }
    return true;
}

static void connect_now(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    int fd = socket(b->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fail(self, st, "socket: %s", strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (const struct sockaddr *)&b->addr, b->addrlen) < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        fail(self, st, "connect: %s", strerror(e));
        return;
    }
    if (rt_sock_adopt(self, fd, &st->sock) != 0) {
        close(fd);
        st->sock = NULL;
        fail(self, st, "%s", "no socket watch (out of memory)");
        return;
    }
    /* The first bytes wait in the socket's buffer until the connect completes; a refused one
       surfaces as a read error, and one that hangs meets the connect timer. */
    set_state(st, RT_BRIDGE_CONNECTING);
    st->connect_sent = false;
    if (b->tls) {
        if (!start_tls(self, st))
            return;
    } else {
        send_connect(self, st);
    }
    rt_send_after_tag((uint64_t)b->conf.connect_timeout_ms, rt_self(self), BRIDGE_CONNECT_TIMEOUT,
                      &st->connect_timer);
}

static void subscribe_remote(rt_actor_t *self, bridge_t *st)
{
    rt_bridge_t *b = st->b;
    if (!b->nin)
        return;
    mqtt_sub_t items[RT_CONF_MAX_BRIDGE_MAPS];
    for (unsigned i = 0; i < b->nin; i++)
        items[i] = (mqtt_sub_t){
            .filter = {.p = (const uint8_t *)b->in[i].filter, .len = b->in[i].flen},
            .options =
                (uint8_t)(b->conf.qos | (b->conf.version == MQTT_V5
                                             ? MQTT_SUB_NO_LOCAL | MQTT_SUB_RETAIN_AS_PUBLISHED
                                             : 0))};
    mqtt_packet_t pk = {.type = MQTT_SUBSCRIBE,
                        .version = (uint8_t)b->conf.version,
                        .packet_id = 1,
                        .sub = {.items = items, .count = b->nin}};
    send_packet(self, st, &pk);
}

static void on_connack(rt_actor_t *self, bridge_t *st, const mqtt_packet_t *pk)
{
    rt_bridge_t *b = st->b;
    if (pk->reason != 0) {
        char why[64];
        snprintf(why, sizeof(why), "0x%02x", pk->reason);
        rt_log(RT_LOG_WARNING, "bridge.refused", "bridge=%s remote=%s reason=%s", b->conf.name,
               b->conf.remote, why);
        fail(self, st, "the remote refused the CONNECT: reason %s", why);
        return;
    }
    rt_cancel_timer(st->connect_timer);
    st->connect_timer = 0;
    st->session_present = pk->connack.session_present;
    st->window = (uint32_t)b->conf.max_inflight;
    st->remote_max_packet = 0;
    if (pk->version == MQTT_V5) {
        if ((pk->props.present & MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM)) &&
            pk->props.receive_maximum < st->window)
            st->window = pk->props.receive_maximum;
        if (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE))
            st->remote_max_packet = pk->props.maximum_packet_size;
    }
    set_state(st, RT_BRIDGE_UP);
    st->backoff_ms = (uint32_t)b->conf.reconnect_min_ms;
    atomic_fetch_add(&b->connects, 1);
    atomic_store(&b->up_since_ms, rt_wall_ms());
    rt__bridge_error(b, "%s", "");
    rt_log(RT_LOG_INFO, "bridge.up", "bridge=%s remote=%s session_present=%d", b->conf.name,
           b->conf.remote, st->session_present);
    rt_send_after_tag((uint64_t)b->conf.keepalive_s * 500, rt_self(self), BRIDGE_KEEPALIVE,
                      &st->keepalive_timer);
    subscribe_remote(self, st);
    pump(self, st);
}

/* A PUBLISH from the remote: mapped and routed here, as the bridge's own. */
static int on_remote_publish(rt_actor_t *self, bridge_t *st, mqtt_packet_t *pk)
{
    rt_bridge_t *b = st->b;
    if (pk->publish.qos > 1 || (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR); /* neither was asked for */
    char topic[RT_CONF_BRIDGE_MAP_LEN + 1024];
    long tlen = -1;
    for (unsigned i = 0; i < b->nin && tlen < 0; i++)
        tlen = rt_bridge_map_apply(&b->in[i], (const char *)pk->publish.topic.p,
                                   pk->publish.topic.len, topic, sizeof(topic));
    if (tlen > 0 && (size_t)tlen <= sizeof(topic)) {
        pk->publish.topic = (mqtt_str_t){.p = (const uint8_t *)topic, .len = (uint32_t)tlen};
        rt_bin_t *bin = rt_message_new(pk, b->publisher, NULL);
        if (bin) {
            rt_route(rt_self(self), bin, 0, 0, NULL);
            rt_bin_release(bin);
            atomic_fetch_add(&b->received, 1);
        }
    } else {
        atomic_fetch_add(&b->ignored, 1);
    }
    if (pk->publish.qos == 1) {
        mqtt_packet_t ack = {
            .type = MQTT_PUBACK, .version = (uint8_t)b->conf.version, .packet_id = pk->packet_id};
        send_packet(self, st, &ack);
    }
    return 0;
}

static int on_packet(rt_actor_t *self, bridge_t *st, mqtt_packet_t *pk)
{
    if (st->state == RT_BRIDGE_CONNECTING && pk->type != MQTT_CONNACK)
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
    switch (pk->type) {
    case MQTT_CONNACK:
        if (st->state != RT_BRIDGE_CONNECTING)
            return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
        on_connack(self, st, pk);
        return 0;
    case MQTT_PUBLISH:
        return on_remote_publish(self, st, pk);
    case MQTT_PUBACK:
        on_puback(self, st, pk->packet_id);
        return 0;
    case MQTT_SUBACK:
        for (uint32_t i = 0; i < pk->codes.len; i++)
            if (pk->codes.p[i] >= 0x80) {
                char why[RT_CONF_BRIDGE_MAP_LEN + 24];
                snprintf(why, sizeof(why), "%s (reason 0x%02x)",
                         i < st->b->nin ? st->b->in[i].filter : "?", pk->codes.p[i]);
                rt__bridge_error(st->b, "the remote refused the subscription to %s", why);
                rt_log(RT_LOG_WARNING, "bridge.subscribe_refused", "bridge=%s filter=%s",
                       st->b->conf.name, why);
            }
        return 0;
    case MQTT_PINGRESP:
        st->ping_out = false;
        return 0;
    case MQTT_DISCONNECT:
        return RT_ECLOSED;
    default:
        return MQTT_ERR(MQTT_RC_PROTOCOL_ERROR);
    }
}

/* Frames and handles what the remote sent; an error (RT_E* or MQTT_ERR) ends the connection. */
static int parse_input(rt_actor_t *self, bridge_t *st, const uint8_t *data, size_t len)
{
    if (st->inlen + len > st->incap) {
        size_t need = st->inlen + len, cap = st->incap ? st->incap : 4096;
        while (cap < need)
            cap *= 2;
        if (cap > BRIDGE_IN_MAX + 8) {
            cap = BRIDGE_IN_MAX + 8;
            if (need > cap)
                return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
        }
        uint8_t *in = realloc(st->in, cap);
        if (!in)
            return RT_ENOMEM;
        rt_charge(self, (ptrdiff_t)(cap - st->incap));
        st->in = in;
        st->incap = cap;
    }
    memcpy(st->in + st->inlen, data, len);
    st->inlen += len;
    size_t at = 0;
    int rc = 0;
    while (!rc && st->sock) {
        mqtt_frame_t f;
        rc = mqtt_frame(st->in + at, st->inlen - at, BRIDGE_IN_MAX, &f);
        if (rc == RT_EAGAIN) {
            rc = 0;
            break;
        }
        mqtt_packet_t pk;
        if (!rc && !(rc = mqtt_decode(st->in + at, f.size, (uint8_t)st->b->conf.version, &pk))) {
            rc = on_packet(self, st, &pk);
            at += f.size;
        }
    }
    if (st->sock) {
        memmove(st->in, st->in + at, st->inlen - at);
        st->inlen -= at;
    }
    return rc;
}

typedef struct {
    rt_actor_t *self;
    bridge_t *st;
    int rc;
} plain_ctx_t;

static bool on_plain(void *ctx, uint8_t *p, size_t n)
{
    plain_ctx_t *c = ctx;
    c->rc = parse_input(c->self, c->st, p, n);
    return c->rc == 0 && c->st->sock;
}

/* mqtts://: ciphertext in; the CONNECT goes once the handshake is done. */
static int tls_input(rt_actor_t *self, bridge_t *st, const void *data, size_t len)
{
    plain_ctx_t c = {.self = self, .st = st};
    int rc = rt_tls_conn_input(&st->tls, data, len, on_plain, &c, st->tls_why, sizeof(st->tls_why));
    if (rc == RT_EPROTO)
        return RT_EPROTO;
    if (rc || c.rc)
        return rc ? rc : c.rc;
    if (!st->connect_sent && rt_tls_conn_established(&st->tls))
        send_connect(self, st);
    return 0;
}

static void on_socket(rt_actor_t *self, bridge_t *st, const rt_sock_event_t *ev)
{
    if (ev->sock != st->sock)
        return;
    if (ev->events & RT_SOCK_READABLE) {
        const void *data;
        size_t len;
        int rc;
        while (st->sock && (rc = rt_sock_read(st->sock, &data, &len)) == 0) {
            int prc =
                st->tls.ssl ? tls_input(self, st, data, len) : parse_input(self, st, data, len);
            if (prc) {
                if (prc == RT_EPROTO)
                    fail(self, st, "TLS: %s", st->tls_why);
                else
                    fail(self, st, "%s",
                         prc == RT_ECLOSED         ? "the remote ended the connection"
                         : MQTT_IS_REASON_ERR(prc) ? "a malformed or unexpected packet"
                                                   : rt_strerror(prc));
                return;
            }
        }
        if (st->sock && rc == RT_ECLOSED) {
            fail(self, st, "%s",
                 st->state == RT_BRIDGE_UP ? "the remote closed the connection"
                                           : "no connection (refused or reset)");
            return;
        }
    }
    if (st->sock && (ev->events & RT_SOCK_WRITABLE))
        pump(self, st);
}

static void on_keepalive(rt_actor_t *self, bridge_t *st)
{
    st->keepalive_timer = 0;
    if (st->state != RT_BRIDGE_UP)
        return;
    if (st->ping_out) {
        fail(self, st, "%s", "no PINGRESP within half the keep-alive");
        return;
    }
    mqtt_packet_t ping = {.type = MQTT_PINGREQ, .version = (uint8_t)st->b->conf.version};
    st->ping_out = send_packet(self, st, &ping);
    rt_send_after_tag((uint64_t)st->b->conf.keepalive_s * 500, rt_self(self), BRIDGE_KEEPALIVE,
                      &st->keepalive_timer);
}

static void bridge_handle(rt_actor_t *self, void *state, rt_msg_t *msg)
{
    bridge_t *st = state;
    switch (msg->tag) {
    case RT_MSG_SOCKET:
        on_socket(self, st, (const rt_sock_event_t *)(const void *)msg->data);
        break;
    case RT_MSG_DELIVER:
        if (msg->len >= sizeof(rt_delivery_t) && msg->bin)
            on_deliver(self, st, msg);
        break;
    case BRIDGE_RECONNECT:
        st->reconnect_timer = false;
        if (st->state == RT_BRIDGE_DOWN)
            connect_now(self, st);
        break;
    case BRIDGE_CONNECT_TIMEOUT:
        st->connect_timer = 0;
        if (st->state == RT_BRIDGE_CONNECTING)
            fail(self, st, "%s", "no CONNACK within connect_timeout_ms");
        break;
    case BRIDGE_KEEPALIVE:
        on_keepalive(self, st);
        break;
    case BRIDGE_RESTART:
        if (st->state != RT_BRIDGE_DOWN)
            disconnected(self, st, false);
        st->backoff_ms = (uint32_t)st->b->conf.reconnect_min_ms;
        if (!st->reconnect_timer)
            connect_now(self, st);
        break;
    default:
        break;
    }
}

/* Subscribes here to the out filters: no-local, so what the bridge routes in stays here. */
static int subscribe_local(rt_actor_t *self, bridge_t *st, bool on)
{
    rt_bridge_t *b = st->b;
    rt_trie_opts_t o = {.qos = (uint8_t)b->conf.qos,
                        .no_local = 1,
                        .retain_as_published = 1,
                        .persistent = b->conf.durable};
    for (unsigned i = 0; i < b->nout; i++) {
        int rc = on ? rt_trie_subscribe(rt_broker->trie, b->out[i].filter, b->out[i].flen,
                                        rt_self(self), &o, NULL)
                    : rt_trie_unsubscribe(rt_broker->trie, b->out[i].filter, b->out[i].flen,
                                          rt_self(self), NULL);
        if (rc && on)
            return rc;
    }
    return 0;
}

static int bridge_init(rt_actor_t *self, void *state, void *arg)
{
    bridge_t *st = state;
    st->b = arg;
    st->backoff_ms = (uint32_t)st->b->conf.reconnect_min_ms;
    int rc = subscribe_local(self, st, true);
    if (rc) {
        subscribe_local(self, st, false);
        return rc;
    }
    if (st->b->conf.spill) {
        char why[256];
        /* A durable bridge answers its publishers once a row is here: on disk, then. */
        if (rt_spill_open(&st->spill, st->b->spill_path, st->b->conf.durable, why, sizeof(why)) ==
            0) {
            st->spill_open = true;
            atomic_store(&st->b->spilled, st->spill.rows);
            atomic_store(&st->b->spilled_bytes, st->spill.bytes);
            if (st->spill.rows)
                rt_log(RT_LOG_INFO, "bridge.spill_found", "bridge=%s rows=%llu", st->b->conf.name,
                       (unsigned long long)st->spill.rows);
        } else {
            spill_failed(st, "open", why);
        }
    }
    atomic_store(&st->b->pid, rt_self(self));
    atomic_fetch_add(&st->b->starts, 1);
    /* Connects in its first turn: output written in init waits for a turn's end. */
    st->reconnect_timer = true;
    return rt_send(rt_self(self), BRIDGE_RECONNECT, NULL, 0);
}

static void bridge_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)reason;
    bridge_t *st = state;
    subscribe_local(self, st, false);
    if (st->to_spill)
        spill_flush(self, st);
    for (out_t **list = &st->inflight_head; list; list = list == &st->queue ? NULL : &st->queue)
        while (*list) {
            out_t *e = *list;
            *list = e->next;
            answer(e, RT_ENOPROC);
            free_entry(self, st, e);
        }
    st->inflight_tail = st->queue_tail = NULL;
    if (st->spill_open)
        rt_spill_close(&st->spill);
    if (st->tls.ssl)
        rt_tls_conn_close(&st->tls);
    if (st->sock)
        rt_sock_close(st->sock);
    free(st->in);
    free(st->scratch);
    rt_charge(self, -(ptrdiff_t)(st->incap + st->scratch_cap));
    set_state(st, RT_BRIDGE_DOWN);
    atomic_store(&st->b->inflight, 0);
    rt_pid_t me = rt_self(self);
    atomic_compare_exchange_strong(&st->b->pid, &me, 0);
}

/* A delivery left in the mailbox at the end: its publisher is told the copy is not kept. */
static void bridge_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_MSG_DELIVER || m->len < sizeof(rt_delivery_t))
        return;
    const rt_delivery_t *d = (const rt_delivery_t *)(const void *)m->data;
    rt_store_committed_t done = {.token = d->ack_token, .status = RT_ENOPROC};
    if (d->ack_pid)
        rt_send(d->ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
}

/* The turn's spilled messages go in one transaction; its packets leave as one TLS record. */
static void bridge_turn_end(rt_actor_t *self, void *state)
{
    bridge_t *st = state;
    if (st->to_spill) {
        spill_flush(self, st);
        pump(self, st);
    }
    if (st->tls.ssl && rt_tls_conn_flush(&st->tls) != 0)
        rt__bridge_error(st->b, "%s", "TLS: the stream broke");
}

static const char *bridge_tag_name(uint32_t tag)
{
    switch (tag) {
    case BRIDGE_RECONNECT:
        return "reconnect";
    case BRIDGE_CONNECT_TIMEOUT:
        return "connect_timeout";
    case BRIDGE_KEEPALIVE:
        return "keepalive";
    case BRIDGE_RESTART:
        return "restart";
    case RT_MSG_DELIVER:
        return "deliver";
    default:
        return "";
    }
}

const rt_actor_type_t rt__bridge_type = {
    .name = "bridge",
    .state_size = sizeof(bridge_t),
    .init = bridge_init,
    .handle = bridge_handle,
    .terminate = bridge_terminate,
    .dead_letter = bridge_dead_letter,
    .tag_name = bridge_tag_name,
    .turn_end = bridge_turn_end,
};

int rt__bridge_restart(rt_pid_t pid)
{
    return rt_send(pid, BRIDGE_RESTART, NULL, 0);
}

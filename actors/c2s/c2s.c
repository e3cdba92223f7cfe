/*
** The c2s actor (c2s.h): its socket and transport, its stream parser, its timers. What it
** does with the elements the stream delivers is in c2s_stream.c (stream level), c2s_sasl.c
** and c2s_session.c.
**
** Waiting. A SASL step that needs the store actor (credentials, a PLAIN password) stops the
** feed (RT_XML_STOP) and parsing waits for the answer: reading the socket pauses, and bytes
** the transport hands up meanwhile (a read's rest, TLS records decrypted together) are held
** on the heap, bounded by the stanza limit, and parsed once the answer came.
*/
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "c2s_impl.h"
#include "log.h"
#include "trace.h"

#define C2S_READS_PER_TURN 4

rt_c2s_stats_t rt_c2s_stats;

bool rt__c2s_framed(const c2s_t *c)
{
    return rt__c2s_listen(c)->websocket[0] != 0;
}

/* ---- Output ---- */

void rt__c2s_write(c2s_t *c, const void *p, size_t n)
{
    if (!c->sock || c->closing)
        return;
    if (rt_tracing() && c->jid)
        rt_trace_stanza(RT_TRACE_OUT, c->jid->s, rt_jid_len(c->jid), rt_jid_bare_len(c->jid), p, n);
    int rc = c->xp ? rt_xport_write(c->xp, c->sock, p, n) : rt_sock_write(c->sock, p, n);
    if (rc)
        c->closing = true; /* the stream is broken: the actor ends at its turn's end */
    else if (!c->slow_check && !c->shedding && rt_sock_pending(c->sock) > RT_SOCK_HIGH_WATER)
        c->slow_check =
            rt_send_after_tag(C2S_SLOW_MS, rt_self(rt_current()), C2S_MSG_SLOW_CHECK, NULL) == 0;
}

/* Behind on its output since the check was armed: rooms drop it rather than wait for it. */
static void on_slow_check(rt_actor_t *self, c2s_t *c)
{
    c->slow_check = false;
    if (!c->sock || c->shedding || rt_sock_pending(c->sock) <= RT_SOCK_HIGH_WATER)
        return;
    c->shedding = true;
    rt_shed(self, true);
    rt_sock_set_high_water(c->sock, C2S_SLOW_HIGH_WATER);
    rt_log(RT_LOG_WARNING, "xmpp.slow_client", "jid=%s unsent=%zu", c->jid ? c->jid->s : "-",
           rt_sock_pending(c->sock));
}

/* Its client read everything it was sent. */
static void caught_up(rt_actor_t *self, c2s_t *c)
{
    c->shedding = false;
    rt_shed(self, false);
    rt_sock_set_high_water(c->sock, 0);
    rt_log(RT_LOG_INFO, "xmpp.slow_client_caught_up", "jid=%s", c->jid ? c->jid->s : "-");
}

void rt__c2s_write_buf(c2s_t *c, rt_buf_t *b)
{
    if (b->oom)
        c->closing = true;
    else
        rt__c2s_write(c, b->data, b->len);
    rt_buf_free(b);
}

/* ---- The peer ---- */

int rt__c2s_peer_addr(const c2s_t *c, rt_auth_addr_t *out)
{
    if (rt_xport_real_peer(c->xp, out, NULL))
        return 0;
    return c->sock ? rt_auth_addr_from_fd(rt_sock_fd(c->sock), out, NULL) : RT_ENOTFOUND;
}

static void peer_format(const c2s_t *c, char *buf, size_t len)
{
    rt_xport_peer_format(c->xp, c->sock ? rt_sock_fd(c->sock) : -1, buf, len);
}

/* For log lines: formatted when asked (a session keeps no copy), valid until the next call on
   this thread. */
const char *rt__c2s_peer(rt_actor_t *self, c2s_t *c)
{
    (void)self;
    static _Thread_local char buf[INET6_ADDRSTRLEN + 8];
    peer_format(c, buf, sizeof(buf));
    return buf;
}

/* ---- The end ---- */

void rt__c2s_close_socket(c2s_t *c)
{
    if (!c->sock)
        return;
    rt_xport_flush(c->xp);
    if (c->xp)
        rt_xport_close(c->xp, c->sock);
    c->xp = NULL;
    rt_sock_close(c->sock);
    c->sock = NULL;
    rt__broker_count_socket(RT_CONF_XMPP_LISTENER(c->listener), -1);
}

void rt__c2s_close(rt_actor_t *self, c2s_t *c)
{
    if (!c->closing)
        c->closing = true;
    rt_exit(self, RT_REASON_NORMAL);
}

/* ---- Input ---- */

static void feed(rt_actor_t *self, c2s_t *c, const uint8_t *p, size_t n);

static bool hold(rt_actor_t *self, c2s_t *c, const uint8_t *p, size_t n)
{
    if (!n)
        return true;
    /* A stanza's worth and its header: what one feed may leave unparsed, and more than any
       honest client sends while its SASL step is answered. */
    if ((size_t)c->held_len + n > (size_t)rt__c2s.conf->max_stanza_size + RT_XML_MAX_HEADER_DEFAULT) {
        rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION,
                             "too much sent while authentication was answered");
        return false;
    }
    uint8_t *h = rt_realloc(self, c->held, c->held_len + n, RT_OBJ_LEAF);
    if (!h) {
        rt__c2s_stream_error(self, c, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
        return false;
    }
    memcpy(h + c->held_len, p, n);
    c->held = h;
    c->held_len += (uint32_t)n;
    return true;
}

void rt__c2s_wait(c2s_t *c)
{
    c->waiting = true;
    if (c->sock)
        rt_sock_pause_reading(c->sock, true);
}

static rt_xport_owner_t owner_of(c2s_t *c);

/* What the stream could not take: STARTTLS, a restart, an error, or a wait. */
static void after_feed(rt_actor_t *self, c2s_t *c, int rc, const uint8_t *p, size_t n,
                       size_t used)
{
    if (c->closing)
        return;
    if (rc == RT_EPROTO) {
        const char *text = NULL;
        rt_xml_cond_t cond = rt_xml_stream_error(&c->xs, &text);
        rt__c2s_stream_error(self, c, cond ? cond : RT_XML_COND_NOT_WELL_FORMED, text);
        return;
    }
    if (rc < 0) {
        rt__c2s_stream_error(self, c, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
        return;
    }
    if (c->starttls) {
        c->starttls = false;
        static const char proceed[] = "<proceed xmlns='" RT_XML_NS_TLS "'/>";
        rt_xport_owner_t o = owner_of(c);
        int trc = rt_xport_starttls(self, c->xp, &o, proceed, sizeof(proceed) - 1, n - used);
        if (trc) {
            /* RT_EPROTO: bytes came after the request (none parsed); the transport failed the
               stream (ops->fail) and the client is told so, in the clear (RFC 6120 5.4.2.2). */
            if (trc == RT_EPROTO) {
                static const char failure[] = "<failure xmlns='" RT_XML_NS_TLS "'/>";
                rt__c2s_write(c, failure, sizeof(failure) - 1);
                rt__c2s_stream_end(c);
            }
            rt__c2s_close(self, c);
            return;
        }
        c->secure = true;
        c->phase = PH_HEADER;
        rt_xml_stream_reset(&c->xs);
        return;
    }
    if (c->restart) { /* SASL succeeded: what follows is a new stream */
        c->restart = false;
        rt_xml_stream_reset(&c->xs);
        if (used < n)
            feed(self, c, p + used, n - used);
        return;
    }
    if (c->waiting && used < n)
        hold(self, c, p + used, n - used);
}

void rt__c2s_feed_more(rt_actor_t *self, c2s_t *c, const uint8_t *p, size_t n)
{
    feed(self, c, p, n);
}

static void feed(rt_actor_t *self, c2s_t *c, const uint8_t *p, size_t n)
{
    if (c->closing)
        return;
    if (c->waiting) {
        hold(self, c, p, n);
        return;
    }
    size_t used = 0;
    int rc = rt_xml_stream_feed(&c->xs, p, n, &used);
    after_feed(self, c, rc, p, n, used);
}

static void on_input(rt_actor_t *self, void *owner, const uint8_t *p, size_t n)
{
    c2s_t *c = owner;
    if (!rt__c2s_framed(c)) {
        feed(self, c, p, n);
        return;
    }
    /* RFC 7395: one element a message; gathered whole, then parsed. */
    size_t need = (size_t)c->frame_len + n;
    if (need > (size_t)rt__c2s.conf->max_stanza_size) {
        rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION, "stanza too large");
        return;
    }
    if (need > c->frame_cap) {
        size_t cap = c->frame_cap ? (size_t)c->frame_cap * 2 : 256;
        cap = cap < need ? need : cap;
        uint8_t *f = rt_realloc(self, c->frame, cap, RT_OBJ_LEAF);
        if (!f) {
            rt__c2s_stream_error(self, c, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
            return;
        }
        c->frame = f;
        c->frame_cap = (uint32_t)cap;
    }
    memcpy(c->frame + c->frame_len, p, n);
    c->frame_len += (uint32_t)n;
}

static void on_message_end(rt_actor_t *self, void *owner)
{
    c2s_t *c = owner;
    if (c->closing)
        return;
    if (c->waiting) { /* a frame while SASL waits: kept whole, with its end */
        rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION,
                             "a frame came before the last one was answered");
        return;
    }
    int rc = rt_xml_stream_frame(&c->xs, c->frame, c->frame_len);
    rt_free(self, c->frame);
    c->frame = NULL;
    c->frame_len = c->frame_cap = 0;
    if (c->restart) {
        c->restart = false;
        rt_xml_stream_reset(&c->xs);
    }
    after_feed(self, c, rc, NULL, 0, 0);
}

static bool taking(const void *owner)
{
    const c2s_t *c = owner;
    return c->sock && !c->closing && !c->dropped;
}

/* The connection is lost (a transport fault, or the client's end without a close). */
static void lost(rt_actor_t *self, c2s_t *c)
{
    if (!rt__c2s_sm_detach(self, c))
        rt__c2s_close(self, c);
}

/* Inside the transport's input: the loss is handled once it has returned (c2s_handle). */
static void on_fail(rt_actor_t *self, void *owner)
{
    (void)self;
    c2s_t *c = owner;
    c->dropped = true;
}

static void hold_input(void *owner)
{
    c2s_t *c = owner;
    if (c->sock)
        rt_sock_pause_reading(c->sock, true);
}

static void peer_text(const void *owner, char *buf, size_t len)
{
    peer_format(owner, buf, len);
}

static bool peer_named(rt_actor_t *self, void *owner, const rt_auth_addr_t *addr)
{
    (void)self;
    c2s_t *c = owner;
    return !rt__c2s.admit_peer || rt__c2s.admit_peer(rt_sock_fd(c->sock), addr);
}

static void preauth_refused(rt_actor_t *self, void *owner, size_t wanted)
{
    c2s_t *c = owner;
    rt_log(RT_LOG_WARNING, "xmpp.preauth_refused", "peer=%s wanted=%zu", rt__c2s_peer(self, c),
           wanted);
    rt__c2s_close(self, c);
}

static void tls_failed(void *owner)
{
    (void)owner;
    atomic_fetch_add_explicit(&rt_broker->stats.tls_failed, 1, memory_order_relaxed);
}

/* RFC 7395: text frames under the "xmpp" subprotocol, which a client must name. */
static const rt_ws_protocols_t xmpp_ws = {.names = {"xmpp"}, .required = true};

static const rt_xport_ops_t c2s_xport_ops = {
    .ws_protocols = &xmpp_ws,
    .ws_text = true,
    .input = on_input,
    .message_end = on_message_end,
    .taking = taking,
    .fail = on_fail,
    .hold_input = hold_input,
    .peer = peer_text,
    .peer_named = peer_named,
    .preauth_refused = preauth_refused,
    .tls_failed = tls_failed,
};

static rt_xport_owner_t owner_of(c2s_t *c)
{
    return (rt_xport_owner_t){.ops = &c2s_xport_ops,
                              .state = c,
                              .sock = c->sock,
                              .listen = rt__c2s_listen(c),
                              .max_message = (uint32_t)rt__c2s.conf->max_stanza_size};
}

static void on_readable(rt_actor_t *self, c2s_t *c)
{
    for (int i = 0; i < C2S_READS_PER_TURN && c->sock && !c->closing && !c->waiting; i++) {
        uint64_t paused;
        if (rt_xport_rate_hold(self, c->xp, c->sock, C2S_MSG_RATE_RESUME, &paused))
            return;
        const void *data;
        size_t len;
        int rc = rt_sock_read(c->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            lost(self, c);
            return;
        }
        c->last_rx_ms = rt_mono_ms();
        if (c->xp) {
            rt_xport_owner_t o = owner_of(c);
            rt_xport_input(self, c->xp, &o, (uint8_t *)(uintptr_t)data, len);
        } else {
            feed(self, c, data, len);
        }
    }
}

/* The store answered: parsing goes on with what was held, then reading. */
static void resume_parsing(rt_actor_t *self, c2s_t *c)
{
    if (c->waiting || c->closing || !c->sock)
        return;
    if (c->restart) { /* an answered SASL step succeeded (PLAIN, EXTERNAL): a new stream */
        c->restart = false;
        rt_xml_stream_reset(&c->xs);
    }
    rt_sock_pause_reading(c->sock, false);
    if (c->held_len) {
        uint8_t *h = c->held;
        uint32_t n = c->held_len;
        c->held = NULL;
        c->held_len = 0;
        feed(self, c, h, n);
        rt_free(self, h);
    }
    if (!c->closing && !c->waiting)
        on_readable(self, c);
}

/* ---- Stream callbacks ---- */

static int on_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    (void)ns;
    (void)nns;
    c2s_t *c = ctx;
    if (c->reopening)
        return 0;
    rt_actor_t *self = rt_current();
    const char *to = rt_xml_attr(hdr, "to");
    const char *version = rt_xml_attr(hdr, "version");
    int host = -1;
    rt_jid_buf_t jb;
    if (to && rt_jid_prep(to, strlen(to), &jb, NULL) == 0 && !jb.jid.local && !jb.jid.resource)
        host = rt__c2s_host_index(rt_jid_domain(&jb.jid), jb.jid.domain);
    if (host < 0 || (c->phase >= PH_AUTHED && host != c->host)) {
        c->host = 0;
        rt__c2s_stream_header(self, c);
        rt__c2s_stream_error(self, c, RT_XML_COND_HOST_UNKNOWN, "this server does not serve that domain");
        return RT_XML_STOP;
    }
    c->host = (uint8_t)host;
    if (!version || strtol(version, NULL, 10) < 1) {
        rt__c2s_stream_header(self, c);
        rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_VERSION, "version 1.0 is needed");
        return RT_XML_STOP;
    }
    rt__c2s_stream_header(self, c);
    rt__c2s_features(self, c);
    return c->closing ? RT_XML_STOP : 0;
}

/* What the client sent, written back from its tree (the parser keeps no bytes). */
static void trace_in(const c2s_t *c, const rt_xml_el_t *el)
{
    rt_buf_t b = {0};
    if (rt_xml_put_tree(&b, el, rt__c2s_framed(c) ? "" : RT_XML_NS_CLIENT) == 0)
        rt_trace_stanza(RT_TRACE_IN, c->jid->s, rt_jid_len(c->jid), rt_jid_bare_len(c->jid),
                        (const uint8_t *)b.data, b.len);
    rt_buf_free(&b);
}

static int on_stanza(void *ctx, rt_xml_el_t *el)
{
    c2s_t *c = ctx;
    rt_actor_t *self = rt_current();
    if (rt_tracing() && c->jid)
        trace_in(c, el);
    int rc = rt__c2s_on_top_level(self, c, el);
    rt_xml_free(&rt__c2s.stream_tcp.alloc, c, el);
    return c->closing || c->waiting || c->starttls || c->restart ? RT_XML_STOP : rc;
}

static int on_close(void *ctx)
{
    c2s_t *c = ctx;
    rt_actor_t *self = rt_current();
    rt__c2s_stream_end(c);
    rt__c2s_close(self, c);
    return RT_XML_STOP;
}

/* The stream's context is the session's state; what it allocates is the running actor's. */
static void *xml_alloc(void *ctx, size_t size, bool scan)
{
    (void)ctx;
    return rt_alloc(rt_current(), size, scan ? RT_OBJ_SCAN : RT_OBJ_LEAF);
}

static void xml_free(void *ctx, void *p)
{
    (void)ctx;
    rt_free(rt_current(), p);
}

static void xml_charge(void *ctx, ptrdiff_t delta)
{
    (void)ctx;
    rt_charge(rt_current(), delta);
}

int rt__c2s_stream_reopen(rt_actor_t *self, c2s_t *c)
{
    (void)self;
    rt_xml_stream_destroy(&c->xs);
    bool framed = rt__c2s_framed(c);
    int rc = rt_xml_stream_init(&c->xs, framed ? &rt__c2s.stream_ws : &rt__c2s.stream_tcp, c);
    if (rc)
        return rc;
    rt_buf_t b = {0};
    if (framed)
        rt_buf_printf(&b, "<open xmlns='%s' version='1.0'", RT_XML_NS_FRAMING);
    else
        rt_buf_printf(&b, "<stream:stream xmlns='%s' xmlns:stream='%s' version='1.0'",
                      RT_XML_NS_CLIENT, RT_XML_NS_STREAMS);
    rt_xml_put_attr(&b, "to", rt__c2s.conf->hosts[c->host]);
    rt_buf_printf(&b, framed ? "/>" : ">");
    c->reopening = true;
    rc = b.oom ? RT_ENOMEM
         : framed ? rt_xml_stream_frame(&c->xs, b.data, b.len)
                  : rt_xml_stream_feed(&c->xs, b.data, b.len, NULL);
    c->reopening = false;
    rt_buf_free(&b);
    return rc;
}

void rt__c2s_stream_configs(const rt_conf_xmpp_t *conf)
{
    rt_xml_stream_config_t base = {
        .alloc = {.alloc = xml_alloc, .free = xml_free},
        .charge = xml_charge,
        .on_header = on_header,
        .on_stanza = on_stanza,
        .on_close = on_close,
        .limits = {.max_stanza_bytes = (uint32_t)conf->max_stanza_size},
    };
    rt__c2s.stream_tcp = base;
    rt__c2s.stream_ws = base;
    rt__c2s.stream_ws.framed = true;
    rt__c2s_s2s_stream_config();
    rt__c2s_s2s_out_config(&rt__c2s.stream_s2s);
}

/* ---- The actor ---- */

static int c2s_init(rt_actor_t *self, void *state, void *arg)
{
    c2s_t *c = state;
    const rt_c2s_arg_t *a = arg;
    RT_ASSERT(a->listener < rt__c2s.conf->nlisteners);
    /* A login is background work until bound (c2s_session.c bind): a storm of them waits
       behind the bound sessions' traffic. */
    rt_set_priority(self, RT_PRIORITY_LOW);
    int rc = rt_sock_adopt(self, a->fd, &c->sock);
    if (rc)
        return rc;
    /* A lost connection's end (its unavailable to every contact, the rules' events, the
       close) waits behind the sessions still connected: when thousands drop at once it held
       every chat up for a quarter of a second in the one queue (docs/XMPP.md "Priority"). */
    rt_sock_low_at_hangup(c->sock);
    c->listener = (uint8_t)a->listener;
    const rt_listen_t *l = rt__c2s_listen(c);
    if (rt_xport_wanted(l)) {
        rc = rt_xport_start(&c2s_xport_ops, l, RT_CONF_XMPP_LISTENER(c->listener), c->sock,
                            l->starttls ? RT_XPORT_STARTTLS : 0, &c->xp);
        if (rc)
            return rc;
        c->secure = l->tls_on && !l->starttls;
    }
    /* Whether it may authenticate in plaintext is answered now, while accept's address is in
       hand (later it is a getpeername), unless a PROXY header or a trusted proxy's forwarded
       address may name another peer. */
    if (a->peer && !c->secure && !l->proxy_protocol && !l->ntrusted)
        c->plain_from = rt_conf_net_match(rt__c2s.conf->plaintext_from,
                                          rt__c2s.conf->nplaintext_from, a->peer->b)
                            ? C2S_PLAIN_YES
                            : C2S_PLAIN_NO;
    rc = rt_xml_stream_init(&c->xs, l->websocket[0] ? &rt__c2s.stream_ws : &rt__c2s.stream_tcp,
                            c);
    /* Without its timer a stream that never authenticates would stay until its peer left. */
    if (!rc && (rc = rt_send_after_tag((uint64_t)rt_broker->conf.connect_timeout * 1000,
                                       rt_self(self), C2S_MSG_CONNECT_TIMEOUT, NULL)) != 0)
        rt_xml_stream_destroy(&c->xs);
    if (rc) {
        rt_xport_free(c->xp);
        c->xp = NULL;
        return rc;
    }
    c->last_rx_ms = rt_mono_ms();
    rt__broker_count_socket(RT_CONF_XMPP_LISTENER(c->listener), +1);
    atomic_fetch_add_explicit(&rt_c2s_stats.sessions, 1, memory_order_relaxed);
    c->counted = true;
    return 0;
}

static void on_connect_timeout(rt_actor_t *self, c2s_t *c)
{
    if (c->phase == PH_ACTIVE || c->closing || !c->sock)
        return;
    atomic_fetch_add_explicit(&rt_c2s_stats.connect_timeouts, 1, memory_order_relaxed);
    char peer[INET6_ADDRSTRLEN + 8];
    peer_format(c, peer, sizeof(peer));
    rt_xport_log_timeout(c->xp, peer, rt_broker->conf.connect_timeout, "xmpp.connect_timeout");
    rt__c2s_stream_error(self, c, RT_XML_COND_CONNECTION_TIMEOUT, NULL);
}

void rt__c2s_idle_arm(rt_actor_t *self, c2s_t *c)
{
    long s = rt__c2s.conf->idle_timeout;
    if (s > 0)
        rt_send_after_tag((uint64_t)s * 1000, rt_self(self), C2S_MSG_IDLE, NULL);
}

/*
** A bound session silent for idle_timeout is pinged (XEP-0199) and, silent as long again,
** ended: a client that vanished without closing (a phone losing its network) holds no
** session, registry entry or presence for longer than twice the setting. One timer per
** session at a time, at the earliest moment the session could be idle.
*/
static void on_idle_check(rt_actor_t *self, c2s_t *c)
{
    if (c->phase != PH_ACTIVE || c->closing || !c->sock)
        return;
    uint64_t limit = (uint64_t)rt__c2s.conf->idle_timeout * 1000, quiet = rt_mono_ms() - c->last_rx_ms;
    if (quiet < limit) {
        c->pinged = false;
        rt_send_after_tag(limit - quiet, rt_self(self), C2S_MSG_IDLE, NULL);
        return;
    }
    if (c->pinged) {
        rt__c2s_stream_error(self, c, RT_XML_COND_CONNECTION_TIMEOUT, "no answer to a ping");
        return;
    }
    c->pinged = true;
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<iq type='get' id='idle-ping'");
    rt_xml_put_attr(&b, "from", rt__c2s.conf->hosts[c->host]);
    rt_xml_put_attr(&b, "to", c->jid->s);
    rt_buf_printf(&b, "><ping xmlns='urn:xmpp:ping'/></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
    rt_send_after_tag(limit, rt_self(self), C2S_MSG_IDLE, NULL);
}

/* Arms the hibernation timer for a bound session that has none on its way. */
static void hibernate_arm(rt_actor_t *self, c2s_t *c, uint64_t ms)
{
    if (c->phase != PH_ACTIVE || c->hibernate_armed)
        return;
    c->hibernate_armed = rt_send_after_tag(ms, rt_self(self), C2S_MSG_HIBERNATE, NULL) == 0;
}

static void on_hibernate(rt_actor_t *self, c2s_t *c)
{
    c->hibernate_armed = false;
    uint64_t quiet = rt_mono_ms() - c->last_active_ms;
    if (quiet < C2S_HIBERNATE_MS) {
        hibernate_arm(self, c, C2S_HIBERNATE_MS - quiet);
        return;
    }
    if (c->frame_len == 0 && c->frame) { /* a WebSocket message buffer with nothing in it */
        rt_free(self, c->frame);
        c->frame = NULL;
        c->frame_cap = 0;
    }
    /* Non-moving heaps compact by copying: the small objects a session keeps wait outside the
       heap while a collection drops every chunk left empty, then come back, into the header's
       block where they fit (a class's chunk is taken only when that block is full). */
    struct {
        void **p;
        size_t n;
        void *tmp;
    } keep[] = {{(void **)&c->jid, c->jid ? rt_jid_size(c->jid) : 0, NULL},
                {(void **)&c->pres, c->pres_len, NULL},
                {(void **)&c->roster, c->roster_len, NULL},
                {(void **)&c->blocked, c->blocked_len, NULL},
                {(void **)&c->directed, c->directed_len, NULL}};
    size_t nkeep = sizeof(keep) / sizeof(keep[0]);
    for (size_t i = 0; i < nkeep; i++) {
        if (!*keep[i].p || !keep[i].n || !(keep[i].tmp = malloc(keep[i].n)))
            continue;
        memcpy(keep[i].tmp, *keep[i].p, keep[i].n);
        rt_free(self, *keep[i].p);
        *keep[i].p = NULL;
    }
    rt_gc(self);
    for (size_t i = 0; i < nkeep; i++) {
        if (!keep[i].tmp)
            continue;
        void *q = rt_alloc(self, keep[i].n, RT_OBJ_LEAF);
        if (q) {
            memcpy(q, keep[i].tmp, keep[i].n);
        } else if (i == 0) { /* no room for its JID: the session ends, unbound by the copy */
            c->jid = keep[i].tmp;
            rt__c2s_session_end(self, c);
            c->jid = NULL;
            c->closing = true;
        } else { /* out of memory: its contacts get its presence again at the next one */
            c->pres_len = keep[i].p == (void **)&c->pres ? 0 : c->pres_len;
            c->roster_len = keep[i].p == (void **)&c->roster ? 0 : c->roster_len;
            c->roster_loaded = c->roster_loaded && keep[i].p != (void **)&c->roster;
            c->blocked_len = keep[i].p == (void **)&c->blocked ? 0 : c->blocked_len;
            c->block_loaded = c->block_loaded && keep[i].p != (void **)&c->blocked;
            c->directed_len = keep[i].p == (void **)&c->directed ? 0 : c->directed_len;
        }
        *keep[i].p = q;
        free(keep[i].tmp);
    }
    if (c->closing)
        rt_exit(self, RT_REASON_NORMAL);
}

static void c2s_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    c2s_t *c = state;
    if (m->tag != C2S_MSG_HIBERNATE) {
        c->last_active_ms = rt_mono_ms();
        hibernate_arm(self, c, C2S_HIBERNATE_MS);
    }
    if (rt__c2s_sm_forward(self, c, m)) { /* moved to another node: it went on there */
        if (c->closing)
            rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        uint32_t events = ((rt_sock_event_t *)(void *)m->data)->events;
        if ((events & RT_SOCK_WRITABLE) && c->shedding && c->sock)
            caught_up(self, c);
        if ((events & RT_SOCK_WRITABLE) && c->sock && c->xp && !c->waiting) {
            rt_sock_pause_reading(c->sock, false);
            rt_xport_owner_t o = owner_of(c);
            rt_xport_resume(self, c->xp, &o);
        }
        if ((events & RT_SOCK_READABLE) && c->sock)
            on_readable(self, c);
        break;
    }
    case C2S_MSG_STORE_REPLY:
        if (m->len >= sizeof(c2s_reply_t)) {
            const c2s_reply_t *r = (const void *)m->data;
            if (r->seq == c->seq && c->waiting && m->len - sizeof(*r) >= r->len) {
                if (C2S_OP_IS_REGISTER(r->op))
                    rt__c2s_register_reply(self, c, m);
                else
                    rt__c2s_sasl_reply(self, c, r);
                resume_parsing(self, c);
            }
        }
        break;
    case C2S_MSG_FAIL_DELAY:
        rt__c2s_sasl_fail_due(self, c);
        resume_parsing(self, c);
        break;
    case C2S_MSG_STANZA:
        rt__c2s_deliver(self, c, m);
        break;
    case C2S_MSG_SLOW_CHECK:
        on_slow_check(self, c);
        break;
    case C2S_MSG_ROSTER:
    case C2S_MSG_ROSTER_ITEM:
    case C2S_MSG_PROBE:
    case C2S_MSG_PRESENCE_TO:
    case C2S_MSG_PRESENCE_READY:
    case C2S_MSG_PRESENCE_STALE:
        rt__c2s_roster_msg(self, c, m);
        break;
    case C2S_MSG_BLOCKLIST:
        rt__c2s_blocklist_msg(self, c, m);
        break;
    case C2S_MSG_PEP_EVENT:
        rt__c2s_pep_event(self, c, m);
        break;
    case C2S_MSG_REPLACED:
        if (c->phase == PH_ACTIVE) {
            atomic_fetch_add_explicit(&rt_c2s_stats.replaced, 1, memory_order_relaxed);
            rt__c2s_stream_error(self, c, RT_XML_COND_CONFLICT, "replaced by a new session");
        }
        break;
    case C2S_MSG_KICK:
        rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION, "ended by the administrator");
        break;
    case C2S_MSG_ACCOUNT_GONE: /* XEP-0077 3.2: every session of a cancelled account ends */
        rt__c2s_stream_error(self, c, RT_XML_COND_NOT_AUTHORIZED, "the account was removed");
        break;
    case C2S_MSG_QUERY:
        rt__c2s_on_query(self, c, m);
        break;
    case C2S_MSG_CONNECT_TIMEOUT:
        on_connect_timeout(self, c);
        break;
    case C2S_MSG_IDLE:
        on_idle_check(self, c);
        break;
    case C2S_MSG_SM_ASK:
        rt__c2s_sm_asked(self, c, m);
        break;
    case C2S_MSG_SM_ANSWER:
        rt__c2s_sm_answered(self, c, m);
        resume_parsing(self, c);
        break;
    case C2S_MSG_SM_SOCKET:
        if (rt__c2s_sm_take_socket(self, c, m) == 0)
            on_readable(self, c);
        break;
    case C2S_MSG_SM_STATE:
        rt__c2s_sm_moved_in(self, c, m);
        resume_parsing(self, c);
        break;
    case C2S_MSG_SM_TIMEOUT:
        rt__c2s_sm_timeout(self, c);
        break;
    case C2S_MSG_HIBERNATE:
        on_hibernate(self, c);
        break;
    case C2S_MSG_RATE_RESUME:
        if (rt_xport_rate_resume(c->xp) && c->sock)
            on_readable(self, c);
        break;
    }
    if (c->dropped && !c->closing) {
        c->dropped = false;
        lost(self, c);
    }
    if (c->closing)
        rt_exit(self, RT_REASON_NORMAL);
}

static void c2s_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    c2s_t *c = state;
    rt_xport_flush(c->xp);
}

static void c2s_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)reason;
    c2s_t *c = state;
    rt__c2s_session_end(self, c);
    rt_xml_stream_destroy(&c->xs);
    rt__c2s_close_socket(c);
    if (c->counted)
        atomic_fetch_sub_explicit(&rt_c2s_stats.sessions, 1, memory_order_relaxed);
}

/* What the session never took: a message goes on to the user's other sessions or offline, an
   iq request's sender gets an error. */
static void c2s_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag == C2S_MSG_STANZA)
        rt__c2s_orphan(m, 0);
}

static const char *c2s_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case C2S_MSG_CONNECT_TIMEOUT:
        return "connect_timeout";
    case C2S_MSG_IDLE:
        return "idle_check";
    case C2S_MSG_SM_ASK:
        return "resume_ask";
    case C2S_MSG_SM_ANSWER:
        return "resume_answer";
    case C2S_MSG_SM_SOCKET:
        return "resume_socket";
    case C2S_MSG_SM_TIMEOUT:
        return "resume_timeout";
    case C2S_MSG_SM_STATE:
        return "resume_state";
    case C2S_MSG_HIBERNATE:
        return "hibernate";
    case C2S_MSG_SLOW_CHECK:
        return "slow_check";
    case C2S_MSG_STORE_REPLY:
        return "store_reply";
    case C2S_MSG_STANZA:
        return "stanza";
    case C2S_MSG_REPLACED:
        return "replaced";
    case C2S_MSG_FAIL_DELAY:
        return "auth_delay";
    case C2S_MSG_RATE_RESUME:
        return "rate_resume";
    case C2S_MSG_KICK:
        return "kick";
    case C2S_MSG_ACCOUNT_GONE:
        return "account_gone";
    case C2S_MSG_QUERY:
        return "query";
    case C2S_MSG_ROSTER:
        return "roster";
    case C2S_MSG_ROSTER_ITEM:
        return "roster_item";
    case C2S_MSG_PROBE:
        return "probe";
    case C2S_MSG_PRESENCE_TO:
        return "presence_to";
    case C2S_MSG_BLOCKLIST:
        return "blocklist";
    case C2S_MSG_PEP_EVENT:
        return "pep_event";
    case C2S_MSG_PRESENCE_READY:
        return "presence_ready";
    case C2S_MSG_PRESENCE_STALE:
        return "presence_stale";
    }
    return NULL;
}

const rt_actor_type_t rt_c2s_type = {
    .name = "c2s",
    .state_size = sizeof(c2s_t),
    .init = c2s_init,
    .handle = c2s_handle,
    .terminate = c2s_terminate,
    .tag_name = c2s_tag_name,
    .dead_letter = c2s_dead_letter,
    .turn_end = c2s_turn_end,
};

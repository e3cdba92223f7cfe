/*
** The outgoing server-to-server stream (c2s_s2s.c has the overview): one actor per pair of
** domains (one of hosts, another server's), named "s2s:local>remote", made by the first
** stanza for that pair. It connects to the address xmpp.s2s_peers gives, or else to those DNS
** gives (the resolver, c2s_s2s_dns.c; the next when one refuses), starts TLS when the other
** server offers it (required unless the address is in xmpp.plaintext_from), proves the
** local domain with SASL EXTERNAL when the other server offers it and this server has a
** certificate (the s2s listener's), else (or when EXTERNAL is refused) with a dialback key
** (XEP-0220), and then writes the stanzas it is handed, held
** meanwhile up to xmpp.s2s_queue_bytes. The same stream carries this server's <db:verify/>
** questions about keys another server's incoming stream was given.
**
** A stream that cannot be set up bounces what it holds (remote-server-not-found when it never
** connected, remote-server-timeout after) and stays for S2S_RETRY_MS, bouncing what comes,
** so that a server that is down costs one connection attempt a few seconds, not one a stanza.
*/
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "c2s_impl.h"
#include "log.h"
#include "srv.h"
#include "tls_conn.h"

#define NS_DIALBACK "jabber:server:dialback"
#define S2S_RETRY_MS 5000  /* a stream that failed bounces what comes this long, then ends */
#define S2S_IDLE_MS 600000 /* a ready stream that carried nothing this long ends */
#define S2S_VERIFIES 16    /* keys waiting to be asked about or answered */

enum {
    OUT_CONNECTING,
    OUT_FEATURES,
    OUT_STARTTLS,
    OUT_HANDSHAKE,
    OUT_SASL,    /* <auth mechanism='EXTERNAL'/> sent */
    OUT_RESTART, /* <success/> came: a new header goes out once the parser is free */
    OUT_DIALBACK,
    OUT_READY,
    OUT_DOWN
};

typedef struct {
    rt_pid_t in;
    uint8_t local;
    bool asked;
    char id[17];
    char key[C2S_S2S_KEY_HEX + 1];
} verify_t;

typedef struct s2s_out_s {
    char local[RT_CONF_XMPP_HOST_MAX], remote[RT_CONF_XMPP_HOST_MAX];
    rt_sock_t *sock;
    rt_tls_conn_t tls;
    rt_xml_stream_t xs;
    uint8_t phase;
    bool stream_init, counted, plain_ok, ever_ready, looking_up;
    bool external;            /* proved by SASL EXTERNAL: the stream after the restart is ready */
    uint8_t naddr, next_addr; /* the addresses to try, and the next to try */
    rt_xmpp_s2s_addr_t addr[RT_XMPP_S2S_ADDRS];
    const char *down_cond; /* what a stanza that comes while it is down is bounced with */
    char id[65];           /* the other server's stream id, which the key is made with */
    uint8_t *queue;        /* stanzas held until ready: a 4-byte length and the bytes, each */
    uint32_t qlen, qcap;
    uint64_t last_ms;
    c2s_s2s_entry_t entry; /* in rtctl xmpp servers' list */
    unsigned nverify;
    verify_t verify[S2S_VERIFIES];
} s2s_out_t;

static rt_xml_stream_config_t out_config;

/* What rtctl xmpp servers shows of it, changed (state: static text, NULL: as it was). */
static void listed_as(s2s_out_t *o, const char *state)
{
    rt__c2s_s2s_lock();
    rt_c2s_s2s_info_t *i = &o->entry.info;
    if (state)
        i->state = state;
    i->tls = o->tls.ssl != NULL;
    i->auth = o->phase == OUT_READY ? (o->external ? "external" : "dialback") : "";
    i->queued_bytes = o->qlen;
    rt__c2s_s2s_unlock();
}

static void out_write(s2s_out_t *o, const void *p, size_t n)
{
    if (!o->sock)
        return;
    int rc = o->tls.ssl ? rt_tls_conn_write(&o->tls, p, n) : rt_sock_write(o->sock, p, n);
    (void)rc; /* a broken stream shows as a read error next */
}

static void write_header(s2s_out_t *o)
{
    rt_buf_t b = {0};
    rt_buf_printf(&b,
                  "<?xml version='1.0'?><stream:stream xmlns='%s' xmlns:stream='%s' "
                  "xmlns:db='%s'",
                  RT_XML_NS_SERVER, RT_XML_NS_STREAMS, NS_DIALBACK);
    rt_xml_put_attr(&b, "from", o->local);
    rt_xml_put_attr(&b, "to", o->remote);
    rt_xml_put_attr(&b, "version", "1.0");
    rt_xml_put_start_end(&b);
    if (!b.oom)
        out_write(o, b.data, b.len);
    rt_buf_free(&b);
}

/* A stanza as a local session wrote it (jabber:client declared on it) in jabber:server. */
static void write_stanza(s2s_out_t *o, const uint8_t *p, size_t n)
{
    static const char client[] = " xmlns='" RT_XML_NS_CLIENT "'",
                      server[] = " xmlns='" RT_XML_NS_SERVER "'";
    const uint8_t *end = memchr(p, '>', n);
    const uint8_t *at = end ? memmem(p, (size_t)(end - p), client, sizeof(client) - 1) : NULL;
    if (at) {
        out_write(o, p, (size_t)(at - p));
        out_write(o, server, sizeof(server) - 1);
        at += sizeof(client) - 1;
        out_write(o, at, n - (size_t)(at - p));
    } else {
        out_write(o, p, n);
    }
    o->last_ms = rt_mono_ms();
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_stanzas_out, 1, memory_order_relaxed);
}

static void bounce(const uint8_t *p, size_t n, const char *cond)
{
    if (rt__c2s_bounce(p, n, cond))
        atomic_fetch_add_explicit(&rt_c2s_stats.s2s_bounced, 1, memory_order_relaxed);
}

static void answer_verify(verify_t *v, const char *remote, bool valid)
{
    size_t rlen = strlen(remote);
    rt_msg_t *m = rt_msg_new(C2S_MSG_S2S_VERIFIED, sizeof(c2s_s2s_verify_t) + rlen + 1);
    if (!m)
        return;
    c2s_s2s_verify_t *a = (c2s_s2s_verify_t *)(void *)m->data;
    memset(a, 0, sizeof(*a));
    a->in = v->in;
    a->valid = valid;
    a->local = v->local;
    memcpy(a->id, v->id, sizeof(a->id));
    memcpy(m->data + sizeof(*a), remote, rlen + 1);
    rt_send_msg(v->in, m);
}

/* What it holds goes back to its senders (cond), its verifications fail, the socket closes. */
static void drop_all(rt_actor_t *self, s2s_out_t *o, const char *cond)
{
    for (uint32_t at = 0; at + 4 <= o->qlen;) {
        uint32_t n;
        memcpy(&n, o->queue + at, 4);
        bounce(o->queue + at + 4, n, cond);
        at += 4 + n;
    }
    rt_free(self, o->queue);
    o->queue = NULL;
    o->qlen = o->qcap = 0;
    for (unsigned i = 0; i < o->nverify; i++)
        answer_verify(&o->verify[i], o->remote, false);
    o->nverify = 0;
    if (o->sock) {
        if (o->tls.ssl)
            rt_tls_conn_free(&o->tls);
        rt_sock_close(o->sock);
        o->sock = NULL;
    }
}

/* The stream cannot go on: it waits out S2S_RETRY_MS, bouncing what comes meanwhile. */
static void fail(rt_actor_t *self, s2s_out_t *o, const char *why)
{
    if (o->phase == OUT_DOWN)
        return;
    rt_log(RT_LOG_WARNING, "xmpp.server_out_failed", "local=%s remote=%s reason=%s held=%u",
           o->local, o->remote, why, o->qlen);
    o->down_cond = o->ever_ready || o->phase > OUT_CONNECTING ? "remote-server-timeout"
                                                              : "remote-server-not-found";
    drop_all(self, o, o->down_cond);
    o->phase = OUT_DOWN;
    listed_as(o, "down");
    rt_send_after_tag(S2S_RETRY_MS, rt_self(self), C2S_MSG_S2S_RETRY, NULL);
}

static void hold(rt_actor_t *self, s2s_out_t *o, const uint8_t *p, size_t n)
{
    uint32_t need = o->qlen + 4 + (uint32_t)n;
    if (need > (uint64_t)rt__c2s.conf->s2s_queue_bytes) {
        bounce(p, n, "resource-constraint");
        return;
    }
    if (need > o->qcap) {
        uint32_t cap = o->qcap ? o->qcap * 2 : 1024;
        cap = cap < need ? need : cap;
        uint8_t *q = rt_realloc(self, o->queue, cap, RT_OBJ_LEAF);
        if (!q) {
            bounce(p, n, "resource-constraint");
            return;
        }
        o->queue = q;
        o->qcap = cap;
    }
    uint32_t len = (uint32_t)n;
    memcpy(o->queue + o->qlen, &len, 4);
    memcpy(o->queue + o->qlen + 4, p, n);
    o->qlen = need;
    listed_as(o, NULL);
}

static void ask_verifies(s2s_out_t *o)
{
    for (unsigned i = 0; i < o->nverify; i++) {
        verify_t *v = &o->verify[i];
        if (v->asked)
            continue;
        rt_buf_t b = {0};
        rt_buf_printf(&b, "<db:verify");
        rt_xml_put_attr(&b, "from", rt__c2s_s2s_local_domain(v->local));
        rt_xml_put_attr(&b, "to", o->remote);
        rt_xml_put_attr(&b, "id", v->id);
        rt_xml_put_start_end(&b);
        rt_buf_printf(&b, "%s</db:verify>", v->key);
        if (!b.oom)
            out_write(o, b.data, b.len);
        rt_buf_free(&b);
        v->asked = true;
    }
}

static void start_dialback(s2s_out_t *o)
{
    o->phase = OUT_DIALBACK;
    ask_verifies(o);
    char key[C2S_S2S_KEY_HEX + 1];
    rt__c2s_s2s_key(o->remote, o->local, o->id, key);
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<db:result");
    rt_xml_put_attr(&b, "from", o->local);
    rt_xml_put_attr(&b, "to", o->remote);
    rt_buf_printf(&b, ">%s</db:result>", key);
    if (!b.oom)
        out_write(o, b.data, b.len);
    rt_buf_free(&b);
}

static void ready(rt_actor_t *self, s2s_out_t *o)
{
    o->phase = OUT_READY;
    o->ever_ready = true;
    rt_log(RT_LOG_INFO, "xmpp.server_out", "local=%s remote=%s tls=%s auth=%s", o->local, o->remote,
           o->tls.ssl ? "yes" : "no", o->external ? "external" : "dialback");
    for (uint32_t at = 0; at + 4 <= o->qlen;) {
        uint32_t n;
        memcpy(&n, o->queue + at, 4);
        write_stanza(o, o->queue + at + 4, n);
        at += 4 + n;
    }
    rt_free(self, o->queue);
    o->queue = NULL;
    o->qlen = o->qcap = 0;
    listed_as(o, "ready");
    o->last_ms = rt_mono_ms();
    rt_send_after_tag(S2S_IDLE_MS, rt_self(self), C2S_MSG_S2S_IDLE, NULL);
}

/* <proceed/>: the client side of TLS on the socket, its handshake begun. */
static void start_tls(rt_actor_t *self, s2s_out_t *o)
{
    SSL *ssl = rt__c2s_s2s_ssl_new();
    if (!ssl || SSL_set_tlsext_host_name(ssl, o->remote) != 1 ||
        (rt__c2s.conf->s2s_secure && SSL_set1_host(ssl, o->remote) != 1) ||
        rt_tls_conn_attach(&o->tls, ssl, o->sock) != 0) {
        if (ssl && !o->tls.ssl)
            SSL_free(ssl);
        fail(self, o, "TLS: no memory");
        return;
    }
    char why[256] = "";
    if (rt_tls_conn_input(&o->tls, NULL, 0, NULL, NULL, why, sizeof(why)) != 0) {
        fail(self, o, why);
        return;
    }
    o->phase = OUT_HANDSHAKE;
}

static int out_on_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    (void)ns;
    (void)nns;
    s2s_out_t *o = ctx;
    const char *id = rt_xml_attr(hdr, "id"), *version = rt_xml_attr(hdr, "version");
    if (!id || strlen(id) >= sizeof(o->id)) {
        fail(rt_current(), o, "the other server's header has no usable id");
        return RT_XML_STOP;
    }
    snprintf(o->id, sizeof(o->id), "%s", id);
    if (version && strtol(version, NULL, 10) >= 1)
        o->phase = OUT_FEATURES;
    else if (rt__c2s.conf->s2s_secure) /* pre-1.0: no features, no SASL */
        fail(rt_current(), o, "the other server is too old for certificates (xmpp.s2s_secure)");
    else
        start_dialback(o); /* no features to wait for */
    return 0;
}

/* Whether the features offer SASL EXTERNAL and this server has a certificate to show. */
static bool external_offered(const s2s_out_t *o, const rt_xml_el_t *features)
{
    const rt_xml_el_t *mechs = rt_xml_child(features, "mechanisms", RT_XML_NS_SASL);
    if (!o->tls.ssl || !mechs || !SSL_get_certificate(o->tls.ssl))
        return false;
    for (const rt_xml_el_t *m = rt_xml_child(mechs, "mechanism", RT_XML_NS_SASL); m;
         m = rt_xml_next(m, "mechanism", RT_XML_NS_SASL)) {
        const char *name = rt_xml_text(m, NULL);
        if (name && strcmp(name, "EXTERNAL") == 0)
            return true;
    }
    return false;
}

static void on_features(rt_actor_t *self, s2s_out_t *o, const rt_xml_el_t *el)
{
    if (o->external) { /* the stream after EXTERNAL's restart */
        ready(self, o);
    } else if (rt_xml_child(el, "starttls", RT_XML_NS_TLS) && !o->tls.ssl) {
        static const char starttls[] = "<starttls xmlns='" RT_XML_NS_TLS "'/>";
        out_write(o, starttls, sizeof(starttls) - 1);
        o->phase = OUT_STARTTLS;
    } else if (!o->tls.ssl && (!o->plain_ok || rt__c2s.conf->s2s_secure)) {
        fail(self, o, "the other server offers no TLS");
    } else if (external_offered(o, el)) {
        /* RFC 6120 6.3.8: the authorization identity is the domain this stream is from */
        char b64[RT_BASE64_LEN(RT_CONF_XMPP_HOST_MAX) + 1];
        rt_base64_encode(o->local, strlen(o->local), b64);
        rt_buf_t b = {0};
        rt_buf_printf(&b, "<auth xmlns='%s' mechanism='EXTERNAL'>%s</auth>", RT_XML_NS_SASL, b64);
        if (!b.oom)
            out_write(o, b.data, b.len);
        rt_buf_free(&b);
        o->phase = OUT_SASL;
    } else if (rt__c2s.conf->s2s_secure) {
        fail(self, o, "the other server offers no SASL EXTERNAL (xmpp.s2s_secure)");
    } else {
        start_dialback(o);
    }
}

static void on_db_verify(s2s_out_t *o, const rt_xml_el_t *el)
{
    const char *id = rt_xml_attr(el, "id"), *type = rt_xml_attr(el, "type");
    for (unsigned i = 0; id && i < o->nverify; i++) {
        if (!o->verify[i].asked || strcmp(o->verify[i].id, id) != 0)
            continue;
        answer_verify(&o->verify[i], o->remote, type && strcmp(type, "valid") == 0);
        o->verify[i] = o->verify[--o->nverify];
        return;
    }
}

static int out_on_stanza(void *ctx, rt_xml_el_t *el)
{
    s2s_out_t *o = ctx;
    rt_actor_t *self = rt_current();
    int rc = 0;
    if (strcmp(el->ns, RT_XML_NS_STREAMS) == 0 && strcmp(el->name, "features") == 0 &&
        o->phase == OUT_FEATURES) {
        on_features(self, o, el);
    } else if (strcmp(el->ns, RT_XML_NS_TLS) == 0 && strcmp(el->name, "proceed") == 0 &&
               o->phase == OUT_STARTTLS) {
        start_tls(self, o);
        rc = RT_XML_STOP; /* what follows is TLS */
    } else if (strcmp(el->ns, NS_DIALBACK) == 0 && strcmp(el->name, "result") == 0 &&
               o->phase == OUT_DIALBACK) {
        const char *type = rt_xml_attr(el, "type");
        if (type && strcmp(type, "valid") == 0) {
            ready(self, o);
        } else {
            atomic_fetch_add_explicit(&rt_c2s_stats.s2s_dialback_failed, 1, memory_order_relaxed);
            fail(self, o, "the other server did not take this server's dialback key");
        }
    } else if (strcmp(el->ns, RT_XML_NS_SASL) == 0 && o->phase == OUT_SASL) {
        if (strcmp(el->name, "success") == 0) {
            o->external = true;
            o->phase = OUT_RESTART;
            atomic_fetch_add_explicit(&rt_c2s_stats.s2s_external_ok, 1, memory_order_relaxed);
            rc = RT_XML_STOP; /* a new stream begins */
        } else {              /* <failure/>: the other server did not take the certificate */
            atomic_fetch_add_explicit(&rt_c2s_stats.s2s_external_failed, 1, memory_order_relaxed);
            rt_log(RT_LOG_WARNING, "xmpp.server_external_failed", "from=%s to=%s", o->local,
                   o->remote);
            if (rt__c2s.conf->s2s_secure)
                fail(self, o, "the other server refused this server's certificate");
            else
                start_dialback(o);
        }
    } else if (strcmp(el->ns, NS_DIALBACK) == 0 && strcmp(el->name, "verify") == 0) {
        on_db_verify(o, el);
    } else if (strcmp(el->ns, RT_XML_NS_STREAMS) == 0 && strcmp(el->name, "error") == 0) {
        const rt_xml_el_t *cond = rt_xml_first(el);
        char why[128];
        snprintf(why, sizeof(why), "stream error %s", cond ? cond->name : "?");
        fail(self, o, why);
    } else if (strcmp(el->ns, RT_XML_NS_TLS) == 0) {
        fail(self, o, "the other server refused TLS");
    }
    rt_xml_free(&out_config.alloc, o, el);
    return o->phase == OUT_DOWN ? RT_XML_STOP : rc;
}

static int out_on_close(void *ctx)
{
    s2s_out_t *o = ctx;
    fail(rt_current(), o, "the other server closed the stream");
    return RT_XML_STOP;
}

static void feed(rt_actor_t *self, s2s_out_t *o, const uint8_t *p, size_t n)
{
    if (o->phase == OUT_DOWN)
        return;
    int rc = rt_xml_stream_feed(&o->xs, p, n, NULL);
    if (rc == RT_EPROTO && o->phase != OUT_DOWN) {
        const char *text = NULL;
        rt_xml_cond_t cond = rt_xml_stream_error(&o->xs, &text);
        char why[160];
        snprintf(why, sizeof(why), "the other server's stream: %s %s", rt_xml_cond_name(cond),
                 text ? text : "");
        fail(self, o, why);
    } else if (rc < 0 && o->phase != OUT_DOWN) {
        fail(self, o, "no memory for the stream");
    } else if (o->phase == OUT_RESTART) { /* RFC 6120 6.4.6: after SASL, a new stream */
        rt_xml_stream_reset(&o->xs);
        o->phase = OUT_FEATURES;
        write_header(o);
    }
}

typedef struct {
    rt_actor_t *self;
    s2s_out_t *o;
} plain_t;

static bool on_plain(void *ctx, uint8_t *p, size_t n)
{
    plain_t *c = ctx;
    feed(c->self, c->o, p, n);
    return c->o->phase != OUT_DOWN;
}

static int connect_next(rt_actor_t *self, s2s_out_t *o);

static void on_readable(rt_actor_t *self, s2s_out_t *o)
{
    const void *data;
    size_t len;
    int rc;
    while (o->sock && o->phase != OUT_DOWN && (rc = rt_sock_read(o->sock, &data, &len)) == 0) {
        if (!o->tls.ssl) {
            feed(self, o, data, len);
            continue;
        }
        plain_t c = {self, o};
        char why[256] = "";
        int trc = rt_tls_conn_input(&o->tls, data, len, on_plain, &c, why, sizeof(why));
        if (trc) {
            fail(self, o, trc == RT_EPROTO ? why : "the other server ended TLS");
            return;
        }
        if (o->phase == OUT_HANDSHAKE && rt_tls_conn_established(&o->tls)) {
            rt_xml_stream_reset(&o->xs);
            o->phase = OUT_FEATURES;
            write_header(o);
        }
    }
    if (!o->sock || o->phase == OUT_DOWN || rc == RT_EAGAIN)
        return;
    if (o->phase == OUT_CONNECTING && o->next_addr < o->naddr) {
        rt_sock_close(o->sock); /* refused before a byte came: the next address */
        o->sock = NULL;
        if (connect_next(self, o) == 0)
            return;
    }
    fail(self, o, o->phase == OUT_CONNECTING ? "connection refused" : "connection lost");
}

/* Connects to the next address: 0, or RT_ENOTFOUND when none is left to try. */
static int connect_next(rt_actor_t *self, s2s_out_t *o)
{
    while (o->next_addr < o->naddr) {
        const rt_xmpp_s2s_addr_t *to = &o->addr[o->next_addr++];
        rt_auth_addr_t a;
        o->plain_ok =
            rt_auth_addr_from_sockaddr(&to->addr, &a) == 0 &&
            rt_conf_net_match(rt__c2s.conf->plaintext_from, rt__c2s.conf->nplaintext_from, a.b);
        int fd = socket(to->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if ((connect(fd, (const struct sockaddr *)&to->addr, to->len) < 0 &&
             errno != EINPROGRESS) ||
            rt_sock_adopt(self, fd, &o->sock) != 0) {
            close(fd);
            o->sock = NULL;
            continue;
        }
        /* The header waits in the socket's buffer until the connect completes; a refused
           connect shows as a read error (and the next address is tried), one that hangs
           meets the timeout. */
        write_header(o);
        rt__c2s_s2s_lock();
        rt_auth_sockaddr_format(&to->addr, o->entry.info.peer, sizeof(o->entry.info.peer));
        rt__c2s_s2s_unlock();
        return 0;
    }
    return RT_ENOTFOUND;
}

/* Where to connect: xmpp.s2s_peers' address at once, else the resolver is asked. */
static void find_address(rt_actor_t *self, s2s_out_t *o)
{
    unsigned len;
    if (rt__c2s_s2s_peer(o->remote, &o->addr[0].addr, &len) == 0) {
        o->addr[0].len = len;
        o->naddr = 1;
        if (connect_next(self, o) != 0)
            fail(self, o, "cannot connect (no socket)");
        return;
    }
    int rc = rt__c2s.conf->s2s_dns ? rt__c2s_s2s_resolve(o->remote) : RT_ENOTFOUND;
    if (rc == 0)
        o->looking_up = true;
    else
        fail(self, o,
             rc == RT_ELIMIT ? "too many DNS lookups waiting"
                             : "no address for the domain (xmpp.s2s_peers, xmpp.s2s_dns)");
}

static void on_resolved(rt_actor_t *self, s2s_out_t *o, const rt_msg_t *m)
{
    if (!o->looking_up || m->len < offsetof(rt_xmpp_s2s_found_t, a))
        return;
    o->looking_up = false;
    const rt_xmpp_s2s_found_t *r = (const void *)m->data;
    size_t n = r->rc > 0 ? (size_t)r->rc : 0;
    if (n > RT_XMPP_S2S_ADDRS || m->len < offsetof(rt_xmpp_s2s_found_t, a) + n * sizeof(r->a[0]))
        return;
    if (o->phase != OUT_CONNECTING)
        return; /* failed meanwhile (its time ran out) */
    memcpy(o->addr, r->a, n * sizeof(r->a[0]));
    o->naddr = (uint8_t)n;
    if (r->rc == RT_ENOTFOUND)
        fail(self, o, "the domain offers no server-to-server service (DNS)");
    else if (connect_next(self, o) != 0)
        fail(self, o, n ? "connection refused" : "no address for the domain (DNS)");
}

static int out_init(rt_actor_t *self, void *state, void *arg)
{
    s2s_out_t *o = state;
    const c2s_s2s_out_arg_t *a = arg;
    snprintf(o->local, sizeof(o->local), "%s", a->local);
    snprintf(o->remote, sizeof(o->remote), "%s", a->remote);
    int rc = rt_xml_stream_init(&o->xs, &out_config, o);
    if (rc)
        return rc;
    /* A failed init leaves nothing behind (no terminate runs): what can fail goes first. */
    if ((rc = rt_send(rt_self(self), C2S_MSG_S2S_TIMEOUT, NULL, 0)) != 0) { /* connect soon */
        rt_xml_stream_destroy(&o->xs);
        return rc;
    }
    o->stream_init = o->counted = true;
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_out, 1, memory_order_relaxed);
    rt_c2s_s2s_info_t *i = &o->entry.info;
    i->pid = rt_self(self);
    i->state = "connecting";
    i->auth = "";
    i->since_ms = rt_mono_ms();
    snprintf(i->local, sizeof(i->local), "%s", o->local);
    snprintf(i->remote, sizeof(i->remote), "%s", o->remote);
    rt__c2s_s2s_listed(&o->entry, true);
    return 0;
}

static void on_verify_asked(s2s_out_t *o, const rt_msg_t *m)
{
    if (m->len < sizeof(c2s_s2s_verify_t))
        return;
    const c2s_s2s_verify_t *v = (const void *)m->data;
    verify_t nv = {.in = v->in, .local = v->local};
    memcpy(nv.id, v->id, sizeof(nv.id));
    nv.id[sizeof(nv.id) - 1] = 0;
    memcpy(nv.key, v->key, sizeof(nv.key));
    nv.key[sizeof(nv.key) - 1] = 0;
    if (o->phase == OUT_DOWN || o->nverify == S2S_VERIFIES) {
        answer_verify(&nv, o->remote, false);
        return;
    }
    o->verify[o->nverify++] = nv;
    if (o->phase == OUT_DIALBACK || o->phase == OUT_READY)
        ask_verifies(o);
}

static void out_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    s2s_out_t *o = state;
    switch (m->tag) {
    case RT_MSG_SOCKET:
        if (((rt_sock_event_t *)(void *)m->data)->events & RT_SOCK_READABLE)
            on_readable(self, o);
        break;
    case C2S_MSG_S2S_OUT:
        if (o->phase == OUT_READY)
            write_stanza(o, m->data, m->len);
        else if (o->phase == OUT_DOWN)
            bounce(m->data, m->len, o->down_cond);
        else
            hold(self, o, m->data, m->len);
        break;
    case C2S_MSG_S2S_VERIFY:
        on_verify_asked(o, m);
        break;
    case C2S_MSG_S2S_RESOLVED:
        on_resolved(self, o, m);
        break;
    case C2S_MSG_S2S_TIMEOUT:
        if (o->phase == OUT_CONNECTING && !o->sock && !o->naddr && !o->looking_up) {
            /* the first: the lookup and the connect share connect_timeout */
            rt_send_after_tag((uint64_t)rt_broker->conf.connect_timeout * 1000, rt_self(self),
                              C2S_MSG_S2S_TIMEOUT, NULL);
            find_address(self, o);
        } else if (o->phase != OUT_READY && o->phase != OUT_DOWN) {
            fail(self, o, "not ready in time (connect_timeout)");
        }
        break;
    case C2S_MSG_S2S_IDLE:
        if (o->phase == OUT_READY) {
            uint64_t quiet = rt_mono_ms() - o->last_ms;
            if (quiet >= S2S_IDLE_MS) {
                out_write(o, "</stream:stream>", 16);
                rt_exit(self, RT_REASON_NORMAL);
            } else {
                rt_send_after_tag(S2S_IDLE_MS - quiet, rt_self(self), C2S_MSG_S2S_IDLE, NULL);
            }
        }
        break;
    case C2S_MSG_S2S_RETRY:
        rt_exit(self, RT_REASON_NORMAL);
        break;
    }
}

static void out_turn_end(rt_actor_t *self, void *state)
{
    s2s_out_t *o = state;
    if (o->tls.ssl && rt_tls_conn_flush(&o->tls) != 0)
        fail(self, o, "TLS: the stream broke");
}

static void out_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)reason;
    s2s_out_t *o = state;
    drop_all(self, o, "remote-server-timeout");
    if (o->stream_init)
        rt_xml_stream_destroy(&o->xs);
    if (o->counted)
        atomic_fetch_sub_explicit(&rt_c2s_stats.s2s_out, 1, memory_order_relaxed);
    rt__c2s_s2s_listed(&o->entry, false);
}

/* What came after the end: stanzas go back to their senders, verifications fail. */
static void out_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag == C2S_MSG_S2S_OUT)
        bounce(m->data, m->len, "remote-server-timeout");
    else if (m->tag == C2S_MSG_S2S_VERIFY && m->len >= sizeof(c2s_s2s_verify_t)) {
        const c2s_s2s_verify_t *v = (const void *)m->data;
        verify_t nv = {.in = v->in, .local = v->local};
        memcpy(nv.id, v->id, sizeof(nv.id));
        answer_verify(&nv, "", false);
    }
}

static const char *out_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case C2S_MSG_S2S_OUT:
        return "stanza";
    case C2S_MSG_S2S_VERIFY:
        return "verify";
    case C2S_MSG_S2S_RESOLVED:
        return "resolved";
    case C2S_MSG_S2S_TIMEOUT:
        return "connect_timeout";
    case C2S_MSG_S2S_IDLE:
        return "idle_check";
    case C2S_MSG_S2S_RETRY:
        return "retry";
    }
    return NULL;
}

const rt_actor_type_t rt__c2s_s2s_out_type = {
    .name = "s2s_out",
    .state_size = sizeof(s2s_out_t),
    .init = out_init,
    .handle = out_handle,
    .terminate = out_terminate,
    .dead_letter = out_dead_letter,
    .tag_name = out_tag_name,
    .turn_end = out_turn_end,
};

void rt__c2s_s2s_out_config(const rt_xml_stream_config_t *base)
{
    out_config = *base;
    out_config.on_header = out_on_header;
    out_config.on_stanza = out_on_stanza;
    out_config.on_close = out_on_close;
}

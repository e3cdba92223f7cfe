/*
** Federation (RFC 6120 server-to-server, XEP-0220 dialback): what both directions share, and
** the incoming stream's actor. docs/XMPP.md, "Federation", says what is in and what is not.
**
** An incoming stream (s2s_in, one per connection another server made to an s2s listener)
** takes that server's <db:result/> for a pair of domains (one of ours, one of its), asks the
** authoritative server through this server's outgoing stream to that domain whether the key
** is one it gave (<db:verify/>), and lets stanzas of that pair through once it said so. The
** same stream answers the other server's own <db:verify/> questions about the keys this
** server gave on its outgoing streams. Stanzas that came in are delivered as a local session's
** would be; what is answered to them goes back through the outgoing stream to their domain.
**
** TLS: an s2s listener with starttls offers it; dialback and stanzas are taken without it only
** from xmpp.plaintext_from (loopback by default), as SASL is on client streams.
*/
#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "broker.h"
#include "c2s_impl.h"
#include "log.h"

#define NS_DIALBACK "jabber:server:dialback"
#define NS_DIALBACK_FEATURE "urn:xmpp:features:dialback"
#define S2S_IN_PAIRS 4     /* domain pairs one incoming stream may carry (XEP-0220 2.6) */
#define S2S_IDLE_MS 600000 /* a stream that carried nothing this long ends (ejabberd: 10 min) */

static uint8_t secret[32]; /* this run's dialback secret: keys are checked while it runs */
static SSL_CTX *client_tls;
static pthread_mutex_t client_tls_lock = PTHREAD_MUTEX_INITIALIZER;
static bool federating;

bool rt__c2s_s2s_on(void)
{
    return federating;
}

SSL *rt__c2s_s2s_ssl_new(void)
{
    pthread_mutex_lock(&client_tls_lock); /* a reload swaps client_tls: SSL_new takes a ref */
    SSL *ssl = client_tls ? SSL_new(client_tls) : NULL;
    pthread_mutex_unlock(&client_tls_lock);
    return ssl;
}

/*
** The client side of TLS for outgoing streams. The other server's certificate is not checked
** (unless xmpp.s2s_secure): dialback proves its domain through DNS and the key, as it proves
** this one's. This server shows the first s2s listener's certificate, for SASL EXTERNAL where
** the other server trusts its CA. NULL and err on failure.
*/
static SSL_CTX *build_client_tls(const rt_conf_xmpp_t *x, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx || SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        SSL_CTX_free(ctx);
        snprintf(err, errlen, "xmpp: no TLS client context for federation");
        return NULL;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    const rt_conf_tls_t *own = NULL;
    for (unsigned i = 0; i < x->nlisteners && !own; i++)
        if (x->listeners[i].s2s && x->listeners[i].tls_on && x->listeners[i].tls.cert[0])
            own = &x->listeners[i].tls;
    if (x->s2s_secure) { /* the other server's certificate must prove it (start_tls names it) */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (own && own->ca[0] ? SSL_CTX_load_verify_locations(ctx, own->ca, NULL) != 1
                              : SSL_CTX_set_default_verify_paths(ctx) != 1) {
            SSL_CTX_free(ctx);
            snprintf(err, errlen, "xmpp.s2s_secure: cannot load %s",
                     own && own->ca[0] ? own->ca : "the system's CAs");
            return NULL;
        }
    }
    if (own && (SSL_CTX_use_certificate_chain_file(ctx, own->cert) != 1 ||
                SSL_CTX_use_PrivateKey_file(ctx, own->key, SSL_FILETYPE_PEM) != 1)) {
        SSL_CTX_free(ctx);
        snprintf(err, errlen, "xmpp: cannot load %s for federation's outgoing streams", own->cert);
        return NULL;
    }
    return ctx;
}

int rt__c2s_s2s_start(const rt_conf_xmpp_t *x, char *err, size_t errlen)
{
    for (unsigned i = 0; i < x->nlisteners; i++)
        federating = federating || x->listeners[i].s2s;
    if (!federating || client_tls)
        return 0;
    if (RAND_bytes(secret, sizeof(secret)) != 1) {
        snprintf(err, errlen, "xmpp: no random bytes for the dialback secret");
        return RT_EAGAIN;
    }
    client_tls = build_client_tls(x, err, errlen);
    return client_tls ? 0 : RT_EINVAL;
}

int rt_c2s_s2s_reload_tls(char *err, size_t errlen)
{
    if (!federating || !client_tls)
        return 0;
    SSL_CTX *fresh = build_client_tls(rt__c2s.conf, err, errlen);
    if (!fresh) {
        rt_log(RT_LOG_ERROR, "tls.reload_failed", "listener=%s reason=%s", "s2s-out", err);
        return RT_EINVAL;
    }
    pthread_mutex_lock(&client_tls_lock);
    SSL_CTX *old = client_tls;
    client_tls = fresh;
    pthread_mutex_unlock(&client_tls_lock);
    SSL_CTX_free(old); /* streams set up with it keep their own references */
    rt_log(RT_LOG_INFO, "tls.reloaded", "listener=%s", "s2s-out");
    return 0;
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = 0;
}

/* XEP-0185: HMAC-SHA256(hex(SHA256(secret)), "receiving originating id"), in hex. */
void rt__c2s_s2s_key(const char *receiving, const char *originating, const char *id, char *out)
{
    uint8_t digest[32], mac[32];
    char key[65], text[2 * RT_CONF_XMPP_HOST_MAX + 40];
    unsigned maclen = 0;
    SHA256(secret, sizeof(secret), digest);
    hex(digest, sizeof(digest), key);
    int n = snprintf(text, sizeof(text), "%s %s %s", receiving, originating, id);
    if (n < 0 || (size_t)n >= sizeof(text) ||
        !HMAC(EVP_sha256(), key, 64, (const uint8_t *)text, (size_t)n, mac, &maclen)) {
        RAND_bytes(mac, sizeof(mac)); /* a key nobody can match */
        maclen = sizeof(mac);
    }
    hex(mac, 32, out);
    OPENSSL_cleanse(key, sizeof(key));
}

int rt__c2s_s2s_peer(const char *remote, struct sockaddr_storage *addr, unsigned *len)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    size_t rlen = strlen(remote);
    for (unsigned i = 0; i < x->ns2s_peers; i++) {
        const char *p = x->s2s_peers[i], *eq = strchr(p, '=');
        if (!eq || (size_t)(eq - p) != rlen || memcmp(p, remote, rlen) != 0)
            continue;
        char host[64];
        const char *h = eq + 1, *colon;
        size_t hlen;
        if (*h == '[') {
            const char *close = strchr(h, ']');
            if (!close)
                return RT_ENOTFOUND;
            hlen = (size_t)(close - h - 1);
            h++;
            colon = close + 1;
        } else {
            colon = strrchr(h, ':');
            hlen = colon ? (size_t)(colon - h) : 0;
        }
        if (!colon || *colon != ':' || hlen >= sizeof(host))
            return RT_ENOTFOUND;
        memcpy(host, h, hlen);
        host[hlen] = 0;
        int port = atoi(colon + 1);
        memset(addr, 0, sizeof(*addr));
        struct sockaddr_in *a4 = (struct sockaddr_in *)(void *)addr;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)(void *)addr;
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = htons((uint16_t)port);
            *len = sizeof(*a4);
        } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((uint16_t)port);
            *len = sizeof(*a6);
        } else {
            return RT_ENOTFOUND;
        }
        return 0;
    }
    return RT_ENOTFOUND;
}

/* ---- The list of streams (rtctl xmpp servers) ---- */

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static c2s_s2s_entry_t *list_head;

void rt__c2s_s2s_lock(void)
{
    pthread_mutex_lock(&list_lock);
}

void rt__c2s_s2s_unlock(void)
{
    pthread_mutex_unlock(&list_lock);
}

void rt__c2s_s2s_listed(c2s_s2s_entry_t *e, bool on)
{
    pthread_mutex_lock(&list_lock);
    if (on && !e->listed) {
        e->prev = NULL;
        e->next = list_head;
        if (list_head)
            list_head->prev = e;
        list_head = e;
    } else if (!on && e->listed) {
        if (e->prev)
            e->prev->next = e->next;
        else
            list_head = e->next;
        if (e->next)
            e->next->prev = e->prev;
    }
    e->listed = on;
    pthread_mutex_unlock(&list_lock);
}

void rt_c2s_s2s_each(void (*fn)(const rt_c2s_s2s_info_t *s, void *arg), void *arg)
{
    pthread_mutex_lock(&list_lock);
    for (const c2s_s2s_entry_t *e = list_head; e; e = e->next)
        fn(&e->info, arg);
    pthread_mutex_unlock(&list_lock);
}

/* ---- Outgoing streams, by pair ---- */

/* "s2s:local>remote", or a digest of the pair where that would pass a name's 255 bytes. */
static void out_name(const char *local, const char *remote, char *out, size_t cap)
{
    int n = snprintf(out, cap, "s2s:%s>%s", local, remote);
    if (n > 0 && (size_t)n < cap && n <= 255)
        return;
    uint8_t d[32];
    char text[2 * RT_CONF_XMPP_HOST_MAX + 2], h[65];
    snprintf(text, sizeof(text), "%s>%s", local, remote);
    SHA256((const uint8_t *)text, strlen(text), d);
    hex(d, 16, h);
    snprintf(out, cap, "s2s:%s", h);
}

rt_pid_t rt__c2s_s2s_out(const char *local, const char *remote)
{
    char name[300];
    out_name(local, remote, name, sizeof(name));
    rt_pid_t pid = rt_whereis(name);
    if (pid)
        return pid;
    struct sockaddr_storage addr;
    unsigned alen;
    if (!rt__c2s.conf->s2s_dns && rt__c2s_s2s_peer(remote, &addr, &alen) != 0)
        return 0; /* nowhere to connect: no actor made for it (a user's typo, or a flood) */
    c2s_s2s_out_arg_t arg = {.local = local, .remote = remote};
    rt_spawn_opts_t o = {.name = name};
    int rc = rt_spawn_opt(&rt__c2s_s2s_out_type, &arg, &o, &pid);
    if (rc == RT_EEXIST) /* another sender made it first */
        return rt_whereis(name);
    return rc ? 0 : pid;
}

bool rt__c2s_s2s_send(const char *local, size_t local_len, const char *remote, size_t remote_len,
                      const void *p, size_t len)
{
    char l[RT_CONF_XMPP_HOST_MAX], r[RT_CONF_XMPP_HOST_MAX];
    if (!federating || local_len >= sizeof(l) || remote_len >= sizeof(r))
        return false;
    memcpy(l, local, local_len);
    l[local_len] = 0;
    memcpy(r, remote, remote_len);
    r[remote_len] = 0;
    for (int attempt = 0; attempt < 2; attempt++) { /* once more if it ended meanwhile */
        rt_pid_t pid = rt__c2s_s2s_out(l, r);
        if (pid && rt_send(pid, C2S_MSG_S2S_OUT, p, len) == 0)
            return true;
    }
    return false;
}

int rt__c2s_s2s_local_index(const char *domain, size_t len)
{
    int i = rt__c2s_host_index(domain, len);
    if (i >= 0)
        return i;
    i = rt__c2s_muc_index(domain, len);
    return i >= 0 ? (int)rt__c2s.conf->nhosts + i : -1;
}

const char *rt__c2s_s2s_local_domain(unsigned i)
{
    unsigned n = rt__c2s.conf->nhosts;
    return i < n ? rt__c2s.conf->hosts[i] : i < 2 * n ? rt__c2s.muc[i - n] : "";
}

bool rt__c2s_domain_remote(const char *domain, size_t len)
{
    return federating && rt__c2s_host_index(domain, len) < 0 &&
           rt__c2s_muc_index(domain, len) < 0 && rt__c2s_upload_index(domain, len) < 0;
}

bool rt__c2s_s2s_presence_to(const char *jid, size_t len, const void *p, size_t n)
{
    const char *at = memchr(jid, '@', len), *slash = memchr(jid, '/', len);
    const char *domain = at && (!slash || at < slash) ? at + 1 : jid;
    size_t dlen = (size_t)((slash ? slash : jid + len) - domain);
    if (!rt__c2s_domain_remote(domain, dlen))
        return false;
    char from[RT_JID_TEXT_MAX + 1], to[RT_JID_TEXT_MAX + 1];
    int fn = rt__c2s_first_tag_attr(p, n, "from", from, sizeof(from) - 1);
    const char *fat = fn > 0 ? memchr(from, '@', (size_t)fn) : NULL;
    static const char tag[] = "<presence";
    if (!fat || n < sizeof(tag) || memcmp(p, tag, sizeof(tag) - 1) != 0)
        return true;
    const char *fslash = memchr(fat, '/', (size_t)(from + fn - fat));
    rt_buf_t b = {0};
    rt_buf_add(&b, p, sizeof(tag) - 1);
    if (rt__c2s_first_tag_attr(p, n, "to", to, sizeof(to) - 1) < 0) /* a broadcast's: none */
        rt_xml_put_attr_len(&b, "to", jid, len);
    rt_buf_add(&b, (const char *)p + sizeof(tag) - 1, n - (sizeof(tag) - 1));
    if (!b.oom)
        rt__c2s_s2s_send(fat + 1, (size_t)((fslash ? fslash : from + fn) - fat - 1), domain, dlen,
                         b.data, b.len);
    rt_buf_free(&b);
    return true;
}

/* ---- What came in, delivered here ---- */

/* An error for el back to its sender on the other server (RFC 6120 8.3). */
static void answer_error(const rt_xml_el_t *el, const rt_jid_t *from, const rt_jid_t *to,
                         const char *type, const char *cond)
{
    const char *t = rt_xml_attr(el, "type");
    if (t && strcmp(t, "error") == 0)
        return; /* never an error for an error */
    rt_buf_t b = {0};
    rt_xml_put_start(&b, el->name);
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", "error");
    const char *id = rt_xml_attr(el, "id");
    if (id)
        rt_xml_put_attr(&b, "id", id);
    rt_xml_put_attr(&b, "from", to->s);
    rt_xml_put_attr(&b, "to", from->s);
    rt_xml_put_start_end(&b);
    rt_buf_printf(&b, "<error type='%s'><%s xmlns='%s'/></error>", type, cond,
                  RT_XML_NS_STANZA_ERRORS);
    rt_xml_put_end(&b, el->name);
    if (!b.oom && rt__c2s_s2s_send(rt_jid_domain(to), to->domain, rt_jid_domain(from), from->domain,
                                   b.data, b.len))
        atomic_fetch_add_explicit(&rt_c2s_stats.s2s_errors_out, 1, memory_order_relaxed);
    rt_buf_free(&b);
}

/* An iq for this server itself: ping (XEP-0199) is answered, anything else it does not do. */
static void iq_for_server(const rt_xml_el_t *el, const rt_jid_t *from, const rt_jid_t *to)
{
    const char *type = rt_xml_attr(el, "type");
    const rt_xml_el_t *q = rt_xml_first(el);
    if (!type || (strcmp(type, "get") != 0 && strcmp(type, "set") != 0))
        return;
    if (!q || strcmp(q->ns, "urn:xmpp:ping") != 0 || strcmp(type, "get") != 0) {
        answer_error(el, from, to, "cancel", "service-unavailable");
        return;
    }
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", "result");
    rt_xml_put_attr(&b, "id", rt_xml_attr(el, "id") ? rt_xml_attr(el, "id") : "");
    rt_xml_put_attr(&b, "from", to->s);
    rt_xml_put_attr(&b, "to", from->s);
    rt_xml_put_empty_end(&b);
    if (!b.oom)
        rt__c2s_s2s_send(rt_jid_domain(to), to->domain, rt_jid_domain(from), from->domain, b.data,
                         b.len);
    rt_buf_free(&b);
}

/*
** A stanza for a room of ours (or the MUC service) from another server's user: to the room as
** a local session's would go, from this incoming stream, which the room then takes for the
** occupant's session: what the room sends the occupant comes here (C2S_MSG_STANZA) and goes
** back through federation, and the room sees the occupant leave when this stream ends.
*/
static void to_room(const rt_xml_el_t *el, const rt_jid_t *from, const rt_jid_t *to)
{
    rt_buf_t b = {0};
    rt__c2s_put_stanza_from(&b, el, from->s, to->s, RT_XML_NS_SERVER);
    rt_msg_t *m = b.oom ? NULL : rt_msg_new(C2S_MSG_STANZA, b.len);
    if (m) {
        memcpy(m->data, b.data, b.len);
        m->from = rt__c2s_current_pid(); /* this stream: the occupant the room sees */
        /* Rooms are made by this server's users only (a default opens no more than it says). */
        bool presence = strcmp(el->name, "presence") == 0;
        if (!rt__c2s_muc_reroute(m, false) && !(presence && rt_xml_attr(el, "type")))
            answer_error(el, from, to, "cancel", presence ? "not-allowed" : "item-not-found");
        rt_msg_free(m);
    } else {
        answer_error(el, from, to, "wait", "resource-constraint");
    }
    rt_buf_free(&b);
}

/* A subscription stanza or a probe from another server's account: the user's roster has
   the answer, so it goes to the store (RFC 6121 3, 4.3; c2s_store_roster.c). */
static void subscription_in(const rt_xml_el_t *el, const rt_jid_t *from, const rt_jid_t *to,
                            const char *type)
{
    static const char *const kinds[] = {NULL,          "subscribe",    "subscribed",
                                        "unsubscribe", "unsubscribed", "probe"};
    uint8_t kind = 0;
    for (uint8_t k = 1; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        if (strcmp(type, kinds[k]) == 0)
            kind = k;
    if (!kind) {
        answer_error(el, from, to, "modify", "bad-request");
        return;
    }
    char bare_from[RT_JID_TEXT_MAX + 1], bare_to[RT_JID_TEXT_MAX + 1];
    snprintf(bare_from, sizeof(bare_from), "%.*s", (int)rt_jid_bare_len(from), from->s);
    snprintf(bare_to, sizeof(bare_to), "%.*s", (int)rt_jid_bare_len(to), to->s);
    rt_buf_t d = {0};
    rt_buf_add(&d, &kind, 1);
    rt_buf_add(&d, bare_from, strlen(bare_from) + 1);
    /* 3.1.3: the contact's server stamps the request with the bare JIDs */
    rt__c2s_put_stanza_from(&d, el, bare_from, bare_to, RT_XML_NS_SERVER);
    if (d.oom || rt__c2s_store_ask(C2S_OP_SUB_IN, 0, rt_jid_domain(to), to->domain,
                                   rt_jid_local(to), to->local, 0, d.data, d.len) != 0)
        answer_error(el, from, to, "wait", "internal-server-error");
    rt_buf_free(&d);
}

void rt__c2s_s2s_deliver(rt_actor_t *self, const rt_xml_el_t *el, const rt_jid_t *from,
                         const rt_jid_t *to)
{
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_stanzas_in, 1, memory_order_relaxed);
    const char *type = rt_xml_attr(el, "type");
    bool message = strcmp(el->name, "message") == 0, iq = strcmp(el->name, "iq") == 0;
    if (rt__c2s_muc_index(rt_jid_domain(to), to->domain) >= 0) {
        to_room(el, from, to);
        return;
    }
    if (!to->local) {
        if (iq)
            iq_for_server(el, from, to);
        return; /* a message or presence to the server: nothing takes it */
    }
    if (!message && !iq && type && strcmp(type, "unavailable") != 0 && strcmp(type, "error") != 0) {
        subscription_in(el, from, to, type);
        return;
    }
    rt_buf_t b = {0};
    rt__c2s_put_stanza_from(&b, el, from->s, to->s, RT_XML_NS_SERVER);
    if (b.oom) {
        rt_buf_free(&b);
        answer_error(el, from, to, "wait", "resource-constraint");
        return;
    }
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t n =
        rt__c2s_reg_lookup(to->s, rt_jid_bare_len(to), to->resource ? rt_jid_resource(to) : NULL,
                           to->resource, r, to->resource ? 1 : C2S_ROUTES_MAX);
    if (message) {
        if (n && to->resource && rt__c2s_send_bytes(r[0].pid, &b)) {
            rt_buf_free(&b);
            return;
        }
        if (type && strcmp(type, "groupchat") == 0) {
            /* RFC 6121 8.5.3.2.1: a room's copy for a resource that is not here is answered,
               so that the room (on another server) can take the seat away */
            rt_buf_free(&b);
            answer_error(el, from, to, "cancel", "service-unavailable");
            return;
        }
        /* The account's resources, or its offline store (the store's refusal comes back
           to this stream, which sends it on to the sender). */
        rt__c2s_message_rerouted((const uint8_t *)b.data, b.len, 0, rt_self(self));
    } else if (iq) {
        if (!(n && to->resource && rt__c2s_send_bytes(r[0].pid, &b)))
            answer_error(el, from, to, "cancel", "service-unavailable");
    } else {
        /* RFC 6121 8.5.3.1: to a full JID, the connected resource (a room's presence to an
           occupant that joined with directed presence alone); to a bare JID, the available. */
        for (size_t i = 0; i < n; i++)
            if (r[i].available || to->resource)
                rt__c2s_send_bytes(r[i].pid, &b);
    }
    rt_buf_free(&b);
}

/* ---- The incoming stream's actor ---- */

typedef struct s2s_in_s {
    rt_sock_t *sock;
    rt_xport_t *xp;
    rt_xml_stream_t xs;
    uint8_t listener;
    int8_t plain; /* 0: not asked yet; 1: may go without TLS; -1: may not */
    bool secure, starttls, closing, dropped, counted, header, restart;
    uint8_t to; /* the header's domain: rt__c2s_s2s_local_index's */
    char id[17];
    char from[RT_CONF_XMPP_HOST_MAX];   /* the header's from, prepared ("" when it has none) */
    char authed[RT_CONF_XMPP_HOST_MAX]; /* the domain SASL EXTERNAL proved ("": none) */
    c2s_s2s_entry_t entry;              /* in rtctl xmpp servers' list */
    uint64_t last_rx_ms;
    unsigned npairs, pending;
    struct {
        uint8_t local; /* index in hosts */
        char remote[RT_CONF_XMPP_HOST_MAX];
    } pairs[S2S_IN_PAIRS];
} s2s_in_t;

static const rt_listen_t *in_listen(const s2s_in_t *s)
{
    return &rt__c2s.conf->listeners[s->listener];
}

static void in_write(s2s_in_t *s, const void *p, size_t n)
{
    if (!s->sock || s->closing)
        return;
    int rc = s->xp ? rt_xport_write(s->xp, s->sock, p, n) : rt_sock_write(s->sock, p, n);
    if (rc)
        s->closing = true;
}

static void in_write_buf(s2s_in_t *s, rt_buf_t *b)
{
    if (b->oom)
        s->closing = true;
    else
        in_write(s, b->data, b->len);
    rt_buf_free(b);
}

static void in_stream_error(s2s_in_t *s, rt_xml_cond_t cond, const char *text)
{
    if (s->closing)
        return;
    rt_buf_t b = {0};
    if (!s->header) /* RFC 6120 4.9.1.2: the header first, then the error */
        rt_buf_printf(&b,
                      "<?xml version='1.0'?><stream:stream xmlns='%s' xmlns:stream='%s' "
                      "version='1.0'>",
                      RT_XML_NS_SERVER, RT_XML_NS_STREAMS);
    rt_buf_printf(&b, "<stream:error><%s xmlns='%s'/>", rt_xml_cond_name(cond),
                  RT_XML_NS_STREAM_ERRORS);
    if (text) {
        rt_buf_printf(&b, "<text xmlns='%s'>", RT_XML_NS_STREAM_ERRORS);
        rt_xml_put_text(&b, text, strlen(text));
        rt_buf_printf(&b, "</text>");
    }
    rt_buf_printf(&b, "</stream:error></stream:stream>");
    in_write_buf(s, &b);
    s->closing = true;
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_stream_errors, 1, memory_order_relaxed);
}

static bool in_plain_ok(s2s_in_t *s)
{
    if (s->secure)
        return true;
    if (!s->plain) {
        rt_auth_addr_t a;
        bool ok =
            s->sock && !rt_xport_real_peer(s->xp, &a, NULL) &&
            rt_auth_addr_from_fd(rt_sock_fd(s->sock), &a, NULL) == 0 &&
            rt_conf_net_match(rt__c2s.conf->plaintext_from, rt__c2s.conf->nplaintext_from, a.b);
        s->plain = ok ? 1 : -1;
    }
    return s->plain > 0;
}

/* A domain as a JID's domainpart, prepared; false if it is not one. */
static bool domain_of(const char *text, rt_jid_buf_t *jb)
{
    return text && rt_jid_prep(text, strlen(text), jb, NULL) == 0 && !jb->jid.local &&
           !jb->jid.resource;
}

/* SASL EXTERNAL (RFC 6120 6.4, XEP-0178): after TLS, when the other server's certificate
   verified against the listener's ca and names the domain its header says it is. */
static bool external_ok(const s2s_in_t *s)
{
    return s->secure && s->from[0] && !s->authed[0] && rt_xport_tls_names_domain(s->xp, s->from);
}

static int in_on_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    (void)ns;
    (void)nns;
    s2s_in_t *s = ctx;
    /* No version check: a pre-1.0 server ignores the features and starts dialback, taken too. */
    const char *to = rt_xml_attr(hdr, "to");
    int host = to ? rt__c2s_s2s_local_index(to, strlen(to)) : -1;
    if (host < 0) {
        in_stream_error(s, RT_XML_COND_HOST_UNKNOWN, "this server does not serve that domain");
        return RT_XML_STOP;
    }
    s->to = (uint8_t)host;
    rt__c2s_s2s_lock();
    snprintf(s->entry.info.local, sizeof(s->entry.info.local), "%s",
             rt__c2s_s2s_local_domain((unsigned)host));
    rt__c2s_s2s_unlock();
    rt_jid_buf_t from;
    if (domain_of(rt_xml_attr(hdr, "from"), &from) && from.jid.domain < sizeof(s->from))
        snprintf(s->from, sizeof(s->from), "%s", rt_jid_domain(&from.jid));
    if (rt_random_hex(s->id, 8) != 0)
        snprintf(s->id, sizeof(s->id), "%016llx", (unsigned long long)rt_mono_ns());
    rt_buf_t b = {0};
    rt_buf_printf(&b,
                  "<?xml version='1.0'?><stream:stream xmlns='%s' xmlns:stream='%s' "
                  "xmlns:db='%s'",
                  RT_XML_NS_SERVER, RT_XML_NS_STREAMS, NS_DIALBACK);
    rt_xml_put_attr(&b, "id", s->id);
    rt_xml_put_attr(&b, "from", rt__c2s_s2s_local_domain((unsigned)host));
    rt_xml_put_attr(&b, "version", "1.0");
    rt_buf_printf(&b, "><stream:features>");
    if (in_listen(s)->starttls && !s->secure)
        rt_buf_printf(&b, "<starttls xmlns='%s'/>", RT_XML_NS_TLS);
    if (external_ok(s))
        rt_buf_printf(&b, "<mechanisms xmlns='%s'><mechanism>EXTERNAL</mechanism></mechanisms>",
                      RT_XML_NS_SASL);
    if (!rt__c2s.conf->s2s_secure)
        rt_buf_printf(&b, "<dialback xmlns='%s'><errors/></dialback>", NS_DIALBACK_FEATURE);
    rt_buf_printf(&b, "</stream:features>");
    in_write_buf(s, &b);
    s->header = true;
    return s->closing ? RT_XML_STOP : 0;
}

static int pair_index(const s2s_in_t *s, int local, const char *remote)
{
    for (unsigned i = 0; i < s->npairs; i++)
        if (s->pairs[i].local == local && strcmp(s->pairs[i].remote, remote) == 0)
            return (int)i;
    return -1;
}

/* remote proved, by dialback or by EXTERNAL, for stanzas to local: logged and listed. */
static void in_proved(s2s_in_t *s, const char *remote, const char *local, const char *how)
{
    rt_log(RT_LOG_INFO, "xmpp.server_in", "from=%s to=%s tls=%s auth=%s", remote, local,
           s->secure ? "yes" : "no", how);
    rt__c2s_s2s_lock();
    rt_c2s_s2s_info_t *i = &s->entry.info;
    if (!i->remote[0])
        snprintf(i->remote, sizeof(i->remote), "%s", remote);
    i->domains++;
    i->state = "verified";
    i->auth = how;
    i->tls = s->secure;
    rt__c2s_s2s_unlock();
}

/*
** <auth mechanism='EXTERNAL'/>: the other server is the domain of its header when its
** certificate names it; an authorization identity, when given ("=" is none), must be that
** domain (RFC 6120 6.3.8). Success restarts the stream, which then carries stanzas from that
** domain to any of ours; failure leaves dialback to try.
*/
static void in_sasl_auth(s2s_in_t *s, const rt_xml_el_t *el)
{
    const char *mech = rt_xml_attr(el, "mechanism"), *text = rt_xml_text(el, NULL);
    char authzid[RT_CONF_XMPP_HOST_MAX] = "";
    long n = text && *text && strcmp(text, "=") != 0
                 ? rt_base64_decode(text, strlen(text), authzid, sizeof(authzid) - 1, 0)
                 : 0;
    rt_jid_buf_t want;
    bool ok = mech && strcmp(mech, "EXTERNAL") == 0 && external_ok(s) && n >= 0;
    if (ok && n > 0) {
        authzid[n] = 0;
        ok = domain_of(authzid, &want) && strcmp(rt_jid_domain(&want.jid), s->from) == 0;
    }
    rt_buf_t b = {0};
    if (!ok) {
        rt_buf_printf(&b, "<failure xmlns='%s'><not-authorized/></failure>", RT_XML_NS_SASL);
        in_write_buf(s, &b);
        atomic_fetch_add_explicit(&rt_c2s_stats.s2s_external_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "xmpp.server_external_failed", "from=%s to=%s",
               s->from[0] ? s->from : "-", rt__c2s_s2s_local_domain(s->to));
        return;
    }
    rt_buf_printf(&b, "<success xmlns='%s'/>", RT_XML_NS_SASL);
    in_write_buf(s, &b);
    snprintf(s->authed, sizeof(s->authed), "%s", s->from);
    s->restart = true;
    in_proved(s, s->authed, rt__c2s_s2s_local_domain(s->to), "external");
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_external_ok, 1, memory_order_relaxed);
}

/* <db:result/> from the other server: its key for (local, remote), asked of its domain. */
static void in_db_result(rt_actor_t *self, s2s_in_t *s, const rt_xml_el_t *el)
{
    rt_jid_buf_t from, to;
    if (!domain_of(rt_xml_attr(el, "from"), &from) || !domain_of(rt_xml_attr(el, "to"), &to)) {
        in_stream_error(s, RT_XML_COND_IMPROPER_ADDRESSING, "dialback needs from and to");
        return;
    }
    int local = rt__c2s_s2s_local_index(rt_jid_domain(&to.jid), to.jid.domain);
    if (local < 0) {
        in_stream_error(s, RT_XML_COND_HOST_UNKNOWN, "this server does not serve that domain");
        return;
    }
    if (!in_plain_ok(s)) {
        in_stream_error(s, RT_XML_COND_POLICY_VIOLATION, "TLS first (STARTTLS)");
        return;
    }
    if (rt__c2s.conf->s2s_secure) {
        atomic_fetch_add_explicit(&rt_c2s_stats.s2s_dialback_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "xmpp.server_dialback_failed", "from=%s to=%s reason=%s",
               rt_jid_domain(&from.jid), rt_jid_domain(&to.jid),
               "certificates only (xmpp.s2s_secure)");
        in_stream_error(s, RT_XML_COND_POLICY_VIOLATION,
                        "this server takes certificates only (SASL EXTERNAL), not dialback");
        return;
    }
    const char *key = rt_xml_text(el, NULL);
    if (!key || strlen(key) > C2S_S2S_KEY_HEX || s->pending + s->npairs >= S2S_IN_PAIRS) {
        in_stream_error(s, RT_XML_COND_POLICY_VIOLATION, "a key too long, or too many domains");
        return;
    }
    rt_msg_t *m = rt_msg_new(C2S_MSG_S2S_VERIFY, sizeof(c2s_s2s_verify_t) + from.jid.domain + 1);
    rt_pid_t out =
        m ? rt__c2s_s2s_out(rt__c2s_s2s_local_domain((unsigned)local), rt_jid_domain(&from.jid))
          : 0;
    if (m && out) {
        c2s_s2s_verify_t *v = (c2s_s2s_verify_t *)(void *)m->data;
        memset(v, 0, sizeof(*v));
        v->in = rt_self(self);
        v->local = (uint8_t)local;
        memcpy(v->id, s->id, sizeof(v->id));
        snprintf(v->key, sizeof(v->key), "%s", key);
        memcpy(m->data + sizeof(*v), rt_jid_domain(&from.jid), from.jid.domain + 1);
        if (rt_send_msg(out, m) == 0) {
            s->pending++;
            return;
        }
        m = NULL;
    }
    rt_msg_free(m);
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<db:result");
    rt_xml_put_attr(&b, "from", rt__c2s_s2s_local_domain((unsigned)local));
    rt_xml_put_attr(&b, "to", rt_jid_domain(&from.jid));
    rt_buf_printf(&b,
                  " type='error'><error type='cancel'><remote-server-not-found xmlns='%s'/>"
                  "</error></db:result>",
                  RT_XML_NS_STANZA_ERRORS);
    in_write_buf(s, &b);
}

/* The authoritative server answered (through the outgoing stream): the pair is in, or not. */
static void in_verified(rt_actor_t *self, s2s_in_t *s, const rt_msg_t *m)
{
    (void)self;
    if (m->len <= sizeof(c2s_s2s_verify_t) || m->data[m->len - 1] != 0 || !s->pending)
        return;
    const c2s_s2s_verify_t *v = (const void *)m->data;
    const char *remote = (const char *)m->data + sizeof(*v);
    s->pending--;
    if (v->local >= 2 * rt__c2s.conf->nhosts)
        return;
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<db:result");
    rt_xml_put_attr(&b, "from", rt__c2s_s2s_local_domain(v->local));
    rt_xml_put_attr(&b, "to", remote);
    rt_xml_put_attr(&b, "type", v->valid ? "valid" : "invalid");
    rt_xml_put_empty_end(&b);
    in_write_buf(s, &b);
    if (!v->valid) {
        atomic_fetch_add_explicit(&rt_c2s_stats.s2s_dialback_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "xmpp.server_dialback_failed", "from=%s to=%s", remote,
               rt__c2s_s2s_local_domain(v->local));
        in_stream_error(s, RT_XML_COND_NOT_AUTHORIZED, "the key did not verify");
        return;
    }
    if (pair_index(s, v->local, remote) < 0 && s->npairs < S2S_IN_PAIRS) {
        s->pairs[s->npairs].local = v->local;
        snprintf(s->pairs[s->npairs].remote, sizeof(s->pairs[0].remote), "%s", remote);
        s->npairs++;
        in_proved(s, remote, rt__c2s_s2s_local_domain(v->local), "dialback");
    }
}

/* <db:verify/>: does this server stand by a key it gave on its outgoing stream? */
static void in_db_verify(s2s_in_t *s, const rt_xml_el_t *el)
{
    const char *from = rt_xml_attr(el, "from"), *to = rt_xml_attr(el, "to");
    const char *id = rt_xml_attr(el, "id"), *key = rt_xml_text(el, NULL);
    if (!from || !to || !id || !key || rt__c2s_s2s_local_index(to, strlen(to)) < 0 ||
        strlen(from) >= RT_CONF_XMPP_HOST_MAX || strlen(id) > 64) {
        in_stream_error(s, RT_XML_COND_IMPROPER_ADDRESSING, "db:verify needs from, to and id");
        return;
    }
    char expect[C2S_S2S_KEY_HEX + 1];
    rt__c2s_s2s_key(from, to, id, expect);
    bool valid = strlen(key) == C2S_S2S_KEY_HEX && CRYPTO_memcmp(expect, key, C2S_S2S_KEY_HEX) == 0;
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<db:verify");
    rt_xml_put_attr(&b, "from", to);
    rt_xml_put_attr(&b, "to", from);
    rt_xml_put_attr(&b, "id", id);
    rt_xml_put_attr(&b, "type", valid ? "valid" : "invalid");
    rt_xml_put_empty_end(&b);
    in_write_buf(s, &b);
}

static void in_stanza(rt_actor_t *self, s2s_in_t *s, const rt_xml_el_t *el)
{
    rt_jid_buf_t from, to;
    const char *f = rt_xml_attr(el, "from"), *t = rt_xml_attr(el, "to");
    if (!f || !t || rt_jid_prep(f, strlen(f), &from, NULL) != 0 ||
        rt_jid_prep(t, strlen(t), &to, NULL) != 0) {
        in_stream_error(s, RT_XML_COND_IMPROPER_ADDRESSING, "a stanza needs a valid from and to");
        return;
    }
    int local = rt__c2s_s2s_local_index(rt_jid_domain(&to.jid), to.jid.domain);
    char remote[RT_CONF_XMPP_HOST_MAX];
    snprintf(remote, sizeof(remote), "%.*s", (int)from.jid.domain, rt_jid_domain(&from.jid));
    if (local < 0 || (pair_index(s, local, remote) < 0 && strcmp(remote, s->authed) != 0)) {
        in_stream_error(s, RT_XML_COND_INVALID_FROM, "that pair of domains is not verified here");
        return;
    }
    rt__c2s_s2s_deliver(self, el, &from.jid, &to.jid);
}

static int in_on_stanza(void *ctx, rt_xml_el_t *el)
{
    s2s_in_t *s = ctx;
    rt_actor_t *self = rt_current();
    if (strcmp(el->ns, RT_XML_NS_TLS) == 0 && strcmp(el->name, "starttls") == 0 &&
        in_listen(s)->starttls && !s->secure) {
        s->starttls = true;
    } else if (strcmp(el->ns, RT_XML_NS_SASL) == 0 && strcmp(el->name, "auth") == 0) {
        in_sasl_auth(s, el);
    } else if (strcmp(el->ns, NS_DIALBACK) == 0 && strcmp(el->name, "result") == 0) {
        in_db_result(self, s, el);
    } else if (strcmp(el->ns, NS_DIALBACK) == 0 && strcmp(el->name, "verify") == 0) {
        in_db_verify(s, el);
    } else if (strcmp(el->ns, RT_XML_NS_SERVER) == 0 &&
               (strcmp(el->name, "message") == 0 || strcmp(el->name, "presence") == 0 ||
                strcmp(el->name, "iq") == 0)) {
        in_stanza(self, s, el);
    } else {
        in_stream_error(s, RT_XML_COND_UNSUPPORTED_STANZA_TYPE, NULL);
    }
    rt_xml_free(&rt__c2s.stream_s2s.alloc, s, el);
    return s->closing || s->starttls || s->restart ? RT_XML_STOP : 0;
}

static int in_on_close(void *ctx)
{
    s2s_in_t *s = ctx;
    in_write(s, "</stream:stream>", 16);
    s->closing = true;
    return RT_XML_STOP;
}

static void in_feed(rt_actor_t *self, s2s_in_t *s, const uint8_t *p, size_t n);

static void in_input(rt_actor_t *self, void *owner, const uint8_t *p, size_t n)
{
    in_feed(self, owner, p, n);
}

static bool in_taking(const void *owner)
{
    const s2s_in_t *s = owner;
    return s->sock && !s->closing && !s->dropped;
}

static void in_fail(rt_actor_t *self, void *owner)
{
    (void)self;
    ((s2s_in_t *)owner)->dropped = true;
}

static void in_hold(void *owner)
{
    s2s_in_t *s = owner;
    if (s->sock)
        rt_sock_pause_reading(s->sock, true);
}

static void in_tls_failed(void *owner)
{
    (void)owner;
    atomic_fetch_add_explicit(&rt_broker->stats.tls_failed, 1, memory_order_relaxed);
}

static void in_peer(const void *owner, char *buf, size_t len)
{
    const s2s_in_t *s = owner;
    rt_xport_peer_format(s->xp, s->sock ? rt_sock_fd(s->sock) : -1, buf, len);
}

/* A trusted proxy named the other server: the per-address limits count it, as a client. */
static bool in_peer_named(rt_actor_t *self, void *owner, const rt_auth_addr_t *addr)
{
    (void)self;
    const s2s_in_t *s = owner;
    return !rt__c2s.admit_peer || rt__c2s.admit_peer(rt_sock_fd(s->sock), addr);
}

static void in_preauth_refused(rt_actor_t *self, void *owner, size_t wanted)
{
    (void)self;
    s2s_in_t *s = owner;
    char peer[64];
    in_peer(s, peer, sizeof(peer));
    rt_log(RT_LOG_WARNING, "xmpp.preauth_refused", "peer=%s wanted=%zu", peer, wanted);
    s->dropped = true;
}

static const rt_xport_ops_t in_xport_ops = {
    .input = in_input,
    .taking = in_taking,
    .fail = in_fail,
    .hold_input = in_hold,
    .peer = in_peer,
    .peer_named = in_peer_named,
    .preauth_refused = in_preauth_refused,
    .tls_failed = in_tls_failed,
};

static rt_xport_owner_t in_owner(s2s_in_t *s)
{
    return (rt_xport_owner_t){.ops = &in_xport_ops,
                              .state = s,
                              .sock = s->sock,
                              .listen = in_listen(s),
                              .max_message = (uint32_t)rt__c2s.conf->max_stanza_size};
}

static void in_feed(rt_actor_t *self, s2s_in_t *s, const uint8_t *p, size_t n)
{
    if (s->closing)
        return;
    size_t used = 0;
    int rc = rt_xml_stream_feed(&s->xs, p, n, &used);
    if (s->closing)
        return;
    if (rc == RT_EPROTO) {
        const char *text = NULL;
        rt_xml_cond_t cond = rt_xml_stream_error(&s->xs, &text);
        in_stream_error(s, cond ? cond : RT_XML_COND_NOT_WELL_FORMED, text);
    } else if (rc < 0) {
        in_stream_error(s, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
    } else if (s->starttls) {
        s->starttls = false;
        static const char proceed[] = "<proceed xmlns='" RT_XML_NS_TLS "'/>";
        rt_xport_owner_t o = in_owner(s);
        if (rt_xport_starttls(self, s->xp, &o, proceed, sizeof(proceed) - 1, n - used) != 0) {
            s->closing = true;
            return;
        }
        s->secure = true;
        s->header = false;
        rt_xml_stream_reset(&s->xs);
    } else if (s->restart) { /* after SASL: a new header comes (RFC 6120 6.4.6) */
        s->restart = false;
        s->header = false;
        rt_xml_stream_reset(&s->xs);
        if (used < n)
            in_feed(self, s, p + used, n - used);
    }
}

void rt__c2s_s2s_stream_config(void)
{
    rt__c2s.stream_s2s = rt__c2s.stream_tcp; /* its allocator and limits: the running actor's */
    rt__c2s.stream_s2s.on_header = in_on_header;
    rt__c2s.stream_s2s.on_stanza = in_on_stanza;
    rt__c2s.stream_s2s.on_close = in_on_close;
    rt__c2s.stream_s2s.content_ns = RT_XML_NS_SERVER;
}

static int in_init(rt_actor_t *self, void *state, void *arg)
{
    s2s_in_t *s = state;
    const rt_c2s_arg_t *a = arg;
    int rc = rt_sock_adopt(self, a->fd, &s->sock);
    if (rc)
        return rc;
    s->listener = (uint8_t)a->listener;
    const rt_listen_t *l = in_listen(s);
    if (rt_xport_wanted(l)) {
        rc = rt_xport_start(&in_xport_ops, l, RT_CONF_XMPP_LISTENER(s->listener), s->sock,
                            l->starttls ? RT_XPORT_STARTTLS : 0, &s->xp);
        if (rc)
            return rc;
        s->secure = l->tls_on && !l->starttls;
    }
    rc = rt_xml_stream_init(&s->xs, &rt__c2s.stream_s2s, s);
    /* Without its timers an unverified stream would stay until its peer left. */
    if (!rc && ((rc = rt_send_after_tag(S2S_IDLE_MS, rt_self(self), C2S_MSG_S2S_IDLE, NULL)) ||
                (rc = rt_send_after_tag((uint64_t)rt_broker->conf.connect_timeout * 1000,
                                        rt_self(self), C2S_MSG_S2S_TIMEOUT, NULL))))
        rt_xml_stream_destroy(&s->xs);
    if (rc) {
        rt_xport_free(s->xp);
        s->xp = NULL;
        return rc;
    }
    s->last_rx_ms = rt_mono_ms();
    rt__broker_count_socket(RT_CONF_XMPP_LISTENER(s->listener), +1);
    atomic_fetch_add_explicit(&rt_c2s_stats.s2s_in, 1, memory_order_relaxed);
    s->counted = true;
    rt_c2s_s2s_info_t *i = &s->entry.info;
    i->pid = rt_self(self);
    i->incoming = true;
    i->state = "open";
    i->auth = "";
    i->since_ms = rt_mono_ms();
    rt_xport_peer_format(s->xp, rt_sock_fd(s->sock), i->peer, sizeof(i->peer));
    rt__c2s_s2s_listed(&s->entry, true);
    return 0;
}

static void in_on_readable(rt_actor_t *self, s2s_in_t *s)
{
    for (int i = 0; i < 4 && s->sock && !s->closing; i++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(s->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            s->closing = true;
            return;
        }
        s->last_rx_ms = rt_mono_ms();
        if (s->xp) {
            rt_xport_owner_t o = in_owner(s);
            rt_xport_input(self, s->xp, &o, (uint8_t *)(uintptr_t)data, len);
        } else {
            in_feed(self, s, data, len);
        }
    }
}

static void in_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    s2s_in_t *s = state;
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        uint32_t events = ((rt_sock_event_t *)(void *)m->data)->events;
        if ((events & RT_SOCK_WRITABLE) && s->sock && s->xp) {
            rt_sock_pause_reading(s->sock, false);
            rt_xport_owner_t o = in_owner(s);
            rt_xport_resume(self, s->xp, &o);
        }
        if ((events & RT_SOCK_READABLE) && s->sock)
            in_on_readable(self, s);
        break;
    }
    case C2S_MSG_S2S_VERIFIED:
        in_verified(self, s, m);
        break;
    case C2S_MSG_STANZA: /* an answer to what came in (the offline store's refusal) */
        if (m->len) {
            char to[RT_JID_TEXT_MAX + 1], from[RT_JID_TEXT_MAX + 1];
            int tn = rt__c2s_first_tag_attr(m->data, m->len, "to", to, sizeof(to) - 1);
            int fn = rt__c2s_first_tag_attr(m->data, m->len, "from", from, sizeof(from) - 1);
            rt_jid_buf_t tj, fj;
            if (tn > 0 && fn > 0 && rt_jid_prep(to, (size_t)tn, &tj, NULL) == 0 &&
                rt_jid_prep(from, (size_t)fn, &fj, NULL) == 0)
                rt__c2s_s2s_send(rt_jid_domain(&fj.jid), fj.jid.domain, rt_jid_domain(&tj.jid),
                                 tj.jid.domain, m->data, m->len);
        }
        break;
    case C2S_MSG_S2S_TIMEOUT: /* connect_timeout: no pair of domains verified by then */
        if (!s->npairs && !s->authed[0])
            in_stream_error(s, RT_XML_COND_CONNECTION_TIMEOUT, "no dialback in time");
        break;
    case C2S_MSG_S2S_IDLE: {
        uint64_t quiet = rt_mono_ms() - s->last_rx_ms;
        if (quiet >= S2S_IDLE_MS)
            in_stream_error(s, RT_XML_COND_CONNECTION_TIMEOUT, "idle");
        else
            rt_send_after_tag(S2S_IDLE_MS - quiet, rt_self(self), C2S_MSG_S2S_IDLE, NULL);
        break;
    }
    }
    if (s->dropped)
        s->closing = true;
    if (s->closing)
        rt_exit(self, RT_REASON_NORMAL);
}

static void in_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    s2s_in_t *s = state;
    rt_xport_flush(s->xp);
}

static void in_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    s2s_in_t *s = state;
    rt_xml_stream_destroy(&s->xs);
    if (s->sock) {
        rt_xport_flush(s->xp);
        if (s->xp)
            rt_xport_close(s->xp, s->sock);
        rt_sock_close(s->sock);
        s->sock = NULL;
        rt__broker_count_socket(RT_CONF_XMPP_LISTENER(s->listener), -1);
    }
    if (s->counted)
        atomic_fetch_sub_explicit(&rt_c2s_stats.s2s_in, 1, memory_order_relaxed);
    rt__c2s_s2s_listed(&s->entry, false);
}

static const char *in_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case C2S_MSG_S2S_VERIFIED:
        return "verified";
    case C2S_MSG_STANZA:
        return "stanza";
    case C2S_MSG_S2S_IDLE:
        return "idle_check";
    case C2S_MSG_S2S_TIMEOUT:
        return "connect_timeout";
    }
    return NULL;
}

const rt_actor_type_t rt_c2s_s2s_in_type = {
    .name = "s2s_in",
    .state_size = sizeof(s2s_in_t),
    .init = in_init,
    .handle = in_handle,
    .terminate = in_terminate,
    .tag_name = in_tag_name,
    .turn_end = in_turn_end,
};

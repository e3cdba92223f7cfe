/*
** Tests for the XMPP XML layer (actors/xmpp/xml*.c): a client stream parsed whole, split in
** two at every offset and byte by byte, all giving the same events; stream restarts; the
** WebSocket framing; every stream error the parser raises (billion laughs, DOCTYPE, a
** 10 MB stanza, 10,000-deep nesting, 100,000 attributes, bad UTF-8, forbidden characters,
** a header never finished...) and the exact edge of each bound; what an idle stream holds
** (no parser: its struct and nothing else); the writer's escaping, and parse -> write ->
** parse round trips. Prints what parsing a typical <message/> costs (no assertion on it).
*/
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rt.h"
#include "xml.h"
#include "xml_stream.h"
#include "xml_write.h"

/* ---- A recording session: its allocator, its charge, and the events as text ---- */

typedef struct {
    rt_buf_t log; /* H[...] S[...] C, in order */
    bool closed;  /* the close was reported */
    long blocks;  /* allocator blocks outstanding */
    long bytes;   /* ... and their bytes */
    long charged; /* net of the charge callback */
    long max_charged, max_bytes;
    int stanzas;
    int stop_on;           /* answer RT_XML_STOP to the stanza of this number (1-based) */
    int fail_on;           /* answer RT_ENOMEM to the stanza of this number */
    const char *parent_ns; /* what stanzas are written against in the log */
    rt_xml_el_t *kept;     /* the last stanza, kept when keep is set */
    bool keep;
} rec_t;

static void *t_alloc(void *ctx, size_t n, bool scan)
{
    rec_t *r = ctx;
    size_t *h = malloc(n + 16);
    if (!h)
        return NULL;
    h[0] = n;
    r->blocks++;
    r->bytes += (long)n;
    if (r->bytes > r->max_bytes)
        r->max_bytes = r->bytes;
    return h + 2;
}

static void t_free(void *ctx, void *p)
{
    rec_t *r = ctx;
    if (!p)
        return;
    size_t *h = (size_t *)p - 2;
    r->blocks--;
    r->bytes -= (long)h[0];
    free(h);
}

static void t_charge(void *ctx, ptrdiff_t d)
{
    rec_t *r = ctx;
    r->charged += d;
    if (r->charged > r->max_charged)
        r->max_charged = r->charged;
}

static int t_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    rec_t *r = ctx;
    rt_buf_printf(&r->log, "H[%s{%s}", hdr->name, hdr->ns);
    for (uint32_t i = 0; i < hdr->node.len; i++)
        rt_buf_printf(&r->log, " %s{%s}=%s", hdr->attrs[i].name, hdr->attrs[i].ns,
                      hdr->attrs[i].value);
    for (size_t i = 0; i < nns; i++)
        rt_buf_printf(&r->log, " ns:%s=%s", ns[i].prefix, ns[i].uri);
    rt_buf_add(&r->log, "]", 1);
    return 0;
}

static const rt_xml_alloc_t t_allocator = {t_alloc, t_free};

static int t_stanza(void *ctx, rt_xml_el_t *el)
{
    rec_t *r = ctx;
    r->stanzas++;
    rt_buf_add(&r->log, "S[", 2);
    CHECK_EQ(rt_xml_put_tree(&r->log, el, r->parent_ns ? r->parent_ns : RT_XML_NS_CLIENT), 0);
    rt_buf_add(&r->log, "]", 1);
    if (r->keep) {
        rt_xml_free(&t_allocator, r, r->kept);
        r->kept = el;
    } else {
        rt_xml_free(&t_allocator, r, el);
    }
    if (r->stanzas == r->fail_on)
        return RT_ENOMEM;
    return r->stanzas == r->stop_on ? RT_XML_STOP : 0;
}

static int t_close(void *ctx)
{
    rec_t *r = ctx;
    rt_buf_add(&r->log, "C", 1);
    r->closed = true;
    return 0;
}

static rt_xml_stream_config_t config(void)
{
    return (rt_xml_stream_config_t){.alloc = t_allocator,
                                    .charge = t_charge,
                                    .on_header = t_header,
                                    .on_stanza = t_stanza,
                                    .on_close = t_close};
}

static void rec_done(rec_t *r)
{
    rt_xml_free(&t_allocator, r, r->kept);
    r->kept = NULL;
    rt_buf_free(&r->log);
}

/* ---- Feeding ---- */

typedef struct {
    char *log;
    rt_xml_cond_t cond;
    int rc;
} outcome_t;

/*
** Feeds the first `first` bytes in one call, then the rest in calls of `piece` bytes (0:
** all at once), as a connection would, up to the close or an error. Checks on the way that
** whatever was consumed was reported and that the stream gives everything back at its end.
*/
static outcome_t run_cfg(const rt_xml_stream_config_t *cfg, const char *d, size_t n, size_t first,
                         size_t piece)
{
    rec_t r = {0};
    rt_xml_stream_t s;
    outcome_t o = {0};
    CHECK_EQ(rt_xml_stream_init(&s, cfg, &r), 0);
    size_t off = 0;
    while (off < n) {
        size_t k = off == 0 && first ? first : piece ? piece : n - off;
        if (k > n - off)
            k = n - off;
        size_t used = 0;
        o.rc = rt_xml_stream_feed(&s, d + off, k, &used);
        CHECK(used <= k);
        if (o.rc)
            break;
        off += used;
        if (r.closed)
            break;
        CHECK_EQ(used, k); /* only the close ends a feed early here */
    }
    o.cond = rt_xml_stream_error(&s, NULL);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(r.blocks, 0);
    CHECK_EQ(r.charged, 0);
    o.log = strdup(r.log.data ? r.log.data : "");
    rec_done(&r);
    return o;
}

static outcome_t run(const char *d, size_t n, size_t first, size_t piece)
{
    rt_xml_stream_config_t cfg = config();
    return run_cfg(&cfg, d, n, first, piece);
}

static bool same(outcome_t a, outcome_t b)
{
    return a.cond == b.cond && a.rc == b.rc && strcmp(a.log, b.log) == 0;
}

#define HEADER                                                                                     \
    "<?xml version='1.0'?><stream:stream to='example.com' xmlns='jabber:client' "                  \
    "xmlns:stream='http://etherx.jabber.org/streams' version='1.0' xml:lang='en'>"

/* A client's stream: SASL, bind, presence, messages, a roster get, a ping, the close. */
static const char client_stream[] =
    HEADER "\n"
           "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='SCRAM-SHA-1'>"
           "biwsbj1qdWxpZXQscj1vTXNUQUF3QUFBQU1BQUFBTlAwVEFBQUFBQUJQVTBBQQ==</auth>\n"
           "<iq type='set' id='bind_1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>"
           "<resource>balcony</resource></bind></iq>\r\n"
           "<presence><show>away</show><status>on the balcony</status><priority>5</priority>"
           "<c xmlns='http://jabber.org/protocol/caps' hash='sha-1' node='https://x.example' "
           "ver='QgayPKawpkPSDYmwT/WM94uAlu0='/></presence> "
           "<message to='romeo@example.net' from='juliet@example.com/balcony' type='chat' "
           "id='ktx72v49' xml:lang='en'><body>Art thou not Romeo, &amp; a Montague? &lt;3 &#x1F600;"
           "</body><active xmlns='http://jabber.org/protocol/chatstates'/></message>\n\t"
           "<message to='romeo@example.net' type='chat'><body><![CDATA[<b>bold</b> & more]]>"
           " line one\r\nline two</body></message>"
           "<iq type='get' id='roster_1'><query xmlns='jabber:iq:roster'/></iq>"
           "<iq type='get' id='ping' to='example.com'><ping xmlns='urn:xmpp:ping'/></iq>   "
           "</stream:stream>";

/* ---- Tests ---- */

static void test_client_stream(void)
{
    rec_t r = {.keep = true};
    rt_xml_stream_config_t cfg = config();
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    size_t n = sizeof(client_stream) - 1, used = 0;
    const char *msg = strstr(client_stream, "<message");
    size_t upto = (size_t)(strstr(msg, "</message>") - client_stream) + 10;
    CHECK_EQ(rt_xml_stream_feed(&s, client_stream, upto, &used), 0);
    CHECK_EQ(used, upto);
    CHECK_EQ(r.stanzas, 4);
    const char *hdr = "H[stream{http://etherx.jabber.org/streams} to{}=example.com version{}=1.0 "
                      "lang{http://www.w3.org/XML/1998/namespace}=en ns:=jabber:client "
                      "ns:stream=http://etherx.jabber.org/streams]";
    CHECK(strncmp(r.log.data, hdr, strlen(hdr)) == 0);
    /* The lookups a c2s makes on the message. */
    rt_xml_el_t *m = r.kept;
    CHECK(m != NULL);
    CHECK(strcmp(m->name, "message") == 0 && strcmp(m->ns, RT_XML_NS_CLIENT) == 0);
    CHECK(strcmp(rt_xml_attr(m, "to"), "romeo@example.net") == 0);
    CHECK(strcmp(rt_xml_attr(m, "type"), "chat") == 0);
    CHECK(rt_xml_attr(m, "lang") == NULL);
    CHECK(strcmp(rt_xml_attr_ns(m, "lang", RT_XML_NS_XML), "en") == 0);
    rt_xml_el_t *body = rt_xml_child(m, "body", RT_XML_NS_CLIENT);
    CHECK(body != NULL);
    size_t len = 0;
    const char *text = rt_xml_text(body, &len);
    CHECK(text && strcmp(text, "Art thou not Romeo, & a Montague? <3 \xf0\x9f\x98\x80") == 0);
    CHECK_EQ(len, strlen(text));
    CHECK(rt_xml_child(m, "body", "jabber:server") == NULL);
    CHECK(rt_xml_child(m, "active", "http://jabber.org/protocol/chatstates") != NULL);
    CHECK(rt_xml_child(m, "active", NULL) == rt_xml_next(body, NULL, NULL));
    CHECK(rt_xml_first(m) == body);
    CHECK(rt_xml_text(m, NULL) == NULL); /* it has child elements */
    CHECK(strcmp(rt_xml_text(rt_xml_child(m, "active", NULL), &len), "") == 0 && len == 0);
    /* The rest: CDATA merged with the text around it, CRLF read as LF, then the close. */
    CHECK_EQ(rt_xml_stream_feed(&s, client_stream + upto, n - upto, &used), 0);
    CHECK_EQ(used, n - upto);
    CHECK_EQ(r.stanzas, 7);
    CHECK(strstr(r.log.data, "<body>&lt;b&gt;bold&lt;/b&gt; &amp; more line one\nline two</body>"));
    CHECK(r.log.data[r.log.len - 1] == 'C');
    CHECK_EQ(rt_xml_stream_feed(&s, " ", 1, &used), RT_EINVAL); /* closed */
    rt_xml_stream_destroy(&s);
    rec_done(&r);
    CHECK_EQ(r.blocks, 0);
    CHECK_EQ(r.charged, 0);
}

static void test_every_split(void)
{
    const char *d = client_stream;
    size_t n = sizeof(client_stream) - 1;
    outcome_t whole = run(d, n, 0, 0);
    CHECK_EQ(whole.rc, 0);
    CHECK(strstr(whole.log, "C") != NULL);
    int bad = 0;
    for (size_t at = 1; at < n; at++) {
        outcome_t o = run(d, n, at, 0);
        if (!same(o, whole) && bad++ < 3)
            fprintf(stderr, "split at %zu differs:\n%s\n%s\n", at, o.log, whole.log);
        free(o.log);
    }
    CHECK_EQ(bad, 0);
    for (size_t piece = 1; piece <= 7; piece++) {
        outcome_t o = run(d, n, 0, piece);
        CHECK(same(o, whole));
        free(o.log);
    }
    free(whole.log);
}

/* An idle stream holds its struct and nothing else: no parser, no buffer, no charge. */
static void test_idle_memory(void)
{
    rec_t r = {0};
    rt_xml_stream_config_t cfg = config();
    rt_xml_stream_t s;
    CHECK(sizeof(rt_xml_stream_t) <= 64);
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t));
    CHECK_EQ(rt_xml_stream_feed(&s, HEADER, strlen(HEADER), NULL), 0);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t));
    CHECK_EQ(r.blocks, 0);
    CHECK_EQ(r.charged, 0);
    /* Half a stanza: the parser and the partial tree are held, and charged. */
    const char *part = "<message to='a@b'><body>hel";
    CHECK_EQ(rt_xml_stream_feed(&s, part, strlen(part), NULL), 0);
    CHECK(rt_xml_stream_busy(&s));
    CHECK(r.blocks == 2 && r.bytes > 0);
    CHECK(r.charged > 1000);
    CHECK((long)rt_xml_stream_bytes(&s) >= r.charged + (long)sizeof(rt_xml_stream_t));
    fprintf(stderr, "  mid-stanza: %zu bytes held (%ld of them the parser's)\n",
            rt_xml_stream_bytes(&s), r.charged);
    const char *rest = "lo</body></message>";
    CHECK_EQ(rt_xml_stream_feed(&s, rest, strlen(rest), NULL), 0);
    CHECK_EQ(r.stanzas, 1);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t));
    CHECK_EQ(r.charged, 0);
    CHECK_EQ(r.blocks, 0);
    /* Keepalives take no parser; a stanza cut in a tag or before a CR's LF holds one. */
    CHECK_EQ(rt_xml_stream_feed(&s, " \n \r\n\t", 6, NULL), 0);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_feed(&s, "<presence", 9, NULL), 0);
    CHECK(rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_feed(&s, "/>\r", 3, NULL), 0);
    CHECK(!rt_xml_stream_busy(&s)); /* what is left is whitespace */
    CHECK_EQ(rt_xml_stream_feed(&s, "\n<presence/>", 12, NULL), 0);
    CHECK_EQ(r.stanzas, 3);
    /* A CDATA section between stanzas spans events: the parser stays until it ends. */
    CHECK_EQ(rt_xml_stream_feed(&s, "<![CDATA[", 9, NULL), 0);
    CHECK(rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_feed(&s, " ]]>", 4, NULL), 0);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t));
    rt_xml_stream_destroy(&s);
    rec_done(&r);

    /* A header with another prefix and an extra declaration: its copy is all it adds. */
    rec_t q = {0};
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &q), 0);
    const char *h2 = "<s:stream xmlns:s='http://etherx.jabber.org/streams' xmlns='jabber:client' "
                     "xmlns:x='urn:x&amp;y'>";
    CHECK_EQ(rt_xml_stream_feed(&s, h2, strlen(h2), NULL), 0);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(q.blocks, 1);
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t) + (size_t)q.bytes);
    const char *more = "<x:thing a='1'/><message/></s:stream>";
    size_t used = 0;
    CHECK_EQ(rt_xml_stream_feed(&s, more, 16, &used), 0);
    CHECK_EQ(rt_xml_stream_feed(&s, more + 16, strlen(more) - 16, &used), 0);
    CHECK_EQ(used, strlen(more) - 16);
    CHECK(strstr(q.log.data, "S[<thing xmlns='urn:x&amp;y' a='1'/>]S[<message/>]C") != NULL);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(q.blocks, 0);
    CHECK_EQ(q.charged, 0);
    rec_done(&q);
}

/* STARTTLS and SASL: a stanza's callback stops the feed, the stream restarts after it. */
static void test_restart(void)
{
    rec_t r = {.stop_on = 1};
    rt_xml_stream_config_t cfg = config();
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    const char *tls = HEADER "<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>\x16\x03\x01";
    size_t n = strlen(tls), used = 0;
    CHECK_EQ(rt_xml_stream_feed(&s, tls, n, &used), 0);
    CHECK_EQ(used, n - 3); /* the TLS record is not read */
    CHECK(!rt_xml_stream_busy(&s));
    rt_xml_stream_reset(&s);
    /* After the handshake: a new header, an <auth/> answered by success, another restart. */
    r.stop_on = 2;
    const char *again = HEADER "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>"
                               "AGp1bGlldAByMG0zMG15cjBtMzA=</auth>" HEADER "<presence/>";
    n = strlen(again);
    CHECK_EQ(rt_xml_stream_feed(&s, again, n, &used), 0);
    const char *second = strstr(again + 10, "<?xml");
    CHECK_EQ(used, (size_t)(second - again));
    rt_xml_stream_reset(&s);
    CHECK_EQ(rt_xml_stream_feed(&s, again + used, n - used, &used), 0);
    CHECK_EQ(r.stanzas, 3);
    int headers = 0;
    for (const char *p = r.log.data; (p = strstr(p, "H[")); p++)
        headers++;
    CHECK_EQ(headers, 3);
    /* A callback's error ends the feed and comes back from it; the stream goes on after. */
    r.fail_on = 4;
    CHECK_EQ(rt_xml_stream_feed(&s, "<presence/><presence/>", 22, &used), RT_ENOMEM);
    CHECK_EQ(used, 11);
    CHECK_EQ(rt_xml_stream_feed(&s, "<presence/>", 11, &used), 0);
    CHECK_EQ(r.stanzas, 5);
    /* A reset clears a failed stream too. */
    CHECK_EQ(rt_xml_stream_feed(&s, "<!-- x -->", 10, &used), RT_EPROTO);
    CHECK_EQ(rt_xml_stream_error(&s, NULL), RT_XML_COND_RESTRICTED_XML);
    CHECK_EQ(rt_xml_stream_feed(&s, "<presence/>", 11, &used), RT_EPROTO);
    rt_xml_stream_reset(&s);
    CHECK_EQ(rt_xml_stream_error(&s, NULL), RT_XML_COND_NONE);
    CHECK_EQ(rt_xml_stream_feed(&s, HEADER, strlen(HEADER), &used), 0);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(r.blocks, 0);
    CHECK_EQ(r.charged, 0);
    rec_done(&r);
}

static void test_framed(void)
{
    rec_t r = {.parent_ns = ""};
    rt_xml_stream_config_t cfg = config();
    cfg.framed = true;
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    const char *msg = "<message xmlns='jabber:client' to='a@b'><body>hi</body></message>";
    CHECK_EQ(rt_xml_stream_frame(&s, msg, strlen(msg)), RT_EPROTO);
    CHECK_EQ(rt_xml_stream_error(&s, NULL), RT_XML_COND_BAD_FORMAT);
    rt_xml_stream_reset(&s);
    const char *open = "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='example.com' "
                       "version='1.0'/>";
    CHECK_EQ(rt_xml_stream_frame(&s, open, strlen(open)), 0);
    CHECK(strstr(r.log.data, "H[open{urn:ietf:params:xml:ns:xmpp-framing} to{}=example.com "
                             "version{}=1.0 ns:=urn:ietf:params:xml:ns:xmpp-framing]") != NULL);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_frame(&s, msg, strlen(msg)), 0);
    CHECK_EQ(r.stanzas, 1);
    CHECK(
        strstr(r.log.data, "S[<message xmlns='jabber:client' to='a@b'><body>hi</body></message>]"));
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(rt_xml_stream_bytes(&s), sizeof(rt_xml_stream_t));
    CHECK_EQ(rt_xml_stream_feed(&s, msg, strlen(msg), NULL), RT_EINVAL);
    const char *close = "<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>";
    CHECK_EQ(rt_xml_stream_frame(&s, close, strlen(close)), 0);
    CHECK(r.log.data[r.log.len - 1] == 'C');
    CHECK_EQ(rt_xml_stream_frame(&s, msg, strlen(msg)), RT_EINVAL);
    /* Restart (after SASL): a new <open/>. */
    rt_xml_stream_reset(&s);
    CHECK_EQ(rt_xml_stream_frame(&s, open, strlen(open)), 0);
    CHECK_EQ(rt_xml_stream_frame(&s, open, strlen(open)), RT_EPROTO);
    CHECK_EQ(rt_xml_stream_error(&s, NULL), RT_XML_COND_BAD_FORMAT);
    struct {
        const char *frame;
        rt_xml_cond_t cond;
    } bad[] = {
        {"<message xmlns='jabber:client'/><message xmlns='jabber:client'/>",
         RT_XML_COND_NOT_WELL_FORMED},
        {"<message xmlns='jabber:client'>", RT_XML_COND_NOT_WELL_FORMED},
        {"", RT_XML_COND_NOT_WELL_FORMED},
        {"<message to='a@b'/>", RT_XML_COND_INVALID_NAMESPACE},
        {"<message xmlns='jabber:client'><!-- hi --></message>", RT_XML_COND_RESTRICTED_XML},
        {"<stuff xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>", RT_XML_COND_BAD_FORMAT},
        {"\xff\xfe<\0m\0/\0>\0", RT_XML_COND_UNSUPPORTED_ENCODING},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rt_xml_stream_reset(&s);
        CHECK_EQ(rt_xml_stream_frame(&s, open, strlen(open)), 0);
        size_t len = i == 6 ? 10 : strlen(bad[i].frame);
        CHECK_EQ(rt_xml_stream_frame(&s, bad[i].frame, len), RT_EPROTO);
        CHECK_EQ(rt_xml_stream_error(&s, NULL), bad[i].cond);
        CHECK(!rt_xml_stream_busy(&s));
    }
    /* A frame of max_stanza_bytes is read; one byte more is refused before it is parsed. */
    rt_xml_stream_config_t small = cfg;
    small.limits.max_stanza_bytes = 100;
    rt_xml_stream_t t;
    CHECK_EQ(rt_xml_stream_init(&t, &small, &r), 0);
    CHECK_EQ(rt_xml_stream_frame(&t, open, strlen(open)), 0);
    char frame[128];
    const char *head = "<message xmlns='jabber:client'><body>", *tail = "</body></message>";
    size_t fill = 100 - strlen(head) - strlen(tail);
    for (int extra = 0; extra < 2; extra++) {
        int len = snprintf(frame, sizeof frame, "%s%.*s%s", head, (int)fill + extra,
                           "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", tail);
        CHECK_EQ(len, 100 + extra);
        CHECK_EQ(rt_xml_stream_frame(&t, frame, (size_t)len), extra ? RT_EPROTO : 0);
    }
    CHECK_EQ(rt_xml_stream_error(&t, NULL), RT_XML_COND_POLICY_VIOLATION);
    rt_xml_stream_destroy(&t);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(r.blocks, 0);
    rec_done(&r);
}

/* Fed whole and byte by byte: the same condition, and the same events before it. */
static void expect_in(const rt_xml_stream_config_t *cfg, const char *d, size_t n,
                      rt_xml_cond_t cond, const char *what)
{
    outcome_t whole = run_cfg(cfg, d, n, 0, 0), bytes = run_cfg(cfg, d, n, 0, 1);
    if (whole.cond != cond)
        fprintf(stderr, "%s: %s, expected %s\n", what, rt_xml_cond_name(whole.cond),
                rt_xml_cond_name(cond));
    CHECK_EQ(whole.cond, cond);
    CHECK_EQ(whole.rc, cond == RT_XML_COND_NONE ? 0 : RT_EPROTO);
    if (!same(whole, bytes))
        fprintf(stderr, "%s: byte by byte differs: %s (%d)\n%s\n%s\n", what,
                rt_xml_cond_name(bytes.cond), bytes.rc, whole.log, bytes.log);
    CHECK(same(whole, bytes));
    free(whole.log);
    free(bytes.log);
}

static void expect_error(const char *d, size_t n, rt_xml_cond_t cond, const char *what)
{
    rt_xml_stream_config_t cfg = config();
    expect_in(&cfg, d, n, cond, what);
}

static void expect_error_str(const char *d, rt_xml_cond_t cond)
{
    expect_error(d, strlen(d), cond, d);
}

static void test_errors(void)
{
    expect_error_str("<?xml version='1.0'?><!DOCTYPE lolz [<!ENTITY lol 'lol'>"
                     "<!ENTITY lol1 '&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;'>"
                     "<!ENTITY lol2 '&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;'>"
                     "]><stream:stream xmlns='jabber:client' "
                     "xmlns:stream='http://etherx.jabber.org/streams'>&lol2;",
                     RT_XML_COND_RESTRICTED_XML);
    expect_error_str("<!DOCTYPE stream:stream>" HEADER, RT_XML_COND_RESTRICTED_XML);
    expect_error_str(HEADER "<!-- a comment -->", RT_XML_COND_RESTRICTED_XML);
    expect_error_str("<!-- a comment -->" HEADER, RT_XML_COND_RESTRICTED_XML);
    expect_error_str(HEADER "<?php echo 1; ?>", RT_XML_COND_RESTRICTED_XML);
    expect_error_str(HEADER "<message><body>&nbsp;</body></message>", RT_XML_COND_RESTRICTED_XML);
    expect_error_str(HEADER "<message to='&lol;'/>", RT_XML_COND_RESTRICTED_XML);
    expect_error_str("<?xml version='1.0' encoding='ISO-8859-1'?><stream:stream "
                     "xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
                     RT_XML_COND_UNSUPPORTED_ENCODING);
    expect_error("\xfe\xff\0<\0s", 6, RT_XML_COND_UNSUPPORTED_ENCODING, "UTF-16 BOM");
    expect_error("<\0s\0t\0", 6, RT_XML_COND_UNSUPPORTED_ENCODING, "UTF-16LE, no BOM");
    expect_error("\0<\0s\0t", 6, RT_XML_COND_UNSUPPORTED_ENCODING, "UTF-16BE, no BOM");
    expect_error(" \0", 2, RT_XML_COND_UNSUPPORTED_ENCODING, "a NUL second");
    expect_error("\x01\0", 2, RT_XML_COND_NOT_WELL_FORMED, "a control first");
    expect_error("\xef\xbb\xbf" HEADER "<presence/>", strlen(HEADER) + 14, RT_XML_COND_NONE,
                 "UTF-8 BOM");
    expect_error_str(HEADER "<message><body>caf\xc3</body></message>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body>\xc0\xaf</body></message>",
                     RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body>\xed\xa0\x80</body></message>",
                     RT_XML_COND_NOT_WELL_FORMED);
    static const char nul[] = HEADER "<message><body>a\0b</body></message>";
    expect_error(nul, sizeof(nul) - 1, RT_XML_COND_NOT_WELL_FORMED, "U+0000");
    expect_error_str(HEADER "<message><body>&#0;</body></message>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body>\xef\xbf\xbe</body></message>",
                     RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body>&#xFFFE;</body></message>",
                     RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body>\x01</body></message>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message><body></message>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<message a='1' a='2'/>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "<?xml version='1.0'?>", RT_XML_COND_NOT_WELL_FORMED);
    expect_error_str(HEADER "</stream:stream><message/>", RT_XML_COND_NONE);
    expect_error_str("<stream:stream xmlns='jabber:client' xmlns:stream='urn:wrong'>",
                     RT_XML_COND_INVALID_NAMESPACE);
    expect_error_str("<stream:stream xmlns='jabber:server' "
                     "xmlns:stream='http://etherx.jabber.org/streams'>",
                     RT_XML_COND_INVALID_NAMESPACE);
    expect_error_str("<stream:stream xmlns:stream='http://etherx.jabber.org/streams'>",
                     RT_XML_COND_INVALID_NAMESPACE);
    expect_error_str("<stream xmlns='http://etherx.jabber.org/streams'>",
                     RT_XML_COND_BAD_NAMESPACE_PREFIX);
    expect_error_str("<stream:features xmlns='jabber:client' "
                     "xmlns:stream='http://etherx.jabber.org/streams'>",
                     RT_XML_COND_BAD_FORMAT);
    expect_error_str("<foo:stream xmlns='jabber:client'>", RT_XML_COND_BAD_NAMESPACE_PREFIX);
    expect_error_str(HEADER "<foo:message/>", RT_XML_COND_BAD_NAMESPACE_PREFIX);
    expect_error_str(HEADER "<presence/>hello<presence/>", RT_XML_COND_INVALID_XML);
    expect_error_str(HEADER "<presence/>&amp;<presence/>", RT_XML_COND_INVALID_XML);
    expect_error_str(HEADER "<presence/><![CDATA[x]]></stream:stream>", RT_XML_COND_INVALID_XML);
    /* Text that expat refuses whole ("]]>" in it) is not-well-formed however it is split. */
    expect_error_str(HEADER "<presence/>x]]><presence/>", RT_XML_COND_NOT_WELL_FORMED);
    /* Whitespace between stanzas, however written, is no error. */
    expect_error_str(HEADER " &#32; <![CDATA[ ]]><presence/>\r", RT_XML_COND_NONE);
}

static char *repeat(const char *head, const char *unit, size_t times, const char *tail, size_t *n)
{
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *b = malloc(hl + ul * times + tl + 1);
    memcpy(b, head, hl);
    for (size_t i = 0; i < times; i++)
        memcpy(b + hl + i * ul, unit, ul);
    memcpy(b + hl + ul * times, tail, tl + 1);
    *n = hl + ul * times + tl;
    return b;
}

/* Feeds d in 64 KB reads; returns the condition, with the most the session held on the way. */
static rt_xml_cond_t feed_big(const rt_xml_stream_config_t *cfg, const char *d, size_t n,
                              long *max_held, const char **text)
{
    rec_t r = {0};
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, cfg, &r), 0);
    for (size_t off = 0; off < n;) {
        size_t k = n - off < 65536 ? n - off : 65536;
        if (rt_xml_stream_feed(&s, d + off, k, NULL))
            break;
        off += k;
    }
    *max_held = r.max_charged + r.max_bytes;
    rt_xml_cond_t cond = rt_xml_stream_error(&s, text);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(r.blocks, 0);
    CHECK_EQ(r.charged, 0);
    rec_done(&r);
    return cond;
}

/* Under cfg, d fed whole and byte by byte ends with cond, the same events each time. */
static void expect_cfg(const rt_xml_stream_config_t *cfg, const char *d, rt_xml_cond_t cond)
{
    expect_in(cfg, d, strlen(d), cond, d);
}

static void test_bounds(void)
{
    rt_xml_stream_config_t cfg = config();
    size_t n;
    long held;
    const char *text;
    /* A 10 MB stanza: refused at 256 KiB, having held about that much. */
    char *big =
        repeat(HEADER "<message><body>", "0123456789abcdef", 10 << 16, "</body></message>", &n);
    CHECK_EQ(feed_big(&cfg, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(strcmp(text, "stanza too large") == 0);
    CHECK(held < 3 * RT_XML_MAX_STANZA_DEFAULT);
    fprintf(stderr, "  10 MB stanza: refused, at most %ld bytes held\n", held);
    free(big);
    /* One huge attribute value, one token for expat: the same. */
    big = repeat(HEADER "<message to='", "x", 10 << 20, "'/>", &n);
    CHECK_EQ(feed_big(&cfg, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(held < 3 * RT_XML_MAX_STANZA_DEFAULT);
    free(big);
    /* 10,000 levels deep. */
    big = repeat(HEADER "<message>", "<a>", 10000, "", &n);
    CHECK_EQ(feed_big(&cfg, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(strcmp(text, "stanza nested too deep") == 0);
    free(big);
    /* 100,000 attributes: past the stanza bound first, then past the attribute bound. */
    size_t cap = 100000 * 12 + 64;
    char *attrs = malloc(cap), *q = attrs;
    q += sprintf(q, "%s<message", HEADER);
    for (int i = 0; i < 100000; i++)
        q += sprintf(q, " a%d=''", i);
    q += sprintf(q, "/>");
    n = (size_t)(q - attrs);
    CHECK_EQ(feed_big(&cfg, attrs, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    rt_xml_stream_config_t roomy = cfg;
    roomy.limits.max_stanza_bytes = 4 << 20;
    CHECK_EQ(feed_big(&roomy, attrs, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(strcmp(text, "too many attributes") == 0);
    free(attrs);
    /* A header never finished, and one that never starts its root. */
    big = repeat("<stream:stream xmlns='jabber:client'", " to='example.com'", 1000, "", &n);
    CHECK_EQ(feed_big(&cfg, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(strcmp(text, "stream header too long") == 0);
    free(big);
    big = repeat("<?xml version='1.0'?>", "\n", 5000, "", &n);
    CHECK_EQ(feed_big(&cfg, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    free(big);
    /* A stanza too large as a tree though small in bytes: empty elements. */
    rt_xml_stream_config_t tight = cfg;
    tight.limits.max_stanza_bytes = 4096;
    tight.limits.max_depth = 3;
    big = repeat(HEADER "<iq><q>", "<a/>", 1000, "</q></iq>", &n);
    CHECK_EQ(feed_big(&tight, big, n, &held, &text), RT_XML_COND_POLICY_VIOLATION);
    CHECK(strcmp(text, "stanza too large as a tree") == 0);
    free(big);

    /* Each bound at its exact edge: at it passes, one past it is refused. */
    tight.limits.max_attrs = 3; /* the header has 3 */
    expect_cfg(&tight, HEADER "<a><b><c/></b></a>", RT_XML_COND_NONE);
    expect_cfg(&tight, HEADER "<a><b><c><d/></c></b></a>", RT_XML_COND_POLICY_VIOLATION);
    expect_cfg(&tight, HEADER "<a x='1' y='2' z='3'/>", RT_XML_COND_NONE);
    expect_cfg(&tight, HEADER "<a x='1' y='2' z='3' w='4'/>", RT_XML_COND_POLICY_VIOLATION);
    for (size_t extra = 0; extra < 2; extra++) {
        /* A stanza of exactly max_stanza_bytes, then one byte more, at every read size. */
        rt_xml_stream_config_t edge = cfg;
        edge.limits.max_stanza_bytes = 100;
        edge.limits.max_header_bytes = (uint32_t)strlen(HEADER);
        size_t body = 100 - strlen("<message><body></body></message>") + extra;
        big = repeat(HEADER "<message><body>", "x", body, "</body></message>", &n);
        outcome_t whole = run_cfg(&edge, big, n, 0, 0);
        CHECK_EQ(whole.cond, extra ? RT_XML_COND_POLICY_VIOLATION : RT_XML_COND_NONE);
        for (size_t piece = 1; piece < 40; piece += 3) {
            outcome_t p = run_cfg(&edge, big, n, 0, piece);
            CHECK(same(p, whole));
            free(p.log);
        }
        free(whole.log);
        free(big);
    }
    /* A header of exactly max_header_bytes, and one byte more. */
#define BARE "<stream:stream xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>"
    rt_xml_stream_config_t hdr = cfg;
    hdr.limits.max_header_bytes = (uint32_t)strlen(BARE);
    expect_cfg(&hdr, BARE, RT_XML_COND_NONE);
    expect_cfg(&hdr, " " BARE, RT_XML_COND_POLICY_VIOLATION);
    /* Limits past their caps are refused. */
    rt_xml_stream_t s;
    rt_xml_stream_config_t wrong = cfg;
    wrong.limits.max_depth = RT_XML_DEPTH_CAP + 1;
    CHECK_EQ(rt_xml_stream_init(&s, &wrong, NULL), RT_EINVAL);
    wrong = cfg;
    wrong.limits.max_stanza_bytes = RT_XML_MAX_STANZA_CAP + 1;
    CHECK_EQ(rt_xml_stream_init(&s, &wrong, NULL), RT_EINVAL);
    wrong = cfg;
    wrong.limits.max_attrs = RT_XML_MAX_ATTRS_CAP + 1;
    CHECK_EQ(rt_xml_stream_init(&s, &wrong, NULL), RT_EINVAL);
}

/*
** Streams taking turns on one thread's parsers: one given back between stanzas is taken by
** the next stream with the same header, which goes on from there. Each still sees what it
** would alone, and its stanza bound falls at the same byte.
*/
static void test_shared_parsers(void)
{
    rt_xml_stream_config_t cfg = config();
    cfg.limits.max_stanza_bytes = 100;
    rec_t ra = {0}, rb = {0};
    rt_xml_stream_t a, b;
    CHECK_EQ(rt_xml_stream_init(&a, &cfg, &ra), 0);
    CHECK_EQ(rt_xml_stream_init(&b, &cfg, &rb), 0);
    CHECK_EQ(rt_xml_stream_feed(&a, HEADER, strlen(HEADER), NULL), 0);
    CHECK_EQ(rt_xml_stream_feed(&b, BARE, strlen(BARE), NULL), 0);
    const char *m = "<message to='a@b'><body>hi</body></message>";
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(rt_xml_stream_feed(&a, m, strlen(m), NULL), 0);
        CHECK_EQ(rt_xml_stream_feed(&b, m, 7, NULL), 0); /* b holds its parser mid-stanza */
        CHECK_EQ(rt_xml_stream_feed(&a, "\n", 1, NULL), 0);
        CHECK_EQ(rt_xml_stream_feed(&b, m + 7, strlen(m) - 7, NULL), 0);
        CHECK(!rt_xml_stream_busy(&a) && !rt_xml_stream_busy(&b));
    }
    CHECK_EQ(ra.stanzas, 20);
    CHECK_EQ(rb.stanzas, 20);
    /* A stanza of exactly the bound on a, one byte more on b. */
    size_t n;
    char *edge = repeat("<message><body>", "x", 100 - strlen("<message><body></body></message>"),
                        "</body></message>", &n);
    CHECK_EQ(rt_xml_stream_feed(&a, edge, n, NULL), 0);
    CHECK_EQ(ra.stanzas, 21);
    free(edge);
    edge = repeat("<message><body>", "x", 101 - strlen("<message><body></body></message>"),
                  "</body></message>", &n);
    CHECK_EQ(rt_xml_stream_feed(&b, edge, n, NULL), RT_EPROTO);
    CHECK_EQ(rt_xml_stream_error(&b, NULL), RT_XML_COND_POLICY_VIOLATION);
    free(edge);
    /* A stop at a stanza's end leaves a parser the next stream goes on with. */
    ra.stop_on = ra.stanzas + 1;
    size_t used = 0;
    CHECK_EQ(rt_xml_stream_feed(&a, m, strlen(m), &used), 0);
    CHECK_EQ(used, strlen(m));
    CHECK_EQ(ra.stanzas, 22);
    rt_xml_stream_reset(&b);
    CHECK_EQ(rt_xml_stream_feed(&b, HEADER, strlen(HEADER), NULL), 0);
    CHECK_EQ(rt_xml_stream_feed(&b, m, strlen(m), NULL), 0);
    CHECK_EQ(rt_xml_stream_feed(&a, m, strlen(m), NULL), 0);
    CHECK(ra.stanzas == 23 && rb.stanzas == 21);
    /* The close matches a's own root, whoever's parser it ends on. */
    CHECK_EQ(rt_xml_stream_feed(&a, "</stream:stream>", 16, NULL), 0);
    CHECK(ra.closed);
    rt_xml_stream_destroy(&a);
    rt_xml_stream_destroy(&b);
    CHECK(ra.blocks == 0 && rb.blocks == 0 && ra.charged == 0 && rb.charged == 0);
    rec_done(&ra);
    rec_done(&rb);
}

static char *put_text_str(const char *s, size_t n, bool attr)
{
    rt_buf_t b = {0};
    if (attr)
        rt_xml_put_attr_len(&b, "v", s, n);
    else
        rt_xml_put_text(&b, s, n);
    rt_buf_add(&b, "", 0);
    char *out = strdup(b.data ? b.data : "");
    rt_buf_free(&b);
    return out;
}

static void test_writer_escaping(void)
{
    const char in[] = "a<b&c>d\"e'f\r\n\tg]]>";
    char *t = put_text_str(in, sizeof(in) - 1, false);
    CHECK(strcmp(t, "a&lt;b&amp;c&gt;d\"e'f&#13;\n\tg]]&gt;") == 0);
    free(t);
    t = put_text_str(in, sizeof(in) - 1, true);
    CHECK(strcmp(t, " v='a&lt;b&amp;c&gt;d&quot;e&apos;f&#13;&#10;&#9;g]]&gt;'") == 0);
    free(t);
    /* What XML cannot carry becomes U+FFFD; UTF-8 it can carry is kept. */
    const char forbidden[] = "\x01|\0|\x1f|\xef\xbf\xbe|\xef\xbf\xbf|\xc0\xaf|\xed\xa0\x80|\xff|"
                             "\xf4\x90\x80\x80|\xe2\x82";
    t = put_text_str(forbidden, sizeof(forbidden) - 1, false);
    CHECK(strcmp(t,
                 "\xef\xbf\xbd|\xef\xbf\xbd|\xef\xbf\xbd|\xef\xbf\xbd|\xef\xbf\xbd|"
                 "\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd|"
                 "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd") == 0);
    free(t);
    const char fine[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbd \x7f";
    t = put_text_str(fine, sizeof(fine) - 1, true);
    CHECK(strcmp(t, " v='caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbd \x7f'") == 0);
    free(t);

    /* Written from parts, parsed back: every value as it was. */
    const char *values[] = {in,
                            "plain",
                            "",
                            " lead and trail ",
                            "tab\there\nnl\r\ncrlf",
                            "&amp; is not an entity here",
                            fine};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        rt_buf_t b = {0};
        rt_buf_add(&b, HEADER, strlen(HEADER));
        rt_xml_put_start(&b, "message");
        rt_xml_put_attr(&b, "id", values[i]);
        rt_xml_put_start_end(&b);
        rt_xml_put_start(&b, "body");
        rt_xml_put_start_end(&b);
        rt_xml_put_text(&b, values[i], strlen(values[i]));
        rt_xml_put_end(&b, "body");
        rt_xml_put_start(&b, "x");
        rt_xml_put_attr(&b, "xmlns", "urn:x");
        rt_xml_put_empty_end(&b);
        rt_xml_put_end(&b, "message");
        CHECK(!b.oom);
        rec_t r = {.keep = true};
        rt_xml_stream_config_t cfg = config();
        rt_xml_stream_t s;
        CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
        CHECK_EQ(rt_xml_stream_feed(&s, b.data, b.len, NULL), 0);
        CHECK(r.kept != NULL);
        if (r.kept) {
            CHECK(strcmp(rt_xml_attr(r.kept, "id"), values[i]) == 0);
            const char *text = rt_xml_text(rt_xml_child(r.kept, "body", RT_XML_NS_CLIENT), NULL);
            CHECK(text && strcmp(text, values[i]) == 0);
            CHECK(rt_xml_child(r.kept, "x", "urn:x") != NULL);
        }
        rt_xml_stream_destroy(&s);
        rec_done(&r);
        rt_buf_free(&b);
    }
}

/* Parses d (one stream) and returns its stanzas' trees in order (kept in r by the caller). */
typedef struct {
    rec_t r;
    rt_xml_el_t *trees[16];
    int n;
} collect_t;

static int collect_stanza(void *ctx, rt_xml_el_t *el)
{
    collect_t *c = ctx;
    if (c->n < 16)
        c->trees[c->n++] = el;
    else
        rt_xml_free(&t_allocator, &c->r, el);
    return 0;
}

static void *c_alloc(void *ctx, size_t n, bool scan)
{
    return t_alloc(&((collect_t *)ctx)->r, n, scan);
}

static void c_free(void *ctx, void *p)
{
    t_free(&((collect_t *)ctx)->r, p);
}

static const rt_xml_alloc_t c_allocator = {c_alloc, c_free};

static void collect(collect_t *c, const char *d, size_t n)
{
    rt_xml_stream_config_t cfg = {.alloc = c_allocator, .on_stanza = collect_stanza};
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, c), 0);
    CHECK_EQ(rt_xml_stream_feed(&s, d, n, NULL), 0);
    rt_xml_stream_destroy(&s);
}

static void collect_free(collect_t *c)
{
    for (int i = 0; i < c->n; i++)
        rt_xml_free(&c_allocator, c, c->trees[i]);
    CHECK_EQ(c->r.blocks, 0);
    rec_done(&c->r);
}

static void test_round_trip(void)
{
    const char tricky[] =
        HEADER "<message xmlns:e='urn:e' e:flag='1' xml:lang='fr' a='&#9;&#10;&#13;'>"
               "<body>x&#13;y<![CDATA[<z>]]></body>"
               "<e:ext xmlns='urn:default' e:a='2' b='3'><inner/><none xmlns=''>t</none>"
               "<deep xmlns:f='urn:f' f:one='1' f:two='2' xmlns:g='urn:g' g:three='3'/>"
               "</e:ext>mixed<b>text</b>tail</message>";
    for (int round = 0; round < 2; round++) {
        const char *src = round ? tricky : client_stream;
        size_t n = strlen(src);
        collect_t first = {0}, second = {0};
        collect(&first, src, n);
        CHECK(first.n > 0);
        rt_buf_t b = {0};
        rt_buf_add(&b, HEADER, strlen(HEADER));
        for (int i = 0; i < first.n; i++)
            CHECK_EQ(rt_xml_put_tree(&b, first.trees[i], RT_XML_NS_CLIENT), 0);
        collect(&second, b.data, b.len);
        CHECK_EQ(second.n, first.n);
        for (int i = 0; i < first.n && i < second.n; i++)
            CHECK(rt_xml_equal(first.trees[i], second.trees[i]));
        if (round == 1 && first.n == 1) {
            rt_xml_el_t *m = first.trees[0];
            CHECK(strcmp(rt_xml_attr_ns(m, "flag", "urn:e"), "1") == 0);
            CHECK(strcmp(rt_xml_attr(m, "a"), "\t\n\r") == 0);
            rt_xml_el_t *ext = rt_xml_child(m, "ext", "urn:e");
            CHECK(ext && rt_xml_child(ext, "inner", "urn:default") != NULL);
            CHECK(ext && rt_xml_child(ext, "none", "") != NULL);
            CHECK(strcmp(rt_xml_text(rt_xml_child(m, "body", NULL), NULL), "x\ry<z>") == 0);
            /* A changed value is seen. */
            CHECK(!rt_xml_equal(first.trees[0], rt_xml_child(m, "body", NULL)));
        }
        rt_buf_free(&b);
        collect_free(&first);
        collect_free(&second);
    }
}

/* A stream left mid-stanza on one thread and finished on another, as an actor migrates. */
typedef struct {
    rt_xml_stream_t *s;
    const char *d;
    size_t n;
    int rc; /* the feed's, checked by the main thread once joined */
} half_t;

static void *feed_thread(void *arg)
{
    half_t *h = arg;
    h->rc = rt_xml_stream_feed(h->s, h->d, h->n, NULL);
    rt_xml_pool_trim();
    return NULL;
}

static void test_threads(void)
{
    rec_t r = {0};
    rt_xml_stream_config_t cfg = config();
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    const char *d = HEADER "<message><body>one</body></message><message><body>tw";
    half_t a = {&s, d, strlen(d), -1}, b = {&s, "o</body></message>", 18, -1};
    /* The callbacks CHECK on the feeding thread: the main thread checks nothing until it
       has joined it (the counters are plain ints). */
    pthread_t t;
    int created = pthread_create(&t, NULL, feed_thread, &a);
    if (created == 0)
        pthread_join(t, NULL);
    CHECK_EQ(created, 0);
    CHECK_EQ(a.rc, 0);
    CHECK(rt_xml_stream_busy(&s));
    created = pthread_create(&t, NULL, feed_thread, &b);
    if (created == 0)
        pthread_join(t, NULL);
    CHECK_EQ(created, 0);
    CHECK_EQ(b.rc, 0);
    CHECK(!rt_xml_stream_busy(&s));
    CHECK_EQ(r.stanzas, 2);
    CHECK(strstr(r.log.data, "<body>two</body>") != NULL);
    rt_xml_stream_destroy(&s);
    CHECK_EQ(r.charged, 0);
    rec_done(&r);
}

static int count_stanza(void *ctx, rt_xml_el_t *el)
{
    rec_t *r = ctx;
    r->stanzas++;
    rt_xml_free(&t_allocator, r, el);
    return 0;
}

/* The figure only: a typical <message/> with a body, to an idle stream, as it arrives. */
static void test_cpu_figure(void)
{
    rec_t r = {0};
    rt_xml_stream_config_t cfg = config();
    cfg.on_stanza = count_stanza;
    rt_xml_stream_t s;
    CHECK_EQ(rt_xml_stream_init(&s, &cfg, &r), 0);
    CHECK_EQ(rt_xml_stream_feed(&s, HEADER, strlen(HEADER), NULL), 0);
    const char *m = "<message to='romeo@example.net/orchard' from='juliet@example.com/balcony' "
                    "type='chat' id='ktx72v49' xml:lang='en'><body>Art thou not Romeo, and a "
                    "Montague?</body><active xmlns='http://jabber.org/protocol/chatstates'/>"
                    "<request xmlns='urn:xmpp:receipts'/></message>";
    size_t n = strlen(m);
    long iters = check_scale(200000);
    double t0 = now_s();
    for (long i = 0; i < iters; i++)
        rt_xml_stream_feed(&s, m, n, NULL);
    double dt = now_s() - t0;
    CHECK_EQ(r.stanzas, iters);
    CHECK(!rt_xml_stream_busy(&s));
    fprintf(stderr, "  a %zu-byte <message/>: %.2f us parsed, tree built and freed (%.0f MB/s)\n",
            n, dt / (double)iters * 1e6, (double)n * (double)iters / dt / 1e6);
    rt_xml_stream_destroy(&s);
    rec_done(&r);
}

int main(void)
{
    RUN(test_client_stream);
    RUN(test_every_split);
    RUN(test_idle_memory);
    RUN(test_restart);
    RUN(test_framed);
    RUN(test_errors);
    RUN(test_bounds);
    RUN(test_shared_parsers);
    RUN(test_writer_escaping);
    RUN(test_round_trip);
    RUN(test_threads);
    RUN(test_cpu_figure);
    rt_xml_pool_trim();
    return CHECK_SUMMARY();
}

/*
** The XMPP XML stream (actors/xmpp: xml_stream.c, xml.c, xml_write.c).
**
** Input: byte 0 picks the mode (bit 0: small bounds, so that every bound is reached; bit 1:
** WebSocket framing, frames separated by 0x1e; bit 2: every stanza's callback stops the
** feed, which then goes on from where it stopped, as after STARTTLS), bytes 1 and 2 a split
** point, the rest is the stream. A TCP stream is parsed whole, in two reads split there,
** and in small reads: the events (header, stanzas as written back, close), the outcome and
** the bytes consumed must be the same each time. Every stanza is written back
** (rt_xml_put_tree) and parsed again to an equal tree. After each run nothing may be left
** allocated through the session's allocator nor charged to it.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "xml.h"
#include "xml_stream.h"
#include "xml_write.h"

#define FRAME_SEP 0x1e
#define MAX_KEPT 64
#define HEADER                                                                                     \
    "<stream:stream xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>"

typedef struct {
    uint64_t digest; /* of the events in order */
    long blocks;     /* allocator blocks outstanding */
    long charged;
    bool stop;   /* answer RT_XML_STOP to every stanza */
    bool closed; /* the close was reported */
    bool keep;   /* keep the stanzas for the round trip */
    rt_xml_el_t *kept[MAX_KEPT];
    int nkept;
} session_t;

typedef struct {
    uint64_t digest;
    rt_xml_cond_t cond;
    int rc;
    size_t consumed;
} outcome_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void *s_alloc(void *ctx, size_t n, bool scan)
{
    session_t *s = ctx;
    void *p = malloc(n);
    if (p)
        s->blocks++;
    return p;
}

static void s_free(void *ctx, void *p)
{
    session_t *s = ctx;
    if (p)
        s->blocks--;
    free(p);
}

static const rt_xml_alloc_t s_allocator = {s_alloc, s_free};

static void s_charge(void *ctx, ptrdiff_t d)
{
    ((session_t *)ctx)->charged += d;
}

static int s_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    session_t *s = ctx;
    rt_buf_t b = {0};
    rt_buf_printf(&b, "H %s %s", hdr->name, hdr->ns);
    for (uint32_t i = 0; i < hdr->node.len; i++)
        rt_buf_printf(&b, " %s %s %s", hdr->attrs[i].name, hdr->attrs[i].ns, hdr->attrs[i].value);
    for (size_t i = 0; i < nns; i++)
        rt_buf_printf(&b, " ns %s %s", ns[i].prefix, ns[i].uri);
    if (b.oom)
        abort();
    s->digest = fnv(s->digest, b.data, b.len);
    rt_buf_free(&b);
    return 0;
}

static int s_stanza(void *ctx, rt_xml_el_t *el)
{
    session_t *s = ctx;
    rt_buf_t b = {0};
    rt_buf_add(&b, "S", 1);
    if (rt_xml_put_tree(&b, el, RT_XML_NS_CLIENT) != 0)
        abort();
    s->digest = fnv(s->digest, b.data, b.len);
    rt_buf_free(&b);
    if (s->keep && s->nkept < MAX_KEPT)
        s->kept[s->nkept++] = el;
    else
        rt_xml_free(&s_allocator, s, el);
    return s->stop ? RT_XML_STOP : 0;
}

static int s_close(void *ctx)
{
    session_t *s = ctx;
    s->digest = fnv(s->digest, "C", 1);
    s->closed = true;
    return 0;
}

static rt_xml_stream_config_t config(uint8_t mode)
{
    rt_xml_stream_config_t cfg = {.alloc = s_allocator,
                                  .charge = s_charge,
                                  .on_header = s_header,
                                  .on_stanza = s_stanza,
                                  .on_close = s_close,
                                  .framed = (mode & 2) != 0};
    if (mode & 1)
        cfg.limits = (rt_xml_limits_t){
            .max_stanza_bytes = 200, .max_depth = 4, .max_attrs = 3, .max_header_bytes = 300};
    return cfg;
}

static void finish(session_t *s, rt_xml_stream_t *st, outcome_t *o)
{
    o->cond = rt_xml_stream_error(st, NULL);
    rt_xml_stream_destroy(st);
    if (s->charged != 0 || rt_xml_stream_bytes(st) != sizeof(*st))
        abort();
    o->digest = s->digest;
}

/*
** Feeds d in reads: the first of `first` bytes (0: no split), then reads of `piece` bytes
** (0: the rest at once). A read a callback stopped is fed again from where it stopped.
*/
static outcome_t run_tcp(uint8_t mode, session_t *s, const uint8_t *d, size_t n, size_t first,
                         size_t piece)
{
    rt_xml_stream_config_t cfg = config(mode);
    rt_xml_stream_t st;
    outcome_t o = {0};
    s->stop = (mode & 4) != 0;
    if (rt_xml_stream_init(&st, &cfg, s) != 0)
        abort();
    size_t off = 0;
    bool closed = false;
    while (off < n && !closed && o.rc == 0) {
        size_t k = off == 0 && first ? first : piece ? piece : n - off;
        if (k > n - off)
            k = n - off;
        size_t end = off + k;
        while (off < end) {
            size_t used = 0;
            o.rc = rt_xml_stream_feed(&st, d + off, end - off, &used);
            if (used > end - off)
                abort();
            off += used;
            if (o.rc)
                break;
            if (s->closed) {
                closed = true;
                break;
            }
            if (off < end && !s->stop)
                abort(); /* only the close or a stop ends a feed early */
        }
    }
    o.consumed = o.rc ? 0 : off; /* after an error, where it was found is what matters */
    finish(s, &st, &o);
    return o;
}

static outcome_t run_framed(uint8_t mode, session_t *s, const uint8_t *d, size_t n)
{
    rt_xml_stream_config_t cfg = config(mode);
    rt_xml_stream_t st;
    outcome_t o = {0};
    if (rt_xml_stream_init(&st, &cfg, s) != 0)
        abort();
    for (size_t off = 0; off <= n && o.rc == 0;) {
        const uint8_t *sep = memchr(d + off, FRAME_SEP, n - off);
        size_t len = sep ? (size_t)(sep - (d + off)) : n - off;
        o.rc = rt_xml_stream_frame(&st, d + off, len);
        if (o.rc == RT_EINVAL)
            o.rc = 0; /* closed, or a frame after the close */
        off += len + 1;
    }
    finish(s, &st, &o);
    return o;
}

static bool same(outcome_t a, outcome_t b)
{
    return a.digest == b.digest && a.cond == b.cond && a.rc == b.rc && a.consumed == b.consumed;
}

/* Every kept stanza, written back in a stream of its own, parses to an equal tree. */
static void round_trip(session_t *orig)
{
    session_t again = {.keep = true};
    rt_xml_stream_config_t cfg = config(0);
    cfg.limits.max_stanza_bytes = RT_XML_MAX_STANZA_CAP; /* escaping may make it longer */
    rt_xml_stream_t st;
    if (rt_xml_stream_init(&st, &cfg, &again) != 0)
        abort();
    rt_buf_t b = {0};
    rt_buf_add(&b, HEADER, strlen(HEADER));
    for (int i = 0; i < orig->nkept; i++)
        if (rt_xml_put_tree(&b, orig->kept[i], RT_XML_NS_CLIENT) != 0)
            abort();
    if (b.oom || rt_xml_stream_feed(&st, b.data, b.len, NULL) != 0 || again.nkept != orig->nkept)
        abort();
    for (int i = 0; i < orig->nkept; i++) {
        if (!rt_xml_equal(orig->kept[i], again.kept[i]))
            abort();
        rt_xml_free(&s_allocator, orig, orig->kept[i]);
        rt_xml_free(&s_allocator, &again, again.kept[i]);
    }
    rt_xml_stream_destroy(&st);
    rt_buf_free(&b);
    if (orig->blocks != 0 || again.blocks != 0 || again.charged != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t mode = data[0];
    size_t split = (size_t)data[1] | (size_t)data[2] << 8;
    const uint8_t *d = data + 3;
    size_t n = size - 3;
    session_t whole = {.keep = true};
    if (mode & 2) {
        run_framed(mode, &whole, d, n);
        round_trip(&whole);
        return 0;
    }
    outcome_t a = run_tcp(mode, &whole, d, n, 0, 0);
    round_trip(&whole);
    session_t two = {0}, small = {0};
    outcome_t b = run_tcp(mode, &two, d, n, n ? split % n : 0, 0);
    outcome_t c = run_tcp(mode, &small, d, n, 0, n <= 512 ? 1 : 7);
    if (!same(a, b) || !same(a, c) || two.blocks || small.blocks)
        abort();
    return 0;
}

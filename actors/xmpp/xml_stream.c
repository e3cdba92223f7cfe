/*
** The XMPP XML stream parser (xml_stream.h): expat's callbacks turned into stream events
** and stanza trees, with XMPP's restrictions and bounds, over parsers taken from a
** per-thread pool (xml_pool.c) only while there are bytes to parse.
**
** Positions decide when a stream can give its parser back: after each event the index
** just past it is kept (seen); when a feed ends with the stream's root the only open
** element, no stanza begun and nothing but whitespace after seen (expat keeps a trailing
** CR, or a token cut short, until more comes), the parser has nothing the stream needs.
** The next bytes go to a fresh parser after a synthetic header declaring what the real
** one declared, which puts that parser where the old one was.
**
** Bounds are checked at exact byte counts, so that where the bytes were split never
** changes the outcome: the input is fed in slices that end where the next byte would
** pass the bound of the stanza (or header) under way, and the bound is checked there.
*/
#include <limits.h>
#include <string.h>
#include <strings.h>

#include "rt.h"
#include "xml_impl.h"
#include "xml_stream.h"
#include "xml_write.h"

#define SLICE (16 * 1024) /* most bytes given to expat at once */

typedef enum stream_state_e {
    ST_HEADER, /* waiting for the stream header (TCP) or <open/> (framed) */
    ST_OPEN,   /* between or in stanzas */
    ST_CLOSED, /* </stream:stream> or <close/> came */
    ST_FAILED, /* a stream error: error and error_text say which */
} stream_state_t;

/*
** The synthetic headers for the usual declarations, which most streams make. The root's
** name is the real one's, prefix and all: </stream:stream> must match it.
*/
#define PROLOG(ns) "<stream:stream xmlns='" ns "' xmlns:stream='" RT_XML_NS_STREAMS "'>"
static const char prolog_client[] = PROLOG(RT_XML_NS_CLIENT);
static const char prolog_server[] = PROLOG(RT_XML_NS_SERVER);

static const char *const cond_names[RT_XML_COND_COUNT] = {
    [RT_XML_COND_BAD_FORMAT] = "bad-format",
    [RT_XML_COND_BAD_NAMESPACE_PREFIX] = "bad-namespace-prefix",
    [RT_XML_COND_CONFLICT] = "conflict",
    [RT_XML_COND_CONNECTION_TIMEOUT] = "connection-timeout",
    [RT_XML_COND_HOST_GONE] = "host-gone",
    [RT_XML_COND_HOST_UNKNOWN] = "host-unknown",
    [RT_XML_COND_IMPROPER_ADDRESSING] = "improper-addressing",
    [RT_XML_COND_INTERNAL_SERVER_ERROR] = "internal-server-error",
    [RT_XML_COND_INVALID_FROM] = "invalid-from",
    [RT_XML_COND_INVALID_NAMESPACE] = "invalid-namespace",
    [RT_XML_COND_INVALID_XML] = "invalid-xml",
    [RT_XML_COND_NOT_AUTHORIZED] = "not-authorized",
    [RT_XML_COND_NOT_WELL_FORMED] = "not-well-formed",
    [RT_XML_COND_POLICY_VIOLATION] = "policy-violation",
    [RT_XML_COND_REMOTE_CONNECTION_FAILED] = "remote-connection-failed",
    [RT_XML_COND_RESET] = "reset",
    [RT_XML_COND_RESOURCE_CONSTRAINT] = "resource-constraint",
    [RT_XML_COND_RESTRICTED_XML] = "restricted-xml",
    [RT_XML_COND_SEE_OTHER_HOST] = "see-other-host",
    [RT_XML_COND_SYSTEM_SHUTDOWN] = "system-shutdown",
    [RT_XML_COND_UNDEFINED_CONDITION] = "undefined-condition",
    [RT_XML_COND_UNSUPPORTED_ENCODING] = "unsupported-encoding",
    [RT_XML_COND_UNSUPPORTED_FEATURE] = "unsupported-feature",
    [RT_XML_COND_UNSUPPORTED_STANZA_TYPE] = "unsupported-stanza-type",
    [RT_XML_COND_UNSUPPORTED_VERSION] = "unsupported-version",
};

const char *rt_xml_cond_name(rt_xml_cond_t cond)
{
    if ((unsigned)cond >= RT_XML_COND_COUNT || !cond_names[cond])
        return "";
    return cond_names[cond];
}

/* ---- Limits ---- */

/* A bound from the config, or its default where the config leaves it 0. */
#define LIMIT(name, field, def)                                                                    \
    static uint32_t name(const rt_xml_stream_t *s)                                                 \
    {                                                                                              \
        return s->cfg->limits.field ? s->cfg->limits.field : (def);                                \
    }
LIMIT(max_stanza, max_stanza_bytes, RT_XML_MAX_STANZA_DEFAULT)
LIMIT(max_depth, max_depth, RT_XML_MAX_DEPTH_DEFAULT)
LIMIT(max_attrs, max_attrs, RT_XML_MAX_ATTRS_DEFAULT)
LIMIT(max_header, max_header_bytes, RT_XML_MAX_HEADER_DEFAULT)

static const char *content_ns(const rt_xml_stream_t *s)
{
    return s->cfg->content_ns ? s->cfg->content_ns : RT_XML_NS_CLIENT;
}

/* ---- Failing and stopping ---- */

/* Records the stream error; the feed that is running cleans up when expat returns. */
static int fail(rt_xml_stream_t *s, rt_xml_cond_t cond, const char *text)
{
    s->state = ST_FAILED;
    s->error = (uint8_t)cond;
    s->error_text = text;
    return cond == RT_XML_COND_RESOURCE_CONSTRAINT ? RT_ENOMEM : RT_EPROTO;
}

/* From a handler: fails the stream and stops expat after this handler. */
static void fail_in(rt__xml_work_t *w, rt_xml_cond_t cond, const char *text)
{
    fail(w->s, cond, text);
    w->halt = true;
    XML_StopParser(w->parser, XML_FALSE);
}

/*
** From a handler: a callback's nonzero answer ends the feed after this event. Suspended, not
** aborted: a parser stopped with nothing after the event can go on, for another stream.
*/
static void stop_in(rt__xml_work_t *w, int rc)
{
    w->stop = rc;
    w->stop_at = w->seen;
    w->halt = true;
    XML_StopParser(w->parser, XML_TRUE);
}

/* ---- Names, as expat gives them: "local", "uri local" or "uri local prefix" ---- */

typedef struct name_s {
    const char *uri, *local, *prefix; /* uri and prefix NULL when absent */
    size_t uri_len, local_len;
} name_t;

static name_t split(const char *s)
{
    name_t n = {0};
    const char *a = strchr(s, ' ');
    if (!a) {
        n.local = s;
        n.local_len = strlen(s);
        return n;
    }
    n.uri = s;
    n.uri_len = (size_t)(a - s);
    n.local = a + 1;
    const char *b = strchr(n.local, ' ');
    n.local_len = b ? (size_t)(b - n.local) : strlen(n.local);
    n.prefix = b ? b + 1 : NULL;
    return n;
}

/*
** The string a node points at for namespace uri: "", the parent's, a known constant,
** or NULL when the node needs a copy of its own.
*/
static const char *shared_ns(const char *uri, size_t len, const char *parent_ns)
{
    if (len == 0)
        return "";
    if (parent_ns && strncmp(parent_ns, uri, len) == 0 && parent_ns[len] == 0)
        return parent_ns;
    return rt__xml_known_ns(uri, len);
}

static char *put_str(char **q, const char *s, size_t n)
{
    char *start = *q;
    memcpy(start, s, n);
    start[n] = 0;
    *q += n + 1;
    return start;
}

/* ---- Building trees ---- */

static void *tree_alloc(rt__xml_work_t *w, size_t size)
{
    rt_xml_stream_t *s = w->s;
    size_t bound = (size_t)max_stanza(s) * RT_XML_TREE_FACTOR;
    if (size > bound || w->tree_bytes > bound - size) {
        fail_in(w, RT_XML_COND_POLICY_VIOLATION, "stanza too large as a tree");
        return NULL;
    }
    void *p = s->cfg->alloc.alloc(s->ctx, size, true);
    if (!p) {
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return NULL;
    }
    w->tree_bytes += size;
    return p;
}

/* One block: the element, its attribute array, then every string it does not share. */
static rt_xml_el_t *make_el(rt__xml_work_t *w, const char *qname, const char **atts,
                            uint32_t nattrs, const char *parent_ns)
{
    name_t nm = split(qname);
    const char *ns = shared_ns(nm.uri, nm.uri_len, parent_ns);
    size_t size = sizeof(rt_xml_el_t) + nattrs * sizeof(rt_xml_attr_t) + nm.local_len + 1;
    if (!ns)
        size += nm.uri_len + 1;
    for (uint32_t i = 0; i < nattrs; i++) {
        name_t an = split(atts[2 * i]);
        size += an.local_len + 1 + strlen(atts[2 * i + 1]) + 1;
        if (!shared_ns(an.uri, an.uri_len, NULL))
            size += an.uri_len + 1;
    }
    rt_xml_el_t *el = tree_alloc(w, size);
    if (!el)
        return NULL;
    memset(el, 0, sizeof(*el));
    el->node.type = RT_XML_ELEMENT;
    el->node.len = nattrs;
    el->attrs = nattrs ? (rt_xml_attr_t *)(el + 1) : NULL;
    char *q = (char *)(el + 1) + nattrs * sizeof(rt_xml_attr_t);
    el->name = put_str(&q, nm.local, nm.local_len);
    el->ns = ns ? ns : put_str(&q, nm.uri, nm.uri_len);
    for (uint32_t i = 0; i < nattrs; i++) {
        name_t an = split(atts[2 * i]);
        const char *ans = shared_ns(an.uri, an.uri_len, NULL);
        rt_xml_attr_t *at = &el->attrs[i];
        at->name = put_str(&q, an.local, an.local_len);
        at->ns = ans ? ans : put_str(&q, an.uri, an.uri_len);
        at->value = put_str(&q, atts[2 * i + 1], strlen(atts[2 * i + 1]));
    }
    return el;
}

static void append(rt__xml_frame_t *f, rt_xml_node_t *n)
{
    if (f->last)
        f->last->next = n;
    else
        f->el->children = n;
    f->last = n;
}

/* The innermost open element of the stanza (depth > top). */
static rt__xml_frame_t *innermost(rt__xml_work_t *w)
{
    return &w->frames[w->depth - w->top - 1];
}

/* Turns the text gathered so far into a run, the innermost open element's last child. */
static bool flush_text(rt__xml_work_t *w)
{
    if (!w->text_len)
        return true;
    rt_xml_text_t *t = tree_alloc(w, sizeof(rt_xml_text_t) + w->text_len + 1);
    if (!t)
        return false;
    t->node.next = NULL;
    t->node.type = RT_XML_TEXT;
    t->node.len = (uint32_t)w->text_len;
    memcpy(t->data, w->text, w->text_len);
    t->data[w->text_len] = 0;
    w->text_len = 0;
    append(innermost(w), &t->node);
    return true;
}

/* ---- expat's handlers ---- */

/* Notes where the current event ends (XML_GetCurrentByteIndex is -1 outside events). */
static void mark(rt__xml_work_t *w)
{
    XML_Index at = XML_GetCurrentByteIndex(w->parser);
    if (at >= 0)
        w->seen = (uint64_t)at + (uint64_t)XML_GetCurrentByteCount(w->parser);
}

/* Counts an element's attributes into *n; false, having failed the stream, past the bound. */
static bool count_attrs(rt__xml_work_t *w, const char **atts, uint32_t *n)
{
    uint32_t k = 0;
    while (atts[2 * k])
        k++;
    *n = k;
    if (k <= max_attrs(w->s))
        return true;
    fail_in(w, RT_XML_COND_POLICY_VIOLATION, "too many attributes");
    return false;
}
/* The declarations gathered for the root as an array (pointers into w->decls). */
static rt_xml_ns_t *decl_array(rt__xml_work_t *w)
{
    if (rt__xml_work_grow(w, &w->nsv, &w->nsv_cap, w->ndecls + 1, sizeof(rt_xml_ns_t)))
        return NULL;
    const char *p = w->decls;
    for (size_t i = 0; i < w->ndecls; i++) {
        w->nsv[i].prefix = p;
        p += strlen(p) + 1;
        w->nsv[i].uri = p;
        p += strlen(p) + 1;
    }
    return w->nsv;
}

static const char *default_ns(const rt_xml_ns_t *nsv, size_t n)
{
    const char *uri = NULL;
    for (size_t i = 0; i < n; i++)
        if (!nsv[i].prefix[0])
            uri = nsv[i].uri;
    return uri;
}

/*
** The synthetic header that re-creates the header's namespace context in a new parser:
** a static one for the usual pair, else a copy of the declarations through the caller's
** allocator, kept until the stream is reset.
*/
static bool save_prolog(rt__xml_work_t *w, const char *prefix, const rt_xml_ns_t *nsv, size_t n)
{
    rt_xml_stream_t *s = w->s;
    const char *def = default_ns(nsv, n);
    bool usual = n == 2 && strcmp(prefix, "stream") == 0 && def &&
                 (strcmp(def, RT_XML_NS_CLIENT) == 0 || strcmp(def, RT_XML_NS_SERVER) == 0);
    for (size_t i = 0; usual && i < n; i++)
        if (nsv[i].prefix[0])
            usual =
                strcmp(nsv[i].prefix, "stream") == 0 && strcmp(nsv[i].uri, RT_XML_NS_STREAMS) == 0;
    if (usual) {
        bool client = strcmp(def, RT_XML_NS_CLIENT) == 0;
        s->prolog = client ? prolog_client : prolog_server;
        s->prolog_len = (uint32_t)(client ? sizeof(prolog_client) : sizeof(prolog_server)) - 1;
        return true;
    }
    rt_buf_t b = {0}, name = {0};
    rt_buf_add(&b, "<", 1);
    rt_buf_add(&b, prefix, strlen(prefix));
    rt_buf_add(&b, ":stream", 7);
    for (size_t i = 0; i < n; i++) {
        rt_buf_truncate(&name, 0);
        rt_buf_add(&name, "xmlns", 5);
        if (nsv[i].prefix[0]) {
            rt_buf_add(&name, ":", 1);
            rt_buf_add(&name, nsv[i].prefix, strlen(nsv[i].prefix));
        }
        rt_xml_put_attr(&b, name.oom ? "" : name.data, nsv[i].uri);
    }
    rt_buf_add(&b, ">", 1);
    char *copy = NULL;
    if (!b.oom && !name.oom && b.len < UINT32_MAX)
        copy = s->cfg->alloc.alloc(s->ctx, b.len + 1, false);
    if (copy) {
        memcpy(copy, b.data, b.len + 1);
        s->prolog = copy;
        s->prolog_len = (uint32_t)b.len;
        s->prolog_owned = true;
    }
    rt_buf_free(&b);
    rt_buf_free(&name);
    return copy != NULL;
}

/* The stream header on a TCP stream: checked, reported, and its context saved. */
static void header(rt__xml_work_t *w, const char *qname, const char **atts)
{
    rt_xml_stream_t *s = w->s;
    name_t nm = split(qname);
    if (!nm.uri || nm.uri_len != strlen(RT_XML_NS_STREAMS) ||
        memcmp(nm.uri, RT_XML_NS_STREAMS, nm.uri_len) != 0) {
        fail_in(w, RT_XML_COND_INVALID_NAMESPACE, "the stream is not in " RT_XML_NS_STREAMS);
        return;
    }
    if (nm.local_len != 6 || memcmp(nm.local, "stream", 6) != 0) {
        fail_in(w, RT_XML_COND_BAD_FORMAT, "the stream's root is not <stream:stream>");
        return;
    }
    if (!nm.prefix) {
        fail_in(w, RT_XML_COND_BAD_NAMESPACE_PREFIX, "the stream element has no prefix");
        return;
    }
    if (w->seen > max_header(s)) {
        fail_in(w, RT_XML_COND_POLICY_VIOLATION, "stream header too long");
        return;
    }
    uint32_t nattrs;
    if (!count_attrs(w, atts, &nattrs))
        return;
    rt_xml_ns_t *nsv = decl_array(w);
    if (!nsv) {
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return;
    }
    const char *def = default_ns(nsv, w->ndecls);
    if (!def || strcmp(def, content_ns(s)) != 0) {
        fail_in(w, RT_XML_COND_INVALID_NAMESPACE, "unsupported content namespace");
        return;
    }
    rt_xml_el_t *hdr = make_el(w, qname, atts, nattrs, NULL);
    if (!hdr)
        return;
    w->tree_bytes = 0;
    if (!save_prolog(w, nm.prefix, nsv, w->ndecls)) {
        rt_xml_free(&s->cfg->alloc, s->ctx, hdr);
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return;
    }
    s->state = ST_OPEN;
    w->depth = 1;
    w->quiet = w->seen;
    int rc = s->cfg->on_header ? s->cfg->on_header(s->ctx, hdr, nsv, w->ndecls) : 0;
    rt__xml_work_use(w); /* the callback may have parsed another stream */
    rt_xml_free(&s->cfg->alloc, s->ctx, hdr);
    if (rc)
        stop_in(w, rc);
}

static void on_start(void *ud, const XML_Char *qname, const XML_Char **atts)
{
    rt__xml_work_t *w = ud;
    if (w->halt)
        return;
    mark(w);
    rt_xml_stream_t *s = w->s;
    if (w->depth == 0 && w->synthetic) {
        w->synthetic = false;
        w->depth = 1;
        w->quiet = w->seen;
        return;
    }
    if (w->depth == 0 && w->top == 1) {
        header(w, qname, atts);
        return;
    }
    if (s->stray_text) {
        fail_in(w, RT_XML_COND_INVALID_XML, "text between stanzas");
        return;
    }
    uint32_t level = w->depth - w->top + 1; /* 1 for the stanza itself */
    if (level > max_depth(s)) {
        fail_in(w, RT_XML_COND_POLICY_VIOLATION, "stanza nested too deep");
        return;
    }
    uint32_t nattrs;
    if (!count_attrs(w, atts, &nattrs))
        return;
    if (rt__xml_work_grow(w, &w->frames, &w->frames_cap, level, sizeof(rt__xml_frame_t))) {
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return;
    }
    if (level > 1 && !flush_text(w))
        return;
    rt__xml_frame_t *parent = level > 1 ? innermost(w) : NULL;
    rt_xml_el_t *el = make_el(w, qname, atts, nattrs, parent ? parent->el->ns : NULL);
    if (!el)
        return;
    if (parent)
        append(parent, &el->node);
    else
        s->partial = el;
    w->frames[level - 1] = (rt__xml_frame_t){el, NULL};
    w->depth++;
}

/* A complete frame's element (framed mode): <open/>, <close/> or a stanza. */
static int framed_element(rt__xml_work_t *w, rt_xml_el_t *el)
{
    rt_xml_stream_t *s = w->s;
    const rt_xml_stream_config_t *cfg = s->cfg;
    if (strcmp(el->ns, RT_XML_NS_FRAMING) != 0) {
        if (s->state != ST_OPEN) {
            rt_xml_free(&cfg->alloc, s->ctx, el);
            fail_in(w, RT_XML_COND_BAD_FORMAT, "a stanza before <open/>");
            return 0;
        }
        if (!el->ns[0]) {
            rt_xml_free(&cfg->alloc, s->ctx, el);
            fail_in(w, RT_XML_COND_INVALID_NAMESPACE, "a frame's element has no namespace");
            return 0;
        }
        if (cfg->on_stanza)
            return cfg->on_stanza(s->ctx, el);
        rt_xml_free(&cfg->alloc, s->ctx, el);
        return 0;
    }
    int rc = 0;
    if (strcmp(el->name, "open") == 0 && s->state == ST_HEADER) {
        s->state = ST_OPEN;
        rt_xml_ns_t *nsv = decl_array(w);
        if (!nsv)
            fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        else if (cfg->on_header)
            rc = cfg->on_header(s->ctx, el, nsv, w->ndecls);
    } else if (strcmp(el->name, "close") == 0) {
        s->state = ST_CLOSED;
        rc = cfg->on_close ? cfg->on_close(s->ctx) : 0;
    } else {
        fail_in(w, RT_XML_COND_BAD_FORMAT,
                strcmp(el->name, "open") == 0 ? "<open/> on an open stream" : "unknown frame");
    }
    rt_xml_free(&cfg->alloc, s->ctx, el);
    return rc;
}

static void on_end(void *ud, const XML_Char *qname)
{
    rt__xml_work_t *w = ud;
    if (w->halt)
        return;
    mark(w);
    rt_xml_stream_t *s = w->s;
    if (w->depth == 1 && w->top == 1) {
        if (s->stray_text) {
            fail_in(w, RT_XML_COND_INVALID_XML, "text between stanzas");
            return;
        }
        w->depth = 0;
        s->state = ST_CLOSED;
        int rc = s->cfg->on_close ? s->cfg->on_close(s->ctx) : 0;
        rt__xml_work_use(w);
        stop_in(w, rc ? rc : RT_XML_STOP); /* what follows the stream is not read */
        return;
    }
    if (!flush_text(w))
        return;
    w->depth--;
    if (w->depth > w->top)
        return;
    rt_xml_el_t *el = s->partial;
    s->partial = NULL;
    w->tree_bytes = 0;
    if (w->seen - w->quiet > max_stanza(s)) {
        rt_xml_free(&s->cfg->alloc, s->ctx, el);
        fail_in(w, RT_XML_COND_POLICY_VIOLATION, "stanza too large");
        return;
    }
    w->quiet = w->seen;
    int rc = 0;
    if (w->top == 0)
        rc = framed_element(w, el);
    else if (s->cfg->on_stanza)
        rc = s->cfg->on_stanza(s->ctx, el);
    else
        rt_xml_free(&s->cfg->alloc, s->ctx, el);
    rt__xml_work_use(w);
    if (rc && !w->halt)
        stop_in(w, rc);
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void on_text(void *ud, const XML_Char *text, int len)
{
    rt__xml_work_t *w = ud;
    if (w->halt)
        return;
    mark(w);
    if (w->depth <= w->top) {
        /*
        ** Refused at the next element or the close, not here: expat reports a run of text
        ** only once it sees what ends it, and refuses a run holding "]]>" whole, so text
        ** alone would be reported or not depending on where the bytes were split.
        */
        for (int i = 0; i < len; i++)
            if (!is_ws(text[i]))
                w->s->stray_text = true;
        w->quiet = w->seen; /* whitespace between stanzas is part of none */
        return;
    }
    if (rt__xml_work_grow(w, &w->text, &w->text_cap, w->text_len + (size_t)len, 1)) {
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return;
    }
    memcpy(w->text + w->text_len, text, (size_t)len);
    w->text_len += (size_t)len;
}

/* Declarations on the root (the header, or a frame's element) are kept for its callback. */
static void on_ns(void *ud, const XML_Char *prefix, const XML_Char *uri)
{
    rt__xml_work_t *w = ud;
    if (w->halt || w->depth != 0 || w->synthetic)
        return;
    size_t pl = prefix ? strlen(prefix) : 0, ul = uri ? strlen(uri) : 0;
    if (rt__xml_work_grow(w, &w->decls, &w->decls_cap, w->decls_len + pl + ul + 2, 1)) {
        fail_in(w, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
        return;
    }
    char *q = w->decls + w->decls_len;
    put_str(&q, prefix ? prefix : "", pl);
    put_str(&q, uri ? uri : "", ul);
    w->decls_len += pl + ul + 2;
    w->ndecls++;
}

static void on_comment(void *ud, const XML_Char *data)
{
    fail_in(ud, RT_XML_COND_RESTRICTED_XML, "comments are not allowed (RFC 6120 11.1)");
}

static void on_pi(void *ud, const XML_Char *target, const XML_Char *data)
{
    fail_in(ud, RT_XML_COND_RESTRICTED_XML,
            "processing instructions are not allowed (RFC 6120 11.1)");
}

static void on_doctype(void *ud, const XML_Char *name, const XML_Char *sysid, const XML_Char *pubid,
                       int has_internal_subset)
{
    fail_in(ud, RT_XML_COND_RESTRICTED_XML, "a DOCTYPE is not allowed (RFC 6120 11.1)");
}

static void on_entity(void *ud, const XML_Char *name, int is_param, const XML_Char *value,
                      int value_len, const XML_Char *base, const XML_Char *sysid,
                      const XML_Char *pubid, const XML_Char *notation)
{
    fail_in(ud, RT_XML_COND_RESTRICTED_XML, "entity declarations are not allowed");
}

static void on_xmldecl(void *ud, const XML_Char *version, const XML_Char *encoding, int standalone)
{
    rt__xml_work_t *w = ud;
    if (w->halt)
        return;
    mark(w);
    if (encoding && strcasecmp(encoding, "UTF-8") != 0)
        fail_in(w, RT_XML_COND_UNSUPPORTED_ENCODING, "the stream's encoding is not UTF-8");
}

/* Markup with no meaning here (whitespace outside the root). */
static void on_other(void *ud, const XML_Char *s, int len)
{
    rt__xml_work_t *w = ud;
    if (!w->halt)
        mark(w);
}

/* A CDATA section spans events: the parser is needed until it ends, between stanzas too. */
static void cdata_edge(rt__xml_work_t *w, bool inside)
{
    if (w->halt)
        return;
    mark(w);
    w->cdata = inside;
}

static void on_cdata_start(void *ud)
{
    cdata_edge(ud, true);
}

static void on_cdata_end(void *ud)
{
    cdata_edge(ud, false);
}

static void arm(rt__xml_work_t *w)
{
    XML_Parser p = w->parser;
    XML_SetUserData(p, w);
    XML_SetElementHandler(p, on_start, on_end);
    XML_SetCharacterDataHandler(p, on_text);
    XML_SetStartNamespaceDeclHandler(p, on_ns);
    XML_SetCommentHandler(p, on_comment);
    XML_SetProcessingInstructionHandler(p, on_pi);
    XML_SetStartDoctypeDeclHandler(p, on_doctype);
    XML_SetEntityDeclHandler(p, on_entity);
    XML_SetXmlDeclHandler(p, on_xmldecl);
    XML_SetCdataSectionHandler(p, on_cdata_start, on_cdata_end);
    XML_SetDefaultHandler(p, on_other);
}

/* ---- The stream ---- */

static rt_xml_cond_t expat_cond(enum XML_Error e)
{
    switch (e) {
    case XML_ERROR_NO_MEMORY:
        return RT_XML_COND_RESOURCE_CONSTRAINT;
    case XML_ERROR_UNDEFINED_ENTITY:
    case XML_ERROR_RECURSIVE_ENTITY_REF:
    case XML_ERROR_BINARY_ENTITY_REF:
    case XML_ERROR_ATTRIBUTE_EXTERNAL_ENTITY_REF:
    case XML_ERROR_EXTERNAL_ENTITY_HANDLING:
    case XML_ERROR_PARAM_ENTITY_REF:
    case XML_ERROR_ENTITY_DECLARED_IN_PE:
    case XML_ERROR_NOT_STANDALONE:
    case XML_ERROR_ASYNC_ENTITY:
        return RT_XML_COND_RESTRICTED_XML; /* entity references: RFC 6120 11.1 */
    case XML_ERROR_INCORRECT_ENCODING:
    case XML_ERROR_UNKNOWN_ENCODING:
        return RT_XML_COND_UNSUPPORTED_ENCODING;
    case XML_ERROR_UNBOUND_PREFIX:
        return RT_XML_COND_BAD_NAMESPACE_PREFIX;
    default:
        return RT_XML_COND_NOT_WELL_FORMED;
    }
}

/* Gives the charge for the stream's work to what it holds now. */
static void sync_charge(rt_xml_stream_t *s)
{
    size_t want = s->work ? s->work->bytes : 0;
    if (!s->cfg->charge || want == s->charged)
        return;
    s->cfg->charge(s->ctx, (ptrdiff_t)want - (ptrdiff_t)s->charged);
    s->charged = want;
}

/* Returns the parser, and a partial stanza with it: the stream holds nothing more. */
static void drop_work(rt_xml_stream_t *s)
{
    if (s->partial) {
        rt_xml_free(&s->cfg->alloc, s->ctx, s->partial);
        s->partial = NULL;
    }
    if (s->work) {
        rt__xml_work_give(s->work);
        s->work = NULL;
    }
    sync_charge(s);
}

int rt_xml_stream_init(rt_xml_stream_t *s, const rt_xml_stream_config_t *cfg, void *ctx)
{
    const rt_xml_limits_t *l = &cfg->limits;
    memset(s, 0, sizeof(*s));
    if (!cfg->alloc.alloc || !cfg->alloc.free || l->max_stanza_bytes > RT_XML_MAX_STANZA_CAP ||
        l->max_depth > RT_XML_DEPTH_CAP || l->max_attrs > RT_XML_MAX_ATTRS_CAP ||
        l->max_header_bytes > RT_XML_MAX_STANZA_CAP)
        return RT_EINVAL;
    s->cfg = cfg;
    s->ctx = ctx;
    s->state = ST_HEADER;
    return 0;
}

void rt_xml_stream_reset(rt_xml_stream_t *s)
{
    drop_work(s);
    if (s->prolog_owned)
        s->cfg->alloc.free(s->ctx, (void *)s->prolog);
    s->prolog = NULL;
    s->prolog_len = 0;
    s->prolog_owned = false;
    s->state = ST_HEADER;
    s->error = RT_XML_COND_NONE;
    s->error_text = NULL;
    s->stray_text = false;
}

void rt_xml_stream_destroy(rt_xml_stream_t *s)
{
    rt_xml_stream_reset(s);
}

rt_xml_cond_t rt_xml_stream_error(const rt_xml_stream_t *s, const char **text)
{
    if (text)
        *text = s->error_text ? s->error_text : "";
    return (rt_xml_cond_t)s->error;
}

size_t rt_xml_stream_bytes(const rt_xml_stream_t *s)
{
    size_t n = sizeof(*s) + (s->prolog_owned ? s->prolog_len + 1 : 0);
    if (s->work)
        n += s->work->bytes + s->work->tree_bytes;
    return n;
}

bool rt_xml_stream_busy(const rt_xml_stream_t *s)
{
    return s->work != NULL;
}

/*
** Takes a parser; on an open TCP stream, puts it in the header's context: one that another
** stream with the same static header gave back between stanzas is there already (its
** positions go on from where they were: all it was fed is behind the stream's last quiet
** point).
*/
static int take(rt_xml_stream_t *s)
{
    bool open = s->state == ST_OPEN && !s->cfg->framed;
    rt__xml_work_t *w = rt__xml_work_take(open && !s->prolog_owned ? s->prolog : NULL);
    if (!w)
        return fail(s, RT_XML_COND_RESOURCE_CONSTRAINT, "out of memory");
    w->s = s;
    s->work = w;
    if (w->at) {
        w->at = NULL;
        w->seen = w->quiet = w->base = w->fed;
        w->tree_bytes = 0;
        w->halt = w->cdata = false;
        w->stop = 0;
        w->text_len = 0;
        RT_ASSERT(w->top == 1 && w->depth == 1);
        return 0;
    }
    w->top = s->cfg->framed ? 0 : 1;
    arm(w);
    if (!open)
        return 0;
    w->synthetic = true;
    rt__xml_work_use(w);
    if (XML_Parse(w->parser, s->prolog, (int)s->prolog_len, XML_FALSE) != XML_STATUS_OK ||
        w->synthetic || w->halt) {
        bool oom = XML_GetErrorCode(w->parser) == XML_ERROR_NO_MEMORY;
        return fail(s, oom ? RT_XML_COND_RESOURCE_CONSTRAINT : RT_XML_COND_INTERNAL_SERVER_ERROR,
                    oom ? "out of memory" : "the stream's context could not be restored");
    }
    w->fed = s->prolog_len;
    return 0;
}

/* After XML_Parse failed: our stop, our stream error, or expat's. */
static int parse_failed(rt_xml_stream_t *s, rt__xml_work_t *w)
{
    if (s->state == ST_FAILED)
        return s->error == RT_XML_COND_RESOURCE_CONSTRAINT ? RT_ENOMEM : RT_EPROTO;
    if (w->halt)
        return w->stop < 0 ? w->stop : 0;
    enum XML_Error e = XML_GetErrorCode(w->parser);
    return fail(s, expat_cond(e), XML_ErrorString(e));
}

/* The byte bound of what is under way: the header, or the stanza after the last quiet point. */
static uint64_t bound(const rt_xml_stream_t *s)
{
    return s->state == ST_HEADER ? max_header(s) : max_stanza(s);
}

/*
** Feeds n bytes to the stream's parser in slices that never cross the point where the
** bound would be passed; *consumed is how many bytes were read when a callback stopped.
*/
static int parse(rt_xml_stream_t *s, const char *p, size_t n, size_t *consumed)
{
    rt__xml_work_t *w = s->work;
    w->base = w->fed;
    size_t off = 0;
    *consumed = n;
    while (off < n) {
        uint64_t room = bound(s) + 1 - (w->fed - w->quiet);
        /*
        ** A header may end inside the slice and a stanza start right after it: the slice
        ** must not pass that stanza's bound either, wherever the header ends.
        */
        if (s->state == ST_HEADER && room > (uint64_t)max_stanza(s) + 1)
            room = (uint64_t)max_stanza(s) + 1;
        size_t k = n - off;
        if (k > SLICE)
            k = SLICE;
        if (k > room)
            k = (size_t)room;
        rt__xml_work_use(w);
        enum XML_Status st = XML_Parse(w->parser, p + off, (int)k, XML_FALSE);
        w->fed += k;
        off += k;
        if (st != XML_STATUS_OK) {
            int rc = parse_failed(s, w);
            if (s->state != ST_FAILED)
                *consumed = (size_t)(w->stop_at - w->base);
            return rc;
        }
        if (w->fed - w->quiet > bound(s))
            return fail(s, RT_XML_COND_POLICY_VIOLATION,
                        s->state == ST_HEADER ? "stream header too long" : "stanza too large");
    }
    return 0;
}

/* Whether the parser holds nothing the stream needs (see the top of this file). */
static bool quiescent(const rt_xml_stream_t *s, const char *p, size_t n)
{
    const rt__xml_work_t *w = s->work;
    if (s->state != ST_OPEN || s->partial || w->depth != 1 || w->cdata || w->seen < w->base ||
        w->halt)
        return false;
    for (size_t i = (size_t)(w->seen - w->base); i < n; i++)
        if (!is_ws(p[i]))
            return false;
    return true;
}

/*
** Whether another stream with this one's static header can go on with its parser: between
** stanzas, every byte fed reported, and not stopped (or stopped by a callback, with nothing
** after the event, and resumed on nothing).
*/
static bool reusable(const rt_xml_stream_t *s)
{
    rt__xml_work_t *w = s->work;
    if (s->state != ST_OPEN || s->prolog_owned || s->cfg->framed || s->partial || w->depth != 1 ||
        w->cdata || w->seen != w->fed)
        return false;
    return !w->halt || XML_ResumeParser(w->parser) == XML_STATUS_OK;
}

/*
** Checks a document's first two bytes, of which the n at p come next, where expat would
** otherwise decide by what it has been given so far: on seeing a NUL second byte or a
** BOM it switches to UTF-16 whatever it was told, but not from one byte alone. A first
** byte must be one a UTF-8 document can begin with (markup, whitespace, a UTF-8 BOM);
** 00, FE and FF begin UTF-16 and UTF-32, as does a NUL second byte. Returns the condition
** to fail with, or RT_XML_COND_NONE.
*/
static rt_xml_cond_t check_start(const rt__xml_work_t *w, const char *p, size_t n)
{
    for (size_t i = 0; i < n && w->fed + i < 2; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == 0x00 || (w->fed + i == 0 && (c == 0xfe || c == 0xff)))
            return RT_XML_COND_UNSUPPORTED_ENCODING;
        if (w->fed + i == 0 && c != '<' && c != 0xef && !is_ws((char)c))
            return RT_XML_COND_NOT_WELL_FORMED;
    }
    return RT_XML_COND_NONE;
}

/* check_start, failing the stream; true when it failed. */
static bool bad_start(rt_xml_stream_t *s, const char *p, size_t n)
{
    rt_xml_cond_t cond = check_start(s->work, p, n);
    if (cond == RT_XML_COND_NONE)
        return false;
    fail(s, cond,
         cond == RT_XML_COND_NOT_WELL_FORMED ? "not markup at the start of the stream"
                                             : "the stream is not in UTF-8");
    drop_work(s);
    return true;
}

int rt_xml_stream_feed(rt_xml_stream_t *s, const void *data, size_t len, size_t *used)
{
    size_t ignored;
    if (!used)
        used = &ignored;
    *used = 0;
    if (s->state == ST_FAILED)
        return RT_EPROTO;
    if (s->cfg->framed || s->state == ST_CLOSED)
        return RT_EINVAL;
    const char *p = data;
    size_t skip = 0;
    if (!s->work) {
        if (s->state == ST_OPEN)
            while (skip < len && is_ws(p[skip]))
                skip++;
        if (skip == len) {
            *used = len;
            return 0;
        }
        int rc = take(s);
        if (rc) {
            drop_work(s);
            return rc;
        }
    }
    if (s->state == ST_HEADER && bad_start(s, p, len))
        return RT_EPROTO;
    size_t consumed;
    int rc = parse(s, p + skip, len - skip, &consumed);
    *used = s->state == ST_FAILED ? len : skip + consumed;
    rt__xml_work_t *w = s->work;
    if (s->state == ST_FAILED || s->state == ST_CLOSED || w->halt) {
        if (reusable(s))
            w->at = s->prolog;
        drop_work(s);
    } else if (quiescent(s, p + skip, len - skip)) {
        if (reusable(s))
            w->at = s->prolog;
        drop_work(s);
    } else {
        sync_charge(s);
    }
    return rc;
}

int rt_xml_stream_frame(rt_xml_stream_t *s, const void *data, size_t len)
{
    if (s->state == ST_FAILED)
        return RT_EPROTO;
    if (!s->cfg->framed || s->state == ST_CLOSED)
        return RT_EINVAL;
    if (len > max_stanza(s))
        return fail(s, RT_XML_COND_POLICY_VIOLATION, "frame too large");
    int rc = take(s);
    if (rc) {
        drop_work(s);
        return rc;
    }
    if (bad_start(s, data, len))
        return RT_EPROTO;
    rt__xml_work_t *w = s->work;
    rt__xml_work_use(w);
    if (XML_Parse(w->parser, data, (int)len, XML_TRUE) != XML_STATUS_OK)
        rc = parse_failed(s, w);
    drop_work(s);
    return rc;
}

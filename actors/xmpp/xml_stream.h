/*
** The XMPP XML stream parser (RFC 6120 §4, §11): expat in streaming mode, namespace-aware,
** with no DTD and no entity expansion, fed bytes as they arrive. It reports the stream
** header (<stream:stream ...>, with its attributes and the namespaces it declares), each
** complete top-level child (a stanza, or a stream-level element such as <auth/>) as a
** tree (xml.h), and </stream:stream>. A framed mode reads XMPP over WebSocket (RFC 7395),
** where each frame is one complete element: <open/>, a stanza, <close/>.
**
** Memory. An idle stream (header read, between stanzas, nothing partial) holds no expat
** parser and no buffer: it costs sizeof(rt_xml_stream_t), 64 bytes on 64-bit Linux, plus,
** only when its header declared namespaces other than the usual default namespace and
** "stream" prefix, a copy of those declarations (at most max_header_bytes). Parsers
** live in a small per-thread pool; when bytes arrive, the stream takes one, re-establishes
** its context by feeding it a synthetic stream header that declares the namespaces the
** real header declared, then the new bytes; when the bytes end between stanzas the parser
** goes back. Whitespace between stanzas (keepalives) needs no parser at all. Only a
** stream in the middle of a stanza (or of its header) keeps a parser across calls; what
** it holds then is the session's: the partial tree through the caller's allocator, and
** the parser's own memory (expat's, and the text gathered for the current element)
** charged through config->charge (the c2s passes rt_charge), given back when the parser
** goes back. rt_xml_stream_bytes() says what a stream holds.
**
** Refused (RFC 6120 §11.1; every error names its stream error condition and a short
** text): a DOCTYPE, entity references other than the five predefined ones, comments and
** processing instructions (restricted-xml); an XML declaration naming an encoding other
** than UTF-8, or a stream in UTF-16 or UTF-32 (unsupported-encoding); what XML does not
** allow (not-well-formed: bad syntax, bytes that are not UTF-8, characters outside XML's,
** U+0000 and U+FFFE included, as literals or references); a prefix with no declaration
** (bad-namespace-prefix); a header in the wrong namespace or a content namespace other
** than config->content_ns (invalid-namespace); text between stanzas (invalid-xml: the
** streams schema allows elements only; raised at the next element or the close); a header that is
*not <stream:stream> or a frame
** out of turn (bad-format); and past a bound (policy-violation): a stanza's bytes, its
** depth, an element's attributes, the header's bytes, a stanza's tree size.
**
** Stopping: a callback that returns RT_XML_STOP ends the feed right after that element
** (STARTTLS: what follows <starttls/> is TLS; SASL success: what follows is a new stream);
** rt_xml_stream_feed says how many bytes it used. After rt_xml_stream_reset, the bytes
** left are a new stream. Callbacks must not feed or reset their own stream.
*/
#ifndef RT_XMPP_XML_STREAM_H
#define RT_XMPP_XML_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xml.h"

/* Bounds, settings to be: a zero field takes its default. */
#define RT_XML_MAX_STANZA_DEFAULT (256 * 1024) /* bytes of one stanza or frame */
#define RT_XML_MAX_DEPTH_DEFAULT 32            /* elements nested in a stanza, itself 1 */
#define RT_XML_MAX_ATTRS_DEFAULT 64            /* attributes of one element */
#define RT_XML_MAX_HEADER_DEFAULT 4096         /* bytes up to the end of the stream header */
#define RT_XML_MAX_STANZA_CAP (64u << 20)      /* the most a setting may allow */
#define RT_XML_MAX_ATTRS_CAP 4096
/*
** A stanza's tree may take this many times its bytes (through the caller's allocator)
** before it is refused: a node is 48 bytes and <a/> is 4, so a stanza of empty elements
** alone could otherwise cost 16 times its size. Real stanzas take 1 to 3 times theirs.
*/
#define RT_XML_TREE_FACTOR 8

typedef struct rt_xml_limits_s {
    uint32_t max_stanza_bytes; /* RT_XML_MAX_STANZA_DEFAULT; at most RT_XML_MAX_STANZA_CAP */
    uint32_t max_depth;        /* RT_XML_MAX_DEPTH_DEFAULT; at most RT_XML_DEPTH_CAP */
    uint32_t max_attrs;        /* RT_XML_MAX_ATTRS_DEFAULT; at most RT_XML_MAX_ATTRS_CAP */
    uint32_t max_header_bytes; /* RT_XML_MAX_HEADER_DEFAULT; at most RT_XML_MAX_STANZA_CAP */
} rt_xml_limits_t;

/* RFC 6120 §4.9.3's stream error conditions; rt_xml_cond_name gives the element name. */
typedef enum rt_xml_cond_e {
    RT_XML_COND_NONE = 0,
    RT_XML_COND_BAD_FORMAT,
    RT_XML_COND_BAD_NAMESPACE_PREFIX,
    RT_XML_COND_CONFLICT,
    RT_XML_COND_CONNECTION_TIMEOUT,
    RT_XML_COND_HOST_GONE,
    RT_XML_COND_HOST_UNKNOWN,
    RT_XML_COND_IMPROPER_ADDRESSING,
    RT_XML_COND_INTERNAL_SERVER_ERROR,
    RT_XML_COND_INVALID_FROM,
    RT_XML_COND_INVALID_NAMESPACE,
    RT_XML_COND_INVALID_XML,
    RT_XML_COND_NOT_AUTHORIZED,
    RT_XML_COND_NOT_WELL_FORMED,
    RT_XML_COND_POLICY_VIOLATION,
    RT_XML_COND_REMOTE_CONNECTION_FAILED,
    RT_XML_COND_RESET,
    RT_XML_COND_RESOURCE_CONSTRAINT,
    RT_XML_COND_RESTRICTED_XML,
    RT_XML_COND_SEE_OTHER_HOST,
    RT_XML_COND_SYSTEM_SHUTDOWN,
    RT_XML_COND_UNDEFINED_CONDITION,
    RT_XML_COND_UNSUPPORTED_ENCODING,
    RT_XML_COND_UNSUPPORTED_FEATURE,
    RT_XML_COND_UNSUPPORTED_STANZA_TYPE,
    RT_XML_COND_UNSUPPORTED_VERSION,
    RT_XML_COND_COUNT
} rt_xml_cond_t;

/* "not-well-formed" and so on; "" for RT_XML_COND_NONE or an unknown value. */
const char *rt_xml_cond_name(rt_xml_cond_t cond);

/* A namespace declaration on the stream header: prefix "" for the default namespace. */
typedef struct rt_xml_ns_s {
    const char *prefix;
    const char *uri;
} rt_xml_ns_t;

/* What a callback returns: 0 goes on, RT_XML_STOP ends the feed after this element. */
#define RT_XML_STOP 1

typedef struct rt_xml_stream_config_s {
    rt_xml_alloc_t alloc; /* for every tree and the stream's own copies; ctx is the stream's */
    /* Counts memory held outside alloc for the stream (expat's) as ctx's; optional. */
    void (*charge)(void *ctx, ptrdiff_t delta);
    /*
    ** The stream header, or an <open/> frame: hdr and ns are lent for the call. On a TCP
    ** stream it has already been checked: <stream:stream> in the streams namespace, with
    ** a prefix, and content_ns declared as the default namespace.
    */
    int (*on_header)(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns);
    /* A complete top-level element; the callee owns it (rt_xml_free with config->alloc). */
    int (*on_stanza)(void *ctx, rt_xml_el_t *stanza);
    /* </stream:stream> or a <close/> frame; the stream takes no more bytes until reset. */
    int (*on_close)(void *ctx);
    rt_xml_limits_t limits;
    const char *content_ns; /* NULL: RT_XML_NS_CLIENT */
    bool framed;            /* RFC 7395: feed with rt_xml_stream_frame */
} rt_xml_stream_config_t;

/*
** One stream. Fields are the parser's own; callers use the functions. The config is the
** caller's and must outlive the stream (a listener shares one among its sessions).
** partial is the root of the stanza being built: a collector that scans the stream
** (embedded in the c2s state) finds the whole partial tree from it.
*/
typedef struct rt_xml_stream_s {
    const rt_xml_stream_config_t *cfg;
    void *ctx;                   /* the callbacks' and the allocator's argument */
    struct rt__xml_work_s *work; /* a parser from the pool; NULL when idle */
    rt_xml_el_t *partial;        /* the stanza being built, or NULL */
    const char *prolog;          /* the synthetic header; static, or alloc'd when owned */
    size_t charged;              /* bytes charged through cfg->charge now */
    const char *error_text;      /* static: what went wrong, with error */
    uint32_t prolog_len;
    uint8_t state; /* stream_state_t in xml_stream.c */
    uint8_t error; /* rt_xml_cond_t once the stream has failed */
    bool prolog_owned;
    bool stray_text; /* text came between stanzas: refused at the next one */
} rt_xml_stream_t;

/* Checks cfg's limits (RT_EINVAL when past a cap) and starts a stream waiting for its header. */
int rt_xml_stream_init(rt_xml_stream_t *s, const rt_xml_stream_config_t *cfg, void *ctx);
/* Releases everything the stream holds (the parser, a partial stanza, its copies). */
void rt_xml_stream_destroy(rt_xml_stream_t *s);
/*
** A stream restart (after STARTTLS and SASL): what the stream holds is released and the
** next bytes start a new stream with its header. Also clears a failed stream.
*/
void rt_xml_stream_reset(rt_xml_stream_t *s);

/*
** Parses len bytes of a TCP stream. *used (may be NULL) is how many were consumed: all
** of them, unless a callback returned RT_XML_STOP (or an error) or </stream:stream> came:
** then those up to the end of that element, and the rest is not read. Returns 0; RT_EPROTO when the
*stream is in error (also for every
** later call; rt_xml_stream_error says why); RT_ENOMEM; RT_EINVAL on a framed stream or
** after the close; or a callback's negative return, which ends the feed as a stop does.
*/
int rt_xml_stream_feed(rt_xml_stream_t *s, const void *data, size_t len, size_t *used);
/* Parses one WebSocket frame's text (framed mode); returns as rt_xml_stream_feed does. */
int rt_xml_stream_frame(rt_xml_stream_t *s, const void *data, size_t len);

/* The condition the stream failed with (RT_XML_COND_NONE if it has not) and its text. */
rt_xml_cond_t rt_xml_stream_error(const rt_xml_stream_t *s, const char **text);

/* Bytes the stream holds: itself, its copies, and while mid-stanza its parser and tree. */
size_t rt_xml_stream_bytes(const rt_xml_stream_t *s);
/* Whether the stream holds a parser now (only mid-stanza or mid-header). */
bool rt_xml_stream_busy(const rt_xml_stream_t *s);

/* Frees this thread's pooled parsers (tests; a thread's pool also goes at its exit). */
void rt_xml_pool_trim(void);

#endif

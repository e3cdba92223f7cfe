/*
** The element tree of one XMPP stanza, as the stream parser (xml_stream.h) builds it and the
** c2s actor reads it: an element has a local name, a namespace URI, attributes (each with
** its own namespace) and children in document order, each child an element or a run of
** text. Prefixes are not kept: XMPP is namespace-aware, so two spellings of one expanded
** name are the same element (RFC 6120 §11.2).
**
** Memory: every node comes from the allocator the caller gives (the c2s passes rt_alloc
** and rt_free on its own heap), and one call, rt_xml_free, frees a whole stanza. A node
** is one block (its strings and attribute array inline), so a stanza is one allocation per
** element and one per text run. Strings are NUL-terminated UTF-8 (XML has no U+0000) and
** stay valid as long as the stanza does. A namespace string may be shared with an ancestor
** or be a static constant (the usual XMPP namespaces), so a subtree is never freed or kept
** apart from its stanza. Every node holds pointers (siblings, children), so every block is
** asked for as one the collector scans: reaching the root reaches the whole stanza.
*/
#ifndef RT_XMPP_XML_H
#define RT_XMPP_XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Namespaces the server compares against; the parser shares these strings, never copies. */
#define RT_XML_NS_XML "http://www.w3.org/XML/1998/namespace" /* xml:lang */
#define RT_XML_NS_STREAMS "http://etherx.jabber.org/streams"
#define RT_XML_NS_CLIENT "jabber:client"
#define RT_XML_NS_SERVER "jabber:server"
#define RT_XML_NS_FRAMING "urn:ietf:params:xml:ns:xmpp-framing" /* RFC 7395 */
#define RT_XML_NS_STREAM_ERRORS "urn:ietf:params:xml:ns:xmpp-streams"
#define RT_XML_NS_STANZA_ERRORS "urn:ietf:params:xml:ns:xmpp-stanzas"
#define RT_XML_NS_TLS "urn:ietf:params:xml:ns:xmpp-tls"
#define RT_XML_NS_SASL "urn:ietf:params:xml:ns:xmpp-sasl"
#define RT_XML_NS_BIND "urn:ietf:params:xml:ns:xmpp-bind"
#define RT_XML_NS_SESSION "urn:ietf:params:xml:ns:xmpp-session"

/* The deepest tree the parser builds, whatever its settings say (rt_xml_limits_t). */
#define RT_XML_DEPTH_CAP 256

/*
** The caller's allocator. alloc returns zeroed or not, aligned for pointers, NULL on
** failure; scan says the block holds pointers to other blocks (for a collector that must
** follow them; rt_alloc's RT_OBJ_SCAN). ctx is the caller's (the c2s passes its actor).
*/
typedef struct rt_xml_alloc_s {
    void *(*alloc)(void *ctx, size_t size, bool scan);
    void (*free)(void *ctx, void *p);
} rt_xml_alloc_t;

typedef enum rt_xml_type_e {
    RT_XML_ELEMENT = 1,
    RT_XML_TEXT = 2,
} rt_xml_type_t;

/* What elements and text runs start with: the link to the next sibling and the type. */
typedef struct rt_xml_node_s {
    struct rt_xml_node_s *next; /* next sibling in document order; NULL for the last */
    uint32_t type;              /* rt_xml_type_t */
    uint32_t len;               /* a text run's bytes; an element's attribute count */
} rt_xml_node_t;

typedef struct rt_xml_attr_s {
    const char *name;  /* local name */
    const char *ns;    /* namespace URI; "" for an unprefixed attribute (most of them) */
    const char *value; /* with references replaced and whitespace normalised by XML's rules */
} rt_xml_attr_t;

typedef struct rt_xml_el_s {
    rt_xml_node_t node;      /* node.len is the number of attributes */
    const char *name;        /* local name */
    const char *ns;          /* namespace URI; "" for none */
    rt_xml_attr_t *attrs;    /* node.len of them, in document order */
    rt_xml_node_t *children; /* the first child; follow node.next */
} rt_xml_el_t;

/* A run of character data; adjacent runs are always merged, and a run is never empty. */
typedef struct rt_xml_text_s {
    rt_xml_node_t node; /* node.len is the length of data */
    char data[];        /* NUL-terminated */
} rt_xml_text_t;

static inline rt_xml_el_t *rt_xml_as_el(const rt_xml_node_t *n)
{
    return n && n->type == RT_XML_ELEMENT ? (rt_xml_el_t *)n : NULL;
}

static inline rt_xml_text_t *rt_xml_as_text(const rt_xml_node_t *n)
{
    return n && n->type == RT_XML_TEXT ? (rt_xml_text_t *)n : NULL;
}

/* Frees el and everything under it (a whole stanza: el must be a root); NULL is ignored. */
void rt_xml_free(const rt_xml_alloc_t *a, void *ctx, rt_xml_el_t *el);

/* The value of el's attribute with this local name in namespace ns ("" for unprefixed). */
const char *rt_xml_attr_ns(const rt_xml_el_t *el, const char *name, const char *ns);
/* The value of el's unprefixed attribute name (to, from, id, type...), or NULL. */
static inline const char *rt_xml_attr(const rt_xml_el_t *el, const char *name)
{
    return rt_xml_attr_ns(el, name, "");
}

/* el's first child element named name (NULL: any) in namespace ns (NULL: any), or NULL. */
rt_xml_el_t *rt_xml_child(const rt_xml_el_t *el, const char *name, const char *ns);
/* The next sibling after el with that name and namespace (NULL: any): to walk <item/>s. */
rt_xml_el_t *rt_xml_next(const rt_xml_el_t *el, const char *name, const char *ns);
/* el's first child element whatever its name, or NULL. */
rt_xml_el_t *rt_xml_first(const rt_xml_el_t *el);

/*
** el's character data when it has no child element: its one text run, or "" when it is
** empty. NULL when it has child elements: text mixed with elements is no value of an
** element (XMPP's text-only elements, <body/> and the like, never have any). *len may
** be NULL.
*/
const char *rt_xml_text(const rt_xml_el_t *el, size_t *len);

/* Whether a and b are the same tree: names, namespaces, attributes in order, text. */
bool rt_xml_equal(const rt_xml_el_t *a, const rt_xml_el_t *b);

/*
** The static copy of a namespace URI the server knows (the list in xml.c: the XMPP core
** ones and the common extensions), or NULL. The parser points nodes at these instead of
** copying the URI into each.
*/
const char *rt__xml_known_ns(const char *uri, size_t len);

#endif

/*
** The stanza tree's reading side (xml.h): lookups, comparison and freeing. Trees are built
** only by the stream parser (xml_stream.c); the server writes stanzas from parts
** (xml_write.h), never by building a tree.
*/
#include <string.h>

#include "xml.h"

/*
** Namespaces nearly every stanza or stream element carries. A node in one of these points
** at the constant here instead of a copy of its own: a <message/> with <body/>, an
** <active/> and a <request/> then copies no URI at all.
*/
static const char *const known_ns[] = {
    RT_XML_NS_CLIENT,
    RT_XML_NS_SERVER,
    RT_XML_NS_STREAMS,
    RT_XML_NS_XML,
    RT_XML_NS_FRAMING,
    RT_XML_NS_STREAM_ERRORS,
    RT_XML_NS_STANZA_ERRORS,
    RT_XML_NS_TLS,
    RT_XML_NS_SASL,
    RT_XML_NS_BIND,
    RT_XML_NS_SESSION,
    "jabber:iq:roster",
    "jabber:iq:private",
    "jabber:iq:version",
    "jabber:iq:last",
    "jabber:x:data",
    "jabber:x:conference",
    "vcard-temp",
    "vcard-temp:x:update",
    "urn:xmpp:sm:3",
    "urn:xmpp:ping",
    "urn:xmpp:time",
    "urn:xmpp:delay",
    "urn:xmpp:receipts",
    "urn:xmpp:chat-markers:0",
    "urn:xmpp:carbons:2",
    "urn:xmpp:forward:0",
    "urn:xmpp:mam:2",
    "urn:xmpp:csi:0",
    "urn:xmpp:hints",
    "urn:xmpp:sid:0",
    "urn:xmpp:blocking",
    "urn:xmpp:mucsub:0",
    "http://jabber.org/protocol/chatstates",
    "http://jabber.org/protocol/caps",
    "http://jabber.org/protocol/disco#info",
    "http://jabber.org/protocol/disco#items",
    "http://jabber.org/protocol/muc",
    "http://jabber.org/protocol/muc#user",
    "http://jabber.org/protocol/pubsub",
    "http://jabber.org/protocol/pubsub#event",
    "http://jabber.org/protocol/rsm",
    "http://jabber.org/protocol/nick",
    "http://jabber.org/protocol/address",
};

const char *rt__xml_known_ns(const char *uri, size_t len)
{
    for (size_t i = 0; i < sizeof(known_ns) / sizeof(known_ns[0]); i++)
        if (strncmp(known_ns[i], uri, len) == 0 && known_ns[i][len] == 0)
            return known_ns[i];
    return NULL;
}

/*
** Iterative, so a tree as deep as its stanza allowed costs no stack: each element's
** children are spliced in front of the nodes still to free before the element goes.
*/
void rt_xml_free(const rt_xml_alloc_t *a, void *ctx, rt_xml_el_t *el)
{
    if (!el)
        return;
    rt_xml_node_t *todo = &el->node;
    el->node.next = NULL;
    while (todo) {
        rt_xml_node_t *n = todo;
        todo = n->next;
        rt_xml_el_t *e = rt_xml_as_el(n);
        if (e && e->children) {
            rt_xml_node_t *last = e->children;
            while (last->next)
                last = last->next;
            last->next = todo;
            todo = e->children;
        }
        a->free(ctx, n);
    }
}

const char *rt_xml_attr_ns(const rt_xml_el_t *el, const char *name, const char *ns)
{
    for (uint32_t i = 0; i < el->node.len; i++) {
        const rt_xml_attr_t *at = &el->attrs[i];
        if (strcmp(at->name, name) == 0 && strcmp(at->ns, ns) == 0)
            return at->value;
    }
    return NULL;
}

static bool matches(const rt_xml_node_t *n, const char *name, const char *ns)
{
    const rt_xml_el_t *e = rt_xml_as_el(n);
    return e && (!name || strcmp(e->name, name) == 0) && (!ns || strcmp(e->ns, ns) == 0);
}

rt_xml_el_t *rt_xml_child(const rt_xml_el_t *el, const char *name, const char *ns)
{
    for (rt_xml_node_t *n = el->children; n; n = n->next)
        if (matches(n, name, ns))
            return (rt_xml_el_t *)n;
    return NULL;
}

rt_xml_el_t *rt_xml_next(const rt_xml_el_t *el, const char *name, const char *ns)
{
    for (rt_xml_node_t *n = el->node.next; n; n = n->next)
        if (matches(n, name, ns))
            return (rt_xml_el_t *)n;
    return NULL;
}

rt_xml_el_t *rt_xml_first(const rt_xml_el_t *el)
{
    return rt_xml_child(el, NULL, NULL);
}

const char *rt_xml_text(const rt_xml_el_t *el, size_t *len)
{
    const rt_xml_text_t *run = NULL;
    for (const rt_xml_node_t *n = el->children; n; n = n->next) {
        if (n->type == RT_XML_ELEMENT)
            return NULL;
        run = (const rt_xml_text_t *)n;
    }
    if (len)
        *len = run ? run->node.len : 0;
    return run ? run->data : "";
}

static bool same_attrs(const rt_xml_el_t *a, const rt_xml_el_t *b)
{
    if (a->node.len != b->node.len)
        return false;
    for (uint32_t i = 0; i < a->node.len; i++)
        if (strcmp(a->attrs[i].name, b->attrs[i].name) || strcmp(a->attrs[i].ns, b->attrs[i].ns) ||
            strcmp(a->attrs[i].value, b->attrs[i].value))
            return false;
    return true;
}

static bool same_node(const rt_xml_node_t *a, const rt_xml_node_t *b)
{
    if (a->type != b->type || a->len != b->len)
        return false;
    if (a->type == RT_XML_TEXT)
        return memcmp(((const rt_xml_text_t *)a)->data, ((const rt_xml_text_t *)b)->data, a->len) ==
               0;
    const rt_xml_el_t *x = (const rt_xml_el_t *)a, *y = (const rt_xml_el_t *)b;
    return strcmp(x->name, y->name) == 0 && strcmp(x->ns, y->ns) == 0 && same_attrs(x, y);
}

/*
** Compares in document order without recursion: both trees are walked in step, going
** down to the first child, else to the next sibling, else back up to the nearest parent
** with one. The parents are kept in arrays RT_XML_DEPTH_CAP deep, as deep as the parser
** ever builds; a deeper tree compares unequal.
*/
bool rt_xml_equal(const rt_xml_el_t *a, const rt_xml_el_t *b)
{
    const rt_xml_node_t *pa[RT_XML_DEPTH_CAP], *pb[RT_XML_DEPTH_CAP];
    size_t depth = 0;
    const rt_xml_node_t *x = &a->node, *y = &b->node;
    for (;;) {
        if (!same_node(x, y))
            return false;
        const rt_xml_el_t *ex = rt_xml_as_el(x), *ey = rt_xml_as_el(y);
        if (ex && (ex->children || ey->children)) {
            if (!ex->children || !ey->children || depth == RT_XML_DEPTH_CAP)
                return false;
            pa[depth] = x;
            pb[depth++] = y;
            x = ex->children;
            y = ey->children;
            continue;
        }
        /* Past a leaf: the next sibling, else climb until a parent has one. */
        for (;;) {
            if (depth == 0)
                return true;
            if (x->next || y->next) {
                if (!x->next || !y->next)
                    return false;
                x = x->next;
                y = y->next;
                break;
            }
            x = pa[--depth];
            y = pb[depth];
        }
    }
}

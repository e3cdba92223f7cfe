/*
** The XML writer (xml_write.h): escaping for text and attribute values, and a parsed tree
** written back out.
*/
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "xml_write.h"

#define REPLACEMENT "\xef\xbf\xbd" /* U+FFFD, for what XML cannot carry */

/*
** The bytes that need a look (1): controls, markup and quotes, and the first byte of
** every multi-byte sequence, which is checked for well-formed UTF-8 that XML allows.
** Everything else is copied in runs.
*/
static const unsigned char special[256] = {
    [0x00 ... 0x1f] = 1, ['&'] = 1,  ['<'] = 1,           ['>'] = 1,
    ['"'] = 1,           ['\''] = 1, [0x80 ... 0xff] = 1,
};

/* What an ASCII special character becomes; NULL: itself. */
static const char *escape_of(unsigned char c, bool attr)
{
    switch (c) {
    case '&':
        return "&amp;";
    case '<':
        return "&lt;";
    case '>':
        return "&gt;"; /* always, so "]]>" never appears */
    case '\'':
        return attr ? "&apos;" : NULL;
    case '"':
        return attr ? "&quot;" : NULL;
    case '\t':
        return attr ? "&#9;" : NULL; /* attribute normalisation makes TAB and LF spaces */
    case '\n':
        return attr ? "&#10;" : NULL;
    case '\r':
        return "&#13;"; /* parsing makes CR and CRLF into LF, in text too */
    default:
        return REPLACEMENT; /* the other C0 controls are not XML characters */
    }
}

/* Whether the well-formed UTF-8 sequence at p (len bytes) is an XML character. */
static bool xml_char(const unsigned char *p, size_t len)
{
    return !(len == 3 && p[0] == 0xef && p[1] == 0xbf && p[2] >= 0xbe); /* U+FFFE, U+FFFF */
}

static void put_escaped(rt_buf_t *b, const char *s, size_t n, bool attr)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t run = 0, i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (!special[c]) {
            i++;
            continue;
        }
        rt_buf_add(b, p + run, i - run);
        if (c >= 0x80) {
            /* Bad UTF-8 is replaced byte by byte; U+FFFE and U+FFFF as one character. */
            size_t len = rt_utf8_len(p + i, n - i);
            if (len && xml_char(p + i, len))
                rt_buf_add(b, p + i, len);
            else
                rt_buf_add(b, REPLACEMENT, 3);
            i += len ? len : 1;
        } else {
            const char *r = escape_of(c, attr);
            if (r)
                rt_buf_add(b, r, strlen(r));
            else
                rt_buf_add(b, &c, 1);
            i++;
        }
        run = i;
    }
    rt_buf_add(b, p + run, n - run);
}

void rt_xml_put_start(rt_buf_t *b, const char *name)
{
    rt_buf_add(b, "<", 1);
    rt_buf_add(b, name, strlen(name));
}

void rt_xml_put_attr_len(rt_buf_t *b, const char *name, const char *value, size_t len)
{
    rt_buf_add(b, " ", 1);
    rt_buf_add(b, name, strlen(name));
    rt_buf_add(b, "='", 2);
    put_escaped(b, value, len, true);
    rt_buf_add(b, "'", 1);
}

void rt_xml_put_attr(rt_buf_t *b, const char *name, const char *value)
{
    rt_xml_put_attr_len(b, name, value, strlen(value));
}

void rt_xml_put_start_end(rt_buf_t *b)
{
    rt_buf_add(b, ">", 1);
}

void rt_xml_put_empty_end(rt_buf_t *b)
{
    rt_buf_add(b, "/>", 2);
}

void rt_xml_put_text(rt_buf_t *b, const char *text, size_t len)
{
    put_escaped(b, text, len, false);
}

void rt_xml_put_end(rt_buf_t *b, const char *name)
{
    rt_buf_add(b, "</", 2);
    rt_buf_add(b, name, strlen(name));
    rt_buf_add(b, ">", 1);
}

/*
** An attribute in a namespace is written with the prefix "a<i>", i the index of the
** element's first attribute in that namespace, declared just before that attribute: one
** declaration per namespace, and no clash with the element's own name, which is never
** prefixed. xml: is bound by XML itself.
*/
static void put_ns_attr(rt_buf_t *b, const rt_xml_el_t *el, uint32_t i)
{
    const rt_xml_attr_t *at = &el->attrs[i];
    char prefix[16];
    if (strcmp(at->ns, RT_XML_NS_XML) == 0) {
        snprintf(prefix, sizeof prefix, "xml");
    } else {
        uint32_t first = 0;
        while (strcmp(el->attrs[first].ns, at->ns) != 0)
            first++;
        snprintf(prefix, sizeof prefix, "a%u", (unsigned)first);
        if (first == i) {
            char decl[24];
            snprintf(decl, sizeof decl, "xmlns:%s", prefix);
            rt_xml_put_attr(b, decl, at->ns);
        }
    }
    rt_buf_printf(b, " %s:%s='", prefix, at->name);
    put_escaped(b, at->value, strlen(at->value), true);
    rt_buf_add(b, "'", 1);
}

/*
** scope is the default namespace in scope where el is written. An element in xml's own
** namespace (<xml:foo/>, rare but valid) keeps the xml prefix: that namespace may not be
** declared as a default one.
*/
static int put_el(rt_buf_t *b, const rt_xml_el_t *el, const char *scope, unsigned depth)
{
    if (depth >= RT_XML_DEPTH_CAP)
        return RT_EINVAL;
    bool xml_ns = strcmp(el->ns, RT_XML_NS_XML) == 0;
    rt_buf_add(b, "<", 1);
    if (xml_ns)
        rt_buf_add(b, "xml:", 4);
    rt_buf_add(b, el->name, strlen(el->name));
    if (!xml_ns && strcmp(el->ns, scope) != 0) {
        rt_xml_put_attr(b, "xmlns", el->ns);
        scope = el->ns;
    }
    for (uint32_t i = 0; i < el->node.len; i++) {
        if (el->attrs[i].ns[0])
            put_ns_attr(b, el, i);
        else
            rt_xml_put_attr(b, el->attrs[i].name, el->attrs[i].value);
    }
    if (!el->children) {
        rt_xml_put_empty_end(b);
        return 0;
    }
    rt_xml_put_start_end(b);
    for (const rt_xml_node_t *n = el->children; n; n = n->next) {
        const rt_xml_text_t *t = rt_xml_as_text(n);
        if (t) {
            rt_xml_put_text(b, t->data, t->node.len);
            continue;
        }
        int rc = put_el(b, (const rt_xml_el_t *)n, scope, depth + 1);
        if (rc)
            return rc;
    }
    rt_buf_add(b, "</", 2);
    if (xml_ns)
        rt_buf_add(b, "xml:", 4);
    rt_buf_add(b, el->name, strlen(el->name));
    rt_buf_add(b, ">", 1);
    return 0;
}

int rt_xml_put_tree(rt_buf_t *b, const rt_xml_el_t *el, const char *parent_ns)
{
    int rc = put_el(b, el, parent_ns, 0);
    if (rc)
        return rc;
    return b->oom ? RT_ENOMEM : 0;
}

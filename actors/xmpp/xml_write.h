/*
** Writing XML for XMPP: stanzas and stream elements are written from their parts into a
** byte buffer (rt_buf_t) as they are produced, never through a tree, with each value
** escaped for where it goes; a parsed tree (xml.h) can be written back as well.
**
**     rt_xml_put_start(b, "message");
**     rt_xml_put_attr(b, "to", jid);
**     rt_xml_put_start_end(b);                          <message to='...'>
**     rt_xml_put_start(b, "body");
**     rt_xml_put_start_end(b);
**     rt_xml_put_text(b, text, len);
**     rt_xml_put_end(b, "body");
**     rt_xml_put_end(b, "message");                     ...</message>
**
** Names (and prefixes in them, "stream:features") are the caller's constants and are
** written as they are. Values are any bytes: markup characters become references (& < >
** always; ' " and the whitespace that attribute normalisation would change in attribute
** values; CR in text too, which parsing would turn into LF), and what XML cannot carry at
** all (control characters other than TAB, LF and CR, U+FFFE, U+FFFF, bytes that are not
** UTF-8) becomes U+FFFD, so whatever a value holds, the output is well-formed and reads
** back as the same value wherever that was representable. Attribute values are quoted
** with '. Appends never fail on their own: rt_buf_t's sticky oom says at the end.
*/
#ifndef RT_XMPP_XML_WRITE_H
#define RT_XMPP_XML_WRITE_H

#include <stddef.h>

#include "rt.h"
#include "xml.h"

void rt_xml_put_start(rt_buf_t *b, const char *name);                   /* <name */
void rt_xml_put_attr(rt_buf_t *b, const char *name, const char *value); /*  name='v' */
void rt_xml_put_attr_len(rt_buf_t *b, const char *name, const char *value, size_t len);
void rt_xml_put_start_end(rt_buf_t *b);                          /* > */
void rt_xml_put_empty_end(rt_buf_t *b);                          /* /> */
void rt_xml_put_text(rt_buf_t *b, const char *text, size_t len); /* escaped */
void rt_xml_put_end(rt_buf_t *b, const char *name);              /* </name> */

/*
** Writes the tree el as it would appear inside an element whose default namespace is
** parent_ns ("" for none; the stream's content namespace for a stanza on a TCP stream,
** "" for a WebSocket frame). A namespace is declared (xmlns='...') only on an element
** whose namespace differs from its parent's; an attribute in a namespace other than
** xml's gets a prefix declared on its element. Parsing the output gives a tree equal
** to el (rt_xml_equal). Returns 0, RT_EINVAL for a tree deeper than RT_XML_DEPTH_CAP (the
** parser builds none) or RT_ENOMEM when the buffer could not grow.
*/
int rt_xml_put_tree(rt_buf_t *b, const rt_xml_el_t *el, const char *parent_ns);

#endif

/*
** Between the stream parser (xml_stream.c) and its per-thread pool of expat parsers
** (xml_pool.c): a parser comes with the state of one parse, lent to a stream while it
** parses. Everything here is malloc'd and counted in bytes, which the stream charges to
** its session while it keeps the work across calls.
*/
#ifndef RT_XMPP_XML_IMPL_H
#define RT_XMPP_XML_IMPL_H

#include <expat.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xml_stream.h"

/* An open element of the stanza being built, and its last child so far. */
typedef struct rt__xml_frame_s {
    rt_xml_el_t *el;
    rt_xml_node_t *last;
} rt__xml_frame_t;

/*
** Positions are byte indexes in what this parser was given since it was taken (the
** synthetic header included), as expat counts them.
*/
typedef struct rt__xml_work_s {
    XML_Parser parser;
    size_t bytes;                /* malloc'd for this work: expat's, the struct, the arrays */
    struct rt__xml_work_s *next; /* in the pool */
    rt_xml_stream_t *s;          /* the stream it is lent to */
    const char *at;              /* the static synthetic header this parser stands after, or NULL */
    uint64_t fed;                /* bytes given to expat */
    uint64_t seen;               /* index just past the last event expat reported */
    uint64_t quiet;              /* index past the last event between stanzas (or the header) */
    uint64_t base;               /* index of the first byte of the current feed */
    uint64_t stop_at;            /* seen when a callback stopped the feed */
    size_t tree_bytes;           /* of the partial stanza, through the caller's allocator */
    uint32_t depth;              /* open elements, the stream's root included */
    uint32_t top;                /* the depth a stanza's root opens at: 1, or 0 for frames */
    bool synthetic;              /* the synthetic header is being fed */
    bool cdata;                  /* inside a CDATA section */
    bool halt;                   /* stopped or failed: handlers do nothing more */
    int stop;                    /* RT_XML_STOP or a callback's negative code, once stopped */
    char *text;                  /* character data gathered for the innermost open element */
    size_t text_len, text_cap;
    rt__xml_frame_t *frames; /* the stanza's open elements, root first */
    size_t frames_cap;
    char *decls; /* the root's namespace declarations: prefix NUL uri NUL, ndecls times */
    size_t decls_len, decls_cap, ndecls;
    rt_xml_ns_t *nsv; /* the same as an array, for the header callback */
    size_t nsv_cap;
} rt__xml_work_t;

/*
** A parser for a stream. With prolog (a static synthetic header) the pool first looks for
** one given back standing after that header: inside its root, every byte it was fed
** reported, as a fresh parser is once it has parsed the header. Such a work comes with at ==
** prolog, its handlers and positions as its last stream left them, and needs neither a reset
** nor the header again. Otherwise the parser is reset for a new document (UTF-8, namespaces
** with ' ' between URI, local name and prefix), with no handlers, at NULL and every field
** above zero. NULL when out of memory.
*/
rt__xml_work_t *rt__xml_work_take(const char *prolog);
/*
** Back to this thread's pool (w->at says where it stands, as above; NULL: anywhere), or freed
** when the pool is full or w holds too much.
*/
void rt__xml_work_give(rt__xml_work_t *w);
/* rt_grow for w's arrays, counted in w->bytes. */
int rt__xml_work_grow(rt__xml_work_t *w, void *arr, size_t *cap, size_t need, size_t elem);
/* Makes what expat allocates from now on on this thread count in w->bytes. */
void rt__xml_work_use(rt__xml_work_t *w);

#endif

/*
** A per-thread pool of expat parsers for the XMPP stream parser (xml_impl.h), so that an
** idle stream holds none: a parser is several KB (its buffer, tag stack, pools, hash
** tables) and a session is meant to cost under 2 KB in all. Taking one from the pool
** costs an XML_ParserReset, which keeps expat's buffers, and the stream's synthetic header;
** neither is needed for a parser given back between two stanzas of a stream with the usual
** header, which any stream with that header can go on with (most of a session's feeds take
** one: a login's seven, each burst of chat). A parser that grew past
** POOL_KEEP_BYTES (it read a big stanza) is freed instead, so the pool's memory is
** bounded at POOL_MAX x POOL_KEEP_BYTES a thread.
**
** expat allocates through a memory suite with no context pointer, so the parser being
** used is named in a thread-local before each call into expat that may allocate; each
** block records the counter it was counted in, so freeing and growing need no lookup.
*/
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "xml_impl.h"

#define POOL_MAX 8                  /* idle parsers kept per thread */
#define POOL_KEEP_BYTES (64 * 1024) /* a parser holding more is freed, not kept */
#define POOL_TEXT_KEEP 4096         /* text buffer kept with a pooled parser */

typedef struct mem_hdr_s {
    size_t size;   /* bytes asked for */
    size_t *owner; /* the work's counter they were counted in, or NULL */
} mem_hdr_t;       /* 16 bytes: what follows keeps malloc's alignment */

static _Thread_local size_t *mem_owner;

static void *mem_malloc(size_t n)
{
    if (n > SIZE_MAX - sizeof(mem_hdr_t))
        return NULL;
    mem_hdr_t *h = malloc(sizeof(*h) + n);
    if (!h)
        return NULL;
    h->size = n;
    h->owner = mem_owner;
    if (h->owner)
        *h->owner += sizeof(*h) + n;
    return h + 1;
}

static void *mem_realloc(void *p, size_t n)
{
    if (!p)
        return mem_malloc(n);
    if (n > SIZE_MAX - sizeof(mem_hdr_t))
        return NULL;
    mem_hdr_t *h = (mem_hdr_t *)p - 1;
    size_t old = h->size;
    mem_hdr_t *q = realloc(h, sizeof(*q) + n);
    if (!q)
        return NULL;
    q->size = n;
    if (q->owner)
        *q->owner = *q->owner - old + n;
    return q + 1;
}

static void mem_free(void *p)
{
    if (!p)
        return;
    mem_hdr_t *h = (mem_hdr_t *)p - 1;
    if (h->owner)
        *h->owner -= sizeof(*h) + h->size;
    free(h);
}

static const XML_Memory_Handling_Suite suite = {mem_malloc, mem_realloc, mem_free};

typedef struct pool_s {
    rt__xml_work_t *free; /* idle parsers, linked by next */
    unsigned n;
    bool hooked;        /* pool_fini registered for this thread */
    unsigned long salt; /* expat's hash salt for this thread's parsers */
} pool_t;

static _Thread_local pool_t pool;

void rt__xml_work_use(rt__xml_work_t *w)
{
    mem_owner = &w->bytes;
}

static void destroy(rt__xml_work_t *w)
{
    if (w->parser)
        XML_ParserFree(w->parser);
    free(w->text);
    free(w->frames);
    free(w->decls);
    free(w->nsv);
    free(w);
}

static void pool_fini(void *obj)
{
    pool_t *p = obj;
    while (p->free) {
        rt__xml_work_t *w = p->free;
        p->free = w->next;
        destroy(w);
    }
    p->n = 0;
}

void rt_xml_pool_trim(void)
{
    pool_fini(&pool);
}

static rt__xml_work_t *create(void)
{
    rt__xml_work_t *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->bytes = sizeof(*w);
    rt__xml_work_use(w);
    w->parser = XML_ParserCreate_MM("UTF-8", &suite, " ");
    if (!w->parser) {
        destroy(w);
        return NULL;
    }
    /* Names come as "uri local prefix": the header's prefix is checked (bad-namespace-prefix). */
    XML_SetReturnNSTriplet(w->parser, XML_TRUE);
    return w;
}

/* Zeroes the per-parse fields, keeping the parser, its counter and its arrays. */
static void clear(rt__xml_work_t *w)
{
    w->next = NULL;
    w->s = NULL;
    w->at = NULL;
    w->fed = w->seen = w->quiet = w->base = w->stop_at = 0;
    w->tree_bytes = 0;
    w->depth = w->top = 0;
    w->synthetic = w->halt = w->cdata = false;
    w->stop = 0;
    w->text_len = w->decls_len = w->ndecls = 0;
}

/* Unlinks and returns a pooled parser standing after prolog, or NULL. */
static rt__xml_work_t *take_at(const char *prolog)
{
    for (rt__xml_work_t **p = &pool.free; *p; p = &(*p)->next) {
        rt__xml_work_t *w = *p;
        if (w->at != prolog)
            continue;
        *p = w->next;
        w->next = NULL;
        pool.n--;
        rt__xml_work_use(w);
        return w;
    }
    return NULL;
}

/*
** The thread's pool, set up on first use by take or by give: a session's actor may take a
** parser on one scheduler and, moved by a thief mid-stanza, give it back on another that
** never took one (its pool then kept the parser past the thread's exit: LeakSanitizer found
** it after a flood of 20,000 stanzas).
*/
static void pool_hook(void)
{
    if (pool.hooked)
        return;
    /* Keyed by the process's secret, so a peer cannot aim collisions at the tables. */
    pool.salt = (unsigned long)rt_hash_with((uint64_t)(uintptr_t)&pool, "rt-xml", 6) | 1;
    /* Without the hook the pool leaks at the thread's exit; parsing works either way. */
    (void)rt_thread_at_exit(pool_fini, &pool);
    pool.hooked = true;
}

rt__xml_work_t *rt__xml_work_take(const char *prolog)
{
    pool_hook();
    rt__xml_work_t *w = prolog ? take_at(prolog) : NULL;
    if (w)
        return w;
    /* A reset spends one that stands nowhere before one that another stream could go on with. */
    w = take_at(NULL);
    if (!w && pool.free)
        w = take_at(pool.free->at);
    if (w && !XML_ParserReset(w->parser, "UTF-8")) {
        destroy(w);
        w = NULL;
    }
    if (!w)
        w = create();
    if (!w)
        return NULL;
    clear(w);
    XML_SetHashSalt(w->parser, pool.salt);
#if XML_MAJOR_VERSION > 2 || (XML_MAJOR_VERSION == 2 && XML_MINOR_VERSION >= 6)
    /*
    ** expat 2.6 waits for more bytes before reparsing a partial token; a stanza would then
    ** be reported only when the peer sends something after it.
    */
    XML_SetReparseDeferralEnabled(w->parser, XML_FALSE);
#endif
    return w;
}

void rt__xml_work_give(rt__xml_work_t *w)
{
    pool_hook();
    if (w->text_cap > POOL_TEXT_KEEP) {
        w->bytes -= w->text_cap;
        free(w->text);
        w->text = NULL;
        w->text_cap = 0;
    }
    if (pool.n >= POOL_MAX || w->bytes > POOL_KEEP_BYTES) {
        destroy(w);
        return;
    }
    w->s = NULL;
    w->next = pool.free;
    pool.free = w;
    pool.n++;
}

int rt__xml_work_grow(rt__xml_work_t *w, void *arr, size_t *cap, size_t need, size_t elem)
{
    size_t before = *cap;
    int rc = rt_grow(arr, cap, need, elem, 16);
    if (rc == 0)
        w->bytes += (*cap - before) * elem;
    return rc;
}

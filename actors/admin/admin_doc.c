/*
** The admin socket's answer trees (admin_doc.h): built in an arena per answer and
** rendered as JSON or as aligned text.
*/
#include "admin_doc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

typedef enum {
    D_OBJECT,
    D_ARRAY,
    D_STR,
    D_U64,
    D_I64,
    D_DOUBLE,
    D_BOOL,
    D_NULL,
    D_JSON,
    D_BYTES,    /* v.i bytes */
    D_DURATION, /* v.u units of 1/per_second s */
} kind_t;

#define ARENA_CHUNK (64 * 1024) /* bytes per arena chunk; bigger strings get their own */

/*
** A tree's memory: nodes and strings bump-allocated from chunks, all freed with the root.
** Chunks are mapped, not malloc'ed: an answer about every actor takes tens of MB for a
** moment, and in malloc's arenas the holes it left between longer-lived allocations stayed
** resident (a 20,000-connection soak sampling `actors list` every 10 s grew by MBs of free
** malloc memory in steps).
*/
typedef struct chunk_s {
    struct chunk_s *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk_t;

struct rt_doc_s {
    kind_t kind;
    char *key;              /* member name inside an object, NULL in an array or at the root */
    rt_doc_t *next;         /* next sibling */
    rt_doc_t *first, *last; /* children of an object or array */
    rt_doc_t *root;         /* holds the arena and the allocation-failure flag */
    chunk_t *arena;         /* root only */
    bool oom;               /* root only */
    int decimals;
    uint64_t per_second; /* D_DURATION's unit */
    union {
        char *str; /* D_STR, D_JSON */
        uint64_t u;
        int64_t i;
        double d;
        bool b;
    } v;
};

/* n bytes from root's arena (16-byte aligned), or NULL with oom set. */
static void *arena_alloc(rt_doc_t *root, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk_t *c = root->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK - sizeof(chunk_t);
        chunk_t *fresh = mmap(NULL, sizeof(chunk_t) + cap, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fresh == MAP_FAILED) {
            root->oom = true;
            return NULL;
        }
        fresh->used = 0;
        fresh->cap = cap;
        if (c && cap != ARENA_CHUNK - sizeof(chunk_t)) {
            /* A big one goes behind the current chunk, which keeps serving small ones. */
            fresh->next = c->next;
            c->next = fresh;
            c = fresh;
        } else {
            fresh->next = c;
            root->arena = c = fresh;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

static char *arena_strndup(rt_doc_t *root, const char *s, size_t n)
{
    char *p = arena_alloc(root, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void rt_buf_json_str(rt_buf_t *b, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    rt_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            rt_buf_printf(b, "\\%c", c);
            i++;
        } else if (c == '\n') {
            rt_buf_add(b, "\\n", 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            rt_buf_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t len = rt_utf8_len(p + i, n - i);
            if (len)
                rt_buf_add(b, p + i, len);
            else
                rt_buf_add(b, "\\ufffd", 6);
            i += len ? len : 1;
        }
    }
    rt_buf_add(b, "\"", 1);
}

/* ---- tree ---- */

static rt_doc_t *root_new(kind_t kind)
{
    rt_doc_t *d = calloc(1, sizeof(*d));
    if (d) {
        d->kind = kind;
        d->root = d;
    }
    return d;
}

rt_doc_t *rt_doc_object(void)
{
    return root_new(D_OBJECT);
}

rt_doc_t *rt_doc_array(void)
{
    return root_new(D_ARRAY);
}

void rt_doc_free(rt_doc_t *d)
{
    if (!d)
        return;
    for (chunk_t *c = d->arena, *next; c; c = next) {
        next = c->next;
        munmap(c, sizeof(chunk_t) + c->cap);
    }
    free(d);
}

static rt_doc_t *add(rt_doc_t *parent, const char *key, kind_t kind)
{
    if (!parent || parent->root->oom)
        return NULL;
    rt_doc_t *root = parent->root;
    rt_doc_t *d = arena_alloc(root, sizeof(*d));
    if (!d)
        return NULL;
    memset(d, 0, sizeof(*d));
    d->kind = kind;
    d->root = root;
    if (parent->kind == D_OBJECT &&
        !(d->key = arena_strndup(root, key ? key : "", key ? strlen(key) : 0)))
        return NULL;
    if (parent->last)
        parent->last->next = d;
    else
        parent->first = d;
    parent->last = d;
    return d;
}

rt_doc_t *rt_doc_add_object(rt_doc_t *parent, const char *key)
{
    return add(parent, key, D_OBJECT);
}
rt_doc_t *rt_doc_add_array(rt_doc_t *parent, const char *key)
{
    return add(parent, key, D_ARRAY);
}

static void add_text(rt_doc_t *parent, const char *key, kind_t kind, const char *v, size_t n)
{
    rt_doc_t *d = add(parent, key, kind);
    if (d && !(d->v.str = arena_strndup(d->root, v, n)))
        d->kind = D_NULL;
}

void rt_doc_add_strn(rt_doc_t *parent, const char *key, const char *v, size_t n)
{
    add_text(parent, key, D_STR, v, n);
}

void rt_doc_add_str(rt_doc_t *parent, const char *key, const char *v)
{
    add_text(parent, key, D_STR, v ? v : "", v ? strlen(v) : 0);
}

void rt_doc_add_json(rt_doc_t *parent, const char *key, const char *json)
{
    add_text(parent, key, D_JSON, json, strlen(json));
}

void rt_doc_add_u64(rt_doc_t *parent, const char *key, uint64_t v)
{
    rt_doc_t *d = add(parent, key, D_U64);
    if (d)
        d->v.u = v;
}

void rt_doc_add_i64(rt_doc_t *parent, const char *key, int64_t v)
{
    rt_doc_t *d = add(parent, key, D_I64);
    if (d)
        d->v.i = v;
}

void rt_doc_add_double(rt_doc_t *parent, const char *key, double v, int decimals)
{
    rt_doc_t *d = add(parent, key, D_DOUBLE);
    if (d) {
        d->v.d = v;
        d->decimals = decimals;
    }
}

void rt_doc_add_bytes(rt_doc_t *parent, const char *key, int64_t bytes)
{
    rt_doc_t *d = add(parent, key, D_BYTES);
    if (d)
        d->v.i = bytes;
}

void rt_doc_add_duration(rt_doc_t *parent, const char *key, uint64_t v, uint64_t per_second)
{
    RT_ASSERT(per_second > 0);
    rt_doc_t *d = add(parent, key, D_DURATION);
    if (d) {
        d->v.u = v;
        d->per_second = per_second;
    }
}

/* Drops the trailing zeros of a number's decimals ("1.50" -> "1.5", "2.0" -> "2"). */
static void trim_zeros(char *num)
{
    char *dot = strchr(num, '.');
    if (!dot)
        return;
    char *end = num + strlen(num);
    while (end > dot + 1 && end[-1] == '0')
        end--;
    if (end == dot + 1)
        end = dot;
    *end = 0;
}

void rt_doc_bytes_text(int64_t bytes, char *out, size_t n)
{
    static const char units[] = "KMGTP";
    double v = (double)(bytes < 0 ? -bytes : bytes);
    if (v < 1024) {
        snprintf(out, n, "%lld", (long long)bytes);
        return;
    }
    int u = -1;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    char num[32];
    snprintf(num, sizeof(num), v < 10 ? "%.1f" : "%.0f", v);
    trim_zeros(num);
    snprintf(out, n, "%s%s%c", bytes < 0 ? "-" : "", num, units[u]);
}

void rt_doc_seconds_text(double seconds, char *out, size_t n)
{
    char num[32];
    snprintf(num, sizeof(num),
             seconds >= 100 ? "%.0f" : seconds >= 10 ? "%.1f" : seconds >= 1 ? "%.2f" : "%.3g",
             seconds);
    if (seconds < 1 && strchr(num, 'e')) /* %g's exponent: below a microsecond */
        snprintf(num, sizeof(num), "%.6f", seconds);
    trim_zeros(num);
    snprintf(out, n, "%ss", num);
}

void rt_doc_add_bool(rt_doc_t *parent, const char *key, bool v)
{
    rt_doc_t *d = add(parent, key, D_BOOL);
    if (d)
        d->v.b = v;
}

void rt_doc_add_null(rt_doc_t *parent, const char *key)
{
    add(parent, key, D_NULL);
}

/* ---- JSON ---- */

static bool is_scalar(const rt_doc_t *d)
{
    return d->kind != D_OBJECT && d->kind != D_ARRAY;
}

/* A scalar's text, as both renderings show numbers (JSON has no NaN: null). */
static void scalar(const rt_doc_t *d, rt_buf_t *out, bool json)
{
    switch (d->kind) {
    case D_STR:
        if (json)
            rt_buf_json_str(out, d->v.str, strlen(d->v.str));
        else
            rt_buf_printf(out, "%s", d->v.str);
        break;
    case D_JSON:
        rt_buf_printf(out, "%s", d->v.str);
        break;
    case D_U64:
        rt_buf_printf(out, "%llu", (unsigned long long)d->v.u);
        break;
    case D_I64:
        rt_buf_printf(out, "%lld", (long long)d->v.i);
        break;
    case D_DOUBLE:
        if (d->v.d != d->v.d)
            rt_buf_printf(out, json ? "null" : "-");
        else
            rt_buf_printf(out, "%.*f", d->decimals, d->v.d);
        break;
    case D_BOOL:
        rt_buf_printf(out, "%s", d->v.b ? "true" : "false");
        break;
    case D_BYTES:
        if (json) {
            rt_buf_printf(out, "%lld", (long long)d->v.i);
        } else {
            char text[32];
            rt_doc_bytes_text(d->v.i, text, sizeof(text));
            rt_buf_printf(out, "%s", text);
        }
        break;
    case D_DURATION:
        if (json) {
            rt_buf_printf(out, "%llu", (unsigned long long)d->v.u);
        } else {
            char text[32];
            rt_doc_seconds_text((double)d->v.u / (double)d->per_second, text, sizeof(text));
            rt_buf_printf(out, "%s", text);
        }
        break;
    case D_NULL:
        rt_buf_printf(out, json ? "null" : "-");
        break;
    default:
        break;
    }
}

static void json(const rt_doc_t *d, rt_buf_t *out)
{
    if (is_scalar(d)) {
        scalar(d, out, true);
        return;
    }
    bool obj = d->kind == D_OBJECT;
    rt_buf_add(out, obj ? "{" : "[", 1);
    for (const rt_doc_t *c = d->first; c; c = c->next) {
        if (obj) {
            rt_buf_json_str(out, c->key, strlen(c->key));
            rt_buf_add(out, ":", 1);
        }
        json(c, out);
        if (c->next)
            rt_buf_add(out, ",", 1);
    }
    rt_buf_add(out, obj ? "}" : "]", 1);
}

int rt_doc_render_json(const rt_doc_t *d, rt_buf_t *out)
{
    if (!d || d->root->oom)
        return RT_ENOMEM;
    json(d, out);
    rt_buf_add(out, "\n", 1);
    return out->oom ? RT_ENOMEM : 0;
}

/* ---- text ---- */

static void indent(rt_buf_t *out, int n)
{
    rt_buf_printf(out, "%*s", n, "");
}

/* An array of scalars, or a flat value, as one line of text. */
static bool is_line(const rt_doc_t *d)
{
    if (is_scalar(d))
        return true;
    if (d->kind == D_OBJECT)
        return false;
    for (const rt_doc_t *c = d->first; c; c = c->next)
        if (!is_scalar(c))
            return false;
    return true;
}

static void line_value(const rt_doc_t *d, rt_buf_t *out)
{
    if (is_scalar(d)) {
        scalar(d, out, false);
        return;
    }
    if (!d->first)
        rt_buf_printf(out, "-");
    for (const rt_doc_t *c = d->first; c; c = c->next) {
        scalar(c, out, false);
        if (c->next)
            rt_buf_printf(out, ", ");
    }
}

static bool is_flat_object(const rt_doc_t *d)
{
    if (d->kind != D_OBJECT)
        return false;
    for (const rt_doc_t *c = d->first; c; c = c->next)
        if (!is_line(c))
            return false;
    return true;
}

static size_t cell_width(const rt_doc_t *d)
{
    char num[64];
    switch (d->kind) {
    case D_STR:
    case D_JSON:
        return strlen(d->v.str);
    case D_U64:
        return (size_t)snprintf(num, sizeof(num), "%llu", (unsigned long long)d->v.u);
    case D_I64:
        return (size_t)snprintf(num, sizeof(num), "%lld", (long long)d->v.i);
    default:
        break;
    }
    rt_buf_t b = {0};
    line_value(d, &b);
    size_t w = b.len;
    rt_buf_free(&b);
    return w;
}

#define TEXT_MAX_COLUMNS 32 /* a table wider than this is shown as records */

static void text(const rt_doc_t *d, rt_buf_t *out, int depth);

/* An array of flat objects as a table: the first row's keys are the columns. */
static bool table(const rt_doc_t *d, rt_buf_t *out, int depth)
{
    size_t ncols = 0;
    for (const rt_doc_t *c = d->first->first; c; c = c->next)
        ncols++;
    if (!ncols || ncols > TEXT_MAX_COLUMNS)
        return false;
    for (const rt_doc_t *row = d->first; row; row = row->next)
        if (!is_flat_object(row))
            return false;
    size_t width[TEXT_MAX_COLUMNS];
    size_t i = 0;
    for (const rt_doc_t *c = d->first->first; c; c = c->next, i++)
        width[i] = strlen(c->key);
    for (const rt_doc_t *row = d->first; row; row = row->next) {
        i = 0;
        for (const rt_doc_t *c = row->first; c && i < ncols; c = c->next, i++) {
            size_t w = cell_width(c);
            if (w > width[i])
                width[i] = w;
        }
    }
    indent(out, depth);
    i = 0;
    for (const rt_doc_t *c = d->first->first; c; c = c->next, i++)
        rt_buf_printf(out, "%-*s%s", c->next ? (int)width[i] : 0, c->key, c->next ? "  " : "\n");
    for (const rt_doc_t *row = d->first; row; row = row->next) {
        indent(out, depth);
        i = 0;
        for (const rt_doc_t *c = row->first; c && i < ncols; c = c->next, i++) {
            size_t start = out->len;
            line_value(c, out);
            if (c->next && i + 1 < ncols)
                rt_buf_printf(out, "%*s  ", (int)(width[i] - (out->len - start)), "");
        }
        rt_buf_printf(out, "\n");
    }
    return true;
}

static void text(const rt_doc_t *d, rt_buf_t *out, int depth)
{
    if (is_line(d)) {
        indent(out, depth);
        line_value(d, out);
        rt_buf_printf(out, "\n");
        return;
    }
    if (d->kind == D_ARRAY) {
        if (table(d, out, depth))
            return;
        for (const rt_doc_t *c = d->first; c; c = c->next) {
            text(c, out, depth);
            if (c->next)
                rt_buf_printf(out, "\n");
        }
        return;
    }
    size_t keyw = 0;
    for (const rt_doc_t *c = d->first; c; c = c->next)
        if (is_line(c) && strlen(c->key) > keyw)
            keyw = strlen(c->key);
    for (const rt_doc_t *c = d->first; c; c = c->next) {
        indent(out, depth);
        if (is_line(c)) {
            rt_buf_printf(out, "%-*s  ", (int)keyw, c->key);
            line_value(c, out);
            rt_buf_printf(out, "\n");
        } else {
            rt_buf_printf(out, "%s:\n", c->key);
            text(c, out, depth + 2);
        }
    }
}

int rt_doc_render_text(const rt_doc_t *d, rt_buf_t *out)
{
    if (!d || d->root->oom)
        return RT_ENOMEM;
    if (d->kind == D_ARRAY && !d->first)
        rt_buf_printf(out, "(none)\n");
    else
        text(d, out, 0);
    return out->oom ? RT_ENOMEM : 0;
}

/*
** Growable arrays and byte buffers (rt.h): one doubling policy instead of one per module.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* The capacity rt_grow and rt_grow_on double to; 0 when need * elem does not fit. */
static size_t grown_cap(size_t cap, size_t need, size_t elem, size_t min)
{
    size_t ncap = cap > min ? cap : min;
    if (!ncap)
        ncap = 1;
    while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    return ncap > SIZE_MAX / elem ? 0 : ncap;
}

int rt_grow(void *arr, size_t *cap, size_t need, size_t elem, size_t min)
{
    if (need <= *cap)
        return 0;
    size_t ncap = grown_cap(*cap, need, elem, min);
    void **p = arr;
    void *n = ncap ? realloc(*p, ncap * elem) : NULL;
    if (!n)
        return RT_ENOMEM;
    *p = n;
    *cap = ncap;
    return 0;
}

int rt_grow_on(rt_actor_t *self, void *arr, size_t *cap, size_t need, size_t elem, size_t min,
               rt_obj_kind_t kind)
{
    if (need <= *cap)
        return 0;
    size_t ncap = grown_cap(*cap, need, elem, min);
    void **p = arr;
    void *n = ncap ? rt_realloc(self, *p, ncap * elem, kind) : NULL;
    if (!n)
        return RT_ENOMEM;
    *p = n;
    *cap = ncap;
    return 0;
}

void rt_buf_free(rt_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void rt_buf_truncate(rt_buf_t *b, size_t len)
{
    RT_ASSERT(len <= b->len);
    b->len = len;
    b->oom = false;
    if (b->data)
        b->data[len] = 0;
}

bool rt_buf_reserve(rt_buf_t *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void rt_buf_add(rt_buf_t *b, const void *p, size_t n)
{
    if (!rt_buf_reserve(b, n))
        return;
    if (n) /* an empty buffer's data (NULL) may be what is added */
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void rt_buf_put_uint(rt_buf_t *b, uint64_t v, int bytes)
{
    RT_ASSERT(bytes >= 1 && bytes <= 8);
    uint8_t out[8];
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
    rt_buf_add(b, out, (size_t)bytes);
}

void rt_buf_put_bytes(rt_buf_t *b, const void *p, size_t n)
{
    RT_ASSERT(n <= UINT32_MAX);
    rt_buf_put_uint(b, n, 4);
    rt_buf_add(b, p, n);
}

const uint8_t *rt_reader_bytes(rt_reader_t *r, size_t *n, size_t max)
{
    *n = (size_t)rt_reader_uint(r, 4);
    if (*n > max)
        r->bad = true;
    return rt_reader_take(r, *n);
}

const uint8_t *rt_reader_take(rt_reader_t *r, size_t n)
{
    if (r->bad || n > r->len - r->at) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->at;
    r->at += n;
    return p;
}

uint64_t rt_reader_uint(rt_reader_t *r, int bytes)
{
    RT_ASSERT(bytes >= 1 && bytes <= 8);
    const uint8_t *p = rt_reader_take(r, (size_t)bytes);
    uint64_t v = 0;
    for (int i = 0; p && i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

void rt_buf_printf(rt_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        rt_buf_add(b, small, (size_t)n);
        return;
    }
    if (!rt_buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

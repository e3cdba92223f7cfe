/* MQTT topics and filters as NATS subjects: subject.h. */
#include <stdbool.h>
#include <string.h>

#include "subject.h"

static const char hex[] = "0123456789ABCDEF";

static int needs_escape(unsigned char c)
{
    return c <= ' ' || c == 0x7f || c == '.' || c == '*' || c == '>' || c == '%';
}

/* Appends the token of one level; the new length, or -1 past cap. */
static int put_level(char *out, size_t at, size_t cap, const char *lv, size_t n)
{
    if (n == 0) {
        if (at + 1 > cap)
            return -1;
        out[at++] = '%';
        return (int)at;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)lv[i];
        if (needs_escape(c)) {
            if (at + 3 > cap)
                return -1;
            out[at++] = '%';
            out[at++] = hex[c >> 4];
            out[at++] = hex[c & 15];
        } else {
            if (at + 1 > cap)
                return -1;
            out[at++] = (char)c;
        }
    }
    return (int)at;
}

/* Writes prefix, then each level of s as a token (wildcards mapped when is_filter). */
static int map_levels(const char *prefix, const char *s, size_t len, int is_filter, char *out,
                      size_t cap)
{
    size_t plen = strlen(prefix);
    if (cap < 1 || plen >= cap)
        return -1;
    cap--; /* room for the NUL */
    memcpy(out, prefix, plen);
    size_t at = plen;
    const char *p = s, *end = s + len;
    for (;;) {
        const char *q = memchr(p, '/', (size_t)(end - p));
        size_t n = (size_t)((q ? q : end) - p);
        if (at + 1 > cap)
            return -1;
        out[at++] = '.';
        int r;
        if (is_filter && n == 1 && (*p == '+' || *p == '#')) {
            if (at + 1 > cap)
                return -1;
            out[at++] = *p == '+' ? '*' : '>';
            r = (int)at;
        } else {
            r = put_level(out, at, cap, p, n);
        }
        if (r < 0)
            return -1;
        at = (size_t)r;
        if (!q)
            break;
        p = q + 1;
    }
    out[at] = 0;
    return (int)at;
}

int rt_subject_of_topic(const char *prefix, const char *topic, size_t len, char *out, size_t cap)
{
    return map_levels(prefix, topic, len, 0, out, cap);
}

int rt_subjects_of_filter(const char *prefix, const char *filter, size_t len,
                          char out[2][RT_SUBJECT_MAX + 1])
{
    if (map_levels(prefix, filter, len, 1, out[0], RT_SUBJECT_MAX + 1) < 0)
        return -1;
    /* "a/#" also matches "a"; a lone "#" has no parent level (every topic has one). */
    if (len >= 2 && filter[len - 1] == '#' && filter[len - 2] == '/') {
        if (map_levels(prefix, filter, len - 2, 1, out[1], RT_SUBJECT_MAX + 1) < 0)
            return -1;
        return 2;
    }
    return 1;
}

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int rt_topic_of_subject(const char *prefix, const char *subject, size_t len, char *out, size_t cap)
{
    size_t plen = strlen(prefix);
    if (len <= plen + 1 || memcmp(subject, prefix, plen) != 0 || subject[plen] != '.')
        return -1;
    const char *p = subject + plen + 1, *end = subject + len;
    size_t at = 0;
    for (;;) {
        const char *q = memchr(p, '.', (size_t)(end - p));
        const char *tend = q ? q : end;
        if (tend == p)
            return -1; /* NATS has no empty token; rtd never sends one */
        if (!(tend - p == 1 && *p == '%')) {
            for (const char *c = p; c < tend; c++) {
                int b = (unsigned char)*c;
                if (b == '%') {
                    int hi = c + 2 < tend ? unhex(c[1]) : -1;
                    int lo = hi >= 0 ? unhex(c[2]) : -1;
                    if (lo < 0 || !needs_escape((unsigned char)(hi << 4 | lo)))
                        return -1;
                    b = hi << 4 | lo;
                    c += 2;
                } else if (needs_escape((unsigned char)b)) {
                    return -1;
                }
                if (at >= cap)
                    return -1;
                out[at++] = (char)b;
            }
        }
        if (!q)
            break;
        if (at >= cap)
            return -1;
        out[at++] = '/';
        p = q + 1;
    }
    return (int)at;
}

int rt_kv_key_of_topic(const char *topic, size_t len, char *out, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)topic[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_' || c == '/';
        if (at + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[at++] = (char)c;
        } else {
            out[at++] = '=';
            out[at++] = hex[c >> 4];
            out[at++] = hex[c & 15];
        }
    }
    out[at] = 0;
    return (int)at;
}

int rt_topic_of_kv_key(const char *key, size_t len, char *out, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)key[i];
        if (c == '=') {
            int hi = i + 2 < len ? unhex(key[i + 1]) : -1, lo = hi >= 0 ? unhex(key[i + 2]) : -1;
            if (lo < 0)
                return -1;
            c = hi << 4 | lo;
            i += 2;
        }
        if (at >= cap)
            return -1;
        out[at++] = (char)c;
    }
    return (int)at;
}

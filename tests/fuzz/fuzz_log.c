/*
** The log's lines (actors/base/log.c) with any bytes for values.
**
** The input is cut at its first two NUL bytes into three values, each copied to a buffer of
** its own exact size (not NUL-terminated: the log must read no further than the precision it
** is given). Each is logged as a field and as message words, in logfmt and in JSON, and each
** line must be one line of its format: logfmt pairs (key=bare or key="JSON string"), or one
** flat JSON object, its strings well-formed UTF-8 with JSON's escapes only.
*/
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "log.h"

static int fd = -1;
static char path[64];

/* A JSON string from its opening quote at *p; moves *p past the closing one. */
static bool string(const unsigned char **p, const unsigned char *end)
{
    const unsigned char *s = *p + 1;
    while (s < end && *s != '"') {
        if (*s < 0x20)
            return false;
        if (*s == '\\') {
            if (++s == end)
                return false;
            if (*s == 'u') {
                if (end - s < 5)
                    return false;
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdef", s[i]) || !s[i])
                        return false;
                s += 5;
            } else if (strchr("\"\\/bfnrt", *s) && *s) {
                s++;
            } else {
                return false;
            }
            continue;
        }
        size_t l = rt_utf8_len(s, (size_t)(end - s));
        if (!l)
            return false;
        s += l;
    }
    if (s == end)
        return false;
    *p = s + 1;
    return true;
}

static bool key(const unsigned char **p, const unsigned char *end)
{
    const unsigned char *s = *p;
    if (s == end || *s < 'a' || *s > 'z')
        return false;
    while (s < end && ((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' ||
                       *s == '.'))
        s++;
    *p = s;
    return true;
}

static bool logfmt_line(const unsigned char *s, const unsigned char *end)
{
    for (bool first = true; s < end; first = false) {
        if (!first && *s++ != ' ')
            return false;
        if (!key(&s, end) || s == end || *s++ != '=')
            return false;
        if (s < end && *s == '"') {
            if (!string(&s, end))
                return false;
            continue;
        }
        const unsigned char *v = s;
        while (s < end && *s > ' ' && *s != '=' && *s != '"' && *s != '\\' && *s != 0x7f) {
            size_t l = rt_utf8_len(s, (size_t)(end - s));
            if (!l)
                return false;
            s += l;
        }
        if (s == v)
            return false;
    }
    return true;
}

static bool json_line(const unsigned char *s, const unsigned char *end)
{
    if (s == end || *s++ != '{')
        return false;
    for (bool first = true;; first = false) {
        if (s < end && *s == '}')
            return !first && s + 1 == end;
        if (!first && (s == end || *s++ != ','))
            return false;
        const unsigned char *k = s + 1;
        if (s == end || *s != '"' || !string(&s, end) || !key(&k, s) || k != s - 1)
            return false; /* a key is a bare key's characters, quoted */
        if (s == end || *s++ != ':')
            return false;
        if (s < end && *s == '"') {
            if (!string(&s, end))
                return false;
        } else {
            const unsigned char *v = s;
            while (s < end && strchr("-+.0123456789eEtrue", *s) && *s)
                s++;
            if (s == v)
                return false;
        }
    }
}

/* The line the log wrote (it must be one, and whole) checked in its format. */
static void check(bool json)
{
    static unsigned char buf[RT_LOG_LINE_MAX + 1];
    ssize_t n = pread(fd, buf, sizeof(buf), 0);
    if (n < 2 || n > RT_LOG_LINE_MAX || buf[n - 1] != '\n' || memchr(buf, '\n', (size_t)n - 1))
        abort();
    if (!(json ? json_line(buf, buf + n - 1) : logfmt_line(buf, buf + n - 1)))
        abort();
    if (ftruncate(fd, 0) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) {
        fd = memfd_create("fuzz_log", 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    char *part[3] = {0};
    size_t len[3] = {0};
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        const uint8_t *nul = i < 2 ? memchr(data + at, 0, size - at) : NULL;
        len[i] = nul ? (size_t)(nul - (data + at)) : size - at;
        part[i] = malloc(len[i] ? len[i] : 1);
        memcpy(part[i], data + at, len[i]);
        at += len[i] + (nul ? 1 : 0);
    }
    for (int json = 0; json < 2; json++) {
        if (rt_log_open(path, RT_LOG_DEBUG, json) != 0)
            abort();
        rt_log(RT_LOG_INFO, "fuzz.value", "client=%.*s topic=%.*s n=%zu %.*s", (int)len[0],
               part[0], (int)len[1], part[1], len[2], (int)len[2], part[2]);
        check(json);
        rt_log(RT_LOG_ERROR, "fuzz.words", "%.*s peer=%.*s:%d", (int)len[2], part[2],
               (int)len[0], part[0], (int)len[1]);
        check(json);
    }
    for (int i = 0; i < 3; i++)
        free(part[i]);
    return 0;
}

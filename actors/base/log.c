/*
** The log's one writer: formats each line (text or JSON, UTC timestamp with milliseconds)
** in a local buffer and writes it with a single write(2) (log.h).
*/
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "log.h"
#include "rt.h"

static atomic_int current_level = RT_LOG_INFO;
static atomic_int log_fd = STDERR_FILENO;
static atomic_bool as_json;

static const char *const level_names[] = {"error", "warning", "info", "debug"};

const char *rt_log_level_name(rt_log_level_t level)
{
    return (unsigned)level <= RT_LOG_DEBUG ? level_names[level] : "unknown";
}

int rt_log_parse_level(const char *name, rt_log_level_t *out)
{
    for (int i = 0; i <= RT_LOG_DEBUG; i++) {
        if (name && strcmp(name, level_names[i]) == 0) {
            *out = (rt_log_level_t)i;
            return 0;
        }
    }
    return RT_EINVAL;
}

int rt_log_open(const char *path, rt_log_level_t level, bool json)
{
    int fd = STDERR_FILENO;
    if (path) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0)
            return errno == ENOENT ? RT_ENOTFOUND : RT_EINVAL;
    }
    int old = atomic_exchange(&log_fd, fd);
    if (old != STDERR_FILENO)
        close(old);
    atomic_store(&as_json, json);
    rt_log_set_level(level);
    return 0;
}

void rt_log_close(void)
{
    int old = atomic_exchange(&log_fd, STDERR_FILENO);
    if (old != STDERR_FILENO)
        close(old);
}

void rt_log_set_level(rt_log_level_t level)
{
    atomic_store_explicit(&current_level, (int)level, memory_order_relaxed);
}

rt_log_level_t rt_log_get_level(void)
{
    return (rt_log_level_t)atomic_load_explicit(&current_level, memory_order_relaxed);
}

bool rt_log_enabled(rt_log_level_t level)
{
    return (int)level <= atomic_load_explicit(&current_level, memory_order_relaxed);
}

/* Appends s to the JSON string being built in buf, escaped per RFC 8259. */
static size_t json_escape(char *buf, size_t at, size_t cap, const char *s)
{
    for (; *s && at + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            buf[at++] = '\\';
            buf[at++] = (char)ch;
        } else if (ch < 0x20) {
            at += (size_t)snprintf(buf + at, cap - at, "\\u%04x", ch);
        } else {
            buf[at++] = (char)ch;
        }
    }
    return at;
}

void rt_log(rt_log_level_t level, const char *event, const char *fmt, ...)
{
    if (!rt_log_enabled(level))
        return;
    char msg[RT_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(msg))
        memcpy(msg + sizeof(msg) - 4, "...", 4);

    uint64_t now_ms = rt_wall_ms();
    time_t now_s = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&now_s, &tm);
    char ts[32];
    size_t tl = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + tl, sizeof(ts) - tl, ".%03dZ", (int)(now_ms % 1000));

    char line[RT_LOG_LINE_MAX + 256];
    size_t at;
    if (atomic_load_explicit(&as_json, memory_order_relaxed)) {
        at = (size_t)snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"",
                              ts, rt_log_level_name(level));
        at = json_escape(line, at, sizeof(line) - 16, event);
        at += (size_t)snprintf(line + at, sizeof(line) - at, "\",\"msg\":\"");
        at = json_escape(line, at, sizeof(line) - 8, msg);
        at += (size_t)snprintf(line + at, sizeof(line) - at, "\"}\n");
    } else {
        at = (size_t)snprintf(line, sizeof(line), "%s %s %s %s\n", ts, rt_log_level_name(level),
                              event, msg);
        if (at >= sizeof(line)) {
            at = sizeof(line) - 1;
            line[at - 1] = '\n';
        }
    }
    /* One write per line: O_APPEND makes concurrent lines land whole. */
    ssize_t w;
    do {
        w = write(atomic_load_explicit(&log_fd, memory_order_relaxed), line, at);
    } while (w < 0 && errno == EINTR);
}

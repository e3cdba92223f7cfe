/*
** The log's one writer: walks each call's format into fields (log.h), writes them as one
** logfmt or JSON line in a local buffer, and writes the line with a single write(2).
*/
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "log.h"
#include "rt.h"

static atomic_int current_level = RT_LOG_INFO;
/* The descriptor lines go to. A file's stays the same number for the log's life: a reopen
   dup2()s the new file onto it, so a writer never writes to a number closed under it. */
static atomic_int log_fd = STDERR_FILENO;
static atomic_bool as_json;
static atomic_bool priority_prefix;
static char log_path[4096]; /* the file's name for rt_log_reopen; "" for stderr */

static const char *const level_names[] = {"error", "warning", "info", "debug"};
static const char journal_priority[] = {'3', '4', '6', '7'}; /* syslog's err ... debug */

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

static int open_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == ENOENT ? RT_ENOTFOUND : errno == EACCES ? RT_EACCES : RT_EINVAL;
    return fd;
}

int rt_log_open(const char *path, rt_log_level_t level, bool json)
{
    if (path && strlen(path) >= sizeof(log_path))
        return RT_EINVAL;
    int fd = STDERR_FILENO;
    if (path && (fd = open_file(path)) < 0)
        return fd;
    int old = atomic_exchange(&log_fd, fd);
    if (old != STDERR_FILENO)
        close(old);
    snprintf(log_path, sizeof(log_path), "%s", path ? path : "");
    atomic_store(&as_json, json);
    rt_log_set_level(level);
    return 0;
}

void rt_log_close(void)
{
    int old = atomic_exchange(&log_fd, STDERR_FILENO);
    if (old != STDERR_FILENO)
        close(old);
    log_path[0] = 0;
}

int rt_log_reopen(void)
{
    int fd = atomic_load(&log_fd);
    if (fd == STDERR_FILENO || !log_path[0])
        return 0;
    int nfd = open_file(log_path);
    if (nfd < 0)
        return nfd;
    int rc = dup2(nfd, fd) < 0 ? RT_EINVAL : 0;
    close(nfd);
    return rc;
}

void rt_log_set_priority_prefix(bool on)
{
    atomic_store(&priority_prefix, on);
}

bool rt_log_stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) != 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
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

/* ---- Values ---- */

/* Whether logfmt must quote the value: empty, or a byte a bare value cannot hold. */
static bool needs_quotes(const char *s, size_t n)
{
    if (n == 0)
        return true;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= ' ' || ch == '=' || ch == '"' || ch == '\\' || ch == 0x7f)
            return true;
        size_t l = rt_utf8_len((const unsigned char *)s + i, n - i);
        if (!l)
            return true;
        i += l;
    }
    return false;
}

/* Whether s[0..n) is a JSON number (RFC 8259): what %d, %u and %f print, but not nan or
   inf, nor "+5" or " 5" (flags and widths). */
static bool json_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i == n || s[i] < '0' || s[i] > '9' ||
        (s[i] == '0' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9'))
        return false;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i < n && s[i] == '.') {
        if (++i == n || s[i] < '0' || s[i] > '9')
            return false;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i == n || s[i] < '0' || s[i] > '9')
            return false;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    return i == n;
}

/* ---- The line ---- */

#define TAIL_RESERVE 32 /* for ",\"truncated\":true}\n" or " truncated=true\n" */

typedef struct {
    char *p;
    size_t len, cap; /* cap: what fields may use; TAIL_RESERVE more bytes follow it */
    unsigned nfields;
    bool json;
    bool cut; /* a field did not fit: the fields after it are left out */
} line_t;

static void put(line_t *o, const char *s, size_t n)
{
    RT_ASSERT(o->len + n <= o->cap + TAIL_RESERVE);
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

/*
** Writes s[0..n) as the inside of a JSON string: '"', '\' and control characters escaped,
** bytes that are not UTF-8 as U+FFFD. Past the line's room it stops, writes "..." and
** marks the line cut.
*/
static void put_escaped(line_t *o, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n;) {
        if (o->len + 10 > o->cap) { /* the longest escape, "...", the closing quote */
            put(o, "...", 3);
            o->cut = true;
            return;
        }
        unsigned char ch = (unsigned char)s[i];
        size_t l = rt_utf8_len((const unsigned char *)s + i, n - i);
        if (!l) {
            put(o, "\\ufffd", 6);
            i++;
        } else if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            put(o, e, 2);
            i++;
        } else if (ch == '\n' || ch == '\t' || ch == '\r') {
            char e[2] = {'\\', ch == '\n' ? 'n' : ch == '\t' ? 't' : 'r'};
            put(o, e, 2);
            i++;
        } else if (ch < 0x20 || ch == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15]};
            put(o, e, 6);
            i++;
        } else {
            put(o, s + i, l);
            i += l;
        }
    }
}

/*
** One field: its key (literal text of the format, never escaped) and its value, quoted when
** it must be; numeric: a JSON number when it is one. A field that does not fit is left out
** and cuts the line there; only a quoted value can be cut short instead (ending "...").
*/
static void put_field(line_t *o, const char *key, size_t klen, const char *v, size_t vlen,
                      bool numeric)
{
    if (o->cut)
        return;
    size_t mark = o->len;
    if (o->len + klen + 16 > o->cap)
        goto cut;
    if (o->nfields++)
        put(o, o->json ? "," : " ", 1);
    if (o->json) {
        put(o, "\"", 1);
        put(o, key, klen);
        put(o, "\":", 2);
    } else {
        put(o, key, klen);
        put(o, "=", 1);
    }
    bool quoted = o->json ? !(numeric && json_number(v, vlen)) : needs_quotes(v, vlen);
    if (!quoted) {
        if (o->len + vlen > o->cap)
            goto cut;
        put(o, v, vlen);
        return;
    }
    put(o, "\"", 1);
    put_escaped(o, v, vlen);
    put(o, "\"", 1);
    return;
cut:
    o->len = mark;
    o->cut = true;
}

/* ---- The format ---- */

/* A value being expanded: at most RT_LOG_VALUE_MAX bytes, then "..." */
typedef struct {
    char p[RT_LOG_VALUE_MAX + 4];
    size_t len;
} value_t;

static void value_add(value_t *v, const char *s, size_t n)
{
    if (v->len > RT_LOG_VALUE_MAX)
        return; /* cut already */
    size_t room = RT_LOG_VALUE_MAX - v->len;
    if (n > room) {
        memcpy(v->p + v->len, s, room);
        memcpy(v->p + RT_LOG_VALUE_MAX, "...", 3);
        v->len = RT_LOG_VALUE_MAX + 3;
        return;
    }
    memcpy(v->p + v->len, s, n);
    v->len += n;
}

static bool value_full(const value_t *v)
{
    return v->len > RT_LOG_VALUE_MAX;
}

/* An integer argument of conversion conv (d i o u x X) and length modifier mod, widened. */
static void read_int(va_list *ap, char conv, const char *mod, intmax_t *s, uintmax_t *u)
{
    bool is_signed = conv == 'd' || conv == 'i';
    if (strcmp(mod, "hh") == 0 || strcmp(mod, "h") == 0 || !mod[0]) {
        int x = va_arg(*ap, int);
        *s = mod[0] != 'h' ? x : mod[1] == 'h' ? (signed char)x : (short)x;
        *u = mod[0] != 'h' ? (unsigned)x : mod[1] == 'h' ? (unsigned char)x : (unsigned short)x;
    } else if (strcmp(mod, "l") == 0) {
        long x = va_arg(*ap, long);
        *s = x;
        *u = (unsigned long)x;
    } else if (strcmp(mod, "ll") == 0 || strcmp(mod, "q") == 0) {
        long long x = va_arg(*ap, long long);
        *s = x;
        *u = (unsigned long long)x;
    } else if (strcmp(mod, "z") == 0 || strcmp(mod, "t") == 0) {
        _Static_assert(sizeof(size_t) == sizeof(ptrdiff_t), "z and t are one width");
        size_t x = va_arg(*ap, size_t);
        *s = (ptrdiff_t)x;
        *u = x;
    } else {
        uintmax_t x = va_arg(*ap, uintmax_t);
        *s = (intmax_t)x;
        *u = x;
    }
    if (!is_signed)
        *s = 0;
}

/*
** One conversion of the format at *pf (its '%'), taken from ap and printed into v; *pf
** moves past it. Returns whether it printed a number (d i u f e g and their kin). The
** compiler checked the format against the arguments (log.h's format attribute), so each
** conversion takes the type printf would; one it does not know (none of rtd's formats has
** one) sets *lost: the arguments after it cannot be found, and print as "?".
*/
static bool expand_conversion(const char **pf, va_list *ap, value_t *v, bool *lost)
{
    const char *f = *pf + 1;
    char spec[40] = "%";
    size_t sl = 1;
    while (*f && strchr("-+ #0'", *f) && sl < 8)
        spec[sl++] = *f++;
    bool star_w = false, star_p = false;
    if (*f == '*') {
        star_w = true;
        spec[sl++] = *f++;
    }
    while (*f >= '0' && *f <= '9' && sl < 16)
        spec[sl++] = *f++;
    if (*f == '.') {
        spec[sl++] = *f++;
        if (*f == '*') {
            star_p = true;
            spec[sl++] = *f++;
        }
        while (*f >= '0' && *f <= '9' && sl < 24)
            spec[sl++] = *f++;
    }
    char mod[3] = "";
    for (size_t m = 0; m < 2 && *f && strchr("hljztLq", *f); m++)
        mod[m] = *f++;
    char conv = *f ? *f++ : 0;
    *pf = f;
    if (conv == '%') {
        value_add(v, "%", 1);
        return false;
    }
    bool is_int = conv && strchr("diouxX", conv), is_float = conv && strchr("fFeEgGaA", conv);
    bool known = is_int || is_float || conv == 'c' || conv == 'p' || (conv == 's' && !mod[0]);
    if (*lost || !known) {
        RT_ASSERT(known);
        *lost = true;
        value_add(v, "?", 1);
        return false;
    }
    int w = star_w ? va_arg(*ap, int) : 0;
    int pr = star_p ? va_arg(*ap, int) : 0;
    /* Integers are printed as intmax_t and floats as long double: one call shape each. */
    if (is_int)
        spec[sl++] = 'j';
    else if (is_float)
        spec[sl++] = 'L';
    spec[sl++] = conv;
    spec[sl] = 0;
    char buf[RT_LOG_VALUE_MAX + 1];
    int n;
#define PRINT(x)                                                                                   \
    (star_w && star_p ? snprintf(buf, sizeof(buf), spec, w, pr, x)                                 \
     : star_w         ? snprintf(buf, sizeof(buf), spec, w, x)                                     \
     : star_p         ? snprintf(buf, sizeof(buf), spec, pr, x)                                    \
                      : snprintf(buf, sizeof(buf), spec, x))
    if (is_int) {
        intmax_t s;
        uintmax_t u;
        read_int(ap, conv, mod, &s, &u);
        n = conv == 'd' || conv == 'i' ? PRINT(s) : PRINT(u);
    } else if (is_float) {
        long double x = strcmp(mod, "L") == 0 ? va_arg(*ap, long double) : va_arg(*ap, double);
        n = PRINT(x);
    } else if (conv == 'c') {
        n = PRINT(va_arg(*ap, int));
    } else if (conv == 'p') {
        n = PRINT(va_arg(*ap, void *));
    } else {
        n = PRINT(va_arg(*ap, const char *));
    }
#undef PRINT
    if (n > 0)
        value_add(v, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    if (n >= (int)sizeof(buf))
        value_add(v, "...", 3);
    return (is_int && conv != 'o' && conv != 'x' && conv != 'X') || is_float;
}

/* The key a format word starts with ("client=..." gives 6), or 0 when it is a message word. */
static size_t word_key(const char *w)
{
    static const char *const reserved[] = {"ts", "level", "event", "msg", "truncated"};
    if (*w < 'a' || *w > 'z')
        return 0;
    size_t n = 1;
    while ((w[n] >= 'a' && w[n] <= 'z') || (w[n] >= '0' && w[n] <= '9') || w[n] == '_' ||
           w[n] == '.')
        n++;
    if (w[n] != '=')
        return 0;
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (strlen(reserved[i]) == n && memcmp(reserved[i], w, n) == 0)
            return 0;
    return n;
}

/*
** Expands the format word at *pf (up to its next literal space) into v; *pf moves to that
** space or the end. Returns whether the word was one numeric conversion alone.
*/
static bool expand_word(const char **pf, va_list *ap, value_t *v, bool *lost)
{
    const char *f = *pf;
    bool numeric = false;
    int parts = 0;
    while (*f && *f != ' ') {
        parts++;
        if (*f == '%' && f[1] != '%') {
            numeric = expand_conversion(&f, ap, v, lost);
        } else {
            const char *lit = f;
            if (*f == '%')
                f++; /* "%%" is one literal '%' */
            f++;
            while (*f && *f != ' ' && *f != '%')
                f++;
            value_add(v, *lit == '%' ? "%" : lit, *lit == '%' ? 1 : (size_t)(f - lit));
            numeric = false;
        }
    }
    *pf = f;
    return numeric && parts == 1 && !value_full(v);
}

static size_t timestamp(char *ts, size_t cap)
{
    uint64_t now_ms = rt_wall_ms();
    time_t now_s = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&now_s, &tm);
    size_t tl = strftime(ts, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    return tl + (size_t)snprintf(ts + tl, cap - tl, ".%03dZ", (int)(now_ms % 1000));
}

void rt_logv(rt_log_level_t level, const char *event, const char *key, const char *value,
             const char *fmt, va_list ap)
{
    if (!rt_log_enabled(level))
        return;
    char buf[RT_LOG_LINE_MAX];
    line_t o = {.p = buf,
                .cap = sizeof(buf) - TAIL_RESERVE,
                .json = atomic_load_explicit(&as_json, memory_order_relaxed)};
    bool to_stderr = atomic_load_explicit(&log_fd, memory_order_relaxed) == STDERR_FILENO;
    if (to_stderr && atomic_load_explicit(&priority_prefix, memory_order_relaxed)) {
        char pri[3] = {'<', journal_priority[level <= RT_LOG_DEBUG ? level : RT_LOG_DEBUG], '>'};
        put(&o, pri, 3);
    }
    if (o.json)
        put(&o, "{", 1);
    char ts[32];
    put_field(&o, "ts", 2, ts, timestamp(ts, sizeof(ts)), false);
    const char *lname = rt_log_level_name(level);
    put_field(&o, "level", 5, lname, strlen(lname), false);
    put_field(&o, "event", 5, event, strlen(event), false);
    if (key)
        put_field(&o, key, strlen(key), value, strlen(value), false);

    /* Per thread, not on the stack: a line takes 6 KiB with them, and rt_log runs on
       actors' stacks. */
    static _Thread_local value_t v, msg;
    msg.len = 0;
    bool lost = false;
    va_list args;
    va_copy(args, ap);
    for (const char *f = fmt; *f;) {
        if (*f == ' ') {
            f++;
            continue;
        }
        size_t klen = word_key(f);
        const char *k = f;
        v.len = 0;
        f += klen ? klen + 1 : 0;
        bool numeric = expand_word(&f, &args, &v, &lost);
        if (klen) {
            put_field(&o, k, klen, v.p, v.len, numeric);
        } else if (v.len) {
            if (msg.len)
                value_add(&msg, " ", 1);
            value_add(&msg, v.p, v.len);
        }
    }
    va_end(args);
    if (msg.len)
        put_field(&o, "msg", 3, msg.p, msg.len, false);
    if (o.cut)
        put(&o, o.json ? ",\"truncated\":true" : " truncated=true", o.json ? 17 : 15);
    put(&o, o.json ? "}\n" : "\n", o.json ? 2 : 1);

    /* One write per line: O_APPEND makes concurrent lines land whole. */
    ssize_t w;
    do {
        w = write(atomic_load_explicit(&log_fd, memory_order_relaxed), buf, o.len);
    } while (w < 0 && errno == EINTR);
}

void rt_log_emit(rt_log_level_t level, const char *event, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_logv(level, event, NULL, NULL, fmt, ap);
    va_end(ap);
}

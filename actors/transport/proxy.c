/*
** The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2) and the address
** lists that say which peers may send it or appear in X-Forwarded-For.
*/
#include <arpa/inet.h>
#include <string.h>

#include "common.h"
#include "proxy.h"

/* ---- Version 1: "PROXY TCP4 1.2.3.4 5.6.7.8 1111 2222\r\n" ---- */

#define V1_ADDR4_MAX 15 /* "255.255.255.255" */
#define V1_ADDR6_MAX 45 /* INET6_ADDRSTRLEN - 1 */
#define V1_PORT_MAX 5   /* "65535" */

/*
** The line is read field by field. When the line has not ended yet (complete is false), its
** last field may be cut short: it is checked as the start of a valid field, and the parse
** stops there with RT_EAGAIN.
*/
typedef struct v1_line_s {
    const char *p;
    size_t n;      /* the line without its CRLF, or what has come of it */
    size_t pos;    /* where the next field starts */
    bool complete; /* the CRLF has come */
} v1_line_t;

typedef struct v1_field_s {
    const char *p;
    size_t n;
    bool last;    /* the line ends after it */
    bool partial; /* the last field of an incomplete line: more of it may follow */
} v1_field_t;

/* Fields are separated by exactly one space: an empty field is an error, unless partial. */
static v1_field_t v1_next(v1_line_t *line)
{
    v1_field_t f = {.p = line->p + line->pos};
    const char *space = memchr(f.p, ' ', line->n - line->pos);
    f.n = space ? (size_t)(space - f.p) : line->n - line->pos;
    f.last = space == NULL;
    f.partial = f.last && !line->complete;
    line->pos += f.n + (space != NULL);
    return f;
}

static bool v1_is(const v1_field_t *f, const char *word)
{
    size_t n = strlen(word);
    if (f->partial)
        return f->n <= n && memcmp(f->p, word, f->n) == 0;
    return f->n == n && memcmp(f->p, word, n) == 0;
}

static bool all_of(const char *p, size_t n, const char *set)
{
    for (size_t i = 0; i < n; i++)
        if (!p[i] || !strchr(set, p[i]))
            return false;
    return true;
}

/*
** An address in the family's text form. glibc's inet_pton refuses leading zeros in IPv4
** (the spec forbids them too, lest they read as octal).
*/
static bool v1_addr(const v1_field_t *f, bool v6, rt_auth_addr_t *out)
{
    size_t max = v6 ? V1_ADDR6_MAX : V1_ADDR4_MAX;
    const char *set = v6 ? "0123456789abcdefABCDEF:." : "0123456789.";
    if (f->n > max || !all_of(f->p, f->n, set))
        return false;
    if (f->partial)
        return true;
    char text[V1_ADDR6_MAX + 1];
    memcpy(text, f->p, f->n);
    text[f->n] = '\0';
    uint8_t v4[4];
    memset(out, 0, sizeof *out);
    if (v6)
        return inet_pton(AF_INET6, text, out->b) == 1;
    if (inet_pton(AF_INET, text, v4) != 1)
        return false;
    out->b[10] = out->b[11] = 0xff;
    memcpy(out->b + 12, v4, 4);
    return true;
}

/* A port in decimal, 0..65535, without leading zeros. */
static bool v1_port(const v1_field_t *f, uint16_t *port)
{
    if (f->n > V1_PORT_MAX || !all_of(f->p, f->n, "0123456789"))
        return false;
    if (f->n > 1 && f->p[0] == '0')
        return false;
    unsigned v = 0;
    for (size_t i = 0; i < f->n; i++)
        v = v * 10 + (unsigned)(f->p[i] - '0');
    if (v > 65535)
        return false;
    *port = (uint16_t)v;
    return f->partial || f->n > 0;
}

static int refuse(const char *reason, const char **why)
{
    *why = reason;
    return RT_EPROTO;
}

/* Parses a v1 line's fields: 0 when they are valid, RT_EAGAIN when they could still be. */
static int v1_fields(v1_line_t *line, rt_proxy_info_t *out, const char **why)
{
    v1_field_t f = v1_next(line);
    if (!v1_is(&f, "PROXY"))
        return refuse("no PROXY signature", why);
    if (f.partial)
        return RT_EAGAIN;
    if (f.last)
        return refuse("v1: no protocol", why);

    f = v1_next(line);
    bool tcp4 = v1_is(&f, "TCP4"), tcp6 = v1_is(&f, "TCP6"), unknown = v1_is(&f, "UNKNOWN");
    if (!tcp4 && !tcp6 && !unknown)
        return refuse("v1: protocol not TCP4, TCP6 or UNKNOWN", why);
    if (f.partial)
        return RT_EAGAIN;
    /* UNKNOWN's addresses, if any, are ignored (the spec: anything up to the CRLF). */
    if (unknown) {
        out->has_addr = false;
        return line->complete ? 0 : RT_EAGAIN;
    }

    rt_auth_addr_t dst;
    uint16_t dst_port;
    for (int i = 0; i < 4; i++) {
        if (f.last)
            return refuse("v1: too few fields", why);
        f = v1_next(line);
        bool ok = i == 0   ? v1_addr(&f, tcp6, &out->src)
                  : i == 1 ? v1_addr(&f, tcp6, &dst)
                  : i == 2 ? v1_port(&f, &out->src_port)
                           : v1_port(&f, &dst_port);
        if (!ok)
            return refuse(i < 2 ? "v1: bad address" : "v1: bad port", why);
        if (f.partial)
            return RT_EAGAIN;
    }
    if (!f.last)
        return refuse("v1: too many fields", why);
    out->has_addr = true;
    return 0;
}

static int parse_v1(const uint8_t *buf, size_t len, size_t *used, rt_proxy_info_t *out,
                    const char **why)
{
    /* The CR must come early enough for the LF after it to fit in RT_PROXY_V1_MAX bytes. */
    size_t scan = len < RT_PROXY_V1_MAX - 1 ? len : RT_PROXY_V1_MAX - 1;
    const uint8_t *cr = memchr(buf, '\r', scan);
    v1_line_t line = {.p = (const char *)buf, .n = cr ? (size_t)(cr - buf) : len};
    if (cr && line.n + 1 < len) {
        if (cr[1] != '\n')
            return refuse("v1: CR without LF", why);
        line.complete = true;
    }
    if (!cr && len >= RT_PROXY_V1_MAX - 1)
        return refuse("v1: line too long", why);
    int rc = v1_fields(&line, out, why);
    if (rc == 0)
        *used = line.n + 2;
    return rc;
}

/* ---- Version 2: a 16-byte binary header, then addresses and TLVs ---- */

static const uint8_t v2_sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                   0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

#define V2_HEADER 16
#define V2_CMD_LOCAL 0x0
#define V2_CMD_PROXY 0x1
/* The family and transport byte's valid values (2.2: all others are refused). */
#define V2_UNSPEC 0x00
#define V2_TCP4 0x11
#define V2_UDP4 0x12
#define V2_TCP6 0x21
#define V2_UDP6 0x22
#define V2_UNIX_STREAM 0x31
#define V2_UNIX_DGRAM 0x32

/* The length of the addresses each family needs, or -1 for a byte the spec does not define. */
static int v2_addr_len(uint8_t family)
{
    switch (family) {
    case V2_UNSPEC:
        return 0;
    case V2_TCP4:
    case V2_UDP4:
        return 12;
    case V2_TCP6:
    case V2_UDP6:
        return 36;
    case V2_UNIX_STREAM:
    case V2_UNIX_DGRAM:
        return 216;
    default:
        return -1;
    }
}

static int parse_v2(const uint8_t *buf, size_t len, size_t *used, rt_proxy_info_t *out,
                    const char **why)
{
    size_t sig_len = len < sizeof v2_sig ? len : sizeof v2_sig;
    if (memcmp(buf, v2_sig, sig_len) != 0)
        return refuse("no PROXY signature", why);
    if (len < 13)
        return RT_EAGAIN;
    if (buf[12] >> 4 != 2)
        return refuse("v2: unknown version", why);
    int command = buf[12] & 0x0F;
    if (command != V2_CMD_LOCAL && command != V2_CMD_PROXY)
        return refuse("v2: unknown command", why);
    if (len < 14)
        return RT_EAGAIN;
    /* LOCAL (a health check from the proxy itself) ignores the family (2.2). */
    int addr_len = command == V2_CMD_PROXY ? v2_addr_len(buf[13]) : 0;
    if (addr_len < 0)
        return refuse("v2: unknown address family", why);
    if (len < V2_HEADER)
        return RT_EAGAIN;
    size_t total = V2_HEADER + ((size_t)buf[14] << 8 | buf[15]);
    if (total > RT_PROXY_MAX)
        return refuse("v2: header too long", why);
    if (total - V2_HEADER < (size_t)addr_len)
        return refuse("v2: addresses do not fit the length", why);
    if (len < total)
        return RT_EAGAIN;

    const uint8_t *a = buf + V2_HEADER;
    out->has_addr = command == V2_CMD_PROXY && (buf[13] == V2_TCP4 || buf[13] == V2_TCP6);
    if (out->has_addr && buf[13] == V2_TCP4) {
        memset(&out->src, 0, sizeof out->src);
        out->src.b[10] = out->src.b[11] = 0xff;
        memcpy(out->src.b + 12, a, 4);
        out->src_port = (uint16_t)(a[8] << 8 | a[9]);
    } else if (out->has_addr) {
        memcpy(out->src.b, a, 16);
        out->src_port = (uint16_t)(a[32] << 8 | a[33]);
    }
    *used = total;
    return 0;
}

int rt_proxy_parse(const uint8_t *buf, size_t len, size_t *used, rt_proxy_info_t *out,
                   const char **why)
{
    memset(out, 0, sizeof *out);
    *used = 0;
    *why = "";
    if (len == 0)
        return RT_EAGAIN;
    if (buf[0] == v2_sig[0])
        return parse_v2(buf, len, used, out, why);
    return parse_v1(buf, len, used, out, why);
}

/* ---- X-Forwarded-For ---- */

/*
** One X-Forwarded-For entry: an address, possibly with a port as some proxies write it
** ("192.0.2.1:4711", "[2001:db8::1]:4711", "[2001:db8::1]").
*/
static bool forwarded_entry(const char *p, size_t n, rt_auth_addr_t *out)
{
    char text[V1_ADDR6_MAX + 1];
    if (n > 0 && p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (!close)
            return false;
        size_t after = n - (size_t)(close + 1 - p);
        if (after && (close[1] != ':' || after == 1 || !all_of(close + 2, after - 1, "0123456789")))
            return false;
        p++;
        n = (size_t)(close - p);
        if (!memchr(p, ':', n))
            return false;
    } else {
        const char *colon = memchr(p, ':', n);
        if (colon && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - p))) {
            size_t port_len = n - (size_t)(colon + 1 - p);
            if (port_len == 0 || !all_of(colon + 1, port_len, "0123456789"))
                return false;
            n = (size_t)(colon - p);
        }
    }
    if (n == 0 || n > V1_ADDR6_MAX)
        return false;
    memcpy(text, p, n);
    text[n] = '\0';
    return rt_auth_addr_parse(text, out) == 0;
}

bool rt_forwarded_client(const char *xff, const rt_conf_net_t *trusted, unsigned n,
                         rt_auth_addr_t *out)
{
    size_t end = strlen(xff);
    for (;;) {
        size_t start = end;
        while (start > 0 && xff[start - 1] != ',')
            start--;
        const char *p = xff + start;
        size_t len = end - start;
        while (len && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        rt_auth_addr_t a;
        if (!forwarded_entry(p, len, &a))
            return false;
        if (!rt_conf_net_match(trusted, n, a.b)) {
            *out = a;
            return true;
        }
        if (start == 0)
            return false;
        end = start - 1;
    }
}

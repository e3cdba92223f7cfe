/*
** HTTP/1.1 requests for the HTTP listener, read with libhttp-parser (http_request.h).
*/
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>

#include "common.h"
#include "http_request.h"

typedef enum { HDR_OTHER, HDR_AUTHORIZATION, HDR_API_KEY, HDR_CONTENT_TYPE } header_t;

typedef struct parse_s {
    rt_http_request_t *out;
    size_t target_len;
    char name[32]; /* the current header's name so far (longer ones are none of ours) */
    size_t name_len;
    header_t header;
    bool in_value;
    unsigned headers;
    int refuse; /* an HTTP status decided inside a callback */
    const char *why;
    bool done;
    bool head_done;
    bool head_only; /* rt_http_parse_head: done at the head, the body the caller's */
    size_t body_max;
    const char *body;
    size_t body_len;
} parse_t;

static int on_url(http_parser *p, const char *at, size_t n)
{
    parse_t *r = p->data;
    if (r->target_len + n >= sizeof(r->out->target)) {
        r->refuse = 414;
        r->why = "request target too long";
        return 1;
    }
    memcpy(r->out->target + r->target_len, at, n);
    r->target_len += n;
    r->out->target[r->target_len] = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    parse_t *r = p->data;
    if (r->in_value || r->headers == 0) {
        if (++r->headers > RT_HTTP_HEADERS_MAX) {
            r->refuse = 431;
            r->why = "too many header lines";
            return 1;
        }
        r->name_len = 0;
        r->in_value = false;
    }
    if (r->name_len + n < sizeof(r->name))
        memcpy(r->name + r->name_len, at, n);
    r->name_len += n;
    return 0;
}

static void append_value(char *dst, size_t cap, const char *at, size_t n)
{
    size_t have = strlen(dst);
    if (have + n < cap) {
        memcpy(dst + have, at, n);
        dst[have + n] = 0;
    }
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    parse_t *r = p->data;
    if (!r->in_value) {
        r->in_value = true;
        r->header = HDR_OTHER;
        if (r->name_len < sizeof(r->name)) {
            r->name[r->name_len] = 0;
            if (strcasecmp(r->name, "Authorization") == 0)
                r->header = HDR_AUTHORIZATION;
            else if (strcasecmp(r->name, "X-API-Key") == 0)
                r->header = HDR_API_KEY;
            else if (strcasecmp(r->name, "Content-Type") == 0)
                r->header = HDR_CONTENT_TYPE;
        }
    }
    char *key = r->out->api_key;
    if (r->header == HDR_CONTENT_TYPE) {
        append_value(r->out->content_type, sizeof(r->out->content_type), at, n);
    } else if (r->header == HDR_API_KEY) {
        append_value(key, sizeof(r->out->api_key), at, n);
    } else if (r->header == HDR_AUTHORIZATION) {
        static const char bearer[] = "Bearer ";
        if (!key[0] && n > sizeof(bearer) - 1 && strncasecmp(at, bearer, sizeof(bearer) - 1) == 0)
            append_value(key, sizeof(r->out->api_key), at + sizeof(bearer) - 1,
                         n - (sizeof(bearer) - 1));
    }
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    parse_t *r = p->data;
    r->head_done = true;
    if (p->flags & F_CHUNKED) {
        r->refuse = r->head_only ? 411 : 400;
        r->why = "chunked bodies are not taken (send Content-Length)";
        return 1;
    }
    if (r->head_only) {
        r->out->content_length = p->content_length;
        r->done = true;
        http_parser_pause(p, 1);
        return 0;
    }
    /* Refused at its head: a body past the bound is never read into memory. */
    if (p->content_length != (uint64_t)-1 && p->content_length > r->body_max) {
        r->refuse = 413;
        r->why = "request body too large";
        return 1;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    parse_t *r = p->data;
    if (!r->body)
        r->body = at;
    r->body_len += n;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    parse_t *r = p->data;
    r->done = true;
    http_parser_pause(p, 1); /* one request at a time: a pipelined next one waits */
    return 0;
}

/* Parses the request (or, head_only, its head) at the start of buf, as the two calls say. */
static int parse(const uint8_t *buf, size_t len, size_t body_max, bool head_only,
                 rt_http_request_t *out, const char **why)
{
    static const http_parser_settings settings = {
        .on_url = on_url,
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_headers_complete = on_headers_complete,
        .on_body = on_body,
        .on_message_complete = on_message_complete,
    };
    memset(out, 0, sizeof(*out));
    parse_t r = {.out = out, .body_max = body_max, .head_only = head_only};
    http_parser p;
    http_parser_init(&p, HTTP_REQUEST);
    p.data = &r;
    size_t used = http_parser_execute(&p, &settings, (const char *)buf, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&p);
    if (r.refuse) {
        *why = r.why;
        return r.refuse;
    }
    if (e != HPE_OK && e != HPE_PAUSED) {
        *why = http_errno_description(e);
        return e == HPE_INVALID_VERSION ? 505 : 400;
    }
    if (!r.done) {
        if (!r.head_done && len > RT_HTTP_HEAD_MAX) {
            *why = "request head too long";
            return 431;
        }
        return RT_EAGAIN; /* the body is within body_max: its length was checked at the head */
    }
    if (head_only && used < len && buf[used] == '\n')
        used++; /* paused at the head's last byte: the body starts after it */
    if (used - r.body_len > RT_HTTP_HEAD_MAX) { /* came whole in one read: still too long */
        *why = "request head too long";
        return 431;
    }
    if (p.http_major != 1) {
        *why = "not HTTP/1.x";
        return 505;
    }
    snprintf(out->method, sizeof(out->method), "%s", http_method_str((enum http_method)p.method));
    out->keep_alive = http_should_keep_alive(&p) != 0;
    out->body_off = r.body ? (size_t)((const uint8_t *)r.body - buf) : head_only ? used : 0;
    out->body_len = r.body_len;
    out->len = used;
    return 0;
}

int rt_http_parse_request(const uint8_t *buf, size_t len, size_t body_max, rt_http_request_t *out,
                          const char **why)
{
    return parse(buf, len, body_max, false, out, why);
}

int rt_http_parse_head(const uint8_t *buf, size_t len, rt_http_request_t *out, const char **why)
{
    return parse(buf, len, 0, true, out, why);
}

/*
** An HTTP/1.1 request for rtd's HTTP listener (actors/http): the head and body read with
** libhttp-parser, bounded, no I/O or allocation. The caller keeps what it read and offers it
** again with more until the request is whole.
*/
#ifndef RT_HTTP_REQUEST_H
#define RT_HTTP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_HTTP_HEAD_MAX 8192        /* a request head is refused (431) past this */
#define RT_HTTP_HEADERS_MAX 64       /* header lines in one request (431 past it) */
#define RT_HTTP_TARGET_MAX 2048      /* the request target, path and query (414 past it) */

typedef struct rt_http_request_s {
    char method[8];                  /* "GET", "POST", ... */
    char target[RT_HTTP_TARGET_MAX]; /* as sent: path, then ?query */
    char api_key[160];               /* Authorization: Bearer KEY, or X-API-Key; "" if none */
    char content_type[64];           /* Content-Type as sent (cut at 63 bytes); "" if none */
    bool keep_alive;                 /* the connection may serve another request after this */
    size_t body_off, body_len;       /* the body in the buffer (Content-Length only) */
    uint64_t content_length;         /* rt_http_parse_head: UINT64_MAX when none was sent */
    size_t len;                      /* bytes the whole request took */
} rt_http_request_t;

/*
** Parses the request at the start of buf. Returns 0 with *out filled when it is whole;
** RT_EAGAIN when more must come (its head within RT_HTTP_HEAD_MAX, its body within
** body_max); otherwise the HTTP status to refuse it with (400 malformed or chunked, 413 a
** body past body_max, 414 a target past RT_HTTP_TARGET_MAX, 431 a head past
** RT_HTTP_HEAD_MAX or RT_HTTP_HEADERS_MAX lines, 505 not HTTP/1.x), with *why for the log.
*/
int rt_http_parse_request(const uint8_t *buf, size_t len, size_t body_max, rt_http_request_t *out,
                          const char **why);
/*
** The head alone, for a body the caller takes as it comes (an upload): 0 when the head is
** whole, with out->len its bytes (the body starts there) and out->content_length; RT_EAGAIN;
** or a status as above (411 for a chunked body).
*/
int rt_http_parse_head(const uint8_t *buf, size_t len, rt_http_request_t *out, const char **why);

#endif

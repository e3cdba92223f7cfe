/*
** The WebSocket opening handshake (RFC 6455 4.2.1, 4.2.2): the client's upgrade request,
** read with libhttp-parser, and the server's answers to it.
*/
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>
#include <openssl/evp.h>

#include "common.h"
#include "ws.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" /* 1.3 */
#define WS_KEY_LEN 24 /* base64 of a 16-byte nonce: 22 characters and "==" */
#define NAME_CAP 32   /* longer header names are none of those read here */

typedef enum {
    HDR_OTHER,
    HDR_UPGRADE,
    HDR_CONNECTION,
    HDR_KEY,
    HDR_VERSION,
    HDR_PROTOCOL,
    HDR_FORWARDED_FOR,
} header_t;

static const struct {
    const char *name;
    header_t header;
} known_headers[] = {
    {"Upgrade", HDR_UPGRADE},
    {"Connection", HDR_CONNECTION},
    {"Sec-WebSocket-Key", HDR_KEY},
    {"Sec-WebSocket-Version", HDR_VERSION},
    {"Sec-WebSocket-Protocol", HDR_PROTOCOL},
    {"X-Forwarded-For", HDR_FORWARDED_FOR},
};

typedef enum { CB_NONE, CB_FIELD, CB_VALUE } last_cb_t;

/*
** What the parser's callbacks gather. The head is given to the parser in one piece, so every
** pointer here is into the caller's buffer; a name or value comes in more than one callback
** only when it continues past the buffer's end (then the head is incomplete anyway) or, for
** a value, when the client folded it over several lines, which is refused.
*/
typedef struct request_s {
    rt_ws_upgrade_t *out;
    const char *url;
    size_t url_len;
    char name[NAME_CAP]; /* the current header's name so far */
    size_t name_len;     /* may pass NAME_CAP: then the name is not one of ours */
    header_t header;     /* what the current header is, known at its value */
    last_cb_t last_cb;
    bool folded; /* a value was continued on another line (obs-fold, RFC 7230 3.2.4) */
    bool headers_done;
    bool upgrade_websocket;  /* an Upgrade header named websocket */
    bool connection_upgrade; /* a Connection header had the upgrade token */
    unsigned versions;       /* Sec-WebSocket-Version headers */
    bool version_not_13;
    unsigned keys; /* Sec-WebSocket-Key headers */
    const char *key;
    size_t key_len;
    const rt_ws_protocols_t *protos; /* the subprotocols spoken */
    bool protocol_asked;             /* a Sec-WebSocket-Protocol header came */
    size_t forwarded_len;            /* of out->forwarded_for */
    bool forwarded_too_long;
} request_t;

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static void trim(const char **p, size_t *n)
{
    while (*n && is_ows(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n && is_ows((*p)[*n - 1]))
        (*n)--;
}

/* Steps *p to the next token of a list separated by commas and spaces, skipping empty ones. */
static bool next_token(const char **p, const char *end, const char **tok, size_t *tok_len)
{
    const char *s = *p;
    while (s < end && (*s == ',' || is_ows(*s)))
        s++;
    if (s == end)
        return false;
    const char *e = s;
    while (e < end && *e != ',' && !is_ows(*e))
        e++;
    *tok = s;
    *tok_len = (size_t)(e - s);
    *p = e;
    return true;
}

static bool list_has_nocase(const char *v, size_t n, const char *token)
{
    const char *end = v + n, *tok;
    size_t tok_len;
    while (next_token(&v, end, &tok, &tok_len))
        if (tok_len == strlen(token) && strncasecmp(tok, token, tok_len) == 0)
            return true;
    return false;
}

/* The first subprotocol of the client's list that ours names (tokens are case-sensitive). */
static void choose_protocol(const char *v, size_t n, const rt_ws_protocols_t *ours, char *chosen,
                            size_t cap)
{
    const char *end = v + n, *tok;
    size_t tok_len;
    while (next_token(&v, end, &tok, &tok_len))
        for (size_t i = 0; i < sizeof ours->names / sizeof *ours->names && ours->names[i]; i++)
            if (tok_len == strlen(ours->names[i]) && memcmp(tok, ours->names[i], tok_len) == 0) {
                snprintf(chosen, cap, "%s", ours->names[i]);
                return;
            }
}

static void add_forwarded(request_t *r, const char *v, size_t n)
{
    char *dst = r->out->forwarded_for;
    size_t cap = sizeof r->out->forwarded_for;
    const char *sep = r->forwarded_len ? ", " : "";
    size_t need = strlen(sep) + n;
    if (r->forwarded_too_long || r->forwarded_len + need >= cap) {
        r->forwarded_too_long = true;
        return;
    }
    memcpy(dst + r->forwarded_len, sep, strlen(sep));
    memcpy(dst + r->forwarded_len + strlen(sep), v, n);
    r->forwarded_len += need;
    dst[r->forwarded_len] = '\0';
}

static header_t classify(const request_t *r)
{
    for (size_t i = 0; i < sizeof known_headers / sizeof *known_headers; i++) {
        const char *name = known_headers[i].name;
        if (r->name_len == strlen(name) && strncasecmp(r->name, name, r->name_len) == 0)
            return known_headers[i].header;
    }
    return HDR_OTHER;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    request_t *r = p->data;
    if (!r->url)
        r->url = at;
    r->url_len = (size_t)(at + n - r->url);
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    request_t *r = p->data;
    if (r->last_cb != CB_FIELD)
        r->name_len = 0;
    if (r->name_len + n <= NAME_CAP)
        memcpy(r->name + r->name_len, at, n);
    r->name_len += n;
    r->last_cb = CB_FIELD;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    request_t *r = p->data;
    if (r->last_cb == CB_VALUE) {
        r->folded = true;
        return 0;
    }
    r->last_cb = CB_VALUE;
    r->header = r->name_len <= NAME_CAP ? classify(r) : HDR_OTHER;
    trim(&at, &n);
    switch (r->header) {
    case HDR_UPGRADE:
        r->upgrade_websocket |= list_has_nocase(at, n, "websocket");
        break;
    case HDR_CONNECTION:
        r->connection_upgrade |= list_has_nocase(at, n, "upgrade");
        break;
    case HDR_KEY:
        r->keys++;
        r->key = at;
        r->key_len = n;
        break;
    case HDR_VERSION:
        r->versions++;
        r->version_not_13 |= !(n == 2 && memcmp(at, "13", 2) == 0);
        break;
    case HDR_PROTOCOL:
        r->protocol_asked = true;
        if (!r->out->subprotocol[0])
            choose_protocol(at, n, r->protos, r->out->subprotocol, sizeof r->out->subprotocol);
        break;
    case HDR_FORWARDED_FOR:
        add_forwarded(r, at, n);
        break;
    case HDR_OTHER:
        break;
    }
    return 0;
}

/* Returning 2 tells the parser that no body follows and it is to stop at the head's end. */
static int on_headers_complete(http_parser *p)
{
    request_t *r = p->data;
    r->headers_done = true;
    return 2;
}

/* A nonce of 16 bytes in base64 (4.1): 22 characters of the alphabet, then "==". */
static bool key_valid(const char *key, size_t n)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (n != WS_KEY_LEN || key[22] != '=' || key[23] != '=')
        return false;
    for (size_t i = 0; i < 22; i++)
        if (!key[i] || !strchr(alphabet, key[i]))
            return false;
    return true;
}

static int compute_accept(const char *key, char accept[29])
{
    char joined[WS_KEY_LEN + sizeof WS_GUID - 1];
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    memcpy(joined, key, WS_KEY_LEN);
    memcpy(joined + WS_KEY_LEN, WS_GUID, sizeof WS_GUID - 1);
    if (!EVP_Digest(joined, sizeof joined, digest, &digest_len, EVP_sha1(), NULL) ||
        digest_len != 20)
        return RT_EINVAL;
    EVP_EncodeBlock((unsigned char *)accept, digest, 20);
    return 0;
}

static bool path_matches(const request_t *r, const char *path)
{
    struct http_parser_url u;
    http_parser_url_init(&u);
    if (http_parser_parse_url(r->url, r->url_len, 0, &u) != 0)
        return false;
    const char *target = "/";
    size_t target_len = 1;
    if (u.field_set & (1 << UF_PATH)) {
        target = r->url + u.field_data[UF_PATH].off;
        target_len = u.field_data[UF_PATH].len;
    }
    return strlen(path) == target_len && memcmp(path, target, target_len) == 0;
}

static int refuse(int status, const char *reason, const char **why)
{
    *why = reason;
    return status;
}

int rt_ws_parse_upgrade(const uint8_t *buf, size_t len, const char *path,
                        const rt_ws_protocols_t *protos, size_t *head_len, rt_ws_upgrade_t *out,
                        const char **why)
{
    static const http_parser_settings settings = {
        .on_url = on_url,
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_headers_complete = on_headers_complete,
    };
    memset(out, 0, sizeof *out);
    *why = "";
    request_t r = {.out = out, .protos = protos};
    http_parser p;
    http_parser_init(&p, HTTP_REQUEST);
    p.data = &r;
    size_t n = len < RT_WS_HEAD_MAX ? len : RT_WS_HEAD_MAX;
    size_t parsed = http_parser_execute(&p, &settings, (const char *)buf, n);

    if (HTTP_PARSER_ERRNO(&p) != HPE_OK)
        return refuse(400, "not an HTTP request", why);
    if (!r.headers_done) {
        if (len >= RT_WS_HEAD_MAX)
            return refuse(400, "request head too long", why);
        return RT_EAGAIN;
    }
    if (r.folded)
        return refuse(400, "a header folded over lines", why);
    if (p.method != HTTP_GET)
        return refuse(400, "not a GET", why);
    if (p.http_major < 1 || (p.http_major == 1 && p.http_minor < 1))
        return refuse(400, "not HTTP/1.1", why);
    if (!path_matches(&r, path))
        return refuse(404, "not the WebSocket path", why);
    if (!r.upgrade_websocket)
        return refuse(400, "Upgrade is not websocket", why);
    if (!r.connection_upgrade)
        return refuse(400, "Connection lacks upgrade", why);
    if (r.versions == 0 || r.version_not_13)
        return refuse(426, "Sec-WebSocket-Version is not 13", why);
    if (r.keys != 1 || !key_valid(r.key, r.key_len))
        return refuse(400, "bad Sec-WebSocket-Key", why);
    if ((r.protocol_asked || protos->required) && !out->subprotocol[0])
        return refuse(400, "no subprotocol spoken here was offered", why);
    if (compute_accept(r.key, out->accept) != 0)
        return refuse(400, "SHA-1 unavailable", why);
    if (r.forwarded_too_long)
        out->forwarded_for[0] = '\0';
    *head_len = parsed;
    return 0;
}

size_t rt_ws_upgrade_response(const rt_ws_upgrade_t *u, char *out, size_t cap)
{
    int n = snprintf(out, cap,
                     "HTTP/1.1 101 Switching Protocols\r\n"
                     "Upgrade: websocket\r\n"
                     "Connection: Upgrade\r\n"
                     "Sec-WebSocket-Accept: %s\r\n"
                     "%s%s%s"
                     "\r\n",
                     u->accept, u->subprotocol[0] ? "Sec-WebSocket-Protocol: " : "", u->subprotocol,
                     u->subprotocol[0] ? "\r\n" : "");
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* 426 names the version and protocol the client must use (RFC 6455 4.4, RFC 7231 6.5.15). */
size_t rt_ws_error_response(int status, char *out, size_t cap)
{
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\n"
                     "%s"
                     "Connection: close\r\n"
                     "Content-Length: 0\r\n"
                     "\r\n",
                     status, http_status_str((enum http_status)status),
                     status == 426 ? "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" : "");
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/*
 * rtb_xport: TLS on memory BIOs and the WebSocket client codec; see rtb_xport.h.
 *
 * TLS never touches the socket: bytes read by libuv are written into the read BIO and
 * SSL_read decrypts them into a shared buffer; whatever OpenSSL wants to send (records,
 * handshake messages, alerts) collects in the write BIO and is moved into the worker's
 * wire buffer on the next flush. A memory BIO never blocks, so SSL_write never asks to
 * be retried.
 *
 * WebSocket frames from the server are decoded as a stream: the frame header is
 * collected byte-wise (it may be split across reads) and binary payload bytes go to the
 * MQTT decoder as they come, so a frame may hold any number of MQTT packets or a part
 * of one. Every flush of a client becomes one masked binary frame.
 */
#include "rtb_xport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define RTB_X_PLAIN_BUF (256 * 1024) /* shared decrypt buffer per process, bytes */
#define RTB_X_HTTP_MAX 8192          /* longest upgrade response accepted, bytes */
#define RTB_WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

enum { X_IDLE, X_TLS_HS, X_WS_UPGRADE, X_OPEN };
enum { WS_CONT = 0, WS_TEXT = 1, WS_BIN = 2, WS_CLOSE = 8, WS_PING = 9, WS_PONG = 10 };

struct rtb_xctx_s {
    SSL_CTX *ssl_ctx; /* NULL without --tls */
    rtb_xconf_t cf;   /* borrowed strings, from the options */
    int host_is_ip;   /* -h is an address literal: verify it as an IP SAN */
    char req[1024];   /* the upgrade request up to the key (printf'd once) */
    int req_len;
};

struct rtb_xport_s {
    rtb_xctx_t *ctx;
    SSL *ssl;           /* per connection; NULL without TLS */
    BIO *rbio, *wbio;   /* owned by ssl */
    SSL_SESSION *sess;  /* last session the server gave us, for --tls-resume; owned */
    const char *err;    /* reason of the last -EPROTO, static */
    rtb_buf_t raw;      /* bytes for the socket when there is no TLS below */
    rtb_buf_t tmp;      /* a frame being built before it goes into SSL_write */
    rtb_buf_t http;     /* the upgrade response while it is incomplete */
    char accept[32];    /* the Sec-WebSocket-Accept we expect */
    uint64_t mask_rng;  /* xorshift state for frame masks */
    uint8_t stage;      /* X_* */
    uint8_t in_payload; /* the current frame's header is complete */
    uint8_t fop;        /* opcode of the current frame */
    uint8_t fhlen;      /* header bytes collected */
    uint8_t fh[14];     /* frame header being collected */
    uint8_t ctllen;     /* control payload bytes collected */
    uint8_t ctl[125];   /* control frame payload (ping data to echo) */
    uint64_t remain;    /* payload bytes left in the current frame */
};

static uint8_t plain_buf[RTB_X_PLAIN_BUF];

/* The session the server just issued replaces the one we kept (TLS 1.3 sends tickets
 * after the handshake, TLS 1.2 in it); returning 1 keeps the reference. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    rtb_xport_t *x = SSL_get_app_data(ssl);
    if (!x)
        return 0;
    SSL_SESSION_free(x->sess);
    x->sess = sess;
    return 1;
}

static void ssl_reason(char *err, size_t n, const char *what, const char *file)
{
    unsigned long e = ERR_get_error();
    snprintf(err, n, "%s '%s': %s", what, file ? file : "", e ? ERR_reason_error_string(e) : "?");
    ERR_clear_error();
}

int rtb_xctx_new(rtb_xctx_t **out, const rtb_xconf_t *cf, char *err, size_t errlen)
{
    rtb_xctx_t *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->cf = *cf;
    struct in6_addr a6;
    x->host_is_ip =
        inet_pton(AF_INET, cf->host, &a6) == 1 || inet_pton(AF_INET6, cf->host, &a6) == 1;
    if (cf->ws) {
        const char *h = cf->sni ? cf->sni : cf->host;
        x->req_len = snprintf(x->req, sizeof(x->req),
                              "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Protocol: mqtt\r\nSec-WebSocket-Key: ",
                              cf->ws, h, cf->port);
        if (x->req_len <= 0 || (size_t)x->req_len >= sizeof(x->req) - 64) {
            snprintf(err, errlen, "--ws path too long");
            free(x);
            return -EINVAL;
        }
    }
    if (!cf->tls) {
        *out = x;
        return 0;
    }
    SSL_CTX *s = SSL_CTX_new(TLS_client_method());
    if (!s) {
        ssl_reason(err, errlen, "SSL_CTX_new", NULL);
        free(x);
        return -ENOMEM;
    }
    x->ssl_ctx = s;
    SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION);
    /* Idle connections give their record buffers back; rtbench holds thousands. */
    SSL_CTX_set_mode(s, SSL_MODE_RELEASE_BUFFERS);
    if (cf->ws)
        SSL_CTX_set_alpn_protos(s, (const unsigned char *)"\x08http/1.1", 9);
    else
        SSL_CTX_set_alpn_protos(s, (const unsigned char *)"\x04mqtt", 5);
    if (cf->cafile) {
        if (SSL_CTX_load_verify_locations(s, cf->cafile, NULL) != 1) {
            ssl_reason(err, errlen, "cannot load --cafile", cf->cafile);
            goto fail;
        }
        SSL_CTX_set_verify(s, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(s, SSL_VERIFY_NONE, NULL);
    }
    if (cf->cert) {
        if (SSL_CTX_use_certificate_chain_file(s, cf->cert) != 1) {
            ssl_reason(err, errlen, "cannot load --cert", cf->cert);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(s, cf->key, SSL_FILETYPE_PEM) != 1) {
            ssl_reason(err, errlen, "cannot load --key", cf->key);
            goto fail;
        }
        if (SSL_CTX_check_private_key(s) != 1) {
            ssl_reason(err, errlen, "--key does not match --cert", cf->key);
            goto fail;
        }
    }
    if (cf->resume) {
        SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
        SSL_CTX_sess_set_new_cb(s, on_new_session);
    } else {
        SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
    }
    *out = x;
    return 0;
fail:
    SSL_CTX_free(s);
    free(x);
    return -EINVAL;
}

void rtb_xctx_free(rtb_xctx_t *x)
{
    if (!x)
        return;
    SSL_CTX_free(x->ssl_ctx);
    free(x);
}

int rtb_xport_new(rtb_xctx_t *ctx, rtb_xport_t **out)
{
    rtb_xport_t *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->ctx = ctx;
    x->mask_rng = ((uint64_t)(uintptr_t)x * 0x9E3779B97F4A7C15ull) | 1;
    *out = x;
    return 0;
}

static void drop_ssl(rtb_xport_t *x)
{
    if (!x->ssl)
        return;
    SSL_set_app_data(x->ssl, NULL);
    SSL_free(x->ssl); /* frees both BIOs */
    x->ssl = NULL;
    x->rbio = x->wbio = NULL;
}

void rtb_xport_free(rtb_xport_t *x)
{
    if (!x)
        return;
    drop_ssl(x);
    SSL_SESSION_free(x->sess);
    rtb_buf_free(&x->raw);
    rtb_buf_free(&x->tmp);
    rtb_buf_free(&x->http);
    free(x);
}

/* Writes bytes into the layer under WebSocket: TLS when there is TLS, else the socket. */
static int below_write(rtb_xport_t *x, const void *p, size_t n)
{
    if (!x->ssl)
        return rtb_buf_append(&x->raw, p, n);
    if (n == 0)
        return 0;
    size_t w = 0;
    if (SSL_write_ex(x->ssl, p, n, &w) != 1 || w != n) {
        x->err = "SSL_write failed";
        return -EPROTO;
    }
    return 0;
}

static int ws_send_upgrade(rtb_xport_t *x)
{
    rtb_xctx_t *c = x->ctx;
    unsigned char key[16], key64[32], digest[20], cat[64];
    char req[1200];
    if (RAND_bytes(key, sizeof(key)) != 1)
        return -EPROTO;
    EVP_EncodeBlock(key64, key, sizeof(key)); /* 24 characters */
    memcpy(cat, key64, 24);
    memcpy(cat + 24, RTB_WS_GUID, 36);
    if (!EVP_Digest(cat, 60, digest, NULL, EVP_sha1(), NULL))
        return -EPROTO;
    EVP_EncodeBlock((unsigned char *)x->accept, digest, sizeof(digest)); /* 28 characters */
    memcpy(req, c->req, (size_t)c->req_len);
    int n = c->req_len;
    n += snprintf(req + n, sizeof(req) - (size_t)n, "%s\r\n\r\n", (char *)key64);
    x->stage = X_WS_UPGRADE;
    x->http.len = 0;
    return below_write(x, req, (size_t)n);
}

int rtb_xport_start(rtb_xport_t *x)
{
    rtb_xctx_t *c = x->ctx;
    drop_ssl(x);
    x->raw.len = x->tmp.len = x->http.len = 0;
    x->in_payload = x->fhlen = x->ctllen = 0;
    x->remain = 0;
    x->err = NULL;
    if (!c->ssl_ctx) {
        x->stage = X_OPEN;
        return c->cf.ws ? ws_send_upgrade(x) : 0;
    }
    x->ssl = SSL_new(c->ssl_ctx);
    x->rbio = BIO_new(BIO_s_mem());
    x->wbio = BIO_new(BIO_s_mem());
    if (!x->ssl || !x->rbio || !x->wbio) {
        BIO_free(x->rbio);
        BIO_free(x->wbio);
        SSL_free(x->ssl);
        x->ssl = NULL;
        return -ENOMEM;
    }
    /* An empty memory BIO reports "retry" instead of EOF. */
    BIO_set_mem_eof_return(x->rbio, -1);
    SSL_set_bio(x->ssl, x->rbio, x->wbio);
    SSL_set_app_data(x->ssl, x);
    SSL_set_connect_state(x->ssl);
    const char *name = c->cf.sni ? c->cf.sni : c->host_is_ip ? NULL : c->cf.host;
    if (name)
        SSL_set_tlsext_host_name(x->ssl, name);
    if (c->cf.cafile) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(x->ssl);
        if (name)
            X509_VERIFY_PARAM_set1_host(vp, name, 0);
        else
            X509_VERIFY_PARAM_set1_ip_asc(vp, c->cf.host);
    }
    if (c->cf.resume && x->sess)
        SSL_set_session(x->ssl, x->sess);
    x->stage = X_TLS_HS;
    int r = SSL_do_handshake(x->ssl); /* puts the ClientHello into wbio */
    if (r <= 0 && SSL_get_error(x->ssl, r) != SSL_ERROR_WANT_READ) {
        x->err = "handshake could not start";
        return -EPROTO;
    }
    return 0;
}

/* A masked frame around p[0..n) appended to out; the mask is applied while copying. */
static int ws_frame(rtb_xport_t *x, int op, const uint8_t *p, size_t n, rtb_buf_t *out)
{
    if (rtb_buf_reserve(out, n + 14))
        return -ENOMEM;
    uint8_t *h = out->p + out->len;
    size_t hl = 2;
    h[0] = (uint8_t)(0x80 | op);
    if (n < 126) {
        h[1] = (uint8_t)(0x80 | n);
    } else if (n < 65536) {
        h[1] = 0x80 | 126;
        h[2] = (uint8_t)(n >> 8);
        h[3] = (uint8_t)n;
        hl = 4;
    } else {
        h[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            h[2 + i] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
        hl = 10;
    }
    x->mask_rng ^= x->mask_rng << 13;
    x->mask_rng ^= x->mask_rng >> 7;
    x->mask_rng ^= x->mask_rng << 17;
    uint32_t m32 = (uint32_t)x->mask_rng;
    uint8_t mk[4];
    memcpy(mk, &m32, 4);
    memcpy(h + hl, mk, 4);
    hl += 4;
    uint8_t *d = h + hl;
    /* Eight bytes at a time; the key repeats every four bytes, so a doubled key works. */
    uint64_t m64 = (uint64_t)m32 | (uint64_t)m32 << 32;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        v ^= m64;
        memcpy(d + i, &v, 8);
    }
    for (; i < n; i++)
        d[i] = p[i] ^ mk[i & 3];
    out->len += hl + n;
    return 0;
}

/* Sends a masked frame under the current stage's rules (through TLS when present). */
static int ws_send(rtb_xport_t *x, int op, const uint8_t *p, size_t n, rtb_buf_t *wire)
{
    if (!x->ssl)
        return ws_frame(x, op, p, n, wire ? wire : &x->raw);
    x->tmp.len = 0;
    int r = ws_frame(x, op, p, n, &x->tmp);
    return r ? r : below_write(x, x->tmp.p, x->tmp.len);
}

/* Finds a header's value in an HTTP response head; 0 and the value's span, or -1. */
static int http_header(const char *head, size_t n, const char *name, const char **v, size_t *vn)
{
    size_t nl = strlen(name);
    const char *end = head + n;
    for (const char *s = memchr(head, '\n', n); s && s + 1 < end;
         s = memchr(s + 1, '\n', (size_t)(end - s - 1))) {
        const char *l = s + 1;
        if ((size_t)(end - l) <= nl || strncasecmp(l, name, nl) || l[nl] != ':')
            continue;
        const char *a = l + nl + 1, *b;
        while (a < end && (*a == ' ' || *a == '\t'))
            a++;
        for (b = a; b < end && *b != '\r' && *b != '\n'; b++)
            ;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        *v = a;
        *vn = (size_t)(b - a);
        return 0;
    }
    return -1;
}

static int ws_frames(rtb_xport_t *x, const uint8_t *p, size_t n, rtb_xport_deliver_fn deliver,
                     void *arg);

/* Collects the upgrade response; what follows its blank line is already frames. */
static int ws_upgrade_input(rtb_xport_t *x, const uint8_t *p, size_t n,
                            rtb_xport_deliver_fn deliver, void *arg)
{
    size_t old = x->http.len;
    if (old + n > RTB_X_HTTP_MAX) {
        x->err = "WebSocket upgrade response too long";
        return -EPROTO;
    }
    if (rtb_buf_append(&x->http, p, n))
        return -ENOMEM;
    const char *h = (const char *)x->http.p;
    size_t hn = x->http.len, end = 0;
    for (size_t i = old >= 3 ? old - 3 : 0; i + 4 <= hn; i++)
        if (!memcmp(h + i, "\r\n\r\n", 4)) {
            end = i + 4;
            break;
        }
    if (!end)
        return 0;
    if (hn < 12 || strncmp(h, "HTTP/1.1 101", 12)) {
        x->err = "WebSocket upgrade refused (status is not 101)";
        return -EPROTO;
    }
    const char *v;
    size_t vn;
    if (http_header(h, end, "Sec-WebSocket-Accept", &v, &vn) || vn != strlen(x->accept) ||
        memcmp(v, x->accept, vn)) {
        x->err = "WebSocket upgrade: bad Sec-WebSocket-Accept";
        return -EPROTO;
    }
    if (http_header(h, end, "Sec-WebSocket-Protocol", &v, &vn) || vn != 4 ||
        strncasecmp(v, "mqtt", 4)) {
        x->err = "WebSocket upgrade: subprotocol mqtt not accepted";
        return -EPROTO;
    }
    x->stage = X_OPEN;
    size_t rest = hn - end;
    int r = 0;
    if (rest) {
        /* Copied out first: the frames may not outlive x->http's next use. */
        memmove(x->http.p, x->http.p + end, rest);
        r = ws_frames(x, x->http.p, rest, deliver, arg);
    }
    x->http.len = 0;
    return r;
}

/* Decodes server frames; binary and continuation payloads are MQTT bytes. */
static int ws_frames(rtb_xport_t *x, const uint8_t *p, size_t n, rtb_xport_deliver_fn deliver,
                     void *arg)
{
    while (n || (x->in_payload && x->remain == 0)) {
        if (!x->in_payload) {
            x->fh[x->fhlen++] = *p++;
            n--;
            if (x->fhlen < 2)
                continue;
            if (x->fh[1] & 0x80) {
                x->err = "WebSocket: the server masked a frame";
                return -EPROTO;
            }
            uint8_t l7 = x->fh[1] & 0x7f;
            size_t need = 2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0);
            if (x->fhlen < need)
                continue;
            uint64_t len = l7;
            if (l7 == 126)
                len = (uint64_t)x->fh[2] << 8 | x->fh[3];
            else if (l7 == 127)
                for (int i = 0; i < 8; i++)
                    len = len << 8 | x->fh[2 + i];
            x->fop = x->fh[0] & 0x0f;
            if (x->fop >= 8 && (len > 125 || !(x->fh[0] & 0x80))) {
                x->err = "WebSocket: bad control frame";
                return -EPROTO;
            }
            x->remain = len;
            x->fhlen = 0;
            x->ctllen = 0;
            x->in_payload = 1;
            continue;
        }
        size_t k = n < x->remain ? n : (size_t)x->remain;
        if (x->fop < 8) {
            if (k)
                deliver(arg, p, k);
        } else {
            memcpy(x->ctl + x->ctllen, p, k);
            x->ctllen = (uint8_t)(x->ctllen + k);
        }
        p += k;
        n -= k;
        x->remain -= k;
        if (x->remain)
            continue;
        x->in_payload = 0;
        if (x->fop == WS_CLOSE)
            return -ECONNRESET;
        if (x->fop == WS_PING) {
            int r = ws_send(x, WS_PONG, x->ctl, x->ctllen, NULL);
            if (r)
                return r;
        }
    }
    return 0;
}

/* Bytes that came out of TLS (or straight off the socket without TLS). */
static int upper_input(rtb_xport_t *x, const uint8_t *p, size_t n, rtb_xport_deliver_fn deliver,
                       void *arg)
{
    if (!x->ctx->cf.ws) {
        deliver(arg, p, n);
        return 0;
    }
    if (x->stage == X_WS_UPGRADE)
        return ws_upgrade_input(x, p, n, deliver, arg);
    return ws_frames(x, p, n, deliver, arg);
}

static int tls_error(rtb_xport_t *x, int r)
{
    int e = SSL_get_error(x->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_ZERO_RETURN)
        return -ECONNRESET;
    long v = SSL_get_verify_result(x->ssl);
    unsigned long ec = ERR_peek_last_error();
    if (v != X509_V_OK)
        x->err = X509_verify_cert_error_string(v);
    else if (ec)
        x->err = ERR_reason_error_string(ec);
    else
        x->err = "TLS error";
    if (!x->err)
        x->err = "TLS error";
    ERR_clear_error();
    return -EPROTO;
}

int rtb_xport_input(rtb_xport_t *x, const uint8_t *p, size_t n, rtb_xport_deliver_fn deliver,
                    void *arg)
{
    if (!x->ssl)
        return upper_input(x, p, n, deliver, arg);
    if (BIO_write(x->rbio, p, (int)n) != (int)n)
        return -ENOMEM;
    if (x->stage == X_TLS_HS) {
        int r = SSL_do_handshake(x->ssl);
        if (r != 1)
            return tls_error(x, r);
        if (x->ctx->cf.ws) {
            r = ws_send_upgrade(x);
            if (r)
                return r;
        } else {
            x->stage = X_OPEN;
        }
    }
    /* Bounded: each pass consumes input from rbio, which only we fill. */
    for (;;) {
        size_t got = 0;
        int r = SSL_read_ex(x->ssl, plain_buf, sizeof(plain_buf), &got);
        if (r != 1)
            return tls_error(x, r);
        r = upper_input(x, plain_buf, got, deliver, arg);
        if (r)
            return r;
    }
}

int rtb_xport_open(const rtb_xport_t *x)
{
    return x->stage == X_OPEN;
}

int rtb_xport_pending(const rtb_xport_t *x)
{
    return x->raw.len || (x->wbio && BIO_ctrl_pending(x->wbio));
}

int rtb_xport_output(rtb_xport_t *x, rtb_buf_t *mqtt, rtb_buf_t *wire)
{
    int r;
    if (x->raw.len) {
        if (rtb_buf_append(wire, x->raw.p, x->raw.len))
            return -ENOMEM;
        x->raw.len = 0;
    }
    if (x->stage == X_OPEN && mqtt->len) {
        if (x->ctx->cf.ws)
            r = ws_send(x, WS_BIN, mqtt->p, mqtt->len, wire);
        else
            r = below_write(x, mqtt->p, mqtt->len);
        if (r)
            return r;
        mqtt->len = 0;
    }
    if (!x->wbio)
        return 0;
    size_t pend = BIO_ctrl_pending(x->wbio);
    if (!pend)
        return 0;
    if (rtb_buf_reserve(wire, pend))
        return -ENOMEM;
    int got = BIO_read(x->wbio, wire->p + wire->len, (int)pend);
    if (got > 0)
        wire->len += (size_t)got;
    return 0;
}

void rtb_xport_shutdown(rtb_xport_t *x)
{
    if (x->ssl && x->stage == X_OPEN) {
        SSL_shutdown(x->ssl);
        ERR_clear_error();
    }
}

int rtb_xport_resumed(const rtb_xport_t *x)
{
    return x->ssl && SSL_session_reused(x->ssl);
}

const char *rtb_xport_error(const rtb_xport_t *x)
{
    return x->err ? x->err : "transport error";
}

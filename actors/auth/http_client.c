/*
** A blocking HTTP/1.1 client (http_client.h): non-blocking sockets driven with poll so that
** one deadline bounds connect, the TLS handshake, the request and the response.
*/
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "http_client.h"
#include "rt.h"

typedef struct {
    int fd;
    SSL *ssl;
} conn_t;

struct rt_httpc_s {
    char host[256], port[8], path[1024];
    bool tls;
    SSL_CTX *ctx;
    uint32_t timeout_ms;
    rt_buf_t head; /* the request line and every header but Content-Length, each with its CRLF */
    pthread_mutex_t lock;
    conn_t *idle; /* kept-alive connections, at most keep */
    unsigned nidle, keep;
    atomic_uint_fast64_t connects;
};

static int fail(char *err, size_t errlen, const char *fmt, const char *a)
{
    snprintf(err, errlen, fmt, a);
    return RT_EPROTO;
}

int rt_httpc_new(const char *url, const char *ca_file, uint32_t timeout_ms, unsigned keep,
                 rt_httpc_t **out, char *err, size_t errlen)
{
    rt_httpc_t *h = calloc(1, sizeof(*h));
    if (!h)
        return RT_ENOMEM;
    const char *rest = NULL;
    if (strncmp(url, "http://", 7) == 0)
        rest = url + 7;
    else if (strncmp(url, "https://", 8) == 0)
        rest = url + 8, h->tls = true;
    const char *slash = rest ? strchr(rest, '/') : NULL;
    size_t hostport = rest ? (slash ? (size_t)(slash - rest) : strlen(rest)) : 0;
    const char *colon = rest ? memchr(rest, ':', hostport) : NULL;
    size_t hostlen = colon ? (size_t)(colon - rest) : hostport;
    size_t portlen = colon ? hostport - hostlen - 1 : 0;
    if (!rest || !hostlen || hostlen >= sizeof(h->host) || portlen >= sizeof(h->port) ||
        (slash && strlen(slash) >= sizeof(h->path))) {
        free(h);
        snprintf(err, errlen, "%s: not an http:// or https:// URL with a host", url);
        return RT_EINVAL;
    }
    memcpy(h->host, rest, hostlen);
    if (portlen)
        memcpy(h->port, colon + 1, portlen);
    else
        strcpy(h->port, h->tls ? "443" : "80");
    snprintf(h->path, sizeof(h->path), "%s", slash ? slash : "/");
    /* Caught here rather than as a connection that fails on every call. */
    long port = strtol(h->port, NULL, 10);
    if (strspn(h->port, "0123456789") != strlen(h->port) || port < 1 || port > 65535 ||
        strpbrk(h->host, "@ \t\r\n") || strpbrk(h->path, " \t\r\n")) {
        free(h);
        snprintf(err, errlen,
                 "%s: the port must be 1 to 65535, the host without user@, the path without "
                 "blanks",
                 url);
        return RT_EINVAL;
    }
    rt_buf_printf(&h->head,
                  "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                  "Accept: application/json\r\nConnection: keep-alive\r\n",
                  h->path, h->host, h->port);
    h->timeout_ms = timeout_ms;
    h->keep = keep;
    pthread_mutex_init(&h->lock, NULL);
    h->idle = calloc(keep ? keep : 1, sizeof(*h->idle));
    if (h->tls && h->idle) {
        h->ctx = SSL_CTX_new(TLS_client_method());
        bool ok = h->ctx && SSL_CTX_set_min_proto_version(h->ctx, TLS1_2_VERSION) &&
                  (ca_file && *ca_file ? SSL_CTX_load_verify_locations(h->ctx, ca_file, NULL)
                                       : SSL_CTX_set_default_verify_paths(h->ctx));
        if (!ok) {
            rt_httpc_free(h);
            snprintf(err, errlen, "%s: cannot load the CA file",
                     ca_file && *ca_file ? ca_file : "system");
            return RT_EINVAL;
        }
        SSL_CTX_set_verify(h->ctx, SSL_VERIFY_PEER, NULL);
    }
    if (!h->idle || h->head.oom) {
        rt_httpc_free(h);
        return RT_ENOMEM;
    }
    *out = h;
    return 0;
}

static void conn_close(conn_t *c)
{
    if (c->ssl) {
        SSL_shutdown(c->ssl); /* best effort: the socket is non-blocking */
        SSL_free(c->ssl);
    }
    if (c->fd >= 0)
        close(c->fd);
    c->ssl = NULL;
    c->fd = -1;
}

void rt_httpc_free(rt_httpc_t *h)
{
    if (!h)
        return;
    for (unsigned i = 0; i < h->nidle; i++)
        conn_close(&h->idle[i]);
    free(h->idle);
    rt_buf_free(&h->head);
    SSL_CTX_free(h->ctx);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

int rt_httpc_add_header(rt_httpc_t *h, const char *name, const char *value, char *err,
                        size_t errlen)
{
    static const char *const own[] = {"host", "content-type", "content-length", "transfer-encoding",
                                      "connection"};
    size_t n = strlen(name);
    bool token = n > 0 && strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "0123456789!#$%&'*+-.^_`|~") == n;
    for (size_t i = 0; token && i < sizeof(own) / sizeof(own[0]); i++)
        token = strcasecmp(name, own[i]) != 0;
    if (!token) {
        snprintf(err, errlen, "header %s: not a name, or one the client sets itself", name);
        return RT_EINVAL;
    }
    for (const unsigned char *v = (const unsigned char *)value; *v; v++) {
        if ((*v < 0x20 && *v != '\t') || *v == 0x7f) {
            snprintf(err, errlen, "header %s: its value holds a control character", name);
            return RT_EINVAL;
        }
    }
    size_t before = h->head.len;
    rt_buf_printf(&h->head, "%s: %s\r\n", name, value);
    if (h->head.oom) {
        rt_buf_truncate(&h->head, before);
        return RT_ENOMEM;
    }
    return 0;
}

uint64_t rt_httpc_connects(const rt_httpc_t *h)
{
    return atomic_load(&((rt_httpc_t *)h)->connects);
}

size_t rt_httpc_held(const rt_httpc_t *h)
{
    return sizeof(*h) + (h->keep ? h->keep : 1) * sizeof(conn_t) + h->head.cap;
}

/* Waits for fd to be ready for events until deadline (rt_mono_ms): false on timeout. */
static bool wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = rt_mono_ms();
        if (now >= deadline)
            return false;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(deadline - now));
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
}

/* An SSL call's want, waited for: true to call again, false on failure or timeout. */
static bool ssl_retry(conn_t *c, int rc, uint64_t deadline)
{
    int e = SSL_get_error(c->ssl, rc);
    if (e == SSL_ERROR_WANT_READ)
        return wait_fd(c->fd, POLLIN, deadline);
    if (e == SSL_ERROR_WANT_WRITE)
        return wait_fd(c->fd, POLLOUT, deadline);
    return false;
}

static int open_conn(rt_httpc_t *h, conn_t *c, uint64_t deadline, char *err, size_t errlen)
{
    c->fd = -1;
    c->ssl = NULL;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(h->host, h->port, &hints, &ai) != 0 || !ai)
        return fail(err, errlen, "%s: cannot resolve", h->host);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (fd < 0)
        return fail(err, errlen, "%s: no socket", h->host);
    c->fd = fd;
    if (rc != 0 && errno != EINPROGRESS) {
        conn_close(c);
        return fail(err, errlen, "%s: connection refused", h->host);
    }
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (rc != 0 && (!wait_fd(fd, POLLOUT, deadline) ||
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr)) {
        conn_close(c);
        return fail(err, errlen, "%s: cannot connect (refused or timed out)", h->host);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    atomic_fetch_add(&h->connects, 1);
    if (!h->tls)
        return 0;
    c->ssl = SSL_new(h->ctx);
    if (!c->ssl || !SSL_set_fd(c->ssl, fd) || !SSL_set_tlsext_host_name(c->ssl, h->host) ||
        !SSL_set1_host(c->ssl, h->host)) {
        conn_close(c);
        return fail(err, errlen, "%s: cannot start TLS", h->host);
    }
    for (;;) {
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        if (!ssl_retry(c, r, deadline)) {
            long v = SSL_get_verify_result(c->ssl);
            conn_close(c);
            return fail(err, errlen, "TLS handshake failed: %s",
                        v != X509_V_OK ? X509_verify_cert_error_string(v) : "refused or timed out");
        }
    }
}

static bool send_all(conn_t *c, const char *p, size_t n, uint64_t deadline)
{
    while (n) {
        ssize_t w;
        if (c->ssl) {
            int r = SSL_write(c->ssl, p, (int)n);
            if (r <= 0) {
                if (!ssl_retry(c, r, deadline))
                    return false;
                continue;
            }
            w = r;
        } else {
            w = send(c->fd, p, n, MSG_NOSIGNAL);
            if (w < 0) {
                if ((errno != EAGAIN && errno != EINTR) || !wait_fd(c->fd, POLLOUT, deadline))
                    return false;
                continue;
            }
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* What the parser saw of one response. */
typedef struct {
    char *body;
    size_t len;
    bool discard; /* the caller wants no body: read past it */
    bool complete, too_long;
} response_t;

static int on_body(http_parser *p, const char *at, size_t n)
{
    response_t *r = p->data;
    if (r->discard)
        return 0;
    if (r->len + n > RT_HTTPC_MAX_RESPONSE) {
        r->too_long = true;
        return 1;
    }
    char *b = realloc(r->body, r->len + n + 1);
    if (!b)
        return 1;
    memcpy(b + r->len, at, n);
    r->body = b;
    r->len += n;
    b[r->len] = 0;
    return 0;
}

static int on_complete(http_parser *p)
{
    ((response_t *)p->data)->complete = true;
    http_parser_pause(p, 1);
    return 0;
}

/*
** Reads one response: 0 with it in r, 1 when the connection closed before any byte (a
** kept-alive connection the server let go: try a new one), RT_EPROTO otherwise.
*/
static int read_response(conn_t *c, response_t *r, http_parser *p, uint64_t deadline)
{
    static const http_parser_settings settings = {.on_body = on_body,
                                                  .on_message_complete = on_complete};
    http_parser_init(p, HTTP_RESPONSE);
    p->data = r;
    size_t total = 0;
    char buf[4096];
    while (!r->complete) {
        ssize_t n;
        /* An answer in two segments (headers, then body) from a server that leaves Nagle on
           would otherwise wait for our delayed ACK: 40 ms a call. */
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
        if (c->ssl) {
            int rc = SSL_read(c->ssl, buf, sizeof(buf));
            if (rc <= 0) {
                int e = SSL_get_error(c->ssl, rc);
                if (e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SYSCALL)
                    n = 0;
                else if (ssl_retry(c, rc, deadline))
                    continue;
                else
                    return RT_EPROTO;
            } else {
                n = rc;
            }
        } else {
            n = recv(c->fd, buf, sizeof(buf), 0);
            if (n < 0 && errno == ECONNRESET)
                n = 0; /* as closed: a reset before any byte is a kept-alive connection gone */
            if (n < 0) {
                if ((errno != EAGAIN && errno != EINTR) || !wait_fd(c->fd, POLLIN, deadline))
                    return RT_EPROTO;
                continue;
            }
        }
        if (n == 0) { /* the end: a response without a length ends here */
            http_parser_execute(p, &settings, NULL, 0);
            return r->complete ? 0 : total == 0 ? 1 : RT_EPROTO;
        }
        total += (size_t)n;
        size_t used = http_parser_execute(p, &settings, buf, (size_t)n);
        if (r->too_long || (HTTP_PARSER_ERRNO(p) != HPE_OK && HTTP_PARSER_ERRNO(p) != HPE_PAUSED) ||
            (used != (size_t)n && !r->complete))
            return RT_EPROTO;
    }
    return 0;
}

/* A connection: an idle one (*reused) unless fresh, or a new one. */
static int take_conn(rt_httpc_t *h, conn_t *c, bool fresh, bool *reused, uint64_t deadline,
                     char *err, size_t errlen)
{
    pthread_mutex_lock(&h->lock);
    *reused = !fresh && h->nidle > 0;
    if (*reused)
        *c = h->idle[--h->nidle];
    pthread_mutex_unlock(&h->lock);
    return *reused ? 0 : open_conn(h, c, deadline, err, errlen);
}

static void give_back(rt_httpc_t *h, conn_t *c)
{
    pthread_mutex_lock(&h->lock);
    bool kept = h->nidle < h->keep;
    if (kept)
        h->idle[h->nidle++] = *c;
    pthread_mutex_unlock(&h->lock);
    if (!kept)
        conn_close(c);
}

/*
** One request on a connection: a kept-alive one the server let go is replaced once, by a new
** one (the other idle ones may have gone the same way).
*/
static int request(rt_httpc_t *h, const char *req, size_t reqlen, uint64_t deadline, int *status,
                   char **resp, size_t *resplen, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        conn_t c;
        bool reused;
        int rc = take_conn(h, &c, attempt > 0, &reused, deadline, err, errlen);
        if (rc)
            return rc;
        response_t r = {.discard = !resp};
        http_parser p;
        rc = send_all(&c, req, reqlen, deadline) ? read_response(&c, &r, &p, deadline)
             : reused                            ? 1
                                                 : RT_EPROTO;
        if (rc == 0) {
            *status = (int)p.status_code;
            if (http_should_keep_alive(&p))
                give_back(h, &c);
            else
                conn_close(&c);
            if (!resp)
                return 0;
            *resp = r.body ? r.body : calloc(1, 1);
            *resplen = r.len;
            return *resp ? 0 : RT_ENOMEM;
        }
        free(r.body);
        conn_close(&c);
        if (rc != 1 || !reused)
            return fail(err, errlen, "%s: no answer (closed, malformed or timed out)", h->host);
    }
    return fail(err, errlen, "%s: no answer", h->host);
}

int rt_httpc_post(rt_httpc_t *h, const char *body, size_t len, int *status, char **resp,
                  size_t *resplen, char *err, size_t errlen)
{
    uint64_t deadline = rt_mono_ms() + h->timeout_ms;
    char clen[48];
    int cl = snprintf(clen, sizeof(clen), "Content-Length: %zu\r\n\r\n", len);
    /* One write for the request: a body sent apart from its headers costs a round trip. */
    size_t hl = h->head.len + (size_t)cl;
    char *req = malloc(hl + len);
    if (!req)
        return RT_ENOMEM;
    memcpy(req, h->head.data, h->head.len);
    memcpy(req + h->head.len, clen, (size_t)cl);
    memcpy(req + hl, body, len);
    int rc = request(h, req, hl + len, deadline, status, resp, resplen, err, errlen);
    free(req);
    return rc;
}

int rt_httpc_connect(rt_httpc_t *h, char *err, size_t errlen)
{
    conn_t c;
    int rc = open_conn(h, &c, rt_mono_ms() + h->timeout_ms, err, errlen);
    if (rc == 0)
        give_back(h, &c);
    return rc;
}

void rt_httpc_close_idle(rt_httpc_t *h)
{
    pthread_mutex_lock(&h->lock);
    for (unsigned i = 0; i < h->nidle; i++)
        conn_close(&h->idle[i]);
    h->nidle = 0;
    pthread_mutex_unlock(&h->lock);
}

/*
** The HTTP listener and its connections (http.h). A connection is an actor that reads one
** request at a time (keep-alive, bounded by http_request.h and RT_HTTP_BODY_MAX, cut by
** http.request_timeout while incomplete and RT_HTTP_IDLE_MS while idle), answers it, then
** reads the next; with http.tls, through its TLS connection (tls_conn.h, as the MQTT
** connections run theirs), whose handshake the request deadline covers too. The API is the
** admin command layer: a path /api/v1/clients/show/ID?x=y (or a JSON body, http_api.c)
** becomes the request line `clients show ID --x y --json`, answered by the same code as
** rtctl's (rt_admin_exec_*), now or when the worker or the connection actors reply.
**
** Admission. A flood of connections must not take the probes an orchestrator restarts rtd
** by: one address holds at most RT_HTTP_CONNS_PER_ADDR connections, a socket that sends
** nothing is closed after RT_HTTP_FIRST_BYTE_MS, and the last RT_HTTP_PROBE_SLOTS of
** RT_HTTP_CONNS_MAX answer only /healthz and /readyz. The listener leaves the last
** RT_HTTP_FD_RESERVE descriptors to the admin socket (MQTT leaves more, to both).
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admin.h"
#include "auth.h"
#include "broker.h"
#include "c2s.h"
#include "conn.h"
#include "group.h"
#include "http.h"
#include "http_impl.h"
#include "http_request.h"
#include "log.h"
#include "tls.h"
#include "tls_conn.h"

#define MSG_HTTP_TIMER (RT_MSG_USER + 40) /* the request or idle deadline */
#define MSG_HTTP_SERVE (RT_MSG_USER + 41) /* a file's next pieces (http_upload.c) */
#define HTTP_ACCEPTS_PER_TURN 64
/* A file served goes out this much a turn, and waits while the socket holds this much unsent:
   a download costs the connection a piece in memory, not the file. */
#define HTTP_SERVE_PIECE (64 * 1024)
#define HTTP_SERVE_TURN (4 * HTTP_SERVE_PIECE)
#define HTTP_UPLOAD_PROGRESS (16 * 1024) /* an upload's least bytes per http.request_timeout */

static struct {
    rt_conf_t conf; /* http's part, read by every connection */
    rt_pid_t sup;
    _Atomic unsigned conns;
    /* Connections by address: the listener counts at accept, connections uncount at exit
       (another thread), under lock; at most RT_HTTP_CONNS_MAX addresses have any. */
    pthread_mutex_t lock;
    struct {
        rt_auth_addr_t addr;
        uint32_t count; /* 0: a free entry */
    } by_addr[RT_HTTP_CONNS_MAX];
} H = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Counts a connection from a; false (not counted) when a has RT_HTTP_CONNS_PER_ADDR. */
static bool addr_take(const rt_auth_addr_t *a)
{
    pthread_mutex_lock(&H.lock);
    size_t free_at = RT_HTTP_CONNS_MAX, i;
    for (i = 0; i < RT_HTTP_CONNS_MAX; i++) {
        if (H.by_addr[i].count && memcmp(&H.by_addr[i].addr, a, sizeof(*a)) == 0)
            break;
        if (!H.by_addr[i].count && free_at == RT_HTTP_CONNS_MAX)
            free_at = i;
    }
    if (i == RT_HTTP_CONNS_MAX && free_at < RT_HTTP_CONNS_MAX) {
        i = free_at;
        H.by_addr[i].addr = *a;
    }
    /* No entry at all would mean RT_HTTP_CONNS_MAX addresses with connections. */
    bool ok = i < RT_HTTP_CONNS_MAX && H.by_addr[i].count < RT_HTTP_CONNS_PER_ADDR;
    if (ok)
        H.by_addr[i].count++;
    pthread_mutex_unlock(&H.lock);
    return ok;
}

static void addr_give(const rt_auth_addr_t *a)
{
    pthread_mutex_lock(&H.lock);
    for (size_t i = 0; i < RT_HTTP_CONNS_MAX; i++)
        if (H.by_addr[i].count && memcmp(&H.by_addr[i].addr, a, sizeof(*a)) == 0) {
            H.by_addr[i].count--;
            break;
        }
    pthread_mutex_unlock(&H.lock);
}

/* What the listener hands a connection it admitted. */
typedef struct {
    int fd;
    bool probe_only; /* in one of the RT_HTTP_PROBE_SLOTS */
    rt_auth_addr_t addr;
} http_accept_t;

/* ---- A connection ---- */

typedef struct {
    rt_sock_t *sock;
    rt_tls_conn_t tls; /* tls.ssl NULL: plain HTTP */
    uint8_t *in; /* heap: bytes read (decrypted), not yet answered */
    size_t inlen, incap;
    rt_admin_exec_t exec;   /* an API request waiting for the worker or connection actors */
    rt_ref_t timer;         /* the request's or the idle deadline */
    bool keep_alive;        /* of the request being answered */
    bool text;              /* the answer waited for is text (metrics), not JSON */
    bool closing;           /* the answer was the last: the actor exits */
    char *stream;           /* heap: an event stream's command line, run every stream_ms */
    size_t stream_len;
    uint32_t stream_ms;
    bool streaming;         /* the stream's head went out with its first event */
    bool tracing;           /* a trace's events are being sent (trace_part) */
    size_t pending;         /* bytes of the request whose answer the admin layer owes */
    rt_auth_addr_t addr;    /* counted in H.by_addr */
    bool probe_only;        /* answers /healthz and /readyz only */
    bool heard;             /* the client has sent something: RT_HTTP_FIRST_BYTE_MS is over */
    bool cors;              /* an upload's answer: any page may use it (web clients upload) */
    rt_http_put_t put;      /* an upload's body being written */
    rt_http_get_t get;      /* a file being served; its request's bytes are pending */
} http_conn_t;

/* Ends the connection: what was written goes out, then the socket closes. */
static void finish(rt_actor_t *self, http_conn_t *k)
{
    k->closing = true;
    rt_exit(self, RT_REASON_NORMAL);
}

static const char *reason_phrase(int code)
{
    switch (code) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 201:
        return "Created";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 431:
        return "Request Header Fields Too Large";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return code >= 500 ? "Internal Server Error" : "Error";
    }
}

/*
** Output goes through TLS when the listener has it. A failed write is not reported: the
** socket's failure shows at its next read, and an answer lost to memory leaves the client
** to its timeout.
*/
static void out(http_conn_t *k, const void *p, size_t n)
{
    if (k->tls.ssl)
        rt_tls_conn_write(&k->tls, p, n);
    else
        rt_sock_write(k->sock, p, n);
}

/*
** Every answer's security headers. The dashboard (www/) runs under this policy: its script
** and style come from its own files, it talks to this origin only, and no other page may
** frame it; an API answer has nothing a policy could loosen.
*/
#define SECURITY_HEADERS                                                                        \
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "       \
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "           \
    "frame-ancestors 'none'\r\n"                                                                \
    "X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"

/* An upload's answers (and a browser's preflight before its PUT): web clients upload from
   their own origin, and what they send and fetch is the user's, with no credentials. */
#define CORS_HEADERS                                                                               \
    "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: GET, HEAD, PUT, "             \
    "OPTIONS\r\nAccess-Control-Allow-Headers: Content-Type\r\nAccess-Control-Max-Age: "            \
    "86400\r\n"

/* An answer's head and body; allow: the methods a 405 names. */
static void respond_allow(http_conn_t *k, int code, const char *type, const char *body, size_t len,
                          const char *allow)
{
    char head[1024];
    int n =
        snprintf(head, sizeof(head),
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                 "Cache-Control: no-store\r\n" SECURITY_HEADERS "%s%s%s%s%sConnection: %s\r\n\r\n",
                 code, reason_phrase(code), type, len, k->cors ? CORS_HEADERS : "",
                 code == 401 ? "WWW-Authenticate: Bearer\r\n" : "", allow ? "Allow: " : "",
                 allow ? allow : "", allow ? "\r\n" : "", k->keep_alive ? "keep-alive" : "close");
    RT_ASSERT(n > 0 && (size_t)n < sizeof(head));
    out(k, head, (size_t)n);
    if (len)
        out(k, body, len);
}

static void respond_raw(http_conn_t *k, int code, const char *type, const char *body, size_t len)
{
    respond_allow(k, code, type, body, len, NULL);
}

/* An error as JSON: {"error": "..."} (the admin layer's own errors are already that). */
static void respond_error_allow(http_conn_t *k, int code, const char *why, const char *allow)
{
    char body[512];
    size_t n = 0;
    n += (size_t)snprintf(body, sizeof(body), "{\"error\": \"");
    for (const char *p = why; *p && n < sizeof(body) - 8; p++) {
        if (*p == '"' || *p == '\\')
            body[n++] = '\\';
        body[n++] = (*p >= 0x20) ? *p : ' ';
    }
    n += (size_t)snprintf(body + n, sizeof(body) - n, "\"}\n");
    respond_allow(k, code, "application/json", body, n, allow);
}

static void respond_error(http_conn_t *k, int code, const char *why)
{
    respond_error_allow(k, code, why, NULL);
}

/* The admin layer's answer to an API request (rt_admin_answer_fn). */
/* An event stream's answer: one Server-Sent Event named by the command, its JSON on one line. */
static void stream_event(http_conn_t *k, int code, const char *body, size_t len)
{
    char head[96];
    size_t word = strcspn(k->stream + 1, "\"");
    int n = snprintf(head, sizeof(head), "event: %.*s\ndata: ", (int)(word < 40 ? word : 40),
                     k->stream + 1);
    out(k, head, (size_t)n);
    if (code != 200) {
        out(k, "{\"error\": true}", 15);
    } else {
        for (size_t i = 0, start = 0; i <= len; i++)
            if (i == len || body[i] == '\n') { /* compact JSON; its last newline dropped */
                out(k, body + start, i - start);
                start = i + 1;
            }
    }
    out(k, "\n\n", 2);
}

/*
** A trace's parts (206) and its end: each line (a JSON object) one `event: trace` Server-Sent
** Event, an empty part a comment that keeps the connection alive; the connection ends with it.
*/
static void trace_part(http_conn_t *k, int code, const char *body, size_t len)
{
    if (!k->tracing) {
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Cache-Control: no-store\r\n" SECURITY_HEADERS
                                   "Connection: close\r\n\r\n";
        out(k, head, sizeof(head) - 1);
        k->tracing = true;
    }
    if (!len)
        out(k, ": alive\n\n", 9);
    for (size_t start = 0; start < len;) {
        const char *nl = memchr(body + start, '\n', len - start);
        size_t end = nl ? (size_t)(nl - body) : len;
        out(k, "event: trace\ndata: ", 19);
        out(k, body + start, end - start);
        out(k, "\n\n", 2);
        start = end + 1;
    }
    if (code != 206)
        k->keep_alive = false;
}

static void respond_admin(void *ctx, int code, const char *body, size_t len)
{
    http_conn_t *k = ctx;
    if (code == 206 || k->tracing) {
        trace_part(k, code, body, len);
        return;
    }
    if (k->stream && (k->streaming || code == 200)) {
        if (!k->streaming) {
            static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                       "Cache-Control: no-store\r\n" SECURITY_HEADERS
                                       "Connection: keep-alive\r\n\r\n";
            out(k, head, sizeof(head) - 1);
            k->streaming = true;
        }
        stream_event(k, code, body, len);
        return;
    }
    if (k->stream) { /* the first answer is an error: an ordinary answer, and the end */
        k->keep_alive = false;
        k->closing = true;
    }
    respond_raw(k, code, k->text ? "text/plain; version=0.0.4; charset=utf-8" : "application/json",
                body, len);
}

/* http.request_timeout: a request must arrive whole within it (slowloris). */
static uint64_t request_ms(void)
{
    return (uint64_t)H.conf.http.request_timeout * 1000;
}

static void arm_timer(rt_actor_t *self, http_conn_t *k, uint64_t ms)
{
    if (k->timer)
        rt_cancel_timer(k->timer);
    k->timer = 0;
    rt_send_after_tag(ms, rt_self(self), MSG_HTTP_TIMER, &k->timer);
}

/* Ready: every listener accepting, MQTT's and XMPP's (the store and sinks start before them,
   and stop after). */
static bool ready(void)
{
    rt_listener_info_t ls[RT_CONF_ALL_LISTENERS];
    size_t n = rt_broker ? rt_broker_listeners(ls, RT_CONF_ALL_LISTENERS) : 0;
    if (!n)
        return false;
    for (size_t i = 0; i < n && i < RT_CONF_ALL_LISTENERS; i++)
        if (!ls[i].running)
            return false;
    return true;
}

/* Runs the stream's command once more (the line is split in place: a copy each time). */
static void stream_tick(rt_actor_t *self, http_conn_t *k)
{
    static _Thread_local char line[RT_HTTP_LINE_MAX + 8];
    memcpy(line, k->stream, k->stream_len + 1);
    if (rt_sock_pending(k->sock) > RT_ADMIN_OUT_MAX) { /* a reader that stopped reading */
        finish(self, k);
        return;
    }
    /* Streams are for reading: no command that changes rtd, nor one for the admin role alone
       (a trace streams by itself; a read key must not run rules on its payloads). */
    k->exec.via = RT_ADMIN_VIA_HTTP;
    if (!rt_admin_exec_start(self, &k->exec, line, k->stream_len,
                             RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE, respond_admin, k))
        return;
    if (k->closing)
        rt_exit(self, RT_REASON_NORMAL);
    else
        arm_timer(self, k, k->stream_ms);
}

/*
** GET /api/v1/stream/COMMAND?every=S&...: Server-Sent Events, one event every S seconds
** (1 by default, 1 to 60) with the command's JSON answer (`event: top`, `data: {...}`), for
** as long as the client reads. Commands that change rtd are refused.
*/
static bool start_stream(rt_actor_t *self, http_conn_t *k, const char *path, const char *query)
{
    char rest[RT_HTTP_TARGET_MAX] = "", line[RT_HTTP_LINE_MAX + 8];
    long every = 1;
    /* every= is the stream's own; the rest of the query goes to the command. */
    for (const char *p = query; p && *p;) {
        const char *end = strchr(p, '&');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 6 && strncmp(p, "every=", 6) == 0)
            every = strtol(p + 6, NULL, 10);
        else
            snprintf(rest + strlen(rest), sizeof(rest) - strlen(rest), "%s%.*s",
                     rest[0] ? "&" : "", (int)n, p);
        p += n + (end != NULL);
    }
    char why[64];
    size_t len = rt__http_api_line(path, rest, NULL, 0, line, why, sizeof(why));
    if (!len || every < 1 || every > 60) {
        respond_error(k, 400, "not a stream: /api/v1/stream/COMMAND?every=1..60");
        return true;
    }
    k->stream = rt_strndup(self, line, len);
    if (!k->stream) {
        respond_error(k, 500, "out of memory");
        return true;
    }
    k->stream_len = len;
    k->stream_ms = (uint32_t)every * 1000;
    k->inlen = 0; /* nothing after a stream's request is read as another */
    stream_tick(self, k);
    return false;
}

/* Whether a Content-Type is JSON's ("application/json", with parameters or not). */
static bool is_json(const char *type)
{
    type += strspn(type, " \t");
    return strncasecmp(type, "application/json", 16) == 0 && strchr("; \t", type[16]);
}

/*
** An API request's admin line from its path, its query and (POST or PUT) its JSON body;
** 0 when the request was answered with its error.
*/
static size_t api_request_line(http_conn_t *k, const rt_http_request_t *req, bool post,
                               const char *path, const char *query, char *line)
{
    const char *json = post && req->body_len ? (const char *)k->in + req->body_off : NULL;
    if (json && !is_json(req->content_type)) {
        respond_error(k, 415, "a request body must be JSON (Content-Type: application/json)");
        return 0;
    }
    char why[512];
    size_t len = rt__http_api_line(path, query, json, req->body_len, line, why, sizeof(why));
    if (!len)
        respond_error(k, 400, why);
    return len;
}

/*
** Whether an API request's command may be answered: one that names no command is 404, and
** one that changes rtd sent without POST (or PUT) is 405, as a GET must be safe to repeat
** (a link or a prefetch cannot kick a client). false when answered so.
*/
static bool api_method_fits(http_conn_t *k, const char *line, size_t len, bool post)
{
    unsigned flags;
    int rc = rt_admin_lookup(line, len, &flags);
    if (rc == RT_ENOTFOUND) {
        respond_error(k, 404, "no such command (GET /api/v1/help lists them)");
        return false;
    }
    if (rc == 0 && (flags & RT_ADMIN_CHANGES) && !post) {
        respond_error_allow(k, 405, "this command changes rtd: send it with POST", "POST");
        return false;
    }
    return true; /* the admin layer answers what does not split, as rtctl's would be */
}

/* The request just answered leaves the buffer; the connection goes on or ends. */
static void request_done(rt_actor_t *self, http_conn_t *k, size_t used)
{
    memmove(k->in, k->in + used, k->inlen - used);
    k->inlen -= used;
    if (!k->keep_alive) {
        finish(self, k);
        return;
    }
    arm_timer(self, k, k->inlen ? request_ms() : RT_HTTP_IDLE_MS);
}

/* ---- Uploads (http_upload.c) ---- */

/* An upload's refusal ends the connection: the body it came with is not read. */
static void upload_refuse(rt_actor_t *self, http_conn_t *k, int code, const char *why)
{
    k->keep_alive = false;
    respond_error(k, code, why);
    finish(self, k);
}

/* A GET, HEAD or preflight of an uploaded file: true (answered, or being served). */
static bool upload_answer(http_conn_t *k, const rt_http_request_t *req, const char *path)
{
    k->cors = true;
    if (strcmp(req->method, "OPTIONS") == 0) {
        respond_raw(k, 200, "text/plain", "", 0);
        return true;
    }
    bool head = strcmp(req->method, "HEAD") == 0;
    if (!head && strcmp(req->method, "GET") != 0) {
        respond_error_allow(k, 405, "GET or HEAD a file; PUT only into a slot",
                            "GET, HEAD, PUT, OPTIONS");
        return true;
    }
    char hdr[1024];
    const char *why = "";
    int code = rt__http_get_start(&H.conf, path, &k->get, hdr, sizeof(hdr), &why);
    if (code != 200) {
        respond_error(k, code, why);
        return true;
    }
    out(k, hdr, strlen(hdr));
    const char *end =
        k->keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    out(k, end, strlen(end));
    if (head)
        rt__http_get_end(&k->get);
    return true;
}

/*
** A file's next pieces, as the socket takes them: true when the file is all out (its request
** is then done). It goes on at the socket's next writable event, or at once (MSG_HTTP_SERVE)
** when this turn's share went out and the socket kept little of it.
*/
static bool serve_more(rt_actor_t *self, http_conn_t *k)
{
    /* On the connection's heap for the turn: charged to it, and gone while it waits. */
    uint8_t *piece = k->get.left ? rt_alloc(self, HTTP_SERVE_PIECE, RT_OBJ_LEAF) : NULL;
    if (k->get.left && !piece) { /* retried at the socket's next event, or cut by the timer */
        arm_timer(self, k, request_ms());
        return false;
    }
    for (size_t sent = 0; k->get.left; sent += HTTP_SERVE_PIECE) {
        if (rt_sock_pending(k->sock) > HTTP_SERVE_TURN || sent >= HTTP_SERVE_TURN) {
            /* More at the socket's next writable event, or (little was left unsent) at once;
               a reader that stopped is dropped by the timer. */
            if (sent >= HTTP_SERVE_TURN && rt_sock_pending(k->sock) <= HTTP_SERVE_TURN)
                rt_send(rt_self(self), MSG_HTTP_SERVE, NULL, 0);
            arm_timer(self, k, request_ms());
            rt_free(self, piece);
            return false;
        }
        ssize_t n = rt__http_get_read(&k->get, piece, HTTP_SERVE_PIECE);
        if (n < 0) { /* the head promised more than there is: only closing says so */
            rt__http_get_end(&k->get);
            rt_free(self, piece);
            finish(self, k);
            return false;
        }
        out(k, piece, (size_t)n);
    }
    rt_free(self, piece);
    rt__http_get_end(&k->get);
    return true;
}

/* The PUT's body came whole: the upload actor keeps it (put_kept answers). false when the
   connection ended. */
static bool put_finish(rt_actor_t *self, http_conn_t *k)
{
    const char *why = "";
    int code = rt__http_put_keep(&k->put, &why);
    if (code) {
        upload_refuse(self, k, code, why);
        return false;
    }
    return true;
}

/* Body bytes of the PUT into its file: how many it took, SIZE_MAX when the connection ended. */
static size_t put_body(rt_actor_t *self, http_conn_t *k, const void *data, size_t len)
{
    const char *why = "";
    size_t used = rt__http_put_data(&k->put, data, len, &why);
    if (used == SIZE_MAX) {
        rt__http_put_abort(&k->put);
        upload_refuse(self, k, 500, why);
        return SIZE_MAX;
    }
    /* The deadline is for progress: a big file over a slow link takes long, but each
       http.request_timeout must bring HTTP_UPLOAD_PROGRESS bytes (or the end), so a trickle
       cannot hold one of the listener's connections for as long as it likes. */
    k->put.progress += used;
    if (k->put.progress >= HTTP_UPLOAD_PROGRESS || !k->put.left) {
        k->put.progress = 0;
        arm_timer(self, k, request_ms());
    }
    if (!k->put.left && !put_finish(self, k))
        return SIZE_MAX;
    return used;
}

/*
** A PUT into an upload slot: once its head is read, its body goes to the file as it comes.
** 1: taken (or refused), 0: not an upload's, RT_EAGAIN: the head is not whole yet.
*/
static int put_begin(rt_actor_t *self, http_conn_t *k)
{
    static const char put[] = "PUT /upload/";
    if (k->probe_only || k->exec.cookie || k->get.on || k->put.on || k->put.keeping ||
        k->inlen < sizeof(put) - 1 || memcmp(k->in, put, sizeof(put) - 1) != 0)
        return 0;
    rt_http_request_t req;
    const char *why = "bad request";
    int rc = rt_http_parse_head(k->in, k->inlen, &req, &why);
    if (rc == RT_EAGAIN)
        return RT_EAGAIN;
    char path[RT_HTTP_TARGET_MAX];
    snprintf(path, sizeof(path), "%s", req.target);
    path[strcspn(path, "?")] = 0;
    if (!rc && !rt__http_upload_path(&H.conf, path))
        return 0;
    k->cors = true;
    if (!rc)
        rc = rt__http_put_start(&H.conf, path, req.content_length, req.content_type, &k->put, &why);
    if (rc) {
        upload_refuse(self, k, rc, why);
        return 1;
    }
    k->keep_alive = req.keep_alive;
    arm_timer(self, k, request_ms()); /* the body's first piece is due from here */
    memmove(k->in, k->in + req.len, k->inlen - req.len);
    k->inlen -= req.len;
    size_t used = put_body(self, k, k->in, k->inlen);
    if (used != SIZE_MAX) { /* what follows the body is the next request */
        memmove(k->in, k->in + used, k->inlen - used);
        k->inlen -= used;
    }
    return 1;
}

/* Answers the request: true when answered now, false when the admin layer answers later. */
static bool handle(rt_actor_t *self, http_conn_t *k, const rt_http_request_t *req)
{
    char path[RT_HTTP_TARGET_MAX];
    snprintf(path, sizeof(path), "%s", req->target);
    char *query = strchr(path, '?');
    if (query)
        *query++ = 0;
    bool get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
    /* PUT is POST's synonym: clients that send JSON bodies tend to pick either. */
    bool post = strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0;
    k->text = false;
    k->cors = false;
    if (k->probe_only) /* one answer, then the slot is free for the next probe */
        k->keep_alive = false;
    if (k->probe_only && strcmp(path, "/healthz") != 0 && strcmp(path, "/readyz") != 0) {
        respond_error(k, 503, "too many connections: this one serves /healthz and /readyz only");
        return true;
    }
    if (strcmp(path, "/healthz") == 0) {
        respond_raw(k, 200, "application/json", "{\"status\": \"ok\"}\n", 17);
        return true;
    }
    if (strcmp(path, "/readyz") == 0) {
        bool r = ready();
        respond_raw(k, r ? 200 : 503, "application/json",
                    r ? "{\"ready\": true}\n" : "{\"ready\": false}\n", r ? 16 : 17);
        return true;
    }
    if (rt__http_upload_path(&H.conf, path))
        return upload_answer(k, req, path);
    bool metrics = strcmp(path, "/metrics") == 0;
    bool api = strncmp(path, "/api/v1/", 8) == 0;
    if (!metrics && !api && get) {
        /* The dashboard's files need no key: they hold no data; the API calls they make do. */
        const char *name = strcmp(path, "/") == 0           ? "index.html"
                           : strncmp(path, "/ui/", 4) == 0 ? path + 4
                                                           : NULL;
        for (const rt_http_file_t *f = rt_http_www; name && f->name; f++)
            if (strcmp(f->name, name) == 0) {
                respond_raw(k, 200, f->type, (const char *)f->bytes, f->len);
                return true;
            }
    }
    if (!metrics && !api) {
        respond_error(k, 404, "no such path (/, /healthz, /readyz, /metrics, /api/v1/...)");
        return true;
    }
    if (!get && !post) {
        respond_error_allow(k, 405, "GET, or POST (PUT) for commands that change rtd",
                            "GET, HEAD, POST, PUT");
        return true;
    }
    rt_http_role_t role = rt_http_key_role(req->api_key, k->exec.who, sizeof(k->exec.who));
    if (!(metrics && H.conf.http.metrics_public) && role == RT_HTTP_ROLE_NONE) {
        respond_error(k, 401, req->api_key[0] ? "unknown API key" : "an API key is needed "
                                                                    "(Authorization: Bearer KEY)");
        return true;
    }
    static _Thread_local char line[RT_HTTP_LINE_MAX + 8];
    size_t len;
    if (api && strncmp(path + 8, "stream/", 7) == 0 && get)
        return start_stream(self, k, path + 15, query);
    if (metrics) {
        k->text = true;
        len = (size_t)snprintf(line, sizeof(line), "metrics prometheus");
    } else if (!(len = api_request_line(k, req, post, path + 8, query, line)) ||
               !api_method_fits(k, line, len, post)) {
        return true;
    }
    /* Commands that change rtd need the admin role (and came with POST); a trace, which
       shows clients' traffic, the admin role. */
    unsigned refuse = role == RT_HTTP_ROLE_ADMIN ? 0 : RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE;
    k->exec.via = RT_ADMIN_VIA_HTTP; /* who asks, for the log of changes */
    rt_conn_format_peer(rt_sock_fd(k->sock), k->exec.peer, sizeof(k->exec.peer));
    return rt_admin_exec_start(self, &k->exec, line, len, refuse, respond_admin, k);
}

/* Answers the requests read, one at a time, until one waits for the admin layer. */
static void answer_requests(rt_actor_t *self, http_conn_t *k)
{
    while (!k->exec.cookie && k->inlen && !k->closing && !k->put.on && !k->put.keeping &&
           !k->get.on) {
        int put = put_begin(self, k);
        if (put == RT_EAGAIN)
            return;
        if (put)
            continue;
        rt_http_request_t req;
        const char *why = "bad request";
        int rc = rt_http_parse_request(k->in, k->inlen, RT_HTTP_BODY_MAX, &req, &why);
        if (rc == RT_EAGAIN)
            return;
        if (rc != 0) {
            k->keep_alive = false;
            respond_error(k, rc, why);
            finish(self, k);
            return;
        }
        k->keep_alive = req.keep_alive;
        if (!handle(self, k, &req) || (k->get.on && !serve_more(self, k))) {
            k->pending = req.len; /* dropped when the answer comes, or the file is out */
            return;
        }
        request_done(self, k, req.len);
    }
}

/* Takes bytes of requests (decrypted, over TLS); false when the connection ends. */
static bool take(rt_actor_t *self, http_conn_t *k, const void *data, size_t len)
{
    if (k->stream || k->tracing)
        return true; /* an event stream reads nothing more from its client */
    if (k->put.on) {
        size_t used = put_body(self, k, data, len);
        if (used == SIZE_MAX)
            return false;
        data = (const uint8_t *)data + used;
        len -= used;
        if (!len)
            return true;
    }
    /* A whole request is at most its head and body: a client that sends more before its
       answer (pipelining past that) waits in the kernel. */
    if (k->inlen + len > RT_HTTP_HEAD_MAX + RT_HTTP_BODY_MAX + 64 * 1024 ||
        rt_grow_on(self, &k->in, &k->incap, k->inlen + len, 1, 512, RT_OBJ_LEAF)) {
        k->keep_alive = false;
        respond_error(k, 413, "request too large");
        finish(self, k);
        return false;
    }
    /* The request's deadline starts at its first byte; the handshake's bytes do not move
       it, so the handshake and the first request share the deadline set at accept. */
    if (!k->inlen)
        arm_timer(self, k, request_ms());
    memcpy(k->in + k->inlen, data, len);
    k->inlen += len;
    /* An upload's body must not gather here: once its head is in, the rest goes to its file. */
    return put_begin(self, k) != 1 || !k->closing;
}

typedef struct {
    rt_actor_t *self;
    http_conn_t *k;
} tls_reader_t;

static bool tls_plain(void *ctx, uint8_t *p, size_t n)
{
    tls_reader_t *r = ctx;
    return take(r->self, r->k, p, n);
}

static void log_tls(const http_conn_t *k, const char *event, const char *fmt, const char *what)
{
    char peer[64];
    rt_conn_format_peer(rt_sock_fd(k->sock), peer, sizeof(peer));
    rt_log(RT_LOG_INFO, event, fmt, peer, what);
}

/* Ciphertext from the socket; false when the connection ends. */
static bool tls_input(rt_actor_t *self, http_conn_t *k, const uint8_t *p, size_t n)
{
    tls_reader_t reader = {self, k};
    char why[RT_TLS_WHY_LEN];
    int rc = rt_tls_conn_input(&k->tls, p, n, tls_plain, &reader, why, sizeof(why));
    if (rc == RT_EPROTO && !rt_tls_conn_established(&k->tls)) {
        log_tls(k, "tls.handshake_failed", "peer=%s listener=http reason=%s", why);
        atomic_fetch_add_explicit(&rt_broker->stats.tls_failed, 1, memory_order_relaxed);
    } else if (rc == RT_EPROTO) {
        log_tls(k, "tls.error", "peer=%s listener=http reason=%s", why);
    }
    if (rc && !k->closing)
        finish(self, k);
    return !k->closing;
}

static void on_readable(rt_actor_t *self, http_conn_t *k)
{
    for (int reads = 0; reads < 16 && !k->closing; reads++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(k->sock, &data, &len);
        if (rc == RT_EAGAIN)
            break;
        if (rc != 0) {
            finish(self, k);
            return;
        }
        if (!k->heard) { /* the request's deadline replaces the first byte's */
            k->heard = true;
            arm_timer(self, k, request_ms());
        }
        if (!(k->tls.ssl ? tls_input(self, k, data, len) : take(self, k, data, len)))
            return;
    }
    answer_requests(self, k);
}

static void on_timer(rt_actor_t *self, http_conn_t *k)
{
    k->timer = 0;
    if (k->put.keeping) { /* the disk holds the sync up: the client is told by the close */
        finish(self, k);
        return;
    }
    if (k->put.on) {
        rt__http_put_abort(&k->put);
        upload_refuse(self, k, 408, "the upload stalled");
        return;
    }
    if (k->get.on) { /* a reader that stopped reading */
        finish(self, k);
        return;
    }
    if (k->stream) {
        if (!k->exec.cookie)
            stream_tick(self, k);
        return;
    }
    if (k->exec.cookie)
        return; /* answering: the admin layer bounds its own wait */
    if (k->tls.ssl && !rt_tls_conn_established(&k->tls))
        log_tls(k, "tls.handshake_failed", "peer=%s listener=http reason=%s", "timeout");
    if (k->inlen) {
        k->keep_alive = false;
        respond_error(k, 408, "the request did not arrive in time");
    }
    finish(self, k);
}

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    http_conn_t *k = state;
    const http_accept_t *a = arg;
    if (rt_sock_adopt(self, a->fd, &k->sock) != 0)
        return RT_EINVAL; /* the listener closes fd and uncounts it */
    k->exec.sock = k->sock;
    k->addr = a->addr;
    k->probe_only = a->probe_only;
    atomic_fetch_add(&H.conns, 1);
    /* From here the socket is the actor's: a failure ends the actor, which closes it. */
    if (H.conf.http.where.tls_on &&
        rt_tls_conn_attach(&k->tls, rt_tls_accept(RT_TLS_HTTP), k->sock) != 0) {
        finish(self, k);
        return 0;
    }
    uint64_t first = request_ms() < RT_HTTP_FIRST_BYTE_MS ? request_ms() : RT_HTTP_FIRST_BYTE_MS;
    arm_timer(self, k, first);
    return 0;
}

/* The upload actor kept the file (or could not): the PUT is answered, and what was read after
   it goes on. */
static void put_kept(rt_actor_t *self, http_conn_t *k, const rt_msg_t *m)
{
    const char *why = "";
    int code = rt__http_put_kept(&k->put, m, &why);
    if (code != 201) {
        upload_refuse(self, k, code, why);
        return;
    }
    respond_raw(k, 201, "application/json", "{\"stored\": true}\n", 17);
    request_done(self, k, 0);
    if (!k->closing)
        answer_requests(self, k);
}

/* A file is all out: its request is done, and the next one read goes on. */
static void file_served(rt_actor_t *self, http_conn_t *k)
{
    request_done(self, k, k->pending);
    k->pending = 0;
    if (!k->closing)
        answer_requests(self, k);
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    http_conn_t *k = state;
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        uint32_t events = ((const rt_sock_event_t *)(const void *)m->data)->events;
        if ((events & RT_SOCK_WRITABLE) && k->get.on && serve_more(self, k))
            file_served(self, k);
        if ((events & RT_SOCK_READABLE) && !k->closing)
            on_readable(self, k);
        break;
    }
    case MSG_HTTP_TIMER:
        on_timer(self, k);
        break;
    case MSG_HTTP_SERVE:
        if (k->get.on && serve_more(self, k))
            file_served(self, k);
        break;
    case RT_MSG_C2S_UPLOAD_KEPT:
        if (k->put.keeping)
            put_kept(self, k, m);
        break;
    default:
        if (!rt_admin_exec_message(&k->exec, m, respond_admin, k))
            break;
        if (k->stream) {
            if (k->closing)
                rt_exit(self, RT_REASON_NORMAL);
            else
                arm_timer(self, k, k->stream_ms);
            break;
        }
        request_done(self, k, k->pending);
        answer_requests(self, k);
        break;
    }
}

static void conn_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    http_conn_t *k = state;
    if (k->timer)
        rt_cancel_timer(k->timer);
    if (k->tls.ssl)
        rt_tls_conn_close(&k->tls); /* the last answer, then close_notify */
    rt_admin_exec_free(&k->exec);
    rt__http_put_abort(&k->put);
    rt__http_get_end(&k->get);
    atomic_fetch_sub(&H.conns, 1);
    addr_give(&k->addr);
}

/* A turn's answers go out as one TLS record (tls_conn.h). */
static void conn_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    http_conn_t *k = state;
    if (k->tls.ssl)
        rt_tls_conn_flush(&k->tls);
}

static const char *conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case MSG_HTTP_TIMER:
        return "deadline";
    case MSG_HTTP_SERVE:
        return "serve";
    case RT_MSG_C2S_UPLOAD_KEPT:
        return "upload_kept";
    case RT_ADMIN_MSG_JOB_DONE:
        return "job_done";
    default:
        return "gather_reply";
    }
}

static const rt_actor_type_t http_conn_type = {
    .name = "http_conn",
    .state_size = sizeof(http_conn_t),
    .init = conn_init,
    .handle = conn_handle,
    .terminate = conn_terminate,
    .tag_name = conn_tag_name,
    .turn_end = conn_turn_end,
};

/* ---- The listener ---- */

typedef struct {
    rt_sock_t *sock;
} http_listener_t;

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    (void)arg;
    http_listener_t *l = state;
    const rt_listen_t *w = &H.conf.http.where;
    return rt_tcp_listen(self, w->host, w->port, 1024, &l->sock);
}

static void listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self;
    http_listener_t *l = state;
    if (m->tag != RT_MSG_SOCKET)
        return;
    for (int i = 0; i < HTTP_ACCEPTS_PER_TURN; i++) {
        http_accept_t a = {.fd = -1};
        struct sockaddr_storage peer;
        if (rt_sock_accept(l->sock, &a.fd, &peer) != 0)
            return; /* none waiting; or out of descriptors: the next event retries */
        unsigned conns = atomic_load(&H.conns);
        a.probe_only = conns >= RT_HTTP_CONNS_MAX - RT_HTTP_PROBE_SLOTS;
        bool counted = false;
        rt_pid_t pid;
        if (conns >= RT_HTTP_CONNS_MAX || rt_fd_in_reserve(a.fd, RT_HTTP_FD_RESERVE) ||
            rt_auth_addr_from_sockaddr(&peer, &a.addr) != 0 || !(counted = addr_take(&a.addr)) ||
            rt_spawn(&http_conn_type, &a, &pid) != 0) {
            if (counted)
                addr_give(&a.addr);
            close(a.fd);
        }
    }
}

static const rt_actor_type_t http_listener_type = {
    .name = "http_listener",
    .state_size = sizeof(http_listener_t),
    .init = listener_init,
    .handle = listener_handle,
};

static int listener_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    (void)arg;
    return rt_spawn_opt(&http_listener_type, NULL, opts, out);
}

int rt_http_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen)
{
    if (!conf->http.on)
        return 0;
    H.conf = *conf;
    H.sup = sup;
    if (conf->http.api_keys_file[0] &&
        rt_http_keys_load(conf->http.api_keys_file, err, errlen) != 0)
        return RT_EINVAL;
    const char *warning = rt_http_conf_warning(conf);
    if (warning)
        rt_log(RT_LOG_WARNING, "http.no_api_keys", "listener=%s:%d %s", conf->http.where.host,
               conf->http.where.port, warning);
    rt_child_spec_t listener = {.name = "http", .start = listener_start, .restart = RT_PERMANENT};
    rt_pid_t group;
    int rc = rt_group_start(sup, RT_HTTP_GROUP, RT_PERMANENT, &group);
    if (rc == 0)
        rc = rt_supervisor_start_child(group, &listener, NULL);
    if (rc) {
        snprintf(err, errlen, "http %s:%d: cannot listen: %s", conf->http.where.host,
                 conf->http.where.port, rt_strerror(rc));
        rt_group_stop(sup, RT_HTTP_GROUP);
        return rc;
    }
    rt_log(RT_LOG_INFO, "http.started",
           "listener=%s:%d tls=%s api_keys_file=%s metrics_public=%s", conf->http.where.host,
           conf->http.where.port, conf->http.where.tls_on ? "true" : "false",
           conf->http.api_keys_file[0] ? conf->http.api_keys_file : "-",
           conf->http.metrics_public ? "true" : "false");
    rt_admin_set_apikeys(&rt__http_apikeys);
    return 0;
}

void rt_http_stop(void)
{
    if (!H.conf.http.on)
        return;
    rt_admin_set_apikeys(NULL);
    rt_group_stop(H.sup, RT_HTTP_GROUP);
}

const char *rt_http_conf_warning(const rt_conf_t *conf)
{
    if (!conf->http.on || conf->http.api_keys_file[0])
        return NULL;
    return conf->http.metrics_public
               ? "no http.api_keys_file: /api/v1 and the dashboard refuse every request (401); "
                 "only /healthz, /readyz and /metrics answer. Make a key with `rtd apikey NAME "
                 "admin -f FILE` and set api_keys_file = FILE in the http table"
               : "no http.api_keys_file: /api/v1, /metrics and the dashboard refuse every "
                 "request (401); only /healthz and /readyz answer. Make a key with `rtd apikey "
                 "NAME admin -f FILE` and set api_keys_file = FILE in the http table";
}

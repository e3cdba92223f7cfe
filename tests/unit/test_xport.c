/*
** The transport (actors/transport/xport.c) under an owner that is not MQTT: a line protocol
** made up here, over a socketpair, with a client in the test's thread (OpenSSL's client for
** TLS, frames made by hand for WebSocket). On a plain listener "STARTTLS" starts TLS (the
** go-ahead is "GO"; "NO" when the transport refuses) and any other line comes back as
** "echo:<line>"; on a WebSocket listener every text message comes back as one. What XMPP
** needs, without XMPP: TLS started mid-stream, plaintext pipelined behind the request never
** taken (in the request's read, or in a later one), and text messages with their ends. The
** memory and the pre-auth budget the transports took are all given back at the end.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "rt_test.h"
#include "tls.h"
#include "tmpdir.h"
#include "xport.h"

enum { LISTENER_TLS, LISTENER_WS, LISTENER_PLAIN };

static rt_conf_t *conf;

/* What the owners saw, for the test's thread: lines (or messages) in order, as one text. */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static char seen[4096];
static atomic_long fails, tls_fails, message_ends, holds;
static atomic_long owner_errors;     /* what the owners found wrong (CHECK is the test thread's) */
static _Atomic int64_t preauth_held; /* the pre-auth budget's count, as rtd's broker keeps it */

static bool charge(int64_t bytes)
{
    atomic_fetch_add(&preauth_held, bytes);
    return true;
}

static void saw(const char *what, size_t n)
{
    pthread_mutex_lock(&seen_lock);
    size_t k = strlen(seen);
    if (k + n + 2 < sizeof seen) {
        memcpy(seen + k, what, n);
        seen[k + n] = '|';
        seen[k + n + 1] = '\0';
    }
    pthread_mutex_unlock(&seen_lock);
}

static bool seen_is(const char *expect)
{
    pthread_mutex_lock(&seen_lock);
    bool same = strcmp(seen, expect) == 0;
    if (!same)
        fprintf(stderr, "  seen '%s', expected '%s'\n", seen, expect);
    seen[0] = '\0';
    pthread_mutex_unlock(&seen_lock);
    return same;
}

/* ---- The owner ---- */

typedef struct {
    rt_sock_t *sock;
    rt_xport_t *xp;
    unsigned listener;
    bool closing;
    size_t len;
    char buf[512]; /* the line (or message) being read */
} owner_t;

static const rt_xport_ops_t line_ops, text_ops;

static rt_xport_owner_t owner_of(owner_t *st)
{
    return (rt_xport_owner_t){.ops = st->listener == LISTENER_WS ? &text_ops : &line_ops,
                              .state = st,
                              .sock = st->sock,
                              .listen = &conf->listeners[st->listener],
                              .max_message = sizeof(st->buf)};
}

static void reply(owner_t *st, const char *prefix, const char *text, size_t n)
{
    char out[600];
    int k = snprintf(out, sizeof out, "%s%.*s%s", prefix, (int)n, text,
                     st->listener == LISTENER_WS ? "" : "\n");
    if (rt_xport_write(st->xp, st->sock, (const uint8_t *)out, (size_t)k) != 0)
        atomic_fetch_add(&owner_errors, 1);
}

/* Lines: the bytes after a STARTTLS line in the same input are what the owner holds unread. */
static void line_input(rt_actor_t *self, void *owner, const uint8_t *p, size_t n)
{
    owner_t *st = owner;
    for (size_t i = 0; i < n && !st->closing; i++) {
        if (p[i] != '\n') {
            if (st->len < sizeof st->buf)
                st->buf[st->len++] = (char)p[i];
            continue;
        }
        saw(st->buf, st->len);
        bool starttls = st->len == 8 && memcmp(st->buf, "STARTTLS", 8) == 0;
        if (!starttls) {
            reply(st, "echo:", st->buf, st->len);
            st->len = 0;
            continue;
        }
        st->len = 0;
        rt_xport_owner_t o = owner_of(st);
        int rc = rt_xport_starttls(self, st->xp, &o, "GO\n", 3, n - i - 1);
        if (rc == RT_EINVAL)
            reply(st, "", "NO", 2);
        else if (rc)
            return; /* failed: the rest is never looked at */
    }
}

static void text_input(rt_actor_t *self, void *owner, const uint8_t *p, size_t n)
{
    (void)self;
    owner_t *st = owner;
    if (st->len + n > sizeof st->buf) { /* max_message holds it */
        atomic_fetch_add(&owner_errors, 1);
        return;
    }
    memcpy(st->buf + st->len, p, n);
    st->len += n;
}

static void message_end(rt_actor_t *self, void *owner)
{
    (void)self;
    owner_t *st = owner;
    atomic_fetch_add(&message_ends, 1);
    saw(st->buf, st->len);
    reply(st, "", st->buf, st->len);
    st->len = 0;
}

static bool taking(const void *owner)
{
    const owner_t *st = owner;
    return st->sock && !st->closing;
}

static void on_fail(rt_actor_t *self, void *owner)
{
    owner_t *st = owner;
    if (st->closing)
        return;
    st->closing = true;
    atomic_fetch_add(&fails, 1);
    rt_exit(self, RT_REASON_NORMAL);
}

static void hold_input(void *owner)
{
    (void)owner;
    atomic_fetch_add(&holds, 1);
}

static void peer(const void *owner, char *buf, size_t len)
{
    (void)owner;
    snprintf(buf, len, "test:0");
}

static bool peer_named(rt_actor_t *self, void *owner, const rt_auth_addr_t *addr)
{
    (void)self, (void)owner, (void)addr;
    return true;
}

static void preauth_refused(rt_actor_t *self, void *owner, size_t wanted)
{
    (void)wanted;
    on_fail(self, owner);
}

static void tls_failed(void *owner)
{
    (void)owner;
    atomic_fetch_add(&tls_fails, 1);
}

static const rt_ws_protocols_t line_protos = {.names = {"lines"}};
static const rt_ws_protocols_t xmpp_protos = {.names = {"xmpp"}, .required = true};

/* The two protocols differ in their input and WebSocket ways only. */
#define OWNER_CALLBACKS                                                                            \
    .taking = taking, .fail = on_fail, .hold_input = hold_input, .peer = peer,                     \
    .peer_named = peer_named, .preauth_refused = preauth_refused, .tls_failed = tls_failed

static const rt_xport_ops_t line_ops = {
    .ws_protocols = &line_protos, .input = line_input, OWNER_CALLBACKS};

static const rt_xport_ops_t text_ops = {.ws_protocols = &xmpp_protos,
                                        .ws_text = true,
                                        .input = text_input,
                                        .message_end = message_end,
                                        OWNER_CALLBACKS};

typedef struct {
    int fd;
    unsigned listener;
} owner_arg_t;

static int owner_init(rt_actor_t *self, void *state, void *arg)
{
    owner_t *st = state;
    const owner_arg_t *a = arg;
    st->listener = a->listener;
    int rc = rt_sock_adopt(self, a->fd, &st->sock);
    if (rc)
        return rc;
    /* The TLS listener runs STARTTLS: it has a context, but no TLS at accept. */
    const rt_xport_ops_t *ops = st->listener == LISTENER_WS ? &text_ops : &line_ops;
    return rt_xport_start(ops, &conf->listeners[a->listener], a->listener, st->sock,
                          RT_XPORT_STARTTLS, &st->xp);
}

static void owner_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    owner_t *st = state;
    if (m->tag != RT_MSG_SOCKET || st->closing)
        return;
    for (int i = 0; i < 16 && !st->closing; i++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(st->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            st->closing = true;
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        rt_xport_owner_t o = owner_of(st);
        rt_xport_input(self, st->xp, &o, (uint8_t *)(uintptr_t)data, len);
    }
}

static void owner_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    owner_t *st = state;
    rt_xport_flush(st->xp);
}

static void owner_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self, (void)reason;
    owner_t *st = state;
    if (!st->sock)
        return;
    rt_xport_close(st->xp, st->sock);
    rt_sock_close_lingering(st->sock);
    st->sock = NULL;
}

static const rt_actor_type_t owner_type = {.name = "xport_owner",
                                           .state_size = sizeof(owner_t),
                                           .init = owner_init,
                                           .handle = owner_handle,
                                           .turn_end = owner_turn_end,
                                           .terminate = owner_terminate};

/* ---- The client ---- */

/* A connection to a new owner on listener: the client's end of a socketpair. */
static int connect_owner(unsigned listener)
{
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_EQ(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0); /* the owner's end: rt_sock_adopt's kind */
    struct timeval tv = {.tv_sec = 10};
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    owner_arg_t a = {.fd = sv[1], .listener = listener};
    CHECK_EQ(rt_spawn(&owner_type, &a, NULL), 0);
    return sv[0];
}

static void send_all(int fd, const void *p, size_t n)
{
    CHECK_EQ(write(fd, p, n), (ssize_t)n);
}

/* Reads exactly n bytes (false at EOF or the timeout). */
static bool read_exactly(int fd, void *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)out + got, n - got);
        if (k <= 0)
            return false;
        got += (size_t)k;
    }
    return true;
}

/* Reads until the peer closes; false on the timeout. */
static bool read_to_eof(int fd)
{
    char b[256];
    ssize_t k;
    while ((k = read(fd, b, sizeof b)) > 0)
        ;
    return k == 0;
}

static bool expect_plain(int fd, const char *text)
{
    char got[128] = {0};
    size_t n = strlen(text);
    bool ok = read_exactly(fd, got, n) && memcmp(got, text, n) == 0;
    if (!ok)
        fprintf(stderr, "  read '%s', expected '%s'\n", got, text);
    return ok;
}

static SSL_CTX *client_ctx;

static bool expect_tls(SSL *ssl, const char *text)
{
    char got[128] = {0};
    size_t n = strlen(text), have = 0;
    while (have < n) {
        int k = SSL_read(ssl, got + have, (int)(n - have));
        if (k <= 0)
            return false;
        have += (size_t)k;
    }
    return memcmp(got, text, n) == 0;
}

/* ---- STARTTLS ---- */

/*
** Plaintext, then STARTTLS: the go-ahead in plaintext, then a handshake and lines both ways
** over TLS; a second STARTTLS is refused (TLS is on) without harm.
*/
static void test_starttls(void)
{
    int fd = connect_owner(LISTENER_TLS);
    send_all(fd, "hello\n", 6);
    CHECK(expect_plain(fd, "echo:hello\n"));
    send_all(fd, "STARTTLS\n", 9);
    CHECK(expect_plain(fd, "GO\n"));
    SSL *ssl = SSL_new(client_ctx);
    SSL_set_fd(ssl, fd);
    CHECK_EQ(SSL_connect(ssl), 1);
    CHECK_EQ(SSL_write(ssl, "secret\n", 7), 7);
    CHECK(expect_tls(ssl, "echo:secret\n"));
    CHECK_EQ(SSL_write(ssl, "STARTTLS\n", 9), 9);
    CHECK(expect_tls(ssl, "NO\n"));
    CHECK_EQ(SSL_write(ssl, "bye\n", 4), 4);
    CHECK(expect_tls(ssl, "echo:bye\n"));
    SSL_free(ssl);
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is("hello|STARTTLS|secret|STARTTLS|bye|"));
    CHECK_EQ(atomic_load(&fails), 0);
    CHECK_EQ(atomic_load(&tls_fails), 0);
}

/*
** A line pipelined behind STARTTLS in the same read is never taken: no go-ahead, the stream
** fails, and the line is neither parsed as plaintext nor kept for after the handshake.
*/
static void test_starttls_pipelined(void)
{
    long failed = atomic_load(&fails);
    int fd = connect_owner(LISTENER_TLS);
    send_all(fd, "STARTTLS\nAUTH admin\n", 20);
    CHECK(read_to_eof(fd)); /* closed without "GO" (it would have been read here) */
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is("STARTTLS|"));
    CHECK_EQ(atomic_load(&fails), failed + 1);
}

/* Plaintext sent after the go-ahead comes in a later read: it is the handshake's, which fails. */
static void test_starttls_plaintext_after(void)
{
    long failed = atomic_load(&fails), tls_failed_before = atomic_load(&tls_fails);
    int fd = connect_owner(LISTENER_TLS);
    send_all(fd, "STARTTLS\n", 9);
    CHECK(expect_plain(fd, "GO\n"));
    send_all(fd, "AUTH admin\n", 11);
    CHECK(read_to_eof(fd));
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is("STARTTLS|"));
    CHECK_EQ(atomic_load(&fails), failed + 1);
    CHECK_EQ(atomic_load(&tls_fails), tls_failed_before + 1);
}

/* A listener with no TLS context refuses STARTTLS, and the stream goes on in plaintext. */
static void test_starttls_without_context(void)
{
    int fd = connect_owner(LISTENER_PLAIN);
    send_all(fd, "STARTTLS\nstill here\n", 20);
    CHECK(expect_plain(fd, "NO\necho:still here\n"));
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is("STARTTLS|still here|"));
}

/* ---- WebSocket text messages ---- */

static size_t client_frame(uint8_t *out, int fin_opcode, const char *payload, size_t n)
{
    static const uint8_t mask[4] = {0x11, 0x22, 0x33, 0x44};
    size_t pos = 0;
    out[pos++] = (uint8_t)fin_opcode;
    out[pos++] = (uint8_t)(0x80 | n); /* n <= 125 here */
    memcpy(out + pos, mask, 4);
    pos += 4;
    for (size_t i = 0; i < n; i++)
        out[pos + i] = (uint8_t)payload[i] ^ mask[i & 3];
    return pos + n;
}

/* Reads one server frame (unmasked, 7-bit length); its opcode byte, or -1. */
static int read_frame(int fd, char *payload, size_t *len)
{
    uint8_t h[2];
    if (!read_exactly(fd, h, 2) || (h[1] & 0x80) || (h[1] & 0x7F) > 125)
        return -1;
    *len = h[1];
    payload[*len] = '\0';
    return read_exactly(fd, payload, *len) ? h[0] : -1;
}

static const char upgrade_xmpp[] = "GET /xmpp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                   "Sec-WebSocket-Protocol: xmpp\r\n\r\n";

/* The 101 answer's head, read up to its blank line. */
static bool read_head(int fd, char *head, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        if (!read_exactly(fd, head + n, 1))
            return false;
        head[++n] = '\0';
        if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0)
            return true;
    }
    return false;
}

/*
** Under subprotocol xmpp, a message in fragments (cut inside a UTF-8 sequence) and a whole
** one, sent with the upgrade in one write, each come up whole with their end told, and go
** back as one text frame each; a binary frame then closes the stream with 1003.
*/
static void test_ws_text(void)
{
    long failed = atomic_load(&fails);
    int fd = connect_owner(LISTENER_WS);
    uint8_t out[1024];
    size_t n = strlen(upgrade_xmpp);
    memcpy(out, upgrade_xmpp, n);
    n += client_frame(out + n, RT_WS_OP_TEXT, "<open to='x\xc3", 12);
    n += client_frame(out + n, 0x80 | RT_WS_OP_CONT, "\xa9'/>", 4);
    n += client_frame(out + n, 0x80 | RT_WS_OP_TEXT, "<presence/>", 11);
    send_all(fd, out, n);
    char head[1024], payload[128];
    CHECK(read_head(fd, head, sizeof head));
    CHECK(strncmp(head, "HTTP/1.1 101 ", 13) == 0);
    CHECK(strstr(head, "\r\nSec-WebSocket-Protocol: xmpp\r\n") != NULL);
    size_t len;
    CHECK_EQ(read_frame(fd, payload, &len), 0x80 | RT_WS_OP_TEXT);
    CHECK(strcmp(payload, "<open to='x\xc3\xa9'/>") == 0);
    CHECK_EQ(read_frame(fd, payload, &len), 0x80 | RT_WS_OP_TEXT);
    CHECK(strcmp(payload, "<presence/>") == 0);
    CHECK_EQ(atomic_load(&message_ends), 2);

    n = client_frame(out, 0x80 | RT_WS_OP_BINARY, "<x/>", 4);
    send_all(fd, out, n);
    CHECK_EQ(read_frame(fd, payload, &len), 0x80 | RT_WS_OP_CLOSE);
    CHECK_EQ(len, 2);
    CHECK_EQ((uint8_t)payload[0] << 8 | (uint8_t)payload[1], RT_WS_CLOSE_UNSUPPORTED);
    CHECK(read_to_eof(fd));
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is("<open to='x\xc3\xa9'/>|<presence/>|"));
    CHECK_EQ(atomic_load(&fails), failed + 1);
}

/* Text that is not UTF-8 closes with 1007; an upgrade that does not name xmpp gets 400. */
static void test_ws_refusals(void)
{
    int fd = connect_owner(LISTENER_WS);
    uint8_t out[1024];
    size_t n = strlen(upgrade_xmpp);
    memcpy(out, upgrade_xmpp, n);
    n += client_frame(out + n, 0x80 | RT_WS_OP_TEXT, "<a>\xed\xa0\x80</a>", 10);
    send_all(fd, out, n);
    char head[1024], payload[128];
    size_t len;
    CHECK(read_head(fd, head, sizeof head));
    CHECK_EQ(read_frame(fd, payload, &len), 0x80 | RT_WS_OP_CLOSE);
    CHECK_EQ((uint8_t)payload[0] << 8 | (uint8_t)payload[1], RT_WS_CLOSE_INVALID);
    CHECK(read_to_eof(fd));
    close(fd);

    fd = connect_owner(LISTENER_WS);
    static const char no_proto[] = "GET /xmpp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    send_all(fd, no_proto, strlen(no_proto));
    CHECK(read_head(fd, head, sizeof head));
    CHECK(strncmp(head, "HTTP/1.1 400 ", 13) == 0);
    CHECK(read_to_eof(fd));
    close(fd);
    CHECK(wait_alive(0));
    CHECK(seen_is(""));
}

/* ---- Set up ---- */

/* A self-signed certificate for localhost and its key, as PEM files. */
static void make_cert(const char *cert_path, const char *key_path)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    CHECK(key && x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1,
                               0);
    X509_set_issuer_name(x, name);
    CHECK(X509_sign(x, key, EVP_sha256()) > 0);
    FILE *f = fopen(cert_path, "w");
    CHECK(f && PEM_write_X509(f, x) == 1);
    fclose(f);
    f = fopen(key_path, "w");
    CHECK(f && PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) == 1);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
}

int main(void)
{
    CHECK_EQ(tmpdir_make("test_xport"), 0);
    conf = calloc(1, sizeof(*conf));
    rt_conf_defaults(conf);
    conf->nlisteners = 3;
    rt_listen_t *tls = &conf->listeners[LISTENER_TLS];
    tls->tls_on = true;
    snprintf(tls->tls.cert, sizeof tls->tls.cert, "%s/cert.pem", tmpdir_path);
    snprintf(tls->tls.key, sizeof tls->tls.key, "%s/key.pem", tmpdir_path);
    make_cert(tls->tls.cert, tls->tls.key);
    snprintf(conf->listeners[LISTENER_WS].websocket, sizeof conf->listeners[LISTENER_WS].websocket,
             "/xmpp");
    char why[RT_TLS_WHY_LEN];
    int rc = rt_tls_open(conf, why, sizeof why);
    if (rc)
        fprintf(stderr, "rt_tls_open: %s\n", why);
    CHECK_EQ(rc, 0);
    client_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_NONE, NULL);
    rt_xport_preauth_budget(charge);
    size_t memory_before = rt_xport_total_memory();

    test_start(2);
    RUN(test_starttls);
    RUN(test_starttls_pipelined);
    RUN(test_starttls_plaintext_after);
    RUN(test_starttls_without_context);
    RUN(test_ws_text);
    RUN(test_ws_refusals);
    rt_shutdown();

    CHECK_EQ(rt_xport_total_memory(), memory_before);
    CHECK_EQ(atomic_load(&preauth_held), 0);
    CHECK_EQ(atomic_load(&holds), 0);
    CHECK_EQ(atomic_load(&owner_errors), 0);
    SSL_CTX_free(client_ctx);
    rt_tls_close();
    free(conf);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

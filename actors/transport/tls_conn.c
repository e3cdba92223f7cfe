/*
** A TLS connection over memory, driven by its actor (tls_conn.h).
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>

#include "tls.h"
#include "tls_conn.h"

#define TLS_PLAIN_MAX (16 * 1024)   /* one TLS record's plaintext */
#define TLS_STAGE_MAX TLS_PLAIN_MAX /* plaintext gathered before a record is made anyway */

static atomic_size_t stage_bytes; /* all connections' stages */

/* ---- The BIO: ciphertext in from memory, records out to the socket ---- */

/*
** What the current input call may read: set around SSL calls in the owner's turn (one actor
** per thread at a time), so the BIO needs no state of its own for input.
*/
static _Thread_local const uint8_t *tls_in;
static _Thread_local size_t tls_in_len;

static int bio_read(BIO *b, char *out, int n)
{
    BIO_clear_retry_flags(b);
    if (tls_in_len == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t k = (size_t)n < tls_in_len ? (size_t)n : tls_in_len;
    memcpy(out, tls_in, k);
    tls_in += k;
    tls_in_len -= k;
    return (int)k;
}

/* The BIO's data is the socket: records go to its output buffer, sent at the end of turn. */
static int bio_write(BIO *b, const char *data, int n)
{
    BIO_clear_retry_flags(b);
    rt_sock_t *s = BIO_get_data(b);
    if (!s || rt_sock_write(s, data, (size_t)n) != 0)
        return -1;
    return n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void bio_method_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "rt socket");
    if (m && BIO_meth_set_read(m, bio_read) == 1 && BIO_meth_set_write(m, bio_write) == 1 &&
        BIO_meth_set_ctrl(m, bio_ctrl) == 1 && BIO_meth_set_create(m, bio_create) == 1)
        bio_method = m;
    else
        BIO_meth_free(m);
}

/* ---- Start and end ---- */

int rt_tls_conn_attach(rt_tls_conn_t *t, SSL *ssl, rt_sock_t *sock)
{
    memset(t, 0, sizeof(*t));
    pthread_once(&bio_once, bio_method_make);
    BIO *bio = ssl && bio_method ? BIO_new(bio_method) : NULL;
    if (!bio) {
        SSL_free(ssl);
        return RT_ENOMEM;
    }
    BIO_set_data(bio, sock);
    SSL_set_bio(ssl, bio, bio);
    if (SSL_is_server(ssl))
        SSL_set_accept_state(ssl);
    else
        SSL_set_connect_state(ssl); /* a bridge's connection to a remote broker */
    t->ssl = ssl;
    return 0;
}

void rt_tls_conn_move(rt_tls_conn_t *t, rt_sock_t *sock)
{
    if (t->ssl)
        BIO_set_data(SSL_get_rbio(t->ssl), sock);
}

bool rt_tls_conn_established(const rt_tls_conn_t *t)
{
    return t->ssl && SSL_is_init_finished(t->ssl);
}

static void stage_free(rt_tls_conn_t *t)
{
    if (!t->out)
        return;
    free(t->out);
    atomic_fetch_sub_explicit(&stage_bytes, TLS_STAGE_MAX, memory_order_relaxed);
    t->out = NULL;
    t->out_len = 0;
}

void rt_tls_conn_free(rt_tls_conn_t *t)
{
    SSL_free(t->ssl);
    t->ssl = NULL;
    stage_free(t);
}

void rt_tls_conn_close(rt_tls_conn_t *t)
{
    if (rt_tls_conn_established(t) && !t->failed) {
        rt_tls_conn_flush(t); /* what the turn wrote (a DISCONNECT, an answer), then close_notify */
        SSL_shutdown(t->ssl);
    }
    ERR_clear_error();
    rt_tls_conn_free(t);
}

size_t rt_tls_conn_memory(const rt_tls_conn_t *t)
{
    return t->out ? TLS_STAGE_MAX : 0;
}

size_t rt_tls_conn_total_memory(void)
{
    return atomic_load_explicit(&stage_bytes, memory_order_relaxed);
}

/* ---- Output ---- */

int rt_tls_conn_flush(rt_tls_conn_t *t)
{
    if (!t->out)
        return 0;
    int r = SSL_write(t->ssl, t->out, (int)t->out_len);
    stage_free(t);
    if (r <= 0) {
        ERR_clear_error();
        return RT_ECLOSED;
    }
    return 0;
}

/*
** A turn's writes are gathered and encrypted at its end, up to a record's worth: a subscriber
** sent a hundred small messages in a turn gets one record, not a hundred, and OpenSSL
** allocates its write buffer once.
*/
int rt_tls_conn_write(rt_tls_conn_t *t, const void *p, size_t n)
{
    if (t->out_len + n > TLS_STAGE_MAX) {
        int rc = rt_tls_conn_flush(t);
        if (rc)
            return rc;
        if (n >= TLS_STAGE_MAX) {
            if (SSL_write(t->ssl, p, (int)n) <= 0) {
                ERR_clear_error();
                return RT_ECLOSED;
            }
            return 0;
        }
    }
    if (!t->out) {
        t->out = malloc(TLS_STAGE_MAX);
        if (!t->out)
            return RT_ENOMEM;
        atomic_fetch_add_explicit(&stage_bytes, TLS_STAGE_MAX, memory_order_relaxed);
    }
    memcpy(t->out + t->out_len, p, n);
    t->out_len += (uint32_t)n;
    return 0;
}

/* ---- Input ---- */

/* Whether an SSL call that returned r failed for good (else it waits for more input). */
static bool fatal(const rt_tls_conn_t *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    return e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE;
}

int rt_tls_conn_input(rt_tls_conn_t *t, const uint8_t *p, size_t n, rt_tls_plain_fn plain,
                      void *ctx, char *why, size_t whylen)
{
    static _Thread_local uint8_t buf[TLS_PLAIN_MAX];
    int rc = 0;
    tls_in = p;
    tls_in_len = n;
    if (!SSL_is_init_finished(t->ssl)) {
        int r = SSL_do_handshake(t->ssl);
        if (r != 1) {
            if (fatal(t, r)) {
                rt_tls_failure_reason(t->ssl, why, whylen);
                t->failed = 1;
                rc = RT_EPROTO;
            }
            goto out;
        }
    }
    for (;;) {
        int r = SSL_read(t->ssl, buf, sizeof(buf));
        if (r > 0) {
            if (!plain(ctx, buf, (size_t)r))
                break;
            continue;
        }
        if (!fatal(t, r))
            break;
        if (SSL_get_error(t->ssl, r) == SSL_ERROR_ZERO_RETURN) { /* close_notify: a normal end */
            rc = RT_ECLOSED;
        } else {
            rt_tls_failure_reason(t->ssl, why, whylen);
            t->failed = 1;
            rc = RT_EPROTO;
        }
        break;
    }
out:
    tls_in_len = 0;
    return rc;
}

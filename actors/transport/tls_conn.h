/*
** One TLS connection, driven by the actor that owns its socket, in that actor's turns: the
** transport under a protocol's sessions (xport.c, MQTT's connections) and the HTTP connection
** actor (actors/http/http.c) run the server side between their socket and their protocol's
** parser, a bridge (actors/bridge) the client side.
**
** OpenSSL reads the ciphertext from memory (what the actor just read from its socket, lent
** for the length of rt_tls_conn_input) and writes its records straight into the rt socket's
** output buffer: no socket BIO, no thread and no record copy per connection. Plaintext the
** actor writes is staged over its turn and encrypted at the turn's end (rt_tls_conn_flush,
** from the actor type's turn_end), so a turn's many small writes make one record.
**
** Memory. The object is a few words inside its owner's state. The staging buffer is malloc'ed
** for a turn's writes and freed at their flush, counted in rt_tls_conn_total_memory. An idle
** connection keeps only its SSL, without record buffers (SSL_MODE_RELEASE_BUFFERS).
** OpenSSL's own allocations are not counted: libmongoc initialises OpenSSL from a library
** constructor, before rtd could install counting allocators (CRYPTO_set_mem_functions
** refuses once OpenSSL has allocated).
*/
#ifndef RT_TLS_CONN_H
#define RT_TLS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "rt.h"

typedef struct rt_tls_conn_s {
    SSL *ssl;         /* NULL: not attached (the owner's plain TCP path tests this) */
    uint8_t *out;     /* malloc: plaintext written this turn, not yet encrypted; NULL: none */
    uint32_t out_len;
    uint8_t failed;   /* a fatal alert went or came: no close_notify at the end */
} rt_tls_conn_t;

/*
** Takes ssl (from rt_tls_accept; freed here on failure) as the server side of t, writing its
** records to sock; an SSL of a client context is the client side (a bridge's connection), whose
** handshake the first rt_tls_conn_input (with no input) begins. 0, or RT_ENOMEM.
*/
int rt_tls_conn_attach(rt_tls_conn_t *t, SSL *ssl, rt_sock_t *sock);

/* The byte stream moved to another socket (a session resumed by another actor). */
void rt_tls_conn_move(rt_tls_conn_t *t, rt_sock_t *sock);

/* Whether the handshake is done. */
bool rt_tls_conn_established(const rt_tls_conn_t *t);

/*
** Receives the plaintext decrypted from one read, in a per-thread buffer valid for the call;
** returns false to stop reading (the connection ends: the rest of the ciphertext is dropped).
*/
typedef bool (*rt_tls_plain_fn)(void *ctx, uint8_t *p, size_t n);

/*
** Feeds ciphertext read from the socket: runs the handshake while it is not done, then
** decrypts, handing plaintext to plain. Whatever is left of a partial record stays inside
** OpenSSL. Returns 0 while the stream goes on; RT_ECLOSED when the peer ended it with
** close_notify; RT_EPROTO when TLS failed, with why (OpenSSL's or the certificate check's
** reason): rt_tls_conn_established tells a failed handshake from a later error.
*/
int rt_tls_conn_input(rt_tls_conn_t *t, const uint8_t *p, size_t n, rt_tls_plain_fn plain,
                      void *ctx, char *why, size_t whylen);

/*
** Writes plaintext: staged until rt_tls_conn_flush, or encrypted at once when the stage would
** pass a record's worth. 0; RT_ENOMEM; RT_ECLOSED when OpenSSL refuses (the stream is broken).
*/
int rt_tls_conn_write(rt_tls_conn_t *t, const void *p, size_t n);

/* Encrypts what was staged into records in the socket's output. 0 or RT_ECLOSED. */
int rt_tls_conn_flush(rt_tls_conn_t *t);

/*
** Ends the stream: what was staged and a close_notify go out when the handshake was done and
** nothing failed; then everything is freed (rt_tls_conn_free). Call before the socket closes.
*/
void rt_tls_conn_close(rt_tls_conn_t *t);

/* Frees the SSL and the stage, sending nothing. t may be all zero. */
void rt_tls_conn_free(rt_tls_conn_t *t);

/* Bytes t holds outside OpenSSL (its stage), and all connections' together. */
size_t rt_tls_conn_memory(const rt_tls_conn_t *t);
size_t rt_tls_conn_total_memory(void);

#endif

/*
 * rtb_xport: the transports under MQTT for rtbench, TLS (OpenSSL 3 on memory BIOs, so
 * the socket stays on the worker's libuv loop) and the client side of RFC 6455
 * WebSocket; both together give WSS. Layering, top down:
 *   MQTT bytes -> WebSocket frames (masked, binary) -> TLS records -> socket.
 *
 * A client with no transport has no rtb_xport_t at all, so plain TCP pays nothing.
 * One rtb_xport_t lives as long as its client and is reset for every connection; it
 * keeps the TLS session between connections for --tls-resume.
 */
#ifndef RTB_XPORT_H
#define RTB_XPORT_H

#include <stddef.h>
#include <stdint.h>

#include "rtb_mqtt.h"

typedef struct rtb_xctx_s rtb_xctx_t;   /* per process: SSL_CTX and settings */
typedef struct rtb_xport_s rtb_xport_t; /* per client */

typedef struct rtb_xconf_s {
    int tls;            /* --tls */
    const char *cafile; /* --cafile: verify the server against it; NULL = no verification */
    const char *cert;   /* --cert: client certificate chain (PEM), with key */
    const char *key;    /* --key */
    const char *sni;    /* --sni: server name sent and verified; NULL = verify the IP of host */
    const char *host;   /* -h, for the Host header and IP verification */
    int port;           /* -p, for the Host header */
    int resume;         /* --tls-resume: offer the last session (ticket) on reconnect */
    const char *ws;     /* --ws PATH, NULL for none */
} rtb_xconf_t;

/*
 * Builds a process's context. Returns 0, or -EINVAL with a reason in err (a file that
 * does not load, a key that does not match its certificate).
 */
int rtb_xctx_new(rtb_xctx_t **out, const rtb_xconf_t *cf, char *err, size_t errlen);
void rtb_xctx_free(rtb_xctx_t *x);

int rtb_xport_new(rtb_xctx_t *ctx, rtb_xport_t **out);
void rtb_xport_free(rtb_xport_t *x);

/*
 * Starts a new connection on x (the TCP connection is up): drops any state of the last
 * one and queues the TLS ClientHello or the WebSocket upgrade request. 0 or -ENOMEM.
 */
int rtb_xport_start(rtb_xport_t *x);

/* Called with each run of MQTT bytes that the transport decoded. */
typedef void (*rtb_xport_deliver_fn)(void *arg, const uint8_t *p, size_t n);

/*
 * Feeds bytes read from the socket; MQTT bytes go to deliver, possibly in several runs.
 * Returns 0, or a negative errno: -EPROTO for a TLS or WebSocket error (the reason is
 * left for rtb_xport_error), -ECONNRESET when the server closed the TLS session or
 * sent a WebSocket close. deliver must not free x.
 */
int rtb_xport_input(rtb_xport_t *x, const uint8_t *p, size_t n, rtb_xport_deliver_fn deliver,
                    void *arg);

/* 1 once MQTT bytes can flow: TLS handshake done and WebSocket upgrade accepted. */
int rtb_xport_open(const rtb_xport_t *x);

/*
 * Encodes the MQTT bytes of mqtt (when open; mqtt->len is then 0) and appends every
 * byte the transport has for the socket to wire. 0 or -ENOMEM/-EPROTO.
 */
int rtb_xport_output(rtb_xport_t *x, rtb_buf_t *mqtt, rtb_buf_t *wire);

/* 1 when rtb_xport_output would produce bytes even with no MQTT bytes to send. */
int rtb_xport_pending(const rtb_xport_t *x);

/* Queues a TLS close_notify (so that the session stays resumable). */
void rtb_xport_shutdown(rtb_xport_t *x);

/* After the handshake: 1 if the TLS session was resumed. */
int rtb_xport_resumed(const rtb_xport_t *x);

/* The reason of the last -EPROTO, a static or x-owned string. */
const char *rtb_xport_error(const rtb_xport_t *x);

#endif

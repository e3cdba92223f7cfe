/*
** TLS for the listeners (OpenSSL 3). One server context per TLS listener (the MQTT ones
** and the HTTP one), built from its rt_conf_tls_t at start and again on reload;
** connections take their SSL from the context current at accept, so a reload changes new
** handshakes only (an SSL holds a reference to the context it came from). The connection
** actor drives its SSL itself, in its own turns, through memory rather than the socket
** (tls_conn.h): no thread per connection, and idle connections keep no record buffers
** (SSL_MODE_RELEASE_BUFFERS).
**
** Resumption: stateless session tickets (one per full handshake); the ticket keys are
** carried over a reload, so clients resume across it. No server-side session cache.
*/
#ifndef RT_TLS_H
#define RT_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "config.h"

#define RT_TLS_WHY_LEN 256
/* The HTTP listener's index, after the MQTT listeners' (conf->listeners[i] is index i). */
#define RT_TLS_HTTP RT_CONF_HTTP_LISTENER
#define RT_TLS_SERVERS RT_CONF_ALL_LISTENERS

/*
** Builds the contexts of the TLS listeners in conf, and of conf->http's when it has TLS,
** kept by index. ALPN answers `mqtt` on MQTT listeners, `http/1.1` on WebSocket ones and
** the HTTP one. On error, *why names the listener and the reason, and nothing is kept.
*/
int rt_tls_open(const rt_conf_t *conf, char *why, size_t whylen);
void rt_tls_close(void);

/* A new server-side SSL for a connection on listener index (or RT_TLS_HTTP); NULL if it has
   no TLS (or OOM). */
SSL *rt_tls_accept(unsigned listener);

/*
** Reads every TLS listener's files again, the HTTP listener's too. A listener whose new files do not load keeps its
** context; the result is 0 if all reloaded, else the first error, and report (may be
** NULL) gets one line per listener: "HOST:PORT reloaded" or "HOST:PORT failed: why".
*/
int rt_tls_reload(char *report, size_t reportlen);

typedef struct rt_tls_info_s {
    char subject[256];   /* the server certificate's subject, one line */
    char not_after[32];  /* its expiry, "YYYY-MM-DDTHH:MM:SSZ" */
    long days_left;      /* until not_after (negative: expired) */
    uint64_t reloads;    /* successful reloads since start */
    char last_error[RT_TLS_WHY_LEN]; /* of the last failed reload; "" */
} rt_tls_info_t;

/* The listener's certificate as served now; false if it has no TLS. */
bool rt_tls_info(unsigned listener, rt_tls_info_t *out);

/* One certificate a TLS listener serves: its default one, or one of its SNI names'. */
typedef struct rt_tls_cert_s {
    unsigned listener;   /* index as in rt_tls_info (RT_TLS_HTTP: the HTTP listener) */
    char sni[256];       /* the tls.sni name it is served for; "" for the default certificate */
    char subject[256];   /* one line */
    int64_t not_after_s; /* its expiry, unix seconds; 0 if unreadable */
} rt_tls_cert_t;

/* The certificates served now, up to max of them (listeners in order, the default first);
   returns how many there are. */
size_t rt_tls_certificates(rt_tls_cert_t *out, size_t max);

/*
** Why a handshake failed, for the log: the certificate check's reason when there is one
** ("certificate has expired"), else OpenSSL's ("wrong version number"). Clears the
** thread's error queue.
*/
void rt_tls_failure_reason(SSL *ssl, char *out, size_t len);

/*
** The verified client certificate's identity for identity_as_username: its subject CN, or
** its first DNS or email subject alternative name when it has no CN. False when none.
*/
bool rt_tls_peer_identity(SSL *ssl, char *out, size_t len);

/*
** The verified client certificate for an authentication service: its subject's CN as UTF-8
** into cn ("" when it has none, or it holds a NUL or does not fit), its subject as one RFC 2253
** line into subject ("" when it does not fit), and the SHA-256 of its DER encoding into sha256.
** False when the session has no verified client certificate.
*/
bool rt_tls_peer_cert(SSL *ssl, char *cn, size_t cnlen, char *subject, size_t subjectlen,
                      uint8_t sha256[32]);

/*
** The verified client certificate's subjectAltName otherNames of type oid (dotted, such as
** XMPP's id-on-xmppAddr "1.3.6.1.5.5.7.8.5") that are UTF8Strings without a NUL: each to fn
** (when not NULL) until it returns true. -1 when the session has no verified client
** certificate, else how many were passed.
*/
int rt_tls_peer_other_names(SSL *ssl, const char *oid,
                            bool (*fn)(const char *value, size_t len, void *arg), void *arg);

/*
** Whether the verified peer certificate names domain as a server (RFC 6125 as RFC 6120 13.7.2
** applies it): a DNS-ID (a wildcard only as the whole leftmost label), the subject CN only
** when it has no DNS-ID, or an id-on-xmppAddr of the bare domain. False without a verified
** peer certificate.
*/
bool rt_tls_peer_names_domain(SSL *ssl, const char *domain);

/*
** Channel binding (for SASL's SCRAM-*-PLUS): RT_TLS_CB_EXPORTER is RFC 9266's tls-exporter
** (32 bytes of keying material; TLS 1.3 only, where it is safe without extended master
** secret), RT_TLS_CB_END_POINT RFC 5929's tls-server-end-point (the hash of the server's
** certificate, with its signature's hash, SHA-256 for MD5 and SHA-1). rt_tls_bindings says
** which a finished handshake can give; rt_tls_binding writes one into out (cap bytes, 64 is
** enough): its length, or 0.
*/
#define RT_TLS_CB_EXPORTER 1u
#define RT_TLS_CB_END_POINT 2u
unsigned rt_tls_bindings(SSL *ssl);
size_t rt_tls_binding(SSL *ssl, unsigned type, uint8_t *out, size_t cap);

#endif

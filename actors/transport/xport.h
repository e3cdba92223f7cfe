/*
** The transport between a session actor's socket and its protocol's parser, for listeners
** that are more than plain TCP: a PROXY protocol header first, then TLS (from the first byte,
** or from where the protocol starts it: STARTTLS), then WebSocket, any of them; and the
** per-client rate limit. It knows no protocol: MQTT's connection actor (actors/conn) owns
** one per socket, and XMPP's c2s actor will; all of it runs in the owning actor's turns.
**
** The owner. The transport keeps no pointer to the actor it works for, and the actor embeds
** no transport struct. An idle WebSocket connection's transport is one 80-byte malloc chunk
** with no byte to spare, and a back pointer (or an ops pointer) would make every idle one
** cost a 96-byte chunk; MQTT's conn_t keeps its socket, closing flag and listener as bits
** among its own and the transport's pointer in a union (it is most of an idle connection's
** memory), so an embedded struct would grow it too. So the owner is named at each call that
** may call back, which is only the input side (rt_xport_input, rt_xport_resume,
** rt_xport_starttls): an rt_xport_owner_t, built on the stack, holds what the transport
** needs to know then (the socket, the listener's settings, the message limit) and the
** protocol's rt_xport_ops_t, one static table per protocol, what it needs done (input up,
** a message's end, a fault's end, a hold, a log line's peer, a proxy's address, a refusal at
** the pre-auth budget). Every other call takes only what it uses (the state, the socket).
**
** The one thing that cannot wait for a call is the pre-auth budget (max_preauth_memory):
** a stash freed where no owner is at hand (a handed-over socket's message that nobody took)
** gives its bytes back. The budget is the broker's, one for every protocol, so its charge
** function is set once at start (rt_xport_preauth_budget).
**
** Memory. A transport is malloc'ed beside the socket it extends (like rt_sock_t), counted in
** rt_xport_total_memory and in the client's memory (rt_xport_memory). Who owns it: the owner
** from rt_xport_start to rt_xport_close (or rt_xport_free); a socket handed to another actor
** carries it (rt_msg_own with rt_xport_free as the drop, then rt_xport_adopt): the SSL and
** whatever the layers kept belong to the byte stream, not to the actor.
*/
#ifndef RT_XPORT_H
#define RT_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"   /* rt_auth_addr_t */
#include "config.h" /* rt_listen_t, rt_conf_rate_t */
#include "rt.h"
#include "ws.h"

typedef struct rt_xport_s rt_xport_t;

/*
** What a protocol gives its transport: its WebSocket ways and the callbacks the input side
** makes. owner is rt_xport_owner_t.state. Callbacks run inside rt_xport_input (and
** rt_xport_resume, rt_xport_starttls); any of them may end the connection, after which the
** transport touches neither its state nor the socket again (it asks taking first).
*/
typedef struct rt_xport_ops_s {
    const rt_ws_protocols_t *ws_protocols; /* the subprotocols it is spoken under */
    bool ws_text; /* its WebSocket messages are text frames (RFC 7395), both ways; false:
                     binary (MQTT), and a text frame closes the stream with 1003 */
    /* The protocol's bytes, up from the layers (unmasked, decrypted); valid for the call. */
    void (*input)(rt_actor_t *self, void *owner, const uint8_t *p, size_t n);
    /* A WebSocket message ended: its last byte was in the last input. NULL: not told (a
       protocol that frames its own packets). */
    void (*message_end)(rt_actor_t *self, void *owner);
    /* Whether input goes on up through the layers: false once the owner closed its socket
       (rt_xport_close) or ends the stream, unless it collects what follows (a hand-over). */
    bool (*taking)(const void *owner);
    /* The stream ends over a transport fault, logged already; taking is false after it. It
       may come for a stream the owner ended already (preauth_refused): nothing to do then. */
    void (*fail)(rt_actor_t *self, void *owner);
    /* Input must wait until the socket's output drains (a WebSocket pong that could not go):
       the owner stops reading, and calls rt_xport_resume once it has drained. */
    void (*hold_input)(void *owner);
    /* "ip:port" of the client into buf, for the transport's log lines. */
    void (*peer)(const void *owner, char *buf, size_t len);
    /*
    ** A trusted proxy named the client (a PROXY header, X-Forwarded-For): it counts from
    ** here on, as rt_xport_real_peer tells. False refuses it (the owner's limit per address):
    ** then the transport logs that and ends the stream.
    */
    bool (*peer_named)(rt_actor_t *self, void *owner, const rt_auth_addr_t *addr);
    /* Ends the stream whose wanted bytes did not fit in the pre-auth budget, and logs it. */
    void (*preauth_refused)(rt_actor_t *self, void *owner, size_t wanted);
    /* A TLS handshake failed (logged already): for the owner's count. */
    void (*tls_failed)(void *owner);
} rt_xport_ops_t;

/* The owner at a call that may call back: what the transport needs of it now. */
typedef struct rt_xport_owner_s {
    const rt_xport_ops_t *ops;
    void *state;               /* the owner's, handed to ops */
    rt_sock_t *sock;           /* the socket the transport runs on */
    const rt_listen_t *listen; /* its listener's settings, which outlive the connection */
    uint32_t max_message;      /* the largest WebSocket message taken (the protocol's packet or
                                  stanza limit) */
} rt_xport_owner_t;

/* ---- Start and end ---- */

/*
** Sets the pre-auth budget's charge: bytes (negative: given back) held for a connection not
** authenticated yet; it returns false, charging nothing, when they do not fit. Call once,
** before the first connection; until then nothing is charged.
*/
void rt_xport_preauth_budget(bool (*charge)(int64_t bytes));

/* Whether a listener's connections need a transport: TLS, WebSocket, PROXY or a rate limit. */
bool rt_xport_wanted(const rt_listen_t *l);

enum {
    RT_XPORT_STARTTLS = 1, /* TLS waits for rt_xport_starttls, on a listener with a TLS context
                              (tls_on): none at accept */
};

/*
** At accept: the transport of listener l (index listener: its TLS context) for sock, with the
** pre-auth budget charged for what it stashes until rt_xport_preauth_end. flags: RT_XPORT_*.
** 0, or RT_ENOMEM.
*/
int rt_xport_start(const rt_xport_ops_t *ops, const rt_listen_t *l, unsigned listener,
                   rt_sock_t *sock, unsigned flags, rt_xport_t **out);

/* Before the socket closes: a WebSocket close frame, TLS close_notify; then frees xp. */
void rt_xport_close(rt_xport_t *xp, rt_sock_t *sock);

/* Frees a transport, sending nothing (rt_msg_own's drop for a handed-over socket). */
void rt_xport_free(void *xp);

/* A handed-over socket's transport, now sock's. */
void rt_xport_adopt(rt_xport_t *xp, rt_sock_t *sock);

/* The client authenticated (or the connection ends): the stash leaves the pre-auth budget. */
void rt_xport_preauth_end(rt_xport_t *xp);

/* ---- Output ---- */

/*
** The protocol's bytes out, as one WebSocket message (a binary or text frame, as ops said at
** start) behind a WebSocket, or as they are. 0, or an RT_E* code (the stream is broken).
*/
int rt_xport_write(rt_xport_t *xp, rt_sock_t *sock, const uint8_t *p, size_t n);

/* The end of a turn (or a hand-over): what was written through TLS becomes records. */
void rt_xport_flush(rt_xport_t *xp);

/* Output written through TLS and not yet in the socket (0 without TLS, or for NULL). */
size_t rt_xport_unsent(const rt_xport_t *xp);

/* ---- Input ---- */

/* Bytes read from o->sock, through the layers to o->ops->input; p may be changed in place. */
void rt_xport_input(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o, uint8_t *p,
                    size_t n);

/* Input held back while output was backed up (ops->hold_input) goes on up. */
void rt_xport_resume(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o);

/*
** STARTTLS (RFC 6120 5.4): writes the protocol's go-ahead (XMPP's <proceed/>) in plaintext,
** and TLS starts with the stream's next byte, both ways: the next read is the handshake's.
** The owner calls it where it parsed the client's request, and writes nothing more until the
** client speaks again over TLS (XMPP: its new stream header).
** unread is how many bytes the owner holds from after the request (read with it, not used).
** A client may send nothing between its request and the go-ahead (RFC 6120 5.4.3.3 has the
** negotiation begin at the go-ahead's last byte), and what one did send must never be taken
** as if it came through TLS (the command injection of CVE-2011-0411). Such bytes fail the
** stream rather than being discarded: an honest client cannot have sent them; the one that
** did is broken or is injecting, and neither should get a handshake, while dropping them
** quietly would hide the attempt. Bytes that come in a later read are the handshake's, and a
** plaintext there fails it. So pipelined plaintext is never parsed, whichever read it is in.
** Returns 0; RT_EPROTO for unread bytes (logged, nothing written, the stream failed through
** ops->fail); RT_EINVAL, nothing changed, when TLS is on already, the transport runs
** WebSocket or has not finished its PROXY header, or the listener has no TLS context (or no
** SSL could be made); RT_ENOMEM or RT_ECLOSED from the write (then the owner ends it).
*/
int rt_xport_starttls(rt_actor_t *self, rt_xport_t *xp, const rt_xport_owner_t *o,
                      const void *go_ahead, size_t go_ahead_len, size_t unread);

/* ---- Rate limits ---- */

/* The client's limit is now limit, which must outlive xp (rt_broker->conf's do), buckets
   full; a limit of zeros removes it. */
void rt_xport_rate_set(rt_xport_t *xp, const rt_conf_rate_t *limit);
/* Whether the client has a rate limit (xp may be NULL). */
bool rt_xport_rate_on(const rt_xport_t *xp);
/* A unit of input parsed from a limited client: its bytes, and whether it was a message. */
void rt_xport_rate_take(rt_xport_t *xp, size_t bytes, bool message);
/* Whether the limit stops parsing now (a bucket overdrawn, or waiting); xp may be NULL. */
bool rt_xport_rate_spent(rt_xport_t *xp);
/*
** Before reading: true when over the rate, and then reading sock waits until the owner gets
** resume_tag (a timer to self), when it calls rt_xport_rate_resume. *paused_ms is the new
** wait when one began now (the owner counts and logs it), 0 when none did.
*/
bool rt_xport_rate_hold(rt_actor_t *self, rt_xport_t *xp, rt_sock_t *sock, uint32_t resume_tag,
                        uint64_t *paused_ms);
/* The refill timer: reading may go on; false if the client was not waiting. */
bool rt_xport_rate_resume(rt_xport_t *xp);
/* Whether reading is paused by the rate limit now. */
bool rt_xport_rate_waiting(const rt_xport_t *xp);
/* Times the client was slowed. */
uint32_t rt_xport_rate_limited(const rt_xport_t *xp);

/* ---- The client ---- */

/* Whether TLS runs (from accept, or started), handshake done or not. */
bool rt_xport_tls_on(const rt_xport_t *xp);
/* Channel binding types the TLS of xp can give now (rt_tls_bindings: RT_TLS_CB_*), and one
   of them into out (its length, 0 if none): for SASL's -PLUS mechanisms. */
unsigned rt_xport_bindings(const rt_xport_t *xp);
size_t rt_xport_binding(const rt_xport_t *xp, unsigned type, uint8_t *out, size_t cap);
/* The verified client certificate's identity (rt_tls_peer_identity); false if none. */
bool rt_xport_tls_identity(const rt_xport_t *xp, char *out, size_t len);
/* The verified client certificate as an authentication service is told it
   (rt_tls_peer_cert); false without TLS or such a certificate. */
bool rt_xport_tls_cert(const rt_xport_t *xp, rt_auth_tls_t *out);
/* The verified client certificate's otherNames of type oid (rt_tls_peer_other_names); -1
   without TLS or such a certificate. */
int rt_xport_tls_other_names(const rt_xport_t *xp, const char *oid,
                             bool (*fn)(const char *value, size_t len, void *arg), void *arg);
/* Whether the verified peer certificate names domain as a server (rt_tls_peer_names_domain);
   false without TLS or such a certificate. */
bool rt_xport_tls_names_domain(const rt_xport_t *xp, const char *domain);
/* The client's address and port as a trusted proxy named them; false when none did. */
bool rt_xport_real_peer(const rt_xport_t *xp, rt_auth_addr_t *addr, uint16_t *port);
/* "ip:port" of the client: as a trusted proxy named it (xp may be NULL), else socket fd's peer
   ("?:0" when it has none). */
void rt_xport_peer_format(const rt_xport_t *xp, int fd, char *buf, size_t len);
/*
** Logs a connection cut by its owner's timeout as the step it did not finish: the transport's
** (PROXY header, TLS handshake, WebSocket upgrade), or once the transport is open (or for
** NULL, plain TCP) open_event, the protocol's ("client.connect_timeout"), with after_s.
*/
void rt_xport_log_timeout(const rt_xport_t *xp, const char *peer, long after_s,
                          const char *open_event);

/* ---- Memory ---- */

/* Memory the transport holds for its client (state, stash, TLS stage); 0 for NULL. */
size_t rt_xport_memory(const rt_xport_t *xp);
/* All transports' states and stashes, and every TLS stage (the HTTP listener's too). */
size_t rt_xport_total_memory(void);

#endif

/*
** Inside the connection actor: its state (conn_t), its message tags, and the functions
** its files call in one another. Each file has one job:
**   conn.c         the actor: start, socket reading and parsing, packet dispatch,
**                  keepalive, the end of a connection (offline session or exit)
**   connect.c      CONNECT: login, client id claim (takeover or resume), will, CONNACK
**   publish.c      PUBLISH from the client: checks, routing, exactly-once ids, acks that
**                  wait for the store (durable acks)
**   subscribe.c    SUBSCRIBE and UNSUBSCRIBE, the subscription list, shared-group membership
**   delivery.c     messages to the client: the session's window, queue and inflight list
**   client_admin.c administrators' queries, kicks and ACL rechecks
**   start.c        MQTT at start: sessions and retained messages the store kept
**   listener.c     the listeners and admission at accept
**   conn_xport.c   the connection as the owner of its transport (actors/transport/xport.h):
**                  the callbacks, the client's address, a CONNECT's hand-over, user rate limits
**   move.c         persistent sessions moving between cluster nodes: out, in, the merge
**   session_bytes.c the bytes they move in (no actor needed, so fuzzed on their own)
**
** All of it runs in the connection actor's own turns (one actor per thread at a time),
** so conn_t has no locks; what other threads read goes through the broker's atomics.
**
** Memory. Everything conn_t points to is on the actor's heap (rt_alloc), so an
** administrator sees what a connection holds, and the heap's collection frees what it let
** go of: its roots are conn_t's pointers (conn.c names them in the type's trace), and
** what they lead to is found through RT_OBJ_SCAN objects (the subscription list, the
** session and its message records, the alias tables); strings and byte buffers are
** RT_OBJ_LEAF. Nothing outside the heap (the trie, the store, a message) keeps a pointer
** into it: they get copies. The one exception is the client table, which keeps client_id
** itself (broker.h): conn_t holds that string too, never changes or frees it, and terminate
** releases the table's entry before the heap goes. When the actor exits its heap goes
** whole, releasing the binaries it holds, so terminate only unhooks the shared tables.
** Scratch space for one handler call (an encode buffer) may stay on the stack or malloc.
*/
#ifndef RT_CONN_IMPL_H
#define RT_CONN_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "auth.h"
#include "cluster.h"
#include "conn.h"
#include "mqtt_codec.h"
#include "route.h"
#include "rule_engine.h"
#include "session.h"
#include "store.h"
#include "tenant.h"
#include "topic_alias.h"
#include "xport.h"

enum {
    RT_CONN_MSG_KEEPALIVE = RT_MSG_USER, /* tag timer: check the keepalive */
    RT_CONN_MSG_RESUME,          /* fd: a new connection's socket; data: its listener (one byte),
                                    then its bytes from CONNECT on */
    RT_CONN_MSG_SESSION_EXPIRED, /* tag timer: an offline session may have run out */
    RT_CONN_MSG_WILL_DUE,        /* tag timer: a delayed will may be due */
    RT_CONN_MSG_RESTORED,        /* first turn of a session loaded from the store */
    RT_CONN_MSG_AUTH_REFUSED,    /* tag timer: the held-back negative CONNACK is due */
    RT_CONN_MSG_PARSE_MORE,      /* complete packets wait in the partial buffer (budget ran out) */
    RT_CONN_MSG_SLOW_CHECK,      /* tag timer: is the client still not reading? */
    RT_CONN_MSG_LOGIN_VERDICT,   /* data: rt_auth_verdict_t, the verifier's answer (auth.h) */
    RT_CONN_MSG_BUDGET_CHECK,    /* tag timer: the hold at the memory budget has run out */
    RT_CONN_MSG_CONNECT_TIMEOUT, /* tag timer: connect_timeout after accept */
    RT_CONN_MSG_RATE_RESUME,     /* tag timer: the rate limit's buckets have refilled */
    RT_CONN_MSG_IMPORTED,        /* first turn of a session that moved here (move.c) */
    RT_CONN_MSG_MOVE_TIMEOUT,    /* tag timer: the node taking this session never came back */
    RT_CONN_MSG_ACL_LOG,         /* tag timer: denials were held back from the log (denials.c) */
    RT_CONN_MSG_TOKEN_EXPIRY,    /* tag timer: the login's token may have run out (grant.c) */
    /* From administrators (broker.h), in the broker's block so no other actor can mean them. */
    RT_CONN_MSG_QUERY = RT_BROKER_MSG_BASE + 0x10, /* data: what to answer with */
    RT_CONN_MSG_KICK,                              /* end the connection and the session */
    RT_CONN_MSG_ACL_RECHECK,                       /* the ACL changed: drop what it forbids */
};

/*
** One of the client's subscriptions, kept for session end, shared-group moves and persistence.
** Its options are rt_trie_opts_t packed (rt__conn_sub_opts), so that an entry is 16 bytes: a
** client with one subscription then keeps its list, its client id and its filter in the
** heap's smallest objects.
*/
typedef struct {
    char *filter;    /* heap (leaf), NUL-terminated; the list of them is RT_OBJ_SCAN */
    uint32_t sub_id; /* the options, as rt_trie_opts_t names them */
    uint16_t len;    /* a filter is at most RT_TOPIC_MAX_LEN bytes */
    uint8_t qos : 2;
    uint8_t no_local : 1;
    uint8_t retain_as_published : 1;
    uint8_t retain_handling : 2;
    uint8_t persistent : 1;
    uint8_t acl_check : 1;
    uint8_t exclusive : 1; /* its client holds the filter's claim (exclusive.h) */
} sub_entry_t;

_Static_assert(sizeof(sub_entry_t) == 16, "a subscription entry is one smallest heap object");
_Static_assert(RT_TOPIC_MAX_LEN <= UINT16_MAX, "sub_entry_t.len is 16 bits");

static inline rt_trie_opts_t rt__conn_sub_opts(const sub_entry_t *e)
{
    return (rt_trie_opts_t){.sub_id = e->sub_id,
                            .qos = e->qos,
                            .no_local = e->no_local,
                            .retain_as_published = e->retain_as_published,
                            .retain_handling = e->retain_handling,
                            .persistent = e->persistent,
                            .acl_check = e->acl_check,
                            .exclusive = e->exclusive};
}

static inline void rt__conn_sub_set_opts(sub_entry_t *e, const rt_trie_opts_t *o)
{
    e->sub_id = o->sub_id;
    e->qos = o->qos & 3;
    e->no_local = o->no_local != 0;
    e->retain_as_published = o->retain_as_published != 0;
    e->retain_handling = o->retain_handling;
    e->persistent = o->persistent;
    e->acl_check = o->acl_check;
    e->exclusive = o->exclusive;
}

/* A connection's topic aliases in both directions (MQTT 5 3.3.2.3.4); RT_OBJ_SCAN. */
typedef struct {
    char **in;           /* the client's: alias - 1 -> topic, max_topic_alias of them, or NULL
                            (RT_OBJ_SCAN: it holds the topics' pointers) */
    rt_alias_out_t *out; /* ours: NULL when the client's Topic Alias Maximum allows none */
} conn_aliases_t;

/*
** What only some connections hold, in one heap object (RT_OBJ_SCAN) made on first use, so
** that an idle client pays one pointer for all of it.
*/
typedef struct {
    char *peer;           /* "ip:port" for rules, made when a client publishes with rules on */
    char *acl_text;       /* the login's own ACL (auth.h's grant), as granted: passed on with
                             the socket to a session's holder */
    struct rt_acl_s *acl; /* ... parsed (malloc, charged to the actor); NULL: acl_file judges */
    uint32_t acl_len;
    int64_t expire_at_s; /* Unix seconds the login's token runs out; 0: never */
    rt_tenant_t *tenant; /* its mountpoint's (mount.c); NULL: none. A reference of its own */
} conn_extra_t;

typedef struct conn_s conn_t;
struct conn_s {
    rt_sock_t *sock;  /* NULL while an offline session waits for its client */
    uint8_t *partial; /* bytes of an incomplete packet; NULL when none */
    char *client_id;
    char *username; /* from CONNECT, for the ACL; NULL when anonymous */
    conn_extra_t *extra; /* what few connections hold, made on first use; NULL: none */
    sub_entry_t *subs;
    rt_session_t *sess;      /* inflight and queued messages; NULL until the first one */
    void *will;              /* heap handle of the will as a canonical PUBLISH, or NULL */
    conn_aliases_t *aliases; /* topic aliases (MQTT 5): made at CONNECT if the client allows
                                some, else on its first alias; NULL for none */
    uint64_t last_rx_ns;     /* rt_mono_ns of the last read: keepalive, and PUBLISH read times */
    /* One word for two times that never both matter: the session's end exists only offline,
       the CONNECT's time only while connected (this struct is an idle connection's memory). */
    union {
        uint64_t expire_at_ms;    /* offline: when the session ends (monotonic ms) */
        uint64_t connected_at_ms; /* connected: when its CONNECT was accepted (unix ms) */
    };
    /* One word for two things that never both matter: a delayed will exists only offline,
       the transport only with a socket. */
    union {
        uint64_t will_at_ms; /* offline with a delayed will: when it is published */
        rt_xport_t *xp;      /* with a socket: TLS, WebSocket, PROXY, rate (xport.h); NULL for
                                plain TCP; read it through rt__conn_xp */
    };
    uint32_t partial_len, partial_cap; /* a packet is at most max_packet_size */
    uint32_t nsubs, capsubs;
    uint32_t session_expiry;  /* seconds the session outlives its connection; 0: ends with it */
    uint32_t will_delay;      /* seconds: min(will delay, session expiry), MQTT 5 3.1.3.2.2 */
    uint32_t peer_max_packet : 29;            /* the client's Maximum Packet Size (MQTT 5), 0: none;
                                                 held as at most 2^29 - 1, past MQTT's largest packet */
    uint32_t accept_tick_pending : 1;         /* conn_init's connect_timeout timer has not fired */
    uint32_t keepalive_rides_accept_tick : 1; /* the keepalive's next check is that timer's:
                                                 one timer per connection, not two */
    uint32_t dropped;         /* messages not delivered: too large for the client, or queue full */
    uint32_t max_packet : 28; /* max_packet_size when the socket came: what CONNACK tells, kept
                                 for the connection's life though the limit may change (it is
                                 at most 268,435,455, MQTT's largest) */
    uint32_t claimed : 1;     /* connected under a cluster claim of its id: served only while
                                 the lease it was made under holds (rt_cluster_lease_holds) */
    uint32_t lease : 2;       /* that lease's generation (its low bits) */
    uint16_t keepalive;       /* seconds, 0 = none */
    uint16_t next_packet_id;
    uint16_t recv_max; /* the client's Receive Maximum (MQTT 5), 65535 when absent */
    union {
        uint16_t rx_max; /* connected (MQTT 5): the Receive Maximum its CONNACK told */
        uint8_t refusal; /* CONNACK code held back while a failed login waits out its delay */
    };
    uint8_t version : 3;        /* 0 until CONNECT, then 3, 4 or 5 */
    uint8_t budget_hold : 1;    /* at its memory budget: its publishers are held (delivery.c) */
    uint8_t budget_spent : 1;   /* the hold ran out: the newest are dropped until it is under */
    uint8_t name_unvouched : 1; /* no password file vouched for the CONNECT's user name: the
                                   client is anonymous and the name unused (auth.h) */
    uint8_t out_muted : 1;      /* unsent output past RT_CONN_OUTPUT_MARK: input waits (conn.c) */
    uint8_t preauth : 1;        /* not authenticated yet: partial_cap counts in the pre-auth
                                   budget (max_preauth_memory) */
    uint8_t disc_rc;            /* 1 + the reason code the connection ended with (DISCONNECT from
                                   either side, or the server's reason to close); 0: none yet */
    /* Flags as bits: this struct is most of an idle connection's memory. */
    uint8_t closing : 1;         /* the connection is ending: read and deliver nothing more on it */
    uint8_t resuming : 1;        /* the CONNECT being handled continues this actor's session */
    uint8_t connected : 1;       /* counted in stats.connections */
    uint8_t keepalive_armed : 1; /* a keepalive timer is pending (one chain per actor) */
    uint8_t discard_will : 1;    /* a normal DISCONNECT came (3.1.2.5) */
    uint8_t stored : 1;          /* the store has (or had) this session: its end must be written */
    uint8_t shedding : 1; /* its client stopped reading: publishers drop QoS 0 for it (rt_shed) */
    uint8_t parse_pending : 1; /* RT_CONN_MSG_PARSE_MORE is queued; socket reading is paused */
    uint8_t slow_check : 1;    /* RT_CONN_MSG_SLOW_CHECK is pending */
    uint8_t clean_start : 1;   /* of the last CONNECT (for administrators) */
    uint8_t verifying : 1;     /* the verifier is deciding the CONNECT at the front of partial */
    uint8_t claiming : 1;      /* ... or the cluster is claiming its client id (with verifying) */
    uint8_t listener : 4;      /* the socket's listener (conf.listeners index, < 16) */
};

/*
** An idle connection's memory is its actor: the actor header (224 bytes), conn_t and the
** inline heap must stay in a 416-byte slab.
*/
_Static_assert(sizeof(conn_t) <= 144, "conn_t outgrew its slab class");

static inline rt_tenant_t *rt__conn_tenant(const conn_t *c)
{
    return c->extra ? c->extra->tenant : NULL;
}

/*
** The connection's first small objects live in the actor itself (rt_actor_type_t.heap_inline),
** so an idle client needs no heap: its id and, with one subscription, the list entry and the
** filter's copy, 16 bytes each for an id and a filter below 16 characters.
*/
#define RT_CONN_HEAP_INLINE 48
_Static_assert(RT_CONF_MAX_LISTENERS <= 16, "conn_t.listener is 4 bits");

/* RT_CONN_MSG_RESUME's first byte: the listener in the low 4 bits, the claim's in the next
   three (conn.c), and this bit when the login took the CONNECT's user name as anonymous. */
#define RT_CONN_RESUME_UNVOUCHED 0x80

/*
** Unsent output (the socket's and TLS's) past which a connection neither parses nor reads its
** client's input until the output has drained (RT_SOCK_WRITABLE): each packet rtd answers
** (PINGRESP, acknowledgements, SUBACK, a WebSocket pong) is output the client makes, so a
** client that does not read cannot make rtd write more than this plus one packet's answer.
** The session's queue stops going out at it too (delivery.c), so what waits for a slow
** reader is queued messages, under the session's limits and memory budget.
*/
#define RT_CONN_OUTPUT_MARK RT_SOCK_HIGH_WATER

#define RT_CONN_QOS2_PENDING_MAX 65535 /* inbound QoS 2 packet ids awaiting PUBREL */

/*
** rt_grow_on for the arrays of conn_t and its session (on the actor's heap), whose counts and
** capacities are uint32_t to keep an idle connection small: RT_ENOMEM also when need is past
** what a uint32_t capacity can double to.
*/
static inline int rt__conn_grow(rt_actor_t *self, void *arr, uint32_t *cap, size_t need,
                                size_t elem, size_t min, rt_obj_kind_t kind)
{
    if (need > UINT32_MAX / 2)
        return RT_ENOMEM;
    size_t n = *cap;
    int rc = rt_grow_on(self, arr, &n, need, elem, min, kind);
    RT_ASSERT(n <= UINT32_MAX);
    *cap = (uint32_t)n;
    return rc;
}

/*
** Deliveries made while handling the current socket event (one actor per thread at a time):
** publish.c counts them, conn.c yields once they reach its budget.
*/
extern _Thread_local uint32_t rt__conn_routed_this_event;

/* ---- conn.c: the actor ---- */
extern const rt_actor_type_t rt__conn_restored_type; /* arg: const rt_stored_session_t * */
/* Encodes pk for the client's version and queues it on the socket (sent at the end of the
   turn). MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE) past the client's Maximum Packet Size. */
int rt__conn_send_packet(conn_t *c, mqtt_packet_t *pk);
/* Queues an encoded packet of this type on the socket and counts it. */
int rt__conn_write_packet(conn_t *c, uint8_t type, const uint8_t *buf, size_t len);
/*
** Frames of at least RT_CONN_IN_PLACE_MIN bytes are encoded straight into the socket's output
** (rt_sock_reserve; then rt_sock_commit and rt__conn_count_packet_out): for smaller ones the
** copy from a stack buffer measured cheaper than a second way through. NULL: use the buffer
** and rt__conn_write_packet (a transport or a trace takes the frame whole; the socket gone or
** memory short, which rt__conn_write_packet then reports).
*/
#define RT_CONN_IN_PLACE_MIN 512
uint8_t *rt__conn_reserve_frame(conn_t *c, size_t len);
void rt__conn_count_packet_out(uint8_t type, size_t len);
/* A broker event for rules: the fields that do not apply stay -1 / NULL. */
void rt__conn_rule_event(rt_actor_t *self, conn_t *c, rt_rule_event_kind_t kind, const char *topic,
                         int qos, int reason_code, const char *reason, rt_bin_t *canonical);
/* The client as rules see it (for a message it publishes or an event about it). */
rt_rule_origin_t rt__conn_rule_origin(rt_actor_t *self, conn_t *c);
/* rt_rules_publish with this connection as the origin, built only if a rule will read it. */
int rt__conn_rules_publish(rt_actor_t *self, conn_t *c, rt_bin_t *bin, rt_pid_t ack_pid,
                           uint64_t ack_token, bool *promised);
/* An address as text, IPv4 without its v4-mapped prefix ("?" if it cannot be written). */
/* The connection's alias tables, made on first use; NULL when out of memory. */
conn_aliases_t *rt__conn_aliases_get_or_make(rt_actor_t *self, conn_t *c);
/* Counts the client in stats.connections (on) or out of it; no change if it already is. */
void rt__conn_count_connected(conn_t *c, bool on);
/*
** Ends the connection: v5 clients are told why (reason 0 means no DISCONNECT). A persistent
** session goes offline; otherwise the actor exits.
*/
void rt__conn_close(rt_actor_t *self, conn_t *c, uint8_t reason, rt_reason_t exit_reason);
/* Releases the will now (a will can be as big as any message). */
void rt__conn_drop_will(rt_actor_t *self, conn_t *c);
/* Publishes the will now (its delay, if any, is over or the session ends), then drops it. */
void rt__conn_publish_will(rt_actor_t *self, conn_t *c);
/* A v5 DISCONNECT with reason (and its text as a reason string). */
void rt__conn_send_disconnect(conn_t *c, uint8_t reason);
/* Closes the client's socket (flushing what is buffered, such as a DISCONNECT). */
void rt__conn_close_socket(conn_t *c);
/* Frees what belongs to one network connection, not to the session. */
void rt__conn_reset_connection_state(rt_actor_t *self, conn_t *c);
/* client.disconnected: the MQTT reason code the connection ended with, or -1 (none). */
int rt__conn_disc_reason_code(const conn_t *c);
/* Pre-auth bytes (max_preauth_memory): whether bytes more (or back, negative) may be held. */
bool rt__conn_preauth_take(const conn_t *c, int64_t bytes);
/* The connection authenticated (or is ending): its bytes no longer count as pre-auth. */
void rt__conn_preauth_end(conn_t *c);
/* Starts the keepalive check if the client has a keepalive and none is pending. */
void rt__conn_arm_keepalive(rt_actor_t *self, conn_t *c);
/* Offline: the session ends in session_expiry seconds unless its client comes back. */
void rt__conn_arm_session_expiry(rt_actor_t *self, conn_t *c);
/* Parses what waits in the partial buffer, then reads the socket on (RT_CONN_MSG_PARSE_MORE). */
void rt__conn_parse_more(rt_actor_t *self, conn_t *c);
/* The MQTT reason code an error from the codec or a handler stands for. */
uint8_t rt__conn_error_reason(int err);
/*
** Whether unsent output is past RT_CONN_OUTPUT_MARK after sending what it can now: then an
** RT_SOCK_WRITABLE event will come when it has drained. False once the peer is gone (the next
** read says so).
*/
bool rt__conn_output_backed_up(conn_t *c);
/* Input waits until the socket's output drains (RT_SOCK_WRITABLE must come: output the
   kernel refused waits). */
void rt__conn_hold_input(conn_t *c);
/* Ends a connection whose wanted bytes did not fit in the pre-auth budget, and logs it. */
void rt__conn_preauth_refused(rt_actor_t *self, conn_t *c, size_t wanted);
/* Counts and logs a packet that ends the connection (connect_id: the refused CONNECT's). */
void rt__conn_log_bad_packet(rt_actor_t *self, conn_t *c, mqtt_str_t connect_id, uint8_t reason);

/* ---- connect.c: CONNECT ---- */
/* Handles the CONNECT pk; bytes[0..len) are what was read from it on (for a hand-over). */
int rt__conn_handle_connect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, const uint8_t *bytes,
                            size_t len);
void rt__conn_on_login_verdict(rt_actor_t *self, conn_t *c, const rt_auth_verdict_t *v);
/*
** Whether the CONNECT being parsed was parsed once already: again with the verifier's verdict,
** or in the actor holding its session after a hand-over (a trace shows it once).
*/
bool rt__conn_connect_parsed_before(const conn_t *c);
/* Writes the whole session to the store: it has just become persistent (or is new here). */
void rt__conn_session_persist_all(conn_t *c);
/* The negative CONNACK a failed login held back; then the actor exits. */
void rt__conn_send_login_refusal(rt_actor_t *self, conn_t *c);
/* A session begins (it ends in the actor's terminate). */
void rt__conn_count_session(void);
/* A Session Expiry Interval from CONNECT (or DISCONNECT), within max_session_expiry. */
uint32_t rt__conn_clamp_session_expiry(uint64_t requested);

/* ---- publish.c: PUBLISH from the client ---- */
int rt__conn_handle_publish(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk);
/* PUBREL: the exactly-once exchange of an inbound QoS 2 message ends (PUBCOMP). */
void rt__conn_on_pubrel(conn_t *c, const mqtt_packet_t *pk);
/* Remembers an inbound QoS 2 id until its PUBREL; RT_ENOMEM, or RT_ELIMIT past the bound. */
int rt__conn_qos2_add(rt_actor_t *self, conn_t *c, uint16_t packet_id);
/* One commit a held acknowledgement waits for came (status < 0: it failed). */
void rt__conn_on_commit(rt_actor_t *self, conn_t *c, uint64_t token, int32_t status);
/*
** Whether rtd withholds (waiting for commits) as many acknowledgements as the client may
** leave unacknowledged: its input then waits unparsed, its socket unread, until commits
** come (publish.c). Not the client's doing, so never a reason to disconnect it.
*/
bool rt__conn_acks_held(const conn_t *c);
/* Parsing stopped while acks were held goes on: in a later turn, as after a yield. */
void rt__conn_resume_parsing(rt_actor_t *self, conn_t *c);
/* max_topic_length and max_topic_levels (0: no limit), for topic names and filters alike. */
bool rt__conn_topic_within_limits(const uint8_t *t, size_t len);

/* ---- subscribe.c: subscriptions ---- */
int rt__conn_handle_subscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk);
/*
** A PUBLISH's topic (RT_REWRITE_PUBLISH) or a (UN)SUBSCRIBE's filter as the rewrite rules make
** it (rewrite.h), in place: the new bytes in *buf, the caller's to free (rt_free). False when
** the rule that applies makes no topic name (or filter), logged client.rewrite_invalid.
*/
bool rt__conn_rewrite(rt_actor_t *self, const conn_t *c, rt_rewrite_action_t action, mqtt_str_t *t,
                      char **buf);
/*
** auto_subscribe (config.h) at CONNECT: each configured filter, %c and %u filled in, subscribed
** as the client's own SUBSCRIBE would be (limits, the ACL, the session's store, retained
** messages) without a SUBACK, which the client did not ask for. A filter that cannot be made
** (no user name for %u, a client id or name with a wildcard) is skipped, a refused one logged.
*/
void rt__conn_auto_subscribe(rt_actor_t *self, conn_t *c);
/* Sends the retained messages new subscriptions get: rec holds what the SUBSCRIBE left
   for them (subscribe.c), now or back from a cluster (RT_CLUSTER_MSG_RETAINED_READY). */
void rt__conn_send_retained(rt_actor_t *self, conn_t *c, const uint8_t *rec, size_t len);
/* The cluster claimed (or could not claim) the client id of the CONNECT that waits for it. */
void rt__conn_on_claimed(rt_actor_t *self, conn_t *c, const rt_cluster_claimed_t *r);
/* A session kept offline here checks its id is still this node's (RT_CLUSTER_MSG_LEASE held:
   after a restart, or a lapse of the lease); the answer comes to rt__conn_on_verified, which
   ends a stale one. */
void rt__conn_verify_kept(rt_actor_t *self, conn_t *c);
void rt__conn_on_verified(rt_actor_t *self, conn_t *c, const rt_cluster_claimed_t *r);
int rt__conn_handle_unsubscribe(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk);
/* Adds (or updates) a subscription in the client's list; RT_ENOMEM. */
int rt__conn_sub_remember(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len,
                          const rt_trie_opts_t *o);
/*
** Ends one subscription everywhere it is kept: the trie (no more deliveries), the store and
** the client's list; rules hear of it. f may be the list's own copy (it is forgotten last).
** Returns whether the trie had it.
*/
bool rt__conn_sub_drop(rt_actor_t *self, conn_t *c, const uint8_t *f, size_t len);
/* The session ends: every subscription leaves the trie and gives its exclusive claim up
   (the list goes with the heap). */
void rt__conn_subs_unhook(rt_actor_t *self, conn_t *c);
/* Claims filter for the client's exclusive subscription (exclusive.h), charged to it; false
   when another client holds it (or no memory). */
bool rt__conn_exclusive_claim(rt_actor_t *self, const conn_t *c, const char *filter, size_t len);
/* A member going offline leaves its shared groups; its pending messages go to the others. */
void rt__conn_leave_shared_groups(rt_actor_t *self, conn_t *c);
void rt__conn_rejoin_shared_groups(rt_actor_t *self, conn_t *c);

/* ---- denials.c: the client's requests the ACL refused ---- */
enum { RT_CONN_DENIED_PUBLISH, RT_CONN_DENIED_SUBSCRIBE, RT_CONN_DENIED_WILL };
/* Counts a denial (client, listener) and logs it, one acl.denied line a second at most. */
void rt__conn_acl_denied(rt_actor_t *self, conn_t *c, int action, const uint8_t *topic, size_t len);
/* RT_CONN_MSG_ACL_LOG, and the actor's end: the denials held back, told in one line. */
void rt__conn_acl_log_due(conn_t *c);

/* ---- delivery.c: messages to the client ---- */
/* A message routed to this session (RT_MSG_DELIVER, or a retained one on subscribe). */
void rt__conn_deliver(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                      const uint32_t *sub_ids);
/* After CONNACK on a resumed session: unacknowledged messages again, in order, then the queue. */
void rt__conn_retransmit(rt_actor_t *self, conn_t *c);
/* PUBACK, PUBREC or PUBCOMP for a message the broker sent. */
void rt__conn_on_delivery_ack(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk);
void rt__conn_on_slow_check(rt_actor_t *self, conn_t *c);
/* Output past the pressure mark: the slow-consumer check is armed (if it is not yet). */
void rt__conn_watch_backlog(rt_actor_t *self, conn_t *c);
/* What the client makes rtd hold: its actor's heap and binaries, and its unsent output. */
size_t rt__conn_memory(const conn_t *c);
/*
** Ends a hold at the memory budget once the client is under it again, or when the hold ran
** out (then the newest messages are dropped until it is).
*/
void rt__conn_budget_check(conn_t *c, bool hold_expired);
/* Whether what the client sent (subscriptions, ids, acks waiting) alone passes its budget. */
bool rt__conn_inbound_over_budget(const conn_t *c);
/* A retained message a new subscription gets: queued, sent as the client reads. */
void rt__conn_deliver_retained(rt_actor_t *self, conn_t *c, rt_bin_t *bin, const rt_delivery_t *d,
                               const uint32_t *sub_ids);
/* The socket drained: queued messages go on out. */
void rt__conn_pump(rt_actor_t *self, conn_t *c);
/* Whether the client is connected and past CONNECT, so messages can go out now. */
bool rt__conn_online(const conn_t *c);
/* The client's receive window for QoS 1 and 2 (MQTT 5 receive maximum, 4.9). */
uint32_t rt__conn_send_window(const conn_t *c);
/* The session's message state, made on first use; NULL when out of memory. */
rt_session_t *rt__conn_session_get_or_make(rt_actor_t *self, conn_t *c);
/* A session the store keeps: it outlives its connection and persistence is on. */
bool rt__conn_session_is_durable(const conn_t *c);
/* m as the store and a moving session's bytes keep it (the binary is m's, not a new reference). */
rt_stored_msg_t rt__conn_stored_msg(const rt_qmsg_t *m);
/* Saves a message that joined a persistent session; the publisher's ack waits for it. */
void rt__conn_store_msg(conn_t *c, rt_qmsg_t *m, rt_pid_t ack_pid, uint64_t token);
/* Moves every shared-subscription message not yet acknowledged to the groups' other members. */
void rt__conn_hand_over_shared(rt_actor_t *self, conn_t *c);
/* The type's dead_letter: deliveries the actor never took still answer their publishers. */
void rt__conn_dead_letter(void *state, rt_msg_t *m);

/* ---- conn.c, for the transport ---- */
/* MQTT bytes from the transport: parsed, or kept while parsing waits (verifier, budget). */
void rt__conn_input(rt_actor_t *self, conn_t *c, const uint8_t *p, size_t n);
/*
** Hands the socket (with its transport) and bytes, the client's input from its CONNECT on,
** to holder, the actor keeping the session; then this actor exits. If the socket cannot
** be handed over (output the kernel would not take), the connection just ends.
*/
void rt__conn_send_socket(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                          size_t len);

/* ---- conn_xport.c: the connection as its transport's owner ---- */
/* The transport, or NULL: none (plain TCP), or no socket (xp shares its word). */
static inline rt_xport_t *rt__conn_xp(const conn_t *c)
{
    return c->sock ? c->xp : NULL;
}
/* At accept (or a plain socket): the listener's transport, or none (c->xp NULL). */
int rt__conn_xport_start(conn_t *c);
/* Bytes read from the socket, through the transport's layers to rt__conn_input. */
void rt__conn_xport_input(rt_actor_t *self, conn_t *c, uint8_t *p, size_t n);
/* Input the transport held back while output was backed up goes on up. */
void rt__conn_xport_resume(rt_actor_t *self, conn_t *c);
/* A CONNECT inside rt__conn_xport_input hands the socket over once the input is all taken. */
void rt__conn_hand_over(rt_actor_t *self, conn_t *c, rt_pid_t holder, const uint8_t *bytes,
                        size_t len);
/* MQTT bytes that arrive while a hand-over collects them; false when there is none. */
bool rt__conn_collect(const conn_t *c, const uint8_t *p, size_t n);
/* The CONNECT was accepted: a user's own rate limit replaces the listener's. */
void rt__conn_user_rate(conn_t *c);
/* Before reading: true when over the rate (reading paused until RT_CONN_MSG_RATE_RESUME). */
bool rt__conn_rate_hold(rt_actor_t *self, conn_t *c);
/* identity_as_username: the client certificate's name into out; false if not on or none. */
bool rt__conn_identity(conn_t *c, char *out, size_t len);
bool rt__conn_identity_required(const conn_t *c);
/* Logs a connection cut by connect_timeout, as the step it did not finish. */
void rt__conn_log_timeout(const conn_t *c, long after_s);
/*
** The client's address and port: behind a trusted proxy, the ones it named, else the socket's.
** Read at most once into a zeroed p and kept there: a CONNECT asks for them up to three times
** (bans, the login, its log line), and each read of the socket's is a system call.
*/
typedef struct {
    rt_auth_addr_t addr;
    uint16_t port;
    int8_t known; /* 0: not read yet; 1: addr and port hold; -1: none (no socket, not IP) */
} conn_peer_t;
const conn_peer_t *rt__conn_peer(const conn_t *c, conn_peer_t *p);
/* "ip:port" of p into buf ("?:0" when none). */
void rt__conn_peer_text(const conn_peer_t *p, char *buf, size_t len);
/* The same, read now. */
void rt__conn_peer_format(const conn_t *c, char *buf, size_t len);

/* "host:port" of MQTT listener index (its registered name's tail, start.c); "" before the
   listeners start. */
const char *rt__conn_listener_text(unsigned index);

/* ---- grant.c: what the login granted (auth.h): an ACL of the client's own, an expiry ---- */
/* The client's ACL decision (acl.h): its own ACL's when its login granted one. */
int rt__conn_acl(const conn_t *c, const void *topic, size_t len, unsigned access);
/* Takes a login's grant (ACL text, token expiry) and its tenant (mount, expanded; "": none):
   0, or RT_EINVAL / RT_ENOMEM (logged). */
int rt__conn_take_grant(rt_actor_t *self, conn_t *c, int64_t expire_at_s, const char *acl,
                        size_t acl_len, const char *mount);
/* Drops it (a new CONNECT, the session's end). */
void rt__conn_drop_grant(rt_actor_t *self, conn_t *c);
/* Bytes rt__conn_write_grant writes, and the writing: i64 expiry, u32 length, the ACL text,
   u8 length, the mountpoint. */
size_t rt__conn_grant_size(const conn_t *c);
void rt__conn_write_grant(const conn_t *c, uint8_t *out);
/* Reads what rt__conn_write_grant wrote at the front of data: bytes read, or 0 if malformed. */
size_t rt__conn_read_grant(rt_actor_t *self, conn_t *c, const uint8_t *data, size_t len);
/* RT_CONN_MSG_TOKEN_EXPIRY: ends the connection (0xA0) once the token ran out. */
void rt__conn_on_token_expiry(rt_actor_t *self, conn_t *c);
/* The peer text rules saw is made again from the next socket's address. */
void rt__conn_forget_peer(rt_actor_t *self, conn_t *c);
/* The extra object, made on first use: NULL when out of memory. */
conn_extra_t *rt__conn_extra(rt_actor_t *self, conn_t *c);

/* ---- mount.c: tenants (broker/tenant.h) ---- */
/*
** The connection's tenant from now on: mount's (NULL or "": none), the old one's subscriptions
** given back, the new one's taken (not refused: they exist). 0 or RT_ENOMEM. The connection
** is not counted as connected while its tenant changes.
*/
int rt__conn_set_tenant(rt_actor_t *self, conn_t *c, const char *mount);
/*
** The login's mountpoint into mount: granted (its authenticator's, "" or NULL: none) or its
** listener's, %u and %c filled in. 0, or RT_EINVAL (logged client.mount_refused).
*/
int rt__conn_mount_login(const conn_t *c, const char *granted, const char *user, const char *cid,
                         char mount[RT_CONF_MOUNT_MAX]);
/*
** A topic name, or a filter ($share/group/filter keeps its group in front), put under the
** tenant's mountpoint in place: its new bytes in room when they fit (room_len bytes; NULL:
** none), else they replace *buf (freed; the caller frees the new one). True with nothing done
** for a connection without a tenant; false when it would be longer than a topic may be, or
** there is no memory.
*/
bool rt__conn_mount_name(rt_actor_t *self, const conn_t *c, mqtt_str_t *t, char *room,
                         size_t room_len, char **buf);
bool rt__conn_mount_filter(rt_actor_t *self, const conn_t *c, mqtt_str_t *f, char **buf);
/* A topic as the client sees it (its mountpoint taken off): false if it is not under it. */
bool rt__conn_unmount(const conn_t *c, mqtt_str_t *t);
/* The client id as its client named it (%c in ACLs and auto_subscribe): without the
   mountpoint the broker holds it under. NULL before CONNECT. */
const char *rt__conn_own_client_id(const conn_t *c);

/* ---- listener.c ---- */
/*
** Counts a connection under the address its proxy named (max_connections_per_ip), for
** listeners that take the address from a PROXY header or X-Forwarded-For: false (not
** counted) when that address is at its limit.
*/
bool rt__listener_admit_peer(int fd, const rt_auth_addr_t *addr);

/* ---- client_admin.c: administrators ---- */
void rt__conn_on_query(rt_actor_t *self, conn_t *c, const rt_msg_t *m);
void rt__conn_on_kick(rt_actor_t *self, conn_t *c);
void rt__conn_on_acl_recheck(rt_actor_t *self, conn_t *c);

/* ---- start.c: sessions restored from the store ---- */
int rt__conn_restored_init(rt_actor_t *self, void *state, void *arg);
/* An offline session made from ss (the store's, or one that moved here); persistent: its
   subscriptions ask publishers for durable acks. */
int rt__conn_session_from_stored(rt_actor_t *self, conn_t *c, const rt_stored_session_t *ss,
                                 bool persistent);

/* ---- move.c: sessions moving between cluster nodes (cluster.h; bytes: session_bytes.h) ---- */
extern const rt_actor_type_t rt__conn_imported_type; /* arg: the rt_moved_t move.c read */
int rt__conn_imported_init(rt_actor_t *self, void *state, void *arg);
/* The importer hook (rt_cluster_set_importer). */
rt_pid_t rt__conn_import_session(const char *id, const void *bytes, size_t len);
/* Another node takes this session: phase 1 gives the session, phase 2 the rest, then exits. */
void rt__conn_on_move_out(rt_actor_t *self, conn_t *c, const rt_cluster_move_t *req);
/* The old node's rest, merged behind what came with phase 1. */
void rt__conn_on_move_in(rt_actor_t *self, conn_t *c, const uint8_t *bytes, size_t len);
/* A copy of a message the session took with it from its old node (session.h,
   rt_late_names_t): true to drop it. Only while c->sess->late. */
bool rt__conn_late_copy(rt_actor_t *self, conn_t *c, rt_bin_t *bin);
/* First turn of an imported session: it is written to the store as this node's. */
void rt__conn_on_imported(rt_actor_t *self, conn_t *c);
/* Durable mode: writes a persistent session's record (changed: its subscriptions or
   expiry did; otherwise at most every few seconds, for its clear moment). */
void rt__conn_record_session(rt_actor_t *self, conn_t *c, bool changed);

#endif

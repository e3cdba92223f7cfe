/*
** The broker's shared state: the topic trie (read concurrently by publishers), the
** retained store, the client table (client id -> the actor that holds it, so a
** takeover is one swap), counters and metrics, and the limits an administrator can
** change while rtd runs. Connections (conn.h) and routing (route.h) build on it.
*/
#ifndef RT_BROKER_H
#define RT_BROKER_H

#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "rt.h"
#include "topic_trie.h"

/* Why a CONNECT's login was refused (index of rt_broker_stats_t.auth_failed). */
enum {
    RT_AUTH_FAILED_BAD_PASSWORD, /* a known user, a wrong password */
    RT_AUTH_FAILED_UNKNOWN_USER, /* a user name the password file does not have */
    RT_AUTH_FAILED_ANONYMOUS,    /* anonymous, from where anonymous clients may not come */
    RT_AUTH_FAILED_NO_CERT_NAME, /* identity_as_username: the certificate names no one */
    RT_AUTH_FAILED_UNAVAILABLE,  /* an authentication service did not answer (auth_http.h) */
    RT_AUTH_FAILED_REASONS
};
extern const char *const rt_auth_failed_names[RT_AUTH_FAILED_REASONS]; /* "bad_password", ... */

/* What an ACL denial refused (index of the denial counters). */
enum { RT_ACL_DENIED_PUBLISH, RT_ACL_DENIED_SUBSCRIBE, RT_ACL_DENIED_KINDS };

typedef struct rt_broker_stats_s {
    atomic_uint_fast64_t connections;      /* connected now (CONNACK sent) */
    atomic_uint_fast64_t sockets;          /* connection actors alive */
    atomic_uint_fast64_t bad_packets;      /* malformed or protocol errors */
    atomic_uint_fast64_t v31_sub_flags;    /* MQTT 3.1 (UN)SUBSCRIBEs with flags 0000, accepted */
    atomic_uint_fast64_t refused;          /* connections refused at accept (limits) */
    atomic_uint_fast64_t sessions;         /* sessions alive: connected plus offline */
    atomic_uint_fast64_t msgs_dropped;     /* refused by a full session queue (or QoS 0 offline) */
    atomic_uint_fast64_t msgs_expired;     /* message expiry interval ran out before sending */
    atomic_uint_fast64_t topic_limit_hits; /* topics or filters past max_topic_levels/length */
    atomic_uint_fast64_t subs_limit_hits;  /* SUBSCRIBEs refused by max_subscriptions */
    atomic_uint_fast64_t retained_limit_hits; /* retained messages refused by the store's limits */
    /* Listener (conn/listener.c): every refused connection counts in refused and in one reason. */
    atomic_uint_fast64_t accepted;          /* sockets accepted and handed to a connection */
    atomic_uint_fast64_t refused_max_conns; /* max_connections reached */
    atomic_uint_fast64_t refused_per_ip;    /* max_connections_per_ip reached for the address */
    atomic_uint_fast64_t refused_rate;      /* max_connection_rate: the listener's bucket empty */
    atomic_uint_fast64_t refused_error;     /* the connection actor could not start */
    atomic_uint_fast64_t refused_untrusted; /* a PROXY protocol listener: not from a trusted proxy */
    atomic_uint_fast64_t refused_fds;       /* the descriptors kept for rtctl and HTTP reached */
    /* Transports (transport/xport.c). */
    atomic_uint_fast64_t tls_failed;       /* TLS handshakes that failed */
    atomic_uint_fast64_t connect_timeouts; /* no CONNECT (or handshake) within connect_timeout */
    atomic_uint_fast64_t rate_limited;     /* times a client's rate limit paused its reading */
    /* Connections (conn/conn.c). */
    atomic_uint_fast64_t output_holds;    /* times unsent output stopped a client's input */
    _Atomic int64_t preauth_bytes;        /* bytes held for connections not authenticated yet */
    atomic_uint_fast64_t preauth_refused; /* connections ended at max_preauth_memory */
    atomic_uint_fast64_t connect_too_large; /* CONNECTs past max_connect_size */
    atomic_uint_fast64_t auth_failed[RT_AUTH_FAILED_REASONS]; /* logins refused, by reason */
    /* Kept by the connection actor (conn.c), read by $SYS (sys.c). Bytes and messages
       in and out count at every packet: they are per-thread metrics (rt_broker_metrics). */
    atomic_uint_fast64_t connects; /* CONNECTs accepted (CONNACK 0), ever */
    /* High-water marks since start, raised where the counts rise (rt_atomic_raise). */
    _Atomic uint64_t connections_max;
    _Atomic uint64_t sessions_max;
} rt_broker_stats_t;

/* Per listener (index as in conf.listeners); written by its listener and by connections. */
typedef struct rt_listener_stats_s {
    _Atomic int port; /* bound port; 0 until the listener is up */
    atomic_bool running;
    atomic_uint_fast64_t connections; /* sockets open now that came in through it */
    atomic_uint_fast64_t accepted;
    atomic_uint_fast64_t refused[7]; /* by reason: RT_REFUSED_* */
    atomic_uint_fast64_t acl_denied[RT_ACL_DENIED_KINDS]; /* its clients' denials (denials.c) */
} rt_listener_stats_t;

/* Why the listener refused a connection (index of rt_listener_stats_t.refused). */
enum {
    RT_REFUSED_ALL,
    RT_REFUSED_MAX_CONNS,
    RT_REFUSED_PER_IP,
    RT_REFUSED_RATE,
    RT_REFUSED_ERROR,
    RT_REFUSED_UNTRUSTED,
    RT_REFUSED_FDS,
};

/*
** The limits that can change while the broker runs (rt_broker_set_limit), as
** atomics: readers on every scheduler load them relaxed where they used to read
** conf, and take a new value at their next look. No reader needs two of them to
** agree with each other. Booleans are 0 or 1.
*/
typedef struct rt_broker_live_s {
    _Atomic long max_connections;
    _Atomic long max_connections_per_ip;
    _Atomic long max_connection_rate;
    _Atomic long max_connect_size;
    _Atomic long max_preauth_memory;
    _Atomic long max_packet_size;
    _Atomic long max_inflight;
    _Atomic long receive_maximum;
    _Atomic long max_queued_messages;
    _Atomic long max_client_memory;
    _Atomic long client_memory_hold_ms;
    _Atomic long max_topic_levels;
    _Atomic long max_topic_length;
    _Atomic long max_subscriptions;
    _Atomic long max_retained_messages;
    _Atomic long max_retained_bytes;
    _Atomic long max_keepalive;
    _Atomic long max_session_expiry;
    _Atomic long queue_qos0;
    _Atomic long allow_zero_length_clientid;
    _Atomic long delayed_publish;
    _Atomic long max_delayed;
    _Atomic long max_delayed_bytes;
    _Atomic long max_banned;
    _Atomic long tenant_max_connections;
    _Atomic long tenant_max_subscriptions;
    _Atomic long tenant_max_publish_rate;
    _Atomic long tenant_max_retained_bytes;
    _Atomic long flapping_max_connects;
    _Atomic long flapping_window_s;
    _Atomic long flapping_ban_s;
} rt_broker_live_t;

/* client_memory_policy, parsed once at start: it is restart-only (config.h). */
typedef enum { RT_MEMORY_HOLD, RT_MEMORY_DROP_NEWEST, RT_MEMORY_DROP_OLDEST } rt_memory_policy_t;

/* The current value of a live limit (a field of rt_broker_live_t). */
#define RT_LIVE(field) atomic_load_explicit(&rt_broker->live.field, memory_order_relaxed)

typedef struct rt_broker_s {
    rt_conf_t conf; /* as started; the live limits' current values are in live */
    rt_broker_live_t live;
    rt_memory_policy_t memory_policy; /* conf.client_memory_policy */
    rt_listener_stats_t listener_stats[RT_CONF_ALL_LISTENERS]; /* by RT_CONF_*_LISTENER index */
    rt_trie_t *trie;
    rt_retained_t *retained; /* canonical PUBLISH binaries by topic */
    rt_broker_stats_t stats;
    pthread_mutex_t clients_lock;     /* guards clients, clients_cap and clients_len */
    struct rt_client_slot_s *clients; /* client id -> pid (open addressing, linear probing) */
    size_t clients_cap, clients_len;
#ifndef NDEBUG
    _Atomic(const void *) clients_holder; /* names the thread holding clients_lock; NULL: none */
#endif
} rt_broker_t;

extern rt_broker_t *rt_broker;

/* A count and its high-water mark since the broker started. */
typedef struct rt_count_s {
    uint64_t count;
    uint64_t max;
} rt_count_t;

/* What the broker holds now (emqttd's `broker stats`); each read on its own, not one snapshot. */
typedef struct rt_broker_counts_s {
    rt_count_t connections;    /* clients connected (CONNACK sent) */
    rt_count_t sessions;       /* sessions alive: connected plus offline */
    rt_count_t topics;         /* distinct subscribed filters; each $share group counts as one */
    rt_count_t subscriptions;  /* ordinary subscriptions plus shared-group memberships */
    rt_count_t retained;       /* retained messages */
    rt_count_t retained_bytes; /* what max_retained_bytes counts of them */
    uint64_t shared_groups;    /* shared subscription groups */
} rt_broker_counts_t;

/* Reads atomics and the trie's counters, and takes the retained store's read lock briefly. */
void rt_broker_counts(rt_broker_counts_t *out);

/*
** Traffic counters, kept per thread because every packet counts: each scheduler
** adds to its own block, so no counter's cache line moves between cores at
** packet rate; rt_broker_metrics sums the blocks. A thread's block outlives it
** (the next thread takes it over), so nothing counted is lost.
*/
#define RT_MQTT_PACKET_TYPES 16 /* MQTT packet types are 1 (CONNECT) .. 15 (AUTH) */

enum {
    RT_METRIC_PKT_IN = 0,                                          /* + packet type */
    RT_METRIC_PKT_OUT = RT_METRIC_PKT_IN + RT_MQTT_PACKET_TYPES,   /* + packet type */
    RT_METRIC_BYTES_IN = RT_METRIC_PKT_OUT + RT_MQTT_PACKET_TYPES, /* read from client sockets */
    RT_METRIC_BYTES_OUT, /* written (or buffered) to client sockets */
    RT_METRIC_MSGS_IN,   /* PUBLISH received */
    RT_METRIC_MSGS_OUT,  /* PUBLISH sent */
    RT_METRICS
};

typedef struct rt_metrics_block_s {
    struct rt_metrics_block_s *next;      /* every block (metrics_all); never unlinked */
    struct rt_metrics_block_s *next_free; /* blocks whose thread ended */
    _Atomic uint64_t v[RT_METRICS];       /* written by the owning thread only */
} rt_metrics_block_t;

extern _Thread_local rt_metrics_block_t *rt__metrics_mine;
rt_metrics_block_t *rt__metrics_attach(void); /* the calling thread's block; NULL on OOM */

/* Adds n to metric which (RT_METRIC_*) for the calling thread: no locked instruction. */
static inline void rt__metric_add(unsigned which, uint64_t n)
{
    rt_metrics_block_t *b = rt__metrics_mine;
    if (RT_UNLIKELY(!b) && !(b = rt__metrics_attach()))
        return;
    atomic_store_explicit(&b->v[which],
                          atomic_load_explicit(&b->v[which], memory_order_relaxed) + n,
                          memory_order_relaxed);
}

typedef struct rt_broker_metrics_s {
    uint64_t packets_in[RT_MQTT_PACKET_TYPES]; /* by type: [1] CONNECT .. [15] AUTH; [0] none */
    uint64_t packets_out[RT_MQTT_PACKET_TYPES];
    uint64_t bytes_in, bytes_out;
    uint64_t msgs_in, msgs_out;          /* PUBLISH packets received, sent */
    uint64_t msgs_dropped, msgs_expired; /* as in rt_broker_stats_t */
} rt_broker_metrics_t;

/* Totals since the broker started (each counter exact, the set not one instant). */
void rt_broker_metrics(rt_broker_metrics_t *out);
/* "CONNECT" .. "AUTH" for packet types 1..15; NULL otherwise. */
const char *rt_mqtt_packet_name(unsigned type);

/*
** Changes a limit while the broker runs. value is written as in rtd.conf (the
** config loader parses and range-checks it). Returns 0; RT_ENOTFOUND for a key
** that is no setting; RT_EBUSY for a setting that cannot change live (err: "KEY
** needs a restart"); RT_EINVAL for a bad value (err says why). Logged at info.
** What each limit affects is in rt_broker_limits' `affects` text.
*/
int rt_broker_set_limit(const char *key, const char *value, char *err, size_t errlen);

typedef struct rt_limit_info_s {
    const char *key;
    char value[32];      /* as rtd.conf would write it */
    bool live;           /* rt_broker_set_limit can change it */
    const char *affects; /* what a change applies to (or why it needs a restart) */
} rt_limit_info_t;

/* Fills up to max limits; returns how many there are. */
size_t rt_broker_limits(rt_limit_info_t *out, size_t max);

/* Creates the broker's shared state (client table, trie, retained store); RT_ENOMEM. */
int rt_broker_init(const rt_conf_t *conf);
/* Once no actor runs (after rt_shutdown): frees the broker's state. The store is not its. */
void rt_broker_free(void);

/*
** Client ids. claim makes pid the holder of id and returns the previous holder
** (0 if none), which the caller takes over; release drops the entry only if
** pid still holds it, so a taken-over connection cannot remove its successor.
** The table keeps the claimer's id string, not a copy (an idle connection's memory):
** the caller keeps it unchanged at the same address until it has called release with
** it, or until a later claim of the same id (a takeover) has replaced its entry.
*/
rt_pid_t rt_broker_claim_client(const char *id, rt_pid_t pid);
void rt_broker_release_client(const char *id, rt_pid_t pid);
/* The actor holding id (a connection or an offline session), or 0. */
rt_pid_t rt_broker_lookup_client(const char *id);

/* What the retained store holds per topic: the message and when it expires (0: never). */
typedef struct rt_retained_msg_s {
    rt_bin_t *bin;
    uint64_t expire_at_ms; /* CLOCK_MONOTONIC ms */
} rt_retained_msg_t;
void rt_broker_retained_release(void *msg);
typedef struct rt_listener_info_s {
    unsigned index;       /* among all listeners (config.h RT_CONF_*_LISTENER): the index of
                             listener_stats, the TLS contexts and rt_listener_kind */
    char address[64];     /* as configured ("0.0.0.0", "::1") */
    int port;             /* bound (the kernel's pick when configured as 0); 0: not up */
    const char *protocol; /* rt_broker_listener_protocol's */
    bool proxy_protocol;  /* a PROXY protocol header first */
    bool running;
    uint64_t connections; /* sockets open now that came in through it */
    uint64_t accepted;    /* ever */
    uint64_t refused;     /* ever, all reasons; then by reason: */
    uint64_t refused_max_connections, refused_per_ip, refused_rate, refused_error;
    uint64_t refused_untrusted;
    uint64_t refused_fds;
    uint64_t acl_denied_publish, acl_denied_subscribe; /* its clients' requests the ACL refused */
    long max_connections; /* broker-wide: it counts every listener's sockets together */
} rt_listener_info_t;

/*
** Fills up to max listeners, the MQTT ones in configuration order then the XMPP ones (the
** HTTP listener is not among them); returns how many there are.
*/
size_t rt_broker_listeners(rt_listener_info_t *out, size_t max);
/*
** What the listener of index (RT_CONF_*_LISTENER) serves, and how: "mqtt/tcp", "mqtt/tls",
** "mqtt/ws", "mqtt/wss"; "xmpp/tcp", "xmpp/starttls" (plain, TLS by STARTTLS), "xmpp/tls"
** (direct TLS, XEP-0368), "xmpp/ws", "xmpp/wss"; "http" or "https". "" for an index with no
** listener.
*/
const char *rt_broker_listener_protocol(unsigned index);

/* Counts a client socket opening (+1) or closing (-1), broker-wide and on its listener. */
void rt__broker_count_socket(unsigned listener, int delta);

/*
** The pre-auth budget (max_preauth_memory): what connections not authenticated yet hold of
** their client's bytes, all of them together, whatever their protocol. Such a connection is
** only a socket and the login it is sending (bounded in size and in time), but many of them
** at once could hold a lot; past the budget, the connection whose bytes would pass it is
** ended: newcomers are refused while those already holding wait out their timeouts.
** Adds bytes (negative: gives back); false, and nothing added, when they do not fit.
*/
bool rt_broker_preauth_charge(int64_t bytes);

#define RT_REASON_TAKEOVER (RT_REASON_USER + 1) /* a new connection took the client id */
#define RT_REASON_KICKED (RT_REASON_USER + 2)   /* rt_client_kick: an administrator ended it */

/* ---- Administration: clients ----
** Message tags that cross modules take a block of 0x100 above RT_MSG_USER, so they
** can never meet an actor's private tags (those count up from RT_MSG_USER and stay
** below RT_MSG_USER + 0x5000): 0x5100 sinks, 0x5200 rules, 0x5300 store, 0x5400 the
** broker's client messages, 0x5500 the login verifier (auth.h). An actor that asks
** rt_client_query receives RT_MSG_CLIENT_INFO whatever its own tags are.
*/
#define RT_BROKER_MSG_BASE (RT_MSG_USER + 0x5400)
#define RT_MSG_CLIENT_INFO (RT_BROKER_MSG_BASE + 0) /* data: rt_client_info_t, then its subs */

/*
** Calls fn for each entry of the client table: every client id with the actor
** holding it (a connection, or an offline session). fn runs with the table
** locked, which holds up every CONNECT meanwhile: it must be quick, must not
** block, and must not call rt_broker_claim/release/lookup_client (the lock is
** not recursive). Copying id and pid out is the intended use (id is valid only
** during the call); ask the actors afterwards. Returns the entries visited.
*/
size_t rt_broker_clients_each(void (*fn)(const char *id, rt_pid_t pid, void *ud), void *ud);

/*
** The pids of the client table's actors, at most limit of them (0: all), copied
** out under the lock so the caller can message them afterwards without holding
** up CONNECTs. Returns 0 with *pids (the caller frees it; NULL when none) and
** *n, or RT_ENOMEM.
*/
int rt_broker_client_pids(size_t limit, rt_pid_t **pids, size_t *n);
/*
** A page of the client table for listings: the pids of the `limit` clients with the smallest
** ids (byte order) that start with prefix (NULL or "": any) and come after `after` (NULL: from
** the first). The next page starts after the largest id of this one. 0, or RT_ENOMEM.
*/
int rt_broker_client_page(const char *prefix, const char *after, size_t limit, rt_pid_t **pids,
                          size_t *n);

#define RT_CLIENT_TEXT_MAX 256 /* bytes kept of a client id or user name, NUL included */
#define RT_CLIENT_PEER_MAX 64  /* "ip:port", NUL included */
#define RT_CLIENT_INFO_SUBS_MAX (1u << 20) /* bytes of subscription entries one reply carries */

/*
** What a connection actor answers to rt_client_query. Counts are the actor's
** own at the moment it read the query. Strings are NUL-terminated and cut at
** the array size (client_id_len tells a cut id from a whole one).
*/
typedef struct rt_client_info_s {
    uint64_t cookie;          /* the caller's, from rt_client_query */
    rt_pid_t pid;             /* the connection (or offline session) actor */
    uint64_t connected_at_ms; /* unix ms of the CONNECT; 0 while offline */
    uint64_t expires_in_ms;   /* offline: ms until the session ends; 0 while connected */
    uint64_t queued_bytes;    /* bytes of the queued messages (in the client's memory budget) */
    uint64_t dropped;         /* messages not delivered: queue full, too large, slow consumer */
    uint64_t dropped_owed;    /* of dropped, those owed at QoS 1 or 2 (their publisher was acked) */
    uint64_t mailbox_len;     /* messages waiting in the actor's mailbox behind the query */
    uint32_t session_expiry;  /* seconds the session outlives its connection */
    uint32_t subscriptions;   /* the client's subscriptions */
    uint32_t subs_included;   /* entries that follow: fewer than subscriptions if cut (or none
                                 asked); see rt_client_info_subs_next */
    uint32_t inflight;        /* QoS 1/2 messages sent and not acknowledged */
    uint32_t inflight_window; /* how many may be: min(client's receive maximum, max_inflight) */
    uint32_t queued;          /* messages waiting to be sent */
    uint32_t rate_limited;    /* times its rate limit slowed it (reading paused) */
    uint32_t acl_denied_publish;   /* its PUBLISHes (and will) the ACL refused */
    uint32_t acl_denied_subscribe; /* its subscriptions the ACL refused */
    char transport[8];        /* its listener's kind: tcp, tls, ws or wss ("" while offline) */
    uint16_t keepalive;       /* seconds, as granted */
    uint16_t client_id_len;   /* the id's full length */
    uint8_t version;          /* 3 (3.1), 4 (3.1.1) or 5; 0 before CONNECT */
    uint8_t connected;        /* 1: connected; 0: an offline session */
    uint8_t clean_start;      /* of its last CONNECT */
    uint8_t has_username;
    char client_id[RT_CLIENT_TEXT_MAX];
    char username[RT_CLIENT_TEXT_MAX];
    char peer[RT_CLIENT_PEER_MAX]; /* "" while offline */
} rt_client_info_t;

/*
** The reply's layout: the message data is an rt_client_info_t, then
** subs_included entries packed one after another with no padding:
**   uint32 sub_id | uint16 filter_len | uint8 qos | uint8 flags | filter bytes | NUL
** (host byte order; flags bit 0 no_local, bit 1 retain_as_published, bits 2-3
** retain_handling). The filter is as subscribed, "$share/group/..." included.
** Read them with rt_client_info_subs_next rather than by hand.
*/
typedef struct rt_client_sub_s {
    const char *filter; /* the topic filter without any $share/group/ prefix */
    size_t filter_len;
    const char *group; /* a shared subscription's group, NULL otherwise (not NUL-ended) */
    size_t group_len;
    uint32_t sub_id; /* subscription identifier (MQTT 5); 0: none */
    uint8_t qos;
    uint8_t no_local;
    uint8_t retain_as_published;
    uint8_t exclusive; /* through $exclusive/ */
    uint8_t retain_handling;
} rt_client_sub_t;

#endif

/*
** The MQTT broker on the runtime: one listener actor per configured address,
** one connection actor per socket. The topic trie is shared by all
** connections (read concurrently by publishers); a client table maps client
** ids to the connection actor that holds them, so a takeover is one swap.
*/
#ifndef RT_BROKER_H
#define RT_BROKER_H

#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "rt.h"
#include "topic_trie.h"

typedef struct rt_broker_stats_s {
    atomic_uint_fast64_t connections;   /* connected now (CONNACK sent) */
    atomic_uint_fast64_t sockets;       /* connection actors alive */
    atomic_uint_fast64_t msgs_in;       /* PUBLISH received */
    atomic_uint_fast64_t msgs_out;      /* PUBLISH sent */
    atomic_uint_fast64_t bad_packets;   /* malformed or protocol errors */
    atomic_uint_fast64_t refused;       /* connections refused at accept (limits) */
    atomic_uint_fast64_t sessions;      /* sessions alive: connected plus offline */
    atomic_uint_fast64_t msgs_dropped;  /* refused by a full session queue (or QoS 0 offline) */
    atomic_uint_fast64_t msgs_expired;  /* message expiry interval ran out before sending */
    atomic_uint_fast64_t topic_limit_hits;   /* topics or filters past max_topic_levels/length */
    atomic_uint_fast64_t subs_limit_hits;    /* SUBSCRIBEs refused by max_subscriptions */
    atomic_uint_fast64_t retained_limit_hits; /* retained messages refused by the store's limits */
    /* Listener (broker.c): every refused connection counts in refused and in one reason. */
    atomic_uint_fast64_t accepted;           /* sockets accepted and handed to a connection */
    atomic_uint_fast64_t refused_max_conns;  /* max_connections reached */
    atomic_uint_fast64_t refused_per_ip;     /* max_connections_per_ip reached for the address */
    atomic_uint_fast64_t refused_rate;       /* max_connection_rate: the listener's bucket empty */
    atomic_uint_fast64_t refused_error;      /* the connection actor could not start */
    /* Kept by the connection actor (conn.c), read by $SYS (sys.c). */
    atomic_uint_fast64_t bytes_in;           /* bytes read from client sockets */
    atomic_uint_fast64_t bytes_out;          /* bytes written (or buffered) to client sockets */
    atomic_uint_fast64_t connects;           /* CONNECTs accepted (CONNACK 0), ever */
} rt_broker_stats_t;

typedef struct rt_broker_s {
    rt_conf_t conf;
    rt_trie_t *trie;
    rt_retained_t *retained;            /* canonical PUBLISH binaries by topic */
    rt_broker_stats_t stats;
    pthread_mutex_t clients_lock;
    struct rt_client_entry_s **clients; /* client id -> pid (open hashing) */
    size_t clients_cap, clients_len;
} rt_broker_t;

extern rt_broker_t *rt_broker;



/* Creates the broker state and spawns its listeners; err names a listener that failed. */
int rt_broker_start(const rt_conf_t *conf, char *err, size_t errlen);
/*
** With persistence on: opens data_dir/state.db and brings back retained
** messages and persistent sessions (offline until their clients return).
** rt_broker_start calls it before any listener opens.
*/
int rt_broker_restore(char *err, size_t errlen);
/* After rt_shutdown: frees the broker state (and closes the store). */
void rt_broker_free(void);

/*
** Client ids. claim makes pid the holder of id and returns the previous holder
** (0 if none), which the caller takes over; release drops the entry only if
** pid still holds it, so a taken-over connection cannot remove its successor.
*/
rt_pid_t rt_broker_claim_client(const char *id, rt_pid_t pid);
void rt_broker_release_client(const char *id, rt_pid_t pid);
/* The actor holding id (a connection or an offline session), or 0. */
rt_pid_t rt_broker_lookup_client(const char *id);

#include "mqtt_codec.h"

/*
** Messages travel in canonical form: one binary holding an MQTT 5 PUBLISH
** (topic, properties, payload), made once per message and re-encoded by each
** subscriber's connection for its version. canonical makes it from a decoded
** PUBLISH (or a will); route delivers it to every matching subscriber and, if
** it is retained, stores it.
*/
rt_bin_t *rt_broker_canonical(const mqtt_packet_t *pk);

/* What the retained store holds per topic: the message and when it expires (0: never). */
typedef struct rt_retained_msg_s {
    rt_bin_t *bin;
    uint64_t expire_at_ms; /* CLOCK_MONOTONIC ms */
} rt_retained_msg_t;
void rt_broker_retained_release(void *msg);
/* route returns 1 if some subscriber got the message, 0 if none, or an RT_E* error. */
int rt_broker_route(rt_pid_t publisher, rt_bin_t *bin);
/*
** Publishes a message made inside the broker (republish sinks, $SYS): builds its
** canonical form and routes it as if publisher (0: none) had sent it. RT_EINVAL for
** an invalid topic name (a filter, bad UTF-8, empty) or qos > 2.
*/
int rt_broker_publish(rt_pid_t publisher, const char *topic, size_t topic_len, const void *payload,
                      size_t payload_len, uint8_t qos, uint8_t retain);

extern const rt_actor_type_t rt_listener_type; /* arg: const rt_listen_t * */
extern const rt_actor_type_t rt_conn_type;     /* arg: the accepted fd, as intptr_t */

#define RT_REASON_TAKEOVER (RT_REASON_USER + 1) /* a new connection took the client id */

#endif

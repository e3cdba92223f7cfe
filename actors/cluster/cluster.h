/*
** The cluster: rtd nodes that are one broker, joined through NATS (docs/CLUSTER.md).
**
** Routing by interest: each node subscribes on NATS, once, for every distinct filter its
** clients hold (the trie tells it when a filter gets its first subscriber and loses its
** last), on the subjects subject.h maps filters to; every message routed on a node is
** published once on its topic's subject, with what MQTT needs to deliver it (QoS, retain,
** properties, expiry, the publisher's id) in NATS headers. A node receives a message once
** per matching NATS subscription, so it keeps, per origin node, the sequence numbers it
** has routed and routes each message once, through its own trie, as its own publishers'
** messages are. A shared group ($share/g/f) is a NATS queue group on a second connection
** that hears this node's own publishes too: NATS picks one node of the group's members,
** that node one member.
**
** Threads: libnats runs its own (socket reader, flusher, one delivery thread for every
** subscription, so messages arrive in the order NATS sent them). Every libnats call rtd
** makes runs in the `cluster` actor on the runtime's blocking pool, never on a scheduler;
** what arrives is handed to the `cluster_in` actor by message, and the delivery thread
** waits while too much is on its way (RT_CLUSTER_INBOUND_MAX_*), so NATS's own
** slow-consumer limit, reported and counted, bounds what a slow node is sent.
*/
#ifndef RT_CLUSTER_H
#define RT_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "rt.h"

/* What NATS has handed over and cluster_in has not routed yet, at most. */
#define RT_CLUSTER_INBOUND_MAX_MSGS 20000
#define RT_CLUSTER_INBOUND_MAX_BYTES (64u << 20)

#define RT_CLUSTER_GROUP "cluster_sup"

/*
** NATS connections: tried every RT_CLUSTER_RETRY_MS while no server answers (or one refuses
** the node's credentials); a server that stops answering once connected (SIGSTOP, a frozen
** host, a cut link) is noticed when RT_CLUSTER_PINGS_OUT PINGs in a row, one every
** RT_CLUSTER_PING_MS, went unanswered: within RT_CLUSTER_STALE_MS of its last answer. Then
** the node goes on to another server of the NATS cluster; a server that takes a TCP
** connection and says nothing costs RT_CLUSTER_CONNECT_WAIT_MS per try.
*/
#define RT_CLUSTER_RETRY_MS 250
#define RT_CLUSTER_PING_MS 1000
#define RT_CLUSTER_PINGS_OUT 2
#define RT_CLUSTER_STALE_MS ((RT_CLUSTER_PINGS_OUT + 1) * RT_CLUSTER_PING_MS)
#define RT_CLUSTER_CONNECT_WAIT_MS 2000

/*
** With conf->cluster.on: connects to NATS (in the background: rtd starts while NATS is
** down, and says so), starts the cluster's actors under sup and hooks routing and the
** trie. Call after the broker's state exists and before sessions are restored. 0, or an
** RT_E* error with err set.
*/
int rt_cluster_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen);
/*
** What rt_cluster_start checks before it connects, alone (`rtd --check`): credentials for
** servers off this host, the secret file, the NATS credentials, nkey seed and TLS files.
** Connects to nothing. 0 (also without a cluster table) or RT_EINVAL with err.
*/
int rt_cluster_check(const rt_conf_t *conf, char *err, size_t errlen);
/* Closes the NATS connections and stops the actors; from outside any actor. */
void rt_cluster_stop(void);
/* Whether this node is in a cluster. */
bool rt_cluster_on(void);
/* This node's name ("" alone). */
const char *rt_cluster_node(void);

typedef struct rt_cluster_status_s {
    char node[RT_CONF_NODE_MAX];
    char state[16];     /* NATS connection: connected, connecting, reconnecting, closed */
    char server[128];   /* the NATS server it is connected to; "" when none */
    char servers[1024]; /* every NATS server it knows, comma-separated */
    uint64_t routes;    /* filters it holds NATS subscriptions for */
    uint64_t forwarded_out, forwarded_in; /* messages published on NATS, routed from NATS */
    uint64_t duplicates;      /* copies of a message already routed (overlapping filters) */
    uint64_t forward_failed;  /* publishes NATS refused (no connection and its buffer full) */
    uint64_t not_forwarded;   /* topics whose subject is longer than NATS takes */
    uint64_t bad_in;          /* messages from NATS that were not an rtd node's */
    uint64_t dropped_in;      /* NATS dropped for this node (slow consumer) */
    uint64_t inbound_backlog; /* arrived, not routed yet */
    uint64_t reconnects;
    bool retained_replicated;           /* the JetStream KV bucket is bound and watched */
    uint64_t retained_revision;         /* the bucket's last revision applied here */
    uint64_t retained_put_failed;       /* retained messages the bucket refused */
    uint64_t retained_barrier_timeouts; /* subscribers that stopped waiting for this node */
    uint64_t claims, claims_taken_over; /* client ids claimed here; of them, from another node */
    uint64_t claims_pipelined;          /* of them, settled by one create (no holder to ask) */
    uint64_t claims_in_flight;          /* creates sent, JetStream's answer not come yet */
    uint64_t claims_failed, given_up;   /* claims refused; ids given up to another node */
    uint64_t sessions_moved_in, sessions_moved_out; /* persistent sessions moved between nodes */
    uint64_t sessions_move_failed; /* moves here whose session or tail did not arrive whole */
    uint64_t move_syncs_incomplete; /* moves that asked for the rest without every node's word */
    bool durable;                  /* durable mode, its stream and bucket bound */
    uint64_t stream_acked, stream_failed; /* publishers' acks the stream gave, refused */
    uint64_t session_records_failed;      /* sessions' records the bucket refused */
    uint64_t replays, replayed; /* sessions resumed after their node's crash; messages read */
    uint64_t bans_applied, bans_failed; /* bucket bans applied here; bans it did not take */
    bool lease_held;            /* this node's claims hold (rt_cluster_lease_holds) */
    uint64_t lease_lapses;      /* times its lease ran out */
    uint64_t lease_waits;       /* takeovers that waited out a silent holder's lease */
    uint64_t stale_takeovers;   /* takeover requests that came after their sender stopped waiting */
    uint64_t control_refused;   /* requests and answers whose signature did not verify */
    uint64_t channel_out,
        channel_in;          /* the channel's messages sent, taken (rt_cluster_set_channel) */
    uint64_t channel_failed; /* the channel's messages NATS refused, or none took */
} rt_cluster_status_t;

/*
** Retained messages for a new subscription, cluster-wide: the retained store is replicated
** in a JetStream KV bucket that every node watches, and a retained PUBLISH is acknowledged
** once the bucket has it. A node's copy may lag the bucket a little, so a subscriber asks
** first: true means its data comes back in an RT_CLUSTER_MSG_RETAINED_READY once this
** node has applied every change the bucket held when asked (at most 2 s later), and the
** subscriber sends its retained messages then; false (no cluster, no bucket yet): send now.
*/
#define RT_CLUSTER_MSG_RETAINED_READY (RT_MSG_USER + 0x5700) /* data: the caller's, back */
bool rt_cluster_retained_barrier(rt_pid_t reply_to, const void *data, size_t len);
/*
** Deletes topic's retained message from the replicated store (`rtctl retained delete`): every
** node drops its copy as it watches the bucket. From the blocking pool: it waits for
** JetStream. 0, or RT_EAGAIN with err set (the bucket is not bound yet, or refused).
*/
int rt_cluster_retained_delete(const char *topic, size_t len, char *err, size_t errlen);

/*
** Client ids unique cluster-wide: who holds each one is recorded in a JetStream KV bucket
** (<prefix>_clients) and changed by compare-and-swap only, so two nodes never both own
** one. A node claiming an id another node holds asks that node to give it up first: it
** ends its client there as a takeover (an MQTT 5 client is sent DISCONNECT 0x8E). true
** means an RT_CLUSTER_MSG_CLAIMED answers reply_to (status 0: the id is this node's now);
** false (no cluster): go ahead as a node alone. Without JetStream (not reachable since
** the start) every claim fails.
*/
#define RT_CLUSTER_MSG_CLAIMED (RT_MSG_USER + 0x5701) /* data: rt_cluster_claimed_t */
typedef struct rt_cluster_claimed_s {
    int32_t status; /* 0, or RT_EAGAIN: cut off from NATS, JetStream did not answer, the
                       node's lease does not hold, or others kept racing: a persistent session
                       is refused then, a clean one goes ahead unclaimed; RT_EBUSY: the
                       holder is alive and did not give the id up (refused whatever the
                       session); RT_EEXIST (rt_cluster_verify only): another node holds it */
    uint32_t lease; /* the lease generation the claim was made under (rt_cluster_lease_holds) */
} rt_cluster_claimed_t;
/* want_session: the CONNECT resumes a session (clean start 0): one held by another node
   moves here before the answer (below). */
bool rt_cluster_claim(rt_pid_t reply_to, const char *id, size_t len, bool want_session);
/* A session this node kept (reloaded from its store, or kept through a lapse of its lease)
   checks that its id is still this node's: the answer is a claim's, RT_EEXIST when another
   node claimed it since (the session here is stale). Never takes the id from another node. */
bool rt_cluster_verify(rt_pid_t reply_to, const char *id, size_t len);

/*
** The holder's lease (docs/CLUSTER.md, "One holder per client id"). A node serves the ids it
** claimed only while it keeps renewing its lease in JetStream (every 500 ms; a renewal holds
** for 5 s from when it was sent). A node that cannot renew in time loses its lease: the
** generation goes up, every client actor is told (RT_CLUSTER_MSG_LEASE, held false) and a
** connection whose claim was made under an earlier generation ends. When the lease is held
** again (and when it is first taken, after start) they are told again (held true): a session
** kept offline here checks its id (rt_cluster_verify). rt_cluster_lease_holds costs a clock
** read: a claimed connection asks it at every message it handles, so a node resumed after a
** freeze serves nothing under a lease that ran out, whatever runs first.
*/
#define RT_CLUSTER_MSG_LEASE (RT_MSG_USER + 0x5704) /* data: rt_cluster_lease_t */
typedef struct rt_cluster_lease_s {
    uint32_t generation;
    bool held;
} rt_cluster_lease_t;
/* Whether the claims made under generation (its low 2 bits are enough) still hold. */
bool rt_cluster_lease_holds(uint32_t generation);
/* The generation now (what a claim made now is made under). */
uint32_t rt_cluster_lease_generation(void);

/*
** Sessions that move (docs/CLUSTER.md "Sessions that move"). A claim with want_session asks
** the holding node for the session: its holder ends its client (DISCONNECT 0x8E) and
** answers with the session as bytes (RT_CLUSTER_MSG_MOVE_OUT, phase 1), keeping its
** subscriptions, so that what is routed meanwhile still reaches it. The claiming node
** imports the bytes as a session actor (the importer hook: it subscribes here), makes
** sure NATS has those subscriptions, then asks for what the old holder queued since
** (phase 2; the holder answers and ends) and hands it to the imported session
** (RT_CLUSTER_MSG_MOVE_IN), which merges it in order with what it got itself, a message
** that both got once (rt_message_origin names it), and only then answers the CONNECT's claim.
** The connection layer makes and reads the bytes; the cluster carries them, in parts
** within NATS's max_payload.
*/
#define RT_CLUSTER_MSG_MOVE_OUT (RT_MSG_USER + 0x5702) /* data: rt_cluster_move_t */
#define RT_CLUSTER_MSG_MOVE_IN (RT_MSG_USER + 0x5703)  /* data: rt_cluster_move_in_t */
#define RT_CLUSTER_MOVE_MAX (256u << 20)               /* a session's bytes, at most */
typedef struct rt_cluster_move_s {
    uint32_t phase; /* 1: the session; 2: what was queued since, then the holder ends */
    uint32_t reply_len;
    char reply[]; /* the NATS subject the answer goes to */
} rt_cluster_move_t;
/* To the imported session: the rest to merge, then it answers the claim (RT_CLUSTER_MSG_CLAIMED
   to claimer, status 0), so the CONNECT's hand-over always finds the merge done. */
typedef struct rt_cluster_move_in_s {
    rt_pid_t claimer;
    uint32_t lease;  /* the claim's lease generation, for the claimer's answer */
    uint8_t bytes[]; /* the rest, or a replay; none when the old node did not answer */
} rt_cluster_move_in_t;
/* The holder's answer to a MOVE_OUT (len 0: nothing to move). */
void rt_cluster_move_answer(const rt_cluster_move_t *req, const void *bytes, size_t len);
/* A session that moved here ended before it merged the rest (with MOVE_IN in its mailbox, or
   before MOVE_IN could reach it): logged, and the CONNECT's claim answered (status 0: the id
   is this node's), which goes on with a new session. */
void rt_cluster_move_ended(rt_pid_t claimer, uint32_t lease, const char *client_id);
/* Makes the session actor for id from phase 1's bytes (on the claiming node's cluster_kv
   thread); 0 if they cannot be read. */
typedef rt_pid_t (*rt_cluster_import_fn)(const char *id, const void *bytes, size_t len);
void rt_cluster_set_importer(rt_cluster_import_fn fn);

/*
** Durable mode (cluster.durable, docs/CLUSTER.md "Durable mode"): JetStream's stream
** "<prefix>_msgs" keeps every message routed in the cluster, and a QoS 1/2 PUBLISH is
** acknowledged once the stream has it. Each persistent session keeps a record in the bucket
** "<prefix>_sessions": the same bytes a move carries (without messages) and clear_ms, the
** last moment (wall clock) it owed its client nothing. A claim whose holder does not answer
** (its node crashed) imports the record and replays the stream from clear_ms less
** cluster.replay_margin; the session keeps what its subscriptions match (replay.h's bytes in a
** RT_CLUSTER_MSG_MOVE_IN), merged as a move's rest is.
*/
bool rt_cluster_durable(void);
/* Writes id's record (len 0: deletes it) from the session's actor; nothing outside
   durable mode. */
void rt_cluster_session_record(const char *id, uint64_t clear_ms, const void *bytes, size_t len);

/*
** Every node publishes what it holds and what its rules did once a second (a heartbeat on
** `<prefix>.status.<node>`), and keeps the last heartbeat of each node it hears: `rtctl
** cluster status` lists the nodes, `rtctl rules` adds per-node and cluster-wide counts.
*/
#define RT_CLUSTER_NODES_MAX 64
#define RT_CLUSTER_RULES_MAX 32 /* rules a heartbeat carries (the first, by name) */
#define RT_CLUSTER_HEARTBEAT_MS 1000
#define RT_CLUSTER_SILENT_MS (3 * RT_CLUSTER_HEARTBEAT_MS) /* a node not heard for longer */
#define RT_CLUSTER_FORGET_MS 60000                         /* ... is listed until then */

typedef struct rt_cluster_rule_count_s {
    char name[64];
    uint64_t matched, passed, failed, rows_out;
} rt_cluster_rule_count_t;

/*
** What this node's heartbeats say of its rules: the rules sit above the cluster, so whoever
** runs both (rtd's main) hands it their counts through this hook, set before
** rt_cluster_start and called on the cluster actor: fills out (at most max, by name) and
** returns how many. None set: the heartbeats carry no rules.
*/
typedef size_t (*rt_cluster_rule_counts_fn)(rt_cluster_rule_count_t *out, size_t max);
void rt_cluster_set_rule_counts(rt_cluster_rule_counts_fn fn);

typedef struct rt_cluster_node_s {
    char node[RT_CONF_NODE_MAX];
    uint64_t age_ms; /* since its last heartbeat arrived */
    bool up;         /* heard within RT_CLUSTER_SILENT_MS */
    uint64_t uptime_s, connections, sessions, routes, forwarded_in, forwarded_out;
    unsigned nrules;
    rt_cluster_rule_count_t rules[RT_CLUSTER_RULES_MAX];
} rt_cluster_node_t;

/* The nodes heard from in the last RT_CLUSTER_FORGET_MS (this one included), by name;
   returns how many (at most max). */
size_t rt_cluster_nodes(rt_cluster_node_t *out, size_t max);

/*
** Administrators' questions across nodes (`rtctl clients show ID` for a client another node
** holds). The asking side blocks (call from the blocking pool): which node holds id (the
** clients bucket), then that node's answer to a read-only request line, in at most 2 s
** (*answer_out malloc'ed: "<code> " and the body). The answering side's admin layer takes
** each question (fn: true when it will answer through rt_cluster_answer; false: 503).
*/
bool rt_cluster_client_holder(const char *id, char *node, size_t cap);
bool rt_cluster_ask_node(const char *node, const char *line, uint8_t **answer_out, size_t *len);
#define RT_CLUSTER_REPLY_MAX 128 /* a reply subject (an inbox) */
typedef bool (*rt_cluster_admin_fn)(const char *line, size_t len, const char *reply);
void rt_cluster_set_admin(rt_cluster_admin_fn fn);
void rt_cluster_answer(const char *reply, const void *bytes, size_t len);

/*
** A channel between the nodes for a layer above (XMPP's sessions, c2s_cluster.c): opaque bytes
** to one node by name, or to every other node, over NATS core (at most once: nothing is kept
** for a node that is down or not subscribed yet). What one actor sends arrives in the order it
** sent it, to one node or to all alike (one NATS connection carries both). What arrives goes to
** the one actor set as the taker, as an RT_CLUSTER_MSG_CHANNEL naming the node it came from and
** holding one or more of its messages, each as rt_buf_put_bytes writes it (read them with
** rt_reader_bytes): a busy node's messages to one place travel together. Before a taker is
** set nothing is subscribed, so a node without one hears nothing.
*/
#define RT_CLUSTER_MSG_CHANNEL (RT_MSG_USER + 0x5705) /* data: rt_cluster_channel_in_t */
#define RT_CLUSTER_CHANNEL_MAX (1u << 20)             /* bytes in one send, at most */
typedef struct rt_cluster_channel_in_s {
    char node[RT_CONF_NODE_MAX]; /* the sender */
    uint8_t data[];              /* its messages, each counted (rt_buf_put_bytes) */
} rt_cluster_channel_in_t;
void rt_cluster_set_channel(rt_pid_t taker);
/* node NULL: every other node. 0, or RT_ENOPROC (no cluster), RT_EINVAL (too long), RT_ENOMEM. */
int rt_cluster_channel_send(const char *node, const void *p, size_t n);

/* Fills *st; false when this node is not in a cluster. Safe from any thread. */
bool rt_cluster_status(rt_cluster_status_t *st);

#endif

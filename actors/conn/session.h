/*
** The delivery state of an MQTT session: the messages sent to the client and
** not yet acknowledged (inflight, in the order sent, so a resumed session
** retransmits them in order) and the messages waiting for a slot in the
** client's receive window or for the client to come back (queued, bounded in
** messages and bytes). A connection actor allocates it on its first QoS 1/2
** delivery or offline message, so an idle connection carries none.
**
** Owned by one connection actor and touched only in its turns: no locks. All of
** it lives on that actor's heap, reachable from the actor's roots through the
** session: the session and the message records are RT_OBJ_SCAN (records link
** to one another), the ack array is RT_OBJ_LEAF, and each record owns its
** canonical message as a binary handle (rt_alloc_bin: one heap object, not a
** record and a handle), so the queue's bytes count in the actor's bin_bytes and
** dropping the heap releases them.
*/
#ifndef RT_SESSION_H
#define RT_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "route.h"
#include "rt.h"

enum {
    RT_QMSG_QUEUED = 0, /* not sent yet */
    RT_QMSG_WAIT_ACK,   /* PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2) */
    RT_QMSG_WAIT_COMP,  /* PUBREL sent; waiting for PUBCOMP (QoS 2) */
};

#define RT_QMSG_MAX_SUB_IDS RT_DELIVERY_MAX_SUB_IDS

typedef struct rt_qmsg_s {
    rt_bin_t *bin; /* the canonical PUBLISH, first as rt_alloc_bin wants; NULL once PUBREC came
                      (only the id is left) */
    struct rt_qmsg_s *next;
    uint64_t expire_at_ms; /* CLOCK_MONOTONIC ms when the message expires; 0: never */
    uint64_t seq;          /* its row in the store (persistent sessions); 0: not stored */
    uint16_t packet_id;    /* while inflight */
    uint8_t qos;
    uint8_t retain;
    uint8_t state;  /* RT_QMSG_* */
    uint8_t shared; /* came through a shared subscription */
    uint8_t n_sub_ids;
    uint32_t sub_ids[];
} rt_qmsg_t;

_Static_assert(offsetof(rt_qmsg_t, bin) == 0, "rt_alloc_bin keeps the binary in the first word");

typedef struct rt_qlist_s {
    rt_qmsg_t *head, *tail;
    uint32_t n;
    size_t bytes; /* canonical bytes held by the list's messages */
} rt_qlist_t;

/*
** An acknowledgement to this session's client (PUBACK or PUBREC) that waits for
** the commits of what the message left behind (queued copies for persistent
** sessions, a retained message, the inbound QoS 2 id, durable rules' rows, in a
** cluster's durable mode the stream): "acknowledged" then means "kept". Acks
** leave in the order the PUBLISHes came (4.6).
*/
typedef struct {
    uint64_t token;     /* the commits answer with it */
    uint32_t remaining; /* commits still to come */
    uint16_t packet_id;
    uint8_t type; /* MQTT_PUBACK or MQTT_PUBREC */
    uint8_t reason;
    uint8_t failed : 1;      /* a commit failed: decided, whatever the others say */
    uint8_t unconfirmed : 1; /* ... and sending again may succeed: it must not go out as a
                                success (MQTT 3: the connection closes instead) */
} rt_pending_ack_t;

typedef struct rt_session_s {
    rt_qlist_t inflight;    /* sent, not acknowledged; oldest first */
    rt_qlist_t queued;      /* not sent yet; oldest first */
    uint64_t next_seq;      /* store rows of this session's messages */
    uint64_t next_token;    /* tokens of durable acknowledgements */
    rt_pending_ack_t *acks; /* waiting acknowledgements, oldest first */
    uint16_t *qos2_ids;     /* inbound QoS 2 ids between PUBREC and PUBREL (exactly once) */
    uint32_t nacks, capacks;
    uint32_t nqos2, capqos2; /* nqos2 <= RT_CONN_QOS2_PENDING_MAX */
    /* The inflight list's ids may not run in order from its head (a session restored
       from the store, or ids that wrapped to the head), so a new id is checked against
       all of them until the list empties. */
    uint8_t ids_unordered;
    uint32_t dropped_owed;        /* of conn_t.dropped, those owed at QoS 1 or 2 */
    uint64_t clear_ms;            /* wall clock: the last moment it owed its client nothing */
    uint64_t record_ms;           /* wall clock: its record last written (cluster durable mode) */
    struct rt_late_names_s *late; /* after a move: messages it has whose copy may still come */
    uint8_t moving;          /* RT_SESSION_MOVED_*: a move between cluster nodes is under way */
    uint8_t acl_flush_armed; /* RT_CONN_MSG_ACL_LOG is pending (denials.c) */
    uint32_t moved_in;       /* RT_SESSION_MOVED_IN: the queue's first ones came with the move */
    /* ACL denials (denials.c), here since a client that is refused is rare: an idle
       connection without a session pays nothing for them. */
    uint32_t acl_denied[2]; /* by RT_ACL_DENIED_* (broker.h), this node's only */
    uint32_t acl_unlogged;  /* denials since the client's last acl.denied line */
    uint64_t acl_logged_ms; /* monotonic ms of that line; 0: none yet */
} rt_session_t;

/* A message's name in a cluster (rt_message_origin). */
typedef struct rt_origin_name_s {
    uint64_t key, seq;
} rt_origin_name_t;

/*
** The names of the messages a session took with it from its old node (move.c), sorted by
** key then number, on the session's heap (RT_OBJ_LEAF). Another node's copy of one of them
** may still reach this node after the move (NATS servers forward to one another at their own
** pace); it is dropped. A node's copies come in the order it numbered them, so once one
** numbered past the last name of its node arrives, that node's names go.
*/
typedef struct rt_late_names_s {
    uint32_t n;
    rt_origin_name_t names[];
} rt_late_names_t;

enum {
    RT_SESSION_MOVED_OUT = 1, /* given to another node; queues until it asks for the rest */
    RT_SESSION_MOVED_IN,      /* taken from another node; waits for the rest to merge */
};

/* A message on self's heap holding a new reference to bin; NULL on OOM. */
rt_qmsg_t *rt_qmsg_new(rt_actor_t *self, rt_bin_t *bin, uint8_t qos, uint8_t retain,
                       uint64_t expire_at_ms, uint8_t shared, const uint32_t *sub_ids,
                       uint32_t n_sub_ids);
/*
** Frees m and releases its binary now, rather than at the next collection: a message is
** freed as soon as it is acknowledged or dropped, so a busy session's heap does not grow
** with what it has already let go of.
*/
void rt_qmsg_free(rt_actor_t *self, rt_qmsg_t *m);
/* The canonical PUBLISH m holds, or NULL once it gave it up (rt_qlist_drop_payload). */
static inline rt_bin_t *rt_qmsg_bin(const rt_qmsg_t *m)
{
    return m->bin;
}

void rt_qlist_push(rt_qlist_t *l, rt_qmsg_t *m); /* at the tail */
rt_qmsg_t *rt_qlist_pop(rt_qlist_t *l);          /* from the head; NULL when empty */
/* Unlinks and returns the inflight message with packet_id, or NULL. */
rt_qmsg_t *rt_qlist_take_id(rt_qlist_t *l, uint16_t packet_id);
rt_qmsg_t *rt_qlist_find_id(const rt_qlist_t *l, uint16_t packet_id);
/* Releases m's binary (QoS 2 after PUBREC needs only its packet id); m stays in l. */
void rt_qlist_drop_payload(rt_actor_t *self, rt_qlist_t *l, rt_qmsg_t *m);
/* The bytes a message counts against the queue limit. */
size_t rt_qmsg_bytes(const rt_qmsg_t *m);

#endif

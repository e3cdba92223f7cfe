/*
** Packet tracing: a live copy of one client's packets, or of the PUBLISH packets on the
** topics one filter matches, sent as events to a tracer actor (an rtctl connection of the
** admin socket, or an HTTP API stream) for as long as it asks. An XMPP session is a client
** too: a trace of its full JID, or of its bare JID (every resource), gets what it reads and
** writes, a stanza an event.
**
** Cost. With no trace on, a connection pays one relaxed load of a shared counter per packet
** read and per packet written (rt_tracing). With traces on, it looks them up through an
** RCU-published set (no lock) and decodes a packet again only when a trace wants it.
**
** Bound. A trace's events that were sent and not yet taken by its tracer are at most
** RT_TRACE_QUEUED_MAX bytes: past that the next are dropped at the source and counted
** (rt_trace_counts), so a client at 10,000 messages a second traced by a reader that stopped
** costs a bounded mailbox and the tracer can say how much it missed. The traced client is
** never slowed by its tracer: events go by rt_send_unmuted.
*/
#ifndef RT_TRACE_H
#define RT_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"

#define RT_TRACE_MAX 8                /* traces on at once */
#define RT_TRACE_QUEUED_MAX (1u << 20) /* bytes of a trace's events on their way to its tracer */
#define RT_TRACE_PAYLOAD_MAX 65536     /* payload bytes an event may carry (--payload) */
#define RT_TRACE_CODES_MAX 16          /* SUBSCRIBE options / SUBACK codes an event lists */
#define RT_TRACE_MSG_EVENT (RT_MSG_USER + 0x5600) /* data: rt_trace_event_t (broker.h blocks) */

typedef enum { RT_TRACE_CLIENT, RT_TRACE_TOPIC } rt_trace_kind_t;
typedef enum { RT_TRACE_IN, RT_TRACE_OUT } rt_trace_dir_t;

typedef struct rt_trace_s rt_trace_t;

/*
** One packet, as its tracer receives it. The bytes after the struct are the client id
** (client_len), the topic or, for (UN)SUBSCRIBE, the filters each ended by a NUL (names_len),
** and the first shown_len bytes of the payload.
*/
typedef struct {
    uint64_t trace_id; /* the trace it is for (a tracer ignores others') */
    uint64_t unix_us;
    uint32_t size;        /* of the whole packet, bytes */
    uint32_t payload_len; /* PUBLISH: bytes of payload */
    uint32_t shown_len;   /* of those, carried here (--payload) */
    uint32_t names_len;
    uint16_t client_len;
    uint16_t packet_id;
    uint16_t keepalive; /* CONNECT */
    uint8_t dir;        /* rt_trace_dir_t */
    uint8_t type;       /* mqtt_type_t */
    uint8_t flags;      /* the fixed header's low nibble: PUBLISH dup, qos, retain */
    uint8_t version;
    uint8_t has_reason;
    uint8_t reason;     /* CONNACK, PUBACK..PUBCOMP, DISCONNECT, AUTH */
    uint8_t error;      /* the reason code the packet failed to decode with; 0: decoded */
    uint8_t ncodes;     /* SUBSCRIBE options / SUBACK, UNSUBACK reason codes, in codes */
    uint8_t codes_total;
    uint8_t session_present; /* CONNACK */
    uint8_t clean_start;     /* CONNECT */
    uint8_t topic_alias;     /* PUBLISH: the topic came as an alias (MQTT 5) */
    uint8_t codes[RT_TRACE_CODES_MAX];
    uint8_t xmpp; /* an XMPP session's bytes: names are their first tag (at most
                     RT_TRACE_TAG_MAX bytes), payload_len the whole length, shown their first
                     bytes; type and the MQTT fields are 0 */
} rt_trace_event_t;

#define RT_TRACE_TAG_MAX 512

extern _Atomic unsigned rt__trace_count;

/* Whether any trace is on: the only thing a packet costs when none is. */
static inline bool rt_tracing(void)
{
#ifdef RT_NO_TRACING
    return false;
#else
    return atomic_load_explicit(&rt__trace_count, memory_order_relaxed) != 0;
#endif
}

/*
** A packet of client_id's connection (NULL before its CONNECT was taken), raw being the
** whole packet in MQTT version (0 before CONNECT): sends it to each trace that wants it.
*/
void rt_trace_packet(rt_trace_dir_t dir, const char *client_id, const uint8_t *raw, size_t len,
                     uint8_t version);

/*
** What an XMPP session read (one stanza or element) or wrote (what one write took: stanzas,
** or stream-level elements): jid is its JID (full once bound), bare_len the length of its
** bare part. Sent to each client trace naming the full or the bare JID.
*/
void rt_trace_stanza(rt_trace_dir_t dir, const char *jid, size_t jid_len, size_t bare_len,
                     const uint8_t *bytes, size_t len);

/*
** Starts a trace of what (a client id, or a topic filter) whose events go to tracer, with up
** to payload_max bytes of each payload. 0 with *out, RT_EINVAL (a filter that is not one),
** RT_EBUSY (RT_TRACE_MAX on already) or RT_ENOMEM.
*/
int rt_trace_start(rt_trace_kind_t kind, const char *what, size_t len, uint32_t payload_max,
                   rt_pid_t tracer, rt_trace_t **out);
/*
** Ends a trace: no event is sent for it once this returns. The packets it wanted, all told
** (sent or dropped): what the tracer did not pass on of those, it lost.
*/
uint64_t rt_trace_stop(rt_trace_t *t);
uint64_t rt_trace_id(const rt_trace_t *t);
/* The tracer took an event of len bytes (its message's length) off the trace's queue. */
void rt_trace_taken(rt_trace_t *t, size_t len);
/* The packets the trace wanted so far, and of those the ones dropped at the source. */
void rt_trace_counts(const rt_trace_t *t, uint64_t *seen, uint64_t *dropped);
/* Traces on now. */
unsigned rt_trace_active(void);

#endif

/*
** The canonical message: what a PUBLISH is once inside the broker. The publishing
** connection decodes the PUBLISH once and makes one shared binary of it; routing, every
** subscriber, the retained store, the session store and the rules read that binary
** through the offsets it carries, and none of them parses it again.
**
** The binary's data is an MQTT 5 PUBLISH (fixed header, topic, a placeholder packet id
** when QoS > 0, properties, payload) whatever version the publisher spoke, so the store
** can keep it as it is. Its properties are the ones passed on to MQTT 5 subscribers: all
** the publisher sent except the Message Expiry Interval (each copy gets what is left of
** it, 3.3.2.3.3), the Topic Alias (per connection) and subscription identifiers (per
** subscriber); a subscriber's PUBLISH is written from the parts (rt_message_encode) with
** no property parsed.
**
** The binary's tail holds the offsets (rt_message_view reads them in O(1)), then the
** publisher's client id and user name: rules name the publisher in message.* events, and
** each message pays those bytes once whatever its fan-out. Nothing in the tail reaches a
** subscriber. Messages restored from the store have no publisher (the store keeps the
** PUBLISH only).
*/
#ifndef RT_MESSAGE_H
#define RT_MESSAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "mqtt_codec.h"
#include "rt.h"

/* A canonical message's parts; the pointers live as long as the binary. */
typedef struct rt_message_s {
    mqtt_str_t topic;
    mqtt_str_t props; /* the property block passed on to MQTT 5 subscribers */
    mqtt_str_t payload;
    const char *clientid; /* the publisher; NULL for the broker's own and restored messages */
    const char *username; /* NULL when the publisher had none */
    uint32_t expiry;      /* Message Expiry Interval (seconds) when has_expiry */
    uint8_t qos;
    uint8_t retain;
    uint8_t has_expiry;
} rt_message_t;

/*
** Makes the canonical binary of a decoded PUBLISH (or of a will built as one); clientid
** and username (either may be NULL) name the publisher. NULL when out of memory or when
** pk cannot be encoded.
*/
rt_bin_t *rt_message_new(const mqtt_packet_t *pk, const char *clientid, const char *username);
/* The canonical binary of a stored PUBLISH (decoded here, once, at load). NULL if invalid. */
rt_bin_t *rt_message_parse(const void *packet, size_t len);
/* Fills *m from a binary rt_message_new or rt_message_parse made. */
void rt_message_view(const rt_bin_t *bin, rt_message_t *m);

/*
** A cluster names each message by the node that first routed it and a number there, so
** that two nodes holding copies of one message can tell (a session moving between nodes
** merges what both queued: docs/CLUSTER.md). rt_message_keep_origins, called once before
** any message is made, gives every message 16 bytes of room for it; without the room
** rt_message_set_origin does nothing and rt_message_origin says false. Set before the
** binary is shared, or by its only holder.
*/
void rt_message_keep_origins(void);
bool rt_message_set_origin(rt_bin_t *bin, uint64_t node_key, uint64_t seq);
bool rt_message_origin(const rt_bin_t *bin, uint64_t *node_key, uint64_t *seq);

/*
** Delivery latency (rt_delivery_latency_seconds, docs/HTTP.md "Delivery latency"): for each
** routed copy a subscriber writes to its socket as it takes it, the time since the broker
** read the client's PUBLISH. Only client PUBLISHes have a read time: the broker's own
** messages, wills and restored ones are not timed, nor retained copies sent on subscribe.
*/
/* The publisher's read time (rt_mono_ns), set before the binary is shared. */
void rt_message_set_read_ns(rt_bin_t *bin, uint64_t ns);
bool rt_message_timed(const rt_bin_t *bin);
/* A timed copy was written: records its latency. */
void rt_message_copy_written(const rt_bin_t *bin);
const rt_hist_t *rt_message_delivery_hist(void);

/* How one subscriber gets a message. */
typedef struct rt_message_out_s {
    uint8_t version; /* the subscriber's protocol level */
    uint8_t qos;
    uint8_t retain;
    uint8_t dup;
    uint16_t packet_id;   /* when qos > 0 */
    uint16_t topic_alias; /* MQTT 5: 0 for none */
    bool alias_only;      /* the client knows the topic by its alias: an empty topic goes */
    uint32_t expiry_left; /* seconds, sent when has_expiry_left (MQTT 5) */
    bool has_expiry_left;
    const uint32_t *sub_ids; /* MQTT 5 subscription identifiers */
    uint32_t n_sub_ids;
} rt_message_out_t;

/*
** Writes the subscriber's PUBLISH into buf when it fits in cap; returns its size either
** way (call with cap 0 to size it). Takes no locks and allocates nothing.
*/
size_t rt_message_encode(const rt_message_t *m, const rt_message_out_t *o, uint8_t *buf,
                         size_t cap);

#endif

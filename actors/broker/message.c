/*
** The canonical message (message.h): made once per PUBLISH, read through offsets by
** everyone after, and written out per subscriber from its parts.
*/
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "message.h"

/* Where the parts are; kept at the start of the binary's tail (read with memcpy: the
   tail follows the packet, so it has no alignment). Written before the binary is shared. */
typedef struct {
    uint32_t topic_off;
    uint32_t props_off, props_len; /* the payload runs from props_off + props_len to the end */
    uint32_t expiry;
    uint64_t read_ns; /* when the publisher's PUBLISH was read (rt_mono_ns); 0: not timed */
    uint16_t topic_len;
    uint8_t qos;
    uint8_t flags; /* INDEX_* */
} message_index_t;

#define INDEX_RETAIN 1u
#define INDEX_EXPIRY 2u
#define INDEX_CLIENTID 4u
#define INDEX_USERNAME 8u
#define INDEX_ORIGIN 16u /* room for the cluster's origin (message_origin_t) after the index */

/* Who first routed a message in a cluster, and its number there (rt_message_set_origin). */
typedef struct {
    uint64_t node_key;
    uint64_t seq; /* 0: not set yet */
} message_origin_t;

/* Set once, before any message is made, by a node in a cluster. */
static atomic_bool origin_room;

void rt_message_keep_origins(void)
{
    atomic_store_explicit(&origin_room, true, memory_order_relaxed);
}

_Static_assert(sizeof(message_index_t) == 32, "every message pays for its index");

static uint8_t *index_at(const rt_bin_t *bin)
{
    size_t tail_len;
    const uint8_t *tail = rt_bin_tail(bin, &tail_len);
    RT_ASSERT(tail_len >= sizeof(message_index_t));
    return (uint8_t *)(uintptr_t)tail;
}

rt_bin_t *rt_message_new(const mqtt_packet_t *pk, const char *clientid, const char *username)
{
    RT_ASSERT(pk->publish.qos <= 2);
    mqtt_packet_t c = *pk;
    c.type = MQTT_PUBLISH;
    if (pk->version != MQTT_V5)
        memset(&c.props, 0, sizeof(c.props));
    message_index_t x = {
        .qos = c.publish.qos,
        .flags = (c.publish.retain ? INDEX_RETAIN : 0) |
                 (c.props.present & MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY) ? INDEX_EXPIRY : 0),
        .expiry = c.props.message_expiry};
    c.version = MQTT_V5;
    c.packet_id = c.publish.qos ? 1 : 0; /* each subscriber's copy gets its own */
    c.publish.dup = 0;
    c.props.present &=
        ~(MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS) | MQTT_PROP_BIT(MQTT_PROP_WILL_DELAY) |
          MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY));
    size_t len;
    if (mqtt_encode(&c, NULL, 0, 0, &len, NULL) != 0)
        return NULL;
    /* MQTT strings hold no NUL, so "clientid\0username\0" splits unambiguously. */
    size_t idn = clientid ? strlen(clientid) + 1 : 0;
    size_t usern = idn && username ? strlen(username) + 1 : 0;
    size_t originn =
        atomic_load_explicit(&origin_room, memory_order_relaxed) ? sizeof(message_origin_t) : 0;
    rt_bin_t *bin = rt_bin_alloc_tail(len, sizeof(x) + originn + idn + usern);
    if (!bin)
        return NULL;
    uint8_t *data = rt_bin_data(bin);
    mqtt_publish_at_t at;
    if (mqtt_encode_publish(&c, data, len, &len, &at) != 0) {
        rt_bin_release(bin);
        return NULL;
    }
    x.topic_len = (uint16_t)c.publish.topic.len;
    x.topic_off = (uint32_t)at.topic_off;
    x.props_off = (uint32_t)at.props_off;
    x.props_len = (uint32_t)(at.payload_off - at.props_off);
    x.flags |=
        (idn ? INDEX_CLIENTID : 0) | (usern ? INDEX_USERNAME : 0) | (originn ? INDEX_ORIGIN : 0);
    uint8_t *tail = data + len;
    memcpy(tail, &x, sizeof(x));
    memset(tail + sizeof(x), 0, originn);
    if (idn)
        memcpy(tail + sizeof(x) + originn, clientid, idn);
    if (usern)
        memcpy(tail + sizeof(x) + originn + idn, username, usern);
    return bin;
}

rt_bin_t *rt_message_parse(const void *packet, size_t len)
{
    mqtt_packet_t pk;
    if (mqtt_decode(packet, len, MQTT_V5, &pk) != 0 || pk.type != MQTT_PUBLISH)
        return NULL;
    return rt_message_new(&pk, NULL, NULL);
}

void rt_message_view(const rt_bin_t *bin, rt_message_t *m)
{
    const uint8_t *tail = index_at(bin);
    message_index_t x;
    memcpy(&x, tail, sizeof(x));
    const uint8_t *data = tail - rt_bin_len(bin);
    uint32_t payload_off = x.props_off + x.props_len;
    m->topic = (mqtt_str_t){data + x.topic_off, x.topic_len};
    m->props = (mqtt_str_t){data + x.props_off, x.props_len};
    m->payload = (mqtt_str_t){data + payload_off, (uint32_t)(rt_bin_len(bin) - payload_off)};
    const char *ids =
        (const char *)tail + sizeof(x) + (x.flags & INDEX_ORIGIN ? sizeof(message_origin_t) : 0);
    m->clientid = x.flags & INDEX_CLIENTID ? ids : NULL;
    m->username = x.flags & INDEX_USERNAME ? ids + strlen(ids) + 1 : NULL;
    m->expiry = x.expiry;
    m->qos = x.qos;
    m->retain = !!(x.flags & INDEX_RETAIN);
    m->has_expiry = !!(x.flags & INDEX_EXPIRY);
}

/* ---- Origins (a cluster's) ---- */

static uint8_t *origin_at(const rt_bin_t *bin)
{
    uint8_t *tail = index_at(bin);
    uint8_t flags = tail[offsetof(message_index_t, flags)];
    return flags & INDEX_ORIGIN ? tail + sizeof(message_index_t) : NULL;
}

bool rt_message_set_origin(rt_bin_t *bin, uint64_t node_key, uint64_t seq)
{
    uint8_t *at = origin_at(bin);
    if (!at)
        return false;
    message_origin_t o = {node_key, seq};
    memcpy(at, &o, sizeof(o));
    return true;
}

bool rt_message_origin(const rt_bin_t *bin, uint64_t *node_key, uint64_t *seq)
{
    const uint8_t *at = origin_at(bin);
    message_origin_t o = {0, 0};
    if (at)
        memcpy(&o, at, sizeof(o));
    *node_key = o.node_key;
    *seq = o.seq;
    return o.seq != 0;
}

/* ---- Delivery timing ---- */

static rt_hist_t delivery_hist;

const rt_hist_t *rt_message_delivery_hist(void)
{
    return &delivery_hist;
}

void rt_message_set_read_ns(rt_bin_t *bin, uint64_t ns)
{
    memcpy(index_at(bin) + offsetof(message_index_t, read_ns), &ns, sizeof(ns));
}

bool rt_message_timed(const rt_bin_t *bin)
{
    uint64_t ns;
    memcpy(&ns, index_at(bin) + offsetof(message_index_t, read_ns), sizeof(ns));
    return ns != 0;
}

void rt_message_copy_written(const rt_bin_t *bin)
{
    uint64_t ns;
    memcpy(&ns, index_at(bin) + offsetof(message_index_t, read_ns), sizeof(ns));
    rt_hist_record(&delivery_hist, rt_turn_mono_ns(ns) - ns);
}

size_t rt_message_encode(const rt_message_t *m, const rt_message_out_t *o, uint8_t *buf, size_t cap)
{
    bool v5 = o->version == MQTT_V5;
    size_t topic_len = v5 && o->alias_only ? 0 : m->topic.len;
    size_t props = 0;
    if (v5) {
        props = m->props.len + (o->has_expiry_left ? 5 : 0) + (o->topic_alias ? 3 : 0);
        for (uint32_t i = 0; i < o->n_sub_ids; i++)
            props += 1 + mqtt_varint_size((uint32_t)o->sub_ids[i]);
    }
    size_t remaining = 2 + topic_len + (o->qos ? 2 : 0) +
                       (v5 ? mqtt_varint_size((uint32_t)props) + props : 0) + m->payload.len;
    if (remaining > MQTT_MAX_REMAINING)
        return SIZE_MAX;
    size_t total = 1 + mqtt_varint_size((uint32_t)remaining) + remaining;
    if (total > cap)
        return total;
    uint8_t *w = buf;
    *w++ = (uint8_t)(MQTT_PUBLISH << 4 | (o->dup && o->qos) << 3 | o->qos << 1 | !!o->retain);
    w = mqtt_varint_put(w, (uint32_t)remaining);
    *w++ = (uint8_t)(topic_len >> 8);
    *w++ = (uint8_t)topic_len;
    memcpy(w, m->topic.p, topic_len);
    w += topic_len;
    if (o->qos) {
        *w++ = (uint8_t)(o->packet_id >> 8);
        *w++ = (uint8_t)o->packet_id;
    }
    if (v5) {
        w = mqtt_varint_put(w, (uint32_t)props);
        if (o->has_expiry_left) {
            *w++ = MQTT_PROP_MESSAGE_EXPIRY;
            for (int shift = 24; shift >= 0; shift -= 8)
                *w++ = (uint8_t)(o->expiry_left >> shift);
        }
        if (o->topic_alias) {
            *w++ = MQTT_PROP_TOPIC_ALIAS;
            *w++ = (uint8_t)(o->topic_alias >> 8);
            *w++ = (uint8_t)o->topic_alias;
        }
        for (uint32_t i = 0; i < o->n_sub_ids; i++) {
            *w++ = MQTT_PROP_SUB_ID;
            w = mqtt_varint_put(w, (uint32_t)o->sub_ids[i]);
        }
        if (m->props.len)
            memcpy(w, m->props.p, m->props.len);
        w += m->props.len;
    }
    if (m->payload.len)
        memcpy(w, m->payload.p, m->payload.len);
    RT_ASSERT((size_t)(w + m->payload.len - buf) == total);
    return total;
}

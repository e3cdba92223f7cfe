/*
** The canonical message (message.h): made once per PUBLISH, read through offsets by
** everyone after, and written out per subscriber from its parts.
*/
#include <string.h>

#include "message.h"

/* Where the parts are; kept at the start of the binary's tail (read with memcpy: the
   tail follows the packet, so it has no alignment). */
typedef struct {
    uint32_t topic_off;
    uint32_t props_off, props_len;
    uint32_t payload_off, payload_len;
    uint32_t expiry;
    uint16_t topic_len;
    uint8_t qos, retain, has_expiry;
    uint8_t has_clientid, has_username;
} message_index_t;

/* Finds the parts of a PUBLISH the encoder has just written (so well formed). */
static void index_packet(const uint8_t *p, size_t len, uint8_t qos, message_index_t *x)
{
    uint32_t remaining;
    size_t used;
    int rc = mqtt_varint_get(p + 1, len - 1, &remaining, &used);
    RT_ASSERT(rc == 0);
    size_t i = 1 + used;
    x->topic_len = (uint16_t)(p[i] << 8 | p[i + 1]);
    x->topic_off = (uint32_t)(i + 2);
    i = x->topic_off + x->topic_len + (qos ? 2 : 0);
    rc = mqtt_varint_get(p + i, len - i, &x->props_len, &used);
    RT_ASSERT(rc == 0);
    (void)rc;
    x->props_off = (uint32_t)(i + used);
    x->payload_off = x->props_off + x->props_len;
    x->payload_len = (uint32_t)(len - x->payload_off);
    RT_ASSERT(x->payload_off <= len);
}

rt_bin_t *rt_message_new(const mqtt_packet_t *pk, const char *clientid, const char *username)
{
    RT_ASSERT(pk->publish.qos <= 2);
    mqtt_packet_t c = *pk;
    c.type = MQTT_PUBLISH;
    if (pk->version != MQTT_V5)
        memset(&c.props, 0, sizeof(c.props));
    message_index_t x = {.qos = c.publish.qos,
                         .retain = c.publish.retain,
                         .has_expiry =
                             !!(c.props.present & MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY)),
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
    rt_bin_t *bin = rt_bin_alloc_tail(len, sizeof(x) + idn + usern);
    if (!bin)
        return NULL;
    uint8_t *data = rt_bin_data(bin);
    if (mqtt_encode(&c, data, len, 0, &len, NULL) != 0) {
        rt_bin_release(bin);
        return NULL;
    }
    index_packet(data, len, x.qos, &x);
    x.has_clientid = idn != 0;
    x.has_username = usern != 0;
    uint8_t *tail = data + len;
    memcpy(tail, &x, sizeof(x));
    if (idn)
        memcpy(tail + sizeof(x), clientid, idn);
    if (usern)
        memcpy(tail + sizeof(x) + idn, username, usern);
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
    size_t tail_len;
    const uint8_t *tail = rt_bin_tail(bin, &tail_len);
    RT_ASSERT(tail_len >= sizeof(message_index_t));
    message_index_t x;
    memcpy(&x, tail, sizeof(x));
    const uint8_t *data = tail - rt_bin_len(bin);
    m->topic = (mqtt_str_t){data + x.topic_off, x.topic_len};
    m->props = (mqtt_str_t){data + x.props_off, x.props_len};
    m->payload = (mqtt_str_t){data + x.payload_off, x.payload_len};
    const char *ids = (const char *)tail + sizeof(x);
    m->clientid = x.has_clientid ? ids : NULL;
    m->username = x.has_username ? ids + strlen(ids) + 1 : NULL;
    m->expiry = x.expiry;
    m->qos = x.qos;
    m->retain = x.retain;
    m->has_expiry = x.has_expiry;
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

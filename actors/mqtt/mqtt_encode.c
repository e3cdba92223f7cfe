/*
** MQTT packet encoding for protocol levels 3, 4 and 5 (contracts in mqtt_codec.h). Each body
** goes twice through the counting writer of mqtt_impl.h: once to learn the Remaining Length
** (and whether the packet fits the peer's maximum), once to write it.
*/
#include "mqtt_impl.h"

size_t mqtt_varint_size(uint32_t v)
{
    return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4;
}

uint8_t *mqtt_varint_put(uint8_t *p, uint32_t v)
{
    RT_ASSERT(v <= MQTT_MAX_REMAINING);
    wr_t w = {.p = p, .cap = 4};
    w_varint(&w, v);
    return p + w.n;
}

int mqtt_varint_get(const uint8_t *p, size_t n, uint32_t *v, size_t *used)
{
    return varint_decode(p, n, v, used);
}

static void w_sublist(wr_t *w, const mqtt_packet_t *pk)
{
    if (!pk->sub.items) {
        if (pk->sub.raw.len == 0)
            w->err = RT_EINVAL;
        w_bytes(w, pk->sub.raw.p, pk->sub.raw.len);
        return;
    }
    if (pk->sub.count == 0)
        w->err = RT_EINVAL;
    for (uint32_t i = 0; i < pk->sub.count; i++) {
        w_bin(w, pk->sub.items[i].filter);
        if (pk->type == MQTT_SUBSCRIBE)
            w_u8(w, pk->sub.items[i].options);
    }
}

/* Reason code and properties that may both be omitted when trivial (acks, DISCONNECT, AUTH). */
static void w_reason_props(wr_t *w, const mqtt_packet_t *pk, int strip)
{
    int err = 0;
    size_t n = rt__mqtt_props_len(&pk->props, pk->type, strip, &err);
    if (err) {
        w->err = err;
        return;
    }
    if (pk->reason == 0 && n == 0)
        return;
    w_u8(w, pk->reason);
    if (n)
        rt__mqtt_props_write(w, &pk->props, pk->type, strip);
}

static void w_body(wr_t *w, const mqtt_packet_t *pk, int strip)
{
    int v5 = pk->version == MQTT_V5;
    switch (pk->type) {
    case MQTT_CONNECT: {
        const uint8_t *name = (const uint8_t *)(pk->version == MQTT_V31 ? "MQIsdp" : "MQTT");
        w_bin(w, (mqtt_str_t){name, pk->version == MQTT_V31 ? 6u : 4u});
        w_u8(w, pk->version);
        if (pk->connect.will_qos > 2 ||
            (!pk->connect.will && (pk->connect.will_qos || pk->connect.will_retain)))
            w->err = RT_EINVAL;
        if (!v5 && pk->connect.has_password && !pk->connect.has_username)
            w->err = RT_EINVAL;
        w_u8(w, (uint8_t)((pk->connect.has_username ? 0x80 : 0) |
                          (pk->connect.has_password ? 0x40 : 0) |
                          (pk->connect.will_retain ? 0x20 : 0) | (pk->connect.will_qos << 3) |
                          (pk->connect.will ? 0x04 : 0) | (pk->connect.clean_start ? 0x02 : 0)));
        w_u16(w, pk->connect.keepalive);
        if (v5)
            rt__mqtt_props_write(w, &pk->props, MQTT_CONNECT, 0);
        w_bin(w, pk->connect.client_id);
        if (pk->connect.will) {
            if (v5)
                rt__mqtt_props_write(w, &pk->connect.will_props, MQTT_CTX_WILL, 0);
            w_bin(w, pk->connect.will_topic);
            w_bin(w, pk->connect.will_payload);
        }
        if (pk->connect.has_username)
            w_bin(w, pk->connect.username);
        if (pk->connect.has_password)
            w_bin(w, pk->connect.password);
        break;
    }
    case MQTT_CONNACK:
        if (!v5 && pk->reason > 5)
            w->err = RT_EINVAL;
        /* MQTT 3.1 has no Session Present flag; its first CONNACK byte is unused. */
        w_u8(w, pk->connack.session_present && pk->version != MQTT_V31 ? 1 : 0);
        w_u8(w, pk->reason);
        if (v5)
            rt__mqtt_props_write(w, &pk->props, MQTT_CONNACK, strip);
        break;
    case MQTT_PUBLISH:
        if (pk->publish.qos > 2 || (pk->publish.qos && !pk->packet_id))
            w->err = RT_EINVAL;
        {
            size_t topic_at = w->n + 2;
            w_bin(w, pk->publish.topic);
            if (pk->publish.qos)
                w_u16(w, pk->packet_id);
            size_t props_at = v5 ? rt__mqtt_props_write(w, &pk->props, MQTT_PUBLISH, 0) : w->n;
            if (w->at)
                *w->at = (mqtt_publish_at_t){
                    .topic_off = topic_at, .props_off = props_at, .payload_off = w->n};
            w_bytes(w, pk->publish.payload.p, pk->publish.payload.len);
            break;
        }
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
        w_u16(w, pk->packet_id);
        if (v5)
            w_reason_props(w, pk, strip);
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE:
        if (!pk->packet_id)
            w->err = RT_EINVAL;
        w_u16(w, pk->packet_id);
        if (v5)
            rt__mqtt_props_write(w, &pk->props, pk->type, 0);
        w_sublist(w, pk);
        break;
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        w_u16(w, pk->packet_id);
        if (pk->type == MQTT_UNSUBACK && !v5)
            break;
        if (v5)
            rt__mqtt_props_write(w, &pk->props, pk->type, strip);
        if (pk->codes.len == 0)
            w->err = RT_EINVAL;
        w_bytes(w, pk->codes.p, pk->codes.len);
        break;
    case MQTT_PINGREQ:
    case MQTT_PINGRESP:
        break;
    case MQTT_DISCONNECT:
    case MQTT_AUTH:
        if (v5)
            w_reason_props(w, pk, strip);
        break;
    }
}

/* Reason String and User Property may be dropped from these to fit (3.2.2.3.9, 3.4.2.2.2..). */
static int strippable(const mqtt_packet_t *pk)
{
    switch (pk->type) {
    case MQTT_CONNACK:
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
    case MQTT_DISCONNECT:
    case MQTT_AUTH:
        return pk->version == MQTT_V5;
    default:
        return 0;
    }
}

static int encode(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, uint32_t max_size, size_t *len,
                  int *stripped, mqtt_publish_at_t *at)
{
    if (stripped)
        *stripped = 0;
    if (pk->version < MQTT_V31 || pk->version > MQTT_V5)
        return RT_EINVAL;
    if (pk->type < MQTT_CONNECT || pk->type > MQTT_AUTH ||
        (pk->type == MQTT_AUTH && pk->version < MQTT_V5))
        return RT_EINVAL;
    for (int strip = 0; strip < 2; strip++) {
        wr_t c = {0};
        w_body(&c, pk, strip);
        if (c.err)
            return c.err;
        if (c.n > MQTT_MAX_REMAINING)
            return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
        size_t total = 1 + mqtt_varint_size((uint32_t)c.n) + c.n;
        if (max_size && total > max_size) {
            if (!strip && strippable(pk))
                continue;
            return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
        }
        *len = total;
        if (stripped)
            *stripped = strip;
        if (!buf)
            return 0;
        if (cap < total)
            return RT_EINVAL;
        uint8_t fl = 0;
        if (pk->type == MQTT_PUBLISH)
            fl = (uint8_t)((pk->publish.dup ? 8 : 0) | pk->publish.qos << 1 |
                           (pk->publish.retain ? 1 : 0));
        else if (pk->type == MQTT_PUBREL || pk->type == MQTT_SUBSCRIBE ||
                 pk->type == MQTT_UNSUBSCRIBE)
            fl = 2;
        wr_t w = {.p = buf, .cap = total, .at = at};
        w_u8(&w, (uint8_t)(pk->type << 4 | fl));
        w_varint(&w, (uint32_t)c.n);
        w_body(&w, pk, strip);
        RT_ASSERT(w.n == total && !w.err);
        return 0;
    }
    return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
}

int mqtt_encode(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, uint32_t max_size, size_t *len,
                int *stripped)
{
    return encode(pk, buf, cap, max_size, len, stripped, NULL);
}

int mqtt_encode_publish(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, size_t *len,
                        mqtt_publish_at_t *at)
{
    RT_ASSERT(pk->type == MQTT_PUBLISH && buf && at);
    return encode(pk, buf, cap, 0, len, NULL, at);
}

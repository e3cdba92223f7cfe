#include "rtb_mqtt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define RTB_BUF_MIN 4096 /* first allocation of a buffer, bytes */

int rtb_buf_reserve(rtb_buf_t *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : RTB_BUF_MIN;
    while (cap - b->len < extra)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int rtb_buf_append(rtb_buf_t *b, const void *p, size_t n)
{
    int r = rtb_buf_reserve(b, n);
    if (r)
        return r;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

void rtb_buf_free(rtb_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static size_t varint_len(size_t v)
{
    return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4;
}

static uint8_t *put_varint(uint8_t *o, size_t v)
{
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        *o++ = byte | (v ? 0x80 : 0);
    } while (v);
    return o;
}

static uint8_t *put_u16(uint8_t *o, uint16_t v)
{
    o[0] = (uint8_t)(v >> 8);
    o[1] = (uint8_t)v;
    return o + 2;
}

static uint8_t *put_str(uint8_t *o, const char *s, size_t n)
{
    o = put_u16(o, (uint16_t)n);
    memcpy(o, s, n);
    return o + n;
}

/* Reserves room for a packet with remaining length rl and writes its fixed header. */
static uint8_t *begin(rtb_buf_t *b, uint8_t first, size_t rl)
{
    if (rl > 268435455u || rtb_buf_reserve(b, 1 + varint_len(rl) + rl))
        return NULL;
    uint8_t *o = b->p + b->len;
    *o++ = first;
    return put_varint(o, rl);
}

int rtb_mqtt_connect(rtb_buf_t *b, const rtb_connect_t *c)
{
    const char *name = c->version == 3 ? "MQIsdp" : "MQTT";
    size_t nlen = strlen(name), idlen = strlen(c->client_id);
    size_t ulen = c->user ? strlen(c->user) : 0, plen = c->pass ? strlen(c->pass) : 0;
    if (idlen > 65535 || ulen > 65535 || plen > 65535)
        return -EINVAL;
    size_t rl = 2 + nlen + 1 + 1 + 2 + (c->version == 5 ? 1 : 0) + 2 + idlen;
    if (c->user)
        rl += 2 + ulen;
    if (c->pass)
        rl += 2 + plen;
    uint8_t *o = begin(b, 0x10, rl);
    if (!o)
        return -ENOMEM;
    o = put_str(o, name, nlen);
    *o++ = (uint8_t)c->version;
    *o++ = (uint8_t)((c->user ? 0x80 : 0) | (c->pass ? 0x40 : 0) | (c->clean ? 0x02 : 0));
    o = put_u16(o, c->keepalive);
    if (c->version == 5)
        *o++ = 0; /* no properties */
    o = put_str(o, c->client_id, idlen);
    if (c->user)
        o = put_str(o, c->user, ulen);
    if (c->pass)
        o = put_str(o, c->pass, plen);
    b->len = (size_t)(o - b->p);
    return 0;
}

int rtb_mqtt_publish(rtb_buf_t *b, int version, int qos, uint16_t pid, const char *topic,
                     size_t topic_len, const void *head, size_t head_len, size_t payload_len)
{
    size_t rl = 2 + topic_len + (qos ? 2 : 0) + (version == 5 ? 1 : 0) + payload_len;
    uint8_t *o = begin(b, (uint8_t)(0x30 | (qos << 1)), rl);
    if (!o)
        return -ENOMEM;
    o = put_str(o, topic, topic_len);
    if (qos)
        o = put_u16(o, pid);
    if (version == 5)
        *o++ = 0;
    memcpy(o, head, head_len);
    memset(o + head_len, 'x', payload_len - head_len);
    o += payload_len;
    b->len = (size_t)(o - b->p);
    return 0;
}

int rtb_mqtt_ack(rtb_buf_t *b, int type, uint16_t pid)
{
    /* PUBREL must carry flags 0b0010; the other acks carry none. */
    uint8_t *o = begin(b, (uint8_t)(type << 4 | (type == RTB_PUBREL ? 2 : 0)), 2);
    if (!o)
        return -ENOMEM;
    o = put_u16(o, pid);
    b->len = (size_t)(o - b->p);
    return 0;
}

int rtb_mqtt_subscribe(rtb_buf_t *b, int version, uint16_t pid, const char *filter, int qos)
{
    size_t flen = strlen(filter);
    if (flen > 65535)
        return -EINVAL;
    size_t rl = 2 + (version == 5 ? 1 : 0) + 2 + flen + 1;
    uint8_t *o = begin(b, 0x82, rl);
    if (!o)
        return -ENOMEM;
    o = put_u16(o, pid);
    if (version == 5)
        *o++ = 0;
    o = put_str(o, filter, flen);
    *o++ = (uint8_t)qos;
    b->len = (size_t)(o - b->p);
    return 0;
}

int rtb_mqtt_empty(rtb_buf_t *b, int type)
{
    uint8_t *o = begin(b, (uint8_t)(type << 4), 0);
    if (!o)
        return -ENOMEM;
    b->len = (size_t)(o - b->p);
    return 0;
}

/* Reads a v5 property-length varint at p[*i..end) and skips the properties. */
static int skip_props(const uint8_t *p, size_t end, size_t *i)
{
    size_t v = 0;
    for (unsigned shift = 0; shift < 28; shift += 7) {
        if (*i >= end)
            return -EPROTO;
        uint8_t byte = p[(*i)++];
        v |= (size_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            if (v > end - *i)
                return -EPROTO;
            *i += v;
            return 0;
        }
    }
    return -EPROTO;
}

int rtb_mqtt_parse(const uint8_t *p, size_t n, int version, rtb_pkt_t *pkt, size_t *used)
{
    if (n < 2)
        return 1;
    size_t rl = 0, i = 1;
    for (unsigned shift = 0;; shift += 7) {
        if (shift >= 28)
            return -EPROTO;
        if (i >= n)
            return 1;
        uint8_t byte = p[i++];
        rl |= (size_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80))
            break;
    }
    if (rl > RTB_MQTT_MAX_PACKET)
        return -EPROTO;
    if (n - i < rl)
        return 1;
    size_t end = i + rl;
    memset(pkt, 0, sizeof(*pkt));
    pkt->type = p[0] >> 4;
    pkt->flags = p[0] & 0x0f;
    *used = end;

    switch (pkt->type) {
    case RTB_CONNACK:
        if (rl < 2)
            return -EPROTO;
        pkt->rc = p[i + 1];
        return 0;
    case RTB_PUBLISH: {
        pkt->qos = (pkt->flags >> 1) & 3;
        if (pkt->qos == 3 || rl < 2)
            return -EPROTO;
        size_t tl = (size_t)p[i] << 8 | p[i + 1];
        i += 2;
        if (tl > end - i)
            return -EPROTO;
        pkt->topic = p + i;
        pkt->topic_len = tl;
        i += tl;
        if (pkt->qos) {
            if (end - i < 2)
                return -EPROTO;
            pkt->pid = (uint16_t)(p[i] << 8 | p[i + 1]);
            i += 2;
        }
        if (version == 5 && skip_props(p, end, &i))
            return -EPROTO;
        pkt->payload = p + i;
        pkt->payload_len = end - i;
        return 0;
    }
    case RTB_PUBACK:
    case RTB_PUBREC:
    case RTB_PUBREL:
    case RTB_PUBCOMP:
        if (rl < 2)
            return -EPROTO;
        pkt->pid = (uint16_t)(p[i] << 8 | p[i + 1]);
        pkt->rc = rl > 2 ? p[i + 2] : 0;
        return 0;
    case RTB_SUBACK:
        if (rl < 3)
            return -EPROTO;
        pkt->pid = (uint16_t)(p[i] << 8 | p[i + 1]);
        i += 2;
        if (version == 5 && skip_props(p, end, &i))
            return -EPROTO;
        if (i >= end)
            return -EPROTO;
        pkt->rc = p[i];
        return 0;
    case RTB_PINGRESP:
        return 0;
    case RTB_DISCONNECT:
        pkt->rc = rl > 0 ? p[i] : 0;
        return 0;
    default:
        return -EPROTO;
    }
}

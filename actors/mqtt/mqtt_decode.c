/*
** MQTT packet decoding for protocol levels 3, 4 and 5: the validity checks of 1.5.4 (those
** of topic syntax, 4.7, are topic.h's), framing a byte stream, and decoding each packet type
** into a struct that points into the input (contracts in mqtt_codec.h). Every read goes
** through the bounded reader of mqtt_impl.h.
*/
#include "mqtt_impl.h"

#include <stdbool.h>

/* ---------------------------------------------------------------- validity checks */

/*
** UTF-8 Encoded Strings must be well-formed UTF-8 (RFC 3629: no overlong forms, no
** surrogates U+D800..U+DFFF, nothing above U+10FFFF) and must not contain U+0000 (1.5.4).
*/
int mqtt_utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        if (s[i] == 0) /* U+0000: MQTT 1.5.4 forbids it */
            return 0;
        size_t len = s[i] < 0x80 ? 1 : rt_utf8_len(s + i, n - i);
        if (!len)
            return 0;
        i += len;
    }
    return 1;
}

uint8_t mqtt_v3_connack_code(uint8_t reason)
{
    switch (reason) {
    case MQTT_RC_SUCCESS:
        return 0;
    case MQTT_RC_UNSUPPORTED_VERSION:
        return 1;
    case MQTT_RC_CLIENT_ID_INVALID:
        return 2;
    case MQTT_RC_SERVER_UNAVAILABLE:
    case MQTT_RC_SERVER_BUSY:
    case MQTT_RC_SERVER_SHUTTING_DOWN:
    case MQTT_RC_USE_ANOTHER_SERVER:
    case MQTT_RC_SERVER_MOVED:
    case MQTT_RC_CONNECTION_RATE_EXCEEDED:
        return 3;
    case MQTT_RC_BAD_CREDENTIALS:
        return 4;
    case MQTT_RC_NOT_AUTHORIZED:
    case MQTT_RC_BANNED:
        return 5;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- framing */

int mqtt_frame(const uint8_t *buf, size_t len, uint32_t max_size, mqtt_frame_t *f)
{
    f->size = 0;
    f->header_len = 0;
    f->type = 0;
    if (len == 0)
        return RT_EAGAIN;
    f->type = buf[0] >> 4;
    uint32_t rl;
    size_t used;
    int rc = varint_decode(buf + 1, len - 1, &rl, &used);
    if (rc)
        return rc;
    uint64_t total = 1 + (uint64_t)used + rl;
    if (max_size && total > max_size)
        return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
    f->header_len = (uint8_t)(1 + used);
    f->size = (uint32_t)total;
    return total <= len ? 0 : RT_EAGAIN;
}

int mqtt_sub_next(const mqtt_packet_t *pk, size_t *pos, mqtt_sub_t *out)
{
    const mqtt_str_t *raw = &pk->sub.raw;
    if (!raw->p || *pos >= raw->len)
        return 0;
    rd_t r = {raw->p + *pos, raw->p + raw->len};
    if (rd_bin(&r, &out->filter))
        return 0;
    out->options = 0;
    if (pk->type == MQTT_SUBSCRIBE && rd_u8(&r, &out->options))
        return 0;
    *pos = (size_t)(r.p - raw->p);
    return 1;
}

/* ---------------------------------------------------------------- decoding */

static int in_set(uint8_t code, const char *set, size_t n)
{
    return memchr(set, code, n) != NULL;
}
#define IN_SET(code, lit) in_set((code), (lit), sizeof(lit) - 1)

/* Reason codes each packet may carry (3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.9.3,
** 3.11.3, 3.14.2.1, 3.15.2.1). String literals hold them; a 0x00 code is checked apart. */
#define RC_CONNACK                                                                                 \
    "\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8c\x90\x95\x97\x99\x9a\x9b\x9c\x9d\x9f"
#define RC_PUBACK "\x10\x80\x83\x87\x90\x91\x97\x99"
#define RC_PUBREL "\x92"
#define RC_SUBACK "\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2"
#define RC_UNSUBACK "\x11\x80\x83\x87\x8f\x91"
#define RC_DISCONNECT                                                                              \
    "\x04\x80\x81\x82\x83\x87\x89\x8b\x8d\x8e\x8f\x90\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c"     \
    "\x9d\x9e\x9f\xa0\xa1\xa2"
#define RC_AUTH "\x18\x19"

static int reason_ok(uint8_t type, uint8_t code)
{
    if (code == 0)
        return 1;
    switch (type) {
    case MQTT_CONNACK:
        return IN_SET(code, RC_CONNACK);
    case MQTT_PUBACK:
    case MQTT_PUBREC:
        return IN_SET(code, RC_PUBACK);
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
        return IN_SET(code, RC_PUBREL);
    case MQTT_SUBACK:
        return IN_SET(code, RC_SUBACK);
    case MQTT_UNSUBACK:
        return IN_SET(code, RC_UNSUBACK);
    case MQTT_DISCONNECT:
        return IN_SET(code, RC_DISCONNECT);
    case MQTT_AUTH:
        return IN_SET(code, RC_AUTH);
    default:
        return 0;
    }
}

/* A non-zero Packet Identifier (2.2.1); zero is a protocol error. */
static int rd_packet_id(rd_t *r, uint16_t *id)
{
    if (rd_u16(r, id))
        return MQTT_EMAL;
    return *id ? 0 : MQTT_EPROTO;
}

static int decode_connect(rd_t *r, mqtt_packet_t *pk)
{
    mqtt_str_t name;
    uint8_t level, fl;
    int rc;
    if (rd_bin(r, &name) || rd_u8(r, &level) || rd_u8(r, &fl))
        return MQTT_EMAL;
    /* Protocol Name and Level (3.1.2.1, 3.1.2.2; MQTT 3.1 uses "MQIsdp" with level 3). The
    ** level is recorded first so that a refusal can be answered in the client's format. */
    pk->version = level;
    if (name.len == 4 && memcmp(name.p, "MQTT", 4) == 0) {
        if (level != MQTT_V311 && level != MQTT_V5)
            return MQTT_ERR(MQTT_RC_UNSUPPORTED_VERSION);
    } else if (name.len == 6 && memcmp(name.p, "MQIsdp", 6) == 0) {
        if (level != MQTT_V31)
            return MQTT_ERR(MQTT_RC_UNSUPPORTED_VERSION);
    } else {
        return MQTT_EPROTO;
    }
    /* Connect Flags (3.1.2.3): reserved bit 0 must be 0; without a will, will QoS and will
    ** retain must be 0 (3.1.2.5, 3.1.2.6); will QoS 3 is malformed (3.1.2.6). */
    if (fl & 0x01)
        return MQTT_EMAL;
    pk->connect.clean_start = (fl >> 1) & 1;
    pk->connect.will = (fl >> 2) & 1;
    pk->connect.will_qos = (fl >> 3) & 3;
    pk->connect.will_retain = (fl >> 5) & 1;
    pk->connect.has_password = (fl >> 6) & 1;
    pk->connect.has_username = (fl >> 7) & 1;
    if (pk->connect.will_qos == 3)
        return MQTT_EMAL;
    if (!pk->connect.will && (pk->connect.will_qos || pk->connect.will_retain))
        return MQTT_EMAL;
    /* Before MQTT 5 a password requires a user name (3.1.1 3.1.2.9, MQTT-3.1.2-22). */
    if (level < MQTT_V5 && pk->connect.has_password && !pk->connect.has_username)
        return MQTT_EMAL;
    if (rd_u16(r, &pk->connect.keepalive))
        return MQTT_EMAL;
    if (level == MQTT_V5 && (rc = rt__mqtt_props_read(r, MQTT_CONNECT, &pk->props)))
        return rc;
    /* Authentication Data needs an Authentication Method (3.1.2.11.10). */
    uint64_t auth = pk->props.present &
                    (MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD) | MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA));
    if (auth == MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA))
        return MQTT_EPROTO;
    if ((rc = rd_str(r, &pk->connect.client_id)))
        return rc;
    /* Client Identifier: 1..23 characters in MQTT 3.1 (3.1 spec, CONNECT payload); in 3.1.1
    ** an empty one requires Clean Session (MQTT-3.1.3-7/8); MQTT 5 assigns one (3.1.3.1). */
    uint32_t idlen = pk->connect.client_id.len;
    if (level == MQTT_V31 && (idlen < 1 || idlen > 23))
        return MQTT_ERR(MQTT_RC_CLIENT_ID_INVALID);
    if (level == MQTT_V311 && idlen == 0 && !pk->connect.clean_start)
        return MQTT_ERR(MQTT_RC_CLIENT_ID_INVALID);
    if (pk->connect.will) {
        if (level == MQTT_V5 &&
            (rc = rt__mqtt_props_read(r, MQTT_CTX_WILL, &pk->connect.will_props)))
            return rc;
        if ((rc = rd_str(r, &pk->connect.will_topic)))
            return rc;
        /* The will topic becomes a PUBLISH Topic Name (3.1.3.3, 3.3.2.1). */
        if (!rt_topic_valid_name((const char *)pk->connect.will_topic.p,
                                 pk->connect.will_topic.len))
            return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
        if (rd_bin(r, &pk->connect.will_payload))
            return MQTT_EMAL;
        /* A will payload declared UTF-8 must be UTF-8 (3.1.3.2.3). */
        if (pk->connect.will_props.payload_format == 1 &&
            !mqtt_utf8_valid(pk->connect.will_payload.p, pk->connect.will_payload.len))
            return MQTT_ERR(MQTT_RC_PAYLOAD_FORMAT_INVALID);
    }
    if (pk->connect.has_username && (rc = rd_str(r, &pk->connect.username)))
        return rc;
    if (pk->connect.has_password && rd_bin(r, &pk->connect.password))
        return MQTT_EMAL;
    return 0;
}

static int decode_connack(rd_t *r, mqtt_packet_t *pk)
{
    uint8_t fl;
    if (rd_u8(r, &fl) || rd_u8(r, &pk->reason))
        return MQTT_EMAL;
    if (pk->version == MQTT_V31) {
        /* MQTT 3.1 leaves the first byte unused and has return codes 0..5. */
        return pk->reason <= 5 ? 0 : MQTT_EPROTO;
    }
    /* Connect Acknowledge Flags: bits 7..1 reserved (3.2.2.1). */
    if (fl & 0xFE)
        return MQTT_EMAL;
    pk->connack.session_present = fl & 1;
    /* A refusal never carries Session Present (3.2.2.1.1; 3.1.1 MQTT-3.2.2-4). */
    if (pk->reason != 0 && pk->connack.session_present)
        return MQTT_EPROTO;
    if (pk->version == MQTT_V311)
        return pk->reason <= 5 ? 0 : MQTT_EPROTO;
    if (!reason_ok(MQTT_CONNACK, pk->reason))
        return MQTT_EPROTO;
    return rt__mqtt_props_read(r, MQTT_CONNACK, &pk->props);
}

static int decode_publish(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    pk->publish.dup = (pk->flags >> 3) & 1;
    pk->publish.qos = (pk->flags >> 1) & 3;
    pk->publish.retain = pk->flags & 1;
    /* QoS 3 is malformed (3.3.1.2); DUP must be 0 with QoS 0 (3.3.1.1). */
    if (pk->publish.qos == 3 || (pk->publish.dup && pk->publish.qos == 0))
        return MQTT_EMAL;
    if ((rc = rd_str(r, &pk->publish.topic)))
        return rc;
    if (pk->publish.qos && (rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->version == MQTT_V5 && (rc = rt__mqtt_props_read(r, MQTT_PUBLISH, &pk->props)))
        return rc;
    mqtt_str_t t = pk->publish.topic;
    if (t.len == 0) {
        /* An empty Topic Name is only allowed with a Topic Alias (3.3.2.1, 3.3.4). */
        if (pk->version < MQTT_V5)
            return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
        if (!(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
            return MQTT_EPROTO;
    } else if (!rt_topic_valid_name((const char *)t.p, t.len)) {
        return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
    }
    pk->publish.payload.p = r->p;
    pk->publish.payload.len = (uint32_t)rd_left(r);
    r->p = r->end;
    /* A payload declared UTF-8 must be UTF-8 (3.3.2.3.2). */
    if (pk->props.payload_format == 1 &&
        !mqtt_utf8_valid(pk->publish.payload.p, pk->publish.payload.len))
        return MQTT_ERR(MQTT_RC_PAYLOAD_FORMAT_INVALID);
    return 0;
}

/* PUBACK, PUBREC, PUBREL, PUBCOMP: packet id, then in MQTT 5 an optional reason code and
** optional properties (3.4.2.1: Remaining Length 2 means success, below 4 no properties). */
static int decode_ack(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    if ((rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->version < MQTT_V5 || rd_left(r) == 0)
        return 0;
    if (rd_u8(r, &pk->reason))
        return MQTT_EMAL;
    if (!reason_ok(pk->type, pk->reason))
        return MQTT_EPROTO;
    if (rd_left(r) == 0)
        return 0;
    return rt__mqtt_props_read(r, pk->type, &pk->props);
}

static int decode_subscribe(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    if ((rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->version == MQTT_V5 && (rc = rt__mqtt_props_read(r, pk->type, &pk->props)))
        return rc;
    pk->sub.raw.p = r->p;
    pk->sub.raw.len = (uint32_t)rd_left(r);
    /* At least one topic filter (3.8.3, 3.10.3). */
    if (rd_left(r) == 0)
        return MQTT_EPROTO;
    uint32_t count = 0;
    while (rd_left(r)) {
        mqtt_str_t f;
        rt_topic_filter_t sf;
        if ((rc = rd_str(r, &f)))
            return rc;
        if (rt_topic_parse_filter((const char *)f.p, f.len, &sf))
            return MQTT_ERR(MQTT_RC_TOPIC_FILTER_INVALID);
        if (pk->type == MQTT_SUBSCRIBE) {
            uint8_t o;
            if (rd_u8(r, &o))
                return MQTT_EMAL;
            /* Subscription Options (3.8.3.1): reserved bits (v3: bits 7..2) malformed, QoS 3
            ** malformed, Retain Handling 3 and No Local on a shared subscription protocol
            ** errors (3.8.3.1, MQTT-3.8.3-4). */
            if (o & (pk->version == MQTT_V5 ? 0xC0 : 0xFC))
                return MQTT_EMAL;
            if (MQTT_SUB_QOS(o) == 3)
                return MQTT_EMAL;
            if (MQTT_SUB_RETAIN_HANDLING(o) == 3)
                return MQTT_EPROTO;
            if ((o & MQTT_SUB_NO_LOCAL) && sf.group)
                return MQTT_EPROTO;
        }
        count++;
    }
    pk->sub.count = count;
    return 0;
}

/* SUBACK, and UNSUBACK in MQTT 5: packet id, properties, one reason code per filter. */
static int decode_suback(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    if ((rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->type == MQTT_UNSUBACK && pk->version < MQTT_V5)
        return 0; /* 3.1.1 3.11: no payload */
    if (pk->version == MQTT_V5 && (rc = rt__mqtt_props_read(r, pk->type, &pk->props)))
        return rc;
    pk->codes.p = r->p;
    pk->codes.len = (uint32_t)rd_left(r);
    if (pk->codes.len == 0)
        return MQTT_EPROTO;
    for (uint32_t i = 0; i < pk->codes.len; i++) {
        uint8_t c = pk->codes.p[i];
        /* 3.1.1 return codes are 0, 1, 2 and 0x80 (3.1.1 3.9.3). */
        int ok = pk->version == MQTT_V5 ? reason_ok(pk->type, c) : (c <= 2 || c == 0x80);
        if (!ok)
            return MQTT_EPROTO;
    }
    r->p = r->end;
    return 0;
}

/* DISCONNECT and AUTH in MQTT 5: optional reason code, then optional properties
** (3.14.2.1, 3.15.2.1: Remaining Length 0 means reason 0x00, below 2 no properties). */
static int decode_reason_props(rd_t *r, mqtt_packet_t *pk)
{
    int rc = 0;
    if (pk->version == MQTT_V5 && rd_left(r) > 0) {
        if (rd_u8(r, &pk->reason))
            return MQTT_EMAL;
        if (!reason_ok(pk->type, pk->reason))
            return MQTT_EPROTO;
        if (rd_left(r) > 0)
            rc = rt__mqtt_props_read(r, pk->type, &pk->props);
    }
    /* AUTH must name its Authentication Method (3.15.2.2.2), so in practice the short form
    ** of 3.15.2.1 is refused, as Mosquitto does. */
    if (!rc && pk->type == MQTT_AUTH && !(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD)))
        return MQTT_EPROTO;
    return rc;
}

int mqtt_decode(const uint8_t *buf, size_t len, uint8_t version, mqtt_packet_t *pk)
{
    mqtt_frame_t f;
    int rc = mqtt_frame(buf, len, 0, &f);
    if (rc)
        return rc;
    /* Zero the common fields and only the union member this type uses: clearing the whole
    ** struct (mostly CONNECT's will properties) costs more than the rest of a small decode. */
    _Static_assert(sizeof pk->sub <= sizeof pk->publish && sizeof pk->codes <= sizeof pk->publish,
                   "publish is the largest union member after connect");
    memset(pk, 0, offsetof(mqtt_packet_t, connect));
    if (f.type == MQTT_CONNECT)
        memset(&pk->connect, 0, sizeof pk->connect);
    else
        memset(&pk->publish, 0, sizeof pk->publish);
    pk->type = f.type;
    pk->flags = buf[0] & 0x0F;
    pk->size = f.size;
    pk->version = version;
    if (f.type != MQTT_CONNECT && (version < MQTT_V31 || version > MQTT_V5))
        return RT_EINVAL;
    /* Fixed-header flags are fixed for every type but PUBLISH (2.1.3); type 0 is reserved,
    ** and so is 15 before MQTT 5. */
    if (f.type == 0 || (f.type == MQTT_AUTH && version < MQTT_V5))
        return MQTT_EMAL;
    bool sub = f.type == MQTT_SUBSCRIBE || f.type == MQTT_UNSUBSCRIBE;
    uint8_t want = f.type == MQTT_PUBREL || sub ? 2 : 0;
    /* MQTT 3.1 clients (Tsung 1.7 among them) send (UN)SUBSCRIBE with flags 0000: the 3.1
    ** text gives those bits as QoS 1 without requiring them, and Mosquitto accepts both. */
    bool v31_sub_flags = sub && version == MQTT_V31 && pk->flags == 0;
    if (f.type != MQTT_PUBLISH && pk->flags != want && !v31_sub_flags)
        return MQTT_EMAL;
    rd_t r = {buf + f.header_len, buf + f.size};
    switch (f.type) {
    case MQTT_CONNECT:
        rc = decode_connect(&r, pk);
        break;
    case MQTT_CONNACK:
        rc = decode_connack(&r, pk);
        break;
    case MQTT_PUBLISH:
        rc = decode_publish(&r, pk);
        break;
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
        rc = decode_ack(&r, pk);
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE:
        rc = decode_subscribe(&r, pk);
        break;
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        rc = decode_suback(&r, pk);
        break;
    case MQTT_PINGREQ:
    case MQTT_PINGRESP:
        rc = 0;
        break;
    case MQTT_DISCONNECT:
    case MQTT_AUTH:
        rc = decode_reason_props(&r, pk);
        break;
    }
    if (rc)
        return rc;
    /* Bytes left over inside the Remaining Length make the packet malformed. */
    return r.p == r.end ? 0 : MQTT_EMAL;
}

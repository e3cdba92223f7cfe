/*
** MQTT packet codec: framing, decoding and encoding for protocol levels 3, 4 and 5.
** See mqtt_codec.h for the contracts. The decoder reads through a bounded cursor (rd_t): every
** read checks the remaining length first, so no input, however hostile, makes it read
** outside the packet. The encoder runs each body twice through the same writer (wr_t): once
** counting (p NULL) to learn the Remaining Length, once writing.
*/
#include "mqtt_codec.h"

#include <stdbool.h>
#include <string.h>

#define EMAL MQTT_ERR(MQTT_RC_MALFORMED)
#define EPROTO MQTT_ERR(MQTT_RC_PROTOCOL_ERROR)

/* ---------------------------------------------------------------- validity checks */

/*
** UTF-8 Encoded Strings must be well-formed UTF-8 (RFC 3629: no overlong forms, no
** surrogates U+D800..U+DFFF, nothing above U+10FFFF) and must not contain U+0000 (1.5.4).
*/
int mqtt_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            if (c == 0)
                return 0;
            i++;
            continue;
        }
        if (c < 0xC2) /* a stray continuation byte, or an overlong two-byte form */
            return 0;
        if (c < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
            continue;
        }
        if (c < 0xF0) {
            if (n - i < 3 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) /* overlong */
                return 0;
            if (c == 0xED && s[i + 1] >= 0xA0) /* surrogate */
                return 0;
            i += 3;
            continue;
        }
        if (c < 0xF5) {
            if (n - i < 4 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) /* overlong */
                return 0;
            if (c == 0xF4 && s[i + 1] >= 0x90) /* above U+10FFFF */
                return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

/* A Topic Name is at least one character and holds no wildcard (4.7.1, 4.7.3, 3.3.2.1). */
int mqtt_topic_name_valid(const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    return memchr(s, '+', n) == NULL && memchr(s, '#', n) == NULL;
}

/*
** Topic levels: '#' must be the whole last level, '+' a whole level (4.7.1.2, 4.7.1.3).
** Checked on s[0..n), which may be empty only as part of a shared subscription check.
*/
static int filter_levels_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '+' && s[i] != '#')
            continue;
        if (i > 0 && s[i - 1] != '/')
            return 0;
        if (s[i] == '#')
            return i + 1 == n;
        if (i + 1 < n && s[i + 1] != '/')
            return 0;
    }
    return 1;
}

/*
** A Topic Filter is at least one character with well-formed wildcards (4.7.3). A shared
** subscription "$share/{ShareName}/{filter}" needs a ShareName of at least one character
** without '/', '+' or '#' and a non-empty valid filter (4.8.2).
*/
int mqtt_topic_filter_valid(const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    if (n >= 7 && memcmp(s, "$share/", 7) == 0) {
        size_t i = 7;
        while (i < n && s[i] != '/') {
            if (s[i] == '+' || s[i] == '#')
                return 0;
            i++;
        }
        if (i == 7 || i + 1 >= n) /* empty ShareName, or no '/' and filter after it */
            return 0;
        return filter_levels_valid(s + i + 1, n - i - 1);
    }
    return filter_levels_valid(s, n);
}

static int is_shared(mqtt_str_t f)
{
    return f.len >= 7 && memcmp(f.p, "$share/", 7) == 0;
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

/* ---------------------------------------------------------------- variable byte integers */

/*
** Decodes a Variable Byte Integer (1.5.5) from p[0..n): at most 4 bytes, minimally encoded
** (a last byte of 0 after the first is a longer form of a shorter number). Returns 0 and sets
** *v and *used, RT_EAGAIN if p ends inside it, EMAL if malformed.
*/
static int varint_decode(const uint8_t *p, size_t n, uint32_t *v, size_t *used)
{
    uint32_t val = 0;
    for (size_t i = 0; i < 4; i++) {
        if (i >= n)
            return RT_EAGAIN;
        uint8_t b = p[i];
        val |= (uint32_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            if (i > 0 && b == 0)
                return EMAL;
            *v = val;
            *used = i + 1;
            return 0;
        }
    }
    return EMAL;
}

static size_t varint_len(uint32_t v)
{
    return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4;
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

/* ---------------------------------------------------------------- bounded reader */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} rd_t;

static size_t rd_left(const rd_t *r)
{
    return (size_t)(r->end - r->p);
}

static int rd_u8(rd_t *r, uint8_t *v)
{
    if (r->p >= r->end)
        return EMAL;
    *v = *r->p++;
    return 0;
}

static int rd_u16(rd_t *r, uint16_t *v)
{
    if (rd_left(r) < 2)
        return EMAL;
    *v = (uint16_t)(r->p[0] << 8 | r->p[1]);
    r->p += 2;
    return 0;
}

static int rd_u32(rd_t *r, uint32_t *v)
{
    if (rd_left(r) < 4)
        return EMAL;
    *v = (uint32_t)r->p[0] << 24 | (uint32_t)r->p[1] << 16 | (uint32_t)r->p[2] << 8 | r->p[3];
    r->p += 4;
    return 0;
}

/* A Variable Byte Integer inside a packet: running out of packet is malformed, not EAGAIN. */
static int rd_varint(rd_t *r, uint32_t *v)
{
    size_t used;
    int rc = varint_decode(r->p, rd_left(r), v, &used);
    if (rc)
        return EMAL;
    r->p += used;
    return 0;
}

/* Binary Data: two-byte length then bytes (1.5.6). */
static int rd_bin(rd_t *r, mqtt_str_t *s)
{
    uint16_t n;
    if (rd_u16(r, &n))
        return EMAL;
    if (rd_left(r) < n)
        return EMAL;
    s->p = r->p;
    s->len = n;
    r->p += n;
    return 0;
}

/* UTF-8 Encoded String (1.5.4): ill-formed UTF-8 makes the packet malformed. */
static int rd_str(rd_t *r, mqtt_str_t *s)
{
    if (rd_bin(r, s))
        return EMAL;
    return mqtt_utf8_valid(s->p, s->len) ? 0 : EMAL;
}

/* ---------------------------------------------------------------- properties */

/* Property data types (2.2.2.2). */
enum { K_NONE, K_BYTE, K_U16, K_U32, K_VARINT, K_STR, K_BIN, K_PAIR };

/* Where a property may appear: a bit per packet type, bit 0 standing for the will. */
#define CTX_WILL 0
#define B(t) (1u << (t))
#define PUB_WILL (B(CTX_WILL) | B(MQTT_PUBLISH))
#define ACKS (B(MQTT_PUBACK) | B(MQTT_PUBREC) | B(MQTT_PUBREL) | B(MQTT_PUBCOMP))

/* Each property's type, where it may appear and, for single-valued ones, its field. */
#define F(field) offsetof(mqtt_props_t, field)
static const struct {
    uint8_t kind;
    uint16_t where;
    uint16_t field; /* offset in mqtt_props_t; 0 for the repeatable ones */
} prop_info[0x2B] = {
    [MQTT_PROP_PAYLOAD_FORMAT] = {K_BYTE, PUB_WILL, F(payload_format)},
    [MQTT_PROP_MESSAGE_EXPIRY] = {K_U32, PUB_WILL, F(message_expiry)},
    [MQTT_PROP_CONTENT_TYPE] = {K_STR, PUB_WILL, F(content_type)},
    [MQTT_PROP_RESPONSE_TOPIC] = {K_STR, PUB_WILL, F(response_topic)},
    [MQTT_PROP_CORRELATION_DATA] = {K_BIN, PUB_WILL, F(correlation_data)},
    [MQTT_PROP_SUB_ID] = {K_VARINT, B(MQTT_PUBLISH) | B(MQTT_SUBSCRIBE)},
    [MQTT_PROP_SESSION_EXPIRY] = {K_U32, B(MQTT_CONNECT) | B(MQTT_CONNACK) | B(MQTT_DISCONNECT),
                                  F(session_expiry)},
    [MQTT_PROP_ASSIGNED_CLIENT_ID] = {K_STR, B(MQTT_CONNACK), F(assigned_client_id)},
    [MQTT_PROP_SERVER_KEEPALIVE] = {K_U16, B(MQTT_CONNACK), F(server_keepalive)},
    [MQTT_PROP_AUTH_METHOD] = {K_STR, B(MQTT_CONNECT) | B(MQTT_CONNACK) | B(MQTT_AUTH),
                               F(auth_method)},
    [MQTT_PROP_AUTH_DATA] = {K_BIN, B(MQTT_CONNECT) | B(MQTT_CONNACK) | B(MQTT_AUTH), F(auth_data)},
    [MQTT_PROP_REQUEST_PROBLEM_INFO] = {K_BYTE, B(MQTT_CONNECT), F(request_problem_info)},
    [MQTT_PROP_WILL_DELAY] = {K_U32, B(CTX_WILL), F(will_delay)},
    [MQTT_PROP_REQUEST_RESPONSE_INFO] = {K_BYTE, B(MQTT_CONNECT), F(request_response_info)},
    [MQTT_PROP_RESPONSE_INFO] = {K_STR, B(MQTT_CONNACK), F(response_info)},
    [MQTT_PROP_SERVER_REFERENCE] = {K_STR, B(MQTT_CONNACK) | B(MQTT_DISCONNECT),
                                    F(server_reference)},
    [MQTT_PROP_REASON_STRING] = {K_STR,
                                 B(MQTT_CONNACK) | ACKS | B(MQTT_SUBACK) | B(MQTT_UNSUBACK) |
                                     B(MQTT_DISCONNECT) | B(MQTT_AUTH),
                                 F(reason_string)},
    [MQTT_PROP_RECEIVE_MAXIMUM] = {K_U16, B(MQTT_CONNECT) | B(MQTT_CONNACK), F(receive_maximum)},
    [MQTT_PROP_TOPIC_ALIAS_MAXIMUM] = {K_U16, B(MQTT_CONNECT) | B(MQTT_CONNACK),
                                       F(topic_alias_maximum)},
    [MQTT_PROP_TOPIC_ALIAS] = {K_U16, B(MQTT_PUBLISH), F(topic_alias)},
    [MQTT_PROP_MAXIMUM_QOS] = {K_BYTE, B(MQTT_CONNACK), F(maximum_qos)},
    [MQTT_PROP_RETAIN_AVAILABLE] = {K_BYTE, B(MQTT_CONNACK), F(retain_available)},
    [MQTT_PROP_USER] = {K_PAIR, 0xFFFF & ~(B(MQTT_PINGREQ) | B(MQTT_PINGRESP))},
    [MQTT_PROP_MAXIMUM_PACKET_SIZE] = {K_U32, B(MQTT_CONNECT) | B(MQTT_CONNACK),
                                       F(maximum_packet_size)},
    [MQTT_PROP_WILDCARD_SUB_AVAILABLE] = {K_BYTE, B(MQTT_CONNACK), F(wildcard_sub_available)},
    [MQTT_PROP_SUB_ID_AVAILABLE] = {K_BYTE, B(MQTT_CONNACK), F(sub_id_available)},
    [MQTT_PROP_SHARED_SUB_AVAILABLE] = {K_BYTE, B(MQTT_CONNACK), F(shared_sub_available)},
};

static int prop_kind(uint8_t id)
{
    return id < sizeof prop_info / sizeof prop_info[0] ? prop_info[id].kind : K_NONE;
}

/* The field of a single-valued property (the table's kind says its type). */
static void *prop_field(mqtt_props_t *pr, uint8_t id)
{
    return (char *)pr + prop_info[id].field;
}

#define prop_str(pr, id) ((mqtt_str_t *)prop_field((pr), (id)))
#define prop_byte(pr, id) ((uint8_t *)prop_field((pr), (id)))
#define prop_u16(pr, id) ((uint16_t *)prop_field((pr), (id)))
#define prop_u32(pr, id) ((uint32_t *)prop_field((pr), (id)))

/*
** Steps over one property entry (identifier and value) without storing it, setting *id; used
** to walk a property block for its repeatable entries. Bounded like every other read.
*/
static int rd_prop_raw(rd_t *r, uint8_t *id)
{
    mqtt_str_t s;
    uint16_t u16;
    uint32_t u32;
    uint8_t b;
    if (rd_u8(r, id))
        return EMAL;
    switch (prop_kind(*id)) {
    case K_BYTE:
        return rd_u8(r, &b);
    case K_U16:
        return rd_u16(r, &u16);
    case K_U32:
        return rd_u32(r, &u32);
    case K_VARINT:
        return rd_varint(r, &u32);
    case K_STR:
    case K_BIN:
        return rd_bin(r, &s);
    case K_PAIR:
        return rd_bin(r, &s) || rd_bin(r, &s) ? EMAL : 0;
    default:
        return EMAL;
    }
}

/*
** Reads the property block of a packet or will (2.2.2): its length, then properties.
** Unknown identifiers and truncated values are malformed; a property not allowed in this
** packet, a repeated property other than User Property (and Subscription Identifier in
** PUBLISH, 3.3.2.3.8), and an out-of-range value are protocol errors (2.2.2.2 and the
** property's own section). *pr must be zeroed by the caller (mqtt_decode does).
*/
static int rd_props(rd_t *r, int ctx, mqtt_props_t *pr)
{
    uint32_t len;
    if (rd_varint(r, &len))
        return EMAL;
    if (rd_left(r) < len)
        return EMAL;
    rd_t q = {r->p, r->p + len};
    pr->raw.p = r->p;
    pr->raw.len = len;
    r->p += len;
    while (q.p < q.end) {
        uint8_t id;
        if (rd_u8(&q, &id))
            return EMAL;
        int kind = prop_kind(id);
        if (kind == K_NONE)
            return EMAL;
        if (!(prop_info[id].where & B(ctx)))
            return EPROTO;
        uint64_t bit = MQTT_PROP_BIT(id);
        int repeatable = id == MQTT_PROP_USER || (id == MQTT_PROP_SUB_ID && ctx == MQTT_PUBLISH);
        if ((pr->present & bit) && !repeatable)
            return EPROTO;
        pr->present |= bit;
        mqtt_str_t s, v;
        uint32_t u32;
        uint16_t u16;
        uint8_t b;
        int rc = 0;
        switch (kind) {
        case K_BYTE:
            if (rd_u8(&q, &b))
                return EMAL;
            /* Every byte property is a 0/1 flag (3.1.2.11.7, 3.1.2.11.6, 3.2.2.3.4, 3.3.2.3.2..) */
            if (b > 1)
                return EPROTO;
            *prop_byte(pr, id) = b;
            break;
        case K_U16:
            if (rd_u16(&q, &u16))
                return EMAL;
            /* Receive Maximum 0 (3.1.2.11.3, 3.2.2.3.3) and Topic Alias 0 (3.3.2.3.4). */
            if (u16 == 0 && (id == MQTT_PROP_RECEIVE_MAXIMUM || id == MQTT_PROP_TOPIC_ALIAS))
                return EPROTO;
            *prop_u16(pr, id) = u16;
            break;
        case K_U32:
            if (rd_u32(&q, &u32))
                return EMAL;
            /* Maximum Packet Size 0 (3.1.2.11.4, 3.2.2.3.6). */
            if (u32 == 0 && id == MQTT_PROP_MAXIMUM_PACKET_SIZE)
                return EPROTO;
            *prop_u32(pr, id) = u32;
            break;
        case K_VARINT: /* only the Subscription Identifier: 1..268435455 (3.3.2.3.8) */
            if (rd_varint(&q, &u32))
                return EMAL;
            if (u32 == 0)
                return EPROTO;
            if (pr->sub_id_count++ == 0)
                pr->sub_id = u32;
            break;
        case K_STR:
            rc = rd_str(&q, &s);
            if (rc)
                return rc;
            /* A Response Topic is a Topic Name: no wildcards (3.3.2.3.5, 3.1.3.2.5). */
            if (id == MQTT_PROP_RESPONSE_TOPIC && !mqtt_topic_name_valid(s.p, s.len))
                return EPROTO;
            *prop_str(pr, id) = s;
            break;
        case K_BIN:
            if (rd_bin(&q, &s))
                return EMAL;
            *prop_str(pr, id) = s;
            break;
        case K_PAIR:
            rc = rd_str(&q, &s);
            if (!rc)
                rc = rd_str(&q, &v);
            if (rc)
                return rc;
            pr->user_count++;
            break;
        }
    }
    return 0;
}

/*
** Finds the next property with identifier want in the raw block from *pos; sets *value to
** a reader over its value and *pos past it. 0 at the end (or on a damaged block).
*/
static int next_prop(const mqtt_props_t *pr, size_t *pos, uint8_t want, rd_t *value)
{
    if (!pr->raw.p)
        return 0;
    rd_t r = {pr->raw.p + *pos, pr->raw.p + pr->raw.len};
    while (r.p < r.end) {
        const uint8_t *start = r.p;
        uint8_t id;
        if (rd_prop_raw(&r, &id))
            return 0;
        if (id == want) {
            *value = (rd_t){start + 1, r.p};
            *pos = (size_t)(r.p - pr->raw.p);
            return 1;
        }
    }
    *pos = pr->raw.len;
    return 0;
}

int mqtt_props_user_next(const mqtt_props_t *pr, size_t *pos, mqtt_str_t *key, mqtt_str_t *val)
{
    rd_t e;
    return next_prop(pr, pos, MQTT_PROP_USER, &e) && !rd_bin(&e, key) && !rd_bin(&e, val);
}

int mqtt_props_sub_id_next(const mqtt_props_t *pr, size_t *pos, uint32_t *id_out)
{
    rd_t e;
    return next_prop(pr, pos, MQTT_PROP_SUB_ID, &e) && !rd_varint(&e, id_out);
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
        return EMAL;
    return *id ? 0 : EPROTO;
}

static int decode_connect(rd_t *r, mqtt_packet_t *pk)
{
    mqtt_str_t name;
    uint8_t level, fl;
    int rc;
    if (rd_bin(r, &name) || rd_u8(r, &level) || rd_u8(r, &fl))
        return EMAL;
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
        return EPROTO;
    }
    /* Connect Flags (3.1.2.3): reserved bit 0 must be 0; without a will, will QoS and will
    ** retain must be 0 (3.1.2.5, 3.1.2.6); will QoS 3 is malformed (3.1.2.6). */
    if (fl & 0x01)
        return EMAL;
    pk->connect.clean_start = (fl >> 1) & 1;
    pk->connect.will = (fl >> 2) & 1;
    pk->connect.will_qos = (fl >> 3) & 3;
    pk->connect.will_retain = (fl >> 5) & 1;
    pk->connect.has_password = (fl >> 6) & 1;
    pk->connect.has_username = (fl >> 7) & 1;
    if (pk->connect.will_qos == 3)
        return EMAL;
    if (!pk->connect.will && (pk->connect.will_qos || pk->connect.will_retain))
        return EMAL;
    /* Before MQTT 5 a password requires a user name (3.1.1 3.1.2.9, MQTT-3.1.2-22). */
    if (level < MQTT_V5 && pk->connect.has_password && !pk->connect.has_username)
        return EMAL;
    if (rd_u16(r, &pk->connect.keepalive))
        return EMAL;
    if (level == MQTT_V5 && (rc = rd_props(r, MQTT_CONNECT, &pk->props)))
        return rc;
    /* Authentication Data needs an Authentication Method (3.1.2.11.10). */
    uint64_t auth = pk->props.present &
                    (MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD) | MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA));
    if (auth == MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA))
        return EPROTO;
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
        if (level == MQTT_V5 && (rc = rd_props(r, CTX_WILL, &pk->connect.will_props)))
            return rc;
        if ((rc = rd_str(r, &pk->connect.will_topic)))
            return rc;
        /* The will topic becomes a PUBLISH Topic Name (3.1.3.3, 3.3.2.1). */
        if (!mqtt_topic_name_valid(pk->connect.will_topic.p, pk->connect.will_topic.len))
            return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
        if (rd_bin(r, &pk->connect.will_payload))
            return EMAL;
        /* A will payload declared UTF-8 must be UTF-8 (3.1.3.2.3). */
        if (pk->connect.will_props.payload_format == 1 &&
            !mqtt_utf8_valid(pk->connect.will_payload.p, pk->connect.will_payload.len))
            return MQTT_ERR(MQTT_RC_PAYLOAD_FORMAT_INVALID);
    }
    if (pk->connect.has_username && (rc = rd_str(r, &pk->connect.username)))
        return rc;
    if (pk->connect.has_password && rd_bin(r, &pk->connect.password))
        return EMAL;
    return 0;
}

static int decode_connack(rd_t *r, mqtt_packet_t *pk)
{
    uint8_t fl;
    if (rd_u8(r, &fl) || rd_u8(r, &pk->reason))
        return EMAL;
    if (pk->version == MQTT_V31) {
        /* MQTT 3.1 leaves the first byte unused and has return codes 0..5. */
        return pk->reason <= 5 ? 0 : EPROTO;
    }
    /* Connect Acknowledge Flags: bits 7..1 reserved (3.2.2.1). */
    if (fl & 0xFE)
        return EMAL;
    pk->connack.session_present = fl & 1;
    /* A refusal never carries Session Present (3.2.2.1.1; 3.1.1 MQTT-3.2.2-4). */
    if (pk->reason != 0 && pk->connack.session_present)
        return EPROTO;
    if (pk->version == MQTT_V311)
        return pk->reason <= 5 ? 0 : EPROTO;
    if (!reason_ok(MQTT_CONNACK, pk->reason))
        return EPROTO;
    return rd_props(r, MQTT_CONNACK, &pk->props);
}

static int decode_publish(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    pk->publish.dup = (pk->flags >> 3) & 1;
    pk->publish.qos = (pk->flags >> 1) & 3;
    pk->publish.retain = pk->flags & 1;
    /* QoS 3 is malformed (3.3.1.2); DUP must be 0 with QoS 0 (3.3.1.1). */
    if (pk->publish.qos == 3 || (pk->publish.dup && pk->publish.qos == 0))
        return EMAL;
    if ((rc = rd_str(r, &pk->publish.topic)))
        return rc;
    if (pk->publish.qos && (rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->version == MQTT_V5 && (rc = rd_props(r, MQTT_PUBLISH, &pk->props)))
        return rc;
    mqtt_str_t t = pk->publish.topic;
    if (t.len == 0) {
        /* An empty Topic Name is only allowed with a Topic Alias (3.3.2.1, 3.3.4). */
        if (pk->version < MQTT_V5)
            return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
        if (!(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)))
            return EPROTO;
    } else if (!mqtt_topic_name_valid(t.p, t.len)) {
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
        return EMAL;
    if (!reason_ok(pk->type, pk->reason))
        return EPROTO;
    if (rd_left(r) == 0)
        return 0;
    return rd_props(r, pk->type, &pk->props);
}

static int decode_subscribe(rd_t *r, mqtt_packet_t *pk)
{
    int rc;
    if ((rc = rd_packet_id(r, &pk->packet_id)))
        return rc;
    if (pk->version == MQTT_V5 && (rc = rd_props(r, pk->type, &pk->props)))
        return rc;
    pk->sub.raw.p = r->p;
    pk->sub.raw.len = (uint32_t)rd_left(r);
    /* At least one topic filter (3.8.3, 3.10.3). */
    if (rd_left(r) == 0)
        return EPROTO;
    uint32_t count = 0;
    while (rd_left(r)) {
        mqtt_str_t f;
        if ((rc = rd_str(r, &f)))
            return rc;
        if (!mqtt_topic_filter_valid(f.p, f.len))
            return MQTT_ERR(MQTT_RC_TOPIC_FILTER_INVALID);
        if (pk->type == MQTT_SUBSCRIBE) {
            uint8_t o;
            if (rd_u8(r, &o))
                return EMAL;
            /* Subscription Options (3.8.3.1): reserved bits (v3: bits 7..2) malformed, QoS 3
            ** malformed, Retain Handling 3 and No Local on a shared subscription protocol
            ** errors (3.8.3.1, MQTT-3.8.3-4). */
            if (o & (pk->version == MQTT_V5 ? 0xC0 : 0xFC))
                return EMAL;
            if (MQTT_SUB_QOS(o) == 3)
                return EMAL;
            if (MQTT_SUB_RETAIN_HANDLING(o) == 3)
                return EPROTO;
            if ((o & MQTT_SUB_NO_LOCAL) && is_shared(f))
                return EPROTO;
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
    if (pk->version == MQTT_V5 && (rc = rd_props(r, pk->type, &pk->props)))
        return rc;
    pk->codes.p = r->p;
    pk->codes.len = (uint32_t)rd_left(r);
    if (pk->codes.len == 0)
        return EPROTO;
    for (uint32_t i = 0; i < pk->codes.len; i++) {
        uint8_t c = pk->codes.p[i];
        /* 3.1.1 return codes are 0, 1, 2 and 0x80 (3.1.1 3.9.3). */
        int ok = pk->version == MQTT_V5 ? reason_ok(pk->type, c) : (c <= 2 || c == 0x80);
        if (!ok)
            return EPROTO;
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
            return EMAL;
        if (!reason_ok(pk->type, pk->reason))
            return EPROTO;
        if (rd_left(r) > 0)
            rc = rd_props(r, pk->type, &pk->props);
    }
    /* AUTH must name its Authentication Method (3.15.2.2.2), so in practice the short form
    ** of 3.15.2.1 is refused, as Mosquitto does. */
    if (!rc && pk->type == MQTT_AUTH && !(pk->props.present & MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD)))
        return EPROTO;
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
        return EMAL;
    bool sub = f.type == MQTT_SUBSCRIBE || f.type == MQTT_UNSUBSCRIBE;
    uint8_t want = f.type == MQTT_PUBREL || sub ? 2 : 0;
    /* MQTT 3.1 clients (Tsung 1.7 among them) send (UN)SUBSCRIBE with flags 0000: the 3.1
    ** text gives those bits as QoS 1 without requiring them, and Mosquitto accepts both. */
    bool v31_sub_flags = sub && version == MQTT_V31 && pk->flags == 0;
    if (f.type != MQTT_PUBLISH && pk->flags != want && !v31_sub_flags)
        return EMAL;
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
    return r.p == r.end ? 0 : EMAL;
}

/* ---------------------------------------------------------------- encoding */

/* A writer that counts when p is NULL; err latches the first encoding error. */
typedef struct {
    uint8_t *p;
    size_t n;
    int err;
} wr_t;

static void w_u8(wr_t *w, uint8_t v)
{
    if (w->p)
        w->p[w->n] = v;
    w->n++;
}

static void w_u16(wr_t *w, uint16_t v)
{
    w_u8(w, (uint8_t)(v >> 8));
    w_u8(w, (uint8_t)v);
}

static void w_u32(wr_t *w, uint32_t v)
{
    w_u16(w, (uint16_t)(v >> 16));
    w_u16(w, (uint16_t)v);
}

static void w_varint(wr_t *w, uint32_t v)
{
    if (v > MQTT_MAX_REMAINING) {
        w->err = RT_EINVAL;
        return;
    }
    do {
        uint8_t b = v & 0x7F;
        v >>= 7;
        w_u8(w, v ? b | 0x80 : b);
    } while (v);
}

static void w_bytes(wr_t *w, const uint8_t *p, size_t n)
{
    if (w->p && n)
        memcpy(w->p + w->n, p, n);
    w->n += n;
}

/* Binary Data or UTF-8 String: at most 65535 bytes (1.5.4, 1.5.6). */
static void w_bin(wr_t *w, mqtt_str_t s)
{
    if (s.len > 0xFFFF) {
        w->err = RT_EINVAL;
        return;
    }
    w_u16(w, (uint16_t)s.len);
    w_bytes(w, s.p, s.len);
}

/*
** The property entries (without the block length) for context ctx, in identifier order.
** With strip set, the Reason String and User Properties are left out.
*/
static void w_props_body(wr_t *w, const mqtt_props_t *pr, int ctx, int strip)
{
    mqtt_props_t *m = (mqtt_props_t *)pr; /* the field lookups take non-const; only read */
    uint64_t scalars =
        pr->present & ~(MQTT_PROP_BIT(MQTT_PROP_USER) | MQTT_PROP_BIT(MQTT_PROP_SUB_ID));
    /* Only the properties present, lowest identifier first (most packets carry none). */
    for (uint64_t bits = scalars; bits; bits &= bits - 1) {
        uint8_t id = (uint8_t)__builtin_ctzll(bits);
        if (prop_kind(id) == K_NONE || !(prop_info[id].where & B(ctx))) {
            w->err = RT_EINVAL;
            return;
        }
        if (strip && id == MQTT_PROP_REASON_STRING)
            continue;
        w_u8(w, id);
        switch (prop_kind(id)) {
        case K_BYTE:
            w_u8(w, *prop_byte(m, id));
            break;
        case K_U16:
            w_u16(w, *prop_u16(m, id));
            break;
        case K_U32:
            w_u32(w, *prop_u32(m, id));
            break;
        case K_STR:
        case K_BIN:
            w_bin(w, *prop_str(m, id));
            break;
        }
    }
    if (scalars & (~(MQTT_PROP_BIT(0x2B) - 1) | 1)) /* a bit for no identifier */
        w->err = RT_EINVAL;
    int sub_ok = ctx == MQTT_PUBLISH || ctx == MQTT_SUBSCRIBE;
    /* Repeatables from a decoded block first, in their original order. */
    if (pr->raw.p) {
        rd_t r = {pr->raw.p, pr->raw.p + pr->raw.len};
        while (r.p < r.end) {
            const uint8_t *start = r.p;
            uint8_t id;
            if (rd_prop_raw(&r, &id)) {
                w->err = RT_EINVAL;
                return;
            }
            if ((id == MQTT_PROP_SUB_ID && sub_ok) || (id == MQTT_PROP_USER && !strip))
                w_bytes(w, start, (size_t)(r.p - start));
        }
    }
    if (pr->n_sub_ids && !sub_ok) {
        w->err = RT_EINVAL;
        return;
    }
    for (uint16_t i = 0; i < pr->n_sub_ids; i++) {
        if (pr->sub_ids[i] == 0) {
            w->err = RT_EINVAL;
            return;
        }
        w_u8(w, MQTT_PROP_SUB_ID);
        w_varint(w, pr->sub_ids[i]);
    }
    for (uint16_t i = 0; i < pr->n_users && !strip; i++) {
        w_u8(w, MQTT_PROP_USER);
        w_bin(w, pr->users[i].key);
        w_bin(w, pr->users[i].val);
    }
}

static size_t props_body_len(const mqtt_props_t *pr, int ctx, int strip, int *err)
{
    wr_t c = {NULL, 0, 0};
    w_props_body(&c, pr, ctx, strip);
    if (c.err)
        *err = c.err;
    return c.n;
}

/* A property block: Variable Byte Integer length, then the entries (2.2.2.1). */
static void w_props(wr_t *w, const mqtt_props_t *pr, int ctx, int strip)
{
    size_t n = props_body_len(pr, ctx, strip, &w->err);
    if (n > MQTT_MAX_REMAINING) {
        w->err = RT_EINVAL;
        return;
    }
    w_varint(w, (uint32_t)n);
    w_props_body(w, pr, ctx, strip);
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
    size_t n = props_body_len(&pk->props, pk->type, strip, &err);
    if (err) {
        w->err = err;
        return;
    }
    if (pk->reason == 0 && n == 0)
        return;
    w_u8(w, pk->reason);
    if (n)
        w_props(w, &pk->props, pk->type, strip);
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
            w_props(w, &pk->props, MQTT_CONNECT, 0);
        w_bin(w, pk->connect.client_id);
        if (pk->connect.will) {
            if (v5)
                w_props(w, &pk->connect.will_props, CTX_WILL, 0);
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
            w_props(w, &pk->props, MQTT_CONNACK, strip);
        break;
    case MQTT_PUBLISH:
        if (pk->publish.qos > 2 || (pk->publish.qos && !pk->packet_id))
            w->err = RT_EINVAL;
        w_bin(w, pk->publish.topic);
        if (pk->publish.qos)
            w_u16(w, pk->packet_id);
        if (v5)
            w_props(w, &pk->props, MQTT_PUBLISH, 0);
        w_bytes(w, pk->publish.payload.p, pk->publish.payload.len);
        break;
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
            w_props(w, &pk->props, pk->type, 0);
        w_sublist(w, pk);
        break;
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        w_u16(w, pk->packet_id);
        if (pk->type == MQTT_UNSUBACK && !v5)
            break;
        if (v5)
            w_props(w, &pk->props, pk->type, strip);
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

int mqtt_encode(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, uint32_t max_size, size_t *len,
                int *stripped)
{
    if (stripped)
        *stripped = 0;
    if (pk->version < MQTT_V31 || pk->version > MQTT_V5)
        return RT_EINVAL;
    if (pk->type < MQTT_CONNECT || pk->type > MQTT_AUTH ||
        (pk->type == MQTT_AUTH && pk->version < MQTT_V5))
        return RT_EINVAL;
    for (int strip = 0; strip < 2; strip++) {
        wr_t c = {NULL, 0, 0};
        w_body(&c, pk, strip);
        if (c.err)
            return c.err;
        if (c.n > MQTT_MAX_REMAINING)
            return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
        size_t total = 1 + varint_len((uint32_t)c.n) + c.n;
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
        wr_t w = {buf, 0, 0};
        w_u8(&w, (uint8_t)(pk->type << 4 | fl));
        w_varint(&w, (uint32_t)c.n);
        w_body(&w, pk, strip);
        RT_ASSERT(w.n == total && !w.err);
        return 0;
    }
    return MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE);
}

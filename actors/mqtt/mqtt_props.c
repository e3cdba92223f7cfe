/*
** MQTT 5 properties (2.2.2): which exist, their types, where each may appear, and reading,
** walking and writing a property block. One table drives all of it.
*/
#include "mqtt_impl.h"

/* Property data types (2.2.2.2). */
enum { K_NONE, K_BYTE, K_U16, K_U32, K_VARINT, K_STR, K_BIN, K_PAIR };

/* Where a property may appear: a bit per packet type, bit 0 standing for the will. */
#define B(t) (1u << (t))
#define PUB_WILL (B(MQTT_CTX_WILL) | B(MQTT_PUBLISH))
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
    [MQTT_PROP_WILL_DELAY] = {K_U32, B(MQTT_CTX_WILL), F(will_delay)},
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
        return MQTT_EMAL;
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
        return rd_bin(r, &s) || rd_bin(r, &s) ? MQTT_EMAL : 0;
    default:
        return MQTT_EMAL;
    }
}

/*
** Unknown identifiers and truncated values are malformed; a property not allowed in this
** packet, a repeated property other than User Property (and Subscription Identifier in
** PUBLISH, 3.3.2.3.8), and an out-of-range value are protocol errors (2.2.2.2 and the
** property's own section).
*/
int rt__mqtt_props_read(rd_t *r, int ctx, mqtt_props_t *pr)
{
    RT_ASSERT(pr->present == 0 && pr->user_count == 0 && pr->sub_id_count == 0);
    uint32_t len;
    if (rd_varint(r, &len))
        return MQTT_EMAL;
    if (rd_left(r) < len)
        return MQTT_EMAL;
    rd_t q = {r->p, r->p + len};
    pr->raw.p = r->p;
    pr->raw.len = len;
    r->p += len;
    while (q.p < q.end) {
        uint8_t id;
        if (rd_u8(&q, &id))
            return MQTT_EMAL;
        int kind = prop_kind(id);
        if (kind == K_NONE)
            return MQTT_EMAL;
        if (!(prop_info[id].where & B(ctx)))
            return MQTT_EPROTO;
        uint64_t bit = MQTT_PROP_BIT(id);
        int repeatable = id == MQTT_PROP_USER || (id == MQTT_PROP_SUB_ID && ctx == MQTT_PUBLISH);
        if ((pr->present & bit) && !repeatable)
            return MQTT_EPROTO;
        pr->present |= bit;
        mqtt_str_t s, v;
        uint32_t u32;
        uint16_t u16;
        uint8_t b;
        int rc = 0;
        switch (kind) {
        case K_BYTE:
            if (rd_u8(&q, &b))
                return MQTT_EMAL;
            /* Every byte property is a 0/1 flag (3.1.2.11.7, 3.1.2.11.6, 3.2.2.3.4, 3.3.2.3.2..) */
            if (b > 1)
                return MQTT_EPROTO;
            *prop_byte(pr, id) = b;
            break;
        case K_U16:
            if (rd_u16(&q, &u16))
                return MQTT_EMAL;
            /* Receive Maximum 0 (3.1.2.11.3, 3.2.2.3.3) and Topic Alias 0 (3.3.2.3.4). */
            if (u16 == 0 && (id == MQTT_PROP_RECEIVE_MAXIMUM || id == MQTT_PROP_TOPIC_ALIAS))
                return MQTT_EPROTO;
            *prop_u16(pr, id) = u16;
            break;
        case K_U32:
            if (rd_u32(&q, &u32))
                return MQTT_EMAL;
            /* Maximum Packet Size 0 (3.1.2.11.4, 3.2.2.3.6). */
            if (u32 == 0 && id == MQTT_PROP_MAXIMUM_PACKET_SIZE)
                return MQTT_EPROTO;
            *prop_u32(pr, id) = u32;
            break;
        case K_VARINT: /* only the Subscription Identifier: 1..268435455 (3.3.2.3.8) */
            if (rd_varint(&q, &u32))
                return MQTT_EMAL;
            if (u32 == 0)
                return MQTT_EPROTO;
            if (pr->sub_id_count++ == 0)
                pr->sub_id = u32;
            break;
        case K_STR:
            rc = rd_str(&q, &s);
            if (rc)
                return rc;
            /* A Response Topic is a Topic Name: no wildcards (3.3.2.3.5, 3.1.3.2.5). */
            if (id == MQTT_PROP_RESPONSE_TOPIC && !rt_topic_valid_name((const char *)s.p, s.len))
                return MQTT_EPROTO;
            *prop_str(pr, id) = s;
            break;
        case K_BIN:
            if (rd_bin(&q, &s))
                return MQTT_EMAL;
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

/*
** The property entries (without the block length) for context ctx, in identifier order.
** With strip set, the Reason String and User Properties are left out.
*/
static void write_props_body(wr_t *w, const mqtt_props_t *pr, int ctx, int strip)
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

size_t rt__mqtt_props_len(const mqtt_props_t *pr, int ctx, int strip, int *err)
{
    wr_t c = {0};
    write_props_body(&c, pr, ctx, strip);
    if (c.err)
        *err = c.err;
    return c.n;
}

/* 2.2.2.1. Returns where the properties start, after their length. */
size_t rt__mqtt_props_write(wr_t *w, const mqtt_props_t *pr, int ctx, int strip)
{
    size_t n = rt__mqtt_props_len(pr, ctx, strip, &w->err);
    if (n > MQTT_MAX_REMAINING) {
        w->err = RT_EINVAL;
        return w->n;
    }
    w_varint(w, (uint32_t)n);
    size_t at = w->n;
    write_props_body(w, pr, ctx, strip);
    return at;
}

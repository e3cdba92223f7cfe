/*
** Inside the MQTT codec, shared by its three files: decoding (mqtt_decode.c), encoding
** (mqtt_encode.c) and MQTT 5 property blocks (mqtt_props.c). It holds the bounded reader every
** decoding step reads through, the counting writer every encoding step writes through, and
** the property block's entry points. Only mqtt_*.c include this.
*/
#ifndef RT_MQTT_IMPL_H
#define RT_MQTT_IMPL_H

#include <string.h>

#include "mqtt_codec.h"

#define MQTT_EMAL MQTT_ERR(MQTT_RC_MALFORMED)
#define MQTT_EPROTO MQTT_ERR(MQTT_RC_PROTOCOL_ERROR)

/* The context of a property block is its packet type, or this for a will's properties. */
#define MQTT_CTX_WILL 0

/* ---- Variable byte integers ---- */

/*
** Decodes a Variable Byte Integer (1.5.5) from p[0..n): at most 4 bytes, minimally encoded
** (a last byte of 0 after the first is a longer form of a shorter number). Returns 0 and sets
** *v and *used, RT_EAGAIN if p ends inside it, MQTT_EMAL if malformed.
*/
static inline int varint_decode(const uint8_t *p, size_t n, uint32_t *v, size_t *used)
{
    uint32_t val = 0;
    for (size_t i = 0; i < 4; i++) {
        if (i >= n)
            return RT_EAGAIN;
        uint8_t b = p[i];
        val |= (uint32_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            if (i > 0 && b == 0)
                return MQTT_EMAL;
            *v = val;
            *used = i + 1;
            return 0;
        }
    }
    return MQTT_EMAL;
}

/* ---- The bounded reader ----
** Every read checks the remaining length first, so no input, however hostile, makes the
** decoder read outside the packet. Running out of packet is malformed.
*/

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} rd_t;

static inline size_t rd_left(const rd_t *r)
{
    return (size_t)(r->end - r->p);
}

static inline int rd_u8(rd_t *r, uint8_t *v)
{
    if (r->p >= r->end)
        return MQTT_EMAL;
    *v = *r->p++;
    return 0;
}

static inline int rd_u16(rd_t *r, uint16_t *v)
{
    if (rd_left(r) < 2)
        return MQTT_EMAL;
    *v = (uint16_t)(r->p[0] << 8 | r->p[1]);
    r->p += 2;
    return 0;
}

static inline int rd_u32(rd_t *r, uint32_t *v)
{
    if (rd_left(r) < 4)
        return MQTT_EMAL;
    *v = (uint32_t)r->p[0] << 24 | (uint32_t)r->p[1] << 16 | (uint32_t)r->p[2] << 8 | r->p[3];
    r->p += 4;
    return 0;
}

/* A Variable Byte Integer inside a packet: running out of packet is malformed, not EAGAIN. */
static inline int rd_varint(rd_t *r, uint32_t *v)
{
    size_t used;
    int rc = varint_decode(r->p, rd_left(r), v, &used);
    if (rc)
        return MQTT_EMAL;
    r->p += used;
    return 0;
}

/* Binary Data: two-byte length then bytes (1.5.6). */
static inline int rd_bin(rd_t *r, mqtt_str_t *s)
{
    uint16_t n;
    if (rd_u16(r, &n))
        return MQTT_EMAL;
    if (rd_left(r) < n)
        return MQTT_EMAL;
    s->p = r->p;
    s->len = n;
    r->p += n;
    return 0;
}

/* UTF-8 Encoded String (1.5.4): ill-formed UTF-8 makes the packet malformed. */
static inline int rd_str(rd_t *r, mqtt_str_t *s)
{
    if (rd_bin(r, s))
        return MQTT_EMAL;
    return mqtt_utf8_valid(s->p, s->len) ? 0 : MQTT_EMAL;
}

/* ---- The counting writer ----
** Each body is written twice through the same writer: once counting (p NULL) to learn the
** Remaining Length, once writing into a buffer the count sized. err latches the first
** encoding error.
*/
typedef struct {
    uint8_t *p;
    size_t n;
    size_t cap; /* bytes at p; unused while counting */
    int err;
    mqtt_publish_at_t *at; /* writing a PUBLISH: where its parts went */
} wr_t;

static inline void w_u8(wr_t *w, uint8_t v)
{
    if (w->p) {
        RT_ASSERT(w->n < w->cap);
        w->p[w->n] = v;
    }
    w->n++;
}

static inline void w_u16(wr_t *w, uint16_t v)
{
    w_u8(w, (uint8_t)(v >> 8));
    w_u8(w, (uint8_t)v);
}

static inline void w_u32(wr_t *w, uint32_t v)
{
    w_u16(w, (uint16_t)(v >> 16));
    w_u16(w, (uint16_t)v);
}

static inline void w_varint(wr_t *w, uint32_t v)
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

static inline void w_bytes(wr_t *w, const uint8_t *p, size_t n)
{
    if (w->p && n) {
        RT_ASSERT(n <= w->cap - w->n);
        memcpy(w->p + w->n, p, n);
    }
    w->n += n;
}

/* Binary Data or UTF-8 String: at most 65535 bytes (1.5.4, 1.5.6). */
static inline void w_bin(wr_t *w, mqtt_str_t s)
{
    if (s.len > 0xFFFF) {
        w->err = RT_EINVAL;
        return;
    }
    w_u16(w, (uint16_t)s.len);
    w_bytes(w, s.p, s.len);
}

/* ---- Property blocks (mqtt_props.c) ---- */

/*
** Reads the property block of a packet or will (2.2.2) for context ctx (a packet type, or
** MQTT_CTX_WILL): its length, then properties, validated as mqtt_decode promises. *pr must be
** zeroed. 0, MQTT_EMAL or MQTT_EPROTO.
*/
int rt__mqtt_props_read(rd_t *r, int ctx, mqtt_props_t *pr);
/*
** Bytes of pr's property entries for ctx (without the block length); with strip set, the
** Reason String and User Properties are left out. An unencodable property sets *err.
*/
size_t rt__mqtt_props_len(const mqtt_props_t *pr, int ctx, int strip, int *err);
/* Writes pr's property block for ctx: Variable Byte Integer length, then the entries. */
size_t rt__mqtt_props_write(wr_t *w, const mqtt_props_t *pr, int ctx, int strip);

#endif

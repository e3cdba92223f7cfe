/*
** The MQTT decoder on a byte stream, as a connection reads it (actors/conn/conn.c parse_packets()).
**
** Input: byte 0 picks the protocol level the stream starts in (3, 4 or 5; a CONNECT that
** decodes switches to its own level, as a connection does), byte 1 seeds the chunk sizes,
** the rest is the stream. Each packet is framed and decoded; a decoded one is re-encoded, and
** its encoding must decode to the same packet. Then the stream is fed again one byte at a
** time (a split at every boundary) and in chunks of seeded sizes, through a buffer that keeps
** the partial packet: both must give exactly the results the whole stream gave.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mqtt_codec.h"

#define MAX_RESULTS 4096
#define ENC_CAP 65536

/* What one packet decoded to: its return code, size, and a digest of its re-encoding. */
typedef struct {
    int rc;
    uint32_t size;
    uint64_t digest;
} result_t;

typedef struct {
    result_t r[MAX_RESULTS];
    size_t n;
    uint8_t version;
    int done; /* an error or a full table: the connection would have closed */
} stream_t;

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Touches what a connection walks in a decoded packet (each read must stay in bounds). */
static uint64_t walk(const mqtt_packet_t *pk)
{
    uint64_t h = 0;
    size_t pos = 0;
    mqtt_str_t k, v;
    while (mqtt_props_user_next(&pk->props, &pos, &k, &v))
        h += fnv(k.p, k.len) ^ fnv(v.p, v.len);
    uint32_t id;
    pos = 0;
    while (mqtt_props_sub_id_next(&pk->props, &pos, &id))
        h += id;
    if (pk->type == MQTT_SUBSCRIBE || pk->type == MQTT_UNSUBSCRIBE) {
        mqtt_sub_t s;
        uint32_t count = 0;
        pos = 0;
        while (mqtt_sub_next(pk, &pos, &s)) {
            h += fnv(s.filter.p, s.filter.len) + s.options;
            count++;
        }
        if (count != pk->sub.count)
            abort();
    }
    return h;
}

static uint8_t enc[ENC_CAP], enc2[ENC_CAP];

/* Encodes pk; the result's digest, after checking the encoding decodes back to itself. */
static uint64_t reencode(const mqtt_packet_t *pk)
{
    size_t len = 0, len2 = 0;
    int rc = mqtt_encode(pk, NULL, 0, 0, &len, NULL);
    if (rc != 0 || len > ENC_CAP)
        return (uint64_t)(uint32_t)rc;
    size_t got = 0;
    if (mqtt_encode(pk, enc, sizeof enc, 0, &got, NULL) != 0 || got != len)
        abort();
    mqtt_packet_t back;
    if (mqtt_decode(enc, len, pk->version, &back) != 0 || back.type != pk->type || back.size != len)
        abort();
    if (mqtt_encode(&back, enc2, sizeof enc2, 0, &len2, NULL) != 0 || len2 != len ||
        memcmp(enc, enc2, len) != 0)
        abort();
    return fnv(enc, len);
}

/* Parses every complete packet in buf[0..len); returns the bytes consumed. */
static size_t parse(stream_t *st, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (!st->done && off < len) {
        mqtt_frame_t f;
        int rc = mqtt_frame(buf + off, len - off, 0, &f);
        if (rc == RT_EAGAIN)
            break;
        result_t *r = &st->r[st->n++];
        memset(r, 0, sizeof *r);
        mqtt_packet_t pk;
        if (rc == 0)
            rc = mqtt_decode(buf + off, f.size, st->version, &pk);
        r->rc = rc;
        if (rc != 0 || st->n == MAX_RESULTS) {
            st->done = 1;
            break;
        }
        if (pk.size != f.size)
            abort();
        r->size = pk.size;
        r->digest = walk(&pk) ^ reencode(&pk);
        if (pk.type == MQTT_CONNECT)
            st->version = pk.version;
        off += f.size;
    }
    return off;
}

/* Feeds data in chunks (sizes from next_chunk) through a partial-packet buffer. */
static void feed(stream_t *st, const uint8_t *data, size_t size, uint32_t seed, int bytewise)
{
    uint8_t *partial = malloc(size ? size : 1);
    size_t plen = 0, pos = 0;
    while (pos < size && !st->done) {
        size_t chunk = 1;
        if (!bytewise) {
            seed = seed * 1103515245u + 12345u;
            chunk = 1 + (seed >> 16) % 64;
        }
        if (chunk > size - pos)
            chunk = size - pos;
        memcpy(partial + plen, data + pos, chunk);
        plen += chunk;
        pos += chunk;
        size_t used = parse(st, partial, plen);
        memmove(partial, partial + used, plen - used);
        plen -= used;
    }
    free(partial);
}

static void same(const stream_t *a, const stream_t *b)
{
    if (a->n != b->n || a->version != b->version)
        abort();
    for (size_t i = 0; i < a->n; i++)
        if (a->r[i].rc != b->r[i].rc || a->r[i].size != b->r[i].size ||
            a->r[i].digest != b->r[i].digest)
            abort();
}

static stream_t whole, split;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t version = MQTT_V31 + data[0] % 3;
    uint32_t seed = data[1];
    data += 2;
    size -= 2;

    memset(&whole, 0, sizeof whole);
    whole.version = version;
    parse(&whole, data, size);

    for (int bytewise = 1; bytewise >= 0; bytewise--) {
        memset(&split, 0, sizeof split);
        split.version = version;
        feed(&split, data, size, seed, bytewise);
        same(&whole, &split);
    }
    return 0;
}

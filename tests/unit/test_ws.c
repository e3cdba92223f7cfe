/*
** The WebSocket codec: frames split at every byte and at random, 7-, 16- and 64-bit
** lengths, masks, fragmentation, control frames between fragments, every protocol error
** and its close code; the upgrade request (RFC 6455's sample key, version, path, key and
** subprotocol checks, bounds, X-Forwarded-For) and the answers to it.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "ws.h"

#define FIN 0x80
#define NO_FIN 0x00
#define LEN_MINIMAL 0
#define LEN_16 16
#define LEN_64 64

static const uint8_t mask_a[4] = {0x37, 0xfa, 0x21, 0x3d};

/* A client frame: masked with mask_a, its length in the given encoding. Returns its size. */
static size_t frame(uint8_t *out, int fin_opcode, const void *payload, size_t n, int len_form)
{
    size_t pos = 0;
    out[pos++] = (uint8_t)fin_opcode;
    if (len_form == LEN_MINIMAL && n <= 125) {
        out[pos++] = (uint8_t)(0x80 | n);
    } else if (len_form != LEN_64 && n <= 0xFFFF) {
        out[pos++] = 0x80 | 126;
        out[pos++] = (uint8_t)(n >> 8);
        out[pos++] = (uint8_t)n;
    } else {
        out[pos++] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            out[pos++] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
    }
    memcpy(out + pos, mask_a, 4);
    pos += 4;
    const uint8_t *p = payload;
    for (size_t i = 0; i < n; i++)
        out[pos + i] = p[i] ^ mask_a[i & 3];
    return pos + n;
}

/* What a connection makes of a stream: the data bytes in order, and the control events. */
typedef struct {
    uint8_t *data;
    size_t data_len;
    char controls[64]; /* one letter per control event: i(ping), o(pong), c(close) */
    uint8_t control_payload[8][RT_WS_CONTROL_MAX];
    size_t control_len[8];
    uint16_t close_code;
    int error;
    uint16_t error_code;
    size_t ends[16]; /* data_len where each message ended (an event with last set) */
    size_t nends;
} result_t;

static void result_free(result_t *r)
{
    free(r->data);
}

/*
** Feeds stream to the decoder in chunks of the sizes chunk() gives, as a connection does: a
** receive buffer keeps what a call did not consume and the next read is appended to it.
*/
static result_t run_stream_as(const uint8_t *stream, size_t n, uint32_t max_message,
                              size_t (*chunk)(size_t left), bool text)
{
    result_t r = {.data = malloc(n + 1)};
    uint8_t *pending = malloc(n + 1);
    size_t have = 0, off = 0;
    rt_ws_in_t st = {.text = text};
    while (off < n) {
        size_t c = chunk(n - off);
        memcpy(pending + have, stream + off, c);
        have += c;
        off += c;
        for (;;) {
            size_t used = 99999;
            rt_ws_event_t ev;
            uint16_t code = 0;
            int rc = rt_ws_decode(&st, pending, have, max_message, &used, &ev, &code);
            CHECK(used <= have);
            if (rc < 0 && rc != RT_EAGAIN) {
                r.error = rc;
                r.error_code = code;
                free(pending);
                return r;
            }
            if (rc == RT_EAGAIN) {
                /* What stays is a part of one header or control frame, never more. */
                CHECK(have - used < RT_WS_HEADER_MAX + RT_WS_CONTROL_MAX || st.closed);
                memmove(pending, pending + used, have - used);
                have -= used;
                break;
            }
            CHECK(ev.data >= pending && ev.data + ev.len <= pending + used);
            if (ev.kind == RT_WS_EV_DATA) {
                CHECK(ev.len > 0 || ev.last);
                memcpy(r.data + r.data_len, ev.data, ev.len);
                r.data_len += ev.len;
                if (ev.last && r.nends < sizeof r.ends / sizeof *r.ends)
                    r.ends[r.nends++] = r.data_len;
            } else {
                CHECK(!ev.last);
                size_t k = strlen(r.controls);
                r.controls[k] = ev.kind == RT_WS_EV_PING   ? 'i'
                                : ev.kind == RT_WS_EV_PONG ? 'o'
                                                           : 'c';
                if (k < 8) {
                    memcpy(r.control_payload[k], ev.data, ev.len);
                    r.control_len[k] = ev.len;
                }
                if (ev.kind == RT_WS_EV_CLOSE)
                    r.close_code = ev.close_code;
            }
            memmove(pending, pending + used, have - used);
            have -= used;
        }
    }
    free(pending);
    return r;
}

/* A binary stream, as MQTT's. */
static result_t run_stream(const uint8_t *stream, size_t n, uint32_t max_message,
                           size_t (*chunk)(size_t left))
{
    return run_stream_as(stream, n, max_message, chunk, false);
}

static size_t chunk_all(size_t left)
{
    return left;
}

static size_t chunk_one(size_t left)
{
    return 1;
}

static size_t chunk_random(size_t left)
{
    size_t c = 1 + rnd() % 40;
    return c < left ? c : left;
}

/* The first chunk is split_at bytes, the second the rest: a split at one chosen offset. */
static size_t split_at;
static size_t chunk_split(size_t left)
{
    size_t c = split_at ? split_at : left;
    split_at = 0;
    return c < left ? c : left;
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

static int decode_one(uint8_t *buf, size_t len, rt_ws_event_t *ev, uint16_t *code, size_t *used)
{
    rt_ws_in_t st = {0};
    return rt_ws_decode(&st, buf, len, 1 << 20, used, ev, code);
}

/* The close code a stream is refused with (0 when it is not refused). */
static uint16_t refused_with(const uint8_t *stream, size_t n, uint32_t max_message)
{
    result_t r = run_stream(stream, n, max_message, chunk_all);
    uint16_t code = r.error == RT_EPROTO ? r.error_code : 0;
    if (r.error && r.error != RT_EPROTO)
        CHECK(!"an error other than RT_EPROTO");
    result_free(&r);
    return code;
}

static void test_frame_header(void)
{
    uint8_t h[10];
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_BINARY, 0), 2);
    CHECK_EQ(h[0], 0x82);
    CHECK_EQ(h[1], 0);
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_PONG, 125), 2);
    CHECK_EQ(h[0], 0x8A);
    CHECK_EQ(h[1], 125);
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_BINARY, 126), 4);
    CHECK_EQ(h[1], 126);
    CHECK_EQ(h[2], 0);
    CHECK_EQ(h[3], 126);
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_BINARY, 65535), 4);
    CHECK_EQ(h[2], 0xFF);
    CHECK_EQ(h[3], 0xFF);
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_BINARY, 65536), 10);
    CHECK_EQ(h[1], 127);
    CHECK_EQ(h[7], 1);
    CHECK_EQ(h[8], 0);
    CHECK_EQ(h[9], 0);
    CHECK_EQ(rt_ws_frame_header(h, RT_WS_OP_CLOSE, 0x0102030405060708ull), 10);
    CHECK_EQ(h[0], 0x88);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(h[2 + i], i + 1);
}

/* One frame of each length encoding decodes to its payload, unmasked where it lay. */
static void test_lengths_and_masks(void)
{
    static const size_t sizes[] = {1, 2, 3, 4, 5, 125, 126, 127, 1000, 65535, 65536, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        uint8_t *payload = malloc(n);
        uint8_t *buf = malloc(n + 14);
        fill(payload, n, (uint8_t)s);
        size_t flen = frame(buf, FIN | RT_WS_OP_BINARY, payload, n, LEN_MINIMAL);
        CHECK_EQ(flen, n + (n <= 125 ? 6 : n <= 0xFFFF ? 8 : 14));
        rt_ws_event_t ev;
        uint16_t code;
        size_t used;
        CHECK_EQ(decode_one(buf, flen, &ev, &code, &used), 0);
        CHECK_EQ(ev.kind, RT_WS_EV_DATA);
        CHECK_EQ(used, flen);
        CHECK_EQ(ev.len, n);
        CHECK(ev.data == buf + flen - n);
        CHECK(memcmp(ev.data, payload, n) == 0);
        free(payload);
        free(buf);
    }
}

/* RFC 6455 5.7's examples: a masked "Hello" and a 256-byte binary frame's header. */
static void test_rfc_examples(void)
{
    uint8_t hello[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    hello[0] = 0x82; /* binary: the broker refuses text */
    rt_ws_event_t ev;
    uint16_t code;
    size_t used;
    CHECK_EQ(decode_one(hello, sizeof hello, &ev, &code, &used), 0);
    CHECK_EQ(ev.len, 5);
    CHECK(memcmp(ev.data, "Hello", 5) == 0);

    uint8_t ping[] = {0x89, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    CHECK_EQ(decode_one(ping, sizeof ping, &ev, &code, &used), 0);
    CHECK_EQ(ev.kind, RT_WS_EV_PING);
    CHECK_EQ(ev.len, 5);
    CHECK(memcmp(ev.data, "Hello", 5) == 0);
}

/* Longer encodings than needed are accepted (the decoder does not insist on minimal ones). */
static void test_non_minimal_length(void)
{
    uint8_t buf[64];
    for (int form = LEN_16; form <= LEN_64; form += LEN_64 - LEN_16) {
        size_t flen = frame(buf, FIN | RT_WS_OP_BINARY, "abcde", 5, form);
        rt_ws_event_t ev;
        uint16_t code;
        size_t used;
        CHECK_EQ(decode_one(buf, flen, &ev, &code, &used), 0);
        CHECK_EQ(ev.len, 5);
        CHECK(memcmp(ev.data, "abcde", 5) == 0);
    }
}

/*
** A stream with everything a connection may see: a message in three fragments with a ping
** and an empty pong between them, frames with empty payloads, 16- and 64-bit lengths, and a
** close with a code and reason. Its data must come out whole however it is split, and each
** message's end be told once, at its last byte (an empty message's too).
*/
static size_t build_stream(uint8_t *s, uint8_t *expect, size_t *expect_len)
{
    uint8_t p[3000];
    size_t n = 0, e = 0;
    fill(p, sizeof p, 1);
#define DATA(fo, len, form)                                                                        \
    do {                                                                                           \
        n += frame(s + n, fo, p + e % 1000, len, form);                                            \
        memcpy(expect + e, p + e % 1000, len);                                                     \
        e += len;                                                                                  \
    } while (0)
    DATA(NO_FIN | RT_WS_OP_BINARY, 10, LEN_MINIMAL);
    n += frame(s + n, FIN | RT_WS_OP_PING, "ping!", 5, LEN_MINIMAL);
    DATA(NO_FIN | RT_WS_OP_CONT, 300, LEN_MINIMAL);
    n += frame(s + n, FIN | RT_WS_OP_PONG, "", 0, LEN_MINIMAL);
    DATA(NO_FIN | RT_WS_OP_CONT, 0, LEN_MINIMAL);
    DATA(FIN | RT_WS_OP_CONT, 7, LEN_MINIMAL);
    DATA(FIN | RT_WS_OP_BINARY, 0, LEN_MINIMAL);
    DATA(FIN | RT_WS_OP_BINARY, 1500, LEN_64);
    DATA(FIN | RT_WS_OP_BINARY, 126, LEN_MINIMAL);
    DATA(FIN | RT_WS_OP_BINARY, 1, LEN_16);
#undef DATA
    n += frame(s + n, FIN | RT_WS_OP_CLOSE, "\x03\xe8so long", 9, LEN_MINIMAL);
    *expect_len = e;
    return n;
}

static void check_stream_result(const result_t *r, const uint8_t *expect, size_t expect_len)
{
    CHECK_EQ(r->error, 0);
    CHECK_EQ(r->data_len, expect_len);
    CHECK(memcmp(r->data, expect, expect_len) == 0);
    CHECK(strcmp(r->controls, "ioc") == 0);
    CHECK_EQ(r->control_len[0], 5);
    CHECK(memcmp(r->control_payload[0], "ping!", 5) == 0);
    CHECK_EQ(r->control_len[1], 0);
    CHECK_EQ(r->close_code, 1000);
    CHECK_EQ(r->control_len[2], 7);
    CHECK(memcmp(r->control_payload[2], "so long", 7) == 0);
    static const size_t ends[] = {317, 317, 1817, 1943, 1944};
    CHECK_EQ(r->nends, sizeof ends / sizeof *ends);
    for (size_t i = 0; i < r->nends && i < sizeof ends / sizeof *ends; i++)
        CHECK_EQ(r->ends[i], ends[i]);
}

static void test_splits(void)
{
    static uint8_t stream[8192], expect[8192];
    size_t expect_len;
    size_t n = build_stream(stream, expect, &expect_len);

    result_t r = run_stream(stream, n, 1 << 20, chunk_all);
    check_stream_result(&r, expect, expect_len);
    result_free(&r);

    r = run_stream(stream, n, 1 << 20, chunk_one);
    check_stream_result(&r, expect, expect_len);
    result_free(&r);

    for (size_t at = 1; at < n; at++) {
        split_at = at;
        r = run_stream(stream, n, 1 << 20, chunk_split);
        check_stream_result(&r, expect, expect_len);
        result_free(&r);
    }
    for (int i = 0; i < 200; i++) {
        r = run_stream(stream, n, 1 << 20, chunk_random);
        check_stream_result(&r, expect, expect_len);
        result_free(&r);
    }
}

/* A header or control frame cut short is not consumed; a data frame's payload is given as it comes.
 */
static void test_partial(void)
{
    uint8_t buf[200];
    rt_ws_event_t ev;
    uint16_t code;
    size_t used = 1;
    rt_ws_in_t st = {0};
    CHECK_EQ(rt_ws_decode(&st, buf, 0, 100, &used, &ev, &code), RT_EAGAIN);
    CHECK_EQ(used, 0);

    uint8_t payload[125];
    fill(payload, sizeof payload, 9);
    size_t flen = frame(buf, FIN | RT_WS_OP_PING, payload, 125, LEN_MINIMAL);
    for (size_t cut = 0; cut < flen; cut++) {
        rt_ws_in_t fresh = {0};
        used = 1;
        CHECK_EQ(rt_ws_decode(&fresh, buf, cut, 100, &used, &ev, &code), RT_EAGAIN);
        CHECK_EQ(used, 0);
    }

    /* A data frame: the header is consumed with no payload yet, then bytes come as they arrive. */
    flen = frame(buf, FIN | RT_WS_OP_BINARY, payload, 100, LEN_MINIMAL);
    CHECK_EQ(rt_ws_decode(&st, buf, 6, 1000, &used, &ev, &code), RT_EAGAIN);
    CHECK_EQ(used, 6);
    CHECK_EQ(st.in_frame, 1);
    CHECK_EQ(st.remaining, 100);
    CHECK_EQ(rt_ws_decode(&st, buf + 6, 33, 1000, &used, &ev, &code), 0);
    CHECK_EQ(used, 33);
    CHECK_EQ(ev.len, 33);
    CHECK(memcmp(ev.data, payload, 33) == 0);
    CHECK_EQ(rt_ws_decode(&st, buf + 39, flen - 39, 1000, &used, &ev, &code), 0);
    CHECK_EQ(ev.len, 67);
    CHECK(memcmp(ev.data, payload + 33, 67) == 0);
    CHECK_EQ(st.in_frame, 0);
}

static void test_close(void)
{
    uint8_t buf[64];
    rt_ws_event_t ev;
    uint16_t code;
    size_t used;
    rt_ws_in_t st = {0};

    size_t flen = frame(buf, FIN | RT_WS_OP_CLOSE, "", 0, LEN_MINIMAL);
    CHECK_EQ(rt_ws_decode(&st, buf, flen, 100, &used, &ev, &code), 0);
    CHECK_EQ(ev.kind, RT_WS_EV_CLOSE);
    CHECK_EQ(ev.close_code, RT_WS_CLOSE_NO_STATUS);
    CHECK_EQ(ev.len, 0);
    CHECK_EQ(used, flen);
    CHECK_EQ(st.closed, 1);
    /* Nothing after a close is decoded. */
    flen = frame(buf, FIN | RT_WS_OP_BINARY, "x", 1, LEN_MINIMAL);
    CHECK_EQ(rt_ws_decode(&st, buf, flen, 100, &used, &ev, &code), RT_EAGAIN);
    CHECK_EQ(used, flen);

    static const uint16_t good[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010,
                                    1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint8_t p[2] = {(uint8_t)(good[i] >> 8), (uint8_t)good[i]};
        flen = frame(buf, FIN | RT_WS_OP_CLOSE, p, 2, LEN_MINIMAL);
        CHECK_EQ(decode_one(buf, flen, &ev, &code, &used), 0);
        CHECK_EQ(ev.close_code, good[i]);
        CHECK_EQ(ev.len, 0);
    }
    static const uint16_t bad[] = {0,    1,    999,  1004, 1005, 1006,
                                   1015, 1016, 2000, 2999, 5000, 65535};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t p[2] = {(uint8_t)(bad[i] >> 8), (uint8_t)bad[i]};
        flen = frame(buf, FIN | RT_WS_OP_CLOSE, p, 2, LEN_MINIMAL);
        CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_INVALID);
    }
    flen = frame(buf, FIN | RT_WS_OP_CLOSE, "\x03", 1, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_INVALID);

    /* The reason must be UTF-8. */
    flen = frame(buf, FIN | RT_WS_OP_CLOSE, "\x03\xe8\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", 12,
                 LEN_MINIMAL);
    CHECK_EQ(decode_one(buf, flen, &ev, &code, &used), 0);
    CHECK_EQ(ev.len, 10);
    static const char *const bad_utf8[] = {
        "\xc3", "\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "a\x80"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof *bad_utf8; i++) {
        uint8_t p[16] = {0x03, 0xe8};
        size_t n = strlen(bad_utf8[i]);
        memcpy(p + 2, bad_utf8[i], n);
        flen = frame(buf, FIN | RT_WS_OP_CLOSE, p, n + 2, LEN_MINIMAL);
        CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_INVALID);
    }
}

static void test_protocol_errors(void)
{
    uint8_t buf[300];
    size_t flen;

    /* Unmasked. */
    uint8_t unmasked[] = {0x82, 0x01, 'x'};
    CHECK_EQ(refused_with(unmasked, sizeof unmasked, 100), RT_WS_CLOSE_PROTOCOL);
    /* Each reserved bit. */
    for (int bit = 0x10; bit <= 0x40; bit <<= 1) {
        flen = frame(buf, FIN | bit | RT_WS_OP_BINARY, "x", 1, LEN_MINIMAL);
        CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_PROTOCOL);
    }
    /* Unknown opcodes. */
    for (int op = 3; op <= 0xF; op++) {
        if (op == RT_WS_OP_CLOSE || op == RT_WS_OP_PING || op == RT_WS_OP_PONG)
            continue;
        flen = frame(buf, FIN | op, "x", 1, LEN_MINIMAL);
        CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_PROTOCOL);
    }
    /* Text. */
    flen = frame(buf, FIN | RT_WS_OP_TEXT, "x", 1, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_UNSUPPORTED);
    /* Fragmented and oversized control frames. */
    flen = frame(buf, NO_FIN | RT_WS_OP_PING, "x", 1, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_PROTOCOL);
    uint8_t big[200] = {0};
    flen = frame(buf, FIN | RT_WS_OP_PONG, big, 126, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 1000), RT_WS_CLOSE_PROTOCOL);
    /* A continuation with no message; a new message inside one. */
    flen = frame(buf, FIN | RT_WS_OP_CONT, "x", 1, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_PROTOCOL);
    flen = frame(buf, NO_FIN | RT_WS_OP_BINARY, "x", 1, LEN_MINIMAL);
    flen += frame(buf + flen, FIN | RT_WS_OP_BINARY, "y", 1, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_PROTOCOL);
    /* A 64-bit length with its top bit set. */
    uint8_t huge[14] = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4};
    CHECK_EQ(refused_with(huge, sizeof huge, UINT32_MAX), RT_WS_CLOSE_PROTOCOL);
    /* The errors the first two bytes show are reported before the rest of the header. */
    rt_ws_event_t ev;
    uint16_t code = 0;
    size_t used;
    uint8_t text[2] = {0x81, 0xFF};
    CHECK_EQ(decode_one(text, 2, &ev, &code, &used), RT_EPROTO);
    CHECK_EQ(code, RT_WS_CLOSE_UNSUPPORTED);
}

/* The message size is checked at each frame's header, over all the message's fragments. */
static void test_too_big(void)
{
    uint8_t buf[300], p[200] = {0};
    rt_ws_event_t ev;
    uint16_t code = 0;
    size_t used;
    size_t flen = frame(buf, FIN | RT_WS_OP_BINARY, p, 101, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), RT_WS_CLOSE_TOO_BIG);
    CHECK_EQ(refused_with(buf, flen, 101), 0);
    /* Only the header has come. */
    CHECK_EQ(decode_one(buf, 6, &ev, &code, &used), RT_EAGAIN);
    rt_ws_in_t st = {0};
    CHECK_EQ(rt_ws_decode(&st, buf, 6, 100, &used, &ev, &code), RT_EPROTO);
    CHECK_EQ(code, RT_WS_CLOSE_TOO_BIG);

    flen = frame(buf, NO_FIN | RT_WS_OP_BINARY, p, 60, LEN_MINIMAL);
    flen += frame(buf + flen, FIN | RT_WS_OP_CONT, p, 40, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), 0);
    CHECK_EQ(refused_with(buf, flen, 99), RT_WS_CLOSE_TOO_BIG);
    /* A new message starts counting again. */
    flen += frame(buf + flen, FIN | RT_WS_OP_BINARY, p, 100, LEN_MINIMAL);
    CHECK_EQ(refused_with(buf, flen, 100), 0);
    uint8_t huge[14] = {0x82, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3, 4};
    CHECK_EQ(refused_with(huge, sizeof huge, UINT32_MAX), RT_WS_CLOSE_TOO_BIG);
    CHECK_EQ(refused_with(huge, sizeof huge, 1 << 20), RT_WS_CLOSE_TOO_BIG);
}

/* ---- Text messages (a protocol that sets st.text: XMPP, RFC 7395) ---- */

/*
** Text whose UTF-8 sequences of every length are cut between fragments and, across every
** split of the stream, between reads: all of it comes out, each message ended once. Binary
** frames are refused with 1003 as text ones are in binary mode.
*/
static void test_text_messages(void)
{
    /* "<a>é€𝄞</a>": 2-, 3- and 4-byte sequences. */
    static const char msg[] = "<a>\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e</a>";
    size_t mlen = strlen(msg);
    uint8_t stream[256];
    size_t n = 0;
    /* One message cut inside each sequence: after \xc3, after \xe2\x82, after \xf0\x9d. */
    n += frame(stream + n, NO_FIN | RT_WS_OP_TEXT, msg, 4, LEN_MINIMAL);
    n += frame(stream + n, NO_FIN | RT_WS_OP_CONT, msg + 4, 3, LEN_MINIMAL);
    n += frame(stream + n, FIN | RT_WS_OP_PING, "", 0, LEN_MINIMAL);
    n += frame(stream + n, NO_FIN | RT_WS_OP_CONT, msg + 7, 3, LEN_MINIMAL);
    n += frame(stream + n, FIN | RT_WS_OP_CONT, msg + 10, mlen - 10, LEN_MINIMAL);
    /* Then the same whole, then an empty one. */
    n += frame(stream + n, FIN | RT_WS_OP_TEXT, msg, mlen, LEN_16);
    n += frame(stream + n, FIN | RT_WS_OP_TEXT, "", 0, LEN_MINIMAL);
    for (size_t at = 0; at <= n; at++) {
        split_at = at;
        result_t r = run_stream_as(stream, n, 1000, at ? chunk_split : chunk_one, true);
        CHECK_EQ(r.error, 0);
        CHECK_EQ(r.data_len, 2 * mlen);
        CHECK(memcmp(r.data, msg, mlen) == 0 && memcmp(r.data + mlen, msg, mlen) == 0);
        CHECK_EQ(r.nends, 3);
        CHECK_EQ(r.ends[0], mlen);
        CHECK_EQ(r.ends[1], 2 * mlen);
        CHECK_EQ(r.ends[2], 2 * mlen);
        CHECK(strcmp(r.controls, "i") == 0);
        result_free(&r);
    }

    uint8_t buf[64];
    size_t flen = frame(buf, FIN | RT_WS_OP_BINARY, "x", 1, LEN_MINIMAL);
    result_t r = run_stream_as(buf, flen, 100, chunk_all, true);
    CHECK_EQ(r.error, RT_EPROTO);
    CHECK_EQ(r.error_code, RT_WS_CLOSE_UNSUPPORTED);
    result_free(&r);
}

/* What is not UTF-8 is refused with 1007, at its first bad byte or at the message's end. */
static void test_text_invalid(void)
{
    static const struct {
        const char *text;
        size_t len;
    } bad[] = {
        {"\xc0\x80", 2},         /* overlong NUL */
        {"\xe0\x80\xaf", 3},     /* overlong "/" */
        {"\xed\xa0\x80", 3},     /* a UTF-16 surrogate */
        {"\xf4\x90\x80\x80", 4}, /* past U+10FFFF */
        {"\xf5\x80\x80\x80", 4}, /* no such lead */
        {"a\x80", 2},            /* a continuation with no lead */
        {"\xe2\x82", 2},         /* cut short at the message's end */
        {"\xc3(", 2},            /* a lead without its continuation */
    };
    uint8_t buf[64];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* Whole, and with the bad part in a frame of its own after a good one. */
        size_t flen = frame(buf, FIN | RT_WS_OP_TEXT, bad[i].text, bad[i].len, LEN_MINIMAL);
        result_t r = run_stream_as(buf, flen, 100, chunk_one, true);
        CHECK_EQ(r.error, RT_EPROTO);
        CHECK_EQ(r.error_code, RT_WS_CLOSE_INVALID);
        CHECK_EQ(r.nends, 0);
        result_free(&r);
        flen = frame(buf, NO_FIN | RT_WS_OP_TEXT, "ok", 2, LEN_MINIMAL);
        flen += frame(buf + flen, FIN | RT_WS_OP_CONT, bad[i].text, bad[i].len, LEN_MINIMAL);
        r = run_stream_as(buf, flen, 100, chunk_all, true);
        CHECK_EQ(r.error_code, RT_WS_CLOSE_INVALID);
        result_free(&r);
    }
    /* A sequence cut at a message's end is refused though its final frame is empty. */
    size_t flen = frame(buf, NO_FIN | RT_WS_OP_TEXT, "\xe2\x82", 2, LEN_MINIMAL);
    flen += frame(buf + flen, FIN | RT_WS_OP_CONT, "", 0, LEN_MINIMAL);
    result_t r = run_stream_as(buf, flen, 100, chunk_all, true);
    CHECK_EQ(r.error_code, RT_WS_CLOSE_INVALID);
    CHECK_EQ(r.data_len, 2);
    result_free(&r);
    /* Binary messages are not checked: MQTT's bytes are its own business. */
    flen = frame(buf, FIN | RT_WS_OP_BINARY, "\xc0\x80", 2, LEN_MINIMAL);
    r = run_stream(buf, flen, 100, chunk_all);
    CHECK_EQ(r.error, 0);
    CHECK_EQ(r.data_len, 2);
    result_free(&r);
}

/* ---- The upgrade ---- */

#define SAMPLE_KEY "dGhlIHNhbXBsZSBub25jZQ=="
#define SAMPLE_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

static char req[16384];

/* A request from the given lines (each ending in CRLF), for path and version 13 by default. */
static const char *request(const char *target, const char *headers)
{
    snprintf(req, sizeof req,
             "GET %s HTTP/1.1\r\n"
             "Host: broker.example\r\n"
             "%s"
             "\r\n",
             target, headers);
    return req;
}

#define STD_HEADERS                                                                                \
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"                   \
    "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n"

static const char *last_why; /* the reason the last parse() gave */

/* MQTT's subprotocols, as the connection actor gives them; XMPP's (RFC 7395), required. */
static const rt_ws_protocols_t mqtt_protos = {.names = {"mqtt", "mqttv3.1"}};
static const rt_ws_protocols_t xmpp_protos = {.names = {"xmpp"}, .required = true};

static int parse_for(const char *text, const rt_ws_protocols_t *protos, rt_ws_upgrade_t *u,
                     size_t *head_len)
{
    last_why = NULL;
    int rc = rt_ws_parse_upgrade((const uint8_t *)text, strlen(text), "/mqtt", protos, head_len, u,
                                 &last_why);
    CHECK(last_why != NULL);
    if (rc != 0)
        CHECK(last_why && last_why[0]);
    return rc;
}

static int parse(const char *text, rt_ws_upgrade_t *u, size_t *head_len)
{
    return parse_for(text, &mqtt_protos, u, head_len);
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int status_of(const char *text)
{
    rt_ws_upgrade_t u;
    size_t head_len;
    return parse(text, &u, &head_len);
}

static void test_upgrade_valid(void)
{
    rt_ws_upgrade_t u;
    size_t head_len = 0;
    char text[4096];
    request("/mqtt", STD_HEADERS);
    CHECK(strlen(req) + 3 <= sizeof text);
    memcpy(text, req, strlen(req));
    strcpy(text + strlen(req), "\x82\x85");
    CHECK_EQ(parse(text, &u, &head_len), 0);
    CHECK_EQ(head_len, strlen(text) - 2);
    CHECK(strcmp(u.accept, SAMPLE_ACCEPT) == 0);
    CHECK(strcmp(u.subprotocol, "") == 0);
    CHECK(strcmp(u.forwarded_for, "") == 0);

    /* The query string is ignored; names and Upgrade's and Connection's tokens are not
     * case-sensitive. */
    CHECK_EQ(status_of(request("/mqtt?token=1&x=2", STD_HEADERS)), 0);
    CHECK_EQ(
        status_of(request("/mqtt", "upgrade: WebSocket\r\nCONNECTION: keep-alive, UPGRADE\r\n"
                                   "sec-websocket-version: 13\r\nSEC-WEBSOCKET-KEY:   " SAMPLE_KEY
                                   "  \r\n")),
        0);
    CHECK_EQ(status_of(request("/mqtt", "Connection: keep-alive\r\nConnection: upgrade\r\n"
                                        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             0);
    /* Empty values, and headers the broker does not read, change nothing. */
    CHECK_EQ(status_of(request("/mqtt", "X-Empty:\r\n" STD_HEADERS "Origin: x\r\nX-Empty:\r\n")),
             0);
    /* An absolute target and a later HTTP version. */
    CHECK_EQ(status_of(request("http://broker.example/mqtt", STD_HEADERS)), 0);
    snprintf(text, sizeof text, "GET /mqtt HTTP/1.2\r\n" STD_HEADERS "\r\n");
    CHECK_EQ(status_of(text), 0);
}

/* Every proper prefix of a head waits for more; the complete head is accepted. */
static void test_upgrade_partial(void)
{
    const char *text = request("/mqtt", STD_HEADERS "X-Forwarded-For: 10.1.2.3\r\n");
    size_t n = strlen(text);
    for (size_t cut = 0; cut < n; cut++) {
        rt_ws_upgrade_t u;
        size_t head_len = 0;
        const char *why = NULL;
        CHECK_EQ(rt_ws_parse_upgrade((const uint8_t *)text, cut, "/mqtt", &mqtt_protos, &head_len,
                                     &u, &why),
                 RT_EAGAIN);
    }
}

static void test_upgrade_refused(void)
{
    CHECK_EQ(status_of("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), 400); /* a TLS hello */
    CHECK_EQ(status_of("HTTP/1.1 200 OK\r\n\r\n"), 400);
    char text[4096];
    snprintf(text, sizeof text, "POST /mqtt HTTP/1.1\r\n" STD_HEADERS "\r\n");
    CHECK_EQ(status_of(text), 400);
    snprintf(text, sizeof text, "GET /mqtt HTTP/1.0\r\n" STD_HEADERS "\r\n");
    CHECK_EQ(status_of(text), 400);
    CHECK_EQ(status_of(request("/", STD_HEADERS)), 404);
    CHECK_EQ(status_of(request("/mqtt/", STD_HEADERS)), 404);
    CHECK_EQ(status_of(request("/MQTT", STD_HEADERS)), 404);

    CHECK_EQ(status_of(request("/mqtt", "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             400);
    CHECK_EQ(status_of(request("/mqtt", "Upgrade: h2c\r\nConnection: Upgrade\r\n"
                                        "Sec-WebSocket-Version: 13\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             400);
    CHECK_EQ(status_of(request("/mqtt", "Upgrade: websocket\r\nConnection: keep-alive\r\n"
                                        "Sec-WebSocket-Version: 13\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             400);
    CHECK_EQ(status_of(request("/mqtt", "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             426);
    CHECK_EQ(status_of(request("/mqtt", "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                                        "Sec-WebSocket-Version: 8\r\n"
                                        "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")),
             426);
    CHECK_EQ(status_of(request("/mqtt", STD_HEADERS "Sec-WebSocket-Version: 12\r\n")), 426);

    static const char *const bad_keys[] = {"dGhlIHNhbXBsZSBub25jZQ=",   "dGhlIHNhbXBsZSBub25jZQ===",
                                           "dGhlIHNhbXBsZSBub25jZQ",    "dGhlIHNhbXBsZSBub25jZ*==",
                                           "dGhlIHNhbXBsZSBub25jZQQ=",  "dGhlIHNhbXBsZSBub25jZQ==x",
                                           "dGhl IHNhbXBsZSBub25jZQ==", ""};
    for (size_t i = 0; i < sizeof bad_keys / sizeof *bad_keys; i++) {
        char headers[512];
        snprintf(headers, sizeof headers,
                 "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                 "Sec-WebSocket-Key: %s\r\n",
                 bad_keys[i]);
        CHECK_EQ(status_of(request("/mqtt", headers)), 400);
        CHECK(strstr(last_why, "Key") != NULL);
    }
    CHECK_EQ(status_of(request("/mqtt", "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                                        "Sec-WebSocket-Version: 13\r\n")),
             400);
    CHECK_EQ(status_of(request("/mqtt", STD_HEADERS "Sec-WebSocket-Key: " SAMPLE_KEY "\r\n")), 400);
    /* A value folded over two lines (obs-fold). */
    CHECK_EQ(status_of(request("/mqtt", STD_HEADERS "Sec-WebSocket-Protocol: foo,\r\n mqtt\r\n")),
             400);
    CHECK(strstr(last_why, "folded") != NULL);
}

static void test_upgrade_bounds(void)
{
    /* A head past RT_WS_HEAD_MAX is refused, complete or not. */
    static char big[RT_WS_HEAD_MAX + 200];
    char filler[RT_WS_HEAD_MAX];
    memset(filler, 'a', sizeof filler);
    snprintf(big, sizeof big, "GET /mqtt HTTP/1.1\r\n" STD_HEADERS "X-Filler: %.*s\r\n\r\n",
             (int)(RT_WS_HEAD_MAX - 200), filler);
    size_t n = strlen(big);
    CHECK(n < RT_WS_HEAD_MAX);
    CHECK_EQ(status_of(big), 0);
    snprintf(big, sizeof big, "GET /mqtt HTTP/1.1\r\n" STD_HEADERS "X-Filler: %.*s\r\n\r\n",
             (int)(RT_WS_HEAD_MAX), filler);
    n = strlen(big);
    CHECK(n > RT_WS_HEAD_MAX);
    CHECK_EQ(status_of(big), 400);
    rt_ws_upgrade_t u;
    size_t head_len;
    const char *why;
    CHECK_EQ(rt_ws_parse_upgrade((uint8_t *)big, RT_WS_HEAD_MAX - 1, "/mqtt", &mqtt_protos,
                                 &head_len, &u, &why),
             RT_EAGAIN);
    CHECK_EQ(rt_ws_parse_upgrade((uint8_t *)big, RT_WS_HEAD_MAX, "/mqtt", &mqtt_protos, &head_len,
                                 &u, &why),
             400);
}

static void test_subprotocol(void)
{
    static const struct {
        const char *headers;
        int status;
        const char *chosen;
    } cases[] = {
        {"", 0, ""},
        {"Sec-WebSocket-Protocol: mqtt\r\n", 0, "mqtt"},
        {"Sec-WebSocket-Protocol: mqttv3.1\r\n", 0, "mqttv3.1"},
        {"Sec-WebSocket-Protocol: foo, mqttv3.1, mqtt\r\n", 0, "mqttv3.1"},
        {"Sec-WebSocket-Protocol: foo mqtt\r\n", 0, "mqtt"},
        {"Sec-WebSocket-Protocol: foo,mqtt\r\n", 0, "mqtt"},
        {"Sec-WebSocket-Protocol: foo\r\nsec-websocket-protocol: mqtt, mqttv3.1\r\n", 0, "mqtt"},
        {"Sec-WebSocket-Protocol: mqttv3.1\r\nSec-WebSocket-Protocol: mqtt\r\n", 0, "mqttv3.1"},
        {"Sec-WebSocket-Protocol: MQTT\r\n", 400, ""},
        {"Sec-WebSocket-Protocol: mqttv5, mqtt3\r\n", 400, ""},
        {"Sec-WebSocket-Protocol: foo\r\n", 400, ""},
        {"Sec-WebSocket-Protocol:\r\n", 400, ""},
        {"Sec-WebSocket-Protocol:\r\nSec-WebSocket-Protocol: mqtt\r\n", 0, "mqtt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char headers[512];
        snprintf(headers, sizeof headers, STD_HEADERS "%s", cases[i].headers);
        rt_ws_upgrade_t u;
        size_t head_len;
        int rc = parse(request("/mqtt", headers), &u, &head_len);
        CHECK_EQ(rc, cases[i].status);
        if (rc != 0)
            CHECK(strstr(last_why, "subprotocol") != NULL);
        if (rc == 0 && strcmp(u.subprotocol, cases[i].chosen) != 0)
            fprintf(stderr, "  case %zu chose '%s'\n", i, u.subprotocol);
        if (rc == 0)
            CHECK(strcmp(u.subprotocol, cases[i].chosen) == 0);
    }
}

/* XMPP's subprotocol is required (RFC 7395 3.1): no list, or one without "xmpp", is refused. */
static void test_subprotocol_required(void)
{
    static const struct {
        const char *headers;
        int status;
    } cases[] = {
        {"", 400},
        {"Sec-WebSocket-Protocol: mqtt\r\n", 400},
        {"Sec-WebSocket-Protocol: XMPP\r\n", 400},
        {"Sec-WebSocket-Protocol: xmpp\r\n", 0},
        {"Sec-WebSocket-Protocol: mqtt, xmpp\r\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char headers[512];
        snprintf(headers, sizeof headers, STD_HEADERS "%s", cases[i].headers);
        rt_ws_upgrade_t u;
        size_t head_len;
        int rc = parse_for(request("/mqtt", headers), &xmpp_protos, &u, &head_len);
        CHECK_EQ(rc, cases[i].status);
        if (rc != 0)
            CHECK(strstr(last_why, "subprotocol") != NULL);
        else
            CHECK(strcmp(u.subprotocol, "xmpp") == 0);
    }
    /* The answer names it. */
    char answer[512];
    rt_ws_upgrade_t u;
    size_t head_len;
    CHECK_EQ(parse_for(request("/mqtt", STD_HEADERS "Sec-WebSocket-Protocol: xmpp\r\n"),
                       &xmpp_protos, &u, &head_len),
             0);
    CHECK(rt_ws_upgrade_response(&u, answer, sizeof answer) > 0);
    CHECK(strstr(answer, "\r\nSec-WebSocket-Protocol: xmpp\r\n") != NULL);
}

static void test_forwarded_for(void)
{
    rt_ws_upgrade_t u;
    size_t head_len;
    CHECK_EQ(parse(request("/mqtt", STD_HEADERS "X-Forwarded-For: 203.0.113.7, 10.0.0.1\r\n"
                                                "x-forwarded-for:  10.0.0.2 \r\n"),
                   &u, &head_len),
             0);
    CHECK(strcmp(u.forwarded_for, "203.0.113.7, 10.0.0.1, 10.0.0.2") == 0);

    char headers[1024], long_value[300];
    memset(long_value, '1', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    snprintf(headers, sizeof headers, STD_HEADERS "X-Forwarded-For: %s\r\n", long_value);
    CHECK_EQ(parse(request("/mqtt", headers), &u, &head_len), 0);
    CHECK(strcmp(u.forwarded_for, "") == 0);
    /* Exactly as many as fit. */
    long_value[sizeof u.forwarded_for - 1] = '\0';
    snprintf(headers, sizeof headers, STD_HEADERS "X-Forwarded-For: %s\r\n", long_value);
    CHECK_EQ(parse(request("/mqtt", headers), &u, &head_len), 0);
    CHECK_EQ(strlen(u.forwarded_for), sizeof u.forwarded_for - 1);
}

static void test_responses(void)
{
    rt_ws_upgrade_t u;
    size_t head_len;
    CHECK_EQ(parse(request("/mqtt", STD_HEADERS "Sec-WebSocket-Protocol: mqtt\r\n"), &u, &head_len),
             0);
    char out[512];
    size_t n = rt_ws_upgrade_response(&u, out, sizeof out);
    const char *expect = "HTTP/1.1 101 Switching Protocols\r\n"
                         "Upgrade: websocket\r\n"
                         "Connection: Upgrade\r\n"
                         "Sec-WebSocket-Accept: " SAMPLE_ACCEPT "\r\n"
                         "Sec-WebSocket-Protocol: mqtt\r\n"
                         "\r\n";
    CHECK_EQ(n, strlen(expect));
    CHECK(strcmp(out, expect) == 0);
    CHECK_EQ(rt_ws_upgrade_response(&u, out, n), 0);
    CHECK_EQ(rt_ws_upgrade_response(&u, out, n + 1), n);
    u.subprotocol[0] = '\0';
    n = rt_ws_upgrade_response(&u, out, sizeof out);
    CHECK(strstr(out, "Sec-WebSocket-Protocol") == NULL);
    CHECK_EQ(n, strlen(expect) - strlen("Sec-WebSocket-Protocol: mqtt\r\n"));

    n = rt_ws_error_response(426, out, sizeof out);
    CHECK_EQ(n, strlen(out));
    CHECK(starts_with(out, "HTTP/1.1 426 Upgrade Required\r\n"));
    CHECK(strstr(out, "\r\nSec-WebSocket-Version: 13\r\n") != NULL);
    CHECK(strstr(out, "\r\nConnection: close\r\n") != NULL);
    CHECK(strcmp(out + n - 4, "\r\n\r\n") == 0);
    n = rt_ws_error_response(404, out, sizeof out);
    CHECK(starts_with(out, "HTTP/1.1 404 Not Found\r\n"));
    CHECK(strstr(out, "Sec-WebSocket-Version") == NULL);
    n = rt_ws_error_response(400, out, sizeof out);
    CHECK(starts_with(out, "HTTP/1.1 400 Bad Request\r\n"));
    CHECK_EQ(rt_ws_error_response(400, out, n), 0);
}

int main(void)
{
    RUN(test_frame_header);
    RUN(test_lengths_and_masks);
    RUN(test_rfc_examples);
    RUN(test_non_minimal_length);
    RUN(test_splits);
    RUN(test_partial);
    RUN(test_close);
    RUN(test_protocol_errors);
    RUN(test_too_big);
    RUN(test_text_messages);
    RUN(test_text_invalid);
    RUN(test_upgrade_valid);
    RUN(test_upgrade_partial);
    RUN(test_upgrade_refused);
    RUN(test_upgrade_bounds);
    RUN(test_subprotocol);
    RUN(test_subprotocol_required);
    RUN(test_forwarded_for);
    RUN(test_responses);
    return CHECK_SUMMARY();
}

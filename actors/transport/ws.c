/*
** The WebSocket frame decoder (RFC 6455 section 5), with the UTF-8 check of text messages,
** and the server's frame header. The upgrade request is ws_upgrade.c's.
*/
#include <string.h>

#include "common.h"
#include "ws.h"

#define LEN7_MAX 125 /* the longest payload whose length fits the header's 7-bit field */
/* The longest a frame's payload may claim: the 64-bit length's top bit must be 0 (5.2). */
#define PAYLOAD_LEN_MAX (UINT64_MAX >> 1)

/*
** XORs the next n payload bytes of the current frame with its mask. The mask is rotated to
** start at mask_off so that the loop indexes it with i & 3, which compilers vectorize.
*/
static void unmask(rt_ws_in_t *st, uint8_t *p, size_t n)
{
    uint8_t m[4];
    for (int k = 0; k < 4; k++)
        m[k] = st->mask[(st->mask_off + k) & 3];
    for (size_t i = 0; i < n; i++)
        p[i] ^= m[i & 3];
    st->mask_off = (uint8_t)((st->mask_off + n) & 3);
}

/*
** The codes a peer may put in a close frame (7.4.1, 7.4.2 and IANA's registry): 1004, 1005,
** 1006 and 1015 are never sent, and 1016..2999 are reserved for the protocol's future use.
*/
static bool close_code_valid(unsigned code)
{
    if (code >= 3000 && code <= 4999)
        return true;
    if (code < 1000 || code > 1014)
        return false;
    return code != 1004 && code != 1005 && code != 1006;
}

/* A close frame's reason must be UTF-8 (7.1.6): no overlong forms, surrogates or > U+10FFFF. */
static bool utf8_valid(const uint8_t *p, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = rt_utf8_len(p + i, n - i)) == 0)
            return false;
    return true;
}

/*
** A text message is checked as it comes, a chunk at a time, so a sequence may be cut
** between frames or reads: what the state keeps of it is how many continuation bytes it
** still needs and the bounds of the next one. Only the byte after a lead has other bounds
** than 80..BF (rt_utf8_len's rules): after E0 no overlong form, after ED no surrogate,
** after F0 no overlong, after F4 nothing past U+10FFFF.
*/
enum { NEXT_ANY, NEXT_E0, NEXT_ED, NEXT_F0, NEXT_F4 };
static const uint8_t next_lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
static const uint8_t next_hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

static bool text_more(rt_ws_in_t *st, const uint8_t *p, size_t n)
{
    unsigned need = st->utf8_need, next = st->utf8_next;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (need) {
            if (b < next_lo[next] || b > next_hi[next])
                return false;
            need--;
            next = NEXT_ANY;
        } else if (b >= 0x80) {
            if (b < 0xC2 || b > 0xF4)
                return false;
            need = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
            next = b == 0xE0   ? NEXT_E0
                   : b == 0xED ? NEXT_ED
                   : b == 0xF0 ? NEXT_F0
                   : b == 0xF4 ? NEXT_F4
                               : NEXT_ANY;
        }
    }
    st->utf8_need = need & 3;
    st->utf8_next = (uint8_t)next;
    return true;
}

/* Turns a whole control frame's (unmasked) payload into its event. */
static int control_event(rt_ws_in_t *st, int opcode, uint8_t *payload, size_t n, rt_ws_event_t *ev,
                         uint16_t *close_code)
{
    ev->data = payload;
    ev->len = n;
    ev->close_code = 0;
    ev->last = false;
    if (opcode == RT_WS_OP_PING) {
        ev->kind = RT_WS_EV_PING;
        return 0;
    }
    if (opcode == RT_WS_OP_PONG) {
        ev->kind = RT_WS_EV_PONG;
        return 0;
    }
    ev->kind = RT_WS_EV_CLOSE;
    ev->close_code = RT_WS_CLOSE_NO_STATUS;
    if (n == 0) {
        st->closed = 1;
        return 0;
    }
    if (n == 1) {
        *close_code = RT_WS_CLOSE_INVALID;
        return RT_EPROTO;
    }
    unsigned code = (unsigned)payload[0] << 8 | payload[1];
    if (!close_code_valid(code) || !utf8_valid(payload + 2, n - 2)) {
        *close_code = RT_WS_CLOSE_INVALID;
        return RT_EPROTO;
    }
    ev->close_code = (uint16_t)code;
    ev->data = payload + 2;
    ev->len = n - 2;
    st->closed = 1;
    return 0;
}

/*
** Checks what the first two bytes of a frame header say, which is every check but the
** message size: reserved bits, the mask bit, the opcode and its place in a message, and
** a control frame's FIN and length.
*/
static int check_header_start(const rt_ws_in_t *st, uint8_t b0, uint8_t b1, uint16_t *close_code)
{
    int opcode = b0 & 0x0F;
    bool fin = b0 & 0x80;
    *close_code = RT_WS_CLOSE_PROTOCOL;
    if ((b0 & 0x70) || !(b1 & 0x80))
        return RT_EPROTO;
    switch (opcode) {
    case RT_WS_OP_CLOSE:
    case RT_WS_OP_PING:
    case RT_WS_OP_PONG:
        return fin && (b1 & 0x7F) <= RT_WS_CONTROL_MAX ? 0 : RT_EPROTO;
    case RT_WS_OP_TEXT:
    case RT_WS_OP_BINARY:
        if (st->in_message)
            return RT_EPROTO;
        if ((opcode == RT_WS_OP_TEXT) != st->text) {
            *close_code = RT_WS_CLOSE_UNSUPPORTED;
            return RT_EPROTO;
        }
        return 0;
    case RT_WS_OP_CONT:
        return st->in_message ? 0 : RT_EPROTO;
    default:
        return RT_EPROTO;
    }
}

static void data_event(rt_ws_event_t *ev, uint8_t *p, size_t n, bool last)
{
    ev->kind = RT_WS_EV_DATA;
    ev->data = p;
    ev->len = n;
    ev->close_code = 0;
    ev->last = last;
}

int rt_ws_decode(rt_ws_in_t *st, uint8_t *buf, size_t len, uint32_t max_message, size_t *used,
                 rt_ws_event_t *ev, uint16_t *close_code)
{
    size_t pos = 0;
    *used = 0;
    if (st->closed) {
        *used = len;
        return RT_EAGAIN;
    }
    /* Frames with an empty payload give no event but at a message's end: the loop goes on to
       the next header. */
    for (;;) {
        if (st->in_frame) {
            size_t n = len - pos;
            if (n == 0) {
                *used = pos;
                return RT_EAGAIN;
            }
            if (n > st->remaining)
                n = (size_t)st->remaining;
            unmask(st, buf + pos, n);
            bool last = !st->in_message && n == st->remaining;
            if (st->text && (!text_more(st, buf + pos, n) || (last && st->utf8_need))) {
                *used = pos;
                *close_code = RT_WS_CLOSE_INVALID;
                return RT_EPROTO;
            }
            st->remaining -= (uint32_t)n;
            st->in_frame = st->remaining != 0;
            data_event(ev, buf + pos, n, last);
            *used = pos + n;
            return 0;
        }

        uint8_t *h = buf + pos;
        size_t avail = len - pos;
        *used = pos;
        if (avail < 2)
            return RT_EAGAIN;
        int rc = check_header_start(st, h[0], h[1], close_code);
        if (rc != 0)
            return rc;
        unsigned len7 = h[1] & 0x7F;
        size_t len_bytes = len7 == 126 ? 2 : len7 == 127 ? 8 : 0;
        size_t header_len = 2 + len_bytes + 4;
        if (avail < header_len)
            return RT_EAGAIN;
        uint64_t payload_len = len7;
        if (len_bytes) {
            payload_len = 0;
            for (size_t i = 0; i < len_bytes; i++)
                payload_len = payload_len << 8 | h[2 + i];
        }
        if (payload_len > PAYLOAD_LEN_MAX) {
            *close_code = RT_WS_CLOSE_PROTOCOL;
            return RT_EPROTO;
        }
        int opcode = h[0] & 0x0F;
        const uint8_t *mask = h + 2 + len_bytes;

        if (opcode & 0x8) {
            if (avail - header_len < payload_len)
                return RT_EAGAIN;
            memcpy(st->mask, mask, 4);
            st->mask_off = 0;
            unmask(st, h + header_len, (size_t)payload_len);
            rc = control_event(st, opcode, h + header_len, (size_t)payload_len, ev, close_code);
            if (rc == 0)
                *used = pos + header_len + (size_t)payload_len;
            return rc;
        }

        if (opcode != RT_WS_OP_CONT)
            st->message_len = 0;
        if (st->message_len > max_message || payload_len > max_message - st->message_len) {
            *close_code = RT_WS_CLOSE_TOO_BIG;
            return RT_EPROTO;
        }
        st->message_len += (uint32_t)payload_len;
        st->in_message = !(h[0] & 0x80);
        memcpy(st->mask, mask, 4);
        st->mask_off = 0;
        st->remaining = (uint32_t)payload_len;
        st->in_frame = payload_len != 0;
        pos += header_len;
        if (payload_len == 0 && !st->in_message) { /* an empty final frame: the message ends */
            *used = pos;
            if (st->text && st->utf8_need) {
                *close_code = RT_WS_CLOSE_INVALID;
                return RT_EPROTO;
            }
            data_event(ev, buf + pos, 0, true);
            return 0;
        }
    }
}

size_t rt_ws_frame_header(uint8_t out[10], int opcode, uint64_t len)
{
    out[0] = (uint8_t)(0x80 | opcode);
    if (len <= LEN7_MAX) {
        out[1] = (uint8_t)len;
        return 2;
    }
    if (len <= 0xFFFF) {
        out[1] = 126;
        out[2] = (uint8_t)(len >> 8);
        out[3] = (uint8_t)len;
        return 4;
    }
    out[1] = 127;
    for (int i = 0; i < 8; i++)
        out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 10;
}

/*
** The WebSocket codec (actors/transport/ws.c, ws_upgrade.c).
**
** Input: byte 0 picks where the stream is split and, by its low bit, whether messages are
** text (XMPP's, RFC 7395) or binary (MQTT's); the rest is a stream of frames. It is
** decoded whole, in two reads split there, and one byte per read, each through a buffer
** that keeps what the decoder did not consume, as a connection does: all three must give
** the same data bytes, message ends, control events and outcome, and in text mode every
** message that ends must be UTF-8. A text message refused for its UTF-8 is refused in every
** run, but how much of it came up first depends on the reads (a chunk is checked as it
** comes, and the one with the bad byte is not given): there each run's data must be a
** prefix of the byte-per-read run's, which gives the most.
** The whole input is also parsed as an upgrade request for MQTT's subprotocols and for
** XMPP's (required), whose answer must be consistent with what it returned, and as a
** request to the HTTP listener (http_request.c, the same parser library), whose parts must
** lie within the input and its bounds.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "http_request.h"
#include "ws.h"

#define MAX_MESSAGE 1000

static const rt_ws_protocols_t mqtt_protos = {.names = {"mqtt", "mqttv3.1"}};
static const rt_ws_protocols_t xmpp_protos = {.names = {"xmpp"}, .required = true};

typedef struct {
    uint8_t *data; /* malloc: the data bytes in order */
    size_t data_len;
    uint64_t ends_digest;  /* of where messages ended (data_len then) */
    uint64_t event_digest; /* of the control events: kind, close code, payload */
    int rc;                /* 0, or the error that ended the stream */
    uint16_t close_code;   /* with rc */
    size_t left;           /* bytes never consumed */
} outcome_t;

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Reads first bytes, then reads of `then` bytes (0: all that is left). */
static outcome_t run(const uint8_t *stream, size_t n, size_t first, size_t then, bool text)
{
    outcome_t o = {.data = malloc(n + 1),
                   .ends_digest = 1469598103934665603ull,
                   .event_digest = 1469598103934665603ull};
    uint8_t *pending = malloc(n + 1);
    uint8_t message[MAX_MESSAGE]; /* the current message's bytes so far */
    size_t have = 0, off = 0, message_len = 0;
    rt_ws_in_t st = {.text = text};
    while (off < n) {
        size_t c = off == 0 ? first : then;
        if (c == 0 || c > n - off)
            c = n - off;
        memcpy(pending + have, stream + off, c);
        have += c;
        off += c;
        for (;;) {
            size_t used;
            rt_ws_event_t ev;
            uint16_t code = 0;
            int rc = rt_ws_decode(&st, pending, have, MAX_MESSAGE, &used, &ev, &code);
            if (used > have)
                abort();
            if (rc != 0 && rc != RT_EAGAIN) {
                if (rc != RT_EPROTO || code < 1000)
                    abort();
                o.rc = rc;
                o.close_code = code;
                free(pending);
                return o;
            }
            if (rc == RT_EAGAIN) {
                if (!st.closed && have - used >= RT_WS_HEADER_MAX + RT_WS_CONTROL_MAX)
                    abort();
                memmove(pending, pending + used, have - used);
                have -= used;
                break;
            }
            if (ev.data < pending || ev.data + ev.len > pending + used)
                abort();
            if (ev.kind == RT_WS_EV_DATA) {
                if ((ev.len == 0 && !ev.last) || message_len + ev.len > MAX_MESSAGE)
                    abort();
                memcpy(o.data + o.data_len, ev.data, ev.len);
                o.data_len += ev.len;
                memcpy(message + message_len, ev.data, ev.len);
                message_len += ev.len;
                if (ev.last) {
                    for (size_t i = 0, k; text && i < message_len; i += k)
                        if ((k = rt_utf8_len(message + i, message_len - i)) == 0)
                            abort();
                    o.ends_digest =
                        fnv(o.ends_digest, (const uint8_t *)&o.data_len, sizeof o.data_len);
                    message_len = 0;
                }
            } else {
                if (ev.last)
                    abort();
                uint8_t head[3] = {(uint8_t)ev.kind, (uint8_t)(ev.close_code >> 8),
                                   (uint8_t)ev.close_code};
                if (ev.len > RT_WS_CONTROL_MAX)
                    abort();
                o.event_digest = fnv(fnv(o.event_digest, head, 3), ev.data, ev.len);
            }
            memmove(pending, pending + used, have - used);
            have -= used;
        }
    }
    o.left = have;
    free(pending);
    return o;
}

static void upgrade(const uint8_t *data, size_t size, const rt_ws_protocols_t *protos)
{
    rt_ws_upgrade_t u;
    size_t head_len = 0;
    const char *why = NULL;
    char answer[1024];
    int rc = rt_ws_parse_upgrade(data, size, "/mqtt", protos, &head_len, &u, &why);
    if (!why)
        abort();
    if (rc == 0) {
        if (head_len > size || head_len > RT_WS_HEAD_MAX || strlen(u.accept) != 28 ||
            strlen(u.forwarded_for) >= sizeof u.forwarded_for)
            abort();
        bool named = false;
        for (size_t i = 0; i < sizeof protos->names / sizeof *protos->names && protos->names[i];
             i++)
            named |= strcmp(u.subprotocol, protos->names[i]) == 0;
        if (!named && (protos->required || u.subprotocol[0]))
            abort();
        if (rt_ws_upgrade_response(&u, answer, sizeof answer) == 0)
            abort();
    } else if (rc == RT_EAGAIN) {
        if (size >= RT_WS_HEAD_MAX)
            abort();
    } else {
        if ((rc != 400 && rc != 404 && rc != 426) || !why[0])
            abort();
        if (rt_ws_error_response(rc, answer, sizeof answer) == 0)
            abort();
    }
}

static void http_request(const uint8_t *data, size_t size)
{
    rt_http_request_t r;
    const char *why = NULL;
    int rc = rt_http_parse_request(data, size, 1024, &r, &why);
    if (rc == 0) {
        if (r.len > size || r.body_off + r.body_len > r.len || r.body_len > 1024 || !r.method[0] ||
            strlen(r.target) >= sizeof r.target || strlen(r.api_key) >= sizeof r.api_key)
            abort();
    } else if (rc == RT_EAGAIN) {
        if (size > RT_HTTP_HEAD_MAX + 1024)
            abort();
    } else if (rc < 400 || rc > 505 || !why || !why[0]) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    upgrade(data, size, &mqtt_protos);
    upgrade(data, size, &xmpp_protos);
    http_request(data, size);
    if (size < 1)
        return 0;
    const uint8_t *stream = data + 1;
    size_t n = size - 1;
    size_t split = n * data[0] / 256;
    bool text = data[0] & 1;
    outcome_t whole = run(stream, n, n, 0, text);
    outcome_t two = run(stream, n, split, 0, text);
    outcome_t bytes = run(stream, n, 1, 1, text);
    bool utf8_refused = text && bytes.rc && bytes.close_code == RT_WS_CLOSE_INVALID;
    const outcome_t *others[2] = {&whole, &two};
    for (int i = 0; i < 2; i++) {
        const outcome_t *o = others[i];
        if (o->ends_digest != bytes.ends_digest || o->event_digest != bytes.event_digest ||
            o->rc != bytes.rc || o->close_code != bytes.close_code || o->left != bytes.left)
            abort();
        if (utf8_refused ? o->data_len > bytes.data_len : o->data_len != bytes.data_len)
            abort();
        if (memcmp(o->data, bytes.data, o->data_len) != 0)
            abort();
    }
    free(whole.data);
    free(two.data);
    free(bytes.data);
    return 0;
}

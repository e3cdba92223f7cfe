/*
** The WebSocket codec (actors/transport/ws.c, ws_upgrade.c).
**
** Input: byte 0 picks where the stream is split, the rest is a stream of frames. It is
** decoded whole, in two reads split there, and one byte per read, each through a buffer
** that keeps what the decoder did not consume, as a connection does: all three must give
** the same data bytes, control events and outcome. The whole input is also parsed as an
** upgrade request, whose answer must be consistent with what it returned, and as a request
** to the HTTP listener (http_request.c, the same parser library), whose parts must lie
** within the input and its bounds.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "http_request.h"
#include "ws.h"

#define MAX_MESSAGE 1000

typedef struct {
    uint64_t data_digest;  /* of the data bytes in order */
    uint64_t event_digest; /* of the control events: kind, close code, payload */
    size_t data_len;
    int rc;              /* 0, or the error that ended the stream */
    uint16_t close_code; /* with rc */
    size_t left;         /* bytes never consumed */
} outcome_t;

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Reads first bytes, then reads of `then` bytes (0: all that is left). */
static outcome_t run(const uint8_t *stream, size_t n, size_t first, size_t then)
{
    outcome_t o = {.data_digest = 1469598103934665603ull, .event_digest = 1469598103934665603ull};
    uint8_t *pending = malloc(n + 1);
    size_t have = 0, off = 0;
    rt_ws_in_t st = {0};
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
                if (ev.len == 0)
                    abort();
                o.data_digest = fnv(o.data_digest, ev.data, ev.len);
                o.data_len += ev.len;
            } else {
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

static void upgrade(const uint8_t *data, size_t size)
{
    rt_ws_upgrade_t u;
    size_t head_len = 0;
    const char *why = NULL;
    char answer[1024];
    int rc = rt_ws_parse_upgrade(data, size, "/mqtt", &head_len, &u, &why);
    if (!why)
        abort();
    if (rc == 0) {
        if (head_len > size || head_len > RT_WS_HEAD_MAX || strlen(u.accept) != 28 ||
            strlen(u.forwarded_for) >= sizeof u.forwarded_for)
            abort();
        if (strcmp(u.subprotocol, "") && strcmp(u.subprotocol, "mqtt") &&
            strcmp(u.subprotocol, "mqttv3.1"))
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
    upgrade(data, size);
    http_request(data, size);
    if (size < 1)
        return 0;
    const uint8_t *stream = data + 1;
    size_t n = size - 1;
    size_t split = n * data[0] / 256;
    outcome_t whole = run(stream, n, n, 0);
    outcome_t two = run(stream, n, split, 0);
    outcome_t bytes = run(stream, n, 1, 1);
    const outcome_t *others[2] = {&two, &bytes};
    for (int i = 0; i < 2; i++) {
        const outcome_t *o = others[i];
        if (o->data_digest != whole.data_digest || o->data_len != whole.data_len ||
            o->event_digest != whole.event_digest || o->rc != whole.rc ||
            o->close_code != whole.close_code || o->left != whole.left)
            abort();
    }
    return 0;
}

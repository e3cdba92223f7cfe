/*
** `trace client ID` and `trace topic FILTER`: the one streaming answer of the command layer.
** The asking actor (an rtctl connection, an HTTP API stream) becomes the trace's tracer
** (trace.h); each event it receives is answered as a 206 part (one line of text, or one JSON
** object on a line), a tick every second sends an empty 206 part or the count of events
** dropped since the last (so a client knows the trace is alive and what it missed), and the
** end (--duration passed, or the asker went) is the final 200 part: what was sent and dropped.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin_impl.h"
#include "mqtt_codec.h"
#include "trace.h"

#define TRACE_TICK_MS 1000
#define TRACE_DURATION_DEFAULT 60
#define TRACE_DURATION_MAX 86400

struct rt_admin_trace_s {
    rt_trace_t *t;
    rt_pid_t tracer; /* the asking actor, whose ticks these are */
    rt_trace_kind_t kind;
    bool json;
    uint32_t payload_max;
    uint64_t until_ms;   /* monotonic */
    uint64_t shown;        /* events passed on */
    uint64_t dropped_here; /* events not passed on: the reader was behind */
    uint64_t dropped_told;
    char what[];
};

static const char *type_name(uint8_t type)
{
    static const char *const names[16] = {
        "RESERVED", "CONNECT",   "CONNACK",     "PUBLISH",  "PUBACK", "PUBREC",
        "PUBREL",   "PUBCOMP",   "SUBSCRIBE",   "SUBACK",   "UNSUBSCRIBE",
        "UNSUBACK", "PINGREQ",   "PINGRESP",    "DISCONNECT", "AUTH"};
    return names[type & 15];
}

int rt__admin_trace(rt_admin_cmd_t *c)
{
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: trace client ID | trace topic FILTER "
                                      "[--duration S] [--payload N]");
    long duration, payload;
    if (rt__admin_opt_long(c, "duration", TRACE_DURATION_DEFAULT, 1, TRACE_DURATION_MAX,
                           &duration) ||
        rt__admin_opt_long(c, "payload", 0, 0, RT_TRACE_PAYLOAD_MAX, &payload))
        return c->code;
    rt_trace_kind_t kind = strcmp(c->argv[1], "client") == 0 ? RT_TRACE_CLIENT : RT_TRACE_TOPIC;
    size_t len = c->arglen[2];
    rt_admin_trace_t *tr = malloc(sizeof(*tr) + len + 1);
    if (!tr)
        return rt__admin_fail(c, 500, "out of memory");
    *tr = (rt_admin_trace_t){.tracer = rt_self(c->self),
                             .kind = kind,
                             .json = c->json,
                             .payload_max = (uint32_t)payload,
                             .until_ms = rt_mono_ms() + (uint64_t)duration * 1000};
    memcpy(tr->what, c->argv[2], len);
    tr->what[len] = 0;
    int rc = rt_trace_start(kind, c->argv[2], len, (uint32_t)payload, rt_self(c->self), &tr->t);
    if (rc) {
        free(tr);
        if (rc == RT_EBUSY)
            return rt__admin_fail(c, 503, "%d traces are on already: end one first",
                                  RT_TRACE_MAX);
        if (rc == RT_EINVAL)
            return rt__admin_fail(c, 400, "not a %s: \"%s\"",
                                  kind == RT_TRACE_CLIENT ? "client id" : "topic filter",
                                  c->argv[2]);
        return rt__admin_fail(c, 500, "out of memory");
    }
    c->trace = tr;
    c->code = 0; /* answered in parts, by rt__admin_trace_message */
    if (c->json) {
        rt_buf_add(&c->text, "{\"event\":\"started\",\"kind\":", 26);
        rt_buf_json_str(&c->text, c->argv[1], strlen(c->argv[1]));
        rt_buf_add(&c->text, ",\"what\":", 8);
        rt_buf_json_str(&c->text, c->argv[2], len);
        rt_buf_printf(&c->text, ",\"duration\":%ld,\"payload\":%ld}\n", duration, payload);
    } else {
        rt_buf_printf(&c->text, "# tracing %s \"%s\" for %ld s%s\n", c->argv[1], c->argv[2],
                      duration, payload ? ", with payloads" : "");
    }
    return 0;
}

/* ---- One event ---- */

void rt__admin_quote_bytes(rt_buf_t *b, const uint8_t *p, size_t n)
{
    rt_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '"' || p[i] == '\\')
            rt_buf_printf(b, "\\%c", p[i]);
        else if (p[i] >= 0x20 && p[i] < 0x7f)
            rt_buf_add(b, p + i, 1);
        else
            rt_buf_printf(b, "\\x%02x", p[i]);
    }
    rt_buf_add(b, "\"", 1);
}

/*
** A payload in JSON: a string when it is UTF-8 (its cut may split the last character, which is
** then left out), else its bytes in hex.
*/
static void add_json_payload(rt_buf_t *b, const uint8_t *p, size_t n, bool cut)
{
    for (size_t drop = 0; drop <= (cut ? 3u : 0u) && drop <= n; drop++)
        if (mqtt_utf8_valid(p, n - drop)) {
            rt_buf_add(b, ",\"payload\":", 11);
            rt_buf_json_str(b, (const char *)p, n - drop);
            return;
        }
    rt_buf_add(b, ",\"payload_hex\":\"", 16);
    for (size_t i = 0; i < n; i++)
        rt_buf_printf(b, "%02x", p[i]);
    rt_buf_add(b, "\"", 1);
}

static void add_time(rt_buf_t *b, uint64_t unix_us)
{
    char when[32];
    rt__admin_iso_time(unix_us / 1000, when, sizeof(when));
    /* "...SSZ" -> "...SS.uuuuuuZ" */
    size_t n = strlen(when);
    rt_buf_printf(b, "%.*s.%06uZ", (int)(n - 1), when, (unsigned)(unix_us % 1000000));
}

/* An XMPP session's bytes: their first tag, and as many as --payload asked for. */
static void format_xmpp_json(rt_buf_t *b, const rt_trace_event_t *ev, const uint8_t *tag,
                             const uint8_t *payload)
{
    rt_buf_printf(b, ",\"dir\":\"%s\",\"protocol\":\"xmpp\",\"size\":%u,\"tag\":",
                  ev->dir ? "out" : "in", ev->size);
    rt_buf_json_str(b, (const char *)tag, ev->names_len);
    if (ev->shown_len) {
        add_json_payload(b, payload, ev->shown_len, ev->shown_len < ev->payload_len);
        rt_buf_printf(b, ",\"payload_truncated\":%s",
                      ev->shown_len < ev->payload_len ? "true" : "false");
    }
    rt_buf_add(b, "}\n", 2);
}

static void format_json(rt_buf_t *b, const rt_trace_event_t *ev, const uint8_t *client,
                        const uint8_t *names, const uint8_t *payload)
{
    rt_buf_add(b, "{\"event\":\"packet\",\"time\":\"", 26);
    add_time(b, ev->unix_us);
    rt_buf_add(b, "\",\"client\":", 11);
    rt_buf_json_str(b, (const char *)client, ev->client_len);
    if (ev->xmpp) {
        format_xmpp_json(b, ev, names, payload);
        return;
    }
    rt_buf_printf(b, ",\"dir\":\"%s\",\"type\":\"%s\",\"size\":%u", ev->dir ? "out" : "in",
                  type_name(ev->type), ev->size);
    if (ev->error)
        rt_buf_printf(b, ",\"error\":%u", ev->error);
    if (ev->packet_id)
        rt_buf_printf(b, ",\"packet_id\":%u", ev->packet_id);
    if (ev->has_reason)
        rt_buf_printf(b, ",\"reason_code\":%u", ev->reason);
    switch (ev->type) {
    case MQTT_CONNECT:
        if (!ev->error)
            rt_buf_printf(b, ",\"version\":%u,\"keepalive\":%u,\"clean_start\":%s", ev->version,
                          ev->keepalive, ev->clean_start ? "true" : "false");
        break;
    case MQTT_CONNACK:
        rt_buf_printf(b, ",\"session_present\":%s", ev->session_present ? "true" : "false");
        break;
    case MQTT_PUBLISH:
        rt_buf_printf(b, ",\"qos\":%u,\"retain\":%s,\"dup\":%s", (ev->flags >> 1) & 3,
                      ev->flags & 1 ? "true" : "false", ev->flags & 8 ? "true" : "false");
        if (ev->error)
            break;
        rt_buf_add(b, ",\"topic\":", 9);
        rt_buf_json_str(b, (const char *)names, ev->names_len);
        if (ev->topic_alias)
            rt_buf_add(b, ",\"topic_alias\":true", 19);
        rt_buf_printf(b, ",\"payload_size\":%u", ev->payload_len);
        if (ev->shown_len) {
            add_json_payload(b, payload, ev->shown_len, ev->shown_len < ev->payload_len);
            rt_buf_printf(b, ",\"payload_truncated\":%s",
                          ev->shown_len < ev->payload_len ? "true" : "false");
        }
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE: {
        rt_buf_add(b, ",\"filters\":[", 12);
        const uint8_t *f = names;
        for (unsigned i = 0; f < names + ev->names_len; i++) {
            size_t n = strlen((const char *)f);
            rt_buf_add(b, i ? ",{\"filter\":" : "{\"filter\":", i ? 11 : 10);
            rt_buf_json_str(b, (const char *)f, n);
            if (ev->type == MQTT_SUBSCRIBE && i < ev->ncodes)
                rt_buf_printf(b, ",\"qos\":%u,\"options\":%u", ev->codes[i] & 3, ev->codes[i]);
            rt_buf_add(b, "}", 1);
            f += n + 1;
        }
        rt_buf_add(b, "]", 1);
        break;
    }
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        rt_buf_add(b, ",\"reason_codes\":[", 17);
        for (unsigned i = 0; i < ev->ncodes; i++)
            rt_buf_printf(b, i ? ",%u" : "%u", ev->codes[i]);
        rt_buf_add(b, "]", 1);
        break;
    default:
        break;
    }
    rt_buf_add(b, "}\n", 2);
}

static void format_text(rt_buf_t *b, const rt_trace_event_t *ev, const uint8_t *client,
                        const uint8_t *names, const uint8_t *payload)
{
    add_time(b, ev->unix_us);
    rt_buf_printf(b, " %-3s ", ev->dir ? "out" : "in");
    rt__admin_quote_bytes(b, client, ev->client_len);
    if (ev->xmpp) {
        rt_buf_add(b, " xmpp ", 6);
        rt__admin_quote_bytes(b, names, ev->names_len);
        rt_buf_printf(b, " size=%u", ev->size);
        if (ev->shown_len) {
            rt_buf_add(b, " payload=", 9);
            rt__admin_quote_bytes(b, payload, ev->shown_len);
            if (ev->shown_len < ev->payload_len)
                rt_buf_add(b, "...", 3);
        }
        rt_buf_add(b, "\n", 1);
        return;
    }
    rt_buf_printf(b, " %s", type_name(ev->type));
    if (ev->packet_id)
        rt_buf_printf(b, " id=%u", ev->packet_id);
    switch (ev->type) {
    case MQTT_CONNECT:
        if (!ev->error)
            rt_buf_printf(b, " version=%u keepalive=%u clean_start=%u", ev->version,
                          ev->keepalive, ev->clean_start);
        break;
    case MQTT_CONNACK:
        rt_buf_printf(b, " session_present=%u", ev->session_present);
        break;
    case MQTT_PUBLISH:
        rt_buf_printf(b, " qos=%u", (ev->flags >> 1) & 3);
        if (ev->flags & 1)
            rt_buf_add(b, " retain", 7);
        if (ev->flags & 8)
            rt_buf_add(b, " dup", 4);
        if (ev->error)
            break;
        rt_buf_add(b, " topic=", 7);
        rt__admin_quote_bytes(b, names, ev->names_len);
        if (ev->topic_alias)
            rt_buf_add(b, " (alias)", 8);
        rt_buf_printf(b, " payload_size=%u", ev->payload_len);
        if (ev->shown_len) {
            rt_buf_add(b, " payload=", 9);
            rt__admin_quote_bytes(b, payload, ev->shown_len);
            if (ev->shown_len < ev->payload_len)
                rt_buf_add(b, "...", 3);
        }
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE: {
        const uint8_t *f = names;
        for (unsigned i = 0; f < names + ev->names_len; i++) {
            size_t n = strlen((const char *)f);
            rt_buf_add(b, " filter=", 8);
            rt__admin_quote_bytes(b, f, n);
            if (ev->type == MQTT_SUBSCRIBE && i < ev->ncodes)
                rt_buf_printf(b, ":qos%u", ev->codes[i] & 3);
            f += n + 1;
        }
        break;
    }
    case MQTT_SUBACK:
    case MQTT_UNSUBACK:
        rt_buf_add(b, " codes=", 7);
        for (unsigned i = 0; i < ev->ncodes; i++)
            rt_buf_printf(b, i ? ",0x%02x" : "0x%02x", ev->codes[i]);
        if (ev->codes_total > ev->ncodes)
            rt_buf_add(b, ",...", 4);
        break;
    default:
        break;
    }
    if (ev->has_reason)
        rt_buf_printf(b, " reason=0x%02x", ev->reason);
    if (ev->error)
        rt_buf_printf(b, " error=0x%02x", ev->error);
    rt_buf_printf(b, " size=%u\n", ev->size);
}

/* ---- The stream ---- */

static void answer(rt_buf_t *b, int code, rt_admin_answer_fn fn, void *ctx)
{
    if (b->oom)
        fn(ctx, 500, "out of memory\n", 14);
    else
        fn(ctx, code, b->data ? b->data : "", b->len);
    rt_buf_free(b);
}

/* A line saying how many events were lost since the last one said so (dropped: all so far). */
static void add_dropped(rt_admin_trace_t *tr, uint64_t dropped, rt_buf_t *b)
{
    if (dropped == tr->dropped_told)
        return;
    if (tr->json)
        rt_buf_printf(b, "{\"event\":\"dropped\",\"dropped\":%llu,\"dropped_total\":%llu}\n",
                      (unsigned long long)(dropped - tr->dropped_told),
                      (unsigned long long)dropped);
    else
        rt_buf_printf(b, "# dropped %llu events (%llu in all): the reader is behind\n",
                      (unsigned long long)(dropped - tr->dropped_told),
                      (unsigned long long)dropped);
    tr->dropped_told = dropped;
}

void rt__admin_trace_begin(rt_admin_exec_t *x)
{
    rt_send_after_tag(TRACE_TICK_MS, x->trace->tracer, RT_ADMIN_MSG_TRACE_TICK, &x->timer);
}

bool rt__admin_trace_message(rt_admin_exec_t *x, rt_msg_t *m, rt_admin_answer_fn fn, void *ctx)
{
    rt_admin_trace_t *tr = x->trace;
    rt_buf_t b = {0};
    if (m->tag == RT_TRACE_MSG_EVENT) {
        rt_trace_event_t ev;
        if (m->len < sizeof(ev))
            return false;
        memcpy(&ev, m->data, sizeof(ev));
        if (ev.trace_id != rt_trace_id(tr->t))
            return false; /* sent for a trace this actor ran before */
        rt_trace_taken(tr->t, m->len);
        if (x->sock && rt_sock_pending(x->sock) > RT_ADMIN_OUT_MAX) {
            tr->dropped_here++;
            return false;
        }
        tr->shown++;
        const uint8_t *client = (const uint8_t *)m->data + sizeof(ev);
        const uint8_t *names = client + ev.client_len;
        const uint8_t *payload = names + ev.names_len;
        if (tr->json)
            format_json(&b, &ev, client, names, payload);
        else
            format_text(&b, &ev, client, names, payload);
        answer(&b, 206, fn, ctx);
        return false;
    }
    if (m->tag != RT_ADMIN_MSG_TRACE_TICK)
        return false;
    x->timer = 0;
    if (rt_mono_ms() < tr->until_ms) {
        /* A tick runs while the tracer's socket is under pressure (its own timer): it writes
           nothing then, or a reader stopped for hours would grow the buffer by its notes. */
        if (!x->sock || rt_sock_pending(x->sock) <= RT_ADMIN_OUT_MAX) {
            uint64_t seen, dropped_there;
            rt_trace_counts(tr->t, &seen, &dropped_there);
            add_dropped(tr, dropped_there + tr->dropped_here, &b);
            answer(&b, 206, fn, ctx); /* empty: the trace is alive */
        }
        rt__admin_trace_begin(x);
        return false;
    }
    /* What was not shown is lost: dropped on the way or here, or still waiting in the mailbox
       behind this tick (a tracer under socket pressure takes its timers first). */
    x->trace = NULL;
    uint64_t seen = rt_trace_stop(tr->t), shown = tr->shown;
    add_dropped(tr, seen - shown, &b);
    if (tr->json)
        rt_buf_printf(&b, "{\"event\":\"ended\",\"events\":%llu,\"dropped\":%llu}\n",
                      (unsigned long long)shown, (unsigned long long)(seen - shown));
    else
        rt_buf_printf(&b, "# trace ended: %llu events, %llu dropped\n", (unsigned long long)shown,
                      (unsigned long long)(seen - shown));
    free(tr);
    x->cookie = 0;
    answer(&b, 200, fn, ctx);
    return true;
}

void rt__admin_trace_end(rt_admin_exec_t *x)
{
    if (!x->trace)
        return;
    rt_trace_stop(x->trace->t);
    free(x->trace);
    x->trace = NULL;
}

/*
** The republish sink driver: renders a topic and a payload from each row and
** publishes them through the broker (rt_broker_publish), as if a client had.
** Templates take ${field} from the row (dotted paths reach into nested
** documents: ${meta.site}, or into a field holding JSON text: ${payload.sensor}); a
** missing field renders as nothing. Strings render as
** they are, binary as its raw bytes, other values as in rt__sink_text. Without a
** payload template the payload is the whole row as JSON. A rule's options
** (topic, payload, qos, retain) override the sink's. No database, no spill: the
** actor runs on a scheduler.
*/
#include <bson/bson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "sink_impl.h"

typedef struct rp_s {
    char topic[RT_CONF_VALUE_LEN];
    char payload[RT_CONF_VALUE_LEN];
    bool has_payload;
    int qos;
    bool retain;
    rt_buf_t out; /* rendering scratch: the topic, then the payload */
} rp_t;

static const rt_setting_t republish_keys[] = {
    /* Published as they come: a batch is only what has arrived, written at once. */
    {.name = "sinks.<name>(republish).batch",
     .type = RT_SET_INT,
     .num = 100,
     .unit = "rows",
     .min = 1,
     .max = 100000,
     .doc = "per write (a republish sink's default)"},
    {.name = "sinks.<name>(republish).flush_ms",
     .type = RT_SET_INT,
     .num = 0,
     .unit = "ms",
     .min = 0,
     .max = 3600000,
     .doc = "before a partial batch is written (a republish sink's default)"},
    {.name = "sinks.<name>(republish).topic",
     .type = RT_SET_STRING,
     .doc = "topic template, e.g. \"out/${clientid}\" (required)"},
    {.name = "sinks.<name>(republish).payload",
     .type = RT_SET_STRING,
     .doc = "payload template, e.g. \"${payload}\"; not set: the row as JSON"},
    {.name = "sinks.<name>(republish).qos",
     .type = RT_SET_INT,
     .num = 0,
     .min = 0,
     .max = 2,
     .doc = "the QoS it publishes at"},
    {.name = "sinks.<name>(republish).retain", .type = RT_SET_BOOL, .doc = "publish retained"},
    {.name = NULL},
};

static void rp_free(rt_sink_t *s)
{
    rp_t *p = s->drv_state;
    if (p)
        rt_buf_free(&p->out);
    free(p);
    s->drv_state = NULL;
}

static int rp_configure(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    const rt_conf_kv_t *topic = rt__sink_kv(sec, "topic");
    if (!topic || !topic->str[0] || !rt__sink_template_ok(topic->str, strlen(topic->str))) {
        snprintf(why, whylen,
                 "topic is required: a template such as \"out/${clientid}\" "
                 "(every ${ closed by })");
        return RT_EINVAL;
    }
    const rt_conf_kv_t *payload = rt__sink_kv(sec, "payload");
    if (payload && !rt__sink_template_ok(payload->str, strlen(payload->str))) {
        snprintf(why, whylen, "payload: every ${ must be closed by }");
        return RT_EINVAL;
    }
    rp_t *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    snprintf(p->topic, sizeof(p->topic), "%s", topic->str);
    if (payload) {
        p->has_payload = true;
        snprintf(p->payload, sizeof(p->payload), "%s", payload->str);
    }
    const rt_conf_kv_t *kv = rt__sink_kv(sec, "qos");
    p->qos = kv ? (int)kv->num : 0;
    kv = rt__sink_kv(sec, "retain");
    p->retain = kv && kv->b;
    s->drv_state = p;
    return 0;
}

static int rp_write(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    rp_t *p = s->drv_state;
    if (!rt_broker) {
        rt__sink_error(s, "the broker is not running");
        return RT_EAGAIN;
    }
    for (size_t i = 0; i < n; i++) {
        sink_row_t *r = &rows[i];
        bson_t doc, opts;
        bson_iter_t it;
        if (!bson_init_static(&doc, r->doc, r->len) || !bson_iter_init(&it, &doc)) {
            rt__sink_error(s, "row rejected: malformed BSON");
            r->status = RT_EINVAL;
            continue;
        }
        const char *topic = p->topic, *payload = p->has_payload ? p->payload : NULL;
        uint32_t topic_len = (uint32_t)strlen(topic);
        uint32_t payload_len = payload ? (uint32_t)strlen(payload) : 0;
        int qos = p->qos;
        bool retain = p->retain;
        if (r->opts_len && bson_init_static(&opts, r->opts, r->opts_len)) {
            const char *v;
            if ((v = rt__sink_opt_str(r, "topic", &topic_len)))
                topic = v;
            else
                topic_len = (uint32_t)strlen(topic);
            if ((v = rt__sink_opt_str(r, "payload", &payload_len)))
                payload = v;
            else
                payload_len = payload ? (uint32_t)strlen(payload) : 0;
            if (bson_iter_init_find(&it, &opts, "qos") && BSON_ITER_HOLDS_NUMBER(&it))
                qos = (int)bson_iter_as_int64(&it);
            if (bson_iter_init_find(&it, &opts, "retain"))
                retain = bson_iter_as_bool(&it);
        }
        rt_buf_t *out = &p->out;
        rt_buf_truncate(out, 0); /* the buffer is reused from row to row */
        rt__sink_render(out, topic, topic_len, &doc);
        size_t tl = out->len;
        bool ok = true;
        if (payload) {
            rt__sink_render(out, payload, payload_len, &doc);
        } else {
            size_t jl = 0;
            char *json = bson_as_relaxed_extended_json(&doc, &jl);
            ok = json != NULL;
            if (json)
                rt_buf_add(out, json, jl);
            bson_free(json);
        }
        /* Also room for the NUL, which an empty rendering has not made: data is not NULL. */
        if (!ok || !rt_buf_reserve(out, 0)) {
            rt_buf_free(out); /* and clears oom for the next row */
            rt__sink_error(s, "out of memory");
            return RT_EAGAIN;
        }
        int rc = qos < 0 || qos > 2
                     ? RT_EINVAL
                     : rt_broker_publish(atomic_load(&s->pid), out->data, tl, out->data + tl,
                                         out->len - tl, (uint8_t)qos, retain);
        if (rc == RT_ENOMEM) {
            rt__sink_error(s, "out of memory");
            return RT_EAGAIN;
        }
        if (rc) {
            rt__sink_error(s, "row rejected: cannot publish to \"%.*s\" (qos %d): %s", (int)tl,
                           out->data, qos, rt_strerror(rc));
            r->status = rc;
        }
    }
    return 0;
}

static size_t rp_held(const rt_sink_t *s)
{
    const rp_t *p = s->drv_state;
    return sizeof(*p) + p->out.cap;
}

const sink_driver_t rt_sink_republish_driver = {
    .type = "republish",
    .blocking = false,
    .spills = false,
    .keys = republish_keys,
    .configure = rp_configure,
    .write = rp_write,
    .free = rp_free,
    .held = rp_held,
};

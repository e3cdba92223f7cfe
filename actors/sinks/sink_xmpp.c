/*
** The xmpp sink driver: each row becomes an XMPP message, to a user or to a group chat room,
** through the XMPP server's entry point (rt_sinks_set_xmpp): an MQTT rule can alert a person
** or a room. `to` and `body` are templates as the republish sink's (${field} of the row);
** without a body template the body is the row as JSON. A rule's options (to, body) override
** the sink's. A user's message is a chat from `from`, sent to the user's available sessions or
** kept offline; a room's is a groupchat from room/nick that every occupant gets, kept in the
** room's history and archive. No database, no spill: the actor runs on a scheduler.
*/
#include <bson/bson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sink_impl.h"

typedef struct xs_s {
    char to[RT_CONF_VALUE_LEN];
    char body[RT_CONF_VALUE_LEN];
    char from[RT_CONF_VALUE_LEN];
    char nick[RT_CONF_VALUE_LEN];
    char type[RT_CONF_VALUE_LEN];
    bool has_body;
    rt_buf_t out; /* rendering scratch: the JID, NUL, then the body */
} xs_t;

static _Atomic(rt_sink_xmpp_fn) xmpp_send;

void rt_sinks_set_xmpp(rt_sink_xmpp_fn fn)
{
    atomic_store(&xmpp_send, fn);
}

static const char *const types[] = {"chat", "normal", "headline", NULL};

static const rt_setting_t xmpp_keys[] = {
    {.name = "sinks.<name>(xmpp).batch",
     .type = RT_SET_INT,
     .num = 100,
     .unit = "rows",
     .min = 1,
     .max = 100000,
     .doc = "per write (an xmpp sink's default)"},
    {.name = "sinks.<name>(xmpp).flush_ms",
     .type = RT_SET_INT,
     .num = 0,
     .unit = "ms",
     .min = 0,
     .max = 3600000,
     .doc = "before a partial batch is written (an xmpp sink's default)"},
    {.name = "sinks.<name>(xmpp).to",
     .type = RT_SET_STRING,
     .doc = "the JID a row goes to, a template: a user (\"ops@example.org\") or a group chat "
            "room (\"alerts@conference.example.org\") (required)"},
    {.name = "sinks.<name>(xmpp).body",
     .type = RT_SET_STRING,
     .doc = "body template, e.g. \"${sensor}: ${temp}\"; not set: the row as JSON"},
    {.name = "sinks.<name>(xmpp).from",
     .type = RT_SET_STRING,
     .doc = "the JID a user's message comes from; not set: the user's own domain"},
    {.name = "sinks.<name>(xmpp).nick",
     .type = RT_SET_STRING,
     .doc = "the nick a room's message comes from (room/nick); not set: the sink's name"},
    {.name = "sinks.<name>(xmpp).message_type",
     .type = RT_SET_STRING,
     .text = "chat",
     .choices = types,
     .doc = "a user's message type (a room's is groupchat)"},
    {.name = NULL},
};

static void xs_free(rt_sink_t *s)
{
    xs_t *x = s->drv_state;
    if (x)
        rt_buf_free(&x->out);
    free(x);
    s->drv_state = NULL;
}

static void copy_key(const rt_conf_section_t *sec, const char *key, char *out, size_t n,
                     const char *dflt)
{
    const rt_conf_kv_t *kv = rt__sink_kv(sec, key);
    snprintf(out, n, "%s", kv ? kv->str : dflt);
}

static int xs_configure(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    const rt_conf_kv_t *to = rt__sink_kv(sec, "to"), *body = rt__sink_kv(sec, "body");
    if (!to || !to->str[0] || !rt__sink_template_ok(to->str, strlen(to->str))) {
        snprintf(why, whylen,
                 "to is required: a JID or a template such as \"alerts@conference.example.org\" "
                 "(every ${ closed by })");
        return RT_EINVAL;
    }
    if (body && !rt__sink_template_ok(body->str, strlen(body->str))) {
        snprintf(why, whylen, "body: every ${ must be closed by }");
        return RT_EINVAL;
    }
    xs_t *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    copy_key(sec, "to", x->to, sizeof(x->to), "");
    copy_key(sec, "body", x->body, sizeof(x->body), "");
    x->has_body = body != NULL;
    copy_key(sec, "from", x->from, sizeof(x->from), "");
    copy_key(sec, "nick", x->nick, sizeof(x->nick), s->name);
    copy_key(sec, "message_type", x->type, sizeof(x->type), "chat");
    s->drv_state = x;
    return 0;
}

static int xs_write(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    xs_t *x = s->drv_state;
    rt_sink_xmpp_fn send = atomic_load(&xmpp_send);
    if (!send) {
        rt__sink_error(s, "the XMPP server is not running (rtd.conf has no xmpp table)");
        return RT_EAGAIN;
    }
    for (size_t i = 0; i < n; i++) {
        sink_row_t *r = &rows[i];
        bson_t doc;
        if (!bson_init_static(&doc, r->doc, r->len)) {
            rt__sink_error(s, "row rejected: malformed BSON");
            r->status = RT_EINVAL;
            continue;
        }
        const char *to = x->to, *body = x->has_body ? x->body : NULL, *v;
        uint32_t to_len = (uint32_t)strlen(to), body_len = body ? (uint32_t)strlen(body) : 0;
        if (r->opts_len && (v = rt__sink_opt_str(r, "to", &to_len)))
            to = v;
        if (r->opts_len && (v = rt__sink_opt_str(r, "body", &body_len)))
            body = v;
        rt_buf_t *out = &x->out;
        rt_buf_truncate(out, 0);
        rt__sink_render(out, to, to_len, &doc);
        rt_buf_add(out, "", 1);
        size_t at = out->len;
        if (body) {
            rt__sink_render(out, body, body_len, &doc);
        } else {
            size_t jl = 0;
            char *json = bson_as_relaxed_extended_json(&doc, &jl);
            if (json)
                rt_buf_add(out, json, jl);
            else
                out->oom = true;
            bson_free(json);
        }
        if (out->oom || !rt_buf_reserve(out, 0)) {
            rt_buf_free(out);
            rt__sink_error(s, "out of memory");
            return RT_EAGAIN;
        }
        int rc = send(out->data, x->from, x->nick, x->type, out->data + at, out->len - at);
        if (rc == RT_ENOMEM || rc == RT_ENOPROC) {
            rt__sink_error(s, "cannot send to %s now: %s", out->data, rt_strerror(rc));
            return RT_EAGAIN;
        }
        if (rc) {
            rt__sink_error(s, "row rejected: cannot send to \"%s\": %s", out->data,
                           rc == RT_ENOTFOUND ? "no such room, or a domain not served here"
                                              : rt_strerror(rc));
            r->status = rc;
        }
    }
    return 0;
}

static size_t xs_held(const rt_sink_t *s)
{
    const xs_t *x = s->drv_state;
    return sizeof(*x) + x->out.cap;
}

const sink_driver_t rt_sink_xmpp_driver = {
    .type = "xmpp",
    .blocking = false,
    .spills = false,
    .keys = xmpp_keys,
    .configure = xs_configure,
    .write = xs_write,
    .free = xs_free,
    .held = xs_held,
};

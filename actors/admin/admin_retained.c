/*
** `retained list|show|delete`: the retained store's messages, as EMQX's retainer commands show
** them. A list walks the store under its read lock (as a SUBSCRIBE to its filter does), so it
** runs on the admin worker and keeps only a page: the N smallest topics after the cursor, in
** a heap of N (rt_admin_heap_t).
*/
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "broker.h"
#include "cluster.h"
#include "message.h"
#include "route.h"

#define RETAINED_PAGE 100      /* topics a list gives unless --limit says */
#define RETAINED_PAGE_MAX 1000 /* and at most: a page copies its topics (64 KiB each at most) */

/* One message of a page, its topic copied out of the store. */
typedef struct {
    char *topic;
    size_t len;
    rt_bin_t *bin;         /* a reference of the page's */
    uint64_t expire_at_ms; /* monotonic; 0: never */
} entry_t;

typedef struct {
    const char *after; /* the cursor: topics greater in byte order only; NULL: from the first */
    size_t after_len;
    rt_admin_heap_t heap; /* entry_t: the smallest topics yet, at most the limit */
    uint64_t now_ms;
    bool oom;
} page_t;

static int topic_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

static int entry_cmp(const entry_t *a, const entry_t *b)
{
    return topic_cmp(a->topic, a->len, b->topic, b->len);
}

static void entry_free(entry_t *e)
{
    free(e->topic);
    rt_bin_release(e->bin);
}

/* A page keeps the smallest topics: the largest kept is the root. */
static bool entry_worse(const void *a, const void *b)
{
    return entry_cmp(a, b) > 0;
}

/* Under the store's read lock: keeps the message if it belongs to the page so far. */
static void page_take(void *arg, const char *topic, size_t len, void *msg)
{
    page_t *p = arg;
    const rt_retained_msg_t *m = msg;
    if (m->expire_at_ms && m->expire_at_ms <= p->now_ms)
        return; /* expired: no subscriber gets it either */
    if (p->oom || (p->after && topic_cmp(topic, len, p->after, p->after_len) <= 0))
        return;
    entry_t e = {.topic = (char *)topic, .len = len};
    if (!rt__admin_heap_wants(&p->heap, &e))
        return;
    e.topic = malloc(len + 1);
    if (!e.topic) {
        p->oom = true;
        return;
    }
    memcpy(e.topic, topic, len);
    e.topic[len] = 0;
    e.bin = rt_bin_retain(m->bin);
    e.expire_at_ms = m->expire_at_ms;
    entry_t dropped = {0};
    rt__admin_heap_put(&p->heap, &e, &dropped);
    if (dropped.topic)
        entry_free(&dropped);
}

static int by_topic(const void *a, const void *b)
{
    return entry_cmp(a, b);
}

/* Seconds a message has left (rounded up), or -1 for one that never expires. */
static int64_t seconds_left(uint64_t expire_at_ms, uint64_t now_ms)
{
    if (!expire_at_ms)
        return -1;
    return expire_at_ms > now_ms ? (int64_t)((expire_at_ms - now_ms + 999) / 1000) : 0;
}

/* The fields a list row and `show` share. */
static void message_fields(rt_doc_t *o, const rt_message_t *v, uint64_t expire_at_ms,
                           uint64_t now_ms)
{
    rt_doc_add_u64(o, "qos", v->qos);
    rt_doc_add_bytes(o, "payload_bytes", (int64_t)v->payload.len);
    if (v->clientid)
        rt_doc_add_str(o, "from_clientid", v->clientid);
    else
        rt_doc_add_null(o, "from_clientid");
    int64_t left = seconds_left(expire_at_ms, now_ms);
    if (left >= 0)
        rt_doc_add_duration(o, "expires_in_s", (uint64_t)left, 1);
    else
        rt_doc_add_null(o, "expires_in_s");
}

int rt__admin_retained_list(rt_admin_cmd_t *c)
{
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    long limit;
    if (rt__admin_opt_long(c, "limit", RETAINED_PAGE, 0, RETAINED_PAGE_MAX, &limit))
        return c->code;
    size_t flen = 1;
    const char *filter = rt__admin_opt(c, "filter", &flen);
    if (!filter) {
        filter = "#";
        flen = 1;
    }
    rt_topic_filter_t sf;
    if (rt_topic_parse_filter(filter, flen, &sf) || sf.group)
        return rt__admin_fail(c, 400, "--filter: not a topic filter (a/+/c, a/#; no $share/)");
    page_t p = {.now_ms = rt_mono_ms()};
    p.after = rt__admin_opt(c, "after", &p.after_len);
    entry_t *entries = calloc(limit ? (size_t)limit : 1, sizeof(*entries));
    if (!entries)
        return rt__admin_fail(c, 500, "out of memory");
    p.heap = (rt_admin_heap_t){entries, sizeof(*entries), 0, (size_t)limit, entry_worse};
    rt_retained_match(rt_broker->retained, filter, flen, page_take, &p, NULL);
    qsort(entries, p.heap.n, sizeof(*entries), by_topic);
    if (!p.oom && (c->doc = rt_doc_array()))
        for (size_t i = 0; i < p.heap.n; i++) {
            rt_message_t v;
            rt_message_view(entries[i].bin, &v);
            rt_doc_t *o = rt_doc_add_object(c->doc, NULL);
            rt_doc_add_strn(o, "topic", entries[i].topic, entries[i].len);
            message_fields(o, &v, entries[i].expire_at_ms, p.now_ms);
        }
    for (size_t i = 0; i < p.heap.n; i++)
        entry_free(&entries[i]);
    free(entries);
    return p.oom || !c->doc ? rt__admin_fail(c, 500, "out of memory") : 200;
}

/* The one message held for a topic (a name matches itself alone): a reference, or NULL. */
typedef struct {
    rt_bin_t *bin;
    uint64_t expire_at_ms;
} held_t;

static void hold(void *arg, const char *topic, size_t len, void *msg)
{
    (void)topic;
    (void)len;
    held_t *h = arg;
    const rt_retained_msg_t *m = msg;
    h->bin = rt_bin_retain(m->bin);
    h->expire_at_ms = m->expire_at_ms;
}

/* The topic word of `retained show|delete TOPIC`, checked; NULL with c's 400 set. */
static const char *topic_arg(rt_admin_cmd_t *c, const char *verb, size_t *len)
{
    if (c->argc != 3) {
        rt__admin_fail(c, 400, "usage: retained %s TOPIC", verb);
        return NULL;
    }
    *len = c->arglen[2];
    if (!rt_topic_valid_name(c->argv[2], *len)) {
        rt__admin_fail(c, 400, "not a topic name (no wildcards; UTF-8; 1 to 65535 bytes)");
        return NULL;
    }
    return c->argv[2];
}

int rt__admin_retained_show(rt_admin_cmd_t *c)
{
    size_t len;
    const char *topic = topic_arg(c, "show", &len);
    if (!topic)
        return c->code;
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    held_t h = {0};
    uint64_t now = rt_mono_ms();
    rt_retained_match(rt_broker->retained, topic, len, hold, &h, NULL);
    if (!h.bin || (h.expire_at_ms && h.expire_at_ms <= now)) {
        if (h.bin)
            rt_bin_release(h.bin);
        return rt__admin_fail(c, 404, "no retained message on that topic");
    }
    rt_message_t v;
    rt_message_view(h.bin, &v);
    if ((c->doc = rt_doc_object())) {
        rt_doc_add_strn(c->doc, "topic", topic, len);
        message_fields(c->doc, &v, h.expire_at_ms, now);
        if (v.username)
            rt_doc_add_str(c->doc, "from_username", v.username);
        const uint8_t *p = v.payload.p;
        size_t n = v.payload.len;
        /* Text goes to a terminal: its control bytes are escaped. */
        if (!c->json) {
            rt_buf_t quoted = {0};
            rt__admin_quote_bytes(&quoted, p, n);
            rt_doc_add_strn(c->doc, "payload", quoted.data ? quoted.data : "", quoted.len);
            rt_buf_free(&quoted);
        } else if (mqtt_utf8_valid(p, n)) {
            rt_doc_add_strn(c->doc, "payload", (const char *)p, n);
        } else {
            rt_buf_t hex = {0};
            for (size_t i = 0; i < n; i++)
                rt_buf_printf(&hex, "%02x", p[i]);
            rt_doc_add_strn(c->doc, "payload_hex", hex.data ? hex.data : "", hex.len);
            rt_buf_free(&hex);
        }
    }
    rt_bin_release(h.bin);
    return c->doc ? 200 : rt__admin_fail(c, 500, "out of memory");
}

int rt__admin_retained_delete(rt_admin_cmd_t *c)
{
    size_t len;
    const char *topic = topic_arg(c, "delete", &len);
    if (!topic)
        return c->code;
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    held_t h = {0};
    rt_retained_match(rt_broker->retained, topic, len, hold, &h, NULL);
    if (!h.bin)
        return rt__admin_fail(c, 404, "no retained message on that topic");
    rt_bin_release(h.bin);
    /* In a cluster the bucket first: every node, this one too, drops its copy as it watches;
       a bucket that refuses leaves every copy as it was. */
    char err[RT_ADMIN_ERR_MAX];
    if (rt_cluster_on() && rt_cluster_retained_delete(topic, len, err, sizeof(err)) != 0)
        return rt__admin_fail(c, 503, "not deleted: %s", err);
    int rc = rt_route_retained_delete(topic, len);
    if (rc && !rt_cluster_on())
        return rt__admin_fail(c, 404, "no retained message on that topic");
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_strn(c->doc, "deleted", topic, len);
    return 200;
}

/*
** The HTTP webhook sink driver: rows POSTed as JSON (libbson's relaxed extended JSON) to one
** URL, each row a request of its own (per_request = "row": the body is the row's object) or
** each batch one request (per_request = "batch": the body is an array of its rows), with the
** configured headers, over kept-alive connections (http_client.h).
**
** What an answer means: 2xx, the rows are delivered; no answer (refused, reset, timed out),
** 5xx, 408 and 429 are the server's trouble, so the batch is retried with the sink's backoff
** (from the spill) and nothing is dropped; any other status (4xx, and 3xx: redirects are not
** followed) is the rows' own, and those rows are rejected for good, so that an endpoint that
** refuses them cannot fill the spill.
**
** At least once: a request whose answer timed out may have been handled, and is sent again.
** A one-row batch that fails part way is retried whole, but the driver remembers which rows at
** its head were already answered and does not send them again when the retry starts with the
** same rows, which it always does (the sink keeps order).
*/
#include <bson/bson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_client.h"
#include "sink_impl.h"

#define HK_TIMEOUT_MS_DEFAULT 5000 /* one request: connect, send, the whole answer */
#define HK_KEEP_DEFAULT 1          /* idle connections kept (a sink sends one at a time) */

typedef struct hk_s {
    rt_httpc_t *http;
    bool per_batch; /* per_request = "batch" */
    rt_buf_t body;  /* the request being built; its room is kept from one write to the next */
    /* A batch sent a request per row that failed part way: the rows at its head answered. */
    uint32_t answered;      /* 0: none */
    uint64_t answered_hash; /* of their bytes: the retry must start with the same rows */
    int32_t *answered_st;   /* their statuses; s->batch entries */
    char url[RT_CONF_VALUE_LEN];
} hk_t;

static const char *const hk_per_request[] = {"row", "batch", NULL};

static const rt_setting_t http_keys[] = {
    {.name = "sinks.<name>(http).url",
     .type = RT_SET_STRING,
     .text = "",
     .doc = "the http:// or https:// URL rows are POSTed to (required)"},
    {.name = "sinks.<name>(http).headers.<header>",
     .type = RT_SET_PREFIX,
     .secret = true,
     .doc = "sent with every request: headers = { Authorization = \"Bearer ...\" }"},
    {.name = "sinks.<name>(http).per_request",
     .type = RT_SET_STRING,
     .text = "row",
     .choices = hk_per_request,
     .doc = "row: a request per row, its body the row's JSON object; batch: a request per "
            "batch, its body a JSON array of its rows"},
    {.name = "sinks.<name>(http).timeout_ms",
     .type = RT_SET_INT,
     .num = HK_TIMEOUT_MS_DEFAULT,
     .unit = "ms",
     .min = 100,
     .max = 600000,
     .doc = "a request's whole time (connect, TLS, answer); past it, it is retried"},
    {.name = "sinks.<name>(http).ca_file",
     .type = RT_SET_STRING,
     .text = "",
     .doc = "the CA an https URL's certificate is verified against; \"\": the system's"},
    {.name = "sinks.<name>(http).keep",
     .type = RT_SET_INT,
     .num = HK_KEEP_DEFAULT,
     .unit = "connections",
     .min = 0,
     .max = 64,
     .doc = "kept alive between requests; 0: a connection per request"},
    {.name = NULL},
};

static void hk_free(rt_sink_t *s)
{
    hk_t *hk = s->drv_state;
    if (!hk)
        return;
    rt_httpc_free(hk->http);
    rt_buf_free(&hk->body);
    free(hk->answered_st);
    free(hk);
    s->drv_state = NULL;
}

/* The `headers` table's entries, added to every request. */
static int add_headers(hk_t *hk, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    for (unsigned i = 0; i < sec->nkeys; i++) {
        const char *key = sec->keys[i].key;
        if (strncmp(key, "headers.", 8) != 0)
            continue;
        /* A list ({ "Name: value" }) would arrive with numbers for names. */
        if (key[8 + strspn(key + 8, "0123456789")] == 0) {
            snprintf(why, whylen, "headers are name = \"value\" (got %s = \"%s\")", key,
                     sec->keys[i].str);
            return RT_EINVAL;
        }
        int rc = rt_httpc_add_header(hk->http, key + 8, sec->keys[i].str, why, whylen);
        if (rc)
            return rc;
    }
    return 0;
}

static int hk_configure(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    const rt_conf_kv_t *url = rt__sink_kv(sec, "url");
    if (!url || !url->str[0]) {
        snprintf(why, whylen, "url is required (http://host:port/path or https://...)");
        return RT_EINVAL;
    }
    hk_t *hk = calloc(1, sizeof(*hk));
    if (hk)
        hk->answered_st = calloc(s->batch, sizeof(*hk->answered_st));
    if (!hk || !hk->answered_st) {
        free(hk);
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    s->drv_state = hk;
    snprintf(hk->url, sizeof(hk->url), "%s", url->str);
    const rt_conf_kv_t *kv = rt__sink_kv(sec, "per_request");
    hk->per_batch = kv && strcmp(kv->str, "batch") == 0;
    kv = rt__sink_kv(sec, "timeout_ms");
    uint32_t timeout = kv ? (uint32_t)kv->num : HK_TIMEOUT_MS_DEFAULT;
    kv = rt__sink_kv(sec, "keep");
    unsigned keep = kv ? (unsigned)kv->num : HK_KEEP_DEFAULT;
    kv = rt__sink_kv(sec, "ca_file");
    char err[RT_CONF_VALUE_LEN + 80];
    int rc = rt_httpc_new(hk->url, kv ? kv->str : NULL, timeout, keep, &hk->http, err, sizeof(err));
    if (rc) {
        snprintf(why, whylen, "url %s", rc == RT_ENOMEM ? "out of memory" : err);
        hk_free(s);
        return rc;
    }
    rc = add_headers(hk, sec, why, whylen);
    if (rc)
        hk_free(s);
    return rc;
}

/* Whether the endpoint takes connections (the one made is kept for the first request). */
static int hk_open(rt_sink_t *s)
{
    hk_t *hk = s->drv_state;
    char err[256];
    if (rt_httpc_connect(hk->http, err, sizeof(err)) != 0) {
        rt__sink_error(s, "%s", err);
        return RT_EAGAIN;
    }
    return 0;
}

static void hk_close(rt_sink_t *s)
{
    rt_httpc_close_idle(((hk_t *)s->drv_state)->http);
}

/* Appends row r's JSON to the body: false (the row rejected, with why) if it has none. */
static bool add_row(rt_sink_t *s, hk_t *hk, sink_row_t *r)
{
    bson_t doc;
    size_t len = 0;
    char *json =
        bson_init_static(&doc, r->doc, r->len) ? bson_as_relaxed_extended_json(&doc, &len) : NULL;
    if (!json) {
        rt__sink_error(s, "row rejected: not convertible to JSON (malformed BSON or UTF-8)");
        r->status = RT_EINVAL;
        return false;
    }
    rt_buf_add(&hk->body, json, len);
    bson_free(json);
    return true;
}

/*
** POSTs the body: 0 when the answer is 2xx; RT_EAGAIN (no answer, 5xx, 408, 429: the
** server's trouble, tried again later) or RT_EINVAL (any other status: the rows', for good),
** with s's last error set.
*/
static int post(rt_sink_t *s, hk_t *hk, size_t rows)
{
    int status = 0;
    char err[256];
    int rc = hk->body.oom ? RT_ENOMEM
                          : rt_httpc_post(hk->http, hk->body.data, hk->body.len, &status, NULL,
                                          NULL, err, sizeof(err));
    rt_buf_truncate(&hk->body, 0);
    if (rc) {
        rt__sink_error(s, "%s", rc == RT_ENOMEM ? "out of memory for a request" : err);
        return RT_EAGAIN;
    }
    if (status >= 200 && status < 300)
        return 0;
    bool again = status >= 500 || status == 408 || status == 429;
    rt__sink_error(s, "%s%s answered HTTP %d to %zu row%s%s",
                   again ? "" : "rows rejected: ", hk->url, status, rows, rows == 1 ? "" : "s",
                   again          ? " (retried)"
                   : status < 400 ? " (redirects are not followed)"
                                  : "");
    return again ? RT_EAGAIN : RT_EINVAL;
}

/* The hash of rows[0..n)'s bytes, which say what their requests held. */
static uint64_t rows_hash(const sink_row_t *rows, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = rt_hash_with(h, rows[i].doc, rows[i].len);
    return h;
}

static int write_per_row(rt_sink_t *s, hk_t *hk, sink_row_t *rows, size_t n)
{
    size_t i = 0;
    if (hk->answered && hk->answered <= n && rows_hash(rows, hk->answered) == hk->answered_hash)
        for (; i < hk->answered; i++)
            rows[i].status = hk->answered_st[i];
    hk->answered = 0;
    for (; i < n; i++) {
        if (!add_row(s, hk, &rows[i]))
            continue;
        int rc = post(s, hk, 1);
        if (rc == RT_EAGAIN) {
            hk->answered = (uint32_t)i;
            hk->answered_hash = rows_hash(rows, i);
            for (size_t j = 0; j < i; j++)
                hk->answered_st[j] = rows[j].status;
            return rc;
        }
        rows[i].status = rc;
    }
    return 0;
}

static int write_per_batch(rt_sink_t *s, hk_t *hk, sink_row_t *rows, size_t n)
{
    size_t sent = 0;
    rt_buf_add(&hk->body, "[", 1);
    for (size_t i = 0; i < n; i++) {
        size_t before = hk->body.len;
        if (sent > 0)
            rt_buf_add(&hk->body, ",", 1);
        if (add_row(s, hk, &rows[i]))
            sent++;
        else if (!hk->body.oom) /* a failed growth must stay seen */
            rt_buf_truncate(&hk->body, before);
    }
    rt_buf_add(&hk->body, "]", 1);
    if (sent == 0) { /* every row rejected already */
        rt_buf_truncate(&hk->body, 0);
        return 0;
    }
    int rc = post(s, hk, sent);
    if (rc != RT_EINVAL)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (rows[i].status == 0)
            rows[i].status = RT_EINVAL;
    return 0;
}

static int hk_write(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    hk_t *hk = s->drv_state;
    RT_ASSERT(n <= s->batch);
    return hk->per_batch ? write_per_batch(s, hk, rows, n) : write_per_row(s, hk, rows, n);
}

/* Nothing: what the sink keeps is its spill, while the endpoint does not answer. */
static void hk_retention(const rt_sink_t *s, char *text, size_t textlen, rt_sink_keeps_t *keeps)
{
    if (text)
        snprintf(text, textlen, "keeps nothing: rows are POSTed on");
}

/* The settings, the body's room and the client's own; OpenSSL's are not counted. */
static size_t hk_held(const rt_sink_t *s)
{
    const hk_t *hk = s->drv_state;
    return sizeof(*hk) + hk->body.cap + s->batch * sizeof(*hk->answered_st) +
           rt_httpc_held(hk->http);
}

const sink_driver_t rt_sink_http_driver = {
    .type = "http",
    .blocking = true,
    .spills = true,
    .keys = http_keys,
    .configure = hk_configure,
    .open = hk_open,
    .write = hk_write,
    .retention = hk_retention,
    .close = hk_close,
    .free = hk_free,
    .held = hk_held,
};

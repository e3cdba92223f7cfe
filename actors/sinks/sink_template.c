/*
** Templates of the sinks that make messages of rows (republish, xmpp): ${field} takes a field
** of the row (dotted paths reach into nested documents, ${meta.site}, or into a field holding
** JSON text, ${payload.sensor}); a missing field renders as nothing. Strings render as they
** are, binary as its raw bytes, other values as in rt__sink_text.
*/
#include <bson/bson.h>
#include <string.h>

#include "sink_impl.h"

/* Whether every ${ in t is closed by a }. */
bool rt__sink_template_ok(const char *t, size_t len)
{
    for (const char *p = t; (p = memchr(p, '$', len - (size_t)(p - t))) != NULL; p++)
        if (p + 1 < t + len && p[1] == '{' && !memchr(p, '}', len - (size_t)(p - t)))
            return false;
    return true;
}

static bool find_in_json(const bson_t *doc, const char *path, bson_t *json, bson_iter_t *found);
static void render_value(rt_buf_t *out, const bson_iter_t *found);

/* Renders template t (tlen bytes) for doc, appending to out (check out->oom after). */
void rt__sink_render(rt_buf_t *out, const char *t, size_t tlen, const bson_t *doc)
{
    const char *end = t + tlen;
    while (t < end) {
        const char *open = memchr(t, '$', (size_t)(end - t));
        if (!open || open + 1 >= end || open[1] != '{') {
            const char *stop = open ? open + 1 : end;
            rt_buf_add(out, t, (size_t)(stop - t));
            t = stop;
            continue;
        }
        rt_buf_add(out, t, (size_t)(open - t));
        const char *close = memchr(open, '}', (size_t)(end - open));
        if (!close) {
            rt_buf_add(out, open, (size_t)(end - open));
            return;
        }
        char path[256];
        size_t pl = (size_t)(close - open - 2);
        t = close + 1;
        if (pl == 0 || pl >= sizeof(path))
            continue;
        memcpy(path, open + 2, pl);
        path[pl] = 0;
        bson_iter_t it, found;
        bson_t json = BSON_INITIALIZER;
        bool have = bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &found);
        if (!have)
            have = find_in_json(doc, path, &json, &found);
        if (!have) {
            bson_destroy(&json);
            continue; /* a missing field renders as nothing */
        }
        render_value(out, &found);
        bson_destroy(&json);
    }
}

/*
** ${payload.sensor} where payload holds JSON text (a string or binary field): parses
** the field into json and finds the rest of the path there.
*/
static bool find_in_json(const bson_t *doc, const char *path, bson_t *json, bson_iter_t *found)
{
    const char *dot = strchr(path, '.');
    char head[256];
    if (!dot || (size_t)(dot - path) >= sizeof(head))
        return false;
    memcpy(head, path, (size_t)(dot - path));
    head[dot - path] = 0;
    bson_iter_t it;
    const uint8_t *text = NULL;
    uint32_t tl = 0;
    if (!bson_iter_init_find(&it, doc, head))
        return false;
    if (BSON_ITER_HOLDS_UTF8(&it)) {
        text = (const uint8_t *)bson_iter_utf8(&it, &tl);
    } else if (BSON_ITER_HOLDS_BINARY(&it)) {
        bson_subtype_t sub;
        bson_iter_binary(&it, &sub, &tl, &text);
    }
    bson_destroy(json);
    if (!text || !bson_init_from_json(json, (const char *)text, tl, NULL)) {
        bson_init(json);
        return false;
    }
    return bson_iter_init(&it, json) && bson_iter_find_descendant(&it, dot + 1, found);
}

/* Appends the text of one value: binary as its bytes, the rest as rt__sink_text. */
static void render_value(rt_buf_t *out, const bson_iter_t *found)
{
    if (BSON_ITER_HOLDS_BINARY(found)) {
        const uint8_t *data;
        uint32_t dl;
        bson_subtype_t sub;
        bson_iter_binary(found, &sub, &dl, &data);
        rt_buf_add(out, data, dl);
        return;
    }
    uint32_t vl;
    char *tmp, num[64];
    const char *v = rt__sink_text(found, &vl, &tmp, num);
    rt_buf_add(out, v, vl);
    bson_free(tmp);
}

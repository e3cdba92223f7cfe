/*
** A bridge's topic maps (bridge.h): "filter -> topic", parsed once at start and applied to
** every message that crosses.
*/
#include <stdio.h>
#include <string.h>

#include "bridge.h"
#include "topic.h"

/* s[0..*len) without the spaces around it. */
static const char *trim(const char *s, size_t *len)
{
    while (*len && (*s == ' ' || *s == '\t')) {
        s++;
        (*len)--;
    }
    while (*len && (s[*len - 1] == ' ' || s[*len - 1] == '\t'))
        (*len)--;
    return s;
}

int rt_bridge_map_parse(const char *text, rt_bridge_map_t *m, char *why, size_t whylen)
{
    memset(m, 0, sizeof(*m));
    const char *arrow = strstr(text, "->");
    size_t flen = arrow ? (size_t)(arrow - text) : strlen(text);
    const char *f = trim(text, &flen);
    const char *ferr = flen ? rt_topic_filter_error(f, flen) : "an empty filter";
    if (ferr || rt_topic_is_shared(f, flen)) {
        snprintf(why, whylen, "\"%s\": %s", text, ferr ? ferr : "a bridge takes no $share/ filter");
        return RT_EINVAL;
    }
    memcpy(m->filter, f, flen);
    m->flen = (uint16_t)flen;
    m->fixed = (uint16_t)flen;
    for (const char *p = f, *end = f + flen; p < end;) {
        const char *e = rt_topic_level_end(p, end);
        if (e - p == 1 && (*p == '+' || *p == '#')) {
            m->fixed = (uint16_t)(p - f);
            break;
        }
        p = e + 1;
    }
    if (!arrow) {
        m->keep = true;
        return 0;
    }
    size_t dlen = strlen(arrow + 2);
    const char *d = trim(arrow + 2, &dlen);
    m->tail = dlen && d[dlen - 1] == '#' && (dlen == 1 || d[dlen - 2] == '/');
    size_t prefix = m->tail ? dlen - 1 : dlen;
    /* What is left of the right side must be a topic name, or the start of one. */
    size_t named = m->tail && prefix ? prefix - 1 : prefix;
    if ((!m->tail && !dlen) || (named && !rt_topic_valid_name(d, named)) || memchr(d, '+', dlen) ||
        memchr(d, '#', prefix)) {
        snprintf(why, whylen,
                 "\"%s\": the right side is a topic, or a topic prefix ending in \"/#\"", text);
        return RT_EINVAL;
    }
    memcpy(m->dest, d, prefix);
    m->dlen = (uint16_t)prefix;
    return 0;
}

long rt_bridge_map_apply(const rt_bridge_map_t *m, const char *topic, size_t len, char *out,
                         size_t cap)
{
    if (!rt_topic_matches(m->filter, m->flen, topic, len))
        return -1;
    const char *a = topic, *b = "";
    size_t alen = len, blen = 0;
    if (!m->keep && !m->tail) {
        a = m->dest;
        alen = m->dlen;
    } else if (m->tail) {
        /* "a/#" matches "a" itself: nothing follows the fixed levels then. */
        size_t rest = len > m->fixed ? len - m->fixed : 0;
        if (rest) {
            a = m->dest;
            alen = m->dlen;
            b = topic + m->fixed;
            blen = rest;
        } else if (m->dlen) {
            a = m->dest;
            alen = m->dlen - (m->dest[m->dlen - 1] == '/');
        }
    }
    if (alen + blen <= cap) {
        memcpy(out, a, alen);
        memcpy(out + alen, b, blen);
    }
    return (long)(alen + blen);
}

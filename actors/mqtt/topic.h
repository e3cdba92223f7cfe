/*
** MQTT topic syntax, the one copy every layer uses: topic names and filters checked against
** MQTT 5 §4.7 (levels, '+', '#'), the shared-subscription form "$share/{group}/{filter}"
** (§4.8.2) taken apart, and a topic name matched against a filter (§4.7.2: a filter starting
** with a wildcard matches no topic starting with '$'). The "$share/" prefix is spelled here
** and nowhere else.
**
** Strings are byte ranges (pointer and length), never NUL-terminated, as they arrive in
** packets; nothing here allocates or copies, so the per-message path (PUBLISH decoding, the
** trie's match) may call it freely. UTF-8 well-formedness is the codec's (mqtt_utf8_valid):
** these functions check only the topic syntax, and refuse U+0000 themselves because callers
** also pass strings that never went through the codec (rule files, the ACL, admin commands).
**
** A leaf: it includes nothing of rt but the standard headers, so any layer may use it.
*/
#ifndef RT_TOPIC_H
#define RT_TOPIC_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Longest topic name or filter, bytes (MQTT's two-byte string length). */
#define RT_TOPIC_MAX_LEN 65535

/* What starts a shared subscription's filter, and its length. */
#define RT_TOPIC_SHARE "$share/"
#define RT_TOPIC_SHARE_LEN (sizeof(RT_TOPIC_SHARE) - 1)

/* A topic filter taken apart (rt_topic_parse_filter); the pointers are into the filter. */
typedef struct {
    const char *group; /* the shared subscription's ShareName; NULL when not shared */
    size_t group_len;
    const char *filter; /* the filter proper, without "$share/{group}/" */
    size_t filter_len;
} rt_topic_filter_t;

/* 1 if topic[0..len) is a topic name: 1..RT_TOPIC_MAX_LEN bytes, no '+', '#' or NUL. */
int rt_topic_valid_name(const char *topic, size_t len);

/*
** Why f[0..len) is not a plain topic filter (no "$share/" meaning given to it), or NULL if
** it is one: 1..RT_TOPIC_MAX_LEN bytes without NUL, '+' and '#' each a whole level, '#'
** only as the last. The reasons are sentences for an operator (ACL and rule files).
*/
const char *rt_topic_filter_error(const char *f, size_t len);

/*
** Why f[0..len) is not a topic filter as SUBSCRIBE carries it, or NULL with *out (may be
** NULL) set. A filter starting with "$share/" is a shared subscription: a ShareName of at
** least one byte without '+' or '#' ends at the next '/', and a plain filter follows it.
** "$share" alone or "$sharex/..." are ordinary filters.
*/
const char *rt_topic_parse_filter(const char *f, size_t len, rt_topic_filter_t *out);

static inline int rt_topic_valid_filter(const char *f, size_t len)
{
    return rt_topic_parse_filter(f, len, NULL) == NULL;
}

/*
** Whether a filter has the shared prefix; the filter is known valid (stored, or already
** checked by rt_topic_parse_filter), so a prefix is a whole "$share/{group}/{filter}".
*/
static inline bool rt_topic_is_shared(const char *f, size_t len)
{
    return len > RT_TOPIC_SHARE_LEN && memcmp(f, RT_TOPIC_SHARE, RT_TOPIC_SHARE_LEN) == 0;
}

/*
** 1 if topic name topic matches filter: a shared filter matches what its filter proper
** matches; 0 for anything else, an invalid filter or topic name included.
*/
int rt_topic_matches(const char *filter, size_t flen, const char *topic, size_t tlen);

/* The end of the level starting at p: the next '/' or end. */
static inline const char *rt_topic_level_end(const char *p, const char *end)
{
    const char *q = memchr(p, '/', (size_t)(end - p));
    return q ? q : end;
}

#endif

/*
** MQTT topics and filters as NATS subjects (docs/CLUSTER.md, "Subjects"). A topic's
** levels become tokens after the cluster's prefix; inside a level the bytes NATS gives a
** meaning to or forbids (`.`, `*`, `>`, whitespace, control bytes) and the escape byte
** `%` itself are written `%XX` (two upper-case hex digits), and an empty level, which
** NATS has no way to write, is the token `%` alone. So the mapping is one to one, and a
** subject maps back to the exact topic. A filter's `+` is `*`; `a/#` is two subjects,
** `a` and `a.>`, because MQTT's `#` also matches its parent level.
*/
#ifndef RT_CLUSTER_SUBJECT_H
#define RT_CLUSTER_SUBJECT_H

#include <stddef.h>

/*
** Longest subject rtd sends or subscribes to: nats-server refuses a protocol line past
** max_control_line (4096 bytes by default), and a subject shares that line with the
** reply subject, the sizes and the verb.
*/
#define RT_SUBJECT_MAX 3800

/* The subject of topic (valid MQTT topic name) into out; its length, or -1 if too long. */
int rt_subject_of_topic(const char *prefix, const char *topic, size_t len, char *out, size_t cap);
/*
** The subjects a filter (without a $share/group/ prefix) needs: one, or two for a filter
** ending in `/#` (its parent level, then the `.>` one). Each is NUL-terminated in its
** own buffer of cap bytes. Returns how many, or -1 if one would be too long.
*/
int rt_subjects_of_filter(const char *prefix, const char *filter, size_t len,
                          char out[2][RT_SUBJECT_MAX + 1]);
/* The topic a subject names into out (cap bytes); its length, or -1 if the subject is not
   one rt_subject_of_topic writes under prefix. */
int rt_topic_of_subject(const char *prefix, const char *subject, size_t len, char *out, size_t cap);

/*
** A topic (or a client id) as a JetStream KV key: keys take only [-/_=.A-Za-z0-9], so every
** other byte, and `=` and `.` (which would split the key's subject), is written =XX; one
** to one. The key's length, or -1 past cap (NUL included).
*/
int rt_kv_key_of_topic(const char *topic, size_t len, char *out, size_t cap);
int rt_topic_of_kv_key(const char *key, size_t len, char *out, size_t cap);

#endif

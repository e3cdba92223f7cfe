/*
** The topic index of one rule set: which rules' topic filters match a topic.
**
** An index is built once, while its rule set loads (rt_rule_index_add for every filter,
** then rt_rule_index_seal), and never changes after: a reload builds a new set with a new
** index. A match only reads it, so any number of threads match at once without a lock,
** each with its own rt_rule_hits_t for the walk and the results.
**
** Matching follows MQTT (4.7): '+' takes one level; "a/#" takes "a" and every topic under
** it; a filter whose first level is a wildcard never takes a topic starting with '$'.
** A rule is returned once per topic however many of its filters match it.
*/
#ifndef RT_RULE_INDEX_H
#define RT_RULE_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct rt_rule_index_s rt_rule_index_t;

/* One matcher's results and scratch; zero it to start, reuse it across matches. */
typedef struct rt_rule_hits_s {
    uint32_t *rules; /* the rules that match, ascending, each once */
    size_t n;
    size_t cap;
    uint32_t *reached[2]; /* the nodes the topic's levels reach: so far, and with one more */
    size_t cap_reached[2];
} rt_rule_hits_t;

int rt_rule_index_new(rt_rule_index_t **out); /* 0 or RT_ENOMEM */
void rt_rule_index_free(rt_rule_index_t *ix);

/*
** Adds rule's filter (a plain one: rt_topic_filter_error) before the seal. 0, RT_EINVAL for
** a filter that is not one, RT_ENOMEM (the index is then only fit to be freed).
*/
int rt_rule_index_add(rt_rule_index_t *ix, const char *filter, size_t len, uint32_t rule);
/* Ends the building: from now on the index is read only. 0 or RT_ENOMEM. */
int rt_rule_index_seal(rt_rule_index_t *ix);

/* Fills h with the rules whose filters match topic; 0, or RT_ENOMEM (h->n is then 0). */
int rt_rule_index_match(const rt_rule_index_t *ix, const char *topic, size_t len,
                        rt_rule_hits_t *h);
void rt_rule_hits_free(rt_rule_hits_t *h);

/* Bytes the index holds, itself included. */
size_t rt_rule_index_bytes(const rt_rule_index_t *ix);

#endif

/*
** Outbound topic aliases of one MQTT 5 connection (3.3.2.3.4): the broker gives a topic an
** alias the first time it sends it to the client, while the client's Topic Alias Maximum
** leaves room, and from then on sends that alias with an empty topic name. An alias is never
** moved to another topic: the first `max` distinct topics keep theirs for the connection's
** life, and a new connection starts with none (aliases do not outlive the Network Connection).
** The table holds a copy of each aliased topic, so its memory is bounded by max x 65535 bytes;
** the caller chooses max (conn.c: the smaller of the client's maximum and max_topic_alias).
**
** Owned by one connection actor and touched only in its turns: no locks. Its memory is on
** that actor's heap (rt_alloc), so it counts as the connection's: the owner keeps the table
** reachable from its heap's roots (through an RT_OBJ_SCAN object or its trace; the table's
** own objects are typed so that a collection finds the rest), and its heap's end frees it.
*/
#ifndef RT_TOPIC_ALIAS_H
#define RT_TOPIC_ALIAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"

typedef struct rt_alias_out_s rt_alias_out_t;

/*
** A table for up to max aliases (1..65535), empty, on owner's heap (owner is the calling
** actor). 0 or RT_ENOMEM / RT_EINVAL.
*/
int rt_alias_out_new(rt_actor_t *owner, uint16_t max, rt_alias_out_t **out);
/* Gives the table's memory back now rather than at a collection; NULL is ignored. */
void rt_alias_out_free(rt_alias_out_t *a);

/*
** The alias for topic[0..len): its own (>0, *fresh false) if it has one; else the alias it
** would get (*fresh true), which counts only once rt_alias_out_commit records that the client
** was sent it with the topic; else 0 (the table is full: send the topic in full).
*/
uint16_t rt_alias_out_lookup(const rt_alias_out_t *a, const uint8_t *topic, size_t len,
                             bool *fresh);

/*
** Records that the client has been sent alias (as a fresh lookup returned it) together with
** topic, so later lookups of topic return it. 0, or RT_ENOMEM (the alias stays unused).
*/
int rt_alias_out_commit(rt_alias_out_t *a, uint16_t alias, const uint8_t *topic, size_t len);

#endif

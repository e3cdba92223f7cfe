/*
** Delayed publish (docs/AUTH.md, "Delayed publish"), as EMQX's module: a PUBLISH to
** `$delayed/SECONDS/topic` is held and published to `topic` SECONDS later (at most
** RT_DELAYED_MAX_S), as if its client had published it then: to subscribers, the retained
** store and the rules. The held messages are bounded by max_delayed and max_delayed_bytes,
** kept in state.db when persistence is on (a restart keeps them, and publishes at once those
** that came due while rtd was down), and listed and deleted by `rtctl delayed`.
**
** The list is process-wide (any connection adds, the admin lists and deletes); one actor,
** RT_DELAYED_NAME, publishes what comes due and carries the list's bytes in rtctl top. It
** deletes a published message from state.db only once every copy it made was stored (the
** persistent sessions' and durable rules'), so a crash in between publishes it again after
** the restart: at least once, never lost.
*/
#ifndef RT_DELAYED_H
#define RT_DELAYED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqtt_codec.h"
#include "rt.h"

#define RT_DELAYED_PREFIX "$delayed/"
#define RT_DELAYED_MAX_S 4294967 /* EMQX's bound on the delay: 2^32 ms, about 49.7 days */
#define RT_DELAYED_NAME "delayed"
#define RT_DELAYED_GROUP "delayed_sup"

/*
** Whether topic asks for a delay (delayed_publish on and the prefix there). Then
** rt_delayed_split reads it: 0 with *seconds set and *topic the real topic (inside the
** same bytes), or RT_EINVAL (no whole number of seconds, more than RT_DELAYED_MAX_S, or no
** topic after it).
*/
bool rt_delayed_wanted(const mqtt_str_t *topic);
int rt_delayed_split(mqtt_str_t *topic, uint32_t *seconds);

/*
** Holds bin (the canonical message with its real topic; a reference is taken) for seconds.
** With persistence on and ack_pid set, ack_pid is told of one commit (RT_STORE_MSG_COMMITTED
** with token) once state.db keeps it, and *waits is 1; else 0. 0, or RT_ELIMIT (the list
** holds max_delayed messages or max_delayed_bytes) or RT_ENOMEM: nothing held.
*/
int rt_delayed_add(rt_bin_t *bin, uint32_t seconds, rt_pid_t ack_pid, uint64_t token,
                   uint32_t *waits);

/* One held message as a walk shows it (valid during the call). */
typedef struct rt_delayed_entry_s {
    uint64_t id;
    int64_t due_ms; /* Unix milliseconds */
    rt_bin_t *bin;
} rt_delayed_entry_t;
/* Calls fn for each held message, earliest first, under the list's lock (fn must not call
   in here); returns how many there are. */
size_t rt_delayed_each(void (*fn)(const rt_delayed_entry_t *e, void *arg), void *arg, size_t max);
/* Deletes the message id (and its row): 0 or RT_ENOTFOUND. */
int rt_delayed_del(uint64_t id);

/* At start, after the store opened: what state.db kept. */
int rt_delayed_restore(void);
/* Starts the publishing actor (the permanent child of RT_DELAYED_GROUP under sup). */
int rt_delayed_start(rt_pid_t sup);
/* At stop, once no actor runs: releases what is held (state.db keeps it). */
void rt_delayed_free(void);

typedef struct rt_delayed_stats_s {
    uint64_t held, bytes;     /* now */
    uint64_t published;       /* came due and were routed */
    uint64_t refused_limit;   /* refused: max_delayed or max_delayed_bytes */
    uint64_t refused_invalid; /* refused: a $delayed topic without a delay or a topic */
    uint64_t deleted;         /* by rtctl delayed del */
} rt_delayed_stats_t;
void rt_delayed_stats(rt_delayed_stats_t *out);
/* A $delayed topic refused as invalid, counted. */
void rt_delayed_count_invalid(void);

#endif

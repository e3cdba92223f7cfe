/*
** Exclusive subscriptions (docs/AUTH.md, "Exclusive subscriptions"), as EMQX's: a SUBSCRIBE
** to `$exclusive/filter` subscribes to filter, and only one client at a time may hold an
** exclusive subscription to it; another client's is refused with 0x97 (3.1.1: 0x80) until
** the holder unsubscribes or its session ends. Ordinary subscriptions to the same filter are
** not affected. A claim names its client id and the actor that holds the session, so a
** session that moves to a new actor (a takeover, a restart) keeps its claims and the old
** actor's end does not release them. On this node: in a cluster each node keeps its own.
** Safe from any thread.
*/
#ifndef RT_EXCLUSIVE_H
#define RT_EXCLUSIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqtt_codec.h"
#include "rt.h"

#define RT_EXCLUSIVE_PREFIX "$exclusive/"

/*
** Whether filter asks for an exclusive subscription: then *filter becomes the real filter
** (inside the same bytes). The caller still checks that it is a filter.
*/
bool rt_exclusive_strip(mqtt_str_t *filter);

/*
** Claims filter for client cid held by actor pid: 0 (now or already its own; *bytes is what
** pid is to be charged: a new claim's, or one that moves to pid from another actor of the
** same client), RT_EEXIST (another client holds it) or RT_ENOMEM.
*/
int rt_exclusive_claim(const char *filter, size_t len, const char *cid, rt_pid_t pid,
                       size_t *bytes);
/* Releases pid's claim on filter (not another actor's): the bytes it held, or 0. */
size_t rt_exclusive_release(const char *filter, size_t len, rt_pid_t pid);

typedef struct rt_exclusive_stats_s {
    uint64_t held;    /* claims now */
    uint64_t refused; /* SUBSCRIBEs refused: another client held the filter */
} rt_exclusive_stats_t;
void rt_exclusive_stats(rt_exclusive_stats_t *out);

#endif

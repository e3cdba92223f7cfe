/*
** The replay record ("RTR1"): what a session moving to this node gets when its old node
** crashed, every message the cluster's stream kept since, each as its origin (u64 key, u64
** number, big-endian), u32 length and PUBLISH. durable.c writes it, conn's session_bytes.c
** reads it: this is its one codec. It came over the network: the reader checks every length
** against what is there.
*/
#ifndef RT_CLUSTER_REPLAY_H
#define RT_CLUSTER_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "rt.h"

#define RT_REPLAY_MAGIC "RTR1"
#define RT_REPLAY_HEAD 4       /* bytes of the magic */
#define RT_REPLAY_ENTRY_MIN 20 /* bytes of a message's record, its PUBLISH aside */

/* b (empty) starts a replay: the magic. */
void rt_replay_start(rt_buf_t *b);
/* One message after the others (rt_buf's oom says whether all fitted). */
void rt_replay_put(rt_buf_t *b, uint64_t origin_key, uint64_t origin_seq, const void *publish,
                   uint32_t len);

/* A message as read: its PUBLISH points into the bytes. */
typedef struct {
    uint64_t origin_key, origin_seq;
    const uint8_t *publish;
    uint32_t len;
} rt_replay_entry_t;

/*
** The message of p (len bytes) at *at, which starts at 0: 1 with *e filled and *at past it,
** 0 at the end, RT_EPROTO if the bytes are no replay (the magic) or are cut short.
*/
int rt_replay_next(const uint8_t *p, size_t len, size_t *at, rt_replay_entry_t *e);

#endif

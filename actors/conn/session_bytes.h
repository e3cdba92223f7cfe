/*
** The bytes in which a persistent session moves between cluster nodes (cluster.h, "Sessions
** that move" and "Durable mode"; docs/CLUSTER.md), apart from any connection actor: move.c
** writes them from a session and reads them into one; a fuzz target reads whatever it likes.
**
** A session, or the rest of one, "RTS1" (all integers big-endian):
**   "RTS1", expiry left (s, u32), will delay left + 1 (ms, u32; 0: no will) and the
**   will's PUBLISH (u32 length, bytes), subscriptions (u32 count; each: u16 length,
**   filter, u32 subscription id, u8 QoS, u8 flags), inbound QoS 2 ids (u32 count, u16
**   each), messages (u32 count; each: u8 state, QoS, retain, shared; u16 packet id; u32
**   expiry left + 1 (ms; 0: none); u8 count and u32 subscription ids; u64 origin key,
**   u64 origin number (rt_message_origin; 0: none); u32 length and the PUBLISH, none
**   for a QoS 2 message past PUBREC).
** Phase 2's rest is the same with only messages.
**
** A replay after the session's old node crashed: cluster's replay.h, its codec.
**
** Another rtd wrote them, but they came over the network: every count and length is checked
** against what is there, and what the bytes say costs at most a few times their length in
** memory.
*/
#ifndef RT_SESSION_BYTES_H
#define RT_SESSION_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn_impl.h"
#include "store.h"

#define RT_MOVED_SESSION_MAGIC "RTS1"

/* ---- Writing: a head, then each list as its count and its entries, in the order above ---- */

typedef struct {
    uint8_t *p; /* malloc'd; the writer owns it until rt_moved_writer_free */
    size_t len, cap;
    bool failed; /* out of memory, or past RT_CLUSTER_MOVE_MAX: the bytes are not whole */
} rt_moved_writer_t;

void rt_moved_writer_free(rt_moved_writer_t *w);
/* The magic, the expiry and the will (NULL: none) with what is left of its delay. */
void rt_moved_put_head(rt_moved_writer_t *w, uint32_t expiry_left_s, const rt_bin_t *will,
                       uint64_t will_left_ms);
/* How many entries the list that follows holds (subscriptions, QoS 2 ids, messages). */
void rt_moved_put_count(rt_moved_writer_t *w, uint32_t n);
void rt_moved_put_sub(rt_moved_writer_t *w, const char *filter, uint16_t len,
                      const rt_trie_opts_t *o);
void rt_moved_put_qos2_id(rt_moved_writer_t *w, uint16_t packet_id);
/* m's expiry is a deadline on the clock now is read from; its PUBLISH is m->bin (NULL: none). */
void rt_moved_put_msg(rt_moved_writer_t *w, const rt_stored_msg_t *m, uint64_t origin_key,
                      uint64_t origin_seq, uint64_t now);

/* ---- Reading ---- */

/*
** What the bytes said: a stored session's shape (client_id is the reader's caller's), the
** will, and each message's origin. Everything in it is its own: rt_moved_free releases it.
*/
typedef struct {
    rt_stored_session_t ss;
    rt_bin_t *will;
    uint32_t will_left_ms;
    uint64_t *keys, *seqs; /* per message */
} rt_moved_t;

/*
** Reads "RTS1" bytes into *mv, for client id (kept, not copied). Deadlines are counted from
** now (rt_mono_ms). 0, RT_EPROTO if they are not a session's, or RT_ENOMEM. *mv is to be
** freed whatever the result.
*/
int rt_moved_read_session(const char *id, const void *bytes, size_t len, uint64_t now,
                          rt_moved_t *mv);
/*
** Reads replay bytes (replay.h) into *mv's messages: those the subscriptions match, as routing would
** have delivered them (the highest QoS granted, every matching subscription's id); QoS 0
** ones only if keep_qos0. 0, RT_EPROTO or RT_ENOMEM; *mv is to be freed whatever the result.
*/
int rt_moved_read_replay(const void *bytes, size_t len, const sub_entry_t *subs, uint32_t nsubs,
                         bool keep_qos0, uint64_t now, rt_moved_t *mv);
void rt_moved_free(rt_moved_t *mv);

#endif

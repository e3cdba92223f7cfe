/*
** The broker's routing table: MQTT topic filters (with '+', '#' and
** $share/{group}/ shared subscriptions) mapped to subscriber pids, matched
** concurrently by publishing connections while others subscribe and
** unsubscribe; and the retained-message store, which answers the reverse
** question (which stored topics does a new filter match).
**
** Concurrency design (chosen by measurement, see tests/unit/test_topic_trie.c
** "bench" mode): the subscription trie is split into RT_TRIE_SHARDS shards by
** the hash of a filter's first level, plus one shard for filters whose first
** level is a wildcard. Each shard has its own reader-sharded rwlock (one
** rwlock per read slot, RT_TRIE_READ_SLOTS). A match read-locks at most two
** shards (the topic's first-level shard and the wildcard shard) one after the
** other, so a subscribe only ever waits for readers of its own shard and
** nothing stops the whole table. Topics beginning with '$' never visit the
** wildcard shard, which is exactly the MQTT 3.1.1/5.0 §4.7.2 rule.
**
** Strings are byte ranges (pointer and length), never NUL-terminated, as they
** arrive in packets; their syntax is checked by topic.h.
**
** Both structures are level trees (topic_tree.h); the subscription trie is
** topic_trie.c, the retained store retained.c.
*/
#ifndef RT_TOPIC_TRIE_H
#define RT_TOPIC_TRIE_H

#include "rt.h"
#include "topic.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Number of first-level shards in the subscription trie (a power of two). */
#define RT_TRIE_SHARDS 64

/*
** Read-lock slots per shard: a publishing thread read-locks only its own slot
** (threads are spread over slots round robin); subscribe write-locks them all.
** Default 1 (a plain rwlock per shard): on this 2-core machine 8 slots showed
** no match-speed gain within noise and halved subscribe+unsubscribe throughput
** (test_topic_trie bench, built with -DRT_TRIE_READ_SLOTS=1 and 8). Worth
** re-measuring on machines with many scheduler threads.
*/
#ifndef RT_TRIE_READ_SLOTS
#define RT_TRIE_READ_SLOTS 1
#endif

/* The largest subscription identifier MQTT 5 allows (a variable byte integer). */
#define RT_TRIE_MAX_SUB_ID 268435455u

/* One subscription's options, as SUBSCRIBE carries them. */
typedef struct {
    uint32_t sub_id;             /* subscription identifier 1..RT_TRIE_MAX_SUB_ID; 0 = none */
    uint8_t qos;                 /* maximum QoS granted, 0..2 */
    uint8_t no_local;            /* 1: not delivered to the publishing pid itself */
    uint8_t retain_as_published; /* 1: keep the RETAIN flag on forwarded messages */
    uint8_t retain_handling : 2; /* 0..2; stored for the caller, matching ignores it */
    uint8_t persistent : 1;      /* the session is stored: deliveries ask for a durable ack */
    uint8_t acl_check : 1;       /* the ACL granted it in part: each delivery is checked (acl.h) */
    uint8_t exclusive : 1;       /* $exclusive: stored for the caller, matching ignores it */
} rt_trie_opts_t;

/*
** What the delivery callback receives, once per (subscriber, message) for all
** the subscriber's ordinary (non-shared) subscriptions that match, aggregated
** as MQTT 5 §3.3.4 requires: qos is the maximum across them, sub_ids holds
** every nonzero subscription identifier among them (ascending, no
** duplicates), retain_as_published is 1 if any of them asked for it. A shared
** subscription group delivers separately (shared = 1) to the one member it
** picked, with that member's own options, even if the same pid also has an
** ordinary subscription (§4.8.2: each subscription gets its copy).
** The pointers are valid only during the callback.
*/
typedef struct {
    rt_pid_t pid;
    uint8_t qos;
    uint8_t retain_as_published;
    uint8_t shared;
    uint8_t persistent; /* any of the subscriptions is persistent */
    uint8_t acl_check;  /* any of them has acl_check */
    size_t n_sub_ids;
    const uint32_t *sub_ids;
} rt_trie_delivery_t;

typedef void (*rt_trie_deliver_fn)(void *arg, const rt_trie_delivery_t *d);

/*
** Asked while choosing a shared-group member: nonzero if pid can take the
** message. It runs with a shard read-locked, so it must be quick and must not
** call into the trie. NULL means every member is alive.
*/
typedef int (*rt_trie_alive_fn)(void *arg, rt_pid_t pid);

typedef struct rt_trie_s rt_trie_t;

/*
** Per-publisher scratch space reused across matches so the hot path does not
** allocate once warm. One scratch per thread; the trie never keeps pointers to it.
*/
typedef struct {
    struct rt_trie_hit_s *hits; /* ordinary subscription hits of the current match */
    size_t nhits, caphits;
    struct rt_trie_hit_s *shared; /* shared-group picks of the current match */
    size_t nshared, capshared;
    uint32_t *ids; /* aggregated subscription identifiers handed to the callback */
    size_t capids;
    struct rt_trie_frame_s *stack; /* explicit walk stack: no recursion on actor stacks */
    size_t capstack;
    struct rt_trie_memo_s *memo; /* this thread's recent matches (rt_trie_match), or NULL */
    bool memo_ok;                /* the match being made may be remembered */
} rt_trie_scratch_t;

typedef struct {
    size_t subs;    /* ordinary subscriptions plus shared-group memberships */
    size_t groups;  /* shared subscription groups */
    size_t filters; /* distinct subscribed filters: "a/b" once however many subscribe it,
                       each "$share/group/a/b" once (every group is a filter of its own) */
    size_t subs_max, filters_max; /* high-water marks since the trie was made */
    size_t nodes;                 /* trie nodes, roots excluded */
    size_t bytes;                 /* every byte the trie has allocated, including itself */
} rt_trie_stats_t;

int rt_trie_new(rt_trie_t **out); /* 0 or RT_ENOMEM */
void rt_trie_free(rt_trie_t *t);  /* no concurrent users may remain */

/*
** Adds or replaces pid's subscription to filter (options copied). *existed
** (may be NULL) is set to 1 if pid already had this exact filter (its options
** were replaced; MQTT 5 retain handling 1 needs to know), else 0.
** RT_EINVAL for a bad filter or options (no_local on a shared subscription is
** a protocol error in MQTT 5 §3.8.3.1), RT_ENOMEM leaves the trie unchanged.
*/
int rt_trie_subscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid,
                      const rt_trie_opts_t *opts, int *existed);

/* Removes it; *existed says whether it was there (UNSUBACK 0x11 otherwise). */
int rt_trie_unsubscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid, int *existed);

/*
** Told when a filter gets its first subscriber (on) and loses its last one (off); a
** $share/group/filter counts as its own filter, by its group's members. Called with the
** filter's shard write-locked, so it must be quick and must not call into the trie; the
** calls for one filter come in the order of its changes. Set before the trie is shared.
*/
typedef void (*rt_trie_interest_fn)(void *arg, const char *filter, size_t len, bool on);
void rt_trie_set_interest(rt_trie_t *t, rt_trie_interest_fn fn, void *arg);

void rt_trie_scratch_init(rt_trie_scratch_t *s);
void rt_trie_scratch_destroy(rt_trie_scratch_t *s);

/*
** Matches topic against every filter and calls deliver once per aggregated
** subscriber and once per shared group (see rt_trie_delivery_t). publisher is
** the publishing pid for no_local (0: none). deliver runs after all locks are
** released, so it may subscribe or send. Each group's round-robin cursor
** advances once per message; members alive() rejects are skipped, and a group
** with no live member delivers nothing. *ndelivered (may be NULL) counts calls.
** RT_EINVAL for a bad topic, RT_ENOMEM if scratch could not grow (nothing delivered).
*/
int rt_trie_match(rt_trie_t *t, const char *topic, size_t len, rt_pid_t publisher,
                  rt_trie_alive_fn alive, rt_trie_deliver_fn deliver, void *arg,
                  rt_trie_scratch_t *s, size_t *ndelivered);

void rt_trie_stats(rt_trie_t *t, rt_trie_stats_t *st);

/*
** Picks the next live member of one shared group ($share/group/filter), as a
** match would, but skipping exclude: for handing a message that member will not
** acknowledge to another one. 0 with *pid and *opts set, or RT_ENOTFOUND when
** the group has no other live member; RT_EINVAL for a filter that is not shared.
*/
int rt_trie_share_pick(rt_trie_t *t, const char *share_filter, size_t len, rt_pid_t exclude,
                       rt_trie_alive_fn alive, void *arg, rt_pid_t *pid, rt_trie_opts_t *opts);

/*
** Retained messages: one per topic. Messages are opaque to the store; it owns
** a reference from set until replaced, cleared or freed, then calls release.
** Use rt_bin_t payloads with release = (rt_retained_release_fn)rt_bin_release,
** or a struct carrying QoS, properties and expiry. One rwlock guards the store:
** retained traffic (set on RETAIN publishes, matched on SUBSCRIBE) is far
** rarer than routing.
*/
typedef void (*rt_retained_release_fn)(void *msg);
typedef void (*rt_retained_fn)(void *arg, const char *topic, size_t len, void *msg);
typedef struct rt_retained_s rt_retained_t;

/*
** Topic-table locks (the trie's or the retained store's) the calling thread holds, for
** callbacks that run under one to assert it; debug builds only (always 0 under NDEBUG).
*/
int rt_topic_locks_held(void);

/* max_count / max_bytes: limits on messages and on their bytes (0 = unlimited). */
int rt_retained_new(rt_retained_t **out, rt_retained_release_fn release, size_t max_count,
                    size_t max_bytes);
void rt_retained_free(rt_retained_t *r); /* releases every message */

/*
** Sets topic's retained message, replacing (and releasing) any previous one.
** msg_bytes is what the limits count (payload plus whatever the caller
** stores). msg == NULL clears the topic (what an empty retained payload
** means). On any error (RT_ELIMIT if the limits would be exceeded,
** RT_ENOMEM, RT_EINVAL for a bad topic) msg is not taken and the old
** message stays.
*/
int rt_retained_set(rt_retained_t *r, const char *topic, size_t len, void *msg, size_t msg_bytes);

/*
** Calls fn for each retained message whose topic filter matches (a $share/
** prefix is not accepted: retained messages are not sent for shared
** subscriptions, §4.8.2). Filters starting with a wildcard do not match
** topics starting with '$'. fn runs with the store read-locked: it must take
** its own reference (e.g. rt_bin_retain) to keep msg, and must not call into
** the store. *nfound (may be NULL) counts calls.
*/
int rt_retained_match(rt_retained_t *r, const char *filter, size_t len, rt_retained_fn fn,
                      void *arg, size_t *nfound);

/* Messages held, the sum of their msg_bytes, and all bytes the store allocated. */
void rt_retained_stats(rt_retained_t *r, size_t *count, size_t *msg_bytes, size_t *mem_bytes);
/* The most messages and msg_bytes the store has held at once since it was made. */
void rt_retained_peaks(rt_retained_t *r, size_t *count_max, size_t *msg_bytes_max);
/*
** New limits (0 = unlimited) for the next rt_retained_set; messages already held
** stay even if they are over them.
*/
void rt_retained_set_limits(rt_retained_t *r, size_t max_count, size_t max_bytes);

/*
** Who is told each change of a topic's retained bytes (the tenants, broker/tenant.h): watch
** runs under the store's write lock, so it must not call in here. Set once, before use.
*/
typedef void (*rt_retained_watch_fn)(const char *topic, size_t len, ptrdiff_t delta);
void rt_retained_watch(rt_retained_t *r, rt_retained_watch_fn watch);
/* The bytes retained on topic (0: none). */
size_t rt_retained_bytes_of(rt_retained_t *r, const char *topic, size_t len);
/*
** The bytes retained below the levels of prefix ("a/b/": every topic under a/b, not a/b
** itself), handed to done under the store's read lock: no change comes between the sum and
** what done does with it, and every later one reaches the watch.
*/
void rt_retained_bytes_under(rt_retained_t *r, const char *prefix, size_t len,
                             void (*done)(void *arg, size_t bytes), void *arg);

#endif

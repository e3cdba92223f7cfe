/*
** The banned list (docs/AUTH.md, "Banned clients"): client ids, user names and address
** ranges rtd refuses at CONNECT (MQTT 5 reason 0x8A Banned, 3.1.1 return code 5), each
** with who banned it, why and until when; and flapping detection, which bans a client id
** that connected flapping_max_connects times within flapping_window_s for flapping_ban_s.
** Kept in state.db when persistence is on (a restart keeps them), in memory otherwise.
** Safe from any thread.
*/
#ifndef RT_BANNED_H
#define RT_BANNED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"

typedef enum { RT_BAN_CLIENTID, RT_BAN_USERNAME, RT_BAN_ADDRESS, RT_BAN_KINDS } rt_ban_kind_t;
extern const char *const rt_ban_kind_names[RT_BAN_KINDS]; /* "clientid", "username", "address" */

#define RT_BAN_VALUE_MAX 65535 /* an MQTT string's longest: any client id or user name */
#define RT_BAN_REASON_MAX 256
#define RT_BAN_BY_MAX 64

/* A ban as it is listed and added; the strings are the caller's (or the list's, in a walk). */
typedef struct rt_ban_s {
    rt_ban_kind_t kind;
    const char *value; /* an address range as "a.b.c.d/n" or "v6/n" once added */
    size_t len;
    const char *by;     /* "rtctl", "api", "flapping", ... */
    const char *reason; /* free text */
    int64_t at_s;       /* Unix seconds */
    int64_t until_s;    /* Unix seconds; 0: until deleted */
} rt_ban_t;

/* The kind named name: 0, or RT_EINVAL. */
int rt_ban_kind_parse(const char *name, rt_ban_kind_t *out);

/*
** Adds b, or replaces the ban of the same kind and value (an address range is compared as
** a range: "10.0.0.1/8" is 10.0.0.0/8). 0; RT_EINVAL (a value that is not one: empty, too
** long, not an address range), RT_ELIMIT (max_banned bans that have not run out) or
** RT_ENOMEM, with err. Kept in state.db when persistence is on.
*/
int rt_banned_add(const rt_ban_t *b, char *err, size_t errlen);
/* Deletes the ban of that kind and value: 0, RT_EINVAL (not an address range) or
   RT_ENOTFOUND. */
int rt_banned_del(rt_ban_kind_t kind, const char *value, size_t len);
/* Calls fn for each ban that has not run out, under the list's read lock (fn must not call
   in here); returns how many. */
size_t rt_banned_each(void (*fn)(const rt_ban_t *b, void *arg), void *arg);
size_t rt_banned_count(void);

/*
** Whether a CONNECT is banned: by its client id, its user name (NULL: none) or its peer
** (NULL: not an IP peer). The ban that matched is copied to hit (its strings into hit_buf,
** cut to fit) for the refusal's log line.
*/
bool rt_banned_match(const char *cid, size_t cidlen, const char *user, size_t ulen,
                     const rt_auth_addr_t *peer, rt_ban_t *hit, char *hit_buf, size_t hit_len);

/*
** Counts a CONNECT of client id cid for flapping detection (nothing when
** flapping_max_connects is 0): the one that makes flapping_max_connects within
** flapping_window_s bans the id for flapping_ban_s, and true is returned (the ban is logged).
*/
bool rt_banned_flapping(const char *cid, size_t len);

/*
** In a cluster the list is the cluster's (docs/AUTH.md): each add and delete made here (an
** admin's, flapping detection's) goes to fn as well, which tells the other nodes; the changes
** they make come back through rt_banned_apply, which does not call fn again. NULL: none.
*/
typedef void (*rt_banned_replicate_fn)(const rt_ban_t *b, bool added);
void rt_banned_set_replicator(rt_banned_replicate_fn fn);
/* Another node's change (b's kind and value alone for a delete): 0 or an RT_E* code. */
int rt_banned_apply(const rt_ban_t *b, bool added);

/* At start, after the store opened: what state.db kept. */
int rt_banned_load(void);
/* At stop, once no connection can look. */
void rt_banned_free(void);

/* The counters behind rt_banned_refusals_total and rt_flapping_bans_total. */
typedef struct rt_banned_stats_s {
    uint64_t refused[RT_BAN_KINDS]; /* CONNECTs refused, by the kind of ban that matched */
    uint64_t flapping_bans;         /* bans flapping detection made */
} rt_banned_stats_t;
void rt_banned_stats(rt_banned_stats_t *out);

#endif

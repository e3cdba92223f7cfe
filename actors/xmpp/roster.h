/*
** Rosters (RFC 6121 §2, with versioning, §2.6) and offline messages (XEP-0160) of XMPP
** accounts, kept in the accounts file data_dir/xmpp.db (accounts.h) through the same
** rt_accounts_t: one file, one connection, one busy rule. A roster is a set of items keyed by
** the contact's bare JID, each with a name, groups and a subscription state; every change
** adds one to the roster's version. Offline messages are whole stanzas as bytes, kept in
** order of arrival, bounded per user by the caller's count and bytes. Deleting an account
** (rt_accounts_del) deletes its roster, version and offline messages in the same
** transaction.
**
** BLOCKING, as accounts.h: call from an RT_TYPE_BLOCKING actor or outside the runtime. One
** rt_accounts_t is used by one thread at a time, and a callback given here must not call
** back into the same handle (its transaction is open). Other handles and processes may
** read and write the file meanwhile; each call here is one transaction.
**
** host and user are prepared here (jid.h) as by the accounts calls; a name that does not
** prepare is RT_EINVAL. A roster item's jid is taken as given: the caller prepares it.
*/
#ifndef RT_XMPP_ROSTER_H
#define RT_XMPP_ROSTER_H

#include <stddef.h>
#include <stdint.h>

#include "accounts.h"

/* RFC 6121 subscription state of one roster item, as bits: */
#define RT_ROSTER_TO 1u           /* the user gets the contact's presence */
#define RT_ROSTER_FROM 2u         /* the contact gets the user's presence */
#define RT_ROSTER_ASK_OUT 4u      /* the user asked to subscribe, contact has not answered */
#define RT_ROSTER_PENDING_IN 8u   /* the contact asked to subscribe, user has not answered */
#define RT_ROSTER_PREAPPROVED 16u /* RFC 6121 3.4 pre-approval */
#define RT_ROSTER_STATES 31u      /* every bit above */
#define RT_ROSTER_GROUPS_MAX 16   /* groups of one item */
#define RT_ROSTER_TEXT_MAX 1023   /* bytes of a name or a group */

typedef struct rt_roster_item_s {
    const char *jid;                          /* bare JID, prepared by the caller */
    const char *name;                         /* "" (or NULL, to put) for none */
    const char *groups[RT_ROSTER_GROUPS_MAX]; /* each NUL-terminated, UTF-8, not empty */
    unsigned ngroups;
    unsigned state; /* RT_ROSTER_* bits */
} rt_roster_item_t;

/*
** Calls fn for each item of user@host (ordered by jid), then returns 0 (or fn's nonzero
** return, stopping). *version (if not NULL): the roster's version, 0 for a roster never
** changed (or no account), read in the same snapshot as the items. Items and their strings
** belong to the store and are valid during the call only. RT_EINVAL (names), RT_EAGAIN
** (database).
*/
int rt_roster_get(rt_accounts_t *a, const char *host, const char *user,
                  int (*fn)(const rt_roster_item_t *it, void *arg), void *arg, uint64_t *version);

/*
** Adds or replaces an item (name, groups and state all replaced). max_items bounds the
** roster: adding a new item to a roster of max_items is RT_ELIMIT (a replacement is
** always allowed). *version (if not NULL): the new version; every put adds one. RT_EINVAL
** with err: a field past its bound (a jid empty, over RT_JID_TEXT_MAX bytes or with a
** resource; a name or group over RT_ROSTER_TEXT_MAX bytes or not UTF-8; an empty or
** repeated group; over RT_ROSTER_GROUPS_MAX groups; an unknown state bit). RT_ENOTFOUND:
** no such account. RT_EAGAIN: the database failed or stayed busy (err).
*/
int rt_roster_put(rt_accounts_t *a, const char *host, const char *user, const rt_roster_item_t *it,
                  uint32_t max_items, uint64_t *version, char *err, size_t errlen);

/* Removes the item for jid: 0 (and *version, the new one), RT_ENOTFOUND, RT_EINVAL, RT_EAGAIN. */
int rt_roster_del(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                  uint64_t *version);

/*
** One item: 0 with fn called once (fn's return is not passed on), RT_ENOTFOUND, RT_EINVAL,
** RT_EAGAIN. The presence state machine reads one contact's state with it, then writes it
** with rt_roster_put.
*/
int rt_roster_item(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                   int (*fn)(const rt_roster_item_t *it, void *arg), void *arg);

/*
** Stores one offline message (the len bytes at stanza, copied) for user@host, stamped
** stamp_ms (unix ms, the XEP-0203 delay the caller adds on delivery). 0; RT_ELIMIT when it
** would pass max_count messages or max_bytes bytes for that user (nothing is stored: the
** caller answers the sender with service-unavailable, RFC 6121 8.5.2.1.1); RT_ENOTFOUND
** when no such account; RT_EINVAL for an empty stanza or a bad name; RT_EAGAIN.
*/
int rt_offline_push(rt_accounts_t *a, const char *host, const char *user, const void *stanza,
                    size_t len, int64_t stamp_ms, uint32_t max_count, uint64_t max_bytes);

/*
** Calls fn for user@host's messages oldest first, up to max of them, and deletes each one
** fn returned 0 for, in one transaction; fn's first nonzero return stops the walk and keeps
** that message and the rest. The caller hands each to the session in fn; the bytes are
** valid during the call only. Returns how many were taken (deleted), RT_EINVAL (names) or
** RT_EAGAIN (then nothing was deleted, though fn may have seen some: delivery is at least
** once).
*/
int rt_offline_take(rt_accounts_t *a, const char *host, const char *user, uint32_t max,
                    int (*fn)(const void *stanza, size_t len, int64_t stamp_ms, void *arg),
                    void *arg);

/* Messages and bytes waiting for user@host: 0, RT_ENOTFOUND (no account), RT_EINVAL, RT_EAGAIN. */
int rt_offline_count(rt_accounts_t *a, const char *host, const char *user, uint32_t *count,
                     uint64_t *bytes);

#endif

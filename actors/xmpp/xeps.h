/*
** What accounts keep in xmpp.db for the XEPs a modern client expects, beside the roster
** (roster.h), through the same rt_accounts_t (schema version 5): the blocklist (XEP-0191),
** the vCard (XEP-0054), the message archive (XEP-0313) and PEP's nodes and items
** (XEP-0163); and persistent group chat rooms (XEP-0045). Deleting an account deletes what
** it keeps in the same transaction.
**
** BLOCKING, as accounts.h: every call does file I/O; call from an RT_TYPE_BLOCKING actor or
** outside the runtime, one thread at a time per handle, and never from a callback given here.
** host and user are prepared here as by the accounts calls (RT_EINVAL for a name no account
** can have); JIDs given (blocked, archived with) are taken as given: the caller prepares them.
*/
#ifndef RT_XMPP_XEPS_H
#define RT_XMPP_XEPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "accounts.h"

/* ---- Blocklist (XEP-0191) ---- */

/* Calls fn for each blocked JID of user@host, in JID order (fn: 0 to go on). 0, fn's stop,
 * RT_EINVAL, RT_EAGAIN. */
int rt_block_list(rt_accounts_t *a, const char *host, const char *user,
                  int (*fn)(const char *jid, size_t len, void *arg), void *arg);
/*
** Blocks each of the n JIDs (one transaction; one already blocked is no change). RT_ELIMIT
** when the list would hold more than max (nothing changed); RT_ENOTFOUND for no such
** account; RT_EINVAL for an empty or over-long JID; RT_EAGAIN.
*/
int rt_block_add(rt_accounts_t *a, const char *host, const char *user, const char *const *jids,
                 size_t n, uint32_t max);
/* Unblocks the n JIDs (n == 0: every one). 0, RT_EINVAL, RT_EAGAIN. */
int rt_block_del(rt_accounts_t *a, const char *host, const char *user, const char *const *jids,
                 size_t n);

/* ---- vCard (XEP-0054) ---- */

/* The vCard's bytes (a <vCard xmlns='vcard-temp'> element) to fn. 0, RT_ENOTFOUND (none set),
   RT_EINVAL, RT_EAGAIN. */
int rt_vcard_get(rt_accounts_t *a, const char *host, const char *user,
                 void (*fn)(const void *vcard, size_t len, void *arg), void *arg);
/* Replaces it (len 0: deletes it). RT_ENOTFOUND (no account), RT_EINVAL (names), RT_EAGAIN. */
int rt_vcard_set(rt_accounts_t *a, const char *host, const char *user, const void *vcard,
                 size_t len);

/* ---- Message archive (XEP-0313) ---- */

/*
** One message to archive for one account: `with` the other party's bare JID. id: the archive
** id it takes, chosen by the caller (who tells the receiver before it is written: XEP-0359),
** unique and, to page in order, greater than those before; 0: the next after the greatest.
** stamp_ms 0: the put's.
*/
typedef struct rt_archive_entry_s {
    const char *host, *user, *with;
    const void *stanza;
    size_t len;
    int64_t id;
    int64_t stamp_ms;
    bool room; /* a group chat room's (XEP-0045; host: its service), which has no account */
} rt_archive_entry_t;

/*
** Archives n entries (a chat's sender's and receiver's copies, or a batch of chats) in one
** transaction, stamped stamp_ms unless they carry their own, then drops each account's oldest
** past max_count. ids[i] (if ids): entry i's archive id, or 0 when its account does not exist
** (skipped, anonymous users have none). An id already taken gives the entry the next after the
** greatest instead (it is kept; ids[i] says which). 0, RT_EINVAL, RT_EAGAIN.
*/
int rt_archive_put(rt_accounts_t *a, const rt_archive_entry_t *e, size_t n, int64_t stamp_ms,
                   uint32_t max_count, int64_t *ids);

/* A query (XEP-0313 4 with XEP-0059 paging); 0 or NULL fields: not given. */
typedef struct rt_archive_query_s {
    const char *with; /* a bare JID */
    int64_t start_ms; /* stamps from, to (inclusive); 0: open */
    int64_t end_ms;
    int64_t after, before; /* ids, exclusive; 0: none. before with last: the last page */
    bool last;             /* the newest page (<before/> empty, XEP-0059 2.5) */
    uint32_t max;          /* rows in the page, at least 1 */
} rt_archive_query_t;

/*
** The page's messages oldest first to fn (id, stamp, the stanza's bytes); *complete: no
** message beyond the page in the direction paged. 0, RT_EINVAL, RT_EAGAIN.
*/
int rt_archive_query(rt_accounts_t *a, const char *host, const char *user,
                     const rt_archive_query_t *q,
                     int (*fn)(int64_t id, int64_t stamp_ms, const void *stanza, size_t len,
                               void *arg),
                     void *arg, bool *complete);

/* How many messages q's filters (with, start, end; not its paging) match: 0, RT_EINVAL,
   RT_EAGAIN. It reads each, through the index: as many as the account keeps at most. */
int rt_archive_count(rt_accounts_t *a, const char *host, const char *user,
                     const rt_archive_query_t *q, uint64_t *count);
/* The greatest archive id in the file (0: none): ids chosen later start above it. */
int rt_archive_last_id(rt_accounts_t *a, int64_t *id);

/* ---- Group chat rooms (XEP-0045) ---- */

/* Keeps a persistent room's state (the room's own blob) under its service domain and
   localpart; len 0 forgets the room. 0, RT_EINVAL (names), RT_EAGAIN. */
int rt_muc_room_put(rt_accounts_t *a, const char *service, const char *room, const void *state,
                    size_t len);
/* Every room kept, to fn (its arguments lent for the call). 0 or RT_EAGAIN. */
int rt_muc_rooms_each(rt_accounts_t *a,
                      void (*fn)(const char *service, const char *room, const void *state,
                                 size_t len, void *arg),
                      void *arg);

/* ---- PEP: personal eventing (XEP-0163 over XEP-0060's nodes and items) ---- */

/* Who may read a node and is told of its items (XEP-0060 4.5): presence, the default for
   PEP, is the owner's contacts subscribed to its presence (roster FROM); whitelist, the owner
   alone (private data, bookmarks: XEP-0223, XEP-0402). */
enum { RT_PEP_PRESENCE = 0, RT_PEP_OPEN, RT_PEP_WHITELIST, RT_PEP_UNSET = 0xff };

/* A node's configuration; as a publish's options (want), RT_PEP_UNSET and 0 are "not given". */
typedef struct rt_pep_node_s {
    uint32_t access;    /* RT_PEP_* */
    uint32_t max_items; /* kept, newest first: past it the oldest go */
} rt_pep_node_t;

/* An account's bounds: its nodes, the items one node keeps, the bytes of all its items. */
typedef struct rt_pep_bounds_s {
    uint32_t nodes, items;
    uint64_t bytes;
} rt_pep_bounds_t;

/*
** Publishes an item (its id and payload, an element's bytes) to user@host's node, which a
** first publish makes with *want's configuration (XEP-0163 auto-create; what want does not
** give: presence access, 1 item; max_items at most bounds->items). want given (the publish's
** options, XEP-0060 7.1.5) and the node configured otherwise in what it gives: RT_EEXIST,
** nothing changed (precondition-not-met). An id already there is replaced and becomes the
** newest.
** *got: the node's configuration. 0, RT_ENOTFOUND (no account), RT_ELIMIT (a bound),
** RT_EINVAL, RT_EAGAIN.
*/
int rt_pep_publish(rt_accounts_t *a, const char *host, const char *user, const char *node,
                   const char *item, const void *payload, size_t len, const rt_pep_node_t *want,
                   const rt_pep_bounds_t *bounds, rt_pep_node_t *got);
/* The node's configuration: 0, RT_ENOTFOUND (no such node), RT_EINVAL, RT_EAGAIN. */
int rt_pep_node(rt_accounts_t *a, const char *host, const char *user, const char *node,
                rt_pep_node_t *got);
/*
** The node's items to fn, oldest first: its `max` newest, or (item) the one with that id.
** 0, RT_ENOTFOUND (no such node), RT_EINVAL, RT_EAGAIN.
*/
int rt_pep_items(rt_accounts_t *a, const char *host, const char *user, const char *node,
                 const char *item, uint32_t max,
                 void (*fn)(const char *id, const void *payload, size_t len, void *arg), void *arg);
/* Each node's newest item, with the node's access model, to fn. 0, RT_EINVAL, RT_EAGAIN. */
int rt_pep_last(rt_accounts_t *a, const char *host, const char *user,
                void (*fn)(const char *node, uint32_t access, const char *id, const void *payload,
                           size_t len, void *arg),
                void *arg);
/* Deletes an item (item) or the node with its items (item NULL): 0, RT_ENOTFOUND (no such
   item or node), RT_EINVAL, RT_EAGAIN. */
int rt_pep_delete(rt_accounts_t *a, const char *host, const char *user, const char *node,
                  const char *item);

/* ---- FAST tokens (XEP-0484) ---- */

#define RT_FAST_TOKEN_MAX 64 /* bytes of a token as issued (the HT mechanism's HMAC key) */

/*
** Issues token (len bytes) to user@host's client agent (its user-agent id) for mechanism,
** valid until expiry_ms; the client's token before it stays valid until its own expiry. Past
** max_agents clients with tokens, those whose tokens expire first lose theirs. 0,
** RT_ENOTFOUND (no account), RT_EINVAL, RT_EAGAIN.
*/
int rt_fast_put(rt_accounts_t *a, const char *host, const char *user, const char *agent,
                const char *mechanism, const void *token, size_t len, int64_t expiry_ms,
                uint32_t max_agents);
/* The agent's tokens for mechanism not expired at now_ms (the current one first) to fn. 0
   (fn called for each), RT_ENOTFOUND (none), RT_EINVAL, RT_EAGAIN. */
int rt_fast_get(rt_accounts_t *a, const char *host, const char *user, const char *agent,
                const char *mechanism, int64_t now_ms,
                void (*fn)(const void *token, size_t len, void *arg), void *arg);
/* Forgets the agent's tokens (agent NULL: every client's of the account). 0, RT_EINVAL,
   RT_EAGAIN. */
int rt_fast_del(rt_accounts_t *a, const char *host, const char *user, const char *agent);

/* ---- Push notifications (XEP-0357) ---- */

#define RT_PUSH_OPTIONS_MAX 4096 /* bytes of an enable's publish options (its data form) */

/*
** Remembers that user@host's client wants notifications sent to the app server jid at node,
** with options (the publish-options form's bytes, none: len 0). Past max registrations for
** the account, the oldest go. 0, RT_ENOTFOUND (no account), RT_EINVAL, RT_EAGAIN.
*/
int rt_push_put(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                const char *node, const void *options, size_t len, int64_t now_ms, uint32_t max);
/* Forgets the app server jid at node (NULL: at every node). 0, RT_EINVAL, RT_EAGAIN. */
int rt_push_del(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                const char *node);
/* Each registration of user@host to fn, oldest first. 0, RT_EINVAL, RT_EAGAIN. */
int rt_push_each(rt_accounts_t *a, const char *host, const char *user,
                 void (*fn)(const char *jid, const char *node, const void *options, size_t len,
                            void *arg),
                 void *arg);

#endif

/*
** What accounts.c shares with roster.c (internal to actors/xmpp): the handle over xmpp.db,
** names prepared as keys, transactions, and the roster's part in opening the file and
** deleting an account.
*/
#ifndef RT_XMPP_ACCOUNTS_IMPL_H
#define RT_XMPP_ACCOUNTS_IMPL_H

#include <sqlite3.h>

#include "accounts.h"
#include "jid.h"

#define RT__ACCOUNTS_STMTS 16 /* room for accounts.c's statements (it checks its count fits) */
#define RT__ROSTER_STMTS 16   /* room for roster.c's */
#define RT__XEPS_STMTS                                                                             \
    56 /* room for blocking.c's, vcard.c's, archive.c's, the rooms', pep.c's, fast.c's and         \
          push.c's (xeps.h) */

/* Owned by accounts.c (open, close); roster.c prepares and uses rst[]. */
struct rt_accounts_s {
    sqlite3 *db;
    sqlite3_stmt *st[RT__ACCOUNTS_STMTS]; /* accounts.c's, prepared once (persistent) */
    sqlite3_stmt *rst[RT__ROSTER_STMTS];  /* roster.c's, the same; finalized at close */
    sqlite3_stmt *xst[RT__XEPS_STMTS];    /* the XEPs' (XST_* below), the same */
    bool snapshot;                        /* rt_accounts_snapshot's transaction is open */
    unsigned reads;                       /* read transactions begun inside it, not ended */
    char path[512];
};

/* A prepared host and user name: the key of an account's rows in every table. */
typedef struct rt__names_s {
    char host[RT_JID_PART_MAX + 1];
    char user[RT_JID_PART_MAX + 1];
    size_t host_len, user_len;
} rt__names_t;

/* Prepares host and user into n: 0, or RT_EINVAL with err (the part that does not prepare). */
int rt__accounts_names(const char *host, const char *user, rt__names_t *n, char *err,
                       size_t errlen);

/* "path: SQLite's last message" into err; returns RT_EAGAIN. */
int rt__accounts_db_error(rt_accounts_t *a, char *err, size_t errlen);

/* A cached statement, reset, with the host and user bound as ?1 and ?2. */
sqlite3_stmt *rt__accounts_keyed(sqlite3_stmt *st, const rt__names_t *n);

/*
** Opens a transaction: write (BEGIN IMMEDIATE: waits up to RT_ACCOUNTS_BUSY_MS for another
** writer) or read (one snapshot for several statements). 0 or RT_EAGAIN.
*/
int rt__accounts_begin(rt_accounts_t *a, bool write);
/* Ends it: commits when rc >= 0 (then returns rc, or RT_EAGAIN if the commit failed), else
   rolls back and returns rc. */
int rt__accounts_end(rt_accounts_t *a, int rc);

/* roster.c: prepares rst[] at open (0 or RT_EAGAIN). */
int rt__roster_prepare(rt_accounts_t *a);
/* An item of another account that named one being removed, changed by rt__roster_forget. */
typedef struct rt__forgot_s {
    rt__names_t owner;
    uint64_t version; /* the owner's roster's new version */
} rt__forgot_t;
/*
** roster.c: the contacts' side of n's removal, inside the caller's transaction: each account
** of this file in n's roster keeps its item for n with no subscription (as if n had sent
** unsubscribe and unsubscribed, RFC 6121 3.2-3.3; ejabberd and Prosody do the same) and
** loses one that held only n's pending request, so a new account of the name is granted
** nothing the old one was. *out (free it) lists the changed items. 0, RT_EAGAIN, RT_ENOMEM.
*/
int rt__roster_forget(rt_accounts_t *a, const rt__names_t *n, rt__forgot_t **out, size_t *nout);
/* roster.c: deletes n's roster and offline messages, and moves its roster version on, inside
   the caller's transaction: 0 or RT_EAGAIN. */
int rt__roster_drop(rt_accounts_t *a, const rt__names_t *n);

/*
** The XEPs' statements in xst[], by file: blocking.c, vcard.c, archive.c. Prepared at open
** from xeps_sql (each file's part of it, kept in order by the designated initializers).
*/
enum {
    XST_BLOCK_LIST,
    XST_BLOCK_ADD,
    XST_BLOCK_DEL,
    XST_BLOCK_CLEAR,
    XST_BLOCK_COUNT,
    XST_ACCOUNT, /* 1 if the account exists */
    XST_VCARD_GET,
    XST_VCARD_PUT,
    XST_VCARD_DEL,
    XST_ARCH_PUT,
    XST_ARCH_COUNT_ADD, /* adds to the account's count; returns the new count */
    XST_ARCH_TRIM,      /* drops the account's ?3 oldest */
    XST_ARCH_COUNT_SUB, /* takes ?3 from the account's count */
    XST_ARCH_CLEAR,
    XST_ARCH_COUNTS_CLEAR,
    XST_ARCH_FWD,      /* a page oldest first: ?3 ?4 stamps, ?5 ?6 ids (exclusive), ?7 rows */
    XST_ARCH_BACK,     /* newest first */
    XST_ARCH_WITH_FWD, /* the same with ?8 the other party's bare JID */
    XST_ARCH_WITH_BACK,
    XST_ARCH_COUNT,      /* how many: ?3 ?4 stamps */
    XST_ARCH_WITH_COUNT, /* the same with ?8 */
    XST_ARCH_LAST,       /* the greatest id */
    XST_MUC_PUT,         /* xeps.c: persistent rooms (XEP-0045) */
    XST_MUC_DEL,
    XST_MUC_LIST,
    XST_PEP_NODE_GET, /* pep.c: ?3 the node */
    XST_PEP_NODE_PUT, /* ?4 access, ?5 max_items */
    XST_PEP_NODE_COUNT,
    XST_PEP_NODE_DEL,
    XST_PEP_NODE_EMPTY, /* its items */
    XST_PEP_ITEM_PUT,   /* ?4 the item's id, ?5 its payload */
    XST_PEP_ITEM_DEL,
    XST_PEP_TRIM,  /* drops all but the ?4 newest */
    XST_PEP_BYTES, /* of all the account's items */
    XST_PEP_ITEMS, /* the ?4 newest, oldest first */
    XST_PEP_ITEM,  /* ?4 the id */
    XST_PEP_LAST,  /* each node's newest item, with the node's access model */
    XST_PEP_CLEAR_ITEMS,
    XST_PEP_CLEAR_NODES,
    XST_FAST_GET, /* fast.c: ?3 the agent */
    XST_FAST_PUT, /* ?3 agent, ?4 mechanism, ?5 token, ?6 expiry: the one before kept */
    XST_FAST_DEL,
    XST_FAST_CLEAR,
    XST_FAST_TRIM, /* all but the ?3 latest to expire */
    XST_PUSH_PUT,  /* push.c: ?3 the app server's JID, ?4 node, ?5 options, ?6 when */
    XST_PUSH_DEL,  /* ?3 JID, ?4 node (NULL: all of the JID's) */
    XST_PUSH_LIST, /* the account's, oldest first */
    XST_PUSH_CLEAR,
    XST_PUSH_TRIM, /* all but the ?3 newest */
    XST_N
};
_Static_assert(XST_N <= RT__XEPS_STMTS, "room for the XEPs' statements");

/* xeps.c: prepares xst[] at open; deletes what the XEPs keep for n inside the caller's
   transaction (account deletion). 0 or RT_EAGAIN. */
int rt__xeps_prepare(rt_accounts_t *a);
int rt__xeps_drop(rt_accounts_t *a, const rt__names_t *n);
/* Names as keys: RT_EINVAL for a name no account can have. */
int rt__xeps_names(const char *host, const char *user, rt__names_t *n);
/* Whether user@host's account exists: 1, 0, or RT_EAGAIN. */
int rt__xeps_account(rt_accounts_t *a, const rt__names_t *n);
/* A write transaction for user@host's rows, open when it returns 0: RT_ENOTFOUND (no such
   account) or RT_EAGAIN, none open. */
int rt__xeps_begin_for(rt_accounts_t *a, const rt__names_t *n);
/* Runs a statement that returns no row to its end, and resets it: 0 or RT_EAGAIN. */
int rt__xeps_run(sqlite3_stmt *st);
/* Each row of a statement of two texts and a blob to fn, then resets it: 0 or RT_EAGAIN. */
int rt__xeps_each_row(sqlite3_stmt *st,
                      void (*fn)(const char *a, const char *b, const void *blob, size_t len,
                                 void *arg),
                      void *arg);

#endif

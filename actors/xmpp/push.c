/*
** Push registrations in xmpp.db (xeps.h; schema version 7, accounts.c): the app servers each
** account's clients asked to be notified through (XEP-0357 5).
*/
#include <sqlite3.h>
#include <string.h>

#include "accounts_impl.h"
#include "jid.h"
#include "xeps.h"

#define NODE_MAX 1024 /* bytes of a node name (the app server's: a device token is ~200) */

static int names(const char *host, const char *user, const char *jid, const char *node,
                 rt__names_t *n)
{
    int rc = rt__xeps_names(host, user, n);
    if (rc)
        return rc;
    size_t jlen = jid ? strlen(jid) : 0, nlen = node ? strlen(node) : 1;
    return jlen && jlen <= RT_JID_TEXT_MAX && nlen && nlen <= NODE_MAX ? 0 : RT_EINVAL;
}

int rt_push_put(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                const char *node, const void *options, size_t len, int64_t now_ms, uint32_t max)
{
    rt__names_t n;
    int rc = names(host, user, jid, node, &n);
    if (rc)
        return rc;
    if (!node || len > RT_PUSH_OPTIONS_MAX || !max)
        return RT_EINVAL;
    if ((rc = rt__xeps_begin_for(a, &n)) != 0)
        return rc;
    sqlite3_stmt *st = rt__accounts_keyed(a->xst[XST_PUSH_PUT], &n);
    sqlite3_bind_text(st, 3, jid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, node, -1, SQLITE_STATIC);
    if (len)
        sqlite3_bind_blob(st, 5, options, (int)len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 5);
    sqlite3_bind_int64(st, 6, now_ms);
    rc = rt__xeps_run(st);
    if (rc == 0) {
        st = rt__accounts_keyed(a->xst[XST_PUSH_TRIM], &n);
        sqlite3_bind_int64(st, 3, max);
        rc = rt__xeps_run(st);
    }
    return rt__accounts_end(a, rc);
}

int rt_push_del(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                const char *node)
{
    rt__names_t n;
    int rc = names(host, user, jid, node, &n);
    if (rc)
        return rc;
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    sqlite3_stmt *st = rt__accounts_keyed(a->xst[XST_PUSH_DEL], &n);
    sqlite3_bind_text(st, 3, jid, -1, SQLITE_STATIC);
    if (node)
        sqlite3_bind_text(st, 4, node, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 4);
    return rt__accounts_end(a, rt__xeps_run(st));
}

int rt_push_each(rt_accounts_t *a, const char *host, const char *user,
                 void (*fn)(const char *jid, const char *node, const void *options, size_t len,
                            void *arg),
                 void *arg)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    return rt__xeps_each_row(rt__accounts_keyed(a->xst[XST_PUSH_LIST], &n), fn, arg);
}

/*
** FAST tokens in xmpp.db (xeps.h; schema version 6, accounts.c): one row a client (the
** user-agent id it logs in with), the token in force and the one before it.
*/
#include <sqlite3.h>
#include <string.h>

#include "accounts_impl.h"
#include "xeps.h"

#define AGENT_MAX 256 /* bytes of a user-agent id (XEP-0388 asks for a UUID: 36) */

static int names(const char *host, const char *user, const char *agent, rt__names_t *n)
{
    int rc = rt__xeps_names(host, user, n);
    size_t len = agent ? strlen(agent) : 1;
    return rc ? rc : len && len <= AGENT_MAX ? 0 : RT_EINVAL;
}

static sqlite3_stmt *at_agent(rt_accounts_t *a, int which, const rt__names_t *n, const char *agent)
{
    sqlite3_stmt *st = rt__accounts_keyed(a->xst[which], n);
    if (agent)
        sqlite3_bind_text(st, 3, agent, -1, SQLITE_STATIC);
    return st;
}

int rt_fast_put(rt_accounts_t *a, const char *host, const char *user, const char *agent,
                const char *mechanism, const void *token, size_t len, int64_t expiry_ms,
                uint32_t max_agents)
{
    rt__names_t n;
    int rc = names(host, user, agent, &n);
    if (rc)
        return rc;
    if (!agent || !mechanism || !len || len > RT_FAST_TOKEN_MAX || !max_agents)
        return RT_EINVAL;
    if ((rc = rt__xeps_begin_for(a, &n)) != 0)
        return rc;
    sqlite3_stmt *st = at_agent(a, XST_FAST_PUT, &n, agent);
    sqlite3_bind_text(st, 4, mechanism, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 5, token, (int)len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, expiry_ms);
    rc = rt__xeps_run(st);
    if (rc == 0) {
        st = rt__accounts_keyed(a->xst[XST_FAST_TRIM], &n);
        sqlite3_bind_int64(st, 3, max_agents);
        rc = rt__xeps_run(st);
    }
    return rt__accounts_end(a, rc);
}

int rt_fast_get(rt_accounts_t *a, const char *host, const char *user, const char *agent,
                const char *mechanism, int64_t now_ms,
                void (*fn)(const void *token, size_t len, void *arg), void *arg)
{
    rt__names_t n;
    int rc = names(host, user, agent, &n);
    if (rc || !agent || !mechanism)
        return rc ? rc : RT_EINVAL;
    sqlite3_stmt *st = at_agent(a, XST_FAST_GET, &n, agent);
    int s = sqlite3_step(st);
    rc = s == SQLITE_ROW || s == SQLITE_DONE ? RT_ENOTFOUND : RT_EAGAIN;
    /* Bound to the mechanism it was issued for (XEP-0484 3.3). */
    if (s == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), mechanism) == 0) {
        for (int col = 1; col <= 3; col += 2) {
            if (sqlite3_column_type(st, col) == SQLITE_NULL ||
                sqlite3_column_int64(st, col + 1) <= now_ms)
                continue;
            fn(sqlite3_column_blob(st, col), (size_t)sqlite3_column_bytes(st, col), arg);
            rc = 0;
        }
    }
    sqlite3_reset(st);
    return rc;
}

int rt_fast_del(rt_accounts_t *a, const char *host, const char *user, const char *agent)
{
    rt__names_t n;
    int rc = names(host, user, agent, &n);
    if (rc)
        return rc;
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    return rt__accounts_end(
        a, rt__xeps_run(at_agent(a, agent ? XST_FAST_DEL : XST_FAST_CLEAR, &n, agent)));
}

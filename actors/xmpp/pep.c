/*
** PEP's nodes and items in xmpp.db (xeps.h; schema version 5, accounts.c). The statements are
** xeps.c's (XST_PEP_*); an account's bounds are checked inside the publish's transaction, so
** two publishes of one account cannot both pass one bound.
*/
#include <sqlite3.h>
#include <string.h>

#include "accounts_impl.h"
#include "xeps.h"

#define PEP_NAME_MAX 1023 /* bytes of a node's name or an item's id */

static bool name_ok(const char *s)
{
    size_t len = s ? strlen(s) : 0;
    return len > 0 && len <= PEP_NAME_MAX;
}

/* host and user as keys, and node and item (NULL: none) checked: 0 or RT_EINVAL. */
static int names(const char *host, const char *user, const char *node, const char *item,
                 rt__names_t *n)
{
    int rc = rt__xeps_names(host, user, n);
    return rc ? rc : name_ok(node) && (!item || name_ok(item)) ? 0 : RT_EINVAL;
}

static sqlite3_stmt *at_node(rt_accounts_t *a, int which, const rt__names_t *n, const char *node)
{
    sqlite3_stmt *st = rt__accounts_keyed(a->xst[which], n);
    sqlite3_bind_text(st, 3, node, -1, SQLITE_STATIC);
    return st;
}

/* One integer a statement answers (-1: none, or an error). */
static int64_t one_int(sqlite3_stmt *st)
{
    int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    return v;
}

static int node_get(rt_accounts_t *a, const rt__names_t *n, const char *node, rt_pep_node_t *got)
{
    sqlite3_stmt *st = at_node(a, XST_PEP_NODE_GET, n, node);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        got->access = (uint32_t)sqlite3_column_int64(st, 0);
        got->max_items = (uint32_t)sqlite3_column_int64(st, 1);
    }
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 0 : s == SQLITE_DONE ? RT_ENOTFOUND : RT_EAGAIN;
}

/* The node made, or its configuration checked against want (the caller's transaction). */
static int node_ready(rt_accounts_t *a, const rt__names_t *n, const char *node,
                      const rt_pep_node_t *want, const rt_pep_bounds_t *b, rt_pep_node_t *got)
{
    int rc = node_get(a, n, node, got);
    uint32_t max = want && want->max_items ? want->max_items : 1;
    if (max > b->items)
        max = b->items;
    if (rc == 0)
        return want && ((want->access != RT_PEP_UNSET && want->access != got->access) ||
                        (want->max_items && max != got->max_items))
                   ? RT_EEXIST
                   : 0;
    if (rc != RT_ENOTFOUND)
        return rc;
    int64_t nodes = one_int(rt__accounts_keyed(a->xst[XST_PEP_NODE_COUNT], n));
    if (nodes < 0)
        return RT_EAGAIN;
    if (nodes >= (int64_t)b->nodes)
        return RT_ELIMIT;
    got->access = want && want->access != RT_PEP_UNSET ? want->access : RT_PEP_PRESENCE;
    got->max_items = max;
    sqlite3_stmt *st = at_node(a, XST_PEP_NODE_PUT, n, node);
    sqlite3_bind_int64(st, 4, got->access);
    sqlite3_bind_int64(st, 5, got->max_items);
    return rt__xeps_run(st);
}

int rt_pep_publish(rt_accounts_t *a, const char *host, const char *user, const char *node,
                   const char *item, const void *payload, size_t len, const rt_pep_node_t *want,
                   const rt_pep_bounds_t *bounds, rt_pep_node_t *got)
{
    rt__names_t n;
    int rc = names(host, user, node, item, &n);
    if (rc)
        return rc;
    if (!item || len == 0 || len > INT32_MAX ||
        (want && want->access > RT_PEP_WHITELIST && want->access != RT_PEP_UNSET) ||
        bounds->items == 0)
        return RT_EINVAL;
    if (len > bounds->bytes)
        return RT_ELIMIT;
    if ((rc = rt__xeps_begin_for(a, &n)) != 0)
        return rc;
    rc = node_ready(a, &n, node, want, bounds, got);
    if (rc == 0) {
        sqlite3_stmt *st = at_node(a, XST_PEP_ITEM_DEL, &n, node);
        sqlite3_bind_text(st, 4, item, -1, SQLITE_STATIC);
        rc = rt__xeps_run(st);
    }
    if (rc == 0) {
        sqlite3_stmt *st = at_node(a, XST_PEP_ITEM_PUT, &n, node);
        sqlite3_bind_text(st, 4, item, -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 5, payload, (int)len, SQLITE_STATIC);
        rc = rt__xeps_run(st);
    }
    if (rc == 0) {
        sqlite3_stmt *st = at_node(a, XST_PEP_TRIM, &n, node);
        sqlite3_bind_int64(st, 4, got->max_items);
        rc = rt__xeps_run(st);
    }
    if (rc == 0) { /* counted after the trim: a replaced or dropped item's bytes are free */
        int64_t bytes = one_int(rt__accounts_keyed(a->xst[XST_PEP_BYTES], &n));
        rc = bytes < 0 ? RT_EAGAIN : (uint64_t)bytes > bounds->bytes ? RT_ELIMIT : 0;
    }
    return rt__accounts_end(a, rc);
}

int rt_pep_node(rt_accounts_t *a, const char *host, const char *user, const char *node,
                rt_pep_node_t *got)
{
    rt__names_t n;
    int rc = names(host, user, node, NULL, &n);
    return rc ? rc : node_get(a, &n, node, got);
}

int rt_pep_items(rt_accounts_t *a, const char *host, const char *user, const char *node,
                 const char *item, uint32_t max,
                 void (*fn)(const char *id, const void *payload, size_t len, void *arg), void *arg)
{
    rt__names_t n;
    int rc = names(host, user, node, item, &n);
    if (rc)
        return rc;
    rt_pep_node_t cfg;
    if ((rc = node_get(a, &n, node, &cfg)) != 0)
        return rc;
    sqlite3_stmt *st = at_node(a, item ? XST_PEP_ITEM : XST_PEP_ITEMS, &n, node);
    if (item)
        sqlite3_bind_text(st, 4, item, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(st, 4, max);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        fn((const char *)sqlite3_column_text(st, 0), sqlite3_column_blob(st, 1),
           (size_t)sqlite3_column_bytes(st, 1), arg);
    sqlite3_reset(st);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

int rt_pep_last(rt_accounts_t *a, const char *host, const char *user,
                void (*fn)(const char *node, uint32_t access, const char *id, const void *payload,
                           size_t len, void *arg),
                void *arg)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    sqlite3_stmt *st = rt__accounts_keyed(a->xst[XST_PEP_LAST], &n);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        fn((const char *)sqlite3_column_text(st, 0), (uint32_t)sqlite3_column_int64(st, 1),
           (const char *)sqlite3_column_text(st, 2), sqlite3_column_blob(st, 3),
           (size_t)sqlite3_column_bytes(st, 3), arg);
    sqlite3_reset(st);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

int rt_pep_delete(rt_accounts_t *a, const char *host, const char *user, const char *node,
                  const char *item)
{
    rt__names_t n;
    int rc = names(host, user, node, item, &n);
    if (rc)
        return rc;
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    rt_pep_node_t cfg;
    rc = node_get(a, &n, node, &cfg);
    sqlite3_stmt *st = at_node(a, item ? XST_PEP_ITEM_DEL : XST_PEP_NODE_EMPTY, &n, node);
    if (item)
        sqlite3_bind_text(st, 4, item, -1, SQLITE_STATIC);
    if (rc == 0)
        rc = rt__xeps_run(st);
    else
        sqlite3_reset(st);
    if (rc == 0 && item && sqlite3_changes(a->db) == 0)
        rc = RT_ENOTFOUND;
    if (rc == 0 && !item)
        rc = rt__xeps_run(at_node(a, XST_PEP_NODE_DEL, &n, node));
    return rt__accounts_end(a, rc);
}

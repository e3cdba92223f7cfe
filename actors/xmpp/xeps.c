/*
** The XEPs' tables in xmpp.db (xeps.h): their statements, the blocklist (XEP-0191) and the
** vCard (XEP-0054); the archive's calls are in archive.c.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "accounts_impl.h"
#include "xeps.h"

#define KEY "host = ?1 AND username = ?2"
#define ARCH_PAGE                                                                                  \
    "SELECT id, stamp, stanza FROM archive WHERE " KEY                                             \
    " AND stamp >= ?3 AND stamp <= ?4 AND id > ?5 AND id < ?6"

static const char *const sql[XST_N] = {
    [XST_BLOCK_LIST] = "SELECT jid FROM blocklist WHERE " KEY " ORDER BY jid",
    [XST_BLOCK_ADD] = "INSERT OR IGNORE INTO blocklist VALUES (?1, ?2, ?3)",
    [XST_BLOCK_DEL] = "DELETE FROM blocklist WHERE " KEY " AND jid = ?3",
    [XST_BLOCK_CLEAR] = "DELETE FROM blocklist WHERE " KEY,
    [XST_BLOCK_COUNT] = "SELECT count(*) FROM blocklist WHERE " KEY,
    [XST_ACCOUNT] = "SELECT 1 FROM accounts WHERE " KEY,
    [XST_VCARD_GET] = "SELECT vcard FROM vcard WHERE " KEY,
    [XST_VCARD_PUT] = "INSERT OR REPLACE INTO vcard VALUES (?1, ?2, ?3)",
    [XST_VCARD_DEL] = "DELETE FROM vcard WHERE " KEY,
    [XST_ARCH_PUT] = "INSERT INTO archive(host, username, with_jid, stamp, stanza, id) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [XST_ARCH_COUNT_ADD] = "INSERT INTO archive_counts VALUES (?1, ?2, 1) "
                           "ON CONFLICT(host, username) DO UPDATE SET count = count + 1 "
                           "RETURNING count",
    [XST_ARCH_TRIM] = "DELETE FROM archive WHERE id IN (SELECT id FROM archive WHERE " KEY
                      " ORDER BY id LIMIT ?3)",
    [XST_ARCH_COUNT_SUB] = "UPDATE archive_counts SET count = count - ?3 WHERE " KEY,
    [XST_ARCH_CLEAR] = "DELETE FROM archive WHERE " KEY,
    [XST_ARCH_COUNTS_CLEAR] = "DELETE FROM archive_counts WHERE " KEY,
    [XST_ARCH_FWD] = ARCH_PAGE " ORDER BY id LIMIT ?7",
    [XST_ARCH_BACK] = ARCH_PAGE " ORDER BY id DESC LIMIT ?7",
    [XST_ARCH_WITH_FWD] = ARCH_PAGE " AND with_jid = ?8 ORDER BY id LIMIT ?7",
    [XST_ARCH_WITH_BACK] = ARCH_PAGE " AND with_jid = ?8 ORDER BY id DESC LIMIT ?7",
    [XST_ARCH_COUNT] = "SELECT count(*) FROM archive WHERE " KEY " AND stamp >= ?3 AND stamp <= ?4",
    [XST_ARCH_WITH_COUNT] = "SELECT count(*) FROM archive WHERE " KEY
                            " AND stamp >= ?3 AND stamp <= ?4 AND with_jid = ?8",
    [XST_ARCH_LAST] = "SELECT max(id) FROM archive",
    [XST_MUC_PUT] = "INSERT OR REPLACE INTO muc_rooms VALUES (?1, ?2, ?3)",
    [XST_MUC_DEL] = "DELETE FROM muc_rooms WHERE " KEY,
    [XST_MUC_LIST] = "SELECT host, username, state FROM muc_rooms ORDER BY host, username",
    [XST_PEP_NODE_GET] = "SELECT access, max_items FROM pep_nodes WHERE " KEY " AND node = ?3",
    [XST_PEP_NODE_PUT] = "INSERT OR REPLACE INTO pep_nodes VALUES (?1, ?2, ?3, ?4, ?5)",
    [XST_PEP_NODE_COUNT] = "SELECT count(*) FROM pep_nodes WHERE " KEY,
    [XST_PEP_NODE_DEL] = "DELETE FROM pep_nodes WHERE " KEY " AND node = ?3",
    [XST_PEP_NODE_EMPTY] = "DELETE FROM pep_items WHERE " KEY " AND node = ?3",
    [XST_PEP_ITEM_PUT] = "INSERT INTO pep_items(host, username, node, item, payload) "
                         "VALUES (?1, ?2, ?3, ?4, ?5)",
    [XST_PEP_ITEM_DEL] = "DELETE FROM pep_items WHERE " KEY " AND node = ?3 AND item = ?4",
    [XST_PEP_TRIM] = "DELETE FROM pep_items WHERE seq IN (SELECT seq FROM pep_items WHERE " KEY
                     " AND node = ?3 ORDER BY seq DESC LIMIT -1 OFFSET ?4)",
    [XST_PEP_BYTES] = "SELECT coalesce(sum(length(payload)), 0) FROM pep_items WHERE " KEY,
    [XST_PEP_ITEMS] = "SELECT item, payload FROM (SELECT seq, item, payload FROM pep_items "
                      "WHERE " KEY " AND node = ?3 ORDER BY seq DESC LIMIT ?4) ORDER BY seq",
    [XST_PEP_ITEM] =
        "SELECT item, payload FROM pep_items WHERE " KEY " AND node = ?3 AND item = ?4",
    [XST_PEP_LAST] = "SELECT n.node, n.access, i.item, i.payload FROM pep_nodes n "
                     "JOIN pep_items i ON i.seq = (SELECT max(seq) FROM pep_items "
                     "WHERE host = n.host AND username = n.username AND node = n.node) "
                     "WHERE n.host = ?1 AND n.username = ?2 ORDER BY n.node",
    [XST_PEP_CLEAR_ITEMS] = "DELETE FROM pep_items WHERE " KEY,
    [XST_PEP_CLEAR_NODES] = "DELETE FROM pep_nodes WHERE " KEY,
    [XST_FAST_GET] = "SELECT mechanism, token, expiry, prev_token, prev_expiry FROM fast_tokens "
                     "WHERE " KEY " AND agent = ?3",
    [XST_FAST_PUT] = "INSERT INTO fast_tokens VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, NULL) "
                     "ON CONFLICT(host, username, agent) DO UPDATE SET mechanism = ?4, "
                     "prev_token = token, prev_expiry = expiry, token = ?5, expiry = ?6",
    [XST_FAST_DEL] = "DELETE FROM fast_tokens WHERE " KEY " AND agent = ?3",
    [XST_FAST_CLEAR] = "DELETE FROM fast_tokens WHERE " KEY,
    [XST_FAST_TRIM] = "DELETE FROM fast_tokens WHERE " KEY " AND agent NOT IN (SELECT agent "
                      "FROM fast_tokens WHERE " KEY " ORDER BY expiry DESC LIMIT ?3)",
    [XST_PUSH_PUT] = "INSERT INTO push VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                     "ON CONFLICT(host, username, jid, node) DO UPDATE SET options = ?5, "
                     "created = ?6",
    [XST_PUSH_DEL] = "DELETE FROM push WHERE " KEY " AND jid = ?3 AND (?4 IS NULL OR node = ?4)",
    [XST_PUSH_LIST] =
        "SELECT jid, node, options FROM push WHERE " KEY " ORDER BY created, jid, node",
    [XST_PUSH_CLEAR] = "DELETE FROM push WHERE " KEY,
    [XST_PUSH_TRIM] = "DELETE FROM push WHERE " KEY " AND (jid, node) NOT IN (SELECT jid, node "
                      "FROM push WHERE " KEY " ORDER BY created DESC LIMIT ?3)",
};

int rt__xeps_prepare(rt_accounts_t *a)
{
    for (int i = 0; i < XST_N; i++)
        if (sqlite3_prepare_v3(a->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &a->xst[i], NULL) !=
            SQLITE_OK)
            return RT_EAGAIN;
    return 0;
}

int rt__xeps_run(sqlite3_stmt *st)
{
    int s = sqlite3_step(st);
    sqlite3_reset(st);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

static sqlite3_stmt *keyed(rt_accounts_t *a, int which, const rt__names_t *n)
{
    return rt__accounts_keyed(a->xst[which], n);
}

int rt__xeps_drop(rt_accounts_t *a, const rt__names_t *n)
{
    static const int drops[] = {XST_BLOCK_CLEAR,       XST_VCARD_DEL,       XST_ARCH_CLEAR,
                                XST_ARCH_COUNTS_CLEAR, XST_PEP_CLEAR_ITEMS, XST_PEP_CLEAR_NODES,
                                XST_FAST_CLEAR,        XST_PUSH_CLEAR};
    for (size_t i = 0; i < sizeof(drops) / sizeof(drops[0]); i++)
        if (rt__xeps_run(keyed(a, drops[i], n)))
            return RT_EAGAIN;
    return 0;
}

int rt__xeps_names(const char *host, const char *user, rt__names_t *n)
{
    char err[RT_ACCOUNTS_ERR_LEN];
    return rt__accounts_names(host, user, n, err, sizeof(err));
}

int rt__xeps_account(rt_accounts_t *a, const rt__names_t *n)
{
    sqlite3_stmt *st = keyed(a, XST_ACCOUNT, n);
    int s = sqlite3_step(st);
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 1 : s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

int rt__xeps_begin_for(rt_accounts_t *a, const rt__names_t *n)
{
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    int rc = rt__xeps_account(a, n);
    return rc == 1 ? 0 : rt__accounts_end(a, rc == 0 ? RT_ENOTFOUND : rc);
}

/* ---- Blocklist ---- */

int rt_block_list(rt_accounts_t *a, const char *host, const char *user,
                  int (*fn)(const char *jid, size_t len, void *arg), void *arg)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    sqlite3_stmt *st = keyed(a, XST_BLOCK_LIST, &n);
    int s;
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW)
        rc = fn((const char *)sqlite3_column_text(st, 0), (size_t)sqlite3_column_bytes(st, 0), arg);
    if (rc == 0 && s != SQLITE_DONE)
        rc = RT_EAGAIN;
    sqlite3_reset(st);
    return rc;
}

static bool jid_ok(const char *jid)
{
    size_t len = jid ? strlen(jid) : 0;
    return len > 0 && len <= RT_JID_TEXT_MAX;
}

/* Adds or removes each of n JIDs with statement which, in the open transaction. */
static int each_jid(rt_accounts_t *a, int which, const rt__names_t *n, const char *const *jids,
                    size_t count)
{
    for (size_t i = 0; i < count; i++) {
        sqlite3_stmt *st = keyed(a, which, n);
        sqlite3_bind_text(st, 3, jids[i], -1, SQLITE_STATIC);
        if (rt__xeps_run(st))
            return RT_EAGAIN;
    }
    return 0;
}

int rt_block_add(rt_accounts_t *a, const char *host, const char *user, const char *const *jids,
                 size_t count, uint32_t max)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < count; i++)
        if (!jid_ok(jids[i]))
            return RT_EINVAL;
    if ((rc = rt__xeps_begin_for(a, &n)) != 0)
        return rc;
    rc = each_jid(a, XST_BLOCK_ADD, &n, jids, count);
    if (rc == 0) { /* counted after: a JID blocked already, or twice in jids, adds nothing */
        sqlite3_stmt *st = keyed(a, XST_BLOCK_COUNT, &n);
        int s = sqlite3_step(st);
        int64_t have = s == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
        sqlite3_reset(st);
        rc = have < 0 ? RT_EAGAIN : have > (int64_t)max ? RT_ELIMIT : 0;
    }
    return rt__accounts_end(a, rc);
}

int rt_block_del(rt_accounts_t *a, const char *host, const char *user, const char *const *jids,
                 size_t count)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    if (count == 0)
        return rt__xeps_run(keyed(a, XST_BLOCK_CLEAR, &n));
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    return rt__accounts_end(a, each_jid(a, XST_BLOCK_DEL, &n, jids, count));
}

/* ---- vCard ---- */

int rt_vcard_get(rt_accounts_t *a, const char *host, const char *user,
                 void (*fn)(const void *vcard, size_t len, void *arg), void *arg)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    sqlite3_stmt *st = keyed(a, XST_VCARD_GET, &n);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW)
        fn(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), arg);
    sqlite3_reset(st);
    return s == SQLITE_ROW ? 0 : s == SQLITE_DONE ? RT_ENOTFOUND : RT_EAGAIN;
}

int rt_vcard_set(rt_accounts_t *a, const char *host, const char *user, const void *vcard,
                 size_t len)
{
    rt__names_t n;
    int rc = rt__xeps_names(host, user, &n);
    if (rc)
        return rc;
    if (len > INT32_MAX)
        return RT_EINVAL;
    if ((rc = rt__xeps_begin_for(a, &n)) != 0)
        return rc;
    if (len == 0)
        rc = rt__xeps_run(keyed(a, XST_VCARD_DEL, &n));
    else {
        sqlite3_stmt *st = keyed(a, XST_VCARD_PUT, &n);
        sqlite3_bind_blob(st, 3, vcard, (int)len, SQLITE_STATIC);
        rc = rt__xeps_run(st);
    }
    return rt__accounts_end(a, rc);
}

int rt_muc_room_put(rt_accounts_t *a, const char *service, const char *room, const void *state,
                    size_t len)
{
    rt__names_t n;
    int rc = rt__xeps_names(service, room, &n);
    if (rc)
        return rc;
    if (len > INT32_MAX)
        return RT_EINVAL;
    /* Its own write transaction: the store's actor may hold a read snapshot open for the
       logins' reads, which a write left inside would leave uncommitted (and lose). */
    if (rt__accounts_begin(a, true) != 0)
        return RT_EAGAIN;
    sqlite3_stmt *st = keyed(a, len ? XST_MUC_PUT : XST_MUC_DEL, &n);
    if (len)
        sqlite3_bind_blob(st, 3, state, (int)len, SQLITE_STATIC);
    return rt__accounts_end(a, rt__xeps_run(st));
}

int rt_muc_rooms_each(rt_accounts_t *a,
                      void (*fn)(const char *service, const char *room, const void *state,
                                 size_t len, void *arg),
                      void *arg)
{
    return rt__xeps_each_row(a->xst[XST_MUC_LIST], fn, arg);
}

int rt__xeps_each_row(sqlite3_stmt *st,
                      void (*fn)(const char *a, const char *b, const void *blob, size_t len,
                                 void *arg),
                      void *arg)
{
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        fn((const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
           sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), arg);
    sqlite3_reset(st);
    return s == SQLITE_DONE ? 0 : RT_EAGAIN;
}

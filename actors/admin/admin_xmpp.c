/*
** `xmpp user list|add|passwd|del`: the XMPP accounts in data_dir/xmpp.db (actors/xmpp/
** accounts.h) while rtd runs, as `rtd xmpp user` manages them offline; `xmpp roster
** USER@HOST`: an account's stored roster (roster.h). The file is opened for
** each command and closed after it: a few a day, and `rtd xmpp user` may write it meanwhile.
** Every one runs on the admin worker (file I/O, and PBKDF2 for add and passwd: milliseconds).
** A password comes as the option --password (rtctl asks for it twice, the HTTP API takes it
** in the JSON body), so it is never one of the words the audit line (admin.change) logs.
*/
#include <string.h>

#include "accounts.h"
#include "admin_impl.h"
#include "broker.h"
#include "c2s.h"
#include "jid.h"
#include "log.h"
#include "roster.h"

/* An RT_E* code of the accounts as the answer's code. */
static int accounts_fail(rt_admin_cmd_t *c, int rc, const char *err)
{
    int code = rc == RT_ENOTFOUND ? 404 : rc == RT_EEXIST ? 409 : rc == RT_EINVAL ? 400 : 503;
    return rt__admin_fail(c, code, "%s", err);
}

static int list_row(const char *host, const char *user, int64_t created_ms, void *arg)
{
    rt_admin_cmd_t *c = arg;
    char when[32];
    rt__admin_iso_time((uint64_t)created_ms, when, sizeof(when));
    if (!c->json) {
        rt_buf_printf(&c->text, "%s@%s\tcreated %s\n", user, host, when);
        return 0;
    }
    rt_doc_t *o = rt_doc_add_object(c->doc, NULL);
    rt_doc_add_str(o, "user", user);
    rt_doc_add_str(o, "host", host);
    rt_doc_add_str(o, "created", when);
    return 0;
}

static int user_list(rt_admin_cmd_t *c, rt_accounts_t *a)
{
    if (c->argc > 4)
        return rt__admin_fail(c, 400, "usage: xmpp user list [HOST]");
    if (c->json && !(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    char err[RT_ACCOUNTS_ERR_LEN];
    int rc = rt_accounts_list(a, c->argc == 4 ? c->argv[3] : NULL, list_row, c, err, sizeof(err));
    return rc ? accounts_fail(c, rc, err) : 200;
}

/* add, passwd and del: USER@HOST (and, but for del, --password). */
static int user_change(rt_admin_cmd_t *c, rt_accounts_t *a, const char *verb)
{
    bool del = strcmp(verb, "del") == 0;
    size_t pwlen = 0;
    const char *pw = rt__admin_opt(c, "password", &pwlen);
    if (c->argc != 4 || (!del && !pw))
        return rt__admin_fail(c, 400, "usage: xmpp user %s USER@HOST%s", verb,
                              del ? "" : " --password PASSWORD");
    char user[RT_JID_PART_MAX + 1], host[RT_JID_PART_MAX + 1];
    const char *why = "";
    if (rt_jid_account(c->argv[3], c->arglen[3], user, host, &why) != 0)
        return rt__admin_fail(c, 400, "%s: %s", c->argv[3], why);
    char err[RT_ACCOUNTS_ERR_LEN];
    /* The contacts' sessions are told of their items for the account, as their clients. */
    int rc = del ? rt_accounts_del(a, host, user, rt_c2s_roster_forgot, a, err, sizeof(err))
             : strcmp(verb, "add") == 0
                 ? rt_accounts_add(a, host, user, pw, pwlen, 0, err, sizeof(err))
                 : rt_accounts_passwd(a, host, user, pw, pwlen, 0, err, sizeof(err));
    if (rc)
        return accounts_fail(c, rc, err);
    rt_c2s_accounts_changed(); /* the next login reads the new keys, not the store's snapshot */
    /* A removed account's sessions end, as a cancelled registration's do (XEP-0077 3.2). */
    size_t ended = del ? rt_c2s_account_gone(host, user) : 0;
    rt_log(RT_LOG_INFO, "xmpp.account", "change=%s user=%s host=%s sessions_ended=%zu", verb,
           user, host, ended);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "user", user);
    rt_doc_add_str(c->doc, "host", host);
    rt_doc_add_str(c->doc, "done", verb);
    if (del)
        rt_doc_add_u64(c->doc, "sessions_ended", ended);
    return 200;
}

int rt__admin_xmpp_user(rt_admin_cmd_t *c)
{
    RT_ASSERT(c->argc >= 3); /* the command table's "user list", "user add"...: the verb */
    const char *verb = c->argv[2];
    bool list = strcmp(verb, "list") == 0;
    rt_accounts_t *a = NULL;
    char err[RT_ACCOUNTS_ERR_LEN];
    int rc = rt_accounts_open(rt_broker->conf.data_dir, &a, err, sizeof(err));
    if (rc)
        return accounts_fail(c, rc, err);
    int code = list ? user_list(c, a) : user_change(c, a, verb);
    rt_accounts_close(a);
    return code;
}

/* RFC 6121's subscription attribute of an item's state. */
static const char *subscription_name(unsigned state)
{
    static const char *const names[4] = {"none", "to", "from", "both"};
    return names[state & (RT_ROSTER_TO | RT_ROSTER_FROM)];
}

static int roster_row(const rt_roster_item_t *it, void *arg)
{
    rt_admin_cmd_t *c = arg;
    rt_doc_t *o = rt_doc_add_object(c->doc, NULL);
    rt_doc_add_str(o, "contact", it->jid);
    rt_doc_add_str(o, "name", it->name ? it->name : "");
    if (c->json) {
        rt_doc_t *groups = rt_doc_add_array(o, "groups");
        for (unsigned i = 0; i < it->ngroups; i++)
            rt_doc_add_str(groups, NULL, it->groups[i]);
    } else { /* a table's cell: the groups comma-separated */
        rt_buf_t b = {0};
        for (unsigned i = 0; i < it->ngroups; i++)
            rt_buf_printf(&b, "%s%s", i ? "," : "", it->groups[i]);
        rt_doc_add_strn(o, "groups", b.data ? b.data : "", b.len);
        rt_buf_free(&b);
    }
    rt_doc_add_str(o, "subscription", subscription_name(it->state));
    rt_doc_add_bool(o, "ask", it->state & RT_ROSTER_ASK_OUT);
    rt_doc_add_bool(o, "pending_in", it->state & RT_ROSTER_PENDING_IN);
    rt_doc_add_bool(o, "preapproved", it->state & RT_ROSTER_PREAPPROVED);
    return 0;
}

int rt__admin_xmpp_roster(rt_admin_cmd_t *c)
{
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: xmpp roster USER@HOST");
    char user[RT_JID_PART_MAX + 1], host[RT_JID_PART_MAX + 1];
    const char *why = "";
    if (rt_jid_account(c->argv[2], c->arglen[2], user, host, &why) != 0)
        return rt__admin_fail(c, 400, "%s: %s", c->argv[2], why);
    rt_accounts_t *a = NULL;
    char err[RT_ACCOUNTS_ERR_LEN];
    int rc = rt_accounts_open(rt_broker->conf.data_dir, &a, err, sizeof(err));
    if (rc)
        return accounts_fail(c, rc, err);
    /* roster.h reads no account as an empty roster: the account's look tells them apart. */
    rt_scram_cred_t cred;
    rc = rt_accounts_get(a, host, user, RT_SCRAM_SHA256, &cred);
    if (rc == RT_ENOTFOUND) {
        rt_accounts_close(a);
        return rt__admin_fail(c, 404, "no account %s@%s", user, host);
    }
    if (!(c->doc = rt_doc_array())) {
        rt_accounts_close(a);
        return rt__admin_fail(c, 500, "out of memory");
    }
    rc = rt_roster_get(a, host, user, roster_row, c, NULL);
    rt_accounts_close(a);
    if (rc)
        return rt__admin_fail(c, 503, "%s@%s: the roster could not be read (%s)", user, host,
                              rt_strerror(rc));
    return 200;
}

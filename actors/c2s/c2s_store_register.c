/*
** The store actor's side of in-band registration (XEP-0077, c2s_register.c): an account made,
** its password changed, or its deletion, on the store's own accounts handle (PBKDF2 here, on
** the blocking pool). The asking session gets a c2s_reply_t with the iq id and the account's
** name after it; a deletion then ends every session of the account.
*/
#include <string.h>

#include "c2s_impl.h"
#include "c2s_store.h"
#include "log.h"

/* The answer: rc, then the iq id, NUL and the user (for the session's log line). */
static void reply(rt_pid_t to, const c2s_req_t *r, int rc, const char *id, size_t idlen,
                  const char *user)
{
    size_t ulen = strlen(user);
    rt_buf_t b = {0};
    c2s_reply_t head = {.op = r->op, .seq = r->seq, .rc = rc, .len = (uint32_t)(idlen + 1 + ulen)};
    rt_buf_add(&b, &head, sizeof(head));
    rt_buf_add(&b, id, idlen);
    rt_buf_add(&b, "", 1);
    rt_buf_add(&b, user, ulen);
    if (!b.oom)
        rt_send(to, C2S_MSG_STORE_REPLY, b.data, b.len);
    rt_buf_free(&b);
}

/* The id at the head of a request's data (up to its NUL, or all of it). */
static size_t id_len(const uint8_t *data, size_t len)
{
    const uint8_t *nul = memchr(data, 0, len);
    return nul ? (size_t)(nul - data) : len;
}

void rt__c2s_store_register_lost(rt_pid_t to, const c2s_req_t *r)
{
    const uint8_t *data = (const uint8_t *)r->bytes + r->host_len + r->user_len;
    reply(to, r, RT_EAGAIN, (const char *)data, id_len(data, r->data_len), "");
}

/* Told by message: each session's actor ends itself; the upload actor deletes its files. */
size_t rt_c2s_account_gone(const char *host, const char *user)
{
    if (!rt__c2s.conf)
        return 0;
    rt__c2s_upload_forget(host, user);
    return rt__c2s_reg_to_account(host, user, C2S_MSG_ACCOUNT_GONE, NULL, 0, false);
}

void rt__c2s_store_register(rt_accounts_t *a, rt_pid_t to, const c2s_req_t *r, const char *host,
                            const char *user, const uint8_t *data, size_t len)
{
    size_t idlen = id_len(data, len);
    const char *pw = idlen < len ? (const char *)data + idlen + 1 : "";
    size_t pwlen = idlen < len ? len - idlen - 1 : 0;
    char err[RT_ACCOUNTS_ERR_LEN] = "";
    int rc;
    if (r->op == C2S_OP_REGISTER) {
        /* An existing name costs no PBKDF2. */
        rt_scram_cred_t cred;
        rc = rt_accounts_get(a, host, user, RT_SCRAM_SHA256, &cred);
        rc = rc == 0              ? RT_EEXIST
             : rc == RT_ENOTFOUND ? rt_accounts_add(a, host, user, pw, pwlen, 0, err, sizeof(err))
                                  : rc;
    } else if (r->op == C2S_OP_PASSWD) {
        rc = rt_accounts_passwd(a, host, user, pw, pwlen, 0, err, sizeof(err));
    } else {
        rc = rt_accounts_del(a, host, user, rt_c2s_roster_forgot, a, err, sizeof(err));
    }
    if (rc == RT_EAGAIN)
        rt_log(RT_LOG_WARNING, "xmpp.store_failed", "user=%s@%s error=%s", user, host, err);
    reply(to, r, rc, (const char *)data, idlen, user);
    if (rc == 0 && r->op == C2S_OP_UNREGISTER)
        rt_c2s_account_gone(host, user);
}

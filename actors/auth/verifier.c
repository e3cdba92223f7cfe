/*
** The login verifier: one actor on the blocking pool that runs the logins
** rt_auth_login_quick could not decide, so a full PBKDF2 never runs on a scheduler thread.
*/
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include <stdio.h>

#include "auth_http.h"
#include "auth_impl.h"
#include "group.h"

/*
** A request: the connection that asked is m->from. The user name, the client id and the
** password follow the header, then with has_tls the certificate's CN, subject and SHA-256;
** the message owns the only copy of the password and the verifier wipes it once decided.
*/
typedef struct {
    rt_auth_addr_t addr;
    char listener[64]; /* "host:port", "" for none */
    uint32_t reply_tag;
    uint32_t userlen; /* bytes of the user name, NUL not counted */
    uint32_t cidlen;  /* ... of the client id */
    uint32_t pwlen;
    uint16_t cnlen, subjectlen; /* with has_tls: bytes of the certificate's texts, NUL not
                                   counted */
    uint8_t has_addr, has_user, has_pw, has_tls;
    /* user name, NUL, client id, NUL, the password, then with has_tls: CN, NUL, subject,
       NUL, SHA-256 (32 bytes) */
} verify_req_t;

/* Bytes of a request's certificate part. */
static size_t tls_part_len(const verify_req_t *q)
{
    return q->has_tls ? (size_t)q->cnlen + 1 + (size_t)q->subjectlen + 1 + 32 : 0;
}

void rt__auth_verify_msg(rt_msg_t *m)
{
    if (m->tag != RT_AUTH_MSG_VERIFY || m->len < sizeof(verify_req_t))
        return;
    verify_req_t q;
    memcpy(&q, m->data, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    size_t need =
        sizeof(q) + (size_t)q.userlen + 1 + (size_t)q.cidlen + 1 + q.pwlen + tls_part_len(&q);
    const uint8_t *t = body + q.userlen + 1 + q.cidlen + 1 + q.pwlen;
    rt_auth_tls_t tls;
    if (m->len < need || body[q.userlen] != 0 || body[q.userlen + 1 + q.cidlen] != 0 ||
        (q.has_tls && (q.cnlen >= sizeof(tls.cn) || q.subjectlen >= sizeof(tls.subject) ||
                       t[q.cnlen] != 0 || t[q.cnlen + 1 + q.subjectlen] != 0))) {
        OPENSSL_cleanse(m->data, m->len);
        return;
    }
    if (q.has_tls) {
        memcpy(tls.cn, t, (size_t)q.cnlen + 1);
        memcpy(tls.subject, t + q.cnlen + 1, (size_t)q.subjectlen + 1);
        memcpy(tls.sha256, t + q.cnlen + 1 + q.subjectlen + 1, 32);
    }
    rt_auth_request_t r = {.addr = q.has_addr ? &q.addr : NULL,
                           .listener = q.listener[0] ? q.listener : NULL,
                           .user = q.has_user ? (const char *)body : NULL,
                           .clientid = (const char *)body + q.userlen + 1,
                           .pw = q.has_pw ? body + q.userlen + 1 + q.cidlen + 1 : NULL,
                           .pwlen = q.pwlen,
                           .tls = q.has_tls ? &tls : NULL};
    rt_auth_verdict_t v = {0};
    rt_auth_grant_t g;
    v.result = rt_auth_decide(&r, true, &v.delay_ms, &g);
    OPENSSL_cleanse(m->data, m->len);
    v.expire_at_s = g.expire_at_s;
    v.acl_len = (uint32_t)g.acl_len;
    memcpy(v.mount, g.mount, sizeof(v.mount));
    /* A connection that ended meanwhile makes this a dead letter, which is all it costs. */
    rt_msg_t *reply = rt_msg_new(q.reply_tag, sizeof(v) + g.acl_len);
    if (reply) {
        memcpy(reply->data, &v, sizeof(v));
        if (g.acl_len)
            memcpy(reply->data + sizeof(v), g.acl, g.acl_len);
        rt_send_msg(m->from, reply);
    }
    rt_auth_grant_free(&g);
}

void rt__auth_verify_dead(rt_msg_t *m)
{
    if (m->tag != RT_AUTH_MSG_VERIFY || m->len < sizeof(verify_req_t))
        return;
    verify_req_t q;
    memcpy(&q, m->data, sizeof(q));
    OPENSSL_cleanse(m->data, m->len);
    rt_auth_verdict_t v = {.result = RT_AUTH_PENDING};
    rt_send(m->from, q.reply_tag, &v, sizeof(v));
}

static void verifier_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)state;
    rt__auth_verify_msg(m);
    rt_consume(self, 100); /* one hash is worth many ordinary messages in rtctl top */
}

/* A request the verifier died before deciding: the connection asks again. */
static void verifier_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    rt__auth_verify_dead(m);
}

static const char *verifier_tag_name(uint32_t tag)
{
    return tag == RT_AUTH_MSG_VERIFY ? "verify" : "";
}

static const rt_actor_type_t verifier_type = {
    .name = "auth_verifier",
    .handle = verifier_handle,
    .tag_name = verifier_tag_name,
    .dead_letter = verifier_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

int rt_auth_verifier_start(rt_pid_t sup)
{
    rt_child_spec_t c = {
        .name = RT_AUTH_VERIFIER_NAME, .type = &verifier_type, .restart = RT_PERMANENT};
    return rt_group_start_one(sup, RT_AUTH_GROUP, RT_PERMANENT, &c);
}

int rt_auth_login_async(uint32_t reply_tag, const rt_auth_request_t *r)
{
    bool pooled = rt__auth_chain_calls() && rt__auth_pool_running();
    rt_pid_t verifier = pooled ? 0 : rt_whereis(RT_AUTH_VERIFIER_NAME);
    if (!pooled && !verifier)
        return RT_ENOPROC;
    size_t userlen = r->user ? strlen(r->user) : 0;
    size_t cidlen = r->clientid ? strlen(r->clientid) : 0;
    if (userlen > RT_AUTH_MAX_NAME || cidlen > RT_AUTH_MAX_NAME || r->pwlen > UINT16_MAX)
        return RT_EINVAL; /* MQTT strings and binary data are shorter */
    size_t pwlen = r->pw ? r->pwlen : 0;
    const rt_auth_tls_t *tls = r->tls;
    size_t cnlen = tls ? strnlen(tls->cn, sizeof(tls->cn)) : 0;
    size_t subjectlen = tls ? strnlen(tls->subject, sizeof(tls->subject)) : 0;
    if (cnlen == sizeof(tls->cn) || subjectlen == sizeof(tls->subject))
        return RT_EINVAL; /* not NUL-terminated */
    verify_req_t q = {.reply_tag = reply_tag,
                      .userlen = (uint32_t)userlen,
                      .cidlen = (uint32_t)cidlen,
                      .pwlen = (uint32_t)pwlen,
                      .cnlen = (uint16_t)cnlen,
                      .subjectlen = (uint16_t)subjectlen,
                      .has_addr = r->addr != NULL,
                      .has_user = r->user != NULL,
                      .has_pw = r->pw != NULL,
                      .has_tls = tls != NULL};
    rt_msg_t *m = rt_msg_new(RT_AUTH_MSG_VERIFY, sizeof(verify_req_t) + userlen + 1 + cidlen + 1 +
                                                     pwlen + tls_part_len(&q));
    if (!m)
        return RT_ENOMEM;
    if (r->addr)
        q.addr = *r->addr;
    if (r->listener)
        snprintf(q.listener, sizeof(q.listener), "%s", r->listener);
    memcpy(m->data, &q, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    if (userlen)
        memcpy(body, r->user, userlen);
    body[userlen] = 0;
    if (cidlen)
        memcpy(body + userlen + 1, r->clientid, cidlen);
    body[userlen + 1 + cidlen] = 0;
    if (pwlen)
        memcpy(body + userlen + 1 + cidlen + 1, r->pw, pwlen);
    if (tls) {
        uint8_t *t = body + userlen + 1 + cidlen + 1 + pwlen;
        memcpy(t, tls->cn, cnlen + 1);
        memcpy(t + cnlen + 1, tls->subject, subjectlen + 1);
        memcpy(t + cnlen + 1 + subjectlen + 1, tls->sha256, 32);
    }
    if (!pooled)
        return rt_send_msg(verifier, m);
    rt_actor_t *self = rt_current();
    m->from = self ? rt_self(self) : 0; /* whom the pool answers: rt_send_msg would set it */
    int rc = rt__auth_pool_push(m);
    if (rc) {
        OPENSSL_cleanse(m->data, m->len);
        rt_msg_free(m);
    }
    return rc;
}

/*
** The login verifier: one actor on the blocking pool that runs the logins
** rt_auth_login_quick could not decide, so a full PBKDF2 never runs on a scheduler thread.
*/
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "auth_impl.h"
#include "group.h"

/*
** A request: the connection that asked is m->from. The user name and password
** follow the header; the message owns the only copy of the password and the
** verifier wipes it once decided.
*/
typedef struct {
    rt_auth_addr_t addr;
    uint32_t reply_tag;
    uint32_t userlen; /* bytes of the user name, NUL not counted */
    uint32_t pwlen;
    uint8_t has_addr, has_user, has_pw;
    /* user name (NUL-terminated), then the password */
} verify_req_t;

static void verifier_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_AUTH_MSG_VERIFY || m->len < sizeof(verify_req_t))
        return;
    verify_req_t q;
    memcpy(&q, m->data, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    if (m->len < sizeof(q) + (size_t)q.userlen + 1 + q.pwlen || body[q.userlen] != 0) {
        OPENSSL_cleanse(m->data, m->len);
        return;
    }
    rt_auth_verdict_t v = {0};
    v.result = rt_auth_login(q.has_addr ? &q.addr : NULL, q.has_user ? (const char *)body : NULL,
                             q.has_pw ? body + q.userlen + 1 : NULL, q.pwlen, &v.delay_ms);
    OPENSSL_cleanse(m->data, m->len);
    /* A connection that ended meanwhile makes this a dead letter, which is all it costs. */
    rt_send(m->from, q.reply_tag, &v, sizeof(v));
    rt_consume(self, 100); /* one hash is worth many ordinary messages in rtctl top */
}

/* A request the verifier died before deciding: the connection asks again. */
static void verifier_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_AUTH_MSG_VERIFY || m->len < sizeof(verify_req_t))
        return;
    verify_req_t q;
    memcpy(&q, m->data, sizeof(q));
    OPENSSL_cleanse(m->data, m->len);
    rt_auth_verdict_t v = {.result = RT_AUTH_PENDING};
    rt_send(m->from, q.reply_tag, &v, sizeof(v));
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

int rt_auth_login_async(uint32_t reply_tag, const rt_auth_addr_t *addr, const char *user,
                        const uint8_t *pw, size_t pwlen)
{
    rt_pid_t verifier = rt_whereis(RT_AUTH_VERIFIER_NAME);
    if (!verifier)
        return RT_ENOPROC;
    size_t userlen = user ? strlen(user) : 0;
    if (userlen > RT_AUTH_MAX_NAME || pwlen > UINT16_MAX)
        return RT_EINVAL; /* MQTT strings and binary data are shorter */
    rt_msg_t *m = rt_msg_new(RT_AUTH_MSG_VERIFY, sizeof(verify_req_t) + userlen + 1 + pwlen);
    if (!m)
        return RT_ENOMEM;
    verify_req_t q = {.reply_tag = reply_tag,
                      .userlen = (uint32_t)userlen,
                      .pwlen = pw ? (uint32_t)pwlen : 0,
                      .has_addr = addr != NULL,
                      .has_user = user != NULL,
                      .has_pw = pw != NULL};
    if (addr)
        q.addr = *addr;
    memcpy(m->data, &q, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    if (userlen)
        memcpy(body, user, userlen);
    body[userlen] = 0;
    if (pw && pwlen)
        memcpy(body + userlen + 1, pw, pwlen);
    return rt_send_msg(verifier, m);
}

/*
** In-band registration (XEP-0077), the session's side, on the hosts of xmpp.register: before
** authentication a client makes an account (an iq set with username and password), then
** logs in with it as with any other; once bound it changes its password or cancels its
** account (<remove/>), which ends every session of it with a not-authorized stream error
** (3.2). The password travels as text, so only where PLAIN may go: inside TLS or from
** xmpp.plaintext_from. The store actor derives the keys (PBKDF2 on the blocking pool; only
** SCRAM keys are kept) and the session waits for its answer as for a SASL step, parsing
** paused. Bounds: one account a stream (3.1.1's not-acceptable), xmpp.register_rate tries an
** hour from one address (the auth limiter's table as a bucket, rt_auth_rate_take), names of
** C2S_REGISTER_USER_MAX bytes, passwords of RT_ACCOUNTS_PASSWORD_MAX.
*/
#include <string.h>
#include <strings.h>

#include "accounts.h"
#include "c2s_impl.h"
#include "log.h"

#define NS_REGISTER_FEATURE "http://jabber.org/features/iq-register"
/* Bytes of a self-made account's name (prepared): an operator's `rtd xmpp user add` may go
   to the JID limit, a stranger's registration not. */
#define C2S_REGISTER_USER_MAX 64

void rt__c2s_register_feature(rt_buf_t *b, const c2s_t *c)
{
    if (rt__c2s_host_register(c->host))
        rt_buf_printf(b, "<register xmlns='%s'/>", NS_REGISTER_FEATURE);
}

bool rt__c2s_register_preauth(const rt_xml_el_t *el)
{
    return strcmp(el->name, "iq") == 0 && strcmp(el->ns, RT_XML_NS_CLIENT) == 0 &&
           rt_xml_child(el, "query", RT_C2S_NS_REGISTER) != NULL;
}

/* The answer to the iq whose id is given: a result (cond NULL) or an error. */
static void answer(rt_actor_t *self, c2s_t *c, const char *id, size_t idlen, const char *type,
                   const char *cond)
{
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", cond ? "error" : "result");
    rt_xml_put_attr_len(&b, "id", id, idlen);
    rt_xml_put_attr(&b, "from", rt__c2s.conf->hosts[c->host]);
    if (c->phase == PH_ACTIVE)
        rt_xml_put_attr(&b, "to", c->jid->s);
    if (cond) {
        rt_xml_put_start_end(&b);
        rt_buf_printf(&b, "<error type='%s'><%s xmlns='%s'/></error></iq>", type, cond,
                      RT_XML_NS_STANZA_ERRORS);
    } else {
        rt_xml_put_empty_end(&b);
    }
    rt__c2s_write_stanza_buf(self, c, &b);
}

/* The fields a get is answered with: what to send, or (once bound) what the account has. */
static void fields(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", "result");
    rt_xml_put_attr(&b, "id", rt_xml_attr(iq, "id"));
    rt_xml_put_attr(&b, "from", rt__c2s.conf->hosts[c->host]);
    if (c->phase == PH_ACTIVE)
        rt_xml_put_attr(&b, "to", c->jid->s);
    rt_buf_printf(&b, "><query xmlns='%s'>", RT_C2S_NS_REGISTER);
    if (c->phase == PH_ACTIVE) {
        rt_buf_printf(&b, "<registered/><username>");
        rt_xml_put_text(&b, rt_jid_local(c->jid), c->jid->local);
        rt_buf_printf(&b, "</username><password/>");
    } else {
        rt_buf_printf(&b, "<instructions>Choose a username and password.</instructions>"
                          "<username/><password/>");
    }
    rt_buf_printf(&b, "</query></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

/* A field's text, NULL when it is missing or has child elements. */
static const char *field(const rt_xml_el_t *q, const char *name, size_t *len)
{
    const rt_xml_el_t *f = rt_xml_child(q, name, RT_C2S_NS_REGISTER);
    return f ? rt_xml_text(f, len) : NULL;
}

/* Asks the store (op with the iq id, and the password when there is one) and waits. */
static int ask(c2s_t *c, uint32_t op, const char *user, size_t ulen, const char *id, const char *pw,
               size_t pwlen)
{
    const char *host = rt__c2s.conf->hosts[c->host];
    rt_buf_t d = {0};
    rt_buf_add(&d, id, strlen(id) + 1);
    rt_buf_add(&d, pw, pwlen);
    c->seq++;
    int rc = d.oom
                 ? RT_ENOMEM
                 : rt__c2s_store_ask(op, c->seq, host, strlen(host), user, ulen, 0, d.data, d.len);
    rt_buf_free(&d);
    if (rc == 0)
        rt__c2s_wait(c);
    return rc;
}

/* Before authentication: a new account. */
static void make(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q)
{
    size_t ulen = 0, pwlen = 0;
    const char *user = field(q, "username", &ulen), *pw = field(q, "password", &pwlen);
    char local[RT_JID_PART_MAX + 1];
    size_t llen = 0;
    rt_auth_addr_t a;
    if (rt_xml_child(q, "remove", RT_C2S_NS_REGISTER)) { /* 3.2: no account on this stream */
        rt__c2s_stanza_error(self, c, iq, "auth", "registration-required");
    } else if (c->registered) { /* 3.1.1: a second identity */
        rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
    } else if (!user || !pw || !ulen || !pwlen || pwlen > RT_ACCOUNTS_PASSWORD_MAX) {
        rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable"); /* 3.1: all fields */
    } else if (rt_jid_prep_part(RT_JID_LOCAL, user, ulen, local, &llen, NULL) != 0 || !llen) {
        rt__c2s_stanza_error(self, c, iq, "modify", "jid-malformed");
    } else if (llen > C2S_REGISTER_USER_MAX) {
        rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
    } else if (rt__c2s_peer_addr(c, &a) == 0 &&
               !rt_auth_rate_take(rt__c2s.reg_limiter, &a, rt_mono_ms())) {
        atomic_fetch_add_explicit(&rt_c2s_stats.registrations_limited, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "xmpp.register_limited", "peer=%s host=%s", rt__c2s_peer(self, c),
               rt__c2s.conf->hosts[c->host]);
        rt__c2s_stanza_error(self, c, iq, "wait", "resource-constraint");
    } else if (ask(c, C2S_OP_REGISTER, local, llen, rt_xml_attr(iq, "id"), pw, pwlen) != 0) {
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    }
}

/* Once bound: the account's new password, or its end. */
static void change(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q)
{
    const char *id = rt_xml_attr(iq, "id");
    const char *user = rt_jid_local(c->jid);
    if (rt_xml_child(q, "remove", RT_C2S_NS_REGISTER)) {
        if (rt_xml_next(rt_xml_first(q), NULL, NULL)) /* 3.2: <remove/> alone */
            rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        else if (ask(c, C2S_OP_UNREGISTER, user, c->jid->local, id, NULL, 0) != 0)
            rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
        return;
    }
    size_t ulen = 0, pwlen = 0, llen = 0;
    const char *name = field(q, "username", &ulen), *pw = field(q, "password", &pwlen);
    char local[RT_JID_PART_MAX + 1];
    if (!name || !pw) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
    } else if (rt_jid_prep_part(RT_JID_LOCAL, name, ulen, local, &llen, NULL) != 0 ||
               llen != c->jid->local || memcmp(local, user, llen) != 0) {
        rt__c2s_stanza_error(self, c, iq, "auth", "forbidden"); /* only one's own */
    } else if (!pwlen || pwlen > RT_ACCOUNTS_PASSWORD_MAX) {    /* 3.3: never an empty one */
        rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
    } else if (ask(c, C2S_OP_PASSWD, user, c->jid->local, id, pw, pwlen) != 0) {
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    }
}

void rt__c2s_register_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q)
{
    const char *type = rt_xml_attr(iq, "type"), *to = rt_xml_attr(iq, "to");
    bool bound = c->phase == PH_ACTIVE;
    if (!type || (strcmp(type, "get") != 0 && strcmp(type, "set") != 0) || !rt_xml_attr(iq, "id")) {
        if (!bound) /* nothing else is answered before authentication */
            rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    if (!rt__c2s_host_register(c->host) ||
        (!bound && to && strcasecmp(to, rt__c2s.conf->hosts[c->host]) != 0)) {
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable"); /* 3.1 */
    } else if (!rt__c2s_may_auth(c)) { /* the password would go in the clear */
        rt__c2s_stanza_error(self, c, iq, "modify", "not-authorized");
    } else if (c->anonymous) {
        rt__c2s_stanza_error(self, c, iq, "cancel", "not-allowed");
    } else if (strcmp(type, "get") == 0) {
        fields(self, c, iq);
    } else if (bound) {
        change(self, c, iq, q);
    } else {
        make(self, c, iq, q);
    }
}

void rt__c2s_register_reply(rt_actor_t *self, c2s_t *c, const rt_msg_t *m)
{
    const c2s_reply_t *r = (const void *)m->data;
    c->waiting = false;
    if (r->len > m->len - sizeof(*r))
        return;
    const char *id = (const char *)(r + 1); /* then NUL and the account's name */
    size_t idlen = strnlen(id, r->len);
    switch (r->rc) {
    case 0:
        answer(self, c, id, idlen, NULL, NULL);
        break;
    case RT_EEXIST:
        answer(self, c, id, idlen, "cancel", "conflict");
        return;
    case RT_EINVAL: /* a password SASLprep refuses */
        answer(self, c, id, idlen, "modify", "not-acceptable");
        return;
    case RT_ENOTFOUND: /* deleted meanwhile */
        answer(self, c, id, idlen, "auth", "registration-required");
        return;
    default:
        answer(self, c, id, idlen, "wait", "internal-server-error");
        return;
    }
    if (r->op == C2S_OP_REGISTER) {
        c->registered = true;
        atomic_fetch_add_explicit(&rt_c2s_stats.registrations, 1, memory_order_relaxed);
    }
    const char *user = idlen < r->len ? id + idlen + 1 : "";
    int ulen = (int)(idlen < r->len ? r->len - idlen - 1 : 0);
    rt_log(RT_LOG_INFO, "xmpp.account", "change=%s user=%.*s host=%s peer=%s",
           r->op == C2S_OP_REGISTER ? "registered"
           : r->op == C2S_OP_PASSWD ? "passwd"
                                    : "unregistered",
           ulen, user, rt__c2s.conf->hosts[c->host], rt__c2s_peer(self, c));
}

/*
** SASL on the stream (RFC 6120 6): SCRAM-SHA-256 and SCRAM-SHA-1 against the accounts' stored
** keys, PLAIN inside TLS, ANONYMOUS where the host allows it, EXTERNAL with a verified client
** certificate (XEP-0178: its id-on-xmppAddr names the account). The session runs the exchange
** itself (microseconds: scram.h's fast steps); what needs the file (credentials, a PLAIN
** password's PBKDF2) goes to the store actor and parsing waits for its answer.
**
** A failure is written only after the login limiter's delay for the client's address (the
** MQTT CONNACK's rule, auth.h), with parsing held meanwhile: a guesser on one connection
** gets one answer per delay, and more connections share the address's count. A stream may
** fail C2S_SASL_TRIES times; then it ends.
*/
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "c2s_impl.h"
#include "log.h"
#include "tls.h"

_Static_assert(RT_SCRAM_CB_TLS_EXPORTER == RT_TLS_CB_EXPORTER &&
                   RT_SCRAM_CB_TLS_SERVER_END_POINT == RT_TLS_CB_END_POINT,
               "scram.h and tls.h name the channel binding types alike");

/* What -PLUS can bind to on this stream: none without TLS. */
static unsigned bindings(const c2s_t *c)
{
    return c->secure && rt__c2s.conf->channel_binding ? rt_xport_bindings(c->xp) : 0;
}

#define C2S_SASL_TRIES 3
#define OID_XMPP_ADDR "1.3.6.1.5.5.7.8.5" /* id-on-xmppAddr (RFC 6120 13.7.1.4) */

/* EXTERNAL: offered when TLS runs with a verified client certificate (XEP-0178 3). */
static bool external_offered(const c2s_t *c)
{
    return rt_xport_tls_other_names(c->xp, OID_XMPP_ADDR, NULL, NULL) >= 0;
}

static const char *const sasl_fail_static[] = {"aborted",         "encryption-required",
                                               "invalid-authzid", "invalid-mechanism",
                                               "malformed-request", "not-authorized",
                                               "temporary-auth-failure"};

/* Names fit c->fail (an index into sasl_fail_static, +1: 0 is none). */
static uint8_t fail_index(const char *cond)
{
    for (size_t i = 0; i < sizeof(sasl_fail_static) / sizeof(sasl_fail_static[0]); i++)
        if (strcmp(sasl_fail_static[i], cond) == 0)
            return (uint8_t)(i + 1);
    return 6; /* not-authorized */
}

void rt__c2s_sasl_put_mechanisms(rt_buf_t *b, const c2s_t *c)
{
    if (external_offered(c))
        rt_buf_printf(b, "<mechanism>EXTERNAL</mechanism>");
    if (bindings(c))
        rt_buf_printf(b, "<mechanism>SCRAM-SHA-256-PLUS</mechanism>"
                         "<mechanism>SCRAM-SHA-1-PLUS</mechanism>");
    rt_buf_printf(b, "<mechanism>SCRAM-SHA-256</mechanism><mechanism>SCRAM-SHA-1</mechanism>");
    if (c->secure)
        rt_buf_printf(b, "<mechanism>PLAIN</mechanism>");
    if (rt__c2s_host_anonymous(c->host))
        rt_buf_printf(b, "<mechanism>ANONYMOUS</mechanism>");
}

void rt__c2s_sasl_mechanisms(rt_buf_t *b, const c2s_t *c)
{
    unsigned cb = bindings(c);
    rt_buf_printf(b, "<mechanisms xmlns='%s'>", RT_XML_NS_SASL);
    rt__c2s_sasl_put_mechanisms(b, c);
    rt_buf_printf(b, "</mechanisms>");
    if (rt__c2s.conf->sasl2)
        rt__c2s_sasl2_feature(b, c);
    if (cb) { /* XEP-0440: which bindings -PLUS may use here */
        rt_buf_printf(b, "<sasl-channel-binding xmlns='urn:xmpp:sasl-cb:0'>");
        if (cb & RT_TLS_CB_EXPORTER)
            rt_buf_printf(b, "<channel-binding type='tls-exporter'/>");
        if (cb & RT_TLS_CB_END_POINT)
            rt_buf_printf(b, "<channel-binding type='tls-server-end-point'/>");
        rt_buf_printf(b, "</sasl-channel-binding>");
    }
}

void rt__c2s_put_base64(rt_buf_t *b, const void *data, size_t len)
{
    if (len && rt_buf_reserve(b, RT_BASE64_LEN(len) + 1))
        b->len += rt_base64_encode(data, len, (char *)b->data + b->len);
}

/* A challenge (or RFC 6120's success) with its data, in the exchange's profile. */
static void write_sasl(c2s_t *c, const char *name, const void *data, size_t len)
{
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<%s xmlns='%s'", name, c->sasl2 ? RT_C2S_NS_SASL2 : RT_XML_NS_SASL);
    if (!data) {
        rt_buf_printf(&b, "/>");
    } else {
        rt_buf_printf(&b, ">");
        if (len == 0 && !c->sasl2)
            rt_buf_add(&b, "=", 1); /* RFC 6120 6.4.2: empty data is one "=" */
        rt__c2s_put_base64(&b, data, len);
        rt_buf_printf(&b, "</%s>", name);
    }
    rt__c2s_write_buf(c, &b);
}

static void end_exchange(rt_actor_t *self, c2s_t *c)
{
    rt_free(self, c->scram);
    c->scram = NULL;
    if (c->phase == PH_SASL)
        c->phase = PH_FEATURES;
}

/* The failure, now: the delay (if any) is over. */
static void write_failure(rt_actor_t *self, c2s_t *c, const char *cond)
{
    rt_buf_t b = {0};
    if (c->sasl2) /* XEP-0388 2.6.2: the condition is RFC 6120's */
        rt_buf_printf(&b, "<failure xmlns='%s'><%s xmlns='%s'/></failure>", RT_C2S_NS_SASL2, cond,
                      RT_XML_NS_SASL);
    else
        rt_buf_printf(&b, "<failure xmlns='%s'><%s/></failure>", RT_XML_NS_SASL, cond);
    rt__c2s_sasl2_forget(self, c);
    c->sasl2 = false;
    rt__c2s_write_buf(c, &b);
    if (c->fails >= C2S_SASL_TRIES)
        rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION,
                             "too many failed authentication attempts");
}

/*
** A refused login (not an abort or a malformed request: those cost the client nothing but
** its stream): noted by the limiter, answered after its delay.
*/
static void fail(rt_actor_t *self, c2s_t *c, const char *cond, const char *why)
{
    end_exchange(self, c);
    c->fails++;
    atomic_fetch_add_explicit(&rt_c2s_stats.login_failures, 1, memory_order_relaxed);
    uint32_t delay = 0;
    rt_auth_addr_t a;
    if (strcmp(cond, "aborted") != 0 && rt__c2s_peer_addr(c, &a) == 0)
        delay = rt_auth_limiter_fail(rt__c2s.limiter, &a, rt_mono_ms());
    rt_log(RT_LOG_INFO, "xmpp.login_failed", "peer=%s user=%s condition=%s reason=%s delay_ms=%u",
           rt__c2s_peer(self, c), c->jid ? c->jid->s : "-", cond, why, delay);
    rt_free(self, c->jid);
    c->jid = NULL;
    if (!delay) {
        write_failure(self, c, cond);
        return;
    }
    c->fail = fail_index(cond);
    rt__c2s_wait(c);
    rt_send_after_tag(delay, rt_self(self), C2S_MSG_FAIL_DELAY, NULL);
}

void rt__c2s_sasl_fail_due(rt_actor_t *self, c2s_t *c)
{
    if (!c->fail)
        return;
    const char *cond = sasl_fail_static[c->fail - 1];
    c->fail = 0;
    c->waiting = false;
    write_failure(self, c, cond);
}

static void succeed(rt_actor_t *self, c2s_t *c, const char *mech, const void *data, size_t len)
{
    end_exchange(self, c);
    c->phase = PH_AUTHED;
    if (c->sasl2) {
        rt__c2s_sasl2_success(self, c, data, len); /* no restart (XEP-0388 2.6.1) */
    } else {
        write_sasl(c, "success", data, len);
        c->restart = true; /* RFC 6120 6.4.6: the client opens a new stream */
    }
    /* The peer's address is asked of the kernel only when there is a failure to forget. */
    size_t failing;
    uint64_t evicted;
    rt_auth_limiter_usage(rt__c2s.limiter, &failing, &evicted);
    rt_auth_addr_t a;
    if (failing && rt__c2s_peer_addr(c, &a) == 0)
        rt_auth_limiter_succeed(rt__c2s.limiter, &a);
    rt_xport_preauth_end(c->xp);
    atomic_fetch_add_explicit(&rt_c2s_stats.logins, 1, memory_order_relaxed);
    if (rt_log_get_level() >= RT_LOG_DEBUG)
        rt_log(RT_LOG_DEBUG, "xmpp.login", "peer=%s jid=%s mechanism=%s", rt__c2s_peer(self, c),
               c->jid->s, mech);
}

/* The user@host a login names: prepared, kept as c->jid (bare). */
static int set_user(rt_actor_t *self, c2s_t *c, const char *user, size_t len)
{
    char local[RT_JID_PART_MAX + 1];
    size_t llen = 0;
    if (rt_jid_prep_part(RT_JID_LOCAL, user, len, local, &llen, NULL) != 0 || llen == 0)
        return RT_EINVAL;
    const char *host = rt__c2s.conf->hosts[c->host];
    rt_jid_buf_t jb;
    if (rt_jid_make(&jb, local, llen, host, strlen(host), NULL, 0) != 0)
        return RT_EINVAL;
    rt_free(self, c->jid);
    c->jid = rt_jid_dup(self, &jb.jid);
    return c->jid ? 0 : RT_ENOMEM;
}

/* An authzid, if given, must be the account itself (no one acts for another here). */
static bool authzid_ok(const c2s_t *c, const char *z, size_t len)
{
    if (!len)
        return true;
    rt_jid_buf_t jb;
    return rt_jid_prep(z, len, &jb, NULL) == 0 && !jb.jid.resource &&
           rt_jid_bare_len(&jb.jid) == rt_jid_bare_len(c->jid) &&
           memcmp(jb.jid.s, c->jid->s, rt_jid_bare_len(c->jid)) == 0;
}

static int ask(c2s_t *c, uint32_t op, uint32_t hash, const void *data, size_t len)
{
    const char *host = rt__c2s.conf->hosts[c->host];
    c->seq++;
    int rc = rt__c2s_store_ask(op, c->seq, host, strlen(host), rt_jid_local(c->jid),
                               c->jid->local, hash, data, len);
    if (rc == 0)
        rt__c2s_wait(c);
    return rc;
}

/* The client's SASL data: base64, "=" for empty (RFC 6120 6.4.2). */
static long decode(const rt_xml_el_t *el, uint8_t *out, size_t cap)
{
    size_t len = 0;
    const char *t = rt_xml_text(el, &len);
    if (!t)
        return -1;
    if (len == 0 || (len == 1 && t[0] == '='))
        return 0;
    return rt_base64_decode(t, len, out, cap, RT_BASE64_STRICT);
}

static int start_scram(rt_actor_t *self, c2s_t *c, rt_scram_hash_t hash, bool plus,
                       const uint8_t *msg, size_t len)
{
    size_t size = rt_scram_size(len);
    if (!size) {
        fail(self, c, "malformed-request", "message too long");
        return 0;
    }
    c->scram = rt_alloc(self, size, RT_OBJ_LEAF);
    if (!c->scram)
        return RT_ENOMEM;
    rt_scram_first_t first;
    if (rt_scram_start(c->scram, size, hash, plus, bindings(c), msg, len, &first) != 0) {
        rt_scram_fail_t f = rt_scram_failure(c->scram);
        fail(self, c, f == RT_SCRAM_MALFORMED ? "malformed-request" : "not-authorized",
             rt_scram_fail_name(f));
        return 0;
    }
    c->phase = PH_SASL;
    c->scram_hash = (uint8_t)hash;
    c->plus = plus;
    c->cb_type = (uint8_t)first.cb;
    if (set_user(self, c, first.user, first.user_len) != 0) {
        /* No such name can be an account: the exchange goes on with made-up credentials so
           the client learns no more than from a wrong password. */
        const char *out;
        size_t outlen;
        if (rt_scram_server_first(c->scram, NULL, &out, &outlen) != 0) {
            fail(self, c, "temporary-auth-failure", "no randomness");
            return 0;
        }
        write_sasl(c, "challenge", out, outlen);
        return 0;
    }
    if (!authzid_ok(c, first.authzid, first.authzid_len)) {
        fail(self, c, "invalid-authzid", "authzid is another account");
        return 0;
    }
    if (ask(c, C2S_OP_CRED, hash, NULL, 0) != 0)
        fail(self, c, "temporary-auth-failure", "the account store is not running");
    return 0;
}

static int plain(rt_actor_t *self, c2s_t *c, const uint8_t *msg, size_t len)
{
    rt_sasl_plain_t p;
    if (rt_sasl_plain_parse(msg, len, &p) != 0) {
        fail(self, c, "malformed-request", "not authzid NUL authcid NUL password");
        return 0;
    }
    if (set_user(self, c, p.authcid, p.authcid_len) != 0) {
        fail(self, c, "not-authorized", "no such user");
        return 0;
    }
    if (!authzid_ok(c, p.authzid, p.authzid_len)) {
        fail(self, c, "invalid-authzid", "authzid is another account");
        return 0;
    }
    c->phase = PH_SASL;
    if (ask(c, C2S_OP_PLAIN, 0, p.passwd, p.passwd_len) != 0)
        fail(self, c, "temporary-auth-failure", "the account store is not running");
    return 0;
}

static int anonymous(rt_actor_t *self, c2s_t *c)
{
    char name[17];
    if (rt_random_hex(name, 8) != 0) {
        fail(self, c, "temporary-auth-failure", "no randomness");
        return 0;
    }
    int rc = set_user(self, c, name, 16);
    if (rc)
        return rc;
    c->anonymous = true;
    succeed(self, c, "ANONYMOUS", NULL, 0);
    return 0;
}

/* The certificate's addresses as EXTERNAL weighs them (XEP-0178 3: authzid and xmppAddr). */
typedef struct cert_pick_s {
    rt_actor_t *self;
    c2s_t *c;
    const rt_jid_t *want; /* the authzid, prepared; NULL: none given */
    unsigned usable;      /* addresses of an account of this stream's host */
} cert_pick_t;

static bool pick_addr(const char *value, size_t len, void *arg)
{
    cert_pick_t *p = arg;
    rt_jid_buf_t jb;
    const char *host = rt__c2s.conf->hosts[p->c->host];
    if (rt_jid_prep(value, len, &jb, NULL) != 0 || !jb.jid.local || jb.jid.resource ||
        jb.jid.domain != strlen(host) || memcmp(rt_jid_domain(&jb.jid), host, jb.jid.domain) != 0)
        return false;
    p->usable++;
    bool match = p->want ? rt_jid_bare_len(p->want) == rt_jid_bare_len(&jb.jid) &&
                               memcmp(p->want->s, jb.jid.s, rt_jid_bare_len(p->want)) == 0
                         : p->usable == 1;
    if (match) {
        rt_free(p->self, p->c->jid);
        p->c->jid = rt_jid_dup(p->self, &jb.jid);
    }
    return p->want ? match : p->usable > 1; /* without an authzid one address must be alone */
}

/*
** EXTERNAL: the account is the certificate's xmppAddr of this host, the one the authzid
** names when there is one, else its only one; it must exist (the store says).
*/
static int external(rt_actor_t *self, c2s_t *c, const uint8_t *msg, size_t len)
{
    rt_jid_buf_t want;
    if (len && (rt_jid_prep((const char *)msg, len, &want, NULL) != 0 || !want.jid.local ||
                want.jid.resource)) {
        fail(self, c, "invalid-authzid", "the authzid is not a bare JID");
        return 0;
    }
    rt_free(self, c->jid);
    c->jid = NULL;
    cert_pick_t p = {.self = self, .c = c, .want = len ? &want.jid : NULL};
    rt_xport_tls_other_names(c->xp, OID_XMPP_ADDR, pick_addr, &p);
    if (!p.usable) {
        fail(self, c, "not-authorized", "the certificate names no address of this host");
        return 0;
    }
    if (!c->jid || (!len && p.usable > 1)) {
        fail(self, c, "invalid-authzid",
             len ? "the certificate does not name the authzid" : "name one of its addresses");
        return 0;
    }
    c->phase = PH_SASL;
    if (ask(c, C2S_OP_EXTERNAL, 0, NULL, 0) != 0)
        fail(self, c, "temporary-auth-failure", "the account store is not running");
    return 0;
}

/*
** FAST's HT-SHA-256-NONE (XEP-0484, draft-schmaus-kitten-sasl-ht): the initial response is the
** username, a NUL and HMAC-SHA-256(token, "Initiator"); the store has the client's tokens.
*/
static int fast(rt_actor_t *self, c2s_t *c, const uint8_t *msg, size_t len)
{
    const char *agent = rt__c2s_sasl2_fast_agent(c);
    const uint8_t *nul = memchr(msg, 0, len);
    if (!nul || (size_t)(msg + len - (nul + 1)) != SHA256_DIGEST_LENGTH) {
        fail(self, c, "malformed-request", "not username NUL a 32-byte HMAC");
        return 0;
    }
    if (set_user(self, c, (const char *)msg, (size_t)(nul - msg)) != 0) {
        fail(self, c, "not-authorized", "no such user");
        return 0;
    }
    rt__c2s_sasl2_keep_proof(c, nul + 1);
    rt_buf_t d = {0};
    rt_buf_add(&d, agent, strlen(agent) + 1);
    rt_buf_add(&d, RT_C2S_FAST_MECH, sizeof(RT_C2S_FAST_MECH));
    c->phase = PH_SASL;
    if (d.oom || ask(c, C2S_OP_FAST_GET, 0, d.data, d.len) != 0)
        fail(self, c, "temporary-auth-failure", "the account store is not running");
    rt_buf_free(&d);
    return 0;
}

/* The store's answer to fast(): one of the client's tokens proves the HMAC, or none does. */
static void fast_checked(rt_actor_t *self, c2s_t *c, const c2s_reply_t *r)
{
    static const char initiator[] = "Initiator", responder[] = "Responder";
    const uint8_t *p = (const uint8_t *)(r + 1), *end = p + r->len;
    uint8_t mac[SHA256_DIGEST_LENGTH];
    unsigned maclen = 0;
    while (r->rc == 0 && p < end && p + 1 + *p <= end) {
        const uint8_t *token = p + 1;
        size_t tlen = *p;
        p += 1 + tlen;
        if (!HMAC(EVP_sha256(), token, (int)tlen, (const uint8_t *)initiator, sizeof(initiator) - 1,
                  mac, &maclen) ||
            CRYPTO_memcmp(mac, rt__c2s_sasl2_proof(c), sizeof(mac)) != 0)
            continue;
        HMAC(EVP_sha256(), token, (int)tlen, (const uint8_t *)responder, sizeof(responder) - 1, mac,
             &maclen);
        succeed(self, c, RT_C2S_FAST_MECH, mac, maclen);
        return;
    }
    fail(self, c, r->rc == RT_EAGAIN ? "temporary-auth-failure" : "not-authorized",
         r->rc == RT_EAGAIN ? "store failed" : "no FAST token of this client proves it");
}

/* An exchange begins: mech (the element's attribute) with the initial response in data_el
   (its text; NULL: none). */
static int begin(rt_actor_t *self, c2s_t *c, const char *mech, const rt_xml_el_t *data_el)
{
    if (c->phase != PH_FEATURES) {
        fail(self, c, "malformed-request", "an exchange is running");
        return 0;
    }
    if (!rt__c2s_may_auth(c)) {
        fail(self, c, "encryption-required", "TLS first");
        return 0;
    }
    uint8_t msg[RT_SCRAM_MSG_MAX];
    long len = data_el ? decode(data_el, msg, sizeof(msg)) : 0;
    if (!mech) {
        fail(self, c, "invalid-mechanism", "no mechanism named");
        return 0;
    }
    if (len < 0) {
        fail(self, c, "malformed-request", "not base64");
        return 0;
    }
    rt_scram_hash_t hash;
    bool plus;
    if (rt_scram_mech_parse(mech, strlen(mech), &hash, &plus) == 0 && (!plus || bindings(c)))
        return start_scram(self, c, hash, plus, msg, (size_t)len);
    if (strcmp(mech, "PLAIN") == 0 && c->secure)
        return plain(self, c, msg, (size_t)len);
    if (strcmp(mech, "ANONYMOUS") == 0 && rt__c2s_host_anonymous(c->host))
        return anonymous(self, c);
    if (strcmp(mech, RT_C2S_FAST_MECH) == 0 && rt__c2s_sasl2_fast_agent(c))
        return fast(self, c, msg, (size_t)len);
    if (strcmp(mech, "EXTERNAL") == 0 && external_offered(c))
        return external(self, c, msg, (size_t)len);
    fail(self, c, "invalid-mechanism", "mechanism not offered");
    return 0;
}

static int on_response(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    if (c->phase != PH_SASL || !c->scram) {
        fail(self, c, "malformed-request", "no exchange running");
        return 0;
    }
    uint8_t msg[RT_SCRAM_MSG_MAX];
    long len = decode(el, msg, sizeof(msg));
    if (len < 0) {
        fail(self, c, "malformed-request", "not base64");
        return 0;
    }
    const char *out;
    size_t outlen;
    uint8_t cb[RT_SCRAM_CB_DATA_MAX];
    size_t cblen = c->cb_type ? rt_xport_binding(c->xp, c->cb_type, cb, sizeof(cb)) : 0;
    if (rt_scram_client_final(c->scram, msg, (size_t)len, cb, cblen, &out, &outlen) != 0) {
        rt_scram_fail_t f = rt_scram_failure(c->scram);
        fail(self, c, f == RT_SCRAM_MALFORMED ? "malformed-request" : "not-authorized",
             rt_scram_fail_name(f));
        return 0;
    }
    if (!c->jid) { /* a name no account can have: the proof cannot have verified */
        fail(self, c, "not-authorized", "no such user");
        return 0;
    }
    char final[RT_SCRAM_MSG_MAX];
    size_t n = outlen < sizeof(final) ? outlen : sizeof(final);
    memcpy(final, out, n); /* out points into the exchange, freed by succeed */
    succeed(self, c, rt_scram_mech_name((rt_scram_hash_t)c->scram_hash, c->plus), final, n);
    return 0;
}

/* XEP-0388's <authenticate/>: its inline requests kept, then the exchange as <auth/> begins it. */
static int authenticate(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    if (c->phase != PH_FEATURES) {
        fail(self, c, "malformed-request", "an exchange is running");
        return 0;
    }
    if (rt__c2s_sasl2_inline(self, c, el) != 0) {
        fail(self, c, "malformed-request", "an inline request is malformed");
        return 0;
    }
    return begin(self, c, rt_xml_attr(el, "mechanism"),
                 rt_xml_child(el, "initial-response", RT_C2S_NS_SASL2));
}

/* An element of either profile (sasl2: XEP-0388's); an exchange stays in the one it began in. */
static int sasl_element(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el, bool sasl2)
{
    if (c->phase == PH_SASL && c->sasl2 != sasl2) {
        fail(self, c, "malformed-request", "the exchange running is in the other profile");
        return 0;
    }
    c->sasl2 = sasl2;
    if (strcmp(el->name, sasl2 ? "authenticate" : "auth") == 0)
        return sasl2 ? authenticate(self, c, el) : begin(self, c, rt_xml_attr(el, "mechanism"), el);
    if (strcmp(el->name, "response") == 0)
        return on_response(self, c, el);
    if (strcmp(el->name, "abort") == 0) {
        end_exchange(self, c);
        write_failure(self, c, "aborted");
        return 0;
    }
    rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_STANZA_TYPE, NULL);
    return RT_XML_STOP;
}

int rt__c2s_sasl(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el)
{
    return sasl_element(self, c, el, false);
}

int rt__c2s_sasl2(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el)
{
    return sasl_element(self, c, el, true);
}

void rt__c2s_sasl_reply(rt_actor_t *self, c2s_t *c, const c2s_reply_t *r)
{
    c->waiting = false;
    if (r->op == C2S_OP_PLAIN) {
        if (r->rc == 0)
            succeed(self, c, "PLAIN", NULL, 0);
        else
            fail(self, c, r->rc == RT_EAGAIN ? "temporary-auth-failure" : "not-authorized",
                 r->rc == RT_ENOTFOUND ? "no such user" : r->rc == RT_EACCES ? "bad password"
                                                                              : "store failed");
        return;
    }
    if (r->op == C2S_OP_EXTERNAL) {
        if (r->rc == 0)
            succeed(self, c, "EXTERNAL", NULL, 0);
        else
            fail(self, c, r->rc == RT_ENOTFOUND ? "not-authorized" : "temporary-auth-failure",
                 r->rc == RT_ENOTFOUND ? "no such user" : "store failed");
        return;
    }
    if (r->op == C2S_OP_FAST_GET) {
        fast_checked(self, c, r);
        return;
    }
    if (r->op != C2S_OP_CRED || !c->scram)
        return;
    if (r->rc && r->rc != RT_ENOTFOUND) {
        fail(self, c, "temporary-auth-failure", "store failed");
        return;
    }
    const char *out;
    size_t outlen;
    if (rt_scram_server_first(c->scram, r->rc == 0 ? &r->u.cred : NULL, &out, &outlen) != 0) {
        fail(self, c, "temporary-auth-failure", "no randomness or unusable credentials");
        return;
    }
    write_sasl(c, "challenge", out, outlen);
}

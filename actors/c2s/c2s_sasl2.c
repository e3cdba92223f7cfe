/*
** SASL2 (XEP-0388) and what a client asks to have done at its success: Bind2 (XEP-0386: a
** resource bound, carbons and stream management enabled, with no stream restart and no iq
** round trips) or stream management's resumption (XEP-0198's inline form). The exchange itself
** is c2s_sasl.c's, in either profile (c2s_t.sasl2 picks the elements' names); this file keeps
** the inline requests from <authenticate/> until the exchange succeeds, then writes <success/>
** with their results and the features of the stream as it now is (2.6.1: no restart).
**
** A resumption asks the detached session as <resume/> does (c2s_sm.c); when it says yes the
** socket goes to it with the start of <success/>, which it ends with whom it authorized and
** its <resumed/>; when it says no, <success/> carries <failed/> and any Bind2 request is done.
**
** FAST (XEP-0484): a client that names itself (<user-agent id/>) may ask for a token with a
** password login (<request-token/>) and log in with it later (HT-SHA-256-NONE, c2s_sasl.c,
** inside <fast/>); the token goes in <success/>, the store keeps it (xmpp.db, fast.c).
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"

#define NS_FAST "urn:xmpp:fast:0"
#define NS_BIND2 "urn:xmpp:bind:0"
#define NS_SM "urn:xmpp:sm:3"
#define NS_CARBONS "urn:xmpp:carbons:2"

#define BIND2_TAG_MAX 64     /* bytes of a client's tag, the start of its resource */
#define SM_PREVID_MAX 64     /* bytes of a previd (c2s_sm.c writes "PID-TOKEN": 33 at most) */
#define SUCCESS_HEAD_MAX 512 /* <success>, <additional-data> (SCRAM's final) and <token> */
#define AGENT_ID_MAX 128     /* bytes of a user-agent id (XEP-0388 asks for a UUID: 36) */
#define FAST_TOKEN_BYTES 32  /* random bytes of a token, issued as base64 */

struct c2s_inline_s {
    bool bind;         /* Bind2 asked */
    bool carbons;      /* with carbons (XEP-0280) */
    bool sm;           /* with stream management */
    bool sm_resumable; /* asked resumable */
    bool resume;       /* a resumption asked instead */
    bool fast;         /* XEP-0484: the exchange uses a token (<fast/>) */
    bool invalidate;   /* and asks for it to be forgotten once it succeeded (a log-out) */
    bool want_token;   /* <request-token/> for RT_C2S_FAST_MECH */
    char agent[AGENT_ID_MAX + 1]; /* the user-agent id, "" when none was given */
    uint8_t proof[32];            /* a FAST exchange's initiator HMAC, until the store answers */
    char tag[BIND2_TAG_MAX + 1];
    char previd[SM_PREVID_MAX + 1];
    char h[11];
    uint16_t head_len;
    char head[SUCCESS_HEAD_MAX]; /* <success/>'s start, once the exchange succeeded */
};

void rt__c2s_sasl2_feature(rt_buf_t *b, const c2s_t *c)
{
    rt_buf_printf(b, "<authentication xmlns='%s'>", RT_C2S_NS_SASL2);
    rt__c2s_sasl_put_mechanisms(b, c);
    rt_buf_printf(b,
                  "<inline><bind xmlns='%s'><inline><feature var='%s'/><feature var='%s'/>"
                  "</inline></bind><sm xmlns='%s'/>",
                  NS_BIND2, NS_CARBONS, NS_SM, NS_SM);
    if (rt__c2s.conf->fast)
        rt_buf_printf(b, "<fast xmlns='%s'><mechanism>%s</mechanism></fast>", NS_FAST,
                      RT_C2S_FAST_MECH);
    rt_buf_printf(b, "</inline></authentication>");
}

void rt__c2s_sasl2_forget(rt_actor_t *self, c2s_t *c)
{
    rt_free(self, c->inl);
    c->inl = NULL;
}

/* An attribute's value copied into out (cap bytes with its NUL): false when too long. */
static bool copy_attr(const rt_xml_el_t *el, const char *name, char *out, size_t cap)
{
    const char *v = rt_xml_attr(el, name);
    size_t n = v ? strlen(v) : 0;
    if (!v || n >= cap)
        return false;
    memcpy(out, v, n + 1);
    return true;
}

static bool flag(const rt_xml_el_t *el, const char *name)
{
    const char *v = rt_xml_attr(el, name);
    return v && (strcmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

int rt__c2s_sasl2_inline(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *authenticate)
{
    rt__c2s_sasl2_forget(self, c);
    c2s_inline_t *in = rt_alloc(self, sizeof(*in), RT_OBJ_LEAF);
    if (!in)
        return RT_ENOMEM;
    memset(in, 0, sizeof(*in));
    c->inl = in;
    const rt_xml_el_t *bind = rt_xml_child(authenticate, "bind", NS_BIND2);
    if (bind) {
        in->bind = true;
        const rt_xml_el_t *tag = rt_xml_child(bind, "tag", NS_BIND2);
        size_t len = 0;
        const char *text = tag ? rt_xml_text(tag, &len) : "";
        if (!text || len > BIND2_TAG_MAX)
            return RT_EINVAL;
        memcpy(in->tag, text, len);
        in->carbons = rt_xml_child(bind, "enable", NS_CARBONS) != NULL;
        const rt_xml_el_t *sm = rt_xml_child(bind, "enable", NS_SM);
        in->sm = sm != NULL;
        in->sm_resumable = sm && flag(sm, "resume");
    }
    const rt_xml_el_t *agent = rt_xml_child(authenticate, "user-agent", RT_C2S_NS_SASL2);
    if (agent && !copy_attr(agent, "id", in->agent, sizeof(in->agent)))
        return RT_EINVAL;
    const rt_xml_el_t *fast = rt_xml_child(authenticate, "fast", NS_FAST);
    const rt_xml_el_t *ask = rt_xml_child(authenticate, "request-token", NS_FAST);
    const char *mech = ask ? rt_xml_attr(ask, "mechanism") : NULL;
    if (rt__c2s.conf->fast) {
        in->fast = fast != NULL;
        in->invalidate = fast && flag(fast, "invalidate");
        in->want_token = mech && strcmp(mech, RT_C2S_FAST_MECH) == 0 && in->agent[0];
    }
    const rt_xml_el_t *resume = rt_xml_child(authenticate, "resume", NS_SM);
    if (resume) {
        if (!copy_attr(resume, "previd", in->previd, sizeof(in->previd)) ||
            !copy_attr(resume, "h", in->h, sizeof(in->h)))
            return RT_EINVAL;
        in->resume = true;
    }
    return 0;
}

const char *rt__c2s_sasl2_fast_agent(const c2s_t *c)
{
    return c->sasl2 && c->inl && c->inl->fast && c->inl->agent[0] ? c->inl->agent : NULL;
}

void rt__c2s_sasl2_keep_proof(c2s_t *c, const uint8_t proof[32])
{
    memcpy(c->inl->proof, proof, sizeof(c->inl->proof));
}

const uint8_t *rt__c2s_sasl2_proof(const c2s_t *c)
{
    return c->inl->proof;
}

/* A token for the client (XEP-0484 3.2): kept by the store (asked before <success/> is
   written: the client cannot use it before), and its element to head. */
static void issue_token(rt_actor_t *self, c2s_t *c, rt_buf_t *head)
{
    uint8_t raw[FAST_TOKEN_BYTES];
    char token[RT_BASE64_LEN(FAST_TOKEN_BYTES) + 1];
    if (rt_random(raw, sizeof(raw)) != 0)
        return; /* no token this time: the client logs in with its password next time too */
    size_t len = rt_base64_encode(raw, sizeof(raw), token);
    token[len] = 0;
    int64_t expiry = (int64_t)rt_wall_ms() + rt__c2s.conf->fast_token_lifetime * 1000;
    rt_buf_t d = {0};
    rt_buf_add(&d, c->inl->agent, strlen(c->inl->agent) + 1);
    rt_buf_add(&d, RT_C2S_FAST_MECH, sizeof(RT_C2S_FAST_MECH));
    rt_buf_add(&d, &expiry, sizeof(expiry));
    rt_buf_add(&d, token, len);
    if (!d.oom && rt__c2s_ask_own(c, C2S_OP_FAST_PUT, d.data, d.len) == 0) {
        rt_buf_printf(head, "<token xmlns='%s' expiry='", NS_FAST);
        rt__c2s_put_stamp(head, expiry);
        rt_buf_printf(head, "' token='%s'/>", token); /* base64: nothing to escape */
    }
    rt_buf_free(&d);
    (void)self;
}

size_t rt__c2s_sasl2_head(const c2s_t *c, uint8_t *out)
{
    if (!c->sasl2 || !c->inl)
        return 0;
    if (out)
        memcpy(out, c->inl->head, c->inl->head_len);
    return c->inl->head_len;
}

void rt__c2s_sasl2_success(rt_actor_t *self, c2s_t *c, const void *data, size_t len)
{
    c2s_inline_t *in = c->inl;
    rt_buf_t head = {0};
    rt_buf_printf(&head, "<success xmlns='%s'>", RT_C2S_NS_SASL2);
    if (data && len) {
        rt_buf_printf(&head, "<additional-data>");
        rt__c2s_put_base64(&head, data, len);
        rt_buf_printf(&head, "</additional-data>");
    }
    if (in && in->fast && in->invalidate) /* the token just used is forgotten: a log-out */
        rt__c2s_ask_own(c, C2S_OP_FAST_DEL, in->agent, strlen(in->agent) + 1);
    else if (in && in->want_token && !c->anonymous)
        issue_token(self, c, &head);
    if (!in || head.oom || head.len > sizeof(in->head)) { /* cannot be: its parts are short */
        rt_buf_free(&head);
        rt__c2s_stream_error(self, c, RT_XML_COND_INTERNAL_SERVER_ERROR, NULL);
        return;
    }
    memcpy(in->head, head.data, head.len);
    in->head_len = (uint16_t)head.len;
    rt_buf_free(&head);
    if (in->resume) {
        if (rt__c2s_sm_resume_inline(c, in->previd, in->h))
            return; /* the detached session's answer goes on (c2s_sm.c) */
        rt__c2s_sasl2_finish(self, c, "item-not-found");
        return;
    }
    rt__c2s_sasl2_finish(self, c, NULL);
}

/* Bind2's resource: the client's tag, a slash and 16 random hex digits (XEP-0386 4: the
   client names its software, the server makes it unique). NULL, or the bind's condition. */
static const char *bind2(rt_actor_t *self, c2s_t *c, const c2s_inline_t *in)
{
    char rnd[17], res[BIND2_TAG_MAX + sizeof(rnd) + 1];
    if (rt_random_hex(rnd, 8) != 0)
        return "internal-server-error";
    int n = in->tag[0] ? snprintf(res, sizeof(res), "%s/%s", in->tag, rnd)
                       : snprintf(res, sizeof(res), "%s", rnd);
    return rt__c2s_bind_as(self, c, res, (size_t)n);
}

void rt__c2s_sasl2_finish(rt_actor_t *self, c2s_t *c, const char *resume_failed)
{
    c2s_inline_t *in = c->inl;
    rt_buf_t b = {0};
    rt_buf_add(&b, in->head, in->head_len);
    const char *cond = in->bind ? bind2(self, c, in) : NULL;
    bool bound = in->bind && !cond;
    if (cond) /* the client binds as RFC 6120 says, and is told why then */
        rt_log(RT_LOG_INFO, "xmpp.inline_bind_refused", "peer=%s jid=%s condition=%s",
               rt__c2s_peer(self, c), c->jid->s, cond);
    rt_buf_printf(&b, "<authorization-identifier>");
    rt_xml_put_text(&b, c->jid->s, bound ? rt_jid_len(c->jid) : rt_jid_bare_len(c->jid));
    rt_buf_printf(&b, "</authorization-identifier>");
    if (resume_failed)
        rt__c2s_sm_put_failed(&b, resume_failed);
    if (bound) {
        rt_buf_printf(&b, "<bound xmlns='%s'>", NS_BIND2);
        if (in->carbons)
            rt__c2s_reg_carbons(c->jid->s, rt_jid_bare_len(c->jid), rt_jid_resource(c->jid),
                                c->jid->resource, rt_self(self), true);
        if (in->sm && rt__c2s_sm_enable(self, c, in->sm_resumable, &b) != 0)
            rt__c2s_sm_put_failed(&b, "resource-constraint");
        rt_buf_printf(&b, "</bound>");
    } else {
        c->phase = PH_BIND;
    }
    rt_buf_printf(&b, "</success>");
    rt__c2s_bound_features(&b, c); /* 2.6.1: the stream's features follow, with no restart */
    c->sasl2 = false;
    rt__c2s_sasl2_forget(self, c);
    rt__c2s_write_buf(c, &b);
}

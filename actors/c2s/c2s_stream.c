/*
** What the server says at stream level (RFC 6120 4, 5; RFC 7395 for WebSocket): its stream
** header (or <open/>), the features of each stage, stream errors and the close; and which
** top-level element goes where: <starttls/>, SASL, or a stanza.
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"

#define NS_FRAMING_OPEN "<open xmlns='" RT_XML_NS_FRAMING "'"
#define NS_CSI "urn:xmpp:csi:0"
#define STREAM_NS_DECL " xmlns:stream='" RT_XML_NS_STREAMS "'"

static const char *host_name(const c2s_t *c)
{
    return rt__c2s.conf->hosts[c->host];
}

/* The peer is known once the stream has begun (after a PROXY header): its answer is kept. */
bool rt__c2s_may_auth(c2s_t *c)
{
    if (c->secure)
        return true;
    if (!c->plain_from) {
        rt_auth_addr_t a;
        bool ok =
            rt__c2s_peer_addr(c, &a) == 0 &&
            rt_conf_net_match(rt__c2s.conf->plaintext_from, rt__c2s.conf->nplaintext_from, a.b);
        c->plain_from = ok ? C2S_PLAIN_YES : C2S_PLAIN_NO;
    }
    return c->plain_from == C2S_PLAIN_YES;
}

bool rt__c2s_tls_required(c2s_t *c)
{
    return !rt__c2s_may_auth(c);
}

/* A fresh stream id: 8 random bytes as hex, new at every header (RFC 6120 4.7.3). */
static void new_stream_id(rt_actor_t *self, c2s_t *c)
{
    (void)self;
    _Static_assert(sizeof(c->stream_id) == 17, "16 hex digits and a NUL");
    if (rt_random_hex(c->stream_id, 8) != 0) /* unlikely; an id need only be unique */
        snprintf(c->stream_id, sizeof(c->stream_id), "%016llx",
                 (unsigned long long)(rt_mono_ns() ^ (uint64_t)(uintptr_t)c));
}

void rt__c2s_stream_header(rt_actor_t *self, c2s_t *c)
{
    new_stream_id(self, c);
    rt_buf_t b = {0};
    if (rt__c2s_framed(c)) {
        rt_buf_add(&b, NS_FRAMING_OPEN, sizeof(NS_FRAMING_OPEN) - 1);
    } else {
        rt_buf_printf(&b, "<?xml version='1.0'?><stream:stream xmlns='%s'" STREAM_NS_DECL,
                      RT_XML_NS_CLIENT);
    }
    rt_xml_put_attr(&b, "id", c->stream_id);
    rt_xml_put_attr(&b, "from", host_name(c));
    rt_xml_put_attr(&b, "version", "1.0");
    rt_xml_put_attr(&b, "xml:lang", "en");
    if (rt__c2s_framed(c))
        rt_xml_put_empty_end(&b);
    else
        rt_xml_put_start_end(&b);
    rt__c2s_write_buf(c, &b);
    if (c->phase == PH_HEADER)
        c->phase = PH_FEATURES;
}

static void features_start(rt_buf_t *b, const c2s_t *c)
{
    if (rt__c2s_framed(c))
        rt_buf_printf(b, "<stream:features" STREAM_NS_DECL ">");
    else
        rt_buf_printf(b, "<stream:features>");
}

/* What an authenticated stream may still do: bind (unless bound), and the rest. */
static void put_authed_features(rt_buf_t *b, const c2s_t *c)
{
    if (c->phase != PH_ACTIVE)
        rt_buf_printf(b, "<bind xmlns='%s'/><session xmlns='%s'><optional/></session>",
                      RT_XML_NS_BIND, RT_XML_NS_SESSION);
    rt_buf_printf(b, "<ver xmlns='urn:xmpp:features:rosterver'/><csi xmlns='%s'/>", NS_CSI);
    if (!c->sm)
        rt_buf_printf(b, "<sm xmlns='urn:xmpp:sm:3'/>");
    rt_buf_printf(b, "<sub xmlns='urn:xmpp:features:pre-approval'/>");
}

void rt__c2s_features(rt_actor_t *self, c2s_t *c)
{
    (void)self;
    rt_buf_t b = {0};
    if (c->phase >= PH_AUTHED) {
        if (c->phase == PH_AUTHED)
            c->phase = PH_BIND;
        rt__c2s_bound_features(&b, c);
        rt__c2s_write_buf(c, &b);
        return;
    }
    features_start(&b, c);
    if (!c->secure && c->xp && rt__c2s_listen(c)->starttls)
        rt_buf_printf(&b, "<starttls xmlns='%s'>%s</starttls>", RT_XML_NS_TLS,
                      rt__c2s_tls_required(c) ? "<required/>" : "");
    if (rt__c2s_may_auth(c)) {
        rt__c2s_sasl_mechanisms(&b, c);
        rt__c2s_register_feature(&b, c);
    }
    rt_buf_printf(&b, "%s</stream:features>", rt__c2s_caps_element()); /* XEP-0115 6.3 */
    rt__c2s_write_buf(c, &b);
}

void rt__c2s_bound_features(rt_buf_t *b, const c2s_t *c)
{
    features_start(b, c);
    put_authed_features(b, c);
    rt_buf_printf(b, "%s</stream:features>", rt__c2s_caps_element());
}

void rt__c2s_stream_end(c2s_t *c)
{
    if (rt__c2s_framed(c)) {
        static const char close_frame[] = "<close xmlns='" RT_XML_NS_FRAMING "'/>";
        rt__c2s_write(c, close_frame, sizeof(close_frame) - 1);
    } else {
        static const char close_tag[] = "</stream:stream>";
        rt__c2s_write(c, close_tag, sizeof(close_tag) - 1);
    }
}

void rt__c2s_stream_error(rt_actor_t *self, c2s_t *c, rt_xml_cond_t cond, const char *text)
{
    if (c->closing)
        return;
    if (c->phase == PH_HEADER) /* RFC 6120 4.9.1.2: the error goes in a stream of ours */
        rt__c2s_stream_header(self, c);
    const char *name = rt_xml_cond_name(cond);
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<stream:error%s><%s xmlns='%s'/>",
                  rt__c2s_framed(c) ? STREAM_NS_DECL : "", name, RT_XML_NS_STREAM_ERRORS);
    if (text) {
        rt_buf_printf(&b, "<text xmlns='%s'>", RT_XML_NS_STREAM_ERRORS);
        rt_xml_put_text(&b, text, strlen(text));
        rt_buf_printf(&b, "</text>");
    }
    rt_buf_printf(&b, "</stream:error>");
    rt__c2s_write_buf(c, &b);
    rt__c2s_stream_end(c);
    atomic_fetch_add_explicit(&rt_c2s_stats.stream_errors, 1, memory_order_relaxed);
    rt_log(RT_LOG_INFO, "xmpp.stream_error", "peer=%s jid=%s condition=%s reason=%s",
           rt__c2s_peer(self, c), c->jid ? c->jid->s : "-", name, text ? text : "-");
    rt__c2s_close(self, c);
}

void rt__c2s_stanza_error(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *type,
                          const char *cond)
{
    rt__c2s_stanza_error_app(self, c, el, type, cond, NULL);
}

void rt__c2s_put_error(rt_buf_t *b, const rt_xml_el_t *el, const char *from, const char *to,
                       const char *type, const char *cond)
{
    rt_xml_put_start(b, el->name);
    rt_xml_put_attr(b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(b, "type", "error");
    const char *id = rt_xml_attr(el, "id");
    if (id)
        rt_xml_put_attr(b, "id", id);
    rt_xml_put_attr(b, "from", from);
    if (to)
        rt_xml_put_attr(b, "to", to);
    rt_xml_put_start_end(b);
    rt_buf_printf(b, "<error type='%s'><%s xmlns='%s'/>", type, cond, RT_XML_NS_STANZA_ERRORS);
}

void rt__c2s_stanza_error_app(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *type,
                              const char *cond, const char *app)
{
    const char *t = rt_xml_attr(el, "type");
    if (t && strcmp(t, "error") == 0)
        return; /* never an error about an error (RFC 6120 8.3.1) */
    rt_buf_t b = {0};
    const char *to = rt_xml_attr(el, "to");
    rt__c2s_put_error(&b, el, to ? to : host_name(c), c->jid ? c->jid->s : NULL, type, cond);
    rt_buf_printf(&b, "%s</error>", app ? app : "");
    rt_xml_put_end(&b, el->name);
    rt__c2s_write_stanza_buf(self, c, &b);
}

static bool is(const rt_xml_el_t *el, const char *name, const char *ns)
{
    return strcmp(el->name, name) == 0 && strcmp(el->ns, ns) == 0;
}

int rt__c2s_on_top_level(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el)
{
    if (c->phase == PH_ACTIVE && strcmp(el->ns, NS_CSI) == 0) {
        c->inactive = strcmp(el->name, "inactive") == 0;
        if (!c->inactive)
            rt__c2s_flush_held(self, c);
        return 0;
    }
    if ((c->phase == PH_ACTIVE || c->phase == PH_BIND) && strcmp(el->ns, "urn:xmpp:sm:3") == 0)
        return rt__c2s_sm_nonza(self, c, el);
    if (c->phase == PH_ACTIVE || c->phase == PH_BIND) {
        if (strcmp(el->ns, RT_XML_NS_CLIENT) != 0) {
            rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_STANZA_TYPE, NULL);
            return RT_XML_STOP;
        }
        return rt__c2s_stanza(self, c, el);
    }
    if (is(el, "starttls", RT_XML_NS_TLS)) {
        if (c->secure || !c->xp || !rt__c2s_listen(c)->starttls || c->phase != PH_FEATURES) {
            static const char failure[] = "<failure xmlns='" RT_XML_NS_TLS "'/>";
            rt__c2s_write(c, failure, sizeof(failure) - 1);
            rt__c2s_stream_end(c);
            rt__c2s_close(self, c);
            return RT_XML_STOP;
        }
        c->starttls = true;
        return RT_XML_STOP;
    }
    if (strcmp(el->ns, RT_XML_NS_SASL) == 0 && c->phase != PH_AUTHED)
        return rt__c2s_sasl(self, c, el);
    if (strcmp(el->ns, RT_C2S_NS_SASL2) == 0 && c->phase != PH_AUTHED && rt__c2s.conf->sasl2)
        return rt__c2s_sasl2(self, c, el);
    if (c->phase == PH_FEATURES && rt__c2s_register_preauth(el)) {
        rt__c2s_register_iq(self, c, el, rt_xml_child(el, "query", RT_C2S_NS_REGISTER));
        return 0;
    }
    /* Anything else before authentication (RFC 6120 4.9.3.12, 6.4.1). */
    rt__c2s_stream_error(self, c, RT_XML_COND_NOT_AUTHORIZED,
                         c->phase == PH_AUTHED ? "a new stream header is needed"
                                               : "authenticate first");
    return RT_XML_STOP;
}

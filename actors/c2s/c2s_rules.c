/*
** What rules see of XMPP (rules/rule_engine.h): the messages sessions route (xmpp.message),
** the presence they broadcast (xmpp.presence), and sessions starting and ending as
** client.connected and client.disconnected with protocol "xmpp". The view is the rules'
** protocol-neutral one: clientid is the session's full JID and username its bare JID, as an
** MQTT client's id and user; from, to and type are the stanza's; the body (or a presence's
** status) is the payload. Each costs one atomic load when no rule takes it.
*/
#include <string.h>

#include "c2s_impl.h"
#include "rule_engine.h"

static rt_rule_origin_t origin(rt_actor_t *self, c2s_t *c, char *bare, size_t len)
{
    size_t n = rt_jid_bare_len(c->jid) < len ? rt_jid_bare_len(c->jid) : len - 1;
    memcpy(bare, c->jid->s, n);
    bare[n] = 0;
    return (rt_rule_origin_t){.clientid = c->jid->s,
                              .username = bare,
                              .peer = rt__c2s_peer(self, c),
                              .ts_ms = rt_wall_ms()};
}

static void event(rt_actor_t *self, c2s_t *c, rt_rule_event_t *e)
{
    char bare[RT_JID_TEXT_MAX + 1];
    rt_rule_origin_t o = origin(self, c, bare, sizeof(bare));
    e->protocol = "xmpp";
    e->qos = e->reason_code = e->proto_ver = e->keepalive = e->clean_start = -1;
    rt_rules_event(&o, e);
}

void rt__c2s_rule_message(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *to)
{
    if (!rt_rules_wants_event(RT_RULE_EV_XMPP_MESSAGE))
        return;
    const rt_xml_el_t *b = rt_xml_child(el, "body", RT_XML_NS_CLIENT);
    const char *type = rt_xml_attr(el, "type");
    rt_rule_event_t e = {.kind = RT_RULE_EV_XMPP_MESSAGE,
                         .from = c->jid->s,
                         .to = to,
                         .type = type ? type : "normal",
                         .body = b ? rt_xml_text(b, NULL) : NULL};
    event(self, c, &e);
}

void rt__c2s_rule_presence(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, bool available)
{
    if (!rt_rules_wants_event(RT_RULE_EV_XMPP_PRESENCE))
        return;
    const rt_xml_el_t *s = el ? rt_xml_child(el, "status", RT_XML_NS_CLIENT) : NULL;
    rt_rule_event_t e = {.kind = RT_RULE_EV_XMPP_PRESENCE,
                         .from = c->jid->s,
                         .type = available ? "available" : "unavailable",
                         .body = s ? rt_xml_text(s, NULL) : NULL};
    event(self, c, &e);
}

void rt__c2s_rule_session(rt_actor_t *self, c2s_t *c, bool connected, const char *reason)
{
    rt_rule_event_kind_t k = connected ? RT_RULE_EV_CLIENT_CONNECTED : RT_RULE_EV_CLIENT_DISCONNECTED;
    if (!rt_rules_wants_event(k))
        return;
    rt_rule_event_t e = {.kind = k, .reason = reason};
    event(self, c, &e);
}

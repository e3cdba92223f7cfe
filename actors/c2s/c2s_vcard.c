/*
** vCards (XEP-0054), the session's side: the user's own get and set, and a get of another
** account's, which the server answers for it (an iq to a bare JID). The vCard is kept in
** xmpp.db as the bytes of its element (at most xmpp.max_vcard_size), read and written by
** the store actor, which sends the finished answer (c2s_store_xeps.c).
*/
#include <string.h>

#include "c2s_impl.h"

#define NS_VCARD "vcard-temp"

static int ask(c2s_t *c, uint32_t op, const char *host, size_t hlen, const char *user, size_t ulen,
               const rt_buf_t *d)
{
    (void)c;
    return d->oom ? RT_ENOMEM
                  : rt__c2s_store_ask(op, 0, host, hlen, user, ulen, 0, d->data, d->len);
}

void rt__c2s_vcard_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                      bool get)
{
    const char *id = rt_xml_attr(iq, "id");
    const char *host = rt__c2s.conf->hosts[c->host];
    if (strcmp(q->name, "vCard") != 0) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    if (c->anonymous) { /* no account to keep it for */
        rt__c2s_stanza_error(self, c, iq, "cancel", get ? "service-unavailable" : "not-allowed");
        return;
    }
    rt_buf_t d = {0};
    rt_buf_add(&d, id, strlen(id) + 1);
    if (!get) {
        size_t before = d.len;
        rt_xml_put_tree(&d, q, RT_XML_NS_CLIENT);
        if (d.len - before > (size_t)rt__c2s.conf->max_vcard_size) {
            rt_buf_free(&d);
            rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
            return;
        }
    }
    if (ask(c, get ? C2S_OP_VCARD_GET : C2S_OP_VCARD_SET, host, strlen(host), rt_jid_local(c->jid),
            c->jid->local, &d) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&d);
}

bool rt__c2s_vcard_other(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to)
{
    const char *type = rt_xml_attr(iq, "type");
    const rt_xml_el_t *q = rt_xml_first(iq);
    if (!to->local || !type || !q || strcmp(q->ns, NS_VCARD) != 0 || strcmp(q->name, "vCard") != 0)
        return false;
    if (strcmp(type, "get") != 0) { /* only its owner sets it */
        rt__c2s_stanza_error(self, c, iq, "cancel", "forbidden");
        return true;
    }
    const char *id = rt_xml_attr(iq, "id");
    rt_buf_t d = {0};
    rt_buf_add(&d, id, strlen(id) + 1);
    rt_buf_add(&d, to->s, rt_jid_bare_len(to));
    if (ask(c, C2S_OP_VCARD_GET, rt_jid_domain(to), to->domain, rt_jid_local(to), to->local, &d) !=
        0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&d);
    return true;
}

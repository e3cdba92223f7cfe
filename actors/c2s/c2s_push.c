/*
** Push notifications (XEP-0357): a client enables an app server (its JID and a node, with
** publish options that carry the app server's secret), kept per account in xmpp.db; while the
** account cannot take a message itself (kept offline, or queued for a session detached under
** stream management), the server publishes a summary to each of its app servers. The summary
** says only that something came (message-count 1, Prosody's choice): no sender, no body, which
** an app server would pass on through its vendor's push service.
**
** The session's side parses the enable/disable iq; the store's side (the store actor) keeps
** the registrations and sends the notifications: to another server's app server through
** federation, to a local one by its session's full JID; what cannot be sent is counted
** (rt_xmpp_push_undeliverable_total).
*/
#define _GNU_SOURCE /* memmem */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "xeps.h"

#define NS_PUSH "urn:xmpp:push:0"
#define NS_DATA "jabber:x:data"
#define PUSH_MAX_PER_ACCOUNT 16 /* app servers one account may enable; past it the oldest go */

void rt__c2s_push_features(rt_buf_t *b, const c2s_t *c)
{
    if (!c->anonymous)
        rt_buf_printf(b, "<feature var='%s'/>", NS_PUSH);
}

/* ---- The session's side ---- */

bool rt__c2s_push_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                     bool get)
{
    if (strcmp(q->ns, NS_PUSH) != 0)
        return false;
    bool enable = strcmp(q->name, "enable") == 0;
    if (get || (!enable && strcmp(q->name, "disable") != 0)) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return true;
    }
    if (c->anonymous) { /* nothing is kept for an account that ends with its session */
        rt__c2s_stanza_error(self, c, iq, "cancel", "not-allowed");
        return true;
    }
    const char *jid = rt_xml_attr(q, "jid"), *node = rt_xml_attr(q, "node");
    rt_jid_buf_t jb;
    if (!jid || rt_jid_prep(jid, strlen(jid), &jb, NULL) != 0 || (enable && (!node || !*node)) ||
        (node && !*node)) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return true;
    }
    /* id, JID, node (none: a byte 1 for "every node"), then the publish options' form. */
    const char *id = rt_xml_attr(iq, "id");
    rt_buf_t d = {0};
    rt_buf_add(&d, id, strlen(id) + 1);
    rt_buf_add(&d, jb.jid.s, strlen(jb.jid.s) + 1);
    if (node)
        rt_buf_add(&d, node, strlen(node) + 1);
    else
        rt_buf_add(&d, "\1", 2);
    const rt_xml_el_t *form = enable ? rt_xml_child(q, "x", NS_DATA) : NULL;
    size_t before = d.len;
    if (form)
        rt_xml_put_tree(&d, form, NS_PUSH);
    const char *host = rt__c2s.conf->hosts[c->host];
    if (d.len - before > RT_PUSH_OPTIONS_MAX)
        rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
    else if (d.oom || rt__c2s_store_ask(enable ? C2S_OP_PUSH_ENABLE : C2S_OP_PUSH_DISABLE, 0, host,
                                        strlen(host), rt_jid_local(c->jid), c->jid->local, 0,
                                        d.data, d.len) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&d);
    return true;
}

/*
** Whether a stanza is worth waking a phone for: a message with a body or an encrypted payload
** (OMEMO's), not a chat state or a receipt. Read from the stanza's bytes as they are routed
** (rtd writes them: a child's name follows '<' only as an element, text has it escaped).
*/
bool rt__c2s_push_worthy(const void *stanza, size_t len)
{
    static const char message[] = "<message";
    if (len < sizeof(message) || memcmp(stanza, message, sizeof(message) - 1) != 0)
        return false;
    return memmem(stanza, len, "<body", 5) || memmem(stanza, len, "<encrypted", 10);
}

void rt__c2s_push_detached(const c2s_t *c)
{
    const char *host = rt__c2s.conf->hosts[c->host];
    rt__c2s_store_ask(C2S_OP_PUSH_NOTIFY, 0, host, strlen(host), rt_jid_local(c->jid),
                      c->jid->local, 0, NULL, 0);
}

/* ---- The store's side ---- */

void rt__c2s_store_push_set(rt_accounts_t *a, rt_pid_t to, bool enable, const char *host,
                            const char *user, const uint8_t *data, size_t len)
{
    const char *id = (const char *)data, *jid, *node;
    size_t at = strnlen(id, len) + 1;
    if (at >= len)
        return;
    jid = (const char *)data + at;
    at += strnlen(jid, len - at) + 1;
    if (at >= len)
        return;
    node = (const char *)data + at;
    at += strnlen(node, len - at) + 1;
    if (at > len)
        return;
    int rc;
    if (enable)
        rc = rt_push_put(a, host, user, jid, node, data + at, len - at, (int64_t)rt_wall_ms(),
                         PUSH_MAX_PER_ACCOUNT);
    else
        rc = rt_push_del(a, host, user, jid, strcmp(node, "\1") == 0 ? NULL : node);
    if (rc == 0)
        atomic_fetch_add_explicit(enable ? &rt_c2s_stats.push_enabled : &rt_c2s_stats.push_disabled,
                                  1, memory_order_relaxed);
    rt__c2s_store_iq_answer(to, id, strlen(id), rc, NULL, 0);
}

typedef struct {
    const char *from, *host; /* the account's bare JID, and its domain */
    uint32_t n;
} notify_t;

/* One registration: the summary to its app server, if a local session holds that JID. */
static void notify_one(const char *jid, const char *node, const void *options, size_t len,
                       void *arg)
{
    notify_t *t = arg;
    rt_jid_buf_t to;
    c2s_route_t r = {0};
    bool ok = rt_jid_prep(jid, strlen(jid), &to, NULL) == 0;
    /* Another server's app server (a push component, usually): through federation. A local
       one: a session's full JID. */
    bool remote = ok && rt__c2s_domain_remote(rt_jid_domain(&to.jid), to.jid.domain);
    if (!remote &&
        (!ok || !to.jid.resource || rt__c2s_host_index(rt_jid_domain(&to.jid), to.jid.domain) < 0 ||
         !rt__c2s_reg_lookup(to.jid.s, rt_jid_bare_len(&to.jid), rt_jid_resource(&to.jid),
                             to.jid.resource, &r, 1))) {
        atomic_fetch_add_explicit(&rt_c2s_stats.push_undeliverable, 1, memory_order_relaxed);
        return;
    }
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "from", t->from);
    rt_xml_put_attr(&b, "to", to.jid.s);
    rt_xml_put_attr(&b, "type", "set");
    rt_buf_printf(&b, " id='push-%" PRIx64 "-%u'>", rt_wall_ms(), t->n++);
    rt_buf_printf(&b, "<pubsub xmlns='%s'><publish", RT_C2S_NS_PUBSUB);
    rt_xml_put_attr(&b, "node", node);
    rt_buf_printf(&b,
                  "><item><notification xmlns='%s'><x xmlns='%s' type='submit'>"
                  "<field var='FORM_TYPE'><value>urn:xmpp:push:summary</value></field>"
                  "<field var='message-count'><value>1</value></field></x></notification>"
                  "</item></publish>",
                  NS_PUSH, NS_DATA);
    if (len) {
        rt_buf_add(&b, "<publish-options>", 17);
        rt_buf_add(&b, options, len);
        rt_buf_add(&b, "</publish-options>", 18);
    }
    rt_buf_add(&b, "</pubsub></iq>", 14);
    bool sent =
        !b.oom && (remote ? rt__c2s_s2s_send(t->host, strlen(t->host), rt_jid_domain(&to.jid),
                                             to.jid.domain, b.data, b.len)
                          : rt__c2s_send(r.pid, C2S_MSG_STANZA, b.data, b.len) == 0);
    if (sent)
        atomic_fetch_add_explicit(&rt_c2s_stats.push_sent, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&rt_c2s_stats.push_undeliverable, 1, memory_order_relaxed);
    rt_buf_free(&b);
}

void rt__c2s_store_push_notify(rt_accounts_t *a, const char *host, const char *user)
{
    char from[2 * RT_JID_PART_MAX + 2];
    snprintf(from, sizeof(from), "%s@%s", user, host);
    notify_t t = {.from = from, .host = host};
    rt_push_each(a, host, user, notify_one, &t);
}

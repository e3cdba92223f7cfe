/*
** A session once authenticated (RFC 6120 7, 8; RFC 6121 4, 8): resource binding, the legacy
** session, the server's own iq answers, presence and message routing.
**
** Routing. A stanza for another session is written once by its sender, with the server's
** from (the sender's full JID, RFC 6120 8.1.2.1) and xmlns='jabber:client' on the top element
** (so the same bytes are a WebSocket frame), and sent to each receiving actor by message; a
** receiver copies the bytes to its socket. The receivers come from the registry
** (c2s_registry.c) by bare JID; which of them follows RFC 6121 8.5.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"

#define NS_PING "urn:xmpp:ping"
#define NS_DISCO_INFO "http://jabber.org/protocol/disco#info"
#define NS_DISCO_ITEMS "http://jabber.org/protocol/disco#items"
#define NS_ROSTER "jabber:iq:roster"
#define NS_CARBONS "urn:xmpp:carbons:2"
#define NS_FORWARD "urn:xmpp:forward:0"
#define NS_HINTS "urn:xmpp:hints"
#define NS_BLOCKING "urn:xmpp:blocking"
#define NS_MAM "urn:xmpp:mam:2"

static const char *bare_text(const c2s_t *c, size_t *len)
{
    *len = rt_jid_bare_len(c->jid);
    return c->jid->s;
}

/* ---- Writing a stanza for another session ---- */

static void to_remote(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                      rt_buf_t *b);

void rt__c2s_put_attrs(rt_buf_t *b, const rt_xml_el_t *el)
{
    for (uint32_t i = 0; i < el->node.len; i++) {
        const rt_xml_attr_t *a = &el->attrs[i];
        if (!a->ns[0] && strcmp(a->name, "from") != 0 && strcmp(a->name, "to") != 0)
            rt_xml_put_attr(b, a->name, a->value);
        else if (strcmp(a->ns, RT_XML_NS_XML) == 0 && strcmp(a->name, "lang") == 0)
            rt_xml_put_attr(b, "xml:lang", a->value);
    }
}

/*
** el as its receivers get it: from stamped, to as prepared (to_text NULL: none), the other
** attributes and the children as they came.
*/
void rt__c2s_put_stanza(rt_buf_t *b, const rt_xml_el_t *el, const char *from, const char *to_text)
{
    rt__c2s_put_stanza_from(b, el, from, to_text, RT_XML_NS_CLIENT);
}

void rt__c2s_put_stanza_from(rt_buf_t *b, const rt_xml_el_t *el, const char *from,
                             const char *to_text, const char *el_ns)
{
    rt_xml_put_start(b, el->name);
    rt_xml_put_attr(b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(b, "from", from);
    if (to_text)
        rt_xml_put_attr(b, "to", to_text);
    rt__c2s_put_attrs(b, el);
    if (!el->children) {
        rt_xml_put_empty_end(b);
        return;
    }
    rt_xml_put_start_end(b);
    for (const rt_xml_node_t *n = el->children; n; n = n->next) {
        const rt_xml_text_t *t = rt_xml_as_text(n);
        if (t)
            rt_xml_put_text(b, t->data, t->node.len);
        else if (!rt__c2s_mam_forged(rt_xml_as_el(n)))
            rt_xml_put_tree(b, rt_xml_as_el(n), el_ns);
    }
    rt_xml_put_end(b, el->name);
}

bool rt__c2s_send_bytes(rt_pid_t to, const rt_buf_t *b)
{
    if (b->oom || rt__c2s_send(to, C2S_MSG_STANZA, b->data, b->len) != 0)
        return false;
    atomic_fetch_add_explicit(&rt_c2s_stats.stanzas_routed, 1, memory_order_relaxed);
    return true;
}

/* ---- Answers of the server's own ---- */

static void iq_result_start(rt_buf_t *b, const c2s_t *c, const rt_xml_el_t *iq)
{
    rt_xml_put_start(b, "iq");
    rt_xml_put_attr(b, "type", "result");
    const char *id = rt_xml_attr(iq, "id");
    rt_xml_put_attr(b, "id", id ? id : "");
    const char *to = rt_xml_attr(iq, "to");
    if (to)
        rt_xml_put_attr(b, "from", to);
    rt_xml_put_attr(b, "to", c->jid->s);
}

void rt__c2s_iq_result_start(rt_buf_t *b, const c2s_t *c, const rt_xml_el_t *iq)
{
    iq_result_start(b, c, iq);
}

static void iq_result_empty(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    iq_result_start(&b, c, iq);
    rt_xml_put_empty_end(&b);
    rt__c2s_write_stanza_buf(self, c, &b);
}

const char *rt__c2s_form_value(const rt_xml_el_t *form, const char *var)
{
    static const char xdata[] = "jabber:x:data";
    for (const rt_xml_el_t *f = rt_xml_child(form, "field", xdata); f;
         f = rt_xml_next(f, "field", xdata)) {
        const char *v = rt_xml_attr(f, "var");
        const rt_xml_el_t *val = v && strcmp(v, var) == 0 ? rt_xml_child(f, "value", xdata) : NULL;
        if (val)
            return rt_xml_text(val, NULL);
    }
    return NULL;
}

/* What disco#info says the server does (XEP-0030), and its caps hash hashes (c2s_caps.c). */
const char *const rt__c2s_features_list[] = {NS_DISCO_INFO, NS_DISCO_ITEMS, NS_PING, NS_ROSTER,
                                       NS_CARBONS, "urn:xmpp:csi:0", NS_BLOCKING, "vcard-temp"};
_Static_assert(sizeof(rt__c2s_features_list) / sizeof(rt__c2s_features_list[0]) == C2S_NFEATURES,
               "C2S_NFEATURES");

/* disco#info to the user's own bare JID: the account (XEP-0030 and XEP-0313 7). */
static void disco_account(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    iq_result_start(&b, c, iq);
    rt_buf_printf(&b,
                  "><query xmlns='%s'><identity category='account' type='%s'/>"
                  "<feature var='%s'/>",
                  NS_DISCO_INFO, c->anonymous ? "anonymous" : "registered", NS_DISCO_INFO);
    rt__c2s_mam_features(&b, c);
    rt__c2s_pep_features(&b, c);
    rt__c2s_push_features(&b, c);
    rt_buf_printf(&b, "</query></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

static void disco_info(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q)
{
    rt_buf_t b = {0};
    iq_result_start(&b, c, iq);
    rt_xml_put_start_end(&b);
    rt_xml_put_start(&b, "query");
    rt_xml_put_attr(&b, "xmlns", NS_DISCO_INFO);
    const char *node = rt_xml_attr(q, "node");
    if (node)
        rt_xml_put_attr(&b, "node", node);
    rt_xml_put_start_end(&b);
    rt_buf_printf(&b, "<identity category='%s' type='%s' name='%s'/>", C2S_IDENTITY_CATEGORY,
                  C2S_IDENTITY_TYPE, C2S_IDENTITY_NAME);
    for (size_t i = 0; i < C2S_NFEATURES; i++)
        rt_buf_printf(&b, "<feature var='%s'/>", rt__c2s_features_list[i]);
    rt_buf_printf(&b, "</query></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

static void disco_items(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    iq_result_start(&b, c, iq);
    rt_xml_put_start_end(&b);
    rt_buf_printf(&b, "<query xmlns='%s'>", NS_DISCO_ITEMS);
    if (rt__c2s.muc[c->host][0]) { /* how clients find the group chat service */
        rt_xml_put_start(&b, "item");
        rt_xml_put_attr(&b, "jid", rt__c2s.muc[c->host]);
        rt_xml_put_empty_end(&b);
    }
    rt__c2s_upload_disco_item(&b, c->host);
    rt_buf_printf(&b, "</query></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

/* An iq for the server or for the user's own account (RFC 6121 8.5.1 for the latter). */
static void iq_server(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const char *type,
                      bool account)
{
    if (strcmp(type, "result") == 0 || strcmp(type, "error") == 0) {
        rt__c2s_pep_caps_answer(self, c, iq); /* or an answer to the server's pings */
        return;
    }
    bool get = strcmp(type, "get") == 0;
    const rt_xml_el_t *q = rt_xml_first(iq);
    if (!q || rt_xml_next(q, NULL, NULL)) { /* RFC 6120 8.2.3: exactly one payload */
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    if (strcmp(q->ns, NS_PING) == 0 && get) {
        iq_result_empty(self, c, iq);
    } else if (strcmp(q->ns, NS_DISCO_INFO) == 0 && get && account) {
        disco_account(self, c, iq);
    } else if (strcmp(q->ns, NS_DISCO_INFO) == 0 && get) {
        disco_info(self, c, iq, q);
    } else if (strcmp(q->ns, NS_DISCO_ITEMS) == 0 && get) {
        disco_items(self, c, iq);
    } else if (strcmp(q->ns, NS_CARBONS) == 0 && !get &&
               (strcmp(q->name, "enable") == 0 || strcmp(q->name, "disable") == 0)) {
        size_t blen;
        const char *bare = bare_text(c, &blen);
        rt__c2s_reg_carbons(bare, blen, rt_jid_resource(c->jid), c->jid->resource, rt_self(self),
                            strcmp(q->name, "enable") == 0);
        iq_result_empty(self, c, iq);
    } else if (strcmp(q->ns, NS_ROSTER) == 0) {
        rt__c2s_roster_iq(self, c, iq, q, get);
    } else if (strcmp(q->ns, "vcard-temp") == 0) {
        rt__c2s_vcard_iq(self, c, iq, q, get);
    } else if (strcmp(q->ns, NS_BLOCKING) == 0) {
        rt__c2s_blocking_iq(self, c, iq, q, get);
    } else if (strcmp(q->ns, RT_C2S_NS_REGISTER) == 0) {
        rt__c2s_register_iq(self, c, iq, q);
    } else if (strcmp(q->ns, NS_MAM) == 0) {
        rt__c2s_mam_iq(self, c, iq, q, get);
    } else if (rt__c2s_push_iq(self, c, iq, q, get)) {
    } else if (strncmp(q->ns, RT_C2S_NS_PUBSUB, sizeof(RT_C2S_NS_PUBSUB) - 1) == 0 &&
               (account || !rt_xml_attr(iq, "to"))) { /* the account's PEP service */
        rt__c2s_pep_iq(self, c, iq, q, get);
    } else if (strcmp(q->ns, RT_XML_NS_SESSION) == 0 && !get) {
        c->session = true;
        iq_result_empty(self, c, iq);
    } else if (strcmp(q->ns, RT_XML_NS_BIND) == 0) {
        rt__c2s_stanza_error(self, c, iq, "cancel", "not-allowed"); /* bound already */
    } else {
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable");
    }
}

/* ---- Binding ---- */

static int random_resource(char *out, size_t cap)
{
    return cap < 17 ? RT_EAGAIN : rt_random_hex(out, 8);
}

const char *rt__c2s_bind_as(rt_actor_t *self, c2s_t *c, const char *given, size_t given_len)
{
    char res[RT_JID_PART_MAX + 1];
    size_t rlen = 0;
    if (given && given_len) {
        if (rt_jid_prep_part(RT_JID_RESOURCE, given, given_len, res, &rlen, NULL) != 0 || rlen == 0)
            return "bad-request";
    } else if (random_resource(res, sizeof(res)) == 0) {
        rlen = strlen(res);
    } else {
        return "internal-server-error";
    }
    rt_jid_buf_t jb;
    size_t blen;
    const char *bare = bare_text(c, &blen);
    if (rt_jid_make(&jb, rt_jid_local(c->jid), c->jid->local, rt_jid_domain(c->jid), c->jid->domain,
                    res, rlen) != 0)
        return "bad-request";
    rt_pid_t old = 0;
    int rc = rt__c2s_reg_bind(bare, blen, res, rlen, rt_self(self), rt__c2s.replace,
                              (unsigned)rt__c2s.conf->max_resources, &old);
    if (rc)
        return rc == RT_EEXIST   ? "conflict"
               : rc == RT_ELIMIT ? "resource-constraint"
                                 : "internal-server-error";
    if (old)
        rt__c2s_send(old, C2S_MSG_REPLACED, NULL, 0);
    rt_jid_t *full = rt_jid_dup(self, &jb.jid);
    if (!full) {
        rt__c2s_reg_unbind(bare, blen, res, rlen, rt_self(self));
        return "internal-server-error";
    }
    rt_charge(self, (ptrdiff_t)rt__c2s_reg_entry_bytes(blen, rlen));
    rt_free(self, c->jid);
    c->jid = full;
    c->phase = PH_ACTIVE;
    atomic_fetch_add_explicit(&rt_c2s_stats.bound, 1, memory_order_relaxed);
    rt__c2s_idle_arm(self, c);
    rt_log(RT_LOG_INFO, "xmpp.session_started", "peer=%s jid=%s", rt__c2s_peer(self, c), full->s);
    rt__c2s_rule_session(self, c, true, NULL);
    return NULL;
}

static int bind(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    const char *type = rt_xml_attr(iq, "type");
    const rt_xml_el_t *b = rt_xml_child(iq, "bind", RT_XML_NS_BIND);
    if (!b || !type || strcmp(type, "set") != 0 || !rt_xml_attr(iq, "id")) {
        rt__c2s_stream_error(self, c, RT_XML_COND_NOT_AUTHORIZED, "bind a resource first");
        return RT_XML_STOP;
    }
    const rt_xml_el_t *r = rt_xml_child(b, "resource", RT_XML_NS_BIND);
    size_t given_len = 0;
    const char *given = r ? rt_xml_text(r, &given_len) : NULL;
    const char *cond = rt__c2s_bind_as(self, c, given, given_len);
    if (cond) {
        rt__c2s_stanza_error(self, c, iq,
                             strcmp(cond, "bad-request") == 0 ? "modify"
                             : strcmp(cond, "conflict") == 0  ? "cancel"
                                                              : "wait",
                             cond);
        return 0;
    }
    rt_buf_t out = {0};
    iq_result_start(&out, c, iq);
    rt_xml_put_start_end(&out);
    rt_buf_printf(&out, "<bind xmlns='%s'><jid>", RT_XML_NS_BIND);
    rt_xml_put_text(&out, c->jid->s, rt_jid_len(c->jid));
    rt_buf_printf(&out, "</jid></bind></iq>");
    rt__c2s_write_stanza_buf(self, c, &out);
    return 0;
}

/* ---- Routing ---- */

/* The available sessions of to's account but except, of priority >= 0, and their top priority. */
static size_t available(const rt_jid_t *to, rt_pid_t except, c2s_route_t *r, int *top)
{
    c2s_route_t all[C2S_ROUTES_MAX];
    size_t n = rt__c2s_reg_lookup(to->s, rt_jid_bare_len(to), NULL, 0, all, C2S_ROUTES_MAX);
    size_t k = 0;
    *top = -1;
    for (size_t i = 0; i < n; i++) {
        if (!all[i].available || all[i].priority < 0 || all[i].pid == except)
            continue;
        r[k++] = all[i];
        if (all[i].priority > *top)
            *top = all[i].priority;
    }
    return k;
}

/*
** RFC 6121 8.5.2.1.1: a message to a bare JID goes to the available resources of the highest
** priority, a headline to every available one; `except` is left out (a session that has
** ended). Returns how many got it, their routes first in r.
*/
static size_t to_bare(const rt_jid_t *to, const rt_buf_t *bytes, bool headline, rt_pid_t except,
                      c2s_route_t r[C2S_ROUTES_MAX])
{
    int top;
    size_t n = available(to, except, r, &top), sent = 0;
    for (size_t i = 0; i < n; i++)
        if ((headline || r[i].priority == top) && rt__c2s_send_bytes(r[i].pid, bytes))
            r[sent++] = r[i]; /* not one that ended since the lookup */
    return sent;
}

/* XEP-0280 6: chats, and normal messages with a body, unless marked private or no-copy. */
static bool carbon_worthy(const rt_xml_el_t *el, const char *type)
{
    if (strcmp(type, "chat") != 0 &&
        !(strcmp(type, "normal") == 0 && rt_xml_child(el, "body", RT_XML_NS_CLIENT)))
        return false;
    return !rt_xml_child(el, "private", NS_CARBONS) && !rt_xml_child(el, "no-copy", NS_HINTS);
}

/*
** The carbon copies of a chat (XEP-0280): kind "sent" to the sender's other resources, or
** "received" to the receiver's that did not get it; bare is the account's, except (sent) pid.
*/
static void carbons(const char *kind, const char *bare, size_t bare_len, const rt_buf_t *bytes,
                    const c2s_route_t *got, size_t ngot, rt_pid_t except)
{
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t n = rt__c2s_reg_lookup(bare, bare_len, NULL, 0, r, C2S_ROUTES_MAX);
    rt_buf_t b = {0};
    for (size_t i = 0; i < n; i++) {
        bool skip = !r[i].carbons || !r[i].available || r[i].pid == except;
        for (size_t k = 0; k < ngot && !skip; k++)
            skip = got[k].pid == r[i].pid;
        if (skip)
            continue;
        if (!b.len) {
            rt_buf_printf(&b, "<message xmlns='%s' type='chat'", RT_XML_NS_CLIENT);
            rt_xml_put_attr_len(&b, "from", bare, bare_len);
            rt_buf_printf(&b, "><%s xmlns='%s'><forwarded xmlns='%s'>", kind, NS_CARBONS,
                          NS_FORWARD);
            rt_buf_add(&b, bytes->data, bytes->len);
            rt_buf_printf(&b, "</forwarded></%s></message>", kind);
        }
        rt__c2s_send_bytes(r[i].pid, &b);
    }
    rt_buf_free(&b);
}

/*
** No one to take the message now: kept for the user (XEP-0160), or refused when there is no
** such account or its store is full; the store then answers the sender (sender_jid, at pid
** sender) with service-unavailable. 0, or an error when the store was not asked.
*/
static int keep_offline(const rt_jid_t *to, const void *stanza, size_t len, const char *id,
                        const char *sender_jid, rt_pid_t sender)
{
    rt_buf_t err = {0};
    rt_xml_put_start(&err, "message");
    rt_xml_put_attr(&err, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&err, "type", "error");
    if (id)
        rt_xml_put_attr(&err, "id", id);
    rt_xml_put_attr_len(&err, "from", to->s, rt_jid_bare_len(to));
    rt_xml_put_attr(&err, "to", sender_jid);
    rt_xml_put_start_end(&err);
    rt_buf_printf(&err, "<error type='cancel'><service-unavailable xmlns='%s'/></error></message>",
                  RT_XML_NS_STANZA_ERRORS);
    /* data: the stanza's length (4 bytes), the stanza, then the error for the sender */
    uint32_t slen = (uint32_t)len;
    rt_msg_t *m =
        err.oom ? NULL
                : rt__c2s_store_msg(C2S_OP_OFFLINE_PUSH, 0, rt_jid_domain(to), to->domain,
                                    rt_jid_local(to), to->local, 0, sizeof(slen) + len + err.len);
    int rc = RT_ENOMEM;
    if (m) {
        uint8_t *d = rt__c2s_store_data(m);
        memcpy(d, &slen, sizeof(slen));
        memcpy(d + sizeof(slen), stanza, len);
        memcpy(d + sizeof(slen) + len, err.data, err.len);
        rc = rt__c2s_store_send(m, sender); /* whom the store answers */
    }
    rt_buf_free(&err);
    return rc;
}

/*
** A rule's row as a message (the xmpp sink, rt_sinks_set_xmpp): to a room, a groupchat from
** room/nick; to a user of a served host, a message from `from` (default: the host) to the
** available sessions of the highest priority (RFC 6121 8.5.2.1.1), else kept offline; a
** headline is never kept. Any thread, in the sink's actor.
*/
int rt__c2s_sink_send(const char *to_text, const char *from, const char *nick, const char *type,
                      const char *body, size_t len)
{
    rt_jid_buf_t tb;
    if (rt_jid_prep(to_text, strlen(to_text), &tb, NULL) != 0 || !tb.jid.local || tb.jid.resource)
        return RT_EINVAL;
    const rt_jid_t *to = &tb.jid;
    if (rt__c2s_muc_index(rt_jid_domain(to), to->domain) >= 0)
        return rt__c2s_muc_post(to, nick, body, len);
    int host = rt__c2s_host_index(rt_jid_domain(to), to->domain);
    if (host < 0)
        return RT_ENOTFOUND;
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "message");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "from", from && *from ? from : rt__c2s.conf->hosts[host]);
    rt_xml_put_attr_len(&b, "to", to->s, rt_jid_bare_len(to));
    rt_xml_put_attr(&b, "type", type);
    rt_buf_printf(&b, "><body>");
    rt_xml_put_text(&b, body, len);
    rt_buf_printf(&b, "</body></message>");
    int rc = b.oom ? RT_ENOMEM : 0;
    c2s_route_t r[C2S_ROUTES_MAX];
    bool headline = strcmp(type, "headline") == 0;
    if (!rc && !to_bare(to, &b, headline, 0, r) && !headline)
        rc = keep_offline(to, b.data, b.len, NULL, from && *from ? from : rt__c2s.conf->hosts[host],
                          rt_self(rt_current()));
    rt_buf_free(&b);
    return rc;
}

static void route_message(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                          const rt_buf_t *bytes)
{
    const char *type = rt_xml_attr(el, "type");
    if (!type)
        type = "normal";
    if (strcmp(type, "error") == 0 && !to->resource)
        return;
    bool copies = carbon_worthy(el, type);
    size_t my_len;
    const char *me = bare_text(c, &my_len);
    if (copies)
        carbons("sent", me, my_len, bytes, NULL, 0, rt_self(self));
    if (to->resource) {
        c2s_route_t r;
        /* A session that ended since the lookup takes nothing: as if its resource had gone. */
        if (rt__c2s_reg_lookup(to->s, rt_jid_bare_len(to), rt_jid_resource(to), to->resource,
                               &r, 1) &&
            rt__c2s_send_bytes(r.pid, bytes)) {
            if (copies)
                carbons("received", to->s, rt_jid_bare_len(to), bytes, &r, 1, 0);
            return;
        }
        if (strcmp(type, "chat") != 0 && strcmp(type, "normal") != 0 &&
            strcmp(type, "groupchat") != 0)
            return; /* headline, error: silently dropped (RFC 6121 8.5.3.2.1) */
    }
    if (strcmp(type, "groupchat") == 0) {
        rt__c2s_stanza_error(self, c, el, "cancel", "service-unavailable");
        return;
    }
    c2s_route_t r[C2S_ROUTES_MAX];
    bool headline = strcmp(type, "headline") == 0;
    size_t sent = to_bare(to, bytes, headline, 0, r);
    if (sent && copies)
        carbons("received", to->s, rt_jid_bare_len(to), bytes, r, sent, 0);
    if (sent || headline)
        return;
    if (keep_offline(to, bytes->data, bytes->len, rt_xml_attr(el, "id"), c->jid->s,
                     rt_self(self)) != 0)
        rt__c2s_stanza_error(self, c, el, "wait", "resource-constraint");
}

/* Whether m carries a stanza of element name (the tag's name ends there). */
static bool stanza_is(const rt_msg_t *m, const char *name)
{
    size_t n = strlen(name);
    return m->len > n + 1 && m->data[0] == '<' && memcmp(m->data + 1, name, n) == 0 &&
           (m->data[n + 1] == ' ' || m->data[n + 1] == '>');
}

/*
** A stanza that cannot go where it was sent (p: one a local session wrote, with both JIDs):
** its sender, a local full JID, gets it back as an error with cond (RFC 6120 8.3), unless it
** is an error itself, a result, or presence (which are dropped, as for a resource that is
** gone). Returns whether an error was sent.
*/
bool rt__c2s_bounce(const uint8_t *p, size_t len, const char *cond)
{
    static const char *const names[] = {"message", "iq"};
    char type[8], id[256], to[RT_JID_TEXT_MAX + 1], from[RT_JID_TEXT_MAX + 1];
    size_t k = 0;
    while (k < 2 && !(len > strlen(names[k]) + 1 && p[0] == '<' &&
                      memcmp(p + 1, names[k], strlen(names[k])) == 0 &&
                      (p[strlen(names[k]) + 1] == ' ' || p[strlen(names[k]) + 1] == '>')))
        k++;
    if (k == 2)
        return false;
    int tn = rt__c2s_first_tag_attr(p, len, "type", type, sizeof(type) - 1);
    type[tn > 0 ? tn : 0] = 0;
    if (strcmp(type, "error") == 0 ||
        (k == 1 && strcmp(type, "get") != 0 && strcmp(type, "set") != 0))
        return false;
    int idn = rt__c2s_first_tag_attr(p, len, "id", id, sizeof(id) - 1);
    int ton = rt__c2s_first_tag_attr(p, len, "to", to, sizeof(to) - 1);
    int fn = rt__c2s_first_tag_attr(p, len, "from", from, sizeof(from) - 1);
    rt_jid_buf_t sender;
    if ((k == 1 && idn < 0) || ton <= 0 || fn <= 0 ||
        rt_jid_prep(from, (size_t)fn, &sender, NULL) != 0 || !sender.jid.resource)
        return false;
    to[ton] = 0;
    c2s_route_t r;
    if (!rt__c2s_reg_lookup(sender.jid.s, rt_jid_bare_len(&sender.jid),
                            rt_jid_resource(&sender.jid), sender.jid.resource, &r, 1))
        return false;
    rt_buf_t b = {0};
    rt_xml_put_start(&b, names[k]);
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", "error");
    if (idn >= 0)
        rt_xml_put_attr_len(&b, "id", id, (size_t)idn);
    rt_xml_put_attr(&b, "from", to);
    rt_xml_put_attr(&b, "to", sender.jid.s);
    rt_xml_put_start_end(&b);
    rt_buf_printf(&b, "<error type='%s'><%s xmlns='%s'/></error>",
                  strcmp(cond, "resource-constraint") == 0 ||
                          strcmp(cond, "remote-server-timeout") == 0
                      ? "wait"
                      : "cancel",
                  cond, RT_XML_NS_STANZA_ERRORS);
    rt_xml_put_end(&b, names[k]);
    bool sent = rt__c2s_send_bytes(r.pid, &b);
    rt_buf_free(&b);
    return sent;
}

/*
** An iq request no session will take: the sender gets service-unavailable, the answer for a
** full JID whose resource is not there (RFC 6121 8.5.3.2.3), rather than waiting for ever.
*/
void rt__c2s_iq_unanswered(const uint8_t *p, size_t len)
{
    if (rt__c2s_bounce(p, len, "service-unavailable"))
        atomic_fetch_add_explicit(&rt_c2s_stats.orphan_iqs, 1, memory_order_relaxed);
}

/*
** A stanza a session could not take: one that came after its stream ended, or left in its
** mailbox when it ended (sent before it left the registry: the runtime's dead letter), gone
** being that session, no longer a place for it. A message goes on as RFC 6121 8.5.3.2.1 has a
** message to a resource that is gone go: chat and normal to the account's available resources
** of the highest priority, else to offline storage, headline to all of them; an error or
** groupchat copy is dropped, and so is a carbon copy (its original went to another session).
** An iq request is answered (rt__c2s_iq_unanswered). Runs outside the actor, on any thread:
** it reads the stanza alone, never the session's state.
*/
void rt__c2s_orphan(const rt_msg_t *m, rt_pid_t gone)
{
    if (stanza_is(m, "iq")) {
        rt__c2s_iq_unanswered(m->data, m->len);
        return;
    }
    if (stanza_is(m, "message"))
        rt__c2s_message_rerouted(m->data, m->len, gone, m->from);
}

void rt__c2s_message_rerouted(const uint8_t *p, size_t len, rt_pid_t gone, rt_pid_t sender)
{
    char text[RT_JID_TEXT_MAX + 1], type[16], id[256], from[RT_JID_TEXT_MAX + 1];
    int n = rt__c2s_first_tag_attr(p, len, "to", text, sizeof(text) - 1);
    rt_jid_buf_t to;
    if (n <= 0 || rt_jid_prep(text, (size_t)n, &to, NULL) != 0)
        return; /* a carbon copy (no to) */
    int tn = rt__c2s_first_tag_attr(p, len, "type", type, sizeof(type) - 1);
    if (tn < 0)
        snprintf(type, sizeof(type), "normal");
    else
        type[tn] = 0;
    bool headline = strcmp(type, "headline") == 0;
    if (!headline && strcmp(type, "chat") != 0 && strcmp(type, "normal") != 0)
        return;
    atomic_fetch_add_explicit(&rt_c2s_stats.orphans_rerouted, 1, memory_order_relaxed);
    c2s_route_t r[C2S_ROUTES_MAX];
    rt_buf_t bytes = {.data = (char *)(uintptr_t)p, .len = len};
    if (to_bare(&to.jid, &bytes, headline, gone, r) || headline)
        return;
    int idn = rt__c2s_first_tag_attr(p, len, "id", id, sizeof(id) - 1);
    int fn = rt__c2s_first_tag_attr(p, len, "from", from, sizeof(from) - 1);
    if (idn >= 0)
        id[idn] = 0;
    from[fn > 0 ? fn : 0] = 0;
    if (keep_offline(&to.jid, p, len, idn >= 0 ? id : NULL, from, sender) != 0) {
        atomic_fetch_add_explicit(&rt_c2s_stats.offline_refused, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "xmpp.orphan_lost", "to=%s reason=no store", text);
    }
}

static void route_presence(const rt_jid_t *to, const rt_buf_t *bytes)
{
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t n = rt__c2s_reg_lookup(to->s, rt_jid_bare_len(to), to->resource ? rt_jid_resource(to) : NULL,
                                  to->resource, r, C2S_ROUTES_MAX);
    for (size_t i = 0; i < n; i++)
        if (r[i].available)
            rt__c2s_send_bytes(r[i].pid, bytes);
}

static void route_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                     const rt_buf_t *bytes)
{
    c2s_route_t r;
    if (to->resource &&
        rt__c2s_reg_lookup(to->s, rt_jid_bare_len(to), rt_jid_resource(to), to->resource, &r, 1) &&
        rt__c2s_send_bytes(r.pid, bytes))
        return;
    if (!to->resource &&
        (rt__c2s_vcard_other(self, c, el, to) || rt__c2s_pep_other(self, c, el, to)))
        return; /* answered by the server for the account (XEP-0054 3.2, XEP-0163) */
    const char *type = rt_xml_attr(el, "type");
    if (type && (strcmp(type, "get") == 0 || strcmp(type, "set") == 0))
        rt__c2s_stanza_error(self, c, el, "cancel", "service-unavailable");
}

/* ---- Presence of the session's own ---- */

/* An available or unavailable presence to the user's available resources, the sender's too
   (RFC 6121 4.2.2, 4.5.2). */
static void broadcast_own(rt_actor_t *self, c2s_t *c, const rt_buf_t *bytes)
{
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t blen;
    const char *bare = bare_text(c, &blen);
    size_t n = rt__c2s_reg_lookup(bare, blen, NULL, 0, r, C2S_ROUTES_MAX);
    for (size_t i = 0; i < n; i++)
        if (r[i].available)
            rt__c2s_send_bytes(r[i].pid, bytes);
}

static void presence_broadcast(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    const char *type = rt_xml_attr(el, "type");
    bool unavailable = type && strcmp(type, "unavailable") == 0;
    if (type && !unavailable) {
        rt__c2s_stanza_error(self, c, el, "modify", "bad-request");
        return;
    }
    int prio = 0;
    const rt_xml_el_t *p = rt_xml_child(el, "priority", RT_XML_NS_CLIENT);
    if (p) {
        const char *t = rt_xml_text(p, NULL);
        char *end;
        long v = t ? strtol(t, &end, 10) : 0;
        if (!t || *end || v < -128 || v > 127) {
            rt__c2s_stanza_error(self, c, el, "modify", "bad-request");
            return;
        }
        prio = (int)v;
    }
    rt_buf_t b = {0};
    rt__c2s_put_stanza(&b, el, c->jid->s, NULL);
    bool initial = !c->available && !unavailable;
    c->available = !unavailable;
    c->priority = (int8_t)prio;
    size_t blen;
    const char *bare = bare_text(c, &blen);
    rt__c2s_reg_presence(bare, blen, rt_jid_resource(c->jid), c->jid->resource, rt_self(self),
                         c->available, c->priority);
    broadcast_own(self, c, &b);
    rt__c2s_presence_out(self, c, &b, initial);
    if (unavailable)
        rt__c2s_directed_end(self, c, &b); /* RFC 6121 4.6.3 */
    else
        rt__c2s_pep_presence(self, c, el);
    rt_buf_free(&b);
    rt__c2s_rule_presence(self, c, el, c->available);
}

/* ---- A stanza from the client ---- */

/* RFC 6120 8.1.2.1: a from the client gives must be its full or bare JID. */
static bool from_ok(const c2s_t *c, const char *from)
{
    if (!from)
        return true;
    rt_jid_buf_t jb;
    if (rt_jid_prep(from, strlen(from), &jb, NULL) != 0)
        return false;
    return rt_jid_eq(&jb.jid, c->jid) || (!jb.jid.resource && rt_jid_bare_eq(&jb.jid, c->jid));
}

int rt__c2s_stanza(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el)
{
    bool iq = strcmp(el->name, "iq") == 0, message = strcmp(el->name, "message") == 0,
         presence = strcmp(el->name, "presence") == 0;
    if (!iq && !message && !presence) {
        rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_STANZA_TYPE, NULL);
        return RT_XML_STOP;
    }
    if (c->phase == PH_BIND) {
        if (!iq)
            return 0; /* RFC 6120 7.1: not routed before a resource is bound */
        return bind(self, c, el);
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.stanzas_in, 1, memory_order_relaxed);
    rt__c2s_sm_count_in(c);
    if (!from_ok(c, rt_xml_attr(el, "from"))) {
        rt__c2s_stream_error(self, c, RT_XML_COND_INVALID_FROM, NULL);
        return RT_XML_STOP;
    }
    const char *to_text = rt_xml_attr(el, "to");
    if (!c->traffic && (!iq || to_text)) {
        /* Its traffic goes before logins; a login's own requests to the server (roster,
           blocklist, disco) stay behind the chats of those already in. */
        c->traffic = true;
        rt_set_priority(self, RT_PRIORITY_NORMAL);
    }
    rt_jid_buf_t tb;
    if (to_text && rt_jid_prep(to_text, strlen(to_text), &tb, NULL) != 0) {
        rt__c2s_stanza_error(self, c, el, "modify", "jid-malformed");
        return 0;
    }
    const rt_jid_t *to = to_text ? &tb.jid : NULL;
    const char *type = rt_xml_attr(el, "type");
    if (iq && (!rt_xml_attr(el, "id") || !type)) {
        rt__c2s_stanza_error(self, c, el, "modify", "bad-request");
        return 0;
    }
    /* For the server itself: no to, the served domain, or (iq) the user's own bare JID. */
    bool to_server = !to || (!to->local && !to->resource &&
                             rt__c2s_host_index(rt_jid_domain(to), to->domain) == (int)c->host);
    bool to_own_bare = to && !to->resource && rt_jid_bare_eq(to, c->jid);
    if (iq && (to_server || to_own_bare)) {
        iq_server(self, c, el, type, to_own_bare);
        return 0;
    }
    int upload = to ? rt__c2s_upload_index(rt_jid_domain(to), to->domain) : -1;
    if (upload >= 0) { /* a service's: its iqs are answered, nothing else is taken */
        if (iq)
            rt__c2s_upload_iq(self, c, el, to, upload);
        return 0;
    }
    if (to && !to_server && rt__c2s_block_out(self, c, el, to))
        return 0; /* XEP-0191 3.6 */
    if (presence && !to) {
        presence_broadcast(self, c, el);
        return 0;
    }
    if (to && rt__c2s_muc_index(rt_jid_domain(to), to->domain) >= 0) {
        rt_buf_t b = {0};
        rt__c2s_put_stanza(&b, el, c->jid->s, tb.jid.s);
        /* A join is directed presence: the room hears of the session's end (RFC 6121 4.6). */
        if (!presence || (type && strcmp(type, "unavailable") != 0) ||
            rt__c2s_directed(self, c, el, to, !type))
            rt__c2s_muc_route(self, c, el, to, &b);
        rt_buf_free(&b);
        if (message) /* the rules see what is said in rooms too (a chat command to a device) */
            rt__c2s_rule_message(self, c, el, tb.jid.s);
        return 0;
    }
    if (presence && type && strcmp(type, "unavailable") != 0 && strcmp(type, "error") != 0) {
        if (to && rt__c2s_host_index(rt_jid_domain(to), to->domain) < 0 &&
            !rt__c2s_domain_remote(rt_jid_domain(to), to->domain))
            rt__c2s_stanza_error(self, c, el, "cancel", "remote-server-not-found");
        else
            rt__c2s_subscription(self, c, el, to, type);
        return 0;
    }
    if (to_server)
        return 0; /* a message or directed presence to the server: nothing takes it */
    rt_buf_t b = {0};
    if (rt__c2s_host_index(rt_jid_domain(to), to->domain) < 0) {
        to_remote(self, c, el, to, &b);
        return 0;
    }
    rt__c2s_put_stanza(&b, el, c->jid->s, tb.jid.s);
    if (message) {
        rt__c2s_mam_message(c, el, to, &b);
        route_message(self, c, el, to, &b);
        rt__c2s_rule_message(self, c, el, tb.jid.s);
    } else if (presence) {
        bool error = type && strcmp(type, "error") == 0; /* changes no presence */
        if (error || rt__c2s_directed(self, c, el, to, !type))
            route_presence(to, &b);
    } else {
        route_iq(self, c, el, to, &b);
    }
    rt_buf_free(&b);
    return 0;
}

/*
** A stanza for another server's domain: through federation when it is on (c2s_s2s.c), else
** remote-server-not-found. Directed presence is remembered as for a local entity, so that the
** session's end sends its unavailable there too.
*/
static void to_remote(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                      rt_buf_t *b)
{
    const char *type = rt_xml_attr(el, "type");
    bool presence = strcmp(el->name, "presence") == 0;
    if (!rt__c2s_s2s_on()) {
        rt__c2s_stanza_error(self, c, el, "cancel", "remote-server-not-found");
        return;
    }
    if (presence && type && strcmp(type, "error") != 0 && !rt__c2s_directed(self, c, el, to, false))
        return;
    if (presence && !type && !rt__c2s_directed(self, c, el, to, true))
        return;
    rt__c2s_put_stanza(b, el, c->jid->s, to->s);
    const char *local = rt__c2s.conf->hosts[c->host];
    if (b->oom ||
        !rt__c2s_s2s_send(local, strlen(local), rt_jid_domain(to), to->domain, b->data, b->len))
        rt__c2s_stanza_error(self, c, el, "cancel", "remote-server-not-found");
    rt_buf_free(b);
}

/* ---- Messages from other sessions ---- */

void rt__c2s_flush_held(rt_actor_t *self, c2s_t *c)
{
    if (!c->held_out)
        return;
    uint8_t *h = c->held_out;
    c->held_out = NULL;
    rt__c2s_write_stanzas(self, c, h, c->held_out_len, c->held_out_count);
    rt_free(self, h);
    c->held_out_len = c->held_out_count = 0;
}

/*
** A stanza from another session, written to the client; while the client says it is inactive
** (XEP-0352), presence waits (most of what a phone is sent, and none of it urgent) until it is
** active, something else is written, or C2S_HELD_OUT_MAX bytes wait.
*/
void rt__c2s_deliver(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    if (c->phase != PH_ACTIVE || c->closing) {
        /* Its stream is over (kicked, replaced, a stream error): written now, it would
           follow </stream:stream> into a closing socket. */
        rt__c2s_orphan(m, rt_self(self));
        return;
    }
    if (rt__c2s_block_in(self, c, m))
        return;
    static const char presence[] = "<presence";
    bool hold = c->inactive && m->len > sizeof(presence) &&
                memcmp(m->data, presence, sizeof(presence) - 1) == 0 &&
                c->held_out_len + m->len <= C2S_HELD_OUT_MAX;
    if (hold) {
        uint8_t *h = rt_realloc(self, c->held_out, c->held_out_len + m->len, RT_OBJ_LEAF);
        if (h) {
            memcpy(h + c->held_out_len, m->data, m->len);
            c->held_out = h;
            c->held_out_len += m->len;
            c->held_out_count++;
            return;
        }
    }
    rt__c2s_flush_held(self, c);
    rt__c2s_write_stanzas(self, c, m->data, m->len, 1);
    if (rt__c2s_sm_detached(c) && rt__c2s_push_worthy(m->data, m->len))
        rt__c2s_push_detached(c);
}

void rt__c2s_put_unavailable(rt_buf_t *b, const c2s_t *c)
{
    rt_xml_put_start(b, "presence");
    rt_xml_put_attr(b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(b, "from", c->jid->s);
    rt_xml_put_attr(b, "type", "unavailable");
    rt_xml_put_empty_end(b);
}

void rt__c2s_session_end(rt_actor_t *self, c2s_t *c)
{
    if (c->phase != PH_ACTIVE || !c->jid)
        return;
    size_t blen;
    const char *bare = bare_text(c, &blen);
    bool moved = rt__c2s_sm_moved_away(c);
    if (moved) { /* it goes on on another node: no unavailable, nothing handed on */
        c->available = false;
        rt_free(self, c->directed);
        c->directed = NULL;
        c->directed_len = 0;
    }
    rt__c2s_sm_unacked(self, c);
    rt_buf_t b = {0};
    if (c->available || c->directed_len)
        rt__c2s_put_unavailable(&b, c);
    if (c->available) {
        /* Ended late (a lost connection's end waits in the low lane), the session may find its
           resource bound again by an available session (the client back, replacing it): that
           session's presence stands, and an unavailable in the same full JID's name would tell
           its contacts and its own resources that it left. The rooms it joined are still told
           (their joins are directed presence, which the new session sends again, later). One
           bound and not yet available is no reason: its contacts get the unavailable, then its
           presence when it sends one. */
        c2s_route_t now;
        bool replaced = rt__c2s_reg_lookup(bare, blen, rt_jid_resource(c->jid), c->jid->resource,
                                           &now, 1) == 1 &&
                        now.pid != rt_self(self) && now.available;
        c->available = false;
        rt__c2s_reg_presence(bare, blen, rt_jid_resource(c->jid), c->jid->resource,
                             rt_self(self), false, 0);
        if (!replaced) {
            broadcast_own(self, c, &b);
            rt__c2s_presence_out(self, c, &b, false);
        }
        rt__c2s_rule_presence(self, c, NULL, false);
    }
    if (c->directed_len)
        rt__c2s_directed_end(self, c, &b);
    rt_buf_free(&b);
    rt__c2s_rule_session(self, c, false, moved ? "moved" : c->closing ? "closed" : "ended");
    rt__c2s_reg_unbind(bare, blen, rt_jid_resource(c->jid), c->jid->resource, rt_self(self));
    rt_charge(self, -(ptrdiff_t)rt__c2s_reg_entry_bytes(blen, c->jid->resource));
    atomic_fetch_sub_explicit(&rt_c2s_stats.bound, 1, memory_order_relaxed);
    c->phase = PH_BIND;
}

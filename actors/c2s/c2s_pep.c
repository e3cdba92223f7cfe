/*
** PEP (XEP-0163), the session's side: every account is a pubsub service of its own (XEP-0060's
** nodes and items, kept in xmpp.db by the store actor: c2s_store_pep.c). The session parses the
** iqs to its account (publish with publish-options, items, retract, node delete) and to another
** account (items), and asks the store, which answers the iq and sends the events on.
**
** Who is told of what (XEP-0163 4, "filtered notifications"): a client says which nodes it wants
** in its entity capabilities (XEP-0115: a feature "NODE+notify" in the disco#info its presence's
** <c/> names). The session asks its own client for that disco#info once per capabilities it
** announces (no cache shared between sessions: one client's answer never decides what another
** is sent), keeps the node names on its heap, and then asks the store for the last item of each
** such node of its own account and of the contacts whose presence it gets (4.3.4). Live events
** come to every available session of the owner's subscribers; each writes only those its
** client asked for.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "xeps.h"

#define NS_PUBSUB_OWNER RT_C2S_NS_PUBSUB "#owner"
#define NS_CAPS "http://jabber.org/protocol/caps"
#define NS_DISCO_INFO "http://jabber.org/protocol/disco#info"
#define NS_XDATA "jabber:x:data"
#define NOTIFY_SUFFIX "+notify"
#define CAPS_IQ_ID "rt-caps"

/* A payload is kept with its namespace always declared (an element with none gets xmlns=''),
   so that its bytes read the same inside <item/> of pubsub and of pubsub#event. */
#define PAYLOAD_CONTEXT "\x01"

/* The nodes one session may ask to be told of, and the bytes of their names. */
#define C2S_NOTIFY_MAX 64
#define C2S_NOTIFY_BYTES 4096
#define C2S_CAPS_VER_MAX 128

/* What the session knows of its client's capabilities, on its heap (c2s_t.caps). */
struct c2s_caps_s {
    uint16_t ver_len;    /* the <c/>'s node#ver this is for */
    uint16_t notify_len; /* the +notify nodes, each NUL-ended */
    bool pending;        /* its disco#info was asked and not answered yet */
    char data[];         /* node#ver, then the nodes */
};

static bool pep_on(const c2s_t *c)
{
    return rt__c2s.conf->pep && !c->anonymous;
}

void rt__c2s_pep_features(rt_buf_t *b, const c2s_t *c)
{
    static const char *const features[] = {
        "access-open",     "access-presence", "access-whitelist", "auto-create",
        "auto-subscribe",  "delete-items",    "delete-nodes",     "filtered-notifications",
        "item-ids",        "last-published",  "persistent-items", "publish",
        "publish-options", "retract-items",   "retrieve-items",
    };
    if (!pep_on(c))
        return;
    rt_buf_printf(b, "<identity category='pubsub' type='pep'/><feature var='%s'/>",
                  RT_C2S_NS_PUBSUB);
    for (size_t i = 0; i < sizeof(features) / sizeof(features[0]); i++)
        rt_buf_printf(b, "<feature var='%s#%s'/>", RT_C2S_NS_PUBSUB, features[i]);
}

/* ---- Requests ---- */

static void field(rt_buf_t *d, const char *s)
{
    rt_buf_add(d, s ? s : "", (s ? strlen(s) : 0) + 1);
}

static void ask(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, uint32_t op,
                const rt_jid_t *owner, const rt_buf_t *d)
{
    int rc = RT_ENOMEM;
    if (!d->oom)
        rc = rt__c2s_store_ask(op, 0, rt_jid_domain(owner), owner->domain, rt_jid_local(owner),
                               owner->local, 0, d->data, d->len);
    if (rc)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
}

/* XEP-0060 7.1.5: the options a publish requires of its node; false when one cannot be met. */
static bool publish_options(const rt_xml_el_t *pubsub, c2s_pep_publish_t *p)
{
    p->access = RT_PEP_UNSET;
    p->max_items = 0;
    const rt_xml_el_t *po = rt_xml_child(pubsub, "publish-options", RT_C2S_NS_PUBSUB);
    const rt_xml_el_t *x = po ? rt_xml_child(po, "x", NS_XDATA) : NULL;
    if (!x)
        return true;
    p->options = 1;
    const char *access = rt__c2s_form_value(x, "pubsub#access_model");
    const char *max = rt__c2s_form_value(x, "pubsub#max_items");
    const char *persist = rt__c2s_form_value(x, "pubsub#persist_items");
    if (access) {
        if (strcmp(access, "presence") == 0)
            p->access = RT_PEP_PRESENCE;
        else if (strcmp(access, "open") == 0)
            p->access = RT_PEP_OPEN;
        else if (strcmp(access, "whitelist") == 0)
            p->access = RT_PEP_WHITELIST;
        else
            return false; /* roster groups, authorize: not served */
    }
    if (max) {
        char *end;
        unsigned long v = strcmp(max, "max") == 0 ? UINT32_MAX : strtoul(max, &end, 10);
        if ((strcmp(max, "max") != 0 && (*end || end == max)) || v == 0)
            return false;
        p->max_items = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    }
    /* Every item is kept (until max_items): a node that would keep none is not served. */
    return !persist || strcmp(persist, "true") == 0 || strcmp(persist, "1") == 0;
}

static void publish(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *pubsub,
                    const rt_xml_el_t *pub)
{
    const char *node = rt_xml_attr(pub, "node");
    const rt_xml_el_t *item = rt_xml_child(pub, "item", RT_C2S_NS_PUBSUB);
    const rt_xml_el_t *payload = item ? rt_xml_first(item) : NULL;
    if (!node || !node[0] || !item || rt_xml_next(item, NULL, NULL)) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    if (!payload || rt_xml_next(payload, NULL, NULL)) { /* 7.1.3.6, 7.1.3.7 */
        rt__c2s_stanza_error_app(self, c, iq, "modify", "bad-request",
                                 payload ? "<invalid-payload xmlns='" RT_C2S_NS_PUBSUB "#errors'/>"
                                         : "<item-required xmlns='" RT_C2S_NS_PUBSUB "#errors'/>");
        return;
    }
    c2s_pep_publish_t p = {0};
    if (!publish_options(pubsub, &p)) {
        rt__c2s_stanza_error_app(self, c, iq, "cancel", "conflict",
                                 "<precondition-not-met xmlns='" RT_C2S_NS_PUBSUB "#errors'/>");
        return;
    }
    const char *id = rt_xml_attr(item, "id");
    char made[33];
    if (!id || !id[0]) { /* 7.1.1: the service gives the item its id */
        if (rt_random_hex(made, 16) != 0) {
            rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
            return;
        }
        id = made;
    }
    rt_buf_t d = {0};
    field(&d, rt_xml_attr(iq, "id"));
    field(&d, node);
    field(&d, id);
    rt_buf_add(&d, &p, sizeof(p));
    rt_xml_put_tree(&d, payload, PAYLOAD_CONTEXT);
    ask(self, c, iq, C2S_OP_PEP_PUBLISH, c->jid, &d);
    rt_buf_free(&d);
}

static void retract_or_delete(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq,
                              const rt_xml_el_t *el, bool node_itself)
{
    const char *node = rt_xml_attr(el, "node");
    const rt_xml_el_t *item = node_itself ? NULL : rt_xml_child(el, "item", RT_C2S_NS_PUBSUB);
    const char *id = item ? rt_xml_attr(item, "id") : NULL;
    const char *notify = rt_xml_attr(el, "notify");
    if (!node || !node[0] || (!node_itself && (!id || !id[0] || rt_xml_next(item, NULL, NULL)))) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    rt_buf_t d = {0};
    field(&d, rt_xml_attr(iq, "id"));
    field(&d, node);
    field(&d, id);
    uint8_t tell = notify && (strcmp(notify, "true") == 0 || strcmp(notify, "1") == 0);
    rt_buf_add(&d, &tell, 1);
    ask(self, c, iq, C2S_OP_PEP_DELETE, c->jid, &d);
    rt_buf_free(&d);
}

/* An items get (XEP-0060 6.5) of owner's node, by the session's user (other: another's). */
static void items(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *el,
                  const rt_jid_t *owner, bool other)
{
    const char *node = rt_xml_attr(el, "node"), *max = rt_xml_attr(el, "max_items");
    const rt_xml_el_t *item = rt_xml_child(el, "item", RT_C2S_NS_PUBSUB);
    const char *id = item ? rt_xml_attr(item, "id") : NULL;
    char *end = NULL;
    unsigned long n = max ? strtoul(max, &end, 10) : 0;
    if (!node || !node[0] || (item && (!id || rt_xml_next(item, NULL, NULL))) ||
        (max && (*end || end == max || n == 0))) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    uint32_t n32 = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    rt_buf_t d = {0};
    field(&d, rt_xml_attr(iq, "id"));
    if (rt_xml_attr(iq, "to")) /* answered from where it was sent */
        rt_buf_add(&d, owner->s, rt_jid_bare_len(owner));
    rt_buf_add(&d, "", 1);
    if (other)
        rt_buf_add(&d, c->jid->s, rt_jid_bare_len(c->jid));
    rt_buf_add(&d, "", 1);
    field(&d, node);
    field(&d, id);
    rt_buf_add(&d, &n32, sizeof(n32));
    ask(self, c, iq, C2S_OP_PEP_ITEMS, owner, &d);
    rt_buf_free(&d);
}

void rt__c2s_pep_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                    bool get)
{
    if (!pep_on(c)) {
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable");
        return;
    }
    const rt_xml_el_t *op = rt_xml_first(q);
    bool owner_ns = strcmp(q->ns, NS_PUBSUB_OWNER) == 0;
    if (strcmp(q->name, "pubsub") != 0 || !op) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
    } else if (!get && !owner_ns && strcmp(op->name, "publish") == 0) {
        publish(self, c, iq, q, op);
    } else if (!get && !owner_ns && strcmp(op->name, "retract") == 0) {
        retract_or_delete(self, c, iq, op, false);
    } else if (!get && owner_ns && strcmp(op->name, "delete") == 0) {
        retract_or_delete(self, c, iq, op, true);
    } else if (get && !owner_ns && strcmp(op->name, "items") == 0) {
        items(self, c, iq, op, c->jid, false);
    } else {
        rt__c2s_stanza_error(self, c, iq, "cancel", "feature-not-implemented");
    }
}

bool rt__c2s_pep_other(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to)
{
    const char *type = rt_xml_attr(iq, "type");
    const rt_xml_el_t *q = rt_xml_first(iq);
    if (!to->local || !type || !q || strcmp(q->ns, RT_C2S_NS_PUBSUB) != 0 ||
        strcmp(q->name, "pubsub") != 0 || !rt__c2s.conf->pep)
        return false;
    const rt_xml_el_t *op = rt_xml_first(q);
    if (strcmp(type, "get") != 0 || !op || strcmp(op->name, "items") != 0)
        rt__c2s_stanza_error(self, c, iq, "auth", "forbidden"); /* only its owner changes it */
    else
        items(self, c, iq, op, to, true);
    return true;
}

/* ---- Capabilities and events ---- */

static const char *caps_nodes(const c2s_caps_t *k)
{
    return k->data + k->ver_len;
}

void rt__c2s_pep_presence(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *presence)
{
    const rt_xml_el_t *cap = rt_xml_child(presence, "c", NS_CAPS);
    const char *node = cap ? rt_xml_attr(cap, "node") : NULL;
    const char *ver = cap ? rt_xml_attr(cap, "ver") : NULL;
    if (!pep_on(c) || !node || !ver)
        return;
    char nv[C2S_CAPS_VER_MAX + 1];
    int n = snprintf(nv, sizeof(nv), "%s#%s", node, ver);
    if (n < 0 || n >= (int)sizeof(nv))
        return;
    if (c->caps && c->caps->ver_len == (size_t)n && memcmp(c->caps->data, nv, (size_t)n) == 0)
        return; /* the same capabilities: what was learned (or is being asked) holds */
    c2s_caps_t *k = rt_alloc(self, sizeof(*k) + (size_t)n, RT_OBJ_LEAF);
    if (!k)
        return;
    k->ver_len = (uint16_t)n;
    k->notify_len = 0;
    k->pending = true;
    memcpy(k->data, nv, (size_t)n);
    rt_free(self, c->caps);
    c->caps = k;
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "from", rt__c2s.conf->hosts[c->host]);
    rt_xml_put_attr(&b, "to", c->jid->s);
    rt_xml_put_attr(&b, "type", "get");
    rt_xml_put_attr(&b, "id", CAPS_IQ_ID);
    rt_buf_printf(&b, "><query xmlns='%s'", NS_DISCO_INFO);
    rt_xml_put_attr(&b, "node", nv);
    rt_buf_printf(&b, "/></iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

void rt__c2s_pep_last(c2s_t *c, const char *contact, size_t len)
{
    const c2s_caps_t *k = c->caps;
    if (!k || !k->notify_len || !c->available)
        return;
    rt_buf_t d = {0};
    rt_buf_add(&d, c->jid->s, rt_jid_len(c->jid) + 1);
    rt_buf_add(&d, contact, len);
    rt_buf_add(&d, "", 1);
    rt_buf_add(&d, caps_nodes(k), k->notify_len);
    if (!d.oom)
        rt__c2s_ask_own(c, C2S_OP_PEP_LAST, d.data, d.len);
    rt_buf_free(&d);
}

bool rt__c2s_pep_caps_answer(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    const char *id = rt_xml_attr(iq, "id");
    if (!id || strcmp(id, CAPS_IQ_ID) != 0 || !c->caps || !c->caps->pending)
        return false;
    c2s_caps_t *old = c->caps;
    old->pending = false;
    const rt_xml_el_t *q = rt_xml_child(iq, "query", NS_DISCO_INFO);
    const char *type = rt_xml_attr(iq, "type");
    if (!q || !type || strcmp(type, "result") != 0)
        return true; /* no answer: told of nothing */
    rt_buf_t nodes = {0};
    size_t count = 0;
    for (const rt_xml_el_t *f = rt_xml_child(q, "feature", NS_DISCO_INFO); f;
         f = rt_xml_next(f, "feature", NS_DISCO_INFO)) {
        const char *var = rt_xml_attr(f, "var");
        size_t len = var ? strlen(var) : 0, sl = sizeof(NOTIFY_SUFFIX) - 1;
        if (len <= sl || strcmp(var + len - sl, NOTIFY_SUFFIX) != 0)
            continue;
        if (count == C2S_NOTIFY_MAX || nodes.len + len - sl + 1 > C2S_NOTIFY_BYTES)
            break; /* the first ones are told; the rest are not (a bound, not an error) */
        rt_buf_add(&nodes, var, len - sl);
        rt_buf_add(&nodes, "", 1);
        count++;
    }
    c2s_caps_t *k =
        nodes.oom ? NULL : rt_alloc(self, sizeof(*k) + old->ver_len + nodes.len, RT_OBJ_LEAF);
    if (k) {
        *k = *old;
        memcpy(k->data, old->data, old->ver_len);
        if (nodes.len)
            memcpy(k->data + old->ver_len, nodes.data, nodes.len);
        k->notify_len = (uint16_t)nodes.len;
        rt_free(self, old);
        c->caps = k;
        rt__c2s_pep_last(c, NULL, 0);
    }
    rt_buf_free(&nodes);
    return true;
}

static bool wants(const c2s_t *c, const char *node, size_t len)
{
    const c2s_caps_t *k = c->caps;
    const char *p = k ? caps_nodes(k) : NULL;
    for (size_t at = 0; k && at < k->notify_len;) {
        size_t n = strnlen(p + at, k->notify_len - at);
        if (n == len && memcmp(p + at, node, len) == 0)
            return true;
        at += n + 1;
    }
    return false;
}

void rt__c2s_pep_event(rt_actor_t *self, c2s_t *c, const rt_msg_t *m)
{
    c2s_pep_event_t h;
    if (m->len < sizeof(h) || c->phase != PH_ACTIVE || c->closing)
        return; /* an event is not kept for later: the last item comes with the next login */
    memcpy(&h, m->data, sizeof(h));
    size_t fixed = sizeof(h) + h.node_len + h.from_len;
    if (m->len < fixed + h.head_len)
        return;
    const char *node = (const char *)m->data + sizeof(h);
    const char *from = node + h.node_len;
    if (!wants(c, node, h.node_len) || rt__c2s_blocks(c, from, h.from_len))
        return;
    const uint8_t *head = m->data + fixed;
    rt_buf_t b = {0};
    rt_buf_add(&b, head, h.head_len);
    rt_xml_put_attr_len(&b, "to", c->jid->s, rt_jid_len(c->jid));
    rt_buf_add(&b, head + h.head_len, m->len - fixed - h.head_len);
    rt__c2s_write_stanza_buf(self, c, &b);
}

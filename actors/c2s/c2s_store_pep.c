/*
** The store actor's side of PEP (XEP-0163; c2s_pep.c is the session's): publish, retract and
** delete on the owner's nodes, each answered with the finished iq and followed by its event to
** the sessions entitled to it (the owner's own and, unless the node is the owner's alone, its
** contacts subscribed to its presence); reads of a node's items, by its owner or another; and
** each node's last item for a session that has just said which it wants (+notify).
**
** An event goes to a session as C2S_MSG_PEP_EVENT: the session writes it only for a node its
** client asked to be told of (entity capabilities, XEP-0115), with its own full JID as `to`.
*/
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "c2s_store.h"
#include "xeps.h"

/* A request's NUL-terminated fields, in order, then `size` bytes copied to fixed (none when
   size is 0); *end: where the rest begins. false when a part runs past the data. */
static bool fields(const uint8_t *data, size_t len, const char **out, size_t n, void *fixed,
                   size_t size, size_t *end)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = at < len ? strnlen((const char *)data + at, len - at) : 0;
        if (at + l >= len)
            return false;
        out[i] = (const char *)data + at;
        at += l + 1;
    }
    if (len - at < size)
        return false;
    if (size)
        memcpy(fixed, data + at, size);
    *end = at + size;
    return true;
}

static void iq_reply(rt_pid_t to, const char *id, const char *from, int rc, const char *cond,
                     const rt_buf_t *payload)
{
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "id", id);
    if (from[0])
        rt_xml_put_attr(&b, "from", from);
    rt_xml_put_attr(&b, "type", rc ? "error" : "result");
    if (rc) {
        const char *type = rc == RT_EINVAL ? "modify" : rc == RT_EAGAIN ? "wait" : "cancel";
        rt_buf_printf(&b, "><error type='%s'><%s xmlns='%s'/>", type, cond,
                      RT_XML_NS_STANZA_ERRORS);
        if (rc == RT_EEXIST) /* XEP-0060 7.1.5 */
            rt_buf_printf(&b, "<precondition-not-met xmlns='%s#errors'/>", RT_C2S_NS_PUBSUB);
        rt_buf_printf(&b, "</error></iq>");
    } else if (payload && payload->len) {
        rt_xml_put_start_end(&b);
        rt_buf_add(&b, payload->data, payload->len);
        rt_xml_put_end(&b, "iq");
    } else {
        rt_xml_put_empty_end(&b);
    }
    if (!b.oom && !(payload && payload->oom))
        rt_send(to, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
}

static const char *cond_of(int rc)
{
    switch (rc) {
    case RT_ELIMIT:
        return "resource-constraint";
    case RT_EINVAL:
        return "bad-request";
    case RT_EEXIST:
        return "conflict";
    case RT_EACCES:
        return "forbidden";
    case RT_ENOTFOUND:
        return "item-not-found";
    default:
        return "internal-server-error";
    }
}

/* ---- Events ---- */

/* An event for node from owner as C2S_MSG_PEP_EVENT carries it (c2s_pep_event_t, node,
   owner, head, tail): `inner` (what goes inside <event>) in the tail, the receiving session's
   to='JID' between head and tail. */
static void event_make(rt_buf_t *msg, const char *owner, const char *node, const rt_buf_t *inner)
{
    rt_buf_t head = {0}, tail = {0};
    rt_xml_put_start(&head, "message");
    rt_xml_put_attr(&head, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&head, "from", owner);
    rt_buf_printf(&tail, " type='headline'><event xmlns='%s#event'>", RT_C2S_NS_PUBSUB);
    rt_buf_add(&tail, inner->data, inner->len);
    rt_buf_printf(&tail, "</event></message>");
    c2s_pep_event_t h = {.node_len = (uint16_t)strlen(node),
                         .from_len = (uint16_t)strlen(owner),
                         .head_len = (uint32_t)head.len};
    rt_buf_add(msg, &h, sizeof(h));
    rt_buf_add(msg, node, h.node_len);
    rt_buf_add(msg, owner, h.from_len);
    rt_buf_add(msg, head.data, head.len);
    rt_buf_add(msg, tail.data, tail.len);
    if (head.oom || tail.oom)
        msg->oom = true;
    rt_buf_free(&head);
    rt_buf_free(&tail);
}

static void to_sessions(const char *bare, size_t len, const rt_buf_t *msg)
{
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t k = rt__c2s_reg_lookup(bare, len, NULL, 0, r, C2S_ROUTES_MAX);
    for (size_t i = 0; i < k; i++)
        if (r[i].available)
            rt__c2s_send(r[i].pid, C2S_MSG_PEP_EVENT, msg->data, msg->len);
}

static int to_subscriber(const rt_roster_item_t *it, void *arg)
{
    if (it->state & RT_ROSTER_FROM)
        to_sessions(it->jid, strlen(it->jid), arg);
    return 0;
}

/* The event to the owner's sessions and (access permitting) its subscribers' (RFC 6121's
   FROM: those who get the owner's presence). */
static void event_send(rt_accounts_t *a, const char *host, const char *user, const char *node,
                       uint32_t access, const rt_buf_t *inner)
{
    char owner[2 * RT_JID_PART_MAX + 2];
    snprintf(owner, sizeof(owner), "%s@%s", user, host);
    rt_buf_t msg = {0};
    event_make(&msg, owner, node, inner);
    if (!msg.oom) {
        to_sessions(owner, strlen(owner), &msg);
        if (access != RT_PEP_WHITELIST)
            rt_roster_get(a, host, user, to_subscriber, &msg, NULL);
    }
    rt_buf_free(&msg);
}

/* ---- Requests ---- */

/* data: iq id, node, item id (each NUL-ended), c2s_pep_publish_t, the payload. */
void rt__c2s_store_pep_publish(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                               const uint8_t *data, size_t len)
{
    const char *f[3];
    size_t at;
    c2s_pep_publish_t p;
    if (!fields(data, len, f, 3, &p, sizeof(p), &at))
        return;
    const char *id = f[0], *node = f[1], *item = f[2];
    const rt_conf_xmpp_t *conf = rt__c2s.conf;
    rt_pep_bounds_t bounds = {.nodes = (uint32_t)conf->pep_max_nodes,
                              .items = (uint32_t)conf->pep_max_items,
                              .bytes = (uint64_t)conf->pep_max_bytes};
    rt_pep_node_t want = {.access = p.access, .max_items = p.max_items}, got;
    int rc = rt_pep_publish(a, host, user, node, item, data + at, len - at,
                            p.options ? &want : NULL, &bounds, &got);
    rt_buf_t res = {0};
    if (rc == 0) {
        rt_buf_printf(&res, "<pubsub xmlns='%s'><publish", RT_C2S_NS_PUBSUB);
        rt_xml_put_attr(&res, "node", node);
        rt_buf_printf(&res, "><item");
        rt_xml_put_attr(&res, "id", item);
        rt_buf_printf(&res, "/></publish></pubsub>");
    }
    iq_reply(to, id, "", rc, rc == RT_ELIMIT ? "not-acceptable" : cond_of(rc), &res);
    rt_buf_free(&res);
    if (rc != 0)
        return;
    rt_buf_t inner = {0};
    rt_xml_put_start(&inner, "items");
    rt_xml_put_attr(&inner, "node", node);
    rt_buf_printf(&inner, "><item");
    rt_xml_put_attr(&inner, "id", item);
    rt_xml_put_start_end(&inner);
    rt_buf_add(&inner, data + at, len - at);
    rt_buf_printf(&inner, "</item></items>");
    if (!inner.oom)
        event_send(a, host, user, node, got.access, &inner);
    rt_buf_free(&inner);
}

/* data: iq id, node, item id (empty: the node itself), each NUL-ended, then a notify byte. */
void rt__c2s_store_pep_delete(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len)
{
    const char *f[3];
    size_t at;
    uint8_t notify;
    if (!fields(data, len, f, 3, &notify, sizeof(notify), &at))
        return;
    const char *id = f[0], *node = f[1], *item = f[2][0] ? f[2] : NULL;
    rt_pep_node_t cfg = {0};
    bool known = rt_pep_node(a, host, user, node, &cfg) == 0;
    int rc = rt_pep_delete(a, host, user, node, item);
    iq_reply(to, id, "", rc, cond_of(rc), NULL);
    if (rc != 0 || !known || (item && !notify))
        return;
    rt_buf_t inner = {0};
    if (item) { /* XEP-0060 7.2.2.1 */
        rt_xml_put_start(&inner, "items");
        rt_xml_put_attr(&inner, "node", node);
        rt_buf_printf(&inner, "><retract");
        rt_xml_put_attr(&inner, "id", item);
        rt_buf_printf(&inner, "/></items>");
    } else { /* 8.4.2 */
        rt_xml_put_start(&inner, "delete");
        rt_xml_put_attr(&inner, "node", node);
        rt_xml_put_empty_end(&inner);
    }
    if (!inner.oom)
        event_send(a, host, user, node, cfg.access, &inner);
    rt_buf_free(&inner);
}

static void put_item(const char *id, const void *payload, size_t len, void *arg)
{
    rt_buf_t *b = arg;
    rt_buf_printf(b, "<item");
    rt_xml_put_attr(b, "id", id);
    rt_xml_put_start_end(b);
    rt_buf_add(b, payload, len);
    rt_buf_printf(b, "</item>");
}

static int subscription_of(const rt_roster_item_t *it, void *arg)
{
    *(unsigned *)arg = it->state;
    return 0;
}

/* Whether reader (a bare JID) may read what access lets out of owner's account. */
static bool may_read(rt_accounts_t *a, const char *host, const char *user, const char *reader,
                     uint32_t access)
{
    if (access == RT_PEP_OPEN)
        return true;
    if (access == RT_PEP_WHITELIST)
        return false;
    unsigned state = 0;
    return rt_roster_item(a, host, user, reader, subscription_of, &state) == 0 &&
           (state & RT_ROSTER_FROM);
}

/* data: iq id, the answer's from (empty: none), the reader's bare JID (empty: the owner),
   node, item id (empty: the newest max), each NUL-ended, then max (uint32_t). */
void rt__c2s_store_pep_items(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len)
{
    const char *f[5];
    size_t at;
    uint32_t max;
    if (!fields(data, len, f, 5, &max, sizeof(max), &at))
        return;
    const char *id = f[0], *from = f[1], *reader = f[2], *node = f[3];
    const char *item = f[4][0] ? f[4] : NULL;
    rt_pep_node_t cfg;
    int rc = rt_pep_node(a, host, user, node, &cfg);
    if (rc == 0 && reader[0] && !may_read(a, host, user, reader, cfg.access))
        rc = RT_EACCES;
    rt_buf_t res = {0};
    rt_buf_printf(&res, "<pubsub xmlns='%s'><items", RT_C2S_NS_PUBSUB);
    rt_xml_put_attr(&res, "node", node);
    rt_xml_put_start_end(&res);
    if (rc == 0)
        rc = rt_pep_items(a, host, user, node, item, max ? max : cfg.max_items, put_item, &res);
    rt_buf_printf(&res, "</items></pubsub>");
    /* Another's node that does not exist or may not be read: the same answer both ways
       (XEP-0060 6.5.9.11 and 6.5.9.2 differ; telling them apart would show which exist). */
    if (rc == RT_EACCES || (rc == RT_ENOTFOUND && reader[0]))
        rc = RT_ENOTFOUND;
    iq_reply(to, id, from, rc, cond_of(rc), &res);
    rt_buf_free(&res);
}

typedef struct last_s {
    rt_accounts_t *a;
    rt_pid_t to;
    const char *full;     /* the asking session's full JID */
    const char *owner;    /* whose items these are */
    const uint8_t *wants; /* the nodes asked for, each NUL-ended */
    size_t wants_len;
    bool own;         /* the asker's own account */
    const char *only; /* one contact's, or NULL: every contact's */
} last_t;

static bool wanted(const last_t *l, const char *node)
{
    size_t at = 0;
    while (at < l->wants_len) {
        const char *w = (const char *)l->wants + at;
        size_t n = strnlen(w, l->wants_len - at);
        if (strcmp(w, node) == 0)
            return true;
        at += n + 1;
    }
    return false;
}

static void send_last(const char *node, uint32_t access, const char *id, const void *payload,
                      size_t len, void *arg)
{
    const last_t *l = arg;
    if (!wanted(l, node) || (!l->own && access == RT_PEP_WHITELIST))
        return;
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "message");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "from", l->owner);
    rt_xml_put_attr(&b, "to", l->full);
    rt_xml_put_attr(&b, "type", "headline");
    rt_buf_printf(&b, "><event xmlns='%s#event'><items", RT_C2S_NS_PUBSUB);
    rt_xml_put_attr(&b, "node", node);
    rt_xml_put_start_end(&b);
    put_item(id, payload, len, &b);
    rt_buf_printf(&b, "</items></event></message>");
    if (!b.oom)
        rt_send(l->to, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
}

static int last_of_contact(const rt_roster_item_t *it, void *arg)
{
    last_t *l = arg;
    const char *at = strchr(it->jid, '@');
    if (!(it->state & RT_ROSTER_TO) || !at || rt__c2s_host_index(at + 1, strlen(at + 1)) < 0 ||
        (l->only && strcmp(l->only, it->jid) != 0))
        return 0;
    char user[RT_JID_PART_MAX + 1];
    size_t ulen = (size_t)(at - it->jid);
    if (ulen > RT_JID_PART_MAX)
        return 0;
    memcpy(user, it->jid, ulen);
    user[ulen] = 0;
    l->owner = it->jid;
    rt_pep_last(l->a, at + 1, user, send_last, l); /* a contact's failure is not the rest's */
    return 0;
}

/* data: the asking session's full JID, a contact's bare JID (empty: every contact's and the
   account's own), the nodes it wants told of, each NUL-ended. The account's own last items,
   then those of each contact it gets the presence of (TO): the contact's roster item is read
   here, whatever the session said. */
void rt__c2s_store_pep_last(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                            const uint8_t *data, size_t len)
{
    const char *f[2];
    size_t at;
    if (!fields(data, len, f, 2, NULL, 0, &at))
        return;
    char owner[2 * RT_JID_PART_MAX + 2];
    snprintf(owner, sizeof(owner), "%s@%s", user, host);
    last_t l = {.a = a,
                .to = to,
                .full = f[0],
                .owner = owner,
                .wants = data + at,
                .wants_len = len - at,
                .own = !f[1][0],
                .only = f[1][0] ? f[1] : NULL};
    if (l.own)
        rt_pep_last(a, host, user, send_last, &l);
    l.own = false;
    if (l.only)
        rt_roster_item(a, host, user, l.only, last_of_contact, &l);
    else
        rt_roster_get(a, host, user, last_of_contact, &l, NULL);
}

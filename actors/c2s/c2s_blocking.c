/*
** Blocking (XEP-0191), the session's side. The blocklist lives in xmpp.db and changes in the
** store actor (c2s_store_xeps.c); a session keeps a packed copy of its account's (each JID:
** 2 bytes of length, little-endian, then its bytes), sent by the store at the first blocklist
** get or initial presence and again after every change, with the push for the resources that
** asked for the list. With it the session refuses what its client sends to a blocked JID
** (3.6) and drops what a blocked JID sends its client (3.5) before writing it: the receiving
** session checks, so a sender never needs another account's list.
**
** A JID blocks as privacy lists match (XEP-0016 2.1): a full JID that one, a bare JID every
** resource of it, a domain everything from it, domain/resource that one.
*/
#include <string.h>

#include "c2s_impl.h"

#define NS_BLOCKING "urn:xmpp:blocking"
#define BLOCKED_APP "<blocked xmlns='urn:xmpp:blocking:errors'/>"

/* ---- Matching ---- */

static bool eq(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && memcmp(a, b, alen) == 0;
}

bool rt__c2s_blocks(const c2s_t *c, const char *jid, size_t len)
{
    return rt__c2s_list_blocks(c->blocked, c->blocked_len, jid, len);
}

bool rt__c2s_list_blocks(const uint8_t *list, size_t llen, const char *jid, size_t len)
{
    if (!llen)
        return false;
    /* The forms that match jid: itself, its bare JID, its domain and domain/resource. */
    const char *slash = memchr(jid, '/', len);
    size_t bare = slash ? (size_t)(slash - jid) : len;
    const char *at = memchr(jid, '@', bare);
    const char *domain = at ? at + 1 : jid;
    size_t dlen = bare - (size_t)(domain - jid), dres = len - (size_t)(domain - jid);
    for (size_t i = 0; i + 2 <= llen;) {
        size_t n = (size_t)list[i] | (size_t)list[i + 1] << 8;
        const char *b = (const char *)list + i + 2;
        if (i + 2 + n > llen)
            break;
        if (eq(b, n, jid, len) || eq(b, n, jid, bare) || eq(b, n, domain, dlen) ||
            (slash && eq(b, n, domain, dres)))
            return true;
        i += 2 + n;
    }
    return false;
}

bool rt__c2s_block_out(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to)
{
    if (!rt__c2s_blocks(c, to->s, rt_jid_len(to)))
        return false;
    rt__c2s_stanza_error_app(self, c, el, "cancel", "not-acceptable", BLOCKED_APP);
    return true;
}

int rt__c2s_first_tag_attr(const uint8_t *p, size_t len, const char *name, char *out, size_t cap)
{
    const uint8_t *end = memchr(p, '>', len);
    if (!end)
        return -1;
    size_t nlen = strlen(name), tag = (size_t)(end - p);
    for (size_t i = 1; i + nlen + 3 <= tag; i++) {
        if (p[i - 1] != ' ' || memcmp(p + i, name, nlen) != 0 || p[i + nlen] != '=' ||
            p[i + nlen + 1] != '\'')
            continue;
        size_t k = 0;
        static const struct {
            const char *ent;
            char ch;
        } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&apos;", '\''}, {"&quot;", '"'}};
        for (size_t j = i + nlen + 2; j < tag && k < cap; j++) {
            if (p[j] == '\'')
                return (int)k;
            if (p[j] != '&') {
                out[k++] = (char)p[j];
                continue;
            }
            size_t e = 0;
            while (e < 5 && !(tag - j >= strlen(ents[e].ent) &&
                              memcmp(p + j, ents[e].ent, strlen(ents[e].ent)) == 0))
                e++;
            if (e == 5)
                return -1;
            out[k++] = ents[e].ch;
            j += strlen(ents[e].ent) - 1;
        }
        return -1;
    }
    return -1;
}

bool rt__c2s_block_in(rt_actor_t *self, c2s_t *c, const rt_msg_t *m)
{
    (void)self;
    if (!c->blocked_len || m->len < 2 || m->data[0] != '<')
        return false;
    char from[RT_JID_TEXT_MAX + 1];
    int flen = rt__c2s_first_tag_attr(m->data, m->len, "from", from, sizeof(from) - 1);
    if (flen <= 0 || !rt__c2s_blocks(c, from, (size_t)flen))
        return false;
    /* Dropped. Presence gets no answer; a message or an iq get or set service-unavailable
       (XEP-0191 3.5), sent to the blocked sender's session if it is still there. */
    char type[16], id[256];
    int tlen = rt__c2s_first_tag_attr(m->data, m->len, "type", type, sizeof(type) - 1);
    type[tlen > 0 ? tlen : 0] = 0;
    bool message = m->len > 8 && memcmp(m->data, "<message", 8) == 0,
         iq = m->len > 3 && memcmp(m->data, "<iq", 3) == 0;
    if (!(message && strcmp(type, "error") != 0) &&
        !(iq && (strcmp(type, "get") == 0 || strcmp(type, "set") == 0)))
        return true;
    from[flen] = 0;
    rt_jid_buf_t jb;
    if (rt_jid_prep(from, (size_t)flen, &jb, NULL) != 0)
        return true;
    c2s_route_t r;
    if (!jb.jid.resource || !rt__c2s_reg_lookup(jb.jid.s, rt_jid_bare_len(&jb.jid),
                                                rt_jid_resource(&jb.jid), jb.jid.resource, &r, 1))
        return true;
    int idlen = rt__c2s_first_tag_attr(m->data, m->len, "id", id, sizeof(id) - 1);
    rt_buf_t b = {0};
    rt_xml_put_start(&b, message ? "message" : "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "type", "error");
    if (idlen >= 0)
        rt_xml_put_attr_len(&b, "id", id, (size_t)idlen);
    rt_xml_put_attr_len(&b, "from", c->jid->s, rt_jid_bare_len(c->jid));
    rt_xml_put_attr(&b, "to", jb.jid.s);
    rt_buf_printf(&b, "><error type='cancel'><service-unavailable xmlns='%s'/></error>",
                  RT_XML_NS_STANZA_ERRORS);
    rt_xml_put_end(&b, message ? "message" : "iq");
    rt__c2s_send_bytes(r.pid, &b);
    rt_buf_free(&b);
    return true;
}

/* ---- Requests from the client ---- */

void rt__c2s_blocking_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                         bool get)
{
    const char *id = rt_xml_attr(iq, "id");
    bool block = strcmp(q->name, "block") == 0, unblock = strcmp(q->name, "unblock") == 0;
    if (get != (strcmp(q->name, "blocklist") == 0) || (!get && !block && !unblock)) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    rt_buf_t d = {0};
    if (get) {
        c->block_interested = true;
        rt_buf_add(&d, id, strlen(id) + 1);
        if (d.oom || rt__c2s_ask_own(c, C2S_OP_BLOCK_GET, d.data, d.len) != 0)
            rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
        rt_buf_free(&d);
        return;
    }
    if (c->anonymous) { /* nothing is kept for an account that is not one */
        rt__c2s_stanza_error(self, c, iq, "cancel", "not-allowed");
        return;
    }
    uint8_t flag = block;
    rt_buf_add(&d, &flag, 1);
    rt_buf_add(&d, id, strlen(id) + 1);
    unsigned n = 0;
    for (const rt_xml_el_t *it = rt_xml_child(q, "item", NS_BLOCKING); it;
         it = rt_xml_next(it, "item", NS_BLOCKING)) {
        const char *jid = rt_xml_attr(it, "jid");
        rt_jid_buf_t jb;
        /* 3.3: a bad JID is jid-malformed; more items than a list may hold, a constraint */
        if (!jid || rt_jid_prep(jid, strlen(jid), &jb, NULL) != 0) {
            rt__c2s_stanza_error(self, c, iq, "modify", "jid-malformed");
            rt_buf_free(&d);
            return;
        }
        if (++n > (unsigned)rt__c2s.conf->max_roster_items) {
            rt__c2s_stanza_error(self, c, iq, "cancel", "resource-constraint");
            rt_buf_free(&d);
            return;
        }
        rt_buf_add(&d, jb.jid.s, rt_jid_len(&jb.jid) + 1);
    }
    if (block && n == 0) { /* 3.3: a block with no item */
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        rt_buf_free(&d);
        return;
    }
    if (d.oom || rt__c2s_ask_own(c, C2S_OP_BLOCK_SET, d.data, d.len) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&d);
}

/* The store's C2S_MSG_BLOCKLIST: push length (4 bytes), the push, the packed list. */
void rt__c2s_blocklist_msg(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    uint32_t plen;
    if (c->phase != PH_ACTIVE || m->len < sizeof(plen))
        return;
    memcpy(&plen, m->data, sizeof(plen));
    if (plen > m->len - sizeof(plen))
        return;
    const uint8_t *list = m->data + sizeof(plen) + plen;
    size_t llen = m->len - sizeof(plen) - plen;
    uint8_t *copy = NULL;
    if (llen && !(copy = rt_alloc(self, llen, RT_OBJ_LEAF)))
        return; /* the old copy stays until the next change */
    if (llen)
        memcpy(copy, list, llen);
    if (c->available && c->block_loaded) /* a change; the first list comes before broadcasts */
        rt__c2s_unavailable_to_blocked(self, c, list, llen);
    rt_free(self, c->blocked);
    c->blocked = copy;
    c->blocked_len = (uint32_t)llen;
    c->block_loaded = true;
    if (plen && c->block_interested)
        rt__c2s_write_stanzas(self, c, m->data + sizeof(plen), plen, 1);
}

/*
** The session's side of rosters and presence (RFC 6121 2-4). The roster lives in xmpp.db and
** changes in the store actor (c2s_store_roster.c); a session keeps a packed copy of its user's
** (bare JID and subscription state of each contact: C2S_ENTRY_HEAD + the JID's bytes), which
** the store sends at the first presence and at every roster get, and keeps current with each
** change (C2S_MSG_ROSTER_ITEM). With it the session broadcasts its presence to the contacts
** subscribed to it (FROM), probes those it is subscribed to (TO) at its initial presence, and
** answers their probes, without asking the store again.
**
** Most clients fetch the roster before their initial presence: that roster get also brings
** the blocklist and says whether a subscription request waits or a message was kept
** (C2S_MSG_PRESENCE_READY when neither), so the presence asks the store nothing; what is
** kept or asked for the user after it is announced (C2S_MSG_PRESENCE_STALE) and fetched.
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "roster.h"

#define NS_ROSTER "jabber:iq:roster"

/* ---- The packed copy ---- */

typedef struct entry_s {
    unsigned state;
    const char *jid;
    size_t len;
} entry_t;

/* The entry at *at of c's copy, moving *at past it; false at the end. */
static bool next_entry(const uint8_t *p, size_t len, size_t *at, entry_t *e)
{
    if (*at + C2S_ENTRY_HEAD > len)
        return false;
    e->state = p[*at];
    e->len = (size_t)p[*at + 1] | (size_t)p[*at + 2] << 8;
    e->jid = (const char *)p + *at + C2S_ENTRY_HEAD;
    if (*at + C2S_ENTRY_HEAD + e->len > len)
        return false;
    *at += C2S_ENTRY_HEAD + e->len;
    return true;
}

static bool find(const c2s_t *c, const char *jid, size_t len, size_t *where, entry_t *e)
{
    size_t at = 0, start = 0;
    while (next_entry(c->roster, c->roster_len, &at, e)) {
        if (e->len == len && memcmp(e->jid, jid, len) == 0) {
            *where = start;
            return true;
        }
        start = at;
    }
    return false;
}

/* Replaces, adds or (state C2S_ROSTER_GONE) removes jid's entry. */
static void update(rt_actor_t *self, c2s_t *c, unsigned state, const char *jid, size_t len)
{
    size_t where;
    entry_t e;
    if (find(c, jid, len, &where, &e)) {
        if (state != C2S_ROSTER_GONE) {
            c->roster[where] = (uint8_t)state;
            return;
        }
        size_t size = C2S_ENTRY_HEAD + e.len;
        memmove(c->roster + where, c->roster + where + size, c->roster_len - where - size);
        c->roster_len -= (uint32_t)size;
        return;
    }
    if (state == C2S_ROSTER_GONE)
        return;
    uint8_t *r = rt_realloc(self, c->roster, c->roster_len + C2S_ENTRY_HEAD + len, RT_OBJ_LEAF);
    if (!r)
        return; /* the copy misses a contact until the next roster get; logged by nobody */
    r[c->roster_len] = (uint8_t)state;
    r[c->roster_len + 1] = (uint8_t)(len & 0xff);
    r[c->roster_len + 2] = (uint8_t)(len >> 8);
    memcpy(r + c->roster_len + C2S_ENTRY_HEAD, jid, len);
    c->roster = r;
    c->roster_len += (uint32_t)(C2S_ENTRY_HEAD + len);
}

/* ---- Presence out ---- */

static void to_subscribers(const c2s_t *c, const void *p, size_t n)
{
    size_t at = 0;
    entry_t e;
    while (next_entry(c->roster, c->roster_len, &at, &e))
        if ((e.state & RT_ROSTER_FROM) && !rt__c2s_blocks(c, e.jid, e.len))
            rt__c2s_to_available(e.jid, e.len, p, n);
}

/* A probe to another server's contact (RFC 6121 4.3), from the user's bare JID. */
static bool probe_remote(const c2s_t *c, const char *jid, size_t len)
{
    const char *at = memchr(jid, '@', len);
    const char *domain = at ? at + 1 : jid;
    if (!rt__c2s_domain_remote(domain, (size_t)(jid + len - domain)))
        return false;
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<presence xmlns='%s' type='probe'", RT_XML_NS_CLIENT);
    rt_xml_put_attr_len(&b, "from", c->jid->s, rt_jid_bare_len(c->jid));
    rt_xml_put_attr_len(&b, "to", jid, len);
    rt_xml_put_empty_end(&b);
    if (!b.oom)
        rt__c2s_s2s_send(rt_jid_domain(c->jid), c->jid->domain, domain,
                         (size_t)(jid + len - domain), b.data, b.len);
    rt_buf_free(&b);
    return true;
}

static void probe_contacts(rt_actor_t *self, const c2s_t *c)
{
    size_t at = 0;
    entry_t e;
    while (next_entry(c->roster, c->roster_len, &at, &e)) {
        if (!(e.state & RT_ROSTER_TO) || probe_remote(c, e.jid, e.len))
            continue;
        c2s_route_t r[C2S_ROUTES_MAX];
        size_t k = rt__c2s_reg_lookup(e.jid, e.len, NULL, 0, r, C2S_ROUTES_MAX);
        for (size_t i = 0; i < k; i++)
            if (r[i].available && r[i].pid != rt_self(self))
                rt__c2s_send(r[i].pid, C2S_MSG_PROBE, c->jid->s, rt_jid_len(c->jid));
    }
}

void rt__c2s_presence_out(rt_actor_t *self, c2s_t *c, const rt_buf_t *b, bool initial)
{
    rt_free(self, c->pres);
    c->pres = NULL;
    c->pres_len = 0;
    if (c->available && !b->oom) {
        c->pres = rt_alloc(self, b->len, RT_OBJ_LEAF);
        if (c->pres) {
            memcpy(c->pres, b->data, b->len);
            c->pres_len = (uint32_t)b->len;
        }
    }
    /* A roster get before it brought the roster and blocklist, kept current since, and found
       no request waiting and nothing kept (C2S_MSG_PRESENCE_READY): the broadcast and probes
       go now, and the store is not asked (a third of a login's hops to it). */
    bool fast = initial && c->presence_ready && c->roster_loaded && c->block_loaded;
    c->presence_ready = false;
    if (initial && !fast) {
        /* The roster may have changed since any copy: the store sends it fresh, with what
           was kept for the user, and the broadcast and probes go when it comes. */
        c->broadcast_due = rt__c2s_ask_own(c, C2S_OP_PRESENCE_INIT, NULL, 0) == 0;
        if (c->broadcast_due)
            return;
    }
    if (c->roster_loaded && !b->oom)
        to_subscribers(c, b->data, b->len);
    if (fast) {
        c->presence_fast = true;
        probe_contacts(self, c);
    }
}

/* ---- Directed presence (RFC 6121 4.6) ---- */

/* The JID at *at of a packed list (2 bytes of length, little-endian, then its bytes). */
static bool next_listed(const uint8_t *p, size_t len, size_t *at, const char **jid, size_t *n)
{
    if (*at + 2 > len)
        return false;
    *n = (size_t)p[*at] | (size_t)p[*at + 1] << 8;
    *jid = (const char *)p + *at + 2;
    if (*at + 2 + *n > len)
        return false;
    *at += 2 + *n;
    return true;
}

/* The presence bytes to a JID given as text: a full JID's session, or a bare JID's available
   ones. */
static void presence_to_text(const char *jid, size_t len, const void *p, size_t n)
{
    if (rt__c2s_s2s_presence_to(jid, len, p, n))
        return; /* another server's entity */
    const char *slash = memchr(jid, '/', len);
    if (!slash) {
        rt__c2s_to_available(jid, len, p, n);
        return;
    }
    c2s_route_t r;
    size_t bare = (size_t)(slash - jid);
    if (rt__c2s_reg_lookup(jid, bare, slash + 1, len - bare - 1, &r, 1) && r.available)
        rt__c2s_send(r.pid, C2S_MSG_STANZA, p, n);
}

bool rt__c2s_directed(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                      bool available)
{
    size_t len = rt_jid_len(to), at = 0, start = 0, n, count = 0;
    const char *jid;
    while (next_listed(c->directed, c->directed_len, &at, &jid, &n)) {
        if (n == len && memcmp(jid, to->s, len) == 0) {
            if (!available) { /* 4.6.3: directed unavailable ends what directed available began */
                memmove(c->directed + start, c->directed + at, c->directed_len - at);
                c->directed_len -= (uint32_t)(at - start);
            }
            return true;
        }
        start = at;
        count++;
    }
    size_t where;
    entry_t e;
    if (!available ||
        (find(c, to->s, rt_jid_bare_len(to), &where, &e) && (e.state & RT_ROSTER_FROM)))
        return true; /* nothing to remember: a subscriber gets the broadcast's unavailable */
    uint8_t *d = count < C2S_DIRECTED_MAX
                     ? rt_realloc(self, c->directed, c->directed_len + 2 + len, RT_OBJ_LEAF)
                     : NULL;
    if (!d) {
        rt__c2s_stanza_error(self, c, el, "wait", "resource-constraint");
        return false;
    }
    d[c->directed_len] = (uint8_t)(len & 0xff);
    d[c->directed_len + 1] = (uint8_t)(len >> 8);
    memcpy(d + c->directed_len + 2, to->s, len);
    c->directed = d;
    c->directed_len += (uint32_t)(2 + len);
    return true;
}

void rt__c2s_directed_end(rt_actor_t *self, c2s_t *c, const rt_buf_t *b)
{
    size_t at = 0, n;
    const char *jid;
    while (!b->oom && next_listed(c->directed, c->directed_len, &at, &jid, &n))
        if (!rt__c2s_blocks(c, jid, n))
            presence_to_text(jid, n, b->data, b->len);
    rt_free(self, c->directed);
    c->directed = NULL;
    c->directed_len = 0;
}

void rt__c2s_unavailable_to_blocked(rt_actor_t *self, c2s_t *c, const uint8_t *list, size_t llen)
{
    (void)self;
    rt_buf_t b = {0};
    rt__c2s_put_unavailable(&b, c);
    size_t at = 0, n;
    entry_t e;
    const char *jid;
    while (!b.oom && next_entry(c->roster, c->roster_len, &at, &e))
        if ((e.state & RT_ROSTER_FROM) && rt__c2s_list_blocks(list, llen, e.jid, e.len) &&
            !rt__c2s_blocks(c, e.jid, e.len))
            rt__c2s_to_available(e.jid, e.len, b.data, b.len);
    at = 0;
    while (!b.oom && next_listed(c->directed, c->directed_len, &at, &jid, &n))
        if (rt__c2s_list_blocks(list, llen, jid, n) && !rt__c2s_blocks(c, jid, n))
            presence_to_text(jid, n, b.data, b.len);
    rt_buf_free(&b);
}

/* ---- Requests from the client ---- */

void rt__c2s_roster_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                       bool get)
{
    const char *id = rt_xml_attr(iq, "id");
    rt_buf_t d = {0};
    if (get) {
        const char *ver = rt_xml_attr(q, "ver");
        rt_buf_add(&d, id, strlen(id) + 1);
        if (ver)
            rt_buf_add(&d, ver, strlen(ver));
        c->interested = true;
        uint32_t op = c->available ? C2S_OP_ROSTER_GET : C2S_OP_ROSTER_GET_FIRST;
        if (d.oom || rt__c2s_ask_own(c, op, d.data, d.len) != 0)
            rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
        rt_buf_free(&d);
        return;
    }
    /* RFC 6121 2.3.3: one item, with a jid; the user's own JID is no contact */
    const rt_xml_el_t *item = rt_xml_child(q, "item", NS_ROSTER);
    const char *jid = item ? rt_xml_attr(item, "jid") : NULL;
    rt_jid_buf_t jb;
    if (!jid || rt_xml_next(item, NULL, NULL) || rt_jid_prep(jid, strlen(jid), &jb, NULL) != 0 ||
        jb.jid.resource || rt_jid_bare_eq(&jb.jid, c->jid)) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    const char *sub = rt_xml_attr(item, "subscription");
    const char *name = rt_xml_attr(item, "name");
    bool remove = sub && strcmp(sub, "remove") == 0;
    uint8_t ngroups = 0;
    rt_buf_t groups = {0};
    for (const rt_xml_el_t *g = rt_xml_child(item, "group", NS_ROSTER); g;
         g = rt_xml_next(g, "group", NS_ROSTER)) {
        size_t glen = 0;
        const char *t = rt_xml_text(g, &glen);
        if (!t || !glen || ngroups == RT_ROSTER_GROUPS_MAX || memchr(t, 0, glen)) {
            rt__c2s_stanza_error(self, c, iq, "modify", "not-acceptable");
            rt_buf_free(&groups);
            return;
        }
        rt_buf_add(&groups, t, glen + 1);
        ngroups++;
    }
    rt_buf_add(&d, id, strlen(id) + 1);
    rt_buf_add(&d, jb.jid.s, rt_jid_bare_len(&jb.jid));
    rt_buf_add(&d, "", 1);
    rt_buf_add(&d, name ? name : "", name ? strlen(name) + 1 : 1);
    uint8_t flags[2] = {remove, ngroups};
    rt_buf_add(&d, flags, 2);
    rt_buf_add(&d, groups.data, groups.len);
    if (d.oom || groups.oom || rt__c2s_ask_own(c, C2S_OP_ROSTER_SET, d.data, d.len) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&d);
    rt_buf_free(&groups);
}

void rt__c2s_subscription(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                          const char *type)
{
    static const char *const kinds[] = {NULL, "subscribe", "subscribed", "unsubscribe",
                                        "unsubscribed"};
    uint8_t kind = 0;
    for (uint8_t k = 1; k < 5; k++)
        if (strcmp(type, kinds[k]) == 0)
            kind = k;
    if (!kind || !to || !to->local || rt_jid_bare_eq(to, c->jid))
        return; /* RFC 6121 3: only to another account; probes from clients are ignored */
    char bare_to[RT_JID_TEXT_MAX + 1], bare_me[RT_JID_TEXT_MAX + 1];
    snprintf(bare_to, sizeof(bare_to), "%.*s", (int)rt_jid_bare_len(to), to->s);
    snprintf(bare_me, sizeof(bare_me), "%.*s", (int)rt_jid_bare_len(c->jid), c->jid->s);
    rt_buf_t d = {0};
    rt_buf_add(&d, &kind, 1);
    rt_buf_add(&d, bare_to, strlen(bare_to) + 1);
    rt__c2s_put_stanza(&d, el, bare_me, bare_to); /* RFC 6121 3.1.2: stamped with the bare JID */
    if (d.oom || rt__c2s_ask_own(c, C2S_OP_SUB, d.data, d.len) != 0)
        rt__c2s_stanza_error(self, c, el, "wait", "internal-server-error");
    rt_buf_free(&d);
}

/* ---- What the store and other sessions send ---- */

static void on_roster(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    uint8_t *r = NULL;
    if (m->len) {
        r = rt_alloc(self, m->len, RT_OBJ_LEAF);
        if (!r)
            return;
        memcpy(r, m->data, m->len);
    }
    rt_free(self, c->roster);
    c->roster = r;
    c->roster_len = m->len;
    c->roster_loaded = true;
    if (!c->broadcast_due)
        return;
    c->broadcast_due = false;
    if (c->available && c->pres)
        to_subscribers(c, c->pres, c->pres_len);
    probe_contacts(self, c);
}

static void on_item(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    size_t at = 0, where;
    entry_t e, old;
    if (!next_entry(m->data, m->len, &at, &e))
        return;
    bool had_to =
        c->roster_loaded && find(c, e.jid, e.len, &where, &old) && (old.state & RT_ROSTER_TO);
    if (c->roster_loaded)
        update(self, c, e.state, e.jid, e.len);
    /* Subscribed to a contact's presence now: subscribed to its PEP nodes too (XEP-0163's
       auto-subscribe), whose last items come at once. */
    if (c->roster_loaded && !had_to && e.state != C2S_ROSTER_GONE && (e.state & RT_ROSTER_TO))
        rt__c2s_pep_last(c, e.jid, e.len);
    if (c->interested && at < m->len)
        rt__c2s_write_stanzas(self, c, m->data + at, m->len - at, 1);
}

/*
** A contact's session asked for our presence (data: its full JID): given when the contact is
** subscribed to it (RFC 6121 4.3.2). Answered through the registry, not to the sender's pid:
** a session on another node of the cluster asks through that node's xmpp_cluster actor.
*/
static void on_probe(c2s_t *c, rt_msg_t *m)
{
    const char *jid = (const char *)m->data, *slash = memchr(jid, '/', m->len);
    size_t where, bare = slash ? (size_t)(slash - jid) : 0;
    entry_t e;
    c2s_route_t r;
    if (!slash || !c->available || !c->pres || !find(c, jid, bare, &where, &e) ||
        !(e.state & RT_ROSTER_FROM) || rt__c2s_blocks(c, jid, bare))
        return;
    if (rt__c2s_reg_lookup(jid, bare, slash + 1, m->len - bare - 1, &r, 1))
        rt__c2s_send(r.pid, C2S_MSG_STANZA, c->pres, c->pres_len);
}

static void on_presence_to(c2s_t *c, rt_msg_t *m)
{
    if (m->len < 2 || !c->available)
        return;
    const char *to = (const char *)m->data + 1;
    size_t len = m->len - 1;
    if (m->data[0]) {
        if (c->pres)
            rt__c2s_to_available(to, len, c->pres, c->pres_len);
        return;
    }
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<presence xmlns='%s' type='unavailable'", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "from", c->jid->s);
    rt_xml_put_empty_end(&b);
    if (!b.oom)
        rt__c2s_to_available(to, len, b.data, b.len);
    rt_buf_free(&b);
}

/*
** A message was kept for the user, or a subscription request made, after the roster get that
** made the initial presence ready: before that presence, it asks the store after all; after
** it, the session catches up (a kept message is taken by an available resource that takes
** messages, RFC 6121 8.5.2.1.1; a request is fetched when the fast presence missed it).
*/
static void on_stale(c2s_t *c, const rt_msg_t *m)
{
    if (!c->available) {
        c->presence_ready = false;
        return;
    }
    if (c->broadcast_due || !c->sock || c->closing)
        return; /* the store's answer to the initial presence covers it, or nobody reads */
    if (m->len == 1 && m->data[0] == C2S_STALE_KEPT && c->priority >= 0)
        rt__c2s_ask_own(c, C2S_OP_OFFLINE_TAKE, NULL, 0);
    else if (m->len == 1 && m->data[0] == C2S_STALE_PENDING && c->presence_fast)
        rt__c2s_ask_own(c, C2S_OP_PRESENCE_INIT, NULL, 0);
}

void rt__c2s_roster_msg(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    if (c->phase != PH_ACTIVE)
        return;
    switch (m->tag) {
    case C2S_MSG_ROSTER:
        on_roster(self, c, m);
        break;
    case C2S_MSG_ROSTER_ITEM:
        on_item(self, c, m);
        break;
    case C2S_MSG_PROBE:
        on_probe(c, m);
        break;
    case C2S_MSG_PRESENCE_TO:
        on_presence_to(c, m);
        break;
    case C2S_MSG_PRESENCE_READY:
        c->presence_ready = !c->available;
        break;
    case C2S_MSG_PRESENCE_STALE:
        on_stale(c, m);
        break;
    }
}

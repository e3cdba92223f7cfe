/*
** The store actor's side of rosters and presence subscriptions (RFC 6121 2, 3). Both rosters
** a subscription changes (the user's item for the contact and the contact's for the user) are
** in xmpp.db, so the store runs the state machine of RFC 6121 3 for both sides, then tells the
** sessions: a roster push to each of the changed roster's sessions (C2S_MSG_ROSTER_ITEM, which
** also updates the session's own copy), the presence stanza to the receiver's available
** resources, and to the contact's sessions, when the user's subscription starts or ends,
** that they send the user their presence or their unavailability (C2S_MSG_PRESENCE_TO).
**
** An item that exists only to remember a contact's pending request (state PENDING_IN and
** nothing else) is not in the roster the user sees (RFC 6121 3.1.3: no item is made for it).
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "c2s_store.h"
#include "log.h"

#define NS_ROSTER "jabber:iq:roster"

/* An item read for a change: its strings copied out of the store's call. */
typedef struct item_s {
    bool found;
    unsigned state;
    char jid[RT_JID_TEXT_MAX + 1];
    char name[RT_ROSTER_TEXT_MAX + 1];
    char groups[RT_ROSTER_GROUPS_MAX][RT_ROSTER_TEXT_MAX + 1];
    unsigned ngroups;
} item_t;

static int copy_item(const rt_roster_item_t *it, void *arg)
{
    item_t *o = arg;
    o->found = true;
    o->state = it->state;
    snprintf(o->jid, sizeof(o->jid), "%s", it->jid);
    snprintf(o->name, sizeof(o->name), "%s", it->name ? it->name : "");
    o->ngroups = it->ngroups;
    for (unsigned i = 0; i < it->ngroups; i++)
        snprintf(o->groups[i], sizeof(o->groups[i]), "%s", it->groups[i]);
    return 0;
}

static bool visible(unsigned state)
{
    return state != RT_ROSTER_PENDING_IN;
}

static const char *subscription(unsigned state)
{
    bool to = state & RT_ROSTER_TO, from = state & RT_ROSTER_FROM;
    return to && from ? "both" : to ? "to" : from ? "from" : "none";
}

static void put_item(rt_buf_t *b, const char *jid, const char *name, const char (*groups)[RT_ROSTER_TEXT_MAX + 1],
                     const char *const *gptrs, unsigned ngroups, unsigned state, bool removed)
{
    rt_xml_put_start(b, "item");
    rt_xml_put_attr(b, "jid", jid);
    if (name && *name)
        rt_xml_put_attr(b, "name", name);
    rt_xml_put_attr(b, "subscription", removed ? "remove" : subscription(state));
    if (!removed && (state & RT_ROSTER_ASK_OUT))
        rt_xml_put_attr(b, "ask", "subscribe");
    if (!removed && (state & RT_ROSTER_PREAPPROVED))
        rt_xml_put_attr(b, "approved", "true");
    if (removed || !ngroups) {
        rt_xml_put_empty_end(b);
        return;
    }
    rt_xml_put_start_end(b);
    for (unsigned i = 0; i < ngroups; i++) {
        const char *g = groups ? groups[i] : gptrs[i];
        rt_buf_printf(b, "<group>");
        rt_xml_put_text(b, g, strlen(g));
        rt_buf_printf(b, "</group>");
    }
    rt_xml_put_end(b, "item");
}

static void put_entry(rt_buf_t *b, unsigned state, const char *jid)
{
    size_t n = strlen(jid);
    uint8_t head[C2S_ENTRY_HEAD] = {(uint8_t)state, (uint8_t)(n & 0xff), (uint8_t)(n >> 8)};
    rt_buf_add(b, head, sizeof(head));
    rt_buf_add(b, jid, n);
}

/* The push of item (or of its removal) to every session of user@host, with its new state. */
static void push(const char *host, const char *user, const item_t *it, bool removed,
                 uint64_t version)
{
    rt_buf_t b = {0};
    put_entry(&b, removed ? C2S_ROSTER_GONE : it->state, it->jid);
    if (visible(it->state)) { /* a removed item: as it was (one the client never saw: no push) */
        rt_buf_printf(&b, "<iq xmlns='%s' type='set' id='push%llu'><query xmlns='%s' ver='%llu'>",
                      RT_XML_NS_CLIENT, (unsigned long long)version, NS_ROSTER,
                      (unsigned long long)version);
        put_item(&b, it->jid, it->name, it->groups, NULL, it->ngroups, it->state, removed);
        rt_buf_printf(&b, "</query></iq>");
    }
    if (!b.oom)
        rt__c2s_reg_to_account(host, user, C2S_MSG_ROSTER_ITEM, b.data, b.len, false);
    rt_buf_free(&b);
}

static int read_item(rt_accounts_t *a, const char *host, const char *user, const char *jid,
                     item_t *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->jid, sizeof(out->jid), "%s", jid);
    int rc = rt_roster_item(a, host, user, jid, copy_item, out);
    return rc == RT_ENOTFOUND ? 0 : rc;
}

/* Writes it with state, and pushes it when what the user sees changed. */
static int write_item(rt_accounts_t *a, const char *host, const char *user, item_t *it,
                      unsigned state)
{
    if (it->found && it->state == state)
        return 0;
    bool was_visible = it->found && visible(it->state);
    bool asked = (state & RT_ROSTER_PENDING_IN) &&
                 !(it->found && (it->state & RT_ROSTER_PENDING_IN));
    it->state = state;
    const char *groups[RT_ROSTER_GROUPS_MAX];
    for (unsigned i = 0; i < it->ngroups; i++)
        groups[i] = it->groups[i];
    rt_roster_item_t ri = {.jid = it->jid, .name = it->name, .ngroups = it->ngroups, .state = state};
    memcpy(ri.groups, groups, sizeof(groups[0]) * it->ngroups);
    uint64_t version = 0;
    char err[256];
    int rc = rt_roster_put(a, host, user, &ri, (uint32_t)rt__c2s.conf->max_roster_items, &version,
                           err, sizeof(err));
    if (rc) {
        rt_log(RT_LOG_INFO, "xmpp.roster_refused", "user=%s@%s contact=%s reason=%s", user, host,
               it->jid, rc == RT_ELIMIT ? "roster full" : err);
        return rc;
    }
    it->found = true;
    if (was_visible || visible(state))
        push(host, user, it, false, version);
    if (asked)
        rt__c2s_store_presence_stale(host, user, C2S_STALE_PENDING);
    return 0;
}

void rt_c2s_roster_forgot(const char *host, const char *user, const char *jid, uint64_t version,
                          void *accounts)
{
    item_t it;
    if (read_item(accounts, host, user, jid, &it) != 0)
        return;
    if (!it.found)
        it.state = RT_ROSTER_PENDING_IN; /* it went because it held only a request */
    push(host, user, &it, !it.found, version);
}

void rt__c2s_store_presence_stale(const char *host, const char *user, uint8_t kind)
{
    rt__c2s_reg_to_account(host, user, C2S_MSG_PRESENCE_STALE, &kind, 1,
                           kind == C2S_STALE_PENDING);
}

void rt__c2s_to_available(const char *bare, size_t len, const void *p, size_t n)
{
    if (rt__c2s_s2s_presence_to(bare, len, p, n))
        return; /* another server's account: there, through federation */
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t k = rt__c2s_reg_lookup(bare, len, NULL, 0, r, C2S_ROUTES_MAX);
    for (size_t i = 0; i < k; i++)
        if (r[i].available)
            rt__c2s_send(r[i].pid, C2S_MSG_STANZA, p, n);
}

/* The sessions of whose bare JID send theirs (available) or unavailable to bare `to`. */
static void presence_to(const char *who, bool available, const char *to)
{
    c2s_route_t r[C2S_ROUTES_MAX];
    size_t k = rt__c2s_reg_lookup(who, strlen(who), NULL, 0, r, C2S_ROUTES_MAX);
    rt_buf_t b = {0};
    uint8_t flag = available;
    rt_buf_add(&b, &flag, 1);
    rt_buf_add(&b, to, strlen(to));
    for (size_t i = 0; i < k && !b.oom; i++)
        if (r[i].available)
            rt__c2s_send(r[i].pid, C2S_MSG_PRESENCE_TO, b.data, b.len);
    rt_buf_free(&b);
}

/* A bare JID user@host split at its '@' into local and domain; false if it is no account's. */
static bool split(const char *bare, char *local, size_t llen, char *domain, size_t dlen)
{
    const char *at = strchr(bare, '@');
    if (!at || at == bare || strchr(at, '/') || (size_t)(at - bare) >= llen ||
        strlen(at + 1) >= dlen)
        return false;
    memcpy(local, bare, (size_t)(at - bare));
    local[at - bare] = 0;
    snprintf(domain, dlen, "%s", at + 1);
    return true;
}

/*
** The user's "subscribed" for a contact: true when it approves the contact's request waiting;
** false when there is nothing more to do (approved already, or no request: a pre-approval,
** RFC 6121 3.4, now kept).
*/
static bool approves_request(rt_accounts_t *a, const char *host, const char *user, item_t *mine)
{
    unsigned m = mine->state;
    if (m & RT_ROSTER_FROM)
        return false;
    if (!(m & RT_ROSTER_PENDING_IN)) {
        write_item(a, host, user, mine, m | RT_ROSTER_PREAPPROVED);
        return false;
    }
    return true;
}

/* C2S_OP_SUB's and C2S_OP_SUB_IN's data: a kind byte, the contact's bare JID, the stanza. */
typedef struct {
    unsigned kind;
    const char *contact;
    size_t clen, slen;
    const uint8_t *stanza;
} sub_req_t;

static bool sub_parse(const uint8_t *data, size_t len, sub_req_t *q)
{
    if (len < 2)
        return false;
    q->kind = data[0];
    q->contact = (const char *)data + 1;
    q->clen = strnlen(q->contact, len - 1);
    if (q->clen == len - 1)
        return false;
    q->stanza = (const uint8_t *)q->contact + q->clen + 1;
    q->slen = len - 1 - q->clen - 1;
    return true;
}

/*
** A subscription stanza from user (me) to another server's account: the user's side of the
** roster changes here (RFC 6121 3), the contact's server keeps the contact's, and the stanza
** goes there.
*/
static void sub_to_remote(rt_accounts_t *a, const char *host, const char *user, const char *me,
                          unsigned kind, const char *contact, const uint8_t *stanza, size_t slen)
{
    item_t mine;
    if (read_item(a, host, user, contact, &mine))
        return;
    unsigned m = mine.state, next = m;
    bool send = true;
    switch (kind) {
    case C2S_SUB_SUBSCRIBE:
        if (!(m & RT_ROSTER_TO))
            next = m | RT_ROSTER_ASK_OUT;
        break;
    case C2S_SUB_SUBSCRIBED:
        if (!approves_request(a, host, user, &mine))
            return;
        next = (m | RT_ROSTER_FROM) & ~RT_ROSTER_PENDING_IN;
        break;
    case C2S_SUB_UNSUBSCRIBE:
        next = m & ~(RT_ROSTER_TO | RT_ROSTER_ASK_OUT);
        break;
    case C2S_SUB_UNSUBSCRIBED:
        next = m & ~(RT_ROSTER_FROM | RT_ROSTER_PENDING_IN | RT_ROSTER_PREAPPROVED);
        send = (m & (RT_ROSTER_FROM | RT_ROSTER_PENDING_IN)) != 0;
        break;
    default:
        return;
    }
    if (next != m && write_item(a, host, user, &mine, next))
        return;
    if (send)
        rt__c2s_to_available(contact, strlen(contact), stanza, slen);
    if (kind == C2S_SUB_SUBSCRIBED) /* 3.1.5: the user's presence follows the approval */
        presence_to(me, true, contact);
    else if (kind == C2S_SUB_UNSUBSCRIBED && (m & RT_ROSTER_FROM))
        presence_to(me, false, contact);
}

/*
** A subscription stanza (or a probe) from another server's account (contact) to the user: the
** user's side of the roster, as RFC 6121 3 and 4.3 have the contact's server keep it.
*/
void rt__c2s_store_sub_in(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                          size_t len)
{
    sub_req_t q;
    if (!sub_parse(data, len, &q))
        return;
    char me[RT_JID_TEXT_MAX + 1];
    snprintf(me, sizeof(me), "%s@%s", user, host);
    item_t mine;
    if (read_item(a, host, user, q.contact, &mine))
        return;
    unsigned m = mine.state;
    switch (q.kind) {
    case C2S_SUB_SUBSCRIBE:
        if (m & (RT_ROSTER_FROM | RT_ROSTER_PREAPPROVED)) { /* approved already (3.1.3) */
            if (write_item(a, host, user, &mine,
                           (m | RT_ROSTER_FROM) & ~(RT_ROSTER_PREAPPROVED | RT_ROSTER_PENDING_IN)))
                return;
            char reply[2 * RT_JID_TEXT_MAX + 128];
            int n = snprintf(reply, sizeof(reply),
                             "<presence xmlns='%s' from='%s' to='%s' type='subscribed'/>",
                             RT_XML_NS_CLIENT, me, q.contact);
            if (n > 0 && (size_t)n < sizeof(reply))
                rt__c2s_to_available(q.contact, q.clen, reply, (size_t)n);
            presence_to(me, true, q.contact);
            return;
        }
        if (m & RT_ROSTER_PENDING_IN) /* asked already: it waits once (RFC 6121 A.3.1) */
            return;
        if (write_item(a, host, user, &mine, m | RT_ROSTER_PENDING_IN) == 0)
            rt__c2s_to_available(me, strlen(me), q.stanza, q.slen);
        return;
    case C2S_SUB_SUBSCRIBED:
        if (mine.found && (m & RT_ROSTER_ASK_OUT) &&
            write_item(a, host, user, &mine, (m | RT_ROSTER_TO) & ~RT_ROSTER_ASK_OUT) == 0)
            rt__c2s_to_available(me, strlen(me), q.stanza, q.slen);
        return;
    case C2S_SUB_UNSUBSCRIBE:
        if (mine.found && (m & (RT_ROSTER_FROM | RT_ROSTER_PENDING_IN)) &&
            write_item(a, host, user, &mine, m & ~(RT_ROSTER_FROM | RT_ROSTER_PENDING_IN)) == 0) {
            rt__c2s_to_available(me, strlen(me), q.stanza, q.slen);
            if (m & RT_ROSTER_FROM)
                presence_to(me, false, q.contact);
        }
        return;
    case C2S_SUB_UNSUBSCRIBED:
        if (mine.found && (m & (RT_ROSTER_TO | RT_ROSTER_ASK_OUT)) &&
            write_item(a, host, user, &mine, m & ~(RT_ROSTER_TO | RT_ROSTER_ASK_OUT)) == 0)
            rt__c2s_to_available(me, strlen(me), q.stanza, q.slen);
        return;
    case C2S_SUB_PROBE: /* 4.3.2: answered by each available resource, for a subscriber */
        if (mine.found && (m & RT_ROSTER_FROM))
            presence_to(me, true, q.contact);
        return;
    }
}

void rt__c2s_store_sub(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                       size_t len)
{
    sub_req_t q;
    if (!sub_parse(data, len, &q))
        return;
    char cuser[RT_JID_PART_MAX + 1], chost[RT_JID_PART_MAX + 1];
    if (!split(q.contact, cuser, sizeof(cuser), chost, sizeof(chost)))
        return;
    char me[RT_JID_TEXT_MAX + 1];
    snprintf(me, sizeof(me), "%s@%s", user, host);
    if (rt__c2s_domain_remote(chost, strlen(chost))) {
        sub_to_remote(a, host, user, me, q.kind, q.contact, q.stanza, q.slen);
        return;
    }
    item_t mine, theirs;
    if (read_item(a, host, user, q.contact, &mine) || read_item(a, chost, cuser, me, &theirs))
        return;
    unsigned m = mine.state, t = theirs.state;
    switch (q.kind) {
    case C2S_SUB_SUBSCRIBE:
        if (!(m & RT_ROSTER_TO))
            write_item(a, host, user, &mine, m | RT_ROSTER_ASK_OUT);
        if (t & RT_ROSTER_FROM || t & RT_ROSTER_PREAPPROVED) { /* approved already (3.1.3) */
            if (write_item(a, chost, cuser, &theirs,
                           (t | RT_ROSTER_FROM) & ~(RT_ROSTER_PREAPPROVED | RT_ROSTER_PENDING_IN)))
                return;
            write_item(a, host, user, &mine, (mine.state | RT_ROSTER_TO) & ~RT_ROSTER_ASK_OUT);
            char reply[2 * RT_JID_TEXT_MAX + 128];
            int n = snprintf(reply, sizeof(reply),
                             "<presence xmlns='%s' from='%s' to='%s' type='subscribed'/>",
                             RT_XML_NS_CLIENT, q.contact, me);
            rt__c2s_to_available(me, strlen(me), reply, (size_t)n);
            presence_to(q.contact, true, me);
            return;
        }
        if (t & RT_ROSTER_PENDING_IN) /* asked already: it waits once (RFC 6121 A.3.1) */
            return;
        if (write_item(a, chost, cuser, &theirs, t | RT_ROSTER_PENDING_IN) == 0)
            rt__c2s_to_available(q.contact, q.clen, q.stanza, q.slen);
        return;
    case C2S_SUB_SUBSCRIBED:
        if (!approves_request(a, host, user, &mine))
            return;
        if (write_item(a, host, user, &mine, (m | RT_ROSTER_FROM) & ~RT_ROSTER_PENDING_IN))
            return;
        if (theirs.found && (t & RT_ROSTER_ASK_OUT)) {
            write_item(a, chost, cuser, &theirs, (t | RT_ROSTER_TO) & ~RT_ROSTER_ASK_OUT);
            rt__c2s_to_available(q.contact, q.clen, q.stanza, q.slen);
            presence_to(me, true, q.contact);
        }
        return;
    case C2S_SUB_UNSUBSCRIBE:
        if (m & (RT_ROSTER_TO | RT_ROSTER_ASK_OUT))
            write_item(a, host, user, &mine, m & ~(RT_ROSTER_TO | RT_ROSTER_ASK_OUT));
        if (theirs.found && (t & (RT_ROSTER_FROM | RT_ROSTER_PENDING_IN))) {
            write_item(a, chost, cuser, &theirs, t & ~(RT_ROSTER_FROM | RT_ROSTER_PENDING_IN));
            rt__c2s_to_available(q.contact, q.clen, q.stanza, q.slen);
            if (t & RT_ROSTER_FROM)
                presence_to(q.contact, false, me);
        }
        return;
    case C2S_SUB_UNSUBSCRIBED:
        if (m & (RT_ROSTER_FROM | RT_ROSTER_PENDING_IN | RT_ROSTER_PREAPPROVED))
            write_item(a, host, user, &mine,
                       m & ~(RT_ROSTER_FROM | RT_ROSTER_PENDING_IN | RT_ROSTER_PREAPPROVED));
        if (theirs.found && (t & (RT_ROSTER_TO | RT_ROSTER_ASK_OUT))) {
            write_item(a, chost, cuser, &theirs, t & ~(RT_ROSTER_TO | RT_ROSTER_ASK_OUT));
            rt__c2s_to_available(q.contact, q.clen, q.stanza, q.slen);
            if (t & RT_ROSTER_TO)
                presence_to(me, false, q.contact);
        }
        return;
    }
}

/* ---- Roster get, set, and a session's first presence ---- */

typedef struct get_s {
    rt_buf_t result;  /* the items, for the iq result */
    rt_buf_t entries; /* packed, for the session */
    rt_buf_t pending; /* requests waiting for the user (PENDING_IN), as subscribe stanzas */
    const char *me;
} get_t;

static int collect(const rt_roster_item_t *it, void *arg)
{
    get_t *g = arg;
    if (visible(it->state))
        put_item(&g->result, it->jid, it->name, NULL, it->groups, it->ngroups, it->state, false);
    put_entry(&g->entries, it->state, it->jid);
    if (it->state & RT_ROSTER_PENDING_IN)
        rt_buf_printf(&g->pending, "<presence xmlns='%s' from='%s' to='%s' type='subscribe'/>",
                      RT_XML_NS_CLIENT, it->jid, g->me);
    return 0;
}

static int roster_read(rt_accounts_t *a, const char *host, const char *user, get_t *g,
                       uint64_t *version)
{
    return rt_roster_get(a, host, user, collect, g, version);
}

/* Nothing for an initial presence to fetch: no subscription request waits, nothing kept. */
static bool presence_ready(rt_accounts_t *a, const char *host, const char *user, const get_t *g)
{
    uint32_t kept;
    uint64_t bytes;
    return !g->pending.len && !g->pending.oom &&
           rt_offline_count(a, host, user, &kept, &bytes) == 0 && !kept;
}

void rt__c2s_store_roster_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len, bool first)
{
    const char *id = (const char *)data;
    size_t idlen = strnlen(id, len);
    const char *ver = idlen < len ? id + idlen + 1 : "";
    size_t verlen = idlen < len ? len - idlen - 1 : 0;
    char me[RT_JID_TEXT_MAX + 1];
    snprintf(me, sizeof(me), "%s@%s", user, host);
    get_t g = {.me = me};
    uint64_t version = 0;
    int rc = roster_read(a, host, user, &g, &version);
    rt_buf_t out = {0};
    rt_xml_put_start(&out, "iq");
    rt_xml_put_attr(&out, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr_len(&out, "id", id, idlen);
    if (rc) {
        rt_xml_put_attr(&out, "type", "error");
        rt_buf_printf(&out, "><error type='wait'><internal-server-error xmlns='%s'/></error></iq>",
                      RT_XML_NS_STANZA_ERRORS);
    } else {
        rt_xml_put_attr(&out, "type", "result");
        char vtext[24];
        int vn = snprintf(vtext, sizeof(vtext), "%llu", (unsigned long long)version);
        if (verlen == (size_t)vn && memcmp(ver, vtext, verlen) == 0) {
            rt_xml_put_empty_end(&out); /* RFC 6121 2.6.3: the client's copy is current */
        } else {
            rt_buf_printf(&out, "><query xmlns='%s' ver='%s'>", NS_ROSTER, vtext);
            rt_buf_add(&out, g.result.data, g.result.len);
            rt_buf_printf(&out, "</query></iq>");
        }
    }
    if (!rc && !g.entries.oom) {
        rt_send(to, C2S_MSG_ROSTER, g.entries.data, g.entries.len);
        if (first && presence_ready(a, host, user, &g))
            rt_send(to, C2S_MSG_PRESENCE_READY, NULL, 0);
    }
    if (!out.oom)
        rt_send(to, C2S_MSG_STANZA, out.data, out.len);
    rt_buf_free(&out);
    rt_buf_free(&g.result);
    rt_buf_free(&g.entries);
    rt_buf_free(&g.pending);
}

void rt__c2s_store_presence_init(rt_accounts_t *a, rt_pid_t to, const char *host,
                                 const char *user)
{
    char me[RT_JID_TEXT_MAX + 1];
    snprintf(me, sizeof(me), "%s@%s", user, host);
    get_t g = {.me = me};
    if (roster_read(a, host, user, &g, NULL) == 0) {
        rt_send(to, C2S_MSG_ROSTER, g.entries.data, g.entries.len);
        if (g.pending.len && !g.pending.oom) /* requests made while the user was away */
            rt_send(to, C2S_MSG_STANZA, g.pending.data, g.pending.len);
    } else {
        rt_send(to, C2S_MSG_ROSTER, NULL, 0); /* the broadcast goes on, to no contact */
    }
    rt_buf_free(&g.result);
    rt_buf_free(&g.entries);
    rt_buf_free(&g.pending);
}

void rt__c2s_store_roster_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len)
{
    /* id NUL jid NUL name NUL remove-byte ngroups-byte (group NUL)* */
    const char *f[3];
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        f[i] = (const char *)data + at;
        size_t n = strnlen(f[i], len - at);
        if (at + n >= len)
            return;
        at += n + 1;
    }
    if (at + 2 > len)
        return;
    bool remove = data[at], ok = true;
    unsigned ngroups = data[at + 1];
    at += 2;
    item_t it;
    if (read_item(a, host, user, f[1], &it))
        ok = false;
    int rc = 0;
    uint64_t version = 0;
    if (ok && remove) {
        rc = rt_roster_del(a, host, user, f[1], &version);
        if (rc == 0 && visible(it.state))
            push(host, user, &it, true, version);
        ok = rc == 0 || rc == RT_ENOTFOUND;
        /* RFC 6121 2.5.2: removing an item ends both subscriptions */
        char me[RT_JID_TEXT_MAX + 1], cuser[RT_JID_PART_MAX + 1], chost[RT_JID_PART_MAX + 1];
        snprintf(me, sizeof(me), "%s@%s", user, host);
        item_t theirs;
        if (rc == 0 && split(f[1], cuser, sizeof(cuser), chost, sizeof(chost)) &&
            rt__c2s_host_index(chost, strlen(chost)) >= 0 &&
            read_item(a, chost, cuser, me, &theirs) == 0 && theirs.found) {
            unsigned t = theirs.state;
            write_item(a, chost, cuser, &theirs,
                       t & ~(RT_ROSTER_TO | RT_ROSTER_ASK_OUT | RT_ROSTER_FROM | RT_ROSTER_PENDING_IN));
            char p[2 * RT_JID_TEXT_MAX + 128];
            if (t & (RT_ROSTER_FROM | RT_ROSTER_PENDING_IN)) {
                int n = snprintf(p, sizeof(p), "<presence xmlns='%s' from='%s' type='unsubscribe'/>",
                                 RT_XML_NS_CLIENT, me);
                rt__c2s_to_available(f[1], strlen(f[1]), p, (size_t)n);
            }
            if (t & (RT_ROSTER_TO | RT_ROSTER_ASK_OUT)) {
                int n = snprintf(p, sizeof(p),
                                 "<presence xmlns='%s' from='%s' type='unsubscribed'/>",
                                 RT_XML_NS_CLIENT, me);
                rt__c2s_to_available(f[1], strlen(f[1]), p, (size_t)n);
            }
            if (t & RT_ROSTER_FROM)
                presence_to(f[1], false, me);
            if (t & RT_ROSTER_TO)
                presence_to(me, false, f[1]);
        }
    } else if (ok) {
        snprintf(it.name, sizeof(it.name), "%s", f[2]);
        it.ngroups = 0;
        for (unsigned i = 0; i < ngroups && i < RT_ROSTER_GROUPS_MAX && at < len; i++) {
            const char *g = (const char *)data + at;
            size_t n = strnlen(g, len - at);
            snprintf(it.groups[it.ngroups++], sizeof(it.groups[0]), "%.*s", (int)n, g);
            at += n + 1;
        }
        unsigned state = it.found ? it.state : 0;
        it.found = false; /* a set always writes: name and groups may have changed */
        rc = write_item(a, host, user, &it, state);
        ok = rc == 0;
    }
    rt_buf_t out = {0};
    rt_xml_put_start(&out, "iq");
    rt_xml_put_attr(&out, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&out, "type", ok ? "result" : "error");
    rt_xml_put_attr(&out, "id", f[0]);
    if (ok)
        rt_xml_put_empty_end(&out);
    else
        rt_buf_printf(&out, "><error type='%s'><%s xmlns='%s'/></error></iq>",
                      rc == RT_ELIMIT ? "cancel" : "modify",
                      rc == RT_ELIMIT ? "not-allowed" : rc == RT_EINVAL ? "bad-request"
                                                                         : "internal-server-error",
                      RT_XML_NS_STANZA_ERRORS);
    if (!out.oom)
        rt_send(to, C2S_MSG_STANZA, out.data, out.len);
    rt_buf_free(&out);
}

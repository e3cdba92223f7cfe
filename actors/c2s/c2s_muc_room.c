/*
** A group chat room (XEP-0045), one actor: its occupants, affiliations, subject and history
** live on the room's heap, so `rtctl top` shows what each room holds. Sessions send it the
** stanzas their clients address to the room (c2s_muc.c routes them, the sender's full JID
** stamped as from); it answers and fans out to the occupants' session actors by message, as
** sessions route to each other. It monitors every occupant's session: one that ends without
** a word (killed, its connection lost past resumption) leaves the room as if it had sent
** unavailable. A room that is not persistent ends with its last occupant; a persistent one
** keeps its configuration, subject and affiliations in xmpp.db (save, through the store's
** actor) and is made again at start. It never waits on one occupant's session: one whose
** client stopped reading is dropped from the room (drop_lagging). A room is its node's own:
** rooms do not span a cluster yet (docs/XMPP.md).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"

enum { AFF_NONE, AFF_OUTCAST, AFF_MEMBER, AFF_ADMIN, AFF_OWNER };
enum { ROLE_NONE, ROLE_VISITOR, ROLE_PARTICIPANT, ROLE_MODERATOR };
static const char *const aff_names[] = {"none", "outcast", "member", "admin", "owner"};
static const char *const role_names[] = {"none", "visitor", "participant", "moderator"};

/* Status codes (XEP-0045 15.6). */
#define ST_NONANONYMOUS 100
#define ST_SELF 110
#define ST_CREATED 201
#define ST_BANNED 301
#define ST_NICK_CHANGED 303
#define ST_KICKED 307
#define ST_MEMBERS_ONLY 321
#define ST_ERROR_REMOVED 333

#define NS_DELAY "urn:xmpp:delay"
#define NS_PING "urn:xmpp:ping"
#define NS_XDATA "jabber:x:data"
#define NS_DISCO_INFO "http://jabber.org/protocol/disco#info"
#define NS_DISCO_ITEMS "http://jabber.org/protocol/disco#items"
#define FORM_ROOMCONFIG NS_MUC "#roomconfig"
#define NS_MAM "urn:xmpp:mam:2"
#define FORM_REQUEST NS_MUC "#request"
#define FORM_REGISTER NS_MUC "#register"
#define NS_SID "urn:xmpp:sid:0"

typedef struct occ_s {
    char *nick;    /* heap */
    char *jid;     /* the session's full JID, heap */
    uint8_t *pres; /* its presence's children but <x/> of MUC, as written; heap, or NULL */
    uint32_t pres_len;
    uint8_t role, aff;
    rt_pid_t pid; /* its session; 0 for another server's user, reached through federation */
    rt_ref_t mon;
    bool lagging;  /* its session refused a copy: it leaves (333) */
    double tokens; /* muc_message_rate's bucket */
    uint64_t tokens_ms;
} occ_t;

typedef struct aff_s {
    char *bare; /* heap */
    char *nick; /* the nick it registered with the room (7.10), heap, or NULL */
    uint8_t aff;
} aff_t;

typedef struct hist_s {
    char *nick;    /* heap */
    uint8_t *body; /* the message's attributes after to, '>' and its children; heap */
    uint32_t len;
    int64_t stamp_ms;
} hist_t;

typedef struct room_s {
    c2s_muc_parse_t parse; /* first: the parser's ctx */
    char *jid;             /* room@service, heap */
    size_t jid_len;
    occ_t *occ;
    size_t nocc, occ_cap;
    aff_t *affs;
    size_t naff, aff_cap;
    hist_t *hist; /* oldest first */
    size_t nhist;
    size_t hist_bytes;            /* the kept messages' bytes (muc_history_bytes) */
    char *subject, *subject_nick; /* heap, or NULL */
    char *name;                   /* muc#roomconfig_roomname, heap, or NULL */
    char *secret; /* muc#roomconfig_roomsecret of a password-protected room, heap, or NULL */
    char *maker;  /* the bare JID counted as its maker (muc_max_rooms_per_user), heap, or NULL */
    uint32_t max_users;
    bool persistent, members_only, moderated, listed, whois_anyone, change_subject;
    bool created; /* the first join is making the room */
    bool saved;   /* xmpp.db has the room's state */
    bool locked;  /* made by a join, not configured yet: only its owner is let in (7.2.10) */
    bool lagging; /* an occupant is marked lagging */
    bool hibernate_armed;    /* a C2S_MSG_HIBERNATE timer is on its way */
    uint64_t last_active_ms; /* the last stanza handled (the hibernation's clock) */
    rt_pid_t from;           /* the sender of the stanza being read */
    rt_buf_t out;            /* a stanza being written */
    rt_actor_t *self;
} room_t;

/* ---- Lookups ---- */

static occ_t *by_jid(room_t *r, const char *jid)
{
    for (size_t i = 0; i < r->nocc; i++)
        if (strcmp(r->occ[i].jid, jid) == 0)
            return &r->occ[i];
    return NULL;
}

static occ_t *by_nick(room_t *r, const char *nick)
{
    for (size_t i = 0; i < r->nocc; i++)
        if (strcmp(r->occ[i].nick, nick) == 0)
            return &r->occ[i];
    return NULL;
}

static size_t bare_len(const char *jid)
{
    const char *slash = strchr(jid, '/');
    return slash ? (size_t)(slash - jid) : strlen(jid);
}

static aff_t *aff_entry(room_t *r, const char *bare, size_t len)
{
    for (size_t i = 0; i < r->naff; i++)
        if (strlen(r->affs[i].bare) == len && memcmp(r->affs[i].bare, bare, len) == 0)
            return &r->affs[i];
    return NULL;
}

static uint8_t aff_of(room_t *r, const char *jid)
{
    aff_t *a = aff_entry(r, jid, bare_len(jid));
    return a ? a->aff : AFF_NONE;
}

static int set_aff(room_t *r, const char *bare, size_t len, uint8_t aff)
{
    aff_t *a = aff_entry(r, bare, len);
    if (a && aff == AFF_NONE) {
        rt_free(r->self, a->bare);
        rt_free(r->self, a->nick);
        *a = r->affs[--r->naff];
        return 0;
    }
    if (a) {
        a->aff = aff;
        if (aff == AFF_OUTCAST) { /* a ban ends its registration */
            rt_free(r->self, a->nick);
            a->nick = NULL;
        }
        return 0;
    }
    if (aff == AFF_NONE)
        return 0;
    if (rt_grow_on(r->self, &r->affs, &r->aff_cap, r->naff + 1, sizeof(aff_t), 4, RT_OBJ_SCAN))
        return RT_ENOMEM;
    char *copy = rt_strndup(r->self, bare, len);
    if (!copy)
        return RT_ENOMEM;
    r->affs[r->naff++] = (aff_t){.bare = copy, .aff = aff};
    return 0;
}

/* The affiliation entry whose registered nick is nick, or NULL. */
static aff_t *nick_owner(room_t *r, const char *nick)
{
    for (size_t i = 0; i < r->naff; i++)
        if (r->affs[i].nick && strcmp(r->affs[i].nick, nick) == 0)
            return &r->affs[i];
    return NULL;
}

static uint8_t role_for(const room_t *r, uint8_t aff)
{
    if (aff >= AFF_ADMIN)
        return ROLE_MODERATOR;
    return r->moderated && aff < AFF_MEMBER ? ROLE_VISITOR : ROLE_PARTICIPANT;
}

static int parse_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; s && i < n; i++)
        if (strcmp(names[i], s) == 0)
            return (int)i;
    return -1;
}

/* ---- Writing ---- */

/* A session that sheds (its client stopped reading, c2s.c) takes nothing more from the room:
   it is marked, and leaves the room once the stanza in hand is done (drop_lagging). */
static void lagging(room_t *r, rt_pid_t pid)
{
    for (size_t i = 0; i < r->nocc; i++)
        if (r->occ[i].pid == pid)
            r->occ[i].lagging = r->lagging = true;
}

/* What r->out holds, to a session. Never waits for it: a room is not held up by one reader. */
static void send_out(room_t *r, rt_pid_t to)
{
    rt_msg_t *m = r->out.oom ? NULL : rt_msg_new(C2S_MSG_STANZA, r->out.len);
    if (m) {
        memcpy(m->data, r->out.data, r->out.len);
        int rc = rt_send_optional(to, m);
        if (rc == 0)
            atomic_fetch_add_explicit(&rt_c2s_stats.stanzas_routed, 1, memory_order_relaxed);
        else if (rc == RT_ELIMIT)
            lagging(r, to);
    }
    rt_buf_truncate(&r->out, 0);
    r->out.oom = false;
}

/* The domainpart of a full or bare JID's text, and its length. */
static const char *jid_domain(const char *jid, size_t *len)
{
    const char *at = strchr(jid, '@');
    const char *d = at ? at + 1 : jid, *slash = strchr(d, '/');
    *len = slash ? (size_t)(slash - d) : strlen(d);
    return d;
}

/*
** What r->out holds, to an occupant. Another server's user is reached through federation from
** the room's domain: its seat does not hang on the stream its server happened to send the
** join on (servers close idle streams); it leaves by its unavailable, or when a stanza to it
** comes back as an error that says it is gone (gone_error).
*/
static void send_to(room_t *r, const occ_t *o)
{
    if (o->pid) {
        send_out(r, o->pid);
        return;
    }
    size_t len, to_len;
    const char *domain = jid_domain(r->jid, &len), *to = jid_domain(o->jid, &to_len);
    if (!r->out.oom && rt__c2s_s2s_send(domain, len, to, to_len, r->out.data, r->out.len))
        atomic_fetch_add_explicit(&rt_c2s_stats.stanzas_routed, 1, memory_order_relaxed);
    rt_buf_truncate(&r->out, 0);
    r->out.oom = false;
}

static void put_occupant_from(room_t *r, const char *nick)
{
    rt_buf_t *b = &r->out;
    rt_buf_printf(b, " from='");
    rt_xml_put_text(b, r->jid, r->jid_len);
    rt_buf_printf(b, "/");
    rt_xml_put_text(b, nick, strlen(nick));
    rt_buf_printf(b, "'");
}

/* An error answering el, to its sender. */
static void reply_error(room_t *r, const rt_xml_el_t *el, const char *type, const char *cond)
{
    const char *t = rt_xml_attr(el, "type");
    if (t && strcmp(t, "error") == 0)
        return;
    rt__c2s_put_error(&r->out, el, rt_xml_attr(el, "to"), rt_xml_attr(el, "from"), type, cond);
    rt_buf_printf(&r->out, "</error>");
    rt_xml_put_end(&r->out, el->name);
    send_out(r, r->from);
}

/* <iq type='result' id from to (the room, or what el was sent to) — not closed. */
static void put_result_start(room_t *r, const rt_xml_el_t *iq)
{
    rt_buf_printf(&r->out, "<iq xmlns='%s' type='result'", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&r->out, "id", rt_xml_attr(iq, "id"));
    rt_xml_put_attr(&r->out, "from", rt_xml_attr(iq, "to"));
    rt_xml_put_attr(&r->out, "to", rt_xml_attr(iq, "from"));
}

static void reply_empty_result(room_t *r, const rt_xml_el_t *iq)
{
    put_result_start(r, iq);
    rt_xml_put_empty_end(&r->out);
    send_out(r, r->from);
}

/*
** o's presence as `to` gets it: its own children, then the MUC user element with its item
** (o's full JID only where the room shows it: to a moderator, or whois anyone) and codes.
*/
static void put_presence(room_t *r, const occ_t *o, const occ_t *to, bool unavailable,
                         const int *codes, size_t ncodes, const char *new_nick, const char *reason)
{
    rt_buf_t *b = &r->out;
    rt_buf_printf(b, "<presence xmlns='%s'", RT_XML_NS_CLIENT);
    put_occupant_from(r, o->nick);
    rt_xml_put_attr(b, "to", to->jid);
    if (unavailable)
        rt_xml_put_attr(b, "type", "unavailable");
    rt_xml_put_start_end(b);
    if (!unavailable && o->pres)
        rt_buf_add(b, o->pres, o->pres_len);
    rt_buf_printf(b, "<x xmlns='%s'><item", NS_MUC_USER);
    rt_xml_put_attr(b, "affiliation", aff_names[o->aff]);
    rt_xml_put_attr(b, "role", unavailable ? "none" : role_names[o->role]);
    if (r->whois_anyone || to->role == ROLE_MODERATOR)
        rt_xml_put_attr(b, "jid", o->jid);
    if (new_nick)
        rt_xml_put_attr(b, "nick", new_nick);
    if (reason) {
        rt_buf_printf(b, "><reason>");
        rt_xml_put_text(b, reason, strlen(reason));
        rt_buf_printf(b, "</reason></item>");
    } else {
        rt_buf_printf(b, "/>");
    }
    bool self = to == o;
    if (self)
        rt_buf_printf(b, "<status code='%d'/>", ST_SELF);
    if (self && r->whois_anyone)
        rt_buf_printf(b, "<status code='%d'/>", ST_NONANONYMOUS);
    for (size_t i = 0; i < ncodes; i++)
        if (codes[i] != ST_CREATED || self)
            rt_buf_printf(b, "<status code='%d'/>", codes[i]);
    rt_buf_printf(b, "</x></presence>");
}

/* o's presence to every occupant (o itself too, with 110). */
static void broadcast_presence(room_t *r, const occ_t *o, bool unavailable, const int *codes,
                               size_t ncodes, const char *new_nick, const char *reason)
{
    for (size_t i = 0; i < r->nocc; i++) {
        put_presence(r, o, &r->occ[i], unavailable, codes, ncodes, new_nick, reason);
        send_to(r, &r->occ[i]);
    }
}

static void info_to_service(room_t *r, bool alive)
{
    rt_pid_t service = rt_whereis(RT_C2S_MUC_NAME);
    if (!service)
        return;
    size_t name_len = r->name ? strlen(r->name) : 0;
    rt_msg_t *m = rt_msg_new(C2S_MSG_MUC_INFO, sizeof(c2s_muc_info_t) + r->jid_len + name_len);
    if (!m)
        return;
    c2s_muc_info_t info = {.occupants = (uint32_t)r->nocc,
                           .jid_len = (uint16_t)r->jid_len,
                           .name_len = (uint16_t)name_len,
                           .listed = alive && r->listed};
    memcpy(m->data, &info, sizeof(info));
    memcpy(m->data + sizeof(info), r->jid, r->jid_len);
    if (name_len)
        memcpy(m->data + sizeof(info) + r->jid_len, r->name, name_len);
    rt_send_msg(service, m);
}

/* ---- A persistent room's state in xmpp.db ---- */

#define STATE_VERSION 1
#define AFF_NICK_FOLLOWS 0x80 /* on an affiliation's byte: its registered nick follows */
enum {
    F_PERSISTENT = 1,
    F_MEMBERS_ONLY = 2,
    F_MODERATED = 4,
    F_LISTED = 8,
    F_WHOIS_ANYONE = 16,
    F_CHANGE_SUBJECT = 32,
    F_PASSWORD = 64, /* the room's secret follows the subject's nick */
};

static void put_str(rt_buf_t *b, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    uint16_t len = n > UINT16_MAX ? UINT16_MAX : (uint16_t)n;
    rt_buf_add(b, &len, sizeof(len));
    rt_buf_add(b, s ? s : "", len);
}

/* A string of a saved state into the room's heap (*out NULL when empty): false when cut. */
static bool get_str(room_t *r, const uint8_t **p, const uint8_t *end, char **out)
{
    uint16_t len;
    if ((size_t)(end - *p) < sizeof(len))
        return false;
    memcpy(&len, *p, sizeof(len));
    *p += sizeof(len);
    if ((size_t)(end - *p) < len)
        return false;
    *out = len ? rt_strndup(r->self, *p, len) : NULL;
    *p += len;
    return !len || *out;
}

/*
** Saves a persistent room's configuration, subject and affiliations (what XEP-0045 10.2 says
** outlives the occupants); forgets one that stopped being persistent. The store's actor writes
** it; the room goes on without waiting.
*/
static void save(room_t *r)
{
    if (!r->persistent && !r->saved)
        return;
    rt_buf_t b = {0};
    if (r->persistent) {
        uint8_t head[2] = {
            STATE_VERSION,
            (uint8_t)((r->persistent ? F_PERSISTENT : 0) | (r->members_only ? F_MEMBERS_ONLY : 0) |
                      (r->moderated ? F_MODERATED : 0) | (r->listed ? F_LISTED : 0) |
                      (r->whois_anyone ? F_WHOIS_ANYONE : 0) |
                      (r->change_subject ? F_CHANGE_SUBJECT : 0) | (r->secret ? F_PASSWORD : 0))};
        rt_buf_add(&b, head, sizeof(head));
        rt_buf_add(&b, &r->max_users, sizeof(r->max_users));
        put_str(&b, r->name);
        put_str(&b, r->subject);
        put_str(&b, r->subject_nick);
        if (r->secret)
            put_str(&b, r->secret);
        for (size_t i = 0; i < r->naff; i++) { /* a registered nick follows its bare JID */
            uint8_t head = (uint8_t)(r->affs[i].aff | (r->affs[i].nick ? AFF_NICK_FOLLOWS : 0));
            rt_buf_add(&b, &head, 1);
            put_str(&b, r->affs[i].bare);
            if (r->affs[i].nick)
                put_str(&b, r->affs[i].nick);
        }
    }
    const char *at = strchr(r->jid, '@');
    if (!b.oom && at &&
        rt__c2s_store_ask(C2S_OP_MUC_PUT, 0, at + 1, strlen(at + 1), r->jid, (size_t)(at - r->jid),
                          0, b.data, b.len) == 0)
        r->saved = r->persistent;
    rt_buf_free(&b);
}

static int restore(room_t *r, const uint8_t *p, size_t len)
{
    const uint8_t *end = p + len;
    if (len < 2 + sizeof(r->max_users) || p[0] != STATE_VERSION)
        return RT_EINVAL;
    uint8_t f = p[1];
    r->persistent = f & F_PERSISTENT, r->members_only = f & F_MEMBERS_ONLY;
    r->moderated = f & F_MODERATED, r->listed = f & F_LISTED;
    r->whois_anyone = f & F_WHOIS_ANYONE, r->change_subject = f & F_CHANGE_SUBJECT;
    memcpy(&r->max_users, p + 2, sizeof(r->max_users));
    p += 2 + sizeof(r->max_users);
    if (!get_str(r, &p, end, &r->name) || !get_str(r, &p, end, &r->subject) ||
        !get_str(r, &p, end, &r->subject_nick) ||
        ((f & F_PASSWORD) && (!get_str(r, &p, end, &r->secret) || !r->secret)))
        return RT_EINVAL;
    while (p < end) {
        uint8_t head = *p++, aff = head & (uint8_t)~AFF_NICK_FOLLOWS;
        char *bare, *nick = NULL;
        if (aff == AFF_NONE || aff > AFF_OWNER || !get_str(r, &p, end, &bare) || !bare ||
            ((head & AFF_NICK_FOLLOWS) && (!get_str(r, &p, end, &nick) || !nick)) ||
            set_aff(r, bare, strlen(bare), aff))
            return RT_EINVAL;
        aff_entry(r, bare, strlen(bare))->nick = nick;
        rt_free(r->self, bare);
    }
    r->saved = true;
    return 0;
}

/* ---- Occupants coming and going ---- */

static void forget(room_t *r, occ_t *o)
{
    if (o->mon)
        rt_demonitor(r->self, o->mon);
    rt_free(r->self, o->nick);
    rt_free(r->self, o->jid);
    rt_free(r->self, o->pres);
    *o = r->occ[--r->nocc];
}

/* Ends the room when it is left empty and nothing keeps it (not persistent). */
static void end_if_empty(room_t *r)
{
    if (r->nocc || r->persistent)
        return;
    rt_exit(r->self, RT_REASON_NORMAL);
}

/*
** Occupants whose sessions stopped taking the room's stanzas leave with XEP-0045's 333 (removed
** for a technical reason): the others are told, and the occupant's own session gets its
** unavailable past its shedding (one message), so its client learns it is out once it reads
** again, and may join again and catch up from the history.
*/
static void drop_lagging(room_t *r)
{
    while (r->lagging) {
        r->lagging = false;
        for (size_t i = 0; i < r->nocc;) {
            occ_t *o = &r->occ[i];
            if (!o->lagging) {
                i++;
                continue;
            }
            int code = ST_ERROR_REMOVED;
            for (size_t k = 0; k < r->nocc; k++)
                if (k != i) {
                    put_presence(r, o, &r->occ[k], true, &code, 1, NULL, NULL);
                    send_to(r, &r->occ[k]);
                }
            put_presence(r, o, o, true, &code, 1, NULL, NULL);
            rt_msg_t *m = r->out.oom ? NULL : rt_msg_new(C2S_MSG_STANZA, r->out.len);
            if (m) {
                memcpy(m->data, r->out.data, r->out.len);
                rt_send_unmuted(o->pid, m);
            }
            rt_buf_truncate(&r->out, 0);
            r->out.oom = false;
            rt_log(RT_LOG_INFO, "xmpp.muc_occupant_dropped", "room=%s nick=%s jid=%s reason=slow",
                   r->jid, o->nick, o->jid);
            atomic_fetch_add_explicit(&rt_c2s_stats.muc_lagging, 1, memory_order_relaxed);
            forget(r, o);
        }
    }
    end_if_empty(r);
}

/* o leaves: its unavailable (with codes) to everyone, o included, then it is forgotten. */
static void remove_occupant(room_t *r, occ_t *o, const int *codes, size_t ncodes,
                            const char *reason)
{
    broadcast_presence(r, o, true, codes, ncodes, NULL, reason);
    forget(r, o);
    end_if_empty(r);
}

/*
** The children of a presence a room passes on: all but MUC's own <x/> (the join's). A room keeps
** each occupant's until it changes, so what one may be is bounded (a status and caps take a few
** hundred bytes): past C2S_MUC_PRESENCE_MAX, RT_ELIMIT, and the presence is refused.
*/
#define C2S_MUC_PRESENCE_MAX 4096
static int keep_presence(room_t *r, occ_t *o, const rt_xml_el_t *el)
{
    rt_buf_t b = {0};
    for (const rt_xml_node_t *n = el->children; n; n = n->next) {
        const rt_xml_el_t *c = rt_xml_as_el(n);
        if (c && strcmp(c->ns, NS_MUC) != 0 && strcmp(c->ns, NS_MUC_USER) != 0)
            rt_xml_put_tree(&b, c, RT_XML_NS_CLIENT);
    }
    int rc = 0;
    uint8_t *copy = NULL;
    if (b.oom)
        rc = RT_ENOMEM;
    else if (b.len > C2S_MUC_PRESENCE_MAX)
        rc = RT_ELIMIT;
    else if (b.len && !(copy = rt_alloc(r->self, b.len, RT_OBJ_LEAF)))
        rc = RT_ENOMEM;
    if (!rc) {
        if (copy)
            memcpy(copy, b.data, b.len);
        rt_free(r->self, o->pres);
        o->pres = copy;
        o->pres_len = (uint32_t)b.len;
    }
    rt_buf_free(&b);
    return rc;
}

/* XEP-0045 7.2.14: how much history the joiner asked for (maxstanzas; maxchars 0: none). */
static size_t history_wanted(const room_t *r, const rt_xml_el_t *join)
{
    const rt_xml_el_t *x = rt_xml_child(join, "x", NS_MUC);
    const rt_xml_el_t *h = x ? rt_xml_child(x, "history", NS_MUC) : NULL;
    size_t n = r->nhist;
    const char *v;
    if (h && (v = rt_xml_attr(h, "maxstanzas")) && (size_t)strtoul(v, NULL, 10) < n)
        n = (size_t)strtoul(v, NULL, 10);
    if (h && (v = rt_xml_attr(h, "maxchars")) && strtoul(v, NULL, 10) == 0)
        n = 0;
    return n;
}

static void send_history(room_t *r, const occ_t *to, size_t n)
{
    for (size_t i = r->nhist - n; i < r->nhist; i++) {
        const hist_t *h = &r->hist[i];
        rt_buf_printf(&r->out, "<message xmlns='%s'", RT_XML_NS_CLIENT);
        put_occupant_from(r, h->nick);
        rt_xml_put_attr(&r->out, "to", to->jid);
        rt_buf_add(&r->out, h->body, h->len);
        rt_buf_printf(&r->out, "<delay xmlns='%s'", NS_DELAY);
        rt_xml_put_attr(&r->out, "from", r->jid);
        rt_buf_printf(&r->out, " stamp='");
        rt__c2s_put_stamp(&r->out, h->stamp_ms);
        rt_buf_printf(&r->out, "'/></message>");
        send_to(r, to);
    }
}

static void send_subject(room_t *r, const occ_t *to)
{
    rt_buf_printf(&r->out, "<message xmlns='%s'", RT_XML_NS_CLIENT);
    if (r->subject_nick)
        put_occupant_from(r, r->subject_nick);
    else
        rt_xml_put_attr(&r->out, "from", r->jid);
    rt_xml_put_attr(&r->out, "to", to->jid);
    rt_buf_printf(&r->out, " type='groupchat'><subject>");
    if (r->subject)
        rt_xml_put_text(&r->out, r->subject, strlen(r->subject));
    rt_buf_printf(&r->out, "</subject></message>");
    send_to(r, to);
}

/* Whether a join carries the room's password (7.2.6), compared in time independent of where
   the two differ. */
static bool password_ok(const room_t *r, const rt_xml_el_t *join)
{
    const rt_xml_el_t *x = rt_xml_child(join, "x", NS_MUC);
    const rt_xml_el_t *p = x ? rt_xml_child(x, "password", NS_MUC) : NULL;
    size_t len = 0;
    const char *given = p ? rt_xml_text(p, &len) : NULL;
    size_t want = strlen(r->secret);
    if (!given || len != want)
        return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned char)(given[i] ^ r->secret[i]);
    return diff == 0;
}

static void join(room_t *r, const rt_xml_el_t *el, const char *from, const char *nick)
{
    uint8_t aff = aff_of(r, from);
    if (r->created && r->nocc == 0 && aff == AFF_NONE) {
        if (set_aff(r, from, bare_len(from), AFF_OWNER)) {
            reply_error(r, el, "wait", "resource-constraint");
            return;
        }
        aff = AFF_OWNER;
    }
    occ_t *same = by_nick(r, nick);
    if (r->locked && aff != AFF_OWNER) {
        reply_error(r, el, "cancel", "item-not-found");
    } else if (aff == AFF_OUTCAST) {
        reply_error(r, el, "auth", "forbidden");
    } else if (r->members_only && aff == AFF_NONE) {
        reply_error(r, el, "auth", "registration-required");
    } else if (r->secret && aff != AFF_OWNER && !password_ok(r, el)) {
        reply_error(r, el, "auth", "not-authorized"); /* 7.2.6 */
    } else if (same ||
               (nick_owner(r, nick) && nick_owner(r, nick) != aff_entry(r, from, bare_len(from)))) {
        reply_error(r, el, "cancel",
                    "conflict"); /* 7.2.9, and a nick registered by another (7.10) */
    } else if (r->nocc >= r->max_users && aff < AFF_ADMIN) {
        reply_error(r, el, "wait", "service-unavailable");
    } else if (rt_grow_on(r->self, &r->occ, &r->occ_cap, r->nocc + 1, sizeof(occ_t), 4,
                          RT_OBJ_SCAN)) {
        reply_error(r, el, "wait", "resource-constraint");
    } else {
        size_t dlen;
        const char *domain = jid_domain(from, &dlen);
        bool remote = rt__c2s_domain_remote(domain, dlen);
        occ_t o = {.nick = rt_strndup(r->self, nick, strlen(nick)),
                   .jid = rt_strndup(r->self, from, strlen(from)),
                   .aff = aff,
                   .role = role_for(r, aff),
                   .pid = remote ? 0 : r->from,
                   .tokens = (double)rt__c2s.conf->muc_message_rate,
                   .tokens_ms = rt_mono_ms()};
        int rc = !o.nick || !o.jid ? RT_ENOMEM : keep_presence(r, &o, el);
        if (!rc && !remote)
            rc = rt_monitor(r->self, o.pid, &o.mon);
        if (rc) {
            rt_free(r->self, o.nick);
            rt_free(r->self, o.jid);
            rt_free(r->self, o.pres);
            if (rc == RT_ELIMIT)
                reply_error(r, el, "modify", "not-acceptable");
            else
                reply_error(r, el, "wait", "resource-constraint");
            return;
        }
        r->occ[r->nocc++] = o;
        occ_t *me = &r->occ[r->nocc - 1];
        for (size_t i = 0; i + 1 < r->nocc; i++) {
            put_presence(r, &r->occ[i], me, false, NULL, 0, NULL, NULL);
            send_to(r, me);
        }
        int created = ST_CREATED;
        broadcast_presence(r, me, false, &created, r->created ? 1 : 0, NULL, NULL);
        send_history(r, me, history_wanted(r, el));
        send_subject(r, me);
        if (r->created)
            info_to_service(r, true);
    }
    r->created = false;
    end_if_empty(r);
}

/* An occupant's presence to another nick of the room: it changes its nick (XEP-0045 7.6). */
static void change_nick(room_t *r, occ_t *o, const rt_xml_el_t *el, const char *nick)
{
    aff_t *owner = nick_owner(r, nick);
    if (by_nick(r, nick) || (owner && owner != aff_entry(r, o->jid, bare_len(o->jid)))) {
        reply_error(r, el, "cancel", "conflict");
        return;
    }
    char *copy = rt_strndup(r->self, nick, strlen(nick));
    if (!copy) {
        reply_error(r, el, "wait", "resource-constraint");
        return;
    }
    int changed = ST_NICK_CHANGED;
    broadcast_presence(r, o, true, &changed, 1, nick, NULL);
    rt_free(r->self, o->nick);
    o->nick = copy;
    keep_presence(r, o, el);
    broadcast_presence(r, o, false, NULL, 0, NULL, NULL);
}

static void presence(room_t *r, const rt_xml_el_t *el, const char *from, const char *nick)
{
    const char *type = rt_xml_attr(el, "type");
    occ_t *o = by_jid(r, from);
    if (type && (strcmp(type, "unavailable") == 0 || strcmp(type, "error") == 0)) {
        /* A session replaced by a newer one of the same resource says unavailable for the
           old one: not for the new one's seat. Another server's user has one seat, its JID's. */
        if (o && (!o->pid || o->pid == r->from))
            remove_occupant(r, o, NULL, 0, NULL);
        return;
    }
    if (type)
        return; /* subscriptions are not a room's */
    if (!nick || !*nick) {
        reply_error(r, el, "modify", "jid-malformed");
        return;
    }
    if (!o) {
        join(r, el, from, nick);
    } else if (strcmp(o->nick, nick) != 0) {
        change_nick(r, o, el, nick);
    } else {
        if (o->pid && o->pid != r->from) { /* a newer session of the resource sat down */
            rt_ref_t mon;
            if (rt_monitor(r->self, r->from, &mon) == 0) {
                if (o->mon)
                    rt_demonitor(r->self, o->mon);
                o->mon = mon;
                o->pid = r->from;
            }
        }
        if (keep_presence(r, o, el) == RT_ELIMIT) {
            reply_error(r, el, "modify", "not-acceptable"); /* the one before stays */
            return;
        }
        broadcast_presence(r, o, false, NULL, 0, NULL, NULL);
    }
}

/* ---- Messages ---- */

static bool rate_ok(occ_t *o)
{
    long rate = rt__c2s.conf->muc_message_rate;
    if (rate <= 0)
        return true;
    uint64_t now = rt_mono_ms();
    o->tokens += (double)(now - o->tokens_ms) * (double)rate / 1000.0;
    o->tokens_ms = now;
    if (o->tokens > (double)rate)
        o->tokens = (double)rate;
    if (o->tokens < 1.0)
        return false;
    o->tokens -= 1.0;
    return true;
}

/* The message's attributes but from and to, '>', and its children: what each copy shares. */
static int put_message_body(rt_buf_t *b, const rt_xml_el_t *el)
{
    rt__c2s_put_attrs(b, el);
    rt_xml_put_start_end(b);
    for (const rt_xml_node_t *n = el->children; n; n = n->next) {
        const rt_xml_el_t *c = rt_xml_as_el(n);
        if (c)
            rt_xml_put_tree(b, c, RT_XML_NS_CLIENT);
    }
    return b->oom ? RT_ENOMEM : 0;
}

static void forget_oldest(room_t *r)
{
    r->hist_bytes -= r->hist[0].len;
    rt_free(r->self, r->hist[0].nick);
    rt_free(r->self, r->hist[0].body);
    memmove(r->hist, r->hist + 1, (r->nhist - 1) * sizeof(hist_t));
    r->nhist--;
}

/* A groupchat kept for joiners: the newest muc_history, within muc_history_bytes (one bigger
   than that alone is not kept). */
static void remember(room_t *r, const char *nick, const rt_buf_t *body)
{
    size_t keep = (size_t)rt__c2s.conf->muc_history, most = (size_t)rt__c2s.conf->muc_history_bytes;
    if (keep == 0 || body->len > most)
        return;
    char *n = rt_strndup(r->self, nick, strlen(nick));
    uint8_t *copy = rt_alloc(r->self, body->len, RT_OBJ_LEAF);
    if (!n || !copy ||
        (!r->hist && !(r->hist = rt_alloc(r->self, keep * sizeof(hist_t), RT_OBJ_SCAN)))) {
        rt_free(r->self, n);
        rt_free(r->self, copy);
        return;
    }
    memcpy(copy, body->data, body->len);
    while (r->nhist && (r->nhist == keep || r->hist_bytes + body->len > most))
        forget_oldest(r);
    r->hist[r->nhist++] = (hist_t){
        .nick = n, .body = copy, .len = (uint32_t)body->len, .stamp_ms = (int64_t)rt_wall_ms()};
    r->hist_bytes += body->len;
}

/* The room's copy of a groupchat message to its archive (XEP-0313 for rooms); its archive id
   goes to every occupant's copy as XEP-0359's stanza-id, by the room. */
static void archive(room_t *r, const rt_xml_el_t *el, const char *nick, rt_buf_t *shared)
{
    const char *at = strchr(r->jid, '@');
    if (!at || !rt__c2s.conf->archive)
        return;
    rt_buf_t kept = {0}, with = {0};
    rt_buf_printf(&kept, "<message xmlns='%s'", RT_XML_NS_CLIENT);
    rt_buf_printf(&kept, " from='");
    rt_xml_put_text(&kept, r->jid, r->jid_len);
    rt_buf_printf(&kept, "/");
    rt_xml_put_text(&kept, nick, strlen(nick));
    rt_buf_printf(&kept, "'");
    rt_buf_add(&kept, shared->data, shared->len);
    rt_buf_printf(&kept, "</message>");
    rt_buf_printf(&with, "%s/%s", r->jid, nick);
    char room[RT_JID_PART_MAX + 1];
    snprintf(room, sizeof(room), "%.*s", (int)(at - r->jid), r->jid);
    int64_t id;
    if (!with.oom && rt__c2s_mam_room(el, at + 1, room, with.data, &kept, &id)) {
        rt_buf_printf(shared, "<stanza-id xmlns='%s'", NS_SID);
        rt_xml_put_attr(shared, "by", r->jid);
        rt_buf_printf(shared, " id='%lld'/>", (long long)id);
    }
    rt_buf_free(&kept);
    rt_buf_free(&with);
}

/* A groupchat (shared: its attributes after to, '>' and its children) from room/nick to every
   occupant; shared is freed. */
static void broadcast_message(room_t *r, const char *nick, rt_buf_t *shared)
{
    for (size_t i = 0; i < r->nocc; i++) {
        rt_buf_printf(&r->out, "<message xmlns='%s'", RT_XML_NS_CLIENT);
        put_occupant_from(r, nick);
        rt_xml_put_attr(&r->out, "to", r->occ[i].jid);
        rt_buf_add(&r->out, shared->data, shared->len);
        rt_buf_printf(&r->out, "</message>");
        send_to(r, &r->occ[i]);
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.muc_messages, 1, memory_order_relaxed);
    rt_buf_free(shared);
}

static void groupchat(room_t *r, const rt_xml_el_t *el, occ_t *o)
{
    if (!o) {
        reply_error(r, el, "modify", "not-acceptable"); /* XEP-0045 7.4 */
        return;
    }
    const rt_xml_el_t *subject = rt_xml_child(el, "subject", RT_XML_NS_CLIENT);
    bool body = rt_xml_child(el, "body", RT_XML_NS_CLIENT) != NULL;
    if (o->role == ROLE_VISITOR ||
        (subject && !body && o->role != ROLE_MODERATOR && !r->change_subject)) {
        reply_error(r, el, "auth", "forbidden");
        return;
    }
    if (!rate_ok(o)) {
        atomic_fetch_add_explicit(&rt_c2s_stats.muc_limited, 1, memory_order_relaxed);
        reply_error(r, el, "wait", "resource-constraint");
        return;
    }
    rt_buf_t shared = {0};
    if (put_message_body(&shared, el)) {
        rt_buf_free(&shared);
        reply_error(r, el, "wait", "resource-constraint");
        return;
    }
    if (subject && !body) { /* XEP-0045 8.1: a subject change */
        const char *text = rt_xml_text(subject, NULL);
        char *s = rt_strndup(r->self, text ? text : "", text ? strlen(text) : 0);
        char *n = rt_strndup(r->self, o->nick, strlen(o->nick));
        if (s && n) {
            rt_free(r->self, r->subject);
            rt_free(r->self, r->subject_nick);
            r->subject = s, r->subject_nick = n;
            save(r);
        } else {
            rt_free(r->self, s);
            rt_free(r->self, n);
        }
    } else if (body) {
        archive(r, el, o->nick, &shared);
        remember(r, o->nick, &shared);
    }
    broadcast_message(r, o->nick, &shared);
}

/* A rule's row for the room (the xmpp sink): a groupchat from room/nick, as an occupant's. */
static void post(room_t *r, const rt_msg_t *m)
{
    const char *nick = (const char *)m->data, *nul = memchr(m->data, 0, m->len);
    if (!nul || nul == nick)
        return;
    const char *body = nul + 1;
    size_t len = m->len - (size_t)(body - nick);
    rt_buf_t shared = {0};
    rt_buf_printf(&shared, " type='groupchat'><body>");
    rt_xml_put_text(&shared, body, len);
    rt_buf_printf(&shared, "</body>");
    if (shared.oom) {
        rt_buf_free(&shared);
        return;
    }
    archive(r, NULL, nick, &shared);
    remember(r, nick, &shared);
    broadcast_message(r, nick, &shared);
}

/* XEP-0045 7.8.2: an invitation the room passes on to the invitee, from the room. */
static void invite(room_t *r, const rt_xml_el_t *el, const occ_t *o, const rt_xml_el_t *inv)
{
    const char *to = rt_xml_attr(inv, "to");
    rt_jid_buf_t jb;
    if (!o || (r->members_only && o->aff < AFF_ADMIN && o->role != ROLE_MODERATOR)) {
        reply_error(r, el, o ? "auth" : "modify", o ? "forbidden" : "not-acceptable");
        return;
    }
    if (!to || rt_jid_prep(to, strlen(to), &jb, NULL) != 0 || !jb.jid.local) {
        reply_error(r, el, "modify", "jid-malformed");
        return;
    }
    if (r->members_only && aff_of(r, jb.jid.s) == AFF_NONE &&
        set_aff(r, jb.jid.s, rt_jid_bare_len(&jb.jid), AFF_MEMBER) == 0) /* 7.8.2: invited in */
        save(r);
    const rt_xml_el_t *reason = rt_xml_child(inv, "reason", NULL);
    rt_buf_printf(&r->out, "<message xmlns='%s'", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&r->out, "from", r->jid);
    rt_xml_put_attr(&r->out, "to", jb.jid.s);
    rt_buf_printf(&r->out, "><x xmlns='%s'><invite", NS_MUC_USER);
    rt_xml_put_attr(&r->out, "from", o->jid);
    rt_buf_printf(&r->out, ">");
    if (reason)
        rt_xml_put_tree(&r->out, reason, NS_MUC_USER);
    rt_buf_printf(&r->out, "</invite>");
    if (r->secret) { /* 7.8.2: the invitee needs it to get in */
        rt_buf_printf(&r->out, "<password>");
        rt_xml_put_text(&r->out, r->secret, strlen(r->secret));
        rt_buf_printf(&r->out, "</password>");
    }
    rt_buf_printf(&r->out, "</x></message>");
    if (!r->out.oom)
        rt__c2s_to_available(jb.jid.s, rt_jid_bare_len(&jb.jid), r->out.data, r->out.len);
    rt_buf_truncate(&r->out, 0);
}

static void broadcast_presence(room_t *r, const occ_t *o, bool unavailable, const int *codes,
                               size_t ncodes, const char *new_nick, const char *reason);

/*
** Voice requests in a moderated room (7.13, 8.6): a visitor's request goes to every moderator
** as the approval form; a moderator's form submitted back with muc#request_allow grants the
** nick voice (participant), and everyone sees its new role.
*/
static void voice_request(room_t *r, const rt_xml_el_t *el, const occ_t *o, const rt_xml_el_t *form)
{
    if (!o) {
        reply_error(r, el, "modify", "not-acceptable");
        return;
    }
    if (o->role == ROLE_MODERATOR) {
        const char *allow = rt__c2s_form_value(form, "muc#request_allow");
        const char *nick = rt__c2s_form_value(form, "muc#roomnick");
        occ_t *t = nick ? by_nick(r, nick) : NULL;
        if (t && allow && (strcmp(allow, "1") == 0 || strcmp(allow, "true") == 0) &&
            t->role == ROLE_VISITOR) {
            t->role = ROLE_PARTICIPANT;
            broadcast_presence(r, t, false, NULL, 0, NULL, NULL);
        }
        return;
    }
    if (o->role != ROLE_VISITOR)
        return; /* it has voice already */
    for (size_t i = 0; i < r->nocc; i++) {
        if (r->occ[i].role != ROLE_MODERATOR)
            continue;
        rt_buf_printf(&r->out, "<message xmlns='%s'", RT_XML_NS_CLIENT);
        rt_xml_put_attr(&r->out, "from", r->jid);
        rt_xml_put_attr(&r->out, "to", r->occ[i].jid);
        rt_buf_printf(
            &r->out,
            "><x xmlns='%s' type='form'><title>Voice request</title>"
            "<instructions>To approve this request for voice, select the "
            "\"Grant voice to this person?\" checkbox and submit this form.</instructions>"
            "<field var='FORM_TYPE' type='hidden'><value>%s</value></field>"
            "<field var='muc#role' type='list-single' label='Requested role'>"
            "<value>participant</value></field>",
            NS_XDATA, FORM_REQUEST);
        rt_buf_printf(&r->out, "<field var='muc#jid' type='jid-single' label='User ID'><value>");
        rt_xml_put_text(&r->out, o->jid, strlen(o->jid));
        rt_buf_printf(&r->out, "</value></field><field var='muc#roomnick' type='text-single' "
                               "label='Room Nickname'><value>");
        rt_xml_put_text(&r->out, o->nick, strlen(o->nick));
        rt_buf_printf(&r->out, "</value></field><field var='muc#request_allow' type='boolean' "
                               "label='Grant voice to this person?'><value>false</value></field>"
                               "</x></message>");
        send_to(r, &r->occ[i]);
    }
}

/* A message or iq from one occupant to another, passed on from the sender's nick (7.5). */
static void to_occupant(room_t *r, const rt_xml_el_t *el, const occ_t *o, const char *nick)
{
    occ_t *t = nick ? by_nick(r, nick) : NULL;
    if (!o) {
        reply_error(r, el, "cancel", "not-acceptable");
        return;
    }
    if (!t) {
        reply_error(r, el, "cancel", "item-not-found");
        return;
    }
    rt_buf_t *b = &r->out;
    rt_buf_printf(b, "<%s xmlns='%s'", el->name, RT_XML_NS_CLIENT);
    put_occupant_from(r, o->nick);
    rt_xml_put_attr(b, "to", t->jid);
    put_message_body(b, el);
    bool message = strcmp(el->name, "message") == 0;
    if (message)
        rt_buf_printf(b, "<x xmlns='%s'/>", NS_MUC_USER); /* 7.5: a private message */
    rt_xml_put_end(b, el->name);
    send_to(r, t);
}

/*
** An error that says the user a stanza went to is not there (XEP-0045 leaves the rest to the
** service; Prosody and ejabberd drop such occupants too): its server is unreachable, or it
** has no such session. Another kind (a policy, a rate) keeps the seat.
*/
static bool gone_error(const rt_xml_el_t *el)
{
    static const char *const gone[] = {"remote-server-not-found", "remote-server-timeout",
                                       "service-unavailable",     "recipient-unavailable",
                                       "item-not-found",          "gone"};
    const rt_xml_el_t *e = rt_xml_child(el, "error", NULL);
    const rt_xml_el_t *cond = e ? rt_xml_child(e, NULL, RT_XML_NS_STANZA_ERRORS) : NULL;
    for (size_t i = 0; cond && i < sizeof(gone) / sizeof(gone[0]); i++)
        if (strcmp(cond->name, gone[i]) == 0)
            return true;
    return false;
}

static void message(room_t *r, const rt_xml_el_t *el, const char *from, const char *nick)
{
    const char *type = rt_xml_attr(el, "type");
    occ_t *o = by_jid(r, from);
    if (type && strcmp(type, "error") == 0) {
        if (o && !o->pid && gone_error(el)) { /* its (remote) server says it is not there */
            int code = ST_ERROR_REMOVED;
            remove_occupant(r, o, &code, 1, NULL);
        }
        return;
    }
    if (!nick && type && strcmp(type, "groupchat") == 0) {
        groupchat(r, el, o);
        return;
    }
    if (nick) {
        if (type && strcmp(type, "groupchat") == 0)
            reply_error(r, el, "modify", "bad-request"); /* 7.5: not to one occupant */
        else
            to_occupant(r, el, o, nick);
        return;
    }
    const rt_xml_el_t *x = rt_xml_child(el, "x", NS_MUC_USER);
    const rt_xml_el_t *inv = x ? rt_xml_child(x, "invite", NS_MUC_USER) : NULL;
    const rt_xml_el_t *form = rt_xml_child(el, "x", NS_XDATA);
    if (inv)
        invite(r, el, o, inv);
    else if (form && rt__c2s_form_value(form, "FORM_TYPE") &&
             strcmp(rt__c2s_form_value(form, "FORM_TYPE"), FORM_REQUEST) == 0)
        voice_request(r, el, o, form);
    else
        reply_error(r, el, "modify", "bad-request");
}

/* ---- Administration (XEP-0045 8, 9, 10) ---- */

/* Whether actor (an occupant, or NULL) may change target's role to role: a moderator may kick
   and give or take voice, only an admin or owner may make moderators. */
static bool may_set_role(const occ_t *actor, const occ_t *target, uint8_t role)
{
    if (!actor || actor->role != ROLE_MODERATOR)
        return false;
    if (target->aff >= AFF_ADMIN && role < ROLE_MODERATOR)
        return false; /* 8.2, 8.4: an admin or owner is not kicked nor silenced */
    return role != ROLE_MODERATOR || actor->aff >= AFF_ADMIN;
}

/* Whether one of affiliation actor_aff may change an affiliation from cur to aff: an owner any,
   an admin those below admin to those below admin (9, 10.3). */
static bool may_set_aff(uint8_t actor_aff, uint8_t cur, uint8_t aff)
{
    if (actor_aff == AFF_OWNER)
        return true;
    return actor_aff == AFF_ADMIN && cur < AFF_ADMIN && aff < AFF_ADMIN;
}

/* The occupants of bare JID after its affiliation changed: out when it bars them, else their
   new standing to everyone. */
static void affiliation_changed(room_t *r, const char *bare, size_t len, uint8_t aff,
                                const char *reason)
{
    for (size_t i = 0; i < r->nocc;) {
        occ_t *o = &r->occ[i];
        if (bare_len(o->jid) != len || memcmp(o->jid, bare, len) != 0) {
            i++;
            continue;
        }
        o->aff = aff;
        int code = aff == AFF_OUTCAST ? ST_BANNED : ST_MEMBERS_ONLY;
        if (aff == AFF_OUTCAST || (r->members_only && aff == AFF_NONE)) {
            broadcast_presence(r, o, true, &code, 1, NULL, reason);
            forget(r, o);
            continue;
        }
        o->role = role_for(r, aff);
        broadcast_presence(r, o, false, NULL, 0, NULL, reason);
        i++;
    }
}

static void admin_list(room_t *r, const rt_xml_el_t *iq, const occ_t *actor, const char *what)
{
    int aff = parse_index(aff_names, 5, what);
    if (aff < 0 || !actor || actor->aff < AFF_ADMIN) {
        reply_error(r, iq, aff < 0 ? "modify" : "auth", aff < 0 ? "bad-request" : "forbidden");
        return;
    }
    put_result_start(r, iq);
    rt_buf_printf(&r->out, "><query xmlns='%s'>", NS_MUC_ADMIN);
    for (size_t i = 0; i < r->naff; i++) {
        if (r->affs[i].aff != aff)
            continue;
        rt_xml_put_start(&r->out, "item");
        rt_xml_put_attr(&r->out, "affiliation", aff_names[aff]);
        rt_xml_put_attr(&r->out, "jid", r->affs[i].bare);
        rt_xml_put_empty_end(&r->out);
    }
    rt_buf_printf(&r->out, "</query></iq>");
    send_out(r, r->from);
}

/* One item of a muc#admin set: 0, or the error's condition. */
static const char *admin_item(room_t *r, occ_t *actor, const rt_xml_el_t *item)
{
    const char *nick = rt_xml_attr(item, "nick"), *jid = rt_xml_attr(item, "jid");
    int role = parse_index(role_names, 4, rt_xml_attr(item, "role"));
    int aff = parse_index(aff_names, 5, rt_xml_attr(item, "affiliation"));
    const rt_xml_el_t *re = rt_xml_child(item, "reason", NULL);
    const char *reason = re ? rt_xml_text(re, NULL) : NULL;
    if (role >= 0 && nick) {
        occ_t *t = by_nick(r, nick);
        if (!t)
            return "item-not-found";
        if (!may_set_role(actor, t, (uint8_t)role))
            return "not-allowed";
        if (role == ROLE_NONE) {
            int code = ST_KICKED;
            remove_occupant(r, t, &code, 1, reason);
            return NULL;
        }
        t->role = (uint8_t)role;
        broadcast_presence(r, t, false, NULL, 0, NULL, reason);
        return NULL;
    }
    rt_jid_buf_t jb;
    if (aff < 0 || !jid || rt_jid_prep(jid, strlen(jid), &jb, NULL) != 0)
        return "bad-request";
    size_t len = rt_jid_bare_len(&jb.jid);
    uint8_t cur = AFF_NONE;
    aff_t *a = aff_entry(r, jb.jid.s, len);
    if (a)
        cur = a->aff;
    if (!actor || !may_set_aff(actor->aff, cur, (uint8_t)aff))
        return "not-allowed";
    if (set_aff(r, jb.jid.s, len, (uint8_t)aff))
        return "resource-constraint";
    save(r);
    affiliation_changed(r, jb.jid.s, len, (uint8_t)aff, reason);
    return NULL;
}

static void admin_iq(room_t *r, const rt_xml_el_t *iq, const rt_xml_el_t *q, bool get, occ_t *actor)
{
    const rt_xml_el_t *item = rt_xml_child(q, "item", NS_MUC_ADMIN);
    if (!item) {
        reply_error(r, iq, "modify", "bad-request");
        return;
    }
    if (get) {
        admin_list(r, iq, actor, rt_xml_attr(item, "affiliation"));
        return;
    }
    /* The answer goes before what the change sends, so the asker sees its result first;
       the actor may be moved in the occupants' array by a removal: its sender is enough. */
    for (; item; item = rt_xml_next(item, "item", NS_MUC_ADMIN)) {
        const char *cond = admin_item(r, actor, item);
        if (cond) {
            reply_error(r, iq, strcmp(cond, "not-allowed") == 0 ? "cancel" : "modify", cond);
            return;
        }
        actor = by_jid(r, rt_xml_attr(iq, "from"));
    }
    reply_empty_result(r, iq);
    end_if_empty(r);
}

static void put_field(rt_buf_t *b, const char *var, const char *type, const char *label,
                      const char *value)
{
    rt_xml_put_start(b, "field");
    rt_xml_put_attr(b, "var", var);
    rt_xml_put_attr(b, "type", type);
    if (label)
        rt_xml_put_attr(b, "label", label);
    rt_buf_printf(b, "><value>");
    rt_xml_put_text(b, value, strlen(value));
    rt_buf_printf(b, "</value></field>");
}

static void config_form(room_t *r, const rt_xml_el_t *iq)
{
    rt_buf_t *b = &r->out;
    char users[24];
    snprintf(users, sizeof(users), "%u", r->max_users);
    put_result_start(r, iq);
    rt_buf_printf(b,
                  "><query xmlns='%s'><x xmlns='%s' type='form'><title>Room configuration</title>",
                  NS_MUC_OWNER, NS_XDATA);
    put_field(b, "FORM_TYPE", "hidden", NULL, FORM_ROOMCONFIG);
    put_field(b, "muc#roomconfig_roomname", "text-single", "Name", r->name ? r->name : "");
    put_field(b, "muc#roomconfig_persistentroom", "boolean", "Persistent",
              r->persistent ? "1" : "0");
    put_field(b, "muc#roomconfig_publicroom", "boolean", "Listed", r->listed ? "1" : "0");
    put_field(b, "muc#roomconfig_membersonly", "boolean", "Members only",
              r->members_only ? "1" : "0");
    put_field(b, "muc#roomconfig_moderatedroom", "boolean", "Moderated", r->moderated ? "1" : "0");
    put_field(b, "muc#roomconfig_changesubject", "boolean", "Occupants may change the subject",
              r->change_subject ? "1" : "0");
    put_field(b, "muc#roomconfig_maxusers", "text-single", "Most occupants", users);
    put_field(b, "muc#roomconfig_passwordprotectedroom", "boolean", "Password required",
              r->secret ? "1" : "0");
    put_field(b, "muc#roomconfig_roomsecret", "text-private", "Password",
              r->secret ? r->secret : "");
    rt_buf_printf(b,
                  "<field var='muc#roomconfig_whois' type='list-single' label='Who sees JIDs'>"
                  "<option label='Moderators'><value>moderators</value></option>"
                  "<option label='Anyone'><value>anyone</value></option><value>%s</value>"
                  "</field></x></query></iq>",
                  r->whois_anyone ? "anyone" : "moderators");
    send_out(r, r->from);
}

static bool truthy(const char *v)
{
    return v && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0);
}

/* A submitted configuration form (XEP-0004): the fields it names change, the others stay. */
static const char *config_submit(room_t *r, const rt_xml_el_t *x)
{
    bool was_members_only = r->members_only;
    int protect = -1; /* muc#roomconfig_passwordprotectedroom: not given */
    const char *secret = NULL;
    for (const rt_xml_el_t *f = rt_xml_child(x, "field", NS_XDATA); f;
         f = rt_xml_next(f, "field", NS_XDATA)) {
        const char *var = rt_xml_attr(f, "var");
        const rt_xml_el_t *ve = rt_xml_child(f, "value", NS_XDATA);
        const char *v = ve ? rt_xml_text(ve, NULL) : "";
        if (!var || !v)
            continue;
        if (strcmp(var, "muc#roomconfig_roomname") == 0) {
            char *n = rt_strndup(r->self, v, strlen(v));
            if (!n)
                return "resource-constraint";
            rt_free(r->self, r->name);
            r->name = n;
        } else if (strcmp(var, "muc#roomconfig_persistentroom") == 0) {
            r->persistent = truthy(v);
        } else if (strcmp(var, "muc#roomconfig_publicroom") == 0) {
            r->listed = truthy(v);
        } else if (strcmp(var, "muc#roomconfig_membersonly") == 0) {
            r->members_only = truthy(v);
        } else if (strcmp(var, "muc#roomconfig_moderatedroom") == 0) {
            r->moderated = truthy(v);
        } else if (strcmp(var, "muc#roomconfig_changesubject") == 0) {
            r->change_subject = truthy(v);
        } else if (strcmp(var, "muc#roomconfig_whois") == 0) {
            r->whois_anyone = strcmp(v, "anyone") == 0;
        } else if (strcmp(var, "muc#roomconfig_passwordprotectedroom") == 0) {
            protect = truthy(v) ? 1 : 0;
        } else if (strcmp(var, "muc#roomconfig_roomsecret") == 0) {
            secret = v;
        } else if (strcmp(var, "muc#roomconfig_maxusers") == 0) {
            long n = strtol(v, NULL, 10);
            if (n >= 1 && n <= rt__c2s.conf->muc_max_occupants)
                r->max_users = (uint32_t)n;
        }
    }
    if (protect == 0 || (protect == 1 && secret && !*secret)) {
        rt_free(r->self, r->secret);
        r->secret = NULL;
    } else if (secret && *secret && (protect == 1 || (protect < 0 && r->secret))) {
        char *copy = rt_strndup(r->self, secret, strlen(secret));
        if (!copy)
            return "resource-constraint";
        rt_free(r->self, r->secret);
        r->secret = copy;
    }
    if (r->members_only && !was_members_only) /* 9.5: those not members leave, with 321 */
        for (size_t i = 0; i < r->nocc;) {
            occ_t *o = &r->occ[i];
            if (o->aff != AFF_NONE) {
                i++;
                continue;
            }
            int code = ST_MEMBERS_ONLY;
            broadcast_presence(r, o, true, &code, 1, NULL, NULL);
            forget(r, o);
        }
    save(r);
    info_to_service(r, true);
    return NULL;
}

static void destroy(room_t *r, const rt_xml_el_t *iq, const rt_xml_el_t *d)
{
    const char *alt = d ? rt_xml_attr(d, "jid") : NULL;
    const rt_xml_el_t *re = d ? rt_xml_child(d, "reason", NULL) : NULL;
    const char *reason = re ? rt_xml_text(re, NULL) : NULL;
    reply_empty_result(r, iq);
    for (size_t i = 0; i < r->nocc; i++) {
        occ_t *o = &r->occ[i];
        rt_buf_printf(&r->out, "<presence xmlns='%s'", RT_XML_NS_CLIENT);
        put_occupant_from(r, o->nick);
        rt_xml_put_attr(&r->out, "to", o->jid);
        rt_buf_printf(&r->out,
                      " type='unavailable'><x xmlns='%s'><item affiliation='none' role='none'/>",
                      NS_MUC_USER);
        /* 10.9: the owner's <destroy/> (its alternate venue and reason), in muc#user's
           namespace, not the owner's it came in. */
        rt_xml_put_start(&r->out, "destroy");
        if (alt)
            rt_xml_put_attr(&r->out, "jid", alt);
        rt_buf_printf(&r->out, ">");
        if (reason) {
            rt_buf_printf(&r->out, "<reason>");
            rt_xml_put_text(&r->out, reason, strlen(reason));
            rt_buf_printf(&r->out, "</reason>");
        }
        rt_buf_printf(&r->out, "</destroy><status code='%d'/></x></presence>", ST_SELF);
        send_to(r, o);
    }
    while (r->nocc)
        forget(r, &r->occ[0]);
    r->persistent = false;
    save(r);
    end_if_empty(r);
}

static void owner_iq(room_t *r, const rt_xml_el_t *iq, const rt_xml_el_t *q, bool get,
                     const occ_t *actor)
{
    if (aff_of(r, rt_xml_attr(iq, "from")) != AFF_OWNER) {
        reply_error(r, iq, "auth", "forbidden");
        return;
    }
    (void)actor;
    if (get) {
        config_form(r, iq);
        return;
    }
    const rt_xml_el_t *x = rt_xml_child(q, "x", NS_XDATA), *d = rt_xml_child(q, "destroy", NULL);
    const char *xtype = x ? rt_xml_attr(x, "type") : NULL;
    if (d) {
        destroy(r, iq, d);
    } else if (xtype && strcmp(xtype, "submit") == 0) {
        const char *cond = config_submit(r, x);
        if (cond) {
            reply_error(r, iq, "wait", cond);
        } else {
            r->locked = false;
            reply_empty_result(r, iq);
        }
        end_if_empty(r);
    } else if (xtype && strcmp(xtype, "cancel") == 0 && r->locked) {
        destroy(r, iq, NULL); /* 10.1.3: the initial configuration cancelled */
    } else if (xtype && strcmp(xtype, "cancel") == 0) {
        reply_empty_result(r, iq);
    } else {
        reply_error(r, iq, "modify", "bad-request");
    }
}

static void disco_info(room_t *r, const rt_xml_el_t *iq)
{
    rt_buf_t *b = &r->out;
    put_result_start(r, iq);
    rt_buf_printf(b, "><query xmlns='%s'><identity category='conference' type='text'",
                  NS_DISCO_INFO);
    rt_xml_put_attr(b, "name", r->name ? r->name : r->jid);
    rt_buf_printf(b, "/><feature var='%s'/><feature var='%s'/><feature var='%s'/>", NS_MUC,
                  NS_DISCO_INFO, NS_PING);
    rt_buf_printf(b, "<feature var='%s'/><feature var='%s'/><feature var='%s'/>",
                  r->persistent ? "muc_persistent" : "muc_temporary",
                  r->listed ? "muc_public" : "muc_hidden",
                  r->members_only ? "muc_membersonly" : "muc_open");
    rt_buf_printf(b, "<feature var='%s'/><feature var='%s'/><feature var='%s'/>",
                  r->moderated ? "muc_moderated" : "muc_unmoderated",
                  r->whois_anyone ? "muc_nonanonymous" : "muc_semianonymous",
                  r->secret ? "muc_passwordprotected" : "muc_unsecured");
    if (rt__c2s.conf->archive)
        rt_buf_printf(b, "<feature var='%s'/><feature var='%s'/>", NS_MAM, NS_SID);
    rt_buf_printf(b, "</query></iq>");
    send_out(r, r->from);
}

/*
** The room's archive (XEP-0313 for rooms): its occupants may read it, and anyone the room
** would let in (not banned; a member where it is members-only); the archive actor answers the
** asker's session directly.
*/
static void mam_iq(room_t *r, const rt_xml_el_t *iq, const rt_xml_el_t *q, bool get, const occ_t *o)
{
    uint8_t aff = aff_of(r, rt_xml_attr(iq, "from"));
    if (!rt__c2s.conf->archive) {
        reply_error(r, iq, "cancel", "service-unavailable");
    } else if (!o && (aff == AFF_OUTCAST || (r->members_only && aff < AFF_MEMBER))) {
        reply_error(r, iq, "auth", "forbidden");
    } else if (strcmp(q->name, "query") != 0) {
        reply_error(r, iq, "cancel", "feature-not-implemented"); /* prefs: the owner's, none */
    } else if (get) {
        put_result_start(r, iq);
        rt__c2s_mam_put_form(&r->out);
        rt_buf_printf(&r->out, "</iq>");
        send_out(r, r->from);
    } else {
        c2s_mam_query_t mq = {.reply_to = r->from};
        rt_jid_buf_t with;
        bool has_with;
        const char *why, *cond = rt__c2s_mam_parse(q, &mq, &with, &has_with, &why);
        const char *at = strchr(r->jid, '@');
        char room[RT_JID_PART_MAX + 1];
        snprintf(room, sizeof(room), "%.*s", at ? (int)(at - r->jid) : 0, r->jid);
        if (cond)
            reply_error(r, iq, cond[0] == 'f' || cond[0] == 'i' ? "cancel" : "modify", cond);
        else if (!at || rt__c2s_mam_ask(at + 1, room, &mq, rt_xml_attr(iq, "id"),
                                        rt_xml_attr(q, "queryid"), rt_xml_attr(iq, "from"), r->jid,
                                        has_with ? with.jid.s : NULL) != 0)
            reply_error(r, iq, "wait", "internal-server-error");
    }
}

/*
** Registering with the room (7.10): the form asks a nick; a nick registered is the user's alone
** in the room (another's join with it is a conflict), and the user becomes a member of an open
** room (of a members-only one, it must be one already). <remove/> ends it.
*/
static void register_iq(room_t *r, const rt_xml_el_t *iq, const rt_xml_el_t *q, bool get)
{
    const char *from = rt_xml_attr(iq, "from");
    size_t blen = bare_len(from);
    aff_t *a = aff_entry(r, from, blen);
    uint8_t aff = a ? a->aff : AFF_NONE;
    if (aff == AFF_OUTCAST) {
        reply_error(r, iq, "auth", "forbidden");
        return;
    }
    if (get) {
        put_result_start(r, iq);
        rt_buf_printf(&r->out, "><query xmlns='%s'>", RT_C2S_NS_REGISTER);
        if (a && a->nick) {
            rt_buf_printf(&r->out, "<registered/><username>");
            rt_xml_put_text(&r->out, a->nick, strlen(a->nick));
            rt_buf_printf(&r->out, "</username>");
        } else {
            rt_buf_printf(&r->out,
                          "<x xmlns='%s' type='form'><title>Register with the room</title>"
                          "<field var='FORM_TYPE' type='hidden'><value>%s</value></field>"
                          "<field var='muc#register_roomnick' type='text-single' "
                          "label='Nickname'><required/></field></x>",
                          NS_XDATA, FORM_REGISTER);
        }
        rt_buf_printf(&r->out, "</query></iq>");
        send_out(r, r->from);
        return;
    }
    if (rt_xml_child(q, "remove", NULL)) {
        if (a && a->nick) {
            rt_free(r->self, a->nick);
            a->nick = NULL;
            if (a->aff == AFF_MEMBER)
                set_aff(r, from, blen, AFF_NONE);
            save(r);
        }
        reply_empty_result(r, iq);
        return;
    }
    const rt_xml_el_t *x = rt_xml_child(q, "x", NS_XDATA);
    const char *nick = x ? rt__c2s_form_value(x, "muc#register_roomnick") : NULL;
    aff_t *owner = nick && *nick ? nick_owner(r, nick) : NULL;
    occ_t *in = nick && *nick ? by_nick(r, nick) : NULL;
    if (!nick || !*nick) {
        reply_error(r, iq, "modify", "bad-request");
    } else if ((owner && owner != a) || (in && bare_len(in->jid) != blen) ||
               (in && memcmp(in->jid, from, blen) != 0)) {
        reply_error(r, iq, "cancel", "conflict");
    } else if (r->members_only && aff < AFF_MEMBER) {
        reply_error(r, iq, "auth", "registration-required");
    } else if ((!a && set_aff(r, from, blen, AFF_MEMBER) != 0) || !(a = aff_entry(r, from, blen))) {
        reply_error(r, iq, "wait", "resource-constraint");
    } else {
        char *copy = rt_strndup(r->self, nick, strlen(nick));
        if (!copy) {
            reply_error(r, iq, "wait", "resource-constraint");
            return;
        }
        rt_free(r->self, a->nick);
        a->nick = copy;
        save(r);
        reply_empty_result(r, iq);
    }
}

static void iq(room_t *r, const rt_xml_el_t *el, const char *from, const char *nick)
{
    const char *type = rt_xml_attr(el, "type");
    occ_t *o = by_jid(r, from);
    if (nick) {
        const rt_xml_el_t *q = rt_xml_first(el);
        bool ping = q && strcmp(q->ns, NS_PING) == 0 && type && strcmp(type, "get") == 0;
        if (ping && o && strcmp(o->nick, nick) == 0) /* XEP-0410: still in */
            reply_empty_result(r, el);
        else if (ping && !o)
            reply_error(r, el, "cancel", "not-acceptable");
        else if (o || (type && (strcmp(type, "get") == 0 || strcmp(type, "set") == 0)))
            to_occupant(r, el, o, nick);
        return;
    }
    if (!type || (strcmp(type, "get") != 0 && strcmp(type, "set") != 0))
        return;
    bool get = strcmp(type, "get") == 0;
    const rt_xml_el_t *q = rt_xml_first(el);
    if (!q) {
        reply_error(r, el, "modify", "bad-request");
    } else if (strcmp(q->ns, NS_DISCO_INFO) == 0 && get) {
        disco_info(r, el);
    } else if (strcmp(q->ns, NS_DISCO_ITEMS) == 0 && get) {
        put_result_start(r, el);
        rt_buf_printf(&r->out, "><query xmlns='%s'/></iq>", NS_DISCO_ITEMS);
        send_out(r, r->from);
    } else if (strcmp(q->ns, NS_PING) == 0 && get) {
        reply_empty_result(r, el);
    } else if (strcmp(q->ns, NS_MAM) == 0) {
        mam_iq(r, el, q, get, o);
    } else if (strcmp(q->ns, RT_C2S_NS_REGISTER) == 0) {
        register_iq(r, el, q, get);
    } else if (strcmp(q->ns, NS_MUC_ADMIN) == 0) {
        admin_iq(r, el, q, get, o);
    } else if (strcmp(q->ns, NS_MUC_OWNER) == 0) {
        owner_iq(r, el, q, get, o);
    } else {
        reply_error(r, el, "cancel", "feature-not-implemented");
    }
}

/* ---- The actor ---- */

static int room_stanza(void *ctx, rt_xml_el_t *el)
{
    room_t *r = ctx;
    const char *from = rt_xml_attr(el, "from"), *to = rt_xml_attr(el, "to");
    rt_jid_buf_t tb;
    if (from && to && rt_jid_prep(to, strlen(to), &tb, NULL) == 0) {
        const char *nick = tb.jid.resource ? rt_jid_resource(&tb.jid) : NULL;
        if (strcmp(el->name, "presence") == 0)
            presence(r, el, from, nick);
        else if (strcmp(el->name, "message") == 0)
            message(r, el, from, nick);
        else if (strcmp(el->name, "iq") == 0)
            iq(r, el, from, nick);
    }
    rt__c2s_muc_free(el);
    return 0;
}

static void down(room_t *r, const rt_msg_t *m)
{
    rt_down_msg_t d;
    memcpy(&d, m->data, sizeof(d));
    for (size_t i = 0; i < r->nocc; i++)
        if (r->occ[i].mon == d.ref) {
            occ_t *o = &r->occ[i];
            o->mon = 0; /* fired: nothing to take back */
            remove_occupant(r, o, NULL, 0, NULL);
            return;
        }
}

static int room_init(rt_actor_t *self, void *state, void *arg)
{
    room_t *r = state;
    const c2s_room_arg_t *a = arg;
    r->self = self;
    r->jid_len = strlen(a->jid);
    r->jid = rt_strndup(self, a->jid, r->jid_len);
    if (!r->jid)
        return RT_ENOMEM;
    r->parse.on_stanza = room_stanza;
    r->max_users = (uint32_t)rt__c2s.conf->muc_max_occupants;
    r->listed = true;
    r->change_subject = true;
    r->created = !a->state;
    r->locked = r->created && rt__c2s.conf->muc_room_locking;
    int rc = a->state ? restore(r, a->state, a->state_len) : 0;
    if (r->max_users > (uint32_t)rt__c2s.conf->muc_max_occupants)
        r->max_users = (uint32_t)rt__c2s.conf->muc_max_occupants; /* the setting went down */
    if (!rc && a->restored) /* its first owner stands for its maker */
        for (size_t i = 0; i < r->naff && !r->maker; i++)
            if (r->affs[i].aff == AFF_OWNER &&
                (r->maker = rt_strndup(self, r->affs[i].bare, strlen(r->affs[i].bare))))
                rt__c2s_muc_maker_take(r->maker, strlen(r->maker), true);
    if (!rc && a->maker && !(r->maker = rt_strndup(self, a->maker, strlen(a->maker))))
        rc = RT_ENOMEM;
    if (!rc)
        rc = rt__c2s_muc_parse_init(&r->parse);
    if (!rc && a->state)
        info_to_service(r, true);
    if (!rc)
        atomic_fetch_add_explicit(&rt_c2s_stats.muc_rooms, 1, memory_order_relaxed);
    else if (a->restored && r->maker) /* a join's maker is given back by its spawner */
        rt__c2s_muc_maker_give(r->maker, strlen(r->maker));
    return rc;
}

/*
** A room quiet for C2S_HIBERNATE_MS is collected down to what it holds (as an idle session is):
** what a burst of joins and messages left on its heap goes back.
*/
static void hibernate_arm(room_t *r, uint64_t ms)
{
    if (!r->hibernate_armed)
        r->hibernate_armed = rt_send_after_tag(ms, rt_self(r->self), C2S_MSG_HIBERNATE, NULL) == 0;
}

static void on_hibernate(room_t *r)
{
    r->hibernate_armed = false;
    uint64_t quiet = rt_mono_ms() - r->last_active_ms;
    if (quiet < C2S_HIBERNATE_MS) {
        hibernate_arm(r, C2S_HIBERNATE_MS - quiet);
        return;
    }
    /* Arrays grown for a crowd that has left shrink to what they hold; a collection then
       gives back the chunks left empty. */
    occ_t *occ =
        r->nocc < r->occ_cap
            ? rt_realloc(r->self, r->occ, (r->nocc ? r->nocc : 1) * sizeof(occ_t), RT_OBJ_SCAN)
            : NULL;
    if (occ)
        r->occ = occ, r->occ_cap = r->nocc ? r->nocc : 1;
    aff_t *affs =
        r->naff < r->aff_cap
            ? rt_realloc(r->self, r->affs, (r->naff ? r->naff : 1) * sizeof(aff_t), RT_OBJ_SCAN)
            : NULL;
    if (affs)
        r->affs = affs, r->aff_cap = r->naff ? r->naff : 1;
    rt_gc(r->self);
}

static void room_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    room_t *r = state;
    r->self = self;
    if (m->tag == C2S_MSG_HIBERNATE) {
        on_hibernate(r);
        return;
    }
    r->last_active_ms = rt_mono_ms();
    hibernate_arm(r, C2S_HIBERNATE_MS);
    if (m->tag == C2S_MSG_MUC) {
        r->from = m->from;
        rt__c2s_muc_parse(&r->parse, m->data, m->len);
        r->created = false;
        end_if_empty(r);
    } else if (m->tag == RT_MSG_DOWN && m->len >= sizeof(rt_down_msg_t)) {
        down(r, m);
    } else if (m->tag == C2S_MSG_MUC_POST) {
        post(r, m);
    }
    drop_lagging(r);
    rt_buf_free(&r->out); /* malloc'd: not kept between stanzas, where the heap cannot see it */
}

static void room_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self, (void)reason;
    room_t *r = state;
    rt_xml_stream_destroy(&r->parse.xs);
    rt_buf_free(&r->out);
    if (r->jid)
        info_to_service(r, false);
    if (r->maker)
        rt__c2s_muc_maker_give(r->maker, strlen(r->maker));
    atomic_fetch_sub_explicit(&rt_c2s_stats.muc_rooms, 1, memory_order_relaxed);
}

static void room_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag == C2S_MSG_MUC)
        rt__c2s_muc_reroute(m, true);
}

const rt_actor_type_t rt__c2s_room_type = {
    .name = "muc_room",
    .state_size = sizeof(room_t),
    .init = room_init,
    .handle = room_handle,
    .terminate = room_terminate,
    .dead_letter = room_dead_letter,
};

/*
** Message Archive Management (XEP-0313), the session's side: what it archives as it routes,
** the stanza-id (XEP-0359) the receiver gets, and the archive's iq (queries, their form,
** preferences). The archive is in xmpp.db, written and read by the archive actor
** (c2s_store_mam.c).
**
** Archiving. The sender's session archives a chat for both parties (its own account's copy as
** outgoing, the receiver's as incoming), so a message is archived once whichever of the
** receiver's resources, if any, takes it, and kept offline with its stanza-id. Each copy's
** archive id is chosen here, before the write, so that the receiver is told it at once: ids
** are microseconds of the wall clock (as ejabberd's), kept unique and growing by one atomic,
** above the greatest in the file (the archive actor says which at start). The write is a
** message to that actor, which batches what it is sent into one transaction: the session
** neither waits for it nor is slowed by an archive that falls behind (rt_send_unmuted); what
** waits for it is bounded by C2S_ARCHIVE_INFLIGHT_MAX bytes, past which copies are dropped
** and counted, never routing stalled.
*/
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"

#define NS_MAM "urn:xmpp:mam:2"
#define NS_SID "urn:xmpp:sid:0"
#define NS_DATA "jabber:x:data"
#define NS_RSM "http://jabber.org/protocol/rsm"
#define NS_HINTS "urn:xmpp:hints"

_Atomic uint64_t rt__c2s_archive_inflight;
static _Atomic int64_t last_id; /* the greatest archive id handed out */

void rt__c2s_mam_floor(int64_t id)
{
    int64_t cur = atomic_load_explicit(&last_id, memory_order_relaxed);
    while (cur < id && !atomic_compare_exchange_weak_explicit(
                           &last_id, &cur, id, memory_order_relaxed, memory_order_relaxed))
        ;
}

/*
** The first of n ids, the next id first + step: the clock's microsecond, or past the last one
** given. With the archive shared by a cluster's nodes (xmpp.cluster_home) every node makes ids
** for one table: each microsecond has C2S_ID_SLOTS ids, and a node takes those of its slot
** (rt__c2s_id_slot), so that two nodes never make the same one.
*/
static int64_t next_ids(int n, int64_t *step)
{
    bool shared = rt__c2s_store_shared();
    int64_t slots = shared ? C2S_ID_SLOTS : 1, slot = shared ? rt__c2s_id_slot() : 0;
    int64_t now = (int64_t)rt_wall_ms() * 1000 * slots + slot, cur, first;
    cur = atomic_load_explicit(&last_id, memory_order_relaxed);
    do {
        first = cur + 1 > now ? cur + 1 : now;
        first += (slot - first % slots + slots) % slots; /* up to the node's slot */
    } while (!atomic_compare_exchange_weak_explicit(&last_id, &cur, first + (n - 1) * slots,
                                                    memory_order_relaxed, memory_order_relaxed));
    *step = slots;
    return first;
}

int rt__c2s_archive_send(rt_msg_t *m)
{
    c2s_req_view_t v;
    if (rt__c2s_store_req(m, &v) != 0) {
        rt_msg_free(m);
        return RT_EINVAL;
    }
    if (rt__c2s_home_elsewhere())
        return rt__c2s_call_home(C2S_TO_ARCHIVE, rt__c2s_current_pid(), m);
    size_t len = v.r->op == C2S_OP_ARCHIVE ? v.r->data_len : 0;
    if (atomic_fetch_add_explicit(&rt__c2s_archive_inflight, len, memory_order_relaxed) + len >
        C2S_ARCHIVE_INFLIGHT_MAX) {
        atomic_fetch_sub_explicit(&rt__c2s_archive_inflight, len, memory_order_relaxed);
        rt_msg_free(m);
        return RT_ELIMIT;
    }
    int rc = rt_send_unmuted(rt_whereis(RT_C2S_ARCHIVE_NAME), m); /* none: freed, ENOPROC */
    if (rc)
        atomic_fetch_sub_explicit(&rt__c2s_archive_inflight, len, memory_order_relaxed);
    return rc;
}

bool rt__c2s_mam_on(const c2s_t *c)
{
    return rt__c2s.conf->archive && !c->anonymous;
}

bool rt__c2s_mam_forged(const rt_xml_el_t *el)
{
    return strcmp(el->name, "stanza-id") == 0 && strcmp(el->ns, NS_SID) == 0;
}

/* XEP-0313 5.1.1: chat and normal messages with a body, unless hinted not to (XEP-0334). */
static bool archivable(const rt_xml_el_t *el)
{
    const char *type = rt_xml_attr(el, "type");
    if (type && strcmp(type, "chat") != 0 && strcmp(type, "normal") != 0)
        return false;
    return rt_xml_child(el, "body", RT_XML_NS_CLIENT) && !rt_xml_child(el, "no-store", NS_HINTS) &&
           !rt_xml_child(el, "no-permanent-store", NS_HINTS);
}

/*
** Sends the archive actor a copy to write (h, host and user: the sender's, or a room's; to:
** h->to_len bytes), counted in flight until it is written; one past the bound, or that cannot
** go, is dropped and counted: 0, or RT_ELIMIT.
*/
static int archive(const c2s_archive_t *h, const char *host, const char *user, const char *to,
                   const rt_buf_t *b)
{
    size_t len = sizeof(*h) + h->to_len + b->len;
    rt_msg_t *m =
        rt__c2s_store_msg(C2S_OP_ARCHIVE, 0, host, strlen(host), user, strlen(user), 0, len);
    if (m) {
        uint8_t *p = rt__c2s_store_data(m);
        memcpy(p, h, sizeof(*h));
        memcpy(p + sizeof(*h), to, h->to_len);
        memcpy(p + sizeof(*h) + h->to_len, b->data, b->len);
    }
    if (!m || rt__c2s_archive_send(m) != 0) {
        atomic_fetch_add_explicit(&rt_c2s_stats.archive_dropped, 1, memory_order_relaxed);
        return RT_ELIMIT;
    }
    return 0;
}

bool rt__c2s_mam_room(const rt_xml_el_t *el, const char *service, const char *room,
                      const char *with, const rt_buf_t *b, int64_t *id)
{
    if (!rt__c2s.conf->archive || b->oom ||
        (el && (rt_xml_child(el, "no-store", NS_HINTS) ||
                rt_xml_child(el, "no-permanent-store", NS_HINTS))))
        return false;
    int64_t step;
    c2s_archive_t h = {.stamp_ms = (int64_t)rt_wall_ms(),
                       .out_id = next_ids(1, &step),
                       .to_len = (uint32_t)strlen(with),
                       .room = 1};
    if (archive(&h, service, room, with, b) != 0)
        return false;
    *id = h.out_id;
    return true;
}

void rt__c2s_mam_message(c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to, rt_buf_t *b)
{
    static const char end[] = "</message>";
    const size_t end_len = sizeof(end) - 1;
    if (!rt__c2s.conf->archive || !to->local || !archivable(el) || b->oom || b->len < end_len ||
        memcmp(b->data + b->len - end_len, end, end_len) != 0)
        return;
    /* The receiver: any account of a served host. Whether it is one (or an anonymous
       session, which has none) the archive finds as it writes; the stanza-id is added either
       way, and an anonymous session's account does not advertise urn:xmpp:sid:0, so its
       client ignores it (XEP-0359 4). */
    bool out = !c->anonymous, in = rt__c2s_host_index(rt_jid_domain(to), to->domain) >= 0;
    if (!out && !in)
        return;
    int64_t step, first = next_ids(2, &step);
    c2s_archive_t h = {.stamp_ms = (int64_t)rt_wall_ms(),
                       .out_id = out ? first : 0,
                       .in_id = in ? first + step : 0,
                       .to_len = (uint32_t)rt_jid_bare_len(to)};
    char user[RT_JID_PART_MAX + 1];
    snprintf(user, sizeof(user), "%.*s", (int)c->jid->local, rt_jid_local(c->jid));
    if (archive(&h, rt__c2s.conf->hosts[c->host], user, to->s, b) != 0 || !in)
        return;
    /* The receiver's copy says where its archive keeps it (XEP-0359). */
    rt_buf_truncate(b, b->len - end_len);
    rt_buf_printf(b, "<stanza-id xmlns='%s'", NS_SID);
    rt_xml_put_attr_len(b, "by", to->s, h.to_len);
    rt_buf_printf(b, " id='%lld'/>%s", (long long)h.in_id, end);
}

/* ---- The iq ---- */

static void error_text(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const char *type,
                       const char *cond, const char *text)
{
    char app[256];
    snprintf(app, sizeof(app), "<text xmlns='%s'>%s</text>", RT_XML_NS_STANZA_ERRORS, text);
    rt__c2s_stanza_error_app(self, c, iq, type, cond, app);
}

/* The query form's fields (4.1.5): those the archive filters by. */
static void form(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    rt__c2s_iq_result_start(&b, c, iq);
    rt__c2s_mam_put_form(&b);
    rt_buf_printf(&b, "</iq>");
    rt__c2s_write_stanza_buf(self, c, &b);
}

void rt__c2s_mam_put_form(rt_buf_t *b)
{
    rt_buf_printf(b,
                  "><query xmlns='%s'><x xmlns='%s' type='form'>"
                  "<field type='hidden' var='FORM_TYPE'><value>%s</value></field>"
                  "<field type='jid-single' var='with'/>"
                  "<field type='text-single' var='start'/>"
                  "<field type='text-single' var='end'/></x></query>",
                  NS_MAM, NS_DATA, NS_MAM);
}

/*
** Preferences (6): every message is archived, and nothing else can be asked for; a set that
** says the same is answered as a set, any other refused (feature-not-implemented, with why).
*/
static void prefs(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q, bool get)
{
    if (!get) {
        const char *def = rt_xml_attr(q, "default");
        bool same = def && strcmp(def, "always") == 0;
        for (const rt_xml_el_t *l = rt_xml_first(q); l && same; l = rt_xml_next(l, NULL, NULL))
            same = rt_xml_first(l) == NULL; /* <always/> or <never/> naming no JID */
        if (!same) {
            error_text(self, c, iq, "cancel", "feature-not-implemented",
                       "this server archives every chat: only default='always' with no JIDs");
            return;
        }
    }
    rt_buf_t b = {0};
    rt__c2s_iq_result_start(&b, c, iq);
    rt_buf_printf(&b, "><prefs xmlns='%s' default='always'><always/><never/></prefs></iq>", NS_MAM);
    rt__c2s_write_stanza_buf(self, c, &b);
}

/* XEP-0082 DateTime (CCYY-MM-DDThh:mm:ss[.sss](Z|+-hh:mm)) to unix ms: 0, or -1 if it is not
   one. */
static int parse_time(const char *s, int64_t *ms)
{
    int y, mo, d, h, mi, sec, n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n != 19 ||
        y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    s += n;
    int64_t frac = 0;
    if (*s == '.') {
        int digits = 0;
        for (s++; *s >= '0' && *s <= '9'; s++, digits++)
            if (digits < 3)
                frac = frac * 10 + (*s - '0');
        if (!digits)
            return -1;
        for (; digits < 3; digits++)
            frac *= 10;
    }
    int64_t off = 0;
    if (*s == '+' || *s == '-') {
        int oh, om, k = 0;
        if (sscanf(s + 1, "%2d:%2d%n", &oh, &om, &k) != 2 || k != 5 || oh > 23 || om > 59)
            return -1;
        off = (*s == '-' ? -1 : 1) * (oh * 60 + om) * 60;
        s += 6;
    } else if (*s++ != 'Z') {
        return -1;
    }
    if (*s)
        return -1;
    /* Days from the civil date (Howard Hinnant's days_from_civil). */
    int64_t yy = y - (mo <= 2), era = yy / 400, yoe = yy - era * 400;
    int64_t doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t days = era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
    *ms = ((days * 86400 + h * 3600 + mi * 60 + sec) - off) * 1000 + frac;
    return 0;
}

/* A decimal number up to max, digits only: 0, or -1. */
static int parse_num(const char *s, int64_t max, int64_t *out)
{
    int64_t v = 0;
    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (*s - '0')) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return 0;
}

/* The one <value/> of a form field, or NULL. */
static const char *field_value(const rt_xml_el_t *f)
{
    const rt_xml_el_t *v = rt_xml_child(f, "value", NS_DATA);
    return v && !rt_xml_next(v, "value", NS_DATA) ? rt_xml_text(v, NULL) : NULL;
}

const char *rt__c2s_mam_parse(const rt_xml_el_t *query, c2s_mam_query_t *q, rt_jid_buf_t *with,
                              bool *has_with, const char **why)
{
    *has_with = false;
    const rt_xml_el_t *x = rt_xml_child(query, "x", NS_DATA);
    for (const rt_xml_el_t *f = x ? rt_xml_child(x, "field", NS_DATA) : NULL; f;
         f = rt_xml_next(f, "field", NS_DATA)) {
        const char *var = rt_xml_attr(f, "var"), *v = field_value(f);
        *why = "a field without one value";
        if (!var || !v)
            return "bad-request";
        if (strcmp(var, "FORM_TYPE") == 0) {
            *why = "FORM_TYPE is not urn:xmpp:mam:2";
            if (strcmp(v, NS_MAM) != 0)
                return "bad-request";
        } else if (strcmp(var, "with") == 0) {
            *why = "with is not a JID";
            if (rt_jid_prep(v, strlen(v), with, NULL) != 0)
                return "jid-malformed";
            *has_with = true;
        } else if (strcmp(var, "start") == 0 || strcmp(var, "end") == 0) {
            int64_t ms;
            *why = "start and end are XEP-0082 DateTimes";
            if (parse_time(v, &ms) != 0)
                return "bad-request";
            if (var[0] == 's')
                q->start_ms = ms;
            else
                q->end_ms = ms ? ms : 1; /* 0 is "no end" to the store */
        } else {
            *why = "a field this archive does not filter by";
            return "bad-request";
        }
    }
    q->max = C2S_MAM_PAGE_DEFAULT;
    const rt_xml_el_t *set = rt_xml_child(query, "set", NS_RSM);
    if (!set)
        return NULL;
    const rt_xml_el_t *e;
    int64_t v;
    if ((e = rt_xml_child(set, "max", NS_RSM))) {
        *why = "max is a number from 0 to 2147483647";
        if (parse_num(rt_xml_text(e, NULL), INT32_MAX, &v) != 0)
            return "bad-request";
        q->max = v > C2S_MAM_PAGE_MAX ? C2S_MAM_PAGE_MAX : (uint32_t)v; /* XEP-0059 2.1: fewer */
    }
    *why = "no such archive id";
    if ((e = rt_xml_child(set, "after", NS_RSM)) &&
        (parse_num(rt_xml_text(e, NULL), INT64_MAX, &q->after) != 0 || !q->after))
        return "item-not-found";
    if ((e = rt_xml_child(set, "before", NS_RSM))) {
        const char *t = rt_xml_text(e, NULL);
        if (t && !*t)
            q->last = 1; /* the last page (XEP-0059 2.5) */
        else if (parse_num(t, INT64_MAX, &q->before) != 0 || !q->before)
            return "item-not-found";
    }
    *why = "paging by index is not supported";
    if (rt_xml_child(set, "index", NS_RSM))
        return "feature-not-implemented";
    return NULL;
}

int rt__c2s_mam_ask(const char *host, const char *user, const c2s_mam_query_t *q, const char *id,
                    const char *queryid, const char *full, const char *from, const char *with)
{
    rt_buf_t d = {0};
    rt_buf_add(&d, q, sizeof(*q));
    rt_buf_add(&d, id, strlen(id) + 1);
    rt_buf_add(&d, queryid ? queryid : "", queryid ? strlen(queryid) + 1 : 1);
    rt_buf_add(&d, full, strlen(full) + 1);
    rt_buf_add(&d, from ? from : "", from ? strlen(from) + 1 : 1);
    if (with)
        rt_buf_add(&d, with, strlen(with));
    rt_msg_t *m = !d.oom ? rt__c2s_store_msg(C2S_OP_MAM_QUERY, 0, host, strlen(host), user,
                                             strlen(user), 0, d.len)
                         : NULL;
    if (m)
        memcpy(rt__c2s_store_data(m), d.data, d.len);
    int rc = !m ? RT_ENOMEM : rt__c2s_archive_send(m);
    rt_buf_free(&d);
    return rc;
}

static void query(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *qel)
{
    c2s_mam_query_t q = {0};
    rt_jid_buf_t with;
    bool has_with;
    const char *why = NULL, *cond = rt__c2s_mam_parse(qel, &q, &with, &has_with, &why);
    if (cond) {
        /* Not a malformed query but one this archive cannot answer: cancel (RFC 6120 8.3.3) */
        bool cancel = cond[0] == 'f' || cond[0] == 'i';
        error_text(self, c, iq, cancel ? "cancel" : "modify", cond, why);
        return;
    }
    char bare_with[RT_JID_TEXT_MAX + 1];
    if (has_with)
        snprintf(bare_with, sizeof(bare_with), "%.*s", (int)rt_jid_bare_len(&with.jid), with.jid.s);
    char user[RT_JID_PART_MAX + 1];
    snprintf(user, sizeof(user), "%.*s", (int)c->jid->local, rt_jid_local(c->jid));
    if (rt__c2s_mam_ask(rt__c2s.conf->hosts[c->host], user, &q, rt_xml_attr(iq, "id"),
                        rt_xml_attr(qel, "queryid"), c->jid->s, rt_xml_attr(iq, "to"),
                        has_with ? bare_with : NULL) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
}

void rt__c2s_mam_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                    bool get)
{
    if (!rt__c2s_mam_on(c)) { /* no account to keep one for, or archiving is off */
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable");
        return;
    }
    if (strcmp(q->name, "prefs") == 0)
        prefs(self, c, iq, q, get);
    else if (strcmp(q->name, "query") != 0)
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
    else if (get)
        form(self, c, iq);
    else
        query(self, c, iq, q);
}

void rt__c2s_mam_features(rt_buf_t *b, const c2s_t *c)
{
    if (rt__c2s_mam_on(c))
        rt_buf_printf(b, "<feature var='%s'/><feature var='%s'/>", NS_MAM, NS_SID);
}

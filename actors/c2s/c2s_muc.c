/*
** Group chat (XEP-0045): the MUC service. A host's service lives at xmpp.muc_host with @HOST@
** replaced by the host ("conference.example.org"). Each room is an actor of its own
** (c2s_muc_room.c), registered under "muc:" and its bare JID: a session routing a stanza to a
** room finds it by name, and a join to a room that is not there spawns it under that name, so
** two joins racing to make one room meet at the runtime's registry and one of them wins. The
** service's own actor answers what is addressed to the service domain (disco#info, and
** disco#items: the public rooms, which each room reports to it as it changes).
**
** Rooms and the service read the stanzas the sessions wrote for them with the same XML parser
** as a session (a stream whose header is made up once), on their own heaps.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"
#include "xeps.h"

#define ROOM_NAME_PREFIX "muc:"
#define ROOM_NAME_MAX 255 /* the runtime's name registry's bound on a name */

int rt__c2s_muc_index(const char *domain, size_t len)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    for (unsigned i = 0; x && x->muc_host[0] && i < x->nhosts; i++)
        if (strlen(rt__c2s.muc[i]) == len && memcmp(rt__c2s.muc[i], domain, len) == 0)
            return (int)i;
    return -1;
}

/* ---- The parser rooms and the service share ---- */

static int muc_header(void *ctx, const rt_xml_el_t *hdr, const rt_xml_ns_t *ns, size_t nns)
{
    (void)ctx, (void)hdr, (void)ns, (void)nns;
    return 0;
}

static int muc_stanza(void *ctx, rt_xml_el_t *el)
{
    c2s_muc_parse_t *p = ctx;
    return p->on_stanza(ctx, el);
}

static int muc_close(void *ctx)
{
    (void)ctx;
    return RT_XML_STOP;
}

/* The sessions' stream settings (their allocator on the running actor's heap, their bounds),
   with the callbacks of the rooms and the service: made at start. */
static rt_xml_stream_config_t parse_config;

static const char stream_header[] = "<stream:stream xmlns='" RT_XML_NS_CLIENT
                                    "' xmlns:stream='" RT_XML_NS_STREAMS "' version='1.0'>";

int rt__c2s_muc_parse_init(c2s_muc_parse_t *p)
{
    int rc = rt_xml_stream_init(&p->xs, &parse_config, p);
    if (!rc)
        rc = rt_xml_stream_feed(&p->xs, stream_header, sizeof(stream_header) - 1, NULL);
    return rc;
}

int rt__c2s_muc_parse(c2s_muc_parse_t *p, const void *data, size_t len)
{
    int rc = rt_xml_stream_feed(&p->xs, data, len, NULL);
    if (rc == RT_EPROTO || rt_xml_stream_busy(&p->xs)) {
        /* Sessions write whole, well-formed stanzas; one that is not (cut short by a bound)
           must not leave the next one parsed inside it. */
        rt_xml_stream_destroy(&p->xs);
        int again = rt__c2s_muc_parse_init(p);
        return again ? again : RT_EPROTO;
    }
    return rc;
}

void rt__c2s_muc_free(rt_xml_el_t *el)
{
    rt_xml_free(&parse_config.alloc, NULL, el);
}

/* ---- Routing from a session ---- */

static bool room_name(const rt_jid_t *to, char out[ROOM_NAME_MAX + 1])
{
    size_t len = rt_jid_bare_len(to);
    if (sizeof(ROOM_NAME_PREFIX) - 1 + len > ROOM_NAME_MAX)
        return false;
    memcpy(out, ROOM_NAME_PREFIX, sizeof(ROOM_NAME_PREFIX) - 1);
    memcpy(out + sizeof(ROOM_NAME_PREFIX) - 1, to->s, len);
    out[sizeof(ROOM_NAME_PREFIX) - 1 + len] = 0;
    return true;
}

/* ---- Who made which rooms (xmpp.muc_max_rooms_per_user) ---- */

/*
** The rooms each user made that still exist, by bare JID: a chained table of fixed size under
** one lock, taken once when a room is made and once when it ends. Its entries are at most the
** users with rooms, and rooms are bounded (muc_max_rooms), so chains stay short.
*/
#define MAKERS 1024
typedef struct maker_s {
    struct maker_s *next;
    uint32_t rooms;
    uint32_t len;
    char bare[];
} maker_t;
static maker_t *makers[MAKERS];
static pthread_mutex_t makers_lock = PTHREAD_MUTEX_INITIALIZER;

static maker_t **maker_slot(const char *bare, size_t len)
{
    maker_t **p = &makers[rt_hash(bare, len) % MAKERS];
    while (*p && !((*p)->len == len && memcmp((*p)->bare, bare, len) == 0))
        p = &(*p)->next;
    return p;
}

bool rt__c2s_muc_maker_take(const char *bare, size_t len, bool force)
{
    pthread_mutex_lock(&makers_lock);
    maker_t **p = maker_slot(bare, len);
    bool ok = true;
    if (!*p && (*p = malloc(sizeof(maker_t) + len)) != NULL) {
        **p = (maker_t){.len = (uint32_t)len};
        memcpy((*p)->bare, bare, len);
    }
    if (!*p || (!force && (*p)->rooms >= (uint32_t)rt__c2s.conf->muc_max_rooms_per_user))
        ok = false;
    else
        (*p)->rooms++;
    if (*p && (*p)->rooms == 0) { /* made for a refusal: not kept */
        maker_t *m = *p;
        *p = m->next;
        free(m);
    }
    pthread_mutex_unlock(&makers_lock);
    return ok;
}

void rt__c2s_muc_maker_give(const char *bare, size_t len)
{
    pthread_mutex_lock(&makers_lock);
    maker_t **p = maker_slot(bare, len), *m = *p;
    if (m && --m->rooms == 0) {
        *p = m->next;
        free(m);
    }
    pthread_mutex_unlock(&makers_lock);
}

/* Why no room could be had for a join. */
enum { NO_ROOM = 0, NO_ROOM_NODE, NO_ROOM_USER };

/*
** The room's actor; a join (maker: the joiner's bare JID) spawns it when there is none. 0 when
** there is none (*why: the bound that refused making it).
*/
static rt_pid_t room_pid(const char *name, const char *maker, int *why)
{
    rt_pid_t pid = rt_whereis(name);
    *why = NO_ROOM;
    if (pid || !maker)
        return pid;
    if (atomic_load_explicit(&rt_c2s_stats.muc_rooms, memory_order_relaxed) >=
        (uint64_t)rt__c2s.conf->muc_max_rooms) {
        *why = NO_ROOM_NODE;
        return 0;
    }
    if (!rt__c2s_muc_maker_take(maker, strlen(maker), false)) {
        *why = NO_ROOM_USER;
        return 0;
    }
    rt_spawn_opts_t o = {.name = name};
    c2s_room_arg_t arg = {.jid = name + sizeof(ROOM_NAME_PREFIX) - 1, .maker = maker};
    int rc = rt_spawn_opt(&rt__c2s_room_type, &arg, &o, &pid);
    if (rc) /* the room gives its maker's count back as it ends: this one never started */
        rt__c2s_muc_maker_give(maker, strlen(maker));
    if (rc == RT_EEXIST) /* another join made it first */
        pid = rt_whereis(name);
    else if (rc)
        pid = 0;
    return pid;
}

static bool is_join(const rt_xml_el_t *el)
{
    return strcmp(el->name, "presence") == 0 && !rt_xml_attr(el, "type");
}

/* Sends bytes to the room named, made by a join (maker: the joiner) if need be; a room that
   ended between the lookup and the send is looked for (or made) once more. from (not 0): as
   that actor's (the room answers the sender, and takes it as the occupant), else the caller's. */
static bool to_room(const char *name, const char *maker, const void *p, size_t n, rt_pid_t from,
                    int *why)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        rt_pid_t pid = room_pid(name, maker, why);
        if (!pid)
            return false;
        rt_msg_t *m = rt_msg_new(C2S_MSG_MUC, n);
        if (!m)
            return false;
        memcpy(m->data, p, n);
        m->from = from;
        if ((from ? rt_forward(pid, m) : rt_send_msg(pid, m)) == 0)
            return true;
    }
    return false;
}

void rt__c2s_muc_route(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                       const rt_buf_t *bytes)
{
    if (bytes->oom) {
        rt__c2s_stanza_error(self, c, el, "wait", "resource-constraint");
        return;
    }
    if (rt__c2s_home_elsewhere()) {
        /* The rooms are the home node's: there, as this session's proxy's (c2s_cluster.c). */
        rt_msg_t *m = rt_msg_new(to->local ? C2S_MSG_STANZA : C2S_MSG_MUC, bytes->len);
        if (m)
            memcpy(m->data, bytes->data, bytes->len);
        if (!m ||
            rt__c2s_call_home(to->local ? C2S_TO_ROOM : C2S_TO_MUC_SERVICE, rt_self(self), m) != 0)
            rt__c2s_stanza_error(self, c, el, "wait", "resource-constraint");
        return;
    }
    const char *type = rt_xml_attr(el, "type");
    bool presence = strcmp(el->name, "presence") == 0;
    if (!to->local) {
        rt_pid_t service = rt_whereis(RT_C2S_MUC_NAME);
        if (presence || (service && rt_send(service, C2S_MSG_MUC, bytes->data, bytes->len) == 0))
            return;
        rt__c2s_stanza_error(self, c, el, "cancel", "service-unavailable");
        return;
    }
    char name[ROOM_NAME_MAX + 1];
    if (!room_name(to, name)) {
        rt__c2s_stanza_error(self, c, el, "modify", "jid-malformed");
        return;
    }
    bool join = is_join(el) && to->resource;
    char maker[RT_JID_TEXT_MAX + 1];
    snprintf(maker, sizeof(maker), "%.*s", (int)rt_jid_bare_len(c->jid), c->jid->s);
    int why;
    if (to_room(name, join ? maker : NULL, bytes->data, bytes->len, 0, &why))
        return;
    if (presence) {
        /* XEP-0045 7.2.1: a join names a nick; an unavailable or an error to a room that is
           not there has nothing to do. */
        if (!type && !to->resource)
            rt__c2s_stanza_error(self, c, el, "modify", "jid-malformed");
        else if (join && why == NO_ROOM_USER) /* not allowed to make one more room */
            rt__c2s_stanza_error(self, c, el, "cancel", "not-allowed");
        else if (join) {
            atomic_fetch_add_explicit(&rt_c2s_stats.muc_rooms_refused, 1, memory_order_relaxed);
            rt__c2s_stanza_error(self, c, el, "wait", "resource-constraint");
        }
        return;
    }
    if (!type || strcmp(type, "result") != 0)
        rt__c2s_stanza_error(self, c, el, "cancel", "item-not-found"); /* none about errors */
}

int rt__c2s_muc_post(const rt_jid_t *room, const char *nick, const char *body, size_t len)
{
    char name[ROOM_NAME_MAX + 1];
    if (!room_name(room, name))
        return RT_EINVAL;
    if (rt__c2s_home_elsewhere()) { /* data: the room's JID and the nick, NUL-ended, the body */
        size_t rlen = rt_jid_bare_len(room), nlen = strlen(nick);
        rt_msg_t *m = rt_msg_new(C2S_MSG_MUC_POST, rlen + 1 + nlen + 1 + len);
        if (!m)
            return RT_ENOMEM;
        memcpy(m->data, room->s, rlen);
        m->data[rlen] = 0;
        memcpy(m->data + rlen + 1, nick, nlen + 1);
        memcpy(m->data + rlen + 1 + nlen + 1, body, len);
        return rt__c2s_call_home(C2S_TO_ROOM_POST, rt__c2s_current_pid(), m);
    }
    rt_pid_t pid = rt_whereis(name);
    size_t nlen = strlen(nick);
    rt_msg_t *m = pid ? rt_msg_new(C2S_MSG_MUC_POST, nlen + 1 + len) : NULL;
    if (!m)
        return pid ? RT_ENOMEM : RT_ENOTFOUND;
    memcpy(m->data, nick, nlen + 1);
    memcpy(m->data + nlen + 1, body, len);
    return rt_send_msg(pid, m) == 0 ? 0 : RT_ENOTFOUND;
}

void rt__c2s_muc_post_bytes(const uint8_t *p, size_t len)
{
    const char *room = (const char *)p;
    size_t rlen = strnlen(room, len),
           nlen = rlen < len ? strnlen(room + rlen + 1, len - rlen - 1) : 0;
    rt_jid_buf_t jb;
    if (rlen + 1 + nlen >= len || rt_jid_prep(room, rlen, &jb, NULL) != 0 ||
        rt__c2s_muc_post(&jb.jid, room + rlen + 1, room + rlen + 1 + nlen + 1,
                         len - rlen - nlen - 2) != 0)
        atomic_fetch_add_explicit(&rt_c2s_stats.muc_dropped, 1, memory_order_relaxed);
}

bool rt__c2s_muc_reroute(rt_msg_t *m, bool may_make)
{
    char to[RT_JID_TEXT_MAX + 1];
    int tlen = rt__c2s_first_tag_attr(m->data, m->len, "to", to, sizeof(to));
    rt_jid_buf_t jb;
    char name[ROOM_NAME_MAX + 1];
    bool presence = m->len > 9 && memcmp(m->data, "<presence", 9) == 0;
    char type[16];
    bool join = presence && rt__c2s_first_tag_attr(m->data, m->len, "type", type, sizeof(type)) < 0;
    char from[RT_JID_TEXT_MAX + 1];
    int flen = rt__c2s_first_tag_attr(m->data, m->len, "from", from, sizeof(from));
    char *slash = flen > 0 ? strchr(from, '/') : NULL;
    if (slash)
        *slash = 0; /* the joiner's bare JID: the room's maker, if it makes one */
    int why;
    if (tlen > 0 && rt_jid_prep(to, (size_t)tlen, &jb, NULL) == 0 && room_name(&jb.jid, name) &&
        to_room(name, may_make && join && jb.jid.resource && flen > 0 ? from : NULL, m->data,
                m->len, m->from, &why))
        return true;
    if (m->len > 3 && memcmp(m->data, "<iq", 3) == 0)
        rt__c2s_iq_unanswered(m->data, m->len);
    else if (!presence)
        atomic_fetch_add_explicit(&rt_c2s_stats.muc_dropped, 1, memory_order_relaxed);
    return false;
}

/* ---- The service's actor ---- */

typedef struct listed_s {
    char *jid; /* heap: the room's bare JID, NUL, its name */
    uint32_t occupants;
} listed_t;

typedef struct service_s {
    c2s_muc_parse_t parse; /* first: the parser's ctx */
    listed_t *rooms;       /* the public rooms, for disco#items */
    size_t nrooms, cap;
    rt_pid_t from;
} service_t;

static void service_reply(rt_pid_t to, rt_buf_t *b)
{
    if (!b->oom)
        rt__c2s_send_bytes(to, b);
    rt_buf_free(b);
}

static void service_iq(service_t *s, const rt_xml_el_t *iq)
{
    const char *type = rt_xml_attr(iq, "type"), *from = rt_xml_attr(iq, "from"),
               *to = rt_xml_attr(iq, "to");
    if (!type || !from || !to || (strcmp(type, "get") != 0 && strcmp(type, "set") != 0))
        return;
    const rt_xml_el_t *q = rt_xml_first(iq);
    rt_buf_t b = {0};
    bool get = strcmp(type, "get") == 0;
    if (q && get && strcmp(q->ns, "http://jabber.org/protocol/disco#info") == 0) {
        rt_buf_printf(&b, "<iq xmlns='%s' type='result'", RT_XML_NS_CLIENT);
        rt_xml_put_attr(&b, "id", rt_xml_attr(iq, "id"));
        rt_xml_put_attr(&b, "from", to);
        rt_xml_put_attr(&b, "to", from);
        rt_buf_printf(&b,
                      "><query xmlns='http://jabber.org/protocol/disco#info'>"
                      "<identity category='conference' type='text' name='Chatrooms'/>"
                      "<feature var='http://jabber.org/protocol/disco#info'/>"
                      "<feature var='http://jabber.org/protocol/disco#items'/>"
                      "<feature var='%s'/><feature var='urn:xmpp:ping'/></query></iq>",
                      NS_MUC);
    } else if (q && get && strcmp(q->ns, "http://jabber.org/protocol/disco#items") == 0) {
        rt_buf_printf(&b, "<iq xmlns='%s' type='result'", RT_XML_NS_CLIENT);
        rt_xml_put_attr(&b, "id", rt_xml_attr(iq, "id"));
        rt_xml_put_attr(&b, "from", to);
        rt_xml_put_attr(&b, "to", from);
        rt_buf_printf(&b, "><query xmlns='http://jabber.org/protocol/disco#items'>");
        size_t dlen = strlen(to);
        for (size_t i = 0; i < s->nrooms; i++) {
            const char *jid = s->rooms[i].jid, *at = strchr(jid, '@');
            if (!at || strcmp(at + 1, to) != 0 || dlen == 0)
                continue; /* another host's service */
            rt_xml_put_start(&b, "item");
            rt_xml_put_attr(&b, "jid", jid);
            const char *name = jid + strlen(jid) + 1;
            rt_xml_put_attr(&b, "name", *name ? name : jid);
            rt_xml_put_empty_end(&b);
        }
        rt_buf_printf(&b, "</query></iq>");
    } else if (q && get && strcmp(q->ns, "urn:xmpp:ping") == 0) {
        rt_buf_printf(&b, "<iq xmlns='%s' type='result'", RT_XML_NS_CLIENT);
        rt_xml_put_attr(&b, "id", rt_xml_attr(iq, "id"));
        rt_xml_put_attr(&b, "from", to);
        rt_xml_put_attr(&b, "to", from);
        rt_xml_put_empty_end(&b);
    } else {
        rt__c2s_put_error(&b, iq, to, from, "cancel", "service-unavailable");
        rt_buf_printf(&b, "</error></iq>");
    }
    service_reply(s->from, &b);
}

static int service_stanza(void *ctx, rt_xml_el_t *el)
{
    service_t *s = ctx;
    if (strcmp(el->name, "iq") == 0) {
        service_iq(s, el);
    } else if (strcmp(el->name, "message") == 0) {
        const char *type = rt_xml_attr(el, "type");
        if (!type || strcmp(type, "error") != 0) {
            rt_buf_t b = {0};
            rt__c2s_put_error(&b, el, rt_xml_attr(el, "to"), rt_xml_attr(el, "from"), "cancel",
                              "service-unavailable");
            rt_buf_printf(&b, "</error></message>");
            service_reply(s->from, &b);
        }
    }
    rt__c2s_muc_free(el);
    return 0;
}

static void service_info(rt_actor_t *self, service_t *s, const rt_msg_t *m)
{
    c2s_muc_info_t info;
    if (m->len < sizeof(info))
        return;
    memcpy(&info, m->data, sizeof(info));
    if (m->len != sizeof(info) + info.jid_len + info.name_len)
        return;
    const char *jid = (const char *)m->data + sizeof(info);
    size_t i = 0;
    while (i < s->nrooms && !(strlen(s->rooms[i].jid) == info.jid_len &&
                              memcmp(s->rooms[i].jid, jid, info.jid_len) == 0))
        i++;
    if (i < s->nrooms) {
        rt_free(self, s->rooms[i].jid);
        s->rooms[i] = s->rooms[--s->nrooms];
    }
    if (!info.listed)
        return;
    if (rt_grow_on(self, &s->rooms, &s->cap, s->nrooms + 1, sizeof(listed_t), 16, RT_OBJ_SCAN))
        return;
    char *copy = rt_alloc(self, (size_t)info.jid_len + info.name_len + 2, RT_OBJ_LEAF);
    if (!copy)
        return;
    memcpy(copy, jid, info.jid_len);
    memcpy(copy + info.jid_len + 1, jid + info.jid_len, info.name_len);
    s->rooms[s->nrooms++] = (listed_t){.jid = copy, .occupants = info.occupants};
}

static int service_init(rt_actor_t *self, void *state, void *arg)
{
    (void)self, (void)arg;
    service_t *s = state;
    s->parse.on_stanza = service_stanza;
    return rt__c2s_muc_parse_init(&s->parse);
}

static void service_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    service_t *s = state;
    if (m->tag == C2S_MSG_MUC) {
        s->from = m->from;
        rt__c2s_muc_parse(&s->parse, m->data, m->len);
    } else if (m->tag == C2S_MSG_MUC_INFO) {
        service_info(self, s, m);
    }
}

static void service_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self, (void)reason;
    service_t *s = state;
    rt_xml_stream_destroy(&s->parse.xs);
}

static const rt_actor_type_t service_type = {
    .name = "xmpp_muc",
    .state_size = sizeof(service_t),
    .init = service_init,
    .handle = service_handle,
    .terminate = service_terminate,
};

/* A persistent room kept in xmpp.db, made again (empty) at start. */
static void restore(const char *service, const char *room, const void *state, size_t len, void *arg)
{
    (void)arg;
    char name[ROOM_NAME_MAX + 1];
    int n = snprintf(name, sizeof(name), ROOM_NAME_PREFIX "%s@%s", room, service);
    if (n < 0 || (size_t)n >= sizeof(name) || rt__c2s_muc_index(service, strlen(service)) < 0) {
        rt_log(RT_LOG_WARNING, "xmpp.muc_room_skipped",
               "room=%s@%s kept in xmpp.db, its service not in xmpp.muc_host now", room, service);
        return;
    }
    rt_spawn_opts_t o = {.name = name};
    c2s_room_arg_t a = {.jid = name + sizeof(ROOM_NAME_PREFIX) - 1,
                        .state = state,
                        .state_len = len,
                        .restored = true};
    rt_pid_t pid;
    int rc = rt_spawn_opt(&rt__c2s_room_type, &a, &o, &pid);
    if (rc)
        rt_log(RT_LOG_ERROR, "xmpp.muc_room_not_restored", "room=%s@%s error=%s", room, service,
               rt_strerror(rc));
}

int rt__c2s_muc_start(rt_pid_t group, const char *data_dir, char *err, size_t errlen)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    if (!x->muc_host[0])
        return 0;
    parse_config = rt__c2s.stream_tcp;
    parse_config.on_header = muc_header;
    parse_config.on_stanza = muc_stanza;
    parse_config.on_close = muc_close;
    int rc = rt__c2s_service_domains("xmpp.muc_host", x->muc_host, rt__c2s.muc, err, errlen);
    if (rc)
        return rc;
    rt_child_spec_t c = {.name = RT_C2S_MUC_NAME, .type = &service_type, .restart = RT_PERMANENT};
    rc = rt_supervisor_start_child(group, &c, NULL);
    if (rc) {
        snprintf(err, errlen, "cannot start the MUC service: %s", rt_strerror(rc));
        return rc;
    }
    rt_accounts_t *a;
    if (rt__c2s_accounts_open(data_dir, &a, "xmpp.muc_rooms_not_read") != 0) {
        snprintf(err, errlen, "cannot read the persistent rooms in %s", data_dir);
        return RT_EAGAIN;
    }
    rc = rt_muc_rooms_each(a, restore, NULL);
    rt_accounts_close(a);
    if (rc)
        snprintf(err, errlen, "cannot read the persistent rooms in %s", data_dir);
    return rc;
}

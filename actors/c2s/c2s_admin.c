/*
** What administrators ask of the c2s layer (c2s.h, `rtctl xmpp sessions|show|kick`): the
** bound sessions from the registry, a session's own account of itself (an RT_MSG_C2S_INFO
** answer to a query message, as a connection actor answers RT_CONN_MSG_QUERY: what only the
** actor knows, its peer, listener, stream and roster, is read by the actor itself), and the
** administrative end of a session.
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"

typedef struct {
    rt_pid_t reply_to;
    uint64_t cookie;
} query_t;

typedef struct {
    void (*fn)(const rt_c2s_session_t *s, void *arg);
    void *arg;
} walk_t;

static void each_binding(const char *bare, size_t bare_len, const char *res, size_t res_len,
                         const c2s_route_t *r, void *arg)
{
    const walk_t *w = arg;
    rt_c2s_session_t s = {.bare = bare,
                          .resource = res,
                          .bare_len = bare_len,
                          .res_len = res_len,
                          .pid = r->pid,
                          .priority = r->priority,
                          .available = r->available};
    w->fn(&s, w->arg);
}

void rt_c2s_sessions(void (*fn)(const rt_c2s_session_t *s, void *arg), void *arg)
{
    walk_t w = {.fn = fn, .arg = arg};
    rt__c2s_reg_each_local(each_binding, &w);
}

int rt_c2s_query(rt_pid_t session, rt_pid_t reply_to, uint64_t cookie)
{
    query_t q = {.reply_to = reply_to, .cookie = cookie};
    return rt_send(session, C2S_MSG_QUERY, &q, sizeof(q));
}

int rt_c2s_kick(rt_pid_t session)
{
    return rt_send(session, C2S_MSG_KICK, NULL, 0);
}

/* The packed roster's entries (c2s_roster.c): C2S_ENTRY_HEAD bytes and the JID's, each. */
static uint32_t roster_items(const c2s_t *c)
{
    uint32_t n = 0;
    for (size_t at = 0; at + C2S_ENTRY_HEAD <= c->roster_len; n++)
        at += C2S_ENTRY_HEAD + ((size_t)c->roster[at + 1] | (size_t)c->roster[at + 2] << 8);
    return n;
}

/*
** Answers with what the session holds. The peer is formatted into the answer, not through
** rt__c2s_peer, which would keep the text on the session's heap: an administrator's look
** should not cost the session memory.
*/
void rt__c2s_on_query(rt_actor_t *self, c2s_t *c, const rt_msg_t *m)
{
    if (m->len < sizeof(query_t))
        return;
    query_t q;
    memcpy(&q, m->data, sizeof(q));
    size_t jid_len = c->jid ? rt_jid_len(c->jid) : 0;
    size_t sid_len = strlen(c->stream_id);
    rt_msg_t *a = rt_msg_new(RT_MSG_C2S_INFO, sizeof(rt_c2s_info_t) + jid_len + sid_len + 2);
    if (!a)
        return; /* the asker times out, as if this session had ended */
    rt_c2s_info_t *i = (rt_c2s_info_t *)(void *)a->data;
    memset(i, 0, sizeof(*i));
    i->cookie = q.cookie;
    i->pid = rt_self(self);
    uint64_t now = rt_mono_ms();
    i->idle_ms = now > c->last_rx_ms ? now - c->last_rx_ms : 0;
    i->roster_items = roster_items(c);
    i->roster_bytes = c->roster_len;
    rt_actor_info_t ai;
    if (rt_actor_info(rt_self(self), &ai) == 0)
        i->mailbox_len = ai.mailbox_len;
    i->listener = RT_CONF_XMPP_LISTENER(c->listener);
    i->priority = c->priority;
    i->bound = c->phase == PH_ACTIVE;
    i->available = c->available;
    i->secure = c->secure;
    i->roster_loaded = c->roster_loaded;
    i->interested = c->interested;
    i->detached = !c->sock;
    if (c->sock)
        rt_xport_peer_format(c->xp, rt_sock_fd(c->sock), i->peer, sizeof(i->peer));
    i->jid_len = (uint16_t)jid_len;
    i->stream_len = (uint16_t)sid_len;
    char *text = (char *)(i + 1);
    if (jid_len)
        memcpy(text, c->jid->s, jid_len);
    text[jid_len] = 0;
    if (sid_len)
        memcpy(text + jid_len + 1, c->stream_id, sid_len);
    text[jid_len + 1 + sid_len] = 0;
    rt_send_msg(q.reply_to, a);
}

const rt_c2s_info_t *rt_c2s_info_of(const rt_msg_t *m)
{
    if (!m || m->tag != RT_MSG_C2S_INFO || m->len < sizeof(rt_c2s_info_t))
        return NULL;
    const rt_c2s_info_t *i = (const rt_c2s_info_t *)(const void *)m->data;
    size_t need = sizeof(*i) + (size_t)i->jid_len + i->stream_len + 2;
    const char *text = rt_c2s_info_jid(i);
    if (m->len < need || text[i->jid_len] || text[i->jid_len + 1 + i->stream_len] ||
        i->peer[sizeof(i->peer) - 1])
        return NULL;
    return i;
}

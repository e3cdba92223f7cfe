/*
** What administrators ask of a client actor (broker.h, conn.h): its counters and
** subscriptions (an RT_MSG_CLIENT_INFO answer, and the functions that read one), an
** administrative disconnect, and the recheck of its subscriptions after the ACL changed.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "conn_impl.h"
#include "log.h"
#include "store.h"

typedef struct {
    rt_pid_t reply_to;
    uint64_t cookie;
    bool with_subs;
} query_t;

/* One subscription in an RT_MSG_CLIENT_INFO answer (layout in broker.h). */
#define SUB_ENTRY_HEAD 8 /* uint32 sub_id, uint16 filter_len, uint8 qos, uint8 flags */
#define SUB_FLAG_NO_LOCAL 1u
#define SUB_FLAG_RAP 2u
#define SUB_RH_SHIFT 2
#define SUB_FLAG_EXCLUSIVE 16u

static size_t sub_entry_size(const sub_entry_t *e)
{
    return SUB_ENTRY_HEAD + e->len + 1;
}

static void info_copy_text(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void client_info_fill(rt_actor_t *self, const conn_t *c, rt_client_info_t *ci)
{
    ci->pid = rt_self(self);
    ci->version = c->version;
    ci->connected = c->connected;
    ci->clean_start = c->clean_start;
    ci->keepalive = c->keepalive;
    ci->session_expiry = c->session_expiry;
    if (c->connected) {
        ci->connected_at_ms = c->connected_at_ms;
    } else if (!c->sock && c->client_id) {
        uint64_t now = rt_mono_ms();
        ci->expires_in_ms = c->expire_at_ms > now ? c->expire_at_ms - now : 0;
    }
    ci->subscriptions = c->nsubs;
    ci->inflight_window = rt__conn_send_window(c);
    if (c->sess) {
        ci->inflight = c->sess->inflight.n;
        ci->queued = c->sess->queued.n;
        ci->queued_bytes = c->sess->queued.bytes;
        ci->dropped_owed = c->sess->dropped_owed;
        ci->acl_denied_publish = c->sess->acl_denied[RT_ACL_DENIED_PUBLISH];
        ci->acl_denied_subscribe = c->sess->acl_denied[RT_ACL_DENIED_SUBSCRIBE];
    }
    ci->dropped = c->dropped;
    rt_actor_info_t ai;
    if (rt_actor_info(rt_self(self), &ai) == 0)
        ci->mailbox_len = ai.mailbox_len;
    ci->has_username = c->username != NULL;
    size_t idlen = c->client_id ? strlen(c->client_id) : 0;
    ci->client_id_len = (uint16_t)(idlen < UINT16_MAX ? idlen : UINT16_MAX);
    info_copy_text(ci->client_id, sizeof(ci->client_id), c->client_id);
    info_copy_text(ci->username, sizeof(ci->username), c->username);
    /* Formatted here, not through peer_text: that would keep the text for the connection's
       lifetime, and one look by an administrator should not cost the client memory. */
    if (c->sock && c->connected) {
        rt__conn_peer_format(c, ci->peer, sizeof(ci->peer));
        snprintf(ci->transport, sizeof(ci->transport), "%s", rt_listener_kind(c->listener));
    }
    ci->rate_limited = rt_xport_rate_limited(rt__conn_xp(c));
}

/* Answers with the counters and, if asked, the subscriptions (layout in broker.h). */
void rt__conn_on_query(rt_actor_t *self, conn_t *c, const rt_msg_t *msg)
{
    if (msg->len < sizeof(query_t))
        return;
    const query_t *q = (const query_t *)(const void *)msg->data;
    size_t nsubs = 0, bytes = 0;
    while (q->with_subs && nsubs < c->nsubs &&
           bytes + sub_entry_size(&c->subs[nsubs]) <= RT_CLIENT_INFO_SUBS_MAX)
        bytes += sub_entry_size(&c->subs[nsubs++]);
    rt_msg_t *m = rt_msg_new(RT_MSG_CLIENT_INFO, sizeof(rt_client_info_t) + bytes);
    if (!m)
        return; /* the asker times out, as if this actor had gone */
    rt_client_info_t *ci = (rt_client_info_t *)(void *)m->data;
    memset(ci, 0, sizeof(*ci));
    ci->cookie = q->cookie;
    client_info_fill(self, c, ci);
    ci->subs_included = (uint32_t)nsubs;
    uint8_t *p = m->data + sizeof(*ci);
    for (size_t i = 0; i < nsubs; i++) {
        const sub_entry_t *e = &c->subs[i];
        uint16_t flen = (uint16_t)e->len;
        uint8_t flags = (uint8_t)((e->no_local ? SUB_FLAG_NO_LOCAL : 0) |
                                  (e->retain_as_published ? SUB_FLAG_RAP : 0) |
                                  (e->retain_handling << SUB_RH_SHIFT) |
                                  (e->exclusive ? SUB_FLAG_EXCLUSIVE : 0));
        memcpy(p, &e->sub_id, 4);
        memcpy(p + 4, &flen, 2);
        p[6] = e->qos;
        p[7] = flags;
        memcpy(p + SUB_ENTRY_HEAD, e->filter, e->len);
        p[SUB_ENTRY_HEAD + e->len] = 0;
        p += sub_entry_size(e);
    }
    rt_send_msg(q->reply_to, m);
}

/*
** The session ends here whatever its expiry: the exit runs the actor's terminate, which
** publishes the will, removes the subscriptions and deletes the stored session,
** as for any session that ends (a non-normal reason keeps rt__conn_close from
** taking the session offline).
*/
void rt__conn_on_kick(rt_actor_t *self, conn_t *c)
{
    rt_log(RT_LOG_INFO, "client.kicked", "client=%s state=%s", c->client_id ? c->client_id : "-",
           c->connected ? "connected"
           : c->sock    ? "connecting"
                        : "offline");
    if (c->sock && !c->closing) {
        rt__conn_close(self, c, MQTT_RC_ADMIN_ACTION, RT_REASON_KICKED);
        return;
    }
    c->closing = 1;
    rt_exit(self, RT_REASON_KICKED);
}

/*
** The ACL was replaced (a reload, or acl_file set): subscriptions it no longer
** allows end here, as if the client had unsubscribed, without telling the
** client (MQTT has no server-side UNSUBSCRIBE), and the others learn whether
** their deliveries must be checked now (acl.h). Checked once per reload, so a
** subscription the ACL allows whole takes no ACL lookup per delivery. What
** was queued for the session before stays queued. A session restored from the
** store whose client has not come back (version 0) is skipped: which user it
** logged in as is not kept, and its client's next SUBSCRIBE is checked anyway.
*/
void rt__conn_on_acl_recheck(rt_actor_t *self, conn_t *c)
{
    if (!c->version || !c->client_id)
        return;
    for (size_t i = 0; i < c->nsubs;) {
        sub_entry_t *e = &c->subs[i];
        mqtt_str_t seen = {(const uint8_t *)e->filter, e->len}; /* as the client named it */
        rt__conn_unmount(c, &seen);
        int acl = rt__conn_acl(c, seen.p, seen.len, RT_ACL_SUBSCRIBE);
        if (acl == RT_ACL_DENY) {
            rt_log(RT_LOG_INFO, "client.acl_revoked", "client=%s filter=%.*s", c->client_id,
                   (int)e->len, e->filter);
            /* The list's last entry moves to i, which is looked at next. */
            rt__conn_sub_drop(self, c, (const uint8_t *)e->filter, e->len);
            continue;
        }
        bool check = acl == RT_ACL_FILTERED;
        if (e->acl_check != check) {
            e->acl_check = check;
            rt_trie_opts_t o = rt__conn_sub_opts(e);
            /* An offline member is out of its shared groups; it rejoins with these options. */
            if (c->sock || !rt_topic_is_shared(e->filter, e->len))
                rt_trie_subscribe(rt_broker->trie, e->filter, e->len, rt_self(self), &o, NULL);
            if (c->stored)
                rt_store_sub(c->client_id, e->filter, e->len, &o);
        }
        i++;
    }
}

int rt_broker_recheck_acl(size_t *asked)
{
    if (asked)
        *asked = 0;
    if (!rt_broker)
        return 0; /* no broker, no clients */
    rt_pid_t *pids;
    size_t n;
    int rc = rt_broker_client_pids(0, &pids, &n);
    if (rc)
        return rc;
    size_t sent = 0;
    for (size_t i = 0; i < n; i++)
        sent += rt_send(pids[i], RT_CONN_MSG_ACL_RECHECK, NULL, 0) == 0;
    free(pids);
    if (asked)
        *asked = sent;
    return 0;
}

int rt_client_query(rt_pid_t conn, rt_pid_t reply_to, uint64_t cookie, bool with_subs)
{
    query_t q = {.reply_to = reply_to, .cookie = cookie, .with_subs = with_subs};
    return rt_send(conn, RT_CONN_MSG_QUERY, &q, sizeof(q));
}

int rt_client_kick(rt_pid_t conn)
{
    return rt_send(conn, RT_CONN_MSG_KICK, NULL, 0);
}

const rt_client_info_t *rt_client_info_of(const rt_msg_t *m)
{
    if (!m || m->tag != RT_MSG_CLIENT_INFO || m->len < sizeof(rt_client_info_t))
        return NULL;
    return (const rt_client_info_t *)(const void *)m->data;
}

bool rt_client_info_subs_next(const rt_msg_t *m, size_t *pos, rt_client_sub_t *out)
{
    if (!rt_client_info_of(m))
        return false;
    size_t off = sizeof(rt_client_info_t) + *pos;
    if (off + SUB_ENTRY_HEAD > m->len)
        return false;
    const uint8_t *p = m->data + off;
    uint16_t flen;
    memcpy(&flen, p + 4, 2);
    if (off + SUB_ENTRY_HEAD + flen + 1 > m->len || p[SUB_ENTRY_HEAD + flen] != 0)
        return false;
    memset(out, 0, sizeof(*out));
    memcpy(&out->sub_id, p, 4);
    out->qos = p[6];
    out->no_local = (p[7] & SUB_FLAG_NO_LOCAL) != 0;
    out->retain_as_published = (p[7] & SUB_FLAG_RAP) != 0;
    out->retain_handling = (uint8_t)((p[7] >> SUB_RH_SHIFT) & 3);
    out->exclusive = (p[7] & SUB_FLAG_EXCLUSIVE) != 0;
    rt_topic_filter_t sf;
    if (rt_topic_parse_filter((const char *)p + SUB_ENTRY_HEAD, flen, &sf))
        return false;
    out->group = sf.group;
    out->group_len = sf.group_len;
    out->filter = sf.filter;
    out->filter_len = sf.filter_len;
    *pos += SUB_ENTRY_HEAD + flen + 1u;
    return true;
}

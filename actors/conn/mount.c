/*
** A connection's tenant (broker/tenant.h): its mountpoint is put in front of every topic,
** filter and client id the client names, and taken off every topic it is sent, so that it
** sees its own part of the topic space as the whole. Client ids and ACLs see the client's
** view; the router, the retained store, rules and administrators the mounted one. An
** unmounted client (most of them) pays one branch on its extra object.
*/
#include <string.h>

#include "conn_impl.h"
#include "log.h"
#include "topic.h"

int rt__conn_set_tenant(rt_actor_t *self, conn_t *c, const char *mount)
{
    rt_tenant_t *had = rt__conn_tenant(c);
    if (had && mount && strcmp(rt_tenant_mount(had), mount) == 0)
        return 0;
    if (had) {
        RT_ASSERT(!c->connected); /* the connection count is given back first */
        rt_tenant_unsubscribe(had, c->nsubs);
        rt_tenant_put(had);
        c->extra->tenant = NULL;
    }
    if (!mount || !mount[0])
        return 0;
    conn_extra_t *x = rt__conn_extra(self, c);
    if (!x || !(x->tenant = rt_tenant_get(mount)))
        return RT_ENOMEM;
    rt_tenant_add_subscriptions(x->tenant, c->nsubs);
    return 0;
}

/*
** prefix + the part of *t from at on, into room when it fits (room_len bytes; NULL: none),
** else into a new heap buffer that replaces *buf.
*/
static bool put_in_front(rt_actor_t *self, mqtt_str_t *t, size_t at, const char *prefix,
                         size_t plen, char **buf, char *room, size_t room_len)
{
    size_t len = t->len + plen;
    if (len > RT_TOPIC_MAX_LEN)
        return false;
    char *out = room && len < room_len ? room : rt_alloc(self, len + 1, RT_OBJ_LEAF);
    if (!out)
        return false;
    memcpy(out, t->p, at);
    memcpy(out + at, prefix, plen);
    memcpy(out + at + plen, t->p + at, t->len - at);
    out[len] = 0;
    if (out != room) {
        rt_free(self, *buf);
        *buf = out;
    }
    *t = (mqtt_str_t){(const uint8_t *)out, (uint32_t)len};
    return true;
}

bool rt__conn_mount_name(rt_actor_t *self, const conn_t *c, mqtt_str_t *t, char *room,
                         size_t room_len, char **buf)
{
    const rt_tenant_t *tn = rt__conn_tenant(c);
    return !tn || put_in_front(self, t, 0, rt_tenant_mount(tn), rt_tenant_mount_len(tn), buf,
                               room, room_len);
}

bool rt__conn_mount_filter(rt_actor_t *self, const conn_t *c, mqtt_str_t *f, char **buf)
{
    const rt_tenant_t *tn = rt__conn_tenant(c);
    if (!tn)
        return true;
    size_t at = 0;
    /* $share/group/filter: the group stays, the filter is the tenant's. */
    if (rt_topic_is_shared((const char *)f->p, f->len)) {
        const uint8_t *slash = memchr(f->p + RT_TOPIC_SHARE_LEN, '/', f->len - RT_TOPIC_SHARE_LEN);
        if (!slash)
            return false;
        at = (size_t)(slash + 1 - f->p);
    }
    return put_in_front(self, f, at, rt_tenant_mount(tn), rt_tenant_mount_len(tn), buf, NULL, 0);
}

bool rt__conn_unmount(const conn_t *c, mqtt_str_t *t)
{
    const rt_tenant_t *tn = rt__conn_tenant(c);
    if (!tn)
        return true;
    size_t n = rt_tenant_mount_len(tn);
    if (t->len <= n || memcmp(t->p, rt_tenant_mount(tn), n) != 0)
        return false;
    *t = (mqtt_str_t){t->p + n, t->len - (uint32_t)n};
    return true;
}

const char *rt__conn_own_client_id(const conn_t *c)
{
    const rt_tenant_t *tn = rt__conn_tenant(c);
    size_t n = tn ? rt_tenant_mount_len(tn) : 0;
    if (n && c->client_id && strncmp(c->client_id, rt_tenant_mount(tn), n) == 0)
        return c->client_id + n;
    return c->client_id;
}

int rt__conn_mount_login(const conn_t *c, const char *granted, const char *user, const char *cid,
                         char mount[RT_CONF_MOUNT_MAX])
{
    const rt_listen_t *l = rt_conf_listener(&rt_broker->conf, c->listener);
    const char *tmpl = granted && granted[0] ? granted : l ? l->mountpoint : "";
    const char *why = NULL;
    if (rt_mount_expand(tmpl, user, cid, strlen(cid), mount, &why) == 0)
        return 0;
    char peer[64];
    rt__conn_peer_format(c, peer, sizeof(peer));
    rt_log(RT_LOG_INFO, "client.mount_refused", "client=%s user=%s peer=%s mountpoint=%s %s", cid,
           user ? user : "-", peer, tmpl, why);
    return RT_EINVAL;
}

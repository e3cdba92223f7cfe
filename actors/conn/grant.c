/*
** What a client's login granted besides admission (auth.h's grant: a JWT's or an HTTP
** answer's): an ACL of its own, which judges its requests in place of acl_file, and the time
** its token runs out, when the connection ends with MQTT 5 reason 0xA0 (maximum connect
** time). Both live in the connection's extra object; a CONNECT handed to a session's holder
** carries them along, with the tenant the login put it in (mount.c).
*/
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl.h"
#include "conn_impl.h"
#include "log.h"

conn_extra_t *rt__conn_extra(rt_actor_t *self, conn_t *c)
{
    if (!c->extra)
        c->extra = rt_alloc(self, sizeof(conn_extra_t), RT_OBJ_SCAN);
    return c->extra;
}

int rt__conn_acl(const conn_t *c, const void *topic, size_t len, unsigned access)
{
    return rt_acl_permit_own(c->extra ? c->extra->acl : NULL, c->username,
                             rt__conn_own_client_id(c), (const char *)topic, len, access);
}

void rt__conn_drop_grant(rt_actor_t *self, conn_t *c)
{
    conn_extra_t *x = c->extra;
    if (!x)
        return;
    if (x->acl) {
        rt_charge(self, -(ptrdiff_t)rt_acl_bytes(x->acl));
        rt_acl_free(x->acl);
        x->acl = NULL;
    }
    rt_free(self, x->acl_text);
    x->acl_text = NULL;
    x->acl_len = 0;
    x->expire_at_s = 0;
}

/* A timer for the token's end (one that fires early, after a clock change, looks again). */
static void arm_expiry(rt_actor_t *self, int64_t expire_at_s)
{
    int64_t left = expire_at_s - (int64_t)time(NULL);
    rt_send_after_tag(left > 0 ? (uint64_t)left * 1000 : 0, rt_self(self), RT_CONN_MSG_TOKEN_EXPIRY,
                      NULL);
}

int rt__conn_take_grant(rt_actor_t *self, conn_t *c, int64_t expire_at_s, const char *acl,
                        size_t acl_len, const char *mount)
{
    rt__conn_drop_grant(self, c);
    if (rt__conn_set_tenant(self, c, mount))
        return RT_ENOMEM;
    if (!expire_at_s && !acl)
        return 0;
    conn_extra_t *x = rt__conn_extra(self, c);
    if (!x)
        return RT_ENOMEM;
    if (acl) {
        char err[256];
        rt_acl_t *parsed;
        int rc = rt_acl_parse(acl, acl_len, "the login's acl", &parsed, err, sizeof(err));
        if (rc) {
            rt_log(RT_LOG_WARNING, "client.grant_refused", "client=%s %s",
                   c->client_id ? c->client_id : "-", err);
            return rc;
        }
        if (!(x->acl_text = rt_strndup(self, acl, acl_len))) {
            rt_acl_free(parsed);
            return RT_ENOMEM;
        }
        x->acl = parsed;
        x->acl_len = (uint32_t)acl_len;
        rt_charge(self, (ptrdiff_t)rt_acl_bytes(parsed));
    }
    x->expire_at_s = expire_at_s;
    if (expire_at_s)
        arm_expiry(self, expire_at_s);
    return 0;
}

size_t rt__conn_grant_size(const conn_t *c)
{
    const rt_tenant_t *t = rt__conn_tenant(c);
    return 8 + 4 + (c->extra ? c->extra->acl_len : 0) + 1 + (t ? rt_tenant_mount_len(t) : 0);
}

void rt__conn_write_grant(const conn_t *c, uint8_t *out)
{
    int64_t expire = c->extra ? c->extra->expire_at_s : 0;
    uint32_t len = c->extra ? c->extra->acl_len : 0;
    memcpy(out, &expire, 8);
    memcpy(out + 8, &len, 4);
    if (len)
        memcpy(out + 12, c->extra->acl_text, len);
    const rt_tenant_t *t = rt__conn_tenant(c);
    size_t mlen = t ? rt_tenant_mount_len(t) : 0; /* below RT_CONF_MOUNT_MAX */
    out[12 + len] = (uint8_t)mlen;
    if (mlen)
        memcpy(out + 12 + len + 1, rt_tenant_mount(t), mlen);
}

size_t rt__conn_read_grant(rt_actor_t *self, conn_t *c, const uint8_t *data, size_t len)
{
    int64_t expire;
    uint32_t acl_len;
    if (len < 12)
        return 0;
    memcpy(&expire, data, 8);
    memcpy(&acl_len, data + 8, 4);
    if (acl_len >= len - 12)
        return 0;
    size_t mlen = data[12 + acl_len];
    if (mlen >= RT_CONF_MOUNT_MAX || mlen > len - 12 - acl_len - 1)
        return 0;
    char mount[RT_CONF_MOUNT_MAX];
    memcpy(mount, data + 12 + acl_len + 1, mlen);
    mount[mlen] = 0;
    if (rt__conn_take_grant(self, c, expire, acl_len ? (const char *)data + 12 : NULL, acl_len,
                            mount))
        return 0;
    return 12 + acl_len + 1 + mlen;
}

void rt__conn_on_token_expiry(rt_actor_t *self, conn_t *c)
{
    int64_t expire = c->extra ? c->extra->expire_at_s : 0;
    if (!expire || !c->sock || c->closing)
        return; /* a new CONNECT since, with no expiry or a later one (its own timer) */
    if ((int64_t)time(NULL) < expire) {
        arm_expiry(self, expire);
        return;
    }
    rt_log(RT_LOG_INFO, "client.token_expired", "client=%s", c->client_id ? c->client_id : "-");
    rt__conn_close(self, c, MQTT_RC_MAX_CONNECT_TIME, RT_REASON_NORMAL);
}

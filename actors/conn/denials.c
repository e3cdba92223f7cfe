/*
** A client's requests the ACL refused (a PUBLISH, its will, a SUBSCRIBE): counted for the
** client (rtctl clients show), its listener and so the broker (/metrics), and logged as
** acl.denied at most one line a second per client, so a client that retries a refused
** PUBLISH in a loop cannot flood the log. The first denial after a quiet second is logged
** at once; those within the second after it are counted, and the next line says how many
** it left out (suppressed=N): the next denial's, or, when none comes, one the timer writes
** at the second's end.
*/
#include <stdatomic.h>

#include "conn_impl.h"
#include "log.h"

#define ACL_LOG_MS 1000 /* one acl.denied line a second per client, at most */

static const char *const action_names[] = {"publish", "subscribe", "will"};

/* The client's listener as the log names listeners ("host:port"). */
static int listener_port(const conn_t *c)
{
    return atomic_load_explicit(&rt_broker->listener_stats[c->listener].port, memory_order_relaxed);
}

void rt__conn_acl_denied(rt_actor_t *self, conn_t *c, int action, const uint8_t *topic, size_t len)
{
    RT_ASSERT(action >= 0 && action <= RT_CONN_DENIED_WILL);
    int kind = action == RT_CONN_DENIED_SUBSCRIBE ? RT_ACL_DENIED_SUBSCRIBE : RT_ACL_DENIED_PUBLISH;
    atomic_fetch_add_explicit(&rt_broker->listener_stats[c->listener].acl_denied[kind], 1,
                              memory_order_relaxed);
    rt_session_t *s = rt__conn_session_get_or_make(self, c);
    uint64_t now = rt_mono_ms();
    uint32_t suppressed = 0;
    if (s) {
        s->acl_denied[kind]++;
        if (s->acl_logged_ms && now - s->acl_logged_ms < ACL_LOG_MS) {
            s->acl_unlogged++;
            if (!s->acl_flush_armed)
                s->acl_flush_armed =
                    rt_send_after_tag(s->acl_logged_ms + ACL_LOG_MS - now, rt_self(self),
                                      RT_CONN_MSG_ACL_LOG, NULL) == 0;
            return;
        }
        suppressed = s->acl_unlogged;
        s->acl_unlogged = 0;
        s->acl_logged_ms = now;
    }
    rt_log(RT_LOG_WARNING, "acl.denied",
           "client=%s user=%s listener=%s:%d action=%s topic=%.*s suppressed=%u",
           c->client_id ? c->client_id : "-", c->username ? c->username : "-",
           rt_broker->conf.listeners[c->listener].host, listener_port(c), action_names[action],
           (int)len, (const char *)topic, suppressed);
}

void rt__conn_acl_log_due(conn_t *c)
{
    rt_session_t *s = c->sess;
    if (!s)
        return;
    s->acl_flush_armed = 0;
    if (!s->acl_unlogged)
        return;
    rt_log(RT_LOG_WARNING, "acl.denied", "client=%s user=%s listener=%s:%d suppressed=%u",
           c->client_id ? c->client_id : "-", c->username ? c->username : "-",
           rt_broker->conf.listeners[c->listener].host, listener_port(c), s->acl_unlogged);
    s->acl_unlogged = 0;
    s->acl_logged_ms = rt_mono_ms();
}

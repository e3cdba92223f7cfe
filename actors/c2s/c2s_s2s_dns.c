/*
** Federation's resolver: the outgoing streams' DNS lookups (srv.h) in one actor on the
** blocking pool, so a lookup never runs on a scheduler, and one at a time, so a slow or dead
** name server holds one blocking thread and leaves the others to the store. An outgoing
** stream asks once, when it is made: the stream's life (until 10 idle minutes, or 5 s after a
** failure) is the answer's cache, as it is the connection's.
*/
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"
#include "srv.h"

#define LOOKUPS_WAITING_MAX 256 /* past it a new stream fails at once: a flood of domains */

static _Atomic unsigned waiting;

int rt__c2s_s2s_resolve(const char *remote)
{
    rt_pid_t resolver = rt_whereis(C2S_S2S_RESOLVER_NAME);
    if (!resolver)
        return RT_ENOTFOUND;
    if (atomic_fetch_add_explicit(&waiting, 1, memory_order_relaxed) >= LOOKUPS_WAITING_MAX) {
        atomic_fetch_sub_explicit(&waiting, 1, memory_order_relaxed);
        return RT_ELIMIT;
    }
    int rc = rt_send(resolver, C2S_MSG_S2S_RESOLVE, remote, strlen(remote) + 1);
    if (rc)
        atomic_fetch_sub_explicit(&waiting, 1, memory_order_relaxed);
    return rc;
}

static void answer(rt_pid_t to, int rc, const rt_xmpp_s2s_found_t *found)
{
    rt_xmpp_s2s_found_t r = {.rc = rc};
    size_t n = rc > 0 ? (size_t)rc : 0;
    if (n)
        memcpy(r.a, found->a, n * sizeof(r.a[0]));
    rt_send(to, C2S_MSG_S2S_RESOLVED, &r, offsetof(rt_xmpp_s2s_found_t, a) + n * sizeof(r.a[0]));
}

static void resolver_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self;
    (void)state;
    if (m->tag != C2S_MSG_S2S_RESOLVE)
        return;
    atomic_fetch_sub_explicit(&waiting, 1, memory_order_relaxed);
    const char *domain = (const char *)m->data;
    if (!m->len || m->data[m->len - 1] != 0 || !rt_alive(m->from))
        return; /* the stream that asked has ended: nobody to answer */
    rt_xmpp_s2s_found_t found;
    int rc = rt_xmpp_s2s_resolve(domain, found.a, RT_XMPP_S2S_ADDRS);
    rt_log(RT_LOG_DEBUG, "xmpp.server_lookup", "domain=%s addresses=%d", domain, rc);
    answer(m->from, rc, &found);
}

static void resolver_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != C2S_MSG_S2S_RESOLVE)
        return;
    atomic_fetch_sub_explicit(&waiting, 1, memory_order_relaxed);
    answer(m->from, RT_EAGAIN, NULL);
}

static const char *resolver_tag_name(uint32_t tag)
{
    return tag == C2S_MSG_S2S_RESOLVE ? "lookup" : NULL;
}

static const rt_actor_type_t resolver_type = {
    .name = "xmpp_resolver",
    .handle = resolver_handle,
    .dead_letter = resolver_dead_letter,
    .tag_name = resolver_tag_name,
    .flags = RT_TYPE_BLOCKING,
};

int rt__c2s_s2s_resolver_start(rt_pid_t group)
{
    if (!rt__c2s_s2s_on() || !rt__c2s.conf->s2s_dns)
        return 0;
    rt_child_spec_t c = {
        .name = C2S_S2S_RESOLVER_NAME, .type = &resolver_type, .restart = RT_PERMANENT};
    return rt_supervisor_start_child(group, &c, NULL);
}

/*
** MQTT at start: the broker's state, then what the store kept from the last run
** (retained messages, and each persistent session as a connection actor with no
** socket, offline until its client resumes it), then the login verifier and the
** listeners.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "banned.h"
#include "c2s.h"
#include "conn_impl.h"
#include "delayed.h"
#include "group.h"
#include "log.h"
#include "store.h"

/* The session's messages in their order: queued ones, and inflight ones as they were sent. */
static void restore_messages(rt_actor_t *self, conn_t *c, const rt_stored_session_t *ss)
{
    for (size_t i = 0; i < ss->nmsgs && rt__conn_session_get_or_make(self, c); i++) {
        const rt_stored_msg_t *sm = &ss->msgs[i];
        rt_qmsg_t *m = rt_qmsg_new(self, sm->bin, sm->qos, sm->retain, sm->expire_at_ms, sm->shared,
                                   sm->sub_ids, sm->n_sub_ids);
        if (!m)
            break;
        m->seq = sm->seq;
        m->state = sm->state;
        m->packet_id = sm->packet_id;
        if (c->sess->next_seq < m->seq)
            c->sess->next_seq = m->seq;
        rt_qlist_t *l = m->state == RT_QMSG_QUEUED ? &c->sess->queued : &c->sess->inflight;
        if (l == &c->sess->inflight)
            c->sess->ids_unordered = 1;
        rt_qlist_push(l, m);
        if (m->state == RT_QMSG_WAIT_COMP)
            rt_qlist_drop_payload(self, l, m);
    }
}

int rt__conn_session_from_stored(rt_actor_t *self, conn_t *c, const rt_stored_session_t *ss,
                                 bool persistent)
{
    c->client_id = rt_strndup(self, ss->client_id, strlen(ss->client_id));
    if (!c->client_id)
        return RT_ENOMEM;
    c->closing = 1;
    c->session_expiry = ss->expiry_left_s;
    for (size_t i = 0; i < ss->nsubs; i++) {
        const rt_stored_sub_t *sub = &ss->subs[i];
        rt_trie_opts_t o = sub->opts;
        o.persistent = persistent;
        /* Another client took the filter while the session moved: it is not this one's. */
        if (o.exclusive && !rt__conn_exclusive_claim(self, c, sub->filter, sub->len)) {
            rt_log(RT_LOG_WARNING, "client.exclusive_lost", "client=%s filter=%s", c->client_id,
                   sub->filter);
            continue;
        }
        if (rt__conn_sub_remember(self, c, (const uint8_t *)sub->filter, sub->len, &o) != 0 ||
            rt_topic_is_shared(sub->filter, sub->len))
            continue;
        rt_trie_subscribe(rt_broker->trie, sub->filter, sub->len, rt_self(self), &o, NULL);
    }
    restore_messages(self, c, ss);
    for (size_t i = 0; i < ss->nqos2_in; i++)
        if (rt__conn_qos2_add(self, c, ss->qos2_in[i]) != 0)
            break;
    /* A session that moved here replaces a stale one this node kept (cluster.h). */
    rt_pid_t stale = rt_broker_claim_client(c->client_id, rt_self(self));
    if (stale) {
        rt_cluster_claimed_t r = {.status = RT_EEXIST};
        rt_send(stale, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r));
    }
    rt__conn_count_session();
    rt__conn_arm_session_expiry(self, c);
    return 0;
}

/*
** A persistent session as the last run left it, offline until its client
** resumes it: subscriptions (shared ones rejoin on resume), queued and
** inflight messages in their order, inbound QoS 2 ids, and what remains of
** its expiry.
*/
int rt__conn_restored_init(rt_actor_t *self, void *state, void *arg)
{
    conn_t *c = state;
    c->stored = 1;
    int rc = rt__conn_session_from_stored(self, c, arg, true);
    if (rc == 0)
        rt_send(rt_self(self), RT_CONN_MSG_RESTORED, NULL, 0);
    return rc;
}

static void restore_retained(const char *topic, size_t len, rt_bin_t *bin, uint64_t expire_at_ms,
                             void *arg)
{
    rt_retained_msg_t *r = malloc(sizeof(*r));
    if (!r) {
        rt_bin_release(bin);
        return;
    }
    *r = (rt_retained_msg_t){.bin = bin, .expire_at_ms = expire_at_ms};
    if (rt_retained_set(rt_broker->retained, topic, len, r, rt_bin_len(bin)) != 0)
        rt_broker_retained_release(r);
}

static void restore_session(const rt_stored_session_t *ss, void *arg)
{
    rt_pid_t pid;
    if (rt_spawn(&rt__conn_restored_type, (void *)ss, &pid) != 0)
        rt_log(RT_LOG_ERROR, "store.restore_failed", "client=%s", ss->client_id);
}

int rt_sessions_restore(rt_pid_t sup, char *err, size_t errlen)
{
    /* Sessions come from the store, and in a cluster from other nodes too (move.c). */
    rt_cluster_set_importer(rt__conn_import_session);
    if (!rt_broker->conf.persistence)
        return 0;
    int rc = rt_store_open(rt_broker->conf.data_dir, sup, err, errlen);
    if (rc == 0)
        rc = rt_store_load(rt_message_parse, restore_retained, restore_session, NULL, err, errlen);
    if (rc == 0 && rt_banned_load() != 0) {
        snprintf(err, errlen, "cannot read the banned list from state.db");
        rc = RT_EINVAL;
    }
    if (rc == 0 && rt_delayed_restore() != 0) {
        snprintf(err, errlen, "cannot read the delayed messages from state.db");
        rc = RT_EINVAL;
    }
    return rc;
}

int rt_mqtt_start(const rt_conf_t *conf, char *err, size_t errlen)
{
    int rc = rt_broker_init(conf);
    if (rc) {
        snprintf(err, errlen, "cannot make the broker's state: %s", rt_strerror(rc));
        return rc;
    }
    int restored = rt_sessions_restore(0, err, errlen);
    if (restored)
        return restored;
    /* Before the listeners: the first CONNECT may need a full password hash. */
    int vrc = rt_auth_verifier_start(0);
    if (vrc && vrc != RT_EEXIST) { /* EEXIST: one runs already, from an earlier start */
        snprintf(err, errlen, "cannot start the login verifier: %s", rt_strerror(vrc));
        return vrc;
    }
    int drc = rt_delayed_start(0);
    if (drc && drc != RT_EEXIST) {
        snprintf(err, errlen, "cannot start delayed publish: %s", rt_strerror(drc));
        return drc;
    }
    return rt_listeners_start(0, err, errlen);
}

/* "listener:<host>:<port>": the listeners' registered names (their supervisor keeps them). */
static char listener_names[RT_CONF_ALL_LISTENERS][sizeof(((rt_listen_t *)0)->host) + 24];

const char *rt__conn_listener_text(unsigned index)
{
    static const char kind[] = "listener:";
    return index < RT_CONF_MAX_LISTENERS && listener_names[index][0]
               ? listener_names[index] + sizeof(kind) - 1
               : "";
}

static int start_listener(rt_pid_t group, const rt_listen_t *l, char *name, size_t namelen,
                          const char *kind, char *err, size_t errlen)
{
    snprintf(name, namelen, "%s:%s:%d", kind, l->host, l->port);
    rt_child_spec_t c = {
        .name = name, .type = &rt_listener_type, .arg = (void *)l, .restart = RT_PERMANENT};
    int rc = rt_supervisor_start_child(group, &c, NULL);
    if (rc)
        snprintf(err, errlen, "cannot listen on %s:%d: %s", l->host, l->port,
                 rt_tcp_listen_strerror(rc));
    return rc;
}

int rt_listeners_start(rt_pid_t sup, char *err, size_t errlen)
{
    rt_xport_preauth_budget(rt_broker_preauth_charge); /* before the first accept */
    rt_pid_t group;
    int rc = rt_group_start(sup, RT_LISTENERS_GROUP, RT_PERMANENT, &group);
    if (rc) {
        snprintf(err, errlen, "cannot start the listeners' supervisor: %s", rt_strerror(rc));
        return rc;
    }
    const rt_conf_t *conf = &rt_broker->conf;
    for (unsigned i = 0; i < conf->nlisteners; i++)
        if ((rc = start_listener(group, &conf->listeners[i], listener_names[i],
                                 sizeof(listener_names[i]), "listener", err, errlen)))
            return rc;
    if (!conf->xmpp.on)
        return 0;
    if ((rc = rt_c2s_start(sup, conf, rt__listener_admit_peer, err, errlen)))
        return rc;
    for (unsigned i = 0; i < conf->xmpp.nlisteners; i++) {
        char *name = listener_names[RT_CONF_XMPP_LISTENER(i)];
        if ((rc = start_listener(group, &conf->xmpp.listeners[i], name, sizeof(listener_names[0]),
                                 "xmpp_listener", err, errlen)))
            return rc;
    }
    return 0;
}

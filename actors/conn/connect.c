/*
** CONNECT, the start of every connection: the login (password file and anonymous
** access, the verifier for full hashes, a held-back refusal), the claim of a client
** id (a takeover, or a hand-over of the socket to the actor holding the client's
** session), the session's expiry and persistence, the will, and the CONNACK.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "banned.h"
#include "cluster.h"
#include "conn_impl.h"
#include "log.h"
#include "store.h"

void rt__conn_count_session(void)
{
    rt_atomic_raise(&rt_broker->stats.sessions_max,
                    atomic_fetch_add(&rt_broker->stats.sessions, 1) + 1);
}

uint32_t rt__conn_clamp_session_expiry(uint64_t requested)
{
    uint64_t max = (uint64_t)RT_LIVE(max_session_expiry);
    return (uint32_t)(requested < max ? requested : max);
}

/*
** clean start 0 for a client id another actor holds: that actor keeps the
** session, so this connection hands it the socket and the bytes read from the
** CONNECT on (it parses them as its own), then exits. Returns false (and keeps
** the socket) when the holder is already gone: the session ended, start fresh.
** Behind a transport, the hand-over waits until its layers have taken all that
** was read (conn_xport.c).
*/
static bool hand_socket_to_holder(rt_actor_t *self, conn_t *c, rt_pid_t holder,
                                  const uint8_t *bytes, size_t len)
{
    RT_ASSERT(c->sock && !c->resuming);
    if (!rt_alive(holder))
        return false;
    if (c->xp)
        rt__conn_hand_over(self, c, holder, bytes, len);
    else
        rt__conn_send_socket(self, c, holder, bytes, len);
    return true;
}

/*
** The verifier's answer for the CONNECT being parsed again (rt__conn_on_login_verdict):
** set only around that parse, and one actor runs on a thread at a time.
*/
static _Thread_local const rt_auth_verdict_t *login_verdict_now;

bool rt__conn_connect_parsed_before(const conn_t *c)
{
    return c->resuming || login_verdict_now;
}

/* Ends a login refused with a CONNACK code of refusal (c->refusal), sent by the
   message that would come after a delay (none here). */
static bool refuse_login_now(rt_actor_t *self, conn_t *c, uint8_t refusal)
{
    c->refusal = refusal;
    c->closing = 1;
    rt_sock_pause_reading(c->sock, true);
    rt_send(rt_self(self), RT_CONN_MSG_AUTH_REFUSED, NULL, 0);
    return false;
}

/*
** The password file and allow_anonymous decide. A decision that needs a full
** hash (a user's first login, or any wrong password) goes to the verifier
** (auth.h) instead of costing this scheduler milliseconds: the connection then
** reads nothing (the CONNECT and whatever followed it wait in the partial
** buffer, and version is 0 again) until the answer comes, and the CONNECT is
** parsed again with it. A refused client gets its negative CONNACK only after
** the delay the failed-login table asks for (so guessing costs time per source
** address), and reads nothing meanwhile.
*/
/*
** identity_as_username: the verified client certificate names the user (its CN), as
** Mosquitto's use_identity_as_username; the CONNECT's user name and password are not used.
** The handshake refused clients without a valid certificate already. pk: a fresh CONNECT,
** whose tenant the name picks; NULL: one handed over, which brought its tenant along.
*/
static bool connect_identity(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    char name[256];
    if (!rt__conn_identity(c, name, sizeof(name))) {
        atomic_fetch_add_explicit(&rt_broker->stats.auth_failed[RT_AUTH_FAILED_NO_CERT_NAME], 1,
                                  memory_order_relaxed);
        rt_log(RT_LOG_INFO, "client.auth_failed", "user=- reason=%s",
               rt_auth_failed_names[RT_AUTH_FAILED_NO_CERT_NAME]);
        return refuse_login_now(self, c, c->version == MQTT_V5 ? MQTT_RC_NOT_AUTHORIZED : 5);
    }
    c->username = rt_strndup(self, name, strlen(name));
    if (!c->username || !pk)
        return c->username != NULL;
    char mount[RT_CONF_MOUNT_MAX];
    char cid[RT_CONF_MOUNT_MAX];
    size_t cidlen = pk->connect.client_id.len < sizeof(cid) ? pk->connect.client_id.len : 0;
    memcpy(cid, pk->connect.client_id.p, cidlen); /* longer is no one level of a mountpoint */
    cid[cidlen] = 0;
    if (rt__conn_mount_login(c, NULL, c->username, cid, mount))
        return refuse_login_now(self, c, c->version == MQTT_V5 ? MQTT_RC_NOT_AUTHORIZED : 5);
    return rt__conn_set_tenant(self, c, mount) == 0;
}

static bool connect_authenticate(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, conn_peer_t *peer)
{
    if (rt__conn_identity_required(c))
        return connect_identity(self, c, pk);
    char *user = pk->connect.has_username
                     ? rt_strndup(self, pk->connect.username.p, pk->connect.username.len)
                     : NULL;
    if (pk->connect.has_username && !user)
        return false;
    char *cid = rt_strndup(self, pk->connect.client_id.p, pk->connect.client_id.len);
    if (!cid) {
        rt_free(self, user);
        return false;
    }
    /* Read only for a chain that is told it: other logins pay no X.509 work for it. */
    rt_auth_tls_t tls;
    bool have_tls = rt_auth_wants_tls() && rt_xport_tls_cert(rt__conn_xp(c), &tls);
    bool have_addr = rt__conn_peer(c, peer)->known > 0;
    rt_auth_request_t q = {.addr = have_addr ? &peer->addr : NULL,
                           .listener = rt__conn_listener_text(c->listener),
                           .user = user,
                           .clientid = cid,
                           .pw = pk->connect.has_password ? pk->connect.password.p : NULL,
                           .pwlen = pk->connect.password.len,
                           .tls = have_tls ? &tls : NULL};
    uint32_t delay_ms = 0;
    int rc;
    rt_auth_grant_t grant = {0};
    const rt_auth_verdict_t *v = login_verdict_now;
    login_verdict_now = NULL;
    if (v) { /* the verdict's ACL text follows it; grant.acl stays NULL */
        rc = v->result;
        delay_ms = v->delay_ms;
        grant.expire_at_s = v->expire_at_s;
    } else { /* a cached answer's grant comes with it: it must not be lost */
        rc = rt_auth_decide(&q, false, &delay_ms, &grant);
    }
    int queued = rc == RT_AUTH_PENDING ? rt_auth_login_async(RT_CONN_MSG_LOGIN_VERDICT, &q) : -1;
    if (queued == 0) {
        rt_auth_grant_free(&grant);
        rt_free(self, user);
        rt_free(self, cid);
        c->verifying = 1;
        c->version = 0;
        rt_sock_pause_reading(c->sock, true);
        return false;
    }
    if (queued == RT_ELIMIT) /* the authenticator pool's queue is full */
        rc = RT_AUTH_UNAVAILABLE;
    if (rc == RT_AUTH_PENDING) { /* no verifier (it is not running): decide here after all */
        rt_auth_grant_free(&grant);
        rc = rt_auth_decide(&q, true, &delay_ms, &grant);
    }
    char mount[RT_CONF_MOUNT_MAX];
    /* A tenant's name comes from a user name the login vouched for, never an anonymous one. */
    if ((rc == RT_AUTH_OK || rc == RT_AUTH_ANONYMOUS) &&
        rt__conn_mount_login(c, v ? v->mount : grant.mount, rc == RT_AUTH_OK ? user : NULL, cid,
                             mount))
        rc = RT_AUTH_ANONYMOUS_REFUSED; /* not authorized (0x87, 3.1.1's 5) */
    rt_free(self, cid);
    if (rc == RT_AUTH_OK || rc == RT_AUTH_ANONYMOUS) {
        const char *acl = v ? (v->acl_len ? (const char *)(v + 1) : NULL) : grant.acl;
        size_t acl_len = v ? v->acl_len : grant.acl_len;
        /* An ACL it cannot hold is no ACL: refused rather than let do anything. */
        int taken = rt__conn_take_grant(self, c, grant.expire_at_s, acl, acl_len, mount);
        rt_auth_grant_free(&grant);
        if (taken == 0) {
            c->name_unvouched = rc == RT_AUTH_ANONYMOUS;
            c->username = c->name_unvouched ? NULL : user;
            if (c->name_unvouched)
                rt_free(self, user);
            return true;
        }
        rc = RT_AUTH_BAD_PASSWORD;
    }
    rt_auth_grant_free(&grant);
    char peer_text[64];
    rt__conn_peer_text(rt__conn_peer(c, peer), peer_text, sizeof(peer_text));
    int why = rc == RT_AUTH_BAD_PASSWORD   ? RT_AUTH_FAILED_BAD_PASSWORD
              : rc == RT_AUTH_UNKNOWN_USER ? RT_AUTH_FAILED_UNKNOWN_USER
              : rc == RT_AUTH_UNAVAILABLE  ? RT_AUTH_FAILED_UNAVAILABLE
                                           : RT_AUTH_FAILED_ANONYMOUS;
    atomic_fetch_add_explicit(&rt_broker->stats.auth_failed[why], 1, memory_order_relaxed);
    rt_log(RT_LOG_INFO, "client.auth_failed", "user=%s reason=%s delay_ms=%u peer=%s",
           user ? user : "-", rt_auth_failed_names[why], delay_ms, peer_text);
    rt_free(self, user);
    bool anonymous = rc == RT_AUTH_ANONYMOUS_REFUSED, unavailable = rc == RT_AUTH_UNAVAILABLE;
    if (c->version == MQTT_V5)
        c->refusal = anonymous     ? MQTT_RC_NOT_AUTHORIZED
                     : unavailable ? MQTT_RC_SERVER_UNAVAILABLE
                                   : MQTT_RC_BAD_CREDENTIALS;
    else
        c->refusal = anonymous ? 5 : unavailable ? 3 : 4;
    c->closing = 1;
    rt_sock_pause_reading(c->sock, true);
    if (delay_ms)
        rt_send_after_tag(delay_ms, rt_self(self), RT_CONN_MSG_AUTH_REFUSED, NULL);
    else
        rt_send(rt_self(self), RT_CONN_MSG_AUTH_REFUSED, NULL, 0);
    return false;
}

/*
** The verifier decided this connection's CONNECT: parse it again (connect_authenticate
** takes the verdict), then whatever the client sent after it, then read on.
*/
void rt__conn_on_login_verdict(rt_actor_t *self, conn_t *c, const rt_auth_verdict_t *v)
{
    if (!c->verifying)
        return;
    RT_ASSERT(!login_verdict_now && !c->version);
    c->verifying = 0;
    login_verdict_now = v;
    rt__conn_parse_more(self, c);
    login_verdict_now = NULL;
}

/* The cluster's answer to this connection's claim of its client id, while its CONNECT is
   parsed again (it was authenticated before the claim). */
static _Thread_local const rt_cluster_claimed_t *claim_now;

void rt__conn_on_claimed(rt_actor_t *self, conn_t *c, const rt_cluster_claimed_t *r)
{
    if (!c->verifying || !c->claiming)
        return;
    RT_ASSERT(!claim_now && !c->version);
    c->verifying = c->claiming = 0;
    claim_now = r;
    rt__conn_parse_more(self, c);
    claim_now = NULL;
}

/*
** In a cluster, a client id is claimed for this node before the session is made or resumed
** (cluster.h), even when an actor here holds it: a session kept here may be stale (another
** node took the id while this one was frozen, cut off or down), and only the claim tells.
** True when the CONNECT waits for the answer (it is parsed again then).
*/
static bool claim_in_cluster(rt_actor_t *self, conn_t *c, const char *cid, bool want_session)
{
    if (!rt_cluster_claim(rt_self(self), cid, strlen(cid), want_session))
        return false; /* no cluster-wide registry */
    c->verifying = c->claiming = 1;
    c->version = 0;
    rt_sock_pause_reading(c->sock, true);
    return true;
}

/* The CONNACK of a banned client (the ban that matched in hit), logged. */
static bool refuse_banned(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk, const rt_ban_t *hit,
                          conn_peer_t *peer)
{
    const char *cid = (const char *)pk->connect.client_id.p;
    size_t cidlen = pk->connect.client_id.len;
    const char *user = pk->connect.has_username ? (const char *)pk->connect.username.p : NULL;
    size_t ulen = user ? pk->connect.username.len : 0;
    char peer_text[64];
    rt__conn_peer_text(rt__conn_peer(c, peer), peer_text, sizeof(peer_text));
    rt_log(RT_LOG_INFO, "client.banned",
           "client=%.*s user=%.*s peer=%s kind=%s value=%.*s reason=%s", (int)cidlen, cid,
           (int)ulen, user ? user : "", peer_text, rt_ban_kind_names[hit->kind], (int)hit->len,
           hit->value, hit->reason);
    mqtt_packet_t ack = {.type = MQTT_CONNACK,
                         .reason = c->version == MQTT_V5 ? MQTT_RC_BANNED : 5};
    rt__conn_send_packet(c, &ack);
    rt__conn_close(self, c, 0, RT_REASON_NORMAL);
    return true;
}

/*
** A banned client (banned.h) is refused before its password costs a hash; a client id that
** flaps is banned by the CONNECT that makes it flapping, which is refused with it. Refusals
** are counted by the list (rt_banned_refusals_total).
*/
static bool refused_banned(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk, conn_peer_t *peer)
{
    const char *cid = (const char *)pk->connect.client_id.p;
    size_t cidlen = pk->connect.client_id.len;
    const char *user = pk->connect.has_username ? (const char *)pk->connect.username.p : NULL;
    size_t ulen = user ? pk->connect.username.len : 0;
    bool have_addr = rt__conn_peer(c, peer)->known > 0;
    rt_ban_t hit;
    char hit_buf[512];
    if (!rt_banned_match(cid, cidlen, user, ulen, have_addr ? &peer->addr : NULL, &hit, hit_buf,
                         sizeof(hit_buf)) &&
        !(rt_banned_flapping(cid, cidlen) &&
          rt_banned_match(cid, cidlen, NULL, 0, NULL, &hit, hit_buf, sizeof(hit_buf))))
        return false;
    return refuse_banned(self, c, pk, &hit, peer);
}

/* A tenant's client banned by the id the broker holds it under ("acme/dev", as listed). */
static bool refused_banned_in_tenant(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk,
                                     const char *held_id, conn_peer_t *peer)
{
    rt_ban_t hit;
    char hit_buf[512];
    return rt_banned_match(held_id, strlen(held_id), NULL, 0, NULL, &hit, hit_buf,
                           sizeof(hit_buf)) &&
           refuse_banned(self, c, pk, &hit, peer);
}

void rt__conn_send_login_refusal(rt_actor_t *self, conn_t *c)
{
    RT_ASSERT(c->closing && c->refusal);
    mqtt_packet_t ack = {.type = MQTT_CONNACK, .reason = c->refusal};
    rt__conn_send_packet(c, &ack);
    rt_exit(self, RT_REASON_NORMAL);
}

/* CONNACK properties that tell an MQTT 5 client how this server differs from the defaults. */
#define RT_RESPONSE_INFO_MAX (16 + 65536) /* "rt/response/" and a client id */

static void connack_props(conn_t *c, mqtt_packet_t *pk, mqtt_packet_t *ack, const char *assigned,
                          bool expiry_clamped, char *response)
{
    mqtt_props_t *p = &ack->props;
    if (assigned[0]) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_ASSIGNED_CLIENT_ID);
        p->assigned_client_id = (mqtt_str_t){(const uint8_t *)assigned, (uint32_t)strlen(assigned)};
    }
    if (expiry_clamped) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY);
        p->session_expiry = c->session_expiry;
    }
    if (pk->connect.keepalive != c->keepalive) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_SERVER_KEEPALIVE);
        p->server_keepalive = c->keepalive;
    }
    if (pk->props.request_response_info) {
        /* Request/response (4.10): a topic prefix only this client id is told about. */
        snprintf(response, RT_RESPONSE_INFO_MAX, "rt/response/%s", c->client_id);
        p->present |= MQTT_PROP_BIT(MQTT_PROP_RESPONSE_INFO);
        p->response_info = (mqtt_str_t){(const uint8_t *)response, (uint32_t)strlen(response)};
    }
    p->present |=
        MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE) | MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS_MAXIMUM);
    if (c->rx_max < 65535) {
        p->present |= MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM);
        p->receive_maximum = c->rx_max;
    }
    p->maximum_packet_size = c->max_packet;
    p->topic_alias_maximum = (uint16_t)rt_broker->conf.max_topic_alias;
}

/* Writes the whole session: it has just become persistent (or was never stored). */
void rt__conn_session_persist_all(conn_t *c)
{
    c->stored = 1;
    for (size_t i = 0; i < c->nsubs; i++) {
        rt_trie_opts_t o = rt__conn_sub_opts(&c->subs[i]);
        rt_store_sub(c->client_id, c->subs[i].filter, c->subs[i].len, &o);
    }
    if (!c->sess)
        return;
    rt_qlist_t *lists[2] = {&c->sess->inflight, &c->sess->queued};
    for (int l = 0; l < 2; l++)
        for (rt_qmsg_t *m = lists[l]->head; m; m = m->next)
            if (!m->seq && m->bin)
                rt__conn_store_msg(c, m, 0, 0);
}

/* Subscriptions carry whether the session is persistent: publishers ask such ones for a
   durable ack. Re-subscribing updates that in the trie. */
static void subs_resubscribe_all(rt_actor_t *self, conn_t *c)
{
    for (size_t i = 0; i < c->nsubs; i++) {
        c->subs[i].persistent = rt__conn_session_is_durable(c);
        rt_trie_opts_t o = rt__conn_sub_opts(&c->subs[i]);
        rt_trie_subscribe(rt_broker->trie, c->subs[i].filter, c->subs[i].len, rt_self(self), &o,
                          NULL);
    }
}

/* A client id as the broker holds it: under its tenant's mountpoint, if it has one. */
static char *tenant_client_id(rt_actor_t *self, const conn_t *c, const char *id, size_t len)
{
    const rt_tenant_t *t = rt__conn_tenant(c);
    size_t mlen = t ? rt_tenant_mount_len(t) : 0;
    char *cid = rt_alloc(self, mlen + len + 1, RT_OBJ_LEAF);
    if (!cid)
        return NULL;
    if (mlen)
        memcpy(cid, rt_tenant_mount(t), mlen);
    memcpy(cid + mlen, id, len);
    cid[mlen + len] = 0;
    return cid;
}

/* The CONNECT's will as a canonical message, and its delay within the session's expiry. */
static int will_from_connect(rt_actor_t *self, conn_t *c, const mqtt_packet_t *pk)
{
    mqtt_packet_t w = {.type = MQTT_PUBLISH, .version = pk->version};
    w.publish.topic = pk->connect.will_topic;
    w.publish.payload = pk->connect.will_payload;
    w.publish.qos = pk->connect.will_qos;
    w.publish.retain = pk->connect.will_retain;
    w.props = pk->connect.will_props; /* the will's own properties travel with it */
    RT_ASSERT(!c->will);
    char *mounted = NULL;
    if (!rt__conn_mount_name(self, c, &w.publish.topic, NULL, 0, &mounted))
        return MQTT_ERR(MQTT_RC_TOPIC_NAME_INVALID);
    rt_bin_t *will = rt_message_new(&w, c->client_id, c->username);
    rt_free(self, mounted);
    if (!will || !(c->will = rt_hold_bin(self, will)))
        return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    if (c->version == MQTT_V5) {
        uint32_t delay = pk->connect.will_props.will_delay;
        c->will_delay = delay < c->session_expiry ? delay : c->session_expiry;
    }
    return 0;
}

int rt__conn_handle_connect(rt_actor_t *self, conn_t *c, mqtt_packet_t *pk, const uint8_t *bytes,
                            size_t len)
{
    RT_ASSERT(!c->version && c->sock && !c->closing);
    c->version = pk->version;
    mqtt_packet_t ack = {.type = MQTT_CONNACK};
    char assigned[64] = "";
    const rt_cluster_claimed_t *claimed = claim_now;
    conn_peer_t peer = {0}; /* read once for the checks and the log line below */
    claim_now = NULL;
    mqtt_str_t id = pk->connect.client_id;
    bool clean = pk->connect.clean_start;
    if (id.len == 0) {
        bool allowed = RT_LIVE(allow_zero_length_clientid) &&
                       (c->version == MQTT_V5 || (c->version == MQTT_V311 && clean));
        if (!allowed) {
            ack.reason = c->version == MQTT_V5 ? MQTT_RC_CLIENT_ID_INVALID : 2;
            rt__conn_send_packet(c, &ack);
            rt__conn_close(self, c, 0, RT_REASON_NORMAL);
            return 0;
        }
        /* Unique in a cluster too: a pid is unique on its node only. */
        snprintf(assigned, sizeof(assigned), "rt-%s%s%016llx", rt_cluster_node(),
                 rt_cluster_on() ? "-" : "", (unsigned long long)rt_self(self));
    }
    if (c->version == MQTT_V5 && (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD))) {
        /* Enhanced authentication is not configured: refuse the method (4.12). */
        ack.reason = MQTT_RC_BAD_AUTH_METHOD;
        rt__conn_send_packet(c, &ack);
        rt__conn_close(self, c, 0, RT_REASON_NORMAL);
        return 0;
    }
    bool resumed = c->resuming;
    c->resuming = 0;
    /* The session moved to another node and waits only for its rest to be asked for: it is
       not this node's to resume (the client is told to come back; its claim goes there). */
    if (resumed && c->sess && c->sess->moving == RT_SESSION_MOVED_OUT) {
        rt_log(RT_LOG_INFO, "client.refused_moving", "client=%s its session is moving away",
               c->client_id);
        ack.reason = c->version == MQTT_V5 ? MQTT_RC_SERVER_UNAVAILABLE : 3;
        rt__conn_send_packet(c, &ack);
        rt__conn_close(self, c, 0, RT_REASON_NORMAL);
        return 0;
    }
    /* Checked once: not again when the CONNECT is parsed anew with the verifier's verdict. */
    if (!resumed && !claimed && !login_verdict_now && refused_banned(self, c, pk, &peer))
        return 0;
    /* A resumed session's CONNECT was checked by the connection that handed it over. */
    if (!resumed && !claimed && !connect_authenticate(self, c, pk, &peer))
        return 0;
    /* A certificate's identity holds on the holder too: the CONNECT cannot name another. */
    if (resumed && rt__conn_identity_required(c) && !connect_identity(self, c, NULL))
        return 0;
    /* Parsed again after a claim or a hand-over: the name counts only if the login took it. */
    if (pk->connect.has_username && !c->username && !c->name_unvouched) {
        c->username = rt_strndup(self, pk->connect.username.p, pk->connect.username.len);
        if (!c->username)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
    }
    rt_pid_t old = 0;
    if (!resumed) {
        RT_ASSERT(!c->client_id);
        char *cid = tenant_client_id(self, c, assigned[0] ? assigned : (const char *)id.p,
                                     assigned[0] ? strlen(assigned) : id.len);
        if (!cid)
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        if (!claimed && rt__conn_tenant(c) && refused_banned_in_tenant(self, c, pk, cid, &peer)) {
            rt_free(self, cid);
            return 0;
        }
        /* Unclaimed (the node is cut off from the cluster): a session that would outlive
           the connection could exist on another node too, so it is refused; a clean one
           holds nothing to protect and goes ahead. */
        bool lasting = !clean || (c->version == MQTT_V5 &&
                                  (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY)) &&
                                  pk->props.session_expiry);
        if (claimed && claimed->status && (lasting || claimed->status == RT_EBUSY)) {
            rt_log(RT_LOG_WARNING, "client.refused_unclaimed", "client=%s %s", cid,
                   claimed->status == RT_EBUSY
                       ? "the node holding the id does not give it up"
                       : "cut off from the cluster, no persistent session can start");
            rt_free(self, cid);
            ack.reason = c->version == MQTT_V5 ? MQTT_RC_SERVER_UNAVAILABLE : 3;
            rt__conn_send_packet(c, &ack);
            rt__conn_close(self, c, 0, RT_REASON_NORMAL);
            return 0;
        }
        if (!claimed && !assigned[0] && claim_in_cluster(self, c, cid, !clean)) {
            rt_free(self, cid);
            return 0;
        }
        if (claimed && !claimed->status) {
            c->claimed = 1;
            c->lease = claimed->lease & 3;
        }
        if (!clean && !assigned[0]) {
            rt_pid_t holder = rt_broker_lookup_client(cid);
            if (holder && hand_socket_to_holder(self, c, holder, bytes, len))
                return 0; /* cid goes with the heap: this actor exits */
        }
        c->client_id = cid;
        rt__conn_count_session();
        old = rt_broker_claim_client(c->client_id, rt_self(self));
        if (old)
            rt_exit_signal(old, RT_REASON_TAKEOVER);
    }
    rt_tenant_t *tenant = rt__conn_tenant(c);
    /* One taking its own place over is let in: the one it replaces is on its way out. */
    if (tenant && !rt_tenant_connect(tenant, old != 0)) {
        ack.reason = c->version == MQTT_V5 ? MQTT_RC_QUOTA_EXCEEDED : 3;
        rt__conn_send_packet(c, &ack);
        rt__conn_close(self, c, 0, RT_REASON_NORMAL);
        return 0;
    }
    rt__conn_count_connected(c, true);
    rt__conn_user_rate(c);
    c->connected_at_ms = rt_wall_ms();
    c->clean_start = clean;
    uint64_t expiry = 0;
    if (c->version == MQTT_V5)
        expiry = (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY))
                     ? pk->props.session_expiry
                     : 0;
    else if (!clean)
        expiry = (uint64_t)RT_LIVE(max_session_expiry); /* 3.1.1: until the client cleans it */
    bool was_durable = resumed && rt__conn_session_is_durable(c);
    c->session_expiry = rt__conn_clamp_session_expiry(expiry);
    bool durable = rt__conn_session_is_durable(c);
    if (rt_store_enabled() && (durable || c->stored)) {
        rt_store_session(c->client_id, c->session_expiry, true, !resumed);
        if (durable && !was_durable)
            rt__conn_session_persist_all(c);
    }
    if (durable != was_durable && c->nsubs)
        subs_resubscribe_all(self, c);
    if (pk->connect.will) {
        int rc = will_from_connect(self, c, pk);
        if (rc)
            return rc;
    }
    c->recv_max = 65535;
    if (c->version == MQTT_V5) {
        if (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE)) {
            /* Past 2^29 - 1 it limits nothing: MQTT's largest packet is smaller. */
            uint32_t most = (1u << 29) - 1;
            c->peer_max_packet =
                pk->props.maximum_packet_size < most ? pk->props.maximum_packet_size : most;
        }
        if (pk->props.present & MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM))
            c->recv_max = pk->props.receive_maximum;
        long most = rt_broker->conf.max_topic_alias;
        uint16_t out =
            pk->props.topic_alias_maximum < most ? pk->props.topic_alias_maximum : (uint16_t)most;
        if (out && rt__conn_aliases_get_or_make(self, c) && !c->aliases->out)
            rt_alias_out_new(self, out, &c->aliases->out); /* none if it fails: topics go in full */
        c->rx_max = (uint16_t)RT_LIVE(receive_maximum);
    }
    c->keepalive = pk->connect.keepalive;
    long max_keepalive = RT_LIVE(max_keepalive);
    if (c->version == MQTT_V5 && c->keepalive > max_keepalive)
        c->keepalive = (uint16_t)max_keepalive;
    /* A session is present only if clean start was 0 and one was kept (3.2.2.1.1). */
    ack.connack.session_present = resumed && !clean;
    char *response = NULL;
    if (c->version == MQTT_V5) {
        if (pk->props.request_response_info && !(response = malloc(RT_RESPONSE_INFO_MAX)))
            return MQTT_ERR(MQTT_RC_UNSPECIFIED);
        connack_props(c, pk, &ack, assigned, c->session_expiry < expiry, response);
    }
    rt__conn_send_packet(c, &ack);
    free(response);
    rt__conn_record_session(self, c, true);
    atomic_fetch_add_explicit(&rt_broker->stats.connects, 1, memory_order_relaxed);
    if (rt_rules_wants_event(RT_RULE_EV_CLIENT_CONNECTED)) {
        rt_rule_origin_t o = rt__conn_rule_origin(self, c);
        rt_rule_event_t ev = {.kind = RT_RULE_EV_CLIENT_CONNECTED,
                              .qos = -1,
                              .reason_code = -1,
                              .proto_ver = c->version,
                              .keepalive = c->keepalive,
                              .clean_start = clean};
        rt_rules_event(&o, &ev);
    }
    if (rt_log_enabled(RT_LOG_INFO)) {
        char peer_text[64];
        rt__conn_peer_text(rt__conn_peer(c, &peer), peer_text, sizeof(peer_text));
        rt_log(RT_LOG_INFO, "client.connected",
               "client=%s peer=%s user=%s transport=%s version=%u keepalive=%u takeover=%d "
               "resumed=%d",
               c->client_id, peer_text, c->username ? c->username : "-",
               rt_listener_kind(c->listener), c->version, c->keepalive, old != 0, resumed);
    }
    rt__conn_arm_keepalive(self, c);
    if (resumed)
        rt__conn_retransmit(self, c);
    if (rt_broker->conf.nauto_subs)
        rt__conn_auto_subscribe(self, c);
    return 0;
}

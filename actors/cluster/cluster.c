/*
** The cluster over NATS (cluster.h, cluster_impl.h): the NATS connections, the `cluster` actor
** that makes every libnats call that publishes or subscribes, `cluster_kv` for what waits on
** JetStream, and `cluster_in` that takes what other nodes send; start, stop and status.
*/
#include <errno.h>
#include <sys/random.h>

#include "cluster_impl.h"

const char rt__cluster_takeover_request[] = "takeover";
const char rt__cluster_handover_request[] = "handover";
const char rt__cluster_admin_request[] = "admin";
const char rt__cluster_heartbeat[] = "heartbeat";
const char rt__cluster_sync_request[] = "sync";

rt__cluster_t rt__cluster = {.backlog_lock = PTHREAD_MUTEX_INITIALIZER,
                             .backlog_cond = PTHREAD_COND_INITIALIZER,
                             .nodes_lock = PTHREAD_MUTEX_INITIALIZER};

bool rt_cluster_on(void)
{
    return rt__cluster.on;
}

const char *rt_cluster_node(void)
{
    return rt__cluster.on ? rt__cluster.node : "";
}

static int out_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&rt__cluster.out_pid, rt_self(self), memory_order_release);
    /* A restart may have lost the connector's word: routes held meanwhile are made now. */
    if (rt__cluster.nc && rt__cluster.qc)
        rt_send(rt_self(self), MSG_CONNECTED, NULL, 0);
    return rt_send(rt_self(self), MSG_HEARTBEAT, NULL, 0);
}

static void out_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    if (m->tag == MSG_FORWARD && m->bin) {
        rt__cluster_forward_one(m);
    } else if (m->tag == MSG_HEARTBEAT) {
        rt__cluster_send_heartbeat(self);
    } else if (m->tag == MSG_REPLY && m->len >= sizeof(reply_t)) {
        rt__cluster_send_reply((const reply_t *)(const void *)m->data);
    } else if (m->tag == MSG_MOVE_SYNC && m->len >= sizeof(move_t)) {
        /* The imported session's subscriptions were made before this message was sent:
           once the server has them, whatever the old holder queues after is its tail. */
        natsConnection_FlushTimeout(rt__cluster.nc, JETSTREAM_WAIT_MS);
        rt_msg_t *tail = rt_msg_new(MSG_MOVE_TAIL, m->len);
        if (tail)
            memcpy(tail->data, m->data, m->len);
        if (!tail ||
            rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), tail))
            rt__cluster_move_unmerged((const move_t *)(const void *)m->data);
    } else if (m->tag == MSG_CHANNEL && m->len >= sizeof(channel_t)) {
        rt__cluster_channel_publish(m);
    } else if (m->tag == MSG_CONNECTED) {
        rt__cluster_subscribe_held(self);
        rt__cluster_channel_subscribe();
    } else if (m->tag == MSG_INTEREST) {
        const interest_t *in = (const interest_t *)(const void *)m->data;
        if (in->on)
            rt__cluster_subscribe(self, in->filter, in->len);
        else
            rt__cluster_unsubscribe(self, in->filter, in->len);
    }
}

/* What the cluster actor never forwarded (it exited first): a publisher waiting for the
   bucket or the stream is told it was not kept, a CONNECT whose session moved goes on. */
static void out_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag == MSG_MOVE_SYNC && m->len >= sizeof(move_t))
        rt__cluster_move_unmerged((const move_t *)(const void *)m->data);
    if (m->tag == MSG_CHANNEL)
        atomic_fetch_add_explicit(&rt__cluster.channel_failed, 1, memory_order_relaxed);
    if (m->tag != MSG_FORWARD || m->len < sizeof(forward_t))
        return;
    const forward_t *f = (const forward_t *)(const void *)m->data;
    if (f->ack_pid)
        rt__cluster_unkept(f->ack_pid, f->ack_token);
}

static void out_turn_end(rt_actor_t *self, void *state)
{
    (void)self;
    (void)state;
    rt__cluster_channel_flush();
}

static void out_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)state;
    (void)reason;
    rt__cluster_channel_drop();
}

static const rt_actor_type_t out_type = {
    .name = "cluster",
    .init = out_init,
    .handle = out_handle,
    .turn_end = out_turn_end,
    .terminate = out_terminate,
    .dead_letter = out_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

/*
** Requests that wait for JetStream's answer (claims, the retained store's last revision)
** have an actor of their own, so that a CONNECT being claimed never holds up the messages
** the cluster actor forwards.
*/
static int kv_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&rt__cluster.kv_pid, rt_self(self), memory_order_release);
    /* Not here: init runs on the spawner's thread, and binding asks JetStream. */
    return rt_send(rt_self(self), MSG_KV_BIND, NULL, 0);
}

static void kv_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid));
    if (m->tag == MSG_KV_BIND)
        rt__cluster_kv_bind(self);
    else if (m->tag == MSG_BARRIER && m->len >= sizeof(barrier_t))
        rt__cluster_barrier_start(m);
    else if (m->tag == MSG_CLAIM && m->len >= sizeof(claim_t))
        rt__cluster_claim_one((const claim_t *)(const void *)m->data);
    else if (m->tag == MSG_MOVE_TAIL && m->len >= sizeof(move_t))
        rt__cluster_move_tail((const move_t *)(const void *)m->data);
    else if (m->tag == MSG_SESSION_PUT && m->len >= sizeof(record_t))
        rt__cluster_session_put((const record_t *)(const void *)m->data);
    else if (m->tag == MSG_BAN_PUT)
        rt__cluster_ban_put(m);
    else if (m->tag == MSG_CATCH_UP)
        rt__cluster_catch_up(self);
}

static const rt_actor_type_t kv_type = {
    .name = "cluster_kv",
    .init = kv_init,
    .handle = kv_handle,
    .flags = RT_TYPE_BLOCKING,
};

static void backlog_release(size_t bytes)
{
    /* Each release pairs with one rt__cluster_hand_in: the counts never go below zero. */
    uint64_t msgs = atomic_fetch_sub_explicit(&rt__cluster.backlog_msgs, 1, memory_order_acq_rel);
    uint64_t held =
        atomic_fetch_sub_explicit(&rt__cluster.backlog_bytes, bytes, memory_order_acq_rel);
    RT_ASSERT(msgs >= 1 && held >= bytes);
    (void)msgs;
    (void)held;
    if (atomic_load_explicit(&rt__cluster.backlog_waiters, memory_order_acquire)) {
        pthread_mutex_lock(&rt__cluster.backlog_lock);
        pthread_cond_broadcast(&rt__cluster.backlog_cond);
        pthread_mutex_unlock(&rt__cluster.backlog_lock);
    }
}

static bool backlog_full(void)
{
    return atomic_load_explicit(&rt__cluster.backlog_msgs, memory_order_acquire) >=
               RT_CLUSTER_INBOUND_MAX_MSGS ||
           atomic_load_explicit(&rt__cluster.backlog_bytes, memory_order_acquire) >=
               RT_CLUSTER_INBOUND_MAX_BYTES;
}

/* The delivery or watcher thread waits for room (never a scheduler): NATS's own pending
   limit, or JetStream's flow control, takes over meanwhile. */
void rt__cluster_backlog_wait(void)
{
    RT_ASSERT(!rt_current()); /* it blocks: on a scheduler it would stall every actor there */
    if (!backlog_full())
        return;
    pthread_mutex_lock(&rt__cluster.backlog_lock);
    atomic_fetch_add_explicit(&rt__cluster.backlog_waiters, 1, memory_order_acq_rel);
    while (backlog_full() && !atomic_load(&rt__cluster.stopping)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&rt__cluster.backlog_cond, &rt__cluster.backlog_lock, &until);
    }
    atomic_fetch_sub_explicit(&rt__cluster.backlog_waiters, 1, memory_order_acq_rel);
    pthread_mutex_unlock(&rt__cluster.backlog_lock);
}

/* Hands cluster_in a message from a libnats thread, within the inbound backlog's bound. */
bool rt__cluster_hand_in(rt_msg_t *m, size_t bytes)
{
    atomic_fetch_add_explicit(&rt__cluster.backlog_msgs, 1, memory_order_acq_rel);
    atomic_fetch_add_explicit(&rt__cluster.backlog_bytes, bytes, memory_order_acq_rel);
    if (rt_send_unmuted(atomic_load_explicit(&rt__cluster.in_pid, memory_order_acquire), m) == 0)
        return true;
    atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
    backlog_release(bytes);
    return false;
}

void rt__cluster_on_message(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)nc;
    (void)sub;
    RT_ASSERT(!rt_current()); /* libnats's delivery thread: it hands over, never runs ours */
    size_t bytes = (size_t)natsMsg_GetDataLength(msg) + 256;
    rt__cluster_backlog_wait();
    rt_msg_t *m = rt_msg_new(MSG_INBOUND, sizeof(inbound_t));
    if (!m) {
        atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
        natsMsg_Destroy(msg);
        return;
    }
    *(inbound_t *)(void *)m->data = (inbound_t){.msg = msg, .share = closure, .bytes = bytes};
    if (!rt__cluster_hand_in(m, bytes))
        natsMsg_Destroy(msg);
}

/*
** Every subscription delivered by libnats's pool thread is made here, so that rt_cluster_stop
** can wait until the pool thread has handled each one's close. libnats 3.4's nats_CloseAndWait
** stops its collector thread and the pool thread together, and a close message the pool
** thread frees after the collector has gone is lost: a leak at each stop (LeakSanitizer saw
** it in the cluster's tests). closure_owned: the closure is malloc'ed, freed with the
** subscription.
*/
static void pool_sub_closed(void *owned)
{
    free(owned);
    pthread_mutex_lock(&rt__cluster.backlog_lock);
    atomic_fetch_sub(&rt__cluster.pool_subs, 1);
    pthread_cond_broadcast(&rt__cluster.backlog_cond);
    pthread_mutex_unlock(&rt__cluster.backlog_lock);
}

natsStatus rt__cluster_pool_subscribe(natsSubscription **sub, natsConnection *nc,
                                      const char *subject, const char *queue, void *closure,
                                      bool closure_owned)
{
    atomic_fetch_add(&rt__cluster.pool_subs, 1);
    natsStatus s =
        queue ? natsConnection_QueueSubscribe(sub, nc, subject, queue, rt__cluster_on_message,
                                              closure)
              : natsConnection_Subscribe(sub, nc, subject, rt__cluster_on_message, closure);
    if (s == NATS_OK && natsSubscription_SetOnCompleteCB(*sub, pool_sub_closed,
                                                         closure_owned ? closure : NULL) == NATS_OK)
        return NATS_OK;
    /* Not made, or closed already (its connection with it): nothing will say it closed. */
    pool_sub_closed(closure_owned ? closure : NULL);
    return s;
}

/* Bounded: the pool thread only hands messages over while the cluster stops (stop_waiting). */
static void wait_pool_subs_closed(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&rt__cluster.backlog_lock);
    while (atomic_load(&rt__cluster.pool_subs) > 0 &&
           pthread_cond_timedwait(&rt__cluster.backlog_cond, &rt__cluster.backlog_lock, &until) !=
               ETIMEDOUT)
        ;
    pthread_mutex_unlock(&rt__cluster.backlog_lock);
}

static int in_init(rt_actor_t *self, void *state, void *arg)
{
    atomic_store_explicit(&rt__cluster.in_pid, rt_self(self), memory_order_release);
    return 0;
}

static void in_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    in_state_t *st = state;
    if (m->tag == MSG_INBOUND) {
        const inbound_t *in = (const inbound_t *)(const void *)m->data;
        if (in->share == rt__cluster_takeover_request)
            rt__cluster_give_up(in->msg, 1);
        else if (in->share == rt__cluster_handover_request)
            rt__cluster_give_up(in->msg, 2);
        else if (in->share == rt__cluster_admin_request)
            rt__cluster_admin_asked(in->msg);
        else if (in->share == rt__cluster_heartbeat)
            rt__cluster_other_heartbeat(in->msg);
        else if (in->share == rt__cluster_sync_request)
            rt__cluster_sync_asked(in->msg);
        else if (in->share == rt__cluster_channel)
            rt__cluster_channel_in(in->msg);
        else
            rt__cluster_route_inbound(st, in);
        natsMsg_Destroy(in->msg);
        backlog_release(in->bytes);
    } else if (m->tag == MSG_KV_ENTRY) {
        const kv_entry_t *k = (const kv_entry_t *)(const void *)m->data;
        rt__cluster_apply_entry(k);
        atomic_store(&rt__cluster.kv_applied, k->revision);
        backlog_release(k->bytes);
        rt__cluster_barriers_check(self, st);
    } else if (m->tag == MSG_BARRIER_WAIT && m->len >= sizeof(barrier_t)) {
        rt__cluster_barrier_wait(self, st, m);
    } else if (m->tag == MSG_KV_TICK) {
        rt__cluster_barriers_check(self, st);
    }
}

static void in_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    in_state_t *st = state;
    for (size_t i = 0; i < st->nbarriers; i++)
        rt_msg_free(st->barriers[i]);
    free(st->barriers);
}

/* What cluster_in never routed (it exited): still counted out of the backlog. */
static void in_dead_letter(void *state, rt_msg_t *m)
{
    if (m->tag == MSG_INBOUND) {
        const inbound_t *in = (const inbound_t *)(const void *)m->data;
        natsMsg_Destroy(in->msg);
        backlog_release(in->bytes);
        atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
    } else if (m->tag == MSG_KV_ENTRY) {
        backlog_release(((const kv_entry_t *)(const void *)m->data)->bytes);
        atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
    }
}

static const rt_actor_type_t in_type = {
    .name = "cluster_in",
    .state_size = sizeof(in_state_t),
    .init = in_init,
    .handle = in_handle,
    .terminate = in_terminate,
    .dead_letter = in_dead_letter,
};

/*
** What rtd accepts should fit what NATS takes: a PUBLISH of max_packet_size with its headers
** under the server's max_payload (MQTT 5 properties travel hex-encoded: they count twice).
** Said at each connection; a message that does not fit stays on its node, and that is said
** too (cluster.forward_failed).
*/
static void check_max_payload(natsConnection *nc)
{
    int64_t max = natsConnection_GetMaxPayload(nc);
    if (max > 0 && max < rt__cluster.max_packet + 4096)
        rt_log(RT_LOG_WARNING, "cluster.max_payload",
               "nats-server takes messages up to %" PRId64 " bytes, headers included, and rtd "
               "accepts packets up to %ld (max_packet_size): larger messages (MQTT 5 properties "
               "count twice) stay on their node. Set max_payload in nats-server to at least %ld "
               "(twice that for messages with large properties).",
               max, rt__cluster.max_packet, rt__cluster.max_packet + 4096);
}

/* Shared groups are the cluster's to serve while both connections are up (route.h). */
static void connection_state(const char *role, bool up)
{
    atomic_store(strcmp(role, "shared") == 0 ? &rt__cluster.qc_up : &rt__cluster.nc_up, up);
    rt_route_set_shared_by_cluster(atomic_load(&rt__cluster.nc_up) &&
                                   atomic_load(&rt__cluster.qc_up));
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    connection_state(closure, false);
    if (strcmp(closure, "routes") == 0)
        rt__cluster_cut();
    if (!atomic_load(&rt__cluster.stopping))
        rt_log(RT_LOG_WARNING, "cluster.disconnected", "connection=%s NATS connection lost",
               (const char *)closure);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    char url[128] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof(url));
    atomic_fetch_add_explicit(&rt__cluster.reconnects, 1, memory_order_relaxed);
    connection_state(closure, true);
    rt_log(RT_LOG_INFO, "cluster.reconnected", "connection=%s server=%s", (const char *)closure,
           url);
    /* What the stream kept meanwhile and NATS did not bring here (durable.c). */
    rt_pid_t kv = atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire);
    if (strcmp(closure, "routes") == 0 && atomic_load(&rt__cluster.cut_ms) && kv)
        rt_send_unmuted(kv, rt_msg_new(MSG_CATCH_UP, 0));
}

/* What NATS said last on nc (the server's own words: "Authorization Violation", a
   permissions violation with its subject), or the status's name. */
static const char *nats_said(natsConnection *nc, natsStatus err)
{
    const char *text = NULL;
    natsConnection_GetLastError(nc, &text);
    return text && text[0] ? text : natsStatus_GetText(err);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    if (err == NATS_SLOW_CONSUMER) {
        int64_t dropped = 0;
        if (sub)
            natsSubscription_GetDropped(sub, &dropped);
        atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.slow_consumer",
               "NATS dropped messages for this node (%" PRId64 " on the subscription so far)",
               dropped);
        return;
    }
    rt_log(RT_LOG_ERROR, "cluster.nats_error", "connection=%s %s", (const char *)closure,
           nats_said(nc, err));
}

/* libnats closes a connection for good when a server refuses the same credentials twice in
   a row (libnats 3.4 cannot be told otherwise): said, as the node is cut off until restarted. */
static void on_closed(natsConnection *nc, void *closure)
{
    connection_state(closure, false);
    if (!atomic_load(&rt__cluster.stopping))
        rt_log(RT_LOG_ERROR, "cluster.closed",
               "connection=%s %s; NATS gave up on this connection: restart rtd once the "
               "servers take its credentials",
               (const char *)closure, nats_said(nc, NATS_CONNECTION_CLOSED));
}

static void on_connected(natsConnection *nc, void *closure)
{
    connection_state(closure, true);
    if (strcmp(closure, "routes") == 0)
        check_max_payload(nc);
    char url[128] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof(url));
    rt_log(RT_LOG_INFO, "cluster.connected", "connection=%s server=%s", (const char *)closure, url);
}

/* Whether any of the node's settings signs it in to NATS (a user in a URL counts). */
static bool has_credentials(const rt_conf_t *conf)
{
    bool in_url = false;
    for (unsigned i = 0; i < conf->cluster.nnats && !in_url; i++) {
        const char *authority = strstr(conf->cluster.nats[i], "://");
        authority = authority ? authority + 3 : conf->cluster.nats[i];
        const char *at = strchr(authority, '@'), *slash = strchr(authority, '/');
        in_url = at && (!slash || at < slash);
    }
    return in_url || conf->cluster.user[0] || conf->cluster.token[0] || conf->cluster.creds[0] ||
           conf->cluster.nkey[0] || conf->cluster.tls_cert[0];
}

/* The host of a NATS URL is 127.0.0.0/8, ::1 or localhost. */
static bool loopback_url(const char *url)
{
    const char *host = strstr(url, "://");
    host = host ? host + 3 : url;
    const char *at = strchr(host, '@');
    if (at)
        host = at + 1;
    if (strncmp(host, "127.", 4) == 0 || strncmp(host, "[::1]", 5) == 0)
        return true;
    return strncmp(host, "localhost", 9) == 0 && (host[9] == 0 || host[9] == ':' || host[9] == '/');
}

/*
** The options of one of the node's two connections. libnats reconnects on its own once a
** connection was made; its PINGs notice a server that stops answering (SIGSTOP, a frozen
** host) within RT_CLUSTER_STALE_MS and it moves on to another server of the cluster.
*/
static natsStatus make_options(const rt_conf_t *conf, bool no_echo, const char *role,
                               natsOptions **out)
{
    natsOptions *o = NULL;
    const char *servers[RT_CONF_MAX_NATS];
    for (unsigned i = 0; i < conf->cluster.nnats; i++)
        servers[i] = conf->cluster.nats[i];
    char name[64];
    snprintf(name, sizeof(name), "rtd:%s:%s", conf->cluster.node, role);
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, servers, (int)conf->cluster.nnats);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)
        s = natsOptions_SetNoEcho(o, no_echo);
    if (s == NATS_OK)
        s = natsOptions_UseGlobalMessageDelivery(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1); /* a node keeps trying: NATS comes back */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, RT_CLUSTER_RETRY_MS);
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(o, RT_CLUSTER_PING_MS);
    if (s == NATS_OK)
        s = natsOptions_SetMaxPingsOut(o, RT_CLUSTER_PINGS_OUT);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, RT_CLUSTER_CONNECT_WAIT_MS);
    if (s == NATS_OK) /* a write into a server that stopped reading fails, not blocks */
        s = natsOptions_SetWriteDeadline(o, RT_CLUSTER_CONNECT_WAIT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(o, on_closed, (void *)role);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, (void *)role);
    if (s == NATS_OK && conf->cluster.user[0])
        s = natsOptions_SetUserInfo(o, conf->cluster.user, conf->cluster.password);
    if (s == NATS_OK && conf->cluster.token[0])
        s = natsOptions_SetToken(o, conf->cluster.token);
    if (s == NATS_OK && conf->cluster.creds[0])
        s = natsOptions_SetUserCredentialsFromFiles(o, conf->cluster.creds, NULL);
    if (s == NATS_OK && conf->cluster.nkey[0])
        s = natsOptions_SetNKeyFromSeed(o, conf->cluster.nkey, conf->cluster.nkey_seed);
    if (s == NATS_OK && conf->cluster.tls_ca[0])
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && conf->cluster.tls_ca[0])
        s = natsOptions_LoadCATrustedCertificates(o, conf->cluster.tls_ca);
    if (s == NATS_OK && conf->cluster.tls_cert[0])
        s = natsOptions_LoadCertificatesChain(o, conf->cluster.tls_cert, conf->cluster.tls_key);
    if (s != NATS_OK) {
        natsOptions_Destroy(o);
        o = NULL;
    }
    *out = o;
    return s;
}

/*
** One try at connection i (0: routes, 1: shared), every server once. Until a connection is
** made there is none at all (rt__cluster.nc or qc NULL): libnats's own retry of a first
** connect gives up for good on a server that refuses the credentials twice, so rtd retries
** itself (the connector) and says what NATS answered, once per change of answer.
*/
static bool try_connect(int i)
{
    static const char *const roles[2] = {"routes", "shared"};
    natsConnection *nc = NULL;
    natsStatus s = natsConnection_Connect(&nc, rt__cluster.opts[i]);
    if (s == NATS_OK) {
        natsOptions_Destroy(rt__cluster.opts[i]);
        rt__cluster.opts[i] = NULL;
        atomic_store(i ? &rt__cluster.qc : &rt__cluster.nc, nc);
        on_connected(nc, (void *)roles[i]);
        rt__cluster.refusal[i][0] = 0;
        return true;
    }
    const char *said = nats_GetLastError(NULL);
    said = said && said[0] ? said : natsStatus_GetText(s);
    if (strcmp(said, rt__cluster.refusal[i]) != 0) {
        snprintf(rt__cluster.refusal[i], sizeof(rt__cluster.refusal[i]), "%s", said);
        if (s == NATS_NO_SERVER || s == NATS_TIMEOUT || s == NATS_IO_ERROR)
            rt_log(RT_LOG_WARNING, "cluster.not_connected",
                   "connection=%s no NATS server answers yet (%s); trying every %d ms", roles[i],
                   said, RT_CLUSTER_RETRY_MS);
        else
            rt_log(RT_LOG_ERROR, "cluster.nats_refused",
                   "connection=%s NATS refused: %s; trying every %d ms", roles[i], said,
                   RT_CLUSTER_RETRY_MS);
    }
    return false;
}

/* The connector thread: tries until both connections are made, then has the cluster actor
   subscribe what its clients asked for meanwhile. */
static void *connector(void *arg)
{
    (void)arg;
    bool done = false;
    while (!done && !atomic_load(&rt__cluster.stopping)) {
        pthread_mutex_lock(&rt__cluster.backlog_lock);
        if (!atomic_load(&rt__cluster.stopping)) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += RT_CLUSTER_RETRY_MS * 1000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&rt__cluster.backlog_cond, &rt__cluster.backlog_lock, &until);
        }
        pthread_mutex_unlock(&rt__cluster.backlog_lock);
        done = (atomic_load(&rt__cluster.nc) || try_connect(0)) &&
               (atomic_load(&rt__cluster.qc) || try_connect(1));
    }
    if (done)
        rt_send(atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire), MSG_CONNECTED,
                NULL, 0);
    return NULL;
}

static int out_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&out_type, NULL, opts, out);
}

static int in_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&in_type, NULL, opts, out);
}

static int kv_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    return rt_spawn_opt(&kv_type, NULL, opts, out);
}

/* Wakes a delivery thread waiting for room, for good: what arrives from now on is dropped. */
static void stop_waiting(void)
{
    atomic_store(&rt__cluster.stopping, true);
    pthread_mutex_lock(&rt__cluster.backlog_lock);
    pthread_cond_broadcast(&rt__cluster.backlog_cond);
    pthread_mutex_unlock(&rt__cluster.backlog_lock);
}

/* Once no actor of the cluster runs: nothing else makes libnats calls then. */
static void close_connections(void)
{
    if (rt__cluster.connector_on)
        pthread_join(rt__cluster.connector, NULL);
    rt__cluster.connector_on = false;
    for (int i = 0; i < 2; i++) {
        natsOptions_Destroy(rt__cluster.opts[i]);
        rt__cluster.opts[i] = NULL;
    }
    if (atomic_load(&rt__cluster.kv_ready)) {
        kvWatcher *w = atomic_load(&rt__cluster.kv_watcher);
        if (w)
            kvWatcher_Stop(w);
        pthread_join(rt__cluster.watcher, NULL);
    }
    rt__cluster_banned_close();
    natsSubscription *own[] = {rt__cluster.takeover_sub,   rt__cluster.handover_sub,
                               rt__cluster.admin_sub,      rt__cluster.status_sub,
                               rt__cluster.sync_sub,       rt__cluster.channel_subs[0],
                               rt__cluster.channel_subs[1]};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (own[i]) {
            natsSubscription_Unsubscribe(own[i]);
            natsSubscription_Destroy(own[i]);
        }
    rt__cluster.takeover_sub = rt__cluster.handover_sub = rt__cluster.admin_sub =
        rt__cluster.status_sub = rt__cluster.sync_sub = rt__cluster.channel_subs[0] =
            rt__cluster.channel_subs[1] = NULL;
    rt__cluster_claims_close();
    kvStore_Destroy(rt__cluster.clients);
    kvStore_Destroy(rt__cluster.sessions);
    kvStore_Destroy(rt__cluster.kv);
    jsCtx_Destroy(rt__cluster.pjs);
    jsCtx_Destroy(rt__cluster.js);
    rt__cluster.sessions = NULL;
    rt__cluster.pjs = NULL;
    rt__cluster.clients = NULL;
    rt__cluster.kv = NULL;
    rt__cluster.js = NULL;
    natsConnection *conns[2] = {rt__cluster.qc, rt__cluster.nc};
    for (int i = 0; i < 2; i++)
        if (conns[i])
            natsConnection_Close(conns[i]);
    for (size_t i = 0; i < rt__cluster.routes_cap; i++) {
        for (int k = 0; k < rt__cluster.routes[i].nsubs; k++)
            natsSubscription_Destroy(rt__cluster.routes[i].subs[k]);
        free(rt__cluster.routes[i].filter);
    }
    free(rt__cluster.routes);
    rt__cluster.routes = NULL;
    rt__cluster.routes_cap = rt__cluster.routes_used = rt__cluster.routes_live = 0;
    wait_pool_subs_closed();
    for (int i = 0; i < 2; i++)
        if (conns[i])
            natsConnection_Destroy(conns[i]);
    rt__cluster.nc = rt__cluster.qc = NULL;
}

/*
** The node's credentials before it connects: some for every NATS server off this host
** (unless told otherwise), and the control traffic's secret.
*/
static int check_credentials(const rt_conf_t *conf, char *err, size_t errlen)
{
    for (unsigned i = 0; i < conf->cluster.nnats && !conf->cluster.nats_without_credentials &&
                         !has_credentials(conf);
         i++) {
        if (loopback_url(conf->cluster.nats[i]))
            continue;
        snprintf(err, errlen,
                 "cluster: %s is off this host and the node has no NATS credentials (user, "
                 "token, creds, nkey or tls_cert): whoever reaches that server could read every "
                 "message and steer the cluster. Give the node its credentials, or set "
                 "cluster.nats_without_credentials = true if that is intended",
                 conf->cluster.nats[i]);
        return RT_EINVAL;
    }
    return rt__cluster_secret_load(conf, err, errlen);
}

static void nats_setup_error(natsStatus s, char *err, size_t errlen)
{
    snprintf(err, errlen, "cluster: cannot set up the NATS connection: %s (%s)",
             natsStatus_GetText(s), nats_GetLastError(NULL));
}

int rt_cluster_check(const rt_conf_t *conf, char *err, size_t errlen)
{
    if (!conf->cluster.on)
        return 0;
    int rc = check_credentials(conf, err, errlen);
    if (rc)
        return rc;
    /* libnats reads the credentials and nkey seed files only as it connects: opened here. */
    const struct {
        const char *name, *path;
    } files[] = {{"creds", conf->cluster.creds}, {"nkey_seed", conf->cluster.nkey_seed}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        FILE *f = files[i].path[0] ? fopen(files[i].path, "r") : NULL;
        if (f)
            fclose(f);
        else if (files[i].path[0]) {
            snprintf(err, errlen, "cluster.%s %s: %s", files[i].name, files[i].path,
                     strerror(errno));
            return RT_EINVAL;
        }
    }
    /* Its TLS files it loads as the options are made. */
    natsOptions *o = NULL;
    natsStatus s = nats_Open(-1);
    if (s == NATS_OK)
        s = make_options(conf, true, "check", &o);
    if (s != NATS_OK)
        nats_setup_error(s, err, errlen);
    natsOptions_Destroy(o);
    nats_Close();
    return s == NATS_OK ? 0 : RT_EINVAL;
}

int rt_cluster_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen)
{
    if (!conf->cluster.on)
        return 0;
    snprintf(rt__cluster.node, sizeof(rt__cluster.node), "%s", conf->cluster.node);
    snprintf(rt__cluster.prefix, sizeof(rt__cluster.prefix), "%s", conf->cluster.prefix);
    snprintf(rt__cluster.bucket, sizeof(rt__cluster.bucket), "%s_retained", conf->cluster.prefix);
    rt__cluster.replicas = conf->cluster.replicas;
    rt__cluster.max_packet = conf->max_packet_size;
    rt__cluster.started_ms = rt_mono_ms();
    if (getrandom(&rt__cluster.incarnation, sizeof(rt__cluster.incarnation), 0) !=
        sizeof(rt__cluster.incarnation))
        rt__cluster.incarnation = rt_wall_ms();
    rt__cluster.sup = sup;
    rt__cluster.node_key = rt__cluster_node_key(rt__cluster.node, rt__cluster.incarnation);
    rt__cluster.durable = conf->cluster.durable;
    rt__cluster.margin_ms = conf->cluster.replay_margin * 1000;
    rt__cluster.max_age_s = conf->max_session_expiry;
    snprintf(rt__cluster.stream, sizeof(rt__cluster.stream), "%s_msgs", conf->cluster.prefix);
    snprintf(rt__cluster.value, sizeof(rt__cluster.value), "%s %016" PRIx64, rt__cluster.node,
             rt__cluster.incarnation);
    int rc = check_credentials(conf, err, errlen);
    if (rc)
        return rc;
    /* One delivery thread for every subscription: what NATS sent arrives in its order. */
    natsStatus s = nats_Open(-1);
    if (s == NATS_OK)
        s = nats_SetMessageDeliveryPoolSize(1);
    if (s == NATS_OK)
        s = make_options(conf, true, "routes", &rt__cluster.opts[0]);
    if (s == NATS_OK)
        s = make_options(conf, false, "shared", &rt__cluster.opts[1]);
    if (s != NATS_OK) {
        nats_setup_error(s, err, errlen);
        stop_waiting();
        close_connections();
        return RT_EINVAL;
    }
    /* The first try here, so that a node whose NATS answers starts connected. */
    bool connected = try_connect(0) && try_connect(1);
    rt_child_spec_t children[] = {
        {.name = "cluster", .start = out_start, .restart = RT_PERMANENT},
        {.name = "cluster_in", .start = in_start, .restart = RT_PERMANENT},
        {.name = "cluster_kv", .start = kv_start, .restart = RT_PERMANENT},
    };
    rt_pid_t group;
    rc = rt_group_start(sup, RT_CLUSTER_GROUP, RT_PERMANENT, &group);
    for (size_t i = 0; rc == 0 && i < sizeof(children) / sizeof(children[0]); i++)
        rc = rt_supervisor_start_child(group, &children[i], NULL);
    if (rc) {
        snprintf(err, errlen, "cluster: cannot start its actors: %s", rt_strerror(rc));
        stop_waiting();
        rt_group_stop(sup, RT_CLUSTER_GROUP);
        close_connections();
        return rc;
    }
    if (!connected && pthread_create(&rt__cluster.connector, NULL, connector, NULL) == 0)
        rt__cluster.connector_on = true;
    else if (!connected)
        rt_log(RT_LOG_ERROR, "cluster.failed", "no thread to connect to NATS: this node is alone");
    rt__cluster.on = true;
    rt__cluster_lease_start();
    rt_trie_set_interest(rt_broker->trie, rt__cluster_interest_changed, NULL);
    rt_message_keep_origins();
    rt_route_set_stamp(rt__cluster_stamp);
    rt_route_set_forward(rt__cluster_forward);
    char servers[512] = "";
    for (unsigned i = 0; i < conf->cluster.nnats; i++)
        snprintf(servers + strlen(servers), sizeof(servers) - strlen(servers), "%s%s", i ? "," : "",
                 conf->cluster.nats[i]);
    rt_log(RT_LOG_INFO, "cluster.started", "node=%s nats=%s prefix=%s", rt__cluster.node, servers,
           rt__cluster.prefix);
    return 0;
}

void rt_cluster_stop(void)
{
    if (!rt__cluster.on)
        return;
    stop_waiting();
    rt__cluster_lease_stop();
    rt_group_stop(rt__cluster.sup, RT_CLUSTER_GROUP);
    close_connections();
    nats_CloseAndWait(2000);
}

bool rt_cluster_status(rt_cluster_status_t *st)
{
    memset(st, 0, sizeof(*st));
    if (!rt__cluster.on)
        return false;
    snprintf(st->node, sizeof(st->node), "%s", rt__cluster.node);
    natsConnection *nc = rt__cluster.nc;
    const char *state = nc ? "closed" : "connecting";
    if (nc) {
        switch (natsConnection_Status(nc)) {
        case NATS_CONN_STATUS_CONNECTED:
            state = "connected";
            break;
        case NATS_CONN_STATUS_CONNECTING:
            state = "connecting";
            break;
        case NATS_CONN_STATUS_RECONNECTING:
            state = "reconnecting";
            break;
        default:
            break;
        }
        natsConnection_GetConnectedUrl(nc, st->server, sizeof(st->server));
        char **servers = NULL;
        int n = 0;
        if (natsConnection_GetServers(nc, &servers, &n) == NATS_OK) {
            for (int i = 0; i < n; i++) {
                size_t at = strlen(st->servers);
                snprintf(st->servers + at, sizeof(st->servers) - at, "%s%s", i ? "," : "",
                         servers[i]);
                free(servers[i]);
            }
            free(servers);
        }
    }
    snprintf(st->state, sizeof(st->state), "%s", state);
    st->routes = atomic_load(&rt__cluster.routes_count);
    st->forwarded_out = atomic_load(&rt__cluster.forwarded_out);
    st->forwarded_in = atomic_load(&rt__cluster.forwarded_in);
    st->duplicates = atomic_load(&rt__cluster.duplicates);
    st->forward_failed = atomic_load(&rt__cluster.forward_failed);
    st->not_forwarded = atomic_load(&rt__cluster.not_forwarded);
    st->bad_in = atomic_load(&rt__cluster.bad_in);
    st->dropped_in = atomic_load(&rt__cluster.dropped_in);
    st->inbound_backlog = atomic_load(&rt__cluster.backlog_msgs);
    st->reconnects = atomic_load(&rt__cluster.reconnects);
    st->retained_replicated = atomic_load(&rt__cluster.kv_ready);
    st->retained_revision = atomic_load(&rt__cluster.kv_applied);
    st->retained_put_failed = atomic_load(&rt__cluster.kv_put_failed);
    st->retained_barrier_timeouts = atomic_load(&rt__cluster.barrier_timeouts);
    st->claims = atomic_load(&rt__cluster.claims);
    st->claims_taken_over = atomic_load(&rt__cluster.claims_taken_over);
    st->claims_pipelined = atomic_load(&rt__cluster.claims_pipelined);
    st->claims_in_flight = rt__cluster_claims_in_flight();
    st->claims_failed = atomic_load(&rt__cluster.claims_failed);
    st->given_up = atomic_load(&rt__cluster.given_up);
    st->sessions_moved_in = atomic_load(&rt__cluster.sessions_moved_in);
    st->sessions_moved_out = atomic_load(&rt__cluster.sessions_moved_out);
    st->sessions_move_failed = atomic_load(&rt__cluster.sessions_move_failed);
    st->move_syncs_incomplete = atomic_load(&rt__cluster.move_syncs_incomplete);
    st->durable = rt__cluster.durable && atomic_load(&rt__cluster.durable_ready);
    st->stream_acked = atomic_load(&rt__cluster.stream_acked);
    st->stream_failed = atomic_load(&rt__cluster.stream_failed);
    st->session_records_failed = atomic_load(&rt__cluster.records_failed);
    st->bans_applied = atomic_load(&rt__cluster.bans_applied);
    st->bans_failed = atomic_load(&rt__cluster.bans_failed);
    st->replays = atomic_load(&rt__cluster.replays);
    st->replayed = atomic_load(&rt__cluster.replayed);
    st->lease_held = rt_cluster_lease_holds(rt_cluster_lease_generation());
    st->lease_lapses = atomic_load(&rt__cluster.lease_lapses);
    st->lease_waits = atomic_load(&rt__cluster.lease_waits);
    st->stale_takeovers = atomic_load(&rt__cluster.stale_requests);
    st->control_refused = rt__cluster_auth_refused();
    st->channel_out = atomic_load(&rt__cluster.channel_out);
    st->channel_in = atomic_load(&rt__cluster.channel_in);
    st->channel_failed = atomic_load(&rt__cluster.channel_failed);
    return true;
}

/*
** Retained messages cluster-wide (cluster.h): the store replicated in a JetStream KV bucket,
** watched by a thread of its own, and the barrier a new subscriber waits on.
*/
#include "cluster_impl.h"

/* Binds the bucket another node made (whatever its settings), or makes it. */
natsStatus rt__cluster_kv_open(kvStore **kv, const char *bucket, const char *what,
                               jsStorageType storage)
{
    kvConfig cfg;
    kvConfig_Init(&cfg);
    cfg.Bucket = bucket;
    cfg.Description = what;
    cfg.History = 1;
    cfg.Replicas = (int)rt__cluster.replicas;
    cfg.StorageType = storage;
    /* Bound first: a create racing another node's waits for JetStream's meta leader. */
    natsStatus s = js_KeyValue(kv, rt__cluster.js, bucket);
    return s == NATS_OK ? s : js_CreateKeyValue(kv, rt__cluster.js, &cfg);
}

/* Writes a retained message (or its clearing) to the bucket; NATS_OK once JetStream has it. */
natsStatus rt__cluster_kv_put(const rt_message_t *msg, rt_bin_t *bin)
{
    char key[RT_SUBJECT_MAX + 1];
    if (rt_kv_key_of_topic((const char *)msg->topic.p, msg->topic.len, key, sizeof(key)) < 0)
        return NATS_INVALID_ARG;
    if (!msg->payload.len)
        return kvStore_Delete(rt__cluster.kv, key);
    /* The value: when it expires (wall clock ms, big-endian; 0: never), then the PUBLISH. */
    size_t len = rt_bin_len(bin);
    uint8_t *v = malloc(8 + len);
    if (!v)
        return NATS_NO_MEMORY;
    uint64_t at = msg->has_expiry && msg->expiry ? rt_wall_ms() + (uint64_t)msg->expiry * 1000 : 0;
    for (int i = 0; i < 8; i++)
        v[i] = (uint8_t)(at >> (56 - 8 * i));
    memcpy(v + 8, rt_bin_data(bin), len);
    natsStatus s = kvStore_Put(NULL, rt__cluster.kv, key, v, (int)(8 + len));
    free(v);
    return s;
}

int rt_cluster_retained_delete(const char *topic, size_t len, char *err, size_t errlen)
{
    char key[RT_SUBJECT_MAX + 1];
    natsStatus s = NATS_INVALID_ARG;
    if (!atomic_load(&rt__cluster.kv_ready))
        snprintf(err, errlen, "the cluster's retained bucket is not bound yet");
    else if (rt_kv_key_of_topic(topic, len, key, sizeof(key)) < 0)
        snprintf(err, errlen, "the topic has no key in the retained bucket");
    else if ((s = kvStore_Delete(rt__cluster.kv, key)) != NATS_OK)
        snprintf(err, errlen, "the retained bucket refused: %s", natsStatus_GetText(s));
    return s == NATS_OK ? 0 : RT_EAGAIN;
}

/* The watcher thread: every change of the bucket, in revision order, to cluster_in. */
static void *watch_retained(void *arg)
{
    (void)arg;
    kvWatcher *w = NULL;
    while (!atomic_load(&rt__cluster.stopping)) {
        if (!w && kvStore_WatchAll(&w, rt__cluster.kv, NULL) != NATS_OK) {
            w = NULL;
            nats_Sleep(250);
            continue;
        }
        atomic_store(&rt__cluster.kv_watcher, w);
        if (atomic_load(&rt__cluster.stopping))
            break;
        kvEntry *e = NULL;
        natsStatus s = kvWatcher_Next(&e, w, 1000);
        if (s == NATS_TIMEOUT) {
            rt_msg_t *tick = rt_msg_new(MSG_KV_TICK, 0);
            if (tick)
                rt_send_unmuted(atomic_load(&rt__cluster.in_pid), tick);
            continue;
        }
        if (s != NATS_OK) {
            if (!atomic_load(&rt__cluster.stopping))
                nats_Sleep(250);
            continue;
        }
        if (!e)
            continue; /* the end of the initial values */
        const char *key = kvEntry_Key(e);
        size_t klen = strlen(key), vlen = (size_t)kvEntry_ValueLen(e);
        bool put = kvEntry_Operation(e) == kvOp_Put;
        if (!put)
            vlen = 0;
        size_t bytes = klen + vlen + 256;
        rt__cluster_backlog_wait();
        rt_msg_t *m = rt_msg_new(MSG_KV_ENTRY, sizeof(kv_entry_t) + klen + vlen);
        if (m) {
            kv_entry_t *k = (kv_entry_t *)(void *)m->data;
            *k = (kv_entry_t){.revision = kvEntry_Revision(e),
                              .put = put,
                              .keylen = (uint32_t)klen,
                              .vallen = (uint32_t)vlen,
                              .bytes = bytes};
            memcpy(k->kv, key, klen);
            if (vlen)
                memcpy(k->kv + klen, kvEntry_Value(e), vlen);
            rt__cluster_hand_in(m, bytes);
        } else {
            atomic_fetch_add_explicit(&rt__cluster.dropped_in, 1, memory_order_relaxed);
        }
        kvEntry_Destroy(e);
    }
    atomic_store(&rt__cluster.kv_watcher, NULL);
    if (w)
        kvWatcher_Destroy(w);
    return NULL;
}

/* In cluster_kv: the buckets found or made, the watcher started; else again in 1 s. */
void rt__cluster_kv_bind(rt_actor_t *self)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid));
    if (atomic_load(&rt__cluster.kv_ready) || atomic_load(&rt__cluster.stopping))
        return;
    if (!rt__cluster.nc) { /* the connector says why; JetStream is asked once NATS answers */
        rt_send_after_tag(1000, rt_self(self), MSG_KV_BIND, NULL);
        return;
    }
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = JETSTREAM_WAIT_MS;
    natsStatus s =
        rt__cluster.js ? NATS_OK : natsConnection_JetStream(&rt__cluster.js, rt__cluster.nc, &jo);
    if (s == NATS_OK && !rt__cluster.kv)
        s = rt__cluster_kv_open(&rt__cluster.kv, rt__cluster.bucket,
                                "rtd: the cluster's retained messages", js_FileStorage);
    char clients[sizeof(rt__cluster.bucket)];
    snprintf(clients, sizeof(clients), "%s_clients", rt__cluster.prefix);
    if (s == NATS_OK && !rt__cluster.clients)
        s = rt__cluster_kv_open(&rt__cluster.clients, clients,
                                "rtd: which node holds each client id", js_MemoryStorage);
    char subject[RT_CONF_NODE_MAX * 2 + 24];
    if (s == NATS_OK && !rt__cluster.takeover_sub) {
        rt__cluster_node_subject(rt__cluster.node, "takeover", subject, sizeof(subject));
        s = rt__cluster_pool_subscribe(&rt__cluster.takeover_sub, rt__cluster.nc, subject, NULL,
                                       (void *)rt__cluster_takeover_request, false);
    }
    if (s == NATS_OK && !rt__cluster.handover_sub) {
        rt__cluster_node_subject(rt__cluster.node, "handover", subject, sizeof(subject));
        s = rt__cluster_pool_subscribe(&rt__cluster.handover_sub, rt__cluster.nc, subject, NULL,
                                       (void *)rt__cluster_handover_request, false);
    }
    if (s == NATS_OK && !rt__cluster.admin_sub) {
        rt__cluster_node_subject(rt__cluster.node, "admin", subject, sizeof(subject));
        s = rt__cluster_pool_subscribe(&rt__cluster.admin_sub, rt__cluster.nc, subject, NULL,
                                       (void *)rt__cluster_admin_request, false);
    }
    if (s == NATS_OK && !rt__cluster.sync_sub) {
        rt__cluster_node_subject(rt__cluster.node, "sync", subject, sizeof(subject));
        s = rt__cluster_pool_subscribe(&rt__cluster.sync_sub, rt__cluster.nc, subject, NULL,
                                       (void *)rt__cluster_sync_request, false);
    }
    /* A bucket just made answers only once its stream has a leader: probe before use,
       so the first claims do not wait out JetStream's timeout. */
    kvEntry *probe = NULL;
    if (s == NATS_OK) {
        s = kvStore_Get(&probe, rt__cluster.clients, "rt-probe");
        kvEntry_Destroy(probe);
        if (s == NATS_NOT_FOUND)
            s = NATS_OK;
    }
    if (s == NATS_OK && !rt__cluster.cjs)
        s = rt__cluster_claims_open();
    if (s == NATS_OK && rt__cluster.durable)
        s = rt__cluster_durable_open();
    if (s == NATS_OK)
        s = rt__cluster_banned_open();
    if (s == NATS_OK && pthread_create(&rt__cluster.watcher, NULL, watch_retained, NULL) != 0)
        s = NATS_SYS_ERROR;
    if (s != NATS_OK) {
        if (!rt__cluster.kv_warned)
            rt_log(RT_LOG_WARNING, "cluster.retained_unreplicated",
                   "bucket=%s %s (%s); retained messages stay on their node until JetStream "
                   "answers (trying every second)",
                   rt__cluster.bucket, natsStatus_GetText(s), nats_GetLastError(NULL));
        rt__cluster.kv_warned = true;
        rt_send_after_tag(1000, rt_self(self), MSG_KV_BIND, NULL);
        return;
    }
    atomic_store(&rt__cluster.kv_ready, true);
    rt_log(RT_LOG_INFO, "cluster.retained_replicated", "bucket=%s replicas=%ld", rt__cluster.bucket,
           rt__cluster.replicas);
    if (rt__cluster.durable) {
        atomic_store(&rt__cluster.durable_ready, true);
        rt_log(RT_LOG_INFO, "cluster.durable", "stream=%s max_age=%" PRId64 "s replicas=%ld",
               rt__cluster.stream, rt__cluster.max_age_s, rt__cluster.replicas);
    }
}

/* In the cluster actor: the bucket's last revision now, for a subscriber's barrier. */
void rt__cluster_barrier_start(rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid) && m->len >= sizeof(barrier_t));
    barrier_t *b = (barrier_t *)(void *)m->data;
    char stream[sizeof(rt__cluster.bucket) + 4];
    snprintf(stream, sizeof(stream), "KV_%s", rt__cluster.bucket);
    jsStreamInfo *si = NULL;
    b->revision = 0;
    if (js_GetStreamInfo(&si, rt__cluster.js, stream, NULL, NULL) == NATS_OK && si) {
        b->revision = si->State.LastSeq;
        jsStreamInfo_Destroy(si);
    }
    b->since_ms = rt_mono_ms();
    rt_msg_t *wait = rt_msg_new(MSG_BARRIER_WAIT, m->len);
    if (wait) {
        memcpy(wait->data, m->data, m->len);
        if (rt_send_msg(atomic_load(&rt__cluster.in_pid), wait) == 0)
            return;
    }
    /* cluster_in cannot wait for it: the subscriber gets what this node has now. */
    rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
    if (r) {
        memcpy(r->data, b->data, b->len);
        rt_send_msg(b->reply_to, r);
    }
}

bool rt_cluster_retained_barrier(rt_pid_t reply_to, const void *data, size_t len)
{
    if (!atomic_load_explicit(&rt__cluster.kv_ready, memory_order_acquire))
        return false;
    rt_msg_t *m = rt_msg_new(MSG_BARRIER, sizeof(barrier_t) + len);
    if (!m)
        return false;
    barrier_t *b = (barrier_t *)(void *)m->data;
    *b = (barrier_t){.reply_to = reply_to, .len = (uint32_t)len};
    memcpy(b->data, data, len);
    return rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), m) == 0;
}

/* A change of the replicated retained store, applied to this node's. */
void rt__cluster_apply_entry(const kv_entry_t *k)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid)); /* entries apply in the watcher's order, on one actor */
    char topic[RT_SUBJECT_MAX + 1];
    int tlen = rt_topic_of_kv_key(k->kv, k->keylen, topic, sizeof(topic));
    if (tlen <= 0) {
        atomic_fetch_add_explicit(&rt__cluster.bad_in, 1, memory_order_relaxed);
        return;
    }
    if (!k->put) {
        rt_route_retain_remote(topic, (size_t)tlen, NULL, 0);
        return;
    }
    const uint8_t *v = (const uint8_t *)k->kv + k->keylen;
    uint64_t at = 0;
    for (int i = 0; k->vallen > 8 && i < 8; i++)
        at = at << 8 | v[i];
    rt_bin_t *bin = k->vallen > 8 ? rt_message_parse(v + 8, k->vallen - 8) : NULL;
    rt_message_t msg;
    if (bin)
        rt_message_view(bin, &msg);
    if (!bin || msg.topic.len != (uint32_t)tlen || memcmp(msg.topic.p, topic, (size_t)tlen)) {
        atomic_fetch_add_explicit(&rt__cluster.bad_in, 1, memory_order_relaxed);
        if (bin)
            rt_bin_release(bin);
        return;
    }
    uint64_t now = rt_wall_ms();
    if (at && at <= now) /* expired on its way */
        rt_route_retain_remote(topic, (size_t)tlen, NULL, 0);
    else
        rt_route_retain_remote(topic, (size_t)tlen, bin, at ? rt_mono_ms() + (at - now) : 0);
    rt_bin_release(bin);
}

/* How long a subscriber waits for this node's copy of the store to catch up, at most. */
#define BARRIER_MAX_MS 2000

/* Answers the barriers the applied revision has passed (or that waited too long). */
void rt__cluster_barriers_check(rt_actor_t *self, in_state_t *st)
{
    RT_ASSERT(rt_self(self) == atomic_load(&rt__cluster.in_pid));
    RT_ASSERT(st->nbarriers <= st->capbarriers);
    uint64_t applied = atomic_load(&rt__cluster.kv_applied), now = rt_mono_ms();
    size_t kept = 0;
    for (size_t i = 0; i < st->nbarriers; i++) {
        rt_msg_t *w = st->barriers[i];
        const barrier_t *b = (const barrier_t *)(const void *)w->data;
        bool late = now - b->since_ms >= BARRIER_MAX_MS;
        if (b->revision > applied && !late) {
            st->barriers[kept++] = w;
            continue;
        }
        if (b->revision > applied)
            atomic_fetch_add_explicit(&rt__cluster.barrier_timeouts, 1, memory_order_relaxed);
        rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
        if (r) {
            memcpy(r->data, b->data, b->len);
            rt_send_msg(b->reply_to, r);
        }
        rt_charge(self, -(ptrdiff_t)(sizeof(rt_msg_t) + w->len));
        rt_msg_free(w);
    }
    RT_ASSERT(kept <= st->nbarriers);
    st->nbarriers = kept;
}

void rt__cluster_barrier_wait(rt_actor_t *self, in_state_t *st, rt_msg_t *m)
{
    rt_msg_t *keep = rt_msg_new(MSG_BARRIER_WAIT, m->len);
    if (keep && (st->nbarriers < st->capbarriers ||
                 rt_grow(&st->barriers, &st->capbarriers, st->nbarriers + 1,
                         sizeof(st->barriers[0]), 8) == 0)) {
        memcpy(keep->data, m->data, m->len);
        st->barriers[st->nbarriers++] = keep;
        rt_charge(self, (ptrdiff_t)(sizeof(rt_msg_t) + keep->len));
    } else {
        rt_msg_free(keep);
        /* No room to wait: answered now, with what this node has. */
        const barrier_t *b = (const barrier_t *)(const void *)m->data;
        rt_msg_t *r = rt_msg_new(RT_CLUSTER_MSG_RETAINED_READY, b->len);
        if (r) {
            memcpy(r->data, b->data, b->len);
            rt_send_msg(b->reply_to, r);
        }
        return;
    }
    rt__cluster_barriers_check(self, st);
}

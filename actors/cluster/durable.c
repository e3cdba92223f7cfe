/*
** Durable mode (cluster.h): the stream that keeps every message and acknowledges publishers,
** each persistent session's record, and the replay that resumes a session after its node's
** crash.
*/
#include "cluster_impl.h"
#include "replay.h"

/* A publisher's acknowledgement that waited for the stream. */
void rt__cluster_stream_answer(rt_pid_t ack_pid, uint64_t token, bool kept)
{
    rt_store_committed_t done = {.token = token, .status = kept ? 0 : RT_EAGAIN};
    rt_send(ack_pid, RT_STORE_MSG_COMMITTED, &done, sizeof(done));
    atomic_fetch_add_explicit(kept ? &rt__cluster.stream_acked : &rt__cluster.stream_failed, 1,
                              memory_order_relaxed);
}

/* A publisher waits for the bucket or the stream, and its message never reached the cluster
   actor (being restarted) or was left in its mailbox: not kept. */
void rt__cluster_unkept(rt_pid_t ack_pid, uint64_t token)
{
    rt_store_committed_t lost = {.token = token, .status = RT_ENOPROC};
    rt_send(ack_pid, RT_STORE_MSG_COMMITTED, &lost, sizeof(lost));
}

/*
** On a libnats thread: the stream's answer to a publish that carried Rt-Ack, or libnats's
** NATS_TIMEOUT once JETSTREAM_WAIT_MS passed without one (the server it went to stopped
** answering, the stream has no leader): then the publisher is told it was not kept, and
** says so to its client (0x80; MQTT 3: the connection closes and the client sends it again).
*/
static void stream_answered(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    (void)closure;
    const char *ack = NULL;
    uint64_t pid, token;
    bool kept = pa && !pae;
    if (natsMsgHeader_Get(msg, H_ACK, &ack) == NATS_OK &&
        sscanf(ack, "%" SCNx64 " %" SCNu64, &pid, &token) == 2)
        rt__cluster_stream_answer((rt_pid_t)pid, token, kept);
    if (!kept && atomic_load_explicit(&rt__cluster.stream_failed, memory_order_relaxed) % 1000 == 1)
        rt_log(RT_LOG_WARNING, "cluster.stream_unconfirmed",
               "subject=%s %s (%" PRIu64 " not confirmed so far)", natsMsg_GetSubject(msg),
               pae && pae->ErrText ? pae->ErrText : natsStatus_GetText(pae ? pae->Err : NATS_ERR),
               atomic_load_explicit(&rt__cluster.stream_failed, memory_order_relaxed));
    natsMsg_Destroy(msg);
}

/* In the cluster actor: publishes to the stream, answered by stream_answered within
   JETSTREAM_WAIT_MS whatever happens to the server (libnats times it out). */
natsStatus rt__cluster_stream_publish(natsMsg **nm)
{
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = JETSTREAM_WAIT_MS;
    return js_PublishMsgAsync(rt__cluster.pjs, nm, &po);
}

/*
** Durable mode's stream (every message routed under the prefix, kept as long as a session
** may wait for one: max_session_expiry), the sessions' bucket, and the context whose
** asynchronous publishes the stream answers.
*/
natsStatus rt__cluster_durable_open(void)
{
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, rt__cluster.js, rt__cluster.stream, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    if (s == NATS_NOT_FOUND) {
        char subjects[RT_CONF_NODE_MAX + 4];
        snprintf(subjects, sizeof(subjects), "%s.>", rt__cluster.prefix);
        const char *list[1] = {subjects};
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        cfg.Name = rt__cluster.stream;
        cfg.Description = "rtd: every message of the cluster (durable mode)";
        cfg.Subjects = list;
        cfg.SubjectsLen = 1;
        cfg.MaxAge = rt__cluster.max_age_s * 1000000000LL;
        cfg.Replicas = rt__cluster.replicas;
        cfg.Storage = js_FileStorage;
        s = js_AddStream(NULL, rt__cluster.js, &cfg, NULL, &jerr);
    }
    char bucket[sizeof(rt__cluster.bucket)];
    snprintf(bucket, sizeof(bucket), "%s_sessions", rt__cluster.prefix);
    if (s == NATS_OK && !rt__cluster.sessions)
        s = rt__cluster_kv_open(&rt__cluster.sessions, bucket,
                                "rtd: persistent sessions, for a resume elsewhere", js_FileStorage);
    if (s == NATS_OK && !rt__cluster.pjs) {
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.Wait = JETSTREAM_WAIT_MS;
        jo.PublishAsync.AckHandler = stream_answered;
        jo.PublishAsync.MaxPending = 65536; /* past it the cluster actor waits: publishers too */
        s = natsConnection_JetStream(&rt__cluster.pjs, rt__cluster.nc, &jo);
    }
    return s;
}

/* In cluster_kv: a session's record (its bytes, malloc'ed) and where its replay starts. */
uint8_t *rt__cluster_session_record(const char *key, size_t *len, int64_t *from_ms)
{
    *len = 0;
    kvEntry *e = NULL;
    if (kvStore_Get(&e, rt__cluster.sessions, key) != NATS_OK)
        return NULL;
    const uint8_t *v = kvEntry_Value(e);
    int vlen = kvEntry_ValueLen(e);
    uint8_t *bytes = vlen > 8 ? malloc((size_t)vlen - 8) : NULL;
    if (bytes) {
        uint64_t clear_ms = 0;
        for (int i = 0; i < 8; i++)
            clear_ms = clear_ms << 8 | v[i];
        memcpy(bytes, v + 8, (size_t)vlen - 8);
        *len = (size_t)vlen - 8;
        *from_ms = (int64_t)clear_ms - rt__cluster.margin_ms > 0
                       ? (int64_t)clear_ms - rt__cluster.margin_ms
                       : 1;
    }
    kvEntry_Destroy(e);
    return bytes;
}

bool rt_cluster_durable(void)
{
    return rt__cluster.on && rt__cluster.durable;
}

void rt_cluster_session_record(const char *id, uint64_t clear_ms, const void *bytes, size_t len)
{
    size_t idlen = strlen(id);
    if (!atomic_load_explicit(&rt__cluster.durable_ready, memory_order_acquire) ||
        idlen >= RT_CLIENT_TEXT_MAX)
        return;
    rt_msg_t *m = rt_msg_new(MSG_SESSION_PUT, sizeof(record_t) + idlen + len);
    if (!m) {
        atomic_fetch_add_explicit(&rt__cluster.records_failed, 1, memory_order_relaxed);
        return;
    }
    record_t *r = (record_t *)(void *)m->data;
    r->clear_ms = clear_ms;
    r->id_len = (uint32_t)idlen;
    r->len = (uint32_t)len;
    memcpy(r->data, id, idlen);
    if (len)
        memcpy(r->data + idlen, bytes, len);
    rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), m);
}

/* In cluster_kv: a record written (the clear moment, then the bytes) or deleted. */
void rt__cluster_session_put(const record_t *r)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid));
    char id[RT_CLIENT_TEXT_MAX], key[3 * RT_CLIENT_TEXT_MAX + 1];
    snprintf(id, sizeof(id), "%.*s", (int)r->id_len, r->data);
    if (rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return;
    natsStatus s;
    if (!r->len) {
        s = kvStore_Delete(rt__cluster.sessions, key);
    } else {
        uint8_t *v = malloc(8 + (size_t)r->len);
        if (!v) {
            s = NATS_NO_MEMORY;
        } else {
            for (int i = 0; i < 8; i++)
                v[i] = (uint8_t)(r->clear_ms >> (56 - 8 * i));
            memcpy(v + 8, r->data + r->id_len, r->len);
            s = kvStore_Put(NULL, rt__cluster.sessions, key, v, (int)(8 + r->len));
            free(v);
        }
    }
    if (s != NATS_OK &&
        atomic_fetch_add_explicit(&rt__cluster.records_failed, 1, memory_order_relaxed) % 1000 == 0)
        rt_log(RT_LOG_WARNING, "cluster.session_record_failed", "client=%s %s", id,
               natsStatus_GetText(s));
}

/*
** The tail: NATS tells its other servers of the subscriptions made here asynchronously, so a
** publisher's node whose server has not heard of them yet sends a message that the stream
** keeps but that does not come here; a replay that ended at the stream's last message when
** it began missed such a message (one acknowledged QoS 1 message, in a kill -9 failover under
** load). What the tail brings twice (here directly too) the session drops by origin (move.c),
** and a catch-up's cluster_in (first_copy).
*/
#define RT_REPLAY_TAIL_MS 1000

/* One message of the stream to stream_read's caller, which owns nm; counts what it took. */
typedef natsStatus (*stream_msg_fn)(natsMsg *nm, void *arg, size_t *count);

/* In cluster_kv: each message the stream kept from from_ms up to its last one now and those
   it keeps for RT_REPLAY_TAIL_MS more, to each. */
static natsStatus stream_read(int64_t from_ms, stream_msg_fn each, void *arg, size_t *count)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid)); /* it reads the stream for seconds at worst */
    *count = 0;
    uint64_t tail_end_ms = rt_mono_ms() + RT_REPLAY_TAIL_MS;
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, rt__cluster.js, rt__cluster.stream, NULL, &jerr);
    if (s != NATS_OK)
        return s;
    uint64_t last = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = rt__cluster.stream;
    so.Config.DeliverPolicy = js_DeliverByStartTime;
    so.Config.OptStartTime = from_ms * 1000000LL;
    so.Config.AckPolicy = js_AckNone;
    char all[RT_CONF_NODE_MAX + 4];
    snprintf(all, sizeof(all), "%s.>", rt__cluster.prefix);
    s = js_SubscribeSync(&sub, rt__cluster.js, all, NULL, &so, &jerr);
    for (uint64_t seq = 0; s == NATS_OK;) {
        /* Up to the last message as the read began, however long the stream takes; past
           it, what comes before the tail ends. */
        uint64_t now_ms = rt_mono_ms();
        int64_t wait_ms = seq < last             ? JETSTREAM_WAIT_MS
                          : now_ms < tail_end_ms ? (int64_t)(tail_end_ms - now_ms)
                                                 : 0;
        if (wait_ms <= 0)
            break;
        natsMsg *nm = NULL;
        jsMsgMetaData *meta = NULL;
        s = natsSubscription_NextMsg(&nm, sub, wait_ms);
        if (s == NATS_TIMEOUT && seq >= last) {
            s = NATS_OK; /* nothing more within the tail */
            break;
        }
        if (s == NATS_OK && natsMsg_GetMetaData(&meta, nm) == NATS_OK) {
            seq = meta->Sequence.Stream;
            jsMsgMetaData_Destroy(meta);
        }
        if (s == NATS_OK)
            s = each(nm, arg, count);
    }
    if (sub) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
    if (s != NATS_OK)
        rt_log(RT_LOG_WARNING, "cluster.replay_failed", "stream=%s after %zu messages: %s",
               rt__cluster.stream, *count, natsStatus_GetText(s));
    return s;
}

/* One of rtd's messages into the replay's bytes b (arg). */
static natsStatus replay_put(natsMsg *nm, void *arg, size_t *count)
{
    rt_buf_t *b = arg;
    natsStatus s = NATS_OK;
    origin_name_t o;
    rt_bin_t *bin = rt__cluster_inbound_message(nm, &o);
    if (bin && b->len + RT_REPLAY_ENTRY_MIN + rt_bin_len(bin) > RT_CLUSTER_MOVE_MAX)
        s = NATS_NO_MEMORY;
    if (bin && s == NATS_OK) {
        rt_replay_put(b, rt__cluster_node_key(o.node, o.incarnation), o.seq, rt_bin_data(bin),
                      (uint32_t)rt_bin_len(bin));
        s = b->oom ? NATS_NO_MEMORY : NATS_OK;
        ++*count;
    }
    if (bin)
        rt_bin_release(bin);
    natsMsg_Destroy(nm);
    return s;
}

/*
** In cluster_kv: every message the stream kept from from_ms up to its last one now (after
** NATS holds the session's subscriptions here) and those it keeps for RT_REPLAY_TAIL_MS more,
** as the replay's bytes for RT_CLUSTER_MSG_MOVE_IN (replay.h). The session keeps those its
** subscriptions match. NULL if the stream did not answer.
*/
uint8_t *rt__cluster_replay_bytes(int64_t from_ms, size_t *len, size_t *count)
{
    *len = 0;
    rt_buf_t b = {0};
    rt_replay_start(&b);
    if (stream_read(from_ms, replay_put, &b, count) != NATS_OK) {
        rt_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return (uint8_t *)b.data;
}

/*
** The routes connection lost its server. What other nodes published until NATS has this
** node's subscriptions again did not come here, and neither did what that server had not
** sent on when it died, though the stream kept it and its publisher was acknowledged (kill -9
** of a NATS server under a QoS 1 stream: acknowledged messages never delivered). So once the
** connection is back, the stream is read from the first loss less cluster.replay_margin, as
** after a crash (on a libnats thread).
*/
void rt__cluster_cut(void)
{
    int64_t none = 0;
    if (atomic_load_explicit(&rt__cluster.durable_ready, memory_order_acquire))
        atomic_compare_exchange_strong(&rt__cluster.cut_ms, &none, (int64_t)rt_wall_ms());
}

/* A message of the stream: to cluster_in as if NATS delivered it late, which routes it
   unless this node had it already (first_copy, by its origin). Not this node's own (NATS
   never sends it those) nor what carries no origin (no message routed by a node). */
static natsStatus catch_up_put(natsMsg *nm, void *arg, size_t *count)
{
    (void)arg;
    const char *origin = NULL;
    origin_name_t o;
    if (natsMsgHeader_Get(nm, H_ORIGIN, &origin) != NATS_OK ||
        sscanf(origin, "%32s %" SCNx64 " %" SCNu64, o.node, &o.incarnation, &o.seq) != 3 ||
        (strcmp(o.node, rt__cluster.node) == 0 && o.incarnation == rt__cluster.incarnation)) {
        natsMsg_Destroy(nm);
        return NATS_OK;
    }
    size_t bytes = (size_t)natsMsg_GetDataLength(nm) + 256;
    rt_msg_t *m = rt_msg_new(MSG_INBOUND, sizeof(inbound_t));
    if (!m) {
        natsMsg_Destroy(nm);
        return NATS_NO_MEMORY;
    }
    *(inbound_t *)(void *)m->data = (inbound_t){.msg = nm, .bytes = bytes, .late = true};
    if (rt__cluster_hand_in(m, bytes))
        ++*count;
    else
        natsMsg_Destroy(nm);
    return NATS_OK;
}

/* In cluster_kv, once the routes connection is back: the read of rt__cluster_cut. Until
   JetStream answers it is tried again every RT_CLUSTER_RETRY_MS from the same moment: after
   a server's kill -9 the read's consumer was not made for 5-8 s (groups electing leaders). */
void rt__cluster_catch_up(rt_actor_t *self)
{
    int64_t cut = atomic_exchange(&rt__cluster.cut_ms, 0);
    if (!cut)
        return;
    int64_t from_ms = cut - rt__cluster.margin_ms > 0 ? cut - rt__cluster.margin_ms : 1;
    size_t count = 0;
    if (stream_read(from_ms, catch_up_put, NULL, &count) == NATS_OK) {
        rt_log(RT_LOG_INFO, "cluster.caught_up", "from_ms=%" PRId64 " messages=%zu", from_ms,
               count);
        return;
    }
    atomic_store(&rt__cluster.cut_ms, cut); /* a loss meanwhile is later: this covers both */
    rt_send_after_tag(RT_CLUSTER_RETRY_MS, rt_self(self), MSG_CATCH_UP, NULL);
}

/*
** The banned list cluster-wide (broker/banned.h, docs/AUTH.md): the JetStream KV bucket
** "<prefix>_banned", one key a ban ("<kind>.<value as a key>"), its value the ban's moments
** (Unix seconds, big-endian: when, until) and words (who, a NUL, why). A thread of its own
** watches the bucket and applies every change to this node's list, its own changes too (they
** come back the same); the list's replicator hands this node's changes (an admin's, flapping
** detection's, made on any thread) to cluster_kv, which writes them.
*/
#include "banned.h"
#include "cluster_impl.h"

typedef struct {
    uint8_t kind;
    bool added;
    int64_t at_s, until_s;
    uint32_t len, bylen, rlen;
    char data[]; /* value, by, reason */
} ban_put_t;

/* "<kind>.<value as a KV key>": its length, or -1 when the value has no key that fits. */
static int ban_key(rt_ban_kind_t kind, const char *value, size_t len, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s.", rt_ban_kind_names[kind]);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    int k = rt_kv_key_of_topic(value, len, out + n, cap - (size_t)n);
    return k <= 0 ? -1 : n + k;
}

static void replicate(const rt_ban_t *b, bool added)
{
    size_t bylen = added ? strlen(b->by) : 0, rlen = added ? strlen(b->reason) : 0;
    rt_msg_t *m = rt_msg_new(MSG_BAN_PUT, sizeof(ban_put_t) + b->len + bylen + rlen);
    if (!m) {
        atomic_fetch_add_explicit(&rt__cluster.bans_failed, 1, memory_order_relaxed);
        return;
    }
    ban_put_t *p = (ban_put_t *)(void *)m->data;
    *p = (ban_put_t){.kind = (uint8_t)b->kind,
                     .added = added,
                     .at_s = b->at_s,
                     .until_s = b->until_s,
                     .len = (uint32_t)b->len,
                     .bylen = (uint32_t)bylen,
                     .rlen = (uint32_t)rlen};
    memcpy(p->data, b->value, b->len);
    if (added) { /* a delete names the ban alone: it has no words */
        memcpy(p->data + b->len, b->by, bylen);
        memcpy(p->data + b->len + bylen, b->reason, rlen);
    }
    rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), m);
}

void rt__cluster_ban_put(const rt_msg_t *m)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid));
    const ban_put_t *p = (const void *)m->data;
    if (m->len < sizeof(*p) || m->len != sizeof(*p) + p->len + p->bylen + p->rlen)
        return;
    char key[RT_SUBJECT_MAX + 1];
    natsStatus s = NATS_INVALID_ARG;
    if (!atomic_load(&rt__cluster.kv_ready) || !rt__cluster.banned)
        s = NATS_NOT_YET_CONNECTED;
    else if (ban_key((rt_ban_kind_t)p->kind, p->data, p->len, key, sizeof(key)) < 0)
        s = NATS_INVALID_ARG;
    else if (!p->added)
        s = kvStore_Delete(rt__cluster.banned, key);
    else {
        size_t n = 16 + p->bylen + 1 + p->rlen;
        uint8_t *v = malloc(n);
        if (!v) {
            s = NATS_NO_MEMORY;
        } else {
            for (int i = 0; i < 8; i++) {
                v[i] = (uint8_t)((uint64_t)p->at_s >> (56 - 8 * i));
                v[8 + i] = (uint8_t)((uint64_t)p->until_s >> (56 - 8 * i));
            }
            memcpy(v + 16, p->data + p->len, p->bylen);
            v[16 + p->bylen] = 0;
            memcpy(v + 17 + p->bylen, p->data + p->len + p->bylen, p->rlen);
            s = kvStore_Put(NULL, rt__cluster.banned, key, v, (int)n);
            free(v);
        }
    }
    if (s != NATS_OK) {
        atomic_fetch_add_explicit(&rt__cluster.bans_failed, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.ban_unreplicated",
               "kind=%s value=%.*s %s: the ban holds on this node only", rt_ban_kind_names[p->kind],
               (int)p->len, p->data, natsStatus_GetText(s));
    }
}

/* One change of the bucket to this node's list. */
static void apply(kvEntry *e)
{
    const char *key = kvEntry_Key(e), *dot = strchr(key, '.');
    rt_ban_kind_t kind;
    char kindname[16], value[RT_SUBJECT_MAX + 1];
    if (!dot || (size_t)(dot - key) >= sizeof(kindname))
        return;
    memcpy(kindname, key, (size_t)(dot - key));
    kindname[dot - key] = 0;
    int vlen = rt_topic_of_kv_key(dot + 1, strlen(dot + 1), value, sizeof(value));
    if (rt_ban_kind_parse(kindname, &kind) != 0 || vlen <= 0)
        return;
    rt_ban_t b = {.kind = kind, .value = value, .len = (size_t)vlen};
    if (kvEntry_Operation(e) != kvOp_Put) {
        rt_banned_apply(&b, false);
        return;
    }
    const uint8_t *v = kvEntry_Value(e);
    int n = kvEntry_ValueLen(e);
    const uint8_t *nul = n > 16 ? memchr(v + 16, 0, (size_t)n - 16) : NULL;
    if (!nul)
        return;
    uint64_t at = 0, until = 0;
    for (int i = 0; i < 8; i++) {
        at = at << 8 | v[i];
        until = until << 8 | v[8 + i];
    }
    char by[RT_BAN_BY_MAX + 1], reason[RT_BAN_REASON_MAX + 1];
    snprintf(by, sizeof(by), "%.*s", (int)(nul - (v + 16)), (const char *)v + 16);
    snprintf(reason, sizeof(reason), "%.*s", (int)(v + n - nul - 1), (const char *)nul + 1);
    b.by = by;
    b.reason = reason;
    b.at_s = (int64_t)at;
    b.until_s = (int64_t)until;
    if (rt_banned_apply(&b, true) == 0)
        atomic_fetch_add_explicit(&rt__cluster.bans_applied, 1, memory_order_relaxed);
}

/* The watcher thread: every change of the bucket, in revision order, applied here. */
static void *watch_banned(void *arg)
{
    (void)arg;
    kvWatcher *w = NULL;
    while (!atomic_load(&rt__cluster.stopping)) {
        if (!w && kvStore_WatchAll(&w, rt__cluster.banned, NULL) != NATS_OK) {
            w = NULL;
            nats_Sleep(250);
            continue;
        }
        atomic_store(&rt__cluster.banned_watcher, w);
        if (atomic_load(&rt__cluster.stopping))
            break;
        kvEntry *e = NULL;
        natsStatus s = kvWatcher_Next(&e, w, 1000);
        if (s == NATS_OK && e)
            apply(e);
        kvEntry_Destroy(e);
        if (s != NATS_OK && s != NATS_TIMEOUT && !atomic_load(&rt__cluster.stopping))
            nats_Sleep(250);
    }
    atomic_store(&rt__cluster.banned_watcher, NULL);
    if (w)
        kvWatcher_Destroy(w);
    return NULL;
}

natsStatus rt__cluster_banned_open(void)
{
    char bucket[sizeof(rt__cluster.bucket)];
    snprintf(bucket, sizeof(bucket), "%s_banned", rt__cluster.prefix);
    natsStatus s = rt__cluster.banned ? NATS_OK
                                      : rt__cluster_kv_open(&rt__cluster.banned, bucket,
                                                            "rtd: the banned list", js_FileStorage);
    if (s == NATS_OK && !rt__cluster.banned_watching) {
        if (pthread_create(&rt__cluster.banned_thread, NULL, watch_banned, NULL) != 0)
            return NATS_SYS_ERROR;
        rt__cluster.banned_watching = true;
        rt_banned_set_replicator(replicate);
    }
    return s;
}

void rt__cluster_banned_close(void)
{
    rt_banned_set_replicator(NULL);
    if (rt__cluster.banned_watching) {
        kvWatcher *w = atomic_load(&rt__cluster.banned_watcher);
        if (w)
            kvWatcher_Stop(w);
        pthread_join(rt__cluster.banned_thread, NULL);
        rt__cluster.banned_watching = false;
    }
    kvStore_Destroy(rt__cluster.banned);
    rt__cluster.banned = NULL;
}

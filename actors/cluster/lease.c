/*
** The holder's lease (cluster.h, docs/CLUSTER.md "One holder per client id"): a node serves
** the client ids it claimed only while its lease holds. The lease is a key of the clients
** bucket, "_lease.<node>" (no escaped client id has a '.'), whose value names this run of the
** node; a thread of its own rewrites it every LEASE_RENEW_MS, and a write JetStream confirmed
** makes the lease hold until LEASE_MS after the write was sent. Whatever stops the writes (the
** node cut off from JetStream, its NATS server stopped, the node frozen) ends the lease by its
** own clock: each claimed connection asks rt_cluster_lease_holds at every message, and every
** client actor is told once the lapse is seen. Another node that finds the holder silent reads
** this key before it asks, and takes the id only once the key has not changed for
** LEASE_MS + LEASE_MARGIN_MS of its own clock (claims.c): by then the holder's lease is over.
*/
#include "cluster_impl.h"

void rt__cluster_lease_key(const char *node, char *out, size_t cap)
{
    snprintf(out, cap, "_lease.%s", node);
}

bool rt_cluster_lease_holds(uint32_t generation)
{
    /* The deadline first: a reader that sees the deadline after a lapse sees its generation. */
    uint64_t until = atomic_load_explicit(&rt__cluster.lease_until_ms, memory_order_acquire);
    uint32_t now_gen = atomic_load_explicit(&rt__cluster.lease_gen, memory_order_acquire);
    return ((now_gen ^ generation) & 3) == 0 && rt_mono_ms() < until;
}

uint32_t rt_cluster_lease_generation(void)
{
    return atomic_load_explicit(&rt__cluster.lease_gen, memory_order_acquire);
}

/* Every client actor: the lease is lost (their claims with it) or held again. */
static void tell_clients(bool held)
{
    rt_pid_t *pids = NULL;
    size_t n = 0;
    rt_cluster_lease_t l = {.generation = rt_cluster_lease_generation(), .held = held};
    if (rt_broker_client_pids(0, &pids, &n) != 0) {
        rt_log(RT_LOG_ERROR, "cluster.lease_untold",
               "out of memory listing the clients; each learns at its next message");
        return;
    }
    for (size_t i = 0; i < n; i++)
        rt_send(pids[i], RT_CLUSTER_MSG_LEASE, &l, sizeof(l));
    free(pids);
}

/* The lease ran out (now, by this node's clock): once per lapse. */
static void lapse(uint64_t until)
{
    if (atomic_exchange(&rt__cluster.lease_lapsed, true))
        return;
    atomic_fetch_add_explicit(&rt__cluster.lease_gen, 1, memory_order_acq_rel);
    atomic_fetch_add_explicit(&rt__cluster.lease_lapses, 1, memory_order_relaxed);
    rt_log(RT_LOG_WARNING, "cluster.lease_lost",
           "no renewal confirmed by JetStream for %" PRIu64 " ms: this node's claimed clients are "
           "ended (another node may take their ids now) and no client id is claimed here until "
           "the lease holds again",
           rt_mono_ms() - (until - LEASE_MS));
    tell_clients(false);
}

/* A renewal sent at sent was confirmed. */
static void renewed(uint64_t sent)
{
    uint64_t until = atomic_load(&rt__cluster.lease_until_ms);
    bool first = !until, back = until && rt_mono_ms() >= until;
    if (back) /* confirmed too late: what was claimed under the old lease is void */
        lapse(until);
    if (sent + LEASE_MS > until)
        atomic_store_explicit(&rt__cluster.lease_until_ms, sent + LEASE_MS, memory_order_release);
    if (first || atomic_exchange(&rt__cluster.lease_lapsed, false)) {
        rt_log(RT_LOG_INFO, "cluster.lease_held", "node=%s lease_ms=%d %s", rt__cluster.node,
               LEASE_MS, first ? "" : "(again: sessions kept here check their ids)");
        tell_clients(true);
    }
}

/*
** A renewal that JetStream refused: whether the lease key is gone or another run's. The
** clients bucket lives in the servers' memory, so a restart of every NATS server forgets it,
** this node's claims with it, while this node's lease still runs: the lease must end then,
** not be written anew over nothing. Found but ours (an earlier write whose answer was lost):
** *rev is its revision, and the next renewal goes on from there. Read at the stream's
** leader: a replica that lags could call a live lease gone and end it for nothing.
*/
static bool lease_key_lost(jsCtx *js, const char *key, const char *value, uint64_t *rev)
{
    char found[24];
    uint64_t found_rev = 0;
    natsStatus s = rt__cluster_read_key(js, key, found, sizeof(found), &found_rev);
    if (s == NATS_NOT_FOUND)
        return true;
    if (s != NATS_OK) /* JetStream not answering: the lease runs out by itself */
        return false;
    if (strcmp(found, value) != 0)
        return true;
    *rev = found_rev;
    return false;
}

static void *lease_run(void *arg)
{
    (void)arg;
    char key[RT_CONF_NODE_MAX + 8], value[24];
    rt__cluster_lease_key(rt__cluster.node, key, sizeof(key));
    snprintf(value, sizeof(value), "%016" PRIx64, rt__cluster.incarnation);
    /* A context of its own: each write waits LEASE_RENEW_MS at most, so a lapse is seen
       within about that much of its moment. */
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    char bucket[sizeof(rt__cluster.bucket)];
    snprintf(bucket, sizeof(bucket), "%s_clients", rt__cluster.prefix);
    uint64_t first_try_ms = 0; /* the first lease wanted since then */
    uint64_t rev = 0;          /* the lease key's revision this run last wrote; 0: take it */
    bool said = false;
    pthread_mutex_lock(&rt__cluster.lease_lock);
    while (!atomic_load(&rt__cluster.stopping)) {
        pthread_mutex_unlock(&rt__cluster.lease_lock);
        uint64_t sent = rt_mono_ms();
        if (!kv && atomic_load_explicit(&rt__cluster.kv_ready, memory_order_acquire)) {
            jsOptions jo;
            jsOptions_Init(&jo);
            jo.Wait = LEASE_RENEW_MS;
            if (natsConnection_JetStream(&js, rt__cluster.nc, &jo) != NATS_OK ||
                js_KeyValue(&kv, js, bucket) != NATS_OK) {
                kvStore_Destroy(kv);
                jsCtx_Destroy(js);
                kv = NULL;
                js = NULL;
            }
        }
        /* Taken with a put, then each renewal a compare-and-swap on the last revision. */
        uint64_t written = 0;
        natsStatus s = !kv    ? NATS_NOT_YET_CONNECTED
                       : !rev ? kvStore_PutString(&written, kv, key, value)
                              : kvStore_UpdateString(&written, kv, key, value, rev);
        if (s == NATS_OK) {
            rev = written;
            renewed(sent);
        } else if (rev && s != NATS_TIMEOUT && lease_key_lost(js, key, value, &rev)) {
            rt_log(RT_LOG_WARNING, "cluster.lease_key_lost",
                   "key=%s this node's lease key is gone or another run's (every NATS server "
                   "restarted, or another rtd runs with this node's name): the lease ends, "
                   "and is taken anew",
                   key);
            rev = 0;
            uint64_t until = atomic_load(&rt__cluster.lease_until_ms);
            if (until) { /* over now: no claim is made until the key is taken again */
                lapse(until);
                atomic_store_explicit(&rt__cluster.lease_until_ms, rt_mono_ms(),
                                      memory_order_release);
            }
        } else if (!atomic_load(&rt__cluster.lease_until_ms)) {
            /* The first lease not taken yet: said once, after LEASE_MS of trying. */
            if (!first_try_ms) {
                first_try_ms = sent;
            } else if (!said && sent - first_try_ms >= LEASE_MS) {
                rt_log(RT_LOG_WARNING, "cluster.lease_waiting",
                       "no lease after %" PRIu64 " ms: %s (%s); no client id is claimed here "
                       "until JetStream confirms one",
                       sent - first_try_ms, natsStatus_GetText(s), nats_GetLastError(NULL));
                said = true;
            }
        }
        uint64_t until = atomic_load(&rt__cluster.lease_until_ms);
        if (until && rt_mono_ms() >= until)
            lapse(until);
        /* The next renewal LEASE_RENEW_MS after this one was sent (at once if it took that). */
        uint64_t next = sent + (kv ? LEASE_RENEW_MS : 10);
        pthread_mutex_lock(&rt__cluster.lease_lock);
        uint64_t now = rt_mono_ms();
        if (next > now && !atomic_load(&rt__cluster.stopping)) {
            struct timespec at;
            clock_gettime(CLOCK_REALTIME, &at);
            uint64_t ns = (uint64_t)at.tv_nsec + (next - now) * 1000000ull;
            at.tv_sec += (time_t)(ns / 1000000000ull);
            at.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&rt__cluster.lease_cond, &rt__cluster.lease_lock, &at);
        }
    }
    pthread_mutex_unlock(&rt__cluster.lease_lock);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    return NULL;
}

void rt__cluster_lease_start(void)
{
    pthread_mutex_init(&rt__cluster.lease_lock, NULL);
    pthread_cond_init(&rt__cluster.lease_cond, NULL);
    rt__cluster.lease_started =
        pthread_create(&rt__cluster.lease_thread, NULL, lease_run, NULL) == 0;
    if (!rt__cluster.lease_started)
        rt_log(RT_LOG_ERROR, "cluster.lease_failed",
               "no thread for the lease: no client id can be claimed on this node");
}

/* After rt__cluster.stopping is set, before the NATS connections close. */
void rt__cluster_lease_stop(void)
{
    if (!rt__cluster.lease_started)
        return;
    pthread_mutex_lock(&rt__cluster.lease_lock);
    pthread_cond_broadcast(&rt__cluster.lease_cond);
    pthread_mutex_unlock(&rt__cluster.lease_lock);
    pthread_join(rt__cluster.lease_thread, NULL);
    rt__cluster.lease_started = false;
}

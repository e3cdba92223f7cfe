/*
** The tenants' table (tenant.h): a hash of mountpoints to what each tenant counts, under one
** mutex taken when a session joins or leaves its tenant and when a retained message under a
** mountpoint changes; the counts themselves are atomics, so publishing and delivering take no
** lock (a rate quota takes the tenant's own).
*/
#include "tenant.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "log.h"

const char *const rt_tenant_quota_names[RT_TENANT_QUOTAS] = {"connections", "subscriptions",
                                                             "publish_rate", "retained_bytes"};

struct rt_tenant_s {
    rt_tenant_t *next; /* in its bucket */
    uint64_t hash;
    size_t refs; /* sessions (and callers) holding it; guarded by the table's lock */
    atomic_ullong connections, subscriptions;
    atomic_llong retained_bytes;
    bool retained_known; /* retained_bytes has been summed; guarded by the store's lock */
    atomic_ullong refused[RT_TENANT_QUOTAS];
    atomic_ullong logged_ms[RT_TENANT_QUOTAS]; /* when a refusal was last logged */
    const rt_conf_tenant_t *own; /* its own quotas (the setting tenants), or NULL */
    pthread_mutex_t rate_lock;
    double tokens;      /* PUBLISHes the rate allows now; guarded by rate_lock */
    uint64_t refill_ns; /* when tokens was last topped up (rt_mono_ns) */
    size_t mount_len;
    /* Counted by publishers and subscribers on every scheduler: a line each, and the
       mountpoint every message reads on one of its own. */
    _Alignas(RT_CACHE_LINE) atomic_ullong messages_in;
    _Alignas(RT_CACHE_LINE) atomic_ullong messages_out;
    _Alignas(RT_CACHE_LINE) char mount[];
};

static struct {
    pthread_mutex_t lock;
    rt_tenant_t **buckets;
    size_t nbuckets, count;
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A quota: the tenant's own (tenants) when it sets it, else the tenant_max_* setting. */
#define QUOTA(t, f)                                                                                \
    ((t)->own && (t)->own->max_##f >= 0 ? (t)->own->max_##f : RT_LIVE(tenant_max_##f))

static bool one_level(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] == '/' || s[i] == '+' || s[i] == '#' || s[i] == 0)
            return false;
    return len > 0;
}

int rt_mount_expand(const char *tmpl, const char *user, const char *cid, size_t cidlen,
                    char out[RT_CONF_MOUNT_MAX], const char **why)
{
    size_t n = 0, ulen = user ? strlen(user) : 0;
    for (const char *p = tmpl; *p; p++) {
        const char *put = p, *what = NULL;
        size_t len = 1;
        if (p[0] == '%' && p[1] == 'u') {
            put = user, len = ulen, p++;
            what = !user ? "%u needs a user name" : "a user name in a mountpoint is one level";
        } else if (p[0] == '%' && p[1] == 'c') {
            put = cid, len = cidlen, p++;
            what = "a client id in a mountpoint is one level (no /, + or #)";
        } else if (p[0] == '+' || p[0] == '#' || p[0] == '%') {
            *why = "a mountpoint holds no wildcard, and no % but %u and %c";
            return RT_EINVAL;
        }
        if (what && !(put && one_level(put, len))) {
            *why = what;
            return RT_EINVAL;
        }
        if (n + len >= RT_CONF_MOUNT_MAX) {
            *why = "the mountpoint is longer than 127 bytes";
            return RT_EINVAL;
        }
        memcpy(out + n, put, len);
        n += len;
    }
    out[n] = 0;
    if (n && (out[n - 1] != '/' || out[0] == '$')) {
        *why = "a mountpoint ends with / and does not start with $";
        return RT_EINVAL;
    }
    return 0;
}

static rt_tenant_t **slot_of(const char *mount, size_t len, uint64_t h)
{
    rt_tenant_t **p = &table.buckets[h & (table.nbuckets - 1)];
    while (*p && ((*p)->hash != h || (*p)->mount_len != len || memcmp((*p)->mount, mount, len)))
        p = &(*p)->next;
    return p;
}

static bool grow(void)
{
    size_t n = table.nbuckets ? table.nbuckets * 2 : 64;
    rt_tenant_t **b = calloc(n, sizeof(*b));
    if (!b)
        return table.nbuckets != 0; /* a fuller table still works */
    for (size_t i = 0; i < table.nbuckets; i++)
        for (rt_tenant_t *t = table.buckets[i], *next; t; t = next) {
            next = t->next;
            t->next = b[t->hash & (n - 1)];
            b[t->hash & (n - 1)] = t;
        }
    free(table.buckets);
    table.buckets = b;
    table.nbuckets = n;
    return true;
}

static void sum_known(void *arg, size_t bytes)
{
    rt_tenant_t *t = arg;
    atomic_store(&t->retained_bytes, (long long)bytes);
    t->retained_known = true;
}

rt_tenant_t *rt_tenant_get(const char *mount)
{
    size_t len = strlen(mount);
    uint64_t h = rt_hash(mount, len);
    pthread_mutex_lock(&table.lock);
    if (table.count >= table.nbuckets && !grow()) {
        pthread_mutex_unlock(&table.lock);
        return NULL;
    }
    rt_tenant_t **p = slot_of(mount, len, h);
    rt_tenant_t *t = *p;
    if (t) {
        t->refs++;
        pthread_mutex_unlock(&table.lock);
        return t;
    }
    size_t bytes = (sizeof(*t) + len + 1 + RT_CACHE_LINE - 1) & ~(size_t)(RT_CACHE_LINE - 1);
    if (!(t = aligned_alloc(RT_CACHE_LINE, bytes))) {
        pthread_mutex_unlock(&table.lock);
        return NULL;
    }
    memset(t, 0, bytes);
    t->hash = h;
    t->refs = 1;
    t->mount_len = len;
    memcpy(t->mount, mount, len + 1);
    pthread_mutex_init(&t->rate_lock, NULL);
    t->refill_ns = 0; /* the first PUBLISH finds a second's worth */
    for (unsigned i = 0; i < rt_broker->conf.ntenants; i++)
        if (strcmp(rt_broker->conf.tenants[i].mount, mount) == 0)
            t->own = &rt_broker->conf.tenants[i];
    *p = t;
    table.count++;
    pthread_mutex_unlock(&table.lock);
    /* Outside the table's lock: the store's watch takes it under the store's. */
    rt_retained_bytes_under(rt_broker->retained, mount, len, sum_known, t);
    return t;
}

void rt_tenant_put(rt_tenant_t *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&table.lock);
    RT_ASSERT(t->refs > 0);
    if (--t->refs) {
        pthread_mutex_unlock(&table.lock);
        return;
    }
    rt_tenant_t **p = slot_of(t->mount, t->mount_len, t->hash);
    RT_ASSERT(*p == t);
    *p = t->next;
    table.count--;
    pthread_mutex_unlock(&table.lock);
    pthread_mutex_destroy(&t->rate_lock);
    free(t);
}

const char *rt_tenant_mount(const rt_tenant_t *t)
{
    return t->mount;
}

size_t rt_tenant_mount_len(const rt_tenant_t *t)
{
    return t->mount_len;
}

/* A tenant over its rate refuses thousands a second: the log tells of them every so often. */
#define REFUSALS_LOGGED_EVERY_MS 10000

static bool refuse(rt_tenant_t *t, rt_tenant_quota_t q)
{
    unsigned long long n = atomic_fetch_add_explicit(&t->refused[q], 1, memory_order_relaxed) + 1;
    unsigned long long now = rt_mono_ms(), last = atomic_load(&t->logged_ms[q]);
    if ((n == 1 || now >= last + REFUSALS_LOGGED_EVERY_MS) &&
        atomic_compare_exchange_strong(&t->logged_ms[q], &last, now))
        rt_log(RT_LOG_INFO, "client.tenant_quota", "tenant=%s quota=%s refused=%llu", t->mount,
               rt_tenant_quota_names[q], n);
    return false;
}

/* Counts one more in *n unless it is at max (0: none). */
static bool take_one(atomic_ullong *n, long max)
{
    unsigned long long v = atomic_load_explicit(n, memory_order_relaxed);
    do {
        if (max > 0 && v >= (unsigned long long)max)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(n, &v, v + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

bool rt_tenant_connect(rt_tenant_t *t, bool replacing)
{
    return take_one(&t->connections, replacing ? 0 : QUOTA(t, connections)) ||
           refuse(t, RT_TENANT_CONNECTIONS);
}

void rt_tenant_disconnect(rt_tenant_t *t)
{
    atomic_fetch_sub_explicit(&t->connections, 1, memory_order_relaxed);
}

bool rt_tenant_subscribe(rt_tenant_t *t)
{
    return take_one(&t->subscriptions, QUOTA(t, subscriptions)) ||
           refuse(t, RT_TENANT_SUBSCRIPTIONS);
}

void rt_tenant_unsubscribe(rt_tenant_t *t, uint32_t n)
{
    atomic_fetch_sub_explicit(&t->subscriptions, n, memory_order_relaxed);
}

void rt_tenant_add_subscriptions(rt_tenant_t *t, uint32_t n)
{
    atomic_fetch_add_explicit(&t->subscriptions, n, memory_order_relaxed);
}

/* A token bucket of a second's worth: rate PUBLISHes a second, rate of them at once. */
static bool rate_allows(rt_tenant_t *t, long rate)
{
    pthread_mutex_lock(&t->rate_lock);
    uint64_t now = rt_mono_ns();
    t->tokens += (double)(now - t->refill_ns) * (double)rate / 1e9;
    if (t->tokens > (double)rate)
        t->tokens = (double)rate;
    t->refill_ns = now;
    bool ok = t->tokens >= 1.0;
    if (ok)
        t->tokens -= 1.0;
    pthread_mutex_unlock(&t->rate_lock);
    return ok;
}

bool rt_tenant_publish(rt_tenant_t *t)
{
    long rate = QUOTA(t, publish_rate);
    if (rate > 0 && !rate_allows(t, rate))
        return refuse(t, RT_TENANT_PUBLISH_RATE);
    atomic_fetch_add_explicit(&t->messages_in, 1, memory_order_relaxed);
    return true;
}

bool rt_tenant_retain_fits(rt_tenant_t *t, size_t old_bytes, size_t new_bytes)
{
    long max = QUOTA(t, retained_bytes);
    long long held = atomic_load_explicit(&t->retained_bytes, memory_order_relaxed);
    if (max <= 0 || new_bytes <= old_bytes ||
        held + (long long)(new_bytes - old_bytes) <= (long long)max)
        return true;
    return refuse(t, RT_TENANT_RETAINED_BYTES);
}

void rt_tenant_delivered(rt_tenant_t *t)
{
    atomic_fetch_add_explicit(&t->messages_out, 1, memory_order_relaxed);
}

void rt_tenant_retained_changed(const char *topic, size_t len, ptrdiff_t delta)
{
    pthread_mutex_lock(&table.lock);
    /* Every level boundary is a mountpoint it may be under ("a/", "a/b/", ...). */
    for (size_t i = 0; table.count && i < len; i++) {
        if (topic[i] != '/')
            continue;
        uint64_t h = rt_hash(topic, i + 1);
        rt_tenant_t *t = *slot_of(topic, i + 1, h);
        if (t && t->retained_known)
            atomic_fetch_add_explicit(&t->retained_bytes, delta, memory_order_relaxed);
    }
    pthread_mutex_unlock(&table.lock);
}

size_t rt_tenant_each(void (*fn)(const rt_tenant_info_t *info, void *arg), void *arg)
{
    pthread_mutex_lock(&table.lock);
    size_t n = 0;
    for (size_t i = 0; i < table.nbuckets; i++)
        for (rt_tenant_t *t = table.buckets[i]; t; t = t->next, n++) {
            long long retained = atomic_load(&t->retained_bytes);
            rt_tenant_info_t info = {.mount = t->mount,
                                     .connections = atomic_load(&t->connections),
                                     .subscriptions = atomic_load(&t->subscriptions),
                                     .retained_bytes = retained > 0 ? (uint64_t)retained : 0,
                                     .messages_in = atomic_load(&t->messages_in),
                                     .messages_out = atomic_load(&t->messages_out)};
            for (int q = 0; q < RT_TENANT_QUOTAS; q++)
                info.refused[q] = atomic_load(&t->refused[q]);
            info.limits[RT_TENANT_CONNECTIONS] = QUOTA(t, connections);
            info.limits[RT_TENANT_SUBSCRIPTIONS] = QUOTA(t, subscriptions);
            info.limits[RT_TENANT_PUBLISH_RATE] = QUOTA(t, publish_rate);
            info.limits[RT_TENANT_RETAINED_BYTES] = QUOTA(t, retained_bytes);
            fn(&info, arg);
        }
    pthread_mutex_unlock(&table.lock);
    return n;
}

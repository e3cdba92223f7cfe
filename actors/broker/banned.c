/*
** The banned list and flapping detection (banned.h).
**
** Checked at every CONNECT, changed rarely (by an operator, or by flapping detection): an
** empty list costs a CONNECT one relaxed load; a list with bans a read lock, one lookup in
** a keyed hash per name (the client id, the user name) and a walk of the address ranges.
** max_banned bounds the list, since flapping detection adds bans that clients cause: a
** full list first forgets the bans that ran out, then refuses.
**
** Flapping detection keeps, per client id, the start of its window and its connects since,
** in a fixed table of sets of RT_FLAP_WAYS entries picked by the keyed hash (a new id takes
** the entry of its set whose window began first), so a storm of made-up ids costs a fixed
** 64 KiB and cannot aim at one set; it may push a real flapper out of the table, which
** only delays its ban.
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h"
#include "broker.h"
#include "log.h"
#include "store.h"

const char *const rt_ban_kind_names[RT_BAN_KINDS] = {"clientid", "username", "address"};

typedef struct entry_s {
    struct entry_s *next; /* its bucket's chain, or the list of address ranges */
    rt_ban_kind_t kind;
    rt_conf_net_t net; /* an address range's */
    int64_t at_s, until_s;
    char *by, *reason;
    size_t len;
    char value[]; /* NUL-terminated */
} entry_t;

static struct {
    pthread_rwlock_t lock;
    entry_t **buckets; /* client ids and user names; nbuckets a power of two */
    size_t nbuckets;
    entry_t *nets;     /* address ranges */
    size_t count;      /* entries, run out or not */
    atomic_size_t any; /* count, for the CONNECTs that find the list empty without the lock */
    atomic_uint_fast64_t refused[RT_BAN_KINDS];
    atomic_uint_fast64_t flapping_bans;
} list = {.lock = PTHREAD_RWLOCK_INITIALIZER};

static int64_t now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

static bool ran_out(const entry_t *e, int64_t now)
{
    return e->until_s && e->until_s <= now;
}

int rt_ban_kind_parse(const char *name, rt_ban_kind_t *out)
{
    for (int k = 0; k < RT_BAN_KINDS; k++)
        if (strcmp(name, rt_ban_kind_names[k]) == 0) {
            *out = (rt_ban_kind_t)k;
            return 0;
        }
    return RT_EINVAL;
}

static size_t bucket_of(rt_ban_kind_t kind, const char *value, size_t len, size_t nbuckets)
{
    return (size_t)rt_hash_with((uint64_t)kind + 1, value, len) & (nbuckets - 1);
}

/* An address range's value as the list keeps it: "a.b.c.d/n" or "v6/n", host bits cleared. */
static int net_value(const char *value, size_t len, rt_conf_net_t *net, char *out, size_t outlen)
{
    char text[80];
    if (len == 0 || len >= sizeof(text))
        return RT_EINVAL;
    memcpy(text, value, len);
    text[len] = 0;
    if (!rt_conf_net_parse(text, net))
        return RT_EINVAL;
    rt_conf_net_format(net, out, outlen);
    return 0;
}

/* The entry of that kind and value, and the link that points at it; write or read lock. */
static entry_t **find(rt_ban_kind_t kind, const char *value, size_t len)
{
    entry_t **at =
        kind == RT_BAN_ADDRESS
            ? &list.nets
            : (list.nbuckets ? &list.buckets[bucket_of(kind, value, len, list.nbuckets)] : NULL);
    if (!at)
        return NULL;
    for (; *at; at = &(*at)->next)
        if ((*at)->kind == kind && (*at)->len == len && memcmp((*at)->value, value, len) == 0)
            return at;
    return NULL;
}

static void entry_free(entry_t *e)
{
    free(e->by);
    free(e->reason);
    free(e);
}

static void unlink_entry(entry_t **at)
{
    entry_t *e = *at;
    *at = e->next;
    entry_free(e);
    list.count--;
    atomic_store_explicit(&list.any, list.count, memory_order_relaxed);
}

/* Forgets the bans that ran out (write lock); returns how many. */
static size_t purge(int64_t now)
{
    size_t n = 0;
    for (size_t b = 0; b <= list.nbuckets; b++) {
        entry_t **at = b < list.nbuckets ? &list.buckets[b] : &list.nets;
        while (*at)
            if (ran_out(*at, now)) {
                unlink_entry(at);
                n++;
            } else {
                at = &(*at)->next;
            }
    }
    return n;
}

/* Room for one more name in the hash (write lock): it doubles past one entry a bucket. */
static int grow(void)
{
    if (list.count < list.nbuckets)
        return 0;
    size_t n = list.nbuckets ? list.nbuckets * 2 : 64;
    entry_t **b = calloc(n, sizeof(*b));
    if (!b)
        return list.nbuckets ? 0 : RT_ENOMEM; /* longer chains, still right */
    for (size_t i = 0; i < list.nbuckets; i++)
        for (entry_t *e = list.buckets[i], *next; e; e = next) {
            next = e->next;
            size_t k = bucket_of(e->kind, e->value, e->len, n);
            e->next = b[k];
            b[k] = e;
        }
    free(list.buckets);
    list.buckets = b;
    list.nbuckets = n;
    return 0;
}

/* The add, in memory only (write lock): the store's load and rt_banned_add. */
static int put(const rt_ban_t *b, char *err, size_t errlen)
{
    int64_t now = now_s();
    entry_t **at = find(b->kind, b->value, b->len);
    long max = RT_LIVE(max_banned);
    if (!at && max > 0 && list.count >= (size_t)max && !purge(now)) {
        snprintf(err, errlen, "the list holds max_banned (%ld) bans", max);
        return RT_ELIMIT;
    }
    if (!at && b->kind != RT_BAN_ADDRESS && grow() != 0) {
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    entry_t *e = malloc(sizeof(*e) + b->len + 1);
    char *by = strndup(b->by, RT_BAN_BY_MAX), *reason = strndup(b->reason, RT_BAN_REASON_MAX);
    if (!e || !by || !reason) {
        free(e);
        free(by);
        free(reason);
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    *e = (entry_t){.kind = b->kind,
                   .at_s = b->at_s,
                   .until_s = b->until_s,
                   .by = by,
                   .reason = reason,
                   .len = b->len};
    memcpy(e->value, b->value, b->len);
    e->value[b->len] = 0;
    if (b->kind == RT_BAN_ADDRESS)
        rt_conf_net_parse(e->value, &e->net); /* checked by the caller: canonical already */
    if (at) {                                 /* replaced: same place in its chain */
        e->next = (*at)->next;
        entry_free(*at);
        *at = e;
        return 0;
    }
    entry_t **head = b->kind == RT_BAN_ADDRESS
                         ? &list.nets
                         : &list.buckets[bucket_of(b->kind, b->value, b->len, list.nbuckets)];
    e->next = *head;
    *head = e;
    list.count++;
    atomic_store_explicit(&list.any, list.count, memory_order_relaxed);
    return 0;
}

/* b with an address range's value made canonical (into buf); RT_EINVAL with err. */
static int checked(const rt_ban_t *b, rt_ban_t *out, char *buf, size_t buflen, char *err,
                   size_t errlen)
{
    *out = *b;
    if ((unsigned)b->kind >= RT_BAN_KINDS) {
        snprintf(err, errlen, "kind: clientid, username or address");
        return RT_EINVAL;
    }
    if (b->len == 0 || b->len > RT_BAN_VALUE_MAX || memchr(b->value, 0, b->len)) {
        snprintf(err, errlen, "the %s: 1 to %d bytes, no NUL", rt_ban_kind_names[b->kind],
                 RT_BAN_VALUE_MAX);
        return RT_EINVAL;
    }
    if (b->kind != RT_BAN_ADDRESS)
        return 0;
    rt_conf_net_t net;
    if (net_value(b->value, b->len, &net, buf, buflen) != 0) {
        snprintf(err, errlen, "the address: an IPv4 or IPv6 address or range (10.0.0.0/8)");
        return RT_EINVAL;
    }
    out->value = buf;
    out->len = strlen(buf);
    return 0;
}

static _Atomic(rt_banned_replicate_fn) replicator;

void rt_banned_set_replicator(rt_banned_replicate_fn fn)
{
    atomic_store(&replicator, fn);
}

/* An add or a delete here and in state.db; told to the cluster when replicate. */
static int change(const rt_ban_t *b, bool added, bool replicate, char *err, size_t errlen)
{
    char buf[80];
    rt_ban_t c;
    int rc = checked(b, &c, buf, sizeof(buf), err, errlen);
    if (rc)
        return rc;
    bool existed = true; /* a delete: there was an entry, live or run out, to drop */
    pthread_rwlock_wrlock(&list.lock);
    if (added) {
        rc = put(&c, err, errlen);
    } else {
        entry_t **at = find(c.kind, c.value, c.len);
        existed = at != NULL;
        rc = at && !ran_out(*at, now_s()) ? 0 : RT_ENOTFOUND;
        if (at)
            unlink_entry(at);
    }
    pthread_rwlock_unlock(&list.lock);
    if ((added && rc) || !existed)
        return rc;
    if (rt_store_enabled() && added)
        rt_store_ban((int)c.kind, c.value, c.len, c.by, c.reason, c.at_s, c.until_s);
    else if (rt_store_enabled())
        rt_store_unban((int)c.kind, c.value, c.len);
    rt_banned_replicate_fn fn = replicate ? atomic_load(&replicator) : NULL;
    if (fn)
        fn(&c, added);
    return rc;
}

int rt_banned_add(const rt_ban_t *b, char *err, size_t errlen)
{
    return change(b, true, true, err, errlen);
}

int rt_banned_del(rt_ban_kind_t kind, const char *value, size_t len)
{
    char err[128];
    return change(&(rt_ban_t){.kind = kind, .value = value, .len = len}, false, true, err,
                  sizeof(err));
}

int rt_banned_apply(const rt_ban_t *b, bool added)
{
    char err[128];
    int rc = change(b, added, false, err, sizeof(err));
    return rc == RT_ENOTFOUND && !added ? 0 : rc;
}

static rt_ban_t view(const entry_t *e)
{
    return (rt_ban_t){.kind = e->kind,
                      .value = e->value,
                      .len = e->len,
                      .by = e->by,
                      .reason = e->reason,
                      .at_s = e->at_s,
                      .until_s = e->until_s};
}

size_t rt_banned_each(void (*fn)(const rt_ban_t *b, void *arg), void *arg)
{
    int64_t now = now_s();
    size_t n = 0;
    pthread_rwlock_rdlock(&list.lock);
    for (size_t b = 0; b <= list.nbuckets; b++)
        for (const entry_t *e = b < list.nbuckets ? list.buckets[b] : list.nets; e; e = e->next)
            if (!ran_out(e, now)) {
                rt_ban_t v = view(e);
                if (fn)
                    fn(&v, arg);
                n++;
            }
    pthread_rwlock_unlock(&list.lock);
    return n;
}

size_t rt_banned_count(void)
{
    return rt_banned_each(NULL, NULL);
}

/* Copies a matched ban out (read lock): its strings into buf, cut to fit. */
static void copy_hit(const entry_t *e, rt_ban_t *hit, char *buf, size_t len)
{
    *hit = view(e);
    int n = snprintf(buf, len, "%s", e->value);
    size_t vlen = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len ? len - 1 : 0;
    hit->value = buf;
    hit->len = vlen;
    size_t rest = len > vlen + 1 ? len - vlen - 1 : 0;
    hit->reason = rest ? buf + vlen + 1 : "";
    if (rest)
        snprintf(buf + vlen + 1, rest, "%s", e->reason);
    hit->by = "";
}

bool rt_banned_match(const char *cid, size_t cidlen, const char *user, size_t ulen,
                     const rt_auth_addr_t *peer, rt_ban_t *hit, char *hit_buf, size_t hit_len)
{
    if (!atomic_load_explicit(&list.any, memory_order_relaxed))
        return false;
    int64_t now = now_s();
    const entry_t *found = NULL;
    pthread_rwlock_rdlock(&list.lock);
    entry_t **at = cidlen ? find(RT_BAN_CLIENTID, cid, cidlen) : NULL;
    if (at && !ran_out(*at, now))
        found = *at;
    at = !found && user ? find(RT_BAN_USERNAME, user, ulen) : NULL;
    if (at && !ran_out(*at, now))
        found = *at;
    for (const entry_t *e = list.nets; !found && peer && e; e = e->next)
        if (!ran_out(e, now) && rt_conf_net_match(&e->net, 1, peer->b))
            found = e;
    if (found) {
        copy_hit(found, hit, hit_buf, hit_len);
        atomic_fetch_add_explicit(&list.refused[found->kind], 1, memory_order_relaxed);
    }
    pthread_rwlock_unlock(&list.lock);
    return found != NULL;
}

/* ---- Flapping ---- */

#define RT_FLAP_WAYS 8
#define RT_FLAP_SETS 256 /* 2,048 client ids tracked at once, 32 bytes each */

typedef struct {
    uint64_t key;      /* the client id's keyed hash; 0: free */
    uint64_t start_ms; /* its window's start (monotonic) */
    uint32_t connects; /* within the window */
} flap_t;

static struct {
    pthread_mutex_t lock;
    flap_t slots[RT_FLAP_SETS][RT_FLAP_WAYS];
} flaps = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Counts the connect; true when it makes max within the window (the entry starts over). */
static bool flap_count(uint64_t key, uint64_t now_ms, uint64_t window_ms, uint32_t max)
{
    flap_t *set = flaps.slots[key % RT_FLAP_SETS], *f = NULL, *victim = &set[0];
    for (int i = 0; i < RT_FLAP_WAYS && !f; i++) {
        if (set[i].key == key)
            f = &set[i];
        else if (victim->key && (!set[i].key || set[i].start_ms < victim->start_ms))
            victim = &set[i]; /* a free entry, else the one whose window began first */
    }
    if (!f || now_ms - f->start_ms >= window_ms) {
        f = f ? f : victim;
        *f = (flap_t){.key = key, .start_ms = now_ms};
    }
    if (++f->connects < max)
        return false;
    f->key = 0; /* banned now: counted again from nothing once the ban ends */
    return true;
}

bool rt_banned_flapping(const char *cid, size_t len)
{
    long max = RT_LIVE(flapping_max_connects);
    if (max <= 0 || len == 0)
        return false;
    long window_s = RT_LIVE(flapping_window_s), ban_s = RT_LIVE(flapping_ban_s);
    uint64_t key = rt_hash(cid, len) | 1;
    pthread_mutex_lock(&flaps.lock);
    bool flapping = flap_count(key, rt_mono_ms(), (uint64_t)window_s * 1000, (uint32_t)max);
    pthread_mutex_unlock(&flaps.lock);
    if (!flapping)
        return false;
    char reason[96], err[128];
    snprintf(reason, sizeof(reason), "flapping: %ld connects within %ld s", max, window_s);
    int64_t now = now_s();
    rt_ban_t b = {.kind = RT_BAN_CLIENTID,
                  .value = cid,
                  .len = len,
                  .by = "flapping",
                  .reason = reason,
                  .at_s = now,
                  .until_s = now + ban_s};
    int rc = rt_banned_add(&b, err, sizeof(err));
    if (rc) {
        rt_log(RT_LOG_WARNING, "client.flapping",
               "client=%.*s connects=%ld window_s=%ld banned=false error=%s", (int)len, cid, max,
               window_s, err);
        return false;
    }
    atomic_fetch_add_explicit(&list.flapping_bans, 1, memory_order_relaxed);
    rt_log(RT_LOG_WARNING, "client.flapping", "client=%.*s connects=%ld window_s=%ld ban_s=%ld",
           (int)len, cid, max, window_s, ban_s);
    return true;
}

/* ---- Start, stop, counters ---- */

static void load_one(int kind, const char *value, size_t len, const char *by, const char *reason,
                     int64_t at_s, int64_t until_s, void *arg)
{
    (void)arg;
    char buf[80], err[128];
    rt_ban_t c, b = {.kind = (rt_ban_kind_t)kind,
                     .value = value,
                     .len = len,
                     .by = by,
                     .reason = reason,
                     .at_s = at_s,
                     .until_s = until_s};
    int rc = checked(&b, &c, buf, sizeof(buf), err, sizeof(err));
    if (rc == 0) {
        pthread_rwlock_wrlock(&list.lock);
        rc = put(&c, err, sizeof(err));
        pthread_rwlock_unlock(&list.lock);
    }
    if (rc)
        rt_log(RT_LOG_ERROR, "store.ban_skipped", "kind=%d error=%s", kind, err);
}

int rt_banned_load(void)
{
    return rt_store_load_bans(load_one, NULL);
}

void rt_banned_free(void)
{
    pthread_rwlock_wrlock(&list.lock);
    for (size_t b = 0; b <= list.nbuckets; b++) {
        entry_t **at = b < list.nbuckets ? &list.buckets[b] : &list.nets;
        while (*at)
            unlink_entry(at);
    }
    free(list.buckets);
    list.buckets = NULL;
    list.nbuckets = 0;
    pthread_rwlock_unlock(&list.lock);
    pthread_mutex_lock(&flaps.lock);
    memset(flaps.slots, 0, sizeof(flaps.slots));
    pthread_mutex_unlock(&flaps.lock);
}

void rt_banned_stats(rt_banned_stats_t *out)
{
    for (int k = 0; k < RT_BAN_KINDS; k++)
        out->refused[k] = atomic_load_explicit(&list.refused[k], memory_order_relaxed);
    out->flapping_bans = atomic_load_explicit(&list.flapping_bans, memory_order_relaxed);
}

/*
** Who is online: every bound resource, by bare JID, with its actor, priority and whether it
** sent available presence. Any session reads it to route and writes its own entry at bind,
** presence and end, from any scheduler thread: a hash table in STRIPES stripes, each with its
** own lock held for a walk of one bucket (a copy of the routes out, never a send), so
** sessions of different users seldom meet on a lock. An entry is one malloc'ed block
** charged to the session that bound it (rt__c2s_reg_entry_bytes), so `rtctl top` counts it.
**
** In a cluster the table holds the other nodes' resources too, under their remote pids
** (c2s_cluster.c): their entries are charged to the xmpp_cluster actor, which applies them.
** A change to an entry of this node's is told to the other nodes with the stripe's lock still
** held, so that the announcements of one entry leave in the order the changes were made, and a
** node's snapshot (rt__c2s_reg_each_local, under the same locks) never overtakes one.
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"

#define STRIPES 64
#define FIRST_BUCKETS 64

typedef struct reg_entry_s {
    struct reg_entry_s *next;
    uint64_t hash; /* of the bare JID */
    rt_pid_t pid;
    int8_t priority;
    bool available;
    bool carbons; /* XEP-0280: the resource wants copies of its account's chats */
    uint16_t bare_len, res_len;
    char key[]; /* the bare JID, then the resource, no separator */
} reg_entry_t;

typedef struct stripe_s {
    pthread_mutex_t lock;
    reg_entry_t **buckets;
    size_t cap, len;
} stripe_t;

static stripe_t stripes[STRIPES];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic size_t entries, remote_bytes;

static void init_locks(void)
{
    for (size_t i = 0; i < STRIPES; i++)
        pthread_mutex_init(&stripes[i].lock, NULL);
}

static stripe_t *stripe_of(uint64_t h)
{
    pthread_once(&once, init_locks);
    return &stripes[h % STRIPES];
}

static reg_entry_t **bucket(stripe_t *s, uint64_t h)
{
    return &s->buckets[(h / STRIPES) & (s->cap - 1)];
}

static bool same_bare(const reg_entry_t *e, uint64_t h, const char *bare, size_t len)
{
    return e->hash == h && e->bare_len == len && memcmp(e->key, bare, len) == 0;
}

static bool same_res(const reg_entry_t *e, const char *res, size_t len)
{
    return e->res_len == len && memcmp(e->key + e->bare_len, res, len) == 0;
}

/* Doubles the stripe's buckets; false (nothing changed) when out of memory. */
static bool grow(stripe_t *s)
{
    size_t cap = s->cap ? s->cap * 2 : FIRST_BUCKETS;
    reg_entry_t **b = calloc(cap, sizeof(*b));
    if (!b)
        return false;
    for (size_t i = 0; i < s->cap; i++)
        for (reg_entry_t *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            reg_entry_t **at = &b[(e->hash / STRIPES) & (cap - 1)];
            e->next = *at;
            *at = e;
        }
    free(s->buckets);
    s->buckets = b;
    s->cap = cap;
    return true;
}

size_t rt__c2s_reg_entry_bytes(size_t bare_len, size_t res_len)
{
    return (sizeof(reg_entry_t) + bare_len + res_len + 15) & ~(size_t)15;
}

static c2s_route_t route_of(const reg_entry_t *e)
{
    return (c2s_route_t){
        .pid = e->pid, .priority = e->priority, .available = e->available, .carbons = e->carbons};
}

/* Counts an entry in (sign 1) or out (-1) as this node's or another's, by its pid. */
static void counted(const reg_entry_t *e, int sign)
{
    bool remote = rt__c2s_pid_node(e->pid) != 0;
    size_t bytes = rt__c2s_reg_entry_bytes(e->bare_len, e->res_len);
    if (!remote) {
        atomic_fetch_add_explicit(&entries, (size_t)(ptrdiff_t)sign, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.cluster_resources, (uint64_t)(int64_t)sign,
                              memory_order_relaxed);
    if (e->available)
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_available, (uint64_t)(int64_t)sign,
                                  memory_order_relaxed);
    atomic_fetch_add_explicit(&remote_bytes, (size_t)((ptrdiff_t)sign * (ptrdiff_t)bytes),
                              memory_order_relaxed);
}

/* A change to an entry of this node's, told to the others (the stripe locked). */
static void told(const reg_entry_t *e, bool bound, rt_pid_t replaced)
{
    if (rt__c2s_cluster_on() && !rt__c2s_pid_node(e->pid)) {
        c2s_route_t r = route_of(e);
        rt__c2s_cluster_announce(e->key, e->bare_len, e->key + e->bare_len, e->res_len, &r, bound,
                                 replaced);
    }
}

static reg_entry_t *entry_new(uint64_t h, const char *bare, size_t bare_len, const char *res,
                              size_t res_len, rt_pid_t pid)
{
    reg_entry_t *e = malloc(rt__c2s_reg_entry_bytes(bare_len, res_len));
    if (!e)
        return NULL;
    e->hash = h;
    e->pid = pid;
    e->priority = 0;
    e->available = false;
    e->carbons = false;
    e->bare_len = (uint16_t)bare_len;
    e->res_len = (uint16_t)res_len;
    memcpy(e->key, bare, bare_len);
    memcpy(e->key + bare_len, res, res_len);
    return e;
}

static void entry_add(stripe_t *s, reg_entry_t *e)
{
    reg_entry_t **at = bucket(s, e->hash);
    e->next = *at;
    *at = e;
    s->len++;
    counted(e, 1);
}

/* e's pid becomes pid (a takeover): counted as the new holder's. */
static void entry_retake(reg_entry_t *e, rt_pid_t pid)
{
    counted(e, -1);
    e->pid = pid;
    e->available = false;
    e->carbons = false;
    e->priority = 0;
    counted(e, 1);
}

/* h's stripe, locked, with buckets to add one to (grown when full); NULL when it has none. */
static stripe_t *locked_for_one_more(uint64_t h)
{
    stripe_t *s = stripe_of(h);
    pthread_mutex_lock(&s->lock);
    if (s->len >= s->cap && !grow(s) && !s->cap) {
        pthread_mutex_unlock(&s->lock);
        return NULL;
    }
    return s;
}

int rt__c2s_reg_bind(const char *bare, size_t bare_len, const char *res, size_t res_len,
                     rt_pid_t pid, bool replace, unsigned max, rt_pid_t *old)
{
    uint64_t h = rt_hash(bare, bare_len);
    *old = 0;
    stripe_t *s = locked_for_one_more(h);
    if (!s)
        return RT_ENOMEM;
    unsigned count = 0;
    for (reg_entry_t *e = *bucket(s, h); e; e = e->next) {
        if (!same_bare(e, h, bare, bare_len))
            continue;
        if (same_res(e, res, res_len)) {
            if (!replace) {
                pthread_mutex_unlock(&s->lock);
                return RT_EEXIST;
            }
            *old = e->pid; /* the newer session takes the entry; the older one is told */
            entry_retake(e, pid);
            told(e, true, *old);
            pthread_mutex_unlock(&s->lock);
            return 0;
        }
        count++;
    }
    if (count >= max) {
        pthread_mutex_unlock(&s->lock);
        return RT_ELIMIT;
    }
    reg_entry_t *e = entry_new(h, bare, bare_len, res, res_len, pid);
    if (!e) {
        pthread_mutex_unlock(&s->lock);
        return RT_ENOMEM;
    }
    entry_add(s, e);
    told(e, true, 0);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* The winner of two bindings of one full JID made on two nodes at once: the node whose name
   sorts last, as every node decides it alike. */
static bool wins_over(rt_pid_t a, rt_pid_t b)
{
    char na[RT_CONF_NODE_MAX], nb[RT_CONF_NODE_MAX];
    rt__c2s_cluster_node_name(rt__c2s_pid_node(a), na);
    rt__c2s_cluster_node_name(rt__c2s_pid_node(b), nb);
    return strcmp(na, nb) > 0;
}

int rt__c2s_reg_apply(const char *bare, size_t bare_len, const char *res, size_t res_len,
                      const c2s_route_t *r, rt_pid_t replaced)
{
    RT_ASSERT(rt__c2s_pid_node(r->pid) != 0);
    uint64_t h = rt_hash(bare, bare_len);
    stripe_t *s = locked_for_one_more(h);
    if (!s)
        return RT_ENOMEM;
    reg_entry_t *e = *bucket(s, h);
    while (e && !(same_bare(e, h, bare, bare_len) && same_res(e, res, res_len)))
        e = e->next;
    rt_pid_t loser = 0;
    if (!e) {
        if (!(e = entry_new(h, bare, bare_len, res, res_len, r->pid))) {
            pthread_mutex_unlock(&s->lock);
            return RT_ENOMEM;
        }
        entry_add(s, e);
    } else if (e->pid != r->pid) {
        /* Not the one it replaced: both nodes bound it before either heard of the other. */
        if (e->pid != replaced && !wins_over(r->pid, e->pid)) {
            pthread_mutex_unlock(&s->lock);
            return 0;
        }
        if (e->pid != replaced && !rt__c2s_pid_node(e->pid))
            loser = e->pid;
        entry_retake(e, r->pid);
    }
    if (e->available != r->available)
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_available, r->available ? 1 : (uint64_t)-1,
                                  memory_order_relaxed);
    e->priority = r->priority;
    e->available = r->available;
    e->carbons = r->carbons;
    pthread_mutex_unlock(&s->lock);
    if (loser)
        rt_send(loser, C2S_MSG_REPLACED, NULL, 0);
    return 0;
}

size_t rt__c2s_reg_purge_node(unsigned node)
{
    size_t n = 0;
    pthread_once(&once, init_locks);
    for (size_t i = 0; i < STRIPES; i++) {
        stripe_t *s = &stripes[i];
        pthread_mutex_lock(&s->lock);
        for (size_t b = 0; b < s->cap; b++)
            for (reg_entry_t **at = &s->buckets[b]; *at;) {
                reg_entry_t *e = *at;
                if (rt__c2s_pid_node(e->pid) != node) {
                    at = &e->next;
                    continue;
                }
                *at = e->next;
                s->len--;
                counted(e, -1);
                free(e);
                n++;
            }
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

/* The entry of bare/res held by pid, with the stripe locked; NULL (unlocked) when none. */
static reg_entry_t **find_own(const char *bare, size_t bare_len, const char *res, size_t res_len,
                              rt_pid_t pid, stripe_t **sp)
{
    uint64_t h = rt_hash(bare, bare_len);
    stripe_t *s = stripe_of(h);
    pthread_mutex_lock(&s->lock);
    if (s->cap)
        for (reg_entry_t **at = bucket(s, h); *at; at = &(*at)->next)
            if ((*at)->pid == pid && same_bare(*at, h, bare, bare_len) &&
                same_res(*at, res, res_len)) {
                *sp = s;
                return at;
            }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

void rt__c2s_reg_unbind(const char *bare, size_t bare_len, const char *res, size_t res_len,
                        rt_pid_t pid)
{
    stripe_t *s;
    reg_entry_t **at = find_own(bare, bare_len, res, res_len, pid, &s);
    if (!at)
        return; /* replaced: the entry is the newer session's now */
    reg_entry_t *e = *at;
    *at = e->next;
    s->len--;
    counted(e, -1);
    told(e, false, 0);
    pthread_mutex_unlock(&s->lock);
    free(e);
}

void rt__c2s_reg_presence(const char *bare, size_t bare_len, const char *res, size_t res_len,
                          rt_pid_t pid, bool available, int8_t priority)
{
    stripe_t *s;
    reg_entry_t **at = find_own(bare, bare_len, res, res_len, pid, &s);
    if (!at)
        return;
    (*at)->available = available;
    (*at)->priority = priority;
    told(*at, true, 0);
    pthread_mutex_unlock(&s->lock);
}

void rt__c2s_reg_carbons(const char *bare, size_t bare_len, const char *res, size_t res_len,
                         rt_pid_t pid, bool on)
{
    stripe_t *s;
    reg_entry_t **at = find_own(bare, bare_len, res, res_len, pid, &s);
    if (!at)
        return;
    (*at)->carbons = on;
    told(*at, true, 0);
    pthread_mutex_unlock(&s->lock);
}

size_t rt__c2s_reg_lookup(const char *bare, size_t bare_len, const char *res, size_t res_len,
                          c2s_route_t *out, size_t max)
{
    uint64_t h = rt_hash(bare, bare_len);
    stripe_t *s = stripe_of(h);
    size_t n = 0;
    pthread_mutex_lock(&s->lock);
    if (s->cap)
        for (reg_entry_t *e = *bucket(s, h); e && n < max; e = e->next)
            if (same_bare(e, h, bare, bare_len) && (!res_len || same_res(e, res, res_len)))
                out[n++] = route_of(e);
    pthread_mutex_unlock(&s->lock);
    return n;
}

size_t rt__c2s_reg_to_account(const char *host, const char *user, uint32_t tag, const void *p,
                              size_t n, bool unavailable_only)
{
    char bare[RT_JID_TEXT_MAX + 1];
    int blen = snprintf(bare, sizeof(bare), "%s@%s", user, host);
    size_t max = rt__c2s.conf ? (size_t)rt__c2s.conf->max_resources : C2S_ROUTES_MAX, sent = 0;
    c2s_route_t *r = blen > 0 && (size_t)blen < sizeof(bare) ? malloc(max * sizeof(*r)) : NULL;
    if (!r)
        return 0;
    size_t k = rt__c2s_reg_lookup(bare, (size_t)blen, NULL, 0, r, max);
    /* The store's news: for sessions on other nodes too when it is the cluster's (a home). */
    bool everywhere = rt__c2s_store_shared();
    for (size_t i = 0; i < k; i++)
        if ((!unavailable_only || !r[i].available) && (everywhere || !rt__c2s_pid_node(r[i].pid)))
            sent += rt__c2s_send(r[i].pid, tag, p, n) == 0;
    free(r);
    return sent;
}

void rt__c2s_reg_counts(size_t *local, size_t *remote, size_t *remote_bytes_out)
{
    *local = atomic_load_explicit(&entries, memory_order_relaxed);
    *remote = (size_t)atomic_load_explicit(&rt_c2s_stats.cluster_resources, memory_order_relaxed);
    *remote_bytes_out = atomic_load_explicit(&remote_bytes, memory_order_relaxed);
}

void rt__c2s_reg_each_local(void (*fn)(const char *bare, size_t bare_len, const char *res,
                                       size_t res_len, const c2s_route_t *r, void *arg),
                            void *arg)
{
    pthread_once(&once, init_locks);
    for (size_t i = 0; i < STRIPES; i++) {
        stripe_t *s = &stripes[i];
        pthread_mutex_lock(&s->lock);
        for (size_t b = 0; b < s->cap; b++)
            for (const reg_entry_t *e = s->buckets[b]; e; e = e->next) {
                if (rt__c2s_pid_node(e->pid))
                    continue;
                c2s_route_t r = route_of(e);
                fn(e->key, e->bare_len, e->key + e->bare_len, e->res_len, &r, arg);
            }
        pthread_mutex_unlock(&s->lock);
    }
}

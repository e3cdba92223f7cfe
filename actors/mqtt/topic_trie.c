/*
** Topic trie and retained store (see topic_trie.h for the contracts and the
** locking design).
**
** Both structures share one node type. A node stores only its own level; its
** children are found through a per-table hash keyed by (parent pointer,
** level bytes), so a node with 20,000 children ("test/%i") costs one hash
** probe per lookup and no per-node child array. Children are also linked in a
** sibling list so the retained store can enumerate them for '+' and '#'.
** Empty nodes (no children, subscriptions, groups or message) are freed at
** once, so an unsubscribed trie returns to its baseline memory.
*/
#define _GNU_SOURCE
#include "topic_trie.h"

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Hash buckets a table starts with once it gets its first node. */
#define TT_MIN_BUCKETS 16

typedef struct rt_trie_hit_s {
    rt_pid_t pid;
    rt_trie_opts_t o;
} hit_t;

/* One subscription, ordinary or group member: 16 bytes, kept in arrays. */
typedef hit_t sub_t;

/* A shared subscription group ($share/name/filter) at its filter's node. */
typedef struct group_s {
    struct group_s *next; /* next group at the same node */
    atomic_uint rr;       /* round-robin cursor: advanced by readers, hence atomic */
    uint32_t n, cap;      /* members */
    sub_t *members;
    uint32_t namelen;
    char name[];
} group_t;

typedef struct tnode_s tnode_t;
struct tnode_s {
    tnode_t *hnext;       /* chain in the table's edge hash */
    tnode_t *parent;      /* NULL only for the root */
    tnode_t *kids;        /* first child; siblings via next/prev */
    tnode_t *next, *prev; /* sibling list under parent */
    tnode_t *plus, *hash; /* the '+' and '#' children, shortcut for matching */
    sub_t *subs;          /* ordinary subscriptions at this filter */
    uint32_t nsubs, capsubs;
    group_t *groups;  /* shared groups at this filter */
    void *msg;        /* retained store: the message, NULL if none */
    size_t msg_bytes; /* retained store: what the limit counts for msg */
    uint64_t hval;    /* hash of (parent, level), kept for rehashing */
    uint32_t len;     /* level length */
    char level[];
};

/* The node tree and its edge hash; the owner's lock guards all of it. */
typedef struct {
    tnode_t *root;
    tnode_t **buckets; /* NULL while the table has no nodes */
    size_t nbuckets, count;
    atomic_size_t *bytes; /* owner's byte counter; writers of other shards update it too */
    atomic_size_t *nodes;
} ttable_t;

/*
** A reader-sharded lock ("big reader" lock): a reader takes only the slot of
** its thread, so with several slots publishers on different threads never
** write the same lock word (every match read-locks the shared wildcard
** shard); a writer takes every slot in order. RT_TRIE_READ_SLOTS (default 1)
** in topic_trie.h says when that pays.
*/
typedef struct {
    pthread_rwlock_t lock;
} __attribute__((aligned(64))) slot_t;

typedef struct {
    slot_t slots[RT_TRIE_READ_SLOTS];
    ttable_t t; /* guarded by all slots: readers hold one, writers all */
} __attribute__((aligned(64))) shard_t;

/* The calling thread's read slot, assigned round robin on first use. */
static atomic_uint next_slot;
static _Thread_local unsigned my_slot = UINT32_MAX;

static pthread_rwlock_t *read_lock(shard_t *s)
{
    if (my_slot == UINT32_MAX)
        my_slot =
            atomic_fetch_add_explicit(&next_slot, 1, memory_order_relaxed) % RT_TRIE_READ_SLOTS;
    pthread_rwlock_t *l = &s->slots[my_slot].lock;
    pthread_rwlock_rdlock(l);
    return l;
}

static void write_lock(shard_t *s)
{
    for (int i = 0; i < RT_TRIE_READ_SLOTS; i++)
        pthread_rwlock_wrlock(&s->slots[i].lock);
}

static void write_unlock(shard_t *s)
{
    for (int i = RT_TRIE_READ_SLOTS - 1; i >= 0; i--)
        pthread_rwlock_unlock(&s->slots[i].lock);
}

struct rt_trie_s {
    shard_t shards[RT_TRIE_SHARDS + 1]; /* the last one holds filters starting with + or # */
    atomic_size_t bytes;                /* statistics, updated under different shard locks */
    atomic_size_t nodes;
    atomic_size_t subs;
    atomic_size_t groups;
    atomic_size_t filters; /* see rt_trie_stats_t */
    _Atomic uint64_t subs_max, filters_max;
};

#define WILD_SHARD RT_TRIE_SHARDS

/* A walk position: node, the next level starting at p, or done (all levels consumed). */
typedef struct rt_trie_frame_s {
    tnode_t *node;
    const char *p;
    int done;
} frame_t;

/* ------------------------------------------------------------------------------------------ */
/* Counted allocation: every byte shows in the owner's stats. */

static void *cmalloc(atomic_size_t *ctr, size_t n)
{
    void *p = malloc(n);
    if (p)
        atomic_fetch_add_explicit(ctr, n, memory_order_relaxed);
    return p;
}

static void cfree(atomic_size_t *ctr, void *p, size_t n)
{
    if (!p)
        return;
    atomic_fetch_sub_explicit(ctr, n, memory_order_relaxed);
    free(p);
}

/* Grows or shrinks an array from oldn to newn elements, adjusting the counter. */
static void *crealloc(atomic_size_t *ctr, void *p, size_t oldn, size_t newn, size_t elem)
{
    void *q = realloc(p, newn * elem);
    if (!q)
        return NULL;
    atomic_fetch_add_explicit(ctr, newn * elem, memory_order_relaxed);
    atomic_fetch_sub_explicit(ctr, oldn * elem, memory_order_relaxed);
    return q;
}

/* ------------------------------------------------------------------------------------------ */
/* Syntax. */

/* Finds the end of the level starting at p: the next '/' or end. */
static const char *level_end(const char *p, const char *end)
{
    const char *q = memchr(p, '/', (size_t)(end - p));
    return q ? q : end;
}

int rt_trie_valid_topic(const char *topic, size_t len)
{
    if (!topic || len == 0 || len > RT_TRIE_MAX_LEN)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (topic[i] == '+' || topic[i] == '#' || topic[i] == '\0')
            return 0;
    return 1;
}

/* A filter without the $share prefix: '+' and '#' fill their level, '#' only last. */
static int valid_plain_filter(const char *f, size_t len)
{
    if (len == 0 || len > RT_TRIE_MAX_LEN)
        return 0;
    const char *p = f, *end = f + len;
    for (;;) {
        const char *q = level_end(p, end);
        for (const char *c = p; c < q; c++) {
            if (*c == '\0')
                return 0;
            if ((*c == '+' || *c == '#') && q - p != 1)
                return 0;
            if (*c == '#' && q != end)
                return 0;
        }
        if (q == end)
            return 1;
        p = q + 1;
    }
}

#define SHARE_PREFIX "$share/"
#define SHARE_PREFIX_LEN 7

/*
** Splits a filter into group (glen 0 if not shared) and the plain filter.
** Returns 0 if the syntax is wrong: an empty group or one with '+', '#'
** (the '/' ends it), or an empty or invalid filter after it.
*/
static int split_filter(const char *f, size_t len, const char **g, size_t *glen, const char **pf,
                        size_t *plen)
{
    *g = NULL;
    *glen = 0;
    *pf = f;
    *plen = len;
    if (!f || len > RT_TRIE_MAX_LEN)
        return 0;
    if (len < SHARE_PREFIX_LEN || memcmp(f, SHARE_PREFIX, SHARE_PREFIX_LEN) != 0)
        return valid_plain_filter(f, len);
    const char *p = f + SHARE_PREFIX_LEN, *end = f + len;
    const char *q = memchr(p, '/', (size_t)(end - p));
    if (!q || q == p)
        return 0;
    for (const char *c = p; c < q; c++)
        if (*c == '+' || *c == '#' || *c == '\0')
            return 0;
    *g = p;
    *glen = (size_t)(q - p);
    *pf = q + 1;
    *plen = (size_t)(end - (q + 1));
    return valid_plain_filter(*pf, *plen);
}

int rt_trie_valid_filter(const char *filter, size_t len)
{
    const char *g, *pf;
    size_t gl, pl;
    return split_filter(filter, len, &g, &gl, &pf, &pl);
}

/* ------------------------------------------------------------------------------------------ */
/* The node table. */

/* Levels are the publishers' and subscribers' choice: the keyed hash (with the parent as
   tweak) keeps their collisions unplannable. */
static uint64_t edge_hash(const tnode_t *parent, const char *lvl, size_t n)
{
    return rt_hash_with((uint64_t)(uintptr_t)parent, lvl, n);
}

static tnode_t *node_alloc(ttable_t *t, tnode_t *parent, const char *lvl, size_t n)
{
    tnode_t *x = cmalloc(t->bytes, sizeof(*x) + n);
    if (!x)
        return NULL;
    memset(x, 0, sizeof(*x));
    memcpy(x->level, lvl, n);
    x->len = (uint32_t)n;
    x->parent = parent;
    return x;
}

static int tt_init(ttable_t *t, atomic_size_t *bytes, atomic_size_t *nodes)
{
    memset(t, 0, sizeof(*t));
    t->bytes = bytes;
    t->nodes = nodes;
    t->root = node_alloc(t, NULL, "", 0);
    return t->root ? 0 : RT_ENOMEM;
}

static tnode_t *tt_find(const ttable_t *t, const tnode_t *parent, const char *lvl, size_t n)
{
    if (!t->buckets)
        return NULL;
    uint64_t h = edge_hash(parent, lvl, n);
    for (tnode_t *x = t->buckets[h & (t->nbuckets - 1)]; x; x = x->hnext)
        if (x->hval == h && x->parent == parent && x->len == n && memcmp(x->level, lvl, n) == 0)
            return x;
    return NULL;
}

/* Resizes the bucket array to nb (a power of two, or 0 to free it). */
static int tt_rehash(ttable_t *t, size_t nb)
{
    tnode_t **nbk = NULL;
    if (nb) {
        nbk = cmalloc(t->bytes, nb * sizeof(*nbk));
        if (!nbk)
            return RT_ENOMEM;
        memset(nbk, 0, nb * sizeof(*nbk));
    }
    for (size_t i = 0; i < t->nbuckets; i++) {
        tnode_t *x = t->buckets[i];
        while (x) {
            tnode_t *nx = x->hnext;
            x->hnext = nbk[x->hval & (nb - 1)];
            nbk[x->hval & (nb - 1)] = x;
            x = nx;
        }
    }
    cfree(t->bytes, t->buckets, t->nbuckets * sizeof(*t->buckets));
    t->buckets = nbk;
    t->nbuckets = nb;
    return 0;
}

/* Finds or creates parent's child lvl. */
static tnode_t *tt_child(ttable_t *t, tnode_t *parent, const char *lvl, size_t n)
{
    tnode_t *x = tt_find(t, parent, lvl, n);
    if (x)
        return x;
    if (t->count + 1 > t->nbuckets &&
        tt_rehash(t, t->nbuckets ? t->nbuckets * 2 : TT_MIN_BUCKETS) != 0 && !t->buckets)
        return NULL; /* a failed growth is fine (longer chains) unless there is no table */
    x = node_alloc(t, parent, lvl, n);
    if (!x)
        return NULL;
    x->hval = edge_hash(parent, lvl, n);
    x->hnext = t->buckets[x->hval & (t->nbuckets - 1)];
    t->buckets[x->hval & (t->nbuckets - 1)] = x;
    t->count++;
    atomic_fetch_add_explicit(t->nodes, 1, memory_order_relaxed);
    x->next = parent->kids;
    if (parent->kids)
        parent->kids->prev = x;
    parent->kids = x;
    if (n == 1 && lvl[0] == '+')
        parent->plus = x;
    if (n == 1 && lvl[0] == '#')
        parent->hash = x;
    return x;
}

static int node_empty(const tnode_t *x)
{
    return !x->kids && x->nsubs == 0 && !x->groups && !x->msg;
}

/* Frees x and then each ancestor that became empty, stopping at the root. */
static void tt_prune(ttable_t *t, tnode_t *x)
{
    while (x && x->parent && node_empty(x)) {
        tnode_t *parent = x->parent;
        tnode_t **pp = &t->buckets[x->hval & (t->nbuckets - 1)];
        while (*pp != x)
            pp = &(*pp)->hnext;
        *pp = x->hnext;
        t->count--;
        atomic_fetch_sub_explicit(t->nodes, 1, memory_order_relaxed);
        if (x->prev)
            x->prev->next = x->next;
        else
            parent->kids = x->next;
        if (x->next)
            x->next->prev = x->prev;
        if (parent->plus == x)
            parent->plus = NULL;
        if (parent->hash == x)
            parent->hash = NULL;
        cfree(t->bytes, x->subs, x->capsubs * sizeof(sub_t));
        cfree(t->bytes, x, sizeof(*x) + x->len);
        x = parent;
    }
    /* Give the buckets back when the table empties, so memory returns to baseline. */
    if (t->count == 0 && t->buckets)
        tt_rehash(t, 0);
}

/* Walks (creating if asked) the node for a plain filter or topic. */
static tnode_t *tt_path(ttable_t *t, const char *f, size_t len, int create)
{
    tnode_t *x = t->root;
    const char *p = f, *end = f + len;
    for (;;) {
        const char *q = level_end(p, end);
        tnode_t *c =
            create ? tt_child(t, x, p, (size_t)(q - p)) : tt_find(t, x, p, (size_t)(q - p));
        if (!c) {
            if (create)
                tt_prune(t, x); /* drop the nodes this call created */
            return NULL;
        }
        x = c;
        if (q == end)
            return x;
        p = q + 1;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Subscription arrays. */

static sub_t *subs_find(sub_t *a, uint32_t n, rt_pid_t pid)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i].pid == pid)
            return &a[i];
    return NULL;
}

/* Appends to a doubling array; RT_ENOMEM leaves it unchanged. */
static int subs_add(atomic_size_t *ctr, sub_t **a, uint32_t *n, uint32_t *cap, rt_pid_t pid,
                    const rt_trie_opts_t *o)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 2;
        sub_t *na = crealloc(ctr, *a, *cap, nc, sizeof(sub_t));
        if (!na)
            return RT_ENOMEM;
        *a = na;
        *cap = nc;
    }
    (*a)[*n].pid = pid;
    (*a)[*n].o = *o;
    (*n)++;
    return 0;
}

/* Removes an element by moving the last into its place; shrinks at a quarter full. */
static void subs_del(atomic_size_t *ctr, sub_t **a, uint32_t *n, uint32_t *cap, sub_t *e)
{
    *e = (*a)[--(*n)];
    if (*n == 0) {
        cfree(ctr, *a, *cap * sizeof(sub_t));
        *a = NULL;
        *cap = 0;
    } else if (*n * 4 <= *cap && *cap > 2) {
        sub_t *na = crealloc(ctr, *a, *cap, *cap / 2, sizeof(sub_t));
        if (na) { /* a failed shrink just keeps the bigger array */
            *a = na;
            *cap /= 2;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Subscription trie. */

int rt_trie_new(rt_trie_t **out)
{
    rt_trie_t *t = aligned_alloc(64, sizeof(*t));
    if (!t)
        return RT_ENOMEM;
    memset(t, 0, sizeof(*t));
    atomic_init(&t->bytes, sizeof(*t));
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* glibc favours readers by default: a stream of publishes would starve SUBSCRIBE. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    for (int i = 0; i <= RT_TRIE_SHARDS; i++) {
        for (int k = 0; k < RT_TRIE_READ_SLOTS; k++)
            pthread_rwlock_init(&t->shards[i].slots[k].lock, &a);
        if (tt_init(&t->shards[i].t, &t->bytes, &t->nodes) != 0) {
            for (int j = 0; j <= i; j++)
                for (int k = 0; k < RT_TRIE_READ_SLOTS; k++)
                    pthread_rwlock_destroy(&t->shards[j].slots[k].lock);
            for (int j = 0; j < i; j++)
                free(t->shards[j].t.root);
            free(t);
            pthread_rwlockattr_destroy(&a);
            return RT_ENOMEM;
        }
    }
    pthread_rwlockattr_destroy(&a);
    *out = t;
    return 0;
}

static void node_free_all(ttable_t *t, tnode_t *x)
{
    /* Iterative post-order: the trie can be deeper than a thread stack allows recursion. */
    while (x) {
        if (x->kids) {
            x = x->kids;
            continue;
        }
        tnode_t *parent = x->parent;
        if (parent) {
            parent->kids = x->next;
            if (x->next)
                x->next->prev = NULL;
        }
        for (group_t *g = x->groups, *ng; g; g = ng) {
            ng = g->next;
            free(g->members);
            free(g);
        }
        free(x->subs);
        free(x);
        x = parent;
    }
}

void rt_trie_free(rt_trie_t *t)
{
    if (!t)
        return;
    for (int i = 0; i <= RT_TRIE_SHARDS; i++) {
        node_free_all(&t->shards[i].t, t->shards[i].t.root);
        free(t->shards[i].t.buckets);
        for (int k = 0; k < RT_TRIE_READ_SLOTS; k++)
            pthread_rwlock_destroy(&t->shards[i].slots[k].lock);
    }
    free(t);
}

/* Filters starting with a wildcard live in the wildcard shard, the rest by first-level hash. */
static shard_t *shard_for(rt_trie_t *t, const char *f, size_t len, int is_filter)
{
    const char *q = level_end(f, f + len);
    if (is_filter && q - f == 1 && (f[0] == '+' || f[0] == '#'))
        return &t->shards[WILD_SHARD];
    return &t->shards[rt_hash(f, (size_t)(q - f)) & (RT_TRIE_SHARDS - 1)];
}

/* One more subscription; new_filter when it is its filter's (or group's) first. */
static void count_sub(rt_trie_t *t, bool new_filter)
{
    size_t subs = atomic_fetch_add_explicit(&t->subs, 1, memory_order_relaxed) + 1;
    rt_atomic_raise(&t->subs_max, subs);
    if (new_filter) {
        size_t f = atomic_fetch_add_explicit(&t->filters, 1, memory_order_relaxed) + 1;
        rt_atomic_raise(&t->filters_max, f);
    }
}

static group_t *group_find(tnode_t *x, const char *g, size_t glen)
{
    for (group_t *gr = x->groups; gr; gr = gr->next)
        if (gr->namelen == glen && memcmp(gr->name, g, glen) == 0)
            return gr;
    return NULL;
}

int rt_trie_subscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid,
                      const rt_trie_opts_t *o, int *existed)
{
    const char *g, *pf;
    size_t glen, plen;
    if (existed)
        *existed = 0;
    if (!split_filter(filter, len, &g, &glen, &pf, &plen) || pid == 0 || !o || o->qos > 2 ||
        o->retain_handling > 2 || o->sub_id > RT_TRIE_MAX_SUB_ID || (g && o->no_local))
        return RT_EINVAL;
    shard_t *s = shard_for(t, pf, plen, 1);
    int rc = 0;
    write_lock(s);
    tnode_t *x = tt_path(&s->t, pf, plen, 1);
    if (!x) {
        rc = RT_ENOMEM;
        goto out;
    }
    if (!g) {
        sub_t *e = subs_find(x->subs, x->nsubs, pid);
        if (e) {
            e->o = *o;
            if (existed)
                *existed = 1;
            goto out;
        }
        rc = subs_add(&t->bytes, &x->subs, &x->nsubs, &x->capsubs, pid, o);
        if (rc == 0)
            count_sub(t, x->nsubs == 1);
        else
            tt_prune(&s->t, x);
        goto out;
    }
    group_t *gr = group_find(x, g, glen);
    if (!gr) {
        gr = cmalloc(&t->bytes, sizeof(*gr) + glen);
        if (!gr) {
            tt_prune(&s->t, x);
            rc = RT_ENOMEM;
            goto out;
        }
        memset(gr, 0, sizeof(*gr));
        memcpy(gr->name, g, glen);
        gr->namelen = (uint32_t)glen;
        gr->next = x->groups;
        x->groups = gr;
        atomic_fetch_add_explicit(&t->groups, 1, memory_order_relaxed);
    }
    sub_t *e = subs_find(gr->members, gr->n, pid);
    if (e) {
        e->o = *o;
        if (existed)
            *existed = 1;
        goto out;
    }
    rc = subs_add(&t->bytes, &gr->members, &gr->n, &gr->cap, pid, o);
    if (rc == 0) {
        count_sub(t, gr->n == 1);
    } else if (gr->n == 0) {
        x->groups = gr->next; /* it was just created at the head */
        cfree(&t->bytes, gr, sizeof(*gr) + glen);
        atomic_fetch_sub_explicit(&t->groups, 1, memory_order_relaxed);
        tt_prune(&s->t, x);
    }
out:
    write_unlock(s);
    return rc;
}

int rt_trie_unsubscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid, int *existed)
{
    const char *g, *pf;
    size_t glen, plen;
    if (existed)
        *existed = 0;
    if (!split_filter(filter, len, &g, &glen, &pf, &plen))
        return RT_EINVAL;
    shard_t *s = shard_for(t, pf, plen, 1);
    write_lock(s);
    tnode_t *x = tt_path(&s->t, pf, plen, 0);
    if (!x)
        goto out;
    if (!g) {
        sub_t *e = subs_find(x->subs, x->nsubs, pid);
        if (!e)
            goto out;
        subs_del(&t->bytes, &x->subs, &x->nsubs, &x->capsubs, e);
        if (x->nsubs == 0)
            atomic_fetch_sub_explicit(&t->filters, 1, memory_order_relaxed);
    } else {
        group_t *gr = group_find(x, g, glen);
        sub_t *e = gr ? subs_find(gr->members, gr->n, pid) : NULL;
        if (!e)
            goto out;
        subs_del(&t->bytes, &gr->members, &gr->n, &gr->cap, e);
        if (gr->n == 0) {
            group_t **pp = &x->groups;
            while (*pp != gr)
                pp = &(*pp)->next;
            *pp = gr->next;
            cfree(&t->bytes, gr, sizeof(*gr) + gr->namelen);
            atomic_fetch_sub_explicit(&t->groups, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&t->filters, 1, memory_order_relaxed);
        }
    }
    atomic_fetch_sub_explicit(&t->subs, 1, memory_order_relaxed);
    if (existed)
        *existed = 1;
    tt_prune(&s->t, x);
out:
    write_unlock(s);
    return 0;
}

int rt_trie_share_pick(rt_trie_t *t, const char *share_filter, size_t len, rt_pid_t exclude,
                       rt_trie_alive_fn alive, void *arg, rt_pid_t *pid, rt_trie_opts_t *opts)
{
    const char *g, *pf;
    size_t glen, plen;
    if (!split_filter(share_filter, len, &g, &glen, &pf, &plen) || !g)
        return RT_EINVAL;
    shard_t *s = shard_for(t, pf, plen, 1);
    pthread_rwlock_t *l = read_lock(s);
    int rc = RT_ENOTFOUND;
    tnode_t *x = tt_path(&s->t, pf, plen, 0);
    group_t *gr = x ? group_find(x, g, glen) : NULL;
    if (gr && gr->n) {
        uint32_t n = gr->n, start = atomic_fetch_add_explicit(&gr->rr, 1, memory_order_relaxed);
        for (uint32_t i = 0; i < n && rc; i++) {
            const sub_t *m = &gr->members[(start + i) % n];
            if (m->pid == exclude || (alive && !alive(arg, m->pid)))
                continue;
            *pid = m->pid;
            *opts = m->o;
            rc = 0;
        }
    }
    pthread_rwlock_unlock(l);
    return rc;
}

int rt_topic_matches(const char *filter, size_t flen, const char *topic, size_t tlen)
{
    const char *g, *f;
    size_t glen, fl;
    if (!split_filter(filter, flen, &g, &glen, &f, &fl) || !rt_trie_valid_topic(topic, tlen))
        return 0;
    if (topic[0] == '$' && (f[0] == '+' || f[0] == '#'))
        return 0;
    const char *fe = f + fl, *te = topic + tlen, *tp = topic;
    for (;;) {
        const char *fq = level_end(f, fe);
        if (fq - f == 1 && *f == '#')
            return 1;
        const char *tq = level_end(tp, te);
        if (!(fq - f == 1 && *f == '+') && (fq - f != tq - tp || memcmp(f, tp, (size_t)(fq - f))))
            return 0;
        if (fq == fe || tq == te) {
            /* "a/#" also matches "a" (§4.7.1.2). */
            if (fq == fe && tq == te)
                return 1;
            return tq == te && fe - fq == 2 && fq[1] == '#';
        }
        f = fq + 1;
        tp = tq + 1;
    }
}

void rt_trie_stats(rt_trie_t *t, rt_trie_stats_t *st)
{
    st->subs = atomic_load_explicit(&t->subs, memory_order_relaxed);
    st->groups = atomic_load_explicit(&t->groups, memory_order_relaxed);
    st->filters = atomic_load_explicit(&t->filters, memory_order_relaxed);
    st->subs_max = atomic_load_explicit(&t->subs_max, memory_order_relaxed);
    st->filters_max = atomic_load_explicit(&t->filters_max, memory_order_relaxed);
    st->nodes = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    st->bytes = atomic_load_explicit(&t->bytes, memory_order_relaxed);
}

/* ------------------------------------------------------------------------------------------ */
/* Matching. */

void rt_trie_scratch_init(rt_trie_scratch_t *s)
{
    memset(s, 0, sizeof(*s));
}

void rt_trie_scratch_destroy(rt_trie_scratch_t *s)
{
    free(s->hits);
    free(s->shared);
    free(s->ids);
    free(s->stack);
    memset(s, 0, sizeof(*s));
}

/* Makes room for need elements in a scratch array (not counted: it belongs to the caller). */
static int grow(void **a, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *na = realloc(*a, nc * elem);
    if (!na)
        return RT_ENOMEM;
    *a = na;
    *cap = nc;
    return 0;
}

/* Collects one matching node's subscriptions and group picks; counts nodes that had hits. */
static int collect(rt_trie_scratch_t *s, tnode_t *x, rt_pid_t publisher, rt_trie_alive_fn alive,
                   void *arg, int *nodes_hit)
{
    if (x->nsubs) {
        if (grow((void **)&s->hits, &s->caphits, s->nhits + x->nsubs, sizeof(hit_t)) != 0)
            return RT_ENOMEM;
        size_t before = s->nhits;
        for (uint32_t i = 0; i < x->nsubs; i++) {
            if (x->subs[i].o.no_local && x->subs[i].pid == publisher)
                continue;
            s->hits[s->nhits++] = x->subs[i];
        }
        if (s->nhits > before)
            (*nodes_hit)++;
    }
    for (group_t *g = x->groups; g; g = g->next) {
        uint32_t n = g->n, start = atomic_fetch_add_explicit(&g->rr, 1, memory_order_relaxed);
        for (uint32_t i = 0; i < n; i++) {
            sub_t *m = &g->members[(start + i) % n];
            if (alive && !alive(arg, m->pid))
                continue;
            if (grow((void **)&s->shared, &s->capshared, s->nshared + 1, sizeof(hit_t)) != 0)
                return RT_ENOMEM;
            s->shared[s->nshared++] = *m;
            break;
        }
    }
    return 0;
}

/* Walks one shard's trie for topic, with an explicit stack (topics may have 32k levels). */
static int walk(rt_trie_scratch_t *s, const ttable_t *t, const char *topic, size_t len,
                rt_pid_t publisher, rt_trie_alive_fn alive, void *arg, int *nodes_hit)
{
    const char *end = topic + len;
    size_t sp = 0;
    if (grow((void **)&s->stack, &s->capstack, 1, sizeof(frame_t)) != 0)
        return RT_ENOMEM;
    s->stack[sp++] = (frame_t){t->root, topic, 0};
    while (sp) {
        frame_t f = s->stack[--sp];
        if (f.done) {
            /* All levels consumed: this node's filter matches, and so does "<it>/#". */
            if (collect(s, f.node, publisher, alive, arg, nodes_hit) != 0)
                return RT_ENOMEM;
            if (f.node->hash && collect(s, f.node->hash, publisher, alive, arg, nodes_hit) != 0)
                return RT_ENOMEM;
            continue;
        }
        if (!f.node->kids)
            continue;
        const char *q = level_end(f.p, end);
        int done = q == end;
        const char *np = done ? end : q + 1;
        if (f.node->hash && collect(s, f.node->hash, publisher, alive, arg, nodes_hit) != 0)
            return RT_ENOMEM;
        if (grow((void **)&s->stack, &s->capstack, sp + 2, sizeof(frame_t)) != 0)
            return RT_ENOMEM;
        if (f.node->plus)
            s->stack[sp++] = (frame_t){f.node->plus, np, done};
        tnode_t *c = tt_find(t, f.node, f.p, (size_t)(q - f.p));
        if (c)
            s->stack[sp++] = (frame_t){c, np, done};
    }
    return 0;
}

static int cmp_hit(const void *a, const void *b)
{
    const hit_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->o.sub_id < y->o.sub_id ? -1 : x->o.sub_id > y->o.sub_id;
}

int rt_trie_match(rt_trie_t *t, const char *topic, size_t len, rt_pid_t publisher,
                  rt_trie_alive_fn alive, rt_trie_deliver_fn deliver, void *arg,
                  rt_trie_scratch_t *s, size_t *ndelivered)
{
    size_t count = 0;
    if (ndelivered)
        *ndelivered = 0;
    if (!rt_trie_valid_topic(topic, len))
        return RT_EINVAL;
    s->nhits = 0;
    s->nshared = 0;
    int nodes_hit = 0, rc;

    shard_t *sh = shard_for(t, topic, len, 0);
    pthread_rwlock_t *l = read_lock(sh);
    rc = walk(s, &sh->t, topic, len, publisher, alive, arg, &nodes_hit);
    pthread_rwlock_unlock(l);
    if (rc != 0)
        return rc;
    /* §4.7.2: filters starting with a wildcard never match topics starting with '$'. */
    if (topic[0] != '$') {
        sh = &t->shards[WILD_SHARD];
        l = read_lock(sh);
        rc = walk(s, &sh->t, topic, len, publisher, alive, arg, &nodes_hit);
        pthread_rwlock_unlock(l);
        if (rc != 0)
            return rc;
    }

    /*
    ** A pid appears at most once per node, so hits from a single node need no
    ** aggregation (the common fan-out case skips the sort). Otherwise sort by
    ** pid and fold each run into one delivery.
    */
    if (nodes_hit > 1)
        qsort(s->hits, s->nhits, sizeof(hit_t), cmp_hit);
    if (grow((void **)&s->ids, &s->capids, s->nhits + 1, sizeof(uint32_t)) != 0)
        return RT_ENOMEM;
    for (size_t i = 0; i < s->nhits;) {
        rt_trie_delivery_t d = {.pid = s->hits[i].pid};
        size_t nid = 0;
        for (; i < s->nhits && s->hits[i].pid == d.pid; i++) {
            const rt_trie_opts_t *o = &s->hits[i].o;
            if (o->qos > d.qos)
                d.qos = o->qos;
            d.retain_as_published |= o->retain_as_published;
            d.persistent |= o->persistent;
            d.acl_check |= o->acl_check;
            /* Sorted by id within a pid, so duplicates are adjacent. */
            if (o->sub_id && (nid == 0 || s->ids[nid - 1] != o->sub_id))
                s->ids[nid++] = o->sub_id;
        }
        d.sub_ids = s->ids;
        d.n_sub_ids = nid;
        deliver(arg, &d);
        count++;
    }
    for (size_t i = 0; i < s->nshared; i++) {
        const hit_t *h = &s->shared[i];
        rt_trie_delivery_t d = {.pid = h->pid,
                                .qos = h->o.qos,
                                .retain_as_published = h->o.retain_as_published,
                                .shared = 1,
                                .persistent = h->o.persistent,
                                .acl_check = h->o.acl_check,
                                .n_sub_ids = h->o.sub_id ? 1 : 0,
                                .sub_ids = &h->o.sub_id};
        deliver(arg, &d);
        count++;
    }
    if (ndelivered)
        *ndelivered = count;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Retained store. */

struct rt_retained_s {
    pthread_rwlock_t lock;
    ttable_t t;
    rt_retained_release_fn release;
    size_t max_count, max_bytes; /* limits, 0 = none; guarded by lock */
    size_t count, msg_bytes;     /* guarded by lock */
    size_t count_max, msg_bytes_max; /* their high-water marks; guarded by lock */
    atomic_size_t bytes;         /* allocation counter (atomic only to share ttable code) */
    atomic_size_t nodes;
};

int rt_retained_new(rt_retained_t **out, rt_retained_release_fn release, size_t max_count,
                    size_t max_bytes)
{
    rt_retained_t *r = calloc(1, sizeof(*r));
    if (!r)
        return RT_ENOMEM;
    atomic_init(&r->bytes, sizeof(*r));
    if (tt_init(&r->t, &r->bytes, &r->nodes) != 0) {
        free(r);
        return RT_ENOMEM;
    }
    pthread_rwlock_init(&r->lock, NULL);
    r->release = release;
    r->max_count = max_count;
    r->max_bytes = max_bytes;
    *out = r;
    return 0;
}

void rt_retained_free(rt_retained_t *r)
{
    if (!r)
        return;
    /* Release messages first: node_free_all does not know about them. */
    tnode_t *x = r->t.root;
    while (x) { /* pre-order over the sibling lists without a stack */
        if (x->msg && r->release)
            r->release(x->msg);
        x->msg = NULL;
        if (x->kids) {
            x = x->kids;
            continue;
        }
        while (x && !x->next)
            x = x->parent;
        if (x)
            x = x->next;
    }
    node_free_all(&r->t, r->t.root);
    free(r->t.buckets);
    pthread_rwlock_destroy(&r->lock);
    free(r);
}

int rt_retained_set(rt_retained_t *r, const char *topic, size_t len, void *msg, size_t msg_bytes)
{
    if (!rt_trie_valid_topic(topic, len))
        return RT_EINVAL;
    int rc = 0;
    void *old = NULL;
    pthread_rwlock_wrlock(&r->lock);
    tnode_t *x = tt_path(&r->t, topic, len, msg != NULL);
    if (!x) {
        rc = msg ? RT_ENOMEM : 0; /* clearing a topic with nothing retained is a no-op */
        goto out;
    }
    size_t count = r->count + (msg && !x->msg) - (!msg && x->msg);
    size_t bytes = r->msg_bytes - (x->msg ? x->msg_bytes : 0) + (msg ? msg_bytes : 0);
    if (msg && ((r->max_count && count > r->max_count) || (r->max_bytes && bytes > r->max_bytes))) {
        tt_prune(&r->t, x); /* undo a node created just now */
        rc = RT_ELIMIT;
        goto out;
    }
    old = x->msg;
    x->msg = msg;
    x->msg_bytes = msg ? msg_bytes : 0;
    r->count = count;
    r->msg_bytes = bytes;
    if (count > r->count_max)
        r->count_max = count;
    if (bytes > r->msg_bytes_max)
        r->msg_bytes_max = bytes;
    if (!msg)
        tt_prune(&r->t, x);
out:
    pthread_rwlock_unlock(&r->lock);
    /* Released outside the lock: a release callback may be arbitrarily slow. */
    if (old && r->release)
        r->release(old);
    return rc;
}

/* Builds x's full topic into *buf by following parents. */
static int topic_of(const tnode_t *x, char **buf, size_t *cap, size_t *len)
{
    size_t n = 0;
    for (const tnode_t *y = x; y->parent; y = y->parent)
        n += y->len + (y->parent->parent ? 1 : 0);
    if (grow((void **)buf, cap, n + 1, 1) != 0)
        return RT_ENOMEM;
    size_t pos = n;
    for (const tnode_t *y = x; y->parent; y = y->parent) {
        pos -= y->len;
        memcpy(*buf + pos, y->level, y->len);
        if (y->parent->parent)
            (*buf)[--pos] = '/';
    }
    *len = n;
    return 0;
}

typedef struct {
    char *buf;
    size_t cap;
    rt_retained_fn fn;
    void *arg;
    size_t found;
} emit_t;

static int emit(emit_t *e, const tnode_t *x)
{
    size_t len;
    if (!x->msg)
        return 0;
    if (topic_of(x, &e->buf, &e->cap, &len) != 0)
        return RT_ENOMEM;
    e->fn(e->arg, e->buf, len, x->msg);
    e->found++;
    return 0;
}

/* '#' at x: x itself and every descendant; at the root, not the '$' topics. */
static int emit_subtree(emit_t *e, const tnode_t *top)
{
    const tnode_t *x = top;
    while (x) {
        int skip =
            x->parent && !x->parent->parent && x->len && x->level[0] == '$' && top->parent == NULL;
        if (!skip && emit(e, x) != 0)
            return RT_ENOMEM;
        if (!skip && x->kids) {
            x = x->kids;
            continue;
        }
        while (x != top && !x->next)
            x = x->parent;
        x = x == top ? NULL : x->next;
    }
    return 0;
}

int rt_retained_match(rt_retained_t *r, const char *filter, size_t len, rt_retained_fn fn,
                      void *arg, size_t *nfound)
{
    const char *g, *pf;
    size_t glen, plen;
    if (nfound)
        *nfound = 0;
    if (!split_filter(filter, len, &g, &glen, &pf, &plen) || g)
        return RT_EINVAL;
    emit_t e = {.fn = fn, .arg = arg};
    frame_t *st = NULL;
    size_t cap = 0, sp = 0;
    const char *end = filter + len;
    int rc = 0;
    pthread_rwlock_rdlock(&r->lock);
    if (grow((void **)&st, &cap, 1, sizeof(*st)) != 0) {
        rc = RT_ENOMEM;
        goto out;
    }
    st[sp++] = (frame_t){r->t.root, filter, 0};
    while (sp && rc == 0) {
        frame_t f = st[--sp];
        if (f.done) {
            rc = emit(&e, f.node);
            continue;
        }
        const char *q = level_end(f.p, end);
        int done = q == end;
        const char *np = done ? end : q + 1;
        int at_root = f.node->parent == NULL;
        if (q - f.p == 1 && f.p[0] == '#') {
            rc = emit_subtree(&e, f.node);
        } else if (q - f.p == 1 && f.p[0] == '+') {
            for (tnode_t *c = f.node->kids; c && rc == 0; c = c->next) {
                if (at_root && c->len && c->level[0] == '$')
                    continue;
                if (grow((void **)&st, &cap, sp + 1, sizeof(*st)) != 0)
                    rc = RT_ENOMEM;
                else
                    st[sp++] = (frame_t){c, np, done};
            }
        } else {
            tnode_t *c = tt_find(&r->t, f.node, f.p, (size_t)(q - f.p));
            if (c && grow((void **)&st, &cap, sp + 1, sizeof(*st)) != 0)
                rc = RT_ENOMEM;
            else if (c)
                st[sp++] = (frame_t){c, np, done};
        }
    }
out:
    pthread_rwlock_unlock(&r->lock);
    free(st);
    free(e.buf);
    if (nfound)
        *nfound = e.found;
    return rc;
}

void rt_retained_stats(rt_retained_t *r, size_t *count, size_t *msg_bytes, size_t *mem_bytes)
{
    pthread_rwlock_rdlock(&r->lock);
    if (count)
        *count = r->count;
    if (msg_bytes)
        *msg_bytes = r->msg_bytes;
    if (mem_bytes)
        *mem_bytes = atomic_load_explicit(&r->bytes, memory_order_relaxed);
    pthread_rwlock_unlock(&r->lock);
}

void rt_retained_peaks(rt_retained_t *r, size_t *count_max, size_t *msg_bytes_max)
{
    pthread_rwlock_rdlock(&r->lock);
    *count_max = r->count_max;
    *msg_bytes_max = r->msg_bytes_max;
    pthread_rwlock_unlock(&r->lock);
}

void rt_retained_set_limits(rt_retained_t *r, size_t max_count, size_t max_bytes)
{
    pthread_rwlock_wrlock(&r->lock);
    r->max_count = max_count;
    r->max_bytes = max_bytes;
    pthread_rwlock_unlock(&r->lock);
}

/*
** The subscription trie: topic filters mapped to subscriber pids in RT_TRIE_SHARDS + 1 level
** trees (topic_tree.h) behind reader-sharded rwlocks; subscribe, unsubscribe, shared-group
** round robin, and the match every PUBLISH runs. topic_trie.h has the contracts and the
** locking design.
*/
#define _GNU_SOURCE
#include "topic_tree.h"

#include <pthread.h>
#include <stdlib.h>

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
    atomic_bool vacant; /* t has no nodes, as its last writer left it (match_shard_locked) */
} __attribute__((aligned(64))) shard_t;

static pthread_rwlock_t *read_lock(shard_t *s)
{
    /* The calling thread's read slot: threads take them in turn. */
    pthread_rwlock_t *l = &s->slots[rt_thread_ordinal() % RT_TRIE_READ_SLOTS].lock;
    rt__tt_lock_free();
    pthread_rwlock_rdlock(l);
    rt__tt_read_begin(&s->t);
    return l;
}

/* l is what read_lock(s) returned. */
static void read_unlock(shard_t *s, pthread_rwlock_t *l)
{
    rt__tt_read_end(&s->t);
    pthread_rwlock_unlock(l);
}

static void write_lock(shard_t *s)
{
    rt__tt_lock_free();
    for (int i = 0; i < RT_TRIE_READ_SLOTS; i++)
        pthread_rwlock_wrlock(&s->slots[i].lock);
    rt__tt_write_begin(&s->t);
}

/* Bumped by every change to any trie: a remembered match made before it is stale. */
static _Atomic uint64_t trie_gen = 1;

static void write_unlock(shard_t *s)
{
    atomic_store_explicit(&s->vacant, s->t.count == 0, memory_order_release);
    atomic_fetch_add_explicit(&trie_gen, 1, memory_order_release);
    rt__tt_write_end(&s->t);
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
    rt_trie_interest_fn interest; /* set once before the trie is shared */
    void *interest_arg;
};

#define WILD_SHARD RT_TRIE_SHARDS

void rt_trie_set_interest(rt_trie_t *t, rt_trie_interest_fn fn, void *arg)
{
    t->interest = fn;
    t->interest_arg = arg;
}

/* Under the filter's shard lock, so the calls for one filter come in the order of its changes. */
static void tell_interest(rt_trie_t *t, const char *filter, size_t len, bool on)
{
    if (t->interest)
        t->interest(t->interest_arg, filter, len, on);
}

/* ------------------------------------------------------------------------------------------ */
/* Subscriptions and nodes. */

/* One subscription, ordinary or group member: 16 bytes. */
typedef struct rt_trie_hit_s {
    rt_pid_t pid;
    rt_trie_opts_t o;
} trie_sub_t;

/* A shared subscription group ($share/name/filter) at its filter's node. */
typedef struct trie_group_s {
    struct trie_group_s *next; /* next group at the same node */
    atomic_uint rr;            /* round-robin cursor: advanced by readers, hence atomic */
    uint32_t n, cap;           /* members */
    trie_sub_t *members;
    uint32_t namelen;
    char name[];
} trie_group_t;

/* A node's subscriptions once it has more than one, or any group. */
typedef struct {
    trie_group_t *groups; /* shared groups at this filter */
    uint32_t cap;         /* of subs */
    trie_sub_t subs[];    /* node.n.aux of them */
} trie_ext_t;

/* trie_node_t.n.flags: the node's subscriptions and groups are in ext. */
#define TN_EXT 1u

/*
** A trie node: 48 bytes before its level. Most filters have one subscriber and no group
** ("test/%i"), so that one is kept in the node itself; ext exists exactly while the node
** has two or more ordinary subscriptions or any group.
*/
typedef struct {
    tnode_t n; /* n.aux: ordinary subscriptions at this filter */
    union {
        trie_sub_t one;  /* without TN_EXT, when n.aux is 1 */
        trie_ext_t *ext; /* with TN_EXT */
    };
} trie_node_t;

static bool trie_node_holds(const tnode_t *x)
{
    return x->aux || (x->flags & TN_EXT);
}

static const tt_kind_t trie_kind = {.node_size = sizeof(trie_node_t), .holds = trie_node_holds};

static inline trie_node_t *tnode(tnode_t *x)
{
    return (trie_node_t *)x;
}

static inline trie_sub_t *node_subs(trie_node_t *x)
{
    return (x->n.flags & TN_EXT) ? x->ext->subs : &x->one;
}

static inline trie_group_t *node_groups(const trie_node_t *x)
{
    return (x->n.flags & TN_EXT) ? x->ext->groups : NULL;
}

static size_t ext_bytes(uint32_t cap)
{
    return sizeof(trie_ext_t) + (size_t)cap * sizeof(trie_sub_t);
}

/* Resizes (or with no ext yet, makes) x's ext for cap subscriptions; RT_ENOMEM changes nothing. */
static int ext_resize(atomic_size_t *ctr, trie_node_t *x, uint32_t cap)
{
    if (x->n.flags & TN_EXT) {
        trie_ext_t *e = rt__topic_realloc(ctr, x->ext, ext_bytes(x->ext->cap), ext_bytes(cap), 1);
        if (!e)
            return RT_ENOMEM;
        e->cap = cap;
        x->ext = e;
        return 0;
    }
    RT_ASSERT(cap >= x->n.aux);
    trie_ext_t *e = rt__topic_alloc(ctr, ext_bytes(cap));
    if (!e)
        return RT_ENOMEM;
    e->groups = NULL;
    e->cap = cap;
    if (x->n.aux)
        e->subs[0] = x->one;
    x->ext = e;
    x->n.flags |= TN_EXT;
    return 0;
}

/* Back to the inline form once the ext holds no group and at most one subscription. */
static void ext_drop_if_unneeded(atomic_size_t *ctr, trie_node_t *x)
{
    if (!(x->n.flags & TN_EXT) || x->ext->groups || x->n.aux > 1)
        return;
    trie_ext_t *e = x->ext;
    if (x->n.aux)
        x->one = e->subs[0];
    else
        memset(&x->one, 0, sizeof(x->one));
    x->n.flags &= (uint8_t)~TN_EXT;
    rt__topic_free(ctr, e, ext_bytes(e->cap));
}

static trie_sub_t *subs_find(trie_sub_t *a, uint32_t n, rt_pid_t pid)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i].pid == pid)
            return &a[i];
    return NULL;
}

/* Adds an ordinary subscription to x (which has none for pid); RT_ENOMEM leaves x unchanged. */
static int node_sub_add(atomic_size_t *ctr, trie_node_t *x, rt_pid_t pid, const rt_trie_opts_t *o)
{
    uint32_t n = x->n.aux;
    if (n == 0 && !(x->n.flags & TN_EXT)) {
        x->one = (trie_sub_t){pid, *o};
        x->n.aux = 1;
        return 0;
    }
    uint32_t cap = (x->n.flags & TN_EXT) ? x->ext->cap : 1;
    if (n == cap) {
        if (n > UINT32_MAX / 2 || ext_resize(ctr, x, n < 2 ? 2 : n * 2) != 0)
            return RT_ENOMEM;
    }
    x->ext->subs[n] = (trie_sub_t){pid, *o};
    x->n.aux = n + 1;
    return 0;
}

/* Removes e (one of x's ordinary subscriptions): the last takes its place; shrinks at a
   quarter full. */
static void node_sub_del(atomic_size_t *ctr, trie_node_t *x, trie_sub_t *e)
{
    uint32_t n = --x->n.aux;
    if (!(x->n.flags & TN_EXT)) {
        RT_ASSERT(e == &x->one && n == 0);
        memset(&x->one, 0, sizeof(x->one));
        return;
    }
    *e = x->ext->subs[n];
    ext_drop_if_unneeded(ctr, x);
    if ((x->n.flags & TN_EXT) && n * 4 <= x->ext->cap && x->ext->cap > 2)
        ext_resize(ctr, x, x->ext->cap / 2); /* a failed shrink just keeps the bigger array */
}

/* Appends to a group's doubling member array; RT_ENOMEM leaves it unchanged. */
static int members_add(atomic_size_t *ctr, trie_group_t *g, rt_pid_t pid, const rt_trie_opts_t *o)
{
    if (g->n == g->cap) {
        uint32_t nc = g->cap ? g->cap * 2 : 2;
        trie_sub_t *na = rt__topic_realloc(ctr, g->members, g->cap, nc, sizeof(trie_sub_t));
        if (!na)
            return RT_ENOMEM;
        g->members = na;
        g->cap = nc;
    }
    g->members[g->n++] = (trie_sub_t){pid, *o};
    return 0;
}

/* Removes a member by moving the last into its place; shrinks at a quarter full. */
static void members_del(atomic_size_t *ctr, trie_group_t *g, trie_sub_t *e)
{
    *e = g->members[--g->n];
    if (g->n == 0) {
        rt__topic_free(ctr, g->members, g->cap * sizeof(trie_sub_t));
        g->members = NULL;
        g->cap = 0;
    } else if (g->n * 4 <= g->cap && g->cap > 2) {
        trie_sub_t *na = rt__topic_realloc(ctr, g->members, g->cap, g->cap / 2, sizeof(trie_sub_t));
        if (na) { /* a failed shrink just keeps the bigger array */
            g->members = na;
            g->cap /= 2;
        }
    }
}

/* rt__tt_destroy's release: what a node holds besides itself. */
static void node_release(tnode_t *n, void *arg)
{
    (void)arg;
    trie_node_t *x = tnode(n);
    if (!(x->n.flags & TN_EXT))
        return;
    for (trie_group_t *g = x->ext->groups, *ng; g; g = ng) {
        ng = g->next;
        free(g->members);
        free(g);
    }
    free(x->ext);
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
        atomic_init(&t->shards[i].vacant, true);
        if (rt__tt_init(&t->shards[i].t, &trie_kind, &t->bytes, &t->nodes) != 0) {
            for (int j = 0; j <= i; j++)
                for (int k = 0; k < RT_TRIE_READ_SLOTS; k++)
                    pthread_rwlock_destroy(&t->shards[j].slots[k].lock);
            for (int j = 0; j < i; j++)
                rt__tt_destroy(&t->shards[j].t, node_release, NULL);
            free(t);
            pthread_rwlockattr_destroy(&a);
            return RT_ENOMEM;
        }
    }
    pthread_rwlockattr_destroy(&a);
    *out = t;
    return 0;
}

void rt_trie_free(rt_trie_t *t)
{
    if (!t)
        return;
    for (int i = 0; i <= RT_TRIE_SHARDS; i++) {
        rt__tt_destroy(&t->shards[i].t, node_release, NULL);
        for (int k = 0; k < RT_TRIE_READ_SLOTS; k++)
            pthread_rwlock_destroy(&t->shards[i].slots[k].lock);
    }
    free(t);
    /* A trie made at the same address later must not find this one's matches. */
    atomic_fetch_add_explicit(&trie_gen, 1, memory_order_release);
}

/* Filters starting with a wildcard live in the wildcard shard, the rest by first-level hash. */
static shard_t *shard_for(rt_trie_t *t, const char *f, size_t len, int is_filter)
{
    const char *q = rt_topic_level_end(f, f + len);
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

static trie_group_t *group_find(const trie_node_t *x, const char *g, size_t glen)
{
    for (trie_group_t *gr = node_groups(x); gr; gr = gr->next)
        if (gr->namelen == glen && memcmp(gr->name, g, glen) == 0)
            return gr;
    return NULL;
}

int rt_trie_subscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid,
                      const rt_trie_opts_t *o, int *existed)
{
    rt_topic_filter_t sf;
    if (existed)
        *existed = 0;
    if (rt_topic_parse_filter(filter, len, &sf) || pid == 0 || !o || o->qos > 2 ||
        o->retain_handling > 2 || o->sub_id > RT_TRIE_MAX_SUB_ID || (sf.group && o->no_local))
        return RT_EINVAL;
    shard_t *s = shard_for(t, sf.filter, sf.filter_len, 1);
    int rc = 0;
    write_lock(s);
    tnode_t *n = rt__tt_path(&s->t, sf.filter, sf.filter_len, 1);
    if (!n) {
        rc = RT_ENOMEM;
        goto out;
    }
    trie_node_t *x = tnode(n);
    if (!sf.group) {
        trie_sub_t *e = subs_find(node_subs(x), x->n.aux, pid);
        if (e) {
            e->o = *o;
            if (existed)
                *existed = 1;
            goto out;
        }
        rc = node_sub_add(&t->bytes, x, pid, o);
        if (rc == 0) {
            count_sub(t, x->n.aux == 1);
            if (x->n.aux == 1)
                tell_interest(t, filter, len, true);
        } else
            rt__tt_prune(&s->t, n);
        goto out;
    }
    trie_group_t *gr = group_find(x, sf.group, sf.group_len);
    if (!gr) {
        /* The group goes at the head of the ext's list, which a node without one gets now. */
        if (!(x->n.flags & TN_EXT) && ext_resize(&t->bytes, x, x->n.aux) != 0) {
            rt__tt_prune(&s->t, n);
            rc = RT_ENOMEM;
            goto out;
        }
        gr = rt__topic_alloc(&t->bytes, sizeof(*gr) + sf.group_len);
        if (!gr) {
            ext_drop_if_unneeded(&t->bytes, x);
            rt__tt_prune(&s->t, n);
            rc = RT_ENOMEM;
            goto out;
        }
        memset(gr, 0, sizeof(*gr));
        memcpy(gr->name, sf.group, sf.group_len);
        gr->namelen = (uint32_t)sf.group_len;
        gr->next = x->ext->groups;
        x->ext->groups = gr;
        atomic_fetch_add_explicit(&t->groups, 1, memory_order_relaxed);
    }
    trie_sub_t *e = subs_find(gr->members, gr->n, pid);
    if (e) {
        e->o = *o;
        if (existed)
            *existed = 1;
        goto out;
    }
    rc = members_add(&t->bytes, gr, pid, o);
    if (rc == 0) {
        count_sub(t, gr->n == 1);
        if (gr->n == 1)
            tell_interest(t, filter, len, true);
    } else if (gr->n == 0) {
        x->ext->groups = gr->next; /* it was just created at the head */
        rt__topic_free(&t->bytes, gr, sizeof(*gr) + sf.group_len);
        atomic_fetch_sub_explicit(&t->groups, 1, memory_order_relaxed);
        ext_drop_if_unneeded(&t->bytes, x);
        rt__tt_prune(&s->t, n);
    }
out:
    write_unlock(s);
    return rc;
}

int rt_trie_unsubscribe(rt_trie_t *t, const char *filter, size_t len, rt_pid_t pid, int *existed)
{
    rt_topic_filter_t sf;
    if (existed)
        *existed = 0;
    if (rt_topic_parse_filter(filter, len, &sf))
        return RT_EINVAL;
    shard_t *s = shard_for(t, sf.filter, sf.filter_len, 1);
    write_lock(s);
    tnode_t *n = rt__tt_path(&s->t, sf.filter, sf.filter_len, 0);
    if (!n)
        goto out;
    trie_node_t *x = tnode(n);
    if (!sf.group) {
        trie_sub_t *e = subs_find(node_subs(x), x->n.aux, pid);
        if (!e)
            goto out;
        node_sub_del(&t->bytes, x, e);
        if (x->n.aux == 0) {
            atomic_fetch_sub_explicit(&t->filters, 1, memory_order_relaxed);
            tell_interest(t, filter, len, false);
        }
    } else {
        trie_group_t *gr = group_find(x, sf.group, sf.group_len);
        trie_sub_t *e = gr ? subs_find(gr->members, gr->n, pid) : NULL;
        if (!e)
            goto out;
        members_del(&t->bytes, gr, e);
        if (gr->n == 0) {
            trie_group_t **pp = &x->ext->groups;
            while (*pp != gr)
                pp = &(*pp)->next;
            *pp = gr->next;
            rt__topic_free(&t->bytes, gr, sizeof(*gr) + gr->namelen);
            atomic_fetch_sub_explicit(&t->groups, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&t->filters, 1, memory_order_relaxed);
            ext_drop_if_unneeded(&t->bytes, x);
            tell_interest(t, filter, len, false);
        }
    }
    atomic_fetch_sub_explicit(&t->subs, 1, memory_order_relaxed);
    if (existed)
        *existed = 1;
    rt__tt_prune(&s->t, n);
out:
    write_unlock(s);
    return 0;
}

int rt_trie_share_pick(rt_trie_t *t, const char *share_filter, size_t len, rt_pid_t exclude,
                       rt_trie_alive_fn alive, void *arg, rt_pid_t *pid, rt_trie_opts_t *opts)
{
    rt_topic_filter_t sf;
    if (rt_topic_parse_filter(share_filter, len, &sf) || !sf.group)
        return RT_EINVAL;
    shard_t *s = shard_for(t, sf.filter, sf.filter_len, 1);
    pthread_rwlock_t *l = read_lock(s);
    int rc = RT_ENOTFOUND;
    tnode_t *x = rt__tt_path(&s->t, sf.filter, sf.filter_len, 0);
    trie_group_t *gr = x ? group_find(tnode(x), sf.group, sf.group_len) : NULL;
    if (gr && gr->n) {
        uint32_t n = gr->n, start = atomic_fetch_add_explicit(&gr->rr, 1, memory_order_relaxed);
        for (uint32_t i = 0; i < n && rc; i++) {
            const trie_sub_t *m = &gr->members[(start + i) % n];
            if (m->pid == exclude || (alive && !alive(arg, m->pid)))
                continue;
            *pid = m->pid;
            *opts = m->o;
            rc = 0;
        }
    }
    read_unlock(s, l);
    return rc;
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

/*
** Matches remembered per thread. A publisher sends to the same topic again and again, and
** each match walked the same levels to the same subscribers under the same shard lock (a
** tenth of fan-in's broker CPU at 16 bytes). A match is remembered when its result depends on
** the topic alone: no shared group (a pick per message) and no no_local subscription (it
** depends on the publisher); at most RT_TRIE_MEMO_HITS subscriptions, so a fan-out to
** thousands is walked each time (its deliveries cost more than the walk). Any change to any
** trie makes every remembered match stale (trie_gen). 16 KB per publishing thread.
*/
#define RT_TRIE_MEMO_SLOTS 64 /* direct-mapped by the topic's hash */
#define RT_TRIE_MEMO_HITS 8
#define RT_TRIE_MEMO_TOPIC 96

typedef struct {
    uint64_t gen; /* trie_gen before the match was made; 0: empty */
    const rt_trie_t *trie;
    uint16_t len;
    uint8_t nhits;
    uint8_t nodes_hit;
    char topic[RT_TRIE_MEMO_TOPIC];
    trie_sub_t hits[RT_TRIE_MEMO_HITS];
} memo_t;

struct rt_trie_memo_s {
    memo_t slot[RT_TRIE_MEMO_SLOTS];
};

static memo_t *memo_slot(rt_trie_scratch_t *s, const char *topic, size_t len)
{
    if (!s->memo || len > RT_TRIE_MEMO_TOPIC)
        return NULL;
    return &s->memo->slot[rt_hash(topic, len) & (RT_TRIE_MEMO_SLOTS - 1)];
}

static const memo_t *memo_find(rt_trie_scratch_t *s, const rt_trie_t *t, const char *topic,
                               size_t len, uint64_t gen)
{
    const memo_t *m = memo_slot(s, topic, len);
    if (!m || m->gen != gen || m->trie != t || m->len != len || memcmp(m->topic, topic, len))
        return NULL;
    return m;
}

static void memo_put(rt_trie_scratch_t *s, const rt_trie_t *t, const char *topic, size_t len,
                     uint64_t gen, int nodes_hit)
{
    if (!s->memo_ok || s->nhits > RT_TRIE_MEMO_HITS || len > RT_TRIE_MEMO_TOPIC)
        return;
    if (!s->memo && !(s->memo = calloc(1, sizeof(*s->memo))))
        return; /* nothing remembered: the next match walks */
    memo_t *m = memo_slot(s, topic, len);
    m->gen = gen;
    m->trie = t;
    m->len = (uint16_t)len;
    m->nhits = (uint8_t)s->nhits;
    m->nodes_hit = (uint8_t)(nodes_hit > 2 ? 2 : nodes_hit); /* only "more than one" matters */
    memcpy(m->topic, topic, len);
    if (s->nhits)
        memcpy(m->hits, s->hits, s->nhits * sizeof(trie_sub_t));
}

void rt_trie_scratch_init(rt_trie_scratch_t *s)
{
    memset(s, 0, sizeof(*s));
}

void rt_trie_scratch_destroy(rt_trie_scratch_t *s)
{
    free(s->memo);
    free(s->hits);
    free(s->shared);
    free(s->ids);
    free(s->stack);
    memset(s, 0, sizeof(*s));
}

/* Collects one matching node's subscriptions and group picks; counts nodes that had hits. */
static int collect_node(rt_trie_scratch_t *s, tnode_t *n, rt_pid_t publisher,
                        rt_trie_alive_fn alive, void *arg, int *nodes_hit)
{
    trie_node_t *x = tnode(n);
    uint32_t nsubs = x->n.aux;
    if (nsubs) {
        if (rt_grow(&s->hits, &s->caphits, s->nhits + nsubs, sizeof(trie_sub_t), 16) != 0)
            return RT_ENOMEM;
        const trie_sub_t *subs = node_subs(x);
        size_t before = s->nhits;
        for (uint32_t i = 0; i < nsubs; i++) {
            if (subs[i].o.no_local) {
                s->memo_ok = false; /* another publisher's match differs */
                if (subs[i].pid == publisher)
                    continue;
            }
            s->hits[s->nhits++] = subs[i];
        }
        if (s->nhits > before)
            (*nodes_hit)++;
    }
    for (trie_group_t *g = node_groups(x); g; g = g->next) {
        s->memo_ok = false; /* a member is picked per message */
        uint32_t gn = g->n, start = atomic_fetch_add_explicit(&g->rr, 1, memory_order_relaxed);
        for (uint32_t i = 0; i < gn; i++) {
            trie_sub_t *m = &g->members[(start + i) % gn];
            if (alive && !alive(arg, m->pid))
                continue;
            if (rt_grow(&s->shared, &s->capshared, s->nshared + 1, sizeof(trie_sub_t), 16) != 0)
                return RT_ENOMEM;
            s->shared[s->nshared++] = *m;
            break;
        }
    }
    return 0;
}

/* Walks one shard's tree for topic, with an explicit stack (topics may have 32k levels). */
static int match_shard(rt_trie_scratch_t *s, const ttable_t *t, const char *topic, size_t len,
                       rt_pid_t publisher, rt_trie_alive_fn alive, void *arg, int *nodes_hit)
{
    const char *end = topic + len;
    size_t sp = 0;
    if (rt_grow(&s->stack, &s->capstack, 1, sizeof(tt_frame_t), 16) != 0)
        return RT_ENOMEM;
    s->stack[sp++] = (tt_frame_t){t->root, topic, 0};
    while (sp) {
        tt_frame_t f = s->stack[--sp];
        tnode_t *hash = rt__tt_wild(t, f.node, TT_HASH);
        if (f.done) {
            /* All levels consumed: this node's filter matches, and so does "<it>/#". */
            if (collect_node(s, f.node, publisher, alive, arg, nodes_hit) != 0)
                return RT_ENOMEM;
            if (hash && collect_node(s, hash, publisher, alive, arg, nodes_hit) != 0)
                return RT_ENOMEM;
            continue;
        }
        if (!f.node->nkids)
            continue;
        const char *q = rt_topic_level_end(f.p, end);
        int done = q == end;
        const char *np = done ? end : q + 1;
        if (hash && collect_node(s, hash, publisher, alive, arg, nodes_hit) != 0)
            return RT_ENOMEM;
        if (rt_grow(&s->stack, &s->capstack, sp + 2, sizeof(tt_frame_t), 16) != 0)
            return RT_ENOMEM;
        tnode_t *plus = rt__tt_wild(t, f.node, TT_PLUS);
        if (plus)
            s->stack[sp++] = (tt_frame_t){plus, np, done};
        tnode_t *c = rt__tt_find(t, f.node, f.p, (size_t)(q - f.p));
        if (c)
            s->stack[sp++] = (tt_frame_t){c, np, done};
    }
    return 0;
}

/*
** match_shard under sh's read lock; a vacant shard is skipped without it (the wildcard shard,
** which every match visits, is empty on most brokers). A subscription whose write ended before
** this match began has cleared vacant.
*/
static int match_shard_locked(rt_trie_scratch_t *s, shard_t *sh, const char *topic, size_t len,
                              rt_pid_t publisher, rt_trie_alive_fn alive, void *arg, int *nodes_hit)
{
    if (atomic_load_explicit(&sh->vacant, memory_order_acquire))
        return 0;
    pthread_rwlock_t *l = read_lock(sh);
    int rc = match_shard(s, &sh->t, topic, len, publisher, alive, arg, nodes_hit);
    read_unlock(sh, l);
    return rc;
}

static int cmp_hit(const void *a, const void *b)
{
    const trie_sub_t *x = a, *y = b;
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
    if (!rt_topic_valid_name(topic, len))
        return RT_EINVAL;
    s->nhits = 0;
    s->nshared = 0;
    int nodes_hit = 0, rc = 0;

    uint64_t gen = atomic_load_explicit(&trie_gen, memory_order_acquire);
    const memo_t *m = memo_find(s, t, topic, len, gen);
    if (m) {
        RT_ASSERT(m->nhits <= s->caphits); /* it held them when they were remembered */
        if (m->nhits)
            memcpy(s->hits, m->hits, m->nhits * sizeof(trie_sub_t));
        s->nhits = m->nhits;
        nodes_hit = m->nodes_hit;
    } else {
        s->memo_ok = true;
        rc = match_shard_locked(s, shard_for(t, topic, len, 0), topic, len, publisher, alive, arg,
                                &nodes_hit);
        /* §4.7.2: filters starting with a wildcard never match topics starting with '$'. */
        if (rc == 0 && topic[0] != '$')
            rc = match_shard_locked(s, &t->shards[WILD_SHARD], topic, len, publisher, alive, arg,
                                    &nodes_hit);
        if (rc != 0)
            return rc;
        memo_put(s, t, topic, len, gen, nodes_hit);
    }

    /*
    ** A pid appears at most once per node, so hits from a single node need no
    ** aggregation (the common fan-out case skips the sort). Otherwise sort by
    ** pid and fold each run into one delivery.
    */
    if (nodes_hit > 1)
        qsort(s->hits, s->nhits, sizeof(trie_sub_t), cmp_hit);
    if (rt_grow(&s->ids, &s->capids, s->nhits + 1, sizeof(uint32_t), 16) != 0)
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
        const trie_sub_t *h = &s->shared[i];
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

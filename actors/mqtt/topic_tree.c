/*
** The level tree shared by the subscription trie and the retained store: the node table
** (topic_tree.h says how it is laid out and who may touch it).
*/
#include "topic_tree.h"

#include <stdlib.h>

/* Hash buckets a table starts with once it gets its first node. */
#define TT_MIN_BUCKETS 16
/*
** Nodes per bucket before the bucket array doubles: 2 keeps chains at 1 to 2 nodes and
** costs 4 to 8 bytes of buckets per node.
*/
#define TT_MAX_LOAD 2

_Static_assert(RT_TOPIC_MAX_LEN <= UINT16_MAX, "tnode_t.len is 16 bits");

#ifndef NDEBUG
_Thread_local int rt__tt_locks_held;
#endif

int rt_topic_locks_held(void)
{
#ifndef NDEBUG
    return rt__tt_locks_held;
#else
    return 0;
#endif
}

/* ---- Counted allocation ---- */

void *rt__topic_alloc(atomic_size_t *ctr, size_t n)
{
    void *p = malloc(n);
    if (p)
        atomic_fetch_add_explicit(ctr, n, memory_order_relaxed);
    return p;
}

void rt__topic_free(atomic_size_t *ctr, void *p, size_t n)
{
    if (!p)
        return;
    atomic_fetch_sub_explicit(ctr, n, memory_order_relaxed);
    free(p);
}

void *rt__topic_realloc(atomic_size_t *ctr, void *p, size_t oldn, size_t newn, size_t elem)
{
    void *q = realloc(p, newn * elem);
    if (!q)
        return NULL;
    atomic_fetch_add_explicit(ctr, newn * elem, memory_order_relaxed);
    atomic_fetch_sub_explicit(ctr, oldn * elem, memory_order_relaxed);
    return q;
}

/* ---- The node table ---- */

/*
** Levels are the publishers' and subscribers' choice: the keyed hash (with the parent as
** tweak) keeps their collisions unplannable. A '+' or '#' edge has only its parent to vary,
** and the allocator chooses that, not a client: a multiplicative mix of the pointer does,
** and costs a match a few instructions per wildcard child where SipHash costs ~60.
*/
static uint32_t wild_hash(const tnode_t *parent, char c)
{
    return (uint32_t)(((uint64_t)(uintptr_t)parent ^ (uint8_t)c) * 0x9e3779b97f4a7c15ull >> 32);
}

static uint32_t edge_hash(const tnode_t *parent, const char *lvl, size_t n)
{
    if (n == 1 && (lvl[0] == '+' || lvl[0] == '#'))
        return wild_hash(parent, lvl[0]);
    return (uint32_t)rt_hash_with((uint64_t)(uintptr_t)parent, lvl, n);
}

static size_t node_bytes(const ttable_t *t, const tnode_t *x)
{
    return t->node_size + x->len;
}

static tnode_t *node_alloc(ttable_t *t, tnode_t *parent, const char *lvl, size_t n)
{
    tnode_t *x = rt__topic_alloc(t->bytes, t->node_size + n);
    if (!x)
        return NULL;
    memset(x, 0, t->node_size);
    x->len = (uint16_t)n;
    x->parent = parent;
    memcpy(rt__tt_level(t, x), lvl, n);
    return x;
}

int rt__tt_init(ttable_t *t, const tt_kind_t *kind, atomic_size_t *bytes, atomic_size_t *nodes)
{
    RT_ASSERT(kind->node_size >= sizeof(tnode_t) + (kind->links ? sizeof(tt_links_t) : 0));
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->node_size = kind->node_size;
    t->bytes = bytes;
    t->nodes = nodes;
    t->root = node_alloc(t, NULL, "", 0);
    return t->root ? 0 : RT_ENOMEM;
}

tnode_t *rt__tt_find(const ttable_t *t, const tnode_t *parent, const char *lvl, size_t n)
{
    RT_ASSERT(RT__TT_READABLE(t));
    if (!t->buckets)
        return NULL;
    uint32_t h = edge_hash(parent, lvl, n);
    for (tnode_t *x = t->buckets[h & (t->nbuckets - 1)]; x; x = x->hnext)
        if (x->hval == h && x->parent == parent && x->len == n &&
            memcmp(rt__tt_level(t, x), lvl, n) == 0)
            return x;
    return NULL;
}

tnode_t *rt__tt_wild_find(const ttable_t *t, const tnode_t *parent, unsigned bit)
{
    RT_ASSERT(RT__TT_READABLE(t) && (parent->wild & bit));
    char c = bit == TT_PLUS ? '+' : '#';
    for (tnode_t *x = t->buckets[wild_hash(parent, c) & (t->nbuckets - 1)]; x; x = x->hnext)
        if (x->parent == parent && x->len == 1 && rt__tt_level(t, x)[0] == c)
            return x;
    RT_ASSERT(!"a wild bit without its child");
    return NULL;
}

/* Resizes the bucket array to nb (a power of two, or 0 to free it). */
static int rehash(ttable_t *t, size_t nb)
{
    RT_ASSERT((nb & (nb - 1)) == 0);
    tnode_t **nbk = NULL;
    if (nb) {
        nbk = rt__topic_alloc(t->bytes, nb * sizeof(*nbk));
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
    rt__topic_free(t->bytes, t->buckets, t->nbuckets * sizeof(*t->buckets));
    t->buckets = nbk;
    t->nbuckets = nb;
    return 0;
}

/* The wildcard bit a level stands for in its parent's wild, or 0. */
static unsigned wild_bit(const char *lvl, size_t n)
{
    if (n != 1)
        return 0;
    return lvl[0] == '+' ? TT_PLUS : lvl[0] == '#' ? TT_HASH : 0;
}

/* Finds or creates parent's child lvl. */
static tnode_t *find_or_add_child(ttable_t *t, tnode_t *parent, const char *lvl, size_t n)
{
    tnode_t *x = rt__tt_find(t, parent, lvl, n);
    if (x)
        return x;
    if (t->count + 1 > t->nbuckets * TT_MAX_LOAD &&
        rehash(t, t->nbuckets ? t->nbuckets * 2 : TT_MIN_BUCKETS) != 0 && !t->buckets)
        return NULL; /* a failed growth is fine (longer chains) unless there is no table */
    x = node_alloc(t, parent, lvl, n);
    if (!x)
        return NULL;
    x->hval = edge_hash(parent, lvl, n);
    x->hnext = t->buckets[x->hval & (t->nbuckets - 1)];
    t->buckets[x->hval & (t->nbuckets - 1)] = x;
    t->count++;
    atomic_fetch_add_explicit(t->nodes, 1, memory_order_relaxed);
    parent->nkids++;
    parent->wild |= (uint8_t)wild_bit(lvl, n);
    if (t->kind->links) {
        tt_links_t *pl = rt__tt_links(parent), *xl = rt__tt_links(x);
        xl->next = pl->kids;
        if (pl->kids)
            rt__tt_links(pl->kids)->prev = x;
        pl->kids = x;
    }
    return x;
}

void rt__tt_prune(ttable_t *t, tnode_t *x)
{
    RT_ASSERT(RT__TT_WRITABLE(t));
    while (x && x->parent && x->nkids == 0 && !t->kind->holds(x)) {
        tnode_t *parent = x->parent;
        tnode_t **pp = &t->buckets[x->hval & (t->nbuckets - 1)];
        while (*pp != x)
            pp = &(*pp)->hnext;
        *pp = x->hnext;
        t->count--;
        atomic_fetch_sub_explicit(t->nodes, 1, memory_order_relaxed);
        parent->nkids--;
        parent->wild &= (uint8_t)~wild_bit(rt__tt_level(t, x), x->len);
        if (t->kind->links) {
            tt_links_t *xl = rt__tt_links(x);
            if (xl->prev)
                rt__tt_links(xl->prev)->next = xl->next;
            else
                rt__tt_links(parent)->kids = xl->next;
            if (xl->next)
                rt__tt_links(xl->next)->prev = xl->prev;
        }
        rt__topic_free(t->bytes, x, node_bytes(t, x));
        x = parent;
    }
    /* Give the buckets back when the table empties, so memory returns to baseline. */
    if (t->count == 0 && t->buckets)
        rehash(t, 0);
}

tnode_t *rt__tt_path(ttable_t *t, const char *f, size_t len, int create)
{
    RT_ASSERT(create ? RT__TT_WRITABLE(t) : RT__TT_READABLE(t));
    tnode_t *x = t->root;
    const char *p = f, *end = f + len;
    for (;;) {
        const char *q = rt_topic_level_end(p, end);
        tnode_t *c = create ? find_or_add_child(t, x, p, (size_t)(q - p))
                            : rt__tt_find(t, x, p, (size_t)(q - p));
        if (!c) {
            if (create)
                rt__tt_prune(t, x); /* drop the nodes this call created */
            return NULL;
        }
        x = c;
        if (q == end)
            return x;
        p = q + 1;
    }
}

void rt__tt_destroy(ttable_t *t, void (*release)(tnode_t *x, void *arg), void *arg)
{
    /* Every node but the root is in exactly one bucket: no tree walk, no recursion. */
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (tnode_t *x = t->buckets[i], *nx; x; x = nx) {
            nx = x->hnext;
            release(x, arg);
            free(x);
        }
    }
    if (t->root) {
        release(t->root, arg);
        free(t->root);
    }
    free(t->buckets);
    t->root = NULL;
    t->buckets = NULL;
    t->nbuckets = 0;
    t->count = 0;
}

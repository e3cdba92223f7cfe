/*
** Topics as trees of levels: what the subscription trie (topic_trie.c) and the retained store
** (retained.c) are both built from (their syntax is topic.h's). A node table: a node stores only
*its own level; its children are found through a per-table
** hash keyed by (parent pointer, level bytes), so a node with 20,000 children ("test/%i")
** costs one hash probe per lookup and no per-node child array; its '+' and '#' children are
** looked up the same way, once a bit says they exist. Empty nodes (no children, nothing of
** their owner's) are freed at once, so an emptied table returns to its baseline memory.
** Only topic_tree.c, topic_trie.c and retained.c include this.
**
** Each owner lays out its own nodes (tt_kind_t): a tnode_t first, then the owner's fields,
** then the level's bytes. A node is most of what one subscription costs, so the table keeps
** only what lookups and pruning need; sibling lists (for enumerating children) are kept
** only by owners that ask for them: the retained store walks children for '+' and '#'
** filters, the trie never does.
**
** Every byte a table allocates is counted in its owner's counter (rt_trie_stats,
** rt_retained_stats). A table is guarded by its owner's lock: readers may find, only a
** writer may change it. Debug builds record who holds it and check that.
*/
#ifndef RT_TOPIC_TREE_H
#define RT_TOPIC_TREE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common.h"
#include "topic_trie.h"

/* tnode_t.wild: which wildcard children a node has. */
#define TT_PLUS 1u
#define TT_HASH 2u

/* The table's part of a node: 32 bytes, at the start of every owner's node. */
typedef struct tnode_s tnode_t;
struct tnode_s {
    tnode_t *hnext;  /* chain in the table's edge hash */
    tnode_t *parent; /* NULL only for the root */
    uint32_t hval;   /* the edge hash's low 32 bits: the bucket (kept for rehashing) */
    uint32_t nkids;  /* children */
    uint16_t len;    /* level length (levels are at most RT_TOPIC_MAX_LEN bytes) */
    uint8_t wild;    /* TT_PLUS, TT_HASH */
    uint8_t flags;   /* the owner's */
    uint32_t aux;    /* the owner's */
};

/* Sibling links, right after the tnode_t in the nodes of tables whose kind has links. */
typedef struct {
    tnode_t *kids;        /* first child */
    tnode_t *next, *prev; /* siblings under the parent */
} tt_links_t;

/* What an owner's nodes look like, and what the table asks the owner about them. */
typedef struct {
    uint32_t node_size;              /* the owner's node struct, tnode_t first; the level follows */
    bool links;                      /* nodes keep sibling lists (tt_links_t after the tnode_t) */
    bool (*holds)(const tnode_t *x); /* x holds something of the owner's: it must not be pruned */
} tt_kind_t;

/* The node tree and its edge hash; the owner's lock guards all of it. */
typedef struct {
    tnode_t *root;
    tnode_t **buckets; /* NULL while the table has no nodes */
    size_t nbuckets, count;
    const tt_kind_t *kind;
    uint32_t node_size;   /* kind->node_size, where a node's level starts */
    atomic_size_t *bytes; /* owner's byte counter; writers of other shards update it too */
    atomic_size_t *nodes;
#ifndef NDEBUG
    atomic_int readers; /* debug: threads holding the owner's lock to read */
    atomic_bool writer; /* debug: a thread holds it to write */
#endif
} ttable_t;

/* A node's level bytes (len of them, not NUL-terminated). */
static inline char *rt__tt_level(const ttable_t *t, const tnode_t *x)
{
    return (char *)x + t->node_size;
}

/* The sibling links of a node in a table whose kind has them. */
static inline tt_links_t *rt__tt_links(const tnode_t *x)
{
    return (tt_links_t *)(x + 1);
}

/* A walk position: node, the next level starting at p, or done (all levels consumed). */
typedef struct rt_trie_frame_s {
    tnode_t *node;
    const char *p;
    int done;
} tt_frame_t;

/* ---- Counted allocation: every byte shows in the owner's counter ---- */
void *rt__topic_alloc(atomic_size_t *ctr, size_t n);
void rt__topic_free(atomic_size_t *ctr, void *p, size_t n);
/* Grows or shrinks an array from oldn to newn elements; NULL (p unchanged) on failure. */
void *rt__topic_realloc(atomic_size_t *ctr, void *p, size_t oldn, size_t newn, size_t elem);

/* ---- The node table ---- */
int rt__tt_init(ttable_t *t, const tt_kind_t *kind, atomic_size_t *bytes,
                atomic_size_t *nodes); /* 0 or RT_ENOMEM */
/* Calls release(x, arg) on every node, root included (it must free what x holds, not x),
   then frees the nodes and the buckets. */
void rt__tt_destroy(ttable_t *t, void (*release)(tnode_t *x, void *arg), void *arg);
tnode_t *rt__tt_find(const ttable_t *t, const tnode_t *parent, const char *lvl, size_t n);
/* parent's '+' or '#' child (bit TT_PLUS or TT_HASH), which its wild says it has. */
tnode_t *rt__tt_wild_find(const ttable_t *t, const tnode_t *parent, unsigned bit);
/* x's '+' or '#' child, or NULL: matching asks at every level, mostly of nodes without. */
static inline tnode_t *rt__tt_wild(const ttable_t *t, const tnode_t *x, unsigned bit)
{
    return (x->wild & bit) ? rt__tt_wild_find(t, x, bit) : NULL;
}
/* The node of a plain filter or topic; with create, made (NULL on RT_ENOMEM) if missing. */
tnode_t *rt__tt_path(ttable_t *t, const char *f, size_t len, int create);
/* Frees x and then each ancestor that became empty, stopping at the root. */
void rt__tt_prune(ttable_t *t, tnode_t *x);

/*
** Debug builds check every use of a table against its owner's lock: the owner calls
** rt__tt_lock_free() before taking the lock, the *_begin right after and the *_end right
** before releasing it (all no-ops under NDEBUG). A thread holds one table lock at a time,
** so a callback run under one (rt_trie_alive_fn, rt_retained_fn) that calls back into the
** trie or the store fails an assert instead of deadlocking.
*/
#ifndef NDEBUG
extern _Thread_local int rt__tt_locks_held; /* by this thread */
static inline void rt__tt_lock_free(void)
{
    RT_ASSERT(rt__tt_locks_held == 0);
}
static inline void rt__tt_read_begin(ttable_t *t)
{
    rt__tt_locks_held++;
    atomic_fetch_add_explicit(&t->readers, 1, memory_order_relaxed);
}
static inline void rt__tt_read_end(ttable_t *t)
{
    RT_ASSERT(rt__tt_locks_held == 1 &&
              atomic_load_explicit(&t->readers, memory_order_relaxed) > 0);
    atomic_fetch_sub_explicit(&t->readers, 1, memory_order_relaxed);
    rt__tt_locks_held--;
}
static inline void rt__tt_write_begin(ttable_t *t)
{
    RT_ASSERT(!atomic_load_explicit(&t->writer, memory_order_relaxed) &&
              atomic_load_explicit(&t->readers, memory_order_relaxed) == 0);
    rt__tt_locks_held++;
    atomic_store_explicit(&t->writer, true, memory_order_relaxed);
}
static inline void rt__tt_write_end(ttable_t *t)
{
    RT_ASSERT(rt__tt_locks_held == 1 && atomic_load_explicit(&t->writer, memory_order_relaxed));
    atomic_store_explicit(&t->writer, false, memory_order_relaxed);
    rt__tt_locks_held--;
}
#define RT__TT_READABLE(t)                                                                         \
    (atomic_load_explicit(&(t)->writer, memory_order_relaxed) ||                                   \
     atomic_load_explicit(&(t)->readers, memory_order_relaxed) > 0)
#define RT__TT_WRITABLE(t) atomic_load_explicit(&(t)->writer, memory_order_relaxed)
#else
#define rt__tt_lock_free() ((void)0)
#define rt__tt_read_begin(t) ((void)(t))
#define rt__tt_read_end(t) ((void)(t))
#define rt__tt_write_begin(t) ((void)(t))
#define rt__tt_write_end(t) ((void)(t))
#endif

#endif

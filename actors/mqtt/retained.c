/*
** The retained-message store: one message per topic, kept on the nodes of a level tree
** (topic_tree.h) under one rwlock, and the reverse match a SUBSCRIBE needs: which stored
** topics does a new filter match. Contracts in topic_trie.h.
*/
#include "topic_tree.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

/* A retained-store node: its children in a sibling list ('+' and '#' filters walk them). */
typedef struct {
    tnode_t n;
    tt_links_t l;
    void *msg;        /* the message, NULL if none */
    size_t msg_bytes; /* what the limits count for msg */
} rnode_t;

_Static_assert(offsetof(rnode_t, l) == sizeof(tnode_t), "rt__tt_links() finds the links there");

static inline rnode_t *rnode(const tnode_t *x)
{
    return (rnode_t *)x;
}

static bool rnode_holds(const tnode_t *x)
{
    return rnode(x)->msg != NULL;
}

static const tt_kind_t retained_kind = {
    .node_size = sizeof(rnode_t), .links = true, .holds = rnode_holds};

struct rt_retained_s {
    pthread_rwlock_t lock;
    ttable_t t;
    rt_retained_release_fn release;
    rt_retained_watch_fn watch;
    size_t max_count, max_bytes;     /* limits, 0 = none; guarded by lock */
    size_t count, msg_bytes;         /* guarded by lock */
    size_t count_max, msg_bytes_max; /* their high-water marks; guarded by lock */
    atomic_size_t bytes;             /* allocation counter (atomic only to share ttable code) */
    atomic_size_t nodes;
};

static void read_lock(rt_retained_t *r)
{
    rt__tt_lock_free();
    pthread_rwlock_rdlock(&r->lock);
    rt__tt_read_begin(&r->t);
}

static void read_unlock(rt_retained_t *r)
{
    rt__tt_read_end(&r->t);
    pthread_rwlock_unlock(&r->lock);
}

static void write_lock(rt_retained_t *r)
{
    rt__tt_lock_free();
    pthread_rwlock_wrlock(&r->lock);
    rt__tt_write_begin(&r->t);
}

static void write_unlock(rt_retained_t *r)
{
    rt__tt_write_end(&r->t);
    pthread_rwlock_unlock(&r->lock);
}

int rt_retained_new(rt_retained_t **out, rt_retained_release_fn release, size_t max_count,
                    size_t max_bytes)
{
    rt_retained_t *r = calloc(1, sizeof(*r));
    if (!r)
        return RT_ENOMEM;
    atomic_init(&r->bytes, sizeof(*r));
    if (rt__tt_init(&r->t, &retained_kind, &r->bytes, &r->nodes) != 0) {
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

/* rt__tt_destroy's release: a node's message. */
static void release_msg(tnode_t *x, void *arg)
{
    rt_retained_t *r = arg;
    if (rnode(x)->msg && r->release)
        r->release(rnode(x)->msg);
}

void rt_retained_free(rt_retained_t *r)
{
    if (!r)
        return;
    rt__tt_destroy(&r->t, release_msg, r);
    pthread_rwlock_destroy(&r->lock);
    free(r);
}

int rt_retained_set(rt_retained_t *r, const char *topic, size_t len, void *msg, size_t msg_bytes)
{
    if (!rt_topic_valid_name(topic, len))
        return RT_EINVAL;
    int rc = 0;
    void *old = NULL;
    write_lock(r);
    tnode_t *n = rt__tt_path(&r->t, topic, len, msg != NULL);
    if (!n) {
        rc = msg ? RT_ENOMEM : 0; /* clearing a topic with nothing retained is a no-op */
        goto out;
    }
    rnode_t *x = rnode(n);
    size_t count = r->count + (msg && !x->msg) - (!msg && x->msg);
    size_t bytes = r->msg_bytes - (x->msg ? x->msg_bytes : 0) + (msg ? msg_bytes : 0);
    if (msg && ((r->max_count && count > r->max_count) || (r->max_bytes && bytes > r->max_bytes))) {
        rt__tt_prune(&r->t, n); /* undo a node created just now */
        rc = RT_ELIMIT;
        goto out;
    }
    old = x->msg;
    if (r->watch && x->msg_bytes != (msg ? msg_bytes : 0))
        r->watch(topic, len, (ptrdiff_t)(msg ? msg_bytes : 0) - (ptrdiff_t)x->msg_bytes);
    x->msg = msg;
    x->msg_bytes = msg ? msg_bytes : 0;
    r->count = count;
    r->msg_bytes = bytes;
    if (count > r->count_max)
        r->count_max = count;
    if (bytes > r->msg_bytes_max)
        r->msg_bytes_max = bytes;
    if (!msg)
        rt__tt_prune(&r->t, n);
out:
    write_unlock(r);
    /* Released outside the lock: a release callback may be arbitrarily slow. */
    if (old && r->release)
        r->release(old);
    return rc;
}

/* Builds x's full topic into *buf by following parents. */
static int topic_of(const ttable_t *t, const tnode_t *x, char **buf, size_t *cap, size_t *len)
{
    size_t n = 0;
    for (const tnode_t *y = x; y->parent; y = y->parent)
        n += y->len + (y->parent->parent ? 1 : 0);
    if (rt_grow(buf, cap, n + 1, 1, 16) != 0)
        return RT_ENOMEM;
    size_t pos = n;
    for (const tnode_t *y = x; y->parent; y = y->parent) {
        pos -= y->len;
        memcpy(*buf + pos, rt__tt_level(t, y), y->len);
        if (y->parent->parent)
            (*buf)[--pos] = '/';
    }
    *len = n;
    return 0;
}

/* One reverse match in progress: the callback, and the buffer topics are rebuilt in. */
typedef struct {
    const ttable_t *t;
    char *buf;
    size_t cap;
    rt_retained_fn fn;
    void *arg;
    size_t found;
} retained_emit_t;

/* Hands x's message, if it has one, to the callback. */
static int emit_node(retained_emit_t *e, const tnode_t *x)
{
    size_t len;
    void *msg = rnode(x)->msg;
    if (!msg)
        return 0;
    if (topic_of(e->t, x, &e->buf, &e->cap, &len) != 0)
        return RT_ENOMEM;
    e->fn(e->arg, e->buf, len, msg);
    e->found++;
    return 0;
}

/* '#' at top: top itself and every descendant; at the root, not the '$' topics. */
static int emit_subtree(retained_emit_t *e, const tnode_t *top)
{
    const tnode_t *x = top;
    while (x) {
        int skip = x->parent && !x->parent->parent && x->len && rt__tt_level(e->t, x)[0] == '$' &&
                   top->parent == NULL;
        if (!skip && emit_node(e, x) != 0)
            return RT_ENOMEM;
        if (!skip && rt__tt_links(x)->kids) {
            x = rt__tt_links(x)->kids;
            continue;
        }
        while (x != top && !rt__tt_links(x)->next)
            x = x->parent;
        x = x == top ? NULL : rt__tt_links(x)->next;
    }
    return 0;
}

int rt_retained_match(rt_retained_t *r, const char *filter, size_t len, rt_retained_fn fn,
                      void *arg, size_t *nfound)
{
    rt_topic_filter_t sf;
    if (nfound)
        *nfound = 0;
    if (rt_topic_parse_filter(filter, len, &sf) || sf.group)
        return RT_EINVAL;
    retained_emit_t e = {.t = &r->t, .fn = fn, .arg = arg};
    tt_frame_t *st = NULL;
    size_t cap = 0, sp = 0;
    const char *end = filter + len;
    int rc = 0;
    read_lock(r);
    if (rt_grow(&st, &cap, 1, sizeof(*st), 16) != 0) {
        rc = RT_ENOMEM;
        goto out;
    }
    st[sp++] = (tt_frame_t){r->t.root, filter, 0};
    while (sp && rc == 0) {
        tt_frame_t f = st[--sp];
        if (f.done) {
            rc = emit_node(&e, f.node);
            continue;
        }
        const char *q = rt_topic_level_end(f.p, end);
        int done = q == end;
        const char *np = done ? end : q + 1;
        int at_root = f.node->parent == NULL;
        if (q - f.p == 1 && f.p[0] == '#') {
            rc = emit_subtree(&e, f.node);
        } else if (q - f.p == 1 && f.p[0] == '+') {
            for (tnode_t *c = rt__tt_links(f.node)->kids; c && rc == 0; c = rt__tt_links(c)->next) {
                if (at_root && c->len && rt__tt_level(&r->t, c)[0] == '$')
                    continue;
                if (rt_grow(&st, &cap, sp + 1, sizeof(*st), 16) != 0)
                    rc = RT_ENOMEM;
                else
                    st[sp++] = (tt_frame_t){c, np, done};
            }
        } else {
            tnode_t *c = rt__tt_find(&r->t, f.node, f.p, (size_t)(q - f.p));
            if (c && rt_grow(&st, &cap, sp + 1, sizeof(*st), 16) != 0)
                rc = RT_ENOMEM;
            else if (c)
                st[sp++] = (tt_frame_t){c, np, done};
        }
    }
out:
    read_unlock(r);
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

void rt_retained_watch(rt_retained_t *r, rt_retained_watch_fn watch)
{
    r->watch = watch;
}

size_t rt_retained_bytes_of(rt_retained_t *r, const char *topic, size_t len)
{
    read_lock(r);
    tnode_t *n = rt__tt_path(&r->t, topic, len, 0);
    size_t bytes = n ? rnode(n)->msg_bytes : 0;
    read_unlock(r);
    return bytes;
}

void rt_retained_bytes_under(rt_retained_t *r, const char *prefix, size_t len,
                             void (*done)(void *arg, size_t bytes), void *arg)
{
    size_t sum = 0;
    read_lock(r);
    /* "a/b/" names the node a/b: what hangs below it is the sum. */
    const tnode_t *top = len > 1 ? rt__tt_path(&r->t, prefix, len - 1, 0) : NULL;
    const tnode_t *x = top && rt__tt_links(top)->kids ? rt__tt_links(top)->kids : NULL;
    while (x) {
        sum += rnode(x)->msg_bytes;
        if (rt__tt_links(x)->kids) {
            x = rt__tt_links(x)->kids;
            continue;
        }
        while (x->parent != top && !rt__tt_links(x)->next)
            x = x->parent;
        x = rt__tt_links(x)->next;
    }
    done(arg, sum);
    read_unlock(r);
}

/*
** The topic index of a rule set (rule_index.h): a tree of filter levels, built once and
** then only read.
**
** Node 0 is the root. A node's literal children are found through one open-addressing
** table for the whole index, keyed by (parent node, level bytes); its '+' child is in the
** node itself. Each node names two runs of the rule list: the rules whose filter ends at
** it, and those whose filter ends at it with "/#" ("#" alone at the root). A match holds
** every node the topic's levels reach so far; a node is reached at most once (it has one
** parent and one edge), so a match costs the topic's levels times the nodes they reach,
** whatever the number of rules.
*/
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rt.h"
#include "rule_index.h"
#include "topic.h"

#define NO_NODE UINT32_MAX
#define FIRST_SLOTS 16 /* edge table slots of an empty index (a power of two) */

typedef struct index_node_s {
    uint32_t plus;              /* the '+' child, or NO_NODE */
    uint32_t exact_at, exact_n; /* rules whose filter ends here */
    uint32_t rest_at, rest_n;   /* rules whose filter is this node's levels then "#" */
} index_node_t;

typedef struct index_edge_s {
    uint64_t hash; /* edge_hash(parent, level) */
    uint32_t parent, child;
    uint32_t off, len; /* the level's bytes in names */
} index_edge_t;

/* A filter's end while building: sorted into the nodes' runs by the seal. */
typedef struct index_entry_s {
    uint32_t node;
    uint32_t rest; /* 1: the filter ends with "#" under node */
    uint32_t rule;
} index_entry_t;

struct rt_rule_index_s {
    index_node_t *nodes;
    size_t nnodes, cap_nodes;
    index_edge_t *edges;
    size_t nedges, cap_edges;
    uint32_t *slots; /* edge index + 1, 0 for empty; a power of two, at most half full */
    size_t nslots;
    rt_buf_t names;  /* the levels' bytes */
    uint32_t *rules; /* the nodes' runs of rule indices (after the seal) */
    size_t nrules;
    index_entry_t *entries; /* until the seal */
    size_t nentries, cap_entries;
    bool sealed;
};

/*
** One hash per level, mixed with the parent (an odd multiplier is a bijection, so one level
** under two parents gives two keys), instead of one hash per (node, level): a match hashes
** each level of the topic once, whatever the number of nodes it reaches.
*/
static uint64_t edge_hash(uint64_t level_hash, uint32_t parent)
{
    return level_hash ^ ((uint64_t)parent * 0x9e3779b97f4a7c15ull);
}

static uint32_t find_child(const rt_rule_index_t *ix, uint32_t parent, const char *level,
                           size_t len, uint64_t level_hash)
{
    uint64_t h = edge_hash(level_hash, parent);
    size_t mask = ix->nslots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t e = ix->slots[i];
        if (!e)
            return NO_NODE;
        const index_edge_t *ed = &ix->edges[e - 1];
        if (ed->hash == h && ed->parent == parent && ed->len == len &&
            memcmp(ix->names.data + ed->off, level, len) == 0)
            return ed->child;
    }
}

static void put_slot(uint32_t *slots, size_t nslots, uint64_t hash, uint32_t edge)
{
    size_t mask = nslots - 1, i = hash & mask;
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = edge + 1;
}

static int new_node(rt_rule_index_t *ix, uint32_t *out)
{
    if (rt_grow(&ix->nodes, &ix->cap_nodes, ix->nnodes + 1, sizeof(index_node_t), 16))
        return RT_ENOMEM;
    ix->nodes[ix->nnodes] = (index_node_t){.plus = NO_NODE};
    *out = (uint32_t)ix->nnodes++;
    return 0;
}

/* The literal child of parent for level, made if it is not there yet. */
static int literal_child(rt_rule_index_t *ix, uint32_t parent, const char *level, size_t len,
                         uint32_t *out)
{
    uint64_t lh = rt_hash(level, len);
    if ((*out = find_child(ix, parent, level, len, lh)) != NO_NODE)
        return 0;
    if ((ix->nedges + 1) * 2 > ix->nslots) {
        size_t n = ix->nslots * 2;
        uint32_t *slots = calloc(n, sizeof(*slots));
        if (!slots)
            return RT_ENOMEM;
        for (size_t e = 0; e < ix->nedges; e++)
            put_slot(slots, n, ix->edges[e].hash, (uint32_t)e);
        free(ix->slots);
        ix->slots = slots;
        ix->nslots = n;
    }
    if (rt_grow(&ix->edges, &ix->cap_edges, ix->nedges + 1, sizeof(index_edge_t), 16))
        return RT_ENOMEM;
    size_t off = ix->names.len;
    rt_buf_add(&ix->names, level, len);
    if (ix->names.oom || new_node(ix, out))
        return RT_ENOMEM;
    index_edge_t *ed = &ix->edges[ix->nedges];
    *ed = (index_edge_t){edge_hash(lh, parent), parent, *out, (uint32_t)off, (uint32_t)len};
    put_slot(ix->slots, ix->nslots, ed->hash, (uint32_t)ix->nedges++);
    return 0;
}

int rt_rule_index_new(rt_rule_index_t **out)
{
    rt_rule_index_t *ix = calloc(1, sizeof(*ix));
    uint32_t root;
    if (!ix || !(ix->slots = calloc(FIRST_SLOTS, sizeof(uint32_t))) || new_node(ix, &root)) {
        rt_rule_index_free(ix);
        return RT_ENOMEM;
    }
    ix->nslots = FIRST_SLOTS;
    *out = ix;
    return 0;
}

void rt_rule_index_free(rt_rule_index_t *ix)
{
    if (!ix)
        return;
    free(ix->nodes);
    free(ix->edges);
    free(ix->slots);
    rt_buf_free(&ix->names);
    free(ix->rules);
    free(ix->entries);
    free(ix);
}

int rt_rule_index_add(rt_rule_index_t *ix, const char *filter, size_t len, uint32_t rule)
{
    RT_ASSERT(!ix->sealed);
    if (rt_topic_filter_error(filter, len))
        return RT_EINVAL;
    uint32_t node = 0, rest = 0;
    for (size_t start = 0;;) {
        size_t end = start;
        while (end < len && filter[end] != '/')
            end++;
        const char *level = filter + start;
        size_t n = end - start;
        if (n == 1 && level[0] == '#') {
            rest = 1;
            break;
        }
        if (n == 1 && level[0] == '+') {
            if (ix->nodes[node].plus == NO_NODE) {
                uint32_t child;
                if (new_node(ix, &child))
                    return RT_ENOMEM;
                ix->nodes[node].plus = child;
            }
            node = ix->nodes[node].plus;
        } else if (literal_child(ix, node, level, n, &node)) {
            return RT_ENOMEM;
        }
        if (end == len)
            break;
        start = end + 1;
    }
    if (rt_grow(&ix->entries, &ix->cap_entries, ix->nentries + 1, sizeof(index_entry_t), 16))
        return RT_ENOMEM;
    ix->entries[ix->nentries++] = (index_entry_t){node, rest, rule};
    return 0;
}

static int cmp_entry(const void *pa, const void *pb)
{
    const index_entry_t *a = pa, *b = pb;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    if (a->rest != b->rest)
        return a->rest < b->rest ? -1 : 1;
    return a->rule < b->rule ? -1 : a->rule > b->rule;
}

int rt_rule_index_seal(rt_rule_index_t *ix)
{
    RT_ASSERT(!ix->sealed);
    if (ix->nentries) {
        if (!(ix->rules = malloc(ix->nentries * sizeof(uint32_t))))
            return RT_ENOMEM;
        qsort(ix->entries, ix->nentries, sizeof(index_entry_t), cmp_entry);
    }
    for (size_t i = 0; i < ix->nentries; i++) {
        const index_entry_t *e = &ix->entries[i];
        /* One rule naming one filter twice is listed once. */
        if (i > 0 && cmp_entry(e, e - 1) == 0)
            continue;
        index_node_t *n = &ix->nodes[e->node];
        uint32_t *at = e->rest ? &n->rest_at : &n->exact_at;
        uint32_t *count = e->rest ? &n->rest_n : &n->exact_n;
        if (*count == 0)
            *at = (uint32_t)ix->nrules;
        RT_ASSERT(*at + *count == ix->nrules); /* a node's run is contiguous */
        ix->rules[ix->nrules++] = e->rule;
        (*count)++;
    }
    free(ix->entries);
    ix->entries = NULL;
    ix->nentries = ix->cap_entries = 0;
    ix->sealed = true;
    return 0;
}

static int add_run(rt_rule_hits_t *h, const rt_rule_index_t *ix, uint32_t at, uint32_t n)
{
    if (n == 0)
        return 0;
    if (rt_grow(&h->rules, &h->cap, h->n + n, sizeof(uint32_t), 16))
        return RT_ENOMEM;
    memcpy(h->rules + h->n, ix->rules + at, n * sizeof(uint32_t));
    h->n += n;
    return 0;
}

static int reach(rt_rule_hits_t *h, int side, size_t *n, uint32_t node)
{
    if (rt_grow(&h->reached[side], &h->cap_reached[side], *n + 1, sizeof(uint32_t), 16))
        return RT_ENOMEM;
    h->reached[side][(*n)++] = node;
    return 0;
}

static int cmp_u32(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}

/* Walks topic's levels; h->rules gets every run that matches, unsorted and repeated. */
static int walk(const rt_rule_index_t *ix, const char *topic, size_t len, rt_rule_hits_t *h)
{
    /* 4.7.2: neither '+' nor '#' at the first level takes a topic starting with '$'. */
    bool dollar = len > 0 && topic[0] == '$';
    int cur = 0;
    size_t ncur = 0;
    if (reach(h, cur, &ncur, 0))
        return RT_ENOMEM;
    for (size_t start = 0, level = 0; ncur > 0; level++) {
        size_t end = start;
        while (end < len && topic[end] != '/')
            end++;
        uint64_t lh = rt_hash(topic + start, end - start);
        bool wild = level > 0 || !dollar;
        size_t nnext = 0;
        for (size_t i = 0; i < ncur; i++) {
            const index_node_t *node = &ix->nodes[h->reached[cur][i]];
            uint32_t child = find_child(ix, h->reached[cur][i], topic + start, end - start, lh);
            if ((wild && add_run(h, ix, node->rest_at, node->rest_n)) ||
                (child != NO_NODE && reach(h, !cur, &nnext, child)) ||
                (wild && node->plus != NO_NODE && reach(h, !cur, &nnext, node->plus)))
                return RT_ENOMEM;
        }
        cur = !cur;
        ncur = nnext;
        if (end == len)
            break;
        start = end + 1;
    }
    /* The topic ends at these nodes: their filters end here too, or go on with "/#". */
    for (size_t i = 0; i < ncur; i++) {
        const index_node_t *node = &ix->nodes[h->reached[cur][i]];
        if (add_run(h, ix, node->exact_at, node->exact_n) ||
            add_run(h, ix, node->rest_at, node->rest_n))
            return RT_ENOMEM;
    }
    return 0;
}

int rt_rule_index_match(const rt_rule_index_t *ix, const char *topic, size_t len, rt_rule_hits_t *h)
{
    RT_ASSERT(ix->sealed);
    h->n = 0;
    if (walk(ix, topic, len, h)) {
        h->n = 0;
        return RT_ENOMEM;
    }
    if (h->n < 2)
        return 0;
    /* A rule with several filters that match is reached once per filter. */
    qsort(h->rules, h->n, sizeof(uint32_t), cmp_u32);
    size_t k = 1;
    for (size_t i = 1; i < h->n; i++)
        if (h->rules[i] != h->rules[k - 1])
            h->rules[k++] = h->rules[i];
    h->n = k;
    return 0;
}

void rt_rule_hits_free(rt_rule_hits_t *h)
{
    free(h->rules);
    free(h->reached[0]);
    free(h->reached[1]);
    memset(h, 0, sizeof(*h));
}

size_t rt_rule_index_bytes(const rt_rule_index_t *ix)
{
    return sizeof(*ix) + ix->cap_nodes * sizeof(index_node_t) +
           ix->cap_edges * sizeof(index_edge_t) + ix->nslots * sizeof(uint32_t) + ix->names.cap +
           ix->nrules * sizeof(uint32_t) + ix->cap_entries * sizeof(index_entry_t);
}

/*
** Outbound topic aliases: the topics in alias order, and an open-addressing index over them
** by hash (kept at most half full, so a probe always ends at a free slot). Both grow by
** doubling up to the table's maximum, so a client that allows 65535 aliases but gets few
** topics costs only what it uses. On the owner's heap, the table and the entries are
** RT_OBJ_SCAN (they point to the entries and the topics), the topics and the index leaves.
*/
#include "topic_alias.h"

#include <string.h>

typedef struct {
    char *topic; /* owned copy */
    uint32_t len;
    uint32_t hash;
} entry_t;

struct rt_alias_out_s {
    rt_actor_t *owner; /* the actor that made it: its heap, and the only one that may touch it */
    entry_t *entries;  /* alias i + 1 is entries[i] */
    uint16_t *slots;   /* 1 + an index into entries; 0: free */
    uint32_t nslots;   /* a power of two, at least twice cap */
    uint16_t n, cap, max;
};

/* Topics come from publishers: the keyed hash keeps them from planning collisions (which
   would cost probes in a table of at most 2 x max slots, never more memory). */
static uint32_t topic_hash(const uint8_t *t, size_t len)
{
    return (uint32_t)rt_hash(t, len);
}

int rt_alias_out_new(rt_actor_t *owner, uint16_t max, rt_alias_out_t **out)
{
    RT_ASSERT(owner == rt_current());
    *out = NULL;
    if (max == 0)
        return RT_EINVAL;
    rt_alias_out_t *a = rt_alloc(owner, sizeof(*a), RT_OBJ_SCAN);
    if (!a)
        return RT_ENOMEM;
    a->max = max;
    a->owner = owner;
    *out = a;
    return 0;
}

void rt_alias_out_free(rt_alias_out_t *a)
{
    if (!a)
        return;
    RT_ASSERT(a->owner == rt_current());
    for (uint16_t i = 0; i < a->n; i++)
        rt_free(a->owner, a->entries[i].topic);
    rt_free(a->owner, a->entries);
    rt_free(a->owner, a->slots);
    rt_free(a->owner, a);
}

static uint32_t find_slot(const rt_alias_out_t *a, uint32_t hash, const uint8_t *topic, size_t len)
{
    uint32_t mask = a->nslots - 1;
    uint32_t i = hash & mask;
    for (; a->slots[i]; i = (i + 1) & mask) {
        const entry_t *e = &a->entries[a->slots[i] - 1];
        if (e->hash == hash && e->len == len && memcmp(e->topic, topic, len) == 0)
            break;
    }
    return i;
}

uint16_t rt_alias_out_lookup(const rt_alias_out_t *a, const uint8_t *topic, size_t len, bool *fresh)
{
    RT_ASSERT(a->owner == rt_current());
    *fresh = false;
    if (a->nslots) {
        uint32_t i = find_slot(a, topic_hash(topic, len), topic, len);
        if (a->slots[i])
            return a->slots[i];
    }
    if (a->n == a->max)
        return 0;
    *fresh = true;
    return (uint16_t)(a->n + 1);
}

/* Room for one more entry: entries and slots doubled (slots rebuilt) when full. */
static int make_room(rt_alias_out_t *a)
{
    if (a->n < a->cap)
        return 0;
    uint32_t cap = a->cap ? 2u * a->cap : 8u;
    if (cap > a->max)
        cap = a->max;
    uint32_t nslots = 16;
    while (nslots < 2 * cap)
        nslots *= 2;
    entry_t *entries = rt_realloc(a->owner, a->entries, cap * sizeof(*entries), RT_OBJ_SCAN);
    if (!entries)
        return RT_ENOMEM;
    a->entries = entries;
    uint16_t *slots = rt_alloc(a->owner, nslots * sizeof(*slots), RT_OBJ_LEAF);
    if (!slots)
        return RT_ENOMEM;
    rt_free(a->owner, a->slots);
    a->slots = slots;
    a->nslots = nslots;
    a->cap = (uint16_t)cap;
    for (uint16_t k = 0; k < a->n; k++) {
        const entry_t *e = &a->entries[k];
        a->slots[find_slot(a, e->hash, (const uint8_t *)e->topic, e->len)] = (uint16_t)(k + 1);
    }
    return 0;
}

int rt_alias_out_commit(rt_alias_out_t *a, uint16_t alias, const uint8_t *topic, size_t len)
{
    RT_ASSERT(a->owner == rt_current());
    RT_ASSERT(alias == a->n + 1 && a->n < a->max && len <= 65535);
    int rc = make_room(a);
    if (rc)
        return rc;
    char *copy = rt_strndup(a->owner, topic, len);
    if (!copy)
        return RT_ENOMEM;
    uint32_t hash = topic_hash(topic, len);
    a->entries[a->n] = (entry_t){.topic = copy, .len = (uint32_t)len, .hash = hash};
    a->slots[find_slot(a, hash, topic, len)] = alias;
    a->n++;
    return 0;
}

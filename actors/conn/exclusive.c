/*
** Exclusive subscriptions' claims (exclusive.h): a chained hash table of filter -> (client
** id, actor) under one mutex, taken only by $exclusive SUBSCRIBEs and by their ends.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "exclusive.h"

typedef struct claim_s {
    struct claim_s *next;
    uint64_t hash;
    rt_pid_t pid;
    uint16_t len, cidlen;
    char text[]; /* the filter, then the client id */
} claim_t;

static struct {
    pthread_mutex_t lock;
    claim_t **buckets;
    size_t nbuckets, n;
    atomic_uint_fast64_t refused;
} ex = {.lock = PTHREAD_MUTEX_INITIALIZER};

bool rt_exclusive_strip(mqtt_str_t *filter)
{
    size_t plen = sizeof(RT_EXCLUSIVE_PREFIX) - 1;
    if (filter->len < plen || memcmp(filter->p, RT_EXCLUSIVE_PREFIX, plen) != 0)
        return false;
    *filter = (mqtt_str_t){filter->p + plen, filter->len - (uint32_t)plen};
    return true;
}

/* Under the lock: the link that points at filter's claim (or at the NULL ending its chain). */
static claim_t **find(const char *filter, size_t len, uint64_t hash)
{
    claim_t **at = &ex.buckets[hash & (ex.nbuckets - 1)];
    while (*at && !((*at)->hash == hash && (*at)->len == len && !memcmp((*at)->text, filter, len)))
        at = &(*at)->next;
    return at;
}

/* Under the lock: twice the buckets once claims outnumber them twice; false if no memory. */
static bool room_for_one(void)
{
    if (ex.buckets && ex.n < 2 * ex.nbuckets)
        return true;
    size_t nb = ex.nbuckets ? 2 * ex.nbuckets : 64;
    claim_t **b = calloc(nb, sizeof(*b));
    if (!b)
        return ex.buckets != NULL; /* a longer chain still works */
    for (size_t i = 0; i < ex.nbuckets; i++)
        for (claim_t *c = ex.buckets[i], *next; c; c = next) {
            next = c->next;
            c->next = b[c->hash & (nb - 1)];
            b[c->hash & (nb - 1)] = c;
        }
    free(ex.buckets);
    ex.buckets = b;
    ex.nbuckets = nb;
    return true;
}

int rt_exclusive_claim(const char *filter, size_t len, const char *cid, rt_pid_t pid, size_t *bytes)
{
    *bytes = 0;
    size_t cidlen = strlen(cid);
    uint64_t hash = rt_hash(filter, len);
    pthread_mutex_lock(&ex.lock);
    if (!room_for_one()) {
        pthread_mutex_unlock(&ex.lock);
        return RT_ENOMEM;
    }
    claim_t **at = find(filter, len, hash);
    int rc = 0;
    if (*at) {
        claim_t *c = *at;
        if (c->cidlen == cidlen && !memcmp(c->text + c->len, cid, cidlen)) {
            /* Its own: the session moved to this actor, which carries the claim from now on
               (the one it left keeps its charge until it ends, and releases nothing). */
            if (c->pid != pid)
                *bytes = sizeof(*c) + c->len + c->cidlen;
            c->pid = pid;
        } else {
            rc = RT_EEXIST;
        }
    } else {
        claim_t *c = malloc(sizeof(*c) + len + cidlen);
        if (c) {
            *c = (claim_t){
                .hash = hash, .pid = pid, .len = (uint16_t)len, .cidlen = (uint16_t)cidlen};
            memcpy(c->text, filter, len);
            memcpy(c->text + len, cid, cidlen);
            *at = c;
            ex.n++;
            *bytes = sizeof(*c) + len + cidlen;
        } else {
            rc = RT_ENOMEM;
        }
    }
    pthread_mutex_unlock(&ex.lock);
    if (rc == RT_EEXIST)
        atomic_fetch_add(&ex.refused, 1);
    return rc;
}

size_t rt_exclusive_release(const char *filter, size_t len, rt_pid_t pid)
{
    uint64_t hash = rt_hash(filter, len);
    size_t bytes = 0;
    pthread_mutex_lock(&ex.lock);
    claim_t **at = ex.buckets ? find(filter, len, hash) : NULL;
    if (at && *at && (*at)->pid == pid) {
        claim_t *c = *at;
        *at = c->next;
        ex.n--;
        bytes = sizeof(*c) + c->len + c->cidlen;
        free(c);
    }
    pthread_mutex_unlock(&ex.lock);
    return bytes;
}

void rt_exclusive_stats(rt_exclusive_stats_t *out)
{
    pthread_mutex_lock(&ex.lock);
    out->held = ex.n;
    pthread_mutex_unlock(&ex.lock);
    out->refused = atomic_load(&ex.refused);
}

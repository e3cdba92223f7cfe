/*
** The name registry (Erlang's register/whereis). Lookups take a read lock;
** entries are retired through EBR rather than freed, because snapshots read
** an actor's name without taking the lock.
*/
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct rt_reg_entry_s {
    struct rt_reg_entry_s *next;
    rt_pid_t pid;
    rt_actor_t *actor;
    rt_retired_t retired;
    char name[];
} rt_reg_entry_t;

#define RT_NAME_MAX 255 /* bytes in a registered name */

static uint64_t hash_name(const char *s)
{
    return rt_hash(s, strlen(s));
}

void rt__registry_init(rt_runtime_t *rt)
{
    pthread_rwlock_init(&rt->reg_lock, NULL);
    rt->reg_cap = 256;
    rt->reg = calloc(rt->reg_cap, sizeof(*rt->reg));
    rt->reg_len = 0;
}

static void free_entry(rt_retired_t *r)
{
    free(RT_CONTAINER_OF(r, rt_reg_entry_t, retired));
}

void rt__registry_destroy(rt_runtime_t *rt)
{
    for (size_t i = 0; rt->reg && i < rt->reg_cap; i++) {
        rt_reg_entry_t *e = rt->reg[i];
        while (e) {
            rt_reg_entry_t *next = e->next;
            free(e);
            e = next;
        }
    }
    free(rt->reg);
    rt->reg = NULL;
    pthread_rwlock_destroy(&rt->reg_lock);
}

static void grow(rt_runtime_t *rt)
{
    size_t cap = rt->reg_cap * 2;
    rt_reg_entry_t **n = calloc(cap, sizeof(*n));
    if (!n)
        return; /* a longer chain is still correct */
    for (size_t i = 0; i < rt->reg_cap; i++) {
        rt_reg_entry_t *e = rt->reg[i];
        while (e) {
            rt_reg_entry_t *next = e->next;
            size_t b = hash_name(e->name) & (cap - 1);
            e->next = n[b];
            n[b] = e;
            e = next;
        }
    }
    free(rt->reg);
    rt->reg = n;
    rt->reg_cap = cap;
}

/* Unlinks the entry for name under the write lock; returns it or NULL. */
static rt_reg_entry_t *unlink_entry(rt_runtime_t *rt, const char *name)
{
    rt_reg_entry_t **pp = &rt->reg[hash_name(name) & (rt->reg_cap - 1)];
    for (; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            rt_reg_entry_t *e = *pp;
            *pp = e->next;
            rt->reg_len--;
            return e;
        }
    }
    return NULL;
}

static void retire_entry(rt_reg_entry_t *e)
{
    e->retired.reclaim = free_entry;
    bool ext = rt__tls.ebr == NULL;
    if (ext)
        rt__external_enter();
    rt__ebr_retire(rt__tls.ebr, &e->retired);
    if (ext)
        rt__external_leave();
}

int rt_register(rt_actor_t *self, const char *name)
{
    rt_runtime_t *rt = rt__rt;
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > RT_NAME_MAX)
        return RT_EINVAL;
    if (atomic_load_explicit(&self->name, memory_order_relaxed))
        return RT_EEXIST; /* one name per actor, as in Erlang */
    rt_reg_entry_t *e = malloc(sizeof(*e) + len + 1);
    if (!e)
        return RT_ENOMEM;
    memcpy(e->name, name, len + 1);
    e->pid = self->pid;
    e->actor = self;
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t b = hash_name(name) & (rt->reg_cap - 1);
    for (rt_reg_entry_t *x = rt->reg[b]; x; x = x->next) {
        if (strcmp(x->name, name) == 0) {
            pthread_rwlock_unlock(&rt->reg_lock);
            free(e);
            return RT_EEXIST;
        }
    }
    e->next = rt->reg[b];
    rt->reg[b] = e;
    if (++rt->reg_len > rt->reg_cap)
        grow(rt);
    atomic_store_explicit(&self->name, e->name, memory_order_release);
    pthread_rwlock_unlock(&rt->reg_lock);
    return 0;
}

int rt_unregister(const char *name)
{
    rt_runtime_t *rt = rt__rt;
    pthread_rwlock_wrlock(&rt->reg_lock);
    rt_reg_entry_t *e = unlink_entry(rt, name);
    if (e)
        atomic_store_explicit(&e->actor->name, NULL, memory_order_release);
    pthread_rwlock_unlock(&rt->reg_lock);
    if (!e)
        return RT_ENOTFOUND;
    retire_entry(e);
    return 0;
}

void rt__registry_remove_actor(rt_actor_t *a)
{
    rt_runtime_t *rt = rt__rt;
    if (!atomic_load_explicit(&a->name, memory_order_relaxed))
        return;
    pthread_rwlock_wrlock(&rt->reg_lock);
    char *name = atomic_load_explicit(&a->name, memory_order_relaxed);
    rt_reg_entry_t *e = name ? unlink_entry(rt, name) : NULL;
    atomic_store_explicit(&a->name, NULL, memory_order_release);
    pthread_rwlock_unlock(&rt->reg_lock);
    if (e)
        retire_entry(e);
}

rt_pid_t rt_whereis(const char *name)
{
    rt_runtime_t *rt = rt__rt;
    if (!rt || !name)
        return 0;
    rt_pid_t pid = 0;
    pthread_rwlock_rdlock(&rt->reg_lock);
    for (rt_reg_entry_t *e = rt->reg[hash_name(name) & (rt->reg_cap - 1)]; e; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            pid = e->pid;
            break;
        }
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    return pid;
}

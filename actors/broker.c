#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "log.h"

rt_broker_t *rt_broker;

typedef struct rt_client_entry_s {
    struct rt_client_entry_s *next;
    rt_pid_t pid;
    char id[];
} rt_client_entry_t;

static uint64_t hash_id(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

void rt_broker_retained_release(void *msg)
{
    rt_retained_msg_t *r = msg;
    rt_bin_release(r->bin);
    free(r);
}

int rt_broker_start(const rt_conf_t *conf, char *err, size_t errlen)
{
    rt_broker_t *b = calloc(1, sizeof(*b));
    if (!b)
        return RT_ENOMEM;
    b->conf = *conf;
    pthread_mutex_init(&b->clients_lock, NULL);
    b->clients_cap = 1024;
    b->clients = calloc(b->clients_cap, sizeof(*b->clients));
    if (!b->clients || rt_trie_new(&b->trie) ||
        rt_retained_new(&b->retained, rt_broker_retained_release, 0, 0)) {
        rt_trie_free(b->trie);
        free(b->clients);
        free(b);
        return RT_ENOMEM;
    }
    rt_broker = b;
    for (unsigned i = 0; i < conf->nlisteners; i++) {
        rt_pid_t pid;
        int rc = rt_spawn(&rt_listener_type, (void *)&rt_broker->conf.listeners[i], &pid);
        if (rc) {
            snprintf(err, errlen, "cannot listen on %s:%d: %s", conf->listeners[i].host,
                     conf->listeners[i].port,
                     rc == RT_EEXIST ? "address already in use" : rt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

void rt_broker_free(void)
{
    rt_broker_t *b = rt_broker;
    if (!b)
        return;
    for (size_t i = 0; i < b->clients_cap; i++) {
        rt_client_entry_t *e = b->clients[i];
        while (e) {
            rt_client_entry_t *next = e->next;
            free(e);
            e = next;
        }
    }
    free(b->clients);
    rt_trie_free(b->trie);
    rt_retained_free(b->retained);
    pthread_mutex_destroy(&b->clients_lock);
    free(b);
    rt_broker = NULL;
}

/* Finds id's entry in its bucket; call with clients_lock held. */
static rt_client_entry_t *find_client(rt_broker_t *b, const char *id)
{
    rt_client_entry_t *e = b->clients[hash_id(id) & (b->clients_cap - 1)];
    while (e && strcmp(e->id, id) != 0)
        e = e->next;
    return e;
}

/* Doubles the bucket array once entries outnumber buckets; a failed grow keeps the old one. */
static void grow_clients(rt_broker_t *b)
{
    size_t cap = b->clients_cap * 2;
    rt_client_entry_t **nb = calloc(cap, sizeof(*nb));
    if (!nb)
        return;
    for (size_t i = 0; i < b->clients_cap; i++) {
        rt_client_entry_t *e = b->clients[i];
        while (e) {
            rt_client_entry_t *next = e->next;
            size_t k = hash_id(e->id) & (cap - 1);
            e->next = nb[k];
            nb[k] = e;
            e = next;
        }
    }
    free(b->clients);
    b->clients = nb;
    b->clients_cap = cap;
}

rt_pid_t rt_broker_claim_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    rt_pid_t old = 0;
    pthread_mutex_lock(&b->clients_lock);
    rt_client_entry_t *e = find_client(b, id);
    if (e) {
        old = e->pid;
        e->pid = pid;
    } else {
        if (b->clients_len >= b->clients_cap)
            grow_clients(b);
        size_t len = strlen(id);
        e = malloc(sizeof(*e) + len + 1);
        if (e) {
            size_t bucket = hash_id(id) & (b->clients_cap - 1);
            memcpy(e->id, id, len + 1);
            e->pid = pid;
            e->next = b->clients[bucket];
            b->clients[bucket] = e;
            b->clients_len++;
        }
    }
    pthread_mutex_unlock(&b->clients_lock);
    return old;
}

rt_pid_t rt_broker_lookup_client(const char *id)
{
    rt_broker_t *b = rt_broker;
    pthread_mutex_lock(&b->clients_lock);
    rt_client_entry_t *e = find_client(b, id);
    rt_pid_t pid = e ? e->pid : 0;
    pthread_mutex_unlock(&b->clients_lock);
    return pid;
}

void rt_broker_release_client(const char *id, rt_pid_t pid)
{
    rt_broker_t *b = rt_broker;
    size_t bucket = hash_id(id) & (b->clients_cap - 1);
    pthread_mutex_lock(&b->clients_lock);
    for (rt_client_entry_t **pp = &b->clients[bucket]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, id) == 0) {
            rt_client_entry_t *e = *pp;
            if (e->pid == pid) {
                *pp = e->next;
                free(e);
                b->clients_len--;
            }
            break;
        }
    }
    pthread_mutex_unlock(&b->clients_lock);
}

/* ---- Listener ---- */

typedef struct {
    rt_sock_t *sock;
    const rt_listen_t *where;
} listener_t;

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    listener_t *l = state;
    l->where = arg;
    int rc = rt_tcp_listen(self, l->where->host, l->where->port, 4096, &l->sock);
    if (rc == 0)
        rt_log(RT_LOG_INFO, "listener.started", "%s:%d", l->where->host,
               rt_sock_local_port(l->sock));
    return rc;
}

static void listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    listener_t *l = state;
    if (m->tag != RT_MSG_SOCKET)
        return;
    /* Bounded work per turn: the runtime posts another event while more are waiting. */
    for (int i = 0; i < 64; i++) {
        int fd;
        int rc = rt_sock_accept(l->sock, &fd);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            rt_log(RT_LOG_WARNING, "listener.accept", "%s:%d: %s", l->where->host,
                   l->where->port, rt_strerror(rc));
            return;
        }
        if ((long)atomic_load(&rt_broker->stats.sockets) >= rt_broker->conf.max_connections) {
            atomic_fetch_add(&rt_broker->stats.refused, 1);
            close(fd);
            continue;
        }
        rt_pid_t pid;
        if (rt_spawn(&rt_conn_type, (void *)(intptr_t)fd, &pid) != 0) {
            atomic_fetch_add(&rt_broker->stats.refused, 1);
            close(fd);
        }
    }
}

const rt_actor_type_t rt_listener_type = {
    .name = "listener",
    .state_size = sizeof(listener_t),
    .init = listener_init,
    .handle = listener_handle,
};

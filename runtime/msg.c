/*
** Message envelopes come from per-thread pools by size class, so the hot path
** of a send is a free-list pop with no lock. Envelopes are usually freed on
** the receiver's thread, so pools drift: a thread whose list grows past
** RT_MSG_POOL_HIGH hands a batch to a global depot, and a thread that runs dry
** takes a batch from it before falling back to malloc (Pony's pool does the
** same with its global free lists).
*/
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define RT_MSG_CLASSES 6
#define RT_MSG_POOL_HIGH 1024 /* envelopes cached per thread and class before giving back */
#define RT_MSG_POOL_BATCH 512 /* envelopes moved between a thread and the depot at once */
#define RT_MSG_HUGE 0xff      /* size_class of envelopes too big to pool */
#define RT_MSG_DEPOT_MAX 32   /* batches kept per class; a burst beyond goes back to malloc */

static const size_t class_size[RT_MSG_CLASSES] = {64, 128, 256, 512, 1024, 2048};

typedef struct batch_s {
    rt_msg_t *first;
    struct batch_s *next_batch; /* stored in the first envelope's data */
} batch_t;

typedef struct {
    rt_msg_t *free[RT_MSG_CLASSES];
    uint32_t count[RT_MSG_CLASSES];
} thread_pool_t;

static _Thread_local thread_pool_t tpool;
static _Thread_local bool tpool_registered;

/* Any thread that sends may cache envelopes; they are given back when it exits. */
static pthread_key_t tpool_key;
static pthread_once_t tpool_key_once = PTHREAD_ONCE_INIT;

static void tpool_thread_exit(void *unused)
{
    (void)unused;
    rt__msg_pool_flush();
}

static void tpool_key_create(void)
{
    pthread_key_create(&tpool_key, tpool_thread_exit);
}

static void tpool_register(void)
{
    pthread_once(&tpool_key_once, tpool_key_create);
    pthread_setspecific(tpool_key, &tpool);
    tpool_registered = true;
}

static pthread_mutex_t depot_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_msg_t *depot[RT_MSG_CLASSES]; /* batches chained through data[] */
static unsigned depot_batches[RT_MSG_CLASSES];

static int class_of(size_t total)
{
    for (int c = 0; c < RT_MSG_CLASSES; c++)
        if (total <= class_size[c])
            return c;
    return -1;
}

/* A batch is a list linked by next; batches in the depot are chained through data. */
static rt_msg_t **batch_link(rt_msg_t *first)
{
    return (rt_msg_t **)(void *)first->data;
}

static void refill(int c)
{
    pthread_mutex_lock(&depot_lock);
    rt_msg_t *b = depot[c];
    if (b) {
        depot[c] = *batch_link(b);
        depot_batches[c]--;
    }
    pthread_mutex_unlock(&depot_lock);
    if (!b)
        return;
    uint32_t n = 0;
    for (rt_msg_t *m = b; m; m = atomic_load_explicit(&m->next, memory_order_relaxed))
        n++;
    tpool.free[c] = b;
    tpool.count[c] = n;
}

static void free_list(rt_msg_t *m)
{
    while (m) {
        rt_msg_t *next = atomic_load_explicit(&m->next, memory_order_relaxed);
        free(m);
        m = next;
    }
}

static void spill(int c)
{
    rt_msg_t *first = tpool.free[c];
    rt_msg_t *last = first;
    for (int i = 1; i < RT_MSG_POOL_BATCH; i++)
        last = atomic_load_explicit(&last->next, memory_order_relaxed);
    tpool.free[c] = atomic_load_explicit(&last->next, memory_order_relaxed);
    tpool.count[c] -= RT_MSG_POOL_BATCH;
    atomic_store_explicit(&last->next, NULL, memory_order_relaxed);
    pthread_mutex_lock(&depot_lock);
    bool keep = depot_batches[c] < RT_MSG_DEPOT_MAX;
    if (keep) {
        *batch_link(first) = depot[c];
        depot[c] = first;
        depot_batches[c]++;
    }
    pthread_mutex_unlock(&depot_lock);
    if (!keep)
        free_list(first);
}

rt_msg_t *rt_msg_new(uint32_t tag, size_t len)
{
    if (len > UINT32_MAX - sizeof(rt_msg_t))
        return NULL;
    size_t total = sizeof(rt_msg_t) + len;
    int c = class_of(total);
    rt_msg_t *m;
    if (c < 0) {
        m = malloc(total);
        if (!m)
            return NULL;
        m->size_class = RT_MSG_HUGE;
    } else {
        if (RT_UNLIKELY(!tpool_registered))
            tpool_register();
        if (!tpool.free[c])
            refill(c);
        m = tpool.free[c];
        if (m) {
            tpool.free[c] = atomic_load_explicit(&m->next, memory_order_relaxed);
            tpool.count[c]--;
        } else {
            m = malloc(class_size[c]);
            if (!m)
                return NULL;
        }
        m->size_class = (uint8_t)c;
    }
    atomic_store_explicit(&m->next, NULL, memory_order_relaxed);
    m->tag = tag;
    m->len = (uint32_t)len;
    m->from = 0;
    m->bin = NULL;
    m->flags = 0;
    return m;
}

void rt_msg_free(rt_msg_t *m)
{
    if (!m)
        return;
    if (m->bin)
        rt_bin_release(m->bin);
    if (m->size_class == RT_MSG_HUGE) {
        free(m);
        return;
    }
    int c = m->size_class;
    if (RT_UNLIKELY(!tpool_registered))
        tpool_register();
    RT_POISON(m->data, class_size[c] - sizeof(rt_msg_t));
    atomic_store_explicit(&m->next, tpool.free[c], memory_order_relaxed);
    tpool.free[c] = m;
    if (++tpool.count[c] > RT_MSG_POOL_HIGH)
        spill(c);
}

rt_bin_t *rt_msg_take_bin(rt_msg_t *m)
{
    rt_bin_t *b = m->bin;
    m->bin = NULL;
    return b;
}

void rt__msg_pool_flush(void)
{
    for (int c = 0; c < RT_MSG_CLASSES; c++) {
        free_list(tpool.free[c]);
        tpool.free[c] = NULL;
        tpool.count[c] = 0;
    }
}

void rt__msg_pool_destroy(void)
{
    rt__msg_pool_flush();
    pthread_mutex_lock(&depot_lock);
    for (int c = 0; c < RT_MSG_CLASSES; c++) {
        rt_msg_t *b = depot[c];
        while (b) {
            rt_msg_t *next_batch = *batch_link(b);
            free_list(b);
            b = next_batch;
        }
        depot[c] = NULL;
        depot_batches[c] = 0;
    }
    pthread_mutex_unlock(&depot_lock);
}

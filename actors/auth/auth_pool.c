/*
** The authenticator pool (auth_http.h): threads of their own that decide the logins whose
** chain calls a service, each a whole rt_auth_decide that may wait on the network, so that
** neither a scheduler nor the blocking pool (the store's, the sinks') ever waits for one. A
** bounded queue of the verifier's requests feeds them; the answer goes back to the connection
** as the verifier's would.
*/
#include <pthread.h>
#include <stdlib.h>

#include "auth_http.h"
#include "auth_impl.h"

#define POOL_QUEUE_MAX 4096 /* logins waiting for a thread; past it: unavailable at once */
#define POOL_THREADS_MAX 64

static struct {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    rt_msg_t *queue[POOL_QUEUE_MAX];
    size_t head, n;
    pthread_t threads[POOL_THREADS_MAX];
    unsigned nthreads;
    bool stopping;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .ready = PTHREAD_COND_INITIALIZER};

static void *pool_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (!pool.n && !pool.stopping)
            pthread_cond_wait(&pool.ready, &pool.lock);
        if (pool.stopping)
            break;
        rt_msg_t *m = pool.queue[pool.head];
        pool.head = (pool.head + 1) % POOL_QUEUE_MAX;
        pool.n--;
        pthread_mutex_unlock(&pool.lock);
        rt__auth_verify_msg(m);
        rt_msg_free(m);
        pthread_mutex_lock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

int rt__auth_pool_start(unsigned threads)
{
    if (threads > POOL_THREADS_MAX)
        threads = POOL_THREADS_MAX;
    pthread_mutex_lock(&pool.lock);
    pool.stopping = false;
    int rc = 0;
    while (pool.nthreads < threads && rc == 0) {
        rc = pthread_create(&pool.threads[pool.nthreads], NULL, pool_thread, NULL) ? RT_ENOMEM : 0;
        if (rc == 0)
            pool.nthreads++;
    }
    pthread_mutex_unlock(&pool.lock);
    return rc;
}

bool rt__auth_pool_running(void)
{
    pthread_mutex_lock(&pool.lock);
    bool on = pool.nthreads > 0 && !pool.stopping;
    pthread_mutex_unlock(&pool.lock);
    return on;
}

void rt__auth_pool_stop(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stopping = true;
    pthread_cond_broadcast(&pool.ready);
    unsigned n = pool.nthreads;
    pthread_mutex_unlock(&pool.lock);
    for (unsigned i = 0; i < n; i++)
        pthread_join(pool.threads[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.nthreads = 0;
    while (pool.n) { /* nobody will decide these: the connections ask again or time out */
        rt_msg_t *m = pool.queue[pool.head];
        pool.head = (pool.head + 1) % POOL_QUEUE_MAX;
        pool.n--;
        rt__auth_verify_dead(m);
        rt_msg_free(m);
    }
    pthread_mutex_unlock(&pool.lock);
}

int rt__auth_pool_push(rt_msg_t *m)
{
    pthread_mutex_lock(&pool.lock);
    int rc = !pool.nthreads || pool.stopping ? RT_ENOPROC
             : pool.n == POOL_QUEUE_MAX      ? RT_ELIMIT
                                             : 0;
    if (rc == 0) {
        pool.queue[(pool.head + pool.n) % POOL_QUEUE_MAX] = m;
        pool.n++;
        pthread_cond_signal(&pool.ready);
    }
    pthread_mutex_unlock(&pool.lock);
    return rc;
}

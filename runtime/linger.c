/*
** Closing a connection the server ends without destroying its last words. close() on a
** socket whose receive queue holds bytes not yet read sends RST at once, and a peer that
** gets RST fails its next write and may never read what was sent before it: the DISCONNECT
** with its reason code, or a refusing CONNACK, from a server that ends a client still
** writing (one past its Receive Maximum still answering the PUBRECs it was sent). So such a
** socket's write side is shut after its last bytes (FIN) and whatever the peer still sends
** is read and dropped, by one thread of the runtime's own, until the peer closes too,
** RT_LINGER_MS have passed or RT_LINGER_BYTES were dropped; then it is closed (nginx's
** lingering_close). At most RT_LINGER_MAX sockets linger at once: past that one is closed
** at once, as before.
*/
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

#define RT_LINGER_MS 2000           /* how long a peer may go on writing into a closed socket */
#define RT_LINGER_BYTES (1u << 20)  /* how much of that is read and dropped */
#define RT_LINGER_MAX 1024          /* sockets lingering at once */
#define RT_LINGER_SCRATCH (64 * 1024)

typedef struct {
    int fd;               /* -1: free */
    uint64_t deadline_ms; /* closed then, whatever the peer does */
    uint32_t dropped;     /* bytes read and dropped */
} linger_t;

static struct {
    pthread_once_t once;
    pthread_mutex_t lock; /* the table */
    int epfd;             /* -1: no thread (it could not start): sockets close at once */
    linger_t table[RT_LINGER_MAX];
    atomic_uint lingering; /* sockets in the table */
} L = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER, .epfd = -1};

static void forget(linger_t *l)
{
    epoll_ctl(L.epfd, EPOLL_CTL_DEL, l->fd, NULL);
    close(l->fd);
    l->fd = -1;
    atomic_fetch_sub(&L.lingering, 1);
}

/* Reads what the peer sent and drops it; true once the socket is done (EOF, error, bound). */
static bool drain(linger_t *l, unsigned char *scratch)
{
    for (;;) {
        ssize_t n = read(l->fd, scratch, RT_LINGER_SCRATCH);
        if (n > 0) {
            l->dropped += (uint32_t)n;
            if (l->dropped >= RT_LINGER_BYTES)
                return true;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    }
}

static void *linger_thread(void *arg)
{
    (void)arg;
    static unsigned char scratch[RT_LINGER_SCRATCH];
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(L.epfd, evs, 64, 250);
        uint64_t now = rt_mono_ms();
        pthread_mutex_lock(&L.lock);
        for (int i = 0; i < n; i++) {
            linger_t *l = evs[i].data.ptr;
            if (l->fd >= 0 && drain(l, scratch))
                forget(l);
        }
        for (size_t i = 0; i < RT_LINGER_MAX && atomic_load(&L.lingering); i++)
            if (L.table[i].fd >= 0 && now >= L.table[i].deadline_ms)
                forget(&L.table[i]);
        pthread_mutex_unlock(&L.lock);
    }
    return NULL;
}

static void linger_start(void)
{
    for (size_t i = 0; i < RT_LINGER_MAX; i++)
        L.table[i].fd = -1;
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        return;
    L.epfd = epfd;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, linger_thread, NULL) != 0) {
        close(epfd);
        L.epfd = -1;
    }
    pthread_attr_destroy(&attr);
}

void rt__fd_linger(int fd)
{
    pthread_once(&L.once, linger_start);
    if (L.epfd < 0 || shutdown(fd, SHUT_WR) != 0) {
        close(fd);
        return;
    }
    pthread_mutex_lock(&L.lock);
    linger_t *l = NULL;
    for (size_t i = 0; i < RT_LINGER_MAX && !l; i++)
        if (L.table[i].fd < 0)
            l = &L.table[i];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = l};
    if (!l || epoll_ctl(L.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pthread_mutex_unlock(&L.lock);
        close(fd); /* too many lingering already: the peer may see RST, as it used to */
        return;
    }
    *l = (linger_t){.fd = fd, .deadline_ms = rt_mono_ms() + RT_LINGER_MS};
    atomic_fetch_add(&L.lingering, 1);
    pthread_mutex_unlock(&L.lock);
}

unsigned rt_sock_lingering(void)
{
    return atomic_load(&L.lingering);
}

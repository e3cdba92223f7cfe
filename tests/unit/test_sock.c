/* Sockets: listen/accept/read/write owned by actors, many clients, write backpressure. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h" /* RT_AF_LOW: the lane an actor is queued in */
#include "rt_test.h"

enum { MSG_PUSH = RT_MSG_USER, MSG_FEED };

static atomic_int listen_port;
static atomic_long conns_accepted;
static atomic_long conns_closed;
static atomic_long bytes_echoed;

/* ---- Echo connection ---- */
typedef struct {
    rt_sock_t *sock;
    bool small_sndbuf; /* the backpressure test's connection */
} conn_state_t;

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_state_t *st = state;
    return rt_sock_adopt(self, (int)(intptr_t)arg, &st->sock);
}

static void on_push(conn_state_t *st, rt_msg_t *m);

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_state_t *st = state;
    if (m->tag == MSG_PUSH) {
        on_push(st, m);
        return;
    }
    if (m->tag != RT_MSG_SOCKET)
        return;
    rt_sock_event_t *ev = (rt_sock_event_t *)(void *)m->data;
    if (!(ev->events & RT_SOCK_READABLE))
        return;
    /* Bounded work per turn: at most 8 reads, then the runtime re-posts the event. */
    for (int i = 0; i < 8; i++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(st->sock, &data, &len);
        if (rc == RT_EAGAIN)
            return;
        if (rc != 0) {
            atomic_fetch_add(&conns_closed, 1);
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        if (rt_sock_write(st->sock, data, len) != 0) {
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        atomic_fetch_add(&bytes_echoed, (long)len);
    }
}

static const rt_actor_type_t conn_type = {.name = "echo_conn",
                                          .state_size = sizeof(conn_state_t),
                                          .init = conn_init,
                                          .handle = conn_handle};

/* ---- Listener ---- */
typedef struct {
    rt_sock_t *sock;
} listener_state_t;

static atomic_long last_conn_pid;
/* Accepted sockets with TCP_NODELAY (inherited from the listener), and with accept's address
   of the peer (127.0.0.1) handed over. */
static atomic_long accepted_nodelay, accepted_with_peer;

static int listener_init(rt_actor_t *self, void *state, void *arg)
{
    listener_state_t *st = state;
    int rc = rt_tcp_listen(self, "127.0.0.1", 0, 1024, &st->sock);
    if (rc == 0)
        atomic_store(&listen_port, rt_sock_local_port(st->sock));
    return rc;
}

static void listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    listener_state_t *st = state;
    if (m->tag != RT_MSG_SOCKET)
        return;
    int fd;
    struct sockaddr_storage peer;
    while (rt_sock_accept(st->sock, &fd, &peer) == 0) {
        int nodelay = 0;
        socklen_t len = sizeof(nodelay);
        if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0 && nodelay)
            atomic_fetch_add(&accepted_nodelay, 1);
        if (peer.ss_family == AF_INET &&
            ((struct sockaddr_in *)&peer)->sin_addr.s_addr == htonl(INADDR_LOOPBACK))
            atomic_fetch_add(&accepted_with_peer, 1);
        rt_pid_t pid;
        if (rt_spawn(&conn_type, (void *)(intptr_t)fd, &pid) == 0) {
            atomic_fetch_add(&conns_accepted, 1);
            atomic_store(&last_conn_pid, (long)pid);
        } else {
            close(fd);
        }
    }
}

static const rt_actor_type_t listener_type = {.name = "listener",
                                              .state_size = sizeof(listener_state_t),
                                              .init = listener_init,
                                              .handle = listener_handle};

/* rcvbuf > 0 shrinks the client's receive buffer first, as a window must be set before connect. */
static int connect_local_rcvbuf(int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)atomic_load(&listen_port))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int connect_local(void)
{
    return connect_local_rcvbuf(0);
}

/* Writes and reads concurrently so neither side's buffer can deadlock the exchange. */
typedef struct {
    size_t bytes;
    bool ok;
} client_arg_t;

static void *client_main(void *p)
{
    client_arg_t *c = p;
    int fd = connect_local();
    c->ok = false;
    if (fd < 0)
        return NULL;
    unsigned char out[8192], in[8192];
    size_t sent = 0, recvd = 0;
    bool match = true;
    uint64_t end = test_now_ms() + 30000;
    while (recvd < c->bytes && test_now_ms() < end) {
        struct pollfd pfd = {fd, POLLIN | (sent < c->bytes ? POLLOUT : 0), 0};
        poll(&pfd, 1, 100);
        if ((pfd.revents & POLLOUT) && sent < c->bytes) {
            size_t n = c->bytes - sent < sizeof(out) ? c->bytes - sent : sizeof(out);
            for (size_t i = 0; i < n; i++)
                out[i] = (unsigned char)((sent + i) * 7);
            ssize_t w = send(fd, out, n, MSG_DONTWAIT);
            if (w > 0)
                sent += (size_t)w;
        }
        if (pfd.revents & POLLIN) {
            ssize_t r = recv(fd, in, sizeof(in), MSG_DONTWAIT);
            if (r <= 0)
                break;
            for (ssize_t i = 0; i < r; i++)
                match &= in[i] == (unsigned char)((recvd + (size_t)i) * 7);
            recvd += (size_t)r;
        }
    }
    close(fd);
    c->ok = match && recvd == c->bytes;
    return NULL;
}

static rt_pid_t start_listener(void)
{
    rt_pid_t l;
    atomic_store(&listen_port, 0);
    CHECK_EQ(rt_spawn(&listener_type, NULL, &l), 0);
    CHECK(atomic_load(&listen_port) > 0);
    return l;
}

static void test_echo_many_clients(void)
{
    rt_pid_t l = start_listener();
    long closed0 = atomic_load(&conns_closed), echoed0 = atomic_load(&bytes_echoed);
    enum { CLIENTS = 32 };
    pthread_t th[CLIENTS];
    client_arg_t args[CLIENTS];
    size_t bytes = (size_t)check_scale(1 << 20);
    for (int i = 0; i < CLIENTS; i++) {
        args[i].bytes = bytes;
        pthread_create(&th[i], NULL, client_main, &args[i]);
    }
    int ok = 0;
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
    }
    CHECK_EQ(ok, CLIENTS);
    CHECK(wait_at_least(&conns_closed, closed0 + CLIENTS)); /* every close seen */
    CHECK_EQ(atomic_load(&bytes_echoed) - echoed0, (long)(bytes * CLIENTS));
    CHECK_EQ(atomic_load(&accepted_nodelay), atomic_load(&conns_accepted));
    CHECK_EQ(atomic_load(&accepted_with_peer), atomic_load(&conns_accepted));
    CHECK(wait_alive(1));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* An idle connection holds no read buffer: its actor's heap stays empty. */
static void test_idle_conn_holds_nothing(void)
{
    rt_pid_t l = start_listener();
    long before = atomic_load(&conns_accepted);
    int fd = connect_local();
    CHECK(fd >= 0);
    send(fd, "ping", 4, 0);
    char buf[4];
    CHECK_EQ(recv(fd, buf, 4, MSG_WAITALL), 4);
    CHECK(wait_at_least(&conns_accepted, before + 1));
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info((rt_pid_t)atomic_load(&last_conn_pid), &info), 0);
    CHECK_EQ(info.heap_bytes, 0);
    for (int i = 0; i < 100 && info.mailbox_len; i++) {
        test_sleep_ms(5);
        rt_actor_info((rt_pid_t)atomic_load(&last_conn_pid), &info);
    }
    CHECK_EQ(info.mailbox_len, 0);
    CHECK(info.scheduler >= 0); /* it ran: the scheduler of its latest turn */
    close(fd);
    CHECK(wait_alive(1));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/*
** A peer that does not read, fed by FEEDERS actors in 16 KiB messages. rt.h's
** bound: the owner handles no message from a feeder while its output is past
** the mark, so the buffer never passes mark + one message; and a feeder sends at
** most one message after the owner crossed the mark before it is parked.
** The kernel's share is made smaller than the mark (8 KiB send buffer, 4 KiB
** receive buffer), so once the mark is passed nothing can drain it until the
** peer reads: there is exactly one crossing to count from.
*/
enum { FEEDERS = 2, CHUNK = 16384 };

static atomic_long feeder_sent[FEEDERS]; /* counted before each send */
static atomic_long sent_at_crossing[FEEDERS];
static atomic_long crossings;
static atomic_long pushes_over_mark; /* pushes handled while the buffer was past the mark */
static atomic_long max_pending;
static atomic_bool stop_feeding;
static atomic_long feeders_stopped;

static void on_push(conn_state_t *st, rt_msg_t *m)
{
    if (!st->small_sndbuf) {
        int sndbuf = 8192;
        setsockopt(rt_sock_fd(st->sock), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
        st->small_sndbuf = true;
    }
    long before = (long)rt_sock_pending(st->sock);
    if (before > RT_SOCK_HIGH_WATER)
        atomic_fetch_add(&pushes_over_mark, 1);
    rt_sock_write(st->sock, m->data, m->len);
    long after = (long)rt_sock_pending(st->sock);
    if (before <= RT_SOCK_HIGH_WATER && after > RT_SOCK_HIGH_WATER) {
        for (int i = 0; i < FEEDERS; i++)
            atomic_store(&sent_at_crossing[i], atomic_load(&feeder_sent[i]));
        atomic_fetch_add(&crossings, 1);
    }
    long mx = atomic_load(&max_pending);
    while (after > mx && !atomic_compare_exchange_weak(&max_pending, &mx, after))
        ;
}

typedef struct {
    rt_pid_t conn;
    int index;
    bool stopped;
} feeder_state_t;

/* Sends one chunk per message it handles, and a message to itself for the next one. */
static void feeder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    feeder_state_t *st = state;
    if (m->tag == MSG_FEED && m->len == sizeof(long) * 2) {
        st->conn = (rt_pid_t)((long *)(void *)m->data)[0];
        st->index = (int)((long *)(void *)m->data)[1];
    }
    if (st->stopped)
        return;
    if (atomic_load(&stop_feeding)) {
        st->stopped = true;
        atomic_fetch_add(&feeders_stopped, 1);
        return;
    }
    rt_msg_t *c = rt_msg_new(MSG_PUSH, CHUNK);
    memset(c->data, 'x', CHUNK);
    atomic_fetch_add(&feeder_sent[st->index], 1);
    rt_send_msg(st->conn, c);
    rt_send(rt_self(self), MSG_FEED, NULL, 0);
}

static const rt_actor_type_t feeder_type = {
    .name = "feeder", .state_size = sizeof(feeder_state_t), .handle = feeder_handle};

static bool muted(rt_pid_t pid)
{
    rt_actor_info_t info;
    return rt_actor_info(pid, &info) == 0 && info.status == RT_STATUS_MUTED;
}

static long total_sent(void)
{
    long n = 0;
    for (int i = 0; i < FEEDERS; i++)
        n += atomic_load(&feeder_sent[i]);
    return n;
}

static void test_write_backpressure(void)
{
    rt_pid_t l = start_listener();
    long before = atomic_load(&conns_accepted);
    int fd = connect_local_rcvbuf(4096);
    CHECK(fd >= 0);
    CHECK(wait_at_least(&conns_accepted, before + 1));
    rt_pid_t conn = (rt_pid_t)atomic_load(&last_conn_pid);
    atomic_store(&max_pending, 0);
    atomic_store(&crossings, 0);
    atomic_store(&pushes_over_mark, 0);
    atomic_store(&stop_feeding, false);
    atomic_store(&feeders_stopped, 0);
    rt_pid_t f[FEEDERS];
    for (int i = 0; i < FEEDERS; i++) {
        atomic_store(&feeder_sent[i], 0);
        CHECK_EQ(rt_spawn(&feeder_type, NULL, &f[i]), 0);
        long go[2] = {(long)conn, i};
        rt_send(f[i], MSG_FEED, go, sizeof(go));
    }
    /* The peer reads nothing until the mark is passed and every feeder is parked. */
    uint64_t end = test_now_ms() + 60000;
    bool all_muted = false;
    while (!all_muted && test_now_ms() < end) {
        all_muted = atomic_load(&crossings) > 0;
        for (int i = 0; i < FEEDERS && all_muted; i++)
            all_muted = muted(f[i]);
        if (!all_muted)
            test_sleep_ms(1);
    }
    CHECK(all_muted);
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(conn, &info), 0);
    fprintf(stderr,
            "  blocked peer: feeders sent %ld + %ld chunks (%ld + %ld when the mark "
            "was passed), writer buffer peaked at %ld bytes, writer mailbox %llu\n",
            atomic_load(&feeder_sent[0]), atomic_load(&feeder_sent[1]),
            atomic_load(&sent_at_crossing[0]), atomic_load(&sent_at_crossing[1]),
            atomic_load(&max_pending), (unsigned long long)info.mailbox_len);
    CHECK_EQ(atomic_load(&crossings), 1);
    CHECK_EQ(atomic_load(&pushes_over_mark), 0);
    CHECK(atomic_load(&max_pending) <= RT_SOCK_HIGH_WATER + CHUNK);
    for (int i = 0; i < FEEDERS; i++)
        CHECK(atomic_load(&feeder_sent[i]) <= atomic_load(&sent_at_crossing[i]) + 1);
    /* What waited in the mailbox is all delivered once the peer reads; nothing is lost. */
    atomic_store(&stop_feeding, true);
    long total = 0;
    char buf[65536];
    while (test_now_ms() < end &&
           (atomic_load(&feeders_stopped) < FEEDERS || total < total_sent() * CHUNK)) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 10) <= 0)
            continue;
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        total += r;
    }
    CHECK_EQ(atomic_load(&feeders_stopped), FEEDERS);
    CHECK_EQ(total, total_sent() * CHUNK);
    close(fd);
    for (int i = 0; i < FEEDERS; i++)
        rt_exit_signal(f[i], RT_REASON_KILL);
    CHECK(wait_alive(1));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- Handing a socket to another actor in a message ---- */
enum { MSG_HAND = RT_MSG_USER + 10 };

static int tcp_pair(int *a, int *b)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&sa, &sl))
        return -1;
    *a = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*a, (struct sockaddr *)&sa, sizeof(sa)) ||
        fcntl(*a, F_SETFL, O_NONBLOCK)) /* a goes to rt_sock_adopt, which takes non-blocking fds */
        return -1;
    *b = accept(l, NULL, NULL);
    close(l);
    return *b < 0 ? -1 : 0;
}

/* Whether the peer of fd closed: EOF within timeout_ms. */
static bool peer_closed(int fd, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    char c;
    return poll(&pfd, 1, timeout_ms) == 1 && recv(fd, &c, 1, 0) == 0;
}

typedef struct {
    rt_sock_t *sock;
} taker_t;

static void hand(rt_pid_t to, int fd, char what, rt_pid_t next);
static void hand_owning(rt_pid_t to, int fd, char what, rt_pid_t next, _Atomic int *owned);

/*
** 't': takes the fd and greets through it. 'f': adopts it, then detaches it
** again and hands it on to the pid that follows. Anything else: leaves it.
*/
static void taker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    taker_t *t = state;
    if (m->tag == RT_MSG_SOCKET && t->sock) { /* echo, to show reads work after a hand-over */
        const void *data;
        size_t len;
        while (rt_sock_read(t->sock, &data, &len) == 0)
            rt_sock_write(t->sock, data, len);
        return;
    }
    if (m->tag != MSG_HAND ||
        (m->data[sizeof(rt_msg_owned_t)] != 't' && m->data[sizeof(rt_msg_owned_t)] != 'f'))
        return;
    int fd = rt_msg_take_fd(m);
    _Atomic int *owned = rt_msg_take_owned(m);
    if (owned)
        atomic_fetch_add(owned, 1); /* taken: the message will not drop it */
    if (fd < 0 || rt_sock_adopt(self, fd, &t->sock) != 0)
        return;
    if (m->data[sizeof(rt_msg_owned_t)] == 't') {
        rt_sock_write(t->sock, "hi", 2);
        return;
    }
    rt_pid_t next;
    memcpy(&next, m->data + sizeof(rt_msg_owned_t) + 1, sizeof(next));
    /* What was written before the detach goes first: the next owner's bytes follow it. */
    rt_sock_write(t->sock, "<", 1);
    hand(next, rt_sock_detach(t->sock), 't', 0);
    t->sock = NULL;
}

static const rt_actor_type_t taker_type = {
    .name = "taker", .state_size = sizeof(taker_t), .handle = taker_handle};

/* The owned object is a counter: dropping it adds 100, taking it adds 1. */
static void drop_counter(void *obj)
{
    atomic_fetch_add((_Atomic int *)obj, 100);
}

static void hand_owning(rt_pid_t to, int fd, char what, rt_pid_t next, _Atomic int *owned)
{
    rt_msg_t *m = rt_msg_new_fd(MSG_HAND, fd, sizeof(rt_msg_owned_t) + 1 + sizeof(next));
    memset(m->data, 0, sizeof(rt_msg_owned_t));
    if (owned)
        rt_msg_own(m, (void *)owned, drop_counter);
    m->data[sizeof(rt_msg_owned_t)] = (unsigned char)what;
    memcpy(m->data + sizeof(rt_msg_owned_t) + 1, &next, sizeof(next));
    rt_send_msg(to, m);
}

static void hand(rt_pid_t to, int fd, char what, rt_pid_t next)
{
    hand_owning(to, fd, what, next, NULL);
}

static void test_fd_in_message_never_leaks(void)
{
    rt_pid_t taker;
    CHECK_EQ(rt_spawn(&taker_type, NULL, &taker), 0);
    int a, b;
    /* Taken: the receiver owns the socket and it stays open. */
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand(taker, a, 't', 0);
    char buf[2] = {0};
    struct pollfd pfd = {b, POLLIN, 0};
    CHECK(poll(&pfd, 1, 5000) == 1 && recv(b, buf, 2, 0) == 2 && memcmp(buf, "hi", 2) == 0);
    close(b);
    /* An actor that takes a socket in a later turn, many times over: reads must work (the
       socket is registered from whatever scheduler that turn runs on). */
    for (int i = 0; i < 50; i++) {
        rt_pid_t fresh;
        CHECK_EQ(rt_spawn(&taker_type, NULL, &fresh), 0);
        CHECK_EQ(tcp_pair(&a, &b), 0);
        hand(fresh, a, 't', 0);
        char echo[6] = {0};
        struct pollfd hp = {b, POLLIN, 0};
        CHECK(poll(&hp, 1, 5000) == 1 && recv(b, echo, 2, 0) == 2);
        CHECK(send(b, "ping", 4, 0) == 4);
        struct pollfd ep = {b, POLLIN, 0};
        CHECK(poll(&ep, 1, 5000) == 1 && recv(b, echo, 4, 0) == 4 && memcmp(echo, "ping", 4) == 0);
        rt_exit_signal(fresh, RT_REASON_KILL);
        close(b);
    }
    CHECK(wait_alive(1));
    /* Not taken: freeing the message closes it, and drops what else it owns. */
    static _Atomic int owned_left, owned_taken, owned_dead;
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand_owning(taker, a, 'n', 0, &owned_left);
    CHECK(peer_closed(b, 5000));
    close(b);
    CHECK_EQ(atomic_load(&owned_left), 100);
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand_owning(taker, a, 't', 0, &owned_taken);
    struct pollfd tp = {b, POLLIN, 0};
    CHECK(poll(&tp, 1, 5000) == 1 && recv(b, buf, 2, 0) == 2);
    close(b);
    /* Sent to a dead actor: a dead letter, and the fd is closed with it. */
    rt_exit_signal(taker, RT_REASON_KILL);
    CHECK(wait_alive(0));
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand_owning(taker, a, 't', 0, &owned_dead);
    CHECK(peer_closed(b, 5000));
    close(b);
    CHECK_EQ(atomic_load(&owned_taken), 1);
    CHECK_EQ(atomic_load(&owned_dead), 100);
    /* Detached by one owner, adopted by the next: the fd still works, and the first
       owner's exit does not close it. */
    rt_pid_t first;
    CHECK_EQ(tcp_pair(&a, &b), 0);
    CHECK_EQ(rt_spawn(&taker_type, NULL, &taker), 0);
    CHECK_EQ(rt_spawn(&taker_type, NULL, &first), 0);
    hand(first, a, 'f', taker);
    char three[3] = {0};
    struct pollfd fp = {b, POLLIN, 0};
    CHECK(poll(&fp, 1, 5000) == 1 && recv(b, three, 3, MSG_WAITALL) == 3 &&
          memcmp(three, "<hi", 3) == 0);
    rt_exit_signal(first, RT_REASON_KILL);
    CHECK(wait_alive(1));
    CHECK(!peer_closed(b, 100));
    rt_exit_signal(taker, RT_REASON_KILL);
    CHECK(peer_closed(b, 5000)); /* the owner's exit closes an adopted socket */
    close(b);
    CHECK(wait_alive(0));
}

/* ---- Writing in place: rt_sock_reserve and rt_sock_commit ---- */
enum { MSG_RESERVE = RT_MSG_USER + 20 };

/* Past RT_SOCK_FLUSH_AT, so its commit flushes mid-turn; past 4096, so the buffer grows. */
#define RESERVE_BIG (RT_SOCK_FLUSH_AT + 5000)

typedef struct {
    rt_sock_t *sock;
} reserver_t;

static int reserver_init(rt_actor_t *self, void *state, void *arg)
{
    reserver_t *r = state;
    return rt_sock_adopt(self, (int)(intptr_t)arg, &r->sock);
}

/* The reserver's checks, on a scheduler thread: counted, and read by the test once the bytes
   came (CHECK's own counters are the main thread's). */
static atomic_int reserver_faults;
#define RESERVER_CHECK(c)                                                                          \
    do {                                                                                           \
        if (!(c))                                                                                  \
            atomic_fetch_add(&reserver_faults, 1);                                                 \
    } while (0)
#define RESERVER_CHECK_EQ(a, b) RESERVER_CHECK((a) == (b))

/* Writes "ab", "cdef" through a 16-byte reservation, "ij", then most of a big one, then "z". */
static void reserver_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self;
    reserver_t *r = state;
    if (m->tag != MSG_RESERVE)
        return;
    RESERVER_CHECK_EQ(rt_sock_write(r->sock, "ab", 2), 0);
    char *room = rt_sock_reserve(r->sock, 16);
    RESERVER_CHECK(room != NULL);
    memcpy(room, "cdefgh", 6);
    RESERVER_CHECK_EQ(rt_sock_pending(r->sock), 2); /* reserved bytes are not output yet */
    RESERVER_CHECK_EQ(rt_sock_commit(r->sock, 4), 0);
    RESERVER_CHECK_EQ(rt_sock_pending(r->sock), 6);
    RESERVER_CHECK_EQ(rt_sock_write(r->sock, "ij", 2), 0);
    unsigned char *big = rt_sock_reserve(r->sock, RESERVE_BIG);
    RESERVER_CHECK(big != NULL);
    for (size_t i = 0; i < RESERVE_BIG; i++)
        big[i] = (unsigned char)(i * 7);
    RESERVER_CHECK_EQ(rt_sock_commit(r->sock, RESERVE_BIG - 100), 0);
    RESERVER_CHECK_EQ(rt_sock_write(r->sock, "z", 1), 0);
}

static const rt_actor_type_t reserver_type = {.name = "reserver",
                                              .state_size = sizeof(reserver_t),
                                              .init = reserver_init,
                                              .handle = reserver_handle};

/* Bytes written in place arrive in order with those rt_sock_write wrote before and after. */
static void test_reserve_commit(void)
{
    int a, b;
    CHECK_EQ(tcp_pair(&a, &b), 0);
    rt_pid_t w;
    CHECK_EQ(rt_spawn(&reserver_type, (void *)(intptr_t)a, &w), 0);
    CHECK_EQ(rt_send(w, MSG_RESERVE, NULL, 0), 0);
    enum { HEAD = 8, TOTAL = HEAD + RESERVE_BIG - 100 + 1 };
    static unsigned char got[TOTAL];
    struct timeval tv = {.tv_sec = 10};
    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    CHECK_EQ(recv(b, got, TOTAL, MSG_WAITALL), TOTAL);
    CHECK(memcmp(got, "abcdefij", HEAD) == 0);
    bool same = true;
    for (size_t i = 0; i < RESERVE_BIG - 100; i++)
        same &= got[HEAD + i] == (unsigned char)(i * 7);
    CHECK(same);
    CHECK_EQ(got[TOTAL - 1], 'z');
    CHECK_EQ(atomic_load(&reserver_faults), 0); /* its checks ran before the 'z' went */
    rt_exit_signal(w, RT_REASON_KILL);
    CHECK(peer_closed(b, 5000));
    close(b);
    CHECK(wait_alive(0));
}

/*
** Output buffers that drained sockets gave back stay with their scheduler (sock.c's cache)
** and go back to malloc when the schedulers trim after connections leave: once the clients
** are gone, the sockets hold no more bytes than before they came. Each client's megabyte
** echoed through its connection's output buffer leaves one in a cache.
*/
static void test_output_cache_given_back(void)
{
    rt_pid_t l = start_listener();
    rt_mem_stats_t before, now;
    rt_mem_stats(&before);
    enum { CLIENTS = 8 };
    pthread_t t[CLIENTS];
    client_arg_t a[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        a[i].bytes = 1u << 20;
        CHECK_EQ(pthread_create(&t[i], NULL, client_main, &a[i]), 0);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(t[i], NULL);
        CHECK(a[i].ok);
    }
    /* The connections' exits start the schedulers' trim once they have been quiet a while
       (sched.c, RT_TRIM_QUIET_MS): the deadline is for a loaded machine, not the proof. */
    CHECK(wait_alive(1));
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    do {
        rt_mem_stats(&now);
        if (now.sockets <= before.sockets)
            break;
        test_sleep_ms(10);
    } while (test_now_ms() < end);
    CHECK(now.sockets <= before.sockets);
    CHECK_EQ(now.sockets_cached, 0); /* what vm shows as free went back with them */
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0));
}

/* ---- rt_sock_low_at_hangup: the owner's turn that finds the peer gone is a low one ---- */

static atomic_long hangup_low_seen; /* the owner's low flag at that turn: 1, 0; -1 before */

static int hangup_init(rt_actor_t *self, void *state, void *arg)
{
    const int *a = arg; /* the fd, and whether to ask */
    rt_sock_t **s = state;
    int rc = rt_sock_adopt(self, a[0], s);
    if (!rc && a[1])
        rt_sock_low_at_hangup(*s);
    return rc;
}

static void hangup_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    rt_sock_t *s = *(rt_sock_t **)state;
    if (m->tag != RT_MSG_SOCKET)
        return;
    const void *data;
    size_t len;
    int rc;
    while ((rc = rt_sock_read(s, &data, &len)) == 0)
        ;
    if (rc != RT_ECLOSED)
        return;
    atomic_store(&hangup_low_seen, (atomic_load(&self->sync_flags) & RT_AF_LOW) != 0);
    rt_exit(self, RT_REASON_NORMAL);
}

static const rt_actor_type_t hangup_type = {.name = "hangup",
                                            .state_size = sizeof(rt_sock_t *),
                                            .init = hangup_init,
                                            .handle = hangup_handle};

/* Whether the owner ran its hangup turn low (1) or normal (0). */
static long hangup_turn_low(bool ask)
{
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    atomic_store(&hangup_low_seen, -1);
    int arg[2] = {sv[0], ask};
    rt_pid_t owner;
    CHECK_EQ(rt_spawn(&hangup_type, arg, &owner), 0);
    close(sv[1]);
    CHECK(wait_at_least(&hangup_low_seen, 0));
    CHECK(wait_alive(0));
    return atomic_load(&hangup_low_seen);
}

static void test_hangup_turn_is_low_when_asked(void)
{
    CHECK_EQ(hangup_turn_low(false), 0);
    CHECK_EQ(hangup_turn_low(true), 1);
}

int main(void)
{
    test_start(2);
    RUN(test_output_cache_given_back); /* first: no earlier test's buffers are cached */
    RUN(test_echo_many_clients);
    RUN(test_idle_conn_holds_nothing);
    RUN(test_write_backpressure);
    RUN(test_fd_in_message_never_leaks);
    RUN(test_reserve_commit);
    RUN(test_hangup_turn_is_low_when_asked);
    rt_shutdown();
    return CHECK_SUMMARY();
}

/* Sockets: listen/accept/read/write owned by actors, many clients, write backpressure. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rt_test.h"

enum { MSG_PUSH = RT_MSG_USER, MSG_FEED };

static atomic_int listen_port;
static atomic_long conns_accepted;
static atomic_long conns_closed;
static atomic_long bytes_echoed;
static atomic_long max_pending;

/* ---- Echo connection ---- */
typedef struct {
    rt_sock_t *sock;
} conn_state_t;

static int conn_init(rt_actor_t *self, void *state, void *arg)
{
    conn_state_t *st = state;
    return rt_sock_adopt(self, (int)(intptr_t)arg, &st->sock);
}

static void conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    conn_state_t *st = state;
    if (m->tag == MSG_PUSH) {
        /* Server push, for the backpressure test: write whatever we are fed. */
        rt_sock_write(st->sock, m->data, m->len);
        long p = (long)rt_sock_pending(st->sock);
        long mx = atomic_load(&max_pending);
        while (p > mx && !atomic_compare_exchange_weak(&max_pending, &mx, p))
            ;
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

static const rt_actor_type_t conn_type = {
    .name = "echo_conn", .state_size = sizeof(conn_state_t), .init = conn_init,
    .handle = conn_handle};

/* ---- Listener ---- */
typedef struct {
    rt_sock_t *sock;
} listener_state_t;

static atomic_long last_conn_pid;

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
    while (rt_sock_accept(st->sock, &fd) == 0) {
        rt_pid_t pid;
        if (rt_spawn(&conn_type, (void *)(intptr_t)fd, &pid) == 0) {
            atomic_fetch_add(&conns_accepted, 1);
            atomic_store(&last_conn_pid, (long)pid);
        } else {
            close(fd);
        }
    }
}

static const rt_actor_type_t listener_type = {
    .name = "listener", .state_size = sizeof(listener_state_t), .init = listener_init,
    .handle = listener_handle};

static int connect_local(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atomic_load(&listen_port))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
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
    CHECK(wait_at_least(&conns_closed, CLIENTS, 5000)); /* every close seen, actors exited */
    CHECK_EQ(atomic_load(&bytes_echoed), (long)(bytes * CLIENTS));
    CHECK(wait_alive(1, 5000));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
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
    CHECK(wait_at_least(&conns_accepted, before + 1, 5000));
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info((rt_pid_t)atomic_load(&last_conn_pid), &info), 0);
    CHECK_EQ(info.heap_bytes, 0);
    for (int i = 0; i < 100 && info.mailbox_len; i++) {
        test_sleep_ms(5);
        rt_actor_info((rt_pid_t)atomic_load(&last_conn_pid), &info);
    }
    CHECK_EQ(info.mailbox_len, 0);
    CHECK(info.scheduler >= 0); /* pinned to its loop */
    close(fd);
    CHECK(wait_alive(1, 5000));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
}

/* A peer that does not read: the writer's output buffer stops at the high-water mark
   because the actor feeding it gets muted; nothing is lost once the peer reads. */
typedef struct {
    rt_pid_t conn;
    long chunks;
    long sent;
} feeder_state_t;

static atomic_long feeder_sent;

static void feeder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    feeder_state_t *st = state;
    if (m->tag == MSG_FEED && m->len == sizeof(long) * 2) {
        st->conn = (rt_pid_t)((long *)(void *)m->data)[0];
        st->chunks = ((long *)(void *)m->data)[1];
    }
    if (st->sent >= st->chunks)
        return;
    rt_msg_t *c = rt_msg_new(MSG_PUSH, 16384);
    memset(c->data, 'x', 16384);
    rt_send_msg(st->conn, c);
    st->sent++;
    atomic_fetch_add(&feeder_sent, 1);
    rt_send(rt_self(self), MSG_FEED, NULL, 0);
}

static const rt_actor_type_t feeder_type = {
    .name = "feeder", .state_size = sizeof(feeder_state_t), .handle = feeder_handle};

static void test_write_backpressure(void)
{
    rt_pid_t l = start_listener();
    long before = atomic_load(&conns_accepted);
    int fd = connect_local();
    CHECK(wait_at_least(&conns_accepted, before + 1, 5000));
    rt_pid_t conn = (rt_pid_t)atomic_load(&last_conn_pid);
    atomic_store(&max_pending, 0);
    atomic_store(&feeder_sent, 0);
    long chunks = 10000; /* 160 MB in all: far more than the kernel buffers hold */
    rt_pid_t f;
    rt_spawn(&feeder_type, NULL, &f);
    long go[2] = {(long)conn, chunks};
    rt_send(f, MSG_FEED, go, sizeof(go));
    test_sleep_ms(300); /* the peer reads nothing meanwhile */
    long sent_while_blocked = atomic_load(&feeder_sent);
    long pending_while_blocked = atomic_load(&max_pending);
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(conn, &info), 0);
    fprintf(stderr, "  blocked peer: feeder sent %ld chunks, writer buffer peaked at %ld KB, "
                    "writer mailbox %llu\n",
            sent_while_blocked, pending_while_blocked / 1024,
            (unsigned long long)info.mailbox_len);
    /* Muting stops the feeder; what it queued before that still drains into the buffer. */
    CHECK(sent_while_blocked < chunks / 3);
    CHECK(pending_while_blocked < 8 * 1024 * 1024);
    /* Now read everything: all 32 MB arrive. */
    long total = 0, want = chunks * 16384;
    char buf[65536];
    uint64_t end = test_now_ms() + 30000;
    while (total < want && test_now_ms() < end) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        total += r;
    }
    CHECK_EQ(total, want);
    close(fd);
    rt_exit_signal(f, RT_REASON_KILL);
    CHECK(wait_alive(1, 5000));
    rt_exit_signal(l, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
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
    if (connect(*a, (struct sockaddr *)&sa, sizeof(sa)))
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
    if (m->tag != MSG_HAND || (m->data[0] != 't' && m->data[0] != 'f'))
        return;
    int fd = rt_msg_take_fd(m);
    if (fd < 0 || rt_sock_adopt(self, fd, &t->sock) != 0)
        return;
    if (m->data[0] == 't') {
        rt_sock_write(t->sock, "hi", 2);
        return;
    }
    rt_pid_t next;
    memcpy(&next, m->data + 1, sizeof(next));
    hand(next, rt_sock_detach(t->sock), 't', 0);
    t->sock = NULL;
}

static const rt_actor_type_t taker_type = {
    .name = "taker", .state_size = sizeof(taker_t), .handle = taker_handle};

static void hand(rt_pid_t to, int fd, char what, rt_pid_t next)
{
    rt_msg_t *m = rt_msg_new_fd(MSG_HAND, fd, 1 + sizeof(next));
    m->data[0] = (unsigned char)what;
    memcpy(m->data + 1, &next, sizeof(next));
    rt_send_msg(to, m);
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
    /* An actor not yet pinned to a scheduler takes a socket in a later turn, many times over:
       reads must work (it has to move to the socket's home to register it first). */
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
    CHECK(wait_alive(1, 5000));
    /* Not taken: freeing the message closes it. */
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand(taker, a, 'n', 0);
    CHECK(peer_closed(b, 5000));
    close(b);
    /* Sent to a dead actor: a dead letter, and the fd is closed with it. */
    rt_exit_signal(taker, RT_REASON_KILL);
    CHECK(wait_alive(0, 5000));
    CHECK_EQ(tcp_pair(&a, &b), 0);
    hand(taker, a, 't', 0);
    CHECK(peer_closed(b, 5000));
    close(b);
    /* Detached by one owner, adopted by the next: the fd still works, and the first
       owner's exit does not close it. */
    rt_pid_t first;
    CHECK_EQ(tcp_pair(&a, &b), 0);
    CHECK_EQ(rt_spawn(&taker_type, NULL, &taker), 0);
    CHECK_EQ(rt_spawn(&taker_type, NULL, &first), 0);
    hand(first, a, 'f', taker);
    CHECK(poll(&pfd, 1, 5000) == 1 && recv(b, buf, 2, 0) == 2 && memcmp(buf, "hi", 2) == 0);
    rt_exit_signal(first, RT_REASON_KILL);
    CHECK(wait_alive(1, 5000));
    CHECK(!peer_closed(b, 100));
    rt_exit_signal(taker, RT_REASON_KILL);
    CHECK(peer_closed(b, 5000)); /* the owner's exit closes an adopted socket */
    close(b);
    CHECK(wait_alive(0, 5000));
}

int main(void)
{
    test_start(2);
    RUN(test_echo_many_clients);
    RUN(test_idle_conn_holds_nothing);
    RUN(test_write_backpressure);
    RUN(test_fd_in_message_never_leaks);
    rt_shutdown();
    return CHECK_SUMMARY();
}

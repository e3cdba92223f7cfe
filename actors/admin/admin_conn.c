/*
** One rtctl client of the admin socket: an actor that reads its request lines
** and answers them in order, each here, through the worker, or from the replies
** of connection actors, and stops reading while its unsent answers pile up.
*/
#define _GNU_SOURCE /* struct ucred */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admin_impl.h"

/*
** What a connection holds between messages is on its heap, kept by the (conservative) scan
** of this state: the bytes read and not yet answered, and a request being answered. An
** answer is made and written within one message, into the socket's buffer.
*/
typedef struct {
    rt_sock_t *sock;
    char *in; /* bytes read and not yet answered (NUL after them) */
    size_t inlen, incap;
    rt_admin_exec_t exec; /* a request waiting for the worker or connection actors */
    bool held;            /* unsent replies passed RT_ADMIN_OUT_MAX: not reading */
} admin_conn_t;

static void respond(void *ctx, int code, const char *body, size_t len)
{
    admin_conn_t *k = ctx;
    char head[48];
    int n = snprintf(head, sizeof(head), "%d %zu\n", code, len);
    rt_sock_write(k->sock, head, (size_t)n);
    if (len)
        rt_sock_write(k->sock, body, len);
}

static void answer_lines(rt_actor_t *self, admin_conn_t *k);

/*
** Whether the client's unsent replies are past RT_ADMIN_OUT_MAX: if so its socket stops
** being read (its requests wait in the kernel, then in the client) until they drain.
** Output past the cap (which is at least RT_SOCK_FLUSH_AT) means the kernel refused a
** send, so an RT_SOCK_WRITABLE event will say when it drains.
*/
_Static_assert(RT_ADMIN_OUT_MAX >= RT_SOCK_FLUSH_AT, "held output must mean a blocked socket");
static bool hold_output(admin_conn_t *k)
{
    if (rt_sock_pending(k->sock) <= RT_ADMIN_OUT_MAX)
        return false;
    if (!k->held) {
        k->held = true;
        rt_sock_pause_reading(k->sock, true);
    }
    return true;
}

/* Answers complete request lines until one has to wait (worker, gathering, unsent replies). */
static void answer_lines(rt_actor_t *self, admin_conn_t *k)
{
    while (!k->exec.cookie && k->sock && !hold_output(k)) {
        char *nl = k->inlen ? memchr(k->in, '\n', k->inlen) : NULL;
        if (!nl) {
            if (k->inlen > RT_ADMIN_LINE_MAX) {
                respond(k, 400, "request line too long\n", 22);
                rt_exit(self, RT_REASON_NORMAL);
            }
            return;
        }
        size_t linelen = (size_t)(nl - k->in);
        rt_admin_exec_start(self, &k->exec, k->in, linelen, 0, respond, k);
        memmove(k->in, k->in + linelen + 1, k->inlen - linelen); /* and the NUL */
        k->inlen -= linelen + 1;
    }
}

static int admin_conn_init(rt_actor_t *self, void *state, void *arg)
{
    admin_conn_t *k = state;
    int fd = (int)(intptr_t)arg;
    if (rt_sock_adopt(self, fd, &k->sock) != 0) {
        close(fd);
        return RT_EINVAL;
    }
    k->exec.sock = k->sock;
    /* Who asks: the socket is 0600, so rtd's own user or root, and its changes are logged
       with the uid and pid the kernel vouches for. */
    struct ucred cred;
    socklen_t len = sizeof(cred);
    k->exec.via = RT_ADMIN_VIA_RTCTL;
    k->exec.uid = k->exec.pid = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        k->exec.uid = (long)cred.uid;
        k->exec.pid = (long)cred.pid;
    }
    return 0;
}

static void on_readable(rt_actor_t *self, admin_conn_t *k)
{
    for (int reads = 0; reads < 16; reads++) {
        const void *data;
        size_t len;
        int rc = rt_sock_read(k->sock, &data, &len);
        if (rc == RT_EAGAIN)
            break;
        if (rc != 0) {
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        if (k->inlen + len > 2 * RT_ADMIN_LINE_MAX ||
            rt_grow_on(self, &k->in, &k->incap, k->inlen + len + 1, 1, 256, RT_OBJ_LEAF)) {
            respond(k, 400, "request line too long\n", 22);
            rt_exit(self, RT_REASON_NORMAL);
            return;
        }
        memcpy(k->in + k->inlen, data, len);
        k->inlen += len;
        k->in[k->inlen] = 0;
    }
    answer_lines(self, k);
}

/* The held replies drained: answer what is buffered, then read again. */
static void resume(rt_actor_t *self, admin_conn_t *k)
{
    k->held = false;
    answer_lines(self, k);
    if (!k->held)
        rt_sock_pause_reading(k->sock, false);
}

static void admin_conn_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    admin_conn_t *k = state;
    switch (m->tag) {
    case RT_MSG_SOCKET: {
        const rt_sock_event_t *ev = (const rt_sock_event_t *)m->data;
        if ((ev->events & RT_SOCK_WRITABLE) && k->held)
            resume(self, k);
        if (ev->events & RT_SOCK_READABLE)
            on_readable(self, k);
        break;
    }
    default:
        if (rt_admin_exec_message(&k->exec, m, respond, k))
            answer_lines(self, k);
        break;
    }
}

static void admin_conn_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    admin_conn_t *k = state;
    rt_admin_exec_free(&k->exec);
}

static const char *admin_conn_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_MSG_SOCKET:
        return "socket";
    case RT_ADMIN_MSG_JOB_DONE:
        return "job_done";
    case RT_ADMIN_MSG_GATHER_TIMEOUT:
        return "gather_timeout";
    default:
        return "gather_reply";
    }
}

const rt_actor_type_t rt__admin_conn_type = {
    .name = "admin_conn",
    .state_size = sizeof(admin_conn_t),
    .init = admin_conn_init,
    .handle = admin_conn_handle,
    .terminate = admin_conn_terminate,
    .tag_name = admin_conn_tag_name,
};

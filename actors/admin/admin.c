/*
** The admin socket's listening side: the socket file (private, and never taken
** from another live rtd) and the listener actor that accepts rtctl's connections
** on it, one admin_conn actor each, linked so that they end with it. The
** listener's tick also samples scheduler utilisation for `vm`. The listener and
** the worker are the children of the group supervisor RT_ADMIN_GROUP; each start
** of the listener binds the socket file again.
*/
#define _GNU_SOURCE /* O_PATH */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "admin_impl.h"
#include "group.h"
#include "log.h"

#define RT_ADMIN_SAMPLE_MS 1000 /* the listener's tick: scheduler utilisation for `vm` */
#define RT_ADMIN_SCHED_MAX 256

#define MSG_TICK RT_MSG_USER /* the listener samples the schedulers */

static struct {
    const char *version;
    char path[PATH_MAX]; /* the socket file */
    dev_t dev;           /* its inode, so a stop never removes another rtd's socket */
    ino_t ino;
    uint64_t started_ms;      /* CLOCK_MONOTONIC */
    rt_pid_t sup;             /* the supervisor the admin group runs under (0: none) */
    char err[PATH_MAX + 256]; /* why the listener's last start failed */
    bool restarting;          /* the listener started once: its next start is a restart */
    int bound_fd;             /* bound by rt_admin_bind, not yet taken by the listener; -1 */
    pthread_mutex_t util_lock;
    size_t nutil;
    double util[RT_ADMIN_SCHED_MAX];
} A = {.util_lock = PTHREAD_MUTEX_INITIALIZER, .bound_fd = -1};

const char *rt__admin_version(void)
{
    return A.version;
}

uint64_t rt__admin_uptime_ms(void)
{
    return rt_mono_ms() - A.started_ms;
}

size_t rt__admin_sched_util(double *util, size_t max)
{
    pthread_mutex_lock(&A.util_lock);
    size_t n = A.nutil < max ? A.nutil : max;
    memcpy(util, A.util, n * sizeof(double));
    pthread_mutex_unlock(&A.util_lock);
    return n;
}

/* Removes the socket file, if it is still the one bound here. */
static void unlink_ours(void)
{
    struct stat st;
    if (lstat(A.path, &st) == 0 && st.st_dev == A.dev && st.st_ino == A.ino)
        unlink(A.path);
}

/* ---- The listener ---- */

typedef struct {
    rt_sock_t *sock;
    rt_pid_t *conns; /* its connections, to tell their exits from exit signals */
    size_t nconns, capconns;
    uint64_t prev_busy[RT_ADMIN_SCHED_MAX], prev_wall[RT_ADMIN_SCHED_MAX];
} admin_listener_t;

static void sample_schedulers(admin_listener_t *l)
{
    rt_sched_info_t info[RT_ADMIN_SCHED_MAX];
    size_t n = rt_snapshot_schedulers(info, RT_ADMIN_SCHED_MAX);
    double util[RT_ADMIN_SCHED_MAX];
    for (size_t i = 0; i < n; i++) {
        uint64_t dbusy = info[i].busy_ns - l->prev_busy[i];
        uint64_t dwall = info[i].wall_ns - l->prev_wall[i];
        util[i] = dwall ? (double)dbusy / (double)dwall : 0;
        if (util[i] > 1)
            util[i] = 1;
        l->prev_busy[i] = info[i].busy_ns;
        l->prev_wall[i] = info[i].wall_ns;
    }
    pthread_mutex_lock(&A.util_lock);
    memcpy(A.util, util, n * sizeof(double));
    A.nutil = n;
    pthread_mutex_unlock(&A.util_lock);
}

static int admin_listener_init(rt_actor_t *self, void *state, void *arg)
{
    admin_listener_t *l = state;
    int fd = (int)(intptr_t)arg;
    if (rt_sock_adopt_listener(self, fd, &l->sock) != 0)
        return RT_EINVAL;
    /* Connections are linked so that stopping the listener ends them; one of them
       ending (even abnormally) must not end the listener. */
    rt_trap_exit(self, true);
    sample_schedulers(l);
    rt_send_after_tag(RT_ADMIN_SAMPLE_MS, rt_self(self), MSG_TICK, NULL);
    return 0;
}

/*
** A connection's exit (normal or not) leaves the listener running; an exit signal from
** anyone else (its supervisor's stop, exit/2) ends it as if it did not trap exits.
*/
static void on_exit_signal(rt_actor_t *self, admin_listener_t *l, const rt_exit_msg_t *e)
{
    for (size_t i = 0; i < l->nconns; i++) {
        if (l->conns[i] == e->from) {
            l->conns[i] = l->conns[--l->nconns];
            return;
        }
    }
    if (e->reason != RT_REASON_NORMAL)
        rt_exit(self, e->reason);
}

static void admin_listener_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    admin_listener_t *l = state;
    if (m->tag == MSG_TICK) {
        sample_schedulers(l);
        rt_send_after_tag(RT_ADMIN_SAMPLE_MS, rt_self(self), MSG_TICK, NULL);
        return;
    }
    if (m->tag == RT_MSG_EXIT) {
        on_exit_signal(self, l, (const rt_exit_msg_t *)(const void *)m->data);
        return;
    }
    if (m->tag != RT_MSG_SOCKET)
        return;
    for (;;) {
        int fd;
        int rc = rt_sock_accept(l->sock, &fd, NULL);
        if (rc == RT_EAGAIN)
            return;
        if (rc) {
            rt_log(RT_LOG_WARNING, "admin.accept", "%s", rt_strerror(rc));
            return;
        }
        rt_pid_t pid;
        rt_spawn_opts_t opts = {.link = true};
        if (rt_grow(&l->conns, &l->capconns, l->nconns + 1, sizeof(*l->conns), 8) != 0 ||
            rt_spawn_opt(&rt__admin_conn_type, (void *)(intptr_t)fd, &opts, &pid) != 0) {
            close(fd);
            rt_log(RT_LOG_WARNING, "admin.refused", "cannot start an admin connection");
            continue;
        }
        l->conns[l->nconns++] = pid;
    }
}

static void admin_listener_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    admin_listener_t *l = state;
    free(l->conns);
    unlink_ours();
}

static const char *admin_listener_tag_name(uint32_t tag)
{
    return tag == MSG_TICK        ? "tick"
           : tag == RT_MSG_SOCKET ? "accept"
           : tag == RT_MSG_EXIT   ? "exit"
                                  : "";
}

static const rt_actor_type_t admin_listener_type = {
    .name = "admin",
    .state_size = sizeof(admin_listener_t),
    .init = admin_listener_init,
    .handle = admin_listener_handle,
    .terminate = admin_listener_terminate,
    .tag_name = admin_listener_tag_name,
};

/* ---- The socket file ---- */

/*
** A sockaddr for path. sun_path holds 107 bytes; a longer path (deep test
** directories) goes through /proc/self/fd/N/ of its directory, opened here and
** closed by the caller (*dirfd).
*/
static int make_addr(const char *path, struct sockaddr_un *sa, int *dirfd)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    *dirfd = -1;
    if (strlen(path) < sizeof(sa->sun_path)) {
        memcpy(sa->sun_path, path, strlen(path));
        return 0;
    }
    const char *slash = strrchr(path, '/');
    if (!slash)
        return RT_EINVAL;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    *dirfd = open(dir[0] ? dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*dirfd < 0)
        return RT_EINVAL;
    int n = snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", *dirfd, slash + 1);
    if (n < 0 || (size_t)n >= sizeof(sa->sun_path)) {
        close(*dirfd);
        *dirfd = -1;
        return RT_EINVAL;
    }
    return 0;
}

/* Whether a live process accepts connections on path. */
static bool socket_answers(const char *path)
{
    struct sockaddr_un sa;
    int dirfd;
    if (make_addr(path, &sa, &dirfd) != 0)
        return false;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
        close(fd);
    if (dirfd >= 0)
        close(dirfd);
    return live;
}

static int bind_socket(const char *path, int *out, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "admin socket %s: exists and is not a socket", path);
            return RT_EEXIST;
        }
        if (socket_answers(path)) {
            snprintf(err, errlen, "admin socket %s: another rtd is running there", path);
            return RT_EEXIST;
        }
        unlink(path); /* left by an rtd that did not stop cleanly */
    }
    struct sockaddr_un sa;
    int dirfd;
    if (make_addr(path, &sa, &dirfd) != 0) {
        snprintf(err, errlen, "admin socket %s: bad path", path);
        return RT_EINVAL;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "admin socket: %s", strerror(errno));
        if (dirfd >= 0)
            close(dirfd);
        return RT_ELIMIT;
    }
    /* 0600 from the start: a socket created wider and chmod-ed later would leave a window. */
    fchmod(fd, 0600);
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int bind_errno = errno;
    umask(old);
    if (dirfd >= 0)
        close(dirfd);
    if (rc == 0 && (chmod(path, 0600) != 0 || lstat(path, &st) != 0))
        rc = -1, bind_errno = errno;
    if (rc == 0 && listen(fd, 64) != 0)
        rc = -1, bind_errno = errno;
    if (rc != 0) {
        snprintf(err, errlen, "admin socket %s: %s", path, strerror(bind_errno));
        close(fd);
        return RT_EINVAL;
    }
    A.dev = st.st_dev;
    A.ino = st.st_ino;
    *out = fd;
    return 0;
}

int rt_admin_bind(const rt_conf_t *conf, char *err, size_t errlen)
{
    RT_ASSERT(A.bound_fd < 0);
    int fits = rt_conf_admin_socket(conf, A.path, sizeof(A.path));
    RT_ASSERT(fits == 0); /* admin_socket and data_dir hold RT_CONF_PATH_MAX bytes at most */
    (void)fits;
    return bind_socket(A.path, &A.bound_fd, err, errlen);
}

void rt_admin_unbind(void)
{
    if (A.bound_fd < 0)
        return;
    close(A.bound_fd);
    A.bound_fd = -1;
    unlink_ours();
}

/*
** The listener's start: the first takes the socket rt_admin_bind bound, if it did; a
** restart binds the socket file again. Then the listener adopts it.
*/
static int admin_listener_start(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out)
{
    (void)arg;
    int fd = A.bound_fd;
    A.bound_fd = -1;
    int rc = fd >= 0 ? 0 : bind_socket(A.path, &fd, A.err, sizeof(A.err));
    if (rc == 0 && (rc = rt_spawn_opt(&admin_listener_type, (void *)(intptr_t)fd, opts, out))) {
        snprintf(A.err, sizeof(A.err), "admin socket %s: cannot start its listener: %s", A.path,
                 rt_strerror(rc));
        close(fd);
        unlink(A.path);
    }
    if (rc && A.restarting) /* the first start's error goes to rt_admin_start's caller */
        rt_log(RT_LOG_ERROR, "admin.failed", "%s", A.err);
    A.restarting = rc == 0;
    return rc;
}

int rt_admin_start(rt_conf_t *conf, const char *version, rt_pid_t sup, char *err, size_t errlen)
{
    rt__admin_live_init(conf);
    A.version = version;
    A.started_ms = rt_mono_ms();
    A.sup = sup;
    /* admin_socket and data_dir hold RT_CONF_PATH_MAX bytes at most: the path fits. */
    int fits = rt_conf_admin_socket(conf, A.path, sizeof(A.path));
    RT_ASSERT(fits == 0);
    (void)fits;
    /* The worker before the listener: a connection hands it commands at once. */
    rt_child_spec_t listener = {
        .name = "admin", .start = admin_listener_start, .restart = RT_PERMANENT};
    rt_pid_t group;
    A.err[0] = 0;
    A.restarting = false;
    int rc = rt_group_start(sup, RT_ADMIN_GROUP, RT_PERMANENT, &group);
    if (rc == 0)
        rc = rt__admin_worker_start(group);
    if (rc == 0)
        rt__admin_remote_start();
    if (rc == 0)
        rc = rt_supervisor_start_child(group, &listener, NULL);
    if (rc) {
        if (A.err[0])
            snprintf(err, errlen, "%s", A.err);
        else
            snprintf(err, errlen, "admin socket %s: cannot start its actors: %s", A.path,
                     rt_strerror(rc));
        rt_group_stop(sup, RT_ADMIN_GROUP);
        return rc;
    }
    rt_log(RT_LOG_INFO, "admin.started", "socket=%s", A.path);
    return 0;
}

void rt_admin_stop(void)
{
    rt_group_stop(A.sup, RT_ADMIN_GROUP);
}

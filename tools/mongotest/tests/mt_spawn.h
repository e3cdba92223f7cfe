/*
** Starts rt_mongo_test as a child process for the tests and stops it by pid.
** The child's stdout is a pipe; its first line "listening 127.0.0.1:PORT"
** gives the port.
*/
#ifndef MT_SPAWN_H
#define MT_SPAWN_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MT_SPAWN_WAIT_MS 5000 /* longest wait for the listening line */

typedef struct mt_child {
    pid_t pid;
    int port;
} mt_child_t;

/* Starts bin --port port [--db db]; 0 with child filled in, -1 on failure (reason on stderr). */
static inline int mt_spawn(const char *bin, int port, const char *db, mt_child_t *child)
{
    int fds[2];
    char portarg[16], line[128];
    size_t len = 0;
    if (pipe(fds))
        return -1;
    snprintf(portarg, sizeof portarg, "%d", port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (db)
            execl(bin, bin, "--port", portarg, "--db", db, (char *)NULL);
        else
            execl(bin, bin, "--port", portarg, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    /* Read byte by byte up to the newline, so nothing after the line is consumed. */
    while (len < sizeof line - 1) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        if (poll(&p, 1, MT_SPAWN_WAIT_MS) != 1 || read(fds[0], line + len, 1) != 1)
            break;
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = 0;
    close(fds[0]);
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening ", 10) || !colon || atoi(colon + 1) <= 0) {
        fprintf(stderr, "mt_spawn: %s did not print its listening line (got '%s')\n", bin, line);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    child->pid = pid;
    child->port = atoi(colon + 1);
    return 0;
}

/* Stops the child with sig and reaps it; returns its exit status, or -1 if it died by a signal. */
static inline int mt_stop(mt_child_t *child, int sig)
{
    int status = 0;
    if (child->pid <= 0)
        return -1;
    kill(child->pid, sig);
    while (waitpid(child->pid, &status, 0) < 0 && errno == EINTR)
        ;
    child->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline void mt_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

#endif

/*
** sd_notify(3)'s protocol, the part rtd uses: one datagram of KEY=VALUE lines to the unix
** socket systemd names in NOTIFY_SOCKET, a path or "@name" in the abstract namespace. The
** protocol is one of systemd's documented stable interfaces; libsystemd's sd_notify would
** add a build dependency (libsystemd-dev) and a library to link for this one sendto, and
** rtd needs none of what else it does (fd passing, watchdog, credentials).
*/
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "notify.h"

int rtd_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0])
        return 0;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n < 2 || n > sizeof(a.sun_path))
        return RT_EINVAL;
    memcpy(a.sun_path, path, n);
    if (a.sun_path[0] == '@') /* abstract: the name is the bytes after a NUL, no terminator */
        a.sun_path[0] = 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    size_t len = strlen(state);
    ssize_t sent = sendto(fd, state, len, MSG_NOSIGNAL, (struct sockaddr *)&a,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    int rc = sent < 0 ? -errno : (size_t)sent == len ? 0 : -EMSGSIZE;
    close(fd);
    return rc;
}

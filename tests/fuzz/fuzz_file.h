/*
** For targets whose parser reads a file by path (config, password and ACL files): the input
** is written to an in-memory file (memfd: no disk I/O per run, nothing left behind), named
** by its /proc/self/fd path.
*/
#ifndef RT_FUZZ_FILE_H
#define RT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static char path[64];
    static int fd = -1;
    if (fd < 0) {
        fd = memfd_create("rt-fuzz", 0);
        if (fd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    return path;
}

#endif

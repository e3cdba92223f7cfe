/*
** For targets whose parser reads a file by path (config, password and ACL files): the input
** is written to one scratch file per process, truncated each time.
*/
#ifndef RT_FUZZ_FILE_H
#define RT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static char path[64];
    static int fd = -1;
    if (fd < 0) {
        snprintf(path, sizeof path, "/tmp/rt-fuzz-XXXXXX");
        fd = mkstemp(path);
        if (fd < 0)
            abort();
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    return path;
}

#endif

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

static char fuzz_path[64];

static void fuzz_file_remove(void)
{
    unlink(fuzz_path);
}

static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) {
        snprintf(fuzz_path, sizeof fuzz_path, "/tmp/rt-fuzz-XXXXXX");
        fd = mkstemp(fuzz_path);
        if (fd < 0)
            abort();
        atexit(fuzz_file_remove);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    return fuzz_path;
}

#endif

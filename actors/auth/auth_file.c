/*
** Reading auth's files (the password file and the ACL file): whole, bounded in size, and
** line by line.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth_impl.h"

int rt__auth_read_file(const char *path, char **out, size_t *outlen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    rt_buf_t b = {0};
    char chunk[4096];
    size_t n;
    while (!b.oom && (n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (b.len + n >= RT_AUTH_MAX_FILE_BYTES) {
            rt_buf_free(&b);
            fclose(f);
            snprintf(err, errlen, "%s: larger than %u bytes", path, RT_AUTH_MAX_FILE_BYTES - 1);
            return RT_ELIMIT;
        }
        rt_buf_add(&b, chunk, n);
    }
    bool failed = ferror(f);
    fclose(f);
    /* Room for the NUL, which an empty file needs as much as any (fails once oom). */
    if (!rt_buf_reserve(&b, 0)) {
        rt_buf_free(&b);
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    if (failed) {
        rt_buf_free(&b);
        snprintf(err, errlen, "%s: read error", path);
        return RT_EINVAL;
    }
    b.data[b.len] = 0;
    *out = b.data;
    *outlen = b.len;
    return 0;
}

bool rt__auth_next_line(const char **pos, const char *end, const char **line, size_t *len)
{
    RT_ASSERT(*pos <= end);
    if (*pos >= end)
        return false;
    const char *nl = memchr(*pos, '\n', (size_t)(end - *pos));
    const char *stop = nl ? nl : end;
    *line = *pos;
    *len = (size_t)(stop - *pos);
    while (*len > 0 &&
           ((*line)[*len - 1] == '\r' || (*line)[*len - 1] == ' ' || (*line)[*len - 1] == '\t'))
        (*len)--;
    *pos = nl ? nl + 1 : end;
    return true;
}

/*
** A private temporary directory for tests that write files: tmpdir_make() at
** the start, tmpdir_put() to write a file in it, tmpdir_remove() at the end.
*/
#ifndef RT_TMPDIR_H
#define RT_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char tmpdir_path[64];

static inline int tmpdir_make(const char *name)
{
    /* Memory-backed where there is one: tests that write many small files stay fast. */
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(tmpdir_path, sizeof(tmpdir_path), "%s/%s.XXXXXX", base, name);
    return mkdtemp(tmpdir_path) ? 0 : -1;
}

/* Writes text to a file of the directory; the path returned stays valid for 4 more calls. */
static inline const char *tmpdir_put(const char *name, const char *text)
{
    static char paths[4][128];
    static int k;
    char *p = paths[k++ & 3];
    snprintf(p, sizeof(paths[0]), "%s/%s", tmpdir_path, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

static inline void tmpdir_remove(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir_path);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir_path);
}

#endif

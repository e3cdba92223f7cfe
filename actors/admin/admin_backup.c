/*
** `backup DIR`: copies of state.db, of every running sink's local files (its SQLite
** database, its spill file) and of every bridge's spill file in a new directory, laid out as a
*data_dir, so that an rtd
** started with data_dir = DIR finds each where it looks. Each copy is one snapshot taken
** with SQLite's online backup API while rtd goes on writing (rt_sqlite_backup), so what was
** committed when the backup began is in it: every acknowledged message of a persistent
** session, every retained message, every row a durable rule's PUBACK waited for (in the
** database or in the spill). A sink's spill is copied before its database: a row on its
** way from one to the other is then in one copy or both (replayed: at least once), never
** in neither. Runs on a blocking worker: copies read and write whole files.
*/
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "admin_impl.h"
#include "bridge.h"
#include "log.h"
#include "sink.h"
#include "store.h"

#define BACKUP_SINKS_MAX 64

/* Whether dir is an empty directory, or (made now) a new one; else 409 set on c. */
static bool fresh_dir(rt_admin_cmd_t *c, const char *dir)
{
    if (mkdir(dir, 0700) == 0)
        return true;
    if (errno != EEXIST) {
        rt__admin_fail(c, 409, "%s: cannot create: %s", dir, strerror(errno));
        return false;
    }
    DIR *d = opendir(dir);
    if (!d) {
        rt__admin_fail(c, 409, "%s: %s", dir, strerror(errno));
        return false;
    }
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    if (!empty)
        rt__admin_fail(c, 409, "%s is not empty: a backup goes into a new or empty directory", dir);
    return empty;
}

/*
** Where src goes in the backup: its path under data_dir, or for a file outside data_dir its
** name alone (*outside set). Directories on the way are made. NULL if it does not fit.
*/
static const char *place(const char *dir, const char *data_dir, const char *src, char *out,
                         size_t n, bool *outside)
{
    size_t dl = strlen(data_dir);
    *outside = !(strncmp(src, data_dir, dl) == 0 && src[dl] == '/');
    char base[512];
    snprintf(base, sizeof(base), "%s", src);
    const char *rel = *outside ? basename(base) : src + dl + 1;
    int k = snprintf(out, n, "%s/%s", dir, rel);
    if (k < 0 || (size_t)k >= n)
        return NULL;
    /* A sink file in a directory of data_dir ("archive/rt.db"): the same directories here. */
    for (char *p = out + strlen(dir) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(out, 0700);
        *p = '/';
    }
    return out + strlen(dir) + 1;
}

/* Copies src into the backup as one file of the answer; false with the error set on c. */
static bool copy_one(rt_admin_cmd_t *c, rt_doc_t *files, const char *dir, const char *owner_kind,
                     const char *owner, const char *src, uint64_t *total)
{
    char dst[1024], err[RT_ADMIN_ERR_MAX - 64];
    bool outside = false;
    const char *rel = place(dir, rt__admin_conf()->data_dir, src, dst, sizeof(dst), &outside);
    uint64_t bytes = 0;
    if (!rel) {
        rt__admin_fail(c, 400, "%s: the path in the backup is too long", src);
        return false;
    }
    int rc = rt_sqlite_backup(NULL, src, dst, &bytes, err, sizeof(err));
    if (rc) {
        rt__admin_fail(c, rc == RT_EEXIST ? 409 : 500, "backup incomplete in %s: %s", dir, err);
        return false;
    }
    rt_doc_t *f = rt_doc_add_object(files, NULL);
    rt_doc_add_str(f, "file", rel);
    rt_doc_add_str(f, "from", src);
    rt_doc_add_str(f, owner_kind, owner);
    rt_doc_add_u64(f, "bytes", bytes);
    if (outside) /* restored only by pointing the sink's `file` at it */
        rt_doc_add_bool(f, "outside_data_dir", true);
    *total += bytes;
    return true;
}

int rt__admin_backup(rt_admin_cmd_t *c)
{
    if (c->argc != 2)
        return rt__admin_fail(c, 400, "usage: backup DIR");
    const char *dir = c->argv[1];
    /* rtd's working directory is not the caller's ("/" under systemd). */
    if (dir[0] != '/' || strlen(dir) != c->arglen[1] || strlen(dir) > 400)
        return rt__admin_fail(c, 400, "backup DIR: an absolute path of at most 400 bytes");
    uint64_t t0 = rt_mono_ms(), total = 0;
    if (!fresh_dir(c, dir))
        return c->code;
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "dir", dir);
    rt_doc_t *files = rt_doc_add_array(c->doc, "files");
    const char *state = rt_store_path();
    if (state[0] && !copy_one(c, files, dir, "sink", "", state, &total))
        return c->code;
    rt_sink_files_t *sinks = calloc(BACKUP_SINKS_MAX, sizeof(*sinks));
    if (!sinks)
        return rt__admin_fail(c, 500, "out of memory");
    size_t n = rt_sinks_files(sinks, BACKUP_SINKS_MAX);
    bool ok = true;
    struct stat st;
    for (size_t i = 0; ok && i < n && i < BACKUP_SINKS_MAX; i++) {
        /* The spill first: see the top of the file. One is there only while rows wait. */
        if (sinks[i].spill[0] && stat(sinks[i].spill, &st) == 0)
            ok = copy_one(c, files, dir, "sink", sinks[i].name, sinks[i].spill, &total);
        if (ok && sinks[i].db[0] && stat(sinks[i].db, &st) == 0)
            ok = copy_one(c, files, dir, "sink", sinks[i].name, sinks[i].db, &total);
    }
    free(sinks);
    /* A durable bridge's PUBACK may have waited for its spill. */
    char bridge_spills[RT_CONF_MAX_BRIDGES][512], bridge_names[RT_CONF_MAX_BRIDGES][64];
    size_t nb = rt_bridges_spill_files(bridge_spills, bridge_names, RT_CONF_MAX_BRIDGES);
    for (size_t i = 0; ok && i < nb && i < RT_CONF_MAX_BRIDGES; i++)
        if (bridge_spills[i][0] && stat(bridge_spills[i], &st) == 0)
            ok = copy_one(c, files, dir, "bridge", bridge_names[i], bridge_spills[i], &total);
    if (!ok)
        return c->code;
    uint64_t ms = rt_mono_ms() - t0;
    rt_doc_add_u64(c->doc, "bytes", total);
    rt_doc_add_u64(c->doc, "ms", ms);
    rt_log(RT_LOG_INFO, "admin.backup", "dir=%s bytes=%llu ms=%llu", dir, (unsigned long long)total,
           (unsigned long long)ms);
    return 200;
}

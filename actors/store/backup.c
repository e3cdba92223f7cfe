/*
** Online copies of SQLite files (rt_sqlite_backup): state.db before a migration, and
** `rtctl backup`'s copies of state.db and the sinks' databases while rtd writes them.
**
** The copy is SQLite's online backup API run to the end in one step, so the source is read
** in one read transaction: in WAL mode that is one snapshot (everything committed when it
** began, nothing after), and the writers go on meanwhile, never waiting for it. A copy
** taken in several steps would start over at every commit of another connection, which
** under a steady load is every few milliseconds.
*/
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sqlite_mem.h"
#include "store.h"

/* fsync of path (a file, or a directory after a rename in it); 0 or an errno. */
static int sync_path(const char *path, bool dir)
{
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int rc = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return rc;
}

static int copy_into(sqlite3 *src, const char *tmp, char *err, size_t errlen)
{
    sqlite3 *dst = NULL;
    int rc = rt_store_create_private(tmp);
    if (rc) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(rc));
        return RT_EINVAL;
    }
    rc = sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE, NULL);
    sqlite3_backup *b = rc == SQLITE_OK ? sqlite3_backup_init(dst, "main", src, "main") : NULL;
    if (b) {
        /* The source may be busy for a moment (a checkpoint): wait as a writer would. */
        for (int tries = 0; (rc = sqlite3_backup_step(b, -1)) == SQLITE_BUSY || rc == SQLITE_LOCKED;
             tries++) {
            if (tries == 100)
                break;
            sqlite3_sleep(10);
        }
        sqlite3_backup_finish(b);
        if (rc == SQLITE_DONE)
            rc = sqlite3_errcode(dst);
    } else if (rc == SQLITE_OK) {
        rc = sqlite3_errcode(dst);
    }
    if (rc != SQLITE_OK && rc != SQLITE_DONE)
        snprintf(err, errlen, "%s: %s", tmp, dst ? sqlite3_errmsg(dst) : sqlite3_errstr(rc));
    sqlite3_close(dst);
    return rc == SQLITE_OK || rc == SQLITE_DONE ? 0 : RT_EINVAL;
}

int rt_sqlite_backup(struct sqlite3 *src, const char *src_path, const char *dst, uint64_t *bytes,
                     char *err, size_t errlen)
{
    struct stat st;
    if (lstat(dst, &st) == 0) {
        snprintf(err, errlen, "%s exists (a copy is never written over)", dst);
        return RT_EEXIST;
    }
    rt_sqlite_mem_init();
    sqlite3 *own = NULL;
    if (!src) {
        /* Read only, and never made: a file that is not there is an error, not a new database. */
        if (sqlite3_open_v2(src_path, &own, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
            snprintf(err, errlen, "%s: %s", src_path, own ? sqlite3_errmsg(own) : "cannot open");
            sqlite3_close(own);
            return RT_EINVAL;
        }
        sqlite3_busy_timeout(own, 1000);
        src = own;
    }
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s.tmp", dst);
    unlink(tmp); /* an earlier copy that did not finish */
    int rc = copy_into(src, tmp, err, errlen);
    sqlite3_close(own);
    int e = rc ? 0 : sync_path(tmp, false);
    if (!rc && !e && rename(tmp, dst) != 0)
        e = errno;
    if (!rc && e) {
        snprintf(err, errlen, "%s: %s", dst, strerror(e));
        rc = RT_EINVAL;
    }
    if (rc) {
        unlink(tmp);
        return rc;
    }
    /* The rename itself must survive a crash too. */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", dst);
    sync_path(dirname(dir), true);
    if (bytes)
        *bytes = stat(dst, &st) == 0 ? (uint64_t)st.st_size : 0;
    return 0;
}

/*
** HTTP file upload's files (upload.h).
*/
#define _GNU_SOURCE /* O_NOFOLLOW, renameat */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common.h"
#include "log.h"
#include "rt.h"
#include "upload.h"

#define KEY_FILE ".key"
#define KEY_LEN 32
#define META_MAX (24 + RT_UPLOAD_TYPE_MAX + RT_UPLOAD_NAME_MAX + 8)

/*
** What each user's files and slots take, remembered by the slot maker (direct-mapped by the
** user's folder name, itself an HMAC: evenly spread), so that a user asking for slot after
** slot costs one folder scan, not one a request (10,000 files each time). Slots add to it;
** the sweep forgets it all, a forgotten account its own; a collision only rescans.
*/
#define USAGE_SLOTS 1024
typedef struct usage_s {
    char user[RT_UPLOAD_ID_HEX + 1]; /* "": none */
    uint64_t bytes;
    size_t files;
} usage_t;

struct rt_upload_s {
    int dir; /* ROOT, open */
    uint8_t key[KEY_LEN];
    usage_t usage[USAGE_SLOTS];
};

static void log_io(const char *what, const char *path)
{
    rt_log(RT_LOG_ERROR, "xmpp.upload_io", "what=%s path=%s error=%s", what, path, strerror(errno));
}

/* The key, read from ROOT/.key or made there: false (logged) when neither works. */
static bool load_key(int dir, uint8_t *key)
{
    int fd = openat(dir, KEY_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        bool ok = read(fd, key, KEY_LEN) == KEY_LEN;
        close(fd);
        if (!ok)
            rt_log(RT_LOG_ERROR, "xmpp.upload_io", "what=key path=%s error=short", KEY_FILE);
        return ok;
    }
    if (rt_random(key, KEY_LEN) != 0)
        return false;
    fd = openat(dir, KEY_FILE, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, key, KEY_LEN) == KEY_LEN && fsync(fd) == 0;
    if (!ok)
        log_io("key", KEY_FILE);
    if (fd >= 0)
        close(fd);
    return ok;
}

void rt_upload_root(const char *data_dir, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", data_dir, RT_UPLOAD_DIR);
}

int rt_upload_open(const char *root, rt_upload_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (mkdir(root, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot make %s: %s", root, strerror(errno));
        return RT_EAGAIN;
    }
    rt_upload_t *u = calloc(1, sizeof(*u));
    if (!u) {
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    u->dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (u->dir < 0 || !load_key(u->dir, u->key)) {
        snprintf(err, errlen, "cannot open %s or its key: %s", root, strerror(errno));
        rt_upload_close(u);
        return RT_EAGAIN;
    }
    *out = u;
    return 0;
}

void rt_upload_close(rt_upload_t *u)
{
    if (!u)
        return;
    if (u->dir >= 0)
        close(u->dir);
    OPENSSL_cleanse(u->key, sizeof(u->key));
    free(u);
}

/* ---- Names ---- */

bool rt_upload_name_ok(const char *name, size_t len)
{
    if (!len || len > RT_UPLOAD_NAME_MAX || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
        strlen(name) != len)
        return false;
    const unsigned char *p = (const unsigned char *)name;
    for (size_t i = 0; i < len;) {
        if (p[i] < 0x20 || p[i] == 0x7f || p[i] == '/' || p[i] == '\\')
            return false;
        size_t n = rt_utf8_len(p + i, len - i);
        if (!n)
            return false;
        i += n;
    }
    return true;
}

static bool token_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("!#$&-^_.+", c);
}

bool rt_upload_type_ok(const char *type)
{
    size_t n = strlen(type), i = 0, first;
    if (!n || n > RT_UPLOAD_TYPE_MAX)
        return false;
    for (first = i; i < n && token_char(type[i]); i++)
        ;
    if (i == first || i >= n || type[i++] != '/')
        return false;
    for (first = i; i < n && token_char(type[i]); i++)
        ;
    if (i == first)
        return false;
    for (; i < n; i++) /* parameters: printable ASCII */
        if (type[i] < 0x20 || type[i] > 0x7e)
            return false;
    return true;
}

static bool hex_id(const char *s, size_t n)
{
    if (n != RT_UPLOAD_ID_HEX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int rt_upload_parse(const char *path, rt_upload_id_t *id, char *name, size_t cap)
{
    const char *a = strchr(path, '/');
    const char *b = a ? strchr(a + 1, '/') : NULL;
    if (!b || !hex_id(path, (size_t)(a - path)) || !hex_id(a + 1, (size_t)(b - a - 1)))
        return RT_EINVAL;
    memcpy(id->user, path, RT_UPLOAD_ID_HEX);
    id->user[RT_UPLOAD_ID_HEX] = 0;
    memcpy(id->slot, a + 1, RT_UPLOAD_ID_HEX);
    id->slot[RT_UPLOAD_ID_HEX] = 0;
    size_t n = 0;
    for (const char *p = b + 1; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int h = hex_value(p[1]), l = h < 0 ? -1 : hex_value(p[2]);
            if (l < 0)
                return RT_EINVAL;
            c = h << 4 | l;
            p += 2;
        }
        if (n + 1 >= cap || c == 0)
            return RT_EINVAL;
        name[n++] = (char)c;
    }
    name[n] = 0;
    return rt_upload_name_ok(name, n) ? 0 : RT_EINVAL;
}

/* ---- Slots ---- */

typedef struct meta_s {
    uint64_t size;
    char type[RT_UPLOAD_TYPE_MAX + 1];
    char name[RT_UPLOAD_NAME_MAX + 1];
} meta_t;

static void file_name(char *out, size_t cap, const char *slot, const char *ext)
{
    snprintf(out, cap, "%s.%s", slot, ext);
}

/* The slot's meta file: 0, RT_ENOTFOUND, or RT_EAGAIN; *made: its mtime. */
static int meta_read(int dir, const char *slot, meta_t *m, time_t *made)
{
    char fname[64], buf[META_MAX + 1];
    file_name(fname, sizeof(fname), slot, "meta");
    int fd = openat(dir, fname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? RT_ENOTFOUND : RT_EAGAIN;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 ? read(fd, buf, META_MAX) : -1;
    close(fd);
    if (n <= 0)
        return RT_EAGAIN;
    buf[n] = 0;
    *made = st.st_mtime;
    char *type = strchr(buf, '\n'), *name = type ? strchr(type + 1, '\n') : NULL;
    char *end = name ? strchr(name + 1, '\n') : NULL;
    if (!end)
        return RT_ENOTFOUND; /* not one of ours */
    *type++ = 0, *name++ = 0, *end = 0;
    m->size = strtoull(buf, NULL, 10);
    snprintf(m->type, sizeof(m->type), "%s", type);
    snprintf(m->name, sizeof(m->name), "%s", name);
    return 0;
}

/* The user's directory: HMAC-SHA-256(key, bare), its first 16 bytes in hex. */
static void user_dir(const rt_upload_t *u, const char *bare, char *out)
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    HMAC(EVP_sha256(), u->key, KEY_LEN, (const unsigned char *)bare, strlen(bare), mac, &len);
    for (size_t i = 0; i < RT_UPLOAD_ID_HEX / 2; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* A listing of the directory open at dir (dir stays open, and the caller's), or NULL. */
static DIR *listing(int dir)
{
    int fd = dir >= 0 ? dup(dir) : -1;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0)
        close(fd);
    if (d) /* a dup shares its offset with dir: an earlier listing left it at the end */
        rewinddir(d);
    return d;
}

static usage_t *usage_of(rt_upload_t *u, const char *user)
{
    size_t i = 0;
    for (int k = 0; k < 4; k++) /* 16 bits of an HMAC: as even as any hash */
        i = i << 4 | (size_t)hex_value(user[k]);
    return &u->usage[i % USAGE_SLOTS];
}

/* Bytes and entries of the .part and .data files in dir. */
static void scan_usage(int dir, uint64_t *bytes, size_t *files)
{
    *bytes = 0;
    *files = 0;
    DIR *d = listing(dir);
    if (!d)
        return;
    struct dirent *e;
    struct stat st;
    while ((e = readdir(d)) != NULL) {
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || (strcmp(dot, ".part") != 0 && strcmp(dot, ".data") != 0) ||
            fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        *bytes += (uint64_t)st.st_size;
        ++*files;
    }
    closedir(d);
}

int rt_upload_slot(rt_upload_t *u, const char *bare, const char *name, uint64_t size,
                   const char *type, uint64_t quota, rt_upload_id_t *id, uint64_t *used)
{
    *used = 0;
    if (!rt_upload_name_ok(name, strlen(name)) || (type[0] && !rt_upload_type_ok(type)) ||
        size == 0 || size > (uint64_t)INT64_MAX)
        return RT_EINVAL;
    user_dir(u, bare, id->user);
    if (mkdirat(u->dir, id->user, 0700) != 0 && errno != EEXIST) {
        log_io("mkdir", id->user);
        return RT_EAGAIN;
    }
    int dir = openat(u->dir, id->user, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) {
        log_io("open", id->user);
        return RT_EAGAIN;
    }
    usage_t *known = usage_of(u, id->user);
    if (strcmp(known->user, id->user) != 0) {
        scan_usage(dir, &known->bytes, &known->files);
        memcpy(known->user, id->user, sizeof(known->user));
    }
    *used = known->bytes;
    if ((quota && (*used + size > quota || *used + size < size)) ||
        known->files >= RT_UPLOAD_FILES_MAX) {
        close(dir);
        return RT_ELIMIT;
    }
    char fname[64], meta[META_MAX];
    int rc = rt_random_hex(id->slot, RT_UPLOAD_ID_HEX / 2) == 0 ? 0 : RT_EAGAIN;
    int n = snprintf(meta, sizeof(meta), "%llu\n%s\n%s\n", (unsigned long long)size, type, name);
    file_name(fname, sizeof(fname), id->slot, "meta");
    int fd =
        rc ? -1 : openat(dir, fname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, meta, (size_t)n) != n) {
        rc = RT_EAGAIN;
        log_io("meta", id->slot);
    }
    if (fd >= 0)
        close(fd);
    file_name(fname, sizeof(fname), id->slot, "part");
    fd = rc ? -1 : openat(dir, fname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (!rc && (fd < 0 || ftruncate(fd, (off_t)size) != 0)) {
        rc = RT_EAGAIN;
        log_io("part", id->slot);
    }
    if (fd >= 0)
        close(fd);
    close(dir);
    if (rc) {
        known->user[0] = 0; /* half made: counted again at the next slot */
    } else {
        known->bytes += size;
        known->files++;
    }
    return rc;
}

/* ---- PUT and GET ---- */

/* ROOT/USER open, or -1. */
static int open_user(const char *root, const rt_upload_id_t *id)
{
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/%s", root, id->user);
    if (n < 0 || (size_t)n >= sizeof(path))
        return -1;
    return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* The slot's meta when its name is name: 0, RT_ENOTFOUND or RT_EAGAIN. */
static int slot_of(int dir, const rt_upload_id_t *id, const char *name, meta_t *m, time_t *made)
{
    int rc = meta_read(dir, id->slot, m, made);
    return rc ? rc : strcmp(m->name, name) == 0 ? 0 : RT_ENOTFOUND;
}

/* Whether a PUT's type is the slot's: the same media type, parameters and case aside. */
static bool same_type(const char *slot, const char *put)
{
    size_t a = strcspn(slot, "; \t"), b = strcspn(put, "; \t");
    return !slot[0] || (a == b && strncasecmp(slot, put, a) == 0);
}

int rt_upload_put_open(const char *root, const rt_upload_id_t *id, const char *name, uint64_t len,
                       const char *type, uint32_t slot_timeout, int *fd)
{
    *fd = -1;
    int dir = open_user(root, id);
    if (dir < 0)
        return errno == ENOENT ? RT_ENOTFOUND : RT_EAGAIN;
    meta_t m;
    time_t made;
    char fname[64];
    int rc = slot_of(dir, id, name, &m, &made);
    file_name(fname, sizeof(fname), id->slot, "data");
    if (!rc && faccessat(dir, fname, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
        rc = RT_EEXIST;
    else if (!rc && time(NULL) - made > (time_t)slot_timeout)
        rc = RT_EBUSY; /* over, whatever is sent */
    else if (!rc && len != m.size)
        rc = RT_ELIMIT;
    else if (!rc && !same_type(m.type, type))
        rc = RT_EPROTO;
    file_name(fname, sizeof(fname), id->slot, "part");
    if (!rc && (*fd = openat(dir, fname, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        rc = errno == ENOENT ? RT_ENOTFOUND : RT_EAGAIN;
    /* One PUT at a time: two into one file would interleave. The lock goes with the PUT's
       descriptor, closed once the file is in place, where .data then answers the next. */
    if (!rc && flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        rc = errno == EWOULDBLOCK ? RT_EEXIST : RT_EAGAIN;
        close(*fd);
        *fd = -1;
    }
    close(dir);
    return rc;
}

int rt_upload_put_end(const char *root, const rt_upload_id_t *id, int fd)
{
    bool synced = fdatasync(fd) == 0;
    close(fd);
    int dir = open_user(root, id);
    char part[64], data[64];
    file_name(part, sizeof(part), id->slot, "part");
    file_name(data, sizeof(data), id->slot, "data");
    bool ok = synced && dir >= 0 && renameat(dir, part, dir, data) == 0 && fsync(dir) == 0;
    if (!ok)
        log_io("put", id->slot);
    if (dir >= 0)
        close(dir);
    return ok ? 0 : RT_EAGAIN;
}

int rt_upload_get_open(const char *root, const rt_upload_id_t *id, const char *name, int *fd,
                       uint64_t *size, char *type, size_t cap)
{
    *fd = -1;
    int dir = open_user(root, id);
    if (dir < 0)
        return RT_ENOTFOUND;
    meta_t m;
    time_t made;
    char fname[64];
    struct stat st;
    int rc = slot_of(dir, id, name, &m, &made);
    file_name(fname, sizeof(fname), id->slot, "data");
    if (!rc &&
        ((*fd = openat(dir, fname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 || fstat(*fd, &st) != 0))
        rc = RT_ENOTFOUND;
    close(dir);
    if (rc) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return RT_ENOTFOUND;
    }
    *size = (uint64_t)st.st_size;
    snprintf(type, cap, "%s", m.type[0] ? m.type : "application/octet-stream");
    return 0;
}

/* ---- Expiry ---- */

/* Removes slot's three files in dir. */
static size_t remove_slot(int dir, const char *name)
{
    char slot[RT_UPLOAD_ID_HEX + 1], fname[64];
    snprintf(slot, sizeof(slot), "%.*s", RT_UPLOAD_ID_HEX, name);
    size_t removed = 0;
    static const char *const exts[] = {"part", "data", "meta"};
    for (size_t i = 0; i < 3; i++) {
        file_name(fname, sizeof(fname), slot, exts[i]);
        removed += unlinkat(dir, fname, 0) == 0 && i < 2;
    }
    return removed;
}

/* Whether the slot a file name in dir begins with has its file ext there. */
static bool slot_has(int dir, const char *name, const char *ext)
{
    char fname[64];
    snprintf(fname, sizeof(fname), "%.*s.%s", RT_UPLOAD_ID_HEX, name, ext);
    return faccessat(dir, fname, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* One user's directory: what is over goes. */
static size_t sweep_user(int dir, uint64_t expire, uint32_t slot_timeout, time_t now)
{
    size_t removed = 0;
    DIR *d = listing(dir);
    if (!d)
        return 0;
    struct dirent *e;
    struct stat st;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        const char *dot = strrchr(e->d_name, '.');
        if (fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !dot ||
            !hex_id(e->d_name, (size_t)(dot - e->d_name)))
            continue;
        bool over = false;
        if (strcmp(dot, ".data") == 0)
            over = expire && (uint64_t)(now - st.st_mtime) > expire;
        else if (strcmp(dot, ".part") == 0)
            over = now - st.st_mtime > (time_t)slot_timeout + RT_UPLOAD_PART_GRACE_S;
        else if (strcmp(dot, ".meta") == 0) /* alone: a slot whose making failed midway */
            over = !slot_has(dir, e->d_name, "part") && !slot_has(dir, e->d_name, "data") &&
                   now - st.st_mtime > (time_t)slot_timeout + RT_UPLOAD_PART_GRACE_S;
        if (over)
            removed += remove_slot(dir, e->d_name);
    }
    closedir(d);
    return removed;
}

size_t rt_upload_forget(rt_upload_t *u, const char *bare)
{
    char user[RT_UPLOAD_ID_HEX + 1];
    user_dir(u, bare, user);
    usage_t *known = usage_of(u, user);
    if (strcmp(known->user, user) == 0)
        known->user[0] = 0;
    int dir = openat(u->dir, user, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = listing(dir);
    if (!d) {
        if (dir >= 0)
            close(dir);
        return 0;
    }
    size_t removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *dot = strrchr(e->d_name, '.');
        if (e->d_name[0] != '.' && unlinkat(dir, e->d_name, 0) == 0 && dot &&
            (strcmp(dot, ".data") == 0 || strcmp(dot, ".part") == 0))
            removed++;
    }
    closedir(d);
    close(dir);
    unlinkat(u->dir, user, AT_REMOVEDIR);
    return removed;
}

size_t rt_upload_sweep(rt_upload_t *u, uint64_t expire, uint32_t slot_timeout, time_t now)
{
    for (size_t i = 0; i < USAGE_SLOTS; i++)
        u->usage[i].user[0] = 0;
    DIR *d = listing(u->dir);
    if (!d)
        return 0;
    size_t removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!hex_id(e->d_name, strlen(e->d_name)))
            continue;
        int dir = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir < 0)
            continue;
        removed += sweep_user(dir, expire, slot_timeout, now);
        close(dir);
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR); /* when empty: one with anything left stays */
    }
    closedir(d);
    return removed;
}

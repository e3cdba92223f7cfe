/*
** API keys: random 256-bit tokens given to a script once (`rtd apikey`, `rtctl apikey add`);
** the file keeps only their SHA-256. A fast hash is enough here, unlike passwords: a key has
** 256 bits of entropy, so a stolen file cannot be searched backwards, and checking a request
** costs one SHA-256 rather than a PBKDF2 run per HTTP request.
**
** The file is `NAME ROLE SHA256-HEX [CREATED]` lines (CREATED: ISO 8601 UTC; lines written
** before it was recorded have none), `#` comments kept as they are. It is read at start, on
** SIGHUP and by `rtctl apikey reload`; `apikey add|revoke` and `rtd apikey` change it under
** an exclusive flock, by writing a new file (0600) beside it and renaming it over the old,
** so a reader sees the old file or the new one, never half of one, and two writers (rtd and
** `rtd apikey`) never lose each other's lines.
*/
#define _GNU_SOURCE /* timegm */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "admin.h"
#include "common.h"
#include "http.h"
#include "http_impl.h"
#include "log.h"
#include "rt.h"

#define KEYS_MAX 256
#define KEY_PREFIX "rtk_"
#define KEYS_FILE_MAX (256 * 1024) /* bytes; 256 keys take some 40 KiB, comments the rest */
#define NAME_MAX_LEN 63

typedef struct {
    char name[NAME_MAX_LEN + 1];
    rt_http_role_t role;
    unsigned char hash[32];
    int64_t created;       /* unix seconds; 0: not recorded */
    uint64_t last_used_ms; /* wall clock of the last request it authenticated; 0: none since
                              rtd started (not kept in the file: a write per request) */
} api_key_t;

/*
** The keys in force. lock guards the table (every request reads it); file_lock orders the
** reloads and edits among themselves, so a reload that read the file before an edit cannot
** put the older table back after it.
*/
static struct {
    pthread_mutex_t lock, file_lock;
    char path[RT_CONF_PATH_MAX]; /* http.api_keys_file; "": none */
    api_key_t keys[KEYS_MAX];
    size_t n;
} K = {.lock = PTHREAD_MUTEX_INITIALIZER, .file_lock = PTHREAD_MUTEX_INITIALIZER};

static bool sha256(const char *s, unsigned char out[32])
{
    unsigned int n = 0;
    return EVP_Digest(s, strlen(s), out, &n, EVP_sha256(), NULL) == 1 && n == 32;
}

static bool unhex(const char *s, unsigned char *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return false;
        out[i] = (unsigned char)v;
    }
    return s[2 * n] == 0;
}

static rt_http_role_t role_of(const char *word)
{
    return strcmp(word, "admin") == 0 ? RT_HTTP_ROLE_ADMIN
           : strcmp(word, "read") == 0 ? RT_HTTP_ROLE_READ
                                       : RT_HTTP_ROLE_NONE;
}

static const char *role_name(rt_http_role_t role)
{
    return role == RT_HTTP_ROLE_ADMIN ? "admin" : "read";
}

/* A name fits a line and a log: 1 to 63 printable ASCII characters, no space and no '#'. */
static bool name_ok(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (name[i] <= ' ' || name[i] > '~' || name[i] == '#')
            return false;
    return n && n <= NAME_MAX_LEN;
}

static int64_t parse_time(const char *s)
{
    struct tm tm = {0};
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return end && !*end ? (int64_t)timegm(&tm) : -1;
}

/* The keys of a file's text (len bytes, NUL-terminated); 0, or RT_EINVAL naming the line. */
static int parse_keys(const char *text, const char *path, api_key_t *keys, size_t *n, char *err,
                      size_t errlen)
{
    *n = 0;
    int lineno = 0;
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        const char *next = line + len + (line[len] == '\n');
        lineno++;
        char copy[512], name[80], role[16], hex[80], created[40] = "";
        size_t lead = strspn(line, " \t");
        if (lead == len || line[lead] == '#') {
            line = next;
            continue;
        }
        int fields = 0;
        if (len < sizeof(copy)) {
            memcpy(copy, line, len);
            copy[len] = 0;
            fields = sscanf(copy, "%79s %15s %79s %39s", name, role, hex, created);
        }
        api_key_t *k = &keys[*n];
        if (*n == KEYS_MAX || fields < 3 || !name_ok(name) || role_of(role) == RT_HTTP_ROLE_NONE ||
            !unhex(hex, k->hash, 32) || (fields == 4 && parse_time(created) < 0)) {
            snprintf(err, errlen, "%s:%d: not \"NAME read|admin SHA256-HEX [CREATED]\"%s", path,
                     lineno, *n == KEYS_MAX ? " (more than 256 keys)" : "");
            return RT_EINVAL;
        }
        snprintf(k->name, sizeof(k->name), "%.63s", name); /* name_ok: at most 63 */
        k->role = role_of(role);
        k->created = fields == 4 ? parse_time(created) : 0;
        k->last_used_ms = 0;
        (*n)++;
        line = next;
    }
    return 0;
}

/* The whole file behind fd, NUL-terminated (free it); NULL with err set. */
static char *read_all(int fd, const char *path, char *err, size_t errlen)
{
    char *text = malloc(KEYS_FILE_MAX + 1);
    size_t len = 0;
    ssize_t got = 1;
    while (text && len <= KEYS_FILE_MAX &&
           (got = pread(fd, text + len, KEYS_FILE_MAX + 1 - len, (off_t)len)) > 0)
        len += (size_t)got;
    if (!text || got < 0 || len > KEYS_FILE_MAX || memchr(text, 0, len)) {
        snprintf(err, errlen, "%s: %s", path,
                 !text      ? "out of memory"
                 : got < 0  ? strerror(errno)
                 : len > KEYS_FILE_MAX ? "larger than 256 KiB: not a key file"
                                       : "holds a NUL byte: not a key file");
        free(text);
        return NULL;
    }
    text[len] = 0;
    return text;
}

/* Puts keys in force; each keeps the last use of the key with its hash in the old table. */
static void swap_in(const api_key_t *keys, size_t n)
{
    pthread_mutex_lock(&K.lock);
    static api_key_t fresh[KEYS_MAX]; /* under K.lock */
    memcpy(fresh, keys, n * sizeof(keys[0]));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < K.n; j++)
            if (memcmp(fresh[i].hash, K.keys[j].hash, 32) == 0)
                fresh[i].last_used_ms = K.keys[j].last_used_ms;
    memcpy(K.keys, fresh, n * sizeof(fresh[0]));
    K.n = n;
    pthread_mutex_unlock(&K.lock);
}

/* Reads and checks path into keys (KEYS_MAX room): 0 or an RT_E* code with err set. */
static int read_keys(const char *path, api_key_t *keys, size_t *n, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    /* Anyone who could write it could add an admin key. */
    int rc = rt_file_trusted(fd, path, "api_keys_file", err, errlen);
    char *text = rc ? NULL : read_all(fd, path, err, errlen);
    close(fd);
    if (!rc && !text)
        rc = RT_EACCES;
    if (!rc)
        rc = parse_keys(text, path, keys, n, err, errlen);
    free(text);
    return rc;
}

int rt_http_keys_load(const char *path, char *err, size_t errlen)
{
    api_key_t *keys = malloc(KEYS_MAX * sizeof(*keys));
    size_t n = 0;
    int rc = keys ? read_keys(path, keys, &n, err, errlen) : RT_ENOMEM;
    if (!keys)
        snprintf(err, errlen, "out of memory");
    if (rc == 0) {
        swap_in(keys, n);
        snprintf(K.path, sizeof(K.path), "%s", path);
    }
    free(keys);
    return rc;
}

int rt_http_keys_reload(char *err, size_t errlen)
{
    pthread_mutex_lock(&K.file_lock);
    char path[RT_CONF_PATH_MAX];
    snprintf(path, sizeof(path), "%s", K.path);
    int rc = path[0] ? rt_http_keys_load(path, err, errlen) : 0;
    pthread_mutex_unlock(&K.file_lock);
    if (!path[0])
        return 0; /* no API: nothing to read */
    if (rc) {
        rt_log(RT_LOG_ERROR, "apikey.reload_failed", "file=%s the keys in force stay: %s", path,
               err);
        return rc;
    }
    pthread_mutex_lock(&K.lock);
    size_t n = K.n;
    pthread_mutex_unlock(&K.lock);
    rt_log(RT_LOG_INFO, "apikey.reloaded", "file=%s keys=%zu", path, n);
    return 0;
}

rt_http_role_t rt_http_key_role(const char *key, char *name, size_t namelen)
{
    unsigned char h[32];
    name[0] = 0;
    if (!key[0] || !sha256(key, h))
        return RT_HTTP_ROLE_NONE;
    rt_http_role_t role = RT_HTTP_ROLE_NONE;
    uint64_t now = rt_wall_ms();
    pthread_mutex_lock(&K.lock);
    for (size_t i = 0; i < K.n; i++)
        if (CRYPTO_memcmp(K.keys[i].hash, h, 32) == 0) {
            role = K.keys[i].role;
            K.keys[i].last_used_ms = now;
            snprintf(name, namelen, "%s", K.keys[i].name);
        }
    pthread_mutex_unlock(&K.lock);
    return role;
}

/* ---- Changing the file ---- */

/*
** Opens path (made, 0600, if missing) and takes its flock. A writer that renamed a new file
** over it meanwhile leaves this descriptor on the old one: then the new one is opened and
** locked in turn. Returns the descriptor, or -1 with err set.
*/
static int lock_file(const char *path, char *err, size_t errlen)
{
    for (;;) {
        int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
        struct stat held, named;
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || fstat(fd, &held) != 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            if (fd >= 0)
                close(fd);
            return -1;
        }
        if (stat(path, &named) == 0 && named.st_dev == held.st_dev && named.st_ino == held.st_ino)
            return fd;
        close(fd);
    }
}

/* Writes text as path's new content: beside it, synced, renamed over it. */
static int replace_file(const char *path, const char *text, size_t len, char *err, size_t errlen)
{
    char tmp[RT_CONF_PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.new.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && fchmod(fd, 0600) == 0;
    for (size_t at = 0; ok && at < len;) {
        ssize_t n = write(fd, text + at, len - at);
        ok = n > 0 || (n < 0 && errno == EINTR);
        at += n > 0 ? (size_t)n : 0;
    }
    ok = ok && fsync(fd) == 0;
    int saved = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        snprintf(err, errlen, "%s: cannot write it: %s", fd < 0 ? tmp : path, strerror(saved));
        if (fd >= 0)
            unlink(tmp);
        return RT_EACCES;
    }
    /* The rename is durable once the directory is. */
    char dir[RT_CONF_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* Whether line (up to its newline) is a key named name. */
static bool line_names(const char *line, const char *name)
{
    line += strspn(line, " \t");
    size_t n = strlen(name);
    return strncmp(line, name, n) == 0 && (line[n] == ' ' || line[n] == '\t');
}

/*
** Changes the key file at path: drops the keys named revoke (NULL: none; RT_ENOTFOUND when
** there is none) and appends add (a whole line, NULL: none), unless a key is named name
** (RT_EEXIST). keys/n get the new file's keys.
*/
static int edit_keys(const char *path, const char *name, const char *revoke, const char *add,
                     api_key_t *keys, size_t *n, char *err, size_t errlen)
{
    int fd = lock_file(path, err, errlen);
    if (fd < 0)
        return RT_EACCES;
    int rc = rt_file_trusted(fd, path, "api_keys_file", err, errlen);
    char *text = rc ? NULL : read_all(fd, path, err, errlen);
    char *out = text ? malloc(strlen(text) + (add ? strlen(add) : 0) + 2) : NULL;
    if (!rc && !out)
        rc = text ? RT_ENOMEM : RT_EACCES;
    if (rc == RT_ENOMEM)
        snprintf(err, errlen, "out of memory");
    if (!rc)
        rc = parse_keys(text, path, keys, n, err, errlen);
    bool found = false;
    for (size_t i = 0; !rc && i < *n; i++)
        found |= strcmp(keys[i].name, name) == 0;
    if (!rc && add && found) {
        snprintf(err, errlen, "a key named \"%s\" exists (revoke it first)", name);
        rc = RT_EEXIST;
    } else if (!rc && add && *n == KEYS_MAX) {
        snprintf(err, errlen, "%s holds 256 keys, the most it may", path);
        rc = RT_EINVAL;
    } else if (!rc && revoke && !found) {
        snprintf(err, errlen, "no key named \"%s\" in %s", name, path);
        rc = RT_ENOTFOUND;
    }
    size_t len = 0;
    for (const char *line = text; !rc && *line;) {
        size_t l = strcspn(line, "\n");
        if (!(revoke && line_names(line, revoke))) {
            memcpy(out + len, line, l);
            len += l;
            out[len++] = '\n';
        }
        line += l + (line[l] == '\n');
    }
    if (!rc && add)
        len += (size_t)sprintf(out + len, "%s", add);
    if (!rc)
        out[len] = 0;
    if (!rc)
        rc = parse_keys(out, path, keys, n, err, errlen);
    if (!rc)
        rc = replace_file(path, out, len, err, errlen);
    free(out);
    free(text);
    close(fd); /* the lock goes with it */
    return rc;
}

/* A new key into key (RT_ADMIN_KEY_LEN) and its file line into line. */
static int make_key(const char *name, const char *role, char *key, char *line, size_t linelen,
                    char *err, size_t errlen)
{
    if (!name_ok(name)) {
        snprintf(err, errlen, "key name \"%.64s\": 1 to 63 printable characters, no space or "
                              "'#'", name);
        return RT_EINVAL;
    }
    if (role_of(role) == RT_HTTP_ROLE_NONE) {
        snprintf(err, errlen, "role \"%.16s\": read or admin", role);
        return RT_EINVAL;
    }
    unsigned char raw[32], h[32];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        snprintf(err, errlen, "no randomness: %s", strerror(errno));
        return RT_EAGAIN;
    }
    int at = snprintf(key, RT_ADMIN_KEY_LEN, KEY_PREFIX);
    for (size_t i = 0; i < sizeof(raw); i++)
        at += snprintf(key + at, RT_ADMIN_KEY_LEN - (size_t)at, "%02x", raw[i]);
    OPENSSL_cleanse(raw, sizeof(raw));
    if (!sha256(key, h)) {
        snprintf(err, errlen, "SHA-256 failed");
        return RT_ENOMEM;
    }
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    at = snprintf(line, linelen, "%s %s ", name, role);
    for (size_t i = 0; i < sizeof(h); i++)
        at += snprintf(line + at, linelen - (size_t)at, "%02x", h[i]);
    snprintf(line + at, linelen - (size_t)at, " %s\n", when);
    return 0;
}

/* Adds (key_line) or revokes keys in the file in force, and puts the new file in force. */
static int change_keys(const char *name, const char *revoke, const char *add, char *err,
                       size_t errlen)
{
    api_key_t *keys = malloc(KEYS_MAX * sizeof(*keys));
    if (!keys) {
        snprintf(err, errlen, "out of memory");
        return RT_ENOMEM;
    }
    pthread_mutex_lock(&K.file_lock);
    int rc = RT_ENOTFOUND;
    size_t n = 0;
    if (!K.path[0])
        snprintf(err, errlen, "http.api_keys_file is not set: rtd has no file to keep keys in");
    else
        rc = edit_keys(K.path, name, revoke, add, keys, &n, err, errlen);
    if (rc == 0)
        swap_in(keys, n);
    pthread_mutex_unlock(&K.file_lock);
    free(keys);
    return rc;
}

/* ---- For the admin commands (rt_admin_apikeys_t) ---- */

static const char *keys_file(void)
{
    return K.path;
}

static void keys_each(void (*fn)(void *ud, const char *name, const char *role, int64_t created_s,
                                 uint64_t last_used_ms),
                      void *ud)
{
    api_key_t *copy = malloc(KEYS_MAX * sizeof(*copy));
    if (!copy)
        return;
    pthread_mutex_lock(&K.lock);
    size_t n = K.n;
    memcpy(copy, K.keys, n * sizeof(*copy));
    pthread_mutex_unlock(&K.lock);
    for (size_t i = 0; i < n; i++)
        fn(ud, copy[i].name, role_name(copy[i].role), copy[i].created, copy[i].last_used_ms);
    free(copy);
}

static int keys_add(const char *name, const char *role, char *key, char *err, size_t errlen)
{
    char line[256];
    int rc = make_key(name, role, key, line, sizeof(line), err, errlen);
    return rc ? rc : change_keys(name, NULL, line, err, errlen);
}

static int keys_revoke(const char *name, char *err, size_t errlen)
{
    return change_keys(name, name, NULL, err, errlen);
}

static int keys_reload(char *err, size_t errlen)
{
    if (!K.path[0]) {
        snprintf(err, errlen, "http.api_keys_file is not set");
        return RT_ENOTFOUND;
    }
    return rt_http_keys_reload(err, errlen);
}

const rt_admin_apikeys_t rt__http_apikeys = {
    .file = keys_file,
    .each = keys_each,
    .add = keys_add,
    .revoke = keys_revoke,
    .reload = keys_reload,
};

/* ---- rtd apikey ---- */

static int apikey_usage(FILE *out, int status, const char *default_config)
{
    fprintf(out,
            "usage: rtd apikey NAME read|admin [-c CONFIG | -f FILE]\n"
            "Makes an API key for the HTTP API, prints it once, and adds its SHA-256 to the key\n"
            "file: FILE, else CONFIG's http.api_keys_file (CONFIG: rtd's default, %s).\n"
            "A running rtd uses it after SIGHUP or `rtctl apikey reload`; `rtctl apikey add`\n"
            "does both at once. NAME: 1 to 63 printable characters, no space or '#'.\n",
            default_config);
    return status;
}

/* The key file CONFIG names, into file; 0 or 2 (said on stderr). */
static int file_of_config(const char *config, char *file, size_t len)
{
    rt_conf_t *conf = malloc(sizeof(*conf));
    char err[RT_CONF_ERR_LEN];
    if (!conf) {
        fprintf(stderr, "rtd apikey: out of memory\n");
        return 2;
    }
    rt_conf_defaults(conf);
    int rc = rt_conf_load(conf, config, err, sizeof(err));
    if (rc)
        fprintf(stderr, "rtd apikey: %s\n", err);
    else if (!conf->http.api_keys_file[0])
        fprintf(stderr,
                "rtd apikey: %s has no http.api_keys_file: set it in its http table, or name "
                "the file with -f FILE\n",
                config);
    else
        snprintf(file, len, "%s", conf->http.api_keys_file);
    bool ok = rc == 0 && conf->http.api_keys_file[0];
    free(conf);
    return ok ? 0 : 2;
}

int rt_http_apikey_main(int argc, char **argv, const char *default_config)
{
    const char *file = NULL, *config = NULL;
    const char *words[2];
    int nwords = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return apikey_usage(stdout, 0, default_config);
        if (strcmp(argv[i], "-f") == 0 && i + 1 < argc)
            file = argv[++i];
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (argv[i][0] != '-' && nwords < 2)
            words[nwords++] = argv[i];
        else
            return apikey_usage(stderr, 2, default_config);
    }
    if (nwords != 2 || (file && config))
        return apikey_usage(stderr, 2, default_config);
    char from_config[RT_CONF_PATH_MAX];
    if (!file) {
        int rc = file_of_config(config ? config : default_config, from_config, sizeof(from_config));
        if (rc)
            return rc;
        file = from_config;
    }
    char key[RT_ADMIN_KEY_LEN], line[256], err[RT_CONF_ERR_LEN];
    api_key_t *keys = malloc(KEYS_MAX * sizeof(*keys));
    size_t n;
    int rc = keys ? make_key(words[0], words[1], key, line, sizeof(line), err, sizeof(err))
                  : RT_ENOMEM;
    if (!keys)
        snprintf(err, sizeof(err), "out of memory");
    if (rc == 0)
        rc = edit_keys(file, words[0], NULL, line, keys, &n, err, sizeof(err));
    free(keys);
    if (rc) {
        fprintf(stderr, "rtd apikey: %s\n", err);
        return rc == RT_EINVAL || rc == RT_EEXIST ? 2 : 1;
    }
    printf("%s\n", key);
    return 0;
}

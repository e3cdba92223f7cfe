/*
** API keys: random 256-bit tokens given to a script once (`rtd apikey`); the file keeps
** only their SHA-256. A fast hash is enough here, unlike passwords: a key has 256 bits of
** entropy, so a stolen file cannot be searched backwards, and checking a request costs one
** SHA-256 rather than a PBKDF2 run per HTTP request.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common.h"
#include "rt.h"
#include "http.h"

#define KEYS_MAX 256
#define KEY_PREFIX "rtk_"

typedef struct {
    char name[64];
    rt_http_role_t role;
    unsigned char hash[32];
} api_key_t;

static struct {
    pthread_mutex_t lock;
    api_key_t keys[KEYS_MAX];
    size_t n;
} K = {.lock = PTHREAD_MUTEX_INITIALIZER};

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

int rt_http_keys_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    int trusted = rt_file_trusted(fileno(f), path, "api_keys_file", err, errlen);
    if (trusted) { /* anyone who could write it could add an admin key */
        fclose(f);
        return trusted;
    }
    static api_key_t keys[KEYS_MAX];
    size_t n = 0;
    char line[512];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        char name[64], role[16], hex[80];
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (n == KEYS_MAX || sscanf(line, "%63s %15s %79s", name, role, hex) != 3 ||
            role_of(role) == RT_HTTP_ROLE_NONE || !unhex(hex, keys[n].hash, 32)) {
            snprintf(err, errlen, "%s:%d: not \"NAME read|admin SHA256-HEX\"%s", path, lineno,
                     n == KEYS_MAX ? " (too many keys)" : "");
            rc = RT_EINVAL;
            break;
        }
        snprintf(keys[n].name, sizeof(keys[n].name), "%s", name);
        keys[n].role = role_of(role);
        n++;
    }
    fclose(f);
    if (rc)
        return rc;
    pthread_mutex_lock(&K.lock);
    memcpy(K.keys, keys, n * sizeof(keys[0]));
    K.n = n;
    pthread_mutex_unlock(&K.lock);
    return 0;
}

rt_http_role_t rt_http_key_role(const char *key)
{
    unsigned char h[32];
    if (!key[0] || !sha256(key, h))
        return RT_HTTP_ROLE_NONE;
    rt_http_role_t role = RT_HTTP_ROLE_NONE;
    pthread_mutex_lock(&K.lock);
    for (size_t i = 0; i < K.n; i++)
        if (CRYPTO_memcmp(K.keys[i].hash, h, 32) == 0)
            role = K.keys[i].role;
    pthread_mutex_unlock(&K.lock);
    return role;
}

void rt_http_key_name(const char *key, char *name, size_t len)
{
    unsigned char h[32];
    name[0] = 0;
    if (!key[0] || !sha256(key, h))
        return;
    pthread_mutex_lock(&K.lock);
    for (size_t i = 0; i < K.n; i++)
        if (CRYPTO_memcmp(K.keys[i].hash, h, 32) == 0)
            snprintf(name, len, "%s", K.keys[i].name);
    pthread_mutex_unlock(&K.lock);
}

int rt_http_apikey_main(int argc, char **argv)
{
    const char *file = "etc/api_keys";
    if (argc == 5 && strcmp(argv[3], "-f") == 0)
        file = argv[4];
    if ((argc != 3 && argc != 5) || role_of(argv[2]) == RT_HTTP_ROLE_NONE ||
        strlen(argv[1]) >= 64 || strpbrk(argv[1], " \t\n#")) {
        fprintf(stderr, "usage: rtd apikey NAME read|admin [-f FILE]\n"
                        "Makes an API key for the HTTP API, prints it once, and appends its\n"
                        "SHA-256 to FILE (default etc/api_keys; http.api_keys_file).\n");
        return 2;
    }
    unsigned char raw[32];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        fprintf(stderr, "rtd apikey: no randomness: %s\n", strerror(errno));
        return 1;
    }
    char key[sizeof(KEY_PREFIX) + 64];
    int at = snprintf(key, sizeof(key), KEY_PREFIX);
    for (size_t i = 0; i < sizeof(raw); i++)
        at += snprintf(key + at, sizeof(key) - (size_t)at, "%02x", raw[i]);
    unsigned char h[32];
    /* 0600 when it is made: the hashes are no secret, but who may add a line is. */
    int fd = sha256(key, h) ? open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    if (!f) {
        fprintf(stderr, "rtd apikey: %s: %s\n", file, strerror(errno));
        return 1;
    }
    fprintf(f, "%s %s ", argv[1], argv[2]);
    for (size_t i = 0; i < sizeof(h); i++)
        fprintf(f, "%02x", h[i]);
    fprintf(f, "\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "rtd apikey: %s: %s\n", file, strerror(errno));
        return 1;
    }
    printf("%s\n", key);
    return 0;
}

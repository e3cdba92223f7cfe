#include "rtb_xkeys.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define RTB_XKEY_MAGIC 0x52545853u /* "RTXS", heads a cache file */

static uint32_t key_hash(const char *salt, size_t n, uint32_t iter)
{
    uint32_t h = 2166136261u ^ iter;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)salt[i]) * 16777619u;
    return h;
}

static rtb_xkey_t *key_slot(rtb_xkeys_t *w, const char *salt, size_t n, uint32_t iter)
{
    uint32_t h = key_hash(salt, n, iter) & (w->cap - 1);
    while (w->keys[h].iter && !(w->keys[h].iter == iter && w->keys[h].salt_len == n &&
                                !memcmp(w->keys[h].salt, salt, n)))
        h = (h + 1) & (w->cap - 1);
    return &w->keys[h];
}

static int key_insert(rtb_xkeys_t *w, const rtb_xkey_t *k)
{
    if ((w->count + 1) * 2 > w->cap) {
        uint32_t ncap = w->cap ? w->cap * 2 : 1024, ocap = w->cap;
        rtb_xkey_t *old = w->keys;
        w->keys = calloc(ncap, sizeof(rtb_xkey_t));
        if (!w->keys) {
            w->keys = old;
            return -ENOMEM;
        }
        w->cap = ncap;
        for (uint32_t i = 0; i < ocap; i++)
            if (old[i].iter)
                *key_slot(w, old[i].salt, old[i].salt_len, old[i].iter) = old[i];
        free(old);
    }
    rtb_xkey_t *s = key_slot(w, k->salt, k->salt_len, k->iter);
    if (!s->iter)
        w->count++;
    *s = *k;
    return 0;
}

/*
 * --salt-cache: a header (magic, SHA-256 of the password) then rtb_xkey_t records, appended
 * by every process in single writes, so concurrent appends do not interleave. A file of
 * another password is left alone and not used.
 */
static void cache_open(rtb_xkeys_t *w, const char *path)
{
    w->fd = open(path, O_RDWR | O_CREAT | O_APPEND, 0600);
    if (w->fd < 0)
        return;
    uint8_t head[4 + 32];
    uint32_t magic = RTB_XKEY_MAGIC;
    /* Locked while read and, for a new file, written: two processes that both found it
       empty wrote a header each, and every record after them was read out of step. */
    if (flock(w->fd, LOCK_EX) != 0)
        goto off;
    ssize_t r = pread(w->fd, head, sizeof(head), 0);
    if (r == 0) {
        memcpy(head, &magic, 4);
        memcpy(head + 4, w->pw_hash, 32);
        r = write(w->fd, head, sizeof(head));
        flock(w->fd, LOCK_UN);
        if (r != (ssize_t)sizeof(head))
            goto off;
        return;
    }
    flock(w->fd, LOCK_UN);
    if (r != (ssize_t)sizeof(head) || memcmp(head, &magic, 4) || memcmp(head + 4, w->pw_hash, 32))
        goto off;
    /* In chunks: one pread per record was most of a short run's start-up. */
    static rtb_xkey_t chunk[1024];
    off_t at = sizeof(head);
    ssize_t got;
    while ((got = pread(w->fd, chunk, sizeof(chunk), at)) >= (ssize_t)sizeof(rtb_xkey_t)) {
        size_t n = (size_t)got / sizeof(rtb_xkey_t);
        for (size_t i = 0; i < n; i++)
            if (chunk[i].iter && chunk[i].salt_len <= RTB_XKEY_SALT_MAX && key_insert(w, &chunk[i]))
                return;
        at += (off_t)(n * sizeof(rtb_xkey_t));
    }
    return;
off:
    close(w->fd);
    w->fd = -1;
}

/* The keys of (salt, iter): from the cache, else by PBKDF2 of pass once. */
const rtb_xkey_t *rtb_xkeys_get(rtb_xkeys_t *w, const char *pass, const char *salt, size_t n,
                                uint32_t iter)
{
    if (n == 0 || n > RTB_XKEY_SALT_MAX || n % 4 || !iter || iter > 10000000)
        return NULL;
    if (w->cap) {
        rtb_xkey_t *s = key_slot(w, salt, n, iter);
        if (s->iter)
            return s;
    }
    uint8_t raw[RTB_XKEY_SALT_MAX], salted[32];
    int rawn = EVP_DecodeBlock(raw, (const unsigned char *)salt, (int)n);
    /* EVP_DecodeBlock counts the padding as decoded zero bytes. */
    for (size_t i = n; rawn > 0 && i > 0 && salt[i - 1] == '='; i--)
        rawn--;
    if (rawn <= 0)
        return NULL;
    rtb_xkey_t k;
    memset(&k, 0, sizeof(k));
    if (!PKCS5_PBKDF2_HMAC(pass, (int)strlen(pass), raw, rawn, (int)iter, EVP_sha256(), 32, salted))
        return NULL;
    w->pbkdf2++;
    unsigned len = 32;
    HMAC(EVP_sha256(), salted, 32, (const uint8_t *)"Client Key", 10, k.client_key, &len);
    HMAC(EVP_sha256(), salted, 32, (const uint8_t *)"Server Key", 10, k.server_key, &len);
    SHA256(k.client_key, 32, k.stored_key);
    k.iter = iter;
    k.salt_len = (uint8_t)n;
    memcpy(k.salt, salt, n);
    if (key_insert(w, &k))
        return NULL;
    if (w->fd >= 0 && write(w->fd, &k, sizeof(k)) != (ssize_t)sizeof(k)) {
        close(w->fd); /* a full disk costs the next run its PBKDF2s, nothing more */
        w->fd = -1;
    }
    return key_slot(w, salt, n, iter);
}

void rtb_xkeys_init(rtb_xkeys_t *w, const char *pass_arg, const char *path)
{
    memset(w, 0, sizeof(*w));
    w->fd = -1;
    SHA256((const uint8_t *)pass_arg, strlen(pass_arg), w->pw_hash);
    if (path)
        cache_open(w, path);
}

void rtb_xkeys_destroy(rtb_xkeys_t *w)
{
    free(w->keys);
    w->keys = NULL;
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
}

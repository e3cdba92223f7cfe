/*
** Password tables: the password file parsed into a hash table of users, the $6$ and $7$
** hashes (OpenSSL's PKCS5_PBKDF2_HMAC, SHA512, CRYPTO_memcmp: this file only parses, stores
** and compares), and the remembered tag that lets a reconnect skip the full hash.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "auth_impl.h"

#define HASH_BYTES 64 /* SHA-512 */
#define MAX_SALT 64
#define CACHE_TAG_BYTES 32 /* HMAC-SHA256 */

/* What rt_auth_hash_password writes: "$7$", rounds, '$', salt and hash in base64, NUL. */
_Static_assert(3 + 10 + 1 + RT_BASE64_LEN(RT_AUTH_SALT_BYTES) + 1 + RT_BASE64_LEN(HASH_BYTES) + 1 <=
                   RT_AUTH_HASH_MAX,
               "RT_AUTH_HASH_MAX holds a new hash");
_Static_assert(RT_AUTH_SALT_BYTES <= MAX_SALT, "a new salt is one the table can read");

/* ---- Hashes ---- */

int rt_auth_pbkdf2_sha512(const uint8_t *pw, size_t pwlen, const uint8_t *salt, size_t saltlen,
                          uint32_t iterations, uint8_t *out, size_t outlen)
{
    if (iterations == 0 || iterations > RT_AUTH_MAX_ITERATIONS || pwlen > INT32_MAX ||
        saltlen > INT32_MAX || outlen > INT32_MAX)
        return RT_EINVAL;
    static const uint8_t none[1];
    if (PKCS5_PBKDF2_HMAC((const char *)(pw ? pw : none), (int)pwlen, salt ? salt : none,
                          (int)saltlen, (int)iterations, EVP_sha512(), (int)outlen, out) != 1)
        return RT_EINVAL;
    return 0;
}

typedef enum { HASH_SHA512 = 6, HASH_PBKDF2 = 7 } hash_kind_t;

typedef struct entry_s {
    char *user;    /* owned; NULL marks a free bucket */
    uint32_t line; /* where it was defined, for duplicate errors */
    uint8_t kind;  /* hash_kind_t */
    uint8_t saltlen;
    uint32_t iterations; /* $7$ only */
    uint8_t salt[MAX_SALT];
    uint8_t hash[HASH_BYTES];
    /* The last password that verified, as a keyed tag (see remember()); any thread
       reads and writes these, the table being otherwise immutable. */
    atomic_uint_fast64_t tag_seq;                  /* seqlock: odd while written, 0 empty */
    atomic_uint_fast64_t tag[CACHE_TAG_BYTES / 8]; /* HMAC-SHA256(process key, salt||pw) */
} entry_t;

struct rt_auth_s {
    entry_t *buckets; /* open addressing, linear probing; cap is a power of two */
    size_t cap, n;
    size_t bytes;              /* allocated for this table, names included */
    uint8_t decoy_kind;        /* hash an unknown user costs: the first user's kind ... */
    uint32_t decoy_iterations; /* ... and rounds, so timing does not tell who exists */
};

/* Computes the hash of pw with e's salt and parameters into out. */
static int hash_like_entry(const entry_t *e, const uint8_t *pw, size_t pwlen,
                           uint8_t out[HASH_BYTES])
{
    if (e->kind == HASH_PBKDF2)
        return rt_auth_pbkdf2_sha512(pw, pwlen, e->salt, e->saltlen, e->iterations, out,
                                     HASH_BYTES);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int len = 0;
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha512(), NULL) == 1 &&
              EVP_DigestUpdate(ctx, pw, pwlen) == 1 &&
              EVP_DigestUpdate(ctx, e->salt, e->saltlen) == 1 &&
              EVP_DigestFinal_ex(ctx, out, &len) == 1 && len == HASH_BYTES;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : RT_ENOMEM;
}

/*
** Parses the hash part of a line ("$7$...", "$6$...") into e; on error writes
** the reason to why.
*/
static bool parse_hash(const char *s, size_t n, entry_t *e, char *why, size_t whylen)
{
    const char *end = s + n;
    if (n < 3 || s[0] != '$' || (s[1] != '6' && s[1] != '7') || s[2] != '$') {
        snprintf(why, whylen, "the password is not a $7$ (PBKDF2-SHA512) or $6$ (SHA-512) hash");
        return false;
    }
    e->kind = s[1] == '7' ? HASH_PBKDF2 : HASH_SHA512;
    const char *p = s + 3;
    if (e->kind == HASH_PBKDF2) {
        uint64_t it = 0;
        const char *digits = p;
        while (p < end && *p >= '0' && *p <= '9' && p - digits < 10)
            it = it * 10 + (uint64_t)(*p++ - '0');
        if (p == digits || p == end || *p != '$' || it == 0 || it > RT_AUTH_MAX_ITERATIONS) {
            snprintf(why, whylen, "the iteration count must be between 1 and %u",
                     RT_AUTH_MAX_ITERATIONS);
            return false;
        }
        e->iterations = (uint32_t)it;
        p++;
    }
    const char *dollar = memchr(p, '$', (size_t)(end - p));
    if (!dollar) {
        snprintf(why, whylen, "the hash has no $SALT$HASH part");
        return false;
    }
    long saltlen = rt_base64_decode(p, (size_t)(dollar - p), e->salt, MAX_SALT, 0);
    if (saltlen < 1) {
        snprintf(why, whylen, "the salt is not base64 of 1 to %d bytes", MAX_SALT);
        return false;
    }
    e->saltlen = (uint8_t)saltlen;
    uint8_t hash[HASH_BYTES + 1]; /* room for one byte too many, to tell it */
    if (rt_base64_decode(dollar + 1, (size_t)(end - dollar - 1), hash, sizeof(hash), 0) !=
        HASH_BYTES) {
        snprintf(why, whylen, "the hash is not base64 of %d bytes", HASH_BYTES);
        return false;
    }
    memcpy(e->hash, hash, HASH_BYTES);
    return true;
}

int rt_auth_hash_password(const uint8_t *pw, size_t pwlen, uint32_t iterations, char *out,
                          size_t outlen)
{
    uint8_t salt[RT_AUTH_SALT_BYTES], hash[HASH_BYTES];
    if (outlen < RT_AUTH_HASH_MAX)
        return RT_EINVAL;
    if (getrandom(salt, sizeof(salt), 0) != (ssize_t)sizeof(salt))
        return RT_EAGAIN;
    int rc = rt_auth_pbkdf2_sha512(pw, pwlen, salt, sizeof(salt), iterations, hash, sizeof(hash));
    if (rc)
        return rc;
    int n = snprintf(out, outlen, "$7$%u$", iterations);
    n += (int)rt_base64_encode(salt, sizeof(salt), out + n);
    out[n++] = '$';
    rt_base64_encode(hash, sizeof(hash), out + n);
    return 0;
}

/* ---- Tables ---- */

/*
** The bucket holding user, or the free bucket where it would go: there is one, since load
** sizes the table for twice the lines the file has.
*/
static entry_t *find_bucket(const rt_auth_t *a, const char *user, size_t n)
{
    RT_ASSERT(a->n < a->cap);
    size_t mask = a->cap - 1;
    for (size_t i = rt_hash(user, n) & mask;; i = (i + 1) & mask) {
        entry_t *e = &a->buckets[i];
        if (!e->user || (strncmp(e->user, user, n) == 0 && e->user[n] == 0))
            return e;
    }
}

void rt_auth_free(rt_auth_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->cap; i++)
        free(a->buckets[i].user);
    free(a->buckets);
    free(a);
}

size_t rt_auth_users(const rt_auth_t *a)
{
    return a ? a->n : 0;
}

size_t rt__auth_table_bytes(const rt_auth_t *a)
{
    return a ? a->bytes : 0;
}

bool rt__auth_split_line(const char *line, size_t len, size_t *userlen, const char **hash,
                         size_t *hashlen, const char **why)
{
    *why = NULL;
    size_t lead = 0;
    while (lead < len && (line[lead] == ' ' || line[lead] == '\t'))
        lead++;
    if (lead == len || line[lead] == '#')
        return false;
    const char *colon = memchr(line, ':', len);
    if (!colon) {
        *why = "expected user:hash";
        return false;
    }
    *userlen = (size_t)(colon - line);
    if (*userlen == 0 || *userlen > RT_AUTH_MAX_NAME) {
        *why = "the user name is empty or longer than 65535 bytes";
        return false;
    }
    if (memchr(line, 0, len)) {
        *why = "the line holds a NUL byte";
        return false;
    }
    *hash = colon + 1;
    *hashlen = len - *userlen - 1;
    return true;
}

int rt_auth_load(const char *path, rt_auth_t **out, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    int rc = rt__auth_read_file(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    rt_auth_t *a = calloc(1, sizeof(*a));
    size_t cap = 16;
    while (cap < lines * 2)
        cap *= 2;
    if (a)
        a->buckets = calloc(cap, sizeof(entry_t));
    if (!a || !a->buckets) {
        free(a);
        free(buf);
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    a->cap = cap;
    a->decoy_kind = HASH_PBKDF2;
    a->decoy_iterations = RT_AUTH_PBKDF2_ITERATIONS;
    a->bytes = sizeof(*a) + cap * sizeof(entry_t);
    const char *pos = buf, *end = buf + len, *line;
    size_t linelen;
    uint32_t lineno = 0;
    rc = 0;
    while (rc == 0 && rt__auth_next_line(&pos, end, &line, &linelen)) {
        lineno++;
        size_t userlen, hashlen;
        const char *hash, *why;
        char reason[128];
        if (!rt__auth_split_line(line, linelen, &userlen, &hash, &hashlen, &why)) {
            if (why) {
                snprintf(err, errlen, "%s:%u: %s", path, lineno, why);
                rc = RT_EINVAL;
            }
            continue;
        }
        entry_t *e = find_bucket(a, line, userlen);
        if (e->user) {
            snprintf(err, errlen, "%s:%u: user %.*s is listed twice (first on line %u)", path,
                     lineno, (int)(userlen > 64 ? 64 : userlen), line, e->line);
            rc = RT_EINVAL;
            continue;
        }
        entry_t tmp = {.line = lineno};
        if (!parse_hash(hash, hashlen, &tmp, reason, sizeof(reason))) {
            snprintf(err, errlen, "%s:%u: %s", path, lineno, reason);
            rc = RT_EINVAL;
            continue;
        }
        tmp.user = strndup(line, userlen);
        if (!tmp.user) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = RT_ENOMEM;
            continue;
        }
        if (a->n == 0) {
            a->decoy_kind = tmp.kind;
            a->decoy_iterations = tmp.iterations;
        }
        *e = tmp;
        a->n++;
        a->bytes += userlen + 1;
    }
    free(buf);
    if (rc) {
        rt_auth_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

/*
** A successful login is remembered per user as a tag keyed by a random
** per-process key, so the next login with the same password (a reconnect)
** costs one HMAC instead of the full PBKDF2. A wrong password never matches a
** tag and always pays the full cost. The tag lives only in memory and only
** for the table's life (a reload or a changed password starts empty); reading
** it takes a memory dump, which would show passwords in flight anyway.
*/
static uint8_t process_key[32];
static pthread_once_t process_key_once = PTHREAD_ONCE_INIT;
static bool process_key_ok;

static void make_process_key(void)
{
    process_key_ok = getrandom(process_key, sizeof(process_key), 0) == sizeof(process_key);
}

static bool tag_of(const entry_t *e, const uint8_t *pw, size_t pwlen, uint64_t out[4])
{
    pthread_once(&process_key_once, make_process_key);
    if (!process_key_ok)
        return false;
    uint8_t msg_salt[1 + MAX_SALT];
    msg_salt[0] = e->saltlen;
    memcpy(msg_salt + 1, e->salt, e->saltlen);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_PKEY *key =
        EVP_PKEY_new_raw_private_key(EVP_PKEY_HMAC, NULL, process_key, sizeof(process_key));
    size_t len = CACHE_TAG_BYTES;
    bool ok = ctx && key && EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, key) == 1 &&
              EVP_DigestSignUpdate(ctx, msg_salt, 1u + e->saltlen) == 1 &&
              EVP_DigestSignUpdate(ctx, pw, pwlen) == 1 &&
              EVP_DigestSignFinal(ctx, (uint8_t *)out, &len) == 1 && len == CACHE_TAG_BYTES;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    return ok;
}

/* Whether the entry's remembered tag is t (a torn or missing one is a miss). */
static bool remembered(entry_t *e, const uint64_t t[4])
{
    uint_fast64_t s = atomic_load_explicit(&e->tag_seq, memory_order_acquire);
    if (s == 0 || (s & 1))
        return false;
    uint64_t got[4];
    for (int i = 0; i < 4; i++)
        got[i] = atomic_load_explicit(&e->tag[i], memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&e->tag_seq, memory_order_relaxed) != s)
        return false;
    return CRYPTO_memcmp(got, t, CACHE_TAG_BYTES) == 0;
}

static void remember(entry_t *e, const uint64_t t[4])
{
    uint_fast64_t s = atomic_load_explicit(&e->tag_seq, memory_order_relaxed);
    if ((s & 1) || !atomic_compare_exchange_strong(&e->tag_seq, &s, s + 1))
        return; /* another thread is writing one: let it */
    atomic_thread_fence(memory_order_release);
    for (int i = 0; i < 4; i++)
        atomic_store_explicit(&e->tag[i], t[i], memory_order_relaxed);
    atomic_store_explicit(&e->tag_seq, s + 2, memory_order_release);
}

int rt__auth_check(const rt_auth_t *a, const char *user, const uint8_t *pw, size_t pwlen,
                   bool may_hash)
{
    /* An unknown user costs a hash like a known one's, so timing does not tell. */
    const entry_t decoy = {
        .kind = a->decoy_kind, .iterations = a->decoy_iterations, .saltlen = RT_AUTH_SALT_BYTES};
    size_t n = strlen(user);
    /* The table is immutable but for each entry's remembered tag (atomics). */
    entry_t *e = n > 0 && n <= RT_AUTH_MAX_NAME ? find_bucket(a, user, n) : NULL;
    bool known = e && e->user;
    uint64_t t[4];
    bool tagged = known && tag_of(e, pw, pwlen, t);
    if (tagged && remembered(e, t))
        return RT_AUTH_OK;
    if (!may_hash)
        return RT_AUTH_PENDING;
    uint8_t got[HASH_BYTES];
    if (hash_like_entry(known ? e : &decoy, pw, pwlen, got) != 0)
        return RT_AUTH_BAD_PASSWORD;
    if (!known)
        return RT_AUTH_UNKNOWN_USER;
    if (CRYPTO_memcmp(got, e->hash, HASH_BYTES) != 0)
        return RT_AUTH_BAD_PASSWORD;
    if (tagged)
        remember(e, t);
    return RT_AUTH_OK;
}

int rt_auth_check(const rt_auth_t *a, const char *user, const uint8_t *pw, size_t pwlen)
{
    return rt__auth_check(a, user, pw, pwlen, true);
}

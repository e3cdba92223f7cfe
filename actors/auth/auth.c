/*
** Password tables, the login policy, the failed-login slow-down and `rtd
** passwd`. The hashing is OpenSSL's (PKCS5_PBKDF2_HMAC, SHA512, CRYPTO_memcmp);
** this file only parses, stores and decides.
*/
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "acl.h"
#include "auth.h"
#include "common.h"
#include "rcu.h"
#include "rt.h"

#define RT_AUTH_MAX_FILE_BYTES (256u << 20) /* a password or ACL file larger is refused */
#define RT_AUTH_MAX_NAME 65535              /* MQTT strings are at most this long */
#define HASH_BYTES 64                       /* SHA-512 */
#define MAX_SALT 64
#define CACHE_TAG_BYTES 32 /* HMAC-SHA256 */

/* ---- Shared with acl.c: whole-file reads and line iteration ---- */

int rt__auth_read_file(const char *path, char **out, size_t *outlen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return RT_ENOTFOUND;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (len < cap - 1)
            break;
        if (cap >= RT_AUTH_MAX_FILE_BYTES) {
            free(buf);
            fclose(f);
            snprintf(err, errlen, "%s: larger than %u bytes", path, RT_AUTH_MAX_FILE_BYTES);
            return RT_ELIMIT;
        }
        char *bigger = realloc(buf, cap * 2);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    bool failed = ferror(f);
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return RT_ENOMEM;
    }
    if (failed) {
        free(buf);
        snprintf(err, errlen, "%s: read error", path);
        return RT_EINVAL;
    }
    buf[len] = 0;
    *out = buf;
    *outlen = len;
    return 0;
}

bool rt__auth_next_line(const char **pos, const char *end, const char **line, size_t *len)
{
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

/* ---- Base64 (standard alphabet; padding optional on input) ---- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static size_t b64_encode(const uint8_t *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[v & 63] : '=';
    }
    out[o] = 0;
    return o;
}

/* Decodes s[0..n) into out (cap bytes): the length, or -1 if invalid or too long. */
static long b64_decode(const char *s, size_t n, uint8_t *out, size_t cap)
{
    while (n > 0 && s[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = s[i] ? strchr(b64, s[i]) : NULL;
        if (!p)
            return -1;
        acc = acc << 6 | (uint32_t)(p - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap)
                return -1;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)o;
}

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
static int compute(const entry_t *e, const uint8_t *pw, size_t pwlen, uint8_t out[HASH_BYTES])
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
    long saltlen = b64_decode(p, (size_t)(dollar - p), e->salt, MAX_SALT);
    if (saltlen < 1) {
        snprintf(why, whylen, "the salt is not base64 of 1 to %d bytes", MAX_SALT);
        return false;
    }
    e->saltlen = (uint8_t)saltlen;
    uint8_t hash[HASH_BYTES + 1]; /* room for one byte too many, to tell it */
    if (b64_decode(dollar + 1, (size_t)(end - dollar - 1), hash, sizeof(hash)) != HASH_BYTES) {
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
    n += (int)b64_encode(salt, sizeof(salt), out + n);
    out[n++] = '$';
    b64_encode(hash, sizeof(hash), out + n);
    return 0;
}

/* ---- Tables ---- */

uint64_t rt__auth_name_hash(const char *s, size_t n)
{
    return rt_hash(s, n);
}

/* The bucket holding user, or the free bucket where it would go. */
static entry_t *find_bucket(const rt_auth_t *a, const char *user, size_t n)
{
    size_t mask = a->cap - 1;
    for (size_t i = rt__auth_name_hash(user, n) & mask;; i = (i + 1) & mask) {
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

/*
** Splits a password-file line into user and hash. Returns false for lines that
** hold no user (blank, comment); sets *why for a malformed one.
*/
static bool split_line(const char *line, size_t len, size_t *userlen, const char **hash,
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
        if (!split_line(line, linelen, &userlen, &hash, &hashlen, &why)) {
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

/*
** rt_auth_check, but with may_hash false a decision that needs a full hash
** (no remembered tag matched) is not made: RT_AUTH_PENDING instead.
*/
static int check(const rt_auth_t *a, const char *user, const uint8_t *pw, size_t pwlen,
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
    if (compute(known ? e : &decoy, pw, pwlen, got) != 0)
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
    return check(a, user, pw, pwlen, true);
}

const char *rt_auth_result_name(int result)
{
    switch (result) {
    case RT_AUTH_OK:
        return "ok";
    case RT_AUTH_BAD_PASSWORD:
        return "bad_password";
    case RT_AUTH_UNKNOWN_USER:
        return "unknown_user";
    case RT_AUTH_ANONYMOUS_REFUSED:
        return "anonymous_refused";
    case RT_AUTH_PENDING:
        return "pending";
    }
    return "unknown";
}

/* ---- Addresses ---- */

int rt_auth_addr_from_fd(int fd, rt_auth_addr_t *out)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return RT_EINVAL;
    memset(out, 0, sizeof(*out));
    if (ss.ss_family == AF_INET) {
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        return 0;
    }
    if (ss.ss_family == AF_INET6) {
        memcpy(out->b, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        return 0;
    }
    return RT_EINVAL;
}

int rt_auth_addr_parse(const char *text, rt_auth_addr_t *out)
{
    memset(out, 0, sizeof(*out));
    uint8_t v4[4];
    if (inet_pton(AF_INET, text, v4) == 1) {
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, v4, 4);
        return 0;
    }
    return inet_pton(AF_INET6, text, out->b) == 1 ? 0 : RT_EINVAL;
}

/* ---- The failed-login slow-down ---- */

#define WAYS 8
#define SETS (RT_AUTH_FAIL_SLOTS / WAYS)

typedef struct fail_s {
    uint8_t key[16]; /* the address, IPv6 cut to its /64 */
    float count;     /* decayed failures at stamp_ms; 0 marks a free entry */
    uint64_t stamp_ms;
} fail_t;

typedef struct fail_set_s {
    pthread_mutex_t lock;
    fail_t e[WAYS];
} fail_set_t;

struct rt_auth_limiter_s {
    _Atomic uint32_t max_delay_ms; /* any thread reads; rt_auth_configure writes */
    uint64_t seed[2];              /* keys the set choice */
    atomic_size_t entries;
    atomic_uint_fast64_t evictions;
    fail_set_t sets[SETS];
};

int rt_auth_limiter_new(uint32_t max_delay_ms, rt_auth_limiter_t **out)
{
    rt_auth_limiter_t *l = calloc(1, sizeof(*l));
    if (!l)
        return RT_ENOMEM;
    if (getrandom(l->seed, sizeof(l->seed), 0) != (ssize_t)sizeof(l->seed)) {
        free(l);
        return RT_EAGAIN;
    }
    atomic_store(&l->max_delay_ms, max_delay_ms);
    for (size_t i = 0; i < SETS; i++)
        pthread_mutex_init(&l->sets[i].lock, NULL);
    *out = l;
    return 0;
}

void rt_auth_limiter_free(rt_auth_limiter_t *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < SETS; i++)
        pthread_mutex_destroy(&l->sets[i].lock);
    free(l);
}

static void limiter_key(const rt_auth_addr_t *a, uint8_t key[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memcpy(key, a->b, 16);
    if (memcmp(a->b, mapped, 12) != 0)
        memset(key + 8, 0, 8); /* IPv6: one host owns its /64 */
}

/* A keyed mix of the two halves (SipHash-like rounds; enough to scatter sets). */
static fail_set_t *limiter_set(rt_auth_limiter_t *l, const uint8_t key[16])
{
    uint64_t x, y;
    memcpy(&x, key, 8);
    memcpy(&y, key + 8, 8);
    uint64_t h = l->seed[0] ^ x;
    for (int i = 0; i < 2; i++) {
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= (i ? l->seed[1] : y);
        h ^= h >> 29;
        h *= 0xc4ceb9fe1a85ec53ull;
    }
    h ^= h >> 32;
    return &l->sets[h % SETS];
}

static float decayed(const fail_t *f, uint64_t now_ms)
{
    if (f->count == 0 || now_ms <= f->stamp_ms)
        return f->count;
    double halves = (double)(now_ms - f->stamp_ms) / RT_AUTH_FAIL_HALF_LIFE_MS;
    return (float)(f->count * exp2(-halves));
}

static uint32_t delay_for(float count, uint32_t max)
{
    /* Failures a moment apart count whole: 2 decayed for a few ms, plus 1, is still 3. */
    uint32_t n = (uint32_t)(count + 0.05f);
    if (n == 0)
        return 0;
    if (n - 1 >= 31 || ((uint64_t)RT_AUTH_DELAY_BASE_MS << (n - 1)) >= max)
        return max;
    return RT_AUTH_DELAY_BASE_MS << (n - 1);
}

/*
** Locks the set of address a (its key in key) and returns it with *f set to
** a's entry, or NULL when the table does not hold a. Unlock s->lock after.
*/
static fail_set_t *lock_set(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint8_t key[16],
                            fail_t **f)
{
    limiter_key(a, key);
    fail_set_t *s = limiter_set(l, key);
    pthread_mutex_lock(&s->lock);
    *f = NULL;
    for (int i = 0; i < WAYS && !*f; i++)
        if (s->e[i].count != 0 && memcmp(s->e[i].key, key, 16) == 0)
            *f = &s->e[i];
    return s;
}

uint32_t rt_auth_limiter_fail(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms)
{
    uint8_t key[16];
    fail_t *f;
    fail_set_t *s = lock_set(l, a, key, &f);
    if (!f) {
        /* A free entry, else the one with the fewest recent failures. */
        f = &s->e[0];
        for (int i = 0; i < WAYS && f->count != 0; i++)
            if (s->e[i].count == 0 || decayed(&s->e[i], now_ms) < decayed(f, now_ms))
                f = &s->e[i];
        if (f->count != 0)
            atomic_fetch_add(&l->evictions, 1);
        else
            atomic_fetch_add(&l->entries, 1);
        memcpy(f->key, key, 16);
        f->count = 0;
        f->stamp_ms = now_ms;
    }
    f->count = decayed(f, now_ms) + 1;
    f->stamp_ms = now_ms > f->stamp_ms ? now_ms : f->stamp_ms;
    uint32_t d = delay_for(f->count, atomic_load(&l->max_delay_ms));
    pthread_mutex_unlock(&s->lock);
    return d;
}

void rt_auth_limiter_succeed(rt_auth_limiter_t *l, const rt_auth_addr_t *a)
{
    uint8_t key[16];
    fail_t *f;
    fail_set_t *s = lock_set(l, a, key, &f);
    if (f) {
        f->count = 0;
        atomic_fetch_sub(&l->entries, 1);
    }
    pthread_mutex_unlock(&s->lock);
}

uint32_t rt_auth_limiter_delay(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms)
{
    uint8_t key[16];
    fail_t *f;
    fail_set_t *s = lock_set(l, a, key, &f);
    uint32_t d = f ? delay_for(decayed(f, now_ms), atomic_load(&l->max_delay_ms)) : 0;
    pthread_mutex_unlock(&s->lock);
    return d;
}

void rt_auth_limiter_usage(rt_auth_limiter_t *l, size_t *entries, uint64_t *evictions)
{
    *entries = atomic_load(&l->entries);
    *evictions = atomic_load(&l->evictions);
}

/* ---- The process-wide policy ---- */

static rt_rcu_t current; /* rt_auth_t *, NULL: no password file */
static atomic_bool allow_anonymous = true;

/* anonymous_from, as configured: read by every CONNECT without a user name. */
typedef struct {
    unsigned n;
    rt_conf_net_t nets[RT_CONF_MAX_NETS];
} anonymous_nets_t;
static rt_rcu_t anonymous_from; /* anonymous_nets_t *; NULL (never configured): loopback */
static _Atomic(rt_auth_limiter_t *) limiter;
static pthread_mutex_t configure_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    atomic_uint_fast64_t successes, bad_password, unknown_user, anonymous_refused, reloads;
} counters;

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Loads path ("" or NULL: none) into *out (NULL for none). */
static int load_optional(const char *path, rt_auth_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!path || !*path)
        return 0;
    return rt_auth_load(path, out, err, errlen);
}

int rt_auth_reload(const char *path, char *err, size_t errlen)
{
    rt_auth_t *next;
    int rc = load_optional(path, &next, err, errlen);
    if (rc)
        return rc;
    rt_auth_free(rt_rcu_swap(&current, next));
    atomic_fetch_add(&counters.reloads, 1);
    return 0;
}

int rt_auth_configure(const rt_conf_t *conf, char *err, size_t errlen)
{
    pthread_mutex_lock(&configure_lock);
    rt_auth_t *users = NULL;
    rt_acl_t *acl = NULL;
    int rc = load_optional(conf->password_file, &users, err, errlen);
    if (rc == 0 && conf->acl_file[0])
        rc = rt_acl_load(conf->acl_file, &acl, err, errlen);
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (rc == 0 && !l) {
        rc = rt_auth_limiter_new((uint32_t)conf->auth_max_delay_ms, &l);
        if (rc)
            snprintf(err, errlen, "auth: cannot make the slow-down table: %s", rt_strerror(rc));
        else
            atomic_store(&limiter, l);
    }
    anonymous_nets_t *nets = rc ? NULL : malloc(sizeof(*nets));
    if (rc == 0 && !nets) {
        snprintf(err, errlen, "auth: out of memory");
        rc = RT_ENOMEM;
    }
    if (rc) {
        rt_auth_free(users);
        rt_acl_free(acl);
        pthread_mutex_unlock(&configure_lock);
        return rc;
    }
    nets->n = conf->nanonymous_from;
    memcpy(nets->nets, conf->anonymous_from, sizeof(nets->nets));
    free(rt_rcu_swap(&anonymous_from, nets));
    atomic_store(&l->max_delay_ms, (uint32_t)conf->auth_max_delay_ms);
    atomic_store(&allow_anonymous, conf->allow_anonymous);
    rt_auth_free(rt_rcu_swap(&current, users));
    rt_acl_install(acl);
    atomic_fetch_add(&counters.reloads, 1);
    pthread_mutex_unlock(&configure_lock);
    return 0;
}

void rt_auth_set_allow_anonymous(bool allow)
{
    atomic_store(&allow_anonymous, allow);
}

bool rt_auth_allow_anonymous(void)
{
    return atomic_load(&allow_anonymous);
}

void rt_auth_shutdown(void)
{
    rt_auth_free(rt_rcu_swap(&current, NULL));
    free(rt_rcu_swap(&anonymous_from, NULL));
    rt_acl_install(NULL);
    rt_auth_limiter_free(atomic_exchange(&limiter, NULL));
}

/* Whether an anonymous client may come from addr (NULL: not an IP peer, refused). */
static bool anonymous_allowed_from(const rt_auth_addr_t *addr)
{
    if (!addr)
        return false;
    const anonymous_nets_t *nets = rt_rcu_enter(&anonymous_from);
    bool ok = nets ? rt_conf_net_match(nets->nets, nets->n, addr->b)
                   : rt_conf_net_match(rt_conf_loopback, RT_CONF_NLOOPBACK, addr->b);
    rt_rcu_leave();
    return ok;
}

/* rt_auth_login and rt_auth_login_quick: may_hash false leaves a full hash undone. */
static int login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw, size_t pwlen,
                 bool may_hash, uint32_t *delay_ms)
{
    *delay_ms = 0;
    int result = RT_AUTH_OK;
    if (!user) {
        if (!atomic_load(&allow_anonymous) || !anonymous_allowed_from(addr))
            result = RT_AUTH_ANONYMOUS_REFUSED;
    } else {
        const rt_auth_t *a = rt_rcu_enter(&current);
        if (a) {
            result = check(a, user, pw, pw ? pwlen : 0, may_hash);
            if (result == RT_AUTH_OK && !pw)
                result = RT_AUTH_BAD_PASSWORD; /* a listed user must give a password */
        }
        rt_rcu_leave();
    }
    if (result == RT_AUTH_PENDING)
        return result; /* undecided: neither counted nor noted against the address */
    atomic_uint_fast64_t *counter = result == RT_AUTH_OK             ? &counters.successes
                                    : result == RT_AUTH_BAD_PASSWORD ? &counters.bad_password
                                    : result == RT_AUTH_UNKNOWN_USER ? &counters.unknown_user
                                                                     : &counters.anonymous_refused;
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (!addr || !l)
        return result;
    if (result == RT_AUTH_OK)
        rt_auth_limiter_succeed(l, addr);
    else
        *delay_ms = rt_auth_limiter_fail(l, addr, monotonic_ms());
    return result;
}

int rt_auth_login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw, size_t pwlen,
                  uint32_t *delay_ms)
{
    return login(addr, user, pw, pwlen, true, delay_ms);
}

int rt_auth_login_quick(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw,
                        size_t pwlen, uint32_t *delay_ms)
{
    return login(addr, user, pw, pwlen, false, delay_ms);
}

void rt_auth_stats(rt_auth_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->successes = atomic_load(&counters.successes);
    out->bad_password = atomic_load(&counters.bad_password);
    out->unknown_user = atomic_load(&counters.unknown_user);
    out->anonymous_refused = atomic_load(&counters.anonymous_refused);
    out->reloads = atomic_load(&counters.reloads);
    const rt_auth_t *a = rt_rcu_enter(&current);
    out->users = rt_auth_users(a);
    out->bytes = a ? a->bytes : 0;
    rt_rcu_leave();
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (l) {
        out->bytes += sizeof(*l);
        size_t entries;
        rt_auth_limiter_usage(l, &entries, &out->delay_evictions);
        out->delay_entries = entries;
    }
}

/* ---- The verifier: full hashes on the blocking pool ---- */

/*
** A request: the connection that asked is m->from. The user name and password
** follow the header; the message owns the only copy of the password and the
** verifier wipes it once decided.
*/
typedef struct {
    rt_auth_addr_t addr;
    uint32_t reply_tag;
    uint32_t userlen; /* bytes of the user name, NUL not counted */
    uint32_t pwlen;
    uint8_t has_addr, has_user, has_pw;
    /* user name (NUL-terminated), then the password */
} verify_req_t;

static void verifier_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_AUTH_MSG_VERIFY || m->len < sizeof(verify_req_t))
        return;
    verify_req_t q;
    memcpy(&q, m->data, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    if (m->len < sizeof(q) + (size_t)q.userlen + 1 + q.pwlen || body[q.userlen] != 0) {
        OPENSSL_cleanse(m->data, m->len);
        return;
    }
    rt_auth_verdict_t v = {0};
    v.result = login(q.has_addr ? &q.addr : NULL, q.has_user ? (const char *)body : NULL,
                     q.has_pw ? body + q.userlen + 1 : NULL, q.pwlen, true, &v.delay_ms);
    OPENSSL_cleanse(m->data, m->len);
    /* A connection that ended meanwhile makes this a dead letter, which is all it costs. */
    rt_send(m->from, q.reply_tag, &v, sizeof(v));
    rt_consume(self, 100); /* one hash is worth many ordinary messages in rtctl top */
}

static const char *verifier_tag_name(uint32_t tag)
{
    return tag == RT_AUTH_MSG_VERIFY ? "verify" : "";
}

static const rt_actor_type_t verifier_type = {
    .name = "auth_verifier",
    .handle = verifier_handle,
    .tag_name = verifier_tag_name,
    .flags = RT_TYPE_BLOCKING,
};

int rt_auth_verifier_start(void)
{
    rt_spawn_opts_t opts = {.name = RT_AUTH_VERIFIER_NAME};
    rt_pid_t pid;
    return rt_spawn_opt(&verifier_type, NULL, &opts, &pid);
}

int rt_auth_login_async(uint32_t reply_tag, const rt_auth_addr_t *addr, const char *user,
                        const uint8_t *pw, size_t pwlen)
{
    rt_pid_t verifier = rt_whereis(RT_AUTH_VERIFIER_NAME);
    if (!verifier)
        return RT_ENOPROC;
    size_t userlen = user ? strlen(user) : 0;
    if (userlen > RT_AUTH_MAX_NAME || pwlen > UINT16_MAX)
        return RT_EINVAL; /* MQTT strings and binary data are shorter */
    rt_msg_t *m = rt_msg_new(RT_AUTH_MSG_VERIFY, sizeof(verify_req_t) + userlen + 1 + pwlen);
    if (!m)
        return RT_ENOMEM;
    verify_req_t q = {.reply_tag = reply_tag,
                      .userlen = (uint32_t)userlen,
                      .pwlen = pw ? (uint32_t)pwlen : 0,
                      .has_addr = addr != NULL,
                      .has_user = user != NULL,
                      .has_pw = pw != NULL};
    if (addr)
        q.addr = *addr;
    memcpy(m->data, &q, sizeof(q));
    uint8_t *body = m->data + sizeof(q);
    if (userlen)
        memcpy(body, user, userlen);
    body[userlen] = 0;
    if (pw && pwlen)
        memcpy(body + userlen + 1, pw, pwlen);
    return rt_send_msg(verifier, m);
}

/* ---- rtd passwd ---- */

static int passwd_usage(void)
{
    fprintf(stderr,
            "usage: rtd passwd [-c] [-b] [-I ROUNDS] FILE USER [PASSWORD]\n"
            "       rtd passwd -D FILE USER\n"
            "  -c         create a new file (replaces an existing one)\n"
            "  -b         take the password from the command line instead of prompting\n"
            "  -D         delete USER\n"
            "  -I ROUNDS  PBKDF2 rounds for the new hash (default %u; each login that is\n"
            "             not a repeat of the last good one costs this many)\n",
            RT_AUTH_PBKDF2_ITERATIONS);
    return 2;
}

/* A user name that the file can hold and MQTT can send. */
static const char *bad_user_name(const char *user)
{
    size_t n = strlen(user);
    if (n == 0 || n > RT_AUTH_MAX_NAME)
        return "must be 1 to 65535 bytes";
    if (strchr(user, ':'))
        return "must not contain ':'";
    if (user[0] == '#' || user[0] == ' ' || user[0] == '\t')
        return "must not start with '#' or a blank";
    for (const char *p = user; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return "must not contain control characters";
    return NULL;
}

/*
** Reads one password line from stdin: without echo from a terminal (the prompt
** goes to stderr), plainly from a pipe. Returns a malloc'd string or NULL.
*/
static char *read_password(const char *prompt)
{
    struct termios old, quiet;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &old) == 0;
    if (tty) {
        fprintf(stderr, "%s", prompt);
        quiet = old;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (tty) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
        fprintf(stderr, "\n");
    }
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = 0;
    return line;
}

/* Writes len bytes to path through a temporary file (mode 0600) and a rename. */
static int write_atomically(const char *path, const char *data, size_t len)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp)
        return ENOMEM;
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return e;
    }
    int e = fchmod(fd, 0600) == 0 ? 0 : errno;
    for (size_t off = 0; e == 0 && off < len;) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno != EINTR)
            e = errno;
        else if (w > 0)
            off += (size_t)w;
    }
    if (e == 0 && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e)
        unlink(tmp);
    free(tmp);
    return e;
}

/*
** The new file: every line of old kept as it is, except USER's, which is
** replaced by entry (or dropped when entry is NULL); entry is appended when
** USER had no line. *found says whether it had one.
*/
static char *rewrite(const char *old, size_t oldlen, const char *user, const char *entry,
                     size_t *outlen, bool *found)
{
    size_t ulen = strlen(user);
    size_t cap = oldlen + (entry ? strlen(entry) : 0) + 2;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    *found = false;
    const char *pos = old, *end = old + oldlen;
    while (pos < end) {
        const char *nl = memchr(pos, '\n', (size_t)(end - pos));
        size_t n = nl ? (size_t)(nl - pos) : (size_t)(end - pos);
        size_t userlen, hashlen;
        const char *hash, *why;
        bool mine = !*found && split_line(pos, n, &userlen, &hash, &hashlen, &why) &&
                    userlen == ulen && memcmp(pos, user, ulen) == 0;
        if (mine) {
            *found = true;
            if (entry) {
                memcpy(o, entry, strlen(entry));
                o += strlen(entry);
                *o++ = '\n';
            }
        } else {
            memcpy(o, pos, n);
            o += n;
            *o++ = '\n';
        }
        pos += n + 1;
    }
    if (!*found && entry) {
        memcpy(o, entry, strlen(entry));
        o += strlen(entry);
        *o++ = '\n';
    }
    *outlen = (size_t)(o - out);
    return out;
}

int rt_auth_passwd_main(int argc, char **argv)
{
    bool create = false, batch = false, del = false;
    uint32_t iterations = RT_AUTH_PBKDF2_ITERATIONS;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
        if (strcmp(argv[i], "-I") == 0 && i + 1 < argc) {
            char *end;
            unsigned long n = strtoul(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < 1 || n > RT_AUTH_MAX_ITERATIONS) {
                fprintf(stderr, "rtd passwd: -I takes a count of rounds from 1 to %u\n",
                        RT_AUTH_MAX_ITERATIONS);
                return 2;
            }
            iterations = (uint32_t)n;
            continue;
        }
        for (const char *f = argv[i] + 1; *f; f++) {
            if (*f == 'c')
                create = true;
            else if (*f == 'b')
                batch = true;
            else if (*f == 'D')
                del = true;
            else {
                fprintf(stderr, "rtd passwd: unknown option -%c\n", *f);
                return passwd_usage();
            }
        }
    }
    int rest = argc - i;
    if ((del && (create || batch || rest != 2)) || (!del && rest != (batch ? 3 : 2)))
        return passwd_usage();
    const char *path = argv[i], *user = argv[i + 1];
    const char *why = bad_user_name(user);
    if (why) {
        fprintf(stderr, "rtd passwd: the user name %s\n", why);
        return 1;
    }

    /* The file as it is: it must load, so what we write loads too. */
    char err[RT_AUTH_ERR_LEN];
    char *old = NULL;
    size_t oldlen = 0;
    if (!create) {
        rt_auth_t *check;
        int rc = rt_auth_load(path, &check, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "rtd passwd: %s%s\n", err,
                    rc == RT_ENOTFOUND && !del ? " (use -c to create it)" : "");
            return 1;
        }
        rt_auth_free(check);
        if (rt__auth_read_file(path, &old, &oldlen, err, sizeof(err)) != 0) {
            fprintf(stderr, "rtd passwd: %s\n", err);
            return 1;
        }
    }

    char *entry = NULL;
    if (!del) {
        char *pw = batch ? strdup(argv[i + 2]) : read_password("Password: ");
        char *again = batch || !pw ? NULL : read_password("Reenter password: ");
        const char *bad = !pw || (!batch && !again)          ? "no password was given"
                          : !batch && strcmp(pw, again) != 0 ? "the passwords do not match"
                          : !*pw                             ? "the password is empty"
                          : strlen(pw) > RT_AUTH_MAX_NAME    ? "the password is over 65535 bytes"
                                                             : NULL;
        char hash[RT_AUTH_HASH_MAX];
        int rc = bad ? 0
                     : rt_auth_hash_password((const uint8_t *)pw, strlen(pw), iterations, hash,
                                             sizeof(hash));
        if (pw)
            OPENSSL_cleanse(pw, strlen(pw));
        if (again)
            OPENSSL_cleanse(again, strlen(again));
        free(pw);
        free(again);
        if (bad || rc) {
            fprintf(stderr, "rtd passwd: %s\n", bad ? bad : rt_strerror(rc));
            free(old);
            return 1;
        }
        size_t n = strlen(user) + strlen(hash) + 2;
        entry = malloc(n);
        if (entry)
            snprintf(entry, n, "%s:%s", user, hash);
    }
    bool found = false;
    size_t len = 0;
    char *next = (entry || del) ? rewrite(old ? old : "", oldlen, user, entry, &len, &found) : NULL;
    free(old);
    free(entry);
    if (!next) {
        fprintf(stderr, "rtd passwd: out of memory\n");
        return 1;
    }
    if (del && !found) {
        fprintf(stderr, "rtd passwd: %s: no user %s\n", path, user);
        free(next);
        return 1;
    }
    int e = write_atomically(path, next, len);
    free(next);
    if (e) {
        fprintf(stderr, "rtd passwd: %s: cannot write: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

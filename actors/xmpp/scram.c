/*
** SASL SCRAM and PLAIN, server side (scram.h): credentials from passwords (PBKDF2, the
** slow part), the three-step exchange as a state machine over one caller-allocated
** object, and PLAIN's message.
*/
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stringprep.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "jid.h"
#include "scram.h"

#define SNONCE_BYTES 18 /* random bytes of a server nonce: 24 base64 characters */
#define SNONCE_MAX 64   /* a server nonce given to rt__scram_server_first_nonce */
/* r= nonce, s= salt, i= count with their commas; then v= and the signature. */
#define SERVER_FIRST_MAX                                                                           \
    (2 + RT_SCRAM_NONCE_MAX + SNONCE_MAX + 3 + RT_BASE64_LEN(RT_SCRAM_SALT_MAX) + 3 + 10 + 1)
#define SERVER_FINAL_MAX (2 + RT_BASE64_LEN(RT_SCRAM_KEY_MAX) + 1)
#define PW_PREP_MAX 4096 /* bytes of a SASLprep'd password */

enum { ST_STARTED = 1, ST_SENT, ST_DONE, ST_FAILED };

/*
** The exchange. buf holds, in this order: the client-first message as received (the gs2
** header, then client-first-message-bare) and a NUL, the unescaped user name and NUL, the
** unescaped authzid and NUL, the server-first message and NUL, the server-final message.
** Offsets fit 16 bits: a client message is at most RT_SCRAM_MSG_MAX bytes.
*/
struct rt_scram_s {
    uint8_t state;      /* ST_ */
    uint8_t hash;       /* rt_scram_hash_t */
    uint8_t plus;       /* a -PLUS mechanism */
    uint8_t cb_offered; /* RT_SCRAM_CB_ types this connection gives */
    uint8_t cb;         /* the type the client chose; 0: none */
    uint8_t flag;       /* the gs2 channel binding flag: 'n', 'y' or 'p' */
    uint8_t fail;       /* rt_scram_fail_t of the first refusal */
    uint8_t unknown;    /* no such user: keys made up, the proof cannot verify */
    uint16_t gs2_len;   /* the gs2 header, from buf[0] */
    uint16_t bare_len;  /* client-first-message-bare, from buf[gs2_len] */
    uint16_t user_at, user_len;
    uint16_t authz_at, authz_len; /* authz_at 0: no authzid */
    uint16_t cnonce_at, cnonce_len;
    uint16_t sf_at, sf_len; /* server-first; its nonce is sf_at + 2 .. nonce_len */
    uint16_t nonce_len;     /* client and server nonce together */
    uint16_t sfin_at;       /* server-final */
    uint32_t cap;           /* bytes of buf */
    uint8_t stored_key[RT_SCRAM_KEY_MAX];
    uint8_t server_key[RT_SCRAM_KEY_MAX];
    char buf[];
};

/* ---- Names ---- */

size_t rt_scram_key_len(rt_scram_hash_t hash)
{
    return hash == RT_SCRAM_SHA1 ? 20 : 32;
}

/*
** The digests, fetched once: EVP_sha256() and a digest named at each use make OpenSSL 3 look
** the algorithm up again every time, which cost more than the hashing in an exchange.
*/
static EVP_MD *mds[2];
static pthread_once_t md_once = PTHREAD_ONCE_INIT;

static void md_fetch(void)
{
    mds[RT_SCRAM_SHA1] = EVP_MD_fetch(NULL, "SHA1", NULL);
    mds[RT_SCRAM_SHA256] = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *md_of(rt_scram_hash_t hash)
{
    pthread_once(&md_once, md_fetch);
    return mds[hash == RT_SCRAM_SHA256];
}

static const char *const mech_names[2][2] = {
    {"SCRAM-SHA-1", "SCRAM-SHA-1-PLUS"},
    {"SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"},
};

const char *rt_scram_mech_name(rt_scram_hash_t hash, bool plus)
{
    return mech_names[hash == RT_SCRAM_SHA256][plus];
}

int rt_scram_mech_parse(const char *name, size_t len, rt_scram_hash_t *hash, bool *plus)
{
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < 2; p++)
            if (strlen(mech_names[h][p]) == len && memcmp(mech_names[h][p], name, len) == 0) {
                *hash = (rt_scram_hash_t)h;
                *plus = p;
                return 0;
            }
    return RT_ENOTFOUND;
}

static const struct {
    const char *name, *condition;
} fails[] = {
    [RT_SCRAM_OK] = {"", ""},
    [RT_SCRAM_MALFORMED] = {"invalid-encoding", "malformed-request"},
    [RT_SCRAM_EXTENSION] = {"extensions-not-supported", "malformed-request"},
    [RT_SCRAM_BAD_USERNAME] = {"invalid-username-encoding", "malformed-request"},
    [RT_SCRAM_CB_UNSUPPORTED] = {"channel-binding-not-supported", "malformed-request"},
    [RT_SCRAM_CB_TYPE] = {"unsupported-channel-binding-type", "malformed-request"},
    [RT_SCRAM_DOWNGRADE] = {"server-does-support-channel-binding", "not-authorized"},
    [RT_SCRAM_CB_MISMATCH] = {"channel-bindings-dont-match", "not-authorized"},
    [RT_SCRAM_NONCE] = {"other-error", "not-authorized"},
    [RT_SCRAM_BAD_PROOF] = {"invalid-proof", "not-authorized"},
    [RT_SCRAM_OUT_OF_TURN] = {"other-error", "malformed-request"},
    [RT_SCRAM_NO_RESOURCES] = {"no-resources", "temporary-auth-failure"},
};

const char *rt_scram_fail_name(rt_scram_fail_t f)
{
    return (unsigned)f < sizeof(fails) / sizeof(fails[0]) ? fails[f].name : "other-error";
}

const char *rt_scram_fail_condition(rt_scram_fail_t f)
{
    return (unsigned)f < sizeof(fails) / sizeof(fails[0]) ? fails[f].condition
                                                          : "malformed-request";
}

/* ---- HMAC (RFC 2104) and hashes, over the digests fetched once ---- */

#define HMAC_BLOCK 64 /* SHA-1's and SHA-256's block, in bytes */

typedef struct {
    const void *p;
    size_t n;
} piece_t;

static bool digest(rt_scram_hash_t hash, const uint8_t *in, size_t n, uint8_t *out)
{
    unsigned int len = 0;
    const EVP_MD *md = md_of(hash);
    return md && EVP_Digest(in, n, out, &len, md, NULL) == 1 && len == rt_scram_key_len(hash);
}

/* H(key ^ pad, pieces...) into out, on ctx. */
static bool hmac_half(EVP_MD_CTX *ctx, const EVP_MD *md, const uint8_t *key, uint8_t pad,
                      const piece_t *pieces, int npieces, uint8_t *out)
{
    uint8_t k[HMAC_BLOCK];
    for (size_t i = 0; i < HMAC_BLOCK; i++)
        k[i] = key[i] ^ pad;
    bool ok = EVP_DigestInit_ex(ctx, md, NULL) == 1 && EVP_DigestUpdate(ctx, k, HMAC_BLOCK) == 1;
    OPENSSL_cleanse(k, sizeof(k));
    for (int i = 0; ok && i < npieces; i++)
        ok = EVP_DigestUpdate(ctx, pieces[i].p, pieces[i].n) == 1;
    unsigned int len = 0;
    return ok && EVP_DigestFinal_ex(ctx, out, &len) == 1;
}

/* HMAC with the exchange's hash of the pieces, one after another, into out. */
static bool hmac(rt_scram_hash_t hash, const uint8_t *key, size_t keylen, const piece_t *pieces,
                 int npieces, uint8_t *out)
{
    const EVP_MD *md = md_of(hash);
    size_t klen = rt_scram_key_len(hash);
    uint8_t k[HMAC_BLOCK] = {0}, inner[RT_SCRAM_KEY_MAX];
    if (!md || (keylen > HMAC_BLOCK && !digest(hash, key, keylen, k)))
        return false;
    if (keylen <= HMAC_BLOCK)
        memcpy(k, key, keylen);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && hmac_half(ctx, md, k, 0x36, pieces, npieces, inner) &&
              hmac_half(ctx, md, k, 0x5c, &(piece_t){inner, klen}, 1, out);
    EVP_MD_CTX_free(ctx);
    OPENSSL_cleanse(k, sizeof(k));
    OPENSSL_cleanse(inner, sizeof(inner));
    return ok;
}

/* ---- Credentials (slow) ---- */

int rt_scram_cred_derive(rt_scram_hash_t hash, const char *pw, size_t pwlen, const uint8_t *salt,
                         size_t saltlen, uint32_t iterations, rt_scram_cred_t *out,
                         const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (saltlen < 1 || saltlen > RT_SCRAM_SALT_MAX) {
        *why = "the salt must be 1 to 64 bytes";
        return RT_EINVAL;
    }
    if (iterations < RT_SCRAM_MIN_ITERATIONS || iterations > RT_SCRAM_MAX_ITERATIONS) {
        *why = "the iteration count must be 4096 to 1000000";
        return RT_EINVAL;
    }
    /* Normalize(password): SASLprep as a query (RFC 5802 §2.2), unassigned code points
       allowed; a password it refuses or empties is refused. */
    char prepped[PW_PREP_MAX];
    size_t n = 0;
    int rc = rt__stringprep(stringprep_saslprep, 0, pw, pwlen, prepped, sizeof(prepped), &n, why);
    if (rc == 0 && n == 0) {
        *why = "the password is empty once SASLprep'd";
        rc = RT_EINVAL;
    }
    size_t klen = rt_scram_key_len(hash);
    uint8_t salted[RT_SCRAM_KEY_MAX], client_key[RT_SCRAM_KEY_MAX];
    if (rc == 0 && PKCS5_PBKDF2_HMAC(prepped, (int)n, salt, (int)saltlen, (int)iterations,
                                     md_of(hash), (int)klen, salted) != 1)
        rc = RT_ENOMEM;
    OPENSSL_cleanse(prepped, sizeof(prepped));
    if (rc)
        return rc;
    memset(out, 0, sizeof(*out));
    out->hash = (uint8_t)hash;
    out->salt_len = (uint8_t)saltlen;
    out->iterations = iterations;
    memcpy(out->salt, salt, saltlen);
    bool ok = hmac(hash, salted, klen, &(piece_t){"Client Key", 10}, 1, client_key) &&
              digest(hash, client_key, klen, out->stored_key) &&
              hmac(hash, salted, klen, &(piece_t){"Server Key", 10}, 1, out->server_key);
    OPENSSL_cleanse(salted, sizeof(salted));
    OPENSSL_cleanse(client_key, sizeof(client_key));
    return ok ? 0 : RT_ENOMEM;
}

int rt_scram_cred_make(rt_scram_hash_t hash, const char *pw, size_t pwlen, uint32_t iterations,
                       rt_scram_cred_t *out, const char **why)
{
    uint8_t salt[RT_SCRAM_SALT_BYTES];
    if (RAND_bytes(salt, sizeof(salt)) != 1) {
        if (why)
            *why = "no randomness for a salt";
        return RT_EAGAIN;
    }
    return rt_scram_cred_derive(hash, pw, pwlen, salt, sizeof(salt), iterations, out, why);
}

int rt_scram_check_password(const rt_scram_cred_t *cred, const char *pw, size_t pwlen)
{
    if (cred->hash > RT_SCRAM_SHA256)
        return RT_EINVAL;
    rt_scram_cred_t c;
    int rc = rt_scram_cred_derive(cred->hash, pw, pwlen, cred->salt, cred->salt_len,
                                  cred->iterations, &c, NULL);
    if (rc)
        return rc;
    size_t klen = rt_scram_key_len(cred->hash);
    bool same = CRYPTO_memcmp(c.stored_key, cred->stored_key, klen) == 0 &&
                CRYPTO_memcmp(c.server_key, cred->server_key, klen) == 0;
    OPENSSL_cleanse(&c, sizeof(c));
    return same ? 0 : RT_EACCES;
}

/* ---- The exchange ---- */

size_t rt_scram_size(size_t len)
{
    if (len > RT_SCRAM_MSG_MAX)
        return 0;
    /* The message and its NUL; user name and authzid, unescaped, fit in len with two NULs. */
    return sizeof(rt_scram_t) + (len + 1) + (len + 2) + SERVER_FIRST_MAX + SERVER_FINAL_MAX;
}

/* Records the first refusal and ends the exchange; returns code. */
static int fail(rt_scram_t *s, rt_scram_fail_t why, int code)
{
    if (s->state != ST_FAILED)
        s->fail = (uint8_t)why;
    s->state = ST_FAILED;
    return code;
}

rt_scram_fail_t rt_scram_failure(const rt_scram_t *s)
{
    return (rt_scram_fail_t)s->fail;
}

/* A cursor over a message's comma-separated fields. */
typedef struct {
    const char *p, *end;
} cursor_t;

/* The next field up to the next comma (or the end), the comma consumed; false at the end. */
static bool field(cursor_t *c, const char **f, size_t *n, bool *last)
{
    if (c->p > c->end)
        return false;
    const char *comma = memchr(c->p, ',', (size_t)(c->end - c->p));
    const char *stop = comma ? comma : c->end;
    *f = c->p;
    *n = (size_t)(stop - c->p);
    *last = !comma;
    c->p = stop + 1;
    return true;
}

static bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/*
** A saslname (RFC 5802 §7: UTF-8 without NUL, ',' and '=', except as =2C and =3D),
** unescaped into out (n bytes suffice) with a NUL; its length, or -1.
*/
static long saslname(const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i] != '=') {
            out[o++] = in[i];
            continue;
        }
        bool comma = n - i >= 3 && in[i + 1] == '2' && in[i + 2] == 'C';
        bool equals = n - i >= 3 && in[i + 1] == '3' && in[i + 2] == 'D';
        if (!comma && !equals)
            return -1;
        out[o++] = comma ? ',' : '=';
        i += 2;
    }
    out[o] = 0;
    return o && rt_utf8_text(out, o) ? (long)o : -1;
}

/* An extension attribute: ALPHA "=" 1*value-char (UTF-8, no NUL; commas end the field). */
static bool attr_val(const char *f, size_t n)
{
    return n >= 3 && is_alpha(f[0]) && f[1] == '=' && rt_utf8_text(f + 2, n - 2);
}

static bool printable_nonce(const char *f, size_t n)
{
    if (n < 1 || n > RT_SCRAM_NONCE_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (f[i] < 0x21 || f[i] > 0x7e || f[i] == ',')
            return false;
    return true;
}

/* The gs2 header's channel binding flag and what the mechanism and connection allow. */
static int cb_flag(rt_scram_t *s, const char *f, size_t n)
{
    if (n == 1 && (f[0] == 'n' || f[0] == 'y')) {
        s->flag = (uint8_t)f[0];
        if (s->plus)
            return fail(s, RT_SCRAM_CB_UNSUPPORTED, RT_EPROTO);
        /* 'y': the client could bind but believes we cannot; we offered -PLUS, so someone
           took it out of the list on the way (RFC 5802 §6). */
        if (f[0] == 'y' && s->cb_offered)
            return fail(s, RT_SCRAM_DOWNGRADE, RT_EPROTO);
        return 0;
    }
    if (n < 3 || f[0] != 'p' || f[1] != '=')
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    for (size_t i = 2; i < n; i++)
        if (!is_alpha(f[i]) && !(f[i] >= '0' && f[i] <= '9') && f[i] != '.' && f[i] != '-')
            return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    s->flag = 'p';
    if (!s->plus || !s->cb_offered)
        return fail(s, RT_SCRAM_CB_UNSUPPORTED, RT_EPROTO);
    unsigned type = n - 2 == 12 && memcmp(f + 2, "tls-exporter", 12) == 0 ? RT_SCRAM_CB_TLS_EXPORTER
                    : n - 2 == 20 && memcmp(f + 2, "tls-server-end-point", 20) == 0
                        ? RT_SCRAM_CB_TLS_SERVER_END_POINT
                        : 0;
    if (!(type & s->cb_offered))
        return fail(s, RT_SCRAM_CB_TYPE, RT_EPROTO);
    s->cb = (uint8_t)type;
    return 0;
}

int rt_scram_start(rt_scram_t *s, size_t size, rt_scram_hash_t hash, bool plus, unsigned cb_offered,
                   const void *msg, size_t len, rt_scram_first_t *first)
{
    size_t need = rt_scram_size(len);
    if (size < sizeof(*s) || (need && size < need))
        return RT_EINVAL;
    memset(s, 0, sizeof(*s));
    s->hash = hash == RT_SCRAM_SHA1 ? RT_SCRAM_SHA1 : RT_SCRAM_SHA256;
    s->plus = plus;
    s->cb_offered =
        (uint8_t)(cb_offered & (RT_SCRAM_CB_TLS_EXPORTER | RT_SCRAM_CB_TLS_SERVER_END_POINT));
    s->cap = (uint32_t)(size - sizeof(*s));
    s->state = ST_STARTED;
    if (!need || len == 0)
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    memcpy(s->buf, msg, len);
    s->buf[len] = 0;
    cursor_t c = {s->buf, s->buf + len};
    const char *f;
    size_t n;
    bool last;
    /* gs2-header = gs2-cbind-flag "," [ authzid ] "," */
    if (!field(&c, &f, &n, &last) || last)
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    int rc = cb_flag(s, f, n);
    if (rc)
        return rc;
    if (!field(&c, &f, &n, &last) || last)
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    char *names = s->buf + len + 1;
    size_t at = 0;
    if (n > 0) {
        long k = n > 2 && f[0] == 'a' && f[1] == '=' ? saslname(f + 2, n - 2, names) : -2;
        if (k < 0)
            return fail(s, k == -2 ? RT_SCRAM_MALFORMED : RT_SCRAM_BAD_USERNAME, RT_EPROTO);
        s->authz_at = (uint16_t)(len + 1);
        s->authz_len = (uint16_t)k;
        at = (size_t)k + 1;
    }
    s->gs2_len = (uint16_t)(c.p - s->buf);
    /* client-first-message-bare = [reserved-mext ","] username "," nonce ["," extensions] */
    if (!field(&c, &f, &n, &last))
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    if (n >= 2 && f[0] == 'm' && f[1] == '=')
        return fail(s, RT_SCRAM_EXTENSION, RT_EPROTO);
    if (last || n < 2 || f[0] != 'n' || f[1] != '=')
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    long k = saslname(f + 2, n - 2, names + at);
    if (k < 0)
        return fail(s, RT_SCRAM_BAD_USERNAME, RT_EPROTO);
    s->user_at = (uint16_t)(len + 1 + at);
    s->user_len = (uint16_t)k;
    if (!field(&c, &f, &n, &last) || n < 2 || f[0] != 'r' || f[1] != '=' ||
        !printable_nonce(f + 2, n - 2))
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    s->cnonce_at = (uint16_t)(f + 2 - s->buf);
    s->cnonce_len = (uint16_t)(n - 2);
    while (!last) {
        if (!field(&c, &f, &n, &last) || !attr_val(f, n))
            return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    }
    s->bare_len = (uint16_t)(len - s->gs2_len);
    s->sf_at = (uint16_t)(s->user_at + s->user_len + 1);
    first->user = s->buf + s->user_at;
    first->user_len = s->user_len;
    first->authzid = s->authz_at ? s->buf + s->authz_at : NULL;
    first->authzid_len = s->authz_len;
    first->cb = s->cb;
    return 0;
}

/* The process's secret for made-up salts: the same name gets the same salt all run long. */
static uint8_t fake_secret[32];
static bool fake_ready;
static pthread_once_t fake_once = PTHREAD_ONCE_INIT;

static void fake_init(void)
{
    fake_ready = RAND_bytes(fake_secret, sizeof(fake_secret)) == 1;
}

int rt__scram_server_first_nonce(rt_scram_t *s, const rt_scram_cred_t *cred, const char *nonce,
                                 size_t nonce_len, const char **out, size_t *outlen)
{
    if (s->state != ST_STARTED)
        return fail(s, RT_SCRAM_OUT_OF_TURN, RT_EPROTO);
    if (!printable_nonce(nonce, nonce_len) || nonce_len > SNONCE_MAX)
        return RT_EINVAL;
    rt_scram_cred_t made;
    if (!cred) {
        /* No such user: a salt from the name, so asking twice shows the same one, and keys
           nobody has. The proof is still computed and compared, then refused. */
        pthread_once(&fake_once, fake_init);
        uint8_t mac[RT_SCRAM_KEY_MAX];
        memset(&made, 0, sizeof(made));
        if (!fake_ready ||
            !hmac(RT_SCRAM_SHA256, fake_secret, sizeof(fake_secret),
                  (piece_t[]){{&s->hash, 1}, {s->buf + s->user_at, s->user_len}}, 2, mac) ||
            RAND_bytes(made.stored_key, sizeof(made.stored_key)) != 1)
            return fail(s, RT_SCRAM_NO_RESOURCES, RT_EAGAIN);
        made.hash = s->hash;
        made.salt_len = RT_SCRAM_SALT_BYTES;
        made.iterations = RT_SCRAM_ITERATIONS;
        memcpy(made.salt, mac, RT_SCRAM_SALT_BYTES);
        cred = &made;
        s->unknown = 1;
    }
    if (cred->hash != s->hash || cred->salt_len < 1 || cred->salt_len > RT_SCRAM_SALT_MAX ||
        cred->iterations < RT_SCRAM_MIN_ITERATIONS || cred->iterations > RT_SCRAM_MAX_ITERATIONS)
        return RT_EINVAL;
    memcpy(s->stored_key, cred->stored_key, RT_SCRAM_KEY_MAX);
    memcpy(s->server_key, cred->server_key, RT_SCRAM_KEY_MAX);
    char salt[RT_BASE64_LEN(RT_SCRAM_SALT_MAX) + 1];
    rt_base64_encode(cred->salt, cred->salt_len, salt);
    /* r=client nonce + server nonce,s=salt,i=count; the client nonce is in this very
       object, hence memcpy, which the copy is sure not to overlap (sf_at is past it). */
    char tail[3 + RT_BASE64_LEN(RT_SCRAM_SALT_MAX) + 3 + 10 + 1];
    int t = snprintf(tail, sizeof(tail), ",s=%s,i=%u", salt, cred->iterations);
    char *sf = s->buf + s->sf_at;
    size_t n = 0;
    memcpy(sf, "r=", 2);
    n += 2;
    memcpy(sf + n, s->buf + s->cnonce_at, s->cnonce_len);
    n += s->cnonce_len;
    memcpy(sf + n, nonce, nonce_len);
    n += nonce_len;
    memcpy(sf + n, tail, (size_t)t + 1);
    n += (size_t)t;
    RT_ASSERT(t > 0 && n < SERVER_FIRST_MAX);
    s->sf_len = (uint16_t)n;
    s->nonce_len = (uint16_t)(s->cnonce_len + nonce_len);
    s->sfin_at = (uint16_t)(s->sf_at + n + 1);
    RT_ASSERT((uint32_t)s->sfin_at + SERVER_FINAL_MAX <= s->cap);
    s->state = ST_SENT;
    *out = sf;
    *outlen = (size_t)n;
    return 0;
}

int rt_scram_server_first(rt_scram_t *s, const rt_scram_cred_t *cred, const char **out,
                          size_t *outlen)
{
    uint8_t raw[SNONCE_BYTES];
    char nonce[RT_BASE64_LEN(SNONCE_BYTES) + 1];
    if (s->state != ST_STARTED)
        return fail(s, RT_SCRAM_OUT_OF_TURN, RT_EPROTO);
    if (rt_random(raw, sizeof(raw)) != 0)
        return fail(s, RT_SCRAM_NO_RESOURCES, RT_EAGAIN);
    size_t n = rt_base64_encode(raw, sizeof(raw), nonce); /* 18 bytes: no '=' */
    return rt__scram_server_first_nonce(s, cred, nonce, n, out, outlen);
}

/*
** Whether the strict base64 text t[0..n) decodes to a[0..alen) followed by b[0..blen),
** decoded four characters at a time (no buffer for a long authzid) and compared without
** stopping early.
*/
static bool b64_is(const char *t, size_t n, const uint8_t *a, size_t alen, const uint8_t *b,
                   size_t blen)
{
    size_t want = alen + blen, at = 0;
    if (n != RT_BASE64_LEN(want))
        return false;
    unsigned diff = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint8_t d[3];
        long k = rt_base64_decode(t + i, 4, d, sizeof(d), RT_BASE64_STRICT);
        if (k < 0 || (k < 3 && i + 4 < n))
            return false;
        if (at + (size_t)k > want)
            return false; /* the text's length allows a byte or two more than want */
        for (long j = 0; j < k; j++, at++)
            diff |= d[j] ^ (at < alen ? a[at] : b[at - alen]);
    }
    return at == want && diff == 0;
}

int rt_scram_client_final(rt_scram_t *s, const void *msg, size_t len, const void *cb_data,
                          size_t cb_len, const char **out, size_t *outlen)
{
    if (s->state != ST_SENT)
        return fail(s, RT_SCRAM_OUT_OF_TURN, RT_EPROTO);
    if (len == 0 || len > RT_SCRAM_MSG_MAX || memchr(msg, 0, len))
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    /* c=base64 "," r=nonce ["," extensions] "," p=base64, the proof last. */
    cursor_t c = {msg, (const char *)msg + len};
    const char *f, *cb = NULL, *nonce = NULL, *proof = NULL;
    size_t n, cbn = 0, noncen = 0, proofn = 0;
    bool last = false;
    for (int i = 0; !last; i++) {
        if (!field(&c, &f, &n, &last) || n < 2 || f[1] != '=')
            return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
        if (i == 0 && f[0] == 'c') {
            cb = f + 2;
            cbn = n - 2;
        } else if (i == 1 && f[0] == 'r') {
            nonce = f + 2;
            noncen = n - 2;
        } else if (i >= 2 && last && f[0] == 'p') {
            proof = f + 2;
            proofn = n - 2;
        } else if (i < 2 || !attr_val(f, n)) {
            return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
        }
    }
    size_t klen = rt_scram_key_len(s->hash);
    uint8_t p[RT_SCRAM_KEY_MAX + 1];
    if (!proof || rt_base64_decode(proof, proofn, p, sizeof(p), RT_BASE64_STRICT) != (long)klen)
        return fail(s, RT_SCRAM_MALFORMED, RT_EPROTO);
    /* c= is the gs2 header, then for 'p' the connection's binding data (RFC 5802 §7). */
    bool with_data = s->flag == 'p';
    if (with_data && (!cb_data || cb_len == 0 || cb_len > RT_SCRAM_CB_DATA_MAX))
        return fail(s, RT_SCRAM_CB_MISMATCH, RT_EACCES);
    if (!b64_is(cb, cbn, (const uint8_t *)s->buf, s->gs2_len, cb_data, with_data ? cb_len : 0))
        return fail(s, RT_SCRAM_CB_MISMATCH, RT_EACCES);
    if (noncen != s->nonce_len || memcmp(nonce, s->buf + s->sf_at + 2, noncen) != 0)
        return fail(s, RT_SCRAM_NONCE, RT_EACCES);
    /* AuthMessage = client-first-message-bare "," server-first-message ","
                     client-final-message-without-proof */
    const piece_t auth[] = {
        {s->buf + s->gs2_len, s->bare_len},
        {",", 1},
        {s->buf + s->sf_at, s->sf_len},
        {",", 1},
        {msg, (size_t)(proof - 3 - (const char *)msg)},
    };
    uint8_t sig[RT_SCRAM_KEY_MAX], key[RT_SCRAM_KEY_MAX], stored[RT_SCRAM_KEY_MAX];
    if (!hmac(s->hash, s->stored_key, klen, auth, 5, sig))
        return fail(s, RT_SCRAM_NO_RESOURCES, RT_EACCES);
    for (size_t i = 0; i < klen; i++)
        key[i] = p[i] ^ sig[i]; /* ClientKey = ClientProof XOR ClientSignature */
    if (!digest(s->hash, key, klen, stored))
        return fail(s, RT_SCRAM_NO_RESOURCES, RT_EACCES);
    bool match = CRYPTO_memcmp(stored, s->stored_key, klen) == 0;
    if (!match || s->unknown)
        return fail(s, RT_SCRAM_BAD_PROOF, RT_EACCES);
    if (!hmac(s->hash, s->server_key, klen, auth, 5, sig))
        return fail(s, RT_SCRAM_NO_RESOURCES, RT_EACCES);
    char *v = s->buf + s->sfin_at;
    v[0] = 'v';
    v[1] = '=';
    *outlen = 2 + rt_base64_encode(sig, klen, v + 2);
    *out = v;
    s->state = ST_DONE;
    return 0;
}

/* ---- PLAIN ---- */

int rt_sasl_plain_parse(const void *msg, size_t len, rt_sasl_plain_t *out)
{
    const char *m = msg, *end = m + len;
    const char *nul1 = memchr(m, 0, len);
    const char *nul2 = nul1 ? memchr(nul1 + 1, 0, (size_t)(end - nul1 - 1)) : NULL;
    if (!nul2 || memchr(nul2 + 1, 0, (size_t)(end - nul2 - 1)))
        return RT_EPROTO;
    out->authzid = m;
    out->authzid_len = (size_t)(nul1 - m);
    out->authcid = nul1 + 1;
    out->authcid_len = (size_t)(nul2 - nul1 - 1);
    out->passwd = nul2 + 1;
    out->passwd_len = (size_t)(end - nul2 - 1);
    if (out->authcid_len == 0 || out->passwd_len == 0 ||
        out->authzid_len > RT_SASL_PLAIN_FIELD_MAX || out->authcid_len > RT_SASL_PLAIN_FIELD_MAX ||
        out->passwd_len > RT_SASL_PLAIN_FIELD_MAX ||
        !rt_utf8_text(out->authzid, out->authzid_len) ||
        !rt_utf8_text(out->authcid, out->authcid_len) ||
        !rt_utf8_text(out->passwd, out->passwd_len))
        return RT_EPROTO;
    return 0;
}

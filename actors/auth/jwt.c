/*
** JWT verification (jwt.h): the keys a configuration names, loaded once per (re)load, and
** the check of one token. JSON is read with libbson's parser.
*/
#include <bson/bson.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth_impl.h"
#include "jwt.h"

typedef enum { ALG_HS256, ALG_RS256, ALG_ES256 } alg_t;
static const char *const alg_names[] = {"HS256", "RS256", "ES256"};

typedef struct {
    char kid[128]; /* "" when the key has none (a PEM key) */
    alg_t alg;
    EVP_PKEY *pkey;
} jwt_key_t;

struct rt_jwt_s {
    rt_conf_auth_t conf;
    uint8_t *secret; /* HS256 */
    size_t secret_len;
    jwt_key_t *keys;
    size_t nkeys;
};

/* ---- base64url (RFC 4648 5, no padding) ---- */

/* A malloc'd decoding of a part (NUL-terminated, for JSON), or NULL. */
static uint8_t *b64url_dup(const uint8_t *s, size_t n, size_t *len)
{
    size_t cap = n * 3 / 4 + 1;
    uint8_t *out = malloc(cap + 1);
    long got = out ? rt_base64_decode((const char *)s, n, out, cap, RT_BASE64_URL) : -1;
    if (got < 0 || memchr(s, '=', n)) { /* JWS parts carry no padding */
        free(out);
        return NULL;
    }
    out[got] = 0;
    *len = (size_t)got;
    return out;
}

/* Whether c is of base64url's alphabet. */
static bool b64url_char(uint8_t c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* ---- Keys ---- */

static int fail(char *err, size_t errlen, int rc, const char *fmt, const char *a, const char *b)
{
    snprintf(err, errlen, fmt, a, b);
    return rc;
}

/* The algorithm a public key verifies: RS256 for RSA, ES256 for P-256; false for others. */
static bool alg_of(EVP_PKEY *pkey, alg_t *alg)
{
    if (EVP_PKEY_is_a(pkey, "RSA")) {
        *alg = ALG_RS256;
        return EVP_PKEY_get_bits(pkey) >= 2048;
    }
    char group[64];
    size_t glen;
    if (EVP_PKEY_is_a(pkey, "EC") &&
        EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group),
                                       &glen) &&
        strcmp(group, "prime256v1") == 0) {
        *alg = ALG_ES256;
        return true;
    }
    return false;
}

static int add_key(rt_jwt_t *j, const char *kid, size_t kidlen, EVP_PKEY *pkey, alg_t alg)
{
    jwt_key_t *k = realloc(j->keys, (j->nkeys + 1) * sizeof(*k));
    if (!k)
        return RT_ENOMEM;
    j->keys = k;
    k = &j->keys[j->nkeys++];
    memset(k, 0, sizeof(*k));
    memcpy(k->kid, kid, kidlen < sizeof(k->kid) - 1 ? kidlen : sizeof(k->kid) - 1);
    k->alg = alg;
    k->pkey = pkey;
    return 0;
}

static int load_pem(rt_jwt_t *j, const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = rt__auth_read_file(path, &text, &len, err, errlen);
    if (rc)
        return rc;
    BIO *bio = BIO_new_mem_buf(text, (int)len);
    EVP_PKEY *pkey = bio ? PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    free(text);
    alg_t alg;
    if (!pkey)
        return fail(err, errlen, RT_EINVAL, "%s: no PEM public key in it%s", path, "");
    if (!alg_of(pkey, &alg)) {
        EVP_PKEY_free(pkey);
        return fail(err, errlen, RT_EINVAL,
                    "%s: an RSA key of 2048 bits or more, or a P-256 key%s, is needed", path, "");
    }
    rc = add_key(j, "", 0, pkey, alg);
    if (rc)
        EVP_PKEY_free(pkey);
    return rc;
}

/* A JWK member's base64url bytes as a big number (RSA's n and e). */
static BIGNUM *jwk_bn(const bson_t *jwk, const char *name)
{
    bson_iter_t it;
    uint32_t n;
    const char *s;
    if (!bson_iter_init_find(&it, jwk, name) || !BSON_ITER_HOLDS_UTF8(&it) ||
        !(s = bson_iter_utf8(&it, &n)))
        return NULL;
    size_t len;
    uint8_t *raw = b64url_dup((const uint8_t *)s, n, &len);
    BIGNUM *bn = raw ? BN_bin2bn(raw, (int)len, NULL) : NULL;
    free(raw);
    return bn;
}

static const char *jwk_str(const bson_t *jwk, const char *name, uint32_t *len)
{
    bson_iter_t it;
    if (!bson_iter_init_find(&it, jwk, name) || !BSON_ITER_HOLDS_UTF8(&it))
        return NULL;
    return bson_iter_utf8(&it, len);
}

/* One JWK of kty RSA or EC (P-256) as a public key, or NULL. */
static EVP_PKEY *jwk_key(const bson_t *jwk)
{
    uint32_t n;
    const char *kty = jwk_str(jwk, "kty", &n);
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    OSSL_PARAM *params = NULL;
    EVP_PKEY *pkey = NULL;
    BIGNUM *bn_n = NULL, *bn_e = NULL;
    uint8_t point[65];
    const char *type = NULL;
    bool ok = bld && kty;
    if (ok && strcmp(kty, "RSA") == 0) {
        type = "RSA";
        bn_n = jwk_bn(jwk, "n");
        bn_e = jwk_bn(jwk, "e");
        ok = bn_n && bn_e && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n) &&
             OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e);
    } else if (ok && strcmp(kty, "EC") == 0) {
        type = "EC";
        uint32_t xn, yn;
        const char *crv = jwk_str(jwk, "crv", &n), *x = jwk_str(jwk, "x", &xn),
                   *y = jwk_str(jwk, "y", &yn);
        uint8_t xy[2][48];
        ok = crv && strcmp(crv, "P-256") == 0 && x && y &&
             rt_base64_decode(x, xn, xy[0], sizeof(xy[0]), RT_BASE64_URL) == 32 &&
             rt_base64_decode(y, yn, xy[1], sizeof(xy[1]), RT_BASE64_URL) == 32;
        if (ok) {
            point[0] = 4; /* uncompressed: 04 || x || y */
            memcpy(point + 1, xy[0], 32);
            memcpy(point + 33, xy[1], 32);
            ok =
                OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) &&
                OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point,
                                                 sizeof(point));
        }
    } else {
        ok = false;
    }
    if (ok)
        ok = (params = OSSL_PARAM_BLD_to_param(bld)) != NULL;
    EVP_PKEY_CTX *ctx = ok ? EVP_PKEY_CTX_new_from_name(NULL, type, NULL) : NULL;
    if (ctx && EVP_PKEY_fromdata_init(ctx) == 1)
        EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params);
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn_n);
    BN_free(bn_e);
    return pkey;
}

static int load_jwks(rt_jwt_t *j, const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = rt__auth_read_file(path, &text, &len, err, errlen);
    if (rc)
        return rc;
    bson_error_t e;
    bson_t *doc = bson_new_from_json((const uint8_t *)text, (ssize_t)len, &e);
    free(text);
    if (!doc)
        return fail(err, errlen, RT_EINVAL, "%s: not JSON: %s", path, e.message);
    bson_iter_t it, keys;
    if (!bson_iter_init_find(&it, doc, "keys") || !BSON_ITER_HOLDS_ARRAY(&it) ||
        !bson_iter_recurse(&it, &keys)) {
        bson_destroy(doc);
        return fail(err, errlen, RT_EINVAL, "%s: no \"keys\" list%s", path, "");
    }
    unsigned index = 0;
    while (rc == 0 && bson_iter_next(&keys)) {
        index++;
        uint32_t dlen;
        const uint8_t *data;
        bson_t jwk;
        if (!BSON_ITER_HOLDS_DOCUMENT(&keys))
            continue;
        bson_iter_document(&keys, &dlen, &data);
        if (!bson_init_static(&jwk, data, dlen))
            continue;
        uint32_t n = 0;
        const char *use = jwk_str(&jwk, "use", &n);
        if (use && strcmp(use, "sig") != 0)
            continue; /* an encryption key: not for tokens */
        EVP_PKEY *pkey = jwk_key(&jwk);
        alg_t alg;
        if (!pkey || !alg_of(pkey, &alg)) {
            EVP_PKEY_free(pkey);
            char which[16];
            snprintf(which, sizeof(which), "%u", index);
            rc =
                fail(err, errlen, RT_EINVAL,
                     "%s: key %s is no RSA key of 2048 bits or more and no P-256 key", path, which);
            break;
        }
        const char *kid = jwk_str(&jwk, "kid", &n);
        rc = add_key(j, kid ? kid : "", kid ? n : 0, pkey, alg);
        if (rc)
            EVP_PKEY_free(pkey);
    }
    bson_destroy(doc);
    if (rc == 0 && j->nkeys == 0)
        rc = fail(err, errlen, RT_EINVAL, "%s: no signing key in it%s", path, "");
    return rc;
}

static int load_secret(rt_jwt_t *j, const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = rt__auth_read_file(path, &text, &len, err, errlen);
    if (rc)
        return rc;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    if (len < RT_JWT_MIN_SECRET) {
        OPENSSL_clear_free(text, len);
        char min[16];
        snprintf(min, sizeof(min), "%d", RT_JWT_MIN_SECRET);
        return fail(err, errlen, RT_EINVAL, "%s: an HS256 secret of at least %s bytes is needed",
                    path, min);
    }
    j->secret = (uint8_t *)text;
    j->secret_len = len;
    return 0;
}

void rt_jwt_free(rt_jwt_t *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->nkeys; i++)
        EVP_PKEY_free(j->keys[i].pkey);
    free(j->keys);
    if (j->secret)
        OPENSSL_clear_free(j->secret, j->secret_len);
    free(j);
}

int rt_jwt_load(const rt_conf_auth_t *conf, rt_jwt_t **out, char *err, size_t errlen)
{
    rt_jwt_t *j = calloc(1, sizeof(*j));
    if (!j)
        return fail(err, errlen, RT_ENOMEM, "auth: out of memory%s%s", "", "");
    j->conf = *conf;
    const char *path = conf->secret_file[0]  ? conf->secret_file
                       : conf->public_key[0] ? conf->public_key
                                             : conf->jwks_file;
    const char *what = conf->secret_file[0]  ? "auth[].secret_file"
                       : conf->public_key[0] ? "auth[].public_key"
                                             : "auth[].jwks_file";
    int rc = rt_file_trusted(-1, path, what, err, errlen);
    if (rc == 0)
        rc = conf->secret_file[0]  ? load_secret(j, path, err, errlen)
             : conf->public_key[0] ? load_pem(j, path, err, errlen)
                                   : load_jwks(j, path, err, errlen);
    if (rc) {
        rt_jwt_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

bool rt_jwt_cheap(const rt_jwt_t *j)
{
    return j->secret != NULL;
}

size_t rt_jwt_bytes(const rt_jwt_t *j)
{
    /* The keys themselves are OpenSSL's: counted as about a key's size each. */
    return j ? sizeof(*j) + j->secret_len + j->nkeys * (sizeof(jwt_key_t) + 512) : 0;
}

/* ---- One token ---- */

static bool verify_sig(const rt_jwt_t *j, alg_t alg, const jwt_key_t *k, const uint8_t *signed_part,
                       size_t slen, const uint8_t *sig, size_t siglen)
{
    if (alg == ALG_HS256) {
        uint8_t mac[EVP_MAX_MD_SIZE];
        unsigned maclen = 0;
        return HMAC(EVP_sha256(), j->secret, (int)j->secret_len, signed_part, slen, mac, &maclen) &&
               maclen == siglen && CRYPTO_memcmp(mac, sig, siglen) == 0;
    }
    uint8_t der[80];
    const uint8_t *check = sig;
    size_t checklen = siglen;
    if (alg == ALG_ES256) { /* JWS carries r || s; OpenSSL verifies DER (RFC 7518 3.4) */
        if (siglen != 64)
            return false;
        ECDSA_SIG *es = ECDSA_SIG_new();
        BIGNUM *r = BN_bin2bn(sig, 32, NULL), *s = BN_bin2bn(sig + 32, 32, NULL);
        if (!es || !r || !s || !ECDSA_SIG_set0(es, r, s)) {
            BN_free(r);
            BN_free(s);
            ECDSA_SIG_free(es);
            return false;
        }
        uint8_t *p = der;
        int n = i2d_ECDSA_SIG(es, NULL);
        if (n > 0 && (size_t)n <= sizeof(der))
            n = i2d_ECDSA_SIG(es, &p);
        ECDSA_SIG_free(es);
        if (n <= 0 || (size_t)n > sizeof(der))
            return false;
        check = der;
        checklen = (size_t)n;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, k->pkey) == 1 &&
              EVP_DigestVerify(ctx, check, checklen, signed_part, slen) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
}

/* The key for a token's alg and kid: with one key a token without kid takes it. */
static const jwt_key_t *find_key(const rt_jwt_t *j, alg_t alg, const char *kid, uint32_t kidlen)
{
    for (size_t i = 0; i < j->nkeys; i++) {
        const jwt_key_t *k = &j->keys[i];
        if (k->alg != alg)
            continue;
        if (kid ? strlen(k->kid) == kidlen && memcmp(k->kid, kid, kidlen) == 0 : j->nkeys == 1)
            return k;
    }
    return NULL;
}

static bool claim_str_eq(const bson_t *claims, const char *name, const char *want)
{
    bson_iter_t it;
    uint32_t n;
    const char *v;
    return want && bson_iter_init_find(&it, claims, name) && BSON_ITER_HOLDS_UTF8(&it) &&
           (v = bson_iter_utf8(&it, &n)) && strlen(want) == n && memcmp(v, want, n) == 0;
}

/* aud: one string or a list of them, one of which is want. */
static bool audience_ok(const bson_t *claims, const char *want)
{
    bson_iter_t it, list;
    if (!bson_iter_init_find(&it, claims, "aud"))
        return false;
    if (BSON_ITER_HOLDS_UTF8(&it))
        return claim_str_eq(claims, "aud", want);
    if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &list))
        return false;
    while (bson_iter_next(&list)) {
        uint32_t n;
        const char *v = BSON_ITER_HOLDS_UTF8(&list) ? bson_iter_utf8(&list, &n) : NULL;
        if (v && strlen(want) == n && memcmp(v, want, n) == 0)
            return true;
    }
    return false;
}

/* A numeric claim (exp, nbf): true with *v set, or false when absent; *bad if not a number. */
static bool claim_time(const bson_t *claims, const char *name, int64_t *v, bool *bad)
{
    bson_iter_t it;
    if (!bson_iter_init_find(&it, claims, name))
        return false;
    if (!BSON_ITER_HOLDS_NUMBER(&it)) {
        *bad = true;
        return false;
    }
    *v = bson_iter_as_int64(&it);
    return true;
}

/* rt__auth_mount_text (auth_impl.h): also the HTTP authenticator's answers' mountpoint. */
bool rt__auth_mount_text(const void *doc, const char *name, char out[RT_CONF_MOUNT_MAX],
                         const char **why)
{
    bson_iter_t it;
    out[0] = 0;
    if (!bson_iter_init_find(&it, doc, name))
        return true;
    uint32_t n = 0;
    const char *m = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, &n) : NULL;
    if (!m || n >= RT_CONF_MOUNT_MAX || strlen(m) != n) {
        *why = "the mountpoint is no string of up to 127 bytes";
        return false;
    }
    memcpy(out, m, (size_t)n + 1);
    return true;
}

/* rt__auth_acl_text (auth_impl.h): also the HTTP authenticator's answers' acl. */
char *rt__auth_acl_text(const void *doc, const char *name, size_t *len, const char **why)
{
    const bson_t *claims = doc;
    bson_iter_t it, kinds;
    *len = 0;
    if (!bson_iter_init_find(&it, claims, name) || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &kinds)) {
        *why = "the acl is not an object of topic lists";
        return NULL;
    }
    bson_string_t *out = bson_string_new("");
    while (bson_iter_next(&kinds)) {
        const char *kind = bson_iter_key(&kinds);
        const char *access = strcmp(kind, "pub") == 0   ? "write"
                             : strcmp(kind, "sub") == 0 ? "read"
                             : strcmp(kind, "all") == 0 ? "readwrite"
                                                        : NULL;
        bson_iter_t topics;
        if (!access || !BSON_ITER_HOLDS_ARRAY(&kinds) || !bson_iter_recurse(&kinds, &topics)) {
            *why = "the acl's members are pub, sub and all, each a list of topics";
            bson_string_free(out, true);
            return NULL;
        }
        while (bson_iter_next(&topics)) {
            uint32_t n;
            const char *t = BSON_ITER_HOLDS_UTF8(&topics) ? bson_iter_utf8(&topics, &n) : NULL;
            if (!t || !n || memchr(t, '\n', n) || memchr(t, '\r', n) || strlen(t) != n) {
                *why = "an acl topic is no string of one line";
                bson_string_free(out, true);
                return NULL;
            }
            bson_string_append_printf(out, "pattern %s %.*s\n", access, (int)n, t);
        }
    }
    *len = out->len;
    return bson_string_free(out, false);
}

/* The claims, once the signature verified: RT_JWT_ALLOW with grant, or RT_JWT_DENY. */
static rt_jwt_verdict_t check_claims(const rt_jwt_t *j, const bson_t *claims, const char *user,
                                     const char *cid, int64_t now_s, rt_auth_grant_t *grant,
                                     const char **why)
{
    const rt_conf_auth_t *c = &j->conf;
    int64_t exp = 0, nbf = 0;
    bool bad = false, has_exp = claim_time(claims, "exp", &exp, &bad),
         has_nbf = claim_time(claims, "nbf", &nbf, &bad);
    if (bad)
        *why = "exp or nbf is not a number";
    else if (has_exp && now_s >= exp)
        *why = "the token has expired";
    else if (has_nbf && now_s < nbf)
        *why = "the token is not valid yet (nbf)";
    else if (c->audience[0] && !audience_ok(claims, c->audience))
        *why = "the token is for another audience (aud)";
    else if (c->issuer[0] && !claim_str_eq(claims, "iss", c->issuer))
        *why = "the token is from another issuer (iss)";
    else if (c->username_claim[0] && !claim_str_eq(claims, c->username_claim, user))
        *why = "the token names another user";
    else if (c->client_id_claim[0] && !claim_str_eq(claims, c->client_id_claim, cid))
        *why = "the token names another client id";
    else
        *why = NULL;
    if (*why)
        return RT_JWT_DENY;
    bson_iter_t it;
    if (c->acl_claim[0] && bson_iter_init_find(&it, claims, c->acl_claim)) {
        grant->acl = rt__auth_acl_text(claims, c->acl_claim, &grant->acl_len, why);
        if (!grant->acl)
            return RT_JWT_DENY;
    }
    if (c->mountpoint_claim[0] &&
        !rt__auth_mount_text(claims, c->mountpoint_claim, grant->mount, why))
        return RT_JWT_DENY;
    if (has_exp && c->disconnect_after_expire)
        grant->expire_at_s = exp;
    return RT_JWT_ALLOW;
}

/* The part of a header or payload: a JSON object parsed, or NULL. */
static bson_t *json_part(const uint8_t *s, size_t n)
{
    size_t len;
    uint8_t *json = b64url_dup(s, n, &len);
    bson_t *doc = json ? bson_new_from_json(json, (ssize_t)len, NULL) : NULL;
    free(json);
    return doc;
}

rt_jwt_verdict_t rt_jwt_check(const rt_jwt_t *j, const char *user, const char *cid,
                              const uint8_t *token, size_t len, int64_t now_s,
                              rt_auth_grant_t *grant, const char **why)
{
    memset(grant, 0, sizeof(*grant));
    *why = NULL;
    /* header.payload.signature, each base64url: anything else is some other password. */
    const uint8_t *dot1 = len <= RT_JWT_MAX_TOKEN ? memchr(token, '.', len) : NULL;
    const uint8_t *dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t)(dot1 + 1 - token)) : NULL;
    if (!dot2 || memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - token)))
        return RT_JWT_IGNORE;
    for (size_t i = 0; i < len; i++)
        if (token[i] != '.' && !b64url_char(token[i]))
            return RT_JWT_IGNORE;
    bson_t *header = json_part(token, (size_t)(dot1 - token));
    if (!header)
        return RT_JWT_IGNORE;
    rt_jwt_verdict_t v = RT_JWT_DENY;
    uint32_t n = 0, kidlen = 0;
    const char *alg_name = jwk_str(header, "alg", &n), *kid = jwk_str(header, "kid", &kidlen);
    const alg_t want = j->secret ? ALG_HS256 : j->keys[0].alg;
    const jwt_key_t *key = NULL;
    bool alg_ok = false;
    for (alg_t a = ALG_HS256; a <= ALG_ES256 && alg_name; a++)
        if (strlen(alg_names[a]) == n && memcmp(alg_names[a], alg_name, n) == 0)
            alg_ok = j->secret ? a == want : (key = find_key(j, a, kid, kidlen)) != NULL;
    uint8_t *sig = NULL;
    size_t siglen = 0;
    bson_t *claims = NULL;
    if (!alg_ok)
        *why = "the token's alg or kid names no key of this authenticator";
    else if (!(sig = b64url_dup(dot2 + 1, len - (size_t)(dot2 + 1 - token), &siglen)) ||
             !verify_sig(j, key ? key->alg : ALG_HS256, key, token, (size_t)(dot2 - token), sig,
                         siglen))
        *why = "the token's signature does not verify";
    else if (!(claims = json_part(dot1 + 1, (size_t)(dot2 - dot1 - 1))))
        *why = "the token's claims are no JSON object";
    else
        v = check_claims(j, claims, user, cid, now_s, grant, why);
    free(sig);
    if (claims)
        bson_destroy(claims);
    bson_destroy(header);
    return v;
}

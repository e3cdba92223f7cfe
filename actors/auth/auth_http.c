/*
** The HTTP authenticator (auth_http.h): the request, the answer, and the cache of answers.
*/
#include <bson/bson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth_http.h"
#include "auth_impl.h"
#include "http_client.h"
#include "log.h"

#define CACHE_WAYS 8 /* entries a key may land in: the oldest of them gives way */

typedef struct {
    uint8_t key[32];   /* HMAC-SHA256 of the user name, certificate and password under a key
                          of this run's */
    uint64_t added_ms; /* rt_mono_ms; 0: empty */
    int64_t expire_at_s;
    int result; /* RT_AUTH_OK, RT_AUTH_BAD_PASSWORD or RT_AUTH_ANONYMOUS_REFUSED (ignore) */
    char *acl;
    size_t acl_len;
    char *mount; /* malloc'd, or NULL: none (most answers: the cache holds up to cache_max) */
} cached_t;

struct rt_authhttp_s {
    rt_conf_auth_t conf;
    rt_httpc_t *http;
    uint8_t hmac_key[32];
    pthread_mutex_t lock;
    cached_t *cache;
    size_t nsets, entries;
    atomic_uint_fast64_t calls, allowed, denied, ignored, errors, hits, misses, evictions;
};

int rt_authhttp_load(const rt_conf_auth_t *conf, rt_authhttp_t **out, char *err, size_t errlen)
{
    rt_authhttp_t *a = calloc(1, sizeof(*a));
    if (!a)
        return RT_ENOMEM;
    a->conf = *conf;
    a->nsets = ((size_t)conf->cache_max + CACHE_WAYS - 1) / CACHE_WAYS;
    a->cache = calloc(a->nsets * CACHE_WAYS, sizeof(*a->cache));
    pthread_mutex_init(&a->lock, NULL);
    int rc = a->cache ? rt_random(a->hmac_key, sizeof(a->hmac_key)) : RT_ENOMEM;
    if (rc == 0)
        rc = rt_httpc_new(conf->url, conf->ca_file, (uint32_t)conf->timeout_ms,
                          (unsigned)conf->pool_size, &a->http, err, errlen);
    if (rc) {
        rt_authhttp_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void rt_authhttp_free(rt_authhttp_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; a->cache && i < a->nsets * CACHE_WAYS; i++) {
        free(a->cache[i].acl);
        free(a->cache[i].mount);
    }
    free(a->cache);
    rt_httpc_free(a->http);
    pthread_mutex_destroy(&a->lock);
    OPENSSL_cleanse(a->hmac_key, sizeof(a->hmac_key));
    free(a);
}

/*
** The cache's key for q: neither the password nor an unkeyed hash of it is kept. The client
** certificate's fingerprint is part of it, since the service may judge by the certificate: one
** certificate's answer is never another's, nor a plain login's. Each part ends unambiguously
** (the name at its NUL or a lone 0xff, the certificate a marker byte and fixed 32 bytes), so
** the password, last, cannot pass for the end of another part.
*/
static void cache_key(const rt_authhttp_t *a, const rt_auth_request_t *q, uint8_t key[32])
{
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", "SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t n = 0;
    bool ok = ctx && EVP_MAC_init(ctx, a->hmac_key, sizeof(a->hmac_key), params) &&
              EVP_MAC_update(ctx, (const uint8_t *)(q->user ? q->user : ""),
                             q->user ? strlen(q->user) + 1 : 0) &&
              EVP_MAC_update(ctx, (const uint8_t *)"\xff", q->user ? 0 : 1) &&
              EVP_MAC_update(ctx, (const uint8_t *)(q->tls ? "\1" : "\0"), 1) &&
              EVP_MAC_update(ctx, q->tls ? q->tls->sha256 : (const uint8_t *)"", q->tls ? 32 : 0) &&
              EVP_MAC_update(ctx, q->pw ? q->pw : (const uint8_t *)"", q->pw ? q->pwlen : 0) &&
              EVP_MAC_final(ctx, key, &n, 32);
    if (!ok)
        memset(key, 0, 32); /* no MAC: every login misses (a zero key is never stored) */
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
}

static bool key_usable(const uint8_t key[32])
{
    static const uint8_t zero[32];
    return memcmp(key, zero, 32) != 0;
}

/* Under the lock: the entry holding key, or NULL. */
static cached_t *cache_find(rt_authhttp_t *a, const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, 8);
    cached_t *set = &a->cache[(h % a->nsets) * CACHE_WAYS];
    for (int i = 0; i < CACHE_WAYS; i++)
        if (set[i].added_ms && memcmp(set[i].key, key, 32) == 0)
            return &set[i];
    return NULL;
}

/* A cached answer for q: true with *result and grant when one is there (fresh, or any with
   stale_ok). */
static bool cache_get(rt_authhttp_t *a, const uint8_t key[32], bool stale_ok, int *result,
                      rt_auth_grant_t *grant)
{
    if (!a->conf.cache_ttl_s && !stale_ok)
        return false;
    bool hit = false;
    pthread_mutex_lock(&a->lock);
    cached_t *e = cache_find(a, key);
    uint64_t now = rt_mono_ms();
    if (e && (stale_ok || now < e->added_ms + (uint64_t)a->conf.cache_ttl_s * 1000)) {
        *result = e->result;
        hit = true;
        if (grant && e->result == RT_AUTH_OK) {
            grant->expire_at_s = e->expire_at_s;
            snprintf(grant->mount, sizeof(grant->mount), "%s", e->mount ? e->mount : "");
            grant->acl = e->acl ? malloc(e->acl_len + 1) : NULL;
            if (grant->acl) {
                memcpy(grant->acl, e->acl, e->acl_len + 1);
                grant->acl_len = e->acl_len;
            } else if (e->acl) {
                hit = false; /* no memory to copy it: ask again */
            }
        }
    }
    pthread_mutex_unlock(&a->lock);
    return hit;
}

static void cache_put(rt_authhttp_t *a, const uint8_t key[32], int result,
                      const rt_auth_grant_t *grant)
{
    if (!a->conf.cache_ttl_s && a->conf.on_error != RT_AUTHN_ON_ERROR_CACHE)
        return;
    char *acl = NULL;
    if (grant && grant->acl && !(acl = malloc(grant->acl_len + 1)))
        return;
    if (acl)
        memcpy(acl, grant->acl, grant->acl_len + 1);
    char *mount = grant && grant->mount[0] ? strdup(grant->mount) : NULL;
    if (grant && grant->mount[0] && !mount) {
        free(acl);
        return;
    }
    pthread_mutex_lock(&a->lock);
    cached_t *e = cache_find(a, key);
    if (!e) { /* an empty way, or the oldest */
        uint64_t h;
        memcpy(&h, key, 8);
        cached_t *set = &a->cache[(h % a->nsets) * CACHE_WAYS];
        e = &set[0];
        for (int i = 1; i < CACHE_WAYS && e->added_ms; i++)
            if (!set[i].added_ms || set[i].added_ms < e->added_ms)
                e = &set[i];
        if (e->added_ms)
            atomic_fetch_add(&a->evictions, 1);
        else
            a->entries++;
    }
    free(e->acl);
    free(e->mount);
    memcpy(e->key, key, 32);
    e->added_ms = rt_mono_ms() | 1; /* never 0: that is empty */
    e->result = result;
    e->expire_at_s = grant ? grant->expire_at_s : 0;
    e->acl = acl;
    e->acl_len = acl ? grant->acl_len : 0;
    e->mount = mount;
    pthread_mutex_unlock(&a->lock);
}

static void hex32(const uint8_t md[32], char hex[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

static void append_text_or_null(bson_t *b, const char *key, const char *text)
{
    if (text[0] && bson_utf8_validate(text, strlen(text), false))
        BSON_APPEND_UTF8(b, key, text);
    else
        BSON_APPEND_NULL(b, key);
}

/* "tls": the verified client certificate ({"cn", "subject", "fingerprint_sha256"}), or null. */
static void append_tls(bson_t *b, const rt_auth_tls_t *tls)
{
    if (!tls) {
        BSON_APPEND_NULL(b, "tls");
        return;
    }
    char hex[65];
    hex32(tls->sha256, hex);
    bson_t t;
    BSON_APPEND_DOCUMENT_BEGIN(b, "tls", &t);
    append_text_or_null(&t, "cn", tls->cn);
    append_text_or_null(&t, "subject", tls->subject);
    BSON_APPEND_UTF8(&t, "fingerprint_sha256", hex);
    bson_append_document_end(b, &t);
}

/* The request's JSON: {"clientid", "username", "password" (or its hash), "peerhost",
   "listener", "tls"}. A password that is not UTF-8 goes as "password_base64". */
static char *request_json(const rt_authhttp_t *a, const rt_auth_request_t *q, size_t *len)
{
    bson_t b = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&b, "clientid", q->clientid ? q->clientid : "");
    if (q->user && bson_utf8_validate(q->user, strlen(q->user), false))
        BSON_APPEND_UTF8(&b, "username", q->user);
    else
        BSON_APPEND_NULL(&b, "username");
    if (!q->pw) {
        BSON_APPEND_NULL(&b, "password");
    } else if (a->conf.send_password_hash) {
        uint8_t md[32];
        char hex[65];
        EVP_Digest(q->pw, q->pwlen, md, NULL, EVP_sha256(), NULL);
        hex32(md, hex);
        BSON_APPEND_UTF8(&b, "password_sha256", hex);
    } else if (bson_utf8_validate((const char *)q->pw, q->pwlen, false)) {
        bson_append_utf8(&b, "password", -1, (const char *)q->pw, (int)q->pwlen);
    } else {
        char *b64 = malloc(RT_BASE64_LEN(q->pwlen) + 1);
        if (b64) {
            rt_base64_encode(q->pw, q->pwlen, b64);
            BSON_APPEND_UTF8(&b, "password_base64", b64);
            free(b64);
        }
    }
    char peer[64] = "";
    if (q->addr)
        rt_auth_addr_format(q->addr, peer, sizeof(peer));
    BSON_APPEND_UTF8(&b, "peerhost", peer);
    BSON_APPEND_UTF8(&b, "listener", q->listener ? q->listener : "");
    append_tls(&b, q->tls);
    char *json = bson_as_relaxed_extended_json(&b, len);
    bson_destroy(&b);
    return json;
}

/* The answer: RT_AUTH_OK / _BAD_PASSWORD / _ANONYMOUS_REFUSED (ignore), or -1 (malformed). */
static int read_answer(const char *body, size_t len, rt_auth_grant_t *grant, const char **why)
{
    bson_t *doc = bson_new_from_json((const uint8_t *)body, (ssize_t)len, NULL);
    bson_iter_t it;
    uint32_t n = 0;
    const char *result = doc && bson_iter_init_find(&it, doc, "result") && BSON_ITER_HOLDS_UTF8(&it)
                             ? bson_iter_utf8(&it, &n)
                             : NULL;
    int r = !result                         ? -1
            : strcmp(result, "allow") == 0  ? RT_AUTH_OK
            : strcmp(result, "deny") == 0   ? RT_AUTH_BAD_PASSWORD
            : strcmp(result, "ignore") == 0 ? RT_AUTH_ANONYMOUS_REFUSED
                                            : -1;
    *why = r < 0 ? "no result of allow, deny or ignore" : NULL;
    if (r == RT_AUTH_OK && bson_iter_init_find(&it, doc, "acl")) {
        grant->acl = rt__auth_acl_text(doc, "acl", &grant->acl_len, why);
        if (!grant->acl)
            r = -1;
    }
    if (r == RT_AUTH_OK && !rt__auth_mount_text(doc, "mountpoint", grant->mount, why))
        r = -1;
    if (r == RT_AUTH_OK && bson_iter_init_find(&it, doc, "expire_at")) {
        if (BSON_ITER_HOLDS_NUMBER(&it))
            grant->expire_at_s = bson_iter_as_int64(&it);
        else
            r = -1, *why = "expire_at is not a number";
    }
    if (doc)
        bson_destroy(doc);
    return r;
}

/* One call: the answer, or -1 when the service gave none we can use (logged). */
static int call(rt_authhttp_t *a, const rt_auth_request_t *q, rt_auth_grant_t *grant)
{
    atomic_fetch_add(&a->calls, 1);
    size_t len;
    char *json = request_json(a, q, &len);
    char err[256] = "out of memory", *resp = NULL;
    size_t resplen = 0;
    int status = 0;
    int rc = json ? rt_httpc_post(a->http, json, len, &status, &resp, &resplen, err, sizeof(err))
                  : RT_ENOMEM;
    if (json)
        bson_free(json);
    int r = -1;
    const char *why = err;
    if (rc == 0 && status / 100 == 2)
        r = read_answer(resp, resplen, grant, &why);
    else if (rc == 0)
        snprintf(err, sizeof(err), "HTTP status %d", status), why = err;
    free(resp);
    if (r < 0) {
        rt_auth_grant_free(grant);
        atomic_fetch_add(&a->errors, 1);
        rt_log(RT_LOG_WARNING, "auth.http_failed", "url=%s client=%s %s", a->conf.url,
               q->clientid ? q->clientid : "-", why);
    }
    return r;
}

int rt_authhttp_says(rt_authhttp_t *a, const rt_auth_request_t *q, bool may_call,
                     rt_auth_grant_t *grant)
{
    uint8_t key[32];
    cache_key(a, q, key);
    int result;
    rt_auth_grant_t g = {0};
    if (key_usable(key) && cache_get(a, key, false, &result, grant ? &g : NULL)) {
        atomic_fetch_add(&a->hits, 1);
    } else if (!may_call) {
        return RT_AUTH_PENDING;
    } else {
        atomic_fetch_add(&a->misses, 1);
        result = call(a, q, &g);
        if (result >= 0 && key_usable(key))
            cache_put(a, key, result, &g);
        if (result < 0) {
            int on_error = a->conf.on_error;
            if (on_error == RT_AUTHN_ON_ERROR_IGNORE)
                return RT_AUTH_ANONYMOUS_REFUSED;
            if (on_error == RT_AUTHN_ON_ERROR_CACHE && key_usable(key) &&
                cache_get(a, key, true, &result, grant ? &g : NULL))
                atomic_fetch_add(&a->hits, 1);
            else
                return RT_AUTH_UNAVAILABLE;
        }
    }
    atomic_fetch_add(result == RT_AUTH_OK             ? &a->allowed
                     : result == RT_AUTH_BAD_PASSWORD ? &a->denied
                                                      : &a->ignored,
                     1);
    if (grant && result == RT_AUTH_OK)
        *grant = g;
    else
        rt_auth_grant_free(&g);
    return result;
}

void rt_authhttp_stats(const rt_authhttp_t *a, rt_authhttp_stats_t *out)
{
    rt_authhttp_t *m = (rt_authhttp_t *)a;
    out->calls = atomic_load(&m->calls);
    out->allowed = atomic_load(&m->allowed);
    out->denied = atomic_load(&m->denied);
    out->ignored = atomic_load(&m->ignored);
    out->errors = atomic_load(&m->errors);
    out->cache_hits = atomic_load(&m->hits);
    out->cache_misses = atomic_load(&m->misses);
    out->cache_evictions = atomic_load(&m->evictions);
    pthread_mutex_lock(&m->lock);
    out->cache_entries = m->entries;
    pthread_mutex_unlock(&m->lock);
    out->connects = rt_httpc_connects(a->http);
}

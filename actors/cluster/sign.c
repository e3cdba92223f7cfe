/*
** The nodes' control traffic signed with the cluster's secret (docs/CLUSTER.md "Security"):
** takeovers, the second request of a session's move, administrators' questions, and every
** answer to them carry Rt-Auth, "<sent, wall ms> <nonce, 16 hex> <HMAC-SHA256, 64 hex>" over
** the subject, the reply subject, the headers that steer the answer (Rt-Want, Rt-Part), the
** time, the nonce and the body. A request is taken once (its nonce) and only within
** AUTH_WINDOW_MS of when it was sent; an answer is bound to its request's inbox, which is new
** for every request. What does not verify is refused, counted (auth_refused) and logged.
** Routed messages are not signed: NATS permissions guard them (docs/CLUSTER.md says why).
**
** With cluster.secret_file = false nothing is signed and nothing checked; Rt-Auth still
** carries the time, by which a holder drops takeovers that arrive after their sender stopped
** waiting (claims.c).
*/
#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_impl.h"

#define SECRET_MIN 16   /* bytes of secret, at least: 128 bits */
#define SECRET_MAX 4096 /* bytes of the file read, at most */
#define MAC_LEN 32

static uint8_t secret[SECRET_MAX];
static size_t secret_len;  /* 0: control traffic unsigned (secret_file = false) */
static EVP_MAC *hmac_algo; /* fetched once; a context per signature */

/* Requests' nonces seen within the window (only cluster_in checks requests). */
#define NONCES 16384
static struct {
    uint64_t nonce, sent_ms;
} nonces[NONCES];

static _Atomic uint64_t refused;
static _Atomic uint64_t refused_logged_ms;

int rt__cluster_secret_load(const rt_conf_t *conf, char *err, size_t errlen)
{
    secret_len = 0;
    memset(nonces, 0, sizeof(nonces));
    if (conf->cluster.unsigned_control) {
        rt_log(RT_LOG_WARNING, "cluster.unsigned",
               "cluster.secret_file = false: anyone who can publish on the NATS account can end "
               "this node's clients, take their sessions and ask its administrator's questions");
        return 0;
    }
    const char *path = conf->cluster.secret_file;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cluster.secret_file %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return RT_EINVAL;
    }
    const char *why = !S_ISREG(st.st_mode)      ? "is not a regular file"
                      : (st.st_mode & 077)      ? "can be read by others than its owner (chmod 600)"
                      : st.st_uid != geteuid()  ? "belongs to another user than rtd's"
                      : st.st_size > SECRET_MAX ? "is larger than 4096 bytes"
                                                : NULL;
    ssize_t n = why ? 0 : read(fd, secret, sizeof(secret));
    close(fd);
    while (n > 0 && (secret[n - 1] == '\n' || secret[n - 1] == '\r' || secret[n - 1] == ' '))
        n--;
    if (!why && n < SECRET_MIN)
        why = "holds fewer than 16 bytes (head -c 32 /dev/urandom | base64 makes one)";
    if (why) {
        snprintf(err, errlen, "cluster.secret_file %s %s", path, why);
        OPENSSL_cleanse(secret, sizeof(secret));
        return RT_EINVAL;
    }
    hmac_algo = hmac_algo ? hmac_algo : EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!hmac_algo) {
        snprintf(err, errlen, "cluster: OpenSSL has no HMAC");
        return RT_EINVAL;
    }
    secret_len = (size_t)n;
    return 0;
}

static void put_hex(char *out, const uint8_t *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[p[i] >> 4];
        out[2 * i + 1] = hex[p[i] & 15];
    }
    out[2 * n] = 0;
}

static void mac_add(EVP_MAC_CTX *ctx, const char *s)
{
    EVP_MAC_update(ctx, (const unsigned char *)(s ? s : ""), s ? strlen(s) : 0);
    EVP_MAC_update(ctx, (const unsigned char *)"\n", 1);
}

/* The HMAC of m as sent at sent with nonce (hex); false if OpenSSL failed. */
static bool mac_of(natsMsg *m, const char *stamp, uint8_t out[MAC_LEN])
{
    static const char *const steering[] = {"Rt-Want", "Rt-Part"};
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
                           OSSL_PARAM_construct_end()};
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(hmac_algo);
    size_t len = 0;
    bool ok = ctx && EVP_MAC_init(ctx, secret, secret_len, params);
    if (ok) {
        mac_add(ctx, "rt-auth-1");
        mac_add(ctx, natsMsg_GetSubject(m));
        mac_add(ctx, natsMsg_GetReply(m));
        for (size_t i = 0; i < sizeof(steering) / sizeof(steering[0]); i++) {
            const char *v = NULL;
            mac_add(ctx, steering[i]);
            mac_add(ctx, natsMsgHeader_Get(m, steering[i], &v) == NATS_OK ? v : NULL);
        }
        mac_add(ctx, stamp);
        EVP_MAC_update(ctx, (const unsigned char *)natsMsg_GetData(m),
                       (size_t)natsMsg_GetDataLength(m));
        ok = EVP_MAC_final(ctx, out, &len, MAC_LEN) && len == MAC_LEN;
    }
    EVP_MAC_CTX_free(ctx);
    return ok;
}

natsStatus rt__cluster_sign(natsMsg *m)
{
    uint64_t nonce = 0;
    if (RAND_bytes((unsigned char *)&nonce, sizeof(nonce)) != 1)
        return NATS_ERR;
    char stamp[48], value[48 + 2 * MAC_LEN + 2];
    snprintf(stamp, sizeof(stamp), "%" PRIu64 " %016" PRIx64, rt_wall_ms(), nonce);
    uint8_t mac[MAC_LEN];
    if (!secret_len) {
        snprintf(value, sizeof(value), "%s -", stamp);
    } else {
        if (!mac_of(m, stamp, mac))
            return NATS_ERR;
        char hex[2 * MAC_LEN + 1];
        put_hex(hex, mac, MAC_LEN);
        snprintf(value, sizeof(value), "%s %s", stamp, hex);
    }
    return natsMsgHeader_Set(m, H_AUTH, value);
}

static void refuse(natsMsg *m, const char *what, const char *why)
{
    atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
    /* Said at most once a second: a flood of forgeries must not flood the log. */
    uint64_t now = rt_mono_ms(), last = atomic_load(&refused_logged_ms);
    if (now - last >= 1000 && atomic_compare_exchange_strong(&refused_logged_ms, &last, now))
        rt_log(RT_LOG_WARNING, "cluster.auth_refused",
               "what=%s subject=%.200s reason=%s refused=%" PRIu64
               " (a NATS client without the cluster's secret, another cluster's node, or "
               "clocks more than %d s apart)",
               what, natsMsg_GetSubject(m), why, atomic_load(&refused), AUTH_WINDOW_MS / 1000);
}

/* A request's nonce, once within the window: false if seen, or no room to remember it. */
static bool nonce_fresh(uint64_t nonce, uint64_t sent_ms, uint64_t now_ms)
{
    size_t at = (size_t)(nonce * 0x9E3779B97F4A7C15ull >> 50) % NONCES;
    for (size_t probe = 0; probe < 64; probe++, at = (at + 1) % NONCES) {
        bool live = nonces[at].sent_ms && nonces[at].sent_ms + 2 * AUTH_WINDOW_MS > now_ms;
        if (live && nonces[at].nonce == nonce)
            return false;
        if (!live) {
            nonces[at].nonce = nonce;
            nonces[at].sent_ms = sent_ms ? sent_ms : 1;
            return true;
        }
    }
    return false;
}

bool rt__cluster_verified(natsMsg *m, const char *what, bool request, int64_t *age_ms)
{
    const char *h = NULL;
    char nonce_hex[17] = "", mac_hex[2 * MAC_LEN + 2] = "";
    uint64_t sent = 0;
    *age_ms = 0;
    if (natsMsgHeader_Get(m, H_AUTH, &h) != NATS_OK ||
        sscanf(h, "%" SCNu64 " %16s %65s", &sent, nonce_hex, mac_hex) != 3 ||
        strlen(nonce_hex) != 16) {
        if (!secret_len)
            return true; /* unsigned control traffic: an older node's, or none to check */
        refuse(m, what, "no Rt-Auth");
        return false;
    }
    uint64_t now = rt_wall_ms();
    *age_ms = (int64_t)(now - sent);
    if (!secret_len)
        return true;
    if (sent + AUTH_WINDOW_MS < now || sent > now + AUTH_WINDOW_MS) {
        refuse(m, what, "sent outside the window");
        return false;
    }
    char stamp[48];
    snprintf(stamp, sizeof(stamp), "%" PRIu64 " %s", sent, nonce_hex);
    uint8_t mac[MAC_LEN];
    char hex[2 * MAC_LEN + 1];
    if (!mac_of(m, stamp, mac)) {
        refuse(m, what, "OpenSSL failed");
        return false;
    }
    put_hex(hex, mac, MAC_LEN);
    if (strlen(mac_hex) != 2 * MAC_LEN || CRYPTO_memcmp(hex, mac_hex, 2 * MAC_LEN) != 0) {
        refuse(m, what, "bad signature");
        return false;
    }
    if (request && !nonce_fresh(strtoull(nonce_hex, NULL, 16), sent, now)) {
        refuse(m, what, "replayed");
        return false;
    }
    return true;
}

uint64_t rt__cluster_auth_refused(void)
{
    return atomic_load_explicit(&refused, memory_order_relaxed);
}

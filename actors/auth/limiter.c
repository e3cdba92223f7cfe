/*
** Source addresses and the failed-login slow-down: a bounded, set-associative table of
** recent failures per address whose delay doubles per failure and halves with time.
*/
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "auth_impl.h"

/* ---- Addresses ---- */

int rt_auth_addr_from_sockaddr(const struct sockaddr_storage *ss, rt_auth_addr_t *out)
{
    memset(out, 0, sizeof(*out));
    if (ss->ss_family == AF_INET) {
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        memcpy(out->b, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
        return 0;
    }
    return RT_EINVAL;
}

/* The port of an IPv4 or IPv6 socket address (rt_auth_addr_from_sockaddr took it). */
static uint16_t sockaddr_port(const struct sockaddr_storage *ss)
{
    return ntohs(ss->ss_family == AF_INET ? ((const struct sockaddr_in *)ss)->sin_port
                                          : ((const struct sockaddr_in6 *)ss)->sin6_port);
}

int rt_auth_addr_from_fd(int fd, rt_auth_addr_t *out, uint16_t *port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0 ||
        rt_auth_addr_from_sockaddr(&ss, out) != 0)
        return RT_EINVAL;
    if (port)
        *port = sockaddr_port(&ss);
    return 0;
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

void rt_auth_addr_format(const rt_auth_addr_t *a, char *out, size_t len)
{
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    bool v4 = memcmp(a->b, v4_mapped, sizeof(v4_mapped)) == 0;
    if (!inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? a->b + 12 : a->b, out, (socklen_t)len))
        snprintf(out, len, "?");
}

void rt_auth_sockaddr_format(const struct sockaddr_storage *ss, char *out, size_t len)
{
    rt_auth_addr_t a;
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (rt_auth_addr_from_sockaddr(ss, &a) == 0) {
        rt_auth_addr_format(&a, host, sizeof(host));
        port = sockaddr_port(ss);
    }
    snprintf(out, len, "%s:%u", host, port);
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
    uint32_t burst;                /* a rate limiter's (rt_auth_rate_new); 0: failures */
    double drain_per_ms;           /* a rate limiter's count drains this much a ms */
    atomic_size_t entries;
    atomic_uint_fast64_t evictions;
    fail_set_t sets[SETS];
};

int rt_auth_limiter_new(uint32_t max_delay_ms, rt_auth_limiter_t **out)
{
    rt_auth_limiter_t *l = calloc(1, sizeof(*l));
    if (!l)
        return RT_ENOMEM;
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

/* The keyed hash chooses the set, so a client cannot aim its addresses at one. */
static fail_set_t *limiter_set(rt_auth_limiter_t *l, const uint8_t key[16])
{
    return &l->sets[rt_hash(key, 16) % SETS];
}

/* A failure count halves with time; a rate limiter's count drains linearly (a bucket). */
static float decayed(const rt_auth_limiter_t *l, const fail_t *f, uint64_t now_ms)
{
    if (f->count == 0 || now_ms <= f->stamp_ms)
        return f->count;
    if (l->burst) {
        double left = f->count - (double)(now_ms - f->stamp_ms) * l->drain_per_ms;
        return left > 0 ? (float)left : 0.0f;
    }
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

/* The locked set s's entry for key, taken for it if it had none: a free entry, else the one
   with the lowest count. */
static fail_t *take_entry(rt_auth_limiter_t *l, fail_set_t *s, const uint8_t key[16],
                          uint64_t now_ms)
{
    fail_t *f = &s->e[0];
    for (int i = 0; i < WAYS && f->count != 0; i++)
        if (s->e[i].count == 0 || decayed(l, &s->e[i], now_ms) < decayed(l, f, now_ms))
            f = &s->e[i];
    if (f->count != 0)
        atomic_fetch_add(&l->evictions, 1);
    else
        atomic_fetch_add(&l->entries, 1);
    memcpy(f->key, key, 16);
    f->count = 0;
    f->stamp_ms = now_ms;
    return f;
}

/* One more on f's count, as of now. */
static void count_one(const rt_auth_limiter_t *l, fail_t *f, uint64_t now_ms)
{
    f->count = decayed(l, f, now_ms) + 1;
    f->stamp_ms = now_ms > f->stamp_ms ? now_ms : f->stamp_ms;
}

uint32_t rt_auth_limiter_fail(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms)
{
    uint8_t key[16];
    fail_t *f;
    fail_set_t *s = lock_set(l, a, key, &f);
    if (!f)
        f = take_entry(l, s, key, now_ms);
    count_one(l, f, now_ms);
    uint32_t d = delay_for(f->count, atomic_load(&l->max_delay_ms));
    pthread_mutex_unlock(&s->lock);
    return d;
}

int rt_auth_rate_new(uint32_t burst, uint64_t period_ms, rt_auth_limiter_t **out)
{
    RT_ASSERT(burst > 0 && period_ms > 0);
    int rc = rt_auth_limiter_new(0, out);
    if (rc)
        return rc;
    (*out)->burst = burst;
    (*out)->drain_per_ms = (double)burst / (double)period_ms;
    return 0;
}

bool rt_auth_rate_take(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms)
{
    RT_ASSERT(l->burst > 0);
    uint8_t key[16];
    fail_t *f;
    fail_set_t *s = lock_set(l, a, key, &f);
    bool ok = !f || decayed(l, f, now_ms) + 1 <= (float)l->burst + 0.001f;
    if (ok) {
        if (!f)
            f = take_entry(l, s, key, now_ms);
        count_one(l, f, now_ms);
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
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
    uint32_t d = f ? delay_for(decayed(l, f, now_ms), atomic_load(&l->max_delay_ms)) : 0;
    pthread_mutex_unlock(&s->lock);
    return d;
}

void rt_auth_limiter_usage(rt_auth_limiter_t *l, size_t *entries, uint64_t *evictions)
{
    *entries = atomic_load(&l->entries);
    *evictions = atomic_load(&l->evictions);
}

size_t rt__auth_limiter_bytes(const rt_auth_limiter_t *l)
{
    return sizeof(*l);
}

void rt__auth_limiter_set_max_delay(rt_auth_limiter_t *l, uint32_t max_delay_ms)
{
    atomic_store(&l->max_delay_ms, max_delay_ms);
}

/*
** The one hash for tables: SipHash-1-3 (Aumasson and Bernstein; the variant
** Rust's HashMap and Redis's dict use), keyed once per process from getrandom.
** Client ids, topic levels and peer addresses are chosen by clients: with an
** unkeyed hash (FNV-1a) a client could pick keys that share a bucket even after
** the table grows to a million buckets, and then every lookup walks that chain
** (hash flooding). Without the key, collisions cannot be planned. Values differ
** from one run to the next: nothing may store them.
*/
#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static uint64_t key0, key1;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void key_init(void)
{
    uint64_t k[2];
    if (getrandom(k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
        /* No entropy source at all (a very old kernel): still not a constant. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        k[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
        k[1] = (uint64_t)ts.tv_sec * 0xc2b2ae3d27d4eb4full ^ (uint64_t)(uintptr_t)&k;
    }
    key0 = k[0];
    key1 = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

/* SipHash-c-d of data under the key (k0, k1). */
static uint64_t siphash(unsigned c, unsigned d, uint64_t k0, uint64_t k1, const void *data,
                        size_t len)
{
    const uint8_t *in = data;
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    const uint8_t *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        uint64_t m = le64(in);
        v3 ^= m;
        for (unsigned r = 0; r < c; r++)
            SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    for (unsigned r = 0; r < c; r++)
        SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    for (unsigned r = 0; r < d; r++)
        SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t rt_hash_with(uint64_t tweak, const void *data, size_t len)
{
    pthread_once(&key_once, key_init);
    return siphash(1, 3, key0 ^ tweak, key1, data, len);
}

uint64_t rt_hash(const void *data, size_t len)
{
    return rt_hash_with(0, data, len);
}

uint64_t rt__siphash24(uint64_t k0, uint64_t k1, const void *data, size_t len)
{
    return siphash(2, 4, k0, k1, data, len);
}

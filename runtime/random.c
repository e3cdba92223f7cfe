/*
** Unpredictable bytes (rt.h): getrandom, read a block at a time into a per-thread buffer, so
** that the few dozen bytes a login asks for (two stream ids, a SCRAM nonce) cost no system
** call each. OpenSSL's RAND_bytes checks for a fork with getpid and runs its DRBG under a
** lock at every call, which was a tenth of an XMPP login's work. Each byte is handed out
** once and wiped from the buffer as it goes; a forked child starts with an empty buffer.
*/
#include <pthread.h>
#include <string.h>
#include <sys/random.h>

#include "internal.h"

#define RANDOM_BLOCK 256 /* getrandom fills up to 256 bytes without being interrupted */

static _Thread_local struct {
    uint8_t b[RANDOM_BLOCK];
    size_t left; /* the unused bytes are the last left of b */
} rnd;

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void forked(void)
{
    memset(rnd.b, 0, sizeof(rnd.b));
    rnd.left = 0;
}

static void fork_hook(void)
{
    pthread_atfork(NULL, NULL, forked);
}

int rt_random(void *out, size_t n)
{
    pthread_once(&fork_once, fork_hook);
    uint8_t *o = out;
    while (n) {
        if (!rnd.left) {
            if (getrandom(rnd.b, sizeof(rnd.b), 0) != (ssize_t)sizeof(rnd.b))
                return RT_EAGAIN;
            rnd.left = sizeof(rnd.b);
        }
        size_t k = n < rnd.left ? n : rnd.left;
        uint8_t *from = rnd.b + sizeof(rnd.b) - rnd.left;
        memcpy(o, from, k);
        memset(from, 0, k);
        rnd.left -= k;
        o += k;
        n -= k;
    }
    return 0;
}

int rt_random_hex(char *out, size_t bytes)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t r[32];
    if (bytes > sizeof(r) || rt_random(r, bytes) != 0)
        return RT_EAGAIN;
    for (size_t i = 0; i < bytes; i++) {
        out[2 * i] = hex[r[i] >> 4];
        out[2 * i + 1] = hex[r[i] & 15];
    }
    out[2 * bytes] = 0;
    memset(r, 0, sizeof(r));
    return 0;
}

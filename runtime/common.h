/*
** Shared definitions for every rt module: error codes, branch hints,
** assertions and container_of. Library code never prints; it returns one of
** the codes below and lets the caller decide (libuv's convention).
*/
#ifndef RT_COMMON_H
#define RT_COMMON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Error codes: functions return 0 on success or one of these (all negative). */
#define RT_EOK 0
#define RT_ENOMEM (-12)     /* allocation failed */
#define RT_EINVAL (-22)     /* bad argument */
#define RT_ENOPROC (-3)     /* no such actor (dead or never existed) */
#define RT_EEXIST (-17)     /* name already registered */
#define RT_EAGAIN (-11)     /* would block; try again later */
#define RT_ELIMIT (-24)     /* a configured limit was reached */
#define RT_ESHUTDOWN (-108) /* the runtime is shutting down */
#define RT_ECLOSED (-32)    /* the socket is closed */
#define RT_ENOTFOUND (-2)   /* no such name, timer or object */
#define RT_EPROTO (-71)     /* a peer broke its protocol (a bad header or frame) */
#define RT_EBUSY (-16)      /* cannot be done while running (a setting that needs a restart) */
#define RT_EACCES (-13)     /* a file others could change is refused (rt_file_trusted) */

const char *rt_strerror(int code);

#define RT_LIKELY(x) __builtin_expect(!!(x), 1)
#define RT_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* Keeps a slow path out of its caller, so the fast path saves fewer registers. */
#define RT_NOINLINE __attribute__((noinline))

/*
** A count that every thread changes (bytes of envelopes in use, live binaries): one cache
** line per stripe, each thread adds to its own, readers add the stripes up. One shared
** atomic changed by every alloc and free moves its line between the cores each time: in
** the pairs benchmark that was a quarter of rt__pool_alloc's samples. Stripes are handed
** to threads in turn; threads past RT_STRIPES share them, still atomically.
*/
#define RT_STRIPES 8
typedef struct {
    struct {
        _Alignas(64) _Atomic int64_t v;
    } s[RT_STRIPES];
} rt_striped_t;

/*
** The calling thread's number, handed out 0, 1, 2... on each thread's first call: for
** spreading threads over stripes, shards and lock slots in turn (taken modulo their count).
*/
unsigned rt_thread_ordinal(void);

static inline void rt_striped_add(rt_striped_t *c, int64_t delta)
{
    atomic_fetch_add_explicit(&c->s[rt_thread_ordinal() % RT_STRIPES].v, delta,
                              memory_order_relaxed);
}

/* The sum; at most as stale as each stripe's last change. */
int64_t rt_striped_sum(const rt_striped_t *c);

/*
** Raises a high-water mark shared by threads to at least v. Cheap where counts
** rise: one relaxed load while v is under the mark, a CAS only for a new peak.
*/
static inline void rt_atomic_raise(_Atomic uint64_t *max, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(max, memory_order_relaxed);
    while (cur < v &&
           !atomic_compare_exchange_weak_explicit(max, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/*
** The length of the well-formed UTF-8 sequence at s (n > 0 bytes left), 0 if there is none:
** no overlong form, no UTF-16 surrogate, nothing past U+10FFFF. One definition for the MQTT
** codec's validator, the log's quoting and the log's fuzz target.
*/
static inline size_t rt_utf8_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!len || len > n || s[0] > 0xf4)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* Whether the n bytes at s are well-formed UTF-8 text: rt_utf8_len's rules, no U+0000. */
static inline bool rt_utf8_text(const void *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0, k; i < n; i += k)
        if (p[i] == 0 || (k = rt_utf8_len(p + i, n - i)) == 0)
            return false;
    return true;
}

#define RT_CONTAINER_OF(ptr, type, field) ((type *)((char *)(ptr)-offsetof(type, field)))

#define RT_CACHE_LINE 64

/*
** RT_ASSERT checks an invariant in debug and sanitizer builds; release builds
** compile it away. Use it for programming errors only, never for bad input.
*/
#ifdef NDEBUG
#define RT_ASSERT(x) ((void)0)
#else
#include <assert.h>
#define RT_ASSERT(x) assert(x)
#endif

/* Freed memory is poisoned in debug builds so use-after-free shows up fast. */
#ifdef NDEBUG
#define RT_POISON(p, n) ((void)0)
#else
#include <string.h>
#define RT_POISON(p, n) memset((p), 0xaa, (n))
#endif

#endif

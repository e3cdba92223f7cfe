/*
** Small shared services: error names, exit reason names, the spinlock, the clocks
** (rt.h), per-thread exit hooks, the cycle clock used for per-turn CPU accounting and
** base64.
*/
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define RT_HAVE_TSC 1
#endif

const char *rt_strerror(int code)
{
    switch (code) {
    case RT_EOK:
        return "ok";
    case RT_ENOMEM:
        return "out of memory";
    case RT_EINVAL:
        return "invalid argument";
    case RT_ENOPROC:
        return "no such actor";
    case RT_EEXIST:
        return "name already registered";
    case RT_EAGAIN:
        return "try again";
    case RT_ELIMIT:
        return "limit reached";
    case RT_ESHUTDOWN:
        return "runtime shutting down";
    case RT_ECLOSED:
        return "socket closed";
    case RT_ENOTFOUND:
        return "not found";
    case RT_EBUSY:
        return "needs a restart";
    case RT_EACCES:
        return "permission denied";
    default:
        return "unknown error";
    }
}

/* The built-in reasons' names, indexed by reason. */
static const char *const reason_names[] = {
    [RT_REASON_NORMAL] = "normal",         [RT_REASON_KILL] = "kill",
    [RT_REASON_KILLED] = "killed",         [RT_REASON_SHUTDOWN] = "shutdown",
    [RT_REASON_HEAP_LIMIT] = "heap_limit", [RT_REASON_NOPROC] = "noproc",
    [RT_REASON_INIT] = "init_failed",      [RT_REASON_ERROR] = "error",
};
#define NREASON_NAMES (sizeof(reason_names) / sizeof(reason_names[0]))

/*
** Words made into reasons (rt_reason_parse): word i is the reason RT_REASON_WORDS + i.
** Entries are written once, under the lock, before nwords publishes them, so a reader
** needs only nwords. The range sits far above what programs number from RT_REASON_USER.
*/
#define RT_REASON_WORDS (1 << 24)
static char words[RT_REASON_WORDS_MAX][RT_REASON_WORD_MAX];
static atomic_int nwords;
static rt_spinlock_t words_lock;

const char *rt_reason_name(rt_reason_t reason)
{
    if (reason >= 0 && (size_t)reason < NREASON_NAMES)
        return reason_names[reason];
    int i = reason - RT_REASON_WORDS;
    if (i >= 0 && i < atomic_load_explicit(&nwords, memory_order_acquire))
        return words[i];
    return reason >= RT_REASON_USER ? "user" : "unknown";
}

static bool word_ok(const char *w, size_t n)
{
    if (n == 0 || n >= RT_REASON_WORD_MAX ||
        !((w[0] >= 'a' && w[0] <= 'z') || (w[0] >= 'A' && w[0] <= 'Z')))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((w[i] >= 'a' && w[i] <= 'z') || (w[i] >= 'A' && w[i] <= 'Z') ||
              (w[i] >= '0' && w[i] <= '9') || w[i] == '_'))
            return false;
    return true;
}

int rt_reason_parse(const char *word, rt_reason_t *out)
{
    size_t n = word ? strnlen(word, RT_REASON_WORD_MAX) : 0;
    if (!word_ok(word, n))
        return RT_EINVAL;
    for (size_t r = 0; r < NREASON_NAMES; r++) {
        if (strcmp(reason_names[r], word) == 0) {
            *out = (rt_reason_t)r;
            return 0;
        }
    }
    rt__spin_lock(&words_lock);
    int k = atomic_load_explicit(&nwords, memory_order_relaxed), i = 0;
    while (i < k && strcmp(words[i], word) != 0)
        i++;
    int rc = 0;
    if (i == k && k == RT_REASON_WORDS_MAX) {
        rc = RT_ELIMIT;
    } else if (i == k) {
        memcpy(words[k], word, n + 1);
        atomic_store_explicit(&nwords, k + 1, memory_order_release);
    }
    rt__spin_unlock(&words_lock);
    if (rc == 0)
        *out = RT_REASON_WORDS + i;
    return rc;
}

void rt_pid_text(rt_pid_t pid, char *out, size_t n)
{
    snprintf(out, n, "<%u.%u>", (unsigned)(uint32_t)pid, (unsigned)(pid >> 32));
}

const char *rt_status_name(rt_actor_status_t s)
{
    switch (s) {
    case RT_STATUS_WAITING:
        return "waiting";
    case RT_STATUS_RUNNABLE:
        return "runnable";
    case RT_STATUS_RUNNING:
        return "running";
    case RT_STATUS_MUTED:
        return "muted";
    case RT_STATUS_EXITING:
        return "exiting";
    }
    return "unknown";
}

/*
** Spins briefly, then yields: on a 2-core machine shared with load generators
** the holder may be preempted, and spinning against it only burns its core.
*/
void rt__spin_lock(rt_spinlock_t *l)
{
    for (unsigned i = 0;; i++) {
        if (!atomic_load_explicit(&l->locked, memory_order_relaxed) &&
            !atomic_exchange_explicit(&l->locked, 1, memory_order_acquire))
            return;
        if (i < 64) {
#if RT_HAVE_TSC
            _mm_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

uint64_t rt_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t rt_mono_ms(void)
{
    return rt_mono_ns() / 1000000u;
}

uint64_t rt_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#if RT_HAVE_TSC
static double ns_per_tick;

static void calibrate(void)
{
    uint64_t n0 = rt_mono_ns(), t0 = __rdtsc();
    struct timespec d = {0, 2000000};
    nanosleep(&d, NULL);
    uint64_t n1 = rt_mono_ns(), t1 = __rdtsc();
    ns_per_tick = t1 > t0 ? (double)(n1 - n0) / (double)(t1 - t0) : 1.0;
}

uint64_t rt__ticks(void)
{
    return __rdtsc();
}

static pthread_once_t calibrated = PTHREAD_ONCE_INIT;

uint64_t rt__ticks_to_ns(uint64_t ticks)
{
    pthread_once(&calibrated, calibrate);
    return (uint64_t)((double)ticks * ns_per_tick);
}

uint64_t rt__ns_to_ticks(uint64_t ns)
{
    pthread_once(&calibrated, calibrate);
    return (uint64_t)((double)ns / ns_per_tick);
}
#else
uint64_t rt__ticks(void)
{
    return rt_mono_ns();
}

uint64_t rt__ticks_to_ns(uint64_t ticks)
{
    return ticks;
}

uint64_t rt__ns_to_ticks(uint64_t ns)
{
    return ns;
}
#endif

/* One key for every rt_thread_at_exit: its value is the thread's list of hooks. */
typedef struct exit_hook_s {
    struct exit_hook_s *next;
    void (*fini)(void *obj);
    void *obj;
} exit_hook_t;

static pthread_key_t exit_hooks_key;
static pthread_once_t exit_hooks_once = PTHREAD_ONCE_INIT;

static void run_exit_hooks(void *list)
{
    for (exit_hook_t *h = list, *next; h; h = next) {
        next = h->next;
        h->fini(h->obj);
        free(h);
    }
}

static void exit_hooks_key_create(void)
{
    pthread_key_create(&exit_hooks_key, run_exit_hooks);
}

int rt_thread_at_exit(void (*fini)(void *obj), void *obj)
{
    pthread_once(&exit_hooks_once, exit_hooks_key_create);
    exit_hook_t *h = malloc(sizeof(*h));
    if (!h)
        return RT_ENOMEM;
    *h = (exit_hook_t){.next = pthread_getspecific(exit_hooks_key), .fini = fini, .obj = obj};
    pthread_setspecific(exit_hooks_key, h);
    return 0;
}

/*
** Reserved tables and mapped regions cost RSS only for the pages that were touched and
** not given back, which is what the kernel's page tables say; the vector is asked for
** a bounded run of pages at a time, so a reservation of gigabytes needs no allocation.
*/
/* Who other than rtd's user and root could change a file or directory with this stat. */
static const char *untrusted_writer(const struct stat *st)
{
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return "its owner";
    if (S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX))
        return NULL; /* like /tmp: others may add files, not replace ours */
    if (st->st_mode & S_IWOTH)
        return "every user";
    if (st->st_mode & S_IWGRP)
        return "its group";
    return NULL;
}

int rt_file_trusted(int fd, const char *path, const char *what, char *err, size_t errlen)
{
    struct stat st;
    if ((fd >= 0 ? fstat(fd, &st) : stat(path, &st)) != 0)
        return 0; /* nothing to trust or not: opening it fails, and says why */
    const char *who = untrusted_writer(&st);
    if (who) {
        snprintf(err, errlen,
                 "%s %s can be changed by %s (owner uid %u, mode %04o): refused; make it "
                 "owned by rtd's user or root and not writable by group or others",
                 what, path, who, (unsigned)st.st_uid, (unsigned)st.st_mode & 07777);
        return RT_EACCES;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0)
        return 0; /* the file itself was checked; a directory we cannot see is not its gap */
    who = untrusted_writer(&st);
    if (who) {
        snprintf(err, errlen,
                 "%s %s is in %s, which %s can change (owner uid %u, mode %04o): refused; "
                 "others could replace the file",
                 what, path, dir, who, (unsigned)st.st_uid, (unsigned)st.st_mode & 07777);
        return RT_EACCES;
    }
    return 0;
}

size_t rt__resident(const void *p, size_t len)
{
    enum { RUN = 4096 };
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (len + page - 1) / page, in = 0;
    unsigned char vec[RUN];
    for (size_t done = 0; done < pages; done += RUN) {
        size_t n = pages - done < RUN ? pages - done : RUN;
        if (mincore((char *)p + done * page, n * page, vec) != 0)
            return 0;
        for (size_t i = 0; i < n; i++)
            in += vec[i] & 1;
    }
    return in * page;
}

/* ---- Base64 ---- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t rt_base64_encode(const void *in, size_t n, char *out)
{
    const uint8_t *b = in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)b[i + 1] << 8;
        if (i + 2 < n)
            v |= b[i + 2];
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[v & 63] : '=';
    }
    out[o] = 0;
    return o;
}

/* The value of a base64 character (of the URL alphabet with url), or -1. */
static int b64_value(unsigned char c, bool url)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == (url ? '-' : '+') ? 62 : c == (url ? '_' : '/') ? 63 : -1;
}

long rt_base64_decode(const char *s, size_t n, void *out, size_t cap, unsigned flags)
{
    uint8_t *b = out;
    size_t pad = 0;
    if ((flags & RT_BASE64_STRICT) && n % 4 != 0)
        return -1;
    while (n > 0 && s[n - 1] == '=') {
        n--;
        pad++;
    }
    if (n % 4 == 1 || ((flags & RT_BASE64_STRICT) && pad > 2))
        return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i], flags & RT_BASE64_URL);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap)
                return -1;
            b[o++] = (uint8_t)(acc >> bits);
        }
    }
    /* The bits left over belong to no byte: a strict text has them zero. */
    if ((flags & RT_BASE64_STRICT) && (acc & ((1u << bits) - 1)) != 0)
        return -1;
    return (long)o;
}

static atomic_uint next_ordinal;
static _Thread_local unsigned my_ordinal = UINT32_MAX;

unsigned rt_thread_ordinal(void)
{
    if (RT_UNLIKELY(my_ordinal == UINT32_MAX))
        my_ordinal = atomic_fetch_add_explicit(&next_ordinal, 1, memory_order_relaxed);
    return my_ordinal;
}

int64_t rt_striped_sum(const rt_striped_t *c)
{
    int64_t sum = 0;
    for (unsigned i = 0; i < RT_STRIPES; i++)
        sum += atomic_load_explicit(&c->s[i].v, memory_order_relaxed);
    return sum;
}

/*
** Password tables, the login policy, the failed-login slow-down and the
** reload swap under concurrent readers.
*/
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "acl.h"
#include "auth.h"
#include "check.h"
#include "tmpdir.h"
#include "config.h"
#include "rcu.h"

static const uint8_t *u8(const char *s)
{
    return (const uint8_t *)s;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

/* Published PBKDF2-HMAC-SHA512 vectors (the RFC 6070 inputs with SHA-512, dkLen 64). */
static void test_pbkdf2_vectors(void)
{
    static const struct {
        const char *pw, *salt;
        uint32_t c;
        const char *dk;
    } v[] = {
        {"password", "salt", 1,
         "867f70cf1ade02cff3752599a3a53dc4af34c7a669815ae5d513554e1c8cf252c02d470a285a0501bad999bf"
         "e943c08f050235d7d68b1da55e63f73b60a57fce"},
        {"password", "salt", 2,
         "e1d9c16aa681708a45f5c7c4e215ceb66e011a2e9f0040713f18aefdb866d53cf76cab2868a39b9f7840edce"
         "4fef5a82be67335c77a6068e04112754f27ccf4e"},
        {"password", "salt", 4096,
         "d197b1b33db0143e018b12f3d1d1479e6cdebdcc97c5c0f87f6902e072f457b5143f30602641b3d55cd33598"
         "8cb36b84376060ecd532e039b742a239434af2d5"},
        {"passwordPASSWORDpassword", "saltSALTsaltSALTsaltSALTsaltSALTsalt", 4096,
         "8c0511f4c6e597c6ac6315d8f0362e225f3c501495ba23b868c005174dc4ee71115b59f9e60cd9532fa33e0f"
         "75aefe30225c583a186cd82bd4daea9724a3d3b8"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint8_t dk[64];
        char got[129];
        CHECK_EQ(rt_auth_pbkdf2_sha512(u8(v[i].pw), strlen(v[i].pw), u8(v[i].salt),
                                       strlen(v[i].salt), v[i].c, dk, sizeof(dk)),
                 0);
        hex(dk, sizeof(dk), got);
        CHECK(strcmp(got, v[i].dk) == 0);
    }
    uint8_t dk[64];
    CHECK_EQ(rt_auth_pbkdf2_sha512(u8("x"), 1, u8("s"), 1, 0, dk, 64), RT_EINVAL);
}

static void test_round_trip(void)
{
    char h1[RT_AUTH_HASH_MAX], h2[RT_AUTH_HASH_MAX], h3[RT_AUTH_HASH_MAX];
    CHECK_EQ(rt_auth_hash_password(u8("s3cret"), 6, 1000, h1, sizeof(h1)), 0);
    CHECK_EQ(rt_auth_hash_password(u8("s3cret"), 6, 1000, h2, sizeof(h2)), 0);
    CHECK(strncmp(h1, "$7$1000$", 8) == 0);
    CHECK(strcmp(h1, h2) != 0); /* fresh salt each time */
    /* (Not ending in 0: HMAC pads its key with zeros, so PBKDF2 cannot tell "x" from "x\0".) */
    static const uint8_t binary[] = {0, 1, 2, 0xff, 7};
    CHECK_EQ(rt_auth_hash_password(binary, sizeof(binary), 1000, h3, sizeof(h3)), 0);
    char text[1024];
    snprintf(text, sizeof(text), "# users\n\nalice:%s\nbob:%s\r\nbin:%s\n", h1, h2, h3);
    rt_auth_t *a = NULL;
    char err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_load(tmpdir_put("rt.pw", text), &a, err, sizeof(err)), 0);
    if (!a)
        return;
    CHECK_EQ(rt_auth_users(a), 3);
    CHECK_EQ(rt_auth_check(a, "alice", u8("s3cret"), 6), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "bob", u8("s3cret"), 6), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "alice", u8("s3creT"), 6), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "alice", u8("s3cret"), 5), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "alice", u8(""), 0), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "carol", u8("s3cret"), 6), RT_AUTH_UNKNOWN_USER);
    CHECK_EQ(rt_auth_check(a, "", u8("s3cret"), 6), RT_AUTH_UNKNOWN_USER);
    CHECK_EQ(rt_auth_check(a, "bin", binary, sizeof(binary)), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "bin", binary, sizeof(binary) - 1), RT_AUTH_BAD_PASSWORD);
    rt_auth_free(a);
}

/* Lines made by mosquitto_passwd 2.0.11 ($7$, 101 rounds) and -H sha512 ($6$). */
static void test_mosquitto_lines(void)
{
    const char *text = "alice:$7$101$ohRixXecVWcf6OX+$mLvJLNehbDabQwvAgPmUqDkor/svNjxC/"
                       "bOMLPrQFanzPS35AalK+WU677VN9"
                       "NCPS40L3kK2SUVYd/Vtl6Sodw==\n"
                       "bob:$6$5tyOSHB7DdkqYmMh$"
                       "h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv389Bnhr1SMai9Bi"
                       "EYMTECbHCICqOA20D6g==\n";
    rt_auth_t *a = NULL;
    char err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_load(tmpdir_put("mosq.pw", text), &a, err, sizeof(err)), 0);
    if (!a)
        return;
    CHECK_EQ(rt_auth_check(a, "alice", u8("secret"), 6), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "alice", u8("secreT"), 6), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "bob", u8("hunter2"), 7), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "bob", u8("hunter3"), 7), RT_AUTH_BAD_PASSWORD);
    /* An unknown user costs what alice's 101 rounds cost, not the default 10,000 (100x). */
    double t0 = thread_cpu_s();
    for (int i = 0; i < 10; i++)
        CHECK_EQ(rt_auth_check(a, "alice", u8("x"), 1), RT_AUTH_BAD_PASSWORD);
    double known = thread_cpu_s() - t0;
    t0 = thread_cpu_s();
    for (int i = 0; i < 10; i++)
        CHECK_EQ(rt_auth_check(a, "nobody", u8("x"), 1), RT_AUTH_UNKNOWN_USER);
    double unknown = thread_cpu_s() - t0;
    CHECK(unknown < known * 5 + 1e-3);
    rt_auth_free(a);

    /* And a file the installed mosquitto_passwd makes now, with an odd password. */
    if (access("/usr/bin/mosquitto_passwd", X_OK) != 0) {
        fprintf(stderr, "  (no /usr/bin/mosquitto_passwd: live check skipped)\n");
        return;
    }
    char cmd[512], path[128];
    snprintf(path, sizeof(path), "%s/live.pw", tmpdir_path);
    snprintf(cmd, sizeof(cmd),
             "mosquitto_passwd -c -b %s dave 'p@ss w:rd$7$' && "
             "mosquitto_passwd -b %s erin 'Ünïcode' && "
             "mosquitto_passwd -H sha512 -b %s frank short",
             path, path, path);
    CHECK_EQ(system(cmd), 0);
    CHECK_EQ(rt_auth_load(path, &a, err, sizeof(err)), 0);
    if (!a)
        return;
    CHECK_EQ(rt_auth_users(a), 3);
    CHECK_EQ(rt_auth_check(a, "dave", u8("p@ss w:rd$7$"), 12), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "erin", u8("Ünïcode"), strlen("Ünïcode")), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "frank", u8("short"), 5), RT_AUTH_OK);
    CHECK_EQ(rt_auth_check(a, "frank", u8("shorT"), 5), RT_AUTH_BAD_PASSWORD);
    rt_auth_free(a);
}

/* Each bad file fails with "path:line: reason" naming the expected line. */
static void test_malformed(void)
{
    const char *good =
        "ok:$6$5tyOSHB7DdkqYmMh$h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv389B"
        "nhr1SMai9BiEYMTECbHCICqOA20D6g==\n";
    static const struct {
        const char *line;
        const char *reason;
    } bad[] = {
        {"no colon here", "expected user:hash"},
        {":$7$101$ohRixXecVWcf6OX+$AAAA", "user name is empty"},
        {"plain:secret", "not a $7$"},
        {"x:$7$$ohRixXecVWcf6OX+$AAAA", "iteration count"},
        {"x:$7$0$ohRixXecVWcf6OX+$AAAA", "iteration count"},
        {"x:$7$99999999999$ohRixXecVWcf6OX+$AAAA", "iteration count"},
        {"x:$7$101$ohRixXecVWcf6OX+", "no $SALT$HASH"},
        {"x:$7$101$!!!!$AAAA", "salt is not base64"},
        {"x:$7$101$ohRixXecVWcf6OX+$AAAA", "hash is not base64 of 64"},
        {"x:$5$abc$def", "not a $7$"},
        {"x:$6$5tyOSHB7DdkqYmMh$h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv389Bnhr1SMa"
         "i9BiEYMTECbHCICqOA20D6gA=",
         "hash is not base64 of 64"}, /* 65 bytes */
        {"x:$6$5tyOSHB7DdkqYmMh$h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv389Bnhr1SMa"
         "i9BiEYMTECbHCICqOA20D",
         "hash is not base64 of 64"}, /* 63 bytes */
        {"ok:$6$5tyOSHB7DdkqYmMh$h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv389Bnhr1SMa"
         "i9BiEYMTECbHCICqOA20D6g==",
         "listed twice (first on line 2)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512], want[256], err[RT_AUTH_ERR_LEN] = "";
        snprintf(text, sizeof(text), "# comment\n%s\n%s\n", good, bad[i].line);
        const char *path = tmpdir_put("bad.pw", text);
        rt_auth_t *a = NULL;
        CHECK_EQ(rt_auth_load(path, &a, err, sizeof(err)), RT_EINVAL);
        CHECK(a == NULL);
        snprintf(want, sizeof(want), "%s:4: ", path);
        bool ok = strncmp(err, want, strlen(want)) == 0 && strstr(err, bad[i].reason);
        if (!ok)
            fprintf(stderr, "  case %zu: got \"%s\"\n", i, err);
        CHECK(ok);
    }
    char err[RT_AUTH_ERR_LEN];
    rt_auth_t *a = NULL;
    CHECK_EQ(rt_auth_load("/nonexistent/rt.pw", &a, err, sizeof(err)), RT_ENOTFOUND);
    CHECK(strstr(err, "/nonexistent/rt.pw: cannot open") != NULL);
    /* A file with a NUL byte in the middle of a line. */
    char path[128];
    snprintf(path, sizeof(path), "%s/nul.pw", tmpdir_path);
    FILE *f = fopen(path, "wb");
    fwrite("a:b\0c\n", 1, 6, f);
    fclose(f);
    CHECK_EQ(rt_auth_load(path, &a, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, ":1: ") != NULL);
}

/* Random files of password-file pieces: loaded or refused with a line, never a crash. */
static void test_random_files(void)
{
    static const char *const pieces[] = {"u",
                                         ":",
                                         "$",
                                         "7",
                                         "6",
                                         "101",
                                         "$7$",
                                         "$6$",
                                         "#",
                                         "\n",
                                         "\r",
                                         " ",
                                         "=",
                                         "A",
                                         "ohRixXecVWcf6OX+",
                                         "h6gbTxczxVlPb6mDd9TDioKKxHBcDAkWKvG5CUEeaUPa3pahfVRv"
                                         "389Bnhr1SMai9BiEYMTECbHCICqOA20D6g=="};
    const size_t n = sizeof(pieces) / sizeof(pieces[0]);
    long files = check_scale(1000), loaded = 0;
    for (long f = 0; f < files; f++) {
        char text[1024] = "";
        size_t len = 0;
        for (int w = (int)(rnd() % 30); w > 0; w--) {
            const char *p = pieces[rnd() % n];
            size_t pl = strlen(p);
            if (len + pl + 1 >= sizeof(text))
                break;
            memcpy(text + len, p, pl + 1);
            len += pl;
        }
        char err[RT_AUTH_ERR_LEN] = "";
        rt_auth_t *a = NULL;
        int rc = rt_auth_load(tmpdir_put("fuzz.pw", text), &a, err, sizeof(err));
        CHECK(rc == 0 || (rc == RT_EINVAL && strstr(err, "fuzz.pw:")));
        loaded += a != NULL;
        rt_auth_free(a);
    }
    CHECK(loaded > 0);
}

/* ---- Reload under concurrent readers ---- */

typedef struct reader_arg_s {
    atomic_bool *stop;
    atomic_long *running; /* readers that have made a login */
    long logins, odd;
} reader_arg_t;

static void *reader(void *p)
{
    reader_arg_t *r = p;
    rt_auth_addr_t addr;
    rt_auth_addr_parse("127.0.0.1", &addr);
    while (!atomic_load(r->stop)) {
        uint32_t delay;
        int a = rt_auth_login(NULL, "u", u8("one"), 3, &delay);
        int b = rt_auth_login(NULL, "u", u8("two"), 3, &delay);
        /* Each call sees one whole table (ASan would catch a freed one). */
        r->odd += a != RT_AUTH_OK && a != RT_AUTH_BAD_PASSWORD && a != RT_AUTH_UNKNOWN_USER;
        r->odd += b != RT_AUTH_OK && b != RT_AUTH_BAD_PASSWORD && b != RT_AUTH_UNKNOWN_USER;
        if (r->logins == 0)
            atomic_fetch_add(r->running, 1);
        r->logins += 2;
    }
    return NULL;
}

static void test_reload_under_readers(void)
{
    /* $6$ lines keep each check cheap, so the swap races many of them. */
    char h_one[RT_AUTH_HASH_MAX], h_two[RT_AUTH_HASH_MAX], line[512];
    CHECK_EQ(rt_auth_hash_password(u8("one"), 3, 1, h_one, sizeof(h_one)), 0);
    CHECK_EQ(rt_auth_hash_password(u8("two"), 3, 1, h_two, sizeof(h_two)), 0);
    char p1[128], p2[128], p3[128];
    snprintf(line, sizeof(line), "u:%s\n", h_one);
    snprintf(p1, sizeof(p1), "%s", tmpdir_put("one.pw", line));
    snprintf(line, sizeof(line), "u:%s\n", h_two);
    snprintf(p2, sizeof(p2), "%s", tmpdir_put("two.pw", line));
    snprintf(p3, sizeof(p3), "%s", tmpdir_put("empty.pw", "# nobody\n"));
    char err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_reload(p1, err, sizeof(err)), 0);

    enum { THREADS = 2 };
    atomic_bool stop = false;
    atomic_long running = 0;
    pthread_t t[THREADS];
    reader_arg_t args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (reader_arg_t){.stop = &stop, .running = &running};
        pthread_create(&t[i], NULL, reader, &args[i]);
    }
    while (atomic_load(&running) < THREADS) /* every reader is busy before the swaps */
        sched_yield();
    long swaps = check_scale(100);
    const char *paths[3] = {p1, p2, p3};
    for (long i = 0; i < swaps; i++)
        CHECK_EQ(rt_auth_reload(paths[i % 3], err, sizeof(err)), 0);
    /* A bad file leaves the table in force. */
    CHECK_EQ(rt_auth_reload(tmpdir_put("broken.pw", "u:nothash\n"), err, sizeof(err)), RT_EINVAL);
    atomic_store(&stop, true);
    long logins = 0, odd = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        logins += args[i].logins;
        odd += args[i].odd;
    }
    fprintf(stderr, "  %ld swaps while %d threads made %ld logins\n", swaps, THREADS, logins);
    CHECK(logins > 0);
    CHECK_EQ(odd, 0);
    CHECK_EQ(rt_auth_reload("", err, sizeof(err)), 0);
}

/* The swap itself: readers never see an object after its swap returned. */
typedef struct box_s {
    atomic_long alive; /* 1 until freed by the swapper (poisoned to 0 first) */
} box_t;

static rt_rcu_t box_ptr;

static void *box_reader(void *p)
{
    atomic_bool *stop = p;
    long bad = 0;
    while (!atomic_load(stop)) {
        box_t *b = rt_rcu_enter(&box_ptr);
        if (b && atomic_load(&b->alive) != 1)
            bad++;
        rt_rcu_leave();
    }
    return (void *)bad;
}

static void test_rcu_swap(void)
{
    enum { THREADS = 3 };
    atomic_bool stop = false;
    pthread_t t[THREADS];
    box_t *b = malloc(sizeof(*b));
    atomic_store(&b->alive, 1);
    rt_rcu_swap(&box_ptr, b);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, box_reader, &stop);
    long n = check_scale(20000);
    for (long i = 0; i < n; i++) {
        box_t *next = malloc(sizeof(*next));
        atomic_store(&next->alive, 1);
        box_t *old = rt_rcu_swap(&box_ptr, next);
        atomic_store(&old->alive, 0); /* a reader that still held it would see 0 */
        free(old);
    }
    atomic_store(&stop, true);
    long bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)r;
    }
    CHECK_EQ(bad, 0);
    free(rt_rcu_swap(&box_ptr, NULL));
    /* Nested sections on one thread. */
    rt_rcu_enter(&box_ptr);
    rt_rcu_enter(&box_ptr);
    rt_rcu_leave();
    rt_rcu_leave();
}

/*
** A swap waits for every reader inside a section, those with a slot of their
** own and those past RT_RCU_SLOTS that share the overflow counter.
*/
typedef struct holder_s {
    pthread_barrier_t *in, *out;
} holder_t;

static rt_rcu_t held_ptr;
static atomic_bool swap_done;

static void *holder(void *p)
{
    holder_t *h = p;
    rt_rcu_enter(&held_ptr);
    pthread_barrier_wait(h->in);
    pthread_barrier_wait(h->out);
    rt_rcu_leave();
    return NULL;
}

static void *swapper(void *p)
{
    (void)p;
    rt_rcu_swap(&held_ptr, NULL);
    atomic_store(&swap_done, true);
    return NULL;
}

static void test_rcu_swap_waits_for_every_reader(void)
{
    enum { THREADS = RT_RCU_SLOTS + 8 };
    pthread_barrier_t in, out;
    pthread_barrier_init(&in, NULL, THREADS + 1);
    pthread_barrier_init(&out, NULL, THREADS + 1);
    holder_t h = {&in, &out};
    pthread_t *t = calloc(THREADS, sizeof(*t));
    int started = 0;
    for (; started < THREADS; started++)
        if (pthread_create(&t[started], NULL, holder, &h) != 0)
            break;
    CHECK_EQ(started, THREADS);
    if (started != THREADS)
        abort();               /* the barriers would never open */
    pthread_barrier_wait(&in); /* every holder is inside a section */
    static int x;
    atomic_store(&held_ptr.ptr, &x);
    pthread_t s;
    pthread_create(&s, NULL, swapper, NULL);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK(!atomic_load(&swap_done));
    pthread_barrier_wait(&out); /* holders leave */
    pthread_join(s, NULL);
    CHECK(atomic_load(&swap_done));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    free(t);
    pthread_barrier_destroy(&in);
    pthread_barrier_destroy(&out);
}

/* ---- The slow-down ---- */

static void test_fail_delay(void)
{
    rt_auth_limiter_t *l = NULL;
    CHECK_EQ(rt_auth_limiter_new(5000, &l), 0);
    rt_auth_addr_t a, b, a6, a6_same64, a6_other;
    CHECK_EQ(rt_auth_addr_parse("192.0.2.1", &a), 0);
    CHECK_EQ(rt_auth_addr_parse("192.0.2.2", &b), 0);
    CHECK_EQ(rt_auth_addr_parse("2001:db8:1:2::1", &a6), 0);
    CHECK_EQ(rt_auth_addr_parse("2001:db8:1:2:ffff::9", &a6_same64), 0);
    CHECK_EQ(rt_auth_addr_parse("2001:db8:1:3::1", &a6_other), 0);
    CHECK_EQ(rt_auth_addr_parse("not an address", &b), RT_EINVAL);
    rt_auth_addr_parse("192.0.2.2", &b);

    uint64_t t = 1000000;
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t), 0);
    /* Growth: 100, 200, 400, ... doubling, capped at 5 s. */
    static const uint32_t want[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        CHECK_EQ(rt_auth_limiter_fail(l, &a, t), want[i]);
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t), 5000);
    CHECK_EQ(rt_auth_limiter_delay(l, &b, t), 0); /* other addresses unaffected */
    /* Decay: 9 failures halve to 4.5 after one half-life (800 ms), 2.25 after two. */
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t + RT_AUTH_FAIL_HALF_LIFE_MS), 800);
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t + 2 * RT_AUTH_FAIL_HALF_LIFE_MS), 200);
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t + 4 * RT_AUTH_FAIL_HALF_LIFE_MS), 0);
    /* A failure after decay counts from the decayed value: 2.25 + 1 = 3.25 -> 400. */
    CHECK_EQ(rt_auth_limiter_fail(l, &a, t + 2 * RT_AUTH_FAIL_HALF_LIFE_MS), 400);
    /* Success forgets the address. */
    rt_auth_limiter_succeed(l, &a);
    CHECK_EQ(rt_auth_limiter_delay(l, &a, t), 0);
    CHECK_EQ(rt_auth_limiter_fail(l, &a, t), 100);
    /* IPv6 counts per /64. */
    CHECK_EQ(rt_auth_limiter_fail(l, &a6, t), 100);
    CHECK_EQ(rt_auth_limiter_fail(l, &a6_same64, t), 200);
    CHECK_EQ(rt_auth_limiter_delay(l, &a6_other, t), 0);
    rt_auth_limiter_free(l);

    /* A cap of 0 turns the delay off; the counting still happens. */
    CHECK_EQ(rt_auth_limiter_new(0, &l), 0);
    CHECK_EQ(rt_auth_limiter_fail(l, &a, t), 0);
    rt_auth_limiter_free(l);
}

static void test_fail_table_bounded(void)
{
    rt_auth_limiter_t *l = NULL;
    CHECK_EQ(rt_auth_limiter_new(5000, &l), 0);
    rt_auth_addr_t hot;
    rt_auth_addr_parse("198.51.100.7", &hot);
    for (int i = 0; i < 8; i++)
        rt_auth_limiter_fail(l, &hot, 1000);
    /* 50,000 addresses with one failure each: the table keeps its size. */
    for (uint32_t i = 0; i < 50000; i++) {
        rt_auth_addr_t x = {{0}};
        x.b[10] = x.b[11] = 0xff;
        x.b[12] = 10;
        x.b[13] = (uint8_t)(i >> 16);
        x.b[14] = (uint8_t)(i >> 8);
        x.b[15] = (uint8_t)i;
        rt_auth_limiter_fail(l, &x, 1000);
    }
    size_t entries;
    uint64_t evictions;
    rt_auth_limiter_usage(l, &entries, &evictions);
    CHECK(entries <= RT_AUTH_FAIL_SLOTS);
    CHECK(entries > RT_AUTH_FAIL_SLOTS / 2);
    CHECK_EQ(entries + evictions, 50001);
    /* The address with the most failures outlives one-failure newcomers in its set. */
    CHECK_EQ(rt_auth_limiter_delay(l, &hot, 1000), 5000);
    rt_auth_limiter_free(l);
}

/* The table as a rate (XMPP registrations): a burst, then one each period / burst. */
static void test_rate(void)
{
    rt_auth_limiter_t *l = NULL;
    CHECK_EQ(rt_auth_rate_new(3, 3600 * 1000, &l), 0);
    rt_auth_addr_t a, b, a6, a6_same64;
    rt_auth_addr_parse("192.0.2.1", &a);
    rt_auth_addr_parse("192.0.2.2", &b);
    rt_auth_addr_parse("2001:db8:1:2::1", &a6);
    rt_auth_addr_parse("2001:db8:1:2:ffff::9", &a6_same64);
    uint64_t t = 1000000;
    for (int i = 0; i < 3; i++)
        CHECK(rt_auth_rate_take(l, &a, t));
    CHECK(!rt_auth_rate_take(l, &a, t));
    CHECK(rt_auth_rate_take(l, &b, t)); /* other addresses unaffected */
    /* One drains each 20 minutes; refused tries do not count. */
    CHECK(!rt_auth_rate_take(l, &a, t + 19 * 60 * 1000));
    CHECK(!rt_auth_rate_take(l, &a, t + 19 * 60 * 1000));
    CHECK(rt_auth_rate_take(l, &a, t + 20 * 60 * 1000));
    CHECK(!rt_auth_rate_take(l, &a, t + 20 * 60 * 1000));
    /* Drained whole after an hour: a full burst again. */
    for (int i = 0; i < 3; i++)
        CHECK(rt_auth_rate_take(l, &a, t + 3 * 3600 * 1000));
    CHECK(!rt_auth_rate_take(l, &a, t + 3 * 3600 * 1000));
    /* IPv6 per /64. */
    for (int i = 0; i < 3; i++)
        CHECK(rt_auth_rate_take(l, i % 2 ? &a6 : &a6_same64, t));
    CHECK(!rt_auth_rate_take(l, &a6, t));
    rt_auth_limiter_free(l);
}

/* ---- The policy through rt_auth_configure / rt_auth_login ---- */

static void test_login_policy(void)
{
    char h[RT_AUTH_HASH_MAX], line[256], err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_hash_password(u8("pw"), 2, 1000, h, sizeof(h)), 0);
    snprintf(line, sizeof(line), "alice:%s\n", h);
    rt_conf_t conf;
    rt_conf_defaults(&conf);
    CHECK_EQ(conf.allow_anonymous, true);
    CHECK_EQ(conf.auth_max_delay_ms, RT_AUTH_MAX_DELAY_MS_DEFAULT);

    rt_auth_stats_t s0, s1;
    rt_auth_stats(&s0);
    uint32_t delay = 99;
    rt_auth_addr_t addr;
    rt_auth_addr_parse("203.0.113.5", &addr);

    /* No password file: anonymous clients from anonymous_from only (loopback by default;
       the whole Internet when it says so), and a user name, vouched for by nothing, is
       anonymous: admitted exactly where no name would be, never used. */
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    CHECK_EQ(rt_auth_login(&addr, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(delay, 100);
    rt_auth_addr_t local, remote;
    rt_auth_addr_parse("127.0.0.2", &local);
    rt_auth_addr_parse("198.51.100.7", &remote);
    CHECK_EQ(rt_auth_login(&local, NULL, NULL, 0, &delay), RT_AUTH_OK);
    CHECK_EQ(delay, 0);
    CHECK_EQ(rt_auth_login(&local, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS);
    CHECK_EQ(rt_auth_login(&local, "anyone", NULL, 0, &delay), RT_AUTH_ANONYMOUS);
    CHECK_EQ(rt_auth_login(&remote, NULL, NULL, 0, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(delay, 100);
    CHECK_EQ(rt_auth_login(NULL, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(rt_auth_login_quick(&remote, "anyone", u8("x"), 1, &delay),
             RT_AUTH_ANONYMOUS_REFUSED);
    rt_auth_set_allow_anonymous(false);
    CHECK_EQ(rt_auth_login(&local, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(rt_auth_login(&local, NULL, NULL, 0, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    rt_auth_set_allow_anonymous(true);
    CHECK_EQ(rt_conf_set(&conf, "anonymous_from={'0.0.0.0/0', '::/0'}", err, sizeof(err)), 0);
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    CHECK_EQ(rt_auth_login(&addr, NULL, NULL, 0, &delay), RT_AUTH_OK);
    CHECK_EQ(rt_auth_login(&addr, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS);

    snprintf(conf.password_file, sizeof(conf.password_file), "%s", tmpdir_put("policy.pw", line));
    conf.allow_anonymous = false;
    conf.auth_max_delay_ms = 300;
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_OK);
    CHECK_EQ(delay, 0);
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("pW"), 2, &delay), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(delay, 100);
    CHECK_EQ(rt_auth_login(&addr, "alice", NULL, 0, &delay), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(delay, 200);
    CHECK_EQ(rt_auth_login(&addr, "mallory", u8("pw"), 2, &delay), RT_AUTH_UNKNOWN_USER);
    CHECK_EQ(delay, 300); /* capped by auth_max_delay_ms */
    CHECK_EQ(rt_auth_login(&addr, NULL, NULL, 0, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(rt_auth_login(NULL, NULL, NULL, 0, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(delay, 0); /* no address, no delay */
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_OK);
    rt_auth_stats(&s1);
    CHECK_EQ(s1.successes - s0.successes, 7);
    CHECK_EQ(s1.bad_password - s0.bad_password, 2);
    CHECK_EQ(s1.unknown_user - s0.unknown_user, 1);
    CHECK_EQ(s1.anonymous_refused - s0.anonymous_refused, 8);
    CHECK_EQ(s1.users, 1);
    CHECK(s1.bytes > sizeof(rt_auth_stats_t)); /* the tables are counted */

    /* A bad ACL file refuses the whole configuration; the old one stays. */
    snprintf(conf.acl_file, sizeof(conf.acl_file), "%s",
             tmpdir_put("bad.acl", "topic read a\nbogus\n"));
    snprintf(conf.password_file, sizeof(conf.password_file), "%s", tmpdir_put("none.pw", ""));
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "bad.acl:2: unknown keyword") != NULL);
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_OK);

    /* With an ACL: only what it allows. */
    snprintf(conf.acl_file, sizeof(conf.acl_file), "%s",
             tmpdir_put("ok.acl", "user alice\ntopic write a/#\n"));
    snprintf(conf.password_file, sizeof(conf.password_file), "%s", tmpdir_put("policy.pw", line));
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    rt_acl_stats_t as0, as1;
    rt_acl_stats(&as0);
    CHECK_EQ(rt_acl_permit("alice", "c1", "a/b", 3, RT_ACL_WRITE), RT_ACL_ALLOW);
    CHECK_EQ(rt_acl_permit("alice", "c1", "b", 1, RT_ACL_WRITE), RT_ACL_DENY);
    CHECK_EQ(rt_acl_permit("alice", "c1", "a/b", 3, RT_ACL_SUBSCRIBE), RT_ACL_DENY);
    rt_acl_stats(&as1);
    CHECK_EQ(as1.denied_publish - as0.denied_publish, 1);
    CHECK_EQ(as1.denied_subscribe - as0.denied_subscribe, 1);
    CHECK_EQ(as1.rules, 1);
    CHECK(as1.bytes > 0);
    rt_auth_shutdown();
    CHECK_EQ(rt_acl_permit("alice", "c1", "b", 1, RT_ACL_WRITE), RT_ACL_ALLOW);
}

/*
** rt_auth_login_quick decides only what costs no full hash and leaves the rest
** (RT_AUTH_PENDING) uncounted and unnoted, for the verifier's rt_auth_login.
*/
static void test_login_quick(void)
{
    char h[RT_AUTH_HASH_MAX], line[256], err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_hash_password(u8("pw"), 2, 1000, h, sizeof(h)), 0);
    snprintf(line, sizeof(line), "alice:%s\n", h);
    rt_conf_t conf;
    rt_conf_defaults(&conf);
    rt_auth_addr_t addr;
    rt_auth_addr_parse("203.0.113.9", &addr);
    rt_auth_addr_t local;
    rt_auth_addr_parse("127.0.0.1", &local);
    uint32_t delay = 99;

    /* No password file: decided at once. */
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    CHECK_EQ(rt_auth_login_quick(&local, "anyone", u8("x"), 1, &delay), RT_AUTH_ANONYMOUS);
    CHECK_EQ(delay, 0);

    snprintf(conf.password_file, sizeof(conf.password_file), "%s", tmpdir_put("quick.pw", line));
    conf.allow_anonymous = false;
    CHECK_EQ(rt_auth_configure(&conf, err, sizeof(err)), 0);
    rt_auth_stats_t s0, s1;
    rt_auth_stats(&s0);
    CHECK_EQ(rt_auth_login_quick(&addr, NULL, NULL, 0, &delay), RT_AUTH_ANONYMOUS_REFUSED);
    CHECK_EQ(delay, 100);
    /* A first login, a wrong password and an unknown user all need the hash. */
    CHECK_EQ(rt_auth_login_quick(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_PENDING);
    CHECK_EQ(delay, 0);
    CHECK_EQ(rt_auth_login_quick(&addr, "alice", u8("no"), 2, &delay), RT_AUTH_PENDING);
    CHECK_EQ(rt_auth_login_quick(&addr, "mallory", u8("pw"), 2, &delay), RT_AUTH_PENDING);
    rt_auth_stats(&s1);
    CHECK_EQ(s1.anonymous_refused - s0.anonymous_refused, 1);
    CHECK_EQ(s1.successes + s1.bad_password + s1.unknown_user,
             s0.successes + s0.bad_password + s0.unknown_user); /* pending counts nothing */
    /* Undecided logins noted no failure: the next delay is the second one's. */
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("no"), 2, &delay), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(delay, 200);
    /* Once verified in full, the same password is remembered and decided at once. */
    CHECK_EQ(rt_auth_login(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_OK);
    CHECK_EQ(rt_auth_login_quick(&addr, "alice", u8("pw"), 2, &delay), RT_AUTH_OK);
    CHECK_EQ(rt_auth_login_quick(&addr, "alice", u8("no"), 2, &delay), RT_AUTH_PENDING);
    CHECK_EQ(rt_auth_login_quick(&addr, "alice", NULL, 0, &delay), RT_AUTH_PENDING);
    rt_auth_shutdown();
}

/* The cost of one check at the default strength, printed for the record. */
static void test_check_cost(void)
{
    char h[RT_AUTH_HASH_MAX], line[256], err[RT_AUTH_ERR_LEN];
    CHECK_EQ(rt_auth_hash_password(u8("pw"), 2, RT_AUTH_PBKDF2_ITERATIONS, h, sizeof(h)), 0);
    snprintf(line, sizeof(line), "u:%s\n", h);
    rt_auth_t *a = NULL;
    CHECK_EQ(rt_auth_load(tmpdir_put("cost.pw", line), &a, err, sizeof(err)), 0);
    if (!a)
        return;
    int n = (int)check_scale(50);
    double t0 = thread_cpu_s();
    for (int i = 0; i < n; i++)
        CHECK_EQ(rt_auth_check(a, "u", u8("wrong"), 5), RT_AUTH_BAD_PASSWORD);
    double bad = (thread_cpu_s() - t0) / n;
    t0 = thread_cpu_s();
    for (int i = 0; i < n; i++)
        CHECK_EQ(rt_auth_check(a, "nobody", u8("pw"), 2), RT_AUTH_UNKNOWN_USER);
    double unknown = (thread_cpu_s() - t0) / n;
    t0 = thread_cpu_s();
    CHECK_EQ(rt_auth_check(a, "u", u8("pw"), 2), RT_AUTH_OK); /* first success: full cost */
    double first = thread_cpu_s() - t0;
    int m = (int)check_scale(10000);
    t0 = thread_cpu_s();
    for (int i = 0; i < m; i++)
        CHECK_EQ(rt_auth_check(a, "u", u8("pw"), 2), RT_AUTH_OK);
    double again = (thread_cpu_s() - t0) / m;
    fprintf(
        stderr,
        "  %d rounds, CPU time: %.2f ms per wrong password, %.2f ms unknown user, %.2f ms first "
        "success, %.2f us a repeated success (remembered)\n",
        RT_AUTH_PBKDF2_ITERATIONS, bad * 1e3, unknown * 1e3, first * 1e3, again * 1e6);
    CHECK(again < first / 10);
    /* A wrong password after a remembered success still fails, at full cost. */
    CHECK_EQ(rt_auth_check(a, "u", u8("pw2"), 3), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "u", u8("p"), 1), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "u", u8("pw"), 2), RT_AUTH_OK);
    rt_auth_free(a);
    /* A changed password (a new table) forgets the old one. */
    CHECK_EQ(rt_auth_hash_password(u8("new"), 3, 1000, h, sizeof(h)), 0);
    snprintf(line, sizeof(line), "u:%s\n", h);
    CHECK_EQ(rt_auth_load(tmpdir_put("cost.pw", line), &a, err, sizeof(err)), 0);
    if (!a)
        return;
    CHECK_EQ(rt_auth_check(a, "u", u8("pw"), 2), RT_AUTH_BAD_PASSWORD);
    CHECK_EQ(rt_auth_check(a, "u", u8("new"), 3), RT_AUTH_OK);
    rt_auth_free(a);
}

int main(void)
{
    if (tmpdir_make("rt_test_auth") != 0)
        return 1;
    RUN(test_pbkdf2_vectors);
    RUN(test_round_trip);
    RUN(test_mosquitto_lines);
    RUN(test_malformed);
    RUN(test_random_files);
    RUN(test_rcu_swap);
    RUN(test_rcu_swap_waits_for_every_reader);
    RUN(test_reload_under_readers);
    RUN(test_fail_delay);
    RUN(test_fail_table_bounded);
    RUN(test_rate);
    RUN(test_login_quick);
    RUN(test_login_policy);
    RUN(test_check_cost);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

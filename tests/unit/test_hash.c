/*
** The keyed table hash: SipHash is computed right (the paper's SipHash-2-4 vector), every
** length takes its tail bytes, the tweak separates equal bytes, ids planned to collide under
** an unkeyed hash spread out, and the key is not a constant (two processes hash the same
** bytes differently, so collisions found in one do not carry).
*/
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "internal.h"

static void test_reference_vector(void)
{
    /* SipHash paper, appendix A: key 00..0f, message 00..0e (15 bytes). */
    uint8_t msg[15];
    for (unsigned i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)i;
    CHECK(rt__siphash24(0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, msg, sizeof(msg)) ==
          0xa129ca6149be45e5ull);
}

static void test_every_byte_counts(void)
{
    uint8_t buf[40] = {0};
    for (size_t len = 0; len < sizeof(buf); len++) {
        uint64_t h = rt_hash(buf, len);
        CHECK(h == rt_hash(buf, len));
        for (size_t i = 0; i < len; i++) {
            buf[i] ^= 1;
            CHECK(rt_hash(buf, len) != h);
            buf[i] ^= 1;
        }
        if (len)
            CHECK(rt_hash(buf, len - 1) != h); /* the length is hashed too */
    }
}

static void test_tweak(void)
{
    CHECK(rt_hash_with(1, "level", 5) != rt_hash_with(2, "level", 5));
    CHECK(rt_hash_with(0, "level", 5) == rt_hash("level", 5));
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/*
** Hash flooding: client ids planned to share a bucket under the unkeyed FNV-1a the client
** table used (32 ids whose low 12 bits agree, found by trying ids in order) land in as
** many buckets as random keys would: a table of 4,096 buckets holds them in one chain
** under FNV-1a, and in about 32 under rt_hash.
*/
static void test_planned_collisions_do_not_collide(void)
{
    enum { WANT = 32, MASK = 0xfff };
    char ids[WANT][24];
    int found = 0;
    for (unsigned i = 0; found < WANT && i < 10u * 1000 * 1000; i++) {
        char id[24];
        int n = snprintf(id, sizeof(id), "client-%u", i);
        if ((fnv1a(id, (size_t)n) & MASK) == 0x234)
            memcpy(ids[found++], id, sizeof(id));
    }
    CHECK_EQ(found, WANT);
    uint64_t buckets[WANT];
    int distinct = 0;
    for (int i = 0; i < WANT; i++) {
        uint64_t b = rt_hash(ids[i], strlen(ids[i])) & MASK;
        bool seen = false;
        for (int j = 0; j < distinct && !seen; j++)
            seen = buckets[j] == b;
        if (!seen)
            buckets[distinct++] = b;
    }
    /* 32 random draws from 4,096 buckets make 0.12 repeats on average; 26 distinct leaves
       room for six (probability about 4e-9). */
    CHECK(distinct >= 26);
}

static uint64_t hash_in_child(void)
{
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        uint64_t h = rt_hash("client-id", 9);
        _exit(write(fds[1], &h, sizeof(h)) == (ssize_t)sizeof(h) ? 0 : 1);
    }
    uint64_t h = 0;
    CHECK_EQ(read(fds[0], &h, sizeof(h)), (ssize_t)sizeof(h));
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    close(fds[0]);
    close(fds[1]);
    return h;
}

static void test_key_differs_per_process(void)
{
    /* Children forked before this process keyed its hash key their own. Two keys of 128
       random bits agree on one input with probability 2^-64. */
    CHECK(hash_in_child() != hash_in_child());
}

int main(void)
{
    RUN(test_key_differs_per_process);
    RUN(test_reference_vector);
    RUN(test_every_byte_counts);
    RUN(test_tweak);
    RUN(test_planned_collisions_do_not_collide);
    printf("test_hash: ok\n");
    return 0;
}

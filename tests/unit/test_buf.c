/*
** The byte codec beside rt_buf (runtime/buf.c) that a session's bytes between nodes and the
** XMPP cluster's messages are written and read with: numbers of every width round-trip most
** significant byte first, counted bytes round-trip, and a read past the end, or a count past
** its bound, sets bad, which sticks (later reads give NULL or 0), at every truncation.
*/
#include <string.h>

#include "check.h"
#include "rt.h"

static void write_sample(rt_buf_t *b)
{
    rt_buf_put_uint(b, 0xab, 1);
    rt_buf_put_uint(b, 0x1234, 2);
    rt_buf_put_uint(b, 0xdeadbeef, 4);
    rt_buf_put_uint(b, 0x0102030405060708ull, 8);
    rt_buf_put_bytes(b, "hello", 5);
    rt_buf_put_bytes(b, NULL, 0);
}

static void test_round_trip(void)
{
    rt_buf_t b = {0};
    write_sample(&b);
    CHECK(!b.oom);
    CHECK_EQ(b.len, (size_t)(1 + 2 + 4 + 8 + 4 + 5 + 4));
    CHECK_EQ((uint8_t)b.data[3], 0xde); /* most significant first */
    rt_reader_t r = {.p = (const uint8_t *)b.data, .len = b.len};
    CHECK_EQ(rt_reader_uint(&r, 1), 0xab);
    CHECK_EQ(rt_reader_uint(&r, 2), 0x1234);
    CHECK_EQ(rt_reader_uint(&r, 4), 0xdeadbeef);
    CHECK_EQ(rt_reader_uint(&r, 8), 0x0102030405060708ull);
    size_t n;
    const uint8_t *p = rt_reader_bytes(&r, &n, 16);
    CHECK(p && n == 5 && memcmp(p, "hello", 5) == 0);
    rt_reader_bytes(&r, &n, 16);
    CHECK_EQ(n, 0);
    CHECK(!r.bad && r.at == r.len);
    rt_buf_free(&b);
}

static void test_every_truncation_is_bad(void)
{
    rt_buf_t b = {0};
    write_sample(&b);
    for (size_t cut = 0; cut < b.len; cut++) {
        rt_reader_t r = {.p = (const uint8_t *)b.data, .len = cut};
        size_t n;
        rt_reader_uint(&r, 1);
        rt_reader_uint(&r, 2);
        rt_reader_uint(&r, 4);
        rt_reader_uint(&r, 8);
        rt_reader_bytes(&r, &n, 16);
        rt_reader_bytes(&r, &n, 16);
        CHECK(r.bad);
        CHECK(r.at <= cut);
        CHECK(rt_reader_take(&r, 0) == NULL); /* bad sticks */
        CHECK_EQ(rt_reader_uint(&r, 1), 0);
    }
    rt_buf_free(&b);
}

static void test_count_past_its_bound_is_bad(void)
{
    rt_buf_t b = {0};
    rt_buf_put_bytes(&b, "hello", 5);
    rt_reader_t r = {.p = (const uint8_t *)b.data, .len = b.len};
    size_t n;
    CHECK(rt_reader_bytes(&r, &n, 4) == NULL);
    CHECK(r.bad);
    rt_buf_free(&b);
}

int main(void)
{
    RUN(test_round_trip);
    RUN(test_every_truncation_is_bad);
    RUN(test_count_past_its_bound_is_bad);
    return CHECK_SUMMARY();
}

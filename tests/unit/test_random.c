/* rt_random and rt_random_hex: lengths across the per-thread buffer's refills, the hex form. */
#include <string.h>

#include "rt.h"
#include "rt_test.h"

static void test_bytes(void)
{
    uint8_t a[1000], b[1000];
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    CHECK_EQ(rt_random(a, sizeof(a)), 0); /* past several refills */
    CHECK_EQ(rt_random(b, 3), 0);
    CHECK_EQ(rt_random(b + 3, sizeof(b) - 3), 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    /* 1000 random bytes take every value of a 16-value nibble. */
    unsigned seen = 0;
    for (size_t i = 0; i < sizeof(a); i++)
        seen |= 1u << (a[i] & 15);
    CHECK_EQ(seen, 0xffffu);
    CHECK_EQ(rt_random(a, 0), 0);
}

static void test_hex(void)
{
    char h[65], g[65];
    CHECK_EQ(rt_random_hex(h, 8), 0);
    CHECK_EQ(strlen(h), 16);
    CHECK_EQ(strspn(h, "0123456789abcdef"), 16);
    CHECK_EQ(rt_random_hex(g, 8), 0);
    CHECK(strcmp(h, g) != 0);
    CHECK_EQ(rt_random_hex(h, 32), 0);
    CHECK_EQ(strlen(h), 64);
    CHECK_EQ(rt_random_hex(h, 33), RT_EAGAIN);
}

int main(void)
{
    RUN(test_bytes);
    RUN(test_hex);
    return CHECK_SUMMARY();
}

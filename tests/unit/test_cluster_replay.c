/*
** The replay record (actors/cluster/replay.h), the one codec its writer (durable.c) and its
** reader (conn's session_bytes.c) share: what is put is read back in order and whole, and
** bytes from the network that are no replay or are cut anywhere are refused, never read past.
*/
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "replay.h"

static void test_round_trip(void)
{
    rt_buf_t b = {0};
    rt_replay_start(&b);
    /* PUBLISH packets as bytes, NULs inside: none, QoS 0 "a" "hi", QoS 1 "b" id 1 "xy". */
    const char *pubs[] = {"",
                          "\x30\x05\x00\x01"
                          "a"
                          "hi",
                          "\x32\x07\x00\x01"
                          "b"
                          "\x00\x01"
                          "xy"};
    const uint32_t lens[] = {0, 7, 9};
    for (int i = 0; i < 3; i++)
        rt_replay_put(&b, 0x1122334455667788ull + (uint64_t)i, (uint64_t)i + 1, pubs[i], lens[i]);
    CHECK(!b.oom);
    CHECK(memcmp(b.data, RT_REPLAY_MAGIC, RT_REPLAY_HEAD) == 0);
    size_t at = 0;
    rt_replay_entry_t e;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(rt_replay_next((const uint8_t *)b.data, b.len, &at, &e), 1);
        CHECK_EQ(e.origin_key, 0x1122334455667788ull + (uint64_t)i);
        CHECK_EQ(e.origin_seq, (uint64_t)i + 1);
        CHECK_EQ(e.len, lens[i]);
        CHECK(memcmp(e.publish, pubs[i], lens[i]) == 0);
    }
    CHECK_EQ(rt_replay_next((const uint8_t *)b.data, b.len, &at, &e), 0);
    CHECK_EQ(at, b.len);
    rt_buf_free(&b);
}

/* Every cut of a two-message replay: whole records read, then the end or RT_EPROTO. */
static void test_cut_anywhere(void)
{
    rt_buf_t b = {0};
    rt_replay_start(&b);
    rt_replay_put(&b, 7, 8, "abcdef", 6);
    rt_replay_put(&b, 9, 10, "ghij", 4);
    size_t first_end = RT_REPLAY_HEAD + RT_REPLAY_ENTRY_MIN + 6;
    for (size_t len = 0; len <= b.len; len++) {
        uint8_t *copy = malloc(len ? len : 1); /* ASan sees a read past len */
        memcpy(copy, b.data, len);
        size_t at = 0;
        rt_replay_entry_t e;
        int n = 0, rc;
        while ((rc = rt_replay_next(copy, len, &at, &e)) == 1)
            n++;
        CHECK(at <= len);
        if (len == RT_REPLAY_HEAD || len == first_end || len == b.len)
            CHECK_EQ(rc, 0);
        else
            CHECK_EQ(rc, RT_EPROTO);
        CHECK_EQ(n, len >= b.len ? 2 : len >= first_end ? 1 : 0);
        free(copy);
    }
    rt_buf_free(&b);
}

static void test_not_a_replay(void)
{
    size_t at = 0;
    rt_replay_entry_t e;
    CHECK_EQ(rt_replay_next((const uint8_t *)"RTS1", 4, &at, &e), RT_EPROTO);
    at = 0;
    /* A length that claims more than is there. */
    uint8_t p[RT_REPLAY_HEAD + RT_REPLAY_ENTRY_MIN] = "RTR1";
    p[RT_REPLAY_HEAD + 16] = 0xff;
    CHECK_EQ(rt_replay_next(p, sizeof(p), &at, &e), RT_EPROTO);
}

int main(void)
{
    RUN(test_round_trip);
    RUN(test_cut_anywhere);
    RUN(test_not_a_replay);
    return CHECK_SUMMARY();
}

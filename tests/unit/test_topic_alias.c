/*
** Outbound topic aliases: first use assigns, a commit makes it stick, repeats find it, a full
** table assigns no more, growth keeps every alias, and colliding or near-equal topics stay apart.
** The table lives on its owner's heap (each test runs inside an actor) and its free gives
** that memory back.
*/
#include <stdio.h>
#include <string.h>

#include "rt_test.h"
#include "topic_alias.h"

static uint16_t look(rt_alias_out_t *a, const char *t, bool *fresh)
{
    return rt_alias_out_lookup(a, (const uint8_t *)t, strlen(t), fresh);
}

/* Looks t up and commits a fresh alias, as a connection does once the PUBLISH was written. */
static uint16_t use(rt_alias_out_t *a, const char *t)
{
    bool fresh;
    uint16_t alias = look(a, t, &fresh);
    if (fresh)
        CHECK_EQ(rt_alias_out_commit(a, alias, (const uint8_t *)t, strlen(t)), 0);
    return alias;
}

static uint64_t heap_bytes(rt_actor_t *self)
{
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(rt_self(self), &info), 0);
    return info.heap_bytes;
}

static void assign_and_repeat(rt_actor_t *self)
{
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(self, 0, &a), RT_EINVAL);
    CHECK_EQ(rt_alias_out_new(self, 2, &a), 0);
    bool fresh;
    CHECK_EQ(look(a, "a/b", &fresh), 1);
    CHECK(fresh);
    /* Not committed (the PUBLISH was not sent): the next lookup offers the same alias. */
    CHECK_EQ(look(a, "c/d", &fresh), 1);
    CHECK(fresh);
    CHECK_EQ(use(a, "a/b"), 1);
    CHECK_EQ(look(a, "a/b", &fresh), 1);
    CHECK(!fresh);
    CHECK_EQ(use(a, "c/d"), 2);
    /* Full: a third topic gets none, and the first two keep theirs. */
    CHECK_EQ(look(a, "e/f", &fresh), 0);
    CHECK(!fresh);
    CHECK_EQ(look(a, "c/d", &fresh), 2);
    CHECK(!fresh);
    CHECK_EQ(look(a, "a/b", &fresh), 1);
    /* Prefixes and equal lengths are different topics. */
    CHECK_EQ(look(a, "a/", &fresh), 0);
    CHECK_EQ(look(a, "a/c", &fresh), 0);
    rt_alias_out_free(a);
    rt_alias_out_free(NULL);
}

/*
** A heap keeps at most one empty chunk (1 KiB) per size class after frees (heap.c's avail
** rule), and there are ten classes: what is left after the table is freed.
*/
#define HEAP_KEPT_MAX (10 * 1024)

static void growth_keeps_every_alias(rt_actor_t *self)
{
    enum { MAX = 65535 };
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(self, MAX, &a), 0);
    char t[32];
    int wrong = 0;
    for (int i = 0; i < MAX; i++) {
        snprintf(t, sizeof(t), "sensors/%d/temp", i);
        wrong += use(a, t) != i + 1;
    }
    CHECK_EQ(wrong, 0);
    for (int i = 0; i < MAX; i++) {
        snprintf(t, sizeof(t), "sensors/%d/temp", i);
        bool fresh;
        wrong += look(a, t, &fresh) != i + 1 || fresh;
    }
    CHECK_EQ(wrong, 0);
    bool fresh;
    CHECK_EQ(look(a, "sensors/none", &fresh), 0);
    /* Every topic copy (at least 16 bytes each) and the index are the owner's. */
    CHECK(heap_bytes(self) > (uint64_t)MAX * 16);
    rt_alias_out_free(a);
    CHECK(heap_bytes(self) <= HEAP_KEPT_MAX);
}

/* FNV-1a collides on these two (a known pair): both must keep their own alias. */
static void hash_collision(rt_actor_t *self)
{
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(self, 8, &a), 0);
    const char *x = "costarring", *y = "liquid";
    CHECK_EQ(use(a, x), 1);
    CHECK_EQ(use(a, y), 2);
    bool fresh;
    CHECK_EQ(look(a, x, &fresh), 1);
    CHECK_EQ(look(a, y, &fresh), 2);
    rt_alias_out_free(a);
}

static void test_assign_and_repeat(void)
{
    test_in_actor(assign_and_repeat);
}

static void test_growth_keeps_every_alias(void)
{
    test_in_actor(growth_keeps_every_alias);
}

static void test_hash_collision(void)
{
    test_in_actor(hash_collision);
}

int main(void)
{
    test_start(1);
    RUN(test_assign_and_repeat);
    RUN(test_growth_keeps_every_alias);
    RUN(test_hash_collision);
    rt_shutdown();
    return CHECK_SUMMARY();
}

/*
** Outbound topic aliases: first use assigns, a commit makes it stick, repeats find it, a full
** table assigns no more, growth keeps every alias, and colliding or near-equal topics stay apart.
*/
#include <stdio.h>
#include <string.h>

#include "check.h"
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

static void test_assign_and_repeat(void)
{
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(0, &a), RT_EINVAL);
    CHECK_EQ(rt_alias_out_new(2, &a), 0);
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

static void test_growth_keeps_every_alias(void)
{
    enum { MAX = 65535 };
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(MAX, &a), 0);
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
    rt_alias_out_free(a);
}

/* FNV-1a collides on these two (a known pair): both must keep their own alias. */
static void test_hash_collision(void)
{
    rt_alias_out_t *a;
    CHECK_EQ(rt_alias_out_new(8, &a), 0);
    const char *x = "costarring", *y = "liquid";
    CHECK_EQ(use(a, x), 1);
    CHECK_EQ(use(a, y), 2);
    bool fresh;
    CHECK_EQ(look(a, x, &fresh), 1);
    CHECK_EQ(look(a, y, &fresh), 2);
    rt_alias_out_free(a);
}

int main(void)
{
    RUN(test_assign_and_repeat);
    RUN(test_growth_keeps_every_alias);
    RUN(test_hash_collision);
    return CHECK_SUMMARY();
}

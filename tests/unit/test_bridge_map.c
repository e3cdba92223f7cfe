/*
** A bridge's topic maps (actors/bridge/bridge.h): what "filter -> topic" sends a topic to,
** what it leaves alone, and which maps are refused at start, with the reason.
*/
#include <stdio.h>
#include <string.h>

#include "bridge.h"
#include "check.h"

/* The topic map sends topic to, or NULL when its filter does not match. */
static void expect(const char *map, const char *topic, const char *want)
{
    rt_bridge_map_t m;
    char why[256], out[512];
    CHECK_EQ(rt_bridge_map_parse(map, &m, why, sizeof(why)), 0);
    long n = rt_bridge_map_apply(&m, topic, strlen(topic), out, sizeof(out));
    if (!want) {
        CHECK_EQ(n, -1);
        return;
    }
    CHECK(n >= 0 && (size_t)n < sizeof(out));
    if (n < 0)
        return;
    out[n] = 0;
    if (strcmp(out, want) != 0)
        fprintf(stderr, "%s on %s: %s, not %s\n", map, topic, out, want);
    CHECK(strcmp(out, want) == 0);
}

static void test_prefixes_are_swapped(void)
{
    expect("local/# -> remote/#", "local/a/b", "remote/a/b");
    expect("local/# -> remote/#", "local", "remote");
    expect("local/# -> remote/#", "other/a", NULL);
    expect("sensors/+/t -> x/#", "sensors/a/t", "x/a/t");
    expect("a/b -> x/#", "a/b", "x");
    expect("a/# -> #", "a/b/c", "b/c");
    expect(" a/#  ->  deep/er/# ", "a/1", "deep/er/1");
}

static void test_whole_topics_and_kept_ones(void)
{
    expect("a/+ -> fixed/topic", "a/zz", "fixed/topic");
    expect("alerts/#", "alerts/x/y", "alerts/x/y");
    expect("#", "$SYS/x", NULL); /* '#' does not match $ topics (4.7.2) */
}

static void test_too_small_a_buffer_still_sizes(void)
{
    rt_bridge_map_t m;
    char why[128], out[4];
    CHECK_EQ(rt_bridge_map_parse("a/# -> longer/prefix/#", &m, why, sizeof(why)), 0);
    CHECK_EQ(rt_bridge_map_apply(&m, "a/bcd", 5, out, sizeof(out)),
             (long)strlen("longer/prefix/bcd"));
}

static void refused(const char *map, const char *says)
{
    rt_bridge_map_t m;
    char why[256] = "";
    CHECK_EQ(rt_bridge_map_parse(map, &m, why, sizeof(why)), RT_EINVAL);
    if (!strstr(why, says))
        fprintf(stderr, "%s: \"%s\" does not say \"%s\"\n", map, why, says);
    CHECK(strstr(why, says) != NULL);
}

static void test_bad_maps_are_refused_with_a_reason(void)
{
    refused("a/#/b", "a/#/b");
    refused("", "empty");
    refused(" -> x", "empty");
    refused("$share/g/a", "$share");
    refused("a/# -> b/+", "right side");
    refused("a/# -> b#", "right side");
    refused("a/# -> b/#/c", "right side");
    refused("a/# -> ", "right side");
}

int main(void)
{
    RUN(test_prefixes_are_swapped);
    RUN(test_whole_topics_and_kept_ones);
    RUN(test_too_small_a_buffer_still_sizes);
    RUN(test_bad_maps_are_refused_with_a_reason);
    return CHECK_SUMMARY();
}

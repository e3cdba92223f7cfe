/*
** MQTT topics and filters as NATS subjects (actors/cluster/subject.h): the bytes NATS
** gives a meaning to are escaped, an empty level has a token of its own, a topic maps back
** to exactly itself, a filter's wildcards become NATS's (`a/#` as two subjects), and what
** would pass NATS's line limit is refused rather than cut.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "subject.h"

static void check_topic(const char *topic, const char *want)
{
    char out[RT_SUBJECT_MAX + 1], back[RT_SUBJECT_MAX + 1];
    int n = rt_subject_of_topic("rt", topic, strlen(topic), out, sizeof(out));
    CHECK_EQ(n, (int)strlen(want));
    CHECK(strcmp(out, want) == 0);
    int m = rt_topic_of_subject("rt", out, (size_t)n, back, sizeof(back));
    CHECK_EQ(m, (int)strlen(topic));
    CHECK(m >= 0 && memcmp(back, topic, (size_t)m) == 0);
}

static void test_topics_escape_what_nats_reads(void)
{
    check_topic("a/b", "rt.a.b");
    check_topic("sensor/1/temp", "rt.sensor.1.temp");
    check_topic("a.b/c d", "rt.a%2Eb.c%20d");
    check_topic("*/>", "rt.%2A.%3E");
    check_topic("50%", "rt.50%25");
    check_topic("tab\there", "rt.tab%09here");
    check_topic("$SYS/x", "rt.$SYS.x");
    check_topic("caf\xc3\xa9", "rt.caf\xc3\xa9"); /* UTF-8 goes as it is */
}

static void test_empty_levels_have_a_token(void)
{
    check_topic("/", "rt.%.%");
    check_topic("a//b/", "rt.a.%.b.%");
    check_topic("/lead", "rt.%.lead");
}

static void test_filters_map_wildcards(void)
{
    char s[2][RT_SUBJECT_MAX + 1];
    CHECK_EQ(rt_subjects_of_filter("rt", "a/+/c", 5, s), 1);
    CHECK(strcmp(s[0], "rt.a.*.c") == 0);
    CHECK_EQ(rt_subjects_of_filter("rt", "#", 1, s), 1);
    CHECK(strcmp(s[0], "rt.>") == 0);
    /* MQTT's a/# matches a itself: NATS's a.> does not. */
    CHECK_EQ(rt_subjects_of_filter("rt", "a/#", 3, s), 2);
    CHECK(strcmp(s[0], "rt.a.>") == 0);
    CHECK(strcmp(s[1], "rt.a") == 0);
    CHECK_EQ(rt_subjects_of_filter("rt", "+/#", 3, s), 2);
    CHECK(strcmp(s[0], "rt.*.>") == 0);
    CHECK(strcmp(s[1], "rt.*") == 0);
    CHECK_EQ(rt_subjects_of_filter("rt", "a.b/ /+", 7, s), 1);
    CHECK(strcmp(s[0], "rt.a%2Eb.%20.*") == 0);
    CHECK_EQ(rt_subjects_of_filter("rt", "a//#", 4, s), 2);
    CHECK(strcmp(s[0], "rt.a.%.>") == 0);
    CHECK(strcmp(s[1], "rt.a.%") == 0);
}

static void test_foreign_subjects_are_refused(void)
{
    char out[64];
    const char *bad[] = {"rt",    "other.a", "rt.",    "rt.a..b", "rt.a.",
                         "rt.%2", "rt.%zz",  "rt.%41", "rt.a b",  "rtx.a"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int n = rt_topic_of_subject("rt", bad[i], strlen(bad[i]), out, sizeof(out));
        if (n >= 0)
            fprintf(stderr, "accepted %s\n", bad[i]);
        CHECK(n < 0);
    }
}

static void test_too_long_is_refused(void)
{
    size_t len = RT_SUBJECT_MAX; /* every byte escaped: three times as long */
    char *topic = malloc(len), out[RT_SUBJECT_MAX + 1];
    memset(topic, '.', len);
    CHECK_EQ(rt_subject_of_topic("rt", topic, len, out, sizeof(out)), -1);
    char s[2][RT_SUBJECT_MAX + 1];
    CHECK_EQ(rt_subjects_of_filter("rt", topic, len, s), -1);
    /* The longest plain topic that fits, with the prefix and its dot. */
    memset(topic, 'x', len);
    CHECK_EQ(rt_subject_of_topic("rt", topic, RT_SUBJECT_MAX - 3, out, sizeof(out)),
             RT_SUBJECT_MAX);
    CHECK_EQ(rt_subject_of_topic("rt", topic, RT_SUBJECT_MAX - 2, out, sizeof(out)), -1);
    /* A buffer too small for the topic back. */
    CHECK_EQ(rt_topic_of_subject("rt", "rt.abcdef", 9, out, 3), -1);
    free(topic);
}

static void check_key(const char *topic, const char *want)
{
    char out[256], back[256];
    int n = rt_kv_key_of_topic(topic, strlen(topic), out, sizeof(out));
    CHECK_EQ(n, (int)strlen(want));
    CHECK(strcmp(out, want) == 0);
    int m = rt_topic_of_kv_key(out, (size_t)n, back, sizeof(back));
    CHECK_EQ(m, (int)strlen(topic));
    CHECK(m >= 0 && memcmp(back, topic, (size_t)m) == 0);
}

/* KV keys take [-/_=.A-Za-z0-9]: the rest, and = and . themselves, are =XX. */
static void test_kv_keys(void)
{
    check_key("sensor/1/temp", "sensor/1/temp");
    check_key("a.b", "a=2Eb");
    check_key("x=y z", "x=3Dy=20z");
    check_key("//", "//");
    check_key("caf\xc3\xa9", "caf=C3=A9");
    check_key("client-id_7", "client-id_7");
    char out[8];
    CHECK_EQ(rt_kv_key_of_topic("abcdefgh", 8, out, sizeof(out)), -1); /* no room for the NUL */
    CHECK_EQ(rt_kv_key_of_topic("abc.", 4, out, 6), -1);
    CHECK_EQ(rt_topic_of_kv_key("a=2", 3, out, sizeof(out)), -1);
    CHECK_EQ(rt_topic_of_kv_key("a=zz", 4, out, sizeof(out)), -1);
}

int main(void)
{
    RUN(test_kv_keys);
    RUN(test_topics_escape_what_nats_reads);
    RUN(test_empty_levels_have_a_token);
    RUN(test_filters_map_wildcards);
    RUN(test_foreign_subjects_are_refused);
    RUN(test_too_long_is_refused);
    return CHECK_SUMMARY();
}

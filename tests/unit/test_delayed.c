/*
** Delayed publish's list (actors/conn/delayed.c) without its actor: the $delayed topic read
** and refused as EMQX reads it, messages listed earliest first whatever order they came in
** (ties by arrival), max_delayed and max_delayed_bytes refusing and a delete making room.
*/
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "check.h"
#include "config.h"
#include "delayed.h"
#include "message.h"

static int split(const char *topic, uint32_t *seconds, char *rest)
{
    mqtt_str_t t = {(const uint8_t *)topic, (uint32_t)strlen(topic)};
    CHECK(rt_delayed_wanted(&t));
    int rc = rt_delayed_split(&t, seconds);
    if (rc == 0) {
        memcpy(rest, t.p, t.len);
        rest[t.len] = 0;
    }
    return rc;
}

static void test_topics(void)
{
    uint32_t s;
    char rest[64];
    CHECK_EQ(split("$delayed/15/a/b", &s, rest), 0);
    CHECK_EQ(s, 15u);
    CHECK(strcmp(rest, "a/b") == 0);
    CHECK_EQ(split("$delayed/0/x", &s, rest), 0);
    CHECK_EQ(s, 0u);
    CHECK_EQ(split("$delayed/4294967/$x", &s, rest), 0); /* the longest; what follows is a topic */
    CHECK_EQ(s, 4294967u);
    const char *bad[] = {
        "$delayed/4294968/x", "$delayed/x/y",           "$delayed//y",  "$delayed/5", "$delayed/5/",
        "$delayed/",          "$delayed/12345678901/x", "$delayed/+5/x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        CHECK_EQ(split(bad[i], &s, rest), RT_EINVAL);
    mqtt_str_t other = {(const uint8_t *)"$delay/5/x", 10};
    CHECK(!rt_delayed_wanted(&other));
}

static rt_bin_t *message(const char *topic, size_t payload)
{
    static uint8_t zeros[4096];
    mqtt_packet_t pk = {.type = MQTT_PUBLISH};
    pk.publish.topic = (mqtt_str_t){(const uint8_t *)topic, (uint32_t)strlen(topic)};
    pk.publish.payload = (mqtt_str_t){zeros, (uint32_t)payload};
    rt_bin_t *bin = rt_message_new(&pk, "c", NULL);
    CHECK(bin != NULL);
    return bin;
}

static int add(const char *topic, uint32_t seconds, size_t payload)
{
    rt_bin_t *bin = message(topic, payload);
    uint32_t waits = 7;
    int rc = rt_delayed_add(bin, seconds, 0, 0, &waits);
    CHECK_EQ(waits, 0u); /* no store: nothing to wait for */
    rt_bin_release(bin);
    return rc;
}

typedef struct {
    char topics[16][16];
    uint64_t ids[16];
    int n;
} seen_t;

static void see(const rt_delayed_entry_t *e, void *arg)
{
    seen_t *s = arg;
    rt_message_t m;
    rt_message_view(e->bin, &m);
    memcpy(s->topics[s->n], m.topic.p, m.topic.len);
    s->topics[s->n][m.topic.len] = 0;
    s->ids[s->n++] = e->id;
}

static void test_order_bounds_and_delete(void)
{
    const char *topics[] = {"t/30", "t/5", "t/60", "t/5b", "t/1"};
    const uint32_t delays[] = {30, 5, 60, 5, 1};
    for (int i = 0; i < 5; i++)
        CHECK_EQ(add(topics[i], delays[i], 10), 0);
    seen_t s = {0};
    CHECK_EQ(rt_delayed_each(see, &s, 100), 5u);
    const char *want[] = {"t/1", "t/5", "t/5b", "t/30", "t/60"};
    for (int i = 0; i < 5; i++)
        CHECK(strcmp(s.topics[i], want[i]) == 0);
    seen_t two = {0};
    rt_delayed_each(see, &two, 2);
    CHECK_EQ(two.n, 2);

    atomic_store(&rt_broker->live.max_delayed, 5);
    CHECK_EQ(add("t/full", 1, 10), RT_ELIMIT);
    CHECK_EQ(rt_delayed_del(s.ids[2]), 0); /* t/5b */
    CHECK_EQ(rt_delayed_del(s.ids[2]), RT_ENOTFOUND);
    CHECK_EQ(add("t/room", 2, 10), 0);
    seen_t after = {0};
    rt_delayed_each(see, &after, 100);
    CHECK(strcmp(after.topics[1], "t/room") == 0);
    CHECK(strcmp(after.topics[2], "t/5") == 0);

    rt_delayed_stats_t st;
    rt_delayed_stats(&st);
    atomic_store(&rt_broker->live.max_delayed, 100);
    atomic_store(&rt_broker->live.max_delayed_bytes, (long)st.bytes + 100);
    CHECK_EQ(add("t/big", 1, 1000), RT_ELIMIT);
    CHECK_EQ(add("t/small", 1, 0), 0);
    rt_delayed_stats(&st);
    CHECK_EQ(st.held, 6u);
    CHECK_EQ(st.refused_limit, 2u);
    CHECK_EQ(st.deleted, 1u);
    rt_delayed_free();
    rt_delayed_stats(&st);
    CHECK_EQ(st.held, 0u);
    CHECK_EQ(st.bytes, 0u);
}

int main(void)
{
    rt_conf_t *c = calloc(1, sizeof(*c));
    rt_conf_defaults(c);
    CHECK_EQ(rt_broker_init(c), 0);
    free(c);
    RUN(test_topics);
    RUN(test_order_bounds_and_delete);
    rt_broker_free();
    return CHECK_SUMMARY();
}

/*
** What a message decoded once saves, per delivery and per routing: one subscriber's
** PUBLISH written from the canonical message's offsets (rt_message_view + rt_message_encode)
** against the path the broker took before (mqtt_decode of the canonical binary, then
** mqtt_encode twice: to size, then to write). Also routing's read of topic, QoS and expiry.
** The message is an MQTT 5 PUBLISH with a user property and a content type, sent to an MQTT 5
** subscriber with a subscription identifier and a remaining expiry, and to an MQTT 3.1.1 one.
**
**   bench_message [--quick]
*/
#include <stdio.h>
#include <string.h>

#include "message.h"

#define BENCH_OUT_MAX 2048

static volatile size_t sink_bytes; /* keeps the compiler from dropping the work */

/* The old subscriber path: decode the canonical binary, then size and write. */
static size_t old_encode(rt_bin_t *bin, uint8_t version, uint32_t sub_id, uint8_t *out)
{
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return 0;
    pk.version = version;
    pk.publish.qos = 1;
    pk.packet_id = 7;
    pk.props.message_expiry = 30;
    pk.props.present |= MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY);
    pk.props.sub_ids = &sub_id;
    pk.props.n_sub_ids = version == MQTT_V5;
    size_t len;
    if (mqtt_encode(&pk, NULL, 0, 0, &len, NULL) != 0 || len > BENCH_OUT_MAX ||
        mqtt_encode(&pk, out, len, 0, &len, NULL) != 0)
        return 0;
    return len;
}

static size_t new_encode(rt_bin_t *bin, uint8_t version, uint32_t sub_id, uint8_t *out)
{
    rt_message_t m;
    rt_message_view(bin, &m);
    rt_message_out_t o = {.version = version,
                          .qos = 1,
                          .packet_id = 7,
                          .expiry_left = 30,
                          .has_expiry_left = true,
                          .sub_ids = &sub_id,
                          .n_sub_ids = version == MQTT_V5};
    size_t len = rt_message_encode(&m, &o, NULL, 0);
    if (len > BENCH_OUT_MAX)
        return 0;
    return rt_message_encode(&m, &o, out, len);
}

static size_t old_route_read(rt_bin_t *bin)
{
    mqtt_packet_t pk;
    if (mqtt_decode(rt_bin_data(bin), rt_bin_len(bin), MQTT_V5, &pk) != 0)
        return 0;
    return pk.publish.topic.len + pk.publish.qos + pk.props.message_expiry;
}

static size_t new_route_read(rt_bin_t *bin)
{
    rt_message_t m;
    rt_message_view(bin, &m);
    return m.topic.len + m.qos + m.expiry;
}

static double ns_per_op(size_t (*fn)(rt_bin_t *, uint8_t, uint32_t, uint8_t *), rt_bin_t *bin,
                        uint8_t version, long n)
{
    uint8_t out[BENCH_OUT_MAX];
    uint64_t t0 = rt_mono_ns();
    size_t total = 0;
    for (long i = 0; i < n; i++)
        total += fn(bin, version, (uint32_t)(i & 1023) + 1, out);
    sink_bytes = total;
    return (double)(rt_mono_ns() - t0) / (double)n;
}

static double ns_per_read(size_t (*fn)(rt_bin_t *), rt_bin_t *bin, long n)
{
    uint64_t t0 = rt_mono_ns();
    size_t total = 0;
    for (long i = 0; i < n; i++)
        total += fn(bin);
    sink_bytes = total;
    return (double)(rt_mono_ns() - t0) / (double)n;
}

int main(int argc, char **argv)
{
    long n = argc > 1 && strcmp(argv[1], "--quick") == 0 ? 20000 : 2000000;
    static uint8_t payload[1024];
    memset(payload, 'x', sizeof(payload));
    mqtt_user_prop_t user = {{(const uint8_t *)"site", 4}, {(const uint8_t *)"north-7", 7}};
    int rc = 0;
    for (size_t size = 16; size <= 1024; size *= 64) {
        mqtt_packet_t pk = {.type = MQTT_PUBLISH, .version = MQTT_V5};
        pk.publish.topic = (mqtt_str_t){(const uint8_t *)"sensors/building-4/floor-2/temp", 31};
        pk.publish.payload = (mqtt_str_t){payload, (uint32_t)size};
        pk.publish.qos = 1;
        pk.packet_id = 1;
        pk.props.present = MQTT_PROP_BIT(MQTT_PROP_CONTENT_TYPE) |
                           MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY);
        pk.props.content_type = (mqtt_str_t){(const uint8_t *)"application/json", 16};
        pk.props.message_expiry = 60;
        pk.props.users = &user;
        pk.props.n_users = 1;
        rt_bin_t *bin = rt_message_new(&pk, "client-1", "alice");
        uint8_t a[BENCH_OUT_MAX], b[BENCH_OUT_MAX];
        size_t la = bin ? old_encode(bin, MQTT_V5, 5, a) : 0;
        size_t lb = bin ? new_encode(bin, MQTT_V5, 5, b) : 0;
        /* Both write a valid PUBLISH of one size (property order may differ). */
        mqtt_packet_t check;
        if (!la || la != lb || mqtt_decode(b, lb, MQTT_V5, &check) != 0 ||
            check.publish.payload.len != size || check.props.sub_id != 5) {
            fprintf(stderr, "bench_message: the two paths disagree (%zu vs %zu bytes)\n", la, lb);
            rc = 1;
        }
        for (uint8_t v = MQTT_V311; v <= MQTT_V5; v++) {
            double old_ns = ns_per_op(old_encode, bin, v, n);
            double new_ns = ns_per_op(new_encode, bin, v, n);
            printf("subscriber v%s, %4zu B payload: decode+encode %6.1f ns, view+encode %6.1f ns "
                   "(%.2fx)\n",
                   v == MQTT_V5 ? "5  " : "3.1.1", size, old_ns, new_ns, old_ns / new_ns);
        }
        double old_r = ns_per_read(old_route_read, bin, n);
        double new_r = ns_per_read(new_route_read, bin, n);
        printf("routing read,     %4zu B payload: decode %6.1f ns, view %6.1f ns (%.2fx)\n", size,
               old_r, new_r, old_r / new_r);
        rt_bin_release(bin);
    }
    return rc;
}

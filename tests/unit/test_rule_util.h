/* Helpers shared by the rule tests: PUBLISH packets and reading rows back from BSON. */
#ifndef RT_TEST_RULE_UTIL_H
#define RT_TEST_RULE_UTIL_H

#include <bson/bson.h>
#include <string.h>

#include "message.h"
#include "rt.h"
#include "rule_vm.h"

/* The canonical message (message.h) of a PUBLISH with optional user properties. */
static inline rt_bin_t *make_publish(const char *topic, const void *payload, size_t len, int qos,
                                     const mqtt_user_prop_t *users, uint16_t nusers)
{
    mqtt_packet_t pk;
    memset(&pk, 0, sizeof(pk));
    pk.type = MQTT_PUBLISH;
    pk.version = MQTT_V5;
    pk.packet_id = qos ? 1 : 0;
    pk.publish.topic = (mqtt_str_t){(const uint8_t *)topic, (uint32_t)strlen(topic)};
    pk.publish.payload = (mqtt_str_t){payload, (uint32_t)len};
    pk.publish.qos = (uint8_t)qos;
    pk.props.users = users;
    pk.props.n_users = nusers;
    return rt_message_new(&pk, NULL, NULL);
}

/* A PUBLISH as a rule sees it (rule_vm.h), from client c1 (user u1). */
static inline rt_rule_input_t msg_in(const char *topic, const char *payload)
{
    rt_rule_input_t in = {.topic = topic,
                          .topic_len = strlen(topic),
                          .payload = (const uint8_t *)payload,
                          .payload_len = strlen(payload),
                          .qos = 1,
                          .retain = 0,
                          .clientid = "c1",
                          .username = "u1",
                          .peer = "10.0.0.1:5555",
                          .ts_ms = 1700000000123ull,
                          .reason_code = -1,
                          .proto_ver = -1,
                          .keepalive = -1,
                          .clean_start = -1};
    return in;
}

/* The first row of a rule's output (BSON documents back to back). */
static inline const uint8_t *rows_data(const rt_buf_t *rows)
{
    return (const uint8_t *)rows->data;
}

/* The string field key of the BSON document at p, copied into out ("" if absent). */
static inline const char *row_str(const uint8_t *p, const char *key, char *out, size_t cap)
{
    bson_t doc;
    bson_iter_t it;
    int32_t len;
    memcpy(&len, p, 4);
    out[0] = 0;
    if (bson_init_static(&doc, p, (size_t)len) && bson_iter_init_find(&it, &doc, key) &&
        BSON_ITER_HOLDS_UTF8(&it)) {
        uint32_t n;
        const char *s = bson_iter_utf8(&it, &n);
        snprintf(out, cap, "%.*s", (int)n, s);
    }
    return out;
}

/* The integer field key (int32 or int64) of the document at p, or -999999. */
static inline long long row_int(const uint8_t *p, const char *key)
{
    bson_t doc;
    bson_iter_t it;
    int32_t len;
    memcpy(&len, p, 4);
    if (bson_init_static(&doc, p, (size_t)len) && bson_iter_init_find(&it, &doc, key) &&
        (BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it)))
        return bson_iter_as_int64(&it);
    return -999999;
}

/* The document after the one at p. */
static inline const uint8_t *row_next(const uint8_t *p)
{
    int32_t len;
    memcpy(&len, p, 4);
    return p + len;
}

#endif

/*
** Tests for the MQTT codec: byte-exact packets written by hand from the spec's layouts,
** round trips of every packet type in every version, framing at every split point and over
** several packets, each malformed case with the reason code the spec gives, maximum packet
** size both ways, and a bounded mutation fuzz loop (deterministic seed) that copies each
** input into an exact-size heap block so ASan catches any read past its end.
*/
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mqtt_codec.h"

#define S(lit) ((mqtt_str_t){(const uint8_t *)(lit), sizeof(lit) - 1})

static int str_eq(mqtt_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && (n == 0 || memcmp(s.p, lit, n) == 0);
}

/* Decodes exactly the given bytes from an exact-size heap copy (so ASan sees overreads). */
static int decode_copy(const uint8_t *b, size_t n, uint8_t version, mqtt_packet_t *pk,
                       uint8_t **keep)
{
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, b, n);
    int rc = mqtt_decode(c, n, version, pk);
    if (keep)
        *keep = c;
    else
        free(c);
    return rc;
}

static int decode_bytes(const uint8_t *b, size_t n, uint8_t version)
{
    mqtt_packet_t pk;
    return decode_copy(b, n, version, &pk, NULL);
}

/* ---------------------------------------------------------------- sample packets */

static const mqtt_user_prop_t users[] = {{{(const uint8_t *)"k1", 2}, {(const uint8_t *)"v1", 2}},
                                         {{(const uint8_t *)"k2", 2}, {(const uint8_t *)"", 0}}};
static const uint32_t sub_ids[] = {1, 300, 268435455};
static const mqtt_sub_t subs[] = {
    {{(const uint8_t *)"a/+/c", 5}, 0x01},
    {{(const uint8_t *)"#", 1}, 0x02},
    {{(const uint8_t *)"$share/g/x/#", 12}, 0x00},
};
static const mqtt_sub_t subs_v5[] = {
    {{(const uint8_t *)"a/+/c", 5}, 0x01 | MQTT_SUB_NO_LOCAL | MQTT_SUB_RETAIN_AS_PUBLISHED},
    {{(const uint8_t *)"#", 1}, 0x02 | 0x20},
    {{(const uint8_t *)"$share/g/x/#", 12}, 0x10},
};

/* A representative packet of each type for a version, with every property it may carry. */
static void make_packet(uint8_t type, uint8_t version, mqtt_packet_t *pk)
{
    int v5 = version == MQTT_V5;
    memset(pk, 0, sizeof *pk);
    pk->type = type;
    pk->version = version;
    mqtt_props_t *pr = &pk->props;
    if (v5 && type != MQTT_PINGREQ && type != MQTT_PINGRESP) {
        pr->users = users;
        pr->n_users = 2;
    }
    switch (type) {
    case MQTT_CONNECT:
        pk->connect.clean_start = 1;
        pk->connect.keepalive = 60;
        pk->connect.client_id = S("client-1");
        pk->connect.will = 1;
        pk->connect.will_qos = 1;
        pk->connect.will_retain = 1;
        pk->connect.will_topic = S("will/t");
        pk->connect.will_payload = S("bye");
        pk->connect.has_username = 1;
        pk->connect.username = S("user");
        pk->connect.has_password = 1;
        pk->connect.password = S("p\0w");
        if (v5) {
            pr->present = MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY) |
                          MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM) |
                          MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE) |
                          MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS_MAXIMUM) |
                          MQTT_PROP_BIT(MQTT_PROP_REQUEST_RESPONSE_INFO) |
                          MQTT_PROP_BIT(MQTT_PROP_REQUEST_PROBLEM_INFO) |
                          MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD) | MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA);
            pr->session_expiry = 0xFFFFFFFF;
            pr->receive_maximum = 20;
            pr->maximum_packet_size = 65536;
            pr->topic_alias_maximum = 10;
            pr->request_response_info = 1;
            pr->request_problem_info = 0;
            pr->auth_method = S("SCRAM-SHA-1");
            pr->auth_data = S("\x01\x02");
            mqtt_props_t *w = &pk->connect.will_props;
            w->present =
                MQTT_PROP_BIT(MQTT_PROP_WILL_DELAY) | MQTT_PROP_BIT(MQTT_PROP_PAYLOAD_FORMAT) |
                MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY) | MQTT_PROP_BIT(MQTT_PROP_CONTENT_TYPE) |
                MQTT_PROP_BIT(MQTT_PROP_RESPONSE_TOPIC) | MQTT_PROP_BIT(MQTT_PROP_CORRELATION_DATA);
            w->will_delay = 5;
            w->payload_format = 1;
            w->message_expiry = 3600;
            w->content_type = S("text/plain");
            w->response_topic = S("resp/t");
            w->correlation_data = S("\x00\xff");
            w->users = users;
            w->n_users = 1;
        }
        break;
    case MQTT_CONNACK:
        pk->connack.session_present = 1;
        if (v5) {
            pr->present =
                MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY) |
                MQTT_PROP_BIT(MQTT_PROP_ASSIGNED_CLIENT_ID) |
                MQTT_PROP_BIT(MQTT_PROP_SERVER_KEEPALIVE) | MQTT_PROP_BIT(MQTT_PROP_RESPONSE_INFO) |
                MQTT_PROP_BIT(MQTT_PROP_SERVER_REFERENCE) | MQTT_PROP_BIT(MQTT_PROP_REASON_STRING) |
                MQTT_PROP_BIT(MQTT_PROP_RECEIVE_MAXIMUM) |
                MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS_MAXIMUM) |
                MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_QOS) | MQTT_PROP_BIT(MQTT_PROP_RETAIN_AVAILABLE) |
                MQTT_PROP_BIT(MQTT_PROP_MAXIMUM_PACKET_SIZE) |
                MQTT_PROP_BIT(MQTT_PROP_WILDCARD_SUB_AVAILABLE) |
                MQTT_PROP_BIT(MQTT_PROP_SUB_ID_AVAILABLE) |
                MQTT_PROP_BIT(MQTT_PROP_SHARED_SUB_AVAILABLE) |
                MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD) | MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA);
            pr->session_expiry = 7;
            pr->assigned_client_id = S("auto-1234");
            pr->server_keepalive = 30;
            pr->response_info = S("resp/");
            pr->server_reference = S("other:1883");
            pr->reason_string = S("welcome");
            pr->receive_maximum = 100;
            pr->topic_alias_maximum = 16;
            pr->maximum_qos = 1;
            pr->retain_available = 1;
            pr->maximum_packet_size = 1 << 20;
            pr->wildcard_sub_available = 1;
            pr->sub_id_available = 0;
            pr->shared_sub_available = 1;
            pr->auth_method = S("m");
            pr->auth_data = S("d");
        }
        break;
    case MQTT_PUBLISH:
        pk->publish.topic = S("sensors/1/temp");
        pk->publish.payload = S("21.5");
        pk->publish.qos = 2;
        pk->publish.dup = 1;
        pk->publish.retain = 1;
        pk->packet_id = 0x1234;
        if (v5) {
            pr->present =
                MQTT_PROP_BIT(MQTT_PROP_PAYLOAD_FORMAT) | MQTT_PROP_BIT(MQTT_PROP_MESSAGE_EXPIRY) |
                MQTT_PROP_BIT(MQTT_PROP_CONTENT_TYPE) | MQTT_PROP_BIT(MQTT_PROP_RESPONSE_TOPIC) |
                MQTT_PROP_BIT(MQTT_PROP_CORRELATION_DATA) | MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS);
            pr->payload_format = 1;
            pr->message_expiry = 60;
            pr->content_type = S("text/plain");
            pr->response_topic = S("reply/here");
            pr->correlation_data = S("\x00\x01\x02");
            pr->topic_alias = 3;
            pr->sub_ids = sub_ids;
            pr->n_sub_ids = 3;
        }
        break;
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
        pk->packet_id = 7;
        if (v5) {
            pk->reason = type == MQTT_PUBREL || type == MQTT_PUBCOMP ? 0x92 : 0x10;
            pr->present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
            pr->reason_string = S("why");
        }
        break;
    case MQTT_SUBSCRIBE:
    case MQTT_UNSUBSCRIBE:
        pk->packet_id = 9;
        pk->sub.items = v5 ? subs_v5 : subs;
        pk->sub.count = 3;
        if (v5 && type == MQTT_SUBSCRIBE) {
            pr->present = MQTT_PROP_BIT(MQTT_PROP_SUB_ID);
            pr->sub_ids = sub_ids + 1;
            pr->n_sub_ids = 1;
        }
        break;
    case MQTT_SUBACK:
        pk->packet_id = 9;
        pk->codes = v5 ? S("\x00\x01\x02\x80\x8f\xa2") : S("\x00\x01\x02\x80");
        if (v5) {
            pr->present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
            pr->reason_string = S("some refused");
        }
        break;
    case MQTT_UNSUBACK:
        pk->packet_id = 9;
        if (v5) {
            pk->codes = S("\x00\x11\x87");
            pr->present = MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
            pr->reason_string = S("r");
        }
        break;
    case MQTT_DISCONNECT:
        if (v5) {
            pk->reason = MQTT_RC_SESSION_TAKEN_OVER;
            pr->present = MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY) |
                          MQTT_PROP_BIT(MQTT_PROP_REASON_STRING) |
                          MQTT_PROP_BIT(MQTT_PROP_SERVER_REFERENCE);
            pr->session_expiry = 0;
            pr->reason_string = S("bye");
            pr->server_reference = S("srv2");
        }
        break;
    case MQTT_AUTH:
        pk->reason = MQTT_RC_CONTINUE_AUTH;
        pr->present = MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD) | MQTT_PROP_BIT(MQTT_PROP_AUTH_DATA) |
                      MQTT_PROP_BIT(MQTT_PROP_REASON_STRING);
        pr->auth_method = S("SCRAM-SHA-1");
        pr->auth_data = S("nonce");
        pr->reason_string = S("go on");
        break;
    }
}

/* Encodes into a fresh buffer; returns the size or 0 on failure (recorded as a CHECK). */
static size_t encode(const mqtt_packet_t *pk, uint8_t *buf, size_t cap)
{
    size_t len = 0, qlen = 0;
    int rc = mqtt_encode(pk, NULL, 0, 0, &qlen, NULL);
    CHECK_EQ(rc, 0);
    rc = mqtt_encode(pk, buf, cap, 0, &len, NULL);
    CHECK_EQ(rc, 0);
    CHECK_EQ(len, qlen);
    return rc ? 0 : len;
}

/* ---------------------------------------------------------------- byte-exact packets */

static void test_spec_bytes(void)
{
    mqtt_packet_t pk;
    uint8_t out[256];

    /* 3.1.1 CONNECT, clean session, keepalive 60, client id "clid" (3.1.1 3.1.2.10). */
    static const uint8_t c311[] = {0x10, 0x10, 0,  4, 'M', 'Q', 'T', 'T', 4,
                                   0x02, 0,    60, 0, 4,   'c', 'l', 'i', 'd'};
    CHECK_EQ(decode_bytes(c311, sizeof c311, 0), 0);
    CHECK_EQ(mqtt_decode(c311, sizeof c311, 0, &pk), 0);
    CHECK_EQ(pk.type, MQTT_CONNECT);
    CHECK_EQ(pk.version, MQTT_V311);
    CHECK_EQ(pk.connect.keepalive, 60);
    CHECK(pk.connect.clean_start && !pk.connect.will && !pk.connect.has_username);
    CHECK(str_eq(pk.connect.client_id, "clid"));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof c311);
    CHECK(memcmp(out, c311, sizeof c311) == 0);

    /* The 3.1.1 spec's CONNECT variable header example (3.1.2.10, Figure 3.6): flags 0xCE
    ** (user name, password, will QoS 1, will, clean session), keepalive 10. */
    static const uint8_t cex[] = {0x10, 0x1b, 0,   4, 'M', 'Q', 'T', 'T', 4,   0xCE,
                                  0,    10,   0,   2, 'i', 'd', 0,   1,   't', 0,
                                  2,    'w',  'm', 0, 1,   'u', 0,   1,   'p'};
    CHECK_EQ(mqtt_decode(cex, sizeof cex, 0, &pk), 0);
    CHECK(pk.connect.will && pk.connect.will_qos == 1 && !pk.connect.will_retain);
    CHECK(pk.connect.clean_start && pk.connect.has_username && pk.connect.has_password);
    CHECK_EQ(pk.connect.keepalive, 10);
    CHECK(str_eq(pk.connect.will_topic, "t") && str_eq(pk.connect.will_payload, "wm"));
    CHECK(str_eq(pk.connect.username, "u") && str_eq(pk.connect.password, "p"));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof cex);
    CHECK(memcmp(out, cex, sizeof cex) == 0);

    /* MQTT 3.1 CONNECT: "MQIsdp", level 3, user name and password. */
    static const uint8_t c31[] = {0x10, 0x18, 0, 6,   'M', 'Q', 'I', 's', 'd', 'p', 3, 0xC2, 0,
                                  10,   0,    2, 'i', 'd', 0,   2,   'u', 'n', 0,   2, 'p',  'w'};
    CHECK_EQ(mqtt_decode(c31, sizeof c31, 0, &pk), 0);
    CHECK_EQ(pk.version, MQTT_V31);
    CHECK(str_eq(pk.connect.username, "un") && str_eq(pk.connect.password, "pw"));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof c31);
    CHECK(memcmp(out, c31, sizeof c31) == 0);

    /* v5 CONNECT with Session Expiry Interval 10 (3.1.2.11.2). */
    static const uint8_t c5[] = {0x10, 0x15, 0, 4, 'M', 'Q', 'T', 'T', 5,   0x02, 0,  60,
                                 5,    0x11, 0, 0, 0,   10,  0,   3,   'a', 'b',  'c'};
    CHECK_EQ(mqtt_decode(c5, sizeof c5, 0, &pk), 0);
    CHECK_EQ(pk.version, MQTT_V5);
    CHECK_EQ(pk.props.session_expiry, 10);
    CHECK(pk.props.present == MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof c5);
    CHECK(memcmp(out, c5, sizeof c5) == 0);

    /* CONNACK: 3.1.1 session present, v5 success without properties. */
    static const uint8_t ca4[] = {0x20, 2, 1, 0};
    CHECK_EQ(mqtt_decode(ca4, 4, MQTT_V311, &pk), 0);
    CHECK(pk.connack.session_present == 1 && pk.reason == 0);
    static const uint8_t ca5[] = {0x20, 3, 0, 0x85, 0};
    CHECK_EQ(mqtt_decode(ca5, 5, MQTT_V5, &pk), 0);
    CHECK_EQ(pk.reason, MQTT_RC_CLIENT_ID_INVALID);
    CHECK_EQ(encode(&pk, out, sizeof out), 5);
    CHECK(memcmp(out, ca5, 5) == 0);

    /* PUBLISH QoS 1 "a/b" id 1 payload "hi" (3.3). */
    static const uint8_t pub[] = {0x32, 9, 0, 3, 'a', '/', 'b', 0, 1, 'h', 'i'};
    CHECK_EQ(mqtt_decode(pub, sizeof pub, MQTT_V311, &pk), 0);
    CHECK(pk.publish.qos == 1 && !pk.publish.retain && !pk.publish.dup && pk.packet_id == 1);
    CHECK(str_eq(pk.publish.topic, "a/b") && str_eq(pk.publish.payload, "hi"));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof pub);
    CHECK(memcmp(out, pub, sizeof pub) == 0);
    /* v5 PUBLISH QoS 0 with empty topic and Topic Alias 2 (3.3.2.3.4). */
    static const uint8_t pub5[] = {0x30, 6, 0, 0, 3, 0x23, 0, 2};
    CHECK_EQ(mqtt_decode(pub5, sizeof pub5, MQTT_V5, &pk), 0);
    CHECK(pk.publish.topic.len == 0 && pk.props.topic_alias == 2 && pk.publish.payload.len == 0);

    /* Acks: 3.1.1 PUBACK; v5 PUBACK with reason only; v5 PUBREL (flags 0010). */
    static const uint8_t pa[] = {0x40, 2, 0, 1};
    CHECK_EQ(mqtt_decode(pa, 4, MQTT_V311, &pk), 0);
    CHECK(pk.type == MQTT_PUBACK && pk.packet_id == 1);
    CHECK_EQ(mqtt_decode(pa, 4, MQTT_V5, &pk), 0);
    CHECK_EQ(pk.reason, 0);
    CHECK_EQ(encode(&pk, out, sizeof out), 4);
    static const uint8_t pa5[] = {0x40, 3, 0, 1, 0x10};
    CHECK_EQ(mqtt_decode(pa5, 5, MQTT_V5, &pk), 0);
    CHECK_EQ(pk.reason, MQTT_RC_NO_MATCHING_SUBSCRIBERS);
    CHECK_EQ(encode(&pk, out, sizeof out), 5);
    CHECK(memcmp(out, pa5, 5) == 0);
    static const uint8_t prel[] = {0x62, 2, 0, 5};
    CHECK_EQ(mqtt_decode(prel, 4, MQTT_V311, &pk), 0);
    CHECK_EQ(pk.type, MQTT_PUBREL);
    CHECK_EQ(encode(&pk, out, sizeof out), 4);
    CHECK(memcmp(out, prel, 4) == 0);

    /* SUBSCRIBE "a/#" QoS 1, SUBACK granted 1, UNSUBSCRIBE, UNSUBACK (3.8-3.11). */
    static const uint8_t sub[] = {0x82, 8, 0, 1, 0, 3, 'a', '/', '#', 1};
    CHECK_EQ(mqtt_decode(sub, sizeof sub, MQTT_V311, &pk), 0);
    CHECK_EQ(pk.sub.count, 1);
    size_t pos = 0;
    mqtt_sub_t s;
    CHECK(mqtt_sub_next(&pk, &pos, &s) == 1 && str_eq(s.filter, "a/#") && s.options == 1);
    CHECK(mqtt_sub_next(&pk, &pos, &s) == 0);
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof sub);
    CHECK(memcmp(out, sub, sizeof sub) == 0);
    static const uint8_t sa[] = {0x90, 3, 0, 1, 1};
    CHECK_EQ(mqtt_decode(sa, 5, MQTT_V311, &pk), 0);
    CHECK(pk.codes.len == 1 && pk.codes.p[0] == 1);
    static const uint8_t uns[] = {0xa2, 7, 0, 1, 0, 3, 'a', '/', '#'};
    CHECK_EQ(mqtt_decode(uns, sizeof uns, MQTT_V311, &pk), 0);
    pos = 0;
    CHECK(mqtt_sub_next(&pk, &pos, &s) == 1 && str_eq(s.filter, "a/#") && s.options == 0);
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof uns);
    CHECK(memcmp(out, uns, sizeof uns) == 0);
    static const uint8_t ua[] = {0xb0, 2, 0, 1};
    CHECK_EQ(mqtt_decode(ua, 4, MQTT_V311, &pk), 0);

    /* Two-byte packets. */
    static const uint8_t ping[] = {0xc0, 0}, pong[] = {0xd0, 0}, disc[] = {0xe0, 0},
                         auth[] = {0xf0, 0};
    CHECK_EQ(mqtt_decode(ping, 2, MQTT_V31, &pk), 0);
    CHECK_EQ(pk.type, MQTT_PINGREQ);
    CHECK_EQ(mqtt_decode(pong, 2, MQTT_V311, &pk), 0);
    CHECK_EQ(pk.type, MQTT_PINGRESP);
    CHECK_EQ(mqtt_decode(disc, 2, MQTT_V5, &pk), 0);
    CHECK(pk.type == MQTT_DISCONNECT && pk.reason == 0);
    CHECK_EQ(encode(&pk, out, sizeof out), 2);
    CHECK(memcmp(out, disc, 2) == 0);
    /* AUTH without an Authentication Method (3.15.2.2.2); with one, method "m". */
    CHECK_EQ(mqtt_decode(auth, 2, MQTT_V5, &pk), MQTT_ERR(MQTT_RC_PROTOCOL_ERROR));
    static const uint8_t auth_m[] = {0xf0, 6, 0x18, 4, 0x15, 0, 1, 'm'};
    CHECK_EQ(mqtt_decode(auth_m, sizeof auth_m, MQTT_V5, &pk), 0);
    CHECK(pk.type == MQTT_AUTH && pk.reason == MQTT_RC_CONTINUE_AUTH);
    CHECK(str_eq(pk.props.auth_method, "m"));
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof auth_m);
    CHECK(memcmp(out, auth_m, sizeof auth_m) == 0);
    /* v5 DISCONNECT 0x04 with user property ("a","b"). */
    static const uint8_t d5[] = {0xe0, 9, 0x04, 7, 0x26, 0, 1, 'a', 0, 1, 'b'};
    CHECK_EQ(mqtt_decode(d5, sizeof d5, MQTT_V5, &pk), 0);
    CHECK(pk.reason == MQTT_RC_DISCONNECT_WITH_WILL && pk.props.user_count == 1);
    mqtt_str_t k, v;
    pos = 0;
    CHECK(mqtt_props_user_next(&pk.props, &pos, &k, &v) == 1 && str_eq(k, "a") && str_eq(v, "b"));
    CHECK(mqtt_props_user_next(&pk.props, &pos, &k, &v) == 0);
    CHECK_EQ(encode(&pk, out, sizeof out), sizeof d5);
    CHECK(memcmp(out, d5, sizeof d5) == 0);

    /* Remaining Length encodings from the table in 1.5.5 (2.2.3 in 3.1.1). */
    mqtt_frame_t f;
    static const uint8_t rl[][5] = {{0x30, 0x7f},
                                    {0x30, 0x80, 0x01},
                                    {0x30, 0xff, 0x7f},
                                    {0x30, 0x80, 0x80, 0x01},
                                    {0x30, 0xff, 0xff, 0x7f},
                                    {0x30, 0x80, 0x80, 0x80, 0x01},
                                    {0x30, 0xff, 0xff, 0xff, 0x7f}};
    static const uint32_t rlv[] = {127, 128, 16383, 16384, 2097151, 2097152, 268435455};
    static const uint8_t rlh[] = {2, 3, 3, 4, 4, 5, 5};
    for (int i = 0; i < 7; i++) {
        CHECK_EQ(mqtt_frame(rl[i], rlh[i], 0, &f), RT_EAGAIN);
        CHECK_EQ(f.size, rlv[i] + rlh[i]);
        CHECK_EQ(f.header_len, rlh[i]);
    }
}

/* ---------------------------------------------------------------- round trips */

static const uint8_t versions[] = {MQTT_V31, MQTT_V311, MQTT_V5};

static void test_roundtrip_all(void)
{
    uint8_t a[1024], b[1024];
    for (int vi = 0; vi < 3; vi++) {
        uint8_t ver = versions[vi];
        for (int minimal = 0; minimal < 2; minimal++)
            for (uint8_t t = MQTT_CONNECT; t <= MQTT_AUTH; t++) {
                if (t == MQTT_AUTH && ver != MQTT_V5)
                    continue;
                mqtt_packet_t pk, dk;
                make_packet(t, ver, &pk);
                if (minimal) {
                    /* The shortest form of each packet: no properties, reason 0, no will. */
                    memset(&pk.props, 0, sizeof pk.props);
                    pk.reason = 0;
                    if (t == MQTT_AUTH) { /* the one property AUTH cannot omit */
                        pk.props.present = MQTT_PROP_BIT(MQTT_PROP_AUTH_METHOD);
                        pk.props.auth_method = S("m");
                    }
                    if (t == MQTT_CONNECT) {
                        memset(&pk.connect, 0, sizeof pk.connect);
                        pk.connect.clean_start = 1; /* an empty client id needs it in 3.1.1 */
                    }
                    if (t == MQTT_CONNECT && ver == MQTT_V31)
                        pk.connect.client_id = S("c");
                }
                size_t n = encode(&pk, a, sizeof a);
                CHECK(n > 0);
                uint8_t *copy;
                int rc = decode_copy(a, n, ver, &dk, &copy);
                if (rc)
                    fprintf(stderr, "  decode type %d v%d: %d\n", t, ver, rc);
                CHECK_EQ(rc, 0);
                CHECK_EQ(dk.type, t);
                CHECK_EQ(dk.version, ver);
                CHECK_EQ(dk.size, n);
                CHECK_EQ(dk.packet_id, pk.packet_id);
                CHECK_EQ(dk.reason, pk.reason);
                /* Scalars decode to what was encoded; repeatables counted. */
                uint64_t rep = MQTT_PROP_BIT(MQTT_PROP_USER) | MQTT_PROP_BIT(MQTT_PROP_SUB_ID);
                CHECK_EQ(dk.props.present & ~rep, pk.props.present & ~rep);
                CHECK_EQ(dk.props.user_count, pk.props.n_users);
                CHECK_EQ(dk.props.sub_id_count, pk.props.n_sub_ids);
                if (t == MQTT_CONNECT && !minimal) {
                    CHECK(str_eq(dk.connect.client_id, "client-1"));
                    CHECK(str_eq(dk.connect.will_topic, "will/t"));
                    CHECK(dk.connect.will_qos == 1 && dk.connect.will_retain && dk.connect.will);
                    CHECK(dk.connect.password.len == 3 && str_eq(dk.connect.username, "user"));
                    if (ver == MQTT_V5) {
                        CHECK_EQ(dk.props.session_expiry, 0xFFFFFFFFu);
                        CHECK_EQ(dk.connect.will_props.will_delay, 5);
                        CHECK(str_eq(dk.connect.will_props.content_type, "text/plain"));
                        CHECK_EQ(dk.connect.will_props.user_count, 1);
                    }
                }
                if (t == MQTT_PUBLISH && !minimal) {
                    CHECK(str_eq(dk.publish.topic, "sensors/1/temp"));
                    CHECK(str_eq(dk.publish.payload, "21.5"));
                    CHECK(dk.publish.qos == 2 && dk.publish.dup && dk.publish.retain);
                    if (ver == MQTT_V5) {
                        size_t pos = 0;
                        uint32_t id;
                        for (int i = 0; i < 3; i++)
                            CHECK(mqtt_props_sub_id_next(&dk.props, &pos, &id) && id == sub_ids[i]);
                        CHECK(!mqtt_props_sub_id_next(&dk.props, &pos, &id));
                        CHECK(str_eq(dk.props.correlation_data, "") == 0);
                        CHECK_EQ(dk.props.topic_alias, 3);
                    }
                }
                if (t == MQTT_CONNACK && ver == MQTT_V5 && !minimal) {
                    CHECK(str_eq(dk.props.assigned_client_id, "auto-1234"));
                    CHECK_EQ(dk.props.maximum_packet_size, 1 << 20);
                    CHECK(dk.props.shared_sub_available == 1 && dk.props.sub_id_available == 0);
                }
                if (t == MQTT_SUBSCRIBE || t == MQTT_UNSUBSCRIBE) {
                    CHECK_EQ(dk.sub.count, 3);
                    size_t pos = 0;
                    mqtt_sub_t s;
                    for (int i = 0; i < 3; i++) {
                        const mqtt_sub_t *want = (ver == MQTT_V5 ? subs_v5 : subs) + i;
                        CHECK(mqtt_sub_next(&dk, &pos, &s));
                        CHECK(s.filter.len == want->filter.len &&
                              memcmp(s.filter.p, want->filter.p, s.filter.len) == 0);
                        CHECK_EQ(s.options, t == MQTT_SUBSCRIBE ? want->options : 0);
                    }
                    CHECK(!mqtt_sub_next(&dk, &pos, &s));
                }
                /* Re-encoding the decoded packet (pass-through of raw repeatables) is identical. */
                size_t m = encode(&dk, b, sizeof b);
                CHECK_EQ(m, n);
                if (m != n || memcmp(a, b, n) != 0)
                    fprintf(stderr, "  re-encode differs: type %d v%d min %d\n", t, ver, minimal);
                CHECK(m == n && memcmp(a, b, n) == 0);
                free(copy);
            }
    }
}

/*
** The broker's forwarding path: a client's v5 PUBLISH is decoded, its Topic Alias dropped and
** the subscriber's subscription identifiers added; user properties pass through unchanged
** and in order (3.3.2.3.7), the payload is not touched.
*/
static void test_publish_passthrough(void)
{
    static const uint8_t in[] = {0x30, 0x16, 0, 1,   't',  0x10, 0x23, 0,   1, 0x26, 0,   1,
                                 'a',  0,    1, 'b', 0x26, 0,    1,    'c', 0, 0,    'p', 'l'};
    mqtt_packet_t pk, dk;
    CHECK_EQ(mqtt_decode(in, sizeof in, MQTT_V5, &pk), 0);
    CHECK(pk.props.user_count == 2 && pk.props.topic_alias == 1 &&
          str_eq(pk.publish.payload, "pl"));
    pk.props.present &= ~MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS);
    uint32_t ids[] = {42, 7};
    pk.props.sub_ids = ids;
    pk.props.n_sub_ids = 2;
    uint8_t out[64];
    size_t n;
    CHECK_EQ(mqtt_encode(&pk, out, sizeof out, 0, &n, NULL), 0);
    CHECK_EQ(mqtt_decode(out, n, MQTT_V5, &dk), 0);
    CHECK(!(dk.props.present & MQTT_PROP_BIT(MQTT_PROP_TOPIC_ALIAS)));
    CHECK(dk.props.sub_id_count == 2 && dk.props.sub_id == 42);
    size_t pos = 0;
    mqtt_str_t k, v;
    CHECK(mqtt_props_user_next(&dk.props, &pos, &k, &v) && str_eq(k, "a") && str_eq(v, "b"));
    CHECK(mqtt_props_user_next(&dk.props, &pos, &k, &v) && str_eq(k, "c") && str_eq(v, ""));
    CHECK(!mqtt_props_user_next(&dk.props, &pos, &k, &v));
    CHECK(str_eq(dk.publish.topic, "t") && str_eq(dk.publish.payload, "pl"));
    /* The same packet for a v3.1.1 subscriber carries no properties at all. */
    pk.version = MQTT_V311;
    CHECK_EQ(mqtt_encode(&pk, out, sizeof out, 0, &n, NULL), 0);
    CHECK_EQ(n, 2 + 3 + 2);
}

/* ---------------------------------------------------------------- framing */

static size_t all_packets(uint8_t *buf, size_t cap, uint8_t ver, int *count)
{
    size_t off = 0;
    *count = 0;
    for (uint8_t t = MQTT_CONNECT; t <= MQTT_AUTH; t++) {
        if (t == MQTT_AUTH && ver != MQTT_V5)
            continue;
        mqtt_packet_t pk;
        make_packet(t, ver, &pk);
        size_t n = 0;
        CHECK_EQ(mqtt_encode(&pk, buf + off, cap - off, 0, &n, NULL), 0);
        off += n;
        (*count)++;
    }
    return off;
}

static void test_partial_every_split(void)
{
    uint8_t buf[4096];
    for (int vi = 0; vi < 3; vi++) {
        int count;
        size_t total = all_packets(buf, sizeof buf, versions[vi], &count);
        size_t off = 0;
        while (off < total) {
            mqtt_frame_t f;
            CHECK_EQ(mqtt_frame(buf + off, total - off, 0, &f), 0);
            /* Every proper prefix needs more; the size is known once the header is in. */
            for (size_t cut = 0; cut < f.size; cut++) {
                mqtt_frame_t g;
                uint8_t *c = malloc(cut ? cut : 1);
                memcpy(c, buf + off, cut);
                CHECK_EQ(mqtt_frame(c, cut, 0, &g), RT_EAGAIN);
                CHECK_EQ(g.size, cut >= f.header_len ? f.size : 0);
                mqtt_packet_t pk;
                CHECK_EQ(mqtt_decode(c, cut, versions[vi], &pk), RT_EAGAIN);
                free(c);
            }
            CHECK_EQ(decode_bytes(buf + off, f.size, versions[vi]), 0);
            off += f.size;
        }
        CHECK_EQ(off, total);
    }
}

static void test_several_in_one_buffer(void)
{
    uint8_t buf[4096];
    for (int vi = 0; vi < 3; vi++) {
        int count, seen = 0;
        size_t total = all_packets(buf, sizeof buf, versions[vi], &count);
        uint8_t *c = malloc(total);
        memcpy(c, buf, total);
        size_t off = 0;
        uint8_t expect = MQTT_CONNECT;
        mqtt_packet_t pk;
        while (off < total) {
            CHECK_EQ(mqtt_decode(c + off, total - off, versions[vi], &pk), 0);
            CHECK_EQ(pk.type, expect);
            expect++;
            off += pk.size;
            seen++;
        }
        CHECK_EQ(seen, count);
        CHECK_EQ(off, total);
        /* The stream cut just after a packet boundary and one byte into the next. */
        CHECK_EQ(mqtt_decode(c + off - 2, 1, versions[vi], &pk), RT_EAGAIN);
        free(c);
    }
}

/* ---------------------------------------------------------------- malformed input */

typedef struct {
    const char *name;
    uint8_t version;
    int expect;
    size_t len;
    uint8_t bytes[48];
} bad_case_t;

#define MAL MQTT_ERR(MQTT_RC_MALFORMED)
#define PRO MQTT_ERR(MQTT_RC_PROTOCOL_ERROR)
#define BAD(name, ver, exp, ...)                                                                   \
    {                                                                                              \
        name, ver, exp, sizeof((uint8_t[]){__VA_ARGS__}),                                          \
        {                                                                                          \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }

static const bad_case_t bad_cases[] = {
    /* Fixed header (2.1.2, 2.1.3, 1.5.5). */
    BAD("type 0 reserved", 4, MAL, 0x00, 0x00),
    BAD("AUTH before v5", 4, MAL, 0xf0, 0x00),
    BAD("PINGREQ flags", 4, MAL, 0xc1, 0x00),
    BAD("PUBREL flags 0", 4, MAL, 0x60, 0x02, 0, 1),
    BAD("SUBSCRIBE flags 0", 4, MAL, 0x80, 0x06, 0, 1, 0, 1, 'a', 0),
    BAD("SUBSCRIBE v5 flags 0", 5, MAL, 0x80, 0x07, 0, 1, 0, 0, 1, 'a', 0),
    BAD("SUBSCRIBE v3.1 flags 1", 3, MAL, 0x81, 0x06, 0, 1, 0, 1, 'a', 0),
    BAD("UNSUBSCRIBE v3.1.1 flags 0", 4, MAL, 0xa0, 0x05, 0, 1, 0, 1, 'a'),
    BAD("UNSUBSCRIBE flags 3", 4, MAL, 0xa3, 0x05, 0, 1, 0, 1, 'a'),
    BAD("PUBACK flags", 4, MAL, 0x41, 0x02, 0, 1),
    BAD("remaining length 5 bytes", 4, MAL, 0x30, 0x80, 0x80, 0x80, 0x80, 0x01),
    BAD("remaining length not minimal", 4, MAL, 0xc0, 0x80, 0x00),
    BAD("PINGREQ with body", 4, MAL, 0xc0, 0x01, 0x00),
    BAD("DISCONNECT v3 with body", 4, MAL, 0xe0, 0x01, 0x00),
    BAD("PUBACK v3 too long", 4, MAL, 0x40, 0x03, 0, 1, 0),
    BAD("PUBACK too short", 4, MAL, 0x40, 0x01, 0),
    /* PUBLISH (3.3). */
    BAD("PUBLISH QoS 3", 4, MAL, 0x36, 0x05, 0, 1, 'a', 0, 1),
    BAD("PUBLISH DUP with QoS 0", 4, MAL, 0x38, 0x03, 0, 1, 'a'),
    BAD("PUBLISH packet id 0", 4, PRO, 0x32, 0x05, 0, 1, 'a', 0, 0),
    BAD("PUBLISH wildcard +", 4, MQTT_ERR(0x90), 0x30, 0x05, 0, 3, 'a', '/', '+'),
    BAD("PUBLISH wildcard #", 5, MQTT_ERR(0x90), 0x30, 0x04, 0, 1, '#', 0),
    BAD("PUBLISH empty topic v3", 4, MQTT_ERR(0x90), 0x30, 0x02, 0, 0),
    BAD("PUBLISH empty topic no alias v5", 5, PRO, 0x30, 0x03, 0, 0, 0),
    BAD("PUBLISH topic overruns", 4, MAL, 0x30, 0x03, 0, 5, 'a'),
    BAD("PUBLISH topic U+0000", 4, MAL, 0x30, 0x04, 0, 2, 'a', 0),
    BAD("PUBLISH topic surrogate", 4, MAL, 0x30, 0x05, 0, 3, 0xed, 0xa0, 0x80),
    BAD("PUBLISH topic overlong", 4, MAL, 0x30, 0x04, 0, 2, 0xc0, 0xaf),
    BAD("PUBLISH topic truncated UTF-8", 4, MAL, 0x30, 0x04, 0, 2, 'a', 0xe2),
    BAD("PUBLISH topic above U+10FFFF", 4, MAL, 0x30, 0x06, 0, 4, 0xf4, 0x90, 0x80, 0x80),
    BAD("PUBLISH payload format 1 not UTF-8", 5, MQTT_ERR(0x99), 0x30, 0x07, 0, 1, 'a', 2, 0x01, 1,
        0xff),
    BAD("PUBLISH topic alias 0", 5, PRO, 0x30, 0x07, 0, 1, 'a', 3, 0x23, 0, 0),
    BAD("PUBLISH sub id 0", 5, PRO, 0x30, 0x06, 0, 1, 'a', 2, 0x0b, 0),
    BAD("PUBLISH sub id 5-byte varint", 5, MAL, 0x30, 0x0a, 0, 1, 'a', 6, 0x0b, 0x80, 0x80, 0x80,
        0x80, 0x01),
    /* Properties (2.2.2). */
    BAD("unknown property", 5, MAL, 0x30, 0x06, 0, 1, 'a', 2, 0x7f, 0),
    BAD("property not allowed (session expiry in PUBLISH)", 5, PRO, 0x30, 0x09, 0, 1, 'a', 5, 0x11,
        0, 0, 0, 1),
    BAD("duplicate message expiry", 5, PRO, 0x30, 0x0e, 0, 1, 'a', 10, 0x02, 0, 0, 0, 1, 0x02, 0, 0,
        0, 1),
    BAD("payload format 2", 5, PRO, 0x30, 0x06, 0, 1, 'a', 2, 0x01, 2),
    BAD("property length overruns", 5, MAL, 0x30, 0x06, 0, 1, 'a', 9, 0x01, 0),
    BAD("property value truncated", 5, MAL, 0x30, 0x06, 0, 1, 'a', 2, 0x02, 0),
    BAD("user property bad UTF-8", 5, MAL, 0xe0, 0x09, 0, 7, 0x26, 0, 1, 0xff, 0, 1, 'b'),
    BAD("receive maximum 0", 5, PRO, 0x20, 0x06, 0, 0, 3, 0x21, 0, 0),
    BAD("maximum packet size 0", 5, PRO, 0x20, 0x08, 0, 0, 5, 0x27, 0, 0, 0, 0),
    BAD("maximum QoS 2", 5, PRO, 0x20, 0x05, 0, 0, 2, 0x24, 2),
    BAD("two sub ids in SUBSCRIBE", 5, PRO, 0x82, 0x0b, 0, 1, 4, 0x0b, 1, 0x0b, 2, 0, 1, 'a', 0),
    BAD("reason string in PUBLISH", 5, PRO, 0x30, 0x08, 0, 1, 'a', 4, 0x1f, 0, 1, 'x'),
    BAD("will delay in DISCONNECT", 5, PRO, 0xe0, 0x07, 0, 5, 0x18, 0, 0, 0, 1),
    /* Acks and reason codes. */
    BAD("PUBACK id 0", 4, PRO, 0x40, 0x02, 0, 0),
    BAD("PUBACK bad reason", 5, PRO, 0x40, 0x03, 0, 1, 0x92),
    BAD("PUBCOMP bad reason", 5, PRO, 0x70, 0x03, 0, 1, 0x10),
    BAD("DISCONNECT bad reason", 5, PRO, 0xe0, 0x01, 0x01),
    BAD("AUTH bad reason", 5, PRO, 0xf0, 0x01, 0x80),
    BAD("AUTH without method", 5, PRO, 0xf0, 0x02, 0x18, 0),
    BAD("PUBLISH response topic wildcard", 5, PRO, 0x30, 0x09, 0, 1, 'a', 5, 0x08, 0, 2, 'r', '#'),
    BAD("CONNECT v5 auth data without method", 5, PRO, 0x10, 0x12, 0, 4, 'M', 'Q', 'T', 'T', 5, 2,
        0, 0, 4, 0x16, 0, 1, 'x', 0, 1, 'a'),
    BAD("CONNACK reserved flag", 4, MAL, 0x20, 0x02, 0x02, 0),
    BAD("CONNACK session present on refusal", 4, PRO, 0x20, 0x02, 0x01, 0x05),
    BAD("CONNACK v3 code 6", 4, PRO, 0x20, 0x02, 0, 6),
    BAD("CONNACK v5 bad reason", 5, PRO, 0x20, 0x03, 0, 0x01, 0),
    BAD("SUBACK empty", 4, PRO, 0x90, 0x02, 0, 1),
    BAD("SUBACK bad code", 4, PRO, 0x90, 0x03, 0, 1, 3),
    BAD("UNSUBACK v5 bad code", 5, PRO, 0xb0, 0x04, 0, 1, 0, 0x02),
    BAD("UNSUBACK v3 with payload", 4, MAL, 0xb0, 0x03, 0, 1, 0),
    /* SUBSCRIBE / UNSUBSCRIBE (3.8, 3.10, 4.7). */
    BAD("SUBSCRIBE no filters", 4, PRO, 0x82, 0x02, 0, 1),
    BAD("SUBSCRIBE id 0", 4, PRO, 0x82, 0x06, 0, 0, 0, 1, 'a', 0),
    BAD("SUBSCRIBE missing options", 4, MAL, 0x82, 0x05, 0, 1, 0, 1, 'a'),
    BAD("SUBSCRIBE QoS 3", 4, MAL, 0x82, 0x06, 0, 1, 0, 1, 'a', 3),
    BAD("SUBSCRIBE v3 reserved bits", 4, MAL, 0x82, 0x06, 0, 1, 0, 1, 'a', 0x04),
    BAD("SUBSCRIBE v5 reserved bits", 5, MAL, 0x82, 0x07, 0, 1, 0, 0, 1, 'a', 0x40),
    BAD("SUBSCRIBE retain handling 3", 5, PRO, 0x82, 0x07, 0, 1, 0, 0, 1, 'a', 0x30),
    BAD("SUBSCRIBE no local on shared", 5, PRO, 0x82, 0x10, 0, 1, 0, 0, 10, '$', 's', 'h', 'a', 'r',
        'e', '/', 'g', '/', 'a', 0x04),
    BAD("SUBSCRIBE empty filter", 4, MQTT_ERR(0x8f), 0x82, 0x05, 0, 1, 0, 0, 0),
    BAD("SUBSCRIBE a/b#", 4, MQTT_ERR(0x8f), 0x82, 0x08, 0, 1, 0, 3, 'a', 'b', '#', 0),
    BAD("SUBSCRIBE #/a", 4, MQTT_ERR(0x8f), 0x82, 0x08, 0, 1, 0, 3, '#', '/', 'a', 0),
    BAD("SUBSCRIBE a+", 4, MQTT_ERR(0x8f), 0x82, 0x07, 0, 1, 0, 2, 'a', '+', 0),
    BAD("SUBSCRIBE +a", 4, MQTT_ERR(0x8f), 0x82, 0x07, 0, 1, 0, 2, '+', 'a', 0),
    BAD("SUBSCRIBE $share/ no group", 4, MQTT_ERR(0x8f), 0x82, 0x0d, 0, 1, 0, 8, '$', 's', 'h', 'a',
        'r', 'e', '/', '/', 0),
    BAD("SUBSCRIBE $share/g no filter", 4, MQTT_ERR(0x8f), 0x82, 0x0e, 0, 1, 0, 9, '$', 's', 'h',
        'a', 'r', 'e', '/', 'g', '/', 0),
    BAD("SUBSCRIBE $share/g+/a", 4, MQTT_ERR(0x8f), 0x82, 0x10, 0, 1, 0, 11, '$', 's', 'h', 'a',
        'r', 'e', '/', 'g', '+', '/', 'a', 0),
    BAD("UNSUBSCRIBE no filters", 4, PRO, 0xa2, 0x02, 0, 1),
    BAD("UNSUBSCRIBE bad filter", 4, MQTT_ERR(0x8f), 0xa2, 0x06, 0, 1, 0, 2, 'a', '#'),
    /* CONNECT (3.1). */
    BAD("CONNECT bad protocol name", 4, PRO, 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'X', 4, 2, 0, 0, 0, 1,
        'a'),
    BAD("CONNECT level 6", 4, MQTT_ERR(0x84), 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 6, 2, 0, 0, 0,
        1, 'a'),
    BAD("CONNECT MQTT level 3", 4, MQTT_ERR(0x84), 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 3, 2, 0, 0,
        0, 1, 'a'),
    BAD("CONNECT MQIsdp level 4", 4, MQTT_ERR(0x84), 0x10, 0x0f, 0, 6, 'M', 'Q', 'I', 's', 'd', 'p',
        4, 2, 0, 0, 0, 1, 'a'),
    BAD("CONNECT reserved flag", 4, MAL, 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 4, 3, 0, 0, 0, 1,
        'a'),
    BAD("CONNECT will QoS without will", 4, MAL, 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x0a, 0,
        0, 0, 1, 'a'),
    BAD("CONNECT will retain without will", 4, MAL, 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x22,
        0, 0, 0, 1, 'a'),
    BAD("CONNECT will QoS 3", 4, MAL, 0x10, 0x12, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x1e, 0, 0, 0, 1,
        'a', 0, 1, 't', 0, 0),
    BAD("CONNECT v3.1.1 password without user", 4, MAL, 0x10, 0x10, 0, 4, 'M', 'Q', 'T', 'T', 4,
        0x42, 0, 0, 0, 1, 'a', 0, 1, 'p'),
    BAD("CONNECT v3.1.1 empty id without clean", 4, MQTT_ERR(0x85), 0x10, 0x0c, 0, 4, 'M', 'Q', 'T',
        'T', 4, 0, 0, 0, 0, 0),
    BAD("CONNECT v3.1 empty id", 3, MQTT_ERR(0x85), 0x10, 0x0e, 0, 6, 'M', 'Q', 'I', 's', 'd', 'p',
        3, 2, 0, 0, 0, 0),
    BAD("CONNECT v3.1 24-char id", 3, MQTT_ERR(0x85), 0x10, 0x26, 0, 6, 'M', 'Q', 'I', 's', 'd',
        'p', 3, 2, 0, 0, 0, 24, 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a',
        'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'),
    BAD("CONNECT will topic wildcard", 4, MQTT_ERR(0x90), 0x10, 0x12, 0, 4, 'M', 'Q', 'T', 'T', 4,
        0x06, 0, 0, 0, 1, 'a', 0, 1, '#', 0, 0),
    BAD("CONNECT missing username", 4, MAL, 0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x82, 0, 0, 0,
        1, 'a'),
    BAD("CONNECT trailing byte", 4, MAL, 0x10, 0x0e, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 0, 0, 1,
        'a', 0),
    BAD("CONNECT v5 will delay in CONNECT props", 5, PRO, 0x10, 0x13, 0, 4, 'M', 'Q', 'T', 'T', 5,
        2, 0, 0, 5, 0x18, 0, 0, 0, 1, 0, 1, 'a'),
    BAD("CONNECT v5 request problem info 2", 5, PRO, 0x10, 0x10, 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0,
        0, 2, 0x17, 2, 0, 1, 'a'),
    BAD("CONNECT v5 will payload not UTF-8", 5, MQTT_ERR(0x99), 0x10, 0x17, 0, 4, 'M', 'Q', 'T',
        'T', 5, 6, 0, 0, 0, 0, 1, 'a', 2, 0x01, 1, 0, 1, 't', 0, 1, 0xc3),
    BAD("CONNECT v5 session expiry in will", 5, PRO, 0x10, 0x19, 0, 4, 'M', 'Q', 'T', 'T', 5, 6, 0,
        0, 0, 0, 1, 'a', 5, 0x11, 0, 0, 0, 1, 0, 1, 't', 0, 0),
};

static void test_malformed(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case_t *c = &bad_cases[i];
        /* Each case must be one complete frame, so the error comes from the decoder. */
        mqtt_frame_t f;
        int fr = mqtt_frame(c->bytes, c->len, 0, &f);
        int rc = decode_bytes(c->bytes, c->len, c->version);
        if (rc != c->expect || (fr == 0 && f.size != c->len))
            fprintf(stderr, "  case '%s': got %d (frame %d size %u), want %d\n", c->name, rc, fr,
                    f.size, c->expect);
        CHECK_EQ(rc, c->expect);
        CHECK(fr != 0 || f.size == c->len);
    }
    /* Topic syntax is test_topic.c's (with the decoder against its oracle). */
    CHECK(mqtt_utf8_valid((const uint8_t *)"\xf0\x9f\x98\x80\xe2\x82\xac\xc3\xa9", 9));
    CHECK(!mqtt_utf8_valid((const uint8_t *)"\xf8\x88\x80\x80\x80", 5));
    /* v3 CONNACK return codes for the reasons a CONNECT can be refused with. */
    CHECK_EQ(mqtt_v3_connack_code(MQTT_RC_UNSUPPORTED_VERSION), 1);
    CHECK_EQ(mqtt_v3_connack_code(MQTT_RC_CLIENT_ID_INVALID), 2);
    CHECK_EQ(mqtt_v3_connack_code(MQTT_RC_BAD_CREDENTIALS), 4);
    CHECK_EQ(mqtt_v3_connack_code(MQTT_RC_MALFORMED), 0);
    /* 3.1.1 allows an empty client id with clean session; v5 always. */
    static const uint8_t e4[] = {0x10, 0x0c, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 0, 0, 0};
    CHECK_EQ(decode_bytes(e4, sizeof e4, 0), 0);
    static const uint8_t e5[] = {0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 5, 0, 0, 0, 0, 0, 0};
    CHECK_EQ(decode_bytes(e5, sizeof e5, 0), 0);
    /* A refused CONNECT still tells which protocol level the client asked for. */
    static const uint8_t c6[] = {0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 6, 2, 0, 0, 0, 1, 'a'};
    mqtt_packet_t pk;
    CHECK_EQ(mqtt_decode(c6, sizeof c6, 0, &pk), MQTT_ERR(MQTT_RC_UNSUPPORTED_VERSION));
    CHECK_EQ(pk.version, 6);
    static const uint8_t mqtt3[] = {0x10, 0x0d, 0, 4, 'M', 'Q', 'T', 'T', 3, 2, 0, 0, 0, 1, 'a'};
    CHECK_EQ(mqtt_decode(mqtt3, sizeof mqtt3, 0, &pk), MQTT_ERR(MQTT_RC_UNSUPPORTED_VERSION));
    CHECK_EQ(pk.version, MQTT_V31);
    static const uint8_t e4keep[] = {0x10, 0x0c, 0, 4, 'M', 'Q', 'T', 'T', 4, 0, 0, 0, 0, 0};
    CHECK_EQ(mqtt_decode(e4keep, sizeof e4keep, 0, &pk), MQTT_ERR(MQTT_RC_CLIENT_ID_INVALID));
    CHECK_EQ(pk.version, MQTT_V311);
    static const uint8_t c5id[] = {0x10, 0x0e, 0, 6, 'M', 'Q', 'I', 's',
                                   'd',  'p',  3, 2, 0,   0,   0,   0};
    CHECK_EQ(mqtt_decode(c5id, sizeof c5id, 0, &pk), MQTT_ERR(MQTT_RC_CLIENT_ID_INVALID));
    CHECK_EQ(pk.version, MQTT_V31);
    /* A bad version argument for a non-CONNECT packet. */
    static const uint8_t ping[] = {0xc0, 0};
    CHECK_EQ(decode_bytes(ping, 2, 7), RT_EINVAL);
}

/*
** MQTT 3.1 clients such as Tsung 1.7 send SUBSCRIBE and UNSUBSCRIBE with fixed-header flags
** 0000: accepted from level 3 only, with the flags reported so the connection can count them.
*/
static void test_v31_subscribe_flags(void)
{
    static const uint8_t sub0[] = {0x80, 0x08, 0, 7, 0, 3, 'a', '/', 'b', 1};
    static const uint8_t unsub0[] = {0xa0, 0x07, 0, 8, 0, 3, 'a', '/', 'b'};
    static const uint8_t sub2[] = {0x82, 0x08, 0, 7, 0, 3, 'a', '/', 'b', 1};
    mqtt_packet_t pk;
    CHECK_EQ(mqtt_decode(sub0, sizeof sub0, MQTT_V31, &pk), 0);
    CHECK_EQ(pk.type, MQTT_SUBSCRIBE);
    CHECK_EQ(pk.flags, 0);
    CHECK_EQ(pk.packet_id, 7);
    CHECK_EQ(pk.sub.count, 1);
    size_t pos = 0;
    mqtt_sub_t s;
    CHECK(mqtt_sub_next(&pk, &pos, &s));
    CHECK(s.filter.len == 3 && memcmp(s.filter.p, "a/b", 3) == 0);
    CHECK_EQ(MQTT_SUB_QOS(s.options), 1);
    CHECK_EQ(mqtt_decode(unsub0, sizeof unsub0, MQTT_V31, &pk), 0);
    CHECK_EQ(pk.type, MQTT_UNSUBSCRIBE);
    CHECK_EQ(pk.flags, 0);
    CHECK_EQ(pk.sub.count, 1);
    /* The spec's flags stay valid at level 3, and flags 0000 stay malformed above it. */
    CHECK_EQ(mqtt_decode(sub2, sizeof sub2, MQTT_V31, &pk), 0);
    CHECK_EQ(pk.flags, 2);
    CHECK_EQ(mqtt_decode(sub0, sizeof sub0, MQTT_V311, &pk), MAL);
    CHECK_EQ(mqtt_decode(unsub0, sizeof unsub0, MQTT_V311, &pk), MAL);
}

/* ---------------------------------------------------------------- encoder contracts */

static void test_encode_errors(void)
{
    mqtt_packet_t pk;
    uint8_t buf[64];
    size_t n;
    make_packet(MQTT_PUBLISH, MQTT_V311, &pk);
    pk.publish.qos = 3;
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_PUBLISH, MQTT_V311, &pk);
    pk.packet_id = 0;
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_PUBLISH, MQTT_V5, &pk);
    pk.props.present |= MQTT_PROP_BIT(MQTT_PROP_SESSION_EXPIRY); /* not allowed in PUBLISH */
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_AUTH, MQTT_V311, &pk);
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_CONNACK, MQTT_V311, &pk);
    pk.reason = MQTT_RC_NOT_AUTHORIZED; /* v3 needs the return code, not the v5 reason */
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_SUBACK, MQTT_V311, &pk);
    pk.codes.len = 0;
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 0, &n, NULL), RT_EINVAL);
    static uint8_t big[70000];
    make_packet(MQTT_PUBLISH, MQTT_V311, &pk);
    pk.publish.topic = (mqtt_str_t){big, 65536};
    CHECK_EQ(mqtt_encode(&pk, NULL, 0, 0, &n, NULL), RT_EINVAL);
    make_packet(MQTT_PUBLISH, MQTT_V311, &pk);
    CHECK_EQ(mqtt_encode(&pk, buf, 5, 0, &n, NULL), RT_EINVAL); /* buffer too small */
}

/* ---------------------------------------------------------------- maximum packet size */

static void test_max_packet_size(void)
{
    uint8_t buf[512];
    mqtt_frame_t f;
    /* Inbound: rejected as soon as the header says so, before the body arrives. */
    static const uint8_t hdr[] = {0x30, 0xe8, 0x07}; /* Remaining Length 1000 */
    CHECK_EQ(mqtt_frame(hdr, 3, 1003, &f), RT_EAGAIN);
    CHECK_EQ(f.size, 1003);
    CHECK_EQ(mqtt_frame(hdr, 3, 1002, &f), MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE));
    CHECK_EQ(mqtt_frame(hdr, 2, 1002, &f), RT_EAGAIN);

    /* Outbound PUBLISH too large for the peer: not strippable, must be discarded. */
    mqtt_packet_t pk;
    size_t n;
    int stripped = -1;
    make_packet(MQTT_PUBLISH, MQTT_V5, &pk);
    CHECK_EQ(mqtt_encode(&pk, NULL, 0, 0, &n, NULL), 0);
    size_t full = n;
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, (uint32_t)full, &n, &stripped), 0);
    CHECK(n == full && stripped == 0);
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, (uint32_t)full - 1, &n, &stripped),
             MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE));

    /* An ack with a reason string and user properties sheds them to fit (3.4.2.2.2). */
    make_packet(MQTT_PUBACK, MQTT_V5, &pk);
    CHECK_EQ(mqtt_encode(&pk, NULL, 0, 0, &n, NULL), 0);
    CHECK(n > 5);
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 5, &n, &stripped), 0);
    CHECK(n == 5 && stripped == 1);
    mqtt_packet_t dk;
    CHECK_EQ(mqtt_decode(buf, n, MQTT_V5, &dk), 0);
    CHECK(dk.reason == 0x10 && dk.props.present == 0);
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, 4, &n, &stripped),
             MQTT_ERR(MQTT_RC_PACKET_TOO_LARGE));

    /* CONNACK keeps its other properties when the reason string goes. */
    make_packet(MQTT_CONNACK, MQTT_V5, &pk);
    CHECK_EQ(mqtt_encode(&pk, NULL, 0, 0, &n, NULL), 0);
    CHECK_EQ(mqtt_encode(&pk, buf, sizeof buf, (uint32_t)n - 1, &n, &stripped), 0);
    CHECK_EQ(stripped, 1);
    CHECK_EQ(mqtt_decode(buf, n, MQTT_V5, &dk), 0);
    CHECK(!(dk.props.present & MQTT_PROP_BIT(MQTT_PROP_REASON_STRING)));
    CHECK(str_eq(dk.props.assigned_client_id, "auto-1234") && dk.props.user_count == 0);
}

/* ---------------------------------------------------------------- fuzz */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng(void)
{
    /* xorshift64*: deterministic, so a failure reproduces. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static void test_fuzz(void)
{
    uint8_t seeds[48][1024];
    size_t seed_len[48];
    uint8_t seed_ver[48];
    int nseeds = 0;
    for (int vi = 0; vi < 3; vi++)
        for (uint8_t t = MQTT_CONNECT; t <= MQTT_AUTH; t++) {
            if (t == MQTT_AUTH && versions[vi] != MQTT_V5)
                continue;
            mqtt_packet_t pk;
            make_packet(t, versions[vi], &pk);
            CHECK_EQ(mqtt_encode(&pk, seeds[nseeds], 1024, 0, &seed_len[nseeds], NULL), 0);
            seed_ver[nseeds++] = versions[vi];
        }
    long iters = check_scale(200000);
    long decoded = 0, rejected = 0, reencode_fail = 0;
    uint8_t m[1100], out[2048];
    for (long it = 0; it < iters; it++) {
        int s = (int)(rng() % (uint32_t)nseeds);
        size_t n = seed_len[s];
        memcpy(m, seeds[s], n);
        int muts = 1 + (int)(rng() % 4);
        for (int k = 0; k < muts; k++) {
            uint32_t op = rng() % 6;
            size_t at = n ? rng() % n : 0;
            if (op == 0 && n) /* flip a bit */
                m[at] ^= (uint8_t)(1u << (rng() % 8));
            else if (op == 1 && n) /* set an interesting byte */
                m[at] = (const uint8_t[]){0, 1, 2, 0x7f, 0x80, 0xff, '#', '+', 0x26}[rng() % 9];
            else if (op == 2 && n > 1) /* truncate */
                n = 1 + rng() % (n - 1);
            else if (op == 3 && n + 1 < sizeof m) { /* insert a byte */
                memmove(m + at + 1, m + at, n - at);
                m[at] = (uint8_t)rng();
                n++;
            } else if (op == 4 && n > 2) { /* delete a byte */
                memmove(m + at, m + at + 1, n - at - 1);
                n--;
            } else if (op == 5 && n > 2) { /* fix the remaining length to the new size */
                if (n - 2 < 128)
                    m[1] = (uint8_t)(n - 2);
            }
        }
        mqtt_packet_t pk;
        uint8_t *copy;
        int rc = decode_copy(m, n, seed_ver[s], &pk, &copy);
        if (rc == 0) {
            decoded++;
            /* Every view the decoder hands out lies inside the input. */
#define INSIDE(str) ((str).len == 0 || ((str).p >= copy && (str).p + (str).len <= copy + n))
            CHECK(pk.size <= n && INSIDE(pk.props.raw));
            if (pk.type == MQTT_PUBLISH)
                CHECK(INSIDE(pk.publish.topic) && INSIDE(pk.publish.payload));
            if (pk.type == MQTT_CONNECT)
                CHECK(INSIDE(pk.connect.client_id) && INSIDE(pk.connect.will_payload) &&
                      INSIDE(pk.connect.password) && INSIDE(pk.connect.will_props.raw));
            if (pk.type == MQTT_SUBSCRIBE || pk.type == MQTT_UNSUBSCRIBE)
                CHECK(INSIDE(pk.sub.raw));
#undef INSIDE
            /* Whatever decodes must re-encode and decode again to the same shape. */
            size_t len;
            int erc = mqtt_encode(&pk, out, sizeof out, 0, &len, NULL);
            if (erc == 0) {
                mqtt_packet_t again;
                int drc = mqtt_decode(out, len, pk.version, &again);
                CHECK_EQ(drc, 0);
                CHECK_EQ(again.type, pk.type);
            } else {
                reencode_fail++;
            }
        } else {
            rejected++;
            CHECK(rc == RT_EAGAIN || MQTT_IS_REASON_ERR(rc));
        }
        free(copy);
    }
    CHECK_EQ(reencode_fail, 0);
    CHECK(decoded > 0 && rejected > 0);
    /* Pure random bytes as well. */
    for (long it = 0; it < iters / 4; it++) {
        size_t n = rng() % 64;
        for (size_t i = 0; i < n; i++)
            m[i] = (uint8_t)rng();
        if (n > 1)
            m[1] &= 0x7f;
        mqtt_packet_t pk;
        int rc = decode_copy(m, n, versions[rng() % 3], &pk, NULL);
        CHECK(rc == 0 || rc == RT_EAGAIN || MQTT_IS_REASON_ERR(rc));
    }
}

int main(void)
{
    RUN(test_spec_bytes);
    RUN(test_roundtrip_all);
    RUN(test_publish_passthrough);
    RUN(test_partial_every_split);
    RUN(test_several_in_one_buffer);
    RUN(test_malformed);
    RUN(test_v31_subscribe_flags);
    RUN(test_encode_errors);
    RUN(test_max_packet_size);
    RUN(test_fuzz);
    return CHECK_SUMMARY();
}

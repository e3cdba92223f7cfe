/*
** MQTT packet codec for MQTT 3.1 (protocol level 3, "MQIsdp"), 3.1.1 (level 4) and 5.0
** (level 5): incremental framing over a byte stream, allocation-free decoding into structs
** that point into the input, and encoding into a caller-provided buffer (or a size query).
**
** Section numbers in comments refer to the MQTT 5.0 OASIS standard unless marked "3.1.1".
**
** Errors. Every function returns 0 on success or a negative code:
**   - RT_EAGAIN: the input holds no complete packet yet (framing/decoding);
**   - RT_EINVAL: a bad argument to an encoder (e.g. a string over 65535 bytes, QoS 3, a
**     property not allowed in that packet, an output buffer too small);
**   - MQTT_ERR(rc) == -rc for an MQTT 5 reason code rc in 0x80..0xA2: the input violates the
**     spec and rc is the reason code the spec prescribes (0x81 malformed, 0x82 protocol error,
**     0x84 unsupported protocol version, 0x85 client id invalid, 0x8F topic filter invalid,
**     0x90 topic name invalid, 0x95 packet too large, 0x99 payload format invalid). These
**     values (-128..-162) are disjoint from the RT_E* codes. A v3 connection uses the reason
**     only to decide between closing and a CONNACK return code (mqtt_v3_connack_code()).
**
** Lifetimes. A decoded mqtt_packet_t holds no memory of its own: every mqtt_str_t in it
** (strings, payload, raw property block, subscription list) points into the buffer given to
** mqtt_decode() and is valid exactly as long as those bytes are unchanged. Copy what must
** outlive the buffer. Encoders only read the packet and write into the caller's buffer.
**
** Decoding is mqtt_decode.c, encoding mqtt_encode.c, MQTT 5 property blocks mqtt_props.c.
*/
#ifndef RT_MQTT_CODEC_H
#define RT_MQTT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "topic.h"

/* Protocol levels (3.1.2.2; 3.1.1 3.1.2.2; MQTT 3.1 uses 3 with the name "MQIsdp"). */
#define MQTT_V31 3
#define MQTT_V311 4
#define MQTT_V5 5

/* Largest Remaining Length a four-byte Variable Byte Integer can carry (1.5.5). */
#define MQTT_MAX_REMAINING 268435455u
/* Largest whole packet: one type byte, four length bytes and the maximum remaining length. */
#define MQTT_MAX_PACKET (1u + 4u + MQTT_MAX_REMAINING)

/* Control packet types (2.1.2). AUTH exists only in MQTT 5. */
typedef enum {
    MQTT_CONNECT = 1,
    MQTT_CONNACK = 2,
    MQTT_PUBLISH = 3,
    MQTT_PUBACK = 4,
    MQTT_PUBREC = 5,
    MQTT_PUBREL = 6,
    MQTT_PUBCOMP = 7,
    MQTT_SUBSCRIBE = 8,
    MQTT_SUBACK = 9,
    MQTT_UNSUBSCRIBE = 10,
    MQTT_UNSUBACK = 11,
    MQTT_PINGREQ = 12,
    MQTT_PINGRESP = 13,
    MQTT_DISCONNECT = 14,
    MQTT_AUTH = 15,
} mqtt_type_t;

/* MQTT 5 reason codes (2.4). */
enum {
    MQTT_RC_SUCCESS = 0x00, /* also Normal disconnection and Granted QoS 0 */
    MQTT_RC_GRANTED_QOS1 = 0x01,
    MQTT_RC_GRANTED_QOS2 = 0x02,
    MQTT_RC_DISCONNECT_WITH_WILL = 0x04,
    MQTT_RC_NO_MATCHING_SUBSCRIBERS = 0x10,
    MQTT_RC_NO_SUBSCRIPTION_EXISTED = 0x11,
    MQTT_RC_CONTINUE_AUTH = 0x18,
    MQTT_RC_REAUTHENTICATE = 0x19,
    MQTT_RC_UNSPECIFIED = 0x80,
    MQTT_RC_MALFORMED = 0x81,
    MQTT_RC_PROTOCOL_ERROR = 0x82,
    MQTT_RC_IMPL_SPECIFIC = 0x83,
    MQTT_RC_UNSUPPORTED_VERSION = 0x84,
    MQTT_RC_CLIENT_ID_INVALID = 0x85,
    MQTT_RC_BAD_CREDENTIALS = 0x86,
    MQTT_RC_NOT_AUTHORIZED = 0x87,
    MQTT_RC_SERVER_UNAVAILABLE = 0x88,
    MQTT_RC_SERVER_BUSY = 0x89,
    MQTT_RC_BANNED = 0x8A,
    MQTT_RC_SERVER_SHUTTING_DOWN = 0x8B,
    MQTT_RC_BAD_AUTH_METHOD = 0x8C,
    MQTT_RC_KEEPALIVE_TIMEOUT = 0x8D,
    MQTT_RC_SESSION_TAKEN_OVER = 0x8E,
    MQTT_RC_TOPIC_FILTER_INVALID = 0x8F,
    MQTT_RC_TOPIC_NAME_INVALID = 0x90,
    MQTT_RC_PACKET_ID_IN_USE = 0x91,
    MQTT_RC_PACKET_ID_NOT_FOUND = 0x92,
    MQTT_RC_RECEIVE_MAX_EXCEEDED = 0x93,
    MQTT_RC_TOPIC_ALIAS_INVALID = 0x94,
    MQTT_RC_PACKET_TOO_LARGE = 0x95,
    MQTT_RC_MESSAGE_RATE_TOO_HIGH = 0x96,
    MQTT_RC_QUOTA_EXCEEDED = 0x97,
    MQTT_RC_ADMIN_ACTION = 0x98,
    MQTT_RC_PAYLOAD_FORMAT_INVALID = 0x99,
    MQTT_RC_RETAIN_NOT_SUPPORTED = 0x9A,
    MQTT_RC_QOS_NOT_SUPPORTED = 0x9B,
    MQTT_RC_USE_ANOTHER_SERVER = 0x9C,
    MQTT_RC_SERVER_MOVED = 0x9D,
    MQTT_RC_SHARED_SUBS_NOT_SUPPORTED = 0x9E,
    MQTT_RC_CONNECTION_RATE_EXCEEDED = 0x9F,
    MQTT_RC_MAX_CONNECT_TIME = 0xA0,
    MQTT_RC_SUB_IDS_NOT_SUPPORTED = 0xA1,
    MQTT_RC_WILDCARD_SUBS_NOT_SUPPORTED = 0xA2,
};

/* A decode error carrying reason code rc, and the reason code back from such an error. */
#define MQTT_ERR(rc) (-(int)(rc))
#define MQTT_ERR_REASON(err) ((uint8_t)(-(err)))
#define MQTT_IS_REASON_ERR(err) ((err) <= -0x80 && (err) >= -0xA2)

/* MQTT 5 property identifiers (2.2.2.2). */
enum {
    MQTT_PROP_PAYLOAD_FORMAT = 0x01,
    MQTT_PROP_MESSAGE_EXPIRY = 0x02,
    MQTT_PROP_CONTENT_TYPE = 0x03,
    MQTT_PROP_RESPONSE_TOPIC = 0x08,
    MQTT_PROP_CORRELATION_DATA = 0x09,
    MQTT_PROP_SUB_ID = 0x0B,
    MQTT_PROP_SESSION_EXPIRY = 0x11,
    MQTT_PROP_ASSIGNED_CLIENT_ID = 0x12,
    MQTT_PROP_SERVER_KEEPALIVE = 0x13,
    MQTT_PROP_AUTH_METHOD = 0x15,
    MQTT_PROP_AUTH_DATA = 0x16,
    MQTT_PROP_REQUEST_PROBLEM_INFO = 0x17,
    MQTT_PROP_WILL_DELAY = 0x18,
    MQTT_PROP_REQUEST_RESPONSE_INFO = 0x19,
    MQTT_PROP_RESPONSE_INFO = 0x1A,
    MQTT_PROP_SERVER_REFERENCE = 0x1C,
    MQTT_PROP_REASON_STRING = 0x1F,
    MQTT_PROP_RECEIVE_MAXIMUM = 0x21,
    MQTT_PROP_TOPIC_ALIAS_MAXIMUM = 0x22,
    MQTT_PROP_TOPIC_ALIAS = 0x23,
    MQTT_PROP_MAXIMUM_QOS = 0x24,
    MQTT_PROP_RETAIN_AVAILABLE = 0x25,
    MQTT_PROP_USER = 0x26,
    MQTT_PROP_MAXIMUM_PACKET_SIZE = 0x27,
    MQTT_PROP_WILDCARD_SUB_AVAILABLE = 0x28,
    MQTT_PROP_SUB_ID_AVAILABLE = 0x29,
    MQTT_PROP_SHARED_SUB_AVAILABLE = 0x2A,
};
#define MQTT_PROP_BIT(id) (1ull << (id))

/* A byte string (UTF-8 string, binary data or payload); p may be NULL when len is 0. */
typedef struct {
    const uint8_t *p;
    uint32_t len;
} mqtt_str_t;

typedef struct {
    mqtt_str_t key;
    mqtt_str_t val;
} mqtt_user_prop_t;

/*
** MQTT 5 properties of one packet (or of a will). `present` has MQTT_PROP_BIT(id) set for
** every scalar property that is there; the field of an absent property is 0.
**
** Repeatable properties. Decoding sets `raw` to the whole property block and counts user
** properties and subscription identifiers (sub_id is the first one); walk them with
** mqtt_props_user_next() / mqtt_props_sub_id_next(). Encoding writes the user properties and
** subscription identifiers found in `raw` (if raw.p is set: pass-through of decoded
** properties), then those in `users` / `sub_ids`. The PROP_BITs of USER and SUB_ID are only
** set by the decoder and are ignored by the encoder.
*/
typedef struct {
    uint64_t present;              /* MQTT_PROP_BIT(id) of each property present */
    uint32_t message_expiry;       /* seconds */
    uint32_t session_expiry;       /* seconds; 0xFFFFFFFF means never */
    uint32_t will_delay;           /* seconds */
    uint32_t maximum_packet_size;  /* bytes, > 0 */
    uint32_t sub_id;               /* decode: first subscription identifier, 1..268435455 */
    uint16_t server_keepalive;     /* seconds */
    uint16_t receive_maximum;      /* > 0 */
    uint16_t topic_alias_maximum;  /* 0 means no aliases */
    uint16_t topic_alias;          /* > 0 */
    uint32_t user_count;           /* decode: number of user properties */
    uint32_t sub_id_count;         /* decode: number of subscription identifiers */
    uint8_t payload_format;        /* 0 bytes, 1 UTF-8 */
    uint8_t request_problem_info;  /* 0 or 1 */
    uint8_t request_response_info; /* 0 or 1 */
    uint8_t maximum_qos;           /* 0 or 1 */
    uint8_t retain_available;      /* 0 or 1 */
    uint8_t wildcard_sub_available;
    uint8_t sub_id_available;
    uint8_t shared_sub_available;
    mqtt_str_t content_type;
    mqtt_str_t response_topic;
    mqtt_str_t correlation_data;
    mqtt_str_t assigned_client_id;
    mqtt_str_t auth_method;
    mqtt_str_t auth_data;
    mqtt_str_t response_info;
    mqtt_str_t server_reference;
    mqtt_str_t reason_string;
    mqtt_str_t raw;                /* decode: the property block, without its length */
    const mqtt_user_prop_t *users; /* encode only: extra user properties */
    const uint32_t *sub_ids;       /* encode only: extra subscription identifiers */
    uint16_t n_users;              /* entries in users */
    uint16_t n_sub_ids;            /* entries in sub_ids */
} mqtt_props_t;

/* Subscription options byte (3.8.3.1); v3 uses only the QoS bits. */
#define MQTT_SUB_QOS(o) ((o)&0x03)
#define MQTT_SUB_NO_LOCAL 0x04
#define MQTT_SUB_RETAIN_AS_PUBLISHED 0x08
#define MQTT_SUB_RETAIN_HANDLING(o) (((o) >> 4) & 0x03)

typedef struct {
    mqtt_str_t filter;
    uint8_t options; /* SUBSCRIBE only; 0 for UNSUBSCRIBE */
} mqtt_sub_t;

/*
** The topic filter list of SUBSCRIBE / UNSUBSCRIBE. Decoding sets raw (the payload) and
** count; walk it with mqtt_sub_next(). Encoding writes items[0..count) if items is set,
** else copies raw verbatim.
*/
typedef struct {
    mqtt_str_t raw;
    const mqtt_sub_t *items;
    uint32_t count;
} mqtt_sublist_t;

/*
** One control packet. The caller of an encoder fills type, version and the fields of that
** type; `flags` and `size` are decode outputs (the encoder derives the fixed-header flags).
** `reason` is the reason code of CONNACK (v3: the return code 0..5), PUBACK, PUBREC,
** PUBREL, PUBCOMP, DISCONNECT and AUTH.
*/
typedef struct {
    uint8_t type;       /* mqtt_type_t */
    uint8_t flags;      /* decode: low nibble of the fixed header */
    uint8_t version;    /* MQTT_V31, MQTT_V311 or MQTT_V5 */
    uint8_t reason;     /* see above */
    uint16_t packet_id; /* PUBLISH QoS > 0, acks, (UN)SUBSCRIBE, (UN)SUBACK */
    uint32_t size;      /* decode: bytes of the whole packet */
    mqtt_props_t props; /* MQTT 5 only */
    union {
        struct {
            uint8_t clean_start; /* clean session (v3) / clean start (v5) */
            uint8_t will;        /* a will message is present */
            uint8_t will_qos;
            uint8_t will_retain;
            uint8_t has_username;
            uint8_t has_password;
            uint16_t keepalive; /* seconds */
            mqtt_str_t client_id;
            mqtt_str_t will_topic;
            mqtt_str_t will_payload;
            mqtt_str_t username;
            mqtt_str_t password;
            mqtt_props_t will_props; /* MQTT 5 only */
        } connect;
        struct {
            uint8_t session_present;
        } connack;
        struct {
            mqtt_str_t topic;
            mqtt_str_t payload;
            uint8_t qos;
            uint8_t retain;
            uint8_t dup;
        } publish;
        mqtt_sublist_t sub; /* SUBSCRIBE and UNSUBSCRIBE */
        mqtt_str_t codes;   /* SUBACK and (v5) UNSUBACK reason codes, one byte each */
    };
} mqtt_packet_t;

/* Where the next packet of a stream ends. */
typedef struct {
    uint32_t size;      /* bytes of the whole packet; 0 while the header is incomplete */
    uint8_t header_len; /* type byte plus Remaining Length bytes */
    uint8_t type;       /* packet type from the first byte */
} mqtt_frame_t;

/*
** Frames the next packet at buf[0..len). Returns 0 when buf holds it completely
** (f->size <= len; further bytes belong to later packets); RT_EAGAIN when more bytes are
** needed, with f->size already set once the fixed header is complete, so a connection can
** copy just the partial packet and know its final size; MQTT_ERR(0x81) for a Remaining Length
** longer than 4 bytes or not minimally encoded (1.5.5); MQTT_ERR(0x95) as soon as the size
** is known to exceed max_size (0: no limit beyond MQTT_MAX_PACKET). Reads at most 5 bytes.
*/
int mqtt_frame(const uint8_t *buf, size_t len, uint32_t max_size, mqtt_frame_t *f);

/*
** Decodes the packet at buf[0..len) (extra bytes after it are ignored; pk->size tells how
** many were used) for a connection speaking `version`. For CONNECT `version` is ignored and
** pk->version is the packet's protocol level, set even when the CONNECT is refused (after
** its protocol name was read) so the CONNACK can be sent in a format the client reads: a
** level that is not 3, 4 or 5 gets MQTT_ERR(0x84), answered by a v3 CONNACK with code 1.
** Validates everything the spec makes checkable without session state: fixed-header flags
** (an MQTT 3.1 SUBSCRIBE or UNSUBSCRIBE may carry 0000 instead of 0010, as older 3.1 clients
** send; pk->flags says which came), lengths, UTF-8, topic names and filters, property
** placement, duplicates and ranges, reason codes, packet ids. Left to the connection: topic
** alias range, receive maximum, subscription identifiers sent by a client in PUBLISH, and
** authentication. Never allocates, never reads outside buf[0..len). Returns 0, RT_EAGAIN,
** RT_EINVAL (bad version) or MQTT_ERR(reason).
*/
int mqtt_decode(const uint8_t *buf, size_t len, uint8_t version, mqtt_packet_t *pk);

/*
** Encodes pk into buf[0..cap) and sets *len to the packet's size; with buf NULL only *len is
** computed. If the packet would exceed max_size (the peer's Maximum Packet Size; 0 means no
** limit), the Reason String and User Properties are dropped from packets for which the spec
** says so (CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH:
** 3.2.2.3.9, 3.4.2.2.2 etc.) and *stripped is set (if not NULL); if it is still too large
** (or is another packet type, which the sender must then discard, 3.1.2.11.4) the result is
** MQTT_ERR(0x95). RT_EINVAL for an unencodable packet or cap < *len. Properties are written
** only for MQTT 5 and ignored otherwise, so one decoded PUBLISH can be sent to subscribers of
** any version. Direction rules stay with the caller (e.g. no Reason String or User Property
** beyond PUBLISH/CONNACK/DISCONNECT when the client set Request Problem Information to 0,
** 3.1.2.11.7).
*/
int mqtt_encode(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, uint32_t max_size, size_t *len,
                int *stripped);
/* Where the parts of an encoded PUBLISH are, in bytes from its first. */
typedef struct {
    size_t topic_off;   /* the topic's bytes (after its length) */
    size_t props_off;   /* MQTT 5: the properties (after their length); else payload_off */
    size_t payload_off; /* the payload, to the packet's end */
} mqtt_publish_at_t;
/* mqtt_encode for a PUBLISH with no size limit into buf, saying where its parts went. */
int mqtt_encode_publish(const mqtt_packet_t *pk, uint8_t *buf, size_t cap, size_t *len,
                        mqtt_publish_at_t *at);

/* Walk decoded repeatables; each returns 1 and advances *pos (start at 0), or 0 at the end. */
int mqtt_props_user_next(const mqtt_props_t *pr, size_t *pos, mqtt_str_t *key, mqtt_str_t *val);
int mqtt_props_sub_id_next(const mqtt_props_t *pr, size_t *pos, uint32_t *id);
int mqtt_sub_next(const mqtt_packet_t *pk, size_t *pos, mqtt_sub_t *out);

/* The UTF-8 check the decoder uses, exported for the broker (1.5.4); topic syntax is topic.h's. */
int mqtt_utf8_valid(const uint8_t *s, size_t n);

/*
** The MQTT 3.1/3.1.1 CONNACK return code (3.1.1 3.2.2.3) for a CONNECT rejected with
** reason: 1 unacceptable protocol version, 2 identifier rejected, 3 server unavailable,
** 4 bad user name or password, 5 not authorized; 0 means close without a CONNACK.
*/
uint8_t mqtt_v3_connack_code(uint8_t reason);

/*
** Variable Byte Integers (1.5.5) for code that writes packets from parts (broker/message.c):
** the size of v's encoding, writing it (v <= MQTT_MAX_REMAINING; returns the byte after it),
** and reading one (0, RT_EAGAIN if p[0..n) ends inside it, or MQTT_ERR(0x81)).
*/
size_t mqtt_varint_size(uint32_t v);
uint8_t *mqtt_varint_put(uint8_t *p, uint32_t v);
int mqtt_varint_get(const uint8_t *p, size_t n, uint32_t *v, size_t *used);

#endif

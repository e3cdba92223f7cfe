/*
 * rtb_mqtt: the client side of MQTT 3.1, 3.1.1 and 5.0, only as much as a load
 * generator needs. Encoders append to a caller-owned rtb_buf_t that grows by doubling,
 * so steady-state encoding allocates nothing; the decoder works in place on the read
 * buffer and never copies a payload.
 */
#ifndef RTB_MQTT_H
#define RTB_MQTT_H

#include <stddef.h>
#include <stdint.h>

enum {
    RTB_CONNECT = 1,
    RTB_CONNACK = 2,
    RTB_PUBLISH = 3,
    RTB_PUBACK = 4,
    RTB_PUBREC = 5,
    RTB_PUBREL = 6,
    RTB_PUBCOMP = 7,
    RTB_SUBSCRIBE = 8,
    RTB_SUBACK = 9,
    RTB_PINGREQ = 12,
    RTB_PINGRESP = 13,
    RTB_DISCONNECT = 14,
};

/* Incoming packets larger than this are treated as a protocol error. */
#define RTB_MQTT_MAX_PACKET (16u * 1024 * 1024)

/* A growable byte buffer; the owner frees it with rtb_buf_free. */
typedef struct rtb_buf_s {
    uint8_t *p; /* storage, NULL until first use */
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
} rtb_buf_t;

/* Makes room for extra more bytes; returns 0 or -ENOMEM. */
int rtb_buf_reserve(rtb_buf_t *b, size_t extra);
int rtb_buf_append(rtb_buf_t *b, const void *p, size_t n);
void rtb_buf_free(rtb_buf_t *b);

typedef struct rtb_connect_s {
    int version;           /* 3, 4 or 5 */
    const char *client_id; /* borrowed */
    const char *user;      /* borrowed, NULL for none */
    const char *pass;      /* borrowed, NULL for none */
    int clean;             /* clean session (v3/v4) or clean start (v5) */
    uint16_t keepalive;    /* seconds */
} rtb_connect_t;

int rtb_mqtt_connect(rtb_buf_t *b, const rtb_connect_t *c);
/*
 * Appends a PUBLISH whose payload is the head bytes followed by filler up to
 * payload_len in total (payload_len >= head_len). pid is ignored at QoS 0.
 */
int rtb_mqtt_publish(rtb_buf_t *b, int version, int qos, uint16_t pid, const char *topic,
                     size_t topic_len, const void *head, size_t head_len, size_t payload_len);
/* PUBACK, PUBREC, PUBREL or PUBCOMP with reason "success" (valid in every version). */
int rtb_mqtt_ack(rtb_buf_t *b, int type, uint16_t pid);
int rtb_mqtt_subscribe(rtb_buf_t *b, int version, uint16_t pid, const char *filter, int qos);
/* PINGREQ or DISCONNECT. */
int rtb_mqtt_empty(rtb_buf_t *b, int type);

typedef struct rtb_pkt_s {
    int type;             /* RTB_* packet type */
    int flags;            /* low nibble of the fixed header */
    int qos;              /* PUBLISH only */
    uint16_t pid;         /* packet id, 0 when absent */
    int rc;               /* CONNACK/SUBACK/ack reason code, 0 when absent */
    const uint8_t *topic; /* PUBLISH topic, points into the input */
    size_t topic_len;
    const uint8_t *payload; /* PUBLISH payload, points into the input */
    size_t payload_len;
} rtb_pkt_t;

/*
 * Decodes one packet from p[0..n). Returns 0 and sets *used when a whole packet was
 * decoded, 1 when more bytes are needed, or -EPROTO for a malformed packet.
 */
int rtb_mqtt_parse(const uint8_t *p, size_t n, int version, rtb_pkt_t *pkt, size_t *used);

#endif

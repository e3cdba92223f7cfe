/*
** The MongoDB wire protocol as mongo-c-driver 1.23 speaks it: OP_QUERY
** commands on "<db>.$cmd" (the legacy handshake) answered with OP_REPLY, and
** OP_MSG with a kind 0 body and kind 1 document sequences answered with OP_MSG.
*/
#ifndef MT_WIRE_H
#define MT_WIRE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT_OP_REPLY 1
#define MT_OP_QUERY 2004
#define MT_OP_MSG 2013

#define MT_HEADER_LEN 16
#define MT_MAX_BSON 16777216    /* maxBsonObjectSize, as a MongoDB server reports it */
#define MT_MAX_MESSAGE 48000000 /* maxMessageSizeBytes; a longer message ends the connection */
#define MT_BSON_DEPTH 100       /* documents nested deeper are refused, bounding recursion */
#define MT_DB_NAME_MAX 64       /* longest database name, as in MongoDB */

/* A growable byte buffer; bytes before off were already consumed. */
typedef struct mt_buf {
    uint8_t *p;
    size_t len; /* bytes written */
    size_t off; /* bytes consumed */
    size_t cap;
} mt_buf_t;

int mt_buf_reserve(mt_buf_t *b, size_t more);
int mt_buf_append(mt_buf_t *b, const void *data, size_t len);
/* Drops consumed bytes, so the buffer does not grow without bound. */
void mt_buf_compact(mt_buf_t *b);
void mt_buf_free(mt_buf_t *b);

typedef struct mt_header {
    int32_t len;
    int32_t request_id;
    int32_t response_to;
    int32_t opcode;
} mt_header_t;

/* Reads a header from 16 bytes at p. */
void mt_wire_header(const uint8_t *p, mt_header_t *h);

/* A parsed request: the command with document sequences merged in as arrays. */
typedef struct mt_request {
    int32_t request_id;
    int32_t opcode;              /* MT_OP_QUERY or MT_OP_MSG: the reply uses the matching form */
    bool more_to_come;           /* OP_MSG moreToCome: the client wants no reply */
    bool legacy_failure;         /* an OP_QUERY that is not a command: reply with QueryFailure */
    char db[MT_DB_NAME_MAX + 1]; /* from $db (OP_MSG) or the namespace (OP_QUERY) */
    bson_t cmd;                  /* owned: mt_request_destroy frees it */
} mt_request_t;

/*
** Parses the complete message msg (header included) of h.len bytes. Returns 0;
** or RT_EINVAL with a reason in err when the message is malformed, which ends
** the connection since the stream can no longer be trusted.
*/
int mt_wire_parse(const uint8_t *msg, const mt_header_t *h, mt_request_t *req, char *err,
                  size_t errlen);
void mt_request_destroy(mt_request_t *req);

/* Appends the reply to req, carrying doc, to out. */
int mt_wire_reply(mt_buf_t *out, const mt_request_t *req, int32_t request_id, const bson_t *doc);

/*
** Checks that data is one well-formed BSON document nested at most
** MT_BSON_DEPTH deep, and initialises doc over it (not copied).
*/
bool mt_bson_check(const uint8_t *data, size_t len, bson_t *doc);

#endif

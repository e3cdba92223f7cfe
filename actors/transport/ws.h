/*
** WebSocket (RFC 6455) under a protocol: the upgrade request's HTTP head and the frames.
** Both are codecs without I/O or allocation: the session actor owns the socket, feeds them
** what it read and keeps what they did not consume (xport.c).
**
** A protocol's messages travel in one kind of data frame: binary for MQTT, text for XMPP
** (RFC 7395); a frame of the other kind is refused with 1003. Text is checked to be UTF-8
** as it comes (RFC 6455 8.1), across frames and reads.
**
** Frames are decoded in place (payload unmasked where it lies), so data passes to
** the protocol's parser without a copy, and the decoder's state between reads is a few
** words: a frame header or a control frame (at most RT_WS_HEADER_MAX + 125 bytes)
** split across reads is not consumed, and the caller offers it again with more.
*/
#ifndef RT_WS_H
#define RT_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_WS_HEAD_MAX 8192   /* an upgrade request's head is refused past this */
#define RT_WS_HEADER_MAX 14   /* a frame header: 2 + 8 (length) + 4 (mask) */
#define RT_WS_CONTROL_MAX 125 /* a control frame's payload (5.5) */

enum {
    RT_WS_OP_CONT = 0x0,
    RT_WS_OP_TEXT = 0x1,
    RT_WS_OP_BINARY = 0x2,
    RT_WS_OP_CLOSE = 0x8,
    RT_WS_OP_PING = 0x9,
    RT_WS_OP_PONG = 0xA,
};

/* Close status codes (7.4.1) the broker sends. */
enum {
    RT_WS_CLOSE_NORMAL = 1000,
    RT_WS_CLOSE_GOING_AWAY = 1001,
    RT_WS_CLOSE_PROTOCOL = 1002,
    RT_WS_CLOSE_UNSUPPORTED = 1003, /* a data frame of the kind the protocol does not use */
    RT_WS_CLOSE_NO_STATUS = 1005,   /* received close had no code (never sent) */
    RT_WS_CLOSE_INVALID = 1007,
    RT_WS_CLOSE_TOO_BIG = 1009,
};

/*
** The decoder's state between reads: zero it to start, and set text for a protocol whose
** messages are text frames. Bits, as this is every idle WebSocket connection's state.
*/
typedef struct rt_ws_in_s {
    uint32_t remaining;   /* payload bytes of the current data frame still to come */
    uint32_t message_len; /* payload bytes of the current message so far (all its fragments);
                             both at most max_message, so 32 bits */
    uint8_t mask[4];
    uint8_t mask_off : 2;   /* where in mask the next payload byte is */
    uint8_t in_frame : 1;   /* inside a data frame's payload */
    uint8_t in_message : 1; /* a message is open: its FIN has not come (continuations follow) */
    uint8_t closed : 1;     /* a close frame came: nothing more is decoded */
    uint8_t text : 1;       /* set by the owner: messages are text frames, binary ones refused;
                               0: binary frames, text ones refused */
    uint8_t utf8_need : 2;  /* text: continuation bytes the last UTF-8 sequence still needs */
    uint8_t utf8_next;      /* text: which bounds the next of them has (ws.c) */
} rt_ws_in_t;

typedef enum {
    RT_WS_EV_DATA = 1, /* data: payload bytes of a message, unmasked in place; last: the
                          message ends with them */
    RT_WS_EV_PING,     /* data: the whole ping payload (answer with a pong carrying it) */
    RT_WS_EV_PONG,
    RT_WS_EV_CLOSE, /* close_code (RT_WS_CLOSE_NO_STATUS if none); data: the reason text */
} rt_ws_event_kind_t;

typedef struct rt_ws_event_s {
    rt_ws_event_kind_t kind;
    uint8_t *data; /* inside the buffer given to rt_ws_decode */
    size_t len;
    uint16_t close_code;
    bool last; /* data: the message's last bytes (its final frame's end) */
} rt_ws_event_t;

/*
** Decodes the next event from buf[0, len), which may be changed (unmasking). Returns:
**  0          an event; *used bytes of buf were consumed (the event's data is among them);
**             a data event has len > 0, but for the end of a message whose final frame is
**             empty (len 0, last set): other empty frames give no event;
**  RT_EAGAIN  buf holds only part of a frame header or of a control frame: nothing was
**             consumed beyond *used, and the caller offers buf[*used, len) again with
**             the bytes that follow; also returned with *used == len when buf is spent;
**  RT_EPROTO  the peer broke the protocol: *close_code says what to close with:
**             RT_WS_CLOSE_PROTOCOL for an unmasked frame, reserved bits, an unknown
**             opcode, a fragmented or oversized control frame, a continuation with no
**             message or a new message inside one, a 64-bit length with its top bit set;
**             RT_WS_CLOSE_UNSUPPORTED for a data frame of the kind st does not take
**             (text, unless st->text; binary, if it is); RT_WS_CLOSE_TOO_BIG when a
**             message's payload passes max_message, checked at the frame header, before
**             its payload arrives; RT_WS_CLOSE_INVALID for a close payload of 1 byte, a
**             close code that may not be sent, a close reason that is not UTF-8, or a text
**             message that is not: refused at the chunk (a frame's bytes in this buffer)
**             that holds its first bad byte, or at its end when a sequence is cut short;
**             the message's bytes in earlier chunks were given already.
**             The errors the first two bytes of a header show are reported as soon as
**             they have come.
** A length in a longer encoding than it needs is accepted. After a close event the decoder
** returns RT_EAGAIN with *used == len for anything more.
*/
int rt_ws_decode(rt_ws_in_t *st, uint8_t *buf, size_t len, uint32_t max_message, size_t *used,
                 rt_ws_event_t *ev, uint16_t *close_code);

/* Writes a server frame header (FIN set, unmasked) for a payload of len bytes; returns its
   size (2, 4 or 10). */
size_t rt_ws_frame_header(uint8_t out[10], int opcode, uint64_t len);

/* ---- The upgrade (4.2.1, 4.2.2) ---- */

/* The subprotocols a protocol is spoken under (Sec-WebSocket-Protocol). */
typedef struct rt_ws_protocols_s {
    const char *names[4]; /* tokens shorter than 12 bytes, case-sensitive; NULL after the last */
    bool required;        /* a client must offer one (RFC 7395 3.1); else one that offers no
                             list at all is served too */
} rt_ws_protocols_t;

typedef struct rt_ws_upgrade_s {
    char accept[29];         /* Sec-WebSocket-Accept: base64(SHA-1(key + GUID)), NUL-terminated */
    char subprotocol[12];    /* chosen: one of the protocol's names; "" when the client offered
                                no list (and none is required) */
    char forwarded_for[256]; /* X-Forwarded-For as received (several headers joined by ", "),
                                "" when absent or too long (too long is not an error) */
} rt_ws_upgrade_t;

/*
** Parses an upgrade request whose head starts at buf (with libhttp-parser). The subprotocol
** chosen is the first of the client's list that protos names. Returns:
**  0          a valid upgrade for path (the query string is ignored): *head_len is the
**             head's length through its blank line (bytes after it are WebSocket frames);
**  RT_EAGAIN  the head is incomplete and shorter than RT_WS_HEAD_MAX;
**  an HTTP status otherwise, with *why for the log: 400 (not HTTP, not GET, not
**             HTTP/1.1 or later, Upgrade not websocket, Connection without the upgrade
**             token, a Sec-WebSocket-Key that is not 16 bytes in base64 or is absent or
**             repeated, a subprotocol list with none of protos's names, or no list when
**             protos requires one, a header folded over lines, or a head past
**             RT_WS_HEAD_MAX), 404 (another path), 426 (Sec-WebSocket-Version absent or
**             not 13).
** The request line is checked first, then the path, then the WebSocket headers.
*/
int rt_ws_parse_upgrade(const uint8_t *buf, size_t len, const char *path,
                        const rt_ws_protocols_t *protos, size_t *head_len, rt_ws_upgrade_t *out,
                        const char **why);
/* The 101 answer for a parsed upgrade; returns its length (< cap), 0 if cap is too small. */
size_t rt_ws_upgrade_response(const rt_ws_upgrade_t *u, char *out, size_t cap);
/* An error answer (with "Sec-WebSocket-Version: 13" for 426; Connection: close). */
size_t rt_ws_error_response(int status, char *out, size_t cap);

#endif

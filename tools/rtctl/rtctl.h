/*
 * rtctl: the admin socket client of rtd (docs/ADMIN.md).
 *
 * rtctl.c holds the command line, the connection and the protocol; rtctl_top.c the live
 * `rtctl top` screen and its batch modes. Besides libc, rtd's config loader (rtctl -c).
 */
#ifndef RTCTL_H
#define RTCTL_H

#include <stdbool.h>
#include <stddef.h>

#define RTCTL_DEFAULT_SOCKET "data/rtd.sock" /* what `make run` uses (data_dir "data") */
#ifdef RT_DEFAULT_CONFIG
#define RTCTL_DEFAULT_WHERE "the socket of " RT_DEFAULT_CONFIG ", else " RTCTL_DEFAULT_SOCKET
#else
#define RTCTL_DEFAULT_WHERE RTCTL_DEFAULT_SOCKET
#endif
#define RTCTL_MAX_PATH 4096 /* the socket's path, bytes */
#define RTCTL_SOCKET_ENV "RTCTL_SOCKET"
#define RTCTL_DEFAULT_TIMEOUT_S 30.0 /* connect and each response; a rules reload takes seconds */
#define RTCTL_MAX_LINE (64 * 1024)   /* a request line, as rtd accepts it, bytes */
#define RTCTL_MAX_STATUS 32          /* a response's `CODE LENGTH\n`, bytes */
#define RTCTL_MAX_BODY (256u << 20)  /* a longer body is taken as a broken stream, bytes */

/* Exit codes. */
#define RTCTL_EXIT_OK 0    /* 2xx */
#define RTCTL_EXIT_FAIL 1  /* 4xx or 5xx, or `top` lost its connection */
#define RTCTL_EXIT_USAGE 2 /* bad usage, cannot connect, broken or late response */

/* Results of the connection functions (0 is success). */
#define RTCTL_ELOST (-1)    /* the peer closed or reset the connection */
#define RTCTL_ETIMEOUT (-2) /* no complete response within the timeout */
#define RTCTL_EPROTO (-3)   /* the response does not follow the protocol */
#define RTCTL_ETOOLONG (-4) /* the request line is longer than RTCTL_MAX_LINE */
#define RTCTL_ENOCONFIG (-5) /* the installed config is not there (its socket is no default) */

/* One connection to the admin socket. The body buffer belongs to the connection and is
 * valid until the next request or rtctl_conn_close(). */
typedef struct rtctl_conn_s {
    int fd;
    const char *path; /* as given by the user, for messages; not owned */
    double timeout_s; /* bound of each response */
    char *body;       /* the last response's body, NUL-terminated; owned */
    size_t body_len;
    size_t body_cap;
    char rbuf[4096]; /* bytes read beyond what was consumed */
    size_t rlen;
    size_t roff;
} rtctl_conn_t;

/* Connects to path within timeout_s. On failure prints why (rtd not running, permission)
 * to stderr and returns -1; on success 0 and an initialised *c. */
int rtctl_conn_open(rtctl_conn_t *c, const char *path, double timeout_s);
void rtctl_conn_close(rtctl_conn_t *c);

/* Sends the words as one request line (each word double-quoted and escaped) and reads the
 * response: its code into *code, its body into c->body. Returns 0 or an RTCTL_E* code. */
int rtctl_request(rtctl_conn_t *c, const char *const *words, int nwords, int *code);

/* A sentence for an RTCTL_E* code. */
const char *rtctl_strerror(int err);

/* Monotonic clock, seconds. */
double rtctl_now(void);

/* Parses a positive number of seconds (fractions allowed); 0 on success, -1 otherwise. */
int rtctl_parse_seconds(const char *s, double *out);

/* `rtctl top --help`: what top takes (rtctl --help shows it too). */
extern const char rtctl_top_usage[];
/* `rtctl top ARGS...`: the words after `top`. json is set when --json came before `top`. */
int rtctl_top_main(const char *path, double timeout_s, int json, int argc, char **argv);

#endif

/*
** A small blocking HTTP/1.1 client: POSTs JSON to one endpoint (http:// or https:// with the
** peer verified against a CA file or the system's, its name checked), with extra request
** headers of the caller's, responses read with libhttp-parser (Content-Length or chunked),
** bounded in size, every step under one deadline. Connections are kept alive and reused, at
** most `keep` idle at a time; a reused one the server closed is replaced once, by a new
** connection, transparently. Its users block while they wait: the HTTP authenticator
** (auth_http.c, from its own threads) and the webhook sink (sink_http.c, on the blocking
** pool). Once its headers are added, safe from any number of threads at once.
*/
#ifndef RT_HTTP_CLIENT_H
#define RT_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define RT_HTTPC_MAX_RESPONSE (64u << 10) /* a longer response body is an error */

typedef struct rt_httpc_s rt_httpc_t;

/* An endpoint: 0, or RT_EINVAL (a URL we cannot use, a CA file that does not load) with err. */
int rt_httpc_new(const char *url, const char *ca_file, uint32_t timeout_ms, unsigned keep,
                 rt_httpc_t **out, char *err, size_t errlen);
void rt_httpc_free(rt_httpc_t *h);

/*
** Adds "name: value" to every request h makes; before the first post, never beside one. 0, or
** RT_EINVAL with err: a name that is not an HTTP token or one the client writes itself (Host,
** Content-Type, Content-Length, Transfer-Encoding, Connection), a value with a control byte.
*/
int rt_httpc_add_header(rt_httpc_t *h, const char *name, const char *value, char *err,
                        size_t errlen);

/*
** POSTs body (JSON) and waits for the answer, within the timeout: 0 with *status and the body
** (*resp, malloc'd and NUL-terminated, *resplen bytes; resp NULL: the body is read, of any
** length, and dropped), or RT_EPROTO with err (no connection, TLS refused, timed out, a
** malformed or too long answer). A request whose answer timed out may have been handled.
*/
int rt_httpc_post(rt_httpc_t *h, const char *body, size_t len, int *status, char **resp,
                  size_t *resplen, char *err, size_t errlen);

/*
** Opens a connection and keeps it idle for the next post (closed at once when keep is 0):
** whether the endpoint takes connections now. 0, or RT_EPROTO with err.
*/
int rt_httpc_connect(rt_httpc_t *h, char *err, size_t errlen);
/* Closes the idle connections: after a failure they are suspect. */
void rt_httpc_close_idle(rt_httpc_t *h);

/* Connections opened so far (tests: keep-alive reuses them). */
uint64_t rt_httpc_connects(const rt_httpc_t *h);
/* Bytes h holds itself (not OpenSSL's). */
size_t rt_httpc_held(const rt_httpc_t *h);

#endif

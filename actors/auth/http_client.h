/*
** A small blocking HTTP/1.1 client for the HTTP authenticator (auth_http.c): POSTs to one
** endpoint (http:// or https:// with the peer verified against a CA file or the system's, its
** name checked), responses read with libhttp-parser (Content-Length or chunked), bounded in
** size, every step under one deadline. Connections are kept alive and reused, at most
** `keep` idle at a time; a reused one the server closed is replaced once, transparently.
** Called from the authenticator's own threads, never from an actor: safe from any number of
** threads at once.
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
** POSTs body (JSON) and waits for the answer, within the timeout: 0 with *status and the body
** (*resp, malloc'd and NUL-terminated, *resplen bytes), or RT_EPROTO with err (no connection,
** TLS refused, timed out, a malformed or too long answer).
*/
int rt_httpc_post(rt_httpc_t *h, const char *body, size_t len, int *status, char **resp,
                  size_t *resplen, char *err, size_t errlen);

/* Connections opened so far (tests: keep-alive reuses them). */
uint64_t rt_httpc_connects(const rt_httpc_t *h);

#endif

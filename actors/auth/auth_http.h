/*
** The HTTP authenticator (docs/AUTH.md, "HTTP authentication"), as EMQX's and
** mosquitto-go-auth's: a login is POSTed as JSON to the operator's service, whose answer
** allows, denies or passes it (ignore) and may carry the client's ACL and an expiry. The request
** names the client's verified TLS certificate when it has one. Answers are cached per (user
** name, certificate, password) for cache_ttl_s, refusals too, in a bounded table, so
** a reconnecting fleet does not become a call per connect; a cached answer is given on the
** scheduler, at once. Calls run on the authenticator pool's own threads (auth_pool.c), never
** on a scheduler nor on the blocking pool the store shares. When the service cannot be
** reached, on_error says what happens: deny (MQTT 5 0x88, server unavailable), ignore (the
** next authenticator judges) or cache (users with an answer in the cache, even one past its
** TTL, are admitted as it said). Only the auth files include this.
*/
#ifndef RT_AUTH_HTTP_H
#define RT_AUTH_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"

typedef struct rt_authhttp_s rt_authhttp_t;

int rt_authhttp_load(const rt_conf_auth_t *conf, rt_authhttp_t **out, char *err, size_t errlen);
void rt_authhttp_free(rt_authhttp_t *a);

/*
** The authenticator's say, as auth.c's file_says: RT_AUTH_OK (grant filled), RT_AUTH_BAD_PASSWORD
** (denied), RT_AUTH_ANONYMOUS_REFUSED (ignore: the next one judges), RT_AUTH_UNAVAILABLE (no
** answer and on_error deny), or, with may_call false and no fresh cached answer,
** RT_AUTH_PENDING. may_call true blocks for up to timeout_ms: from the pool's threads only.
*/
int rt_authhttp_says(rt_authhttp_t *a, const rt_auth_request_t *q, bool may_call,
                     rt_auth_grant_t *grant);

typedef struct rt_authhttp_stats_s {
    uint64_t calls, allowed, denied, ignored, errors; /* answers from the service, and failures */
    uint64_t cache_hits, cache_misses, cache_entries, cache_evictions;
    uint64_t connects; /* connections opened to the service (keep-alive reuses them) */
} rt_authhttp_stats_t;
void rt_authhttp_stats(const rt_authhttp_t *a, rt_authhttp_stats_t *out);

/* ---- The pool (auth_pool.c): threads that decide logins whose chain makes calls ---- */

/* Starts (or resizes up to) threads threads; 0 or RT_ENOMEM. Idempotent. */
int rt__auth_pool_start(unsigned threads);
/* Stops and joins them; requests still queued are answered RT_AUTH_PENDING. */
void rt__auth_pool_stop(void);
/* Queues a verifier request (auth.h's RT_AUTH_MSG_VERIFY message, owned from here): 0, or
   RT_ELIMIT (the queue is full: the caller refuses as unavailable) or RT_ENOPROC. */
int rt__auth_pool_push(rt_msg_t *m);
bool rt__auth_pool_running(void);

#endif

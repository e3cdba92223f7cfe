/*
** JSON Web Tokens as passwords (docs/AUTH.md, "The login chain and JSON Web Tokens"), as
** EMQX's JWT authenticator: HS256 with a shared secret, RS256 and ES256 with a public key or
** a JWKS file, verified here with OpenSSL (RFC 7515, 7518, 7519). The algorithm is the key's: a
** token whose header names another (or "none") is refused, so an RSA public key can never
** be taken for an HMAC secret. exp and nbf are checked when present, aud and iss when
** configured, and up to two claims against the user name and the client id. An acl claim
** ({"pub": [...], "sub": [...], "all": [...]}, topics with %u and %c) becomes the client's
** own ACL. Only the auth files include this.
*/
#ifndef RT_JWT_H
#define RT_JWT_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"

#define RT_JWT_MAX_TOKEN 16384 /* bytes; a longer password is no token of ours */
#define RT_JWT_MIN_SECRET 32   /* HS256 keys shorter than its hash are refused (RFC 7518 3.2) */

typedef struct rt_jwt_s rt_jwt_t;

/* Loads conf's keys (files checked with rt_file_trusted): 0, or RT_E* with err. */
int rt_jwt_load(const rt_conf_auth_t *conf, rt_jwt_t **out, char *err, size_t errlen);
void rt_jwt_free(rt_jwt_t *j);
size_t rt_jwt_bytes(const rt_jwt_t *j);
/* Whether its check costs microseconds (HS256: one HMAC), so a scheduler may make it; a
   public key's (tens of microseconds and more) is the verifier's. */
bool rt_jwt_cheap(const rt_jwt_t *j);

typedef enum { RT_JWT_IGNORE, RT_JWT_DENY, RT_JWT_ALLOW } rt_jwt_verdict_t;

/*
** Judges token (the CONNECT's password) for user (NULL: none) and client id cid at Unix time
** now_s: RT_JWT_IGNORE when it is not shaped as a JWT (the next authenticator judges),
** RT_JWT_DENY with *why, or RT_JWT_ALLOW with grant filled (its acl malloc'd: the caller
** frees it). Safe from any number of threads.
*/
rt_jwt_verdict_t rt_jwt_check(const rt_jwt_t *j, const char *user, const char *cid,
                              const uint8_t *token, size_t len, int64_t now_s,
                              rt_auth_grant_t *grant, const char **why);

#endif

/*
** SASL for XMPP's c2s, server side: SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802, RFC 7677),
** their -PLUS variants with tls-exporter (RFC 9266) or tls-server-end-point (RFC 5929)
** channel binding, and PLAIN (RFC 4616) checked against the same stored keys.
**
** Accounts keep only SCRAM's stored keys (salt, iteration count, StoredKey, ServerKey): no
** password, nothing from which one could be computed other than by guessing. Two kinds of
** work, two kinds of caller:
**   slow  rt_scram_cred_make, rt_scram_cred_derive, rt_scram_check_password: PBKDF2 over
**         the iteration count, milliseconds each. Never on a scheduler thread: the blocking
**         pool (an RT_TYPE_BLOCKING actor), a worker, or outside the runtime (the CLI).
**   fast  the exchange (rt_scram_start .. rt_scram_client_final) and rt_sasl_plain_parse:
**         parsing, a few HMACs and hashes, microseconds; a session's actor runs them.
**
** An exchange is one object the caller allocates, of rt_scram_size(len) bytes for a
** client-first message of len bytes (on the session's heap: rt_alloc(self, ..,
** RT_OBJ_LEAF), freed once the outcome is known); it holds no pointers and everything it
** returns points into it. Steps, each once and in order:
**   rt_scram_start         the client-first message: gs2 header (channel binding flag,
**                          authzid), user name, client nonce. The caller prepares the user
**                          name (a localpart, jid.h), finds its credentials (accounts.h,
**                          blocking) and then
**   rt_scram_server_first  writes the server-first message with a fresh server nonce from
**                          OpenSSL's CSPRNG. cred NULL (no such user) makes up a salt that
**                          is the same each time for that name, so a client cannot tell an
**                          unknown user from a wrong password: the proof never verifies.
**   rt_scram_client_final  checks channel binding (against the data the caller takes from
**                          its TLS connection), the nonce and the proof (in constant time),
**                          and writes the server-final message (v=).
** A refused message ends the exchange (every later step refuses too): rt_scram_failure
** names why, as SCRAM's e= value and as the RFC 6120 §6.5 condition the c2s sends.
*/
#ifndef RT_XMPP_SCRAM_H
#define RT_XMPP_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef enum rt_scram_hash_e {
    RT_SCRAM_SHA1 = 0,
    RT_SCRAM_SHA256 = 1,
} rt_scram_hash_t;

#define RT_SCRAM_KEY_MAX 32             /* bytes of a key: SHA-256's; SHA-1's are 20 */
#define RT_SCRAM_SALT_BYTES 16          /* salt of new credentials */
#define RT_SCRAM_SALT_MAX 64            /* stored salts may be up to this long */
#define RT_SCRAM_ITERATIONS 10000       /* PBKDF2 rounds of new credentials (Prosody's; ~5 ms) */
#define RT_SCRAM_MIN_ITERATIONS 4096    /* fewer is refused (RFC 7677 §4 asks for 4096 at least) */
#define RT_SCRAM_MAX_ITERATIONS 1000000 /* more is refused: a client pays this too */
#define RT_SCRAM_MSG_MAX 4096           /* bytes of one client message */
#define RT_SCRAM_NONCE_MAX 256          /* bytes of the client's nonce */
#define RT_SCRAM_CB_DATA_MAX 64         /* bytes of channel binding data (SHA-512 of a cert) */

/* Channel binding types, as flags of what the TLS layer of a connection can give. */
#define RT_SCRAM_CB_TLS_EXPORTER 1u         /* RFC 9266: TLS 1.3 only */
#define RT_SCRAM_CB_TLS_SERVER_END_POINT 2u /* RFC 5929: hash of the server's certificate */

/* Credentials of one user for one hash: what accounts store. */
typedef struct rt_scram_cred_s {
    uint8_t hash;     /* rt_scram_hash_t */
    uint8_t salt_len; /* 1 to RT_SCRAM_SALT_MAX */
    uint32_t iterations;
    uint8_t salt[RT_SCRAM_SALT_MAX];
    uint8_t stored_key[RT_SCRAM_KEY_MAX]; /* H(HMAC(SaltedPassword, "Client Key")) */
    uint8_t server_key[RT_SCRAM_KEY_MAX]; /* HMAC(SaltedPassword, "Server Key") */
} rt_scram_cred_t;

size_t rt_scram_key_len(rt_scram_hash_t hash); /* 20 or 32 */
/* "SCRAM-SHA-1", "SCRAM-SHA-256-PLUS", ... */
const char *rt_scram_mech_name(rt_scram_hash_t hash, bool plus);
/* The mechanism a client named (case-sensitive, as RFC 4422 has it): 0 or RT_ENOTFOUND. */
int rt_scram_mech_parse(const char *name, size_t len, rt_scram_hash_t *hash, bool *plus);

/*
** SLOW. Credentials for password (UTF-8, SASLprep'd here: RFC 5802 §2.2) with the given
** salt and iterations. 0, or RT_EINVAL (a password SASLprep refuses or empties, a salt or
** count out of range; *why says which when why is not NULL), RT_ENOMEM.
*/
int rt_scram_cred_derive(rt_scram_hash_t hash, const char *pw, size_t pwlen, const uint8_t *salt,
                         size_t saltlen, uint32_t iterations, rt_scram_cred_t *out,
                         const char **why);
/* SLOW. rt_scram_cred_derive with a new random salt of RT_SCRAM_SALT_BYTES; RT_EAGAIN: no
   randomness to be had. */
int rt_scram_cred_make(rt_scram_hash_t hash, const char *pw, size_t pwlen, uint32_t iterations,
                       rt_scram_cred_t *out, const char **why);
/*
** SLOW (derives with the stored salt and count). Whether pw is the password cred was made
** from: 0, RT_EACCES (it is not; compared in constant time), RT_EINVAL (cred unusable, or
** SASLprep refuses pw, which no stored password can then be), RT_ENOMEM.
*/
int rt_scram_check_password(const rt_scram_cred_t *cred, const char *pw, size_t pwlen);

/* Why an exchange failed: SCRAM's e= value and the SASL condition of RFC 6120 §6.5. */
typedef enum rt_scram_fail_e {
    RT_SCRAM_OK = 0,
    RT_SCRAM_MALFORMED,      /* a message breaks RFC 5802's grammar: invalid-encoding */
    RT_SCRAM_EXTENSION,      /* a mandatory extension (m=): extensions-not-supported */
    RT_SCRAM_BAD_USERNAME,   /* a user name or authzid that is not UTF-8 or badly escaped */
    RT_SCRAM_CB_UNSUPPORTED, /* 'p' without a -PLUS mechanism, or -PLUS without 'p' */
    RT_SCRAM_CB_TYPE,        /* a channel binding type this connection cannot give */
    RT_SCRAM_DOWNGRADE,      /* 'y' although -PLUS was offered: server-does-support-... */
    RT_SCRAM_CB_MISMATCH,    /* c= is not the header and this connection's binding data */
    RT_SCRAM_NONCE,          /* r= is not the nonce of this exchange (a replayed message) */
    RT_SCRAM_BAD_PROOF,      /* wrong password, or no such user: invalid-proof */
    RT_SCRAM_OUT_OF_TURN,    /* a step again, out of order, or after a failure */
    RT_SCRAM_NO_RESOURCES,   /* no randomness or a crypto call failed: no-resources */
} rt_scram_fail_t;

const char *rt_scram_fail_name(rt_scram_fail_t f);      /* "invalid-proof" */
const char *rt_scram_fail_condition(rt_scram_fail_t f); /* "not-authorized" */

/* An exchange: private fields, a caller-allocated object of rt_scram_size() bytes. */
typedef struct rt_scram_s rt_scram_t;

/* What the client-first message said; the texts point into the exchange (NUL-terminated). */
typedef struct rt_scram_first_s {
    const char *user; /* unescaped (=2C, =3D), UTF-8, not yet prepared */
    size_t user_len;
    const char *authzid; /* NULL: none */
    size_t authzid_len;
    unsigned cb; /* the RT_SCRAM_CB_ type the client binds to; 0: none */
} rt_scram_first_t;

/* Bytes of an exchange whose client-first message has len bytes; 0 if len is too long. */
size_t rt_scram_size(size_t len);

/*
** Starts an exchange in s (size bytes, rt_scram_size(len) or more) with the client-first
** message msg. plus: the client chose a -PLUS mechanism; cb_offered: the RT_SCRAM_CB_
** types this connection can give (-PLUS was advertised iff nonzero). 0 with *first
** filled, RT_EPROTO (rt_scram_failure says why), RT_EINVAL (size too small).
*/
int rt_scram_start(rt_scram_t *s, size_t size, rt_scram_hash_t hash, bool plus, unsigned cb_offered,
                   const void *msg, size_t len, rt_scram_first_t *first);

/*
** The server-first message, into the exchange (*out, *outlen). cred: the user's for this
** exchange's hash, or NULL when there is none. 0, RT_EPROTO (out of turn),
** RT_EINVAL (cred of another hash, or with a count out of range), RT_EAGAIN (no randomness).
*/
int rt_scram_server_first(rt_scram_t *s, const rt_scram_cred_t *cred, const char **out,
                          size_t *outlen);

/*
** Checks the client-final message. cb_data: the connection's data for the type the
** client chose (first->cb; ignored when 0): the tls-exporter key material or the
** certificate hash. 0: authenticated, the server-final message in *out. RT_EACCES: the
** proof or the channel binding failed; RT_EPROTO: a malformed message or out of turn.
*/
int rt_scram_client_final(rt_scram_t *s, const void *msg, size_t len, const void *cb_data,
                          size_t cb_len, const char **out, size_t *outlen);

rt_scram_fail_t rt_scram_failure(const rt_scram_t *s);

/* The step behind rt_scram_server_first with a server nonce of the caller's (tests). */
int rt__scram_server_first_nonce(rt_scram_t *s, const rt_scram_cred_t *cred, const char *nonce,
                                 size_t nonce_len, const char **out, size_t *outlen);

/* ---- PLAIN (RFC 4616), only ever inside TLS ---- */
#define RT_SASL_PLAIN_FIELD_MAX 3071 /* bytes of each field: a whole JID's worth */

typedef struct rt_sasl_plain_s {
    const char *authzid; /* into the message; not NUL-terminated; authzid_len 0: none */
    size_t authzid_len;
    const char *authcid; /* the user name, not yet prepared */
    size_t authcid_len;
    const char *passwd;
    size_t passwd_len;
} rt_sasl_plain_t;

/*
** Splits message = [authzid] NUL authcid NUL passwd: 0, or RT_EPROTO (not exactly two
** NULs, an empty authcid or passwd, a field over RT_SASL_PLAIN_FIELD_MAX or not UTF-8).
*/
int rt_sasl_plain_parse(const void *msg, size_t len, rt_sasl_plain_t *out);

#endif

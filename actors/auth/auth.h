/*
** Authentication for rtd: a password file, the login policy, and a slow-down
** of failed logins per source address.
**
** The password file has Mosquitto's format, one `user:hash` line per user;
** blank lines and lines starting with `#` are ignored. Two hashes are read:
**   $7$ITERATIONS$SALT$HASH  PBKDF2-HMAC-SHA512 (what `rtd passwd` and
**                            mosquitto_passwd write; 64-byte hash, base64)
**   $6$SALT$HASH             SHA-512(password || salt), Mosquitto 1.6's default
** `rtd passwd` writes $7$ with a 16-byte salt from getrandom and
** RT_AUTH_PBKDF2_ITERATIONS rounds (mosquitto_passwd: 12 bytes, 101 rounds).
** rtd reads both; Mosquitto 2.0 reads only 12-byte salts, so a Mosquitto
** broker refuses the users `rtd passwd` writes (set RT_AUTH_SALT_BYTES to 12
** if one file must serve both brokers).
**
** Tables are immutable once loaded. The process-wide ones (the password table
** here, the ACL in acl.h) are swapped by a reload while scheduler threads read
** them (rcu.h): a reader never sees a freed table.
**
** The files: password_table.c (tables and hashes), limiter.c (addresses and the
** slow-down), auth.c (the process-wide policy), verifier.c (full hashes off the
** schedulers), passwd.c (`rtd passwd`), auth_file.c (reading the files), acl.c.
*/
#ifndef RT_AUTH_H
#define RT_AUTH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "config.h"
#include "rt.h"

#define RT_AUTH_PBKDF2_ITERATIONS 10000 /* rounds for new hashes: 5-8 ms CPU per full check */
#define RT_AUTH_SALT_BYTES 16           /* salt for new hashes */
#define RT_AUTH_MAX_ITERATIONS 10000000 /* a file asking for more is refused */
#define RT_AUTH_ERR_LEN 512             /* bytes for an error message */

/* Failed-login slow-down. */
#define RT_AUTH_DELAY_BASE_MS 100         /* delay after one recent failure; doubles per failure */
#define RT_AUTH_MAX_DELAY_MS_DEFAULT 5000 /* cap (setting auth_max_delay_ms) */
#define RT_AUTH_FAIL_HALF_LIFE_MS 60000   /* a failure counts half after this long */
#define RT_AUTH_FAIL_SLOTS 4096           /* addresses remembered (8-way sets), ~160 KB */

typedef enum rt_auth_result_e {
    RT_AUTH_OK = 0,
    RT_AUTH_BAD_PASSWORD = 1, /* known user, wrong password */
    RT_AUTH_UNKNOWN_USER = 2, /* not in the password file */
    RT_AUTH_ANONYMOUS_REFUSED =
        3,                   /* no username: allow_anonymous false, or not from anonymous_from */
    RT_AUTH_PENDING = 4,     /* rt_auth_login_quick: only a full hash can decide */
    RT_AUTH_ANONYMOUS = 5,   /* admitted as a client without a user name: no password source
                                vouches for the one it sent, so it is not used (not for ACL
                                sections, %u, rules or the client list) */
    RT_AUTH_UNAVAILABLE = 6, /* an authentication service did not answer (MQTT 5 0x88) */
} rt_auth_result_t;

const char *rt_auth_result_name(int result);

/* ---- Password tables ---- */
typedef struct rt_auth_s rt_auth_t;

/*
** Loads a password file. Returns 0 with *out set (free with rt_auth_free), or
** RT_ENOTFOUND (cannot open), RT_EINVAL (err is "path:line: reason" for the
** first bad line), RT_ENOMEM.
*/
int rt_auth_load(const char *path, rt_auth_t **out, char *err, size_t errlen);
void rt_auth_free(rt_auth_t *a);
size_t rt_auth_users(const rt_auth_t *a);

/*
** Checks user's password (any bytes, MQTT passwords are binary) against a
** table: RT_AUTH_OK, RT_AUTH_BAD_PASSWORD or RT_AUTH_UNKNOWN_USER. The hash
** comparison is constant-time, and an unknown user costs a hash of the same
** kind and rounds as the file's first user, so timing tells neither. The last
** password that verified for a user is remembered (a keyed HMAC tag, in memory,
** for this table's life), so a reconnect with it costs microseconds instead of a
** full PBKDF2; a wrong password always pays the full cost. Safe from any number
** of threads.
*/
int rt_auth_check(const rt_auth_t *a, const char *user, const uint8_t *pw, size_t pwlen);

/* PBKDF2-HMAC-SHA512 (exposed for tests): 0 or RT_EINVAL. */
int rt_auth_pbkdf2_sha512(const uint8_t *pw, size_t pwlen, const uint8_t *salt, size_t saltlen,
                          uint32_t iterations, uint8_t *out, size_t outlen);

/*
** A new "$7$..." hash of pw with a fresh random salt, NUL-terminated in out
** (RT_AUTH_HASH_MAX bytes). 0, RT_EINVAL (out too small), or RT_EAGAIN when no
** randomness is available.
*/
#define RT_AUTH_HASH_MAX 160
int rt_auth_hash_password(const uint8_t *pw, size_t pwlen, uint32_t iterations, char *out,
                          size_t outlen);

/* ---- Source addresses and the failed-login slow-down ---- */
/* An address: IPv4 as v4-mapped IPv6. */
typedef struct rt_auth_addr_s {
    uint8_t b[16];
} rt_auth_addr_t;

/* The peer of a connected socket, and its port unless port is NULL: 0, or RT_EINVAL (not IP,
   not connected). */
int rt_auth_addr_from_fd(int fd, rt_auth_addr_t *out, uint16_t *port);
struct sockaddr_storage;
/* The same from an address accept gave: 0, or RT_EINVAL (not IP). */
int rt_auth_addr_from_sockaddr(const struct sockaddr_storage *ss, rt_auth_addr_t *out);
/* Numeric "1.2.3.4" or "2001:db8::1": 0 or RT_EINVAL. */
int rt_auth_addr_parse(const char *text, rt_auth_addr_t *out);
/* The other way: "1.2.3.4" for a v4-mapped address, else IPv6 text; "?" if it does not fit. */
void rt_auth_addr_format(const rt_auth_addr_t *a, char *out, size_t len);
/* "address:port" of an IPv4 or IPv6 socket address (rt_auth_addr_format's address), "?:0" for
   another family. */
void rt_auth_sockaddr_format(const struct sockaddr_storage *ss, char *out, size_t len);

/*
** A bounded table of recent failures per address (IPv6 per /64, since one
** host usually owns a whole /64). Each failure adds one to the address's
** count, which halves every RT_AUTH_FAIL_HALF_LIFE_MS; with n = floor(count + 0.05)
** the delay is 0 for n = 0, else RT_AUTH_DELAY_BASE_MS << (n - 1) capped at
** max_delay_ms. A success forgets the address. The table has a fixed size:
** a new address evicts the entry with the lowest count in its set, and the
** sets are chosen by a keyed hash so a client cannot aim at one. Safe from any
** number of threads; now_ms is a monotonic clock (tests pass their own).
*/
typedef struct rt_auth_limiter_s rt_auth_limiter_t;

int rt_auth_limiter_new(uint32_t max_delay_ms, rt_auth_limiter_t **out);
void rt_auth_limiter_free(rt_auth_limiter_t *l);
/* Notes a failure and returns the delay for it (the count includes this failure). */
uint32_t rt_auth_limiter_fail(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms);
void rt_auth_limiter_succeed(rt_auth_limiter_t *l, const rt_auth_addr_t *a);
uint32_t rt_auth_limiter_delay(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms);
/*
** The same table as a rate per address (XMPP in-band registrations): each address's count
** drains linearly, burst every period_ms, and an event is allowed while the count, with
** it, stays within burst: burst at once, then one each period_ms / burst. Refused events
** are not counted (a client that waits gets through). rt_auth_limiter_free frees it.
*/
int rt_auth_rate_new(uint32_t burst, uint64_t period_ms, rt_auth_limiter_t **out);
/* Counts an event of address a and returns true, or false (not counted) past the rate. */
bool rt_auth_rate_take(rt_auth_limiter_t *l, const rt_auth_addr_t *a, uint64_t now_ms);
/* Addresses remembered, and entries given up for a newer address. */
void rt_auth_limiter_usage(rt_auth_limiter_t *l, size_t *entries, uint64_t *evictions);

/* ---- The process-wide policy (what the connection actor calls) ---- */

/*
** What a login's authenticator grants besides admission (a JWT's, jwt.h): when the
** connection must end, an ACL of the client's own in acl.h's format, which then judges
** its requests in place of acl_file, and a mountpoint (a tenant, broker/tenant.h).
*/
typedef struct rt_auth_grant_s {
    int64_t expire_at_s; /* Unix seconds; 0: never */
    char *acl;           /* malloc'd text, or NULL: acl_file judges */
    size_t acl_len;
    char mount[RT_CONF_MOUNT_MAX]; /* the client's mountpoint (%u, %c unexpanded), in place of
                                      its listener's; "": the listener's */
} rt_auth_grant_t;
void rt_auth_grant_free(rt_auth_grant_t *g);

/*
** The verified certificate a client presented in the TLS handshake (mutual TLS), as an
** authentication service is told it. Text that does not fit is left "" (never cut short: a
** shortened name could be someone else's); the fingerprint is always whole.
*/
#define RT_AUTH_TLS_CN_MAX 256       /* bytes for the CN, NUL included (64 characters of UTF-8) */
#define RT_AUTH_TLS_SUBJECT_MAX 1024 /* ... for the subject, NUL included */
typedef struct rt_auth_tls_s {
    char cn[RT_AUTH_TLS_CN_MAX];           /* the subject's CN as UTF-8; "": none */
    char subject[RT_AUTH_TLS_SUBJECT_MAX]; /* the subject, RFC 2253 ("CN=a,O=b") */
    uint8_t sha256[32];                    /* SHA-256 of the certificate (DER) */
} rt_auth_tls_t;

/* A CONNECT's credentials. */
typedef struct rt_auth_request_s {
    const rt_auth_addr_t *addr; /* NULL: not an IP peer */
    const char *listener;       /* "host:port" it came in on, or NULL */
    const char *user;           /* NULL: no user name */
    const char *clientid;       /* as sent ("" for none) */
    const uint8_t *pw;          /* NULL: no password */
    size_t pwlen;
    const rt_auth_tls_t *tls; /* NULL: plain, no certificate, or rt_auth_wants_tls false */
} rt_auth_request_t;

/*
** Whether the chain in force has an authenticator that is told the client's certificate (an
** http one): only then is it worth reading into a request's tls.
*/
bool rt_auth_wants_tls(void);

/*
** Decides a login through the chain (the setting auth; none: the password file): each
** authenticator in order allows, refuses, or passes (a user it does not know, a password
** that is no token), and when all pass the anonymous rules of rt_auth_login decide. With
** may_wait false a decision that needs a full hash or a signature check is not made:
** RT_AUTH_PENDING, nothing counted. grant (may be NULL) gets what an admission carries.
** Returns an rt_auth_result_t; *delay_ms as rt_auth_login's.
*/
int rt_auth_decide(const rt_auth_request_t *q, bool may_wait, uint32_t *delay_ms,
                   rt_auth_grant_t *grant);

/*
** Applies the settings allow_anonymous, anonymous_from, password_file, acl_file and
** auth_max_delay_ms: loads both files and only then swaps them in, so a bad
** file leaves everything as it was (err: "path:line: reason"). Called at start
** and again on SIGHUP. Returns 0 or an RT_E* code.
*/
int rt_auth_configure(const rt_conf_t *conf, char *err, size_t errlen);

/*
** allow_anonymous from the next CONNECT on (an administrator's live change);
** rt_auth_configure (SIGHUP) sets it from the configuration again.
*/
void rt_auth_set_allow_anonymous(bool allow);
bool rt_auth_allow_anonymous(void);

/* Loads path ("" or NULL: no password file) and swaps it in. */
int rt_auth_reload(const char *path, char *err, size_t errlen);

/*
** From outside any actor, while the runtime still runs: stops the authenticator pool's threads
** (auth_http.h; a call in flight finishes first, within its timeout), which answer connection
** actors through the runtime. Idempotent.
*/
void rt_auth_stop_pool(void);

/* Frees the process-wide tables (at exit, after rt_shutdown). */
void rt_auth_shutdown(void);

/*
** Decides a CONNECT: user is NULL when the packet has no username, pw NULL
** when it has no password. With a password file the user must be in it with that
** password. A client with no username is accepted only while allow_anonymous is
** true, and only from an address in anonymous_from (addr NULL: refused; loopback
** until rt_auth_configure sets the list). With no password file nothing can vouch
** for a username, so a client that sends one is an anonymous client under the same
** two rules (RT_AUTH_ANONYMOUS when admitted: its username must not be used), never
** more: a made-up name opens no door that no name would not. On a refusal the
** source address (addr, may be NULL) is noted and *delay_ms says how long to
** hold the negative CONNACK; on success it is 0 and the address forgotten.
** Counts every outcome (rt_auth_stats). Returns an rt_auth_result_t.
*/
int rt_auth_login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw, size_t pwlen,
                  uint32_t *delay_ms);

/*
** rt_auth_login without the expensive part: decides at once when it can (no
** password file, anonymous, or the password a user last logged in with,
** remembered), else returns RT_AUTH_PENDING having counted and noted nothing.
** Costs microseconds, so a scheduler thread may call it.
*/
int rt_auth_login_quick(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw,
                        size_t pwlen, uint32_t *delay_ms);

/*
** The verifier: one RT_TYPE_BLOCKING actor, registered as RT_AUTH_VERIFIER_NAME,
** that runs rt_auth_login for logins rt_auth_login_quick could not decide, so a
** PBKDF2 (milliseconds each, and a password guesser's every try) never runs on
** a scheduler thread. One, not a pool: a burst of logins then takes at most one
** core (of the blocking pool's threads) and queues in its mailbox, in arrival
** order; the queue is bounded by the connections open, each waiting for one
** answer at most.
*/
#define RT_AUTH_VERIFIER_NAME "auth_verifier"
#define RT_AUTH_MSG_VERIFY (RT_MSG_USER + 0x5500) /* the verifier's request (broker.h blocks) */

/*
** The answer: data of the reply_tag message the asker chose. RT_AUTH_PENDING means the
** verifier died before deciding: ask again (a restarted one, or decide in place).
*/
typedef struct rt_auth_verdict_s {
    int32_t result;      /* an rt_auth_result_t */
    uint32_t delay_ms;   /* as rt_auth_login's */
    int64_t expire_at_s; /* the grant's */
    uint32_t acl_len;    /* bytes of the grant's ACL text, which follow */
    uint32_t pad;
    char mount[RT_CONF_MOUNT_MAX]; /* the grant's */
} rt_auth_verdict_t;

#define RT_AUTH_GROUP "auth_sup" /* the verifier's supervisor (group.h) */

/*
** Starts the verifier (the broker does, at start), the permanent child of the group
** supervisor RT_AUTH_GROUP under sup (0: of nobody): 0 or an rt_spawn error.
*/
int rt_auth_verifier_start(rt_pid_t sup);

/*
** From an actor: asks the verifier to decide a login (rt_auth_decide; the request is
** copied). The calling actor later receives a message tagged reply_tag with an
** rt_auth_verdict_t, the grant's ACL text after it. Returns 0, RT_ENOPROC
** when no verifier runs (decide in place then), RT_EINVAL or RT_ENOMEM.
*/
int rt_auth_login_async(uint32_t reply_tag, const rt_auth_request_t *q);

typedef struct rt_auth_stats_s {
    uint64_t successes;
    uint64_t bad_password;
    uint64_t unknown_user;
    uint64_t anonymous_refused;
    uint64_t users;           /* in the current password file */
    uint64_t reloads;         /* successful rt_auth_configure/rt_auth_reload calls */
    uint64_t delay_entries;   /* addresses in the slow-down table */
    uint64_t delay_evictions; /* addresses it had to forget for newer ones */
    uint64_t bytes;           /* held by the password table and the slow-down table */
    /* The HTTP authenticators' (auth_http.h), summed. */
    uint64_t http_calls, http_errors, http_allowed, http_denied, http_ignored;
    uint64_t http_cache_hits, http_cache_misses, http_cache_entries, http_connects;
} rt_auth_stats_t;

void rt_auth_stats(rt_auth_stats_t *out);

/*
** `rtd passwd [-c] [-D] [-b] FILE USER [PASSWORD]`, as mosquitto_passwd: adds or
** changes USER (prompting twice without echo unless -b), -D deletes, -c starts
** a new file. The file is written whole to a temporary file (mode 0600) and
** renamed over the old one. argv[0] is "passwd". Returns the exit status.
*/
int rt_auth_passwd_main(int argc, char **argv);

/*
** Reads one password line from stdin for a command line tool: without echo from a terminal
** (the prompt goes to stderr), plainly from a pipe. A malloc'd string (cleanse, then free
** it) or NULL at the end of the input.
*/
char *rt_auth_read_password(const char *prompt);
/*
** A new password for a command line tool: read twice (rt_auth_read_password) and compared.
** A malloc'd string (cleanse, then free it), or NULL with *why ("no password was given",
** "the passwords do not match").
*/
char *rt_auth_ask_new_password(const char **why);

#endif

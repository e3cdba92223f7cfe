/*
 * rtb_xkeys: the client's SCRAM-SHA-256 keys, per (salt, iterations), as RFC 5802 allows a
 * client to cache them: PBKDF2 runs once per account, not per login. The password is -P, one
 * for all accounts or a pattern with the account's index (pw%i): a salt is the server's for
 * one account, so it also names the password it was used with. Kept in memory (open
 * addressing) and, with a file, across runs: the file is a header (magic, SHA-256 of -P)
 * then records appended in single writes, so that the processes of one run may append to it
 * at once. A file of another -P is ignored.
 */
#ifndef RTB_XKEYS_H
#define RTB_XKEYS_H

#include <stddef.h>
#include <stdint.h>

#define RTB_XKEY_SALT_MAX 64 /* base64 salt bytes kept */

/* The keys of one (salt, iterations). */
typedef struct rtb_xkey_s {
    uint32_t iter; /* 0 marks a free slot */
    uint8_t salt_len;
    char salt[RTB_XKEY_SALT_MAX]; /* base64, as the server sent it */
    uint8_t client_key[32];
    uint8_t stored_key[32];
    uint8_t server_key[32];
} rtb_xkey_t;

typedef struct rtb_xkeys_s {
    uint8_t pw_hash[32]; /* SHA-256 of -P, heads the file */
    rtb_xkey_t *keys;    /* owned, open addressing by salt */
    uint32_t cap, count;
    int fd;          /* the cache file, opened for appending; -1 without */
    uint64_t pbkdf2; /* salted passwords computed (not found) */
} rtb_xkeys_t;

/* pass_arg is -P; path may be NULL (memory only); a file that cannot be used is left out
 * silently. */
void rtb_xkeys_init(rtb_xkeys_t *k, const char *pass_arg, const char *path);
void rtb_xkeys_destroy(rtb_xkeys_t *k);

/*
 * The keys for salt[0..n) (base64) and iter: cached, else computed from pass (the account's
 * password) and added. NULL for a salt or count out of bounds, or out of memory. Valid until
 * the next call.
 */
const rtb_xkey_t *rtb_xkeys_get(rtb_xkeys_t *k, const char *pass, const char *salt, size_t n,
                                uint32_t iter);

#endif

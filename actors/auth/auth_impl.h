/*
** Inside auth, shared by its files: reading the password and ACL files, the password-file
** line format, and the password table's check and size. Only the .c files of actors/auth include
** this.
*/
#ifndef RT_AUTH_IMPL_H
#define RT_AUTH_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"

#define RT_AUTH_MAX_FILE_BYTES (256u << 20) /* a password or ACL file this large is refused */
#define RT_AUTH_MAX_NAME 65535              /* MQTT strings are at most this long */

/* Reads a whole file, NUL-terminated (free it); err says "path: reason". */
int rt__auth_read_file(const char *path, char **out, size_t *outlen, char *err, size_t errlen);
/* The next line of [*pos, end) without its newline and trailing blanks; false at the end. */
bool rt__auth_next_line(const char **pos, const char *end, const char **line, size_t *len);

/*
** Splits a password-file line into user (line[0..*userlen)) and hash. Returns false for
** lines that hold no user (blank, comment); sets *why for a malformed one.
*/
bool rt__auth_split_line(const char *line, size_t len, size_t *userlen, const char **hash,
                         size_t *hashlen, const char **why);

/*
** rt_auth_check, but with may_hash false a decision that needs a full hash (no remembered
** password matched) is not made: RT_AUTH_PENDING instead.
*/
int rt__auth_check(const rt_auth_t *a, const char *user, const uint8_t *pw, size_t pwlen,
                   bool may_hash);
/* Bytes the table holds, names included. */
size_t rt__auth_table_bytes(const rt_auth_t *a);
/* Bytes the slow-down table holds. */
size_t rt__auth_limiter_bytes(const rt_auth_limiter_t *l);
/* The cap on delays from now on (auth_max_delay_ms changed). */
void rt__auth_limiter_set_max_delay(rt_auth_limiter_t *l, uint32_t max_delay_ms);

/*
** A JSON object's topic lists ({"pub": [...], "sub": [...], "all": [...]}, EMQX's form), the
** member name of doc (a bson_t *), as ACL text (acl.h's format, "pattern" lines so %u and %c
** are filled per client): malloc'd, or NULL with *why when malformed (jwt.c).
*/
char *rt__auth_acl_text(const void *doc, const char *name, size_t *len, const char **why);
/*
** The member name of doc, a string, as a mountpoint into out ("" when doc has none): false
** with *why when it is not a string that fits (jwt.c). Its form is checked where %u and %c are
** filled in (broker/tenant.h).
*/
bool rt__auth_mount_text(const void *doc, const char *name, char out[RT_CONF_MOUNT_MAX],
                         const char **why);

/* Decides an RT_AUTH_MSG_VERIFY request and answers its sender (verifier.c): the verifier
   actor's work, and the pool's threads' (auth_pool.c). */
struct rt_msg_s;
void rt__auth_verify_msg(struct rt_msg_s *m);
/* Answers a request nobody will decide RT_AUTH_PENDING: its connection asks again. */
void rt__auth_verify_dead(struct rt_msg_s *m);
/* Whether the chain in force calls a service (its logins go to the pool). */
bool rt__auth_chain_calls(void);

#endif

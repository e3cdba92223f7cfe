/*
** Topic access control for rtd, in Mosquitto's acl_file format:
**
**   # comment
**   topic [read|write|readwrite|deny] TOPIC    anonymous clients, until the first `user`
**   user NAME                                  starts NAME's section (NAME may hold spaces)
**   topic [read|write|readwrite|deny] TOPIC    ... rules of that user
**   pattern [read|write|readwrite|deny] TOPIC  every client, wherever it is written;
**                                              %u is the user name, %c the client id
**
** The access word may be left out (readwrite). TOPIC is the rest of the line
** and must be a valid MQTT topic filter.
**
** Decisions. The rules that apply to a client are its own section's (or the
** anonymous section's, for a client without a user name) and every pattern,
** except patterns with %u for a client without a user name. A pattern whose
** %u or %c would bring in a value containing '+', '#' or '/', or an empty one,
** cannot be used safely: as an allow rule it grants nothing, as a deny rule it
** denies everything. Then:
**   - a deny rule that matches denies, whatever else allows (stricter than
**     Mosquitto, where a user's allow rule wins over a deny pattern);
**   - else a rule with the access asked for that matches allows;
**   - else the request is denied (with an ACL file, nothing is allowed by default).
** "Matches" depends on the request:
**   RT_ACL_WRITE      PUBLISH: the topic name matches the rule's filter;
**   RT_ACL_READ       delivery of a message: its topic name matches the filter;
**   RT_ACL_SUBSCRIBE  SUBSCRIBE with a filter (a "$share/GROUP/" prefix taken
**                     off first), checked against read and deny rules. A filter
**                     "covers" another when it matches every topic the other
**                     can match (a/# covers a/b/+ and a, not # or b/#), and
**                     "overlaps" it when some topic matches both. Then:
**                     - denied when a deny rule covers the filter (nothing it
**                       could deliver may be read), or when no read rule
**                       overlaps it (nothing it could deliver is allowed);
**                     - RT_ACL_ALLOW when a read rule covers it and no deny
**                       rule overlaps it: every topic it matches is readable;
**                     - else RT_ACL_FILTERED: granted, and each message it
**                       matches is delivered only if RT_ACL_READ allows its
**                       topic. With `topic readwrite #` and `topic deny
**                       test/nosubscribe`, SUBSCRIBE # and +/+ are granted
**                       and test/nosubscribe is withheld from them, as in
**                       Mosquitto (whose interoperability suite subscribes to
**                       # to clean up); SUBSCRIBE test/nosubscribe is denied.
**                     Coverage is decided one rule at a time: two deny rules
**                     that together cover a filter make it FILTERED, not denied.
** As in MQTT, a filter starting with a wildcard matches no topic starting with
** '$': rule # gives no $SYS topic, rule $SYS/# does.
*/
#ifndef RT_ACL_H
#define RT_ACL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define RT_ACL_READ 1u      /* receive messages on a topic name */
#define RT_ACL_WRITE 2u     /* publish to a topic name */
#define RT_ACL_SUBSCRIBE 4u /* subscribe with a topic filter (needs read) */

#define RT_ACL_DENY 0 /* rt_acl_check results */
#define RT_ACL_ALLOW 1
#define RT_ACL_FILTERED 2 /* RT_ACL_SUBSCRIBE only: granted, each delivery checked for read */

typedef struct rt_acl_s rt_acl_t;

/*
** Loads an ACL file. Returns 0 with *out set (free with rt_acl_free), or
** RT_ENOTFOUND (cannot open), RT_EINVAL (err is "path:line: reason" for the
** first bad line), RT_ENOMEM.
*/
int rt_acl_load(const char *path, rt_acl_t **out, char *err, size_t errlen);
void rt_acl_free(rt_acl_t *acl);
/* The same from text in memory (a login's grant, auth.h); name stands for the path in err. */
int rt_acl_parse(const char *text, size_t len, const char *name, rt_acl_t **out, char *err,
                 size_t errlen);
/* Bytes acl holds (0 for NULL). */
size_t rt_acl_bytes(const rt_acl_t *acl);

/*
** Decides one request against a table (see above): RT_ACL_ALLOW or
** RT_ACL_DENY, and for RT_ACL_SUBSCRIBE also RT_ACL_FILTERED. user is NULL
** for an anonymous client; clientid is the client's id (NUL-terminated);
** topic[0..len) is a topic name for READ and WRITE and a filter for
** SUBSCRIBE. access is exactly one of RT_ACL_*. No allocation; safe from any
** number of threads.
*/
int rt_acl_check(const rt_acl_t *acl, const char *user, const char *clientid, const char *topic,
                 size_t len, unsigned access);

/* ---- The process-wide ACL (swapped in by rt_auth_configure) ---- */

/*
** rt_acl_check against the current ACL, counting denials; with no ACL file
** every request is allowed.
*/
int rt_acl_permit(const char *user, const char *clientid, const char *topic, size_t len,
                  unsigned access);

/*
** rt_acl_permit, but a client whose login granted it an ACL of its own (own, not NULL) is
** judged by that alone (docs/AUTH.md, "The login chain and JSON Web Tokens"), counted the
** same.
*/
int rt_acl_permit_own(const rt_acl_t *own, const char *user, const char *clientid,
                      const char *topic, size_t len, unsigned access);

/* Whether an ACL file is in force (without one every request is allowed). */
bool rt_acl_active(void);

/* Loads path ("" or NULL: no ACL, allow all) and swaps it in. */
int rt_acl_reload(const char *path, char *err, size_t errlen);

/* Swaps acl (may be NULL) in and frees the previous one once no reader holds it. */
void rt_acl_install(rt_acl_t *acl);

typedef struct rt_acl_stats_s {
    uint64_t denied_publish;   /* RT_ACL_WRITE refusals */
    uint64_t denied_subscribe; /* RT_ACL_SUBSCRIBE refusals */
    uint64_t denied_read;      /* RT_ACL_READ refusals (deliveries withheld) */
    uint64_t rules;            /* in the current ACL file, 0 without one */
    uint64_t bytes;            /* held by the current ACL */
} rt_acl_stats_t;

void rt_acl_stats(rt_acl_stats_t *out);

#endif

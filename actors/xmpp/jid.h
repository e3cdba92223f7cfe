/*
** XMPP addresses (JIDs, RFC 7622): parsed, prepared and kept compact.
**
** A JID is localpart@domainpart/resourcepart, the localpart and resourcepart optional.
** Preparation is what ejabberd and Prosody do, so a JID here compares equal to theirs
** (federation and migrations depend on it): stringprep (RFC 3454) through GNU libidn,
** with the XMPP profiles of RFC 3920/6122, nodeprep for the localpart and resourceprep
** for the resourcepart, and IDNA2003 for the domainpart (nameprep, then ToASCII with the
** STD3 rules as the check, ToUnicode for A-labels: the domainpart is kept as U-labels,
** lower case, without a final dot). Like both of them, unassigned code points (of
** Unicode 3.2, stringprep's version) are allowed in localparts and resourceparts (a
** "query": today's emoji in a nickname) and refused in domainparts. RFC 7622's PRECIS
** profiles differ on some non-ASCII input (they keep ß and final sigma, and refuse
** compatibility characters such as U+2163 that nodeprep maps to "iv"); test_jid names each
** case. An IPv6 literal domainpart ("[::1]") is kept in its canonical text form.
**
** Each part is 1 to RT_JID_PART_MAX bytes as given and once prepared (RFC 7622 §3.1).
** Whatever any part looks like, preparing the result again gives the same result (a part
** whose prepared form would prepare to something else is refused). ASCII parts that need
** no more than case folding take a path that calls no library and allocates nothing; the
** others cost a few microseconds and libidn's transient malloc'd memory, never kept.
**
** An rt_jid_t is one string "local@domain/resource" with the three part lengths in front:
** the bare JID is a prefix of the full one, so hashing, comparing and printing either
** needs no copy. rt_jid_size() bytes hold one; a session keeps its JIDs as such objects
** on its own heap (rt_jid_dup), from 32 bytes for "user@example.com/phone".
*/
#ifndef RT_XMPP_JID_H
#define RT_XMPP_JID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rt.h"

#define RT_JID_PART_MAX 1023                      /* bytes of one part (RFC 7622 §3.1) */
#define RT_JID_TEXT_MAX (3 * RT_JID_PART_MAX + 2) /* bytes of a whole JID, separators included */

typedef enum rt_jid_part_e {
    RT_JID_LOCAL = 0,    /* nodeprep */
    RT_JID_DOMAIN = 1,   /* nameprep and IDNA */
    RT_JID_RESOURCE = 2, /* resourceprep */
} rt_jid_part_t;

typedef struct rt_jid_s {
    uint16_t local;    /* bytes of the localpart; 0: none */
    uint16_t domain;   /* bytes of the domainpart, 1 to RT_JID_PART_MAX */
    uint16_t resource; /* bytes of the resourcepart; 0: a bare JID */
    char s[];          /* "local@domain/resource", the parts present, NUL-terminated */
} rt_jid_t;

/* Room for any JID, for a JID being made (on the stack; a session keeps rt_jid_dup's). */
typedef union rt_jid_buf_u {
    rt_jid_t jid;
    char bytes[sizeof(rt_jid_t) + RT_JID_TEXT_MAX + 1];
} rt_jid_buf_t;

/*
** Parses and prepares the len bytes at in (any bytes: not NUL-terminated, NULs refused)
** into out. 0; RT_EINVAL with *why (a static sentence: "the localpart is empty"; why may
** be NULL) for a string that is no JID; RT_ENOMEM when libidn could not allocate.
*/
int rt_jid_prep(const char *in, size_t len, rt_jid_buf_t *out, const char **why);

/*
** Prepares one part alone (a SASL user name as a localpart, a resource a client asks to
** bind): into out (RT_JID_PART_MAX + 1 bytes, NUL-terminated), its length in *outlen.
** Returns as rt_jid_prep. in and out may not overlap.
*/
int rt_jid_prep_part(rt_jid_part_t part, const char *in, size_t len, char *out, size_t *outlen,
                     const char **why);

/*
** Puts prepared parts together (local or resource NULL or empty: none) into out, with no
** preparation: for parts that came out of rt_jid_prep_part or another JID. 0 or RT_EINVAL
** (a part too long, no domainpart).
*/
int rt_jid_make(rt_jid_buf_t *out, const char *local, size_t llen, const char *domain, size_t dlen,
                const char *resource, size_t rlen);

/* Bytes of the localpart before the domainpart's first byte. */
static inline size_t rt__jid_domain_at(const rt_jid_t *j)
{
    return j->local ? (size_t)j->local + 1 : 0;
}

static inline const char *rt_jid_local(const rt_jid_t *j) /* j->local bytes, if any */
{
    return j->s;
}

static inline const char *rt_jid_domain(const rt_jid_t *j) /* j->domain bytes */
{
    return j->s + rt__jid_domain_at(j);
}

static inline const char *rt_jid_resource(const rt_jid_t *j) /* j->resource bytes, if any */
{
    return j->s + rt__jid_domain_at(j) + j->domain + 1;
}

/* The bare JID is the first rt_jid_bare_len bytes of j->s. */
static inline size_t rt_jid_bare_len(const rt_jid_t *j)
{
    return rt__jid_domain_at(j) + j->domain;
}

static inline size_t rt_jid_len(const rt_jid_t *j)
{
    return rt_jid_bare_len(j) + (j->resource ? (size_t)j->resource + 1 : 0);
}

/* What a copy of j takes: rt_jid_dup's object, a memcpy's size. */
static inline size_t rt_jid_size(const rt_jid_t *j)
{
    return sizeof(rt_jid_t) + rt_jid_len(j) + 1;
}

static inline bool rt_jid_eq(const rt_jid_t *a, const rt_jid_t *b)
{
    return a->local == b->local && a->domain == b->domain && a->resource == b->resource &&
           memcmp(a->s, b->s, rt_jid_len(a)) == 0;
}

static inline bool rt_jid_bare_eq(const rt_jid_t *a, const rt_jid_t *b)
{
    return a->local == b->local && a->domain == b->domain &&
           memcmp(a->s, b->s, rt_jid_bare_len(a)) == 0;
}

/* The keyed hash (rt.h) of the bare JID: what a registry of bare JIDs is keyed by. */
static inline uint64_t rt_jid_bare_hash(const rt_jid_t *j)
{
    return rt_hash(j->s, rt_jid_bare_len(j));
}

/*
** A copy of j on the calling actor's heap (a leaf object of rt_jid_size(j) bytes, the
** actor's own: freed by rt_free or collected once unreachable). NULL when out of memory.
*/
rt_jid_t *rt_jid_dup(rt_actor_t *self, const rt_jid_t *j);

/*
** Stringprep with libidn's profile (one of libidn's Stringprep_profile tables) of the len
** bytes at in, which must be UTF-8 without NUL, into out (cap bytes, NUL-terminated).
** For SASLprep (scram.c) as for the JID parts here. 0, RT_EINVAL with *why, RT_ENOMEM.
*/
int rt__stringprep(const void *profile, int flags, const char *in, size_t len, char *out,
                   size_t cap, size_t *outlen, const char **why);

/* The slow path alone, for the tests that check the ASCII path gives what it would. */
int rt__jid_prep_part_slow(rt_jid_part_t part, const char *in, size_t len, char *out,
                           size_t *outlen, const char **why);

/*
** An account's name, USER@HOST (no resource), prepared: its localpart and domainpart into
** user and host (RT_JID_PART_MAX + 1 bytes each, NUL-terminated). 0, or RT_EINVAL with *why,
** or RT_ENOMEM, as rt_jid_prep.
*/
int rt_jid_account(const char *in, size_t len, char *user, char *host, const char **why);

#endif

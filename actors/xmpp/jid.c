/*
** JID preparation (jid.h): splitting a JID into its parts (RFC 7622 §3.1), the ASCII path
** that needs no library, and the stringprep and IDNA path through GNU libidn for the rest.
*/
#include <arpa/inet.h>
#include <idn-free.h>
#include <idna.h>
#include <stringprep.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "jid.h"

/* Why a part is refused; the texts below name the part. */
enum {
    PREP_LONG,       /* over RT_JID_PART_MAX bytes, as given or once prepared */
    PREP_EMPTY,      /* empty, as given or once prepared */
    PREP_UTF8,       /* not UTF-8, or holds a NUL */
    PREP_PROHIBITED, /* a character the profile prohibits */
    PREP_UNASSIGNED, /* a code point Unicode 3.2 does not assign (domainpart only) */
    PREP_BIDI,       /* right-to-left text against RFC 3454 §6 */
    PREP_UNSTABLE,   /* its prepared form prepares to something else */
    PREP_LABEL,      /* domainpart: an empty label, or one over 63 bytes in ASCII */
    PREP_LDH,        /* domainpart: not letters, digits and hyphens in ASCII (STD3) */
    PREP_ALABEL,     /* domainpart: an A-label that does not decode */
    PREP_IP,         /* domainpart: brackets around something not an IPv6 address */
    PREP_OTHER,      /* libidn refused it for another reason */
    PREP_N
};

static const char *const whys[3][PREP_N] = {
    [RT_JID_LOCAL] =
        {
            [PREP_LONG] = "the localpart is over 1023 bytes",
            [PREP_EMPTY] = "the localpart is empty",
            [PREP_UTF8] = "the localpart is not UTF-8 or holds a NUL",
            [PREP_PROHIBITED] = "the localpart holds a character nodeprep prohibits (a space, a "
                                "control, one of \"&'/:<>@, or a non-character)",
            [PREP_UNASSIGNED] = "the localpart holds a code point Unicode 3.2 does not assign",
            [PREP_BIDI] = "the localpart mixes right-to-left and left-to-right text",
            [PREP_UNSTABLE] = "the localpart's prepared form would prepare to another",
            [PREP_OTHER] = "nodeprep refused the localpart",
        },
    [RT_JID_DOMAIN] =
        {
            [PREP_LONG] = "the domainpart is over 1023 bytes",
            [PREP_EMPTY] = "the domainpart is empty",
            [PREP_UTF8] = "the domainpart is not UTF-8 or holds a NUL",
            [PREP_PROHIBITED] = "the domainpart holds a character nameprep prohibits",
            [PREP_UNASSIGNED] = "the domainpart holds a code point Unicode 3.2 does not assign",
            [PREP_BIDI] = "the domainpart mixes right-to-left and left-to-right text",
            [PREP_UNSTABLE] = "the domainpart's prepared form would prepare to another",
            [PREP_LABEL] = "a label of the domainpart is empty or over 63 bytes in ASCII",
            [PREP_LDH] = "the domainpart holds a character no host name may (letters, digits "
                         "and hyphens only, no hyphen at a label's ends)",
            [PREP_ALABEL] = "an A-label (xn--) of the domainpart does not decode",
            [PREP_IP] = "the domainpart's brackets hold no IPv6 address",
            [PREP_OTHER] = "IDNA refused the domainpart",
        },
    [RT_JID_RESOURCE] =
        {
            [PREP_LONG] = "the resourcepart is over 1023 bytes",
            [PREP_EMPTY] = "the resourcepart is empty",
            [PREP_UTF8] = "the resourcepart is not UTF-8 or holds a NUL",
            [PREP_PROHIBITED] = "the resourcepart holds a character resourceprep prohibits (a "
                                "control, a non-ASCII space, or a non-character)",
            [PREP_UNASSIGNED] = "the resourcepart holds a code point Unicode 3.2 does not assign",
            [PREP_BIDI] = "the resourcepart mixes right-to-left and left-to-right text",
            [PREP_UNSTABLE] = "the resourcepart's prepared form would prepare to another",
            [PREP_OTHER] = "resourceprep refused the resourcepart",
        },
};

/* Sets *why (if asked for) for part and reason; returns RT_EINVAL. */
static int refuse(rt_jid_part_t part, int reason, const char **why)
{
    if (why)
        *why = whys[part][reason] ? whys[part][reason] : whys[part][PREP_OTHER];
    return RT_EINVAL;
}

/* A libidn stringprep result as one of the reasons above. */
static int prep_reason(int rc)
{
    switch (rc) {
    case STRINGPREP_CONTAINS_UNASSIGNED:
        return PREP_UNASSIGNED;
    case STRINGPREP_CONTAINS_PROHIBITED:
        return PREP_PROHIBITED;
    case STRINGPREP_BIDI_BOTH_L_AND_RAL:
    case STRINGPREP_BIDI_LEADTRAIL_NOT_RAL:
    case STRINGPREP_BIDI_CONTAINS_PROHIBITED:
        return PREP_BIDI;
    case STRINGPREP_TOO_SMALL_BUFFER:
        return PREP_LONG;
    case STRINGPREP_ICONV_ERROR:
        return PREP_UTF8;
    default:
        return PREP_OTHER;
    }
}

/* stringprep in out, the reason (PREP_*) in *reason when it returns RT_EINVAL. */
static int stringprep_into(const Stringprep_profile *profile, int flags, const char *in, size_t len,
                           char *out, size_t cap, size_t *outlen, int *reason)
{
    if (len >= cap) {
        *reason = PREP_LONG;
        return RT_EINVAL;
    }
    if (!rt_utf8_text(in, len)) {
        *reason = PREP_UTF8;
        return RT_EINVAL;
    }
    memcpy(out, in, len);
    out[len] = 0;
    int rc = stringprep(out, cap, (Stringprep_profile_flags)flags, profile);
    if (rc == STRINGPREP_MALLOC_ERROR)
        return RT_ENOMEM;
    if (rc != STRINGPREP_OK) {
        *reason = prep_reason(rc);
        return RT_EINVAL;
    }
    *outlen = strlen(out);
    return 0;
}

int rt__stringprep(const void *profile, int flags, const char *in, size_t len, char *out,
                   size_t cap, size_t *outlen, const char **why)
{
    static const char *const texts[PREP_N] = {
        [PREP_LONG] = "too long",
        [PREP_UTF8] = "not UTF-8 or holds a NUL",
        [PREP_PROHIBITED] = "holds a prohibited character",
        [PREP_UNASSIGNED] = "holds an unassigned code point",
        [PREP_BIDI] = "mixes right-to-left and left-to-right text",
        [PREP_OTHER] = "stringprep refused it",
    };
    int reason = PREP_OTHER;
    int rc = stringprep_into(profile, flags, in, len, out, cap, outlen, &reason);
    if (rc == RT_EINVAL)
        *why = texts[reason] ? texts[reason] : texts[PREP_OTHER];
    return rc;
}

/* ---- The ASCII path: no library, no allocation ---- */

static bool all_ascii(const char *in, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)in[i] >= 0x80)
            return false;
    return true;
}

/*
** nodeprep of ASCII: case folding is its only mapping there, and it prohibits controls,
** the space and "&'/:<>@ (RFC 3454 C.1.1, C.2.1; RFC 6122 appendix A.5).
*/
static int local_ascii(const char *in, size_t len, char *out, int *reason)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c <= 0x20 || c == 0x7f || strchr("\"&'/:<>@", c)) {
            *reason = PREP_PROHIBITED;
            return RT_EINVAL;
        }
        out[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    out[len] = 0;
    return 0;
}

/* resourceprep of ASCII: no mapping at all; controls prohibited (C.2.1), the space allowed. */
static int resource_ascii(const char *in, size_t len, char *out, int *reason)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c < 0x20 || c == 0x7f) {
            *reason = PREP_PROHIBITED;
            return RT_EINVAL;
        }
        out[i] = (char)c;
    }
    out[len] = 0;
    return 0;
}

/*
** Checks the labels of a domain name without its final dot: each 1 to 63 bytes (RFC 1034;
** for ASCII labels the ASCII form is the text), and for the LDH ones no hyphen at either
** end (STD3). Returns 0 or a PREP_ reason + 1.
*/
static int labels_check(const char *d, size_t len, bool ldh)
{
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && d[i] != '.')
            continue;
        size_t n = i - start;
        if (n == 0 || (ldh && n > 63))
            return PREP_LABEL + 1;
        if (ldh && (d[start] == '-' || d[i - 1] == '-'))
            return PREP_LDH + 1;
        start = i + 1;
    }
    return 0;
}

/*
** A domain of letters, digits, hyphens and dots without A-labels: nameprep only folds
** case there, and IDNA's ToASCII and ToUnicode leave it as it is. Returns 1 when it decided
** (*rc the outcome), 0 when the slow path must (other characters, an xn-- label).
*/
static int domain_ascii(const char *in, size_t len, char *out, size_t *outlen, int *rc, int *reason)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        bool ldh = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '.';
        if (!ldh)
            return 0;
        if ((i == 0 || in[i - 1] == '.') && len - i >= 4 && strncasecmp(in + i, "xn--", 4) == 0)
            return 0;
        out[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    if (len > 0 && out[len - 1] == '.')
        len--; /* the final dot of a fully qualified name (RFC 7622 §3.2) */
    out[len] = 0;
    *outlen = len;
    int bad = len ? labels_check(out, len, true) : PREP_EMPTY + 1;
    *rc = bad ? RT_EINVAL : 0;
    if (bad)
        *reason = bad - 1;
    return 1;
}

/* ---- The slow path: libidn ---- */

/* "[IPv6]" in its canonical text (RFC 5952, as inet_ntop writes it). */
static int domain_ip(const char *in, size_t len, char *out, size_t *outlen, int *reason)
{
    char text[INET6_ADDRSTRLEN + 1];
    struct in6_addr a;
    *reason = PREP_IP;
    if (len < 3 || in[len - 1] != ']' || len - 2 >= sizeof(text))
        return RT_EINVAL;
    memcpy(text, in + 1, len - 2);
    text[len - 2] = 0;
    if (inet_pton(AF_INET6, text, &a) != 1 || !inet_ntop(AF_INET6, &a, text, sizeof(text)))
        return RT_EINVAL;
    *outlen = (size_t)snprintf(out, RT_JID_PART_MAX + 1, "[%s]", text);
    return 0;
}

static int idna_reason(int rc)
{
    switch (rc) {
    case IDNA_STRINGPREP_ERROR:
        return PREP_UNASSIGNED; /* nameprep passed already: what is left is unassigned */
    case IDNA_CONTAINS_NON_LDH:
    case IDNA_CONTAINS_MINUS:
        return PREP_LDH;
    case IDNA_INVALID_LENGTH:
        return PREP_LABEL;
    case IDNA_PUNYCODE_ERROR:
    case IDNA_ROUNDTRIP_VERIFY_ERROR:
    case IDNA_NO_ACE_PREFIX:
    case IDNA_CONTAINS_ACE_PREFIX:
        return PREP_ALABEL;
    default:
        return PREP_OTHER;
    }
}

static bool has_alabel(const char *ace)
{
    for (const char *p = ace; *p; p++)
        if ((p == ace || p[-1] == '.') && strncasecmp(p, "xn--", 4) == 0)
            return true;
    return false;
}

/*
** IDNA2003 as ejabberd and Prosody apply it: nameprep (mapping, NFKC, prohibited code
** points), ideographic full stops as dots, the final dot dropped, ToASCII with the STD3
** rules as the check (label lengths, letters-digits-hyphens), and ToUnicode where the name
** has A-labels, so that it is kept as U-labels (RFC 7622 §3.2.1).
*/
static int domain_once(const char *in, size_t len, char *out, size_t *outlen, int *reason)
{
    if (in[0] == '[')
        return domain_ip(in, len, out, outlen, reason);
    size_t n;
    int rc = stringprep_into(stringprep_nameprep, 0, in, len, out, RT_JID_PART_MAX + 1, &n, reason);
    if (rc)
        return rc;
    size_t w = 0; /* U+3002 IDEOGRAPHIC FULL STOP is a label separator (RFC 3490 §3.1) */
    for (size_t r = 0; r < n; w++) {
        if (n - r >= 3 && memcmp(out + r, "\xe3\x80\x82", 3) == 0) {
            out[w] = '.';
            r += 3;
        } else {
            out[w] = out[r++];
        }
    }
    if (w > 0 && out[w - 1] == '.')
        w--;
    out[w] = 0;
    int bad = w ? labels_check(out, w, false) : PREP_EMPTY + 1;
    if (bad) {
        *reason = bad - 1;
        return RT_EINVAL;
    }
    char *ace = NULL, *uni = NULL;
    rc = idna_to_ascii_8z(out, &ace, IDNA_USE_STD3_ASCII_RULES);
    if (rc == IDNA_SUCCESS && has_alabel(ace))
        rc = idna_to_unicode_8z8z(ace, &uni, IDNA_USE_STD3_ASCII_RULES);
    /* ToUnicode never fails (RFC 3490 §4.2): a label it cannot decode comes back as it was.
       Such a label is no A-label (RFC 5890 §2.3.2.1) and there is no U-label to keep. */
    if (rc == IDNA_SUCCESS && uni && has_alabel(uni))
        rc = IDNA_PUNYCODE_ERROR;
    if (rc == IDNA_SUCCESS && uni) {
        w = strlen(uni);
        if (w <= RT_JID_PART_MAX)
            memcpy(out, uni, w + 1);
    }
    idn_free(ace);
    idn_free(uni);
    if (rc == IDNA_MALLOC_ERROR)
        return RT_ENOMEM;
    *reason = rc != IDNA_SUCCESS ? idna_reason(rc) : PREP_LONG;
    if (rc != IDNA_SUCCESS || w > RT_JID_PART_MAX)
        return RT_EINVAL;
    *outlen = w;
    return 0;
}

static int part_once(rt_jid_part_t part, const char *in, size_t len, char *out, size_t *outlen,
                     int *reason)
{
    if (part == RT_JID_DOMAIN)
        return domain_once(in, len, out, outlen, reason);
    const Stringprep_profile *p =
        part == RT_JID_LOCAL ? stringprep_xmpp_nodeprep : stringprep_xmpp_resourceprep;
    return stringprep_into(p, 0, in, len, out, RT_JID_PART_MAX + 1, outlen, reason);
}

/*
** The part prepared, then prepared again: stringprep is meant to be idempotent, but with
** unassigned code points allowed it need not be, and a JID that changes each time it is
** prepared would compare unequal to itself somewhere. Such input is refused.
*/
static int part_slow(rt_jid_part_t part, const char *in, size_t len, char *out, size_t *outlen,
                     int *reason)
{
    int rc = part_once(part, in, len, out, outlen, reason);
    if (rc)
        return rc;
    if (*outlen == 0) {
        *reason = PREP_EMPTY;
        return RT_EINVAL;
    }
    char again[RT_JID_PART_MAX + 1];
    size_t n = 0;
    rc = part_once(part, out, *outlen, again, &n, reason);
    if (rc == RT_ENOMEM)
        return rc;
    if (rc || n != *outlen || memcmp(again, out, n) != 0) {
        *reason = PREP_UNSTABLE;
        return RT_EINVAL;
    }
    return 0;
}

/* One part: checks common to both paths, then the ASCII path if it decides, else libidn. */
static int prep_part(rt_jid_part_t part, const char *in, size_t len, char *out, size_t *outlen,
                     bool slow_only, int *reason)
{
    if (len == 0) {
        *reason = PREP_EMPTY;
        return RT_EINVAL;
    }
    if (len > RT_JID_PART_MAX) {
        *reason = PREP_LONG;
        return RT_EINVAL;
    }
    if (!slow_only && all_ascii(in, len)) {
        int rc = 0;
        switch (part) {
        case RT_JID_LOCAL:
            *outlen = len;
            return local_ascii(in, len, out, reason);
        case RT_JID_RESOURCE:
            *outlen = len;
            return resource_ascii(in, len, out, reason);
        case RT_JID_DOMAIN:
            if (domain_ascii(in, len, out, outlen, &rc, reason))
                return rc;
            break;
        }
    }
    return part_slow(part, in, len, out, outlen, reason);
}

int rt_jid_prep_part(rt_jid_part_t part, const char *in, size_t len, char *out, size_t *outlen,
                     const char **why)
{
    int reason = PREP_OTHER;
    int rc = prep_part(part, in, len, out, outlen, false, &reason);
    return rc == RT_EINVAL ? refuse(part, reason, why) : rc;
}

int rt__jid_prep_part_slow(rt_jid_part_t part, const char *in, size_t len, char *out,
                           size_t *outlen, const char **why)
{
    int reason = PREP_OTHER;
    int rc = prep_part(part, in, len, out, outlen, true, &reason);
    return rc == RT_EINVAL ? refuse(part, reason, why) : rc;
}

/* ---- Whole JIDs ---- */

int rt_jid_prep(const char *in, size_t len, rt_jid_buf_t *out, const char **why)
{
    const char *unused;
    if (!why) /* the sessions pass NULL: a JID a client sent is refused without the reason */
        why = &unused;
    if (len == 0) {
        *why = "the JID is empty";
        return RT_EINVAL;
    }
    if (len > RT_JID_TEXT_MAX) {
        *why = "the JID is over 3071 bytes";
        return RT_EINVAL;
    }
    /* RFC 7622 §3.1: the resourcepart runs from the first '/', the localpart up to the
       first '@' before it; whatever '@' or '/' the parts then hold is theirs to refuse. */
    const char *slash = memchr(in, '/', len);
    size_t head = slash ? (size_t)(slash - in) : len;
    const char *at = memchr(in, '@', head);
    const char *domain = at ? at + 1 : in;
    size_t llen = at ? (size_t)(at - in) : 0, dlen = head - (size_t)(domain - in);
    rt_jid_t *j = &out->jid;
    char *s = j->s;
    size_t n = 0, k = 0;
    int rc;
    if (at) {
        if (llen == 0)
            return refuse(RT_JID_LOCAL, PREP_EMPTY, why);
        if ((rc = rt_jid_prep_part(RT_JID_LOCAL, in, llen, s, &n, why)) != 0)
            return rc;
        s[n++] = '@';
    }
    j->local = (uint16_t)(at ? n - 1 : 0);
    if ((rc = rt_jid_prep_part(RT_JID_DOMAIN, domain, dlen, s + n, &k, why)) != 0)
        return rc;
    j->domain = (uint16_t)k;
    n += k;
    j->resource = 0;
    if (slash) {
        s[n++] = '/';
        if ((rc = rt_jid_prep_part(RT_JID_RESOURCE, slash + 1, len - head - 1, s + n, &k, why)))
            return rc;
        j->resource = (uint16_t)k;
        n += k;
    }
    s[n] = 0;
    return 0;
}

int rt_jid_make(rt_jid_buf_t *out, const char *local, size_t llen, const char *domain, size_t dlen,
                const char *resource, size_t rlen)
{
    if (!local)
        llen = 0;
    if (!resource)
        rlen = 0;
    if (dlen == 0 || dlen > RT_JID_PART_MAX || llen > RT_JID_PART_MAX || rlen > RT_JID_PART_MAX)
        return RT_EINVAL;
    rt_jid_t *j = &out->jid;
    char *s = j->s;
    size_t n = 0;
    if (llen) {
        memcpy(s, local, llen);
        s[llen] = '@';
        n = llen + 1;
    }
    memcpy(s + n, domain, dlen);
    n += dlen;
    if (rlen) {
        s[n++] = '/';
        memcpy(s + n, resource, rlen);
        n += rlen;
    }
    s[n] = 0;
    j->local = (uint16_t)llen;
    j->domain = (uint16_t)dlen;
    j->resource = (uint16_t)rlen;
    return 0;
}

rt_jid_t *rt_jid_dup(rt_actor_t *self, const rt_jid_t *j)
{
    size_t n = rt_jid_size(j);
    rt_jid_t *c = rt_alloc(self, n, RT_OBJ_LEAF);
    if (c)
        memcpy(c, j, n);
    return c;
}

int rt_jid_account(const char *in, size_t len, char *user, char *host, const char **why)
{
    rt_jid_buf_t b;
    int rc = rt_jid_prep(in, len, &b, why);
    if (rc)
        return rc;
    if (!b.jid.local || b.jid.resource) {
        *why = "name an account as USER@HOST, with no /resource";
        return RT_EINVAL;
    }
    memcpy(user, rt_jid_local(&b.jid), b.jid.local);
    user[b.jid.local] = 0;
    memcpy(host, rt_jid_domain(&b.jid), b.jid.domain);
    host[b.jid.domain] = 0;
    return 0;
}

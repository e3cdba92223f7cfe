/*
** The ACL: rules compiled at load into per-section arrays, users found by
** hash, and three level-by-level walks (a name against a filter, a filter
** covering a filter, two filters overlapping) that substitute %u and %c as
** they compare, so a check allocates nothing.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "auth_impl.h"
#include "common.h"
#include "rcu.h"
#include "topic.h"

#define SUBST_USER 1u   /* the rule's topic holds %u */
#define SUBST_CLIENT 2u /* ... %c */

typedef struct rule_s {
    char *topic; /* owned, NUL-terminated: the filter as written */
    size_t len;
    uint8_t access; /* RT_ACL_READ | RT_ACL_WRITE; 0 for a deny rule */
    uint8_t subst;  /* SUBST_* bits; patterns only */
} rule_t;

typedef struct rules_s {
    rule_t *v;
    size_t n, cap;
} rules_t;

typedef struct user_s {
    char *name; /* owned; NULL marks a free bucket */
    rules_t rules;
} user_t;

struct rt_acl_s {
    rules_t anon;     /* topic lines before any user line */
    rules_t patterns; /* pattern lines, wherever they are */
    user_t *users;    /* open addressing, linear probing; cap a power of two */
    size_t ucap, un;
    size_t nrules;
    size_t bytes; /* allocated for this ACL, set once loaded */
};

/* ---- Matching ---- */

/* The values %u and %c stand for in one check. */
typedef struct subst_s {
    const char *user, *client;
    size_t ulen, clen;
} subst_t;

/* Walks a topic or filter level by level. */
typedef struct cursor_s {
    const char *p, *end;
    bool done;
} cursor_t;

static cursor_t level_cursor(const char *s, size_t n)
{
    return (cursor_t){s, s + n, false};
}

static bool next_level(cursor_t *c, const char **lvl, size_t *n)
{
    if (c->done)
        return false;
    const char *slash = memchr(c->p, '/', (size_t)(c->end - c->p));
    *lvl = c->p;
    if (slash) {
        *n = (size_t)(slash - c->p);
        c->p = slash + 1;
    } else {
        *n = (size_t)(c->end - c->p);
        c->done = true;
    }
    return true;
}

static bool level_is(const char *l, size_t n, char wild)
{
    return n == 1 && l[0] == wild;
}

/* A literal level starting with '$', which first-level wildcards do not match. */
static bool level_is_dollar(const char *l, size_t n)
{
    return n > 0 && l[0] == '$';
}

/* Rule level r (with %u/%c replaced by s when s is set) equals level t. */
static bool level_eq(const char *r, size_t rn, const char *t, size_t tn, const subst_t *s)
{
    if (!s)
        return rn == tn && memcmp(r, t, rn) == 0;
    size_t j = 0;
    for (size_t i = 0; i < rn; i++) {
        if (r[i] == '%' && i + 1 < rn && (r[i + 1] == 'u' || r[i + 1] == 'c')) {
            const char *v = r[i + 1] == 'u' ? s->user : s->client;
            size_t vn = r[i + 1] == 'u' ? s->ulen : s->clen;
            if (tn - j < vn || memcmp(t + j, v, vn) != 0)
                return false;
            j += vn;
            i++;
        } else if (j == tn || t[j++] != r[i]) {
            return false;
        }
    }
    return j == tn;
}

/* The topic name t matches the rule's filter. */
static bool rule_matches(const rule_t *r, const char *t, size_t tn, const subst_t *s)
{
    cursor_t rc = level_cursor(r->topic, r->len), tc = level_cursor(t, tn);
    const char *rl = NULL, *tl = NULL;
    size_t rln = 0, tln = 0;
    for (bool first = true;; first = false) {
        bool has_r = next_level(&rc, &rl, &rln), has_t = next_level(&tc, &tl, &tln);
        if (!has_r)
            return !has_t;
        if (level_is(rl, rln, '#'))
            return !(first && has_t && level_is_dollar(tl, tln));
        if (!has_t)
            return false;
        if (level_is(rl, rln, '+')) {
            if (first && level_is_dollar(tl, tln))
                return false;
            continue;
        }
        if (!level_eq(rl, rln, tl, tln, s))
            return false;
    }
}

/* Every topic the filter f matches is matched by the rule's filter. */
static bool rule_covers(const rule_t *r, const char *f, size_t fn, const subst_t *s)
{
    cursor_t rc = level_cursor(r->topic, r->len), fc = level_cursor(f, fn);
    const char *rl = NULL, *fl = NULL;
    size_t rln = 0, fln = 0;
    for (bool first = true;; first = false) {
        bool has_r = next_level(&rc, &rl, &rln), has_f = next_level(&fc, &fl, &fln);
        if (!has_r)
            return !has_f;
        if (level_is(rl, rln, '#'))
            return !(first && has_f && level_is_dollar(fl, fln));
        if (!has_f || level_is(fl, fln, '#'))
            return false;
        if (level_is(rl, rln, '+')) {
            if (first && level_is_dollar(fl, fln))
                return false;
            continue;
        }
        if (level_is(fl, fln, '+') || !level_eq(rl, rln, fl, fln, s))
            return false;
    }
}

/* Some topic is matched both by the rule's filter and by the filter f. */
static bool rule_overlaps(const rule_t *r, const char *f, size_t fn, const subst_t *s)
{
    cursor_t rc = level_cursor(r->topic, r->len), fc = level_cursor(f, fn);
    const char *rl = NULL, *fl = NULL;
    size_t rln = 0, fln = 0;
    for (bool first = true;; first = false) {
        bool has_r = next_level(&rc, &rl, &rln), has_f = next_level(&fc, &fl, &fln);
        if (!has_r && !has_f)
            return true;
        if (has_r && level_is(rl, rln, '#'))
            return !(first && has_f && level_is_dollar(fl, fln));
        if (has_f && level_is(fl, fln, '#'))
            return !(first && has_r && level_is_dollar(rl, rln));
        if (!has_r || !has_f)
            return false;
        bool rw = level_is(rl, rln, '+'), fw = level_is(fl, fln, '+');
        if (rw || fw) {
            if (first && ((rw && level_is_dollar(fl, fln)) || (fw && level_is_dollar(rl, rln))))
                return false;
            continue;
        }
        if (!level_eq(rl, rln, fl, fln, s))
            return false;
    }
}

/* The bucket of user name[0..n), or the free one where it would go (the table is kept at
   most half full, so there is one). */
static user_t *find_user(const rt_acl_t *acl, const char *name, size_t n)
{
    RT_ASSERT(acl->un < acl->ucap);
    size_t mask = acl->ucap - 1;
    for (size_t i = rt_hash(name, n) & mask;; i = (i + 1) & mask) {
        user_t *u = &acl->users[i];
        if (!u->name || (strncmp(u->name, name, n) == 0 && u->name[n] == 0))
            return u;
    }
}

/* A value %u or %c may bring into a filter: not empty, no level separator, no wildcard. */
static bool safe_value(const char *v, size_t n)
{
    return v && n > 0 && !memchr(v, '/', n) && !memchr(v, '+', n) && !memchr(v, '#', n);
}

/* What the rules that matter said about one request so far. */
typedef struct tally_s {
    bool allowed;  /* a rule with the access asked for matches (covers, for SUBSCRIBE) */
    bool readable; /* SUBSCRIBE: a read rule overlaps the filter */
    bool shadowed; /* SUBSCRIBE: a deny rule overlaps the filter without covering it */
} tally_t;

/* Applies one rule to the tally; returns true when it denies the request outright. */
static bool apply_rule(const rule_t *r, const char *t, size_t tn, unsigned access, const subst_t *s,
                       tally_t *v)
{
    if (access != RT_ACL_SUBSCRIBE) {
        if (r->access == 0)
            return rule_matches(r, t, tn, s);
        if (!v->allowed && (r->access & access))
            v->allowed = rule_matches(r, t, tn, s);
        return false;
    }
    if (r->access == 0) {
        if (rule_covers(r, t, tn, s))
            return true;
        v->shadowed = v->shadowed || rule_overlaps(r, t, tn, s);
        return false;
    }
    if (!(r->access & RT_ACL_READ) || v->allowed)
        return false;
    v->allowed = rule_covers(r, t, tn, s);
    v->readable = v->readable || v->allowed || rule_overlaps(r, t, tn, s);
    return false;
}

/* The verdict of a tally no rule denied outright. */
static int tally_verdict(const tally_t *v, unsigned access)
{
    if (access != RT_ACL_SUBSCRIBE)
        return v->allowed ? RT_ACL_ALLOW : RT_ACL_DENY;
    if (v->allowed && !v->shadowed)
        return RT_ACL_ALLOW;
    return v->readable ? RT_ACL_FILTERED : RT_ACL_DENY;
}

int rt_acl_check(const rt_acl_t *acl, const char *user, const char *clientid, const char *topic,
                 size_t len, unsigned access)
{
    if (access != RT_ACL_READ && access != RT_ACL_WRITE && access != RT_ACL_SUBSCRIBE)
        return RT_ACL_DENY;
    if (access == RT_ACL_SUBSCRIBE) {
        rt_topic_filter_t sf;
        if (rt_topic_parse_filter(topic, len, &sf))
            return RT_ACL_DENY;
        topic = sf.filter;
        len = sf.filter_len;
    }
    if (len == 0)
        return RT_ACL_DENY;
    tally_t v = {0};
    size_t ulen = user ? strlen(user) : 0;
    const rules_t *own = &acl->anon;
    if (user) {
        const user_t *u = acl->ucap ? find_user(acl, user, ulen) : NULL;
        own = u && u->name ? &u->rules : NULL;
    }
    for (size_t i = 0; own && i < own->n; i++)
        if (apply_rule(&own->v[i], topic, len, access, NULL, &v))
            return RT_ACL_DENY;
    subst_t s = {user, clientid, ulen, clientid ? strlen(clientid) : 0};
    bool user_ok = safe_value(s.user, s.ulen), client_ok = safe_value(s.client, s.clen);
    for (size_t i = 0; i < acl->patterns.n; i++) {
        const rule_t *r = &acl->patterns.v[i];
        if (((r->subst & SUBST_USER) && !user) || ((r->subst & SUBST_CLIENT) && !clientid))
            continue; /* about a name this client does not have */
        bool usable =
            (!(r->subst & SUBST_USER) || user_ok) && (!(r->subst & SUBST_CLIENT) || client_ok);
        if (!usable) {
            if (r->access == 0)
                return RT_ACL_DENY;
            continue;
        }
        if (apply_rule(r, topic, len, access, r->subst ? &s : NULL, &v))
            return RT_ACL_DENY;
    }
    return tally_verdict(&v, access);
}

/* ---- Loading ---- */

static void free_rules(rules_t *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        free(rs->v[i].topic);
    free(rs->v);
}

void rt_acl_free(rt_acl_t *acl)
{
    if (!acl)
        return;
    free_rules(&acl->anon);
    free_rules(&acl->patterns);
    for (size_t i = 0; i < acl->ucap; i++) {
        free(acl->users[i].name);
        free_rules(&acl->users[i].rules);
    }
    free(acl->users);
    free(acl);
}

static bool push_rule(rules_t *rs, const rule_t *r)
{
    if (rt_grow(&rs->v, &rs->cap, rs->n + 1, sizeof(*rs->v), 4) != 0)
        return false;
    rs->v[rs->n++] = *r;
    return true;
}

/* The section of user name[0..n), made if new; NULL when out of memory. */
static rules_t *user_section(rt_acl_t *acl, const char *name, size_t n)
{
    if ((acl->un + 1) * 2 > acl->ucap) {
        size_t cap = acl->ucap ? acl->ucap * 2 : 16;
        user_t *old = acl->users, *v = calloc(cap, sizeof(*v));
        if (!v)
            return NULL;
        size_t oldcap = acl->ucap;
        acl->users = v;
        acl->ucap = cap;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].name)
                *find_user(acl, old[i].name, strlen(old[i].name)) = old[i];
        free(old);
    }
    user_t *u = find_user(acl, name, n);
    if (!u->name) {
        u->name = strndup(name, n);
        if (!u->name)
            return NULL;
        acl->un++;
    }
    return &u->rules;
}

static size_t skip_blanks(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    return i;
}

static size_t word_end(const char *s, size_t i, size_t n)
{
    while (i < n && s[i] != ' ' && s[i] != '\t')
        i++;
    return i;
}

static bool word_is(const char *w, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(w, lit, n) == 0;
}

/*
** Parses one line into acl; *section is the current topic section. Returns
** NULL, or the reason the line is bad (reason may be filled for details).
*/
static const char *parse_line(rt_acl_t *acl, rules_t **section, const char *s, size_t n,
                              char *reason, size_t reasonlen)
{
    size_t i = skip_blanks(s, 0, n);
    if (i == n || s[i] == '#')
        return NULL;
    if (memchr(s, 0, n))
        return "the line holds a NUL byte";
    size_t kw = i, kwend = word_end(s, i, n);
    size_t rest = skip_blanks(s, kwend, n);
    if (word_is(s + kw, kwend - kw, "user")) {
        if (rest == n)
            return "user needs a name";
        *section = user_section(acl, s + rest, n - rest);
        return *section ? NULL : "out of memory";
    }
    bool pattern = word_is(s + kw, kwend - kw, "pattern");
    if (!pattern && !word_is(s + kw, kwend - kw, "topic")) {
        snprintf(reason, reasonlen, "unknown keyword \"%.*s\" (topic, pattern or user)",
                 (int)(kwend - kw > 32 ? 32 : kwend - kw), s + kw);
        return reason;
    }
    if (rest == n)
        return "the topic is empty";
    rule_t r = {.access = RT_ACL_READ | RT_ACL_WRITE};
    size_t w = rest, wend = word_end(s, rest, n), topic = skip_blanks(s, wend, n);
    if (topic < n) {
        if (word_is(s + w, wend - w, "read"))
            r.access = RT_ACL_READ;
        else if (word_is(s + w, wend - w, "write"))
            r.access = RT_ACL_WRITE;
        else if (word_is(s + w, wend - w, "readwrite"))
            r.access = RT_ACL_READ | RT_ACL_WRITE;
        else if (word_is(s + w, wend - w, "deny"))
            r.access = 0;
        else {
            snprintf(reason, reasonlen, "unknown access \"%.*s\" (read, write, readwrite or deny)",
                     (int)(wend - w > 32 ? 32 : wend - w), s + w);
            return reason;
        }
    } else {
        topic = w;
    }
    const char *bad = rt_topic_filter_error(s + topic, n - topic);
    if (bad)
        return bad;
    r.len = n - topic;
    if (pattern) {
        for (size_t k = topic; k + 1 < n; k++) {
            if (s[k] == '%' && s[k + 1] == 'u')
                r.subst |= SUBST_USER;
            if (s[k] == '%' && s[k + 1] == 'c')
                r.subst |= SUBST_CLIENT;
        }
    }
    r.topic = strndup(s + topic, r.len);
    if (!r.topic || !push_rule(pattern ? &acl->patterns : *section, &r)) {
        free(r.topic);
        return "out of memory";
    }
    acl->nrules++;
    return NULL;
}

static size_t rules_bytes(const rules_t *rs)
{
    size_t n = rs->cap * sizeof(rule_t);
    for (size_t i = 0; i < rs->n; i++)
        n += rs->v[i].len + 1;
    return n;
}

static size_t acl_bytes(const rt_acl_t *acl)
{
    size_t n = sizeof(*acl) + rules_bytes(&acl->anon) + rules_bytes(&acl->patterns) +
               acl->ucap * sizeof(user_t);
    for (size_t i = 0; i < acl->ucap; i++)
        if (acl->users[i].name)
            n += strlen(acl->users[i].name) + 1 + rules_bytes(&acl->users[i].rules);
    return n;
}

int rt_acl_parse(const char *text, size_t len, const char *name, rt_acl_t **out, char *err,
                 size_t errlen)
{
    rt_acl_t *acl = calloc(1, sizeof(*acl));
    rules_t *section = acl ? &acl->anon : NULL;
    if (!acl) {
        snprintf(err, errlen, "%s: out of memory", name);
        return RT_ENOMEM;
    }
    const char *pos = text, *end = text + len, *line;
    size_t linelen;
    unsigned lineno = 0;
    while (rt__auth_next_line(&pos, end, &line, &linelen)) {
        lineno++;
        char reason[128];
        const char *why = parse_line(acl, &section, line, linelen, reason, sizeof(reason));
        if (why) {
            snprintf(err, errlen, "%s:%u: %s", name, lineno, why);
            rt_acl_free(acl);
            return strcmp(why, "out of memory") == 0 ? RT_ENOMEM : RT_EINVAL;
        }
    }
    acl->bytes = acl_bytes(acl);
    *out = acl;
    return 0;
}

int rt_acl_load(const char *path, rt_acl_t **out, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    int rc = rt__auth_read_file(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    rc = rt_acl_parse(buf, len, path, out, err, errlen);
    free(buf);
    return rc;
}

size_t rt_acl_bytes(const rt_acl_t *acl)
{
    return acl ? acl->bytes : 0;
}

/* ---- The process-wide ACL ---- */

static rt_rcu_t current_acl; /* rt_acl_t *, NULL: allow all */

static struct {
    atomic_uint_fast64_t publish, subscribe, read;
} denied;

int rt_acl_permit_own(const rt_acl_t *own, const char *user, const char *clientid,
                      const char *topic, size_t len, unsigned access)
{
    int r;
    if (own) {
        r = rt_acl_check(own, user, clientid, topic, len, access);
    } else {
        const rt_acl_t *acl = rt_rcu_enter(&current_acl);
        r = acl ? rt_acl_check(acl, user, clientid, topic, len, access) : RT_ACL_ALLOW;
        rt_rcu_leave();
    }
    if (r != RT_ACL_DENY)
        return r;
    atomic_uint_fast64_t *c = access == RT_ACL_WRITE       ? &denied.publish
                              : access == RT_ACL_SUBSCRIBE ? &denied.subscribe
                                                           : &denied.read;
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    return r;
}

int rt_acl_permit(const char *user, const char *clientid, const char *topic, size_t len,
                  unsigned access)
{
    return rt_acl_permit_own(NULL, user, clientid, topic, len, access);
}

bool rt_acl_active(void)
{
    bool on = rt_rcu_enter(&current_acl) != NULL;
    rt_rcu_leave();
    return on;
}

void rt_acl_install(rt_acl_t *acl)
{
    rt_acl_free(rt_rcu_swap(&current_acl, acl));
}

int rt_acl_reload(const char *path, char *err, size_t errlen)
{
    rt_acl_t *acl = NULL;
    if (path && *path) {
        int rc = rt_acl_load(path, &acl, err, errlen);
        if (rc)
            return rc;
    }
    rt_acl_install(acl);
    return 0;
}

void rt_acl_stats(rt_acl_stats_t *out)
{
    out->denied_publish = atomic_load(&denied.publish);
    out->denied_subscribe = atomic_load(&denied.subscribe);
    out->denied_read = atomic_load(&denied.read);
    const rt_acl_t *acl = rt_rcu_enter(&current_acl);
    out->rules = acl ? acl->nrules : 0;
    out->bytes = acl ? acl->bytes : 0;
    rt_rcu_leave();
}

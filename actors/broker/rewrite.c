/*
** Topic rewrite (rewrite.h): the rules compiled at start, with POSIX extended regular
** expressions (libc's regcomp: no library more for a feature its users write in the same
** dialect as grep -E).
*/
#include <regex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rewrite.h"
#include "rt.h"
#include "topic.h"

typedef struct {
    rt_rewrite_action_t action;
    const char *source, *dest; /* the configuration's, which the broker keeps */
    regex_t re;
} rule_t;

static rule_t *rules;
static size_t nrules;
static atomic_size_t any;

int rt_rewrite_init(const rt_conf_t *conf, char *err, size_t errlen)
{
    rt_rewrite_free();
    if (!conf->nrewrites)
        return 0;
    rules = calloc(conf->nrewrites, sizeof(*rules));
    if (!rules) {
        snprintf(err, errlen, "rewrite: out of memory");
        return RT_ENOMEM;
    }
    for (unsigned i = 0; i < conf->nrewrites; i++) {
        const rt_conf_rewrite_t *r = &conf->rewrites[i];
        const char *why = rt_topic_filter_error(r->source, strlen(r->source));
        int rc = why ? 0 : regcomp(&rules[i].re, r->re, REG_EXTENDED);
        if (why || rc) {
            char text[128] = "";
            if (rc)
                regerror(rc, &rules[i].re, text, sizeof(text));
            snprintf(err, errlen, "rewrite[%u].%s: %s", i + 1, why ? "source" : "re",
                     why ? why : text);
            rt_rewrite_free();
            return RT_EINVAL;
        }
        rules[i] = (rule_t){.action = (rt_rewrite_action_t)r->action,
                            .source = r->source,
                            .dest = r->dest,
                            .re = rules[i].re};
        nrules = i + 1;
    }
    atomic_store(&any, nrules);
    return 0;
}

void rt_rewrite_free(void)
{
    atomic_store(&any, 0);
    for (size_t i = 0; i < nrules; i++)
        regfree(&rules[i].re);
    free(rules);
    rules = NULL;
    nrules = 0;
}

bool rt_rewrite_any(void)
{
    return atomic_load_explicit(&any, memory_order_relaxed) != 0;
}

/*
** Whether source takes the topic or filter t level by level: its + any one level, its # the
** rest (and the level above); t's own + and # are text here, so a SUBSCRIBE to "a/+" is taken
** by the sources "a/+" and "a/#", not by "a/b". A source that starts with a wildcard takes no
** $ topic (MQTT 4.7.2).
*/
static bool source_takes(const char *source, const char *t, size_t tlen)
{
    const char *f = source, *te = t + tlen;
    if (tlen && t[0] == '$' && (f[0] == '+' || f[0] == '#'))
        return false;
    for (;;) {
        size_t flev = strcspn(f, "/");
        const char *tq = memchr(t, '/', (size_t)(te - t));
        size_t tlev = tq ? (size_t)(tq - t) : (size_t)(te - t);
        if (flev == 1 && f[0] == '#')
            return true;
        if (!(flev == 1 && f[0] == '+') && (flev != tlev || memcmp(f, t, flev) != 0))
            return false;
        bool f_end = f[flev] == 0, t_end = !tq;
        if (f_end || t_end)
            return f_end && t_end ? true : t_end && strcmp(f + flev, "/#") == 0;
        f += flev + 1;
        t = tq + 1;
    }
}

/* dest with $1..$9 from the groups of text that m found: its length in out, or BAD. */
static size_t fill_dest(const char *dest, const char *text, const regmatch_t *m, char *out,
                        size_t cap)
{
    size_t n = 0;
    for (const char *d = dest; *d; d++) {
        const char *add = d;
        size_t len = 1;
        if (d[0] == '$' && d[1] >= '1' && d[1] <= '9') {
            const regmatch_t *g = &m[d[1] - '0'];
            add = text + (g->rm_so >= 0 ? g->rm_so : 0);
            len = g->rm_so >= 0 ? (size_t)(g->rm_eo - g->rm_so) : 0;
            d++;
        }
        if (n + len >= cap)
            return RT_REWRITE_BAD;
        memcpy(out + n, add, len);
        n += len;
    }
    return n ? n : RT_REWRITE_BAD;
}

size_t rt_rewrite(rt_rewrite_action_t action, const char *topic, size_t len, char *out, size_t cap)
{
    char *text = NULL; /* topic with its NUL, which regexec wants: made for the first source */
    size_t result = 0;
    for (size_t i = 0; i < nrules && !result; i++) {
        const rule_t *r = &rules[i];
        if ((r->action != action && r->action != RT_REWRITE_ALL) ||
            !source_takes(r->source, topic, len))
            continue;
        if (!text && !(text = malloc(len + 1)))
            return RT_REWRITE_BAD;
        memcpy(text, topic, len);
        text[len] = 0;
        regmatch_t m[10];
        if (memchr(topic, 0, len) || regexec(&r->re, text, 10, m, 0) != 0)
            continue;
        result = fill_dest(r->dest, text, m, out, cap);
    }
    free(text);
    return result;
}

/*
** Topic rewrite (the rewrite setting, config.h; docs/AUTH.md "Topic rewrite"), as EMQX's: a
** PUBLISH's topic, or a SUBSCRIBE's or UNSUBSCRIBE's filter, that a rule's source filter
** matches and its regular expression matches whole becomes the rule's dest with $1..$9 filled
** from the expression's groups; the first rule that applies decides. It runs before the ACL
** and routing, so both see the new topic. Rules are compiled once at start and read by any
** thread.
*/
#ifndef RT_REWRITE_H
#define RT_REWRITE_H

#include <stddef.h>

#include "config.h"

/* Compiles conf's rules: 0, or RT_EINVAL with err (a source that is no filter). */
int rt_rewrite_init(const rt_conf_t *conf, char *err, size_t errlen);
void rt_rewrite_free(void);
/* Whether any rule exists: a topic with none to apply costs this load. */
bool rt_rewrite_any(void);

/*
** topic (a topic name for RT_REWRITE_PUBLISH, a filter for RT_REWRITE_SUBSCRIBE) rewritten
** into out (cap bytes): its new length; 0 when no rule applies; RT_REWRITE_BAD when the rule
** that applies makes something too long (the caller checks that the result is a topic name or
** filter).
*/
#define RT_REWRITE_BAD ((size_t)-1)
size_t rt_rewrite(rt_rewrite_action_t action, const char *topic, size_t len, char *out, size_t cap);

#endif

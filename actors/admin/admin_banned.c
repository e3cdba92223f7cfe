/*
** `banned list|add|del`: the banned list (broker/banned.h), as EMQX's banned API and
** `emqx ctl banned` keep it: by client id, user name or address range, with an expiry and a
** reason. A list copies the bans out under the list's read lock, in the list's own order.
*/
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin_impl.h"
#include "banned.h"
#include "broker.h"

#define BANNED_LIST_MAX 10000 /* bans a list gives unless --limit says less */

typedef struct {
    rt_doc_t *doc;
    long limit, n;
    int64_t now_s;
} listing_t;

static void add_row(const rt_ban_t *b, void *arg)
{
    listing_t *l = arg;
    if (l->n++ >= l->limit)
        return;
    rt_doc_t *o = rt_doc_add_object(l->doc, NULL);
    rt_doc_add_str(o, "kind", rt_ban_kind_names[b->kind]);
    rt_doc_add_strn(o, "value", b->value, b->len);
    rt_doc_add_str(o, "by", b->by);
    rt_doc_add_str(o, "reason", b->reason);
    rt_doc_add_i64(o, "at", b->at_s);
    if (b->until_s) {
        rt_doc_add_i64(o, "until", b->until_s);
        rt_doc_add_duration(o, "expires_in_s",
                            (uint64_t)(b->until_s > l->now_s ? b->until_s - l->now_s : 0), 1);
    } else {
        rt_doc_add_null(o, "until");
        rt_doc_add_null(o, "expires_in_s");
    }
}

int rt__admin_banned_list(rt_admin_cmd_t *c)
{
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    listing_t l = {.now_s = (int64_t)time(NULL)};
    if (rt__admin_opt_long(c, "limit", BANNED_LIST_MAX, 0, BANNED_LIST_MAX, &l.limit))
        return c->code;
    if (!(c->doc = l.doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_banned_each(add_row, &l);
    return 200;
}

/* KIND VALUE of `banned add|del`, checked: 0, or c's 400 set. */
static int kind_and_value(rt_admin_cmd_t *c, const char *verb, rt_ban_kind_t *kind)
{
    if (c->argc != 4)
        return rt__admin_fail(
            c, 400, "usage: banned %s KIND VALUE (KIND: clientid, username, address)", verb);
    if (rt_ban_kind_parse(c->argv[2], kind) != 0)
        return rt__admin_fail(c, 400, "kind: clientid, username or address, not %s", c->argv[2]);
    if (!rt_broker)
        return rt__admin_fail(c, 503, "the broker is not running");
    return 0;
}

int rt__admin_banned_add(rt_admin_cmd_t *c)
{
    rt_ban_kind_t kind;
    long duration;
    if (kind_and_value(c, "add", &kind) ||
        rt__admin_opt_long(c, "duration", 0, 0, 100L * 365 * 86400, &duration))
        return c->code;
    size_t rlen = 0;
    const char *reason = rt__admin_opt(c, "reason", &rlen);
    if (rlen > RT_BAN_REASON_MAX)
        return rt__admin_fail(c, 400, "--reason: at most %d bytes", RT_BAN_REASON_MAX);
    int64_t now = (int64_t)time(NULL);
    rt_ban_t b = {.kind = kind,
                  .value = c->argv[3],
                  .len = c->arglen[3],
                  .by = "admin",
                  .reason = reason ? reason : "",
                  .at_s = now,
                  .until_s = duration ? now + duration : 0};
    char err[RT_ADMIN_ERR_MAX];
    int rc = rt_banned_add(&b, err, sizeof(err));
    if (rc)
        return rt__admin_fail(c, rc == RT_ENOMEM ? 500 : rc == RT_ELIMIT ? 409 : 400, "%s", err);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "banned", rt_ban_kind_names[kind]);
    rt_doc_add_strn(c->doc, "value", c->argv[3], c->arglen[3]);
    if (duration)
        rt_doc_add_i64(c->doc, "until", now + duration);
    else
        rt_doc_add_null(c->doc, "until");
    return 200;
}

int rt__admin_banned_del(rt_admin_cmd_t *c)
{
    rt_ban_kind_t kind;
    if (kind_and_value(c, "del", &kind))
        return c->code;
    int rc = rt_banned_del(kind, c->argv[3], c->arglen[3]);
    if (rc == RT_EINVAL)
        return rt__admin_fail(c, 400, "not an address or address range: %s", c->argv[3]);
    if (rc)
        return rt__admin_fail(c, 404, "no such ban");
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "unbanned", rt_ban_kind_names[kind]);
    rt_doc_add_strn(c->doc, "value", c->argv[3], c->arglen[3]);
    return 200;
}

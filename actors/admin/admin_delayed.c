/*
** `delayed list|del`: the messages delayed publish holds (conn/delayed.h), earliest first,
** as EMQX's delayed API lists them: id, topic, when due, QoS, size and publisher.
*/
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "delayed.h"
#include "message.h"

#define DELAYED_LIST_MAX 10000 /* messages a list gives unless --limit says less */

typedef struct {
    rt_doc_t *doc;
    int64_t now_ms;
} listing_t;

static void add_row(const rt_delayed_entry_t *e, void *arg)
{
    listing_t *l = arg;
    rt_message_t m;
    rt_message_view(e->bin, &m);
    rt_doc_t *o = rt_doc_add_object(l->doc, NULL);
    rt_doc_add_u64(o, "id", e->id);
    rt_doc_add_strn(o, "topic", (const char *)m.topic.p, m.topic.len);
    rt_doc_add_i64(o, "due_ms", e->due_ms);
    rt_doc_add_duration(o, "due_in_s",
                        (uint64_t)(e->due_ms > l->now_ms ? e->due_ms - l->now_ms : 0), 1000);
    rt_doc_add_u64(o, "qos", m.qos);
    rt_doc_add_bool(o, "retain", m.retain);
    rt_doc_add_bytes(o, "payload", m.payload.len);
    if (m.clientid)
        rt_doc_add_str(o, "from", m.clientid);
    else
        rt_doc_add_null(o, "from");
}

int rt__admin_delayed_list(rt_admin_cmd_t *c)
{
    long limit;
    if (rt__admin_opt_long(c, "limit", DELAYED_LIST_MAX, 0, DELAYED_LIST_MAX, &limit))
        return c->code;
    listing_t l = {.now_ms = (int64_t)rt_wall_ms()};
    if (!(c->doc = l.doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_delayed_each(add_row, &l, (size_t)limit);
    return 200;
}

int rt__admin_delayed_del(rt_admin_cmd_t *c)
{
    char *end = NULL;
    unsigned long long id = c->argc == 3 ? strtoull(c->argv[2], &end, 10) : 0;
    if (c->argc != 3 || !*c->argv[2] || *end || c->argv[2][0] == '-')
        return rt__admin_fail(c, 400, "usage: delayed del ID (as delayed list shows it)");
    if (rt_delayed_del(id) != 0)
        return rt__admin_fail(c, 404, "no delayed message %llu", id);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_u64(c->doc, "deleted", id);
    return 200;
}

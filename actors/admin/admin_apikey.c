/*
** `apikey list|add|revoke|reload`: the HTTP API's keys (docs/HTTP.md, "API keys"), kept by
** the HTTP layer, which hands its functions in (rt_admin_set_apikeys). Adding, revoking and
** reloading read and write the key file, so they run on the admin worker.
*/
#include <stdatomic.h>
#include <string.h>

#include "admin_impl.h"
#include "log.h"

static _Atomic(const rt_admin_apikeys_t *) keys_ops;

void rt_admin_set_apikeys(const rt_admin_apikeys_t *ops)
{
    atomic_store(&keys_ops, ops);
}

/* The key functions, or NULL with c's 404 set: rtd has no HTTP listener. */
static const rt_admin_apikeys_t *ops_or_fail(rt_admin_cmd_t *c)
{
    const rt_admin_apikeys_t *ops = atomic_load(&keys_ops);
    if (!ops)
        rt__admin_fail(c, 404, "rtd has no HTTP listener (an http table in rtd.conf), so no API "
                               "keys");
    return ops;
}

/* An RT_E* code of the key functions as the answer's code. */
static int key_fail(rt_admin_cmd_t *c, int rc, const char *err)
{
    int code = rc == RT_ENOTFOUND ? 404 : rc == RT_EEXIST ? 409 : rc == RT_EINVAL ? 400 : 500;
    return rt__admin_fail(c, code, "%s", err);
}

static void list_row(void *ud, const char *name, const char *role, int64_t created_s,
                     uint64_t last_used_ms)
{
    rt_doc_t *o = rt_doc_add_object(ud, NULL);
    char when[32];
    rt_doc_add_str(o, "name", name);
    rt_doc_add_str(o, "role", role);
    if (created_s > 0) {
        rt__admin_iso_time((uint64_t)created_s * 1000, when, sizeof(when));
        rt_doc_add_str(o, "created", when);
    } else {
        rt_doc_add_null(o, "created");
    }
    if (last_used_ms) {
        rt__admin_iso_time(last_used_ms, when, sizeof(when));
        rt_doc_add_str(o, "last_used", when);
    } else {
        rt_doc_add_null(o, "last_used");
    }
}

int rt__admin_apikey_list(rt_admin_cmd_t *c)
{
    const rt_admin_apikeys_t *ops = ops_or_fail(c);
    if (!ops)
        return c->code;
    if (!(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    ops->each(list_row, c->doc);
    return 200;
}

int rt__admin_apikey_add(rt_admin_cmd_t *c)
{
    const rt_admin_apikeys_t *ops = ops_or_fail(c);
    if (!ops)
        return c->code;
    if (c->argc != 4)
        return rt__admin_fail(c, 400, "usage: apikey add NAME read|admin");
    char key[RT_ADMIN_KEY_LEN], err[RT_ADMIN_ERR_MAX];
    int rc = ops->add(c->argv[2], c->argv[3], key, err, sizeof(err));
    if (rc)
        return key_fail(c, rc, err);
    rt_log(RT_LOG_INFO, "apikey.added", "name=%s role=%s file=%s", c->argv[2], c->argv[3],
           ops->file());
    /* The key is shown this once: the file keeps its SHA-256 only. Alone on its line in
       text, so that `KEY=$(rtctl apikey add ci read)` takes it as `rtd apikey` prints it. */
    if (!c->json) {
        rt_buf_printf(&c->text, "%s\n", key);
        return 200;
    }
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "name", c->argv[2]);
    rt_doc_add_str(c->doc, "role", c->argv[3]);
    rt_doc_add_str(c->doc, "key", key);
    rt_doc_add_str(c->doc, "file", ops->file());
    return 200;
}

int rt__admin_apikey_revoke(rt_admin_cmd_t *c)
{
    const rt_admin_apikeys_t *ops = ops_or_fail(c);
    if (!ops)
        return c->code;
    if (c->argc != 3)
        return rt__admin_fail(c, 400, "usage: apikey revoke NAME");
    char err[RT_ADMIN_ERR_MAX];
    int rc = ops->revoke(c->argv[2], err, sizeof(err));
    if (rc)
        return key_fail(c, rc, err);
    rt_log(RT_LOG_INFO, "apikey.revoked", "name=%s file=%s", c->argv[2], ops->file());
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_str(c->doc, "revoked", c->argv[2]);
    return 200;
}

int rt__admin_apikey_reload(rt_admin_cmd_t *c)
{
    const rt_admin_apikeys_t *ops = ops_or_fail(c);
    if (!ops)
        return c->code;
    char err[RT_ADMIN_ERR_MAX];
    int rc = ops->reload(err, sizeof(err));
    if (rc)
        return rt__admin_fail(c, rc == RT_ENOTFOUND && !ops->file()[0] ? 404 : 409,
                              "not reloaded, the keys in force stay: %s", err);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    rt_doc_add_bool(c->doc, "reloaded", true);
    rt_doc_add_str(c->doc, "file", ops->file());
    return 200;
}

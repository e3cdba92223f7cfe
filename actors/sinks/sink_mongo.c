/*
** The MongoDB sink driver: the real mongo-c-driver, one mongoc_client_pool_t per
** sink, one ordered bulk insert per run of rows going to the same collection,
** write concern w (default 1) and optional journaling.
**
** Retries are idempotent: each row gets an ObjectId _id when it enters the sink
** (admit) unless it has one, so a batch retried after a failure that hid how much
** was inserted meets duplicate-key errors (11000) for the rows already there, and
** those count as written. An ordered bulk stops at a row's own error (other than
** 11000): the rows before it are in, that row is rejected, the rest go again.
*/
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "sink_impl.h"

#define MG_URI_DEFAULT "mongodb://127.0.0.1:27017"
#define MG_TIMEOUT_MS_DEFAULT 2000 /* server selection, connect and socket timeouts */
#define MG_DUPLICATE_KEY 11000

typedef struct mg_s {
    char database[128];
    char collection[128];
    int w;
    bool journal;
    mongoc_uri_t *uri;
    mongoc_client_pool_t *pool;
    mongoc_write_concern_t *wc;
} mg_t;

static const rt_setting_t mongo_keys[] = {
    {.name = "sinks.<name>(mongodb).uri",
     .type = RT_SET_STRING,
     .text = MG_URI_DEFAULT,
     .doc = "mongodb://host:port/?options; its options win over timeout_ms"},
    {.name = "sinks.<name>(mongodb).database",
     .type = RT_SET_STRING,
     .text = "rt",
     .doc = "the database (default: the uri's, else rt)"},
    {.name = "sinks.<name>(mongodb).collection",
     .type = RT_SET_STRING,
     .text = "messages",
     .doc = "the collection rows go to when a rule names none"},
    {.name = "sinks.<name>(mongodb).w",
     .type = RT_SET_INT,
     .num = 1,
     .unit = "servers",
     .min = 0,
     .max = 50,
     .doc = "write concern: servers that must acknowledge (0 = none)"},
    {.name = "sinks.<name>(mongodb).journal",
     .type = RT_SET_BOOL,
     .doc = "wait for the journal (write concern j)"},
    {.name = "sinks.<name>(mongodb).timeout_ms",
     .type = RT_SET_INT,
     .num = MG_TIMEOUT_MS_DEFAULT,
     .unit = "ms",
     .min = 100,
     .max = 600000,
     .doc = "server selection, connect and socket timeout (a uri that sets them wins)"},
    {.name = NULL},
};

static pthread_once_t mongoc_once = PTHREAD_ONCE_INIT;

/* The driver's own log lines go to rtd's log at debug level (outages make them chatty). */
static void on_mongoc_log(mongoc_log_level_t level, const char *domain, const char *message,
                          void *ud)
{
    (void)ud;
    rt_log(level <= MONGOC_LOG_LEVEL_WARNING ? RT_LOG_DEBUG : RT_LOG_DEBUG, "sink.mongoc", "%s: %s",
           domain, message);
}

static void mongoc_setup(void)
{
    mongoc_init();
    mongoc_log_set_handler(on_mongoc_log, NULL);
    atexit(mongoc_cleanup);
}

static void mg_free(rt_sink_t *s)
{
    mg_t *m = s->drv_state;
    if (!m)
        return;
    if (m->pool)
        mongoc_client_pool_destroy(m->pool);
    mongoc_uri_destroy(m->uri);
    mongoc_write_concern_destroy(m->wc);
    free(m);
    s->drv_state = NULL;
}

static bool name_ok(const char *v, size_t max)
{
    size_t n = strlen(v);
    return n > 0 && n < max && !strpbrk(v, "$\"/\\ ");
}

static int mg_configure(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    pthread_once(&mongoc_once, mongoc_setup);
    mg_t *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    s->drv_state = m;
    const rt_conf_kv_t *kv = rt__sink_kv(sec, "uri");
    const char *uri = kv ? kv->str : MG_URI_DEFAULT;
    bson_error_t error;
    m->uri = mongoc_uri_new_with_error(uri, &error);
    if (!m->uri) {
        snprintf(why, whylen, "uri \"%s\": %s", uri, error.message);
        mg_free(s);
        return RT_EINVAL;
    }
    kv = rt__sink_kv(sec, "timeout_ms");
    int32_t timeout = kv ? (int32_t)kv->num : MG_TIMEOUT_MS_DEFAULT;
    /* The driver's defaults (30 s selection, 5 min socket) would hold a blocking thread
       far too long during an outage; a uri that sets them wins. */
    if (!mongoc_uri_has_option(m->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
        mongoc_uri_set_option_as_int32(m->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, timeout);
    if (!mongoc_uri_has_option(m->uri, MONGOC_URI_CONNECTTIMEOUTMS))
        mongoc_uri_set_option_as_int32(m->uri, MONGOC_URI_CONNECTTIMEOUTMS, timeout);
    if (!mongoc_uri_has_option(m->uri, MONGOC_URI_SOCKETTIMEOUTMS))
        mongoc_uri_set_option_as_int32(m->uri, MONGOC_URI_SOCKETTIMEOUTMS, timeout);
    kv = rt__sink_kv(sec, "database");
    const char *db =
        kv ? kv->str : (mongoc_uri_get_database(m->uri) ? mongoc_uri_get_database(m->uri) : "rt");
    kv = rt__sink_kv(sec, "collection");
    const char *coll = kv ? kv->str : "messages";
    if (!name_ok(db, sizeof(m->database)) || !name_ok(coll, sizeof(m->collection))) {
        snprintf(why, whylen,
                 "database and collection must be names of 1 to 127 bytes without "
                 "$, quotes, slashes or spaces");
        mg_free(s);
        return RT_EINVAL;
    }
    memcpy(m->database, db, strlen(db) + 1); /* name_ok checked the lengths */
    memcpy(m->collection, coll, strlen(coll) + 1);
    kv = rt__sink_kv(sec, "w");
    m->w = kv ? (int)kv->num : 1;
    kv = rt__sink_kv(sec, "journal");
    m->journal = kv && kv->b;
    m->wc = mongoc_write_concern_new();
    mongoc_write_concern_set_w(m->wc, m->w);
    if (m->journal)
        mongoc_write_concern_set_journal(m->wc, true);
    return 0;
}

/* Gives each row without an _id an ObjectId, so retries of it are recognisable. */
static rt_bin_t *mg_admit(rt_sink_t *s, rt_bin_t *rows, uint32_t nrows)
{
    const uint8_t *p = rt_bin_data(rows);
    size_t len = rt_bin_len(rows), off = 0, missing = 0;
    for (uint32_t i = 0; i < nrows; i++) {
        bson_t doc;
        uint32_t dl = rt__sink_doc_len(p + off);
        if (bson_init_static(&doc, p + off, dl) && !bson_has_field(&doc, "_id"))
            missing++;
        off += dl;
    }
    if (missing == 0)
        return rows;
    /* {_id: ObjectId} adds 17 bytes (type, "_id\0", 12) to each such row. */
    rt_bin_t *out = rt_bin_alloc(len + missing * 17);
    if (!out)
        return rows;
    uint8_t *q = rt_bin_data(out);
    size_t qoff = 0;
    off = 0;
    for (uint32_t i = 0; i < nrows; i++) {
        bson_t doc;
        uint32_t dl = rt__sink_doc_len(p + off);
        bool has = !bson_init_static(&doc, p + off, dl) || bson_has_field(&doc, "_id");
        if (has) {
            memcpy(q + qoff, p + off, dl);
            qoff += dl;
        } else {
            bson_oid_t oid;
            bson_oid_init(&oid, NULL);
            uint32_t nl = dl + 17;
            q[qoff] = (uint8_t)nl;
            q[qoff + 1] = (uint8_t)(nl >> 8);
            q[qoff + 2] = (uint8_t)(nl >> 16);
            q[qoff + 3] = (uint8_t)(nl >> 24);
            q[qoff + 4] = BSON_TYPE_OID;
            memcpy(q + qoff + 5, "_id", 4);
            memcpy(q + qoff + 9, oid.bytes, 12);
            memcpy(q + qoff + 21, p + off + 4, dl - 4);
            qoff += nl;
        }
        off += dl;
    }
    RT_ASSERT(qoff == len + missing * 17);
    rt_bin_release(rows);
    return out;
}

static int mg_open(rt_sink_t *s)
{
    mg_t *m = s->drv_state;
    if (!m->pool) {
        m->pool = mongoc_client_pool_new(m->uri);
        if (!m->pool) {
            rt__sink_error(s, "cannot make a client pool");
            return RT_EAGAIN;
        }
        mongoc_client_pool_set_error_api(m->pool, MONGOC_ERROR_API_VERSION_2);
        mongoc_client_pool_set_appname(m->pool, "rtd");
    }
    mongoc_client_t *c = mongoc_client_pool_pop(m->pool);
    bson_t ping = BSON_INITIALIZER;
    BSON_APPEND_INT32(&ping, "ping", 1);
    bson_error_t error;
    bool ok = mongoc_client_command_simple(c, "admin", &ping, NULL, NULL, &error);
    bson_destroy(&ping);
    mongoc_client_pool_push(m->pool, c);
    if (!ok) {
        rt__sink_error(s, "ping: %s", error.message);
        return RT_EAGAIN;
    }
    return 0;
}

/*
** The collection of row r (the rule's option, else the sink's), in buf if it is the
** option; NULL when the option is not a name MongoDB takes.
*/
static const char *row_collection(const mg_t *m, const sink_row_t *r, char *buf, size_t cap)
{
    uint32_t len;
    const char *c = rt__sink_opt_str(r, "collection", &len);
    if (!c)
        return m->collection;
    snprintf(buf, cap, "%.*s", (int)len, c);
    return len < cap && strlen(buf) == len && name_ok(buf, cap) ? buf : NULL;
}

/*
** One ordered bulk insert of rows[0..n) into coll. Returns how many rows are
** settled (written, or rejected with status set), or RT_EAGAIN with none known.
*/
static int bulk_insert(rt_sink_t *s, mg_t *m, mongoc_collection_t *coll, sink_row_t *rows, size_t n)
{
    bson_t opts = BSON_INITIALIZER;
    BSON_APPEND_BOOL(&opts, "ordered", true);
    mongoc_write_concern_append(m->wc, &opts);
    mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(coll, &opts);
    bson_destroy(&opts);
    bson_error_t error;
    for (size_t i = 0; i < n; i++) {
        bson_t doc;
        if (!bson_init_static(&doc, rows[i].doc, rows[i].len) ||
            !mongoc_bulk_operation_insert_with_opts(b, &doc, NULL, &error)) {
            /* Only this row's own shape can fail here: write the rows before it. */
            if (i == 0) {
                rt__sink_error(s, "row rejected: %s",
                               rows[i].len ? error.message : "malformed BSON");
                rows[0].status = RT_EINVAL;
                mongoc_bulk_operation_destroy(b);
                return 1;
            }
            n = i;
            break;
        }
    }
    bson_t reply;
    uint32_t ok = mongoc_bulk_operation_execute(b, &reply, &error);
    mongoc_bulk_operation_destroy(b);
    if (ok) {
        bson_destroy(&reply);
        return (int)n;
    }
    /* A row's own error (not the server's or the network's): the rows before it are in. */
    bson_iter_t it, errs, first;
    int settled = RT_EAGAIN;
    bool wc_error = bson_iter_init_find(&it, &reply, "writeConcernErrors") &&
                    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &errs) &&
                    bson_iter_next(&errs);
    if (!wc_error && bson_iter_init_find(&it, &reply, "writeErrors") &&
        BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &errs) && bson_iter_next(&errs) &&
        BSON_ITER_HOLDS_DOCUMENT(&errs) && bson_iter_recurse(&errs, &first)) {
        int64_t index = -1, code = 0;
        const char *msg = "";
        while (bson_iter_next(&first)) {
            if (strcmp(bson_iter_key(&first), "index") == 0)
                index = bson_iter_as_int64(&first);
            else if (strcmp(bson_iter_key(&first), "code") == 0)
                code = bson_iter_as_int64(&first);
            else if (strcmp(bson_iter_key(&first), "errmsg") == 0 && BSON_ITER_HOLDS_UTF8(&first))
                msg = bson_iter_utf8(&first, NULL);
        }
        if (index >= 0 && (size_t)index < n) {
            if (code != MG_DUPLICATE_KEY) {
                rt__sink_error(s, "row rejected: %s", msg);
                rows[index].status = RT_EINVAL;
            }
            settled = (int)index + 1;
        }
    }
    if (settled < 0)
        rt__sink_error(s, "insert into %s.%s: %s", m->database, mongoc_collection_get_name(coll),
                       error.message);
    bson_destroy(&reply);
    return settled;
}

static int mg_write(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    mg_t *m = s->drv_state;
    mongoc_client_t *c = mongoc_client_pool_pop(m->pool);
    int rc = 0;
    size_t i = 0;
    while (i < n && rc == 0) {
        /* The run of rows bound for the same collection, in order. */
        char name[128], other[128];
        const char *coll_name = row_collection(m, &rows[i], name, sizeof(name));
        if (!coll_name) {
            /* No retry would make this a valid name: the row alone is rejected. */
            rt__sink_error(s, "row rejected: collection \"%s\" is not a valid name", name);
            rows[i++].status = RT_EINVAL;
            continue;
        }
        size_t j = i + 1;
        const char *next;
        while (j < n && (next = row_collection(m, &rows[j], other, sizeof(other))) &&
               strcmp(next, coll_name) == 0)
            j++;
        mongoc_collection_t *coll = mongoc_client_get_collection(c, m->database, coll_name);
        while (i < j) {
            int done = bulk_insert(s, m, coll, rows + i, j - i);
            if (done < 0) {
                rc = RT_EAGAIN;
                break;
            }
            i += (size_t)done;
        }
        mongoc_collection_destroy(coll);
    }
    mongoc_client_pool_push(m->pool, c);
    return rc;
}

/* The settings; what the URI, write concern and client pool hold is libbson's (metered). */
static size_t mg_held(const rt_sink_t *s)
{
    return sizeof(mg_t);
}

const sink_driver_t rt_sink_mongo_driver = {
    .type = "mongodb",
    .blocking = true,
    .spills = true,
    .keys = mongo_keys,
    .configure = mg_configure,
    .admit = mg_admit,
    .open = mg_open,
    .write = mg_write,
    .free = mg_free,
    .held = mg_held,
};

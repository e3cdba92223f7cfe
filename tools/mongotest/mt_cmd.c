#define _GNU_SOURCE /* qsort_r */
/*
** Command semantics follow the MongoDB 5.0 server where the sink or the driver
** can observe them (reply fields, error codes 11000, 43, 59); what the server
** does not implement is refused with a clear error, never silently ignored.
*/
#include "mt_cmd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "mt_match.h"
#include "mt_wire.h"

/* A batch's documents may fill a reply up to this, leaving room for the envelope. */
#define MT_BATCH_BYTES (MT_MAX_BSON - 16 * 1024)
#define MT_FAULT_MS_MAX 600000 /* longest stall or refusal window, ms */
#define MT_NS_MAX (MT_DB_NAME_MAX + 256)

/* MongoDB error codes the server answers with. */
#define E_INTERNAL 1
#define E_BAD_VALUE 2
#define E_FAILED_TO_PARSE 9
#define E_TYPE_MISMATCH 14
#define E_INVALID_LENGTH 16
#define E_CURSOR_NOT_FOUND 43
#define E_NAMESPACE_EXISTS 48
#define E_COMMAND_NOT_FOUND 59
#define E_INVALID_NAMESPACE 73
#define E_NOT_SUPPORTED 115
#define E_DUPLICATE_KEY 11000
#define E_TOO_LARGE 10334
#define E_BAD_STAGE 40324

/* Result documents stored back to back, as they will be sent; buf.off is the next to send. */
typedef struct mt_docs {
    mt_buf_t buf;
    int64_t n;
} mt_docs_t;

struct mt_cursor {
    mt_cursor_t *next;
    int64_t id;
    char *ns;
    mt_docs_t docs;
};

static const uint8_t empty_doc[5] = {5, 0, 0, 0, 0};

int64_t mt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void err_reply(bson_t *r, int code, const char *name, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bson_reinit(r);
    BSON_APPEND_DOUBLE(r, "ok", 0.0);
    BSON_APPEND_UTF8(r, "errmsg", msg);
    BSON_APPEND_INT32(r, "code", code);
    BSON_APPEND_UTF8(r, "codeName", name);
}

static void store_error(mt_state_t *st, bson_t *reply, int rc)
{
    if (rc == RT_ENOMEM || !st)
        err_reply(reply, E_INTERNAL, "InternalError", "out of memory");
    else
        err_reply(reply, E_INTERNAL, "InternalError", "%s", mt_store_errmsg(st->store));
}

static void ok_reply(bson_t *r)
{
    BSON_APPEND_DOUBLE(r, "ok", 1.0);
}

/* Optional document argument: 0 if absent (out is {}), 1 if present, -1 after an error reply. */
static int arg_doc(const bson_t *cmd, const char *name, bson_t *out, bson_t *reply)
{
    bson_iter_t it;
    uint32_t len;
    const uint8_t *data;
    bson_init_static(out, empty_doc, sizeof empty_doc);
    if (!bson_iter_init_find(&it, cmd, name) || BSON_ITER_HOLDS_NULL(&it))
        return 0;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
        err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "'%s' must be a document", name);
        return -1;
    }
    bson_iter_document(&it, &len, &data);
    bson_init_static(out, data, len);
    return 1;
}

/* Optional integer argument: 0 if absent (out = def), 1 if present, -1 after an error reply. */
static int arg_int(const bson_t *cmd, const char *name, int64_t def, int64_t *out, bson_t *reply)
{
    bson_iter_t it;
    *out = def;
    if (!bson_iter_init_find(&it, cmd, name) || BSON_ITER_HOLDS_NULL(&it))
        return 0;
    if (!mt_iter_int64(&it, out)) {
        err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "'%s' must be a number", name);
        return -1;
    }
    return 1;
}

static bool arg_bool(const bson_t *cmd, const char *name, bool def)
{
    bson_iter_t it;
    return bson_iter_init_find(&it, cmd, name) ? bson_iter_as_bool(&it) : def;
}

/* Required array argument: 0 with arr ready to iterate, or -1 after an error reply. */
static int arg_array(const bson_t *cmd, const char *name, bson_iter_t *arr, bson_t *reply)
{
    bson_iter_t it;
    if (!bson_iter_init_find(&it, cmd, name)) {
        err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse", "BSON field '%s' is missing", name);
        return -1;
    }
    if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, arr)) {
        err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "'%s' must be an array", name);
        return -1;
    }
    return 0;
}

/* A string argument that names a collection; NULL after an error reply. */
static const char *name_arg(const bson_iter_t *it, const char *what, bson_t *reply)
{
    uint32_t n = 0;
    const char *s = BSON_ITER_HOLDS_UTF8(it) ? bson_iter_utf8(it, &n) : NULL;
    if (!s || !n || strlen(s) != n || n > 200 || s[0] == '$' || s[0] == '.') {
        err_reply(reply, E_INVALID_NAMESPACE, "InvalidNamespace", "invalid %s name", what);
        return NULL;
    }
    return s;
}

/* The collection of a getMore or killCursors, which may be a listCollections cursor's. */
static const char *cursor_coll_name(const bson_iter_t *it, bson_t *reply)
{
    if (BSON_ITER_HOLDS_UTF8(it) && !strcmp(bson_iter_utf8(it, NULL), "$cmd.listCollections"))
        return bson_iter_utf8(it, NULL);
    return name_arg(it, "collection", reply);
}

/* The collection a command names in its first field. */
static const char *coll_name(const bson_t *cmd, bson_t *reply)
{
    bson_iter_t it;
    bson_iter_init(&it, cmd);
    bson_iter_next(&it);
    return name_arg(&it, "collection", reply);
}

static int docs_add(mt_docs_t *d, const uint8_t *doc, size_t len)
{
    int rc = mt_buf_append(&d->buf, doc, len);
    if (!rc)
        d->n++;
    return rc;
}

static void docs_free(mt_docs_t *d)
{
    mt_buf_free(&d->buf);
    d->n = 0;
}

static uint32_t doc_len(const uint8_t *p)
{
    uint32_t len;
    memcpy(&len, p, 4);
    return BSON_UINT32_FROM_LE(len);
}

/* The document at *off (advanced past it); false at the end. */
static bool docs_next(const mt_docs_t *d, size_t *off, bson_t *doc)
{
    if (*off >= d->buf.len)
        return false;
    uint32_t len = doc_len(d->buf.p + *off);
    bson_init_static(doc, d->buf.p + *off, len);
    *off += len;
    return true;
}

/* One scan of a collection: filter, then skip, then limit; matches are kept or counted. */
typedef struct query {
    const bson_t *filter;
    int64_t skip;
    int64_t limit; /* 0 = no limit */
    int64_t skipped;
    int64_t count;
    mt_docs_t *out; /* matched documents, if not NULL */
    int64_t *seqs;  /* matched row numbers, if collect_seqs */
    size_t seqs_cap;
    bool collect_seqs;
} query_t;

static int query_cb(void *ctx, int64_t seq, const uint8_t *p, size_t len)
{
    query_t *q = ctx;
    bson_t doc;
    /* Rows were checked on insert; a row damaged in the file since then matches nothing. */
    if (!bson_init_static(&doc, p, len) || !mt_filter_match(q->filter, &doc))
        return 0;
    if (q->skipped < q->skip) {
        q->skipped++;
        return 0;
    }
    if (q->out && docs_add(q->out, p, len))
        return RT_ENOMEM;
    if (q->collect_seqs) {
        if ((size_t)q->count == q->seqs_cap) {
            size_t cap = q->seqs_cap ? q->seqs_cap * 2 : 64;
            int64_t *s = realloc(q->seqs, cap * sizeof *s);
            if (!s)
                return RT_ENOMEM;
            q->seqs = s;
            q->seqs_cap = cap;
        }
        q->seqs[q->count] = seq;
    }
    q->count++;
    return q->limit && q->count >= q->limit ? 1 : 0;
}

static int query_run(mt_state_t *st, mt_coll_t *c, query_t *q, bool reverse)
{
    uint8_t key[MT_KEY_MAX];
    size_t klen = 0;
    bool by_id = mt_filter_id_key(q->filter, key, &klen);
    return mt_store_scan(st->store, c, by_id ? key : NULL, klen, reverse, query_cb, q);
}

typedef struct sort_item {
    const uint8_t *p;
    size_t idx; /* position before sorting, so equal keys keep insertion order */
} sort_item_t;

static int sort_item_cmp(const void *a, const void *b, void *spec)
{
    const sort_item_t *x = a, *y = b;
    bson_t dx, dy;
    bson_init_static(&dx, x->p, doc_len(x->p));
    bson_init_static(&dy, y->p, doc_len(y->p));
    int c = mt_sort_cmp(spec, &dx, &dy);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Sorts d by spec and keeps only the documents from skip on, at most limit (0 = all). */
static int sort_docs(mt_docs_t *d, const bson_t *spec, int64_t skip, int64_t limit)
{
    mt_docs_t out = {0};
    sort_item_t *items = d->n ? malloc((size_t)d->n * sizeof *items) : NULL;
    if (d->n && !items)
        return RT_ENOMEM;
    if (!d->n)
        return 0;
    size_t off = 0;
    for (int64_t i = 0; i < d->n; i++) {
        items[i] = (sort_item_t){d->buf.p + off, (size_t)i};
        off += doc_len(d->buf.p + off);
    }
    qsort_r(items, (size_t)d->n, sizeof *items, sort_item_cmp, (void *)spec);
    int rc = 0;
    for (int64_t i = skip; i < d->n && (!limit || i - skip < limit) && !rc; i++)
        rc = docs_add(&out, items[i].p, doc_len(items[i].p));
    free(items);
    if (rc) {
        docs_free(&out);
        return rc;
    }
    docs_free(d);
    *d = out;
    return 0;
}

/* Keeps the documents of d that match filter (NULL: all), from skip on, at most limit. */
static int docs_filter(mt_docs_t *d, const bson_t *filter, int64_t skip, int64_t limit)
{
    mt_docs_t out = {0};
    bson_t all, doc;
    bson_init_static(&all, empty_doc, sizeof empty_doc);
    query_t q = {.filter = filter ? filter : &all, .skip = skip, .limit = limit, .out = &out};
    size_t off = 0;
    int rc = 0;
    while (!rc && docs_next(d, &off, &doc))
        rc = query_cb(&q, 0, bson_get_data(&doc), doc.len);
    if (rc < 0) {
        docs_free(&out);
        return rc;
    }
    docs_free(d);
    *d = out;
    return 0;
}

/* Replaces each document of d by its projection. */
static int project_docs(mt_docs_t *d, const bson_t *proj)
{
    mt_docs_t out = {0};
    bson_t doc;
    size_t off = 0;
    int rc = 0;
    while (!rc && docs_next(d, &off, &doc)) {
        bson_t p = BSON_INITIALIZER;
        mt_project(proj, &doc, &p);
        rc = docs_add(&out, bson_get_data(&p), p.len);
        bson_destroy(&p);
    }
    if (rc) {
        docs_free(&out);
        return rc;
    }
    docs_free(d);
    *d = out;
    return 0;
}

/*
** Runs a find-style query on db.coll: documents (into docs) or just their count
** (into *count). natural is the insertion order direction, or 0 to sort by sort.
** A missing collection is an empty one.
*/
static int collect(mt_state_t *st, const char *db, const char *coll, const bson_t *filter,
                   const bson_t *sort, int natural, int64_t skip, int64_t limit, mt_docs_t *docs,
                   int64_t *count)
{
    mt_coll_t *c;
    int rc = mt_store_coll(st->store, db, coll, false, &c);
    if (count)
        *count = 0;
    if (rc == RT_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    query_t q = {.filter = filter, .out = docs};
    if (natural) {
        q.skip = skip;
        q.limit = limit;
    }
    rc = query_run(st, c, &q, natural < 0);
    if (count)
        *count = q.count;
    if (rc || natural)
        return rc;
    return sort_docs(docs, sort, skip, limit);
}

/*
** Moves up to max documents (all if max < 0, but at least one if any remain)
** that fit in MT_BATCH_BYTES from docs into the array name of parent.
*/
static void append_batch(bson_t *parent, const char *name, mt_docs_t *docs, int64_t max)
{
    bson_t arr;
    size_t bytes = 0;
    uint32_t i = 0;
    bson_append_array_begin(parent, name, -1, &arr);
    while ((max < 0 || i < max) && docs->buf.off < docs->buf.len) {
        uint32_t len = doc_len(docs->buf.p + docs->buf.off);
        char buf[16];
        const char *key;
        bson_t doc;
        if (i && bytes + len > MT_BATCH_BYTES)
            break;
        bson_init_static(&doc, docs->buf.p + docs->buf.off, len);
        bson_uint32_to_string(i++, &key, buf, sizeof buf);
        bson_append_document(&arr, key, -1, &doc);
        docs->buf.off += len;
        bytes += len;
    }
    bson_append_array_end(parent, &arr);
}

static void cursor_free(mt_cursor_t *c)
{
    docs_free(&c->docs);
    free(c->ns);
    free(c);
}

/* Finds an open cursor and moves it to the front of the list; NULL if unknown. */
static mt_cursor_t *cursor_find(mt_state_t *st, int64_t id)
{
    for (mt_cursor_t **p = &st->cursors; *p; p = &(*p)->next) {
        mt_cursor_t *c = *p;
        if (c->id != id)
            continue;
        *p = c->next;
        c->next = st->cursors;
        st->cursors = c;
        return c;
    }
    return NULL;
}

static void cursor_close(mt_state_t *st, mt_cursor_t *c)
{
    for (mt_cursor_t **p = &st->cursors; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            st->ncursors--;
            cursor_free(c);
            return;
        }
    }
}

/* Keeps docs for getMore; returns the cursor id, or 0 if out of memory (docs are then freed). */
static int64_t cursor_open(mt_state_t *st, const char *ns, mt_docs_t *docs)
{
    if (st->ncursors >= MT_CURSORS_MAX) {
        mt_cursor_t *last = st->cursors;
        while (last->next)
            last = last->next;
        cursor_close(st, last);
    }
    mt_cursor_t *c = calloc(1, sizeof *c);
    if (!c || !(c->ns = strdup(ns))) {
        free(c);
        docs_free(docs);
        return 0;
    }
    c->id = st->next_cursor_id++;
    c->docs = *docs;
    memset(docs, 0, sizeof *docs);
    c->next = st->cursors;
    st->cursors = c;
    st->ncursors++;
    return c->id;
}

/* Replies {cursor: {firstBatch, id, ns}, ok: 1}, keeping what does not fit in a cursor. */
static void cursor_reply(mt_state_t *st, bson_t *reply, const char *ns, mt_docs_t *docs,
                         int64_t batch, bool single)
{
    bson_t cur;
    int64_t id = 0;
    BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
    append_batch(&cur, "firstBatch", docs, batch);
    bool more = !single && docs->buf.off < docs->buf.len;
    if (more)
        id = cursor_open(st, ns, docs);
    BSON_APPEND_INT64(&cur, "id", id);
    BSON_APPEND_UTF8(&cur, "ns", ns);
    bson_append_document_end(reply, &cur);
    docs_free(docs);
    /* Without its cursor the client would take the first batch for the whole result. */
    if (more && !id)
        store_error(st, reply, RT_ENOMEM);
    else
        ok_reply(reply);
}

static void cmd_hello(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                      bson_t *reply)
{
    BSON_APPEND_BOOL(reply, strcmp(name, "hello") ? "ismaster" : "isWritablePrimary", true);
    if (arg_bool(cmd, "helloOk", false))
        BSON_APPEND_BOOL(reply, "helloOk", true);
    /* No topologyVersion: with one, pooled drivers poll with awaitable hellos in a loop. */
    BSON_APPEND_INT32(reply, "maxBsonObjectSize", MT_MAX_BSON);
    BSON_APPEND_INT32(reply, "maxMessageSizeBytes", MT_MAX_MESSAGE);
    BSON_APPEND_INT32(reply, "maxWriteBatchSize", MT_MAX_WRITE_BATCH);
    BSON_APPEND_DATE_TIME(reply, "localTime", wall_ms());
    BSON_APPEND_INT32(reply, "logicalSessionTimeoutMinutes", MT_SESSION_TIMEOUT_MIN);
    BSON_APPEND_INT64(reply, "connectionId", call->conn_id);
    BSON_APPEND_INT32(reply, "minWireVersion", 0);
    BSON_APPEND_INT32(reply, "maxWireVersion", MT_WIRE_VERSION);
    BSON_APPEND_BOOL(reply, "readOnly", false);
    ok_reply(reply);
}

static void cmd_ping(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                     bson_t *reply)
{
    ok_reply(reply);
}

static void cmd_buildinfo(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                          bson_t *reply)
{
    bson_t arr;
    BSON_APPEND_UTF8(reply, "version", "5.0.0");
    BSON_APPEND_UTF8(reply, "gitVersion", "rt_mongo_test");
    BSON_APPEND_ARRAY_BEGIN(reply, "versionArray", &arr);
    BSON_APPEND_INT32(&arr, "0", 5);
    BSON_APPEND_INT32(&arr, "1", 0);
    BSON_APPEND_INT32(&arr, "2", 0);
    BSON_APPEND_INT32(&arr, "3", 0);
    bson_append_array_end(reply, &arr);
    BSON_APPEND_INT32(reply, "bits", 64);
    BSON_APPEND_INT32(reply, "maxBsonObjectSize", MT_MAX_BSON);
    ok_reply(reply);
}

/*
** Stores one document, giving it an ObjectId _id first if it has none. Returns
** 0 with *code 0, 0 with a write error in *code and msg, or a store failure.
*/
static int insert_one(mt_state_t *st, mt_coll_t *c, const char *ns, const bson_t *doc, int *code,
                      char *msg, size_t msglen)
{
    bson_t with_id;
    const bson_t *d = doc;
    bson_iter_t id;
    uint8_t key[MT_KEY_MAX];
    size_t klen;
    int rc = 0;

    *code = 0;
    if (!bson_iter_init_find(&id, doc, "_id")) {
        bson_oid_t oid;
        bson_oid_init(&oid, NULL);
        bson_init(&with_id);
        BSON_APPEND_OID(&with_id, "_id", &oid);
        bson_concat(&with_id, doc);
        d = &with_id;
        bson_iter_init_find(&id, d, "_id");
    }
    if (BSON_ITER_HOLDS_ARRAY(&id) || BSON_ITER_HOLDS_REGEX(&id) ||
        bson_iter_type(&id) == BSON_TYPE_UNDEFINED) {
        *code = E_BAD_VALUE;
        snprintf(msg, msglen, "can't use an array, regex or undefined for _id");
    } else if (d->len > MT_MAX_BSON) {
        *code = E_TOO_LARGE;
        snprintf(msg, msglen, "object to insert too large: %u bytes", d->len);
    } else if (mt_id_key(&id, key, &klen)) {
        *code = E_BAD_VALUE;
        snprintf(msg, msglen, "_id is too large (index keys are at most %d bytes)", MT_KEY_MAX);
    } else {
        rc = mt_store_insert(st->store, c, key, klen, bson_get_data(d), d->len);
        if (rc == RT_EEXIST) {
            bson_t idoc = BSON_INITIALIZER;
            bson_append_iter(&idoc, "_id", 3, &id);
            char *json = bson_as_relaxed_extended_json(&idoc, NULL);
            *code = E_DUPLICATE_KEY;
            snprintf(msg, msglen,
                     "E11000 duplicate key error collection: %s index: _id_ dup key: %s", ns,
                     json ? json : "{}");
            bson_free(json);
            bson_destroy(&idoc);
            rc = 0;
        }
    }
    if (d == &with_id)
        bson_destroy(&with_id);
    return rc;
}

static void write_error(bson_t *errs, uint32_t *nerr, uint32_t index, int code, const char *msg)
{
    char buf[16];
    const char *key;
    bson_t e;
    bson_uint32_to_string((*nerr)++, &key, buf, sizeof buf);
    BSON_APPEND_DOCUMENT_BEGIN(errs, key, &e);
    BSON_APPEND_INT32(&e, "index", (int32_t)index);
    BSON_APPEND_INT32(&e, "code", code);
    BSON_APPEND_UTF8(&e, "errmsg", msg);
    bson_append_document_end(errs, &e);
}

/* Replies {n, writeErrors?, ok: 1} for a write command. */
static void write_reply(bson_t *reply, int64_t n, bson_t *errs, uint32_t nerr)
{
    BSON_APPEND_INT32(reply, "n", (int32_t)n);
    if (nerr)
        BSON_APPEND_ARRAY(reply, "writeErrors", errs);
    ok_reply(reply);
}

static void cmd_insert(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                       bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_iter_t docs, it;
    if (!coll || arg_array(cmd, "documents", &docs, reply))
        return;
    bool ordered = arg_bool(cmd, "ordered", true);
    int64_t count = 0;
    for (it = docs; bson_iter_next(&it); count++) {
        if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
            err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "documents[%lld] is not a document",
                      (long long)count);
            return;
        }
    }
    if (count < 1 || count > MT_MAX_WRITE_BATCH) {
        err_reply(reply, E_INVALID_LENGTH, "InvalidLength",
                  "Write batch sizes must be between 1 and %d. Got %lld operations.",
                  MT_MAX_WRITE_BATCH, (long long)count);
        return;
    }
    if (st->fail_writes > 0) {
        st->fail_writes--;
        st->writes_failed++;
        err_reply(reply, st->fail_code, "InternalError",
                  "rtFault failWrites: injected failure of this insert command");
        return;
    }

    char ns[MT_NS_MAX];
    snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
    mt_coll_t *c;
    bson_t errs = BSON_INITIALIZER;
    uint32_t nerr = 0, index = 0;
    int64_t n = 0;
    int rc = mt_store_begin(st->store);
    if (!rc)
        rc = mt_store_coll(st->store, call->db, coll, true, &c);
    for (; !rc && bson_iter_next(&docs); index++) {
        uint32_t len;
        const uint8_t *data;
        bson_t doc;
        int code;
        char msg[512];
        bson_iter_document(&docs, &len, &data);
        bson_init_static(&doc, data, len);
        rc = insert_one(st, c, ns, &doc, &code, msg, sizeof msg);
        if (rc)
            break;
        if (!code) {
            n++;
            continue;
        }
        write_error(&errs, &nerr, index, code, msg);
        if (ordered)
            break;
    }
    if (!rc)
        rc = mt_store_commit(st->store);
    if (rc) {
        mt_store_rollback(st->store);
        store_error(st, reply, rc);
    } else {
        st->inserted += n;
        write_reply(reply, n, &errs, nerr);
    }
    bson_destroy(&errs);
}

/* A negative limit counts like its absolute value; INT64_MIN has none, and means no limit. */
static int64_t abs_limit(int64_t limit)
{
    return limit >= 0 ? limit : limit == INT64_MIN ? 0 : -limit;
}

/* Reads the batchSize of a command (or of its cursor option): -1 after an error reply. */
static int batch_size(const bson_t *opts, int64_t def, int64_t *out, bson_t *reply)
{
    if (arg_int(opts, "batchSize", def, out, reply) < 0)
        return -1;
    if (*out < 0) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "batchSize must be non-negative");
        return -1;
    }
    return 0;
}

static void cmd_find(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                     bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_t filter, sort, proj;
    int64_t skip, limit, batch;
    int natural;
    char err[256];
    if (!coll || arg_doc(cmd, "filter", &filter, reply) < 0 ||
        arg_doc(cmd, "sort", &sort, reply) < 0 || arg_doc(cmd, "projection", &proj, reply) < 0 ||
        arg_int(cmd, "skip", 0, &skip, reply) < 0 || arg_int(cmd, "limit", 0, &limit, reply) < 0 ||
        batch_size(cmd, MT_DEFAULT_BATCH, &batch, reply))
        return;
    bool single = arg_bool(cmd, "singleBatch", false);
    if (mt_filter_check(&filter, err, sizeof err) ||
        mt_sort_check(&sort, &natural, err, sizeof err) ||
        mt_projection_check(&proj, err, sizeof err)) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "%s", err);
        return;
    }
    if (skip < 0) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "skip must be non-negative");
        return;
    }
    if (limit < 0) { /* a negative limit is the legacy way to ask for a single batch */
        limit = abs_limit(limit);
        single = true;
    }
    char ns[MT_NS_MAX];
    snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
    mt_docs_t docs = {0};
    int rc = collect(st, call->db, coll, &filter, &sort, natural, skip, limit, &docs, NULL);
    if (!rc && !bson_empty(&proj))
        rc = project_docs(&docs, &proj);
    if (rc) {
        docs_free(&docs);
        store_error(st, reply, rc);
        return;
    }
    cursor_reply(st, reply, ns, &docs, batch, single);
}

static void cmd_getmore(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                        bson_t *reply)
{
    bson_iter_t it;
    int64_t batch;
    bson_iter_init(&it, cmd);
    bson_iter_next(&it);
    if (!BSON_ITER_HOLDS_INT64(&it) && !BSON_ITER_HOLDS_INT32(&it)) {
        err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "getMore cursor id must be a long");
        return;
    }
    int64_t id = bson_iter_as_int64(&it);
    if (!bson_iter_init_find(&it, cmd, "collection")) {
        err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse", "BSON field 'collection' is missing");
        return;
    }
    const char *coll = cursor_coll_name(&it, reply);
    if (!coll || batch_size(cmd, 0, &batch, reply))
        return;
    char ns[MT_NS_MAX];
    snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
    mt_cursor_t *c = cursor_find(st, id);
    if (!c || strcmp(c->ns, ns)) {
        err_reply(reply, E_CURSOR_NOT_FOUND, "CursorNotFound", "cursor id %lld not found",
                  (long long)id);
        return;
    }
    bson_t cur;
    BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
    append_batch(&cur, "nextBatch", &c->docs, batch ? batch : -1);
    bool done = c->docs.buf.off >= c->docs.buf.len;
    BSON_APPEND_INT64(&cur, "id", done ? 0 : id);
    BSON_APPEND_UTF8(&cur, "ns", ns);
    bson_append_document_end(reply, &cur);
    if (done)
        cursor_close(st, c);
    ok_reply(reply);
}

static void cmd_killcursors(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                            bson_t *reply)
{
    bson_iter_t ids;
    bson_t killed, missing, empty;
    uint32_t nk = 0, nm = 0;
    bson_iter_t first;
    bson_iter_init(&first, cmd);
    bson_iter_next(&first);
    if (!cursor_coll_name(&first, reply) || arg_array(cmd, "cursors", &ids, reply))
        return;
    bson_init(&killed);
    bson_init(&missing);
    while (bson_iter_next(&ids)) {
        char buf[16];
        const char *key;
        int64_t id = 0;
        mt_iter_int64(&ids, &id);
        mt_cursor_t *c = cursor_find(st, id);
        if (c)
            cursor_close(st, c);
        bson_uint32_to_string(c ? nk++ : nm++, &key, buf, sizeof buf);
        BSON_APPEND_INT64(c ? &killed : &missing, key, id);
    }
    bson_init(&empty);
    BSON_APPEND_ARRAY(reply, "cursorsKilled", &killed);
    BSON_APPEND_ARRAY(reply, "cursorsNotFound", &missing);
    BSON_APPEND_ARRAY(reply, "cursorsAlive", &empty);
    BSON_APPEND_ARRAY(reply, "cursorsUnknown", &empty);
    ok_reply(reply);
    bson_destroy(&killed);
    bson_destroy(&missing);
    bson_destroy(&empty);
}

static void append_count(bson_t *doc, const char *name, int64_t n)
{
    if (n <= INT32_MAX)
        BSON_APPEND_INT32(doc, name, (int32_t)n);
    else
        BSON_APPEND_INT64(doc, name, n);
}

static void cmd_count(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                      bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_t filter;
    int64_t skip, limit, n;
    char err[256];
    if (!coll || arg_doc(cmd, "query", &filter, reply) < 0 ||
        arg_int(cmd, "skip", 0, &skip, reply) < 0 || arg_int(cmd, "limit", 0, &limit, reply) < 0)
        return;
    if (mt_filter_check(&filter, err, sizeof err)) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "%s", err);
        return;
    }
    if (skip < 0) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "skip must be non-negative");
        return;
    }
    int rc = collect(st, call->db, coll, &filter, NULL, 1, skip, abs_limit(limit), NULL, &n);
    if (rc) {
        store_error(st, reply, rc);
        return;
    }
    append_count(reply, "n", n);
    ok_reply(reply);
}

/* A running sum as MongoDB's $sum keeps it: integer until a double joins. */
typedef struct sum {
    int64_t i;
    double d;
    bool is_double;
} sum_t;

static void sum_add(sum_t *s, const bson_iter_t *v)
{
    if (BSON_ITER_HOLDS_DOUBLE(v) || s->is_double) {
        if (!s->is_double)
            s->d = (double)s->i;
        s->is_double = true;
        s->d += bson_iter_as_double(v);
    } else if (BSON_ITER_HOLDS_INT32(v) || BSON_ITER_HOLDS_INT64(v)) {
        int64_t x = bson_iter_as_int64(v), sum;
        /* Past int64 the sum goes on as a double, as MongoDB's does. */
        if (__builtin_add_overflow(s->i, x, &sum)) {
            s->d = (double)s->i + (double)x;
            s->is_double = true;
        } else {
            s->i = sum;
        }
    }
}

/*
** $group with a constant _id: one output document holding each accumulator
** ({$sum: number}, {$sum: "$path"} or {$count: {}}) over all input, or none
** for empty input. Returns 0, or -1 after an error reply.
*/
static int stage_group(mt_docs_t *d, const bson_iter_t *stage, bson_t *reply)
{
    bson_iter_t spec, it, acc;
    bson_t out = BSON_INITIALIZER, doc;
    bool have_id = false;
    int rc = 0;
    if (!BSON_ITER_HOLDS_DOCUMENT(stage) || !bson_iter_recurse(stage, &spec)) {
        err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse", "$group needs a document");
        return -1;
    }
    for (it = spec; bson_iter_next(&it);) {
        const char *field = bson_iter_key(&it);
        if (!strcmp(field, "_id")) {
            bool expr = (BSON_ITER_HOLDS_UTF8(&it) && bson_iter_utf8(&it, NULL)[0] == '$') ||
                        (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &acc) &&
                         bson_iter_next(&acc) && bson_iter_key(&acc)[0] == '$');
            if (expr) {
                err_reply(reply, E_NOT_SUPPORTED, "CommandNotSupported",
                          "rt_mongo_test supports $group only with a constant _id");
                rc = -1;
                break;
            }
            bson_append_iter(&out, "_id", 3, &it);
            have_id = true;
            continue;
        }
        const char *op = NULL;
        if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &acc) && bson_iter_next(&acc))
            op = bson_iter_key(&acc);
        bool path = op && BSON_ITER_HOLDS_UTF8(&acc) && bson_iter_utf8(&acc, NULL)[0] == '$';
        bool ok = op && ((!strcmp(op, "$sum") && (BSON_ITER_HOLDS_NUMBER(&acc) || path)) ||
                         !strcmp(op, "$count"));
        if (!ok) {
            err_reply(reply, E_NOT_SUPPORTED, "CommandNotSupported",
                      "rt_mongo_test supports only {$sum: <number or \"$field\">} and {$count: {}}"
                      " in $group (field '%s')",
                      field);
            rc = -1;
            break;
        }
        /* Constant sums need only the number of inputs, which d->n has even when counted. */
        sum_t s = {0};
        size_t off = 0;
        if (!strcmp(op, "$count"))
            s.i = d->n;
        else if (!path && BSON_ITER_HOLDS_DOUBLE(&acc))
            s.d = bson_iter_double(&acc) * (double)d->n, s.is_double = true;
        else if (!path && __builtin_mul_overflow(bson_iter_as_int64(&acc), d->n, &s.i))
            s.d = (double)bson_iter_as_int64(&acc) * (double)d->n, s.is_double = true;
        while (path && docs_next(d, &off, &doc)) {
            bson_iter_t di, v;
            if (bson_iter_init(&di, &doc) &&
                bson_iter_find_descendant(&di, bson_iter_utf8(&acc, NULL) + 1, &v))
                sum_add(&s, &v);
        }
        if (s.is_double)
            BSON_APPEND_DOUBLE(&out, field, s.d);
        else
            append_count(&out, field, s.i);
    }
    if (!rc && !have_id) {
        err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse",
                  "a group specification must include an _id");
        rc = -1;
    }
    if (!rc) {
        bool any = d->n > 0;
        docs_free(d);
        if (any && docs_add(d, bson_get_data(&out), out.len)) {
            store_error(NULL, reply, RT_ENOMEM);
            rc = -1;
        }
    }
    bson_destroy(&out);
    return rc;
}

/* $count: one document {name: number of inputs}, or none for empty input. */
static int stage_count(mt_docs_t *d, const bson_iter_t *stage, bson_t *reply)
{
    const char *field = BSON_ITER_HOLDS_UTF8(stage) ? bson_iter_utf8(stage, NULL) : "";
    if (!field[0] || field[0] == '$' || strchr(field, '.')) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "$count needs a field name");
        return -1;
    }
    int64_t n = d->n;
    docs_free(d);
    if (!n)
        return 0;
    bson_t out = BSON_INITIALIZER;
    append_count(&out, field, n);
    int rc = docs_add(d, bson_get_data(&out), out.len);
    bson_destroy(&out);
    if (rc)
        store_error(NULL, reply, rc);
    return rc ? -1 : 0;
}

/* A stage argument that must be a non-negative (positive for $limit) integer. */
static int stage_int(const bson_iter_t *stage, int64_t min, int64_t *out, bson_t *reply)
{
    if (!mt_iter_int64(stage, out) || *out < min) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "%s needs an integer >= %lld",
                  bson_iter_key(stage), (long long)min);
        return -1;
    }
    return 0;
}

/*
** Runs one stage over d; the first stage also loads the collection. Returns 0,
** or -1 after writing an error reply (no RT_E* code is -1).
*/
static int run_stage(mt_state_t *st, mt_call_t *call, const char *coll, mt_docs_t *d, bool *loaded,
                     const bson_iter_t *stage, bson_t *reply)
{
    const char *op = bson_iter_key(stage);
    bson_t arg;
    char err[256];
    int64_t n;
    int natural = 1, rc = 0;

    if (!strcmp(op, "$match") || !strcmp(op, "$sort")) {
        uint32_t len;
        const uint8_t *data;
        if (!BSON_ITER_HOLDS_DOCUMENT(stage)) {
            err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse", "%s needs a document", op);
            return -1;
        }
        bson_iter_document(stage, &len, &data);
        bson_init_static(&arg, data, len);
        rc = op[1] == 'm' ? mt_filter_check(&arg, err, sizeof err)
                          : mt_sort_check(&arg, &natural, err, sizeof err);
        if (rc) {
            err_reply(reply, E_BAD_VALUE, "BadValue", "%s", err);
            return -1;
        }
    }
    if (!*loaded) {
        bson_t all;
        bson_init_static(&all, empty_doc, sizeof empty_doc);
        *loaded = true;
        if (!strcmp(op, "$collStats")) {
            rc = collect(st, call->db, coll, &all, NULL, 1, 0, 0, NULL, &n);
            if (!rc) {
                char ns[MT_NS_MAX];
                bson_t out = BSON_INITIALIZER;
                snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
                BSON_APPEND_UTF8(&out, "ns", ns);
                BSON_APPEND_DATE_TIME(&out, "localTime", wall_ms());
                BSON_APPEND_INT64(&out, "count", n);
                rc = docs_add(d, bson_get_data(&out), out.len);
                bson_destroy(&out);
            }
            goto done;
        }
        /* A leading $match filters while scanning, so only matches are held in memory. */
        bool match = !strcmp(op, "$match");
        rc = collect(st, call->db, coll, match ? &arg : &all, NULL, 1, 0, 0, d, NULL);
        if (rc || match)
            goto done;
    }
    if (!strcmp(op, "$match"))
        rc = docs_filter(d, &arg, 0, 0);
    else if (!strcmp(op, "$sort"))
        rc = natural ? 0 : sort_docs(d, &arg, 0, 0);
    else if (!strcmp(op, "$skip"))
        rc = stage_int(stage, 0, &n, reply) ? -1 : docs_filter(d, NULL, n, 0);
    else if (!strcmp(op, "$limit"))
        rc = stage_int(stage, 1, &n, reply) ? -1 : docs_filter(d, NULL, 0, n);
    else if (!strcmp(op, "$count"))
        return stage_count(d, stage, reply);
    else if (!strcmp(op, "$group"))
        return stage_group(d, stage, reply);
    else {
        err_reply(reply, E_BAD_STAGE, "Location40324",
                  "rt_mongo_test does not support the pipeline stage '%s' ($match, $sort, $skip,"
                  " $limit, $count, $group, and $collStats first)",
                  op);
        return -1;
    }
    if (rc == -1)
        return -1;
done:
    if (rc)
        store_error(st, reply, rc);
    return rc ? -1 : 0;
}

/* True if a $group stage sums only constants, so the number of inputs is all it needs. */
static bool group_counts_only(const bson_iter_t *stage)
{
    bson_iter_t spec, acc;
    if (!BSON_ITER_HOLDS_DOCUMENT(stage) || !bson_iter_recurse(stage, &spec))
        return false;
    while (bson_iter_next(&spec)) {
        if (!strcmp(bson_iter_key(&spec), "_id"))
            continue;
        if (!BSON_ITER_HOLDS_DOCUMENT(&spec) || !bson_iter_recurse(&spec, &acc) ||
            !bson_iter_next(&acc) || BSON_ITER_HOLDS_UTF8(&acc))
            return false;
    }
    return true;
}

/*
** count_documents sends [$match, $skip?, $limit?, $group {_id: 1, n: {$sum: 1}}];
** such a pipeline (or one ending in $count) is answered from a counting scan,
** without holding the documents. Returns 1 if it was (the result is in d), 0 if
** the pipeline has another shape, or -1 after writing an error reply.
*/
static int count_pipeline(mt_state_t *st, mt_call_t *call, const char *coll, bson_iter_t stages,
                          mt_docs_t *d, bson_t *reply)
{
    bson_iter_t it = stages, stage, last;
    bson_t filter;
    int64_t skip = 0, limit = 0;
    int step = 0; /* stages must come in the order $match, $skip, $limit */
    bool have_last = false;
    char err[256];
    bson_init_static(&filter, empty_doc, sizeof empty_doc);
    while (bson_iter_next(&it)) {
        if (have_last || !BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &stage) ||
            !bson_iter_next(&stage))
            return 0;
        const char *op = bson_iter_key(&stage);
        if (!strcmp(op, "$match") && step < 1 && BSON_ITER_HOLDS_DOCUMENT(&stage)) {
            uint32_t len;
            const uint8_t *data;
            bson_iter_document(&stage, &len, &data);
            bson_init_static(&filter, data, len);
            step = 1;
        } else if (!strcmp(op, "$skip") && step < 2 && mt_iter_int64(&stage, &skip) && skip >= 0) {
            step = 2;
        } else if (!strcmp(op, "$limit") && step < 3 && mt_iter_int64(&stage, &limit) &&
                   limit > 0) {
            step = 3;
        } else if (!strcmp(op, "$count") || (!strcmp(op, "$group") && group_counts_only(&stage))) {
            last = stage;
            have_last = true;
        } else {
            return 0;
        }
    }
    if (!have_last || mt_filter_check(&filter, err, sizeof err))
        return 0; /* the general path reports a bad filter */
    int64_t n;
    int rc = collect(st, call->db, coll, &filter, NULL, 1, skip, limit, NULL, &n);
    if (rc) {
        store_error(st, reply, rc);
        return -1;
    }
    d->n = n;
    rc = !strcmp(bson_iter_key(&last), "$count") ? stage_count(d, &last, reply)
                                                 : stage_group(d, &last, reply);
    return rc ? -1 : 1;
}

static void cmd_aggregate(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                          bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_iter_t stages;
    bson_t opts;
    int64_t batch;
    if (!coll || arg_array(cmd, "pipeline", &stages, reply) ||
        arg_doc(cmd, "cursor", &opts, reply) < 0 ||
        batch_size(&opts, MT_DEFAULT_BATCH, &batch, reply))
        return;
    mt_docs_t docs = {0};
    bool loaded = false;
    int counted = count_pipeline(st, call, coll, stages, &docs, reply);
    if (counted < 0) {
        docs_free(&docs);
        return;
    }
    loaded = counted > 0;
    while (!counted && bson_iter_next(&stages)) {
        bson_iter_t stage;
        if (!BSON_ITER_HOLDS_DOCUMENT(&stages) || !bson_iter_recurse(&stages, &stage) ||
            !bson_iter_next(&stage)) {
            err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch",
                      "each pipeline stage must be a"
                      " document with one field");
            docs_free(&docs);
            return;
        }
        if (run_stage(st, call, coll, &docs, &loaded, &stage, reply)) {
            docs_free(&docs);
            return;
        }
    }
    if (!loaded) {
        bson_t all;
        bson_init_static(&all, empty_doc, sizeof empty_doc);
        int rc = collect(st, call->db, coll, &all, NULL, 1, 0, 0, &docs, NULL);
        if (rc) {
            docs_free(&docs);
            store_error(st, reply, rc);
            return;
        }
    }
    char ns[MT_NS_MAX];
    snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
    cursor_reply(st, reply, ns, &docs, batch, false);
}

/* Runs one delete statement {q, limit} inside the command's transaction. */
static int delete_one(mt_state_t *st, mt_coll_t *c, const bson_iter_t *stmt, int64_t *n, int *code,
                      char *msg, size_t msglen)
{
    bson_iter_t it;
    bson_t s, q;
    uint32_t len;
    const uint8_t *data;
    *code = E_FAILED_TO_PARSE;
    if (!BSON_ITER_HOLDS_DOCUMENT(stmt)) {
        snprintf(msg, msglen, "delete statement must be a document");
        return 0;
    }
    bson_iter_document(stmt, &len, &data);
    bson_init_static(&s, data, len);
    if (!bson_iter_init_find(&it, &s, "q") || !BSON_ITER_HOLDS_DOCUMENT(&it)) {
        snprintf(msg, msglen, "delete statement needs a document 'q'");
        return 0;
    }
    bson_iter_document(&it, &len, &data);
    bson_init_static(&q, data, len);
    int64_t limit = -1;
    if (bson_iter_init_find(&it, &s, "limit") && !mt_iter_int64(&it, &limit))
        limit = -1;
    if (limit != 0 && limit != 1) {
        snprintf(msg, msglen, "the limit field in delete objects must be 0 or 1");
        return 0;
    }
    if (mt_filter_check(&q, msg, msglen)) {
        *code = E_BAD_VALUE;
        return 0;
    }
    *code = 0;
    if (!c)
        return 0;
    query_t qr = {.filter = &q, .limit = limit, .collect_seqs = true};
    int rc = query_run(st, c, &qr, false);
    for (int64_t i = 0; !rc && i < qr.count; i++)
        rc = mt_store_delete(st->store, c, qr.seqs[i]);
    free(qr.seqs);
    if (!rc)
        *n += qr.count;
    return rc;
}

static void cmd_delete(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                       bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_iter_t stmts;
    if (!coll || arg_array(cmd, "deletes", &stmts, reply))
        return;
    bool ordered = arg_bool(cmd, "ordered", true);
    mt_coll_t *c = NULL;
    bson_t errs = BSON_INITIALIZER;
    uint32_t nerr = 0, index = 0;
    int64_t n = 0;
    int rc = mt_store_begin(st->store);
    if (!rc) {
        rc = mt_store_coll(st->store, call->db, coll, false, &c);
        if (rc == RT_ENOTFOUND)
            rc = 0;
    }
    for (; !rc && bson_iter_next(&stmts); index++) {
        int code;
        char msg[256];
        rc = delete_one(st, c, &stmts, &n, &code, msg, sizeof msg);
        if (!rc && code) {
            write_error(&errs, &nerr, index, code, msg);
            if (ordered)
                break;
        }
    }
    if (!rc)
        rc = mt_store_commit(st->store);
    if (rc) {
        mt_store_rollback(st->store);
        store_error(st, reply, rc);
    } else {
        st->deleted += n;
        write_reply(reply, n, &errs, nerr);
    }
    bson_destroy(&errs);
}

/* Drops db.coll if it exists: 0 (with *existed), or a store failure. */
static int drop_one(mt_state_t *st, const char *db, const char *coll, bool *existed)
{
    mt_coll_t *c;
    int rc = mt_store_begin(st->store);
    if (!rc)
        rc = mt_store_coll(st->store, db, coll, false, &c);
    *existed = rc == 0;
    if (!rc)
        rc = mt_store_drop(st->store, c);
    if (rc == RT_ENOTFOUND)
        rc = 0;
    if (!rc)
        return mt_store_commit(st->store);
    mt_store_rollback(st->store);
    return rc;
}

/*
** Dropping a missing collection succeeds, as on MongoDB 7.0 (5.0 answered
** "ns not found"), so a sink test may drop unconditionally before it starts.
*/
static void cmd_drop(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                     bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bool existed;
    if (!coll)
        return;
    int rc = drop_one(st, call->db, coll, &existed);
    if (rc) {
        store_error(st, reply, rc);
        return;
    }
    if (existed) {
        char ns[MT_NS_MAX];
        snprintf(ns, sizeof ns, "%s.%s", call->db, coll);
        BSON_APPEND_INT32(reply, "nIndexesWas", 1);
        BSON_APPEND_UTF8(reply, "ns", ns);
    }
    ok_reply(reply);
}

static int add_name(void *ctx, const char *name)
{
    bson_t *arr = ctx;
    char buf[16];
    const char *key;
    bson_uint32_to_string(bson_count_keys(arr), &key, buf, sizeof buf);
    return BSON_APPEND_UTF8(arr, key, name) ? 0 : RT_ENOMEM;
}

static void cmd_dropdatabase(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                             bson_t *reply)
{
    bson_t names = BSON_INITIALIZER;
    bson_iter_t it;
    bool existed;
    int rc = mt_store_names(st->store, call->db, add_name, &names);
    bson_iter_init(&it, &names);
    while (!rc && bson_iter_next(&it))
        rc = drop_one(st, call->db, bson_iter_utf8(&it, NULL), &existed);
    bson_destroy(&names);
    if (rc) {
        store_error(st, reply, rc);
        return;
    }
    BSON_APPEND_UTF8(reply, "dropped", call->db);
    ok_reply(reply);
}

/* Creates db.coll if missing: 0 with *created, or a store failure. */
static int create_one(mt_state_t *st, const char *db, const char *coll, bool *created)
{
    mt_coll_t *c;
    int rc = mt_store_coll(st->store, db, coll, false, &c);
    *created = false;
    if (rc != RT_ENOTFOUND)
        return rc;
    rc = mt_store_begin(st->store);
    if (!rc)
        rc = mt_store_coll(st->store, db, coll, true, &c);
    if (!rc)
        rc = mt_store_commit(st->store);
    if (rc)
        mt_store_rollback(st->store);
    *created = rc == 0;
    return rc;
}

static void cmd_create(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                       bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bool created;
    if (!coll)
        return;
    int rc = create_one(st, call->db, coll, &created);
    if (rc)
        store_error(st, reply, rc);
    else if (!created)
        err_reply(reply, E_NAMESPACE_EXISTS, "NamespaceExists",
                  "Collection already exists. NS: %s.%s", call->db, coll);
    else
        ok_reply(reply);
}

/*
** Secondary indexes change no query result here (every query scans), so they
** are accepted without being built; a unique one would change results and is refused.
*/
static void cmd_createindexes(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                              bson_t *reply)
{
    const char *coll = coll_name(cmd, reply);
    bson_iter_t idx, it;
    bool created;
    if (!coll || arg_array(cmd, "indexes", &idx, reply))
        return;
    while (bson_iter_next(&idx)) {
        uint32_t len;
        const uint8_t *data;
        bson_t spec;
        if (!BSON_ITER_HOLDS_DOCUMENT(&idx)) {
            err_reply(reply, E_TYPE_MISMATCH, "TypeMismatch", "each index must be a document");
            return;
        }
        bson_iter_document(&idx, &len, &data);
        bson_init_static(&spec, data, len);
        if (!bson_iter_init_find(&it, &spec, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it)) {
            err_reply(reply, E_FAILED_TO_PARSE, "FailedToParse", "an index needs a 'key'");
            return;
        }
        if (bson_iter_init_find(&it, &spec, "unique") && bson_iter_as_bool(&it)) {
            err_reply(reply, E_NOT_SUPPORTED, "CommandNotSupported",
                      "rt_mongo_test has no unique indexes besides _id");
            return;
        }
    }
    int rc = create_one(st, call->db, coll, &created);
    if (rc) {
        store_error(st, reply, rc);
        return;
    }
    BSON_APPEND_BOOL(reply, "createdCollectionAutomatically", created);
    BSON_APPEND_INT32(reply, "numIndexesBefore", 1);
    BSON_APPEND_INT32(reply, "numIndexesAfter", 1);
    BSON_APPEND_UTF8(reply, "note", "rt_mongo_test builds no secondary indexes; queries scan");
    ok_reply(reply);
}

typedef struct list_ctx {
    const bson_t *filter;
    bool name_only;
    bool databases;
    mt_docs_t *out;
} list_ctx_t;

static int list_one(void *ctx, const char *name)
{
    list_ctx_t *l = ctx;
    bson_t doc = BSON_INITIALIZER, sub, key;
    BSON_APPEND_UTF8(&doc, "name", name);
    if (l->databases) {
        BSON_APPEND_INT64(&doc, "sizeOnDisk", 0);
        BSON_APPEND_BOOL(&doc, "empty", false);
    } else {
        BSON_APPEND_UTF8(&doc, "type", "collection");
    }
    if (!l->databases && !l->name_only) {
        BSON_APPEND_DOCUMENT_BEGIN(&doc, "options", &sub);
        bson_append_document_end(&doc, &sub);
        BSON_APPEND_DOCUMENT_BEGIN(&doc, "info", &sub);
        BSON_APPEND_BOOL(&sub, "readOnly", false);
        bson_append_document_end(&doc, &sub);
        BSON_APPEND_DOCUMENT_BEGIN(&doc, "idIndex", &sub);
        BSON_APPEND_INT32(&sub, "v", 2);
        BSON_APPEND_DOCUMENT_BEGIN(&sub, "key", &key);
        BSON_APPEND_INT32(&key, "_id", 1);
        bson_append_document_end(&sub, &key);
        BSON_APPEND_UTF8(&sub, "name", "_id_");
        bson_append_document_end(&doc, &sub);
    }
    int rc = 0;
    if (mt_filter_match(l->filter, &doc))
        rc = docs_add(l->out, bson_get_data(&doc), doc.len);
    bson_destroy(&doc);
    return rc;
}

static void cmd_list(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                     bson_t *reply)
{
    bson_t filter, opts;
    int64_t batch;
    char err[256];
    mt_docs_t docs = {0};
    bool databases = !strcmp(name, "listDatabases");
    if (arg_doc(cmd, "filter", &filter, reply) < 0 || arg_doc(cmd, "cursor", &opts, reply) < 0 ||
        batch_size(&opts, MT_DEFAULT_BATCH, &batch, reply))
        return;
    if (mt_filter_check(&filter, err, sizeof err)) {
        err_reply(reply, E_BAD_VALUE, "BadValue", "%s", err);
        return;
    }
    list_ctx_t l = {&filter, arg_bool(cmd, "nameOnly", false), databases, &docs};
    int rc = mt_store_names(st->store, databases ? NULL : call->db, list_one, &l);
    if (rc) {
        docs_free(&docs);
        store_error(st, reply, rc);
        return;
    }
    if (!databases) {
        char ns[MT_NS_MAX];
        snprintf(ns, sizeof ns, "%s.$cmd.listCollections", call->db);
        cursor_reply(st, reply, ns, &docs, batch, false);
        return;
    }
    append_batch(reply, "databases", &docs, -1);
    BSON_APPEND_INT64(reply, "totalSize", 0);
    docs_free(&docs);
    ok_reply(reply);
}

/* Fault injection for the sink's outage tests; see README.md for the contract. */
static void cmd_rtfault(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                        bson_t *reply)
{
    bson_iter_t it;
    int64_t n, code, ms;
    bson_iter_init(&it, cmd);
    bson_iter_next(&it);
    const char *fault = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    call->control = true;
    if (!strcmp(fault, "failWrites")) {
        int has_n = arg_int(cmd, "n", 0, &n, reply);
        if (has_n < 0 || arg_int(cmd, "code", MT_FAIL_WRITES_CODE, &code, reply) < 0)
            return;
        if (!has_n || n < 0 || code <= 0 || code > INT32_MAX) {
            err_reply(reply, E_BAD_VALUE, "BadValue",
                      "failWrites needs n >= 0 (and an optional positive code)");
            return;
        }
        st->fail_writes = n;
        st->fail_code = (int32_t)code;
    } else if (!strcmp(fault, "stall") || !strcmp(fault, "refuse")) {
        bool stall = fault[0] == 's';
        int has_ms = arg_int(cmd, "ms", 0, &ms, reply);
        if (has_ms < 0)
            return;
        if (!has_ms || ms < (stall ? 0 : 1) || ms > MT_FAULT_MS_MAX) {
            err_reply(reply, E_BAD_VALUE, "BadValue", "%s needs ms in [%d, %d]", fault,
                      stall ? 0 : 1, MT_FAULT_MS_MAX);
            return;
        }
        if (stall) {
            st->stall_ms = ms;
        } else {
            st->refuse_until = mt_now_ms() + ms;
            call->refuse = true;
        }
    } else if (!strcmp(fault, "clear")) {
        st->fail_writes = 0;
        st->stall_ms = 0;
        st->refuse_until = 0;
    } else {
        err_reply(reply, E_BAD_VALUE, "BadValue",
                  "unknown rtFault '%s' (failWrites, stall, refuse or clear)", fault);
        return;
    }
    BSON_APPEND_UTF8(reply, "fault", fault);
    ok_reply(reply);
}

static void cmd_rtstats(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                        bson_t *reply)
{
    int64_t now = mt_now_ms();
    BSON_APPEND_INT64(reply, "connections", st->conns_current);
    BSON_APPEND_INT64(reply, "connectionsTotal", st->conns_total);
    BSON_APPEND_INT64(reply, "connectionsRefused", st->conns_refused);
    BSON_APPEND_INT64(reply, "commands", st->commands);
    BSON_APPEND_INT64(reply, "inserted", st->inserted);
    BSON_APPEND_INT64(reply, "deleted", st->deleted);
    BSON_APPEND_INT64(reply, "writesFailed", st->writes_failed);
    BSON_APPEND_INT64(reply, "protocolErrors", st->protocol_errors);
    BSON_APPEND_INT64(reply, "cursorsOpen", st->ncursors);
    BSON_APPEND_INT64(reply, "failWritesLeft", st->fail_writes);
    BSON_APPEND_INT64(reply, "stallMs", st->stall_ms);
    BSON_APPEND_INT64(reply, "refuseMsLeft", st->refuse_until > now ? st->refuse_until - now : 0);
    ok_reply(reply);
}

typedef void (*cmd_fn)(mt_state_t *st, mt_call_t *call, const bson_t *cmd, const char *name,
                       bson_t *reply);

static const struct {
    const char *name;
    cmd_fn fn;
} commands[] = {
    {"hello", cmd_hello},
    {"isMaster", cmd_hello},
    {"ismaster", cmd_hello},
    {"ping", cmd_ping},
    {"endSessions", cmd_ping},
    {"buildInfo", cmd_buildinfo},
    {"buildinfo", cmd_buildinfo},
    {"insert", cmd_insert},
    {"find", cmd_find},
    {"getMore", cmd_getmore},
    {"killCursors", cmd_killcursors},
    {"count", cmd_count},
    {"aggregate", cmd_aggregate},
    {"delete", cmd_delete},
    {"drop", cmd_drop},
    {"dropDatabase", cmd_dropdatabase},
    {"create", cmd_create},
    {"createIndexes", cmd_createindexes},
    {"listCollections", cmd_list},
    {"listDatabases", cmd_list},
    {"rtFault", cmd_rtfault},
    {"rtStats", cmd_rtstats},
};

void mt_cmd_run(mt_state_t *st, mt_call_t *call, const bson_t *cmd, bson_t *reply)
{
    bson_iter_t it;
    const char *name = bson_iter_init(&it, cmd) && bson_iter_next(&it) ? bson_iter_key(&it) : "";
    st->commands++;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name))
            continue;
        if (!call->db[0]) {
            err_reply(reply, E_INVALID_NAMESPACE, "InvalidNamespace",
                      "command '%s' has no valid $db", name);
            return;
        }
        commands[i].fn(st, call, cmd, name, reply);
        return;
    }
    err_reply(reply, E_COMMAND_NOT_FOUND, "CommandNotFound", "no such command: '%s'", name);
}

void mt_state_init(mt_state_t *st, mt_store_t *store)
{
    memset(st, 0, sizeof *st);
    st->store = store;
    st->fail_code = MT_FAIL_WRITES_CODE;
    /* Cursor ids start from the clock so a restarted server does not reuse recent ones. */
    st->next_cursor_id = (wall_ms() & 0x7fffffffll) << 16 | 1;
}

void mt_state_destroy(mt_state_t *st)
{
    while (st->cursors) {
        mt_cursor_t *c = st->cursors;
        st->cursors = c->next;
        cursor_free(c);
    }
    st->ncursors = 0;
}

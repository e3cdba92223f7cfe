#include "mt_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int mt_buf_reserve(mt_buf_t *b, size_t more)
{
    if (b->cap - b->len >= more)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < more)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return RT_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int mt_buf_append(mt_buf_t *b, const void *data, size_t len)
{
    int rc = mt_buf_reserve(b, len);
    if (rc)
        return rc;
    memcpy(b->p + b->len, data, len);
    b->len += len;
    return 0;
}

void mt_buf_compact(mt_buf_t *b)
{
    if (!b->off)
        return;
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
}

void mt_buf_free(mt_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int32_t get32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static void put32(uint8_t *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

void mt_wire_header(const uint8_t *p, mt_header_t *h)
{
    h->len = get32(p);
    h->request_id = get32(p + 4);
    h->response_to = get32(p + 8);
    h->opcode = get32(p + 12);
}

static bool check_doc(const bson_t *doc, int depth);

/*
** libbson's visitor checks element bounds and key encoding but silently skips
** a nested document whose own framing is bad, so nesting is walked here.
*/
static bool visit_before(const bson_iter_t *it, const char *key, void *data)
{
    int depth = *(int *)data;
    const uint8_t *p = NULL;
    uint32_t len = 0;
    bson_t sub;
    if (BSON_ITER_HOLDS_DOCUMENT(it))
        bson_iter_document(it, &len, &p);
    else if (BSON_ITER_HOLDS_ARRAY(it))
        bson_iter_array(it, &len, &p);
    else
        return false;
    return !p || !bson_init_static(&sub, p, len) || !check_doc(&sub, depth + 1);
}

static bool check_doc(const bson_t *doc, int depth)
{
    bson_visitor_t v = {.visit_before = visit_before};
    bson_iter_t it;
    if (depth > MT_BSON_DEPTH || !bson_iter_init(&it, doc))
        return false;
    if (bson_iter_visit_all(&it, &v, &depth))
        return false;
    return it.err_off == 0;
}

bool mt_bson_check(const uint8_t *data, size_t len, bson_t *doc)
{
    if (len < 5 || len > MT_MAX_BSON + 16 * 1024 || (size_t)get32(data) != len)
        return false;
    return bson_init_static(doc, data, len) && check_doc(doc, 0);
}

#define MT_MAX_SEQUENCES 8 /* kind 1 sections per message; the driver sends at most one */

typedef struct seq {
    const char *name;
    const uint8_t *p; /* first document */
    const uint8_t *end;
} seq_t;

static int bad(char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "%s", why);
    return RT_EINVAL;
}

static int merge(mt_request_t *req, const bson_t *body, const seq_t *seqs, int nseq)
{
    bson_init(&req->cmd);
    if (!bson_concat(&req->cmd, body))
        return RT_ENOMEM;
    for (int i = 0; i < nseq; i++) {
        bson_t arr;
        uint32_t n = 0;
        bson_append_array_begin(&req->cmd, seqs[i].name, -1, &arr);
        for (const uint8_t *p = seqs[i].p; p < seqs[i].end; p += get32(p)) {
            char buf[16];
            const char *key;
            bson_t doc;
            bson_init_static(&doc, p, (size_t)get32(p));
            bson_uint32_to_string(n++, &key, buf, sizeof buf);
            bson_append_document(&arr, key, -1, &doc);
        }
        bson_append_array_end(&req->cmd, &arr);
    }
    return 0;
}

static int parse_msg(const uint8_t *msg, const mt_header_t *h, mt_request_t *req, char *err,
                     size_t errlen)
{
    const uint8_t *p = msg + MT_HEADER_LEN, *end = msg + h->len;
    seq_t seqs[MT_MAX_SEQUENCES];
    int nseq = 0;
    bson_t body;
    bool have_body = false;

    if (end - p < 5)
        return bad(err, errlen, "OP_MSG too short");
    uint32_t flags = (uint32_t)get32(p);
    p += 4;
    /* Bits 0-15 are "required": a flag we do not know there must end the exchange. */
    if (flags & 0xfffcu)
        return bad(err, errlen, "OP_MSG has unknown required flag bits");
    if (flags & 1u) {
        if (end - p < 4)
            return bad(err, errlen, "OP_MSG checksum missing");
        end -= 4;
    }
    req->more_to_come = flags & 2u;
    while (p < end) {
        uint8_t kind = *p++;
        if (end - p < 4)
            return bad(err, errlen, "OP_MSG section truncated");
        int32_t len = get32(p);
        if (len < 5 || len > end - p)
            return bad(err, errlen, "OP_MSG section length out of range");
        if (kind == 0) {
            if (have_body)
                return bad(err, errlen, "OP_MSG has two body sections");
            if (!mt_bson_check(p, (size_t)len, &body))
                return bad(err, errlen, "OP_MSG body is not valid BSON");
            have_body = true;
        } else if (kind == 1) {
            const uint8_t *send = p + len;
            const uint8_t *name = p + 4;
            const uint8_t *nul = memchr(name, 0, (size_t)(send - name));
            if (!nul || nul == name)
                return bad(err, errlen, "OP_MSG document sequence has no identifier");
            if (nseq == MT_MAX_SEQUENCES)
                return bad(err, errlen, "OP_MSG has too many document sequences");
            seqs[nseq] = (seq_t){(const char *)name, nul + 1, send};
            for (const uint8_t *d = nul + 1; d < send;) {
                bson_t doc;
                if (send - d < 5 || get32(d) < 5 || get32(d) > send - d ||
                    !mt_bson_check(d, (size_t)get32(d), &doc))
                    return bad(err, errlen, "OP_MSG document sequence holds invalid BSON");
                d += get32(d);
            }
            nseq++;
        } else {
            return bad(err, errlen, "OP_MSG section kind unknown");
        }
        p += len;
    }
    if (!have_body)
        return bad(err, errlen, "OP_MSG has no body section");
    for (int i = 0; i < nseq; i++) {
        bson_iter_t it;
        if (bson_iter_init_find(&it, &body, seqs[i].name))
            return bad(err, errlen, "OP_MSG document sequence repeats a body field");
        for (int j = 0; j < i; j++)
            if (!strcmp(seqs[i].name, seqs[j].name))
                return bad(err, errlen, "OP_MSG repeats a document sequence identifier");
    }
    bson_iter_t it;
    if (bson_iter_init_find(&it, &body, "$db") && BSON_ITER_HOLDS_UTF8(&it)) {
        uint32_t n;
        const char *db = bson_iter_utf8(&it, &n);
        if (n <= MT_DB_NAME_MAX && strlen(db) == n)
            memcpy(req->db, db, n + 1);
    }
    return merge(req, &body, seqs, nseq);
}

static int parse_query(const uint8_t *msg, const mt_header_t *h, mt_request_t *req, char *err,
                       size_t errlen)
{
    const uint8_t *p = msg + MT_HEADER_LEN + 4, *end = msg + h->len;
    if (end - p < 1)
        return bad(err, errlen, "OP_QUERY too short");
    const uint8_t *nul = memchr(p, 0, (size_t)(end - p));
    if (!nul)
        return bad(err, errlen, "OP_QUERY namespace not terminated");
    const char *ns = (const char *)p;
    if (end - (nul + 1) < 8 + 5)
        return bad(err, errlen, "OP_QUERY query document truncated");
    p = nul + 1 + 8; /* past numberToSkip and numberToReturn */
    if (get32(p) < 5 || get32(p) > end - p)
        return bad(err, errlen, "OP_QUERY query document truncated");
    bson_t query;
    if (!mt_bson_check(p, (size_t)get32(p), &query))
        return bad(err, errlen, "OP_QUERY query is not valid BSON");

    const char *dot = strchr(ns, '.');
    size_t dblen = dot ? (size_t)(dot - ns) : strlen(ns);
    if (dblen <= MT_DB_NAME_MAX) {
        memcpy(req->db, ns, dblen);
        req->db[dblen] = 0;
    }
    req->legacy_failure = !dot || strcmp(dot + 1, "$cmd") != 0;

    /* Drivers wrap a command in {$query: cmd, $readPreference: ...} for mongos. */
    bson_iter_t it;
    bson_t inner;
    if (bson_iter_init_find(&it, &query, "$query") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
        uint32_t len;
        const uint8_t *data;
        bson_iter_document(&it, &len, &data);
        bson_init_static(&inner, data, len);
        return merge(req, &inner, NULL, 0);
    }
    return merge(req, &query, NULL, 0);
}

int mt_wire_parse(const uint8_t *msg, const mt_header_t *h, mt_request_t *req, char *err,
                  size_t errlen)
{
    memset(req, 0, sizeof *req);
    bson_init(&req->cmd);
    req->request_id = h->request_id;
    req->opcode = h->opcode;
    if (h->opcode == MT_OP_MSG)
        return parse_msg(msg, h, req, err, errlen);
    if (h->opcode == MT_OP_QUERY)
        return parse_query(msg, h, req, err, errlen);
    snprintf(err, errlen, "unsupported opcode %d", h->opcode);
    return RT_EINVAL;
}

void mt_request_destroy(mt_request_t *req)
{
    bson_destroy(&req->cmd);
}

int mt_wire_reply(mt_buf_t *out, const mt_request_t *req, int32_t request_id, const bson_t *doc)
{
    bool msg = req->opcode == MT_OP_MSG;
    size_t fixed = MT_HEADER_LEN + (msg ? 5 : 20);
    size_t total = fixed + doc->len;
    if (total > INT32_MAX)
        return RT_EINVAL;
    int rc = mt_buf_reserve(out, total);
    if (rc)
        return rc;
    uint8_t *p = out->p + out->len;
    put32(p, (int32_t)total);
    put32(p + 4, request_id);
    put32(p + 8, req->request_id);
    put32(p + 12, msg ? MT_OP_MSG : MT_OP_REPLY);
    if (msg) {
        put32(p + 16, 0); /* flagBits */
        p[20] = 0;        /* section kind 0: body */
    } else {
        /* AwaitCapable (8), as servers set it, plus QueryFailure (2) for a non-command. */
        put32(p + 16, req->legacy_failure ? 10 : 8);
        memset(p + 20, 0, 12); /* cursorID, startingFrom */
        put32(p + 32, 1);      /* numberReturned */
    }
    memcpy(p + fixed, bson_get_data(doc), doc->len);
    out->len += total;
    return 0;
}

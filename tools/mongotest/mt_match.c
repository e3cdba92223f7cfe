/*
** Matching and ordering follow the MongoDB manual ("Comparison/Sort Order",
** "Query on Arrays") closely enough for the sink's tests: comparisons only
** hold within one type class ("type bracketing"), an array field matches when
** any element does, and {f: null} also matches a missing f.
*/
#include "mt_match.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

/* The rank of a BSON type in MongoDB's cross-type order; equal ranks compare by value. */
static int type_class(bson_type_t t)
{
    switch (t) {
    case BSON_TYPE_MINKEY:
        return 1;
    case BSON_TYPE_UNDEFINED:
    case BSON_TYPE_NULL:
        return 2;
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_DECIMAL128:
        return 3;
    case BSON_TYPE_SYMBOL:
    case BSON_TYPE_UTF8:
        return 4;
    case BSON_TYPE_DOCUMENT:
        return 5;
    case BSON_TYPE_ARRAY:
        return 6;
    case BSON_TYPE_BINARY:
        return 7;
    case BSON_TYPE_OID:
        return 8;
    case BSON_TYPE_BOOL:
        return 9;
    case BSON_TYPE_DATE_TIME:
        return 10;
    case BSON_TYPE_TIMESTAMP:
        return 11;
    case BSON_TYPE_REGEX:
        return 12;
    case BSON_TYPE_DBPOINTER:
        return 13;
    case BSON_TYPE_CODE:
        return 14;
    case BSON_TYPE_CODEWSCOPE:
        return 15;
    case BSON_TYPE_MAXKEY:
        return 100;
    default:
        return 50;
    }
}

static bool is_intlike(bson_type_t t)
{
    return t == BSON_TYPE_INT32 || t == BSON_TYPE_INT64;
}

/* A number as long double: its 64-bit mantissa holds every int64 and double exactly. */
static long double num_value(const bson_iter_t *it)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
        return bson_iter_int32(it);
    case BSON_TYPE_INT64:
        return bson_iter_int64(it);
    case BSON_TYPE_DOUBLE:
        return bson_iter_double(it);
    case BSON_TYPE_DECIMAL128: {
        bson_decimal128_t d;
        char s[BSON_DECIMAL128_STRING];
        bson_iter_decimal128(it, &d);
        bson_decimal128_to_string(&d, s);
        return strtold(s, NULL);
    }
    default:
        return 0;
    }
}

static int num_cmp(const bson_iter_t *a, const bson_iter_t *b)
{
    if (is_intlike(bson_iter_type(a)) && is_intlike(bson_iter_type(b))) {
        int64_t x = bson_iter_as_int64(a), y = bson_iter_as_int64(b);
        return (x > y) - (x < y);
    }
    long double x = num_value(a), y = num_value(b);
    /* MongoDB sorts NaN below every other number and equal to itself. */
    if (isnan(x) || isnan(y))
        return isnan(y) - isnan(x);
    return (x > y) - (x < y);
}

static int bytes_cmp(const void *a, size_t la, const void *b, size_t lb)
{
    int c = memcmp(a, b, la < lb ? la : lb);
    if (c)
        return c;
    return (la > lb) - (la < lb);
}

/* Documents and arrays compare element by element: type rank, then name, then value. */
static int doc_cmp(const bson_iter_t *a, const bson_iter_t *b)
{
    bson_iter_t ca, cb;
    if (!bson_iter_recurse(a, &ca) || !bson_iter_recurse(b, &cb))
        return 0;
    for (;;) {
        bool ha = bson_iter_next(&ca), hb = bson_iter_next(&cb);
        if (!ha || !hb)
            return (int)ha - (int)hb;
        int c = type_class(bson_iter_type(&ca)) - type_class(bson_iter_type(&cb));
        if (c)
            return c;
        c = strcmp(bson_iter_key(&ca), bson_iter_key(&cb));
        if (c)
            return c;
        c = mt_value_cmp(&ca, &cb);
        if (c)
            return c;
    }
}

bool mt_iter_int64(const bson_iter_t *it, int64_t *out)
{
    if (BSON_ITER_HOLDS_INT32(it) || BSON_ITER_HOLDS_INT64(it)) {
        *out = bson_iter_as_int64(it);
        return true;
    }
    if (!BSON_ITER_HOLDS_DOUBLE(it))
        return false;
    double d = bson_iter_double(it);
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
        return false;
    *out = (int64_t)d;
    return true;
}

int mt_value_cmp(const bson_iter_t *a, const bson_iter_t *b)
{
    bson_type_t ta = bson_iter_type(a), tb = bson_iter_type(b);
    int c = type_class(ta) - type_class(tb);
    if (c)
        return c;
    switch (ta) {
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_DECIMAL128:
        return num_cmp(a, b);
    case BSON_TYPE_UTF8:
    case BSON_TYPE_SYMBOL: {
        uint32_t la = 0, lb = 0;
        const char *sa = ta == BSON_TYPE_UTF8 ? bson_iter_utf8(a, &la) : bson_iter_symbol(a, &la);
        const char *sb = tb == BSON_TYPE_UTF8 ? bson_iter_utf8(b, &lb) : bson_iter_symbol(b, &lb);
        return bytes_cmp(sa, la, sb, lb);
    }
    case BSON_TYPE_DOCUMENT:
    case BSON_TYPE_ARRAY:
        return doc_cmp(a, b);
    case BSON_TYPE_BINARY: {
        bson_subtype_t sa, sb;
        uint32_t la, lb;
        const uint8_t *da, *db;
        bson_iter_binary(a, &sa, &la, &da);
        bson_iter_binary(b, &sb, &lb, &db);
        if (la != lb)
            return la < lb ? -1 : 1;
        if (sa != sb)
            return sa < sb ? -1 : 1;
        return la ? memcmp(da, db, la) : 0;
    }
    case BSON_TYPE_OID:
        return bson_oid_compare(bson_iter_oid(a), bson_iter_oid(b));
    case BSON_TYPE_BOOL:
        return (int)bson_iter_bool(a) - (int)bson_iter_bool(b);
    case BSON_TYPE_DATE_TIME: {
        int64_t x = bson_iter_date_time(a), y = bson_iter_date_time(b);
        return (x > y) - (x < y);
    }
    case BSON_TYPE_TIMESTAMP: {
        uint32_t ta1, ia1, tb1, ib1;
        bson_iter_timestamp(a, &ta1, &ia1);
        bson_iter_timestamp(b, &tb1, &ib1);
        uint64_t x = (uint64_t)ta1 << 32 | ia1, y = (uint64_t)tb1 << 32 | ib1;
        return (x > y) - (x < y);
    }
    case BSON_TYPE_REGEX: {
        const char *oa, *ob;
        const char *ra = bson_iter_regex(a, &oa), *rb = bson_iter_regex(b, &ob);
        c = strcmp(ra, rb);
        return c ? c : strcmp(oa, ob);
    }
    case BSON_TYPE_MINKEY:
    case BSON_TYPE_MAXKEY:
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        return 0;
    default: {
        /* Rare types (code, dbpointer): their encodings compare as bytes. */
        bson_value_t va, vb;
        bson_t da = BSON_INITIALIZER, db = BSON_INITIALIZER;
        bson_value_copy(bson_iter_value((bson_iter_t *)a), &va);
        bson_value_copy(bson_iter_value((bson_iter_t *)b), &vb);
        bson_append_value(&da, "", 0, &va);
        bson_append_value(&db, "", 0, &vb);
        c = bytes_cmp(bson_get_data(&da), da.len, bson_get_data(&db), db.len);
        bson_value_destroy(&va);
        bson_value_destroy(&vb);
        bson_destroy(&da);
        bson_destroy(&db);
        return c;
    }
    }
}

/* Operators a field condition may use, in the order mt_filter_match tests them. */
static const char *const field_ops[] = {"$eq",  "$ne", "$gt",  "$gte",    "$lt",
                                        "$lte", "$in", "$nin", "$exists", NULL};

static bool is_field_op(const char *key)
{
    for (int i = 0; field_ops[i]; i++)
        if (!strcmp(key, field_ops[i]))
            return true;
    return false;
}

/* A condition document is {$op: v, ...}; anything else is a value to compare for equality. */
static bool is_condition(const bson_iter_t *it)
{
    bson_iter_t c;
    return BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &c) && bson_iter_next(&c) &&
           bson_iter_key(&c)[0] == '$';
}

static int check_filter(const bson_t *filter, int depth, char *err, size_t errlen);

static int check_logical(const bson_iter_t *it, int depth, char *err, size_t errlen)
{
    bson_iter_t arr;
    int n = 0;
    if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &arr)) {
        snprintf(err, errlen, "%s must be an array", bson_iter_key(it));
        return RT_EINVAL;
    }
    while (bson_iter_next(&arr)) {
        uint32_t len;
        const uint8_t *data;
        bson_t sub;
        if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) {
            snprintf(err, errlen, "%s argument's entries must be objects", bson_iter_key(it));
            return RT_EINVAL;
        }
        bson_iter_document(&arr, &len, &data);
        if (!bson_init_static(&sub, data, len))
            return RT_EINVAL;
        int rc = check_filter(&sub, depth + 1, err, errlen);
        if (rc)
            return rc;
        n++;
    }
    if (!n) {
        snprintf(err, errlen, "%s argument must be a non-empty array", bson_iter_key(it));
        return RT_EINVAL;
    }
    return 0;
}

static int check_value(const bson_iter_t *it, const char *field, char *err, size_t errlen)
{
    if (BSON_ITER_HOLDS_REGEX(it)) {
        snprintf(err, errlen, "rt_mongo_test does not support regular expressions (field '%s')",
                 field);
        return RT_EINVAL;
    }
    return 0;
}

static int check_condition(const bson_iter_t *cond, const char *field, char *err, size_t errlen)
{
    bson_iter_t op;
    bson_iter_recurse(cond, &op);
    while (bson_iter_next(&op)) {
        const char *name = bson_iter_key(&op);
        if (!is_field_op(name)) {
            snprintf(err, errlen, "unknown operator: %s", name);
            return RT_EINVAL;
        }
        if (!strcmp(name, "$in") || !strcmp(name, "$nin")) {
            bson_iter_t arr;
            if (!BSON_ITER_HOLDS_ARRAY(&op)) {
                snprintf(err, errlen, "%s needs an array", name);
                return RT_EINVAL;
            }
            bson_iter_recurse(&op, &arr);
            while (bson_iter_next(&arr))
                if (check_value(&arr, field, err, errlen))
                    return RT_EINVAL;
        } else if (check_value(&op, field, err, errlen)) {
            return RT_EINVAL;
        }
    }
    return 0;
}

/* Nesting of $and/$or/$nor beyond this is refused, which bounds the matcher's recursion. */
#define MT_FILTER_DEPTH 32

static int check_filter(const bson_t *filter, int depth, char *err, size_t errlen)
{
    bson_iter_t it;
    if (depth > MT_FILTER_DEPTH) {
        snprintf(err, errlen, "filter nested deeper than %d", MT_FILTER_DEPTH);
        return RT_EINVAL;
    }
    if (!bson_iter_init(&it, filter)) {
        snprintf(err, errlen, "filter is not a valid document");
        return RT_EINVAL;
    }
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        int rc;
        if (!strcmp(key, "$and") || !strcmp(key, "$or") || !strcmp(key, "$nor"))
            rc = check_logical(&it, depth, err, errlen);
        else if (key[0] == '$') {
            snprintf(err, errlen, "unknown top level operator: %s", key);
            rc = RT_EINVAL;
        } else if (is_condition(&it))
            rc = check_condition(&it, key, err, errlen);
        else
            rc = check_value(&it, key, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int mt_filter_check(const bson_t *filter, char *err, size_t errlen)
{
    return check_filter(filter, 0, err, errlen);
}

/* Equality as {field: v} means it: the value itself, or for an array any of its elements. */
static bool eq_match(bool found, const bson_iter_t *field, const bson_iter_t *v)
{
    if (!found)
        return BSON_ITER_HOLDS_NULL(v);
    if (mt_value_cmp(field, v) == 0)
        return true;
    if (BSON_ITER_HOLDS_ARRAY(field)) {
        bson_iter_t el;
        bson_iter_recurse(field, &el);
        while (bson_iter_next(&el))
            if (mt_value_cmp(&el, v) == 0)
                return true;
    }
    return false;
}

/* op is one of $gt $gte $lt $lte; only values of the same type class compare. */
static bool range_one(const char *op, const bson_iter_t *field, const bson_iter_t *v)
{
    if (type_class(bson_iter_type(field)) != type_class(bson_iter_type(v)))
        return false;
    int c = mt_value_cmp(field, v);
    if (op[1] == 'g')
        return op[3] == 'e' ? c >= 0 : c > 0;
    return op[3] == 'e' ? c <= 0 : c < 0;
}

static bool range_match(const char *op, bool found, const bson_iter_t *field, const bson_iter_t *v)
{
    if (!found)
        return false;
    if (range_one(op, field, v))
        return true;
    if (BSON_ITER_HOLDS_ARRAY(field)) {
        bson_iter_t el;
        bson_iter_recurse(field, &el);
        while (bson_iter_next(&el))
            if (range_one(op, &el, v))
                return true;
    }
    return false;
}

static bool in_match(bool found, const bson_iter_t *field, const bson_iter_t *arr)
{
    bson_iter_t el;
    bson_iter_recurse(arr, &el);
    while (bson_iter_next(&el))
        if (eq_match(found, field, &el))
            return true;
    return false;
}

static bool op_match(const char *op, bool found, const bson_iter_t *field, const bson_iter_t *v)
{
    if (!strcmp(op, "$eq"))
        return eq_match(found, field, v);
    if (!strcmp(op, "$ne"))
        return !eq_match(found, field, v);
    if (!strcmp(op, "$in"))
        return in_match(found, field, v);
    if (!strcmp(op, "$nin"))
        return !in_match(found, field, v);
    if (!strcmp(op, "$exists"))
        return found == bson_iter_as_bool(v);
    return range_match(op, found, field, v);
}

static bool filter_match(const bson_t *filter, const bson_t *doc);

static bool logical_match(const bson_iter_t *it, const bson_t *doc)
{
    const char *op = bson_iter_key(it);
    bool any = false, all = true;
    bson_iter_t arr;
    bson_iter_recurse(it, &arr);
    while (bson_iter_next(&arr)) {
        uint32_t len;
        const uint8_t *data;
        bson_t sub;
        bson_iter_document(&arr, &len, &data);
        bool m = bson_init_static(&sub, data, len) && filter_match(&sub, doc);
        any |= m;
        all &= m;
    }
    if (!strcmp(op, "$and"))
        return all;
    if (!strcmp(op, "$or"))
        return any;
    return !any;
}

static bool filter_match(const bson_t *filter, const bson_t *doc)
{
    bson_iter_t it;
    if (!bson_iter_init(&it, filter))
        return false;
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        if (key[0] == '$') {
            if (!logical_match(&it, doc))
                return false;
            continue;
        }
        bson_iter_t d, field;
        bool found = bson_iter_init(&d, doc) && bson_iter_find_descendant(&d, key, &field);
        if (!is_condition(&it)) {
            if (!eq_match(found, &field, &it))
                return false;
            continue;
        }
        bson_iter_t op;
        bson_iter_recurse(&it, &op);
        while (bson_iter_next(&op))
            if (!op_match(bson_iter_key(&op), found, &field, &op))
                return false;
    }
    return true;
}

bool mt_filter_match(const bson_t *filter, const bson_t *doc)
{
    return filter_match(filter, doc);
}

int mt_sort_check(const bson_t *sort, int *natural, char *err, size_t errlen)
{
    bson_iter_t it;
    int n = 0;
    *natural = 1;
    if (!bson_iter_init(&it, sort)) {
        snprintf(err, errlen, "sort is not a valid document");
        return RT_EINVAL;
    }
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        int64_t dir;
        if (!mt_iter_int64(&it, &dir) || (dir != 1 && dir != -1)) {
            snprintf(err, errlen, "sort direction for '%s' must be 1 or -1", key);
            return RT_EINVAL;
        }
        if (!strcmp(key, "$natural")) {
            if (n) {
                snprintf(err, errlen, "$natural cannot be combined with other sort fields");
                return RT_EINVAL;
            }
            *natural = (int)dir;
            return 0;
        }
        if (key[0] == '$') {
            snprintf(err, errlen, "unsupported sort key: %s", key);
            return RT_EINVAL;
        }
        *natural = 0;
        n++;
    }
    if (!n)
        *natural = 1;
    return 0;
}

int mt_sort_cmp(const bson_t *sort, const bson_t *a, const bson_t *b)
{
    static const uint8_t null_doc[] = {8, 0, 0, 0, BSON_TYPE_NULL, 0, 0, 0};
    bson_t nulls;
    bson_iter_t it;
    bson_init_static(&nulls, null_doc, sizeof null_doc);
    bson_iter_init(&it, sort);
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        bson_iter_t da, db, fa, fb;
        /* A missing field sorts as null, as in MongoDB. */
        if (!bson_iter_init(&da, a) || !bson_iter_find_descendant(&da, key, &fa))
            bson_iter_init_find(&fa, &nulls, "");
        if (!bson_iter_init(&db, b) || !bson_iter_find_descendant(&db, key, &fb))
            bson_iter_init_find(&fb, &nulls, "");
        int c = mt_value_cmp(&fa, &fb);
        if (c)
            return bson_iter_as_int64(&it) < 0 ? -c : c;
    }
    return 0;
}

int mt_projection_check(const bson_t *proj, char *err, size_t errlen)
{
    bson_iter_t it;
    int mode = -1; /* 1 inclusion, 0 exclusion, -1 not yet known */
    if (!bson_iter_init(&it, proj)) {
        snprintf(err, errlen, "projection is not a valid document");
        return RT_EINVAL;
    }
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        if (key[0] == '$' || strchr(key, '.') ||
            (!BSON_ITER_HOLDS_NUMBER(&it) && !BSON_ITER_HOLDS_BOOL(&it))) {
            snprintf(err, errlen,
                     "rt_mongo_test projects only top-level fields with 1 or 0 (field '%s')", key);
            return RT_EINVAL;
        }
        if (!strcmp(key, "_id"))
            continue;
        int incl = bson_iter_as_bool(&it);
        if (mode >= 0 && mode != incl) {
            snprintf(err, errlen, "Cannot do %s on field %s in %s projection",
                     incl ? "inclusion" : "exclusion", key, incl ? "exclusion" : "inclusion");
            return RT_EINVAL;
        }
        mode = incl;
    }
    return 0;
}

void mt_project(const bson_t *proj, const bson_t *doc, bson_t *out)
{
    bson_iter_t it, spec;
    bool inclusive = false, others = false, show_id = true;
    bson_iter_init(&it, proj);
    while (bson_iter_next(&it)) {
        if (!strcmp(bson_iter_key(&it), "_id")) {
            show_id = bson_iter_as_bool(&it);
        } else {
            others = true;
            inclusive = bson_iter_as_bool(&it);
        }
    }
    /* {_id: 1} alone keeps only _id; {_id: 0} alone keeps all the rest. */
    if (!others)
        inclusive = show_id;
    bson_iter_init(&it, doc);
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        bool keep;
        if (!strcmp(key, "_id"))
            keep = show_id;
        else if (bson_iter_init_find(&spec, proj, key))
            keep = bson_iter_as_bool(&spec);
        else
            keep = !inclusive;
        if (keep)
            bson_append_iter(out, key, -1, &it);
    }
}

int mt_id_key(const bson_iter_t *id, uint8_t key[MT_KEY_MAX], size_t *len)
{
    bson_type_t t = bson_iter_type(id);
    if (t == BSON_TYPE_INT32 || t == BSON_TYPE_INT64 || t == BSON_TYPE_DOUBLE) {
        long double v = num_value(id);
        uint64_t bits;
        /* Integral values in int64 range share one form whatever their BSON type. */
        if (t != BSON_TYPE_DOUBLE ||
            (v == floorl(v) && v >= -9223372036854775808.0L && v < 9223372036854775808.0L)) {
            key[0] = 'N';
            bits = (uint64_t)(t == BSON_TYPE_DOUBLE ? (int64_t)v : bson_iter_as_int64(id));
        } else {
            double d = isnan(v) ? NAN : (double)v;
            key[0] = 'D';
            memcpy(&bits, &d, 8);
        }
        for (int i = 0; i < 8; i++)
            key[1 + i] = (uint8_t)(bits >> (56 - 8 * i));
        *len = 9;
        return 0;
    }
    bson_t tmp = BSON_INITIALIZER;
    int rc = RT_EINVAL;
    if (bson_append_iter(&tmp, "", 0, id) && tmp.len + 1 <= MT_KEY_MAX) {
        key[0] = 'T';
        memcpy(key + 1, bson_get_data(&tmp), tmp.len);
        *len = tmp.len + 1;
        rc = 0;
    }
    bson_destroy(&tmp);
    return rc;
}

bool mt_filter_id_key(const bson_t *filter, uint8_t key[MT_KEY_MAX], size_t *len)
{
    bson_iter_t it;
    if (!bson_iter_init(&it, filter) || !bson_iter_next(&it) || strcmp(bson_iter_key(&it), "_id"))
        return false;
    bson_iter_t id = it;
    if (bson_iter_next(&it))
        return false;
    switch (bson_iter_type(&id)) {
    case BSON_TYPE_OID:
    case BSON_TYPE_UTF8:
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DATE_TIME:
    case BSON_TYPE_BINARY:
    case BSON_TYPE_BOOL:
        break;
    case BSON_TYPE_DOUBLE:
        if (isnan(bson_iter_double(&id)))
            return false;
        break;
    default:
        return false;
    }
    return mt_id_key(&id, key, len) == 0;
}

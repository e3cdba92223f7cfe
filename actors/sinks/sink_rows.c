/*
** What the drivers read out of a row: its per-rule options and the text form of a BSON
** value (sink_impl.h has the contracts).
*/
#include <bson/bson.h>
#include <stdio.h>
#include <string.h>

#include "sink_impl.h"

const char *rt__sink_opt_str(const sink_row_t *r, const char *key, uint32_t *len)
{
    bson_t b;
    bson_iter_t it;
    if (!r->opts_len || !bson_init_static(&b, r->opts, r->opts_len))
        return NULL;
    if (!bson_iter_init_find(&it, &b, key) || !BSON_ITER_HOLDS_UTF8(&it))
        return NULL;
    return bson_iter_utf8(&it, len);
}

const char *rt__sink_text(const bson_iter_t *it, uint32_t *len, char **tmp, char *num)
{
    *tmp = NULL;
    int n = -1;
    switch (bson_iter_type(it)) {
    case BSON_TYPE_UTF8:
        return bson_iter_utf8(it, len);
    case BSON_TYPE_SYMBOL:
        return bson_iter_symbol(it, len);
    case BSON_TYPE_CODE:
        return bson_iter_code(it, len);
    case BSON_TYPE_INT32:
        n = snprintf(num, 64, "%d", (int)bson_iter_int32(it));
        break;
    case BSON_TYPE_INT64:
        n = snprintf(num, 64, "%lld", (long long)bson_iter_int64(it));
        break;
    case BSON_TYPE_DATE_TIME:
        n = snprintf(num, 64, "%lld", (long long)bson_iter_date_time(it));
        break;
    case BSON_TYPE_DOUBLE:
        n = snprintf(num, 64, "%.17g", bson_iter_double(it));
        break;
    case BSON_TYPE_BOOL:
        n = snprintf(num, 64, "%s", bson_iter_bool(it) ? "true" : "false");
        break;
    case BSON_TYPE_OID:
        bson_oid_to_string(bson_iter_oid(it), num);
        n = 24;
        break;
    case BSON_TYPE_DECIMAL128: {
        bson_decimal128_t d;
        bson_iter_decimal128(it, &d);
        bson_decimal128_to_string(&d, num);
        n = (int)strlen(num);
        break;
    }
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        *len = 0;
        return "";
    case BSON_TYPE_DOCUMENT:
    case BSON_TYPE_ARRAY: {
        const uint8_t *data;
        uint32_t dl;
        bson_t sub;
        if (BSON_ITER_HOLDS_DOCUMENT(it))
            bson_iter_document(it, &dl, &data);
        else
            bson_iter_array(it, &dl, &data);
        size_t jl = 0;
        if (bson_init_static(&sub, data, dl))
            *tmp = BSON_ITER_HOLDS_DOCUMENT(it) ? bson_as_relaxed_extended_json(&sub, &jl)
                                                : bson_array_as_json(&sub, &jl);
        *len = *tmp ? (uint32_t)jl : 0;
        return *tmp ? *tmp : "";
    }
    default: {
        /* Binary, regex, timestamp and the rest: the value's extended JSON. */
        bson_t one = BSON_INITIALIZER;
        bson_append_iter(&one, "v", 1, it);
        size_t jl = 0;
        *tmp = bson_as_relaxed_extended_json(&one, &jl);
        bson_destroy(&one);
        *len = *tmp ? (uint32_t)jl : 0;
        return *tmp ? *tmp : "";
    }
    }
    *len = n > 0 ? (uint32_t)n : 0;
    return num;
}

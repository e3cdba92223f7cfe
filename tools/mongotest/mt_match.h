/*
** Query semantics of rt_mongo_test: MongoDB's ordering of BSON values, the
** filter language subset the server understands, sort specifications and the
** canonical _id key that makes _id unique in storage.
*/
#ifndef MT_MATCH_H
#define MT_MATCH_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest canonical _id key; an _id whose key would be longer cannot be stored. */
#define MT_KEY_MAX 1024

/*
** Reads an int32, int64 or a double in int64 range (truncated) into *out; false
** for anything else, so no user value reaches an undefined float conversion.
*/
bool mt_iter_int64(const bson_iter_t *it, int64_t *out);

/*
** Compares two values in MongoDB's cross-type order (MinKey < null < numbers <
** strings < objects < arrays < binary < ObjectId < bool < date < timestamp <
** regex < MaxKey); numbers compare by value whatever their BSON type.
** Returns <0, 0 or >0.
*/
int mt_value_cmp(const bson_iter_t *a, const bson_iter_t *b);

/*
** Checks that filter only uses what mt_filter_match implements: top-level
** equality on (dotted) fields, $eq $ne $gt $gte $lt $lte $in $nin $exists, and
** $and $or $nor. Returns 0, or RT_EINVAL with a message for the client in err.
*/
int mt_filter_check(const bson_t *filter, char *err, size_t errlen);

/* True if doc matches a filter that passed mt_filter_check. */
bool mt_filter_match(const bson_t *filter, const bson_t *doc);

/*
** Checks a sort specification ({field: 1 | -1, ...}, or {$natural: 1 | -1}).
** *natural is set to 0 for a field sort, else to the direction of insertion order.
** Returns 0 or RT_EINVAL with a message in err.
*/
int mt_sort_check(const bson_t *sort, int *natural, char *err, size_t errlen);

/* Orders two documents by a field sort that passed mt_sort_check. */
int mt_sort_cmp(const bson_t *sort, const bson_t *a, const bson_t *b);

/*
** Checks a projection: top-level fields only, each 1/true (inclusion) or
** 0/false (exclusion), not mixed except for _id. Returns 0 or RT_EINVAL.
*/
int mt_projection_check(const bson_t *proj, char *err, size_t errlen);

/* Appends the fields of doc that a checked, non-empty projection keeps to out, in order. */
void mt_project(const bson_t *proj, const bson_t *doc, bson_t *out);

/*
** Writes the canonical storage key of an _id value to key: numbers that are
** equal (1, 1.0, int64 1) get the same key, every other type its own BSON
** encoding. Returns 0, or RT_EINVAL if the key would exceed MT_KEY_MAX.
*/
int mt_id_key(const bson_iter_t *id, uint8_t key[MT_KEY_MAX], size_t *len);

/*
** True when filter is exactly {_id: v} for a v whose canonical key finds every
** match (ObjectId, string, number, date, binary, bool); the key is written out.
*/
bool mt_filter_id_key(const bson_t *filter, uint8_t key[MT_KEY_MAX], size_t *len);

#endif

/*
** Answers of the admin socket as a small value tree (objects, arrays,
** numbers, strings), built once per command and rendered either as JSON (for
** scripts) or as aligned text (for people). One tree for both means the text
** and the JSON of a command can never disagree.
**
** Text rendering: an object is "key  value" lines with the keys padded to one
** width; a nested object or array is a "key:" line and its body indented; an
** array of flat objects is a table with a header row; an array of scalars is
** one line of comma-separated values.
**
** A tree's nodes and strings come from an arena of 64 KiB chunks owned by its
** root (an answer about 20,000 actors is 300,000 nodes: one malloc each cost
** more than the rest of the command), freed at once by rt_doc_free(root). An
** allocation failure is remembered in the root, every later add is a no-op,
** and rendering returns RT_ENOMEM.
*/
#ifndef RT_ADMIN_DOC_H
#define RT_ADMIN_DOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"

/* Appends s as a JSON string literal (quotes included); bytes that are not UTF-8 become \uFFFD. */
void rt_buf_json_str(rt_buf_t *b, const char *s, size_t n);

typedef struct rt_doc_s rt_doc_t;

rt_doc_t *rt_doc_object(void);
rt_doc_t *rt_doc_array(void);
void rt_doc_free(rt_doc_t *root); /* the whole tree; only roots are freed */

/*
** Adders: key names the member in an object and is ignored in an array. They
** return the new node for containers (NULL after an allocation failure, which
** the other adders accept as their parent).
*/
rt_doc_t *rt_doc_add_object(rt_doc_t *parent, const char *key);
rt_doc_t *rt_doc_add_array(rt_doc_t *parent, const char *key);
void rt_doc_add_str(rt_doc_t *parent, const char *key, const char *v);
void rt_doc_add_strn(rt_doc_t *parent, const char *key, const char *v, size_t n);
void rt_doc_add_u64(rt_doc_t *parent, const char *key, uint64_t v);
void rt_doc_add_i64(rt_doc_t *parent, const char *key, int64_t v);
/* decimals: digits after the point in both renderings. */
void rt_doc_add_double(rt_doc_t *parent, const char *key, double v, int decimals);
void rt_doc_add_bool(rt_doc_t *parent, const char *key, bool v);
void rt_doc_add_null(rt_doc_t *parent, const char *key);
/*
** Quantities with a unit: JSON gets the number as given (bytes; a duration in the unit its
** key names, _s, _ms or _us), text one style for every command: sizes 1024-based with K, M,
** G, T ("512", "1.5K", "16M"), durations in seconds ("0.002s", "1.5s", "3605s").
*/
void rt_doc_add_bytes(rt_doc_t *parent, const char *key, int64_t bytes);
/* v units of 1/per_second seconds (1: seconds, 1000: ms, 1000000: us). */
void rt_doc_add_duration(rt_doc_t *parent, const char *key, uint64_t v, uint64_t per_second);
/* The text forms, for answers written as text directly (top's screen, status's line). */
void rt_doc_bytes_text(int64_t bytes, char *out, size_t n);
void rt_doc_seconds_text(double seconds, char *out, size_t n);
/* A value that is JSON text already (shown as it is in text mode too). */
void rt_doc_add_json(rt_doc_t *parent, const char *key, const char *json);

/* Render the tree; 0, or RT_ENOMEM if building or rendering ran out of memory. */
int rt_doc_render_json(const rt_doc_t *d, rt_buf_t *out);
int rt_doc_render_text(const rt_doc_t *d, rt_buf_t *out);

#endif

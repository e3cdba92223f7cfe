/*
** rtd's log: one line per event, to stderr or a file, as text or JSON lines.
** Safe from any thread: each line is formatted in a local buffer and written
** with a single write(2) on an O_APPEND descriptor, so lines never interleave.
** The level check is one relaxed load, so disabled debug logging costs nothing.
*/
#ifndef RT_LOG_H
#define RT_LOG_H

#include <stdbool.h>
#include <stdint.h>

typedef enum rt_log_level_e {
    RT_LOG_ERROR = 0,
    RT_LOG_WARNING,
    RT_LOG_INFO,
    RT_LOG_DEBUG,
} rt_log_level_t;

#define RT_LOG_LINE_MAX 2048 /* bytes in one line; longer messages are cut, marked "..." */

/* Opens the log: path NULL means stderr. Returns 0 or a negative RT_E* code. */
int rt_log_open(const char *path, rt_log_level_t level, bool json);
void rt_log_close(void);

void rt_log_set_level(rt_log_level_t level);
rt_log_level_t rt_log_get_level(void);
/* "error", "warning", "info", "debug" -> level; RT_EINVAL otherwise. */
int rt_log_parse_level(const char *name, rt_log_level_t *out);
const char *rt_log_level_name(rt_log_level_t level);

bool rt_log_enabled(rt_log_level_t level);

/* Logs one event: a short name ("client.connected") and a printf-style message. */
void rt_log(rt_log_level_t level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

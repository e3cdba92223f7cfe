/*
** rtd's log: one line per event, as logfmt or JSON lines, to stderr (with the journal's
** priority prefixes when stderr is the journal) or to a file reopened on SIGHUP.
** Safe from any thread: each line is formatted in a local buffer and written with a
** single write(2), so lines never interleave. The level check is one relaxed load, so
** disabled debug logging costs nothing.
**
** A line's fields are ts, level and event, then the call's own, then msg. The format's
** literal text names the keys and the fixed words; its conversions bring the values. The
** format is split at its own spaces (never at those a value brings) into words: a word
** "key=..." whose key is literal text ([a-z][a-z0-9_.]*, not ts, level, event, msg or
** truncated) is a field, its value the rest of the word expanded ("peer=%s:%d" is one
** value); every other word belongs to the message, and the message's words, expanded and
** joined by one space, are the msg field. A value that came from a client (a client id, a
** user name, a topic, a reason) is therefore always one value, and never a key:
**
**   rt_log(RT_LOG_INFO, "client.auth_failed", "user=%s reason=%s", "a b=c", "bad_password");
**   ts=2025-01-02T03:04:05.678Z level=info event=client.auth_failed user="a b=c"
*reason=bad_password
**   {"ts":"2025-01-02T03:04:05.678Z","level":"info","event":"client.auth_failed","user":"a
*b=c",...}
**
** logfmt quotes a value that is empty or holds a space, '=', '"', '\', a control character
** or bytes that are not UTF-8, with JSON's escapes (a quoted value is a JSON string); bytes
** that are not UTF-8 become U+FFFD in both formats. JSON writes a value that is one integer
** or floating conversion alone ("rows=%zu", "ms=%.1f") as a number, any other as a string.
** A value is cut at RT_LOG_VALUE_MAX bytes (ending "..."); a line that would pass
** RT_LOG_LINE_MAX loses its last fields and ends with truncated=true: every line parses.
*/
#ifndef RT_LOG_H
#define RT_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum rt_log_level_e {
    RT_LOG_ERROR = 0,
    RT_LOG_WARNING,
    RT_LOG_INFO,
    RT_LOG_DEBUG,
} rt_log_level_t;

#define RT_LOG_LINE_MAX 4096  /* bytes in one line, its newline included */
#define RT_LOG_VALUE_MAX 1024 /* bytes of one value (and of msg) before escaping */

/*
** Opens the log: path NULL means stderr, else the file (created 0600, appended to), which
** rt_log_reopen opens again. json: JSON lines, else logfmt. Returns 0 or a negative RT_E*
** code (the log is then as it was).
*/
int rt_log_open(const char *path, rt_log_level_t level, bool json);
void rt_log_close(void);
/*
** Opens the log file again by its name, for logrotate's postrotate (SIGHUP): lines written
** meanwhile go to the old file or the new one, whole. 0 (also when logging to stderr), or a
** negative RT_E* code with the old file kept.
*/
int rt_log_reopen(void);

/*
** The journal's priority prefix ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug) on
** lines written to stderr, so journald files each line at its level (journalctl -p err).
*/
void rt_log_set_priority_prefix(bool on);
/*
** Whether stderr is a stream of the journal: systemd sets JOURNAL_STREAM to its
** "device:inode" (systemd.exec(5)); stderr redirected elsewhere no longer matches.
*/
bool rt_log_stderr_is_journal(void);

void rt_log_set_level(rt_log_level_t level);
rt_log_level_t rt_log_get_level(void);
/* "error", "warning", "info", "debug" -> level; RT_EINVAL otherwise. */
int rt_log_parse_level(const char *name, rt_log_level_t *out);
const char *rt_log_level_name(rt_log_level_t level);

bool rt_log_enabled(rt_log_level_t level);

/*
** Logs one event: a short name ("client.connected") and a format as described above. A
** macro, so that a level that is off costs its arguments nothing: a peer's address for a
** debug line was a getpeername per login.
*/
void rt_log_emit(rt_log_level_t level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define rt_log(level, ...) (rt_log_enabled(level) ? rt_log_emit((level), __VA_ARGS__) : (void)0)
/*
** rt_log for wrappers that add a field of their own before their callers' (the peer of a
** transport event): key=value first (key literal; none when key is NULL), then fmt's.
*/
void rt_logv(rt_log_level_t level, const char *event, const char *key, const char *value,
             const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

#endif

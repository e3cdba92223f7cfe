/*
** An API request as an admin request line (http_impl.h): the path's words, the query's
** options, and a JSON body's members, named by the command's usage as `help` shows it:
** "rules test NAME --topic T [--payload P] [--qos Q]" takes {"name": "archive", "topic":
** "t/1", "payload": "42", "qos": 1}. The usage is the schema, so a command's JSON and its
** rtctl form cannot drift apart.
*/
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <bson/bson.h>

#include "admin.h"
#include "http_impl.h"

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes s[0, n) into out (cap bytes); false on a bad escape or overflow. */
static bool decode(const char *s, size_t n, bool plus_space, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            int hi = i + 2 < n ? hex_digit(s[i + 1]) : -1;
            int lo = i + 2 < n ? hex_digit(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return false; /* a NUL would cut the word */
            c = (char)(hi << 4 | lo);
            i += 2;
        } else if (c == '+' && plus_space) {
            c = ' ';
        }
        if (o + 1 >= cap)
            return false;
        out[o++] = c;
    }
    out[o] = 0;
    return true;
}

/* Appends word to line as an admin request word: quoted, with its escapes (docs/ADMIN.md). */
static bool add_word(char *line, size_t *at, const char *word)
{
    size_t n = *at;
    if (n + 4 >= RT_HTTP_LINE_MAX)
        return false;
    if (n)
        line[n++] = ' ';
    line[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)word; *p; p++) {
        if (n + 6 >= RT_HTTP_LINE_MAX)
            return false;
        if (*p == '"' || *p == '\\') {
            line[n++] = '\\';
            line[n++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            n += (size_t)snprintf(line + n, RT_HTTP_LINE_MAX - n, "\\x%02x", *p);
        } else {
            line[n++] = (char)*p;
        }
    }
    line[n++] = '"';
    line[n] = 0;
    *at = n;
    return true;
}

/* Appends text as it is (the admin layer's own words: --json, --). */
static bool add_raw(char *line, size_t *at, const char *text)
{
    size_t n = strlen(text);
    if (*at + n + 1 >= RT_HTTP_LINE_MAX)
        return false;
    memcpy(line + *at, text, n + 1);
    *at += n;
    return true;
}

/* ---- A command's arguments, from its usage ---- */

#define USAGE_ARGS_MAX 16

typedef enum { ARG_STRING, ARG_INT, ARG_SCALAR } arg_kind_t;

typedef struct {
    char name[32]; /* its member's name in a JSON body */
    arg_kind_t kind;
    bool option; /* --name value; else the next positional word */
} usage_arg_t;

typedef struct {
    char words[3][32]; /* the command's own words: "rules", "test"; "xmpp", "user", "add" */
    unsigned nwords;
    usage_arg_t args[USAGE_ARGS_MAX];
    unsigned nargs;
} usage_t;

static bool all_in(const char *s, const char *set)
{
    return *s && s[strspn(s, set)] == 0;
}

/* A placeholder's JSON type: N, Q, W and H count, a setting's VALUE is any scalar. */
static arg_kind_t kind_of(const char *placeholder)
{
    if (strlen(placeholder) == 1 && strchr("NQWH", placeholder[0]))
        return ARG_INT;
    return strcmp(placeholder, "VALUE") == 0 ? ARG_SCALAR : ARG_STRING;
}

static void add_arg(usage_t *u, const char *name, const char *placeholder, bool option)
{
    if (u->nargs == USAGE_ARGS_MAX)
        return;
    usage_arg_t *a = &u->args[u->nargs++];
    snprintf(a->name, sizeof(a->name), "%s", name);
    for (char *p = a->name; *p; p++)
        *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    a->kind = kind_of(placeholder);
    a->option = option;
}

/*
** Reads a usage: the command's words, then its arguments. A positional placeholder names
** its member in lower case (CLIENT_ID: "client_id"); one that lists its values
** ("[error|warning|info|debug]") is named by the command's last word ("level").
*/
static void usage_read(const char *usage, usage_t *u)
{
    memset(u, 0, sizeof(*u));
    bool in_words = true;
    char option[32] = ""; /* an option whose placeholder comes next */
    for (const char *p = usage; *p;) {
        p += strspn(p, " ");
        size_t n = strcspn(p, " ");
        if (!n)
            break;
        bool bracketed = p[0] == '[';
        size_t len = n - bracketed;
        while (len && p[bracketed + len - 1] == ']')
            len--;
        char t[64];
        snprintf(t, sizeof(t), "%.*s", (int)len, p + bracketed);
        p += n;
        if (option[0]) {
            add_arg(u, option, t, true);
            option[0] = 0;
        } else if (t[0] == '-') {
            snprintf(option, sizeof(option), "%s", t + strspn(t, "-"));
            in_words = false;
        } else if (in_words && !bracketed && all_in(t, "abcdefghijklmnopqrstuvwxyz_") &&
                   u->nwords < 3) {
            snprintf(u->words[u->nwords++], sizeof(u->words[0]), "%.31s", t);
        } else {
            in_words = false;
            add_arg(u, all_in(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") ? t : u->words[u->nwords - 1], t,
                    false);
        }
    }
}

static const usage_arg_t *usage_find(const usage_t *u, const char *name)
{
    for (unsigned i = 0; i < u->nargs; i++)
        if (strcmp(u->args[i].name, name) == 0)
            return &u->args[i];
    return NULL;
}

/* ---- A JSON body ---- */

/* A member's value as a word, as its argument takes it; NULL with why when it cannot be. */
static const char *member_word(const bson_iter_t *it, const usage_arg_t *a, char *buf, size_t cap,
                               char *why, size_t whylen)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_UTF8: {
        uint32_t len;
        const char *s = bson_iter_utf8(it, &len);
        if (a->kind == ARG_INT)
            break;
        if (memchr(s, 0, len)) {
            snprintf(why, whylen, "\"%s\" holds a NUL character", a->name);
            return NULL;
        }
        return s;
    }
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
        if (a->kind == ARG_STRING)
            break;
        snprintf(buf, cap, "%lld", (long long)bson_iter_as_int64(it));
        return buf;
    case BSON_TYPE_DOUBLE:
        if (a->kind != ARG_SCALAR)
            break;
        snprintf(buf, cap, "%.15g", bson_iter_double(it));
        return buf;
    case BSON_TYPE_BOOL:
        if (a->kind != ARG_SCALAR)
            break;
        return bson_iter_bool(it) ? "true" : "false";
    default:
        break;
    }
    snprintf(why, whylen, "\"%s\" must be %s", a->name,
             a->kind == ARG_INT      ? "an integer"
             : a->kind == ARG_STRING ? "a string"
                                     : "a string, a number or a boolean");
    return NULL;
}

/* The members the command takes, for an error: "name, topic, payload, qos". */
static void members_list(const usage_t *u, char *out, size_t len)
{
    size_t at = 0;
    out[0] = 0;
    for (unsigned i = 0; i < u->nargs && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%s", i ? ", " : "", u->args[i].name);
    if (!u->nargs)
        snprintf(out, len, "none");
}

/*
** Checks every member of doc against u and appends the options; given: the positional
** arguments the path gave already. The positional members are appended by json_positional.
*/
static bool json_options(const bson_t *doc, const usage_t *u, unsigned given, char *line,
                         size_t *at, char *why, size_t whylen)
{
    bson_iter_t it;
    uint32_t seen = 0;
    char buf[32];
    bson_iter_init(&it, doc);
    while (bson_iter_next(&it)) {
        const char *name = bson_iter_key(&it);
        const usage_arg_t *a = usage_find(u, name);
        if (!a) {
            char names[256];
            members_list(u, names, sizeof(names));
            snprintf(why, whylen, "unknown member \"%.64s\" (this command takes: %s)", name, names);
            return false;
        }
        unsigned index = (unsigned)(a - u->args), positional = 0;
        for (unsigned i = 0; i < index; i++)
            positional += !u->args[i].option;
        if (seen & 1u << index || (!a->option && positional < given)) {
            snprintf(why, whylen, "\"%s\" is given twice%s", name,
                     seen & 1u << index ? "" : " (in the path and the body)");
            return false;
        }
        seen |= 1u << index;
        const char *w = member_word(&it, a, buf, sizeof(buf), why, whylen);
        if (!w)
            return false;
        char opt[40];
        snprintf(opt, sizeof(opt), "--%s", name);
        if (a->option && (!add_word(line, at, opt) || !add_word(line, at, w))) {
            snprintf(why, whylen, "the request is too long");
            return false;
        }
    }
    return true;
}

/* Appends the positional members, in the usage's order, after the path's given ones. */
static bool json_positional(const bson_t *doc, const usage_t *u, unsigned given, char *line,
                            size_t *at, char *why, size_t whylen)
{
    const char *missing = NULL;
    unsigned positional = 0;
    char buf[32];
    for (unsigned i = 0; i < u->nargs; i++) {
        const usage_arg_t *a = &u->args[i];
        if (a->option || positional++ < given)
            continue;
        bson_iter_t it;
        if (!bson_iter_init_find(&it, doc, a->name)) {
            missing = missing ? missing : a->name;
            continue;
        }
        if (missing) {
            snprintf(why, whylen, "\"%s\" needs \"%s\" before it", a->name, missing);
            return false;
        }
        const char *w = member_word(&it, a, buf, sizeof(buf), why, whylen);
        if (!w)
            return false;
        /* After "--": a value starting with '-' is not taken for an option. */
        if ((positional == given + 1 && !add_raw(line, at, " --")) || !add_word(line, at, w)) {
            snprintf(why, whylen, "the request is too long");
            return false;
        }
    }
    return true;
}

/*
** The first integer outside strings that an int64 cannot hold, or NULL. libbson's JSON
** reader wraps such a number silently (2^64 + 5 reads as 5), so a setting would take a
** value nobody sent; they are found first and refused.
*/
static const char *integer_out_of_range(const char *json, size_t len)
{
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char ch = json[i];
        if (in_string) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_string = false;
            continue;
        }
        if (ch == '"') {
            in_string = true;
            continue;
        }
        if (ch != '-' && (ch < '0' || ch > '9'))
            continue;
        size_t end = i + (ch == '-');
        while (end < len && json[end] >= '0' && json[end] <= '9')
            end++;
        bool integer = end == len || !strchr(".eE", json[end]);
        char digits[32];
        bool fits = end - i < sizeof(digits);
        if (integer && fits) {
            memcpy(digits, json + i, end - i);
            digits[end - i] = 0;
            errno = 0;
            (void)strtoll(digits, NULL, 10);
            fits = errno != ERANGE;
        }
        if (integer && !fits)
            return json + i;
        while (end < len && strchr("0123456789.eE+-", json[end]))
            end++; /* the rest of a non-integer number */
        i = end - 1;
    }
    return NULL;
}

/* The body as one JSON object, nothing after it; NULL with why when it is not. */
static bson_t *parse_object(const char *json, size_t len, char *why, size_t whylen)
{
    const char *big = integer_out_of_range(json, len);
    if (big) {
        /* The body is not NUL-terminated: at most what is left of it, and 24 digits. */
        size_t left = len - (size_t)(big - json);
        snprintf(why, whylen, "a number in the body is out of range (-2^63 .. 2^63-1): %.*s",
                 (int)(left < 24 ? left : 24), big);
        return NULL;
    }
    bson_json_reader_t *r = bson_json_data_reader_new(true, len);
    bson_t *doc = bson_new(), extra = BSON_INITIALIZER;
    bson_error_t err = {0};
    const char *fault = "out of memory";
    if (r && doc) {
        bson_json_data_reader_ingest(r, (const uint8_t *)json, len);
        int got = bson_json_reader_read(r, doc, &err);
        fault = got < 0                                             ? err.message
                : got == 0                                          ? "empty"
                : bson_json_reader_read(r, &extra, &err) != 0 ? "more after the object"
                                                                    : NULL;
    }
    if (fault) {
        snprintf(why, whylen, "the body is not JSON: %.200s", fault);
        bson_destroy(doc);
        doc = NULL;
    }
    bson_destroy(&extra);
    if (r)
        bson_json_reader_destroy(r);
    return doc;
}

/*
** A JSON object's members as the command's arguments: options before --json, positional
** words after it. usage is the command's (NULL: the admin layer answers for the unknown
** command); path_words: the words the path gave, the command's own among them.
*/
static bool json_args(const char *json, size_t len, const char *usage, unsigned path_words,
                      char *line, size_t *at, char *why, size_t whylen)
{
    size_t lead = 0;
    while (lead < len && strchr(" \t\r\n", json[lead]))
        lead++;
    if (lead == len || json[lead] != '{') {
        snprintf(why, whylen, "the body must be a JSON object");
        return false;
    }
    bson_t *doc = parse_object(json, len, why, whylen);
    if (!doc)
        return false;
    usage_t u;
    usage_read(usage ? usage : "", &u);
    unsigned given = path_words > u.nwords ? path_words - u.nwords : 0;
    bool ok = !usage || json_options(doc, &u, given, line, at, why, whylen);
    if (ok && !add_raw(line, at, " --json")) {
        snprintf(why, whylen, "the request is too long");
        ok = false;
    }
    ok = ok && (!usage || json_positional(doc, &u, given, line, at, why, whylen));
    bson_destroy(doc);
    return ok;
}

/* ---- The request line ---- */

size_t rt__http_api_line(const char *path, const char *query, const char *json, size_t json_len,
                         char *line, char *why, size_t whylen)
{
    size_t at = 0;
    char word[1024], first[3][64] = {"", "", ""};
    unsigned words = 0;
    snprintf(why, whylen, "the path or query is not a command (bad escape, or too long)");
    for (const char *p = path; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n && (!decode(p, n, false, word, sizeof(word)) || !add_word(line, &at, word)))
            return 0;
        if (n && words < 3)
            snprintf(first[words], sizeof(first[0]), "%.63s", word);
        words += n != 0;
        p += n + (end != NULL);
    }
    if (!at)
        return 0;
    const char *usage = json ? rt_admin_usage(first[0], words > 1 ? first[1] : NULL,
                                              words > 2 ? first[2] : NULL)
                             : NULL;
    if (usage) { /* a command's alias ("log" for "log level") gets the words its usage has */
        usage_t u;
        usage_read(usage, &u);
        for (; words < u.nwords; words++)
            if (!add_word(line, &at, u.words[words]))
                return 0;
    }
    for (const char *p = query; p && *p;) {
        const char *end = strchr(p, '&');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        size_t klen = eq ? (size_t)(eq - p) : n;
        char opt[1100] = "--";
        if (klen && (!decode(p, klen, true, opt + 2, sizeof(opt) - 2) || !add_word(line, &at, opt)))
            return 0;
        if (klen && eq && (!decode(eq + 1, n - klen - 1, true, word, sizeof(word)) ||
                           !add_word(line, &at, word)))
            return 0;
        p += n + (end != NULL);
    }
    if (json)
        return json_args(json, json_len, usage, words, line, &at, why, whylen) ? at : 0;
    return add_raw(line, &at, " --json") ? at : 0;
}

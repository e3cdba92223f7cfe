/*
** A request to the admin socket, wherever it is answered: its line split into
** words and options (docs/ADMIN.md quoting), its command found and run, and its
** answer rendered as text or JSON; with the helpers commands share to read
** options and write values.
*/
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin_impl.h"

int rt__admin_fail(rt_admin_cmd_t *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof(c->error), fmt, ap);
    va_end(ap);
    return c->code = code;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int rt_admin_split(char *line, size_t len, char **argv, size_t *arglen, int max, int *argc,
                   char *err, size_t errlen)
{
    size_t i = 0;
    int n = 0;
    while (i < len) {
        if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
            i++;
            continue;
        }
        if (n == max) {
            snprintf(err, errlen, "more than %d words", max);
            return RT_EINVAL;
        }
        char *out = line + i; /* decoded bytes are never longer than their encoding */
        size_t o = 0;
        if (line[i] != '"') {
            while (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
                out[o++] = line[i++];
        } else {
            i++;
            for (;;) {
                if (i >= len) {
                    snprintf(err, errlen, "word %d: no closing quote", n + 1);
                    return RT_EINVAL;
                }
                char ch = line[i++];
                if (ch == '"')
                    break;
                if (ch != '\\') {
                    out[o++] = ch;
                    continue;
                }
                if (i >= len) {
                    snprintf(err, errlen, "word %d: a backslash ends the line", n + 1);
                    return RT_EINVAL;
                }
                char e = line[i++];
                if (e == 'n') {
                    out[o++] = '\n';
                } else if (e == 't') {
                    out[o++] = '\t';
                } else if (e == '"' || e == '\\') {
                    out[o++] = e;
                } else if (e == 'x' && i + 1 < len && hexval(line[i]) >= 0 &&
                           hexval(line[i + 1]) >= 0) {
                    out[o++] = (char)(hexval(line[i]) << 4 | hexval(line[i + 1]));
                    i += 2;
                } else {
                    snprintf(err, errlen, "word %d: unknown escape \\%c", n + 1, e);
                    return RT_EINVAL;
                }
            }
            if (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
                snprintf(err, errlen, "word %d: text right after the closing quote", n + 1);
                return RT_EINVAL;
            }
        }
        /* The terminator lands on the separator (or past the decoded bytes). */
        argv[n] = out;
        arglen[n] = o;
        if (i < len)
            i++;
        out[o] = 0;
        n++;
    }
    *argc = n;
    return 0;
}

/*
** Splits a request into c: positional words, "--name value" options and --json.
** Returns 0 or 400 with the error set.
*/
static int parse_request(rt_admin_cmd_t *c, char *line, size_t len)
{
    char *words[RT_ADMIN_ARGS_MAX];
    size_t lens[RT_ADMIN_ARGS_MAX];
    int n = 0;
    /* A line that does not split still asked for its error as JSON if it says --json. */
    bool json_hint = false;
    for (const char *p = line; (p = memmem(p, len - (size_t)(p - line), "--json", 6)); p++)
        if ((p == line || p[-1] == ' ') && (p + 6 == line + len || p[6] == ' '))
            json_hint = true;
    if (rt_admin_split(line, len, words, lens, RT_ADMIN_ARGS_MAX, &n, c->error, sizeof(c->error)) !=
        0) {
        c->json = json_hint;
        return c->code = 400;
    }
    bool options_end = false;
    for (int i = 0; i < n; i++) {
        const char *w = words[i];
        if (!options_end && strcmp(w, "--json") == 0) {
            c->json = true;
        } else if (!options_end && strcmp(w, "--help") == 0) {
            c->help = true;
        } else if (!options_end && strcmp(w, "--") == 0) {
            options_end = true;
        } else if (!options_end && w[0] == '-' && w[1] && !(w[1] >= '0' && w[1] <= '9') &&
                   lens[i] == strlen(w)) { /* "-5" is a value, not an option */
            if (i + 1 == n)
                return rt__admin_fail(c, 400, "option %s needs a value", w);
            if (c->nopts == RT_ADMIN_OPTS_MAX)
                return rt__admin_fail(c, 400, "too many options");
            c->opt_name[c->nopts] = w + (w[1] == '-' ? 2 : 1);
            c->opt_value[c->nopts] = words[i + 1];
            c->opt_len[c->nopts] = lens[i + 1];
            c->nopts++;
            i++;
        } else {
            c->argv[c->argc] = words[i];
            c->arglen[c->argc] = lens[i];
            c->argc++;
        }
    }
    if (!c->argc)
        return rt__admin_fail(c, 400, "empty command; try: help");
    return 0;
}

/*
** "rules reload" names its sub-command; "rules" alone means "rules list"; but
** "rules relaod" is an error, not a list: a word alone takes more words only
** when it has no sub-commands ("top -n 5" is options, which are not words).
*/
bool rt__admin_sub_matches(const char *ksub, const char *sub, const char *sub2, bool prefix)
{
    const char *space = strchr(ksub, ' ');
    if (!space)
        return strcmp(ksub, sub) == 0;
    size_t n = (size_t)(space - ksub);
    if (strncmp(ksub, sub, n) != 0 || sub[n] != 0)
        return false;
    return sub2 ? strcmp(space + 1, sub2) == 0 : prefix;
}

/* The command word and sub (NULL: none) name: a word alone when it has no subcommands. */
static const rt_admin_command_t *find_command(const char *word, const char *sub, const char *sub2)
{
    const rt_admin_command_t *alone = NULL;
    bool has_subs = false;
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++) {
        if (strcmp(k->word, word) != 0)
            continue;
        if (!k->sub)
            alone = k;
        else if (sub && rt__admin_sub_matches(k->sub, sub, sub2, false))
            return k;
        else
            has_subs = true;
    }
    return !sub || !has_subs ? alone : NULL;
}

bool rt__admin_has_subs(const char *word)
{
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++)
        if (k->sub && strcmp(k->word, word) == 0)
            return true;
    return false;
}

const char *rt_admin_usage(const char *word, const char *sub, const char *sub2)
{
    const rt_admin_command_t *k = find_command(word, sub, sub2);
    for (const rt_admin_command_t *a = rt__admin_commands; k && !k->usage && a->word; a++)
        if (a->run == k->run && a->usage)
            return a->usage;
    return k ? k->usage : NULL;
}

/* The command a parsed request names (the help command for --help), or NULL. */
static const rt_admin_command_t *resolve(const rt_admin_cmd_t *c)
{
    const char *sub = c->argc > 1 ? c->argv[1] : NULL;
    const rt_admin_command_t *k = find_command(c->argv[0], sub, c->argc > 2 ? c->argv[2] : NULL);
    /* `COMMAND --help` is `help COMMAND`: it changes nothing, whatever COMMAND does; a word
       with sub-commands alone ("trace --help") describes them all. */
    if (c->help && (k || (!sub && rt__admin_has_subs(c->argv[0])))) {
        RT_ASSERT(strcmp(rt__admin_commands[0].word, "help") == 0);
        return &rt__admin_commands[0];
    }
    return k;
}

const rt_admin_command_t *rt__admin_parse(rt_admin_cmd_t *c, char *line, size_t len)
{
    if (parse_request(c, line, len) != 0)
        return NULL;
    const rt_admin_command_t *k = resolve(c);
    if (!k)
        rt__admin_fail(c, 400, "unknown command \"%s%s%s\"; try: help", c->argv[0],
                       c->argc > 1 ? " " : "", c->argc > 1 ? c->argv[1] : "");
    return k;
}

int rt_admin_lookup(const char *line, size_t len, unsigned *flags)
{
    char *copy = malloc(len + 1);
    rt_admin_cmd_t *c = calloc(1, sizeof(*c));
    int rc = RT_ENOMEM;
    *flags = 0;
    if (copy && c) {
        memcpy(copy, line, len);
        const rt_admin_command_t *k = NULL;
        rc = parse_request(c, copy, len) != 0 ? RT_EINVAL
             : (k = resolve(c))              ? 0
                                             : RT_ENOTFOUND;
        *flags = k ? k->flags : 0;
    }
    free(copy);
    free(c);
    return rc;
}

/* Scanned: a gathering request may keep objects of its actor's heap until it is answered. */
rt_admin_cmd_t *rt__admin_cmd_new(rt_actor_t *self)
{
    rt_admin_cmd_t *c = rt_alloc(self, sizeof(*c), RT_OBJ_SCAN);
    if (c)
        c->self = self;
    return c;
}

void rt__admin_cmd_free(rt_admin_cmd_t *c)
{
    rt__admin_gather_free(c);
    rt_doc_free(c->doc);
    rt_buf_free(&c->text);
    rt_free(c->self, c);
}

void rt__admin_run(rt_admin_cmd_t *c, const rt_admin_command_t *k)
{
    /* Where a command runs is its flags' choice: a blocking one on the worker alone. */
    RT_ASSERT(!(k->flags & RT_ADMIN_BLOCKING) == !rt__admin_on_worker(c->self));
    c->code = 200;
    int rc = k->run(c);
    if (rc >= 400 && c->code < 400)
        c->code = rc;
    if (c->code && c->code < 400 && !c->doc && !c->text.len)
        rt_buf_printf(&c->text, c->json ? "{}\n" : "ok\n");
}

void rt__admin_render(rt_admin_cmd_t *c, rt_buf_t *out)
{
    if (c->code >= 400) {
        if (c->json) {
            rt_buf_add(out, "{\"error\":", 9);
            rt_buf_json_str(out, c->error, strlen(c->error));
            rt_buf_add(out, "}\n", 2);
        } else {
            rt_buf_printf(out, "%s\n", c->error);
        }
        return;
    }
    if (c->text.len) {
        rt_buf_add(out, c->text.data, c->text.len);
        if (c->text.oom)
            out->oom = true;
        return;
    }
    int rc = c->json ? rt_doc_render_json(c->doc, out) : rt_doc_render_text(c->doc, out);
    if (rc) {
        rt_buf_free(out);
        c->json ? rt_buf_printf(out, "{\"error\":\"out of memory\"}\n")
                : rt_buf_printf(out, "out of memory\n");
        c->code = 500;
    }
}

/* ---- For the commands: options, and values in answers ---- */

const char *rt__admin_opt(const rt_admin_cmd_t *c, const char *name, size_t *len)
{
    for (int i = c->nopts - 1; i >= 0; i--)
        if (strcmp(c->opt_name[i], name) == 0) {
            if (len)
                *len = c->opt_len[i];
            return c->opt_value[i];
        }
    return NULL;
}

int rt__admin_opt_long(rt_admin_cmd_t *c, const char *name, long def, long lo, long hi, long *out)
{
    const char *v = rt__admin_opt(c, name, NULL);
    *out = def;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        return rt__admin_fail(c, 400, "%s%s must be a whole number from %ld to %ld",
                              strlen(name) > 1 ? "--" : "-", name, lo, hi);
    *out = n;
    return 0;
}

static void *heap_at(const rt_admin_heap_t *h, size_t i)
{
    return (char *)h->base + i * h->size;
}

static void heap_swap(rt_admin_heap_t *h, size_t i, size_t j)
{
    unsigned char *a = heap_at(h, i), *b = heap_at(h, j);
    for (size_t k = 0; k < h->size; k++) {
        unsigned char t = a[k];
        a[k] = b[k];
        b[k] = t;
    }
}

bool rt__admin_heap_wants(const rt_admin_heap_t *h, const void *elem)
{
    return h->n < h->cap || (h->cap && h->worse(heap_at(h, 0), elem));
}

void rt__admin_heap_put(rt_admin_heap_t *h, const void *elem, void *dropped)
{
    RT_ASSERT(rt__admin_heap_wants(h, elem));
    if (h->n < h->cap) { /* at the bottom, up while worse than its parent */
        size_t i = h->n++;
        memcpy(heap_at(h, i), elem, h->size);
        for (; i && h->worse(heap_at(h, i), heap_at(h, (i - 1) / 2)); i = (i - 1) / 2)
            heap_swap(h, i, (i - 1) / 2);
        return;
    }
    if (dropped)
        memcpy(dropped, heap_at(h, 0), h->size);
    memcpy(heap_at(h, 0), elem, h->size);
    for (size_t i = 0;;) { /* at the root, down while a child is worse */
        size_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < h->n && h->worse(heap_at(h, l), heap_at(h, w)))
            w = l;
        if (r < h->n && h->worse(heap_at(h, r), heap_at(h, w)))
            w = r;
        if (w == i)
            return;
        heap_swap(h, i, w);
        i = w;
    }
}

void rt__admin_pid_text(rt_pid_t pid, char *out, size_t n)
{
    rt_pid_text(pid, out, n);
}

int rt__admin_parse_pid(const char *s, rt_pid_t *out)
{
    unsigned long slot, gen;
    char end;
    if (sscanf(s, "<%lu.%lu%c", &slot, &gen, &end) == 3 && end == '>' && slot <= UINT32_MAX &&
        gen <= UINT32_MAX) {
        *out = (rt_pid_t)gen << 32 | slot;
        return 0;
    }
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno || e == s || *e || !v)
        return RT_EINVAL;
    *out = v;
    return 0;
}

void rt__admin_iso_time(uint64_t unix_ms, char *out, size_t n)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void rt__admin_listener_text(const char *host, int port, char *out, size_t n)
{
    bool v6 = strchr(host, ':') != NULL;
    snprintf(out, n, "%s%.64s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/*
** `help [COMMAND]` and `COMMAND --help`: the command list, or what one command (or every
** command of a word) does, what it takes, and what it needs over HTTP, from the command
** table's usage and about texts.
*/
#include <stdio.h>
#include <string.h>

#include "admin_impl.h"

/* Whether k is a command (not an alias) of word, and of sub (and sub2) when given. */
static bool describes(const rt_admin_command_t *k, const char *word, const char *sub,
                      const char *sub2)
{
    return k->usage && strcmp(k->word, word) == 0 &&
           (!sub || (k->sub && rt__admin_sub_matches(k->sub, sub, sub2, true)));
}

/* What the HTTP API needs for k: its method and role. */
static const char *http_method(const rt_admin_command_t *k)
{
    return k->flags & RT_ADMIN_CHANGES ? "POST" : "GET";
}

static const char *http_role(const rt_admin_command_t *k)
{
    return k->flags & (RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE) ? "admin" : "read";
}

static void describe_text(rt_buf_t *out, const rt_admin_command_t *k)
{
    RT_ASSERT(k->about);
    rt_buf_printf(out, "usage: rtctl %s\n  %s\n", k->usage, k->about);
    /* The path's words are the command's: a sub-command of two takes two ("user/list"). */
    const char *space = k->sub ? strchr(k->sub, ' ') : NULL;
    int first = space ? (int)(space - k->sub) : k->sub ? (int)strlen(k->sub) : 0;
    rt_buf_printf(out, "  %s: %s /api/v1/%s%s%.*s%s%s with %s key.\n",
                  k->flags & RT_ADMIN_CHANGES ? "Changes rtd; over HTTP" : "Over HTTP",
                  http_method(k), k->word, k->sub ? "/" : "", first, k->sub ? k->sub : "",
                  space ? "/" : "", space ? space + 1 : "",
                  k->flags & (RT_ADMIN_CHANGES | RT_ADMIN_SENSITIVE) ? "an admin"
                                                                    : "a read or admin");
}

static void describe_json(rt_doc_t *list, const rt_admin_command_t *k)
{
    rt_doc_t *o = rt_doc_add_object(list, NULL);
    rt_doc_add_str(o, "usage", k->usage);
    rt_doc_add_str(o, "about", k->about);
    rt_doc_add_bool(o, "changes", k->flags & RT_ADMIN_CHANGES);
    rt_doc_add_str(o, "http_method", http_method(k));
    rt_doc_add_str(o, "http_role", http_role(k));
}

/* The list of every command. */
static int list_all(rt_admin_cmd_t *c)
{
    if (c->json) {
        if (!(c->doc = rt_doc_array()))
            return rt__admin_fail(c, 500, "out of memory");
        for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++)
            if (k->usage)
                rt_doc_add_str(c->doc, NULL, k->usage);
        return 200;
    }
    rt_buf_printf(&c->text, "rtctl commands (each takes --json; COMMAND --help says more):\n");
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++)
        if (k->usage)
            rt_buf_printf(&c->text, "  %s\n", k->usage);
    rt_buf_printf(&c->text, "A word alone (clients, subscriptions, actors, rules, sinks, "
                            "retained, apikey, log) lists.\n");
    return 200;
}

int rt__admin_help(rt_admin_cmd_t *c)
{
    /* `help clients list` names it after help; `clients list --help` by itself. */
    int first = c->help ? 0 : 1;
    if (c->argc <= first)
        return list_all(c);
    const char *word = c->argv[first], *sub = c->argc > first + 1 ? c->argv[first + 1] : NULL;
    const char *sub2 = c->argc > first + 2 ? c->argv[first + 2] : NULL;
    bool any = false;
    for (const rt_admin_command_t *k = rt__admin_commands; k->word && !any; k++)
        any = describes(k, word, sub, sub2);
    if (!any) {
        for (const rt_admin_command_t *k = rt__admin_commands; k->word && !any; k++)
            any = describes(k, word, sub, NULL);
        sub2 = NULL; /* "xmpp user list HOST": the words after the command are arguments */
    }
    if (!any)
        sub = NULL; /* "status extra": the words after a command alone are its arguments */
    if (c->json && !(c->doc = rt_doc_array()))
        return rt__admin_fail(c, 500, "out of memory");
    any = false;
    for (const rt_admin_command_t *k = rt__admin_commands; k->word; k++) {
        if (!describes(k, word, sub, sub2))
            continue;
        if (c->json)
            describe_json(c->doc, k);
        else
            describe_text(&c->text, k);
        any = true;
    }
    if (!any)
        return rt__admin_fail(c, 400, "unknown command \"%s%s%s\"; try: help", word,
                              c->argc > first + 1 ? " " : "",
                              c->argc > first + 1 ? c->argv[first + 1] : "");
    return 200;
}

/*
** The settings reference, printed from the schema (config.h): docs/CONFIG.md in Markdown and
** rtd.conf(5) in man(7) markup, by `rtd --print-schema=markdown|man` at build time, so what
** they say is what the loader checks.
*/
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "config_schema.h"

static const char *const type_names[] = {
    [RT_SET_INT] = "integer",        [RT_SET_NUMBER] = "number", [RT_SET_BOOL] = "boolean",
    [RT_SET_STRING] = "string",      [RT_SET_PATH] = "path",     [RT_SET_ADDRESS] = "host:port",
    [RT_SET_NETS] = "networks",      [RT_SET_TABLE] = "table",   [RT_SET_LIST] = "list",
    [RT_SET_MAP] = "table of names", [RT_SET_PREFIX] = "strings"};

static const char *intro =
    "rtd reads its settings from one file (`rtd -c FILE`; etc/rtd.conf in a checkout, "
    "/etc/rt/rtd.conf installed). The file is Lua: top-level assignments such as "
    "`max_connections = 100000`, with comments, arithmetic (`64 * 1024 * 1024`) and tables. "
    "Every value is checked against this schema at start; an error names the file, the line "
    "and the reason, and rtd exits with status 2. `rtd -o` overrides a setting (`rtd -o "
    "log_level=debug`); "
    "`rtctl config show` lists every setting with its value, its default and where the value "
    "came from; `rtctl config set NAME VALUE` changes a live one while rtd runs. Relative paths "
    "are relative to the config file's directory.";

/* "1 to 100", "a, b or c", or "" into out. */
static void range_text(const rt_setting_t *s, char *out, size_t n)
{
    out[0] = 0;
    if ((s->type == RT_SET_INT || s->type == RT_SET_NUMBER) && (s->min || s->max)) {
        if (s->max >= 1e15) /* no limit a value meets in practice */
            snprintf(out, n, ">= %.15g", s->min);
        else
            snprintf(out, n, "%.15g to %.15g", s->min, s->max);
        return;
    }
    if (s->choices)
        rt_conf_choices_text(s->choices, out, n);
}

/* The group a setting is listed under: "" for the top level, else its first name. */
static void group_of(const rt_setting_t *s, char *out, size_t n)
{
    size_t len = strcspn(s->name, ".[(");
    snprintf(out, n, "%.*s", s->name[len] ? (int)len : 0, s->name);
}

typedef struct {
    FILE *out;
    bool man;
    char group[64];
} printer_t;

/* Markdown table cells: a | would end the cell. */
static void md_cell(FILE *out, const char *text)
{
    for (const char *p = text; *p; p++)
        fputs(*p == '|' ? "\\|" : (char[2]){*p, 0}, out);
}

/*
** man(7) text: backslashes and hyphens escaped, Markdown's backquotes dropped, and a line never
** starts with a control character.
*/
static void man_text(FILE *out, const char *text)
{
    if (text[0] == '.' || text[0] == '\'')
        fputs("\\&", out);
    for (const char *p = text; *p; p++)
        if (*p != '`')
            fputs(*p == '\\' ? "\\e" : *p == '-' ? "\\-" : (char[2]){*p, 0}, out);
}

static void print_one(const rt_setting_t *s, void *ud)
{
    printer_t *p = ud;
    char group[64], dflt[256], range[256];
    group_of(s, group, sizeof(group));
    rt_conf_default_text(s, dflt, sizeof(dflt));
    range_text(s, range, sizeof(range));
    const char *changes = s->live ? "live" : "restart";
    if (strcmp(group, p->group) != 0) {
        snprintf(p->group, sizeof(p->group), "%s", group);
        if (p->man) {
            fprintf(p->out, ".SS %s\n", group[0] ? group : "Top level");
        } else {
            fprintf(p->out, group[0] ? "\n## `%s`\n\n" : "\n## Top level\n\n", group);
            fputs("| Setting | Type | Default | Unit | Range or choices | Changes | What it is |\n"
                  "|---|---|---|---|---|---|---|\n",
                  p->out);
        }
    }
    if (p->man) {
        fputs(".TP\n.B ", p->out);
        man_text(p->out, s->name);
        fputs("\n", p->out);
        char head[640];
        snprintf(head, sizeof(head), "%s%s%s%s%s%s%s; %s.", type_names[s->type],
                 s->unit ? ", " : "", s->unit ? s->unit : "", dflt[0] ? ", default " : "", dflt,
                 range[0] ? ", " : "", range, changes);
        man_text(p->out, head);
        fputs("\n.br\n", p->out);
        man_text(p->out, s->doc);
        fputs(".\n", p->out);
        return;
    }
    fprintf(p->out, "| `%s` | %s | ", s->name, type_names[s->type]);
    if (dflt[0]) {
        fputs("`", p->out);
        md_cell(p->out, dflt);
        fputs("`", p->out);
    }
    fprintf(p->out, " | %s | ", s->unit ? s->unit : "");
    md_cell(p->out, range);
    fprintf(p->out, " | %s | ", changes);
    md_cell(p->out, s->doc);
    fputs(" |\n", p->out);
}

int rt_conf_schema_print(const char *format, FILE *out)
{
    printer_t p = {.out = out, .man = strcmp(format, "man") == 0, .group = "-"};
    if (!p.man && strcmp(format, "markdown") != 0)
        return RT_EINVAL;
    if (p.man) {
        fputs(".\\\" rtd.conf(5), printed by rtd --print-schema=man from the settings schema\n"
              ".\\\" (actors/base/config_schema.c): edit the schema, not this page.\n"
              ".TH RTD.CONF 5 \"@RT_MAN_DATE@\" \"rt @PROJECT_VERSION@\" \"rt manual\"\n"
              ".SH NAME\nrtd.conf \\- the settings of the rt MQTT broker\n.SH DESCRIPTION\n",
              out);
        man_text(out, intro);
        fputs("\n.PP\nEach setting below gives its type, unit, default, range or choices, and "
              "whether\n.B rtctl config set\nchanges it live or it needs a restart.\n"
              ".SH SETTINGS\n",
              out);
    } else {
        fputs("# rtd.conf settings\n\n<!-- Printed by `rtd --print-schema=markdown` from the "
              "settings schema (actors/base/config_schema.c and the sinks' key tables); the build "
              "checks this copy against it. Edit the schema, not this file. -->\n\n",
              out);
        fprintf(out,
                "%s\n\nEach table gives a setting's type, default (as rtd.conf writes it), "
                "unit, range or choices, and whether `rtctl config set` changes it live "
                "or it needs a restart.\n",
                intro);
    }
    rt_conf_schema_each(print_one, &p);
    if (p.man)
        fputs(".SH FILES\n.I /etc/rt/rtd.conf\n.SH SEE ALSO\n.BR rtd (8),\n.BR rtctl (8)\n", out);
    return 0;
}

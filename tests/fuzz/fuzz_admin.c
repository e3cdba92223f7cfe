/*
** The admin socket's request lines (actors/admin/admin_request.c): the input is what a client sends, cut
** into lines at '\n' as the connection actor does; each line is split into words and options
** and looked up in the command table, and a refused one has its error rendered (text or JSON).
** Each line sits in a buffer of exactly its length, so a read past it is an ASan report.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"

static void check_words(const rt_admin_cmd_t *c, const char *line, size_t len)
{
    for (int i = 0; i < c->argc; i++) {
        if (c->argv[i] < line || c->argv[i] + c->arglen[i] >= line + len + 1 ||
            c->argv[i][c->arglen[i]] != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *end = data + size;
    while (data < end) {
        const uint8_t *nl = memchr(data, '\n', (size_t)(end - data));
        size_t len = (size_t)((nl ? nl : end) - data);
        const uint8_t *next = nl ? nl + 1 : end;
        if (len > RT_ADMIN_LINE_MAX) { /* refused before it is parsed */
            data = next;
            continue;
        }
        /* Splitting writes one terminator past the last word: the buffer holds the '\n'. */
        char *line = malloc(len + 1);
        memcpy(line, data, len);
        line[len] = '\n';
        rt_admin_cmd_t *c = calloc(1, sizeof(*c));
        if (rt__admin_parse(c, line, len)) {
            check_words(c, line, len);
            if (c->argc < 1 || c->argc > RT_ADMIN_ARGS_MAX || c->nopts > RT_ADMIN_OPTS_MAX)
                abort();
            (void)rt__admin_opt(c, "n", NULL);
        } else { /* a malformed line or an unknown command */
            if (c->code != 400 || !memchr(c->error, 0, sizeof(c->error)))
                abort();
            rt_buf_t out = {0};
            rt__admin_render(c, &out);
            rt_buf_free(&out);
        }
        free(c);
        free(line);
        data = next;
    }
    return 0;
}

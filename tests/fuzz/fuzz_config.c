/*
** The config loader (actors/base/config.c) on the text of a config file, over the defaults; then
** the file's first line once more as an `rtd -o` / `rtctl config set` assignment. Every
** error must come back as a message, and a loaded config must list (rt_conf_each).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_file.h"

static void each(const rt_conf_value_t *v, void *ud)
{
    *(size_t *)ud += strlen(v->name) + strlen(v->value) + strlen(v->dflt) + strlen(v->from) +
                     strlen(v->setting->doc);
}

static rt_conf_t conf;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[RT_CONF_ERR_LEN];
    rt_conf_defaults(&conf);
    err[0] = 0;
    if (rt_conf_load(&conf, fuzz_file(data, size), err, sizeof err) == 0) {
        size_t n = 0;
        rt_conf_each(&conf, each, &n);
    } else if (!err[0] || !memchr(err, 0, sizeof err)) {
        abort();
    }
    const uint8_t *nl = memchr(data, '\n', size);
    size_t len = nl ? (size_t)(nl - data) : size;
    char *line = malloc(len + 1);
    memcpy(line, data, len);
    line[len] = 0;
    err[0] = 0;
    if (rt_conf_set(&conf, line, err, sizeof err) != 0 && !err[0])
        abort();
    free(line);
    return 0;
}

/*
** The PROXY protocol header and X-Forwarded-For (actors/transport/proxy.c).
**
** The input is parsed as a PROXY header: a header found must parse the same from its own
** bytes and ask for more one byte short; a prefix refused means the whole is refused. It is
** also read, NUL-terminated, as an X-Forwarded-For value (whose client must not be one of
** the trusted proxies).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "proxy.h"

static int parse(const uint8_t *data, size_t size, size_t *used, rt_proxy_info_t *info)
{
    const char *why = NULL;
    int rc = rt_proxy_parse(data, size, used, info, &why);
    if (!why || (rc == RT_EPROTO && !why[0]))
        abort();
    if (rc != 0 && rc != RT_EAGAIN && rc != RT_EPROTO)
        abort();
    return rc;
}

static void header(const uint8_t *data, size_t size)
{
    size_t used, again;
    rt_proxy_info_t info, info_again;
    int rc = parse(data, size, &used, &info);
    if (rc == 0) {
        if (used == 0 || used > size || used > RT_PROXY_MAX)
            abort();
        if (parse(data, used, &again, &info_again) != 0 || again != used ||
            memcmp(&info, &info_again, sizeof info) != 0)
            abort();
        if (parse(data, used - 1, &again, &info_again) != RT_EAGAIN)
            abort();
    } else if (rc == RT_EAGAIN) {
        if (size >= RT_PROXY_MAX)
            abort();
    }
    if (parse(data, size / 2, &used, &info) == RT_EPROTO && rc != RT_EPROTO)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    header(data, size);

    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    /* The trusted proxies as rtd.conf gives them, the text itself as a third entry when it
       parses as one (the loader's address lists). */
    static rt_conf_net_t trusted[RT_CONF_MAX_NETS];
    static unsigned base;
    if (!base) {
        rt_conf_t conf;
        rt_conf_defaults(&conf);
        char err[RT_CONF_ERR_LEN];
        if (rt_conf_set(&conf, "anonymous_from={\"10.0.0.0/8\", \"2001:db8::/32\"}", err,
                        sizeof(err)) != 0 || conf.nanonymous_from != 2)
            abort();
        memcpy(trusted, conf.anonymous_from, 2 * sizeof(trusted[0]));
        base = 2;
    }
    rt_auth_addr_t client;
    if (rt_forwarded_client(text, trusted, base, &client) &&
        rt_conf_net_match(trusted, base, client.b))
        abort();
    free(text);
    return 0;
}

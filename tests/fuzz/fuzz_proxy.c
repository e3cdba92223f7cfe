/*
** The PROXY protocol header and address lists (actors/transport/proxy.c).
**
** The input is parsed as a PROXY header: a header found must parse the same from its own
** bytes and ask for more one byte short; a prefix refused means the whole is refused. It is
** also read, NUL-terminated, as a CIDR entry (which must contain its own network) and as an
** X-Forwarded-For value (whose client must not be one of the trusted proxies).
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
    rt_cidr_t trusted[3];
    size_t n = 0;
    if (rt_cidr_parse("10.0.0.0/8", &trusted[n]) == 0)
        n++;
    if (rt_cidr_parse("2001:db8::/32", &trusted[n]) == 0)
        n++;
    if (n != 2)
        abort();
    rt_cidr_t c;
    if (rt_cidr_parse(text, &c) == 0) {
        if (c.prefix > 128 || !rt_cidr_match(&c, 1, &c.net))
            abort();
        trusted[n++] = c;
    }
    rt_auth_addr_t client;
    if (rt_forwarded_client(text, trusted, n, &client) && rt_cidr_match(trusted, n, &client))
        abort();
    free(text);
    return 0;
}

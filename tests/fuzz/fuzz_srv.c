/*
** Federation's SRV answers (actors/xmpp/srv.c): any bytes a name server sends are records or
** RT_EPROTO, never a crash or a read past the message; what is read holds its bounds (a
** count within max, targets that end inside their buffer), and ordering them sorts the
** priorities and keeps every record.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "srv.h"

static uint32_t from_input(void *arg)
{
    uint32_t *x = arg;
    *x = *x * 1103515245u + 12345u;
    return *x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* its own allocation: ASan sees any overread */
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    rt_xmpp_srv_t s[RT_XMPP_SRV_MAX];
    int n = rt_xmpp_srv_parse(copy, size, s, RT_XMPP_SRV_MAX);
    if (n != RT_EPROTO && (n < 0 || n > RT_XMPP_SRV_MAX))
        abort();
    if (n > 0) {
        unsigned weight_sum = 0;
        for (int i = 0; i < n; i++) {
            if (!memchr(s[i].target, 0, sizeof(s[i].target)))
                abort();
            weight_sum += s[i].weight;
        }
        uint32_t seed = (uint32_t)size;
        rt_xmpp_srv_order(s, (unsigned)n, from_input, &seed);
        unsigned after = 0;
        for (int i = 0; i < n; i++) {
            after += s[i].weight;
            if (i && s[i - 1].priority > s[i].priority)
                abort();
        }
        if (after != weight_sum)
            abort();
    }
    free(copy);
    return 0;
}

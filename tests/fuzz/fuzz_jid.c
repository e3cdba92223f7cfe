/*
** JID preparation (actors/xmpp/jid.c): any bytes are a JID or a refusal with a reason,
** never a crash; a prepared JID prepares to itself (normalise(normalise(x)) ==
** normalise(x)) and its lengths add up; for one part alone (the first byte picks which),
** the same, and on ASCII input the ASCII path and libidn's agree.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jid.h"

static void check_part(rt_jid_part_t part, const char *in, size_t len)
{
    char out[RT_JID_PART_MAX + 1], again[RT_JID_PART_MAX + 1], slow[RT_JID_PART_MAX + 1];
    size_t n = 0, m = 0, k = 0;
    const char *why = NULL;
    int rc = rt_jid_prep_part(part, in, len, out, &n, &why);
    if (rc == RT_EINVAL && (!why || !*why))
        abort();
    if (rc != 0 && rc != RT_EINVAL && rc != RT_ENOMEM)
        abort();
    if (rc == 0) {
        if (n == 0 || n > RT_JID_PART_MAX || strlen(out) != n)
            abort();
        if (rt_jid_prep_part(part, out, n, again, &m, &why) != 0 || m != n ||
            memcmp(out, again, n) != 0)
            abort();
    }
    bool ascii = true;
    for (size_t i = 0; i < len; i++)
        ascii = ascii && (unsigned char)in[i] < 0x80;
    if (ascii) {
        int src = rt__jid_prep_part_slow(part, in, len, slow, &k, &why);
        if (src != rc || (rc == 0 && (k != n || memcmp(slow, out, n) != 0)))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rt_jid_buf_t a, b;
    const char *why = NULL;
    int rc = rt_jid_prep((const char *)data, size, &a, &why);
    if (rc == RT_EINVAL && (!why || !*why))
        abort();
    if (rc != 0 && rc != RT_EINVAL && rc != RT_ENOMEM)
        abort();
    /* The sessions ask no reason (why NULL): the same answer, and no write through it. */
    if (rt_jid_prep((const char *)data, size, &b, NULL) != rc)
        abort();
    /* The sessions ask no reason (why NULL): the same answer, and no write through it. */
    if (rt_jid_prep((const char *)data, size, &b, NULL) != rc)
        abort();
    if (rc == 0) {
        const rt_jid_t *j = &a.jid;
        if (j->domain == 0 || strlen(j->s) != rt_jid_len(j) ||
            (j->local && j->s[j->local] != '@') || (j->resource && rt_jid_resource(j)[-1] != '/'))
            abort();
        if (rt_jid_prep(j->s, rt_jid_len(j), &b, &why) != 0 || !rt_jid_eq(j, &b.jid))
            abort();
    }
    if (size > 0)
        check_part((rt_jid_part_t)(data[0] % 3), (const char *)data + 1, size - 1);
    return 0;
}

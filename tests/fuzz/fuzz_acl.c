/*
** The ACL file parser (actors/acl.c); a table that loads is then asked about a few topics
** and filters, by a user, anonymously and through %u/%c substitution.
*/
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "fuzz_file.h"

static const char *const topics[] = {
    "a/b", "a", "$SYS/x", "alice/c1/t", "a/+/#", "#", "+/b", "$share/g/a/#", ""};
static const char *const users[] = {NULL, "alice", "a+b", "bob smith"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    rt_acl_t *acl = NULL;
    int rc = rt_acl_load(fuzz_file(data, size), &acl, err, sizeof err);
    if (rc != 0) {
        if (acl || !err[0])
            abort();
        return 0;
    }
    for (size_t u = 0; u < sizeof users / sizeof *users; u++)
        for (size_t t = 0; t < sizeof topics / sizeof *topics; t++)
            for (unsigned access = RT_ACL_READ; access <= RT_ACL_SUBSCRIBE; access <<= 1) {
                const char *topic = topics[t];
                int r = rt_acl_check(acl, users[u], "c1", topic, strlen(topic), access);
                bool filtered_ok = access == RT_ACL_SUBSCRIBE && r == RT_ACL_FILTERED;
                if (r != RT_ACL_ALLOW && r != RT_ACL_DENY && !filtered_ok)
                    abort();
            }
    rt_acl_free(acl);
    return 0;
}

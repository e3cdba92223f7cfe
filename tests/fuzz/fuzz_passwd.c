/* The password file parser (actors/auth/password_table.c): a table or a "path:line: reason"
   error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    rt_auth_t *a = NULL;
    int rc = rt_auth_load(fuzz_file(data, size), &a, err, sizeof err);
    if (rc == 0) {
        (void)rt_auth_users(a);
        rt_auth_free(a);
    } else if (a || !err[0]) {
        abort();
    }
    return 0;
}

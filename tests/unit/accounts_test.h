/*
** Helpers of the tests over xmpp.db (test_roster.c, test_xeps_store.c): a file opened in a
** test directory, and accounts made with the fewest PBKDF2 rounds the accounts take, so that
** the tests stay quick. Include after check.h.
*/
#ifndef RT_ACCOUNTS_TEST_H
#define RT_ACCOUNTS_TEST_H

#include <stdio.h>

#include "accounts.h"

#define ACCOUNTS_TEST_ROUNDS RT_SCRAM_MIN_ITERATIONS
#define ACCOUNTS_TEST_HOST "example.com"

static inline rt_accounts_t *open_in(const char *d)
{
    rt_accounts_t *a = NULL;
    char err[RT_ACCOUNTS_ERR_LEN] = "";
    int rc = rt_accounts_open(d, &a, err, sizeof(err));
    if (rc)
        fprintf(stderr, "  open: %s\n", err);
    CHECK_EQ(rc, 0);
    return a;
}

/* user@example.com, password "pencil". */
static inline void add_user(rt_accounts_t *a, const char *user)
{
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_add(a, ACCOUNTS_TEST_HOST, user, "pencil", 6, ACCOUNTS_TEST_ROUNDS, err,
                             sizeof(err)),
             0);
}

#endif

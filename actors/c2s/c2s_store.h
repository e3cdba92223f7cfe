/*
** Inside the store actor (c2s_store.c): its roster and subscription requests, run by
** c2s_store_roster.c on the store's own accounts handle, answering the session at `to`.
*/
#ifndef RT_C2S_STORE_H
#define RT_C2S_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "accounts.h"
#include "roster.h"
#include "rt.h"

void rt__c2s_store_sub(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                       size_t len);
void rt__c2s_store_roster_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len);
void rt__c2s_store_roster_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len);
void rt__c2s_store_presence_init(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user);

/* c2s_store_xeps.c: blocklists (XEP-0191) */
void rt__c2s_store_block_load(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user);
void rt__c2s_store_block_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len);
void rt__c2s_store_block_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len);
/* c2s_store_xeps.c: vCards (XEP-0054) */
void rt__c2s_store_vcard_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len);
void rt__c2s_store_vcard_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len);

#endif

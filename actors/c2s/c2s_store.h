/*
** Inside the store actor (c2s_store.c): its roster and subscription requests, run by
** c2s_store_roster.c on the store's own accounts handle, answering the session at `to`.
*/
#ifndef RT_C2S_STORE_H
#define RT_C2S_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "accounts.h"
#include "c2s_impl.h"
#include "roster.h"
#include "rt.h"

void rt__c2s_store_sub_in(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                          size_t len);
void rt__c2s_store_sub(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                       size_t len);
/* first: C2S_OP_ROSTER_GET_FIRST's C2S_MSG_PRESENCE_READY when nothing is pending or kept. */
void rt__c2s_store_roster_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len, bool first);
void rt__c2s_store_roster_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len);
void rt__c2s_store_presence_init(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user);
/* Tells user@host's sessions that C2S_MSG_PRESENCE_READY no longer holds (kind C2S_STALE_*):
   a message was kept (to every session) or a subscription request made (to those not yet
   available; the available ones got it). */
void rt__c2s_store_presence_stale(const char *host, const char *user, uint8_t kind);

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
/* c2s_store_pep.c: PEP (XEP-0163), C2S_OP_PEP_* answered to to */
void rt__c2s_store_pep_publish(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                               const uint8_t *data, size_t len);
void rt__c2s_store_pep_delete(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                              const uint8_t *data, size_t len);
void rt__c2s_store_pep_items(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len);
void rt__c2s_store_pep_last(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                            const uint8_t *data, size_t len);
/* c2s_store_register.c: XEP-0077's C2S_OP_REGISTER, _PASSWD and _UNREGISTER, answered to to */
void rt__c2s_store_register(rt_accounts_t *a, rt_pid_t to, const c2s_req_t *r, const char *host,
                            const char *user, const uint8_t *data, size_t len);
/* Such a request the store never took: the session is told RT_EAGAIN. */
void rt__c2s_store_register_lost(rt_pid_t to, const c2s_req_t *r);

#endif

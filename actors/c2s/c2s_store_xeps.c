/*
** The store actor's side of the XEPs kept in xmpp.db (xeps.h): blocklists (XEP-0191). Each
** request comes from the account's own session and is answered with the finished stanza
** (C2S_MSG_STANZA); a blocklist change also goes to every session of the account, as the
** new list and the push (C2S_MSG_BLOCKLIST).
*/
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "c2s_store.h"
#include "log.h"
#include "xeps.h"

#define NS_BLOCKING "urn:xmpp:blocking"

/* ---- Blocklists ---- */

typedef struct list_s {
    rt_buf_t packed; /* for the sessions: 2 bytes of length, the JID */
    rt_buf_t items;  /* for the result: <item jid='...'/> each */
} list_t;

static int add_item(const char *jid, size_t len, void *arg)
{
    list_t *l = arg;
    if (len > UINT16_MAX)
        return 0;
    uint8_t head[2] = {(uint8_t)(len & 0xff), (uint8_t)(len >> 8)};
    rt_buf_add(&l->packed, head, 2);
    rt_buf_add(&l->packed, jid, len);
    rt_xml_put_start(&l->items, "item");
    rt_xml_put_attr_len(&l->items, "jid", jid, len);
    rt_xml_put_empty_end(&l->items);
    return 0;
}

/* The list with a push before it (push NULL: none), as C2S_MSG_BLOCKLIST carries them. */
static void list_msg(rt_buf_t *out, const list_t *l, const rt_buf_t *push)
{
    uint32_t plen = push ? (uint32_t)push->len : 0;
    rt_buf_add(out, &plen, sizeof(plen));
    if (plen)
        rt_buf_add(out, push->data, push->len);
    rt_buf_add(out, l->packed.data, l->packed.len);
}

static void list_free(list_t *l)
{
    rt_buf_free(&l->packed);
    rt_buf_free(&l->items);
}

void rt__c2s_store_iq_answer(rt_pid_t to, const char *id, size_t idlen, int rc, const char *payload,
                             size_t plen)
{
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr_len(&b, "id", id, idlen);
    rt_xml_put_attr(&b, "type", rc ? "error" : "result");
    if (rc)
        rt_buf_printf(&b, "><error type='%s'><%s xmlns='%s'/></error></iq>",
                      rc == RT_ELIMIT   ? "cancel"
                      : rc == RT_EINVAL ? "modify"
                                        : "wait",
                      rc == RT_ELIMIT   ? "resource-constraint"
                      : rc == RT_EINVAL ? "bad-request"
                                        : "internal-server-error",
                      RT_XML_NS_STANZA_ERRORS);
    else if (plen) {
        rt_xml_put_start_end(&b);
        rt_buf_add(&b, payload, plen);
        rt_xml_put_end(&b, "iq");
    } else
        rt_xml_put_empty_end(&b);
    if (!b.oom)
        rt_send(to, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
}

void rt__c2s_store_block_load(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user)
{
    list_t l = {0};
    rt_buf_t m = {0};
    if (rt_block_list(a, host, user, add_item, &l) == 0) {
        list_msg(&m, &l, NULL);
        if (!m.oom)
            rt_send(to, C2S_MSG_BLOCKLIST, m.data, m.len);
    }
    rt_buf_free(&m);
    list_free(&l);
}

void rt__c2s_store_block_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len)
{
    size_t idlen = strnlen((const char *)data, len);
    list_t l = {0};
    rt_buf_t m = {0};
    int rc = rt_block_list(a, host, user, add_item, &l);
    if (rc == 0) {
        list_msg(&m, &l, NULL);
        if (!m.oom)
            rt_send(to, C2S_MSG_BLOCKLIST, m.data, m.len);
    }
    rt_buf_t q = {0};
    rt_buf_printf(&q, "<blocklist xmlns='%s'>", NS_BLOCKING);
    rt_buf_add(&q, l.items.data, l.items.len);
    rt_buf_printf(&q, "</blocklist>");
    rt__c2s_store_iq_answer(to, (const char *)data, idlen,
                            rc      ? rc
                            : q.oom ? RT_ENOMEM
                                    : 0,
                            q.data, q.len);
    rt_buf_free(&q);
    rt_buf_free(&m);
    list_free(&l);
}

void rt__c2s_store_block_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len)
{
    if (len < 2)
        return;
    bool block = data[0];
    const char *id = (const char *)data + 1;
    size_t idlen = strnlen(id, len - 1);
    if (idlen == len - 1)
        return;
    /* The JIDs, NUL-terminated one after another, as pointers (bounded by the session). */
    size_t at = 1 + idlen + 1, max = (size_t)rt__c2s.conf->max_roster_items, n = 0;
    const char **jids = NULL;
    if (at < len && !(jids = malloc(sizeof(*jids) * (max + 1))))
        return;
    while (at < len && n <= max) {
        jids[n] = (const char *)data + at;
        size_t jl = strnlen(jids[n], len - at);
        if (at + jl == len)
            break;
        at += jl + 1;
        n++;
    }
    int rc = block ? rt_block_add(a, host, user, jids, n, (uint32_t)max)
                   : rt_block_del(a, host, user, jids, n);
    if (rc == 0) {
        rt_buf_t push = {0};
        rt_buf_printf(&push, "<iq xmlns='%s' type='set' id='blockpush'><%s xmlns='%s'",
                      RT_XML_NS_CLIENT, block ? "block" : "unblock", NS_BLOCKING);
        if (n) {
            rt_xml_put_start_end(&push);
            for (size_t i = 0; i < n; i++) {
                rt_xml_put_start(&push, "item");
                rt_xml_put_attr(&push, "jid", jids[i]);
                rt_xml_put_empty_end(&push);
            }
            rt_xml_put_end(&push, block ? "block" : "unblock");
            rt_xml_put_end(&push, "iq");
        } else {
            rt_buf_printf(&push, "/></iq>");
        }
        list_t l = {0};
        rt_buf_t m = {0};
        if (rt_block_list(a, host, user, add_item, &l) == 0)
            list_msg(&m, &l, &push);
        if (m.len && !m.oom)
            rt__c2s_reg_to_account(host, user, C2S_MSG_BLOCKLIST, m.data, m.len, false);
        rt_buf_free(&m);
        rt_buf_free(&push);
        list_free(&l);
    } else {
        rt_log(RT_LOG_INFO, "xmpp.block_refused", "user=%s@%s reason=%s", user, host,
               rt_strerror(rc));
    }
    free(jids);
    rt__c2s_store_iq_answer(to, id, idlen, rc, NULL, 0);
}

/* ---- vCards ---- */

static void put_card(const void *vcard, size_t len, void *arg)
{
    rt_buf_add(arg, vcard, len);
}

void rt__c2s_store_vcard_get(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len)
{
    const char *id = (const char *)data;
    size_t idlen = strnlen(id, len);
    if (idlen == len)
        return;
    const char *from = id + idlen + 1;
    size_t flen = len - idlen - 1;
    rt_buf_t card = {0};
    int rc = rt_vcard_get(a, host, user, put_card, &card);
    /* Another account's, none set: the answer one that does not exist gets (XEP-0054 3.3:
       the same error both ways, so that asking cannot tell which accounts exist). */
    bool none = rc == RT_ENOTFOUND && flen;
    rt_buf_t b = {0};
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr_len(&b, "id", id, idlen);
    if (flen)
        rt_xml_put_attr_len(&b, "from", from, flen);
    if (!none && (rc == 0 || rc == RT_ENOTFOUND)) { /* the user's own, none yet: empty (3.1) */
        rt_xml_put_attr(&b, "type", "result");
        rt_xml_put_start_end(&b);
        if (rc == 0)
            rt_buf_add(&b, card.data, card.len);
        else
            rt_buf_printf(&b, "<vCard xmlns='vcard-temp'/>");
        rt_xml_put_end(&b, "iq");
    } else {
        rt_xml_put_attr(&b, "type", "error");
        rt_buf_printf(&b, "><error type='cancel'><%s xmlns='%s'/></error></iq>",
                      none ? "service-unavailable" : "internal-server-error",
                      RT_XML_NS_STANZA_ERRORS);
    }
    if (!b.oom && !card.oom)
        rt_send(to, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
    rt_buf_free(&card);
}

void rt__c2s_store_vcard_set(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                             const uint8_t *data, size_t len)
{
    const char *id = (const char *)data;
    size_t idlen = strnlen(id, len);
    if (idlen == len)
        return;
    int rc = rt_vcard_set(a, host, user, data + idlen + 1, len - idlen - 1);
    rt__c2s_store_iq_answer(to, id, idlen, rc, NULL, 0);
}

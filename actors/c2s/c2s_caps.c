/*
** Entity capabilities (XEP-0115) of the server itself: the verification string of its
** disco#info (5.1: identities "category/type/lang/name<", then each feature "var<", sorted,
** SHA-1, base64), computed once at start, and the <c/> element the stream features carry. A
** disco#info to node#ver is answered as one without a node (c2s_session.c echoes the node).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/sha.h>

#include "c2s_impl.h"

static char caps_el[256];

static int by_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void rt__c2s_caps_init(void)
{
    const char *sorted[C2S_NFEATURES];
    memcpy(sorted, rt__c2s_features_list, sizeof(sorted));
    qsort(sorted, C2S_NFEATURES, sizeof(sorted[0]), by_text);
    rt_buf_t s = {0};
    rt_buf_printf(&s, "%s/%s//%s<", C2S_IDENTITY_CATEGORY, C2S_IDENTITY_TYPE, C2S_IDENTITY_NAME);
    for (size_t i = 0; i < C2S_NFEATURES; i++)
        rt_buf_printf(&s, "%s<", sorted[i]);
    unsigned char md[SHA_DIGEST_LENGTH];
    unsigned char ver[4 * ((SHA_DIGEST_LENGTH + 2) / 3) + 1];
    if (!s.oom) {
        SHA1((const unsigned char *)s.data, s.len, md);
        EVP_EncodeBlock(ver, md, SHA_DIGEST_LENGTH);
        snprintf(caps_el, sizeof(caps_el),
                 "<c xmlns='http://jabber.org/protocol/caps' hash='sha-1' node='%s' ver='%s'/>",
                 C2S_CAPS_NODE, (const char *)ver);
    }
    rt_buf_free(&s);
}

const char *rt__c2s_caps_element(void)
{
    return caps_el;
}

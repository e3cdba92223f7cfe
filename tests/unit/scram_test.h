/*
** A SCRAM client, written from RFC 5802 §3 with OpenSSL's PBKDF2 and HMAC apart from the
** server's code, for what runs exchanges against the server: test_scram, test_accounts and
** fuzz_scram (which checks that no exchange succeeds without this client's proof).
*/
#ifndef RT_SCRAM_TEST_H
#define RT_SCRAM_TEST_H

#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "rt.h"
#include "scram.h"

static inline const EVP_MD *client_md(rt_scram_hash_t h)
{
    return h == RT_SCRAM_SHA1 ? EVP_sha1() : EVP_sha256();
}

/* SaltedPassword := Hi(password, salt, i): the slow part, once per password. */
static inline void client_salted(rt_scram_hash_t h, const char *pw, const uint8_t *salt,
                                 size_t saltlen, uint32_t it, uint8_t *salted)
{
    PKCS5_PBKDF2_HMAC(pw, (int)strlen(pw), salt, (int)saltlen, (int)it, client_md(h),
                      (int)rt_scram_key_len(h), salted);
}

/*
** ClientProof (base64 into proof, 45 bytes) and ServerSignature (raw into server_sig, may
** be NULL) for AuthMessage auth.
*/
static inline void client_proof_salted(rt_scram_hash_t h, const uint8_t *salted, const void *auth,
                                       size_t authlen, char *proof, uint8_t *server_sig)
{
    const EVP_MD *md = client_md(h);
    int k = (int)rt_scram_key_len(h);
    uint8_t ck[32], sk[32], sig[32], p[32], srv[32];
    HMAC(md, salted, k, (const uint8_t *)"Client Key", 10, ck, NULL);
    EVP_Digest(ck, (size_t)k, sk, NULL, md, NULL);
    HMAC(md, sk, k, auth, authlen, sig, NULL);
    for (int i = 0; i < k; i++)
        p[i] = ck[i] ^ sig[i];
    rt_base64_encode(p, (size_t)k, proof);
    if (server_sig) {
        HMAC(md, salted, k, (const uint8_t *)"Server Key", 10, srv, NULL);
        HMAC(md, srv, k, auth, authlen, server_sig, NULL);
    }
}

static inline void client_proof(rt_scram_hash_t h, const char *pw, const uint8_t *salt,
                                size_t saltlen, uint32_t it, const char *auth, size_t authlen,
                                char *out)
{
    uint8_t salted[32];
    client_salted(h, pw, salt, saltlen, it, salted);
    client_proof_salted(h, salted, auth, authlen, out, NULL);
}

#endif

/*
** The SCRAM exchange (actors/xmpp/scram.c) with client messages from the fuzzer at every
** step: never a crash, and never a success without the right proof and channel binding.
** The input: one byte of options (hash, -PLUS, the binding types offered, an unknown
** user, whether the harness writes the final message), the client-first message, '\n',
** and either the raw client-final message or, written by the harness, the c= bytes, '\n'
** and extensions, with the correct proof or a wrong one. A success is checked against an
** independent client (tests/unit/scram_test.h): its proof and c= must be what the client
** would send, and v= what it expects.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/scram_test.h"
#include "scram.h"

#define SNONCE "SeRvErNoNcE"

static const uint8_t salt[16] = "fuzz-salt-16byte";
static const uint8_t cb_data[32] = "channel binding data, 32 bytes!";
static rt_scram_cred_t creds[2];
static uint8_t salted[2][32];

static void setup(void)
{
    static bool done;
    if (done)
        return;
    for (int h = 0; h < 2; h++) {
        if (rt_scram_cred_derive((rt_scram_hash_t)h, "pencil", 6, salt, sizeof(salt), 4096,
                                 &creds[h], NULL) != 0)
            abort();
        client_salted((rt_scram_hash_t)h, "pencil", salt, sizeof(salt), 4096, salted[h]);
    }
    done = true;
}

/* The value of msg's first field when it is "c=...", of its last when that is "p=...". */
static bool first_last(const char *msg, size_t len, const char **c, size_t *cn, const char **p,
                       size_t *pn)
{
    const char *comma = memchr(msg, ',', len), *last = msg + len;
    while (last > msg && last[-1] != ',')
        last--;
    if (!comma || len < 2 || msg[0] != 'c' || msg[1] != '=' || msg + len - last < 2 ||
        last[0] != 'p' || last[1] != '=')
        return false;
    *c = msg + 2;
    *cn = (size_t)(comma - *c);
    *p = last + 2;
    *pn = (size_t)(msg + len - *p);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size < 1)
        return 0;
    uint8_t opt = data[0];
    rt_scram_hash_t hash = (rt_scram_hash_t)(opt & 1);
    bool plus = opt & 2, unknown = opt & 16, assisted = opt & 32, right_proof = opt & 64;
    unsigned offered = (opt >> 2) & 3;
    const char *in = (const char *)data + 1, *end = (const char *)data + size;
    const char *nl = memchr(in, '\n', (size_t)(end - in));
    size_t cflen = nl ? (size_t)(nl - in) : (size_t)(end - in);
    size_t sz = rt_scram_size(cflen) ? rt_scram_size(cflen) : rt_scram_size(0);
    rt_scram_t *s = malloc(sz);
    rt_scram_first_t first;
    const char *out;
    size_t outlen;
    int rc = rt_scram_start(s, sz, hash, plus, offered, in, cflen, &first);
    if ((rc == 0) != (rt_scram_failure(s) == RT_SCRAM_OK) || (rc && rc != RT_EPROTO))
        abort();
    if (rc == 0)
        rc = rt__scram_server_first_nonce(s, unknown ? NULL : &creds[hash], SNONCE, strlen(SNONCE),
                                          &out, &outlen);
    if (rc || !nl) {
        free(s);
        return 0;
    }
    char sf[600];
    memcpy(sf, out, outlen);
    sf[outlen] = 0;
    /* The client-final message: the fuzzer's, or the harness's around its pieces. */
    const char *rest = nl + 1;
    size_t restlen = (size_t)(end - rest);
    char *final = malloc(restlen * 2 + 700);
    size_t flen;
    if (!assisted) {
        memcpy(final, rest, restlen);
        flen = restlen;
    } else {
        const char *nl2 = memchr(rest, '\n', restlen);
        size_t cbn = nl2 ? (size_t)(nl2 - rest) : restlen;
        const char *ext = nl2 ? nl2 + 1 : "";
        size_t extn = nl2 ? (size_t)(end - ext) : 0;
        memcpy(final, "c=", 2);
        flen = 2 + rt_base64_encode(rest, cbn, final + 2);
        flen += (size_t)sprintf(final + flen, ",r=%.*s", (int)(strchr(sf, ',') - sf - 2), sf + 2);
        memcpy(final + flen, ext, extn);
        flen += extn;
    }
    /* AuthMessage over what the harness has so far, for its proof. */
    const char *bare = in;
    for (int commas = 0; commas < 2 && bare < in + cflen; bare++)
        commas += *bare == ',';
    size_t barelen = cflen - (size_t)(bare - in);
    char *auth = malloc(cflen + outlen + flen + 128); /* the proof comes after */
    size_t an = 0;
    memcpy(auth + an, bare, barelen);
    an += barelen;
    auth[an++] = ',';
    memcpy(auth + an, sf, outlen);
    an += outlen;
    auth[an++] = ',';
    char proof[64];
    if (assisted) {
        memcpy(auth + an, final, flen);
        client_proof_salted(hash, salted[hash], auth, an + flen, proof, NULL);
        if (!right_proof)
            proof[0] = proof[0] == 'A' ? 'B' : 'A';
        flen += (size_t)sprintf(final + flen, ",p=%s", proof);
    }
    rc = rt_scram_client_final(s, final, flen, cb_data, sizeof(cb_data), &out, &outlen);
    if ((rc == 0) != (rt_scram_failure(s) == RT_SCRAM_OK) ||
        (rc && rc != RT_EPROTO && rc != RT_EACCES))
        abort();
    if (rc == 0) {
        /* Only the right client could have: its proof over this very message, c= the gs2
           header with this connection's data, a known user, and v= its expectation. */
        const char *p, *c;
        size_t pn, cn;
        if (unknown || !first_last(final, flen, &c, &cn, &p, &pn))
            abort();
        size_t cfwp = (size_t)(p - 3 - final);
        memcpy(auth + an, final, cfwp);
        uint8_t sig[32];
        client_proof_salted(hash, salted[hash], auth, an + cfwp, proof, sig);
        if (pn != strlen(proof) || memcmp(p, proof, pn) != 0)
            abort();
        static uint8_t want[RT_SCRAM_MSG_MAX + sizeof(cb_data)];
        static char wantc[RT_BASE64_LEN(sizeof(want)) + 1];
        size_t gs2 = (size_t)(bare - in), wn = gs2;
        memcpy(want, in, gs2);
        if (in[0] == 'p') {
            memcpy(want + wn, cb_data, sizeof(cb_data));
            wn += sizeof(cb_data);
        }
        char v[64] = "v=";
        if (cn != rt_base64_encode(want, wn, wantc) || memcmp(c, wantc, cn) != 0)
            abort();
        size_t vn = 2 + rt_base64_encode(sig, rt_scram_key_len(hash), v + 2);
        if (outlen != vn || memcmp(out, v, vn) != 0)
            abort();
    }
    free(auth);
    free(final);
    free(s);
    return 0;
}

/*
** TLS server contexts, their reload, and OpenSSL's memory counted (tls.h).
*/
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "log.h"
#include "rt.h"
#include "tls.h"

/* ---- Contexts ---- */

typedef struct tls_server_s {
    pthread_mutex_t lock; /* ctx, sni, reloads and last_error: accepts on any scheduler, reloads */
    SSL_CTX *ctx;
    SSL_CTX *sni[RT_CONF_MAX_SNI]; /* for conf->tls.sni's names, switched to by select_sni */
    const rt_listen_t *conf;
    const unsigned char *alpn; /* the protocol clients are answered with, as ALPN wire bytes */
    uint64_t reloads;
    char last_error[RT_TLS_WHY_LEN];
} tls_server_t;

/* By listener index (config.h): the MQTT listeners, the HTTP listener, the XMPP ones. */
static tls_server_t *servers[RT_TLS_SERVERS];
static rt_listen_t listeners[RT_TLS_SERVERS]; /* their settings, as at open */

static const unsigned char alpn_mqtt[] = "\x04mqtt";
static const unsigned char alpn_http[] = "\x08http/1.1";
static const unsigned char alpn_xmpp[] = "\x0bxmpp-client"; /* XEP-0368 */

/* OpenSSL's first queued error, for a message; clears the queue. */
static void openssl_error(char *out, size_t len)
{
    unsigned long e = ERR_get_error();
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    snprintf(out, len, "%s", reason ? reason : "unknown error");
    ERR_clear_error();
}

/*
** Why the file a tls key names cannot be used, before OpenSSL tries it (which says "unknown
** error" or "system lib" of a file that is missing or unreadable): key, path and the
** system's words in why; false when it can be read.
*/
static bool unreadable(const char *key, const char *path, char *why, size_t whylen)
{
    if (access(path, R_OK) == 0)
        return false;
    snprintf(why, whylen, "tls.%s %.200s: %s", key, path, strerror(errno));
    return true;
}

/* The listener's protocol (arg, as ALPN wire bytes) when the client offers it. */
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned inlen, void *arg)
{
    (void)ssl;
    const unsigned char *want = arg;
    unsigned char *chosen;
    /* A client offering other protocols only goes on without ALPN (as Mosquitto does):
       refusing it would break clients that send a generic list. */
    if (SSL_select_next_proto(&chosen, outlen, want, (unsigned)want[0] + 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}

/* Modern suites only: ECDHE with AES-GCM or ChaCha20 for TLS 1.2 (1.3's are all fine). */
#define TLS12_CIPHERS "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"

/* verify = "request": the chain is checked and its result kept (SSL_get_verify_result) for
   the protocol to weigh, but the handshake goes on whatever it is. */
static int take_any_certificate(int preverified, X509_STORE_CTX *store)
{
    (void)preverified;
    (void)store;
    return 1;
}

static SSL_CTX *build_context(const tls_server_t *s, const char *cert, const char *key,
                              SSL_CTX *previous, char *why, size_t whylen)
{
    const rt_conf_tls_t *t = &s->conf->tls;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        openssl_error(why, whylen);
        return NULL;
    }
    char err[RT_TLS_WHY_LEN];
    const char *step = NULL;
    if (unreadable("cert", cert, why, whylen) || unreadable("key", key, why, whylen) ||
        (t->ca[0] && unreadable("ca", t->ca, why, whylen)) ||
        (t->crl[0] && unreadable("crl", t->crl, why, whylen))) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, t->min_version == RT_TLS_1_3 ? TLS1_3_VERSION : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 1);
    static const unsigned char sid_ctx[] = "rtd";
    SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof(sid_ctx) - 1);
    if (SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) != 1)
        step = "cipher list";
    else if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        step = cert; /* read, but not a certificate chain OpenSSL takes */
    else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        step = key;
    else if (SSL_CTX_check_private_key(ctx) != 1)
        step = "key does not match the certificate";
    else if (t->ca[0] && SSL_CTX_load_verify_locations(ctx, t->ca, NULL) != 1)
        step = t->ca;
    if (!step && t->ca[0]) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(t->ca);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
    }
    if (!step && t->crl[0]) {
        X509_STORE *store = SSL_CTX_get_cert_store(ctx);
        X509_LOOKUP *lookup = X509_STORE_add_lookup(store, X509_LOOKUP_file());
        if (!lookup || X509_load_crl_file(lookup, t->crl, X509_FILETYPE_PEM) < 1)
            step = t->crl;
        else
            X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
    }
    if (step) {
        openssl_error(err, sizeof(err));
        snprintf(why, whylen, "%.120s: %.120s", step, err);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (t->verify != RT_TLS_VERIFY_NONE)
        SSL_CTX_set_verify(
            ctx,
            SSL_VERIFY_PEER |
                (t->verify == RT_TLS_VERIFY_REQUIRED ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
            t->verify == RT_TLS_VERIFY_REQUEST ? take_any_certificate : NULL);
    SSL_CTX_set_alpn_select_cb(ctx, select_alpn, (void *)s->alpn);
    /* Tickets issued before a reload still resume after it. */
    unsigned char keys[80];
    if (previous && SSL_CTX_get_tlsext_ticket_keys(previous, keys, sizeof(keys)) == 1)
        SSL_CTX_set_tlsext_ticket_keys(ctx, keys, sizeof(keys));
    return ctx;
}

/* A name from tls.sni against the client's: equal ignoring case, or "*.domain" for any one
   label in front of domain. */
static bool sni_matches(const char *pattern, const char *name)
{
    if (pattern[0] == '*' && pattern[1] == '.') {
        const char *dot = strchr(name, '.');
        return dot && dot != name && strcasecmp(dot + 1, pattern + 2) == 0;
    }
    return strcasecmp(pattern, name) == 0;
}

/* The client asked for a name by SNI: the certificate for it, else the listener's own. */
static int select_sni(SSL *ssl, int *alert, void *arg)
{
    (void)alert;
    tls_server_t *s = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (!name)
        return SSL_TLSEXT_ERR_NOACK;
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->conf->tls.nsni; i++)
        if (sni_matches(s->conf->tls.sni[i].name, name)) {
            SSL_set_SSL_CTX(ssl, s->sni[i]);
            break;
        }
    pthread_mutex_unlock(&s->lock);
    return SSL_TLSEXT_ERR_OK;
}

/*
** The listener's contexts: its own, and one per SNI name, all or none (a reload that fails
** for one name keeps every old one). previous (may be NULL) lends its ticket keys.
*/
static bool build_all(tls_server_t *s, const tls_server_t *previous, SSL_CTX **ctx,
                      SSL_CTX *sni[RT_CONF_MAX_SNI], char *why, size_t whylen)
{
    const rt_conf_tls_t *t = &s->conf->tls;
    *ctx = build_context(s, t->cert, t->key, previous ? previous->ctx : NULL, why, whylen);
    for (unsigned i = 0; *ctx && i < t->nsni; i++) {
        char err[RT_TLS_WHY_LEN];
        sni[i] = build_context(s, t->sni[i].cert, t->sni[i].key, previous ? previous->sni[i] : NULL,
                               err, sizeof(err));
        if (sni[i])
            continue;
        snprintf(why, whylen, "sni %.60s: %.180s", t->sni[i].name, err);
        while (i-- > 0)
            SSL_CTX_free(sni[i]);
        SSL_CTX_free(*ctx);
        *ctx = NULL;
    }
    if (*ctx && t->nsni) {
        SSL_CTX_set_tlsext_servername_callback(*ctx, select_sni);
        SSL_CTX_set_tlsext_servername_arg(*ctx, s);
    }
    return *ctx != NULL;
}

static void format_listener(const rt_listen_t *l, char *out, size_t len)
{
    bool v6 = strchr(l->host, ':') != NULL;
    snprintf(out, len, "%s%.64s%s:%d", v6 ? "[" : "", l->host, v6 ? "]" : "", l->port);
}

int rt_tls_open(const rt_conf_t *conf, char *why, size_t whylen)
{
    for (unsigned i = 0; i < RT_TLS_SERVERS; i++) {
        bool http = i == RT_TLS_HTTP, xmpp = i >= RT_CONF_XMPP_LISTENER(0);
        const rt_listen_t *l = rt_conf_listener(conf, i);
        if (!l || !l->tls_on)
            continue;
        listeners[i] = *l;
        tls_server_t *s = calloc(1, sizeof(*s));
        char err[RT_TLS_WHY_LEN] = "out of memory", where[80];
        format_listener(&listeners[i], where, sizeof(where));
        if (s) {
            s->conf = &listeners[i];
            s->alpn = http || l->websocket[0] ? alpn_http : xmpp ? alpn_xmpp : alpn_mqtt;
        }
        if (!s || !build_all(s, NULL, &s->ctx, s->sni, err, sizeof(err))) {
            snprintf(why, whylen, "%s %s: TLS: %.200s",
                     http ? "http" : xmpp ? "xmpp listener" : "listener", where, err);
            free(s);
            rt_tls_close();
            return RT_EINVAL;
        }
        pthread_mutex_init(&s->lock, NULL);
        servers[i] = s;
    }
    return 0;
}

void rt_tls_close(void)
{
    for (unsigned i = 0; i < RT_TLS_SERVERS; i++) {
        if (!servers[i])
            continue;
        SSL_CTX_free(servers[i]->ctx);
        for (unsigned k = 0; k < servers[i]->conf->tls.nsni; k++)
            SSL_CTX_free(servers[i]->sni[k]);
        pthread_mutex_destroy(&servers[i]->lock);
        free(servers[i]);
        servers[i] = NULL;
    }
}

SSL *rt_tls_accept(unsigned listener)
{
    tls_server_t *s = listener < RT_TLS_SERVERS ? servers[listener] : NULL;
    if (!s)
        return NULL;
    /* Under the lock: a reload frees the old context once it has no SSL taking it. */
    pthread_mutex_lock(&s->lock);
    SSL *ssl = SSL_new(s->ctx);
    pthread_mutex_unlock(&s->lock);
    return ssl;
}

int rt_tls_reload(char *report, size_t reportlen)
{
    int result = 0;
    size_t used = 0;
    if (report && reportlen)
        report[0] = 0;
    for (unsigned i = 0; i < RT_TLS_SERVERS; i++) {
        tls_server_t *s = servers[i];
        if (!s)
            continue;
        char where[80], err[RT_TLS_WHY_LEN];
        format_listener(s->conf, where, sizeof(where));
        /* Built outside the lock (files, key checks); only the swap holds accepts up. The
           old contexts live on in the connections that took them (SSL_new's reference). */
        tls_server_t old = {.conf = s->conf, .alpn = s->alpn};
        pthread_mutex_lock(&s->lock);
        old.ctx = s->ctx;
        memcpy(old.sni, s->sni, sizeof(old.sni));
        for (unsigned k = 0; k < s->conf->tls.nsni; k++)
            SSL_CTX_up_ref(old.sni[k]);
        SSL_CTX_up_ref(old.ctx);
        pthread_mutex_unlock(&s->lock);
        SSL_CTX *ctx, *sni[RT_CONF_MAX_SNI] = {0};
        bool ok = build_all(s, &old, &ctx, sni, err, sizeof(err));
        pthread_mutex_lock(&s->lock);
        if (ok) {
            s->ctx = ctx;
            memcpy(s->sni, sni, sizeof(sni));
            s->reloads++;
            s->last_error[0] = 0;
        } else {
            snprintf(s->last_error, sizeof(s->last_error), "%s", err);
        }
        pthread_mutex_unlock(&s->lock);
        /* Our references, and the server's too when they were replaced. */
        for (int times = ok ? 2 : 1; times > 0; times--) {
            SSL_CTX_free(old.ctx);
            for (unsigned k = 0; k < s->conf->tls.nsni; k++)
                SSL_CTX_free(old.sni[k]);
        }
        if (ok) {
            rt_log(RT_LOG_INFO, "tls.reloaded", "listener=%s", where);
        } else {
            rt_log(RT_LOG_WARNING, "tls.reload_failed", "listener=%s reason=%s", where, err);
            if (!result)
                result = RT_EINVAL;
        }
        if (report && used < reportlen)
            used += (size_t)snprintf(report + used, reportlen - used, "%s %s%s\n", where,
                                     ok ? "reloaded" : "failed: ", ok ? "" : err);
    }
    return result;
}

static void format_time(const ASN1_TIME *t, char *out, size_t len, long *days_left)
{
    struct tm tm;
    if (!t || ASN1_TIME_to_tm(t, &tm) != 1) {
        snprintf(out, len, "?");
        *days_left = 0;
        return;
    }
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int days = 0, secs = 0;
    ASN1_TIME_diff(&days, &secs, NULL, t);
    *days_left = days;
}

bool rt_tls_info(unsigned listener, rt_tls_info_t *out)
{
    tls_server_t *s = listener < RT_TLS_SERVERS ? servers[listener] : NULL;
    if (!s)
        return false;
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->lock);
    X509 *cert = SSL_CTX_get0_certificate(s->ctx);
    if (cert) {
        X509_NAME_oneline(X509_get_subject_name(cert), out->subject, sizeof(out->subject));
        format_time(X509_get0_notAfter(cert), out->not_after, sizeof(out->not_after),
                    &out->days_left);
    }
    out->reloads = s->reloads;
    snprintf(out->last_error, sizeof(out->last_error), "%s", s->last_error);
    pthread_mutex_unlock(&s->lock);
    return true;
}

static void cert_entry(rt_tls_cert_t *o, unsigned listener, const char *sni, SSL_CTX *ctx)
{
    memset(o, 0, sizeof(*o));
    o->listener = listener;
    snprintf(o->sni, sizeof(o->sni), "%s", sni);
    X509 *cert = ctx ? SSL_CTX_get0_certificate(ctx) : NULL;
    struct tm tm;
    if (!cert)
        return;
    X509_NAME_oneline(X509_get_subject_name(cert), o->subject, sizeof(o->subject));
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1)
        o->not_after_s = (int64_t)timegm(&tm);
}

size_t rt_tls_certificates(rt_tls_cert_t *out, size_t max)
{
    size_t n = 0;
    for (unsigned i = 0; i < RT_TLS_SERVERS; i++) {
        tls_server_t *s = servers[i];
        if (!s)
            continue;
        pthread_mutex_lock(&s->lock);
        if (n < max)
            cert_entry(&out[n], i, "", s->ctx);
        n++;
        for (unsigned k = 0; k < s->conf->tls.nsni; k++, n++)
            if (n < max)
                cert_entry(&out[n], i, s->conf->tls.sni[k].name, s->sni[k]);
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

void rt_tls_failure_reason(SSL *ssl, char *out, size_t len)
{
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) {
        snprintf(out, len, "%s", X509_verify_cert_error_string(v));
        ERR_clear_error();
        return;
    }
    openssl_error(out, len);
}

unsigned rt_tls_bindings(SSL *ssl)
{
    if (!ssl || !SSL_is_init_finished(ssl))
        return 0;
    return (SSL_version(ssl) == TLS1_3_VERSION ? RT_TLS_CB_EXPORTER : 0) |
           (SSL_get_certificate(ssl) ? RT_TLS_CB_END_POINT : 0);
}

size_t rt_tls_binding(SSL *ssl, unsigned type, uint8_t *out, size_t cap)
{
    if (!(rt_tls_bindings(ssl) & type))
        return 0;
    if (type == RT_TLS_CB_EXPORTER) {
        static const char label[] = "EXPORTER-Channel-Binding";
        if (cap < 32 || SSL_export_keying_material(ssl, out, 32, label, sizeof(label) - 1, NULL,
                                                   0, 0) != 1)
            return 0;
        return 32;
    }
    X509 *cert = SSL_get_certificate(ssl);
    int md_nid = NID_undef, pk_nid;
    if (!OBJ_find_sigid_algs(X509_get_signature_nid(cert), &md_nid, &pk_nid))
        return 0;
    const EVP_MD *md = md_nid == NID_md5 || md_nid == NID_sha1 ? EVP_sha256()
                                                                : EVP_get_digestbynid(md_nid);
    unsigned n = 0;
    if (!md || (size_t)EVP_MD_get_size(md) > cap || X509_digest(cert, md, out, &n) != 1)
        return 0;
    return n;
}

int rt_tls_peer_other_names(SSL *ssl, const char *oid,
                            bool (*fn)(const char *value, size_t len, void *arg), void *arg)
{
    X509 *cert = SSL_get0_peer_certificate(ssl);
    if (!cert || SSL_get_verify_result(ssl) != X509_V_OK)
        return -1;
    ASN1_OBJECT *want = OBJ_txt2obj(oid, 1);
    GENERAL_NAMES *names = want ? X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL) : NULL;
    int n = 0;
    bool stop = false;
    for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && !stop; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
        if (g->type != GEN_OTHERNAME || OBJ_cmp(g->d.otherName->type_id, want) != 0)
            continue;
        const ASN1_TYPE *v = g->d.otherName->value;
        if (!v || v->type != V_ASN1_UTF8STRING || v->value.utf8string->length <= 0)
            continue;
        const ASN1_UTF8STRING *s = v->value.utf8string;
        if (memchr(s->data, 0, (size_t)s->length))
            continue;
        n++;
        stop = fn && fn((const char *)s->data, (size_t)s->length, arg);
    }
    GENERAL_NAMES_free(names);
    ASN1_OBJECT_free(want);
    return n;
}

typedef struct {
    const char *domain;
    bool found;
} domain_match_t;

static bool same_domain(const char *value, size_t len, void *arg)
{
    domain_match_t *m = arg;
    m->found = len == strlen(m->domain) && strncasecmp(value, m->domain, len) == 0;
    return m->found;
}

bool rt_tls_peer_names_domain(SSL *ssl, const char *domain)
{
    X509 *cert = SSL_get0_peer_certificate(ssl);
    if (!cert || SSL_get_verify_result(ssl) != X509_V_OK)
        return false;
    if (X509_check_host(cert, domain, strlen(domain), X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, NULL) ==
        1)
        return true;
    domain_match_t m = {domain, false};
    rt_tls_peer_other_names(ssl, "1.3.6.1.5.5.7.8.5", same_domain, &m);
    return m.found;
}

/* Text that does not fit is dropped whole: a name cut short could be another's. */
static void name_cn(const X509_NAME *name, char *out, size_t len)
{
    out[0] = 0;
    int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
    const ASN1_STRING *s = i < 0 ? NULL : X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char *utf8 = NULL;
    int n = s ? ASN1_STRING_to_UTF8(&utf8, s) : -1;
    if (n > 0 && (size_t)n < len && !memchr(utf8, 0, (size_t)n)) {
        memcpy(out, utf8, (size_t)n);
        out[n] = 0;
    }
    OPENSSL_free(utf8);
}

static void name_rfc2253(const X509_NAME *name, char *out, size_t len)
{
    out[0] = 0;
    BIO *b = BIO_new(BIO_s_mem());
    if (!b)
        return;
    if (X509_NAME_print_ex(b, name, 0, XN_FLAG_RFC2253) >= 0) {
        int n = BIO_read(b, out, (int)len);
        out[n > 0 && (size_t)n < len ? n : 0] = 0;
    }
    BIO_free(b);
}

bool rt_tls_peer_cert(SSL *ssl, char *cn, size_t cnlen, char *subject, size_t subjectlen,
                      uint8_t sha256[32])
{
    X509 *cert = SSL_get0_peer_certificate(ssl);
    unsigned n = 0;
    if (!cert || SSL_get_verify_result(ssl) != X509_V_OK ||
        X509_digest(cert, EVP_sha256(), sha256, &n) != 1 || n != 32)
        return false;
    name_cn(X509_get_subject_name(cert), cn, cnlen);
    name_rfc2253(X509_get_subject_name(cert), subject, subjectlen);
    return true;
}

bool rt_tls_peer_identity(SSL *ssl, char *out, size_t len)
{
    X509 *cert = SSL_get0_peer_certificate(ssl);
    if (!cert || len == 0)
        return false;
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, out, (int)len);
    if (n > 0 && (size_t)n < len)
        return true;
    GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    bool found = false;
    for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && !found; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
        if (g->type != GEN_DNS && g->type != GEN_EMAIL)
            continue;
        const ASN1_IA5STRING *s = g->d.ia5;
        if (s->length > 0 && (size_t)s->length < len &&
            memchr(s->data, 0, (size_t)s->length) == NULL) {
            memcpy(out, s->data, (size_t)s->length);
            out[s->length] = 0;
            found = true;
        }
    }
    GENERAL_NAMES_free(names);
    return found;
}

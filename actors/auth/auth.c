/*
** The process-wide login policy: the password table, anonymous_from and the slow-down
** table in force, swapped in by rt_auth_configure while logins read them, the decision
** itself, and its counters.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl.h"
#include "auth_http.h"
#include "auth_impl.h"
#include "jwt.h"
#include "log.h"
#include "rcu.h"

const char *rt_auth_result_name(int result)
{
    switch (result) {
    case RT_AUTH_OK:
        return "ok";
    case RT_AUTH_BAD_PASSWORD:
        return "bad_password";
    case RT_AUTH_UNKNOWN_USER:
        return "unknown_user";
    case RT_AUTH_ANONYMOUS_REFUSED:
        return "anonymous_refused";
    case RT_AUTH_PENDING:
        return "pending";
    case RT_AUTH_ANONYMOUS:
        return "anonymous";
    case RT_AUTH_UNAVAILABLE:
        return "unavailable";
    }
    return "unknown";
}

static rt_rcu_t current_table; /* rt_auth_t *, NULL: no password file */
static atomic_bool allow_anonymous = true;

/* anonymous_from, as configured: read by every CONNECT no password file vouches for. */
typedef struct {
    unsigned n;
    rt_conf_net_t nets[RT_CONF_MAX_NETS];
} anonymous_nets_t;
static rt_rcu_t anonymous_from; /* anonymous_nets_t *; NULL (never configured): loopback */
static _Atomic(rt_auth_limiter_t *) limiter;

/* The chain (the setting auth), as configured: NULL when not set (the password file alone). */
typedef struct {
    unsigned n;
    struct {
        rt_authn_kind_t kind;
        rt_jwt_t *jwt;       /* kind jwt: its keys */
        rt_authhttp_t *http; /* kind http: its client and cache */
    } a[RT_CONF_MAX_AUTH];
    unsigned pool; /* threads the http authenticators want (auth_pool.c); 0: none calls */
} chain_t;
static rt_rcu_t current_chain;
static atomic_bool chain_calls; /* the chain in force has an http authenticator */

bool rt__auth_chain_calls(void)
{
    return atomic_load(&chain_calls);
}

/* The authenticators that call a service are the ones told the certificate. */
bool rt_auth_wants_tls(void)
{
    return atomic_load_explicit(&chain_calls, memory_order_relaxed);
}

static void chain_free(chain_t *ch)
{
    for (unsigned i = 0; ch && i < ch->n; i++) {
        rt_jwt_free(ch->a[i].jwt);
        rt_authhttp_free(ch->a[i].http);
    }
    free(ch);
}

/* conf's chain, its keys loaded: 0 with *out (NULL for none), or RT_E* with err. */
static int chain_load(const rt_conf_t *conf, chain_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!conf->nauth)
        return 0;
    chain_t *ch = calloc(1, sizeof(*ch));
    if (!ch) {
        snprintf(err, errlen, "auth: out of memory");
        return RT_ENOMEM;
    }
    for (unsigned i = 0; i < conf->nauth; i++) {
        ch->a[i].kind = (rt_authn_kind_t)conf->auth[i].kind;
        ch->n = i + 1;
        int rc = ch->a[i].kind == RT_AUTHN_JWT
                     ? rt_jwt_load(&conf->auth[i], &ch->a[i].jwt, err, errlen)
                 : ch->a[i].kind == RT_AUTHN_HTTP
                     ? rt_authhttp_load(&conf->auth[i], &ch->a[i].http, err, errlen)
                     : 0;
        if (ch->a[i].kind == RT_AUTHN_HTTP && (unsigned)conf->auth[i].pool_size > ch->pool)
            ch->pool = (unsigned)conf->auth[i].pool_size;
        if (rc) {
            chain_free(ch);
            return rc;
        }
    }
    *out = ch;
    return 0;
}

void rt_auth_grant_free(rt_auth_grant_t *g)
{
    free(g->acl);
    memset(g, 0, sizeof(*g));
}
static pthread_mutex_t configure_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    atomic_uint_fast64_t successes, bad_password, unknown_user, anonymous_refused, reloads;
} counters;

/* Loads path ("" or NULL: none) into *out (NULL for none): a file others could change
   would let them add a user, so it is refused (rt_file_trusted). */
static int load_optional(const char *path, rt_auth_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!path || !*path)
        return 0;
    int rc = rt_file_trusted(-1, path, "password_file", err, errlen);
    return rc ? rc : rt_auth_load(path, out, err, errlen);
}

int rt_auth_reload(const char *path, char *err, size_t errlen)
{
    rt_auth_t *next;
    int rc = load_optional(path, &next, err, errlen);
    if (rc)
        return rc;
    rt_auth_free(rt_rcu_swap(&current_table, next));
    atomic_fetch_add(&counters.reloads, 1);
    return 0;
}

int rt_auth_configure(const rt_conf_t *conf, char *err, size_t errlen)
{
    pthread_mutex_lock(&configure_lock);
    rt_auth_t *users = NULL;
    rt_acl_t *acl = NULL;
    chain_t *chain = NULL;
    int rc = load_optional(conf->password_file, &users, err, errlen);
    if (rc == 0)
        rc = chain_load(conf, &chain, err, errlen);
    if (rc == 0 && chain && chain->pool && rt__auth_pool_start(chain->pool) != 0) {
        snprintf(err, errlen, "auth: cannot start the authenticator pool's threads");
        rc = RT_ENOMEM;
    }
    if (rc == 0 && conf->acl_file[0])
        rc = rt_file_trusted(-1, conf->acl_file, "acl_file", err, errlen);
    if (rc == 0 && conf->acl_file[0])
        rc = rt_acl_load(conf->acl_file, &acl, err, errlen);
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (rc == 0 && !l) {
        rc = rt_auth_limiter_new((uint32_t)conf->auth_max_delay_ms, &l);
        if (rc)
            snprintf(err, errlen, "auth: cannot make the slow-down table: %s", rt_strerror(rc));
        else
            atomic_store(&limiter, l);
    }
    anonymous_nets_t *nets = rc ? NULL : malloc(sizeof(*nets));
    if (rc == 0 && !nets) {
        snprintf(err, errlen, "auth: out of memory");
        rc = RT_ENOMEM;
    }
    if (rc) {
        rt_auth_free(users);
        rt_acl_free(acl);
        chain_free(chain);
        pthread_mutex_unlock(&configure_lock);
        return rc;
    }
    nets->n = conf->nanonymous_from;
    memcpy(nets->nets, conf->anonymous_from, sizeof(nets->nets));
    free(rt_rcu_swap(&anonymous_from, nets));
    rt__auth_limiter_set_max_delay(l, (uint32_t)conf->auth_max_delay_ms);
    atomic_store(&allow_anonymous, conf->allow_anonymous);
    rt_auth_free(rt_rcu_swap(&current_table, users));
    atomic_store(&chain_calls, chain && chain->pool);
    chain_free(rt_rcu_swap(&current_chain, chain));
    rt_acl_install(acl);
    atomic_fetch_add(&counters.reloads, 1);
    pthread_mutex_unlock(&configure_lock);
    return 0;
}

void rt_auth_set_allow_anonymous(bool allow)
{
    atomic_store(&allow_anonymous, allow);
}

bool rt_auth_allow_anonymous(void)
{
    return atomic_load(&allow_anonymous);
}

void rt_auth_stop_pool(void)
{
    rt__auth_pool_stop();
}

void rt_auth_shutdown(void)
{
    rt_auth_free(rt_rcu_swap(&current_table, NULL));
    atomic_store(&chain_calls, false); /* its pool was stopped before the runtime (rtd.c) */
    chain_free(rt_rcu_swap(&current_chain, NULL));
    free(rt_rcu_swap(&anonymous_from, NULL));
    rt_acl_install(NULL);
    rt_auth_limiter_free(atomic_exchange(&limiter, NULL));
}

/* Whether an anonymous client may come from addr (NULL: not an IP peer, refused). */
static bool anonymous_allowed_from(const rt_auth_addr_t *addr)
{
    if (!addr)
        return false;
    const anonymous_nets_t *nets = rt_rcu_enter(&anonymous_from);
    bool ok = nets ? rt_conf_net_match(nets->nets, nets->n, addr->b)
                   : rt_conf_net_match(rt_conf_loopback, RT_CONF_NLOOPBACK, addr->b);
    rt_rcu_leave();
    return ok;
}

/*
** The password file's say on a login: RT_AUTH_OK, RT_AUTH_BAD_PASSWORD, RT_AUTH_PENDING, or
** RT_AUTH_UNKNOWN_USER (not its user: the next authenticator judges) and
** RT_AUTH_ANONYMOUS_REFUSED (no user name, or no file: it has nothing to say).
*/
static int file_says(const rt_auth_request_t *q, bool may_hash)
{
    if (!q->user)
        return RT_AUTH_ANONYMOUS_REFUSED;
    int result = RT_AUTH_ANONYMOUS_REFUSED;
    const rt_auth_t *a = rt_rcu_enter(&current_table);
    if (a) {
        result = rt__auth_check(a, q->user, q->pw, q->pw ? q->pwlen : 0, may_hash);
        if (result == RT_AUTH_OK && !q->pw)
            result = RT_AUTH_BAD_PASSWORD; /* a listed user must give a password */
    }
    rt_rcu_leave();
    return result;
}

/* A JWT authenticator's say: as file_says; a password that is no token passes. */
static int jwt_says(const rt_jwt_t *j, const rt_auth_request_t *q, bool may_wait,
                    rt_auth_grant_t *grant)
{
    if (!q->pw)
        return RT_AUTH_ANONYMOUS_REFUSED;
    if (!may_wait && !rt_jwt_cheap(j)) /* a public key's signature: the verifier's */
        return RT_AUTH_PENDING;
    rt_auth_grant_t g;
    const char *why;
    rt_jwt_verdict_t v = rt_jwt_check(j, q->user, q->clientid ? q->clientid : "", q->pw, q->pwlen,
                                      (int64_t)time(NULL), &g, &why);
    if (v == RT_JWT_IGNORE)
        return RT_AUTH_ANONYMOUS_REFUSED;
    if (v == RT_JWT_DENY) {
        rt_log(RT_LOG_INFO, "auth.jwt_refused", "user=%s client=%s %s", q->user ? q->user : "-",
               q->clientid ? q->clientid : "-", why);
        return RT_AUTH_BAD_PASSWORD;
    }
    if (grant)
        *grant = g;
    else
        rt_auth_grant_free(&g);
    return RT_AUTH_OK;
}

/* The chain's verdict, before the anonymous rules; *unknown when a file did not know the user. */
static int chain_says(const rt_auth_request_t *q, bool may_wait, rt_auth_grant_t *grant)
{
    const chain_t *ch = rt_rcu_enter(&current_chain);
    unsigned n = ch ? ch->n : 1;
    int result = RT_AUTH_ANONYMOUS_REFUSED;
    bool unknown = false;
    for (unsigned i = 0; i < n && result == RT_AUTH_ANONYMOUS_REFUSED; i++) {
        rt_authn_kind_t kind = ch ? ch->a[i].kind : RT_AUTHN_FILE;
        result = kind == RT_AUTHN_JWT    ? jwt_says(ch->a[i].jwt, q, may_wait, grant)
                 : kind == RT_AUTHN_HTTP ? rt_authhttp_says(ch->a[i].http, q, may_wait, grant)
                                         : file_says(q, may_wait);
        if (result == RT_AUTH_UNKNOWN_USER) {
            unknown = true;
            result = RT_AUTH_ANONYMOUS_REFUSED;
        }
    }
    rt_rcu_leave();
    return result == RT_AUTH_ANONYMOUS_REFUSED && unknown ? RT_AUTH_UNKNOWN_USER : result;
}

int rt_auth_decide(const rt_auth_request_t *q, bool may_wait, uint32_t *delay_ms,
                   rt_auth_grant_t *grant)
{
    *delay_ms = 0;
    if (grant)
        memset(grant, 0, sizeof(*grant));
    int result = chain_says(q, may_wait, grant);
    if (result == RT_AUTH_ANONYMOUS_REFUSED && atomic_load(&allow_anonymous) &&
        anonymous_allowed_from(q->addr))
        result = q->user ? RT_AUTH_ANONYMOUS : RT_AUTH_OK;
    if (result == RT_AUTH_PENDING)
        return result; /* undecided: neither counted nor noted against the address */
    bool admitted = result == RT_AUTH_OK || result == RT_AUTH_ANONYMOUS;
    atomic_uint_fast64_t *counter = admitted                         ? &counters.successes
                                    : result == RT_AUTH_BAD_PASSWORD ? &counters.bad_password
                                    : result == RT_AUTH_UNKNOWN_USER ? &counters.unknown_user
                                                                     : &counters.anonymous_refused;
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (!q->addr || !l)
        return result;
    if (admitted)
        rt_auth_limiter_succeed(l, q->addr);
    else
        *delay_ms = rt_auth_limiter_fail(l, q->addr, rt_mono_ms());
    return result;
}

int rt_auth_login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw, size_t pwlen,
                  uint32_t *delay_ms)
{
    rt_auth_request_t q = {.addr = addr, .user = user, .pw = pw, .pwlen = pwlen};
    return rt_auth_decide(&q, true, delay_ms, NULL);
}

int rt_auth_login_quick(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw,
                        size_t pwlen, uint32_t *delay_ms)
{
    rt_auth_request_t q = {.addr = addr, .user = user, .pw = pw, .pwlen = pwlen};
    return rt_auth_decide(&q, false, delay_ms, NULL);
}

void rt_auth_stats(rt_auth_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->successes = atomic_load(&counters.successes);
    out->bad_password = atomic_load(&counters.bad_password);
    out->unknown_user = atomic_load(&counters.unknown_user);
    out->anonymous_refused = atomic_load(&counters.anonymous_refused);
    out->reloads = atomic_load(&counters.reloads);
    const rt_auth_t *a = rt_rcu_enter(&current_table);
    out->users = rt_auth_users(a);
    out->bytes = rt__auth_table_bytes(a);
    rt_rcu_leave();
    const chain_t *ch = rt_rcu_enter(&current_chain);
    for (unsigned i = 0; ch && i < ch->n; i++) {
        if (!ch->a[i].http)
            continue;
        rt_authhttp_stats_t h;
        rt_authhttp_stats(ch->a[i].http, &h);
        out->http_calls += h.calls;
        out->http_errors += h.errors;
        out->http_allowed += h.allowed;
        out->http_denied += h.denied;
        out->http_ignored += h.ignored;
        out->http_cache_hits += h.cache_hits;
        out->http_cache_misses += h.cache_misses;
        out->http_cache_entries += h.cache_entries;
        out->http_connects += h.connects;
    }
    rt_rcu_leave();
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (l) {
        out->bytes += rt__auth_limiter_bytes(l);
        size_t entries;
        rt_auth_limiter_usage(l, &entries, &out->delay_evictions);
        out->delay_entries = entries;
    }
}

/*
** The process-wide login policy: the password table, anonymous_from and the slow-down
** table in force, swapped in by rt_auth_configure while logins read them, the decision
** itself, and its counters.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "auth_impl.h"
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
    int rc = load_optional(conf->password_file, &users, err, errlen);
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
        pthread_mutex_unlock(&configure_lock);
        return rc;
    }
    nets->n = conf->nanonymous_from;
    memcpy(nets->nets, conf->anonymous_from, sizeof(nets->nets));
    free(rt_rcu_swap(&anonymous_from, nets));
    rt__auth_limiter_set_max_delay(l, (uint32_t)conf->auth_max_delay_ms);
    atomic_store(&allow_anonymous, conf->allow_anonymous);
    rt_auth_free(rt_rcu_swap(&current_table, users));
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

void rt_auth_shutdown(void)
{
    rt_auth_free(rt_rcu_swap(&current_table, NULL));
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

/* rt_auth_login and rt_auth_login_quick: may_hash false leaves a full hash undone. */
static int decide_login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw,
                        size_t pwlen, bool may_hash, uint32_t *delay_ms)
{
    *delay_ms = 0;
    int result = RT_AUTH_ANONYMOUS_REFUSED; /* anonymous until a password table decides */
    if (user) {
        const rt_auth_t *a = rt_rcu_enter(&current_table);
        if (a) {
            result = rt__auth_check(a, user, pw, pw ? pwlen : 0, may_hash);
            if (result == RT_AUTH_OK && !pw)
                result = RT_AUTH_BAD_PASSWORD; /* a listed user must give a password */
        }
        rt_rcu_leave();
    }
    if (result == RT_AUTH_ANONYMOUS_REFUSED && atomic_load(&allow_anonymous) &&
        anonymous_allowed_from(addr))
        result = user ? RT_AUTH_ANONYMOUS : RT_AUTH_OK;
    if (result == RT_AUTH_PENDING)
        return result; /* undecided: neither counted nor noted against the address */
    bool admitted = result == RT_AUTH_OK || result == RT_AUTH_ANONYMOUS;
    atomic_uint_fast64_t *counter = admitted                         ? &counters.successes
                                    : result == RT_AUTH_BAD_PASSWORD ? &counters.bad_password
                                    : result == RT_AUTH_UNKNOWN_USER ? &counters.unknown_user
                                                                     : &counters.anonymous_refused;
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (!addr || !l)
        return result;
    if (admitted)
        rt_auth_limiter_succeed(l, addr);
    else
        *delay_ms = rt_auth_limiter_fail(l, addr, rt_mono_ms());
    return result;
}

int rt_auth_login(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw, size_t pwlen,
                  uint32_t *delay_ms)
{
    return decide_login(addr, user, pw, pwlen, true, delay_ms);
}

int rt_auth_login_quick(const rt_auth_addr_t *addr, const char *user, const uint8_t *pw,
                        size_t pwlen, uint32_t *delay_ms)
{
    return decide_login(addr, user, pw, pwlen, false, delay_ms);
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
    rt_auth_limiter_t *l = atomic_load(&limiter);
    if (l) {
        out->bytes += rt__auth_limiter_bytes(l);
        size_t entries;
        rt_auth_limiter_usage(l, &entries, &out->delay_evictions);
        out->delay_entries = entries;
    }
}

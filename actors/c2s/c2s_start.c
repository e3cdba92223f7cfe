/*
** The c2s layer's start: its settings made ready once, before the first session, and read by
** every session without a lock after (they change only with a restart).
*/
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "log.h"
#include "sink.h"

c2s_global_t rt__c2s;

int rt__c2s_host_index(const char *domain, size_t len)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    for (unsigned i = 0; x && i < x->nhosts; i++)
        if (strlen(x->hosts[i]) == len && memcmp(x->hosts[i], domain, len) == 0)
            return (int)i;
    return -1;
}

/* Whether host (an index in conf->hosts) is one of the n names. */
static bool host_in(const char (*names)[RT_CONF_XMPP_HOST_MAX], unsigned n, unsigned host)
{
    for (unsigned i = 0; i < n; i++)
        if (strcmp(names[i], rt__c2s.conf->hosts[host]) == 0)
            return true;
    return false;
}

bool rt__c2s_host_anonymous(unsigned host)
{
    return host_in(rt__c2s.conf->anonymous, rt__c2s.conf->nanonymous, host);
}

bool rt__c2s_host_register(unsigned host)
{
    return host_in(rt__c2s.conf->registration, rt__c2s.conf->nregistration, host);
}

int rt__c2s_service_domains(const char *setting, const char *pattern,
                            char (*out)[RT_CONF_XMPP_HOST_MAX], char *err, size_t errlen)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    const char *at = strstr(pattern, "@HOST@");
    for (unsigned i = 0; i < x->nhosts; i++) {
        char *d = out[i];
        int n = at ? snprintf(d, RT_CONF_XMPP_HOST_MAX, "%.*s%s%s", (int)(at - pattern), pattern,
                              x->hosts[i], at + 6)
                   : snprintf(d, RT_CONF_XMPP_HOST_MAX, "%s", pattern);
        if (n < 0 || n >= RT_CONF_XMPP_HOST_MAX) {
            snprintf(err, errlen, "%s: longer than %d bytes for host %s", setting,
                     RT_CONF_XMPP_HOST_MAX - 1, x->hosts[i]);
            return RT_EINVAL;
        }
        char prepared[RT_JID_PART_MAX + 1];
        size_t plen = 0, len = strlen(d);
        const char *why = "";
        if (rt_jid_prep_part(RT_JID_DOMAIN, d, len, prepared, &plen, &why) != 0 || plen != len ||
            memcmp(prepared, d, len) != 0 || rt__c2s_host_index(d, len) >= 0 || (i > 0 && !at)) {
            snprintf(err, errlen, "%s: \"%s\" is not a domain of its own as JIDs have it%s%s%s",
                     setting, d, why && *why ? ": " : "", why ? why : "",
                     i > 0 && !at ? " (with several hosts, write @HOST@ in it)" : "");
            return RT_EINVAL;
        }
    }
    return 0;
}

int rt_c2s_start(rt_pid_t sup, const rt_conf_t *conf,
                 bool (*admit_peer)(int fd, const rt_auth_addr_t *addr), char *err,
                 size_t errlen)
{
    const rt_conf_xmpp_t *x = &conf->xmpp;
    if (!x->on)
        return 0;
    /* A host must be a domainpart as JIDs prepare it, or no JID could ever name it. */
    for (unsigned i = 0; i < x->nhosts; i++) {
        char prepared[RT_JID_PART_MAX + 1];
        size_t plen = 0;
        const char *why = "";
        size_t len = strlen(x->hosts[i]);
        if (rt_jid_prep_part(RT_JID_DOMAIN, x->hosts[i], len, prepared, &plen, &why) != 0 ||
            plen != len || memcmp(prepared, x->hosts[i], len) != 0) {
            snprintf(err, errlen, "xmpp.hosts: \"%s\" is not a domain as JIDs have it%s%s",
                     x->hosts[i], why && *why ? ": " : "", why ? why : "");
            return RT_EINVAL;
        }
    }
    if (!rt__c2s.limiter) {
        int rc = rt_auth_limiter_new((uint32_t)conf->auth_max_delay_ms, &rt__c2s.limiter);
        if (rc) {
            snprintf(err, errlen, "cannot make the XMPP login limiter: %s", rt_strerror(rc));
            return rc;
        }
    }
    if (!rt__c2s.reg_limiter) {
        int rc = rt_auth_rate_new((uint32_t)x->register_rate, 3600 * 1000, &rt__c2s.reg_limiter);
        if (rc) {
            snprintf(err, errlen, "cannot make the XMPP registration limiter: %s", rt_strerror(rc));
            return rc;
        }
    }
    rt__c2s.conf = x;
    rt__c2s.replace = strcmp(x->resource_conflict, "refuse") != 0;
    rt__c2s.admit_peer = admit_peer;
    rt__c2s_stream_configs(x);
    rt__c2s_caps_init();
    int rc = rt__c2s_s2s_start(x, err, errlen);
    if (!rc)
        rc = rt__c2s_store_start(sup, conf, err, errlen);
    if (!rc)
        rt_sinks_set_xmpp(rt__c2s_sink_send); /* rules' rows as messages (the xmpp sink) */
    if (!rc && x->muc_host[0] && conf->cluster.on && !x->cluster_home[0]) /* XMPP.md */
        rt_log(RT_LOG_WARNING, "xmpp.muc_per_node",
               "group chat rooms are this node's own: occupants on other nodes of the cluster "
               "are in rooms of the same names there, apart");
    return rc;
}

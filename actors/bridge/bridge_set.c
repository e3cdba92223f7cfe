/*
** The set of bridges (bridge.h): checked and made from the config at start, one actor each
** under the bridges' group, and read by rtctl and the metrics.
*/
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>

#include "bridge_impl.h"
#include "group.h"

static rt_bridge_t *bridges;
static unsigned nbridges;

void rt__bridge_error(rt_bridge_t *b, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&b->err_lock);
    va_start(ap, fmt);
    vsnprintf(b->last_error, sizeof(b->last_error), fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&b->err_lock);
}

/*
** "mqtt://host:port" or "mqtts://host:port" (port 1883 or 8883 if none; "[v6]" for an IPv6
** address) into b->addr, and the host into b->tls_name unless server_name says another.
*/
static int resolve(rt_bridge_t *b, char *why, size_t whylen)
{
    bool tls = strncmp(b->conf.remote, "mqtts://", 8) == 0;
    const char *hp = b->conf.remote + (tls ? 8 : 7);
    char host[256];
    const char *port = tls ? "8883" : "1883";
    const char *colon = hp[0] == '[' ? strchr(hp, ']') : strrchr(hp, ':');
    size_t hlen = strlen(hp);
    if (hp[0] == '[') {
        if (!colon) {
            snprintf(why, whylen, "bridges.%s.remote: \"[\" without \"]\"", b->conf.name);
            return RT_EINVAL;
        }
        hp++;
        hlen = (size_t)(colon - hp);
        colon = colon[1] == ':' ? colon + 1 : NULL;
    } else if (colon) {
        hlen = (size_t)(colon - hp);
    }
    if (colon)
        port = colon + 1;
    if (!hlen || hlen >= sizeof(host) || !*port || strpbrk(port, "/?#")) {
        snprintf(why, whylen, "bridges.%s.remote: mqtt://host:port, not \"%s\"", b->conf.name,
                 b->conf.remote);
        return RT_EINVAL;
    }
    memcpy(host, hp, hlen);
    host[hlen] = 0;
    snprintf(b->tls_name, sizeof(b->tls_name), "%s",
             b->conf.server_name[0] ? b->conf.server_name : host);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc || !res) {
        snprintf(why, whylen, "bridges.%s.remote: %s: %s", b->conf.name, b->conf.remote,
                 gai_strerror(rc));
        return RT_EINVAL;
    }
    memcpy(&b->addr, res->ai_addr, res->ai_addrlen);
    b->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* mqtts://: a client context verifying the remote against ca_file (or the system's CAs),
   with the client certificate if one is set. */
static int make_tls(rt_bridge_t *b, char *why, size_t whylen)
{
    const rt_conf_bridge_t *c = &b->conf;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    const char *failed = !ctx ? "no TLS context" : NULL;
    if (!failed && SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1)
        failed = "no TLS 1.2";
    if (!failed && (c->ca_file[0] ? SSL_CTX_load_verify_locations(ctx, c->ca_file, NULL)
                                  : SSL_CTX_set_default_verify_paths(ctx)) != 1)
        failed = "ca_file does not load";
    if (!failed && c->cert_file[0] &&
        (SSL_CTX_use_certificate_chain_file(ctx, c->cert_file) != 1 ||
         SSL_CTX_use_PrivateKey_file(ctx, c->key_file, SSL_FILETYPE_PEM) != 1 ||
         SSL_CTX_check_private_key(ctx) != 1))
        failed = "cert_file and key_file do not load, or do not match";
    if (failed) {
        unsigned long e = ERR_get_error();
        snprintf(why, whylen, "bridges.%s: %s%s%s", c->name, failed, e ? ": " : "",
                 e ? ERR_reason_error_string(e) : "");
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return RT_EINVAL;
    }
    SSL_CTX_set_verify(ctx, c->tls_verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    b->tls = ctx;
    return 0;
}

static int make_one(rt_bridge_t *b, const rt_conf_bridge_t *c, const char *data_dir, char *why,
                    size_t whylen)
{
    b->conf = *c;
    int n = snprintf(b->spill_path, sizeof(b->spill_path), "%s/bridge-%s.db", data_dir, c->name);
    if (n < 0 || (size_t)n >= sizeof(b->spill_path)) {
        snprintf(why, whylen, "bridges.%s: data_dir is too long for the spill file's path",
                 c->name);
        return RT_EINVAL;
    }
    pthread_mutex_init(&b->err_lock, NULL);
    char err[200];
    for (unsigned i = 0; i < c->out.n; i++)
        if (rt_bridge_map_parse(c->out.map[i], &b->out[i], err, sizeof(err))) {
            snprintf(why, whylen, "bridges.%s.out: %s", c->name, err);
            return RT_EINVAL;
        }
    for (unsigned i = 0; i < c->in.n; i++)
        if (rt_bridge_map_parse(c->in.map[i], &b->in[i], err, sizeof(err))) {
            snprintf(why, whylen, "bridges.%s.in: %s", c->name, err);
            return RT_EINVAL;
        }
    b->nout = c->out.n;
    b->nin = c->in.n;
    snprintf(b->client_id, sizeof(b->client_id), "%s",
             c->client_id[0] ? c->client_id : "rtd-bridge-");
    if (!c->client_id[0])
        snprintf(b->client_id + strlen(b->client_id), sizeof(b->client_id) - strlen(b->client_id),
                 "%s", c->name);
    snprintf(b->publisher, sizeof(b->publisher), "bridge:%s", c->name);
    snprintf(b->regname, sizeof(b->regname), "bridge:%s", c->name);
    int rc = resolve(b, why, whylen);
    if (rc == 0 && strncmp(c->remote, "mqtts://", 8) == 0)
        rc = make_tls(b, why, whylen);
    return rc;
}

static void free_all(rt_bridge_t *set, unsigned n)
{
    for (unsigned i = 0; set && i < n; i++) {
        SSL_CTX_free(set[i].tls);
        pthread_mutex_destroy(&set[i].err_lock);
    }
    free(set);
}

static int make_all(const rt_conf_t *c, rt_bridge_t **out, char *why, size_t whylen)
{
    *out = NULL;
    if (!c->nbridges)
        return 0;
    rt_bridge_t *set = calloc(c->nbridges, sizeof(*set));
    if (!set) {
        snprintf(why, whylen, "bridges: out of memory");
        return RT_ENOMEM;
    }
    for (unsigned i = 0; i < c->nbridges; i++) {
        int rc = make_one(&set[i], &c->bridges[i], c->data_dir, why, whylen);
        if (rc) {
            free_all(set, i + 1);
            return rc;
        }
    }
    *out = set;
    return 0;
}

int rt_bridges_check(const rt_conf_t *c, char *why, size_t whylen)
{
    rt_bridge_t *set;
    int rc = make_all(c, &set, why, whylen);
    free_all(set, c->nbridges);
    return rc;
}

int rt_bridges_start(const rt_conf_t *c, rt_pid_t sup, char *why, size_t whylen)
{
    int rc = make_all(c, &bridges, why, whylen);
    if (rc || !c->nbridges)
        return rc;
    nbridges = c->nbridges;
    rt_pid_t group;
    if ((rc = rt_group_start(sup, RT_BRIDGE_GROUP, RT_PERMANENT, &group))) {
        snprintf(why, whylen, "bridges: cannot start their group: %s", rt_strerror(rc));
        return rc;
    }
    for (unsigned i = 0; i < nbridges; i++) {
        rt_child_spec_t spec = {.name = bridges[i].regname,
                                .type = &rt__bridge_type,
                                .arg = &bridges[i],
                                .restart = RT_PERMANENT};
        if ((rc = rt_supervisor_start_child(group, &spec, NULL))) {
            snprintf(why, whylen, "bridges.%s: cannot start: %s", bridges[i].conf.name,
                     rt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

void rt_bridges_free(void)
{
    free_all(bridges, nbridges);
    bridges = NULL;
    nbridges = 0;
}

static const char *state_name(int state)
{
    return state == RT_BRIDGE_UP           ? "connected"
           : state == RT_BRIDGE_CONNECTING ? "connecting"
                                           : "disconnected";
}

size_t rt_bridges_snapshot(rt_bridge_info_t *out, size_t max)
{
    for (unsigned i = 0; i < nbridges && i < max; i++) {
        rt_bridge_t *b = &bridges[i];
        rt_bridge_info_t *o = &out[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", b->conf.name);
        snprintf(o->remote, sizeof(o->remote), "%s", b->conf.remote);
        o->state = state_name(atomic_load(&b->state));
        o->connects = atomic_load(&b->connects);
        o->failures = atomic_load(&b->failures);
        o->sent = atomic_load(&b->sent);
        o->acked = atomic_load(&b->acked);
        o->resent = atomic_load(&b->resent);
        o->received = atomic_load(&b->received);
        o->ignored = atomic_load(&b->ignored);
        o->dropped = atomic_load(&b->dropped);
        o->queued = atomic_load(&b->queued);
        o->queued_bytes = atomic_load(&b->queued_bytes);
        o->inflight = atomic_load(&b->inflight);
        o->spilled = atomic_load(&b->spilled);
        o->spilled_bytes = atomic_load(&b->spilled_bytes);
        o->up_since_ms = atomic_load(&b->up_since_ms);
        o->version = (unsigned)b->conf.version;
        o->qos = (unsigned)b->conf.qos;
        o->durable = b->conf.durable;
        o->nout = b->nout;
        o->nin = b->nin;
        for (unsigned k = 0; k < b->nout; k++)
            o->out[k] = b->conf.out.map[k];
        for (unsigned k = 0; k < b->nin; k++)
            o->in[k] = b->conf.in.map[k];
        pthread_mutex_lock(&b->err_lock);
        memcpy(o->last_error, b->last_error, sizeof(o->last_error));
        pthread_mutex_unlock(&b->err_lock);
    }
    return nbridges;
}

size_t rt_bridges_spill_files(char (*out)[512], char (*names)[64], size_t max)
{
    for (unsigned i = 0; i < nbridges && i < max; i++) {
        snprintf(out[i], sizeof(out[i]), "%s", bridges[i].conf.spill ? bridges[i].spill_path : "");
        snprintf(names[i], sizeof(names[i]), "%s", bridges[i].conf.name);
    }
    return nbridges;
}

int rt_bridge_reconnect(const char *name)
{
    for (unsigned i = 0; i < nbridges; i++)
        if (strcmp(bridges[i].conf.name, name) == 0) {
            rt_pid_t pid = atomic_load(&bridges[i].pid);
            return pid ? rt__bridge_restart(pid) : RT_ENOTFOUND;
        }
    return RT_ENOTFOUND;
}

/*
** HTTP file upload (XEP-0363), the XMPP side: a service per host at xmpp.upload_host that
** answers disco and hands out slots, a PUT URL and a GET URL on the http listener (which
** takes the file and serves it: actors/http/http_upload.c). The session checks the request
** (its name, size and type) and the upload actor makes the slot: it runs on the blocking pool,
** as making one reads the user's directory for its quota and writes two files, and it is one
** actor so that two slots of one user never both pass the quota. It also sweeps what expired
** (xmpp.upload_expire), at start and every sweep_s after.
*/
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c2s.h"
#include "c2s_impl.h"
#include "log.h"
#include "upload.h"

#define NS_UPLOAD "urn:xmpp:http:upload:0"
#define NS_DISCO_INFO "http://jabber.org/protocol/disco#info"
#define NS_DISCO_ITEMS "http://jabber.org/protocol/disco#items"
#define RT_C2S_UPLOAD_NAME "xmpp_upload"
#define C2S_MSG_UPLOAD_SLOT (RT_C2S_MSG_BASE + 0x70) /* a slot request, checked (upload_req_t) */
#define C2S_MSG_UPLOAD_SWEEP (RT_C2S_MSG_BASE + 0x71)
#define C2S_MSG_UPLOAD_KEEP (RT_C2S_MSG_BASE + 0x72) /* upload_keep_t: a PUT's file, whole */
#define C2S_MSG_UPLOAD_FORGET (RT_C2S_MSG_BASE + 0x73) /* a bare JID whose account is gone */

static struct {
    char domain[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX];
    char url[RT_CONF_MAX_XMPP_HOSTS][sizeof(((rt_conf_xmpp_t *)0)->upload_url) + 64];
    char root[sizeof(((rt_conf_t *)0)->data_dir) + sizeof(RT_UPLOAD_DIR) + 1];
} U;

int rt__c2s_upload_index(const char *domain, size_t len)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    for (unsigned i = 0; x && x->upload_host[0] && i < x->nhosts; i++)
        if (strlen(U.domain[i]) == len && memcmp(U.domain[i], domain, len) == 0)
            return (int)i;
    return -1;
}

void rt__c2s_upload_disco_item(rt_buf_t *b, unsigned host)
{
    if (!rt__c2s.conf->upload_host[0])
        return;
    rt_xml_put_start(b, "item");
    rt_xml_put_attr(b, "jid", U.domain[host]);
    rt_xml_put_empty_end(b);
}

/* ---- The session's side ---- */

/* A slot request as the session checked it: this head, then id, bare, full JID, name and
   type, each NUL-ended. */
typedef struct upload_req_s {
    uint64_t size;
    uint8_t host; /* the service's */
} upload_req_t;

static void disco_info(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    rt_buf_t b = {0};
    rt__c2s_iq_result_start(&b, c, iq);
    rt_buf_printf(&b,
                  "><query xmlns='%s'><identity category='store' type='file' "
                  "name='HTTP File Upload'/><feature var='%s'/><feature var='%s'/>"
                  "<x xmlns='jabber:x:data' type='result'><field var='FORM_TYPE' type='hidden'>"
                  "<value>%s</value></field><field var='max-file-size'><value>%ld</value>"
                  "</field></x></query></iq>",
                  NS_DISCO_INFO, NS_DISCO_INFO, NS_UPLOAD, NS_UPLOAD,
                  rt__c2s.conf->upload_max_size);
    rt__c2s_write_stanza_buf(self, c, &b);
}

static void too_large(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq)
{
    char app[256];
    snprintf(app, sizeof(app),
             "<text xmlns='%s'>the file is larger than %ld bytes</text><file-too-large xmlns='%s'>"
             "<max-file-size>%ld</max-file-size></file-too-large>",
             RT_XML_NS_STANZA_ERRORS, rt__c2s.conf->upload_max_size, NS_UPLOAD,
             rt__c2s.conf->upload_max_size);
    rt__c2s_stanza_error_app(self, c, iq, "modify", "not-acceptable", app);
}

static void slot_request(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                         int host)
{
    const char *name = rt_xml_attr(q, "filename"), *size_text = rt_xml_attr(q, "size");
    const char *type = rt_xml_attr(q, "content-type");
    char *end = NULL;
    unsigned long long size =
        size_text && *size_text >= '0' && *size_text <= '9' ? strtoull(size_text, &end, 10) : 0;
    if (!name || !rt_upload_name_ok(name, strlen(name)) || !end || *end || !size ||
        (type && !rt_upload_type_ok(type))) {
        rt__c2s_stanza_error(self, c, iq, "modify", "bad-request");
        return;
    }
    if (size > (unsigned long long)rt__c2s.conf->upload_max_size) {
        atomic_fetch_add_explicit(&rt_c2s_stats.upload_refused, 1, memory_order_relaxed);
        too_large(self, c, iq);
        return;
    }
    if (c->anonymous) { /* a file outlives an anonymous login, and no quota would hold */
        rt__c2s_stanza_error(self, c, iq, "auth", "forbidden");
        return;
    }
    rt_pid_t actor = rt_whereis(RT_C2S_UPLOAD_NAME);
    const char *id = rt_xml_attr(iq, "id");
    upload_req_t head = {.size = size, .host = (uint8_t)host};
    rt_buf_t b = {0};
    rt_buf_add(&b, &head, sizeof(head));
    rt_buf_add(&b, id, strlen(id) + 1);
    rt_buf_add(&b, c->jid->s, rt_jid_bare_len(c->jid));
    rt_buf_add(&b, "", 1);
    rt_buf_add(&b, c->jid->s, strlen(c->jid->s) + 1);
    rt_buf_add(&b, name, strlen(name) + 1);
    rt_buf_add(&b, type ? type : "", strlen(type ? type : "") + 1);
    if (!actor || b.oom || rt_send(actor, C2S_MSG_UPLOAD_SLOT, b.data, b.len) != 0)
        rt__c2s_stanza_error(self, c, iq, "wait", "internal-server-error");
    rt_buf_free(&b);
}

void rt__c2s_upload_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to,
                       int host)
{
    const char *type = rt_xml_attr(iq, "type");
    if (strcmp(type, "result") == 0 || strcmp(type, "error") == 0)
        return;
    const rt_xml_el_t *q = rt_xml_first(iq);
    bool get = strcmp(type, "get") == 0;
    if (to->local || to->resource || !q || !get) {
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable");
    } else if (strcmp(q->ns, NS_DISCO_INFO) == 0) {
        disco_info(self, c, iq);
    } else if (strcmp(q->ns, NS_DISCO_ITEMS) == 0) {
        rt_buf_t b = {0};
        rt__c2s_iq_result_start(&b, c, iq);
        rt_buf_printf(&b, "><query xmlns='%s'/></iq>", NS_DISCO_ITEMS);
        rt__c2s_write_stanza_buf(self, c, &b);
    } else if (strcmp(q->ns, NS_UPLOAD) == 0 && strcmp(q->name, "request") == 0) {
        slot_request(self, c, iq, q, host);
    } else {
        rt__c2s_stanza_error(self, c, iq, "cancel", "service-unavailable");
    }
}

/* ---- The upload actor ---- */

typedef struct uploader_s {
    rt_upload_t *files;
    uint32_t sweep_s;
} uploader_t;

/* An URL's path segment: what is not unreserved (RFC 3986 2.3) percent-encoded. */
static void put_segment(rt_buf_t *b, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            strchr("-._~", ch))
            rt_buf_add(b, s, 1);
        else
            rt_buf_printf(b, "%%%02X", ch);
    }
}

static void answer_start(rt_buf_t *b, const char *type, const char *id, unsigned host,
                         const char *full)
{
    rt_xml_put_start(b, "iq");
    rt_xml_put_attr(b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(b, "type", type);
    rt_xml_put_attr(b, "id", id);
    rt_xml_put_attr(b, "from", U.domain[host]);
    rt_xml_put_attr(b, "to", full);
    rt_xml_put_start_end(b);
}

static void make_slot(uploader_t *u, rt_msg_t *m)
{
    upload_req_t head;
    const char *f[5];
    size_t at = sizeof(head);
    if (m->len < sizeof(head))
        return;
    memcpy(&head, m->data, sizeof(head));
    for (int i = 0; i < 5; i++) {
        f[i] = (const char *)m->data + at;
        size_t n = strnlen(f[i], m->len - at);
        if (at + n >= m->len)
            return;
        at += n + 1;
    }
    const char *id = f[0], *bare = f[1], *full = f[2], *name = f[3], *type = f[4];
    if (head.host >= rt__c2s.conf->nhosts)
        return;
    rt_upload_id_t slot;
    uint64_t used = 0, quota = (uint64_t)rt__c2s.conf->upload_quota;
    int rc = rt_upload_slot(u->files, bare, name, head.size, type, quota, &slot, &used);
    rt_buf_t b = {0};
    answer_start(&b, rc ? "error" : "result", id, head.host, full);
    if (!rc) {
        rt_buf_t url = {0};
        rt_buf_printf(&url, "%s/upload/%s/%s/", U.url[head.host], slot.user, slot.slot);
        put_segment(&url, name);
        rt_buf_add(&url, "", 1);
        rt_buf_printf(&b, "<slot xmlns='%s'><put", NS_UPLOAD);
        rt_xml_put_attr(&b, "url", url.oom ? "" : (const char *)url.data);
        rt_buf_printf(&b, "/><get");
        rt_xml_put_attr(&b, "url", url.oom ? "" : (const char *)url.data);
        rt_buf_printf(&b, "/></slot></iq>");
        rt_buf_free(&url);
        atomic_fetch_add_explicit(&rt_c2s_stats.upload_slots, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "xmpp.upload_slot", "user=%s size=%" PRIu64 " slot=%s", bare, head.size,
               slot.slot);
    } else if (rc == RT_ELIMIT) {
        atomic_fetch_add_explicit(&rt_c2s_stats.upload_refused, 1, memory_order_relaxed);
        rt_buf_printf(&b,
                      "<error type='wait'><resource-constraint xmlns='%s'/><text xmlns='%s'>"
                      "quota reached: %" PRIu64 " bytes in use of %" PRIu64 "</text></error></iq>",
                      RT_XML_NS_STANZA_ERRORS, RT_XML_NS_STANZA_ERRORS, used, quota);
    } else {
        rt_buf_printf(&b, "<error type='%s'><%s xmlns='%s'/></error></iq>",
                      rc == RT_EINVAL ? "modify" : "wait",
                      rc == RT_EINVAL ? "bad-request" : "internal-server-error",
                      RT_XML_NS_STANZA_ERRORS);
    }
    if (!b.oom)
        rt_send(m->from, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
}

static void sweep(rt_actor_t *self, uploader_t *u)
{
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    size_t n = rt_upload_sweep(u->files, (uint64_t)x->upload_expire,
                               (uint32_t)x->upload_slot_timeout, time(NULL));
    if (n) {
        atomic_fetch_add_explicit(&rt_c2s_stats.upload_expired, n, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "xmpp.upload_expired", "files=%zu", n);
    }
    rt_send_after_tag((uint64_t)u->sweep_s * 1000, rt_self(self), C2S_MSG_UPLOAD_SWEEP, NULL);
}

typedef struct upload_keep_s {
    int fd;
    rt_upload_id_t id;
} upload_keep_t;

int rt_c2s_upload_keep(int fd, const char *user, const char *slot)
{
    upload_keep_t k = {.fd = fd};
    snprintf(k.id.user, sizeof(k.id.user), "%s", user);
    snprintf(k.id.slot, sizeof(k.id.slot), "%s", slot);
    rt_pid_t actor = rt_whereis(RT_C2S_UPLOAD_NAME);
    if (!actor || rt_send(actor, C2S_MSG_UPLOAD_KEEP, &k, sizeof(k)) != 0) {
        close(fd);
        return RT_ENOPROC;
    }
    return 0;
}

static void keep(rt_msg_t *m)
{
    upload_keep_t k;
    if (m->len != sizeof(k))
        return;
    memcpy(&k, m->data, sizeof(k));
    int32_t rc = rt_upload_put_end(U.root, &k.id, k.fd);
    rt_send(m->from, RT_MSG_C2S_UPLOAD_KEPT, &rc, sizeof(rc));
}

void rt__c2s_upload_forget(const char *host, const char *user)
{
    rt_pid_t actor = rt__c2s.conf->upload_host[0] ? rt_whereis(RT_C2S_UPLOAD_NAME) : 0;
    char bare[RT_JID_TEXT_MAX + 1];
    int n = snprintf(bare, sizeof(bare), "%s@%s", user, host);
    if (actor && n > 0 && (size_t)n < sizeof(bare))
        rt_send(actor, C2S_MSG_UPLOAD_FORGET, bare, (size_t)n + 1);
}

static void forget(uploader_t *u, const rt_msg_t *m)
{
    const char *bare = (const char *)m->data;
    if (!m->len || bare[m->len - 1])
        return;
    size_t n = rt_upload_forget(u->files, bare);
    rt_log(RT_LOG_INFO, "xmpp.upload_forgotten", "user=%s files=%zu", bare, n);
}

/* A PUT's file never taken (the actor ends with it in its mailbox): closed, its slot open. */
static void uploader_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    upload_keep_t k;
    if (m->tag != C2S_MSG_UPLOAD_KEEP || m->len != sizeof(k))
        return;
    memcpy(&k, m->data, sizeof(k));
    close(k.fd);
    int32_t rc = RT_EAGAIN;
    rt_send(m->from, RT_MSG_C2S_UPLOAD_KEPT, &rc, sizeof(rc));
}

static int uploader_init(rt_actor_t *self, void *state, void *arg)
{
    (void)arg;
    uploader_t *u = state;
    char err[512];
    if (rt_upload_open(U.root, &u->files, err, sizeof(err)) != 0) {
        rt_log(RT_LOG_ERROR, "xmpp.upload_failed", "error=%s", err);
        return RT_EAGAIN;
    }
    /* Often enough that a file goes within a quarter of its time past expiry (an hour at
       most), and that abandoned slots go within the hour. */
    long expire = rt__c2s.conf->upload_expire;
    u->sweep_s = expire > 0 && expire / 4 < 3600 ? (uint32_t)(expire / 4 ? expire / 4 : 1) : 3600;
    sweep(self, u);
    return 0;
}

static void uploader_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    uploader_t *u = state;
    if (m->tag == C2S_MSG_UPLOAD_SLOT)
        make_slot(u, m);
    else if (m->tag == C2S_MSG_UPLOAD_KEEP)
        keep(m);
    else if (m->tag == C2S_MSG_UPLOAD_FORGET)
        forget(u, m);
    else if (m->tag == C2S_MSG_UPLOAD_SWEEP)
        sweep(self, u);
}

static void uploader_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    uploader_t *u = state;
    rt_upload_close(u->files);
    u->files = NULL;
}

static const rt_actor_type_t uploader_type = {
    .name = RT_C2S_UPLOAD_NAME,
    .state_size = sizeof(uploader_t),
    .init = uploader_init,
    .handle = uploader_handle,
    .terminate = uploader_terminate,
    .dead_letter = uploader_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

int rt__c2s_upload_start(rt_pid_t group, const rt_conf_t *conf, char *err, size_t errlen)
{
    const rt_conf_xmpp_t *x = &conf->xmpp;
    if (!x->upload_host[0])
        return 0;
    if (!conf->http.on) {
        snprintf(err, errlen,
                 "xmpp.upload_host: the files go through the http listener, which "
                 "is off (add an http table)");
        return RT_EINVAL;
    }
    int rc = rt__c2s_service_domains("xmpp.upload_host", x->upload_host, U.domain, err, errlen);
    for (unsigned i = 0; !rc && i < x->nhosts; i++) {
        if (rt__c2s_muc_index(U.domain[i], strlen(U.domain[i])) >= 0) {
            snprintf(err, errlen, "xmpp.upload_host: %s is the group chat service's domain too",
                     U.domain[i]);
            return RT_EINVAL;
        }
        const char *base = x->upload_url, *at = strstr(base, "@HOST@");
        int n = base[0] ? snprintf(U.url[i], sizeof(U.url[i]), "%.*s%s%s",
                                   (int)(at ? at - base : (ptrdiff_t)strlen(base)), base,
                                   at ? x->hosts[i] : "", at ? at + 6 : "")
                        : snprintf(U.url[i], sizeof(U.url[i]), "%s://%s:%d",
                                   conf->http.where.tls_on ? "https" : "http", x->hosts[i],
                                   conf->http.where.port);
        while (n > 0 && U.url[i][n - 1] == '/') /* the slots add /upload/... */
            U.url[i][--n] = 0;
        if (n <= 0 || (size_t)n >= sizeof(U.url[i])) {
            snprintf(err, errlen, "xmpp.upload_url: too long for host %s", x->hosts[i]);
            return RT_EINVAL;
        }
    }
    if (rc)
        return rc;
    rt_upload_root(conf->data_dir, U.root, sizeof(U.root));
    rt_child_spec_t c = {
        .name = RT_C2S_UPLOAD_NAME, .type = &uploader_type, .restart = RT_PERMANENT};
    rc = rt_supervisor_start_child(group, &c, NULL);
    if (rc)
        snprintf(err, errlen, "cannot start the upload service (%s): %s", U.root, rt_strerror(rc));
    return rc;
}

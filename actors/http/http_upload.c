/*
** HTTP file upload (XEP-0363), the HTTP side: /upload/USER/SLOT/NAME takes the PUT of a slot
** the XMPP service handed out (actors/c2s/c2s_upload.c) and serves the file's GETs; the files
** are upload.h's. A PUT's body goes to its file as it comes, never whole into memory, and the
** upload actor syncs it and puts it in place (rt_c2s_upload_keep); a GET is read from the
** file a piece at a time as the client takes it (http.c).
**
** What is served is what a user uploaded, from the origin the dashboard is served from: so
** every answer forbids it scripts, plugins and frames (CSP sandbox), says not to sniff it, and
** only images, audio, video and plain text are shown inline; the rest is a download.
*/
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "c2s.h"
#include "http_impl.h"
#include "log.h"

#define PREFIX "/upload/"

bool rt__http_upload_path(const rt_conf_t *conf, const char *path)
{
    return conf->xmpp.on && conf->xmpp.upload_host[0] &&
           strncmp(path, PREFIX, sizeof(PREFIX) - 1) == 0;
}

int rt__http_put_start(const rt_conf_t *conf, const char *path, uint64_t len, const char *type,
                       rt_http_put_t *p, const char **why)
{
    char name[RT_UPLOAD_NAME_MAX + 1], root[sizeof(conf->data_dir) + 16];
    if (len == UINT64_MAX) {
        *why = "an upload needs Content-Length";
        return 411;
    }
    if (rt_upload_parse(path + sizeof(PREFIX) - 1, &p->id, name, sizeof(name)) != 0) {
        *why = "no such upload slot";
        return 404;
    }
    rt_upload_root(conf->data_dir, root, sizeof(root));
    int fd;
    switch (rt_upload_put_open(root, &p->id, name, len, type,
                               (uint32_t)conf->xmpp.upload_slot_timeout, &fd)) {
    case 0:
        break;
    case RT_EEXIST:
        *why = "this slot's file was uploaded already, or is being uploaded";
        return 409;
    case RT_ELIMIT:
        *why = "Content-Length is not the size the slot was asked for";
        return 400;
    case RT_EPROTO:
        *why = "Content-Type is not the type the slot was asked for";
        return 415;
    case RT_EBUSY:
        *why = "the slot's time is over (xmpp.upload_slot_timeout): ask for another";
        return 403;
    case RT_ENOTFOUND:
        *why = "no such upload slot";
        return 404;
    default:
        *why = "the file cannot be written";
        return 500;
    }
    p->fd = fd;
    p->left = p->size = len;
    p->on = true;
    return 0;
}

size_t rt__http_put_data(rt_http_put_t *p, const void *data, size_t n, const char **why)
{
    size_t take = n < p->left ? n : (size_t)p->left, done = 0;
    while (done < take) {
        ssize_t w = write(p->fd, (const char *)data + done, take - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rt_log(RT_LOG_ERROR, "http.upload_write_failed", "slot=%s error=%s", p->id.slot,
                   w < 0 ? strerror(errno) : "wrote nothing");
            *why = "the file cannot be written";
            return SIZE_MAX;
        }
        done += (size_t)w;
    }
    p->left -= take;
    return take;
}

int rt__http_put_keep(rt_http_put_t *p, const char **why)
{
    p->on = false;
    if (rt_c2s_upload_keep(p->fd, p->id.user, p->id.slot) != 0) {
        *why = "the upload service is not running";
        return 503;
    }
    p->keeping = true;
    return 0;
}

int rt__http_put_kept(rt_http_put_t *p, const rt_msg_t *m, const char **why)
{
    int32_t rc = RT_EAGAIN;
    if (m->len == sizeof(rc))
        memcpy(&rc, m->data, sizeof(rc));
    p->keeping = false;
    if (rc != 0) {
        *why = "the file cannot be kept";
        return 500;
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.upload_stored, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt_c2s_stats.upload_bytes, p->size, memory_order_relaxed);
    rt_log(RT_LOG_INFO, "http.upload_stored", "slot=%s bytes=%llu", p->id.slot,
           (unsigned long long)p->size);
    return 201;
}

void rt__http_put_abort(rt_http_put_t *p)
{
    if (!p->on)
        return;
    close(p->fd); /* the slot stays open for another try while its time lasts */
    p->on = false;
}

/* Whether a browser may show type inline: media and plain text, nothing that runs. */
static bool inline_type(const char *type)
{
    return (strncasecmp(type, "image/", 6) == 0 && strncasecmp(type, "image/svg", 9) != 0) ||
           strncasecmp(type, "audio/", 6) == 0 || strncasecmp(type, "video/", 6) == 0 ||
           (strncasecmp(type, "text/plain", 10) == 0 && strchr("; \t", type[10]));
}

int rt__http_get_start(const rt_conf_t *conf, const char *path, rt_http_get_t *g, char *head,
                       size_t cap, const char **why)
{
    char name[RT_UPLOAD_NAME_MAX + 1], root[sizeof(conf->data_dir) + 16];
    char type[RT_UPLOAD_TYPE_MAX + 1];
    rt_upload_id_t id;
    int fd;
    uint64_t size;
    rt_upload_root(conf->data_dir, root, sizeof(root));
    if (rt_upload_parse(path + sizeof(PREFIX) - 1, &id, name, sizeof(name)) != 0 ||
        rt_upload_get_open(root, &id, name, &fd, &size, type, sizeof(type)) != 0) {
        *why = "no such file (or it expired)";
        return 404;
    }
    /* The name goes in RFC 8187's form: percent-encoded UTF-8, nothing a header could split. */
    char fname[3 * RT_UPLOAD_NAME_MAX + 1];
    size_t n = 0;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        n += (size_t)snprintf(fname + n, sizeof(fname) - n,
                              (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                                      (*s >= '0' && *s <= '9') || strchr("-._~", *s)
                                  ? "%c"
                                  : "%%%02X",
                              *s);
    int len = snprintf(head, cap,
                       "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %llu\r\n"
                       "Content-Disposition: %s; filename*=UTF-8''%s\r\n"
                       "Content-Security-Policy: default-src 'none'; frame-ancestors 'none'; "
                       "sandbox\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: "
                       "no-referrer\r\nAccess-Control-Allow-Origin: *\r\n"
                       "Cache-Control: private, max-age=86400\r\n",
                       type, (unsigned long long)size, inline_type(type) ? "inline" : "attachment",
                       fname);
    if (len < 0 || (size_t)len >= cap) {
        close(fd);
        *why = "the answer's head is too long";
        return 500;
    }
    g->fd = fd;
    g->left = size;
    g->off = 0;
    g->on = true;
    atomic_fetch_add_explicit(&rt_c2s_stats.upload_served, 1, memory_order_relaxed);
    return 200;
}

ssize_t rt__http_get_read(rt_http_get_t *g, void *buf, size_t cap)
{
    size_t want = g->left < cap ? (size_t)g->left : cap;
    ssize_t n;
    do
        n = pread(g->fd, buf, want, (off_t)g->off);
    while (n < 0 && errno == EINTR);
    if (n <= 0) /* shorter than it was: cut by the sweep, or the disk failed */
        return -1;
    g->off += (uint64_t)n;
    g->left -= (uint64_t)n;
    return n;
}

void rt__http_get_end(rt_http_get_t *g)
{
    if (!g->on)
        return;
    close(g->fd);
    g->on = false;
}

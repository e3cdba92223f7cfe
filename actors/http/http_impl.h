/*
** Inside the HTTP layer: an API request made into an admin request line (http_api.c), and
** the API keys' functions the admin commands call (apikeys.c).
*/
#ifndef RT_HTTP_IMPL_H
#define RT_HTTP_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "admin.h"
#include "config.h"
#include "upload.h"

#define RT_HTTP_LINE_MAX 4096 /* an API request as an admin request line */

/*
** The admin request line of an API request: path (after /api/v1/) and query
** `WORD/WORD/ARG?name=value&flag`, and the members of a JSON object body (json NULL: none),
** make `WORD WORD ARG --name value --flag --json` in line (RT_HTTP_LINE_MAX + 8 bytes).
** Returns its length, or 0 with why (the request's 400) when they cannot make one.
*/
size_t rt__http_api_line(const char *path, const char *query, const char *json, size_t json_len,
                         char *line, char *why, size_t whylen);

/* The key functions the admin commands `apikey ...` call (apikeys.c). */
extern const rt_admin_apikeys_t rt__http_apikeys;

/* ---- HTTP file upload (http_upload.c, XEP-0363) ---- */
typedef struct rt_http_put_s { /* a PUT whose body is being written to its slot's file */
    bool on;
    bool keeping; /* its body came whole: the upload actor syncs it (RT_MSG_C2S_UPLOAD_KEPT) */
    int fd;
    uint64_t size, left; /* the body's bytes, and those still to come */
    uint32_t progress;   /* bytes since its deadline was last moved */
    rt_upload_id_t id;
} rt_http_put_t;
typedef struct rt_http_get_s { /* a file being served */
    bool on;
    int fd;
    uint64_t off, left;
} rt_http_get_t;

/* Whether path is an upload's (/upload/...) and the upload service is on. */
bool rt__http_upload_path(const rt_conf_t *conf, const char *path);
/* A PUT's head (len: its Content-Length, UINT64_MAX for none): 0 with p on, or the status to
   refuse it with and *why. */
int rt__http_put_start(const rt_conf_t *conf, const char *path, uint64_t len, const char *type,
                       rt_http_put_t *p, const char **why);
/* Body bytes into the file: how many it took (at most p->left), SIZE_MAX (*why) on failure. */
size_t rt__http_put_data(rt_http_put_t *p, const void *data, size_t n, const char **why);
/* The body came whole (p->left 0): handed to the upload actor to keep (0, p keeping), or the
   status to answer (*why). p is off after. */
int rt__http_put_keep(rt_http_put_t *p, const char **why);
/* The upload actor's answer (RT_MSG_C2S_UPLOAD_KEPT's m): 201, or 500 with *why. */
int rt__http_put_kept(rt_http_put_t *p, const rt_msg_t *m, const char **why);
/* A PUT cut short: its file closed, the slot still open. */
void rt__http_put_abort(rt_http_put_t *p);
/* A GET or HEAD: 200 with g on and the answer's head (up to its blank line) in head; or the
   status (404) and *why. */
int rt__http_get_start(const rt_conf_t *conf, const char *path, rt_http_get_t *g, char *head,
                       size_t cap, const char **why);
/* The next piece of the file into buf: its bytes, or -1 when the file was cut short. */
ssize_t rt__http_get_read(rt_http_get_t *g, void *buf, size_t cap);
void rt__http_get_end(rt_http_get_t *g);

#endif

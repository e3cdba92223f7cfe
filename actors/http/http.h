/*
** rtd over HTTP (docs/HTTP.md): `http = { bind = ..., api_keys_file = ..., metrics_public }`
** starts a listener whose connections are actors like every other: /healthz, /readyz,
** /metrics (Prometheus) and the API under /api/v1/, which is the admin command layer
** (the commands rtctl sends, answered by the same code) with API keys for auth.
*/
#ifndef RT_HTTP_H
#define RT_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "rt.h"

#define RT_HTTP_GROUP "http_sup"
#define RT_HTTP_BODY_MAX (64 * 1024) /* a request body is refused (413) past this */
#define RT_HTTP_CONNS_MAX 1024       /* HTTP connections at once; more are refused at accept */
#define RT_HTTP_CONNS_PER_ADDR 256   /* from one address at once; more are refused at accept */
#define RT_HTTP_PROBE_SLOTS 16       /* the last connections under RT_HTTP_CONNS_MAX serve only
                                        /healthz and /readyz (others get 503) */
#define RT_HTTP_FIRST_BYTE_MS 2000   /* a connection that has sent nothing is closed */
#define RT_HTTP_FD_RESERVE 16        /* descriptors HTTP leaves for the admin socket */
#define RT_HTTP_IDLE_MS 60000        /* a kept-alive connection with no request is closed */

/* Starts the listener under sup when conf->http.on (else does nothing): 0 or an RT_E* code. */
int rt_http_start(const rt_conf_t *conf, rt_pid_t sup, char *err, size_t errlen);
void rt_http_stop(void);

/* ---- The dashboard (www/, embedded by www/embed.cmake) ---- */
typedef struct {
    const char *name; /* "index.html": served at / ; the others at /ui/NAME */
    const char *type; /* its Content-Type */
    const unsigned char *bytes;
    size_t len;
} rt_http_file_t;
extern const rt_http_file_t rt_http_www[]; /* ends with a {0} entry */

/* ---- API keys (apikeys.c) ---- */
typedef enum { RT_HTTP_ROLE_NONE, RT_HTTP_ROLE_READ, RT_HTTP_ROLE_ADMIN } rt_http_role_t;
/*
** Loads the keys file (NAME ROLE SHA256-HEX [CREATED] lines) and makes it the one reloads
** and `rtctl apikey add|revoke` use; 0, or RT_E* with err naming the file and line.
*/
int rt_http_keys_load(const char *path, char *err, size_t errlen);
/*
** Reads the keys file again (SIGHUP, `rtctl apikey reload`) and logs the outcome: 0 (also
** when rtd has no key file), or RT_E* with err set, the keys in force unchanged.
*/
int rt_http_keys_reload(char *err, size_t errlen);
/* The role of a presented key (NONE: unknown), noted as its last use, and its name into name
   for the log of who changed what ("" when unknown). Compared in constant time per entry. */
rt_http_role_t rt_http_key_role(const char *key, char *name, size_t namelen);
/*
** What an operator should hear about conf's http table before rtd serves it (rt_http_start
** logs it; `rtd --check` may print it), or NULL: today, an API with no key file to open it.
*/
const char *rt_http_conf_warning(const rt_conf_t *conf);
/* `rtd apikey NAME read|admin [-c CONFIG | -f FILE]`: makes a key, prints it once, stores its
   hash in FILE or in CONFIG's http.api_keys_file (CONFIG: default_config, rtd's). Returns
   the exit status. */
int rt_http_apikey_main(int argc, char **argv, const char *default_config);

#endif

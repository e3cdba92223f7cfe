/*
** HTTP requests (actors/transport/http_request.c) and the API's requests made into admin
** request lines (actors/http/http_api.c): both read what any client of the HTTP port sends.
**
** The input is parsed as a request: one that parses must parse the same from its own bytes
** and ask for more one byte short; any other answer is RT_EAGAIN or an HTTP status. A parsed
** request's target and body are then made into an admin request line, as the listener does:
** a line made fits RT_HTTP_LINE_MAX and splits into words without an error (it quotes every
** word), and one refused says why. The same bytes as an upload's head (rt_http_parse_head):
** whole within what was given, or a status; and its target, under /upload/, as the slot and
** file name upload.c takes, which then has no '/' left in it.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "common.h"
#include "http_impl.h"
#include "http_request.h"
#include "upload.h"

#define BODY_MAX (64 * 1024)

static int parse(const uint8_t *data, size_t size, rt_http_request_t *req)
{
    const char *why = NULL;
    int rc = rt_http_parse_request(data, size, BODY_MAX, req, &why);
    if (rc != 0 && rc != RT_EAGAIN && (rc < 400 || rc > 505 || !why || !why[0]))
        abort();
    return rc;
}

static void api_line(const uint8_t *data, const rt_http_request_t *req)
{
    static char path[RT_HTTP_TARGET_MAX], line[RT_HTTP_LINE_MAX + 8];
    memcpy(path, req->target, sizeof(path));
    path[sizeof(path) - 1] = 0;
    char *query = strchr(path, '?');
    if (query)
        *query++ = 0;
    const char *api = strncmp(path, "/api/v1/", 8) == 0 ? path + 8 : path;
    const char *json = req->body_len ? (const char *)data + req->body_off : NULL;
    char why[512] = "";
    size_t len = rt__http_api_line(api, query, json, req->body_len, line, why, sizeof(why));
    if (!len) {
        if (!why[0])
            abort();
        return;
    }
    if (len > RT_HTTP_LINE_MAX)
        abort();
    char *argv[RT_ADMIN_ARGS_MAX];
    size_t arglen[RT_ADMIN_ARGS_MAX];
    int argc;
    char err[256];
    if (rt_admin_split(line, len, argv, arglen, RT_ADMIN_ARGS_MAX, &argc, err, sizeof(err)) != 0 &&
        strstr(err, "more than") == NULL)
        abort();
}

static void upload_head(const uint8_t *data, size_t size)
{
    static rt_http_request_t h;
    const char *why = NULL;
    int rc = rt_http_parse_head(data, size, &h, &why);
    if (rc == RT_EAGAIN)
        return;
    if (rc != 0) {
        if (rc < 400 || rc > 505 || !why || !why[0])
            abort();
        return;
    }
    if (h.len == 0 || h.len > size)
        abort();
    rt_upload_id_t id;
    char name[RT_UPLOAD_NAME_MAX + 1];
    if (strncmp(h.target, "/upload/", 8) == 0 &&
        rt_upload_parse(h.target + 8, &id, name, sizeof(name)) == 0 &&
        (!rt_upload_name_ok(name, strlen(name)) || strchr(name, '/') ||
         strlen(id.user) != RT_UPLOAD_ID_HEX || strlen(id.slot) != RT_UPLOAD_ID_HEX))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    upload_head(data, size);
    rt_http_request_t req, again;
    if (parse(data, size, &req) != 0)
        return 0;
    if (req.len == 0 || req.len > size || req.body_off + req.body_len > req.len)
        abort();
    if (parse(data, req.len, &again) != 0 || again.len != req.len ||
        strcmp(again.target, req.target) != 0 || again.body_len != req.body_len)
        abort();
    if (parse(data, req.len - 1, &again) != RT_EAGAIN)
        abort();
    api_line(data, &req);
    return 0;
}

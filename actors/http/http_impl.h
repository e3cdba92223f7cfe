/*
** Inside the HTTP layer: an API request made into an admin request line (http_api.c), and
** the API keys' functions the admin commands call (apikeys.c).
*/
#ifndef RT_HTTP_IMPL_H
#define RT_HTTP_IMPL_H

#include <stddef.h>

#include "admin.h"

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

#endif

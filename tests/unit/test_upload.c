/*
** HTTP file upload's files (actors/xmpp/upload.c) and the head-only request parse the PUTs
** use (actors/transport/http_request.c): names and types refused, a slot's PUT and GET, the
** quota counting open slots, a PUT of another size, type, name or after its time, a second
** PUT, the sweep's expiry and its sparing of what is young, a deleted account's files gone
** with it, and the user's directory not naming the user.
*/
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "http_request.h"
#include "rt.h"
#include "tmpdir.h"
#include "upload.h"

static char root[128];

static void test_names(void)
{
    CHECK(rt_upload_name_ok("photo.jpg", 9));
    CHECK(rt_upload_name_ok("caf\xc3\xa9 menu.pdf", 14));
    CHECK(!rt_upload_name_ok("", 0));
    CHECK(!rt_upload_name_ok(".", 1));
    CHECK(!rt_upload_name_ok("..", 2));
    CHECK(!rt_upload_name_ok("a/b", 3));
    CHECK(!rt_upload_name_ok("a\\b", 3));
    CHECK(!rt_upload_name_ok("a\nb", 3));
    CHECK(!rt_upload_name_ok("\xc0\xaf", 2));     /* an overlong '/' */
    CHECK(!rt_upload_name_ok("\xed\xa0\x80", 3)); /* a surrogate */
    CHECK(!rt_upload_name_ok("ab\0c", 4));        /* a NUL inside */
    char longname[RT_UPLOAD_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    CHECK(!rt_upload_name_ok(longname, strlen(longname)));
    CHECK(rt_upload_type_ok("image/jpeg"));
    CHECK(rt_upload_type_ok("text/plain; charset=utf-8"));
    CHECK(!rt_upload_type_ok("image"));
    CHECK(!rt_upload_type_ok("/jpeg"));
    CHECK(!rt_upload_type_ok("text/html\r\nX-Evil: 1"));
}

/* A slot's PUT URL path after /upload/ for id and name (percent-encoded as the service does). */
static void slot_path(const rt_upload_id_t *id, const char *name, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/%s/", id->user, id->slot);
    for (const unsigned char *p = (const unsigned char *)name; *p && n + 4 < (int)cap; p++)
        n += snprintf(out + n, cap - (size_t)n,
                      (*p >= 'a' && *p <= 'z') || *p == '.' ? "%c" : "%%%02X", *p);
}

static void put_bytes(const rt_upload_id_t *id, const char *name, const char *type,
                      const char *bytes, size_t len)
{
    int fd;
    CHECK_EQ(rt_upload_put_open(root, id, name, len, type, 300, &fd), 0);
    CHECK_EQ(write(fd, bytes, len), (ssize_t)len);
    CHECK_EQ(rt_upload_put_end(root, id, fd), 0);
}

static void test_slot_put_get(void)
{
    rt_upload_t *u;
    char err[256];
    CHECK_EQ(rt_upload_open(root, &u, err, sizeof(err)), 0);
    rt_upload_id_t id;
    uint64_t used;
    CHECK_EQ(
        rt_upload_slot(u, "alice@example.org", "caf\xc3\xa9.txt", 5, "text/plain", 0, &id, &used),
        0);
    /* The URL names neither the user nor anything guessable. */
    CHECK(strlen(id.user) == RT_UPLOAD_ID_HEX && strlen(id.slot) == RT_UPLOAD_ID_HEX);
    CHECK(strstr(id.user, "alice") == NULL);
    char path[512], name[RT_UPLOAD_NAME_MAX + 1];
    rt_upload_id_t parsed;
    slot_path(&id, "caf\xc3\xa9.txt", path, sizeof(path));
    CHECK_EQ(rt_upload_parse(path, &parsed, name, sizeof(name)), 0);
    CHECK(strcmp(name, "caf\xc3\xa9.txt") == 0 && strcmp(parsed.slot, id.slot) == 0);
    CHECK_EQ(rt_upload_parse("../etc/passwd", &parsed, name, sizeof(name)), RT_EINVAL);
    snprintf(path, sizeof(path), "%s/%s/..%%2F..%%2Fkey", id.user, id.slot);
    CHECK_EQ(rt_upload_parse(path, &parsed, name, sizeof(name)), RT_EINVAL);
    snprintf(path, sizeof(path), "%s/%s/a%%00b", id.user, id.slot);
    CHECK_EQ(rt_upload_parse(path, &parsed, name, sizeof(name)), RT_EINVAL);

    int fd;
    uint64_t size;
    char type[RT_UPLOAD_TYPE_MAX + 1];
    /* Not served before its PUT; a PUT of another size, type or name is refused. */
    CHECK_EQ(rt_upload_get_open(root, &id, "caf\xc3\xa9.txt", &fd, &size, type, sizeof(type)),
             RT_ENOTFOUND);
    CHECK_EQ(rt_upload_put_open(root, &id, "caf\xc3\xa9.txt", 6, "text/plain", 300, &fd),
             RT_ELIMIT);
    CHECK_EQ(rt_upload_put_open(root, &id, "caf\xc3\xa9.txt", 5, "text/html", 300, &fd), RT_EPROTO);
    CHECK_EQ(rt_upload_put_open(root, &id, "other.txt", 5, "text/plain", 300, &fd), RT_ENOTFOUND);
    /* A second PUT while one writes is refused, not interleaved with it. */
    int first;
    CHECK_EQ(rt_upload_put_open(root, &id, "caf\xc3\xa9.txt", 5, "text/plain", 300, &first), 0);
    CHECK_EQ(rt_upload_put_open(root, &id, "caf\xc3\xa9.txt", 5, "text/plain", 300, &fd),
             RT_EEXIST);
    close(first);
    put_bytes(&id, "caf\xc3\xa9.txt", "text/plain; charset=utf-8", "hello", 5);
    CHECK_EQ(rt_upload_put_open(root, &id, "caf\xc3\xa9.txt", 5, "text/plain", 300, &fd),
             RT_EEXIST);
    CHECK_EQ(rt_upload_get_open(root, &id, "caf\xc3\xa9.txt", &fd, &size, type, sizeof(type)), 0);
    char got[8] = {0};
    CHECK_EQ(read(fd, got, sizeof(got)), 5);
    close(fd);
    CHECK(strcmp(got, "hello") == 0 && size == 5 && strcmp(type, "text/plain") == 0);
    CHECK_EQ(rt_upload_get_open(root, &id, "other.txt", &fd, &size, type, sizeof(type)),
             RT_ENOTFOUND);
    rt_upload_close(u);
}

static void test_quota(void)
{
    rt_upload_t *u;
    char err[256];
    CHECK_EQ(rt_upload_open(root, &u, err, sizeof(err)), 0);
    rt_upload_id_t a, b;
    uint64_t used;
    /* An open slot holds its place: the second cannot pass the quota before the first's PUT. */
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "a.bin", 600, "", 1000, &a, &used), 0);
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "b.bin", 600, "", 1000, &b, &used), RT_ELIMIT);
    CHECK_EQ(used, 600);
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "b.bin", 400, "", 1000, &b, &used), 0);
    /* Another user's quota is its own. */
    CHECK_EQ(rt_upload_slot(u, "carol@example.org", "c.bin", 1000, "", 1000, &b, &used), 0);
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "a/b", 1, "", 0, &b, &used), RT_EINVAL);
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "x", 0, "", 0, &b, &used), RT_EINVAL);
    CHECK_EQ(rt_upload_slot(u, "bob@example.org", "x", 1, "bad type", 0, &b, &used), RT_EINVAL);
    rt_upload_close(u);
}

/* Moves a slot's files' times back by age seconds. */
static void age_slot(const rt_upload_id_t *id, time_t age)
{
    static const char *const exts[] = {"meta", "part", "data"};
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/%s/%s.%s", root, id->user, id->slot, exts[i]);
        struct stat st;
        if (stat(p, &st) != 0)
            continue;
        struct timespec t[2] = {{.tv_sec = st.st_mtime - age}, {.tv_sec = st.st_mtime - age}};
        CHECK_EQ(utimensat(AT_FDCWD, p, t, 0), 0);
    }
}

static void test_timeout_and_sweep(void)
{
    rt_upload_t *u;
    char err[256];
    CHECK_EQ(rt_upload_open(root, &u, err, sizeof(err)), 0);
    rt_upload_id_t late, old, young, abandoned;
    uint64_t used;
    int fd;
    CHECK_EQ(rt_upload_slot(u, "dave@example.org", "late", 3, "", 0, &late, &used), 0);
    age_slot(&late, 301);
    CHECK_EQ(rt_upload_put_open(root, &late, "late", 3, "", 300, &fd), RT_EBUSY);
    CHECK_EQ(rt_upload_slot(u, "dave@example.org", "old", 3, "", 0, &old, &used), 0);
    put_bytes(&old, "old", "", "old", 3);
    CHECK_EQ(rt_upload_slot(u, "dave@example.org", "young", 5, "", 0, &young, &used), 0);
    put_bytes(&young, "young", "", "young", 5);
    CHECK_EQ(rt_upload_slot(u, "dave@example.org", "gone", 4, "", 0, &abandoned, &used), 0);
    time_t now = time(NULL);
    age_slot(&old, 100);
    age_slot(&abandoned, 300 + RT_UPLOAD_PART_GRACE_S + 1);
    /* expire 0 keeps files; the abandoned slot goes, the late one (in its grace) stays. */
    CHECK_EQ(rt_upload_sweep(u, 0, 300, now), 1);
    CHECK_EQ(rt_upload_sweep(u, 50, 300, now), 1); /* the old file */
    uint64_t size;
    char type[RT_UPLOAD_TYPE_MAX + 1];
    CHECK_EQ(rt_upload_get_open(root, &old, "old", &fd, &size, type, sizeof(type)), RT_ENOTFOUND);
    CHECK_EQ(rt_upload_get_open(root, &young, "young", &fd, &size, type, sizeof(type)), 0);
    close(fd);
    CHECK(strcmp(type, "application/octet-stream") == 0);
    /* Everything of a user gone: its directory too, and the quota counts from nothing. */
    age_slot(&young, 100);
    age_slot(&late, RT_UPLOAD_PART_GRACE_S);
    CHECK_EQ(rt_upload_sweep(u, 50, 300, now), 2);
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", root, young.user);
    CHECK(access(p, F_OK) != 0);
    rt_upload_close(u);
}

static void test_forget(void)
{
    rt_upload_t *u;
    char err[256];
    CHECK_EQ(rt_upload_open(root, &u, err, sizeof(err)), 0);
    rt_upload_id_t gone, open_slot, kept;
    uint64_t used, size;
    int fd;
    char type[RT_UPLOAD_TYPE_MAX + 1];
    CHECK_EQ(rt_upload_slot(u, "erin@example.org", "a", 1, "", 0, &gone, &used), 0);
    put_bytes(&gone, "a", "", "a", 1);
    CHECK_EQ(rt_upload_slot(u, "erin@example.org", "b", 1, "", 0, &open_slot, &used), 0);
    CHECK_EQ(rt_upload_slot(u, "frank@example.org", "c", 1, "", 0, &kept, &used), 0);
    put_bytes(&kept, "c", "", "c", 1);
    CHECK_EQ(rt_upload_forget(u, "erin@example.org"), 2);
    CHECK_EQ(rt_upload_get_open(root, &gone, "a", &fd, &size, type, sizeof(type)), RT_ENOTFOUND);
    CHECK_EQ(rt_upload_put_open(root, &open_slot, "b", 1, "", 300, &fd), RT_ENOTFOUND);
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", root, gone.user);
    CHECK(access(p, F_OK) != 0);
    CHECK_EQ(rt_upload_get_open(root, &kept, "c", &fd, &size, type, sizeof(type)), 0);
    close(fd);
    CHECK_EQ(rt_upload_forget(u, "nobody@example.org"), 0);
    /* What the slot maker remembered of erin's usage went with the files. */
    CHECK_EQ(rt_upload_slot(u, "erin@example.org", "again", 1, "", 1, &gone, &used), 0);
    CHECK_EQ(used, 0);
    rt_upload_close(u);
}

static void test_parse_head(void)
{
    static const char req[] = "PUT /upload/a/b/c HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                              "Content-Length: 100000000\r\n\r\nBODY";
    rt_http_request_t r;
    const char *why = "";
    CHECK_EQ(rt_http_parse_head((const uint8_t *)req, sizeof(req) - 1, &r, &why), 0);
    CHECK_EQ(r.len, sizeof(req) - 1 - 4); /* the body starts after the head's blank line */
    CHECK(r.content_length == 100000000 && strcmp(r.method, "PUT") == 0);
    CHECK(strcmp(r.content_type, "image/png") == 0 && r.keep_alive);
    CHECK_EQ(rt_http_parse_head((const uint8_t *)req, 30, &r, &why), RT_EAGAIN);
    static const char chunked[] = "PUT /upload/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    CHECK_EQ(rt_http_parse_head((const uint8_t *)chunked, sizeof(chunked) - 1, &r, &why), 411);
    static const char none[] = "PUT /upload/a HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK_EQ(rt_http_parse_head((const uint8_t *)none, sizeof(none) - 1, &r, &why), 0);
    CHECK(r.content_length == UINT64_MAX);
    /* The whole-request parse still refuses such a body at its head. */
    CHECK_EQ(rt_http_parse_request((const uint8_t *)req, sizeof(req) - 1, 65536, &r, &why), 413);
}

int main(void)
{
    if (tmpdir_make("test_upload") != 0)
        return 2;
    snprintf(root, sizeof(root), "%s/upload", tmpdir_path);
    RUN(test_names);
    RUN(test_slot_put_get);
    RUN(test_quota);
    RUN(test_timeout_and_sweep);
    RUN(test_forget);
    RUN(test_parse_head);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

/*
** HTTP file upload (XEP-0363), the files' side: slots, the files uploaded into them, and
** their expiry, under one directory (data_dir/upload). The XMPP service hands out slots
** (actors/c2s/c2s_upload.c) and the HTTP listener takes the PUTs and serves the GETs
** (actors/http/http_upload.c); they share nothing but this directory.
**
** Layout: ROOT/USER/SLOT.meta, then SLOT.part while the slot is open, SLOT.data once its file
** came whole. USER is 32 hex digits of an HMAC of the uploader's bare JID under a key kept in
** ROOT/.key (a file's address does not tell who uploaded it, nor can the directory of a JID
** be computed without the key); SLOT is 128 random bits in hex, which is what makes a URL
** unguessable. The .part is made at the slot's size (sparse), so it holds its place in the
** user's quota from the slot on, and a PUT writes into it, then renames it to .data.
**
** BLOCKING: every call does file I/O; the slots and the sweep run on RT_TYPE_BLOCKING actors.
** The PUT and GET calls are for the HTTP connections: they open one file each, and what they
** write goes to the page cache; rt_upload_put_end, which syncs it, is the upload actor's.
*/
#ifndef RT_XMPP_UPLOAD_H
#define RT_XMPP_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define RT_UPLOAD_DIR "upload"     /* under data_dir */
#define RT_UPLOAD_NAME_MAX 255     /* bytes of a file's name */
#define RT_UPLOAD_TYPE_MAX 127     /* bytes of a content type */
#define RT_UPLOAD_FILES_MAX 10000  /* slots and files one user holds at once */
#define RT_UPLOAD_PART_GRACE_S 600 /* an open slot unwritten this long after its time: gone */
#define RT_UPLOAD_ID_HEX 32

typedef struct rt_upload_id_s {
    char user[RT_UPLOAD_ID_HEX + 1];
    char slot[RT_UPLOAD_ID_HEX + 1];
} rt_upload_id_t;

typedef struct rt_upload_s rt_upload_t;

/* ROOT for a data_dir (data_dir/upload), the one place both sides take it from. */
void rt_upload_root(const char *data_dir, char *out, size_t cap);

/* Opens ROOT (made 0700 if missing) and its key (made if missing): 0, or RT_EAGAIN with err. */
int rt_upload_open(const char *root, rt_upload_t **out, char *err, size_t errlen);
void rt_upload_close(rt_upload_t *u);

/* Whether name may be an uploaded file's name: 1..RT_UPLOAD_NAME_MAX bytes of valid UTF-8, no
   '/', '\\' or control character, not "." or "..". */
bool rt_upload_name_ok(const char *name, size_t len);
/* Whether type may be a content type: type/subtype (RFC 6838 characters), parameters after ';'. */
bool rt_upload_type_ok(const char *type);

/*
** A slot for bare's file name of size bytes (type: "" for none): 0 with *id; RT_ELIMIT when
** the user's files and open slots would pass quota bytes (0: none) or RT_UPLOAD_FILES_MAX,
** *used then their bytes; RT_EINVAL for a name or type refused above; RT_EAGAIN for an I/O
** failure (logged).
*/
int rt_upload_slot(rt_upload_t *u, const char *bare, const char *name, uint64_t size,
                   const char *type, uint64_t quota, rt_upload_id_t *id, uint64_t *used);

/*
** The part of ROOT/user/slot/name, a request path's three segments (name percent-encoded
** as in a URL): 0 with *id and the decoded name, or RT_EINVAL.
*/
int rt_upload_parse(const char *path, rt_upload_id_t *id, char *name, size_t cap);

/*
** A PUT of len bytes of type into id's slot: 0 with *fd open for writing at 0 (and locked: the
** slot takes one PUT at a time); RT_ENOTFOUND (no such slot, or another name), RT_EEXIST (its
** file came already, or another PUT is writing it), RT_ELIMIT (len is not
** the slot's size), RT_EPROTO (type is not the slot's), RT_EBUSY (the slot's time, its first
** slot_timeout seconds, is over), RT_EAGAIN (I/O).
*/
int rt_upload_put_open(const char *root, const rt_upload_id_t *id, const char *name, uint64_t len,
                       const char *type, uint32_t slot_timeout, int *fd);
/* The PUT's bytes came whole: synced, closed, the file served from now on. 0 or RT_EAGAIN. */
int rt_upload_put_end(const char *root, const rt_upload_id_t *id, int fd);

/*
** A GET: 0 with *fd open for reading, *size, its content type (as given to the slot, else
** application/octet-stream) into type; RT_ENOTFOUND otherwise.
*/
int rt_upload_get_open(const char *root, const rt_upload_id_t *id, const char *name, int *fd,
                       uint64_t *size, char *type, size_t cap);

/* Removes every file and slot of bare's (its account is gone): how many. */
size_t rt_upload_forget(rt_upload_t *u, const char *bare);

/*
** Removes what is over: files older than expire seconds (0: files stay), slots unwritten
** slot_timeout + RT_UPLOAD_PART_GRACE_S seconds after their last write, and users' empty
** directories. Returns the files and slots removed.
*/
size_t rt_upload_sweep(rt_upload_t *u, uint64_t expire, uint32_t slot_timeout, time_t now);

#endif

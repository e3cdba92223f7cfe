/*
** `rtd passwd`: adds, changes and deletes users of a password file, as mosquitto_passwd
** does, rewriting the file whole and renaming it into place.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "auth_impl.h"

/* The usage on out; asked for (--help) it is the answer (0), else the complaint (2). */
static int passwd_usage(FILE *out)
{
    fprintf(out,
            "usage: rtd passwd [-c] [-b] [-I ROUNDS] FILE USER [PASSWORD]\n"
            "       rtd passwd -D FILE USER\n"
            "  -c         create a new file (replaces an existing one)\n"
            "  -b         take the password from the command line instead of prompting\n"
            "  -D         delete USER\n"
            "  -I ROUNDS  PBKDF2 rounds for the new hash (default %u; each login that is\n"
            "             not a repeat of the last good one costs this many)\n",
            RT_AUTH_PBKDF2_ITERATIONS);
    return out == stdout ? 0 : 2;
}

/* A user name that the file can hold and MQTT can send. */
static const char *bad_user_name(const char *user)
{
    size_t n = strlen(user);
    if (n == 0 || n > RT_AUTH_MAX_NAME)
        return "must be 1 to 65535 bytes";
    if (strchr(user, ':'))
        return "must not contain ':'";
    if (user[0] == '#' || user[0] == ' ' || user[0] == '\t')
        return "must not start with '#' or a blank";
    for (const char *p = user; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return "must not contain control characters";
    return NULL;
}

char *rt_auth_read_password(const char *prompt)
{
    struct termios old, quiet;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &old) == 0;
    if (tty) {
        fprintf(stderr, "%s", prompt);
        quiet = old;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (tty) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
        fprintf(stderr, "\n");
    }
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = 0;
    return line;
}

char *rt_auth_ask_new_password(const char **why)
{
    char *pw = rt_auth_read_password("Password: ");
    char *again = pw ? rt_auth_read_password("Reenter password: ") : NULL;
    *why = !pw || !again            ? "no password was given"
           : strcmp(pw, again) != 0 ? "the passwords do not match"
                                    : NULL;
    if (again) {
        OPENSSL_cleanse(again, strlen(again));
        free(again);
    }
    if (*why && pw) {
        OPENSSL_cleanse(pw, strlen(pw));
        free(pw);
        pw = NULL;
    }
    return pw;
}

/* Writes len bytes to path through a temporary file (mode 0600) and a rename. */
static int write_atomically(const char *path, const char *data, size_t len)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp)
        return ENOMEM;
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return e;
    }
    int e = fchmod(fd, 0600) == 0 ? 0 : errno;
    for (size_t off = 0; e == 0 && off < len;) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno != EINTR)
            e = errno;
        else if (w > 0)
            off += (size_t)w;
    }
    if (e == 0 && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e)
        unlink(tmp);
    free(tmp);
    return e;
}

/*
** The new file into out: every line of old kept as it is, except USER's, which is replaced
** by "USER:hash" (or dropped when hash is NULL); that line is appended when USER had none.
** *found says whether it had one. Check out->oom after.
*/
static void rewrite_file(rt_buf_t *out, const char *old, size_t oldlen, const char *user,
                         const char *hash, bool *found)
{
    size_t ulen = strlen(user);
    *found = false;
    const char *pos = old, *end = old + oldlen;
    while (pos < end) {
        const char *nl = memchr(pos, '\n', (size_t)(end - pos));
        size_t n = nl ? (size_t)(nl - pos) : (size_t)(end - pos);
        size_t userlen, hashlen;
        const char *line_hash, *why;
        bool mine = !*found && rt__auth_split_line(pos, n, &userlen, &line_hash, &hashlen, &why) &&
                    userlen == ulen && memcmp(pos, user, ulen) == 0;
        if (mine) {
            *found = true;
            if (hash)
                rt_buf_printf(out, "%s:%s\n", user, hash);
        } else {
            rt_buf_add(out, pos, n);
            rt_buf_add(out, "\n", 1);
        }
        pos += n + 1;
    }
    if (!*found && hash)
        rt_buf_printf(out, "%s:%s\n", user, hash);
}

int rt_auth_passwd_main(int argc, char **argv)
{
    bool create = false, batch = false, del = false;
    uint32_t iterations = RT_AUTH_PBKDF2_ITERATIONS;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return passwd_usage(stdout);
        if (strcmp(argv[i], "-I") == 0 && i + 1 < argc) {
            char *end;
            unsigned long n = strtoul(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < 1 || n > RT_AUTH_MAX_ITERATIONS) {
                fprintf(stderr, "rtd passwd: -I takes a count of rounds from 1 to %u\n",
                        RT_AUTH_MAX_ITERATIONS);
                return 2;
            }
            iterations = (uint32_t)n;
            continue;
        }
        for (const char *f = argv[i] + 1; *f; f++) {
            if (*f == 'c')
                create = true;
            else if (*f == 'b')
                batch = true;
            else if (*f == 'D')
                del = true;
            else {
                fprintf(stderr, "rtd passwd: unknown option -%c\n", *f);
                return passwd_usage(stderr);
            }
        }
    }
    int rest = argc - i;
    if ((del && (create || batch || rest != 2)) || (!del && rest != (batch ? 3 : 2)))
        return passwd_usage(stderr);
    const char *path = argv[i], *user = argv[i + 1];
    const char *why = bad_user_name(user);
    if (why) {
        fprintf(stderr, "rtd passwd: the user name %s\n", why);
        return 1;
    }

    /* The file as it is: it must load, so what we write loads too. */
    char err[RT_AUTH_ERR_LEN];
    char *old = NULL;
    size_t oldlen = 0;
    if (!create) {
        rt_auth_t *check;
        int rc = rt_auth_load(path, &check, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "rtd passwd: %s%s\n", err,
                    rc == RT_ENOTFOUND && !del ? " (use -c to create it)" : "");
            return 1;
        }
        rt_auth_free(check);
        if (rt__auth_read_file(path, &old, &oldlen, err, sizeof(err)) != 0) {
            fprintf(stderr, "rtd passwd: %s\n", err);
            return 1;
        }
    }

    char hash[RT_AUTH_HASH_MAX];
    if (!del) {
        char *pw = batch ? strdup(argv[i + 2]) : rt_auth_read_password("Password: ");
        char *again = batch || !pw ? NULL : rt_auth_read_password("Reenter password: ");
        const char *bad = !pw || (!batch && !again)          ? "no password was given"
                          : !batch && strcmp(pw, again) != 0 ? "the passwords do not match"
                          : !*pw                             ? "the password is empty"
                          : strlen(pw) > RT_AUTH_MAX_NAME    ? "the password is over 65535 bytes"
                                                             : NULL;
        int rc = bad ? 0
                     : rt_auth_hash_password((const uint8_t *)pw, strlen(pw), iterations, hash,
                                             sizeof(hash));
        if (pw)
            OPENSSL_cleanse(pw, strlen(pw));
        if (again)
            OPENSSL_cleanse(again, strlen(again));
        free(pw);
        free(again);
        if (bad || rc) {
            fprintf(stderr, "rtd passwd: %s\n", bad ? bad : rt_strerror(rc));
            free(old);
            return 1;
        }
    }
    bool found = false;
    rt_buf_t next = {0};
    rewrite_file(&next, old ? old : "", oldlen, user, del ? NULL : hash, &found);
    free(old);
    if (next.oom) {
        fprintf(stderr, "rtd passwd: out of memory\n");
        rt_buf_free(&next);
        return 1;
    }
    if (del && !found) {
        fprintf(stderr, "rtd passwd: %s: no user %s\n", path, user);
        rt_buf_free(&next);
        return 1;
    }
    int e = write_atomically(path, next.data, next.len);
    rt_buf_free(&next);
    if (e) {
        fprintf(stderr, "rtd passwd: %s: cannot write: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

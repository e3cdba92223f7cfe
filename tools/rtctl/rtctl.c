/*
 * rtctl: command line, connection and protocol (docs/ADMIN.md).
 *
 * A request is one line of double-quoted words; a response is `CODE LENGTH\n` and exactly
 * LENGTH bytes of body. rtctl writes the body to stdout (to stderr when CODE >= 400) and
 * exits 0 for 2xx, 1 for 4xx/5xx and 2 when it could not ask (usage, no connection, a late
 * or broken response).
 */
#define _GNU_SOURCE /* O_PATH */
#include "rtctl.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "auth.h"
#include "config.h"

static const char *usage_text =
    "usage: rtctl [-s|--socket PATH | -c|--config FILE] [--json] [--timeout S] COMMAND [ARGS...]\n"
    "       rtctl COMMAND --help\n"
    "Sends COMMAND to rtd's admin socket and prints the reply (docs/ADMIN.md).\n"
    "  -s, --socket PATH  the admin socket\n"
    "  -c, --config FILE  rtd's config: its admin_socket, else data_dir/rtd.sock, resolved as\n"
    "                     rtd resolves them\n"
    "  --json             a JSON reply: raw numbers (bytes, seconds as the key names them);\n"
    "                     text shows sizes as K/M/G (1024) and durations in seconds\n"
    "  --timeout S        bound on connecting and on each reply, seconds (default 30)\n"
    "  -h, --help         this text and, when rtd answers, its command list\n"
    "The socket: -s, else -c's, else $RTCTL_SOCKET, else " RTCTL_DEFAULT_WHERE ".\n"
    "Exit: 0 done, 1 rtd refused or failed the command, 2 usage error or no answer.\n"
    "trace client ID | trace topic FILTER [--duration S] [--payload N]: the packets of one\n"
    "  client (or the PUBLISH packets on one filter's topics) as they pass, one line each\n"
    "  (--json: one object each), for S seconds (60) or until Ctrl-C; N payload bytes shown.\n";

double rtctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int rtctl_parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || v > 86400.0 * 365)
        return -1;
    *out = v;
    return 0;
}

const char *rtctl_strerror(int err)
{
    switch (err) {
    case RTCTL_ELOST:
        return "lost connection to rtd";
    case RTCTL_ETIMEOUT:
        return "no complete reply from rtd in time (see --timeout)";
    case RTCTL_EPROTO:
        return "rtd's reply does not follow the protocol";
    case RTCTL_ETOOLONG:
        return "the request is longer than 64 KiB";
    default:
        return "unknown error";
    }
}

/* Milliseconds left until deadline, for poll(); 0 once it has passed. */
static int ms_left(double deadline)
{
    double left = deadline - rtctl_now();
    if (left <= 0)
        return 0;
    return left > 3600.0 ? 3600000 : (int)(left * 1000.0) + 1;
}

/* Waits until fd is ready for events or deadline passes: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = ms_left(deadline);
        int n = poll(&p, 1, ms);
        if (n > 0)
            return 1;
        if (n == 0 && ms == 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return 1; /* let the read or write report it */
    }
}

/*
 * Fills *addr for path. A path longer than sun_path goes through the directory: an O_PATH
 * descriptor of it, named as /proc/self/fd/N/NAME (rtd binds long paths the same way).
 * Returns 0, or -1 with errno set; *dirfd is -1 or a descriptor for the caller to close.
 */
static int socket_addr(const char *path, struct sockaddr_un *addr, int *dirfd)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    *dirfd = -1;
    size_t len = strlen(path);
    if (len == 0) {
        errno = ENOENT;
        return -1;
    }
    if (len < sizeof(addr->sun_path)) {
        memcpy(addr->sun_path, path, len + 1);
        return 0;
    }
    const char *slash = strrchr(path, '/');
    if (!slash || !slash[1]) {
        errno = ENAMETOOLONG;
        return -1;
    }
    size_t dlen = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(dlen + 1);
    if (!dir)
        return -1;
    memcpy(dir, path, dlen);
    dir[dlen] = 0;
    *dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (*dirfd < 0)
        return -1;
    int n =
        snprintf(addr->sun_path, sizeof(addr->sun_path), "/proc/self/fd/%d/%s", *dirfd, slash + 1);
    if (n < 0 || (size_t)n >= sizeof(addr->sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

/* The sentence for a failed connect to path with errno err, into buf. */
static void connect_error(const char *path, int err, double timeout_s, char *buf, size_t size)
{
    struct stat st;
    switch (err) {
    case ENOENT:
    case ENOTDIR:
        snprintf(buf, size, "rtd is not running (no socket at %s)", path);
        break;
    case ECONNREFUSED:
        snprintf(buf, size, "rtd is not running (nothing listens on %s)", path);
        break;
    case EACCES:
    case EPERM:
        if (stat(path, &st) == 0)
            snprintf(buf, size,
                     "permission denied on %s (the admin socket is mode %04o, owned by UID "
                     "%u: run rtctl as that user)",
                     path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        else
            snprintf(buf, size,
                     "permission denied on %s (its directory is closed to UID %u: run rtctl "
                     "as the user rtd runs as)",
                     path, (unsigned)getuid());
        break;
    case EAGAIN:
    case ETIMEDOUT:
        snprintf(buf, size, "rtd did not accept a connection on %s within %g s", path, timeout_s);
        break;
    case ENAMETOOLONG:
        snprintf(buf, size, "cannot connect to %s: the socket's name is too long", path);
        break;
    default:
        snprintf(buf, size, "cannot connect to %s: %s", path, strerror(err));
        break;
    }
}

/*
 * Connects within timeout_s. A unix stream connect blocks only while the listener's
 * backlog is full, and SO_SNDTIMEO bounds that wait (it then fails with EAGAIN).
 * On failure fills why and returns -1.
 */
static int conn_open(rtctl_conn_t *c, const char *path, double timeout_s, char *why, size_t whysize)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->path = path;
    c->timeout_s = timeout_s;
    struct sockaddr_un addr;
    int dirfd;
    int err = 0;
    if (socket_addr(path, &addr, &dirfd) < 0) {
        err = errno;
        goto fail;
    }
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        err = errno;
        goto fail;
    }
    struct timeval tv = {.tv_sec = (time_t)timeout_s,
                         .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    while (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        if (errno != EINTR) {
            err = errno;
            goto fail;
        }
    }
    if (dirfd >= 0)
        close(dirfd);
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    return 0;
fail:
    if (dirfd >= 0)
        close(dirfd);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    connect_error(path, err, timeout_s, why, whysize);
    return -1;
}

int rtctl_conn_open(rtctl_conn_t *c, const char *path, double timeout_s)
{
    char why[1024];
    if (conn_open(c, path, timeout_s, why, sizeof(why)) == 0)
        return 0;
    fprintf(stderr, "rtctl: %s\n", why);
    return -1;
}

void rtctl_conn_close(rtctl_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
}

/* Appends word to line as a double-quoted word: `"` and `\` escaped with a backslash,
 * control bytes and DEL as \xHH, every other byte as it is. */
static size_t quote_word(char *line, size_t at, size_t cap, const char *word)
{
    static const char hex[] = "0123456789abcdef";
    if (at < cap)
        line[at] = '"';
    at++;
    for (const unsigned char *p = (const unsigned char *)word; *p; p++) {
        char esc[4];
        size_t n = 0;
        if (*p == '"' || *p == '\\') {
            esc[n++] = '\\';
            esc[n++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            esc[n++] = '\\';
            esc[n++] = 'x';
            esc[n++] = hex[*p >> 4];
            esc[n++] = hex[*p & 15];
        } else {
            esc[n++] = (char)*p;
        }
        for (size_t i = 0; i < n; i++, at++)
            if (at < cap)
                line[at] = esc[i];
    }
    if (at < cap)
        line[at] = '"';
    return at + 1;
}

static int send_all(rtctl_conn_t *c, const char *buf, size_t len, double deadline)
{
    while (len > 0) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(c->fd, POLLOUT, deadline))
                return RTCTL_ETIMEOUT;
            continue;
        }
        return RTCTL_ELOST;
    }
    return 0;
}

/* Reads at most size bytes into buf (at least one), waiting until deadline. */
static int recv_some(rtctl_conn_t *c, char *buf, size_t size, size_t *got, double deadline)
{
    for (;;) {
        ssize_t n = recv(c->fd, buf, size, 0);
        if (n > 0) {
            *got = (size_t)n;
            return 0;
        }
        if (n == 0)
            return RTCTL_ELOST;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return RTCTL_ELOST;
        if (!wait_fd(c->fd, POLLIN, deadline))
            return RTCTL_ETIMEOUT;
    }
}

/* Parses `CODE LENGTH` (the line without its `\n`): three digits, one space, digits. */
static int parse_status(const char *s, size_t n, int *code, size_t *len)
{
    if (n < 5 || s[3] != ' ')
        return RTCTL_EPROTO;
    for (int i = 0; i < 3; i++)
        if (s[i] < '0' || s[i] > '9')
            return RTCTL_EPROTO;
    *code = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
    if (*code < 100)
        return RTCTL_EPROTO;
    size_t v = 0;
    for (size_t i = 4; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || i - 4 >= 10)
            return RTCTL_EPROTO;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    if (v > RTCTL_MAX_BODY)
        return RTCTL_EPROTO;
    *len = v;
    return 0;
}

static int read_response(rtctl_conn_t *c, int *code, double deadline)
{
    char status[RTCTL_MAX_STATUS];
    size_t slen = 0;
    for (;;) {
        if (c->roff == c->rlen) {
            c->roff = c->rlen = 0;
            int r = recv_some(c, c->rbuf, sizeof(c->rbuf), &c->rlen, deadline);
            if (r)
                return r;
        }
        char ch = c->rbuf[c->roff++];
        if (ch == '\n')
            break;
        if (slen == sizeof(status))
            return RTCTL_EPROTO;
        status[slen++] = ch;
    }
    size_t len;
    int r = parse_status(status, slen, code, &len);
    if (r)
        return r;
    if (c->body_cap < len + 1) {
        char *b = realloc(c->body, len + 1);
        if (!b)
            return RTCTL_EPROTO;
        c->body = b;
        c->body_cap = len + 1;
    }
    size_t have = c->rlen - c->roff < len ? c->rlen - c->roff : len;
    memcpy(c->body, c->rbuf + c->roff, have);
    c->roff += have;
    while (have < len) {
        size_t got;
        r = recv_some(c, c->body + have, len - have, &got, deadline);
        if (r)
            return r;
        have += got;
    }
    c->body[len] = 0;
    c->body_len = len;
    return 0;
}

int rtctl_request(rtctl_conn_t *c, const char *const *words, int nwords, int *code)
{
    size_t len = 0;
    for (int i = 0; i < nwords; i++) {
        len += i > 0; /* the space before every word but the first */
        len = quote_word(NULL, len, 0, words[i]);
    }
    if (len + 1 > RTCTL_MAX_LINE)
        return RTCTL_ETOOLONG;
    char *line = malloc(len + 1);
    if (!line)
        return RTCTL_ETOOLONG;
    size_t at = 0;
    for (int i = 0; i < nwords; i++) {
        if (i > 0)
            line[at++] = ' ';
        at = quote_word(line, at, len, words[i]);
    }
    line[at++] = '\n';
    double deadline = rtctl_now() + c->timeout_s;
    int r = send_all(c, line, at, deadline);
    free(line);
    if (r)
        return r;
    return read_response(c, code, deadline);
}

static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "rtctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage_text);
    exit(RTCTL_EXIT_USAGE);
}

static void write_all(FILE *f, const char *buf, size_t len)
{
    if (len > 0 && fwrite(buf, 1, len, f) != len)
        exit(RTCTL_EXIT_USAGE);
    fflush(f);
}

/* `rtctl help`: our usage, then the server's command list when rtd answers. */
static int help_main(const char *path, double timeout_s)
{
    fputs(usage_text, stdout);
    fputs(rtctl_top_usage, stdout);
    fflush(stdout);
    rtctl_conn_t c;
    char why[1024];
    if (conn_open(&c, path, timeout_s, why, sizeof(why)) < 0) {
        fprintf(stderr, "rtctl: rtd's own command list needs a running rtd: %s\n", why);
        return RTCTL_EXIT_OK;
    }
    const char *words[] = {"help"};
    int code = 0;
    int r = rtctl_request(&c, words, 1, &code);
    if (r == 0 && code >= 200 && code < 300) {
        fputs("\nrtd commands:\n", stdout);
        write_all(stdout, c.body, c.body_len);
    } else {
        fprintf(stderr, "rtctl: rtd's help failed: %s\n", r ? rtctl_strerror(r) : "an error reply");
    }
    rtctl_conn_close(&c);
    return RTCTL_EXIT_OK;
}

/*
** The socket rtd binds for config: its admin_socket, else data_dir/rtd.sock, with relative
** paths made absolute against the config's directory, by rtd's own loader. Into out; 0, or
** RTCTL_EXIT_USAGE (said on stderr). missing_ok: a config that is not there is no error
** (RTCTL_ENOCONFIG, nothing said).
*/
static int socket_of_config(const char *config, bool missing_ok, char *out, size_t len)
{
    if (missing_ok && access(config, F_OK) != 0 && errno == ENOENT)
        return RTCTL_ENOCONFIG;
    rt_conf_t *conf = malloc(sizeof(*conf));
    char err[RT_CONF_ERR_LEN];
    if (!conf) {
        fprintf(stderr, "rtctl: out of memory\n");
        return RTCTL_EXIT_USAGE;
    }
    rt_conf_defaults(conf);
    int rc = rt_conf_load(conf, config, err, sizeof(err));
    if (rc == 0 && rt_conf_admin_socket(conf, out, len) != 0)
        snprintf(err, sizeof(err), "%s: its admin socket's path is too long", config);
    else if (rc == 0)
        err[0] = 0;
    free(conf);
    if (!err[0])
        return 0;
    fprintf(stderr, "rtctl: cannot find rtd's socket in the config: %s\n(-s PATH or "
                    "$" RTCTL_SOCKET_ENV " names the socket itself)\n", err);
    return RTCTL_EXIT_USAGE;
}

/* Takes the value of option name at argv[*i] (`--name V` or `--name=V`). */
static const char *option_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) == 0 && a[n] == '=')
        return a + n + 1;
    if (*i + 1 >= argc)
        usage_error("%s needs a value", name);
    return argv[++*i];
}

static int is_option(const char *a, const char *name)
{
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == 0 || (a[n] == '=' && name[1] == '-'));
}

/*
** The socket to ask: -s, else -c's config's, else $RTCTL_SOCKET, else the installed config's
** (RT_DEFAULT_CONFIG, when this rtctl was built for installing and that file exists), else
** data/rtd.sock. Into out; 0 or RTCTL_EXIT_USAGE.
*/
static int pick_socket(const char *socket, const char *config, char *out, size_t len)
{
    const char *env = getenv(RTCTL_SOCKET_ENV);
    if (socket || (!config && env && *env)) {
        snprintf(out, len, "%s", socket ? socket : env);
        return 0;
    }
    if (config)
        return socket_of_config(config, false, out, len);
#ifdef RT_DEFAULT_CONFIG
    int rc = socket_of_config(RT_DEFAULT_CONFIG, true, out, len);
    if (rc != RTCTL_ENOCONFIG)
        return rc;
#endif
    snprintf(out, len, "%s", RTCTL_DEFAULT_SOCKET);
    return 0;
}

/*
** Whether the command sets an XMPP account's password without giving it (`xmpp user add
** USER@HOST`): rtctl then asks for it twice, as `rtd xmpp user` does, and sends it as
** --password, which rtd never logs.
*/
static bool wants_password(int n, char **w)
{
    if (n < 4 || strcmp(w[0], "xmpp") != 0 || strcmp(w[1], "user") != 0 ||
        (strcmp(w[2], "add") != 0 && strcmp(w[2], "passwd") != 0))
        return false;
    for (int k = 3; k < n; k++)
        if (strcmp(w[k], "--password") == 0 || strncmp(w[k], "--password=", 11) == 0 ||
            strcmp(w[k], "--help") == 0)
            return false;
    return true;
}

int main(int argc, char **argv)
{
    const char *socket = NULL, *config = NULL;
    double timeout_s = RTCTL_DEFAULT_TIMEOUT_S;
    int json = 0, help = 0;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (is_option(a, "-s") || is_option(a, "--socket")) {
            socket = option_value(argc, argv, &i, a[1] == 's' ? "-s" : "--socket");
        } else if (is_option(a, "-c") || is_option(a, "--config")) {
            config = option_value(argc, argv, &i, a[1] == 'c' ? "-c" : "--config");
        } else if (is_option(a, "--timeout")) {
            const char *v = option_value(argc, argv, &i, "--timeout");
            if (rtctl_parse_seconds(v, &timeout_s) < 0)
                usage_error("--timeout takes a positive number of seconds, not '%s'", v);
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            help = 1;
        } else {
            usage_error("unknown option '%s'", a);
        }
    }
    if (socket && config)
        usage_error("%s", "-s and -c both name the socket: give one");
    static char path[RTCTL_MAX_PATH];
    int picked = pick_socket(socket, config, path, sizeof(path));
    if (picked)
        return picked;
    signal(SIGPIPE, SIG_IGN);
    if (help || (i < argc && strcmp(argv[i], "help") == 0 && i + 1 == argc && !json))
        return help_main(path, timeout_s);
    if (i >= argc)
        usage_error("%s", "no command given");
    if (strcmp(argv[i], "top") == 0)
        return rtctl_top_main(path, timeout_s, json, argc - i - 1, argv + i + 1);

    char *password = NULL;
    if (wants_password(argc - i, argv + i)) {
        const char *why = NULL;
        if (!(password = rt_auth_ask_new_password(&why))) {
            fprintf(stderr, "rtctl: %s\n", why);
            return RTCTL_EXIT_USAGE;
        }
    }
    int nwords = argc - i + json + (password ? 2 : 0);
    const char **words = calloc((size_t)nwords, sizeof(*words));
    if (!words)
        return RTCTL_EXIT_USAGE;
    for (int k = i; k < argc; k++)
        words[k - i] = argv[k];
    if (password) {
        words[argc - i] = "--password";
        words[argc - i + 1] = password;
    }
    if (json)
        words[nwords - 1] = "--json";

    rtctl_conn_t c;
    if (rtctl_conn_open(&c, path, timeout_s) < 0) {
        free(words);
        return RTCTL_EXIT_USAGE;
    }
    int code = 0;
    int r = rtctl_request(&c, words, nwords, &code);
    free(words);
    if (password) {
        OPENSSL_cleanse(password, strlen(password));
        free(password);
    }
    if (r) {
        fprintf(stderr, "rtctl: %s\n", rtctl_strerror(r));
        rtctl_conn_close(&c);
        return RTCTL_EXIT_USAGE;
    }
    /* A streaming answer (trace): parts until the final one; rtd sends one every second. */
    while (code == 206) {
        write_all(stdout, c.body, c.body_len);
        r = read_response(&c, &code, rtctl_now() + c.timeout_s);
        if (r) {
            fprintf(stderr, "rtctl: %s\n", rtctl_strerror(r));
            rtctl_conn_close(&c);
            return RTCTL_EXIT_USAGE;
        }
    }
    int rc;
    if (code >= 200 && code < 300) {
        write_all(stdout, c.body, c.body_len);
        rc = RTCTL_EXIT_OK;
    } else if (code >= 400 && code < 600) {
        write_all(stderr, c.body, c.body_len);
        rc = RTCTL_EXIT_FAIL;
    } else {
        fprintf(stderr, "rtctl: %s (status %d)\n", rtctl_strerror(RTCTL_EPROTO), code);
        rc = RTCTL_EXIT_USAGE;
    }
    rtctl_conn_close(&c);
    return rc;
}

/*
 * rtctl top: a live full-screen view of rtd, like Erlang's etop or observer_cli.
 *
 * rtd renders the screen: over one connection kept open, rtctl asks for
 * `top -n N --sort KEY --width W --height H` every --delay seconds (rtd keeps the previous
 * sample of the connection for the per-interval figures) and prints the body in the
 * terminal's alternate screen. rtctl adds one line of its own at the bottom: the sort it
 * asked for and the refresh delay, or the last error rtd returned (the view keeps running).
 * Batch modes (--once, --json, or stdout not a terminal) print samples without any screen
 * handling.
 *
 * The terminal is restored on every way out: q, Ctrl-C, SIGINT/SIGTERM/SIGHUP, a lost
 * connection, and exit() from anywhere (atexit).
 */
#include "rtctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define TOP_DEFAULT_DELAY_S 1.0
#define TOP_BATCH_WIDTH 132  /* --once when stdout is not a terminal, columns */
#define TOP_FALLBACK_COLS 80 /* a terminal that reports no size */
#define TOP_FALLBACK_ROWS 24
#define TOP_HEADER_SLACK 64   /* --once -n N asks for N + this many rows: room for the panel */
#define TOP_MAX_ROWS 10000000 /* -n, --count bound */
#define TOP_MIN_WIDTH 20      /* rtd's narrowest screen: a smaller terminal is clipped */
#define TOP_MIN_HEIGHT 8      /* rtd's shortest screen, rows */

static const struct {
    char key;
    const char *sort;
} sort_keys[] = {
    {'r', "reductions"}, {'R', "reductions_total"}, {'m', "memory"}, {'b', "mailbox"},
    {'c', "cpu"},        {'C', "cpu_total"},        {'g', "gc_pause"},
};
#define N_SORT_KEYS (sizeof(sort_keys) / sizeof(sort_keys[0]))

typedef struct top_s {
    rtctl_conn_t conn;
    const char *sort; /* rtd's KEY; points into sort_keys or argv */
    double delay_s;
    long rows;                      /* -n; 0 = as many as the screen holds */
    int width;                      /* the terminal, columns */
    int height;                     /* the terminal, rows */
    long batch_width, batch_height; /* --width/--height for --once; 0: the terminal's */
    char *frame;                    /* the last frame rtd rendered (owned), NULL before the first */
    size_t frame_len;
    char error[512]; /* the last error reply's first line, "" after a good frame */
} top_t;

/* ---- the terminal: saved state for restoring it from anywhere ---- */

static struct termios saved_termios;
static volatile sig_atomic_t term_active; /* raw mode and the alternate screen are on */
static int sig_pipe[2] = {-1, -1};        /* self-pipe: signal handlers write a byte */

static void write_fd(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

static void term_restore(void)
{
    if (!term_active)
        return;
    term_active = 0;
    static const char leave[] = "\033[?25h\033[?1049l";
    write_fd(STDOUT_FILENO, leave, sizeof(leave) - 1);
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_termios);
}

/* Raw input (no echo, no line editing, Ctrl-C as a key), output processing kept so `\n`
 * still returns the carriage; then the alternate screen with the cursor hidden. */
static int term_setup(void)
{
    if (tcgetattr(STDIN_FILENO, &saved_termios) < 0)
        return -1;
    struct termios t = saved_termios;
    t.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    t.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);
    t.c_cflag |= CS8;
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) < 0)
        return -1;
    term_active = 1;
    atexit(term_restore);
    static const char enter[] = "\033[?1049h\033[?25l";
    write_fd(STDOUT_FILENO, enter, sizeof(enter) - 1);
    return 0;
}

static void on_signal(int sig)
{
    int saved = errno;
    char b = sig == SIGWINCH ? 'w' : 'q';
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* The pipe is full: a wake-up is pending already. */
    }
    errno = saved;
}

static int signals_setup(void)
{
    if (pipe(sig_pipe) < 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(sig_pipe[i], F_SETFL, fcntl(sig_pipe[i], F_GETFL) | O_NONBLOCK);
        fcntl(sig_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaction(sigs[i], &sa, NULL);
    return 0;
}

/* The terminal's size; fallbacks when it reports none. */
static void term_size(int fd, int *cols, int *rows)
{
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
        return;
    }
    *cols = TOP_FALLBACK_COLS;
    *rows = TOP_FALLBACK_ROWS;
}

/* ---- leaving ---- */

/* rtd went away or broke the protocol: the terminal back, a sentence, exit 1. */
static void top_fail(top_t *t, int err)
{
    term_restore();
    if (err == RTCTL_ELOST)
        fprintf(stderr, "rtctl: lost connection to rtd\n");
    else
        fprintf(stderr, "rtctl: %s\n", rtctl_strerror(err));
    rtctl_conn_close(&t->conn);
    exit(RTCTL_EXIT_FAIL);
}

const char rtctl_top_usage[] =
    "usage: rtctl top [-d|--delay S] [-n N] [--sort KEY] [--once [--width W] [--height H]]\n"
    "                 [--count K] [--json]\n"
    "top: a live view of the node and its busiest actors, refreshed every -d seconds (1).\n"
    "  keys: r reductions/interval  R reductions total  m memory  b mailbox\n"
    "        c CPU/interval  C CPU total  g longest collection\n"
    "        q or Ctrl-C quit; any other key redraws\n"
    "  --once: one frame as plain text (also when stdout is not a terminal); -n N rows;\n"
    "  --json: one JSON sample per line, --count K of them -d apart (default 1).\n"
    "  KEY: reductions, reductions_total, memory, mailbox, cpu, cpu_total, gc_pause.\n";

static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "rtctl top: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see rtctl --help)\n");
    exit(RTCTL_EXIT_USAGE);
}

static long parse_count(const char *flag, const char *v)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 1 || n > TOP_MAX_ROWS)
        usage_error("%s takes a positive whole number", flag);
    return n;
}

static const char *valid_sort(const char *key)
{
    for (size_t i = 0; i < N_SORT_KEYS; i++)
        if (strcmp(key, sort_keys[i].sort) == 0)
            return sort_keys[i].sort;
    usage_error("unknown sort key '%s' (reductions, reductions_total, memory, mailbox, cpu, "
                "cpu_total, gc_pause)",
                key);
    return NULL;
}

/* ---- one sample ---- */

/* Asks rtd for one sample. width/height < 0 are left out of the request; json asks for
 * JSON. Returns 0 with *code and t->conn.body, or an RTCTL_E* code. */
static int top_request(top_t *t, int json, long rows, int width, int height, int *code)
{
    char nbuf[24], wbuf[24], hbuf[24];
    const char *words[12];
    int n = 0;
    words[n++] = "top";
    if (rows > 0) {
        snprintf(nbuf, sizeof(nbuf), "%ld", rows);
        words[n++] = "-n";
        words[n++] = nbuf;
    }
    words[n++] = "--sort";
    words[n++] = t->sort;
    if (width > 0) {
        snprintf(wbuf, sizeof(wbuf), "%d", width);
        words[n++] = "--width";
        words[n++] = wbuf;
    }
    if (height > 0) {
        snprintf(hbuf, sizeof(hbuf), "%d", height);
        words[n++] = "--height";
        words[n++] = hbuf;
    }
    if (json)
        words[n++] = "--json";
    return rtctl_request(&t->conn, words, n, code);
}

/* Removes the line breaks inside a JSON body (a JSON string holds none raw), so a sample
 * is one line however rtd formats it; keeps one final `\n`. */
static size_t json_one_line(char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] != '\n' && s[i] != '\r')
            s[o++] = s[i];
    s[o++] = '\n';
    return o;
}

static void sleep_until(double when)
{
    for (;;) {
        double left = when - rtctl_now();
        if (left <= 0)
            return;
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* --json: count samples, delay apart, one JSON value a line. */
static int top_json(top_t *t, long count)
{
    double next = rtctl_now();
    for (long i = 0; i < count; i++) {
        if (i > 0)
            sleep_until(next);
        next = rtctl_now() + t->delay_s;
        int code = 0;
        int r = top_request(t, 1, t->rows, -1, -1, &code);
        if (r)
            top_fail(t, r);
        if (code < 200 || code >= 300) {
            fwrite(t->conn.body, 1, t->conn.body_len, stderr);
            return RTCTL_EXIT_FAIL;
        }
        size_t len = json_one_line(t->conn.body, t->conn.body_len);
        if (fwrite(t->conn.body, 1, len, stdout) != len || fflush(stdout) != 0)
            return RTCTL_EXIT_FAIL;
    }
    return RTCTL_EXIT_OK;
}

/* --once: one frame as rtd renders it, at the terminal's width (132 without one). */
static int top_once(top_t *t)
{
    int width = TOP_BATCH_WIDTH, height = -1;
    if (isatty(STDOUT_FILENO)) {
        term_size(STDOUT_FILENO, &width, &height);
    }
    if (t->rows > 0)
        height = (int)(t->rows + TOP_HEADER_SLACK);
    if (t->batch_width)
        width = (int)t->batch_width;
    if (t->batch_height)
        height = (int)t->batch_height;
    int code = 0;
    int r = top_request(t, 0, t->rows, width, height, &code);
    if (r)
        top_fail(t, r);
    FILE *out = code >= 200 && code < 300 ? stdout : stderr;
    fwrite(t->conn.body, 1, t->conn.body_len, out);
    fflush(out);
    return out == stdout ? RTCTL_EXIT_OK : RTCTL_EXIT_FAIL;
}

/* ---- the live screen ---- */

typedef struct buf_s {
    char *p;
    size_t len, cap;
} buf_t;

static void buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            term_restore();
            fprintf(stderr, "rtctl: out of memory\n");
            exit(RTCTL_EXIT_FAIL);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void buf_str(buf_t *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

/* Appends at most width columns of the line s[0..n) (a UTF-8 lead or ASCII byte counts as
 * one column): rtd renders to the width asked, this only guards a terminal that changed
 * size since. */
static void add_clipped(buf_t *b, const char *s, size_t n, int width)
{
    int cols = 0;
    size_t i = 0;
    for (; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch & 0xc0) == 0x80)
            continue;
        if (cols == width)
            break;
        cols++;
    }
    buf_add(b, s, i);
}

/* Clears the screen and draws the last frame in height - 1 rows, then rtctl's own line:
 * the error rtd returned, or the sort and the delay. */
static void top_draw(top_t *t)
{
    buf_t b = {0};
    buf_str(&b, "\033[H\033[2J");
    int rows = 0;
    const char *s = t->frame, *end = t->frame ? t->frame + t->frame_len : NULL;
    while (s && s < end && rows < t->height - 1) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        add_clipped(&b, s, n, t->width);
        buf_str(&b, "\n");
        rows++;
        s = nl ? nl + 1 : end;
    }
    for (; rows < t->height - 1; rows++)
        buf_str(&b, "\n");
    char line[768];
    if (t->error[0])
        snprintf(line, sizeof(line), "rtctl: %s", t->error);
    else
        snprintf(line, sizeof(line), "sort: %s | every %gs | q quit", t->sort, t->delay_s);
    buf_str(&b, "\033[7m");
    add_clipped(&b, line, strlen(line), t->width);
    buf_str(&b, "\033[0m");
    write_fd(STDOUT_FILENO, b.p, b.len);
    free(b.p);
}

/* Asks rtd for a frame of the terminal's size less rtctl's own line (at least the smallest
 * screen rtd renders; top_draw clips it to a smaller terminal) and draws it. */
static void top_refresh(top_t *t)
{
    int code = 0;
    int width = t->width < TOP_MIN_WIDTH ? TOP_MIN_WIDTH : t->width;
    int height = t->height - 1 < TOP_MIN_HEIGHT ? TOP_MIN_HEIGHT : t->height - 1;
    int r = top_request(t, 0, t->rows, width, height, &code);
    if (r)
        top_fail(t, r);
    if (code >= 200 && code < 300) {
        free(t->frame);
        t->frame = malloc(t->conn.body_len + 1);
        if (t->frame)
            memcpy(t->frame, t->conn.body, t->conn.body_len);
        t->frame_len = t->frame ? t->conn.body_len : 0;
        t->error[0] = 0;
    } else {
        const char *body = t->conn.body;
        size_t n = strcspn(body, "\n");
        snprintf(t->error, sizeof(t->error), "rtd says %d: %.*s", code, (int)n, body);
    }
    top_draw(t);
}

/* Reads the keys waiting on stdin. Returns 1 to quit, 0 otherwise; *redraw is set for any
 * key. Escape sequences (arrows, function keys) are skipped whole, so ESC [ C is not `C`. */
static int top_keys(top_t *t, int *redraw)
{
    char in[64];
    ssize_t n = read(STDIN_FILENO, in, sizeof(in));
    if (n == 0)
        return 1;
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : 1;
    *redraw = 1;
    for (ssize_t i = 0; i < n; i++) {
        char k = in[i];
        if (k == 'q' || k == 3)
            return 1;
        if (k == 033) {
            if (i + 1 < n && (in[i + 1] == '[' || in[i + 1] == 'O')) {
                i += 2;
                while (i < n && !(in[i] >= 0x40 && in[i] <= 0x7e))
                    i++;
            }
            continue;
        }
        for (size_t s = 0; s < N_SORT_KEYS; s++)
            if (sort_keys[s].key == k)
                t->sort = sort_keys[s].sort;
    }
    return 0;
}

static int top_live(top_t *t)
{
    if (signals_setup() < 0 || term_setup() < 0) {
        fprintf(stderr, "rtctl: cannot set up the terminal: %s\n", strerror(errno));
        return RTCTL_EXIT_FAIL;
    }
    term_size(STDOUT_FILENO, &t->width, &t->height);
    int redraw = 1;
    double next = 0;
    for (;;) {
        if (redraw || rtctl_now() >= next) {
            top_refresh(t);
            next = rtctl_now() + t->delay_s;
            redraw = 0;
        }
        struct pollfd p[3] = {
            {.fd = STDIN_FILENO, .events = POLLIN},
            {.fd = sig_pipe[0], .events = POLLIN},
            {.fd = t->conn.fd, .events = POLLIN},
        };
        double left = next - rtctl_now();
        int ms = left <= 0 ? 0 : (int)(left * 1000.0) + 1;
        int n = poll(p, 3, ms);
        if (n < 0 && errno != EINTR)
            top_fail(t, RTCTL_ELOST);
        if (n <= 0)
            continue;
        if (p[1].revents & POLLIN) {
            char sig[16];
            ssize_t k = read(sig_pipe[0], sig, sizeof(sig));
            for (ssize_t i = 0; i < k; i++) {
                if (sig[i] == 'q')
                    goto quit;
                term_size(STDOUT_FILENO, &t->width, &t->height);
                redraw = 1;
            }
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (top_keys(t, &redraw))
                goto quit;
        }
        if (p[2].revents) {
            /* Between requests rtd sends nothing: readable means closed (or broken). */
            char c;
            ssize_t k = recv(t->conn.fd, &c, 1, MSG_PEEK);
            top_fail(t, k > 0 ? RTCTL_EPROTO : RTCTL_ELOST);
        }
    }
quit:
    term_restore();
    return RTCTL_EXIT_OK;
}

int rtctl_top_main(const char *path, double timeout_s, int json, int argc, char **argv)
{
    top_t t;
    memset(&t, 0, sizeof(t));
    t.sort = "reductions";
    t.delay_s = TOP_DEFAULT_DELAY_S;
    int once = 0;
    long count = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(rtctl_top_usage, stdout);
            return RTCTL_EXIT_OK;
        } else if (strcmp(a, "--once") == 0) {
            once = 1;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-d") == 0 || strcmp(a, "--delay") == 0) {
            if (!v || rtctl_parse_seconds(v, &t.delay_s) < 0)
                usage_error("%s takes a positive number of seconds", a);
            i++;
        } else if (strcmp(a, "-n") == 0) {
            t.rows = parse_count(a, v ? v : "");
            i++;
        } else if (strcmp(a, "--width") == 0 || strcmp(a, "--height") == 0) {
            *(a[2] == 'w' ? &t.batch_width : &t.batch_height) = parse_count(a, v ? v : "");
            i++;
        } else if (strcmp(a, "--count") == 0) {
            count = parse_count(a, v ? v : "");
            i++;
        } else if (strcmp(a, "--sort") == 0) {
            if (!v)
                usage_error("%s needs a KEY", a);
            t.sort = valid_sort(v);
            i++;
        } else {
            usage_error("unknown argument '%s'", a);
        }
    }
    if (rtctl_conn_open(&t.conn, path, timeout_s) < 0)
        return RTCTL_EXIT_USAGE;
    int rc;
    if (json)
        rc = top_json(&t, count);
    else if (once || !isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO))
        rc = top_once(&t);
    else
        rc = top_live(&t);
    rtctl_conn_close(&t.conn);
    free(t.frame);
    return rc;
}

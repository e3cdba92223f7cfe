/*
** `rtd xmpp user add|passwd|del|list`: the operator's side of the XMPP accounts
** (accounts.h), on the xmpp.db under the data directory a running rtd uses too.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "accounts.h"
#include "auth.h"
#include "config.h"
#include "jid.h"

/* The usage on out; asked for (--help) it is the answer (0), else the complaint (2). */
static int usage(FILE *out, const char *default_config)
{
    fprintf(out,
            "usage: rtd xmpp user add    [-b] [-I ROUNDS] [-c FILE | -d DIR] USER@HOST [PASSWORD]\n"
            "       rtd xmpp user passwd [-b] [-I ROUNDS] [-c FILE | -d DIR] USER@HOST [PASSWORD]\n"
            "       rtd xmpp user del    [-c FILE | -d DIR] USER@HOST\n"
            "       rtd xmpp user list   [-c FILE | -d DIR] [HOST]\n"
            "       rtd xmpp user import [-I ROUNDS] [-c FILE | -d DIR] [ACCOUNTS]\n"
            "  -b         take the password from the command line instead of prompting\n"
            "  -I ROUNDS  PBKDF2 rounds of the new SCRAM keys (default %u, %u to %u; each\n"
            "             PLAIN login costs this many, and each SCRAM login the client)\n"
            "  -c FILE    the configuration whose data_dir holds %s (default %s)\n"
            "  -d DIR     the data directory itself\n"
            "  ACCOUNTS   a file (default: standard input) of one account a line: USER@HOST,\n"
            "             a space or tab, the password (the rest of the line); blank lines\n"
            "             and lines that begin with # are skipped\n",
            RT_SCRAM_ITERATIONS, RT_SCRAM_MIN_ITERATIONS, RT_SCRAM_MAX_ITERATIONS, RT_ACCOUNTS_FILE,
            default_config);
    return out == stdout ? 0 : 2;
}

typedef struct {
    const char *verb;
    const char *config, *dir;
    bool batch;
    uint32_t iterations;
    const char *words[2];
    int nwords;
} args_t;

/* -1 to go on, or the exit status to leave with (0 once --help is answered). */
static int parse_args(int argc, char **argv, const char *default_config, args_t *a)
{
    if (argc < 3 || strcmp(argv[1], "user") != 0)
        return argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
                   ? usage(stdout, default_config)
                   : usage(stderr, default_config);
    a->verb = argv[2];
    if (strcmp(a->verb, "--help") == 0 || strcmp(a->verb, "-h") == 0)
        return usage(stdout, default_config);
    for (int i = 3; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0)
            return usage(stdout, default_config);
        if (strcmp(o, "-b") == 0) {
            a->batch = true;
        } else if (strcmp(o, "-c") == 0 && i + 1 < argc) {
            a->config = argv[++i];
        } else if (strcmp(o, "-d") == 0 && i + 1 < argc) {
            a->dir = argv[++i];
        } else if (strcmp(o, "-I") == 0 && i + 1 < argc) {
            char *end;
            unsigned long n = strtoul(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < RT_SCRAM_MIN_ITERATIONS ||
                n > RT_SCRAM_MAX_ITERATIONS) {
                fprintf(stderr, "rtd xmpp: -I takes a count of rounds from %u to %u\n",
                        RT_SCRAM_MIN_ITERATIONS, RT_SCRAM_MAX_ITERATIONS);
                return 2;
            }
            a->iterations = (uint32_t)n;
        } else if (o[0] != '-' && a->nwords < 2) {
            a->words[a->nwords++] = o;
        } else {
            return usage(stderr, default_config);
        }
    }
    bool pw_verb = strcmp(a->verb, "add") == 0 || strcmp(a->verb, "passwd") == 0;
    bool ok = pw_verb                        ? a->nwords == (a->batch ? 2 : 1)
              : strcmp(a->verb, "del") == 0  ? a->nwords == 1 && !a->batch && !a->iterations
              : strcmp(a->verb, "list") == 0 ? a->nwords <= 1 && !a->batch && !a->iterations
              : strcmp(a->verb, "import") == 0 ? a->nwords <= 1 && !a->batch
                                               : false;
    return ok && !(a->config && a->dir) ? -1 : usage(stderr, default_config);
}

/* The data directory: -d, else the configuration's data_dir. 0 or an exit status. */
static int data_dir(const args_t *a, const char *default_config, const char *default_data_dir,
                    char *out, size_t len)
{
    if (a->dir) {
        snprintf(out, len, "%s", a->dir);
        return 0;
    }
    rt_conf_t *conf = malloc(sizeof(*conf));
    char err[RT_CONF_ERR_LEN];
    if (!conf) {
        fprintf(stderr, "rtd xmpp: out of memory\n");
        return 1;
    }
    rt_conf_defaults(conf);
    if (default_data_dir)
        snprintf(conf->data_dir, sizeof(conf->data_dir), "%s", default_data_dir);
    int rc = rt_conf_load(conf, a->config ? a->config : default_config, err, sizeof(err));
    if (rc)
        fprintf(stderr, "rtd xmpp: %s (name the data directory with -d DIR)\n", err);
    else
        snprintf(out, len, "%s", conf->data_dir);
    free(conf);
    return rc ? 2 : 0;
}

/* USER@HOST, prepared, into user and host. 0 or an exit status. */
static int split_jid(const char *text, char *user, char *host)
{
    const char *why = "";
    if (rt_jid_account(text, strlen(text), user, host, &why) == 0)
        return 0;
    fprintf(stderr, "rtd xmpp: %s: %s\n", text, why);
    return 2;
}

static int print_account(const char *host, const char *user, int64_t created_ms, void *arg)
{
    time_t t = (time_t)(created_ms / 1000);
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s@%s\tcreated %s\n", user, host, when);
    return 0;
}

/* The new password: from the command line (-b) or asked twice. NULL (said why) or malloc'd. */
static char *new_password(const args_t *a)
{
    if (a->batch)
        return strdup(a->words[1]);
    const char *why = NULL;
    char *pw = rt_auth_ask_new_password(&why);
    if (!pw)
        fprintf(stderr, "rtd xmpp: %s\n", why);
    return pw;
}

/* One line of an import, its end of line cut: NULL once added, else why not (in err or static). */
static const char *import_line(rt_accounts_t *db, const char *line, size_t len, uint32_t iterations,
                               char *err, size_t errlen)
{
    enum { LINE_MAX_BYTES = RT_JID_TEXT_MAX + 1 + RT_ACCOUNTS_PASSWORD_MAX };
    char user[RT_JID_PART_MAX + 1], host[RT_JID_PART_MAX + 1];
    size_t jlen = strcspn(line, " \t");
    const char *pw = line + jlen + strspn(line + jlen, " \t"), *why = "";
    if (len > LINE_MAX_BYTES)
        return "line too long";
    if (!*pw)
        return "no password after the address";
    if (rt_jid_account(line, jlen, user, host, &why) != 0)
        return why;
    if (rt_accounts_add(db, host, user, pw, strlen(pw), iterations, err, errlen) != 0)
        return err[0] ? err : "not added";
    return NULL;
}

/*
** `import`: each line of in an account, as add makes it; a line that cannot be added is
** reported with its number and the others go on. 0 when every line was added, else 1.
*/
static int import_accounts(rt_accounts_t *db, FILE *in, const char *name, uint32_t iterations)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned long lineno = 0, added = 0, refused = 0;
    while ((n = getline(&line, &cap, in)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0 || line[0] == '#')
            continue;
        char err[RT_ACCOUNTS_ERR_LEN] = "";
        const char *why = import_line(db, line, (size_t)n, iterations, err, sizeof(err));
        if (!why) {
            added++;
            continue;
        }
        refused++;
        int shown = (int)strcspn(line, " \t"); /* the address, never the password */
        fprintf(stderr, "rtd xmpp: %s:%lu: %.*s: %s\n", name, lineno, shown < 200 ? shown : 200,
                line, why);
    }
    if (line) {
        OPENSSL_cleanse(line, cap);
        free(line);
    }
    if (ferror(in)) {
        fprintf(stderr, "rtd xmpp: %s: read error after line %lu\n", name, lineno);
        refused++;
    }
    fprintf(stderr, "rtd xmpp: imported %lu accounts, %lu lines refused\n", added, refused);
    return refused ? 1 : 0;
}

int rt_xmpp_main(int argc, char **argv, const char *default_config, const char *default_data_dir)
{
    args_t a = {0};
    int status = parse_args(argc, argv, default_config, &a);
    if (status >= 0)
        return status;
    char dir[RT_CONF_PATH_MAX + 16], user[RT_JID_PART_MAX + 1] = "", host[RT_JID_PART_MAX + 1];
    bool list = strcmp(a.verb, "list") == 0, import = strcmp(a.verb, "import") == 0;
    if (!list && !import && (status = split_jid(a.words[0], user, host)) != 0)
        return status;
    if ((status = data_dir(&a, default_config, default_data_dir, dir, sizeof(dir))) != 0)
        return status;
    FILE *in = stdin;
    const char *in_name = "stdin";
    if (import && a.nwords && strcmp(a.words[0], "-") != 0) {
        in_name = a.words[0];
        if (!(in = fopen(in_name, "r"))) {
            fprintf(stderr, "rtd xmpp: %s: %s\n", in_name, strerror(errno));
            return 2;
        }
    }
    char *pw = NULL;
    if ((strcmp(a.verb, "add") == 0 || strcmp(a.verb, "passwd") == 0) && !(pw = new_password(&a)))
        return a.batch ? 1 : 2;
    char err[RT_ACCOUNTS_ERR_LEN] = "";
    rt_accounts_t *db;
    int rc = rt_accounts_open(dir, &db, err, sizeof(err));
    if (rc == 0) {
        if (import)
            status = import_accounts(db, in, in_name, a.iterations);
        else if (list)
            rc = rt_accounts_list(db, a.nwords ? a.words[0] : NULL, print_account, NULL, err,
                                  sizeof(err));
        else if (strcmp(a.verb, "del") == 0)
            rc = rt_accounts_del(db, host, user, NULL, NULL, err, sizeof(err));
        else if (strcmp(a.verb, "add") == 0)
            rc = rt_accounts_add(db, host, user, pw, strlen(pw), a.iterations, err, sizeof(err));
        else
            rc = rt_accounts_passwd(db, host, user, pw, strlen(pw), a.iterations, err, sizeof(err));
        rt_accounts_close(db);
    }
    if (in != stdin)
        fclose(in);
    if (pw) {
        OPENSSL_cleanse(pw, strlen(pw));
        free(pw);
    }
    if (rc) {
        fprintf(stderr, "rtd xmpp: %s\n", err[0] ? err : rt_strerror(rc));
        return rc == RT_EINVAL ? 2 : 1;
    }
    return fflush(stdout) == 0 ? status : 1;
}

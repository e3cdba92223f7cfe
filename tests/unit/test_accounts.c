/*
** XMPP accounts (actors/xmpp/accounts.c) and `rtd xmpp user`: add, passwd, del, list and a
** login's credentials, names prepared as JIDs; what the file holds (keys, no password) and
** is (its application id, schema version, WAL, mode 0600); foreign, newer and damaged
** files; a SCRAM login against what was stored; the command line's exit statuses.
*/
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "accounts.h"
#include "check.h"
#include "rt.h"
#include "scram_test.h"
#include "sqlite_test.h"
#include "tmpdir.h"

#define ROUNDS 4096 /* the least the accounts take: the tests stay quick */

static char dir[128], file[160];

static rt_accounts_t *open_dir(void)
{
    rt_accounts_t *a = NULL;
    char err[RT_ACCOUNTS_ERR_LEN] = "";
    int rc = rt_accounts_open(dir, &a, err, sizeof(err));
    if (rc)
        fprintf(stderr, "  open: %s\n", err);
    CHECK_EQ(rc, 0);
    return a;
}

typedef struct {
    char names[8][64];
    int n, stop_at;
} seen_t;

static int collect(const char *host, const char *user, int64_t created_ms, void *arg)
{
    seen_t *s = arg;
    if (s->n < 8)
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s@%s", user, host);
    CHECK(created_ms > 1700000000000LL && created_ms <= (int64_t)rt_wall_ms());
    return ++s->n == s->stop_at ? 42 : 0;
}

static void test_add_get_passwd_del_list(void)
{
    rt_accounts_t *a = open_dir();
    if (!a)
        return;
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_add(a, "Example.COM", "Juliet", "pencil", 6, ROUNDS, err, sizeof(err)), 0);
    CHECK_EQ(rt_accounts_add(a, "example.com", "juliet", "other", 5, ROUNDS, err, sizeof(err)),
             RT_EEXIST);
    CHECK(strstr(err, "juliet@example.com exists"));
    CHECK_EQ(rt_accounts_add(a, "example.com", "romeo", "pencil", 6, ROUNDS, err, sizeof(err)), 0);
    CHECK_EQ(rt_accounts_add(a, "bücher.example", "ΣΑΣ", "pencil", 6, ROUNDS, err, sizeof(err)), 0);
    CHECK_EQ(rt_accounts_count(a), 3);
    /* Credentials for a login, under any spelling of the name. */
    rt_scram_cred_t c1, c256;
    CHECK_EQ(rt_accounts_get(a, "EXAMPLE.com", "JULIET", RT_SCRAM_SHA1, &c1), 0);
    CHECK_EQ(rt_accounts_get(a, "example.com.", "juliet", RT_SCRAM_SHA256, &c256), 0);
    CHECK(c1.hash == RT_SCRAM_SHA1 && c1.iterations == ROUNDS && c1.salt_len == 16);
    CHECK(c256.hash == RT_SCRAM_SHA256 && c256.iterations == ROUNDS);
    CHECK(memcmp(c1.salt, c256.salt, 16) != 0); /* a salt of its own for each hash */
    CHECK_EQ(rt_scram_check_password(&c1, "pencil", 6), 0);
    CHECK_EQ(rt_scram_check_password(&c256, "pencil", 6), 0);
    CHECK_EQ(rt_accounts_get(a, "xn--bcher-kva.example", "σας", RT_SCRAM_SHA256, &c256), 0);
    CHECK_EQ(rt_accounts_get(a, "example.com", "nobody", RT_SCRAM_SHA256, &c256), RT_ENOTFOUND);
    CHECK_EQ(rt_accounts_get(a, "example.com", "no body", RT_SCRAM_SHA256, &c256), RT_ENOTFOUND);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "pencil", 6), 0);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "pencil!", 7), RT_EACCES);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "", 0), RT_EACCES);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "tybalt", "pencil", 6), RT_ENOTFOUND);
    /* A new password: new keys and salts; the old password no longer opens it. */
    CHECK_EQ(rt_accounts_passwd(a, "example.com", "Juliet", "balcony", 7, ROUNDS, err, sizeof(err)),
             0);
    rt_scram_cred_t n1;
    CHECK_EQ(rt_accounts_get(a, "example.com", "juliet", RT_SCRAM_SHA1, &n1), 0);
    CHECK(memcmp(n1.salt, c1.salt, 16) != 0);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "pencil", 6), RT_EACCES);
    CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "balcony", 7), 0);
    CHECK_EQ(rt_accounts_passwd(a, "example.com", "tybalt", "x", 1, ROUNDS, err, sizeof(err)),
             RT_ENOTFOUND);
    /* Listing, by host then name; a callback may stop it. */
    seen_t s = {.stop_at = -1};
    CHECK_EQ(rt_accounts_list(a, NULL, collect, &s, err, sizeof(err)), 0);
    CHECK_EQ(s.n, 3);
    CHECK(strcmp(s.names[0], "σασ@bücher.example") == 0); /* folded: a final Σ is σ */
    CHECK(strcmp(s.names[1], "juliet@example.com") == 0);
    CHECK(strcmp(s.names[2], "romeo@example.com") == 0);
    s = (seen_t){.stop_at = -1};
    CHECK_EQ(rt_accounts_list(a, "EXAMPLE.com", collect, &s, err, sizeof(err)), 0);
    CHECK_EQ(s.n, 2);
    s = (seen_t){.stop_at = 1};
    CHECK_EQ(rt_accounts_list(a, NULL, collect, &s, err, sizeof(err)), 42);
    CHECK_EQ(s.n, 1);
    CHECK_EQ(rt_accounts_list(a, "exa mple.com", collect, &s, err, sizeof(err)), RT_EINVAL);
    /* Deleting. */
    CHECK_EQ(rt_accounts_del(a, "example.com", "ROMEO", NULL, NULL, err, sizeof(err)), 0);
    CHECK_EQ(rt_accounts_del(a, "example.com", "romeo", NULL, NULL, err, sizeof(err)), RT_ENOTFOUND);
    CHECK_EQ(rt_accounts_count(a), 2);
    rt_accounts_close(a);
    /* Still there once reopened. */
    a = open_dir();
    if (a) {
        CHECK_EQ(rt_accounts_count(a), 2);
        CHECK_EQ(rt_accounts_check_password(a, "example.com", "juliet", "balcony", 7), 0);
        rt_accounts_close(a);
    }
}

static void test_refused_names_and_passwords(void)
{
    rt_accounts_t *a = open_dir();
    if (!a)
        return;
    char err[RT_ACCOUNTS_ERR_LEN] = "";
    CHECK_EQ(rt_accounts_add(a, "example.com", "ro meo", "pencil", 6, ROUNDS, err, sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "localpart"));
    CHECK_EQ(rt_accounts_add(a, "exa_mple.com", "romeo", "pencil", 6, ROUNDS, err, sizeof(err)),
             RT_EINVAL);
    CHECK(strstr(err, "domainpart"));
    CHECK_EQ(rt_accounts_add(a, "example.com", "", "pencil", 6, ROUNDS, err, sizeof(err)),
             RT_EINVAL);
    CHECK_EQ(rt_accounts_add(a, "example.com", "romeo", "", 0, ROUNDS, err, sizeof(err)),
             RT_EINVAL);
    CHECK_EQ(rt_accounts_add(a, "example.com", "romeo", "a\x01", 2, ROUNDS, err, sizeof(err)),
             RT_EINVAL);
    static char long_pw[RT_ACCOUNTS_PASSWORD_MAX + 1];
    memset(long_pw, 'p', sizeof(long_pw));
    CHECK_EQ(rt_accounts_add(a, "example.com", "romeo", long_pw, sizeof(long_pw), ROUNDS, err,
                             sizeof(err)),
             RT_EINVAL);
    CHECK_EQ(rt_accounts_add(a, "example.com", "romeo", "pencil", 6, 100, err, sizeof(err)),
             RT_EINVAL);
    CHECK_EQ(rt_accounts_get(a, "example.com", "romeo", RT_SCRAM_SHA1, &(rt_scram_cred_t){0}),
             RT_ENOTFOUND);
    rt_accounts_close(a);
}

static void test_the_file(void)
{
    sqlite3 *db = open_db(file);
    CHECK_EQ(sql_int(db, "PRAGMA application_id"), 0x7274584D);
    CHECK_EQ(sql_int(db, "PRAGMA user_version"), RT_ACCOUNTS_SCHEMA);
    sqlite3_stmt *st;
    CHECK_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW &&
          strcmp((const char *)sqlite3_column_text(st, 0), "wal") == 0);
    sqlite3_finalize(st);
    /* Keys of the right sizes and nothing that is the password. */
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM accounts WHERE length(sha1_stored_key) = 20 AND "
                         "length(sha1_server_key) = 20 AND length(sha256_stored_key) = 32 AND "
                         "length(sha256_server_key) = 32"),
             2);
    CHECK_EQ(sql_int(db, "SELECT count(*) FROM accounts WHERE instr(CAST(sha1_salt || "
                         "sha1_stored_key || sha1_server_key || sha256_salt || sha256_stored_key "
                         "|| sha256_server_key AS BLOB), CAST('balcony' AS BLOB)) > 0"),
             0);
    sqlite3_close(db);
    struct stat sb;
    CHECK_EQ(stat(file, &sb), 0);
    CHECK_EQ(sb.st_mode & 0777, 0600);

    /* A row whose keys were cut short is no login's credentials. */
    db = open_db(file);
    CHECK_EQ(sqlite3_exec(db,
                          "UPDATE accounts SET sha256_stored_key = x'0102' WHERE username "
                          "= 'juliet'",
                          NULL, NULL, NULL),
             SQLITE_OK);
    sqlite3_close(db);
    rt_accounts_t *a = open_dir();
    if (a) {
        rt_scram_cred_t c;
        CHECK_EQ(rt_accounts_get(a, "example.com", "juliet", RT_SCRAM_SHA256, &c), RT_EINVAL);
        CHECK_EQ(rt_accounts_get(a, "example.com", "juliet", RT_SCRAM_SHA1, &c), 0);
        rt_accounts_close(a);
    }
}

static void test_foreign_and_newer_files(void)
{
    char other[200], err[RT_ACCOUNTS_ERR_LEN];
    rt_accounts_t *a = NULL;
    /* Another application's database, in a directory of its own. */
    snprintf(other, sizeof(other), "%s/foreign", tmpdir_path);
    mkdir(other, 0700);
    char path[260];
    snprintf(path, sizeof(path), "%s/%s", other, RT_ACCOUNTS_FILE);
    sqlite3 *db = open_db(path);
    CHECK_EQ(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", NULL, NULL, NULL),
             SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ(rt_accounts_open(other, &a, err, sizeof(err)), RT_EINVAL);
    CHECK(a == NULL && strstr(err, "not an rtd XMPP accounts file"));
    db = open_db(path);
    CHECK_EQ(sql_int(db, "SELECT x FROM t"), 1); /* untouched */
    sqlite3_close(db);
    /* Ours, written by a newer rtd. */
    db = open_db(file);
    char pragma[64], says[64];
    snprintf(pragma, sizeof(pragma), "PRAGMA user_version = %d", RT_ACCOUNTS_SCHEMA + 1);
    CHECK_EQ(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ(rt_accounts_open(dir, &a, err, sizeof(err)), RT_EINVAL);
    snprintf(says, sizeof(says), "schema version %d, this rtd reads %d", RT_ACCOUNTS_SCHEMA + 1,
             RT_ACCOUNTS_SCHEMA);
    CHECK(strstr(err, says));
    db = open_db(file);
    snprintf(pragma, sizeof(pragma), "PRAGMA user_version = %d", RT_ACCOUNTS_SCHEMA);
    CHECK_EQ(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    /* Not a database at all. */
    snprintf(other, sizeof(other), "%s/text", tmpdir_path);
    mkdir(other, 0700);
    snprintf(path, sizeof(path), "%s/%s", other, RT_ACCOUNTS_FILE);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("this is not an SQLite database, it is a text file of some length\n", f);
        fclose(f);
    }
    CHECK_EQ(rt_accounts_open(other, &a, err, sizeof(err)), RT_EINVAL);
    CHECK(strstr(err, "not an SQLite database") || strstr(err, "file is not a database"));
}

static void test_scram_login_with_stored_keys(void)
{
    rt_accounts_t *a = open_dir();
    if (!a)
        return;
    char err[RT_ACCOUNTS_ERR_LEN];
    CHECK_EQ(rt_accounts_add(a, "example.com", "user", "pencil", 6, ROUNDS, err, sizeof(err)), 0);
    rt_scram_cred_t c;
    CHECK_EQ(rt_accounts_get(a, "example.com", "user", RT_SCRAM_SHA1, &c), 0);
    rt_accounts_close(a);
    /* RFC 5802's client messages, with this account's salt and the RFC's nonces: the
       client's proof is computed here from the password the way a client would. */
    const char *cf = "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL";
    size_t size = rt_scram_size(strlen(cf));
    rt_scram_t *s = malloc(size);
    rt_scram_first_t first;
    const char *out;
    size_t n;
    CHECK_EQ(rt_scram_start(s, size, RT_SCRAM_SHA1, false, 0, cf, strlen(cf), &first), 0);
    CHECK_EQ(rt__scram_server_first_nonce(s, &c, "3rfcNHYJY1ZVvWVs7j", 18, &out, &n), 0);
    char sf[256], final[256], auth[512], proof[64];
    snprintf(sf, sizeof(sf), "%.*s", (int)n, out);
    CHECK(strncmp(sf, "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=", 47) == 0);
    int fn = snprintf(final, sizeof(final), "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j");
    int an = snprintf(auth, sizeof(auth), "%s,%s,%s", cf + 3, sf, final);
    client_proof(RT_SCRAM_SHA1, "pencil", c.salt, c.salt_len, c.iterations, auth, (size_t)an,
                 proof);
    fn += snprintf(final + fn, sizeof(final) - (size_t)fn, ",p=%s", proof);
    CHECK_EQ(rt_scram_client_final(s, final, (size_t)fn, NULL, 0, &out, &n), 0);
    CHECK(n == 30 && strncmp(out, "v=", 2) == 0);
    free(s);
}

/* ---- rtd xmpp user ---- */

static int cli(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
               const char *a5, const char *a6)
{
    const char *v[] = {"xmpp", a0, a1, a2, a3, a4, a5, a6, NULL};
    int argc = 0;
    while (v[argc])
        argc++;
    return rt_xmpp_main(argc, (char **)v, "/nonexistent/rtd.conf", NULL);
}

static void test_command_line(void)
{
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "mercutio@example.com", "queenmab"), 0);
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "Mercutio@Example.com", "x"), 1); /* exists */
    CHECK_EQ(cli("user", "passwd", "-d", dir, "-b", "mercutio@example.com", "mab"), 0);
    CHECK_EQ(cli("user", "passwd", "-d", dir, "-b", "benvolio@example.com", "x"), 1);
    CHECK_EQ(cli("user", "list", "-d", dir, "example.com", NULL, NULL), 0);
    CHECK_EQ(cli("user", "list", "-d", dir, NULL, NULL, NULL), 0);
    rt_accounts_t *a = open_dir();
    if (a) {
        CHECK_EQ(rt_accounts_check_password(a, "example.com", "mercutio", "mab", 3), 0);
        rt_accounts_close(a);
    }
    CHECK_EQ(cli("user", "del", "-d", dir, "mercutio@example.com", NULL, NULL), 0);
    CHECK_EQ(cli("user", "del", "-d", dir, "mercutio@example.com", NULL, NULL), 1);
    /* Usage and names. */
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "example.com", "x"), 2);     /* no user */
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "a@example.com/r", "x"), 2); /* resource */
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "a b@example.com", "x"), 2); /* a space */
    CHECK_EQ(cli("user", "add", "-d", dir, "-b", "a@example.com", ""), 2);    /* empty */
    CHECK_EQ(cli("user", "add", "-d", dir, "-I", "100", "a@example.com"), 2); /* rounds */
    CHECK_EQ(cli("user", "del", "-d", dir, "-b", "a@example.com", NULL), 2);
    CHECK_EQ(cli("user", "frob", "-d", dir, "a@example.com", NULL, NULL), 2);
    CHECK_EQ(cli("group", "add", NULL, NULL, NULL, NULL, NULL), 2);
    CHECK_EQ(cli("user", "--help", NULL, NULL, NULL, NULL, NULL), 0);
    CHECK_EQ(cli("user", "list", "-c", "/nonexistent/rtd.conf", NULL, NULL, NULL), 2);
    /* The data directory from a configuration file's data_dir (relative to the file). */
    char conf[200];
    snprintf(conf, sizeof(conf), "%s", tmpdir_put("rtd.conf", "data_dir = \"confdata\"\n"));
    CHECK_EQ(cli("user", "add", "-c", conf, "-b", "tybalt@example.com", "cat"), 0);
    char path[260];
    snprintf(path, sizeof(path), "%s/confdata/%s", tmpdir_path, RT_ACCOUNTS_FILE);
    struct stat sb;
    CHECK_EQ(stat(path, &sb), 0);
}

int main(void)
{
    if (tmpdir_make("test_accounts") != 0)
        return 2;
    snprintf(dir, sizeof(dir), "%s/data", tmpdir_path);
    snprintf(file, sizeof(file), "%s/%s", dir, RT_ACCOUNTS_FILE);
    RUN(test_add_get_passwd_del_list);
    RUN(test_refused_names_and_passwords);
    RUN(test_the_file);
    RUN(test_foreign_and_newer_files);
    RUN(test_scram_login_with_stored_keys);
    RUN(test_command_line);
    tmpdir_remove();
    return CHECK_SUMMARY();
}

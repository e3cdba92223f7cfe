/*
** What rtd checks of its settings and the files they name before it starts, and what it
** says about them: rtd's start-up stages use these one by one, and `rtd --check` runs them
** all with nothing started, bound or created.
*/
#ifndef RTD_CHECK_H
#define RTD_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* rules_dir must exist: a mistyped one would run with no rules at all. 0, or 1 with err. */
int rtd_check_rules_dir(const char *dir, char *err, size_t errlen);

/*
** data_dir holds stored payloads (state.db, sink databases, spills) and the admin socket:
** made 0700 if missing, and refused if group or others may write it (they could swap the
** files under rtd); one that they can read is made 0700, as an older rtd left it 0755.
** With make false (a check) nothing is made or changed, and note says what the start
** would do ("" when nothing). 0, or 1 with err.
*/
int rtd_check_data_dir(const char *dir, bool make, char *note, size_t notelen, char *err,
                       size_t errlen);

/*
** config.paths's values, for the format "config=%s rules_dir=%s data_dir=%s password_file=%s
** acl_file=%s admin_socket=%s%s" (the start logs it, `rtd --check` prints it; the log wants
** its format literal): where the settings came from and the files and directories they name.
*/
#define RTD_PATHS_ARGS(c, conf_path)                                                            \
    (conf_path), (c)->rules_dir, (c)->data_dir, (c)->password_file[0] ? (c)->password_file : "-", \
        (c)->acl_file[0] ? (c)->acl_file : "-",                                                 \
        (c)->admin_socket[0] ? (c)->admin_socket : (c)->data_dir,                               \
        (c)->admin_socket[0] ? "" : "/rtd.sock"

/*
** listener.access's values for listener i: where it listens, who may connect anonymously
** (without a user name, or with one no password file vouches for), and which user names are
** accepted.
*/
typedef struct {
    char listener[RT_CONF_VALUE_LEN];
    char anonymous[RT_CONF_VALUE_LEN * 2 + 8];
    char users[RT_CONF_PATH_MAX + 16];
} rtd_access_t;
void rtd_access(const rt_conf_t *c, unsigned i, rtd_access_t *out);

/*
** `rtd --check`: every check the start makes of c and of the files it names (rules_dir and
** each rule, data_dir, the password and ACL files, TLS certificates and keys, the API keys
** file, the cluster's credentials and secret, every sink's settings), without starting,
** binding or creating anything. Prints what would listen where and for whom on stdout and
** returns 0, or says what is wrong on stderr and returns 2.
*/
int rtd_check(const rt_conf_t *c, const char *conf_path);

#endif

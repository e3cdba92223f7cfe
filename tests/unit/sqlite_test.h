/* SQLite read back by the tests that check what rtd wrote: one number, a connection. */
#ifndef RT_SQLITE_TEST_H
#define RT_SQLITE_TEST_H

#include <sqlite3.h>

static inline long long sql_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return -2;
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static inline sqlite3 *open_db(const char *file)
{
    sqlite3 *db = NULL;
    sqlite3_open(file, &db);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

#endif

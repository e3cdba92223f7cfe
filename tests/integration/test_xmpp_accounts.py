"""XMPP accounts while rtd runs (issue 29, §2): `rtctl xmpp user add|passwd|del|list` on the
same data_dir/xmpp.db as `rtd xmpp user` offline; rtctl asking for a password twice, never
logged; names prepared as JIDs; the HTTP API's roles. Real rtd, rtctl and urllib."""
import os
import sqlite3

from conftest import RTD, rtctl
from test_http import call, http  # noqa: F401  (the fixture)


def keys_of(data_dir, user):
    """The stored SCRAM keys and salts of user's row, to see that passwd changed them."""
    with sqlite3.connect(os.path.join(data_dir, "xmpp.db")) as con:
        row = con.execute("SELECT * FROM accounts WHERE username = ?", (user,)).fetchone()
    assert row is not None
    return row


def test_accounts_while_running(http):  # noqa: F811
    secret = "correct horse battery staple"
    # Asked twice on stdin (a pipe here, a terminal without echo for people).
    code, out, err = rtctl("xmpp", "user", "add", "Juliet@Example.COM",
                           socket_path=http.admin_socket, input=f"{secret}\n{secret}\n")
    assert code == 0, err
    assert http.ctl_json("xmpp", "user", "list") == [
        {"user": "juliet", "host": "example.com",
         "created": http.ctl_json("xmpp", "user", "list")[0]["created"]}]
    # The offline command reads the same file.
    off = subprocess_run([RTD, "xmpp", "user", "list", "-d", http.data_dir])
    assert off.returncode == 0 and off.stdout.startswith("juliet@example.com\t"), off

    # Refusals: the account exists, the two entries differ, no such account, not USER@HOST.
    code, _, err = http.ctl("xmpp", "user", "add", "juliet@example.com", "--password", "x")
    assert code == 1 and "exists" in err
    code, _, err = rtctl("xmpp", "user", "passwd", "juliet@example.com",
                         socket_path=http.admin_socket, input="one\ntwo\n")
    assert code == 2 and "do not match" in err
    code, _, err = http.ctl("xmpp", "user", "del", "romeo@example.com")
    assert code == 1 and "no account" in err
    code, _, err = http.ctl("xmpp", "user", "del", "example.com")
    assert code == 1 and "USER@HOST" in err

    before = keys_of(http.data_dir, "juliet")
    code, _, err = rtctl("xmpp", "user", "passwd", "juliet@example.com",
                         socket_path=http.admin_socket, input="new one\nnew one\n")
    assert code == 0, err
    assert keys_of(http.data_dir, "juliet") != before  # new salts and keys

    # Over HTTP: the admin role only; the password in the JSON body.
    assert call(http, "/api/v1/xmpp/user/list", key=http.read_key)[0] == 403
    code, body = call(http, "/api/v1/xmpp/user/add/romeo@example.com", key=http.admin_key,
                      method="POST", body={"password": secret})
    assert code == 200 and body == {"user": "romeo", "host": "example.com", "done": "add"}
    code, rows = call(http, "/api/v1/xmpp/user/list/example.com", key=http.admin_key)
    assert code == 200 and [r["user"] for r in rows] == ["juliet", "romeo"]

    code, _, err = http.ctl("xmpp", "user", "del", "juliet@example.com")
    assert code == 0, err
    assert [r["user"] for r in http.ctl_json("xmpp", "user", "list")] == ["romeo"]

    # Every change is in the audit log, with its words and never a password.
    log = http.read_log()
    assert 'command="xmpp user add Juliet@Example.COM" status=200' in log
    assert "event=xmpp.account change=del user=juliet host=example.com" in log
    assert secret not in log and "new one" not in log


def subprocess_run(argv):
    import subprocess
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)

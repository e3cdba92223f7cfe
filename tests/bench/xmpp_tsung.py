#!/usr/bin/env python3
"""xmpp_tsung.py: the ejabberd benchmark's Tsung scenario (ProcessOne, ejabberd 16.01: users
with 18 contacts each log in, fetch the roster, send presence, chat to online users, stay a
while and leave), written for Tsung 1.7's jabber plugin, run, and read back.

    xmpp_tsung.py --port TLS_PORT --users N [--rate R] [--messages M] [--interval S]
                  [--size B] [--log DIR] [--timeout S]

Each of N sessions (tsung1..tsungN, password pw1..pwN, as Tsung names them) arrives at R a
second over direct TLS (Tsung's jabber plugin has SASL PLAIN but no SCRAM, and servers offer
PLAIN inside TLS), authenticates, restarts the stream, binds, asks for the legacy session and
the roster, sends its initial presence; once every session has arrived it sends M chat
messages, one each S seconds, each to an online user (Tsung's choice), then stays until every
other session has sent its last, and closes its stream.

What is counted: Tsung's own counters (tsung.log: connect, error_*, the transactions) and,
from its traffic dump, each chat message by its stamp (Tsung's "@@@node,time@@@" body): the
stamps sent and the stamps received, so a message lost, doubled or arriving twice shows. The
result is one JSON line on stdout. tests/bench/xmpp_tsung.sh drives rtd and ejabberd with
it; tests/integration/test_xmpp_tsung.py asserts on it.
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from tsung_util import run_dir, running, samples, totals

USER, PASSWORD = "tsung", "pw"  # Tsung's accounts: tsung<i> with password pw<i>, i from 1
STAMP = re.compile(rb"@@@(\d+,\d+;\d+;\d+)@@@")
RECORD = re.compile(rb"^(Send|Recv):[0-9.]+:(<[0-9.]+>):", re.M)


def timeline(users, rate, messages, interval):
    """(all_in, wait, linger, total) seconds: by when the last session has arrived (the
    arrival phase's length: Tsung starts users at rate until there are all of them, or, on a
    loaded machine, falls behind and stops at the phase's end), how long each waits after its
    presence before chatting, how long it stays after its last message (the spread of
    arrivals and a margin, so that the messages of the last to start still find it online),
    and the whole run's length."""
    all_in = 1.5 * users / rate + 10
    margin = 10 + all_in / 4  # logins of the last arrivals on a loaded machine
    wait, linger = all_in + margin, all_in + 2 * margin
    return all_in, wait, linger, all_in + wait + messages * interval + linger + margin


def scenario(port, users, rate, messages, interval, size, domain="localhost"):
    all_in, wait, linger, _ = timeline(users, rate, messages, interval)

    def ack(regexp):
        """Wait for what matches regexp in one read (ack="local" takes any bytes as the
        answer); Tsung keeps the last regexp, so each acknowledged request names its own."""
        return f'ack="parse" regexp="{regexp}"'
    features = ack("&lt;/stream:features&gt;")
    again = f'<request><jabber type="connect" {features}/></request>'
    return f"""<?xml version="1.0"?>
<!DOCTYPE tsung SYSTEM "/usr/share/tsung/tsung-1.0.dtd">
<tsung loglevel="notice" version="1.0" dumptraffic="true">
  <clients><client host="localhost" use_controller_vm="true" maxusers="{users + 10}"/></clients>
  <servers><server host="127.0.0.1" port="{port}" type="ssl"/></servers>
  <load>
    <arrivalphase phase="1" duration="{all_in:.0f}" unit="second">
      <users maxnumber="{users}" arrivalrate="{rate}" unit="second"/>
    </arrivalphase>
  </load>
  <options>
    <option type="ts_jabber" name="global_number" value="{users}"/>
    <option type="ts_jabber" name="userid_max" value="{users}"/>
    <option type="ts_jabber" name="domain" value="{domain}"/>
    <option type="ts_jabber" name="username" value="{USER}"/>
    <option type="ts_jabber" name="passwd" value="{PASSWORD}"/>
  </options>
  <sessions>
    <session probability="100" name="im" type="ts_jabber" bidi="true">
      <request><jabber type="connect" {features}/></request>
      <transaction name="auth">
        <request><jabber type="auth_sasl" {ack("&lt;success|&lt;failure")}/></request>
      </transaction>
      {again}
      <transaction name="bind">
        <request><jabber type="auth_sasl_bind" {ack("&lt;/jid&gt;")}/></request>
        <request><jabber type="auth_sasl_session" {ack("type=.result")}/></request>
      </transaction>
      <transaction name="roster">
        <request><jabber type="iq:roster:get" {ack("jabber:iq:roster")}/></request>
      </transaction>
      <request><jabber type="presence:initial" ack="no_ack"/></request>
      <thinktime value="{wait:.0f}" random="false"/>
      <for from="1" to="{messages}" incr="1" var="i">
        <request><jabber type="chat" ack="no_ack" size="{size}" destination="online"
                         stamped="true"/></request>
        <thinktime value="{interval}" random="false"/>
      </for>
      <thinktime value="{linger:.0f}" random="false"/>
      <request><jabber type="close" ack="no_ack"/></request>
    </session>
  </sessions>
</tsung>
"""


def stamps(logdir):
    """(sent, received): Counters of the chat stamps in Tsung's dump, the bytes of each
    connection in order, so a stamp split between two reads still counts."""
    with open(os.path.join(run_dir(logdir), "tsung.dump"), "rb") as f:
        dump = f.read()
    streams = collections.defaultdict(list)
    marks = list(RECORD.finditer(dump))
    for m, nxt in zip(marks, marks[1:] + [None]):
        end = nxt.start() - 1 if nxt else len(dump)  # io:format's newline after each record
        streams[(m.group(1), m.group(2))].append(dump[m.end():end])
    sent, received = collections.Counter(), collections.Counter()
    for (way, _), parts in streams.items():
        (sent if way == b"Send" else received).update(STAMP.findall(b"".join(parts)))
    return sent, received


def result(logdir):
    t = totals(logdir)
    s = samples(logdir)
    sent, received = stamps(logdir)
    return {
        "users_started": s.get("session", 0),
        "connected": s.get("connect", 0),
        "auth": s.get("tr_auth", 0), "bind": s.get("tr_bind", 0),
        "roster": s.get("tr_roster", 0),
        "finished": t.get("finish_users_count", 0),
        "errors": {k: v for k, v in t.items() if k.startswith("error")},
        "sent": sum(sent.values()), "received": sum(received.values()),
        "lost": sum((sent - received).values()), "extra": sum((received - sent).values()),
        "latency_samples": s.get("xmpp_msg_latency", 0),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True, help="the server's direct TLS port")
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--rate", type=float, default=50, help="arrivals a second")
    p.add_argument("--messages", type=int, default=10, help="chat messages a session")
    p.add_argument("--interval", type=float, default=10, help="seconds between them")
    p.add_argument("--size", type=int, default=64, help="body bytes")
    p.add_argument("--log", help="keep Tsung's logs here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, help="seconds (default: the timeline's + 120)")
    p.add_argument("--print-timeline", action="store_true",
                   help="print the run's length in seconds and exit")
    a = p.parse_args()
    length = timeline(a.users, a.rate, a.messages, a.interval)[3]
    if a.print_timeline:
        print(int(length) + 1)
        return
    work = a.log or tempfile.mkdtemp(prefix="xmpp-tsung-")
    os.makedirs(work, exist_ok=True)
    xml = os.path.join(work, "xmpp.xml")
    with open(xml, "w") as f:
        f.write(scenario(a.port, a.users, a.rate, a.messages, a.interval, a.size))
    with running(xml, work) as tsung:
        try:
            out, _ = tsung.communicate(timeout=a.timeout or length + 120)
        except subprocess.TimeoutExpired:
            raise SystemExit("xmpp_tsung.py: Tsung ran past its timeout")
    if tsung.returncode != 0:
        raise SystemExit("xmpp_tsung.py: tsung failed:\n" + out)
    r = result(os.path.join(work, "log"))
    r["users"] = a.users
    print(json.dumps(r), flush=True)
    if not a.log:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""The docs name what exists: every `rtctl ...` in README.md and docs/*.md is a command rtd's
admin table lists (or one of rtctl's own: top, trace, help), and every setting a doc sets
(`-o NAME=...`, `rtctl config set NAME ...`, a top-level `NAME = ...` in a ```lua block of
rtd.conf) is one `rtctl config show` knows. Keys inside the nested tables (a listener's, http,
cluster, sinks) are checked by the loader when an example is run, not here: they come with
the one settings schema (issue 28, section 2).
"""
import glob
import json
import os
import re

from conftest import ROOT, Rtd

OWN = {"top", "trace", "help"}  # rtctl's own commands, beside rtd's table
ALONE = {"clients", "subscriptions", "actors", "rules", "sinks", "log"}  # a word alone lists
OPTION_WITH_VALUE = {"-s", "--socket", "--timeout", "-c", "-d", "-n", "--sort", "--limit",
                     "--prefix", "--after", "--width", "--height", "--count", "--topic",
                     "--payload", "--qos", "--duration"}


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                            "*.md")))


def spans(path):
    """(line number, text) of every `code span` in the file."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            for s in re.findall(r"`([^`]+)`", line):
                yield n, s


def commands(rtd):
    """The admin table's commands as word tuples, from `rtctl help`."""
    code, out, err = rtd.ctl("help")
    assert code == 0, err
    listed = out[out.index("rtctl commands"):].splitlines()[1:]
    found = set()
    for line in listed:
        if not line.startswith("  "):
            continue
        words = []
        for w in line.split():
            if not re.fullmatch(r"[a-z]+", w):
                break
            words.append(w)
        found.add(tuple(words))
    return found


def command_words(text):
    """The first two words of an rtctl command line, options and their values left out."""
    words, skip = [], False
    for w in text.split():
        if skip:
            skip = False
            continue
        if w.startswith("-"):
            skip = w in OPTION_WITH_VALUE
            continue
        words.append(w)
    first = words[0] if words else None
    second = words[1] if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) else None
    return first, second


def test_every_rtctl_command_named_in_the_docs_exists():
    rtd = Rtd()
    try:
        known = commands(rtd)
    finally:
        rtd.stop()
    firsts = {c[0] for c in known}
    with_sub = {c[0] for c in known if len(c) > 1}
    wrong = []
    for path in doc_files():
        for n, s in spans(path):
            m = re.match(r"rtctl\s+(.*)", s)
            if not m:
                continue
            first, second = command_words(m.group(1))
            if first is None or first in OWN:
                continue
            ok = ((first, second) in known or
                  (first in firsts and (second is None or first not in with_sub)) or
                  (first in ALONE and second is None))
            if not ok:
                wrong.append(f"{os.path.relpath(path, ROOT)}:{n}: `{s}`")
    assert not wrong, "commands rtd does not have:\n" + "\n".join(wrong)


def test_every_setting_a_doc_sets_exists():
    rtd = Rtd()
    try:
        code, out, err = rtd.ctl("config", "show", json=True)
        assert code == 0, err
        settings = {s["setting"] for s in json.loads(out)}
    finally:
        rtd.stop()
    wrong = []
    for path in doc_files():
        where = os.path.relpath(path, ROOT)
        for n, s in spans(path):
            for m in re.finditer(r"-o\s+['\"]?([a-z][a-z0-9_]*)\s*=|config set\s+([a-z][a-z0-9_]*)",
                                 s):
                name = m.group(1) or m.group(2)
                if name not in settings:
                    wrong.append(f"{where}:{n}: `{s}`")
        with open(path) as f:
            text = f.read()
        for block in re.finditer(r"```lua\n(.*?)```", text, re.S):
            line0 = text[:block.start()].count("\n") + 2
            for k, line in enumerate(block.group(1).splitlines()):
                m = re.match(r"([a-z_][a-z0-9_]*)\s*=", line)
                if m and m.group(1) not in settings:
                    wrong.append(f"{where}:{line0 + k}: {line.strip()}")
    assert not wrong, "settings rtd does not have:\n" + "\n".join(wrong)

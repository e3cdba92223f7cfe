"""The docs name what exists: every `rtctl ...` in README.md and docs/*.md is a command rtd's
admin table lists (or one of rtctl's own: top, trace, help), and every setting a doc sets
(`-o NAME=...`, `rtctl config set NAME ...`, a top-level `NAME = ...` in a ```lua block of
rtd.conf) is one `rtctl config show` knows, and every setting a doc names (a dotted path such
as `http.api_keys_file` or `tls.min_version`, a `name = value` span) is one of the settings
schema's, as `rtd --print-schema` prints it. The man pages render without warnings, rtctl(8)
has every command of the table with its about line, and rtd(8) every option and subcommand
`rtd --help` lists.
"""
import glob
import json
import os
import re
import subprocess

from conftest import BUILD, ROOT, RTD, Rtd

OWN = {"top", "trace", "help"}  # rtctl's own commands, beside rtd's table
ALONE = {"clients", "subscriptions", "actors", "rules", "sinks", "log"}  # a word alone lists
OPTION_WITH_VALUE = {"-s", "--socket", "--timeout", "-c", "-d", "-n", "--sort", "--limit",
                     "--prefix", "--after", "--width", "--height", "--count", "--topic",
                     "--payload", "--qos", "--duration"}


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                            "*.md")))


def named_files():
    """The docs, and the shipped rtd.conf whose comments name commands and settings too."""
    return doc_files() + [os.path.join(ROOT, "etc", "rtd.conf")]


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
    pairs = {c[:2] for c in known}  # a two-word sub-command's first word too (`xmpp user`)
    with_sub = {c[0] for c in known if len(c) > 1}
    wrong = []
    for path in named_files():
        for n, s in spans(path):
            m = re.match(r"rtctl\s+(.*)", s)
            if not m:
                continue
            first, second = command_words(m.group(1))
            if first is None or first in OWN:
                continue
            ok = ((first, second) in pairs or
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


def man_text(page, width="1000"):
    """The built man page as man shows it, as plain text with its whitespace collapsed: lines
    so wide that nothing is hyphenated or broken inside a usage."""
    r = subprocess.run(["man", "-l", os.path.join(BUILD, "install-files", page)],
                       env=dict(os.environ, MANWIDTH=width, LC_ALL="C"), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and not r.stderr, r.stderr
    plain = subprocess.run(["col", "-b"], input=r.stdout, capture_output=True, text=True,
                           timeout=30).stdout
    return " ".join(plain.split())


def test_man_pages_render_without_warnings():
    for page in ("rtd.8", "rtctl.8", "rtd.conf.5"):
        r = subprocess.run(["man", "--warnings", "-l", os.path.join(BUILD, "install-files", page)],
                           env=dict(os.environ, MANWIDTH="80"), capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and not r.stderr, (page, r.stderr)


def test_rtctl_man_page_describes_every_command():
    """Every command of the admin table is in rtctl(8), its usage followed by its about line:
    a command added to the table without its entry in etc/man/rtctl.8.in fails here."""
    rtd = Rtd()
    try:
        usages = rtd.ctl_json("help")
        about = {}
        for word in sorted({u.split()[0] for u in usages}):
            about.update((d["usage"], d["about"]) for d in rtd.ctl_json("help", word))
    finally:
        rtd.stop()
    text = man_text("rtctl.8")
    commands = text[text.index(" COMMANDS "):text.index(" EXIT STATUS ")] + " "
    missing = [u for u in usages
               if f" {u} {' '.join(about[u].replace('`', '').split())} " not in commands]
    assert not missing, "rtctl(8) lacks (or describes otherwise):\n" + "\n".join(missing)


def test_rtd_man_page_names_every_option_and_subcommand():
    r = subprocess.run([RTD, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    head, _, subs = r.stdout.partition("subcommands (rtd SUBCOMMAND --help for their options):")
    options = set(re.findall(r"^\s+(-[a-z]|--[a-z-]+)", head, re.M))
    names = [line.split()[0] for line in subs.splitlines() if line.strip()]
    assert {"-c", "-o", "--check", "-v"} <= options and {"passwd", "apikey"} <= set(names)
    text = man_text("rtd.8")

    def section(name, following):
        return text[text.index(f" {name} "):text.index(f" {following} ")] + " "
    missing = [o for o in options if not re.search(f" {o}[ ,=]", section("OPTIONS", "SUBCOMMANDS"))]
    missing += [n for n in names if f" {n} " not in section("SUBCOMMANDS", "SIGNALS")]
    assert not missing, "rtd(8) lacks: " + ", ".join(missing)


def schema_names():
    """Every setting of the schema as docs/CONFIG.md names it, from the rtd just built."""
    r = subprocess.run([RTD, "--print-schema=markdown"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return re.findall(r"^\| `([^`]+)` \|", r.stdout, re.M)


def schema_paths(names):
    """What a doc may write for a setting: its name ("listeners[].tls.cert"), its name without
    list marks and placeholders ("listeners.tls.cert"), and every dotted tail of it ("tls.cert",
    "cert"); a placeholder (<name>, <user>, <column>) matches any word."""
    paths = set()
    for name in names:
        plain = re.sub(r"\(\w+\)", "", name.replace("[]", ""))
        parts = plain.split(".")
        for i in range(len(parts)):
            if parts[i].startswith("<"):
                continue  # a tail that is only a name of the operator's matches any word
            paths.add(re.escape(".".join(parts[i:])).replace(r"<", "<").replace(r">", ">"))
    return [re.compile(re.sub(r"<\w+>", r"[\\w-]+", p) + "$") for p in paths]


# Dotted names in the docs that are not settings nor log events: fields of rtctl's answers.
ANSWER_FIELDS = {"tls.days_left"}

# The tables whose keys are settings: a dotted path starting with one names a setting.
TABLE_ROOTS = ("listeners", "http", "cluster", "sinks", "user_rate_limits", "tls", "rate_limit",
               "retention")


def log_events():
    """The log's event names (`cluster.route_lost`, `tls.handshake_failed`), which share their
    first word with the tables' settings: every "word.word" string of the sources but the
    schema's own."""
    events = set()
    for path in glob.glob(os.path.join(ROOT, "actors", "**", "*.c"), recursive=True):
        if os.path.basename(path).startswith("config"):
            continue
        with open(path, errors="replace") as f:
            events.update(re.findall(r'"([a-z_]+\.[a-z_]+)"', f.read()))
    return events


def test_every_setting_a_doc_names_is_in_the_schema():
    """A dotted path in a code span (`http.api_keys_file`, `tls.min_version`,
    `sinks.archive.batch`), the name of a `name = value` span and every key a Lua example (or
    the shipped rtd.conf) sets are settings of the schema: a renamed or removed setting leaves
    no doc behind."""
    names = schema_names()
    assert "listeners[].tls.cert" in names and "sinks.<name>(sqlite).file" in names, names
    paths = schema_paths(names)
    events = log_events()
    assert "tls.handshake_failed" in events, sorted(events)[:20]

    def known(path):
        return any(p.match(path) for p in paths)
    wrong = []
    for path in named_files():
        if path.endswith("CONFIG.md"):
            continue
        where = os.path.relpath(path, ROOT)
        for n, s in spans(path):
            for m in re.finditer(r"(?<![\w./$-])([a-z_]+(?:\.[a-z_0-9]+)+)(?![\w/(-])", s):
                dotted = m.group(1)
                if dotted.split(".")[0] in TABLE_ROOTS and not known(dotted) and \
                        dotted not in events | ANSWER_FIELDS and not re.search(r"\.(c|h|md|py|lua)$", dotted):
                    wrong.append(f"{where}:{n}: `{s}`")
            # `name = value` as rtd.conf writes it (a log line's key=value has no spaces; a
            # formula or a rule's option table has no literal value)
            m = re.fullmatch(r'\s*([a-z_][a-z0-9_]*) = (-?[\d.]+( \* [\d.]+)*|"[^"]*"|true|false)',
                             s)
            if m and not known(m.group(1)):
                wrong.append(f"{where}:{n}: `{s}`")
        with open(path) as f:
            text = f.read()
        lua = [text] if path.endswith("rtd.conf") else \
            [b.group(1) for b in re.finditer(r"```lua\n(.*?)```", text, re.S)]
        for block in lua:
            # A key set to a value (not a table: sink and user names are keys of tables) is a
            # setting's; a columns or headers table's keys are the columns' and headers' names.
            block = re.sub(r"--[^\n]*", "",
                           re.sub(r"(columns|headers)\s*=\s*\{[^}]*\}", "", block))
            for m in re.finditer(r"([A-Za-z_]\w*)\s*=\s*([^=\s])", block):
                if m.group(2) != "{" and not known(m.group(1)):
                    wrong.append(f"{where}: `{m.group(0)}` in a Lua example")
    assert not wrong, "settings the schema does not have:\n" + "\n".join(wrong)

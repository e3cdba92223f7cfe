"""Strict readers of rtd's log lines (actors/base/log.h): logfmt and JSON.

Every rtd the suite starts (conftest.Rtd) has each line of its log read back by one of these
when it stops: a line that does not split is a failure of the test that ran it. Under
RT_RTD_OPTIONS="log_format=json" the tests see each JSON line rendered as the logfmt line rtd
would have written (json_as_logfmt), so their log markers hold in either format.
"""
import json
import re

LEVELS = ("error", "warning", "info", "debug")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
KEY = re.compile(r"[a-z][a-z0-9_.]*")
# A quoted value is a JSON string: no raw control character, JSON's escapes only.
QUOTED = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
BARE = re.compile(r'[^\x00-\x20="\\\x7f]+')


def parse_logfmt(line):
    """The (key, value) pairs of one logfmt line (no newline): pairs split by one space, a
    key of [a-z][a-z0-9_.]*, '=', and a bare value or a JSON string. ValueError otherwise."""
    pairs, at = [], 0
    while at < len(line):
        if pairs:
            if line[at] != " ":
                raise ValueError(f"no space before column {at}")
            at += 1
        k = KEY.match(line, at)
        if not k or k.end() >= len(line) or line[k.end()] != "=":
            raise ValueError(f"no key= at column {at}")
        at = k.end() + 1
        q = QUOTED.match(line, at)
        if q:
            value = json.loads(q.group(0))
        else:
            q = BARE.match(line, at)
            if not q:
                raise ValueError(f"no value at column {at}")
            value = q.group(0)
        pairs.append((k.group(0), value))
        at = q.end()
    return pairs


def parse_json(line):
    """The (key, value) pairs of one JSON line, numbers as rtd printed them."""
    pairs = json.loads(line, object_pairs_hook=list, parse_int=str, parse_float=str)
    if not isinstance(pairs, list) or any(isinstance(v, (list, dict)) for _, v in pairs):
        raise ValueError("not a flat JSON object")
    return pairs


def check_pairs(pairs):
    """A line's fields as rtd writes every line: ts, level, event first, keys once each."""
    keys = [k for k, _ in pairs]
    if keys[:3] != ["ts", "level", "event"]:
        raise ValueError(f"starts with {keys[:3]}, not ts, level, event")
    if len(set(keys)) != len(keys):
        raise ValueError(f"a key twice: {keys}")
    if not TS.match(pairs[0][1]) or pairs[1][1] not in LEVELS:
        raise ValueError("bad ts or level")
    if any(not KEY.fullmatch(k) for k in keys):
        raise ValueError(f"a bad key in {keys}")


def bad_lines(text, fmt="logfmt", last_may_be_partial=False):
    """The lines of a log that are not rtd log lines in format fmt: [(line, why)]."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif last_may_be_partial and lines:
        lines.pop()  # cut by SIGKILL mid-write
    bad = []
    parse = parse_json if fmt == "json" else parse_logfmt
    for line in lines:
        try:
            check_pairs(parse(line))
        except ValueError as e:  # json.JSONDecodeError is one
            bad.append((line, str(e)))
    return bad


def logfmt_value(v):
    if not isinstance(v, str):  # true (truncated=true)
        return json.dumps(v)
    if v != "" and not re.search(r'[\x00-\x20="\\\x7f]', v):
        return v
    return json.dumps(v, ensure_ascii=False)


def json_as_logfmt(text):
    """Each whole JSON line of text as the logfmt line with the same fields; other lines
    (and a last line still being written) as they are."""
    out = []
    for line in text.split("\n"):
        try:
            pairs = parse_json(line)
        except ValueError:
            out.append(line)
            continue
        out.append(" ".join(f"{k}={logfmt_value(v)}" for k, v in pairs))
    return "\n".join(out)


def log_format(options):
    """The log_format of an rtd started with these -o options (the last one given wins)."""
    fmt = "logfmt"
    for o in options:
        key, _, value = o.partition("=")
        if key.strip() == "log_format":
            fmt = value.strip().strip("\"'")
    return fmt

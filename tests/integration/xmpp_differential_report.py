"""xmpp_differential_report.py SERVER=JUNIT.xml...: the pass/fail table of a differential run
(xmpp_differential.sh), one row per test, one column per server, as markdown on stdout, and
a count per server. "pass", "FAIL" (failed or errored), "skip" (rtd_only: rtd-specific, or
no such feature), "xfail" (rtd_deviates: a known deviation of rtd's)."""
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("classname", "").rsplit(".", 1)[-1] + "::" + case.get("name")
        skipped = case.find("skipped")
        if skipped is not None:
            out[name] = "xfail" if skipped.get("type") == "pytest.xfail" else "skip"
        elif case.find("failure") is not None or case.find("error") is not None:
            out[name] = "FAIL"
        else:
            out[name] = "pass"
    return out


def main(args):
    servers = [a.split("=", 1) for a in args]
    runs = {s: outcomes(p) for s, p in servers}
    names = []
    for s, _ in servers:
        names += [n for n in runs[s] if n not in names]
    cols = [s for s, _ in servers]
    print("| test | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for n in names:
        print(f"| {n} | " + " | ".join(runs[s].get(n, "-") for s in cols) + " |")
    print()
    for s in cols:
        v = list(runs[s].values())
        print(f"{s}: {v.count('pass')} passed, {v.count('FAIL')} failed, "
              f"{v.count('skip')} skipped, {v.count('xfail')} known rtd deviations")


if __name__ == "__main__":
    main(sys.argv[1:])

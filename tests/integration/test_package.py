"""The Debian package and the install, from the build the other tests ran on: cpack -G DEB
into a temporary directory, its contents and dependencies, the extracted rtd checking the
extracted configuration, lintian, the systemd unit (systemd-analyze verify and security),
and cmake --install under DESTDIR and another prefix."""
import glob
import os
import re
import subprocess

import pytest

from conftest import BUILD, ROOT

pytestmark = pytest.mark.long  # cpack and lintian: ~10 s together

TEST_TOOLS = ("gcc", "clang", "cmake", "make", "python3", "pytest", "mosquitto", "erlang",
              "tsung", "chromium", "nats-server", "prometheus", "valgrind", "lintian", "-dev")


def run(*argv, **kw):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0, (argv, r.stdout, r.stderr)
    return r.stdout


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """The package cpack makes of this build, and the tree it extracts to."""
    out = tmp_path_factory.mktemp("deb")
    run("cpack", "-G", "DEB", "-B", out, "--config", os.path.join(BUILD, "CPackConfig.cmake"))
    debs = [f for f in os.listdir(out) if f.endswith(".deb")]
    assert len(debs) == 1, debs
    root = out / "root"
    run("dpkg", "-x", out / debs[0], root)
    return out / debs[0], root


def test_package_holds_rtd_its_files_and_runtime_dependencies_only(deb):
    path, root = deb
    info = run("dpkg-deb", "-f", path, "Package", "Depends")
    depends = re.search(r"^Depends: (.*)$", info, re.M).group(1).split(", ")
    assert any(d.startswith("libssl3") for d in depends), depends
    assert not [d for d in depends for tool in TEST_TOOLS if tool in d.split()[0]], depends
    files = set(run("dpkg-deb", "-c", path).split())
    for f in ("./usr/bin/rtd", "./usr/bin/rtctl", "./etc/rt/rtd.conf",
              "./etc/rt/rules/archive.lua", "./usr/lib/systemd/system/rtd.service",
              "./usr/lib/sysusers.d/rt.conf", "./usr/share/man/man8/rtd.8.gz",
              "./usr/share/man/man8/rtctl.8.gz", "./usr/share/man/man5/rtd.conf.5.gz",
              "./usr/share/doc/rt/copyright"):
        assert f in files, f
    control = path.parent / "control"
    run("dpkg-deb", "-e", path, control)
    conffiles = (control / "conffiles").read_text().split()
    shipped = sorted("/" + f[2:] for f in files if f.startswith("./etc/") and not f.endswith("/"))
    assert sorted(conffiles) == shipped
    postinst = (control / "postinst").read_text()
    assert "adduser --system --group" in postinst
    assert "install -d -o rt -g rt -m 0700 /var/lib/rt" in postinst


def test_the_extracted_rtd_checks_the_extracted_config(deb):
    _, root = deb
    rtd = root / "usr/bin/rtd"
    conf = root / "etc/rt/rtd.conf"
    r = subprocess.run([rtd, "--check", "-c", conf], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    # The rules next to the extracted file, and the FHS state directory.
    assert f"config.paths config={conf} rules_dir={root}/etc/rt/rules data_dir=/var/lib/rt " \
           "password_file=- acl_file=- admin_socket=/var/lib/rt/rtd.sock" in r.stdout, r.stdout
    shipped = len(glob.glob(os.path.join(ROOT, "etc", "rules", "*.lua")))  # all of etc/rules
    assert f"rules rules={shipped}" in r.stdout, r.stdout
    assert "listener.access listener=0.0.0.0:1883" in r.stdout


def test_the_installed_rtd_defaults_to_the_fhs_paths(deb, tmp_path):
    _, root = deb
    rtd = root / "usr/bin/rtd"
    r = subprocess.run([rtd, "--check"], capture_output=True, text=True, timeout=60)
    assert "/etc/rt/rtd.conf" in r.stdout + r.stderr, (r.stdout, r.stderr)
    if not os.path.exists("/etc/rt/rtd.conf"):  # else rt is installed here: that one is checked
        assert r.returncode == 2 and "/etc/rt/rtd.conf: cannot open" in r.stderr, r.stderr
    # A config that does not name data_dir gets /var/lib/rt, not a directory beside it.
    (tmp_path / "rules").mkdir()
    (tmp_path / "rtd.conf").write_text('listeners = { "127.0.0.1:1883" }\n')
    r = subprocess.run([rtd, "--check", "-c", tmp_path / "rtd.conf"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and " data_dir=/var/lib/rt " in r.stdout, (r.stdout, r.stderr)


def test_lintian_finds_nothing(deb):
    path, _ = deb
    r = subprocess.run(["lintian", "--fail-on", "error,warning", path], capture_output=True,
                       text=True, timeout=120)
    findings = [line for line in r.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert r.returncode == 0 and not findings, (r.stdout, r.stderr)


def unit_in(root, tmp_path):
    """The package's unit with its executables found in the extracted tree (verify checks
    that they exist), everything else as shipped."""
    text = (root / "usr/lib/systemd/system/rtd.service").read_text()
    assert "ExecStart=/usr/bin/rtd -c /etc/rt/rtd.conf" in text
    unit = tmp_path / "rtd.service"
    unit.write_text(text.replace("=/usr/bin/rtd", f"={root}/usr/bin/rtd"))
    return unit


def test_the_unit_verifies_and_keeps_its_hardening(deb, tmp_path):
    _, root = deb
    unit = unit_in(root, tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", unit], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r
    for page in re.findall(r"man:(\w+)\((\d)\)", unit.read_text()):
        assert (root / f"usr/share/man/man{page[1]}/{page[0]}.{page[1]}.gz").exists(), page
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", unit],
                       capture_output=True, text=True, timeout=60)
    score = float(re.search(r"Overall exposure level for rtd.service: ([0-9.]+)",
                            r.stdout).group(1))
    # 1.4 as shipped (docs/SERVICE.md: what is left and why); a hardening line lost raises it.
    assert score <= 1.4, r.stdout


def test_cmake_install_honours_destdir_and_prefix(tmp_path):
    dest = tmp_path / "dest"
    run("cmake", "--install", BUILD, "--prefix", "/opt/rt", env=dict(os.environ, DESTDIR=dest))
    assert os.access(dest / "opt/rt/bin/rtd", os.X_OK) and (dest / "opt/rt/bin/rtctl").exists()
    assert (dest / "etc/rt/rtd.conf").exists() and (dest / "etc/rt/rules").is_dir()
    unit = (dest / "opt/rt/lib/systemd/system/rtd.service").read_text()
    assert "ExecStart=/opt/rt/bin/rtd -c /etc/rt/rtd.conf" in unit
    assert (dest / "opt/rt/share/man/man8/rtd.8.gz").exists()

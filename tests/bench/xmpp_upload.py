"""HTTP file upload (XEP-0363) through rtd: one user asks for N slots of SIZE MiB on a raw
stream, PUTs each file over one connection (http.client, 1 MiB writes), then GETs each back;
the PUT and GET rates, rtd's CPU-seconds per GiB moved, and rtd's resident memory before and at
its highest while the files moved (sampled from /proc every 10 ms): a body is written to disk
as it comes and a file is read as the socket takes it, so memory must not grow with SIZE.
  cd tests/integration && /usr/bin/python3 ../bench/xmpp_upload.py 5 100
(arguments: files, MiB each). Needs make build."""
import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, ".")
import xmpp_util as X  # noqa: E402
from conftest import Rtd, free_port  # noqa: E402
from test_xmpp_muc import PW, Client  # noqa: E402
from test_xmpp_upload import slot, urls  # noqa: E402

files, mib = int(sys.argv[1]), int(sys.argv[2])
size = mib << 20
data_dir = tempfile.mkdtemp(prefix="rt-upload-bench-")
X.add_users(data_dir, [("bench@localhost", PW)])
xport, hport = free_port(), free_port()
rtd = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{xport}" }}, '
          f'upload_host = "upload.@HOST@", upload_max_size = {size}, upload_quota = 0 }}',
          f'http={{ bind = "127.0.0.1:{hport}" }}', "auth_max_delay_ms=0", data_dir=data_dir)
pid = rtd.proc.pid


def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def cpu_s():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


peak, sampling = [0], [True]


def sample():
    while sampling[0]:
        peak[0] = max(peak[0], rss_kb())
        time.sleep(0.01)


try:
    c = Client(xport, "bench")
    got = [urls(slot(c, f"file{i}.bin", size)) for i in range(files)]
    payload = os.urandom(1 << 20)
    digest = hashlib.sha256(payload * mib).hexdigest()
    base_rss = rss_kb()
    threading.Thread(target=sample, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", hport, timeout=60)
    cpu0, t0 = cpu_s(), time.monotonic()
    for put, _ in got:
        conn.putrequest("PUT", urllib.parse.urlsplit(put).path)
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        for _ in range(mib):
            conn.send(payload)
        r = conn.getresponse()
        r.read()
        assert r.status == 201, r.status
    put_s, put_cpu = time.monotonic() - t0, cpu_s() - cpu0
    cpu0, t0 = cpu_s(), time.monotonic()
    for _, get in got:
        conn.request("GET", urllib.parse.urlsplit(get).path)
        r = conn.getresponse()
        h = hashlib.sha256()
        while True:
            piece = r.read(1 << 20)
            if not piece:
                break
            h.update(piece)
        assert r.status == 200 and h.hexdigest() == digest
    get_s, get_cpu = time.monotonic() - t0, cpu_s() - cpu0
    sampling[0] = False
    conn.close()
    c.close()
    gib = files * size / (1 << 30)
    print(f"files={files} mib_each={mib} put_mib_s={files * mib / put_s:.0f} "
          f"get_mib_s={files * mib / get_s:.0f} put_cpu_s_per_gib={put_cpu / gib:.2f} "
          f"get_cpu_s_per_gib={get_cpu / gib:.2f} rss_before_kb={base_rss} "
          f"rss_peak_kb={peak[0]} rss_growth_kb={peak[0] - base_rss}")
finally:
    rtd.stop()
    shutil.rmtree(data_dir, ignore_errors=True)

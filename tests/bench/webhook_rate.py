"""Rows per second through an http (webhook) sink into tests/integration/test_webhook.py's
receiver (Python's ThreadingHTTPServer on this machine): N QoS 1 publishes on one topic, timed
from the first publish to the last row received, checked in order and once each.
  cd tests/integration && /usr/bin/python3 ../bench/webhook_rate.py row 10000 500
  cd tests/integration && /usr/bin/python3 ../bench/webhook_rate.py batch 50000 500
(arguments: per_request, rows, batch). Needs make build."""
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, ".")
from conftest import wait_for  # noqa: E402
from test_webhook import Receiver, hook_rtd, publish  # noqa: E402

mode, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
receiver = Receiver()
rtd = hook_rtd(pathlib.Path(tempfile.mkdtemp()), f"http://127.0.0.1:{receiver.port}/",
               per_request=mode, batch=batch, flush_ms=50)
try:
    t0 = time.monotonic()
    publish(rtd.port, range(n))
    published = time.monotonic() - t0
    assert wait_for(lambda: len(receiver.rows()) >= n, 600)
    took = time.monotonic() - t0
    assert receiver.seqs() == list(range(n))
    print(f"per_request={mode} rows={n} batch={batch} requests={receiver.count()} "
          f"publish_s={published:.2f} total_s={took:.2f} rows_per_s={n / took:.0f}")
finally:
    rtd.stop()
    receiver.stop()

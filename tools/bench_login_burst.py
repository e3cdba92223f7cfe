#!/usr/bin/python3
"""QoS 1 PUBACK latency of one connected client while N clients log in at once, each login a
user's first (a full PBKDF2-SHA512 of the password file's iteration count).

    /usr/bin/python3 tools/bench_login_burst.py BUILD_DIR [N] [ITERATIONS] [ROUNDS]

Each round starts a fresh rtd (so no password is remembered yet), connects the measuring
client, then sends the N CONNECTs in one go (a quarter with a wrong password, each of those
from its own loopback address) and reads every CONNACK, while the measuring client publishes
QoS 1 one message every millisecond or so and times each PUBACK. Bounded: at most 20,000 publishes a round.
Prints the PUBACK latency percentiles during the burst and how long the burst took.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def main():
    build = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    iterations = sys.argv[3] if len(sys.argv) > 3 else "100000"
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    os.environ["RT_BUILD_DIR"] = build
    from conftest import Rtd  # noqa: E402 (needs RT_BUILD_DIR)
    from mqtt_raw import Raw, mqtt_str, u16, varint  # noqa: E402

    rtd = os.path.join(build, "rtd")
    tmp = tempfile.mkdtemp(prefix="login-burst-")
    pw = os.path.join(tmp, "users.pw")
    subprocess.run([rtd, "passwd", "-c", "-I", "1000", "-b", pw, "lat", "lat"], check=True)
    for i in range(n):
        subprocess.run([rtd, "passwd", "-I", iterations, "-b", pw, f"u{i}", f"pw-{i}"],
                       check=True)

    def connect_packet(cid, user, password):
        body = mqtt_str("MQTT") + bytes([5, 0xC2]) + u16(60) + varint(0) + mqtt_str(cid)
        body += mqtt_str(user) + mqtt_str(password)
        return bytes([0x10]) + varint(len(body)) + body

    all_lat, bursts, idle = [], [], []
    for r in range(rounds):
        broker = Rtd(f'password_file="{pw}"', "allow_anonymous=false")
        try:
            lat = Raw(broker.port, "lat", username="lat", password="lat")
            for i in range(200):  # idle latency, for comparison
                t0 = time.perf_counter()
                lat.publish("bench/lat", b"x", qos=1, pid=1 + i % 60000)
                idle.append(time.perf_counter() - t0)
            socks = [socket.create_connection(("127.0.0.1", broker.port), timeout=60,
                                              source_address=(f"127.0.{1 + i // 250}.{1 + i % 250}",
                                                              0))
                     for i in range(n)]
            done = threading.Event()
            lats = []

            def measure():
                i = 0
                while not done.is_set() and i < 20000:
                    t0 = time.perf_counter()
                    lat.publish("bench/lat", b"x", qos=1, pid=1 + i % 60000)
                    lats.append(time.perf_counter() - t0)
                    i += 1
                    time.sleep(0.001)  # a steady trickle, sampled through the whole burst

            th = threading.Thread(target=measure)
            th.start()
            time.sleep(0.05)
            t0 = time.perf_counter()
            for i, s in enumerate(socks):
                wrong = i % 4 == 3
                s.sendall(connect_packet(f"b{i}", f"u{i}", "bad" if wrong else f"pw-{i}"))
            codes = []
            for s in socks:
                head = s.recv(2)
                body = s.recv(head[1])
                codes.append(body[1])
            burst = time.perf_counter() - t0
            done.set()
            th.join()
            for s in socks:
                s.close()
            ok = sum(1 for c in codes if c == 0)
            assert ok == n - n // 4, codes
            bursts.append(burst)
            all_lat += lats
            lats.sort()
            print(f"round {r}: burst {burst * 1000:.0f} ms, {len(lats)} PUBACKs, "
                  f"p50 {lats[len(lats) // 2] * 1000:.2f} ms, "
                  f"p99 {lats[int(len(lats) * 0.99)] * 1000:.2f} ms, max {lats[-1] * 1000:.1f} ms")
        finally:
            broker.stop()
    all_lat.sort()
    idle.sort()
    print(f"N={n} iterations={iterations} rounds={rounds}")
    print(f"idle PUBACK: p50 {idle[len(idle) // 2] * 1000:.2f} ms, "
          f"p99 {idle[int(len(idle) * 0.99)] * 1000:.2f} ms")
    print(f"during bursts: p50 {all_lat[len(all_lat) // 2] * 1000:.2f} ms, "
          f"p99 {all_lat[int(len(all_lat) * 0.99)] * 1000:.2f} ms, "
          f"max {all_lat[-1] * 1000:.1f} ms; burst mean {sum(bursts) / len(bursts) * 1000:.0f} ms")


if __name__ == "__main__":
    main()

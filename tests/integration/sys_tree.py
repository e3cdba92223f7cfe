"""Reads rtd's $SYS/broker tree through a real subscriber (paho), for tests that check the
broker's counters: the latest value of each topic and how many times it was published.
"""
import paho.mqtt.client as mqtt

from conftest import subscribe, wait_for

PREFIX = "$SYS/broker/"


class SysTree:
    def __init__(self, port, client_id="sys-watcher", source=""):
        """source: the local address to connect from ("": 127.0.0.1)."""
        self.client = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
        self.client.got = []
        self.client.on_message = lambda _c, _u, m: self.client.got.append(
            (m.topic, m.payload, m.qos))
        self.client.connect("127.0.0.1", port, keepalive=30, bind_address=source)
        self.client.loop_start()
        subscribe(self.client, "$SYS/#")

    def messages(self):
        """(name, value) of every $SYS message received so far, oldest first."""
        return [(t[len(PREFIX):], p.decode()) for t, p, _ in list(self.client.got)
                if t.startswith(PREFIX)]

    def names(self):
        return {n for n, _ in self.messages()}

    def get(self, name):
        """The latest value of $SYS/broker/<name>, or None if it never came."""
        for n, v in reversed(self.messages()):
            if n == name:
                return v
        return None

    def num(self, name):
        v = self.get(name)
        return None if v is None else int(v.split()[0])

    def count(self, name):
        """How many times $SYS/broker/<name> was published to this subscriber."""
        return sum(1 for n, _ in self.messages() if n == name)

    def wait(self, name, want, timeout=5.0):
        """Waits until the number in name equals want; returns whether it did."""
        return wait_for(lambda: self.num(name) == want, timeout)

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()

"""Names for the federation tests: a network namespace of their own (`ip netns`: its own
loopback, and its own /etc/hosts and resolv.conf, which `ip netns exec` shows the processes
it starts as theirs), and a DNS server on UDP in whatever namespace the calling thread is in:
it answers from a table of records (dnspython builds and reads the messages, so rtd's own
reading of them is checked against another implementation), NXDOMAIN for any other name, and
remembers each question it was asked."""
import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import threading

import dns.message
import dns.rcode
import dns.rrset

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Netns:
    """A network namespace named name, its loopback up, with hosts ({address: [names]}) as its
    /etc/hosts and this namespace's 127.0.0.1 as its name server. delete() removes it all."""

    def __init__(self, name, hosts):
        self.name, self.etc = name, f"/etc/netns/{name}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
                           check=True)
            os.makedirs(self.etc, exist_ok=True)
            with open(f"{self.etc}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" +
                        "".join(f"{a} {' '.join(n)}\n" for a, n in hosts.items()))
            with open(f"{self.etc}/resolv.conf", "w") as f:
                f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:2\n")
        except Exception:
            self.delete()
            raise

    def command(self, argv):
        """argv run in the namespace, with its hosts and resolv.conf (the pid is argv's)."""
        return ["ip", "netns", "exec", self.name] + list(argv)

    @contextlib.contextmanager
    def inside(self):
        """This thread in the namespace (sockets it makes stay there), then back."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            _setns(there)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(there)
            os.close(home)

    def delete(self):
        subprocess.run(["ip", "netns", "del", self.name])
        shutil.rmtree(self.etc, ignore_errors=True)


class DnsServer:
    def __init__(self, records, host="127.0.0.1", port=53):
        """records: {(name, type): [rdata text, ...]}, as ("_xmpp-server._tcp.b.test", "SRV"):
        ["10 0 5269 srv1.b.test."]."""
        self.records = {(n.rstrip(".").lower(), t): v for (n, t), v in records.items()}
        self.asked = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                q = dns.message.from_wire(data)
            except Exception:  # not DNS: no answer, as a server drops it
                continue
            r = dns.message.make_response(q)
            r.flags |= 0x0080  # recursion available, as a resolver says
            question = q.question[0]
            name = question.name.to_text().rstrip(".").lower()
            rtype = dns.rdatatype.to_text(question.rdtype)
            self.asked.append((name, rtype))
            names = {n for n, _ in self.records}
            if (name, rtype) in self.records:
                r.answer.append(dns.rrset.from_text(question.name, 300, "IN", rtype,
                                                    *self.records[(name, rtype)]))
            elif name not in names:
                r.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(r.to_wire(), peer)

    def close(self):
        self.sock.close()

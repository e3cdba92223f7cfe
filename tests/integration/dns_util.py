"""A DNS server for the federation tests, on UDP in whatever network namespace the calling
thread is in: it answers from a table of records (dnspython builds and reads the messages, so
rtd's own reading of them is checked against another implementation), NXDOMAIN for any other
name, and remembers each question it was asked."""
import socket
import threading

import dns.message
import dns.rcode
import dns.rrset


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

"""Certificates for the TLS tests, made at run time with the openssl CLI (OpenSSL 3.0):

- ca: the test CA (ECDSA P-256), which signs everything below through `openssl ca`, so that it
  keeps an index and can revoke and publish a CRL;
- server certificates: ECDSA P-256 and RSA 2048, both with SAN IP:127.0.0.1 and DNS:localhost;
- client certificates: good (CN=alice-cert), a second good one (CN=bob-cert), expired (valid
  in 2020 only, through `openssl ca -startdate/-enddate`), revoked (listed in ca/crl.pem), and
  one from a second CA the broker does not know;
- XMPP client certificates on demand (CA.issue_xmpp): subjectAltName otherNames
  id-on-xmppAddr (RFC 6120 13.7.1.4), the identities of SASL EXTERNAL (XEP-0178); and XMPP
  servers' (CA.issue_domain): DNS-IDs, for SASL EXTERNAL between servers.

Nothing is fetched or cached: each module that uses the `pki` fixture gets its own set in its
tmp directory. Tests get them through the `pki` fixture (conftest.py, module scope): a Pki.
"""
import os
import subprocess

OPENSSL = "openssl"

CA_CONF = """\
[ ca ]
default_ca = CA_default

[ CA_default ]
dir = {dir}
database = $dir/index.txt
new_certs_dir = $dir/newcerts
serial = $dir/serial
crlnumber = $dir/crlnumber
certificate = $dir/ca.pem
private_key = $dir/ca.key
default_md = sha256
default_days = 365
default_crl_days = 30
policy = policy_any
unique_subject = no
copy_extensions = none

[ policy_any ]
commonName = supplied
organizationName = optional

[ ca_ext ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[ server_ext ]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[ client_ext ]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def openssl(*args, cwd=None):
    p = subprocess.run([OPENSSL, *map(str, args)], capture_output=True, text=True, timeout=60,
                       cwd=cwd)
    assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p.stdout


def new_key(path, kind):
    """kind: "ec" (P-256) or "rsa" (2048 bits). PKCS#8 PEM, mode 0600."""
    if kind == "ec":
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", path)
    else:
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path)
    os.chmod(path, 0o600)
    return str(path)


class CA:
    """A CA directory for `openssl ca`: ca.pem, ca.key, index.txt, serial, crl.pem."""

    def __init__(self, directory, name):
        self.dir = str(directory)
        os.makedirs(os.path.join(self.dir, "newcerts"), exist_ok=True)
        open(os.path.join(self.dir, "index.txt"), "w").close()
        with open(os.path.join(self.dir, "serial"), "w") as f:
            f.write("1000\n")
        with open(os.path.join(self.dir, "crlnumber"), "w") as f:
            f.write("01\n")
        self.conf = os.path.join(self.dir, "ca.cnf")
        with open(self.conf, "w") as f:
            f.write(CA_CONF.format(dir=self.dir))
        self.key = new_key(os.path.join(self.dir, "ca.key"), "ec")
        self.cert = os.path.join(self.dir, "ca.pem")
        openssl("req", "-new", "-x509", "-config", self.conf, "-extensions", "ca_ext",
                "-key", self.key, "-subj", f"/O=rt tests/CN={name}", "-days", "30",
                "-out", self.cert)
        self.crl = os.path.join(self.dir, "crl.pem")
        self.gencrl()

    def issue(self, out_dir, name, cn, kind="ec", ext="client_ext", start=None, end=None,
              org="rt tests"):
        """Key and certificate out_dir/name.key, name.pem signed by this CA; start/end as
        YYYYMMDDHHMMSSZ (default: now, for 30 days). Returns (cert, key)."""
        key = new_key(os.path.join(out_dir, f"{name}.key"), kind)
        csr = os.path.join(out_dir, f"{name}.csr")
        cert = os.path.join(out_dir, f"{name}.pem")
        openssl("req", "-new", "-key", key, "-subj", f"/O={org}/CN={cn}", "-out", csr)
        args = ["ca", "-batch", "-notext", "-config", self.conf, "-extensions", ext,
                "-in", csr, "-out", cert]
        if start:
            args += ["-startdate", start]
        args += ["-enddate", end] if end else ["-days", "30"]
        openssl(*args)
        return cert, key

    def issue_xmpp(self, out_dir, name, *jids):
        """A client certificate whose subjectAltName is one id-on-xmppAddr otherName (a
        UTF8String) per JID, from an extension file `openssl ca -extfile` reads."""
        sans = ", ".join(f"otherName:1.3.6.1.5.5.7.8.5;UTF8:{j}" for j in jids)
        return self._issue_with(out_dir, name, "clientAuth", sans)

    def issue_domain(self, out_dir, name, *domains):
        """An XMPP server's certificate (RFC 6120 13.7.1.2): a DNS-ID per domain, for TLS
        either way (a server-to-server stream's initiating server shows it as a client)."""
        return self._issue_with(out_dir, name, "serverAuth, clientAuth",
                                ", ".join(f"DNS:{d}" for d in domains))

    def _issue_with(self, out_dir, name, usage, sans):
        ext = os.path.join(out_dir, f"{name}.ext")
        with open(ext, "w") as f:
            f.write("[ issued ]\nbasicConstraints = CA:FALSE\n"
                    "keyUsage = critical, digitalSignature, keyEncipherment\n"
                    f"extendedKeyUsage = {usage}\nsubjectAltName = {sans}\n")
        key = new_key(os.path.join(out_dir, f"{name}.key"), "ec")
        csr = os.path.join(out_dir, f"{name}.csr")
        cert = os.path.join(out_dir, f"{name}.pem")
        openssl("req", "-new", "-key", key, "-subj", f"/O=rt tests/CN={name}", "-out", csr)
        openssl("ca", "-batch", "-notext", "-config", self.conf, "-extfile", ext,
                "-extensions", "issued", "-in", csr, "-out", cert, "-days", "30")
        return cert, key

    def revoke(self, cert):
        openssl("ca", "-config", self.conf, "-revoke", cert)
        self.gencrl()

    def gencrl(self):
        openssl("ca", "-config", self.conf, "-gencrl", "-out", self.crl)


def cert_field(cert, field):
    """`openssl x509 -noout -<field>` of a PEM file: its value after '='."""
    out = openssl("x509", "-in", cert, "-noout", f"-{field}", "-nameopt", "RFC2253").strip()
    return out.split("=", 1)[1]


def serial_of(cert):
    """The serial number as an upper-case hex string, as Python's getpeercert() shows it."""
    return cert_field(cert, "serial").upper()


class Pki:
    def __init__(self, directory):
        d = str(directory)
        self.dir = d
        self.ca = CA(os.path.join(d, "ca"), "rt test CA")
        self.server = {}
        for kind in ("ec", "rsa"):
            self.server[kind] = self.ca.issue(d, f"server-{kind}", "localhost", kind=kind,
                                              ext="server_ext", org=f"rt server {kind}")
        self.client = self.ca.issue(d, "client-alice", "alice-cert")
        self.client_bob = self.ca.issue(d, "client-bob", "bob-cert", kind="rsa")
        self.expired = self.ca.issue(d, "client-expired", "expired-cert",
                                     start="20200101000000Z", end="20200201000000Z")
        self.revoked = self.ca.issue(d, "client-revoked", "revoked-cert")
        self.ca.revoke(self.revoked[0])
        self.other_ca = CA(os.path.join(d, "other-ca"), "unknown CA")
        self.unknown = self.other_ca.issue(d, "client-unknown", "unknown-cert")
        self._n = 0

    def new_server(self, kind="ec", org="rt server reloaded"):
        """Another server certificate from the same CA (a new serial), for reload tests."""
        self._n += 1
        return self.ca.issue(self.dir, f"server-new-{self._n}", "localhost", kind=kind,
                             ext="server_ext", org=f"{org} {self._n}")


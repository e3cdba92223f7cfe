"""JSON Web Tokens in the password (docs/AUTH.md, "The login chain and JSON Web Tokens"),
against rtd with real clients and tokens made here with PyJWT and keys from `cryptography`:
HS256 with a secret file, RS256 with a PEM key, ES256 from a JWKS file by kid (reloaded on
SIGHUP); signatures, alg confusion, exp, nbf, aud, iss and the user name claim refused as they
must be; the acl claim as the client's own ACL, kept when its session is resumed on its
holder; the connection ended with 0xA0 when its token runs out; the chain with the password
file before it."""
import json
import signal
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from conftest import Rtd, password_file, wait_for
from mqtt_raw import DISCONNECT, PUBACK, PUBLISH, Raw, mqtt_str, prop_u32, u16, varint

BAD_CREDENTIALS, NOT_AUTHORIZED, MAX_CONNECT_TIME = 0x86, 0x87, 0xA0
SECRET = b"s3cret-that-is-long-enough-for-hs256-0123456789"


def b64url_uint(n, size=None):
    raw = n.to_bytes(size or (n.bit_length() + 7) // 8, "big")
    return jwt.utils.base64url_encode(raw).decode()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("jwt")
    (d / "secret").write_bytes(SECRET + b"\n")
    (d / "short").write_bytes(b"too short\n")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    other_ec = ec.generate_private_key(ec.SECP256R1())
    (d / "rsa.pem").write_bytes(rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    pn = rsa_key.public_key().public_numbers()
    en = ec_key.public_key().public_numbers()
    on = other_ec.public_key().public_numbers()
    jwk_rsa = {"kty": "RSA", "kid": "r1", "use": "sig", "n": b64url_uint(pn.n),
               "e": b64url_uint(pn.e)}
    jwk_ec = {"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64url_uint(en.x, 32),
              "y": b64url_uint(en.y, 32)}
    jwk_other = {"kty": "EC", "kid": "e2", "crv": "P-256", "x": b64url_uint(on.x, 32),
                 "y": b64url_uint(on.y, 32)}
    (d / "jwks.json").write_text(json.dumps({"keys": [jwk_rsa, jwk_ec]}))
    for p in d.iterdir():
        p.chmod(0o600)
    return {"dir": d, "rsa": rsa_key, "ec": ec_key, "other_ec": other_ec,
            "jwks_other": {"keys": [jwk_rsa, jwk_ec, jwk_other]}}


def token(key, alg, kid=None, **claims):
    claims.setdefault("exp", int(time.time()) + 3600)
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid} if kid else None)


def connack(broker, tok, cid="c1", user="u1", version=5, **kw):
    c = Raw(broker.port, cid, version=version, username=user, password=tok, **kw)
    return c.connack_code, c


def jwt_rtd(stopper, *auth, extra=()):
    broker = Rtd("allow_anonymous=false", "auth={" + ", ".join(auth) + "}", *extra)
    stopper(broker)
    return broker


def puback_reason(c, topic, pid=1):
    c.send((PUBLISH << 4) | 2, mqtt_str(topic) + u16(pid) + varint(0) + b"x")
    ack = c.expect(PUBACK)
    return ack.body[2] if len(ack.body) > 2 else 0


def test_hs256_and_what_a_token_must_be(keys, stopper):
    d = keys["dir"]
    broker = jwt_rtd(stopper, f'{{ kind = "jwt", secret_file = "{d}/secret", audience = "rt", '
                              f'issuer = "me", username_claim = "sub" }}')
    good = dict(aud="rt", iss="me", sub="u1")
    assert connack(broker, token(SECRET, "HS256", **good))[0] == 0
    assert connack(broker, token(SECRET, "HS256", **good), version=4)[0] == 0
    now = int(time.time())
    refused = [
        token(b"another-secret-that-is-long-enough-000000000", "HS256", **good),
        token(SECRET, "HS256", **{**good, "exp": now - 5}),
        token(SECRET, "HS256", **{**good, "nbf": now + 600}),
        token(SECRET, "HS256", **{**good, "aud": "someone-else"}),
        token(SECRET, "HS256", **{**good, "iss": "not-me"}),
        token(SECRET, "HS256", **{**good, "sub": "u2"}),  # the token is u2's
        jwt.encode(good, None, algorithm="none"),
        token(SECRET, "HS256", **good)[:-3] + "AAA",  # a signature changed
    ]
    # Each from an address of its own: a failed login slows its address's next one down.
    for i, tok in enumerate(refused):
        assert connack(broker, tok, bind=f"127.0.0.{20 + i}")[0] == BAD_CREDENTIALS, i
    assert connack(broker, "not a token")[0] == NOT_AUTHORIZED  # passed on: nobody took it
    log = broker.read_log()
    for why in ["signature does not verify", "has expired", "not valid yet", "another audience",
                "another issuer", "names another user", "alg or kid names no key"]:
        assert why in log, why


def test_rs256_pem_refuses_the_public_key_as_an_hmac_secret(keys, stopper):
    d = keys["dir"]
    broker = jwt_rtd(stopper, f'{{ kind = "jwt", public_key = "{d}/rsa.pem" }}')
    assert connack(broker, token(keys["rsa"], "RS256"))[0] == 0
    pem = (d / "rsa.pem").read_bytes()
    # The classic confusion: HS256 "signed" with the public key. PyJWT itself refuses to make
    # it, so it is made by hand.
    import hashlib
    import hmac
    head = jwt.utils.base64url_encode(b'{"alg":"HS256","typ":"JWT"}')
    body = jwt.utils.base64url_encode(json.dumps({"exp": int(time.time()) + 60}).encode())
    sig = jwt.utils.base64url_encode(hmac.new(pem, head + b"." + body, hashlib.sha256).digest())
    assert connack(broker, (head + b"." + body + b"." + sig).decode())[0] == BAD_CREDENTIALS


def test_es256_from_a_jwks_by_kid_reloaded_on_sighup(keys, stopper):
    d = keys["dir"]
    jwks = d / "jwks-reload.json"
    jwks.write_text((d / "jwks.json").read_text())
    jwks.chmod(0o600)
    broker = jwt_rtd(stopper, f'{{ kind = "jwt", jwks_file = "{jwks}" }}')
    assert connack(broker, token(keys["ec"], "ES256", kid="e1"))[0] == 0
    assert connack(broker, token(keys["rsa"], "RS256", kid="r1"))[0] == 0
    assert connack(broker, token(keys["ec"], "ES256", kid="r1"))[0] == BAD_CREDENTIALS
    later = token(keys["other_ec"], "ES256", kid="e2")
    assert connack(broker, later)[0] == BAD_CREDENTIALS  # not in the file yet
    jwks.write_text(json.dumps(keys["jwks_other"]))
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "rtd.reloaded" in broker.read_log(), timeout=30)
    assert connack(broker, later)[0] == 0


def test_the_acl_claim_is_the_clients_acl_also_on_its_resumed_session(keys, stopper):
    d = keys["dir"]
    broker = jwt_rtd(stopper, f'{{ kind = "jwt", secret_file = "{d}/secret" }}')
    tok = token(SECRET, "HS256", acl={"pub": ["dev/%c/up"], "sub": ["dev/%c/down"],
                                      "all": ["shared/#"]})
    expiry = prop_u32(0x11, 3600)
    for attempt in range(2):  # the second CONNECT is handed to the session's holder
        code, c = connack(broker, tok, cid="dev7", clean=False, props=expiry)
        assert code == 0 and c.session_present == attempt
        assert puback_reason(c, "dev/dev7/up") < 0x80  # 0x10: nobody subscribed
        assert puback_reason(c, "shared/x") < 0x80
        assert puback_reason(c, "dev/dev8/up") == NOT_AUTHORIZED
        assert puback_reason(c, "dev/dev7/down") == NOT_AUTHORIZED  # sub only
        assert c.subscribe("dev/dev7/down", qos=1, pid=5).body[-1] == 1
        assert c.subscribe("other/#", qos=1, pid=6).body[-1] == NOT_AUTHORIZED
        c.disconnect()
        broker.wait_offline("dev7")
    # A malformed acl claim refuses the login rather than let the client do anything.
    bad = token(SECRET, "HS256", acl={"pub": "not a list"})
    assert connack(broker, bad)[0] == BAD_CREDENTIALS


def test_the_connection_ends_when_its_token_runs_out(keys, stopper):
    d = keys["dir"]
    broker = jwt_rtd(stopper, f'{{ kind = "jwt", secret_file = "{d}/secret" }}')
    exp = int(time.time()) + 2
    code, c = connack(broker, token(SECRET, "HS256", exp=exp))
    assert code == 0
    p = c.read(timeout=2 + 30)
    assert p is not None and p.type == DISCONNECT and p.body[0] == MAX_CONNECT_TIME, p
    assert time.time() >= exp  # never before: rtd checks exp in whole seconds
    assert "event=client.token_expired client=c1" in broker.read_log()
    kept = jwt_rtd(stopper, f'{{ kind = "jwt", secret_file = "{d}/secret", '
                            f'disconnect_after_expire = false }}')
    code, c = connack(kept, token(SECRET, "HS256", exp=int(time.time()) + 1))
    assert code == 0
    assert c.read(timeout=3) is None  # the token ran out; the connection did not end


def test_the_chain_password_file_first(keys, stopper, tmp_path):
    d = keys["dir"]
    pw = password_file(tmp_path / "pw", {"alice": "secret-a"})
    broker = jwt_rtd(stopper, '{ kind = "file" }',
                     f'{{ kind = "jwt", secret_file = "{d}/secret" }}',
                     extra=(f'password_file="{pw}"',))
    assert connack(broker, "secret-a", user="alice")[0] == 0
    assert connack(broker, token(SECRET, "HS256"), user="bob")[0] == 0  # the file knows no bob
    # The file knows alice: her password decides, a token is only a wrong one.
    assert connack(broker, token(SECRET, "HS256"), user="alice")[0] == BAD_CREDENTIALS


def test_bad_settings_stop_the_start(keys):
    import subprocess
    from conftest import RTD, ROOT
    import os
    d = keys["dir"]
    for auth, why in [(f'{{ kind = "jwt", secret_file = "{d}/short" }}', "at least 32 bytes"),
                      (f'{{ kind = "jwt", public_key = "{d}/secret" }}', "no PEM public key"),
                      ('{ kind = "jwt" }', "one of secret_file, public_key and jwks_file"),
                      (f'{{ kind = "jwt", jwks_file = "{d}/rsa.pem" }}', "not JSON")]:
        r = subprocess.run([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o",
                            "listeners=127.0.0.1:0", "-o", "auth={" + auth + "}", "--check"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and why in r.stdout + r.stderr, (auth, r.stdout + r.stderr)

"""``python -m aioinfer serve`` for the CLI tests: its flags parsed in-process, the command run as a
real subprocess, its one-line error checked; and a self-signed certificate for the TLS flags."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aioinfer.entrypoints.serve_cli import add_serve_parser

ROOT = Path(__file__).resolve().parents[1]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def run_serve(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
    full_env.update(env or {})
    full_env.setdefault("AIOINFER_CPU_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "aioinfer", "serve", *args], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, status: int, *fragments: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == status, out
    assert "Traceback" not in out, out
    errors = [line for line in result.stderr.splitlines() if line.startswith("aioinfer serve: error: ")]
    assert len(errors) == 1, out
    for fragment in fragments:
        assert fragment in errors[0], out


def self_signed(folder):
    """A certificate for 127.0.0.1 and its key, as two PEM files (the certificate is its own CA)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file

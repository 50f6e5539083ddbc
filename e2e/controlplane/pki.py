"""A throwaway PKI for one local cluster, made with the openssl CLI.

The openssl binary is on every Debian machine and CI runner, so the harness needs no
Python crypto dependency. Everything here is test-only: 2048-bit RSA, 10-day validity.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class PKI:
    """A CA plus the leaf certificates and keys the control plane and the nodes need."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_crt = self.dir / "ca.crt"
        self.ca_key = self.dir / "ca.key"
        if not self.ca_crt.exists():
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "10",
                     "-subj", "/CN=rtj-local-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=self.dir)

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              client: bool = True, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """Issue `<name>.crt`/`<name>.key` signed by the CA; returns (cert, key)."""
        crt, key, csr = self.dir / f"{name}.crt", self.dir / f"{name}.key", self.dir / f"{name}.csr"
        if crt.exists() and key.exists():
            return crt, key
        subj = "/" + "/".join([*(f"O={o}" for o in orgs), f"CN={cn}"])
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout", key.name,
                 "-out", csr.name, cwd=self.dir)
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        ext = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
        ]
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        extfile = self.dir / f"{name}.ext"
        extfile.write_text("\n".join(ext) + "\n")
        _openssl("x509", "-req", "-in", csr.name, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "10", "-sha256", "-extfile", extfile.name, "-out", crt.name, cwd=self.dir)
        csr.unlink()
        extfile.unlink()
        return crt, key

    def service_account_keys(self) -> tuple[Path, Path]:
        """RSA key pair the apiserver signs ServiceAccount tokens with: (private, public)."""
        priv, pub = self.dir / "sa.key", self.dir / "sa.pub"
        if not priv.exists():
            _openssl("genrsa", "-out", priv.name, "2048", cwd=self.dir)
            _openssl("rsa", "-in", priv.name, "-pubout", "-out", pub.name, cwd=self.dir)
        return priv, pub

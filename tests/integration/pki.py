"""Test certificates, made with the openssl CLI: a CA, a server certificate
for 127.0.0.1 and localhost signed by it, a client certificate from the
same CA, and one from another CA (for mutual TLS refusals)."""
import subprocess


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-subj", f"/CN={name}", cwd=d)


def make_cert(d, name, ca, san=None):
    """A certificate signed by `ca`: a server's when san is given, else a
    client's (extendedKeyUsage clientAuth)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else
                   "extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
            "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
            "-out", f"{name}.pem", "-extfile", ext.name, cwd=d)


def make_pki(d):
    """Writes ca, other-ca, server, client and stranger (.pem and .key)
    into the directory d; returns d."""
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", san="DNS:localhost,IP:127.0.0.1")
    make_cert(d, "client", "ca")
    make_cert(d, "stranger", "other-ca")
    return d

"""Local S3-compatible servers for the cloud benchmarks: s3proxy (and moto as fallback).

s3proxy (Maven Central `org.gaul:s3proxy`, the `jar-with-dependencies`
artifact, filesystem blobstore) is fetched once with Maven into the bench work
directory (`.bench/s3proxy/`, gitignored) and started on loopback with a
properties file: fixed identity and credential, aws-v2-or-v4 authorization,
blobs under the work directory. It is what the throughput figures use: here
it sustains several times moto's ~100 MB/s.

moto's server (`moto_server` from the project venv) is used for Step
Functions (the agent's StartExecution; execution of the state machine stays
off, so nothing runs behind it) and, with --s3-server moto, for S3 too.

s3proxy 2.6.0 rejects a few request headers the agent sends (see
s3compat/sitecustomize.py); `COMPAT_ENV` turns on the benchmark-only shim
in the child processes it is passed to.

With `tls=True` s3proxy also serves HTTPS (s3proxy.secure-endpoint), as S3
does for a Lambda: TLS costs the client CPU on every byte, which loopback
HTTP would leave out of a measurement. The certificate is made at run time
with the JDK's keytool into the work directory (a keystore for s3proxy, its
certificate as PEM for the client: `Server.ca_bundle`, passed to boto3 as
AWS_CA_BUNDLE), never checked in and never trusted beyond the benchmark's
child processes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

S3PROXY_VERSIONS = ("2.6.0", "2.4.1")
IDENTITY = "braidbench"
CREDENTIAL = "braidbench-secret"
REGION = "us-east-1"
COMPAT_DIR = Path(__file__).resolve().parent / "s3compat"


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch_s3proxy(cache: Path, log=lambda msg: None, versions: tuple[str, ...] = S3PROXY_VERSIONS) -> Path:
    """The s3proxy jar, from the cache or fetched with `mvn dependency:copy`."""
    cache.mkdir(parents=True, exist_ok=True)
    for version in versions:
        jar = cache / f"s3proxy-{version}-jar-with-dependencies.jar"
        if jar.exists():
            return jar
    if not shutil.which("mvn"):
        raise ServerError("s3proxy is not cached and Maven (mvn) is not on PATH to fetch it")
    errors = []
    for version in versions:
        log(f"fetching org.gaul:s3proxy:{version} (jar-with-dependencies) with Maven into {cache} ...")
        proc = subprocess.run(
            [
                "mvn", "-q", "-B", "dependency:copy",
                f"-Dartifact=org.gaul:s3proxy:{version}:jar:jar-with-dependencies",
                f"-DoutputDirectory={cache}",
            ],
            cwd=cache, capture_output=True, text=True,
        )
        jar = cache / f"s3proxy-{version}-jar-with-dependencies.jar"
        if proc.returncode == 0 and jar.exists():
            return jar
        errors.append(f"{version}: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    raise ServerError("cannot fetch s3proxy: " + "; ".join(errors))


def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServerError(f"server exited with {proc.returncode}: {tail}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (403/404 without credentials): ready
        except OSError:
            time.sleep(0.2)
    raise ServerError(f"server at {url} not ready after {timeout:.0f} s; see {log_path}")


@dataclass
class Server:
    kind: str  # "s3proxy" or "moto"
    endpoint: str
    proc: subprocess.Popen
    log_path: Path
    data_dir: Path | None = None
    version: str = ""
    env: dict[str, str] = field(default_factory=dict)
    secure_endpoint: str | None = None  # https:// on loopback, when started with tls=True
    ca_bundle: Path | None = None  # the PEM certificate a client trusts for secure_endpoint

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


KEYSTORE_PASSWORD = "braidbench"  # of a throwaway keystore for a loopback certificate


def make_keystore(home: Path) -> tuple[Path, Path]:
    """(keystore for s3proxy, PEM certificate for clients): a fresh self-signed certificate for 127.0.0.1, made with keytool."""
    if not shutil.which("keytool"):
        raise ServerError("keytool (the JDK's) is not on PATH to make a certificate for s3proxy's TLS endpoint")
    keystore, pem = home / "keystore.jks", home / "loopback-cert.pem"
    for path in (keystore, pem):
        path.unlink(missing_ok=True)
    steps = (
        ["keytool", "-genkeypair", "-alias", "s3proxy", "-keyalg", "RSA", "-keysize", "2048", "-validity", "7",
         "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-storetype", "JKS",
         "-keystore", str(keystore), "-storepass", KEYSTORE_PASSWORD, "-keypass", KEYSTORE_PASSWORD],
        ["keytool", "-exportcert", "-rfc", "-alias", "s3proxy", "-keystore", str(keystore), "-storepass", KEYSTORE_PASSWORD, "-file", str(pem)],
    )
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServerError(f"keytool {step[1]} failed: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    return keystore, pem


def _wait_tls(endpoint: str, ca_bundle: Path, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    """Like _wait_http, over TLS trusting only `ca_bundle`: a certificate the client would refuse fails here, not mid-benchmark."""
    import ssl

    context = ssl.create_default_context(cafile=str(ca_bundle))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServerError(f"server exited with {proc.returncode}: {tail}")
        try:
            urllib.request.urlopen(endpoint + "/", timeout=2, context=context).close()
            return
        except urllib.error.HTTPError:
            return
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError):
                raise ServerError(f"s3proxy's TLS endpoint {endpoint} does not verify with {ca_bundle}: {exc.reason}") from None
            time.sleep(0.2)
        except OSError:
            time.sleep(0.2)
    raise ServerError(f"server at {endpoint} not ready after {timeout:.0f} s; see {log_path}")


PROVIDERS = ("filesystem", "filesystem-nio2")  # s3proxy's jclouds providers that keep blobs as files under a directory
NULL_PARTS_SOURCE = Path(__file__).resolve().parent / "nullparts" / "NullParts.java"


def build_null_parts(jar: Path, cache: Path) -> Path:
    """The classes of nullparts/NullParts.java (s3proxy over a store that counts and discards multipart data), built
    with the JDK's javac against `jar` into `cache`, once per source and jar."""
    import hashlib

    if not shutil.which("javac"):
        raise ServerError("javac (the JDK's) is not on PATH to build the benchmark's null-parts s3proxy store")
    digest = hashlib.sha256(NULL_PARTS_SOURCE.read_bytes() + jar.name.encode()).hexdigest()[:12]
    classes = cache / f"nullparts-{digest}"
    if (classes / "braidbench" / "NullParts.class").exists():
        return classes
    shutil.rmtree(classes, ignore_errors=True)
    proc = subprocess.run(["javac", "-nowarn", "-cp", str(jar), "-d", str(classes), str(NULL_PARTS_SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(classes, ignore_errors=True)
        raise ServerError(f"javac {NULL_PARTS_SOURCE.name} failed: {(proc.stdout + proc.stderr).strip().splitlines()[-3:]}")
    return classes


def start_s3proxy(workdir: Path, log=lambda msg: None, *, tls: bool = False, host: str = "127.0.0.1",
                  wrap: list[str] | None = None, home_name: str = "s3proxy", provider: str = "filesystem",
                  data_dir: Path | None = None, null_parts: bool = False) -> Server:
    """s3proxy on a free loopback port, filesystem blobstore under workdir/s3proxy/data; with `tls`, an HTTPS port too.

    `wrap` prefixes the java command (`ip netns exec NS`: the `link` benchmark's
    server behind a shaped link), `host` is the address it listens on there.
    `provider` is one of PROVIDERS and `data_dir` where its blobs go (emptied
    first; default HOME/data): a tmpfs directory keeps the disk out of a run.
    `null_parts`: the store under s3proxy counts and discards multipart
    uploads' data (nullparts/NullParts.java), everything else as usual.
    """
    if not shutil.which("java"):
        raise ServerError("java is not on PATH")
    if provider not in PROVIDERS:
        raise ServerError(f"s3proxy provider {provider!r} is not one of {', '.join(PROVIDERS)}")
    jar = fetch_s3proxy(workdir / "s3proxy", log)
    home = workdir / home_name
    home.mkdir(parents=True, exist_ok=True)
    data = data_dir or home / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    port = free_port()
    endpoint = f"http://{host}:{port}"
    secure: list[str] = []
    secure_endpoint, ca_bundle = None, None
    if tls:
        keystore, ca_bundle = make_keystore(home)
        secure_endpoint = f"https://127.0.0.1:{free_port()}"
        secure = [f"s3proxy.secure-endpoint={secure_endpoint}", f"s3proxy.keystore-path={keystore}", f"s3proxy.keystore-password={KEYSTORE_PASSWORD}"]
    props = home / "s3proxy.properties"
    props.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={endpoint}",
                *secure,
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={IDENTITY}",
                f"s3proxy.credential={CREDENTIAL}",
                f"jclouds.provider={provider}",
                f"jclouds.filesystem.basedir={data}",
                "",
            ]
        )
    )
    log_path = home / "s3proxy.log"
    with open(log_path, "wb") as out:
        main = ["-cp", f"{jar}{os.pathsep}{build_null_parts(jar, workdir / 's3proxy')}", "braidbench.NullParts", str(props)] if null_parts \
            else ["-jar", str(jar), "--properties", str(props)]
        proc = subprocess.Popen(
            [*(wrap or []), "java", "-Xmx1g", *main],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    server = Server("s3proxy", endpoint, proc, log_path, data, jar.name.split("-")[1], secure_endpoint=secure_endpoint, ca_bundle=ca_bundle)
    try:
        _wait_http(endpoint + "/", proc, log_path)
        if secure_endpoint and ca_bundle:
            _wait_tls(secure_endpoint, ca_bundle, proc, log_path)
    except BaseException:
        server.stop()
        raise
    return server


def start_moto(workdir: Path, venv_bin: Path, name: str = "moto") -> Server:
    """moto's server on a free loopback port (state machine execution off)."""
    home = workdir / name
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = home / "moto.log"
    env = dict(os.environ)
    env.pop("MOTO_STEPFUNCTIONS_EXECUTE_STATE_MACHINE", None)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [str(venv_bin / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    server = Server("moto", endpoint, proc, log_path)
    try:
        _wait_http(endpoint + "/moto-api/", proc, log_path)
    except BaseException:
        server.stop()
        raise
    return server


def credentials_env() -> dict[str, str]:
    """Credentials both servers accept (moto takes any; s3proxy this fixed pair)."""
    return {"AWS_ACCESS_KEY_ID": IDENTITY, "AWS_SECRET_ACCESS_KEY": CREDENTIAL, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}


def compat_env(base: dict[str, str]) -> dict[str, str]:
    """Child-process environment with the s3proxy compatibility shim on."""
    env = dict(base)
    env["BRAID_BENCH_S3COMPAT"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(COMPAT_DIR), env.get("PYTHONPATH", "")) if p)
    return env

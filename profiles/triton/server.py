"""Run the ``tritonserver`` binary that ships in the ``nvidia-pytriton`` wheel, on CPU.

:class:`TritonServer` builds a private backend directory (the python backend plus the stub
for the running interpreter), starts the binary in its own process group on free ports,
waits for ``/v2/health/ready`` and stops the whole group on exit, even on failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from profiles.triton.process import http_ready, stop_group, wait_http_ready

INSTALL_HINT = (
    "the tritonserver binary was not found; install it with `pip install nvidia-pytriton` "
    "(it ships bin/tritonserver and the python backend), or pass --tritonserver PATH"
)


class TritonError(RuntimeError):
    """Triton could not be found, started or made ready; the message says why."""


def free_port() -> int:
    return free_ports(1)[0]


_HANDED: dict[int, float] = {}  # port -> when this process last handed it out
_HANDED_LOCK = threading.Lock()
HANDED_FOR_S = 120.0  # a port handed out is not handed out again this long (its server may still be starting)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1: held open together while they are picked
    (ports picked one after another can repeat: the kernel hands a just-closed one out again),
    none handed out by this process in the last :data:`HANDED_FOR_S` s (servers started at
    once, each still to bind its ports, never get the same one)."""
    with _HANDED_LOCK:
        now = time.monotonic()
        for port in [p for p, t in _HANDED.items() if now - t > HANDED_FOR_S]:
            del _HANDED[port]
        held: list[socket.socket] = []
        try:
            picked: list[int] = []
            while len(picked) < n:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)  # a port skipped stays held, so the kernel offers another
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                if port not in _HANDED:
                    picked.append(port)
                if len(held) > n + 1000:
                    raise OSError(f"no {n} free TCP ports on 127.0.0.1 that were not just handed out")
            for port in picked:
                _HANDED[port] = now
            return picked
        finally:
            for s in held:
                s.close()


def pytriton_root() -> Path:
    try:
        import pytriton  # noqa: F401  (locates the wheel's files)
    except ImportError as e:
        raise TritonError(INSTALL_HINT) from e
    root = Path(sys.modules["pytriton"].__file__).parent / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        raise TritonError(INSTALL_HINT)
    return root


def prepare_backends(dest: Path, root: Path | None = None) -> Path:
    """A backend directory whose python backend carries the stub for this interpreter."""
    root = root or pytriton_root()
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonError(f"no python backend stub for Python {ver} in {root}/python_backend_stubs")
    py = dest / "python"
    if not (py / "triton_python_backend_stub").exists():
        py.mkdir(parents=True, exist_ok=True)
        for f in (root / "backends" / "python").iterdir():
            if f.is_file():
                shutil.copy2(f, py / f.name)
        shutil.copy2(stub, py / "triton_python_backend_stub")
    return dest


def triton_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its python stubs: this interpreter's libpython first
    (else the stub loads the system one and dies), this venv's bin first on PATH, and this
    interpreter's import path so models import numpy and headrace; the wheel's vendored
    libraries for the stub."""
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    # the stub also links the CUDA runtime stubs that the wheel vendors beside the package
    vendored = pytriton_root().parent.parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        x for x in (libdir, str(vendored), env.get("LD_LIBRARY_PATH", "")) if x
    )
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    paths = [p for p in sys.path if p and Path(p).exists()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("PYTHONHOME", None)
    if extra:
        env.update(extra)
    return env


def triton_argv(repository: str | Path, http_port: int, grpc_port: int, metrics_port: int = 0, *,
                binary: str = "tritonserver", backends: str | Path | None = None, address: str = "127.0.0.1",
                extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The one command line headrace starts Triton with, here and on real nodes (the dry-run and
    NVML executors print or run the same)."""
    return [
        binary,
        f"--model-repository={repository}",
        *([f"--backend-directory={backends}"] if backends is not None else []),
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        f"--http-address={address}",
        f"--grpc-address={address}",
        "--allow-metrics=true",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
        *extra,
    ]


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager, or call start()/stop()."""

    repository: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    binary: Path | None = None
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 30.0
    proc: subprocess.Popen | None = field(default=None, init=False)
    command_line: list[str] = field(default_factory=list, init=False)  # as last started
    _workdir: Path | None = field(default=None, init=False)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self, backends: Path) -> list[str]:
        return triton_argv(self.repository, self.http_port, self.grpc_port, self.metrics_port,
                           binary=str(self.binary), backends=backends, extra=self.extra_args)

    def start(self) -> TritonServer:
        root = None
        if self.binary is None:
            root = pytriton_root()
            self.binary = root / "bin" / "tritonserver"
        elif not Path(self.binary).exists():
            raise TritonError(f"{self.binary}: {INSTALL_HINT}")
        else:
            root = Path(self.binary).resolve().parent.parent
        if not Path(self.repository).is_dir():
            raise TritonError(f"model repository {self.repository} is not a directory")
        self._workdir = Path(tempfile.mkdtemp(prefix="headrace-triton-"))
        backends = prepare_backends(self._workdir / "backends", root)
        picked = iter(free_ports(3))
        for attr in ("http_port", "grpc_port", "metrics_port"):
            if not getattr(self, attr):
                setattr(self, attr, next(picked))
        if self.log_path is None:
            self.log_path = self._workdir / "tritonserver.log"
        log = open(self.log_path, "wb")  # noqa: SIM115  (owned by the child)
        try:
            self.command_line = self.command(backends)
            self.proc = subprocess.Popen(
                self.command_line,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=triton_env(self.env),
                start_new_session=True,  # own process group: stop() reaches the python stubs too
                cwd=self._workdir,
            )
        finally:
            log.close()
        try:
            self.wait_ready(self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def logs(self, tail: int = 60) -> str:
        """The log's last ``tail`` lines; when Triton refused its command line, the lines that
        say why instead (it ends its log with a usage text longer than any tail)."""
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        lines = Path(self.log_path).read_text(errors="replace").splitlines()
        usage = next((i for i, line in enumerate(lines) if line.startswith("Usage: tritonserver")), None)
        if usage is not None:  # the reason: the lines of the usage text's block that are not options
            why = [x for x in lines[usage + 1:] if x.strip() and not x[0].isspace() and not x.endswith(":")]
            return "\n".join([*lines[max(0, usage - 5):usage], *why, f"(argv: {self.command_line})"])
        return "\n".join(lines[-tail:])

    def is_ready(self) -> bool:
        return http_ready(self.http_url)

    def wait_ready(self, timeout: float) -> None:
        why = wait_http_ready(self.http_url, self.proc, timeout)
        if why is not None:
            raise TritonError(f"tritonserver {why}; log {self.log_path}:\n{self.logs()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the server's process group (fault injection in tests)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> None:
        """Stop its process group, then remove its working directory (its backends, and its
        log unless ``log_path`` was given elsewhere)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc, grace=grace)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            if self.log_path is not None and workdir in self.log_path.parents:
                self.log_path = None  # it goes with the directory
            shutil.rmtree(workdir, ignore_errors=True)

    def restart(self) -> TritonServer:
        """Start again on the same ports (a replica coming back after a crash)."""
        self.stop()
        return self.start()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

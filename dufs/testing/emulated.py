"""A Dask cluster of several emulated machines on this one, for tests and benchmarks of the remote paths.

Each "machine" is a Linux network namespace with its own address and a veth link to a bridge on the host, shaped
with ``tc`` (a token bucket a direction), and a mount namespace with a private ``/dev/shm`` and temporary directory,
in which one ``dask worker`` process group runs (``procs`` worker processes of one thread each). The scheduler runs
in a namespace of its own on the same bridge, and the driver (the calling process) on the host side of it, so every
byte between machines, the scheduler and the driver crosses a link and is counted by an interface: each machine's
(:meth:`EmulatedCluster.link_bytes`), the scheduler's (:meth:`~EmulatedCluster.scheduler_bytes`) and the
driver's (:meth:`~EmulatedCluster.driver_bytes`).

dufs treats these workers as remote: they do not see the driver's ``/dev/shm`` (so no vector or result goes
through it, and no direct call brings its result back that way), and everything they exchange goes over TCP.

It needs root, ``ip`` and ``tc``; :func:`unavailable` says why it cannot run here (tests skip with that reason).
Everything it makes (namespaces, links, the bridge, processes, temporary directories) carries one random name
and is removed when the ``with`` block ends, on failure too, and on SIGTERM; what a killed driver left is removed
by the next cluster started on the machine (:func:`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EmulatedCluster", "LinkBytes", "remove_leftovers", "unavailable"]

_PREFIX = "dufs-emulated-"  # the temporary directory of a cluster: <tmp>/dufs-emulated-<token>-..., with owner.pid


def unavailable() -> str | None:
    """Why an :class:`EmulatedCluster` cannot run on this machine, or None where it can."""
    if sys.platform != "linux":
        return "emulated machines need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated machines need root (network namespaces, veth links, tc)"
    for tool in ("ip", "tc", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"emulated machines need the '{tool}' command"
    name = f"dufsprobe{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network namespace here ({exc.stderr.strip() or exc})"
    _run("ip", "netns", "del", name, check=False)
    return None


def remove_leftovers() -> list[str]:
    """Remove what clusters of dead drivers left (a driver killed by SIGKILL runs no clean-up): their worker and
    scheduler processes, namespaces, links, bridge and temporary directory. Returns the tokens removed."""
    from dufs.data._fs import pid_alive

    gone = []
    for d in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        token = d.name[len(_PREFIX):].split("-")[0]
        try:
            owner = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            owner = None
        if owner is not None and pid_alive(owner):
            continue
        _remove_token(token)
        shutil.rmtree(d, ignore_errors=True)
        gone.append(token)
    return gone


def _remove_token(token: str) -> None:
    """Kill the processes in the namespaces of cluster ``token`` and remove its namespaces and links."""
    names = _run("ip", "netns", "list", check=False).stdout.split()
    for ns in [n for n in names if n.startswith(f"dufs{token}")]:
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run("ip", "netns", "del", ns, check=False)
    for line in _run("ip", "-o", "link", check=False).stdout.splitlines():
        name = line.split(": ")[1].split("@")[0] if ": " in line else ""
        if name.startswith(f"dufs{token}") or name == f"dufsbr{token}":
            _run("ip", "link", "del", name, check=False)


def _free_net(start: int) -> str:
    """A 10.x /16 (x in 200-249) that no interface here has an address in, the first from ``start`` on (every one
    in use: ``start``'s)."""
    used = set()
    for line in _run("ip", "-o", "-4", "addr", check=False).stdout.splitlines():
        for word in line.split():
            if word.startswith("10.") and word.count(".") == 3:
                used.add(".".join(word.split(".")[:2]))
    nets = [f"10.{200 + (start + i) % 50}" for i in range(50)]
    return next((n for n in nets if n not in used), nets[0])


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


@dataclass(frozen=True)
class LinkBytes:
    """Bytes a machine's link carried since the cluster started: ``into`` the machine, ``out_of`` it."""

    into: int
    out_of: int


class EmulatedCluster:
    """``machines`` emulated machines, each running ``procs`` Dask worker processes of ``threads`` threads, and a
    scheduler on the host.

    Parameters
    ----------
    machines : int
        How many network namespaces ("machines").
    procs : int
        Worker processes a machine.
    threads : int
        Threads a worker process (default 1).
    rate : str or None
        Each link's bandwidth a direction, as ``tc`` writes it ("1gbit", "400mbit"); None leaves links unshaped.
    memory_limit : str
        Each worker process's memory limit (``dask worker --memory-limit``).
    shm_bytes : str
        The size of each machine's private ``/dev/shm``.
    env : dict, optional
        Extra environment for the workers (``DASK_DUFS__...`` settings, say).

    Attributes
    ----------
    address : str
        The scheduler's address, for ``distributed.Client``.
    machine_addresses : list of str
        Each machine's IP address.

    Examples
    --------
    >>> with EmulatedCluster(machines=2, procs=1) as cluster:  # doctest: +SKIP
    ...     with distributed.Client(cluster.address) as client:
    ...         before = cluster.link_bytes()
    ...         sel = dufs.fit("x.zarr", method="variance", n_features=10, client=client)
    ...         moved = cluster.link_bytes_since(before)
    """

    def __init__(self, machines: int = 2, procs: int = 1, *, threads: int = 1, rate: str | None = None,
                 memory_limit: str = "2GiB", shm_bytes: str = "256m", env: dict | None = None) -> None:
        if machines < 1 or procs < 1 or threads < 1:
            raise ValueError("an emulated cluster needs at least one machine of one process of one thread")
        self.machines, self.procs, self.threads, self.rate = int(machines), int(procs), int(threads), rate
        self.memory_limit, self.shm_bytes, self.env = memory_limit, shm_bytes, dict(env or {})
        self.token = uuid.uuid4().hex[:6]
        # a /16 of the 10.0.0.0/8 range chosen at random among those no interface here uses (another cluster's, a
        # test process beside this one), the host at .0.1, machine i at .(i // 200 + 1).(i % 200 + 2)
        self._net = _free_net(int(self.token[:2], 16))
        self.host_address = f"{self._net}.0.1"
        self.scheduler_host = f"{self._net}.0.2"
        self.machine_addresses = [f"{self._net}.{i // 200 + 1}.{i % 200 + 2}" for i in range(self.machines)]
        self.address = ""
        self._bridge = f"dufsbr{self.token}"
        self._procs: list[subprocess.Popen] = []
        self._tmp: Path | None = None
        self._made: list[tuple[str, ...]] = []  # undo commands, run in reverse order

    # ------------------------------------------------------------------ names
    def _ns(self, i: int) -> str:
        return f"dufs{self.token}s" if i < 0 else f"dufs{self.token}m{i}"

    def _veth(self, i: int) -> tuple[str, str]:
        """(host end, machine end) of machine ``i``'s link (``i`` = -1: the scheduler's)."""
        tag = "s" if i < 0 else str(i)
        return f"dufs{self.token}h{tag}", f"dufs{self.token}g{tag}"

    # ------------------------------------------------------------------ life
    def __enter__(self) -> EmulatedCluster:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        remove_leftovers()
        self._on_term()
        try:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{self.token}-"))
            (self._tmp / "owner.pid").write_text(str(os.getpid()))
            self._make_network()
            self._start_scheduler()
            for i in range(self.machines):
                self._start_machine(i)
            self._wait_for_workers()
        except BaseException:
            self.close()
            raise
        self._start_bytes = self.link_bytes()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _on_term(self) -> None:
        """SIGTERM (a job killed, ``timeout``) raises SystemExit while the cluster is up, so that its clean-up runs
        (the default action ends the process at once); the previous handler is put back by :meth:`close`."""
        import threading

        self._term = None
        if threading.current_thread() is threading.main_thread():
            def _exit(signum: int, frame: Any) -> None:
                raise SystemExit(128 + signum)

            self._term = signal.signal(signal.SIGTERM, _exit)

    def _make_network(self) -> None:
        _run("ip", "link", "add", self._bridge, "type", "bridge")
        self._made.append(("ip", "link", "del", self._bridge))
        _run("ip", "addr", "add", f"{self.host_address}/16", "dev", self._bridge)
        _run("ip", "link", "set", self._bridge, "up")
        for i in range(-1, self.machines):  # the scheduler's namespace (-1), then the machines'
            ns, (host, guest) = self._ns(i), self._veth(i)
            address = self.scheduler_host if i < 0 else self.machine_addresses[i]
            _run("ip", "netns", "add", ns)
            self._made.append(("ip", "netns", "del", ns))
            _run("ip", "link", "add", host, "type", "veth", "peer", "name", guest)
            self._made.append(("ip", "link", "del", host))
            _run("ip", "link", "set", guest, "netns", ns)
            _run("ip", "link", "set", host, "master", self._bridge)
            _run("ip", "link", "set", host, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/16", "dev", guest)
            _run("ip", "-n", ns, "link", "set", guest, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.rate is not None:  # both directions: the host end shapes what goes in, the guest's what goes out
                shape = ("root", "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms")
                _run("tc", "qdisc", "add", "dev", host, *shape)
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", guest, *shape)

    def _environ(self) -> dict:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the dufs the driver runs, first on the workers' path
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        env.update(self.env)
        return env

    def _start_scheduler(self) -> None:
        port = 8786  # its namespace has no other listener
        self.address = f"tcp://{self.scheduler_host}:{port}"
        self._spawn(["ip", "netns", "exec", self._ns(-1), sys.executable, "-m", "distributed.cli.dask_scheduler",
                     "--host", self.scheduler_host, "--port", str(port), "--no-dashboard"],
                    self._tmp / "scheduler.log")

    def _start_machine(self, i: int) -> None:
        assert self._tmp is not None
        local = self._tmp / f"machine{i}"
        local.mkdir()
        worker = [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nworkers", str(self.procs),
                  "--nthreads", str(self.threads), "--host", self.machine_addresses[i], "--no-dashboard",
                  "--memory-limit", self.memory_limit, "--local-directory", str(local), "--name", f"machine{i}"]
        # a mount namespace of its own: a private /dev/shm and temporary directory, as on another machine
        script = (f"mount -t tmpfs -o size={self.shm_bytes} tmpfs /dev/shm && "
                  f"mount -t tmpfs tmpfs {local} && exec \"$@\"")
        cmd = ["ip", "netns", "exec", self._ns(i), "unshare", "--mount", "--propagation", "private", "sh", "-c",
               script, "machine", *worker]
        env = self._environ()
        env["TMPDIR"] = str(local)
        self._spawn(cmd, self._tmp / f"machine{i}.log", env)

    def _spawn(self, cmd: list[str], log: Path, env: dict | None = None) -> None:
        with open(log, "wb") as out:
            self._procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or self._environ(),
                                                start_new_session=True))

    def _wait_for_workers(self, timeout: float = 120.0) -> None:
        from distributed import Client

        deadline = time.monotonic() + timeout
        want = self.machines * self.procs
        client = None
        try:
            while True:
                for p in self._procs:
                    if p.poll() is not None:
                        raise RuntimeError(f"an emulated machine's process ended (exit {p.returncode}): "
                                           f"{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the emulated cluster did not get its {want} workers in {timeout:.0f} s: "
                                       f"{self.log_tail()}")
                try:
                    client = client or Client(self.address, timeout=5)
                    if len(client.scheduler_info(n_workers=-1)["workers"]) >= want:
                        return
                except (OSError, TimeoutError):
                    pass  # the scheduler not listening yet
                time.sleep(0.25)
        finally:
            if client is not None:
                client.close()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the scheduler's and the machines' logs."""
        if self._tmp is None:
            return ""
        out = []
        for log in sorted(self._tmp.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def close(self) -> None:
        """Stop every process and remove the namespaces, links, bridge and temporary directories."""
        for p in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._procs.clear()
        for cmd in reversed(self._made):
            _run(*cmd, check=False)
        self._made.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if getattr(self, "_term", None) is not None:
            signal.signal(signal.SIGTERM, self._term)
            self._term = None

    # ------------------------------------------------------------------ what crossed the links
    def link_bytes(self) -> list[LinkBytes]:
        """Each machine's bytes in and out so far (the host end's interface counters: what it sends goes into the
        machine)."""
        out = []
        for i in range(self.machines):
            base = Path("/sys/class/net") / self._veth(i)[0] / "statistics"
            out.append(LinkBytes(int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())))
        return out

    def scheduler_bytes(self) -> LinkBytes:
        """The scheduler's bytes in and out so far."""
        base = Path("/sys/class/net") / self._veth(-1)[0] / "statistics"
        return LinkBytes(int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text()))

    def driver_bytes(self) -> LinkBytes:
        """The driver's (this host's) bytes in and out so far over the cluster's bridge."""
        base = Path("/sys/class/net") / self._bridge / "statistics"
        return LinkBytes(int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text()))

    @staticmethod
    def since(before: list[LinkBytes], after: list[LinkBytes]) -> list[LinkBytes]:
        """The bytes each link carried between two :meth:`link_bytes` readings."""
        return [LinkBytes(a.into - b.into, a.out_of - b.out_of) for b, a in zip(before, after, strict=True)]

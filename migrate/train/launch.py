"""`migrate train --dp N` and multi-node runs: MindSpore's msrun starts one worker per rank.

    cluster = Cluster(nodes=2, node_rank=0, master_addr="10.0.0.1", master_port=8118)
    result = launch(config, out, layout, cluster)      # result.code: the worst worker's exit code

msrun (`mindspore.parallel.cluster.run`) is run with --join=True on every
node: worker_num = dp × mp × pp ranks in all, local_worker_num = that / nodes
on this node, node_rank, master_addr, master_port (on one node: 127.0.0.1 and
a free port picked here). It starts its scheduler (on the master node) and
`python -m migrate.train.worker ...` once per local rank, each with its log
in RUN/logs/worker_<rank>.log (--log_dir); its own output goes to
RUN/logs/msrun.log. The first local worker's progress lines are echoed here.

Exit code: msrun reports only that a worker failed (and kills the others), so
every worker records its own code in RUN/logs/worker_<rank>.exit; the result
is the worst of those and of the codes msrun logged (a signal -N counts as
128 + N). When a worker failed but msrun keeps waiting on its scheduler
(which waits MS_NODE_TIMEOUT, 30 s by default, for the dead rank), msrun is
stopped after that timeout plus a margin.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from migrate.train.worker import exit_file

LOCALHOST = "127.0.0.1"
WORKER_MODULE = "migrate.train.worker"
MSRUN_LOG = "msrun.log"
PROGRESS_PREFIX = "migrate["
_MSRUN_CODE = re.compile(r"Worker process \d+ exit with exception\. Error code: (-?\d+)")


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run: `nodes` machines, this one being `node_rank`."""

    nodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None   # None: 127.0.0.1 (one node only)
    master_port: int | None = None   # None: a free port on this machine (one node only)


def cluster_errors(cluster: Cluster, devices: int) -> list[str]:
    """Every rule the node options break, one line each."""
    errors = []
    if isinstance(cluster.nodes, bool) or not isinstance(cluster.nodes, int) or cluster.nodes < 1:
        return [f"--nodes must be a positive integer, got {cluster.nodes!r}"]
    if devices % cluster.nodes:
        errors.append(f"dp × mp × pp = {devices} ranks cannot be spread evenly over --nodes {cluster.nodes}")
    if not 0 <= cluster.node_rank < cluster.nodes:
        errors.append(f"--node-rank {cluster.node_rank} is outside 0..{cluster.nodes - 1} for --nodes {cluster.nodes}")
    if cluster.nodes > 1 and not cluster.master_addr:
        errors.append(f"--nodes {cluster.nodes} needs --master-addr (the address of node 0, reachable from every node)")
    if cluster.nodes > 1 and cluster.master_port is None:
        errors.append(f"--nodes {cluster.nodes} needs --master-port (the same free port on every node)")
    if cluster.master_port is not None and not 1024 <= cluster.master_port <= 65535:
        errors.append(f"--master-port must be in 1024..65535, got {cluster.master_port}")
    return errors


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def msrun_executable() -> list[str]:
    """msrun next to this Python (a venv's bin), else its module."""
    beside = Path(sys.executable).with_name("msrun")
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "mindspore.parallel.cluster.run"]


def msrun_command(devices: int, cluster: Cluster, port: int, log_dir: Path, worker_args: list[str]) -> list[str]:
    """The msrun command line for this node."""
    return [*msrun_executable(),
            f"--worker_num={devices}", f"--local_worker_num={devices // cluster.nodes}",
            f"--node_rank={cluster.node_rank}", f"--master_addr={cluster.master_addr or LOCALHOST}",
            f"--master_port={port}", f"--log_dir={log_dir}", "--join=True",
            "python", "-m", WORKER_MODULE, *worker_args]


def worker_args(config: Path, out: Path, log_dir: Path, layout, resume: Path | None = None,
                mode: str = "graph", threads: int = 0) -> list[str]:
    args = ["--config", str(Path(config).resolve()), "--out", str(Path(out).resolve()),
            "--log-dir", str(Path(log_dir).resolve()), "--mode", mode, "--threads", str(threads),
            "--dp", str(layout.dp), "--mp", str(layout.mp), "--pp", str(layout.pp),
            "--micro-batches", str(layout.micro_batches)]
    if layout.optimizer_shard:
        args.append("--optimizer-shard")
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    return args


def local_ranks(devices: int, cluster: Cluster) -> list[int]:
    """The global ranks msrun starts on this node (node_rank × local count onward)."""
    local = devices // cluster.nodes
    return [cluster.node_rank * local + i for i in range(local)]


def cpu_threads_per_rank(local: int) -> int:
    """CPU kernel threads per rank so that this node's ranks do not oversubscribe its cores."""
    return max(1, (os.cpu_count() or 1) // max(local, 1))


def as_exit_status(code: int) -> int:
    """A Popen return code as a shell exit status: killed by signal N -> 128 + N."""
    return 128 - code if code < 0 else code


def worst_exit_code(codes) -> int:
    codes = [as_exit_status(c) for c in codes]
    return max(codes, default=0)


@dataclass
class LaunchResult:
    code: int                               # the worst exit code (0: every worker succeeded)
    worker_codes: dict[int, int]            # rank -> the code it recorded (local ranks only)
    msrun_code: int
    log_dir: Path
    command: list[str] = field(default_factory=list)

    def failed_ranks(self) -> list[int]:
        return sorted(r for r, c in self.worker_codes.items() if c != 0)

    def summary(self) -> str:
        """One line naming the failed ranks, their codes and the first error line of each log."""
        parts = []
        for rank in self.failed_ranks():
            log = self.log_dir / f"worker_{rank}.log"
            parts.append(f"rank {rank} exited with {self.worker_codes[rank]}{_first_error(log)}")
        if not parts:
            parts.append(f"msrun exited with {self.msrun_code}")
        return "; ".join(parts) + f" (logs in {self.log_dir})"


def launch(config: Path, out: Path, layout, cluster: Cluster = Cluster(), resume: Path | None = None,
           mode: str = "graph", echo=print, env: dict | None = None) -> LaunchResult:
    """Run msrun for this node, wait for it, return the worst worker's exit code."""
    out = Path(out).resolve()
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    devices = layout.devices
    ranks = local_ranks(devices, cluster)
    for rank in ranks:
        exit_file(log_dir, rank).unlink(missing_ok=True)  # a previous run's codes
    port = cluster.master_port or free_port()
    threads = cpu_threads_per_rank(len(ranks))
    command = msrun_command(devices, cluster, port, log_dir,
                            worker_args(config, out, log_dir, layout, resume, mode, threads))
    echo(f"msrun: {devices} ranks ({len(ranks)} on this node), master {cluster.master_addr or LOCALHOST}:{port}, "
         f"logs in {log_dir}")
    with open(log_dir / MSRUN_LOG, "w") as msrun_log:
        proc = subprocess.Popen(command, stdout=msrun_log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=_worker_env(log_dir, env))
        try:
            msrun_code = _wait(proc, log_dir, ranks, echo)
        except BaseException:
            _stop(proc)
            raise
    codes = {rank: _read_code(exit_file(log_dir, rank)) for rank in ranks}
    recorded = {r: c for r, c in codes.items() if c is not None}
    logged = [int(c) for c in _MSRUN_CODE.findall((log_dir / MSRUN_LOG).read_text(errors="replace"))]
    code = worst_exit_code([*recorded.values(), *logged])
    if code == 0 and msrun_code != 0:
        code = as_exit_status(msrun_code)
    return LaunchResult(code, recorded, msrun_code, log_dir, command)


def _worker_env(log_dir: Path, extra: dict | None) -> dict:
    """msrun runs the literal command `python`: put this interpreter first on PATH under that name."""
    import migrate

    shim = log_dir / ".bin"
    shim.mkdir(exist_ok=True)
    script = shim / "python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    env = dict(os.environ)
    env.update(extra or {})
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    package_root = str(Path(migrate.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings would bury the workers' own lines
    return env


def _wait(proc: subprocess.Popen, log_dir: Path, ranks: list[int], echo) -> int:
    follow = _Follower(log_dir / f"worker_{ranks[0]}.log")
    grace = float(os.environ.get("MS_NODE_TIMEOUT", "30")) + 15.0
    failed_at = None
    while proc.poll() is None:
        time.sleep(0.5)
        for line in follow.new_lines():
            if line.startswith(PROGRESS_PREFIX):
                echo(line)
        if failed_at is None and any(_read_code(exit_file(log_dir, r)) not in (None, 0) for r in ranks):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            _stop(proc)  # msrun still waits on its scheduler for a rank that is gone
    for line in follow.new_lines():
        if line.startswith(PROGRESS_PREFIX):
            echo(line)
    return proc.returncode


def _stop(proc: subprocess.Popen) -> None:
    """Ask msrun to stop its job (SIGINT: it kills its workers), then end its process group."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class _Follower:
    """New complete lines of a growing log file."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace").rstrip() for line in lines]


def _read_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _first_error(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    for line in text.splitlines():
        if line.startswith("migrate: error:"):
            return f": {line[len('migrate: error:'):].strip()}"
    tail = [line for line in text.splitlines() if line.strip() and not line.startswith("[")][-1:]
    return f": {tail[0].strip()[:200]}" if tail else ""

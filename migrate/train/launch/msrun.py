"""`migrate train --dp N` and multi-node runs: MindSpore's msrun starts one worker per rank.

    cluster = Cluster(nodes=2, node_rank=0, master_addr="10.0.0.1", master_port=8118)
    result = launch(config, out, layout, cluster)      # result.code: the worst worker's exit code

msrun (`mindspore.parallel.cluster.run`) is run with --join=True on every
node: worker_num = dp × mp × pp ranks in all, local_worker_num = that / nodes
on this node, node_rank, master_addr, master_port (on one node: 127.0.0.1 and
a free port picked here). It starts its scheduler (on the master node) and
`python -m migrate.train.launch.worker ...` once per local rank, each with its log
in RUN/logs/worker_<rank>.log (--log_dir); its own output goes to
RUN/logs/msrun.log. The first local worker's progress lines are echoed here.
The workers' environment is built here (`worker_env`): this process's, the caller's
additions, and the trust opt-in as MIGRATE_TRUST_MODEL_CLASS=1 exactly when `launch`
was given trust=True (the worker's entry point reads it and passes `trust=` down).

Exit code: msrun reports only that a worker failed (and kills the others), so
every worker records its own code in RUN/logs/worker_<rank>.exit. A worker
killed outright (SIGKILL, the OOM killer) cannot: msrun logs the pid and the
signal of the first worker it saw die, each worker left its pid in
RUN/logs/worker_<rank>.pid, so the launcher names that rank and writes its exit
file (128 + N for signal N); the ranks msrun then stopped get theirs too. The
result is the code of the rank that failed first (msrun's log says which), else
the worst a worker recorded. Once msrun has logged a failed worker (and killed
the others) it only waits on its scheduler, which waits MS_NODE_TIMEOUT (30 s
by default) for the dead rank: msrun is stopped SETTLE_S after that line. A
worker that failed while msrun says nothing is given that timeout plus a margin.
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

from migrate.models.registry import TRUST_ENV
from migrate.train.launch.cluster import Cluster
from migrate.train.launch.worker_files import exit_file, pid_file, record_exit

LOCALHOST = "127.0.0.1"
WORKER_MODULE = "migrate.train.launch.worker"
MSRUN_LOG = "msrun.log"
PROGRESS_PREFIX = "migrate["
_MSRUN_CODE = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


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
                mode: str = "graph", threads: int = 0, profile: bool = False, faults=()) -> list[str]:
    args = ["--config", str(Path(config).resolve()), "--out", str(Path(out).resolve()),
            "--log-dir", str(Path(log_dir).resolve()), "--mode", mode, "--threads", str(threads),
            "--dp", str(layout.dp), "--mp", str(layout.mp), "--pp", str(layout.pp),
            "--micro-batches", str(layout.micro_batches)]
    if layout.optimizer_shard:
        args.append("--optimizer-shard")
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    if profile:
        args.append("--profile")
    for fault in faults:
        args += ["--fault", fault]
    return args


# What one rank's MindSpore process holds before the model: `import mindspore` on CPU peaks at 399 MiB RSS
# (MindSpore 2.10, measured); a lower bound of what each local rank costs, for refusing a --dp that cannot fit.
PROCESS_FLOOR = 384 << 20


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
    code: int                               # the exit code of the run (0: every worker succeeded)
    worker_codes: dict[int, int]            # rank -> its exit code (local ranks only)
    msrun_code: int
    log_dir: Path
    command: list[str] = field(default_factory=list)
    causes: dict[int, str] = field(default_factory=dict)   # rank -> how it ended, where not by itself
    first_failed: int | None = None         # the rank msrun saw fail first
    unmatched: list[tuple[int, int]] = field(default_factory=list)  # (pid, code) msrun logged, no rank known

    def failed_ranks(self) -> list[int]:
        """Ranks that failed by themselves, the first one msrun saw first (not those msrun then stopped)."""
        failed = sorted(r for r, c in self.worker_codes.items() if c != 0 and self.causes.get(r) != STOPPED)
        return sorted(failed, key=lambda r: r != self.first_failed)

    def summary(self) -> str:
        """One line: each failed rank, its exit code or signal, and its error line or else its last log line."""
        parts = []
        for rank in self.failed_ranks():
            log = self.log_dir / f"worker_{rank}.log"
            how = self.causes.get(rank) or f"exited with {self.worker_codes[rank]}"
            parts.append(f"rank {rank} {how}{_last_words(log)}")
        for pid, raw in self.unmatched:  # died before it could say its rank
            parts.append(f"a worker (pid {pid}) {_signal_cause(raw) or f'exited with {raw}'}")
        stopped = sorted(r for r, c in self.causes.items() if c == STOPPED)
        if stopped and parts:
            parts.append(f"msrun then stopped rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}")
        if not parts:
            parts.append(f"msrun exited with {self.msrun_code}")
        return "; ".join(parts) + f" (logs in {self.log_dir})"


STOPPED = "stopped by msrun"


def launch(config: Path, out: Path, layout, cluster: Cluster = Cluster(), resume: Path | None = None,
           mode: str = "graph", echo=print, env: dict | None = None, profile: bool = False,
           trust: bool = False, faults=()) -> LaunchResult:
    """Run msrun for this node and wait for it; the result names each rank's exit code and the run's.
    trust: the workers may import a model class migrate does not bundle (`worker_env`)."""
    out = Path(out).resolve()
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    devices = layout.devices
    ranks = local_ranks(devices, cluster)
    for rank in ranks:  # a previous run's codes and pids
        exit_file(log_dir, rank).unlink(missing_ok=True)
        pid_file(log_dir, rank).unlink(missing_ok=True)
    port = cluster.master_port or free_port()
    threads = cpu_threads_per_rank(len(ranks))
    command = msrun_command(devices, cluster, port, log_dir,
                            worker_args(config, out, log_dir, layout, resume, mode, threads, profile, faults))
    echo(f"msrun: {devices} ranks ({len(ranks)} on this node), master {cluster.master_addr or LOCALHOST}:{port}, "
         f"logs in {log_dir}")
    with open(log_dir / MSRUN_LOG, "w") as msrun_log:
        extra = {**(one_node_intervals() if cluster.nodes == 1 else {}), **(env or {})}
        proc = subprocess.Popen(command, stdout=msrun_log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=worker_env(log_dir, extra, trust))
        try:
            msrun_code = _wait(proc, log_dir, ranks, echo)
        except BaseException:
            _stop(proc)
            raise
    return _outcome(log_dir, ranks, msrun_code, command)


def _outcome(log_dir: Path, ranks: list[int], msrun_code: int, command: list[str]) -> LaunchResult:
    """Every local rank's exit code -- the workers' own, else what msrun logged -- and the run's."""
    recorded = {r: c for r in ranks if (c := _read_code(exit_file(log_dir, r))) is not None}
    pids = {pid: r for r in ranks if (pid := _read_code(pid_file(log_dir, r))) is not None}
    logged = _msrun_failures(log_dir)
    causes, first_failed, unmatched = {}, None, []
    for pid, raw in logged:
        rank = pids.get(pid)
        if rank is None:
            unmatched.append((pid, raw))
            continue
        first_failed = rank if first_failed is None else first_failed
        if rank not in recorded:  # died without a word (a signal): its exit file is written here
            recorded[rank] = as_exit_status(raw)
            causes[rank] = _signal_cause(raw) or f"exited with {raw}"
            record_exit(log_dir, rank, recorded[rank])
    if (msrun_code != 0 or logged) and not unmatched:
        for rank in ranks:
            if rank not in recorded:  # msrun SIGKILLs the others once one has failed
                recorded[rank], causes[rank] = as_exit_status(-signal.SIGKILL), STOPPED
                record_exit(log_dir, rank, recorded[rank])
    if first_failed is not None:
        code = recorded[first_failed]
    else:
        code = worst_exit_code([c for r, c in recorded.items() if causes.get(r) != STOPPED]
                               + [raw for _, raw in unmatched])
    if code == 0 and msrun_code != 0:
        code = as_exit_status(msrun_code)
    return LaunchResult(code, recorded, msrun_code, log_dir, command, causes, first_failed, unmatched)


def _msrun_failures(log_dir: Path) -> list[tuple[int, int]]:
    """(pid, Popen return code) of each worker msrun logged as failed, in its order."""
    try:
        text = (log_dir / MSRUN_LOG).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [(int(pid), int(code)) for pid, code in _MSRUN_CODE.findall(text)]


def _signal_cause(raw: int) -> str | None:
    """'was killed by SIGKILL (exit 137)' for a Popen return code -9."""
    if raw >= 0:
        return None
    try:
        name = signal.Signals(-raw).name
    except ValueError:
        name = f"signal {-raw}"
    return f"was killed by {name} (exit {as_exit_status(raw)})"


# MindSpore's cluster nodes send their messages (heartbeats, the finish handshake as a rank ends) at a
# random interval between MS_RETRY_INTERVAL_LOWER and _UPPER seconds, 3 and 5 by default, sized for the
# scheduler of a large cluster. With every rank on this machine, 1 s ends a --dp 2 run 3-6 s sooner
# (measured: a 50-step tiny run's last worker exit to msrun's return, 5-11 s -> 3-4 s).
RETRY_INTERVAL_ENV = ("MS_RETRY_INTERVAL_LOWER", "MS_RETRY_INTERVAL_UPPER")


def one_node_intervals() -> dict:
    """The message interval of a job on one machine (1 s), unless the environment sets one."""
    if any(name in os.environ for name in RETRY_INTERVAL_ENV):
        return {}
    return dict.fromkeys(RETRY_INTERVAL_ENV, "1")


def worker_env(log_dir: Path, extra: dict | None = None, trust: bool = False) -> dict:
    """The environment msrun and its workers start with: this process's and `extra`, with the trust
    opt-in set (MIGRATE_TRUST_MODEL_CLASS=1) when `trust` and removed otherwise, so a worker trusts
    exactly what the launcher was told. msrun runs the literal command `python`: this interpreter
    comes first on PATH under that name."""
    import migrate

    shim = log_dir / ".bin"
    shim.mkdir(exist_ok=True)
    script = shim / "python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    env = dict(os.environ)
    env.update(extra or {})
    if trust:
        env[TRUST_ENV] = "1"
    else:
        env.pop(TRUST_ENV, None)
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    package_root = str(Path(migrate.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings would bury the workers' own lines
    return env


# Once msrun has logged a failed worker it kills the others at once, then only waits for its scheduler,
# which waits MS_NODE_TIMEOUT (30 s by default) for the dead rank: a run that has failed is stopped this
# many seconds after msrun said so instead (the kills are SIGKILLs, done by then).
SETTLE_S = 2.0


def _wait(proc: subprocess.Popen, log_dir: Path, ranks: list[int], echo) -> int:
    follow = _Follower(log_dir / f"worker_{ranks[0]}.log")
    grace = float(os.environ.get("MS_NODE_TIMEOUT", "30")) + 15.0
    failed_at = logged_at = None
    while proc.poll() is None:
        time.sleep(0.5)
        for line in follow.new_lines():
            if line.startswith(PROGRESS_PREFIX):
                echo(line)
        logged = _msrun_failures(log_dir)  # a worker killed outright leaves no exit file, only this
        now = time.monotonic()
        if failed_at is None and (logged or any(_read_code(exit_file(log_dir, r)) not in (None, 0) for r in ranks)):
            failed_at = now
        if logged and logged_at is None:
            logged_at = now
        settled = logged_at is not None and now - logged_at > SETTLE_S
        if settled or (failed_at is not None and now - failed_at > grace):
            _stop(proc)  # msrun only waits on its scheduler for a rank that is gone
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


def _last_words(log: Path) -> str:
    """': <its error line>' if the worker printed one, else '; last log line: <line>'."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    for line in text.splitlines():
        if line.startswith("migrate: error:"):
            return f": {line[len('migrate: error:'):].strip()}"
    # MindSpore's own log lines start with "[LEVEL]"; the worker's lines and Python's do not.
    tail = [line for line in text.splitlines() if line.strip() and not line.startswith("[")][-1:]
    return f"; last log line: {tail[0].strip()[:200]}" if tail else ""

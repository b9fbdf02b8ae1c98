"""msrun's worker with test faults: `migrate.train.launch.worker` plus two failures on request.

The production worker reads no test hooks. A test swaps this module in for it
(`use_fault_worker(monkeypatch)`: the launcher's WORKER_MODULE, tests/ on the workers'
PYTHONPATH) and asks for a failure through the environment msrun hands every worker:

    EXIT_ENV "RANK:CODE"   that rank exits with CODE right after joining the cluster
    KILL_ENV "RANK:STEP"   that rank SIGKILLs itself right after logging optimizer step STEP
                           (dies as the OOM killer would, mid-run)

Both wrap the worker's own calls (`start_parallel`, the trainer's `train`), so everything
around them -- the pid and exit files, the launcher's account -- is the production path.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

EXIT_ENV = "MIGRATE_TEST_WORKER_EXIT"
KILL_ENV = "MIGRATE_TEST_WORKER_KILL"
MODULE = "fault_worker"


def use_fault_worker(monkeypatch) -> None:
    """Make `migrate train --dp N` launch this module on every rank."""
    import migrate.train.launch.msrun as launch

    monkeypatch.setattr(launch, "WORKER_MODULE", MODULE)
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


def _spec(name: str):
    spec = os.environ.get(name)
    return tuple(int(x) for x in spec.split(":")) if spec else None


def _install() -> None:
    """Wrap the worker's `_run`: MindSpore still loads only where the worker loads it."""
    import migrate.train.launch.worker as worker

    run = worker._run

    def faulty_run(args, **kwargs):
        _wrap_start_parallel()
        return run(args, **kwargs)

    worker._run = faulty_run


def _wrap_start_parallel() -> None:
    import migrate.parallel.runtime as runtime

    start_parallel = runtime.start_parallel

    def start(*args, **kwargs):
        parallel = start_parallel(*args, **kwargs)  # the scheduler process stays in here until the job ends
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            return parallel
        exit_at = _spec(EXIT_ENV)
        if exit_at is not None and exit_at[0] == parallel.rank:
            print(f"migrate[rank {parallel.rank}]: {EXIT_ENV} asks for exit code {exit_at[1]}", flush=True)
            raise SystemExit(exit_at[1])
        kill_at = _spec(KILL_ENV)
        if kill_at is not None and kill_at[0] == parallel.rank:
            _kill_after(kill_at[1])
        return parallel

    runtime.start_parallel = start


def _kill_after(step: int) -> None:
    import migrate.train.trainer as trainer

    train = trainer.train

    def killing_train(*args, log=None, **kwargs):
        def logged(line: str) -> None:
            log(line)
            if line.startswith(f"step {step}/"):
                os.kill(os.getpid(), signal.SIGKILL)

        return train(*args, log=logged, **kwargs)

    trainer.train = killing_train


if __name__ == "__main__":
    _install()
    from migrate.train.launch.worker import exit_process, main

    exit_process(main())

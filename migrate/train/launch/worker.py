"""The process msrun starts on every rank: `python -m migrate.train.launch.worker ARGS`.

`migrate train --dp N ...` (`migrate.train.launch.msrun`) builds this command line;
msrun runs it once per rank (MS_ROLE=MS_WORKER, RANK_ID set) and once more as
its scheduler (MS_ROLE=MS_SCHED), where `communication.init()` runs the
cluster's meta server and never returns -- so joining the cluster is the first
thing done, before any file is touched.

Each worker writes its exit code to LOG_DIR/worker_<rank>.exit (atomically)
as it ends, so the launcher can report it: msrun itself only says
that some worker failed. A worker killed outright (SIGKILL, the OOM killer)
writes nothing; so each also writes LOG_DIR/worker_<rank>.pid as it starts,
and the launcher matches the pid msrun logs for a dead worker to its rank.

The trust opt-in (`--trust-model-class`) arrives in the environment the launcher built
(MIGRATE_TRUST_MODEL_CLASS=1, `msrun.worker_env`): `main` reads it once and passes it
to the trainer as ``trust=``.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from migrate.errors import MigrateError
from migrate.models.registry import trust_from_env
from migrate.parallel.layout import Layout
from migrate.train.config import RunConfig
from migrate.train.launch.worker_files import record_exit, record_pid


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m migrate.train.launch.worker")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--resume")
    p.add_argument("--mode", default="graph")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--mp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--optimizer-shard", action="store_true")
    p.add_argument("--profile", action="store_true", help="time each step's phases (migrate.train.step.profile)")
    p.add_argument("--fault", action="append", default=[], help="an injected porting fault, NAME@STEP (every rank)")
    p.add_argument("--threads", type=int, default=0, help="CPU kernel threads of this rank (0: MindSpore's default)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    trust = trust_from_env(os.environ)  # the launcher's opt-in (`msrun.worker_env`), read here only
    rank = int(os.environ.get("RANK_ID", "-1"))
    if os.environ.get("MS_ROLE") != "MS_SCHED" and rank >= 0:  # msrun exports RANK_ID (we pass --node_rank)
        record_pid(args.log_dir, rank, os.getpid())
    code = 1
    try:
        code = _run(args, trust=trust)
    except SystemExit as exc:  # argparse, sys.exit below the trainer
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - every failure must leave its exit code behind
        if isinstance(exc, MigrateError):
            print(f"migrate: error: {exc}", file=sys.stderr, flush=True)
            code = exc.exit_code
        else:
            traceback.print_exc()
            code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        if os.environ.get("MS_ROLE") != "MS_SCHED":
            rank = _current_rank(rank)
            if rank >= 0:
                record_exit(args.log_dir, rank, code)
    return code


def _current_rank(fallback: int) -> int:
    try:
        from mindspore.communication import get_rank

        return get_rank()
    except Exception:  # noqa: BLE001 - not initialised: msrun's RANK_ID is all there is
        return fallback


def _run(args, *, trust: bool = False) -> int:
    # MindSpore (and the trainer) load only now: a worker that fails before this point
    # still leaves its pid and exit files, without a MindSpore import in the way.
    from migrate.parallel.runtime import start_parallel

    cfg = RunConfig.load(args.config)
    layout = Layout(dp=args.dp, mp=args.mp, pp=args.pp, micro_batches=args.micro_batches,
                    optimizer_shard=args.optimizer_shard, micro_batch_size=cfg.micro_batch_size,
                    grad_accum_steps=cfg.grad_accum_steps)
    parallel = start_parallel(layout)  # the scheduler process stays in here until the job ends
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return 0
    import mindspore as ms

    if args.threads > 0 and ms.get_context("device_target") == "CPU":  # ranks on one machine share its cores
        ms.set_context(runtime_num_threads=args.threads)
    from migrate.train.trainer import train

    prefix = f"migrate[rank {parallel.rank}]"
    print(f"{prefix}: joined {parallel.size} ranks; {layout.batch_line(cfg.seq_length)}", flush=True)

    def log(line: str) -> None:
        # Every line prefixed: the launcher relays only prefixed lines (a multi-line table, --profile's, too).
        print("\n".join(f"{prefix}: {part}" for part in line.splitlines() or [""]), flush=True)

    train(cfg, args.out, resume=args.resume, progress=False, mode=args.mode, parallel=parallel, log=log,
          profile=args.profile, trust=trust, faults=args.fault)
    print(f"{prefix}: done", flush=True)
    return 0


def exit_process(code: int) -> None:
    """End this rank's process with `code`. A failed rank ends at once (its exit file written, its
    output flushed): Python's own exit runs MindSpore's teardown, which kept a rank that failed
    right after joining the cluster alive ~6 s more, and msrun stops the job only when it is gone."""
    if code == 0:
        sys.exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_process(main())

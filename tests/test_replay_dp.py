"""`migrate replay` of a `migrate train --dp 2` run (issue 27): the global batch replayed on one process.

One golden run (micro batch 4) and one MindSpore run under msrun with --dp 2 (micro batch 2 per rank,
the same global batch of 4 x 2 micro-batches), 2 x 2 steps with a checkpoint after each, the fault
`head_grad_scale@3` (the head's gradient x 1.01 at the micro-step's seam, on every rank) from step 3.
`compare` fails; `replay` runs each rank's micro-batches rank by rank through the trainer's micro-step,
reduces them with DistributedGradReducer's mean, then the trainer's clip and AdamW, and names the
head's gradient; step 2, before the fault, replays clean. The msrun run costs ~30 s here.
"""
import pytest

from migrate.cli import main
from migrate.train.config import RunConfig
from test_replay import RUN, golden, last_line, replay, this_golden  # noqa: F401  (the module fixture)
from train_setup import make_run_dir

pytestmark = [pytest.mark.usefixtures("one_torch_thread", "this_golden"), pytest.mark.slow]

STEPS = RUN.replace("total_steps: 6", "total_steps: 4")
FAULT = "head_grad_scale@3"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_run_dir(tmp_path_factory.mktemp("replay_dp"), variant="bias", run_yaml=STEPS)
    golden.train(RunConfig.load(root / "run.yaml"), root / "golden", log=lambda line: None)
    (root / "run_dp2.yaml").write_text(STEPS.replace("micro_batch_size: 4", "micro_batch_size: 2"))
    run = root / "ms_dp2"
    assert main(["train", "--config", str(root / "run_dp2.yaml"), "--dp", "2", "--out", str(run),
                 "--fault", FAULT]) == 0
    return root


def test_compare_fails_and_replay_of_the_global_batch_names_the_head_gradient(root, capsys):
    run = root / "ms_dp2"
    capsys.readouterr()
    assert main(["compare", str(root / "golden"), str(run)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(f"migrate replay {root / 'golden'} {run}")
    code, out = replay(root, run, "--mode", "pynative", capsys=capsys)
    text = " ".join(out.split())
    print(f"\n[dp 2, {FAULT}] {text[text.rfind('step 3:'):]}")
    assert code == 1
    assert "the MindSpore run trained with --dp 2: replayed the global batch on one process" in text
    assert "step 3: forward, loss and accumulation agree; gradient of lm_head.weight after micro-batch 1 " \
           "parts first" in text
    for side in ("golden", "MindSpore"):  # the ranks' mean loss, as the dp run logged it
        assert f"{side} replay reproduces its logged step-3 loss" in text


def test_a_dp_step_before_the_fault_replays_clean(root, capsys):
    code, out = replay(root, root / "ms_dp2", "--step", "2", "--mode", "pynative", capsys=capsys)
    text = " ".join(out.split())
    assert code == 0, text[-600:]
    assert last_line(out).startswith("step 2: every quantity agrees") or \
        text.endswith("step 2: every quantity agrees (forward, loss, accumulation, gradients, grad norm, clip, lr, "
                      "moments, parameters)")
    assert "accumulation of rank 1's micro-batch" not in text  # the per-tensor rows are the report's

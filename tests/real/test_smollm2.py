"""SmolLM2-135M-Instruct, a real Llama (30 layers, hidden 576, GQA 9/3, tied embeddings, vocab
49152): the commands of README.md and docs/ on it, and each injected fault located where it was put.
The commands and what a correct tool gives are bench/real_tier/steps.py's."""
import pytest

from real_tier.steps import STEPS, names


@pytest.mark.parametrize("step", names("smollm2"))
def test_command_gives_what_a_correct_tool_gives(tier, step):
    outcome = tier.run(step)
    assert outcome.ok, outcome.explain()


@pytest.mark.parametrize("step", names("smollm2-faults"))
def test_injected_fault_fails_at_its_place(tier, step):
    assert STEPS[step].exit == 1 and STEPS[step].at is not None
    outcome = tier.run(step)
    assert outcome.ok, outcome.explain()

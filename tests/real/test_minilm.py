"""all-MiniLM-L6-v2, a real BertModel: convert, diff (fp32, bf16), export back bit for bit, dumps,
the fault catalogue refused (it is Llama-only), and a fault put into a copy of the checkpoint
located at its layer. The commands and what a correct tool gives are bench/real_tier/steps.py's."""
import pytest

from real_tier.steps import names


@pytest.mark.parametrize("step", names("minilm"))
def test_command_gives_what_a_correct_tool_gives(tier, step):
    outcome = tier.run(step)
    assert outcome.ok, outcome.explain()

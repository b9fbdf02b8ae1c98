"""The two-box tier's figures: each command's box, exit code and wall time, printed at the end."""
import pytest

FLOW = pytest.StashKey[object]()


@pytest.fixture(scope="module")
def record_flow(request):
    def keep(flow):
        request.config.stash[FLOW] = flow
    return keep


def pytest_terminal_summary(terminalreporter, config):
    flow = config.stash.get(FLOW, None)
    if flow is None:
        return
    terminalreporter.write_sep("=", "two boxes (docs/two-boxes.md)")
    for s in flow.steps:
        terminalreporter.write_line(f"{s.seconds:7.1f}s  {s.box:9}  exit {s.code}  {s.command}")
        if s.command.startswith(("migrate diff", "migrate compare")):  # its verdict, and a FAIL's first divergence
            for line in s.out.splitlines():
                if line.startswith(("PASS ·", "FAIL ·")) or line.endswith("first divergence"):
                    terminalreporter.write_line(f"{'':30}{line}")
    for i in flow.installs:
        terminalreporter.write_line(f"{i.box}: `{i.command}` would replace {i.replaced or 'nothing'}; adds "
                                    f"{len(i.added)} ({', '.join(sorted(i.added))})")
    terminalreporter.write_line(f"{sum(s.seconds for s in flow.steps):7.1f}s  in the page's commands")

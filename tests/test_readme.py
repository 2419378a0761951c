"""The README's Python examples run as written, and its set-up commands match CI."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["report"].step_time_s > 0


def test_setup_commands_open_the_readme_and_ci_runs_the_test_command():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert "perfsim simulate --model zaya1-base" in first_block
    assert "bash .ci/run" in first_block
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pytest" in ci and "set -euo pipefail" in ci

"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

import needs

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_blocks_run(index, monkeypatch):
    for marker, package in (("import torch", "torch"), ("from onnx", "onnx")):
        if any(marker in block for block in BLOCKS[: index + 1]):
            needs.package(package)
    monkeypatch.chdir(Path(__file__).parent.parent)  # the examples are named from the repository root
    # later blocks build on earlier ones: run every block up to this one
    exec(compile("\n".join(BLOCKS[: index + 1]), "README.md", "exec"), {})

"""The README runs as written, top to bottom, in a fresh directory holding a copy of
``examples/``: every Python block on its own (a fresh namespace, its own imports), every shell
command through the installed ``dpl``, and the ``.dpl`` blocks saved under the name their first
line gives (``# my_patterns.dpl``) where the text says to save them.

Steps run in document order in one directory (a command may read a file an earlier block
wrote); a step run alone first replays the steps before it. Not run: ``pip install`` (the
environment is installed already), the test suite itself, and the benchmarks (minutes each).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import needs

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
NOT_RUN = ("pip install", "python -m pytest", "python bench/")


@attrs.frozen
class Step:
    kind: str  # "python", "shell" or "file"
    text: str
    line: int
    name: str = ""  # the file a "file" step writes

    @property
    def id(self) -> str:
        return f"{self.kind}-L{self.line}"


def steps(text: str) -> list[Step]:
    """The README's runnable pieces in order: fenced ```python and ```dpl blocks, and the
    commands of indented (shell) blocks, one step per line; ``#`` starts a comment."""
    out: list[Step] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"```(\w*)\s*$", line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = "\n".join(lines[i + 1 : end]) + "\n"
            if fence.group(1) == "python":
                out.append(Step("python", body, i + 2))
            elif fence.group(1) == "dpl":
                name = re.match(r"#\s*(\S+\.dpl)", lines[i + 1])
                if name:
                    out.append(Step("file", body, i + 2, name.group(1)))
            i = end + 1
            continue
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip() or lines[i - 1].startswith("    ")):
            command = line.strip().split(" #")[0].strip()
            if command and not command.startswith("#"):
                parts = [p.strip() for p in command.split("&&") if not p.strip().startswith(NOT_RUN)]
                if parts:
                    out.append(Step("shell", " && ".join(parts), i + 1))
        i += 1
    return out


STEPS = steps(README)


def needed_packages(step: Step) -> list[str]:
    text = step.text
    packages = [p for p in ("torch", "onnx") if re.search(rf"^\s*(import|from) {p}\b", text, re.M)]
    if step.kind == "shell" and ".onnx" in text:
        packages.append("onnx")  # the model an ONNX block wrote
    return packages


class Workspace:
    def __init__(self, path: Path):
        self.path = path
        self.done = 0
        shutil.copytree(ROOT / "examples", path / "examples")

    def run(self, step: Step) -> None:
        if step.kind == "file":
            (self.path / step.name).write_text(step.text)
        elif step.kind == "python":
            cwd = os.getcwd()
            os.chdir(self.path)
            try:
                exec(compile(step.text, f"README.md:{step.line}", "exec"), {"__name__": "__readme__"})
            finally:
                os.chdir(cwd)
        else:
            env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
            if step.text.startswith("dpl cache"):  # its own cache: clearing must not empty the one the suite shares
                env["XDG_CACHE_HOME"] = str(self.path / "xdg-cache")
            r = subprocess.run(step.text, shell=True, cwd=self.path, env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"README.md:{step.line}: `{step.text}` exited {r.returncode}\n{r.stdout}\n{r.stderr}"
            assert "Traceback" not in r.stderr, r.stderr

    def run_through(self, index: int) -> None:
        """Run the steps before ``index`` that have not run yet (a step selected alone)."""
        for step in STEPS[self.done : index]:
            for package in needed_packages(step):
                needs.package(package)
            self.run(step)
        self.done = max(self.done, index)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("readme"))


def test_the_readme_has_what_the_doc_test_runs():
    kinds = [s.kind for s in STEPS]
    assert kinds.count("python") >= 6 and kinds.count("shell") >= 12 and kinds.count("file") == 1
    assert kinds.index("file") < next(i for i, s in enumerate(STEPS) if "my_patterns.dpl" in s.text and s.kind == "shell")
    assert any(s.text.startswith("dpl run examples/llama_mlp.ir") for s in STEPS)  # from the `pip install -e . && ...` line


@pytest.mark.parametrize("index", range(len(STEPS)), ids=[s.id for s in STEPS])
def test_readme_step(index, workspace):
    step = STEPS[index]
    for package in needed_packages(step):
        needs.package(package)
    workspace.run_through(index)
    workspace.done = index + 1  # run once, pass or fail
    workspace.run(step)


def test_every_link_of_the_readme_and_docs_resolves():
    """Relative links in the README and docs/ name files that exist; the README links the
    language reference, and ``dpl check --help`` names it."""
    from dpl.cli import build_parser

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
    assert "](docs/language.md)" in README
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert "docs/language.md" in sub.choices["check"].format_help()

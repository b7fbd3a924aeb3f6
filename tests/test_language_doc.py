"""Every example of docs/language.md runs, and prints exactly what the doc says it prints.

An example is a run of fenced blocks, told apart by their info strings:

    ```dpl [NAME.dpl] [imported]   one or more pattern files, in the order they load
                                   (default name example.dpl; `imported`: written beside the
                                   others for an import, not loaded itself)
    ```python hook                 optional: registers check hooks before the files load
    ```ir                          optional: the input module (dpl.parse)
    ```KIND                        exactly one expected block, which ends the example

where KIND says what is printed:

    ir out       dpl.apply(mod, patterns, fuse=False, annotate_codegen=False)
    ir out-full  dpl.apply(mod, patterns)
    text trace   the Trace report of the `ir out` call: rewrites, matches kept and refused
    text rules   the rules in the order they run: kind, name, priority, variants, ## doc
    text error   the DplError that loading the files (or applying them) raises

Every fenced block of the doc belongs to an example; anything else is a malformed doc. The
files are written to a fresh directory, which is the working directory while they load, so
errors name them as the doc does. Regenerate the expected blocks after an intended change with
``python tests/test_language_doc.py --regen``, then read the diff: the doc is the spec.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import attrs
import pytest

import dpl
from dpl.lang import load_rules
from dpl.lang.hooks import unregister_hook

DOC = Path(__file__).resolve().parent.parent / "docs" / "language.md"
KINDS = ("ir out", "ir out-full", "text trace", "text rules", "text error")
FENCE = re.compile(r"^```(.*)$")


class MalformedDoc(Exception):
    pass


@attrs.frozen
class Block:
    info: str
    text: str
    line: int  # of the opening fence


@attrs.frozen
class Example:
    files: tuple[tuple[str, str, bool], ...]  # (name, text, loaded)
    hook: str | None
    module: str | None
    kind: str
    expected: Block
    line: int
    heading: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"L{self.line}-{slug}"


def blocks(text: str) -> list[tuple[Block, str]]:
    """Each fenced block with the nearest heading above it; an unclosed fence is an error."""
    out, heading = [], ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        fence = FENCE.match(line)
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        if end is None:
            raise MalformedDoc(f"line {i + 1}: the fence opened here is never closed")
        body = "\n".join(lines[i + 1 : end])
        out.append((Block(fence.group(1).strip(), body + "\n" if body else "", i + 1), heading))
        i = end + 1
    return out


def examples(text: str) -> list[Example]:
    """The doc's examples, each checked for shape: files, then an optional hook and module,
    then exactly one expected block."""
    found: list[Example] = []
    files: list[tuple[str, str, bool]] = []
    hook = module = None
    start, start_heading = 0, ""
    for block, heading in blocks(text):
        words = block.info.split()
        if not words:
            raise MalformedDoc(f"line {block.line}: a fenced block without an info string")
        if words[0] == "dpl":
            if hook is not None or module is not None:
                raise MalformedDoc(f"line {block.line}: a ```dpl block after the example's hook or module")
            if not files:
                start, start_heading = block.line, heading
            name = words[1] if len(words) > 1 else "example.dpl"
            if not name.endswith(".dpl") or words[2:] not in ([], ["imported"]) or any(f[0] == name for f in files):
                raise MalformedDoc(f"line {block.line}: bad ```dpl info string '{block.info}'")
            files.append((name, block.text, words[2:] != ["imported"]))
        elif block.info == "python hook":
            if not files or hook is not None or module is not None:
                raise MalformedDoc(f"line {block.line}: a hook block belongs after an example's ```dpl blocks")
            hook = block.text
        elif block.info == "ir":
            if not files or module is not None:
                raise MalformedDoc(f"line {block.line}: an ```ir module belongs after an example's ```dpl blocks")
            module = block.text
        elif block.info in KINDS:
            if not files:
                raise MalformedDoc(f"line {block.line}: an expected block without ```dpl blocks before it")
            if block.info in ("ir out", "ir out-full", "text trace") and module is None:
                raise MalformedDoc(f"line {block.line}: '{block.info}' needs an ```ir module before it")
            if not any(loaded for _, _, loaded in files):
                raise MalformedDoc(f"line {block.line}: the example loads no file")
            found.append(Example(tuple(files), hook, module, block.info, block, start, start_heading))
            files, hook, module = [], None, None
        else:
            raise MalformedDoc(f"line {block.line}: unknown info string '{block.info}'")
    if files:
        raise MalformedDoc(f"line {start}: the example starting here has no expected block")
    return found


def rules_listing(names: list[str]) -> str:
    lines = []
    for r in load_rules(names):
        lines.append(f"{r.kind} {r.name}  priority {r.priority}  variants {r.variants}")
        lines += [f"  ## {d}" for d in (r.doc or "").splitlines()]
        if r.annotations:
            lines.append(f"  annotate {', '.join(r.annotations)}")
    return "\n".join(lines) + "\n"


def output(ex: Example, directory: Path) -> str:
    """What the example prints, run in ``directory`` (the working directory meanwhile)."""
    for name, text, _ in ex.files:
        (directory / name).write_text(text)
    names = [name for name, _, loaded in ex.files if loaded]
    hooks = re.findall(r'check_hook\("([^"]+)"', ex.hook or "")
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        if ex.hook is not None:
            exec(compile(ex.hook, f"{DOC.name}:{ex.line}", "exec"), {"dpl": dpl})
        try:
            if ex.kind == "text rules":
                return rules_listing(names)
            patterns = dpl.load_patterns(names)
            if ex.module is None:
                return "no error\n"
            mod = dpl.parse(ex.module, "input.ir")
            if ex.kind == "ir out-full":
                return str(dpl.apply(mod, patterns))
            trace = dpl.Trace()
            result = dpl.apply(mod, patterns, fuse=False, annotate_codegen=False, trace=trace)
            if ex.kind == "text trace":  # the decisions without the coverage table
                return dpl.Trace(events=trace.events, rewrites=trace.rewrites).report() + "\n"
            return str(result)
        except dpl.DplError as err:
            if ex.kind != "text error":
                raise
            return str(err) + "\n"
    finally:
        os.chdir(cwd)
        for name in hooks:
            unregister_hook(name)


EXAMPLES = examples(DOC.read_text())


@pytest.mark.parametrize("ex", EXAMPLES, ids=[ex.id for ex in EXAMPLES])
def test_example(ex, tmp_path):
    got = output(ex, tmp_path)
    assert got == ex.expected.text, f"docs/language.md:{ex.expected.line}: the expected block differs"


def test_the_doc_has_examples_of_every_kind():
    assert len(EXAMPLES) >= 30
    assert {ex.kind for ex in EXAMPLES} == set(KINDS)


def test_every_grammar_keyword_has_an_example():
    """Each keyword of grammar/dpl.lark appears in some example's .dpl text."""
    grammar = (DOC.parent.parent / "grammar" / "dpl.lark").read_text()
    keywords = set(re.search(r"NAME: /\(\?!\(([^)]*)\)", grammar).group(1).split("|"))
    written = "\n".join(text for ex in EXAMPLES for _, text, _ in ex.files)
    missing = sorted(k for k in keywords if not re.search(rf"\b{k}\b", written))
    assert not missing, f"keywords without an example: {missing}"


BAD_DOCS = {
    "unclosed fence": "```dpl\npattern k.e { out = exp(x) }\n",
    "no expected block": "```dpl\npattern k.e { out = exp(x) }\n```\n```ir\nfunc main() -> f32[] { return 1.0 }\n```\n",
    "unknown info string": "```dpl\npattern k.e { out = exp(x) }\n```\n```ir output\nx\n```\n",
    "expected block alone": "```text error\nx\n```\n",
    "module without files": "```ir\nx\n```\n```ir out\nx\n```\n",
    "output without module": "```dpl\npattern k.e { out = exp(x) }\n```\n```ir out\nx\n```\n",
    "only imported files": "```dpl a.dpl imported\npattern k.e { out = exp(x) }\n```\n```text rules\nx\n```\n",
    "bare fence": "```\nx\n```\n",
}


@pytest.mark.parametrize("text", BAD_DOCS.values(), ids=BAD_DOCS.keys())
def test_malformed_docs_are_refused(text):
    with pytest.raises(MalformedDoc):
        examples(text)


def test_an_edited_expected_block_fails(tmp_path):
    """The comparison can fail: one character changed in an expected block is caught."""
    ex = next(ex for ex in EXAMPLES if ex.kind == "ir out")
    edited = attrs.evolve(ex, expected=attrs.evolve(ex.expected, text=ex.expected.text.replace("func", "fnuc", 1)))
    assert output(edited, tmp_path) != edited.expected.text


def regenerate() -> None:
    """Rewrite every expected block of the doc with what its example prints now."""
    import tempfile

    lines = DOC.read_text().splitlines(keepends=True)
    for ex in reversed(EXAMPLES):
        with tempfile.TemporaryDirectory() as tmp:
            got = output(ex, Path(tmp))
        start = ex.expected.line  # index of the first line inside the fence
        end = start + len(ex.expected.text.splitlines())
        lines[start:end] = got.splitlines(keepends=True)
    DOC.write_text("".join(lines))


if __name__ == "__main__" and "--regen" in sys.argv:
    regenerate()

"""``dpl cache info|clear`` on the user cache (here a temporary one) and on a named folder."""

import json
import shutil
import subprocess

import pytest

import needs

import dpl.cli.cache
from dpl.backends.cpu import products_choice
from dpl.cli import main
from dpl.runtime.disk_cache import DEFAULT_MAX_BYTES, LibraryCache


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    needs.c_compiler()
    folder = tmp_path_factory.mktemp("lib")
    (folder / "k.c").write_text("int dpl_kernel(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(folder / "k.c"), "-o", str(folder / "k.so")], check=True)
    return folder / "k.so"


def fill(directory, library, n):
    store = LibraryCache(directory)
    for i in range(n):
        store.load(f"{i:02x}" + "f" * 62, lambda out: shutil.copy(library, out), "dpl_kernel")
    return store


def test_info_and_clear_on_a_named_folder(tmp_path, library, capsys):
    store = fill(tmp_path / "k", library, 3)
    size = store.info().bytes
    assert main(["cache", "info", "--dir", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert f"location: {tmp_path / 'k'}" in out
    assert f"kernels: {tmp_path / 'k'}: 3 entries, {size / 1024:.1f} KiB of a {DEFAULT_MAX_BYTES // 2**20}.0 MiB cap" in out
    assert main(["cache", "clear", "--dir", str(tmp_path / "k")]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert LibraryCache(tmp_path / "k").info().entries == 0 and not list((tmp_path / "k").glob("*.so"))


def test_the_user_cache_with_its_parse_tables_and_products_choices(tmp_path, library, monkeypatch, capsys):
    monkeypatch.setattr(dpl.cli.cache, "store_dir", lambda name: tmp_path / "dpl" / name)
    monkeypatch.setattr(dpl.cli.cache, "user_cache_root", lambda: tmp_path / "dpl")
    fill(tmp_path / "dpl" / "kernels", library, 2)
    parsers, products = tmp_path / "dpl" / "parsers", tmp_path / "dpl" / "products"
    parsers.mkdir(mode=0o700)
    products.mkdir(mode=0o700)
    (parsers / f"ir-{'0' * 32}.lark").write_bytes(b"x" * 10)
    (parsers / f"ir-{'0' * 32}.sha256").write_bytes(b"y" * 6)
    (products / f"{'a' * 24}.json").write_bytes(b"{}")
    here = products / products_choice.stored_here()
    here.write_text(json.dumps(dict(numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=2.5, torch_conv=0.5, packed_matmul=1.0,
                                    spread=0.04, when="2026-01-02T03:04:05+00:00",
                                    machine="Some CPU, 2 cores, avx2 fma; NumPy 2 with openblas 0.3, torch 2, gcc 12, dpl 0.1")))
    for p in products.iterdir():
        p.chmod(0o600)
    foreign = [parsers / "ir-0.lark", parsers / "write.lock", products / "notes.json"]  # not names dpl writes
    for f in foreign:
        f.write_text("mine")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"location: {tmp_path / 'dpl'}" in out and "kernels: " in out and ": 2 entries" in out
    assert "cuda-twin: " in out and ": 0 entries" in out and f"parsers: {parsers}: 1 parse table, 16 bytes" in out
    assert f"products: {products}: 2 products choices, {2 + here.stat().st_size} bytes" in out
    # what each choice holds, this machine's first
    assert (f"  {here.name} (this machine): products by NumPy, float32 ones by the packed routine, convolutions by "
            "torch; measured at 2026-01-02T03:04:05+00:00 on Some CPU, 2 cores, avx2 fma; NumPy 2 with openblas 0.3, torch 2, "
            "gcc 12, dpl 0.1\n"
            "    products NumPy 2.00 ms, torch 2.50, packed 1.00; convolution im2col 1.00, torch 0.50; median of 9 rounds, "
            "spread 4%\n"
            f"  {'a' * 24}.json (another CPU or other library versions, unused here): unreadable; measured again when needed") in out
    assert not (tmp_path / "dpl" / "cuda-twin").exists()  # a report creates nothing
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "kernels: removed 2 entries" in out and "parsers: removed 1 parse table" in out
    assert f"products: removed 2 products choices from {products}" in out
    assert sorted(p.name for p in parsers.iterdir()) == ["ir-0.lark", "write.lock"]
    assert [p.name for p in products.iterdir()] == ["notes.json"]


def test_an_action_is_required():
    assert main(["cache"]) == 2  # a usage error


def test_reset_choices_removes_the_products_choices_and_the_next_build_measures_again(tmp_path, library, monkeypatch, capsys):
    """The user's way: a kept choice shows in ``dpl cache info``, ``dpl cache reset-choices``
    removes it (the kernels stay), and the next ``products="auto"`` measures again."""
    monkeypatch.setattr(dpl.cli.cache, "store_dir", lambda name: tmp_path / "dpl" / name)
    monkeypatch.setattr(dpl.cli.cache, "user_cache_root", lambda: tmp_path / "dpl")
    monkeypatch.setattr(products_choice, "store_dir", lambda name: tmp_path / "dpl" / name)
    monkeypatch.setattr(products_choice, "_chosen", {})
    fill(tmp_path / "dpl" / "kernels", library, 1)
    measured = []

    def measure(cc, load=None):
        measured.append(cc)
        return products_choice.Measured(numpy_matmul=2.0, numpy_conv=1.0, packed_matmul=1.5, spread=0.02, when="now")

    monkeypatch.setattr(products_choice, "measure", measure)
    assert products_choice.products("auto").packs and len(measured) == 1
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"  {products_choice.stored_here()} (this machine): products by NumPy, float32 ones by the packed routine" in out
    assert "measured at now on " in out and "packed 1.50; convolution im2col 1.00, torch -; median of 9 rounds, spread 2%" in out
    assert main(["cache", "reset-choices"]) == 0
    assert capsys.readouterr().out == f"products: removed 1 products choice from {tmp_path / 'dpl' / 'products'}\n"
    assert not list((tmp_path / "dpl" / "products").glob("*.json"))
    assert LibraryCache(tmp_path / "dpl" / "kernels").info().entries == 1  # the kernels are kept
    monkeypatch.setattr(products_choice, "_chosen", {})  # the next process
    products_choice.products("auto")
    assert len(measured) == 2

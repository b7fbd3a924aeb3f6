"""A compiled package: an Executable in one file that runs where no C compiler is.

``dpl.save_package(exe, "model.dplpkg")`` writes a zip holding the module's text and weights (as
``dpl.save`` writes them: the text and an ``.npz`` read without pickle), the CPU kernels its
plans run (``kernels/KEY.so``), and ``manifest.json``: the format and its version, the dpl,
NumPy and Python versions that saved it, the target, the entry and the input signatures planned,
the fusion config (and profile), the thread settings, the CPU backend's record (compiler flags
and version, the machine and the instruction-set extensions the kernels may use, the products
provider and attention path chosen: ``backends/cpu/prebuilt.py``), and every member's size and
SHA-256. TVM's ``export_library`` and AOTInductor's package are the models.

``dpl.load_package(path)`` checks before it uses anything: the manifest's format and version,
every member present, none unlisted, each of its listed size and hash, the architecture and CPU
features, the target available here. Any failure is a :class:`PackageError` naming what is
wrong. The kernels then go, each checked against the package's hash, into a private store
(``packaged`` in dpl's cache directory) and are loaded from there; the executable is built
again from the module with those kernels and plans the recorded signatures, so loading calls no
compiler. CUDA kernels are not held: CuPy compiles them at load with NVRTC, a wheel rather than
a system compiler.

The hashes show that the package is the one saved (not damaged, truncated or edited by
accident); they prove nothing about who saved it. A package runs its kernels in the loading
process: load only packages you trust, as you would a shared library.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cpu.prebuilt import PackagedCpuBackend, describe, isa_mismatch, replica, served_kernels
from dpl.backends.registry import Backend, BackendError, resolve_target
from dpl.cache_dir import make_private_dirs, private_dir, store_dir, write_private_file
from dpl.errors import DplError, count
from dpl.ir import serialize
from dpl.limits import excerpt
from dpl.runtime.config import FusionConfig
from dpl.runtime.executable import Executable, target_name

log = logging.getLogger(__name__)

FORMAT = "dpl-package"
VERSION = 1  # of the layout and the manifest: a load refuses any other
MANIFEST, MODULE, PROFILE = "manifest.json", "module.dpl", "profile.json"
WEIGHTS = serialize.sidecar(MODULE)
KERNELS = "kernels/"
MANIFEST_LIMIT = 1 << 20


class PackageError(DplError):
    """A package that cannot be written, or read and trusted here."""


# -- saving ---------------------------------------------------------------------------------------
def save_package(exe: Executable, path: str | os.PathLike) -> Path:
    """Write ``exe`` to ``path`` (one zip file, written to a temporary name and renamed): its
    module and weights, the CPU kernels its plans run, and a manifest with every member's hash.
    A module with symbolic input shapes holds the kernels of the shapes it was called with."""
    if not isinstance(exe, Executable):
        raise PackageError(f"save_package takes an Executable (dpl.build), got {type(exe).__name__}")
    path = Path(path)
    members: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="dpl-package-") as tmp:
        serialize.save(exe.module, Path(tmp) / MODULE)
        for name in (MODULE, WEIGHTS):
            if (Path(tmp) / name).exists():
                members[name] = (Path(tmp) / name).read_bytes()
    config = attrs.asdict(exe.config)
    if exe.config.profile_path is not None:
        try:
            members[PROFILE] = Path(exe.config.profile_path).read_bytes()
        except OSError as err:
            raise PackageError(f"cannot read the profile {exe.config.profile_path} the executable's config names: {err.strerror}") from None
    config.pop("profile_path")
    cpu, kernels = _cpu_kernels(exe)
    members.update({f"{KERNELS}{key}.so": data for key, data in kernels.items()})
    manifest = {
        "format": FORMAT, "version": VERSION, "dpl": _dpl_version(), "numpy": np.__version__, "python": platform.python_version(),
        "target": [b.name for b in exe.target], "target_name": exe.target_name, "entry": exe.entry.name,
        "signatures": [[[list(shape), dt.from_numpy(np.dtype(dtype))] for shape, dtype in sig] for sig in exe.plans],
        "config": config, "threads": exe.threads, "adapt_threads": exe.adapt_threads, "cpu": cpu,
        "members": {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in members.items()},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
                for name, data in members.items():
                    zf.writestr(name, data)
            os.chmod(tmp_name, 0o644)  # mkstemp's 0600 would keep it from the user a service runs as
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise PackageError(f"cannot write the package {path}: {err.strerror or err}") from None
    log.debug("saved %s: %s, %s", path, count(len(kernels), "kernel"), count(len(members), "member"))
    return path


def _cpu_kernels(exe: Executable) -> tuple[dict | None, dict[str, bytes]]:
    """The CPU backend's record and the kernels the plans of ``exe`` run, found by planning its
    input signatures again with a replica of its CPU backend (``backends/cpu/prebuilt.py``)."""
    cpu = next((b for b in exe.target if isinstance(b, CpuBackend)), None)
    if cpu is None or not cpu.available()[0]:
        return None, {}
    if not exe.plans:
        log.warning("%s has no plan yet (its inputs have symbolic shapes): the package holds no kernels; call it on each "
                    "input shape to deploy before saving it", exe)
    twin = replica(cpu)
    target = [twin if b is cpu else b for b in exe.target]
    with _quiet_fallbacks():  # the saved executable's fall-backs, said when it was built
        again = Executable(exe.module, target, exe.config, entry=exe.entry.name, progress=None, threads=exe.threads,
                           adapt_threads=exe.adapt_threads)
        for signature in exe.plans:
            again.plan_for(signature)
    return describe(twin), served_kernels(twin)


@contextmanager
def _quiet_fallbacks():
    executable_log = logging.getLogger("dpl.runtime.executable")
    level = executable_log.level
    executable_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        executable_log.setLevel(level)


def _dpl_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("dpl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- loading --------------------------------------------------------------------------------------
def load_package(path: str | os.PathLike, *, target: Any = None, cache_dir: str | os.PathLike | None = None,
                 progress=None, strict: bool = False) -> Executable:
    """The Executable saved at ``path`` by :func:`save_package`, checked member by member before
    anything is used, its CPU kernels loaded without a compiler. ``target``: run it on another
    target than the one it was saved for (its CPU kernels still serve a ``cpu`` there);
    ``cache_dir``: where the kernels are kept to be loaded (default: ``packaged`` in dpl's cache
    directory); ``strict``: a kernel the package lacks is an error, not a fall-back (as
    ``dpl.build``'s). Every problem is a :class:`PackageError`."""
    path = Path(path)
    manifest, members = _read_verified(path)
    cpu = manifest["cpu"]
    if cpu is not None:
        why = isa_mismatch(cpu["isa"], cpu["toolchain"]["flags"])
        if why is not None:
            raise PackageError(f"{path} cannot run on this machine: {why}",
                               hint="save the package again on a machine of this kind")
    module = _module(path, members)
    config = _config(path, manifest, members)
    backends = _target(path, manifest, target, members, cache_dir)
    first = backends[0].available()
    if not first[0]:
        asked = target_name(target) if target is not None else manifest["target_name"]
        raise PackageError(f"{path} is for target {asked}, whose backend {backends[0].name} is unavailable here: {first[1]}",
                           hint="load_package(path, target='cpu') (dpl run --target cpu) runs it on the CPU")
    try:
        exe = Executable(module, backends, config, entry=manifest["entry"], progress=progress, threads=manifest["threads"],
                         adapt_threads=manifest["adapt_threads"], strict=strict)
        for signature in manifest["signatures"]:
            exe.plan_for([(tuple(shape), dt.to_numpy(dtype)) for shape, dtype in signature])
    except DplError as err:
        raise PackageError(f"{path}: the saved executable does not build here: {err.message}", hint=err.hint) from None
    return exe


def _read_verified(path: Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every member, each of the size and SHA-256 the manifest lists."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}
            manifest = _manifest(path, zf, infos)
            listed = manifest["members"]
            unlisted = sorted(set(infos) - set(listed) - {MANIFEST})
            if unlisted:
                raise PackageError(f"{path} holds {excerpt(', '.join(unlisted), 200)}, which its manifest does not list",
                                   hint="a package is written whole by dpl.save_package; this one was changed after")
            members = {}
            for name, expected in listed.items():
                info = infos.get(name)
                if info is None:
                    raise PackageError(f"{path} misses its member {name} (the manifest lists it)",
                                       hint="the package is incomplete: copy it again, or save it again")
                if info.file_size != expected["bytes"]:
                    raise PackageError(f"{path}: member {name} holds {info.file_size} bytes, the manifest says {expected['bytes']}",
                                       hint="the package was changed after it was saved")
                data = zf.read(info)
                if hashlib.sha256(data).hexdigest() != expected["sha256"]:
                    raise PackageError(f"{path}: member {name} does not match its SHA-256 in the manifest",
                                       hint="the package was changed after it was saved; do not run it")
                members[name] = data
    except PackageError:
        raise
    except FileNotFoundError:
        raise PackageError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise PackageError(f"{path} is a directory, not a package") from None
    except zipfile.BadZipFile as err:
        raise PackageError(f"{path} is not a dpl package, or it is truncated ({err})",
                           hint="a package is the file dpl.save_package (dpl run --save-package) writes") from None
    except (OSError, EOFError, zlib.error, RuntimeError, NotImplementedError, zipfile.LargeZipFile) as err:
        raise PackageError(f"cannot read {path}: {excerpt(str(err), 200)} (damaged or truncated)") from None
    return manifest, members


def _manifest(path: Path, zf: zipfile.ZipFile, infos: dict) -> dict:
    info = infos.get(MANIFEST)
    if info is None:
        raise PackageError(f"{path} has no {MANIFEST}: it is not a dpl package",
                           hint="a package is the file dpl.save_package (dpl run --save-package) writes")
    if info.file_size > MANIFEST_LIMIT:
        raise PackageError(f"{path}: its {MANIFEST} is larger than {MANIFEST_LIMIT} bytes")
    try:
        manifest = json.loads(zf.read(info))
    except (ValueError, UnicodeDecodeError) as err:
        raise PackageError(f"{path}: its {MANIFEST} is not JSON ({excerpt(str(err), 200)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageError(f"{path} is not a dpl package: its {MANIFEST} does not say format '{FORMAT}'")
    if manifest.get("version") != VERSION:
        raise PackageError(f"{path} is a package of format version {manifest.get('version')!r}, saved by dpl "
                           f"{manifest.get('dpl', '?')}; this dpl reads version {VERSION}",
                           hint="load it with the dpl version that saved it, or save it again with this one")
    shapes = {"members": dict, "target": list, "target_name": str, "entry": str, "signatures": list, "config": dict}
    wrong = [k for k, kind in shapes.items() if not isinstance(manifest.get(k), kind)]
    members = manifest.get("members") or {}
    if not wrong and not all(isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
                             for m in members.values()):
        wrong = ["members"]
    if not wrong and not _signatures_ok(manifest["signatures"]):
        wrong = ["signatures"]
    if not wrong and ("threads" not in manifest or not isinstance(manifest.get("adapt_threads"), bool)):
        wrong = ["threads"]
    if not wrong and not _cpu_record_ok(manifest.get("cpu", False)):
        wrong = ["cpu"]
    if wrong:
        raise PackageError(f"{path}: its {MANIFEST} has no valid {', '.join(wrong)}")
    return manifest


def _signatures_ok(signatures: list) -> bool:
    """Whether every input signature is a list of ``[shape, dtype]``: sizes, a dtype dpl names."""
    def spec_ok(spec) -> bool:
        return (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], list) and _ints(spec[0])
                and spec[1] in dt.SHORT_NAMES)
    return all(isinstance(sig, list) and all(spec_ok(spec) for spec in sig) for sig in signatures)


def _ints(values) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _cpu_record_ok(cpu) -> bool:
    """Whether the manifest's CPU record (``prebuilt.describe``, or None) has what a load reads."""
    if cpu is None:
        return True
    if not isinstance(cpu, dict) or not isinstance(cpu.get("toolchain"), dict) or not isinstance(cpu.get("isa"), dict):
        return False
    tool, isa = cpu["toolchain"], cpu["isa"]
    features = isa.get("features", [])
    stream = cpu.get("stream_bytes")
    return (isinstance(tool.get("flags"), list) and all(isinstance(f, str) for f in tool["flags"])
            and isinstance(tool.get("compiler"), str) and isinstance(tool.get("cpu"), str) and "vector_math" in tool
            and isinstance(isa.get("machine"), str) and isinstance(features, list) and all(isinstance(f, str) for f in features)
            and "stream_bytes" in cpu and (stream is None or _ints([stream])) and isinstance(cpu.get("attention"), str)
            and isinstance(cpu.get("products"), (dict, type(None))))


def _module(path: Path, members: dict[str, bytes]):
    """The module of the package, read as ``dpl.load`` reads a module and its weights."""
    if MODULE not in members:
        raise PackageError(f"{path} holds no module ({MODULE})")
    with tempfile.TemporaryDirectory(prefix="dpl-package-") as tmp:
        for name in (MODULE, WEIGHTS):
            if name in members:
                (Path(tmp) / name).write_bytes(members[name])
        try:
            return serialize.load(Path(tmp) / MODULE)
        except DplError as err:
            raise PackageError(f"{path}: its module does not load: {err.message}") from None


def _config(path: Path, manifest: dict, members: dict[str, bytes]) -> FusionConfig:
    """The fusion config saved; a profile it named is kept under its hash in dpl's cache."""
    fields = dict(manifest["config"])
    if PROFILE in members:
        data = members[PROFILE]
        folder = private_dir(store_dir("packaged"), "packaged") / "profiles"
        make_private_dirs(folder)
        profile = folder / f"{hashlib.sha256(data).hexdigest()}.json"
        write_private_file(profile, data)
        fields["profile_path"] = str(profile)
    try:
        return FusionConfig(**fields)
    except (DplError, TypeError) as err:
        why = err.message if isinstance(err, DplError) else str(err)
        raise PackageError(f"{path}: its fusion config does not fit this dpl: {why}") from None


def _target(path: Path, manifest: dict, target: Any, members: dict[str, bytes], cache_dir) -> list[Backend]:
    """The backends to build with: the package's target (or ``target``), its ``cpu`` running the
    package's kernels."""
    try:
        backends = list(resolve_target(target if target is not None else manifest["target"]))
    except BackendError as err:
        raise PackageError(f"{path}: its target does not resolve here: {err.message}", hint=err.hint) from None
    cpu = manifest["cpu"]
    if cpu is None:
        return backends
    kernels = {name[len(KERNELS):-3]: data for name, data in members.items() if name.startswith(KERNELS) and name.endswith(".so")}
    try:
        packaged = PackagedCpuBackend(kernels, cpu, cache_dir=cache_dir)
    except BackendError as err:  # an option this dpl's CPU backend does not take (its attention path)
        raise PackageError(f"{path}: its CPU record does not fit this dpl: {err.message}") from None
    if cpu["products"] is not None:
        packaged.products  # noqa: B018 (torch's products where torch is missing: said at load, not at a first call)
    return [packaged if isinstance(b, CpuBackend) else b for b in backends]

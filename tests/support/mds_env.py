"""A virtual environment with mosaicml-streaming, for the MDS tests and benchmark.

mosaicml-streaming cannot share the project's environment: it pins
``numpy<2.2`` and ``transformers<5`` and pulls CUDA torchvision, which would
replace what the project runs on. This environment, cached under the repo's
ignored ``.peers-venv/mds`` (rebuilt when ``STAMP`` is missing), gets
mosaicml-streaming ``--no-deps`` with the pure-Python needs of its MDS
writer and reader at the versions it asks for (numpy 2.1), borrows torch
from the project's environment (a ``.pth`` placed after its own packages, so
its own numpy wins), and a two-name stand-in for torchvision, which
``streaming`` imports only for its vision datasets (the registry has no CPU
torchvision for torch 2.13). ``python()`` builds it once (registry access
needed) and returns its interpreter; ``run(...)`` runs ``mds_tool.py`` in it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["STREAMING", "VENV", "python", "run"]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".peers-venv" / "mds"
STREAMING = "mosaicml-streaming==0.13.0"
NEEDS = ["numpy>=1.21.5,<2.2", "xxhash>=3,<4", "zstd>=1.5.2.5,<2", "python-snappy>=0.6.1,<1",
         "Brotli>=1.0.9", "tqdm>=4.64,<5", "catalogue>=2,<3", "typing_extensions", "filelock",
         "pillow"]
STAMP = VENV / f".installed-{STREAMING}"
TOOL = Path(__file__).with_name("mds_tool.py")
_STAND_IN = {
    "torchvision/__init__.py": '"""Stand-in: streaming.vision imports these names only."""\n',
    "torchvision/datasets.py": (
        "class VisionDataset:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise NotImplementedError('torchvision stand-in (MDS test environment)')\n\n\n"
        "class CIFAR10(VisionDataset):\n    pass\n"),
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": (
        "def to_tensor(picture):\n"
        "    raise NotImplementedError('torchvision stand-in (MDS test environment)')\n"),
}


def _bin(name: str) -> Path:
    return VENV / "bin" / name


def _build() -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [[base, "-m", "venv", "--clear", str(VENV)],
             [str(_bin("python")), "-m", "pip", "install", "--quiet", "--no-deps", STREAMING],
             [str(_bin("python")), "-m", "pip", "install", "--quiet", *NEEDS]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(
                f"building the MDS test environment failed at {' '.join(step[:6])} ...: "
                f"{done.stderr.strip()[-2000:]}\nThe MDS tests need the package registry "
                f"once to install {STREAMING} into {VENV}; they compare zerobatch with "
                "MDS's own writer and reader, so they cannot run without it.")
    purelib = Path(subprocess.check_output(
        [str(_bin("python")), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    (purelib / "zz_project_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for name, text in _STAND_IN.items():
        (purelib / name).parent.mkdir(parents=True, exist_ok=True)
        (purelib / name).write_text(text)
    check = subprocess.run([str(_bin("python")), "-c", "import numpy, streaming, torch; "
                            "from streaming import MDSWriter, StreamingDataset"],
                           capture_output=True, text=True, check=False)
    if check.returncode:
        raise RuntimeError(f"the MDS test environment at {VENV} does not import streaming: "
                           f"{check.stderr.strip()[-2000:]}")
    STAMP.write_text(_stamp())


def _stamp() -> str:
    """What the stamp holds: the package and the project environment whose
    torch the ``.pth`` borrows (a moved project environment rebuilds it)."""
    return f"{STREAMING}\n{sysconfig.get_paths()['purelib']}\n"


def _built() -> bool:
    return STAMP.exists() and STAMP.read_text() == _stamp()


def python() -> Path:
    """The environment's interpreter, built first when its stamp is missing or
    names another project environment (one process at a time: a lock file
    beside it)."""
    if not _built():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        with open(VENV.parent / "mds.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _built():
                _build()
    return _bin("python")


def run(*args: str, timeout: float = 600) -> str:
    """``mds_tool.py args`` in the environment; its stdout. Raises
    ``RuntimeError`` with its stderr when it fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(python()), str(TOOL), *args], capture_output=True, text=True,
                          check=False, timeout=timeout, env=env)
    if done.returncode:
        raise RuntimeError(f"mds_tool.py {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done.stdout

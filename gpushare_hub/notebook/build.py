"""Build the JupyterLab extension in ``labextension/`` into ``gpushare_hub/notebook/labextension/``.

Run by ``make setup`` (``python -m gpushare_hub.notebook.build``); needs Node.js (>= 20.19) and
npm, and the npm registry the first time. Steps, each skipped when its inputs are unchanged:

1. ``npm ci`` in ``~/.cache/gpushare-hub/labextension/<hash of package.json and
   package-lock.json>`` (``$GPUSHARE_LABEXTENSION_CACHE`` overrides the folder), linked as
   ``labextension/node_modules``: later builds and fresh clones on this machine reuse it;
2. ``tsc``, then ``jupyter-builder build`` (what ``jupyter labextension build`` runs) against
   this virtualenv's JupyterLab, writing the package's ``labextension`` folder, which holds a key
   of every input afterwards: the build is skipped while that key is unchanged;
3. :func:`install.install` into this Python's prefix, as a link (``--no-install``: not).

Tooling: never imported by the notebook server.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .install import BUILT, install

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "labextension"
KEY_FILE = ".source-key"
LOCK_FILES = ("package.json", "package-lock.json")
INPUTS = (*LOCK_FILES, "tsconfig.json", "src", "style")


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    env = os.environ.get("GPUSHARE_LABEXTENSION_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "gpushare-hub" / "labextension"


def _digest(root: Path, paths: list[Path], extra: bytes = b"") -> str:
    h = hashlib.sha256(extra)
    for path in paths:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def deps_key(source: Path = SOURCE) -> str:
    return _digest(source, [source / name for name in LOCK_FILES])


def core_package_file() -> Path:
    """This virtualenv's JupyterLab's own package.json: the shared packages and their versions."""
    spec = importlib.util.find_spec("jupyterlab")
    if spec is None or spec.origin is None:
        raise BuildError("JupyterLab is not installed in this Python: run `make setup`")
    return Path(spec.origin).parent / "staging" / "package.json"


def source_key(source: Path = SOURCE) -> str:
    files = []
    for name in INPUTS:
        path = source / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return _digest(source, files, core_package_file().read_bytes())


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BuildError(
            f"the JupyterLab extension needs {name} (Node.js >= 20.19 and npm): install them, e.g. "
            "`apt-get install nodejs npm`, then run `make setup` again"
        )
    return found


def _run(argv: list[str], cwd: Path, what: str) -> None:
    print(f"[labextension] $ {' '.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise BuildError(f"{what} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def node_modules(source: Path = SOURCE) -> Path:
    """The cached ``node_modules`` for this package-lock.json, installed with ``npm ci`` once."""
    folder = cache_root() / deps_key(source)
    modules = folder / "node_modules"
    if (folder / ".complete").exists():
        return modules
    npm = _tool("npm")
    _tool("node")
    partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in LOCK_FILES:
        shutil.copy(source / name, partial / name)
    start = time.monotonic()
    try:
        # No install scripts: nothing here needs one (rspack's binary is a platform package).
        _run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], partial, "npm ci")
        (partial / ".complete").write_text(f"{time.monotonic() - start:.0f} s\n")
        partial.rename(folder)
    except OSError:
        if not (folder / ".complete").exists():  # not another run's, finished meanwhile
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"[labextension] npm ci took {time.monotonic() - start:.0f} s ({folder})", file=sys.stderr)
    return modules


def link_node_modules(source: Path, modules: Path) -> None:
    link = source / "node_modules"
    if link.is_symlink() and link.readlink() == modules:
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(modules, target_is_directory=True)


def up_to_date(source: Path = SOURCE, built: Path = BUILT) -> bool:
    """Whether the built extension's key matches the sources'."""
    key_file = built / KEY_FILE
    return key_file.is_file() and key_file.read_text().strip() == source_key(source)


def build(force: bool = False, source: Path = SOURCE, built: Path = BUILT) -> bool:
    """Build unless the built extension's key matches the sources'; whether it built."""
    key = source_key(source)
    if not force and up_to_date(source, built):
        return False
    start = time.monotonic()
    link_node_modules(source, node_modules(source))
    node = _tool("node")
    _run(
        [node, str(source / "node_modules" / "typescript" / "bin" / "tsc"), "-p", str(source)], source, "tsc"
    )
    builder = Path(sys.executable).with_name("jupyter-builder")
    _run(
        [str(builder), "build", "--core-package-file", str(core_package_file()), str(source)],
        source,
        "jupyter-builder build",
    )
    if not (built / "package.json").is_file():
        raise BuildError(f"jupyter-builder ran but wrote no {built / 'package.json'}")
    (built / KEY_FILE).write_text(key + "\n")
    print(f"[labextension] built {built} in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_hub.notebook.build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="build even when the sources are unchanged")
    parser.add_argument("--no-install", action="store_true", help="do not link it into this Python's prefix")
    parser.add_argument(
        "--check",
        action="store_true",
        help="build nothing: exit 0 when the built extension is up to date, else 1",
    )
    args = parser.parse_args(argv)
    if args.check:
        return 0 if up_to_date() else 1
    try:
        if not build(force=args.force):
            print(f"[labextension] {BUILT} is up to date", file=sys.stderr)
        if not args.no_install:
            install(Path(sys.prefix))
    except (BuildError, OSError, subprocess.TimeoutExpired) as err:
        print(f"gpushare_hub.notebook.build: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

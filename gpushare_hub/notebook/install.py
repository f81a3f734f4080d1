"""Put the JupyterLab extension and the server extension where a Python prefix's Jupyter finds them.

``<prefix>/share/jupyter/labextensions/gpushare-hub-statusbar``: the built extension (the package's
``labextension`` folder, made by ``build.py``), as a link (a development install, what
``jupyter labextension develop`` does) or a copy (an image); and
``<prefix>/etc/jupyter/jupyter_server_config.d/gpushare_hub.notebook.slicepage.json``: the server
extension enabled (what ``jupyter server extension enable --sys-prefix`` writes).

Usage (the notebook image's Dockerfile): ``python -m gpushare_hub.notebook.install --copy``
(``--prefix`` defaults to this Python's ``sys.prefix``; ``--check`` only checks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from . import LABEXTENSION_NAME, SERVER_EXTENSION

BUILT = Path(__file__).resolve().parent / "labextension"


class NotInstalled(RuntimeError):
    pass


def labextension_dir(prefix: Path) -> Path:
    return prefix / "share" / "jupyter" / "labextensions" / LABEXTENSION_NAME


def server_config(prefix: Path) -> Path:
    return prefix / "etc" / "jupyter" / "jupyter_server_config.d" / f"{SERVER_EXTENSION}.json"


def check_built(built: Path = BUILT) -> None:
    if not (built / "package.json").is_file() or not (built / "static").is_dir():
        raise NotInstalled(
            f"no built JupyterLab extension in {built}: build it with `make setup` (or "
            "`python -m gpushare_hub.notebook.build`; needs Node.js and npm) before installing or "
            "making the wheelhouse"
        )


def install(prefix: Path, copy: bool = False, built: Path = BUILT) -> list[Path]:
    """Install both under ``prefix``; the paths written. A link or copy already there is replaced."""
    check_built(built)
    target = labextension_dir(prefix)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    if copy:
        shutil.copytree(built, target, ignore=shutil.ignore_patterns(".*"))
    else:
        target.symlink_to(built, target_is_directory=True)
    config = server_config(prefix)
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {SERVER_EXTENSION: True}}}, indent=2))
    return [target, config]


def check_installed(prefix: Path) -> None:
    """Raise :class:`NotInstalled` naming what is missing under ``prefix``."""
    check_built(labextension_dir(prefix))
    config = server_config(prefix)
    try:
        enabled = json.loads(config.read_text())["ServerApp"]["jpserver_extensions"][SERVER_EXTENSION]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise NotInstalled(f"{config} does not enable {SERVER_EXTENSION}: {err}") from None
    if enabled is not True:
        raise NotInstalled(f"{config} disables {SERVER_EXTENSION}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_hub.notebook.install", description=__doc__)
    parser.add_argument("--prefix", type=Path, default=Path(sys.prefix), help="default: this Python's")
    parser.add_argument("--copy", action="store_true", help="copy the built extension instead of linking")
    parser.add_argument("--check", action="store_true", help="only check that both are installed")
    args = parser.parse_args(argv)
    try:
        if args.check:
            check_installed(args.prefix)
            print(f"{LABEXTENSION_NAME} and {SERVER_EXTENSION} are installed under {args.prefix}")
        else:
            for path in install(args.prefix, copy=args.copy):
                print(f"installed {path}")
    except (NotInstalled, OSError) as err:
        print(f"gpushare_hub.notebook.install: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

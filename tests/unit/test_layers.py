"""The floors written in .importlinter hold, and the contracts are not vacuous: a forbidden import
added to a copy of the package breaks them, naming the import."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", str(where / ".importlinter")],
        cwd=where,
        env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "gpushare_hub", tmp_path / "gpushare_hub", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_package_keeps_every_contract(copy: Path):
    result = lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("core/cards.py", "import kubernetes.client", "The core is pure"),
        ("core/ledger.py", "from gpushare_hub.kube import informer", "core is not allowed to import"),
        ("extender/wire.py", "import gpushare_hub.plugin.devices", "extender is not allowed to import"),
        ("plugin/app.py", "import gpushare_hub.localcluster.pki", "plugin is not allowed to import"),
        ("inspect/cli.py", "import jupyterhub.app", "load neither JupyterHub nor"),
        ("notebook/status.py", "import jupyterhub.app", "loads neither JupyterHub's code"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(copy: Path, module: str, line: str, broken: str):
    path = copy / "gpushare_hub" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    result = lint(copy)
    assert result.returncode == 1
    assert broken in result.stdout, result.stdout


def test_no_top_level_extender_or_plugin_package_is_installed():
    """The extender and the device plugin are gpushare_hub.extender and gpushare_hub.plugin; the wheel
    holds no other top-level package."""
    code = "import importlib.util as u; print(u.find_spec('extender'), u.find_spec('plugin'))"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"]
    assert not (ROOT / "extender").exists() and not (ROOT / "plugin").exists()

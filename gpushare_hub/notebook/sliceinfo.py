"""What a notebook server got, read from its own environment (the device plugin's Allocate). Pure.

:func:`read_slice` turns the environment into a :class:`SliceInfo`; :func:`render_html` is the
page ``/user/<name>/gpushare`` shows (see ``slicepage.py``). The caps are the ones in force in
every process of the container: the start-up hook's PyTorch cap (``GPUSHARE_MEMORY_LIMIT_MIB``
of ``GPUSHARE_CARD_MEMORY_MIB``), the MPS limit on MPS nodes, and the limits other frameworks
read from the environment.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_hub.core import cardmemory
from gpushare_hub.core.digits import ascii_int
from gpushare_hub.core.names import CARD_UUIDS_ENV, LEDGER_DIR_ENV, SIM_USAGE_DIR_ENV

# Environment variables that frameworks other than PyTorch read as their cap (set by Allocate).
FRAMEWORK_CAPS = (
    ("CuPy", "CUPY_GPU_MEMORY_LIMIT"),
    ("JAX", "XLA_PYTHON_CLIENT_MEM_FRACTION"),
    ("TensorFlow", "TF_FORCE_GPU_ALLOW_GROWTH"),
    ("HAMi-core", "CUDA_DEVICE_MEMORY_LIMIT_0"),
)


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return ascii_int(raw, 18)


@dataclass(frozen=True)
class SliceInfo:
    """The slice of one notebook server; ``None`` where the environment does not say."""

    user: str
    card_uuids: tuple[str, ...]
    card_index: int | None
    slice_gib: int | None
    card_gib: int | None
    limit_mib: int | None
    card_mib: int | None
    mps_limit: str | None
    hook_on_path: bool
    framework_caps: tuple[tuple[str, str, str], ...]  # (framework, variable, value)
    simulated: bool = False  # a simulated card (the demo, the tests): the fake torch's usage counts
    ledger: bool = False  # the start-up hook counts all the server's processes (GPUSHARE_LEDGER_DIR)
    card_cuda_mib: int | None = None  # the card as CUDA gives it (GPUSHARE_CARD_CUDA_MIB)
    context_mib: int = 0  # each GPU process's CUDA context (GPUSHARE_CONTEXT_MIB)

    @property
    def has_gpu(self) -> bool:
        return bool(self.card_uuids)

    @property
    def torch_cap_mib(self) -> int | None:
        """What the start-up hook lets one PyTorch process hold alone in the slice: the slice's part
        of what CUDA gives of the card, less the process's CUDA context (core/cardmemory.py)."""
        if self.mps_limit or self.limit_mib is None or not self.card_mib:
            return None
        cuda = self.card_cuda_mib or self.card_mib
        return max(0, cardmemory.usable_mib(self.limit_mib, self.card_mib, cuda) - self.context_mib)

    @property
    def torch_fraction(self) -> float | None:
        """That cap as a fraction of the card as CUDA gives it (none on MPS nodes: MPS caps)."""
        cap = self.torch_cap_mib
        if cap is None:
            return None
        return min(1.0, cap / (self.card_cuda_mib or self.card_mib or 1))

    def summary(self) -> str:
        """One line: ``5 GiB of card GPU-sim-nb-1-0 (15 GiB), PyTorch capped at 33.3%``."""
        if not self.has_gpu:
            return "no GPU slice: this server's environment names no card"
        card = ", ".join(self.card_uuids)
        amount = f"{self.slice_gib} GiB" if self.slice_gib is not None else "a share"
        whole = f" ({self.card_gib} GiB)" if self.card_gib is not None else ""
        text = f"{amount} of card {card}{whole}"
        if self.mps_limit:
            return f"{text}, MPS limit {self.mps_limit}"
        if self.torch_fraction is not None and not self.hook_on_path:
            return f"{text}, PyTorch NOT capped (the start-up hook is not loaded)"
        if self.torch_fraction is not None:
            return f"{text}, PyTorch capped at {self.torch_fraction:.1%}"
        return text


def read_slice(env: Mapping[str, str], hook_loaded: bool | None = None) -> SliceInfo:
    """The slice this environment describes. ``hook_loaded``: whether this process imported the
    start-up hook (the page knows); ``None``: guess from ``PYTHONPATH``."""
    visible = (env.get(CARD_UUIDS_ENV) or env.get("NVIDIA_VISIBLE_DEVICES", "")).strip()
    uuids = tuple(u for u in visible.split(",") if u and u not in ("void", "none", "all"))
    if hook_loaded is None:
        hook_loaded = any("pyhook" in p for p in env.get("PYTHONPATH", "").split(":"))
    caps = tuple((fw, var, env[var]) for fw, var in FRAMEWORK_CAPS if env.get(var))
    return SliceInfo(
        user=env.get("JUPYTERHUB_USER", ""),
        card_uuids=uuids,
        card_index=_int(env, "ALIYUN_COM_GPU_MEM_IDX"),
        slice_gib=_int(env, "ALIYUN_COM_GPU_MEM_CONTAINER") or _int(env, "ALIYUN_COM_GPU_MEM_POD"),
        card_gib=_int(env, "ALIYUN_COM_GPU_MEM_DEV"),
        limit_mib=_int(env, "GPUSHARE_MEMORY_LIMIT_MIB"),
        card_mib=_int(env, "GPUSHARE_CARD_MEMORY_MIB"),
        mps_limit=env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") or None,
        hook_on_path=hook_loaded,
        framework_caps=caps,
        simulated=bool(env.get(SIM_USAGE_DIR_ENV)),
        ledger=bool(env.get(LEDGER_DIR_ENV, "").strip()),
        card_cuda_mib=_int(env, cardmemory.CARD_CUDA_ENV),
        context_mib=_int(env, cardmemory.CONTEXT_ENV) or 0,
    )


def as_json(info: SliceInfo) -> dict[str, object]:
    return {
        "user": info.user,
        "card_uuids": list(info.card_uuids),
        "card_index": info.card_index,
        "slice_gib": info.slice_gib,
        "card_gib": info.card_gib,
        "limit_mib": info.limit_mib,
        "card_mib": info.card_mib,
        "torch_fraction": info.torch_fraction,
        "torch_cap_mib": info.torch_cap_mib,
        "card_cuda_mib": info.card_cuda_mib or info.card_mib,
        "mps_limit": info.mps_limit,
        "hook_on_path": info.hook_on_path,
        "ledger": info.ledger,
        "framework_caps": {var: value for _, var, value in info.framework_caps},
        "summary": info.summary(),
    }


def render_html(info: SliceInfo, lab_url: str, api_url: str) -> str:
    """The page: the card, the slice, the caps in force, and a link on to JupyterLab."""
    e = html.escape
    rows: list[tuple[str, str, str]] = [
        ("card", ", ".join(info.card_uuids) or "none", "gpushare-card"),
        ("card index on its node", "" if info.card_index is None else str(info.card_index), "gpushare-index"),
        ("slice", "" if info.slice_gib is None else f"{info.slice_gib} GiB", "gpushare-slice"),
        ("card size", "" if info.card_gib is None else f"{info.card_gib} GiB", "gpushare-card-gib"),
    ]
    if info.mps_limit:
        rows.append(("MPS memory limit (every CUDA program)", info.mps_limit, "gpushare-mps"))
    if info.torch_fraction is not None:
        rows.append(
            (
                "PyTorch cap (start-up hook)",
                f"{info.torch_fraction:.1%} of the card = {info.torch_cap_mib} MiB of "
                f"{info.card_cuda_mib or info.card_mib} MiB"
                + ("" if info.hook_on_path else " (hook NOT on PYTHONPATH: not in force)"),
                "gpushare-torch",
            )
        )
    if info.ledger and info.has_gpu:
        rows.append(("whole server", WHOLE_SERVER, "gpushare-ledger"))
    rows += [(f"{fw} ({var})", value, "gpushare-env") for fw, var, value in info.framework_caps]
    hint = DEMO_HINT if info.simulated else ""
    body = "\n".join(f'<tr class="{cls}"><th>{e(k)}</th><td>{e(v)}</td></tr>' for k, v, cls in rows if v)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Your GPU slice</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 52em; }}
th {{ text-align: left; padding-right: 1.5em; font-weight: normal; color: #555; }}
td {{ font-family: monospace; }}
.gpushare-summary {{ font-size: 1.3em; margin: 1em 0; }}
</style></head>
<body>
<h1>Your GPU slice</h1>
<p class="gpushare-summary" data-slice-gib="{e("" if info.slice_gib is None else str(info.slice_gib))}"
   data-card="{e(",".join(info.card_uuids))}">{e(info.summary())}</p>
<table id="gpushare-slice">
{body}
</table>
<p>These come from this server's environment, set by the gpushare device plugin when the
kubelet started the container; every kernel, terminal and subprocess inherits them. The
PyTorch cap is applied by the start-up hook when <code>torch</code> is imported.
Other users' servers may share this card: the hub's "GPU slices" page shows who.</p>
{hint}<p><a href="{e(lab_url)}">Open JupyterLab</a> · <a href="{e(api_url)}">as JSON</a></p>
</body></html>
"""


# On a simulated card nothing real holds memory: the demo's fake PyTorch does, and the plugin
# counts what it holds as this server's usage (the JupyterLab status bar shows it).
WHOLE_SERVER = (
    "one slice for all of this server's PyTorch processes together: a second kernel gets what the first "
    "left (the start-up hook's container ledger)"
)
DEMO_HINT = """<p class="gpushare-demo-hint">This card is simulated. To see the status bar in
JupyterLab move, open a terminal there and run <code>python -m gpushare_hub.demo.fakealloc 3</code>:
it holds 3 GiB through a fake PyTorch until Ctrl-C (the device plugin reads it within 15 s).
Past the slice it fails as PyTorch would, with gpushare-hub's note;
<code>gpushare-selftest</code> checks the cap.</p>
"""

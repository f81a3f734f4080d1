"""Hold some GPU memory through the fake torch, for the demo: ``python -m gpushare_hub.demo.fakealloc 3``.

Run in a notebook's terminal (or ``!python -m ...`` in a cell) on the demo's simulated cards:
it takes the given GiB through the fake ``torch`` (:mod:`gpushare_hub.demo.fakegpu`), capped by
the start-up hook like real PyTorch, and holds it until Ctrl-C or ``--seconds``. The simulated
device plugin then reports the memory as this notebook's usage. Asking more than the slice
shows PyTorch's out-of-memory error with gpushare-hub's explanation under it. ``--busy 60``
claims 60% of the card's SMs as well, so the dashboard shows the notebook at work rather than
idle on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time

from .fakegpu import site_dir

GIB = 1024**3


def gib_amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB (e.g. 3 or 0.5)") from None
    if not 0 < value <= 1024:
        raise argparse.ArgumentTypeError(f"{text} GiB: give a size above 0 and at most 1024")
    return value


def say(text: str) -> None:
    """Print, unless nobody reads any more: a holder started in the background of a kernel
    that has since stopped writes into a closed pipe, and must keep holding all the same."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        with contextlib.suppress(OSError):  # the interpreter's own flush at exit would fail too
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpushare_hub.demo.fakealloc",
        description="Hold GPU memory through the fake torch until Ctrl-C (the demo's simulated cards).",
    )
    p.add_argument("gib", type=gib_amount, help="how much to hold, in GiB (e.g. 3 or 0.5)")
    p.add_argument(
        "--seconds", type=float, default=None, help="hold this long, then exit (default: until Ctrl-C)"
    )
    p.add_argument(
        "--busy",
        type=int,
        default=0,
        choices=range(0, 101),
        metavar="PERCENT",
        help="claim to keep this share of the card's SMs busy (default 0: holding memory, idle)",
    )
    args = p.parse_args(argv)
    os.environ["GPUSHARE_SIM_UTIL"] = str(args.busy)
    sys.path.insert(0, str(site_dir()))  # the fake, even where a real torch is installed
    torch = importlib.import_module("torch")

    held = torch.empty(int(args.gib * GIB), dtype=torch.uint8, device="cuda")
    card = os.environ.get("NVIDIA_VISIBLE_DEVICES", "the fake card")
    say(
        f"holding {args.gib:g} GiB of GPU memory on {card} (pid {os.getpid()}); "
        + ("Ctrl-C to free it" if args.seconds is None else f"for {args.seconds:g} s")
    )
    try:
        if args.seconds is None:
            while True:
                time.sleep(3600)
        time.sleep(args.seconds)
    except KeyboardInterrupt:
        pass
    del held
    say("freed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

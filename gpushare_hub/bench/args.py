"""Argument types shared by the benchmarks' command lines."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """A count of nodes, requests, renders, pods...: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too few; give 1 or more")
    return value

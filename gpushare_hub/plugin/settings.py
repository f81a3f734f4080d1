"""What one device plugin serves, and where: the node, the resource names, the kubelet's folder."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpushare_hub.core.overcommit import Overcommit
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

from .response import Isolation

DEFAULT_DIR = "/var/lib/kubelet/device-plugins"


@dataclass
class Settings:
    node: str
    names: ResourceNames = DEFAULT_NAMES
    reserve_fraction: float = 0.0
    plugin_dir: str = DEFAULT_DIR
    socket_name: str = "gpushare-hub.sock"
    count_socket_name: str = "gpushare-hub-count.sock"  # the aliyun.com/gpu-count endpoint
    # Containers served but whose pod is not marked assigned yet, kept across plugin restarts.
    served_file: str = ""
    isolation: Isolation = field(default_factory=Isolation)
    # A card holds more slices than its memory, idle ones hibernated (factor 1: off), and where
    # the pods' doors are (plugin/doors.py).
    overcommit: Overcommit = field(default_factory=Overcommit)
    hibernation_dir: str = ""

"""Memory isolation for GPU slices: the Python start-up hook, MPS and CDI settings, per-pod usage.

The pure parts (what a container's Allocate response holds, how a process maps to its pod,
who is over their slice) live here; the device plugin does the I/O.
"""

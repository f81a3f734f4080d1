"""The DRA kubelet plugin: ResourceSlices with consumable GPU memory, Prepare/Unprepare (docs/dra.md)."""

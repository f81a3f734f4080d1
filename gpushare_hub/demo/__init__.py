"""``gpushare-demo``: the whole stack on one machine, for a newcomer, in one command.

The local cluster (simulated Tesla T4 nodes), the dedicated scheduler and the extender, the device
plugin and the local notebook nodes, and JupyterHub with GPUShareSpawner and the GPU-slices
dashboard. Modules: the ``--cards`` value (``cards.py``), the demo's catalogue (``catalogue.py``),
the ready file (``readyfile.py``), the demo logins (``auth.py``), the command (``cli.py``). What a
notebook server shows about its slice is the product's ``gpushare_hub.notebook``.
"""

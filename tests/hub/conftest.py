"""Hub tier: a real JupyterHub and configurable-http-proxy with a plain KubeSpawner, our scheduler
and extender, and local notebook nodes whose node agent runs each notebook as a process on its
pod IP after asking our device plugin to Allocate (fixtures for the cluster in tests/conftest.py;
the session's hub and notebook nodes, ``hub`` and ``notebook_nodes``, in tests/support/hub_session.py,
shared with the browser and fuzz tiers; the helpers they share in tests/support/hub_helpers.py).
"""

"""The gpushare hub service: the "GPU slices" dashboard, its JSON API and Prometheus metrics.

Run it hub-managed (:func:`configure_hub` in ``jupyterhub_config.py``) or as an external
service (``python -m gpushare_hub.service --help``).
"""

from .hubconfig import CONFIG_ENV, configure_hub
from .hubroles import admin_scope, metrics_scope

__all__ = ["CONFIG_ENV", "admin_scope", "configure_hub", "metrics_scope"]

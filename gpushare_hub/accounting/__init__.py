"""GiB-hour accounting kept on disk, shared by the hub service (which writes it) and the spawner
(which reads it): :mod:`.store`. The counting itself is pure: :mod:`gpushare_hub.core.budget`."""

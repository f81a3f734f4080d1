"""``gpushare-replay``: replay a GPU-sharing pod trace against a cluster with the core's policies."""

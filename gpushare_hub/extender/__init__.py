"""The gpushare-hub scheduler extender: filter, prioritize and bind for kube-scheduler."""

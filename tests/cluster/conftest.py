"""Cluster tier: real etcd, kube-apiserver, kube-scheduler and kwok (fixtures in tests/conftest.py)."""

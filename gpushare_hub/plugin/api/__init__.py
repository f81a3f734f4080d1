"""Python code generated from the kubelet's device plugin API v1beta1.

``deviceplugin_v1beta1.proto`` is copied unchanged from ``k8s.io/kubelet`` at the
pinned Kubernetes version (``pkg/apis/deviceplugin/v1beta1/api.proto``). To
regenerate after changing the pin, from the repository root::

    make proto

which copies the proto from the Go module cache and runs grpcio-tools
(``python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=.``).
"""

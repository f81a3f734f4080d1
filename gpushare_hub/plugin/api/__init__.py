"""Python code generated from the kubelet's plugin APIs.

* ``deviceplugin_v1beta1.proto``: the device plugin API (``pkg/apis/deviceplugin/v1beta1``);
* ``dra_v1.proto``: the DRA kubelet plugin API, ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  (``pkg/apis/dra/v1``);
* ``pluginregistration_v1.proto``: the kubelet's plugin watcher registration, served by the DRA
  plugin (``pkg/apis/pluginregistration/v1``).

Each is copied unchanged from ``k8s.io/kubelet`` at the pinned Kubernetes version. To
regenerate after changing the pin, from the repository root::

    make proto

which copies the protos from the Go module cache and runs grpcio-tools
(``python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=.``).
"""

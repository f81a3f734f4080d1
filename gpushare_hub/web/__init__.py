"""What the HTTP servers of the package share (tornado, no hub, no Kubernetes client): the
extender's verbs and the hub service import it; it imports only tornado and the core."""

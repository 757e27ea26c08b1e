"""kube-icl simulator."""

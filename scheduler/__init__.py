"""kube-icl scheduler."""

"""The kubelet plugin-registration API."""

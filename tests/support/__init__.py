"""Test doubles and harnesses (fake API server, in-memory KubeAPI, kubelet harness): test code, not product."""

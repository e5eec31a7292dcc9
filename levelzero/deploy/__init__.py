"""Deployment files shipped as package data: the systemd unit, the example configuration and
the environment-file template (`levelzero install-files DIR` writes them out). No code."""

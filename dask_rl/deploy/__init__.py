"""Deployment artefacts: Kubernetes manifests for the dask-kubernetes operator (no Dask)."""

"""Attention backends: ours (`fa4`), the exact reference, the FA4 algorithm model, and the peers.

``get_backend(name)`` returns one; ``BACKENDS`` maps the registered names to factories. Modules are
imported lazily, so a backend whose package is missing is a recorded skip, never an import error here.
"""
from .base import BACKENDS, Backend, UnknownBackendError, get_backend, register_backend

register_backend("reference", "experiments.backends.reference:ReferenceBackend")
register_backend("fa4_model", "experiments.backends.fa4_model:FA4ModelBackend")
register_backend("sdpa_cudnn", "experiments.backends.sdpa:cudnn")
register_backend("sdpa_flash", "experiments.backends.sdpa:flash")
register_backend("sdpa_efficient", "experiments.backends.sdpa:efficient")
register_backend("flex", "experiments.backends.flex:FlexBackend")
register_backend("fa4_official", "experiments.backends.fa4_official:FA4OfficialBackend")
register_backend("fa4_official_det", "experiments.backends.fa4_official:deterministic")
register_backend("fa4", "experiments.backends.fa4:FA4Backend")

__all__ = ["BACKENDS", "Backend", "UnknownBackendError", "get_backend", "register_backend"]

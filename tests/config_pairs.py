"""A check shared by the tests of DEFAULTS' (non-causal, causal) switch pairs (kernels/config.py)."""
from __future__ import annotations

from kernels.config import AttnConfig


def check_default_pair(name: str, on_cells) -> None:
    """``name``: resolve() fills True at the (hdim, causal) cells ``on_cells`` and leaves None everywhere else (left
    out of to_dict(): the config hash of before the field); an explicit True / False is its own config."""
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            on = AttnConfig(**{name: True}).resolve("sm90", hd, causal)
            off = AttnConfig(**{name: False}).resolve("sm90", hd, causal)
            assert on.to_dict()[name] is True and name not in off.to_dict()
            if (hd, causal) in on_cells:
                assert r == on and off.config_hash() != r.config_hash()
                continue
            assert getattr(r, name) is None and name not in r.to_dict()
            assert off.config_hash() == r.config_hash() and on.config_hash() != r.config_hash()
    assert AttnConfig(**{name: True}).op_string == f'{{"{name}":true}}'

"""A family's model skeleton without its weights: every parameter on the meta device.

Both halves build models this way (the streamed forward of `verify --forward` and `sensitivity`; the loaders),
so it lives with the families rather than in either of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["parameters_on_meta"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers is replaced by an empty one on the meta device.

    It patches `nn.Module.register_parameter` for the process (as accelerate's `init_empty_weights` does):
    a module built on another thread meanwhile gets meta parameters too.
    """
    from torch import nn

    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=False)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original

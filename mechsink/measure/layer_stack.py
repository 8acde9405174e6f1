"""A model's per-layer weights read as one ``[layer, ...]`` tensor without copying them.

``model.W_out`` on a TransformerBridge stacks every block's down projection into a new tensor:
on Qwen2.5-1.5B that is 28 x 8960 x 1536 float32, 1.4 GiB held beside the weights for the whole
census, although the super-neuron measurements read only a few entries of it per layer.
:class:`LayerStack` holds the blocks' own tensors (views of the weights) and answers the
indexing the measurements do (``w[layer]``, ``w[layer, ...]``, ``w[layers, rows, cols]`` with
integer tensors) with the same values the stacked tensor would give; anything else (a torch
function, a tensor method) works on the stacked tensor, built for that call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError

_METADATA = frozenset({"shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_cuda",
                       "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_nested", "grad_fn",
                       "grad", "names", "itemsize", "is_leaf", "output_nr", "_version"})
_CONVERT = {torch.Tensor.detach: lambda t, *a, **k: t.detach(),
            torch.Tensor.to: lambda t, *a, **k: t.to(*a, **k),
            torch.Tensor.cpu: lambda t, *a, **k: t.cpu(*a, **k),
            torch.Tensor.float: lambda t, *a, **k: t.float(*a, **k)}
_META_CALLS = (torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.__len__,
               torch.Tensor.is_floating_point, torch.Tensor.is_contiguous,
               torch.Tensor.element_size, torch.Tensor.get_device)


class LayerStack(torch.Tensor):
    """Equal-shaped per-layer tensors that index like ``torch.stack(layers)``.

    A tensor (shape, dtype and device of the stack, so type checks and shape checks pass)
    that holds no storage of its own: ``[layer]``, ``[layer, ...]`` and integer-tensor
    indexing read the layers; ``detach``/``to``/``cpu``/``float`` convert per layer (no copy
    when nothing changes); any other operation runs on :meth:`materialize`'s stacked copy."""

    _layers: tuple[Tensor, ...]

    @staticmethod
    def __new__(cls, layers: Sequence[Tensor]) -> LayerStack:
        layers = tuple(t.detach() for t in layers)
        if not layers or len({(t.shape, t.dtype, t.device) for t in layers}) != 1:
            raise BadInputError("a LayerStack needs at least one layer, all of one shape, "
                                "dtype and device.")
        first = layers[0]
        self = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, (len(layers), *first.shape), dtype=first.dtype, device=first.device,
            requires_grad=False)
        self._layers = layers
        return self

    def __init__(self, layers: Sequence[Tensor]) -> None:  # all done in __new__
        super().__init__()

    def materialize(self) -> Float[Tensor, "layer ..."]:
        """The stacked tensor (a copy of every layer)."""
        return torch.stack(self._layers)

    def _each(self, fn: Callable[[Tensor], Tensor]) -> LayerStack:
        out = [fn(t) for t in self._layers]
        return self if all(a is b for a, b in zip(out, self._layers, strict=True)) \
            else LayerStack(out)

    def _index(self, index: Any) -> Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        first, rest = parts[0], parts[1:]
        if isinstance(first, int) or (isinstance(first, Tensor) and first.ndim == 0
                                      and _integer(first)):
            layer = self._layers[int(first)]
            return layer[rest] if rest else layer
        if (isinstance(first, Tensor) and len(rest) == self.ndim - 1
                and all(isinstance(p, Tensor) and _integer(p) for p in parts)):
            return self._gather(first, rest)
        return self.materialize()[_materialized(index)]

    def _gather(self, layers: Tensor, rest: tuple[Tensor, ...]) -> Tensor:
        """``stack[layers, *rest]`` for integer index tensors (broadcast), one layer at a time."""
        n = len(self._layers)
        idx = [i.to(self.device) for i in torch.broadcast_tensors(layers, *rest)]
        out = torch.empty(idx[0].shape, dtype=self.dtype, device=self.device)
        for layer in torch.unique(idx[0]).tolist():
            if not -n <= layer < n:
                raise IndexError(f"layer index {layer} is out of range for {n} layers")
            hit = idx[0] == layer
            out[hit] = self._layers[layer][tuple(i[hit] for i in idx[1:])]
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__getitem__ and isinstance(args[0], LayerStack):
                return args[0]._index(args[1])
            if func in _CONVERT and isinstance(args[0], LayerStack):
                return args[0]._each(lambda t: _CONVERT[func](t, *args[1:], **kwargs))
            owner = getattr(func, "__self__", None)
            if func in _META_CALLS or (getattr(func, "__name__", "") == "__get__"
                                       and getattr(owner, "__name__", "") in _METADATA):
                return func(*args, **kwargs)
            return func(*_materialized(args), **_materialized(kwargs))

    __torch_dispatch__ = None  # every operation is answered above, never by the dispatcher

    def __repr__(self, *args: Any, **kwargs: Any) -> str:
        return f"LayerStack({tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def _integer(t: Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _materialized(x: Any) -> Any:
    if isinstance(x, LayerStack):
        return x.materialize()
    if isinstance(x, (list, tuple)):
        return type(x)(_materialized(v) for v in x)
    if isinstance(x, dict):
        return {k: _materialized(v) for k, v in x.items()}
    return x


def down_projection_layers(model: Any) -> LayerStack | None:
    """Every block's MLP down projection ``[d_mlp, d_model]`` as a :class:`LayerStack` (the
    blocks' own tensors, no copy), or None when a block has none of one shape (the caller
    falls back to the stacked ``model.W_out``, which says why)."""
    return _block_layers(model, lambda block: block.mlp.W_out)


def head_output_layers(model: Any) -> LayerStack | None:
    """Every block's per-head attention output projection ``[head, d_head, d_model]`` as a
    :class:`LayerStack`, or None (the caller falls back to the stacked ``model.W_O``). The
    stacked copy is what ``model.W_O`` builds: 1 GiB on Llama-3-8B's shapes in bfloat16,
    held beside the weights for the whole census, which reads one layer at a time."""
    return _block_layers(model, lambda block: block.attn.W_O)


def _block_layers(model: Any, weight: Callable[[Any], Tensor]) -> LayerStack | None:
    """``weight(block)`` of every block, detached, as a :class:`LayerStack`; None when a block
    has none, or they differ in shape."""
    try:
        layers = [weight(block).detach() for block in model.blocks]
        return LayerStack(layers) if len(layers) == int(model.cfg.n_layers) else None
    except (AttributeError, RuntimeError, TypeError, BadInputError):
        return None

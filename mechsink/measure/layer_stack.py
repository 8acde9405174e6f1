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


class LayerStack:
    """Equal-shaped per-layer tensors that index like ``torch.stack(layers)``."""

    def __init__(self, layers: Sequence[Tensor]) -> None:
        layers = tuple(layers)
        if not layers or len({(t.shape, t.dtype, t.device) for t in layers}) != 1:
            raise BadInputError("a LayerStack needs at least one layer, all of one shape, "
                                "dtype and device.")
        self._layers = layers

    # --- what a tensor tells about itself -----------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self._layers), *self._layers[0].shape))

    @property
    def ndim(self) -> int:
        return self._layers[0].ndim + 1

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    @property
    def dtype(self) -> torch.dtype:
        return self._layers[0].dtype

    @property
    def device(self) -> torch.device:
        return self._layers[0].device

    def __len__(self) -> int:
        return len(self._layers)

    def __repr__(self) -> str:
        return f"LayerStack({tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    # --- cheap conversions (per layer; no copy when nothing changes) --------------------------
    def _each(self, fn: Callable[[Tensor], Tensor]) -> LayerStack:
        out = [fn(t) for t in self._layers]
        return self if all(a is b for a, b in zip(out, self._layers, strict=True)) \
            else LayerStack(out)

    def detach(self) -> LayerStack:
        return LayerStack([t.detach() for t in self._layers])

    def to(self, *args: Any, **kwargs: Any) -> LayerStack:
        return self._each(lambda t: t.to(*args, **kwargs))

    def cpu(self) -> LayerStack:
        return self._each(lambda t: t.cpu())

    def float(self) -> LayerStack:
        return self._each(lambda t: t.float())

    def materialize(self) -> Float[Tensor, "layer ..."]:
        """The stacked tensor (a copy of every layer)."""
        return torch.stack(self._layers)

    # --- indexing ------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        first, rest = parts[0], parts[1:]
        if isinstance(first, int) or (isinstance(first, Tensor) and first.ndim == 0
                                      and not first.dtype.is_floating_point
                                      and first.dtype != torch.bool):
            layer = self._layers[int(first)]
            return layer[rest] if rest else layer
        if (isinstance(first, Tensor) and len(rest) == self.ndim - 1
                and all(isinstance(p, Tensor) and not p.dtype.is_floating_point
                        and p.dtype != torch.bool for p in parts)):
            return self._gather(first, rest)
        return self.materialize()[index]

    def _gather(self, layers: Tensor, rest: tuple[Tensor, ...]) -> Tensor:
        """``stack[layers, *rest]`` for integer index tensors (broadcast), one layer at a time."""
        idx = torch.broadcast_tensors(layers, *rest)
        layer_idx = idx[0].to(self.device)
        out = torch.empty(layer_idx.shape, dtype=self.dtype, device=self.device)
        for layer in torch.unique(layer_idx).tolist():
            if not -len(self._layers) <= layer < len(self._layers):
                raise IndexError(f"layer index {layer} is out of range for "
                                 f"{len(self._layers)} layers")
            hit = layer_idx == layer
            out[hit] = self._layers[layer][tuple(i.to(self.device)[hit] for i in idx[1:])]
        return out

    # --- everything else: on the stacked tensor -------------------------------------------------
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        return func(*_materialized(args), **_materialized(kwargs or {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)


def _on_stacked(op: str) -> Callable[..., Any]:
    def run(self: LayerStack, *args: Any) -> Any:
        return getattr(self.materialize(), op)(*_materialized(args))

    run.__name__ = op
    return run


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "matmul",
            "rmatmul", "pow", "neg", "abs", "eq", "ne", "lt", "le", "gt", "ge"):
    setattr(LayerStack, f"__{_op}__", _on_stacked(f"__{_op}__"))


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
    try:
        layers = [block.mlp.W_out.detach() for block in model.blocks]
        return LayerStack(layers) if len(layers) == int(model.cfg.n_layers) else None
    except (AttributeError, RuntimeError, TypeError, BadInputError):
        return None

"""Where and in what precision a model loads: a device and dtype, checked before any work."""

from __future__ import annotations

import torch

from mechsink.errors import BadInputError


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """The torch dtype for ``dtype`` (None: float32); a name that is not a floating-point
    dtype is a clear error."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise BadInputError(
            f"unknown dtype {dtype!r}: use float32, float16 or bfloat16."
        )
    return value


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The torch device for ``device`` (None: CUDA when present, else CPU), checked to exist
    before any work: a CUDA device on a build or machine without CUDA is a clear error."""
    if device is None:
        return _default_device()
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BadInputError(f"unknown device {device!r}: use cpu, cuda or cuda:N.") from exc
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(
                f"device {device!r} asked for, but this torch build or machine has no CUDA "
                "device: use --device cpu."
            )
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise BadInputError(f"device {device!r}: there are {torch.cuda.device_count()} "
                                "CUDA devices (cuda:0...).")
    elif target.type == "mps" and not torch.backends.mps.is_available():
        raise BadInputError(f"device {device!r} is not available here: use --device cpu.")
    return target


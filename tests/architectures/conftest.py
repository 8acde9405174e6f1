"""Session fixtures of the architecture suite: every tiny model is built and saved once, loaded
once through ``hf:<folder>`` and once through ``mechsink.wrap``, and its transformers reference
(eager attentions, hidden states, logits) computed once."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.architectures import builder


@dataclass
class Loaded:
    """One architecture's tiny model: the plain transformers model, both mechsink entry points
    and the reference outputs on :data:`builder.PROBE`."""

    arch: str
    folder: Path
    hf: Any
    bridge: Any
    tokens: torch.Tensor
    logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...]
    hidden: tuple[torch.Tensor, ...]


class Suite:
    """Builds and loads on first use, keeps everything for the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, builder.Built] = {}
        self.loaded: dict[str, Loaded | BaseException] = {}

    def folder(self, arch: str) -> Path:
        if arch not in self.built:
            self.built[arch] = builder.save(arch, self.root)
        b = self.built[arch]
        if b.folder is None:
            pytest.fail(f"the tiny {arch} could not be built: {b.error}")
        return b.folder

    def get(self, arch: str) -> Loaded:
        if arch not in self.loaded:
            try:
                self.loaded[arch] = self._load(arch)
            except Exception as exc:  # noqa: BLE001 - every check of this arch reports it
                self.loaded[arch] = exc
        got = self.loaded[arch]
        if isinstance(got, BaseException):
            raise got
        return got

    def _load(self, arch: str) -> Loaded:
        import transformers

        import mechsink

        folder = self.folder(arch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformers.logging.set_verbosity_error()
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), attn_implementation="eager").eval()
            tokens = torch.tensor(builder.PROBE)
            with torch.no_grad():
                out = hf(tokens, output_attentions=True, output_hidden_states=True)
            bridge = mechsink.load_model(f"hf:{folder}", device="cpu")
        # a state-space model (Mamba) returns no attentions: its checks then meet mechsink's
        # own refusal (no softmax attention) rather than a failure of this reference
        return Loaded(arch, folder, hf, bridge, tokens, out.logits,
                      getattr(out, "attentions", None) or (), out.hidden_states)


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    return Suite(tmp_path_factory.mktemp("architectures"))

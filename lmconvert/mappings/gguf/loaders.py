"""What llama.cpp's loaders and converter expect of a GGUF file beyond its metadata, as data: the
tensors each architecture's loader reads (`src/models/<arch>.cpp` in llama.cpp), and the types its
converter (`convert_hf_to_gguf.py`, ModelBase.prepare_tensors) gives some tensors whatever the file
type. GGUF export (convert/export_gguf.py) refuses by name a file llama.cpp would refuse to load,
before writing it. No file I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

QKV = ("attn_q", "attn_k", "attn_v")  # llama.cpp's create_tensor_qkv loads these biases when a file has them
NORMS = ("attn_norm", "ffn_norm", "output_norm")
SSM = ("ssm_conv1d", "ssm_dt")  # the state-space mixers' conv and dt biases: loaded, and required
SSM_ARCHS = ("mamba", "mamba2")
HYBRID_SSM_ARCHS = ("jamba",)  # their Mamba layers require these biases, their attention layers have none
# the biases llama.cpp's loader for each architecture reads (`create_tensor(tn(..., "bias"))` in its
# src/models/<arch>.cpp); a file holding any other is refused by llama.cpp ("wrong number of tensors")
LOADED_BIASES: dict[str, frozenset[str]] = {arch: frozenset(names) for arch, names in {
    "llama": (*QKV, "attn_output", "ffn_gate", "ffn_up", "ffn_down"),
    "qwen2": (*QKV, "output"), "qwen3": QKV, "qwen2moe": QKV, "qwen3moe": QKV, "gemma2": QKV, "gemma3": QKV,
    "olmo2": QKV, "phi3": QKV,
    "gpt2": (*NORMS, "attn_qkv", "attn_output", "ffn_up", "ffn_down"),
    "starcoder2": (*QKV, *NORMS, "attn_output", "ffn_up", "ffn_down"),
    "stablelm": (*QKV, *NORMS),
    "nemotron": (*QKV, *NORMS, "attn_output", "ffn_up", "ffn_down"),
    "gemma": QKV, "granite": (*QKV, "attn_output", "ffn_gate", "ffn_up", "ffn_down"), "smollm3": QKV, "olmo": QKV,
    "granite_swa": (*QKV, "attn_output", "ffn_gate", "ffn_up", "ffn_down"),
    "olmoe": QKV, "phi2": (*QKV, *NORMS, "attn_output", "ffn_up", "ffn_down", "output"),
    "gptneox": (*NORMS, "attn_qkv", "attn_output", "ffn_up", "ffn_down"), "command-r": QKV, "cohere2": QKV,
    "bloom": (*NORMS, "token_embd_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down"),
    "falcon": ("attn_norm", "attn_norm_2", "output_norm"),
    "mpt": (*NORMS, "attn_qkv", "attn_output", "ffn_up", "ffn_down", "attn_q_norm", "attn_k_norm"),
    "deepseek2": ("exp_probs_b",),  # the experts' selection bias, stored as a bias
    "ernie4_5": (*QKV, "attn_output"), "ernie4_5-moe": (*QKV, "attn_output", "exp_probs_b"),
    "minimax-m2": ("exp_probs_b",), "exaone-moe": (*QKV, "exp_probs_b"),
    "exaone": QKV, "seed_oss": QKV, "glm4": QKV, "exaone4": (),
    "starcoder": (*NORMS, "attn_qkv", "attn_output", "ffn_up", "ffn_down"),
    "jais2": (*QKV, *NORMS, "attn_output", "ffn_up", "ffn_down"), "dots1": (*QKV, "exp_probs_b"),
    "glm4moe": (*QKV, "exp_probs_b"), "minicpm3": (), "chatglm": QKV, "lfm2moe": ("exp_probs_b",),
    **dict.fromkeys(("qwen3next", "qwen35", "qwen35moe"), ("ssm_dt",)),  # the gated delta-net's dt_bias
    "gpt-oss": (*QKV, "attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
    **{arch: SSM for arch in SSM_ARCHS + HYBRID_SSM_ARCHS},
    "granitehybrid": (*QKV, "attn_output", "ffn_gate", "ffn_up", "ffn_down", *SSM),  # the conv bias: optional
    "nemotron_h": (*QKV, "attn_output", "ffn_up", "ffn_down", *SSM),
    "nemotron_h_moe": (*QKV, "attn_output", *SSM, "exp_probs_b"),  # nemotron-h.cpp: no MLP (bias) with experts
    "falcon-h1": (*QKV, "attn_output", "ffn_gate", "ffn_up", "ffn_down", *SSM),
    # (mimo2's graph adds no q, k, v bias, afmoe's loader no o bias: each family refuses them)
    "mimo2": (*QKV, "exp_probs_b"), "afmoe": (*QKV, "exp_probs_b"),
    "laguna": ("exp_probs_b",),  # laguna.cpp loads no o bias: the family refuses attention biases
    "gemma4": (),
    "kimi-linear": ("exp_probs_b", "ssm_dt"),  # the selection bias; KDA's dt_bias
}.items()}
# the biases an architecture's loader requires on every layer (`create_tensor(..., 0)`: "missing tensor" without
# them); gpt-oss's attention output bias is one, so a model without attention biases cannot load
REQUIRED_BIASES: dict[str, tuple[str, ...]] = {
    "gpt-oss": ("attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
    **{arch: SSM for arch in SSM_ARCHS},
    "falcon-h1": SSM,  # its loader takes the conv bias as optional, and its graph adds it all the same
}
# the architectures whose llama.cpp loader requires an `output` matrix (a tied model has none)
OUTPUT_REQUIRED = frozenset({"qwen2moe", "olmo2", "stablelm", "nemotron", "olmoe", "phi2", "gptneox", "minimax-m2",
                             "exaone-moe", "dots1", "gpt-oss", "mimo2", "kimi-linear"})


# the architectures whose loader sizes the k norm as the q norm, over the whole width (no GQA)
K_NORM_AS_Q = frozenset({"olmoe"})
# the architectures whose loader reads q/k norms exactly when the model has at least this many layers
QK_NORM_FROM_LAYERS = {"command-r": 64}


# the architectures whose loader reads a plain q (no q LoRA) exactly for these (layers, vocabulary) shapes,
# its "lite" models (DeepSeek-V2-Lite: 27 layers), and q's low-rank pair for every other
PLAIN_Q_WHEN = {"deepseek2": lambda layers, vocab: layers in (26, 27) or (layers == 48 and vocab == 128256)}


# the architectures whose loader reads expert tensors on every layer from leading_dense_block_count on, whatever
# its graph's interleave step says (ERNIE 4.5's: its dense layers after the first sparse one fail to load)
EXPERTS_FROM_FIRST = frozenset({"ernie4_5-moe"})


def _layers(names: list[str]) -> int:
    return len({n.split(".")[1] for n in names if n.startswith("blk.")})


def refused_tensors(arch: str, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why llama.cpp's loader would refuse a file of `arch` holding GGUF tensors of these shapes, if
    it would ("wrong number of tensors", "missing tensor", "wrong shape")."""
    names = list(shapes)
    if arch in PLAIN_Q_WHEN:
        layers, vocab = _layers(names), shapes["token_embd.weight"][0]
        if ("blk.0.attn_q.weight" in shapes) != PLAIN_Q_WHEN[arch](layers, vocab):
            return ("reads a plain q projection (q_lora_rank null) exactly for its lite shapes (26 or 27 layers, or 48 "
                    f"with 128256 tokens), and this model has {layers} layers and "
                    f"{'a plain q' if 'blk.0.attn_q.weight' in shapes else 'a q LoRA'}")
    if arch in K_NORM_AS_Q and shapes.get("blk.0.attn_k_norm.weight", ()) != shapes.get("blk.0.attn_q_norm.weight", ()):
        return "normalises k over as many heads as q, and this model has fewer KV heads (grouped-query attention)"
    if arch in QK_NORM_FROM_LAYERS:
        layers = _layers(names)
        if ("blk.0.attn_q_norm.weight" in shapes) != (layers >= QK_NORM_FROM_LAYERS[arch]):
            return (f"has q/k norms exactly when there are {QK_NORM_FROM_LAYERS[arch]} layers or more, and this "
                    f"model has {layers} layers {'with' if 'blk.0.attn_q_norm.weight' in shapes else 'without'} them")
    if arch in EXPERTS_FROM_FIRST:
        sparse = sorted(int(n.split(".")[1]) for n in names if n.endswith(".ffn_gate_inp.weight"))
        if sparse and sparse != list(range(sparse[0], _layers(names))):
            return (f"reads experts on every layer from the first sparse one ({sparse[0]}) on, and this model's "
                    f"sparse layers are {sparse}")
    loaded = LOADED_BIASES.get(arch, frozenset())
    unloaded = [n for n in names if n.endswith(".bias") and n.split(".")[-2] not in loaded]
    if unloaded:
        return f"loads no {', '.join(unloaded[:3])}{' ...' if len(unloaded) > 3 else ''}"
    missing = [f"blk.{i}.{n}.bias" for i in range(_layers(names)) for n in REQUIRED_BIASES.get(arch, ())
               if f"blk.{i}.{n}.bias" not in shapes]
    if missing:
        return (f"requires {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} (a bias on every layer), "
                "which this model does not have")
    if arch in OUTPUT_REQUIRED and "output.weight" not in names:
        return "requires an output matrix, and this model ties its output to the embeddings"
    return None


# tensors llama.cpp's converter stores as F32 whatever the file type (ModelBase.prepare_tensors: the
# routers, learned positions, any norm, any bias, gpt-oss's stacked [experts, width] ones too: its graph adds
# them with ggml_add_id, which takes F32 only; the short and SSM convolutions' kernels, which ggml_ssm_conv takes
# in F32 only, Kimi's KDA ones too; the state-space A and D, whose names end in no `.weight`), and those it stores
# as F16 rather than ternary
ALWAYS_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "position_embd.weight", "_norm.weight", ".bias",
              "shortconv.conv.weight", "ssm_conv1d.weight", "ssm_conv1d_q.weight", "ssm_conv1d_k.weight",
              "ssm_conv1d_v.weight", ".ssm_a", ".ssm_d")
HALF_WHEN_TERNARY = ("token_embd.weight", "output.weight")


def forced_type(name: str, wanted: str) -> str | None:
    """The GGML type llama.cpp's converter gives this GGUF tensor instead of the file's, if any."""
    if name.endswith(ALWAYS_F32):
        return "F32"
    if wanted in ("TQ1_0", "TQ2_0") and name in HALF_WHEN_TERNARY:
        return "F16"
    return None


__all__ = ["LOADED_BIASES", "forced_type", "refused_tensors"]

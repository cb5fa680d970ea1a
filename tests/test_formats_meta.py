"""Meta's original LLaMA format in and out: tiny Meta checkpoints built from transformers models
(2 model-parallel ranks, LLaMA 2 and LLaMA 3 conventions) with a SentencePiece tokenizer trained
here; fp32 parity, bit-exact round trips, HF export, tokenizers that give the same ids, and refusals.

The Meta checkpoints are made with the test's own inverse of transformers' conversion (below), not
with lmconvert's code, so the two implementations check each other.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
import torch
from click.testing import CliRunner
from hf_models import build_model, load_reference, make_checkpoint, token_batch
from transformers import AutoTokenizer

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical, to_hf

CORPUS = ["The quick brown fox jumps over the lazy dog.", "def add(x, y):\n    return x + y  # 42"] * 40 + \
    ["北京是中国的首都。", "Les élèves étudient à Paris.", "Привет, мир!"] * 2
# no leading space and no literal "<s>": transformers' Metaspace does not prepend "▁" before a leading
# space, and HF tokenizers parse special-token strings in text, where SentencePiece sees plain text
TEXT = "The quick brown fox 跳过了懒狗。 def main():\n    print('héllo, wörld')  # ok\n🚀✨ 1234567 Привет"
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# (HF overrides, params.json extras, tok_embeddings split dim): multiple_of 32 and dim 64 give
# Meta's FFN size int(8 * 64 / 3) = 170 -> 192, and with ffn_dim_multiplier 1.3, 221 -> 224
STYLES: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    "llama2": ({"intermediate_size": 192}, {"vocab_size": -1}, 1),
    "llama3": ({"intermediate_size": 224, "rope_parameters": LLAMA3_ROPE},
               {"ffn_dim_multiplier": 1.3, "rope_theta": 500000.0, "use_scaled_rope": True}, 0),
}


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of convert_llama_weights_to_hf.py's permute: HF's half layout -> Meta's pairs."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def write_meta(model: torch.nn.Module, directory: Path, params: dict[str, Any], shards: int, embed_split: int,
               tokenizer: Path) -> Path:
    """Meta's layout: ColumnParallel (wq, wk, wv, w1, w3, output) split on dim 0, RowParallel (wo, w2)
    on dim 1, tok_embeddings on `embed_split`, norms copied to every rank."""
    cfg, sd = model.config, model.state_dict()
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    full: dict[str, tuple[torch.Tensor, int | None]] = {"tok_embeddings.weight": (sd["model.embed_tokens.weight"],
                                                                                   embed_split)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        full.update({
            f"layers.{i}.attention.wq.weight": (unpermute(sd[p + "self_attn.q_proj.weight"], heads), 0),
            f"layers.{i}.attention.wk.weight": (unpermute(sd[p + "self_attn.k_proj.weight"], kv_heads), 0),
            f"layers.{i}.attention.wv.weight": (sd[p + "self_attn.v_proj.weight"], 0),
            f"layers.{i}.attention.wo.weight": (sd[p + "self_attn.o_proj.weight"], 1),
            f"layers.{i}.feed_forward.w1.weight": (sd[p + "mlp.gate_proj.weight"], 0),
            f"layers.{i}.feed_forward.w2.weight": (sd[p + "mlp.down_proj.weight"], 1),
            f"layers.{i}.feed_forward.w3.weight": (sd[p + "mlp.up_proj.weight"], 0),
            f"layers.{i}.attention_norm.weight": (sd[p + "input_layernorm.weight"], None),
            f"layers.{i}.ffn_norm.weight": (sd[p + "post_attention_layernorm.weight"], None),
        })
    full.update({"norm.weight": (sd["model.norm.weight"], None), "output.weight": (sd["lm_head.weight"], 0)})
    directory.mkdir()
    for rank in range(shards):
        state = {n: (w if dim is None else w.chunk(shards, dim)[rank]).clone() for n, (w, dim) in full.items()}
        torch.save(state, directory / f"consolidated.{rank:02d}.pth")
    (directory / "params.json").write_text(json.dumps(params))
    shutil.copy(tokenizer, directory / "tokenizer.model")
    return directory


def tensors(directory: Path) -> dict[str, dict[str, tuple[torch.dtype, tuple[int, ...], bytes]]]:
    out = {}
    for file in sorted(directory.glob("consolidated.*.pth")):
        state = torch.load(file, weights_only=True)
        out[file.name] = {n: (t.dtype, tuple(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes())
                          for n, t in state.items()}
    return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LLaMA-style SentencePiece BPE model: identity normalisation, byte fallback, split digits."""
    work = tmp_path_factory.mktemp("spm")
    (work / "corpus.txt").write_text("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(input=str(work / "corpus.txt"), model_prefix=str(work / "tok"), vocab_size=320,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, split_digits=True, character_coverage=0.98,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return work / "tok.model"


@pytest.fixture(scope="module", params=list(STYLES))
def case(request: pytest.FixtureRequest, tokenizer: Path,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    hf_overrides, extras, embed_split = STYLES[request.param]
    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer)).vocab_size()
    model = build_model("llama", seed=5, vocab_size=vocab, **hf_overrides)
    cfg = model.config
    params = {"dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers, "n_heads": cfg.num_attention_heads,
              "n_kv_heads": cfg.num_key_value_heads, "vocab_size": vocab, "multiple_of": 32,
              "norm_eps": cfg.rms_norm_eps, **extras}
    directory = tmp_path_factory.mktemp(request.param) / "meta"
    return model, write_meta(model, directory, params, 2, embed_split, tokenizer)


@pytest.fixture(scope="module")
def canonical(case: tuple[torch.nn.Module, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("can") / "canonical"
    meta = to_canonical(case[1], out)
    assert meta.source["format"] == "meta" and meta.source["meta_shards"] == 2
    return out


def test_meta_parity(case: tuple[torch.nn.Module, Path]) -> None:
    model, meta_dir = case
    ids = token_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        ref = model(ids).logits
        ours = lmconvert.load(meta_dir, attention="eager")(ids)
    assert ref.abs().max() > 1.0
    assert (ours - ref).abs().max() <= 1e-5


def test_round_trip_is_byte_identical(case: tuple[torch.nn.Module, Path], canonical: Path, tmp_path: Path) -> None:
    meta_dir = case[1]
    code, err = run("convert", canonical, tmp_path / "meta", "--to", "meta", "--shards", "2")
    assert code == 0, err
    assert tensors(tmp_path / "meta") == tensors(meta_dir)
    assert json.loads((tmp_path / "meta" / "params.json").read_text()) == json.loads(
        (meta_dir / "params.json").read_text())
    assert (tmp_path / "meta" / "tokenizer.model").read_bytes() == (meta_dir / "tokenizer.model").read_bytes()
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == \
        ["consolidated.00.pth", "consolidated.01.pth", "lmconvert-export.json", "params.json", "tokenizer.model"]


def test_meta_to_hf_loads_in_transformers(case: tuple[torch.nn.Module, Path], canonical: Path,
                                          tmp_path: Path) -> None:
    model = case[0]
    to_hf(canonical, tmp_path / "hf")
    ids = token_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        assert (load_reference(tmp_path / "hf")(ids).logits - model(ids).logits).abs().max() <= 1e-5


def test_tokenizer_gives_the_same_ids(tokenizer: Path, canonical: Path, tmp_path: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    to_hf(canonical, tmp_path / "hf")
    for directory in (canonical, tmp_path / "hf"):
        hf = AutoTokenizer.from_pretrained(directory)
        assert hf(TEXT).input_ids == [sp.bos_id()] + sp.encode(TEXT)  # Meta's generation adds BOS
        assert hf(TEXT, add_special_tokens=False).input_ids == sp.encode(TEXT)
        assert any(i >= 3 and sp.id_to_piece(i).startswith("<0x") for i in sp.encode(TEXT))  # byte fallback used
        for role in ("bos", "eos", "unk"):
            sp_id = getattr(sp, f"{role}_id")()
            assert getattr(hf, f"{role}_token_id") == sp_id
            assert getattr(hf, f"{role}_token") == sp.id_to_piece(sp_id)
    assert (canonical / "tokenizer.model").read_bytes() == tokenizer.read_bytes()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (sp.bos_id(), sp.eos_id())


def test_more_ranks_than_kv_heads(case: tuple[torch.nn.Module, Path], canonical: Path, tmp_path: Path) -> None:
    """4 ranks over 2 KV heads: each KV head is repeated on two consecutive ranks, as at 405B MP16."""
    model = case[0]
    code, err = run("convert", canonical, tmp_path / "meta4", "--to", "meta", "--shards", "4")
    assert code == 0, err
    ranks = [torch.load(tmp_path / "meta4" / f"consolidated.{r:02d}.pth", weights_only=True) for r in range(4)]
    wk = "layers.0.attention.wk.weight"
    assert torch.equal(ranks[0][wk], ranks[1][wk]) and not torch.equal(ranks[1][wk], ranks[2][wk])
    ids = token_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        assert (lmconvert.load(tmp_path / "meta4", attention="eager")(ids) - model(ids).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("change, fragments", [
    ({"n_kv_heads": 4}, ["layers.0.attention.wk.weight", "[16, 64]", "[32, 64]"]),
    ({"n_layers": 3}, ["holds 2 layers", "n_layers=3"]),
    ({"multiple_of": 256}, ["feed_forward.w1.weight", "'multiple_of': 256", "implies [128, 64]"]),
    ({"n_heads": 3}, ["dim=64", "n_heads=3"]),
])
def test_inconsistent_params_refused(case: tuple[torch.nn.Module, Path], tmp_path: Path, change: dict[str, Any],
                                     fragments: list[str]) -> None:
    src = tmp_path / "meta"
    shutil.copytree(case[1], src)
    params = json.loads((src / "params.json").read_text())
    (src / "params.json").write_text(json.dumps({**params, **change}))
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert all(f in err for f in fragments), err
    assert not (tmp_path / "out").exists()


def test_missing_rank_refused(case: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    src = tmp_path / "meta"
    shutil.copytree(case[1], src)
    (src / "consolidated.00.pth").unlink()
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and "consolidated.00.pth" in err and "missing" in err


def test_disagreeing_norm_copies_refused(case: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    src = tmp_path / "meta"
    shutil.copytree(case[1], src)
    state = torch.load(src / "consolidated.01.pth", weights_only=True)
    state["layers.1.ffn_norm.weight"] = state["layers.1.ffn_norm.weight"] + 1
    torch.save(state, src / "consolidated.01.pth")
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and "layers.1.ffn_norm.weight on rank 1 differs from rank 0" in err, err


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_malicious_shard_is_never_executed(case: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    src, marker = tmp_path / "meta", tmp_path / "MARKER"
    shutil.copytree(case[1], src)
    state = torch.load(src / "consolidated.01.pth", weights_only=True)
    torch.save({**state, "payload": Evil(marker)}, src / "consolidated.01.pth")
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "consolidated.01.pth" in err and "weights_only=False" in err
    assert not marker.exists()


@pytest.mark.parametrize("tied", [False, True])
def test_hf_llama_to_meta_and_back(tmp_path: Path, tied: bool) -> None:
    """An HF model whose FFN size needs ffn_dim_multiplier (96 from dim 64), written as Meta and read back."""
    hf_dir = make_checkpoint(tmp_path / "hf", tie_word_embeddings=tied)
    to_canonical(hf_dir, tmp_path / "can")
    code, err = run("convert", tmp_path / "can", tmp_path / "meta", "--to", "meta")
    assert code == 0, err
    params = json.loads((tmp_path / "meta" / "params.json").read_text())
    assert (params["multiple_of"], params["ffn_dim_multiplier"]) == (32, 0.56)
    ids = token_batch()
    with torch.no_grad():
        ref = load_reference(hf_dir)(ids).logits
        assert (lmconvert.load(tmp_path / "meta", attention="eager")(ids) - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("model_type, overrides, fragment", [
    ("llama", {"attention_bias": True}, "biases"),
    ("llama", {"head_dim": 32}, "head_dim"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "RoPE"),
    ("qwen3", {}, "QK norm"),
])
def test_export_refuses_what_meta_cannot_express(tmp_path: Path, model_type: str, overrides: dict[str, Any],
                                                 fragment: str) -> None:
    to_canonical(make_checkpoint(tmp_path / "hf", model_type, **overrides), tmp_path / "can")
    code, err = run("convert", tmp_path / "can", tmp_path / "meta", "--to", "meta")
    assert code == 2 and err.count("\n") == 1 and "Meta's format" in err and fragment in err, err
    assert not (tmp_path / "meta").exists()


def test_shard_count_that_does_not_divide(canonical: Path, tmp_path: Path) -> None:
    code, err = run("convert", canonical, tmp_path / "meta", "--to", "meta", "--shards", "3")
    assert code == 2 and "--shards 3" in err and "n_heads=4" in err
    code, err = run("convert", canonical, tmp_path / "x", "--to", "hf", "--shards", "2")
    assert code == 2 and "--shards only applies with --to meta" in err

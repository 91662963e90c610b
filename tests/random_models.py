"""Tiny random-weight GGUFs of the recurrent architectures no small real model exists for.

* ``qwen35`` — hybrid: gated-delta-net recurrent layers and attention layers, the production
  model's (Qwen3.5-4B) architecture; its memory cannot drop part of a sequence.
* ``mamba`` — purely recurrent: no attention and no KV cells at all, only a per-sequence state.

Neither can be downloaded in tests, so each is built at test time: seeded random weights (like
llama.cpp's ``tests/test-llama-archs.cpp``, whose hyper-parameters they follow), the tokenizer and chat
template copied from the Qwen2.5 test model, written with the ``gguf`` package. About 10 MB each
(the copied vocabulary); cached by the caller, never committed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SEED = 1234
STDEV = 0.1
VERSION = "1"  # bump when a layout below changes, so cached files are rebuilt

# qwen35 (hybrid)
N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 1
N_FF = 128
N_LAYER = 4  # full attention every 2nd layer: recurrent, attention, recurrent, attention
SSM_STATE = 32  # head size of the gated delta net (k and v)
SSM_GROUPS = 2  # k heads
SSM_V_HEADS = 2  # v heads (time_step_rank)
SSM_CONV = 4

# mamba (pure recurrent, Mamba-1)
MAMBA_EMBD = 64
MAMBA_LAYER = 2
MAMBA_INNER = 2 * MAMBA_EMBD
MAMBA_STATE = 16
MAMBA_DT_RANK = 4
MAMBA_CONV = 4


def fixture_name(arch: str = "qwen35") -> str:
    if arch == "qwen35":
        spec = f"{VERSION}:{arch}:{SEED}:{N_EMBD}:{N_HEAD}:{N_HEAD_KV}:{N_FF}:{N_LAYER}:{SSM_STATE}"
    else:
        spec = (
            f"{VERSION}:{arch}:{SEED}:{MAMBA_EMBD}:{MAMBA_LAYER}:{MAMBA_INNER}:{MAMBA_STATE}:{MAMBA_DT_RANK}"
        )
    return f"tiny-{arch}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}.gguf"


def _qwen35_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), as llama.cpp's qwen35 loader expects them."""
    head = N_EMBD // N_HEAD
    key_dim = SSM_STATE * SSM_GROUPS
    value_dim = SSM_STATE * SSM_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (N_EMBD, n_vocab),
        "output_norm.weight": (N_EMBD,),
    }
    for il in range(N_LAYER):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (N_EMBD,)
        shapes[f"{blk}.post_attention_norm.weight"] = (N_EMBD,)
        if (il + 1) % 2 == 0:  # full attention; the query carries its output gate (x2)
            shapes[f"{blk}.attn_q.weight"] = (N_EMBD, head * N_HEAD * 2)
            shapes[f"{blk}.attn_k.weight"] = (N_EMBD, head * N_HEAD_KV)
            shapes[f"{blk}.attn_v.weight"] = (N_EMBD, head * N_HEAD_KV)
            shapes[f"{blk}.attn_output.weight"] = (head * N_HEAD, N_EMBD)
            shapes[f"{blk}.attn_q_norm.weight"] = (head,)
            shapes[f"{blk}.attn_k_norm.weight"] = (head,)
        else:  # gated delta net
            shapes[f"{blk}.attn_qkv.weight"] = (N_EMBD, conv_dim)
            shapes[f"{blk}.attn_gate.weight"] = (N_EMBD, value_dim)
            shapes[f"{blk}.ssm_conv1d.weight"] = (SSM_CONV, conv_dim)
            shapes[f"{blk}.ssm_dt.bias"] = (SSM_V_HEADS,)
            shapes[f"{blk}.ssm_a"] = (SSM_V_HEADS,)
            shapes[f"{blk}.ssm_beta.weight"] = (N_EMBD, SSM_V_HEADS)
            shapes[f"{blk}.ssm_alpha.weight"] = (N_EMBD, SSM_V_HEADS)
            shapes[f"{blk}.ssm_norm.weight"] = (SSM_STATE,)
            shapes[f"{blk}.ssm_out.weight"] = (value_dim, N_EMBD)
        shapes[f"{blk}.ffn_gate.weight"] = (N_EMBD, N_FF)
        shapes[f"{blk}.ffn_up.weight"] = (N_EMBD, N_FF)
        shapes[f"{blk}.ffn_down.weight"] = (N_FF, N_EMBD)
    return shapes


def _mamba_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), as llama.cpp's mamba loader expects them."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (MAMBA_EMBD, n_vocab),
        "output_norm.weight": (MAMBA_EMBD,),
    }
    for il in range(MAMBA_LAYER):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (MAMBA_EMBD,)
        shapes[f"{blk}.ssm_in.weight"] = (MAMBA_EMBD, 2 * MAMBA_INNER)
        shapes[f"{blk}.ssm_conv1d.weight"] = (MAMBA_CONV, MAMBA_INNER)
        shapes[f"{blk}.ssm_conv1d.bias"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_x.weight"] = (MAMBA_INNER, MAMBA_DT_RANK + 2 * MAMBA_STATE)
        shapes[f"{blk}.ssm_dt.weight"] = (MAMBA_DT_RANK, MAMBA_INNER)
        shapes[f"{blk}.ssm_dt.bias"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_a"] = (MAMBA_STATE, MAMBA_INNER)
        shapes[f"{blk}.ssm_d"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_out.weight"] = (MAMBA_INNER, MAMBA_EMBD)
    return shapes


def _qwen35_hparams(w: Any) -> None:
    head = N_EMBD // N_HEAD
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1e7)
    w.add_uint32("qwen35.full_attention_interval", 2)
    w.add_array("qwen35.rope.dimension_sections", [head // 4] * 4)
    w.add_uint32("qwen35.ssm.conv_kernel", SSM_CONV)
    w.add_uint32("qwen35.ssm.inner_size", SSM_STATE * SSM_V_HEADS)
    w.add_uint32("qwen35.ssm.state_size", SSM_STATE)
    w.add_uint32("qwen35.ssm.time_step_rank", SSM_V_HEADS)
    w.add_uint32("qwen35.ssm.group_count", SSM_GROUPS)


def _mamba_hparams(w: Any) -> None:
    w.add_embedding_length(MAMBA_EMBD)
    w.add_block_count(MAMBA_LAYER)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_uint32("mamba.ssm.conv_kernel", MAMBA_CONV)
    w.add_uint32("mamba.ssm.inner_size", MAMBA_INNER)
    w.add_uint32("mamba.ssm.state_size", MAMBA_STATE)
    w.add_uint32("mamba.ssm.time_step_rank", MAMBA_DT_RANK)


ARCHS: dict[str, tuple[Callable[[int], dict[str, tuple[int, ...]]], Callable[[Any], None]]] = {
    "qwen35": (_qwen35_shapes, _qwen35_hparams),
    "mamba": (_mamba_shapes, _mamba_hparams),
}


def _copy_tokenizer(reader: Any, writer: Any) -> int:
    """Copy tokenizer.* keys (vocabulary, merges, specials, chat template); returns the vocab size."""
    import gguf

    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        value = field.contents()
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, value, value_type)
    if n_vocab == 0:
        raise ValueError("the source GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def build(arch: str, tokenizer_gguf: Path, out: Path) -> Path:
    """Write the fixture to ``out`` (atomically: a partial file is never left under that name)."""
    import gguf

    shapes_of, add_hparams = ARCHS[arch]
    reader = gguf.GGUFReader(tokenizer_gguf)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(f"tiny random {arch} (test fixture)")
    n_vocab = _copy_tokenizer(reader, writer)
    writer.add_context_length(4096)
    writer.add_layer_norm_rms_eps(1e-6)
    add_hparams(writer)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    rng = np.random.default_rng(SEED)
    for name, shape in shapes_of(n_vocab).items():
        data = rng.normal(0.0, STDEV, size=shape[::-1]).astype(np.float32)
        if name.endswith("ssm_a"):
            data = -np.abs(data)  # state decay must be negative
        if name == "token_embd.weight":  # the bulk of the file: 8-bit keeps it small
            writer.add_tensor(
                name,
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def ensure_random_model(arch: str, cache_dir: Path, tokenizer_gguf: Path) -> Path:
    out = cache_dir / fixture_name(arch)
    if not out.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        build(arch, tokenizer_gguf, out)
    return out

"""A tiny random-weight ``qwen35`` GGUF (hybrid: gated-delta-net recurrent + attention layers).

The production model (Qwen3.5-4B) is hybrid; its memory cannot drop part of a sequence, and no such
model can be downloaded in tests. This builds one of the same architecture at test time: seeded
random weights (like llama.cpp's ``tests/test-llama-archs.cpp``, whose hyper-parameters it follows),
the tokenizer and chat template copied from the Qwen2.5 test model, written with the ``gguf``
package. About 10 MB; cached by the caller, never committed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

ARCH = "qwen35"
SEED = 1234
N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 1
N_FF = 128
N_LAYER = 4  # full attention every 2nd layer: recurrent, attention, recurrent, attention
SSM_STATE = 32  # head size of the gated delta net (k and v)
SSM_GROUPS = 2  # k heads
SSM_V_HEADS = 2  # v heads (time_step_rank)
SSM_CONV = 4
STDEV = 0.1
VERSION = "1"  # bump when the layout below changes, so cached files are rebuilt


def fixture_name() -> str:
    spec = f"{VERSION}:{ARCH}:{SEED}:{N_EMBD}:{N_HEAD}:{N_HEAD_KV}:{N_FF}:{N_LAYER}:{SSM_STATE}"
    return f"tiny-{ARCH}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}.gguf"


def _tensor_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
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


def _copy_tokenizer(reader: object, writer: object) -> int:
    """Copy tokenizer.* keys (vocabulary, merges, specials, chat template); returns the vocab size."""
    import gguf

    n_vocab = 0
    for name, field in reader.fields.items():  # type: ignore[attr-defined]
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        value = field.contents()
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)  # type: ignore[attr-defined]
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, value, value_type)  # type: ignore[attr-defined]
    if n_vocab == 0:
        raise ValueError("the source GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def build(tokenizer_gguf: Path, out: Path) -> Path:
    """Write the fixture to ``out`` (atomically: a partial file is never left under that name)."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_gguf)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, ARCH)
    writer.add_name("tiny random qwen35 (test fixture)")
    n_vocab = _copy_tokenizer(reader, writer)
    head = N_EMBD // N_HEAD
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(head)
    writer.add_value_length(head)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e7)
    writer.add_uint32(f"{ARCH}.full_attention_interval", 2)
    writer.add_array(f"{ARCH}.rope.dimension_sections", [head // 4] * 4)
    writer.add_uint32(f"{ARCH}.ssm.conv_kernel", SSM_CONV)
    writer.add_uint32(f"{ARCH}.ssm.inner_size", SSM_STATE * SSM_V_HEADS)
    writer.add_uint32(f"{ARCH}.ssm.state_size", SSM_STATE)
    writer.add_uint32(f"{ARCH}.ssm.time_step_rank", SSM_V_HEADS)
    writer.add_uint32(f"{ARCH}.ssm.group_count", SSM_GROUPS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    rng = np.random.default_rng(SEED)
    for name, shape in _tensor_shapes(n_vocab).items():
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


def ensure_hybrid_model(cache_dir: Path, tokenizer_gguf: Path) -> Path:
    out = cache_dir / fixture_name()
    if not out.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        build(tokenizer_gguf, out)
    return out

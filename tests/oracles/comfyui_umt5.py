"""ComfyUI's umT5 (Wan's text encoder, CLIPLoader type ``wan``), as siliconflow/ComfyUI at 187eda8e writes it:
``comfy/text_encoders/t5.py`` ``T5`` with umT5's config (``comfy/text_encoders/umt5_config_xxl.json``): the state
dict it builds (`comfyui_state`): transformers' names, ``shared`` and no ``embed_tokens``, a relative attention bias
in every block (``relative_attention: true`` in every layer)."""

from __future__ import annotations


def comfyui_state(vocab: int, d_model: int, d_ff: int, heads: int, d_kv: int, layers: int) -> dict:
    """name -> shape of ComfyUI's umT5 (``comfy.text_encoders.t5.T5`` with umT5's config), read off its source:
    ``shared``, per block the attention's q, k, v, o (no bias), a relative attention bias (32 buckets x heads:
    umT5's ``relative_attention: true`` in every layer), the gated FFN, two T5 layer norms; the final norm."""
    s = {"shared.weight": (vocab, d_model), "encoder.final_layer_norm.weight": (d_model,)}
    inner = heads * d_kv
    for i in range(layers):
        a, f = f"encoder.block.{i}.layer.0", f"encoder.block.{i}.layer.1"
        s |= {f"{a}.SelfAttention.{m}.weight": (inner, d_model) for m in "qkv"}
        s |= {f"{a}.SelfAttention.o.weight": (d_model, inner), f"{a}.layer_norm.weight": (d_model,)}
        s[f"{a}.SelfAttention.relative_attention_bias.weight"] = (32, heads)
        s |= {f"{f}.DenseReluDense.wi_{j}.weight": (d_ff, d_model) for j in (0, 1)}
        s |= {f"{f}.DenseReluDense.wo.weight": (d_model, d_ff), f"{f}.layer_norm.weight": (d_model,)}
    return s

"""ComfyUI's Qwen3-VL (Qwen-Image 2.1's text encoder), as siliconflow/ComfyUI at 187eda8e reads it: ``comfy/sd.py``
renames a file's ``model.language_model.``, ``model.visual.`` and ``lm_head.`` (`COMFYUI_RENAMES`) and builds
``comfy/text_encoders/qwen3vl.py`` ``Qwen3VL``: ``model.`` as ``llama.py``'s ``Llama2_`` of `Qwen3VL_8BConfig` (its
output head as ``model.lm_head``) and ``visual.`` as `Qwen3VLVisionModel` (``qwen35.py``'s `Qwen35VisionModel` with
DeepStack's mergers): the state dict it builds (`comfyui_state`)."""

from __future__ import annotations

#: ``comfy/sd.py``'s prefix renaming of a Qwen3-VL file before it builds the model (``state_dict_prefix_replace``)
COMFYUI_RENAMES = {
    "model.language_model.": "model.",
    "model.visual.": "visual.",
    "lm_head.": "model.lm_head.",
}


def comfyui_name(name: str) -> str:
    """A file's tensor name as ComfyUI's model holds it (`COMFYUI_RENAMES`, the first prefix that matches)."""
    for old, new in COMFYUI_RENAMES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def comfyui_state(s) -> dict[str, tuple[int, ...]]:
    """name -> shape of ComfyUI's Qwen3-VL of shape `s` (a `Qwen3VLShape`), read off its source: ``model.`` as
    `Llama2_` (embed_tokens; per layer q, k, v, o without biases, q and k RMSNorms of the head size, the gated MLP,
    two RMSNorms; the final norm; the output head, `Qwen3VL_8BConfig.lm_head`) and ``visual.`` (the Conv3d patch
    embedding with its bias, the learned position table; per block two LayerNorms, the fused qkv, proj and the
    two-Linear MLP, all with biases; the merger, whose LayerNorm is the tower's width, and DeepStack's, whose
    LayerNorms are the merged width)."""
    h, w, q, kv = s.hidden, s.vision_width, s.heads * s.head_dim, s.kv_heads * s.head_dim
    state = {"model.embed_tokens.weight": (s.vocab_size, h), "model.norm.weight": (h,)}
    state["model.lm_head.weight"] = (s.vocab_size, h)
    for i in range(s.layers):
        p = f"model.layers.{i}"
        state |= {f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.o_proj.weight": (h, q)}
        state |= {f"{p}.self_attn.{m}_proj.weight": (kv, h) for m in "kv"}
        state |= {f"{p}.self_attn.{m}_norm.weight": (s.head_dim,) for m in "qk"}
        state |= {f"{p}.mlp.{m}_proj.weight": (s.intermediate, h) for m in ("gate", "up")}
        state |= {f"{p}.mlp.down_proj.weight": (h, s.intermediate)}
        state |= {f"{p}.{n}.weight": (h,) for n in ("input_layernorm", "post_attention_layernorm")}
    state["visual.patch_embed.proj.weight"] = (w, 3, s.temporal_patch, s.patch, s.patch)
    state["visual.patch_embed.proj.bias"] = (w,)
    state["visual.pos_embed.weight"] = (s.positions, w)
    for i in range(s.vision_depth):
        p = f"visual.blocks.{i}"
        state |= {f"{p}.{n}.{x}": (w,) for n in ("norm1", "norm2") for x in ("weight", "bias")}
        state |= {f"{p}.attn.qkv.weight": (3 * w, w), f"{p}.attn.qkv.bias": (3 * w,)}
        state |= {f"{p}.attn.proj.weight": (w, w), f"{p}.attn.proj.bias": (w,)}
        state |= {f"{p}.mlp.linear_fc1.weight": (s.vision_intermediate, w)}
        state |= {f"{p}.mlp.linear_fc1.bias": (s.vision_intermediate,)}
        state |= {f"{p}.mlp.linear_fc2.weight": (w, s.vision_intermediate), f"{p}.mlp.linear_fc2.bias": (w,)}
    merged = w * s.merge**2
    mergers = [("visual.merger", w)] + [
        (f"visual.deepstack_merger_list.{i}", merged) for i in range(len(s.deepstack))
    ]
    for p, norm in mergers:
        state |= {f"{p}.norm.weight": (norm,), f"{p}.norm.bias": (norm,)}
        state |= {f"{p}.linear_fc1.weight": (merged, merged), f"{p}.linear_fc1.bias": (merged,)}
        state |= {f"{p}.linear_fc2.weight": (h, merged), f"{p}.linear_fc2.bias": (h,)}
    return state

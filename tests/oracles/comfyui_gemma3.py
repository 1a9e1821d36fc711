"""ComfyUI's Gemma 3 12B (LTX-2's text encoder), as siliconflow/ComfyUI at 187eda8e writes it:
``comfy/text_encoders/llama.py`` ``Gemma3_12B`` (``model.`` as ``Llama2_``, with the multimodal projector) and its
SigLIP tower as ``comfy/clip_model.py`` ``CLIPVision`` (``vision_model.``): the state dict it builds
(`comfyui_state`)."""

from __future__ import annotations


def comfyui_state(shape) -> dict[str, tuple[int, ...]]:
    """name -> shape of ComfyUI's Gemma 3 12B of `shape` (a `Gemma3Shape`), read off its source: ``model.`` as
    `Llama2_` (embed_tokens, per layer the attention's q, k, v, o with no bias, q_norm and k_norm, the gated MLP,
    four RMSNorms; the final norm), the projector, and the SigLIP tower as `CLIPVision` (``vision_model.``: the
    patch convolution, the position embedding, per layer two LayerNorms, q, k, v, out and fc1, fc2 with biases; the
    post LayerNorm)."""
    s, h, w = shape, shape.hidden, shape.vision_width
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    state = {"model.embed_tokens.weight": (s.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(s.layers):
        p = f"model.layers.{i}"
        state |= {f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.o_proj.weight": (h, q)}
        state |= {f"{p}.self_attn.{m}_proj.weight": (kv, h) for m in "kv"}
        state |= {f"{p}.self_attn.{m}_norm.weight": (s.head_dim,) for m in "qk"}
        state |= {f"{p}.mlp.{m}_proj.weight": (s.intermediate, h) for m in ("gate", "up")}
        state[f"{p}.mlp.down_proj.weight"] = (h, s.intermediate)
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            state[f"{p}.{norm}_layernorm.weight"] = (h,)
    state |= {
        "multi_modal_projector.mm_input_projection_weight": (w, h),
        "multi_modal_projector.mm_soft_emb_norm.weight": (w,),
    }
    v = "vision_model"
    state |= {
        f"{v}.embeddings.patch_embedding.weight": (w, 3, s.patch, s.patch),
        f"{v}.embeddings.patch_embedding.bias": (w,),
        f"{v}.embeddings.position_embedding.weight": ((s.image // s.patch) ** 2, w),
        f"{v}.post_layernorm.weight": (w,),
        f"{v}.post_layernorm.bias": (w,),
    }
    for i in range(s.vision_layers):
        p = f"{v}.encoder.layers.{i}"
        for m in ("layer_norm1", "layer_norm2", *(f"self_attn.{x}_proj" for x in ("q", "k", "v", "out"))):
            state |= {f"{p}.{m}.weight": (w, w) if "proj" in m else (w,), f"{p}.{m}.bias": (w,)}
        state |= {
            f"{p}.mlp.fc1.weight": (s.vision_intermediate, w),
            f"{p}.mlp.fc1.bias": (s.vision_intermediate,),
        }
        state |= {f"{p}.mlp.fc2.weight": (w, s.vision_intermediate), f"{p}.mlp.fc2.bias": (w,)}
    return state

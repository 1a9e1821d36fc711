"""ComfyUI's Qwen2.5-VL 7B (Kandinsky 5's and HunyuanVideo 1.5's text encoder), as siliconflow/ComfyUI at 187eda8e
writes it: ``comfy/text_encoders/llama.py`` ``Qwen25_7BVLI`` (``model.`` as ``Llama2_``) and its tower
``comfy/text_encoders/qwen_vl.py`` ``Qwen2VLVisionTransformer`` (``visual.``): the state dict it builds
(`comfyui_state`); it has no output head (it ignores a file's ``lm_head``)."""

from __future__ import annotations


def comfyui_state(s) -> dict[str, tuple[int, ...]]:
    """name -> shape of ComfyUI's Qwen2.5-VL of shape `s` (a `Qwen25VLShape`), read off its source: ``model.`` as
    `Llama2_` (embed_tokens; per layer q, k, v with biases, o without, the gated MLP, two RMSNorms; the final norm)
    and ``visual.`` as `Qwen2VLVisionTransformer` (the Conv3d patch embedding without bias; per block two RMSNorms,
    the fused qkv and proj, the gated MLP, all with biases; the merger's RMSNorm and two Linears). ComfyUI has no
    output head (it ignores a file's ``lm_head``)."""
    h, w, q, kv = s.hidden, s.vision_width, s.heads * s.head_dim, s.kv_heads * s.head_dim
    state = {"model.embed_tokens.weight": (s.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(s.layers):
        p = f"model.layers.{i}.self_attn"
        state |= {f"{p}.q_proj.weight": (q, h), f"{p}.q_proj.bias": (q,), f"{p}.o_proj.weight": (h, q)}
        state |= {
            f"{p}.{m}_proj.{x}": (kv, h) if x == "weight" else (kv,) for m in "kv" for x in ("weight", "bias")
        }
        p = f"model.layers.{i}"
        state |= {f"{p}.mlp.{m}_proj.weight": (s.intermediate, h) for m in ("gate", "up")}
        state |= {f"{p}.mlp.down_proj.weight": (h, s.intermediate)}
        state |= {f"{p}.{n}.weight": (h,) for n in ("input_layernorm", "post_attention_layernorm")}
    state["visual.patch_embed.proj.weight"] = (w, 3, s.temporal_patch, s.patch, s.patch)
    for i in range(s.vision_depth):
        p = f"visual.blocks.{i}"
        state |= {f"{p}.norm1.weight": (w,), f"{p}.norm2.weight": (w,)}
        state |= {f"{p}.attn.qkv.weight": (3 * w, w), f"{p}.attn.qkv.bias": (3 * w,)}
        state |= {f"{p}.attn.proj.weight": (w, w), f"{p}.attn.proj.bias": (w,)}
        for m in ("gate", "up"):
            state |= {
                f"{p}.mlp.{m}_proj.weight": (s.vision_intermediate, w),
                f"{p}.mlp.{m}_proj.bias": (s.vision_intermediate,),
            }
        state |= {f"{p}.mlp.down_proj.weight": (w, s.vision_intermediate), f"{p}.mlp.down_proj.bias": (w,)}
    merged = w * s.merge**2
    state |= {"visual.merger.ln_q.weight": (w,), "visual.merger.mlp.0.weight": (merged, merged)}
    state |= {"visual.merger.mlp.0.bias": (merged,), "visual.merger.mlp.2.weight": (h, merged)}
    state["visual.merger.mlp.2.bias"] = (h,)
    return state

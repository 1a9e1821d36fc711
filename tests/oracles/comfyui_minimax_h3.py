"""ComfyUI's MiniMax-H3, as siliconflow/ComfyUI at 187eda8e writes it:

- ``comfy/model_detection.py``, ``detect_unet_config``'s 'MiniMax H3' branch (told by ``video_patch_proj.weight``
  and ``audio_patch_proj.weight``): the config it builds ``MiniMaxH3Model`` with (`comfyui_minimax`);
- ``comfy/ldm/minimax/model.py``, ``MiniMaxH3Model.__init__``'s defaults: the release's 33B (`COMFYUI_DEFAULTS`).
"""

from __future__ import annotations


def comfyui_minimax(state: dict) -> dict:
    """ComfyUI's 'MiniMax H3' branch of comfy/model_detection.py on a state dict's names and shapes (name -> shape):
    the config it builds ``MiniMaxH3Model`` with."""
    assert "video_patch_proj.weight" in state and "audio_patch_proj.weight" in state, (
        "how ComfyUI tells MiniMax H3"
    )

    def count(prefix):
        return next(n for n in range(10**4) if not any(k.startswith(f"{prefix}{n}.") for k in state))

    c = {
        "num_layers": count("blocks."),
        "token_refiner_num_layers": count("token_refiner.blocks."),
        "hidden_size": state["video_patch_proj.weight"][0],
        "latents_dim": state["final_layer.video_out.weight"][0] // 4,  # patch 1x2x2
        "audio_latents_dim": state["final_layer.audio_out.weight"][0],
        "attention_head_dim": state["blocks.0.attn.q_norm.weight"][0],
    }
    c["num_attention_heads"] = state["blocks.0.attn.qkv_proj.weight"][0] // (3 * c["attention_head_dim"])
    c["ffn_hidden_size"] = state["blocks.0.mlp.fc1.weight"][0] // 2
    c["text_dim"] = state["condition_proj.weight"][1]
    c["timestep_input_dim"] = state["time_embedder.proj_in.weight"][1]
    c["time_embed_hidden_size"] = state["time_embedder.proj_in.weight"][0]
    c["time_embed_dim"] = state["time_embedder.proj_out.weight"][0]
    c["rope_inv_freq_len"] = state["rope.inv_freq"][0]
    return c


#: ``MiniMaxH3Model.__init__``'s defaults in comfy/ldm/minimax/model.py: the release's 33B
COMFYUI_DEFAULTS = dict(
    hidden_size=5376, num_layers=50, token_refiner_num_layers=2, num_attention_heads=56, attention_head_dim=128,
    ffn_hidden_size=14336, latents_dim=24, audio_latents_dim=32, text_dim=5120, timestep_input_dim=256,
    time_embed_hidden_size=5376, time_embed_dim=2688, rope_inv_freq_len=16,
)  # fmt: skip

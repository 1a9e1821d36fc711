"""ComfyUI's own rules, spelled for the tests that check our native-named files against them."""

from __future__ import annotations


def comfyui_wan_config(state: dict) -> dict:
    """What ComfyUI's model detection derives from a Wan state dict (comfy/model_detection.py)."""
    assert "head.modulation" in state, "ComfyUI detects Wan by head.modulation"
    n = 0
    while any(k.startswith(f"blocks.{n}.") for k in state):
        n += 1
    return {
        "dim": state["head.modulation"].shape[-1],
        "out_dim": state["head.head.weight"].shape[0] // 4,
        "ffn_dim": state["blocks.0.ffn.0.weight"].shape[0],
        "num_layers": n,
        "in_dim": state["patch_embedding.weight"].shape[1],
        "model_type": "i2v" if "img_emb.proj.0.bias" in state else "t2v",
    }

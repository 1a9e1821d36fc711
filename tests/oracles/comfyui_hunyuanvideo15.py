"""ComfyUI's HunyuanVideo 1.5, as siliconflow/ComfyUI at 187eda8e writes it:

- ``comfy/model_detection.py``, ``detect_unet_config``'s 'Hunyuan Video' branch (told by
  ``txt_in.individual_token_refiner.blocks.0.norm1.weight``), and the supported model ``comfy/supported_models.py``
  picks by ``vision_in_dim`` and ``in_channels`` (`comfyui_detects`);
- ``comfy/supported_models.py``, ``HunyuanVideo.process_unet_state_dict``: its renames of a key
  (`comfyui_process`);
- ``comfy/ldm/hunyuan_video/model.py``, ``HunyuanVideo`` with Flux's double blocks: the state dict it builds for a
  1.5 (`comfyui_names`).
"""

from __future__ import annotations


def comfyui_detects(state: dict[str, tuple[int, ...]]) -> dict:
    """ComfyUI's 'Hunyuan Video' rule on a state dict's names and shapes, and the supported model it picks."""
    assert "txt_in.individual_token_refiner.blocks.0.norm1.weight" in state, (
        "ComfyUI tells HunyuanVideo by it"
    )
    in_w = state["img_in.proj.weight"]

    def count(prefix):
        return next(n for n in range(10**4) if not any(k.startswith(f"{prefix}{n}.") for k in state))

    config = {
        "in_channels": in_w[1],
        "patch_size": list(in_w[2:]),
        "out_channels": state["final_layer.linear.weight"][0],
        "hidden_size": in_w[0],
        "num_heads": in_w[0] // 128,
        "depth": count("double_blocks."),
        "depth_single_blocks": count("single_blocks."),
        "context_in_dim": state["txt_in.input_embedder.weight"][1],
        "byt5": "byt5_in.fc1.weight" in state,
        "meanflow": any(k.startswith("time_r_in.") for k in state),
        "use_cond_type_embedding": "cond_type_embedding.weight" in state,
        "vision_in_dim": state["vision_in.proj.0.weight"][0] if "vision_in.proj.0.weight" in state else None,
    }
    config["model"] = (
        "HunyuanVideo15_SR_Distilled"
        if config["vision_in_dim"] == 1152 and config["in_channels"] == 98
        else "HunyuanVideo15"
        if config["vision_in_dim"] == 1152
        else "HunyuanVideo"
    )
    return config


def comfyui_process(name: str) -> str:
    """``supported_models.HunyuanVideo.process_unet_state_dict``: its renames of one key."""
    for a, b in (
        ("txt_in.t_embedder.mlp.0.", "txt_in.t_embedder.in_layer."),
        ("txt_in.t_embedder.mlp.2.", "txt_in.t_embedder.out_layer."),
        ("txt_in.c_embedder.linear_1.", "txt_in.c_embedder.in_layer."),
        ("txt_in.c_embedder.linear_2.", "txt_in.c_embedder.out_layer."),
        ("_mod.linear.", "_mod.lin."),
        ("_attn_qkv.", "_attn.qkv."),
        ("mlp.fc1.", "mlp.0."),
        ("mlp.fc2.", "mlp.2."),
        ("_attn_q_norm.weight", "_attn.norm.query_norm.weight"),
        ("_attn_k_norm.weight", "_attn.norm.key_norm.weight"),
        ("_attn_proj.", "_attn.proj."),
        ("_in.mlp.2.", "_in.out_layer."),
        ("_in.mlp.0.", "_in.in_layer."),
    ):
        name = name.replace(a, b)
    return name


def comfyui_names(depth: int) -> set[str]:
    """The state dict of ComfyUI's ``HunyuanVideo`` module for a 1.5 (byt5, vision_in, cond_type_embedding, no
    single blocks, no guidance or vector_in), read off its source."""

    def lin(*names):
        return {f"{n}.{p}" for n in names for p in ("weight", "bias")}

    names = lin("img_in.proj", "time_in.in_layer", "time_in.out_layer", "txt_in.input_embedder")
    names |= lin(
        *(f"txt_in.{e}.{x}" for e in ("t_embedder", "c_embedder") for x in ("in_layer", "out_layer"))
    )
    for i in range(2):
        b = f"txt_in.individual_token_refiner.blocks.{i}"
        names |= lin(
            *(f"{b}.{m}" for m in ("norm1", "self_attn.qkv", "self_attn.proj", "norm2", "mlp.0", "mlp.2"))
        )
        names |= lin(f"{b}.adaLN_modulation.1")
    names |= lin("byt5_in.layernorm", "byt5_in.fc1", "byt5_in.fc2", "byt5_in.fc3")
    names |= lin("vision_in.proj.0", "vision_in.proj.1", "vision_in.proj.3", "vision_in.proj.4")
    names |= {"cond_type_embedding.weight"} | lin("final_layer.linear", "final_layer.adaLN_modulation.1")
    for i in range(depth):
        for s in ("img", "txt"):
            b = f"double_blocks.{i}.{s}"
            names |= lin(f"{b}_mod.lin", f"{b}_attn.qkv", f"{b}_attn.proj", f"{b}_mlp.0", f"{b}_mlp.2")
            names |= {f"{b}_attn.norm.query_norm.weight", f"{b}_attn.norm.key_norm.weight"}
    return names

"""ComfyUI's Kandinsky 5, as siliconflow/ComfyUI at 187eda8e writes it:

- ``comfy/ldm/kandinsky5/model.py``, ``Kandinsky5``: the state dict it builds (`comfyui_state`);
- ``comfy/model_detection.py``, ``detect_unet_config``'s 'Kandinsky 5' branch (told by
  ``visual_transformer_blocks.0.cross_attention.key_norm.weight``): what it reads off a checkpoint
  (`comfyui_detects`), and the model it builds from that (`built_by_comfyui`).
"""

from __future__ import annotations


def comfyui_state(
    model_dim,
    ff_dim,
    time_dim,
    text_blocks,
    visual_blocks,
    visual_embed_dim,
    head,
    text_dim=3584,
    text_dim2=768,
):
    """name -> shape of ``comfy.ldm.kandinsky5.model.Kandinsky5(...)``'s state dict, read off its source: Linear
    (in, out) weights [out, in] with biases (FeedForward's have none), LayerNorm(affine) weight and bias, RMSNorm
    (head_dim) weight, OutLayer's out_layer to prod(patch)*16 = 64 (its defaults out_visual_dim 16, patch 1,2,2)."""
    s = {}

    def linear(name, i, o, bias=True):
        s[f"{name}.weight"] = (o, i)
        if bias:
            s[f"{name}.bias"] = (o,)

    def attention(p):
        for m in ("to_query", "to_key", "to_value"):
            linear(f"{p}.{m}", model_dim, model_dim)
        s[f"{p}.query_norm.weight"] = s[f"{p}.key_norm.weight"] = (head,)
        linear(f"{p}.out_layer", model_dim, model_dim)

    linear("time_embeddings.in_layer", model_dim, time_dim)  # TimeEmbeddings(model_dim, time_dim)
    linear("time_embeddings.out_layer", time_dim, time_dim)
    for name, i, o in (
        ("text_embeddings", text_dim, model_dim),
        ("pooled_text_embeddings", text_dim2, time_dim),
    ):
        linear(f"{name}.in_layer", i, o)
        s[f"{name}.norm.weight"] = s[f"{name}.norm.bias"] = (o,)
    linear("visual_embeddings.in_layer", visual_embed_dim, model_dim)
    for i in range(text_blocks):  # TransformerEncoderBlock
        b = f"text_transformer_blocks.{i}"
        linear(f"{b}.text_modulation.out_layer", time_dim, 6 * model_dim)
        attention(f"{b}.self_attention")
        linear(f"{b}.feed_forward.in_layer", model_dim, ff_dim, bias=False)
        linear(f"{b}.feed_forward.out_layer", ff_dim, model_dim, bias=False)
    for i in range(visual_blocks):  # TransformerDecoderBlock
        b = f"visual_transformer_blocks.{i}"
        linear(f"{b}.visual_modulation.out_layer", time_dim, 9 * model_dim)
        attention(f"{b}.self_attention")
        attention(f"{b}.cross_attention")
        linear(f"{b}.feed_forward.in_layer", model_dim, ff_dim, bias=False)
        linear(f"{b}.feed_forward.out_layer", ff_dim, model_dim, bias=False)
    linear("out_layer.modulation.out_layer", time_dim, 2 * model_dim)
    linear("out_layer.out_layer", model_dim, 4 * 16)
    return s


def comfyui_detects(state: dict) -> dict:
    """ComfyUI's 'Kandinsky 5' detection rule (comfy/model_detection.py), on a state dict's names and shapes."""
    assert "visual_transformer_blocks.0.cross_attention.key_norm.weight" in state, (
        "ComfyUI detects Kandinsky 5 by it"
    )
    model_dim = state["visual_embeddings.in_layer.bias"][0]
    axes = (
        (32, 48, 48) if model_dim in (4096, 2560) else (16, 24, 24)
    )  # 4096/2560 as written; 1792 and the rest

    def count(prefix: str) -> int:
        return next(n for n in range(10**4) if not any(k.startswith(f"{prefix}{n}.") for k in state))

    return {
        "model_dim": model_dim,
        "axes_dims": axes,
        "time_dim": state["time_embeddings.in_layer.bias"][0],
        "ff_dim": state["visual_transformer_blocks.0.feed_forward.in_layer.weight"][0],
        "visual_embed_dim": state["visual_embeddings.in_layer.weight"][1],
        "num_text_blocks": count("text_transformer_blocks."),
        "num_visual_blocks": count("visual_transformer_blocks."),
    }


def built_by_comfyui(state: dict) -> dict:
    """The state dict ComfyUI builds for what it detects in `state` (its defaults for the rest)."""
    d = comfyui_detects(state)
    return comfyui_state(
        d["model_dim"], d["ff_dim"], d["time_dim"], d["num_text_blocks"], d["num_visual_blocks"],
        d["visual_embed_dim"], sum(d["axes_dims"]),
    )  # fmt: skip

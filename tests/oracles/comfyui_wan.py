"""ComfyUI's Wan detection and its Animate model, as siliconflow/ComfyUI at 187eda8e writes them:

- ``comfy/model_detection.py``, ``detect_unet_config``'s 'Wan 2.1' branch (told by ``head.modulation``; its VACE
  test by ``vace_patch_embedding.weight``, its Animate test by ``face_adapter.fuser_blocks.0.k_norm.weight``, before
  the I2V test by ``img_emb.proj.0.bias``): `comfyui_wan`, `comfyui_wan_config`, `comfyui_animate`;
- ``comfy/ldm/wan/model_animate.py``, ``AnimateWanModel``: the shapes it fixes whatever the checkpoint (its motion
  encoder, face adapter and face encoder): `comfyui_animate_shapes`.
"""

from __future__ import annotations


def _count(state: dict, prefix: str) -> int:
    """How many ``<prefix>0.``, ``<prefix>1.``, ... the names hold, as ComfyUI's ``count_blocks``."""
    return next(n for n in range(10**4) if not any(k.startswith(f"{prefix}{n}.") for k in state))


def comfyui_wan(state: dict) -> dict:
    """ComfyUI's 'Wan 2.1' branch on a state dict's names and shapes (name -> shape)."""
    assert "head.modulation" in state, "ComfyUI tells Wan by head.modulation"
    dim = state["head.modulation"][-1]
    config = {
        "dim": dim,
        "out_dim": state["head.head.weight"][0] // 4,
        "num_heads": dim // 128,
        "ffn_dim": state["blocks.0.ffn.0.weight"][0],
        "num_layers": _count(state, "blocks."),
        "in_dim": state["patch_embedding.weight"][1],
    }
    assert len(state["patch_embedding.weight"]) == 5
    if "vace_patch_embedding.weight" in state:
        config |= {
            "model_type": "vace",
            "vace_in_dim": state["vace_patch_embedding.weight"][1],
            "vace_layers": _count(state, "vace_blocks."),
        }
    else:
        config["model_type"] = "i2v" if "img_emb.proj.0.bias" in state else "t2v"
    return config


def comfyui_wan_config(state: dict) -> dict:
    """What ComfyUI's model detection derives from a Wan T2V or I2V state dict (name -> tensor): `comfyui_wan`'s
    dimensions and model type."""
    detected = comfyui_wan({k: tuple(v.shape) for k, v in state.items()})
    return {k: detected[k] for k in ("dim", "out_dim", "ffn_dim", "num_layers", "in_dim", "model_type")}


def comfyui_animate(state: dict) -> dict:
    """ComfyUI's 'Wan 2.1' branch on a state dict's names and shapes (name -> shape), for an Animate model."""
    assert "head.modulation" in state, "ComfyUI tells Wan by head.modulation"
    dim = state["head.modulation"][-1]
    assert len(state["patch_embedding.weight"]) == 5
    assert (
        "face_adapter.fuser_blocks.0.k_norm.weight" in state
    )  # before the I2V test: an Animate is not an I2V
    return {
        "dim": dim,
        "out_dim": state["head.head.weight"][0] // 4,
        "num_heads": dim // 128,
        "ffn_dim": state["blocks.0.ffn.0.weight"][0],
        "num_layers": _count(state, "blocks."),
        "in_dim": state["patch_embedding.weight"][1],
        "model_type": "animate",
    }


#: the motion encoder's convolutions in ``AnimateWanModel``
CONVS = "motion_encoder.enc.net_app.convs"


def comfyui_animate_shapes(dim: int, num_layers: int) -> dict[str, tuple[int, ...]]:
    """What ``AnimateWanModel`` builds besides Wan's I2V, whatever the checkpoint: every shape it fixes."""
    heads = dim // 128
    t: dict[str, tuple[int, ...]] = {"pose_patch_embedding.weight": (dim, 16, 1, 2, 2)}
    # EncoderApp: ConvLayer(3, 32, 1), ResBlock(32, 64), ... ResBlock(512, 512) x3, EqualConv2d(512, 512, 4)
    t[f"{CONVS}.0.0.weight"], t[f"{CONVS}.0.1.bias"] = (32, 3, 1, 1), (1, 32, 1, 1)
    chans = [(32, 64), (64, 128), (128, 256), (256, 512), (512, 512), (512, 512), (512, 512)]
    for i, (cin, cout) in enumerate(chans, start=1):
        t |= {
            f"{CONVS}.{i}.conv1.0.weight": (cin, cin, 3, 3),
            f"{CONVS}.{i}.conv1.1.bias": (1, cin, 1, 1),  # FusedLeakyReLU
            f"{CONVS}.{i}.conv2.0.kernel": (4, 4),  # Blur's buffer
            f"{CONVS}.{i}.conv2.1.weight": (cout, cin, 3, 3),
            f"{CONVS}.{i}.conv2.2.bias": (1, cout, 1, 1),
            f"{CONVS}.{i}.skip.0.kernel": (4, 4),
            f"{CONVS}.{i}.skip.1.weight": (cout, cin, 1, 1),
        }
    t[f"{CONVS}.8.weight"] = (512, 512, 4, 4)
    for j in range(5):  # Encoder.fc: 4 x EqualLinear(512, 512), EqualLinear(512, motion_dim=20)
        t[f"motion_encoder.enc.fc.{j}.weight"] = (20 if j == 4 else 512, 512)
        t[f"motion_encoder.enc.fc.{j}.bias"] = (20 if j == 4 else 512,)
    t["motion_encoder.dec.direction.weight"] = (512, 20)
    for i in range(num_layers // 5):  # FaceAdapter(num_adapter_layers=num_layers // 5), FaceBlock
        b = f"face_adapter.fuser_blocks.{i}"
        t |= {f"{b}.linear1_kv.weight": (2 * dim, dim), f"{b}.linear1_kv.bias": (2 * dim,)}
        for lin in ("linear1_q", "linear2"):
            t |= {f"{b}.{lin}.weight": (dim, dim), f"{b}.{lin}.bias": (dim,)}
        t |= {f"{b}.q_norm.weight": (dim // heads,), f"{b}.k_norm.weight": (dim // heads,)}
    # FaceEncoder(in_dim=512, hidden_dim=dim, num_heads=4)
    t |= {
        "face_encoder.conv1_local.conv.weight": (4096, 512, 3),
        "face_encoder.conv1_local.conv.bias": (4096,),
    }
    for c in ("conv2", "conv3"):
        t |= {f"face_encoder.{c}.conv.weight": (1024, 1024, 3), f"face_encoder.{c}.conv.bias": (1024,)}
    t |= {"face_encoder.out_proj.weight": (dim, 1024), "face_encoder.out_proj.bias": (dim,)}
    return t | {"face_encoder.padding_tokens": (1, 1, 1, dim)}

"""One small model of each family of timm transformers, registered with timm for the tests: timm's own classes at
shapes a CPU builds and trains in milliseconds (trainers.model.registry.register_small_model), each with the image
size it is built at. The ViT and XCiT families are timm's own entrypoints at 32 px."""
from __future__ import annotations

from qkvsearch.trainers.model.registry import register_small_model


def _mvitv2(name, pretrained=False, **kwargs):
    from timm.models import build_model_with_cfg
    from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg

    cfg = MultiScaleVitCfg(depths=(1, 1), embed_dim=16, num_heads=1)
    return build_model_with_cfg(MultiScaleVit, name, pretrained, model_cfg=cfg, **kwargs)


def _levit(name, pretrained=False, **kwargs):
    from timm.models.levit import create_levit

    kwargs.pop("pretrained_cfg", None)
    return create_levit("levit_128s", pretrained=pretrained, **kwargs)


def _naflexvit(name, pretrained=False, **kwargs):
    from timm.models.naflexvit import NaFlexVitCfg, _create_naflexvit

    kwargs.pop("img_size", None)   # NaFlexViT takes any size as it comes
    cfg = NaFlexVitCfg(patch_size=8, embed_dim=16, depth=2, num_heads=2, global_pool="avg", reg_tokens=1)
    return _create_naflexvit(name, pretrained=pretrained, cfg=cfg, **kwargs)


# family (timm module) -> (its small model's name, the spec register_small_model takes)
SPECS = {
    "swin_transformer_v2": ("swin_transformer_v2", "_create_swin_transformer_v2",
                            dict(patch_size=2, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(1, 2)), 32),
    "pit": ("pit", "_create_pit", dict(patch_size=4, stride=4, base_dims=[8, 8], depth=[1, 1], heads=[2, 4],
                                       mlp_ratio=2), 32),
    "twins": ("twins", "_create_twins", dict(patch_size=4, embed_dims=[16, 32], num_heads=[1, 2], mlp_ratios=[2, 2],
                                             depths=[2, 2], wss=[4, 4], sr_ratios=[2, 1]), 32),
    "crossvit": ("crossvit", "_create_crossvit", dict(img_scale=(1.0, 1.0), patch_size=[8, 16], embed_dim=[16, 32],
                                                      depth=[[1, 1, 0]], num_heads=[2, 2], mlp_ratio=[2, 2, 1]), 32),
    "cait": ("cait", "_create_cait", dict(patch_size=8, embed_dim=16, depth=2, num_heads=2, init_values=1e-5,
                                          depth_token_only=1), 32),
    "beit": ("beit", "_create_beit", dict(patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2,
                                          use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1), 32),
    "convit": ("convit", "_create_convit", dict(patch_size=8, embed_dim=16, depth=2, num_heads=2, local_up_to_layer=1,
                                                locality_strength=1.0), 32),
    "levit": ("levit", _levit, dict(embed_dim=(16, 32, 48), key_dim=8, num_heads=(2, 2, 3), depth=(1, 1, 1)), 128),
    "eva": ("eva", "_create_eva", dict(patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2, qkv_fused=False,
                                       swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4)), 32),
    "volo": ("volo", "_create_volo", dict(layers=(1, 1, 1, 1), embed_dims=(16, 32, 32, 32), num_heads=(1, 2, 2, 2),
                                          patch_size=8, stem_hidden_dim=16), 32),
    "pvt_v2": ("pvt_v2", "_create_pvt2", dict(depths=(1, 1, 1, 1), embed_dims=(8, 16, 24, 32), num_heads=(1, 1, 1, 1),
                                              mlp_ratios=(2, 2, 2, 2)), 32),
    "mvitv2": ("mvitv2", _mvitv2, {}, 32),
    "naflexvit": ("naflexvit", _naflexvit, {}, 32),
}
# family -> (a config of its small model: model, img_size and, for ViT and XCiT, their macro shape)
SMALL = dict(depth=2, embed_dim=32, num_heads=2)
FAMILY_MODELS = {"vision_transformer": dict(model="vit_tiny_patch16_224", img_size=32, **SMALL),
                 "xcit": dict(model="xcit_nano_12_p16_224", img_size=32, **SMALL),
                 "swin_transformer": dict(model="swin_pico_patch2_window4_32", img_size=32),
                 **{family: dict(model=f"test_small_{family}", img_size=spec[3]) for family, spec in SPECS.items()}}
for _family, _spec in SPECS.items():
    register_small_model(f"test_small_{_family}", _spec)


def timm_kwargs(family: str) -> dict:
    """``timm.create_model``'s arguments for the family's small model, as build_model passes them (a model that
    takes any image size, PVT v2, is given none)."""
    base = dict(FAMILY_MODELS[family])
    base["model_name"] = base.pop("model")
    if family == "pvt_v2":
        base.pop("img_size")
    return base

"""Architecture detection and the registry: the same architectures.yaml as
rvctl, detection by config.model_type then class name, user overrides, the
name search (no daemon)."""
import pathlib
import types

import pytest
import torch
import yaml

import models
import rvd
from rvd import architectures

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_reads_the_repository_table():
    assert pathlib.Path(architectures.table().path) == ROOT / "config" / "architectures.yaml"
    raw = yaml.safe_load((ROOT / "config" / "architectures.yaml").read_text())
    assert set(architectures.table().by_type) == set(raw["architectures"])
    for model_type, node in raw["architectures"].items():
        paths = rvd.MODEL_V_PROJ_PATHS[model_type]
        paths = [paths] if isinstance(paths, str) else paths
        assert [p + ".weight" for p in paths] == node["tensors"]


@pytest.mark.parametrize("make,arch,layout,geometry,by", [
    (models.LlamaForCausalLM, "llama", "separate", (4, 2, 16), "config.model_type"),
    (models.GPTNeoXForCausalLM, "gpt_neox", "gpt_neox_qkv", (4, 4, 8), "config.model_type"),
    (models.GPT2LMHeadModel, "gpt2", "gpt2_conv1d", (4, 4, 8), "config.model_type"),
    (lambda: models.GPTNeoXForCausalLM(with_config=False), "gpt_neox",
     "gpt_neox_qkv", None, "class name"),
])
def test_detection(make, arch, layout, geometry, by):
    r = architectures.resolve(make())
    assert (r.arch, r.layout, r.geometry, r.detected_by) == (arch, layout, geometry, by)


def test_class_name_picks_the_longest_name():
    class Qwen2ForCausalLM(torch.nn.Module):
        pass

    class Phi3Model(torch.nn.Module):
        pass

    assert architectures.detect_arch(Qwen2ForCausalLM()) == ("qwen2", "class name")
    assert architectures.detect_arch(Phi3Model()) == ("phi3", "class name")


def test_alias_and_layout_variants():
    def falcon(**cfg):
        m = torch.nn.Module()
        m.transformer = torch.nn.Module()
        m.transformer.h = torch.nn.ModuleList()
        for _ in range(2):
            block = torch.nn.Module()
            block.self_attention = torch.nn.Module()
            block.self_attention.query_key_value = torch.nn.Linear(32, 48, bias=False)
            m.transformer.h.append(block)
        m.config = types.SimpleNamespace(num_attention_heads=4, hidden_size=32, **cfg)
        return m

    r = architectures.resolve(falcon(model_type="RefinedWebModel"))
    assert (r.arch, r.layout, r.geometry) == ("falcon", "falcon_multi_query", (4, 1, 8))
    r = architectures.resolve(falcon(model_type="falcon", multi_query=False))
    assert r.layout == "falcon_classic"
    r = architectures.resolve(falcon(model_type="falcon", new_decoder_architecture=True,
                                     num_kv_heads=2))
    assert (r.layout, r.geometry) == ("falcon_grouped", (4, 2, 8))


def test_wrapped_and_base_models():
    wrapper = torch.nn.Module()
    wrapper.module = models.LlamaForCausalLM()
    wrapper.config = wrapper.module.config
    r = architectures.resolve(wrapper)
    assert r.tensors[3].name == "module.model.layers.3.self_attn.v_proj.weight"
    base = models.LlamaForCausalLM().model  # LlamaModel: no "model." prefix
    base.config = models.LlamaForCausalLM().config
    r = architectures.resolve(base)
    assert r.tensors[0].name == "layers.0.self_attn.v_proj.weight"


def test_user_registry_entry():
    m = torch.nn.Module()
    m.stack = torch.nn.ModuleList(torch.nn.Module() for _ in range(3))
    for b in m.stack:
        b.mix = torch.nn.Linear(8, 8)
        b.vv = torch.nn.Linear(8, 4)
    with pytest.raises(ValueError, match="no V projection found"):
        architectures.resolve(m)
    with pytest.raises(ValueError, match="unknown architecture 'mine'"):
        architectures.resolve(m, arch="mine")
    rvd.MODEL_V_PROJ_PATHS["mine"] = "stack.{layer}.vv"
    try:
        r = architectures.resolve(m, arch="mine")
        assert (r.arch, r.layout, r.geometry) == ("mine", "separate", None)
        assert [t.name for t in r.tensors.values()] == [f"stack.{l}.vv.weight" for l in range(3)]
        # An entry of the table can be replaced; its layout stays.
        saved = rvd.MODEL_V_PROJ_PATHS["llama"]
        rvd.MODEL_V_PROJ_PATHS["llama"] = "model.layers.{layer}.self_attn.k_proj"
        try:
            r = architectures.resolve(models.LlamaForCausalLM())
            assert r.tensors[0].name.endswith("k_proj.weight")
        finally:
            rvd.MODEL_V_PROJ_PATHS["llama"] = saved
    finally:
        del rvd.MODEL_V_PROJ_PATHS["mine"]


def test_name_search():
    r = architectures.resolve(models.CustomNet())
    assert (r.arch, r.detected_by, r.pattern) == (None, "search", "blocks.{layer}.value")
    assert sorted(r.tensors) == [0, 1, 2]
    # A fused QKV is never taken for V by the search.
    net = models.CustomNet()
    for b in net.blocks:
        b.value = torch.nn.Identity()
        b.query_key_value = torch.nn.Linear(16, 48)
    with pytest.raises(ValueError, match="no V projection found"):
        architectures.resolve(net)
    # Two candidates: ambiguous.
    net = models.CustomNet()
    for b in net.blocks:
        b.v_proj = torch.nn.Linear(16, 8)
    with pytest.raises(ValueError, match="ambiguous.*blocks.{layer}.v_proj.weight"):
        architectures.resolve(net)


def test_config_checks():
    m = models.LlamaForCausalLM()
    m.config.num_hidden_layers = 7
    with pytest.raises(ValueError, match="num_hidden_layers=7.*6 layers"):
        architectures.resolve(m)
    m = models.LlamaForCausalLM()
    m.config.num_attention_heads = 0
    with pytest.raises(ValueError, match="num_attention_heads.*positive"):
        architectures.resolve(m)

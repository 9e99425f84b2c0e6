#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora into OUT/<target>/.

The checked-in corpus, tests/fuzz/corpus/, was made by
  /usr/bin/python3 tests/fuzz/make_seeds.py tests/fuzz/corpus build
(BUILD/python holds the MeasureHeader stubs every build generates). Each
seed is a small valid or invalid input that reaches a different part of the
parser; libFuzzer mutates from them.

usage: make_seeds.py OUT [BUILD_DIR]   (BUILD_DIR default: build)
"""
import json
import pathlib
import struct
import sys


def safetensors(tensors, metadata=None, pad=True, header_len=None):
    """tensors: [(name, dtype, shape, nbytes)], packed in order."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    blobs = []
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + nbytes]}
        blobs.append(bytes((i * 37) & 0xff for i in range(nbytes)))
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + b"".join(blobs)


def raw(header_obj, data=b""):
    text = json.dumps(header_obj, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    llama = [("model.layers.0.self_attn.v_proj.weight", "F32", [8, 16], 512),
             ("model.layers.1.self_attn.v_proj.weight", "BF16", [8, 16], 256),
             ("model.embed_tokens.weight", "I64", [3, 4], 96)]
    return {
        "valid_llama": safetensors(llama, metadata={"format": "pt"}),
        "valid_f16_scalar": safetensors([("s", "F16", [], 2),
                                         ("e", "U8", [0], 0)]),
        "valid_header_only": safetensors([]),
        "truncated": safetensors(llama)[:-40],
        "header_past_end": safetensors(llama, header_len=1 << 20),
        "not_json": struct.pack("<Q", 8) + b"{\"a\":[1,",
        "overlap": raw({"a": {"dtype": "F32", "shape": [2],
                              "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [1],
                              "data_offsets": [4, 8]}}, bytes(8)),
        "span_mismatch": raw({"a": {"dtype": "F32", "shape": [3],
                                    "data_offsets": [0, 8]}}, bytes(8)),
        "shape_overflow": raw({"a": {"dtype": "F64",
                                     "shape": [4294967296, 4294967296],
                                     "data_offsets": [0, 0]}}),
        "bad_metadata": raw({"__metadata__": [1, 2]}),
        "short": b"\x08\x00\x00",
    }


SEP = b"\n--8<--\n"


def loader_seeds():
    llama = {"model_type": "llama", "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 16}
    index = {"metadata": {}, "weight_map": {}}
    for layer in range(4):
        shard = f"model-0000{1 + layer // 2}-of-00002.safetensors"
        for proj in ("v_proj", "q_proj"):
            index["weight_map"][
                f"model.layers.{layer}.self_attn.{proj}.weight"] = shard
    j = lambda o: json.dumps(o).encode()
    phi3 = safetensors([(f"model.layers.{l}.self_attn.qkv_proj.weight", "F16",
                         [32, 16], 1024) for l in range(2)])
    gpt2 = safetensors([(f"h.{l}.attn.c_attn.weight", "F32", [16, 48], 3072)
                        for l in range(2)])
    return {
        "llama_single": j(llama),
        "llama_sharded": j(llama) + SEP + j(index),
        "no_config": b"",
        "fallback_name_search": j({"model_type": "unknown_arch",
                                   "num_attention_heads": 4,
                                   "num_key_value_heads": 2}),
        "head_dim_key": j(dict(llama, head_dim=4)),
        "bad_heads": j(dict(llama, num_attention_heads=3)),
        "layers_mismatch": j(dict(llama, num_hidden_layers=5)),
        "negative_heads": j(dict(llama, num_attention_heads=-4)),
        "not_an_object": b"[1, 2, 3]",
        "index_escape": j(llama) + SEP + j(
            {"weight_map": {"a": "../model-00001-of-00002.safetensors"}}),
        "index_missing_shard": j(llama) + SEP + j(
            {"weight_map": {"a": "nope.safetensors"}}),
        "index_no_map": j(llama) + SEP + j({"metadata": {}}),
        # No layer count in config.json: only the tensors say how many.
        "phi3": j({"model_type": "phi3",
                   "num_attention_heads": 4, "num_key_value_heads": 2,
                   "hidden_size": 16}) + SEP + SEP + phi3,
        "gpt2": j({"model_type": "gpt2", "n_head": 4,
                   "n_embd": 16}) + SEP + SEP + gpt2,
    }


def header_seeds(build):
    sys.path.insert(0, str(pathlib.Path(build) / "python"))
    from rvd.v1 import rvd_pb2 as pb

    def header(tensors, **kw):
        h = pb.MeasureHeader(model_id="fuzz-model", step=1, **kw)
        for layer, layout, shape, geom, dtype in tensors:
            t = h.tensors.add(name=f"layers.{layer}.v", layer=layer,
                              dtype=dtype, layout=layout)
            t.shape.extend(shape)
            t.geometry.num_heads, t.geometry.num_kv_heads, \
                t.geometry.head_dim = geom
        return h.SerializeToString()

    sep, phi3, neox = pb.V_LAYOUT_SEPARATE, pb.V_LAYOUT_PHI3_QKV, \
        pb.V_LAYOUT_GPT_NEOX_QKV
    mq, grouped, classic, gpt2 = (pb.V_LAYOUT_FALCON_MULTI_QUERY,
                                  pb.V_LAYOUT_FALCON_GROUPED,
                                  pb.V_LAYOUT_FALCON_CLASSIC,
                                  pb.V_LAYOUT_GPT2_CONV1D)
    f32, f16, bf16 = pb.DTYPE_F32, pb.DTYPE_F16, pb.DTYPE_BF16
    four = [(l, sep, [8, 16], (4, 2, 4), f32) for l in range(4)]
    return {
        "separate_4_layers": header(four),
        "per_head_naive": header(four[:2], per_head=True,
                                 variant=pb.Variant(name="naive")),
        "power_iter": header(four[:2], variant=pb.Variant(
            name="power_iter", probes=8, seed=3)),
        "sketch": header(four[:2], variant=pb.Variant(
            name="sketch", sketch_rank=4, seed=5)),
        "early_late": header(four, early_layers=[0], late_layers=[3]),
        "phi3_f16": header([(0, phi3, [32, 16], (4, 2, 4), f16)]),
        "neox_bf16": header([(0, neox, [48, 16], (4, 4, 4), bf16)]),
        "falcon_mq": header([(0, mq, [24, 16], (4, 1, 4), f32)]),
        "falcon_grouped": header([(0, grouped, [32, 16], (4, 2, 4), f32)]),
        "falcon_classic": header([(0, classic, [48, 16], (4, 4, 4), f32)]),
        "gpt2": header([(0, gpt2, [16, 48], (4, 4, 4), f32)],
                       variant=pb.Variant(name="algebraic")),
        "bad_shape": header([(0, sep, [9, 16], (4, 2, 4), f32)]),
        "duplicate_layer": header([(0, sep, [8, 16], (4, 2, 4), f32)] * 2),
        "bad_model_id": pb.MeasureHeader(model_id="a b").SerializeToString(),
        "too_large": header([(0, sep, [1 << 20, 1 << 20], (4, 2, 4), f32)]),
        "unknown_variant": header(four[:1], variant=pb.Variant(name="svd")),
    }


def main():
    out = pathlib.Path(sys.argv[1])
    build = sys.argv[2] if len(sys.argv) > 2 else "build"
    for target, seeds in (("fuzz_safetensors", safetensors_seeds()),
                          ("fuzz_model_loader", loader_seeds()),
                          ("fuzz_measure_header", header_seeds(build))):
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()

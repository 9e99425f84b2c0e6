"""Small torch modules shaped like Hugging Face models: the attribute paths,
weight shapes and config keys that transformers uses, no transformers.

Each carries a `config` (an object with attributes, as PretrainedConfig)
with `model_type`, and a forward that uses the V weights, so that an
optimizer step changes them.
"""
import types

import torch
from torch import nn


def config(**kw):
    return types.SimpleNamespace(**kw)


def spectrum_(weight, gen, decay):
    """Fills a 2-D weight with a matrix whose singular values fall off as
    i^-decay (distinct PRs per layer make a mixed-up layer visible)."""
    rows, cols = weight.shape
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    s = torch.arange(1, k + 1, dtype=torch.float64) ** -decay
    with torch.no_grad():
        weight.copy_(((u * s) @ v.T).to(weight.dtype))


# ---- llama: separate v_proj, GQA ------------------------------------------

class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c.hidden_size // c.num_attention_heads
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_key_value_heads * d, c.hidden_size, bias=False)

    def forward(self, x):
        return self.o_proj(self.v_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c)

    def forward(self, x):
        return x + self.self_attn(x)


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(32, c.hidden_size)
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class LlamaForCausalLM(nn.Module):
    """model.layers.{l}.self_attn.v_proj: [K*d, D] (GQA: K < H)."""

    def __init__(self, layers=6, heads=4, kv_heads=2, hidden=64, seed=0,
                 dtype=torch.float32, model_type="llama", spectrum=True):
        super().__init__()
        self.config = config(model_type=model_type, num_hidden_layers=layers,
                             num_attention_heads=heads,
                             num_key_value_heads=kv_heads, hidden_size=hidden)
        self.model = LlamaModel(self.config)
        gen = torch.Generator().manual_seed(seed)
        if spectrum:  # else nn.Linear's own init (large models: QR is slow)
            for l, layer in enumerate(self.model.layers):
                spectrum_(layer.self_attn.v_proj.weight, gen, 0.2 + 0.15 * l)
        self.to(dtype)

    def forward(self, x):
        return self.model(x)


# ---- gpt_neox: fused query_key_value, per head rows (q, k, v) --------------

class NeoxAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.query_key_value = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.heads = c.num_attention_heads

    def forward(self, x):
        qkv = self.query_key_value(x)
        d = x.shape[-1] // self.heads
        v = qkv.view(*x.shape[:-1], self.heads, 3, d)[..., 2, :]
        return self.dense(v.reshape(x.shape))


class NeoxLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = NeoxAttention(c)

    def forward(self, x):
        return x + self.attention(x)


class NeoxModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layers = nn.ModuleList(NeoxLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class GPTNeoXForCausalLM(nn.Module):
    """gpt_neox.layers.{l}.attention.query_key_value: [H*3*d, D]."""

    def __init__(self, layers=4, heads=4, hidden=32, seed=1, with_config=True):
        super().__init__()
        c = config(model_type="gpt_neox", num_hidden_layers=layers,
                   num_attention_heads=heads, hidden_size=hidden)
        if with_config:
            self.config = c
        self.gpt_neox = NeoxModel(c)
        gen = torch.Generator().manual_seed(seed)
        for l, layer in enumerate(self.gpt_neox.layers):
            spectrum_(layer.attention.query_key_value.weight, gen, 0.3 + 0.2 * l)

    def forward(self, x):
        return self.gpt_neox(x)


# ---- gpt2: Conv1D c_attn stored [D, 3D], columns Q | K | V -----------------

class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: weight [nx, nf], y = x @ W + b."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight) \
            .view(*x.shape[:-1], self.nf)


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = Conv1D(3 * c.n_embd, c.n_embd)
        self.c_proj = Conv1D(c.n_embd, c.n_embd)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        return self.c_proj(v)


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn = GPT2Attention(c)

    def forward(self, x):
        return x + self.attn(x)


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c.n_layer))

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


class GPT2LMHeadModel(nn.Module):
    """transformer.h.{l}.attn.c_attn: Conv1D [D, 3*D]."""

    def __init__(self, layers=4, heads=4, hidden=32, seed=2):
        super().__init__()
        self.config = config(model_type="gpt2", n_layer=layers, n_head=heads,
                             n_embd=hidden)
        self.transformer = GPT2Model(self.config)
        gen = torch.Generator().manual_seed(seed)
        for l, block in enumerate(self.transformer.h):
            spectrum_(block.attn.c_attn.weight, gen, 0.25 + 0.2 * l)

    def forward(self, x):
        return self.transformer(x)


# ---- a model no table knows: found by the name search ----------------------

class ValueBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden // 2)

    def forward(self, x):
        return self.value(x)


class CustomNet(nn.Module):
    """blocks.{l}.value, no config."""

    def __init__(self, layers=3, hidden=16, seed=3):
        super().__init__()
        self.blocks = nn.ModuleList(ValueBlock(hidden) for _ in range(layers))
        gen = torch.Generator().manual_seed(seed)
        for l, b in enumerate(self.blocks):
            spectrum_(b.value.weight, gen, 0.5 + 0.3 * l)


# ---- V blocks as the tests' own oracle cuts them (numpy, float64) ---------

def llama_v(model, layer):
    return model.model.layers[layer].self_attn.v_proj.weight.detach().double().cpu().numpy()


def neox_v(model, layer):
    c = model.gpt_neox.layers[layer].attention
    w = c.query_key_value.weight.detach().double().cpu().numpy()
    h, d = c.heads, w.shape[1] // c.heads
    return w.reshape(h, 3, d, -1)[:, 2].reshape(h * d, -1)


def neox_v_heads(model, layer):
    c = model.gpt_neox.layers[layer].attention
    w = c.query_key_value.weight.detach().double().cpu().numpy()
    h, d = c.heads, w.shape[1] // c.heads
    return list(w.reshape(h, 3, d, -1)[:, 2])


def gpt2_v(model, layer):
    w = model.transformer.h[layer].attn.c_attn.weight.detach().double().cpu().numpy()
    d_model = w.shape[0]
    return w[:, 2 * d_model:]

"""PyTorch models with random weights, shaped as the models the reference profiles describe:
ResNet-50 and ViT-B/16 (torchvision's when it is installed, else built here to the same layers),
and a Llama decoder stack that runs a prefill and a decode step as a serving engine does. The
work a GPU does depends on the shapes, not on the weights' values.

Imports torch: :mod:`bench.gpu_truth` loads this module only once it knows torch is there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from profiles.llm.shape import LlamaShape

# vision


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.down = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                     if stride != 1 or inplanes != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """He et al.'s ResNet-50 (v1.5: the stride on the 3x3 convolution, as torchvision has it)."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, inplanes = [], 64
        for planes, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(n):
                blocks.append(_Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * _Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class VitB16(nn.Module):
    """Dosovitskiy et al.'s ViT-B/16 at 224 x 224: 16 x 16 patches, 12 pre-norm encoder layers of
    width 768, 12 heads, MLP 3072, a class token and a linear head."""

    def __init__(self, image: int = 224, classes: int = 1000, width: int = 768, layers: int = 12,
                 heads: int = 12, mlp: int = 3072) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 16, 16)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, (image // 16) ** 2 + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, mlp, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True, layer_norm_eps=1e-6)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def vision_model(name: str) -> tuple[nn.Module, str]:
    """``resnet50`` or ``vit-b16`` with random weights, and where its definition came from."""
    try:
        import torchvision.models as tvm
    except Exception:  # absent, or built for another torch
        tvm = None
    if tvm is not None:
        build = {"resnet50": tvm.resnet50, "vit-b16": tvm.vit_b_16}[name]
        return build(weights=None), f"torchvision {getattr(__import__('torchvision'), '__version__', '?')}"
    return {"resnet50": ResNet50, "vit-b16": VitB16}[name](), "plain torch (torchvision not importable)"


# the Llama stack


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [batch, heads, tokens, dim] by the angles of its positions (rotate-half form)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Grouped-query attention; q [b, heads, n, d], k and v [b, kv_heads, m, d]."""
    group = q.shape[1] // k.shape[1]
    if not causal and q.shape[2] == 1:
        # one query a sequence: the heads sharing a KV head are that head's queries
        b, h, _, d = q.shape
        out = F.scaled_dot_product_attention(q.view(b, k.shape[1], group, d), k, v)
        return out.reshape(b, h, 1, d)
    # a prefill: each KV head repeated for its query heads (a copy far smaller than the attention's
    # work), so every torch picks its flash kernel, as a serving engine runs one
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          is_causal=causal)


class _Layer(nn.Module):
    def __init__(self, s: LlamaShape, **kw: object) -> None:
        super().__init__()
        self.s = s
        self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=False, **kw)
        self.o = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False, **kw)
        self.gate_up = nn.Linear(s.hidden, 2 * s.intermediate, bias=False, **kw)
        self.down = nn.Linear(s.intermediate, s.hidden, bias=False, **kw)
        self.norm1 = nn.Parameter(torch.ones(s.hidden, **kw))
        self.norm2 = nn.Parameter(torch.ones(s.hidden, **kw))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                start: int) -> torch.Tensor:
        """``x`` [b, n, hidden] at positions start..start+n-1; the keys and values go into the caches
        ``kc``/``vc`` [b, kv_heads, >= start+n, head_dim], and attention reads positions 0..start+n-1."""
        s, (b, n, _) = self.s, x.shape
        h = _rms(x, self.norm1)
        q, k, v = self.qkv(h).view(b, n, -1, s.head_dim).transpose(1, 2).split(
            (s.heads, s.kv_heads, s.kv_heads), dim=1)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        kc[:, :, start:start + n] = k
        vc[:, :, start:start + n] = v
        a = _attention(q, kc[:, :, :start + n], vc[:, :, :start + n], causal=n > 1)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, s.heads * s.head_dim))
        g, u = self.gate_up(_rms(x, self.norm2)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    """``layers`` decoder layers of ``shape`` (fewer than the shape's own when only some are timed),
    the embeddings, the final norm and the LM head, with a KV cache of ``max_seqs`` sequences of
    ``max_len`` tokens. Logits are computed for each sequence's last token only, as an engine
    computes them for the tokens it samples; the sample is the greedy one. The weights are PyTorch's
    default initialisation, made on the device."""

    def __init__(self, shape: LlamaShape, layers: int, max_seqs: int, max_len: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden, **kw)
        self.layers = nn.ModuleList(_Layer(shape, **kw) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(shape.hidden, **kw))
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False, **kw)
        cache = (layers, max_seqs, shape.kv_heads, max_len, shape.head_dim)
        self.kc = torch.zeros(cache, **kw)
        self.vc = torch.zeros(cache, **kw)
        inv = 1.0 / shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=device).float() / shape.head_dim)
        angles = torch.outer(torch.arange(max_len, device=device).float(), inv)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def step(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """One engine step for ``tokens`` [b, n] at positions start..start+n-1 of b sequences: the
        next token of each."""
        b, n = tokens.shape
        x = self.embed(tokens)
        cos, sin = self.cos[start:start + n], self.sin[start:start + n]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, self.kc[i, :b], self.vc[i, :b], start)
        return self.lm_head(_rms(x[:, -1], self.norm)).argmax(-1)


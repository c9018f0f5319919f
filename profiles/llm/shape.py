"""The shapes of the Llama models headrace profiles: what their weights and KV cache weigh, and
what a stack of their layers computes (meta-llama/llama-models ``sku_list.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_len: int = 131072
    head_dim: int = 128
    rope_theta: float = 500000.0

    @property
    def layer_params(self) -> int:
        """Weights of one layer's linear layers (fused QKV, output, gate+up, down)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over every layer, in 16 bits."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def weights_gb(self, bits: float = 16) -> float:
        """The checkpoint's weights: the layers' linear layers at ``bits`` a weight, the embeddings
        and the (untied) LM head in 16 bits, as quantised checkpoints keep them; norms negligible."""
        return round((self.layers * self.layer_params * bits / 8 + 2 * self.vocab * self.hidden * 2) / 1e9, 2)


LLAMA_SHAPES = {
    "llama3-8b": LlamaShape(32, 4096, 32, 8, 14336, 128256),  # Llama-3 and 3.1 8B
    "llama3-70b": LlamaShape(80, 8192, 64, 8, 28672, 128256),
    "llama2-7b": LlamaShape(32, 4096, 32, 32, 11008, 32000, max_len=4096, rope_theta=10000.0),
    "llama2-70b": LlamaShape(80, 8192, 64, 8, 28672, 32000, max_len=4096, rope_theta=10000.0),
}

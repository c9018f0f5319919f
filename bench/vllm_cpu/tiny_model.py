"""A tiny Llama for real vLLM on CPU: its config and a tokenizer trained here, no weights (vLLM's
``--load-format dummy`` fills them with random values), nothing downloaded.

The shape: hidden 128, 2 layers, 2 attention heads of 64 (vLLM's CPU attention takes no head
size of 16), 1 KV head, vocabulary 512, bf16: a KV cache of 2 x 2 x 1 x 64 x 2 = 512 bytes a
token. The tokenizer is a byte-level BPE of 512 ids trained with ``tokenizers`` on text made
here, with a chat template, so ``/v1/chat/completions`` works too.

Runs in the vLLM venv (it has ``tokenizers``):
``.venv-vllm/bin/python bench/vllm_cpu/tiny_model.py DIR``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HIDDEN = 128
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = HIDDEN // HEADS
VOCAB = 512
INTERMEDIATE = 384
MAX_POSITIONS = 4096
DTYPE_BYTES = 2  # bf16
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * DTYPE_BYTES
WEIGHTS = (VOCAB * HIDDEN * 2  # embedding and LM head (untied)
           + LAYERS * (HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN
                       + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN) + HIDDEN)
WEIGHTS_BYTES = WEIGHTS * DTYPE_BYTES
SPECIAL = ("<s>", "</s>", "<unk>")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
_TEXT = ("the engine batches tokens and every request waits for its first token while the cache holds "
          "blocks of keys and values a prefix shared by many prompts is computed once then read again "
          "user assistant system hello how are you model serving latency throughput deadline")


def config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTERMEDIATE,
        "vocab_size": VOCAB, "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }


def corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = _TEXT.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def write(out: Path) -> Path:
    """The model's config.json and tokenizer files in ``out`` (made if missing); returns ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": MAX_POSITIONS, "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: tiny_model.py DIR", file=sys.stderr)
        raise SystemExit(2)
    print(write(Path(sys.argv[1])))

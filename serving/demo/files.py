"""Write a model directory the way Hugging Face publishes one (config,
tokenizer, safetensors); `hub.publish` then places it in the local HF cache
so the registry and `mlx_lm.load` see it like a download.

Shared by the demo-model builder and the test fixtures (which build a tiny
random model the same way, minus the training).
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Markup the model writes as text: single tokens, but not special ones, so
# they decode into the text stream and grammars can match them.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

# ChatML with tools and a thinking switch. Tools are listed compactly, as
# `name(param, …)` (the demo model trains on short rows); the model learns
# to call one as <tool_call>{"name": …, "arguments": {…}}</tool_call>,
# results come back in a `tool` turn. With enable_thinking the reply opens
# in a <think> block; without it the prompt carries an empty one (as Qwen3
# does), which tells the model plainly to answer at once.
# Content arrives as a string: the protocol modules flatten parts.
CHAT_TEMPLATE = (
    "{% set sys = messages[0].content if messages and messages[0].role == 'system' else none %}"
    "{% if tools %}"
    "<|im_start|>system\n{% if sys %}{{ sys }}\n{% endif %}Tools:"
    "{% for tool in tools %} {{ tool.function.name }}("
    "{{ (tool.function.parameters.properties if tool.function.parameters else {}) | list | join(', ') }})"
    "{% endfor %}<|im_end|>\n"
    "{% elif sys %}<|im_start|>system\n{{ sys }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'tool' %}<|im_start|>tool\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for call in m.tool_calls or [] %}"
    "<tool_call>{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}}"
    "</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, markup: bool = True, words: tuple[str, ...] = (),
                    numbers_apart: bool = False) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2 style) learned from `texts`, with the
    markup tokens appended unless `markup` is false, and `words` appended
    as whole tokens (names and values a small model must write exactly).
    With `numbers_apart`, a number never shares a token with the space
    before it, so "set bits to 4" holds the very token `"value": "4"` writes."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False), byte_level])
                         if numbers_apart else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if markup:
        tok.add_tokens(MARKUP_TOKENS)
    if words:
        tok.add_tokens(list(words))
    return tok


def llama_config(vocab_size: int, hidden: int, layers: int, heads: int, intermediate: int,
                 context: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab_size,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def write_tokenizer(out: Path, tok: Tokenizer, context: int, chat_template: str = CHAT_TEMPLATE) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": IM_END, "pad_token": PAD}))


def write_model_dir(out: Path, weights: dict, config: dict, tok: Tokenizer,
                    generation_config: dict | None = None, chat_template: str = CHAT_TEMPLATE) -> None:
    """Write config, tokenizer and float32 safetensors weights into `out`."""
    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(out, tok, config["max_position_embeddings"], chat_template)
    if generation_config is not None:
        (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})

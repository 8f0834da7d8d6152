"""Tiny random-weight models (GPT-2 and Qwen2 code paths) built and saved in the test, fully offline."""
from __future__ import annotations

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "Alice lives in Lisbon and works as a baker.",
    "Bob keeps the spare key under the blue flower pot.",
    "Question: Where does Alice live?\nAnswer: Lisbon.",
    "The meeting with Carol is on Friday at three in the afternoon.",
] * 20


def _tokenizer(*, chat: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if chat else ["<|endoftext|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>" if chat else "<|endoftext|>")
    if chat:
        fast.chat_template = CHATML
    return fast


def build_tiny(path, arch: str) -> str:
    """Save a tiny random-weight ``arch`` ("gpt2" | "qwen2") model and its tokenizer under ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

    torch.manual_seed(0)
    tok = _tokenizer(chat=arch == "qwen2")
    vocab = len(tok)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=512, n_embd=64, n_layer=2, n_head=4, initializer_range=0.2,
                            eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    else:
        config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=True,
                             eos_token_id=tok.eos_token_id, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)

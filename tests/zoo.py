"""The model zoo of the frontend tests: small Hugging Face transformers models built from configs
(random weights, seeded; no downloads), their stock inputs and dynamic shapes.

Each architecture is 2 layers, hidden size <= 256, a vocabulary of 128: small enough that the
whole zoo imports and runs through both frontends in about a minute.
"""

from __future__ import annotations

import attrs
import numpy as np

VOCAB = 128

_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)


@attrs.frozen
class Arch:
    """One architecture: its transformers model and config classes, config arguments, and
    whether it reads tokens (``input_ids`` [+ ``attention_mask``]) or images (``pixel_values``)."""

    name: str
    model: str
    config: str
    kwargs: dict = attrs.field(factory=dict, hash=False)
    vision: bool = False
    mask: bool = True  # takes an attention_mask
    attention: bool = True  # has attention layers (an attention implementation to choose)

    def build(self, attn: str = "sdpa"):
        import torch
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, self.config)(**self.kwargs)
        if self.attention:
            config._attn_implementation = attn
        model = getattr(transformers, self.model)(config).eval()
        return model

    def inputs(self, length: int, seed: int = 0, mask: bool = False, batch: int = 2) -> dict:
        """The stock call's arguments: ``batch`` rows of ``length`` tokens (or a batch of
        ``length`` images), with an attention_mask when ``mask`` whose odd rows are left-padded."""
        import torch

        g = torch.Generator().manual_seed(seed)
        if self.vision:
            size = self.kwargs.get("image_size", 32)
            channels = self.kwargs.get("num_channels", 3)
            return {"pixel_values": torch.randn(length, channels, size, size, generator=g)}
        ids = torch.randint(0, VOCAB, (batch, length), generator=g)
        if not mask:
            return {"input_ids": ids}
        attention = torch.ones(batch, length, dtype=torch.long)
        attention[1::2, : length // 3] = 0  # every second row is left-padded
        return {"input_ids": ids, "attention_mask": attention}

    def dynamic_shapes(self, inputs: dict) -> dict:
        import torch

        dim = torch.export.Dim("batch" if self.vision else "seq", min=1 if self.vision else 2, max=64)
        axis = 0 if self.vision else 1
        return {name: {axis: dim} for name in inputs}


ARCHS = {a.name: a for a in [
    Arch("llama", "LlamaModel", "LlamaConfig", dict(_DECODER)),
    Arch("qwen2", "Qwen2Model", "Qwen2Config", dict(_DECODER)),
    Arch("qwen3", "Qwen3Model", "Qwen3Config", dict(_DECODER, head_dim=16)),
    Arch("mistral", "MistralModel", "MistralConfig", dict(_DECODER)),
    Arch("phi3", "Phi3Model", "Phi3Config", dict(_DECODER, pad_token_id=0)),
    Arch("gemma", "GemmaModel", "GemmaConfig", dict(_DECODER, head_dim=16)),
    Arch("gpt2", "GPT2Model", "GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    Arch("opt", "OPTModel", "OPTConfig", dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                              num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64)),
    Arch("gpt_neox", "GPTNeoXModel", "GPTNeoXConfig", dict(_DECODER, num_key_value_heads=None)),
    Arch("bert", "BertModel", "BertConfig", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)),
    Arch("t5", "T5EncoderModel", "T5Config", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                   num_heads=4)),
    Arch("vit", "ViTModel", "ViTConfig", dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=2, num_attention_heads=4), vision=True, mask=False),
    # more that import the same way (bench/, and the lead's wider runs); GPT-J, Bloom and Gemma 2
    # have no SDPA in transformers 5.23: build them with attn="eager"
    Arch("falcon", "FalconModel", "FalconConfig", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                       num_attention_heads=4)),
    Arch("phi", "PhiModel", "PhiConfig", dict(_DECODER)),
    Arch("stablelm", "StableLmModel", "StableLmConfig", dict(_DECODER)),
    Arch("olmo", "OlmoModel", "OlmoConfig", dict(_DECODER)),
    Arch("gemma3", "Gemma3TextModel", "Gemma3TextConfig", dict(_DECODER, head_dim=16)),
    Arch("starcoder2", "Starcoder2Model", "Starcoder2Config", dict(_DECODER)),
    Arch("granite", "GraniteModel", "GraniteConfig", dict(_DECODER)),
    Arch("gptj", "GPTJModel", "GPTJConfig", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                 n_positions=128)),
    Arch("bloom", "BloomModel", "BloomConfig", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)),
    Arch("gemma2", "Gemma2Model", "Gemma2Config", dict(_DECODER, head_dim=16)),
    Arch("roberta", "RobertaModel", "RobertaConfig", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          max_position_embeddings=130)),
    Arch("distilbert", "DistilBertModel", "DistilBertConfig", dict(vocab_size=VOCAB, dim=64, hidden_dim=128, n_layers=2,
                                                                   n_heads=4)),
    Arch("deit", "DeiTModel", "DeiTConfig", dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4), vision=True, mask=False),
    Arch("convnext", "ConvNextModel", "ConvNextConfig", dict(image_size=32, hidden_sizes=[16, 32], depths=[1, 1],
                                                             num_stages=2), vision=True, mask=False, attention=False),
    Arch("resnet", "ResNetModel", "ResNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                       image_size=32), vision=True, mask=False, attention=False),
]}


def torch_outputs(model, inputs: dict) -> list[np.ndarray]:
    """The model's tensor outputs, flattened as the frontends flatten them."""
    import torch

    with torch.no_grad():
        out = model(**inputs)
    values = out.values() if hasattr(out, "values") else out
    return [v.numpy() for v in values if isinstance(v, torch.Tensor)]

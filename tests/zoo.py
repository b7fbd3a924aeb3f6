"""The model zoo of the frontend tests: small Hugging Face transformers models built from configs
(random weights, seeded; no downloads), their stock inputs and dynamic shapes.

Each architecture is 2 layers, hidden size <= 256, a vocabulary of 128: small enough that the
whole zoo imports and runs through both frontends in about a minute.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

import attrs
import numpy as np

VOCAB = 128
RTOL, ATOL = 1e-4, 1e-5
LENGTHS = {False: (8, 5), True: (2, 3)}  # tokens, or images in a batch

# ops dpl computes op by op on the host where no C kernel exists, by their nature
OPAQUE_BY_NATURE = {"take": "a gather", "cumsum": "a scan"}

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
    # what it reads beyond tokens and images: "audio" (input_values [batch, samples]) or
    # "seq2seq" (input_ids and decoder_input_ids, each of its own dynamic length)
    kind: str = ""
    lengths: tuple = ()  # the two sizes compared (samples for audio); () takes LENGTHS
    static: bool = False  # exported at its first size only (torch.export cannot trace it over a range)
    # exported over lengths that are multiples of this only (a derived Dim, chunks * k): a chunked
    # scan that pads to a multiple of its chunk branches on the padding, which a range cannot trace
    length_multiple: int = 1

    @property
    def sizes(self) -> tuple:
        """The two sizes the zoo compares at: tokens, images in a batch, or audio samples."""
        return self.lengths or LENGTHS[self.vision]

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
        if self.kind == "audio":
            return {"input_values": torch.randn(batch, length, generator=g)}
        if self.vision:
            size = self.kwargs.get("image_size", 32)
            channels = self.kwargs.get("num_channels", 3)
            return {"pixel_values": torch.randn(length, channels, size, size, generator=g)}
        ids = torch.randint(0, VOCAB, (batch, length), generator=g)
        extra = {}
        if self.kind == "seq2seq":  # a decoder of its own length, shorter than the encoder's
            extra["decoder_input_ids"] = torch.randint(0, VOCAB, (batch, length // 2 + 1), generator=g)
        if not mask:
            return {"input_ids": ids, **extra}
        attention = torch.ones(batch, length, dtype=torch.long)
        attention[1::2, : length // 3] = 0  # every second row is left-padded
        return {"input_ids": ids, "attention_mask": attention, **extra}

    def dynamic_shapes(self, inputs: dict) -> dict | None:
        import torch

        if self.static:
            return None
        if self.kind == "audio":
            return {name: {1: torch.export.Dim("samples", min=min(self.sizes), max=4096)} for name in inputs}
        dim = torch.export.Dim("batch" if self.vision else "seq", min=1 if self.vision else 2, max=64)
        if self.length_multiple > 1:
            dim = self.length_multiple * torch.export.Dim("chunks", min=1, max=64 // self.length_multiple)
        axis = 0 if self.vision else 1
        shapes = {name: {axis: dim} for name in inputs}
        if "decoder_input_ids" in inputs:
            shapes["decoder_input_ids"] = {1: torch.export.Dim("decoder_seq", min=2, max=64)}
        return shapes


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

# Text and speech beyond decoders and BERT: an encoder-decoder, a speech encoder with 1-D convs,
# disentangled attention, a mixture of experts and a state-space model (tests/test_zoo_text_speech.py)
ARCHS.update({a.name: a for a in [
    Arch("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config",
         dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, conv_dim=(32, 32),
              conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
              feat_extract_norm="group"), mask=False, kind="audio", lengths=(400, 277)),
    Arch("deberta_v2", "DebertaV2Model", "DebertaV2Config",
         dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
              position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0),
         attention=False),  # its own attention only: transformers 5.23 has no SDPA for DeBERTa
    Arch("bart", "BartModel", "BartConfig",
         dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128),
         kind="seq2seq"),
    Arch("mixtral", "MixtralModel", "MixtralConfig", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2)),
    # the experts as one batched product over every expert's weight per routed row (what
    # torch.onnx can export: it has no function for grouped_mm's custom op)
    Arch("mixtral_batched", "MixtralModel", "MixtralConfig",
         dict(_DECODER, num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm")),
    Arch("mamba2", "Mamba2Model", "Mamba2Config",
         dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2, head_dim=16, num_heads=8,
              n_groups=1, chunk_size=4, conv_kernel=4), mask=False, attention=False, length_multiple=4, lengths=(8, 12)),
]})


# torch.compile wider set (tests/test_torch_compile_wide.py): a whole T5 encoder-decoder, a
# speech encoder trained otherwise than wav2vec2, and two more vision transformers
ARCHS.update({a.name: a for a in [
    Arch("t5_seq2seq", "T5Model", "T5Config", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                    num_heads=4, decoder_start_token_id=0), kind="seq2seq"),
    Arch("hubert", "HubertModel", "HubertConfig",
         dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, conv_dim=(32, 32),
              conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
              feat_extract_norm="group"), mask=False, kind="audio", lengths=(400, 277)),
    Arch("dinov2", "Dinov2Model", "Dinov2Config", dict(image_size=32, patch_size=8, hidden_size=64, mlp_ratio=2,
                                                       num_hidden_layers=2, num_attention_heads=4), vision=True, mask=False),
    Arch("clip_vision", "CLIPVisionModel", "CLIPVisionConfig", dict(image_size=32, patch_size=8, hidden_size=64,
                                                                    intermediate_size=128, num_hidden_layers=2,
                                                                    num_attention_heads=4), vision=True, mask=False),
]})


# Vision beyond ViT, ResNet and ConvNeXt (tests/test_zoo_vision.py): windowed attention with a
# cyclic shift and a pad (Swin: 12 x 12 patches, windows of 5), a segmentation head that
# upsamples bilinearly (SegFormer), depthwise convs and relu6 (MobileNetV2), squeeze-excite,
# swish and "same" padding (EfficientNet), grouped convs (RegNet), and MobileViT's unfolding
# that merges the batch with the positions in a patch
ARCHS.update({a.name: a for a in [
    Arch("swin", "SwinModel", "SwinConfig", dict(image_size=24, patch_size=2, embed_dim=16, depths=[2, 2],
                                                 num_heads=[2, 2], window_size=5), vision=True, mask=False),
    Arch("segformer", "SegformerForSemanticSegmentation", "SegformerConfig",
         dict(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
              num_attention_heads=[1, 2], decoder_hidden_size=32, num_labels=3), vision=True, mask=False),
    Arch("mobilenet_v2", "MobileNetV2Model", "MobileNetV2Config", dict(image_size=32, depth_multiplier=0.25),
         vision=True, mask=False, attention=False),
    Arch("efficientnet", "EfficientNetModel", "EfficientNetConfig",
         dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320),
         vision=True, mask=False, attention=False),
    Arch("regnet", "RegNetModel", "RegNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                       groups_width=8), vision=True, mask=False, attention=False),
    # attention=False: its own attention only (transformers 5.23 has no SDPA for MobileViT)
    Arch("mobilevit", "MobileViTModel", "MobileViTConfig",
         dict(image_size=32, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
              num_attention_heads=2), vision=True, mask=False, attention=False),
]})


def torch_outputs(model, inputs: dict) -> list[np.ndarray]:
    """The model's tensor outputs, flattened as the frontends flatten them."""
    import torch

    with torch.no_grad():
        out = model(**inputs)
    values = out.values() if hasattr(out, "values") else out
    return [v.numpy() for v in values if isinstance(v, torch.Tensor)]


def import_torch(arch, attn: str = "sdpa"):
    """(model, stock inputs, the dpl module) of ``arch`` through torch.export, with its dynamic dim."""
    import dpl

    model = arch.build(attn)
    inputs = arch.inputs(arch.sizes[0], mask=arch.mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = dpl.from_torch(model, (), inputs, dynamic_shapes=arch.dynamic_shapes(inputs))
    return model, inputs, mod


def import_onnx(arch, attn: str = "sdpa"):
    """(model, the dpl module) of ``arch`` through torch.onnx.export(dynamo=True), with its dynamic dim."""
    import torch

    import dpl
    from dpl.frontend.torch_export import tensor_outputs

    model = arch.build(attn)
    inputs = arch.inputs(arch.sizes[0], mask=arch.mask)
    handle = model.register_forward_hook(lambda _m, _a, out: tensor_outputs(torch, out))
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            program = torch.onnx.export(model, (), kwargs=inputs, dynamic_shapes=arch.dynamic_shapes(inputs), dynamo=True)
    finally:
        handle.remove()
    return model, dpl.from_onnx(program.model_proto)


def check_module(arch, model, mod, *, real_tokens_only=False, libraries=("rewrites", "llm")):
    """Fused with ``libraries`` and built for cpu and numpy, ``mod`` computes what ``model`` does at
    both of the arch's sizes; only ops opaque by nature fall back."""
    import dpl

    fused = dpl.apply(mod, list(libraries))
    for target in ("cpu", "numpy"):
        exe = dpl.build(fused, target)
        for i, length in enumerate(arch.sizes):
            inputs = arch.inputs(length, seed=10 + i, mask=arch.mask)
            want = torch_outputs(model, inputs)
            got = exe(*[v.numpy() for v in inputs.values()])
            got = list(got) if isinstance(got, (tuple, list)) else [got]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                g = np.asarray(g)
                # the rows of the masked tokens (an encoder-decoder's decoder rows are all real)
                if real_tokens_only and "attention_mask" in inputs and g.shape[:2] == inputs["attention_mask"].shape:
                    keep = inputs["attention_mask"].numpy().astype(bool)
                    g, w = g[keep], w[keep]
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{arch.name} on {target} at {length}")
        check_fallbacks(exe)


def coverage_share(mod, libraries):
    """(the share of the ops that run, opaque ones left out, fused after dpl.apply(mod,
    libraries); the Coverage). A lone view runs as nothing (an alias) and is left out too."""
    import dpl

    trace = dpl.Trace()
    dpl.apply(mod, libraries, trace=trace)
    cov = trace.coverage()["main"]
    return cov.fused_share, cov


def check_coverage(name, mod, libraries, floor):
    """At least ``floor`` percent of ``mod``'s ops fused with ``libraries`` (:func:`coverage_share`),
    and every lone op says why; the message lists the lone ops."""
    share, cov = coverage_share(mod, libraries)
    alone = sorted({(a.op, a.reason) for a in cov.alone})
    assert share >= floor, f"{name}: {share:.1f}% fused; alone: {alone}"
    assert all(a.detail for a in cov.alone), "every lone op says why"


def check_fallbacks(exe):
    """Every fall-back is an op opaque by nature, and says why."""
    for fallback in exe.fallbacks:
        ops = set(re.findall(r"[a-z_.0-9]+", fallback.unit))
        assert ops & set(OPAQUE_BY_NATURE), f"unexpected fall-back: {fallback}"
        assert fallback.reason, fallback



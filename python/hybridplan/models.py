"""Built-in models: small stand-ins for the paper's three networks, sized to profile and train in
milliseconds on a CPU.

    branchy_cnn  Inception-style CNN: parallel branches concatenated (Inception-V3's shape)
    gnmt_lstm    GNMT-style LSTM encoder-decoder with residual connections and attention
    biglstm      BigLSTM-style language model: embedding, 2 projected LSTMs, a large softmax
    transformer_lm  a causal transformer language model of torch's own TransformerEncoderLayers
                 (the cost model's second family: attention's shapes, many small matmuls)
    llama_lm     a Hugging Face Llama decoder built from a config (rotary positions, grouped-
                 query attention, SwiGLU): what tensor parallelism splits whole
    digits_cnn   a small CNN for scikit-learn's 8x8 handwritten digits (hybridplan.datasets):
                 the model time-to-accuracy is measured on, trained on real data to a target

Every model is deterministic and trains the same under any split (the executor's tests compare
against single-process training), so: no BatchNorm (GroupNorm instead), no dropout, no in-place
ops, no data-dependent control flow (each forward is torch.fx symbolic_trace-able, except
transformer_lm's torch layers and llama_lm's Hugging Face modules, whose edges the profiler takes
from hooks), and all sequence
models are batch_first so dim 0 of every input is the batch.

Each model carries its own example data and loss:

    model = hybridplan.models.branchy_cnn()
    inputs = model.example_inputs(batch_size=8)          # tuple, pass as model(*inputs)
    target = model.example_target(batch_size=8)
    loss = model.loss(model(*inputs), target)

Factories take a `seed` and leave the global RNG untouched, so two calls build identical models.
"""

from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BranchyCNN", "GnmtLstm", "BigLstm", "TransformerLM", "DigitsCNN", "branchy_cnn",
           "gnmt_lstm", "biglstm", "transformer_lm", "llama_lm", "digits_cnn", "MODELS", "get",
           "loss_and_target"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _ExampleData:
    """Example inputs, targets and the training loss; mixed into each built-in model."""

    def example_inputs(self, batch_size: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def example_target(self, batch_size: int, seed: int = 1) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of logits `output` (..., classes) against class ids `target` (...)."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


class _TokenData(_ExampleData):
    """Random token ids (B, seq_len) below vocab_size as inputs, and as next-token targets: the
    language models' example data."""

    vocab_size: int
    seq_len: int

    def example_inputs(self, batch_size: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
        shape = (batch_size, self.seq_len)
        return (torch.randint(0, self.vocab_size, shape, generator=_generator(seed)),)

    def example_target(self, batch_size: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch_size, self.seq_len),
                             generator=_generator(seed))


# ---- branchy_cnn ------------------------------------------------------------------------------

class ConvNormAct(nn.Module):
    """conv -> GroupNorm -> ReLU (functional, so the ReLU folds into the next node)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=kernel_size // 2, bias=False)
        self.norm = nn.GroupNorm(num_groups=4, num_channels=out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x)))


class InceptionBlock(nn.Module):
    """Four parallel branches (1x1; 1x1->3x3; 1x1->3x3->3x3; maxpool->1x1) concatenated on
    channels, as in Inception-V3's mixed blocks (https://arxiv.org/abs/1512.00567)."""

    def __init__(self, in_channels: int, width: int):
        super().__init__()
        self.branch1x1 = ConvNormAct(in_channels, width, 1)
        self.branch3x3_reduce = ConvNormAct(in_channels, width, 1)
        self.branch3x3 = ConvNormAct(width, width, 3)
        self.branch5x5_reduce = ConvNormAct(in_channels, width, 1)
        self.branch5x5_a = ConvNormAct(width, width, 3)
        self.branch5x5_b = ConvNormAct(width, width, 3)
        self.branch_pool = nn.MaxPool2d(kernel_size=3, stride=1, padding=1)
        self.branch_pool_proj = ConvNormAct(in_channels, width, 1)
        self.out_channels = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3(self.branch3x3_reduce(x))
        b5 = self.branch5x5_b(self.branch5x5_a(self.branch5x5_reduce(x)))
        bp = self.branch_pool_proj(self.branch_pool(x))
        return torch.cat([b1, b3, b5, bp], dim=1)


class BranchyCNN(_ExampleData, nn.Module):
    """Stem, two Inception-style blocks, global average pool, classifier. Input (B, 3, H, W)."""

    def __init__(self, num_classes: int = 10, width: int = 16, image_size: int = 32):
        super().__init__()
        self.num_classes = num_classes
        self.image_size = image_size
        self.stem = ConvNormAct(3, 2 * width, 3, stride=2)
        self.block1 = InceptionBlock(2 * width, width)
        self.reduce = ConvNormAct(self.block1.out_channels, 2 * width, 3, stride=2)
        self.block2 = InceptionBlock(2 * width, width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.block2.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.reduce(self.block1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))

    def example_inputs(self, batch_size: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
        shape = (batch_size, 3, self.image_size, self.image_size)
        return (torch.randn(shape, generator=_generator(seed)),)

    def example_target(self, batch_size: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(0, self.num_classes, (batch_size,), generator=_generator(seed))


# ---- digits_cnn -------------------------------------------------------------------------------

class DigitsCNN(_ExampleData, nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool, two linear layers; input (B, 1, 8, 8), 10 classes.
    Its example data are random images of the digits' shape (for profiling and timing); the
    training data are the real digits (hybridplan.datasets.digits)."""

    def __init__(self, width: int = 16, hidden: int = 64, num_classes: int = 10):
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    def example_inputs(self, batch_size: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
        return (torch.rand((batch_size, 1, 8, 8), generator=_generator(seed)),)

    def example_target(self, batch_size: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(0, self.num_classes, (batch_size,), generator=_generator(seed))


# ---- gnmt_lstm --------------------------------------------------------------------------------

class DotAttention(nn.Module):
    """Luong-style attention (https://arxiv.org/abs/1508.04025), one leaf with its own weight:
    context = softmax((q W) k^T) k for decoder states q (B, T, H) and encoder states k (B, S, H)."""

    def __init__(self, hidden_size: int, generator: torch.Generator):
        super().__init__()
        scale = hidden_size ** -0.5
        self.query_weight = nn.Parameter(
            torch.randn(hidden_size, hidden_size, generator=generator) * scale)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(query @ self.query_weight, keys.transpose(1, 2))
        return torch.bmm(torch.softmax(scores, dim=-1), keys)


class GnmtLstm(_ExampleData, nn.Module):
    """GNMT-style encoder-decoder (https://arxiv.org/abs/1609.08144), scaled down: a
    bidirectional first encoder layer, residual connections from the third layer on, attention
    fed into every decoder layer after the first. Inputs: source and target token ids (B, S) and
    (B, T)."""

    def __init__(self, vocab_size: int = 1000, hidden_size: int = 64, src_len: int = 12,
                 tgt_len: int = 12, seed: int = 0):
        super().__init__()
        self.vocab_size, self.src_len, self.tgt_len = vocab_size, src_len, tgt_len
        h = hidden_size
        self.enc_embed = nn.Embedding(vocab_size, h)
        self.enc_lstm0 = nn.LSTM(h, h // 2, batch_first=True, bidirectional=True)
        self.enc_lstm1 = nn.LSTM(h, h, batch_first=True)
        self.enc_lstm2 = nn.LSTM(h, h, batch_first=True)
        self.enc_lstm3 = nn.LSTM(h, h, batch_first=True)
        self.dec_embed = nn.Embedding(vocab_size, h)
        self.dec_lstm0 = nn.LSTM(h, h, batch_first=True)
        self.attention = DotAttention(h, _generator(seed + 1))
        self.dec_lstm1 = nn.LSTM(2 * h, h, batch_first=True)
        self.dec_lstm2 = nn.LSTM(2 * h, h, batch_first=True)
        self.dec_lstm3 = nn.LSTM(2 * h, h, batch_first=True)
        self.classifier = nn.Linear(h, vocab_size)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.enc_lstm0(self.enc_embed(src))[0]
        x = self.enc_lstm1(x)[0]
        x = x + self.enc_lstm2(x)[0]
        enc = x + self.enc_lstm3(x)[0]
        y = self.dec_lstm0(self.dec_embed(tgt))[0]
        context = self.attention(y, enc)
        y = self.dec_lstm1(torch.cat([y, context], dim=-1))[0]
        y = y + self.dec_lstm2(torch.cat([y, context], dim=-1))[0]
        y = y + self.dec_lstm3(torch.cat([y, context], dim=-1))[0]
        return self.classifier(y)

    def example_inputs(self, batch_size: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
        g = _generator(seed)
        src = torch.randint(0, self.vocab_size, (batch_size, self.src_len), generator=g)
        tgt = torch.randint(0, self.vocab_size, (batch_size, self.tgt_len), generator=g)
        return (src, tgt)

    def example_target(self, batch_size: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch_size, self.tgt_len),
                             generator=_generator(seed))


# ---- biglstm ----------------------------------------------------------------------------------

class BigLstm(_TokenData, nn.Module):
    """BigLSTM-style language model (Jozefowicz et al., https://arxiv.org/abs/1602.02410), scaled
    down: embedding, two LSTM layers with projection (LSTMP, nn.LSTM proj_size), and a softmax
    layer over a vocabulary large relative to the rest, so the classifier dominates parameters.
    Input: token ids (B, T); output: next-token logits (B, T, vocab)."""

    def __init__(self, vocab_size: int = 4096, embed_size: int = 64, hidden_size: int = 128,
                 seq_len: int = 16):
        super().__init__()
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.lstm0 = nn.LSTM(embed_size, hidden_size, proj_size=embed_size, batch_first=True)
        self.lstm1 = nn.LSTM(embed_size, hidden_size, proj_size=embed_size, batch_first=True)
        self.softmax = nn.Linear(embed_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.lstm0(self.embed(tokens))[0]
        x = self.lstm1(x)[0]
        return self.softmax(x)


# ---- transformer_lm ---------------------------------------------------------------------------

class TransformerLM(_TokenData, nn.Module):
    """Decoder-only language model of torch's nn.TransformerEncoderLayer (pre-norm, GELU) under
    a causal mask: token and learned position embeddings, `num_layers` layers, a final norm and
    an untied vocabulary head. Input: token ids (B, T); output: next-token logits (B, T, V)."""

    def __init__(self, vocab_size: int = 512, d_model: int = 96, num_heads: int = 4,
                 num_layers: int = 4, seq_len: int = 32):
        super().__init__()
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, num_heads, 4 * d_model, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        steps = tokens.shape[1]
        positions = torch.arange(steps, device=tokens.device)
        mask = nn.Transformer.generate_square_subsequent_mask(steps, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


# ---- llama_lm ---------------------------------------------------------------------------------

class LlamaLM(_TokenData, nn.Module):
    """A Hugging Face Llama decoder (transformers' LlamaForCausalLM, built from a config, random
    weights: nothing is downloaded) behind the built-in models' interface: token ids (B, T) in,
    next-token logits (B, T, V) out. Rotary positions, RMSNorm, grouped-query attention
    (`num_kv_heads` < `num_heads`), a SwiGLU MLP: the decoder family people train today."""

    def __init__(self, vocab_size: int = 512, d_model: int = 96, num_heads: int = 4,
                 num_kv_heads: int = 2, num_layers: int = 4, seq_len: int = 32,
                 intermediate_size: int = 256):
        super().__init__()
        # optional: only this model needs transformers, so the other models work without it
        from transformers import LlamaConfig, LlamaForCausalLM

        self.vocab_size, self.seq_len = vocab_size, seq_len
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=d_model,
                             intermediate_size=intermediate_size, num_hidden_layers=num_layers,
                             num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                             max_position_embeddings=2 * seq_len, use_cache=False,
                             attention_dropout=0.0, pad_token_id=0, bos_token_id=0,
                             eos_token_id=0, tie_word_embeddings=False)
        self.llama = LlamaForCausalLM(config)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.llama(input_ids=tokens).logits


# ---- factories --------------------------------------------------------------------------------

def _seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    # fork_rng: parameter init draws from the global RNG; keep the caller's stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def branchy_cnn(seed: int = 0, **kwargs) -> BranchyCNN:
    """Inception-style CNN; kwargs: num_classes, width, image_size."""
    return _seeded(lambda: BranchyCNN(**kwargs), seed)


def gnmt_lstm(seed: int = 0, **kwargs) -> GnmtLstm:
    """GNMT-style LSTM encoder-decoder; kwargs: vocab_size, hidden_size, src_len, tgt_len."""
    return _seeded(lambda: GnmtLstm(seed=seed, **kwargs), seed)


def biglstm(seed: int = 0, **kwargs) -> BigLstm:
    """BigLSTM-style language model; kwargs: vocab_size, embed_size, hidden_size, seq_len."""
    return _seeded(lambda: BigLstm(**kwargs), seed)


def transformer_lm(seed: int = 0, **kwargs) -> TransformerLM:
    """Causal transformer language model; kwargs: vocab_size, d_model, num_heads, num_layers,
    seq_len."""
    return _seeded(lambda: TransformerLM(**kwargs), seed)


def llama_lm(seed: int = 0, **kwargs) -> LlamaLM:
    """Hugging Face Llama decoder from a config; kwargs: vocab_size, d_model, num_heads,
    num_kv_heads, num_layers, seq_len, intermediate_size."""
    return _seeded(lambda: LlamaLM(**kwargs), seed)


def digits_cnn(seed: int = 0, **kwargs) -> DigitsCNN:
    """Small CNN for the 8x8 digits; kwargs: width, hidden, num_classes."""
    return _seeded(lambda: DigitsCNN(**kwargs), seed)


MODELS: Dict[str, Callable[..., nn.Module]] = {
    "branchy_cnn": branchy_cnn, "gnmt_lstm": gnmt_lstm, "biglstm": biglstm,
    "transformer_lm": transformer_lm, "llama_lm": llama_lm, "digits_cnn": digits_cnn}


def loss_and_target(module: nn.Module, batch_size: int) -> Tuple[Optional[Callable], Any]:
    """(module.loss, module.example_target(batch_size)) for a module that has both (the built-in
    models; `loss` is the executor's default loss too), else (None, None): what profiling a
    training step of `module` needs (hybridplan.profile's loss_fn and target)."""
    loss = getattr(module, "loss", None)
    if callable(loss) and callable(getattr(module, "example_target", None)):
        return loss, module.example_target(batch_size)
    return None, None


def get(name: str, **kwargs) -> nn.Module:
    """Builds the built-in model `name` (one of MODELS)."""
    if name not in MODELS:
        raise ValueError(f"models: unknown model {name!r} (expected one of {sorted(MODELS)})")
    return MODELS[name](**kwargs)

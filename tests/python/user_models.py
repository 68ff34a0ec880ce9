"""Models people bring, small enough for 2 shared cores: each factory returns (model, batch_fn,
loss_fn) where batch_fn(batch_size, seed) -> (inputs, target) gives inputs as the model takes
them (a tuple of positional or a dict of keyword arguments) and loss_fn(output, target) reads
the output as the model returns it (a tensor, a tuple, a ModelOutput). Dropout is off so that
one-process and distributed training draw no random numbers and can be compared exactly.

    transformer_stack  torch's nn.TransformerEncoderLayer x 2 + nn.TransformerDecoderLayer
    gpt2               Hugging Face GPT2LMHeadModel (tied wte / lm_head), input_ids +
                       attention_mask, returns CausalLMOutput
    bert               Hugging Face BertForSequenceClassification, three keyword inputs
    vit                a ViT-like model whose root holds the class token and position embedding
    bn_cnn             a CNN with BatchNorm2d
    llama              Hugging Face LlamaForCausalLM: rotary position embedding computed once
                       (under no_grad) and read by every layer, grouped-query attention
    mistral            Hugging Face MistralForCausalLM with a sliding attention window
    qwen2              Hugging Face Qwen2ForCausalLM at awkward sizes: a vocabulary of 50 (4 and 8
                       do not divide it), an MLP width of 36, untied head, biased q/k/v
    hf_vit             Hugging Face ViTForImageClassification: patch embedding, class token,
                       position embedding, a pooled head
    mixtral            Hugging Face MixtralForCausalLM: a mixture of 4 experts, top-2 routing
    albert             Hugging Face AlbertForSequenceClassification: one layer applied 3 times
                       (weights shared across depth)
    shared_seq2seq     an encoder-decoder whose encoder and decoder share one embedding
                       module, an attribute of the root and of both halves
    lstm_lm            an nn.LSTM language model (embedding, 2-layer LSTM, vocabulary head)
    t5                 Hugging Face T5ForConditionalGeneration: `shared`, `encoder.embed_tokens`,
                       `decoder.embed_tokens` and `lm_head` are four modules holding one
                       Parameter, `shared` never called; returns the logits and
                       encoder_last_hidden_state, the second upstream of the first
    bart               Hugging Face BartForConditionalGeneration: the same tie (model.shared
                       never called), learned positions, a root buffer (final_logits_bias)
    tuple_out          a torch model returning (embedding, logits computed from it); the loss
                       reads both
    dict_out           a torch model returning {"hidden", "logits", "pooled"}, each computed
                       from the one before; the loss reads all three
    bn_dict            a torch model with two BatchNorm1d (no batch of one sample in training),
                       a dict input {"x", "extra"} and a tuple output
"""

from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from plan_builders import share

Factory = Callable[[], Tuple[nn.Module, Callable, Callable]]
D_MODEL, SEQ, VOCAB, CLASSES = 16, 6, 32, 4
QWEN_VOCAB = 50  # awkward: 4 and 8 do not divide it
SEQ2SEQ_VOCAB = 48


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class TransformerStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Linear(8, D_MODEL), nn.Linear(8, D_MODEL)
        self.enc0 = nn.TransformerEncoderLayer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)
        self.enc1 = nn.TransformerEncoderLayer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)
        self.dec0 = nn.TransformerDecoderLayer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, src, tgt):
        memory = self.enc1(self.enc0(self.src_embed(src)))
        return self.head(self.dec0(self.tgt_embed(tgt), memory).mean(dim=1))


def transformer_stack():
    torch.manual_seed(0)
    model = TransformerStack()

    def batch(n, seed):
        g = _generator(seed)
        return ((torch.randn(n, SEQ, 8, generator=g), torch.randn(n, SEQ, 8, generator=g)),
                torch.randint(0, CLASSES, (n,), generator=g))
    return model, batch, F.cross_entropy


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=D_MODEL, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied

    def batch(n, seed):
        g = _generator(seed)
        ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
        mask = torch.ones(n, SEQ, dtype=torch.long)
        return {"input_ids": ids[:, :-1], "attention_mask": mask}, ids[:, 1:]

    def loss(output, target):  # next-token cross-entropy from the ModelOutput's logits
        return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())
    return model, batch, loss


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=SEQ,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        classifier_dropout=0.0, num_labels=CLASSES, pad_token_id=0)
    model = BertForSequenceClassification(config)

    def batch(n, seed):
        g = _generator(seed)
        inputs = {"input_ids": torch.randint(1, VOCAB, (n, SEQ), generator=g),
                  "attention_mask": torch.ones(n, SEQ, dtype=torch.long),
                  "token_type_ids": torch.zeros(n, SEQ, dtype=torch.long)}
        return inputs, torch.randint(0, CLASSES, (n,), generator=g)

    def loss(output, target):
        return F.cross_entropy(output.logits, target)
    return model, batch, loss


class ViT(nn.Module):
    """Patches -> [class token; patches] + position embedding -> encoder layers -> head. The
    class token and the position embedding are parameters of the root itself."""

    def __init__(self, image=8, patch=4):
        super().__init__()
        num_patches = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, D_MODEL) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, D_MODEL) * 0.02)
        self.patch_embed = nn.Conv2d(3, D_MODEL, patch, stride=patch)
        self.block0 = nn.TransformerEncoderLayer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)
        self.block1 = nn.TransformerEncoderLayer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.block1(self.block0(x)))
        return self.head(x[:, 0])


def vit():
    torch.manual_seed(0)
    model = ViT()

    def batch(n, seed):
        g = _generator(seed)
        return (torch.randn(n, 3, 8, 8, generator=g),), torch.randint(0, CLASSES, (n,),
                                                                       generator=g)
    return model, batch, F.cross_entropy


def bn_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES))

    def batch(n, seed):
        g = _generator(seed)
        return (torch.randn(n, 3, 8, 8, generator=g),), torch.randint(0, CLASSES, (n,),
                                                                       generator=g)
    return model, batch, F.cross_entropy


def _causal_lm_batch(n, seed):
    g = _generator(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def _next_token_loss(output, target):
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _decoder_config(config_class, **extra):
    return config_class(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=32,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        max_position_embeddings=SEQ * 2, use_cache=False, attention_dropout=0.0,
                        pad_token_id=0, bos_token_id=0, eos_token_id=0, **extra)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(_decoder_config(LlamaConfig)), _causal_lm_batch, _next_token_loss


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(_decoder_config(MistralConfig, sliding_window=4))
    return model, _causal_lm_batch, _next_token_loss


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=D_MODEL, intermediate_size=36,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=SEQ * 2, use_cache=False, attention_dropout=0.0,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=0,
                         eos_token_id=0)

    def batch(n, seed):
        g = _generator(seed)
        ids = torch.randint(0, QWEN_VOCAB, (n, SEQ + 1), generator=g)
        return {"input_ids": ids[:, :-1]}, ids[:, 1:]
    return Qwen2ForCausalLM(config), batch, _next_token_loss


def hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=32, image_size=8, patch_size=4, num_channels=3,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                       num_labels=CLASSES)

    def batch(n, seed):
        g = _generator(seed)
        return ({"pixel_values": torch.randn(n, 3, 8, 8, generator=g)},
                torch.randint(0, CLASSES, (n,), generator=g))

    def loss(output, target):
        return F.cross_entropy(output.logits, target)
    return ViTForImageClassification(config), batch, loss


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(_decoder_config(MixtralConfig, num_local_experts=4,
                                               num_experts_per_tok=2, router_jitter_noise=0.0))
    return model, _causal_lm_batch, _next_token_loss


def albert():
    from transformers import AlbertConfig, AlbertForSequenceClassification

    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=VOCAB, embedding_size=8, hidden_size=D_MODEL,
                          num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                          max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
                          num_labels=CLASSES, pad_token_id=0)
    model = AlbertForSequenceClassification(config)

    def batch(n, seed):
        g = _generator(seed)
        return ({"input_ids": torch.randint(1, VOCAB, (n, SEQ), generator=g)},
                torch.randint(0, CLASSES, (n,), generator=g))

    def loss(output, target):
        return F.cross_entropy(output.logits, target)
    return model, batch, loss


class _Half(nn.Module):
    def __init__(self, embed: nn.Embedding, decoder: bool):
        super().__init__()
        self.embed = embed  # the root's module, under a second (and third) name
        layer = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
        self.layer = layer(D_MODEL, 2, 32, dropout=0.0, batch_first=True)


class SharedSeq2Seq(nn.Module):
    """Encoder and decoder that share the root's embedding module (as T5 and BART did):
    `shared`, `encoder.embed` and `decoder.embed` are one module."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(VOCAB, D_MODEL)
        self.encoder, self.decoder = _Half(self.shared, False), _Half(self.shared, True)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, src, tgt):
        memory = self.encoder.layer(self.encoder.embed(src))
        return self.head(self.decoder.layer(self.decoder.embed(tgt), memory))


def shared_seq2seq():
    torch.manual_seed(0)

    def batch(n, seed):
        g = _generator(seed)
        src = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        tgt = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
        return (src, tgt[:, :-1]), tgt[:, 1:]
    return SharedSeq2Seq(), batch, _next_token_loss


def _seq2seq_batch(n, seed):
    """input_ids, attention_mask (the last source position masked in odd samples),
    decoder_input_ids (the labels shifted right behind token 0), and the labels."""
    g = _generator(seed)
    src = torch.randint(1, SEQ2SEQ_VOCAB, (n, SEQ), generator=g)
    labels = torch.randint(1, SEQ2SEQ_VOCAB, (n, SEQ), generator=g)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    mask[1::2, -1] = 0
    decoder_ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), labels[:, :-1]], dim=1)
    return ({"input_ids": src, "attention_mask": mask, "decoder_input_ids": decoder_ids},
            labels)


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=SEQ2SEQ_VOCAB, d_model=D_MODEL, d_kv=8, d_ff=32, num_layers=2,
                      num_decoder_layers=2, num_heads=2, dropout_rate=0.0, use_cache=False,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)
    assert model.shared.weight is model.encoder.embed_tokens.weight is model.lm_head.weight
    return model, _seq2seq_batch, _next_token_loss


def bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(vocab_size=SEQ2SEQ_VOCAB, d_model=D_MODEL, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        use_cache=False, pad_token_id=0, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=0, forced_eos_token_id=None)
    model = BartForConditionalGeneration(config)
    assert model.model.shared.weight is model.model.decoder.embed_tokens.weight
    return model, _seq2seq_batch, _next_token_loss


class TupleOut(nn.Module):
    """(embedding, logits of a layer over it): the first output is upstream of the second."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(SEQ2SEQ_VOCAB, D_MODEL)
        self.body = nn.Linear(D_MODEL, D_MODEL)
        self.head = nn.Linear(D_MODEL, SEQ2SEQ_VOCAB)

    def forward(self, ids):
        e = self.embed(ids)
        return e, self.head(torch.tanh(self.body(e)))


def _token_batch(n, seed):
    g = _generator(seed)
    return (torch.randint(0, SEQ2SEQ_VOCAB, (n, SEQ), generator=g),), torch.randint(
        0, SEQ2SEQ_VOCAB, (n, SEQ), generator=g)


def tuple_out():
    torch.manual_seed(0)

    def loss(output, target):
        embedding, logits = output
        return (F.cross_entropy(logits.flatten(0, 1), target.flatten())
                + 0.1 * embedding.pow(2).mean())
    return TupleOut(), _token_batch, loss


class DictOut(nn.Module):
    """{"hidden", "logits", "pooled"}: each computed from the one before."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(SEQ2SEQ_VOCAB, D_MODEL)
        self.body = nn.Linear(D_MODEL, D_MODEL)
        self.head = nn.Linear(D_MODEL, SEQ2SEQ_VOCAB)
        self.pool = nn.Linear(SEQ2SEQ_VOCAB, 4)

    def forward(self, ids):
        hidden = torch.tanh(self.body(self.embed(ids)))
        logits = self.head(hidden)
        return {"hidden": hidden, "logits": logits, "pooled": self.pool(logits.mean(dim=1))}


def dict_out():
    torch.manual_seed(0)

    def loss(output, target):
        return (F.cross_entropy(output["logits"].flatten(0, 1), target.flatten())
                + 0.1 * output["hidden"].pow(2).mean() + output["pooled"].pow(2).mean())
    return DictOut(), _token_batch, loss


class BnDictModel(nn.Module):
    """Dict input {"x", "extra"}, tuple output (logits, a summary), two BatchNorm1d."""

    def __init__(self):
        super().__init__()
        self.embed, self.bn = nn.Linear(8, 16), nn.BatchNorm1d(16)
        self.mix, self.bn2 = nn.Linear(16 + 4, 16), nn.BatchNorm1d(16, momentum=0.2)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x, extra):
        h = torch.relu(self.bn(self.embed(x)))
        h = torch.relu(self.bn2(self.mix(torch.cat([h, extra], dim=1))))
        return self.head(h), h.mean(dim=1)


def bn_dict():
    torch.manual_seed(0)
    model = BnDictModel()

    def batch(n, seed):
        g = _generator(seed)
        return ({"x": torch.randn(n, 8, generator=g), "extra": torch.randn(n, 4, generator=g)},
                torch.randint(0, CLASSES, (n,), generator=g))

    def loss_fn(output, target):
        return F.cross_entropy(output[0], target)
    return model, batch, loss_fn


class LstmLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.lstm = nn.LSTM(D_MODEL, D_MODEL, num_layers=2, batch_first=True)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


def lstm_lm():
    torch.manual_seed(0)

    def batch(n, seed):
        inputs, target = _causal_lm_batch(n, seed)
        return (inputs["input_ids"],), target
    return LstmLM(), batch, _next_token_loss


FACTORIES: Dict[str, Factory] = {
    "transformer_stack": transformer_stack, "gpt2": gpt2, "bert": bert, "vit": vit,
    "bn_cnn": bn_cnn, "llama": llama, "mistral": mistral, "qwen2": qwen2, "hf_vit": hf_vit,
    "mixtral": mixtral, "albert": albert,
    "shared_seq2seq": shared_seq2seq, "lstm_lm": lstm_lm, "t5": t5, "bart": bart,
    "tuple_out": tuple_out, "dict_out": dict_out, "bn_dict": bn_dict}
# Models with BatchNorm: data-parallel plans compare with torch DDP (each replica normalises its
# share), pipelines with one process running the same micro-batches in turn.
BATCH_NORM = ("bn_cnn", "bn_dict")


def call(model: nn.Module, inputs: Any):
    """model(inputs) as the executor calls it: a dict as keyword arguments, a tuple as
    positional ones, a lone tensor as the one input."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def train_one_process(factory: Factory, global_batch: int, steps: int, optimizer: Callable,
                      num_microbatches: int = 1, first_seed: int = 100) -> Dict[str, Any]:
    """The reference the distributed runs are compared with: `factory`'s model trained `steps`
    steps in one process on batches batch_fn(global_batch, first_seed + step), each in
    `num_microbatches` equal parts whose mean losses are averaged (the same gradient; BatchNorm
    sees each part alone, as a pipeline's stages do); its final state_dict."""
    model, batch, loss_fn = factory()
    opt = optimizer(model.parameters())
    for step in range(steps):
        inputs, target = batch(global_batch, first_seed + step)
        opt.zero_grad()
        for j in range(num_microbatches):
            part = share(inputs, num_microbatches, j)
            (loss_fn(call(model, part), share(target, num_microbatches, j))
             / num_microbatches).backward()
        opt.step()
    return model.state_dict()


def train_torch_ddp(factory: Factory, global_batch: int, steps: int, optimizer: Callable,
                    first_seed: int = 100) -> Dict[str, Any]:
    """The same training under torch's DistributedDataParallel on this rank's process group
    (each rank its share of every batch: BatchNorm normalises each share alone, and DDP
    broadcasts rank 0's buffers at each forward); a copy of the final state_dict."""
    import torch.distributed as dist
    model, batch, loss_fn = factory()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = optimizer(ddp.parameters())
    world, rank = dist.get_world_size(), dist.get_rank()
    for step in range(steps):
        inputs, target = batch(global_batch, first_seed + step)
        opt.zero_grad()
        loss_fn(call(ddp, share(inputs, world, rank)), share(target, world, rank)).backward()
        opt.step()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del ddp, opt  # the wrapper's hooks gone before the caller destroys the group
    return state

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
"""

from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

Factory = Callable[[], Tuple[nn.Module, Callable, Callable]]
D_MODEL, SEQ, VOCAB, CLASSES = 16, 6, 32, 4


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


FACTORIES: Dict[str, Factory] = {"transformer_stack": transformer_stack, "gpt2": gpt2,
                                 "bert": bert, "vit": vit, "bn_cnn": bn_cnn}


def call(model: nn.Module, inputs: Any):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)

"""A plain Hugging Face causal-LM training loop (LlamaForCausalLM from a tiny config, no weights
downloaded; AdamW, warm-up then cosine, gradient accumulation, clipping) ported to hybridplan.

    torchrun --nproc-per-node 2 examples/hf_causal_lm_loop.py          # under the chosen plan
    python examples/hf_causal_lm_loop.py --plain --global-batch 16     # the loop it came from

The loop as people write it (`plain()` below runs it in one process):

    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, WARMUP, STEPS,
                                                            min_lr_rate=0.1)
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            inputs, target = batch(global_batch, step, micro)
            loss = loss_fn(model(**inputs), target) / ACCUMULATION
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

Ported (`ported()` below), the lines that change:

    hp = hybridplan.parallelize(model, inputs, example_target=target, loss_fn=loss_fn,   # 1
            optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1),  # 2
            lr_scheduler=lambda opt: get_cosine_with_min_lr_schedule_with_warmup(         # 3
                opt, WARMUP, STEPS, min_lr_rate=0.1),   # or hybridplan.warmup_cosine(...)
            accumulation_steps=ACCUMULATION)                                              # 4
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            inputs, target = hp.shard(*batch(global_batch, step, micro))                 # 5
            loss = hp.forward_backward(inputs, target)   # divides by ACCUMULATION        # 6
        norm = hp.clip_grad_norm(1.0)                    # the global norm                # 7
        hp.optimizer_step()                              # and the scheduler's step       # 8
        hp.zero_grad()                                                                    # 9

The optimizer and the scheduler become factories (apply builds the optimizer over the
parameters this rank holds), each micro-batch is the global one's share of this rank's replica,
and the model's calls go through hp. The same loop in one call per step:
hp.step(*hp.shard(*batch(hp.global_batch, step))) with apply(..., clip_grad_norm=1.0).
The norm printed is the plain loop's at the same global batch (the plan's dp x
per_replica_batch per micro-batch; on 2 CPU ranks, dp=2: the same 6 digits at every step);
the loss is rank 0's replica's, its share of the micro-batch. docs/training_step.md has the
equality table.
"""
import argparse

import torch
import torch.nn.functional as F
from transformers import (LlamaConfig, LlamaForCausalLM,
                          get_cosine_with_min_lr_schedule_with_warmup)

import hybridplan

STEPS, WARMUP, ACCUMULATION, MAX_NORM, VOCAB, SEQ = 12, 3, 2, 1.0, 128, 32
PER_REPLICA_BATCH = 8  # what the profile measures; the plan keeps it


def build_model():  # tiny, no dropout: any plan trains as one process does
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        use_cache=False, attention_dropout=0.0, pad_token_id=0, bos_token_id=0,
        eos_token_id=0))


def batch(n, step, micro=0):  # n counting sequences (each token the previous + 1)
    seed = step * 1000 + micro
    ids = (torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
           + torch.arange(SEQ + 1)) % VOCAB
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def loss_fn(output, target):  # next-token cross-entropy from the ModelOutput's logits
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def schedule(optimizer):
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, WARMUP, STEPS,
                                                       min_lr_rate=0.1)


def plain(global_batch):
    model = build_model()
    optimizer = adamw(model.parameters())
    scheduler = schedule(optimizer)
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            inputs, target = batch(global_batch, step, micro)
            loss = loss_fn(model(**inputs), target) / ACCUMULATION
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item() * ACCUMULATION:.6f} norm {norm.item():.6f}",
              flush=True)


def ported():
    inputs, target = batch(PER_REPLICA_BATCH, 0)  # one replica's batch: what is profiled
    hp = hybridplan.parallelize(build_model(), inputs, example_target=target, loss_fn=loss_fn,
                                optimizer=adamw, lr_scheduler=schedule,
                                accumulation_steps=ACCUMULATION)
    global_batch = hp.plan.dp * hp.plan.per_replica_batch  # one micro-batch, every replica
    if hp.rank == 0:
        print(f"global batch {global_batch} per micro-batch, {hp.global_batch} per step "
              f"(compare: --plain --global-batch {global_batch})", flush=True)
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            inputs, target = hp.shard(*batch(global_batch, step, micro))
            loss = hp.forward_backward(inputs, target)
        norm = hp.clip_grad_norm(MAX_NORM)
        hp.optimizer_step()
        hp.zero_grad()
        if hp.rank == 0:
            print(f"step {step} loss {loss.item():.6f} norm {norm.item():.6f}", flush=True)
    hp.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", action="store_true", help="the plain loop, one process")
    parser.add_argument("--global-batch", type=int, default=2 * PER_REPLICA_BATCH,
                        help="--plain: samples per micro-batch")
    args = parser.parse_args()
    if args.plain:
        plain(args.global_batch)
    else:
        ported()

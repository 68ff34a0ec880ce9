# Megatron-LM on one 8-GPU node: tensor 2 x pipeline 2 x data 2, sequence parallel,
# selective recompute (the world size comes from torchrun's --nnodes x --nproc-per-node)
torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py \
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 21504 \
  --seq-length 2048 --max-position-embeddings 2048 \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
  --micro-batch-size 1 --global-batch-size 32 \
  --recompute-granularity selective --bf16

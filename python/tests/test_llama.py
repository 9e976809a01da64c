"""The Llama through the Python face: GPTConfig carries the llama keys."""

from tinyacc import Accelerator
from tinyacc.models import GPT, GPTConfig
from tinyacc.optim import AdamW


def test_llama_model_names_shapes_and_step(tmp_path, corpus):
    cfg = GPTConfig(arch="llama", n_layer=1, n_head=4, n_kv_head=2, n_embd=16, block_size=8, intermediate_size=24)
    model = GPT(cfg)
    assert model.config.arch == "llama" and model.config.n_kv_head == 2 and model.config.tie_embeddings is False
    shapes = dict((name, p.shape) for name, p in model.named_parameters())
    assert shapes == {
        "model.embed_tokens.weight": (256, 16),
        "model.layers.0.input_layernorm.weight": (16,),
        "model.layers.0.self_attn.q_proj.weight": (16, 16),
        "model.layers.0.self_attn.k_proj.weight": (8, 16),
        "model.layers.0.self_attn.v_proj.weight": (8, 16),
        "model.layers.0.self_attn.o_proj.weight": (16, 16),
        "model.layers.0.post_attention_layernorm.weight": (16,),
        "model.layers.0.mlp.gate_proj.weight": (24, 16),
        "model.layers.0.mlp.up_proj.weight": (24, 16),
        "model.layers.0.mlp.down_proj.weight": (16, 24),
        "model.norm.weight": (16,),
        "lm_head.weight": (256, 16),
    }
    tied = GPT(GPTConfig(arch="llama", n_layer=1, n_head=2, n_embd=16, block_size=8, tie_embeddings=True))
    shapes = dict((name, p.shape) for name, p in tied.named_parameters())
    assert "lm_head.weight" not in shapes
    # intermediate_size 0: 8/3 of n_embd rounded up to a multiple of 64
    assert tied.config.intermediate_size == 0 and shapes["model.layers.0.mlp.gate_proj.weight"] == (64, 16)

    run = tmp_path / "llama.yaml"
    run.write_text("model: {arch: llama, n_layer: 1, n_head: 4, n_kv_head: 2, n_embd: 32, block_size: 32}\n"
                   "train: {steps: 2, batch_size: 2, threads: 1, eval_every: 0}\n"
                   "data: {path: %r, val_fraction: 0.1}\n" % corpus)
    acc = Accelerator(str(run))
    m = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(m.parameters())
    m, opt = acc.prepare(m, opt)
    loss = m([[1, 2, 3, 4]], [[2, 3, 4, 5]])
    acc.backward(loss)
    assert opt.step()

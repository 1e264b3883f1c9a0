import json

import pytest

from dualpace_sim.costs import ModelShape


def test_llama_8b_derived_sizes():
    s = ModelShape.from_name("llama-3.1-8b")
    assert s.kv_bytes_per_token_per_layer == 2 * 8 * 128 * 2
    assert s.kv_bytes_per_token == 131072
    assert s.total_params == pytest.approx(8.03e9, rel=1e-3)
    assert s.weight_bytes == 2 * s.total_params
    assert s.linear_flops_per_token_per_layer == 2 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)


def test_qwen3_shapes_have_qk_norm_and_wide_attention():
    s14, s32 = ModelShape.from_name("qwen3-14b"), ModelShape.from_name("qwen3-32b")
    assert s14.qk_norm and s32.qk_norm
    assert s14.total_params == pytest.approx(14.77e9, rel=1e-3)
    assert s32.total_params == pytest.approx(32.76e9, rel=1e-3)
    assert s32.q_dim == 8192 != s32.hidden_size  # o_proj input is wider than hidden


def test_tied_embeddings_are_counted_once():
    tied = ModelShape.from_name("tiny-qwen3")
    assert tied.tie_word_embeddings
    assert tied.total_params == 2 * tied.params_per_layer + tied.embedding_params + tied.hidden_size


def test_unknown_name_lists_known_models():
    with pytest.raises(ValueError, match="known models: llama-3.1-8b, qwen3-14b"):
        ModelShape.from_name("gpt-5")


def test_invalid_shape_is_rejected():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelShape("bad", 2, 64, 4, 3, 16, 128, 256)
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        ModelShape("bad", 0, 64, 4, 2, 16, 128, 256)


def test_hf_config_from_file_and_directory(tmp_path):
    cfg = {
        "model_type": "qwen3",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 17408,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
    }
    model_dir = tmp_path / "Qwen3-14B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    from_dir = ModelShape.from_hf_config(model_dir)
    from_file = ModelShape.from_hf_config(model_dir / "config.json", name="qwen3-14b")
    assert from_dir.name == "Qwen3-14B"
    assert from_file == ModelShape.from_name("qwen3-14b")


def test_hf_config_defaults():
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    s = ModelShape.from_hf_config(cfg, name="t")
    assert (s.head_dim, s.n_kv_heads, s.qk_norm, s.dtype_bytes) == (16, 4, False, 4)
    assert s.tie_word_embeddings


def test_hf_config_nested_text_config():
    inner = {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
    }
    s = ModelShape.from_hf_config({"model_type": "vl", "text_config": inner}, name="vl")
    assert s.qk_norm and s.n_layers == 2


def test_hf_config_reads_llama3_rope_scaling_and_refuses_other_kinds():
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    shape = ModelShape.from_hf_config(cfg, name="llama-3.1-8b")
    assert shape == ModelShape.from_name("llama-3.1-8b")
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="yarn"):
        ModelShape.from_hf_config(cfg)


DENSE = {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
         "vocab_size": 32000}


@pytest.mark.parametrize("extra, field", [
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),
    ({"num_experts": 64, "moe_intermediate_size": 1408}, "num_experts"),
    ({"n_routed_experts": 160, "kv_lora_rank": 512}, "n_routed_experts"),
    ({"kv_lora_rank": 512, "q_lora_rank": 1536}, "kv_lora_rank"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config"),
    ({"sliding_window": 4096}, "sliding_window"),
])
def test_configs_of_unmodelled_architectures_are_refused_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=rf"^config: {field}: .* not modelled"):
        ModelShape.from_hf_config({**DENSE, **extra})


def test_inactive_sliding_window_and_empty_fields_are_dense():
    """Qwen2/3 configs carry sliding_window with use_sliding_window false; Mistral v0.2 a null."""
    for extra in ({"sliding_window": 131072, "use_sliding_window": False},
                  {"sliding_window": None}, {"quantization_config": None},
                  {"num_local_experts": 1}):
        assert ModelShape.from_hf_config({**DENSE, **extra}, name="m").n_layers == 32


def test_hf_config_reads_transformers_5_rope_parameters():
    """transformers >= 5 saves rope_theta and the scaling as one rope_parameters entry."""
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "rms_norm_eps": 1e-05,
           "rope_parameters": {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "rope_type": "llama3",
                               "original_max_position_embeddings": 8192}}
    assert ModelShape.from_hf_config(cfg, name="llama-3.1-8b") == \
        ModelShape.from_name("llama-3.1-8b")
    cfg["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}
    shape = ModelShape.from_hf_config(cfg)
    assert shape.rope_theta == 1e6 and shape.rope_scaling_factor is None

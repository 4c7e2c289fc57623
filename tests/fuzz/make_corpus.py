#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/seed-*): small valid
inputs of every parser, so that libFuzzer starts from the formats' structure. Deterministic;
regenerate with `python3 tests/fuzz/make_corpus.py` (inputs a fuzzer found live beside them as
crash-*/found-* and are never rewritten here)."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1}


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape)]; data bytes are a counting pattern."""
    header, blobs, off = {}, [], 0
    for name, dt, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * SIZES[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
        blobs.append(bytes((off + i) % 251 for i in range(nbytes)))
        off += nbytes
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs)


# The tiny Llama of targets.cpp: hidden 8, intermediate 16, 1 layer, 2 heads, 1 KV head, vocab 16, tied.
TINY = [("model.embed_tokens.weight", [16, 8]),
        ("model.layers.0.input_layernorm.weight", [8]),
        ("model.layers.0.self_attn.q_proj.weight", [8, 8]),
        ("model.layers.0.self_attn.k_proj.weight", [4, 8]),
        ("model.layers.0.self_attn.v_proj.weight", [4, 8]),
        ("model.layers.0.self_attn.o_proj.weight", [8, 8]),
        ("model.layers.0.post_attention_layernorm.weight", [8]),
        ("model.layers.0.mlp.gate_proj.weight", [16, 8]),
        ("model.layers.0.mlp.up_proj.weight", [16, 8]),
        ("model.layers.0.mlp.down_proj.weight", [8, 16]),
        ("model.norm.weight", [8])]


def main():
    shutil.rmtree(CORPUS, ignore_errors=True) if os.environ.get("CLEAN") else None
    # chat templates: the chat goldens' templates that render the target's conversation
    tdir = os.path.join(HERE, "..", "golden", "data", "chat", "templates")
    for t in ("smollm2", "chatml_tools", "llama3_style", "gemma_style", "constructs"):
        with open(os.path.join(tdir, t + ".jinja"), "rb") as f:
            put("chat_template", t, f.read())
    # safetensors
    put("safetensors", "f32-bf16", safetensors([("a", "F32", [2, 3]), ("b", "BF16", [4])], {"format": "pt"}))
    put("safetensors", "f16-i32", safetensors([("w", "F16", [3]), ("ids", "I32", [2, 2])]))
    put("safetensors", "scalar-empty", safetensors([("s", "F32", []), ("e", "F32", [0, 4]), ("x", "I64", [1])]))
    put("safetensors", "empty-header", safetensors([]))
    # checkpoint: the tiny Llama in F32 and BF16, base-model names, a tied lm_head
    put("checkpoint", "tiny-f32", safetensors([(n, "F32", s) for n, s in TINY], {"format": "pt"}))
    put("checkpoint", "tiny-bf16", safetensors([(n, "BF16", s) for n, s in TINY]))
    put("checkpoint", "tiny-base-names", safetensors([(n.removeprefix("model."), "F16", s) for n, s in TINY]))
    # checkpoint_index: the shards targets.cpp writes (save_checkpoint, 512-byte shards) are named
    # model-0000k-of-0000N.safetensors; a right index is found by the fuzzer from these.
    wm = {n: "model-%05d-of-00004.safetensors" % (1 + i * 4 // len(TINY)) for i, (n, _) in enumerate(TINY)}
    put("checkpoint_index", "four-shards", json.dumps({"metadata": {"total_size": 2304}, "weight_map": wm}, indent=2))
    put("checkpoint_index", "one-shard", json.dumps({"weight_map": {n: "model-00001-of-00001.safetensors" for n, _ in TINY}}))
    # config.json of each family
    put("config", "llama", json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}, indent=2))
    put("config", "llama-head-dim", json.dumps({
        "model_type": "llama", "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 1,
        "num_attention_heads": 4, "head_dim": 16, "vocab_size": 100, "tie_word_embeddings": False}))
    put("config", "opt", json.dumps({
        "model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 300, "max_position_embeddings": 128, "word_embed_proj_dim": 32, "do_layer_norm_before": True,
        "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine": True,
        "dropout": 0.1, "pad_token_id": 1, "_remove_final_layer_norm": False}, indent=2))
    put("config", "qwen2", json.dumps({
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False,
        "sliding_window": 4096, "max_window_layers": 2, "pad_token_id": 0}, indent=2))
    # sweep specs: the examples and an exclude-heavy one
    ex = os.path.join(HERE, "..", "..", "examples")
    for f in sorted(os.listdir(ex)):
        if f.endswith(".toml"):
            with open(os.path.join(ex, f), "rb") as src:
                put("sweep_spec", f[:-5], src.read())
    put("sweep_spec", "profile-per-rank", """name = "p"
[workload]
type = "external"
command = ["mpirun", "-np", "{nproc}", "{profiler}", "python3", "w.py"]
profile = "nsys?"
profile_args = ["--sample=none"]
profile_rank_env = "PMI_RANK"
[parameters]
nproc = [1, 2]
""")
    put("sweep_spec", "exclude-env", """name = "x"
repeats = 2
[workload]
type = "external"
command = ["python3", "w.py", "--b", "{micro_batch_size}", "--a", "{attn}"]
oom_pattern = "out of memory"
required_metrics = ["tokens_per_s_per_device"]
[workload.metrics]
tokens_per_s_per_device = 'tps: ([0-9.]+)'
[workload.env]
B = "{micro_batch_size}"
[parameters]
micro_batch_size = [1, 2, 4]
attn = ["eager", "flash"]
lr = 1e-3
fused = [true, false]
[[exclude]]
attn = "eager"
micro_batch_size = [2, 4]
""")
    # token files: 4 option bytes (seq-len, micro-batch, vocab lo/hi + world bit), then uint32 ids
    put("token_file", "seq8", bytes([7, 1, 100, 0]) + b"".join(struct.pack("<I", i % 100) for i in range(40)))
    put("token_file", "two-ranks", bytes([3, 2, 16, 0x80]) + b"".join(struct.pack("<I", i % 16) for i in range(64)))

    # jsonl: 2 option bytes (seq-len / micro-batch, then pad 1, shuffle 2, split 4|8, no-eos 16,
    # two ranks 32), then the file; field "text"
    docs = ["Hello world, it's 2024!", "abc abc abcabc", "caf\u00e9 \u00fcber \u65e5\u672c", "line one\nline two\ttab",
            "  leading spaces and a \"quote\"", "emoji \U0001F44D and <|endoftext|> inside"]
    lines = "\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)) + "\n"
    put("jsonl", "packed", bytes([3, 0]) + lines.encode())
    put("jsonl", "pad-shuffle", bytes([7 | (1 << 5), 1 | 2]) + lines.encode())
    put("jsonl", "split-train-no-eos", bytes([2, 4 | 16]) + lines.encode())
    put("jsonl", "split-val-two-ranks", bytes([1, 8 | 32]) + (lines * 3).encode())
    put("jsonl", "blank-lines-crlf-ascii", bytes([4, 0]) + ("\r\n\r\n".join(json.dumps({"meta": {"n": i}, "text": d}, ensure_ascii=True)
                                                             for i, d in enumerate(docs)) + "\r\n").encode())
    # profile_summary: scalelab traces (one rank; merged), PyTorch traces (current and older
    # category names, a bare event array) and nsys stats CSV
    def x(cat, name, ts, dur, pid=0, tid=0, **args):
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
        if args:
            e["args"] = args
        return e
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
          x("step", "step 0", 0, 100), x("step", "step 1", 100, 90), x("step", "step 2", 190, 95),
          x("phase", "forward", 100, 40), x("phase", "backward", 140, 40),
          x("op", "matmul", 101, 10, phase="forward"), x("op", "rmsnorm", 112, 3, phase="forward"),
          x("op", "matmul", 141, 20, phase="backward"), x("layer", "layer 0", 100, 30, phase="forward"),
          x("comm", "all_reduce", 150, 25, tid=1), x("comm", "ddp wait", 180, 8),
          x("kernel", "gemm_kernel", 102, 8, tid=7), x("kernel", "ncclKernel_AllReduce", 151, 20, tid=8),
          x("cuda_runtime", "cudaLaunchKernel", 101, 1), x("cuda_runtime", "cudaStreamSynchronize", 185, 4),
          x("gpu_memcpy", "Memcpy HtoD", 99, 2, tid=7, bytes=4096), x("gpu_memset", "Memset", 98, 1, tid=7, bytes=64)]
    put("profile_summary", "scalelab-rank", json.dumps({"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {
        "generator": "scalelab", "rank": 0, "world_size": 1, "measured_from_us": 100.0,
        "op_timing": "device queue (CUDA events)", "gpu_activity": "CUPTI activity records"}}, indent=1))
    ev1 = [dict(e, pid=1) for e in ev]
    put("profile_summary", "scalelab-merged", json.dumps({"traceEvents": ev + ev1, "otherData": {
        "generator": "scalelab", "rank": None, "merged": True, "ranks": 2, "origin_unix_us": 1000,
        "inputs": [{"rank": 0, "measured_from_us": 100.0, "shift_us": 0.0}, {"rank": 1, "measured_from_us": 90, "shift_us": 10}]}}))
    # trace_merge: rank files cut apart by NUL bytes
    def rank_trace(rank, origin):
        return json.dumps({"traceEvents": [dict(e, pid=rank) for e in ev], "otherData": {
            "generator": "scalelab", "rank": rank, "world_size": 2, "measured_from_us": 100.0,
            "origin_unix_us": origin}})
    put("trace_merge", "two-ranks", rank_trace(0, 1764000000000000) + "\0" + rank_trace(1, 1764000000000250))
    put("trace_merge", "one-rank", rank_trace(0, 0))
    with open(os.path.join(HERE, "..", "profile", "data", "torch_gpu_trace.json"), "rb") as src:
        put("profile_summary", "torch-gpu", src.read())
    put("profile_summary", "torch-old-names-array", json.dumps([
        x("Operator", "aten::add", 0, 5, pid="host", tid="main"), x("Kernel", "add_kernel", 2, 3, pid=1, tid=7),
        x("Runtime", "cudaLaunchKernel", 1, 1, pid="host"), x("Driver", "cuLaunchKernel", 1, 1),
        x("Memcpy", "Memcpy DtoH", 6, 2, pid=1, bytes="128"), x("Memset", "Memset", 9, 1, pid=1),
        x("user_annotation", "ProfilerStep#7", 0, 10, pid="host"), {"ph": "i", "name": "marker", "ts": 3}]))
    with open(os.path.join(HERE, "..", "profile", "data", "nsys_stats.csv"), "rb") as src:
        put("profile_summary", "nsys-stats", src.read())
    put("profile_summary", "nsys-one-report", "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\r\n"
        "60.0,\"1,200\",3,400.0,400.0,300,500,100.0,\"void k<float, 2>(int)\"\r\n40.0,800,1,800.0,800.0,800,800,0.0,ncclKernel\r\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The FSDP code `planner recommend --emit fsdp` writes, run on the model it was planned for.

For a tiny model of each architecture (a config.json written here), the planner is asked for an
FSDP2 and an FSDP1 plan on 2 GPUs (`recommend --strategy fsdp-full --flavour fsdp2|fsdp1
--checkpointing full --emit fsdp`); the snippet's section is cut from its output and run as the
user would paste it, on transformers' own model of that config, under torchrun on 2 CPU ranks
with gloo (the four cases in one launch), for 2 training steps (AdamW, the model's own loss). The one change made to the
snippet: the device mesh is built on "cpu" rather than "cuda". Each run must finish with finite
losses; a snippet that names a module the model lacks (its blocks' container or class) fails.
FSDP1 refuses CPU-only ranks, so its snippet runs up to the wrapper (imports, checkpointing, the
mesh) and its wrap policy's class must be the class of each of the model's blocks.

Usage: fsdp_snippet_run.py PLANNER   (exit 77, "skipped", where torch or transformers does not
import: point ctest at an interpreter that has them with SHARDPLAN_TORCH_PYTHON)
"""
import json
import os
import subprocess
import sys
import tempfile

SKIPPED = 77
# Tiny configs of the architectures whose module paths differ (transformers 5.23).
CONFIGS = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
              "tie_word_embeddings": False},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64,
             "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64},
}
SEQ_LEN = 32
STEPS = 2


def snippet(planner, config_path, flavour):
    """The FSDP section of the planner's --emit fsdp output for the config, on 2 GPUs."""
    out = subprocess.run(
        [planner, "recommend", "--model", config_path, "--hardware", "a100-sxm4-80gb",
         "--gpus", "2", "--gpus-per-node", "2", "--seq-len", str(SEQ_LEN), "--global-batch", "4",
         "--strategy", "fsdp-full", "--flavour", flavour, "--checkpointing", "full",
         "--emit", "fsdp"], capture_output=True, text=True, check=True).stdout
    header = "# ---- PyTorch FSDP"
    start = out.index(header)
    end = out.find("\n# ---- ", start + len(header))
    return out[start:end if end >= 0 else len(out)]


def run_case(config_path, code_path):
    """One rank's run of one snippet: the model, the pasted snippet, two steps."""
    import torch
    import transformers
    torch.manual_seed(0)
    with open(config_path) as f:
        config_dict = json.load(f)
    kwargs = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(config_dict["model_type"], **kwargs)
    model = getattr(transformers, config_dict["architectures"][0])(config)
    model.train()
    with open(code_path) as f:
        code = f.read().replace('init_device_mesh("cuda"', 'init_device_mesh("cpu"')
    scope = {"model": model, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    wrap = code.find("model = FSDP(")
    if wrap >= 0:
        # FSDP1 refuses CPU-only ranks ("FSDP needs a non-CPU accelerator device"): everything
        # before the wrapper runs (imports, checkpointing, the mesh), and its wrap policy's class
        # must be the class of every block of this model.
        exec(compile(code[:wrap], "emitted snippet", "exec"), scope)  # noqa: S102
        policy = code[code.index("ModuleWrapPolicy({", wrap) + len("ModuleWrapPolicy({"):]
        block_class = scope[policy[:policy.index("}")]]
        blocks = sum(isinstance(m, block_class) for m in model.modules())
        if blocks != config.num_hidden_layers:
            raise RuntimeError(f"{block_class.__name__}: {blocks} modules, "
                               f"{config.num_hidden_layers} blocks")
        return
    exec(compile(code, "emitted snippet", "exec"), scope)  # noqa: S102 (the test's subject)
    model = scope["model"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        ids = torch.randint(0, config.vocab_size, (2, SEQ_LEN))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not torch.isfinite(loss.detach()):
            raise RuntimeError(f"step {step}: loss {loss.item()}")


def worker(cases_path):
    """One rank: every case of the list in turn, in one process group (one torchrun launch, so
    torch and transformers are imported once per rank, not once per case). Exit 1 when any failed."""
    import torch
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    with open(cases_path) as f:
        cases = json.load(f)
    failed = False
    for name, config_path, code_path in cases:
        try:
            run_case(config_path, code_path)
            print(f"rank {rank}: {name}: ran", flush=True)
        except Exception as e:  # the snippet's own failure, reported with its case
            failed = True
            print(f"rank {rank}: {name}: FAILED ({e.__class__.__name__}: {e})", flush=True)
    torch.distributed.destroy_process_group()
    return 1 if failed else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (set SHARDPLAN_TORCH_PYTHON to a Python with torch and transformers)")
        return SKIPPED
    planner = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        cases, codes = [], {}
        for arch, config in CONFIGS.items():
            config_path = os.path.join(tmp, f"{arch}.json")
            with open(config_path, "w") as f:
                json.dump(config, f)
            for flavour in ("fsdp2", "fsdp1"):
                name = f"{arch} {flavour}"
                codes[name] = snippet(planner, config_path, flavour)
                code_path = os.path.join(tmp, f"{arch}-{flavour}.py")
                with open(code_path, "w") as f:
                    f.write(codes[name])
                cases.append((name, config_path, code_path))
        cases_path = os.path.join(tmp, "cases.json")
        with open(cases_path, "w") as f:
            json.dump(cases, f)
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             os.path.abspath(__file__), "--worker", cases_path], capture_output=True, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(run.stdout)
    ran = [name for name, _, _ in cases
           if all(f"rank {r}: {name}: ran" in run.stdout for r in (0, 1))]
    failures = [name for name, _, _ in cases if name not in ran]
    if run.returncode != 0 or failures:
        for name in failures:
            print(f"--- {name}: the snippet as emitted\n{codes[name]}")
        print(run.stderr[-3000:])
        print(f"emitted code that did not run (torchrun exited {run.returncode}):",
              ", ".join(failures) or "none by name")
        return 1
    print(f"{len(ran)} emitted snippets ran on both ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

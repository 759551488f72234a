"""`planner recommend --emit fsdp` against the torchtitan that is installed: the TOML job config
(torchtitan 0.2.x, read with --job.config_file) or the command line (torchtitan 0.3.0) is parsed
by torchtitan's own ConfigManager, and every emitted value must come out as written.

Usage: torchtitan_options.py PLANNER. Exits 77 (skipped) when torchtitan does not import. Checked by
hand with torchtitan 0.2.2 and 0.3.0 from PyPI.
"""

import os
import shlex
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import torchtitan  # noqa: F401
    from torchtitan.config import ConfigManager
except Exception as e:  # not installed, or an install that cannot import
    print(f"SKIP: torchtitan does not import with {sys.executable} ({e.__class__.__name__}: {e}); "
          "install torchtitan 0.2.x or 0.3.0 to check the emitted options")
    sys.exit(SKIP)

import tomllib

VERSION = getattr(torchtitan, "__version__", "")
if not (VERSION.startswith("0.2.") or VERSION.startswith("0.3.")):
    print(f"SKIP: torchtitan {VERSION!r} is neither 0.2.x nor 0.3.x, the versions the planner emits for")
    sys.exit(SKIP)

PLANNER = sys.argv[1]
BASE = ["recommend", "--model", "gpt2", "--hardware", "a100-sxm4-80gb", "--seq-len", "1024", "--emit", "fsdp"]
CASES = [
    ["--gpus", "16", "--global-batch", "64", "--strategy", "fsdp-full", "--flavour", "fsdp2", "--offload", "params",
     "--checkpointing", "full"],
    ["--gpus", "16", "--global-batch", "64", "--recipe", "torchtitan", "--strategy", "hsdp", "--checkpointing",
     "selective-op"],
    ["--gpus", "8", "--global-batch", "32", "--strategy", "ddp", "--precision", "fp32", "--checkpointing", "none"],
    ["--gpus", "8", "--global-batch", "32", "--strategy", "fsdp-grad-op", "--precision", "bf16"],
    ["--gpus", "4", "--global-batch", "16", "--strategy", "fsdp-full", "--checkpointing", "every:2"],
]


def sections(text):
    """The TOML block and the command line of one --emit fsdp output."""
    lines = text.splitlines()
    toml_start = next(i for i, l in enumerate(lines) if l.startswith("# ---- torchtitan 0.2.x"))
    cli_start = next(i for i, l in enumerate(lines) if l.startswith("# ---- torchtitan 0.3.0"))
    toml = "\n".join(lines[toml_start + 1:cli_start])
    cmd = next(i for i, l in enumerate(lines) if l.startswith("torchrun "))
    command = " ".join(l.rstrip("\\").strip() for l in lines[cmd:])
    return tomllib.loads(toml), shlex.split(command)


def check_values(config, toml, failures, what):
    for section, keys in toml.items():
        if section == "activation_checkpoint":
            continue
        for key, want in keys.items():
            got = getattr(getattr(config, section), key)
            if got != want:
                failures.append(f"{what}: {section}.{key} is {got!r}, emitted {want!r}")


def check_ac_0_3(config, toml, failures, what):
    # 0.3.0's subcommand (torchtitan/distributed/activation_checkpoint.py): none | selective (per
    # op) | full; every n-th block is emitted as full.
    ac = toml["activation_checkpoint"]
    want = {"none": "NoneType", "full": "FullAC"}.get(ac["mode"])
    if ac["mode"] == "selective":
        want = "SelectiveAC" if ac.get("selective_ac_option") == "op" else "FullAC"
    got = type(config.activation_checkpoint).__qualname__.split(".")[0]
    if got != want:
        failures.append(f"{what}: activation checkpointing is {got}, want {want}")


failures = []
for case in CASES:
    what = " ".join(case)
    run = subprocess.run([PLANNER] + BASE + case, capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"{what}: planner exited {run.returncode}: {run.stderr.strip()}")
        continue
    toml, command = sections(run.stdout)
    if VERSION.startswith("0.2."):
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(run.stdout[run.stdout.index("[training]"):run.stdout.index("# ---- torchtitan 0.3.0")])
        try:
            config = ConfigManager().parse_args(["--job.config_file", f.name])
        finally:
            os.unlink(f.name)
        check_values(config, toml, failures, what)
        ac = toml["activation_checkpoint"]
        if config.activation_checkpoint.mode != ac["mode"]:
            failures.append(f"{what}: activation_checkpoint.mode is {config.activation_checkpoint.mode!r}")
        if "selective_ac_option" in ac and config.activation_checkpoint.selective_ac_option != ac["selective_ac_option"]:
            failures.append(f"{what}: selective_ac_option is {config.activation_checkpoint.selective_ac_option!r}")
    else:
        args = command[command.index("torchtitan.train") + 1:]
        args = ["llama3" if a == "<model>" else "llama3_debugmodel" if a == "<config>" else a for a in args]
        config = ConfigManager().parse_args(args)
        check_values(config, toml, failures, what)
        check_ac_0_3(config, toml, failures, what)

for f in failures:
    print("FAIL:", f)
print(f"torchtitan {VERSION}: {len(CASES)} emitted configs checked, {len(failures)} failures")
sys.exit(1 if failures else 0)

# The compiled module (python/module.cpp). Call it through the package's functions.
from typing import List, Optional, Tuple

def run(
    args: List[str],
    model_json: Optional[str] = None,
    hardware_json: Optional[str] = None,
    fsdp_as_data: bool = False,
) -> Tuple[str, List[str]]:
    """Runs one planner subcommand ([name, '--flag=value', ...]); returns (stdout text, notes)."""

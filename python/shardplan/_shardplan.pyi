"""
shardplan's planner, called as its command line is (planner/cli.hpp: run_request)
"""

from collections.abc import Sequence


def run(args: Sequence[str], model_json: str | None = None, hardware_json: str | None = None, fsdp_as_data: bool = False) -> tuple[str, list[str]]:
    """
    Runs one planner subcommand ([name, '--flag=value', ...]); returns (stdout text, notes). model_json and hardware_json: documents in place of --model and --hardware files.
    """

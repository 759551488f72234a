# The package's version is the project's (CMakeLists.txt's project VERSION), as the planner
# program of the same build prints it.
import shardplan
from conftest import cli_text


def test_version_is_the_programs():
    assert cli_text("--version").strip() == f"planner {shardplan.__version__}"

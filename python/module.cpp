// The compiled part of the `shardplan` Python package: one function that runs a planner subcommand
// as the command line does (planner/cli.hpp, run_request) and returns what it prints. The package's
// Python functions (shardplan/__init__.py) build the arguments and read the JSON.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "core/version.hpp"
#include "planner/cli.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using shardplan::core::InputError;

namespace {

// The JSON text of a document given in memory, parsed as the command line parses a file; its
// syntax errors name `what` ("model", "hardware").
std::optional<nlohmann::json> document(const std::optional<std::string>& text, const char* what) {
  if (!text) return std::nullopt;
  return shardplan::core::parse_json_text(*text, what);
}

// Runs without the GIL: the planner reads only its arguments and the data files, so calls from
// several threads run at once.
std::pair<std::string, std::vector<std::string>> run(std::vector<std::string> args,
                                                     std::optional<std::string> model_json,
                                                     std::optional<std::string> hardware_json,
                                                     bool fsdp_as_data) {
  shardplan::planner::Response response;
  {
    nb::gil_scoped_release release;
    shardplan::planner::Request request;
    request.args = std::move(args);
    request.model = document(model_json, "model");
    request.hardware = document(hardware_json, "hardware");
    request.fsdp_as_data = fsdp_as_data;
    response = shardplan::planner::run_request(request);
  }
  return {std::move(response.output), std::move(response.notes)};
}

// core::InputError becomes shardplan.InputError(where, message), a ValueError.
void translate_input_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InputError& e) {
    const std::string what = e.what();
    const auto cut = std::min(what.size(), e.where().size() + 2);  // "where: message"
    nb::object type = nb::module_::import_("shardplan").attr("InputError");
    nb::object args = nb::make_tuple(e.where(), what.substr(cut));
    PyErr_SetObject(type.ptr(), args.ptr());
  }
}

}  // namespace

NB_MODULE(_shardplan, m) {
  m.doc() = "shardplan's planner, called as its command line is (planner/cli.hpp: run_request)";
  m.attr("__version__") = shardplan::core::version();  // the CMake project's (core/version.hpp)
  m.def("run", &run, "args"_a, "model_json"_a = nb::none(), "hardware_json"_a = nb::none(),
        "fsdp_as_data"_a = false,
        "Runs one planner subcommand ([name, '--flag=value', ...]); returns (stdout text, notes). "
        "model_json and hardware_json: documents in place of --model and --hardware files.");
  nb::register_exception_translator(&translate_input_error);
}

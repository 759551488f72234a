// What each command-line option's value is, as --help shows it. The programs' options read text
// and check it themselves (core/number_text.hpp), so CLI11 would call every value TEXT; each
// program names them with one table of {long option name, kind} ("gpus" -> "INT", "gpu-memory-GiB"
// -> "GiB"). Written over CLI11's App and Option without including CLI11 (core does not use it).
#pragma once

#include <span>
#include <utility>
#include <vector>

namespace shardplan::core {

using OptionType = std::pair<const char*, const char*>;  // {long name or positional, kind}

// Every option of `app` and of its subcommands that shows TEXT gets the kind the table names.
template <class App> void name_option_types(App& app, std::span<const OptionType> types) {
  std::vector<App*> apps = app.get_subcommands({});
  apps.push_back(&app);
  for (App* a : apps)
    for (auto* option : a->get_options({}))
      for (const auto& [name, kind] : types)
        if ((option->check_lname(name) || option->check_name(name)) &&
            option->get_type_name() == "TEXT")
          option->type_name(kind);
}

}  // namespace shardplan::core

// The project's version, from one place: CMake's project(VERSION) (CMakeLists.txt), compiled into
// core/version.cpp. The programs' --version, the Python package's __version__ and the documents'
// "generator" field all read it here.
#pragma once

#include <string>

namespace shardplan::core {

// "0.1.0"
const char* version();
// What the documents the programs write carry as "generator": "shardplan 0.1.0".
std::string generator();

}  // namespace shardplan::core

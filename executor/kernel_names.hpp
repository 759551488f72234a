// The kernels' vocabulary the executor writes unqualified: the Backend interface, the element types
// (scalar.hpp), the memory sources and pools, AdamW's options (kernels/). The engine is written
// over these types on every line; declaring them here once keeps `kernels::` off each use.
#pragma once

#include "kernels/adamw.hpp"
#include "kernels/backend.hpp"
#include "kernels/caching_pool.hpp"
#include "kernels/host_stream_memory.hpp"
#include "kernels/memory_source.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::accum_t;
using kernels::adamw_step;
using kernels::AdamWOptions;
using kernels::Backend;
using kernels::bf16;
using kernels::CachingPool;
using kernels::data_type_v;
using kernels::f16;
using kernels::HostBackend;
using kernels::HostMemory;
using kernels::is_half_v;
using kernels::MemorySource;
using kernels::narrow;
using kernels::PoolExhausted;
using kernels::PoolStats;
using kernels::StreamOrderedHostMemory;
using kernels::widen;

}  // namespace shardplan::executor

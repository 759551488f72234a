// Element types and reductions the communication layer moves. bf16 and f16 travel as raw 16-bit
// words: NCCL reduces them natively, the MPI backend through its own reduction operators.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardplan::comm {

enum class DataType { f32, f64, bf16, f16, i32, i64, u8 };
enum class ReduceOp { sum, max, min };

std::size_t element_bytes(DataType type);
// The names nccl-tests prints in its "type" column ("float", "double", "bfloat16", "half", ...).
const char* data_type_name(DataType type);
// nccl-tests' "redop" column ("sum", "max", "min").
const char* reduce_op_name(ReduceOp op);

template <class T> constexpr DataType data_type_of();
template <> constexpr DataType data_type_of<float>() { return DataType::f32; }
template <> constexpr DataType data_type_of<double>() { return DataType::f64; }
template <> constexpr DataType data_type_of<std::int32_t>() { return DataType::i32; }
template <> constexpr DataType data_type_of<std::int64_t>() { return DataType::i64; }
template <> constexpr DataType data_type_of<std::uint8_t>() { return DataType::u8; }

}  // namespace shardplan::comm
